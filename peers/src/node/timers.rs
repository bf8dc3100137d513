//! Each peer's timers: what is due now (rekey, keepalive, retire, forget) and when to wake, read from one plan.

use std::time::{Duration, Instant};

use rand::RngCore;
use tracing::{debug, info, warn};
use weft_core::session::Session;
use weft_core::wire::DATA_HEADER_LEN;

use super::{ACTIVE_WINDOW, CONFIRM_TIMEOUT, IDLE_RETIRE, Node, PING_EVERY, REKEY_AFTER_PACKETS, RETIRE_IDLE};
use crate::identity::PeerKey;
use crate::peer::{Anchor, Backoff, Peer, SessionTimers};
use crate::status::{PathStatus, PeerState, PeerStatus};
use crate::timing::ms_since;

impl Node {
    /// Whether we want a session with this peer although none is up: we dial it, it
    /// kept a link with us until recently, or traffic for it is waiting.
    pub(super) fn wants_session(&self, p: &Peer, now: Instant) -> bool {
        let recently_up =
            now.saturating_duration_since(p.down_since.unwrap_or(p.first_seen)) < self.cfg.timers.learned_retry;
        let retried_link = match p.anchor() {
            Anchor::Dialled => recently_up || self.dials.slots.values().any(|d| d.key == Some(p.key) && !d.discovered),
            Anchor::ByPeer(_) => recently_up,
            Anchor::None => false,
        };
        retried_link || p.wanted_until.is_some_and(|w| now < w)
    }

    /// One peer's timers. A link (a direct neighbour one end dials) keeps its session
    /// with keepalives and is declared dead after `dead_after` of silence. Any other
    /// session lives while data flows: keepalives only answer data (so a one-way
    /// stream still proves the path), it is dead when data sent gets nothing back
    /// for `dead_after`, and it is retired after [`IDLE_RETIRE`] without data. Probes
    /// run on links and active sessions; hole punching only for active ones.
    pub(super) fn drive_peer(&mut self, now: Instant, key: PeerKey) {
        // The next batch of revocations it lacks, when one is due (paced).
        self.send_revocations(now, key);
        let t = self.cfg.timers;
        let epoch = self.cfg.epoch;
        let now_ms = ms_since(epoch, now);
        let Some(peer) = self.peers.get_mut(&key) else { return };
        let last_rx_ms = peer.last_rx_ms();
        let last_rx = (last_rx_ms > 0).then(|| epoch + Duration::from_millis(last_rx_ms - 1));
        peer.activity.sample(&peer.stats, now, last_rx);
        if let Anchor::ByPeer(until) = peer.anchor()
            && now >= until
        {
            debug!(peer = %peer.id, "neighbour stopped keeping its link with us");
            self.peers.set_anchor(&key, Anchor::None);
            self.mesh.record_changed(now);
        }
        let Some(peer) = self.peers.get_mut(&key) else { return };
        if retire_sessions(peer, now, epoch) {
            self.published.routes_dirty = true;
        }
        let kept = peer.anchor() != Anchor::None;
        if let Some(d) = &peer.dropped
            && (d.session.is_expired(now_ms)
                || peer.down_since.is_none_or(|t| now.saturating_duration_since(t) >= IDLE_RETIRE))
        {
            peer.dropped = None;
            self.published.routes_dirty = true;
        }
        let Some(tx) = peer.tx().cloned() else {
            if peer.sessions.is_empty() && peer.path.is_direct() && !kept {
                peer.path.lose_direct();
            }
            let (in_flight, due) = (peer.backoff.in_flight.is_some(), now >= peer.backoff.next_attempt.unwrap_or(now));
            if !in_flight && due && self.peers.get(&key).is_some_and(|p| self.wants_session(p, now)) {
                self.handshake_with(now, key);
            } else if !in_flight && self.forgettable(&key, now) {
                info!(peer = %key.id(), "forgetting silent peer");
                self.peers.remove(&key);
                self.published.routes_dirty = true;
            }
            return;
        };
        let plan = SessionTimers::of(&t, epoch, peer, &tx, now);
        let silent = now_ms.saturating_sub(last_rx_ms.max(ms_since(epoch, tx.created)));
        if SessionTimers::due(plan.dead, now) {
            let msg = format!("peer not responding: nothing received for {} s", silent / 1000);
            warn!(peer = %peer.id, "{msg}");
            peer.error = Some(msg);
            peer.dropped = peer.tx().cloned();
            peer.sessions.clear();
            peer.down_since = Some(now);
            peer.backoff = Backoff::default();
            peer.activity.unanswered_since = None;
            if !kept {
                peer.path.lose_direct();
            }
            self.published.routes_dirty = true;
            self.mesh.record_changed(now);
            if self.peers.get(&key).is_some_and(|p| self.wants_session(p, now)) {
                self.handshake_with(now, key);
            }
            return;
        }
        if SessionTimers::due(plan.retire, now) {
            debug!(peer = %peer.id, "no traffic for {} s: session retired", IDLE_RETIRE.as_secs());
            peer.sessions.clear();
            peer.path.lose_direct();
            peer.wanted_until = None;
            self.published.routes_dirty = true;
            return;
        }
        let active = kept || peer.activity.active(now, ACTIVE_WINDOW);
        // The packet limit is counted, not timed: checked here, whenever the peer is
        // driven, under the same conditions as the timed rekey.
        let rekey = SessionTimers::due(plan.rekey, now)
            || (plan.rekey.is_some()
                && tx.session.sent_packets() >= REKEY_AFTER_PACKETS
                && now >= peer.backoff.next_attempt.unwrap_or(now));
        let send_keepalive = SessionTimers::due(plan.keepalive, now);
        let probe = SessionTimers::due(plan.probe, now);
        // No punching while a degraded direct path is left alone.
        let punch = !kept
            && !peer.path.is_direct()
            && active
            && peer.punch.next_attempt.is_none_or(|n| now >= n)
            && !peer.degraded.as_ref().is_some_and(|d| d.holds(now));
        let summary = SessionTimers::due(plan.summary, now);
        let pmtu = SessionTimers::due(plan.pmtu, now);
        if rekey {
            debug!(peer = %peer.id, "rekeying");
            self.handshake_with(now, key);
        }
        if send_keepalive && let Some(d) = self.dest_for(&key) {
            self.actions.push_back(d.send(keepalive(&tx.session, now, epoch)));
        } else if self.nat_keepalive_due(now, &key)
            && let Some(d) = self.dest_for(&key)
        {
            // An idle direct path across our NAT (`nat_keepalive`).
            self.actions.push_back(d.send(keepalive(&tx.session, now, epoch)));
        }
        if probe {
            let nonce = self.rng.next_u64();
            if let Some(p) = self.peers.get_mut(&key) {
                p.probe.sent(nonce, now);
                // A router or exit in use is watched closely (its loss moves routes),
                // and a direct UDP path carrying data is checked for loss.
                let every = if p.watch_since.is_some() {
                    super::routers::WATCH_EVERY
                } else if super::paths::loss_watched(p, now) {
                    super::paths::LOSS_PROBE_EVERY
                } else {
                    PING_EVERY
                };
                p.probe.next = Some(now + every);
            }
            self.send_msg(&key, &crate::mesh::Msg::Ping(nonce), now);
            self.check_degraded(now, key);
        }
        if summary {
            self.send_summary(now, key);
        }
        if punch {
            self.punch(now, key);
        }
        self.drive_birthday(now, key, active);
        if pmtu {
            self.drive_path_mtu(now, key);
        } else {
            // A session made since the last round learns what the path carries.
            self.apply_path_mtu(&key);
        }
        self.drive_direct(now, key);
    }

