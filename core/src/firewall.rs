//! The access policy on the data path: a connection table in front of the compiled
//! policy ([`crate::policy::Compiled`]).
//!
//! The receiver is the boundary. A packet that arrives (after decryption and the
//! inner-source check, before the TUN write) passes when it belongs to a flow in the
//! table, or when the policy allows it, which starts a flow. A packet this node sends
//! starts or refreshes a flow too, so the answers to what it sends pass whatever the
//! policy says of the other direction (the other end's own policy decides whether it
//! takes them). ICMP errors about a tracked flow pass. A packet the table cannot judge
//! is denied ([`Packet::parse`]: an empty ICMP message, an ICMP error quoting garbage,
//! a tiny TCP header); a later fragment passes only behind a first fragment that
//! passed, for [`FRAGMENT_MS`] (each datagram takes one of [`FRAGMENT_SLOTS`] slots
//! by a keyed hash: a fragment that arrives before its first, or after another
//! datagram took its slot, is lost). What this node sends always passes.
//!
//! Entries expire by protocol and state: a flow is established once answered (TCP:
//! once its starter sends a packet without SYN after the answer), and until then lives
//! [`UNESTABLISHED_MS`] (30 s); established TCP 12 min, 10 s after a FIN or RST; UDP
//! 3 min; others 1 min. The table is bounded against members that would fill it: one
//! source address starts at most [`PER_SOURCE`] flows (a sixteenth of the table), a
//! full table ([`MAX_FLOWS`]) evicts the oldest unestablished flow others started to
//! make room, and this node's own flows are never refused for room (past
//! [`MAX_FLOWS`] they take up to [`OWN_EXTRA`] more), so their answers always pass.
//! What is refused for room is counted ([`DropReason::FlowLimit`]). A new policy
//! re-checks the flows the old one admitted: those it no longer allows are cut.
//! No policy: everything passes and nothing is tracked (one atomic load).

mod denials;
mod packet;
mod table;

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use parking_lot::{Mutex, RwLock};

pub use self::denials::{Denial, RECENT_DENIALS};
pub use self::packet::{Fragment, Packet};
pub use self::table::{CLOSING_MS, MAX_FLOWS, OTHER_MS, OWN_EXTRA, PER_SOURCE, TCP_MS, UDP_MS, UNESTABLISHED_MS};
use self::table::{Entry, Flow, Full, Table};
use crate::policy::{Compiled, proto};
use crate::stats::DropReason;

/// How long a thread trusts the last flow it saw pass without the table: a bulk
/// flow's packets take no lock, and its entry is refreshed this often. Far below
/// every timeout, so a trusted entry cannot expire meanwhile.
const TRUST_MS: u64 = 1_000;
/// Slots for the datagrams whose first fragment passed, so that their later fragments do
/// (one per datagram, picked by a keyed hash; a later datagram may take it).
pub const FRAGMENT_SLOTS: usize = 1024;
/// How long a datagram's later fragments may follow its first (Linux's `ipfrag_time`).
pub const FRAGMENT_MS: u64 = 30_000;

/// Tells firewalls apart in [`LAST`] (tests make many on one thread).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The last flow this thread saw pass: through which firewall, under which policy
/// generation, its [`fast_key`] (with the check's [`Kind`]) and when.
#[derive(Clone, Copy)]
struct Last {
    firewall: u64,
    generation: u64,
    key: u128,
    at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inbound = 1,
    Forward = 2,
    Outbound = 3,
}

thread_local! {
    static LAST: Cell<Last> = const { Cell::new(Last { firewall: 0, generation: 0, key: 0, at: 0 }) };
}

/// An unfragmented IPv4 TCP (not FIN or RST) or UDP packet's addresses, ports and
/// protocol, with `kind`, read straight from its bytes: what a thread may trust
/// without the table. `None`: anything else (it always goes to the table).
fn fast_key(p: &[u8], kind: Kind) -> Option<u128> {
    let h: &[u8; 24] = p.get(..24)?.try_into().ok()?;
    // Version 4 without options, neither a fragment nor more to come.
    if h[0] != 0x45 || u16::from_be_bytes([h[6], h[7]]) & 0x3fff != 0 {
        return None;
    }
    match h[9] {
        proto::UDP => {}
        proto::TCP if p.get(33).is_some_and(|f| f & 0x05 == 0) => {}
        _ => return None,
    }
    let mut k = [0u8; 16];
    k[..12].copy_from_slice(&h[12..24]);
    k[12] = h[9];
    k[13] = kind as u8;
    Some(u128::from_ne_bytes(k))
}

/// A policy in force, with its counters.
#[derive(Debug)]
pub struct Active {
    /// The matcher.
    pub compiled: Compiled,
    /// New flows admitted by each rule.
    pub hits: Vec<AtomicU64>,
}

impl Active {
    /// Wraps a compiled policy with zeroed counters.
    pub fn new(compiled: Compiled) -> Self {
        let hits = (0..compiled.rules()).map(|_| AtomicU64::new(0)).collect();
        Self { compiled, hits }
    }

    /// The same policy compiled again (the members changed): its counters go on.
    pub fn recompiled(compiled: Compiled, old: &Self) -> Self {
        let hits =
            (0..compiled.rules()).map(|i| AtomicU64::new(old.hits.get(i).map_or(0, |h| h.load(Relaxed)))).collect();
        Self { compiled, hits }
    }
}

