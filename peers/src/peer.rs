//! Per-peer state of the session engine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_core::admission::Bucket;
use weft_core::endpoint::Endpoint;

use weft_core::handshake::Hello;
use weft_core::session::Session;
use weft_core::stats::PeerStats;

use crate::identity::{NodeId, PeerKey};
use crate::timing::Timers;

/// Handshake retry backoff: what is in flight and when to try next.
#[derive(Debug, Default, Clone)]
pub(crate) struct Backoff {
    /// Local index of the handshake we are waiting on.
    pub(crate) in_flight: Option<u32>,
    /// Do not start another handshake before this.
    pub(crate) next_attempt: Option<Instant>,
    /// Current retry delay (zero before the first failure).
    pub(crate) backoff: Duration,
    /// Consecutive failures.
    pub(crate) failures: u32,
    /// Why the last attempt failed.
    pub(crate) error: Option<String>,
}

impl Backoff {
    pub(crate) fn failed(&mut self, now: Instant, t: &Timers, jitter: u32) {
        self.failures += 1;
        self.back_off(now, t.initial_backoff, t.max_backoff, jitter);
    }

    /// Doubles the delay (from `first`, up to `max`) and schedules the next attempt
    /// after it, with up to 25 % jitter so that many nodes do not retry in lockstep.
    pub(crate) fn back_off(&mut self, now: Instant, first: Duration, max: Duration, jitter: u32) {
        self.backoff = if self.backoff.is_zero() { first } else { (self.backoff * 2).min(max) };
        let spread = self.backoff.as_millis() as u64 / 4;
        self.next_attempt = Some(now + self.backoff + Duration::from_millis(u64::from(jitter) % spread.max(1)));
    }

    pub(crate) fn succeeded(&mut self) {
        *self = Self::default();
    }
}

/// A session with what the engine knows about it.
#[derive(Debug, Clone)]
pub(crate) struct SessionEntry {
    pub(crate) session: Arc<Session>,
    pub(crate) created: Instant,
    pub(crate) initiator: bool,
}

/// A working direct path to a peer: authenticated packets arrive straight from
/// `endpoint`.
#[derive(Debug, Clone)]
pub(crate) struct Direct {
    pub(crate) endpoint: Endpoint,
    /// When it came up.
    pub(crate) since: Instant,
    /// When packets last arrived on `endpoint` itself (rather than on another path).
    pub(crate) seen: Option<Instant>,
    /// Probes of better transports than this path's.
    pub(crate) upgrade: Backoff,
    /// Next probe of every candidate while the path is stale.
    pub(crate) failover_next: Option<Instant>,
}

/// How a peer is reached.
#[derive(Debug, Clone)]
pub(crate) enum PeerPath {
    /// No direct path works: traffic goes through the mesh's next hop, if it has a
    /// route. `last` is where the peer was last reached directly, or the endpoint we
    /// dial for it (handshakes are tried there when no relay path exists).
    Relayed { last: Option<Endpoint> },
    /// Straight to the peer.
    Direct(Direct),
}

impl PeerPath {
    /// The direct path, if it works.
    pub(crate) fn direct(&self) -> Option<&Direct> {
        match self {
            Self::Direct(d) => Some(d),
            Self::Relayed { .. } => None,
        }
    }

    pub(crate) fn is_direct(&self) -> bool {
        matches!(self, Self::Direct(_))
    }

    /// The direct endpoint, or the last known one.
    pub(crate) fn endpoint(&self) -> Option<Endpoint> {
        match self {
            Self::Direct(d) => Some(d.endpoint),
            Self::Relayed { last } => *last,
        }
    }

    /// Moves to a direct path at `endpoint` (a fresh one: no probes pending).
    pub(crate) fn go_direct(&mut self, endpoint: Endpoint, now: Instant) {
        *self = Self::Direct(Direct {
            endpoint,
            since: now,
            seen: Some(now),
            upgrade: Backoff::default(),
            failover_next: None,
        });
    }

    /// Falls back to relaying, remembering the endpoint.
    pub(crate) fn lose_direct(&mut self) {
        *self = Self::Relayed { last: self.endpoint() };
    }
}

