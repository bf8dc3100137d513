//! The node runtime: the only place that owns tokio tasks. It opens the TUN and the
//! sockets, starts the pipeline threads, feeds the sans-IO engine and carries out its
//! actions, and serves the control socket.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arc_swap::ArcSwap;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tracing::{info, warn};
use weft_core::admission::MacKeys;
use weft_core::crypto::Cipher;
use weft_core::handshake::{Hello, Params, Psk};
use weft_core::route::RouteSnapshot;
use weft_core::stats::DropCounters;
use weft_datapath::pipeline::{self, PipelineConfig, PipelineStats, Shared, TX_HEADROOM};
use weft_datapath::transport::conn::Connector;
use weft_datapath::transport::udp::{self, Offload};
use weft_datapath::transport::{Egress, Endpoint, Links, Proto};
use weft_datapath::tun::{Tun, TunConfig};
use weft_peers::NodeId;
use weft_peers::node::{Config, Node, Timers};

use crate::config::NodeConfig;
use crate::config::args::UpArgs;
use crate::config::values::Ipv6Overlay;
use crate::host::interfaces::{local_endpoints, local_networks};
use crate::host::net::{NetConfig, configure_ipv6, enable_forwarding};
use runtime::{QueueSink, Runtime};
use settings::{engine_proxied, exit_offer, resolve_ipv6};

mod reload;
mod requests;
mod runtime;
mod settings;
pub mod state;
mod status;

/// Depth of the data plane -> control plane queue of authenticated events
/// (confirmations, control messages, path reports).
const CONTROL_QUEUE: usize = 1024;
/// Depth of the queue of handshake datagrams (mac1 already checked). Separate, so
/// that a flood of handshakes never costs an authenticated event its place.
const HANDSHAKE_QUEUE: usize = 256;
/// Received batches waiting for the links RX thread.
const LINKS_QUEUE: usize = 256;

/// What a live reload needs: the command line `weft up` started with (its flags win
/// over the file again), and whether a flag or RUST_LOG set the log level (then the
/// file's is not applied).
pub struct Reloadable {
    /// The `weft up` arguments.
    pub args: UpArgs,
    /// Whether `--log-level`, WEFT_LOG_LEVEL or RUST_LOG chose the level.
    pub log_level_pinned: bool,
}

