//! Configuration: the TOML file, the environment and the flags merged into one typed
//! [`NodeConfig`]. Parse, don't validate: nothing past this module sees a raw string.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use weft_core::crypto::Cipher;
use weft_datapath::transport::{Endpoint, Proto};

use crate::config::args::UpArgs;
pub use crate::config::values::UsageError;
use crate::config::values::{
    Expose, Forward, HealthTarget, IpNet, Ipv4Net, Ipv6Overlay, OffloadWanted, PeerUri, Secret, check_private,
    parse_expose, parse_forward, parse_ipv6, proxy_networks, usage,
};

pub mod args;
pub mod domain;
pub mod membership;
pub mod policy;
pub mod portal;
pub mod secret;
pub mod values;

/// A key that takes one string or a list of them (`authority`).
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Self::None => true,
            Self::One(_) => false,
            Self::Many(v) => v.is_empty(),
        }
    }

    fn take(&mut self) -> Vec<String> {
        match std::mem::take(self) {
            Self::None => Vec::new(),
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// The config file. Same keys as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub(crate) network_name: Option<String>,
    pub(crate) network_secret: Option<Secret>,
    network_secret_next: Option<Secret>,
    ipv4: Option<String>,
    #[serde(default)]
    pub(crate) authority: OneOrMany,
    pub(crate) certificate: Option<String>,
    /// An invite token (`weft up --join`).
    pub(crate) join: Option<String>,
    authority_key: Option<PathBuf>,
    policy: Option<PathBuf>,
    #[serde(default)]
    listen: Vec<String>,
    #[serde(default)]
    pub(crate) peer: Vec<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    max_connections: Option<usize>,
    cipher: Option<String>,
    threads: Option<usize>,
    dev_name: Option<String>,
    mtu: Option<u16>,
    control: Option<PathBuf>,
    admin_group: Option<String>,
    pub(crate) state_dir: Option<PathBuf>,
    pub(crate) hostname: Option<String>,
    no_offload: Option<bool>,
    no_tun_offload: Option<bool>,
    no_udp_gso: Option<bool>,
    no_udp_gro: Option<bool>,
    pin: Option<bool>,
    latency_first: Option<bool>,
    accept_wide_subnets: Option<bool>,
    lan_discovery: Option<bool>,
    no_port_mapping: Option<bool>,
    dhcp: Option<bool>,
    ipv6: Option<String>,
    no_ipv6: Option<bool>,
    #[serde(default)]
    proxy_network: Vec<String>,
    no_snat_subnet_routes: Option<bool>,
    router_priority: Option<u8>,
    proxy_health: Option<String>,
    wg_portal: Option<String>,
    wg_portal_net: Option<String>,
    wg_portal_endpoint: Option<String>,
    log_level: Option<String>,
    log_format: Option<String>,
    metrics: Option<String>,
    magic_dns: Option<bool>,
    dns_domain: Option<String>,
    exit_node: Option<bool>,
    exit_allow_lan: Option<bool>,
    use_exit_node: Option<String>,
    exit_fallback: Option<bool>,
    accept_dns: Option<bool>,
    no_tun: Option<bool>,
    socks5: Option<String>,
    socks5_auth: Option<Secret>,
    #[serde(default)]
    forward: Vec<String>,
    #[serde(default)]
    expose: Vec<String>,
}

impl FileConfig {
    /// Reads and parses a config file. A file that holds the network secret must be
    /// private to its owner (like ssh's keys): otherwise it is refused, naming the
    /// `chmod` that fixes it.
    pub fn load(path: &Path) -> Result<Self, UsageError> {
        let text = std::fs::read_to_string(path)
            .or_else(|e| usage(format!("cannot read config file {}: {e}", path.display())))?;
        let file: Self = toml::from_str(&text).or_else(|e: toml::de::Error| {
            usage(format!("bad config file {}: {}", path.display(), e.message().trim()))
        })?;
        if file.network_secret.as_ref().is_some_and(|s| !s.0.is_empty())
            || file.network_secret_next.as_ref().is_some_and(|s| !s.0.is_empty())
        {
            check_private(path, "config file", "holds network-secret and")?;
        }
        Ok(file)
    }
}

/// The listeners a node opens when none are configured.
pub const DEFAULT_LISTENERS: [&str; 5] =
    ["udp://[::]:11010", "tcp://[::]:11010", "ws://[::]:11011", "quic://[::]:11012", "wss://[::]:11012"];

/// The default listeners: dual-stack `[::]` (IPv6 and IPv4 peers alike), or the IPv4
/// wildcard on a host without IPv6.
pub fn default_listeners() -> Vec<String> {
    let v6 = std::net::UdpSocket::bind("[::]:0").is_ok();
    DEFAULT_LISTENERS.iter().map(|s| if v6 { (*s).to_owned() } else { s.replace("[::]", "0.0.0.0") }).collect()
}

/// Everything `weft up` needs, typed.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Network name.
    pub network_name: String,
    /// Network secret (never logged).
    pub network_secret: Secret,
    /// `network-secret-next`: the secret accepted beside it while it rotates.
    pub network_secret_next: Option<Secret>,
    /// Overlay address.
    pub ipv4: Ipv4Net,
    /// IPv6 overlay address.
    pub ipv6: Ipv6Overlay,
    /// Listeners, at most one per transport (the path of a ws:// listener is
    /// ignored: it accepts any).
    pub listeners: Vec<Endpoint>,
    /// `--tls-cert` and `--tls-key` for wss:// and quic:// listeners (a self-signed
    /// pair in the state directory when absent).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Connections each listener accepts at most.
    pub max_connections: usize,
    /// Peers to dial.
    pub peers: Vec<PeerUri>,
    /// Data cipher.
    pub cipher: Cipher,
    /// Pipelines.
    pub threads: usize,
    /// TUN name.
    pub dev_name: String,
    /// TUN MTU.
    pub mtu: u16,
    /// Control socket.
    pub control: PathBuf,
    /// Group whose members may change the node through the control socket.
    pub admin_group: String,
    /// State directory.
    pub state_dir: PathBuf,
    /// Announced host name.
    pub hostname: String,
    /// The authorities whose certificates admit members (empty: none, the secret
    /// admits).
    pub authorities: Vec<weft_core::cert::AuthorityId>,
    /// This node's member certificate, in a network with an authority.
    pub certificate: Option<weft_core::cert::Certificate>,
    /// `--authority-key`: the authority's private key file; this member issues
    /// certificates to machines with an invite.
    pub authority_key: Option<PathBuf>,
    /// `policy`: the access policy file, read and checked.
    pub policy: Option<policy::Loaded>,
    /// Offloads wanted (each is probed at start-up and may still be refused).
    pub offload: OffloadWanted,
    /// Pin pipeline threads to cores.
    pub pin: bool,
    /// Route by latency rather than hop count.
    pub latency_first: bool,
    /// Route other members' subnets shorter than /8.
    pub accept_wide_subnets: bool,
    /// Subnets this node proxies for the mesh, either family.
    pub proxy_networks: Vec<IpNet>,
    /// Translate members' sources into the proxied subnets to this node's own address
    /// (not with `--no-snat-subnet-routes`).
    pub snat_subnet_routes: bool,
    /// `--router-priority`: preference among routers of one subnet (higher wins).
    pub router_priority: u8,
    /// `--proxy-health`: what is checked before the subnets are announced.
    pub proxy_health: Option<HealthTarget>,
    /// Multicast LAN discovery.
    pub lan_discovery: bool,
    /// Ask the router to map our UDP port (not with `--no-port-mapping`).
    pub port_mapping: bool,
    /// `--dhcp`: the range to pick the overlay address from (`ipv4` is then replaced
    /// by the pick at start-up).
    pub dhcp: Option<Ipv4Net>,
    /// Rekey interval.
    pub rekey_after: std::time::Duration,
    /// `--wg-portal`: a WireGuard endpoint for stock clients.
    pub wg_portal: Option<portal::PortalConfig>,
    /// `log-level` of the config file (the flag, WEFT_LOG_LEVEL and RUST_LOG win).
    pub log_level: Option<String>,
    /// `log-format` of the config file (the flag and WEFT_LOG_FORMAT win).
    pub log_format: Option<String>,
    /// `--metrics`: where to serve Prometheus metrics.
    pub metrics: Option<SocketAddr>,
    /// The Magic DNS domain, or `None` with `--no-magic-dns`.
    pub dns_domain: Option<String>,
    /// `--accept-dns`: register Magic DNS with systemd-resolved.
    pub accept_dns: bool,
    /// `--exit-node`: offer the internet to members.
    pub exit_node: bool,
    /// `--exit-allow-lan`: as an exit, also forward to private and local networks.
    pub exit_allow_lan: bool,
    /// `--use-exit-node`: the member to send the default route to.
    pub use_exit: Option<String>,
    /// `--exit-fallback`: without a reachable exit, use this host's own default route.
    pub exit_fallback: bool,
    /// `--no-tun`: a userspace network stack instead of a TUN device.
    pub no_tun: bool,
    /// `--socks5`: where to serve SOCKS5.
    pub socks5: Option<SocketAddr>,
    /// `--socks5-auth`: the user name and password SOCKS5 clients must give.
    pub socks5_auth: Option<(String, Secret)>,
    /// `--forward`: local ports forwarded to members.
    pub forwards: Vec<Forward>,
    /// `--expose`: overlay ports served by local services.
    pub exposes: Vec<Expose>,
}

