//! The messages members send each other inside their sessions: topology records
//! (flooded, admitted, learned from), summaries and digests, pings, punches,
//! revocations and policy pieces; the per-member control budget; publishing our own
//! record.

use std::time::Instant;

use tracing::{debug, warn};
use weft_core::admission::Bucket;

use crate::identity::PeerKey;
use crate::mesh::{
    CONTROL_BURST, CONTROL_RATE, DIGEST_GAP, LINK_HOLD, Msg, RECORD_BUDGET, Received, SIGNATURE_FAILURES,
    SIGNATURE_WINDOW, SUMMARY_EVERY,
};
use crate::node::Node;
use crate::peer::{Anchor, Peer};
use crate::topology::{Neighbour, Record};

impl Node {
    /// Counts a signature that failed in something member `key` sent; past
    /// [`SIGNATURE_FAILURES`] in [`SIGNATURE_WINDOW`] its sessions are closed.
    pub(crate) fn signature_failed(&mut self, now: Instant, key: PeerKey) {
        let Some(p) = self.peers.get_mut(&key) else { return };
        let (n, since) = &mut p.bad_signatures;
        if since.is_none_or(|t| now.saturating_duration_since(t) > SIGNATURE_WINDOW) {
            *n = 0;
            *since = Some(now);
        }
        *n += 1;
        if *n >= SIGNATURE_FAILURES {
            p.bad_signatures = (0, None);
            self.mesh.signature_cutoffs += 1;
            warn!(peer = %key.id(), "a member's signed messages keep failing their signature check: its sessions close");
            self.close_sessions(now, key, "its signed messages kept failing their signature check");
        }
    }

    pub(crate) fn handle_message(&mut self, now: Instant, local_index: u32, bytes: &[u8]) {
        let Some(key) = self.key_of_session(local_index) else { return };
        let now_ms = crate::node::ms_since(self.cfg.epoch, now);
        if let Some(p) = self.peers.get_mut(&key) {
            let bucket = p.control_budget.get_or_insert_with(|| Bucket::full(CONTROL_BURST, now_ms));
            if !bucket.take(CONTROL_RATE, CONTROL_BURST, now_ms) {
                self.mesh.control_limited += 1;
                return;
            }
        }
        let Some(msg) = Msg::parse(bytes) else {
            debug!(local_index, "malformed control message");
            return;
        };
        // The member's session works: it gets the revocations it lacks.
        self.send_revocations(now, key);
        match msg {
            // Records travel on links only (a member cannot fill our table from afar).
            Msg::Record(rec) if self.peers.get(&key).is_some_and(|p| p.is_link(now)) => {
                self.handle_record(now, key, *rec);
            }
            Msg::Record(_) => debug!(local_index, "topology record from a member that is not a link: ignored"),
            Msg::Ping(n) => self.send_msg(&key, &Msg::Pong(n), now),
            Msg::Pong(n) => {
                if let Some(p) = self.peers.get_mut(&key)
                    && p.probe.answered(n, now)
                    && p.is_link(now)
                {
                    // A link's latency is in our record (republished when it moved a lot).
                    self.mesh.record_changed(now);
                }
            }
            Msg::Punch(eps) => self.handle_punch(now, key, &eps),
            Msg::Leaving => self.peer_left(now, key),
            Msg::Revocation(r) => {
                let checked = !self.cfg.authorities.is_empty() && !self.trust.revocations.contains(&r.node);
                if let Err(e) = self.take_revocation(now, *r) {
                    debug!(peer = %key.id(), "revocation from a member refused: {e}");
                    if checked {
                        self.signature_failed(now, key);
                    }
                }
            }
            Msg::Probe { nonce, .. } => self.answer_probe(now, key, nonce),
            Msg::ProbeAck(nonce) => self.probe_acked(key, nonce),
            Msg::BadChecksums(count) => self.told_bad_checksums(key, count),
            Msg::PolicyPart { version, part, parts, bytes } => self.policy_part(now, key, version, part, parts, bytes),
            Msg::Summary { count, hash } => self.handle_summary(now, key, (count, hash)),
            Msg::Digest { lo, hi, entries } => {
                // Only a link's digest is answered (records travel on links).
                let Some(p) = self.peers.get_mut(&key).filter(|p| p.is_link(now)) else { return };
                // A digest walks the id space upwards in chunks; within DIGEST_GAP a
                // range already answered is not answered again (a member repeating a
                // 17-byte empty digest would otherwise pull our whole table each time).
                let fresh = match p.digest_answered {
                    Some((since, upto)) if now.saturating_duration_since(since) < DIGEST_GAP => lo > upto,
                    _ => true,
                };
                if !fresh {
                    return;
                }
                let since = match p.digest_answered {
                    Some((since, _)) if now.saturating_duration_since(since) < DIGEST_GAP => since,
                    _ => now,
                };
                p.digest_answered = Some((since, hi));
                let recs = self.mesh.missing_from(self.id, now, lo, hi, &entries);
                if !recs.is_empty() {
                    debug!(peer = %key.id(), count = recs.len(), "repairing a neighbour's topology");
                }
                for r in recs {
                    self.send_msg(&key, &Msg::Record(Box::new(r)), now);
                }
            }
        }
        self.touch(key);
    }

