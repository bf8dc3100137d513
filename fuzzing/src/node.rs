//! `weft_peers::Node::handle` driven by arbitrary sequences of inputs on a virtual
//! clock. Node A is under test; node B is a real member of the same network whose
//! datagrams the sequence may deliver to A (intact or tampered), so that handshakes,
//! held sessions, confirmations and control messages are reachable, not only the
//! rejection of garbage.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use weft_core::crypto::Cipher;
use weft_core::handshake::{Hello, Params, Psk, StaticKey};
use weft_core::wire::{HandshakeHeader, MessageType};
use weft_datapath::transport::{Endpoint, Proto};
use weft_peers::topology::{Neighbour, Record};
use weft_peers::{Action, Config, Input, Node, NodeId, PeerRef, Timers};

pub(crate) const NET: &str = "fuzz";
/// Most steps run per input: longer sequences cost time without reaching new code.
const MAX_STEPS: usize = 256;
/// Datagrams from B kept for delivery.
const KEEP: usize = 64;

fn psk() -> Psk {
    static PSK: OnceLock<Psk> = OnceLock::new();
    // Argon2id costs tens of milliseconds: derive once per process.
    PSK.get_or_init(|| Psk::derive(NET, "fuzzing secret")).clone()
}

fn key(seed: u8) -> StaticKey {
    StaticKey::from_seed([seed; 32])
}

pub(crate) fn keys() -> &'static [StaticKey; 3] {
    static KEYS: OnceLock<[StaticKey; 3]> = OnceLock::new();
    KEYS.get_or_init(|| [key(1), key(2), key(3)])
}

/// The endpoints inputs come from: B's UDP address first.
fn endpoint(i: u8) -> Endpoint {
    let (proto, port) = match i % 6 {
        0 => (Proto::Udp, 2),
        1 => (Proto::Udp, 9),
        2 => (Proto::Tcp, 2),
        3 => (Proto::Quic, 2),
        4 => (Proto::Ws, 7),
        _ => (Proto::Udp, 40000),
    };
    Endpoint::new(proto, SocketAddr::from(([192, 0, 2, 2 + (i / 6) % 3], port)))
}

fn a_endpoint() -> Endpoint {
    Endpoint::new(Proto::Udp, SocketAddr::from(([192, 0, 2, 1], 1)))
}

fn config(local: StaticKey, ipv4: Ipv4Addr, dial: Vec<Endpoint>, me: Endpoint, epoch: Instant) -> Config {
    Config {
        handshake: Params {
            local,
            psk: psk(),
            network_name: NET.into(),
            hello: Hello {
                gso: true,
                gso_quic: true,
                ..Hello::new(Cipher::Aes128Gcm, ipv4, 16, format!("node-{ipv4}"))
            },
        },
        dial,
        epoch,
        wall: Duration::from_secs(1_800_000_000),
        authorities: Vec::new(),
        timers: Timers::default(),
        endpoints: vec![me],
        latency_first: false,
        proxied: Vec::new(),
        router_priority: weft_peers::topology::DEFAULT_PRIORITY,
        mtu: 1420,
        dynamic: None,
        accept_wide_subnets: false,
        exit_allow_lan: false,
        names: weft_peers::Names::default(),
        use_exit: None,
        local_networks: Vec::new(),
    }
}

/// A session index: one A used in a handshake, or any.
#[derive(Debug, Arbitrary)]
enum Index {
    Known(u8),
    Raw(u32),
}

/// A topology record built from parts (sent as a control message, tag 1).
#[derive(Debug, Arbitrary)]
struct RecordParts {
    /// A's key, B's, a third member's, or any.
    key: u8,
    seq: u64,
    overlay: [u8; 4],
    endpoints: Vec<u8>,
    neighbours: Vec<(u8, u32, u8)>,
    proxied: Vec<([u8; 4], u8)>,
    dynamic: bool,
}

/// One thing that happens to node A.
#[derive(Debug, Arbitrary)]
enum Step {
    /// Arbitrary bytes arrive as a handshake/reject datagram, maybe through a relay.
    Datagram {
        from: u8,
        via: Option<u8>,
        bytes: Vec<u8>,
    },
    /// A datagram B sent to A (counted from the newest) arrives, maybe tampered.
    FromPeer {
        which: u8,
        flip: Option<(u16, u8)>,
        via: Option<u8>,
    },
    /// What A sent to B arrives at B.
    ToPeer,
    /// A session's first authenticated packet.
    Confirmed(Index),
    /// A control message inside a session.
    Message(Index, Vec<u8>),
    /// A record inside a session.
    Record(Index, RecordParts),
    /// Authenticated packets of a session arrive directly from an endpoint.
    Direct(Index, u8),
    /// A LAN beacon.
    Discovered(u8),
    /// A connection closed.
    LinkDown(u8),
    /// Time passes (milliseconds) and both nodes' timers run.
    Tick(u16),
    /// An administrator adds or removes a peer.
    AddPeer(u8),
    RemovePeer(u8),
}

