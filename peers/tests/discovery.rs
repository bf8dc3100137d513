//! LAN discovery in the engine, sans-IO: endpoints announced by beacons are dialled,
//! at most [`MAX_DISCOVERED`] at once, and forgotten [`DISCOVERED_EXPIRY`] after their
//! last beacon; configured peers are never capped or expired.
// Tests stand in for the runtime: they make the epoch the engine is handed.
#![allow(clippy::disallowed_methods)]

use weft_bench::harness;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use weft_core::crypto::Cipher;
use weft_core::endpoint::Endpoint;
use weft_peers::node::{DISCOVERED_EXPIRY, Input, MAX_DISCOVERED};

/// How far each step of the test clock moves.
const TICK: Duration = Duration::from_millis(200);
use weft_peers::{Node, Timers};

fn lan(i: usize) -> Endpoint {
    Endpoint::udp(SocketAddr::from(([192, 168, (i / 250) as u8, (i % 250) as u8 + 2], 11010)))
}

fn node(epoch: Instant, dial: Vec<Endpoint>) -> Node {
    let key = harness::static_key(&mut ChaCha8Rng::seed_from_u64(7));
    let params = harness::params(key, "lan", "lan secret", Cipher::Aes128Gcm, [10, 9, 0, 1].into(), "n".into());
    let me = Endpoint::udp(SocketAddr::from(([192, 168, 0, 1], 11010)));
    Node::new(harness::config(params, dial, epoch, Timers::default(), me), Box::new(ChaCha8Rng::seed_from_u64(8)))
}

/// The endpoints the engine is dialling (status lists dials without a live peer).
fn dialling(n: &Node, now: Instant) -> BTreeSet<Endpoint> {
    n.status(now).dials.iter().map(|d| d.endpoint).collect()
}

/// Runs the engine's timers from `from` to `to`, a tick at a time, dropping its actions.
fn run(n: &mut Node, from: Instant, to: Instant) {
    let mut t = from;
    while t < to {
        t += TICK;
        n.handle_timeout(t);
        while n.poll_action().is_some() {}
    }
}

#[test]
fn discovered_endpoints_are_capped() {
    let epoch = Instant::now();
    let configured = Endpoint::udp(SocketAddr::from(([198, 51, 100, 7], 11010)));
    let mut n = node(epoch, vec![configured]);
    for i in 0..MAX_DISCOVERED * 3 {
        n.handle(epoch, Input::Discovered { endpoint: lan(i) });
    }
    while n.poll_action().is_some() {}
    let d = dialling(&n, epoch);
    assert_eq!(d.len(), MAX_DISCOVERED + 1, "the cap holds");
    assert!(d.contains(&configured));
    // The first ones are kept; later ones wait for a free slot.
    assert!(d.contains(&lan(0)) && !d.contains(&lan(MAX_DISCOVERED)));
    // A configured peer is never refused for it.
    let extra = Endpoint::udp(SocketAddr::from(([198, 51, 100, 8], 11010)));
    n.add_peer(epoch, extra).unwrap();
    assert!(dialling(&n, epoch).contains(&extra));
}

#[test]
fn discovered_endpoints_expire_unless_announced_again() {
    let epoch = Instant::now();
    let configured = Endpoint::udp(SocketAddr::from(([198, 51, 100, 7], 11010)));
    let mut n = node(epoch, vec![configured]);
    for i in 0..MAX_DISCOVERED {
        n.handle(epoch, Input::Discovered { endpoint: lan(i) });
    }
    // Only lan(0) keeps announcing itself, every 5 s as the runtime's beacons do.
    let mut t = epoch;
    let end = epoch + DISCOVERED_EXPIRY + Duration::from_secs(10);
    while t < end {
        let next = t + Duration::from_secs(5);
        run(&mut n, t, next);
        t = next;
        n.handle(t, Input::Discovered { endpoint: lan(0) });
    }
    let d = dialling(&n, t);
    assert_eq!(d, BTreeSet::from([configured, lan(0)]), "silent endpoints are forgotten");
    // Forgotten ones free their slots: a new beacon is dialled again.
    n.handle(t, Input::Discovered { endpoint: lan(MAX_DISCOVERED + 1) });
    assert!(dialling(&n, t).contains(&lan(MAX_DISCOVERED + 1)));
}