/// A datagram: its source, destination and identification.
type Datagram = (IpAddr, IpAddr, u32);

/// The datagrams whose first fragment passed, one per slot (a later one takes its slot).
#[derive(Debug)]
struct Fragments {
    hasher: RandomState,
    slots: Mutex<Vec<(Datagram, u64)>>,
}

impl Default for Fragments {
    fn default() -> Self {
        let none = ((IpAddr::from([0u8; 4]), IpAddr::from([0u8; 4]), 0), 0);
        Self { hasher: RandomState::new(), slots: Mutex::new(vec![none; FRAGMENT_SLOTS]) }
    }
}

impl Fragments {
    fn slot(&self, d: &Datagram) -> usize {
        (self.hasher.hash_one(d) % FRAGMENT_SLOTS as u64) as usize
    }

    fn note(&self, d: Datagram, now: u64) {
        let i = self.slot(&d);
        self.slots.lock()[i] = (d, now + FRAGMENT_MS);
    }

    fn known(&self, d: Datagram, now: u64) -> bool {
        let i = self.slot(&d);
        let (seen, expires) = self.slots.lock()[i];
        seen == d && expires > now
    }
}

/// The connection table and the policy in force, shared by every pipeline.
#[derive(Debug)]
pub struct Firewall {
    on: AtomicBool,
    /// This firewall in [`LAST`].
    id: u64,
    /// Bumped by every [`Firewall::set`]: what a thread trusted before is checked again.
    generation: AtomicU64,
    policy: RwLock<Option<Arc<Active>>>,
    table: Table,
    fragments: Fragments,
    /// Packets dropped: no rule allows them and they answer no flow, or the table
    /// cannot judge them.
    pub denied: AtomicU64,
    /// New flows dropped because the table was full of established flows.
    pub table_full: AtomicU64,
    /// New flows dropped because their source had started [`PER_SOURCE`] flows.
    pub source_full: AtomicU64,
    /// The last flows denied ([`Firewall::recent_denials`]).
    denials: denials::Denials,
}

impl Default for Firewall {
    fn default() -> Self {
        Self {
            on: AtomicBool::new(false),
            id: NEXT_ID.fetch_add(1, Relaxed),
            generation: AtomicU64::new(0),
            policy: RwLock::new(None),
            table: Table::default(),
            fragments: Fragments::default(),
            denied: AtomicU64::new(0),
            table_full: AtomicU64::new(0),
            source_full: AtomicU64::new(0),
            denials: denials::Denials::default(),
        }
    }
}

impl Firewall {
    /// Puts `policy` in force (`None`: none, everything passes). Flows the old policy
    /// admitted that the new one does not are cut; flows this node started stay.
    pub fn set(&self, policy: Option<Arc<Active>>) {
        let on = policy.is_some();
        *self.policy.write() = policy.clone();
        match &policy {
            None => {
                self.table.retain(|_, _| false);
            }
            Some(p) => {
                for mut r in self.table.flows.iter_mut() {
                    let (f, e) = r.pair_mut();
                    if e.rule.is_none() || e.cut {
                        continue;
                    }
                    let allowed = if e.sent {
                        p.compiled.allows(f.local, f.remote, f.proto, f.remote_port)
                    } else {
                        p.compiled.allows(f.remote, f.local, f.proto, f.local_port)
                    };
                    match allowed {
                        Some(r) => e.rule = Some(r as u32),
                        None => e.cut = true,
                    }
                }
            }
        }
        self.on.store(on, Relaxed);
        // After the marks: a thread that reads the new generation sees them.
        self.generation.fetch_add(1, Release);
    }

    /// Whether this thread saw the flow of `key` ([`fast_key`]) pass the same check
    /// under the policy of `generation` less than [`TRUST_MS`] ago.
    fn trusted(&self, generation: u64, key: Option<u128>, now: u64) -> bool {
        let Some(key) = key else { return false };
        let l = LAST.with(Cell::get);
        l.key == key && l.firewall == self.id && l.generation == generation && now < l.at.saturating_add(TRUST_MS)
    }

    /// Notes that the flow of `key` passed at `now` (its entry refreshed) under the
    /// policy of `generation` (read before the table was), for [`Firewall::trusted`].
    fn trust(&self, generation: u64, key: Option<u128>, now: u64) {
        if let Some(key) = key {
            LAST.with(|l| l.set(Last { firewall: self.id, generation, key, at: now }));
        }
    }

    /// The policy in force.
    pub fn active(&self) -> Option<Arc<Active>> {
        self.policy.read().clone()
    }

    /// Whether a received packet (`packet`, an IP packet) may be delivered at `now`
    /// (milliseconds): `Err` says why not ([`DropReason::Policy`], or
    /// [`DropReason::FlowLimit`] for a new flow the table has no room for). Counts
    /// what it drops.
    pub fn inbound(&self, packet: &[u8], now: u64) -> Result<(), DropReason> {
        self.admit(packet, now, false)
    }

