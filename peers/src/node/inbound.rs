//! Handshake messages that arrive: admission, the responder's side of IK and XX, rejects, cookie replies and confirmations.

use std::time::Instant;

use tracing::{debug, warn};
use weft_control::FailureKind;
use weft_core::admission::{HANDSHAKE_MACS_LEN, MacKeys, Which};
use weft_core::endpoint::Endpoint;
use weft_core::handshake::{Read, Responder};
use weft_core::wire::{HANDSHAKE_HEADER_LEN, HandshakeHeader, MessageType, Pattern, RejectReason, RejectRepr};

use super::api::Dest;
use super::refusal::{reason_of, reject_why};
use super::{CONFIRM_TIMEOUT, Finished, MAX_PENDING_RESP, Node, PendingResp, Wake};
use crate::gate::{Tables, Verdict};
use crate::identity::{NodeId, PeerKey};
use crate::timing::ms_since;

impl Node {
    pub(super) fn handle_datagram(&mut self, now: Instant, from: Endpoint, via: Option<NodeId>, bytes: &[u8]) {
        // mac1 first: nothing from outside the network reaches snow or any table.
        let counted = matches!(MessageType::of(bytes), Some(t) if t != MessageType::Data && t != MessageType::Relay);
        let Some((body, which)) = self.gate.check_mac1(bytes, counted) else { return };
        if via.is_none() {
            self.note_arrival(now, from);
        }
        match MessageType::of(body) {
            Some(MessageType::Reject) => {
                if let Ok(r) = RejectRepr::parse(body) {
                    self.handle_reject(now, from, r);
                }
            }
            Some(MessageType::CookieReply) => self.handle_cookie_reply(now, bytes),
            Some(MessageType::Data | MessageType::Relay) | None => {}
            Some(_) => {
                let Ok((hdr, noise)) = HandshakeHeader::parse(body) else { return };
                match hdr.kind {
                    MessageType::HandshakeInit if self.admit_init(now, from, via, hdr, bytes) => {
                        self.handle_init(now, from, via, hdr, noise, which);
                    }
                    MessageType::HandshakeResponse => self.handle_response(now, from, via, hdr, noise),
                    MessageType::HandshakeFinish => self.handle_finish(now, from, hdr, noise),
                    _ => {}
                }
            }
        }
    }

    /// Whether an init (mac1 already verified) may cost us a Diffie-Hellman; a source
    /// that must prove its address first gets a cookie.
    pub(super) fn admit_init(
        &mut self,
        now: Instant,
        from: Endpoint,
        via: Option<NodeId>,
        hdr: HandshakeHeader,
        bytes: &[u8],
    ) -> bool {
        let tables = self.tables();
        let now_ms = ms_since(self.cfg.epoch, now);
        let answer = HANDSHAKE_HEADER_LEN + self.cfg.handshake.response_len(hdr.pattern) + HANDSHAKE_MACS_LEN;
        match self.gate.admit(now, now_ms, from, via, hdr, bytes, answer, tables, self.rng.as_mut()) {
            Verdict::Admit => true,
            Verdict::Cookie(reply) => {
                self.actions.push_back(Dest::reply(from, via, self.id).send(reply));
                false
            }
            Verdict::RateLimited => false,
        }
    }

    /// The tables an admitted handshake would grow.
    pub(super) fn tables(&self) -> Tables {
        Tables { pending: self.pending.resp.len(), held: self.pending.held.len() }
    }

    /// A responder under load sent us a cookie for one of our inits: keep it for that
    /// destination and resend the init once with mac2.
    pub(super) fn handle_cookie_reply(&mut self, now: Instant, bytes: &[u8]) {
        let Some(index) = MacKeys::cookie_reply_index(bytes) else { return };
        let Some(p) = self.pending.init.get_mut(&index) else { return };
        let Some(cookie) = self.gate.macs.open_cookie_reply(bytes, &p.mac1) else { return };
        let to = p.to;
        let resend = (!p.resent).then(|| {
            p.resent = true;
            let mut msg = p.msg.clone();
            p.mac1 = self.gate.macs.seal_as(&mut msg, Some(&cookie), p.which);
            msg
        });
        self.gate.keep_cookie((to.to, to.relay.map(|r| r.dst)), cookie, now);
        if let Some(msg) = resend {
            debug!(to = %to.to, "resending handshake with a cookie");
            self.actions.push_back(to.send(msg));
        }
    }

