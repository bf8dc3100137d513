//! Refusals: handshakes refused, claims beyond what a member may take, and how each is counted and told.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use rand::RngCore;
use tracing::{debug, warn};
use weft_control::FailureKind;
use weft_core::endpoint::Endpoint;
use weft_core::handshake::{HandshakeError, Hello};
use weft_core::wire::{RejectReason, RejectRepr};

use super::api::Dest;
use super::{MAX_INBOUND_FAILURES, Node, Refusal, Target};
use crate::identity::{NodeId, PeerKey};
use crate::peer::Peer;
use crate::status::InboundFailure;
use crate::topology::Record;

impl Node {
    pub(super) fn refuse_inbound(&mut self, now: Instant, back: Dest, sender_index: u32, e: &HandshakeError) {
        let reject = RejectRepr { reason: reason_of(e), receiver_index: sender_index };
        self.send_reject(&back, reject);
        debug!(peer = %back.to, error = %e, "inbound handshake refused");
        self.record_inbound_failure(now, back.to, e.to_string(), FailureKind::Refused);
    }

    /// Why node `key`'s claim of overlay address `addr` (in a hello from `from`) is
    /// refused, with the failure kind: it lies outside our overlay network, or another
    /// live member holds it. The first holder keeps it, whatever the
    /// keys; only a node back with a new key at its old entry's endpoint and address
    /// (a restart) replaces that entry.
    pub(crate) fn claim_refused(
        &self,
        now: Instant,
        key: &PeerKey,
        hello: &Hello,
        from: Endpoint,
        via: Option<NodeId>,
    ) -> Option<Refusal> {
        let (why, kind) = self.claim_refusal(now, key, hello, from, via)?;
        let reason = match kind {
            // "The payload could not be parsed (version skew)": what every release says.
            FailureKind::IncompatibleVersion => RejectReason::BadPayload,
            FailureKind::NoCertificate
            | FailureKind::CertificateRefused
            | FailureKind::BeyondCertificate
            | FailureKind::AuthorityRequired => {
                // A release before protocol 3 cannot read the Membership reason (it
                // would drop the reject and wait for a timeout).
                if hello.protocol().version >= 3 { RejectReason::Membership } else { RejectReason::BadPayload }
            }
            _ => RejectReason::AddressTaken,
        };
        Some(Refusal { why, kind, reason })
    }

    /// [`Node::claim_refused`]'s reason and kind.
    pub(super) fn claim_refusal(
        &self,
        now: Instant,
        key: &PeerKey,
        hello: &Hello,
        from: Endpoint,
        via: Option<NodeId>,
    ) -> Option<(String, FailureKind)> {
        let id = key.id();
        let addr = hello.ipv4;
        let (ours, theirs) = (self.cfg.handshake.hello.protocol(), hello.protocol());
        if !ours.compatible(&theirs) {
            let who = if theirs.version < ours.min { "too old" } else { "too new" };
            return Some((
                format!(
                    "peer {id} ({}) at {from} is {who} for this node: it speaks {theirs}, this node {ours}",
                    hello.hostname
                ),
                FailureKind::IncompatibleVersion,
            ));
        }
        let unix = (self.cfg.wall + now.saturating_duration_since(self.cfg.epoch)).as_secs();
        if let Some((why, kind)) = crate::authority::refusal(
            &self.cfg.authorities,
            &self.trust.revocations,
            &self.trust.newest,
            &self.cfg.handshake.network_name,
            key,
            hello,
            unix,
        ) {
            return Some((format!("peer {id} ({}) at {from}: {why}", hello.hostname), kind));
        }
        if let Some(why) = self.outside_overlay(IpAddr::V4(addr)) {
            return Some((
                format!("peer {id} at {from} claims overlay address {addr}: refused, {why}"),
                FailureKind::AddressOutsideOverlay,
            ));
        }
        let owner = self.address_owner(addr, id, |p| via.is_none() && p.path.endpoint() == Some(from))?;
        let host = self
            .mesh
            .topology
            .get(&owner)
            .map(|r| r.hostname.as_str())
            .or_else(|| self.peers.by_id(&owner).map(|p| p.hello.hostname.as_str()));
        Some((
            format!(
                "address conflict: peer {id} at {from} claims {addr}, which belongs to member {owner} ({:?})",
                host.unwrap_or("?")
            ),
            FailureKind::AddressTaken,
        ))
    }

