//! L3 mesh simulation: many [`Node`]s with the real data plane on a simulated
//! network with a virtual clock.
//!
//! Deterministic inputs: a seeded ChaCha8 RNG draws every static key, every engine's
//! RNG seed, the topology, link latencies and packet loss. Time is virtual, in whole
//! milliseconds from one base `Instant`; an event queue ordered by arrival time (then
//! receiver, then sequence) carries datagrams with per-link latency and loss, engine
//! timers (`poll_timeout`) and node boots.
//!
//! The underlay: node `k` joins by dialling one random earlier member `m`
//! (`Config::dial = [addr(m)]`), which makes `k`-`m` a reachable link. A few extra
//! pairs are reachable too but nobody dials them: those links only come up through
//! hole punching once the pair has a relayed session. Every other pair is
//! unreachable (think NAT or firewall), so most sessions must stay relayed and routes
//! are genuinely multi-hop. Partitions drop every datagram between two sides; a
//! departed node simply stops.
//!
//! The harness and the engine are deterministic (the engine iterates ordered maps), so
//! a seed always produces the same run (`same_seed_same_run`). The assertions still use
//! bounds with margin rather than exact times, so that engine changes that shift
//! timings a little do not need new constants. Convergence is checked every
//! [`CHECK_EVERY_MS`] of virtual time.
// Tests stand in for the runtime: they make the epoch the engine is handed.
#![allow(clippy::disallowed_methods)]

mod harness;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use weft_core::transport::Endpoint;

use harness::{DataPlane, Host, Wire, ip_packet, static_key};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use weft_core::crypto::Cipher;
use weft_core::handshake::StaticKey;
use weft_core::stats::DropReason;
use weft_core::wire::{DATA_HEADER_LEN, MessageType, RELAY_HEADER_LEN, RelayHeader};
use weft_peers::status::{NodeStatus, PathStatus, PeerState};
use weft_peers::topology::RECORD_TTL;
use weft_peers::{Node, NodeId, Timers};

const NET: &str = "simnet";
const SECRET: &str = "correct horse battery staple";
/// How often run_until checks its predicate (virtual ms).
const CHECK_EVERY_MS: u64 = 250;

fn addr(i: usize) -> Endpoint {
    Endpoint::udp(SocketAddr::from(([198, 18, (i >> 8) as u8, (i & 0xff) as u8], 11010)))
}

fn overlay(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250) as u8 + 1)
}

