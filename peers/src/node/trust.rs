//! The network secret (and the next one while it rotates), the authority's
//! revocations and the newest certificate seen per member.

use std::time::{Duration, Instant};

use tracing::{debug, warn};
use weft_core::admission::Which;
use weft_core::cert::Certificate;
use weft_core::handshake::{Params, caps};

use super::api::Action;
use super::{Node, Target};
use crate::identity::PeerKey;

/// What the network's authority and secrets have handed this node.
#[derive(Default)]
pub(crate) struct Trust {
    /// Members the network's authority revoked.
    pub(crate) revocations: crate::authority::Revocations,
    /// The newest certificate seen for each member key: older ones are refused.
    pub(crate) newest: crate::authority::Newest,
    /// `newest` changed this step: saved once at its end, however many changed.
    pub(crate) newest_dirty: bool,
    /// `--authority-key`: this member issues certificates to machines with an invite.
    pub(crate) issuer: Option<crate::issuer::Issuer>,
    /// `network-secret-next`: the PSK of the secret accepted beside the current one
    /// (`cfg.handshake.psk`) while the network secret rotates.
    pub(crate) secret_next: Option<weft_core::handshake::Psk>,
    /// The newest signed access policy this node holds: applied here.
    pub(crate) policy: Option<HeldPolicy>,
    /// The newest signed policy that could not be applied here (version, why): the
    /// node fails closed, and takes no version up to it again.
    pub(crate) policy_refused: Option<(u64, String)>,
}

/// A signed access policy this node applied.
pub(crate) struct HeldPolicy {
    /// Its version.
    pub(crate) version: u64,
    /// Encoded.
    pub(crate) bytes: Vec<u8>,
    /// Kept from the state directory though no trusted authority signed it (an
    /// authority rollover): in force until any trusted one arrives, never passed on.
    pub(crate) untrusted: bool,
}

impl Node {
    /// Takes a revocation signed by the network's authority (from `weft revoke add` or
    /// a member): a new one closes the revoked member's sessions, refuses it from now
    /// on, goes to every member we have a session with, and is kept in the state
    /// directory ([`Action::SaveRevocations`]). Returns whether it was new.
    pub fn revoke(&mut self, now: Instant, r: weft_core::cert::Revocation) -> Result<bool, String> {
        let new = self.take_revocation(now, r)?;
        // Published at once: the revoked member's sessions leave the data path now,
        // not at the next timer.
        self.finish_step(now);
        Ok(new)
    }

    /// The revocations kept in the state directory, at start: every one is kept,
    /// whatever authorities this node trusts now (an authority rollover must not
    /// readmit a revoked key), in one step, with nothing queued per revocation (the
    /// file holds them already). Returns how many were taken.
    pub fn keep_revocations(&mut self, now: Instant, kept: Vec<weft_core::cert::Revocation>) -> usize {
        let mut taken = 0;
        for r in kept {
            match self.trust.revocations.add_kept(r) {
                Ok(new) => taken += usize::from(new),
                Err(e) => {
                    warn!("kept revocations beyond the first {taken}: {e}");
                    break;
                }
            }
        }
        self.published.routes_dirty = true;
        self.finish_step(now);
        taken
    }

    /// [`Node::revoke`] within a step (a revocation a member passed on).
    pub(crate) fn take_revocation(&mut self, now: Instant, r: weft_core::cert::Revocation) -> Result<bool, String> {
        let key = PeerKey(r.node);
        if !self.trust.revocations.add(r.clone(), &self.cfg.authorities)? {
            return Ok(false);
        }
        warn!(node = %key.id(), "member revoked by the network's authority: its sessions close, it is refused from now on");
        if self.peers.get(&key).is_some() {
            self.close_sessions(now, key, "revoked by the network's authority");
        }
        // Its record goes too: no route leads to it or its subnets any more.
        if self.mesh.topology.get(&key.id()).is_some() {
            self.mesh.topology.remove(&key.id());
            self.mesh.paths_changed(now);
        }
        self.pending.init.retain(|_, p| p.target != Target::Peer(key));
        self.pending.held.retain(|_, h| h.key != key);
        let up: Vec<PeerKey> = self.peers.values().filter(|p| p.is_up()).map(|p| p.key).collect();
        for k in up {
            self.send_revocations(now, k);
        }
        self.actions.push_back(Action::SaveRevocations(vec![r]));
        self.published.routes_dirty = true;
        Ok(true)
    }

