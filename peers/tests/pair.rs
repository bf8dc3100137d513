//! L2 "pair" tests: two or three [`Node`]s exchanging datagrams in memory on a
//! virtual clock, with the real data plane.
//!
//! The harness plays the runtime: it drains every node's actions, keeps the latest
//! `Action::PublishRoutes` snapshot per node, and delivers every datagram through the
//! receiving node's real RX pipeline (`weft_core::pipeline::Rx`), whose control
//! events (handshake datagrams, confirmations, control messages, direct-path
//! reports) become the engine's inputs. Application packets are sealed by the real
//! TX pipeline. Time only moves when the test says so, in steps of [`TICK`], and
//! every live node gets `handle_timeout` on every step.
// Tests stand in for the runtime: they make the epoch the engine is handed.
#![allow(clippy::disallowed_methods)]

use weft_bench::harness;

use std::collections::{HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_core::endpoint::{Endpoint, Proto};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use weft_bench::harness::{DataPlane, Host, Wire, ip_packet, static_key};
use weft_core::crypto::Cipher;
use weft_core::handshake::{Initiator, Params, Stamp, StaticKey};
use weft_core::session::Session;
use weft_core::wire::{DATA_HEADER_LEN, DataHeader, FLAG_CONTROL, MessageType};
/// How far each step of the test clock moves.
const TICK: Duration = Duration::from_millis(200);
use weft_peers::node::IDLE_RETIRE;
use weft_peers::status::{PathStatus, PeerState, PeerStatus};
use weft_peers::topology::{MAX_SEQ, Record};
use weft_peers::{Config, Node, NodeId, PeerRef, Timers};

const NET: &str = "pairnet";
const SECRET: &str = "correct horse battery staple";
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;
/// Deliveries per pump before the harness calls it a datagram storm.
const STORM: usize = 100_000;

fn addr(i: usize) -> Endpoint {
    Endpoint::udp(SocketAddr::from(([192, 0, 2, i as u8 + 1], 11010)))
}

fn overlay(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, i as u8 + 1)
}

fn params(i: usize, cipher: Cipher, secret: &str) -> Params {
    let key = static_key(&mut ChaCha8Rng::seed_from_u64(0x6b65_7900 + i as u64));
    harness::params(key, NET, secret, cipher, overlay(i), format!("node{i}"))
}

/// Seals `payload` on `session` as the TX pipeline would (for packets a test wants to
/// hold back and deliver later).
fn seal(session: &Session, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; DATA_HEADER_LEN + payload.len() + 16];
    buf[DATA_HEADER_LEN..DATA_HEADER_LEN + payload.len()].copy_from_slice(payload);
    let n = session.seal(&mut buf, payload.len()).expect("seal");
    buf.truncate(n);
    buf
}

/// One datagram a node emitted.
#[derive(Debug)]
struct Sent {
    /// Virtual time since the epoch.
    at: Duration,
    from: usize,
    to: Endpoint,
    bytes: Vec<u8>,
    delivered: bool,
}

impl Sent {
    fn kind(&self) -> Option<MessageType> {
        MessageType::of(&self.bytes)
    }
}

struct Slot {
    params: Params,
    dial: Vec<usize>,
    timers: Timers,
    seed: u64,
    host: Host,
}

struct Sim {
    epoch: Instant,
    now: Instant,
    slots: Vec<Slot>,
    dp: DataPlane,
    /// Unordered pairs of nodes whose traffic is dropped.
    cut: HashSet<(usize, usize)>,
    /// Transports every node listens on beside UDP (a connection to node i over
    /// transport P is the endpoint P://ip(i):port; what i sees is P://ip(j):40000).
    extra: Vec<Proto>,
    /// Unordered pairs of nodes and the transport dropped between them.
    blocked: HashSet<(usize, usize, Proto)>,
    /// Drop every handshake datagram (rekeys fail, sessions keep running).
    no_handshakes: bool,
    /// Relay frames from the first node to the second are lost (at any hop).
    lost_relayed: Option<(usize, usize)>,
    log: Vec<Sent>,
    boots: u64,
    tag: u64,
    /// Changes to a node's engine configuration, applied at each boot.
    tweaks: Vec<(usize, Tweak)>,
}

type Queue = VecDeque<Wire>;

/// A change to a node's engine configuration.
type Tweak = Box<dyn Fn(&mut Config)>;

impl Sim {
    /// Builds the nodes (`(params, dials, timers)` each) and runs the first tick at
    /// virtual time zero.
    fn new(specs: Vec<(Params, Vec<usize>, Timers)>) -> Self {
        let epoch = Instant::now();
        let slots = specs
            .into_iter()
            .enumerate()
            .map(|(i, (params, dial, timers))| Slot {
                params,
                dial,
                timers,
                seed: 0x5eed_0000 + i as u64,
                host: Host::new(addr(i), epoch),
            })
            .collect();
        let mut sim = Self {
            epoch,
            now: epoch,
            slots,
            dp: DataPlane::new(epoch),
            cut: HashSet::new(),
            extra: Vec::new(),
            blocked: HashSet::new(),
            no_handshakes: false,
            lost_relayed: None,
            log: Vec::new(),
            boots: 0,
            tag: 0,
            tweaks: Vec::new(),
        };
        for i in 0..sim.slots.len() {
            sim.boot(i);
        }
        sim.tick();
        sim
    }

    /// A dials B, same secret and cipher.
    fn pair(timers: Timers) -> Self {
        Self::new(vec![
            (params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers),
            (params(B, Cipher::Aes128Gcm, SECRET), vec![], timers),
        ])
    }

    fn boot(&mut self, i: usize) {
        self.boots += 1;
        let s = &mut self.slots[i];
        let dial = s.dial.iter().map(|&j| addr(j)).collect();
        let mut cfg = harness::config(s.params.clone(), dial, self.epoch, s.timers, addr(i));
        cfg.endpoints.extend(self.extra.iter().map(|p| Endpoint::new(*p, addr(i).addr)));
        for (_, f) in self.tweaks.iter().filter(|(j, _)| *j == i) {
            f(&mut cfg);
        }
        let rng: Box<dyn RngCore + Send> = Box::new(ChaCha8Rng::seed_from_u64(s.seed + 1000 * self.boots));
        s.host.start(Node::new(cfg, rng));
    }

    /// Stops node `i`: its state is gone and traffic to it is dropped.
    fn kill(&mut self, i: usize) {
        self.slots[i].host.stop();
    }

    /// Starts a fresh node `i` at the same address with the given key and dials.
    fn restart(&mut self, i: usize, local: StaticKey, dial: Vec<usize>) {
        let params = Params { local, ..self.slots[i].params.clone() };
        self.restart_with(i, params, dial);
    }

    /// Starts a fresh node `i` at the same address with new parameters.
    fn restart_with(&mut self, i: usize, params: Params, dial: Vec<usize>) {
        self.slots[i].params = params;
        self.slots[i].dial = dial;
        self.boot(i);
        let mut out = Vec::new();
        self.slots[i].host.drain(&mut out);
        self.pump(out.into());
    }

    fn partition(&mut self, i: usize, j: usize) {
        self.cut.insert((i.min(j), i.max(j)));
    }

    fn heal(&mut self, i: usize, j: usize) {
        self.cut.remove(&(i.min(j), i.max(j)));
    }

    fn elapsed(&self) -> Duration {
        self.now - self.epoch
    }

    fn node(&self, i: usize) -> &Node {
        self.slots[i].host.node()
    }

    fn id(&self, i: usize) -> NodeId {
        NodeId::from_public(&self.slots[i].params.local.public)
    }

    /// `handle_timeout` on every live node at the current time, then deliver.
    fn tick(&mut self) {
        let mut out = Vec::new();
        for i in 0..self.slots.len() {
            self.slots[i].host.timeout(self.now, &mut out);
        }
        self.pump(out.into());
    }

    fn step(&mut self) {
        self.now += TICK;
        self.tick();
    }

    fn run(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    /// Steps until `pred` holds (checked now and after each step) or `max` passed.
    /// Returns how long it took.
    fn run_until(&mut self, max: Duration, mut pred: impl FnMut(&Self) -> bool) -> Option<Duration> {
        let start = self.now;
        loop {
            if pred(self) {
                return Some(self.now - start);
            }
            if self.now - start >= max {
                return None;
            }
            self.step();
        }
    }

    /// A relay frame from node `i` to node `j`.
    fn is_relayed(&self, bytes: &[u8], i: usize, j: usize) -> bool {
        weft_core::wire::RelayHeader::parse(bytes)
            .is_ok_and(|h| h.src == self.id(i).to_bytes() && h.dst == self.id(j).to_bytes())
    }

    fn index_of(&self, a: Endpoint) -> Option<usize> {
        let over_extra = self.extra.contains(&a.proto);
        self.slots.iter().position(|s| s.host.addr == a || (over_extra && s.host.addr.addr.ip() == a.addr.ip()))
    }

    /// Delivers datagrams (and whatever they cause) until the network is quiet: each
    /// goes through the receiver's real RX pipeline at the current virtual time.
    fn pump(&mut self, mut q: Queue) {
        let mut n = 0;
        while let Some(w) = q.pop_front() {
            n += 1;
            assert!(n < STORM, "datagram storm at {:?}", self.elapsed());
            let from = self.index_of(w.from).expect("sender is a slot");
            let dst = self.index_of(w.to);
            let delivered = dst.is_some_and(|j| {
                self.slots[j].host.running()
                    && self.slots[from].host.running()
                    && !self.cut.contains(&(from.min(j), from.max(j)))
                    && !self.blocked.contains(&(from.min(j), from.max(j), w.to.proto))
                    && !(self.no_handshakes && is_handshake(&w.bytes))
                    && self.lost_relayed.is_none_or(|(i, j)| !self.is_relayed(&w.bytes, i, j))
            });
            // Over a connection the receiver sees the sender's end of it.
            let seen_from = match w.to.proto {
                Proto::Udp => w.from,
                p => Endpoint::new(p, SocketAddr::new(w.from.addr.ip(), 40000)),
            };
            if let (true, Some(j)) = (delivered, dst) {
                let mut out = Vec::new();
                self.dp.receive(&mut self.slots[j].host, self.now, &[(seen_from, &w.bytes)], &mut out);
                q.extend(out);
            }
            self.log.push(Sent { at: self.elapsed(), from, to: w.to, bytes: w.bytes, delivered });
        }
    }

    /// Drops counted by every running node's data plane (pipeline and per peer).
    fn data_drops(&self) -> u64 {
        self.slots.iter().filter(|s| s.host.running()).map(|s| s.host.drops(self.now)).sum()
    }

    /// Delivers a datagram from `src` to `j`'s RX pipeline out of band (then delivers
    /// whatever that causes) and returns the length of the IP packet it wrote to the
    /// TUN, or the drop reason it counted.
    fn inject_data(&mut self, j: usize, src: Endpoint, bytes: &[u8]) -> Result<usize, &'static str> {
        let before = self.slots[j].host.drop_reasons(self.now);
        let mut out = Vec::new();
        let delivered = self.dp.receive(&mut self.slots[j].host, self.now, &[(src, bytes)], &mut out);
        let after = self.slots[j].host.drop_reasons(self.now);
        self.pump(out.into());
        if delivered == 1 {
            return Ok(self.slots[j].host.tun.last().expect("delivered").len());
        }
        Err(after.into_iter().find(|r| !before.contains(r)).map_or("not delivered", |(name, _)| name))
    }

    /// Feeds `bytes` from `src` to node `j` through its RX pipeline (handshakes and
    /// rejects reach the engine as `Input::Datagram`), then delivers whatever it sends.
    fn inject_raw(&mut self, j: usize, src: Endpoint, bytes: &[u8]) {
        assert!(self.slots[j].host.running());
        let mut out = Vec::new();
        self.dp.receive(&mut self.slots[j].host, self.now, &[(src, bytes)], &mut out);
        self.pump(out.into());
    }

    /// Every reason node `i`'s status gives: dial errors, peer errors, refused
    /// inbound handshakes.
    fn reasons(&self, i: usize) -> Vec<String> {
        let st = self.node(i).status(self.now);
        st.dials
            .into_iter()
            .filter_map(|d| d.error)
            .chain(st.peers.into_iter().filter_map(|p| p.error))
            .chain(st.inbound_failures.into_iter().map(|f| f.reason))
            .collect()
    }

    fn routed(&self, i: usize) -> Vec<Ipv4Addr> {
        self.node(i).routed()
    }

    fn peer_status(&self, i: usize, j: usize) -> Option<PeerStatus> {
        let id = self.id(j);
        self.node(i).status(self.now).peers.into_iter().find(|p| p.node_id == id)
    }

    fn state(&self, i: usize, j: usize) -> Option<PeerState> {
        self.peer_status(i, j).map(|p| p.state)
    }

