//! The steps of a node's start, in the order [`super::run`] takes them. Each opens or
//! checks one thing and fails with an error that names it.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rand::SeedableRng;
use tracing::{info, warn};
use weft_core::crypto::Cipher;
use weft_core::handshake::{Hello, Params, Protocol, Psk, StaticKey, caps};
use weft_datapath::pipeline::{self, Device, PipelineConfig, PipelineStats, Shared};
use weft_datapath::transport::udp;
use weft_datapath::transport::{Connections, Egress, Endpoint, Proto};
use weft_datapath::tun::{Tun, TunConfig};
use weft_peers::NodeId;
use weft_peers::node::{Config, Node, Timers};

use super::settings::{engine_proxied, exit_offer, resolve_ipv6};
use super::{CONNS_QUEUE, state};
use crate::config::NodeConfig;
use crate::config::domain::default_domain;
use crate::config::values::{Ipv4Net, Ipv6Overlay, UsageError};
use crate::host::interfaces::local_networks;
use crate::host::net::{configure_ipv6, enable_forwarding};
use crate::notun::stack::Stack;
use crate::notun::{Destinations, Userspace};
use crate::services::dns::Zone;
use crate::services::exit;

/// The scheduling priority (nice) Weft runs at: a packet that arrives wakes its
/// thread ahead of the programs that make bulk traffic, as the kernel's own network
/// processing (softirq) would. On two busy cores this halves a ping's wait beside a
/// download (bench/RESULTS.md, latency).
pub(super) const NICE: libc::c_int = -10;

/// Raises this thread's priority to [`NICE`] before any other thread starts (they
/// inherit it). Without CAP_SYS_NICE (and no `Nice=` from systemd) it says so and
/// runs at the priority it has.
pub(super) fn priority() {
    if let Err(e) = pipeline::raise_priority(NICE) {
        info!(
            nice = NICE,
            error = %e,
            "cannot raise the data path's priority (needs CAP_SYS_NICE, or Nice= in the unit): packets wait longer behind busy programs"
        );
    }
}

/// A non-root node keeping its state or socket under the `/tmp/weft-UID` fallback
/// needs that directory to be its own, mode 0700.
pub(super) fn private_dirs(cfg: &NodeConfig) -> Result<()> {
    let fallback = crate::config::args::fallback_dir();
    if !crate::control::access::is_root()
        && (cfg.state_dir.starts_with(&fallback) || cfg.control.starts_with(&fallback))
    {
        state::private_dir(&fallback)?;
    }
    Ok(())
}

/// The node key (made on first start), and what follows from it: the IPv6 overlay
/// address, a `--dhcp` IPv4 address, and the check that `--use-exit-node` does not name
/// this node.
pub(super) fn identity(cfg: &mut NodeConfig) -> Result<(StaticKey, Option<(Ipv6Addr, u8)>)> {
    let key = state::load_or_create_key(&cfg.state_dir)?;
    let id = NodeId::from_public(&key.public);
    if let Some(c) = &cfg.certificate {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        c.check(&cfg.authorities, &cfg.network_name, &key.public, now).map_err(|r| {
            UsageError(format!(
                "--certificate cannot admit this node: {r} (this node's id is {}; `weft cert show` reads the certificate)",
                state::hex(&key.public)
            ))
        })?;
    }
    if let Some(e) = &cfg.use_exit {
        let hex = id.to_string();
        if e.len() >= 6 && hex.starts_with(&e.to_ascii_lowercase()) {
            return Err(UsageError(format!(
                "--use-exit-node {e:?} names this node (its node id {hex}); name another member"
            ))
            .into());
        }
        // Weft's own sockets (all opened after this) keep to the underlay.
        weft_datapath::transport::set_socket_mark(crate::host::exit_route::TABLE);
    }
    let ipv6 = resolve_ipv6(cfg, id)?;
    if let Some(range) = cfg.dhcp {
        let addr = weft_peers::pick_address(range.addr, range.prefix, id, &Default::default())
            .context("the --dhcp range has no host addresses")?;
        cfg.ipv4 = Ipv4Net { addr, prefix: range.prefix };
        info!(%addr, "picked overlay address (--dhcp)");
    }
    if cfg.cipher == Cipher::AuthOnly {
        warn!("cipher none: tunnel data is authenticated but travels unencrypted; anyone on the path can read it");
    }
    Ok((key, ipv6))
}

