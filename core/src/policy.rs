//! Access policy between members: who may reach what.
//!
//! A [`Policy`] is parsed from TOML (`weft policy check FILE`, config `policy =
//! FILE`): named groups, `[[allow]]` rules from sources to destinations by protocol
//! and ports, and `[[test]]`s that must hold. Default deny once a policy exists.
//! Selectors name members by host name or by key (`id:HEX`: the node key's 64 hex
//! digits as `weft id` prints them, a prefix of at least 16 of them, or the 16-digit
//! node id `weft peers` shows; a bare 64-digit key or 16-digit id works too, and a
//! host name of that shape is never matched by name), CIDRs (proxied subnets
//! and portal clients included), `group:NAME` (the file's groups, then the groups of
//! members' certificates), `*` (anyone), and on the destination side `internet`
//! (anything outside the overlay, reached through an exit).
//!
//! Names are claims a member makes of itself, so a name selector matches only the
//! member the name is bound to ([`Member::name`]: the caller fills it from a
//! certificate or the node's first-holder bindings, and leaves it empty for a member
//! that merely claims a name another holds). A member as a destination is its own
//! addresses and the subnets it proxies, never an exit's default route: only
//! `internet` reaches through an exit.
//!
//! [`Policy::compile`] resolves the selectors against what the node knows of the
//! members ([`Member`]) into a [`Compiled`] matcher: each rule's source and
//! destination become address ranges, and the address space is cut into intervals
//! that each carry the set of rules covering them (a bitset), so a packet costs two
//! binary searches and a bitset AND, not a scan of the rules. Pure: the data path's
//! connection table and the distribution of policies are elsewhere.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Deserialize;

/// IP protocol numbers the policy names.
pub mod proto {
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;

    /// The protocol's name as the policy writes it (`tcp`, `udp`, `icmp`, `icmpv6`),
    /// or its number.
    pub fn name(p: u8) -> std::borrow::Cow<'static, str> {
        match p {
            ICMP => "icmp".into(),
            TCP => "tcp".into(),
            UDP => "udp".into(),
            ICMPV6 => "icmpv6".into(),
            n => n.to_string().into(),
        }
    }
}

/// Most rules a policy holds.
pub const MAX_RULES: usize = 4096;

/// Why a policy file is refused, naming the place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not TOML, or not this shape.
    #[error("{0}")]
    Syntax(String),
    /// A selector that is none of the forms.
    #[error("{0}: {1:?} is not a host name, id:HEX (16 to 64 hex digits), CIDR, group:NAME, * or internet")]
    Selector(String, String),
    /// A group that is not defined and not a certificate group anybody could have.
    #[error("{0}: group {1:?} refers to itself")]
    Cycle(String, String),
    /// A bad protocol.
    #[error("{0}: proto {1:?} is not tcp, udp, icmp or any")]
    Proto(String, String),
    /// A bad port or range.
    #[error("{0}: port {1:?} is not a number or range 1-65535")]
    Port(String, String),
    /// Too many rules.
    #[error("more than {MAX_RULES} rules")]
    TooMany,
    /// A test that does not hold.
    #[error("test {0} fails: {1}")]
    TestFailed(usize, String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    groups: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    hosts: BTreeMap<String, String>,
    #[serde(default)]
    allow: Vec<RuleFile>,
    #[serde(default)]
    test: Vec<TestFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    from: Vec<String>,
    to: Vec<String>,
    #[serde(default)]
    proto: Option<String>,
    #[serde(default)]
    ports: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    from: String,
    to: String,
    #[serde(default)]
    proto: Option<String>,
    allow: bool,
}

/// What a selector names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Anyone (`*`).
    Any,
    /// Anything outside the overlay, through an exit (`internet`; destinations only).
    Internet,
    /// Addresses in a prefix.
    Cidr(IpAddr, u8),
    /// A group (`group:NAME`).
    Group(String),
    /// A member, by the host name bound to it.
    Member(String),
    /// A member, by key: 16 to 64 lower-case hex digits (`id:HEX`, or a bare 16 or 64).
    Id(String),
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Internet => f.write_str("internet"),
            Self::Cidr(a, p) => write!(f, "{a}/{p}"),
            Self::Group(g) => write!(f, "group:{g}"),
            Self::Member(m) => f.write_str(m),
            Self::Id(h) => write!(f, "id:{h}"),
        }
    }
}

fn parse_selector(s: &str, place: &str) -> Result<Selector, PolicyError> {
    let bad = || PolicyError::Selector(place.to_owned(), s.to_owned());
    let s = s.trim();
    if s == "*" {
        return Ok(Selector::Any);
    }
    if s == "internet" {
        return Ok(Selector::Internet);
    }
    if let Some(g) = s.strip_prefix("group:") {
        return if valid_name(g) { Ok(Selector::Group(g.to_owned())) } else { Err(bad()) };
    }
    if let Some(h) = s.strip_prefix("id:") {
        let hex = (16..=64).contains(&h.len()) && h.chars().all(|c| c.is_ascii_hexdigit());
        return if hex { Ok(Selector::Id(h.to_ascii_lowercase())) } else { Err(bad()) };
    }
    if let Some((a, p)) = parse_cidr(s) {
        return Ok(Selector::Cidr(a, p));
    }
    // A whole node key as `weft id` prints it, or a node id as `weft peers` shows
    // it: never a host name (a member naming itself so matches nothing).
    if (s.len() == 64 || s.len() == 16) && s.chars().all(|c| c.is_ascii_hexdigit()) {
        return Ok(Selector::Id(s.to_ascii_lowercase()));
    }
    if valid_name(s) { Ok(Selector::Member(s.to_owned())) } else { Err(bad()) }
}

/// The members selector `id:h` names: the one whose key is `h` or starts with it, or
/// whose 16-digit node id is `h`. A prefix two members share names nobody.
fn by_id<'m>(members: &'m [Member], h: &str) -> Option<&'m Member> {
    let mut found = members.iter().filter(|m| {
        m.key.len() == 64 && m.key.get(..h.len()).is_some_and(|k| k.eq_ignore_ascii_case(h))
            || (h.len() == 16 && m.node_id.eq_ignore_ascii_case(h))
    });
    let first = found.next()?;
    found.all(|m| m.key == first.key).then_some(first)
}

