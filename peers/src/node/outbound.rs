//! Handshakes this node starts: target choice, the initiator's messages, indices, and the expiry of those not answered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;
use tracing::{debug, info, warn};
use weft_control::FailureKind;
use weft_core::admission::Which;
use weft_core::endpoint::Endpoint;
use weft_core::handshake::{Initiator, Params};
use weft_core::session::Session;
use weft_core::wire::{HandshakeHeader, MessageType, RejectRepr};

use super::api::Dest;
use super::{CONFIRM_TIMEOUT, HELD_TIMEOUT, Node, PendingInit, Target, Wake};
use crate::identity::PeerKey;
use crate::peer::Peer;

impl Node {
    pub(super) fn expire_pending(&mut self, now: Instant) {
        let timed_out: Vec<u32> = self
            .pending
            .init
            .iter()
            .filter(|(_, p)| now.duration_since(p.started) >= self.handshake_timeout(p.target))
            .map(|(i, _)| *i)
            .collect();
        for i in timed_out {
            if let Some(p) = self.pending.init.remove(&i) {
                // A member drops handshakes whose MAC is not keyed by its PSK without
                // a word, so silence is also what a wrong network secret looks like.
                let hint = " (unreachable, not running, or its network name or secret differs: members drop \
                            handshakes they cannot authenticate without answering)";
                let how = if p.to.relay.is_some() { " via relay" } else { "" };
                self.handshake_failed(
                    now,
                    p.target,
                    format!("no handshake response from {}{how}{hint}", p.to.to),
                    FailureKind::NoResponse,
                );
            }
        }
        self.pending.resp.retain(|_, p| now.duration_since(p.started) < CONFIRM_TIMEOUT);
        let unconfirmed: Vec<u32> = self
            .pending
            .held
            .iter()
            .filter(|(_, h)| now.duration_since(h.entry.created) >= HELD_TIMEOUT)
            .map(|(i, _)| *i)
            .collect();
        for i in unconfirmed {
            let Some(h) = self.pending.held.remove(&i) else { continue };
            self.published.held_dirty = true;
            let msg = match h.problem {
                Some((problem, _)) => format!("{problem} (the peer never proved the network secret)"),
                None => format!("peer {} never confirmed the session (network secret differs?)", h.from),
            };
            match h.target {
                Some(t) => self.handshake_failed(now, t, msg, FailureKind::NotConfirmed),
                None => self.record_inbound_failure(now, h.from, msg, FailureKind::NotConfirmed),
            }
        }
        let next = self
            .pending
            .init
            .values()
            .map(|p| p.started + self.handshake_timeout(p.target))
            .chain(self.pending.resp.values().map(|p| p.started + CONFIRM_TIMEOUT))
            .chain(self.pending.held.values().map(|h| h.entry.created + HELD_TIMEOUT))
            .min();
        self.deadlines.set(Wake::Handshakes, next);
    }

    /// Fails every handshake we sent straight to `endpoint` (its connection is gone).
    pub(crate) fn fail_handshakes_to(&mut self, now: Instant, endpoint: Endpoint, error: &str) {
        let gone: Vec<u32> = self
            .pending
            .init
            .iter()
            .filter(|(_, p)| p.to.relay.is_none() && p.to.to == endpoint)
            .map(|(i, _)| *i)
            .collect();
        for i in gone {
            if let Some(p) = self.pending.init.remove(&i) {
                self.handshake_failed(
                    now,
                    p.target,
                    format!("cannot reach {endpoint}: {error}"),
                    FailureKind::Unreachable,
                );
            }
        }
    }

    pub(super) fn handshake_timeout(&self, target: Target) -> Duration {
        let d = match target {
            Target::Dial(i) => match self.dials.slots.get(&i) {
                Some(d) => &d.backoff,
                None => return self.cfg.timers.initial_backoff,
            },
            Target::Peer(k) => match self.peers.get(&k) {
                Some(p) => &p.backoff,
                None => return self.cfg.timers.initial_backoff,
            },
        };
        d.backoff.max(self.cfg.timers.initial_backoff)
    }

    /// Data authenticated by the session we declared dead with a peer
    /// ([`Peer::dropped`]): the peer never noticed, and would send into nothing until
    /// its own timer gives up. A new handshake moves it to a new session at once. Only
    /// while we hold no other session with it, none is in flight, the backoff allows
    /// and it is not revoked; only the peer itself holds the keys that make the
    /// pipelines report this, at most once a second.
    pub(super) fn handle_stale_session(&mut self, now: Instant, local_index: u32) {
        let dropped = |p: &Peer| p.dropped.as_ref().is_some_and(|s| s.session.local_index == local_index);
        let Some((&key, p)) = self.peers.iter().find(|(_, p)| dropped(p)) else { return };
        if !p.sessions.is_empty()
            || p.backoff.in_flight.is_some()
            || p.backoff.next_attempt.is_some_and(|t| now < t)
            || self.trust.revocations.contains(&key.0)
        {
            return;
        }
        info!(peer = %p.id, "data on a session we declared dead: starting a new one");
        self.report.stale_renewed += 1;
        self.handshake_with(now, key);
        self.touch(key);
    }