/// The data plane's devices: the TUN's queues, or the userspace stack's port.
pub(super) struct Devices {
    /// One per pipeline.
    pub(super) queues: Vec<Arc<Device>>,
    /// Whether the TUN does virtio-net offloads.
    pub(super) tun_offload: bool,
    /// The userspace stack (`--no-tun`).
    pub(super) stack: Option<Stack>,
}

/// Opens the TUN with its addresses (an IPv6 address it cannot take turns a derived
/// IPv6 overlay off: `ipv6` becomes `None`), or starts the userspace stack.
pub(super) fn devices(cfg: &NodeConfig, ipv6: &mut Option<(Ipv6Addr, u8)>) -> Result<Devices> {
    if cfg.no_tun {
        let mut addrs = vec![(IpAddr::V4(cfg.ipv4.addr), cfg.ipv4.prefix)];
        addrs.extend(ipv6.map(|(a, p)| (IpAddr::V6(a), p)));
        let (stack, port) = Stack::start(&addrs, cfg.mtu).context("cannot start the userspace network stack")?;
        info!("no TUN: a userspace network stack holds the overlay addresses");
        return Ok(Devices { queues: vec![Arc::new(Device::User(port))], tun_offload: false, stack: Some(stack) });
    }
    let tun = Tun::open(&TunConfig {
        name: cfg.dev_name.clone(),
        ipv4: cfg.ipv4.addr,
        prefix: cfg.ipv4.prefix,
        mtu: cfg.mtu,
        queues: cfg.threads,
        offload: cfg.offload.tun,
    })?;
    match *ipv6 {
        Some((a, p)) => match configure_ipv6(&cfg.dev_name, a, p) {
            Ok(()) => info!(addr = %format!("{a}/{p}"), "IPv6 overlay address"),
            Err(e) if cfg.ipv6 == Ipv6Overlay::Derived => {
                warn!(error = %e, "cannot give the TUN an IPv6 address: the overlay is IPv4 only");
                *ipv6 = None;
            }
            Err(e) => bail!("cannot give {} its IPv6 overlay address {a}/{p}: {e}", cfg.dev_name),
        },
        None => {
            // An IPv4-only overlay: without this the kernel's IPv6 chatter (router
            // solicitations) on the TUN would show up as drops.
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", cfg.dev_name), "1");
        }
    }
    let tun_offload = tun.offload;
    Ok(Devices { queues: tun.queues.into_iter().map(|q| Arc::new(Device::Tun(q))).collect(), tun_offload, stack: None })
}

/// The pipelines' UDP sockets and the offloads the kernel granted them.
pub(super) struct Udp {
    /// One per pipeline (SO_REUSEPORT), all on `bound`.
    pub(super) socks: Vec<Arc<UdpSocket>>,
    /// Their address.
    pub(super) bound: SocketAddr,
    /// UDP GSO on send.
    pub(super) gso: bool,
    /// UDP GRO on every socket.
    pub(super) gro: bool,
    /// UDP GRO per socket.
    pub(super) gro_per_socket: Vec<bool>,
}

