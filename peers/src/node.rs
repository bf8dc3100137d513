//! The session engine of one node, sans-IO.
//!
//! It owns every handshake and session decision: whom to dial, when to retry, when to
//! rekey, when a peer is dead, which session carries traffic to which overlay address.
//! It never reads the clock (every call takes `now`), never touches a socket (it emits
//! [`Action::Send`]) and never blocks; the runtime feeds it [`Input`]s and carries out
//! its actions.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_core::endpoint::Endpoint;

use rand::RngCore;
use tracing::{debug, info, warn};
use weft_control::FailureKind;
use weft_core::admission::{HANDSHAKE_MACS_LEN, MacKeys, Which};
use weft_core::handshake::{Completed, HandshakeError, Hello, Initiator, Params, Read, Responder, caps};
use weft_core::route::RouteSnapshot;
use weft_core::session::{Session, SessionParams};
use weft_core::wire::{
    DATA_HEADER_LEN, HANDSHAKE_HEADER_LEN, HandshakeHeader, MAX_HOPS, MessageType, Pattern, RejectReason, RejectRepr,
    RelayHeader,
};

use crate::deadline::Deadlines;
pub use crate::gate::{AdmissionStats, LOAD_INITS_PER_SEC, RELAY_BURST, RELAY_RATE, SOURCE_BURST, SOURCE_RATE};
use crate::gate::{Gate, Tables, Verdict};
use crate::identity::{NodeId, PeerKey};
use crate::mesh::Mesh;
use crate::peer::{Anchor, Driver, Peer, PeerPath, PeerTable, SessionEntry, SessionTimers};
use crate::status::{DialStatus, InboundFailure, NodeStatus, PathStatus, PeerState, PeerStatus};
use crate::topology::{Record, Topology};

/// Timing of the session engine.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    /// Start a new handshake when the session is this old.
    pub rekey_after: Duration,
    /// Send a keepalive when nothing was sent for this long.
    pub keepalive: Duration,
    /// Declare a peer dead when nothing was received for this long.
    pub dead_after: Duration,
    /// First handshake retry delay; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    /// Largest handshake retry delay.
    pub max_backoff: Duration,
    /// How long a peer that we did not dial is retried after it went silent.
    pub learned_retry: Duration,
}

impl Timers {
    /// When a session's keys are renewed: the initiator at `rekey_after`, the
    /// responder a quarter later (so that both ends do not start one at once).
    pub fn rekey_due(&self, initiator: bool) -> Duration {
        if initiator { self.rekey_after } else { self.rekey_after + self.rekey_after / 4 }
    }

    /// How long a direct path may stay quiet before other paths are tried: two missed
    /// keepalives and a little.
    pub fn stale_after(&self) -> Duration {
        2 * self.keepalive + Duration::from_millis(500)
    }
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            rekey_after: Duration::from_secs(120),
            keepalive: Duration::from_secs(2),
            dead_after: Duration::from_secs(6),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(8),
            learned_retry: Duration::from_secs(60),
        }
    }
}

/// Rekey once a session has sent this many packets (about 47 GB at 1420 bytes), well
/// inside AES-GCM's usage limit.
pub const REKEY_AFTER_PACKETS: u64 = 1 << 25;
/// A session with a member that is not a link is retired after this long without data
/// either way (no keepalives keep it in between).
pub const IDLE_RETIRE: Duration = Duration::from_secs(120);
/// Data within this window makes a session active: it is probed for latency and loss,
/// and hole punching is tried while it is relayed.
pub(crate) const ACTIVE_WINDOW: Duration = Duration::from_secs(10);
/// Links and active sessions are probed for latency and loss this often.
const PING_EVERY: Duration = Duration::from_secs(5);
/// Packets held for one member while its session is made, at most.
pub const MAX_QUEUED_PER_PEER: usize = 16;
/// Packets held for all members while their sessions are made, at most.
pub const MAX_QUEUED: usize = 1024;
/// A packet for a member keeps its handshake retried this long.
const WANTED_FOR: Duration = Duration::from_secs(10);
/// Sessions kept per peer (current plus the ones in-flight packets may still use).
const MAX_SESSIONS: usize = 3;
/// An XX responder waiting for the finish message gives up after this.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// A finished handshake whose peer never proves the PSK is dropped after this.
const HELD_TIMEOUT: Duration = Duration::from_secs(5);
/// An older session is retired once it has been idle this long.
const RETIRE_IDLE: Duration = Duration::from_secs(10);
/// Failed inbound handshakes remembered for status.
const MAX_INBOUND_FAILURES: usize = 32;
/// XX responders waiting for their finish message, at most.
pub const MAX_PENDING_RESP: usize = 1024;
/// Finished handshakes waiting for the peer's proof of the PSK, at most.
pub const MAX_HELD: usize = 1024;

/// Why a handshake's claims are refused: the reason shown, its kind, and what the
/// reject tells the other end (in words its release reads).
pub(crate) struct Refusal {
    why: String,
    kind: FailureKind,
    reason: RejectReason,
}

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
    /// Subnets behind this node that it forwards for the mesh.
    pub proxied: Vec<(IpAddr, u8)>,
    /// `--dhcp`: the range the overlay address was picked from; it moves on a conflict.
    pub dynamic: Option<(Ipv4Addr, u8)>,
    /// `--use-exit-node`: the member (host name or node id) whose 0.0.0.0/0 we route;
    /// every other member's /0 is ignored (an offer, never a route we did not ask for).
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
    /// Host names bound to the member that held each first, and the member
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
    LinkDown {
        /// The connection's endpoint.
        endpoint: Endpoint,
        /// Why, for status (e.g. "connection refused").
        error: &'a str,
    },
    /// A packet from our TUN for a member without a session: the engine starts the
    /// handshake and sends the packet once the session is up (a few are held per
    /// member; the rest are dropped and counted).
    Unrouted {
        /// Its destination.
        dst: IpAddr,
        /// The IP packet.
        packet: &'a [u8],
    },
}

/// A peer named by an administrator: a dialled endpoint or a member's node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRef {
    /// An endpoint given to `--peer` or [`Node::add_peer`].
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
    /// Keep these name bindings and exit pin in the state directory (they changed).
    SaveNames(crate::names::Names),
    /// Keep the revocations (all of them) in the state directory.
    SaveRevocations(Vec<weft_core::cert::Revocation>),
    /// Keep the ledger of certificates this issuer issued (all of it) in the state
    /// directory.
    SaveIssued(Vec<crate::issuer::Issued>),
    /// A newer access policy signed by the authority arrived (encoded
    /// [`weft_core::policy::SignedPolicy`], signature checked): put it in force and
    /// keep it in the state directory.
    PolicyChanged(Vec<u8>),
}

/// What a handshake we started was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A configured endpoint whose key we do not know (yet).
    Dial(usize),
    /// A known peer.
    Peer(PeerKey),
}

struct PendingInit {
    initiator: Initiator,
    target: Target,
    to: Dest,
    started: Instant,
    /// The init as sent, without its MACs (resent with mac2 after a cookie reply).
    msg: Vec<u8>,
    /// Its mac1 (a cookie reply is bound to it).
    mac1: [u8; 16],
    /// Whether it was already resent with a cookie.
    resent: bool,
    /// The secret it was made with.
    which: Which,
}

struct PendingResp {
    responder: Box<Responder>,
    from: Endpoint,
    via: Option<NodeId>,
    remote_index: u32,
    started: Instant,
    /// The secret the init was MACed with (its PSK is the same).
    which: Which,
}

/// A handshake that just finished, from either side.
struct Finished {
    done: Completed,
    /// Where it came from (the last relay when `via` is set).
    from: Endpoint,
    via: Option<NodeId>,
    local: u32,
    remote: u32,
    /// What we dialled, when we were the initiator.
    target: Option<Target>,
    /// Whether the peer already proved the PSK (IK response, XX finish).
    confirmed: bool,
    /// The network secret the handshake used.
    secret: Which,
}

/// A finished handshake waiting for the peer's proof of the PSK.
pub(crate) struct Held {
    key: PeerKey,
    hello: Hello,
    from: Endpoint,
    via: Option<NodeId>,
    pub(crate) entry: SessionEntry,
    /// What we dialled, when we were the initiator.
    target: Option<Target>,
    /// Why the session is refused once the peer is proven (and the overlay address it
    /// took from us, if that is why).
    problem: Option<(String, Option<Ipv4Addr>)>,
    /// The network secret the handshake used.
    secret: Which,
}

pub(crate) struct Dial {
    pub(crate) endpoint: Endpoint,
    pub(crate) key: Option<PeerKey>,
    driver: Driver,
    /// Found by a LAN beacon rather than configured: not retried forever.
    discovered: bool,
    /// When a beacon last announced it (discovered dials only).
    announced: Option<Instant>,
}

/// A discovered endpoint that failed this many handshakes in a row waits for its
/// next beacon.
const DISCOVERED_ATTEMPTS: u32 = 5;
/// Discovered endpoints dialled at most at once; beacons of further endpoints are
/// ignored until some expire (beacons are authenticated, but a member on the LAN must
/// not be able to grow the dial table without bound).
pub const MAX_DISCOVERED: usize = 64;
/// A discovered endpoint that no beacon announced for this long is forgotten.
pub const DISCOVERED_EXPIRY: Duration = Duration::from_secs(300);

/// What a deadline of the engine is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Wake {
    /// Handshakes waiting for an answer or a proof time out.
    Handshakes,
    /// Records, paths and our record's publication.
    Mesh,
    /// Endpoints we dial.
    Dials,
    /// One peer's sessions and paths.
    Peer(PeerKey),
}

/// Handshakes not yet proven (nebula's pending table): nothing about them is acted on
/// or shown until the peer proves the PSK; proven ones live in the peer table.
#[derive(Default)]
struct Pending {
    /// Inits we sent, by our index.
    init: BTreeMap<u32, PendingInit>,
    /// XX responses we sent, waiting for the finish.
    resp: BTreeMap<u32, PendingResp>,
    /// Finished handshakes waiting for the peer's first authenticated packet.
    held: BTreeMap<u32, Held>,
}

/// Counters and refusals the engine reports.
#[derive(Default)]
struct Report {
    /// Refused inbound handshakes, most recent last.
    inbound_failures: VecDeque<InboundFailure>,
    /// Packets for members without a session dropped because too many were held.
    queued_dropped: u64,
    /// Handshakes that made a session (either side).
    handshakes_completed: u64,
    /// Handshakes that failed, by kind.
    handshake_failures: BTreeMap<FailureKind, u64>,
}

