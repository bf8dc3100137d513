//! The mesh: topology records flooded over links, digests that repair what flooding
//! lost, shortest paths, and the control messages that carry them.
//!
//! [`Mesh`] owns the records, the paths computed from them and the publication of our
//! own record; the engine feeds it records and asks it what to send. Records travel
//! only on links (direct neighbours that one end dials), as control messages inside
//! sessions (data packets flagged [`FLAG_CONTROL`]), so only members that proved the
//! PSK can flood them. A record is flooded when it changes and never refreshed
//! periodically: every [`SUMMARY_EVERY`] each end of a link sends a summary (count and
//! hash of the (origin, sequence) pairs it holds); when two summaries differ, each
//! side sends its digest and the other pushes exactly the records it lacks.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weft_core::admission::Bucket;
use weft_core::endpoint::Endpoint;

use tracing::{debug, warn};

use crate::identity::{NodeId, PeerKey};
use crate::node::Node;
use crate::peer::{Anchor, Peer};
use crate::topology::{Neighbour, Path, Reader, Record, Topology, emit_addr};

/// What one link may bring: records of origins we did not know (a whole mesh's worth
/// for a member joining one of about a thousand nodes, then a steady trickle) and
/// updates of those we know, per second and in a burst.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordBudget {
    pub(crate) new_rate: f64,
    pub(crate) new_burst: f64,
    pub(crate) update_rate: f64,
    pub(crate) update_burst: f64,
}

/// The record budget of every link.
pub(crate) const RECORD_BUDGET: RecordBudget =
    RecordBudget { new_rate: 64.0, new_burst: 1024.0, update_rate: 256.0, update_burst: 1024.0 };
/// How often each link's ends compare summaries.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(5);
/// A peer that sent us a summary keeps its link with us this long.
pub(crate) const LINK_HOLD: Duration = Duration::from_secs(16);
/// Our digest goes to one neighbour at most this often.
const DIGEST_GAP: Duration = Duration::from_secs(2);
/// Entries per digest message (16 bytes each: the message stays under 1.1 kB).
const DIGEST_CHUNK: usize = 64;
/// A change of our record is published after this (changes within it coalesce).
const PUBLISH_DELAY: Duration = Duration::from_millis(100);
/// Our record is published at most this often.
const PUBLISH_GAP: Duration = Duration::from_millis(500);
/// A change in a link's measured latency alone republishes our record at most this often.
const RTT_PUBLISH_GAP: Duration = Duration::from_secs(60);
/// Paths are recomputed this long after the records changed (records arriving
/// together cost one Dijkstra).
const PATHS_DELAY: Duration = Duration::from_millis(50);
/// A record whose node became unreachable is still synced this long (well under
/// [`crate::topology::RECORD_TTL`], so that a record on its way out is not revived by
/// neighbours that still hold it).
const SYNC_UNREACHABLE: Duration = Duration::from_secs(20);
/// Most candidate endpoints tried per punch.
pub(crate) const MAX_CANDIDATES: usize = 16;

/// A control message inside a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    /// A topology record (ours or one we forward).
    Record(Box<Record>),
    /// Latency probe.
    Ping(u64),
    /// Answer to a probe.
    Pong(u64),
    /// "Send to me directly at these addresses now": the other half of a hole punch.
    Punch(Vec<Endpoint>),
    /// What the sender's topology holds: the count of records and a hash of their
    /// (origin, sequence) pairs. Sent only on links: it also says "I keep this link".
    Summary {
        /// Records summarised.
        count: u32,
        /// XOR of a hash of each (origin, sequence).
        hash: u64,
    },
    /// Part of the sender's digest: every (origin, sequence) it holds with origin in
    /// `lo..=hi`.
    Digest {
        /// First origin covered.
        lo: NodeId,
        /// Last origin covered.
        hi: NodeId,
        /// (origin, sequence), sorted by origin.
        entries: Vec<(NodeId, u64)>,
    },
    /// "I am stopping": close my sessions now (sent only to members whose hello
    /// says they understand it, [`weft_core::handshake::caps::LEAVE`]).
    Leaving,
    /// A revocation signed by the network's authority (sent only to members whose
    /// hello says they take them, [`weft_core::handshake::caps::REVOCATIONS`]).
    Revocation(Box<weft_core::cert::Revocation>),
    /// A piece of an access policy signed by the authority (sent only to members
    /// whose hello says they take them, [`weft_core::handshake::caps::POLICY`]).
    PolicyPart {
        /// The policy's version.
        version: u64,
        /// Which piece.
        part: u16,
        /// Of how many.
        parts: u16,
        /// Its bytes.
        bytes: Vec<u8>,
    },
}