/// Binds the UDP sockets (without a `udp://` listener they still carry outgoing UDP,
/// from an ephemeral port) and probes every offload: a refusal falls back and is
/// logged, never fatal.
pub(super) fn udp(cfg: &NodeConfig, tun_offload: bool) -> Result<Udp> {
    let listener = cfg.listeners.iter().find(|l| l.proto == Proto::Udp).copied();
    let bind = listener.map_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)), |l| l.addr);
    let socks = udp::bind_reuseport(bind, cfg.threads, Duration::from_millis(500))
        .with_context(|| format!("cannot listen on udp://{bind}"))?;
    let bound = socks[0].local_addr().context("UDP socket has no address")?;
    let gso = cfg.offload.udp_gso && udp::probe_gso(&socks[0]);
    let gro_per_socket: Vec<bool> = socks.iter().map(|s| cfg.offload.udp_gro && udp::enable_gro(s)).collect();
    let gro = cfg.offload.udp_gro && gro_per_socket.iter().all(|g| *g);
    for (what, wanted, got) in [
        ("tun", cfg.offload.tun && !cfg.no_tun, tun_offload),
        ("udp-gso", cfg.offload.udp_gso, gso),
        ("udp-gro", cfg.offload.udp_gro, gro),
    ] {
        match (wanted, got) {
            (true, true) => info!(offload = what, "offload on"),
            (true, false) => warn!(offload = what, "offload refused by the kernel; running without it"),
            (false, _) => info!(offload = what, "offload switched off by configuration"),
        }
    }
    // The runtime keeps every socket (not a duplicate descriptor), so a reload can
    // move them all to another port with `udp::replace`.
    Ok(Udp { socks: socks.into_iter().map(Arc::new).collect(), bound, gso, gro, gro_per_socket })
}

/// The rules a node put in the host's nftables, removed when dropped.
pub(super) struct HostRules {
    _exit: exit::Guard,
    _snat: Option<crate::services::snat::Guard>,
}

/// What the host must do for this node to forward: the portal network becomes a
/// proxied subnet, forwarding is switched on for proxied subnets and exits (an exit
/// that cannot forward is refused), and the exit rules and the subnet routes' source
/// translation are set up. The guard undoes the rules when dropped. A no-TUN node has
/// no kernel state to set up.
pub(super) fn host(cfg: &mut NodeConfig, ipv6: Option<(Ipv6Addr, u8)>) -> Result<Option<HostRules>> {
    let snat = snat_subnets(cfg);
    // The kernel forwards between the two TUN devices.
    if let Some(p) = &cfg.wg_portal {
        cfg.proxy_networks.push(p.net.into());
    }
    if cfg.no_tun {
        return Ok(None);
    }
    let v4 = cfg.proxy_networks.iter().any(|n| n.addr.is_ipv4()) || cfg.exit_node;
    let v6 = cfg.proxy_networks.iter().any(|n| n.addr.is_ipv6()) || (cfg.exit_node && ipv6.is_some());
    for (family, wanted) in [(false, v4), (true, v6)] {
        let forwarding = if wanted { enable_forwarding(family) } else { Ok(()) };
        if cfg.exit_node {
            forwarding.map_err(|e| anyhow::anyhow!("--exit-node: {e}"))?;
        }
    }
    let guard = exit::Guard::set_up(
        &cfg.dev_name,
        exit_offer(cfg, ipv6).as_ref(),
        cfg.use_exit.is_some(),
        cfg.exit_fallback,
        ipv6.is_some(),
    )
    .map_err(anyhow::Error::msg)?;
    let snat = if snat.is_empty() {
        // A run with other settings may have left its table.
        crate::services::snat::withdraw(&cfg.dev_name);
        None
    } else {
        Some(crate::services::snat::Guard::set_up(&cfg.dev_name, &snat).map_err(anyhow::Error::msg)?)
    };
    Ok(Some(HostRules { _exit: guard, _snat: snat }))
}

/// The subnets whose members' sources this node translates to its own address: the
/// proxied ones (not the portal's network, which is this node's own TUN), unless
/// `--no-snat-subnet-routes`, a no-TUN node, or an exit (which masquerades
/// everything members send out already).
pub(super) fn snat_subnets(cfg: &NodeConfig) -> Vec<(IpAddr, u8)> {
    if !cfg.snat_subnet_routes || cfg.no_tun || cfg.exit_node {
        return Vec::new();
    }
    let portal = cfg.wg_portal.as_ref().map(|p| crate::config::values::IpNet::from(p.net));
    cfg.proxy_networks.iter().filter(|n| Some(**n) != portal).map(|n| n.pair()).collect()
}