/// What the engine last published to the data plane and the host.
#[derive(Default)]
pub(crate) struct Published {
    /// Routes must be rebuilt and published at the end of this step.
    pub(crate) routes_dirty: bool,
    /// Held sessions changed: publish them without rebuilding every route.
    pub(crate) held_dirty: bool,
    /// The snapshot the pipelines read now.
    pub(crate) last_snapshot: Option<Arc<RouteSnapshot>>,
    /// Subnets routed into the TUN (last `InstallRoutes`).
    pub(crate) installed_subnets: Vec<(IpAddr, u8)>,
}

/// The session engine.
pub struct Node {
    pub(crate) cfg: Config,
    pub(crate) id: NodeId,
    pub(crate) rng: Box<dyn RngCore + Send>,
    /// Endpoints we dial, by a stable slot number ([`Target::Dial`]).
    dials: BTreeMap<usize, Dial>,
    next_dial: usize,
    /// Every peer, with its indexes (node id, links, session owners, held packets).
    pub(crate) peers: PeerTable,
    /// Handshakes not yet proven: nothing about them is acted on or shown.
    pending: Pending,
    pub(crate) actions: VecDeque<Action>,
    /// What the last step published, and what must be published again.
    pub(crate) published: Published,
    /// The member `--use-exit-node` matched instead of the pinned one, once warned of.
    pub(crate) exit_warned: Option<NodeId>,
    /// When each address may get the next punch (one a second, whoever asks).
    pub(crate) punched: BTreeMap<std::net::SocketAddr, Instant>,
    /// The mesh: records, paths, our record.
    pub(crate) mesh: Mesh,
    /// When each part of the engine next has work.
    deadlines: Deadlines<Wake>,
    /// Peers whose deadline must be recomputed at the end of this step.
    touched: BTreeSet<PeerKey>,
    /// Counters and refusals for status.
    report: Report,
    /// Handshake admission: MACs, source buckets, load, cookies.
    gate: Gate,
    /// Members the network's authority revoked.
    pub(crate) revocations: crate::authority::Revocations,
    /// `--authority-key`: this member issues certificates to machines with an invite.
    pub(crate) issuer: Option<crate::issuer::Issuer>,
    /// `network-secret-next`: the PSK of the secret accepted beside the current one
    /// (`cfg.handshake.psk`) while the network secret rotates.
    pub(crate) secret_next: Option<weft_core::handshake::Psk>,
    /// The newest signed access policy this node holds (version, encoded).
    pub(crate) policy: Option<(u64, Vec<u8>)>,
    /// The `now` of the last step (for calls that are not handed one).
    last_now: Option<Instant>,
}

impl Node {
    /// Creates the engine. `rng` draws session indices and jitter.
    pub fn new(mut cfg: Config, mut rng: Box<dyn RngCore + Send>) -> Self {
        let id = NodeId::from_public(&cfg.handshake.local.public);
        // Our own name is ours first, on this node.
        let own_name = cfg.names.bind(&cfg.handshake.hello.hostname, id);
        let macs = Arc::new(MacKeys::new(&cfg.handshake.psk));
        // The hello says which secret this node accepts ([`Node::set_secrets`] adds the next one).
        cfg.handshake.hello.secrets = vec![cfg.handshake.psk.fingerprint()];
        let mut secret = [0u8; 32];
        rng.fill_bytes(&mut secret);
        let dials: BTreeMap<usize, Dial> = cfg
            .dial
            .iter()
            .map(|&endpoint| Dial {
                endpoint,
                key: None,
                driver: Driver::default(),
                discovered: false,
                announced: None,
            })
            .enumerate()
            .collect();
        let mut node = Self {
            cfg,
            id,
            rng,
            next_dial: dials.len(),
            dials,
            peers: PeerTable::default(),
            pending: Pending::default(),
            actions: VecDeque::new(),
            published: Published { routes_dirty: true, ..Published::default() },
            exit_warned: None,
            punched: BTreeMap::new(),
            mesh: Mesh::new(),
            revocations: crate::authority::Revocations::default(),
            issuer: None,
            secret_next: None,
            policy: None,
            deadlines: Deadlines::default(),
            touched: BTreeSet::new(),
            report: Report::default(),
            gate: Gate::new(macs, secret),
            last_now: None,
        };
        if own_name {
            node.actions.push_back(Action::SaveNames(node.cfg.names.clone()));
        }
        node
    }

    /// The network's handshake MAC keys, for the pipelines' mac1 check.
    pub fn mac_keys(&self) -> Arc<MacKeys> {
        self.gate.macs.clone()
    }

    /// Uses `macs` (the pipelines' instance, derived from the same PSK) for the
    /// handshake MACs, so that [`Node::set_secrets`] changes the one set every part
    /// of the node reads.
    pub fn share_mac_keys(&mut self, macs: Arc<MacKeys>) {
        self.gate.macs = macs;
    }

    /// The runtime could not queue a handshake datagram (its queue is full): treat
    /// the next second as under load, so inits without a cookie cost no DH.
    pub fn note_overload(&mut self, now: Instant) {
        self.gate.note_overload(now);
    }