/// Runs a node until SIGINT or SIGTERM.
pub fn run(mut cfg: NodeConfig, reloadable: Reloadable) -> Result<()> {
    weft_datapath::transport::limit_malloc_arenas();
    crate::config::secret::warn_if_weak(&cfg.network_secret.0);
    let fallback = crate::config::args::fallback_dir();
    if !crate::control::access::is_root()
        && (cfg.state_dir.starts_with(&fallback) || cfg.control.starts_with(&fallback))
    {
        state::private_dir(&fallback)?;
    }
    let key = state::load_or_create_key(&cfg.state_dir)?;
    if let Some(e) = &cfg.use_exit {
        let id = NodeId::from_public(&key.public).to_string();
        if e.len() >= 6 && id.starts_with(&e.to_ascii_lowercase()) {
            return Err(crate::config::values::UsageError(format!(
                "--use-exit-node {e:?} names this node (its node id {id}); name another member"
            ))
            .into());
        }
        // Weft's own sockets (all opened below) keep to the underlay.
        weft_datapath::transport::set_socket_mark(crate::services::exit::TABLE);
    }
    let mut ipv6 = resolve_ipv6(&cfg, NodeId::from_public(&key.public))?;
    if let Some(range) = cfg.dhcp {
        let id = NodeId::from_public(&key.public);
        let addr = weft_peers::pick_address(range.addr, range.prefix, id, &Default::default())
            .context("the --dhcp range has no host addresses")?;
        cfg.ipv4 = crate::config::values::Ipv4Net { addr, prefix: range.prefix };
        info!(%addr, "picked overlay address (--dhcp)");
    }
    if cfg.cipher == Cipher::AuthOnly {
        warn!("cipher none: tunnel data is authenticated but travels unencrypted; anyone on the path can read it");
    }
    // The data plane's devices: TUN queues, or the userspace stack (--no-tun).
    let (devices, tun_offload, stack) = if cfg.no_tun {
        let mut addrs = vec![(IpAddr::V4(cfg.ipv4.addr), cfg.ipv4.prefix)];
        addrs.extend(ipv6.map(|(a, p)| (IpAddr::V6(a), p)));
        let (stack, port) =
            crate::notun::stack::Stack::start(&addrs, cfg.mtu).context("cannot start the userspace network stack")?;
        info!("no TUN: a userspace network stack holds the overlay addresses");
        (vec![Arc::new(pipeline::Device::User(port))], false, Some(stack))
    } else {
        let tun = Tun::open(&TunConfig {
            name: cfg.dev_name.clone(),
            ipv4: cfg.ipv4.addr,
            prefix: cfg.ipv4.prefix,
            mtu: cfg.mtu,
            queues: cfg.threads,
            offload: cfg.offload.tun,
        })?;
        match ipv6 {
            Some((a, p)) => match configure_ipv6(&cfg.dev_name, a, p) {
                Ok(()) => info!(addr = %format!("{a}/{p}"), "IPv6 overlay address"),
                Err(e) if cfg.ipv6 == Ipv6Overlay::Derived => {
                    warn!(error = %e, "cannot give the TUN an IPv6 address: the overlay is IPv4 only");
                    ipv6 = None;
                }
                Err(e) => bail!("cannot give {} its IPv6 overlay address {a}/{p}: {e}", cfg.dev_name),
            },
            None => {
                // An IPv4-only overlay: without this the kernel's IPv6 chatter (router
                // solicitations) on the TUN would show up as drops.
                let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", cfg.dev_name), "1");
            }
        }
        let offload = tun.offload;
        (tun.queues.into_iter().map(|q| Arc::new(pipeline::Device::Tun(q))).collect::<Vec<_>>(), offload, None)
    };
    // Without a udp:// listener the sockets still carry outgoing UDP (dialled udp://
    // peers, hole punching) from an ephemeral port.
    let udp_listener = cfg.listeners.iter().find(|l| l.proto == Proto::Udp).copied();
    let udp_bind = udp_listener.map_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)), |l| l.addr);
    let socks = udp::bind_reuseport(udp_bind, cfg.threads, Duration::from_millis(500))
        .with_context(|| format!("cannot listen on udp://{udp_bind}"))?;
    let udp_bound = socks[0].local_addr().context("UDP socket has no address")?;
    // Probe every offload; a refusal falls back and is logged, never fatal.
    let udp_gso = cfg.offload.udp_gso && udp::probe_gso(&socks[0]);
    let gro_per_socket: Vec<bool> = socks.iter().map(|s| cfg.offload.udp_gro && udp::enable_gro(s)).collect();
    let udp_gro = cfg.offload.udp_gro && gro_per_socket.iter().all(|g| *g);
    for (what, wanted, got) in [
        ("tun", cfg.offload.tun && !cfg.no_tun, tun_offload),
        ("udp-gso", cfg.offload.udp_gso, udp_gso),
        ("udp-gro", cfg.offload.udp_gro, udp_gro),
    ] {
        match (wanted, got) {
            (true, true) => info!(offload = what, "offload on"),
            (true, false) => warn!(offload = what, "offload refused by the kernel; running without it"),
            (false, _) => info!(offload = what, "offload switched off by configuration"),
        }
    }
    // The runtime keeps every socket (not a duplicate descriptor), so a reload can
    // move them all to another port with `udp::replace`.
    let socks: Vec<Arc<UdpSocket>> = socks.into_iter().map(Arc::new).collect();
    let sender = socks[0].clone();
    let dial = cfg.peers.iter().map(|p| p.resolve()).collect::<Result<Vec<_>, _>>()?;
    let needs_tls = cfg.listeners.iter().any(|l| matches!(l.proto, Proto::Wss | Proto::Quic));
    let tls = if needs_tls { Some(state::load_or_create_tls(&cfg.state_dir, cfg.tls.as_ref())?) } else { None };

    // The portal network is a subnet this node proxies: members route it here, and
    // the kernel forwards between the two TUN devices.
    if let Some(p) = &cfg.wg_portal {
        cfg.proxy_networks.push(p.net.into());
    }
    if !cfg.no_tun && (cfg.proxy_networks.iter().any(|n| n.addr.is_ipv4()) || cfg.exit_node) {
        let forwarding = enable_forwarding(false);
        // An exit that cannot forward would take members' internet traffic and drop it.
        if cfg.exit_node {
            forwarding.map_err(|e| anyhow::anyhow!("--exit-node: {e}"))?;
        }
    }
    if !cfg.no_tun && (cfg.proxy_networks.iter().any(|n| n.addr.is_ipv6()) || (cfg.exit_node && ipv6.is_some())) {
        let forwarding = enable_forwarding(true);
        if cfg.exit_node {
            forwarding.map_err(|e| anyhow::anyhow!("--exit-node: {e}"))?;
        }
    }
    // Undoes the exit rules when `run` returns, whichever way (a failure further on
    // included); only a SIGKILL leaves them, for the next start to replace.
    // (A no-TUN node has no kernel state to set up or clean.)
    let _exit = if cfg.no_tun {
        None
    } else {
        Some(
            crate::services::exit::Guard::set_up(
                &cfg.dev_name,
                exit_offer(&cfg, ipv6).as_ref(),
                cfg.use_exit.is_some(),
                cfg.exit_fallback,
                ipv6.is_some(),
            )
            .map_err(anyhow::Error::msg)?,
        )
    };
    let metrics = match cfg.metrics {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on --metrics {addr}"))?;
            l.set_nonblocking(true)?;
            info!(%addr, "serving Prometheus metrics at /metrics");
            warn_if_exposed(addr, "--metrics", "read this node's peers, addresses and traffic counters");
            Some(l)
        }
        None => None,
    };
    let portal = match &cfg.wg_portal {
        Some(p) => Some(crate::services::portal::Portal::start(p, &cfg.state_dir, &cfg.dev_name, cfg.mtu)?),
        None => None,
    };
    let epoch = Instant::now();
    let psk = Psk::derive(&cfg.network_name, &cfg.network_secret.0);
    let (ctl_tx, ctl_rx) = mpsc::channel(CONTROL_QUEUE);
    let (hs_tx, hs_rx) = mpsc::channel(HANDSHAKE_QUEUE);
    let sink = Arc::new(QueueSink { events: ctl_tx, handshakes: hs_tx, overloaded: AtomicBool::new(false) });
    let shared = Shared {
        routes: Arc::new(ArcSwap::from_pointee(RouteSnapshot::default())),
        control: sink.clone(),
        macs: Arc::new(MacKeys::new(&psk)),
        epoch,
        stop: Arc::new(AtomicBool::new(false)),
        offload: Arc::new(Offload::new(udp_gso, udp_gro)),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // One links RX thread per pipeline: connections are spread over them.
    let (links, inbound) = Links::sharded(LINKS_QUEUE, cfg.threads);
    let mut pipelines = Vec::with_capacity(cfg.threads);
    let mut queues = Vec::with_capacity(cfg.threads);
    for (i, ((q, s), gro)) in
        devices.into_iter().zip(socks.iter().cloned()).zip(gro_per_socket.iter().copied()).enumerate()
    {
        let pin = (cfg.pin && cfg.threads <= cores).then_some(i % cores);
        let pcfg = PipelineConfig { mtu: cfg.mtu, offload: tun_offload, udp_gro: gro, pin };
        let stats = Arc::new(PipelineStats::default());
        queues.push(q.clone());
        pipeline::spawn(i, q, s, links.clone(), pcfg, shared.clone(), stats.clone())
            .context("cannot start pipeline threads")?;
        pipelines.push(stats);
    }
    // What the connections receive is opened by threads of their own, one per TUN
    // queue; each connection's frames by one of them, in order.
    let mut links_stats = Vec::with_capacity(inbound.len());
    for (i, (q, inbound)) in queues.into_iter().zip(inbound).enumerate() {
        let pcfg = PipelineConfig { mtu: cfg.mtu, offload: tun_offload, udp_gro: false, pin: None };
        let egress = Egress::new(sender.clone(), links.clone(), shared.offload.clone());
        let stats = Arc::new(PipelineStats::default());
        pipeline::spawn_links_rx(i, q, inbound, egress, pcfg, shared.clone(), stats.clone())
            .context("cannot start the links threads")?;
        links_stats.push(stats);
    }
    // Relayed frames bound for a stream connection skip the links threads.
    if let Some(stats) = links_stats.first() {
        links.set_forward(Box::new(pipeline::StreamRelay::new(shared.routes.clone(), stats.clone())));
    }
    let routes = shared.routes.clone();
    links.set_members(Box::new(move |ep| routes.load().is_neighbour(ep)));

    // The PSK derived above (Argon2id, once): the handshake, its MACs and the LAN
    // beacon key all come from it.
    let beacon_key = crate::services::discovery::beacon_key(&psk.subkey(crate::services::discovery::KEY_LABEL));
    let engine = Node::new(
        Config {
            handshake: Params {
                local: key,
                psk,
                network_name: cfg.network_name.clone(),
                hello: Hello {
                    cipher: cfg.cipher,
                    ipv4: cfg.ipv4.addr,
                    prefix: cfg.ipv4.prefix,
                    hostname: cfg.hostname.clone(),
                    ipv6,
                    gso: true,
                    gso_quic: true,
                },
            },
            dial: dial.clone(),
            epoch,
            timers: Timers { rekey_after: cfg.rekey_after, ..Timers::default() },
            endpoints: Vec::new(),
            latency_first: cfg.latency_first,
            proxied: engine_proxied(&cfg.proxy_networks, cfg.exit_node, ipv6.is_some()),
            dynamic: cfg.dhcp.map(|r| (r.addr, r.prefix)),
            accept_wide_subnets: cfg.accept_wide_subnets,
            exit_allow_lan: cfg.exit_allow_lan,
            names: state::load_names(&cfg.state_dir)?,
            use_exit: cfg.use_exit.clone(),
            local_networks: local_networks(&cfg.dev_name),
        },
        Box::new(rand::rngs::StdRng::from_entropy()),
    );
    info!(node_id = %engine.id(), addr = %cfg.ipv4, cipher = %cfg.cipher, threads = cfg.threads, "node starting");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("weft-ctl")
        .build()
        .context("cannot start the control runtime")?;
    let (down_tx, down_rx) = mpsc::channel(CONTROL_QUEUE);
    let frame_max = usize::from(cfg.mtu) + TX_HEADROOM + 64;
    let connector = Connector::new(links, down_tx, tls, cfg.max_connections, frame_max)?;
    for (p, ep) in cfg.peers.iter().zip(&dial) {
        connector.set_path(*ep, p.path.clone());
    }
    // Bind every listener; a port in use is fatal, like the UDP one.
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
    let mut engine = engine;
    let portal_dev = cfg.wg_portal.as_ref().map(|_| crate::services::portal::device_name(&cfg.dev_name));
    engine.set_endpoints(local_endpoints(&bound, cfg.ipv4.addr, &cfg.dev_name, portal_dev.as_deref()));
    let netcfg = if cfg.no_tun { NetConfig::none() } else { NetConfig::spawn(cfg.dev_name.clone(), ipv6.is_some())? };
    let names_writer = state::NamesWriter::spawn(cfg.state_dir.clone())?;
    let userspace = match stack {
        Some(stack) => {
            let domain =
                cfg.dns_domain.clone().unwrap_or_else(|| crate::services::dns::default_domain(&cfg.network_name));
            let dest = crate::notun::Destinations {
                routes: shared.routes.clone(),
                names: Arc::new(ArcSwap::from_pointee(crate::services::dns::Zone::new(&domain, [], |_| None))),
                nets: Arc::new(ArcSwap::from_pointee(Vec::new())),
            };
            let auth = cfg.socks5_auth.as_ref().map(|(u, p)| (u.clone(), p.0.clone()));
            if let Some(a) = cfg.socks5.filter(|_| auth.is_none()) {
                warn_if_exposed(a, "--socks5 without --socks5-auth", "reach the whole mesh through this node");
            }
            Some(crate::notun::Userspace::bind(stack, dest, cfg.socks5, auth, &cfg.forwards, &cfg.exposes)?)
        }
        None => None,
    };
    let cfg_peers = cfg.peers.clone();
    let runtime = Runtime {
        cfg,
        ipv6,
        engine,
        shared,
        sender,
        udp_socks: socks,
        udp_gro: gro_per_socket,
        started: epoch,
        tun_offload,
        pipelines,
        drops: DropCounters::default(),
        netcfg,
        names_writer,
        connector,
        links_stats,
        listeners: bound,
        udp_port: udp_bound.port(),
        beacon_key,
        beacon_drops: None,
        portal,
        member_subnets: Vec::new(),
        dialled: cfg_peers.into_iter().zip(dial).collect(),
        args: Arc::new(reloadable.args),
        log_level_pinned: reloadable.log_level_pinned,
        control_traffic: Default::default(),
        dns: None,
        exit_routed: false,
        exit_name_warned: false,
        userspace,
    };
    runtime.update_portal();
    let result = rt.block_on(runtime.serve(ctl_rx, hs_rx, sink, down_rx, metrics));
    // Pipeline threads block in TUN reads; the process exit ends them.
    rt.shutdown_timeout(Duration::from_millis(200));
    result
}

/// Warns, naming who can reach it, when a service meant for this host listens beyond
/// loopback.
fn warn_if_exposed(addr: SocketAddr, what: &str, can: &str) {
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