fn pair_key(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

/// A reachable pair of nodes.
#[derive(Debug, Clone, Copy)]
struct Link {
    /// One-way latency.
    latency_ms: u64,
    /// Probability that a datagram is lost.
    loss: f64,
}

enum Payload {
    Deliver { from: Endpoint, bytes: Vec<u8> },
    Timer { generation: u64 },
    Boot { dial: Vec<usize> },
}

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
struct Plan {
    nodes: usize,
    seed: u64,
    /// Node k boots at k * join_gap_ms.
    join_gap_ms: u64,
    /// Extra reachable (never dialled) pairs, as a fraction of the node count.
    extra_links: f64,
    /// One-way latency range of a link, ms.
    latency: (u64, u64),
    /// Loss probability of every link.
    loss: f64,
    /// Node k dials k - 1 (a line) instead of a random earlier member.
    chain: bool,
}

impl Plan {
    fn new(nodes: usize, seed: u64) -> Self {
        Self { nodes, seed, join_gap_ms: 50, extra_links: 0.3, latency: (2, 30), loss: 0.0, chain: false }
    }
}

struct Net {
    epoch: Instant,
    now_ms: u64,
    hosts: Vec<Host>,
    keys: Vec<StaticKey>,
    dials: Vec<Vec<usize>>,
    dp: DataPlane,
    queue: BinaryHeap<Reverse<Ev>>,
    seq: u64,
    links: HashMap<(usize, usize), Link>,
    /// Partition: datagrams between nodes on different sides are dropped.
    side: Option<Vec<bool>>,
    rng: ChaCha8Rng,
    by_addr: HashMap<Endpoint, usize>,
    by_id: HashMap<NodeId, usize>,
    ids: Vec<NodeId>,
    generation: Vec<u64>,
    seed: u64,
    /// Datagrams dropped by the network (unreachable, partitioned, lost, or dead).
    dropped: u64,
    delivered: u64,
    /// Relayed frames from `.0` to `.1` (node ids) with at least `.2` bytes: who
    /// forwarded how many.
    trace: Option<([u8; 8], [u8; 8], usize)>,
    traced: HashMap<usize, usize>,
    /// Handshake inits the engines sent (relayed or not).
    inits: u64,
}

impl Net {
    /// Builds the underlay and schedules every node's boot.
    fn build(plan: Plan) -> Self {
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
            seed: plan.seed,
            rng,
            dropped: 0,
            delivered: 0,
            trace: None,
            traced: HashMap::new(),
            inits: 0,
        };
        for (k, dial) in dials.into_iter().enumerate() {
            net.push(k as u64 * plan.join_gap_ms, k, Payload::Boot { dial });
        }
        net
    }

    fn n(&self) -> usize {
        self.hosts.len()
    }

    fn now(&self) -> Instant {
        self.epoch + Duration::from_millis(self.now_ms)
    }

    fn push(&mut self, at: u64, to: usize, payload: Payload) {
        self.seq += 1;
        self.queue.push(Reverse(Ev { at, to, seq: self.seq, payload }));
    }

    fn boot(&mut self, i: usize, dial: Vec<usize>) {
        let params =
            harness::params(self.keys[i].clone(), NET, SECRET, Cipher::ChaCha20Poly1305, overlay(i), format!("n{i}"));
        let dial_addrs = dial.iter().map(|&j| addr(j)).collect();
        let cfg = harness::config(params, dial_addrs, self.epoch, Timers::default(), addr(i));
        self.dials[i] = dial;
        self.generation[i] += 1;
        let seed = self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((i as u64) << 20) ^ self.generation[i];
        let rng: Box<dyn RngCore + Send> = Box::new(ChaCha8Rng::seed_from_u64(seed));
        self.hosts[i].start(Node::new(cfg, rng));
        let generation = self.generation[i];
        self.push(self.now_ms, i, Payload::Timer { generation });
    }

    /// Node `i` leaves for good: its state is gone and datagrams to it are dropped.
    fn depart(&mut self, i: usize) {
        self.hosts[i].stop();
        self.generation[i] += 1;
    }

    /// A new node joins now through member `via` (a new reachable link to it).
    fn join(&mut self, via: usize) -> usize {
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
        let latency_ms = self.rng.gen_range(2..=30);
        self.links.insert(pair_key(i, via), Link { latency_ms, loss: 0.0 });
        self.boot(i, vec![via]);
        i
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
    fn run_to(&mut self, until: u64) {
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
                    if generation != self.generation[i] || !self.hosts[i].running() {
                        continue;
                    }
                    let mut out = Vec::new();
                    let now = self.now();
                    self.hosts[i].timeout(now, &mut out);
                    let next = self.hosts[i].node().poll_timeout().expect("the engine wants a tick");
                    let next_ms = (next - self.epoch).as_micros().div_ceil(1000) as u64;
                    self.push(next_ms.max(self.now_ms + 1), i, Payload::Timer { generation });
                    self.transmit(out);
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
                }
            }
        }
        self.now_ms = self.now_ms.max(until);
    }

    fn run_for(&mut self, d: Duration) {
        self.run_to(self.now_ms + d.as_millis() as u64);
    }

    /// Runs until `pred` holds (checked every [`CHECK_EVERY_MS`]) or `max` passed;
    /// returns the virtual time it took.
    fn run_until(&mut self, max: Duration, mut pred: impl FnMut(&Self) -> bool) -> Option<Duration> {
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

    fn id(&self, i: usize) -> NodeId {
        self.ids[i]
    }

    fn status(&self, i: usize) -> NodeStatus {
        self.hosts[i].node().status(self.now())
    }

    fn running(&self) -> Vec<usize> {
        (0..self.n()).filter(|&i| self.hosts[i].running()).collect()
    }

    /// Nodes in `members` that lack a route or an established session to another
    /// member (with what is missing), for assertions and messages.
    fn missing(&self, members: &[usize]) -> Vec<(usize, usize, usize)> {
        let mut v = Vec::new();
        for &i in members {
            let st = self.status(i);
            let routes: HashSet<NodeId> = st.routes.iter().map(|r| r.node).collect();
            let up: HashSet<NodeId> =
                st.peers.iter().filter(|p| p.state == PeerState::Established).map(|p| p.node_id).collect();
            let no_route = members.iter().filter(|&&j| j != i && !routes.contains(&self.id(j))).count();
            let down = members.iter().filter(|&&j| j != i && !up.contains(&self.id(j))).count();
            if no_route + down > 0 {
                v.push((i, no_route, down));
            }
        }
        v
    }

    fn converged(&self, members: &[usize]) -> bool {
        self.missing(members).is_empty()
    }

    /// Links whose both ends report the other as a direct, established peer.
    fn direct_graph(&self) -> HashMap<usize, Vec<usize>> {
        let mut direct: HashSet<(usize, usize)> = HashSet::new();
        for i in self.running() {
            for p in self.status(i).peers {
                if p.path == PathStatus::Direct && p.state == PeerState::Established {
                    let j = self.index_of_id(p.node_id);
                    direct.insert((i, j));
                }
            }
        }
        let mut g: HashMap<usize, Vec<usize>> = HashMap::new();
        for &(i, j) in &direct {
            if i < j && direct.contains(&(j, i)) {
                g.entry(i).or_default().push(j);
                g.entry(j).or_default().push(i);
            }
        }
        g
    }

    fn index_of_id(&self, id: NodeId) -> usize {
        *self.by_id.get(&id).expect("a known node")
    }

    /// The reachable links between running nodes that are not cut by the partition.
    fn live_links(&self) -> usize {
        self.links
            .keys()
            .filter(|(a, b)| self.hosts[*a].running() && self.hosts[*b].running())
            .filter(|(a, b)| self.side.as_ref().is_none_or(|s| s[*a] == s[*b]))
            .count()
    }

    /// Every node's routes equal a BFS over the direct-neighbour graph: the same set
    /// of destinations, the same hop counts, and a first hop on a shortest path.
    /// Returns the mismatches.
    fn route_mismatches(&self) -> Vec<String> {
        let g = self.direct_graph();
        let dists: HashMap<usize, HashMap<usize, u32>> = self.running().into_iter().map(|i| (i, bfs(&g, i))).collect();
        let mut bad = Vec::new();
        for i in self.running() {
            let dist = &dists[&i];
            let st = self.status(i);
            let mut seen = HashSet::new();
            for r in &st.routes {
                let j = self.index_of_id(r.node);
                seen.insert(j);
                let hop = self.index_of_id(r.next_hop);
                match dist.get(&j) {
                    None => bad.push(format!("{i}: route to unreachable {j} ({} hops)", r.hops)),
                    Some(&d) if d != r.hops => bad.push(format!("{i}->{j}: {} hops, BFS says {d}", r.hops)),
                    Some(&d) => {
                        let via = dists.get(&hop).and_then(|h| h.get(&j));
                        if dist.get(&hop) != Some(&1) || via != Some(&(d - 1)) {
                            bad.push(format!("{i}->{j}: first hop {hop} not on a shortest path"));
                        }
                    }
                }
            }
            for (&j, _) in dist.iter().filter(|(j, _)| **j != i) {
                if !seen.contains(&j) {
                    bad.push(format!("{i}: no route to reachable {j}"));
                }
            }
        }
        bad
    }

    /// Control-plane traffic so far: (bytes the engines sent, bytes relays forwarded).
    fn traffic(&self) -> (u64, u64) {
        self.hosts.iter().fold((0, 0), |(c, f), h| (c + h.ctl_bytes, f + h.fwd_bytes))
    }

    /// Sends `count` packets from `x`'s TUN to `y`'s overlay address through `x`'s TX
    /// pipeline and lets the network carry them for a second. Returns the packets.
    fn send_data(&mut self, x: usize, y: usize, count: usize) -> Vec<Vec<u8>> {
        let pkts: Vec<Vec<u8>> =
            (0..count).map(|k| ip_packet(overlay(x), overlay(y), 100 + k, 0xda7a_0000 + k as u64)).collect();
        let mut out = Vec::new();
        let now = self.now();
        let sent = self.dp.send(&mut self.hosts[x], now, &pkts, &mut out);
        assert_eq!(sent, count, "{x} has no route to {y}");
        self.transmit(out);
        self.run_for(Duration::from_secs(1));
        pkts
    }
}

