//! Connection slots: at most so many connections in all and per source, so that one
//! source cannot hold every slot.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::PER_SOURCE_MAX;
use crate::transport::links::LinkCounters;

/// The most connections one source may hold on a listener with `max_connections`
/// slots: a quarter of them, at least one, at most [`PER_SOURCE_MAX`].
pub fn per_source_limit(max_connections: usize) -> usize {
    (max_connections / 4).clamp(1, PER_SOURCE_MAX)
}

/// What counts as one source: an IPv4 address, or an IPv6 /48 (what one site is
/// usually given: a /64 each would let one site hold every slot with 32 of its
/// 65536 subnets); IPv4-mapped IPv6 addresses count as IPv4.
pub(super) fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & (u128::MAX << 80))),
        v4 => v4,
    }
}

/// The connection slots of one listener: a total limit and one per source.
pub(super) struct Slots {
    pub(super) total: Arc<Semaphore>,
    pub(super) per_source: usize,
    pub(super) by_source: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a listener turned a connection away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Every slot is taken.
    Full,
    /// The source holds its share of the slots.
    Source,
}

impl Refused {
    pub(super) fn count(self, c: &LinkCounters) {
        match self {
            Self::Full => c.refused_full.fetch_add(1, Relaxed),
            Self::Source => c.refused_source.fetch_add(1, Relaxed),
        };
    }
}

/// A taken slot, given back on drop.
pub(super) struct Slot {
    pub(super) slots: Arc<Slots>,
    pub(super) source: IpAddr,
    pub(super) _permit: OwnedSemaphorePermit,
}

impl Slots {
    pub(super) fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            total: Arc::new(Semaphore::new(max_connections)),
            per_source: per_source_limit(max_connections),
            by_source: Mutex::new(HashMap::new()),
        })
    }

    pub(super) fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refused> {
        let source = source_of(ip);
        let mut by = self.by_source.lock();
        let held = by.get(&source).copied().unwrap_or(0);
        if held >= self.per_source {
            return Err(Refused::Source);
        }
        let permit = self.total.clone().try_acquire_owned().map_err(|_| Refused::Full)?;
        by.insert(source, held + 1);
        Ok(Slot { slots: self.clone(), source, _permit: permit })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by = self.slots.by_source.lock();
        if let Some(n) = by.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.source);
            }
        }
    }
}
