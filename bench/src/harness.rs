//! The virtual-clock harness: [`Node`]s driven on a virtual clock with the REAL data
//! plane in memory. The mesh simulator ([`crate::sim`], the `meshsim` binary) and the
//! engine's pair, admission and discovery tests (`peers/tests/`) are built on it.
//!
//! Each [`Host`] keeps what the runtime keeps for one node: the engine, its latest
//! published [`RouteSnapshot`], a [`Shared`] whose control sink collects the
//! [`ControlEvent`]s its RX pipeline raises, its pipeline counters, and the IP packets
//! its RX wrote to its "TUN". A [`DataPlane`] holds one `Rx` and one `Tx` and runs
//! them for whichever host is receiving or sending (they keep no state between
//! calls, and the simulation is single-threaded, so one of each serves every host).
//!
//! ```text
//!  datagrams --slab--> Rx::process(snapshot) --TUN--> host.tun
//!                           |  \--forwarded()--> Wire (relayed frames go on)
//!                           \--ControlEvents--> Node::handle --actions--> Wire / snapshot
//! ```
//!
//! Virtual time moves in whole milliseconds: `Rx::process` and `Tx::process` take the
//! pipeline clock as a parameter, and the harness passes the virtual millisecond the
//! engine sees.
//!
//! Every [`ControlEvent`] the pipelines raise reaches the engine through one function,
//! [`Host::dispatch`] (RX's events after each slab, TX's after each send): a new event
//! kind is one more arm there.

use std::net::Ipv4Addr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_datapath::transport::Endpoint;

use arc_swap::ArcSwap;
use rand::RngCore;
use tun_rs::{GROTable, VIRTIO_NET_HDR_LEN};
use weft_core::admission::MacKeys;
use weft_core::crypto::Cipher;
use weft_core::handshake::{Hello, Params, Psk, StaticKey};
use weft_core::route::RouteSnapshot;
use weft_core::stats::{DropCounters, DropReason};
use weft_datapath::pipeline::{
    ControlEvent, ControlSink, PipelineConfig, PipelineStats, Rx, Shared, TX_HEADROOM, TunWriter, Tx,
};
use weft_datapath::transport::udp::{Offload, RecvMeta};
use weft_peers::{Action, Config, Input, Node, NodeId, Timers};

/// Pipeline sizes used everywhere.
pub const PIPELINE: PipelineConfig = PipelineConfig { mtu: 1420, offload: false, udp_gro: false, pin: None };

/// A datagram on the wire.
#[derive(Debug, Clone)]
pub struct Wire {
    /// Source address (the sending host's).
    pub from: Endpoint,
    /// Destination address.
    pub to: Endpoint,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Whether a relay forwarded it (rather than the engine or Tx emitting it).
    pub forwarded: bool,
}

/// Collects control events as the runtime's bounded queue would (never full here).
#[derive(Default)]
pub struct Sink(Mutex<Vec<ControlEvent>>);

impl ControlSink for Sink {
    fn try_push(&self, ev: ControlEvent) -> bool {
        self.0.lock().expect("sink lock").push(ev);
        true
    }
}

impl Sink {
    fn take(&self) -> Vec<ControlEvent> {
        std::mem::take(&mut *self.0.lock().expect("sink lock"))
    }
}

/// Stands in for a TUN queue: keeps the IP packets RX writes.
struct Collect<'a>(&'a mut Vec<Vec<u8>>);

impl TunWriter for Collect<'_> {
    fn write_batch(&mut self, _gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> std::io::Result<()> {
        self.0.extend(bufs.iter().map(|b| b[VIRTIO_NET_HDR_LEN..].to_vec()));
        Ok(())
    }
}

