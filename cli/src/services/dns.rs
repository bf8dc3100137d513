//! Magic DNS: every node answers `<host>.<domain>` for the members of the mesh on its
//! overlay address, and refuses every other name (it is no resolver, open or not).
//! The wire format is hickory-proto's; the zone is rebuilt from the topology records.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use arc_swap::ArcSwap;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use tracing::{debug, warn};
use weft_peers::NodeId;

use crate::config::domain::label;

/// Seconds members' answers may be cached: a renamed or departed member is gone from
/// resolvers' caches within this.
pub const TTL: u32 = 10;
/// The UDP payload size we advertise in EDNS (RFC 9715's recommendation); our answers
/// (one A record and an SOA at most) stay far below it.
const MAX_UDP: u16 = 1232;
/// The members' names: label → address. Members whose host names make the same label
/// are told apart by their node id: the member the name is bound to (the first this
/// node saw with it, [`weft_peers::Names`]) keeps the plain label, else the lowest id;
/// the others get `-` and the first six hex digits of their id (stable across
/// restarts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    domain: Name,
    names: BTreeMap<String, Addrs>,
    /// Who may ask: the mesh's networks. Linux takes a datagram for the overlay
    /// address on any interface, so without this a LAN neighbour that routes the
    /// overlay to us could read the member list.
    clients: Vec<(IpAddr, u8)>,
}

/// A member's overlay addresses: IPv4, and IPv6 when it has one.
type Addrs = (Ipv4Addr, Option<Ipv6Addr>);

impl Zone {
    /// A zone for `domain` (already checked by [`parse_domain`](crate::config::domain::parse_domain)) holding `members`:
    /// (node id, host name, overlay address, IPv6 overlay address).
    pub fn new<'a>(
        domain: &str,
        members: impl IntoIterator<Item = (NodeId, &'a str, Ipv4Addr, Option<Ipv6Addr>)>,
        holder: impl Fn(&str) -> Option<NodeId>,
    ) -> Self {
        let domain = Name::from_ascii(format!("{domain}.")).unwrap_or_else(|_| Name::root());
        let mut by_label: BTreeMap<String, Vec<(bool, NodeId, Addrs)>> = BTreeMap::new();
        for (id, host, addr, addr6) in members {
            let mut l = label(host);
            if l.is_empty() {
                l = format!("node-{id}");
            }
            // The member the name is bound to (it held it first, as this node saw it)
            // keeps the plain label, whatever the ids.
            let first = holder(host) == Some(id);
            by_label.entry(l).or_default().push((!first, id, (addr, addr6)));
        }
        let mut names = BTreeMap::new();
        let mut later = Vec::new();
        for (l, mut group) in by_label {
            group.sort_unstable_by_key(|(later, id, _)| (*later, *id));
            let mut group = group.into_iter();
            if let Some((_, _, addr)) = group.next() {
                names.insert(l.clone(), addr);
            }
            later.extend(group.map(|(_, id, addr)| (l.clone(), id, addr)));
        }
        // The others after every plain name, so a suffixed name never replaces a
        // member's own; the whole id when six digits would still clash.
        for (l, id, addr) in later {
            let id = id.to_string();
            let base: String = l.chars().take(63 - 17).collect();
            let base = base.trim_end_matches('-');
            let short = format!("{base}-{}", &id[..6]);
            let name = if names.contains_key(&short) { format!("{base}-{id}") } else { short };
            names.entry(name).or_insert(addr);
        }
        Self { domain, names, clients: Vec::new() }
    }

    /// Answers only sources inside `nets` (the overlay, proxied subnets, the portal
    /// network); datagrams from anywhere else are dropped unanswered.
    #[must_use]
    pub fn for_clients(mut self, nets: Vec<(IpAddr, u8)>) -> Self {
        self.clients = nets;
        self
    }