    /// Whether `packet` passes: `sent` says it goes from the local end of its flow
    /// ([`Firewall::forward`]), not to it ([`Firewall::inbound`]).
    fn admit(&self, packet: &[u8], now: u64, sent: bool) -> Result<(), DropReason> {
        if !self.on.load(Relaxed) {
            return Ok(());
        }
        let kind = if sent { Kind::Forward } else { Kind::Inbound };
        let key = fast_key(packet, kind);
        let generation = self.generation.load(Acquire);
        if self.trusted(generation, key, now) {
            return Ok(());
        }
        let Some(p) = Packet::parse(packet) else { return Err(self.deny(None, now)) };
        match p.fragment {
            Fragment::Later { id, offset } => {
                // RFC 1858: a TCP fragment at offset 8 would rewrite the flags the first one showed.
                return if (p.proto != proto::TCP || offset > 1) && self.fragments.known((p.src, p.dst, id), now) {
                    Ok(())
                } else {
                    Err(self.deny(Some(&p), now))
                };
            }
            Fragment::First(id) => {
                // Judged like a whole packet; if it passes, its later fragments will.
                self.flow_packet(&p, key, generation, now, sent)?;
                self.fragments.note((p.src, p.dst, id), now);
            }
            Fragment::Whole => self.flow_packet(&p, key, generation, now, sent)?,
        }
        Ok(())
    }

    /// Judges a packet that carries its transport header: a tracked flow's, an ICMP
    /// error about one, or the policy's to decide (which starts a flow).
    fn flow_packet(
        &self,
        p: &Packet,
        key: Option<u128>,
        generation: u64,
        now: u64,
        sent: bool,
    ) -> Result<(), DropReason> {
        // The flow from the local end's side: the destination is local when received.
        let flow = |(a, pa), (b, pb), proto| {
            let (local, remote, local_port, remote_port) = if sent { (a, b, pa, pb) } else { (b, a, pb, pa) };
            Flow { local, remote, proto, local_port, remote_port }
        };
        let this = flow((p.src, p.sport), (p.dst, p.dport), p.proto);
        let tracked = match self.table.flows.get_mut(&this) {
            Some(mut e) if e.live(now) => {
                e.seen(p, sent, now);
                Some(e.trustworthy(p.proto))
            }
            _ => None,
        };
        if let Some(trust) = tracked {
            if trust {
                self.trust(generation, key, now);
            }
            return Ok(());
        }
        // An ICMP error about a tracked flow: it quotes a packet that went the other way.
        if let Some((s, d, pr, sp, dp)) = p.about {
            let about = flow((d, dp), (s, sp), pr);
            if self.table.flows.get(&about).is_some_and(|e| e.live(now)) {
                return Ok(());
            }
        }
        let Some(active) = self.active() else { return Ok(()) };
        let Some(rule) = active.compiled.allows(p.src, p.dst, p.proto, p.dport) else {
            return Err(self.deny(Some(p), now));
        };
        let e = Entry::new(p, Some(rule as u32), sent, now);
        match self.table.insert(this, e, now) {
            Ok(()) => {
                if let Some(h) = active.hits.get(rule) {
                    h.fetch_add(1, Relaxed);
                }
                if e.trustworthy(p.proto) {
                    self.trust(generation, key, now);
                }
                Ok(())
            }
            Err(Full::Source) => {
                self.source_full.fetch_add(1, Relaxed);
                Err(DropReason::FlowLimit)
            }
            Err(Full::Table) => {
                self.table_full.fetch_add(1, Relaxed);
                Err(DropReason::FlowLimit)
            }
        }
    }

    /// Counts a denied packet, and notes its flow (`p`, when it could be read).
    fn deny(&self, p: Option<&Packet>, now: u64) -> DropReason {
        self.denied.fetch_add(1, Relaxed);
        if let Some(p) = p {
            self.denials.note(p, now);
        }
        DropReason::Policy
    }

    /// The last flows denied, newest first (at most [`RECENT_DENIALS`]).
    pub fn recent_denials(&self) -> Vec<Denial> {
        self.denials.recent()
    }

    /// Notes a packet this node sends (an IP packet): its answers may come back. The
    /// node's own flows always find room ([`OWN_EXTRA`]).
    pub fn outbound(&self, packet: &[u8], now: u64) {
        if !self.on.load(Relaxed) {
            return;
        }
        let key = fast_key(packet, Kind::Outbound);
        let generation = self.generation.load(Acquire);
        if self.trusted(generation, key, now) {
            return;
        }
        let Some(p) = Packet::parse(packet) else { return };
        if matches!(p.fragment, Fragment::Later { .. }) {
            return;
        }
        let flow = Flow { local: p.src, remote: p.dst, proto: p.proto, local_port: p.sport, remote_port: p.dport };
        let known = self.table.flows.get_mut(&flow).map(|mut e| {
            // A cut flow is not started again by what this node still sends on it.
            (!e.cut).then(|| {
                e.seen(&p, true, now);
                e.trustworthy(p.proto)
            })
        });
        match known {
            Some(Some(true)) => self.trust(generation, key, now),
            Some(_) => {}
            None => {
                let e = Entry::new(&p, None, false, now);
                match self.table.insert(flow, e, now) {
                    Ok(()) if e.trustworthy(p.proto) => self.trust(generation, key, now),
                    Ok(()) => {}
                    // Past OWN_EXTRA: its answers go to the policy.
                    Err(_) => {
                        self.table_full.fetch_add(1, Relaxed);
                    }
                }
            }
        }
    }