    /// A peer that is no use any more: no session, not wanted, not a member we can
    /// reach, silent for `learned_retry`.
    pub(super) fn forgettable(&self, key: &PeerKey, now: Instant) -> bool {
        let Some(p) = self.peers.get(key) else { return false };
        let down_for = now.saturating_duration_since(p.down_since.unwrap_or(p.first_seen));
        p.sessions.is_empty()
            && !p.has_queued()
            && !self.wants_session(p, now)
            && !self.mesh.paths.contains_key(&p.id)
            && self.mesh.topology.get(&p.id).is_none()
            && down_for >= self.cfg.timers.learned_retry
    }

    /// When [`Node::drive_peer`] next has work for a peer (`None`: nothing until an
    /// input arrives).
    pub(super) fn peer_deadline(&self, key: &PeerKey, now: Instant) -> Option<Instant> {
        let p = self.peers.get(key)?;
        let t = self.cfg.timers;
        let epoch = self.cfg.epoch;
        let at_ms = |ms: u64| epoch + Duration::from_millis(ms.saturating_sub(1));
        let by_peer = match p.anchor() {
            Anchor::ByPeer(until) => Some(until),
            _ => None,
        };
        let Some(tx) = p.tx() else {
            let retire_unconfirmed = p.sessions.iter().map(|s| s.created + CONFIRM_TIMEOUT).min();
            let retry = (p.backoff.in_flight.is_none() && self.wants_session(p, now))
                .then(|| p.backoff.next_attempt.unwrap_or(now));
            // Forgetting a link that went silent is checked now and then (a member known
            // only from its record goes with the record: Mesh::expire).
            let forget = ((p.sessions.is_empty() && p.anchor() != Anchor::None) || p.down_since.is_some())
                .then(|| now + t.learned_retry);
            return [retire_unconfirmed, retry, forget, by_peer].into_iter().flatten().min();
        };
        let plan = SessionTimers::of(&t, epoch, p, tx, now);
        let mut v: Vec<Instant> = Vec::with_capacity(8);
        v.extend(by_peer);
        // A session that is not a link: its rekey, and the sample below (see
        // SessionTimers: activity is sampled per wake).
        if p.anchor() == Anchor::None {
            v.extend(plan.rekey);
            // A watched router's pings, and a direct path's loss probes. (Its path
            // MTU rounds run at the wakes it has anyway: see SessionTimers.)
            if p.watch_since.is_some() || super::paths::loss_watched(p, now) {
                v.extend(plan.probe);
            }
        } else {
            v.extend(plan.earliest());
        }
        if p.sessions.len() > 1 {
            v.push(now + RETIRE_IDLE / 2);
        }
        if tx.session.expires_at_ms() != u64::MAX {
            v.push(at_ms(tx.session.expires_at_ms()));
        }
        if p.anchor() == Anchor::None {
            // Traffic is sampled (from the pipelines' counters) each keepalive
            // interval while the session lives: activity moves the plan.
            v.push(now + t.keepalive);
        }
        v.extend(self.direct_deadline(p, now));
        v.extend(p.birthday.as_ref().filter(|_| !p.path.is_direct()).map(|(b, _)| b.deadline()));
        // A member catching up on a long list of revocations gets the next batch a
        // second after the last, whether or not it says anything meanwhile.
        if p.revocations_sent < self.trust.revocations.list().len()
            && p.is_up()
            && p.hello.protocol().caps & weft_core::handshake::caps::REVOCATIONS != 0
        {
            v.push(p.revocations_at.map_or(now, |t| t + Duration::from_secs(1)));
        }
        v.into_iter().min()
    }
}