impl NodeConfig {
    /// Merges flags (which already include the environment) over the file over defaults.
    pub fn resolve(args: &UpArgs) -> Result<Self, UsageError> {
        let mut file = match &args.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        let file = &mut file;
        let (network_name, secret) = network(args, file)?;
        let membership::Trust { network_secret_next, authorities, certificate, authority_key, policy } =
            membership::trust(args, file, &secret)?;
        let (ipv4, dhcp, ipv6) = addresses(args, file)?;
        let (listeners, tls, max_connections) = listening(args, file)?;
        let peer_uris = if args.peer.is_empty() { std::mem::take(&mut file.peer) } else { args.peer.clone() };
        let peers = peer_uris.iter().map(|p| p.parse()).collect::<Result<Vec<PeerUri>, _>>()?;
        let cipher = match args.cipher.clone().or_else(|| file.cipher.take()) {
            Some(c) => c.parse::<Cipher>().map_err(|e| UsageError(format!("invalid --cipher: {e}")))?,
            None => Cipher::default(),
        };
        let (threads, dev_name, dev_name_given, mtu) = device(args, file)?;
        let hostname = args.hostname.clone().or_else(|| file.hostname.take()).unwrap_or_else(system_hostname);
        if hostname.chars().any(char::is_control) {
            return usage(format!("invalid --hostname {hostname:?}: control characters are not allowed"));
        }
        if let Some(c) = &certificate {
            membership::within_certificate(c.body(), ipv4, dhcp.is_some(), &ipv6, &hostname)?;
        }
        let admin_group = admin_group(args, file)?;
        let (proxy_networks, wg_portal) = subnets_and_portal(args, file, ipv4, ipv6, &listeners)?;
        let (router_priority, proxy_health) = router(args, file, &proxy_networks)?;
        let (exit_node, use_exit, exit_allow_lan, exit_fallback) = exit(args, file, &hostname)?;
        if let Some(c) = &certificate {
            membership::offers_within_certificate(c.body(), &proxy_networks, exit_node, wg_portal.is_some())?;
        }
        let dns_domain = magic_dns(args, file, &network_name)?;
        let (no_tun, socks5, socks5_auth, forwards, exposes) = userspace(args, file)?;
        let tun_only = [
            ("--dev-name", dev_name_given),
            ("--proxy-network", !proxy_networks.is_empty()),
            ("--exit-node", exit_node),
            ("--use-exit-node", use_exit.is_some()),
            ("--wg-portal", wg_portal.is_some()),
            ("--accept-dns", args.accept_dns || file.accept_dns == Some(true)),
            ("--pin", args.pin || file.pin == Some(true)),
        ];
        let userspace_only =
            [("--socks5", socks5.is_some()), ("--forward", !forwards.is_empty()), ("--expose", !exposes.is_empty())];
        tun_or_not(no_tun, &tun_only, &userspace_only)?;

        // One pipeline feeds the userspace stack (it is one thread itself).
        let threads = if no_tun { 1 } else { threads };
        Ok(Self {
            no_tun,
            socks5,
            socks5_auth,
            forwards,
            exposes,
            network_name,
            network_secret: secret,
            network_secret_next,
            authorities,
            certificate,
            authority_key,
            policy,
            ipv4,
            ipv6,
            listeners,
            tls,
            max_connections,
            peers,
            cipher,
            threads,
            dev_name,
            mtu,
            control: args.control.clone().or_else(|| file.control.take()).unwrap_or_else(args::default_control),
            admin_group,
            state_dir: args.state_dir.clone().or_else(|| file.state_dir.take()).unwrap_or_else(args::default_state_dir),
            hostname,
            offload: offloads(args, file),
            pin: args.pin || file.pin.unwrap_or(false),
            latency_first: args.latency_first || file.latency_first.unwrap_or(false),
            accept_wide_subnets: args.accept_wide_subnets || file.accept_wide_subnets.unwrap_or(false),
            lan_discovery: args.lan_discovery || file.lan_discovery.unwrap_or(false),
            port_mapping: !(args.no_port_mapping || file.no_port_mapping.unwrap_or(false)),
            dhcp,
            proxy_networks,
            snat_subnet_routes: !(args.no_snat_subnet_routes || file.no_snat_subnet_routes.unwrap_or(false)),
            router_priority,
            proxy_health,
            rekey_after: rekey_after(args)?,
            wg_portal,
            log_level: file.log_level.take(),
            log_format: file.log_format.take(),
            metrics: metrics(args, file)?,
            dns_domain,
            exit_node,
            exit_allow_lan,
            use_exit,
            exit_fallback,
            accept_dns: args.accept_dns || file.accept_dns.unwrap_or(false),
        })
    }
}

