//! weft-control: the control protocol of a Weft node, and its client.
//!
//! One JSON [`Request`] per line, one JSON [`Reply`] per line, over the node's Unix
//! socket (mode 0660: root and the admin group). The status reply ([`StatusJson`])
//! doubles as `weft status --json`. The daemon serves it; `weft` (the command line)
//! and `weft-gui` are clients through [`request`]. This crate is a leaf: serde and
//! nothing of the daemon, so a client does not compile the engine.
#![warn(missing_docs)]

mod client;
pub mod kinds;
mod request;
mod status;

pub use client::{ClientError, request};
pub use kinds::{ExitState, FailureKind, PathKind, PeerState, PortMapProtocol};
pub use request::{Reply, Request};
pub use status::*;