/// Bytes of a signed policy per control message (the message fits one datagram).
pub(crate) const POLICY_PART: usize = 1000;
/// Most pieces of one policy.
pub(crate) const MAX_POLICY_PARTS: u16 = 64;

/// The first byte of a control message: which [`Msg`] follows. Wire values, never
/// reused: a message a node does not know is dropped.
mod tag {
    pub(super) const RECORD: u8 = 1;
    pub(super) const PING: u8 = 2;
    pub(super) const PONG: u8 = 3;
    pub(super) const PUNCH: u8 = 4;
    pub(super) const SUMMARY: u8 = 5;
    pub(super) const DIGEST: u8 = 6;
    pub(super) const LEAVING: u8 = 7;
    pub(super) const REVOCATION: u8 = 8;
    pub(super) const POLICY_PART: u8 = 9;
}

impl Msg {
    pub(crate) fn emit(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Self::Record(r) => {
                out.push(tag::RECORD);
                r.emit(&mut out);
            }
            Self::Ping(n) => {
                out.push(tag::PING);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Self::Pong(n) => {
                out.push(tag::PONG);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Self::Punch(eps) => {
                out.push(tag::PUNCH);
                let eps = &eps[..eps.len().min(MAX_CANDIDATES)];
                out.push(eps.len() as u8);
                for e in eps {
                    emit_addr(e, &mut out);
                }
            }
            Self::Summary { count, hash } => {
                out.push(tag::SUMMARY);
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(&hash.to_le_bytes());
            }
            Self::Digest { lo, hi, entries } => {
                out.push(tag::DIGEST);
                out.extend_from_slice(&lo.to_bytes());
                out.extend_from_slice(&hi.to_bytes());
                let entries = &entries[..entries.len().min(DIGEST_CHUNK)];
                out.push(entries.len() as u8);
                for (id, seq) in entries {
                    out.extend_from_slice(&id.to_bytes());
                    out.extend_from_slice(&seq.to_le_bytes());
                }
            }
            Self::Leaving => out.push(tag::LEAVING),
            Self::Revocation(r) => {
                out.push(tag::REVOCATION);
                out.extend_from_slice(&r.to_bytes());
            }
            Self::PolicyPart { version, part, parts, bytes } => {
                out.push(tag::POLICY_PART);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&part.to_le_bytes());
                out.extend_from_slice(&parts.to_le_bytes());
                out.extend_from_slice(&bytes[..bytes.len().min(POLICY_PART)]);
            }
        }
        out
    }