    pub(super) fn handle_init(
        &mut self,
        now: Instant,
        from: Endpoint,
        via: Option<NodeId>,
        hdr: HandshakeHeader,
        noise: &[u8],
        which: Which,
    ) {
        let back = Dest::reply(from, via, self.id);
        // The init was MACed with our next secret: its Noise PSK is the next one too.
        match Responder::read(&self.params(which), hdr.pattern, noise) {
            Err(e) => self.refuse_inbound(now, back, hdr.sender_index, &e),
            Ok(Read::Xx(responder, msg)) => {
                let local = self.answer_init(&back, hdr, &msg, which);
                if self.pending.resp.len() >= MAX_PENDING_RESP
                    && let Some((&oldest, _)) = self.pending.resp.iter().min_by_key(|(_, p)| p.started)
                {
                    self.pending.resp.remove(&oldest);
                    self.gate.count_evicted();
                }
                self.pending.resp.insert(
                    local,
                    PendingResp { responder, from, via, remote_index: hdr.sender_index, started: now, which },
                );
                self.deadlines.at_most(Wake::Handshakes, now + CONFIRM_TIMEOUT);
            }
            Ok(Read::Ik(mut read)) => {
                // A replayed init (its stamp is not later than the last one this key
                // sent) costs this Diffie-Hellman and nothing more: no answer, no state.
                // The stamp is of this init only: it is not part of the peer's hello.
                if !self.gate.accept_stamp(PeerKey(read.remote_static), read.hello.stamp.take()) {
                    debug!(peer = %from, "dropped a replayed IK init");
                    return;
                }
                // A new machine with an invite: answered with a certificate (or why
                // not), never a session.
                if read.hello.join.is_some() {
                    self.answer_join(now, &back, hdr, *read, which);
                    return;
                }
                // IK: the hello is known now; a taken address is refused before we
                // answer (only members reach this far once handshakes carry a MAC).
                if let Some(why) = self.claim_refused(now, &PeerKey(read.remote_static), &read.hello, from, via) {
                    self.refuse_claim(now, back, hdr.sender_index, None, why);
                    return;
                }
                let (done, msg) = match read.answer(&self.cfg.handshake.hello) {
                    Ok(x) => x,
                    Err(e) => return self.refuse_inbound(now, back, hdr.sender_index, &e),
                };
                let local = self.answer_init(&back, hdr, &msg, which);
                // IK responder: the PSK is only proven by the initiator's first data packet.
                self.complete(
                    now,
                    Finished {
                        done,
                        from,
                        via,
                        local,
                        remote: hdr.sender_index,
                        target: None,
                        confirmed: false,
                        secret: which,
                    },
                );
            }
        }
    }

    pub(super) fn handle_response(
        &mut self,
        now: Instant,
        from: Endpoint,
        via: Option<NodeId>,
        hdr: HandshakeHeader,
        noise: &[u8],
    ) {
        let Some(p) = self.pending.init.remove(&hdr.receiver_index) else { return };
        let back = Dest::reply(from, via, self.id);
        let pattern = p.initiator.pattern();
        match p.initiator.read_response(&self.cfg.handshake, noise) {
            Err(e) => {
                // Only IK can fail here for a secret mismatch (psk2 is mixed into the
                // response); tell the responder so its status says why too.
                let reject = RejectRepr { reason: reason_of(&e), receiver_index: hdr.sender_index };
                self.send_reject(&back, reject);
                let msg = format!("handshake response from {from}: {}", reject_why(reject.reason));
                warn!(peer = %from, "{msg}");
                self.handshake_failed(now, p.target, msg, FailureKind::BadResponse);
            }
            Ok((done, finish)) => {
                if let Some(why) = self.claim_refused(now, &PeerKey(done.remote_static), &done.hello, from, via) {
                    self.refuse_claim(now, back, hdr.sender_index, Some(p.target), why);
                    return;
                }
                // XX: send the finish message even on a cipher mismatch, so that the
                // responder learns of it through an authenticated handshake too.
                if let Some(fin) = finish {
                    self.send_handshake(
                        &back,
                        HandshakeHeader {
                            kind: MessageType::HandshakeFinish,
                            pattern,
                            sender_index: hdr.receiver_index,
                            receiver_index: hdr.sender_index,
                        },
                        &fin,
                        p.which,
                    );
                }
                // IK: the response proves the responder holds the PSK. XX: the
                // responder proves it with its first data packet.
                let confirmed = pattern == Pattern::Ik;
                let target = Some(p.target);
                let (local, remote) = (hdr.receiver_index, hdr.sender_index);
                self.complete(now, Finished { done, from, via, local, remote, target, confirmed, secret: p.which });
            }
        }
    }

