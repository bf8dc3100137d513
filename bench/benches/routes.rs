//! The cost of rebuilding a node's routes from its topology: 4096 members' records,
//! each proxying 32 subnets (what a member minting keys could make a node hold; the
//! rebuild runs on every topology or session change).
//!
//! `cargo bench -p weft-bench --bench routes` (`WEFT_BENCH_RECORDS=1024` for fewer
//! records: before the address index, setting up 4096 took hours, each record's
//! arrival rebuilding the routes at a cost that grew with the square of the table).
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use weft_bench::harness::static_key;
use weft_bench::sim::{NET, Net, Plan, overlay};
use weft_core::endpoint::Endpoint;
use weft_core::route::Lookup;
use weft_peers::node::Input;
use weft_peers::topology::{Neighbour, Record};

const RECORDS: usize = 4096;

/// `WEFT_BENCH_RECORDS`, from 3 (the pair's two and one minted) to the table's limit.
fn records() -> usize {
    match std::env::var("WEFT_BENCH_RECORDS") {
        Err(_) => RECORDS,
        Ok(v) => match v.parse() {
            Ok(n) if (3..=RECORDS).contains(&n) => n,
            _ => {
                eprintln!("error: WEFT_BENCH_RECORDS={v:?} is not a number of records from 3 to {RECORDS}");
                std::process::exit(2);
            }
        },
    }
}
const SUBNETS: usize = 32;

/// Member `i`'s record: an overlay address inside the simulator's network, 32 /28s
/// of its own, listing node 1 (the member relaying them all) as its neighbour.
fn record(i: usize, via: weft_peers::NodeId, rng: &mut ChaCha8Rng) -> Record {
    let key = static_key(rng);
    let proxied = (0..SUBNETS)
        .map(|j| {
            let k = (i * SUBNETS + j) as u32;
            (IpAddr::V4(Ipv4Addr::from(0x1400_0000 + k * 16)), 28)
        })
        .collect();
    let mut r = Record {
        key: key.public,
        signer: [0; 32],
        sig: [0; 64],
        seq: 1,
        hostname: format!("m{i}"),
        overlay: overlay(100 + i),
        overlay6: None,
        endpoints: vec![Endpoint::udp(SocketAddr::from(([198, 19, (i >> 8) as u8, i as u8], 11010)))],
        neighbours: vec![Neighbour {
            node: via,
            rtt_ms: 5,
            loss_pct: 0,
            observed: Endpoint::udp(SocketAddr::from(([198, 19, (i >> 8) as u8, i as u8], 11010))),
        }],
        proxied,
        dynamic: false,
        cert: None,
        priority: weft_peers::topology::DEFAULT_PRIORITY,
        unknown_ext: Vec::new(),
    };
    r.sign(&key, NET);
    r
}

fn rebuild(c: &mut Criterion) {
    let plan = Plan { extra_links: 0.0, latency: (1, 1), chain: true, ..Plan::new(2, 1) };
    let mut net = Net::build(plan);
    net.run_for(Duration::from_secs(1));
    net.run_until_converged(Duration::from_secs(10)).expect("the pair came up");
    let via = net.id(1);
    let index = net.admin(0, |n| match n.route_snapshot().lookup(IpAddr::V4(overlay(1))) {
        Lookup::Route(r) => r.session.local_index,
        _ => panic!("no session with node 1"),
    });
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    // The table's records: the pair's own two and the members node 1 minted.
    let count = records();
    let records: Vec<Record> = (0..count - 2).map(|i| record(i, via, &mut rng)).collect();
    // Node 1 passes them on over its session, at a pace the per-link budget allows
    // and within the minute after which unreachable nodes' records age out (the
    // simulation runs between them: the pair's keepalives keep the session up).
    for r in &records {
        let mut msg = vec![1u8]; // a topology record
        r.emit(&mut msg);
        let now = net.now();
        net.admin(0, |n| n.handle(now, Input::Message { local_index: index, bytes: &msg }));
        net.run_for(Duration::from_millis(12));
    }
    let held = net.admin(0, |n| n.topology().len());
    assert_eq!(held, count, "node 0 holds {held} records");
    let name = format!("route rebuild, {count} records x {SUBNETS} subnets");
    net.admin(0, |n| {
        c.bench_function(&name, |b| b.iter(|| n.route_snapshot()));
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(20));
    targets = rebuild
}
criterion_main!(benches);