    /// A neighbour's summary: it keeps a link with us; when its table differs from
    /// ours, it gets our digest (and pushes what we lack once it has compared).
    pub(crate) fn handle_summary(&mut self, now: Instant, key: PeerKey, theirs: (u32, u64)) {
        let Some(p) = self.peers.get(&key) else { return };
        let was_link = p.is_link(now);
        // Only a member that reaches us directly can keep a link with us (as if it
        // had dialled us); a summary over a relayed session means nothing.
        if !(p.path.is_direct() && p.is_up()) {
            return;
        }
        if p.anchor() != Anchor::Dialled {
            self.peers.set_anchor(&key, Anchor::ByPeer(now + LINK_HOLD));
        }
        if !self.peers.get(&key).is_some_and(|p| p.is_link(now)) {
            return;
        }
        if !was_link {
            // A new link: it is in our record from now on, and gets our summary.
            self.mesh.record_changed(now);
            self.send_summary(now, key);
        }
        let ours = self.mesh.summary(self.id, now);
        let Some(p) = self.peers.get_mut(&key) else { return };
        if ours == theirs || p.digest_sent.is_some_and(|t| now.saturating_duration_since(t) < DIGEST_GAP) {
            return;
        }
        p.digest_sent = Some(now);
        for m in self.mesh.digest(self.id, now) {
            self.send_msg(&key, &m, now);
        }
    }

    /// Sends our summary on a link and schedules the next.
    pub(crate) fn send_summary(&mut self, now: Instant, key: PeerKey) {
        let (count, hash) = self.mesh.summary(self.id, now);
        if let Some(p) = self.peers.get_mut(&key) {
            p.summary_next = Some(now + SUMMARY_EVERY);
        }
        self.send_msg(&key, &Msg::Summary { count, hash }, now);
    }

    /// Each link brings so many new origins and so many updates a second: a member
    /// minting keys fills the table no faster than that, and the signature checks it
    /// can make us do are bounded too (records over budget come again with the next
    /// summary exchange). Records that would change nothing (ours, stale) cost none.
    pub(crate) fn within_record_budget(&mut self, now: Instant, from_key: PeerKey, rec: &Record) -> bool {
        let node = rec.node();
        if node == self.id || !self.mesh.topology.is_newer(rec) {
            return true;
        }
        let new_origin = self.mesh.topology.get(&node).is_none();
        let now_ms = crate::node::ms_since(self.cfg.epoch, now);
        let Some(p) = self.peers.get_mut(&from_key) else { return false };
        let b = RECORD_BUDGET;
        let (origins, updates) = p
            .record_budget
            .get_or_insert_with(|| (Bucket::full(b.new_burst, now_ms), Bucket::full(b.update_burst, now_ms)));
        if new_origin {
            origins.take(b.new_rate, b.new_burst, now_ms)
        } else {
            updates.take(b.update_rate, b.update_burst, now_ms)
        }
    }

    pub(crate) fn handle_record(&mut self, now: Instant, from_key: PeerKey, rec: Record) {
        if !self.admit_record(now, from_key, &rec) {
            return;
        }
        let node = rec.node();
        let network = self.cfg.handshake.network_name.clone();
        let before = match self.mesh.receive(&rec, self.id, &network, now) {
            Received::Stale => return,
            Received::Forged => {
                // A member altered or forged someone's record: dropped, never forwarded.
                warn!(from = %from_key.id(), origin = %node, seq = rec.seq, "dropped a topology record whose signature is not its origin's");
                self.signature_failed(now, from_key);
                return;
            }
            Received::Stored(before) => before,
        };
        // A member that was offline learns a re-certified member's newest certificate
        // from its record (and refuses the older one from then on).
        if node != self.id {
            self.note_certificate(now, rec.cert.as_deref());
        }
        self.learn_member(now, &rec, &before);
        // Flood on to every other link.
        let (from_id, key) = (from_key.id(), PeerKey(rec.key));
        let msg = Msg::Record(Box::new(rec));
        let targets: Vec<PeerKey> = self.links(now).filter(|k| k.id() != from_id && *k != key).collect();
        for k in targets {
            self.send_msg(&k, &msg, now);
        }
    }

