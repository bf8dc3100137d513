//! What a client asks ([`Request`]) and what the node answers ([`Reply`]).

use serde::{Deserialize, Serialize};

use crate::status::{StatusJson, WgConfigJson};

/// A request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Node and peers.
    Status,
    /// Dial a peer and keep it connected, like `--peer` (until removed or restart).
    AddPeer {
        /// Its URI, e.g. `udp://198.51.100.7:11010`.
        uri: String,
    },
    /// Stop dialling a peer and close its sessions.
    RemovePeer {
        /// A URI given to `--peer` or `add-peer`, or a member's node id.
        peer: String,
    },
    /// Add a client to the WireGuard portal; the reply carries its config (with its
    /// private key, which the node does not keep).
    WgAdd {
        /// Client name: 1 to 32 letters, digits, `.`, `_` or `-`.
        name: String,
    },
    /// Remove a client of the WireGuard portal.
    WgRemove {
        /// Its name.
        name: String,
    },
    /// Re-read the config file and apply what can change live.
    Reload,
    /// Use the member `--use-exit-node` matches now, instead of the one it was pinned
    /// to (`weft exit accept`).
    AcceptExit,
    /// Take a revocation signed by the network's authority and pass it to the mesh
    /// (`weft revoke add`).
    AddRevocation {
        /// The revocation, `weft-revocation:...`.
        revocation: String,
    },
    /// Take an access policy signed by the network's authority and pass it to the mesh
    /// (`weft policy push`).
    PushPolicy {
        /// The signed policy, `weft-policy:...`.
        policy: String,
    },
    /// Which rule of the access policy decides a flow (`weft policy explain`).
    ExplainPolicy {
        /// The source: a member's host name or node id, or an address.
        from: String,
        /// The destination, likewise, and its port: `NAME:PORT`.
        to: String,
        /// tcp, udp or icmp.
        proto: String,
    },
}

impl Request {
    /// Whether the request changes the node (then it needs root or the admin group;
    /// reading the status needs only access to the socket). New requests must be
    /// listed here as changing unless they only read.
    pub fn changes_node(&self) -> bool {
        match self {
            Self::Status | Self::ExplainPolicy { .. } => false,
            Self::AddPeer { .. }
            | Self::RemovePeer { .. }
            | Self::WgAdd { .. }
            | Self::WgRemove { .. }
            | Self::Reload
            | Self::AcceptExit
            | Self::AddRevocation { .. }
            | Self::PushPolicy { .. } => true,
        }
    }
}

/// A reply.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "result")]
pub enum Reply {
    /// Status.
    Status(Box<StatusJson>),
    /// A new WireGuard portal client.
    WgClient(Box<WgConfigJson>),
    /// The request was carried out.
    Done {
        /// What was done.
        message: String,
    },
    /// The request failed.
    Error {
        /// Why.
        message: String,
    },
}