/// The member bound to host name `name` (names are case-insensitive; an empty name
/// is no binding).
fn by_name<'m>(members: &'m [Member], name: &str) -> Option<&'m Member> {
    members.iter().find(|m| !m.name.is_empty() && m.name.eq_ignore_ascii_case(name))
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 255 && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `ADDR/PREFIX` or a bare address (a /32 or /128), masked to its network.
fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (a, p) = match s.split_once('/') {
        Some((a, p)) => (a.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
        None => {
            let a = s.parse::<IpAddr>().ok()?;
            (a, if a.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if a.is_ipv4() { 32 } else { 128 };
    (p <= max).then(|| (mask(a, p), p))
}

fn mask(a: IpAddr, p: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => {
            let m = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            IpAddr::V4(Ipv4Addr::from(u32::from(v) & m))
        }
        IpAddr::V6(v) => {
            let m = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            IpAddr::V6(Ipv6Addr::from(u128::from(v) & m))
        }
    }
}

/// Protocols a rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// Every protocol.
    Any,
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// ICMP and ICMPv6.
    Icmp,
}

impl Proto {
    fn parse(s: Option<&str>, place: &str) -> Result<Self, PolicyError> {
        match s.map(str::trim) {
            None | Some("any" | "*") => Ok(Self::Any),
            Some("tcp") => Ok(Self::Tcp),
            Some("udp") => Ok(Self::Udp),
            Some("icmp") => Ok(Self::Icmp),
            Some(o) => Err(PolicyError::Proto(place.to_owned(), o.to_owned())),
        }
    }

    /// Whether IP protocol number `p` is one of these.
    pub fn covers(self, p: u8) -> bool {
        match self {
            Self::Any => true,
            Self::Tcp => p == proto::TCP,
            Self::Udp => p == proto::UDP,
            Self::Icmp => p == proto::ICMP || p == proto::ICMPV6,
        }
    }

    fn has_ports(self) -> bool {
        matches!(self, Self::Tcp | Self::Udp)
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Any => "any",
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Icmp => "icmp",
        })
    }
}

/// One `[[allow]]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Sources.
    pub from: Vec<Selector>,
    /// Destinations.
    pub to: Vec<Selector>,
    /// Protocols.
    pub proto: Proto,
    /// Destination port ranges (empty: every port).
    pub ports: Vec<(u16, u16)>,
}

impl Rule {
    /// Whether destination port `port` of IP protocol `proto` is among its ports.
    pub fn port_ok(&self, port: u16, proto: u8) -> bool {
        self.ports.is_empty() || port_in(&self.ports, port, proto)
    }
}

/// One `[[test]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Test {
    /// The source: a member name, node id or address.
    pub from: String,
    /// The destination member (or address) and port, `NAME:PORT` (port optional for icmp).
    pub to: String,
    /// The destination port.
    pub port: u16,
    /// The protocol (tcp unless said).
    pub proto: u8,
    /// Whether it must be allowed.
    pub allow: bool,
}

/// A parsed policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Named groups: their members' selectors.
    pub groups: BTreeMap<String, Vec<Selector>>,
    /// Names given addresses by the file (`[hosts]`), for tests without a mesh.
    pub hosts: BTreeMap<String, IpAddr>,
    /// The rules, in file order (their index names them in counters).
    pub rules: Vec<Rule>,
    /// The tests.
    pub tests: Vec<Test>,
}

/// What a node knows of one member when it compiles a policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    /// Its node id (16 hex digits, as `weft peers` shows it).
    pub node_id: String,
    /// Its node key (64 hex digits, as `weft id` prints it).
    pub key: String,
    /// The host name bound to it: its certificate's, or without an authority the
    /// name it claimed first among members this node saw. Empty when it claims a
    /// name another member holds: name selectors then never match it.
    pub name: String,
    /// Its overlay addresses.
    pub addrs: Vec<IpAddr>,
    /// The groups of its certificate.
    pub groups: Vec<String>,
    /// Subnets it proxies and this node accepts from it (`group:` and member selectors
    /// include them as destinations; a default route never counts).
    pub subnets: Vec<(IpAddr, u8)>,
}