/// Why the engine keeps a session with a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Anchor {
    /// We dial it (`--peer`, `weft peer add`, a LAN beacon): a link, kept forever.
    Dialled,
    /// It keeps a link with us: it dialled us (its summaries say so) until the given
    /// time. (Not to be confused with held sessions: finished handshakes waiting for
    /// the peer's proof, or packets queued while a session is made.)
    ByPeer(Instant),
    /// A member met through the mesh: a session only while traffic flows.
    None,
}

/// Data traffic of a peer's sessions as the engine last sampled it (the pipelines
/// count packets; keepalives and control messages are not data).
#[derive(Debug, Default, Clone)]
pub(crate) struct Activity {
    rx_packets: u64,
    tx_packets: u64,
    /// When data last went either way (as sampled).
    pub(crate) last_data: Option<Instant>,
    /// When data was last received (as sampled).
    pub(crate) last_data_rx: Option<Instant>,
    /// The first data sent since the last packet received, if any: no answer for
    /// `dead_after` after it means the session is dead.
    pub(crate) unanswered_since: Option<Instant>,
}

impl Activity {
    /// Samples the counters; `last_rx` is when anything (data or not) last arrived.
    pub(crate) fn sample(&mut self, stats: &PeerStats, now: Instant, last_rx: Option<Instant>) {
        use std::sync::atomic::Ordering::Relaxed;
        let rx = stats.rx_packets.load(Relaxed);
        let tx = stats.tx_packets.load(Relaxed);
        if rx != self.rx_packets {
            self.last_data = Some(now);
            self.last_data_rx = Some(now);
        }
        if tx != self.tx_packets {
            self.last_data = Some(now);
            if self.unanswered_since.is_none() {
                self.unanswered_since = Some(now);
            }
        }
        if let (Some(sent), Some(rx)) = (self.unanswered_since, last_rx)
            && rx >= sent
        {
            self.unanswered_since = None;
        }
        self.rx_packets = rx;
        self.tx_packets = tx;
    }

    /// Counts as data now (a new session gets its chance before it is retired).
    pub(crate) fn touch(&mut self, now: Instant) {
        self.last_data = Some(now);
    }

    /// Whether data went either way within `window`.
    pub(crate) fn active(&self, now: Instant, window: Duration) -> bool {
        self.last_data.is_some_and(|t| now.saturating_duration_since(t) < window)
    }
}

