//! The TX and RX pipelines in memory: packets sealed by one node's Tx open in the
//! other's Rx, and hostile datagrams are dropped and counted by reason.
#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tun_rs::GROTable;
use weft_core::admission::MacKeys;
use weft_core::crypto::Cipher;
use weft_core::handshake::{Psk, SessionKeys};
use weft_core::route::RouteSnapshot;
use weft_core::session::{Session, SessionParams};
use weft_core::stats::{DropCounters, DropReason};
use weft_core::wire::{DataHeader, FLAG_GSO, FLAG_ORDERED, FLAG_SPARSE, MAX_HOPS, RELAY_HEADER_LEN, RelayHeader};
use weft_datapath::gso;
use weft_datapath::pipeline::{
    ControlEvent, ControlSink, PipelineConfig, PipelineStats, Rx, Shared, TX_HEADROOM, TunWriter, Tx,
};
use weft_datapath::transport::conn::on_quic_stream;
use weft_datapath::transport::udp::{Offload, RecvMeta};
use weft_datapath::transport::{Endpoint, Proto};

#[derive(Default)]
struct Sink(Mutex<Vec<ControlEvent>>);

impl ControlSink for Sink {
    fn try_push(&self, ev: ControlEvent) -> bool {
        self.0.lock().push(ev);
        true
    }
}

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    let total = (20 + payload.len()) as u16;
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    // The payload is the UDP datagram: its checksum (bytes 6 and 7) is made right, as
    // a kernel's would be (RX drops a sample of packets whose checksums fail).
    if payload.len() >= 8 {
        p[26..28].fill(0);
        let mut pseudo = p[12..20].to_vec();
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        pseudo.extend_from_slice(&p[20..]);
        let sum = match weft_core::wire::checksum(&pseudo, 0) {
            0 => 0xffff,
            s => s,
        };
        p[26..28].copy_from_slice(&sum.to_be_bytes());
    }
    p
}

/// Makes the TCP checksum of the IPv4 packet `p` right (a segment cut from a
/// super-packet carries only the partial sum the kernel leaves for offload).
fn complete_tcp_checksum(p: &mut [u8]) {
    let ihl = usize::from(p[0] & 0x0f) * 4;
    p[ihl + 16..ihl + 18].fill(0);
    let mut pseudo = p[12..20].to_vec();
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&((p.len() - ihl) as u16).to_be_bytes());
    pseudo.extend_from_slice(&p[ihl..]);
    let sum = weft_core::wire::checksum(&pseudo, 0);
    p[ihl + 16..ihl + 18].copy_from_slice(&sum.to_be_bytes());
}

struct Ends {
    tx: Tx,
    rx: Rx,
    a_to_b: Arc<Session>,
    b_from_a: Arc<Session>,
    shared_b: Shared,
    stats_b: PipelineStats,
    sink: Arc<Sink>,
    routes_a: RouteSnapshot,
}

fn ends(cipher: Cipher) -> Ends {
    let ep: SocketAddr = "192.0.2.2:11010".parse().unwrap();
    ends_over(cipher, ep.into(), false)
}

/// Two ends whose sessions lead to `ep`; A's TX reads from a TUN with offload when
/// `offload` (it then sees super-packets).
fn ends_over(cipher: Cipher, ep: Endpoint, offload: bool) -> Ends {
    let (k1, k2) = ([3u8; 32], [4u8; 32]);
    let mk = |local, remote, send, recv, peer| {
        Arc::new(Session::new(SessionParams {
            local_index: local,
            remote_index: remote,
            cipher,
            keys: SessionKeys { send, recv },
            endpoint: ep,
            peer_addr: peer,
            peer_addr6: None,
            confirmed: true,
            stats: Arc::default(),
        }))
    };
    let a_to_b = mk(1, 2, k1, k2, B);
    let b_from_a = mk(2, 1, k2, k1, A);
    let sink = Arc::new(Sink::default());
    let shared_b = Shared {
        routes: Arc::new(ArcSwap::from_pointee(RouteSnapshot::new([(A.into(), b_from_a.clone())], [b_from_a.clone()]))),
        control: sink.clone(),
        macs: Arc::new(MacKeys::new(&Psk::from_bytes([5; 32]))),
        epoch: Instant::now(),
        stop: Arc::new(AtomicBool::new(false)),
        offload: Arc::new(Offload::new(false, false)),
        firewall: Default::default(),
    };
    let cfg = PipelineConfig { mtu: 1420, offload: false, udp_gro: false, pin: None };
    Ends {
        tx: Tx::new(PipelineConfig { offload, ..cfg }),
        rx: Rx::new(cfg),
        routes_a: RouteSnapshot::new([(B.into(), a_to_b.clone())], [a_to_b.clone()]),
        a_to_b,
        b_from_a,
        shared_b,
        stats_b: PipelineStats::default(),
        sink,
    }
}

/// Seals `packets` on A's Tx and returns the datagrams it would send.
fn seal(e: &mut Ends, packets: &[Vec<u8>], drops: &DropCounters) -> Vec<Vec<u8>> {
    let (bufs, sizes) = e.tx.buffers();
    for (i, p) in packets.iter().enumerate() {
        bufs[i][TX_HEADROOM..TX_HEADROOM + p.len()].copy_from_slice(p);
        sizes[i] = p.len();
    }
    e.tx.process(&e.routes_a, drops, packets.len(), 1);
    let (bufs, out) = e.tx.outgoing();
    out.iter().map(|o| bufs[o.buf][o.start..o.start + o.len].to_vec()).collect()
}

/// Feeds datagrams into B's Rx and returns the packets it would write to its TUN.
fn deliver(e: &mut Ends, dgrams: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let (slab, slot, metas) = e.rx.slab();
    for (i, d) in dgrams.iter().enumerate() {
        let n = d.len().min(slot);
        slab[i * slot..i * slot + n].copy_from_slice(&d[..n]);
        metas[i] = RecvMeta { truncated: d.len() > slot, ..RecvMeta::whole("192.0.2.1:11010".parse().unwrap(), n) };
    }
    let routes = e.shared_b.routes.load();
    let mut out = Collect(Vec::new());
    e.rx.process(&routes, &e.shared_b, &e.stats_b, dgrams.len(), 1, &mut out);
    out.0
}

/// Stands in for the TUN: keeps what RX would write.
struct Collect(Vec<Vec<u8>>);