    /// `i` routes `j`'s overlay address and reports it established.
    fn established(&self, i: usize, j: usize) -> bool {
        self.slots[i].host.running()
            && self.routed(i).contains(&overlay(j))
            && self.state(i, j) == Some(PeerState::Established)
            && self.route(i, j).is_some()
    }

    /// The session `i`'s latest snapshot sends to `j` on.
    fn route(&self, i: usize, j: usize) -> Option<Arc<Session>> {
        self.slots[i].host.routes.session_for(overlay(j).into()).cloned()
    }

    /// `i`'s TX pipeline sends an 84-byte packet to `j`'s overlay address; returns its
    /// length if `j`'s RX wrote exactly that packet to its TUN.
    fn send_data(&mut self, i: usize, j: usize) -> Result<usize, &'static str> {
        self.tag += 1;
        let pkt = ip_packet(overlay(i), overlay(j), 64, self.tag);
        let mut out = Vec::new();
        // Without a session the engine holds the packet, makes one and sends it.
        let queued = self.slots[i].host.node().status(self.now).queued_dropped;
        self.dp.send(&mut self.slots[i].host, self.now, std::slice::from_ref(&pkt), &mut out);
        if out.is_empty() && self.slots[i].host.node().status(self.now).queued_dropped == queued {
            let demand = self.slots[i].host.routes.demand_for(overlay(j).into()).is_some();
            if !demand {
                return Err("no route");
            }
        }
        let before = self.slots[j].host.tun.len();
        self.pump(out.into());
        let got = &self.slots[j].host.tun[before..];
        match got {
            [p] if *p == pkt => Ok(p.len()),
            [] => Err("not delivered"),
            _ => Err("wrong packets delivered"),
        }
    }

    /// Member `from` sends `to` a control message of its own making (what a
    /// compromised member could send): sealed on its real session with `to`.
    fn send_control(&mut self, from: usize, to: usize, msg: &[u8]) {
        let session = self.route(from, to).expect("a session to send the message on");
        let mut buf = vec![0u8; DATA_HEADER_LEN + msg.len() + 16];
        buf[DATA_HEADER_LEN..DATA_HEADER_LEN + msg.len()].copy_from_slice(msg);
        let n = session.seal_with_flags(&mut buf, msg.len(), FLAG_CONTROL).expect("seal");
        buf.truncate(n);
        let src = self.slots[from].host.addr;
        self.inject_raw(to, src, &buf);
    }

    /// Member `from` sends `to` a topology record.
    fn send_record(&mut self, from: usize, to: usize, rec: &Record) {
        let mut msg = vec![1u8]; // Msg::Record
        rec.emit(&mut msg);
        self.send_control(from, to, &msg);
    }

    /// The record `i` holds about `j`.
    fn record(&self, i: usize, j: usize) -> Option<Record> {
        self.node(i).topology().get(&self.id(j)).cloned()
    }

    /// Handshake init datagrams sent by `from` from log position `since` on.
    fn inits(&self, from: usize, since: usize) -> impl Iterator<Item = &Sent> {
        self.log[since..].iter().filter(move |s| s.from == from && s.kind() == Some(MessageType::HandshakeInit))
    }
}

fn default_pair_established() -> Sim {
    let mut sim = Sim::pair(Timers::default());
    let t = sim.run_until(Duration::from_secs(1), |s| s.established(A, B) && s.established(B, A));
    assert!(t.is_some(), "pair did not come up: {:?} / {:?}", sim.peer_status(A, B), sim.peer_status(B, A));
    sim
}

// ----- 1 -----

#[test]
fn xx_first_contact_establishes_both_sides() {
    let mut sim = Sim::pair(Timers::default());
    let t = sim.run_until(Duration::from_secs(1), |s| s.established(A, B) && s.established(B, A));
    assert!(
        t.is_some(),
        "not established within 1 s: A sees {:?}, B sees {:?}",
        sim.peer_status(A, B),
        sim.peer_status(B, A)
    );
    assert_eq!(sim.routed(A), vec![overlay(B)]);
    assert_eq!(sim.routed(B), vec![overlay(A)]);

    // First contact is XX (pattern byte 0), and took the three messages.
    let first = sim.inits(A, 0).next().expect("A sent an init");
    assert_eq!(first.bytes[1], 0, "first contact must use XX");
    assert_eq!(first.to, addr(B));
    assert!(sim.log.iter().any(|s| s.from == A && s.kind() == Some(MessageType::HandshakeFinish)));

    // Status carries what each learned from the other's hello.
    let ab = sim.peer_status(A, B).expect("A knows B");
    assert_eq!(ab.overlay, overlay(B));
    assert_eq!(ab.hostname, "node1");
    assert_eq!(ab.endpoint, Some(addr(B)));
    assert!(ab.error.is_none(), "{:?}", ab.error);
    let ba = sim.peer_status(B, A).expect("B knows A");
    assert_eq!(ba.endpoint, Some(addr(A)));
    assert!(sim.node(A).status(sim.now).dials.is_empty(), "a connected dial is not listed");

    // Both directions carry data.
    assert_eq!(sim.send_data(A, B), Ok(84));
    assert_eq!(sim.send_data(B, A), Ok(84));

    // And it stays up on keepalives alone.
    sim.run(Duration::from_secs(30));
    assert!(sim.established(A, B) && sim.established(B, A));
    assert_eq!(sim.data_drops(), 0);
}

// ----- 2 -----

#[test]
fn wrong_secret_never_routes_and_says_why() {
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers),
        (params(B, Cipher::Aes128Gcm, "another secret"), vec![], timers),
    ]);
    let mut steps = 0;
    while sim.elapsed() < Duration::from_secs(30) {
        assert!(sim.routed(A).is_empty(), "A routed {:?} at {:?}", sim.routed(A), sim.elapsed());
        assert!(sim.routed(B).is_empty(), "B routed {:?} at {:?}", sim.routed(B), sim.elapsed());
        assert!(sim.route(A, B).is_none() && sim.route(B, A).is_none(), "a snapshot routes");
        assert_ne!(sim.state(B, A), Some(PeerState::Established));
        assert_ne!(sim.state(A, B), Some(PeerState::Established));
        sim.step();
        steps += 1;
    }
    assert!(steps >= 150);
    // Both keep retrying, but back off instead of handshaking on every tick.
    let (ia, ib) = (sim.inits(A, 0).count(), sim.inits(B, 0).count());
    assert!(ia >= 3, "A gave up: {ia} inits");
    assert!(ia + ib <= 30, "handshake storm: {ia} + {ib} inits in 30 s");

    let st = sim.node(A).status(sim.now);
    let reasons: Vec<String> = st
        .dials
        .iter()
        .filter_map(|d| d.error.clone())
        .chain(st.peers.iter().filter_map(|p| p.error.clone()))
        .collect();
    assert!(!reasons.is_empty(), "A gives no reason: {st:?}");
    assert!(reasons.iter().any(|r| r.contains("secret")), "A's reasons do not mention the secret: {reasons:?}");

    // B drops A's handshakes before any DH (their mac1 is keyed by another PSK):
    // counted, never answered, no status row for an outsider.
    assert!(sim.node(B).status(sim.now).inbound_failures.is_empty());
    assert_eq!(sim.log.iter().filter(|s| s.from == B).count(), 0, "B answered an outsider");
    let b_drops = sim.slots[B].host.drop_reasons(sim.now);
    assert!(b_drops.iter().any(|(r, n)| *r == "handshake_mac" && *n >= 3), "{b_drops:?}");
    assert!(b_drops.iter().all(|(r, _)| *r == "handshake_mac"), "no data ever opened or was even attempted");
}

#[test]
fn known_peer_back_with_another_secret_is_refused_over_ik() {
    // The IK responder cannot check the PSK itself (psk2 is mixed in its own
    // response); it must not route the initiator before the initiator proves it.
    let mut sim = default_pair_established();
    sim.run(Duration::from_secs(3));
    sim.kill(B);
    sim.run(Duration::from_secs(1));
    let changed = Params { psk: harness::psk(NET, "rotated secret"), ..sim.slots[B].params.clone() };
    sim.restart_with(B, changed, vec![]);
    let mark = sim.log.len();
    while sim.elapsed() < Duration::from_secs(40) {
        sim.step();
        assert!(sim.routed(B).is_empty(), "B routed {:?} at {:?}", sim.routed(B), sim.elapsed());
        assert!(sim.route(B, A).is_none());
        assert_ne!(sim.state(B, A), Some(PeerState::Established));
    }
    assert!(sim.routed(A).is_empty(), "A still routes B");
    assert_ne!(sim.state(A, B), Some(PeerState::Established));
    let ik = sim.inits(A, mark).filter(|s| s.delivered && s.bytes[1] == 1).count();
    assert!(ik >= 1, "A never tried IK against the changed node");
    let reasons = sim.reasons(A);
    assert!(reasons.iter().any(|r| r.contains("secret")), "A does not say why: {reasons:?}");
    // B, with the new secret, drops A's handshakes silently and counts them.
    let b_drops = sim.slots[B].host.drop_reasons(sim.now);
    assert!(b_drops.iter().any(|(r, n)| *r == "handshake_mac" && *n >= 1), "{b_drops:?}");
}

/// A response whose hello does not parse (an older or newer node's format; here a
/// prefix length of 33) is refused as a malformed hello, not blamed on the secret.
#[test]
fn malformed_response_hello_is_named_not_blamed_on_the_secret() {
    let timers = Timers::default();
    let mut other = params(B, Cipher::Aes128Gcm, SECRET);
    other.hello.prefix = 33;
    let mut sim = Sim::new(vec![(params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers), (other, vec![], timers)]);
    while sim.elapsed() < Duration::from_secs(10) {
        sim.step();
        assert!(sim.routed(A).is_empty(), "A routed {:?} at {:?}", sim.routed(A), sim.elapsed());
        assert_ne!(sim.state(A, B), Some(PeerState::Established));
    }
    // B answered (its hello is inside an authenticated response), and A refused it.
    assert!(sim.log.iter().any(|s| s.from == B), "B never answered");
    let reasons = sim.reasons(A);
    assert!(
        reasons.iter().any(|r| r.contains("handshake response from") && r.contains("malformed hello")),
        "A does not name the malformed hello: {reasons:?}"
    );
    assert!(reasons.iter().all(|r| !r.contains("secret")), "A blames the secret: {reasons:?}");
}

// ----- 3 -----

#[test]
fn cipher_mismatch_never_routes_and_says_why() {
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers),
        (params(B, Cipher::ChaCha20Poly1305, SECRET), vec![], timers),
    ]);
    for _ in 0..50 {
        sim.step();
        assert!(sim.routed(A).is_empty() && sim.routed(B).is_empty(), "routed at {:?}", sim.elapsed());
        assert!(sim.route(A, B).is_none() && sim.route(B, A).is_none());
    }
    for (i, j) in [(A, B), (B, A)] {
        // The reason shows up in status: on the peer entry if the engine keeps one,
        // else on the dial (initiator) or the refused-handshake list (responder).
        let reasons = sim.reasons(i);
        assert!(reasons.iter().any(|r| r.contains("cipher mismatch")), "node {i} does not say why: {reasons:?}");
        if let Some(p) = sim.peer_status(i, j) {
            let err = p.error.unwrap_or_default();
            assert!(err.contains("cipher mismatch"), "node {i}: {err:?}");
            assert_ne!(p.state, PeerState::Established);
            assert_eq!(p.sessions, 0);
        }
    }
}

#[test]
fn a_node_too_new_for_us_is_refused_with_both_versions_and_an_older_one_is_taken() {
    use weft_core::handshake::Protocol;
    let timers = Timers::default();
    // A node of a future protocol that no longer talks to ours, as responder and as
    // initiator: whichever end reads the other's hello first refuses it (a reject
    // saying "version skew" tells the other), and its status names both versions.
    let newer = Protocol { version: Protocol::VERSION + 5, min: Protocol::VERSION + 1, caps: u32::MAX };
    let ours = format!("protocol {}", Protocol::VERSION);
    for (dialer, future_dials) in [(A, false), (B, true)] {
        let mut future = params(B, Cipher::Aes128Gcm, SECRET);
        future.hello.protocol = Some(newer);
        let (a_dials, b_dials) = if future_dials { (vec![], vec![A]) } else { (vec![B], vec![]) };
        let mut sim =
            Sim::new(vec![(params(A, Cipher::Aes128Gcm, SECRET), a_dials, timers), (future, b_dials, timers)]);
        sim.run(Duration::from_secs(5));
        assert!(sim.routed(A).is_empty() && sim.routed(B).is_empty(), "they must not route");
        let st = sim.node(dialer).status(sim.now);
        assert!(
            st.handshake_failures.contains_key(&weft_control::FailureKind::IncompatibleVersion),
            "dialer {dialer}: {:?}",
            st.handshake_failures
        );
        let (who, theirs) = if future_dials { ("too old", ours.clone()) } else { ("too new", newer.to_string()) };
        let reasons = sim.reasons(dialer);
        assert!(
            reasons.iter().any(|r| r.contains(who) && r.contains(&ours) && r.contains(&theirs)),
            "dialer {dialer} names both versions: {reasons:?}"
        );
    }

    // A node from before versioning (no protocol field) is this release's previous one:
    // taken, and status says which protocol each peer speaks.
    let mut unversioned = params(B, Cipher::Aes128Gcm, SECRET);
    unversioned.hello.protocol = None;
    let mut sim =
        Sim::new(vec![(params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers), (unversioned, vec![], timers)]);
    assert!(sim.run_until(Duration::from_secs(2), |s| s.established(A, B) && s.established(B, A)).is_some());
    assert_eq!(sim.peer_status(A, B).unwrap().protocol, None);
    assert_eq!(sim.peer_status(B, A).unwrap().protocol, Some(Protocol::VERSION));
}