    /// The network secrets: `current` (what this node uses with peers that do not
    /// accept `next`) and `next`, accepted beside it and used with every peer that
    /// accepts it too, while the secret rotates. Applies to handshakes from now on;
    /// sessions up keep their keys until their next rekey.
    pub fn set_secrets(&mut self, current: weft_core::handshake::Psk, next: Option<weft_core::handshake::Psk>) {
        self.gate.macs.set(&current, next.as_ref());
        let hello = &mut self.cfg.handshake.hello;
        hello.secrets = std::iter::once(current.fingerprint()).chain(next.as_ref().map(|n| n.fingerprint())).collect();
        self.cfg.handshake.psk = current;
        self.trust.secret_next = next;
    }

    /// The handshake parameters of secret `which` (the next secret's are a copy with
    /// its PSK, made only while the secret rotates).
    pub(super) fn params(&self, which: Which) -> std::borrow::Cow<'_, Params> {
        match (which, &self.trust.secret_next) {
            (Which::Next, Some(next)) => {
                std::borrow::Cow::Owned(Params { psk: next.clone(), ..self.cfg.handshake.clone() })
            }
            _ => std::borrow::Cow::Borrowed(&self.cfg.handshake),
        }
    }

    /// Whether this node has a next secret (`network-secret-next`).
    pub fn has_next_secret(&self) -> bool {
        self.trust.secret_next.is_some()
    }

    /// Which secret a handshake to `target` uses: the next one when the peer's hello
    /// says it accepts it; the current one when it says it accepts that; else (a
    /// first contact, or a peer of a release that does not say) the current one
    /// first and each other attempt the next one.
    pub(super) fn secret_for(&self, target: Target) -> Which {
        let Some(next) = &self.trust.secret_next else { return Which::Current };
        let (hello, failures) = match target {
            Target::Peer(k) => match self.peers.get(&k) {
                Some(p) => (Some(&p.hello), p.backoff.failures),
                None => (None, 0),
            },
            Target::Dial(i) => {
                let d = self.dials.slots.get(&i);
                let known = d.and_then(|d| d.key).and_then(|k| self.peers.get(&k));
                (known.map(|p| &p.hello), d.map_or(0, |d| d.backoff.failures))
            }
        };
        let says = hello.map(|h| h.secrets.as_slice()).unwrap_or_default();
        if says.contains(&next.fingerprint()) {
            Which::Next
        } else if says.contains(&self.cfg.handshake.psk.fingerprint()) || failures % 2 == 0 {
            Which::Current
        } else {
            Which::Next
        }
    }

    /// Takes certificates kept from before (the state directory): each signed by a
    /// trusted authority becomes the newest known for its key unless a later one is
    /// known. Returns how many were taken.
    pub fn remember_certificates(&mut self, list: Vec<Vec<u8>>) -> usize {
        let mut taken = 0;
        for bytes in list {
            let Ok(cert) = Certificate::from_bytes(&bytes) else { continue };
            if self.cfg.authorities.contains(&cert.body().authority)
                && cert.signed_by_its_authority()
                && self.trust.newest.note(&cert)
            {
                taken += 1;
            }
        }
        taken
    }

    /// Member certificate `bytes` (from a hello or a record that passed
    /// [`crate::authority::refusal`] or [`crate::authority::record_refusal`]): when it
    /// is the newest seen for its key, it is kept ([`Action::SaveCertificates`],
    /// at the end of the step) and the sessions made with an older certificate of
    /// that key close (the member
    /// handshakes again with its newest, or is refused).
    pub(crate) fn note_certificate(&mut self, now: Instant, bytes: Option<&[u8]>) {
        if self.cfg.authorities.is_empty() {
            return;
        }
        let Some(cert) = bytes.and_then(|b| Certificate::from_bytes(b).ok()) else { return };
        if !self.trust.newest.note(&cert) {
            return;
        }
        let key = PeerKey(cert.body().node);
        debug!(node = %key.id(), issued = cert.issued(), "the newest certificate of a member: kept");
        self.trust.newest_dirty = true;
        let stale = self.peers.get(&key).is_some_and(|p| {
            !p.sessions.is_empty()
                && p.hello
                    .cert
                    .as_deref()
                    .and_then(|c| Certificate::from_bytes(c).ok())
                    .is_some_and(|c| self.trust.newest.older(&c).is_some())
        });
        if stale {
            warn!(node = %key.id(), "a member's certificate was replaced by a newer one its authority issued: its sessions close");
            self.close_sessions(
                now,
                key,
                "its authority issued it a newer certificate than the one its session was made with",
            );
        }
    }

    /// The revocations this node keeps, oldest first.
    pub fn revocations(&self) -> &[weft_core::cert::Revocation] {
        self.trust.revocations.list()
    }

    /// Sends member `key` the revocations it was not sent on its current session (if
    /// its hello says it takes them).
    pub(crate) fn send_revocations(&mut self, now: Instant, key: PeerKey) {
        let total = self.trust.revocations.list().len();
        let Some(p) = self.peers.get(&key) else { return };
        if p.revocations_sent >= total || !p.is_up() || p.hello.protocol().caps & caps::REVOCATIONS == 0 {
            return;
        }
        // Paced below the member's control budget: a long list goes a batch a second
        // (its timer, `peer_deadline`, and each message it sends us bring the next).
        if p.revocations_at.is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        let from = p.revocations_sent;
        let total = total.min(from + crate::mesh::REVOCATIONS_PER_SECOND);
        if let Some(p) = self.peers.get_mut(&key) {
            p.revocations_at = Some(now);
        }
        for i in from..total {
            let msg = crate::mesh::Msg::Revocation(Box::new(self.trust.revocations.list()[i].clone()));
            self.send_msg(&key, &msg, now);
        }
        if let Some(p) = self.peers.get_mut(&key) {
            p.revocations_sent = total;
        }
    }
}

