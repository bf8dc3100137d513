//! The access policy on the data path: a connection table in front of the compiled
//! policy ([`crate::policy::Compiled`]).
//!
//! The receiver is the boundary. A packet that arrives (after decryption and the
//! inner-source check, before the TUN write) passes when it belongs to a flow in the
//! table, or when the policy allows it, which starts a flow. A packet this node sends
//! starts or refreshes a flow too, so the answers to what it sends pass whatever the
//! policy says of the other direction (the other end's own policy decides whether it
//! takes them). ICMP errors about a tracked flow pass. Entries expire by protocol
//! (TCP 12 min, 10 s after a FIN or RST; UDP 3 min; others 1 min); the table holds
//! at most [`MAX_FLOWS`] (a new flow beyond that is dropped, counted). A new policy
//! re-checks the flows the old one admitted: those it no longer allows are cut.
//! No policy: everything passes and nothing is tracked (one atomic load).

use std::cell::Cell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use parking_lot::{Mutex, RwLock};

use crate::policy::{Compiled, proto};

/// Most flows tracked.
pub const MAX_FLOWS: usize = 65_536;
const SHARDS: usize = 16;
const TCP_MS: u64 = 12 * 60_000;
const CLOSING_MS: u64 = 10_000;
const UDP_MS: u64 = 3 * 60_000;
const OTHER_MS: u64 = 60_000;
/// How long a thread trusts the last flow it saw pass without the table: a bulk
/// flow's packets take no lock, and its entry is refreshed this often. Far below
/// every timeout, so a trusted entry cannot expire meanwhile.
const TRUST_MS: u64 = 1_000;

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

/// A flow, from this node's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Flow {
    local: IpAddr,
    remote: IpAddr,
    proto: u8,
    local_port: u16,
    remote_port: u16,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    expires: u64,
    /// The rule that admitted it, or `None`: this node started it.
    rule: Option<u32>,
    /// Admitted from the local end to the remote one ([`Firewall::forward`]: a packet
    /// a portal client sent), not from the remote end ([`Firewall::inbound`]).
    sent: bool,
    /// A new policy no longer allows it: it stays (until it expires) only so that
    /// what this node still sends on it does not start it again.
    cut: bool,
}

/// What one packet says about its flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol (the transport header's, after IPv6 extension headers are not
    /// followed: anything else is its own protocol number).
    pub proto: u8,
    /// Source port (an ICMP echo request: its identifier).
    pub sport: u16,
    /// Destination port (an ICMP echo reply: its identifier).
    pub dport: u16,
    /// A TCP FIN or RST: the flow is closing.
    pub closing: bool,
    /// An ICMP error: the flow it is about, as that packet's own [`Packet`] (sent by
    /// the receiver of the error).
    pub about: Option<(IpAddr, IpAddr, u8, u16, u16)>,
}

impl Packet {
    /// Reads an IPv4 or IPv6 packet's addresses, protocol and ports (`None`: not IP).
    pub fn parse(p: &[u8]) -> Option<Self> {
        let (src, dst, proto, l4) = ip_header(p)?;
        let mut pkt = Self { src, dst, proto, sport: 0, dport: 0, closing: false, about: None };
        match proto {
            proto::TCP | proto::UDP => {
                if let Some(h) = l4.get(..4) {
                    pkt.sport = u16::from_be_bytes([h[0], h[1]]);
                    pkt.dport = u16::from_be_bytes([h[2], h[3]]);
                }
                if proto == proto::TCP {
                    pkt.closing = l4.get(13).is_some_and(|f| f & 0x05 != 0);
                }
            }
            proto::ICMP | proto::ICMPV6 => {
                let t = *l4.first()?;
                let request = matches!((proto, t), (proto::ICMP, 8) | (proto::ICMPV6, 128));
                let reply = matches!((proto, t), (proto::ICMP, 0) | (proto::ICMPV6, 129));
                let error = matches!((proto, t), (proto::ICMP, 3 | 4 | 5 | 11 | 12) | (proto::ICMPV6, 1..=4));
                // The identifier on the asker's side: a reply matches the request's flow,
                // a request from the other side does not.
                if let Some(id) = l4.get(4..6).filter(|_| request || reply) {
                    let id = u16::from_be_bytes([id[0], id[1]]);
                    (pkt.sport, pkt.dport) = if request { (id, 0) } else { (0, id) };
                }
                if error && let Some(inner) = l4.get(8..) {
                    let (s, d, pr, l) = ip_header(inner)?;
                    let ports = l
                        .get(..4)
                        .map_or((0, 0), |h| (u16::from_be_bytes([h[0], h[1]]), u16::from_be_bytes([h[2], h[3]])));
                    let ports = if pr == proto::TCP || pr == proto::UDP { ports } else { (0, 0) };
                    pkt.about = Some((s, d, pr, ports.0, ports.1));
                }
            }
            _ => {}
        }
        Some(pkt)
    }
}