/// One machine: an engine (while running) and its data-plane state.
pub struct Host {
    /// Its UDP address.
    pub addr: Endpoint,
    /// The engine, while the node runs.
    pub node: Option<Node>,
    /// The latest snapshot the engine published.
    pub routes: Arc<RouteSnapshot>,
    /// RX/TX pipeline counters.
    pub stats: Arc<PipelineStats>,
    /// IP packets RX wrote to the TUN.
    pub tun: Vec<Vec<u8>>,
    /// Subnets the engine asked to route into the TUN (`Action::InstallRoutes`).
    pub installed: Vec<(std::net::IpAddr, u8)>,
    /// The name bindings and exit pin the engine last asked to keep.
    pub names: Option<weft_peers::Names>,
    /// The revocations the engine last asked to keep.
    pub revocations: Vec<weft_core::cert::Revocation>,
    /// Overlay address changes the engine ordered (`Action::SetAddress`).
    pub addresses: Vec<(Ipv4Addr, Ipv4Addr, u8)>,
    /// Every `TunOffloadOff` the engine gave, with its reason (the virtual TUN has no
    /// offload to turn off).
    pub tun_offload_off: Vec<String>,
    /// Datagrams the engine sent (`Action::Send`): control-plane traffic.
    pub ctl_datagrams: u64,
    /// Bytes of those datagrams.
    pub ctl_bytes: u64,
    /// Relayed frames this host's RX forwarded.
    pub fwd_datagrams: u64,
    /// Bytes of those frames.
    pub fwd_bytes: u64,
    sink: Arc<Sink>,
    shared: Shared,
}

impl Host {
    /// A stopped host at `addr` whose pipelines count time from `epoch`.
    pub fn new(addr: Endpoint, epoch: Instant) -> Self {
        let sink = Arc::new(Sink::default());
        let shared = Shared {
            routes: Arc::new(ArcSwap::from_pointee(RouteSnapshot::default())),
            control: sink.clone(),
            macs: Arc::new(MacKeys::new(&Psk::from_bytes([0; 32]))),
            epoch,
            stop: Arc::new(AtomicBool::new(false)),
            offload: Arc::new(Offload::new(false, false)),
            firewall: Default::default(),
        };
        Self {
            addr,
            node: None,
            routes: Arc::default(),
            stats: Arc::default(),
            tun: Vec::new(),
            installed: Vec::new(),
            names: None,
            revocations: Vec::new(),
            addresses: Vec::new(),
            tun_offload_off: Vec::new(),
            ctl_datagrams: 0,
            ctl_bytes: 0,
            fwd_datagrams: 0,
            fwd_bytes: 0,
            sink,
            shared,
        }
    }

    /// Starts (or restarts) the engine; the data plane starts with an empty snapshot.
    pub fn start(&mut self, node: Node) {
        self.shared.macs = node.mac_keys();
        self.node = Some(node);
        self.routes = Arc::default();
        self.installed.clear();
        self.sink.take();
    }

    /// Stops the node: engine state and routes are gone.
    pub fn stop(&mut self) {
        self.node = None;
        self.routes = Arc::default();
        self.sink.take();
    }

    /// Whether the engine runs.
    pub fn running(&self) -> bool {
        self.node.is_some()
    }