    /// Whether a record from `from_key` may be stored at all: within the sender's
    /// budget, certified where the network has an authority, and not an older copy
    /// of the sender's own (which is answered with ours instead).
    pub(crate) fn admit_record(&mut self, now: Instant, from_key: PeerKey, rec: &Record) -> bool {
        let node = rec.node();
        if !self.within_record_budget(now, from_key, rec) {
            self.mesh.records_over_budget += 1;
            return false;
        }
        let network = &self.cfg.handshake.network_name;
        let unix = (self.cfg.wall + now.saturating_duration_since(self.cfg.epoch)).as_secs();
        // Checked before storing, only for a record newer than the one kept (the
        // same record arrives from every neighbour: one Ed25519 check, not one each).
        let newer = self.mesh.topology.get(&node).is_none_or(|kept| kept.seq < rec.seq);
        if node != self.id
            && newer
            && let Some(why) = crate::authority::record_refusal(
                &self.cfg.authorities,
                &self.trust.revocations,
                &self.trust.newest,
                network,
                rec,
                unix,
            )
        {
            // Not a member by the authority's word: never stored, never forwarded.
            debug!(from = %from_key.id(), origin = %node, "dropped a topology record: {why}");
            self.mesh.records_uncertified += 1;
            return false;
        }
        // The origin itself sends a record no newer than the one we keep, and not the
        // same: it restarted and numbers from zero again. Our copy goes back so that it
        // jumps past it; else a change (a new host name) under a sequence number it
        // already used would never spread, as summaries hash origins and numbers only.
        if node == from_key.id()
            && let Some(kept) = self.mesh.topology.get(&node)
            && kept.seq >= rec.seq
            && kept.sig != rec.sig
        {
            let back = Msg::Record(Box::new(kept.clone()));
            self.send_msg(&from_key, &back, now);
            return false;
        }
        true
    }

    /// What a stored record tells this node about its origin: its name, the subnets it
    /// newly proxies (`before` held the old ones), and the member itself, as an idle
    /// peer, when its address is its own to claim.
    pub(crate) fn learn_member(&mut self, now: Instant, rec: &Record, before: &[(std::net::IpAddr, u8)]) {
        let node = rec.node();
        // The first member this node saw with a name keeps it (a later one with the
        // same name is suffixed in Magic DNS and never takes the exit's traffic).
        let mut changed = self.cfg.names.bind(&rec.hostname, node);
        let fresh: Vec<&(std::net::IpAddr, u8)> =
            rec.proxied.iter().filter(|s| !before.contains(s) && s.1 != 0).collect();
        let unrecorded = if fresh.is_empty() { Vec::new() } else { self.unrecorded_addresses() };
        // Without an authority the first member seen with a prefix holds it, while it
        // announces it; a subnet this node refuses is bound to nobody.
        if self.cfg.authorities.is_empty() && node != self.id {
            changed |= self.cfg.names.release_subnets(node, &rec.proxied);
            for (a, p) in &fresh {
                if self.subnet_refusal(*a, *p, &unrecorded).is_none() {
                    changed |= self.cfg.names.bind_subnet(*a, *p, node);
                }
            }
        }
        if changed {
            self.actions.push_back(crate::node::Action::SaveNames(self.cfg.names.clone()));
        }
        for (a, p) in fresh {
            if let Some(why) = self.proxied_refusal(node, *a, *p, &unrecorded) {
                warn!(peer = %node, host = %rec.hostname, subnet = %format!("{a}/{p}"), "refused proxied subnet: {why}");
            }
        }
        // A member we have not met exists for routing and status from now on, as an
        // idle peer (a session is made when traffic wants one) -- unless it claims our
        // own address (a conflict, or a former identity of this very node) or another
        // member's: the first claimant keeps it.
        let taken = self.address_owner(rec.overlay, node, |_| false);
        if let Some(owner) = taken {
            debug!(peer = %node, overlay = %rec.overlay, %owner, "member's record claims another member's address");
        }
        // An address outside our overlay network is nobody's: no peer, no route.
        let outside = self.outside_overlay(std::net::IpAddr::V4(rec.overlay));
        if let Some(why) = &outside {
            warn!(peer = %node, host = %rec.hostname, "refused member's overlay address: {why}");
        }
        let taken = taken.or_else(|| outside.map(|_| node));
        let key = PeerKey(rec.key);
        let prefix6 = self.cfg.handshake.hello.ipv6.map_or(64, |(_, q)| q);
        if let Some(p) = self.peers.get_mut(&key)
            && !p.is_up()
            && taken.is_none()
            && (p.hello.ipv4 != rec.overlay
                || p.hello.hostname != rec.hostname
                || p.hello.ipv6.map(|(a, _)| a) != rec.overlay6)
        {
            // A member without a session moved (--dhcp) or renamed: its signed record
            // is what we know of it until a handshake tells us more.
            p.hello.ipv4 = rec.overlay;
            p.hello.ipv6 = rec.overlay6.map(|a| (a, prefix6));
            p.hello.hostname.clone_from(&rec.hostname);
            self.published.routes_dirty = true;
        }
        if !self.peers.contains_key(&key) && rec.overlay != self.cfg.handshake.hello.ipv4 && taken.is_none() {
            let hello = self.cfg.handshake.hello.for_member(rec.overlay, rec.overlay6, &rec.hostname);
            self.peers.get_or_insert_with(key, || Peer::new(key, hello, now, std::sync::Arc::default()));
            debug!(peer = %node, overlay = %rec.overlay, "learned member from topology");
        }
        if self.cfg.dynamic.is_some() && rec.overlay == self.cfg.handshake.hello.ipv4 {
            self.resolve_address_conflict(now);
        }
    }

