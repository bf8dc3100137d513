//! weft-peers: the control plane of Weft, written sans-IO.
//!
//! A [`Node`] takes facts ([`Input`]: a handshake datagram arrived, a session got its
//! first packet) and the passage of time ([`Node::handle_timeout`] with an explicit
//! `now`), and returns orders ([`Action`]: send these bytes, publish this route
//! snapshot). It never reads the clock, opens a socket or spawns a task, so the same
//! code runs in the daemon and in many-node simulations with a virtual clock.
//!
//! ```text
//!  runtime --Input/now--> Node --Action::Send--------> UDP
//!                             \--Action::PublishRoutes--> pipelines (ArcSwap)
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod address;
mod authority;
mod deadline;
mod gate;
pub mod identity;
mod issuer;
mod mesh;
pub mod names;
pub mod nat;
pub mod node;
mod peer;
mod pmtu;
pub mod status;
mod timing;
pub mod topology;

pub use address::{DEFAULT_ROUTE, DEFAULT_ROUTE6, default_ipv6, derived_from};
pub use identity::{NodeId, PeerKey};
pub use issuer::Issued;
pub use mesh::{pick_address, reencode_message};
pub use names::Names;
pub use node::{Action, Config, Input, Node, PeerRef, Timers};