    /// What admission control did so far.
    pub fn admission(&self, now: Instant) -> AdmissionStats {
        self.gate.stats(now, self.tables())
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Handles one input.
    pub fn handle(&mut self, now: Instant, input: Input<'_>) {
        match input {
            Input::Datagram { from, via, bytes } => self.handle_datagram(now, from, via, bytes),
            Input::Confirmed { local_index } => self.handle_confirmed(now, local_index),
            Input::Message { local_index, bytes } => self.handle_message(now, local_index, bytes),
            Input::Direct { local_index, from } => self.handle_direct(now, local_index, from),
            Input::Discovered { endpoint } => self.handle_discovered(now, endpoint),
            Input::LinkDown { endpoint, error } => self.handle_link_down(now, endpoint, error),
            Input::Unrouted { dst, packet } => self.handle_unrouted(now, dst, packet),
        }
        self.finish_step(now);
    }

    /// Runs what is due: handshake timeouts, retries, keepalives, rekeys, dead-peer
    /// detection, the mesh's work. Calling it early does no harm.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.last_now.is_none() {
            // First call: publish our record and start dialling.
            self.mesh.record_changed(now);
            self.deadlines.set(Wake::Dials, Some(now));
        }
        for wake in self.deadlines.pop_due(now) {
            match wake {
                Wake::Handshakes => self.expire_pending(now),
                Wake::Mesh => self.drive_mesh(now),
                Wake::Dials => self.drive_dials(now),
                Wake::Peer(key) => {
                    self.drive_peer(now, key);
                    self.touch(key);
                }
            }
        }
        self.finish_step(now);
    }

    /// The next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When the node next wants [`Node::handle_timeout`] (`None` before the first
    /// call: call it at once).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.next()
    }

    /// Marks a peer whose timers may have changed (recomputed at the end of the step).
    pub(crate) fn touch(&mut self, key: PeerKey) {
        self.touched.insert(key);
    }

    /// A summary for status output.
    pub fn status(&self, now: Instant) -> NodeStatus {
        let mut peers: Vec<PeerStatus> = self
            .peers
            .values()
            .map(|p| p.status(now, self.path_status(p), self.mesh.paths.contains_key(&p.id)))
            .collect();
        peers.sort_by_key(|p| p.overlay);
        let dials = self
            .dials
            .values()
            .filter(|d| d.key.is_none_or(|k| !self.peers.contains_key(&k)))
            .map(|d| DialStatus { endpoint: d.endpoint, error: d.driver.error.clone(), attempts: d.driver.failures })
            .collect();
        NodeStatus {
            node_id: self.id,
            routes: self.route_status(),
            conflicts: self.conflicts(),
            peers,
            dials,
            inbound_failures: self.report.inbound_failures.iter().cloned().collect(),
            rejected_records: self.mesh.rejected_records,
            records_dropped: {
                let (table_full, evicted) = self.mesh.topology.full_counts();
                crate::status::RecordsDropped {
                    over_budget: self.mesh.records_over_budget,
                    table_full,
                    evicted,
                    uncertified: self.mesh.records_uncertified,
                }
            },
            refused: self.refused_claims(),
            queued_dropped: self.report.queued_dropped,
            handshakes_completed: self.report.handshakes_completed,
            handshake_failures: self.report.handshake_failures.clone(),
            exit_offers: self.exit_offers(),
            exit: self.exit_status(),
        }
    }

    /// Replaces the networks this node is directly connected to (the runtime reads its
    /// interfaces); proxied subnets are checked against them again.
    pub fn set_local_networks(&mut self, networks: Vec<(IpAddr, u8)>) {
        if networks != self.cfg.local_networks {
            self.cfg.local_networks = networks;
            self.published.routes_dirty = true;
            let now = self.last_now.unwrap_or(self.cfg.epoch);
            self.finish_step(now);
        }
    }

    /// Host names bound to the member that held each first, and the exit pin.
    pub fn names(&self) -> &crate::names::Names {
        &self.cfg.names
    }

    /// The topology records this node holds (every member's signed self-description).
    pub fn topology(&self) -> &Topology {
        &self.mesh.topology
    }

    /// Replaces the endpoints announced in our record (once the listeners are bound).
    pub fn set_endpoints(&mut self, endpoints: Vec<Endpoint>) {
        self.cfg.endpoints = endpoints;
        if let Some(now) = self.last_now {
            self.mesh.record_changed(now);
            self.deadlines.at_most(Wake::Mesh, now);
        }
    }

    /// Our UDP sockets moved to another port (a live reload): a keepalive now to
    /// every peer on a direct UDP path, so each sees the new source and follows it
    /// (roaming) instead of sending to the old port until our next keepalive.
    pub fn udp_moved(&mut self, now: Instant) {
        let epoch = self.cfg.epoch;
        for p in self.peers.values() {
            if let (Some(d), Some(tx)) = (p.path.direct(), p.tx())
                && d.endpoint.proto == weft_core::endpoint::Proto::Udp
            {
                self.actions.push_back(Dest::direct(d.endpoint).send(keepalive(&tx.session, now, epoch)));
            }
        }
    }

    /// Replaces the subnets this node proxies (a live reload): our record is
    /// republished, so members route (or stop routing) them to us within a flood.
    pub fn set_proxied(&mut self, now: Instant, subnets: Vec<(IpAddr, u8)>) {
        if subnets == self.cfg.proxied {
            return;
        }
        info!(?subnets, "proxied subnets changed");
        self.cfg.proxied = subnets;
        self.mesh.record_changed(now);
        self.deadlines.at_most(Wake::Mesh, now);
        self.published.routes_dirty = true;
        self.finish_step(now);
    }

    /// Dials `endpoint` from now on and keeps it connected, like a `--peer` given at
    /// start-up. Fails when it is already configured.
    pub fn add_peer(&mut self, now: Instant, endpoint: Endpoint) -> Result<(), String> {
        if let Some(d) = self.dials.values_mut().find(|d| d.endpoint == endpoint) {
            if !d.discovered {
                return Err(format!("{endpoint} is already a configured peer"));
            }
            // Found on the LAN before: from now on it is configured (retried forever).
            d.discovered = false;
            d.announced = None;
            d.driver = Driver::default();
        } else {
            self.push_dial(Dial { endpoint, key: None, driver: Driver::default(), discovered: false, announced: None });
        }
        info!(%endpoint, "peer added");
        self.drive_dials(now);
        self.finish_step(now);
        Ok(())
    }

    /// This node is stopping: tells every member it has a session with (that
    /// understands it) so that they close our sessions now and take a returning
    /// node's handshake at once, instead of sending into a dead session until it
    /// times out. The runtime sends what this queues before it exits. Returns how
    /// many members were told.
    pub fn leave(&mut self, now: Instant) -> usize {
        let told: Vec<PeerKey> = self
            .peers
            .values()
            .filter(|p| p.is_up() && p.hello.protocol().caps & caps::LEAVE != 0)
            .map(|p| p.key)
            .collect();
        info!(members = told.len(), "leaving the mesh: telling the members we have sessions with");
        for k in &told {
            self.send_msg(k, &crate::mesh::Msg::Leaving, now);
        }
        told.len()
    }

    /// A member said it is stopping: its sessions close now (it comes back with a
    /// new handshake), and routes to it go through the mesh or wait for it.
    pub(crate) fn peer_left(&mut self, now: Instant, key: PeerKey) {
        if let Some(p) = self.peers.get(&key) {
            info!(peer = %p.id, host = %p.hello.hostname, "member is leaving: closed its sessions");
            self.close_sessions(now, key, "left the mesh (stopped)");
        }
    }

    /// Closes every session with a peer and says why in its status: no path, no
    /// anchor, a fresh handshake driver (its next handshake starts at once).
    pub(crate) fn close_sessions(&mut self, now: Instant, key: PeerKey, why: &str) {
        let Some(p) = self.peers.get_mut(&key) else { return };
        p.sessions.clear();
        p.path = PeerPath::Relayed { last: None };
        p.down_since = Some(now);
        p.error = Some(why.to_owned());
        p.driver = Driver::default();
        self.peers.set_anchor(&key, Anchor::None);
        self.published.routes_dirty = true;
        self.mesh.record_changed(now);
        self.touch(key);
    }

    /// Stops dialling a configured endpoint, or forgets a member by node id, and
    /// closes the sessions with that node. A member that other members still reach
    /// comes back through the mesh (it is part of the network; only the configured
    /// link goes). Returns what was removed.
    pub fn remove_peer(&mut self, now: Instant, which: PeerRef) -> Result<String, String> {
        let (key, mut what) = match which {
            PeerRef::Endpoint(e) => {
                let Some(slot) = self.dials.iter().find(|(_, d)| d.endpoint == e).map(|(i, _)| *i) else {
                    return Err(format!("{e} is not a configured peer"));
                };
                let key = self.dials.remove(&slot).and_then(|d| d.key);
                (key, format!("stopped dialling {e}"))
            }
            PeerRef::Node(id) => match self.peers.key_of(&id) {
                Some(k) => (Some(k), format!("removed {id}")),
                None => return Err(format!("no peer with node id {id}")),
            },
        };
        self.pending.init.retain(|_, p| match p.target {
            Target::Dial(i) => self.dials.contains_key(&i),
            Target::Peer(k) => Some(k) != key,
        });
        if let Some(key) = key {
            self.dials.retain(|_, d| d.key != Some(key));
            if let Some(p) = self.peers.get(&key) {
                what = format!("{what}; closed the sessions with {} ({})", p.id, p.hello.hostname);
                self.close_sessions(now, key, "removed by the administrator");
            }
        }
        info!("{what}");
        self.finish_step(now);
        Ok(what)
    }

    fn push_dial(&mut self, dial: Dial) {
        self.dials.insert(self.next_dial, dial);
        self.next_dial += 1;
    }

    // ----- inputs -----

    fn handle_datagram(&mut self, now: Instant, from: Endpoint, via: Option<NodeId>, bytes: &[u8]) {
        // mac1 first: nothing from outside the network reaches snow or any table.
        let counted = matches!(MessageType::of(bytes), Some(t) if t != MessageType::Data && t != MessageType::Relay);
        let Some((body, which)) = self.gate.check_mac1(bytes, counted) else { return };
        match MessageType::of(body) {
            Some(MessageType::Reject) => {
                if let Ok(r) = RejectRepr::parse(body) {
                    self.handle_reject(now, from, r);
                }
            }
            Some(MessageType::CookieReply) => self.handle_cookie_reply(now, bytes),
            Some(MessageType::Data | MessageType::Relay) | None => {}
            Some(_) => {
                let Ok((hdr, noise)) = HandshakeHeader::parse(body) else { return };
                match hdr.kind {
                    MessageType::HandshakeInit if self.admit_init(now, from, via, hdr, bytes) => {
                        self.handle_init(now, from, via, hdr, noise, which);
                    }
                    MessageType::HandshakeResponse => self.handle_response(now, from, via, hdr, noise),
                    MessageType::HandshakeFinish => self.handle_finish(now, from, hdr, noise),
                    _ => {}
                }
            }
        }
    }

    /// Whether an init (mac1 already verified) may cost us a Diffie-Hellman; a source
    /// that must prove its address first gets a cookie.
    fn admit_init(
        &mut self,
        now: Instant,
        from: Endpoint,
        via: Option<NodeId>,
        hdr: HandshakeHeader,
        bytes: &[u8],
    ) -> bool {
        let tables = self.tables();
        let now_ms = ms_since(self.cfg.epoch, now);
        let answer = HANDSHAKE_HEADER_LEN + self.cfg.handshake.response_len(hdr.pattern) + HANDSHAKE_MACS_LEN;
        match self.gate.admit(now, now_ms, from, via, hdr, bytes, answer, tables, self.rng.as_mut()) {
            Verdict::Admit => true,
            Verdict::Cookie(reply) => {
                self.actions.push_back(Dest::reply(from, via, self.id).send(reply));
                false
            }
            Verdict::RateLimited => false,
        }
    }

    /// The tables an admitted handshake would grow.
    fn tables(&self) -> Tables {
        Tables { pending: self.pending.resp.len(), held: self.pending.held.len() }
    }

    /// A responder under load sent us a cookie for one of our inits: keep it for that
    /// destination and resend the init once with mac2.
    fn handle_cookie_reply(&mut self, now: Instant, bytes: &[u8]) {
        let Some(index) = MacKeys::cookie_reply_index(bytes) else { return };
        let Some(p) = self.pending.init.get_mut(&index) else { return };
        let Some(cookie) = self.gate.macs.open_cookie_reply(bytes, &p.mac1) else { return };
        let to = p.to;
        let resend = (!p.resent).then(|| {
            p.resent = true;
            let mut msg = p.msg.clone();
            p.mac1 = self.gate.macs.seal_as(&mut msg, Some(&cookie), p.which);
            msg
        });
        self.gate.keep_cookie((to.to, to.relay.map(|r| r.dst)), cookie, now);
        if let Some(msg) = resend {
            debug!(to = %to.to, "resending handshake with a cookie");
            self.actions.push_back(to.send(msg));
        }
    }

    fn handle_init(
        &mut self,
        now: Instant,
        from: Endpoint,
        via: Option<NodeId>,
        hdr: HandshakeHeader,
        noise: &[u8],
        which: Which,
    ) {
        let back = Dest::reply(from, via, self.id);
        // The init was MACed with our next secret: its Noise PSK is the next one too.
        match Responder::read(&self.params(which), hdr.pattern, noise) {
            Err(e) => self.refuse_inbound(now, back, hdr.sender_index, &e),
            Ok(Read::Xx(responder, msg)) => {
                let local = self.answer_init(&back, hdr, &msg, which);
                if self.pending.resp.len() >= MAX_PENDING_RESP
                    && let Some((&oldest, _)) = self.pending.resp.iter().min_by_key(|(_, p)| p.started)
                {
                    self.pending.resp.remove(&oldest);
                    self.gate.count_evicted();
                }
                self.pending.resp.insert(
                    local,
                    PendingResp { responder, from, via, remote_index: hdr.sender_index, started: now, which },
                );
                self.deadlines.at_most(Wake::Handshakes, now + CONFIRM_TIMEOUT);
            }
            Ok(Read::Ik(mut read)) => {
                // A replayed init (its stamp is not later than the last one this key
                // sent) costs this Diffie-Hellman and nothing more: no answer, no state.
                // The stamp is of this init only: it is not part of the peer's hello.
                if !self.gate.accept_stamp(PeerKey(read.remote_static), read.hello.stamp.take()) {
                    debug!(peer = %from, "dropped a replayed IK init");
                    return;
                }
                // A new machine with an invite: answered with a certificate (or why
                // not), never a session.
                if read.hello.join.is_some() {
                    self.answer_join(now, &back, hdr, *read, which);
                    return;
                }
                // IK: the hello is known now; a taken address is refused before we
                // answer (only members reach this far once handshakes carry a MAC).
                if let Some(why) = self.claim_refused(now, &PeerKey(read.remote_static), &read.hello, from, via) {
                    self.refuse_claim(now, back, hdr.sender_index, None, why);
                    return;
                }
                let (done, msg) = match read.answer(&self.cfg.handshake.hello) {
                    Ok(x) => x,
                    Err(e) => return self.refuse_inbound(now, back, hdr.sender_index, &e),
                };
                let local = self.answer_init(&back, hdr, &msg, which);
                // IK responder: the PSK is only proven by the initiator's first data packet.
                self.complete(
                    now,
                    Finished {
                        done,
                        from,
                        via,
                        local,
                        remote: hdr.sender_index,
                        target: None,
                        confirmed: false,
                        secret: which,
                    },
                );
            }
        }
    }

    fn handle_response(
        &mut self,
        now: Instant,
        from: Endpoint,
        via: Option<NodeId>,
        hdr: HandshakeHeader,
        noise: &[u8],
    ) {
        let Some(p) = self.pending.init.remove(&hdr.receiver_index) else { return };
        let back = Dest::reply(from, via, self.id);
        let pattern = p.initiator.pattern();
        match p.initiator.read_response(&self.cfg.handshake, noise) {
            Err(e) => {
                // Only IK can fail here for a secret mismatch (psk2 is mixed into the
                // response); tell the responder so its status says why too.
                let reject = RejectRepr { reason: reason_of(&e), receiver_index: hdr.sender_index };
                self.send_reject(&back, reject);
                let msg = format!("handshake response from {from}: {}", reject_why(reject.reason));
                warn!(peer = %from, "{msg}");
                self.handshake_failed(now, p.target, msg, FailureKind::BadResponse);
            }
            Ok((done, finish)) => {
                if let Some(why) = self.claim_refused(now, &PeerKey(done.remote_static), &done.hello, from, via) {
                    self.refuse_claim(now, back, hdr.sender_index, Some(p.target), why);
                    return;
                }
                // XX: send the finish message even on a cipher mismatch, so that the
                // responder learns of it through an authenticated handshake too.
                if let Some(fin) = finish {
                    self.send_handshake(
                        &back,
                        HandshakeHeader {
                            kind: MessageType::HandshakeFinish,
                            pattern,
                            sender_index: hdr.receiver_index,
                            receiver_index: hdr.sender_index,
                        },
                        &fin,
                        p.which,
                    );
                }
                // IK: the response proves the responder holds the PSK. XX: the
                // responder proves it with its first data packet.
                let confirmed = pattern == Pattern::Ik;
                let target = Some(p.target);
                let (local, remote) = (hdr.receiver_index, hdr.sender_index);
                self.complete(now, Finished { done, from, via, local, remote, target, confirmed, secret: p.which });
            }
        }
    }

    fn handle_finish(&mut self, now: Instant, from: Endpoint, hdr: HandshakeHeader, noise: &[u8]) {
        let Some(p) = self.pending.resp.remove(&hdr.receiver_index) else { return };
        match p.responder.finish(noise) {
            Err(e) => self.refuse_inbound(now, Dest::reply(from, p.via, self.id), p.remote_index, &e),
            Ok(done) => {
                // XXpsk3: reading the finish message proves the initiator holds the PSK.
                let (from, via, local, remote) = (p.from, p.via, hdr.receiver_index, p.remote_index);
                let secret = p.which;
                self.complete(now, Finished { done, from, via, local, remote, target: None, confirmed: true, secret });
            }
        }
    }

    fn handle_reject(&mut self, now: Instant, from: Endpoint, r: RejectRepr) {
        let why = reject_why(r.reason);
        let ours =
            self.pending.init.contains_key(&r.receiver_index) || self.pending.held.contains_key(&r.receiver_index);
        if ours && r.reason == RejectReason::AddressTaken && self.cfg.dynamic.is_some() {
            // Our --dhcp address is held by another member: move, and let the retry
            // find us elsewhere.
            self.move_address(now, None);
        }
        if let Some(p) = self.pending.init.remove(&r.receiver_index) {
            let msg = format!("peer {from} rejected our handshake: {why}");
            warn!("{msg}");
            self.handshake_failed(now, p.target, msg, FailureKind::Rejected);
            return;
        }
        // A reject for a session still waiting for its confirmation.
        if let Some(h) = self.pending.held.remove(&r.receiver_index) {
            self.published.held_dirty = true;
            match h.target {
                Some(target) => {
                    let msg = format!("peer {from} rejected our handshake: {why}");
                    warn!("{msg}");
                    self.handshake_failed(now, target, msg, FailureKind::Rejected);
                }
                None => {
                    let reason = match r.reason {
                        RejectReason::AddressTaken | RejectReason::Membership => {
                            format!("peer {from} refused our handshake: {why}")
                        }
                        _ => format!("peer could not authenticate our handshake response: {why}"),
                    };
                    self.record_inbound_failure(now, from, reason, FailureKind::Rejected);
                }
            }
            return;
        }
        // An XX handshake we answered, refused by the initiator before its finish.
        if matches!(r.reason, RejectReason::AddressTaken | RejectReason::Membership)
            && self.pending.resp.remove(&r.receiver_index).is_some()
        {
            warn!(peer = %from, "handshake refused: {why}");
            self.record_inbound_failure(
                now,
                from,
                format!("peer {from} refused our handshake: {why}"),
                FailureKind::Rejected,
            );
        }
    }

    fn handle_discovered(&mut self, now: Instant, endpoint: Endpoint) {
        if let Some(d) = self.dials.values_mut().find(|d| d.endpoint == endpoint) {
            if d.discovered {
                d.announced = Some(now);
                // A dormant discovered endpoint announced itself again: try it again.
                if d.driver.failures >= DISCOVERED_ATTEMPTS {
                    d.driver = Driver::default();
                }
            }
            return;
        }
        if self.peers.values().any(|p| p.path.direct().is_some_and(|d| d.endpoint == endpoint)) {
            return;
        }
        if self.dials.values().filter(|d| d.discovered).count() >= MAX_DISCOVERED {
            debug!(%endpoint, "LAN beacon ignored: {MAX_DISCOVERED} discovered endpoints already");
            return;
        }
        info!(%endpoint, "member found on the LAN");
        self.push_dial(Dial { endpoint, key: None, driver: Driver::default(), discovered: true, announced: Some(now) });
    }

    fn handle_confirmed(&mut self, now: Instant, local_index: u32) {
        if let Some(h) = self.pending.held.remove(&local_index) {
            self.published.held_dirty = true;
            self.promote(now, h);
            return;
        }
        if let Some(key) = self.key_of_session(local_index)
            && let Some(peer) = self.peers.get_mut(&key)
        {
            debug!(peer = %peer.id, local_index, "session confirmed");
            peer.error = None;
            self.published.routes_dirty = true;
            self.flush_queued(now, key);
            self.touch(key);
        }
    }

    /// A packet for a member without a session: hold it (a few per member) and start
    /// the handshake.
    fn handle_unrouted(&mut self, now: Instant, dst: IpAddr, packet: &[u8]) {
        // The member it is for: from the snapshot the pipeline looked at, or (when a
        // session came up meanwhile, e.g. this is the answer to the packet that made
        // it) from the route the current snapshot has for it.
        let Some(snap) = self.published.last_snapshot.clone() else { return };
        let key = match snap.demand_for(dst) {
            Some(d) => self.peers.key_of(&NodeId::from_bytes(d.node)),
            None => snap.route_for(dst).and_then(|r| self.key_of_session(r.session.local_index)),
        };
        let Some(key) = key else {
            self.report.queued_dropped += 1;
            return;
        };
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.is_up() {
            // The session came up since the pipeline looked.
            if !self.send_sealed(&key, packet, 0, now) {
                self.report.queued_dropped += 1;
            }
            return;
        }
        p.wanted_until = Some(now + WANTED_FOR);
        if !self.peers.queue(&key, packet, MAX_QUEUED_PER_PEER, MAX_QUEUED) {
            self.report.queued_dropped += 1;
        }
        let Some(p) = self.peers.get(&key) else { return };
        if p.driver.in_flight.is_none() && p.driver.next_attempt.is_none_or(|t| now >= t) {
            debug!(peer = %p.id, %dst, "traffic for an idle member: starting a session");
            self.handshake_with(now, key);
        }
        self.touch(key);
    }

    /// Sends the packets held for a peer on its new session.
    fn flush_queued(&mut self, now: Instant, key: PeerKey) {
        let Some(p) = self.peers.get(&key) else { return };
        if !p.is_up() || !p.has_queued() {
            return;
        }
        let packets = self.peers.take_queued(&key);
        for pkt in &packets {
            if !self.send_sealed(&key, pkt, 0, now) {
                self.report.queued_dropped += 1;
            }
        }
    }

    /// Drops the packets held for a peer (its handshake failed).
    fn drop_queued(&mut self, key: PeerKey) {
        self.report.queued_dropped += self.peers.take_queued(&key).len() as u64;
    }

    // ----- sessions -----

    /// A handshake finished. The session is held until the peer has proven it knows
    /// the PSK (`confirmed`, or later its first data packet); only then does the peer
    /// exist for routing and status, so that nodes without the secret leave no trace
    /// beyond a refused-handshake record.
    fn complete(&mut self, now: Instant, f: Finished) {
        let Finished { done, from, via, local, remote, target, confirmed, secret } = f;
        let ours = self.cfg.handshake.hello.clone();
        let id = NodeId::from_public(&done.remote_static);
        let mismatch = if done.hello.cipher != ours.cipher {
            Some(format!("cipher mismatch: we use {}, peer {id} at {from} uses {}", ours.cipher, done.hello.cipher))
        } else if done.hello.ipv4 == ours.ipv4 {
            Some(format!("address conflict: peer {id} at {from} also claims {}", ours.ipv4))
        } else if let Some(why) = self.claim_refused(now, &PeerKey(done.remote_static), &done.hello, from, via) {
            // XX responder (the finish carried the hello): tell the initiator why.
            self.refuse_claim(now, Dest::reply(from, via, self.id), remote, target, why);
            return;
        } else {
            None
        };
        let taken = (done.hello.ipv4 == ours.ipv4).then_some(done.hello.ipv4);
        let stats = self.peers.get(&PeerKey(done.remote_static)).map(|p| p.stats.clone()).unwrap_or_default();
        let session = Arc::new(Session::new(SessionParams {
            local_index: local,
            remote_index: remote,
            cipher: ours.cipher,
            keys: done.keys,
            endpoint: from,
            peer_addr: done.hello.ipv4,
            peer_addr6: None,
            confirmed,
            stats,
        }));
        session.set_created_ms(ms_since(self.cfg.epoch, now));
        session.set_peer_gso(done.hello.gso);
        session.set_peer_gso_quic(done.hello.gso_quic);
        let held = Held {
            key: PeerKey(done.remote_static),
            hello: done.hello,
            from,
            via,
            entry: SessionEntry { session: session.clone(), created: now, initiator: target.is_some() },
            target,
            problem: mismatch.map(|msg| (msg, taken)),
            secret,
        };
        if confirmed {
            // We have proof of the peer's keys but it has none of ours yet: a keepalive
            // at once lets it confirm (also when we refuse the session: the peer may act
            // on a conflict only once we proved ourselves).
            let ka = keepalive(&session, now, self.cfg.epoch);
            self.actions.push_back(Dest::reply(from, via, self.id).send(ka));
            self.promote(now, held);
        } else {
            // Nothing about an unproven peer is acted on or shown: no route, no status
            // row, no --dhcp move, until its first authenticated packet.
            if self.pending.held.len() >= MAX_HELD
                && let Some((&oldest, _)) = self.pending.held.iter().min_by_key(|(_, h)| h.entry.created)
            {
                self.pending.held.remove(&oldest);
                self.gate.count_evicted();
            }
            self.pending.held.insert(local, held);
            self.published.held_dirty = true;
            self.deadlines.at_most(Wake::Handshakes, now + HELD_TIMEOUT);
        }
    }

    /// A proven peer's handshake that we refuse (cipher mismatch, address conflict).
    fn refuse_proven(
        &mut self,
        now: Instant,
        from: Endpoint,
        target: Option<Target>,
        msg: String,
        taken: Option<Ipv4Addr>,
    ) {
        if taken.is_some() && self.cfg.dynamic.is_some() {
            // Our --dhcp address is taken: move, and let the retry find us elsewhere.
            self.move_address(now, taken);
        }
        warn!("{msg}");
        match target {
            Some(t) => self.handshake_failed(now, t, msg, FailureKind::AddressTaken),
            None => self.record_inbound_failure(now, from, msg, FailureKind::AddressTaken),
        }
    }

    /// Moves a confirmed session into its peer, creating the peer if it is new.
    fn promote(&mut self, now: Instant, h: Held) {
        let Held { key, hello, from, via, entry, target, problem, secret } = h;
        if let Some((msg, taken)) = problem {
            self.refuse_proven(now, from, target, msg, taken);
            return;
        }
        let id = key.id();
        if let Some(why) = self.claim_refused(now, &key, &hello, from, via) {
            self.refuse_claim(now, Dest::reply(from, via, self.id), entry.session.remote_index, target, why);
            self.published.routes_dirty = true;
            return;
        }
        // A node that came back with a new key at the same endpoint replaces its old entry:
        // once the old entry is down, or at once if it claims the old entry's endpoint
        // and address (a restart faster than dead_after).
        let stale: Vec<PeerKey> = self
            .peers
            .iter()
            .filter(|(k, p)| {
                let same_endpoint = via.is_none() && p.path.endpoint() == Some(from);
                let same_addr = p.hello.ipv4 == hello.ipv4;
                **k != key && (same_endpoint || same_addr) && (!p.is_up() || (same_endpoint && same_addr))
            })
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            info!(old = %k.id(), new = %id, "peer replaced by a node with a new key");
            self.peers.remove(&k);
            self.mesh.topology.remove(&k.id());
            self.mesh.paths_changed(now);
            for d in self.dials.values_mut() {
                if d.key == Some(k) {
                    d.key = None;
                }
            }
        }
        let mut dialled = false;
        if let Some(Target::Dial(i)) = target
            && let Some(d) = self.dials.get_mut(&i)
        {
            d.key = Some(key);
            d.driver.succeeded();
        }
        dialled |= self.dials.values().any(|d| d.key == Some(key));
        let stats = entry.session.stats.clone();
        let stale_after = self.cfg.timers.stale_after().as_millis() as u64;
        let now_ms = ms_since(self.cfg.epoch, now);
        let was_link = self.peers.get_or_insert_with(key, || Peer::new(key, hello.clone(), now, stats)).is_link(now);
        if dialled {
            self.peers.set_anchor(&key, Anchor::Dialled);
        }
        let Some(peer) = self.peers.get_mut(&key) else { return };
        peer.hello = hello;
        peer.secret = secret;
        // A handshake that arrived straight from the peer proves a direct path.
        if via.is_none() {
            if peer.path.direct().is_none_or(|d| d.endpoint != from) {
                peer.path.go_direct(from, now);
            } else if let PeerPath::Direct(d) = &mut peer.path {
                d.seen = Some(now);
            }
        } else if peer.path.is_direct() && {
            let last = peer.sessions.iter().map(|s| s.session.last_direct_rx_ms()).max().unwrap_or(0);
            now_ms.saturating_sub(last) > stale_after
        } {
            // The peer came through a relay although we thought we had a direct path,
            // and nothing arrived on that path lately: it cannot hear us directly.
            // Relay until a punch proves the path again.
            info!(peer = %id, "peer handshaked through a relay; direct path considered down");
            peer.path.lose_direct();
        }
        info!(peer = %id, addr = %peer.hello.ipv4, %from, relayed = via.is_some(), initiator = entry.initiator, "session established");
        self.report.handshakes_completed += 1;
        peer.sessions.insert(0, entry);
        peer.sessions.truncate(MAX_SESSIONS);
        peer.last_handshake = Some(now);
        peer.error = None;
        peer.down_since = None;
        peer.driver.succeeded();
        // A new session counts as traffic: it is not retired before it had a chance.
        peer.activity.touch(now);
        let link = peer.is_link(now);
        self.published.routes_dirty = true;
        self.mesh.record_changed(now);
        if link && !was_link {
            // A new link: compare tables (the neighbour pulls what it lacks).
            self.send_summary(now, key);
        }
        self.flush_queued(now, key);
        // A new session: the member is sent every revocation again (it may have
        // been offline when they spread).
        if let Some(p) = self.peers.get_mut(&key) {
            p.revocations_sent = 0;
            p.policy_sent = 0;
        }
        self.send_revocations(now, key);
        self.send_policy(now, key);
        self.touch(key);
    }

    /// Takes a revocation signed by the network's authority (from `weft revoke add` or
    /// a member): a new one closes the revoked member's sessions, refuses it from now
    /// on, goes to every member we have a session with, and is kept in the state
    /// directory ([`Action::SaveRevocations`]). Returns whether it was new.
    pub fn revoke(&mut self, now: Instant, r: weft_core::cert::Revocation) -> Result<bool, String> {
        let new = self.take_revocation(now, r)?;
        // Published at once: the revoked member's sessions leave the data path now,
        // not at the next timer.
        self.finish_step(now);
        Ok(new)
    }

    /// [`Node::revoke`] within a step (a revocation a member passed on).
    pub(crate) fn take_revocation(&mut self, now: Instant, r: weft_core::cert::Revocation) -> Result<bool, String> {
        let key = PeerKey(r.node);
        if !self.revocations.add(r, &self.cfg.authorities)? {
            return Ok(false);
        }
        warn!(node = %key.id(), "member revoked by the network's authority: its sessions close, it is refused from now on");
        if self.peers.get(&key).is_some() {
            self.close_sessions(now, key, "revoked by the network's authority");
        }
        // Its record goes too: no route leads to it or its subnets any more.
        if self.mesh.topology.get(&key.id()).is_some() {
            self.mesh.topology.remove(&key.id());
            self.mesh.paths_changed(now);
        }
        self.pending.init.retain(|_, p| p.target != Target::Peer(key));
        self.pending.held.retain(|_, h| h.key != key);
        let up: Vec<PeerKey> = self.peers.values().filter(|p| p.is_up()).map(|p| p.key).collect();
        for k in up {
            self.send_revocations(now, k);
        }
        self.actions.push_back(Action::SaveRevocations(self.revocations.list().to_vec()));
        self.published.routes_dirty = true;
        Ok(true)
    }

    /// The network secrets: `current` (what this node uses with peers that do not
    /// accept `next`) and `next`, accepted beside it and used with every peer that
    /// accepts it too, while the secret rotates. Applies to handshakes from now on;
    /// sessions up keep their keys until their next rekey.
    pub fn set_secrets(&mut self, current: weft_core::handshake::Psk, next: Option<weft_core::handshake::Psk>) {
        self.gate.macs.set(&current, next.as_ref());
        let hello = &mut self.cfg.handshake.hello;
        hello.secrets = std::iter::once(current.fingerprint()).chain(next.as_ref().map(|n| n.fingerprint())).collect();
        self.cfg.handshake.psk = current;
        self.secret_next = next;
    }

    /// The handshake parameters of secret `which` (the next secret's are a copy with
    /// its PSK, made only while the secret rotates).
    fn params(&self, which: Which) -> std::borrow::Cow<'_, Params> {
        match (which, &self.secret_next) {
            (Which::Next, Some(next)) => {
                std::borrow::Cow::Owned(Params { psk: next.clone(), ..self.cfg.handshake.clone() })
            }
            _ => std::borrow::Cow::Borrowed(&self.cfg.handshake),
        }
    }

    /// Whether this node has a next secret (`network-secret-next`).
    pub fn has_next_secret(&self) -> bool {
        self.secret_next.is_some()
    }

    /// Which secret a handshake to `target` uses: the next one when the peer's hello
    /// says it accepts it; the current one when it says it accepts that; else (a
    /// first contact, or a peer of a release that does not say) the current one
    /// first and each other attempt the next one.
    fn secret_for(&self, target: Target) -> Which {
        let Some(next) = &self.secret_next else { return Which::Current };
        let (hello, failures) = match target {
            Target::Peer(k) => match self.peers.get(&k) {
                Some(p) => (Some(&p.hello), p.driver.failures),
                None => (None, 0),
            },
            Target::Dial(i) => {
                let d = self.dials.get(&i);
                let known = d.and_then(|d| d.key).and_then(|k| self.peers.get(&k));
                (known.map(|p| &p.hello), d.map_or(0, |d| d.driver.failures))
            }
        };
        let says = hello.map(|h| h.secrets.as_slice()).unwrap_or_default();
        if says.contains(&next.fingerprint()) {
            Which::Next
        } else if says.contains(&self.cfg.handshake.psk.fingerprint()) || failures % 2 == 0 {
            Which::Current
        } else {
            Which::Next
        }
    }

    /// The revocations this node keeps, oldest first.
    pub fn revocations(&self) -> &[weft_core::cert::Revocation] {
        self.revocations.list()
    }

    /// Sends member `key` the revocations it was not sent on its current session (if
    /// its hello says it takes them).
    pub(crate) fn send_revocations(&mut self, now: Instant, key: PeerKey) {
        let total = self.revocations.list().len();
        let Some(p) = self.peers.get(&key) else { return };
        if p.revocations_sent >= total || !p.is_up() || p.hello.protocol().caps & caps::REVOCATIONS == 0 {
            return;
        }
        let from = p.revocations_sent;
        for i in from..total {
            let msg = crate::mesh::Msg::Revocation(Box::new(self.revocations.list()[i].clone()));
            self.send_msg(&key, &msg, now);
        }
        if let Some(p) = self.peers.get_mut(&key) {
            p.revocations_sent = total;
        }
    }

    fn refuse_inbound(&mut self, now: Instant, back: Dest, sender_index: u32, e: &HandshakeError) {
        let reject = RejectRepr { reason: reason_of(e), receiver_index: sender_index };
        self.send_reject(&back, reject);
        debug!(peer = %back.to, error = %e, "inbound handshake refused");
        self.record_inbound_failure(now, back.to, e.to_string(), FailureKind::Refused);
    }

    /// Why node `key`'s claim of overlay address `addr` (in a hello from `from`) is
    /// refused, with the failure kind: it lies outside our overlay network, or another
    /// live member holds it. The first holder keeps it, whatever the
    /// keys; only a node back with a new key at its old entry's endpoint and address
    /// (a restart) replaces that entry.
    pub(crate) fn claim_refused(
        &self,
        now: Instant,
        key: &PeerKey,
        hello: &Hello,
        from: Endpoint,
        via: Option<NodeId>,
    ) -> Option<Refusal> {
        let (why, kind) = self.claim_refusal(now, key, hello, from, via)?;
        let reason = match kind {
            // "The payload could not be parsed (version skew)": what every release says.
            FailureKind::IncompatibleVersion => RejectReason::BadPayload,
            FailureKind::NoCertificate
            | FailureKind::CertificateRefused
            | FailureKind::BeyondCertificate
            | FailureKind::AuthorityRequired => {
                // A release before protocol 3 cannot read the Membership reason (it
                // would drop the reject and wait for a timeout).
                if hello.protocol().version >= 3 { RejectReason::Membership } else { RejectReason::BadPayload }
            }
            _ => RejectReason::AddressTaken,
        };
        Some(Refusal { why, kind, reason })
    }

    /// [`Node::claim_refused`]'s reason and kind.
    fn claim_refusal(
        &self,
        now: Instant,
        key: &PeerKey,
        hello: &Hello,
        from: Endpoint,
        via: Option<NodeId>,
    ) -> Option<(String, FailureKind)> {
        let id = key.id();
        let addr = hello.ipv4;
        let (ours, theirs) = (self.cfg.handshake.hello.protocol(), hello.protocol());
        if !ours.compatible(&theirs) {
            let who = if theirs.version < ours.min { "too old" } else { "too new" };
            return Some((
                format!(
                    "peer {id} ({}) at {from} is {who} for this node: it speaks {theirs}, this node {ours}",
                    hello.hostname
                ),
                FailureKind::IncompatibleVersion,
            ));
        }
        let unix = (self.cfg.wall + now.saturating_duration_since(self.cfg.epoch)).as_secs();
        if let Some((why, kind)) = crate::authority::refusal(
            &self.cfg.authorities,
            &self.revocations,
            &self.cfg.handshake.network_name,
            key,
            hello,
            unix,
        ) {
            return Some((format!("peer {id} ({}) at {from}: {why}", hello.hostname), kind));
        }
        if let Some(why) = self.outside_overlay(IpAddr::V4(addr)) {
            return Some((
                format!("peer {id} at {from} claims overlay address {addr}: refused, {why}"),
                FailureKind::AddressOutsideOverlay,
            ));
        }
        let owner = self.address_owner(addr, id, |p| via.is_none() && p.path.endpoint() == Some(from))?;
        let host = self
            .mesh
            .topology
            .get(&owner)
            .map(|r| r.hostname.as_str())
            .or_else(|| self.peers.by_id(&owner).map(|p| p.hello.hostname.as_str()));
        Some((
            format!(
                "address conflict: peer {id} at {from} claims {addr}, which belongs to member {owner} ({:?})",
                host.unwrap_or("?")
            ),
            FailureKind::AddressTaken,
        ))
    }

    /// The live member other than `claimant` that holds `addr`: a peer with a confirmed
    /// session, else a member reachable in the topology whose record claims it. A peer
    /// for which `restart` holds does not count (its entry is about to be replaced).
    pub(crate) fn address_owner(
        &self,
        addr: Ipv4Addr,
        claimant: NodeId,
        restart: impl Fn(&Peer) -> bool,
    ) -> Option<NodeId> {
        let up = self.peers.values().find(|p| p.id != claimant && p.hello.ipv4 == addr && p.is_up());
        if let Some(p) = up {
            return (!restart(p)).then_some(p.id);
        }
        self.mesh
            .topology
            .records()
            .filter(|r| r.overlay == addr && r.node() != claimant && r.node() != self.id)
            .filter(|r| self.mesh.paths.contains_key(&r.node()))
            // A member whose session with us died is not holding anything, whatever
            // its last record says.
            .find(|r| {
                self.peers
                    .get(&PeerKey(r.key))
                    .is_none_or(|p| p.hello.ipv4 == addr && p.down_since.is_none() && !restart(p))
            })
            .map(Record::node)
    }

    /// Refuses a handshake whose hello claims a taken address: the other end gets a
    /// reject saying so, our status the reason.
    fn refuse_claim(
        &mut self,
        now: Instant,
        back: Dest,
        remote_index: u32,
        target: Option<Target>,
        Refusal { why, kind, reason }: Refusal,
    ) {
        warn!("{why}");
        let reject = RejectRepr { reason, receiver_index: remote_index };
        self.send_reject(&back, reject);
        match target {
            Some(t) => self.handshake_failed(now, t, why, kind),
            None => self.record_inbound_failure(now, back.to, why, kind),
        }
    }

    /// Counts a failed handshake by kind (monotonic, for metrics).
    fn count_failure(&mut self, kind: FailureKind) {
        *self.report.handshake_failures.entry(kind).or_default() += 1;
    }

    fn record_inbound_failure(&mut self, now: Instant, from: Endpoint, reason: String, kind: FailureKind) {
        self.count_failure(kind);
        if let Some(f) = self.report.inbound_failures.iter_mut().find(|f| f.from == from) {
            f.count += 1;
            f.last = now;
            f.reason = reason;
            f.kind = kind;
        } else {
            if self.report.inbound_failures.len() == MAX_INBOUND_FAILURES {
                self.report.inbound_failures.pop_front();
            }
            self.report.inbound_failures.push_back(InboundFailure { from, reason, kind, count: 1, last: now });
        }
    }

    fn handshake_failed(&mut self, now: Instant, target: Target, msg: String, kind: FailureKind) {
        self.count_failure(kind);
        let t = self.cfg.timers;
        let jitter = self.rng.next_u32();
        match target {
            Target::Dial(i) => {
                let Some(d) = self.dials.get_mut(&i).map(|d| &mut d.driver) else { return };
                d.in_flight = None;
                d.error = Some(msg);
                d.failed(now, &t, jitter);
            }
            Target::Peer(k) => {
                if let Some(p) = self.peers.get_mut(&k) {
                    p.driver.in_flight = None;
                    p.error = Some(msg);
                    p.driver.failed(now, &t, jitter);
                    if p.wanted_until.is_none_or(|w| now >= w) {
                        self.drop_queued(k);
                    }
                }
                self.touch(k);
            }
        }
    }

    // ----- timers -----

    fn expire_pending(&mut self, now: Instant) {
        let timed_out: Vec<u32> = self
            .pending
            .init
            .iter()
            .filter(|(_, p)| now.duration_since(p.started) >= self.handshake_timeout(p.target))
            .map(|(i, _)| *i)
            .collect();
        for i in timed_out {
            if let Some(p) = self.pending.init.remove(&i) {
                // A member drops handshakes whose MAC is not keyed by its PSK without
                // a word, so silence is also what a wrong network secret looks like.
                let hint = " (unreachable, not running, or its network name or secret differs: members drop \
                            handshakes they cannot authenticate without answering)";
                let how = if p.to.relay.is_some() { " via relay" } else { "" };
                self.handshake_failed(
                    now,
                    p.target,
                    format!("no handshake response from {}{how}{hint}", p.to.to),
                    FailureKind::NoResponse,
                );
            }
        }
        self.pending.resp.retain(|_, p| now.duration_since(p.started) < CONFIRM_TIMEOUT);
        let unconfirmed: Vec<u32> = self
            .pending
            .held
            .iter()
            .filter(|(_, h)| now.duration_since(h.entry.created) >= HELD_TIMEOUT)
            .map(|(i, _)| *i)
            .collect();
        for i in unconfirmed {
            let Some(h) = self.pending.held.remove(&i) else { continue };
            self.published.held_dirty = true;
            let msg = match h.problem {
                Some((problem, _)) => format!("{problem} (the peer never proved the network secret)"),
                None => format!("peer {} never confirmed the session (network secret differs?)", h.from),
            };
            match h.target {
                Some(t) => self.handshake_failed(now, t, msg, FailureKind::NotConfirmed),
                None => self.record_inbound_failure(now, h.from, msg, FailureKind::NotConfirmed),
            }
        }
        let next = self
            .pending
            .init
            .values()
            .map(|p| p.started + self.handshake_timeout(p.target))
            .chain(self.pending.resp.values().map(|p| p.started + CONFIRM_TIMEOUT))
            .chain(self.pending.held.values().map(|h| h.entry.created + HELD_TIMEOUT))
            .min();
        self.deadlines.set(Wake::Handshakes, next);
    }

    /// Fails every handshake we sent straight to `endpoint` (its connection is gone).
    pub(crate) fn fail_handshakes_to(&mut self, now: Instant, endpoint: Endpoint, error: &str) {
        let gone: Vec<u32> = self
            .pending
            .init
            .iter()
            .filter(|(_, p)| p.to.relay.is_none() && p.to.to == endpoint)
            .map(|(i, _)| *i)
            .collect();
        for i in gone {
            if let Some(p) = self.pending.init.remove(&i) {
                self.handshake_failed(
                    now,
                    p.target,
                    format!("cannot reach {endpoint}: {error}"),
                    FailureKind::Unreachable,
                );
            }
        }
    }

    fn handshake_timeout(&self, target: Target) -> Duration {
        let d = match target {
            Target::Dial(i) => match self.dials.get(&i) {
                Some(d) => &d.driver,
                None => return self.cfg.timers.initial_backoff,
            },
            Target::Peer(k) => match self.peers.get(&k) {
                Some(p) => &p.driver,
                None => return self.cfg.timers.initial_backoff,
            },
        };
        d.backoff.max(self.cfg.timers.initial_backoff)
    }

    fn drive_dials(&mut self, now: Instant) {
        // Discovered endpoints that stopped announcing themselves are forgotten.
        self.dials.retain(|_, d| {
            let stale = d.announced.is_some_and(|a| now.saturating_duration_since(a) >= DISCOVERED_EXPIRY);
            if stale {
                debug!(endpoint = %d.endpoint, "discovered endpoint expired");
            }
            !(d.discovered && stale)
        });
        let slots: Vec<usize> = self.dials.keys().copied().collect();
        for i in slots {
            let Some(d) = self.dials.get(&i) else { continue };
            if let Some(p) = d.key.and_then(|k| self.peers.get(&k)) {
                // Known: the peer's own timers keep its session (we dial it: a link).
                if p.anchor() != Anchor::Dialled {
                    let k = p.key;
                    self.peers.set_anchor(&k, Anchor::Dialled);
                    self.touch(k);
                }
                continue;
            }
            let dormant = d.discovered && d.driver.failures >= DISCOVERED_ATTEMPTS;
            if dormant || d.driver.in_flight.is_some() || now < d.driver.next_attempt.unwrap_or(now) {
                continue;
            }
            let to = Dest::direct(d.endpoint);
            self.start_handshake(now, Target::Dial(i), to, None);
        }
    }

    /// When [`Node::drive_dials`] next has work.
    fn dials_deadline(&self) -> Option<Instant> {
        self.dials
            .values()
            .filter(|d| d.key.is_none_or(|k| !self.peers.contains_key(&k)))
            .filter_map(|d| {
                let expiry = d.announced.filter(|_| d.discovered).map(|a| a + DISCOVERED_EXPIRY);
                let dormant = d.discovered && d.driver.failures >= DISCOVERED_ATTEMPTS;
                let retry =
                    (!dormant && d.driver.in_flight.is_none()).then(|| d.driver.next_attempt.unwrap_or(self.cfg.epoch));
                [expiry, retry].into_iter().flatten().min()
            })
            .min()
    }

    /// Whether we want a session with this peer although none is up: we dial it, it
    /// kept a link with us until recently, or traffic for it is waiting.
    fn wants_session(&self, p: &Peer, now: Instant) -> bool {
        let recently_up =
            now.saturating_duration_since(p.down_since.unwrap_or(p.first_seen)) < self.cfg.timers.learned_retry;
        let retried_link = match p.anchor() {
            Anchor::Dialled => recently_up || self.dials.values().any(|d| d.key == Some(p.key) && !d.discovered),
            Anchor::ByPeer(_) => recently_up,
            Anchor::None => false,
        };
        retried_link || p.wanted_until.is_some_and(|w| now < w)
    }

    /// One peer's timers. A link (a direct neighbour one end dials) keeps its session
    /// with keepalives and is declared dead after `dead_after` of silence. Any other
    /// session lives while data flows: keepalives only answer data (so a one-way
    /// stream still proves the path), it is dead when data sent gets nothing back
    /// for `dead_after`, and it is retired after [`IDLE_RETIRE`] without data. Probes
    /// run on links and active sessions; hole punching only for active ones.
    fn drive_peer(&mut self, now: Instant, key: PeerKey) {
        let t = self.cfg.timers;
        let epoch = self.cfg.epoch;
        let now_ms = ms_since(epoch, now);
        let Some(peer) = self.peers.get_mut(&key) else { return };
        let last_rx_ms = peer.last_rx_ms();
        let last_rx = (last_rx_ms > 0).then(|| epoch + Duration::from_millis(last_rx_ms - 1));
        peer.activity.sample(&peer.stats, now, last_rx);
        if let Anchor::ByPeer(until) = peer.anchor()
            && now >= until
        {
            debug!(peer = %peer.id, "neighbour stopped keeping its link with us");
            self.peers.set_anchor(&key, Anchor::None);
            self.mesh.record_changed(now);
        }
        let Some(peer) = self.peers.get_mut(&key) else { return };
        if retire_sessions(peer, now, epoch) {
            self.published.routes_dirty = true;
        }
        let kept = peer.anchor() != Anchor::None;
        let Some(tx) = peer.tx().cloned() else {
            if peer.sessions.is_empty() && peer.path.is_direct() && !kept {
                peer.path.lose_direct();
            }
            let (in_flight, due) = (peer.driver.in_flight.is_some(), now >= peer.driver.next_attempt.unwrap_or(now));
            if !in_flight && due && self.peers.get(&key).is_some_and(|p| self.wants_session(p, now)) {
                self.handshake_with(now, key);
            } else if !in_flight && self.forgettable(&key, now) {
                info!(peer = %key.id(), "forgetting silent peer");
                self.peers.remove(&key);
                self.published.routes_dirty = true;
            }
            return;
        };
        let plan = SessionTimers::of(&t, epoch, peer, &tx, now);
        let silent = now_ms.saturating_sub(last_rx_ms.max(ms_since(epoch, tx.created)));
        if SessionTimers::due(plan.dead, now) {
            let msg = format!("peer not responding: nothing received for {} s", silent / 1000);
            warn!(peer = %peer.id, "{msg}");
            peer.error = Some(msg);
            peer.sessions.clear();
            peer.down_since = Some(now);
            peer.driver = Driver::default();
            peer.activity.unanswered_since = None;
            if !kept {
                peer.path.lose_direct();
            }
            self.published.routes_dirty = true;
            self.mesh.record_changed(now);
            if self.peers.get(&key).is_some_and(|p| self.wants_session(p, now)) {
                self.handshake_with(now, key);
            }
            return;
        }
        if SessionTimers::due(plan.retire, now) {
            debug!(peer = %peer.id, "no traffic for {} s: session retired", IDLE_RETIRE.as_secs());
            peer.sessions.clear();
            peer.path.lose_direct();
            peer.wanted_until = None;
            self.published.routes_dirty = true;
            return;
        }
        let active = kept || peer.activity.active(now, ACTIVE_WINDOW);
        // The packet limit is counted, not timed: checked here, whenever the peer is
        // driven, under the same conditions as the timed rekey.
        let rekey = SessionTimers::due(plan.rekey, now)
            || (plan.rekey.is_some()
                && tx.session.sent_packets() >= REKEY_AFTER_PACKETS
                && now >= peer.driver.next_attempt.unwrap_or(now));
        let send_keepalive = SessionTimers::due(plan.keepalive, now);
        let probe = SessionTimers::due(plan.probe, now);
        let punch = !kept && !peer.path.is_direct() && active && peer.punch.next_attempt.is_none_or(|n| now >= n);
        let summary = SessionTimers::due(plan.summary, now);
        if rekey {
            debug!(peer = %peer.id, "rekeying");
            self.handshake_with(now, key);
        }
        if send_keepalive && let Some(d) = self.dest_for(&key) {
            self.actions.push_back(d.send(keepalive(&tx.session, now, epoch)));
        }
        if probe {
            let nonce = self.rng.next_u64();
            if let Some(p) = self.peers.get_mut(&key) {
                p.probe.sent(nonce, now);
                p.probe.next = Some(now + PING_EVERY);
            }
            self.send_msg(&key, &crate::mesh::Msg::Ping(nonce), now);
        }
        if summary {
            self.send_summary(now, key);
        }
        if punch {
            self.punch(now, key);
        }
        self.drive_direct(now, key);
    }

    /// A peer that is no use any more: no session, not wanted, not a member we can
    /// reach, silent for `learned_retry`.
    fn forgettable(&self, key: &PeerKey, now: Instant) -> bool {
        let Some(p) = self.peers.get(key) else { return false };
        let down_for = now.saturating_duration_since(p.down_since.unwrap_or(p.first_seen));
        p.sessions.is_empty()
            && !p.has_queued()
            && !self.wants_session(p, now)
            && !self.mesh.paths.contains_key(&p.id)
            && self.mesh.topology.get(&p.id).is_none()
            && down_for >= self.cfg.timers.learned_retry
    }

    /// When [`Node::drive_peer`] next has work for a peer (`None`: nothing until an
    /// input arrives).
    fn peer_deadline(&self, key: &PeerKey, now: Instant) -> Option<Instant> {
        let p = self.peers.get(key)?;
        let t = self.cfg.timers;
        let epoch = self.cfg.epoch;
        let at_ms = |ms: u64| epoch + Duration::from_millis(ms.saturating_sub(1));
        let held = match p.anchor() {
            Anchor::ByPeer(until) => Some(until),
            _ => None,
        };
        let Some(tx) = p.tx() else {
            let retire_unconfirmed = p.sessions.iter().map(|s| s.created + CONFIRM_TIMEOUT).min();
            let retry = (p.driver.in_flight.is_none() && self.wants_session(p, now))
                .then(|| p.driver.next_attempt.unwrap_or(now));
            // Forgetting a link that went silent is checked now and then (a member known
            // only from its record goes with the record: Mesh::expire).
            let forget = ((p.sessions.is_empty() && p.anchor() != Anchor::None) || p.down_since.is_some())
                .then(|| now + t.learned_retry);
            return [retire_unconfirmed, retry, forget, held].into_iter().flatten().min();
        };
        let plan = SessionTimers::of(&t, epoch, p, tx, now);
        let mut v: Vec<Instant> = Vec::with_capacity(8);
        v.extend(held);
        // A session that is not a link: its rekey, and the sample below (see
        // SessionTimers: activity is sampled per wake).
        if p.anchor() == Anchor::None {
            v.extend(plan.rekey);
        } else {
            v.extend(plan.earliest());
        }
        if p.sessions.len() > 1 {
            v.push(now + RETIRE_IDLE / 2);
        }
        if tx.session.expires_at_ms() != u64::MAX {
            v.push(at_ms(tx.session.expires_at_ms()));
        }
        if p.anchor() == Anchor::None {
            // Traffic is sampled (from the pipelines' counters) each keepalive
            // interval while the session lives: activity moves the plan.
            v.push(now + t.keepalive);
        }
        v.extend(self.direct_deadline(p, now));
        v.into_iter().min()
    }
    /// Starts a handshake with a known peer along its best destination: IK, or XX
    /// after two failures (the peer may have a new key).
    fn handshake_with(&mut self, now: Instant, key: PeerKey) {
        let Some(p) = self.peers.get(&key) else { return };
        let use_ik = p.driver.failures < 2;
        match self.handshake_dest(&key) {
            Some(to) => self.start_handshake(now, Target::Peer(key), to, use_ik.then_some(key)),
            // Nowhere to send it (no path right now): try again after the backoff.
            None => self.handshake_failed(now, Target::Peer(key), "no path to the peer".into(), FailureKind::NoPath),
        }
    }

    /// Starts a fresh IK handshake with a known peer (to announce a new hello).
    pub(crate) fn rehandshake(&mut self, now: Instant, key: PeerKey) {
        if let Some(to) = self.dest_for(&key) {
            self.start_handshake(now, Target::Peer(key), to, Some(key));
        }
    }

    fn start_handshake(&mut self, now: Instant, target: Target, to: Dest, remote: Option<PeerKey>) {
        let stamp = self.gate.next_stamp(self.cfg.wall + now.saturating_duration_since(self.cfg.epoch));
        let which = self.secret_for(target);
        let started = match (which, &self.secret_next) {
            (Which::Next, Some(next)) => Initiator::start(
                &Params { psk: next.clone(), ..self.cfg.handshake.clone() },
                remote.as_ref().map(PeerKey::as_bytes),
                stamp,
            ),
            _ => Initiator::start(&self.cfg.handshake, remote.as_ref().map(PeerKey::as_bytes), stamp),
        };
        let (initiator, msg) = match started {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "cannot start handshake");
                return;
            }
        };
        let local = self.new_index();
        let pattern = initiator.pattern();
        let mut bytes = Vec::with_capacity(12 + msg.len() + 32);
        HandshakeHeader { kind: MessageType::HandshakeInit, pattern, sender_index: local, receiver_index: 0 }
            .emit(&mut bytes);
        bytes.extend_from_slice(&msg);
        let key = (to.to, to.relay.map(|r| r.dst));
        let cookie = self.gate.cookie(&key, now);
        let mut sealed = bytes.clone();
        let mac1 = self.gate.macs.seal_as(&mut sealed, cookie.as_ref(), which);
        self.actions.push_back(to.send(sealed));
        self.pending
            .init
            .insert(local, PendingInit { initiator, target, to, started: now, msg: bytes, mac1, resent: false, which });
        self.deadlines.at_most(Wake::Handshakes, now + self.handshake_timeout(target));
        if let Target::Peer(k) = target {
            self.touch(k);
        }
        let driver = match target {
            Target::Dial(i) => match self.dials.get_mut(&i) {
                Some(d) => &mut d.driver,
                None => return,
            },
            Target::Peer(k) => match self.peers.get_mut(&k) {
                Some(p) => &mut p.driver,
                None => return,
            },
        };
        if let Some(old) = driver.in_flight.replace(local) {
            self.pending.init.remove(&old);
        }
        debug!(to = %to.to, relayed = to.relay.is_some(), ?pattern, local, "handshake started");
    }

    /// Sends `msg`, the response to init `init`, MACed with secret `which`; returns
    /// the response's (new) local index.
    pub(crate) fn answer_init(&mut self, to: &Dest, init: HandshakeHeader, msg: &[u8], which: Which) -> u32 {
        let local = self.new_index();
        let hdr = HandshakeHeader {
            kind: MessageType::HandshakeResponse,
            pattern: init.pattern,
            sender_index: local,
            receiver_index: init.sender_index,
        };
        self.send_handshake(to, hdr, msg, which);
        local
    }

    /// Sends handshake message `msg` with header `hdr`, MACed with secret `which`.
    fn send_handshake(&mut self, to: &Dest, hdr: HandshakeHeader, msg: &[u8], which: Which) {
        let mut bytes = Vec::with_capacity(12 + msg.len() + 32);
        hdr.emit(&mut bytes);
        bytes.extend_from_slice(msg);
        self.gate.macs.seal_as(&mut bytes, None, which);
        self.actions.push_back(to.send(bytes));
    }

    fn send_reject(&mut self, to: &Dest, reject: RejectRepr) {
        let mut bytes = reject.emit().to_vec();
        self.gate.macs.seal(&mut bytes, None);
        self.actions.push_back(to.send(bytes));
    }

    /// Sessions waiting for their peer's proof of the PSK (receive only).
    pub(crate) fn held_sessions(&self) -> Vec<Arc<Session>> {
        self.pending.held.values().map(|h| h.entry.session.clone()).collect()
    }

    fn new_index(&mut self) -> u32 {
        loop {
            let i = self.rng.next_u32();
            let used = i == 0
                || self.pending.init.contains_key(&i)
                || self.pending.resp.contains_key(&i)
                || self.pending.held.contains_key(&i)
                || self.key_of_session(i).is_some();
            if !used {
                return i;
            }
        }
    }

    pub(crate) fn finish_step(&mut self, now: Instant) {
        self.last_now = Some(now);
        // Clear in-flight markers whose handshake is gone (confirmed, failed or expired).
        let busy = |i: u32| self.pending.init.contains_key(&i) || self.pending.held.contains_key(&i);
        for d in self.dials.values_mut() {
            if d.driver.in_flight.is_some_and(|i| !busy(i)) {
                d.driver.in_flight = None;
            }
        }
        // Peers whose handshake ended this step were touched by it.
        let done: Vec<PeerKey> = self
            .touched
            .iter()
            .filter_map(|k| self.peers.get(k))
            .filter(|p| p.driver.in_flight.is_some_and(|i| !busy(i)))
            .map(|p| p.key)
            .collect();
        for k in done {
            if let Some(p) = self.peers.get_mut(&k) {
                p.driver.in_flight = None;
            }
            self.touch(k);
        }
        // The mesh first: new paths change routes.
        if self.mesh.deadline().is_some_and(|t| now >= t) {
            self.drive_mesh(now);
        }
        self.deadlines.set(Wake::Mesh, self.mesh.deadline());
        self.deadlines.set(Wake::Dials, self.dials_deadline());
        for k in std::mem::take(&mut self.touched) {
            let at = self.peer_deadline(&k, now);
            self.deadlines.set(Wake::Peer(k), at);
        }
        if !self.published.routes_dirty
            && self.published.held_dirty
            && let Some(last) = &self.published.last_snapshot
        {
            // Only the held table changed: share every route with the last snapshot.
            let snap = Arc::new(last.with_held(self.held_sessions()));
            self.published.held_dirty = false;
            self.published.last_snapshot = Some(snap.clone());
            // Before this step's datagrams: an answer to them (the first data packet
            // of a session we just made) must find the session in the pipelines.
            self.publish(snap);
        }
        if self.published.routes_dirty || self.published.held_dirty {
            // Records came or went: pin --use-exit-node to its first match, or say
            // that another member matches now (once per step, not per record).
            self.pin_exit();
            self.published.routes_dirty = false;
            self.published.held_dirty = false;
            self.peers.index_sessions();
            let snap = Arc::new(self.snapshot());
            self.published.last_snapshot = Some(snap.clone());
            self.publish(snap);
            let subnets = self.proxied_routes();
            if subnets != self.published.installed_subnets {
                self.published.installed_subnets = subnets.clone();
                self.actions.push_back(Action::InstallRoutes(subnets));
            }
        }
    }

    /// Queues a snapshot ahead of this step's datagrams (an answer to them, such as the
    /// first data packet of a session we just made, must find the session in the
    /// pipelines), replacing any older one not yet carried out.
    fn publish(&mut self, snap: Arc<RouteSnapshot>) {
        self.actions.retain(|a| !matches!(a, Action::PublishRoutes(_)));
        self.actions.push_front(Action::PublishRoutes(snap));
    }

    /// The routing state this node would publish now, rebuilt from every record and
    /// session: what each topology or session change costs (benches measure it).
    pub fn route_snapshot(&self) -> RouteSnapshot {
        self.snapshot()
    }

    /// Addresses currently routed, for tests.
    pub fn routed(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self.peers.values().filter(|p| p.is_up()).map(|p| p.hello.ipv4).collect();
        v.sort();
        v
    }
}

