//! Criterion benches of the data path: AEAD per cipher and size, replay checks,
//! snapshot lookups, TUN GSO split and GRO coalescing of a 64 KiB super-packet, and
//! the in-memory TX and RX pipelines over one super-packet (the per-core ceiling).
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tun_rs::{GROTable, VIRTIO_NET_HDR_LEN, VirtioNetHdr};
use weft_bench::{HEADERS, tcp4_packet};
use weft_core::admission::MacKeys;
use weft_core::crypto::{Cipher, DataKey, TAG_LEN};
use weft_core::handshake::{Psk, SessionKeys};
use weft_core::replay::ReplayWindow;
use weft_core::route::RouteSnapshot;
use weft_core::session::{Session, SessionParams};
use weft_core::stats::DropCounters;
use weft_core::wire::DATA_HEADER_LEN;
use weft_datapath::pipeline::{
    ControlEvent, ControlSink, PipelineConfig, PipelineStats, Rx, Shared, TX_HEADROOM, TunWriter, Tx,
};
use weft_datapath::transport::udp::{Offload, RecvMeta};

const MSS: usize = 1448;
const SEGMENTS: usize = 45; // 45 * 1448 = 65160 bytes of payload: one TSO super-packet
const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];

fn aead(c: &mut Criterion) {
    let mut g = c.benchmark_group("aead");
    for cipher in Cipher::ALL {
        let key = DataKey::new(cipher, &[7; 32]);
        for size in [64usize, 1420, 9000] {
            g.throughput(Throughput::Bytes(size as u64));
            let mut buf = vec![4u8; 16 + size + TAG_LEN];
            g.bench_with_input(BenchmarkId::new(format!("seal/{cipher}"), size), &size, |b, &size| {
                let mut ctr = 0u64;
                b.iter(|| {
                    ctr += 1;
                    key.seal(ctr, black_box(&mut buf), 16, size).unwrap()
                });
            });
            let mut sealed = vec![4u8; 16 + size + TAG_LEN];
            let n = 16 + key.seal(1, &mut sealed, 16, size).unwrap();
            let mut work = sealed.clone();
            g.bench_with_input(BenchmarkId::new(format!("open/{cipher}"), size), &size, |b, _| {
                b.iter(|| {
                    work.copy_from_slice(&sealed);
                    key.open(1, black_box(&mut work[..n]), 16).unwrap()
                });
            });
        }
    }
    g.finish();
}

fn replay(c: &mut Criterion) {
    let mut g = c.benchmark_group("replay");
    g.bench_function("in_order", |b| {
        let mut w = ReplayWindow::default();
        let mut ctr = 0u64;
        b.iter(|| {
            ctr += 1;
            w.check(ctr) && w.mark(black_box(ctr))
        });
    });
    g.bench_function("reordered_within_window", |b| {
        let mut w = ReplayWindow::default();
        let mut ctr = 0u64;
        b.iter(|| {
            ctr += 2;
            // Every second counter arrives late, a few hundred behind.
            let c = if ctr.is_multiple_of(4) { ctr.saturating_sub(301) } else { ctr };
            w.check(c) && w.mark(black_box(c))
        });
    });
    g.bench_function("duplicate", |b| {
        let mut w = ReplayWindow::default();
        w.mark(1000);
        b.iter(|| w.check(black_box(1000)));
    });
    g.finish();
}

fn session(local: u32, remote: u32, peer: Ipv4Addr, send: [u8; 32], recv: [u8; 32], cipher: Cipher) -> Arc<Session> {
    Arc::new(Session::new(SessionParams {
        local_index: local,
        remote_index: remote,
        cipher,
        keys: SessionKeys { send, recv },
        endpoint: "192.0.2.2:11010".parse().unwrap(),
        peer_addr: peer,
        peer_addr6: None,
        confirmed: true,
        stats: Arc::default(),
    }))
}

fn lookup(c: &mut Criterion) {
    let sessions: Vec<Arc<Session>> = (0..256u32)
        .map(|i| {
            session(i * 7919 + 1, i, Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8), [1; 32], [2; 32], Cipher::Aes128Gcm)
        })
        .collect();
    let snap = ArcSwap::from_pointee(RouteSnapshot::new(
        sessions.iter().map(|s| (s.peer_addr.into(), s.clone())),
        sessions.iter().cloned(),
    ));
    let mut g = c.benchmark_group("lookup");
    g.bench_function("route_by_dst_256_peers", |b| {
        let mut i = 0u8;
        b.iter(|| {
            i = i.wrapping_add(37);
            let guard = snap.load();
            guard.session_for(black_box(Ipv4Addr::new(10, 1, 0, i).into())).is_some()
        });
    });
    g.bench_function("session_by_index_256_peers", |b| {
        let mut i = 0u32;
        b.iter(|| {
            i = (i + 37) % 256;
            let guard = snap.load();
            guard.session_by_index(black_box(i * 7919 + 1)).is_some()
        });
    });
    g.finish();
}

/// A 64 KiB TSO super-packet and the virtio header the kernel would give with it.
fn super_packet() -> (Vec<u8>, VirtioNetHdr) {
    let p = tcp4_packet(A, B, 1, MSS * SEGMENTS);
    let hdr = VirtioNetHdr {
        flags: 1, // NEEDS_CSUM
        gso_type: tun_rs::VIRTIO_NET_HDR_GSO_TCPV4,
        hdr_len: HEADERS as u16,
        gso_size: MSS as u16,
        csum_start: 20,
        csum_offset: 16,
    };
    (p, hdr)
}

