//! The route snapshot: an immutable view of "which session, sent where, carries packets
//! to this overlay address", "which session owns this receiver index" and "where to
//! forward a relayed frame", built by the control plane and swapped in atomically;
//! pipelines load it once per batch.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::endpoint::Endpoint;
use crate::session::Session;
use crate::wire::RelayHeader;

/// How to send to one destination.
#[derive(Debug, Clone)]
pub struct Route {
    /// The end-to-end session with the destination.
    pub session: Arc<Session>,
    /// Where the datagram goes: the destination itself, or the first relay.
    pub target: Endpoint,
    /// Present when the path is relayed: the header to put in front.
    pub relay: Option<RelayHeader>,
    /// A relayed path whose every link is a reliable stream (TCP, WebSocket): GSO
    /// records may go through its relays.
    pub relay_streams: bool,
}

/// A member the node knows (it has a route) but holds no session with: the first
/// packets for it go to the control plane, which starts a handshake and sends them once
/// the session is up. Each snapshot hands over at most `budget` packets per member; the
/// rest are dropped and counted ([`crate::stats::DropReason::NoSession`]).
#[derive(Debug)]
pub struct Demand {
    /// The member's node id.
    pub node: [u8; 8],
    budget: AtomicU32,
}

impl Demand {
    /// A member that may hand `budget` packets to the control plane.
    pub fn new(node: [u8; 8], budget: u32) -> Self {
        Self { node, budget: AtomicU32::new(budget) }
    }

    /// Takes one packet of the budget; false when it is spent.
    pub fn take(&self) -> bool {
        self.budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_ok()
    }
}

/// What a snapshot has for a destination.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// A session carries it.
    Route(&'a Route),
    /// It belongs to a member without a session (one is made on demand).
    Demand(&'a Demand),
    /// Nobody.
    None,
}

/// One immutable routing state.
///
/// Sessions still waiting for the peer's proof of the PSK ("held") live in a table of
/// their own, so that a new held session swaps in a small table and shares the rest
/// ([`RouteSnapshot::with_held`]) instead of rebuilding every route.
#[derive(Debug, Default)]
pub struct RouteSnapshot {
    tables: Arc<Tables>,
    held: FxHashMap<u32, Arc<Session>>,
}

#[derive(Debug, Default, Clone)]
struct Tables {
    local: [u8; 8],
    by_dst: FxHashMap<IpAddr, Route>,
    by_index: FxHashMap<u32, Arc<Session>>,
    next_hops: FxHashMap<[u8; 8], Endpoint>,
    neighbours: FxHashSet<Endpoint>,
    /// Proxied subnets of both families, longest prefix first ([`by_prefix`]).
    subnets: Vec<(Net, Route)>,
    /// Members without a session, by overlay address.
    demand: FxHashMap<IpAddr, Arc<Demand>>,
    /// Subnets proxied by members without a session, longest prefix first.
    demand_subnets: Vec<(Net, Arc<Demand>)>,
    /// What this node takes packets for from the tunnel.
    serves: Served,
    /// Sessions this node declared dead, by local index: they carry no data, but
    /// their keys still tell a member that keeps sending on one (it then gets a new
    /// session) from anyone else.
    dropped: FxHashMap<u32, Arc<Session>>,
}

/// The destinations a node accepts from the tunnel: its own overlay addresses, the
/// subnets it proxies (the WireGuard portal's network among them) and, on an exit,
/// anything outside every network it must keep members out of. Everything else (a
/// subnet router's other LANs, docker or libvirt bridges, another member's address) is
/// dropped as [`crate::stats::DropReason::ForbiddenDestination`], whatever the
/// host's forwarding and weak-host settings would do with it.
#[derive(Debug, Clone, Default)]
pub enum Serves {
    /// Every destination: only for snapshots built outside the engine
    /// ([`RouteSnapshot::new`], tests and benches of the data path alone).
    Any,
    /// Nothing: a snapshot not yet told what its node serves.
    #[default]
    Nothing,
    /// These destinations.
    Only {
        /// Our overlay addresses.
        own: Vec<IpAddr>,
        /// Subnets we proxy (never a /0).
        subnets: Vec<(IpAddr, u8)>,
        /// On an exit: the networks no destination may lie in (the overlay networks
        /// and [`exit_refused`]); `None` when this node is no exit.
        exit_except: Option<Vec<(IpAddr, u8)>>,
    },
}

const fn v4(a: u8, b: u8, c: u8, d: u8, p: u8) -> (IpAddr, u8) {
    (IpAddr::V4(Ipv4Addr::new(a, b, c, d)), p)
}

const fn v6(segments: [u16; 8], p: u8) -> (IpAddr, u8) {
    let [a, b, c, d, e, f, g, h] = segments;
    (IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)), p)
}

