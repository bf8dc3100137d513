//! The node runtime: the only place that owns tokio tasks. It opens the TUN and the
//! sockets, starts the pipeline threads, feeds the sans-IO engine and carries out its
//! actions, and serves the control socket.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arc_swap::ArcSwap;
use rand::SeedableRng;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};
use weft_core::admission::MacKeys;
use weft_core::crypto::Cipher;
use weft_core::handshake::{Hello, Params, Psk};
use weft_core::route::RouteSnapshot;
use weft_core::stats::{DropCounters, DropReason};
use weft_datapath::pipeline::{self, ControlEvent, ControlSink, PipelineConfig, PipelineStats, Shared, TX_HEADROOM};
use weft_datapath::transport::conn::{Connector, LinkDown};
use weft_datapath::transport::udp::{self, Offload};
use weft_datapath::transport::{Egress, Endpoint, Links, Proto};
use weft_datapath::tun::{Tun, TunConfig};
use weft_peers::NodeId;
use weft_peers::node::{Action, Config, Input, Node, PeerRef, Timers};
use weft_peers::status::{NodeStatus, PathStatus};

use crate::config::{Ipv6Overlay, NodeConfig, PeerUri};
use crate::discovery::{Beacon, Discovery};
use crate::state;
use weft_control::{
    AdmissionJson, ExitState, OffloadJson, PathKind, PeerJson, PeerState, PendingJson, PipelineJson, RefusedJson,
    Reply, Request, RouteJson, StatusJson,
};

/// Depth of the data plane -> control plane queue of authenticated events
/// (confirmations, control messages, path reports).
const CONTROL_QUEUE: usize = 1024;
/// Depth of the queue of handshake datagrams (mac1 already checked). Separate, so
/// that a flood of handshakes never costs an authenticated event its place.
const HANDSHAKE_QUEUE: usize = 256;
/// Received batches waiting for the links RX thread.
const LINKS_QUEUE: usize = 256;

struct QueueSink {
    events: mpsc::Sender<ControlEvent>,
    handshakes: mpsc::Sender<ControlEvent>,
    /// Set when a handshake did not fit: the engine treats the next second as load.
    overloaded: AtomicBool,
}

impl ControlSink for QueueSink {
    fn try_push(&self, ev: ControlEvent) -> bool {
        match ev {
            ControlEvent::Datagram { .. } => {
                let ok = self.handshakes.try_send(ev).is_ok();
                if !ok {
                    self.overloaded.store(true, Ordering::Relaxed);
                }
                ok
            }
            _ => self.events.try_send(ev).is_ok(),
        }
    }
}

/// A control request, parsed and with its names resolved (by the client's task, so
/// that a slow resolver never stalls the control loop), and where to answer.
type StatusRequest = (Ask, oneshot::Sender<Reply>);

/// What a client asks of the control loop.
enum Ask {
    Status,
    AddPeer(Endpoint, PeerUri),
    RemovePeer(PeerRef),
    WgAdd(String),
    WgRemove(String),
    Reload(Box<Reloaded>),
    AcceptExit,
}

/// What a live reload needs: the command line `weft up` started with (its flags win
/// over the file again), and whether a flag or RUST_LOG set the log level (then the
/// file's is not applied).
pub struct Reloadable {
    /// The `weft up` arguments.
    pub args: crate::args::UpArgs,
    /// Whether `--log-level`, WEFT_LOG_LEVEL or RUST_LOG chose the level.
    pub log_level_pinned: bool,
}

/// The config read again for a reload, with its peers resolved (off the control loop).
pub struct Reloaded {
    cfg: NodeConfig,
    peers: Vec<(PeerUri, Endpoint)>,
}