/// Binds the `/metrics` listener (at start and on reload alike), warning when it
/// listens beyond loopback.
pub(super) fn bind_metrics(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on --metrics {addr}"))?;
    l.set_nonblocking(true)?;
    info!(%addr, "serving Prometheus metrics at /metrics");
    warn_if_exposed(addr, "--metrics", "read this node's peers, addresses and traffic counters");
    Ok(l)
}

/// Warns, naming who can reach it, when a service meant for this host listens beyond
/// loopback.
pub(super) fn warn_if_exposed(addr: SocketAddr, what: &str, can: &str) {
    if addr.ip().is_loopback() {
        return;
    }
    let who = if addr.ip().is_unspecified() {
        "anyone who can reach any address of this host".to_owned()
    } else {
        format!("anyone who can reach {}", addr.ip())
    };
    warn!(%addr, "{what} listens beyond loopback: {who} can {can}");
}

/// The pipeline threads and what they share with the connections.
pub(super) struct Pipelines {
    /// One per TUN/UDP pipeline.
    pub(super) stats: Vec<Arc<PipelineStats>>,
    /// One per connection RX thread.
    pub(super) links_stats: Vec<Arc<PipelineStats>>,
    /// The connections' side of the data path.
    pub(super) links: Arc<Connections>,
}

/// Starts one pipeline per device queue (TUN ⇄ UDP) and one connection RX thread per queue
/// (what the connections receive, each connection's frames by one of them, in order).
pub(super) fn pipelines(
    cfg: &NodeConfig,
    queues: Vec<Arc<Device>>,
    tun_offload: bool,
    udp: &Udp,
    shared: &Shared,
) -> Result<Pipelines> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (links, inbound) = Connections::sharded(CONNS_QUEUE, cfg.threads);
    let mut stats = Vec::with_capacity(cfg.threads);
    for (i, ((q, s), gro)) in
        queues.iter().zip(udp.socks.iter().cloned()).zip(udp.gro_per_socket.iter().copied()).enumerate()
    {
        let pin = (cfg.pin && cfg.threads <= cores).then_some(i % cores);
        let pcfg = PipelineConfig { mtu: cfg.mtu, offload: tun_offload, udp_gro: gro, pin };
        let st = Arc::new(PipelineStats::default());
        pipeline::spawn(i, q.clone(), s, links.clone(), pcfg, shared.clone(), st.clone())
            .context("cannot start pipeline threads")?;
        stats.push(st);
    }
    let mut links_stats = Vec::with_capacity(inbound.len());
    for (i, (q, inbound)) in queues.into_iter().zip(inbound).enumerate() {
        let pcfg = PipelineConfig { mtu: cfg.mtu, offload: tun_offload, udp_gro: false, pin: None };
        let egress = Egress::new(udp.socks[0].clone(), links.clone(), shared.offload.clone());
        let st = Arc::new(PipelineStats::default());
        pipeline::spawn_connections_rx(i, q, inbound, egress, pcfg, shared.clone(), st.clone())
            .context("cannot start the connection threads")?;
        links_stats.push(st);
    }
    // Relayed frames bound for a stream connection skip the connection threads.
    if let Some(st) = links_stats.first() {
        links.set_forward(Box::new(pipeline::StreamRelay::new(shared.routes.clone(), st.clone())));
    }
    let routes = shared.routes.clone();
    links.set_members(Box::new(move |ep| routes.load().is_neighbour(ep)));
    Ok(Pipelines { stats, links_stats, links })
}

