//! The connection table's per-packet work, before and after issue 51 in one run: the
//! hand-written map `core/src/firewall.rs` had (16 `parking_lot::Mutex<HashMap>`
//! shards picked from the remote address and the ports), the same with its shard
//! picked by a keyed hash (what it would need: a sender chose its shard, and each shard
//! had its own bound), and the `DashMap` it has now (64 shards; 16 for comparison), all
//! keyed by the same flow with std's SipHash (`RandomState`: the ports are the sender's
//! to choose), 10,000 flows tracked. Per packet of a tracked flow: find its entry and
//! refresh it (another flow each packet: the bulk case skips the table, see the
//! `policy` bench); the first packet of a new flow: a lookup that misses, then the
//! insert (taken out again, so the table keeps its size). bench/RESULTS.md §51.
//!
//! `cargo bench -p weft-bench --bench flowtable`
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, Ipv4Addr};

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use dashmap::DashMap;
use parking_lot::Mutex;

/// The firewall's flow key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Flow {
    local: IpAddr,
    remote: IpAddr,
    proto: u8,
    local_port: u16,
    remote_port: u16,
}

/// The firewall's entry (its size: expiry, rule, three flags; only the expiry is read).
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)]
struct Entry {
    expires: u64,
    rule: Option<u32>,
    flags: [bool; 3],
}

const OLD_SHARDS: usize = 16;
const MAX_FLOWS: usize = 65_536;

/// The hand-written table as it was; `keyed`: its shard picked by a keyed hash of the
/// flow instead (what it would need so that a sender cannot aim all its flows at one
/// shard, whose bound was 1/16 of the table's).
struct Sharded(Vec<Mutex<HashMap<Flow, Entry>>>, Option<RandomState>);

impl Sharded {
    fn new(keyed: bool) -> Self {
        Self((0..OLD_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(), keyed.then(RandomState::new))
    }

    fn shard(&self, f: &Flow) -> &Mutex<HashMap<Flow, Entry>> {
        if let Some(h) = &self.1 {
            return &self.0[(h.hash_one(f) as usize) % OLD_SHARDS];
        }
        let k = match f.remote {
            IpAddr::V4(a) => u32::from(a) as usize,
            IpAddr::V6(a) => (u128::from(a) as usize) ^ ((u128::from(a) >> 64) as usize),
        };
        &self.0[(k ^ usize::from(f.remote_port) ^ usize::from(f.local_port)) % OLD_SHARDS]
    }

    fn refresh(&self, f: &Flow, now: u64) -> bool {
        let mut t = self.shard(f).lock();
        match t.get_mut(f) {
            Some(e) if e.expires > now => {
                e.expires = now + 60_000;
                true
            }
            _ => false,
        }
    }

    fn insert(&self, f: Flow, e: Entry, now: u64) -> bool {
        let mut t = self.shard(&f).lock();
        if t.len() >= MAX_FLOWS / OLD_SHARDS {
            t.retain(|_, x| x.expires > now);
            if t.len() >= MAX_FLOWS / OLD_SHARDS {
                return false;
            }
        }
        t.insert(f, e);
        true
    }

    fn remove(&self, f: &Flow) {
        self.shard(f).lock().remove(f);
    }
}

/// The table now: a `DashMap` (and the count it keeps beside it for the bound).
struct Dash(DashMap<Flow, Entry, RandomState>, std::sync::atomic::AtomicUsize);

impl Dash {
    fn new(shards: usize) -> Self {
        Self(DashMap::with_hasher_and_shard_amount(RandomState::new(), shards), Default::default())
    }

    fn refresh(&self, f: &Flow, now: u64) -> bool {
        match self.0.get_mut(f) {
            Some(mut e) if e.expires > now => {
                e.expires = now + 60_000;
                true
            }
            _ => false,
        }
    }

    fn insert(&self, f: Flow, e: Entry, _now: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.1.load(Relaxed) >= MAX_FLOWS {
            return false;
        }
        if self.0.insert(f, e).is_none() {
            self.1.fetch_add(1, Relaxed);
        }
        true
    }

    fn remove(&self, f: &Flow) {
        if self.0.remove(f).is_some() {
            self.1.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

fn flow(i: u32) -> Flow {
    Flow {
        local: IpAddr::V4(Ipv4Addr::new(10, 126, 200, 50)),
        remote: IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i)),
        proto: 6,
        local_port: 40_000,
        remote_port: 443,
    }
}

fn bench(c: &mut Criterion) {
    let entry = Entry { expires: 60_000, rule: None, flags: [false; 3] };
    let old = Sharded::new(false);
    let keyed = Sharded::new(true);
    let new = Dash::new(64);
    let new16 = Dash::new(16);
    for i in 0..10_000 {
        assert!(old.insert(flow(i), entry, 0) && keyed.insert(flow(i), entry, 0));
        assert!(new.insert(flow(i), entry, 0) && new16.insert(flow(i), entry, 0));
    }
    let tracked: Vec<Flow> = (0..64u32).map(|i| flow(i * 150)).collect();
    let mut g = c.benchmark_group("flowtable");
    let mut i = 0;
    let mut n = 0u32;
    macro_rules! both {
        ($name:literal, $t:expr) => {
            g.bench_function(concat!("tracked flow refreshed, another each packet: ", $name), |b| {
                b.iter(|| {
                    i = (i + 1) % tracked.len();
                    $t.refresh(black_box(&tracked[i]), 1)
                })
            });
            g.bench_function(concat!("new flow (a miss, then insert and remove): ", $name), |b| {
                b.iter(|| {
                    n = n.wrapping_add(1);
                    let f = flow(20_000 + n % 1_000_000);
                    assert!(!$t.refresh(black_box(&f), 1));
                    $t.insert(f, entry, 1);
                    $t.remove(&f);
                })
            });
        };
    }
    both!("hand-written shards", old);
    both!("hand-written shards, keyed", keyed);
    both!("dashmap", new);
    both!("dashmap, 16 shards", new16);
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