/// `--admin-group`: the group whose members may change the node (default `weft-admin`).
fn admin_group(args: &UpArgs, file: &mut FileConfig) -> Result<String, UsageError> {
    let group = args
        .admin_group
        .clone()
        .or_else(|| file.admin_group.take())
        .unwrap_or_else(|| crate::control::access::ADMIN_GROUP.into());
    if group.is_empty() || group.contains([':', '\n']) {
        return usage(format!("invalid --admin-group {group:?}: expected a group name"));
    }
    Ok(group)
}

/// Refuses a TUN-only flag with `--no-tun`, and a userspace-only one without it
/// (each list: the flag, and whether it was given).
fn tun_or_not(no_tun: bool, tun_only: &[(&str, bool)], userspace_only: &[(&str, bool)]) -> Result<(), UsageError> {
    if no_tun {
        if let Some((flag, _)) = tun_only.iter().find(|(_, set)| *set) {
            return usage(format!("{flag} needs a TUN device, which --no-tun leaves out"));
        }
    } else if let Some((flag, _)) = userspace_only.iter().find(|(_, set)| *set) {
        return usage(format!("{flag} needs --no-tun (with a TUN device, local programs reach the mesh directly)"));
    }
    Ok(())
}

/// Which offloads the user allows (all on unless switched off).
fn offloads(args: &UpArgs, file: &FileConfig) -> OffloadWanted {
    let all_off = args.no_offload || file.no_offload.unwrap_or(false);
    OffloadWanted {
        tun: !(all_off || args.no_tun_offload || file.no_tun_offload.unwrap_or(false)),
        udp_gso: !(all_off || args.no_udp_gso || file.no_udp_gso.unwrap_or(false)),
        udp_gro: !(all_off || args.no_udp_gro || file.no_udp_gro.unwrap_or(false)),
    }
}