fn bfs(g: &HashMap<usize, Vec<usize>>, from: usize) -> HashMap<usize, u32> {
    let mut dist = HashMap::from([(from, 0u32)]);
    let mut q = VecDeque::from([from]);
    while let Some(u) = q.pop_front() {
        let d = dist[&u];
        for &v in g.get(&u).map_or(&[][..], |v| &v[..]) {
            if let std::collections::hash_map::Entry::Vacant(e) = dist.entry(v) {
                e.insert(d + 1);
                q.push_back(v);
            }
        }
    }
    dist
}

/// What a mesh run measured.
#[derive(Debug)]
struct Report {
    nodes: usize,
    /// From the first boot until every node routes and has a session to every other.
    converge: Duration,
    /// From the last boot.
    after_last_join: Duration,
    /// Control-plane bytes per node per second while converging (engine-sent, plus
    /// relay forwarding of them).
    converge_bps: (f64, f64),
    /// The same in steady state.
    steady_bps: (f64, f64),
    links: usize,
    direct_links: usize,
    max_hops: u32,
}

/// Boots a mesh, waits for full convergence, checks shortest routes and measures.
fn converge(plan: Plan, limit: Duration) -> (Net, Report) {
    let wall = Instant::now();
    let mut net = Net::build(plan);
    let all: Vec<usize> = (0..plan.nodes).collect();
    let last_join = (plan.nodes as u64 - 1) * plan.join_gap_ms;
    net.run_to(last_join);
    let t = net.run_until(limit, |n| n.converged(&all));
    let Some(_) = t else {
        let miss = net.missing(&all);
        panic!(
            "{} nodes: not converged after {:?}: {} nodes lack something, e.g. (node, no route, not established) {:?}",
            plan.nodes,
            Duration::from_millis(net.now_ms),
            miss.len(),
            &miss[..miss.len().min(10)]
        );
    };
    let converge = Duration::from_millis(net.now_ms);
    let (c0, f0) = net.traffic();
    let per = |b: u64, secs: f64| b as f64 / plan.nodes as f64 / secs;
    let converge_bps = (per(c0, converge.as_secs_f64()), per(f0, converge.as_secs_f64()));

    // Hole punching brings up every reachable pair (so the direct graph is the
    // underlay), and routes settle on it: the last records flood a moment later.
    let t = net.run_until(Duration::from_secs(60), |n| {
        n.direct_graph().values().map(Vec::len).sum::<usize>() / 2 == n.live_links() && n.route_mismatches().is_empty()
    });
    assert!(
        t.is_some(),
        "{} nodes: direct links {} of {}; route mismatches: {:?}",
        plan.nodes,
        net.direct_graph().values().map(Vec::len).sum::<usize>() / 2,
        net.live_links(),
        &net.route_mismatches()[..net.route_mismatches().len().min(10)]
    );

    eprintln!(
        "[{} nodes] direct + shortest at {} ms, wall {:.1} s",
        plan.nodes,
        net.now_ms,
        wall.elapsed().as_secs_f64()
    );
    // Steady state: 30 s of keepalives, probes and refreshes.
    let (c1, f1) = net.traffic();
    let window = Duration::from_secs(30);
    net.run_for(window);
    let (c2, f2) = net.traffic();
    if plan.loss == 0.0 {
        // (With loss a session may die and come back, or a refresh may be lost.)
        assert!(net.converged(&all), "{} nodes fell apart in steady state: {:?}", plan.nodes, net.missing(&all));
        assert!(net.route_mismatches().is_empty(), "{:?}", net.route_mismatches());
    }
    let steady_bps = (per(c2 - c1, window.as_secs_f64()), per(f2 - f1, window.as_secs_f64()));
    let g = net.direct_graph();
    let max_hops = (0..plan.nodes).flat_map(|i| bfs(&g, i).into_values()).max().unwrap_or(0);
    let report = Report {
        nodes: plan.nodes,
        converge,
        after_last_join: converge - Duration::from_millis(last_join),
        converge_bps,
        steady_bps,
        links: net.links.len(),
        direct_links: g.values().map(Vec::len).sum::<usize>() / 2,
        max_hops,
    };
    eprintln!(
        "mesh {:>3} nodes: converged at {:>5.1} s virtual ({:.1} s after the last join); links {} (direct {}), \
         diameter {} hops; control bytes/node/s converging {:.0} sent + {:.0} relayed, steady {:.0} sent + {:.0} \
         relayed; wall {:.1} s",
        report.nodes,
        report.converge.as_secs_f64(),
        report.after_last_join.as_secs_f64(),
        report.links,
        report.direct_links,
        report.max_hops,
        report.converge_bps.0,
        report.converge_bps.1,
        report.steady_bps.0,
        report.steady_bps.1,
        wall.elapsed().as_secs_f64()
    );
    (net, report)
}