fn reason_of(e: &HandshakeError) -> RejectReason {
    match e {
        HandshakeError::BadPayload => RejectReason::BadPayload,
        _ => RejectReason::AuthFailed,
    }
}

/// What a handshake refused for `r` tells the user, on whichever side saw it.
fn reject_why(r: RejectReason) -> &'static str {
    match r {
        RejectReason::AuthFailed => "authentication failed: network secret or name differs",
        RejectReason::BadPayload => "malformed hello (version mismatch?)",
        RejectReason::AddressTaken => {
            "our overlay address already belongs to another member of the mesh (choose another --ipv4)"
        }
        RejectReason::Membership => {
            "membership by certificate: one end has an authority and the other's certificate is missing, refused or claims more than it grants (its status says which)"
        }
    }
}

/// Retires `peer`'s sessions that expired, were never confirmed within
/// [`CONFIRM_TIMEOUT`], or are superseded by a newer confirmed one and idle for
/// [`RETIRE_IDLE`]. Returns whether any went.
fn retire_sessions(peer: &mut Peer, now: Instant, epoch: Instant) -> bool {
    let now_ms = ms_since(epoch, now);
    let newest_confirmed = peer.sessions.iter().position(|s| s.session.is_confirmed());
    let before = peer.sessions.len();
    let mut i = 0;
    peer.sessions.retain(|s| {
        let idx = i;
        i += 1;
        let age = now.duration_since(s.created);
        if s.session.is_expired(now_ms) {
            return false;
        }
        if !s.session.is_confirmed() {
            return age < CONFIRM_TIMEOUT;
        }
        match newest_confirmed {
            Some(n) if idx > n => {
                let idle = now_ms.saturating_sub(s.session.last_rx_ms().max(ms_since(epoch, s.created)));
                idle < RETIRE_IDLE.as_millis() as u64
            }
            _ => true,
        }
    });
    peer.sessions.len() != before
}

