//! The route snapshot: an immutable view of "which session, sent where, carries packets
//! to this overlay address", "which session owns this receiver index" and "where to
//! forward a relayed frame", built by the control plane and swapped in atomically;
//! pipelines load it once per batch.

use std::net::Ipv4Addr;
use std::sync::Arc;

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

/// One immutable routing state.
#[derive(Debug, Default)]
pub struct RouteSnapshot {
    local: [u8; 8],
    by_dst: FxHashMap<Ipv4Addr, Route>,
    by_index: FxHashMap<u32, Arc<Session>>,
    next_hops: FxHashMap<[u8; 8], Endpoint>,
    neighbours: FxHashSet<Endpoint>,
    /// Proxied subnets, longest prefix first: (network, prefix, route).
    subnets: Vec<(u32, u8, Route)>,
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
        Self { by_dst, by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(), ..Self::default() }
    }

    /// Builds a full snapshot.
    pub fn with_relays(
        local: [u8; 8],
        routes: impl IntoIterator<Item = (Ipv4Addr, Route)>,
        receiving: impl IntoIterator<Item = Arc<Session>>,
        next_hops: impl IntoIterator<Item = ([u8; 8], Endpoint)>,
        neighbours: impl IntoIterator<Item = Endpoint>,
    ) -> Self {
        Self {
            local,
            by_dst: routes.into_iter().collect(),
            by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(),
            next_hops: next_hops.into_iter().collect(),
            neighbours: neighbours.into_iter().collect(),
            subnets: Vec::new(),
        }
    }

    /// Adds routes for subnets proxied by members (`--proxy-network`).
    pub fn with_subnets(mut self, subnets: impl IntoIterator<Item = (Ipv4Addr, u8, Route)>) -> Self {
        self.subnets = subnets.into_iter().map(|(a, p, r)| (u32::from(a) & prefix_mask(p), p, r)).collect();
        self.subnets.sort_by_key(|(_, p, _)| std::cmp::Reverse(*p));
        self
    }

    /// How to reach `dst`: its owner's overlay address, else the longest proxied
    /// subnet that holds it.
    pub fn route_for(&self, dst: Ipv4Addr) -> Option<&Route> {
        self.by_dst.get(&dst).or_else(|| self.subnet_route(dst))
    }

    fn subnet_route(&self, dst: Ipv4Addr) -> Option<&Route> {
        let d = u32::from(dst);
        self.subnets.iter().find(|(net, p, _)| d & prefix_mask(*p) == *net).map(|(_, _, r)| r)
    }

    /// Whether a packet from inner source `src` may come through `session`: the source
    /// is the peer's overlay address or inside a subnet the peer proxies.
    pub fn may_send_from(&self, session: &Session, src: Ipv4Addr) -> bool {
        src == session.peer_addr || self.subnet_route(src).is_some_and(|r| r.session.peer_addr == session.peer_addr)
    }

    /// The session that carries packets to `dst`.
    pub fn session_for(&self, dst: Ipv4Addr) -> Option<&Arc<Session>> {
        self.by_dst.get(&dst).map(|r| &r.session)
    }

    /// The session whose local index is `index`.
    pub fn session_by_index(&self, index: u32) -> Option<&Arc<Session>> {
        self.by_index.get(&index)
    }

    /// Where to forward a relayed frame for node `dst`.
    pub fn next_hop(&self, dst: &[u8; 8]) -> Option<Endpoint> {
        self.next_hops.get(dst).copied()
    }

    /// Whether `addr` is a direct neighbour (relayed frames are accepted only from these).
    pub fn is_neighbour(&self, addr: &Endpoint) -> bool {
        self.neighbours.contains(addr)
    }

    /// This node's id.
    pub fn local(&self) -> &[u8; 8] {
        &self.local
    }

    /// Number of routed destinations.
    pub fn route_count(&self) -> usize {
        self.by_dst.len()
    }
}

/// The netmask of a prefix length, as a host-order integer (`/24` → `0xffffff00`).
pub fn prefix_mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) }
}