/// (e): packets from `x` to a node several hops away arrive through relays, and only
/// there.
fn data_through_relays(net: &mut Net) {
    let g = net.direct_graph();
    // The pair farthest apart (lowest indices on ties).
    let (x, y, d) = (0..net.n())
        .flat_map(|i| bfs(&g, i).into_iter().map(move |(j, d)| (i, j, d)))
        .max_by_key(|&(i, j, d)| (d, Reverse(i), Reverse(j)))
        .expect("nodes");
    assert!(d >= 2, "no multi-hop pair in this mesh");
    let path = net.status(x).peers.into_iter().find(|p| p.node_id == net.id(y)).expect("x knows y").path;
    assert!(matches!(path, PathStatus::Relay { hops, .. } if hops == d), "{x}->{y}: path {path:?}, BFS {d} hops");
    // Our packets are the only relayed frames from x to y this large.
    net.trace = Some((net.id(x).to_bytes(), net.id(y).to_bytes(), RELAY_HEADER_LEN + DATA_HEADER_LEN + 100));
    net.traced.clear();
    let tun_before: Vec<usize> = net.hosts.iter().map(|h| h.tun.len()).collect();
    let pkts = net.send_data(x, y, 20);
    let got = &net.hosts[y].tun[tun_before[y]..];
    assert_eq!(got, &pkts[..], "{y} did not get exactly the {} packets from {x} ({d} hops)", pkts.len());
    for (i, h) in net.hosts.iter().enumerate() {
        if i != y {
            assert_eq!(h.tun.len(), tun_before[i], "node {i} wrote someone else's packets to its TUN");
        }
    }
    let mut relays: Vec<(usize, usize)> = net.traced.iter().map(|(i, n)| (*i, *n)).collect();
    relays.sort();
    net.trace = None;
    assert_eq!(relays.len() as u32, d - 1, "{x}->{y} over {d} hops, forwarded by {relays:?}");
    for &(r, count) in &relays {
        assert_eq!(count, pkts.len(), "relay {r} forwarded {count} of {} packets", pkts.len());
        assert!(r != x && r != y);
    }
    let relays: Vec<usize> = relays.into_iter().map(|(r, _)| r).collect();
    eprintln!("data {x} -> {y}: {} packets over {d} hops, relayed by {relays:?}", pkts.len());
}

