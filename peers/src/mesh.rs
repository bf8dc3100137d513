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
use weft_core::endpoint::Endpoint;

use tracing::debug;

use crate::identity::NodeId;
use crate::topology::{Path, Reader, Record, Topology, emit_addr};

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
pub(crate) const DIGEST_GAP: Duration = Duration::from_secs(2);
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
    /// A path MTU probe: padded so that the whole message is `len` bytes, the size of
    /// the inner packet it stands for (sent only to members whose hello says they
    /// answer, [`weft_core::handshake::caps::PMTU`]).
    Probe {
        /// Echoed in the acknowledgement.
        nonce: u64,
        /// The message's whole length.
        len: u16,
    },
    /// "Your probe arrived".
    ProbeAck(u64),
    /// "Inner packets from you arrive with bad TCP/UDP checksums": `count` seen since
    /// the last report. Whatever hands the sender its packets corrupts them (a TUN
    /// offload the kernel gets wrong): it turns its TUN offload off.
    BadChecksums(u32),
}

/// The largest probe (a jumbo inner packet).
pub(crate) const MAX_PROBE: usize = 9000;

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
    pub(super) const PROBE: u8 = 10;
    pub(super) const PROBE_ACK: u8 = 11;
    pub(super) const BAD_CHECKSUMS: u8 = 12;
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
            Self::Probe { nonce, len } => {
                out.push(tag::PROBE);
                out.extend_from_slice(&nonce.to_le_bytes());
                out.resize(usize::from(*len).clamp(9, MAX_PROBE), 0);
            }
            Self::ProbeAck(n) => {
                out.push(tag::PROBE_ACK);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Self::BadChecksums(n) => {
                out.push(tag::BAD_CHECKSUMS);
                out.extend_from_slice(&n.to_le_bytes());
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
            tag::PROBE if rest.len() >= 8 && rest.len() < MAX_PROBE => {
                Self::Probe { nonce: u64_at(rest, 0)?, len: u16::try_from(b.len()).ok()? }
            }
            tag::PROBE_ACK if rest.len() == 8 => Self::ProbeAck(u64_at(rest, 0)?),
            tag::BAD_CHECKSUMS if rest.len() == 4 => Self::BadChecksums(u32::from_le_bytes(rest.try_into().ok()?)),
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
        // A probe is as long as it says; its acknowledgement is small.
        let p = Msg::Probe { nonce: 5, len: 1420 };
        assert_eq!(p.emit().len(), 1420);
        assert_eq!(Msg::parse(&p.emit()), Some(p));
        assert_eq!(Msg::parse(&Msg::ProbeAck(9).emit()), Some(Msg::ProbeAck(9)));
        assert_eq!(Msg::parse(&Msg::BadChecksums(3).emit()), Some(Msg::BadChecksums(3)));
        assert_eq!(Msg::parse(&Msg::BadChecksums(3).emit()[..4]), None);
        assert_eq!(Msg::parse(&[10, 1, 2]), None, "a cut probe");
        assert_eq!(Msg::parse(&vec![10; MAX_PROBE + 1]), None, "a probe over the largest size");
    }
}
