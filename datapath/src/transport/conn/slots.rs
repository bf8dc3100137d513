//! Connection slots: at most so many connections in all and per source, so that one
//! source cannot hold every slot; and until a connection proves it comes from a
//! member (a handshake message with a valid mac1), it also holds a place in a small
//! pool of unproven connections, which it gives back then, or loses with the
//! connection at [`PROOF_TIMEOUT`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use weft_core::admission::MacKeys;

use super::{PER_SOURCE_MAX, PROOF_TIMEOUT};
use crate::transport::connections::ConnCounters;
use crate::transport::frame;

/// Unproven connections one source may hold at once.
pub const UNPROVEN_PER_SOURCE: usize = 2;

/// The pool of unproven connections of a listener with `max_connections` slots: a
/// quarter of them, between 2 and 64.
pub fn unproven_limit(max_connections: usize) -> usize {
    (max_connections / 4).clamp(2, 64)
}

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

/// The connection slots of one listener: a total limit and one per source, and the
/// pool of unproven connections with its own per-source limit.
pub(super) struct Slots {
    pub(super) total: Arc<Semaphore>,
    pub(super) per_source: usize,
    pub(super) by_source: Mutex<HashMap<IpAddr, usize>>,
    unproven: Arc<Semaphore>,
    unproven_by_source: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a listener turned a connection away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Every slot is taken.
    Full,
    /// The source holds its share of the slots.
    Source,
    /// The pool of unproven connections, or the source's share of it, is full.
    Unproven,
}

impl Refused {
    pub(super) fn count(self, c: &ConnCounters) {
        match self {
            Self::Full => c.refused_full.fetch_add(1, Relaxed),
            Self::Source => c.refused_source.fetch_add(1, Relaxed),
            Self::Unproven => c.refused_unproven.fetch_add(1, Relaxed),
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
            unproven: Arc::new(Semaphore::new(unproven_limit(max_connections))),
            unproven_by_source: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for a connection from `ip`, and its place in the unproven pool.
    pub(super) fn take(self: &Arc<Self>, ip: IpAddr) -> Result<(Slot, Unproven), Refused> {
        let source = source_of(ip);
        let unproven = {
            let mut by = self.unproven_by_source.lock();
            let held = by.get(&source).copied().unwrap_or(0);
            if held >= UNPROVEN_PER_SOURCE {
                return Err(Refused::Unproven);
            }
            let permit = self.unproven.clone().try_acquire_owned().map_err(|_| Refused::Unproven)?;
            by.insert(source, held + 1);
            Unproven { slots: self.clone(), source, _permit: permit }
        };
        let slot = self.take_slot(source)?;
        Ok((slot, unproven))
    }

    fn take_slot(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refused> {
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
        give_back(&self.slots.by_source, self.source);
    }
}

/// Counts one connection of `source` less in a per-source map.
fn give_back(by: &Mutex<HashMap<IpAddr, usize>>, source: IpAddr) {
    let mut by = by.lock();
    if let Some(n) = by.get_mut(&source) {
        *n -= 1;
        if *n == 0 {
            by.remove(&source);
        }
    }
}

/// A place in the listener's pool of unproven connections, given back on drop.
pub(super) struct Unproven {
    slots: Arc<Slots>,
    source: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Unproven {
    fn drop(&mut self) {
        give_back(&self.slots.unproven_by_source, self.source);
    }
}

/// Whether an accepted connection has shown it comes from a member: a handshake,
/// reject or cookie message whose mac1 (the network's key) verifies. Until then it
/// holds its place in the unproven pool and must prove itself by its deadline;
/// connections we dialled are proven from the start.
pub(super) struct Proof {
    proven: AtomicBool,
    place: Mutex<Option<Unproven>>,
    deadline: Instant,
    macs: Option<Arc<MacKeys>>,
}

impl Proof {
    /// A connection we dialled.
    pub(super) fn dialled() -> Self {
        Self { proven: AtomicBool::new(true), place: Mutex::new(None), deadline: Instant::now(), macs: None }
    }

    /// An accepted connection holding `place`, with [`PROOF_TIMEOUT`] from now.
    pub(super) fn accepted(place: Unproven, macs: Arc<MacKeys>) -> Self {
        Self {
            proven: AtomicBool::new(false),
            place: Mutex::new(Some(place)),
            deadline: Instant::now() + PROOF_TIMEOUT,
            macs: Some(macs),
        }
    }

    /// Whether this is a connection a listener accepted.
    pub(super) fn is_accepted(&self) -> bool {
        self.macs.is_some()
    }

    /// Looks at a batch of whole frames while the connection is unproven: one MACed
    /// message with a valid mac1 proves it and gives its place in the pool back.
    pub(super) fn check(&self, batch: &[u8]) {
        if self.proven.load(Relaxed) {
            return;
        }
        let Some(macs) = &self.macs else { return };
        if frame::frames(batch).any(|f| f.is_ok_and(|f| macs.check(f).is_some())) {
            self.proven.store(true, Relaxed);
            self.place.lock().take();
        }
    }

    /// Resolves when the deadline passes with the connection still unproven (never,
    /// once it is proven).
    pub(super) async fn expired(&self) -> String {
        tokio::time::sleep_until(self.deadline).await;
        if self.proven.load(Relaxed) {
            std::future::pending::<()>().await;
        }
        format!("no handshake from a member within {} s", PROOF_TIMEOUT.as_secs())
    }
}
