//! L3 mesh simulation: many [`Node`]s with the real data plane on a simulated
//! network with a virtual clock (the [`crate::harness`]).
//!
//! Deterministic inputs: a seeded ChaCha8 RNG draws every static key, every engine's
//! RNG seed, the topology, link latencies and packet loss. Time is virtual, in whole
//! milliseconds from one base `Instant`; an event queue ordered by arrival time (then
//! receiver, then sequence) carries datagrams with per-link latency and loss, engine
//! timers and node boots.
//!
//! The underlay: node `k` joins by dialling one random earlier member `m`
//! (`Config::dial = [addr(m)]`), which makes `k`-`m` a reachable link. A few extra
//! pairs are reachable too but nobody dials them: those links only come up through
//! hole punching once the pair has a relayed session. Every other pair is
//! unreachable (think NAT or firewall), so most sessions must stay relayed and routes
//! are genuinely multi-hop. Partitions drop every datagram between two sides; a
//! departed node simply stops.
//!
//! Timers follow the engine as the runtime does: a booting node gets one
//! `handle_timeout`, and after every input, timeout or administrator's call the
//! harness reads `Node::poll_timeout()` again. A deadline earlier than the host's
//! pending one schedules a new timer event (the old one becomes stale and is
//! ignored); `None` schedules nothing. A timer that fires after the engine moved its
//! deadline later only re-arms, as the runtime's `sleep_until` would.
//!
//! Convergence ([`Net::converged`]): every running node has a route to every other,
//! and every route is a shortest path in the graph of direct links (both ends report
//! the other `PathStatus::Direct` and `PeerState::Established`). Sessions to every
//! member are not required. The check first asks one node at a time whether it holds
//! every other member's record and its snapshot forwards to every other member
//! (hash lookups, no `Node::status`), starting with the node that failed last time;
//! only when every node passes does it take every node's status, build the direct
//! graph and compare routes with a BFS.
//!
//! The harness and the engine are deterministic (the engine iterates ordered maps), so
//! a seed always produces the same run.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use weft_core::crypto::Cipher;
use weft_core::handshake::StaticKey;
use weft_core::wire::{MessageType, RELAY_HEADER_LEN, RelayHeader};
use weft_datapath::transport::Endpoint;
use weft_peers::status::{NodeStatus, PathStatus, PeerState};
use weft_peers::{Node, NodeId, Timers};

use crate::harness::{self, DataPlane, Host, Wire, ip_packet, static_key};

/// The network name every simulated node uses.
pub const NET: &str = "simnet";
/// The network secret every simulated node uses.
pub const SECRET: &str = "correct horse battery staple";
/// How often [`Net::run_until`] checks its predicate (virtual ms).
pub const CHECK_EVERY_MS: u64 = 250;

/// The UDP address of node `i`.
pub fn addr(i: usize) -> Endpoint {
    Endpoint::udp(SocketAddr::from(([198, 18, (i >> 8) as u8, (i & 0xff) as u8], 11010)))
}

/// The overlay address of node `i`.
pub fn overlay(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250) as u8 + 1)
}

/// The key of an unordered pair in [`Net::links`].
pub fn pair_key(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

/// A reachable pair of nodes.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// One-way latency.
    pub latency_ms: u64,
    /// Probability that a datagram is lost.
    pub loss: f64,
}

enum Payload {
    Deliver { from: Endpoint, bytes: Vec<u8> },
    Timer { generation: u64 },
    Boot { dial: Vec<usize> },
}

/// One event of the queue: something happens to node `to` at virtual ms `at`.
struct Ev {
    at: u64,
    to: usize,
    seq: u64,
    payload: Payload,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.to, self.seq) == (o.at, o.to, o.seq)
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.to, self.seq).cmp(&(o.at, o.to, o.seq))
    }
}

/// Knobs of a simulated mesh.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Nodes booted.
    pub nodes: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Node k boots at k * join_gap_ms.
    pub join_gap_ms: u64,
    /// Extra reachable (never dialled) pairs, as a fraction of the node count.
    pub extra_links: f64,
    /// One-way latency range of a link, ms.
    pub latency: (u64, u64),
    /// Loss probability of every link.
    pub loss: f64,
    /// Node k dials k - 1 (a line) instead of a random earlier member.
    pub chain: bool,
}

