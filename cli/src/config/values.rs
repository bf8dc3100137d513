//! Typed configuration values and their parsers: addresses with prefixes, peer URIs,
//! forwards and exposes, secrets, log settings. A leaf: flags, the file and the
//! services that take these values all import it, and it imports none of them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::str::FromStr;

use serde::Deserialize;
use weft_datapath::transport::{Endpoint, Proto};

/// A problem with what the user asked for; exits with status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub(crate) fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Refuses a file that its group or others may read or write (mode bits 0o077), with
/// the exact command that fixes it. `what` names the file ("config file", "node
/// key"), `why` says why it matters, before "is readable ...".
pub fn check_private(path: &Path, what: &str, why: &str) -> Result<(), UsageError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).or_else(|e| usage(format!("cannot read {what} {}: {e}", path.display())))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        let why = if why.is_empty() { String::new() } else { format!("{why} ") };
        return usage(format!(
            "{what} {p} {why}is accessible by group or others (mode {mode:03o}); it must be private to its owner: run `chmod 600 {p}`",
            p = path.display(),
        ));
    }
    Ok(())
}

/// An overlay address with its prefix, e.g. 10.126.126.2/24.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Net {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length.
    pub prefix: u8,
}

impl FromStr for Ipv4Net {
    type Err = UsageError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UsageError(format!("invalid overlay address {s:?}: expected ADDR/PREFIX such as 10.126.126.2/24"));
        let (addr, prefix) = split_cidr(s).ok_or_else(bad)?;
        if prefix == 0 || addr.is_unspecified() || addr.is_multicast() || addr.is_broadcast() {
            return Err(bad());
        }
        Ok(Self { addr, prefix })
    }
}

impl Ipv4Net {
    /// The network this address is in (host bits cleared), e.g. 10.126.126.0/24.
    pub fn network(self) -> Self {
        Self { addr: weft_core::route::network(self.addr, self.prefix), prefix: self.prefix }
    }

    /// Whether the two prefixes share an address.
    pub fn overlaps(self, other: Self) -> bool {
        weft_core::route::overlaps(self.addr, self.prefix, other.addr, other.prefix)
    }

    /// Whether `addr` lies in this prefix.
    pub fn contains(self, addr: Ipv4Addr) -> bool {
        weft_core::route::overlaps(self.addr, self.prefix, addr, 32)
    }

    /// `ADDR/PREFIX` with a prefix of at most 32, as written (host bits kept).
    pub fn parse_cidr(s: &str) -> Option<Self> {
        split_cidr(s).map(|(addr, prefix)| Self { addr, prefix })
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// An address or subnet of either family with its prefix, e.g. 192.168.1.0/24 or
/// fd77::/64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct IpNet {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl IpNet {
    /// `ADDR/PREFIX` of either family, the prefix within the family's width.
    pub fn parse_cidr(s: &str) -> Option<Self> {
        let (a, p) = s.split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = p.parse().ok().filter(|p| *p <= max)?;
        Some(Self { addr, prefix })
    }

    /// The network this address is in (host bits cleared).
    pub fn network(self) -> Self {
        Self { addr: weft_core::route::network_ip(self.addr, self.prefix), prefix: self.prefix }
    }

    /// Whether the two prefixes share an address (never across families).
    pub fn overlaps(self, other: Self) -> bool {
        weft_core::route::overlaps_ip(self.addr, self.prefix, other.addr, other.prefix)
    }

    /// As the engine's (address, prefix) pair.
    pub fn pair(self) -> (IpAddr, u8) {
        (self.addr, self.prefix)
    }
}

impl From<Ipv4Net> for IpNet {
    fn from(n: Ipv4Net) -> Self {
        Self { addr: IpAddr::V4(n.addr), prefix: n.prefix }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// What `--proxy-health` checks on the proxied subnet's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthTarget {
    /// An ICMP echo to this address (`ADDR` or `icmp://ADDR`).
    Icmp(IpAddr),
    /// A TCP connection to this address and port (`ADDR:PORT` or `tcp://ADDR:PORT`).
    Tcp(SocketAddr),
}

impl HealthTarget {
    /// `ADDR`, `icmp://ADDR`, `ADDR:PORT`, `[V6]:PORT` or `tcp://ADDR:PORT`.
    pub fn parse(s: &str) -> Result<Self, UsageError> {
        let bad = |why: &str| {
            UsageError(format!(
                "invalid --proxy-health {s:?}: {why} (give ADDR for a ping, ADDR:PORT or tcp://ADDR:PORT for a TCP \
                 connection)"
            ))
        };
        if let Some(a) = s.strip_prefix("icmp://") {
            return a.parse().map(Self::Icmp).map_err(|_| bad("not an IP address"));
        }
        if let Some(a) = s.strip_prefix("tcp://") {
            let sa: SocketAddr = a.parse().map_err(|_| bad("not ADDR:PORT"))?;
            return if sa.port() == 0 { Err(bad("port 0")) } else { Ok(Self::Tcp(sa)) };
        }
        if let Ok(a) = s.parse::<IpAddr>() {
            return Ok(Self::Icmp(a));
        }
        match s.parse::<SocketAddr>() {
            Ok(sa) if sa.port() != 0 => Ok(Self::Tcp(sa)),
            Ok(_) => Err(bad("port 0")),
            Err(_) => Err(bad("not an address")),
        }
    }