    /// The engine; panics when the node is stopped.
    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("node is running")
    }

    /// The engine's node id; panics when the node is stopped.
    pub fn id(&self) -> NodeId {
        self.node().id()
    }

    /// Carries out the engine's actions: snapshots are applied at once, datagrams
    /// appended to `out`.
    pub fn drain(&mut self, out: &mut Vec<Wire>) {
        let Some(node) = self.node.as_mut() else { return };
        while let Some(a) = node.poll_action() {
            match a {
                Action::PublishRoutes(r) => {
                    self.shared.routes.store(r.clone());
                    self.routes = r;
                }
                Action::InstallRoutes(subnets) => self.installed = subnets,
                Action::SetAddress { old, new, prefix } => self.addresses.push((old, new, prefix)),
                Action::SaveNames(names) => self.names = Some(names),
                Action::SaveRevocations(list) => self.revocations.extend(list),
                Action::TunOffloadOff { why } => self.tun_offload_off.push(why),
                // The virtual network has no NATs: nobody is endpoint-dependent.
                Action::OpenMappings { .. }
                | Action::SaveIssued(_)
                | Action::SaveCertificates(_)
                | Action::PolicyChanged(_)
                | Action::PolicyRefused(_) => {}
                Action::Send { to, bytes } => {
                    self.ctl_datagrams += 1;
                    self.ctl_bytes += bytes.len() as u64;
                    out.push(Wire { from: self.addr, to, bytes, forwarded: false });
                }
                // A batch arrives as the datagrams it is (the virtual network has
                // no offloads to lose).
                Action::SendBatch { to, datagrams } => {
                    for bytes in datagrams {
                        self.ctl_datagrams += 1;
                        self.ctl_bytes += bytes.len() as u64;
                        out.push(Wire { from: self.addr, to, bytes, forwarded: false });
                    }
                }
            }
        }
    }

    /// When the engine next wants [`Host::timeout`] (`Node::poll_timeout`); `None`
    /// when it is stopped or has nothing scheduled.
    pub fn deadline(&self) -> Option<Instant> {
        self.node.as_ref().and_then(Node::poll_timeout)
    }

    /// Hands the control events the pipelines raised to the engine, in order, draining
    /// its actions after each; `out` gets the datagrams. The one place where a
    /// [`ControlEvent`] becomes an [`Input`].
    pub fn dispatch(&mut self, now: Instant, out: &mut Vec<Wire>) {
        for ev in self.sink.take() {
            let Some(node) = self.node.as_mut() else { break };
            match ev {
                ControlEvent::Datagram { from, via, bytes } => {
                    node.handle(now, Input::Datagram { from, via: via.map(NodeId::from_bytes), bytes: &bytes });
                }
                ControlEvent::Message { local_index, bytes } => {
                    node.handle(now, Input::Message { local_index, bytes: &bytes });
                }
                ControlEvent::Direct { local_index, from } => node.handle(now, Input::Direct { local_index, from }),
                ControlEvent::Confirmed { local_index } => node.handle(now, Input::Confirmed { local_index }),
                ControlEvent::Unrouted { dst, packet } => node.handle(now, Input::Unrouted { dst, packet: &packet }),
                ControlEvent::StaleSession { local_index } => node.handle(now, Input::StaleSession { local_index }),
                ControlEvent::BadChecksum { local_index } => node.handle(now, Input::BadChecksum { local_index }),
            }
            self.drain(out);
        }
    }

    /// `handle_timeout`, then drain.
    pub fn timeout(&mut self, now: Instant, out: &mut Vec<Wire>) {
        if let Some(n) = self.node.as_mut() {
            n.handle_timeout(now);
        }
        self.drain(out);
    }

    /// Feeds one input straight to the engine (bypassing the data plane), then drains.
    pub fn input(&mut self, now: Instant, input: Input<'_>, out: &mut Vec<Wire>) {
        if let Some(n) = self.node.as_mut() {
            n.handle(now, input);
        }
        self.drain(out);
    }

    /// Runs `f` on the engine (an administrator's request), then drains.
    pub fn admin<R>(&mut self, f: impl FnOnce(&mut Node) -> R, out: &mut Vec<Wire>) -> R {
        let r = f(self.node.as_mut().expect("node is running"));
        self.drain(out);
        r
    }

    /// Sum of every drop counter of this host: pipeline-wide and per peer.
    pub fn drops(&self, now: Instant) -> u64 {
        let pipeline: u64 = DropReason::ALL.iter().map(|r| self.stats.drops.get(*r)).sum();
        let peers: u64 = self.node.as_ref().map_or(0, |n| {
            n.status(now).peers.iter().map(|p| DropReason::ALL.iter().map(|r| p.stats.drops.get(*r)).sum::<u64>()).sum()
        });
        pipeline + peers
    }

    /// Non-zero drop counters by reason (pipeline-wide plus per peer), for messages.
    pub fn drop_reasons(&self, now: Instant) -> Vec<(&'static str, u64)> {
        let mut v = self.stats.drops.nonzero();
        if let Some(n) = self.node.as_ref() {
            for p in n.status(now).peers {
                v.extend(p.stats.drops.nonzero());
            }
        }
        v
    }
}

/// One RX and one TX pipeline, run for whichever host needs them.
pub struct DataPlane {
    rx: Rx,
    tx: Tx,
    /// The virtual clock's origin (every node's `Config::epoch`).
    pub epoch: Instant,
}