// ----- 4 -----

#[test]
fn rekey_keeps_routes_and_old_session_drains() {
    let timers = Timers { rekey_after: Duration::from_secs(10), ..Timers::default() };
    let mut sim = Sim::pair(timers);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.established(A, B) && s.established(B, A)).is_some());
    let first_a = sim.route(A, B).expect("A routes B").local_index;
    let first_b = sim.route(B, A).expect("B routes A").local_index;

    let mut a_indices = vec![first_a];
    let mut b_indices = vec![first_b];
    let mut drained = 0;
    while sim.elapsed() < Duration::from_secs(35) {
        // A packet sealed on the current session just before the step that may rekey.
        let old = sim.route(A, B).expect("A routes B throughout");
        let late = seal(&old, &ip_packet(overlay(A), overlay(B), 10, 0));
        sim.step();
        assert!(sim.established(A, B) && sim.established(B, A), "dropped out at {:?}", sim.elapsed());
        let cur = sim.route(A, B).expect("A routes B");
        if cur.local_index != old.local_index {
            a_indices.push(cur.local_index);
            // The receiver still knows the old session right after the rekey...
            let known = sim.slots[B].host.routes.session_by_index(old.remote_index).cloned();
            let known = known.unwrap_or_else(|| panic!("B forgot the old session at {:?}", sim.elapsed()));
            assert_eq!(known.remote_index, old.local_index);
            // ...and the in-flight packet still opens there.
            assert_eq!(sim.inject_data(B, addr(A), &late), Ok(30), "old-session packet lost at {:?}", sim.elapsed());
            // So does one that was delayed (or sealed by a pipeline still holding the
            // previous snapshot) and arrives a second later.
            let delayed = seal(&old, &ip_packet(overlay(A), overlay(B), 10, 0));
            sim.run(Duration::from_secs(1));
            assert_eq!(
                sim.inject_data(B, addr(A), &delayed),
                Ok(30),
                "old session retired too early at {:?}",
                sim.elapsed()
            );
            drained += 1;
        }
        let b_cur = sim.route(B, A).expect("B routes A").local_index;
        if b_indices.last() != Some(&b_cur) {
            b_indices.push(b_cur);
        }
    }
    assert!(a_indices.len() >= 3, "expected at least 2 rekeys on A, saw sessions {a_indices:?}");
    assert!(b_indices.len() >= 3, "expected at least 2 rekeys on B, saw sessions {b_indices:?}");
    assert_eq!(drained, a_indices.len() - 1);
    assert!(sim.established(A, B) && sim.established(B, A));
    assert_eq!(sim.send_data(A, B), Ok(84));
    assert_eq!(sim.send_data(B, A), Ok(84));
    for (i, j) in [(A, B), (B, A)] {
        let p = sim.peer_status(i, j).expect("known");
        assert!(p.error.is_none(), "node {i}: {:?}", p.error);
        assert!(p.sessions <= 3);
    }
    // Rekeys after first contact are IK.
    assert!(sim.inits(A, 0).skip(1).all(|s| s.bytes[1] == 1));
    assert_eq!(sim.data_drops(), 0);
}

// ----- 5 -----

#[test]
fn dead_peer_detected_and_restarted_peer_reconnects() {
    let timers = Timers::default();
    let mut sim = default_pair_established();
    sim.run(Duration::from_secs(3));
    assert!(sim.established(A, B));
    let b_key = sim.slots[B].params.local.clone();

    sim.kill(B);
    let kill_at = sim.now;
    let t =
        sim.run_until(timers.dead_after + Duration::from_secs(1), |s| s.state(A, B) != Some(PeerState::Established));
    assert!(t.is_some(), "A still thinks B is up {:?} after it died", sim.now - kill_at);
    let st = sim.peer_status(A, B).expect("A keeps the configured peer");
    assert!(matches!(st.state, PeerState::Down | PeerState::Connecting), "{:?}", st.state);
    assert!(!sim.routed(A).contains(&overlay(B)));
    assert!(sim.route(A, B).is_none(), "snapshot still routes to the dead peer");
    assert!(st.error.is_some(), "no reason given");

    // Stay dead for 10 s in all; A keeps trying and never comes up.
    while sim.now - kill_at < Duration::from_secs(10) {
        sim.step();
        assert_ne!(sim.state(A, B), Some(PeerState::Established));
    }

    sim.restart(B, b_key, vec![]);
    let t = sim.run_until(Duration::from_secs(10), |s| s.established(A, B) && s.established(B, A));
    assert!(t.is_some(), "no reconnect within 10 s of the restart: {:?}", sim.peer_status(A, B));
    assert_eq!(sim.send_data(A, B), Ok(84));
    assert_eq!(sim.send_data(B, A), Ok(84));
    sim.run(Duration::from_secs(10));
    assert!(sim.established(A, B) && sim.established(B, A));
}

// ----- 6 -----

#[test]
fn dialer_restarted_with_new_key_replaces_stale_entry() {
    let mut sim = default_pair_established();
    sim.run(Duration::from_secs(3));
    let old_id = sim.id(A);

    // A restarts quickly (well inside dead_after) with a brand-new identity.
    sim.kill(A);
    sim.run(Duration::from_secs(1));
    sim.restart(A, StaticKey::generate().expect("key"), vec![B]);
    let new_id = sim.id(A);
    assert_ne!(old_id, new_id);

    let t = sim.run_until(Duration::from_secs(5), |s| s.established(B, A) && s.established(A, B));
    assert!(t.is_some(), "B did not accept the new A: {:?}", sim.node(B).status(sim.now).peers);
    let check = |sim: &Sim| {
        let peers = sim.node(B).status(sim.now).peers;
        let ids: Vec<NodeId> = peers.iter().map(|p| p.node_id).collect();
        assert_eq!(ids, vec![new_id], "stale entry {old_id} not replaced at {:?}", sim.elapsed());
        assert_eq!(sim.routed(B), vec![overlay(A)]);
    };
    check(&sim);
    // B's route for A's address leads to the new node.
    assert_eq!(sim.send_data(B, A), Ok(84));
    assert_eq!(sim.send_data(A, B), Ok(84));

    // Over the next minute nobody chases the old identity.
    for _ in 0..350 {
        sim.step();
        check(&sim);
    }
    assert!(sim.established(A, B) && sim.established(B, A));
    assert!(
        sim.node(A).status(sim.now).inbound_failures.is_empty(),
        "B kept handshaking with the old key: {:?}",
        sim.node(A).status(sim.now).inbound_failures
    );
    assert_eq!(sim.send_data(B, A), Ok(84));
}

// ----- 7 -----

#[test]
fn garbage_never_panics_nor_disturbs_a_session() {
    let mut sim = default_pair_established();
    sim.run(Duration::from_secs(1));
    let sa = sim.route(A, B).expect("route").local_index;
    let sb = sim.route(B, A).expect("route").local_index;

    // Real handshake messages of the first contact, plus an IK init from A to B.
    let mut samples: Vec<(usize, Vec<u8>)> = sim
        .log
        .iter()
        .filter(|s| {
            matches!(
                s.kind(),
                Some(MessageType::HandshakeInit | MessageType::HandshakeResponse | MessageType::HandshakeFinish)
            )
        })
        .map(|s| (s.from, s.bytes.clone()))
        .collect();
    assert!(samples.len() >= 3);
    let (_, ik) =
        Initiator::start(&sim.slots[A].params, Some(&sim.slots[B].params.local.public), Stamp::default()).expect("ik");
    let mut ik_dg = vec![1u8, 1, 0, 0, 9, 9, 9, 9, 0, 0, 0, 0];
    ik_dg.extend_from_slice(&ik);
    samples.push((A, ik_dg));

    let stranger: Endpoint = "198.51.100.7:4444".parse().expect("addr");
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut fed = 0;
    for round in 0..4 {
        // Every strict prefix of every real message, to the other node, from its peer
        // and from a stranger.
        for (from, msg) in &samples {
            let to = if *from == A { B } else { A };
            for len in 0..msg.len() {
                let src = if round % 2 == 0 { addr(*from) } else { stranger };
                sim.inject_raw(to, src, &msg[..len]);
                fed += 1;
            }
            // A bit-flipped full copy.
            let mut flipped = msg.clone();
            let k = rng.gen_range(12..flipped.len());
            flipped[k] ^= 1 << rng.gen_range(0..8);
            sim.inject_raw(to, addr(*from), &flipped);
            fed += 1;
        }
        // Random datagrams, most with a plausible header.
        for _ in 0..500 {
            let len = rng.gen_range(0..300);
            let mut junk = vec![0u8; len];
            rng.fill_bytes(&mut junk);
            if len >= 4 && rng.gen_bool(0.7) {
                junk[0] = rng.gen_range(0..=6);
                junk[1] = rng.gen_range(0..=2);
                junk[2] = 0;
                junk[3] = 0;
            }
            let to = if rng.gen_bool(0.5) { A } else { B };
            let src = match rng.gen_range(0..3) {
                0 => addr(1 - to),
                1 => stranger,
                _ => Endpoint::udp(SocketAddr::from(([203, 0, 113, rng.r#gen()], rng.r#gen()))),
            };
            sim.inject_raw(to, src, &junk);
            fed += 1;
        }
        // Forged rejects for random and for live indices.
        for idx in [rng.next_u32(), sa, sb] {
            let r = [5u8, 1, 0, 0, idx as u8, (idx >> 8) as u8, (idx >> 16) as u8, (idx >> 24) as u8];
            sim.inject_raw(A, addr(B), &r);
            sim.inject_raw(B, addr(A), &r);
            fed += 2;
        }
        // Junk data straight into the data plane, including live indices.
        for idx in [sa, sb, rng.next_u32()] {
            let mut d = vec![0u8; 16 + rng.gen_range(0..80)];
            rng.fill_bytes(&mut d);
            DataHeader { flags: 0, lane: 0, receiver_index: idx, counter: rng.next_u64() >> 8 }
                .emit((&mut d[..16]).try_into().expect("16 bytes"));
            assert!(sim.inject_data(A, addr(B), &d).is_err());
            assert!(sim.inject_data(B, addr(A), &d).is_err());
        }
        assert!(sim.established(A, B) && sim.established(B, A), "garbage broke the session in round {round}");
        assert_eq!(sim.route(A, B).expect("route").local_index, sa);
        assert_eq!(sim.route(B, A).expect("route").local_index, sb);
        sim.step();
    }
    assert!(fed > 2000);

    // The session carries on as before: same indices, data in both directions, and
    // the peers keep each other alive past dead_after.
    sim.run(Duration::from_secs(15));
    assert!(sim.established(A, B) && sim.established(B, A));
    assert_eq!(sim.route(A, B).expect("route").local_index, sa);
    assert_eq!(sim.route(B, A).expect("route").local_index, sb);
    assert_eq!(sim.send_data(A, B), Ok(84));
    assert_eq!(sim.send_data(B, A), Ok(84));
    for (i, j) in [(A, B), (B, A)] {
        assert_eq!(sim.routed(i), vec![overlay(j)], "garbage created peers on {i}");
    }
}

// ----- 8 -----

#[test]
fn rehandshake_after_partition_uses_ik() {
    let timers = Timers::default();
    let mut sim = default_pair_established();
    sim.run(Duration::from_secs(3));
    assert_eq!(sim.inits(A, 0).next().expect("first contact").bytes[1], 0, "first contact is XX");
    let before = sim.route(A, B).expect("route").local_index;

    sim.partition(A, B);
    let mark = sim.log.len();
    let t =
        sim.run_until(timers.dead_after + Duration::from_secs(1), |s| s.state(A, B) != Some(PeerState::Established));
    assert!(t.is_some(), "partition not noticed");
    let first = sim.inits(A, mark).next().expect("A retried during the partition");
    assert!(!first.delivered);
    assert_eq!(first.bytes[1], 1, "the re-handshake after first contact must be IK");

    sim.heal(A, B);
    let t = sim.run_until(Duration::from_secs(10), |s| s.established(A, B) && s.established(B, A));
    assert!(t.is_some(), "no re-establishment after healing: {:?}", sim.peer_status(A, B));
    assert_ne!(sim.route(A, B).expect("route").local_index, before, "a new session");
    let patterns: Vec<(usize, u8, bool, Duration)> = sim.log[mark..]
        .iter()
        .filter(|s| s.kind() == Some(MessageType::HandshakeInit))
        .map(|s| (s.from, s.bytes[1], s.delivered, s.at))
        .collect();
    assert!(patterns.iter().any(|&(_, _, d, _)| d), "no init got through: {patterns:?}");
    assert!(patterns.iter().all(|&(_, p, _, _)| p == 1), "XX used after first contact: {patterns:?}");
    assert!(
        !sim.log[mark..].iter().any(|s| s.kind() == Some(MessageType::HandshakeFinish)),
        "an XX finish was sent after first contact"
    );
    assert_eq!(sim.send_data(A, B), Ok(84));
    assert_eq!(sim.send_data(B, A), Ok(84));
}

// ----- three nodes -----

#[test]
fn three_nodes_mesh_and_one_dies() {
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::ChaCha20Poly1305, SECRET), vec![B, C], timers),
        (params(B, Cipher::ChaCha20Poly1305, SECRET), vec![C], timers),
        (params(C, Cipher::ChaCha20Poly1305, SECRET), vec![], timers),
    ]);
    let all = |s: &Sim| (0..3).all(|i| (0..3).all(|j| i == j || s.established(i, j)));
    assert!(sim.run_until(Duration::from_secs(1), all).is_some());
    for i in 0..3 {
        let mut want: Vec<Ipv4Addr> = (0..3).filter(|&j| j != i).map(overlay).collect();
        want.sort();
        assert_eq!(sim.routed(i), want);
    }
    sim.kill(C);
    let gone = |s: &Sim| s.state(A, C) != Some(PeerState::Established) && s.state(B, C) != Some(PeerState::Established);
    assert!(sim.run_until(timers.dead_after + Duration::from_secs(1), gone).is_some());
    sim.run(Duration::from_secs(20));
    assert!(sim.established(A, B) && sim.established(B, A), "A-B suffered from C's death");
    assert_eq!(sim.routed(A), vec![overlay(B)]);
    assert_eq!(sim.routed(B), vec![overlay(A)]);
    assert_eq!(sim.send_data(A, B), Ok(84));
}

