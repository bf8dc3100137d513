//! L3 mesh simulation tests: many engines with the real data plane on a simulated
//! network with a virtual clock ([`weft_bench::sim`]; `meshsim` is the same runs as a
//! binary).
//!
//! The assertions use bounds with margin rather than exact times, so that engine
//! changes that shift timings a little do not need new constants. Convergence is
//! checked every [`CHECK_EVERY_MS`] of virtual time.

use std::cmp::Reverse;
use std::collections::HashSet;
use std::time::Duration;

use weft_bench::sim::{CHECK_EVERY_MS, Graph, Net, Plan, Report, bfs, pair_key, run};
use weft_core::stats::DropReason;
use weft_core::wire::{DATA_HEADER_LEN, RELAY_HEADER_LEN};
use weft_peers::topology::RECORD_TTL;
use weft_peers::{NodeId, Timers};

/// Steady-state window of the tests (meshsim measures 60 s).
const STEADY: Duration = Duration::from_secs(30);

/// Boots a mesh, waits for convergence and 30 s at rest, and checks that a lossless
/// mesh is still converged at the end.
fn converge(plan: Plan, limit: Duration) -> (Net, Report) {
    let (net, report) = run(plan, limit, STEADY).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    if plan.loss == 0.0 {
        // (With loss a session may die and come back, or a refresh may be lost.)
        assert!(
            report.still_converged,
            "{} nodes fell apart in steady state: {:?} {:?}",
            plan.nodes,
            net.missing(),
            net.route_mismatches(10)
        );
    }
    (net, report)
}

