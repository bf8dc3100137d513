//! The route snapshot: an immutable view of "which session carries packets to this
//! overlay address" and "which session owns this receiver index", built by the control
//! plane and swapped in atomically; pipelines load it once per batch.

use std::net::Ipv4Addr;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::session::Session;

/// One immutable routing state.
#[derive(Debug, Default)]
pub struct RouteSnapshot {
    by_dst: FxHashMap<Ipv4Addr, Arc<Session>>,
    by_index: FxHashMap<u32, Arc<Session>>,
}

impl RouteSnapshot {
    /// Builds a snapshot from the sending session per destination and every session
    /// that may receive.
    pub fn new(
        routes: impl IntoIterator<Item = (Ipv4Addr, Arc<Session>)>,
        receiving: impl IntoIterator<Item = Arc<Session>>,
    ) -> Self {
        Self {
            by_dst: routes.into_iter().collect(),
            by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(),
        }
    }

    /// The session that carries packets to `dst`.
    pub fn session_for(&self, dst: Ipv4Addr) -> Option<&Arc<Session>> {
        self.by_dst.get(&dst)
    }

    /// The session whose local index is `index`.
    pub fn session_by_index(&self, index: u32) -> Option<&Arc<Session>> {
        self.by_index.get(&index)
    }

    /// Number of routed destinations.
    pub fn route_count(&self) -> usize {
        self.by_dst.len()
    }
}
