//! The route snapshot: an immutable view of "which session, sent where, carries packets
//! to this overlay address", "which session owns this receiver index" and "where to
//! forward a relayed frame", built by the control plane and swapped in atomically;
//! pipelines load it once per batch.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::session::Session;
use crate::transport::Endpoint;
use crate::wire::RelayHeader;

/// How to send to one destination.
#[derive(Debug, Clone)]
pub struct Route {
    /// The end-to-end session with the destination.
    pub session: Arc<Session>,
    /// Where the datagram goes: the destination itself, or the first relay.
    pub target: Endpoint,
    /// Present when the path is relayed: the header to put in front.
    pub relay: Option<RelayHeader>,
}

/// A member the node knows (it has a route) but holds no session with: the first
/// packets for it go to the control plane, which starts a handshake and sends them once
/// the session is up. Each snapshot hands over at most `budget` packets per member; the
/// rest are dropped and counted ([`crate::stats::DropReason::NoSession`]).
#[derive(Debug)]
pub struct Demand {
    /// The member's node id.
    pub node: [u8; 8],
    budget: AtomicU32,
}

impl Demand {
    /// A member that may hand `budget` packets to the control plane.
    pub fn new(node: [u8; 8], budget: u32) -> Self {
        Self { node, budget: AtomicU32::new(budget) }
    }

    /// Takes one packet of the budget; false when it is spent.
    pub fn take(&self) -> bool {
        self.budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_ok()
    }
}