    /// Whether a query from `ip` gets an answer.
    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.clients.iter().any(|(n, p)| weft_core::route::overlaps_ip(*n, *p, ip, 128))
    }

    /// The domain, without the trailing dot.
    pub fn domain(&self) -> String {
        self.domain.to_ascii().trim_end_matches('.').to_owned()
    }

    /// Names in the zone.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the zone holds no name.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The fully qualified name of the member at `addr`, if it has one.
    pub fn name_of(&self, addr: Ipv4Addr) -> Option<String> {
        self.names.iter().find(|(_, a)| a.0 == addr).map(|(l, _)| format!("{l}.{}", self.domain()))
    }

    /// The addresses of the member called `name`: `label.domain` or the bare label,
    /// in any case, with or without a trailing dot.
    pub fn resolve(&self, name: &str) -> Option<(Ipv4Addr, Option<Ipv6Addr>)> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let domain = self.domain().to_ascii_lowercase();
        let label = match name.strip_suffix(&domain).and_then(|l| l.strip_suffix('.')) {
            Some(l) => l,
            None if !name.contains('.') => name.as_str(),
            None => return None,
        };
        self.names.get(label).copied()
    }

    /// The answer to one datagram, or `None` when it is no query (malformed, or a
    /// response: answering those could make two servers loop).
    pub fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        let req = Message::from_vec(query).ok()?;
        if req.metadata.message_type != MessageType::Query {
            return None;
        }
        let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
        resp.metadata.recursion_desired = req.metadata.recursion_desired;
        resp.metadata.recursion_available = false;
        if req.edns.is_some() {
            let mut e = Edns::new();
            e.set_max_payload(MAX_UDP);
            resp.set_edns(e);
        }
        resp.metadata.response_code = self.fill(&req, &mut resp);
        resp.to_vec().ok()
    }

    fn fill(&self, req: &Message, resp: &mut Message) -> ResponseCode {
        if req.metadata.op_code != OpCode::Query {
            return ResponseCode::NotImp;
        }
        let [q] = req.queries.as_slice() else {
            return ResponseCode::FormErr;
        };
        resp.add_query(q.clone());
        let name = q.name().to_lowercase();
        if q.query_class() != DNSClass::IN || !self.domain.zone_of(&name) {
            return ResponseCode::Refused;
        }
        resp.metadata.authoritative = true;
        let depth = name.num_labels().saturating_sub(self.domain.num_labels());
        let found = if depth == 1 {
            name.iter().next().and_then(|l| std::str::from_utf8(l).ok()).and_then(|l| self.names.get(l))
        } else {
            None
        };
        match (depth, found) {
            (0, _) => {
                if matches!(q.query_type(), RecordType::SOA | RecordType::ANY) {
                    resp.add_answer(self.soa());
                } else {
                    resp.add_authority(self.soa());
                }
                ResponseCode::NoError
            }
            (_, Some((addr, addr6))) => {
                let t = q.query_type();
                if matches!(t, RecordType::A | RecordType::ANY) {
                    resp.add_answer(Record::from_rdata(name.clone(), TTL, RData::A(A(*addr))));
                }
                if let (RecordType::AAAA | RecordType::ANY, Some(a6)) = (t, addr6) {
                    resp.add_answer(Record::from_rdata(name, TTL, RData::AAAA(AAAA(*a6))));
                }
                if resp.answers.is_empty() {
                    // The name exists but has no record of that type (AAAA of an
                    // IPv4-only member, MX, ...): NODATA, with the SOA for negative
                    // caching.
                    resp.add_authority(self.soa());
                }
                ResponseCode::NoError
            }
            (_, None) => {
                resp.add_authority(self.soa());
                ResponseCode::NXDomain
            }
        }
    }

    fn soa(&self) -> Record {
        let host = |l: &str| Name::from_ascii(l).ok().and_then(|n| n.append_domain(&self.domain).ok());
        let mname = host("ns").unwrap_or_else(|| self.domain.clone());
        let rname = host("hostmaster").unwrap_or_else(|| self.domain.clone());
        let soa = SOA::new(mname, rname, 1, 3600, 600, 86400, TTL);
        Record::from_rdata(self.domain.clone(), TTL, RData::SOA(soa))
    }
}