impl Node {
    /// Closes the sessions of every member whose certificate has expired by `now`, and
    /// forgets the records of those (a certificate is checked at each handshake and
    /// record; this ends what is already up). Returns how many members it cut off.
    pub fn expire_members(&mut self, now: Instant) -> usize {
        if self.cfg.authorities.is_empty() {
            return 0;
        }
        let unix = (self.cfg.wall + now.saturating_duration_since(self.cfg.epoch)).as_secs();
        let expired = |cert: Option<&[u8]>| {
            cert.and_then(|c| Certificate::from_bytes(c).ok()).is_some_and(|c| c.body().not_after <= unix)
        };
        let peers: Vec<PeerKey> = self
            .peers
            .values()
            .filter(|p| !p.sessions.is_empty() && expired(p.hello.cert.as_deref()))
            .map(|p| p.key)
            .collect();
        let records: Vec<crate::NodeId> =
            self.mesh.topology.records().filter(|r| expired(r.cert.as_deref())).map(|r| r.node()).collect();
        for &k in &peers {
            tracing::warn!(node = %k.id(), "a member's certificate expired: its sessions close");
            self.close_sessions(now, k, "its member certificate expired");
        }
        for id in &records {
            self.mesh.topology.remove(id);
        }
        if !records.is_empty() {
            self.mesh.paths_changed(now);
        }
        if !peers.is_empty() || !records.is_empty() {
            self.published.routes_dirty = true;
            self.finish_step(now);
        }
        peers.len().max(records.len())
    }
}