// ----- relays -----

/// A and C both dial B but cannot reach each other.
fn a_and_c_through_b() -> Sim {
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers),
        (params(B, Cipher::Aes128Gcm, SECRET), vec![], timers),
        (params(C, Cipher::Aes128Gcm, SECRET), vec![B], timers),
    ]);
    sim.partition(A, C);
    sim
}

#[test]
fn the_answer_to_a_first_packet_reaches_the_new_session_through_a_stale_snapshot() {
    // C answers A's first packet at once: its TX pipeline may still hold the snapshot
    // from before the session (A idle there), and the engine must send the answer on
    // the session that is up by then rather than drop it.
    let mut sim = a_and_c_through_b();
    let routes = |s: &Sim| (0..3).all(|i| s.node(i).status(s.now).routes.len() == 2);
    assert!(sim.run_until(Duration::from_secs(5), routes).is_some());
    let stale = sim.slots[C].host.routes.clone();
    assert!(stale.demand_for(overlay(A).into()).is_some(), "A is idle for C");
    assert_eq!(sim.send_data(A, C), Ok(84));
    sim.slots[C].host.routes = stale;
    assert_eq!(sim.send_data(C, A), Ok(84), "the answer was lost");
    assert_eq!(sim.state(C, A), Some(PeerState::Established));
}

#[test]
fn a_member_that_dropped_a_session_renews_it_when_data_arrives_on_it() {
    // C sends A data through B, and everything A sends back is lost for a while: C
    // declares A dead and drops the session, while A, which sent no data, keeps it.
    // When A then sends on it, C does not drop A's data for A's own timer to notice
    // (6 s without an answer): it starts a new handshake, and A's next packet arrives.
    let mut sim = a_and_c_through_b();
    let routes = |s: &Sim| (0..3).all(|i| s.node(i).status(s.now).routes.len() == 2);
    assert!(sim.run_until(Duration::from_secs(5), routes).is_some());
    assert_eq!(sim.send_data(A, C), Ok(84));
    assert_eq!(sim.send_data(C, A), Ok(84));
    sim.lost_relayed = Some((A, C));
    assert_eq!(sim.send_data(C, A), Ok(84));
    let c_dropped = sim.run_until(Duration::from_secs(10), |s| s.state(C, A) != Some(PeerState::Established));
    assert!(c_dropped.is_some(), "C kept a session A never answered on: {:?}", sim.peer_status(C, A));
    assert!(sim.established(A, C), "A dropped the session too: {:?}", sim.peer_status(A, C));
    sim.lost_relayed = None;
    assert_eq!(sim.node(C).status(sim.now).stale_renewed, 0);

    // Data for the dropped session's index that its keys do not open (anyone may
    // send that: the index travels in clear) starts nothing: no handshake, no state.
    let old = sim.route(A, C).expect("A routes C");
    let b = sim.slots[B].host.addr;
    let relayed = |s: &Sim, bytes: &[u8]| {
        weft_core::wire::RelayHeader { hop_limit: 3, dst: s.id(C).to_bytes(), src: s.id(A).to_bytes() }.wrap(bytes)
    };
    let mut forged = seal(&old, &[0; 20]);
    let last = forged.len() - 1;
    forged[last] ^= 1;
    let mark = sim.log.len();
    assert_eq!(sim.inject_data(C, b, &relayed(&sim, &forged)), Err("unknown_session"));
    assert_eq!(sim.node(C).status(sim.now).stale_renewed, 0);
    let from_c = sim.log[mark..].iter().filter(|x| x.from == C && is_handshake_relayed(&x.bytes)).count();
    assert_eq!(from_c, 0, "a forgery made C start a handshake");

    // A's first packet finds the session dropped at C, and its keys prove it is A's:
    // C renews the session at once.
    assert_eq!(sim.send_data(A, C), Err("not delivered"));
    assert_eq!(sim.node(C).status(sim.now).stale_renewed, 1);
    assert!(
        sim.established(A, C) && sim.established(C, A),
        "{:?} / {:?}",
        sim.peer_status(A, C),
        sim.peer_status(C, A)
    );
    assert_eq!(sim.send_data(A, C), Ok(84));
    assert_eq!(sim.send_data(C, A), Ok(84));
    assert!(!sim.reasons(A).iter().any(|r| r.contains("not responding")), "{:?}", sim.reasons(A));

    // The old session is gone at C now: more data on it (a straggler) starts nothing.
    let straggler = relayed(&sim, &seal(&old, &[0; 20]));
    sim.run(Duration::from_secs(2));
    assert_eq!(sim.inject_data(C, b, &straggler), Err("unknown_session"));
    assert_eq!(sim.node(C).status(sim.now).stale_renewed, 1);
}

#[test]
fn chain_relays_on_demand_punches_a_direct_path_and_retires_when_idle() {
    // A and C both dial B but cannot reach each other: they learn each other from
    // the topology, as idle members (no session until traffic wants one).
    let mut sim = a_and_c_through_b();
    let routes_everywhere = |s: &Sim| {
        (0..3).all(|i| s.node(i).status(s.now).routes.len() == 2) && s.established(A, B) && s.established(C, B)
    };
    assert!(
        sim.run_until(Duration::from_secs(3), routes_everywhere).is_some(),
        "no routes: {:?}",
        sim.node(A).status(sim.now).routes
    );
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.state(A, C), Some(PeerState::Idle), "{:?}", sim.peer_status(A, C));
    assert_eq!(sim.state(C, A), Some(PeerState::Idle));
    let route = sim.node(A).status(sim.now).routes.into_iter().find(|r| r.node == sim.id(C)).expect("route to C");
    assert_eq!((route.next_hop, route.hops, route.session), (sim.id(B), 2, false));
    let (ida, idc) = (sim.id(A).to_bytes(), sim.id(C).to_bytes());
    let ac_inits = |s: &Sim, since: usize| {
        s.log[since..]
            .iter()
            .filter(|x| {
                let relayed_to = weft_core::wire::RelayHeader::parse(&x.bytes).ok().map(|h| h.dst);
                let between = (x.from == A && (x.to == addr(C) || relayed_to == Some(idc)))
                    || (x.from == C && (x.to == addr(A) || relayed_to == Some(ida)));
                between && is_handshake_relayed(&x.bytes)
            })
            .count()
    };
    assert_eq!(ac_inits(&sim, 0), 0, "A and C made a session nobody needed");

    // The first packet A -> C starts the session through B and arrives.
    let b_tun = sim.slots[B].host.tun.len();
    let b_fwd = sim.slots[B].host.fwd_datagrams;
    assert_eq!(sim.send_data(A, C), Ok(84));
    assert!(sim.established(A, C) && sim.established(C, A));
    assert_eq!(sim.peer_status(A, C).expect("A knows C").path, PathStatus::Relay { via: sim.id(B), hops: 2 });
    assert_eq!(sim.peer_status(C, A).expect("C knows A").path, PathStatus::Relay { via: sim.id(B), hops: 2 });
    assert_eq!(sim.send_data(C, A), Ok(84));
    assert_eq!(sim.slots[B].host.tun.len(), b_tun, "the relay wrote relayed packets to its own TUN");
    assert!(sim.slots[B].host.fwd_datagrams >= b_fwd + 2);
    // The session is end to end: B holds no session that opens A's packets to C.
    let a_to_c = sim.route(A, C).expect("A routes C");
    assert!(sim.slots[B].host.routes.session_by_index(a_to_c.remote_index).is_none_or(|s| s.peer_addr != overlay(A)));

    // While traffic flows the session lasts, and is probed through the relay.
    for _ in 0..20 {
        assert_eq!(sim.send_data(A, C), Ok(84));
        sim.run(Duration::from_secs(1));
    }
    assert!(sim.established(A, C) && sim.established(C, A), "relayed session did not last");
    assert!(sim.peer_status(A, C).expect("known").rtt.is_some(), "no latency probe answered through the relay");

    // Once A and C can reach each other, hole punching moves them to a direct path
    // (a shortcut for their traffic, not a link of the mesh: the route stays via B).
    let mark = sim.log.len();
    sim.heal(A, C);
    let direct = |s: &Sim| {
        s.peer_status(A, C).is_some_and(|p| p.path == PathStatus::Direct)
            && s.peer_status(C, A).is_some_and(|p| p.path == PathStatus::Direct)
    };
    let mut t = None;
    for k in 0..40 {
        if direct(&sim) {
            t = Some(k);
            break;
        }
        assert_eq!(sim.send_data(A, C), Ok(84));
        sim.run(Duration::from_secs(1));
    }
    assert!(t.is_some(), "no direct path after healing: {:?}", sim.peer_status(A, C));
    assert!(!sim.peer_status(A, C).expect("known").link, "a punched path became a link");
    let b_fwd = sim.slots[B].host.fwd_datagrams;
    assert_eq!(sim.send_data(A, C), Ok(84));
    assert_eq!(sim.slots[B].host.fwd_datagrams, b_fwd, "still relayed through B");
    assert!(
        !sim.log[mark..]
            .iter()
            .any(|s| s.kind() == Some(MessageType::HandshakeInit) && (s.from == A || s.from == C) && s.to != addr(B)),
        "the direct path needed a new handshake instead of the punch"
    );

    // Without traffic the session is retired, with nothing sent in between (once the
    // last data is older than the 10 s activity window, sampled every 2 s).
    sim.run(Duration::from_secs(15));
    let quiet_from = sim.log.len();
    sim.run(IDLE_RETIRE);
    let between = sim.log[quiet_from..]
        .iter()
        .filter(|x| (x.from == A && x.to == addr(C)) || (x.from == C && x.to == addr(A)))
        .count();
    let what: Vec<_> = sim.log[quiet_from..]
        .iter()
        .filter(|x| (x.from == A && x.to == addr(C)) || (x.from == C && x.to == addr(A)))
        .map(|x| (x.at, x.from, x.kind(), x.bytes.len()))
        .collect();
    assert_eq!(between, 0, "an idle session kept talking: {what:?}");
    assert_eq!(sim.state(A, C), Some(PeerState::Idle), "{:?}", sim.peer_status(A, C));
    assert_eq!(sim.state(C, A), Some(PeerState::Idle));
    assert_eq!(sim.peer_status(A, C).expect("known").path, PathStatus::Relay { via: sim.id(B), hops: 2 });
    // And traffic makes a new one.
    assert_eq!(sim.send_data(C, A), Ok(84));
    assert!(sim.established(A, C) && sim.established(C, A));
}