/// Reads the config file again with the flags `weft up` was given, and resolves its
/// peers: at most 10 s, on a blocking thread.
async fn load_again(args: Arc<crate::args::UpArgs>) -> Result<Reloaded, String> {
    if args.config.is_none() {
        return Err("nothing to reload: this node was started without --config".into());
    }
    let job = tokio::task::spawn_blocking(move || {
        let cfg = NodeConfig::resolve(&args).map_err(|e| e.to_string())?;
        let peers = cfg
            .peers
            .iter()
            .map(|p| p.resolve().map(|e| (p.clone(), e)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        Ok(Reloaded { cfg, peers })
    });
    match tokio::time::timeout(Duration::from_secs(10), job).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(format!("cannot reload: {e}")),
        Err(_) => Err("reading the config and resolving its peers took longer than 10 s".into()),
    }
}

/// Turns a request into an [`Ask`]: parses URIs and node ids and resolves host names
/// (at most 5 s), or says what is wrong with them.
async fn ask(req: Request, args: &Arc<crate::args::UpArgs>) -> Result<Ask, String> {
    let resolve = |u: PeerUri| async move {
        let job = tokio::task::spawn_blocking(move || u.resolve().map(|e| (e, u)));
        match tokio::time::timeout(Duration::from_secs(5), job).await {
            Ok(Ok(r)) => r.map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(format!("cannot resolve: {e}")),
            Err(_) => Err("name resolution took longer than 5 s".to_owned()),
        }
    };
    match req {
        Request::Status => Ok(Ask::Status),
        Request::AddPeer { uri } => {
            let u = uri.parse::<PeerUri>().map_err(|e| e.to_string())?;
            let (to, u) = resolve(u).await?;
            Ok(Ask::AddPeer(to, u))
        }
        Request::RemovePeer { peer } => {
            if let Ok(id) = peer.parse::<NodeId>() {
                return Ok(Ask::RemovePeer(PeerRef::Node(id)));
            }
            let u = peer.parse::<PeerUri>().map_err(|e| format!("{e} (or give a node id: 16 hex digits)"))?;
            Ok(Ask::RemovePeer(PeerRef::Endpoint(resolve(u).await?.0)))
        }
        Request::WgAdd { name } => Ok(Ask::WgAdd(name)),
        Request::WgRemove { name } => Ok(Ask::WgRemove(name)),
        Request::Reload => Ok(Ask::Reload(Box::new(load_again(args.clone()).await?))),
        Request::AcceptExit => Ok(Ask::AcceptExit),
    }
}

/// What this node forwards as an exit (`--exit-node`), for its nftables rules.
fn exit_offer(cfg: &NodeConfig, ipv6: Option<(Ipv6Addr, u8)>) -> Option<crate::exit::Offer> {
    cfg.exit_node.then(|| crate::exit::Offer {
        overlay: cfg.ipv4.network().to_string(),
        overlay6: ipv6.map(|(a, p)| crate::config::IpNet { addr: IpAddr::V6(a), prefix: p }.network().to_string()),
        served: cfg.proxy_networks.iter().map(|n| n.pair()).collect(),
        local: local_networks(&cfg.dev_name),
        allow_lan: cfg.exit_allow_lan,
    })
}

/// The subnets the engine announces as ours: the proxied ones, and 0.0.0.0/0 (and
/// ::/0 with an IPv6 overlay) when this node is an exit.
fn engine_proxied(proxied: &[crate::config::IpNet], exit_node: bool, ipv6: bool) -> Vec<(IpAddr, u8)> {
    let mut v: Vec<_> = proxied.iter().map(|n| n.pair()).collect();
    if exit_node {
        v.push(weft_peers::DEFAULT_ROUTE);
        if ipv6 {
            v.push(weft_peers::DEFAULT_ROUTE6);
        }
    }
    v
}

/// The IPv6 overlay address this node takes: `--ipv6`, or the one derived from the
/// network name and node id unless the host has no IPv6 or the MTU is below IPv6's
/// minimum (then the overlay is IPv4 only, and said so).
fn resolve_ipv6(cfg: &NodeConfig, id: NodeId) -> Result<Option<(Ipv6Addr, u8)>> {
    let host_has_ipv6 = Path::new("/proc/sys/net/ipv6").exists();
    match cfg.ipv6 {
        Ipv6Overlay::Off => Ok(None),
        Ipv6Overlay::Given(..) if !host_has_ipv6 => Err(anyhow::anyhow!(
            "--ipv6: this host has no IPv6 (/proc/sys/net/ipv6 is missing; was the kernel booted with ipv6.disable=1?)"
        )),
        Ipv6Overlay::Given(a, p) => Ok(Some((a, p))),
        Ipv6Overlay::Derived if !host_has_ipv6 => {
            info!("this host has no IPv6: the overlay is IPv4 only");
            Ok(None)
        }
        Ipv6Overlay::Derived if cfg.mtu < 1280 => {
            info!(mtu = cfg.mtu, "MTU below IPv6's 1280: the overlay is IPv4 only");
            Ok(None)
        }
        Ipv6Overlay::Derived => Ok(Some(weft_peers::default_ipv6(&cfg.network_name, id))),
    }
}

/// Gives the TUN its IPv6 overlay address: without SLAAC, router solicitations or a
/// link-local address (the overlay has no routers; their chatter would only be
/// dropped), and without duplicate address detection (the mesh settles ownership), so
/// the address is usable at once.
fn configure_ipv6(dev: &str, addr: Ipv6Addr, prefix: u8) -> Result<(), String> {
    let conf = |key: &str, value: &str| {
        let path = format!("/proc/sys/net/ipv6/conf/{dev}/{key}");
        if let Err(e) = std::fs::write(&path, value) {
            debug!(%path, error = %e, "cannot set");
        }
    };
    // A host whose new interfaces start without IPv6 (default.disable_ipv6).
    conf("disable_ipv6", "0");
    conf("accept_ra", "0");
    conf("router_solicitations", "0");
    // Through netlink, which works where /proc/sys is read-only (the systemd unit):
    // no address generation, and away with the link-local address given at creation.
    for args in
        [&["link", "set", "dev", dev, "addrgenmode", "none"][..], &["-6", "addr", "flush", "dev", dev, "scope", "link"]]
    {
        if let Err(e) = ip(args) {
            debug!(error = %e, "ip {}", args.join(" "));
        }
    }
    ip(&["-6", "addr", "add", &format!("{addr}/{prefix}"), "dev", dev, "nodad"])
}

/// Runs a node until SIGINT or SIGTERM.
pub fn run(mut cfg: NodeConfig, reloadable: Reloadable) -> Result<()> {
    weft_datapath::transport::limit_malloc_arenas();
    crate::secret::warn_if_weak(&cfg.network_secret.0);
    let fallback = crate::args::fallback_dir();
    if !crate::access::is_root() && (cfg.state_dir.starts_with(&fallback) || cfg.control.starts_with(&fallback)) {
        state::private_dir(&fallback)?;
    }
    let key = state::load_or_create_key(&cfg.state_dir)?;
    if let Some(e) = &cfg.use_exit {
        let id = NodeId::from_public(&key.public).to_string();
        if e.len() >= 6 && id.starts_with(&e.to_ascii_lowercase()) {
            return Err(crate::config::UsageError(format!(
                "--use-exit-node {e:?} names this node (its node id {id}); name another member"
            ))
            .into());
        }
        // Weft's own sockets (all opened below) keep to the underlay.
        weft_datapath::transport::set_socket_mark(crate::exit::TABLE);
    }
    let mut ipv6 = resolve_ipv6(&cfg, NodeId::from_public(&key.public))?;
    if let Some(range) = cfg.dhcp {
        let id = NodeId::from_public(&key.public);
        let addr = weft_peers::pick_address(range.addr, range.prefix, id, &Default::default())
            .context("the --dhcp range has no host addresses")?;
        cfg.ipv4 = crate::config::Ipv4Net { addr, prefix: range.prefix };
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
            crate::netstack::Stack::start(&addrs, cfg.mtu).context("cannot start the userspace network stack")?;
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
            crate::exit::Guard::set_up(
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
        Some(p) => Some(crate::portal::Portal::start(p, &cfg.state_dir, &cfg.dev_name, cfg.mtu)?),
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
    let beacon_key = crate::discovery::beacon_key(&psk.subkey(crate::discovery::KEY_LABEL));
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
    let portal_dev = cfg.wg_portal.as_ref().map(|_| crate::portal::device_name(&cfg.dev_name));
    engine.set_endpoints(local_endpoints(&bound, cfg.ipv4.addr, &cfg.dev_name, portal_dev.as_deref()));
    let netcfg = if cfg.no_tun { NetConfig::none() } else { NetConfig::spawn(cfg.dev_name.clone(), ipv6.is_some())? };
    let names_writer = state::NamesWriter::spawn(cfg.state_dir.clone())?;
    let userspace = match stack {
        Some(stack) => {
            let domain = cfg.dns_domain.clone().unwrap_or_else(|| crate::dns::default_domain(&cfg.network_name));
            let dest = crate::userspace::Destinations {
                routes: shared.routes.clone(),
                names: Arc::new(ArcSwap::from_pointee(crate::dns::Zone::new(&domain, [], |_| None))),
                nets: Arc::new(ArcSwap::from_pointee(Vec::new())),
            };
            let auth = cfg.socks5_auth.as_ref().map(|(u, p)| (u.clone(), p.0.clone()));
            if let Some(a) = cfg.socks5.filter(|_| auth.is_none()) {
                warn_if_exposed(a, "--socks5 without --socks5-auth", "reach the whole mesh through this node");
            }
            Some(crate::userspace::Userspace::bind(stack, dest, cfg.socks5, auth, &cfg.forwards, &cfg.exposes)?)
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

struct Runtime {
    cfg: NodeConfig,
    /// The IPv6 overlay address in use (`cfg.ipv6` resolved at start).
    ipv6: Option<(Ipv6Addr, u8)>,
    engine: Node,
    shared: Shared,
    /// The pipelines' UDP sockets; `sender` is the first.
    sender: Arc<UdpSocket>,
    udp_socks: Vec<Arc<UdpSocket>>,
    /// Whether each pipeline reads with UDP GRO (its receive slots are sized for it).
    udp_gro: Vec<bool>,
    started: Instant,
    tun_offload: bool,
    pipelines: Vec<Arc<PipelineStats>>,
    /// Drops of the control plane's own sends.
    drops: DropCounters,
    /// Kernel routes and addresses, changed on a thread of their own.
    netcfg: NetConfig,
    /// Keeps the engine's name bindings and exit pin in the state directory.
    names_writer: state::NamesWriter,
    /// TCP, WebSocket and QUIC connections.
    connector: Connector,
    /// Counters of the threads that open what connections receive.
    links_stats: Vec<Arc<PipelineStats>>,
    /// Bound listeners.
    listeners: Vec<Endpoint>,
    /// Port of the UDP sockets (announced in LAN beacons).
    udp_port: u16,
    /// MAC key of LAN beacons (from the PSK).
    beacon_key: ring::hmac::Key,
    /// LAN beacons dropped, with `--lan-discovery`.
    beacon_drops: Option<Arc<crate::discovery::Drops>>,
    /// The WireGuard portal (`--wg-portal`).
    portal: Option<crate::portal::Portal>,
    /// The subnets other members proxy (routed into the TUN).
    member_subnets: Vec<(IpAddr, u8)>,
    /// The peers of the config (file or flags), as resolved: a reload dials the new
    /// ones and stops dialling the ones gone.
    dialled: Vec<(PeerUri, Endpoint)>,
    /// The `weft up` arguments, for reloads.
    args: Arc<crate::args::UpArgs>,
    /// A flag or RUST_LOG set the log level: reloads leave it.
    log_level_pinned: bool,
    /// The control plane's own traffic.
    control_traffic: weft_control::ControlTrafficJson,
    /// Magic DNS, when on and bound.
    dns: Option<crate::dns::Server>,
    /// Whether the exit node's /0 is routed now (`--use-exit-node`).
    exit_routed: bool,
    /// Whether the warning that `--use-exit-node` names nobody was given.
    exit_name_warned: bool,
    /// The userspace stack and its services (`--no-tun`).
    userspace: Option<crate::userspace::Userspace>,
}

impl Runtime {
    /// The networks of the mesh: the overlay, our proxied subnets (the portal
    /// network among them) and the other members'.
    fn mesh_networks(&self) -> Vec<(IpAddr, u8)> {
        let mut v = vec![crate::config::IpNet::from(self.cfg.ipv4.network()).pair()];
        if let Some((a, p)) = self.ipv6 {
            v.push(crate::config::IpNet { addr: IpAddr::V6(a), prefix: p }.network().pair());
        }
        v.extend(self.cfg.proxy_networks.iter().map(|n| n.pair()));
        // Not an exit's /0: the portal is no way to the internet.
        v.extend(self.member_subnets.iter().copied().filter(|s| s.1 != 0));
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The IPv4 networks of the mesh (the WireGuard portal carries IPv4 only).
    fn mesh_networks_v4(&self) -> Vec<(std::net::Ipv4Addr, u8)> {
        self.mesh_networks()
            .into_iter()
            .filter_map(|(a, p)| match a {
                IpAddr::V4(a) => Some((a, p)),
                IpAddr::V6(_) => None,
            })
            .collect()
    }

    /// Starts LAN discovery on this host's interfaces.
    fn discovery(&mut self) -> Result<Discovery> {
        let ifs = local_ipv4s(self.cfg.ipv4.addr, self.portal_dev().as_deref());
        info!(interfaces = ifs.len(), "LAN discovery on");
        let d = Discovery::new(
            ifs,
            Beacon::network_hash(&self.cfg.network_name),
            self.engine.id().to_bytes(),
            self.udp_port,
            self.beacon_key.clone(),
        )?;
        self.beacon_drops = Some(d.drops.clone());
        Ok(d)
    }

    /// Applies a config read again: peers, listeners, proxied subnets, Magic DNS, LAN
    /// discovery, the metrics address and the log level change live (sessions stay
    /// up); every other difference is named in the reply and left as it was.
    async fn reload(
        &mut self,
        new: Reloaded,
        discovery: &mut Option<Discovery>,
        metrics: &mut Option<tokio::task::JoinHandle<()>>,
        req_tx: &mpsc::Sender<StatusRequest>,
    ) -> Reply {
        let now = Instant::now();
        let Reloaded { cfg: new, peers } = new;
        let old = &self.cfg;
        let mut restart: Vec<&str> = Vec::new();
        let fixed = [
            ("network-name", old.network_name != new.network_name),
            ("network-secret", old.network_secret != new.network_secret),
            ("cipher", old.cipher != new.cipher),
            ("ipv4", if old.dhcp.is_some() { old.dhcp != new.dhcp } else { old.ipv4 != new.ipv4 }),
            ("ipv6", old.ipv6 != new.ipv6),
            ("dev-name", old.dev_name != new.dev_name),
            ("mtu", old.mtu != new.mtu),
            ("threads", old.threads != new.threads),
            ("hostname", old.hostname != new.hostname),
            ("state-dir", old.state_dir != new.state_dir),
            ("control", old.control != new.control),
            ("admin-group", old.admin_group != new.admin_group),
            ("offloads", old.offload != new.offload),
            ("pin", old.pin != new.pin),
            ("latency-first", old.latency_first != new.latency_first),
            ("accept-wide-subnets", old.accept_wide_subnets != new.accept_wide_subnets),
            ("max-connections", old.max_connections != new.max_connections),
            ("tls-cert/tls-key", old.tls != new.tls),
            ("wg-portal", old.wg_portal != new.wg_portal),
            ("log-format", old.log_format != new.log_format),
            ("exit-node", old.exit_node != new.exit_node),
            ("exit-allow-lan", old.exit_allow_lan != new.exit_allow_lan),
            ("use-exit-node", old.use_exit != new.use_exit),
            ("exit-fallback", old.exit_fallback != new.exit_fallback),
        ];
        restart.extend(fixed.iter().filter(|(_, changed)| *changed).map(|(name, _)| *name));
        let mut done: Vec<String> = Vec::new();
        let mut failed: Vec<String> = Vec::new();

        // Peers: dial the new ones, stop dialling the ones gone (peers added with
        // `weft peer add` are not in the file and stay).
        let gone: Vec<(PeerUri, Endpoint)> =
            self.dialled.iter().filter(|(u, _)| !peers.iter().any(|(n, _)| n == u)).cloned().collect();
        for (u, ep) in gone {
            match self.engine.remove_peer(now, PeerRef::Endpoint(ep)) {
                Ok(_) => done.push(format!("removed peer {u}")),
                Err(e) => failed.push(format!("peer {u}: {e}")),
            }
        }
        for (u, ep) in peers.iter().filter(|(u, _)| !self.dialled.iter().any(|(o, _)| o == u)) {
            self.connector.set_path(*ep, u.path.clone());
            match self.engine.add_peer(now, *ep) {
                Ok(()) => done.push(format!("added peer {u}")),
                Err(e) => failed.push(format!("peer {u}: {e}")),
            }
        }
        self.dialled = peers;
        self.cfg.peers = new.peers.clone();

        // Proxied subnets (the portal network stays among them).
        let mut proxied = new.proxy_networks.clone();
        if let Some(p) = &self.cfg.wg_portal {
            proxied.push(p.net.into());
        }
        if proxied != self.cfg.proxy_networks {
            if proxied.iter().any(|n| n.addr.is_ipv4()) {
                let _ = enable_forwarding(false);
            }
            if proxied.iter().any(|n| n.addr.is_ipv6()) {
                let _ = enable_forwarding(true);
            }
            self.engine.set_proxied(now, engine_proxied(&proxied, self.cfg.exit_node, self.ipv6.is_some()));
            let list: Vec<String> = new.proxy_networks.iter().map(ToString::to_string).collect();
            done.push(format!("proxied subnets now [{}]", list.join(", ")));
            self.cfg.proxy_networks = proxied;
            if let Some(o) = exit_offer(&self.cfg, self.ipv6).filter(|_| !self.cfg.no_tun)
                && let Err(e) = crate::exit::offer(&self.cfg.dev_name, &o)
            {
                failed.push(format!("exit rules for the new subnets: {e}"));
            }
            self.update_portal();
        }

        // Listeners. The UDP sockets move to the new address under the running
        // pipelines (peers follow us by roaming: our next packets come from there);
        // a closed QUIC listener keeps its connections and stops accepting.
        let mut listeners_changed = false;
        let mut udp_failed = false;
        let mut udp_moved = false;
        for proto in [Proto::Udp, Proto::Quic, Proto::Tcp, Proto::Ws, Proto::Wss] {
            let was = self.cfg.listeners.iter().find(|l| l.proto == proto).copied();
            let wanted = new.listeners.iter().find(|l| l.proto == proto).copied();
            if was == wanted {
                continue;
            }
            if proto == Proto::Udp {
                match self.rebind_udp(wanted.map(|l| l.addr)) {
                    Ok(addr) => {
                        udp_moved = true;
                        self.engine.udp_moved(now);
                        self.listeners.retain(|b| b.proto != Proto::Udp);
                        if wanted.is_some() {
                            let b = Endpoint::new(Proto::Udp, addr);
                            self.listeners.push(b);
                            done.push(format!("listening on {b}"));
                        } else {
                            done.push(format!("udp listener closed (outgoing UDP from port {})", addr.port()));
                        }
                        listeners_changed = true;
                    }
                    Err(e) => {
                        udp_failed = true;
                        let l = wanted.map_or_else(|| "off".into(), |l| l.to_string());
                        failed.push(format!("udp listener {l}: {e:#}"));
                    }
                }
                continue;
            }
            if was.is_some()
                && let Some(bound) = self.listeners.iter().position(|b| b.proto == proto)
            {
                let b = self.listeners.remove(bound);
                self.connector.close_listener(b);
                done.push(format!("closed listener {b}"));
                listeners_changed = true;
            }
            if let Some(l) = wanted {
                match self.connector.listen(l).await {
                    Ok(addr) => {
                        let b = Endpoint::new(proto, addr);
                        self.listeners.push(b);
                        done.push(format!("listening on {b}"));
                        listeners_changed = true;
                    }
                    Err(e) => failed.push(format!("listener {l}: {e}")),
                }
            }
        }
        if listeners_changed {
            // What is configured now: the new config's listeners that bound, and the
            // UDP one as it was if it could not move.
            let udp_from = if udp_failed { &self.cfg.listeners } else { &new.listeners };
            let udp = udp_from.iter().find(|e| e.proto == Proto::Udp).copied();
            let mut l: Vec<Endpoint> = new
                .listeners
                .iter()
                .filter(|e| e.proto != Proto::Udp && self.listeners.iter().any(|b| b.proto == e.proto))
                .copied()
                .collect();
            l.extend(udp);
            self.cfg.listeners = l;
            let bound = self.listeners.clone();
            self.engine.set_endpoints(local_endpoints(
                &bound,
                self.cfg.ipv4.addr,
                &self.cfg.dev_name,
                self.portal_dev().as_deref(),
            ));
        }

        // LAN discovery (its beacons name our UDP port: start it again if that moved).
        if udp_moved && self.cfg.lan_discovery && new.lan_discovery {
            *discovery = None;
            self.cfg.lan_discovery = false;
        }
        if new.lan_discovery != self.cfg.lan_discovery {
            if new.lan_discovery {
                match self.discovery() {
                    Ok(d) => {
                        *discovery = Some(d);
                        self.cfg.lan_discovery = true;
                        done.push("LAN discovery on".into());
                    }
                    Err(e) => failed.push(format!("LAN discovery: {e:#}")),
                }
            } else {
                *discovery = None;
                self.cfg.lan_discovery = false;
                done.push("LAN discovery off".into());
            }
        }

        // Metrics: bind the new address before letting the old one go.
        if new.metrics != self.cfg.metrics {
            let bound = match new.metrics {
                Some(addr) => std::net::TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .and_then(tokio::net::TcpListener::from_std)
                    .map(Some)
                    .map_err(|e| format!("metrics on {addr}: {e}")),
                None => Ok(None),
            };
            match bound {
                Ok(l) => {
                    if let Some(old) = metrics.take() {
                        old.abort();
                    }
                    *metrics = l.map(|l| tokio::spawn(metrics_loop(l, req_tx.clone())));
                    self.cfg.metrics = new.metrics;
                    done.push(new.metrics.map_or_else(|| "metrics off".into(), |a| format!("metrics on {a}")));
                }
                Err(e) => failed.push(e),
            }
        }

        // Log level (unless a flag or RUST_LOG chose it).
        if new.log_level != self.cfg.log_level && !self.log_level_pinned {
            let spec = new.log_level.clone().unwrap_or_else(|| "info".into());
            match crate::set_log_level(&spec) {
                Ok(()) => {
                    done.push(format!("log level {spec}"));
                    self.cfg.log_level = new.log_level;
                }
                Err(e) => failed.push(format!("log level: {e}")),
            }
        }

        // Magic DNS: a new domain, on or off, registered or not.
        // The server keeps its socket through a change of domain: rebinding the same
        // port at once could find it still held by the aborted task.
        if new.dns_domain != self.cfg.dns_domain || new.accept_dns != self.cfg.accept_dns {
            if self.cfg.accept_dns && self.dns.is_some() {
                let dev = self.cfg.dev_name.clone();
                let _ = tokio::task::spawn_blocking(move || crate::dns::unregister(&dev)).await;
            }
            self.cfg.dns_domain.clone_from(&new.dns_domain);
            self.cfg.accept_dns = new.accept_dns;
            match self.cfg.dns_domain.clone() {
                None => {
                    self.dns = None;
                    done.push("Magic DNS off".into());
                }
                Some(d) => {
                    match &self.dns {
                        Some(server) => {
                            server.update(self.dns_zone(&d));
                            self.register_dns();
                        }
                        None => self.start_dns(true),
                    }
                    if self.dns.is_some() {
                        done.push(format!("Magic DNS for {d}"));
                    } else {
                        failed.push(format!("Magic DNS for {d}: cannot bind port 53 yet (retrying every second)"));
                    }
                }
            }
        }

        let file = self.args.config.as_ref().map_or_else(String::new, |p| format!(" {}", p.display()));
        let mut message = if done.is_empty() {
            format!("reloaded{file}: nothing changed")
        } else {
            format!("reloaded{file}: {}", done.join("; "))
        };
        if !failed.is_empty() {
            message.push_str(&format!("; FAILED: {}", failed.join("; ")));
        }
        if !restart.is_empty() {
            message.push_str(&format!("; needs a restart to change (left as it was): {}", restart.join(", ")));
        }
        info!("{message}");
        if failed.is_empty() { Reply::Done { message } } else { Reply::Error { message } }
    }

    /// Moves every pipeline's UDP socket to `addr` (an ephemeral port when `None`):
    /// binds the new sockets first, so a port in use changes nothing, then swaps each
    /// descriptor in place. Returns the new local address.
    fn rebind_udp(&mut self, addr: Option<SocketAddr>) -> Result<SocketAddr> {
        let bind = addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let socks = udp::bind_reuseport(bind, self.udp_socks.len(), Duration::from_millis(500))
            .with_context(|| format!("cannot bind udp://{bind}"))?;
        let local = socks[0].local_addr().context("UDP socket has no address")?;
        // GRO only where the pipeline's receive slots hold coalesced bursts: a socket
        // with GRO under a pipeline without would truncate them.
        let refused = self.udp_gro.iter().zip(&socks).filter(|(gro, s)| **gro && !udp::enable_gro(s)).count();
        if refused > 0 {
            warn!(
                sockets = refused,
                "UDP GRO refused on the new sockets; received bursts arrive one datagram at a time"
            );
        }
        for (old, new) in self.udp_socks.iter().zip(&socks) {
            udp::replace(old, new).context("cannot move the UDP socket")?;
        }
        info!(from = self.udp_port, to = local.port(), "UDP sockets moved");
        self.udp_port = local.port();
        Ok(local)
    }

    /// The Magic DNS zone of the mesh as this node knows it: itself and every member
    /// whose record it holds.
    fn dns_zone(&self, domain: &str) -> crate::dns::Zone {
        let me = self.engine.id();
        let others = self.engine.topology().records().filter(|r| r.node() != me);
        let names = self.engine.names();
        crate::dns::Zone::new(
            domain,
            std::iter::once((me, self.cfg.hostname.as_str(), self.cfg.ipv4.addr, self.ipv6.map(|(a, _)| a)))
                .chain(others.map(|r| (r.node(), r.hostname.as_str(), r.overlay, r.overlay6))),
            |host| names.holder(host),
        )
        .for_clients(self.mesh_networks())
    }

    /// Starts Magic DNS on the overlay address (when on), and registers it with
    /// systemd-resolved (with `--accept-dns`). A port already taken turns it off with a
    /// warning: the mesh works without it.
    /// A failure is retried every second by [`Self::refresh_dns`] (warned of when `loud`).
    fn start_dns(&mut self, loud: bool) {
        self.dns = None;
        // Without a TUN the overlay addresses are not the kernel's to bind.
        if self.userspace.is_some() {
            return;
        }
        let Some(domain) = self.cfg.dns_domain.clone() else { return };
        let zone = Arc::new(ArcSwap::from_pointee(self.dns_zone(&domain)));
        let addrs = self.dns_addrs();
        match crate::dns::Server::start(&addrs, zone) {
            Ok(s) => {
                info!(addrs = ?addrs, %domain, "Magic DNS on");
                self.dns = Some(s);
                self.register_dns();
            }
            Err(e) if loud => warn!(error = %e, "Magic DNS off: cannot bind its socket (retrying every second)"),
            Err(e) => debug!(error = %e, "Magic DNS: bind failed again"),
        }
    }

    /// Where Magic DNS listens: the overlay addresses, port 53.
    fn dns_addrs(&self) -> Vec<SocketAddr> {
        std::iter::once(IpAddr::V4(self.cfg.ipv4.addr))
            .chain(self.ipv6.map(|(a, _)| IpAddr::V6(a)))
            .map(|ip| SocketAddr::new(ip, 53))
            .collect()
    }

    /// With `--accept-dns`, points systemd-resolved at the running server.
    fn register_dns(&self) {
        if let (true, Some(domain)) = (self.cfg.accept_dns && self.dns.is_some(), self.cfg.dns_domain.clone()) {
            let dev = self.cfg.dev_name.clone();
            let ips: Vec<IpAddr> = self.dns_addrs().iter().map(SocketAddr::ip).collect();
            tokio::task::spawn_blocking(move || {
                if crate::dns::register(&dev, &ips, &domain) {
                    info!(%domain, "Magic DNS registered with systemd-resolved");
                }
            });
        }
    }

    /// Follows members coming, going and renaming, and our own address moving; starts
    /// the server again when its bind failed (the port was busy, the address not yet
    /// on the device).
    /// Gives the userspace services the mesh's current names and networks.
    fn refresh_userspace(&self) {
        let Some(u) = &self.userspace else { return };
        let domain = self.cfg.dns_domain.clone().unwrap_or_else(|| crate::dns::default_domain(&self.cfg.network_name));
        u.destinations().names.store(Arc::new(self.dns_zone(&domain)));
        u.destinations().nets.store(Arc::new(self.mesh_networks()));
    }

    fn refresh_dns(&mut self) {
        if self.userspace.is_some() {
            return;
        }
        let Some(domain) = self.cfg.dns_domain.clone() else { return };
        let Some(d) = &self.dns else {
            self.start_dns(false);
            return;
        };
        if d.addrs != self.dns_addrs() {
            self.start_dns(true);
            return;
        }
        if d.update(self.dns_zone(&domain)) {
            debug!("Magic DNS zone changed");
        }
    }

    /// Says once, when this node has been in the mesh a while, that `--use-exit-node`
    /// names no member at all (a typo is otherwise only visible in status), with the
    /// members that do offer an exit.
    fn check_exit_name(&mut self) {
        if self.exit_name_warned || self.started.elapsed() < Duration::from_secs(15) {
            return;
        }
        let st = self.engine.status(Instant::now());
        let Some(e) = &st.exit else { return };
        let in_mesh = st.peers.iter().any(|p| p.state == weft_peers::status::PeerState::Established);
        if e.node.is_some() || e.known || !in_mesh {
            return;
        }
        self.exit_name_warned = true;
        let offers: Vec<String> = st.exit_offers.iter().map(|(id, h)| format!("{h} ({id})")).collect();
        warn!(
            wanted = %e.wanted,
            "--use-exit-node names no member of the mesh; members offering an exit: [{}]",
            offers.join(", ")
        );
    }

    /// The exit node's /0 came or went: say so, and with --exit-fallback add or remove
    /// the policy routing that sends the default route into the TUN.
    fn follow_exit(&mut self, routed: bool) {
        if self.cfg.use_exit.is_none() || routed == self.exit_routed {
            return;
        }
        self.exit_routed = routed;
        let fallback = self.cfg.exit_fallback;
        match (routed, fallback) {
            (true, _) => info!("exit node reachable: the default route goes through it"),
            (false, false) => warn!("exit node unreachable: traffic for the internet is dropped until it is back"),
            (false, true) => warn!(
                "exit node unreachable: traffic for the internet leaves by this host's own route (--exit-fallback)"
            ),
        }
        if fallback {
            self.netcfg.send(NetJob::ExitRoute(routed));
        }
    }

    /// The WireGuard portal's TUN device, when there is one.
    fn portal_dev(&self) -> Option<String> {
        self.cfg.wg_portal.as_ref().map(|_| crate::portal::device_name(&self.cfg.dev_name))
    }

    /// Tells the portal where its clients may send.
    fn update_portal(&self) {
        if let Some(p) = &self.portal {
            p.set_destinations(self.mesh_networks_v4());
        }
    }

    fn handle_event(&mut self, ev: ControlEvent) {
        let now = Instant::now();
        let len = match &ev {
            ControlEvent::Datagram { bytes, .. } | ControlEvent::Message { bytes, .. } => Some(bytes.len()),
            _ => None,
        };
        if let Some(n) = len {
            self.control_traffic.received_packets += 1;
            self.control_traffic.received_bytes += n as u64;
        }
        match ev {
            ControlEvent::Datagram { from, via, bytes } => {
                let via = via.map(NodeId::from_bytes);
                self.engine.handle(now, Input::Datagram { from, via, bytes: &bytes })
            }
            ControlEvent::Confirmed { local_index } => self.engine.handle(now, Input::Confirmed { local_index }),
            ControlEvent::Message { local_index, bytes } => {
                self.engine.handle(now, Input::Message { local_index, bytes: &bytes })
            }
            ControlEvent::Direct { local_index, from } => self.engine.handle(now, Input::Direct { local_index, from }),
            ControlEvent::Unrouted { dst, packet } => self.engine.handle(now, Input::Unrouted { dst, packet: &packet }),
        }
    }

    async fn serve(
        mut self,
        mut events: mpsc::Receiver<ControlEvent>,
        mut handshakes: mpsc::Receiver<ControlEvent>,
        sink: Arc<QueueSink>,
        mut link_down: mpsc::Receiver<LinkDown>,
        metrics: Option<std::net::TcpListener>,
    ) -> Result<()> {
        let listener = bind_control(&self.cfg.control)?;
        let (req_tx, mut requests) = mpsc::channel::<StatusRequest>(16);
        let mut metrics = match metrics {
            Some(l) => Some(tokio::spawn(metrics_loop(tokio::net::TcpListener::from_std(l)?, req_tx.clone()))),
            None => None,
        };
        let admins =
            Admins { group: self.cfg.admin_group.clone(), gid: crate::access::group_id(&self.cfg.admin_group) };
        if admins.gid.is_none() {
            info!(group = %admins.group, "admin group not found in /etc/group: only root may change the node");
        }
        let accept = tokio::spawn(accept_loop(listener, req_tx.clone(), admins, self.args.clone()));
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        self.engine.handle_timeout(Instant::now());
        self.drain();
        let mut discovery = if self.cfg.lan_discovery { Some(self.discovery()?) } else { None };
        self.start_dns(true);
        if let Some(u) = &mut self.userspace {
            u.start()?;
        }
        self.refresh_userspace();
        let mut dns_timer = tokio::time::interval(Duration::from_secs(1));
        let mut beacon_timer = tokio::time::interval(Duration::from_secs(5));
        // Interfaces come and go: members' subnets are checked against the networks
        // this host is connected to now.
        let mut nets_timer = tokio::time::interval(Duration::from_secs(10));
        loop {
            // The engine's next deadline; with none, it waits for an input.
            let deadline = self.engine.poll_timeout().unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                // Authenticated events first and handshakes last: a flood of handshakes must
                // not delay anything else.
                biased;
                ev = events.recv() => {
                    let Some(ev) = ev else { break };
                    self.handle_event(ev);
                }
                () = tokio::time::sleep_until(deadline.into()) => self.engine.handle_timeout(Instant::now()),
                down = link_down.recv() => {
                    if let Some(d) = down {
                        self.engine.handle(Instant::now(), Input::LinkDown { endpoint: d.endpoint, error: &d.error });
                    }
                }
                req = requests.recv() => {
                    if let Some((req, reply)) = req {
                        let r = self.request(req, &mut discovery, &mut metrics, &req_tx).await;
                        let _ = reply.send(r);
                    }
                }
                _ = sighup.recv() => {
                    info!("SIGHUP: reloading the config");
                    // Read and resolve off the loop; the result comes back as a request.
                    let (args, req_tx) = (self.args.clone(), req_tx.clone());
                    tokio::spawn(async move {
                        let reply = match load_again(args).await {
                            Ok(new) => {
                                let (tx, rx) = oneshot::channel();
                                if req_tx.send((Ask::Reload(Box::new(new)), tx)).await.is_err() {
                                    return;
                                }
                                rx.await.ok()
                            }
                            Err(message) => Some(Reply::Error { message }),
                        };
                        match reply {
                            Some(Reply::Done { message }) => info!("{message}"),
                            Some(Reply::Error { message }) => warn!("reload refused: {message}"),
                            _ => {}
                        }
                    });
                }
                endpoint = async {
                    match &discovery {
                        Some(d) => d.next_peer().await,
                        None => std::future::pending().await,
                    }
                } => self.engine.handle(Instant::now(), Input::Discovered { endpoint: Endpoint::udp(endpoint) }),
                _ = beacon_timer.tick(), if discovery.is_some() => {
                    if let Some(d) = &discovery {
                        d.announce().await;
                    }
                }
                _ = nets_timer.tick() => {
                    self.engine.set_local_networks(local_networks(&self.cfg.dev_name));
                    self.check_exit_name();
                }
                _ = dns_timer.tick() => {
                    self.refresh_userspace();
                    self.refresh_dns();
                }
                _ = tokio::signal::ctrl_c() => { info!("interrupted; shutting down"); break }
                _ = sigterm.recv() => { info!("terminated; shutting down"); break }
                // Last: handshake datagrams (even replayed ones pass mac1) must never keep
                // the timers, requests or signals above from being served.
                ev = handshakes.recv() => {
                    let Some(ev) = ev else { break };
                    if sink.overloaded.swap(false, Ordering::Relaxed) {
                        self.engine.note_overload(Instant::now());
                    }
                    self.handle_event(ev);
                }
            }
            self.drain();
        }
        self.shared.stop.store(true, Ordering::Relaxed);
        accept.abort();
        if self.dns.take().is_some() && self.cfg.accept_dns {
            let dev = self.cfg.dev_name.clone();
            let _ = tokio::task::spawn_blocking(move || crate::dns::unregister(&dev)).await;
        }
        if let Some(m) = metrics {
            m.abort();
        }
        let _ = std::fs::remove_file(&self.cfg.control);
        Ok(())
    }

    fn drain(&mut self) {
        while let Some(action) = self.engine.poll_action() {
            if let Action::Send { bytes, .. } = &action {
                self.control_traffic.sent_packets += 1;
                self.control_traffic.sent_bytes += bytes.len() as u64;
            }
            match action {
                Action::PublishRoutes(snap) => {
                    debug!(routes = snap.route_count(), "publishing routes");
                    self.shared.routes.store(snap);
                    // Names follow the routes at once: a SOCKS5 client may ask for a
                    // member the moment it can be reached.
                    self.refresh_userspace();
                }
                Action::InstallRoutes(subnets) => {
                    self.follow_exit(subnets.contains(&weft_peers::DEFAULT_ROUTE));
                    self.member_subnets.clone_from(&subnets);
                    self.update_portal();
                    let own = self.cfg.proxy_networks.iter().map(|n| n.pair()).collect();
                    self.netcfg.send(NetJob::Routes { wanted: subnets, own });
                }
                Action::SetAddress { old, new, prefix } => {
                    self.netcfg.send(NetJob::Address { old, new, prefix });
                    self.cfg.ipv4.addr = new;
                    if let Some(u) = &self.userspace {
                        let mut addrs = vec![(IpAddr::V4(new), prefix)];
                        addrs.extend(self.ipv6.map(|(a, p)| (IpAddr::V6(a), p)));
                        u.stack.set_addresses(&addrs);
                    }
                    info!(%new, "overlay address changed");
                }
                Action::Send { to, bytes } if to.proto == Proto::Udp => {
                    if let Err(e) = self.sender.send_to(&bytes, to.addr) {
                        debug!(%to, error = %e, "control send failed");
                        self.drops.add(DropReason::UdpSend, 1);
                    }
                }
                Action::Send { to, bytes } => self.connector.send(to, &bytes),
                Action::SaveNames(names) => self.names_writer.save(names),
            }
        }
    }

    async fn request(
        &mut self,
        ask: Ask,
        discovery: &mut Option<Discovery>,
        metrics: &mut Option<tokio::task::JoinHandle<()>>,
        req_tx: &mpsc::Sender<StatusRequest>,
    ) -> Reply {
        let now = Instant::now();
        let done = match ask {
            Ask::Reload(new) => return self.reload(*new, discovery, metrics, req_tx).await,
            Ask::Status => return Reply::Status(Box::new(self.status())),
            Ask::AddPeer(to, u) => {
                self.connector.set_path(to, u.path.clone());
                self.engine.add_peer(now, to).map(|()| format!("added {u}"))
            }
            Ask::RemovePeer(which) => self.engine.remove_peer(now, which),
            Ask::WgAdd(name) => {
                let Some(p) = &self.portal else { return no_portal() };
                // The client routes the mesh's networks (not the portal network, which
                // the config always carries) through the portal.
                let own = self.cfg.wg_portal.as_ref().map(|c| (c.net.addr, c.net.prefix));
                let nets: Vec<_> = self.mesh_networks_v4().into_iter().filter(|n| Some(*n) != own).collect();
                return match p.add(&name, &nets, &local_ipv4s(self.cfg.ipv4.addr, self.portal_dev().as_deref())) {
                    Ok(c) => Reply::WgClient(Box::new(c)),
                    Err(message) => Reply::Error { message },
                };
            }
            Ask::WgRemove(name) => match &self.portal {
                Some(p) => p.remove(&name),
                None => return no_portal(),
            },
            Ask::AcceptExit => self.engine.accept_exit(now),
        };
        match done {
            Ok(message) => Reply::Done { message },
            Err(message) => Reply::Error { message },
        }
    }

    fn status(&self) -> StatusJson {
        let now = Instant::now();
        let st: NodeStatus = self.engine.status(now);
        let mut drops = counters(&self.drops);
        for (k, v) in self.beacon_drops.iter().flat_map(|d| d.nonzero()) {
            drops.insert(k.to_owned(), v);
        }
        for (k, v) in self.portal.iter().flat_map(crate::portal::Portal::drops) {
            drops.insert(format!("wg_{k}"), v);
        }
        for p in self.pipelines.iter().chain(&self.links_stats) {
            for (k, v) in counters(&p.drops) {
                *drops.entry(k).or_default() += v;
            }
        }
        let peers = st
            .peers
            .iter()
            .map(|p| {
                let pd = counters(&p.stats.drops);
                for (k, v) in &pd {
                    *drops.entry(k.clone()).or_default() += v;
                }
                let (path, via, hops) = match p.path {
                    PathStatus::Direct => (PathKind::Direct, None, 1),
                    PathStatus::Relay { via, hops } => (PathKind::Relay, Some(via), hops),
                    PathStatus::None => (PathKind::None, None, 0),
                };
                // The transport of the first link: to the peer, or to the relay.
                let first_link = match via {
                    Some(v) => st.peers.iter().find(|q| q.node_id == v).and_then(|q| q.endpoint),
                    None if path == PathKind::Direct => p.endpoint,
                    None => None,
                };
                PeerJson {
                    node_id: p.node_id.to_string(),
                    hostname: p.hostname.clone(),
                    overlay: p.overlay.to_string(),
                    overlay6: p.overlay6.map(|a| a.to_string()),
                    endpoint: p.endpoint.map(|e| e.to_string()),
                    path,
                    via: via.map(|v| v.to_string()),
                    via_hostname: via
                        .and_then(|v| st.peers.iter().find(|q| q.node_id == v))
                        .map(|q| q.hostname.clone()),
                    hops,
                    transport: first_link.map_or_else(|| "none".into(), |e| e.proto.to_string()),
                    rtt_ms: p.rtt.map(|r| r.as_secs_f64() * 1000.0),
                    loss: p.loss,
                    state: match p.state {
                        weft_peers::status::PeerState::Connecting => PeerState::Connecting,
                        weft_peers::status::PeerState::Down => PeerState::Down,
                        weft_peers::status::PeerState::Established => PeerState::Established,
                        weft_peers::status::PeerState::Idle => PeerState::Idle,
                    },
                    link: p.link,
                    last_handshake_secs: p.last_handshake.map(|d| d.as_secs()),
                    rx_bytes: p.stats.rx_bytes.load(Ordering::Relaxed),
                    rx_packets: p.stats.rx_packets.load(Ordering::Relaxed),
                    tx_bytes: p.stats.tx_bytes.load(Ordering::Relaxed),
                    tx_packets: p.stats.tx_packets.load(Ordering::Relaxed),
                    drops: pd,
                    error: p.error.clone(),
                }
            })
            .collect();
        StatusJson {
            node_id: st.node_id.to_string(),
            network_name: self.cfg.network_name.clone(),
            hostname: self.cfg.hostname.clone(),
            overlay: self.cfg.ipv4.to_string(),
            overlay6: self.ipv6.map(|(a, p)| format!("{a}/{p}")),
            cipher: self.cfg.cipher.to_string(),
            listeners: self.listeners.iter().map(ToString::to_string).collect(),
            connections: self.connector.links().len(),
            transport_counters: self
                .connector
                .counters()
                .snapshot()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            dev_name: self.cfg.dev_name.clone(),
            offloads: OffloadJson {
                tun: self.tun_offload,
                tun_gro: self.tun_offload && self.shared.offload.tun_gro(),
                udp_gso: self.shared.offload.gso(),
                udp_gro: self.shared.offload.gro(),
            },
            pipelines: self
                .pipelines
                .iter()
                .map(|p| (p, false))
                .chain(self.links_stats.iter().map(|p| (p, true)))
                .map(|(p, links)| {
                    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                    PipelineJson {
                        tx_packets: l(&p.tx_packets),
                        tx_bytes: l(&p.tx_bytes),
                        tx_batches: l(&p.tx_batches),
                        rx_packets: l(&p.rx_packets),
                        rx_bytes: l(&p.rx_bytes),
                        rx_batches: l(&p.rx_batches),
                        tx_gso_records: l(&p.tx_gso_records),
                        rx_gso_records: l(&p.rx_gso_records),
                        drops: counters(&p.drops),
                        links,
                    }
                })
                .collect(),
            threads: self.cfg.threads,
            uptime_secs: now.duration_since(self.started).as_secs(),
            drops,
            peers,
            routes: st
                .routes
                .iter()
                .map(|r| RouteJson {
                    node_id: r.node.to_string(),
                    hostname: r.hostname.clone(),
                    overlay: r.overlay.to_string(),
                    overlay6: r.overlay6.map(|a| a.to_string()),
                    next_hop: r.next_hop.to_string(),
                    next_hop_hostname: st.peers.iter().find(|q| q.node_id == r.next_hop).map(|q| q.hostname.clone()),
                    hops: r.hops,
                    latency_ms: r.latency_ms,
                    session: r.session,
                    proxied: r.proxied.iter().map(|(a, p)| format!("{a}/{p}")).collect(),
                })
                .collect(),
            rejected_records: st.rejected_records,
            queued_dropped: st.queued_dropped,
            refused: st.refused.clone(),
            address_conflicts: st
                .conflicts
                .iter()
                .map(|(id, host)| format!("{id} ({host}) also claims {}", self.cfg.ipv4.addr))
                .collect(),
            proxy_networks: self.cfg.proxy_networks.iter().map(ToString::to_string).collect(),
            pending_peers: st
                .dials
                .iter()
                .map(|d| PendingJson { endpoint: d.endpoint.to_string(), attempts: d.attempts, error: d.error.clone() })
                .collect(),
            refused_handshakes: st
                .inbound_failures
                .iter()
                .map(|f| RefusedJson {
                    from: f.from.to_string(),
                    reason: f.reason.clone(),
                    kind: f.kind,
                    count: f.count,
                    last_secs: now.saturating_duration_since(f.last).as_secs(),
                })
                .collect(),
            admission: {
                let a = self.engine.admission(now);
                AdmissionJson {
                    bad_mac: a.bad_mac,
                    rate_limited: a.rate_limited,
                    cookies_sent: a.cookies_sent,
                    cookies_received: a.cookies_received,
                    state_full: a.state_full,
                    under_load: a.under_load,
                }
            },
            wg_portal: self.portal.as_ref().map(crate::portal::Portal::status),
            exit_node: self.cfg.exit_node,
            exit: st.exit.as_ref().map(|e| weft_control::ExitJson {
                wanted: e.wanted.clone(),
                node_id: e.node.as_ref().map(|(id, _)| id.to_string()),
                hostname: e.node.as_ref().map(|(_, h)| h.clone()),
                state: match (&e.node, e.routing) {
                    (_, true) => ExitState::Routing,
                    (Some(_), false) => ExitState::Unreachable,
                    (None, false) if e.changed_to.is_some() => ExitState::Changed,
                    (None, false) if e.known => ExitState::NotOffered,
                    (None, false) => ExitState::UnknownMember,
                },
                fallback: self.cfg.exit_fallback,
                pinned: e.pinned.map(|id| id.to_string()),
                changed_to: e
                    .changed_to
                    .as_ref()
                    .map(|(id, h)| weft_control::ExitOfferJson { node_id: id.to_string(), hostname: h.clone() }),
            }),
            exit_offers: st
                .exit_offers
                .iter()
                .map(|(id, h)| weft_control::ExitOfferJson { node_id: id.to_string(), hostname: h.clone() })
                .collect(),
            magic_dns: self.dns.as_ref().map(|d| {
                let zone = d.zone.load();
                weft_control::MagicDnsJson {
                    domain: zone.domain(),
                    server: d.addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "),
                    name: zone.name_of(self.cfg.ipv4.addr),
                    names: zone.len(),
                    answered: d.stats.answered.load(Ordering::Relaxed),
                    dropped: d.stats.dropped.load(Ordering::Relaxed),
                }
            }),
            handshakes_completed: st.handshakes_completed,
            handshake_failures: st.handshake_failures.clone(),
            control_traffic: self.control_traffic.clone(),
            connections_by_transport: self.connector.links().by_transport().into_iter().collect(),
            userspace: self.userspace.as_ref().map(crate::userspace::Userspace::json),
        }
    }
}

/// Turns IPv4 forwarding on (proxied subnets and the portal need it). Under systemd
/// this file is the one tunable the unit leaves writable (ReadWritePaths=); an admin
/// who enabled forwarding already (sysctl.d) needs no write at all.
/// Turns on forwarding of one family (IPv6: `ipv6`), for proxied subnets, the
/// portal or an exit node.
fn enable_forwarding(ipv6: bool) -> Result<(), String> {
    let (path, family, sysctl) = if ipv6 {
        ("/proc/sys/net/ipv6/conf/all/forwarding", "IPv6", "net.ipv6.conf.all.forwarding")
    } else {
        ("/proc/sys/net/ipv4/ip_forward", "IPv4", "net.ipv4.ip_forward")
    };
    if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        info!("{family} forwarding already on");
        return Ok(());
    }
    match std::fs::write(path, "1") {
        Ok(()) => {
            info!("{family} forwarding enabled (proxied subnets, the portal or an exit node)");
            Ok(())
        }
        Err(e) => {
            let msg = format!(
                "cannot enable {family} forwarding ({path}: {e}); under systemd the unit needs ReadWritePaths={path}, or set {sysctl}=1 in sysctl.d"
            );
            warn!("{msg}; proxied subnets will not be reachable");
            Err(msg)
        }
    }
}

fn no_portal() -> Reply {
    Reply::Error {
        message: "this node runs no WireGuard portal (start it with --wg-portal udp://ADDR:PORT --wg-portal-net CIDR)"
            .into(),
    }
}

fn counters(d: &DropCounters) -> BTreeMap<String, u64> {
    d.nonzero().into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
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

fn bind_control(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        // A socket nobody answers on is a leftover from a crash; a live one is another node.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "control socket {} is in use: another weft node is running (pass --control to run a second one)",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("cannot remove stale control socket {}", path.display()))?;
    }
    let l = UnixListener::bind(path).with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(l)
}

/// Control connections served at once; more are closed at once.
pub const MAX_CONTROL_CLIENTS: usize = 32;
/// Further connections kept for root and the admin group, so that plain members
/// holding every slot cannot lock the admins out.
pub const ADMIN_CONTROL_RESERVE: usize = 4;
/// Longest request line.
const MAX_REQUEST: u64 = 64 * 1024;
/// How long a client has to send its request, and to take the reply.
const CONTROL_IO_LIMIT: Duration = Duration::from_secs(5);

/// Who may change the node (see [`crate::access`]).
#[derive(Clone)]
struct Admins {
    group: String,
    gid: Option<u32>,
}

async fn accept_loop(
    listener: UnixListener,
    requests: mpsc::Sender<StatusRequest>,
    admins: Admins,
    args: Arc<crate::args::UpArgs>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONTROL_CLIENTS));
    let reserve = Arc::new(tokio::sync::Semaphore::new(ADMIN_CONTROL_RESERVE));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // A client cannot make the server wait: a full house closes the new
                // connection at once, and each slot is free again within 5 s + 5 s.
                // Root and the admin group may still use the reserve.
                let slot = match slots.clone().try_acquire_owned() {
                    Ok(s) => Ok(s),
                    Err(_) if client_of(&stream).is_some_and(|c| c.may_change(admins.gid)) => {
                        reserve.clone().try_acquire_owned()
                    }
                    Err(e) => Err(e),
                };
                let Ok(slot) = slot else {
                    debug!("control socket: too many clients; closing a new connection");
                    drop(stream);
                    continue;
                };
                let (requests, admins, args) = (requests.clone(), admins.clone(), args.clone());
                tokio::spawn(async move {
                    serve_client(stream, requests, &admins, &args).await;
                    drop(slot);
                });
            }
            Err(e) => {
                error!(error = %e, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The credentials of the process at the other end of `stream` (SO_PEERCRED).
fn client_of(stream: &UnixStream) -> Option<crate::access::Client> {
    let cred = stream.peer_cred().ok()?;
    let groups = cred.pid().map(|p| crate::access::process_groups(p, cred.uid(), cred.gid())).unwrap_or_default();
    Some(crate::access::Client { uid: cred.uid(), gid: cred.gid(), groups })
}

async fn serve_client(
    stream: UnixStream,
    requests: mpsc::Sender<StatusRequest>,
    admins: &Admins,
    args: &Arc<crate::args::UpArgs>,
) {
    let client = client_of(&stream);
    let (r, mut w) = stream.into_split();
    // One request line, at most 64 KiB, within 5 s: a client that never sends a
    // newline is cut off.
    let mut lines = BufReader::new(r.take(MAX_REQUEST)).lines();
    let read = tokio::time::timeout(CONTROL_IO_LIMIT, lines.next_line()).await;
    let reply = match read {
        Ok(Ok(Some(line))) => match serde_json::from_str::<Request>(&line) {
            Ok(req) if req.changes_node() && !client.as_ref().is_some_and(|c| c.may_change(admins.gid)) => {
                // At most one warning every 10 s: a local client must not flood the log.
                static LAST_WARNING: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
                let now = Instant::now();
                let mut last = LAST_WARNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10)) {
                    *last = Some(now);
                    warn!(client = ?client, "control request refused: changing the node needs root or the admin group");
                } else {
                    debug!(client = ?client, "control request refused");
                }
                Reply::Error { message: crate::access::refusal(&admins.group) }
            }
            Ok(req) => match ask(req, args).await {
                Ok(a) => {
                    let (tx, rx) = oneshot::channel();
                    if requests.send((a, tx)).await.is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(r) => r,
                        Err(_) => return,
                    }
                }
                Err(message) => Reply::Error { message },
            },
            Err(e) => Reply::Error { message: format!("bad request: {e}") },
        },
        _ => return,
    };
    if let Ok(mut text) = serde_json::to_string(&reply) {
        text.push('\n');
        // A client that does not read its reply loses it, and its slot.
        let _ = tokio::time::timeout(CONTROL_IO_LIMIT, w.write_all(text.as_bytes())).await;
    }
}

/// Scrapes served at once; more are closed at once.
const MAX_SCRAPES: usize = 8;
/// Longest HTTP request head.
const MAX_HTTP_HEAD: usize = 8192;

/// Serves `GET /metrics` (HTTP/1.1, one request per connection): at most 8 at once,
/// each with 5 s to send its request and take the reply.
async fn metrics_loop(listener: tokio::net::TcpListener, requests: mpsc::Sender<StatusRequest>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                debug!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let requests = requests.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(2 * CONTROL_IO_LIMIT, scrape(stream, requests)).await;
            drop(slot);
        });
    }
}