    /// Whether a packet this node forwards for a device that enforces nothing itself
    /// (a WireGuard portal client: `packet` is what it sent) may go on at `now`. The
    /// node is that device's boundary: the packet passes when it belongs to a tracked
    /// flow (either way) or the policy allows its source to reach its destination,
    /// which starts a flow whose answers [`Firewall::inbound`] then passes. Counts what
    /// it drops, like [`Firewall::inbound`].
    pub fn forward(&self, packet: &[u8], now: u64) -> Result<(), DropReason> {
        self.admit(packet, now, true)
    }

    /// Forgets the flows expired at `now`; returns how many are tracked.
    pub fn expire(&self, now: u64) -> usize {
        self.table.retain(|_, e| e.expires > now)
    }

    /// Flows tracked (expired ones included until [`Firewall::expire`]; cut ones not).
    pub fn flows(&self) -> usize {
        self.table.flows.iter().filter(|r| !r.value().cut).count()
    }

    /// Flows tracked that `source` started (counted against [`PER_SOURCE`]).
    pub fn flows_from(&self, source: IpAddr) -> usize {
        self.table.started_by(source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: u8) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, proto::TCP, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0; 9]);
        p.push(flags);
        p.extend_from_slice(&[0; 6]);
        p
    }

    fn icmp(src: [u8; 4], dst: [u8; 4], t: u8, rest: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto::ICMP, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(&[t, 0, 0, 0, 0, 7, 0, 1]);
        p.extend_from_slice(rest);
        p
    }

    const ME: [u8; 4] = [10, 0, 0, 1];
    const ADMIN: [u8; 4] = [10, 0, 0, 2];
    const OTHER: [u8; 4] = [10, 0, 0, 3];

    fn firewall(text: &str) -> Firewall {
        let fw = Firewall::default();
        fw.set(Some(Arc::new(Active::new(Policy::parse(text).unwrap().compile(&[], &[])))));
        fw
    }

    const SSH_FROM_ADMIN: &str = "[[allow]]\nfrom=[\"10.0.0.2\"]\nto=[\"10.0.0.1\"]\nproto=\"tcp\"\nports=[\"22\"]\n";

    #[test]
    fn denied_flows_are_listed_for_the_admin_and_allowed_ones_are_not() {
        let fw = firewall(SSH_FROM_ADMIN);
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 0).is_ok());
        assert!(fw.inbound(&tcp(OTHER, ME, 40000, 22, 0x02), 5).is_err());
        assert!(fw.inbound(&tcp(ADMIN, ME, 40001, 23, 0x02), 7).is_err());
        assert!(fw.inbound(&tcp(OTHER, ME, 40002, 22, 0x02), 9).is_err());
        assert!(fw.inbound(&[0x45, 0, 0], 11).is_err(), "unreadable: counted, not listed");
        let r = fw.recent_denials();
        let flows: Vec<_> = r.iter().map(|d| (d.src, d.dport, d.count, d.first_ms, d.last_ms)).collect();
        let ip = |a: [u8; 4]| IpAddr::from(a);
        assert_eq!(flows, [(ip(OTHER), 22, 2, 5, 9), (ip(ADMIN), 23, 1, 7, 7)]);
        assert_eq!(fw.denied.load(Relaxed), 4);
    }

    #[test]
    fn allowed_flows_pass_their_replies_and_nothing_else() {
        let fw = firewall(SSH_FROM_ADMIN);
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 0).is_ok(), "the admin's SYN to 22");
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x10), 5).is_ok(), "and the rest of the flow");
        fw.outbound(&tcp(ME, ADMIN, 22, 40000, 0x12), 1);
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 23, 0x02), 0).is_err(), "another port");
        assert!(fw.inbound(&tcp(OTHER, ME, 40000, 22, 0x02), 0).is_err(), "another source");
        assert_eq!(fw.denied.load(Relaxed), 2);
        assert_eq!(fw.active().unwrap().hits[0].load(Relaxed), 1);
        // What this node starts gets its answers, though no rule allows them inbound.
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 10);
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50000, 0x12), 11).is_ok());
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50001, 0x12), 11).is_err(), "not the same flow");
        // ICMP: an echo we sent gets its reply; an error about our flow passes.
        fw.outbound(&icmp(ME, OTHER, 8, &[]), 20);
        assert!(fw.inbound(&icmp(OTHER, ME, 0, &[]), 21).is_ok());
        let quoted = tcp(ME, OTHER, 50000, 443, 0x10);
        assert!(fw.inbound(&icmp([10, 0, 0, 9], ME, 3, &quoted[..28]), 22).is_ok(), "unreachable about our flow");
        let stranger = tcp(ME, OTHER, 50002, 443, 0x10);
        assert!(fw.inbound(&icmp([10, 0, 0, 9], ME, 3, &stranger[..28]), 22).is_err());
        assert!(fw.inbound(&icmp(OTHER, ME, 8, &[]), 23).is_err(), "unsolicited echo");
    }

    #[test]
    fn flows_expire_by_protocol_and_state_and_closing_shortens_them() {
        let fw = firewall(SSH_FROM_ADMIN);
        // A SYN nobody answers, from either side, is forgotten after 30 s.
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 0).is_ok());
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 0);
        assert_eq!(fw.expire(UNESTABLISHED_MS - 1), 2);
        assert_eq!(fw.expire(UNESTABLISHED_MS), 0, "unestablished flows end after 30 s");
        // A SYN answered but never acknowledged is not established either.
        let t = 100_000;
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), t).is_ok());
        fw.outbound(&tcp(ME, ADMIN, 22, 40000, 0x12), t + 1);
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), t + 2).is_ok(), "a SYN again");
        assert_eq!(fw.expire(t + 2 + UNESTABLISHED_MS - 1), 1);
        assert_eq!(fw.expire(t + 2 + UNESTABLISHED_MS), 0);
        // A handshake completed by the admin (inbound) and by this node (outbound), each
        // packet sent at once by the same thread (nothing trusted before it is established).
        let t = 200_000;
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), t).is_ok());
        fw.outbound(&tcp(ME, ADMIN, 22, 40000, 0x12), t + 1);
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x10), t + 2).is_ok());
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), t);
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50000, 0x12), t + 1).is_ok());
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x10), t + 2);
        assert_eq!(fw.expire(t + 2 + TCP_MS - 1), 2, "established TCP flows live 12 min");
        assert_eq!(fw.expire(t + 2 + TCP_MS), 0);
        let t = t + 2 * TCP_MS;
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), t);
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x01), t + 1);
        assert_eq!(fw.expire(t + 1 + CLOSING_MS), 0, "10 s after a FIN");
        // UDP: established by its first answer.
        let t = t + 100_000;
        let mut query = tcp(ME, OTHER, 5353, 53, 0);
        query[9] = proto::UDP;
        let mut answer = tcp(OTHER, ME, 53, 5353, 0);
        answer[9] = proto::UDP;
        fw.outbound(&query, t);
        assert_eq!(fw.expire(t + UNESTABLISHED_MS), 0, "an unanswered query");
        let t = t + 100_000;
        fw.outbound(&query, t);
        assert!(fw.inbound(&answer, t + 1).is_ok());
        assert_eq!(fw.expire(t + 1 + UDP_MS - 1), 1);
        assert_eq!(fw.expire(t + 1 + UDP_MS), 0);
    }

    /// Everyone may reach this node's TCP 5201 (the e2e test's policy).
    const PORT_FOR_ALL: &str = "[[allow]]\nfrom=[\"*\"]\nto=[\"10.0.0.1\"]\nproto=\"tcp\"\nports=[\"5201\"]\n";

    /// Member `i` (10.0.1.i) sends SYNs from `ports` to this node's 5201 at `now`;
    /// returns how many passed.
    fn syns(fw: &Firewall, i: u8, ports: std::ops::Range<u16>, now: u64) -> usize {
        ports.filter(|p| fw.inbound(&tcp([10, 0, 1, i], ME, *p, 5201, 0x02), now).is_ok()).count()
    }

    /// Member `i` opens flows from `ports` to this node's 5201 at `now`, each with a
    /// whole handshake.
    fn connections(fw: &Firewall, i: u8, ports: std::ops::Range<u16>, now: u64) {
        for p in ports {
            assert!(fw.inbound(&tcp([10, 0, 1, i], ME, p, 5201, 0x02), now).is_ok());
            fw.outbound(&tcp(ME, [10, 0, 1, i], 5201, p, 0x12), now);
            assert!(fw.inbound(&tcp([10, 0, 1, i], ME, p, 5201, 0x10), now).is_ok());
        }
    }

    const SHARE: u16 = PER_SOURCE as u16;

    #[test]
    fn one_source_starts_at_most_its_share_of_the_table() {
        let fw = firewall(PORT_FOR_ALL);
        // Two members flood SYNs from every source port: each gets its share, no more.
        for i in [1, 2] {
            assert_eq!(syns(&fw, i, 1..40_001, 0), PER_SOURCE, "member {i}");
            assert_eq!(fw.flows_from(IpAddr::from([10, 0, 1, i])), PER_SOURCE);
        }
        assert_eq!(fw.source_full.load(Relaxed), 2 * (40_000 - PER_SOURCE) as u64);
        assert_eq!(fw.inbound(&tcp([10, 0, 1, 1], ME, 50_000, 5201, 0x02), 0), Err(DropReason::FlowLimit));
        // A third still connects, and this node's own flows get their answers.
        assert!(fw.inbound(&tcp(OTHER, ME, 40000, 5201, 0x02), 1).is_ok(), "a third member");
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 1);
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50000, 0x12), 2).is_ok(), "an answer to this node");
        assert_eq!(fw.table_full.load(Relaxed), 0);
        // The flood's flows end in 30 s, and the flooder's count with them.
        assert_eq!(fw.expire(UNESTABLISHED_MS), 2);
        assert_eq!(fw.flows_from(IpAddr::from([10, 0, 1, 1])), 0);
        assert_eq!(syns(&fw, 1, 1..10, UNESTABLISHED_MS + 1), 9);
    }

    #[test]
    fn threads_that_race_neither_overshoot_a_share_nor_deadlock() {
        let fw = firewall(PORT_FOR_ALL);
        std::thread::scope(|s| {
            for t in 0..4u16 {
                let fw = &fw;
                s.spawn(move || {
                    for p in t * 3000 + 1..=(t + 1) * 3000 {
                        let _ = fw.inbound(&tcp([10, 0, 1, 1], ME, p, 5201, 0x02), 0);
                        fw.outbound(&tcp(ME, [10, 0, 1, 1], 5201, p, 0x12), 0);
                        if p % 500 == 0 {
                            fw.expire(0);
                            let _ = fw.flows();
                        }
                    }
                });
            }
        });
        assert_eq!(fw.flows_from(IpAddr::from([10, 0, 1, 1])), PER_SOURCE);
        assert_eq!(fw.source_full.load(Relaxed), (12_000 - PER_SOURCE) as u64);
        assert_eq!(fw.flows(), 12_000, "this node's answers to the rest are its own flows");
    }

    #[test]
    fn a_full_table_evicts_the_oldest_unestablished_flow_others_started_and_never_an_established_one() {
        let fw = firewall(PORT_FOR_ALL);
        // 15 members with established connections and one flooding SYNs fill the table.
        for i in 1..=15 {
            connections(&fw, i, 1..SHARE + 1, 0);
        }
        assert_eq!(syns(&fw, 16, 1..SHARE + 1, 1), PER_SOURCE);
        assert_eq!(fw.flows(), MAX_FLOWS);
        // A new member's SYN takes the place of the flooder's oldest SYN.
        assert!(fw.inbound(&tcp(OTHER, ME, 40000, 5201, 0x02), 2).is_ok());
        assert_eq!(fw.flows(), MAX_FLOWS);
        assert_eq!(fw.flows_from(IpAddr::from([10, 0, 1, 16])), PER_SOURCE - 1);
        for i in 1..=15 {
            assert_eq!(fw.flows_from(IpAddr::from([10, 0, 1, i])), PER_SOURCE, "member {i} keeps its connections");
        }
        // Oldest first: the flooder's first port went (a packet of it is a new flow for
        // the rule again), its second is still tracked.
        let hits = || fw.active().unwrap().hits[0].load(Relaxed);
        let before = hits();
        assert!(fw.inbound(&tcp([10, 0, 1, 16], ME, 2, 5201, 0x10), 3).is_ok());
        assert_eq!(hits(), before, "port 2 is still tracked");
        assert!(fw.inbound(&tcp([10, 0, 1, 16], ME, 1, 5201, 0x10), 3).is_ok());
        assert_eq!(hits(), before + 1, "port 1 was evicted");
        // Once every flow is established, a new flow from others is refused and counted.
        let fw = firewall(PORT_FOR_ALL);
        for i in 1..=16 {
            connections(&fw, i, 1..SHARE + 1, 0);
        }
        assert_eq!(fw.inbound(&tcp(OTHER, ME, 40000, 5201, 0x02), 1), Err(DropReason::FlowLimit));
        assert_eq!(fw.table_full.load(Relaxed), 1);
    }

    #[test]
    fn the_node_s_own_flows_and_their_answers_pass_however_full_the_table_is() {
        // Full of SYNs: this node's flow takes the place of one.
        let fw = firewall(PORT_FOR_ALL);
        for i in 1..=16 {
            assert_eq!(syns(&fw, i, 1..SHARE + 1, 0), PER_SOURCE);
        }
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 1);
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50000, 0x12), 2).is_ok(), "the answer to this node's SYN");
        assert_eq!(fw.flows(), MAX_FLOWS);
        // Full of established connections: this node's flows go past the bound.
        let fw = firewall(PORT_FOR_ALL);
        for i in 1..=16 {
            connections(&fw, i, 1..SHARE + 1, 0);
        }
        for port in 50_000..50_100 {
            fw.outbound(&tcp(ME, OTHER, port, 443, 0x02), 1);
            assert!(fw.inbound(&tcp(OTHER, ME, 443, port, 0x12), 2).is_ok(), "the answer to port {port}");
        }
        assert_eq!(fw.flows(), MAX_FLOWS + 100);
        assert_eq!(fw.table_full.load(Relaxed), 0);
        // Pings and their replies too.
        fw.outbound(&icmp(ME, OTHER, 8, &[]), 3);
        assert!(fw.inbound(&icmp(OTHER, ME, 0, &[]), 4).is_ok());
    }

    /// An IPv4 packet of `proto` from the admin to this node with `payload`, its
    /// fragment word (flags and offset) and identification set.
    fn fragment(proto: u8, id: u16, word: u16, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0];
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&word.to_be_bytes());
        p.extend_from_slice(&[64, proto, 0, 0]);
        p.extend_from_slice(&ADMIN);
        p.extend_from_slice(&ME);
        p.extend_from_slice(payload);
        p
    }

    /// An IPv6 UDP packet from 2001:db8::2 to 2001:db8::1 behind a fragment header
    /// (`offset` in 8-byte units, more to come or not).
    fn fragment6(id: u32, offset: u16, more: bool, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 0, 44, 64];
        p.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[proto::UDP, 0]);
        p.extend_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn ipv6_extension_headers_are_walked_to_the_transport_header() {
        // Hop-by-hop options, then destination options, then TCP 40000 -> 22 (a SYN).
        let mut p = vec![0x60, 0, 0, 0, 0, 0, 0, 64];
        p.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[60, 0, 1, 4, 0, 0, 0, 0]);
        p.extend_from_slice(&[proto::TCP, 0, 1, 4, 0, 0, 0, 0]);
        p.extend_from_slice(&tcp(ADMIN, ME, 40000, 22, 0x02)[20..]);
        let pkt = Packet::parse(&p).unwrap();
        assert_eq!((pkt.proto, pkt.sport, pkt.dport, pkt.syn), (proto::TCP, 40000, 22, true));
        assert_eq!(pkt.fragment, Fragment::Whole);
        // A chain of nine: not judged.
        let mut long = p[..40].to_vec();
        long[6] = 60;
        for _ in 0..9 {
            long.extend_from_slice(&[60, 0, 1, 4, 0, 0, 0, 0]);
        }
        assert_eq!(Packet::parse(&long), None);
    }

    #[test]
    fn packets_the_table_cannot_judge_are_denied_and_the_node_s_own_still_pass() {
        // The admin may send anything to this node: still, what cannot be judged is denied.
        let fw = firewall("[[allow]]\nfrom=[\"10.0.0.2\", \"2001:db8::2\"]\nto=[\"10.0.0.1\", \"2001:db8::1\"]\n");
        let udp = [0x13, 0x88, 0x00, 0x35, 0, 16, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let garbage_quote = {
            let mut q = vec![0xff; 28];
            q[0] = 0x35; // "IPv3"
            q
        };
        let short_quote = &tcp(ME, ADMIN, 50000, 443, 0x10)[..22];
        let unjudged: [(&str, Vec<u8>); 8] = [
            ("an empty ICMP message", fragment(proto::ICMP, 0, 0, &[])),
            ("an ICMP header cut short", fragment(proto::ICMP, 0, 0, &[8, 0, 0, 0])),
            (
                "an ICMP error quoting garbage",
                fragment(proto::ICMP, 0, 0, &[[3, 3, 0, 0, 0, 0, 0, 0].as_slice(), &garbage_quote].concat()),
            ),
            (
                "an ICMP error quoting a cut TCP header",
                fragment(proto::ICMP, 0, 0, &[[3, 3, 0, 0, 0, 0, 0, 0].as_slice(), short_quote].concat()),
            ),
            ("a TCP header of 8 bytes", fragment(proto::TCP, 0, 0, &tcp(ADMIN, ME, 40000, 22, 0x02)[20..28])),
            ("a UDP header cut short", fragment(proto::UDP, 0, 0, &udp[..6])),
            ("a later fragment of an unknown datagram", fragment(proto::UDP, 7, 185, &udp)),
            ("a later IPv6 fragment of an unknown datagram", fragment6(7, 185, false, &udp)),
        ];
        for (what, p) in &unjudged {
            assert_eq!(fw.inbound(p, 0), Err(DropReason::Policy), "{what}");
            // Forwarded for a portal client, the same.
            assert_eq!(fw.forward(p, 0), Err(DropReason::Policy), "{what}, forwarded");
        }
        assert_eq!(fw.denied.load(Relaxed), 2 * unjudged.len() as u64);
        assert_eq!(fw.flows(), 0);
        // A datagram whose first fragment passed: its later fragments do, for 30 s.
        assert!(fw.inbound(&fragment(proto::UDP, 9, 0x2000, &udp), 0).is_ok(), "the first fragment");
        assert!(fw.inbound(&fragment(proto::UDP, 9, 0x2000 | 2, &udp), 1).is_ok());
        assert!(fw.inbound(&fragment(proto::UDP, 9, 4, &udp), 2).is_ok(), "the last");
        assert!(fw.inbound(&fragment(proto::UDP, 9, 4, &udp), FRAGMENT_MS).is_err(), "too late");
        assert!(fw.inbound(&fragment6(9, 0, true, &udp), 0).is_ok(), "an IPv6 first fragment");
        assert!(fw.inbound(&fragment6(9, 2, false, &udp), 1).is_ok(), "and the last");
        // RFC 1858: a TCP fragment at offset 8 (over the first one's flags) is denied.
        let syn = tcp(ADMIN, ME, 40000, 22, 0x02);
        assert!(fw.inbound(&fragment(proto::TCP, 11, 0x2000, &syn[20..]), 0).is_ok());
        assert!(fw.inbound(&fragment(proto::TCP, 11, 1, &[0; 12]), 0).is_err());
        assert!(fw.inbound(&fragment(proto::TCP, 11, 3, &[0; 12]), 0).is_ok());
        // This node's own traffic: what it sends is only noted (never refused), and the
        // answers to its flows pass.
        let mut own = unjudged.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>();
        for p in &mut own {
            p[12..20].copy_from_slice(&[ME, ADMIN].concat());
            fw.outbound(p, 3);
        }
        fw.outbound(&icmp(ME, OTHER, 8, &[]), 3);
        assert!(fw.inbound(&icmp(OTHER, ME, 0, &[]), 4).is_ok(), "the reply to this node's ping");
    }

    #[test]
    fn a_new_policy_cuts_the_flows_it_no_longer_allows_and_keeps_the_rest() {
        let fw = firewall(&format!("{SSH_FROM_ADMIN}[[allow]]\nfrom=[\"10.0.0.3\"]\nto=[\"*\"]\n"));
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 0).is_ok());
        assert!(fw.inbound(&tcp(OTHER, ME, 40001, 80, 0x02), 0).is_ok());
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 0);
        fw.set(Some(Arc::new(Active::new(Policy::parse(SSH_FROM_ADMIN).unwrap().compile(&[], &[])))));
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x10), 1).is_ok(), "still allowed: kept");
        // What this node still sends on the cut flow does not start it again.
        fw.outbound(&tcp(ME, OTHER, 80, 40001, 0x10), 1);
        assert!(fw.inbound(&tcp(OTHER, ME, 40001, 80, 0x10), 1).is_err(), "no longer allowed: cut");
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50000, 0x10), 1).is_ok(), "ours: kept");
        fw.set(None);
        assert!(fw.inbound(&tcp(OTHER, ME, 1, 2, 0), 2).is_ok(), "no policy: everything passes");
        assert_eq!(fw.flows(), 0, "and nothing is tracked");
    }

    #[test]
    fn a_portal_client_sends_only_what_the_policy_allows_and_gets_the_answers() {
        // 10.0.0.2 is a client behind this node (a device with no policy of its own).
        let client = ADMIN;
        let fw = firewall(SSH_FROM_ADMIN);
        assert!(fw.forward(&tcp(client, ME, 40000, 22, 0x02), 0).is_ok(), "the client's SYN to 22");
        assert!(fw.inbound(&tcp(ME, client, 22, 40000, 0x12), 1).is_ok(), "the answer reaches the client");
        assert!(fw.forward(&tcp(client, ME, 40000, 22, 0x10), 2).is_ok());
        assert!(fw.forward(&tcp(client, ME, 40000, 23, 0x02), 2).is_err(), "another port");
        assert!(fw.forward(&tcp(client, OTHER, 40000, 22, 0x02), 2).is_err(), "another destination");
        assert!(fw.inbound(&tcp(OTHER, client, 22, 40001, 0x02), 2).is_err(), "nobody may reach the client");
        assert_eq!(fw.denied.load(Relaxed), 3);
        // A flow that reached the client (allowed there) gets its answers, ICMP errors too.
        let to_client = "[[allow]]\nfrom=[\"10.0.0.3\"]\nto=[\"10.0.0.2\"]\nproto=\"udp\"\n";
        let fw = firewall(to_client);
        let mut quoted = tcp(OTHER, client, 5000, 53, 0);
        quoted[9] = proto::UDP;
        assert!(fw.inbound(&quoted, 0).is_ok());
        assert!(fw.forward(&icmp(client, OTHER, 3, &quoted[..28]), 1).is_ok(), "port unreachable about it");
        let mut other = quoted.clone();
        other[23] = 54;
        assert!(fw.forward(&icmp(client, OTHER, 3, &other[..28]), 1).is_err(), "about a flow never seen");
        // A new policy cuts what the client started and no longer may: judged the way it went.
        let fw = firewall(&format!("{SSH_FROM_ADMIN}[[allow]]\nfrom=[\"10.0.0.2\"]\nto=[\"10.0.0.3\"]\n"));
        assert!(fw.forward(&tcp(client, ME, 40000, 22, 0x02), 0).is_ok());
        assert!(fw.forward(&tcp(client, OTHER, 40001, 80, 0x02), 0).is_ok());
        fw.set(Some(Arc::new(Active::new(Policy::parse(SSH_FROM_ADMIN).unwrap().compile(&[], &[])))));
        assert!(fw.inbound(&tcp(ME, client, 22, 40000, 0x10), 1).is_ok(), "still allowed: kept");
        assert!(fw.inbound(&tcp(OTHER, client, 80, 40001, 0x10), 1).is_err(), "no longer allowed: cut");
        assert!(fw.forward(&tcp(client, OTHER, 40001, 80, 0x10), 1).is_err());
    }

    #[test]
    fn a_flow_a_thread_trusts_is_still_cut_at_once_and_kept_alive_while_it_runs() {
        let fw = firewall(&format!("{SSH_FROM_ADMIN}[[allow]]\nfrom=[\"10.0.0.3\"]\nto=[\"*\"]\n"));
        let pkt = tcp(OTHER, ME, 40001, 80, 0x10);
        assert!(fw.inbound(&pkt, 0).is_ok());
        assert!(fw.inbound(&pkt, 1).is_ok(), "trusted: no table");
        fw.set(Some(Arc::new(Active::new(Policy::parse(SSH_FROM_ADMIN).unwrap().compile(&[], &[])))));
        assert!(fw.inbound(&pkt, 2).is_err(), "a new policy is checked by the next packet, trusted or not");
        // A flow that keeps going keeps its entry, though most packets skip the table.
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 2).is_ok());
        fw.outbound(&tcp(ME, ADMIN, 22, 40000, 0x12), 2);
        let ssh = tcp(ADMIN, ME, 40000, 22, 0x10);
        let mut now = 0;
        while now < 2 * TCP_MS {
            assert!(fw.inbound(&ssh, now).is_ok());
            now += 250;
        }
        assert_eq!(fw.expire(now), 1, "the running flow is still tracked");
        // Another firewall on the same thread trusts nothing of this one's.
        assert!(fw.inbound(&ssh, now + 1).is_ok());
        let fresh = firewall("[[allow]]\nfrom=[\"10.0.0.9\"]\nto=[\"*\"]\n");
        assert!(fresh.inbound(&ssh, now + 2).is_err(), "not trusted through another firewall");
    }
}