/// A handshake datagram, bare or in a relay frame.
fn is_handshake_relayed(bytes: &[u8]) -> bool {
    let inner = if MessageType::of(bytes) == Some(MessageType::Relay) {
        bytes.get(weft_core::wire::RELAY_HEADER_LEN..).unwrap_or_default()
    } else {
        bytes
    };
    matches!(MessageType::of(inner), Some(MessageType::HandshakeInit | MessageType::HandshakeResponse))
}

#[test]
fn restarted_node_never_lists_its_former_identity() {
    let mut sim = default_pair_established();
    sim.run(Duration::from_secs(3));
    let old_id = sim.id(A);
    sim.kill(A);
    sim.run(Duration::from_secs(1));
    sim.restart(A, StaticKey::generate().expect("key"), vec![B]);
    assert!(sim.run_until(Duration::from_secs(5), |s| s.established(A, B) && s.established(B, A)).is_some());
    for _ in 0..100 {
        sim.step();
        let peers = sim.node(A).status(sim.now).peers;
        let ghost = peers.iter().find(|p| p.node_id == old_id || p.overlay == overlay(A));
        assert!(ghost.is_none(), "A lists its former identity at {:?}: {ghost:?}", sim.elapsed());
    }
}

// ----- runtime peers (the control API's add-peer / remove-peer) -----

impl Sim {
    fn admin<R>(&mut self, i: usize, f: impl FnOnce(&mut Node, Instant) -> R) -> R {
        let now = self.now;
        let mut out = Vec::new();
        let r = self.slots[i].host.admin(|n| f(n, now), &mut out);
        self.pump(out.into());
        r
    }
}

#[test]
fn peers_added_and_removed_at_run_time() {
    let t = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![], t),
        (params(B, Cipher::Aes128Gcm, SECRET), vec![], t),
    ]);
    sim.run(Duration::from_secs(2));
    assert!(!sim.established(A, B), "nobody dials yet");

    // Added: dialled at once and kept up.
    sim.admin(A, |n, now| n.add_peer(now, addr(B))).expect("added");
    let up = sim.run_until(Duration::from_secs(1), |s| s.established(A, B) && s.established(B, A));
    assert!(up.is_some(), "added peer did not come up: {:?}", sim.peer_status(A, B));
    let again = sim.admin(A, |n, now| n.add_peer(now, addr(B)));
    assert!(again.is_err_and(|e| e.contains("already a configured peer")));

    // Removed by endpoint: sessions closed at once, never dialled by A again. (B
    // learned A from A's handshake and retries it for a while, as it would any peer
    // that went silent; A answers, which is how a mesh member stays reachable.)
    let mark = sim.log.len();
    let what = sim.admin(A, |n, now| n.remove_peer(now, PeerRef::Endpoint(addr(B)))).expect("removed");
    assert!(what.contains(&sim.id(B).to_string()), "{what}");
    assert!(sim.routed(A).is_empty(), "removed peer still routed");
    sim.run(Duration::from_secs(90));
    assert_eq!(sim.inits(A, mark).count(), 0, "A dialled the removed peer again");
    let unknown = sim.admin(A, |n, now| n.remove_peer(now, PeerRef::Endpoint(addr(B))));
    assert!(unknown.is_err_and(|e| e.contains("not a configured peer")));

    // Added again, then removed by node id.
    sim.admin(A, |n, now| n.add_peer(now, addr(B))).expect("added again");
    let up = sim.run_until(Duration::from_secs(2), |s| s.established(A, B));
    assert!(up.is_some(), "re-added peer did not come up: {:?}", sim.peer_status(A, B));
    let id = sim.id(B);
    let mark = sim.log.len();
    sim.admin(A, |n, now| n.remove_peer(now, PeerRef::Node(id))).expect("removed by id");
    assert!(sim.routed(A).is_empty());
    sim.run(Duration::from_secs(10));
    assert_eq!(sim.inits(A, mark).count(), 0, "A dialled the removed peer again");
    assert!(sim.node(A).status(sim.now).dials.is_empty(), "the dial went with the peer");
    let missing = NodeId::from_bytes([9; 8]);
    assert!(sim.admin(A, |n, now| n.remove_peer(now, PeerRef::Node(missing))).is_err());
}

// ----- transports -----

impl Sim {
    /// The transport of `i`'s direct path to `j`, if it has one.
    fn path_proto(&self, i: usize, j: usize) -> Option<Proto> {
        let p = self.peer_status(i, j)?;
        (p.path == PathStatus::Direct && p.state == PeerState::Established).then_some(p.endpoint?.proto)
    }
}

/// Two nodes that also listen on TCP. UDP dropped between them: the pair moves its
/// session to TCP before the peer would be declared dead (no new handshake, data keeps
/// flowing); UDP allowed again: it returns to UDP, the better transport.
#[test]
fn blocked_udp_moves_the_session_to_tcp_and_back() {
    let mut sim = Sim::pair(Timers::default());
    sim.extra = vec![Proto::Tcp];
    // Restart both with the extra listener announced.
    let (ka, kb) = (sim.slots[A].params.local.clone(), sim.slots[B].params.local.clone());
    sim.restart(A, ka, vec![B]);
    sim.restart(B, kb, vec![]);
    let up = sim.run_until(Duration::from_secs(5), |s| {
        s.path_proto(A, B) == Some(Proto::Udp) && s.path_proto(B, A) == Some(Proto::Udp)
    });
    assert!(up.is_some(), "not up on udp: {:?}", sim.peer_status(A, B));
    // Records (with the tcp endpoints) reach both sides.
    sim.run(Duration::from_secs(3));

    let mark = sim.log.len();
    sim.blocked.insert((A, B, Proto::Udp));
    let moved = sim.run_until(Duration::from_secs(20), |s| {
        s.path_proto(A, B) == Some(Proto::Tcp) && s.path_proto(B, A) == Some(Proto::Tcp)
    });
    let moved = moved.unwrap_or_else(|| panic!("stuck: {:?} / {:?}", sim.peer_status(A, B), sim.peer_status(B, A)));
    assert!(moved < Timers::default().dead_after, "moved after {moved:?}, later than a dead peer");
    assert_eq!(sim.inits(A, mark).count() + sim.inits(B, mark).count(), 0, "the session itself moved");
    assert_eq!(sim.send_data(A, B), Ok(84));
    assert_eq!(sim.send_data(B, A), Ok(84));

    sim.blocked.clear();
    let back = sim.run_until(Duration::from_secs(30), |s| {
        s.path_proto(A, B) == Some(Proto::Udp) && s.path_proto(B, A) == Some(Proto::Udp)
    });
    assert!(back.is_some(), "never went back to udp: {:?}", sim.peer_status(A, B));
    assert_eq!(sim.send_data(A, B), Ok(84));
    // And it stays there.
    sim.run(Duration::from_secs(30));
    assert_eq!(sim.path_proto(A, B), Some(Proto::Udp));
    assert_eq!(sim.path_proto(B, A), Some(Proto::Udp));
}

fn is_handshake(bytes: &[u8]) -> bool {
    let inner = if MessageType::of(bytes) == Some(MessageType::Relay) { &bytes[20.min(bytes.len())..] } else { bytes };
    matches!(
        MessageType::of(inner),
        Some(MessageType::HandshakeInit | MessageType::HandshakeResponse | MessageType::HandshakeFinish)
    )
}

#[test]
fn keys_are_never_used_past_reject_after_time_when_rekeys_fail() {
    let mut sim = default_pair_established();
    sim.no_handshakes = true;
    let old = sim.route(A, B).unwrap();
    let sealed_late = {
        sim.run(Duration::from_secs(170));
        assert!(sim.send_data(A, B).is_ok(), "the session still works at 170 s");
        assert!(Arc::ptr_eq(&sim.route(A, B).unwrap(), &old), "no rekey got through");
        seal(&old, &ip_packet(overlay(A), overlay(B), 8, 1))
    };
    sim.run(Duration::from_secs(11));
    assert!(sim.route(A, B).is_none_or(|s| !Arc::ptr_eq(&s, &old)), "A still sends on 180-second-old keys");
    assert!(sim.send_data(A, B).is_err());
    assert!(sim.inject_data(B, addr(A), &sealed_late).is_err(), "B accepted a packet on 180-second-old keys");
    // Handshakes allowed again: a fresh session comes up.
    sim.no_handshakes = false;
    assert!(sim.run_until(Duration::from_secs(20), |s| s.established(A, B) && s.established(B, A)).is_some());
    assert!(sim.send_data(A, B).is_ok());
}

// ----- admission -----

/// A handshake init of node `i`'s key as it would send it (a captured init to replay).
fn captured_init(i: usize) -> Vec<u8> {
    let p = params(i, Cipher::Aes128Gcm, SECRET);
    let (init, msg) = Initiator::start(&p, None, Stamp::default()).expect("init");
    let mut b = Vec::new();
    weft_core::wire::HandshakeHeader {
        kind: MessageType::HandshakeInit,
        pattern: init.pattern(),
        sender_index: 99,
        receiver_index: 0,
    }
    .emit(&mut b);
    b.extend_from_slice(&msg);
    weft_core::admission::MacKeys::new(&p.psk).seal(&mut b, None);
    b
}

#[test]
fn a_member_joins_through_a_replayed_init_flood_with_a_cookie() {
    // B is flooded with a captured init replayed from many spoofed sources (500 a
    // second): it answers with cookies instead of DH. A real member that dials B
    // meanwhile gets a cookie, resends with mac2 and joins.
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![], Timers::default()),
        (params(B, Cipher::Aes128Gcm, SECRET), vec![], Timers::default()),
    ]);
    let replay = captured_init(C);
    let mut n = 0u32;
    let mut flood = |sim: &mut Sim| {
        for _ in 0..100 {
            n += 1;
            let [a, b] = (n as u16).to_be_bytes();
            sim.inject_raw(B, Endpoint::udp(SocketAddr::from(([203, 0, a, b], 40000))), &replay);
        }
    };
    for _ in 0..5 {
        flood(&mut sim);
        sim.step();
    }
    assert!(sim.node(B).admission(sim.now).under_load);
    sim.restart_with(A, params(A, Cipher::Aes128Gcm, SECRET), vec![B]);
    let mut joined = false;
    for _ in 0..25 {
        flood(&mut sim);
        sim.step();
        if sim.established(A, B) && sim.established(B, A) {
            joined = true;
            break;
        }
    }
    assert!(joined, "A did not join during the flood: {:?}", sim.reasons(A));
    let (a, b) = (sim.node(A).admission(sim.now), sim.node(B).admission(sim.now));
    assert!(b.cookies_sent > 0 && a.cookies_received >= 1, "A {a:?} B {b:?}");
    assert!(sim.send_data(A, B).is_ok() && sim.send_data(B, A).is_ok());
}

// ----- members: a compromised member cannot take what is not theirs -----

/// A, B, C all connected; B is the compromised member.
fn three_members() -> Sim {
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B, C], timers),
        (params(B, Cipher::Aes128Gcm, SECRET), vec![C], timers),
        (params(C, Cipher::Aes128Gcm, SECRET), vec![], timers),
    ]);
    let all = |s: &Sim| (0..3).all(|i| (0..3).all(|j| i == j || (s.established(i, j) && s.record(i, j).is_some())));
    assert!(sim.run_until(Duration::from_secs(2), all).is_some(), "mesh did not come up");
    sim
}