impl Plan {
    /// `nodes` nodes 50 ms apart, 30 % extra links, 2-30 ms latency, no loss.
    pub fn new(nodes: usize, seed: u64) -> Self {
        Self { nodes, seed, join_gap_ms: 50, extra_links: 0.3, latency: (2, 30), loss: 0.0, chain: false }
    }

    /// When the last node boots (virtual ms).
    pub fn last_join_ms(&self) -> u64 {
        self.nodes.saturating_sub(1) as u64 * self.join_gap_ms
    }
}

/// An undirected graph of nodes by index: `g[i]` lists `i`'s neighbours.
pub type Graph = Vec<Vec<usize>>;

/// Hop counts from `from` to every node of `g` (`None`: unreachable).
pub fn bfs(g: &Graph, from: usize) -> Vec<Option<u32>> {
    let mut dist = vec![None; g.len()];
    if from >= g.len() {
        return dist;
    }
    dist[from] = Some(0);
    let mut q = VecDeque::from([from]);
    while let Some(u) = q.pop_front() {
        let d = dist[u].unwrap_or_default();
        for &v in &g[u] {
            if dist[v].is_none() {
                dist[v] = Some(d + 1);
                q.push_back(v);
            }
        }
    }
    dist
}

/// The simulated network: hosts, underlay links, the event queue and counters.
pub struct Net {
    /// The virtual clock's origin.
    pub epoch: Instant,
    /// Virtual time (ms since `epoch`).
    pub now_ms: u64,
    /// Every machine, running or not, by index.
    pub hosts: Vec<Host>,
    keys: Vec<StaticKey>,
    /// A network with an authority: every node boots with a certificate it signed
    /// (set before the nodes boot).
    pub authority: Option<weft_core::cert::AuthorityKey>,
    /// Whom each node dialled at its last boot.
    pub dials: Vec<Vec<usize>>,
    /// The shared RX and TX pipelines.
    pub dp: DataPlane,
    queue: BinaryHeap<Reverse<Ev>>,
    seq: u64,
    /// Reachable pairs ([`pair_key`]); every other pair is unreachable.
    pub links: HashMap<(usize, usize), Link>,
    /// Partition: datagrams between nodes on different sides are dropped.
    pub side: Option<Vec<bool>>,
    rng: ChaCha8Rng,
    by_addr: HashMap<Endpoint, usize>,
    by_id: HashMap<NodeId, usize>,
    ids: Vec<NodeId>,
    generation: Vec<u64>,
    /// Per host: the virtual ms of its pending timer event, if any.
    pending: Vec<Option<u64>>,
    seed: u64,
    /// Datagrams dropped by the network (unreachable, partitioned, lost, or dead).
    pub dropped: u64,
    /// Datagrams delivered to a host.
    pub delivered: u64,
    /// Relayed frames from `.0` to `.1` (node ids) with at least `.2` bytes: who
    /// forwarded how many (in `traced`).
    pub trace: Option<([u8; 8], [u8; 8], usize)>,
    /// Forwarding counts by node for `trace`.
    pub traced: HashMap<usize, usize>,
    /// Handshake inits the engines sent (relayed or not).
    pub inits: u64,
    /// `handle_timeout` calls.
    pub timeouts: u64,
    /// Times an engine still wanted a timeout at or before `now` right after one
    /// (rescheduled 1 ms later so that the simulation cannot spin).
    pub late_timers: u64,
    /// Wall time spent in convergence checks.
    pub check_wall: Duration,
    /// Cheap convergence checks ([`Net::routes_complete`]): how many, and their wall time.
    pub cheap_checks: Cell<(u64, Duration)>,
    /// Full convergence checks ([`Net::route_mismatches`]): how many, and their wall time.
    pub full_checks: Cell<(u64, Duration)>,
    /// The node that failed the cheap convergence check last, tried first next time.
    witness: Cell<usize>,
}