#[test]
fn mesh_10_converges_on_shortest_routes_and_relays_data() {
    let (mut net, r) = converge(Plan::new(10, 10), Duration::from_secs(60));
    assert!(r.after_last_join < Duration::from_secs(10), "{r:?}");
    data_through_relays(&mut net);
}

#[test]
fn mesh_50_converges_on_shortest_routes_and_relays_data() {
    let (mut net, r) = converge(Plan::new(50, 50), Duration::from_secs(60));
    assert!(r.after_last_join < Duration::from_secs(20), "{r:?}");
    data_through_relays(&mut net);
}

/// The largest mesh that keeps this file well under a minute in the dev profile
/// (about 20 s of wall time on its own; 200 nodes take about 150 s, see below).
#[test]
fn mesh_100_converges_on_shortest_routes_and_relays_data() {
    let (mut net, r) = converge(Plan::new(100, 100), Duration::from_secs(60));
    assert!(r.after_last_join < Duration::from_secs(20), "{r:?}");
    data_through_relays(&mut net);
}

#[test]
#[ignore = "200 nodes take about 160 s in the dev profile; scripts/test.sh runs it (--include-ignored)"]
fn mesh_200_converges_on_shortest_routes_and_relays_data() {
    let (mut net, r) = converge(Plan::new(200, 200), Duration::from_secs(60));
    assert!(r.after_last_join < Duration::from_secs(20), "{r:?}");
    data_through_relays(&mut net);
}