    pub(crate) fn parse(b: &[u8]) -> Option<Self> {
        let (&kind, rest) = b.split_first()?;
        let u64_at = |b: &[u8], at: usize| b.get(at..at + 8).and_then(|x| x.try_into().ok()).map(u64::from_le_bytes);
        let id_at = |b: &[u8], at: usize| b.get(at..at + 8).and_then(|x| x.try_into().ok()).map(NodeId::from_bytes);
        Some(match kind {
            tag::RECORD => Self::Record(Box::new(Record::parse(rest).ok()?)),
            tag::PING if rest.len() == 8 => Self::Ping(u64_at(rest, 0)?),
            tag::PONG if rest.len() == 8 => Self::Pong(u64_at(rest, 0)?),
            tag::PUNCH => {
                let mut r = Reader(rest);
                let eps: Vec<Endpoint> = (0..r.u8().ok()?).map(|_| r.addr()).collect::<Result<_, _>>().ok()?;
                if !r.0.is_empty() || eps.len() > MAX_CANDIDATES {
                    return None;
                }
                Self::Punch(eps)
            }
            tag::SUMMARY if rest.len() == 12 => {
                Self::Summary { count: u32::from_le_bytes(rest[..4].try_into().ok()?), hash: u64_at(rest, 4)? }
            }
            tag::DIGEST => {
                let (lo, hi) = (id_at(rest, 0)?, id_at(rest, 8)?);
                let n = usize::from(*rest.get(16)?);
                let body = &rest[17..];
                if n > DIGEST_CHUNK || body.len() != n * 16 || lo > hi {
                    return None;
                }
                let entries: Vec<(NodeId, u64)> =
                    body.chunks_exact(16).map(|c| Some((id_at(c, 0)?, u64_at(c, 8)?))).collect::<Option<_>>()?;
                // Sorted, inside the range: anything else is not a digest we emit.
                let sorted = entries.windows(2).all(|w| w[0].0 < w[1].0);
                if !sorted || entries.iter().any(|(id, _)| *id < lo || *id > hi) {
                    return None;
                }
                Self::Digest { lo, hi, entries }
            }
            tag::LEAVING if rest.is_empty() => Self::Leaving,
            tag::REVOCATION => Self::Revocation(Box::new(weft_core::cert::Revocation::from_bytes(rest).ok()?)),
            tag::POLICY_PART if rest.len() > 12 && rest.len() <= 12 + POLICY_PART => {
                let u16_at = |at: usize| u16::from_le_bytes([rest[at], rest[at + 1]]);
                let (part, parts) = (u16_at(8), u16_at(10));
                if part >= parts || parts > MAX_POLICY_PARTS {
                    return None;
                }
                Self::PolicyPart { version: u64_at(rest, 0)?, part, parts, bytes: rest[12..].to_vec() }
            }
            _ => return None,
        })
    }
}

/// Parses a control message as the engine does and encodes it again: `None` when the
/// engine would drop it. The control wire format's entry point for the fuzz targets.
pub fn reencode_message(b: &[u8]) -> Option<Vec<u8>> {
    Msg::parse(b).map(|m| m.emit())
}

/// What became of a record a neighbour sent.
pub(crate) enum Received {
    /// Not newer than ours (or ours echoed back): nothing to do.
    Stale,
    /// Not signed by its origin: dropped and counted.
    Forged,
    /// Stored: flood it on. Carries the subnets the node proxied before.
    Stored(Vec<(std::net::IpAddr, u8)>),
}

/// Whether two of our records say the same but for latency and loss.
fn same_shape(a: &Record, b: &Record) -> bool {
    a.hostname == b.hostname
        && a.overlay == b.overlay
        && a.endpoints == b.endpoints
        && a.proxied == b.proxied
        && a.dynamic == b.dynamic
        && a.neighbours.len() == b.neighbours.len()
        && a.neighbours.iter().zip(&b.neighbours).all(|(x, y)| x.node == y.node && x.observed == y.observed)
}

/// The topology records, the paths computed from them, and our record's publication.
#[derive(Debug)]
pub(crate) struct Mesh {
    pub(crate) topology: Topology,
    /// Shortest paths to every reachable node.
    pub(crate) paths: BTreeMap<NodeId, Path>,
    /// Our record's sequence number.
    pub(crate) seq: u64,
    /// The record we last published.
    published: Option<Record>,
    last_publish: Option<Instant>,
    /// Our record is due to be published (it may have changed).
    publish_at: Option<Instant>,
    /// The paths are due to be recomputed.
    paths_at: Option<Instant>,
    /// Next look for records that aged out (while some node is unreachable).
    expire_at: Option<Instant>,
    /// Summary of the synced records (cached until they change).
    summary: Option<(u32, u64)>,
    /// Topology records dropped because their signature was not their origin's.
    pub(crate) rejected_records: u64,
    /// Control messages dropped: over their member's [`CONTROL_RATE`].
    pub(crate) control_limited: u64,
    /// Sessions closed because their member's signatures kept failing.
    pub(crate) signature_cutoffs: u64,
    /// Topology records dropped because their link had spent its record budget.
    pub(crate) records_over_budget: u64,
    /// Records dropped in a network with an authority: no valid certificate, a revoked
    /// origin, or claims the certificate does not grant.
    pub(crate) records_uncertified: u64,
}

