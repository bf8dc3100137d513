//! The data-plane RX path (`pipeline::Rx::process`) over arbitrary datagrams, with a
//! real session from A to B, a relay route to a third node and A as a direct
//! neighbour. Datagrams are raw bytes or real sealed packets (optionally tampered,
//! replayed, relayed or coalesced as GRO would).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arbitrary::{Arbitrary, Unstructured};
use arc_swap::ArcSwap;
use tun_rs::{GROTable, VIRTIO_NET_HDR_LEN};
use weft_core::crypto::Cipher;
use weft_core::handshake::SessionKeys;
use weft_core::route::{Route, RouteSnapshot};
use weft_core::session::{Session, SessionParams};
use weft_core::stats::DropCounters;
use weft_core::wire::{DATA_HEADER_LEN, FLAG_GSO, MAX_HOPS, RelayHeader};
use weft_datapath::gso;
use weft_datapath::pipeline::{
    ControlEvent, ControlSink, PipelineConfig, PipelineStats, Rx, Shared, TX_HEADROOM, TunWriter, Tx,
};
use weft_datapath::transport::Endpoint;
use weft_datapath::transport::udp::{Offload, RecvMeta};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const ID_A: [u8; 8] = [0xa; 8];
const ID_B: [u8; 8] = [0xb; 8];
const ID_C: [u8; 8] = [0xc; 8];
const PIPELINE: PipelineConfig = PipelineConfig { mtu: 1420, offload: false, udp_gro: false, pin: None };

fn ep(port: u16) -> Endpoint {
    SocketAddr::from(([192, 0, 2, 1], port)).into()
}

/// One received datagram.
#[derive(Debug, Arbitrary)]
enum Dgram {
    /// Arbitrary bytes.
    Raw(Vec<u8>),
    /// A's Tx seals an IPv4 packet to B with this source (`None`: A's own address)
    /// and payload; then `flip` xors one byte.
    Sealed { src: Option<[u8; 4]>, payload: Vec<u8>, flip: Option<(u16, u8)> },
    /// A's session seals a GSO record as a member could, past Tx's checks: this
    /// virtio header, then an IPv4 packet from A (`tcp`: protocol 6, so TCP GSO types
    /// can match) with this payload.
    SealedGso { hdr: [u8; 10], tcp: bool, payload: Vec<u8> },
    /// An earlier sealed datagram again.
    Replay(u8),
    /// A relay header in front of the rest (`dst` picks B, C or any id).
    Relay { hops: u8, dst: u8, src: u8, inner: Box<Self> },
}

/// A received message: datagrams coalesced by GRO when `stride` is set.
#[derive(Debug, Arbitrary)]
struct Msg {
    /// Which of a few senders (A's endpoint among them).
    from: u8,
    stride: Option<u16>,
    dgrams: Vec<Dgram>,
}

#[derive(Debug, Arbitrary)]
struct Input {
    cipher: u8,
    batches: Vec<Vec<Msg>>,
}

#[derive(Default)]
struct Sink(Mutex<Vec<ControlEvent>>);

impl ControlSink for Sink {
    fn try_push(&self, ev: ControlEvent) -> bool {
        let mut q = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A bounded queue, like the runtime's.
        if q.len() >= 64 {
            return false;
        }
        q.push(ev);
        true
    }
}

struct Tun(Vec<Vec<u8>>);

impl TunWriter for Tun {
    fn write_batch(&mut self, _gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> std::io::Result<()> {
        self.0.extend(bufs.iter().map(|b| b[VIRTIO_NET_HDR_LEN..].to_vec()));
        Ok(())
    }
}

fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let payload = &payload[..payload.len().min(1400)];
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

/// Tx and Rx keep no state between `process` calls but allocate megabytes of
/// buffers: one pair per thread serves every input.
fn with_pipelines<R>(f: impl FnOnce(&mut Tx, &mut Rx) -> R) -> R {
    thread_local! {
        static PIPES: std::cell::RefCell<(Tx, Rx)> = std::cell::RefCell::new((Tx::new(PIPELINE), Rx::new(PIPELINE)));
    }
    PIPES.with(|p| {
        let (tx, rx) = &mut *p.borrow_mut();
        f(tx, rx)
    })
}

struct World<'p> {
    tx: &'p mut Tx,
    rx: &'p mut Rx,
    routes_a: RouteSnapshot,
    a_to_b: Arc<Session>,
    shared_b: Shared,
    stats_b: PipelineStats,
    drops_a: DropCounters,
    /// What A sealed: every IP packet B may write to its TUN.
    sealed_plain: Vec<Vec<u8>>,
    sealed: Vec<Vec<u8>>,
}