fn offload(c: &mut Criterion) {
    let (pkt, hdr) = super_packet();
    let mut g = c.benchmark_group("offload");
    g.throughput(Throughput::Bytes((MSS * SEGMENTS) as u64));
    let mut bufs: Vec<Vec<u8>> = (0..128).map(|_| vec![0u8; 2048]).collect();
    let mut sizes = vec![0usize; 128];
    let mut input = pkt.clone();
    g.bench_function("gso_split_64KiB", |b| {
        b.iter(|| {
            input.copy_from_slice(&pkt);
            tun_rs::gso_split(&mut input, hdr, &mut bufs, &mut sizes, DATA_HEADER_LEN, false).unwrap()
        });
    });
    // Segments with valid checksums, as RX would hand them to the TUN.
    let n = tun_rs::gso_split(&mut pkt.clone(), hdr, &mut bufs, &mut sizes, 0, false).unwrap();
    let segs: Vec<Vec<u8>> = (0..n).map(|i| bufs[i][..sizes[i]].to_vec()).collect();
    let mut gro = GROTable::default();
    let mut coal: Vec<Vec<u8>> = (0..n).map(|_| Vec::with_capacity(2 * VIRTIO_NET_HDR_LEN + 65535 + 64)).collect();
    g.bench_function("gro_coalesce_45_segments", |b| {
        b.iter(|| {
            for (c, s) in coal.iter_mut().zip(&segs) {
                c.clear();
                c.resize(VIRTIO_NET_HDR_LEN, 0);
                c.extend_from_slice(s);
            }
            gro.apply_gro(&mut coal, VIRTIO_NET_HDR_LEN, false).unwrap();
        });
    });
    g.finish();
}

struct NullSink;
impl ControlSink for NullSink {
    fn try_push(&self, _ev: ControlEvent) -> bool {
        true
    }
}

/// RX's TUN stand-in: coalesces like the real write, without the system call.
struct GroOnly;
impl TunWriter for GroOnly {
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> std::io::Result<()> {
        gro.apply_gro(bufs, VIRTIO_NET_HDR_LEN, false)
    }
}

fn pipeline(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Bytes((MSS * SEGMENTS) as u64));
    let (pkt, hdr) = super_packet();
    for cipher in [Cipher::Aes128Gcm, Cipher::ChaCha20Poly1305, Cipher::AuthOnly] {
        let cfg = PipelineConfig { mtu: 1500, offload: true, udp_gro: false, pin: None };
        let a_to_b = session(1, 2, B.into(), [3; 32], [4; 32], cipher);
        let routes = RouteSnapshot::new([(Ipv4Addr::from(B).into(), a_to_b.clone())], []);
        let drops = DropCounters::default();
        let mut tx = Tx::new(cfg);
        let mut input = pkt.clone();
        g.bench_function(BenchmarkId::new("tx_64KiB", cipher), |b| {
            b.iter(|| {
                input.copy_from_slice(&pkt);
                let (bufs, sizes) = tx.buffers();
                let n = tun_rs::gso_split(&mut input, hdr, bufs, sizes, TX_HEADROOM, false).unwrap();
                tx.process(&routes, &drops, n, 1);
                black_box(tx.outgoing().1.len())
            });
        });

        // The datagrams TX produced, to feed RX with a fresh receiving session each
        // round (its replay window would refuse a second delivery).
        let (bufs, out) = tx.outgoing();
        let dgrams: Vec<Vec<u8>> = out.iter().map(|o| bufs[o.buf][o.start..o.start + o.len].to_vec()).collect();
        let mut rx = Rx::new(cfg);
        let stats = PipelineStats::default();
        g.bench_function(BenchmarkId::new("rx_64KiB", cipher), |b| {
            // Setup (a fresh session, the datagrams copied into the slab) is untimed.
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let b_from_a = session(2, 1, A.into(), [4; 32], [3; 32], cipher);
                    let shared = Shared {
                        routes: Arc::new(ArcSwap::from_pointee(RouteSnapshot::new([], [b_from_a]))),
                        control: Arc::new(NullSink),
                        macs: Arc::new(MacKeys::new(&Psk::from_bytes([0; 32]))),
                        epoch: Instant::now(),
                        stop: Arc::new(AtomicBool::new(false)),
                        offload: Arc::new(Offload::new(false, false)),
                        firewall: Default::default(),
                    };
                    let (slab, slot, metas) = rx.slab();
                    for (i, d) in dgrams.iter().enumerate() {
                        slab[i * slot..i * slot + d.len()].copy_from_slice(d);
                        metas[i] = RecvMeta::whole("192.0.2.1:11010".parse().unwrap(), d.len());
                    }
                    let routes = shared.routes.load();
                    let start = Instant::now();
                    rx.process(&routes, &shared, &stats, dgrams.len(), 1, &mut GroOnly);
                    total += start.elapsed();
                }
                total
            });
        });
    }
    g.finish();
}

criterion_group!(benches, aead, replay, lookup, offload, pipeline);
criterion_main!(benches);