    /// The live member other than `claimant` that holds `addr`: a peer with a confirmed
    /// session, else a member reachable in the topology whose record claims it. A peer
    /// for which `restart` holds does not count (its entry is about to be replaced).
    pub(crate) fn address_owner(
        &self,
        addr: Ipv4Addr,
        claimant: NodeId,
        restart: impl Fn(&Peer) -> bool,
    ) -> Option<NodeId> {
        let up = self.peers.values().find(|p| p.id != claimant && p.hello.ipv4 == addr && p.is_up());
        if let Some(p) = up {
            return (!restart(p)).then_some(p.id);
        }
        self.mesh
            .topology
            .records()
            .filter(|r| r.overlay == addr && r.node() != claimant && r.node() != self.id)
            .filter(|r| self.mesh.paths.contains_key(&r.node()))
            // A member whose session with us died is not holding anything, whatever
            // its last record says.
            .find(|r| {
                self.peers
                    .get(&PeerKey(r.key))
                    .is_none_or(|p| p.hello.ipv4 == addr && p.down_since.is_none() && !restart(p))
            })
            .map(Record::node)
    }

    /// Refuses a handshake whose hello claims a taken address: the other end gets a
    /// reject saying so, our status the reason.
    pub(super) fn refuse_claim(
        &mut self,
        now: Instant,
        back: Dest,
        remote_index: u32,
        target: Option<Target>,
        Refusal { why, kind, reason }: Refusal,
    ) {
        warn!("{why}");
        let reject = RejectRepr { reason, receiver_index: remote_index };
        self.send_reject(&back, reject);
        match target {
            Some(t) => self.handshake_failed(now, t, why, kind),
            None => self.record_inbound_failure(now, back.to, why, kind),
        }
    }

    /// Counts a failed handshake by kind (monotonic, for metrics).
    pub(super) fn count_failure(&mut self, kind: FailureKind) {
        *self.report.handshake_failures.entry(kind).or_default() += 1;
    }

    pub(super) fn record_inbound_failure(&mut self, now: Instant, from: Endpoint, reason: String, kind: FailureKind) {
        self.count_failure(kind);
        if let Some(f) = self.report.inbound_failures.iter_mut().find(|f| f.from == from) {
            f.count += 1;
            f.last = now;
            f.reason = reason;
            f.kind = kind;
        } else {
            if self.report.inbound_failures.len() == MAX_INBOUND_FAILURES {
                self.report.inbound_failures.pop_front();
            }
            self.report.inbound_failures.push_back(InboundFailure { from, reason, kind, count: 1, last: now });
        }
    }

    pub(super) fn handshake_failed(&mut self, now: Instant, target: Target, msg: String, kind: FailureKind) {
        self.count_failure(kind);
        let t = self.cfg.timers;
        let jitter = self.rng.next_u32();
        match target {
            Target::Dial(i) => {
                let Some(d) = self.dials.slots.get_mut(&i).map(|d| &mut d.backoff) else { return };
                d.in_flight = None;
                d.error = Some(msg);
                d.failed(now, &t, jitter);
            }
            Target::Peer(k) => {
                if let Some(p) = self.peers.get_mut(&k) {
                    p.backoff.in_flight = None;
                    p.error = Some(msg);
                    p.backoff.failed(now, &t, jitter);
                    if p.wanted_until.is_none_or(|w| now >= w) {
                        self.drop_queued(k);
                    }
                }
                self.touch(k);
            }
        }
    }

    // ----- timers -----
}

pub(super) fn reason_of(e: &HandshakeError) -> RejectReason {
    match e {
        HandshakeError::BadPayload => RejectReason::BadPayload,
        _ => RejectReason::AuthFailed,
    }
}

/// What a handshake refused for `r` tells the user, on whichever side saw it.
pub(super) fn reject_why(r: RejectReason) -> &'static str {
    match r {
        RejectReason::AuthFailed => "authentication failed: network secret or name differs",
        RejectReason::BadPayload => "malformed hello (version mismatch?)",
        RejectReason::AddressTaken => {
            "our overlay address already belongs to another member of the mesh (choose another --ipv4)"
        }
        RejectReason::Membership => {
            "membership by certificate: one end has an authority and the other's certificate is missing, refused or claims more than it grants (its status says which)"
        }
    }
}
