//! weft-core: the data plane and protocol primitives of Weft.
//!
//! Two halves. The pure half never touches the OS or the clock:
//! [`wire`] (headers), [`admission`] (handshake MACs, cookies, token buckets),
//! [`crypto`] (AEAD in place), [`replay`] (window),
//! [`handshake`] (Noise via snow), [`session`] (keys + counters shared with the
//! pipelines), [`route`] (the immutable snapshot pipelines read) and [`stats`].
//! The I/O half moves packets: [`tun`], [`transport`] and [`pipeline`].
//!
//! ```text
//!   app -> TUN ==> pipeline TX: split, route lookup, seal ==> UDP ~~~> peer
//!   peer ~~~> UDP ==> pipeline RX: replay, open, source check ==> TUN -> app
//!                           \-- handshakes --> control plane (weft-peers, via weft)
//! ```
//!
//! This crate does not decide anything: which sessions exist and where packets go is
//! the control plane's business, published here as a [`route::RouteSnapshot`].
#![warn(missing_docs)]

pub mod admission;
pub mod crypto;
pub mod gso;
pub mod handshake;
pub mod pipeline;
pub mod replay;
pub mod route;
pub mod session;
pub mod stats;
pub mod transport;
pub mod tun;
pub mod wire;
