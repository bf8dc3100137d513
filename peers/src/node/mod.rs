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
use tracing::info;
use weft_control::FailureKind;
use weft_core::admission::{MacKeys, Which};
use weft_core::handshake::{Completed, Hello, Initiator, Responder, caps};
use weft_core::route::RouteSnapshot;
use weft_core::wire::RejectReason;

use crate::deadline::Deadlines;
use crate::gate::Gate;
pub use crate::gate::{AdmissionStats, LOAD_INITS_PER_SEC, RELAY_BURST, RELAY_RATE, SOURCE_BURST, SOURCE_RATE};
pub use crate::gate::{MAX_HELD, MAX_PENDING_RESP};
use crate::identity::{NodeId, PeerKey};
use crate::mesh::Mesh;
use crate::peer::{Anchor, Backoff, PeerPath, PeerTable, SessionEntry};
use crate::status::InboundFailure;
use crate::topology::Topology;

mod api;
mod claims;
mod dials;
mod exit;
mod inbound;
mod issuer;
mod messages;
mod nat;
mod nat_keepalive;
mod offload;
mod outbound;
mod path_mtu;
mod paths;
mod policy;
mod promote;
mod queue;
mod refusal;
mod routers;
mod routes;
mod status;
mod timers;
mod trust;

pub(crate) use crate::timing::{
    ACTIVE_WINDOW, CONFIRM_TIMEOUT, HELD_TIMEOUT, PING_EVERY, RETIRE_IDLE, WANTED_FOR, ms_since,
};
pub use crate::timing::{IDLE_RETIRE, REKEY_AFTER_PACKETS, Timers};
pub(crate) use api::Dest;
pub use api::{Action, Config, Input, PeerRef};

pub(crate) use trust::{HeldPolicy, Trust};

pub(crate) use timers::keepalive;

/// Packets queued for one member while its session is made, at most.
pub const MAX_QUEUED_PER_PEER: usize = 16;
/// Packets queued for all members while their sessions are made, at most.
pub const MAX_QUEUED: usize = 1024;
/// Sessions kept per peer (current plus the ones in-flight packets may still use).
const MAX_SESSIONS: usize = 3;
/// Failed inbound handshakes remembered for status.
const MAX_INBOUND_FAILURES: usize = 32;