impl TunWriter for Collect {
    fn write_batch(&mut self, _gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> std::io::Result<()> {
        self.0.extend(bufs.iter().map(|b| b[10..].to_vec()));
        Ok(())
    }
}

#[test]
fn tx_to_rx_round_trip_every_cipher() {
    for cipher in Cipher::ALL {
        let mut e = ends(cipher);
        let drops = DropCounters::default();
        let packets: Vec<Vec<u8>> = (0..40).map(|i| ipv4_packet(A, B, &vec![i as u8; 100 + i * 30])).collect();
        let dgrams = seal(&mut e, &packets, &drops);
        assert_eq!(dgrams.len(), 40);
        if cipher.encrypts() {
            assert!(
                dgrams.iter().zip(&packets).all(|(d, p)| !d.windows(p.len()).any(|w| w == &p[..])),
                "plaintext leaked"
            );
        }
        let got = deliver(&mut e, &dgrams);
        assert_eq!(got, packets, "{cipher}");
        assert_eq!(e.a_to_b.stats.tx_packets.load(std::sync::atomic::Ordering::Relaxed), 40);
        assert_eq!(e.b_from_a.stats.rx_packets.load(std::sync::atomic::Ordering::Relaxed), 40);
    }
}

#[test]
fn tx_drops_unroutable_and_non_ip() {
    let mut e = ends(Cipher::Aes128Gcm);
    let drops = DropCounters::default();
    // An IPv6 packet for an address nobody routes, and a short one that is no IP.
    let mut v6 = vec![0x60u8; 40];
    v6[0] = 0x60;
    let out = seal(&mut e, &[ipv4_packet(A, Ipv4Addr::new(10, 9, 9, 9), b"x"), v6, vec![0x60; 39]], &drops);
    assert!(out.is_empty());
    assert_eq!(drops.get(DropReason::NoRoute), 2);
    assert_eq!(drops.get(DropReason::NotIp), 1);
}

#[test]
fn rx_drops_hostile_datagrams_by_reason() {
    let mut e = ends(Cipher::ChaCha20Poly1305);
    let drops = DropCounters::default();
    let good =
        seal(&mut e, &[ipv4_packet(A, B, b"hello"), ipv4_packet(Ipv4Addr::new(10, 0, 0, 77), B, b"spoof")], &drops);
    assert_eq!(deliver(&mut e, &good[..1]).len(), 1);
    // Replay, tamper, truncate, unknown index, spoofed inner source, junk, oversize.
    let mut tampered = good[0].clone();
    tampered[8..16].copy_from_slice(&99u64.to_le_bytes());
    let mut unknown = good[0].clone();
    unknown[4..8].copy_from_slice(&77u32.to_le_bytes());
    let hostile = vec![
        good[0].clone(),
        tampered,
        good[0][..12].to_vec(),
        unknown,
        good[1].clone(),
        vec![0xff; 50],
        vec![],
        vec![4u8; 5000],
    ];
    assert!(deliver(&mut e, &hostile).is_empty());
    let peer = &e.b_from_a.stats.drops;
    assert_eq!(peer.get(DropReason::Replay), 1);
    assert_eq!(peer.get(DropReason::AuthFailed), 1);
    assert_eq!(peer.get(DropReason::Spoofed), 1);
    let node = &e.stats_b.drops;
    assert_eq!(node.get(DropReason::UnknownSession), 1);
    assert_eq!(node.get(DropReason::Malformed), 4, "truncated, junk, empty, oversize");
    // Still works afterwards.
    let more = seal(&mut e, &[ipv4_packet(A, B, b"again")], &drops);
    assert_eq!(deliver(&mut e, &more).len(), 1);
}

#[test]
fn rx_hands_handshakes_to_the_control_plane() {
    let mut e = ends(Cipher::Aes128Gcm);
    let mut hs = vec![1u8, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 42];
    // Without a mac1 of this network (an outsider, or the old wire format): dropped
    // and counted here, never queued for the engine.
    assert!(deliver(&mut e, std::slice::from_ref(&hs)).is_empty());
    let mut wrong = hs.clone();
    MacKeys::new(&Psk::from_bytes([6; 32])).seal(&mut wrong, None);
    assert!(deliver(&mut e, std::slice::from_ref(&wrong)).is_empty());
    assert!(e.sink.0.lock().is_empty());
    assert_eq!(e.stats_b.drops.get(DropReason::HandshakeMac), 2);
    MacKeys::new(&Psk::from_bytes([5; 32])).seal(&mut hs, None);
    assert!(deliver(&mut e, std::slice::from_ref(&hs)).is_empty());
    let evs = e.sink.0.lock();
    assert!(matches!(&evs[..], [ControlEvent::Datagram { bytes, .. }] if *bytes == hs));
}

/// Feeds datagrams from `from` into B's Rx (with `routes`), returns what it forwards.
fn relay(e: &mut Ends, routes: &RouteSnapshot, from: &str, dgrams: &[Vec<u8>]) -> Vec<(Endpoint, Vec<u8>)> {
    let (slab, slot, metas) = e.rx.slab();
    for (i, d) in dgrams.iter().enumerate() {
        slab[i * slot..i * slot + d.len()].copy_from_slice(d);
        metas[i] = RecvMeta::whole(from.parse().unwrap(), d.len());
    }
    let mut out = Collect(Vec::new());
    e.rx.process(routes, &e.shared_b, &e.stats_b, dgrams.len(), 1, &mut out);
    e.rx.forwarded().map(|(to, b)| (to, b.to_vec())).collect()
}

#[test]
fn relays_clamp_the_hop_limit_and_take_frames_only_from_neighbours() {
    let mut e = ends(Cipher::Aes128Gcm);
    let neighbour: Endpoint = "192.0.2.1:11010".parse::<SocketAddr>().unwrap().into();
    let next: Endpoint = "198.51.100.9:11010".parse::<SocketAddr>().unwrap().into();
    let routes = RouteSnapshot::with_relays([1; 8], [], [e.b_from_a.clone()], [([9; 8], next)], [neighbour]);
    let frame = |hops: u8| RelayHeader { hop_limit: hops, dst: [9; 8], src: [2; 8] }.wrap(b"sealed inner datagram");
    // A neighbour's frame is forwarded with its hop limit decremented, and a limit
    // above MAX_HOPS is clamped first.
    for (sent, left) in [(5u8, 4u8), (MAX_HOPS, MAX_HOPS - 1), (MAX_HOPS + 1, MAX_HOPS - 1), (255, MAX_HOPS - 1)] {
        let out = relay(&mut e, &routes, "192.0.2.1:11010", &[frame(sent)]);
        assert_eq!(out.len(), 1, "hop limit {sent}");
        assert_eq!(out[0].0, next);
        assert_eq!(RelayHeader::parse(&out[0].1).unwrap().hop_limit, left, "hop limit {sent}");
    }
    assert!(relay(&mut e, &routes, "192.0.2.1:11010", &[frame(0)]).is_empty());
    assert_eq!(e.stats_b.drops.get(DropReason::HopLimit), 1);
    // The same frame from anywhere else (another port of the neighbour's host, or a
    // stranger) is refused: only the neighbour's current endpoint counts.
    for from in ["192.0.2.1:11011", "203.0.113.5:11010"] {
        assert!(relay(&mut e, &routes, from, &[frame(5)]).is_empty(), "{from}");
    }
    assert_eq!(e.stats_b.drops.get(DropReason::RelayRefused), 2);
}

/// Relayed frames from a neighbour's connection for a next hop over a stream
/// connection are forwarded by the reader itself (`StreamRelay`) under the relay rules
/// (hop limit clamped and decremented): a batch of nothing else in its own buffer,
/// from a mixed batch in one batch per next hop and lane. Every other frame comes back untouched and
/// in order for the connection RX thread, whatever shares its batch.
#[test]
fn relayed_frames_pass_from_stream_to_stream_under_the_relay_rules() {
    use weft_datapath::pipeline::StreamRelay;
    use weft_datapath::transport::connections::ConnQueue;
    use weft_datapath::transport::{Connections, Forward, frame};
    let (a, b, c, d, e, f) = ([0xa; 8], [0xb; 8], [0xc; 8], [0xd; 8], [0xe; 8], [0xf; 8]);
    let from = Endpoint::new(Proto::Tcp, "192.0.2.1:40000".parse().unwrap());
    let stranger = Endpoint::new(Proto::Tcp, "203.0.113.5:40000".parse().unwrap());
    let ws_c = Endpoint::new(Proto::Ws, "192.0.2.3:11011".parse().unwrap());
    let udp_d = Endpoint::udp("192.0.2.4:11010".parse().unwrap());
    let tcp_e = Endpoint::new(Proto::Tcp, "192.0.2.5:11010".parse().unwrap());
    let tcp_f = Endpoint::new(Proto::Tcp, "192.0.2.6:11010".parse().unwrap());
    let hops = [(c, ws_c), (d, udp_d), (e, tcp_e), (f, tcp_f)];
    let routes = RouteSnapshot::with_relays(b, [], [], hops, [from]);
    let stats = Arc::new(PipelineStats::default());
    let relay = StreamRelay::new(Arc::new(ArcSwap::from_pointee(routes)), stats.clone());
    let (conns, _inbound) = Connections::new(4);
    let (tx_c, mut to_c) = ConnQueue::channel(conns.clone());
    let (tx_e, mut to_e) = ConnQueue::channel(conns.clone());
    conns.register(ws_c, tx_c);
    conns.register(tcp_e, tx_e);
    let frame = |dst: [u8; 8], hops: u8| RelayHeader { hop_limit: hops, dst, src: a }.wrap(b"sealed inner datagram");
    let batch = |frames: &[Vec<u8>]| {
        let mut b = Vec::new();
        for f in frames {
            assert!(frame::push(&mut b, f));
        }
        b
    };
    let sent = |q: &mut ConnQueue| -> Vec<Vec<u8>> { std::iter::from_fn(|| q.try_recv()).collect() };
    let hop_limits =
        |b: &[u8]| -> Vec<u8> { frame::frames(b).map(|f| RelayHeader::parse(f.unwrap()).unwrap().hop_limit).collect() };
    // All for C, whose next hop is a WebSocket: the batch goes as it is.
    assert_eq!(relay.forward(&conns, from, batch(&[frame(c, 5), frame(c, MAX_HOPS + 1), frame(c, 255)])), None);
    let got = sent(&mut to_c);
    assert_eq!(got.len(), 1);
    assert_eq!(hop_limits(&got[0]), [4, MAX_HOPS - 1, MAX_HOPS - 1]);
    // Nothing to take: given back untouched.
    let plain = vec![4u8; 40];
    for (what, src, frames) in [
        ("from a stranger", stranger, vec![frame(c, 5)]),
        ("hop limit spent", from, vec![frame(c, 0)]),
        ("a UDP next hop", from, vec![frame(d, 5)]),
        ("no route", from, vec![frame([0x1; 8], 5)]),
        ("for this node and not relayed", from, vec![frame(b, 5), plain.clone()]),
        ("empty", from, vec![]),
    ] {
        let bt = batch(&frames);
        assert_eq!(relay.forward(&conns, src, bt.clone()), Some(bt), "{what}");
    }
    assert!(sent(&mut to_c).is_empty() && sent(&mut to_e).is_empty());
    // Mixed: the relayed frames leave in runs per next hop, in order; the rest stays,
    // in order, untouched.
    let mixed = [frame(c, 5), frame(b, 5), frame(c, 7), frame(e, 3), frame(d, 5), plain.clone(), frame(c, 0)];
    let rest = relay.forward(&conns, from, batch(&mixed)).expect("frames left for the connection RX thread");
    assert_eq!(rest, batch(&[frame(b, 5), frame(d, 5), plain, frame(c, 0)]));
    assert_eq!(sent(&mut to_c).iter().map(|b| hop_limits(b)).collect::<Vec<_>>(), [vec![4, 6]]);
    assert_eq!(sent(&mut to_e).iter().map(|b| hop_limits(b)).collect::<Vec<_>>(), [vec![2]]);
    // Two next hops and nothing else: both taken, nothing left, one batch per hop.
    assert_eq!(relay.forward(&conns, from, batch(&[frame(e, 9), frame(c, 9), frame(e, 9)])), None);
    assert_eq!(sent(&mut to_c).iter().map(|b| hop_limits(b)).collect::<Vec<_>>(), [vec![8]]);
    assert_eq!(sent(&mut to_e).iter().map(|b| hop_limits(b)).collect::<Vec<_>>(), [vec![8, 8]]);
    assert!(stats.drops.nonzero().is_empty(), "the relay counts nothing it gave back");
    // A stream next hop without a connection: taken, and counted as unsendable.
    assert_eq!(relay.forward(&conns, from, batch(&[frame(f, 5), frame(f, 5)])), None);
    assert_eq!(stats.drops.get(DropReason::LinkSend), 2);
    assert_eq!(conns.counters.relayed_batches.load(std::sync::atomic::Ordering::Relaxed), 5, "batches queued");
    assert_eq!(stats.forwarded.load(std::sync::atomic::Ordering::Relaxed), 3 + 3 + 3 + 2, "frames relayed");
    // A sparse flow's small frames (flagged by their sender in the sealed data header)
    // go in the sparse lane of the next connection, in a batch of their own: the
    // writer takes it before the bulk batch queued ahead of it. Flagged but a GSO
    // record, or over RELAY_SPARSE_MAX: bulk, as everything unflagged.
    let data = |flags: u8, tag: u8, len: usize| {
        let mut d = vec![tag; len];
        DataHeader { flags, lane: 0, receiver_index: 7, counter: 1 }.emit(d.first_chunk_mut().unwrap());
        RelayHeader { hop_limit: 5, dst: c, src: a }.wrap(&d)
    };
    let big = weft_datapath::pipeline::RELAY_SPARSE_MAX - RELAY_HEADER_LEN + 1;
    let tags = |b: &[u8]| -> Vec<u8> { frame::frames(b).map(|f| *f.unwrap().last().unwrap()).collect() };
    let mixed = [
        data(0, 1, 40),
        data(FLAG_SPARSE, 2, 40),
        data(0, 3, 40),
        data(FLAG_GSO | FLAG_SPARSE, 4, 40),
        data(FLAG_SPARSE, 5, big - 1),
        data(FLAG_SPARSE, 6, big),
        frame(e, 5),
    ];
    assert_eq!(relay.forward(&conns, from, batch(&mixed)), None);
    let got = sent(&mut to_c);
    assert_eq!(got.iter().map(|b| tags(b)).collect::<Vec<_>>(), [vec![2, 5], vec![1, 3, 4, 6]]);
    assert!(got.iter().all(|b| hop_limits(b).iter().all(|h| *h == 4)), "each frame took one hop");
    assert_eq!(sent(&mut to_e).iter().map(|b| hop_limits(b)).collect::<Vec<_>>(), [vec![4]]);
    assert_eq!(stats.forwarded.load(std::sync::atomic::Ordering::Relaxed), 11 + 7);
    // A batch of sparse frames alone goes whole, in the sparse lane.
    assert_eq!(relay.forward(&conns, from, batch(&[data(0, 7, 40)])), None);
    assert_eq!(relay.forward(&conns, from, batch(&[data(FLAG_SPARSE, 8, 40), data(FLAG_SPARSE, 9, 40)])), None);
    assert_eq!(sent(&mut to_c).iter().map(|b| tags(b)).collect::<Vec<_>>(), [vec![8, 9], vec![7]]);
}

#[test]
fn none_mode_never_confirms_or_delivers_an_untagged_packet() {
    // An outsider that got an IK response (psk2 is only mixed into the response) knows
    // the new session's index from the response header. In the old `none` mode any
    // data packet to that index confirmed the session and was delivered.
    let mut e = ends(Cipher::AuthOnly);
    let held = Arc::new(Session::new(SessionParams {
        local_index: 2,
        remote_index: 1,
        cipher: Cipher::AuthOnly,
        keys: SessionKeys { send: [8; 32], recv: [9; 32] },
        endpoint: "192.0.2.1:11010".parse::<SocketAddr>().unwrap().into(),
        peer_addr: A,
        peer_addr6: None,
        confirmed: false,
        stats: Arc::default(),
    }));
    e.shared_b.routes.store(Arc::new(RouteSnapshot::new([], [held.clone()])));
    let inner = ipv4_packet(A, B, b"let me in");
    let mut forged = Vec::new();
    for tail in [&[][..], &[0u8; 16][..]] {
        let mut d = vec![4u8, 0, 0, 0, 2, 0, 0, 0];
        d.extend_from_slice(&7u64.to_le_bytes());
        d.extend_from_slice(&inner);
        d.extend_from_slice(tail);
        forged.push(d);
    }
    // A packet sealed by a member under another session's key fails too.
    forged.extend(seal(&mut e, std::slice::from_ref(&inner), &DropCounters::default()));
    assert!(deliver(&mut e, &forged).is_empty(), "nothing reaches the TUN");
    assert!(!held.is_confirmed(), "the held session stays unconfirmed");
    assert!(e.sink.0.lock().iter().all(|ev| !matches!(ev, ControlEvent::Confirmed { .. })));
    assert_eq!(held.stats.drops.get(DropReason::AuthFailed), 3);
}

#[test]
fn keys_older_than_reject_after_time_never_seal_or_open() {
    let mut e = ends(Cipher::Aes128Gcm);
    e.a_to_b.set_created_ms(1);
    e.b_from_a.set_created_ms(1);
    let drops = DropCounters::default();
    let fresh = seal(&mut e, &[ipv4_packet(A, B, b"young")], &drops);
    assert_eq!(fresh.len(), 1);
    // TX at the limit: nothing sealed, counted on the peer.
    let (bufs, sizes) = e.tx.buffers();
    let p = ipv4_packet(A, B, b"old");
    bufs[0][TX_HEADROOM..TX_HEADROOM + p.len()].copy_from_slice(&p);
    sizes[0] = p.len();
    e.tx.process(&e.routes_a, &drops, 1, 1 + weft_core::session::REJECT_AFTER_MS);
    assert!(e.tx.outgoing().1.is_empty());
    assert_eq!(e.a_to_b.stats.drops.get(DropReason::KeyExpired), 1);
    // RX at the limit: a packet sealed in time is refused all the same.
    let (slab, slot, metas) = e.rx.slab();
    slab[..fresh[0].len()].copy_from_slice(&fresh[0]);
    metas[0] = RecvMeta::whole("192.0.2.1:11010".parse().unwrap(), fresh[0].len());
    let _ = slot;
    let routes = e.shared_b.routes.load();
    let mut out = Collect(Vec::new());
    e.rx.process(&routes, &e.shared_b, &e.stats_b, 1, 1 + weft_core::session::REJECT_AFTER_MS, &mut out);
    assert!(out.0.is_empty());
    assert_eq!(e.b_from_a.stats.drops.get(DropReason::KeyExpired), 1);
    // The same packet a moment earlier opens.
    let more = seal(&mut e, &[ipv4_packet(A, B, b"young again")], &drops);
    assert_eq!(deliver(&mut e, &more).len(), 1);
}

/// A TCP/IPv4 super-packet from `src` to B as a TUN with offload returns it: a virtio
/// header, then `segs` segments' worth of payload behind one IP and TCP header.
fn super_packet(src: Ipv4Addr, mss: usize, segs: usize) -> Vec<u8> {
    let payload = mss * segs;
    let mut p = vec![0u8; 10 + 40 + payload];
    // flags NEEDS_CSUM, gso_type TCPV4, hdr_len 40, gso_size, csum_start 20, csum_offset 16 (host order).
    p[0] = 1;
    p[1] = 1;
    p[2..4].copy_from_slice(&40u16.to_ne_bytes());
    p[4..6].copy_from_slice(&(mss as u16).to_ne_bytes());
    p[6..8].copy_from_slice(&20u16.to_ne_bytes());
    p[8..10].copy_from_slice(&16u16.to_ne_bytes());
    let ip = &mut p[10..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&B.octets());
    ip[32] = 5 << 4;
    for (i, b) in ip[40..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    p
}

/// Puts `sp` in A's raw TUN buffer and seals it as one record, if A does.
fn seal_super(e: &mut Ends, sp: &[u8]) -> Option<(Endpoint, Vec<u8>, u64)> {
    e.tx.raw_buffer()[..sp.len()].copy_from_slice(sp);
    let (packets, _) = e.tx.seal_super(&e.routes_a, sp.len(), 1)?;
    let (to, rec) = e.tx.super_record().unwrap();
    Some((to, rec.to_vec(), packets))
}

#[test]
fn a_super_packet_crosses_a_reliable_connection_as_one_record() {
    let tcp = Endpoint::new(Proto::Tcp, "192.0.2.2:11010".parse().unwrap());
    for cipher in Cipher::ALL {
        let mut e = ends_over(cipher, tcp, true);
        e.a_to_b.set_peer_gso(true);
        let sp = super_packet(A, 1380, 40);
        let mut expected = vec![Vec::new(); 64];
        let n = gso::split_into(&mut sp.clone(), &mut expected).unwrap();
        assert_eq!(n, 40);
        let (to, mut rec, packets) = seal_super(&mut e, &sp).unwrap();
        assert_eq!((to, packets), (tcp, 40));
        assert!(rec.len() > 1380 * 40 && rec.len() <= u16::MAX as usize, "{cipher}: one record, one frame");
        if cipher.encrypts() {
            assert!(!rec.windows(64).any(|w| w == &sp[200..264]), "plaintext leaked");
        }
        // B's connection RX gets it larger than a slot: opened where it lies and, with no
        // offload on B's TUN, split into the segments the kernel would have sent.
        let routes = e.shared_b.routes.load();
        let mut out = Collect(Vec::new());
        let from = Endpoint::new(Proto::Tcp, "192.0.2.1:11010".parse().unwrap());
        e.rx.process_big(&routes, &e.shared_b, &e.stats_b, from, &mut rec, 1, &mut out, None);
        let want: Vec<Vec<u8>> = expected[..n].iter().map(|b| b[10..].to_vec()).collect();
        assert_eq!(out.0, want, "{cipher}");
        let rx = e.b_from_a.stats.rx_packets.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(rx, 40);
        assert_eq!(e.a_to_b.stats.tx_packets.load(std::sync::atomic::Ordering::Relaxed), 40);
        // The same record again is a replay.
        let mut again = Collect(Vec::new());
        e.rx.process_big(&routes, &e.shared_b, &e.stats_b, from, &mut rec, 1, &mut again, None);
        assert!(again.0.is_empty());
    }
}

/// Packets to a connection are put in its send queue's lanes by their flow's rate: a
/// download's records are bulk once it has moved 64 KiB; a ping or a game packet
/// beside it is sparse (taken first).
#[test]
fn packets_to_a_connection_take_the_lane_of_their_flows_rate() {
    use weft_datapath::transport::Lane;
    let tcp = Endpoint::new(Proto::Tcp, "192.0.2.2:11010".parse().unwrap());
    let mut e = ends_over(Cipher::Aes128Gcm, tcp, true);
    e.a_to_b.set_peer_gso(true);
    let lanes = |e: &Ends| e.tx.outgoing().1.iter().map(|o| o.lane).collect::<Vec<_>>();
    // A download's super-packets: the first is sparse (the flow has just started),
    // the next ones bulk.
    let sp = super_packet(A, 1380, 40);
    let got: Vec<Lane> = (0..3)
        .map(|_| {
            seal_super(&mut e, &sp).unwrap();
            lanes(&e)[0]
        })
        .collect();
    assert_eq!(got, [Lane::Sparse, Lane::Bulk, Lane::Bulk]);
    // A batch read beside it: its segments (split, not as a record), a ping-sized
    // UDP packet and a game packet of another flow: only the download's are bulk.
    let mut seg = sp[10..10 + 40 + 1380].to_vec();
    seg[2..4].copy_from_slice(&(40u16 + 1380).to_be_bytes());
    let mut game = ipv4_packet(A, B, &[0x1e, 0x61, 0x23, 0x28, 0, 108, 0, 0]);
    game.resize(128, 7);
    let ping = ipv4_packet(A, B, &[0x30, 0x39, 0, 53, 0, 28, 0, 0, 1, 2, 3, 4]);
    let drops = DropCounters::default();
    assert_eq!(seal(&mut e, &[seg.clone(), ping, seg.clone(), game], &drops).len(), 4);
    assert_eq!(lanes(&e), [Lane::Bulk, Lane::Sparse, Lane::Bulk, Lane::Sparse]);
}

/// The RX thread reads its TUN queue for the kernel's answers only after a batch that
/// wrote packets, all of sparse flows: a ping's, or a download's first 64 KiB; never
/// after a batch with a bulk flow's packets (their ACKs are the TX thread's), one with
/// a bare ACK (an upload's: the kernel answers it with the upload's next data) or one
/// that wrote nothing.
#[test]
fn rx_looks_for_answers_only_after_writing_sparse_flows_alone() {
    let mut e = ends(Cipher::Aes128Gcm);
    let drops = DropCounters::default();
    let ping = ipv4_packet(A, B, &[0x30, 0x39, 0, 53, 0, 28, 0, 0, 1, 2, 3, 4]);
    let dgrams = seal(&mut e, std::slice::from_ref(&ping), &drops);
    assert_eq!(deliver(&mut e, &dgrams).len(), 1);
    assert!(e.rx.wrote_sparse_only(), "a ping alone");
    let mut seg = super_packet(A, 1380, 1)[10..10 + 40 + 1380].to_vec();
    seg[2..4].copy_from_slice(&(40u16 + 1380).to_be_bytes());
    complete_tcp_checksum(&mut seg);
    let dgrams = seal(&mut e, &vec![seg.clone(); 46], &drops);
    assert_eq!(deliver(&mut e, &dgrams).len(), 46);
    assert!(e.rx.wrote_sparse_only(), "a download's first 46 segments (under 64 KiB): a flow just started");
    let dgrams = seal(&mut e, &[seg.clone(), ping.clone(), seg], &drops);
    assert_eq!(deliver(&mut e, &dgrams).len(), 3);
    assert!(!e.rx.wrote_sparse_only(), "the download is bulk now, beside the ping");
    assert!(deliver(&mut e, &[vec![4u8; 80]]).is_empty());
    assert!(!e.rx.wrote_sparse_only(), "nothing written");
    let mut ack = super_packet(A, 1380, 1)[10..10 + 40].to_vec();
    ack[2..4].copy_from_slice(&40u16.to_be_bytes());
    ack[20..24].copy_from_slice(&[0x1f, 0x90, 0x30, 0x39]);
    complete_tcp_checksum(&mut ack);
    let dgrams = seal(&mut e, &[ack.clone(), ack], &drops);
    assert_eq!(deliver(&mut e, &dgrams).len(), 2);
    assert!(!e.rx.wrote_sparse_only(), "an upload's ACKs, a few bytes each");
    let dgrams = seal(&mut e, &[ping], &drops);
    assert_eq!(deliver(&mut e, &dgrams).len(), 1);
    assert!(e.rx.wrote_sparse_only(), "the ping again");
}

/// A sparse flow's packets are flagged ([`FLAG_SPARSE`]): over UDP for the receiver to
/// steer to another socket than the session's bulk (lane `Sparse` so that no GSO run
/// mixes them), on every transport for relays to keep them in the sparse lane: a ping
/// and a game packet beside a download are, the download's segments past 64 KiB are
/// not, and neither is a bare ACK (it answers a download).
#[test]
fn packets_of_sparse_flows_are_flagged_for_steering_and_relays() {
    use weft_datapath::transport::Lane;
    let mut u = ends_over(Cipher::Aes128Gcm, "192.0.2.2:11010".parse::<SocketAddr>().unwrap().into(), false);
    let sp = super_packet(A, 1380, 60);
    let mut seg = sp[10..10 + 40 + 1380].to_vec();
    seg[2..4].copy_from_slice(&(40u16 + 1380).to_be_bytes());
    let mut ack = sp[10..10 + 40].to_vec();
    ack[2..4].copy_from_slice(&40u16.to_be_bytes());
    // Another flow's (its ports), with no data and no SYN, FIN or RST.
    ack[20..24].copy_from_slice(&[0x1f, 0x90, 0x30, 0x39]);
    let mut game = ipv4_packet(A, B, &[0x1e, 0x61, 0x23, 0x28, 0, 108, 0, 0]);
    game.resize(128, 7);
    let ping = ipv4_packet(A, B, &[0x30, 0x39, 0, 53, 0, 28, 0, 0, 1, 2, 3, 4]);
    let drops = DropCounters::default();
    let flagged =
        |d: &[Vec<u8>]| d.iter().map(|d| DataHeader::parse(d).unwrap().flags & FLAG_SPARSE != 0).collect::<Vec<_>>();
    // The download's first 46 segments (under 64 KiB) are a flow just started.
    let first = seal(&mut u, &vec![seg.clone(); 46], &drops);
    assert!(flagged(&first).iter().all(|f| *f));
    let batch = [seg.clone(), ping, seg.clone(), game, ack.clone()];
    let sealed = seal(&mut u, &batch, &drops);
    assert_eq!(flagged(&sealed), [false, true, false, true, false]);
    let lanes: Vec<Lane> = u.tx.outgoing().1.iter().map(|o| o.lane).collect();
    assert_eq!(lanes, [Lane::Bulk, Lane::Sparse, Lane::Bulk, Lane::Sparse, Lane::Bulk]);
    // Over a connection the flag is set alike (relays read it to pick the lane they
    // pass a frame on in), and the lanes are the send queue's: a bare ACK keeps the
    // sparse one of a flow just started.
    let tcp = Endpoint::new(Proto::Tcp, "192.0.2.2:11010".parse().unwrap());
    let mut t = ends_over(Cipher::Aes128Gcm, tcp, false);
    let ping = ipv4_packet(A, B, &[0x30, 0x39, 0, 53, 0, 28, 0, 0, 1, 2, 3, 4]);
    let sealed = seal(&mut t, &[ping, ack], &drops);
    assert_eq!(flagged(&sealed), [true, false]);
    let lanes: Vec<Lane> = t.tx.outgoing().1.iter().map(|o| o.lane).collect();
    assert_eq!(lanes, [Lane::Sparse, Lane::Sparse]);
}

#[test]
fn super_packets_are_split_where_a_record_cannot_carry_them() {
    let tcp = Endpoint::new(Proto::Tcp, "192.0.2.2:11010".parse().unwrap());
    let udp = Endpoint::udp("192.0.2.2:11010".parse().unwrap());
    let quic = Endpoint::new(Proto::Quic, "192.0.2.2:11010".parse().unwrap());
    let sp = super_packet(A, 1380, 10);
    // Over UDP or QUIC, or to a peer whose hello did not offer it: split as before.
    for ep in [udp, quic] {
        let mut e = ends_over(Cipher::Aes128Gcm, ep, true);
        e.a_to_b.set_peer_gso(true);
        assert!(seal_super(&mut e, &sp).is_none(), "{ep}");
    }
    let mut e = ends_over(Cipher::Aes128Gcm, tcp, true);
    assert!(seal_super(&mut e, &sp).is_none(), "peer without GSO records");
    e.a_to_b.set_peer_gso(true);
    // Not a super-packet (gso_type none), or too large for one frame.
    let mut plain = sp.clone();
    plain[1] = 0;
    assert!(seal_super(&mut e, &plain).is_none());
    let big = super_packet(A, 1091, 60);
    assert!(big.len() + 32 > u16::MAX as usize);
    assert!(seal_super(&mut e, &big).is_none());
    // More segments than a receiver splits into (a small MSS).
    assert!(seal_super(&mut e, &super_packet(A, 500, 65)).is_none());
    assert!(seal_super(&mut e, &super_packet(A, 500, 64)).is_some());
    assert!(seal_super(&mut e, &sp).is_some());
}

/// An IPv4 TCP segment from A to B with `data` as payload (a bare ACK when empty).
fn tcp_segment(data: &[u8]) -> Vec<u8> {
    let mut tcp = vec![0u8; 20];
    tcp[12] = 5 << 4;
    tcp[13] = 0x10;
    tcp.extend_from_slice(data);
    let mut p = ipv4_packet(A, B, &tcp);
    p[9] = 6;
    p
}

#[test]
fn a_measured_path_mtu_answers_packets_too_big_and_clamps_the_mss_of_syns() {
    let mut e = ends(Cipher::Aes128Gcm);
    e.a_to_b.set_path_mtu(1220);
    // A SYN offering an MSS of 1460.
    let mut tcp = vec![0u8; 24];
    tcp[12] = 6 << 4;
    tcp[13] = 0x02;
    tcp[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]);
    let mut syn = ipv4_packet(A, B, &tcp);
    syn[9] = 6;
    complete_tcp_checksum(&mut syn);
    // 1400 bytes with "don't fragment", and 1000 bytes with it.
    let mut big = ipv4_packet(A, B, &[7u8; 1380]);
    big[6] = 0x40;
    let mut fits = ipv4_packet(A, B, &[8u8; 980]);
    fits[6] = 0x40;
    let drops = DropCounters::default();
    let dgrams = seal(&mut e, &[syn, big.clone(), fits.clone()], &drops);
    assert_eq!(dgrams.len(), 2, "the packet too big for the path was sent");
    assert_eq!(e.a_to_b.stats.drops.get(DropReason::TooBig), 1);
    // Its sender is told the size that passes: ICMP "fragmentation needed", MTU 1220,
    // quoting the packet's header.
    let answers = e.tx.too_big_answers().to_vec();
    assert_eq!(answers.len(), 1);
    let icmp = &answers[0];
    assert_eq!((icmp[9], icmp[20], icmp[21]), (1, 3, 4));
    assert_eq!(&icmp[16..20], &A.octets(), "not addressed to the sender");
    assert_eq!(u16::from_be_bytes([icmp[26], icmp[27]]), 1220);
    assert_eq!(&icmp[28..48], &big[..20]);
    // The SYN arrives with the MSS that fits the path (1220 less 40 bytes of headers),
    // its checksum right; the packet that fits arrives as it was.
    let got = deliver(&mut e, &dgrams);
    assert_eq!(got.len(), 2);
    assert_eq!(&got[0][40..44], &[2, 4, (1180u16 >> 8) as u8, 1180u16 as u8]);
    let mut again = got[0].clone();
    complete_tcp_checksum(&mut again);
    assert_eq!(again, got[0], "the clamped SYN's checksum is wrong");
    assert_eq!(got[1], fits);
    // Without a measured MTU (0: the path carries the TUN's) nothing is clamped.
    e.a_to_b.set_path_mtu(0);
    let dgrams = seal(&mut e, &[big.clone()], &drops);
    assert_eq!(dgrams.len(), 1);
    assert!(e.tx.too_big_answers().is_empty());
}

#[test]
fn tcp_data_keeps_behind_the_records_on_a_quic_stream() {
    let quic = Endpoint::new(Proto::Quic, "192.0.2.2:11010".parse().unwrap());
    let udp = Endpoint::udp("192.0.2.2:11010".parse().unwrap());
    let drops = DropCounters::default();
    let packets = [tcp_segment(b"in order"), tcp_segment(b""), ipv4_packet(A, B, b"any order")];
    let flags = |d: &[Vec<u8>]| d.iter().map(|d| DataHeader::parse(d).unwrap().flags).collect::<Vec<_>>();

    // A node that sends records over QUIC to a peer that takes them there: its TCP
    // data goes on the stream with them; a bare ACK and a UDP datagram do not.
    let mut e = ends_over(Cipher::Aes128Gcm, quic, true);
    e.a_to_b.set_peer_gso(true);
    e.a_to_b.set_peer_gso_quic(true);
    let out = seal(&mut e, &packets, &drops);
    assert_eq!(flags(&out), [FLAG_ORDERED, 0, FLAG_SPARSE]);
    assert_eq!(out.iter().map(|d| on_quic_stream(d)).collect::<Vec<_>>(), [true, false, false]);
    // The flag is authenticated (set on the way, the ACK does not open), and the peer
    // opens the segment as any other.
    let mut forged = out[1].clone();
    forged[1] |= FLAG_ORDERED;
    assert!(deliver(&mut e, &[forged]).is_empty(), "a flag set on the way opened");
    assert_eq!(deliver(&mut e, &out), packets);

    // Where no records go, nothing is held to their order: a node without TUN offload,
    // a peer that does not take records over QUIC, a UDP path.
    let no_offload = ends_over(Cipher::Aes128Gcm, quic, false);
    no_offload.a_to_b.set_peer_gso(true);
    no_offload.a_to_b.set_peer_gso_quic(true);
    let no_quic_records = ends_over(Cipher::Aes128Gcm, quic, true);
    no_quic_records.a_to_b.set_peer_gso(true);
    let over_udp = ends_over(Cipher::Aes128Gcm, udp, true);
    over_udp.a_to_b.set_peer_gso(true);
    over_udp.a_to_b.set_peer_gso_quic(true);
    for (what, mut e) in [("no offload", no_offload), ("no records over QUIC", no_quic_records), ("UDP", over_udp)] {
        let ordered: Vec<u8> = flags(&seal(&mut e, &packets, &drops)).iter().map(|f| f & FLAG_ORDERED).collect();
        assert_eq!(ordered, [0, 0, 0], "{what}");
    }
    // Nor through a relay over QUIC: the relay forwards records to stream hops only.
    let mut relayed = ends_over(Cipher::Aes128Gcm, quic, true);
    relayed.a_to_b.set_peer_gso(true);
    relayed.a_to_b.set_peer_gso_quic(true);
    let header = RelayHeader { hop_limit: MAX_HOPS, dst: [0xb; 8], src: [0xa; 8] };
    let route = weft_core::route::Route {
        session: relayed.a_to_b.clone(),
        target: quic,
        relay: Some(header),
        relay_streams: true,
    };
    relayed.routes_a = RouteSnapshot::with_relays([0xa; 8], [(B.into(), route)], [relayed.a_to_b.clone()], [], []);
    let out = seal(&mut relayed, &packets, &drops);
    assert_eq!(out.len(), 3);
    for d in &out {
        assert!(!on_quic_stream(d), "a relayed frame on the stream");
        let inner = &d[RELAY_HEADER_LEN..];
        assert_eq!(DataHeader::parse(inner).unwrap().flags & FLAG_ORDERED, 0);
    }
}

#[test]
fn hostile_super_packets_are_dropped_and_counted() {
    let tcp = Endpoint::new(Proto::Tcp, "192.0.2.2:11010".parse().unwrap());
    let from = Endpoint::new(Proto::Tcp, "192.0.2.1:11010".parse().unwrap());
    let mut e = ends_over(Cipher::ChaCha20Poly1305, tcp, true);
    e.a_to_b.set_peer_gso(true);
    // A spoofed inner source, then a header that does not match its packet (sealed by
    // a member, so it authenticates): neither reaches the TUN.
    let (_, mut spoofed, _) = seal_super(&mut e, &super_packet(Ipv4Addr::new(10, 0, 0, 77), 1380, 10)).unwrap();
    let mut bad = super_packet(A, 1380, 10);
    bad[6..8].copy_from_slice(&4u16.to_ne_bytes());
    e.tx.raw_buffer()[..bad.len()].copy_from_slice(&bad);
    // seal_super checks the header itself: seal this one by hand as a member could.
    assert!(e.tx.seal_super(&e.routes_a, bad.len(), 1).is_none());
    let mut forged = vec![0u8; 16 + bad.len() + 16];
    forged[16..16 + bad.len()].copy_from_slice(&bad);
    let n = e.a_to_b.seal_with_flags(&mut forged, bad.len(), FLAG_GSO).unwrap();
    forged.truncate(n);
    let routes = e.shared_b.routes.load();
    let mut out = Collect(Vec::new());
    e.rx.process_big(&routes, &e.shared_b, &e.stats_b, from, &mut spoofed, 1, &mut out, None);
    e.rx.process_big(&routes, &e.shared_b, &e.stats_b, from, &mut forged, 1, &mut out, None);
    assert!(out.0.is_empty());
    assert_eq!(e.b_from_a.stats.drops.get(DropReason::Spoofed), 1);
    assert_eq!(e.stats_b.drops.get(DropReason::Malformed), 1);
    // A plain packet over a slot's size is malformed too.
    let drops = DropCounters::default();
    let mut e = ends(Cipher::Aes128Gcm);
    let mut big = seal(&mut e, &[ipv4_packet(A, B, &[7u8; 1300])], &drops).remove(0);
    big.resize(big.len(), 0);
    let routes = e.shared_b.routes.load();
    e.rx.process_big(
        &routes,
        &e.shared_b,
        &e.stats_b,
        "192.0.2.1:11010".parse::<SocketAddr>().unwrap().into(),
        &mut big,
        1,
        &mut out,
        None,
    );
    assert_eq!(e.b_from_a.stats.drops.get(DropReason::Malformed), 1);
    assert!(out.0.is_empty());
}

#[test]
fn gso_records_cross_relays_only_where_every_link_is_a_stream() {
    use weft_core::route::Route;
    const C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
    let (id_a, id_b, id_c) = ([0xa; 8], [0xb; 8], [0xc; 8]);
    let tcp_b = Endpoint::new(Proto::Tcp, "192.0.2.2:11010".parse().unwrap());
    let tcp_a = Endpoint::new(Proto::Tcp, "192.0.2.1:40000".parse().unwrap());
    for (streams, next, forwarded) in [
        (true, Endpoint::new(Proto::Ws, "192.0.2.3:11011".parse().unwrap()), true),
        (true, Endpoint::udp("192.0.2.3:11010".parse().unwrap()), false),
        (false, Endpoint::new(Proto::Tcp, "192.0.2.3:11010".parse().unwrap()), false),
    ] {
        let mut e = ends_over(Cipher::Aes128Gcm, tcp_b, true);
        e.a_to_b.set_peer_gso(true);
        // A's route to C goes through B; `streams` says whether the records show every
        // link on it as a stream.
        let header = RelayHeader { hop_limit: MAX_HOPS, dst: id_c, src: id_a };
        let route = Route { session: e.a_to_b.clone(), target: tcp_b, relay: Some(header), relay_streams: streams };
        e.routes_a = RouteSnapshot::with_relays(id_a, [(C.into(), route)], [e.a_to_b.clone()], [], []);
        let mut sp = super_packet(A, 1380, 20);
        sp[10 + 16..10 + 20].copy_from_slice(&C.octets());
        let Some((to, mut rec, _)) = seal_super(&mut e, &sp) else {
            assert!(!streams, "a path of streams carries the record");
            continue;
        };
        assert_eq!(to, tcp_b);
        assert_eq!(RelayHeader::parse(&rec).unwrap().dst, id_c, "the record starts with the relay header");
        // B relays it unopened where its next hop to C is a stream, and drops it before
        // a UDP hop that could not carry it.
        let routes_b = RouteSnapshot::with_relays(id_b, [], [], [(id_c, next)], [tcp_a]);
        let mut out = Collect(Vec::new());
        let got = e.rx.process_big(&routes_b, &e.shared_b, &e.stats_b, tcp_a, &mut rec, 1, &mut out, None);
        assert_eq!(got.is_some(), forwarded, "{next}");
        assert!(out.0.is_empty());
        if !forwarded {
            assert_eq!(e.stats_b.drops.get(DropReason::LinkSend), 1);
        }
    }
}

/// Stands in for a TUN with offload: coalesces like the real write (tun-rs GRO) and
/// keeps the length and bytes of every buffer after it.
struct Gro(Vec<Vec<u8>>);

impl TunWriter for Gro {
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> std::io::Result<()> {
        gro.apply_gro(bufs, 10, false)?;
        self.0.extend(bufs.iter().map(|b| b[10..].to_vec()));
        Ok(())
    }
}

/// B's RX opens `dgrams` as one received batch and writes through tun-rs's GRO.
fn gro_receive(e: &mut Ends, dgrams: &[Vec<u8>]) -> Gro {
    let (slab, slot, metas) = e.rx.slab();
    for (i, d) in dgrams.iter().enumerate() {
        slab[i * slot..i * slot + d.len()].copy_from_slice(d);
        metas[i] = RecvMeta::whole("192.0.2.1:11010".parse().unwrap(), d.len());
    }
    let routes = e.shared_b.routes.load();
    let mut out = Gro(Vec::new());
    e.rx.process(&routes, &e.shared_b, &e.stats_b, dgrams.len(), 1, &mut out);
    out
}

/// Seals `flows` TCP flows of `segs` full segments each (ports from `port0`),
/// interleaved segment by segment, as one batch from A; B opens it and writes through
/// tun-rs's GRO. Checks that each flow comes out as one super-packet holding every
/// byte in order.
fn gro_one_super_packet_per_flow(e: &mut Ends, port0: u16, flows: u16, segs: usize) {
    let mss = 1380;
    let mut all = Vec::new();
    for port in port0..port0 + flows {
        let mut sp = super_packet(A, mss, segs);
        sp[10 + 20..10 + 22].copy_from_slice(&port.to_be_bytes());
        sp[10 + 33] = 0x10; // ACK: GRO coalesces only data segments with ACK (and PSH) set
        for (i, b) in sp[10 + 40..].iter_mut().enumerate() {
            *b = (i as u16 % 241).wrapping_add(port) as u8;
        }
        let mut parts = vec![Vec::new(); 64];
        let n = gso::split_into(&mut sp, &mut parts).unwrap();
        assert_eq!(n, segs);
        all.push(parts[..n].iter().map(|b| b[10..].to_vec()).collect::<Vec<_>>());
    }
    let interleaved: Vec<Vec<u8>> = (0..segs).flat_map(|s| all.iter().map(move |f| f[s].clone())).collect();
    let dgrams = seal(e, &interleaved, &DropCounters::default());
    assert_eq!(dgrams.len(), usize::from(flows) * segs);
    let out = gro_receive(e, &dgrams);
    let whole: Vec<&Vec<u8>> = out.0.iter().filter(|b| b.len() == 40 + mss * segs).collect();
    assert_eq!(whole.len(), usize::from(flows), "one super-packet per flow");
    for (sp, flow) in whole.iter().zip(&all) {
        let payload: Vec<u8> = flow.iter().flat_map(|p| p[40..].iter().copied()).collect();
        assert_eq!(&sp[20..22], &flow[0][20..22], "flows in order of their first packet");
        assert_eq!(&sp[40..], &payload[..], "every byte of the flow, in order");
    }
}

/// RX keeps one packet's room per slot and moves each flow's first packet into a
/// large buffer before the write: three interleaved TCP flows of 20 segments each are
/// still coalesced into three super-packets holding every byte in order.
#[test]
fn rx_coalesces_interleaved_flows_into_one_super_packet_each() {
    let mut e = ends(Cipher::Aes128Gcm);
    e.rx = Rx::new(PipelineConfig { mtu: 1420, offload: true, udp_gro: false, pin: None });
    gro_one_super_packet_per_flow(&mut e, 40000, 3, 20);
}

/// The GRO table (tun-rs, patched: third_party/tun-rs/WEFT.md) starts without per-flow
/// item lists, makes them as flows appear and keeps them for later batches: batch after
/// batch, with more flows than before and then fewer, every flow still comes out whole.
#[test]
fn gro_flow_lists_are_made_on_demand_and_serve_later_batches() {
    let mut e = ends(Cipher::Aes128Gcm);
    e.rx = Rx::new(PipelineConfig { mtu: 1420, offload: true, udp_gro: false, pin: None });
    for (port0, flows, segs) in [(40000, 1, 40), (41000, 6, 10), (42000, 2, 30), (43000, 12, 5), (44000, 6, 10)] {
        gro_one_super_packet_per_flow(&mut e, port0, flows, segs);
    }
}

/// A flow whose segments add up to just over 64 KiB: 47 full segments of 1380 bytes
/// and a short one of 676 make 65 536 bytes of data. TUN GRO checks only a head's
/// room, so a head with a few bytes more than 65 535 took all 48 and the IP length
/// wrapped (the kernel dropped the super-packet: a no-TUN sender stalled for seconds).
/// Every packet written is now at most 65 535 bytes, its length field true, and the
/// flow's bytes all there, in order.
#[test]
fn rx_never_coalesces_past_the_ip_length_limit() {
    let mut e = ends(Cipher::Aes128Gcm);
    e.rx = Rx::new(PipelineConfig { mtu: 1420, offload: true, udp_gro: false, pin: None });
    let mut segments = Vec::new();
    for (mss, segs, seq) in [(1380usize, 47usize, 0u32), (676, 1, 47 * 1380)] {
        let mut sp = super_packet(A, mss, segs);
        sp[10 + 24..10 + 28].copy_from_slice(&seq.to_be_bytes());
        sp[10 + 33] = 0x10; // ACK
        for (i, b) in sp[10 + 40..].iter_mut().enumerate() {
            *b = ((seq as usize + i) % 253) as u8;
        }
        let mut parts = vec![Vec::new(); 64];
        let n = gso::split_into(&mut sp, &mut parts).unwrap();
        segments.extend(parts[..n].iter().map(|b| b[10..].to_vec()));
    }
    assert_eq!(segments.len(), 48);
    let sent: Vec<u8> = segments.iter().flat_map(|p| p[40..].iter().copied()).collect();
    assert_eq!(sent.len(), 65_536);
    let dgrams = seal(&mut e, &segments, &DropCounters::default());
    let out = gro_receive(&mut e, &dgrams);
    // The writer sees every buffer, also those GRO merged into a head (they keep
    // their bytes): take each packet that starts where the flow is so far.
    assert!(out.0[0].len() > 40 * 1420, "coalesced: {} bytes", out.0[0].len());
    let mut got = Vec::new();
    for p in &out.0 {
        assert!(p.len() <= usize::from(u16::MAX), "{} bytes in one IP packet", p.len());
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len(), "IP length field");
        let seq = u32::from_be_bytes([p[24], p[25], p[26], p[27]]) as usize;
        if seq == got.len() {
            got.extend_from_slice(&p[40..]);
        }
    }
    assert!(got == sent, "every byte of the flow, in order");
}

