//! Packets for members without a session yet: queued, flushed when one is up, dropped past the bound.

use std::net::IpAddr;
use std::time::Instant;

use tracing::debug;

use super::{MAX_QUEUED, MAX_QUEUED_PER_PEER, Node, WANTED_FOR};
use crate::identity::{NodeId, PeerKey};

impl Node {
    /// A packet for a member without a session: hold it (a few per member) and start
    /// the handshake.
    pub(super) fn handle_unrouted(&mut self, now: Instant, dst: IpAddr, packet: &[u8]) {
        // The member it is for: from the snapshot the pipeline looked at, or (when a
        // session came up meanwhile, e.g. this is the answer to the packet that made
        // it) from the route the current snapshot has for it.
        let Some(snap) = self.published.last_snapshot.clone() else { return };
        let key = match snap.demand_for(dst) {
            Some(d) => self.peers.key_of(&NodeId::from_bytes(d.node)),
            None => snap.route_for(dst).and_then(|r| self.key_of_session(r.session.local_index)),
        };
        let Some(key) = key else {
            self.report.queued_dropped += 1;
            return;
        };
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.is_up() {
            // The session came up since the pipeline looked.
            if !self.send_sealed(&key, packet, 0, now) {
                self.report.queued_dropped += 1;
            }
            return;
        }
        p.wanted_until = Some(now + WANTED_FOR);
        if !self.peers.queue(&key, packet, MAX_QUEUED_PER_PEER, MAX_QUEUED) {
            self.report.queued_dropped += 1;
        }
        let Some(p) = self.peers.get(&key) else { return };
        if p.backoff.in_flight.is_none() && p.backoff.next_attempt.is_none_or(|t| now >= t) {
            debug!(peer = %p.id, %dst, "traffic for an idle member: starting a session");
            self.handshake_with(now, key);
        }
        self.touch(key);
    }

    /// Sends the packets queued for a peer on its new session.
    pub(super) fn flush_queued(&mut self, now: Instant, key: PeerKey) {
        let Some(p) = self.peers.get(&key) else { return };
        if !p.is_up() || !p.has_queued() {
            return;
        }
        let packets = self.peers.take_queued(&key);
        for pkt in &packets {
            if !self.send_sealed(&key, pkt, 0, now) {
                self.report.queued_dropped += 1;
            }
        }
    }

    /// Drops the packets queued for a peer (its handshake failed).
    pub(super) fn drop_queued(&mut self, key: PeerKey) {
        self.report.queued_dropped += self.peers.take_queued(&key).len() as u64;
    }

    // ----- sessions -----
}