/// `--rekey-after` (a flag only): the responder rekeys at 1.25x, keys are refused
/// after 180 s.
fn rekey_after(args: &UpArgs) -> Result<std::time::Duration, UsageError> {
    match args.rekey_after.unwrap_or(120) {
        s @ 1..=140 => Ok(std::time::Duration::from_secs(s)),
        s => usage(format!("--rekey-after {s}: must be 1 to 140 seconds (keys expire after 180 s)")),
    }
}

/// The `/metrics` address, if any.
fn metrics(args: &UpArgs, file: &mut FileConfig) -> Result<Option<SocketAddr>, UsageError> {
    match args.metrics.clone().or_else(|| file.metrics.take()) {
        Some(m) => Ok(Some(
            m.parse()
                .or_else(|_| usage(format!("invalid --metrics {m:?}: expected ADDR:PORT such as 127.0.0.1:9108")))?,
        )),
        None => Ok(None),
    }
}

/// The network: name and secret.
fn network(args: &UpArgs, file: &mut FileConfig) -> Result<(String, Secret), UsageError> {
    let network_name = args
        .network_name
        .clone()
        .or_else(|| file.network_name.take())
        .ok_or_else(|| UsageError("missing network name: pass --network-name NAME".into()))?;
    if network_name.is_empty() || network_name.len() > 64 {
        return usage(format!("invalid network name {network_name:?}: 1 to 64 bytes"));
    }
    let secret = args.network_secret.clone().or_else(|| file.network_secret.take()).ok_or_else(|| {
        UsageError("missing network secret: set WEFT_NETWORK_SECRET, pass --network-secret, or put network-secret in the config file".into())
    })?;
    if secret.0.is_empty() {
        return usage("invalid network secret: it is empty");
    }
    Ok((network_name, secret))
}

