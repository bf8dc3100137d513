//! What the engine is given and what it asks for: its timing and static inputs, the
//! inputs the runtime feeds it and the actions it hands back.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weft_core::endpoint::Endpoint;
use weft_core::handshake::Params;
use weft_core::route::RouteSnapshot;
use weft_core::wire::{MAX_HOPS, RelayHeader};

use crate::identity::NodeId;
use crate::timing::Timers;

/// Static inputs of a node.
#[derive(Debug, Clone)]
pub struct Config {
    /// Handshake parameters: our key, the PSK, the network name and our hello.
    pub handshake: Params,
    /// Endpoints to dial and keep connected forever (`--peer`).
    pub dial: Vec<Endpoint>,
    /// Origin of the millisecond clock the pipelines store in sessions.
    pub epoch: Instant,
    /// The wall clock at `epoch` (time since 1970-01-01 UTC): IK inits carry a stamp
    /// that must grow across restarts too (`handshake::Stamp`), and certificates are
    /// valid for a period of it.
    pub wall: Duration,
    /// The authorities whose certificates admit members (`--authority`; two during a
    /// rollover). Empty: a network without an authority, where the secret admits.
    pub authorities: Vec<weft_core::cert::AuthorityId>,
    /// Timing.
    pub timers: Timers,
    /// Addresses this node can be reached at (announced in its topology record).
    pub endpoints: Vec<Endpoint>,
    /// Prefer the path with the lowest latency over the one with fewest hops.
    pub latency_first: bool,
    /// The TUN's MTU: the largest inner packet, and the largest size a path MTU
    /// search tries (0: no measurement).
    pub mtu: u16,
    /// Subnets behind this node that it forwards for the mesh.
    pub proxied: Vec<(IpAddr, u8)>,
    /// `--router-priority`: its preference as a router of those subnets among members
    /// proxying the same one (higher wins; [`crate::topology::DEFAULT_PRIORITY`]).
    pub router_priority: u8,
    /// `--dhcp`: the range the overlay address was picked from; it moves on a conflict.
    pub dynamic: Option<(Ipv4Addr, u8)>,
    /// `--use-exit-node`: the member (host name or node id) whose 0.0.0.0/0 we route;
    /// every other member's /0 is ignored (an offer, never a route we did not ask for).
    /// Several, comma-separated, in order of preference, or `auto` (the nearest
    /// member offering an exit): the exit moves to the next when one is lost.
    pub use_exit: Option<String>,
    /// `--accept-wide-subnets`: route subnets other members proxy even when shorter
    /// than /8 (never a /0).
    pub accept_wide_subnets: bool,
    /// `--exit-allow-lan`: as an exit, also take packets for the networks this host
    /// is connected to (refused by default: members reach the internet, not the
    /// exit's LAN).
    pub exit_allow_lan: bool,
    /// Networks this node is directly connected to (its interfaces' networks): a
    /// member's proxied subnet overlapping one is refused.
    pub local_networks: Vec<(IpAddr, u8)>,
    /// Host names bound to the member that claimed each first, and the member
    /// `--use-exit-node` first matched, as kept in the state directory.
    pub names: crate::names::Names,
}

/// A fact the runtime reports.
#[derive(Debug)]
pub enum Input<'a> {
    /// A handshake or reject datagram arrived.
    Datagram {
        /// Sender (the last relay when `via` is set).
        from: Endpoint,
        /// The node that sent it through relays, if it was relayed.
        via: Option<NodeId>,
        /// The datagram.
        bytes: &'a [u8],
    },
    /// A session's first authenticated data packet arrived.
    Confirmed {
        /// The session's local index.
        local_index: u32,
    },
    /// A control message arrived inside a session.
    Message {
        /// The session's local index.
        local_index: u32,
        /// The decrypted message.
        bytes: &'a [u8],
    },
    /// A member of our network announced itself on the LAN at `endpoint`.
    Discovered {
        /// Its UDP endpoint.
        endpoint: Endpoint,
    },
    /// Authenticated packets of a session arrive directly from `from`.
    Direct {
        /// The session's local index.
        local_index: u32,
        /// Their source address.
        from: Endpoint,
    },
    /// A connection (TCP, WebSocket, QUIC) to `endpoint` closed, or could not be
    /// opened.
    ConnectionDown {
        /// The connection's endpoint.
        endpoint: Endpoint,
        /// Why, for status (e.g. "connection refused").
        error: &'a str,
    },
    /// A packet from our TUN for a member without a session: the engine starts the
    /// handshake and sends the packet once the session is up (a few are queued per
    /// member; the rest are dropped and counted).
    Unrouted {
        /// Its destination.
        dst: IpAddr,
        /// The IP packet.
        packet: &'a [u8],
    },
    /// Data authenticated by a session we declared dead: its peer still uses it. The
    /// engine starts a new handshake with that member, so that it moves to a new
    /// session at once instead of sending into nothing until its own timer gives up.
    StaleSession {
        /// The dropped session's local index.
        local_index: u32,
    },
    /// RX dropped inner packets with bad TCP/UDP checksums that arrived on a session:
    /// the engine tells the member that sent them.
    BadChecksum {
        /// The session's local index.
        local_index: u32,
    },
}

