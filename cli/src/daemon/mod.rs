//! `weft up`: the node daemon. [`run`] takes the start steps (`start`) in order:
//! state and key, the TUN (or the userspace stack), the UDP sockets, host settings,
//! the pipeline threads, the engine and the listeners; then the runtime loop
//! (`runtime`) drives the sans-IO engine on a small tokio runtime, carries out its
//! actions, and serves the control socket, reload (`reload`) and status
//! (`status`). Connection tasks are the transports' own (`weft-datapath`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arc_swap::ArcSwap;
use tokio::sync::mpsc;
use tracing::info;
use weft_core::admission::MacKeys;
use weft_core::handshake::Psk;
use weft_core::route::RouteSnapshot;
use weft_core::stats::DropCounters;
use weft_datapath::pipeline::{Shared, TX_HEADROOM};
use weft_datapath::transport::conn::Connector;
use weft_datapath::transport::udp::Offload;

use crate::config::NodeConfig;
use crate::config::args::UpArgs;
use crate::host::interfaces::local_endpoints;
use crate::host::net::NetConfig;
use runtime::{QueueSink, Runtime};

pub mod join;
mod reload;
mod requests;
mod runtime;
mod settings;
mod start;
pub mod state;
pub mod status;

/// Depth of the data plane -> control plane queue of authenticated events
/// (confirmations, control messages, path reports).
const CONTROL_QUEUE: usize = 1024;
/// Depth of the queue of handshake datagrams (mac1 already checked). Separate, so
/// that a flood of handshakes never costs an authenticated event its place.
const HANDSHAKE_QUEUE: usize = 256;
/// Received batches waiting for the connection RX thread.
const CONNS_QUEUE: usize = 256;

/// What a live reload needs: the command line `weft up` started with (its flags win
/// over the file again), and whether a flag or RUST_LOG set the log level (then the
/// file's is not applied).
pub struct Reloadable {
    /// The `weft up` arguments.
    pub args: UpArgs,
    /// Whether `--log-level`, WEFT_LOG_LEVEL or RUST_LOG chose the level.
    pub log_level_pinned: bool,
}

/// The PSKs of the network secret and of `network-secret-next` (Argon2id each).
fn psks(cfg: &NodeConfig) -> (Psk, Option<Psk>) {
    let next = cfg.network_secret_next.as_ref().map(|n| Psk::derive(&cfg.network_name, &n.0));
    (Psk::derive(&cfg.network_name, &cfg.network_secret.0), next)
}

/// Runs a node until SIGINT or SIGTERM: each step of the start is a function of
/// `daemon::start`, in the order they run.
pub fn run(mut cfg: NodeConfig, reloadable: Reloadable) -> Result<()> {
    weft_datapath::transport::limit_malloc_arenas();
    crate::config::secret::warn_if_weak(&cfg.network_secret.0);
    start::private_dirs(&cfg)?;
    start::priority();
    let (key, mut ipv6) = start::identity(&mut cfg)?;
    let devices = start::devices(&cfg, &mut ipv6)?;
    let udp = start::udp(&cfg, devices.tun_offload)?;
    let dial = cfg.peers.iter().map(|p| p.resolve()).collect::<Result<Vec<_>, _>>()?;
    let tls = start::tls(&cfg)?;
    // Undoes the exit rules when `run` returns, whichever way (a failure further on
    // included); only a SIGKILL leaves them, for the next start to replace.
    let _host_rules = start::host(&mut cfg, ipv6)?;
    let metrics = cfg.metrics.map(start::bind_metrics).transpose()?;
    let epoch = Instant::now();
    let firewall: Arc<weft_core::firewall::Firewall> = Default::default();
    let portal = start::portal(&cfg, &firewall, epoch)?;
    let (psk, next_psk) = psks(&cfg);
    let (ctl_tx, ctl_rx) = mpsc::channel(CONTROL_QUEUE);
    let (hs_tx, hs_rx) = mpsc::channel(HANDSHAKE_QUEUE);
    let sink = Arc::new(QueueSink { events: ctl_tx, handshakes: hs_tx, overloaded: AtomicBool::new(false) });
    let shared = Shared {
        routes: Arc::new(ArcSwap::from_pointee(RouteSnapshot::default())),
        control: sink.clone(),
        macs: Arc::new(MacKeys::new(&psk)),
        epoch,
        stop: Arc::new(AtomicBool::new(false)),
        offload: Arc::new(Offload::new(udp.gso, udp.gro)),
        firewall,
    };
    let tun_queue = devices.queues.first().filter(|_| devices.tun_offload).cloned();
    let data = start::pipelines(&cfg, devices.queues, devices.tun_offload, &udp, &shared)?;
    // The PSK derived above (Argon2id, once): the handshake, its MACs and the LAN
    // beacon key all come from it.
    let beacon_key = crate::services::discovery::beacon_key(&psk.subkey(crate::services::discovery::KEY_LABEL));
    let mut engine = start::engine(&cfg, key, psk.clone(), ipv6, &dial, epoch)?;
    start::secrets(&mut engine, &shared, psk, next_psk);
    info!(node_id = %engine.id(), addr = %cfg.ipv4, cipher = %cfg.cipher, threads = cfg.threads, "node starting");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("weft-ctl")
        .build()
        .context("cannot start the control runtime")?;
    let (down_tx, down_rx) = mpsc::channel(CONTROL_QUEUE);
    let frame_max = usize::from(cfg.mtu) + TX_HEADROOM + 64;
    let connector = Connector::new(data.links, down_tx, tls, cfg.max_connections, frame_max, engine.mac_keys())?;
    for (p, ep) in cfg.peers.iter().zip(&dial) {
        connector.set_path(*ep, p.path.clone());
    }
    let bound = start::listeners(&rt, &connector, &cfg, udp.bound)?;
    let portal_dev = cfg.wg_portal.as_ref().map(|_| crate::services::portal::device_name(&cfg.dev_name));
    engine.set_endpoints(local_endpoints(&bound, cfg.ipv4.addr, &cfg.dev_name, portal_dev.as_deref()));
    let netcfg = if cfg.no_tun { NetConfig::none() } else { NetConfig::spawn(cfg.dev_name.clone(), ipv6.is_some())? };
    let state_writer = state::StateWriter::spawn(cfg.state_dir.clone())?;
    let userspace = match devices.stack {
        Some(stack) => Some(start::userspace(&cfg, stack, &shared)?),
        None => None,
    };
    let cfg_peers = cfg.peers.clone();
    let mut runtime = Runtime {
        cfg,
        ipv6,
        engine,
        shared,
        sender: udp.socks[0].clone(),
        udp_socks: udp.socks,
        udp_gro: udp.gro_per_socket,
        started: epoch,
        tun_queue,
        pipelines: data.stats,
        drops: DropCounters::default(),
        netcfg,
        state_writer,
        expiry_warned: None,
        policy: Default::default(),
        connector,
        links_stats: data.links_stats,
        listeners: bound,
        udp_port: udp.bound.port(),
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
        portmap: None,
        portmap_state: crate::services::portmap::Publisher::new(Arc::new(
            tokio::sync::watch::channel(Default::default()).0,
        )),
        mapped: None,
    };
    start::policy(&mut runtime)?;
    runtime.update_portal();
    let result = rt.block_on(runtime.serve(ctl_rx, hs_rx, sink, down_rx, metrics));
    // Pipeline threads block in TUN reads; the process exit ends them.
    rt.shutdown_timeout(Duration::from_millis(200));
    result
}