/// `segs` segments of `mss` bytes of one flow from A to B, as tun-rs's GRO sees them: a
/// zeroed virtio header, then the packet (checksums computed by [`gso::split_into`]),
/// each in a buffer with room for a whole super-packet. TCP with `udp` false, else UDP.
fn gro_segments(udp: bool, mss: usize, segs: usize) -> Vec<Vec<u8>> {
    let hdr = if udp { 28 } else { 40 };
    let mut sp = super_packet(A, mss, segs);
    if udp {
        // gso_type UDP_L4, hdr_len 28, checksum at offset 6 of the UDP header.
        sp[1] = 5;
        sp[2..4].copy_from_slice(&28u16.to_ne_bytes());
        sp[8..10].copy_from_slice(&6u16.to_ne_bytes());
        sp.drain(10 + 28..10 + 40);
        sp[10 + 2..10 + 4].copy_from_slice(&((28 + mss * segs) as u16).to_be_bytes());
        sp[10 + 9] = 17;
        sp[10 + 24..10 + 26].copy_from_slice(&((8 + mss * segs) as u16).to_be_bytes());
    } else {
        sp[10 + 33] = 0x10; // ACK
    }
    for (i, b) in sp[10 + hdr..].iter_mut().enumerate() {
        *b = (i % 239) as u8;
    }
    let mut parts = vec![Vec::new(); 64];
    let n = gso::split_into(&mut sp, &mut parts).unwrap();
    assert_eq!(n, segs);
    parts[..n].iter().map(|p| roomy(&[&[0; 10], &p[10..]].concat())).collect()
}