    /// The address checked.
    pub fn ip(self) -> IpAddr {
        match self {
            Self::Icmp(a) => a,
            Self::Tcp(sa) => sa.ip(),
        }
    }
}

impl fmt::Display for HealthTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Icmp(a) => write!(f, "icmp://{a}"),
            Self::Tcp(sa) => write!(f, "tcp://{sa}"),
        }
    }
}

/// The node's IPv6 overlay address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Overlay {
    /// Derived from the network name and the node id ([`weft_peers::default_ipv6`]);
    /// left out when the host has no IPv6.
    Derived,
    /// `--ipv6 ADDR/PREFIX`.
    Given(Ipv6Addr, u8),
    /// `--no-ipv6`: an IPv4-only overlay.
    Off,
}

/// Parses `--ipv6 ADDR/PREFIX`: a unicast address that is not loopback, link-local
/// or IPv4-mapped, with a prefix of 8 to 128.
pub(crate) fn parse_ipv6(s: &str) -> Result<(Ipv6Addr, u8), UsageError> {
    let bad = |why: &str| {
        UsageError(format!("invalid --ipv6 {s:?}: {why} (expected ADDR/PREFIX such as fd7a:115c:a1e0::2/64)"))
    };
    let (a, p) = s.split_once('/').ok_or_else(|| bad("no prefix length"))?;
    let addr: Ipv6Addr = a.parse().map_err(|_| bad("not an IPv6 address"))?;
    let prefix: u8 =
        p.parse().ok().filter(|p| (8..=128).contains(p)).ok_or_else(|| bad("prefix length outside 8 to 128"))?;
    if addr.is_unspecified() || addr.is_loopback() || addr.is_multicast() {
        return Err(bad("not a unicast address"));
    }
    if addr.is_unicast_link_local() {
        return Err(bad("a link-local address belongs to one link, not to the overlay"));
    }
    if addr.to_ipv4_mapped().is_some() {
        return Err(bad("an IPv4-mapped address; give IPv4 with -i/--ipv4"));
    }
    Ok((addr, prefix))
}

/// A transport URI: `udp://HOST:PORT`, `tcp://HOST:PORT`, `quic://HOST:PORT`,
/// `ws://HOST:PORT/PATH` or `wss://HOST:PORT/PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUri {
    /// The transport.
    pub proto: Proto,
    /// The host and port as written.
    pub authority: String,
    /// The request path of a WebSocket URI (`/` when none is given).
    pub path: String,
}

impl PeerUri {
    /// Resolves the host (names go through the system resolver).
    pub fn resolve(&self) -> Result<Endpoint, UsageError> {
        let mut addrs = self.authority.to_socket_addrs().or_else(|e| usage(format!("cannot resolve {self}: {e}")))?;
        let addr = addrs.next().ok_or_else(|| UsageError(format!("{self} resolves to no address")))?;
        Ok(Endpoint::new(self.proto, addr))
    }
}