/// Routes node `i` has to any node in `to`.
fn routes_into(net: &Net, i: usize, to: &HashSet<NodeId>) -> usize {
    net.status(i).routes.iter().filter(|r| to.contains(&r.node)).count()
}

#[test]
fn partition_drops_routes_to_the_other_half_and_heals() {
    let (mut net, _) = converge(Plan::new(30, 30), Duration::from_secs(60));
    let n = net.n();
    let all: Vec<usize> = (0..n).collect();
    let side: Vec<bool> = (0..n).map(|i| i < n / 2).collect();
    let ids: Vec<NodeId> = all.iter().map(|&i| net.id(i)).collect();
    let cross = |net: &Net| -> usize {
        (0..n)
            .map(|i| {
                let other: HashSet<NodeId> = (0..n).filter(|&j| side[j] != side[i]).map(|j| ids[j]).collect();
                routes_into(net, i, &other)
            })
            .sum()
    };
    assert!(cross(&net) > 0);
    let cut_links = net.links.keys().filter(|(a, b)| side[*a] != side[*b]).count();
    net.side = Some(side.clone());
    let gone = net.run_until(Duration::from_secs(30), |net| cross(net) == 0);
    let gone = gone.unwrap_or_else(|| panic!("{} routes across the partition after 30 s", cross(&net)));
    // Within each side, routes settle on the shortest paths that remain.
    let settled = net.run_until(Duration::from_secs(30), |net| net.route_mismatches().is_empty());
    assert!(settled.is_some(), "routes inside the halves: {:?}", net.route_mismatches());
    // And stay that way: no route across for the rest of a 30 s partition.
    let hold = Duration::from_secs(30).saturating_sub(gone + settled.unwrap_or_default());
    let end = net.now_ms + hold.as_millis() as u64;
    while net.now_ms < end {
        net.run_to(net.now_ms + CHECK_EVERY_MS);
        assert_eq!(cross(&net), 0, "a route across the partition came back at {} ms", net.now_ms);
    }

    net.side = None;
    let healed = net.run_until(Duration::from_secs(60), |net| {
        net.converged(&all)
            && net.direct_graph().values().map(Vec::len).sum::<usize>() / 2 == net.live_links()
            && net.route_mismatches().is_empty()
    });
    let healed = healed.unwrap_or_else(|| {
        panic!(
            "not healed after 60 s: missing {:?}, mismatches {:?}",
            net.missing(&all),
            &net.route_mismatches()[..net.route_mismatches().len().min(10)]
        )
    });
    eprintln!(
        "partition of {n} nodes ({cut_links} links cut): cross routes gone after {:.1} s, halves settled {:.1} s \
         later; healed (routes, sessions, direct links, shortest) {:.1} s after the heal",
        gone.as_secs_f64(),
        settled.unwrap_or_default().as_secs_f64(),
        healed.as_secs_f64()
    );
    assert!(gone <= Duration::from_secs(10), "cross routes took {gone:?} to go");
    assert!(healed <= Duration::from_secs(20), "healing took {healed:?}");
}