    /// The mesh's timers: recompute paths, age records out, publish our record.
    pub(crate) fn drive_mesh(&mut self, now: Instant) {
        if self.mesh.refresh_paths(now, self.id, self.cfg.latency_first) {
            self.published.routes_dirty = true;
        }
        let gone = self.mesh.expire(now, self.id);
        if !gone.is_empty() {
            self.mesh.paths_changed(now);
            // Members we only knew from their records go with them (a peer we dial,
            // or with a session, stays until its own timers decide).
            for id in gone {
                let Some(key) = self.peers.key_of(&id) else { continue };
                if self
                    .peers
                    .get(&key)
                    .is_some_and(|p| p.sessions.is_empty() && p.anchor() == Anchor::None && !p.has_queued())
                {
                    self.peers.remove(&key);
                    self.published.routes_dirty = true;
                }
            }
        }
        if self.mesh.publish_due(now) {
            self.publish_record(now);
        }
    }

    pub(crate) fn publish_record(&mut self, now: Instant) {
        let rec = self.own_record(now);
        let network = self.cfg.handshake.network_name.clone();
        let Some(rec) = self.mesh.publish(rec, &self.cfg.handshake.local, &network, now) else { return };
        debug!(seq = rec.seq, neighbours = rec.neighbours.len(), "publishing our record");
        let msg = Msg::Record(Box::new(rec));
        let targets: Vec<PeerKey> = self.links(now).collect();
        for k in targets {
            self.send_msg(&k, &msg, now);
        }
    }

    /// Our record, unsigned (the mesh numbers and signs what it publishes).
    pub(crate) fn own_record(&self, now: Instant) -> Record {
        let hello = &self.cfg.handshake.hello;
        let mut neighbours: Vec<Neighbour> = self
            .peers
            .anchored()
            .filter(|p| p.is_link(now))
            .filter_map(|p| {
                Some(Neighbour {
                    node: p.id,
                    rtt_ms: p.probe.rtt.map_or(0, |r| r.as_millis().min(u128::from(u32::MAX)) as u32),
                    loss_pct: p.probe.loss(now).map_or(0, |l| (l * 100.0).round().clamp(0.0, 100.0) as u8),
                    observed: p.path.direct()?.endpoint,
                })
            })
            .collect();
        neighbours.sort_by_key(|n| n.node);
        Record {
            key: self.cfg.handshake.local.public,
            signer: self.cfg.handshake.local.signing_public,
            sig: [0; 64],
            seq: 0,
            hostname: hello.hostname.clone(),
            overlay: hello.ipv4,
            overlay6: hello.ipv6.map(|(a, _)| a),
            endpoints: self.cfg.endpoints.clone(),
            neighbours,
            // Withdrawn (a failing health check): the exit offer alone stays.
            proxied: self.cfg.proxied.iter().filter(|(_, p)| self.withdrawn.is_none() || *p == 0).copied().collect(),
            dynamic: self.cfg.dynamic.is_some(),
            cert: hello.cert.clone(),
            priority: self.cfg.router_priority,
            unknown_ext: Vec::new(),
        }
    }

    /// The links: peers with a working direct path that one end keeps.
    pub(crate) fn links(&self, now: Instant) -> impl Iterator<Item = PeerKey> + '_ {
        self.peers.anchored().filter(move |p| p.is_link(now)).map(|p| p.key)
    }
}