impl fmt::Display for PeerUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.proto, self.authority)?;
        if matches!(self.proto, Proto::Ws | Proto::Wss) {
            f.write_str(&self.path)?;
        }
        Ok(())
    }
}

impl FromStr for PeerUri {
    type Err = UsageError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const FORMS: &str =
            "udp://HOST:PORT, tcp://HOST:PORT, quic://HOST:PORT, ws://HOST:PORT/PATH or wss://HOST:PORT/PATH";
        let Some((scheme, rest)) = s.split_once("://") else {
            return usage(format!("invalid URI {s:?}: expected {FORMS}"));
        };
        let Ok(proto) = scheme.parse::<Proto>() else {
            return usage(format!("invalid URI {s:?}: unknown scheme {scheme:?} (expected {FORMS})"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) if matches!(proto, Proto::Ws | Proto::Wss) => (&rest[..i], &rest[i..]),
            Some(_) => return usage(format!("invalid URI {s:?}: only ws:// and wss:// URIs take a path")),
            None => (rest, "/"),
        };
        let (host, port) =
            authority.rsplit_once(':').ok_or_else(|| UsageError(format!("invalid URI {s:?}: missing :PORT")))?;
        let host_ok = !host.is_empty() && !host.contains(char::is_whitespace);
        if !host_ok || port.parse::<u16>().is_err() || path.contains(char::is_whitespace) {
            return usage(format!("invalid URI {s:?}: expected {FORMS}"));
        }
        Ok(Self { proto, authority: authority.to_owned(), path: path.to_owned() })
    }
}

/// A layer-4 protocol of `--forward` and `--expose`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum L4 {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl fmt::Display for L4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        })
    }
}

/// `--forward PROTO://LOCAL=REMOTE:PORT`: connections (or datagrams) to a local port
/// go to a member's port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// TCP or UDP.
    pub proto: L4,
    /// The local address to listen on.
    pub local: SocketAddr,
    /// The member: an overlay address (or one in a proxied subnet), or a name the
    /// Magic DNS zone resolves.
    pub host: String,
    /// The member's port.
    pub port: u16,
}

impl fmt::Display for Forward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        write!(f, "{}://{}={host}:{}", self.proto, self.local, self.port)
    }
}

/// `--expose PROTO://PORT=LOCAL`: members reaching this node's overlay port reach a
/// local service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expose {
    /// TCP or UDP.
    pub proto: L4,
    /// The overlay port.
    pub port: u16,
    /// The local service.
    pub local: SocketAddr,
}

impl fmt::Display for Expose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}={}", self.proto, self.port, self.local)
    }
}

fn split_proto<'a>(flag: &str, spec: &'a str, example: &str) -> Result<(L4, &'a str), UsageError> {
    match spec.split_once("://") {
        Some(("tcp", rest)) => Ok((L4::Tcp, rest)),
        Some(("udp", rest)) => Ok((L4::Udp, rest)),
        Some((p, _)) => usage(format!("invalid {flag} {spec:?}: unknown protocol {p:?} (tcp:// or udp://)")),
        None => usage(format!("invalid {flag} {spec:?}: expected {example}")),
    }
}