#[test]
fn departed_node_ages_out_of_every_topology() {
    let (mut net, _) = converge(Plan::new(30, 31), Duration::from_secs(60));
    let n = net.n();
    // The best-connected node whose departure leaves the others connected.
    let links: Vec<(usize, usize)> = net.links.keys().copied().collect();
    let degree = |i: usize| links.iter().filter(|(a, b)| *a == i || *b == i).count();
    let connected_without = |d: usize| {
        let mut g: HashMap<usize, Vec<usize>> = HashMap::new();
        for &(a, b) in links.iter().filter(|(a, b)| *a != d && *b != d) {
            g.entry(a).or_default().push(b);
            g.entry(b).or_default().push(a);
        }
        bfs(&g, usize::from(d == 0)).len() == n - 1
    };
    let d = (0..n).filter(|&d| connected_without(d)).max_by_key(|&d| (degree(d), Reverse(d))).expect("a candidate");
    let rest: Vec<usize> = (0..n).filter(|&i| i != d).collect();
    let gone: HashSet<NodeId> = HashSet::from([net.id(d)]);
    let routes_to_d = |net: &Net| net.running().iter().map(|&i| routes_into(net, i, &gone)).sum::<usize>();
    assert_eq!(routes_to_d(&net), n - 1);

    net.depart(d);
    let t0 = net.now_ms;
    let t_routes = net.run_until(Duration::from_secs(30), |net| routes_to_d(net) == 0);
    let t_routes = t_routes.unwrap_or_else(|| panic!("{} routes to departed {d} after 30 s", routes_to_d(&net)));
    let t_conv =
        net.run_until(Duration::from_secs(60), |net| net.converged(&rest) && net.route_mismatches().is_empty());
    assert!(t_conv.is_some(), "the rest did not reconverge: {:?} {:?}", net.missing(&rest), net.route_mismatches());

    // A node joining now still learns the record (so the probe below can see records).
    let p1 = net.join(rest[0]);
    let learned = net.run_until(Duration::from_secs(5), |net| {
        net.hosts[p1].running() && net.status(p1).peers.iter().any(|p| gone.contains(&p.node_id))
    });
    assert!(learned.is_some(), "a joiner before RECORD_TTL did not learn {d}'s record");
    assert_eq!(routes_into(&net, p1, &gone), 0);

    // Until the TTL has passed nobody routes to it again.
    let ttl_end = t0 + (RECORD_TTL + Duration::from_secs(5)).as_millis() as u64;
    while net.now_ms < ttl_end {
        net.run_to(net.now_ms + CHECK_EVERY_MS);
        assert_eq!(routes_to_d(&net), 0, "a route to departed {d} came back at {} ms", net.now_ms);
    }
    // After the TTL the record is gone everywhere: a new joiner (not next to the
    // first probe, which learned the record late) never hears of it.
    let p2 = net.join(rest[1]);
    let members = net.running();
    let t_p2 = net.run_until(Duration::from_secs(30), |net| net.converged(&members));
    assert!(t_p2.is_some(), "the second joiner did not converge: {:?}", net.missing(&members));
    let st = net.status(p2);
    assert!(!st.peers.iter().any(|p| gone.contains(&p.node_id)), "{d}'s record outlived RECORD_TTL");
    assert!(!st.routes.iter().any(|r| gone.contains(&r.node)));
    // Members that did not dial it have forgotten it (learned peers are retried for
    // Timers::learned_retry only).
    for &i in rest.iter().filter(|&&i| !net.dials[i].contains(&d)) {
        let peers = net.status(i).peers;
        assert!(!peers.iter().any(|p| gone.contains(&p.node_id)), "{i} still lists departed {d}");
    }
    eprintln!(
        "departure of {d} (degree {}) from {n} nodes: routes to it gone after {:.1} s, rest reconverged {:.1} s \
         later; record absent for a joiner at +{:.0} s",
        degree(d),
        t_routes.as_secs_f64(),
        t_conv.unwrap_or_default().as_secs_f64(),
        (net.now_ms - t0) as f64 / 1000.0
    );
    assert!(t_routes <= Duration::from_secs(10), "routes to the departed node took {t_routes:?} to go");
}