/// The sans-IO engine, configured.
pub(super) fn engine(
    cfg: &NodeConfig,
    key: StaticKey,
    psk: Psk,
    ipv6: Option<(Ipv6Addr, u8)>,
    dial: &[Endpoint],
    epoch: std::time::Instant,
) -> Result<Node> {
    // Records on stream connections and over QUIC: said in the fields protocol 1 reads
    // and, from the same two values, in the capability bits.
    let (gso, gso_quic) = (true, true);
    let capabilities = (if gso { caps::GSO } else { 0 })
        | (if gso_quic { caps::GSO_QUIC } else { 0 })
        | caps::LEAVE
        | caps::PMTU
        | caps::REVOCATIONS
        | (if cfg.authority_key.is_some() { caps::ISSUER } else { 0 })
        | (if cfg.authorities.is_empty() { 0 } else { caps::POLICY });
    let hello = Hello {
        ipv6,
        gso,
        gso_quic,
        protocol: Some(Protocol::ours(capabilities)),
        cert: cfg.certificate.as_ref().map(weft_core::cert::Certificate::to_bytes),
        ..Hello::new(cfg.cipher, cfg.ipv4.addr, cfg.ipv4.prefix, cfg.hostname.clone())
    };
    let config = Config {
        handshake: Params { local: key, psk, network_name: cfg.network_name.clone(), hello },
        dial: dial.to_vec(),
        epoch,
        wall: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default(),
        authorities: cfg.authorities.clone(),
        timers: Timers { rekey_after: cfg.rekey_after, ..Timers::default() },
        endpoints: Vec::new(),
        latency_first: cfg.latency_first,
        proxied: engine_proxied(&cfg.proxy_networks, cfg.exit_node, ipv6.is_some()),
        router_priority: cfg.router_priority,
        mtu: cfg.mtu,
        dynamic: cfg.dhcp.map(|r| (r.addr, r.prefix)),
        accept_wide_subnets: cfg.accept_wide_subnets,
        exit_allow_lan: cfg.exit_allow_lan,
        names: state::load_names(&cfg.state_dir)?,
        use_exit: cfg.use_exit.clone(),
        local_networks: local_networks(&cfg.dev_name),
    };
    let mut node = Node::new(config, Box::new(rand::rngs::StdRng::from_entropy()));
    if let Some(path) = &cfg.authority_key {
        let key = state::load_key(path)?;
        if !cfg.authorities.contains(&key.id()) {
            return Err(UsageError(format!(
                "--authority-key {} holds the key of {}, which is not among --authority",
                path.display(),
                key.id()
            ))
            .into());
        }
        let ledger = state::load_issued(&cfg.state_dir)?;
        if cfg.certificate.as_ref().is_some_and(|c| c.body().issuer) {
            info!(issued = ledger.len(), "this member issues certificates to machines with an invite");
        } else {
            warn!(
                "--authority-key is given but this node's certificate does not mark it an issuer: machines with an invite \
                 will not hand it theirs, and it refuses to issue (sign its certificate with `weft authority sign --issuer`)"
            );
        }
        node.set_issuer(key, ledger);
    }
    // The revocations this node kept: refused from the first handshake on.
    let kept = state::load_revocations(&cfg.state_dir)?;
    if !kept.is_empty() && cfg.authorities.is_empty() {
        warn!(count = kept.len(), "revocations kept in the state directory are not used: this node has no --authority");
    }
    if !cfg.authorities.is_empty() {
        let now = std::time::Instant::now();
        // The signed policy kept from before: in force from the start (the runtime
        // applies it when it reads the engine's first actions), also after an
        // authority rollover until a trusted one arrives.
        if let Some(bytes) = state::load_policy(&cfg.state_dir)?
            && let Err(e) = node.keep_policy(now, bytes)
        {
            warn!("the signed policy kept in the state directory is not used: {e}");
        }
        let count = kept.len();
        let taken = node.keep_revocations(now, kept);
        if count > 0 {
            info!(revocations = taken, "revocations kept in the state directory: refused from the first handshake");
        }
        // The newest certificate seen for each member: an older one stays refused.
        let certs = state::load_certificates(&cfg.state_dir)?;
        let seen = certs.len();
        let taken = node.remember_certificates(certs);
        if taken < seen {
            warn!(
                kept = seen,
                taken, "some kept certificates are not used: not signed by an authority this node trusts"
            );
        }
    }
    Ok(node)
}

