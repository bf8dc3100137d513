//! The no-TUN node's userspace TCP/IP stack (`weft::notun::stack`): one TCP stream between
//! two stacks wired back to back in memory (no tunnel, no sockets), so the figure is
//! the stack's own cost per byte: segmentation, checksums, the polling thread, the
//! tokio side. Per MTU (the segment size) with incoming checksums verified or not
//! (the tunnel's AEAD already guarantees them, so Weft skips the verification).
//!
//! `cargo bench -p weft-bench --bench netstack`
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft::notun::stack::{Stack, TcpConn};

const CHUNK: usize = 4 << 20;

/// Moves what one stack sends to the other, on a thread of its own.
fn wire(from: std::sync::mpsc::Receiver<Vec<u8>>, to: weft_datapath::pipeline::Deliver) {
    std::thread::spawn(move || {
        for p in from {
            // A full queue drops, as the pipeline would; TCP retransmits.
            let _ = to(&p);
        }
    });
}

fn pair(rt: &tokio::runtime::Runtime, mtu: u16, verify: bool) -> (TcpConn, TcpConn) {
    let a_addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let b_addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let (a, pa) = Stack::start_with(&[(a_addr, 24)], mtu, verify).unwrap();
    let (b, pb) = Stack::start_with(&[(b_addr, 24)], mtu, verify).unwrap();
    let (a_out, a_in) = pa.into_parts();
    let (b_out, b_in) = pb.into_parts();
    wire(a_out, b_in);
    wire(b_out, a_in);
    rt.block_on(async {
        let mut accepted = b.listen(5000);
        let client = a.connect(SocketAddr::new(b_addr, 5000)).await.unwrap();
        let server = accepted.recv().await.unwrap();
        (client, server)
    })
}

fn stream(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut g = c.benchmark_group("netstack_tcp_stream");
    g.throughput(Throughput::Bytes(CHUNK as u64));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(8));
    for mtu in [1280u16, 1420, 8920] {
        for verify in [false, true] {
            let (mut client, mut server) = pair(&rt, mtu, verify);
            let name = if verify { "checksums_verified" } else { "checksums_skipped" };
            g.bench_function(BenchmarkId::new(name, format!("mtu{mtu}")), |bench| {
                let data = vec![0x5au8; CHUNK];
                let mut sink = vec![0u8; 256 << 10];
                bench.iter(|| {
                    rt.block_on(async {
                        let writer = async {
                            client.write_all(&data).await.unwrap();
                        };
                        let reader = async {
                            let mut got = 0;
                            while got < CHUNK {
                                got += server.read(&mut sink).await.unwrap();
                            }
                        };
                        tokio::join!(writer, reader);
                    });
                });
            });
        }
    }
    g.finish();
}

criterion_group!(benches, stream);
criterion_main!(benches);