/// A remote node, keyed by its static public key.
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) key: PeerKey,
    /// How many of our revocations its current session was sent (all of them again
    /// after each handshake).
    pub(crate) revocations_sent: usize,
    /// The version of our signed access policy its current session was sent (0: none).
    pub(crate) policy_sent: u64,
    /// A signed policy this member is sending us, in pieces (version, pieces): per
    /// member, so that one that never finishes holds up nobody else's.
    pub(crate) policy_parts: Option<(u64, Vec<Option<Vec<u8>>>)>,
    pub(crate) id: NodeId,
    pub(crate) hello: Hello,
    /// The network secret its last handshake used (while the secret rotates, one
    /// peer may use the next one and another the current one).
    pub(crate) secret: weft_core::admission::Which,
    pub(crate) path: PeerPath,
    anchor: Anchor,
    pub(crate) stats: Arc<PeerStats>,
    pub(crate) activity: Activity,
    /// Packets waiting for a session (sent once it is up), oldest first.
    queued: VecDeque<Vec<u8>>,
    /// Data wanted this peer recently (a packet arrived for it without a session):
    /// handshakes are retried until then.
    pub(crate) wanted_until: Option<Instant>,
    /// Latency and loss probes.
    pub(crate) probe: Probe,
    /// Hole punching towards a relayed peer.
    pub(crate) punch: Backoff,
    /// Punch rounds sent since its direct path was last up.
    pub(crate) punch_rounds: u32,
    /// The birthday method's easy side towards it (it is behind an endpoint-dependent
    /// NAT, this node is not): probes of its public address, and that address.
    pub(crate) birthday: Option<(crate::nat::birthday::Birthday, std::net::IpAddr)>,
    /// The birthday method's hard side towards it: sets of mappings opened for its
    /// probes, bounded and paced.
    pub(crate) opener: crate::nat::birthday::Opener,
    /// Punch packets sent straight to its addresses, since start.
    pub(crate) punches_sent: u64,
    /// Probes sent to its ports (the easy side), since start.
    pub(crate) probes_sent: u64,
    /// The peer's punch requests are not answered again before this (rate limit).
    pub(crate) punch_answer_next: Option<Instant>,
    /// Newest first.
    pub(crate) sessions: Vec<SessionEntry>,
    /// The session we last declared dead, kept (receive side only, until its keys
    /// expire, a new one is made or [`crate::timing::IDLE_RETIRE`] passes) so that data
    /// the peer still sends on it proves the peer never noticed: we then start a new
    /// session at once.
    pub(crate) dropped: Option<SessionEntry>,
    pub(crate) backoff: Backoff,
    pub(crate) last_handshake: Option<Instant>,
    pub(crate) error: Option<String>,
    pub(crate) first_seen: Instant,
    pub(crate) down_since: Option<Instant>,
    /// A topology summary is due on this link.
    pub(crate) summary_next: Option<Instant>,
    /// Our digest was last sent to this link (rate limit).
    pub(crate) digest_sent: Option<Instant>,
    /// Its digest: when the current answering window began and the highest origin
    /// answered in it (rate limit).
    pub(crate) digest_answered: Option<(Instant, NodeId)>,
    /// Topology records this link may still bring us: records of origins we do not
    /// know, and updates of those we do ([`crate::mesh::RECORD_BUDGET`]).
    pub(crate) record_budget: Option<(Bucket, Bucket)>,
    /// Control messages this member may still send us ([`crate::mesh::CONTROL_RATE`]).
    pub(crate) control_budget: Option<Bucket>,
    /// Signed things from it that failed their signature check lately: how many,
    /// since when ([`crate::mesh::SIGNATURE_FAILURES`]).
    pub(crate) bad_signatures: (u32, Option<Instant>),
    /// When it was last sent a batch of revocations (they are paced).
    pub(crate) revocations_at: Option<Instant>,
    /// Since when it is pinged as a router or exit in use (`crate::node::routers`).
    pub(crate) watch_since: Option<Instant>,
    /// What its path carries (path MTU, GSO).
    pub(crate) pmtu: crate::pmtu::PathMtu,
    /// Its direct path lost data while keepalives passed: left for a while.
    pub(crate) degraded: Option<Degraded>,
    /// How often an idle direct path to it that crosses this node's NAT gets a
    /// keepalive (`crate::node::nat_keepalive`): shortened each time such a path died
    /// in a pause, down to what that NAT keeps a mapping for.
    pub(crate) nat_keepalive: Duration,
    /// The pause (by the last arrival before it) for which `nat_keepalive` was last
    /// shortened: one pause shortens it once.
    pub(crate) nat_keepalive_shrunk_for: Option<Instant>,
}

/// A direct path left because it lost too many probes (`crate::node::paths`).
#[derive(Debug, Clone)]
pub(crate) struct Degraded {
    /// The path left.
    pub(crate) endpoint: Endpoint,
    /// Not taken again before this.
    pub(crate) until: Instant,
    /// How long it was left for (doubles while it keeps degrading).
    pub(crate) hold: Duration,
    /// Why, for status.
    pub(crate) why: String,
    /// Left for a relay: the loss is the network's between the two hosts, so no
    /// other transport between them is taken either while it holds.
    pub(crate) relayed: bool,
}

impl Degraded {
    /// Whether the path is still left at `now`.
    pub(crate) fn holds(&self, now: Instant) -> bool {
        now < self.until
    }

    /// Whether a direct path from `from` is refused at `now`: the path left, or (when
    /// left for a relay) any path between the same two hosts, while the hold lasts.
    pub(crate) fn refuses(&self, from: &Endpoint, now: Instant) -> bool {
        self.holds(now) && (self.endpoint == *from || (self.relayed && self.endpoint.addr.ip() == from.addr.ip()))
    }
}