/// Destinations an exit never forwards to: "this" network, loopback, multicast and
/// reserved (broadcast among them), and IPv4-mapped IPv6.
pub const NEVER_FORWARDED: [(IpAddr, u8); 8] = [
    v4(0, 0, 0, 0, 8),
    v4(127, 0, 0, 0, 8),
    v4(224, 0, 0, 0, 4),
    v4(240, 0, 0, 0, 4),
    v6([0; 8], 128),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
];

/// Private (RFC 1918, unique local), CGNAT and link-local networks (cloud metadata at
/// 169.254.169.254): an exit's neighbourhood, refused unless `--exit-allow-lan`.
pub const PRIVATE: [(IpAddr, u8); 7] = [
    v4(10, 0, 0, 0, 8),
    v4(100, 64, 0, 0, 10),
    v4(169, 254, 0, 0, 16),
    v4(172, 16, 0, 0, 12),
    v4(192, 168, 0, 0, 16),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
];

/// The destinations an exit refuses to members: [`NEVER_FORWARDED`], and unless
/// `allow_lan` (`--exit-allow-lan`) [`PRIVATE`] and the host's own networks
/// (`local`). The data path ([`Serves`]) and the exit's nftables rules both use it.
pub fn exit_refused(allow_lan: bool, local: &[(IpAddr, u8)]) -> Vec<(IpAddr, u8)> {
    let mut v = NEVER_FORWARDED.to_vec();
    if !allow_lan {
        v.extend(PRIVATE);
        v.extend_from_slice(local);
    }
    v
}

impl Serves {
    fn compile(self) -> Served {
        match self {
            Self::Any => Served { any: true, ..Served::default() },
            Self::Nothing => Served::default(),
            Self::Only { own, subnets, exit_except } => Served {
                any: false,
                own,
                subnets: by_prefix(subnets.into_iter().map(|(a, p)| (a, p, ()))),
                exit: exit_except.is_some(),
                except: by_prefix(exit_except.unwrap_or_default().into_iter().map(|(a, p)| (a, p, ()))),
            },
        }
    }
}

/// [`Serves`] in the form the RX pipeline reads per packet.
#[derive(Debug, Clone, Default)]
struct Served {
    any: bool,
    own: Vec<IpAddr>,
    subnets: Vec<(Net, ())>,
    exit: bool,
    except: Vec<(Net, ())>,
}

impl Served {
    fn accepts(&self, dst: IpAddr) -> bool {
        self.any
            || self.own.contains(&dst)
            || longest(&self.subnets, dst).is_some()
            || (self.exit && longest(&self.except, dst).is_none())
    }
}

impl RouteSnapshot {
    /// Builds a snapshot for a node without relaying (every route direct to the
    /// session's endpoint).
    pub fn new(
        routes: impl IntoIterator<Item = (IpAddr, Arc<Session>)>,
        receiving: impl IntoIterator<Item = Arc<Session>>,
    ) -> Self {
        let by_dst = routes
            .into_iter()
            .map(|(a, s)| {
                let target = s.endpoint;
                (a, Route { session: s, target, relay: None, relay_streams: false })
            })
            .collect();
        let tables = Tables {
            by_dst,
            by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(),
            serves: Serves::Any.compile(),
            ..Tables::default()
        };
        Self { tables: Arc::new(tables), held: FxHashMap::default() }
    }