impl Net {
    /// Builds the underlay and schedules every node's boot.
    pub fn build(plan: Plan) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(plan.seed);
        let n = plan.nodes;
        let keys: Vec<StaticKey> = (0..n).map(|_| static_key(&mut rng)).collect();
        let mut links = HashMap::new();
        let mut dials = vec![Vec::new(); n];
        let link =
            |rng: &mut ChaCha8Rng| Link { latency_ms: rng.gen_range(plan.latency.0..=plan.latency.1), loss: plan.loss };
        for (k, dial) in dials.iter_mut().enumerate().skip(1) {
            let m = if plan.chain { k - 1 } else { rng.gen_range(0..k) };
            links.insert(pair_key(m, k), link(&mut rng));
            dial.push(m);
        }
        let extra = if plan.chain { 0 } else { (n as f64 * plan.extra_links).round() as usize };
        let mut added = 0;
        while added < extra && n > 2 {
            let a = rng.gen_range(0..n);
            let b = rng.gen_range(0..n);
            if a == b || links.contains_key(&pair_key(a, b)) {
                continue;
            }
            links.insert(pair_key(a, b), link(&mut rng));
            added += 1;
        }
        let epoch = Instant::now();
        let ids: Vec<NodeId> = keys.iter().map(|k| NodeId::from_public(&k.public)).collect();
        let by_id: HashMap<NodeId, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let mut net = Self {
            epoch,
            now_ms: 0,
            hosts: (0..n).map(|i| Host::new(addr(i), epoch)).collect(),
            keys,
            authority: None,
            dials: dials.clone(),
            dp: DataPlane::new(epoch),
            queue: BinaryHeap::new(),
            seq: 0,
            links,
            side: None,
            by_addr: (0..n).map(|i| (addr(i), i)).collect(),
            by_id,
            ids,
            generation: vec![0; n],
            pending: vec![None; n],
            seed: plan.seed,
            rng,
            dropped: 0,
            delivered: 0,
            trace: None,
            traced: HashMap::new(),
            inits: 0,
            timeouts: 0,
            late_timers: 0,
            check_wall: Duration::ZERO,
            cheap_checks: Cell::default(),
            full_checks: Cell::default(),
            witness: Cell::new(0),
        };
        for (k, dial) in dials.into_iter().enumerate() {
            net.push(k as u64 * plan.join_gap_ms, k, Payload::Boot { dial });
        }
        net
    }

    /// Number of hosts (running or not).
    pub fn n(&self) -> usize {
        self.hosts.len()
    }

    /// The virtual time as an `Instant`.
    pub fn now(&self) -> Instant {
        self.epoch + Duration::from_millis(self.now_ms)
    }

    fn push(&mut self, at: u64, to: usize, payload: Payload) {
        self.seq += 1;
        self.queue.push(Reverse(Ev { at, to, seq: self.seq, payload }));
    }

    /// Virtual ms of an engine deadline, rounded up (the engine sees whole ms).
    fn ms_of(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_micros().div_ceil(1000) as u64
    }

    /// Reads host `i`'s deadline and schedules a timer event when it is earlier than
    /// the pending one. `after_timeout`: the engine has just run its timers, so a
    /// deadline at or before now is pushed 1 ms on (and counted) instead of spinning.
    fn arm(&mut self, i: usize, after_timeout: bool) {
        let Some(deadline) = self.hosts[i].deadline() else { return };
        let mut at = self.ms_of(deadline).max(self.now_ms);
        if after_timeout && at <= self.now_ms {
            self.late_timers += 1;
            at = self.now_ms + 1;
        }
        if self.pending[i].is_none_or(|p| at < p) {
            self.pending[i] = Some(at);
            let generation = self.generation[i];
            self.push(at, i, Payload::Timer { generation });
        }
    }

    fn boot(&mut self, i: usize, dial: Vec<usize>) {
        let mut params =
            harness::params(self.keys[i].clone(), NET, SECRET, Cipher::ChaCha20Poly1305, overlay(i), format!("n{i}"));
        if let Some(a) = &self.authority {
            params.hello.cert = Some(harness::certificate(a, &params, NET));
        }
        let dial_addrs = dial.iter().map(|&j| addr(j)).collect();
        let mut cfg = harness::config(params, dial_addrs, self.epoch, Timers::default(), addr(i));
        cfg.authorities = self.authority.iter().map(weft_core::cert::AuthorityKey::id).collect();
        self.dials[i] = dial;
        self.generation[i] += 1;
        self.pending[i] = None;
        let seed = self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((i as u64) << 20) ^ self.generation[i];
        let rng: Box<dyn RngCore + Send> = Box::new(ChaCha8Rng::seed_from_u64(seed));
        self.hosts[i].start(Node::new(cfg, rng));
        // The runtime runs the timers once at start, then sleeps until poll_timeout.
        self.fire(i);
    }

    /// Runs host `i`'s timers now, puts what it sends on the wire and re-arms.
    fn fire(&mut self, i: usize) {
        let mut out = Vec::new();
        let now = self.now();
        self.hosts[i].timeout(now, &mut out);
        self.timeouts += 1;
        self.transmit(out);
        self.arm(i, true);
    }

    /// Node `i` leaves for good: its state is gone and datagrams to it are dropped.
    pub fn depart(&mut self, i: usize) {
        self.hosts[i].stop();
        self.generation[i] += 1;
        self.pending[i] = None;
    }

    /// A new node joins now through member `via` (a new reachable link to it).
    pub fn join(&mut self, via: usize) -> usize {
        let i = self.n();
        let key = static_key(&mut self.rng);
        let id = NodeId::from_public(&key.public);
        self.keys.push(key);
        self.ids.push(id);
        self.by_id.insert(id, i);
        self.by_addr.insert(addr(i), i);
        self.hosts.push(Host::new(addr(i), self.epoch));
        self.dials.push(Vec::new());
        self.generation.push(0);
        self.pending.push(None);
        let latency_ms = self.rng.gen_range(2..=30);
        self.links.insert(pair_key(i, via), Link { latency_ms, loss: 0.0 });
        self.boot(i, vec![via]);
        i
    }

    /// Runs `f` on node `i`'s engine now (an administrator's request), puts what it
    /// sends on the wire and re-arms its timer.
    pub fn admin<R>(&mut self, i: usize, f: impl FnOnce(&mut Node) -> R) -> R {
        let mut out = Vec::new();
        let r = self.hosts[i].admin(f, &mut out);
        self.transmit(out);
        self.arm(i, false);
        r
    }

    /// Puts the datagrams a host emitted on the wire.
    fn transmit(&mut self, out: Vec<Wire>) {
        for w in out {
            let (Some(&a), Some(&b)) = (self.by_addr.get(&w.from), self.by_addr.get(&w.to)) else {
                self.dropped += 1;
                continue;
            };
            if !w.forwarded {
                let inner = if MessageType::of(&w.bytes) == Some(MessageType::Relay) {
                    w.bytes.get(RELAY_HEADER_LEN..).unwrap_or_default()
                } else {
                    &w.bytes[..]
                };
                if MessageType::of(inner) == Some(MessageType::HandshakeInit) {
                    self.inits += 1;
                }
            }
            if let (true, Some((src, dst, min))) = (w.forwarded, self.trace)
                && let Ok(h) = RelayHeader::parse(&w.bytes)
                && (h.src, h.dst) == (src, dst)
                && w.bytes.len() >= min
            {
                *self.traced.entry(a).or_default() += 1;
            }
            let Some(link) = self.links.get(&pair_key(a, b)).copied() else {
                self.dropped += 1;
                continue;
            };
            let cut = self.side.as_ref().is_some_and(|s| s[a] != s[b]);
            if cut || !self.hosts[b].running() || (link.loss > 0.0 && self.rng.gen_bool(link.loss)) {
                self.dropped += 1;
                continue;
            }
            self.push(self.now_ms + link.latency_ms, b, Payload::Deliver { from: w.from, bytes: w.bytes });
        }
    }

    /// Processes every event due at or before `until` (virtual ms) and leaves the clock
    /// at `until`.
    pub fn run_to(&mut self, until: u64) {
        while let Some(Reverse(ev)) = self.queue.peek() {
            if ev.at > until {
                break;
            }
            let Some(Reverse(ev)) = self.queue.pop() else { break };
            self.now_ms = ev.at;
            let i = ev.to;
            match ev.payload {
                Payload::Boot { dial } => self.boot(i, dial),
                Payload::Timer { generation } => {
                    // Stale: the node restarted or departed, or an earlier deadline
                    // replaced this one.
                    if generation != self.generation[i] || self.pending[i] != Some(ev.at) || !self.hosts[i].running() {
                        continue;
                    }
                    self.pending[i] = None;
                    match self.hosts[i].deadline() {
                        Some(d) if self.ms_of(d) <= self.now_ms => self.fire(i),
                        // The deadline moved later (or went away): sleep on.
                        _ => self.arm(i, false),
                    }
                }
                Payload::Deliver { from, bytes } => {
                    // Everything else arriving at the same node at the same time joins
                    // the batch, as one recvmmsg would return it.
                    let mut batch = vec![(from, bytes)];
                    while let Some(Reverse(next)) = self.queue.peek() {
                        if next.at != ev.at || next.to != i || !matches!(next.payload, Payload::Deliver { .. }) {
                            break;
                        }
                        let Some(Reverse(Ev { payload: Payload::Deliver { from, bytes }, .. })) = self.queue.pop()
                        else {
                            unreachable!("peeked a delivery")
                        };
                        batch.push((from, bytes));
                    }
                    self.delivered += batch.len() as u64;
                    let refs: Vec<(Endpoint, &[u8])> = batch.iter().map(|(f, b)| (*f, &b[..])).collect();
                    let mut out = Vec::new();
                    let now = self.now();
                    self.dp.receive(&mut self.hosts[i], now, &refs, &mut out);
                    self.transmit(out);
                    self.arm(i, false);
                }
            }
        }
        self.now_ms = self.now_ms.max(until);
    }

    /// Runs for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        self.run_to(self.now_ms + d.as_millis() as u64);
    }

    /// Runs until `pred` holds (checked every [`CHECK_EVERY_MS`]) or `max` passed;
    /// returns the virtual time it took.
    pub fn run_until(&mut self, max: Duration, mut pred: impl FnMut(&Self) -> bool) -> Option<Duration> {
        let start = self.now_ms;
        loop {
            if pred(self) {
                return Some(Duration::from_millis(self.now_ms - start));
            }
            if self.now_ms - start >= max.as_millis() as u64 {
                return None;
            }
            self.run_to(self.now_ms + CHECK_EVERY_MS);
        }
    }

    /// [`Net::run_until`] the mesh has converged ([`Net::converged`]), counting the
    /// checks' wall time in [`Net::check_wall`].
    pub fn run_until_converged(&mut self, max: Duration) -> Option<Duration> {
        let start = self.now_ms;
        loop {
            let t = Instant::now();
            let done = self.converged();
            self.check_wall += t.elapsed();
            if done {
                return Some(Duration::from_millis(self.now_ms - start));
            }
            if self.now_ms - start >= max.as_millis() as u64 {
                return None;
            }
            self.run_to(self.now_ms + CHECK_EVERY_MS);
        }
    }

    /// Node `i`'s id.
    pub fn id(&self, i: usize) -> NodeId {
        self.ids[i]
    }

    /// The index of the node with id `id`; panics for a stranger.
    pub fn index_of_id(&self, id: NodeId) -> usize {
        *self.by_id.get(&id).expect("a known node")
    }

    /// Node `i`'s static public key (what certificates and revocations name).
    pub fn public_key(&self, i: usize) -> [u8; 32] {
        self.keys[i].public
    }

    /// Node `i`'s engine; panics when it is stopped.
    pub fn node(&self, i: usize) -> &Node {
        self.hosts[i].node()
    }

    /// Node `i`'s status now; panics when it is stopped.
    pub fn status(&self, i: usize) -> NodeStatus {
        self.hosts[i].node().status(self.now())
    }

    /// The running nodes.
    pub fn running(&self) -> Vec<usize> {
        (0..self.n()).filter(|&i| self.hosts[i].running()).collect()
    }

    /// What node `i` lacks for the cheap condition: the first running member whose
    /// record it does not hold, or whom its published snapshot cannot forward to.
    fn lacks(&self, i: usize, running: &[usize]) -> Option<(usize, &'static str)> {
        let host = &self.hosts[i];
        let node = host.node.as_ref()?;
        for &j in running.iter().filter(|&&j| j != i) {
            let id = self.ids[j];
            if node.topology().get(&id).is_none() {
                return Some((j, "no record"));
            }
            if host.routes.next_hop(&id.to_bytes()).is_none() {
                return Some((j, "no next hop in the snapshot"));
            }
        }
        None
    }

    /// The cheap necessary condition of convergence, without `Node::status` (whose
    /// cost grows with the member count): every running node holds every other's
    /// record (a route names one) and its published snapshot forwards to every other
    /// (the snapshot's next-hop table holds every reachable node: that is what lets a
    /// relay forward frames). Tries the node that failed last time first, so while the
    /// mesh is not there a check usually costs one node's lookups.
    pub fn routes_complete(&self) -> bool {
        let running = self.running();
        let w = self.witness.get();
        if self.hosts.get(w).is_some_and(Host::running) && self.lacks(w, &running).is_some() {
            return false;
        }
        for &i in running.iter().filter(|&&i| i != w) {
            if self.lacks(i, &running).is_some() {
                self.witness.set(i);
                return false;
            }
        }
        true
    }

    /// The first nodes failing [`Net::routes_complete`]: (node, the member it
    /// lacks, what is missing), for messages.
    pub fn incomplete(&self, limit: usize) -> Vec<(usize, usize, &'static str)> {
        let running = self.running();
        running.iter().filter_map(|&i| self.lacks(i, &running).map(|(j, why)| (i, j, why))).take(limit).collect()
    }

    /// Every running node routes to every other on a shortest path of the direct
    /// graph: [`Net::routes_complete`], then [`Net::route_mismatches`].
    pub fn converged(&self) -> bool {
        let count = |c: &Cell<(u64, Duration)>, t: Instant| {
            let (n, d) = c.get();
            c.set((n + 1, d + t.elapsed()));
        };
        let t = Instant::now();
        let cheap = self.routes_complete();
        count(&self.cheap_checks, t);
        if !cheap {
            return false;
        }
        let t = Instant::now();
        let full = self.route_mismatches(1).is_empty();
        count(&self.full_checks, t);
        full
    }

    /// Running nodes that lack a route to another running node, with how many they
    /// lack, for messages.
    pub fn missing(&self) -> Vec<(usize, usize)> {
        let running = self.running();
        let mut v = Vec::new();
        for &i in &running {
            let routes: HashSet<NodeId> = self.status(i).routes.iter().map(|r| r.node).collect();
            let no_route = running.iter().filter(|&&j| j != i && !routes.contains(&self.id(j))).count();
            if no_route > 0 {
                v.push((i, no_route));
            }
        }
        v
    }

    fn statuses(&self) -> Vec<Option<NodeStatus>> {
        let now = self.now();
        self.hosts.iter().map(|h| h.node.as_ref().map(|n| n.status(now))).collect()
    }

    /// Links whose both ends report the other as a direct, established peer that is
    /// a link of the mesh (a hole-punched shortcut for traffic is not one: routes do
    /// not use it).
    pub fn direct_graph(&self) -> Graph {
        self.direct_graph_of(&self.statuses())
    }

    fn direct_graph_of(&self, statuses: &[Option<NodeStatus>]) -> Graph {
        let mut direct: HashSet<(usize, usize)> = HashSet::new();
        for (i, st) in statuses.iter().enumerate() {
            for p in st.iter().flat_map(|s| &s.peers) {
                if p.path == PathStatus::Direct
                    && p.state == PeerState::Established
                    && p.link
                    && let Some(&j) = self.by_id.get(&p.node_id)
                {
                    direct.insert((i, j));
                }
            }
        }
        let mut g: Graph = vec![Vec::new(); self.n()];
        for &(i, j) in &direct {
            if i < j && direct.contains(&(j, i)) {
                g[i].push(j);
                g[j].push(i);
            }
        }
        for adj in &mut g {
            adj.sort_unstable();
        }
        g
    }

    /// Number of links in `g`.
    pub fn edges(g: &Graph) -> usize {
        g.iter().map(Vec::len).sum::<usize>() / 2
    }

    /// The reachable links between running nodes that are not cut by the partition.
    pub fn live_links(&self) -> usize {
        self.links
            .keys()
            .filter(|(a, b)| self.hosts[*a].running() && self.hosts[*b].running())
            .filter(|(a, b)| self.side.as_ref().is_none_or(|s| s[*a] == s[*b]))
            .count()
    }

    /// Every node's routes against a BFS over the direct graph: the same set of
    /// destinations, the same hop counts, and a first hop on a shortest path. Returns
    /// at most `limit` mismatches (it stops looking there).
    pub fn route_mismatches(&self, limit: usize) -> Vec<String> {
        let statuses = self.statuses();
        let g = self.direct_graph_of(&statuses);
        let mut bad = Vec::new();
        for (i, st) in statuses.iter().enumerate() {
            let Some(st) = st else { continue };
            let dist = bfs(&g, i);
            // Distances from i's neighbours, computed once each.
            let mut from_hop: HashMap<usize, Vec<Option<u32>>> = HashMap::new();
            let mut seen = vec![false; self.n()];
            for r in &st.routes {
                let (Some(&j), Some(&hop)) = (self.by_id.get(&r.node), self.by_id.get(&r.next_hop)) else {
                    bad.push(format!("{i}: route to a stranger {}", r.node));
                    continue;
                };
                seen[j] = true;
                match dist[j] {
                    None => bad.push(format!("{i}: route to unreachable {j} ({} hops)", r.hops)),
                    Some(d) if d != r.hops => bad.push(format!("{i}->{j}: {} hops, BFS says {d}", r.hops)),
                    Some(d) => {
                        let via = if dist[hop] == Some(1) {
                            from_hop.entry(hop).or_insert_with(|| bfs(&g, hop))[j]
                        } else {
                            None
                        };
                        if via != Some(d - 1) {
                            bad.push(format!("{i}->{j}: first hop {hop} not on a shortest path"));
                        }
                    }
                }
                if bad.len() >= limit {
                    return bad;
                }
            }
            for (j, d) in dist.iter().enumerate() {
                if j != i && d.is_some() && !seen[j] {
                    bad.push(format!("{i}: no route to reachable {j}"));
                    if bad.len() >= limit {
                        return bad;
                    }
                }
            }
        }
        bad
    }

    /// Control-plane traffic so far: (bytes the engines sent, bytes relays forwarded).
    pub fn traffic(&self) -> (u64, u64) {
        self.hosts.iter().fold((0, 0), |(c, f), h| (c + h.ctl_bytes, f + h.fwd_bytes))
    }

    /// Peers with an established session, per running node.
    pub fn sessions(&self) -> Vec<usize> {
        self.running()
            .into_iter()
            .map(|i| self.status(i).peers.iter().filter(|p| p.state == PeerState::Established).count())
            .collect()
    }

    /// `count` distinct IP packets from `x`'s overlay address to `y`'s.
    pub fn packets(&self, x: usize, y: usize, count: usize) -> Vec<Vec<u8>> {
        (0..count).map(|k| ip_packet(overlay(x), overlay(y), 100 + k, 0xda7a_0000 + k as u64)).collect()
    }

    /// Sends `count` packets from `x`'s TUN to `y`'s overlay address through `x`'s TX
    /// pipeline (whatever TX hands the engine, such as a packet for a member without a
    /// session, goes to it) and lets the network carry them for `settle`. Returns the
    /// packets; whether they arrived is in `hosts[y].tun`.
    pub fn send_data(&mut self, x: usize, y: usize, count: usize, settle: Duration) -> Vec<Vec<u8>> {
        let pkts = self.packets(x, y, count);
        let mut out = Vec::new();
        let now = self.now();
        self.dp.send(&mut self.hosts[x], now, &pkts, &mut out);
        self.transmit(out);
        self.arm(x, false);
        self.run_for(settle);
        pkts
    }
}