/// The overlay addresses: IPv4 (or a --dhcp range) and IPv6.
fn addresses(args: &UpArgs, file: &mut FileConfig) -> Result<(Ipv4Net, Option<Ipv4Net>, Ipv6Overlay), UsageError> {
    let dhcp_wanted = args.dhcp || file.dhcp.unwrap_or(false);
    let static_addr = args.ipv4.clone().or_else(|| file.ipv4.take());
    let (ipv4, dhcp) = match (static_addr, dhcp_wanted) {
        (Some(a), false) => (a.parse::<Ipv4Net>()?, None),
        (Some(a), true) => return usage(format!("-i {a} and --dhcp exclude each other: pick one")),
        (None, true) => {
            // The address is picked from the range once the node key is known.
            let range = Ipv4Net { addr: Ipv4Addr::new(10, 126, 126, 0), prefix: 24 };
            (range, Some(range))
        }
        (None, false) => {
            return usage("missing overlay address: pass -i/--ipv4 ADDR/PREFIX (e.g. -i 10.126.126.2/24) or --dhcp");
        }
    };
    let no_ipv6 = args.no_ipv6 || file.no_ipv6.unwrap_or(false);
    let ipv6 = match (args.ipv6.clone().or_else(|| file.ipv6.take()), no_ipv6) {
        (Some(a), true) => return usage(format!("--ipv6 {a} and --no-ipv6 exclude each other: pick one")),
        (Some(a), false) => {
            let (addr, prefix) = parse_ipv6(&a)?;
            Ipv6Overlay::Given(addr, prefix)
        }
        (None, true) => Ipv6Overlay::Off,
        (None, false) => Ipv6Overlay::Derived,
    };
    Ok((ipv4, dhcp, ipv6))
}

/// A TLS certificate and key file.
type TlsFiles = (PathBuf, PathBuf);

/// Listeners (one per transport), their TLS identity, and the connection cap.
fn listening(args: &UpArgs, file: &mut FileConfig) -> Result<(Vec<Endpoint>, Option<TlsFiles>, usize), UsageError> {
    let mut listen_uris = if args.listen.is_empty() { std::mem::take(&mut file.listen) } else { args.listen.clone() };
    if listen_uris.is_empty() {
        listen_uris = default_listeners();
    }
    let mut listeners: Vec<Endpoint> = Vec::new();
    for l in &listen_uris {
        let ep = l.parse::<PeerUri>()?.resolve()?;
        if listeners.iter().any(|e| e.proto == ep.proto) {
            return usage(format!("extra listener {l:?}: one listener per transport"));
        }
        listeners.push(ep);
    }
    let tls = match (
        args.tls_cert.clone().or_else(|| file.tls_cert.take()),
        args.tls_key.clone().or_else(|| file.tls_key.take()),
    ) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return usage("--tls-cert and --tls-key go together: give both or neither"),
    };
    if tls.is_some() && !listeners.iter().any(|l| matches!(l.proto, Proto::Wss | Proto::Quic)) {
        return usage("--tls-cert and --tls-key serve wss:// and quic:// listeners, and none is configured");
    }
    let max_connections = match args.max_connections.or_else(|| file.max_connections.take()) {
        Some(0) => return usage("invalid --max-connections 0: need at least one"),
        Some(n) => n,
        None => 256,
    };
    Ok((listeners, tls, max_connections))
}

/// The data plane's shape: pipelines, TUN name (and whether one was given), MTU.
fn device(args: &UpArgs, file: &mut FileConfig) -> Result<(usize, String, bool, u16), UsageError> {
    let threads = match args.threads.or_else(|| file.threads.take()) {
        Some(0) => return usage("invalid --threads 0: need at least one pipeline"),
        Some(n) if n > 64 => return usage(format!("invalid --threads {n}: at most 64")),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(8),
    };
    let dev_name_given = args.dev_name.is_some() || file.dev_name.is_some();
    let dev_name = args.dev_name.clone().or_else(|| file.dev_name.take()).unwrap_or_else(|| "weft0".into());
    if dev_name.is_empty() || dev_name.len() > 15 || dev_name.contains(['/', ' ']) {
        return usage(format!("invalid --dev-name {dev_name:?}: 1 to 15 characters, no '/' or spaces"));
    }
    let mtu = args.mtu.or_else(|| file.mtu.take()).unwrap_or(1420);
    if !(576..=9000).contains(&mtu) {
        return usage(format!("invalid --mtu {mtu}: expected 576 to 9000"));
    }
    Ok((threads, dev_name, dev_name_given, mtu))
}