    /// Builds a full snapshot.
    pub fn with_relays(
        local: [u8; 8],
        routes: impl IntoIterator<Item = (IpAddr, Route)>,
        receiving: impl IntoIterator<Item = Arc<Session>>,
        next_hops: impl IntoIterator<Item = ([u8; 8], Endpoint)>,
        neighbours: impl IntoIterator<Item = Endpoint>,
    ) -> Self {
        let tables = Tables {
            local,
            by_dst: routes.into_iter().collect(),
            by_index: receiving.into_iter().map(|s| (s.local_index, s)).collect(),
            next_hops: next_hops.into_iter().collect(),
            neighbours: neighbours.into_iter().collect(),
            ..Tables::default()
        };
        Self { tables: Arc::new(tables), held: FxHashMap::default() }
    }

    /// This snapshot with another set of held sessions (receive only, until their peer
    /// proves the PSK); everything else is shared, not copied.
    pub fn with_held(&self, held: impl IntoIterator<Item = Arc<Session>>) -> Self {
        Self { tables: self.tables.clone(), held: held.into_iter().map(|s| (s.local_index, s)).collect() }
    }

    /// Sets the sessions this node declared dead ([`RouteSnapshot::dropped_by_index`]).
    pub fn with_dropped(mut self, dropped: impl IntoIterator<Item = Arc<Session>>) -> Self {
        Arc::make_mut(&mut self.tables).dropped = dropped.into_iter().map(|s| (s.local_index, s)).collect();
        self
    }

    /// Sets what this node takes from the tunnel ([`Serves`]; a snapshot from
    /// [`RouteSnapshot::with_relays`] serves nothing until this is called).
    pub fn with_serves(mut self, serves: Serves) -> Self {
        Arc::make_mut(&mut self.tables).serves = serves.compile();
        self
    }

    /// Whether a packet for `dst` that came out of the tunnel is ours to deliver
    /// ([`Serves`]).
    pub fn delivers_to(&self, dst: IpAddr) -> bool {
        self.tables.serves.accepts(dst)
    }

    /// Adds routes for subnets proxied by members (`--proxy-network`).
    pub fn with_subnets(mut self, subnets: impl IntoIterator<Item = (IpAddr, u8, Route)>) -> Self {
        Arc::make_mut(&mut self.tables).subnets = by_prefix(subnets);
        self
    }

    /// Adds the members without a session (by overlay address) and the subnets they
    /// proxy: packets for them go to the control plane ([`RouteSnapshot::demand_for`]).
    pub fn with_demand(
        mut self,
        members: impl IntoIterator<Item = (IpAddr, Arc<Demand>)>,
        subnets: impl IntoIterator<Item = (IpAddr, u8, Arc<Demand>)>,
    ) -> Self {
        let t = Arc::make_mut(&mut self.tables);
        t.demand = members.into_iter().collect();
        t.demand_subnets = by_prefix(subnets);
        self
    }