impl Peer {
    pub(crate) fn new(key: PeerKey, hello: Hello, now: Instant, stats: Arc<PeerStats>) -> Self {
        Self {
            key,
            control_budget: None,
            bad_signatures: (0, None),
            revocations_at: None,
            watch_since: None,
            pmtu: crate::pmtu::PathMtu::default(),
            degraded: None,
            nat_keepalive: crate::timing::NAT_KEEPALIVE,
            nat_keepalive_shrunk_for: None,
            revocations_sent: 0,
            id: key.id(),
            hello,
            path: PeerPath::Relayed { last: None },
            anchor: Anchor::None,
            stats,
            activity: Activity::default(),
            queued: VecDeque::new(),
            wanted_until: None,
            probe: Probe::default(),
            punch: Backoff::default(),
            punch_rounds: 0,
            birthday: None,
            opener: crate::nat::birthday::Opener::default(),
            punches_sent: 0,
            probes_sent: 0,
            punch_answer_next: None,
            sessions: Vec::new(),
            dropped: None,
            backoff: Backoff::default(),
            last_handshake: None,
            error: None,
            first_seen: now,
            down_since: None,
            summary_next: None,
            digest_sent: None,
            digest_answered: None,
            record_budget: None,
            secret: weft_core::admission::Which::Current,
            policy_sent: 0,
            policy_parts: None,
        }
    }

    /// The session that carries traffic: the newest confirmed one.
    pub(crate) fn tx(&self) -> Option<&SessionEntry> {
        self.sessions.iter().find(|s| s.session.is_confirmed())
    }

    /// Whether a confirmed session is up.
    pub(crate) fn is_up(&self) -> bool {
        self.tx().is_some()
    }

    /// Whether this peer is a link of the mesh: a working direct path with a session,
    /// kept by us (we dial it) or by it (it dialled us). Links are what records list
    /// and what relays forward over; other direct paths (hole punched for traffic)
    /// go when the traffic stops.
    pub(crate) fn is_link(&self, now: Instant) -> bool {
        let kept = match self.anchor {
            Anchor::Dialled => true,
            Anchor::ByPeer(until) => now < until,
            Anchor::None => false,
        };
        kept && self.path.is_direct() && self.is_up()
    }

    /// Whether the direct path is stale: nothing arrived on its own endpoint for
    /// [`Timers::stale_after`](crate::timing::Timers::stale_after).
    pub(crate) fn path_stale(&self, now: Instant, t: &Timers) -> bool {
        self.path.direct().is_none_or(|d| d.seen.is_none_or(|seen| t.is_stale(now.saturating_duration_since(seen))))
    }

    /// When anything last arrived on any session (ms on the pipeline clock).
    pub(crate) fn last_rx_ms(&self) -> u64 {
        self.sessions.iter().map(|s| s.session.last_rx_ms()).max().unwrap_or(0)
    }
}

/// Round-trip probes of one peer: a ping every few seconds, the last sixteen remembered.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    /// (nonce, sent at, answered) of recent pings, oldest first.
    pub(crate) recent: VecDeque<(u64, Instant, bool)>,
    /// Smoothed round-trip time.
    pub(crate) rtt: Option<Duration>,
    pub(crate) next: Option<Instant>,
}

impl Probe {
    const KEEP: usize = 16;
    /// A ping unanswered for this long counts as lost.
    pub(crate) const LOST_AFTER: Duration = Duration::from_secs(3);

    pub(crate) fn sent(&mut self, nonce: u64, now: Instant) {
        if self.recent.len() == Self::KEEP {
            self.recent.pop_front();
        }
        self.recent.push_back((nonce, now, false));
    }

    pub(crate) fn answered(&mut self, nonce: u64, now: Instant) -> bool {
        let Some(e) = self.recent.iter_mut().find(|e| e.0 == nonce && !e.2) else { return false };
        e.2 = true;
        let sample = now.saturating_duration_since(e.1);
        self.rtt = Some(match self.rtt {
            Some(r) => (r * 7 + sample) / 8,
            None => sample,
        });
        true
    }

    /// Pings decided (answered, or older than LOST_AFTER) among those sent since
    /// `since`, and how many of them were lost.
    pub(crate) fn decided_since(&self, since: Instant, now: Instant) -> (usize, usize) {
        let decided = self
            .recent
            .iter()
            .filter(|(_, at, ok)| *at >= since && (*ok || now.saturating_duration_since(*at) >= Self::LOST_AFTER));
        decided.fold((0, 0), |(n, lost), (_, _, ok)| (n + 1, lost + usize::from(!*ok)))
    }