struct World {
    epoch: Instant,
    now: Instant,
    a: Node,
    b: Node,
    /// A's session indices seen in its handshake messages.
    known: Vec<u32>,
    /// Datagrams B sent to A.
    from_b: Vec<Vec<u8>>,
    /// Datagrams A sent to B, not yet delivered.
    to_b: Vec<Vec<u8>>,
    /// Nodes whose records were delivered inside a session: vouched for by a member,
    /// so they may get a status row (as relayed members) without a handshake.
    vouched: Vec<NodeId>,
}

impl World {
    fn new() -> Self {
        let epoch = Instant::now();
        let [ka, kb, _] = keys().clone();
        let a = Node::new(
            config(ka, Ipv4Addr::new(10, 9, 0, 1), vec![endpoint(0)], a_endpoint(), epoch),
            Box::new(ChaCha8Rng::seed_from_u64(1)),
        );
        let b = Node::new(
            config(kb, Ipv4Addr::new(10, 9, 0, 2), Vec::new(), endpoint(0), epoch),
            Box::new(ChaCha8Rng::seed_from_u64(2)),
        );
        let mut w = Self {
            epoch,
            now: epoch,
            a,
            b,
            known: Vec::new(),
            from_b: Vec::new(),
            to_b: Vec::new(),
            vouched: Vec::new(),
        };
        w.a.handle_timeout(w.now);
        w.drain();
        w
    }

    fn drain(&mut self) {
        while let Some(act) = self.a.poll_action() {
            if let Action::Send { to, bytes } = act {
                if let Ok((h, _)) = HandshakeHeader::parse(&bytes)
                    && !self.known.contains(&h.sender_index)
                    && self.known.len() < 32
                {
                    self.known.push(h.sender_index);
                }
                if to == endpoint(0) && self.to_b.len() < KEEP {
                    self.to_b.push(bytes);
                }
            }
        }
        while let Some(act) = self.b.poll_action() {
            if let Action::Send { to, bytes } = act
                && to == a_endpoint()
            {
                if self.from_b.len() == KEEP {
                    self.from_b.remove(0);
                }
                self.from_b.push(bytes);
            }
        }
    }

    fn index(&self, i: &Index) -> u32 {
        match *i {
            Index::Known(k) if !self.known.is_empty() => self.known[usize::from(k) % self.known.len()],
            Index::Known(k) => u32::from(k),
            Index::Raw(r) => r,
        }
    }

    fn via(v: u8) -> NodeId {
        let keys = keys();
        match v % 4 {
            3 => NodeId::from_bytes([v; 8]),
            k => NodeId::from_public(&keys[usize::from(k)].public),
        }
    }

    fn vouch(&mut self, message: &[u8]) {
        if let Some((1, rec)) = message.split_first()
            && let Ok(r) = Record::parse(rec)
            && !self.vouched.contains(&r.node())
        {
            self.vouched.push(r.node());
        }
    }

    fn record(&self, p: &RecordParts) -> Vec<u8> {
        let keys = keys();
        let key = match p.key % 4 {
            3 => [p.key; 32],
            k => keys[usize::from(k)].public,
        };
        let mut rec = Record {
            key,
            signer: [0; 32],
            seq: p.seq,
            hostname: format!("r{}", p.key),
            overlay: p.overlay.into(),
            overlay6: None,
            endpoints: p.endpoints.iter().take(8).map(|&e| endpoint(e)).collect(),
            neighbours: p
                .neighbours
                .iter()
                .take(8)
                .map(|&(n, rtt_ms, loss)| Neighbour {
                    node: Self::via(n),
                    rtt_ms,
                    loss_pct: loss % 101,
                    observed: endpoint(n),
                })
                .collect(),
            proxied: p.proxied.iter().take(8).map(|&(a, len)| (a.into(), len % 33)).collect(),
            dynamic: p.dynamic,
            cert: None,
            priority: weft_peers::topology::DEFAULT_PRIORITY,
            unknown_ext: Vec::new(),
            sig: [0; 64],
        };
        // Records of the three real keys are signed by their origin (the fourth key
        // is garbage and stays unsigned): both must be handled.
        if let Some(k) = keys.get(usize::from(p.key % 4)) {
            rec.sign(k, NET);
        }
        let mut out = vec![1];
        rec.emit(&mut out);
        out
    }