    /// Where a packet for `dst` goes: its owner's overlay address, else the longest
    /// subnet that holds it, proxied by a member with a session ([`Lookup::Route`]) or
    /// without one ([`Lookup::Demand`]). One hash lookup and one pass over each subnet
    /// table (the TX pipeline's per-packet lookup).
    pub fn lookup(&self, dst: IpAddr) -> Lookup<'_> {
        let t = &*self.tables;
        if let Some(r) = t.by_dst.get(&dst) {
            return Lookup::Route(r);
        }
        if let Some(d) = t.demand.get(&dst) {
            return Lookup::Demand(d);
        }
        match (longest(&t.subnets, dst), longest(&t.demand_subnets, dst)) {
            (Some((p, r)), Some((q, _))) if p >= q => Lookup::Route(r),
            (_, Some((_, d))) => Lookup::Demand(d),
            (Some((_, r)), None) => Lookup::Route(r),
            (None, None) => Lookup::None,
        }
    }

    /// How to reach `dst` over a session, if it can be ([`RouteSnapshot::lookup`]).
    pub fn route_for(&self, dst: IpAddr) -> Option<&Route> {
        match self.lookup(dst) {
            Lookup::Route(r) => Some(r),
            _ => None,
        }
    }

    /// The member without a session that `dst` belongs to (its overlay address, or
    /// the longest subnet it proxies), when no route has it.
    pub fn demand_for(&self, dst: IpAddr) -> Option<&Demand> {
        match self.lookup(dst) {
            Lookup::Demand(d) => Some(d),
            _ => None,
        }
    }

    fn subnet_route(&self, dst: IpAddr) -> Option<&Route> {
        longest(&self.tables.subnets, dst).map(|(_, r)| r)
    }

    /// Whether a packet from inner source `src` may come through `session`: the source
    /// is the peer's overlay address or inside a subnet the peer proxies. A member's
    /// overlay address is accepted only from that member (its sessions share one
    /// stats block), before any subnet rule: no subnet and no second claim of the
    /// address lets another member send as it.
    pub fn may_send_from(&self, session: &Session, src: IpAddr) -> bool {
        if let Some(owner) = self.tables.by_dst.get(&src) {
            return Arc::ptr_eq(&owner.session.stats, &session.stats);
        }
        if self.tables.demand.contains_key(&src) {
            // A member without a session with us: its address is its own all the same.
            return session.owns(src);
        }
        session.owns(src) || self.subnet_route(src).is_some_and(|r| Arc::ptr_eq(&r.session.stats, &session.stats))
    }

    /// The session that carries packets to `dst`.
    pub fn session_for(&self, dst: IpAddr) -> Option<&Arc<Session>> {
        self.tables.by_dst.get(&dst).map(|r| &r.session)
    }

    /// The session with local index `index` that this node declared dead, if any
    /// ([`RouteSnapshot::with_dropped`]).
    pub fn dropped_by_index(&self, index: u32) -> Option<&Arc<Session>> {
        self.tables.dropped.get(&index)
    }

    /// The session whose local index is `index` (an established or a held one).
    pub fn session_by_index(&self, index: u32) -> Option<&Arc<Session>> {
        self.tables.by_index.get(&index).or_else(|| self.held.get(&index))
    }

    /// Where to forward a relayed frame for node `dst`.
    pub fn next_hop(&self, dst: &[u8; 8]) -> Option<Endpoint> {
        self.tables.next_hops.get(dst).copied()
    }

    /// Whether `addr` is a direct neighbour (relayed frames are accepted only from these).
    pub fn is_neighbour(&self, addr: &Endpoint) -> bool {
        self.tables.neighbours.contains(addr)
    }

    /// This node's id.
    pub fn local(&self) -> &[u8; 8] {
        &self.tables.local
    }

    /// Number of routed destinations.
    pub fn route_count(&self) -> usize {
        self.tables.by_dst.len()
    }
}

/// A subnet of either family in one form: whether it is IPv6, and its masked network
/// and prefix in the IPv6 space ([`as_v6_bits`]). The family keeps an IPv4 prefix
/// from holding an IPv4-mapped IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    v6: bool,
    bits: u128,
    prefix: u8,
}

impl Net {
    fn holds(&self, dst: IpAddr) -> bool {
        let (d, _) = as_v6_bits(dst, 0);
        self.v6 == dst.is_ipv6() && d & prefix_mask6(self.prefix) == self.bits
    }
}

/// Subnets as ([`Net`], value), longest prefix first.
fn by_prefix<T>(subnets: impl IntoIterator<Item = (IpAddr, u8, T)>) -> Vec<(Net, T)> {
    let mut v: Vec<(Net, T)> = subnets
        .into_iter()
        .map(|(a, p, r)| {
            let (bits, prefix) = as_v6_bits(a, p);
            (Net { v6: a.is_ipv6(), bits: bits & prefix_mask6(prefix), prefix }, r)
        })
        .collect();
    v.sort_by_key(|(n, _)| std::cmp::Reverse(n.prefix));
    v
}