/// (e): packets from `x` to a node several hops away arrive through relays, and only
/// there.
fn data_through_relays(net: &mut Net) {
    let g = net.direct_graph();
    // The pair farthest apart that the underlay cannot join directly (no punch can
    // shorten its path while the packets travel); lowest indices on ties.
    let (x, y, d) = {
        let links = &net.links;
        (0..net.n())
            .flat_map(|i| bfs(&g, i).into_iter().enumerate().filter_map(move |(j, d)| Some((i, j, d?))))
            .filter(|&(i, j, _)| !links.contains_key(&pair_key(i, j)))
            .max_by_key(|&(i, j, d)| (d, Reverse(i), Reverse(j)))
            .expect("nodes")
    };
    assert!(d >= 2, "no multi-hop pair in this mesh");
    let hops = net.status(x).routes.iter().find(|r| r.node == net.id(y)).map(|r| r.hops);
    assert_eq!(hops, Some(d), "{x}->{y}: route hops {hops:?}, BFS {d} hops");
    // Our packets are the only relayed frames from x to y this large.
    net.trace = Some((net.id(x).to_bytes(), net.id(y).to_bytes(), RELAY_HEADER_LEN + DATA_HEADER_LEN + 100));
    net.traced.clear();
    // The first packet makes the session (on demand); then the traced burst.
    let first = net.send_data(x, y, 1, Duration::from_secs(2));
    assert!(net.hosts[y].tun.ends_with(&first), "{y} did not get the first packet from {x} ({d} hops)");
    net.traced.clear();
    let tun_before: Vec<usize> = net.hosts.iter().map(|h| h.tun.len()).collect();
    // Sent, then a couple of virtual seconds to arrive.
    let pkts = net.send_data(x, y, 20, Duration::from_secs(2));
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
    let settled = net.run_until(Duration::from_secs(30), |net| net.route_mismatches(1).is_empty());
    assert!(settled.is_some(), "routes inside the halves: {:?}", net.route_mismatches(10));
    // And stay that way: no route across for the rest of a 30 s partition.
    let hold = Duration::from_secs(30).saturating_sub(gone + settled.unwrap_or_default());
    let end = net.now_ms + hold.as_millis() as u64;
    while net.now_ms < end {
        net.run_to(net.now_ms + CHECK_EVERY_MS);
        assert_eq!(cross(&net), 0, "a route across the partition came back at {} ms", net.now_ms);
    }

    net.side = None;
    let healed = net.run_until_converged(Duration::from_secs(60));
    let healed = healed.unwrap_or_else(|| {
        panic!("not healed after 60 s: missing {:?}, mismatches {:?}", net.missing(), net.route_mismatches(10))
    });
    eprintln!(
        "partition of {n} nodes ({cut_links} links cut): cross routes gone after {:.1} s, halves settled {:.1} s \
         later; healed (routes to all, shortest) {:.1} s after the heal",
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
    // Links are what members dial (other reachable pairs only carry traffic shortcuts).
    let links: Vec<(usize, usize)> = (0..n).flat_map(|i| net.dials[i].iter().map(move |&m| pair_key(i, m))).collect();
    let degree = |i: usize| links.iter().filter(|(a, b)| *a == i || *b == i).count();
    let connected_without = |d: usize| {
        let mut g: Graph = vec![Vec::new(); n];
        for &(a, b) in links.iter().filter(|(a, b)| *a != d && *b != d) {
            g[a].push(b);
            g[b].push(a);
        }
        bfs(&g, usize::from(d == 0)).iter().flatten().count() == n - 1
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
    let t_conv = net.run_until_converged(Duration::from_secs(60));
    assert!(t_conv.is_some(), "the rest did not reconverge: {:?} {:?}", net.missing(), net.route_mismatches(10));

    // A node joining now still learns the record (so the probe below can see records).
    let p1 = net.join(rest[0]);
    let learned = net.run_until(Duration::from_secs(5), |net| {
        net.hosts[p1].running() && net.status(p1).peers.iter().any(|p| gone.contains(&p.node_id))
    });
    assert!(learned.is_some(), "a joiner before RECORD_TTL did not learn {d}'s record");
    assert_eq!(routes_into(&net, p1, &gone), 0);

    // Until the TTL has passed nobody routes to it again.
    // Its record ages from when its links declared it dead (dead_after), for RECORD_TTL.
    let ttl_end = t0 + (RECORD_TTL + Timers::default().dead_after + Duration::from_secs(5)).as_millis() as u64;
    while net.now_ms < ttl_end {
        net.run_to(net.now_ms + CHECK_EVERY_MS);
        assert_eq!(routes_to_d(&net), 0, "a route to departed {d} came back at {} ms", net.now_ms);
    }
    // After the TTL the record is gone everywhere: a new joiner (not next to the
    // first probe, which learned the record late) never hears of it.
    let p2 = net.join(rest[1]);
    let t_p2 = net.run_until_converged(Duration::from_secs(30));
    assert!(t_p2.is_some(), "the second joiner did not converge: {:?}", net.missing());
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
fn a_long_chain_routes_everyone_and_makes_sessions_only_for_traffic() {
    let plan = Plan { chain: true, ..Plan::new(20, 20) };
    let mut net = Net::build(plan);
    net.run_to(30_000);
    // Every node routes every other; only links (the chain) hold sessions.
    for i in net.running() {
        let st = net.status(i);
        assert_eq!(st.routes.len(), 19, "{i} routes {} members", st.routes.len());
        let sessions: Vec<usize> = st.routes.iter().filter(|r| r.session).map(|r| r.hops as usize).collect();
        assert!(sessions.iter().all(|&h| h == 1), "{i} holds sessions beyond its links: {sessions:?}");
    }
    // Traffic across all 19 links makes a session end to end, and only that one.
    let pkts = net.send_data(0, 19, 1, Duration::from_secs(3));
    assert!(net.hosts[19].tun.ends_with(&pkts), "0 -> 19 over 19 links");
    let far = net.status(0).routes.iter().filter(|r| r.session && r.hops > 1).count();
    assert_eq!(far, 1, "node 0 holds {far} sessions beyond its link");
}

#[test]
fn relays_never_refuse_frames_in_a_lossless_mesh() {
    let plan = Plan::new(50, 50);
    let mut net = Net::build(plan);
    net.run_to(plan.last_join_ms());
    assert!(net.run_until_converged(Duration::from_secs(60)).is_some());
    net.run_for(Duration::from_secs(10));
    let refused: Vec<(usize, u64)> = (0..plan.nodes)
        .map(|i| (i, net.hosts[i].stats.drops.get(DropReason::RelayRefused)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(refused.is_empty(), "relayed frames refused by (node, count): {refused:?}");
}

/// A revocation given to one member of a 100-node mesh with an authority reaches every
/// other member through the mesh (virtual time recorded), and none keeps a session
/// with the revoked member or a route to it. `WEFT_SIM_NODES=1000` for a larger mesh
/// (bench/RESULTS.md records both).
#[test]
fn a_revocation_reaches_every_member_of_a_certified_mesh() {
    let nodes = std::env::var("WEFT_SIM_NODES").ok().and_then(|v| v.parse().ok()).filter(|n| *n >= 60).unwrap_or(100);
    let plan = Plan::new(nodes, 11);
    let mut net = Net::build(plan);
    let authority = weft_core::cert::AuthorityKey::from_seed([9; 32]);
    net.authority = Some(weft_core::cert::AuthorityKey::from_seed([9; 32]));
    net.run_to(plan.last_join_ms());
    assert!(net.run_until_converged(Duration::from_secs(120)).is_some(), "the certified mesh converges");
    let revoked = nodes * 4 / 7;
    let revoked_id = net.id(revoked);
    let revocation = weft_core::cert::Revocation::issue(&authority, net.public_key(revoked), 1_800_000_000);
    let now = net.now();
    assert_eq!(net.admin(0, |n| n.revoke(now, revocation)), Ok(true));
    let others: Vec<usize> = net.running().into_iter().filter(|&i| i != revoked).collect();
    let took = net
        .run_until(Duration::from_secs(60), |net| {
            others.iter().all(|&i| net.node(i).revocations().iter().any(|r| r.node == net.public_key(revoked)))
        })
        .expect("the revocation reaches every member within 60 s of virtual time");
    eprintln!("a revocation reached all {} other members in {took:?} of virtual time", others.len());
    net.run_for(Duration::from_secs(5));
    for &i in &others {
        let st = net.status(i);
        assert!(
            st.peers.iter().all(|p| p.node_id != revoked_id || p.sessions == 0),
            "node {i} keeps a session with the revoked member"
        );
        assert!(st.routes.iter().all(|r| r.node != revoked_id), "node {i} still routes to the revoked member");
    }
}