/// Counters of the DNS server.
#[derive(Debug, Default)]
pub struct DnsStats {
    /// Queries answered (any response code).
    pub answered: AtomicU64,
    /// Datagrams dropped unanswered: from outside the mesh, or no query.
    pub dropped: AtomicU64,
}

/// Serves the zone in `zone` on `sock` until the task is aborted.
pub async fn serve(sock: tokio::net::UdpSocket, zone: Arc<ArcSwap<Zone>>, stats: Arc<DnsStats>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from): (usize, SocketAddr) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                debug!(error = %e, "DNS receive failed");
                continue;
            }
        };
        let zone = zone.load();
        if !zone.admits(from.ip()) {
            stats.dropped.fetch_add(1, Relaxed);
            continue;
        }
        match zone.answer(&buf[..n]) {
            Some(resp) => {
                stats.answered.fetch_add(1, Relaxed);
                if let Err(e) = sock.send_to(&resp, from).await {
                    debug!(%from, error = %e, "DNS send failed");
                }
            }
            None => {
                stats.dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

/// A running DNS server: its zone, counters and tasks (ended on drop).
pub struct Server {
    /// The zone it answers from; replaced as members come, go and rename.
    pub zone: Arc<ArcSwap<Zone>>,
    /// Its counters.
    pub stats: Arc<DnsStats>,
    /// Where it listens (the overlay addresses, port 53).
    pub addrs: Vec<SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Binds every address of `addrs` (all or none) and serves `zone` on each (in
    /// tokio tasks: call within the runtime).
    pub fn start(addrs: &[SocketAddr], zone: Arc<ArcSwap<Zone>>) -> std::io::Result<Self> {
        let mut socks = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let sock =
                std::net::UdpSocket::bind(addr).map_err(|e| std::io::Error::new(e.kind(), format!("{addr}: {e}")))?;
            sock.set_nonblocking(true)?;
            socks.push(sock);
        }
        let stats = Arc::new(DnsStats::default());
        let mut tasks = Vec::with_capacity(socks.len());
        for sock in socks {
            let sock = tokio::net::UdpSocket::from_std(sock)?;
            tasks.push(tokio::spawn(serve(sock, zone.clone(), stats.clone())));
        }
        Ok(Self { zone, stats, addrs: addrs.to_vec(), tasks })
    }

    /// Replaces the zone if it changed; returns whether it did.
    pub fn update(&self, zone: Zone) -> bool {
        if **self.zone.load() == zone {
            return false;
        }
        self.zone.store(Arc::new(zone));
        true
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Registers `domain` (only) at the server's `addrs` for link `dev` with
/// systemd-resolved (split DNS); an absent or failing `resolvectl` is a warning, not
/// an error.
pub fn register(dev: &str, addrs: &[IpAddr], domain: &str) -> bool {
    for args in resolvectl_register(dev, addrs, domain) {
        if !resolvectl(&args) {
            return false;
        }
    }
    true
}

/// Undoes [`register`] (`resolvectl revert`).
pub fn unregister(dev: &str) {
    resolvectl(&["revert".to_owned(), dev.to_owned()]);
}

fn resolvectl(args: &[String]) -> bool {
    match std::process::Command::new("resolvectl").args(args).output() {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            warn!(command = %args.join(" "), error = %err.trim(), "resolvectl failed: Magic DNS not registered");
            false
        }
        Err(e) => {
            warn!(error = %e, "--accept-dns: resolvectl not found (is systemd-resolved installed?)");
            false
        }
    }
}

/// `resolvectl` arguments that send `domain` (only) to the server at `addr` on link
/// `dev`, as systemd-resolved's split DNS.
pub fn resolvectl_register(dev: &str, addrs: &[IpAddr], domain: &str) -> [Vec<String>; 2] {
    let mut dns = vec!["dns".into(), dev.into()];
    dns.extend(addrs.iter().map(ToString::to_string));
    [dns, vec!["domain".into(), dev.into(), format!("~{domain}")]]
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::Query;

    use super::*;

    fn id(b: u8) -> NodeId {
        NodeId::from_bytes([b, 0x11, 0x22, 0x33, 0, 0, 0, 0])
    }

    fn zone() -> Zone {
        Zone::new(
            "office.internal",
            [
                (id(0x30), "Beta", Ipv4Addr::new(10, 0, 0, 3), None),
                (id(0x10), "alpha.example.com", Ipv4Addr::new(10, 0, 0, 1), None),
                (id(0x20), "beta", Ipv4Addr::new(10, 0, 0, 2), Some("fd00::2".parse().unwrap())),
                (id(0x40), "!!!", Ipv4Addr::new(10, 0, 0, 4), None),
            ],
            |_| None,
        )
    }

    fn ask(z: &Zone, name: &str, t: RecordType) -> Message {
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        q.metadata.recursion_desired = true;
        Message::from_vec(&z.answer(&q.to_vec().unwrap()).expect("an answer")).unwrap()
    }

    fn addrs(m: &Message) -> Vec<Ipv4Addr> {
        m.answers
            .iter()
            .filter_map(|r| match r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn duplicate_names_get_a_stable_suffix_by_node_id() {
        let z = zone();
        assert_eq!(z.name_of(Ipv4Addr::new(10, 0, 0, 2)).unwrap(), "beta.office.internal");
        assert_eq!(z.name_of(Ipv4Addr::new(10, 0, 0, 3)).unwrap(), "beta-301122.office.internal");
        assert_eq!(z.name_of(Ipv4Addr::new(10, 0, 0, 1)).unwrap(), "alpha-example-com.office.internal");
        assert_eq!(z.name_of(Ipv4Addr::new(10, 0, 0, 4)).unwrap(), format!("node-{}.office.internal", id(0x40)));
        // The same members in another order make the same zone.
        let mut members = vec![
            (id(0x20), "beta", Ipv4Addr::new(10, 0, 0, 2), Some("fd00::2".parse().unwrap())),
            (id(0x30), "Beta", Ipv4Addr::new(10, 0, 0, 3), None),
            (id(0x10), "alpha.example.com", Ipv4Addr::new(10, 0, 0, 1), None),
            (id(0x40), "!!!", Ipv4Addr::new(10, 0, 0, 4), None),
        ];
        assert_eq!(Zone::new("office.internal", members.clone(), |_| None), z);
        members.reverse();
        assert_eq!(Zone::new("office.internal", members.clone(), |_| None), z);
        // The member that held "beta" first keeps it, whatever its id.
        let bound = Zone::new("office.internal", members, |h| h.eq_ignore_ascii_case("beta").then(|| id(0x30)));
        assert_eq!(bound.name_of(Ipv4Addr::new(10, 0, 0, 3)).unwrap(), "beta.office.internal");
        assert_eq!(bound.name_of(Ipv4Addr::new(10, 0, 0, 2)).unwrap(), "beta-201122.office.internal");
    }

    #[test]
    fn members_resolve_and_the_rest_is_refused_or_unknown() {
        let z = zone();
        let m = ask(&z, "BETA.office.internal.", RecordType::A);
        assert_eq!((m.metadata.response_code, addrs(&m)), (ResponseCode::NoError, vec![Ipv4Addr::new(10, 0, 0, 2)]));
        assert!(m.metadata.authoritative && m.metadata.recursion_desired && !m.metadata.recursion_available);
        assert_eq!(m.answers[0].ttl, TTL);
        let m = ask(&z, "beta-301122.office.internal.", RecordType::A);
        assert_eq!(addrs(&m), vec![Ipv4Addr::new(10, 0, 0, 3)]);
        // AAAA of a member with an IPv6 overlay address: that address.
        let m = ask(&z, "beta.office.internal.", RecordType::AAAA);
        let v6: Vec<Ipv6Addr> = m
            .answers
            .iter()
            .filter_map(|r| match r.data {
                RData::AAAA(a) => Some(a.0),
                _ => None,
            })
            .collect();
        assert_eq!(
            (m.metadata.response_code, v6),
            (ResponseCode::NoError, vec!["fd00::2".parse::<Ipv6Addr>().unwrap()])
        );
        // AAAA of an IPv4-only member: the name exists, no record (NODATA).
        let m = ask(&z, "alpha-example-com.office.internal.", RecordType::AAAA);
        assert_eq!((m.metadata.response_code, m.answers.len(), m.authorities.len()), (ResponseCode::NoError, 0, 1));
        let m = ask(&z, "gamma.office.internal.", RecordType::A);
        assert_eq!((m.metadata.response_code, m.answers.len()), (ResponseCode::NXDomain, 0));
        let m = ask(&z, "x.beta.office.internal.", RecordType::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        // Not ours: refused, never resolved elsewhere.
        for other in ["example.com.", "internal.", "beta.other.internal."] {
            let m = ask(&z, other, RecordType::A);
            assert_eq!((m.metadata.response_code, m.answers.len()), (ResponseCode::Refused, 0), "{other}");
        }
        let m = ask(&z, "office.internal.", RecordType::SOA);
        assert_eq!((m.metadata.response_code, m.answers.len()), (ResponseCode::NoError, 1));
    }

    #[test]
    fn a_suffixed_name_never_takes_a_members_own() {
        // "beta-301122" is a host name here, and also what the second "beta" would get.
        let z = Zone::new(
            "x.internal",
            [
                (id(0x20), "beta", Ipv4Addr::new(10, 0, 0, 2), None),
                (id(0x30), "beta", Ipv4Addr::new(10, 0, 0, 3), None),
                (id(0x90), "beta-301122", Ipv4Addr::new(10, 0, 0, 9), None),
            ],
            |_| None,
        );
        assert_eq!(z.name_of(Ipv4Addr::new(10, 0, 0, 9)).unwrap(), "beta-301122.x.internal");
        assert_eq!(z.name_of(Ipv4Addr::new(10, 0, 0, 3)).unwrap(), format!("beta-{}.x.internal", id(0x30)));
        assert_eq!(z.len(), 3);
    }

    #[test]
    fn only_the_mesh_may_ask() {
        let z = zone().for_clients(vec![
            (Ipv4Addr::new(10, 0, 0, 0).into(), 24),
            (Ipv4Addr::new(192, 168, 7, 0).into(), 24),
            ("fd00::".parse().unwrap(), 64),
        ]);
        assert!(z.admits("10.0.0.9".parse().unwrap()));
        assert!(z.admits("192.168.7.20".parse().unwrap()), "a proxied subnet");
        assert!(z.admits("::ffff:10.0.0.9".parse().unwrap()), "mapped IPv4");
        assert!(!z.admits("192.0.2.4".parse().unwrap()), "a LAN neighbour");
        assert!(!z.admits("2001:db8::1".parse().unwrap()));
        assert!(z.admits("fd00::7".parse().unwrap()), "the IPv6 overlay");
        assert!(!zone().admits("10.0.0.9".parse().unwrap()), "nobody without networks");
    }

    #[test]
    fn systemd_resolved_gets_the_domain_only() {
        let addrs = ["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let cmds = resolvectl_register("weft0", &addrs, "office.internal");
        assert_eq!(cmds[0], ["dns", "weft0", "10.0.0.1", "fd00::1"]);
        // "~": a routing-only domain, so other names keep the host's resolvers.
        assert_eq!(cmds[1], ["domain", "weft0", "~office.internal"]);
    }

    #[test]
    fn what_is_no_query_gets_no_answer() {
        let z = zone();
        assert!(z.answer(&[]).is_none());
        assert!(z.answer(&[0xff; 7]).is_none());
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii("beta.office.internal.").unwrap(), RecordType::A));
        let mut resp = q.clone();
        resp.metadata.message_type = MessageType::Response;
        assert!(z.answer(&resp.to_vec().unwrap()).is_none(), "a response was answered");
        let mut two = q.clone();
        two.add_query(Query::query(Name::from_ascii("alpha.office.internal.").unwrap(), RecordType::A));
        let m = Message::from_vec(&z.answer(&two.to_vec().unwrap()).unwrap()).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        let mut notify = q;
        notify.metadata.op_code = OpCode::Notify;
        let m = Message::from_vec(&z.answer(&notify.to_vec().unwrap()).unwrap()).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    }
}