impl Mesh {
    pub(crate) fn new() -> Self {
        Self {
            topology: Topology::default(),
            paths: BTreeMap::new(),
            seq: 0,
            published: None,
            last_publish: None,
            publish_at: None,
            paths_at: None,
            expire_at: None,
            summary: None,
            rejected_records: 0,
            control_limited: 0,
            signature_cutoffs: 0,
            records_over_budget: 0,
            records_uncertified: 0,
        }
    }

    /// When the mesh next has work.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        [self.publish_at, self.paths_at, self.expire_at].into_iter().flatten().min()
    }

    /// Our record may have changed: publish it soon (coalesced, rate limited; an
    /// unchanged record is not published).
    pub(crate) fn record_changed(&mut self, now: Instant) {
        let at = (now + PUBLISH_DELAY).max(self.last_publish.map_or(now, |t| t + PUBLISH_GAP));
        self.publish_at = Some(self.publish_at.map_or(at, |p| p.min(at)));
    }

    /// Whether publishing is due.
    pub(crate) fn publish_due(&self, now: Instant) -> bool {
        self.publish_at.is_some_and(|t| now >= t)
    }

    /// The records changed: recompute the paths soon.
    pub(crate) fn paths_changed(&mut self, now: Instant) {
        self.summary = None;
        // Larger tables wait a little longer (a search costs more, and records arrive
        // in bursts): 50 ms, plus 0.1 ms per record.
        let at = now + PATHS_DELAY + Duration::from_micros(100 * self.topology.len() as u64);
        self.paths_at = Some(self.paths_at.map_or(at, |p| p.min(at)));
    }

    /// Recomputes the paths if due; returns whether it did.
    pub(crate) fn refresh_paths(&mut self, now: Instant, local: NodeId, latency_first: bool) -> bool {
        if self.paths_at.is_none_or(|t| now < t) {
            return false;
        }
        self.paths_at = None;
        self.paths = self.topology.paths(local, latency_first);
        self.summary = None;
        if self.topology.has_unreachable() || self.topology.len() > self.paths.len() + 1 {
            // At once: a node's unreachable time starts when the paths say so.
            self.expire_at = Some(now);
        }
        true
    }

    /// Drops records of nodes unreachable for [`crate::topology::RECORD_TTL`] (when
    /// the look is due); returns the nodes whose records went.
    pub(crate) fn expire(&mut self, now: Instant, local: NodeId) -> Vec<NodeId> {
        if self.expire_at.is_none_or(|t| now < t) {
            return Vec::new();
        }
        let paths = &self.paths;
        let gone = self.topology.expire(now, local, |id| paths.contains_key(id));
        self.expire_at = self.topology.has_unreachable().then(|| now + Duration::from_secs(1));
        if !gone.is_empty() {
            debug!(count = gone.len(), "records of unreachable nodes aged out");
            self.summary = None;
        }
        gone
    }

    /// Whether `id`'s record is synced with neighbours: ours, a reachable node's, or
    /// one that became unreachable less than [`SYNC_UNREACHABLE`] ago (it may be the
    /// very record that makes its node reachable again, e.g. a link's). Older ones only
    /// wait to age out: nobody is sent them, so a departed node's record is not passed
    /// around for ever.
    fn synced(&self, local: NodeId, now: Instant) -> impl Fn(&NodeId) -> bool + '_ {
        move |id| {
            *id == local
                || self.paths.contains_key(id)
                || self.topology.unreachable_for(id, now).is_none_or(|d| d < SYNC_UNREACHABLE)
        }
    }

    /// Our summary.
    pub(crate) fn summary(&mut self, local: NodeId, now: Instant) -> (u32, u64) {
        if let Some(s) = self.summary {
            return s;
        }
        let s = self.topology.summary(self.synced(local, now));
        self.summary = Some(s);
        s
    }

    /// Our digest, as messages covering every origin between them.
    pub(crate) fn digest(&self, local: NodeId, now: Instant) -> Vec<Msg> {
        let all = self.topology.digest(self.synced(local, now));
        let chunks: Vec<&[(NodeId, u64)]> = all.chunks(DIGEST_CHUNK).collect();
        let mut out = Vec::with_capacity(chunks.len().max(1));
        let mut lo = NodeId::from_bytes([0; 8]);
        for (k, chunk) in chunks.iter().enumerate() {
            let next = chunks.get(k + 1).map(|c| c[0].0);
            let hi = match next {
                // Origins sort as big-endian numbers: the range ends just before the next chunk.
                Some(n) => NodeId::from_bytes((u64::from_be_bytes(n.to_bytes()) - 1).to_be_bytes()),
                None => NodeId::from_bytes([0xff; 8]),
            };
            out.push(Msg::Digest { lo, hi, entries: chunk.to_vec() });
            if let Some(n) = next {
                lo = n;
            }
        }
        if out.is_empty() {
            out.push(Msg::Digest { lo, hi: NodeId::from_bytes([0xff; 8]), entries: Vec::new() });
        }
        out
    }

    /// The records a neighbour whose digest of `lo..=hi` is `entries` lacks.
    pub(crate) fn missing_from(
        &self,
        local: NodeId,
        now: Instant,
        lo: NodeId,
        hi: NodeId,
        entries: &[(NodeId, u64)],
    ) -> Vec<Record> {
        self.topology.newer_than(lo, hi, entries, self.synced(local, now)).cloned().collect()
    }

    /// Takes a record a neighbour sent. Our own record coming back makes us jump past
    /// its sequence number when we signed it (an earlier run of this node).
    pub(crate) fn receive(&mut self, rec: &Record, local: NodeId, network: &str, now: Instant) -> Received {
        if rec.node() == local {
            if rec.seq >= self.seq && rec.seq < crate::topology::MAX_SEQ && rec.verify(network) {
                self.seq = rec.seq + 1;
                self.published = None;
                self.record_changed(now);
            }
            return Received::Stale;
        }
        // Only what would change our table is worth a signature check.
        if !self.topology.is_newer(rec) {
            return Received::Stale;
        }
        if !rec.verify(network) {
            self.rejected_records += 1;
            return Received::Forged;
        }
        let before = self.topology.get(&rec.node()).map(|r| r.proxied.clone()).unwrap_or_default();
        if !self.topology.apply(rec.clone()) {
            return Received::Stale;
        }
        self.paths_changed(now);
        Received::Stored(before)
    }

    /// Publishes `rec` (our record, unsigned, with seq 0) if it differs from the last
    /// one we published: returns it signed and stored, or `None` when nothing changed
    /// enough. A neighbour's latency alone counts when it moved a lot, and then at
    /// most every [`RTT_PUBLISH_GAP`].
    pub(crate) fn publish(
        &mut self,
        mut rec: Record,
        key: &weft_core::handshake::StaticKey,
        network: &str,
        now: Instant,
    ) -> Option<Record> {
        self.publish_at = None;
        if let Some(old) = &self.published
            && same_shape(old, &rec)
        {
            let pairs =
                || old.neighbours.iter().zip(&rec.neighbours).map(|(o, n)| (i64::from(o.rtt_ms), i64::from(n.rtt_ms)));
            let first_rtt = pairs().any(|(o, n)| o == 0 && n != 0);
            let moved = pairs().any(|(o, n)| (o - n).abs() > 5 && (o - n).abs() * 2 > o);
            let gap_ok = self.last_publish.is_none_or(|t| now.saturating_duration_since(t) >= RTT_PUBLISH_GAP);
            if !(first_rtt || (moved && gap_ok)) {
                if moved {
                    // Publish the new latency once the gap allows.
                    self.publish_at = self.last_publish.map(|t| t + RTT_PUBLISH_GAP);
                }
                return None;
            }
        }
        self.seq += 1;
        rec.seq = self.seq;
        rec.sign(key, network);
        self.topology.apply(rec.clone());
        self.published = Some(rec.clone());
        self.last_publish = Some(now);
        self.paths_changed(now);
        Some(rec)
    }
}