/// What a snapshot has for a destination.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// A session carries it.
    Route(&'a Route),
    /// It belongs to a member without a session (one is made on demand).
    Demand(&'a Demand),
    /// Nobody.
    None,
}

/// One immutable routing state.
///
/// Sessions still waiting for the peer's proof of the PSK ("held") live in a table of
/// their own, so that a new held session swaps in a small table and shares the rest
/// ([`RouteSnapshot::with_held`]) instead of rebuilding every route.
#[derive(Debug, Default)]
pub struct RouteSnapshot {
    tables: Arc<Tables>,
    held: FxHashMap<u32, Arc<Session>>,
}

#[derive(Debug, Default, Clone)]
struct Tables {
    local: [u8; 8],
    by_dst: FxHashMap<Ipv4Addr, Route>,
    by_index: FxHashMap<u32, Arc<Session>>,
    next_hops: FxHashMap<[u8; 8], Endpoint>,
    neighbours: FxHashSet<Endpoint>,
    /// Proxied subnets, longest prefix first: (network, prefix, route).
    subnets: Vec<(u32, u8, Route)>,
    /// Members without a session, by overlay address.
    demand: FxHashMap<Ipv4Addr, Arc<Demand>>,
    /// Subnets proxied by members without a session, longest prefix first.
    demand_subnets: Vec<(u32, u8, Arc<Demand>)>,
}

impl RouteSnapshot {
    /// Builds a snapshot for a node without relaying (every route direct to the
    /// session's endpoint).
    pub fn new(
        routes: impl IntoIterator<Item = (Ipv4Addr, Arc<Session>)>,
        receiving: impl IntoIterator<Item = Arc<Session>>,
    ) -> Self {
        let by_dst = routes
            .into_iter()
            .map(|(a, s)| {
                let target = s.endpoint;
                (a, Route { session: s, target, relay: None })
            })
            .collect();
        let tables = Tables {
            by_dst,
            by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(),
            ..Tables::default()
        };
        Self { tables: Arc::new(tables), held: FxHashMap::default() }
    }

    /// Builds a full snapshot.
    pub fn with_relays(
        local: [u8; 8],
        routes: impl IntoIterator<Item = (Ipv4Addr, Route)>,
        receiving: impl IntoIterator<Item = Arc<Session>>,
        next_hops: impl IntoIterator<Item = ([u8; 8], Endpoint)>,
        neighbours: impl IntoIterator<Item = Endpoint>,
    ) -> Self {
        let tables = Tables {
            local,
            by_dst: routes.into_iter().collect(),
            by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(),
            next_hops: next_hops.into_iter().collect(),
            neighbours: neighbours.into_iter().collect(),
            ..Tables::default()
        };
        Self { tables: Arc::new(tables), held: FxHashMap::default() }
    }

    /// This snapshot with another set of held sessions (receive only, until their peer
    /// proves the PSK); everything else is shared, not copied.
    pub fn with_held(&self, held: impl IntoIterator<Item = Arc<Session>>) -> Self {
        Self { tables: self.tables.clone(), held: held.into_iter().map(|s| (s.local_index, s)).collect() }
    }

    /// Adds routes for subnets proxied by members (`--proxy-network`).
    pub fn with_subnets(mut self, subnets: impl IntoIterator<Item = (Ipv4Addr, u8, Route)>) -> Self {
        Arc::make_mut(&mut self.tables).subnets = by_prefix(subnets);
        self
    }

    /// Adds the members without a session (by overlay address) and the subnets they
    /// proxy: packets for them go to the control plane ([`RouteSnapshot::demand_for`]).
    pub fn with_demand(
        mut self,
        members: impl IntoIterator<Item = (Ipv4Addr, Arc<Demand>)>,
        subnets: impl IntoIterator<Item = (Ipv4Addr, u8, Arc<Demand>)>,
    ) -> Self {
        let t = Arc::make_mut(&mut self.tables);
        t.demand = members.into_iter().collect();
        t.demand_subnets = by_prefix(subnets);
        self
    }

    /// Where a packet for `dst` goes: its owner's overlay address, else the longest
    /// subnet that holds it, proxied by a member with a session ([`Lookup::Route`]) or
    /// without one ([`Lookup::Demand`]). One hash lookup and one pass over each subnet
    /// table (the TX pipeline's per-packet lookup).
    pub fn lookup(&self, dst: Ipv4Addr) -> Lookup<'_> {
        let t = &*self.tables;
        if let Some(r) = t.by_dst.get(&dst) {
            return Lookup::Route(r);
        }
        if let Some(d) = t.demand.get(&dst) {
            return Lookup::Demand(d);
        }
        match (longest(&t.subnets, dst), longest(&t.demand_subnets, dst)) {
            (Some((p, r)), Some((q, _))) if p >= q => Lookup::Route(r),
            (_, Some((_, d))) => Lookup::Demand(d),
            (Some((_, r)), None) => Lookup::Route(r),
            (None, None) => Lookup::None,
        }
    }

    /// How to reach `dst` over a session, if it can be ([`RouteSnapshot::lookup`]).
    pub fn route_for(&self, dst: Ipv4Addr) -> Option<&Route> {
        match self.lookup(dst) {
            Lookup::Route(r) => Some(r),
            _ => None,
        }
    }

    /// The member without a session that `dst` belongs to (its overlay address, or
    /// the longest subnet it proxies), when no route has it.
    pub fn demand_for(&self, dst: Ipv4Addr) -> Option<&Demand> {
        match self.lookup(dst) {
            Lookup::Demand(d) => Some(d),
            _ => None,
        }
    }

    fn subnet_route(&self, dst: Ipv4Addr) -> Option<&Route> {
        longest(&self.tables.subnets, dst).map(|(_, r)| r)
    }

    /// Whether a packet from inner source `src` may come through `session`: the source
    /// is the peer's overlay address or inside a subnet the peer proxies. A member's
    /// overlay address is accepted only from that member (its sessions share one
    /// stats block), before any subnet rule: no subnet and no second claim of the
    /// address lets another member send as it.
    pub fn may_send_from(&self, session: &Session, src: Ipv4Addr) -> bool {
        if let Some(owner) = self.tables.by_dst.get(&src) {
            return Arc::ptr_eq(&owner.session.stats, &session.stats);
        }
        if self.tables.demand.contains_key(&src) {
            // A member without a session with us: its address is its own all the same.
            return src == session.peer_addr;
        }
        src == session.peer_addr
            || self.subnet_route(src).is_some_and(|r| Arc::ptr_eq(&r.session.stats, &session.stats))
    }

    /// The session that carries packets to `dst`.
    pub fn session_for(&self, dst: Ipv4Addr) -> Option<&Arc<Session>> {
        self.tables.by_dst.get(&dst).map(|r| &r.session)
    }

    /// The session whose local index is `index` (an established or a held one).
    pub fn session_by_index(&self, index: u32) -> Option<&Arc<Session>> {
        self.tables.by_index.get(&index).or_else(|| self.held.get(&index))
    }

    /// Where to forward a relayed frame for node `dst`.
    pub fn next_hop(&self, dst: &[u8; 8]) -> Option<Endpoint> {
        self.tables.next_hops.get(dst).copied()
    }

    /// Whether `addr` is a direct neighbour (relayed frames are accepted only from these).
    pub fn is_neighbour(&self, addr: &Endpoint) -> bool {
        self.tables.neighbours.contains(addr)
    }

    /// This node's id.
    pub fn local(&self) -> &[u8; 8] {
        &self.tables.local
    }

    /// Number of routed destinations.
    pub fn route_count(&self) -> usize {
        self.tables.by_dst.len()
    }
}

/// Subnets as (masked network, prefix, value), longest prefix first.
fn by_prefix<T>(subnets: impl IntoIterator<Item = (Ipv4Addr, u8, T)>) -> Vec<(u32, u8, T)> {
    let mut v: Vec<(u32, u8, T)> = subnets.into_iter().map(|(a, p, r)| (u32::from(a) & prefix_mask(p), p, r)).collect();
    v.sort_by_key(|(_, p, _)| std::cmp::Reverse(*p));
    v
}