/// A local address: `ADDR:PORT`, `[V6]:PORT`, or a bare port on 127.0.0.1.
fn local_addr(s: &str) -> Option<SocketAddr> {
    if let Ok(port) = s.parse::<u16>() {
        return (port != 0).then(|| SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse::<SocketAddr>().ok().filter(|a| a.port() != 0)
}

/// Parses `--forward PROTO://LOCAL=REMOTE:PORT`.
pub fn parse_forward(spec: &str) -> Result<Forward, UsageError> {
    const EXAMPLE: &str = "tcp://127.0.0.1:8080=10.126.0.2:80 (PROTO://LOCAL=REMOTE:PORT)";
    let (proto, rest) = split_proto("--forward", spec, EXAMPLE)?;
    let bad = |why: &str| usage(format!("invalid --forward {spec:?}: {why}; expected {EXAMPLE}"));
    let Some((local, remote)) = rest.split_once('=') else { return bad("no '='") };
    let Some(local) = local_addr(local) else { return bad("the local side is not ADDR:PORT") };
    let Some((host, port)) = remote.rsplit_once(':') else { return bad("the remote side has no port") };
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p != 0) else { return bad("the remote port is not 1-65535") };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let is_name = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if host.parse::<IpAddr>().is_err() && !is_name {
        return bad("the remote host is neither an address nor a member name");
    }
    Ok(Forward { proto, local, host: host.to_owned(), port })
}

/// Parses `--expose PROTO://PORT=LOCAL`.
pub fn parse_expose(spec: &str) -> Result<Expose, UsageError> {
    const EXAMPLE: &str = "tcp://80=127.0.0.1:8080 (PROTO://OVERLAY_PORT=LOCAL_ADDR:PORT)";
    let (proto, rest) = split_proto("--expose", spec, EXAMPLE)?;
    let bad = |why: &str| usage(format!("invalid --expose {spec:?}: {why}; expected {EXAMPLE}"));
    let Some((port, local)) = rest.split_once('=') else { return bad("no '='") };
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p != 0) else {
        return bad("the overlay port is not 1-65535");
    };
    let Some(local) = local_addr(local) else { return bad("the local side is not ADDR:PORT") };
    Ok(Expose { proto, port, local })
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

impl FromStr for LogFormat {
    type Err = UsageError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => usage(format!("invalid log format {s:?}: expected text or json")),
        }
    }
}

/// The tracing filter for `spec`, or an error naming it.
pub fn log_filter(spec: &str) -> Result<tracing_subscriber::EnvFilter, UsageError> {
    tracing_subscriber::EnvFilter::try_new(spec)
        .or_else(|e| usage(format!("invalid log level {spec:?}: {e} (expected e.g. info, debug, or weft=debug,warn)")))
}

/// Which offloads the user allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadWanted {
    /// TUN virtio-net offload (TSO split on read, GRO on write).
    pub tun: bool,
    /// UDP GSO on send.
    pub udp_gso: bool,
    /// UDP GRO on receive.
    pub udp_gro: bool,
}

/// A secret string with a redacted Debug.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// `ADDR/PREFIX` with a prefix of at most 32.
pub(crate) fn split_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, p) = s.split_once('/')?;
    let prefix: u8 = p.parse().ok().filter(|p| *p <= 32)?;
    Some((a.parse().ok()?, prefix))
}

pub(crate) fn proxy_networks(values: &[String]) -> Result<Vec<IpNet>, UsageError> {
    let nets: Vec<IpNet> = values
        .iter()
        .map(|v| {
            let n = IpNet::parse_cidr(v).ok_or_else(|| {
                UsageError(format!(
                    "invalid --proxy-network {v:?}: expected a CIDR such as 192.168.1.0/24 or fd77:1::/64"
                ))
            })?;
            if n.prefix == 0 {
                return usage(format!(
                    "invalid --proxy-network {v:?}: a /0 would route every destination of every member into the tunnel (offer the internet with --exit-node)"
                ));
            }
            if let IpAddr::V6(a) = n.addr
                && (a.is_multicast() || a.is_loopback() || a.is_unicast_link_local() || a.to_ipv4_mapped().is_some())
            {
                return usage(format!(
                    "invalid --proxy-network {v:?}: multicast, loopback, link-local and IPv4-mapped prefixes cannot be proxied"
                ));
            }
            // Keep the network address, whatever host bits were given.
            Ok(n.network())
        })
        .collect::<Result<_, _>>()?;
    for (i, a) in nets.iter().enumerate().filter(|(_, n)| n.addr.is_ipv6()) {
        if let Some(b) = nets[..i].iter().find(|b| b.overlaps(*a)) {
            return usage(format!("--proxy-network {a} overlaps --proxy-network {b}: give each subnet once"));
        }
    }
    Ok(nets)
}