/// The longest entry of `table` (sorted by [`by_prefix`]) holding `dst`, with its
/// prefix length in the IPv6 space.
fn longest<T>(table: &[(Net, T)], dst: IpAddr) -> Option<(u8, &T)> {
    table.iter().find(|(n, _)| n.holds(dst)).map(|(n, r)| (n.prefix, r))
}

/// An address and prefix of either family as one IPv6 number and prefix: IPv4 as the
/// mapped address `::ffff:a.b.c.d` with the prefix moved by 96, so one table and one
/// comparison serve both families and an IPv4 prefix never holds an IPv6 address.
pub fn as_v6_bits(addr: IpAddr, prefix: u8) -> (u128, u8) {
    match addr {
        IpAddr::V4(a) => (u128::from(a.to_ipv6_mapped()), prefix.min(32) + 96),
        IpAddr::V6(a) => (u128::from(a), prefix.min(128)),
    }
}

/// The netmask of an IPv6 prefix length.
pub fn prefix_mask6(prefix: u8) -> u128 {
    if prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(prefix.min(128))) }
}

/// The network address of `addr/prefix` (host bits cleared), either family.
pub fn network_ip(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => IpAddr::V4(network(a, prefix)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & prefix_mask6(prefix))),
    }
}

/// Whether the prefixes `a/p` and `b/q` share an address, either family; prefixes of
/// different families never do.
pub fn overlaps_ip(a: IpAddr, p: u8, b: IpAddr, q: u8) -> bool {
    if a.is_ipv4() != b.is_ipv4() {
        return false;
    }
    let ((x, p), (y, q)) = (as_v6_bits(a, p), as_v6_bits(b, q));
    let m = prefix_mask6(p.min(q));
    x & m == y & m
}

/// The netmask of a prefix length, as a host-order integer (`/24` → `0xffffff00`).
pub fn prefix_mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) }
}

/// The network address of `addr/prefix` (host bits cleared).
pub fn network(addr: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(addr) & prefix_mask(prefix))
}

