//! A finished handshake becomes a session: the claim checks, the peer table entry, the route.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};
use weft_control::FailureKind;
use weft_core::endpoint::Endpoint;
use weft_core::session::{Session, SessionParams};

use super::api::Dest;
use super::timers::keepalive;
use super::{Finished, HELD_TIMEOUT, Held, MAX_HELD, MAX_SESSIONS, Node, Target, Wake};
use crate::identity::{NodeId, PeerKey};
use crate::peer::{Anchor, Peer, PeerPath, SessionEntry};
use crate::timing::ms_since;

impl Node {
    /// A handshake finished. The session is held until the peer has proven it knows
    /// the PSK (`confirmed`, or later its first data packet); only then does the peer
    /// exist for routing and status, so that nodes without the secret leave no trace
    /// beyond a refused-handshake record.
    pub(super) fn complete(&mut self, now: Instant, f: Finished) {
        let Finished { done, from, via, local, remote, target, confirmed, secret } = f;
        let ours = self.cfg.handshake.hello.clone();
        let id = NodeId::from_public(&done.remote_static);
        let mismatch = if done.hello.cipher != ours.cipher {
            Some(format!("cipher mismatch: we use {}, peer {id} at {from} uses {}", ours.cipher, done.hello.cipher))
        } else if done.hello.ipv4 == ours.ipv4 {
            Some(format!("address conflict: peer {id} at {from} also claims {}", ours.ipv4))
        } else if let Some(why) = self.claim_refused(now, &PeerKey(done.remote_static), &done.hello, from, via) {
            // XX responder (the finish carried the hello): tell the initiator why.
            self.refuse_claim(now, Dest::reply(from, via, self.id), remote, target, why);
            return;
        } else {
            None
        };
        let taken = (done.hello.ipv4 == ours.ipv4).then_some(done.hello.ipv4);
        let stats = self.peers.get(&PeerKey(done.remote_static)).map(|p| p.stats.clone()).unwrap_or_default();
        let session = Arc::new(Session::new(SessionParams {
            local_index: local,
            remote_index: remote,
            cipher: ours.cipher,
            keys: done.keys,
            endpoint: from,
            peer_addr: done.hello.ipv4,
            peer_addr6: None,
            confirmed,
            stats,
        }));
        session.set_created_ms(ms_since(self.cfg.epoch, now));
        session.set_peer_gso(done.hello.gso);
        session.set_peer_gso_quic(done.hello.gso_quic);
        let held = Held {
            key: PeerKey(done.remote_static),
            hello: done.hello,
            from,
            via,
            entry: SessionEntry { session: session.clone(), created: now, initiator: target.is_some() },
            target,
            problem: mismatch.map(|msg| (msg, taken)),
            secret,
        };
        if confirmed {
            // We have proof of the peer's keys but it has none of ours yet: a keepalive
            // at once lets it confirm (also when we refuse the session: the peer may act
            // on a conflict only once we proved ourselves).
            let ka = keepalive(&session, now, self.cfg.epoch);
            self.actions.push_back(Dest::reply(from, via, self.id).send(ka));
            self.promote(now, held);
        } else {
            // Nothing about an unproven peer is acted on or shown: no route, no status
            // row, no --dhcp move, until its first authenticated packet.
            if self.pending.held.len() >= MAX_HELD
                && let Some((&oldest, _)) = self.pending.held.iter().min_by_key(|(_, h)| h.entry.created)
            {
                self.pending.held.remove(&oldest);
                self.gate.count_evicted();
            }
            self.pending.held.insert(local, held);
            self.published.held_dirty = true;
            self.deadlines.at_most(Wake::Handshakes, now + HELD_TIMEOUT);
        }
    }

    /// A proven peer's handshake that we refuse (cipher mismatch, address conflict).
    pub(super) fn refuse_proven(
        &mut self,
        now: Instant,
        from: Endpoint,
        target: Option<Target>,
        msg: String,
        taken: Option<Ipv4Addr>,
    ) {
        if taken.is_some() && self.cfg.dynamic.is_some() {
            // Our --dhcp address is taken: move, and let the retry find us elsewhere.
            self.move_address(now, taken);
        }
        warn!("{msg}");
        match target {
            Some(t) => self.handshake_failed(now, t, msg, FailureKind::AddressTaken),
            None => self.record_inbound_failure(now, from, msg, FailureKind::AddressTaken),
        }
    }