impl Policy {
    /// Parses a policy file's text.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let f: File = toml::from_str(text).map_err(|e| PolicyError::Syntax(e.to_string()))?;
        if f.allow.len() > MAX_RULES {
            return Err(PolicyError::TooMany);
        }
        let mut groups = BTreeMap::new();
        for (name, members) in &f.groups {
            if !valid_name(name) {
                return Err(PolicyError::Selector("[groups]".into(), name.clone()));
            }
            let place = format!("group {name}");
            let sel = members.iter().map(|m| parse_selector(m, &place)).collect::<Result<Vec<_>, _>>()?;
            groups.insert(name.clone(), sel);
        }
        let mut hosts = BTreeMap::new();
        for (name, addr) in &f.hosts {
            let a =
                addr.parse::<IpAddr>().map_err(|_| PolicyError::Selector(format!("[hosts] {name}"), addr.clone()))?;
            hosts.insert(name.clone(), a);
        }
        let mut rules = Vec::with_capacity(f.allow.len());
        for (i, r) in f.allow.iter().enumerate() {
            let place = format!("allow rule {}", i + 1);
            let from = r.from.iter().map(|s| parse_selector(s, &place)).collect::<Result<Vec<_>, _>>()?;
            let to = r.to.iter().map(|s| parse_selector(s, &place)).collect::<Result<Vec<_>, _>>()?;
            if from.contains(&Selector::Internet) {
                return Err(PolicyError::Selector(place, "internet (a destination only)".into()));
            }
            let proto = Proto::parse(r.proto.as_deref(), &place)?;
            let ports = r.ports.iter().map(|p| parse_ports(p, &place)).collect::<Result<Vec<_>, _>>()?;
            if !ports.is_empty() && !proto.has_ports() {
                return Err(PolicyError::Port(place, format!("{} (ports need proto tcp or udp)", r.ports.join(","))));
            }
            rules.push(Rule { from, to, proto, ports });
        }
        let mut tests = Vec::with_capacity(f.test.len());
        for (i, t) in f.test.iter().enumerate() {
            let place = format!("test {}", i + 1);
            let p = match Proto::parse(t.proto.as_deref().or(Some("tcp")), &place)? {
                Proto::Udp => proto::UDP,
                Proto::Icmp => proto::ICMP,
                Proto::Tcp | Proto::Any => proto::TCP,
            };
            let (to, port) = split_port(&t.to);
            let port = match port {
                Some(p) => p.parse::<u16>().map_err(|_| PolicyError::Port(place.clone(), p.to_owned()))?,
                None if p == proto::ICMP => 0,
                None => return Err(PolicyError::Port(place, format!("{} (say NAME:PORT)", t.to))),
            };
            tests.push(Test { from: t.from.clone(), to: to.to_owned(), port, proto: p, allow: t.allow });
        }
        let policy = Self { groups, hosts, rules, tests };
        for g in policy.groups.keys() {
            policy.expand_group(g, &mut Vec::new())?;
        }
        Ok(policy)
    }

    /// The selectors a group stands for, nested groups expanded (a group the file does
    /// not define stays, for members whose certificates carry it).
    fn expand_group(&self, g: &str, stack: &mut Vec<String>) -> Result<Vec<Selector>, PolicyError> {
        if stack.iter().any(|s| s == g) {
            return Err(PolicyError::Cycle(format!("group {}", stack[0]), g.to_owned()));
        }
        let Some(members) = self.groups.get(g) else { return Ok(vec![Selector::Group(g.to_owned())]) };
        stack.push(g.to_owned());
        let mut out = vec![Selector::Group(g.to_owned())];
        for m in members {
            match m {
                Selector::Group(inner) => out.extend(self.expand_group(inner, stack)?),
                other => out.push(other.clone()),
            }
        }
        stack.pop();
        Ok(out)
    }

    /// Compiles against `members` (what this node knows) for a node whose overlay
    /// networks are `overlay` (what `internet` excludes).
    pub fn compile(&self, members: &[Member], overlay: &[(IpAddr, u8)]) -> Compiled {
        let mut src: Vec<Vec<Range>> = Vec::with_capacity(self.rules.len());
        let mut dst: Vec<Vec<Range>> = Vec::with_capacity(self.rules.len());
        for r in &self.rules {
            src.push(self.ranges(&r.from, members, overlay, false));
            dst.push(self.ranges(&r.to, members, overlay, true));
        }
        Compiled {
            src: Intervals::build(&src),
            dst: Intervals::build(&dst),
            rules: self.rules.iter().map(|r| (r.proto, r.ports.clone())).collect(),
            words: self.rules.len().div_ceil(64),
        }
    }

    /// The address ranges `sel` covers.
    fn ranges(&self, sel: &[Selector], members: &[Member], overlay: &[(IpAddr, u8)], dest: bool) -> Vec<Range> {
        let mut out = Vec::new();
        for s in sel {
            let expanded = match s {
                Selector::Group(g) => self.expand_group(g, &mut Vec::new()).unwrap_or_default(),
                other => vec![other.clone()],
            };
            for e in expanded {
                match e {
                    Selector::Any => {
                        out.push(Range::of(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
                        out.push(Range::of(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0));
                    }
                    Selector::Internet => out.extend(internet(overlay)),
                    Selector::Cidr(a, p) => out.push(Range::of(a, p)),
                    Selector::Group(g) => {
                        for m in members.iter().filter(|m| m.groups.contains(&g)) {
                            out.extend(member_ranges(m, dest));
                        }
                    }
                    Selector::Member(name) => match by_name(members, &name) {
                        Some(m) => out.extend(member_ranges(m, dest)),
                        None => {
                            if let Some(a) = self.hosts.get(&name) {
                                out.push(Range::of(*a, if a.is_ipv4() { 32 } else { 128 }));
                            }
                        }
                    },
                    Selector::Id(h) => {
                        if let Some(m) = by_id(members, &h) {
                            out.extend(member_ranges(m, dest));
                        }
                    }
                }
            }
        }
        out
    }

    /// Runs the tests against `members` (offline: the file's `[hosts]` only): the first
    /// that fails, with why. A test naming someone unknown fails.
    pub fn check_tests(&self, members: &[Member], overlay: &[(IpAddr, u8)]) -> Result<usize, PolicyError> {
        self.run_tests(members, overlay, true).map(|(passed, _)| passed)
    }

    /// [`Policy::check_tests`] on a running node: a test naming someone this node does
    /// not know (yet) is skipped. Returns the tests passed and skipped.
    pub fn check_known_tests(
        &self,
        members: &[Member],
        overlay: &[(IpAddr, u8)],
    ) -> Result<(usize, usize), PolicyError> {
        self.run_tests(members, overlay, false)
    }

    fn run_tests(
        &self,
        members: &[Member],
        overlay: &[(IpAddr, u8)],
        strict: bool,
    ) -> Result<(usize, usize), PolicyError> {
        let c = self.compile(members, overlay);
        let (mut passed, mut skipped) = (0, 0);
        for (i, t) in self.tests.iter().enumerate() {
            let place = i + 1;
            // Offline (`weft policy check`), an end without an address is taken by its
            // name: the rules that name it (or its groups, or `*`) decide.
            let end = |who: &str| match self.addr_of(who, members) {
                Some(a) => Some(End::Addr(a)),
                None if strict && members.is_empty() => match parse_selector(who, "") {
                    Ok(Selector::Member(n)) => Some(End::Name(Selector::Member(n))),
                    Ok(Selector::Id(h)) => Some(End::Name(Selector::Id(h))),
                    _ => None,
                },
                None => None,
            };
            let (Some(from), Some(to)) = (end(&t.from), end(&t.to)) else {
                if !strict {
                    skipped += 1;
                    continue;
                }
                let who = if end(&t.from).is_none() { &t.from } else { &t.to };
                return Err(PolicyError::TestFailed(place, format!("{who:?} is no member, address or [hosts] name")));
            };
            let got = match (&from, &to) {
                (End::Addr(s), End::Addr(d)) => c.allows(*s, *d, t.proto, t.port),
                _ => self.rules.iter().position(|r| {
                    r.proto.covers(t.proto)
                        && r.port_ok(t.port, t.proto)
                        && self.covers(&r.from, &from, members, overlay, false)
                        && self.covers(&r.to, &to, members, overlay, true)
                }),
            };
            if got.is_some() != t.allow {
                let what = match got {
                    Some(r) => format!("allowed by rule {}", r + 1),
                    None => "denied (no rule allows it)".to_owned(),
                };
                return Err(PolicyError::TestFailed(
                    place,
                    format!(
                        "{} -> {}:{} is {what}, the test says {}",
                        t.from,
                        t.to,
                        t.port,
                        if t.allow { "allow" } else { "deny" }
                    ),
                ));
            }
            passed += 1;
        }
        Ok((passed, skipped))
    }

    /// Whether selectors `sel` cover one end of a test.
    fn covers(&self, sel: &[Selector], end: &End, members: &[Member], overlay: &[(IpAddr, u8)], dest: bool) -> bool {
        match end {
            End::Addr(a) => {
                let (v6, k) = key(*a);
                self.ranges(sel, members, overlay, dest).iter().any(|r| r.v6 == v6 && r.lo <= k && k <= r.hi)
            }
            End::Name(n) => sel.iter().any(|s| self.names(s, n)),
        }
    }

    /// Whether selector `s` names member selector `n` (offline: `*`, the same name or
    /// id, or a file group holding it).
    fn names(&self, s: &Selector, n: &Selector) -> bool {
        match (s, n) {
            (Selector::Any, _) => true,
            (Selector::Member(a), Selector::Member(b)) => a.eq_ignore_ascii_case(b),
            (Selector::Id(a), Selector::Id(b)) => a == b,
            (Selector::Group(g), _) => self
                .expand_group(g, &mut Vec::new())
                .unwrap_or_default()
                .iter()
                .any(|e| !matches!(e, Selector::Group(_)) && self.names(e, n)),
            _ => false,
        }
    }

    /// The address a test names: a member's, a `[hosts]` entry's, or a literal.
    pub fn addr_of(&self, name: &str, members: &[Member]) -> Option<IpAddr> {
        if let Ok(a) = name.parse::<IpAddr>() {
            return Some(a);
        }
        let member = match parse_selector(name, "") {
            Ok(Selector::Id(h)) => by_id(members, &h),
            _ => by_name(members, name),
        };
        member.and_then(|m| m.addrs.first().copied()).or_else(|| self.hosts.get(name).copied())
    }
}

fn member_ranges(m: &Member, dest: bool) -> Vec<Range> {
    let mut v: Vec<Range> = m.addrs.iter().map(|&a| Range::of(a, if a.is_ipv4() { 32 } else { 128 })).collect();
    if dest {
        // An exit's default route is not the member: only `internet` reaches there.
        v.extend(m.subnets.iter().filter(|&&(_, p)| p != 0).map(|&(a, p)| Range::of(a, p)));
    }
    v
}

/// Everything outside the overlay networks: the complement of their ranges.
fn internet(overlay: &[(IpAddr, u8)]) -> Vec<Range> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        let mut cut: Vec<Range> =
            overlay.iter().filter(|(a, _)| a.is_ipv6() == v6).map(|&(a, p)| Range::of(a, p)).collect();
        cut.sort_by_key(|r| r.lo);
        let (lo0, hi0) = if v6 { (0u128, u128::MAX) } else { (0, u128::from(u32::MAX)) };
        let mut at = lo0;
        let mut done = false;
        for r in cut {
            if r.lo > at {
                out.push(Range { v6, lo: at, hi: r.lo - 1 });
            }
            if r.hi >= hi0 {
                done = true;
                break;
            }
            at = at.max(r.hi + 1);
        }
        if !done {
            out.push(Range { v6, lo: at, hi: hi0 });
        }
    }
    out
}