#[test]
fn forged_records_are_dropped_counted_and_never_forwarded() {
    let mut sim = three_members();
    let genuine = sim.record(B, A).expect("B holds A's record");
    assert_eq!(sim.node(C).status(sim.now).rejected_records, 0);
    let mut forgeries = Vec::new();
    // A's record, newer, claiming endpoints and a subnet that are B's to capture.
    let mut f = genuine.clone();
    f.seq += 1;
    f.endpoints = vec![Endpoint::udp(SocketAddr::from(([203, 0, 113, 66], 11010)))];
    f.proxied = vec![(Ipv4Addr::new(192, 168, 50, 0).into(), 24)];
    forgeries.push(f.clone());
    // The same, signed by B's own key but carrying A's X25519 key (and so A's id).
    let b_key = sim.slots[B].params.local.clone();
    f.signer = b_key.signing_public;
    f.sig = b_key.sign(&f.signed_message(NET));
    forgeries.push(f);
    // The highest sequence number a record may carry: if it stuck, A could never
    // publish a newer one.
    let mut f = genuine.clone();
    f.seq = MAX_SEQ;
    forgeries.push(f);
    for f in &forgeries {
        sim.send_record(B, C, f);
        // To A about itself: it must not jump its own numbering for a forgery.
        sim.send_record(B, A, f);
    }
    let seen = sim.record(C, A).expect("C still holds A's record");
    assert_eq!(seen, genuine, "C took a forged record of A");
    assert_eq!(sim.node(C).status(sim.now).rejected_records, forgeries.len() as u64);
    assert!(sim.node(C).status(sim.now).routes.iter().all(|r| r.proxied.is_empty()));
    // u64::MAX does not even parse (above MAX_SEQ): dropped before any state.
    let mut f = genuine.clone();
    f.seq = u64::MAX;
    sim.send_record(B, C, &f);
    sim.send_record(B, A, &f);
    assert_eq!(sim.record(C, A), Some(genuine.clone()));
    // A keeps publishing and C keeps taking A's genuine records.
    sim.slots[A].host.admin(
        |n| n.set_endpoints(vec![addr(A), Endpoint::udp(SocketAddr::from(([192, 0, 2, 1], 11011)))]),
        &mut Vec::new(),
    );
    sim.run(Duration::from_secs(1));
    let newer = sim.record(C, A).expect("C holds A's record");
    assert!(newer.seq > genuine.seq && newer.seq < MAX_SEQ, "A's numbering was pinned: {}", newer.seq);
    assert_eq!(newer.endpoints.len(), 2);
    assert!(newer.verify(NET));
    // Nothing forged went anywhere: no node's view of A carries B's claims.
    for i in [B, C] {
        let r = sim.record(i, A).expect("record");
        assert!(r.proxied.is_empty() && !r.endpoints.iter().any(|e| e.addr.ip() == Ipv4Addr::new(203, 0, 113, 66)));
    }
    assert_eq!(sim.send_data(C, A), Ok(84));
    assert_eq!(sim.send_data(A, C), Ok(84));
}

#[test]
fn a_second_member_claiming_an_address_is_refused_everywhere_and_says_why() {
    // C claims A's overlay address; with one key it sorts below A's, with the other
    // above: no "lower key wins", the first holder keeps it.
    let timers = Timers::default();
    let a_id = NodeId::from_public(&params(A, Cipher::Aes128Gcm, SECRET).local.public);
    let mut orders = HashSet::new();
    for seed in 0..8u64 {
        let key = static_key(&mut ChaCha8Rng::seed_from_u64(0xc1a1_0000 + seed));
        let below = NodeId::from_public(&key.public) < a_id;
        if !orders.insert(below) {
            continue;
        }
        let mut sim = Sim::new(vec![
            (params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers),
            (params(B, Cipher::Aes128Gcm, SECRET), vec![], timers),
        ]);
        assert!(sim.run_until(Duration::from_secs(1), |s| s.established(A, B) && s.established(B, A)).is_some());
        sim.run(Duration::from_secs(1));
        // The claimer joins: it dials both, and B dials it too (both roles refuse).
        let claimer = harness::params(key, NET, SECRET, Cipher::Aes128Gcm, overlay(A), "claimer".into());
        sim.slots.push(Slot {
            params: claimer,
            dial: vec![A, B],
            timers,
            seed: 0xc1a1,
            host: Host::new(addr(C), sim.epoch),
        });
        sim.boot(C);
        sim.slots[B].host.admin(|n| n.add_peer(sim.now, addr(C)), &mut Vec::new()).expect("add peer");
        sim.run(Duration::from_secs(10));
        let c_id = sim.id(C);
        for i in [A, B] {
            assert!(sim.peer_status(i, C).is_none(), "node {i} lists the claimer (below: {below})");
            assert_eq!(sim.routed(i), vec![overlay(1 - i)], "node {i} routes (below: {below})");
            let why = sim.reasons(i);
            assert!(
                why.iter().any(|r| r.contains("address conflict") && r.contains(&c_id.to_string())),
                "node {i}: {why:?}"
            );
        }
        let at_b = sim.reasons(B).join("\n");
        assert!(at_b.contains(&format!("belongs to member {a_id}")), "{at_b}");
        let at_c = sim.reasons(C).join("\n");
        assert!(at_c.contains("already belongs to another member"), "claimer not told why: {at_c}");
        assert!(sim.routed(C).is_empty(), "the claimer got a route: {:?}", sim.routed(C));
        // The owner keeps its traffic.
        assert_eq!(sim.send_data(B, A), Ok(84));
        assert_eq!(sim.send_data(A, B), Ok(84));
        assert!(sim.established(A, B) && sim.established(B, A));
    }
    assert_eq!(orders.len(), 2, "keys on both sides of A's");
}

#[test]
fn addresses_outside_the_overlay_are_nobodys_in_hellos_and_records() {
    let timers = Timers::default();
    // B is lax (an overlay prefix of /0 takes any address) and proxies a subnet; C
    // claims an address inside that subnet, D a "public server's" address. Both dial
    // B, which floods their records to A.
    let mut b = params(B, Cipher::Aes128Gcm, SECRET);
    b.hello.prefix = 0;
    let mut c = params(C, Cipher::Aes128Gcm, SECRET);
    c.hello.ipv4 = Ipv4Addr::new(172, 16, 5, 7);
    let d_key = static_key(&mut ChaCha8Rng::seed_from_u64(0x6b65_7903));
    let mut d = harness::params(d_key, NET, SECRET, Cipher::Aes128Gcm, Ipv4Addr::new(198, 51, 100, 99), "d".into());
    // The claimants are lax too (a node refuses peers outside its own overlay).
    c.hello.prefix = 0;
    d.hello.prefix = 0;
    let subnet = (std::net::IpAddr::from([172, 16, 5, 0]), 24);
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers),
        (b, vec![], timers),
        (c, vec![B], timers),
        (d, vec![B, A], timers),
    ]);
    sim.tweaks.push((B, Box::new(move |cfg: &mut Config| cfg.proxied = vec![subnet])));
    for i in [3, C, B, A] {
        let (p, d) = (sim.slots[i].params.clone(), sim.slots[i].dial.clone());
        sim.restart_with(i, p, d);
    }
    sim.run(Duration::from_secs(5));
    let up = |i, j| sim.state(i, j) == Some(PeerState::Established);
    assert!(up(B, C) && up(B, 3), "the lax node took both");
    assert!(sim.record(A, C).is_some() && sim.record(A, 3).is_some(), "A holds both records");
    // A: no peer, no route, a reason for each; B's subnet still routed.
    assert!(sim.peer_status(A, C).is_none() && sim.peer_status(A, 3).is_none());
    assert_eq!(sim.routed(A), vec![overlay(B)]);
    let refused = sim.node(A).status(sim.now).refused.join("\n");
    for claim in ["172.16.5.7", "198.51.100.99"] {
        assert!(
            refused.contains(&format!(
                "claims overlay address {claim}: refused, {claim} lies outside this node's overlay network 10.77.0.0/16"
            )),
            "{refused}"
        );
    }
    assert!(!refused.contains("172.16.5.0/24"), "A refused B's subnet for an address outside the overlay: {refused}");
    assert_eq!(sim.slots[A].host.installed, vec![subnet]);
    let snap = sim.slots[A].host.routes.clone();
    assert_eq!(snap.route_for(Ipv4Addr::new(172, 16, 5, 7).into()).map(|r| r.session.peer_addr), Some(overlay(B)));
    assert!(snap.route_for(Ipv4Addr::new(198, 51, 100, 99).into()).is_none());
    // D dialled A itself too: refused in the handshake, with the reason.
    let why = sim.reasons(A).join("\n");
    assert!(why.contains("claims overlay address 198.51.100.99: refused"), "{why}");
}

#[test]
fn proxied_subnets_that_capture_others_traffic_are_refused_with_a_reason() {
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B, C], timers),
        (params(B, Cipher::Aes128Gcm, SECRET), vec![C], timers),
        (params(C, Cipher::Aes128Gcm, SECRET), vec![], timers),
    ]);
    let net = |a: [u8; 4], p: u8| (std::net::IpAddr::from(a), p);
    let fine = net([172, 16, 5, 0], 24);
    let wide = net([4, 0, 0, 0], 6);
    let lan = net([192, 168, 7, 0], 24);
    // A (compromised or misconfigured) proxies half the internet, the overlay range,
    // B's overlay address, B's LAN, a wide but harmless-looking range, and one
    // ordinary subnet.
    let announced = vec![net([0, 0, 0, 0], 1), net([10, 77, 0, 0], 16), net([10, 77, 0, 2], 32), lan, wide, fine];
    let a_proxies = announced.clone();
    sim.tweaks.push((A, Box::new(move |c: &mut Config| c.proxied = a_proxies.clone())));
    // B sits on 192.168.7.0/24; C opted in to wide subnets.
    sim.tweaks
        .push((B, Box::new(|c: &mut Config| c.local_networks = vec![(Ipv4Addr::new(192, 168, 7, 1).into(), 24)])));
    sim.tweaks.push((C, Box::new(|c: &mut Config| c.accept_wide_subnets = true)));
    for i in [C, B, A] {
        let p = sim.slots[i].params.clone();
        let d = sim.slots[i].dial.clone();
        sim.restart_with(i, p, d);
    }
    let all = |s: &Sim| (0..3).all(|i| (0..3).all(|j| i == j || (s.established(i, j) && s.record(i, j).is_some())));
    assert!(sim.run_until(Duration::from_secs(3), all).is_some(), "mesh did not come up");
    sim.run(Duration::from_secs(1));
    assert_eq!(sim.record(B, A).expect("A's record").proxied, announced);
    assert_eq!(sim.slots[B].host.installed, vec![fine], "B installs only the ordinary subnet");
    // C opted in to the wide one, and is not on B's LAN.
    assert_eq!(sim.slots[C].host.installed, vec![wide, fine, lan]);
    // The data plane routes the same, and takes sources only from accepted subnets.
    let snap = sim.slots[B].host.routes.clone();
    assert!(snap.route_for(Ipv4Addr::new(172, 16, 5, 9).into()).is_some());
    for dst in [[8, 8, 8, 8], [192, 168, 7, 20], [4, 1, 2, 3], [10, 77, 9, 9]] {
        assert!(snap.route_for(Ipv4Addr::from(dst).into()).is_none(), "B routes {dst:?} to A");
    }
    assert_eq!(snap.route_for(overlay(C).into()).map(|r| r.session.peer_addr), Some(overlay(C)));
    let a_session = sim.route(A, B).expect("A's session with B");
    let lan_src = ip_packet(Ipv4Addr::new(192, 168, 7, 20), overlay(B), 16, 1);
    assert_eq!(sim.inject_data(B, addr(A), &seal(&a_session, &lan_src)), Err("spoofed_source"));
    let ok_src = ip_packet(Ipv4Addr::new(172, 16, 5, 20), overlay(B), 16, 2);
    assert!(sim.inject_data(B, addr(A), &seal(&a_session, &ok_src)).is_ok());
    // Status says what was refused and why.
    let refused = sim.node(B).status(sim.now).refused.join("\n");
    for (what, why) in [
        ("0.0.0.0/1", "shorter than /8"),
        ("10.77.0.0/16", "overlay network"),
        ("10.77.0.2/32", "overlay"),
        ("192.168.7.0/24", "directly connected"),
        ("4.0.0.0/6", "--accept-wide-subnets"),
    ] {
        assert!(refused.lines().any(|l| l.contains(what) && l.contains(why)), "B: no {what} ({why}) in {refused}");
    }
    assert!(!refused.contains("172.16.5.0/24"), "{refused}");
    let refused_c = sim.node(C).status(sim.now).refused.join("\n");
    assert!(!refused_c.contains("4.0.0.0/6") && refused_c.contains("0.0.0.0/1"), "{refused_c}");
}