    /// Fraction of decided pings (answered, or older than LOST_AFTER) that were lost.
    pub(crate) fn loss(&self, now: Instant) -> Option<f32> {
        let decided: Vec<bool> = self
            .recent
            .iter()
            .filter(|(_, at, ok)| *ok || now.saturating_duration_since(*at) >= Self::LOST_AFTER)
            .map(|(_, _, ok)| *ok)
            .collect();
        if decided.is_empty() {
            return None;
        }
        Some(decided.iter().filter(|ok| !**ok).count() as f32 / decided.len() as f32)
    }
}

impl Peer {
    /// Why the engine keeps a session with it (set through [`PeerTable::set_anchor`]).
    pub(crate) fn anchor(&self) -> Anchor {
        self.anchor
    }

    /// Whether packets wait for its session.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }
}

/// When each timer of a peer's current session is next due (`None`: not armed). The
/// one place their conditions are written: `Node::drive_peer` does what is due now
/// and `Node::peer_deadline` wakes for it, both from this plan, so the two cannot
/// disagree about when something happens. One exception is deliberate: a session that
/// is not a link wakes only for its rekey and for the activity sample every keepalive
/// interval, where its other timers are checked, as before the plan existed. Waking it
/// at each of its plan's times (which also samples its activity each time) broke
/// `cli/tests/e2e_mesh.rs` `dhcp_nodes_get_distinct_addresses_and_move_on_conflict`
/// (a restarted member that moved was not reached within 20 s); why exactly is not
/// yet understood, so the old schedule stays until it is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionTimers {
    /// New keys by age (the packet-count limit is checked as the peer is driven).
    /// Armed only when no handshake is in flight and the session is kept or was
    /// active lately: an idle session retires (or its keys expire) instead.
    pub(crate) rekey: Option<Instant>,
    /// A keepalive: on a link whenever we were quiet for `keepalive`; on another
    /// session only to answer data that arrived since we last sent (WireGuard's
    /// passive keepalive).
    pub(crate) keepalive: Option<Instant>,
    /// The session is dead: a link heard nothing for `dead_after`; another session
    /// left data unanswered for `dead_after`.
    pub(crate) dead: Option<Instant>,
    /// A session that is not a link retires after `IDLE_RETIRE` without data.
    pub(crate) retire: Option<Instant>,
    /// The next latency probe, while the session is kept or active.
    pub(crate) probe: Option<Instant>,
    /// The next summary, on a link.
    pub(crate) summary: Option<Instant>,
    /// The next round of the path MTU measurement, while data flows and the member
    /// answers probes.
    pub(crate) pmtu: Option<Instant>,
}

impl SessionTimers {
    /// The plan of `p`'s current session `tx` at `now`.
    pub(crate) fn of(t: &Timers, epoch: Instant, p: &Peer, tx: &SessionEntry, now: Instant) -> Self {
        use crate::timing::{ACTIVE_WINDOW, IDLE_RETIRE, ms_since};
        // A pipeline timestamp (ms since epoch, +1) as an instant.
        let at_ms = |ms: u64| epoch + Duration::from_millis(ms.saturating_sub(1));
        let kept = p.anchor != Anchor::None;
        let created_ms = ms_since(epoch, tx.created);
        let rekey = (p.backoff.in_flight.is_none() && (kept || p.activity.active(now, 3 * ACTIVE_WINDOW)))
            .then(|| (tx.created + t.rekey_due(tx.initiator)).max(p.backoff.next_attempt.unwrap_or(now)));
        let last_tx = tx.session.last_tx_ms().max(created_ms);
        let answer_data = p.activity.last_data_rx.is_some_and(|r| ms_since(epoch, r) > last_tx);
        let keepalive = (kept || answer_data).then(|| at_ms(last_tx) + t.keepalive);
        let dead = if kept {
            Some(at_ms(p.last_rx_ms().max(created_ms)) + t.dead_after)
        } else {
            p.activity.unanswered_since.map(|s| s + t.dead_after)
        };
        let retire = (!kept).then(|| p.activity.last_data.map_or(now, |d| d + IDLE_RETIRE));
        let active = kept || p.activity.active(now, ACTIVE_WINDOW) || p.watch_since.is_some();
        let probe = active.then(|| p.probe.next.unwrap_or(now));
        let summary = p.is_link(now).then(|| p.summary_next.unwrap_or(now));
        // A path is measured while data flows on it (an idle link's control messages
        // need no MTU, and probing idle links would cost every node at rest).
        let answers_probes = p.hello.protocol().caps & weft_core::handshake::caps::PMTU != 0;
        let busy = p.activity.active(now, ACTIVE_WINDOW);
        let pmtu = (busy && answers_probes).then(|| p.pmtu.next.unwrap_or(now));
        Self { rekey, keepalive, dead, retire, probe, summary, pmtu }
    }