fn parse_ports(s: &str, place: &str) -> Result<(u16, u16), PolicyError> {
    let bad = || PolicyError::Port(place.to_owned(), s.to_owned());
    let (lo, hi) = match s.trim().split_once('-') {
        Some((a, b)) => (a.trim().parse::<u16>().map_err(|_| bad())?, b.trim().parse::<u16>().map_err(|_| bad())?),
        None => {
            let p = s.trim().parse::<u16>().map_err(|_| bad())?;
            (p, p)
        }
    };
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// `NAME:PORT` or `[v6]:PORT` or a bare name.
fn split_port(s: &str) -> (&str, Option<&str>) {
    if let Some(rest) = s.strip_prefix('[')
        && let Some((a, p)) = rest.split_once("]:")
    {
        return (a, Some(p));
    }
    if s.matches(':').count() == 1
        && let Some((a, p)) = s.split_once(':')
    {
        return (a, Some(p));
    }
    (s, None)
}

/// One end of a `[[test]]`: an address, or offline a member known by name or id only.
enum End {
    Addr(IpAddr),
    Name(Selector),
}

/// An inclusive address range of one family (IPv4 as the low 32 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    v6: bool,
    lo: u128,
    hi: u128,
}

impl Range {
    fn of(a: IpAddr, p: u8) -> Self {
        match mask(a, p) {
            IpAddr::V4(v) => {
                let lo = u128::from(u32::from(v));
                let span = if p >= 32 { 0 } else { (1u128 << (32 - p)) - 1 };
                Self { v6: false, lo, hi: lo + span }
            }
            IpAddr::V6(v) => {
                let lo = u128::from(v);
                let span = if p >= 128 {
                    0
                } else if p == 0 {
                    u128::MAX
                } else {
                    (1u128 << (128 - p)) - 1
                };
                Self { v6: true, lo, hi: lo.saturating_add(span) }
            }
        }
    }
}