/// Control-plane bytes per node per second.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rate {
    /// Sent by the engines (`Action::Send`).
    pub sent: f64,
    /// Forwarded by relays.
    pub relayed: f64,
}

impl Rate {
    /// Sent plus relayed.
    pub fn total(&self) -> f64 {
        self.sent + self.relayed
    }
}

/// What a mesh run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Nodes booted.
    pub nodes: usize,
    /// From the first boot until converged ([`Net::converged`]).
    pub converge: Duration,
    /// From the last boot until converged.
    pub after_last_join: Duration,
    /// Control traffic while converging (first boot to convergence).
    pub converge_rate: Rate,
    /// Control traffic at rest, over `steady_window` after convergence.
    pub steady_rate: Rate,
    /// The window `steady_rate` was measured over.
    pub steady_window: Duration,
    /// Whether the mesh was still converged at the end of the window.
    pub still_converged: bool,
    /// Reachable pairs of the underlay.
    pub links: usize,
    /// Links both ends report direct and established, at the end.
    pub direct_links: usize,
    /// Longest shortest path of the direct graph, in hops, at the end.
    pub diameter: u32,
    /// Most peers with an established session on any node, at the end.
    pub max_sessions: usize,
    /// Mean of the same over the nodes.
    pub mean_sessions: f64,
    /// Wall time spent in convergence checks.
    pub check_wall: Duration,
    /// Cheap checks (count, wall time); see [`Net::cheap_checks`].
    pub cheap_checks: (u64, Duration),
    /// Full checks (count, wall time); see [`Net::full_checks`].
    pub full_checks: (u64, Duration),
    /// Wall time of the whole run.
    pub wall: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mesh {} nodes: converged {:.2} s after the last join ({:.2} s from the first boot); links {} \
             (direct {}), diameter {} hops; control bytes/node/s converging {:.0} sent + {:.0} relayed, \
             at rest over {:.0} s {:.0} sent + {:.0} relayed{}; sessions per node max {} mean {:.1}; \
             checks {:.2} s ({} cheap {:.2} s, {} full {:.2} s), wall {:.1} s",
            self.nodes,
            self.after_last_join.as_secs_f64(),
            self.converge.as_secs_f64(),
            self.links,
            self.direct_links,
            self.diameter,
            self.converge_rate.sent,
            self.converge_rate.relayed,
            self.steady_window.as_secs_f64(),
            self.steady_rate.sent,
            self.steady_rate.relayed,
            if self.still_converged { "" } else { " (NOT converged at the end)" },
            self.max_sessions,
            self.mean_sessions,
            self.check_wall.as_secs_f64(),
            self.cheap_checks.0,
            self.cheap_checks.1.as_secs_f64(),
            self.full_checks.0,
            self.full_checks.1.as_secs_f64(),
            self.wall.as_secs_f64()
        )
    }
}