    /// Whether a timer is armed and due.
    pub(crate) fn due(at: Option<Instant>, now: Instant) -> bool {
        at.is_some_and(|at| now >= at)
    }

    /// The earliest armed timer.
    pub(crate) fn earliest(&self) -> Option<Instant> {
        [self.rekey, self.keepalive, self.dead, self.retire, self.probe, self.summary, self.pmtu]
            .into_iter()
            .flatten()
            .min()
    }
}

/// Every peer, and the indexes the engine looks peers up by. The only insert
/// ([`PeerTable::get_or_insert_with`]) and the only remove ([`PeerTable::remove`])
/// keep all of them in step: node ids, the anchored peers (our links), the owner of
/// each session index, and the count of packets queued for sessions.
#[derive(Debug, Default)]
pub(crate) struct PeerTable {
    peers: BTreeMap<PeerKey, Peer>,
    ids: BTreeMap<NodeId, PeerKey>,
    anchored: BTreeSet<PeerKey>,
    sessions: BTreeMap<u32, PeerKey>,
    queued: usize,
}

impl PeerTable {
    pub(crate) fn get(&self, key: &PeerKey) -> Option<&Peer> {
        self.peers.get(key)
    }

    pub(crate) fn get_mut(&mut self, key: &PeerKey) -> Option<&mut Peer> {
        self.peers.get_mut(key)
    }