impl<'p> World<'p> {
    fn new(cipher: Cipher, tx: &'p mut Tx, rx: &'p mut Rx) -> Self {
        let mk = |local, remote, send, recv, peer, endpoint| {
            Arc::new(Session::new(SessionParams {
                local_index: local,
                remote_index: remote,
                cipher,
                keys: SessionKeys { send, recv },
                endpoint,
                peer_addr: peer,
                peer_addr6: None,
                confirmed: true,
                stats: Arc::default(),
            }))
        };
        let a_to_b = mk(1, 2, [3; 32], [4; 32], B, ep(2));
        let b_from_a = mk(2, 1, [4; 32], [3; 32], A, ep(1));
        let route = Route { session: b_from_a.clone(), target: ep(1), relay: None, relay_streams: false };
        let routes_b = RouteSnapshot::with_relays(ID_B, [(A.into(), route)], [b_from_a], [(ID_C, ep(3))], [ep(1)]);
        let shared_b = Shared {
            routes: Arc::new(ArcSwap::from_pointee(routes_b)),
            control: Arc::new(Sink::default()),
            macs: Arc::new(weft_core::admission::MacKeys::new(&weft_core::handshake::Psk::from_bytes([9; 32]))),
            epoch: Instant::now(),
            stop: Arc::new(AtomicBool::new(false)),
            offload: Arc::new(Offload::new(false, false)),
            firewall: Default::default(),
        };
        Self {
            tx,
            rx,
            routes_a: RouteSnapshot::new([(B.into(), a_to_b.clone())], [a_to_b.clone()]),
            a_to_b,
            shared_b,
            stats_b: PipelineStats::default(),
            drops_a: DropCounters::default(),
            sealed_plain: Vec::new(),
            sealed: Vec::new(),
        }
    }

    fn seal(&mut self, packet: &[u8]) -> Option<Vec<u8>> {
        let (bufs, sizes) = self.tx.buffers();
        bufs[0][TX_HEADROOM..TX_HEADROOM + packet.len()].copy_from_slice(packet);
        sizes[0] = packet.len();
        self.tx.process(&self.routes_a, &self.drops_a, 1, 1);
        let (bufs, out) = self.tx.outgoing();
        let d = out.first().map(|o| bufs[o.buf][o.start..o.start + o.len].to_vec())?;
        self.sealed_plain.push(packet.to_vec());
        self.sealed.push(d.clone());
        Some(d)
    }