/// Source, destination, protocol and the bytes after the IP header.
fn ip_header(p: &[u8]) -> Option<(IpAddr, IpAddr, u8, &[u8])> {
    match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p.first()? & 0x0f) * 4;
            if ihl < 20 || p.len() < ihl {
                return None;
            }
            let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
            let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
            // A later fragment has no transport header: ports stay 0.
            let later = u16::from_be_bytes([p[6], p[7]]) & 0x1fff != 0;
            Some((src.into(), dst.into(), p[9], if later { &[] } else { &p[ihl..] }))
        }
        6 => {
            let h = p.get(..40)?;
            let src: [u8; 16] = h[8..24].try_into().ok()?;
            let dst: [u8; 16] = h[24..40].try_into().ok()?;
            Some((Ipv6Addr::from(src).into(), Ipv6Addr::from(dst).into(), h[6], &p[40..]))
        }
        _ => None,
    }
}

fn timeout(proto: u8, closing: bool) -> u64 {
    match proto {
        proto::TCP if closing => CLOSING_MS,
        proto::TCP => TCP_MS,
        proto::UDP => UDP_MS,
        _ => OTHER_MS,
    }
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

/// The connection table and the policy in force, shared by every pipeline.
#[derive(Debug)]
pub struct Firewall {
    on: AtomicBool,
    /// This firewall in [`LAST`].
    id: u64,
    /// Bumped by every [`Firewall::set`]: what a thread trusted before is checked again.
    generation: AtomicU64,
    policy: RwLock<Option<Arc<Active>>>,
    shards: Vec<Mutex<HashMap<Flow, Entry>>>,
    /// Packets dropped: no rule allows them and they answer no flow.
    pub denied: AtomicU64,
    /// New flows dropped because the table was full.
    pub table_full: AtomicU64,
}

impl Default for Firewall {
    fn default() -> Self {
        Self {
            on: AtomicBool::new(false),
            id: NEXT_ID.fetch_add(1, Relaxed),
            generation: AtomicU64::new(0),
            policy: RwLock::new(None),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            denied: AtomicU64::new(0),
            table_full: AtomicU64::new(0),
        }
    }
}

impl Firewall {
    fn shard(&self, f: &Flow) -> &Mutex<HashMap<Flow, Entry>> {
        // The remote address and its port spread flows well enough.
        let k = match f.remote {
            IpAddr::V4(a) => u32::from(a) as usize,
            IpAddr::V6(a) => (u128::from(a) as usize) ^ ((u128::from(a) >> 64) as usize),
        };
        &self.shards[(k ^ usize::from(f.remote_port) ^ usize::from(f.local_port)) % SHARDS]
    }

    /// Puts `policy` in force (`None`: none, everything passes). Flows the old policy
    /// admitted that the new one does not are cut; flows this node started stay.
    pub fn set(&self, policy: Option<Arc<Active>>) {
        let on = policy.is_some();
        *self.policy.write() = policy.clone();
        for s in &self.shards {
            let mut t = s.lock();
            match &policy {
                None => t.clear(),
                Some(p) => {
                    for (f, e) in t.iter_mut().filter(|(_, e)| e.rule.is_some() && !e.cut) {
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
    /// (milliseconds). Counts what it drops.
    pub fn inbound(&self, packet: &[u8], now: u64) -> bool {
        self.admit(packet, now, false)
    }

    /// Whether `packet` passes: `sent` says it goes from the local end of its flow
    /// ([`Firewall::forward`]), not to it ([`Firewall::inbound`]).
    fn admit(&self, packet: &[u8], now: u64, sent: bool) -> bool {
        if !self.on.load(Relaxed) {
            return true;
        }
        let kind = if sent { Kind::Forward } else { Kind::Inbound };
        let key = fast_key(packet, kind);
        let generation = self.generation.load(Acquire);
        if self.trusted(generation, key, now) {
            return true;
        }
        let Some(p) = Packet::parse(packet) else { return true };
        // The flow from the local end's side: the destination is local when received.
        let flow = |(a, pa), (b, pb), proto| {
            let (local, remote, local_port, remote_port) = if sent { (a, b, pa, pb) } else { (b, a, pb, pa) };
            Flow { local, remote, proto, local_port, remote_port }
        };
        let this = flow((p.src, p.sport), (p.dst, p.dport), p.proto);
        {
            let mut t = self.shard(&this).lock();
            if let Some(e) = t.get_mut(&this)
                && e.expires > now
                && !e.cut
            {
                e.expires = now + timeout(p.proto, p.closing);
                drop(t);
                self.trust(generation, key, now);
                return true;
            }
        }
        // An ICMP error about a tracked flow: it quotes a packet that went the other way.
        if let Some((s, d, pr, sp, dp)) = p.about {
            let about = flow((d, dp), (s, sp), pr);
            if self.shard(&about).lock().get(&about).is_some_and(|e| e.expires > now && !e.cut) {
                return true;
            }
        }
        let Some(active) = self.active() else { return true };
        match active.compiled.allows(p.src, p.dst, p.proto, p.dport) {
            Some(rule) => {
                if let Some(h) = active.hits.get(rule) {
                    h.fetch_add(1, Relaxed);
                }
                let e = Entry { expires: now + timeout(p.proto, p.closing), rule: Some(rule as u32), cut: false, sent };
                let tracked = self.track(this, e, now);
                if tracked {
                    self.trust(generation, key, now);
                }
                tracked
            }
            None => {
                self.denied.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// Notes a packet this node sends (an IP packet): its answers may come back.
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
        let flow = Flow { local: p.src, remote: p.dst, proto: p.proto, local_port: p.sport, remote_port: p.dport };
        let expires = now + timeout(p.proto, p.closing);
        {
            let mut t = self.shard(&flow).lock();
            if let Some(e) = t.get_mut(&flow) {
                // A cut flow is not started again by what this node still sends on it.
                if !e.cut {
                    e.expires = expires;
                    drop(t);
                    self.trust(generation, key, now);
                }
                return;
            }
        }
        if self.track(flow, Entry { expires, rule: None, cut: false, sent: false }, now) {
            self.trust(generation, key, now);
        }
    }

    /// Whether a packet this node forwards for a device that enforces nothing itself
    /// (a WireGuard portal client: `packet` is what it sent) may go on at `now`. The
    /// node is that device's boundary: the packet passes when it belongs to a tracked
    /// flow (either way) or the policy allows its source to reach its destination,
    /// which starts a flow whose answers [`Firewall::inbound`] then passes. Counts what
    /// it drops.
    pub fn forward(&self, packet: &[u8], now: u64) -> bool {
        self.admit(packet, now, true)
    }

    fn track(&self, flow: Flow, e: Entry, now: u64) -> bool {
        let mut t = self.shard(&flow).lock();
        if t.len() >= MAX_FLOWS / SHARDS {
            t.retain(|_, x| x.expires > now);
            if t.len() >= MAX_FLOWS / SHARDS {
                self.table_full.fetch_add(1, Relaxed);
                return false;
            }
        }
        t.insert(flow, e);
        true
    }

    /// Forgets the flows expired at `now`; returns how many are tracked.
    pub fn expire(&self, now: u64) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let mut t = s.lock();
                t.retain(|_, e| e.expires > now);
                t.len()
            })
            .sum()
    }

    /// Flows tracked (expired ones included until [`Firewall::expire`]; cut ones not).
    pub fn flows(&self) -> usize {
        self.shards.iter().map(|s| s.lock().values().filter(|e| !e.cut).count()).sum()
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
    fn allowed_flows_pass_their_replies_and_nothing_else() {
        let fw = firewall(SSH_FROM_ADMIN);
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 0), "the admin's SYN to 22");
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x10), 5), "and the rest of the flow");
        fw.outbound(&tcp(ME, ADMIN, 22, 40000, 0x12), 1);
        assert!(!fw.inbound(&tcp(ADMIN, ME, 40000, 23, 0x02), 0), "another port");
        assert!(!fw.inbound(&tcp(OTHER, ME, 40000, 22, 0x02), 0), "another source");
        assert_eq!(fw.denied.load(Relaxed), 2);
        assert_eq!(fw.active().unwrap().hits[0].load(Relaxed), 1);
        // What this node starts gets its answers, though no rule allows them inbound.
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 10);
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50000, 0x12), 11));
        assert!(!fw.inbound(&tcp(OTHER, ME, 443, 50001, 0x12), 11), "not the same flow");
        // ICMP: an echo we sent gets its reply; an error about our flow passes.
        fw.outbound(&icmp(ME, OTHER, 8, &[]), 20);
        assert!(fw.inbound(&icmp(OTHER, ME, 0, &[]), 21));
        let quoted = tcp(ME, OTHER, 50000, 443, 0x10);
        assert!(fw.inbound(&icmp([10, 0, 0, 9], ME, 3, &quoted[..28]), 22), "unreachable about our flow");
        let stranger = tcp(ME, OTHER, 50002, 443, 0x10);
        assert!(!fw.inbound(&icmp([10, 0, 0, 9], ME, 3, &stranger[..28]), 22));
        assert!(!fw.inbound(&icmp(OTHER, ME, 8, &[]), 23), "unsolicited echo");
    }

    #[test]
    fn flows_expire_by_protocol_and_closing_shortens_them() {
        let fw = firewall(SSH_FROM_ADMIN);
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 0));
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 0);
        assert_eq!(fw.expire(TCP_MS - 1), 2);
        assert_eq!(fw.expire(TCP_MS), 0, "idle TCP flows end after 12 min");
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 0);
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x01), 1);
        assert_eq!(fw.expire(1 + CLOSING_MS), 0, "10 s after a FIN");
        // The bound: new flows past it are refused and counted, the table never grows past it.
        let any = firewall("[[allow]]\nfrom=[\"*\"]\nto=[\"*\"]\n");
        let mut admitted = 0;
        for i in 0..(MAX_FLOWS as u32 + 5000) {
            let src = (0x0a00_0000u32 + 2 + i).to_be_bytes();
            admitted += usize::from(any.inbound(&tcp(src, ME, 1000, 22, 0x02), 5));
        }
        assert!(any.flows() <= MAX_FLOWS && admitted <= MAX_FLOWS, "{} flows", any.flows());
        assert!(any.table_full.load(Relaxed) >= 5000);
    }

    #[test]
    fn a_new_policy_cuts_the_flows_it_no_longer_allows_and_keeps_the_rest() {
        let fw = firewall(&format!("{SSH_FROM_ADMIN}[[allow]]\nfrom=[\"10.0.0.3\"]\nto=[\"*\"]\n"));
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x02), 0));
        assert!(fw.inbound(&tcp(OTHER, ME, 40001, 80, 0x02), 0));
        fw.outbound(&tcp(ME, OTHER, 50000, 443, 0x02), 0);
        fw.set(Some(Arc::new(Active::new(Policy::parse(SSH_FROM_ADMIN).unwrap().compile(&[], &[])))));
        assert!(fw.inbound(&tcp(ADMIN, ME, 40000, 22, 0x10), 1), "still allowed: kept");
        // What this node still sends on the cut flow does not start it again.
        fw.outbound(&tcp(ME, OTHER, 80, 40001, 0x10), 1);
        assert!(!fw.inbound(&tcp(OTHER, ME, 40001, 80, 0x10), 1), "no longer allowed: cut");
        assert!(fw.inbound(&tcp(OTHER, ME, 443, 50000, 0x10), 1), "ours: kept");
        fw.set(None);
        assert!(fw.inbound(&tcp(OTHER, ME, 1, 2, 0), 2), "no policy: everything passes");
        assert_eq!(fw.flows(), 0, "and nothing is tracked");
    }

    #[test]
    fn a_portal_client_sends_only_what_the_policy_allows_and_gets_the_answers() {
        // 10.0.0.2 is a client behind this node (a device with no policy of its own).
        let client = ADMIN;
        let fw = firewall(SSH_FROM_ADMIN);
        assert!(fw.forward(&tcp(client, ME, 40000, 22, 0x02), 0), "the client's SYN to 22");
        assert!(fw.inbound(&tcp(ME, client, 22, 40000, 0x12), 1), "the answer reaches the client");
        assert!(fw.forward(&tcp(client, ME, 40000, 22, 0x10), 2));
        assert!(!fw.forward(&tcp(client, ME, 40000, 23, 0x02), 2), "another port");
        assert!(!fw.forward(&tcp(client, OTHER, 40000, 22, 0x02), 2), "another destination");
        assert!(!fw.inbound(&tcp(OTHER, client, 22, 40001, 0x02), 2), "nobody may reach the client");
        assert_eq!(fw.denied.load(Relaxed), 3);
        // A flow that reached the client (allowed there) gets its answers, ICMP errors too.
        let to_client = "[[allow]]\nfrom=[\"10.0.0.3\"]\nto=[\"10.0.0.2\"]\nproto=\"udp\"\n";
        let fw = firewall(to_client);
        let mut quoted = tcp(OTHER, client, 5000, 53, 0);
        quoted[9] = proto::UDP;
        assert!(fw.inbound(&quoted, 0));
        assert!(fw.forward(&icmp(client, OTHER, 3, &quoted[..28]), 1), "port unreachable about it");
        let mut other = quoted.clone();
        other[23] = 54;
        assert!(!fw.forward(&icmp(client, OTHER, 3, &other[..28]), 1), "about a flow never seen");
        // A new policy cuts what the client started and no longer may: judged the way it went.
        let fw = firewall(&format!("{SSH_FROM_ADMIN}[[allow]]\nfrom=[\"10.0.0.2\"]\nto=[\"10.0.0.3\"]\n"));
        assert!(fw.forward(&tcp(client, ME, 40000, 22, 0x02), 0));
        assert!(fw.forward(&tcp(client, OTHER, 40001, 80, 0x02), 0));
        fw.set(Some(Arc::new(Active::new(Policy::parse(SSH_FROM_ADMIN).unwrap().compile(&[], &[])))));
        assert!(fw.inbound(&tcp(ME, client, 22, 40000, 0x10), 1), "still allowed: kept");
        assert!(!fw.inbound(&tcp(OTHER, client, 80, 40001, 0x10), 1), "no longer allowed: cut");
        assert!(!fw.forward(&tcp(client, OTHER, 40001, 80, 0x10), 1));
    }

    #[test]
    fn a_flow_a_thread_trusts_is_still_cut_at_once_and_kept_alive_while_it_runs() {
        let fw = firewall(&format!("{SSH_FROM_ADMIN}[[allow]]\nfrom=[\"10.0.0.3\"]\nto=[\"*\"]\n"));
        let pkt = tcp(OTHER, ME, 40001, 80, 0x10);
        assert!(fw.inbound(&pkt, 0));
        assert!(fw.inbound(&pkt, 1), "trusted: no table");
        fw.set(Some(Arc::new(Active::new(Policy::parse(SSH_FROM_ADMIN).unwrap().compile(&[], &[])))));
        assert!(!fw.inbound(&pkt, 2), "a new policy is checked by the next packet, trusted or not");
        // A flow that keeps going keeps its entry, though most packets skip the table.
        let ssh = tcp(ADMIN, ME, 40000, 22, 0x10);
        let mut now = 0;
        while now < 2 * TCP_MS {
            assert!(fw.inbound(&ssh, now));
            now += 250;
        }
        assert_eq!(fw.expire(now), 1, "the running flow is still tracked");
        // Another firewall on the same thread trusts nothing of this one's.
        assert!(fw.inbound(&ssh, now + 1));
        let fresh = firewall("[[allow]]\nfrom=[\"10.0.0.9\"]\nto=[\"*\"]\n");
        assert!(!fresh.inbound(&ssh, now + 2), "not trusted through another firewall");
    }
}
