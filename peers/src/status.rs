//! What the engine reports about itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_core::endpoint::Endpoint;

use weft_control::FailureKind;
use weft_core::stats::PeerStats;

use crate::identity::NodeId;

/// State of one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Handshaking, or waiting for the peer to confirm.
    Connecting,
    /// The last session died or failed; retrying.
    Down,
    /// A confirmed session carries traffic.
    Established,
    /// A member we can reach but hold no session with (none is needed until traffic
    /// wants one).
    Idle,
}

impl PeerState {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Down => "down",
            Self::Established => "established",
            Self::Idle => "idle",
        }
    }
}

/// One peer in status.
#[derive(Debug, Clone)]
pub struct PeerStatus {
    /// Its node id.
    pub node_id: NodeId,
    /// Its host name.
    pub hostname: String,
    /// Its overlay address.
    pub overlay: Ipv4Addr,
    /// Its IPv6 overlay address, if it has one.
    pub overlay6: Option<Ipv6Addr>,
    /// Its direct address, if known.
    pub endpoint: Option<Endpoint>,
    /// How traffic reaches it.
    pub path: PathStatus,
    /// Smoothed round-trip time of the end-to-end session.
    pub rtt: Option<Duration>,
    /// Fraction of recent probes lost (0.0 to 1.0).
    pub loss: Option<f32>,
    /// Session state.
    pub state: PeerState,
    /// Whether it is a link of the mesh (a direct neighbour one end dials, listed in
    /// our record and kept with keepalives).
    pub link: bool,
    /// Time since the last completed handshake.
    pub last_handshake: Option<Duration>,
    /// Live sessions (current and draining).
    pub sessions: usize,
    /// The protocol version its hello announced (`None`: a release before versioning,
    /// or a member known only from its record).
    pub protocol: Option<u16>,
    /// The network secret its last handshake used (`None` before one).
    pub secret: Option<weft_core::admission::Which>,
    /// Why it is not established, if it is not.
    pub error: Option<String>,
    /// Traffic counters.
    pub stats: Arc<PeerStats>,
    /// The largest inner packet its UDP path carries, once measured.
    pub path_mtu: Option<u16>,
    /// UDP GSO is off for its path (it lost offloaded batches).
    pub gso_off: bool,
    /// Why its direct path is left for now (lossy), while it is.
    pub degraded: Option<String>,
    /// The keepalive interval of its idle direct path, when that path crosses this
    /// node's NAT and it is not a link (links keep their paths busy anyway).
    pub nat_keepalive: Option<Duration>,
    /// Why it has no direct path, while it is relayed (both NATs endpoint-dependent,
    /// punches unanswered, ...).
    pub no_direct: Option<String>,
    /// The birthday method since start: probes this node sent to its ports, and
    /// mappings this node opened for its probes.
    pub hard_nat: (u64, u64),
    /// Punch packets this node sent straight to its addresses since start (the
    /// ordinary method, both NATs opening at once).
    pub punches: u64,
    /// The groups its certificate grants (empty without an authority).
    pub groups: Vec<String>,
    /// The end of its certificate's validity, unix seconds (`None` without one).
    pub cert_not_after: Option<u64>,
    /// Its static public key (the 64-hex node id `weft id` prints and certificates
    /// and revocations name).
    pub key: [u8; 32],
    /// Its links as its signed record lists them, with their latency in milliseconds
    /// (empty before its record arrived).
    pub neighbours: Vec<(NodeId, u32)>,
}

/// How traffic reaches a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathStatus {
    /// Straight to its endpoint.
    Direct,
    /// Through relays, starting with `via`, over `hops` links.
    Relay {
        /// The first relay.
        via: NodeId,
        /// Links on the path.
        hops: u32,
    },
    /// No usable path right now.
    None,
}

/// One route of the table.
#[derive(Debug, Clone)]
pub struct RouteStatus {
    /// Destination node.
    pub node: NodeId,
    /// Its host name.
    pub hostname: String,
    /// Its overlay address.
    pub overlay: Ipv4Addr,
    /// Its IPv6 overlay address, if it has one.
    pub overlay6: Option<Ipv6Addr>,
    /// First hop (the node itself when direct).
    pub next_hop: NodeId,
    /// Links on the path.
    pub hops: u32,
    /// Sum of link latencies on the path, in milliseconds.
    pub latency_ms: u32,
    /// Whether an end-to-end session is up.
    pub session: bool,
    /// Subnets the destination proxies, either family.
    pub proxied: Vec<(IpAddr, u8)>,
}

/// A configured endpoint that has not yet produced a peer.
#[derive(Debug, Clone)]
pub struct DialStatus {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Why the last attempt failed.
    pub error: Option<String>,
    /// Consecutive failed attempts.
    pub attempts: u32,
}

/// Someone whose handshakes we refused.
#[derive(Debug, Clone)]
pub struct InboundFailure {
    /// Where they came from.
    pub from: Endpoint,
    /// Why we refused, in words.
    pub reason: String,
    /// Why we refused, as a kind.
    pub kind: FailureKind,
    /// How many times.
    pub count: u64,
    /// When last.
    pub last: Instant,
}