/// Control messages a member may send us a second (after a burst of
/// [`CONTROL_BURST`]); more are dropped and counted. Far above what a mesh needs (a
/// new link's digest sync, paced revocations), far below what would keep the
/// control loop from its timers and handshakes.
pub(crate) const CONTROL_RATE: f64 = 2_000.0;
/// The burst of [`CONTROL_RATE`].
pub(crate) const CONTROL_BURST: f64 = 8_000.0;
/// A member whose signed messages (records, revocations, policies) fail their
/// signature check this many times within [`SIGNATURE_WINDOW`] has its sessions
/// closed: each check costs an Ed25519 verify, and an honest member forwards only
/// what it verified.
pub(crate) const SIGNATURE_FAILURES: u32 = 16;
/// The window of [`SIGNATURE_FAILURES`].
pub(crate) const SIGNATURE_WINDOW: Duration = Duration::from_secs(60);
/// Revocations sent to one member at a time, at most once a second: below
/// [`CONTROL_RATE`], so a member catching up on a long list loses none.
pub(crate) const REVOCATIONS_PER_SECOND: usize = 1_000;

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
    fn handle_summary(&mut self, now: Instant, key: PeerKey, theirs: (u32, u64)) {
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
    fn within_record_budget(&mut self, now: Instant, from_key: PeerKey, rec: &Record) -> bool {
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

    fn handle_record(&mut self, now: Instant, from_key: PeerKey, rec: Record) {
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
    fn admit_record(&mut self, now: Instant, from_key: PeerKey, rec: &Record) -> bool {
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
    fn learn_member(&mut self, now: Instant, rec: &Record, before: &[(std::net::IpAddr, u8)]) {
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

    fn publish_record(&mut self, now: Instant) {
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
            proxied: self.cfg.proxied.clone(),
            dynamic: self.cfg.dynamic.is_some(),
            cert: hello.cert.clone(),
        }
    }

    /// The links: peers with a working direct path that one end keeps.
    pub(crate) fn links(&self, now: Instant) -> impl Iterator<Item = PeerKey> + '_ {
        self.peers.anchored().filter(move |p| p.is_link(now)).map(|p| p.key)
    }
}

/// The first free host address of `net/prefix`, starting from a position derived from
/// the node id so that nodes joining at once rarely pick the same one.
pub fn pick_address(
    net: std::net::Ipv4Addr,
    prefix: u8,
    node: NodeId,
    used: &std::collections::HashSet<std::net::Ipv4Addr>,
) -> Option<std::net::Ipv4Addr> {
    let host_bits = 32 - u32::from(prefix.min(30));
    let size = 1u64 << host_bits;
    let base = u32::from(net) & !((size - 1) as u32);
    let hosts = size - 2; // no network or broadcast address
    let start = u64::from_le_bytes(node.to_bytes()) % hosts;
    (0..hosts)
        .map(|i| base + 1 + ((start + i) % hosts) as u32)
        .map(std::net::Ipv4Addr::from)
        .find(|a| !used.contains(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_addresses_stay_in_range_and_skip_used_ones() {
        let net: std::net::Ipv4Addr = [10, 126, 126, 0].into();
        let id = NodeId::from_public(&[3; 32]);
        let mut used = std::collections::HashSet::new();
        let first = pick_address(net, 24, id, &used).unwrap();
        assert_eq!(first.octets()[..3], [10, 126, 126]);
        assert!((1..=254).contains(&first.octets()[3]));
        used.insert(first);
        let second = pick_address(net, 24, id, &used).unwrap();
        assert_ne!(first, second);
        let all: std::collections::HashSet<_> = (1..=254u8).map(|h| std::net::Ipv4Addr::new(10, 126, 126, h)).collect();
        assert_eq!(pick_address(net, 24, id, &all), None);
    }

    #[test]
    fn messages_round_trip() {
        for m in [Msg::Ping(7), Msg::Pong(u64::MAX), Msg::Punch(vec!["203.0.113.5:11010".parse().unwrap()])] {
            assert_eq!(Msg::parse(&m.emit()), Some(m));
        }
        assert_eq!(Msg::parse(&[]), None);
        assert_eq!(Msg::parse(&[9, 1, 2]), None);
        assert_eq!(Msg::parse(&[2, 1]), None);
    }
}