/// Retires `peer`'s sessions that expired, were never confirmed within
/// [`CONFIRM_TIMEOUT`], or are superseded by a newer confirmed one and idle for
/// [`RETIRE_IDLE`]. Returns whether any went.
pub(super) fn retire_sessions(peer: &mut Peer, now: Instant, epoch: Instant) -> bool {
    let now_ms = ms_since(epoch, now);
    let newest_confirmed = peer.sessions.iter().position(|s| s.session.is_confirmed());
    let before = peer.sessions.len();
    let mut i = 0;
    peer.sessions.retain(|s| {
        let idx = i;
        i += 1;
        let age = now.duration_since(s.created);
        if s.session.is_expired(now_ms) {
            return false;
        }
        if !s.session.is_confirmed() {
            return age < CONFIRM_TIMEOUT;
        }
        match newest_confirmed {
            Some(n) if idx > n => {
                let idle = now_ms.saturating_sub(s.session.last_rx_ms().max(ms_since(epoch, s.created)));
                idle < RETIRE_IDLE.as_millis() as u64
            }
            _ => true,
        }
    });
    peer.sessions.len() != before
}

/// Seals an empty data packet on `session`.
pub(crate) fn keepalive(session: &Session, now: Instant, epoch: Instant) -> Vec<u8> {
    let mut buf = vec![0u8; DATA_HEADER_LEN + 16];
    let n = session.seal(&mut buf, 0).unwrap_or(0);
    buf.truncate(n);
    session.touch_tx(ms_since(epoch, now));
    buf
}

impl Peer {
    pub(super) fn status(&self, now: Instant, path: PathStatus, reachable: bool) -> PeerStatus {
        let state = if self.is_up() {
            PeerState::Established
        } else if self.backoff.in_flight.is_some() || !self.sessions.is_empty() {
            PeerState::Connecting
        } else if self.error.is_some() && (self.anchor() != Anchor::None || self.wanted_until.is_some_and(|w| now < w))
        {
            PeerState::Down
        } else if reachable {
            PeerState::Idle
        } else if self.error.is_some() {
            PeerState::Down
        } else {
            PeerState::Connecting
        };
        PeerStatus {
            node_id: self.key.id(),
            hostname: self.hello.hostname.clone(),
            overlay: self.hello.ipv4,
            overlay6: self.hello.ipv6.map(|(a, _)| a),
            endpoint: self.path.endpoint(),
            path,
            rtt: self.probe.rtt,
            loss: self.probe.loss(now),
            state,
            link: self.is_link(now),
            last_handshake: self.last_handshake.map(|t| now.saturating_duration_since(t)),
            sessions: self.sessions.len(),
            protocol: self.hello.protocol.map(|p| p.version),
            secret: self.last_handshake.map(|_| self.secret),
            error: self.error.clone(),
            stats: self.stats.clone(),
            path_mtu: self.pmtu.known().then_some(self.pmtu.mtu),
            gso_off: self.pmtu.gso_broken,
            degraded: self.degraded.as_ref().filter(|d| d.holds(now)).map(|d| d.why.clone()),
            nat_keepalive: None,
            no_direct: None,
            hard_nat: (self.probes_sent, self.opener.total),
            punches: self.punches_sent,
            key: self.key.0,
            groups: Vec::new(),
            cert_not_after: None,
            neighbours: Vec::new(),
        }
    }
}
