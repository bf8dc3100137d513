//! What the access policy costs a packet: the connection table's check of a packet of
//! a tracked flow (every packet after a flow's first), of a new flow matched against
//! 200 compiled rules, and with no policy (one atomic load); the compiled matcher
//! against a scan of the same 200 rules; and the note a sent packet leaves. The table
//! holds 10,000 established flows throughout.
//!
//! `cargo bench -p weft-bench --bench policy`
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use weft_core::firewall::{Active, Firewall, UNESTABLISHED_MS};
use weft_core::policy::{Policy, proto};

/// 200 rules: each of 100 /28 source blocks reaches one member on a port range, and
/// each of 100 members reaches a /24 on one port.
fn policy_text() -> String {
    let mut t = String::new();
    for i in 0..100u32 {
        t.push_str(&format!(
            "[[allow]]\nfrom = [\"10.126.{}.{}/28\"]\nto = [\"10.126.200.{}\"]\nproto = \"tcp\"\nports = [\"{}-{}\"]\n",
            i / 16,
            (i % 16) * 16,
            i + 1,
            8000 + i,
            8010 + i
        ));
        t.push_str(&format!(
            "[[allow]]\nfrom = [\"10.126.201.{}\"]\nto = [\"10.127.{}.0/24\"]\nproto = \"udp\"\nports = [\"{}\"]\n",
            i + 1,
            i,
            5000 + i
        ));
    }
    t
}

fn tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, proto::TCP, 0, 0];
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&[0; 9]);
    p.push(0x10);
    p.extend_from_slice(&[0; 6]);
    p
}

fn bench(c: &mut Criterion) {
    let policy = Policy::parse(&policy_text()).unwrap();
    assert_eq!(policy.rules.len(), 200);
    let compiled = policy.compile(&[], &[]);
    let fw = Firewall::default();
    fw.set(Some(Arc::new(Active::new(compiled.clone()))));
    let me = Ipv4Addr::new(10, 126, 200, 50);
    // 10,000 tracked flows: what this node sent, answered and sent on (established).
    for i in 0..10_000u32 {
        let remote = Ipv4Addr::from(0x0a80_0000 + i);
        fw.outbound(&tcp(me, remote, 40_000, 443), 0);
        assert!(fw.inbound(&tcp(remote, me, 443, 40_000), 0).is_ok());
        fw.outbound(&tcp(me, remote, 40_000, 443), 0);
    }
    assert_eq!(fw.flows(), 10_000);
    let answer = tcp(Ipv4Addr::from(0x0a80_0000 + 4321), me, 443, 40_000);
    assert!(fw.inbound(&answer, 1).is_ok());
    let mut g = c.benchmark_group("policy");
    // The bulk case: the same flow packet after packet (the thread trusts it and
    // takes the table once a second), and the worst: each packet of another flow.
    g.bench_function("tracked flow, packet after packet", |b| b.iter(|| fw.inbound(black_box(&answer), 1)));
    let answers: Vec<_> = (0..64u32).map(|i| tcp(Ipv4Addr::from(0x0a80_0000 + i * 150), me, 443, 40_000)).collect();
    let mut i = 0;
    g.bench_function("tracked flow, another each packet (10,000 in the table)", |b| {
        b.iter(|| {
            i = (i + 1) % answers.len();
            fw.inbound(black_box(&answers[i]), 1)
        })
    });
    // A new flow each time (a new source port, from one of the 16 addresses of rule
    // 99's /28), allowed by rule 99 of 200 and tracked. Every 32,768 of them (2,048 per
    // address, within each address's share) the new flows, unestablished, are let
    // expire: the table is back to its 10,000.
    let dst = Ipv4Addr::new(10, 126, 200, 50);
    assert!(fw.inbound(&tcp(Ipv4Addr::new(10, 126, 3, 16), dst, 1, 8049), 1).is_ok());
    let mut n = 0u32;
    g.bench_function("new flow, matched among 200 rules", |b| {
        b.iter(|| {
            n = n.wrapping_add(1);
            if n.is_multiple_of(32_768) {
                fw.expire(1 + UNESTABLISHED_MS);
            }
            let src = Ipv4Addr::new(10, 126, 3, 16 + (n % 16) as u8);
            fw.inbound(black_box(&tcp(src, dst, (n / 16) as u16, 8049)), 1)
        })
    });
    fw.expire(1 + UNESTABLISHED_MS);
    assert_eq!(fw.flows(), 10_000);
    let off = Firewall::default();
    g.bench_function("no policy", |b| b.iter(|| off.inbound(black_box(&answer), 1)));
    let out = tcp(me, Ipv4Addr::from(0x0a80_0000 + 77), 40_000, 443);
    g.bench_function("sent packet noted", |b| b.iter(|| fw.outbound(black_box(&out), 2)));
    let (s, d) = (IpAddr::V4(Ipv4Addr::new(10, 126, 201, 90)), IpAddr::V4(Ipv4Addr::new(10, 127, 89, 9)));
    assert_eq!(compiled.allows(s, d, proto::UDP, 5089), Some(179));
    g.bench_function("compiled matcher, 200 rules", |b| {
        b.iter(|| compiled.allows(black_box(s), black_box(d), proto::UDP, 5089))
    });
    g.bench_function("scan of 200 rules", |b| {
        b.iter(|| {
            policy.rules.iter().position(|r| {
                let inside = |sel: &[weft_core::policy::Selector], a: IpAddr| {
                    sel.iter().any(|x| match x {
                        weft_core::policy::Selector::Cidr(n, p) => {
                            let (IpAddr::V4(n), IpAddr::V4(a)) = (n, a) else { return false };
                            let m = if *p == 0 { 0 } else { u32::MAX << (32 - p) };
                            u32::from(a) & m == u32::from(*n)
                        }
                        _ => false,
                    })
                };
                inside(&r.from, black_box(s))
                    && inside(&r.to, black_box(d))
                    && r.proto.covers(proto::UDP)
                    && r.port_ok(5089, proto::UDP)
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