impl DataPlane {
    /// Pipelines whose clock counts from `epoch`.
    pub fn new(epoch: Instant) -> Self {
        Self { rx: Rx::new(PIPELINE), tx: Tx::new(PIPELINE), epoch }
    }

    /// Virtual whole milliseconds since the epoch.
    fn elapsed_ms(&self, now: Instant) -> Duration {
        Duration::from_millis(now.saturating_duration_since(self.epoch).as_millis() as u64)
    }

    /// The pipeline clock at `now` (as the engine computes it: ms since epoch, plus 1).
    pub fn now_ms(&self, now: Instant) -> u64 {
        self.elapsed_ms(now).as_millis() as u64 + 1
    }

    /// `host` receives `dgrams` (source, bytes) at virtual time `now`: they go through
    /// the real RX pipeline in batches of at most one slab; the control events it
    /// raises go to the engine; relayed frames and the engine's datagrams are appended
    /// to `out`. Returns how many IP packets reached the host's TUN.
    pub fn receive(
        &mut self,
        host: &mut Host,
        now: Instant,
        dgrams: &[(Endpoint, &[u8])],
        out: &mut Vec<Wire>,
    ) -> usize {
        if !host.running() {
            return 0;
        }
        let before = host.tun.len();
        let mut rest = dgrams;
        while !rest.is_empty() {
            let (slab, slot, metas) = self.rx.slab();
            let n = rest.len().min(metas.len());
            for (i, (from, d)) in rest[..n].iter().enumerate() {
                let len = d.len().min(slot);
                slab[i * slot..i * slot + len].copy_from_slice(&d[..len]);
                metas[i] = RecvMeta { truncated: d.len() > slot, ..RecvMeta::whole(*from, len) };
            }
            rest = &rest[n..];
            let routes = host.routes.clone();
            let now_ms = self.now_ms(now);
            self.rx.process(&routes, &host.shared, &host.stats, n, now_ms, &mut Collect(&mut host.tun));
            for (to, frame) in self.rx.forwarded() {
                host.fwd_datagrams += 1;
                host.fwd_bytes += frame.len() as u64;
                out.push(Wire { from: host.addr, to, bytes: frame.to_vec(), forwarded: true });
            }
            host.dispatch(now, out);
        }
        host.tun.len() - before
    }

    /// `host`'s TX pipeline reads `packets` from its TUN at `now`: the sealed datagrams
    /// are appended to `out`; packets for members without a session go to the engine
    /// (which sends them once it has one), then the control events TX raised go to
    /// the engine ([`Host::dispatch`]) and its datagrams follow in `out`. Returns how
    /// many datagrams TX produced (not whether they will arrive: check the receiver's
    /// TUN).
    pub fn send(&mut self, host: &mut Host, now: Instant, packets: &[Vec<u8>], out: &mut Vec<Wire>) -> usize {
        let stats = host.stats.clone();
        self.send_with(host, now, packets, out, &stats.drops)
    }

    /// [`DataPlane::send`] counting drops in `drops`.
    pub fn send_with(
        &mut self,
        host: &mut Host,
        now: Instant,
        packets: &[Vec<u8>],
        out: &mut Vec<Wire>,
        drops: &DropCounters,
    ) -> usize {
        let now_ms = self.now_ms(now);
        let mut produced = 0;
        for chunk in packets.chunks(64) {
            let (bufs, sizes) = self.tx.buffers();
            for (i, p) in chunk.iter().enumerate() {
                bufs[i][TX_HEADROOM..TX_HEADROOM + p.len()].copy_from_slice(p);
                sizes[i] = p.len();
            }
            self.tx.process(&host.routes, drops, chunk.len(), now_ms);
            let (bufs, outgoing) = self.tx.outgoing();
            for o in outgoing {
                out.push(Wire {
                    from: host.addr,
                    to: o.to,
                    bytes: bufs[o.buf][o.start..o.start + o.len].to_vec(),
                    forwarded: false,
                });
                produced += 1;
            }
            for (dst, packet) in self.tx.take_unrouted() {
                let Some(node) = host.node.as_mut() else { break };
                node.handle(now, Input::Unrouted { dst, packet: &packet });
                host.drain(out);
            }
        }
        host.dispatch(now, out);
        produced
    }
}