/// Proxied subnets and the WireGuard portal (whose network is one of them, and whose
/// port no listener may share).
fn subnets_and_portal(
    args: &UpArgs,
    file: &mut FileConfig,
    ipv4: Ipv4Net,
    ipv6: Ipv6Overlay,
    listeners: &[Endpoint],
) -> Result<(Vec<IpNet>, Option<portal::PortalConfig>), UsageError> {
    let proxy_networks =
        proxy_networks(if args.proxy_network.is_empty() { &file.proxy_network } else { &args.proxy_network })?;
    // (IPv4 subnets that overlap the overlay are refused by every member that
    // receives them, and said so in their status.)
    if let Ipv6Overlay::Given(a, p) = ipv6 {
        let o = IpNet { addr: IpAddr::V6(a), prefix: p }.network();
        if let Some(n) = proxy_networks.iter().find(|n| n.overlaps(o)) {
            return usage(format!(
                "--proxy-network {n} overlaps the overlay network {o}: a proxied subnet must lie outside it"
            ));
        }
    }
    let portal_net = args.wg_portal_net.clone().or_else(|| file.wg_portal_net.take());
    let portal_endpoint = args.wg_portal_endpoint.clone().or_else(|| file.wg_portal_endpoint.take());
    let wg_portal = match args.wg_portal.clone().or_else(|| file.wg_portal.take()) {
        Some(listen) => Some(portal::PortalConfig::parse(
            &listen,
            portal_net.as_deref(),
            portal_endpoint.as_deref(),
            ipv4,
            &proxy_networks,
        )?),
        None if portal_net.is_some() || portal_endpoint.is_some() => {
            return usage("--wg-portal-net and --wg-portal-endpoint need --wg-portal udp://ADDR:PORT");
        }
        None => None,
    };
    if let Some(p) = &wg_portal {
        let clash = listeners.iter().find(|l| {
            l.proto == Proto::Udp
                && l.addr.port() == p.listen.port()
                && (l.addr.ip() == p.listen.ip() || l.addr.ip().is_unspecified() || p.listen.ip().is_unspecified())
        });
        if let Some(l) = clash {
            return usage(format!(
                "--wg-portal udp://{} would share the port of the listener {l}: give the portal a port of its own (WireGuard's usual one is 51820)",
                p.listen
            ));
        }
    }
    Ok((proxy_networks, wg_portal))
}

/// Exit node settings: offering one, or using one (not both).
fn exit(
    args: &UpArgs,
    file: &mut FileConfig,
    hostname: &str,
) -> Result<(bool, Option<String>, bool, bool), UsageError> {
    let exit_node = args.exit_node || file.exit_node.unwrap_or(false);
    let use_exit = args.use_exit_node.clone().or_else(|| file.use_exit_node.take());
    if let Some(e) = &use_exit {
        if exit_node {
            return usage("--exit-node and --use-exit-node: a node is an exit or uses one, not both".to_owned());
        }
        if e.trim().is_empty() || e.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return usage(format!("invalid --use-exit-node {e:?}: give a member's host name or node id"));
        }
        let names: Vec<&str> = e.split(',').collect();
        if names.iter().any(|n| n.is_empty()) {
            return usage(format!("invalid --use-exit-node {e:?}: an empty name in the list"));
        }
        if names.len() > 1 && names.iter().any(|n| n.eq_ignore_ascii_case("auto")) {
            return usage(format!("invalid --use-exit-node {e:?}: `auto` stands alone, not in a list"));
        }
        if let Some(n) = names.iter().find(|n| n.eq_ignore_ascii_case(hostname)) {
            return usage(format!("--use-exit-node {n:?} names this node (its host name); name another member"));
        }
    }
    let exit_allow_lan = args.exit_allow_lan || file.exit_allow_lan.unwrap_or(false);
    if exit_allow_lan && !exit_node {
        return usage("--exit-allow-lan (exit-allow-lan = true) needs --exit-node".to_owned());
    }
    let exit_fallback = args.exit_fallback || file.exit_fallback.unwrap_or(false);
    if exit_fallback && use_exit.is_none() {
        return usage("--exit-fallback needs --use-exit-node".to_owned());
    }
    Ok((exit_node, use_exit, exit_allow_lan, exit_fallback))
}

