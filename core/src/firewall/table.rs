//! The connection table: flows by their addresses, protocol and ports (a [`DashMap`]),
//! how many each source started, and the unestablished ones oldest first, to evict.
//!
//! Lock order: a shard of `flows`, then a shard of `sources`; `young` is never locked
//! while a shard of `flows` is held.

use std::collections::VecDeque;
use std::hash::RandomState;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry as Slot;
use parking_lot::Mutex;

use super::packet::Packet;
use crate::policy::proto;

/// Most flows tracked that others started, and most that this node started beyond
/// those ([`OWN_EXTRA`]).
pub const MAX_FLOWS: usize = 65_536;
/// Most flows one source address may have started (those it sent first, or a portal
/// client forwarded): a sixteenth of the table, so that a few members cannot fill it.
pub const PER_SOURCE: usize = MAX_FLOWS / 16;
/// Room for this node's own flows once the table is full of others' established
/// ones: what it sends always finds an entry up to `MAX_FLOWS + OWN_EXTRA` flows.
pub const OWN_EXTRA: usize = MAX_FLOWS;
/// Shards of the map (a power of two).
const SHARDS: usize = 64;

/// TCP, established.
pub const TCP_MS: u64 = 12 * 60_000;
/// TCP after a FIN or RST.
pub const CLOSING_MS: u64 = 10_000;
/// UDP, answered.
pub const UDP_MS: u64 = 3 * 60_000;
/// Other protocols, answered.
pub const OTHER_MS: u64 = 60_000;
/// Any flow not yet established: a TCP flow before its handshake completes (conntrack
/// gives SYN_RECV 60 s and SYN_SENT 120 s; a SYN left unanswered for 30 s has been
/// retried four times), a UDP or other flow before its first answer (conntrack's 30 s).
pub const UNESTABLISHED_MS: u64 = 30_000;

/// A flow, from this node's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Flow {
    pub(super) local: IpAddr,
    pub(super) remote: IpAddr,
    pub(super) proto: u8,
    pub(super) local_port: u16,
    pub(super) remote_port: u16,
}

/// How far a flow has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// TCP: answered, and its starter has sent a packet without SYN since; other
    /// protocols: answered.
    Established,
    /// Only its starter has sent.
    New,
    /// TCP: answered, the handshake's last ACK not seen yet.
    Replied,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) expires: u64,
    /// The rule that admitted it, or `None`: this node started it.
    pub(super) rule: Option<u32>,
    /// Admitted from the local end to the remote one ([`super::Firewall::forward`]: a
    /// packet a portal client sent), not from the remote end ([`super::Firewall::inbound`]).
    pub(super) sent: bool,
    /// A new policy no longer allows it: it stays (until it expires) only so that
    /// what this node still sends on it does not start it again.
    pub(super) cut: bool,
    pub(super) state: State,
}

impl Entry {
    /// The entry of a flow that `p` starts: `rule` admitted it (`None`: this node sent
    /// it), `sent` from the local end.
    pub(super) fn new(p: &Packet, rule: Option<u32>, sent: bool, now: u64) -> Self {
        Self { expires: now + timeout(p.proto, p.closing, State::New), rule, sent, cut: false, state: State::New }
    }

    /// Whether the local end started it: this node, or a portal client behind it.
    fn local_started(&self) -> bool {
        self.rule.is_none() || self.sent
    }

    /// The address it counts against ([`PER_SOURCE`]): its starter's, unless that is
    /// this node.
    fn source(&self, f: &Flow) -> Option<IpAddr> {
        match (self.rule, self.sent) {
            (None, _) => None,
            (Some(_), true) => Some(f.local),
            (Some(_), false) => Some(f.remote),
        }
    }

    /// Whether it may be evicted to make room: others started it, and it is not established.
    fn evictable(&self) -> bool {
        self.rule.is_some() && self.state != State::Established
    }

    pub(super) fn live(&self, now: u64) -> bool {
        self.expires > now && !self.cut
    }

    /// Notes packet `p` of this flow, sent from its local end (`from_local`) or to it.
    pub(super) fn seen(&mut self, p: &Packet, from_local: bool, now: u64) {
        let from_starter = from_local == self.local_started();
        self.state = match (p.proto, self.state, from_starter) {
            (_, State::Established, _) => State::Established,
            (proto::TCP, State::New, false) => State::Replied,
            (proto::TCP, State::Replied, true) if !p.syn => State::Established,
            (proto::TCP, s, _) => s,
            (_, _, false) => State::Established,
            (_, s, true) => s,
        };
        self.expires = now + timeout(p.proto, p.closing, self.state);
    }

    /// Whether a thread may let the flow's next packets pass without the table for a
    /// while: not while a TCP flow waits for the packet that establishes it.
    pub(super) fn trustworthy(&self, proto: u8) -> bool {
        proto != proto::TCP || self.state == State::Established
    }
}