/// The longest entry of `table` (sorted by [`by_prefix`]) holding `dst`.
fn longest<T>(table: &[(u32, u8, T)], dst: Ipv4Addr) -> Option<(u8, &T)> {
    let d = u32::from(dst);
    table.iter().find(|(net, p, _)| d & prefix_mask(*p) == *net).map(|(_, p, r)| (*p, r))
}

/// The netmask of a prefix length, as a host-order integer (`/24` → `0xffffff00`).
pub fn prefix_mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) }
}

/// The network address of `addr/prefix` (host bits cleared).
pub fn network(addr: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(addr) & prefix_mask(prefix))
}

/// Whether the prefixes `a/p` and `b/q` share an address (one holds the other). With
/// `q == 32` this is whether `b` lies in `a/p`.
pub fn overlaps(a: Ipv4Addr, p: u8, b: Ipv4Addr, q: u8) -> bool {
    let m = prefix_mask(p.min(q));
    u32::from(a) & m == u32::from(b) & m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_overlap_when_one_holds_the_other() {
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(network(a("10.126.126.9"), 24), a("10.126.126.0"));
        assert!(overlaps(a("10.0.0.0"), 8, a("10.127.0.0"), 24));
        assert!(overlaps(a("10.127.0.0"), 24, a("10.0.0.0"), 8), "symmetric");
        assert!(!overlaps(a("10.126.126.0"), 24, a("10.127.0.0"), 24));
        assert!(overlaps(a("172.16.5.0"), 24, a("172.16.5.1"), 32), "an address in a subnet");
        assert!(overlaps(a("1.2.3.4"), 0, a("9.9.9.9"), 32), "/0 holds everything");
    }
    use crate::crypto::Cipher;
    use crate::handshake::SessionKeys;
    use crate::session::SessionParams;

    fn session(index: u32, peer_addr: [u8; 4], stats: &Arc<crate::stats::PeerStats>) -> Arc<Session> {
        Arc::new(Session::new(SessionParams {
            local_index: index,
            remote_index: index,
            cipher: Cipher::Aes128Gcm,
            keys: SessionKeys { send: [index as u8; 32], recv: [index as u8; 32] },
            endpoint: Endpoint::udp(std::net::SocketAddr::from(([192, 0, 2, index as u8], 11010))),
            peer_addr: peer_addr.into(),
            confirmed: true,
            stats: stats.clone(),
        }))
    }

    #[test]
    fn an_overlay_address_is_accepted_only_from_its_owner_before_subnets() {
        let (owner_stats, other_stats) = (Arc::default(), Arc::default());
        let owner = session(1, [10, 0, 0, 1], &owner_stats);
        let owner_rekeyed = session(3, [10, 0, 0, 1], &owner_stats);
        // A second member claiming the owner's address, and one proxying a subnet
        // that holds it.
        let claimer = session(2, [10, 0, 0, 1], &other_stats);
        let proxy_stats = Arc::default();
        let proxy = session(4, [10, 0, 0, 4], &proxy_stats);
        let route = |s: &Arc<Session>| Route { session: s.clone(), target: s.endpoint, relay: None };
        let snap = RouteSnapshot::with_relays(
            [0; 8],
            [(Ipv4Addr::new(10, 0, 0, 1), route(&owner)), (Ipv4Addr::new(10, 0, 0, 4), route(&proxy))],
            [owner.clone(), owner_rekeyed.clone(), claimer.clone(), proxy.clone()],
            [],
            [],
        )
        .with_subnets([
            (Ipv4Addr::new(10, 0, 0, 0), 24, route(&proxy)),
            (Ipv4Addr::new(172, 16, 0, 0), 16, route(&proxy)),
        ]);
        let a = Ipv4Addr::new(10, 0, 0, 1);
        assert!(snap.may_send_from(&owner, a));
        assert!(snap.may_send_from(&owner_rekeyed, a), "every session of the owner");
        assert!(!snap.may_send_from(&claimer, a), "a second claim of the address");
        assert!(!snap.may_send_from(&proxy, a), "a subnet that holds another member's address");
        assert!(snap.may_send_from(&proxy, Ipv4Addr::new(10, 0, 0, 9)), "the rest of the subnet");
        assert!(snap.may_send_from(&proxy, Ipv4Addr::new(172, 16, 3, 4)));
        assert!(!snap.may_send_from(&owner, Ipv4Addr::new(172, 16, 3, 4)));
        // An address nobody routes yet (a session still held): its own hello address.
        let held = session(5, [10, 0, 1, 7], &Arc::default());
        assert!(snap.may_send_from(&held, Ipv4Addr::new(10, 0, 1, 7)));
        assert!(!snap.may_send_from(&held, Ipv4Addr::new(10, 0, 1, 8)));
    }
}