/// Why a handshake's claims are refused: the reason shown, its kind, and what the
/// reject tells the other end (in words its release reads).
pub(crate) struct Refusal {
    why: String,
    kind: FailureKind,
    reason: RejectReason,
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
    backoff: Backoff,
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
    /// The routers and exits in use are looked at again ([`routers::Routers::check_at`]).
    Routers,
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

/// Endpoints this node dials, by a stable slot number ([`Target::Dial`]), and the
/// addresses it punched.
#[derive(Default)]
pub(crate) struct Dials {
    pub(crate) slots: BTreeMap<usize, Dial>,
    /// The slot the next dial gets.
    next: usize,
    /// When each address may get the next punch (one a second, whoever asks).
    pub(crate) punched: BTreeMap<std::net::SocketAddr, Instant>,
}

/// Counters, refusals and warnings the engine reports.
#[derive(Default)]
pub(crate) struct Report {
    /// The member `--use-exit-node` matched instead of the pinned one, once warned of.
    pub(crate) exit_warned: Option<NodeId>,
    /// Refused inbound handshakes, most recent last.
    inbound_failures: VecDeque<InboundFailure>,
    /// Packets for members without a session dropped because too many were queued.
    queued_dropped: u64,
    /// Handshakes that made a session (either side).
    handshakes_completed: u64,
    /// Handshakes started because a member sent data on a session we had dropped.
    stale_renewed: u64,
    /// Handshakes that failed, by kind.
    handshake_failures: BTreeMap<FailureKind, u64>,
    /// Members told that their packets reach us with bad checksums, and times a
    /// member told us ([`offload`]).
    pub(crate) checksum_reports_sent: u64,
    pub(crate) checksum_reports_received: u64,
    /// Why the TUN offload was turned off (told once).
    pub(crate) tun_offload_off: Option<String>,
    /// This node's NAT mapping as its links see it, and when that was worked out
    /// ([`Node::own_mapping`]).
    pub(crate) own_mapping: Option<(Instant, crate::nat::Mapping)>,
    /// Where this node sent, and the first packet that got in unasked (netcheck's
    /// filtering).
    pub(crate) filtering: crate::nat::FilterSeen,
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
    /// Endpoints we dial and addresses we punched.
    pub(crate) dials: Dials,
    /// Every peer, with its indexes (node id, links, session owners, queued packets).
    pub(crate) peers: PeerTable,
    /// Handshakes not yet proven: nothing about them is acted on or shown.
    pending: Pending,
    pub(crate) actions: VecDeque<Action>,
    /// What the last step published, and what must be published again.
    pub(crate) published: Published,
    /// The mesh: records, paths, our record.
    pub(crate) mesh: Mesh,
    /// When each part of the engine next has work.
    deadlines: Deadlines<Wake>,
    /// Peers whose deadline must be recomputed at the end of this step.
    touched: BTreeSet<PeerKey>,
    /// Counters and refusals for status.
    pub(crate) report: Report,
    /// Handshake admission: MACs, source buckets, load, cookies.
    gate: Gate,
    /// Revocations, the issuer's ledger, the next secret and the signed policy.
    pub(crate) trust: Trust,
    /// The `now` of the last step (for calls that are not handed one).
    last_now: Option<Instant>,
    /// The primary router of each subnet with several, the exit among several.
    pub(crate) routers: routers::Routers,
    /// Why our proxied subnets are withdrawn from our record (`--proxy-health`).
    pub(crate) withdrawn: Option<String>,
}

impl Node {
    /// Creates the engine. `rng` draws session indices and jitter.
    pub fn new(mut cfg: Config, mut rng: Box<dyn RngCore + Send>) -> Self {
        let id = NodeId::from_public(&cfg.handshake.local.public);
        // Our own name is ours first, on this node.
        let own_name = cfg.names.bind(&cfg.handshake.hello.hostname, id);
        // And the subnets we proxy, in a network without an authority.
        let mut own_subnets = false;
        if cfg.authorities.is_empty() {
            own_subnets = cfg.names.release_subnets(id, &cfg.proxied);
            for &(a, p) in &cfg.proxied {
                own_subnets |= cfg.names.bind_subnet(a, p, id);
            }
        }
        let macs = Arc::new(MacKeys::new(&cfg.handshake.psk));
        // The hello says which secret this node accepts ([`Node::set_secrets`] adds the next one).
        cfg.handshake.hello.secrets = vec![cfg.handshake.psk.fingerprint()];
        let mut secret = [0u8; 32];
        rng.fill_bytes(&mut secret);
        let slots: BTreeMap<usize, Dial> = cfg
            .dial
            .iter()
            .map(|&endpoint| Dial {
                endpoint,
                key: None,
                backoff: Backoff::default(),
                discovered: false,
                announced: None,
            })
            .enumerate()
            .collect();
        let mut node = Self {
            cfg,
            id,
            rng,
            dials: Dials { next: slots.len(), slots, punched: BTreeMap::new() },
            peers: PeerTable::default(),
            pending: Pending::default(),
            actions: VecDeque::new(),
            published: Published { routes_dirty: true, ..Published::default() },
            mesh: Mesh::new(),
            trust: Trust::default(),
            deadlines: Deadlines::default(),
            touched: BTreeSet::new(),
            report: Report::default(),
            gate: Gate::new(macs, secret),
            last_now: None,
            routers: routers::Routers::default(),
            withdrawn: None,
        };
        if own_name || own_subnets {
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
            Input::ConnectionDown { endpoint, error } => self.handle_connection_down(now, endpoint, error),
            Input::Unrouted { dst, packet } => self.handle_unrouted(now, dst, packet),
            Input::StaleSession { local_index } => self.handle_stale_session(now, local_index),
            Input::BadChecksum { local_index } => self.handle_bad_checksum(now, local_index),
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
                Wake::Routers => self.update_routers(now),
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
        let a = self.actions.pop_front()?;
        // Every UDP address sent to: what arrives from elsewhere came in unasked.
        if let (Action::Send { to, .. } | Action::SendBatch { to, .. } | Action::OpenMappings { to, .. }, Some(now)) =
            (&a, self.last_now)
            && to.proto == weft_core::endpoint::Proto::Udp
        {
            self.report.filtering.sent(to.addr, now);
        }
        Some(a)
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

    /// Host names bound to the member that claimed each first, and the exit pin.
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

    /// Withdraws the subnets this node proxies from its record while `why` is set
    /// (its `--proxy-health` check fails: members move to another router), and
    /// announces them again once it is `None`. The exit offer stays.
    pub fn set_withdrawn(&mut self, now: Instant, why: Option<String>) {
        if why == self.withdrawn {
            return;
        }
        match &why {
            Some(w) => tracing::warn!("proxied subnets withdrawn: {w}"),
            None => info!("proxied subnets announced again: the health check passes"),
        }
        self.withdrawn = why;
        self.mesh.record_changed(now);
        self.deadlines.at_most(Wake::Mesh, now);
        self.finish_step(now);
    }

    /// Dials `endpoint` from now on and keeps it connected, like a `--peer` given at
    /// start-up. Fails when it is already configured.
    pub fn add_peer(&mut self, now: Instant, endpoint: Endpoint) -> Result<(), String> {
        if let Some(d) = self.dials.slots.values_mut().find(|d| d.endpoint == endpoint) {
            if !d.discovered {
                return Err(format!("{endpoint} is already a configured peer"));
            }
            // Found on the LAN before: from now on it is configured (retried forever).
            d.discovered = false;
            d.announced = None;
            d.backoff = Backoff::default();
        } else {
            self.push_dial(Dial {
                endpoint,
                key: None,
                backoff: Backoff::default(),
                discovered: false,
                announced: None,
            });
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
    /// anchor, a fresh handshake backoff (its next handshake starts at once).
    pub(crate) fn close_sessions(&mut self, now: Instant, key: PeerKey, why: &str) {
        let Some(p) = self.peers.get_mut(&key) else { return };
        p.sessions.clear();
        p.dropped = None;
        p.path = PeerPath::Relayed { last: None };
        p.down_since = Some(now);
        p.error = Some(why.to_owned());
        p.backoff = Backoff::default();
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
                let Some(slot) = self.dials.slots.iter().find(|(_, d)| d.endpoint == e).map(|(i, _)| *i) else {
                    return Err(format!("{e} is not a configured peer"));
                };
                let key = self.dials.slots.remove(&slot).and_then(|d| d.key);
                (key, format!("stopped dialling {e}"))
            }
            PeerRef::Node(id) => match self.peers.key_of(&id) {
                Some(k) => (Some(k), format!("removed {id}")),
                None => return Err(format!("no peer with node id {id}")),
            },
        };
        self.pending.init.retain(|_, p| match p.target {
            Target::Dial(i) => self.dials.slots.contains_key(&i),
            Target::Peer(k) => Some(k) != key,
        });
        if let Some(key) = key {
            self.dials.slots.retain(|_, d| d.key != Some(key));
            if let Some(p) = self.peers.get(&key) {
                what = format!("{what}; closed the sessions with {} ({})", p.id, p.hello.hostname);
                self.close_sessions(now, key, "removed by the administrator");
            }
        }
        info!("{what}");
        self.finish_step(now);
        Ok(what)
    }

    pub(crate) fn finish_step(&mut self, now: Instant) {
        self.last_now = Some(now);
        // Member certificates newer than those kept: written once per step.
        if std::mem::take(&mut self.trust.newest_dirty) {
            self.actions.push_back(Action::SaveCertificates(self.trust.newest.encoded()));
        }
        // Clear in-flight markers whose handshake is gone (confirmed, failed or expired).
        let busy = |i: u32| self.pending.init.contains_key(&i) || self.pending.held.contains_key(&i);
        for d in self.dials.slots.values_mut() {
            if d.backoff.in_flight.is_some_and(|i| !busy(i)) {
                d.backoff.in_flight = None;
            }
        }
        // Peers whose handshake ended this step were touched by it.
        let done: Vec<PeerKey> = self
            .touched
            .iter()
            .filter_map(|k| self.peers.get(k))
            .filter(|p| p.backoff.in_flight.is_some_and(|i| !busy(i)))
            .map(|p| p.key)
            .collect();
        for k in done {
            if let Some(p) = self.peers.get_mut(&k) {
                p.backoff.in_flight = None;
            }
            self.touch(k);
        }
        // The mesh first: new paths change routes.
        if self.mesh.deadline().is_some_and(|t| now >= t) {
            self.drive_mesh(now);
        }
        self.deadlines.set(Wake::Mesh, self.mesh.deadline());
        self.deadlines.set(Wake::Dials, self.dials_deadline());
        // Routes changed: the primary routers and the exit may move (and the watch).
        if self.published.routes_dirty {
            self.update_routers(now);
        }
        self.deadlines.set(Wake::Routers, self.routers.check_at);
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