fn key(a: IpAddr) -> (bool, u128) {
    match a {
        IpAddr::V4(v) => (false, u128::from(u32::from(v))),
        IpAddr::V6(v) => match v.to_ipv4_mapped() {
            Some(v4) => (false, u128::from(u32::from(v4))),
            None => (true, u128::from(v)),
        },
    }
}

/// The address space of both families cut where any rule's range starts or ends;
/// each piece carries the bitset of the rules covering it.
#[derive(Debug, Clone, Default)]
struct Intervals {
    /// Per family: the start of each piece, sorted, and its rule bitset.
    starts: [Vec<u128>; 2],
    sets: [Vec<Vec<u64>>; 2],
}

impl Intervals {
    fn build(per_rule: &[Vec<Range>]) -> Self {
        let words = per_rule.len().div_ceil(64);
        let mut out = Self::default();
        for fam in 0..2 {
            let v6 = fam == 1;
            let mut cuts: Vec<u128> = vec![0];
            for r in per_rule.iter().flatten().filter(|r| r.v6 == v6) {
                cuts.push(r.lo);
                if r.hi < u128::MAX {
                    cuts.push(r.hi + 1);
                }
            }
            cuts.sort_unstable();
            cuts.dedup();
            let mut sets = vec![vec![0u64; words]; cuts.len()];
            for (i, ranges) in per_rule.iter().enumerate() {
                for r in ranges.iter().filter(|r| r.v6 == v6) {
                    let first = cuts.partition_point(|&c| c < r.lo);
                    let end = cuts.partition_point(|&c| c <= r.hi);
                    for set in &mut sets[first..end] {
                        set[i / 64] |= 1 << (i % 64);
                    }
                }
            }
            out.starts[fam] = cuts;
            out.sets[fam] = sets;
        }
        out
    }

    fn get(&self, a: IpAddr) -> Option<&[u64]> {
        let (v6, k) = key(a);
        let fam = usize::from(v6);
        let i = self.starts[fam].partition_point(|&c| c <= k).checked_sub(1)?;
        self.sets[fam].get(i).map(Vec::as_slice)
    }
}

/// A policy resolved to addresses: what the data path asks per new flow.
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    src: Intervals,
    dst: Intervals,
    rules: Vec<(Proto, Vec<(u16, u16)>)>,
    words: usize,
}

impl Compiled {
    /// The first rule that allows a packet from `src` to `dst` of IP protocol `proto`
    /// to destination port `port` (ignored for protocols without ports), or `None`:
    /// denied.
    pub fn allows(&self, src: IpAddr, dst: IpAddr, proto: u8, port: u16) -> Option<usize> {
        let (s, d) = (self.src.get(src)?, self.dst.get(dst)?);
        for w in 0..self.words {
            let mut bits = s[w] & d[w];
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let (p, ports) = &self.rules[i];
                if p.covers(proto) && (ports.is_empty() || port_in(ports, port, proto)) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// How many rules it holds.
    pub fn rules(&self) -> usize {
        self.rules.len()
    }
}

fn port_in(ports: &[(u16, u16)], port: u16, proto: u8) -> bool {
    !(proto == proto::TCP || proto == proto::UDP) || ports.iter().any(|&(lo, hi)| (lo..=hi).contains(&port))
}

/// Names that a policy's selectors use but that resolve to nobody among `members`
/// (typos show here: `weft policy check` warns).
pub fn unresolved(policy: &Policy, members: &[Member]) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let known_groups: HashSet<&str> = members.iter().flat_map(|m| m.groups.iter().map(String::as_str)).collect();
    let all = policy.rules.iter().flat_map(|r| r.from.iter().chain(&r.to)).chain(policy.groups.values().flatten());
    for s in all {
        let name = match s {
            Selector::Member(n) if by_name(members, n).is_none() && !policy.hosts.contains_key(n) => n.clone(),
            Selector::Id(h) if by_id(members, h).is_none() => format!("id:{h}"),
            Selector::Group(g) if !policy.groups.contains_key(g) && !known_groups.contains(g.as_str()) => {
                format!("group:{g}")
            }
            _ => continue,
        };
        if seen.insert(name.clone()) {
            out.push(name);
        }
    }
    out
}

/// Prefix of a signed policy's text form.
pub const SIGNED_POLICY_PREFIX: &str = "weft-policy:";
const POLICY_DOMAIN_1: &[u8] = b"weft policy 1\0";
const POLICY_DOMAIN: &[u8] = b"weft policy 2\0";
const POLICY_FORMAT: u8 = 2;
/// Longest policy text a signed policy carries.
pub const MAX_POLICY_TEXT: usize = 60_000;

/// A policy the network's authority signed for one network, with a version: the mesh
/// carries it to every member and the newest valid version wins.
///
/// Format 2: `u8 2, [32] authority, u8 length + the network's name, u64 version (BE),
/// u32 length (BE) + the policy's TOML text, [64] Ed25519 signature over "weft policy
/// 2\0" ‖ everything before it`. Format 1 (no network name, "weft policy 1\0") is
/// still read, so a node keeps the policy it held before an upgrade; members take it
/// from nobody else ([`SignedPolicy::network`] is `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedPolicy {
    /// The authority that signed it.
    pub authority: crate::cert::AuthorityId,
    /// The network it was signed for (`None`: format 1, bound to none).
    pub network: Option<String>,
    /// Its version: a newer one replaces it.
    pub version: u64,
    /// The policy file's text.
    pub text: String,
    signature: [u8; 64],
}