    fn bytes(&mut self, d: &Dgram, depth: usize) -> Vec<u8> {
        match d {
            Dgram::Raw(b) => b.clone(),
            Dgram::Sealed { src, payload, flip } => {
                let src = src.map_or(A, Ipv4Addr::from);
                let Some(mut d) = self.seal(&ipv4(src, B, payload)) else { return Vec::new() };
                if let Some((at, x)) = flip
                    && !d.is_empty()
                {
                    let at = usize::from(*at) % d.len();
                    d[at] ^= x;
                }
                d
            }
            Dgram::SealedGso { hdr, tcp, payload } => {
                let mut pkt = hdr.to_vec();
                pkt.extend(ipv4(A, B, payload));
                if *tcp {
                    pkt[VIRTIO_NET_HDR_LEN + 9] = 6;
                }
                // What B may write for it: the segments a correct split gives.
                let mut segs = vec![Vec::new(); tun_rs::IDEAL_BATCH_SIZE];
                if let Ok(n) = gso::split_into(&mut pkt.clone(), &mut segs) {
                    self.sealed_plain.extend(segs[..n].iter().map(|s| s[VIRTIO_NET_HDR_LEN..].to_vec()));
                }
                let mut d = vec![0u8; DATA_HEADER_LEN + pkt.len() + 16];
                d[DATA_HEADER_LEN..DATA_HEADER_LEN + pkt.len()].copy_from_slice(&pkt);
                let Some(n) = self.a_to_b.seal_with_flags(&mut d, pkt.len(), FLAG_GSO) else { return Vec::new() };
                d.truncate(n);
                self.sealed.push(d.clone());
                d
            }
            Dgram::Replay(i) => {
                if self.sealed.is_empty() {
                    return Vec::new();
                }
                self.sealed[usize::from(*i) % self.sealed.len()].clone()
            }
            Dgram::Relay { hops, dst, src, inner } => {
                let pick = |x: u8| match x % 4 {
                    0 => ID_A,
                    1 => ID_B,
                    2 => ID_C,
                    _ => [x; 8],
                };
                let inner = if depth < 4 { self.bytes(inner, depth + 1) } else { Vec::new() };
                RelayHeader { hop_limit: (*hops).min(MAX_HOPS + 1), dst: pick(*dst), src: pick(*src) }.wrap(&inner)
            }
        }
    }
}

/// Runs B's RX over the input's batches and checks the data plane's invariants:
/// every packet written to the TUN has A's address as inner source and, with an
/// authenticating cipher, is one that A sealed, and no more come out than A sealed
/// (replays never pass twice).
pub fn rx(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    with_pipelines(|tx, rx| run(&input, tx, rx));
}

fn run(input: &Input, tx: &mut Tx, rx: &mut Rx) {
    let cipher = Cipher::ALL[usize::from(input.cipher) % Cipher::ALL.len()];
    let mut w = World::new(cipher, tx, rx);
    let mut tun = Tun(Vec::new());
    for (now, batch) in input.batches.iter().take(16).enumerate() {
        let mut msgs = Vec::new();
        for m in batch {
            let parts: Vec<Vec<u8>> = m.dgrams.iter().take(64).map(|d| w.bytes(d, 0)).collect();
            msgs.push((ep(1 + u16::from(m.from % 4)), m.stride, parts));
        }
        let (slab, slot, metas) = w.rx.slab();
        let mut n = 0;
        for (from, stride, parts) in msgs {
            if n == metas.len() {
                break;
            }
            // GRO coalesces equal-sized datagrams (the last may be shorter) into one
            // slot; without a stride each datagram is its own message.
            let joined = parts.concat();
            let len = joined.len().min(slot);
            slab[n * slot..n * slot + len].copy_from_slice(&joined[..len]);
            let stride = stride.map_or(len, usize::from);
            metas[n] = RecvMeta { stride, truncated: joined.len() > slot, ..RecvMeta::whole(from, len) };
            n += 1;
        }
        let routes = w.shared_b.routes.load_full();
        w.rx.process(&routes, &w.shared_b, &w.stats_b, n, now as u64 + 1, &mut tun);
        for (to, f) in w.rx.forwarded() {
            assert_eq!(to, ep(3), "forwarded somewhere other than the next hop");
            let h = RelayHeader::parse(f).unwrap_or_else(|e| panic!("forwarded a bad relay frame: {e}"));
            assert_eq!(h.dst, ID_C);
            assert!(h.hop_limit < MAX_HOPS + 1);
        }
    }
    for p in &tun.0 {
        assert_eq!(
            weft_core::wire::ipv4_addrs(p).map(|a| a.0),
            Some(A),
            "inner source is not the peer's address: {p:?}"
        );
    }
    // Every mode authenticates, `none` included.
    for p in &tun.0 {
        assert!(w.sealed_plain.contains(p), "a packet A never sealed reached the TUN ({cipher})");
    }
    assert!(tun.0.len() <= w.sealed_plain.len(), "more packets out than sealed in");
}