/// A peer named by an administrator: a dialled endpoint or a member's node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRef {
    /// An endpoint given to `--peer` or [`crate::Node::add_peer`].
    Endpoint(Endpoint),
    /// A member of the mesh.
    Node(NodeId),
}

/// Where a datagram goes: straight to an address, or through relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dest {
    pub(crate) to: Endpoint,
    pub(crate) relay: Option<RelayHeader>,
}

impl Dest {
    pub(crate) fn direct(to: Endpoint) -> Self {
        Self { to, relay: None }
    }

    /// To node `dst` through the relay at `to`, from `src`.
    pub(crate) fn relayed(to: Endpoint, dst: NodeId, src: NodeId) -> Self {
        Self { to, relay: Some(RelayHeader { hop_limit: MAX_HOPS, dst: dst.to_bytes(), src: src.to_bytes() }) }
    }

    /// The way back to whoever sent us something from `from` (through `via` if relayed).
    pub(crate) fn reply(from: Endpoint, via: Option<NodeId>, local: NodeId) -> Self {
        match via {
            Some(v) => Self::relayed(from, v, local),
            None => Self::direct(from),
        }
    }

    pub(crate) fn send(&self, bytes: Vec<u8>) -> Action {
        let bytes = match &self.relay {
            Some(h) => h.wrap(&bytes),
            None => bytes,
        };
        Action::Send { to: self.to, bytes }
    }
}

/// An order for the runtime.
#[derive(Debug)]
pub enum Action {
    /// Publish a new route snapshot to the pipelines.
    PublishRoutes(Arc<RouteSnapshot>),
    /// Change the TUN's overlay address (`--dhcp` moved after a conflict).
    SetAddress {
        /// The address to remove.
        old: Ipv4Addr,
        /// The address to add.
        new: Ipv4Addr,
        /// Prefix length of both.
        prefix: u8,
    },
    /// Route these subnets (proxied by other members) into the TUN; replaces the
    /// previous set.
    InstallRoutes(Vec<(IpAddr, u8)>),
    /// Send a datagram.
    Send {
        /// Destination.
        to: Endpoint,
        /// The datagram.
        bytes: Vec<u8>,
    },
    /// The birthday method's hard side: open one fresh UDP socket per datagram, send
    /// it from there to `to` (each makes a new mapping on an endpoint-dependent NAT),
    /// and keep the sockets `hold` long. The first to receive from `to` becomes this
    /// node's path to `to` (what goes to `to` leaves from it, and what it receives is
    /// handled like any other datagram); the others close.
    OpenMappings {
        /// The easy side's endpoint (UDP).
        to: Endpoint,
        /// One sealed keepalive per socket.
        datagrams: Vec<Vec<u8>>,
        /// How long the sockets wait for an answer.
        hold: Duration,
        /// Sockets whose keepalives go at once, one burst every `every`.
        burst: usize,
        /// The time between bursts.
        every: Duration,
    },
    /// Send these datagrams to one UDP endpoint as one segmentation-offloaded batch
    /// where the socket takes UDP GSO (a path MTU search checking that the offload
    /// works on a member's path), one by one otherwise.
    SendBatch {
        /// Destination (UDP).
        to: Endpoint,
        /// The datagrams, all of one size.
        datagrams: Vec<Vec<u8>>,
    },
    /// Keep these name bindings and exit pin in the state directory (they changed).
    SaveNames(crate::names::Names),
    /// Add these new revocations to those kept in the state directory (appended:
    /// the file is never rewritten, so none is lost across an authority rollover
    /// and a flood of them costs no copy of the whole list each).
    SaveRevocations(Vec<weft_core::cert::Revocation>),
    /// Keep the ledger of certificates this issuer issued (all of it) in the state
    /// directory.
    SaveIssued(Vec<crate::issuer::Issued>),
    /// Keep the newest certificate seen for each member (all of them, encoded) in the
    /// state directory: an older one stays refused after a restart.
    SaveCertificates(Vec<Vec<u8>>),
    /// A newer access policy signed by the authority arrived (encoded
    /// [`weft_core::policy::SignedPolicy`], signature checked): put it in force and
    /// keep it in the state directory.
    PolicyChanged(Vec<u8>),
    /// A member received packets from this node with bad TCP/UDP checksums: turn the
    /// TUN's offloads off (checksum and segmentation, and coalesced writes), so the
    /// kernel hands over whole packets it checksummed. Sent once.
    TunOffloadOff {
        /// Why, for the log and status.
        why: String,
    },
    /// A signed access policy for this network arrived that cannot be applied here
    /// (its text does not parse on this release, or one of its tests fails): deny
    /// every flow but the node's own until one that can arrives, and say why.
    PolicyRefused(String),
}