impl SignedPolicy {
    /// Signs `text` (which must parse) for network `network` as version `version`.
    pub fn sign(key: &crate::cert::AuthorityKey, network: &str, version: u64, text: &str) -> Result<Self, String> {
        Policy::parse(text).map_err(|e| e.to_string())?;
        if text.len() > MAX_POLICY_TEXT {
            return Err(format!("the policy is over {MAX_POLICY_TEXT} bytes"));
        }
        if network.is_empty() || network.len() > crate::cert::MAX_NAME {
            return Err(format!("a network name of 1 to {} bytes", crate::cert::MAX_NAME));
        }
        let mut p = Self {
            authority: key.id(),
            network: Some(network.to_owned()),
            version,
            text: text.to_owned(),
            signature: [0; 64],
        };
        p.signature = key.sign(POLICY_DOMAIN, &p.body());
        Ok(p)
    }

    fn body(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(46 + self.text.len());
        match &self.network {
            Some(n) => {
                b.push(POLICY_FORMAT);
                b.extend_from_slice(&self.authority.0);
                b.push(n.len() as u8);
                b.extend_from_slice(n.as_bytes());
            }
            None => {
                b.push(1);
                b.extend_from_slice(&self.authority.0);
            }
        }
        b.extend_from_slice(&self.version.to_be_bytes());
        b.extend_from_slice(&(self.text.len() as u32).to_be_bytes());
        b.extend_from_slice(self.text.as_bytes());
        b
    }