/// The TLS identity of wss:// and quic:// listeners (none without one).
pub(super) fn tls(cfg: &NodeConfig) -> Result<Option<weft_datapath::transport::conn::TlsIdentity>> {
    if !cfg.listeners.iter().any(|l| matches!(l.proto, Proto::Wss | Proto::Quic)) {
        return Ok(None);
    }
    Ok(Some(state::load_or_create_tls(&cfg.state_dir, cfg.tls.as_ref())?))
}

/// The WireGuard portal (`--wg-portal`): its device, keys and clients, behind the
/// access policy's firewall.
pub(super) fn portal(
    cfg: &NodeConfig,
    firewall: &Arc<weft_core::firewall::Firewall>,
    epoch: std::time::Instant,
) -> Result<Option<crate::services::portal::Portal>> {
    let Some(p) = &cfg.wg_portal else { return Ok(None) };
    let portal =
        crate::services::portal::Portal::start(p, &cfg.state_dir, &cfg.dev_name, cfg.mtu, firewall.clone(), epoch)?;
    Ok(Some(portal))
}

/// The network secrets in force: one set of handshake MAC keys for the engine, the
/// pipelines and the transports (a rotation changes it for all of them), and the next
/// secret beside the current one while it rotates.
pub(super) fn secrets(engine: &mut Node, shared: &Shared, psk: Psk, next: Option<Psk>) {
    if next.is_some() {
        info!("network-secret-next is set: the next secret is accepted beside the current one");
    }
    engine.share_mac_keys(shared.macs.clone());
    engine.set_secrets(psk, next);
}

/// The access policy file (`--policy`), in force from the first packet: default deny.
pub(super) fn policy(runtime: &mut super::runtime::Runtime) -> Result<()> {
    let policy = runtime.cfg.policy.clone();
    if let Some(p) = &policy {
        info!(policy = %p.path.display(), version = %p.version, rules = p.policy.rules.len(), "access policy in force: default deny");
    }
    runtime.apply_policy(policy).map_err(UsageError)?;
    Ok(())
}

/// Binds every listener; a port in use is fatal, like the UDP one (already bound).
pub(super) fn listeners(
    rt: &tokio::runtime::Runtime,
    connector: &weft_datapath::transport::conn::Connector,
    cfg: &NodeConfig,
    udp_bound: SocketAddr,
) -> Result<Vec<Endpoint>> {
    let mut bound = Vec::with_capacity(cfg.listeners.len());
    for l in &cfg.listeners {
        let addr = match l.proto {
            Proto::Udp => udp_bound,
            _ => rt.block_on(connector.listen(*l))?,
        };
        let ep = Endpoint::new(l.proto, addr);
        info!(listener = %ep, "listening");
        bound.push(ep);
    }
    Ok(bound)
}

/// The no-TUN services on the userspace stack: SOCKS5, forwards and exposes.
pub(super) fn userspace(cfg: &NodeConfig, stack: Stack, shared: &Shared) -> Result<Userspace> {
    let domain = cfg.dns_domain.clone().unwrap_or_else(|| default_domain(&cfg.network_name));
    let dest = Destinations {
        routes: shared.routes.clone(),
        names: Arc::new(arc_swap::ArcSwap::from_pointee(Zone::new(&domain, [], |_| None))),
        nets: Arc::new(arc_swap::ArcSwap::from_pointee(Vec::new())),
    };
    let auth = cfg.socks5_auth.as_ref().map(|(u, p)| (u.clone(), p.0.clone()));
    if let Some(a) = cfg.socks5.filter(|_| auth.is_none()) {
        warn_if_exposed(a, "--socks5 without --socks5-auth", "reach the whole mesh through this node");
    }
    Userspace::bind(stack, dest, cfg.socks5, auth, &cfg.forwards, &cfg.exposes)
}