/// Milliseconds from `epoch` to `now` on the pipeline clock (0 means "never").
pub(crate) fn ms_since(epoch: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(epoch).as_millis() as u64 + 1
}

/// Seals an empty data packet on `session`.
pub(crate) fn keepalive(session: &Session, now: Instant, epoch: Instant) -> Vec<u8> {
    let mut buf = vec![0u8; DATA_HEADER_LEN + 16];
    let n = session.seal(&mut buf, 0).unwrap_or(0);
    buf.truncate(n);
    session.touch_tx(ms_since(epoch, now));
    buf
}

impl Peer {
    fn status(&self, now: Instant, path: PathStatus, reachable: bool) -> PeerStatus {
        let state = if self.is_up() {
            PeerState::Established
        } else if self.driver.in_flight.is_some() || !self.sessions.is_empty() {
            PeerState::Connecting
        } else if self.error.is_some() && (self.anchor() != Anchor::None || self.wanted_until.is_some_and(|w| now < w))
        {
            PeerState::Down
        } else if reachable {
            PeerState::Idle
        } else if self.error.is_some() {
            PeerState::Down
        } else {
            PeerState::Connecting
        };
        PeerStatus {
            node_id: self.key.id(),
            hostname: self.hello.hostname.clone(),
            overlay: self.hello.ipv4,
            overlay6: self.hello.ipv6.map(|(a, _)| a),
            endpoint: self.path.endpoint(),
            path,
            rtt: self.probe.rtt,
            loss: self.probe.loss(now),
            state,
            link: self.is_link(now),
            last_handshake: self.last_handshake.map(|t| now.saturating_duration_since(t)),
            sessions: self.sessions.len(),
            protocol: self.hello.protocol.map(|p| p.version),
            secret: self.last_handshake.map(|_| self.secret),
            error: self.error.clone(),
            stats: self.stats.clone(),
        }
    }
}