    /// Moves a confirmed session into its peer, creating the peer if it is new.
    pub(super) fn promote(&mut self, now: Instant, h: Held) {
        let Held { key, hello, from, via, entry, target, problem, secret } = h;
        if let Some((msg, taken)) = problem {
            self.refuse_proven(now, from, target, msg, taken);
            return;
        }
        let id = key.id();
        if let Some(why) = self.claim_refused(now, &key, &hello, from, via) {
            self.refuse_claim(now, Dest::reply(from, via, self.id), entry.session.remote_index, target, why);
            self.published.routes_dirty = true;
            return;
        }
        // A node that came back with a new key at the same endpoint replaces its old entry:
        // once the old entry is down, or at once if it claims the old entry's endpoint
        // and address (a restart faster than dead_after).
        let stale: Vec<PeerKey> = self
            .peers
            .iter()
            .filter(|(k, p)| {
                let same_endpoint = via.is_none() && p.path.endpoint() == Some(from);
                let same_addr = p.hello.ipv4 == hello.ipv4;
                **k != key && (same_endpoint || same_addr) && (!p.is_up() || (same_endpoint && same_addr))
            })
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            info!(old = %k.id(), new = %id, "peer replaced by a node with a new key");
            self.peers.remove(&k);
            self.mesh.topology.remove(&k.id());
            self.mesh.paths_changed(now);
            for d in self.dials.slots.values_mut() {
                if d.key == Some(k) {
                    d.key = None;
                }
            }
        }
        let mut dialled = false;
        if let Some(Target::Dial(i)) = target
            && let Some(d) = self.dials.slots.get_mut(&i)
        {
            d.key = Some(key);
            d.backoff.succeeded();
        }
        dialled |= self.dials.slots.values().any(|d| d.key == Some(key));
        let stats = entry.session.stats.clone();
        let now_ms = ms_since(self.cfg.epoch, now);
        let was_link = self.peers.get_or_insert_with(key, || Peer::new(key, hello.clone(), now, stats)).is_link(now);
        if dialled {
            self.peers.set_anchor(&key, Anchor::Dialled);
        }
        let Some(peer) = self.peers.get_mut(&key) else { return };
        peer.hello = hello;
        peer.secret = secret;
        // A handshake that arrived straight from the peer proves a direct path.
        if via.is_none() {
            if peer.path.direct().is_none_or(|d| d.endpoint != from) {
                peer.path.go_direct(from, now);
            } else if let PeerPath::Direct(d) = &mut peer.path {
                d.seen = Some(now);
            }
        } else if peer.path.is_direct() && {
            let last = peer.sessions.iter().map(|s| s.session.last_direct_rx_ms()).max().unwrap_or(0);
            self.cfg.timers.is_stale(Duration::from_millis(now_ms.saturating_sub(last)))
        } {
            // The peer came through a relay although we thought we had a direct path,
            // and nothing arrived on that path lately: it cannot hear us directly.
            // Relay until a punch proves the path again.
            info!(peer = %id, "peer handshaked through a relay; direct path considered down");
            peer.path.lose_direct();
        }
        info!(peer = %id, addr = %peer.hello.ipv4, %from, relayed = via.is_some(), initiator = entry.initiator, "session established");
        self.report.handshakes_completed += 1;
        peer.sessions.insert(0, entry);
        peer.sessions.truncate(MAX_SESSIONS);
        peer.dropped = None;
        peer.last_handshake = Some(now);
        peer.error = None;
        peer.down_since = None;
        peer.backoff.succeeded();
        // A new session counts as traffic: it is not retired before it had a chance.
        peer.activity.touch(now);
        let link = peer.is_link(now);
        self.published.routes_dirty = true;
        self.mesh.record_changed(now);
        if link && !was_link {
            // A new link: compare tables (the neighbour pulls what it lacks).
            self.send_summary(now, key);
        }
        self.flush_queued(now, key);
        // A new session: the member is sent every revocation again (it may have
        // been offline when they spread).
        if let Some(p) = self.peers.get_mut(&key) {
            p.revocations_sent = 0;
            p.policy_sent = 0;
        }
        // The certificate it was admitted with may be the newest seen for its key.
        let cert = self.peers.get(&key).and_then(|p| p.hello.cert.clone());
        self.note_certificate(now, cert.as_deref());
        self.send_revocations(now, key);
        self.send_policy(now, key);
        self.touch(key);
    }
}