#[test]
fn an_address_routed_into_the_tunnel_is_never_a_direct_path() {
    // A proxies a subnet that holds one of its own addresses (a WireGuard portal's
    // network, or a LAN it serves) and announces it as an endpoint, as a wildcard
    // listener does; A and C reach each other only through B. C routes that subnet
    // into the tunnel: sending there would carry the overlay through itself, and a
    // packet from there (or from an overlay address) came through the overlay.
    let mut sim = a_and_c_through_b();
    let inside = Endpoint::udp(SocketAddr::from(([172, 16, 5, 1], 11010)));
    sim.tweaks.push((
        A,
        Box::new(move |c: &mut Config| {
            c.proxied = vec![(Ipv4Addr::new(172, 16, 5, 0).into(), 24)];
            c.endpoints.push(inside);
        }),
    ));
    for i in [C, B, A] {
        let p = sim.slots[i].params.clone();
        let d = sim.slots[i].dial.clone();
        sim.restart_with(i, p, d);
    }
    let routes = |s: &Sim| (0..3).all(|i| s.node(i).status(s.now).routes.len() == 2);
    assert!(
        sim.run_until(Duration::from_secs(5), routes).is_some(),
        "no routes: {:?}",
        (0..3).map(|i| sim.node(i).status(sim.now).routes).collect::<Vec<_>>()
    );
    assert_eq!(sim.send_data(A, C), Ok(84));
    assert_eq!(sim.send_data(C, A), Ok(84));
    assert!(sim.slots[C].host.installed.contains(&(Ipv4Addr::new(172, 16, 5, 0).into(), 24)));
    let relayed = PathStatus::Relay { via: sim.id(B), hops: 2 };
    assert_eq!(sim.peer_status(C, A).map(|p| p.path), Some(relayed));
    let a_session = sim.route(A, C).expect("A's session with C");
    for (n, from) in [inside, Endpoint::udp(SocketAddr::from(([10, 77, 0, 1], 11010)))].into_iter().enumerate() {
        // The data itself is genuine and delivered; only the path is not taken.
        let pkt = ip_packet(overlay(A), overlay(C), 16, 100 + n as u64);
        assert!(sim.inject_data(C, from, &seal(&a_session, &pkt)).is_ok());
        sim.run(Duration::from_millis(200));
        assert_eq!(sim.peer_status(C, A).map(|p| p.path), Some(relayed), "C took {from} as a direct path");
    }
    // Nor does C ever send there while traffic flows (no punch or probe inside).
    let mark = sim.log.len();
    for _ in 0..10 {
        assert_eq!(sim.send_data(C, A), Ok(84));
        sim.run(Duration::from_secs(1));
    }
    assert!(!sim.log[mark..].iter().any(|x| x.from == C && x.to == inside), "C sent to an address inside the tunnel");
}

#[test]
fn a_peer_that_moves_its_udp_port_is_followed_at_once_and_another_host_is_not() {
    // A peer's NAT rebinding, or its node moving its UDP sockets on a reload: the
    // same host from another port, authenticated, while the old path is still fresh.
    let mut sim = default_pair_established();
    let a_session = sim.route(A, B).expect("A's session with B");
    let old = addr(A);
    let moved = Endpoint::udp(SocketAddr::new(old.addr.ip(), old.addr.port() + 20));
    let elsewhere = Endpoint::udp(SocketAddr::from(([198, 51, 100, 9], old.addr.port())));
    let endpoint = |s: &Sim| s.peer_status(B, A).and_then(|p| p.endpoint);
    for (n, (from, expect)) in [(elsewhere, old), (moved, moved)].into_iter().enumerate() {
        let pkt = ip_packet(overlay(A), overlay(B), 16, 300 + n as u64);
        assert!(sim.inject_data(B, from, &seal(&a_session, &pkt)).is_ok());
        sim.run(Duration::from_millis(50));
        assert_eq!(endpoint(&sim), Some(expect), "after a packet from {from}");
    }
}

#[test]
fn punch_requests_only_reach_the_requesters_own_addresses_and_are_rate_limited() {
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B], timers),
        (params(B, Cipher::Aes128Gcm, SECRET), vec![], timers),
    ]);
    // B announces a UDP endpoint at another address (nobody listens there in this
    // test), and one at its own address, another port (what its router would map to
    // it).
    let spare = Endpoint::udp(SocketAddr::from(([198, 51, 100, 2], 11099)));
    let mapped = Endpoint::udp(SocketAddr::new(addr(B).addr.ip(), 40000));
    sim.tweaks.push((B, Box::new(move |c: &mut Config| c.endpoints.extend([spare, mapped]))));
    let p = sim.slots[B].params.clone();
    sim.restart_with(B, p, vec![]);
    let ok = |s: &Sim| {
        s.established(A, B) && s.established(B, A) && s.record(A, B).is_some_and(|r| r.endpoints.contains(&spare))
    };
    // (A notices B's restart by the dead-peer timer.)
    assert!(sim.run_until(Duration::from_secs(15), ok).is_some(), "pair did not come up");
    // A third party B would like A to flood, and an address B never announced.
    let victim = Endpoint::udp(SocketAddr::from(([203, 0, 113, 9], 53)));
    let other = Endpoint::udp(SocketAddr::from(([192, 0, 2, 99], 11010)));
    let punch = |eps: &[Endpoint]| {
        let mut m = vec![4u8, eps.len() as u8]; // Msg::Punch
        for e in eps {
            let SocketAddr::V4(v4) = e.addr else { unreachable!() };
            m.push(4); // UDP, IPv4
            m.extend_from_slice(&v4.ip().octets());
            m.extend_from_slice(&v4.port().to_le_bytes());
        }
        m
    };
    let sent_to =
        |s: &Sim, to: Endpoint, since: usize| s.log[since..].iter().filter(|x| x.from == A && x.to == to).count();
    let mark = sim.log.len();
    for _ in 0..5 {
        sim.send_control(B, A, &punch(&[victim, other, spare, mapped, addr(B)]));
    }
    assert_eq!(sent_to(&sim, victim, mark), 0, "A sent to an address B named");
    assert_eq!(sent_to(&sim, other, mark), 0, "A sent to an address B never announced");
    // Announcing an address in its own record is not enough: it could be anyone's.
    assert_eq!(sent_to(&sim, spare, mark), 0, "A sent to an address B only announced");
    assert_eq!(sent_to(&sim, addr(B), mark), 1, "five requests at once answered once, where A sees B");
    // Another port of the address where A sees B is B's NAT's to forward: punched.
    assert_eq!(sent_to(&sim, mapped, mark), 1, "A never tried B's mapped port");
    // On A's own LAN an announced address is B's to name (two members on one LAN).
    sim.slots[A]
        .host
        .admin(|n| n.set_local_networks(vec![(Ipv4Addr::new(198, 51, 100, 0).into(), 24)]), &mut Vec::new());
    sim.run(Duration::from_secs(1));
    let mark = sim.log.len();
    sim.send_control(B, A, &punch(&[spare]));
    assert_eq!(sent_to(&sim, spare, mark), 1, "answered again a second later, on the LAN");
    assert!(sim.established(A, B) && sim.established(B, A));
}

#[test]
fn dhcp_node_told_its_address_is_taken_moves_and_joins() {
    // A holds 10.77.0.1 with C; B starts with --dhcp on that same address and dials C.
    let timers = Timers::default();
    let mut b = params(B, Cipher::Aes128Gcm, SECRET);
    b.hello.ipv4 = overlay(A);
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![C], timers),
        (b.clone(), vec![], timers),
        (params(C, Cipher::Aes128Gcm, SECRET), vec![], timers),
    ]);
    sim.kill(B);
    assert!(sim.run_until(Duration::from_secs(2), |s| s.established(A, C) && s.established(C, A)).is_some());
    sim.tweaks.push((B, Box::new(|c: &mut Config| c.dynamic = Some((Ipv4Addr::new(10, 77, 0, 0), 16)))));
    sim.restart_with(B, b, vec![C]);
    let moved = |s: &Sim| s.slots[B].host.addresses.last().map(|(_, new, _)| *new);
    let joined = |s: &Sim| {
        moved(s).is_some_and(|new| s.node(C).routed().contains(&new) && s.node(B).routed().contains(&overlay(C)))
    };
    assert!(sim.run_until(Duration::from_secs(15), joined).is_some(), "B did not move and join: {:?}", sim.reasons(B));
    let (old, new, _) = sim.slots[B].host.addresses[0];
    assert_eq!(old, overlay(A));
    assert_ne!(new, overlay(A));
    // A kept its address and its traffic.
    assert!(sim.established(A, C) && sim.established(C, A));
    assert_eq!(sim.send_data(C, A), Ok(84));
    let c_view = sim.node(C).status(sim.now).peers;
    assert_eq!(c_view.iter().filter(|p| p.overlay == overlay(A)).count(), 1);
}

#[test]
fn a_repeated_empty_digest_pulls_the_table_once_per_gap() {
    // A member's 17-byte digest claiming it holds nothing pulls every record we sync;
    // repeating it must not pull them again and again.
    let mut sim = three_members();
    let mut digest = vec![6u8];
    digest.extend_from_slice(&[0; 8]);
    digest.extend_from_slice(&[0xff; 8]);
    digest.push(0);
    let records_to_a = |s: &Sim, since: usize| {
        s.log[since..].iter().filter(|x| x.from == B && x.to == addr(A) && x.bytes.len() > 200).count()
    };
    let mark = sim.log.len();
    sim.send_control(A, B, &digest);
    let first = records_to_a(&sim, mark);
    assert!(first >= 3, "the first digest pulled {first} records");
    let mark = sim.log.len();
    for _ in 0..50 {
        sim.send_control(A, B, &digest);
    }
    assert_eq!(records_to_a(&sim, mark), 0, "repeated digests pulled the table again");
    // After the gap it is answered again (a real repair).
    sim.run(Duration::from_secs(3));
    let mark = sim.log.len();
    sim.send_control(A, B, &digest);
    assert!(records_to_a(&sim, mark) >= 3);
}

#[test]
fn a_member_restarted_under_another_name_is_known_by_it() {
    // Same key, new host name (its record's sequence numbers start again from zero):
    // every member ends up with the new name in its table.
    let mut sim = three_members();
    sim.run(Duration::from_secs(3));
    sim.kill(A);
    sim.run(Duration::from_secs(1));
    let mut p = sim.slots[A].params.clone();
    p.hello.hostname = "renamed".into();
    let d = sim.slots[A].dial.clone();
    sim.restart_with(A, p, d);
    let named = |s: &Sim, i: usize| s.record(i, A).is_some_and(|r| r.hostname == "renamed");
    let t = sim.run_until(Duration::from_secs(20), |s| named(s, B) && named(s, C));
    assert!(
        t.is_some(),
        "A holds {:?}, B holds {:?}",
        sim.record(B, A).map(|r| (r.hostname, r.seq)),
        sim.record(C, A).map(|r| (r.hostname, r.seq))
    );
}

#[test]
fn an_exit_offer_is_routed_only_by_the_member_that_chose_it() {
    let mut sim = three_members();
    let any = weft_peers::DEFAULT_ROUTE;
    sim.tweaks.push((A, Box::new(move |c: &mut Config| c.proxied = vec![any])));
    sim.tweaks.push((B, Box::new(|c: &mut Config| c.use_exit = Some("NODE0".into()))));
    for i in [C, B, A] {
        let p = sim.slots[i].params.clone();
        let d = sim.slots[i].dial.clone();
        sim.restart_with(i, p, d);
    }
    let chose = |s: &Sim| s.node(B).status(s.now).exit.is_some_and(|e| e.routing);
    assert!(sim.run_until(Duration::from_secs(5), chose).is_some(), "{:?}", sim.node(B).status(sim.now).exit);
    let exit = sim.node(B).status(sim.now).exit.unwrap();
    assert_eq!(exit.node, Some((sim.id(A), "node0".to_owned())));
    assert!(sim.slots[B].host.installed.contains(&any));
    // C never asked: the offer is listed, never routed, never called a refusal.
    sim.run(Duration::from_secs(2));
    let c = sim.node(C).status(sim.now);
    assert!(!sim.slots[C].host.installed.contains(&any));
    assert!(c.exit.is_none() && c.refused.is_empty(), "{:?}", c.refused);
    assert_eq!(c.exit_offers, vec![(sim.id(A), "node0".to_owned())]);
    // B sends the internet to A; C has no route there.
    let public = Ipv4Addr::new(203, 0, 113, 10);
    let via = sim.slots[B].host.routes.route_for(public.into()).map(|r| r.session.peer_addr);
    assert_eq!(via, Some(overlay(A)));
    assert!(sim.slots[C].host.routes.route_for(public.into()).is_none());
}