/// Whether the prefixes `a/p` and `b/q` share an address (one holds the other). With
/// `q == 32` this is whether `b` lies in `a/p`.
pub fn overlaps(a: Ipv4Addr, p: u8, b: Ipv4Addr, q: u8) -> bool {
    let m = prefix_mask(p.min(q));
    u32::from(a) & m == u32::from(b) & m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_overlap_when_one_holds_the_other() {
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(network(a("10.126.126.9"), 24), a("10.126.126.0"));
        assert!(overlaps(a("10.0.0.0"), 8, a("10.127.0.0"), 24));
        assert!(overlaps(a("10.127.0.0"), 24, a("10.0.0.0"), 8), "symmetric");
        assert!(!overlaps(a("10.126.126.0"), 24, a("10.127.0.0"), 24));
        assert!(overlaps(a("172.16.5.0"), 24, a("172.16.5.1"), 32), "an address in a subnet");
        assert!(overlaps(a("1.2.3.4"), 0, a("9.9.9.9"), 32), "/0 holds everything");
    }
    use crate::crypto::Cipher;
    use crate::handshake::SessionKeys;
    use crate::session::SessionParams;

    fn session(index: u32, peer_addr: [u8; 4], stats: &Arc<crate::stats::PeerStats>) -> Arc<Session> {
        Arc::new(Session::new(SessionParams {
            local_index: index,
            remote_index: index,
            cipher: Cipher::Aes128Gcm,
            keys: SessionKeys { send: [index as u8; 32], recv: [index as u8; 32] },
            endpoint: Endpoint::udp(std::net::SocketAddr::from(([192, 0, 2, index as u8], 11010))),
            peer_addr: peer_addr.into(),
            peer_addr6: None,
            confirmed: true,
            stats: stats.clone(),
        }))
    }

    fn ip4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn an_overlay_address_is_accepted_only_from_its_owner_before_subnets() {
        let (owner_stats, other_stats) = (Arc::default(), Arc::default());
        let owner = session(1, [10, 0, 0, 1], &owner_stats);
        let owner_rekeyed = session(3, [10, 0, 0, 1], &owner_stats);
        // A second member claiming the owner's address, and one proxying a subnet
        // that holds it.
        let claimer = session(2, [10, 0, 0, 1], &other_stats);
        let proxy_stats = Arc::default();
        let proxy = session(4, [10, 0, 0, 4], &proxy_stats);
        let route =
            |s: &Arc<Session>| Route { session: s.clone(), target: s.endpoint, relay: None, relay_streams: false };
        let snap = RouteSnapshot::with_relays(
            [0; 8],
            [(ip4(10, 0, 0, 1), route(&owner)), (ip4(10, 0, 0, 4), route(&proxy))],
            [owner.clone(), owner_rekeyed.clone(), claimer.clone(), proxy.clone()],
            [],
            [],
        )
        .with_subnets([(ip4(10, 0, 0, 0), 24, route(&proxy)), (ip4(172, 16, 0, 0), 16, route(&proxy))]);
        let a = ip4(10, 0, 0, 1);
        assert!(snap.may_send_from(&owner, a));
        assert!(snap.may_send_from(&owner_rekeyed, a), "every session of the owner");
        assert!(!snap.may_send_from(&claimer, a), "a second claim of the address");
        assert!(!snap.may_send_from(&proxy, a), "a subnet that holds another member's address");
        assert!(snap.may_send_from(&proxy, ip4(10, 0, 0, 9)), "the rest of the subnet");
        assert!(snap.may_send_from(&proxy, ip4(172, 16, 3, 4)));
        assert!(!snap.may_send_from(&owner, ip4(172, 16, 3, 4)));
        // An address nobody routes yet (a session still held): its own hello address.
        let held = session(5, [10, 0, 1, 7], &Arc::default());
        assert!(snap.may_send_from(&held, ip4(10, 0, 1, 7)));
        assert!(!snap.may_send_from(&held, ip4(10, 0, 1, 8)));
    }

    #[test]
    fn both_families_route_and_check_sources() {
        let (stats, proxy_stats) = (Arc::default(), Arc::default());
        let params = |index: u32, v4: [u8; 4], v6: &str, stats: &Arc<crate::stats::PeerStats>| {
            let s = session(index, v4, stats);
            let mut s = Arc::into_inner(s).expect("one reference");
            s.peer_addr6 = Some(v6.parse().unwrap());
            Arc::new(s)
        };
        let owner = params(1, [10, 0, 0, 1], "fd00::1", &stats);
        let proxy = params(2, [10, 0, 0, 2], "fd00::2", &proxy_stats);
        let route =
            |s: &Arc<Session>| Route { session: s.clone(), target: s.endpoint, relay: None, relay_streams: false };
        let v6 = |s: &str| IpAddr::V6(s.parse().unwrap());
        let snap = RouteSnapshot::with_relays(
            [0; 8],
            [(ip4(10, 0, 0, 1), route(&owner)), (v6("fd00::1"), route(&owner)), (v6("fd00::2"), route(&proxy))],
            [owner.clone(), proxy.clone()],
            [],
            [],
        )
        .with_subnets([
            (v6("fd77:1::"), 64, route(&proxy)),
            (v6("::"), 0, route(&owner)),
            (ip4(0, 0, 0, 0), 0, route(&owner)),
        ]);
        let via = |dst: IpAddr| snap.route_for(dst).map(|r| r.session.local_index);
        assert_eq!(via(v6("fd00::1")), Some(1));
        assert_eq!(via(v6("fd00::2")), Some(2));
        assert_eq!(via(v6("fd77:1::9")), Some(2), "a proxied IPv6 subnet");
        assert_eq!(via(v6("2001:db8::1")), Some(1), "::/0 through the exit");
        assert_eq!(via(ip4(198, 51, 100, 1)), Some(1), "0.0.0.0/0 through the exit");
        // An IPv4 prefix never holds an IPv6 address, nor the other way round.
        let only4 =
            RouteSnapshot::with_relays([0; 8], [], [], [], []).with_subnets([(ip4(0, 0, 0, 0), 0, route(&owner))]);
        assert!(only4.route_for(v6("::ffff:10.0.0.9")).is_none(), "a mapped address is IPv6 on the wire");
        assert!(only4.route_for(v6("2001:db8::1")).is_none());
        assert!(snap.may_send_from(&owner, v6("fd00::1")));
        assert!(!snap.may_send_from(&proxy, v6("fd00::1")), "another member's IPv6 address");
        assert!(snap.may_send_from(&proxy, v6("fd77:1::42")));
        assert!(!snap.may_send_from(&owner, v6("fd77:1::42")), "a subnet the sender does not proxy");
        assert!(!snap.may_send_from(&proxy, v6("fd00::99")), "an address nobody owns");
    }

    #[test]
    fn a_node_delivers_only_what_it_serves() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let member = RouteSnapshot::with_relays([0; 8], [], [], [], []).with_serves(Serves::Only {
            own: vec![ip("10.126.126.2"), ip("fd00::2")],
            subnets: vec![(ip("192.168.7.0"), 24)],
            exit_except: None,
        });
        assert!(member.delivers_to(ip("10.126.126.2")));
        assert!(member.delivers_to(ip("fd00::2")));
        assert!(member.delivers_to(ip("192.168.7.9")), "a subnet it proxies");
        assert!(!member.delivers_to(ip("192.168.8.9")), "the router's other LAN");
        assert!(!member.delivers_to(ip("172.17.0.2")), "a docker bridge");
        assert!(!member.delivers_to(ip("10.126.126.3")), "another member's address");
        assert!(!member.delivers_to(ip("203.0.113.10")), "the internet, on a node that is no exit");
        assert!(!RouteSnapshot::with_relays([0; 8], [], [], [], []).delivers_to(ip("10.126.126.2")), "told nothing");

        let exit = |lan: bool| {
            let mut except = vec![(ip("10.126.126.0"), 24)];
            except.extend(exit_refused(lan, &[(ip("198.51.100.0"), 24)]));
            RouteSnapshot::with_relays([0; 8], [], [], [], []).with_serves(Serves::Only {
                own: vec![ip("10.126.126.1")],
                subnets: vec![],
                exit_except: Some(except),
            })
        };
        let x = exit(false);
        assert!(x.delivers_to(ip("203.0.113.10")), "the internet");
        assert!(x.delivers_to(ip("2001:db8:ff::10")));
        assert!(!x.delivers_to(ip("198.51.100.7")), "the exit's own network");
        assert!(!x.delivers_to(ip("10.126.126.3")), "another member, through the exit");
        assert!(!x.delivers_to(ip("169.254.169.254")), "cloud metadata");
        assert!(!x.delivers_to(ip("fe80::1")));
        assert!(!x.delivers_to(ip("224.0.0.251")) && !x.delivers_to(ip("255.255.255.255")));
        assert!(!x.delivers_to(ip("127.0.0.1")) && !x.delivers_to(ip("::ffff:127.0.0.1")));
        assert!(!x.delivers_to(ip("192.168.1.1")) && !x.delivers_to(ip("100.64.0.1")), "private, CGNAT");
        let lan = exit(true);
        assert!(lan.delivers_to(ip("169.254.169.254")) && lan.delivers_to(ip("198.51.100.7")), "--exit-allow-lan");
        assert!(!lan.delivers_to(ip("224.0.0.251")) && !lan.delivers_to(ip("10.126.126.3")));
    }
}