    /// The encoded signed policy.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = self.body();
        b.extend_from_slice(&self.signature);
        b
    }

    /// Parses an encoded signed policy (structure only; [`SignedPolicy::verify`]
    /// checks the signature, [`Policy::parse`] the text).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, crate::cert::CertError> {
        use crate::cert::{CertError, Reader};
        let mut r = Reader(bytes);
        let format = r.u8()?;
        if format != 1 {
            crate::cert::check_format(format, POLICY_FORMAT)?;
        }
        let authority = crate::cert::AuthorityId(r.key()?);
        let network = if format == 1 { None } else { Some(r.str("network name")?) };
        let version = r.u64()?;
        let n = r.take(4)?;
        let n = u32::from_be_bytes([n[0], n[1], n[2], n[3]]) as usize;
        if n > MAX_POLICY_TEXT {
            return Err(CertError::TooLarge("policy text"));
        }
        let text = String::from_utf8(r.take(n)?.to_vec()).map_err(|_| CertError::Field("policy text"))?;
        let signature = r.signature()?;
        Ok(Self { authority, network, version, text, signature })
    }

    /// The one-line text form, `weft-policy:<base64url>`.
    pub fn to_text(&self) -> String {
        use base64::Engine;
        format!("{SIGNED_POLICY_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.to_bytes()))
    }

    /// Parses the text form.
    pub fn from_text(text: &str) -> Result<Self, crate::cert::CertError> {
        Self::from_bytes(&crate::cert::from_text(text, SIGNED_POLICY_PREFIX)?)
    }

    /// Whether one of `trusted` signed it.
    pub fn verify(&self, trusted: &[crate::cert::AuthorityId]) -> bool {
        let domain = if self.network.is_some() { POLICY_DOMAIN } else { POLICY_DOMAIN_1 };
        trusted.contains(&self.authority) && crate::cert::verify(&self.authority, domain, &self.body(), &self.signature)
    }

    /// Why it is not for network `network`, if it is not (format 1 names none).
    pub fn network_refusal(&self, network: &str) -> Option<String> {
        match &self.network {
            Some(n) if n == network => None,
            Some(n) => Some(format!("it was signed for network {n:?}, not {network:?}")),
            None => Some("it names no network (signed by an older release: sign it again)".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_policy_round_trips_and_verifies_only_unchanged_under_its_authority() {
        let k = crate::cert::AuthorityKey::from_seed([4; 32]);
        let p = SignedPolicy::sign(&k, "office", 7, EXAMPLE).unwrap();
        let back = SignedPolicy::from_text(&p.to_text()).unwrap();
        assert_eq!(back, p);
        assert!(back.verify(&[k.id()]));
        assert_eq!(back.network_refusal("office"), None);
        assert!(back.network_refusal("lab").unwrap().contains("\"lab\""));
        assert!(!back.verify(&[crate::cert::AuthorityKey::from_seed([5; 32]).id()]));
        let mut bytes = p.to_bytes();
        bytes[40] ^= 1; // the version
        assert!(!SignedPolicy::from_bytes(&bytes).unwrap().verify(&[k.id()]));
        // The network name is signed: another name does not verify.
        let mut other = p.clone();
        other.network = Some("lab".into());
        assert!(!SignedPolicy::from_bytes(&other.to_bytes()).unwrap().verify(&[k.id()]));
        let b = p.to_bytes();
        for n in 0..b.len() {
            assert!(SignedPolicy::from_bytes(&b[..n]).is_err(), "cut at {n}");
        }
        assert!(
            SignedPolicy::sign(&k, "office", 1, "[[allow]]\nfrom=[\"a b\"]\nto=[]\n").is_err(),
            "text that does not parse"
        );
    }

    const EXAMPLE: &str = r#"
[groups]
admins  = ["alice", "10.126.126.0/28"]      # host names, node ids, CIDRs, or group:NAME
servers = ["db", "web"]

[[allow]]
from  = ["group:admins"]
to    = ["group:servers"]
proto = "tcp"
ports = ["22", "8000-8099"]

[[allow]]
from  = ["*"]
to    = ["web"]
proto = "tcp"
ports = ["443"]

[[test]]
from = "alice"
to   = "db:22"
allow = true

[[test]]
from = "web"
to   = "db:5432"
allow = false
"#;

    fn m(name: &str, ip: [u8; 4], groups: &[&str]) -> Member {
        Member {
            node_id: format!("{:02x}", ip[3]).repeat(8),
            key: format!("{:02x}", ip[3]).repeat(32),
            name: name.into(),
            addrs: vec![IpAddr::V4(ip.into())],
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            subnets: Vec::new(),
        }
    }

    fn members() -> Vec<Member> {
        vec![
            m("alice", [10, 126, 126, 50], &[]),
            m("db", [10, 126, 126, 20], &[]),
            m("web", [10, 126, 126, 21], &["public"]),
            m("laptop", [10, 126, 126, 60], &["laptops"]),
        ]
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_issues_example_parses_and_its_tests_pass() {
        let p = Policy::parse(EXAMPLE).unwrap();
        assert_eq!(p.rules.len(), 2);
        assert_eq!(p.check_tests(&members(), &[]), Ok(2));
        let c = p.compile(&members(), &[]);
        assert_eq!(c.allows(ip("10.126.126.50"), ip("10.126.126.20"), proto::TCP, 22), Some(0));
        assert_eq!(c.allows(ip("10.126.126.3"), ip("10.126.126.21"), proto::TCP, 8050), Some(0), "an admin CIDR");
        assert_eq!(c.allows(ip("10.126.126.60"), ip("10.126.126.21"), proto::TCP, 443), Some(1), "anyone to web:443");
        assert_eq!(c.allows(ip("10.126.126.60"), ip("10.126.126.20"), proto::TCP, 22), None, "default deny");
        assert_eq!(c.allows(ip("10.126.126.50"), ip("10.126.126.20"), proto::UDP, 22), None, "tcp only");
        assert_eq!(c.allows(ip("10.126.126.50"), ip("10.126.126.20"), proto::ICMP, 0), None);
    }

    #[test]
    fn a_failing_test_is_named_with_the_rule_that_decides() {
        let text = format!("{EXAMPLE}\n[[test]]\nfrom = \"laptop\"\nto = \"web:443\"\nallow = false\n");
        let e = Policy::parse(&text).unwrap().check_tests(&members(), &[]).unwrap_err();
        assert_eq!(e.to_string(), "test 3 fails: laptop -> web:443 is allowed by rule 2, the test says deny");
    }

    #[test]
    fn bad_files_are_refused_naming_the_place() {
        let cases = [
            ("[[allow]]\nfrom=[\"a b\"]\nto=[\"*\"]\n", "allow rule 1: \"a b\" is not"),
            ("[[allow]]\nfrom=[\"*\"]\nto=[\"*\"]\nproto=\"sctp\"\n", "proto \"sctp\""),
            ("[[allow]]\nfrom=[\"*\"]\nto=[\"*\"]\nproto=\"tcp\"\nports=[\"0\"]\n", "port \"0\""),
            ("[[allow]]\nfrom=[\"*\"]\nto=[\"*\"]\nports=[\"22\"]\n", "ports need proto"),
            ("[[allow]]\nfrom=[\"internet\"]\nto=[\"*\"]\n", "a destination only"),
            ("[groups]\na=[\"group:b\"]\nb=[\"group:a\"]\n", "refers to itself"),
            ("[[test]]\nfrom=\"a\"\nto=\"b\"\nallow=true\n", "say NAME:PORT"),
            ("[allow]\n", "invalid type"),
            ("bogus = 1\n", "unknown field"),
        ];
        for (text, want) in cases {
            let e = Policy::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn groups_come_from_the_file_and_from_certificates_and_nest() {
        let text = "[groups]\nstaff=[\"group:admins\", \"bob\"]\nadmins=[\"alice\"]\n\
                    [[allow]]\nfrom=[\"group:staff\", \"group:laptops\"]\nto=[\"group:public\"]\n";
        let c = Policy::parse(text).unwrap().compile(&members(), &[]);
        let web = ip("10.126.126.21");
        assert_eq!(c.allows(ip("10.126.126.50"), web, proto::UDP, 53), Some(0), "alice through admins");
        assert_eq!(c.allows(ip("10.126.126.60"), web, proto::ICMP, 0), Some(0), "a certificate group");
        assert_eq!(c.allows(ip("10.126.126.20"), web, proto::TCP, 1), None);
        assert_eq!(c.allows(ip("10.126.126.50"), ip("10.126.126.20"), proto::TCP, 1), None, "db is not public");
    }

    #[test]
    fn internet_is_what_lies_outside_the_overlay_and_subnets_are_destinations() {
        let mut mm = members();
        mm[1].subnets.push((ip("192.168.50.0"), 24));
        let text = "[[allow]]\nfrom=[\"alice\"]\nto=[\"internet\", \"db\"]\n";
        let c = Policy::parse(text).unwrap().compile(&mm, &[(ip("10.126.126.0"), 24), (ip("fd00::"), 64)]);
        let alice = ip("10.126.126.50");
        assert_eq!(c.allows(alice, ip("1.1.1.1"), proto::TCP, 443), Some(0));
        assert_eq!(c.allows(alice, ip("2001:db8::1"), proto::TCP, 443), Some(0));
        assert_eq!(c.allows(alice, ip("10.126.126.21"), proto::TCP, 443), None, "web is in the overlay");
        assert_eq!(c.allows(alice, ip("fd00::9"), proto::TCP, 443), None);
        assert_eq!(c.allows(alice, ip("192.168.50.7"), proto::TCP, 443), Some(0), "db's subnet");
        assert_eq!(
            unresolved(&Policy::parse("[[allow]]\nfrom=[\"carol\"]\nto=[\"group:x\"]\n").unwrap(), &mm),
            ["carol", "group:x"]
        );
    }

    #[test]
    fn ids_name_keys_and_names_match_only_their_bound_member() {
        let mut mm = members();
        // A later member copies alice's name: the node left its name empty.
        mm.push(Member { name: String::new(), ..m("alice", [10, 126, 126, 66], &[]) });
        let alice_key = mm[0].key.clone();
        let (alice, copy, db) = (ip("10.126.126.50"), ip("10.126.126.66"), ip("10.126.126.20"));
        for sel in [
            "alice".to_owned(),
            format!("id:{alice_key}"),
            alice_key.clone(),
            format!("id:{}", &alice_key[..16]),
            format!("id:{}", mm[0].node_id),
        ] {
            let text = format!("[[allow]]\nfrom=[\"{sel}\"]\nto=[\"db\"]\n");
            let c = Policy::parse(&text).unwrap().compile(&mm, &[]);
            assert_eq!(c.allows(alice, db, proto::TCP, 22), Some(0), "{sel}");
            assert_eq!(c.allows(copy, db, proto::TCP, 22), None, "{sel}: the copy gets nothing");
        }
        // A host name that looks like an id is a name, and an id selector never
        // matches a host name.
        let mut named = mm.clone();
        named[1].name = mm[0].key.clone();
        let text = format!("[[allow]]\nfrom=[\"{alice_key}\"]\nto=[\"*\"]\n");
        let c = Policy::parse(&text).unwrap().compile(&named, &[]);
        assert_eq!(c.allows(db, alice, proto::TCP, 22), None, "db named itself after alice's key");
        // A prefix two keys share names nobody.
        let mut twins = members();
        twins[1].key = format!("{}ff", &twins[0].key[..62]);
        let text = format!("[[allow]]\nfrom=[\"id:{}\"]\nto=[\"*\"]\n", &twins[0].key[..20]);
        let p = Policy::parse(&text).unwrap();
        assert_eq!(p.compile(&twins, &[]).allows(alice, db, proto::TCP, 22), None);
        assert_eq!(unresolved(&p, &twins), [format!("id:{}", &twins[0].key[..20])]);
        for bad in ["id:abc", "id:xyz0123456789abcdef", "id:"] {
            let text = format!("[[allow]]\nfrom=[\"{bad}\"]\nto=[\"*\"]\n");
            assert!(Policy::parse(&text).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_member_as_a_destination_is_never_its_exits_default_route() {
        let mut mm = members();
        mm[1].subnets = vec![(ip("0.0.0.0"), 0), (ip("::"), 0), (ip("192.168.50.0"), 24)];
        let c = Policy::parse("[[allow]]\nfrom=[\"*\"]\nto=[\"db\"]\n").unwrap().compile(&mm, &[]);
        let alice = ip("10.126.126.50");
        assert_eq!(c.allows(alice, ip("10.126.126.20"), proto::TCP, 22), Some(0));
        assert_eq!(c.allows(alice, ip("192.168.50.9"), proto::TCP, 22), Some(0), "its subnet");
        assert_eq!(c.allows(alice, ip("10.126.126.21"), proto::TCP, 22), None, "another member");
        assert_eq!(c.allows(alice, ip("1.1.1.1"), proto::TCP, 443), None, "the internet");
        assert_eq!(c.allows(alice, ip("2001:db8::1"), proto::TCP, 443), None);
    }

    #[test]
    fn offline_tests_go_by_name_without_hosts() {
        let p = Policy::parse(EXAMPLE).unwrap();
        assert!(p.hosts.is_empty());
        assert_eq!(p.check_tests(&[], &[]), Ok(2));
        let wrong = format!("{EXAMPLE}\n[[test]]\nfrom = \"web\"\nto = \"db:22\"\nallow = true\n");
        let e = Policy::parse(&wrong).unwrap().check_tests(&[], &[]).unwrap_err();
        assert!(e.to_string().contains("denied"), "{e}");
    }

    #[test]
    fn a_policy_signed_by_an_older_release_is_read_and_names_no_network() {
        let k = crate::cert::AuthorityKey::from_seed([4; 32]);
        let mut p = SignedPolicy::sign(&k, "office", 3, EXAMPLE).unwrap();
        p.network = None;
        p.signature = k.sign(POLICY_DOMAIN_1, &p.body());
        let back = SignedPolicy::from_bytes(&p.to_bytes()).unwrap();
        assert_eq!(back.network, None);
        assert_eq!(back.to_bytes()[0], 1);
        assert!(back.verify(&[k.id()]));
        assert!(back.network_refusal("office").unwrap().contains("no network"));
    }

    /// The compiled matcher against a scan of the rules, on random packets.
    #[test]
    fn the_compiled_matcher_agrees_with_a_naive_scan() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let base = u32::from(Ipv4Addr::new(10, 0, 0, 0));
        let rand_cidr = |rng: &mut rand::rngs::StdRng| {
            let p = rng.gen_range(20..=32u8);
            (IpAddr::V4(Ipv4Addr::from(base + rng.gen_range(0..4096))), p)
        };
        for round in 0..20 {
            let n = if round == 0 { 200 } else { rng.gen_range(1..80) };
            let mut rules = Vec::new();
            for _ in 0..n {
                let sels = |rng: &mut rand::rngs::StdRng| -> Vec<Selector> {
                    let k = rng.gen_range(1..3);
                    (0..k).map(|_| rand_cidr(rng)).map(|(a, p)| Selector::Cidr(mask(a, p), p)).collect()
                };
                let (from, to) = (sels(&mut rng), sels(&mut rng));
                let proto = [Proto::Any, Proto::Tcp, Proto::Udp, Proto::Icmp][rng.gen_range(0..4)];
                let ports = if proto.has_ports() && rng.gen_bool(0.7) {
                    let lo = rng.gen_range(1..1000u16);
                    vec![(lo, lo + rng.gen_range(0..50))]
                } else {
                    Vec::new()
                };
                rules.push(Rule { from, to, proto, ports });
            }
            let policy = Policy { groups: BTreeMap::new(), hosts: BTreeMap::new(), rules, tests: Vec::new() };
            let c = policy.compile(&[], &[]);
            let inside = |sel: &[Selector], a: IpAddr| {
                sel.iter().any(|s| matches!(s, Selector::Cidr(n, p) if mask(a, *p) == *n))
            };
            for _ in 0..2000 {
                let s = IpAddr::V4(Ipv4Addr::from(base + rng.gen_range(0..4096)));
                let d = IpAddr::V4(Ipv4Addr::from(base + rng.gen_range(0..4096)));
                let pr = [proto::TCP, proto::UDP, proto::ICMP, 47][rng.gen_range(0..4)];
                let port = rng.gen_range(1..1100u16);
                let naive = policy
                    .rules
                    .iter()
                    .position(|r| inside(&r.from, s) && inside(&r.to, d) && r.proto.covers(pr) && r.port_ok(port, pr));
                assert_eq!(c.allows(s, d, pr, port), naive, "{s} -> {d} proto {pr} port {port}");
            }
        }
    }
}