fn timeout(proto: u8, closing: bool, state: State) -> u64 {
    match proto {
        proto::TCP if closing => CLOSING_MS,
        _ if state != State::Established => UNESTABLISHED_MS,
        proto::TCP => TCP_MS,
        proto::UDP => UDP_MS,
        _ => OTHER_MS,
    }
}

/// Why a flow found no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// Its source has [`PER_SOURCE`] flows.
    Source,
    /// The table: no unestablished flow of others to evict.
    Table,
}

#[derive(Debug)]
pub(super) struct Table {
    pub(super) flows: DashMap<Flow, Entry, RandomState>,
    /// Flows each source started ([`Entry::source`]); sources with none are absent.
    sources: DashMap<IpAddr, u32, RandomState>,
    /// Entries in `flows` (counting a map's shards would take every lock).
    len: AtomicUsize,
    /// The unestablished flows others started, oldest first: evicted first when the
    /// table is full. It may still list flows that ended or were established since
    /// (skipped when met, and dropped once they are most of it).
    young: Mutex<VecDeque<Flow>>,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            flows: DashMap::with_hasher_and_shard_amount(RandomState::new(), SHARDS),
            sources: DashMap::with_hasher_and_shard_amount(RandomState::new(), SHARDS),
            len: AtomicUsize::new(0),
            young: Mutex::new(VecDeque::new()),
        }
    }
}

impl Table {
    /// Tracks `flow` as `e` (in place of an entry that is no longer live). Flows others
    /// start are refused past their source's share and past [`MAX_FLOWS`] when no
    /// unestablished flow of others can be evicted; this node's own take such a flow's
    /// place or, failing that, room up to `MAX_FLOWS + OWN_EXTRA`.
    pub(super) fn insert(&self, flow: Flow, e: Entry, now: u64) -> Result<(), Full> {
        let source = e.source(&flow);
        // The source's share is taken at once (one lookup, and never overshot by threads
        // that race), and given back if the table has no room.
        if let Some(s) = source {
            let mut n = self.sources.entry(s).or_default();
            if *n as usize >= PER_SOURCE {
                return Err(Full::Source);
            }
            *n += 1;
        }
        if self.len.load(Relaxed) >= MAX_FLOWS
            && !self.evict_one(now)
            && (source.is_some() || self.len.load(Relaxed) >= MAX_FLOWS + OWN_EXTRA)
        {
            self.release(&flow, &e);
            return Err(Full::Table);
        }
        match self.flows.entry(flow) {
            Slot::Occupied(mut o) => {
                let old = *o.get();
                o.insert(e);
                self.release(&flow, &old);
            }
            Slot::Vacant(v) => {
                v.insert(e);
                self.len.fetch_add(1, Relaxed);
            }
        }
        if e.evictable() {
            let mut young = self.young.lock();
            young.push_back(flow);
            if young.len() > 2 * self.len.load(Relaxed) + 1024 {
                young.retain(|f| self.flows.get(f).is_some_and(|e| e.evictable()));
            }
        }
        Ok(())
    }

    /// Gives back the place `e` (of flow `f`) took in its source's share.
    fn release(&self, f: &Flow, e: &Entry) {
        let Some(s) = e.source(f) else { return };
        let gone = self.sources.get_mut(&s).is_some_and(|mut n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
        if gone {
            self.sources.remove_if(&s, |_, n| *n == 0);
        }
    }

    /// Evicts the oldest unestablished flow others started (or an expired one met on
    /// the way); whether it found one.
    fn evict_one(&self, now: u64) -> bool {
        loop {
            let Some(f) = self.young.lock().pop_front() else { return false };
            if let Some((f, e)) = self.flows.remove_if(&f, |_, e| e.evictable() || e.expires <= now) {
                self.len.fetch_sub(1, Relaxed);
                self.release(&f, &e);
                return true;
            }
        }
    }

    /// Keeps the entries `keep` says to, updating the counts of those it drops; returns
    /// how many are left.
    pub(super) fn retain(&self, mut keep: impl FnMut(&Flow, &mut Entry) -> bool) -> usize {
        self.flows.retain(|f, e| {
            let kept = keep(f, e);
            if !kept {
                self.len.fetch_sub(1, Relaxed);
                self.release(f, e);
            }
            kept
        });
        let mut young = self.young.lock();
        if young.len() > 2 * self.len.load(Relaxed) + 1024 {
            young.retain(|f| self.flows.get(f).is_some_and(|e| e.evictable()));
        }
        self.len.load(Relaxed)
    }

    /// Flows `source` started that are tracked now.
    pub(super) fn started_by(&self, source: IpAddr) -> usize {
        self.sources.get(&source).map_or(0, |n| *n as usize)
    }
}