/// The engine's view of itself.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    /// Our node id.
    pub node_id: NodeId,
    /// Known peers, by overlay address.
    pub peers: Vec<PeerStatus>,
    /// Routes to every reachable node of the mesh.
    pub routes: Vec<RouteStatus>,
    /// Members that claim our overlay address (node id, host name).
    pub conflicts: Vec<(NodeId, String)>,
    /// Configured endpoints not yet connected.
    pub dials: Vec<DialStatus>,
    /// Refused inbound handshakes.
    pub inbound_failures: Vec<InboundFailure>,
    /// Topology records dropped because they were not signed by their origin
    /// (forged or altered by a member).
    pub rejected_records: u64,
    /// Control messages dropped because their member sent more than
    /// 2,000 a second (after a burst of 8,000).
    pub control_limited: u64,
    /// Sessions closed because their member's signed messages kept failing their
    /// signature check (16 times within a minute).
    pub signature_cutoffs: u64,
    /// Topology records dropped or pushed out by the table's limits.
    pub records_dropped: RecordsDropped,
    /// Claims of other members we refuse, each with the reason (an overlay address
    /// another member holds, a proxied subnet we will not route).
    pub refused: Vec<String>,
    /// Packets for members without a session dropped because too many were queued
    /// while their handshakes ran (or the handshake failed).
    pub queued_dropped: u64,
    /// Handshakes that made a session, either side, since start.
    pub handshakes_completed: u64,
    /// Handshakes this node started because a member sent data on a session it had
    /// dropped (declared dead, or retired), since start.
    pub stale_renewed: u64,
    /// Handshakes that failed since start, by kind: bad_response, rejected, refused,
    /// address_taken, no_response, not_confirmed, unreachable, no_path.
    pub handshake_failures: std::collections::BTreeMap<FailureKind, u64>,
    /// Members that offer themselves as exit nodes (node id, host name).
    pub exit_offers: Vec<(NodeId, String)>,
    /// The exit node this node was told to use, and what became of it.
    pub exit: Option<ExitStatus>,
    /// Subnets other members proxy, each with its routers (primary, standing by,
    /// down, and why).
    pub subnets: Vec<SubnetStatus>,
    /// Moves to another router or exit because the one in use was lost, and moves
    /// back to a preferred one that returned.
    pub failovers: (u64, u64),
    /// Why this node withdrew the subnets it proxies (its `--proxy-health` check
    /// fails), if it did.
    pub withdrawn: Option<String>,
    /// This node's NAT as its links see it.
    pub nat: NatStatus,
    /// Members told that their packets reached us with bad checksums, and times a
    /// member told us.
    pub checksum_reports: (u64, u64),
    /// Why the TUN offload was turned off (a member received our packets with bad
    /// checksums), if it was.
    pub tun_offload_off: Option<String>,
}

/// This node's NAT, judged from where the members it links to see it.
#[derive(Debug, Clone)]
pub struct NatStatus {
    /// Mapping behaviour, whether it is certain, whether the port is preserved.
    pub guess: crate::nat::NatGuess,
    /// It announces a port its router maps.
    pub mapped: bool,
    /// Who sees it where: observer, its host name, the address.
    pub observed: Vec<(NodeId, String, std::net::SocketAddr)>,
    /// The endpoints other members try for it (observed first, then announced).
    pub candidates: Vec<Endpoint>,
    /// What its NAT lets in unasked, as far as seen.
    pub filtering: crate::nat::Filtering,
    /// The first packet that got in from an address it never sent to: from where,
    /// when.
    pub unasked: Option<(std::net::SocketAddr, Instant)>,
}

/// The exit node in use (`--use-exit-node`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitStatus {
    /// What it was asked for (a host name or node id).
    pub wanted: String,
    /// The member that matches and offers itself as an exit, if one does.
    pub node: Option<(NodeId, String)>,
    /// Whether the default route goes to it now (a route to it and its /0 accepted).
    pub routing: bool,
    /// Whether some member has that name or id at all (offering to be an exit or not).
    pub known: bool,
    /// The member `--use-exit-node` is pinned to (the one it first matched).
    pub pinned: Option<NodeId>,
    /// Another member it matches while the pinned one does not: the exit stays off
    /// (fails closed) until `weft exit accept`.
    pub changed_to: Option<(NodeId, String)>,
    /// With several exits (a list or `auto`): the exits it may use, in order of
    /// preference.
    pub candidates: Vec<(NodeId, String)>,
    /// Moves to the next router or exit because the one in use was lost.
    pub failovers: u64,
}

/// What one router of a subnet is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterState {
    /// The subnet's traffic goes to it.
    Primary,
    /// Reachable, used when those before it are lost.
    Standby,
    /// Lost (no session, stopped answering, unreachable).
    Down,
}

/// One router of a subnet, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterStatus {
    /// The member.
    pub node: NodeId,
    /// Its host name.
    pub hostname: String,
    /// Its `--router-priority` (higher is preferred).
    pub priority: u8,
    /// Primary, standing by, or down.
    pub state: RouterState,
    /// Why.
    pub why: String,
}

/// A subnet other members proxy, with its routers in order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetStatus {
    /// The subnet.
    pub prefix: (IpAddr, u8),
    /// Its routers, preferred first.
    pub routers: Vec<RouterStatus>,
}

/// What the topology table's limits did with records (a member minting keys meets
/// these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordsDropped {
    /// Records a link brought beyond its budget of new origins or updates.
    pub over_budget: u64,
    /// Records of new nodes refused because the table was full of reachable nodes.
    pub table_full: u64,
    /// Records of unreachable nodes dropped to make room for new ones.
    pub evicted: u64,
    /// Records refused in a network with an authority (no valid certificate, a revoked
    /// origin, or claims it does not grant).
    pub uncertified: u64,
}