/// With 1 % loss on every link convergence still completes, but a lost record is
/// only repaired by the next periodic refresh (topology::REFRESH, 30 s), so the bound
/// is a few refresh periods rather than seconds.
#[test]
fn lossy_links_still_converge() {
    let plan = Plan { loss: 0.01, ..Plan::new(30, 32) };
    let (net, r) = converge(plan, Duration::from_secs(100));
    eprintln!(
        "lossy ({}% per link): converged {:.1} s after the last join; network dropped {} datagrams",
        plan.loss * 100.0,
        r.after_last_join.as_secs_f64(),
        net.dropped
    );
    assert!(r.after_last_join < Duration::from_secs(95), "{r:?}");
}

/// A fingerprint of a run: what the network carried and what every engine sent.
fn fingerprint(plan: Plan, until_ms: u64) -> (u64, u64, u64, Vec<u64>) {
    let mut net = Net::build(plan);
    net.run_to(until_ms);
    (net.delivered, net.dropped, net.inits, net.hosts.iter().map(|h| h.ctl_bytes).collect())
}

#[test]
fn same_seed_same_run() {
    let plan = Plan::new(20, 7);
    let a = fingerprint(plan, 5000);
    let b = fingerprint(plan, 5000);
    assert_eq!(a, b, "two runs with the same seed diverged");
}

#[test]
fn every_advertised_route_gets_a_session_on_a_long_chain() {
    let plan = Plan { chain: true, ..Plan::new(20, 20) };
    let mut net = Net::build(plan);
    net.run_to(30_000);
    let mut dead = Vec::new();
    for i in net.running() {
        for r in net.status(i).routes.iter().filter(|r| !r.session) {
            dead.push((i, net.index_of_id(r.node), r.hops));
        }
    }
    assert!(dead.is_empty(), "routes without a session (from, to, hops): {dead:?}");
}

#[test]
fn relays_never_refuse_frames_in_a_lossless_mesh() {
    let plan = Plan::new(50, 50);
    let mut net = Net::build(plan);
    let all: Vec<usize> = (0..plan.nodes).collect();
    net.run_to((plan.nodes as u64 - 1) * plan.join_gap_ms);
    assert!(net.run_until(Duration::from_secs(60), |n| n.converged(&all)).is_some());
    net.run_for(Duration::from_secs(10));
    let refused: Vec<(usize, u64)> = (0..plan.nodes)
        .map(|i| (i, net.hosts[i].stats.drops.get(DropReason::RelayRefused)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(refused.is_empty(), "relayed frames refused by (node, count): {refused:?}");
}