/// A mesh that did not converge within the limit.
#[derive(Debug, Clone)]
pub struct NotConverged {
    /// Nodes booted.
    pub nodes: usize,
    /// Virtual time since the last join when the run gave up.
    pub after_last_join: Duration,
    /// Nodes lacking routes (node, how many), the first few.
    pub missing: Vec<(usize, usize)>,
    /// Nodes failing the cheap check (node, member it lacks, what), the first few.
    pub incomplete: Vec<(usize, usize, &'static str)>,
    /// Routes that are not shortest paths, the first few.
    pub mismatches: Vec<String>,
}

impl fmt::Display for NotConverged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} nodes not converged {:.1} s after the last join: nodes lacking routes (node, missing) {:?}; \
             lacking a record or next hop (node, member, what) {:?}; routes off the shortest paths {:?}",
            self.nodes,
            self.after_last_join.as_secs_f64(),
            self.missing,
            self.incomplete,
            self.mismatches
        )
    }
}

impl std::error::Error for NotConverged {}

/// Boots the mesh of `plan`, runs until it converges (at most `limit` after the last
/// join), then measures `steady` of virtual time at rest. Returns the network for
/// further checks and what was measured.
pub fn run(plan: Plan, limit: Duration, steady: Duration) -> Result<(Net, Report), NotConverged> {
    let wall = Instant::now();
    let mut net = Net::build(plan);
    let last_join = plan.last_join_ms();
    net.run_to(last_join);
    let Some(after_last_join) = net.run_until_converged(limit) else {
        let mut missing = net.missing();
        missing.truncate(10);
        return Err(NotConverged {
            nodes: plan.nodes,
            after_last_join: Duration::from_millis(net.now_ms - last_join),
            missing,
            incomplete: net.incomplete(10),
            mismatches: net.route_mismatches(10),
        });
    };
    let converge = Duration::from_millis(net.now_ms);
    let (c0, f0) = net.traffic();
    let nodes = plan.nodes.max(1) as f64;
    let rate = |c: u64, f: u64, d: Duration| {
        let s = d.as_secs_f64().max(1e-3);
        Rate { sent: c as f64 / nodes / s, relayed: f as f64 / nodes / s }
    };
    let converge_rate = rate(c0, f0, converge);

    net.run_for(steady);
    let (c1, f1) = net.traffic();
    let steady_rate = rate(c1 - c0, f1 - f0, steady);
    let t = Instant::now();
    let still_converged = net.converged();
    net.check_wall += t.elapsed();
    let g = net.direct_graph();
    let diameter = (0..net.n()).flat_map(|i| bfs(&g, i)).flatten().max().unwrap_or(0);
    let sessions = net.sessions();
    let report = Report {
        nodes: plan.nodes,
        converge,
        after_last_join,
        converge_rate,
        steady_rate,
        steady_window: steady,
        still_converged,
        links: net.links.len(),
        direct_links: Net::edges(&g),
        diameter,
        max_sessions: sessions.iter().copied().max().unwrap_or(0),
        mean_sessions: sessions.iter().sum::<usize>() as f64 / sessions.len().max(1) as f64,
        check_wall: net.check_wall,
        cheap_checks: net.cheap_checks.get(),
        full_checks: net.full_checks.get(),
        wall: wall.elapsed(),
    };
    Ok((net, report))
}