    fn step(&mut self, s: &Step) {
        let now = self.now;
        match s {
            Step::Datagram { from, via, bytes } => {
                let via = via.map(Self::via);
                self.a.handle(now, Input::Datagram { from: endpoint(*from), via, bytes });
            }
            Step::FromPeer { which, flip, via } => {
                if self.from_b.is_empty() {
                    return;
                }
                let mut d = self.from_b[self.from_b.len() - 1 - usize::from(*which) % self.from_b.len()].clone();
                if let Some((at, x)) = flip
                    && !d.is_empty()
                {
                    let at = usize::from(*at) % d.len();
                    d[at] ^= x;
                }
                // Data packets reach the engine only as the events the data plane raises.
                if MessageType::of(&d) == Some(MessageType::Data) {
                    return;
                }
                let via = via.map(Self::via);
                self.a.handle(now, Input::Datagram { from: endpoint(0), via, bytes: &d });
            }
            Step::ToPeer => {
                for d in std::mem::take(&mut self.to_b) {
                    if MessageType::of(&d) != Some(MessageType::Data) {
                        self.b.handle(now, Input::Datagram { from: a_endpoint(), via: None, bytes: &d });
                    }
                }
            }
            Step::Confirmed(i) => self.a.handle(now, Input::Confirmed { local_index: self.index(i) }),
            Step::Message(i, bytes) => {
                self.vouch(bytes);
                self.a.handle(now, Input::Message { local_index: self.index(i), bytes });
            }
            Step::Record(i, parts) => {
                let bytes = self.record(parts);
                self.vouch(&bytes);
                self.a.handle(now, Input::Message { local_index: self.index(i), bytes: &bytes });
            }
            Step::Direct(i, from) => {
                self.a.handle(now, Input::Direct { local_index: self.index(i), from: endpoint(*from) });
            }
            Step::Discovered(from) => self.a.handle(now, Input::Discovered { endpoint: endpoint(*from) }),
            Step::LinkDown(from) => {
                self.a.handle(now, Input::ConnectionDown { endpoint: endpoint(*from), error: "fuzz" })
            }
            Step::Tick(ms) => {
                self.now += Duration::from_millis(u64::from(*ms));
                self.a.handle_timeout(self.now);
                self.b.handle_timeout(self.now);
            }
            Step::AddPeer(e) => {
                let _ = self.a.add_peer(now, endpoint(*e));
            }
            Step::RemovePeer(e) => {
                let which = if e % 2 == 0 { PeerRef::Endpoint(endpoint(e / 2)) } else { PeerRef::Node(Self::via(*e)) };
                let _ = self.a.remove_peer(now, which);
            }
        }
        self.drain();
    }
}

/// Runs A over the sequence (at most 256 steps); after the clock moved, A's next
/// timeout must lie in the future (a deadline in the past would spin the runtime).
/// At the end, A's status lists no peer but B (the only other holder of the PSK)
/// and members whose records arrived inside a session (vouched for by a member, as
/// ARCHITECTURE.md allows): no entry for a node that merely sent handshakes,
/// garbage, beacons or relayed datagrams.
pub fn node(data: &[u8]) {
    let Ok(steps) = Vec::<Step>::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let mut w = World::new();
    for s in steps.iter().take(MAX_STEPS) {
        w.step(s);
        if matches!(s, Step::Tick(_)) {
            let next = w.a.poll_timeout();
            assert!(next.is_none_or(|t| t > w.now), "a timer due now survived handle_timeout");
        }
    }
    let status = w.a.status(w.now);
    let b = NodeId::from_public(&keys()[1].public);
    for p in &status.peers {
        assert!(
            p.node_id == b || w.vouched.contains(&p.node_id),
            "{} has a status row without proving the PSK or being vouched for",
            p.node_id
        );
    }
    let _ = w.epoch;
}

/// The datagrams of a real XX handshake from A to B (init, response, finish), for
/// seeds.
pub(crate) fn handshake_transcript() -> Vec<Vec<u8>> {
    let mut w = World::new();
    let mut out: Vec<Vec<u8>> = Vec::new();
    for _ in 0..2 {
        let sent = w.to_b.clone();
        w.step(&Step::ToPeer);
        let answered = w.from_b.last().cloned();
        w.step(&Step::FromPeer { which: 0, flip: None, via: None });
        for d in sent.into_iter().chain(answered) {
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}