/// A copy of `b` with room for a whole super-packet (a clone has only `b`'s length).
fn roomy(b: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(2 * 10 + usize::from(u16::MAX));
    r.extend_from_slice(b);
    r
}

/// Checks that `buf` (virtio header, then an IP packet) carries `payload` behind
/// `hdr` bytes of headers, with a true IP length.
fn assert_carries(buf: &[u8], hdr: usize, payload: &[u8], what: &str) {
    let p = &buf[10..];
    assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len(), "{what}: IP length field");
    assert_eq!(p.len(), hdr + payload.len(), "{what}: length");
    assert!(&p[hdr..] == payload, "{what}: every byte, in order");
}

/// tun-rs's GRO (patched: it borrows each packet where it lies instead of copying it,
/// third_party/tun-rs/WEFT.md) on buffers with room to grow: a TCP segment arriving
/// before the one it precedes is prepended; one with a wrong checksum is never merged
/// (nor what follows it into its place), so the kernel still sees and drops it; a UDP
/// flow's datagrams become one.
#[test]
fn gro_prepends_refuses_bad_checksums_and_coalesces_udp() {
    let mss = 1000;
    let pay = |p: &Vec<u8>, hdr: usize| p[10 + hdr..].to_vec();
    // TCP, the first two segments swapped: one packet of all five, in order.
    let segs = gro_segments(false, mss, 5);
    let whole: Vec<u8> = segs.iter().flat_map(|p| pay(p, 40)).collect();
    let mut bufs: Vec<Vec<u8>> = [1, 0, 2, 3, 4].iter().map(|&i| roomy(&segs[i])).collect();
    GROTable::new().apply_gro(&mut bufs, 10, false).unwrap();
    assert_carries(&bufs[0], 40, &whole, "prepended then appended");
    assert_ne!(bufs[0][1], 0, "the head is written as a TCP super-packet");
    // TCP, the third segment corrupted: the first two merge, the third stays as it was
    // (its bytes and its bad checksum), the fourth cannot follow the second.
    let mut bufs: Vec<Vec<u8>> = segs[..4].iter().map(|p| roomy(p)).collect();
    bufs[2][10 + 40 + 7] ^= 0x55;
    let corrupted = bufs[2].clone();
    GROTable::new().apply_gro(&mut bufs, 10, false).unwrap();
    let first_two: Vec<u8> = segs[..2].iter().flat_map(|p| pay(p, 40)).collect();
    assert_carries(&bufs[0], 40, &first_two, "the two good segments");
    assert_eq!(bufs[2], corrupted, "the corrupted segment, untouched");
    assert_carries(&bufs[3], 40, &pay(&segs[3], 40), "the segment after it, alone");
    // UDP GRO: four datagrams of one flow become one.
    let dgrams = gro_segments(true, mss, 4);
    let whole: Vec<u8> = dgrams.iter().flat_map(|p| pay(p, 28)).collect();
    let mut bufs: Vec<Vec<u8>> = dgrams.iter().map(|p| roomy(p)).collect();
    GROTable::new().apply_gro(&mut bufs, 10, true).unwrap();
    assert_carries(&bufs[0], 28, &whole, "UDP datagrams coalesced");
    assert_eq!(bufs[0][1], 5, "the head is written as a UDP_L4 super-packet");
}