    pub(crate) fn contains_key(&self, key: &PeerKey) -> bool {
        self.peers.contains_key(key)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&PeerKey, &Peer)> {
        self.peers.iter()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values()
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut Peer> {
        self.peers.values_mut()
    }

    /// The key of the member with node id `id`.
    pub(crate) fn key_of(&self, id: &NodeId) -> Option<PeerKey> {
        self.ids.get(id).copied()
    }

    /// The member with node id `id`.
    pub(crate) fn by_id(&self, id: &NodeId) -> Option<&Peer> {
        self.ids.get(id).and_then(|k| self.peers.get(k))
    }

    /// The peer with `key`, made by `make` if there is none.
    pub(crate) fn get_or_insert_with(&mut self, key: PeerKey, make: impl FnOnce() -> Peer) -> &mut Peer {
        let p = self.peers.entry(key).or_insert_with(make);
        self.ids.insert(p.id, key);
        if p.anchor != Anchor::None {
            self.anchored.insert(key);
        }
        p
    }

    /// Takes a peer out of the table and every index; packets queued for it are
    /// dropped (returned with it).
    pub(crate) fn remove(&mut self, key: &PeerKey) -> Option<Peer> {
        let p = self.peers.remove(key)?;
        self.ids.remove(&p.id);
        self.anchored.remove(key);
        self.sessions.retain(|_, k| k != key);
        self.queued -= p.queued.len();
        Some(p)
    }

    /// Sets why the engine keeps a session with `key` (and whether it is a link).
    pub(crate) fn set_anchor(&mut self, key: &PeerKey, anchor: Anchor) {
        let Some(p) = self.peers.get_mut(key) else { return };
        p.anchor = anchor;
        if anchor == Anchor::None {
            self.anchored.remove(key);
        } else {
            self.anchored.insert(*key);
        }
    }

    /// The peers we keep a link with (or did until a `ByPeer` anchor ran out).
    pub(crate) fn anchored(&self) -> impl Iterator<Item = &Peer> {
        self.anchored.iter().filter_map(|k| self.peers.get(k))
    }

    /// Holds `packet` for `key`'s session, unless the peer holds `per_peer` or the
    /// table `total` already (then it is refused: false).
    pub(crate) fn queue(&mut self, key: &PeerKey, packet: &[u8], per_peer: usize, total: usize) -> bool {
        let Some(p) = self.peers.get_mut(key) else { return false };
        if p.queued.len() >= per_peer || self.queued >= total {
            return false;
        }
        p.queued.push_back(packet.to_vec());
        self.queued += 1;
        true
    }

    /// Takes the packets queued for `key`.
    pub(crate) fn take_queued(&mut self, key: &PeerKey) -> Vec<Vec<u8>> {
        let Some(p) = self.peers.get_mut(key) else { return Vec::new() };
        let packets: Vec<Vec<u8>> = p.queued.drain(..).collect();
        self.queued -= packets.len();
        packets
    }

    /// Indexes every session by its local index (after sessions came or went).
    pub(crate) fn index_sessions(&mut self) {
        self.sessions =
            self.peers.values().flat_map(|p| p.sessions.iter().map(|s| (s.session.local_index, p.key))).collect();
    }

    /// The peer whose session has local index `index`, as last indexed.
    pub(crate) fn session_owner(&self, index: u32) -> Option<PeerKey> {
        self.sessions.get(&index).copied()
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their own epoch
mod tests {
    use super::*;

    #[test]
    fn a_path_left_for_a_relay_keeps_every_transport_between_the_two_hosts_off_while_it_holds() {
        let now = Instant::now();
        let ep = |s: &str| s.parse::<Endpoint>().unwrap();
        let left = |relayed| Degraded {
            endpoint: ep("udp://192.0.2.2:11010"),
            until: now + Duration::from_secs(15),
            hold: Duration::from_secs(15),
            why: String::new(),
            relayed,
        };
        let (relay, transport) = (left(true), left(false));
        for from in
            ["udp://192.0.2.2:11010", "tcp://192.0.2.2:11010", "quic://192.0.2.2:11012", "tcp://192.0.2.2:58462"]
        {
            assert!(relay.refuses(&ep(from), now), "{from}");
        }
        assert!(!relay.refuses(&ep("udp://192.0.2.9:11010"), now), "another host");
        assert!(transport.refuses(&ep("udp://192.0.2.2:11010"), now));
        assert!(!transport.refuses(&ep("tcp://192.0.2.2:11010"), now), "no relay: another transport may take over");
        assert!(!relay.refuses(&ep("udp://192.0.2.2:11010"), now + Duration::from_secs(15)), "the hold ended");
    }

    fn peer(k: u8) -> Peer {
        let hello =
            Hello::new(weft_core::crypto::Cipher::Aes128Gcm, std::net::Ipv4Addr::new(10, 0, 0, k), 24, format!("h{k}"));
        Peer::new(PeerKey([k; 32]), hello, Instant::now(), Arc::default())
    }

    #[test]
    fn removing_a_peer_leaves_nothing_of_it_in_any_index() {
        let mut t = PeerTable::default();
        for k in [1, 2] {
            t.get_or_insert_with(PeerKey([k; 32]), || peer(k));
        }
        t.set_anchor(&PeerKey([1; 32]), Anchor::Dialled);
        assert!(t.queue(&PeerKey([1; 32]), b"one", 2, 3));
        assert!(t.queue(&PeerKey([1; 32]), b"two", 2, 3));
        assert!(!t.queue(&PeerKey([1; 32]), b"three", 2, 3), "per-peer cap");
        assert!(t.queue(&PeerKey([2; 32]), b"x", 2, 3));
        assert!(!t.queue(&PeerKey([2; 32]), b"y", 2, 3), "table cap");
        let id1 = PeerKey([1; 32]).id();
        assert_eq!(t.key_of(&id1), Some(PeerKey([1; 32])));
        assert_eq!(t.anchored().count(), 1);

        let gone = t.remove(&PeerKey([1; 32])).unwrap();
        assert!(gone.has_queued());
        assert_eq!(t.key_of(&id1), None);
        assert!(t.by_id(&id1).is_none());
        assert_eq!(t.anchored().count(), 0);
        // Its two queued packets no longer count against the table's cap.
        assert!(t.queue(&PeerKey([2; 32]), b"y", 3, 3));
        assert_eq!(t.take_queued(&PeerKey([2; 32])).len(), 2);
        assert!(t.remove(&PeerKey([1; 32])).is_none());

        // Anchors set and cleared keep the links index in step.
        t.set_anchor(&PeerKey([2; 32]), Anchor::ByPeer(Instant::now()));
        assert_eq!(t.anchored().map(|p| p.key).collect::<Vec<_>>(), [PeerKey([2; 32])]);
        t.set_anchor(&PeerKey([2; 32]), Anchor::None);
        assert_eq!(t.anchored().count(), 0);
    }
}
