//! Per-peer state of the session engine.

use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_core::transport::Endpoint;

use weft_core::handshake::Hello;
use weft_core::session::Session;
use weft_core::stats::PeerStats;

use crate::identity::NodeId;
use crate::node::Timers;

/// Handshake retry state: what is in flight and when to try next.
#[derive(Debug, Default, Clone)]
pub(crate) struct Driver {
    /// Local index of the handshake we are waiting on.
    pub(crate) in_flight: Option<u32>,
    /// Do not start another handshake before this.
    pub(crate) next_attempt: Option<Instant>,
    /// Current retry delay (zero before the first failure).
    pub(crate) backoff: Duration,
    /// Consecutive failures.
    pub(crate) failures: u32,
    /// Why the last attempt failed.
    pub(crate) error: Option<String>,
}

impl Driver {
    pub(crate) fn failed(&mut self, now: Instant, t: &Timers, jitter: u32) {
        self.failures += 1;
        self.backoff = if self.backoff.is_zero() { t.initial_backoff } else { (self.backoff * 2).min(t.max_backoff) };
        // Up to 25 % jitter so that many nodes do not retry in lockstep.
        let spread = self.backoff.as_millis() as u64 / 4;
        let j = if spread == 0 { 0 } else { u64::from(jitter) % spread };
        self.next_attempt = Some(now + self.backoff + Duration::from_millis(j));
    }

    pub(crate) fn succeeded(&mut self) {
        *self = Self::default();
    }
}

/// A session with what the engine knows about it.
#[derive(Debug, Clone)]
pub(crate) struct SessionEntry {
    pub(crate) session: Arc<Session>,
    pub(crate) created: Instant,
    pub(crate) initiator: bool,
}

/// A remote node, keyed by its static public key.
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) key: [u8; 32],
    pub(crate) id: NodeId,
    pub(crate) hello: Hello,
    /// Where the peer is reached directly (observed or configured), if anywhere.
    pub(crate) endpoint: Option<Endpoint>,
    /// Whether the direct endpoint currently works (authenticated packets arrive on it).
    pub(crate) direct: bool,
    /// When the direct path last came up.
    pub(crate) direct_since: Option<Instant>,
    /// When packets last arrived on `endpoint` itself (rather than on another path).
    pub(crate) path_seen: Option<Instant>,
    /// Probes of better transports than the current direct path's.
    pub(crate) upgrade: Driver,
    /// Next probe of every candidate while the direct path is stale.
    pub(crate) failover_next: Option<Instant>,
    pub(crate) stats: Arc<PeerStats>,
    /// Latency and loss probes.
    pub(crate) probe: Probe,
    /// Hole punching towards a relayed peer.
    pub(crate) punch: Driver,
    /// The peer's punch requests are not answered again before this (rate limit).
    pub(crate) punch_answer_next: Option<Instant>,
    /// Newest first.
    pub(crate) sessions: Vec<SessionEntry>,
    pub(crate) driver: Driver,
    pub(crate) last_handshake: Option<Instant>,
    pub(crate) error: Option<String>,
    /// Dialled from the configuration: retried forever.
    pub(crate) configured: bool,
    pub(crate) first_seen: Instant,
    pub(crate) down_since: Option<Instant>,
}

impl Peer {
    /// Whether nothing arrived on the direct path's own endpoint for `after`.
    pub(crate) fn path_stale(&self, now: Instant, after: Duration) -> bool {
        self.path_seen.is_none_or(|t| now.saturating_duration_since(t) >= after)
    }

    pub(crate) fn new(
        key: [u8; 32],
        hello: Hello,
        endpoint: Option<Endpoint>,
        now: Instant,
        stats: Arc<PeerStats>,
    ) -> Self {
        Self {
            key,
            id: NodeId::from_public(&key),
            hello,
            endpoint,
            direct: false,
            direct_since: None,
            path_seen: None,
            upgrade: Driver::default(),
            failover_next: None,
            stats,
            probe: Probe::default(),
            punch: Driver::default(),
            punch_answer_next: None,
            sessions: Vec::new(),
            driver: Driver::default(),
            last_handshake: None,
            error: None,
            configured: false,
            first_seen: now,
            down_since: None,
        }
    }
}

/// Round-trip probes of one peer: a ping every few seconds, the last ten remembered.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    /// (nonce, sent at, answered) of recent pings, oldest first.
    pub(crate) recent: std::collections::VecDeque<(u64, Instant, bool)>,
    /// Smoothed round-trip time.
    pub(crate) rtt: Option<Duration>,
    pub(crate) next: Option<Instant>,
}

impl Probe {
    const KEEP: usize = 10;
    /// A ping unanswered for this long counts as lost.
    pub(crate) const LOST_AFTER: Duration = Duration::from_secs(3);

    pub(crate) fn sent(&mut self, nonce: u64, now: Instant) {
        if self.recent.len() == Self::KEEP {
            self.recent.pop_front();
        }
        self.recent.push_back((nonce, now, false));
    }

    pub(crate) fn answered(&mut self, nonce: u64, now: Instant) -> bool {
        let Some(e) = self.recent.iter_mut().find(|e| e.0 == nonce && !e.2) else { return false };
        e.2 = true;
        let sample = now.saturating_duration_since(e.1);
        self.rtt = Some(match self.rtt {
            Some(r) => (r * 7 + sample) / 8,
            None => sample,
        });
        true
    }

    /// Fraction of decided pings (answered, or older than LOST_AFTER) that were lost.
    pub(crate) fn loss(&self, now: Instant) -> Option<f32> {
        let decided: Vec<bool> = self
            .recent
            .iter()
            .filter(|(_, at, ok)| *ok || now.saturating_duration_since(*at) >= Self::LOST_AFTER)
            .map(|(_, _, ok)| *ok)
            .collect();
        if decided.is_empty() {
            return None;
        }
        Some(decided.iter().filter(|ok| !**ok).count() as f32 / decided.len() as f32)
    }
}
