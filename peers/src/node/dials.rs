//! Endpoints this node dials (`--peer`, discovery) and when each is tried again.

use std::time::Instant;

use tracing::{debug, info};
use weft_core::endpoint::Endpoint;

use super::api::Dest;
use super::{DISCOVERED_ATTEMPTS, DISCOVERED_EXPIRY, Dial, MAX_DISCOVERED, Node, Target};
use crate::peer::{Anchor, Backoff};

impl Node {
    pub(super) fn push_dial(&mut self, dial: Dial) {
        self.dials.slots.insert(self.dials.next, dial);
        self.dials.next += 1;
    }

    // ----- inputs -----

    pub(super) fn handle_discovered(&mut self, now: Instant, endpoint: Endpoint) {
        if let Some(d) = self.dials.slots.values_mut().find(|d| d.endpoint == endpoint) {
            if d.discovered {
                d.announced = Some(now);
                // A dormant discovered endpoint announced itself again: try it again.
                if d.backoff.failures >= DISCOVERED_ATTEMPTS {
                    d.backoff = Backoff::default();
                }
            }
            return;
        }
        if self.peers.values().any(|p| p.path.direct().is_some_and(|d| d.endpoint == endpoint)) {
            return;
        }
        if self.dials.slots.values().filter(|d| d.discovered).count() >= MAX_DISCOVERED {
            debug!(%endpoint, "LAN beacon ignored: {MAX_DISCOVERED} discovered endpoints already");
            return;
        }
        info!(%endpoint, "member found on the LAN");
        self.push_dial(Dial {
            endpoint,
            key: None,
            backoff: Backoff::default(),
            discovered: true,
            announced: Some(now),
        });
    }

    pub(super) fn drive_dials(&mut self, now: Instant) {
        // Discovered endpoints that stopped announcing themselves are forgotten.
        self.dials.slots.retain(|_, d| {
            let stale = d.announced.is_some_and(|a| now.saturating_duration_since(a) >= DISCOVERED_EXPIRY);
            if stale {
                debug!(endpoint = %d.endpoint, "discovered endpoint expired");
            }
            !(d.discovered && stale)
        });
        let slots: Vec<usize> = self.dials.slots.keys().copied().collect();
        for i in slots {
            let Some(d) = self.dials.slots.get(&i) else { continue };
            if let Some(p) = d.key.and_then(|k| self.peers.get(&k)) {
                // Known: the peer's own timers keep its session (we dial it: a link).
                if p.anchor() != Anchor::Dialled {
                    let k = p.key;
                    self.peers.set_anchor(&k, Anchor::Dialled);
                    self.touch(k);
                }
                continue;
            }
            let dormant = d.discovered && d.backoff.failures >= DISCOVERED_ATTEMPTS;
            if dormant || d.backoff.in_flight.is_some() || now < d.backoff.next_attempt.unwrap_or(now) {
                continue;
            }
            let to = Dest::direct(d.endpoint);
            self.start_handshake(now, Target::Dial(i), to, None);
        }
    }

    /// When [`Node::drive_dials`] next has work.
    pub(super) fn dials_deadline(&self) -> Option<Instant> {
        self.dials
            .slots
            .values()
            .filter(|d| d.key.is_none_or(|k| !self.peers.contains_key(&k)))
            .filter_map(|d| {
                let expiry = d.announced.filter(|_| d.discovered).map(|a| a + DISCOVERED_EXPIRY);
                let dormant = d.discovered && d.backoff.failures >= DISCOVERED_ATTEMPTS;
                let retry = (!dormant && d.backoff.in_flight.is_none())
                    .then(|| d.backoff.next_attempt.unwrap_or(self.cfg.epoch));
                [expiry, retry].into_iter().flatten().min()
            })
            .min()
    }
}
