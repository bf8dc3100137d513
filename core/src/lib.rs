//! weft-core: Weft's protocol primitives, all of them pure.
//!
//! Nothing here touches the OS, a socket, a thread or the clock: [`wire`] (headers),
//! [`admission`] (handshake MACs, cookies, token buckets), [`cert`] (member
//! certificates and revocations signed by an authority), [`invite`] (the signed
//! invites a new machine joins with), [`policy`] (access policy between members,
//! compiled to a matcher), [`firewall`] (the connection table in front of it),
//! [`crypto`] (AEAD in
//! place), [`replay`] (window), [`handshake`] (Noise via snow), [`session`] (keys +
//! counters shared with the pipelines), [`route`] (the immutable snapshot pipelines
//! read), [`endpoint`] (transport + address), [`portmap`] (NAT-PMP and PCP messages
//! to a router) and [`stats`]. The I/O half that moves
//! packets (TUN, transports, pipelines) is `weft-datapath`; the control plane that
//! decides with these values is `weft-peers`.
//!
//! ```text
//!   app -> TUN ==> pipeline TX: split, route lookup, seal ==> UDP ~~~> peer
//!   peer ~~~> UDP ==> pipeline RX: replay, open, source check ==> TUN -> app
//!         (weft-datapath)    \-- handshakes --> control plane (weft-peers, via weft)
//! ```
//!
//! This crate does not decide anything: which sessions exist and where packets go is
//! the control plane's business, published as a [`route::RouteSnapshot`].
#![warn(missing_docs)]

pub mod admission;
pub mod cert;
pub mod crypto;
pub mod endpoint;
pub mod firewall;
pub mod handshake;
pub mod invite;
pub mod policy;
pub mod portmap;
pub mod queue;
pub mod replay;
pub mod route;
pub mod session;
pub mod stats;
pub mod wire;