    /// Starts a handshake with a known peer along its best destination: IK, or XX
    /// after two failures (the peer may have a new key).
    pub(super) fn handshake_with(&mut self, now: Instant, key: PeerKey) {
        let Some(p) = self.peers.get(&key) else { return };
        let use_ik = p.backoff.failures < 2;
        match self.handshake_dest(&key) {
            Some(to) => self.start_handshake(now, Target::Peer(key), to, use_ik.then_some(key)),
            // Nowhere to send it (no path right now): try again after the backoff.
            None => self.handshake_failed(now, Target::Peer(key), "no path to the peer".into(), FailureKind::NoPath),
        }
    }

    /// Starts a fresh IK handshake with a known peer (to announce a new hello).
    pub(crate) fn rehandshake(&mut self, now: Instant, key: PeerKey) {
        if let Some(to) = self.dest_for(&key) {
            self.start_handshake(now, Target::Peer(key), to, Some(key));
        }
    }

    pub(super) fn start_handshake(&mut self, now: Instant, target: Target, to: Dest, remote: Option<PeerKey>) {
        let stamp = self.gate.next_stamp(self.cfg.wall + now.saturating_duration_since(self.cfg.epoch));
        let which = self.secret_for(target);
        let started = match (which, &self.trust.secret_next) {
            (Which::Next, Some(next)) => Initiator::start(
                &Params { psk: next.clone(), ..self.cfg.handshake.clone() },
                remote.as_ref().map(PeerKey::as_bytes),
                stamp,
            ),
            _ => Initiator::start(&self.cfg.handshake, remote.as_ref().map(PeerKey::as_bytes), stamp),
        };
        let (initiator, msg) = match started {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "cannot start handshake");
                return;
            }
        };
        let local = self.new_index();
        let pattern = initiator.pattern();
        let mut bytes = Vec::with_capacity(12 + msg.len() + 32);
        HandshakeHeader { kind: MessageType::HandshakeInit, pattern, sender_index: local, receiver_index: 0 }
            .emit(&mut bytes);
        bytes.extend_from_slice(&msg);
        let key = (to.to, to.relay.map(|r| r.dst));
        let cookie = self.gate.cookie(&key, now);
        let mut sealed = bytes.clone();
        let mac1 = self.gate.macs.seal_as(&mut sealed, cookie.as_ref(), which);
        self.actions.push_back(to.send(sealed));
        self.pending
            .init
            .insert(local, PendingInit { initiator, target, to, started: now, msg: bytes, mac1, resent: false, which });
        self.deadlines.at_most(Wake::Handshakes, now + self.handshake_timeout(target));
        if let Target::Peer(k) = target {
            self.touch(k);
        }
        let backoff = match target {
            Target::Dial(i) => match self.dials.slots.get_mut(&i) {
                Some(d) => &mut d.backoff,
                None => return,
            },
            Target::Peer(k) => match self.peers.get_mut(&k) {
                Some(p) => &mut p.backoff,
                None => return,
            },
        };
        if let Some(old) = backoff.in_flight.replace(local) {
            self.pending.init.remove(&old);
        }
        debug!(to = %to.to, relayed = to.relay.is_some(), ?pattern, local, "handshake started");
    }

    /// Sends `msg`, the response to init `init`, MACed with secret `which`; returns
    /// the response's (new) local index.
    pub(crate) fn answer_init(&mut self, to: &Dest, init: HandshakeHeader, msg: &[u8], which: Which) -> u32 {
        let local = self.new_index();
        let hdr = HandshakeHeader {
            kind: MessageType::HandshakeResponse,
            pattern: init.pattern,
            sender_index: local,
            receiver_index: init.sender_index,
        };
        self.send_handshake(to, hdr, msg, which);
        local
    }

    /// Sends handshake message `msg` with header `hdr`, MACed with secret `which`.
    pub(super) fn send_handshake(&mut self, to: &Dest, hdr: HandshakeHeader, msg: &[u8], which: Which) {
        let mut bytes = Vec::with_capacity(12 + msg.len() + 32);
        hdr.emit(&mut bytes);
        bytes.extend_from_slice(msg);
        self.gate.macs.seal_as(&mut bytes, None, which);
        self.actions.push_back(to.send(bytes));
    }

    pub(super) fn send_reject(&mut self, to: &Dest, reject: RejectRepr) {
        let mut bytes = reject.emit().to_vec();
        self.gate.macs.seal(&mut bytes, None);
        self.actions.push_back(to.send(bytes));
    }

    /// Sessions waiting for their peer's proof of the PSK (receive only).
    pub(crate) fn held_sessions(&self) -> Vec<Arc<Session>> {
        self.pending.held.values().map(|h| h.entry.session.clone()).collect()
    }

    pub(super) fn new_index(&mut self) -> u32 {
        loop {
            let i = self.rng.next_u32();
            let used = i == 0
                || self.pending.init.contains_key(&i)
                || self.pending.resp.contains_key(&i)
                || self.pending.held.contains_key(&i)
                || self.key_of_session(i).is_some();
            if !used {
                return i;
            }
        }
    }
}