    pub(super) fn handle_finish(&mut self, now: Instant, from: Endpoint, hdr: HandshakeHeader, noise: &[u8]) {
        let Some(p) = self.pending.resp.remove(&hdr.receiver_index) else { return };
        match p.responder.finish(noise) {
            Err(e) => self.refuse_inbound(now, Dest::reply(from, p.via, self.id), p.remote_index, &e),
            Ok(done) => {
                // XXpsk3: reading the finish message proves the initiator holds the PSK.
                let (from, via, local, remote) = (p.from, p.via, hdr.receiver_index, p.remote_index);
                let secret = p.which;
                self.complete(now, Finished { done, from, via, local, remote, target: None, confirmed: true, secret });
            }
        }
    }

    pub(super) fn handle_reject(&mut self, now: Instant, from: Endpoint, r: RejectRepr) {
        let why = reject_why(r.reason);
        let ours =
            self.pending.init.contains_key(&r.receiver_index) || self.pending.held.contains_key(&r.receiver_index);
        if ours && r.reason == RejectReason::AddressTaken && self.cfg.dynamic.is_some() {
            // Our --dhcp address is taken by another member: move, and let the retry
            // find us elsewhere.
            self.move_address(now, None);
        }
        if let Some(p) = self.pending.init.remove(&r.receiver_index) {
            let msg = format!("peer {from} rejected our handshake: {why}");
            warn!("{msg}");
            self.handshake_failed(now, p.target, msg, FailureKind::Rejected);
            return;
        }
        // A reject for a session still waiting for its confirmation.
        if let Some(h) = self.pending.held.remove(&r.receiver_index) {
            self.published.held_dirty = true;
            match h.target {
                Some(target) => {
                    let msg = format!("peer {from} rejected our handshake: {why}");
                    warn!("{msg}");
                    self.handshake_failed(now, target, msg, FailureKind::Rejected);
                }
                None => {
                    let reason = match r.reason {
                        RejectReason::AddressTaken | RejectReason::Membership => {
                            format!("peer {from} refused our handshake: {why}")
                        }
                        _ => format!("peer could not authenticate our handshake response: {why}"),
                    };
                    self.record_inbound_failure(now, from, reason, FailureKind::Rejected);
                }
            }
            return;
        }
        // An XX handshake we answered, refused by the initiator before its finish.
        if matches!(r.reason, RejectReason::AddressTaken | RejectReason::Membership)
            && self.pending.resp.remove(&r.receiver_index).is_some()
        {
            warn!(peer = %from, "handshake refused: {why}");
            self.record_inbound_failure(
                now,
                from,
                format!("peer {from} refused our handshake: {why}"),
                FailureKind::Rejected,
            );
        }
    }

    pub(super) fn handle_confirmed(&mut self, now: Instant, local_index: u32) {
        if let Some(h) = self.pending.held.remove(&local_index) {
            self.published.held_dirty = true;
            self.promote(now, h);
            return;
        }
        if let Some(key) = self.key_of_session(local_index)
            && let Some(peer) = self.peers.get_mut(&key)
        {
            debug!(peer = %peer.id, local_index, "session confirmed");
            peer.error = None;
            self.published.routes_dirty = true;
            self.flush_queued(now, key);
            self.touch(key);
        }
    }
}