#[test]
fn a_copied_exit_name_never_moves_the_exit_and_a_changed_one_fails_closed() {
    let mut sim = three_members();
    let any = weft_peers::DEFAULT_ROUTE;
    sim.tweaks.push((A, Box::new(move |c: &mut Config| c.proxied = vec![any])));
    sim.tweaks.push((B, Box::new(|c: &mut Config| c.use_exit = Some("node0".into()))));
    for i in [C, B, A] {
        let (p, d) = (sim.slots[i].params.clone(), sim.slots[i].dial.clone());
        sim.restart_with(i, p, d);
    }
    let routes_via = |s: &Sim, i: usize| {
        s.node(B).status(s.now).exit.is_some_and(|e| e.routing && e.node.is_some_and(|(id, _)| id == s.id(i)))
    };
    assert!(sim.run_until(Duration::from_secs(5), |s| routes_via(s, A)).is_some());
    // D copies A's host name, offers an exit too, and has a lower node id (ground).
    let a_id = sim.id(A);
    let key = (0..64u64)
        .map(|seed| static_key(&mut ChaCha8Rng::seed_from_u64(0xd00d_0000 + seed)))
        .find(|k| NodeId::from_public(&k.public) < a_id)
        .expect("a lower id in 64 tries");
    const D: usize = 3;
    let copier = harness::params(key, NET, SECRET, Cipher::Aes128Gcm, overlay(D), "node0".into());
    sim.slots.push(Slot {
        params: copier,
        dial: vec![B, C],
        timers: Timers::default(),
        seed: 0xd00d,
        host: Host::new(addr(D), sim.epoch),
    });
    sim.tweaks.push((D, Box::new(move |c: &mut Config| c.proxied = vec![any])));
    sim.boot(D);
    sim.run(Duration::from_secs(5));
    assert!(sim.record(B, D).is_some(), "B knows the copier");
    assert!(routes_via(&sim, A), "the exit moved to the copier: {:?}", sim.node(B).status(sim.now).exit);
    assert_eq!(sim.node(B).names().holder("NODE0"), Some(a_id));
    let public: std::net::IpAddr = Ipv4Addr::new(203, 0, 113, 10).into();
    assert_eq!(sim.slots[B].host.routes.route_for(public).map(|r| r.session.peer_addr), Some(overlay(A)));
    // What B asked the runtime to keep: the binding and the pin.
    let kept = sim.slots[B].host.names.clone().expect("names saved");
    assert_eq!((kept.holder("node0"), kept.exit_pin("node0")), (Some(a_id), Some(a_id)));

    // A goes away for good: its record ages out and only D matches. The exit does not
    // move; status says so and traffic fails closed.
    sim.kill(A);
    sim.run(Duration::from_secs(75));
    let e = sim.node(B).status(sim.now).exit.expect("exit status");
    assert_eq!(e.changed_to, Some((sim.id(D), "node0".to_owned())), "{e:?}");
    assert_eq!((e.node, e.routing, e.pinned), (None, false, Some(a_id)));
    assert!(sim.slots[B].host.routes.route_for(public).is_none(), "internet traffic went somewhere");
    assert!(!sim.slots[B].host.installed.contains(&any));

    // The admin accepts the new exit.
    let now = sim.now;
    let said = sim.slots[B].host.admin(|n| n.accept_exit(now), &mut Vec::new()).expect("accepted");
    assert!(said.contains(&sim.id(D).to_string()), "{said}");
    assert!(sim.run_until(Duration::from_secs(3), |s| routes_via(s, D)).is_some());
    let kept = sim.slots[B].host.names.clone().expect("names saved");
    assert_eq!(kept.exit_pin("node0"), Some(sim.id(D)));
    // A restart keeps the pin it is given back (the runtime's state file).
    sim.tweaks.push((B, Box::new(move |c: &mut Config| c.names = kept.clone())));
    let (p, d) = (sim.slots[B].params.clone(), sim.slots[B].dial.clone());
    sim.restart_with(B, p, d);
    assert!(sim.run_until(Duration::from_secs(5), |s| routes_via(s, D)).is_some());
    assert_eq!(sim.node(B).status(sim.now).exit.and_then(|e| e.pinned), Some(sim.id(D)));
}

// ----- sybil records -----

/// A record of a member `B` invents: a fresh key, an address in the overlay, one
/// subnet of its own, B as its neighbour (B does not list it back).
fn minted_record(i: usize, via: NodeId, rng: &mut ChaCha8Rng) -> Record {
    let key = static_key(rng);
    let mut r = Record {
        key: key.public,
        signer: [0; 32],
        sig: [0; 64],
        seq: 1,
        hostname: format!("minted{i}"),
        overlay: Ipv4Addr::new(10, 77, 1 + (i / 250) as u8, (i % 250) as u8 + 1),
        overlay6: None,
        endpoints: vec![Endpoint::udp(SocketAddr::from(([198, 19, (i >> 8) as u8, i as u8], 11010)))],
        neighbours: vec![weft_peers::topology::Neighbour {
            node: via,
            rtt_ms: 5,
            loss_pct: 0,
            observed: Endpoint::udp(SocketAddr::from(([198, 19, (i >> 8) as u8, i as u8], 11010))),
        }],
        proxied: vec![(std::net::IpAddr::V4(Ipv4Addr::from(0x1400_0000 + 256 * i as u32)), 24)],
        dynamic: false,
        cert: None,
        priority: weft_peers::topology::DEFAULT_PRIORITY,
        unknown_ext: Vec::new(),
    };
    r.sign(&key, NET);
    r
}

#[test]
fn a_member_minting_keys_fills_no_table_and_a_new_member_still_joins() {
    const D: usize = 3;
    let timers = Timers::default();
    let mut sim = Sim::new(vec![
        (params(A, Cipher::Aes128Gcm, SECRET), vec![B, C], timers),
        (params(B, Cipher::Aes128Gcm, SECRET), vec![C], timers),
        (params(C, Cipher::Aes128Gcm, SECRET), vec![], timers),
        (params(D, Cipher::Aes128Gcm, SECRET), vec![A], timers),
    ]);
    sim.kill(D);
    let up = |s: &Sim| (0..3).all(|i| (0..3).all(|j| i == j || (s.established(i, j) && s.record(i, j).is_some())));
    assert!(sim.run_until(Duration::from_secs(2), up).is_some(), "mesh did not come up");
    // B mints 5000 members and hands C their records at once: C takes what B's link
    // may bring (1024 new origins at once), counts the rest and checks no signature
    // of theirs.
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let minted = 5000;
    for i in 0..minted {
        let r = minted_record(i, sim.id(B), &mut rng);
        sim.send_record(B, C, &r);
    }
    let st = sim.node(C).status(sim.now);
    let held = sim.node(C).topology().len();
    assert!(held <= 4 + 1024, "C holds {held} records");
    assert_eq!(st.records_dropped.over_budget as usize, minted - (held - 3), "{:?}", st.records_dropped);
    // A new member joins through A meanwhile: its record reaches C over A's link
    // (budgeted apart from B's), and C knows the way to it.
    sim.restart(D, params(D, Cipher::Aes128Gcm, SECRET).local, vec![A]);
    let joined = sim.run_until(Duration::from_secs(10), |s| {
        let reach = s.node(C).route_snapshot();
        s.record(C, D).is_some()
            && s.record(D, C).is_some()
            && !matches!(reach.lookup(std::net::IpAddr::V4(overlay(D))), weft_core::route::Lookup::None)
    });
    assert!(
        joined.is_some(),
        "D never reached C: C has D's record {}, D has C's {}, C routes {:?}; {:?}",
        sim.record(C, D).is_some(),
        sim.record(D, C).is_some(),
        sim.routed(C),
        sim.node(C).status(sim.now).records_dropped
    );
    // The minted members' subnets cost C no scan per subnet: they are checked
    // against the address index (and routed only once reachable: they are not).
    let reach = sim.node(C).route_snapshot();
    assert!(matches!(reach.lookup("20.0.0.1".parse().unwrap()), weft_core::route::Lookup::None));
}

// ----- leaving -----

#[test]
fn a_stopping_member_says_goodbye_and_is_taken_back_at_once() {
    let mut sim = default_pair_established();
    assert!(sim.established(A, B));
    // B stops: it tells A first. A closes B's sessions now, not after a timeout.
    let now = sim.now;
    let mut out = Vec::new();
    let told = sim.slots[B].host.admin(|n| n.leave(now), &mut out);
    assert_eq!(told, 1, "B has one member to tell");
    sim.pump(out.into());
    sim.kill(B);
    sim.run(Duration::from_millis(50));
    assert!(sim.route(A, B).is_none(), "A still sends to B's closed session");
    let st = sim.peer_status(A, B).expect("B is still a member");
    assert_eq!(st.error.as_deref(), Some("left the mesh (stopped)"), "{st:?}");
    // B comes back (an upgrade: same key, new process) and dials A: taken at once.
    sim.restart(B, params(B, Cipher::Aes128Gcm, SECRET).local, vec![A]);
    let back = sim.run_until(Duration::from_secs(2), |s| s.established(A, B) && s.established(B, A));
    assert!(back.is_some(), "B did not rejoin: {:?}", sim.peer_status(A, B));
    eprintln!("rejoined after {back:?}");
}

/// A member floods a node with control messages: past its budget they are dropped
/// and counted, the node's sessions with everyone else carry on; a member whose
/// signed messages keep failing their signature check has its sessions closed.
#[test]
fn a_control_flood_is_rate_limited_and_forged_signatures_cut_the_member_off() {
    let mut sim = three_members();
    // 20,000 pings at once from B: at most a burst's worth is answered.
    let ping = [2u8, 1, 0, 0, 0, 0, 0, 0, 0];
    for _ in 0..20_000 {
        sim.send_control(B, A, &ping);
    }
    let limited = sim.node(A).status(sim.now).control_limited;
    assert!(limited >= 11_000, "only {limited} of 20,000 control messages were dropped");
    sim.run(Duration::from_secs(2));
    assert!(sim.established(A, B) && sim.established(A, C), "the flood broke a session");
    assert!(sim.send_data(A, C).is_ok() && sim.send_data(C, A).is_ok());
    // A second later B's budget has refilled by its rate: it is heard again.
    let before = sim.node(A).status(sim.now).control_limited;
    sim.send_control(B, A, &ping);
    assert_eq!(sim.node(A).status(sim.now).control_limited, before);

    // Forged records from B: each costs A a signature check; past the limit A closes
    // its sessions with B (and B may come back with a new handshake).
    let genuine = sim.record(B, C).expect("B holds C's record");
    assert_eq!(sim.node(A).status(sim.now).signature_cutoffs, 0);
    for n in 0..16 {
        let mut f = genuine.clone();
        f.seq += 1 + n;
        f.proxied = vec![(Ipv4Addr::new(192, 168, 77, 0).into(), 24)];
        sim.send_record(B, A, &f);
    }
    let st = sim.node(A).status(sim.now);
    assert_eq!(st.signature_cutoffs, 1, "{st:?}");
    assert!(!sim.established(A, B), "A kept its session with a member whose signatures fail");
    assert!(sim.established(A, C));
}

#[test]
fn packets_that_arrive_with_bad_checksums_turn_the_senders_tun_offload_off_once() {
    // A's kernel hands it UDP packets whose checksums are wrong (a TUN offload that
    // corrupts): B's RX checks one plain packet in 16, drops the bad ones, and tells A
    // once a second; A, told of enough of them, turns its offload off, once.
    let mut sim = default_pair_established();
    let session = sim.route(A, B).expect("A routes B");
    let src = sim.slots[A].host.addr;
    let packet = |tag: u64, bad: bool| {
        let mut p = ip_packet(overlay(A), overlay(B), 40, tag);
        // UDP length, then a checksum: right (0 means none on IPv4) or wrong.
        p[24..26].copy_from_slice(&40u16.to_be_bytes());
        p[26..28].copy_from_slice(if bad { &[0xde, 0xad] } else { &[0, 0] });
        p
    };
    // A member that claims more bad packets than it was sent is not believed.
    sim.send_control(B, A, &[12, 200, 0, 0, 0]);
    assert!(sim.slots[A].host.tun_offload_off.is_empty(), "believed a count of 200 with nothing sent");
    // Data from A's TX pipeline (counted as sent to B), then good packets: all
    // delivered, nothing reported.
    for _ in 0..8 {
        assert_eq!(sim.send_data(A, B), Ok(84));
    }
    for tag in 0..64 {
        assert_eq!(sim.inject_data(B, src, &seal(&session, &packet(tag, false))), Ok(60));
    }
    assert_eq!(sim.node(B).status(sim.now).checksum_reports, (0, 0));
    assert_eq!(sim.node(A).status(sim.now).checksum_reports, (0, 1), "the lie was counted, not acted on");
    // Bad ones, in bursts a second apart: one in 16 is caught. The first report (1
    // caught) is not enough; the second (5) is.
    let mut caught = 0;
    for burst in 0..3u64 {
        for tag in 0..64 {
            if sim.inject_data(B, src, &seal(&session, &packet(1000 * burst + tag, true))) == Err("bad_checksum") {
                caught += 1;
            }
        }
        sim.run(Duration::from_millis(1100));
    }
    assert_eq!(caught, 3 * 64 / 16);
    let (sent, _) = sim.node(B).status(sim.now).checksum_reports;
    assert_eq!(sent, 3, "one report per burst (at most one a second)");
    let a = sim.node(A).status(sim.now);
    assert_eq!(a.checksum_reports, (0, 4));
    assert_eq!(sim.slots[A].host.tun_offload_off.len(), 1, "told once: {:?}", sim.slots[A].host.tun_offload_off);
    assert!(
        sim.slots[A].host.tun_offload_off[0].starts_with("node1 found bad checksums in 5 "),
        "{:?}",
        a.tun_offload_off
    );
    assert_eq!(a.tun_offload_off.as_deref(), Some(sim.slots[A].host.tun_offload_off[0].as_str()));
    // B's own offload is not in question.
    assert!(sim.slots[B].host.tun_offload_off.is_empty());
    assert!(sim.established(A, B) && sim.established(B, A));
}
