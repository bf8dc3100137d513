//! The route snapshot: an immutable view of "which session, sent where, carries packets
//! to this overlay address", "which session owns this receiver index" and "where to
//! forward a relayed frame", built by the control plane and swapped in atomically;
//! pipelines load it once per batch.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::session::Session;
use crate::wire::RelayHeader;

/// How to send to one destination.
#[derive(Debug, Clone)]
pub struct Route {
    /// The end-to-end session with the destination.
    pub session: Arc<Session>,
    /// Where the datagram goes: the destination itself, or the first relay.
    pub target: SocketAddr,
    /// Present when the path is relayed: the header to put in front.
    pub relay: Option<RelayHeader>,
}

/// One immutable routing state.
#[derive(Debug, Default)]
pub struct RouteSnapshot {
    local: [u8; 8],
    by_dst: FxHashMap<Ipv4Addr, Route>,
    by_index: FxHashMap<u32, Arc<Session>>,
    next_hops: FxHashMap<[u8; 8], SocketAddr>,
    neighbours: FxHashSet<SocketAddr>,
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
        next_hops: impl IntoIterator<Item = ([u8; 8], SocketAddr)>,
        neighbours: impl IntoIterator<Item = SocketAddr>,
    ) -> Self {
        Self {
            local,
            by_dst: routes.into_iter().collect(),
            by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(),
            next_hops: next_hops.into_iter().collect(),
            neighbours: neighbours.into_iter().collect(),
        }
    }

    /// How to reach `dst`.
    pub fn route_for(&self, dst: Ipv4Addr) -> Option<&Route> {
        self.by_dst.get(&dst)
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
    pub fn next_hop(&self, dst: &[u8; 8]) -> Option<SocketAddr> {
        self.next_hops.get(dst).copied()
    }

    /// Whether `addr` is a direct neighbour (relayed frames are accepted only from these).
    pub fn is_neighbour(&self, addr: &SocketAddr) -> bool {
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
