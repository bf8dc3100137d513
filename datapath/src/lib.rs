//! weft-datapath: the I/O half of Weft's data plane. It moves packets and decides
//! nothing: the TUN device ([`tun`], with its offloads in [`gso`]), the transports
//! ([`transport`]: UDP with GSO/GRO, TCP, WebSocket, TLS, QUIC) and the forwarding
//! [`pipeline`] threads, which read the control plane's decisions from a
//! [`weft_core::route::RouteSnapshot`].
//!
//! ```text
//!   app -> TUN ==> pipeline TX: split, route lookup, seal ==> UDP ~~~> peer
//!   peer ~~~> UDP ==> pipeline RX: replay, open, source check ==> TUN -> app
//!                           \-- handshakes --> control plane (weft-peers, via weft)
//! ```
#![warn(missing_docs)]

pub mod gso;
pub mod pipeline;
pub mod transport;
pub mod tun;