/// An engine configuration with the mesh defaults tests use: announce `endpoint`,
/// fewest hops first, nothing proxied, a fixed overlay address.
pub fn config(handshake: Params, dial: Vec<Endpoint>, epoch: Instant, timers: Timers, endpoint: Endpoint) -> Config {
    Config {
        handshake,
        dial,
        epoch,
        // A fixed wall clock (2027): stamps grow with the virtual clock.
        wall: Duration::from_secs(1_800_000_000),
        authorities: Vec::new(),
        timers,
        endpoints: vec![endpoint],
        latency_first: false,
        proxied: Vec::new(),
        router_priority: weft_peers::topology::DEFAULT_PRIORITY,
        mtu: 1420,
        dynamic: None,
        accept_wide_subnets: false,
        exit_allow_lan: false,
        names: weft_peers::Names::default(),
        use_exit: None,
        local_networks: Vec::new(),
    }
}

/// A static key drawn from `rng` (deterministic, unlike `StaticKey::generate`).
pub fn static_key(rng: &mut impl RngCore) -> StaticKey {
    let mut seed = [0u8; 32];
    rng.fill_bytes(&mut seed);
    StaticKey::from_seed(seed)
}

/// The PSK of a network, derived once per (name, secret) for the whole test binary:
/// Argon2id costs tens of milliseconds by design, and simulations build hundreds of
/// nodes.
pub fn psk(net: &str, secret: &str) -> Psk {
    static CACHE: Mutex<Vec<(String, String, Psk)>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().expect("psk cache");
    if let Some((_, _, p)) = cache.iter().find(|(n, s, _)| n == net && s == secret) {
        return p.clone();
    }
    let p = Psk::derive(net, secret);
    cache.push((net.into(), secret.into(), p.clone()));
    p
}

/// A certificate of `authority` for the node of `params` (its key, address, prefix
/// and host name) in network `net`, valid for a year around the harness's wall clock.
pub fn certificate(authority: &weft_core::cert::AuthorityKey, params: &Params, net: &str) -> Vec<u8> {
    weft_core::cert::CertBody {
        authority: authority.id(),
        node: params.local.public,
        network: net.into(),
        name: params.hello.hostname.clone(),
        ipv4: (params.hello.ipv4, params.hello.prefix),
        ipv6: params.hello.ipv6,
        groups: Vec::new(),
        subnets: Vec::new(),
        exit: false,
        portal: false,
        not_before: 1_800_000_000 - 86_400,
        not_after: 1_800_000_000 + 365 * 86_400,
        issued: Some(1_800_000_000 - 86_400),
        issuer: false,
    }
    .sign(authority)
    .expect("a certificate within the format's limits")
    .to_bytes()
}

/// Handshake parameters of a node.
pub fn params(local: StaticKey, net: &str, secret: &str, cipher: Cipher, ipv4: Ipv4Addr, hostname: String) -> Params {
    Params {
        local,
        psk: psk(net, secret),
        network_name: net.into(),
        hello: Hello {
            gso: true,
            gso_quic: true,
            protocol: Some(weft_core::handshake::Protocol::ours({
                use weft_core::handshake::caps;
                caps::GSO | caps::GSO_QUIC | caps::LEAVE | caps::REVOCATIONS
            })),
            ..Hello::new(cipher, ipv4, 16, hostname)
        },
    }
}

/// A minimal IPv4 packet from `src` to `dst` with `extra` payload bytes (the payload
/// starts with `tag` so that packets can be told apart).
pub fn ip_packet(src: Ipv4Addr, dst: Ipv4Addr, extra: usize, tag: u64) -> Vec<u8> {
    let mut p = vec![0u8; 20 + extra];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + extra) as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let t = tag.to_le_bytes();
    let k = extra.min(8);
    p[20..20 + k].copy_from_slice(&t[..k]);
    p
}