async fn scrape(mut stream: tokio::net::TcpStream, requests: mpsc::Sender<StatusRequest>) -> std::io::Result<()> {
    let mut head = vec![0u8; MAX_HTTP_HEAD];
    let mut n = 0;
    let complete = loop {
        let got = tokio::time::timeout(CONTROL_IO_LIMIT, stream.read(&mut head[n..]))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if got == 0 {
            return Ok(());
        }
        n += got;
        if head[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if n == head.len() {
            break false;
        }
    };
    let line = String::from_utf8_lossy(&head[..n]).lines().next().unwrap_or_default().to_owned();
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let text = |s: &str| ("text/plain; charset=utf-8", s.to_owned());
    let (status, (ctype, body)) = if !complete {
        ("431 Request Header Fields Too Large", text("request head too large\n"))
    } else if method != "GET" {
        ("405 Method Not Allowed", text("only GET\n"))
    } else if path != "/metrics" && !path.starts_with("/metrics?") {
        ("404 Not Found", text("metrics are at /metrics\n"))
    } else {
        let (tx, rx) = oneshot::channel();
        let status = match requests.send((Ask::Status, tx)).await {
            Ok(()) => rx.await.ok(),
            Err(_) => None,
        };
        match status.map(|r| match r {
            Reply::Status(s) => crate::metrics::render(&s).map_err(|e| e.to_string()),
            _ => Err("no status".to_owned()),
        }) {
            Some(Ok(body)) => ("200 OK", (crate::metrics::CONTENT_TYPE, body)),
            Some(Err(e)) => ("500 Internal Server Error", text(&format!("{e}\n"))),
            None => ("503 Service Unavailable", text("the node is shutting down\n")),
        }
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

/// The addresses peers may reach this node at: the listen address, or with a wildcard
/// listener every non-loopback IPv4 interface address except the overlay's own.
fn local_endpoints(
    listeners: &[Endpoint],
    overlay: std::net::Ipv4Addr,
    dev: &str,
    portal_dev: Option<&str>,
) -> Vec<Endpoint> {
    let ips = local_ipv4s(overlay, portal_dev);
    let ips6 = if listeners.iter().any(|l| l.addr.is_ipv6()) { local_ipv6s(dev, portal_dev) } else { Vec::new() };
    let mut out = Vec::new();
    for l in listeners {
        if l.addr.ip().is_unspecified() {
            out.extend(ips.iter().map(|a| Endpoint::new(l.proto, SocketAddr::new((*a).into(), l.addr.port()))));
            // `[::]` is dual-stack: its IPv6 addresses too.
            if l.addr.is_ipv6() {
                out.extend(ips6.iter().map(|a| Endpoint::new(l.proto, SocketAddr::new((*a).into(), l.addr.port()))));
            }
        } else {
            out.push(*l);
        }
    }
    out
}

/// Non-loopback, non-link-local IPv4 addresses of this host, except the overlay's own
/// and those of the WireGuard portal's device (both live inside the overlay: a member
/// that dialled them would carry the overlay through itself).
fn local_ipv4s(overlay: std::net::Ipv4Addr, portal_dev: Option<&str>) -> Vec<std::net::Ipv4Addr> {
    let Ok(ifs) = if_addrs::get_if_addrs() else { return Vec::new() };
    ifs.into_iter()
        .filter(|i| !i.is_loopback() && Some(i.name.as_str()) != portal_dev)
        .filter_map(|i| match i.ip() {
            IpAddr::V4(v4) if v4 != overlay && !v4.is_link_local() => Some(v4),
            _ => None,
        })
        .collect()
}

/// This host's IPv6 addresses a member elsewhere could reach: not loopback, not
/// link-local (they need a scope), not the TUN's (the IPv6 overlay) nor the portal
/// device's.
fn local_ipv6s(dev: &str, portal_dev: Option<&str>) -> Vec<Ipv6Addr> {
    let Ok(ifs) = if_addrs::get_if_addrs() else { return Vec::new() };
    ifs.into_iter()
        .filter(|i| !i.is_loopback() && i.name != dev && Some(i.name.as_str()) != portal_dev)
        .filter_map(|i| match i.ip() {
            IpAddr::V6(v6) if !v6.is_unicast_link_local() && !v6.is_loopback() => Some(v6),
            _ => None,
        })
        .collect()
}

/// A change to the host's network configuration (`ip` commands).
enum NetJob {
    /// Route these subnets (other members proxy them) into the TUN, except `own`.
    Routes { wanted: Vec<(IpAddr, u8)>, own: Vec<(IpAddr, u8)> },
    /// Move the TUN's overlay address.
    Address { old: std::net::Ipv4Addr, new: std::net::Ipv4Addr, prefix: u8 },
    /// Send the default route into the TUN (true) or stop (--exit-fallback).
    ExitRoute(bool),
}

/// The thread that runs `ip` commands, in order, so that the control loop never
/// waits for a process.
struct NetConfig {
    /// None without a TUN: there is no kernel state to change.
    jobs: Option<std::sync::mpsc::Sender<NetJob>>,
}

impl NetConfig {
    fn none() -> Self {
        Self { jobs: None }
    }

    fn spawn(dev: String, ipv6: bool) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<NetJob>();
        std::thread::Builder::new().name("weft-netcfg".into()).spawn(move || {
            // Proxied subnets currently routed into the TUN (by us).
            let mut kernel_routes: Vec<(IpAddr, u8)> = Vec::new();
            while let Ok(job) = rx.recv() {
                match job {
                    NetJob::Routes { mut wanted, own } => {
                        // An exit's /0 is never a main-table route: policy routing
                        // (crate::exit) carries the default route.
                        wanted.retain(|s| s.1 != 0);
                        kernel_routes = install_routes(&dev, &kernel_routes, wanted, &own)
                    }
                    NetJob::ExitRoute(true) => {
                        crate::exit::unroute();
                        if let Err(e) = crate::exit::route_through(&dev, ipv6) {
                            warn!(error = %e, "cannot route through the exit node");
                        }
                    }
                    NetJob::ExitRoute(false) => crate::exit::unroute(),
                    NetJob::Address { old, new, prefix } => {
                        // Delete first: removing a primary address also removes the
                        // secondaries of its subnet (promote_secondaries is off by default).
                        run_ip(&["addr", "del", &format!("{old}/{prefix}"), "dev", &dev]);
                        run_ip(&["addr", "add", &format!("{new}/{prefix}"), "dev", &dev]);
                    }
                }
            }
        })?;
        Ok(Self { jobs: Some(jobs) })
    }

    fn send(&self, job: NetJob) {
        let Some(jobs) = &self.jobs else { return };
        if jobs.send(job).is_err() {
            warn!("the network configuration thread is gone; kernel routes are not updated");
        }
    }
}

/// Routes the subnets other members proxy into our TUN (and removes the ones we added
/// that are gone); returns what is routed now. Routes are added, never replaced: a
/// prefix this host already routes elsewhere keeps its route (and is logged); only
/// routes we added are ever removed.
fn install_routes(
    dev: &str,
    current: &[(IpAddr, u8)],
    subnets: Vec<(IpAddr, u8)>,
    own: &[(IpAddr, u8)],
) -> Vec<(IpAddr, u8)> {
    let wanted: Vec<(IpAddr, u8)> = subnets.into_iter().filter(|r| !own.contains(r)).collect();
    for (a, p) in current.iter().filter(|r| !wanted.contains(r)) {
        run_ip(&["route", "del", &format!("{a}/{p}"), "dev", dev]);
    }
    let mut installed = Vec::new();
    for (a, p) in wanted {
        let cidr = format!("{a}/{p}");
        if current.contains(&(a, p)) {
            installed.push((a, p));
            continue;
        }
        match ip(&["route", "add", &cidr, "dev", dev]) {
            Ok(()) => installed.push((a, p)),
            Err(e) if e.contains("File exists") => {
                warn!(subnet = %cidr, "not routing a member's subnet into the tunnel: this host already has a route for it");
            }
            Err(e) => warn!(subnet = %cidr, error = %e, "cannot route a member's subnet into the tunnel"),
        }
    }
    installed
}

/// Runs `ip ARGS`, logging a failure (route changes are best effort: the mesh works
/// without them, only the proxied subnets would be unreachable).
fn run_ip(args: &[&str]) {
    if let Err(e) = ip(args) {
        warn!(?args, error = %e, "ip command failed");
    }
}

/// Runs `ip ARGS`; the error is its standard error (or why it could not run).
pub(crate) fn ip(args: &[&str]) -> Result<(), String> {
    match std::process::Command::new("ip").args(args).output() {
        Ok(o) if o.status.success() => {
            debug!(?args, "ip");
            Ok(())
        }
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => Err(format!("cannot run ip: {e}")),
    }
}

/// The IPv4 networks this host is directly connected to (every interface but the
/// tunnel, loopback included): a member proxying one of them is refused.
fn local_networks(dev_name: &str) -> Vec<(IpAddr, u8)> {
    let Ok(ifs) = if_addrs::get_if_addrs() else { return Vec::new() };
    let mut v: Vec<(IpAddr, u8)> = ifs
        .into_iter()
        .filter(|i| i.name != dev_name)
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) => {
                let prefix = u32::from(a.netmask).leading_ones() as u8;
                Some((weft_core::route::network_ip(IpAddr::V4(a.ip), prefix), prefix))
            }
            // Link-local and loopback prefixes are every host's; they say nothing.
            if_addrs::IfAddr::V6(a) if !a.ip.is_unicast_link_local() && !a.ip.is_loopback() => {
                let prefix = u128::from(a.netmask).leading_ones() as u8;
                Some((weft_core::route::network_ip(IpAddr::V6(a.ip), prefix), prefix))
            }
            if_addrs::IfAddr::V6(_) => None,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}