/// `--router-priority` and `--proxy-health`: both only for a node proxying subnets.
fn router(
    args: &UpArgs,
    file: &mut FileConfig,
    proxy_networks: &[IpNet],
) -> Result<(u8, Option<HealthTarget>), UsageError> {
    let priority = args.router_priority.or(file.router_priority);
    let health = args.proxy_health.clone().or_else(|| file.proxy_health.take());
    if proxy_networks.is_empty() {
        if priority.is_some() {
            return usage("--router-priority (router-priority) needs --proxy-network".to_owned());
        }
        if health.is_some() {
            return usage("--proxy-health (proxy-health) needs --proxy-network".to_owned());
        }
    }
    let health = health.as_deref().map(HealthTarget::parse).transpose()?;
    Ok((priority.unwrap_or(weft_peers::topology::DEFAULT_PRIORITY), health))
}

/// The Magic DNS domain (`None`: off).
fn magic_dns(args: &UpArgs, file: &mut FileConfig, network_name: &str) -> Result<Option<String>, UsageError> {
    let dns_off = args.no_magic_dns || file.magic_dns == Some(false);
    if dns_off && (args.accept_dns || file.accept_dns == Some(true)) {
        return usage("--accept-dns needs Magic DNS, which --no-magic-dns (magic-dns = false) turns off");
    }
    if dns_off && (args.dns_domain.is_some() || file.dns_domain.is_some()) {
        return usage("--dns-domain needs Magic DNS, which --no-magic-dns (magic-dns = false) turns off");
    }
    let dns_domain = if dns_off {
        None
    } else {
        match args.dns_domain.clone().or_else(|| file.dns_domain.take()) {
            Some(d) => Some(domain::parse_domain(&d).map_err(UsageError)?),
            None => Some(domain::default_domain(network_name)),
        }
    };
    Ok(dns_domain)
}

/// What the no-TUN node offers local programs: SOCKS5, forwards, exposes.
type Userspace = (bool, Option<SocketAddr>, Option<(String, Secret)>, Vec<Forward>, Vec<Expose>);

/// `--no-tun` and its services.
fn userspace(args: &UpArgs, file: &mut FileConfig) -> Result<Userspace, UsageError> {
    let no_tun = args.no_tun || file.no_tun.unwrap_or(false);
    let socks5 = match args.socks5.clone().or_else(|| file.socks5.take()) {
        Some(a) => Some(
            a.parse::<SocketAddr>()
                .or_else(|_| usage(format!("invalid --socks5 {a:?}: expected ADDR:PORT such as 127.0.0.1:1080")))?,
        ),
        None => None,
    };
    let socks5_auth = match args.socks5_auth.clone().or_else(|| file.socks5_auth.take()) {
        Some(a) => match a.0.split_once(':') {
            Some((u, p)) if (1..=255).contains(&u.len()) && (1..=255).contains(&p.len()) => {
                Some((u.to_owned(), Secret(p.to_owned())))
            }
            _ => return usage("invalid --socks5-auth: expected USER:PASSWORD, each 1 to 255 bytes"),
        },
        None => None,
    };
    if socks5_auth.is_some() && socks5.is_none() {
        return usage("--socks5-auth needs --socks5 ADDR:PORT");
    }
    let forward_specs = if args.forward.is_empty() { &file.forward } else { &args.forward };
    let forwards = forward_specs.iter().map(|f| parse_forward(f)).collect::<Result<Vec<_>, _>>()?;
    let expose_specs = if args.expose.is_empty() { &file.expose } else { &args.expose };
    let exposes = expose_specs.iter().map(|e| parse_expose(e)).collect::<Result<Vec<_>, _>>()?;
    for (i, e) in exposes.iter().enumerate() {
        if exposes[..i].iter().any(|o| o.proto == e.proto && o.port == e.port) {
            return usage(format!("--expose {e}: overlay port {}/{} is exposed twice", e.port, e.proto));
        }
    }
    Ok((no_tun, socks5, socks5_auth, forwards, exposes))
}

pub(crate) fn system_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests;
