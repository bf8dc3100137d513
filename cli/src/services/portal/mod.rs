//! The WireGuard portal: devices that run a stock WireGuard client (phones, routers,
//! laptops with the official apps) join the mesh through one member.
//!
//! The WireGuard protocol is boringtun's `noise` module; this file is the glue. The
//! portal owns a UDP socket for its clients and a second TUN device whose subnet is
//! the portal network (`--wg-portal-net`). The node announces that network as a
//! subnet it proxies, so members route it here; the kernel forwards between the
//! overlay TUN and the portal TUN as it does for any proxied subnet.
//!
//! ```text
//!  client --UDP--> weft-wg-rx: mac1/cookie check, client by key or index,
//!                  decapsulate, source == the client's address, destination in the
//!                  mesh --> portal TUN --kernel--> overlay TUN --> mesh
//!  mesh --> overlay TUN --kernel--> portal TUN --> weft-wg-tx: client by destination,
//!                  encapsulate --UDP--> client
//! ```
//!
//! Clients (name, public key, preshared key, address) persist in the state directory
//! (`wg-portal.json`, mode 0600, with the portal's own private key); a client's
//! private key is made when it is added, printed once in its config, and never kept.

use std::collections::{BTreeMap, HashMap};

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};

use tracing::{debug, info, warn};

use weft_core::firewall::Firewall;
use weft_datapath::tun::{SyncDevice, Tun, TunConfig};

use weft_control::{PortalClientJson, PortalJson, WgConfigJson};

mod store;

use store::{STORE_FILE, STORE_FORMAT, Store, StoredClient, check_name, free_address, key32, random32};

/// Handshakes per second (all clients) before the portal answers with cookies. Each
/// handshake is counted twice (once before the client is looked up, once by its
/// tunnel), so this is about 100 real handshakes a second.
const HANDSHAKE_RATE_LIMIT: u64 = 200;

/// How often every client's WireGuard timers run (retries, keepalives, expiry), as in
/// boringtun's own device.
const TIMER_TICK: Duration = Duration::from_millis(250);

use crate::config::portal::PortalConfig;

/// Keepalive interval written into client configs: keeps the client's NAT mapping
/// open so that members can reach it first.
const CLIENT_KEEPALIVE: u16 = 25;

/// Largest datagram or packet handled.
const BUF: usize = 65_535 + 64;

/// The portal's socket: 4 MiB buffers, as the node's own sockets (a burst from a fast
/// client must not overflow the kernel's default before the portal thread reads it),
/// and no SO_REUSEPORT: a port some other socket holds is an error, never shared.
fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    weft_datapath::transport::mark_socket(&s)?;
    weft_datapath::transport::udp::grow_buffers(&s);
    s.set_read_timeout(Some(TIMER_TICK))?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// The TUN device of the portal: `wg-` and the overlay device's name, at most 15 bytes.
pub fn device_name(overlay_dev: &str) -> String {
    let mut n = format!("wg-{overlay_dev}");
    n.truncate(15);
    n
}

/// Packets and datagrams the portal dropped, by reason.
#[derive(Debug, Default)]
pub struct Drops {
    /// Not a WireGuard message, bad mac1, or a handshake that did not decrypt.
    bad_packet: AtomicU64,
    /// A handshake from a key that is no client (never added, or removed).
    unknown_key: AtomicU64,
    /// A message for a session index no client has.
    unknown_session: AtomicU64,
    /// Data that failed authentication, or replayed.
    bad_data: AtomicU64,
    /// A client's packet whose source is not the address it was given.
    spoofed_source: AtomicU64,
    /// A client's packet to an address outside the mesh (overlay, proxied subnets,
    /// portal network): the portal is no router to its own LAN or the internet.
    forbidden_destination: AtomicU64,
    /// IPv6 (the overlay is IPv4).
    not_ipv4: AtomicU64,
    /// A packet from the mesh for a portal address no client has.
    no_client: AtomicU64,
    /// A packet for a client that never connected (no endpoint yet).
    no_endpoint: AtomicU64,
    /// A packet from or to a client that the access policy does not allow (the portal
    /// is its clients' boundary: they enforce nothing themselves).
    policy: AtomicU64,
    /// Send or TUN write errors.
    io_error: AtomicU64,
    /// Handshakes answered with a cookie (under load).
    cookies_sent: AtomicU64,
}

impl Drops {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The non-zero counters by name.
    pub fn nonzero(&self) -> BTreeMap<String, u64> {
        [
            ("bad_packet", &self.bad_packet),
            ("unknown_key", &self.unknown_key),
            ("unknown_session", &self.unknown_session),
            ("bad_data", &self.bad_data),
            ("spoofed_source", &self.spoofed_source),
            ("forbidden_destination", &self.forbidden_destination),
            ("not_ipv4", &self.not_ipv4),
            ("no_client", &self.no_client),
            ("no_endpoint", &self.no_endpoint),
            ("policy", &self.policy),
            ("io_error", &self.io_error),
            ("cookies_sent", &self.cookies_sent),
        ]
        .into_iter()
        .filter_map(|(k, v)| {
            let n = v.load(Ordering::Relaxed);
            (n > 0).then(|| (k.to_owned(), n))
        })
        .collect()
    }
}

/// One client: its identity and its WireGuard state.
struct Client {
    name: String,
    address: Ipv4Addr,
    public: [u8; 32],
    conn: Mutex<Conn>,
    rx_packets: AtomicU64,
    tx_packets: AtomicU64,
}

struct Conn {
    tunn: Tunn,
    /// Where the client last sent an authenticated message from (WireGuard roaming).
    endpoint: Option<SocketAddr>,
}

impl Client {
    fn conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The clients, found by public key (handshake initiations), by session index (every
/// other message) and by address (packets from the mesh).
#[derive(Default)]
struct Table {
    by_key: HashMap<[u8; 32], Arc<Client>>,
    by_index: HashMap<u32, Arc<Client>>,
    by_addr: HashMap<Ipv4Addr, Arc<Client>>,
}

struct Inner {
    cfg: PortalConfig,
    store_path: PathBuf,
    store: Mutex<Store>,
    secret: StaticSecret,
    public: PublicKey,
    table: RwLock<Table>,
    next_index: AtomicU32,
    /// mac1, and cookies under load: one limiter (one cookie secret) for the portal
    /// and every client's tunnel, as in boringtun's own device.
    limiter: Arc<RateLimiter>,
    socket: UdpSocket,
    tun: SyncDevice,
    /// Where clients may send: the overlay, proxied subnets, the portal network.
    destinations: ArcSwap<Vec<(Ipv4Addr, u8)>>,
    drops: Drops,
    /// The address the UDP socket is bound to.
    bound: SocketAddr,
    /// Inner MTU written into client configs.
    mtu: u16,
    /// The node's access policy and connection table: the portal enforces it for its
    /// clients, both ways.
    firewall: Arc<Firewall>,
    /// The data path's clock (the connection table's times).
    epoch: Instant,
}

/// A running portal (threads `weft-wg-rx`, `weft-wg-tx`); the process exit ends them.
/// Clones share it (client changes run on a blocking thread: they write and fsync the
/// client store).
#[derive(Clone)]
pub struct Portal {
    inner: Arc<Inner>,
}

impl Portal {
    /// Loads or creates the portal's key and clients in `state_dir`, opens the portal
    /// TUN and the UDP socket, and starts the two threads.
    pub fn start(
        cfg: &PortalConfig,
        state_dir: &Path,
        overlay_dev: &str,
        mtu: u16,
        firewall: Arc<Firewall>,
        epoch: Instant,
    ) -> Result<Self> {
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("cannot create state directory {}", state_dir.display()))?;
        let store_path = state_dir.join(STORE_FILE);
        let store = Store::load_or_create(&store_path, cfg.net)?;
        let secret = StaticSecret::from(key32(&store.private_key, "the portal's private key")?);
        let public = PublicKey::from(&secret);
        let socket = bind(cfg.listen).with_context(|| format!("cannot listen on --wg-portal udp://{}", cfg.listen))?;
        let bound = socket.local_addr().context("the portal socket has no address")?;
        let dev = device_name(overlay_dev);
        let tun = Tun::open(&TunConfig {
            name: dev.clone(),
            ipv4: cfg.portal_addr(),
            prefix: cfg.net.prefix,
            mtu,
            queues: 1,
            offload: false,
        })?;
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
        let tun = tun.queues.into_iter().next().context("the portal TUN has no queue")?;
        let start_index = u32::from_le_bytes(random32()?[..4].try_into().unwrap_or_default()) & 0x00ff_ffff;
        let inner = Arc::new(Inner {
            cfg: cfg.clone(),
            store_path,
            store: Mutex::new(Store {
                format: STORE_FORMAT,
                private_key: store.private_key.clone(),
                clients: Vec::new(),
            }),
            limiter: Arc::new(RateLimiter::new(&public, HANDSHAKE_RATE_LIMIT)),
            secret,
            public,
            table: RwLock::new(Table::default()),
            next_index: AtomicU32::new(start_index),
            socket,
            tun,
            destinations: ArcSwap::from_pointee(vec![(cfg.net.addr, cfg.net.prefix)]),
            drops: Drops::default(),
            bound,
            mtu,
            firewall,
            epoch,
        });
        for c in &store.clients {
            inner.insert(c)?;
        }
        inner.store_mut().clients = store.clients;
        let rx = inner.clone();
        std::thread::Builder::new()
            .name("weft-wg-rx".into())
            .spawn(move || rx.rx_loop())
            .context("cannot start the portal threads")?;
        let tx = inner.clone();
        std::thread::Builder::new()
            .name("weft-wg-tx".into())
            .spawn(move || tx.tx_loop())
            .context("cannot start the portal threads")?;
        info!(
            listen = %bound,
            net = %cfg.net,
            dev = %dev,
            public_key = %B64.encode(inner.public.as_bytes()),
            clients = inner.table().by_key.len(),
            "WireGuard portal up"
        );
        Ok(Self { inner })
    }

    /// Sets where clients may send: the overlay network, our proxied subnets and the
    /// subnets other members proxy (the portal network is always allowed).
    pub fn set_destinations(&self, mut nets: Vec<(Ipv4Addr, u8)>) {
        let c = &self.inner.cfg;
        nets.push((c.net.addr, c.net.prefix));
        nets.sort_unstable();
        nets.dedup();
        self.inner.destinations.store(Arc::new(nets));
    }

    /// Adds a client: a new key pair and preshared key, the first free address; keeps
    /// it on disk and returns its wg-quick config. `allowed` is what the client routes
    /// through the portal (the overlay network and the proxied subnets).
    pub fn add(&self, name: &str, allowed: &[(Ipv4Addr, u8)], local: &[Ipv4Addr]) -> Result<WgConfigJson, String> {
        check_name(name)?;
        let inner = &self.inner;
        let mut store = inner.store_mut();
        if store.clients.iter().any(|c| c.name == name) {
            return Err(format!("a client named {name:?} exists already (remove it first, or pick another name)"));
        }
        let taken: Vec<Ipv4Addr> = store.clients.iter().map(|c| c.address).collect();
        let address = free_address(inner.cfg.net, &taken)
            .ok_or_else(|| format!("the portal network {} is full", inner.cfg.net))?;
        let private = random32().map_err(|e| e.to_string())?;
        let psk = random32().map_err(|e| e.to_string())?;
        let public = PublicKey::from(&StaticSecret::from(private));
        let stored = StoredClient {
            name: name.to_owned(),
            public_key: B64.encode(public.as_bytes()),
            preshared_key: B64.encode(psk),
            address,
        };
        let mut next = store.clients.clone();
        next.push(stored.clone());
        Store { format: STORE_FORMAT, private_key: store.private_key.clone(), clients: next.clone() }
            .save(&inner.store_path)
            .map_err(|e| format!("{e:#}"))?;
        inner.insert(&stored).map_err(|e| e.to_string())?;
        store.clients = next;
        drop(store);
        let mut routes: Vec<(Ipv4Addr, u8)> = allowed.to_vec();
        routes.push((inner.cfg.net.addr, inner.cfg.net.prefix));
        routes.sort_unstable();
        routes.dedup();
        let allowed_ips: Vec<String> = routes.iter().map(|(a, p)| format!("{a}/{p}")).collect();
        let endpoint = self.endpoint(local);
        let config = format!(
            "[Interface]\n# {name}, a WireGuard client of weft's portal\nPrivateKey = {private}\nAddress = {address}/32\nMTU = {mtu}\n\n[Peer]\nPublicKey = {portal}\nPresharedKey = {psk}\nEndpoint = {endpoint}\nAllowedIPs = {allowed}\nPersistentKeepalive = {CLIENT_KEEPALIVE}\n",
            private = B64.encode(private),
            mtu = inner.mtu,
            portal = B64.encode(inner.public.as_bytes()),
            psk = B64.encode(psk),
            allowed = allowed_ips.join(", "),
        );
        info!(client = name, %address, "WireGuard portal client added");
        Ok(WgConfigJson {
            name: name.to_owned(),
            address: address.to_string(),
            public_key: stored.public_key,
            endpoint,
            config,
        })
    }

    /// Removes a client: its sessions end at once, and its key gets nothing through.
    pub fn remove(&self, name: &str) -> Result<String, String> {
        let inner = &self.inner;
        let mut store = inner.store_mut();
        let Some(i) = store.clients.iter().position(|c| c.name == name) else {
            return Err(format!("no WireGuard client named {name:?} (see `weft wg list`)"));
        };
        let mut next = store.clients.clone();
        let gone = next.remove(i);
        Store { format: STORE_FORMAT, private_key: store.private_key.clone(), clients: next.clone() }
            .save(&inner.store_path)
            .map_err(|e| format!("{e:#}"))?;
        store.clients = next;
        let mut t = inner.table.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = t.by_addr.remove(&gone.address) {
            t.by_key.remove(&c.public);
            t.by_index.retain(|_, v| !Arc::ptr_eq(v, &c));
        }
        info!(client = name, "WireGuard portal client removed");
        Ok(format!("removed WireGuard client {name} ({})", gone.address))
    }

    /// The Endpoint written into client configs.
    fn endpoint(&self, local: &[Ipv4Addr]) -> String {
        let c = &self.inner.cfg;
        if let Some(e) = &c.endpoint {
            return e.clone();
        }
        let port = self.inner.bound.port();
        if !self.inner.bound.ip().is_unspecified() {
            return self.inner.bound.to_string();
        }
        let ip = local.iter().find(|a| !c.net.contains(**a)).copied();
        match ip {
            Some(ip) => SocketAddr::new(IpAddr::V4(ip), port).to_string(),
            None => format!("HOST:{port}"),
        }
    }

    /// The portal and its clients, for status.
    pub fn status(&self) -> PortalJson {
        let inner = &self.inner;
        let t = inner.table();
        let mut clients: Vec<PortalClientJson> = t
            .by_addr
            .values()
            .map(|c| {
                let conn = c.conn();
                let (since, tx_bytes, rx_bytes, _, _) = conn.tunn.stats();
                PortalClientJson {
                    name: c.name.clone(),
                    address: c.address.to_string(),
                    public_key: B64.encode(c.public),
                    endpoint: conn.endpoint.map(|e| e.to_string()),
                    last_handshake_secs: since.map(|d| d.as_secs()),
                    rx_bytes: rx_bytes as u64,
                    tx_bytes: tx_bytes as u64,
                    rx_packets: c.rx_packets.load(Ordering::Relaxed),
                    tx_packets: c.tx_packets.load(Ordering::Relaxed),
                }
            })
            .collect();
        clients.sort_by(|a, b| a.name.cmp(&b.name));
        PortalJson {
            listen: format!("udp://{}", inner.bound),
            net: inner.cfg.net.to_string(),
            dev_name: device_name_of(inner),
            public_key: B64.encode(inner.public.as_bytes()),
            clients,
            drops: inner.drops.nonzero(),
        }
    }

    /// The non-zero drop counters.
    pub fn drops(&self) -> BTreeMap<String, u64> {
        self.inner.drops.nonzero()
    }
}

fn device_name_of(inner: &Inner) -> String {
    inner.tun.name().unwrap_or_default()
}

impl Inner {
    fn table(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn store_mut(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the WireGuard state of a stored client and puts it in the table.
    fn insert(&self, c: &StoredClient) -> Result<()> {
        let public = key32(&c.public_key, "a client's public key")?;
        let psk = key32(&c.preshared_key, "a client's preshared key")?;
        let index = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        // The portal's limiter: a tunnel with one of its own would answer with cookies
        // of another secret, which the portal-wide check then refuses.
        let tunn =
            Tunn::new(self.secret.clone(), PublicKey::from(public), Some(psk), None, index, Some(self.limiter.clone()));
        let client = Arc::new(Client {
            name: c.name.clone(),
            address: c.address,
            public,
            conn: Mutex::new(Conn { tunn, endpoint: None }),
            rx_packets: AtomicU64::new(0),
            tx_packets: AtomicU64::new(0),
        });
        let mut t = self.table.write().unwrap_or_else(PoisonError::into_inner);
        t.by_key.insert(public, client.clone());
        t.by_index.insert(index, client.clone());
        t.by_addr.insert(c.address, client);
        Ok(())
    }

    /// The client a verified message belongs to.
    fn client_for(&self, packet: &Packet<'_>) -> Option<Arc<Client>> {
        let t = self.table();
        let found = match packet {
            Packet::HandshakeInit(p) => match parse_handshake_anon(&self.secret, &self.public, p) {
                Ok(half) => {
                    let c = t.by_key.get(&half.peer_static_public).cloned();
                    if c.is_none() {
                        Drops::bump(&self.drops.unknown_key);
                    }
                    return c;
                }
                Err(_) => {
                    Drops::bump(&self.drops.bad_packet);
                    return None;
                }
            },
            Packet::HandshakeResponse(p) => t.by_index.get(&(p.receiver_idx >> 8)),
            Packet::PacketCookieReply(p) => t.by_index.get(&(p.receiver_idx >> 8)),
            Packet::PacketData(p) => t.by_index.get(&(p.receiver_idx >> 8)),
        };
        if found.is_none() {
            Drops::bump(&self.drops.unknown_session);
        }
        found.cloned()
    }

    fn send(&self, bytes: &[u8], to: SocketAddr) {
        if let Err(e) = self.socket.send_to(bytes, to) {
            debug!(%to, error = %e, "portal send failed");
            Drops::bump(&self.drops.io_error);
        }
    }

    /// Receives client datagrams; every 250 ms runs the clients' timers.
    fn rx_loop(&self) {
        let _ = self.socket.set_read_timeout(Some(TIMER_TICK));
        let mut buf = vec![0u8; BUF];
        let mut out = vec![0u8; BUF];
        let mut next_tick = Instant::now() + TIMER_TICK;
        let mut next_reset = Instant::now() + Duration::from_secs(1);
        loop {
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => self.rx_datagram(&buf[..n], from, &mut out),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => {
                    debug!(error = %e, "portal receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let now = Instant::now();
            if now >= next_reset {
                self.limiter.reset_count();
                next_reset = now + Duration::from_secs(1);
            }
            if now >= next_tick {
                self.tick(&mut out);
                next_tick = now + TIMER_TICK;
            }
        }
    }

    fn tick(&self, out: &mut [u8]) {
        let clients: Vec<Arc<Client>> = self.table().by_key.values().cloned().collect();
        for c in clients {
            let mut conn = c.conn();
            let endpoint = conn.endpoint;
            if let (TunnResult::WriteToNetwork(p), Some(to)) = (conn.tunn.update_timers(out), endpoint) {
                self.send(p, to);
            }
        }
    }

    fn rx_datagram(&self, datagram: &[u8], from: SocketAddr, out: &mut [u8]) {
        // mac1 (keyed by our public key) first, and cookies under load, before any
        // Diffie-Hellman or table lookup.
        let packet = match self.limiter.verify_packet(Some(from.ip()), datagram, out) {
            Ok(p) => p,
            Err(TunnResult::WriteToNetwork(cookie)) => {
                Drops::bump(&self.drops.cookies_sent);
                self.send(cookie, from);
                return;
            }
            Err(_) => {
                Drops::bump(&self.drops.bad_packet);
                return;
            }
        };
        let mut authenticates = !matches!(packet, Packet::PacketCookieReply(_));
        let Some(client) = self.client_for(&packet) else { return };
        let mut conn = client.conn();
        let mut flush = false;
        match conn.tunn.decapsulate(Some(from.ip()), datagram, out) {
            TunnResult::Done => {}
            TunnResult::Err(e) => {
                debug!(client = %client.name, error = ?e, "portal: message refused");
                Drops::bump(&self.drops.bad_data);
                return;
            }
            // A cookie reply (message type 3): the init was not checked, only asked
            // to prove its source. Nothing about the client changes.
            TunnResult::WriteToNetwork(p) if p.first() == Some(&3) => {
                Drops::bump(&self.drops.cookies_sent);
                self.send(p, from);
                authenticates = false;
            }
            TunnResult::WriteToNetwork(p) => {
                self.send(p, from);
                flush = true;
            }
            TunnResult::WriteToTunnelV4(p, src) => {
                let dst = Tunn::dst_address(p);
                if src != client.address {
                    Drops::bump(&self.drops.spoofed_source);
                } else if !matches!(dst, Some(IpAddr::V4(d)) if self.allowed(d)) {
                    Drops::bump(&self.drops.forbidden_destination);
                } else if self.firewall.forward(p, self.now()).is_err() {
                    Drops::bump(&self.drops.policy);
                } else if self.tun.send(p).is_err() {
                    Drops::bump(&self.drops.io_error);
                } else {
                    client.rx_packets.fetch_add(1, Ordering::Relaxed);
                }
            }
            TunnResult::WriteToTunnelV6(..) => Drops::bump(&self.drops.not_ipv4),
        }
        if authenticates {
            if conn.endpoint != Some(from) {
                debug!(client = %client.name, endpoint = %from, "portal client endpoint");
            }
            conn.endpoint = Some(from);
        }
        if flush {
            // Packets queued while the handshake ran.
            while let TunnResult::WriteToNetwork(p) = conn.tunn.decapsulate(None, &[], out) {
                self.send(p, from);
                client.tx_packets.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn now(&self) -> u64 {
        weft_datapath::pipeline::now_ms(self.epoch)
    }

    fn allowed(&self, dst: Ipv4Addr) -> bool {
        self.destinations.load().iter().any(|(a, p)| weft_core::route::overlaps(*a, *p, dst, 32))
    }

    /// Reads packets the kernel routes to the portal network and seals them for
    /// their client.
    fn tx_loop(&self) {
        let mut buf = vec![0u8; BUF];
        let mut out = vec![0u8; BUF];
        loop {
            let n = match self.tun.recv(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    warn!(error = %e, "portal TUN read failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let packet = &buf[..n];
            let Some(IpAddr::V4(dst)) = Tunn::dst_address(packet) else {
                Drops::bump(&self.drops.not_ipv4);
                continue;
            };
            let Some(client) = self.table().by_addr.get(&dst).cloned() else {
                Drops::bump(&self.drops.no_client);
                continue;
            };
            // From the mesh (checked already on arrival: a tracked flow), this node or
            // another client: the client's boundary is here.
            if self.firewall.inbound(packet, self.now()).is_err() {
                Drops::bump(&self.drops.policy);
                continue;
            }
            let mut conn = client.conn();
            let endpoint = conn.endpoint;
            match conn.tunn.encapsulate(packet, &mut out) {
                TunnResult::WriteToNetwork(p) => match endpoint {
                    Some(to) => {
                        self.send(p, to);
                        client.tx_packets.fetch_add(1, Ordering::Relaxed);
                    }
                    None => Drops::bump(&self.drops.no_endpoint),
                },
                TunnResult::Err(_) => Drops::bump(&self.drops.io_error),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::Ipv4Net;

    fn net(s: &str) -> Ipv4Net {
        let (a, p) = s.split_once('/').unwrap();
        Ipv4Net { addr: a.parse().unwrap(), prefix: p.parse().unwrap() }
    }

    #[test]
    fn names_and_addresses() {
        for good in ["alice", "bob-phone", "r1.home_2"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "has space", "a/b", "\u{1b}[31m", &"x".repeat(33)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let n = net("10.127.0.0/30");
        assert_eq!(free_address(n, &[]), Some(Ipv4Addr::new(10, 127, 0, 2)));
        assert_eq!(free_address(n, &[Ipv4Addr::new(10, 127, 0, 2)]), None, "a /30 holds one client");
        let n = net("10.127.0.0/24");
        let taken = [Ipv4Addr::new(10, 127, 0, 2), Ipv4Addr::new(10, 127, 0, 4)];
        assert_eq!(free_address(n, &taken), Some(Ipv4Addr::new(10, 127, 0, 3)), "a freed address is reused");
        assert!(net("10.0.0.0/8").overlaps(net("10.127.0.0/24")));
        assert!(!net("10.126.126.0/24").overlaps(net("10.127.0.0/24")));
        assert_eq!(device_name("weft0"), "wg-weft0");
        assert_eq!(device_name("a-very-long-nm"), "wg-a-very-long-");
    }

    #[test]
    fn the_store_is_private_and_survives_a_reload() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weft-portal-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(STORE_FILE);
        let n = net("10.127.0.0/24");
        let s = Store::load_or_create(&path, n).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = Store::load_or_create(&path, n).unwrap();
        assert_eq!(s.private_key, again.private_key, "the portal key is made once");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Store::load_or_create(&path, n).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "{\"private_key\": \"short\", \"clients\": []}").unwrap();
        let e = format!("{:#}", Store::load_or_create(&path, n).unwrap_err());
        assert!(e.contains("private key"), "{e}");
        // Clients that do not fit the portal network (it changed, or the file was
        // edited) are refused by name, not silently unreachable.
        let key = B64.encode([7u8; 32]);
        let client = |name: &str, addr: &str, k: &str| serde_json::json!({"name": name, "public_key": k, "preshared_key": key, "address": addr});
        for (clients, needle) in [
            (vec![client("a", "10.127.1.2", &key)], "not a client address"),
            (vec![client("a", "10.127.0.1", &key)], "not a client address"),
            (vec![client("a", "10.127.0.255", &key)], "not a client address"),
            (vec![client("a", "10.127.0.2", &key), client("a", "10.127.0.3", &B64.encode([8u8; 32]))], "repeats"),
            (vec![client("a", "10.127.0.2", &key), client("b", "10.127.0.3", &key)], "repeats"),
            (vec![client("a b", "10.127.0.2", &key)], "invalid client name"),
        ] {
            let text = serde_json::json!({"private_key": key, "clients": clients}).to_string();
            std::fs::write(&path, text).unwrap();
            let e = format!("{:#}", Store::load_or_create(&path, n).unwrap_err());
            assert!(e.contains(needle) && e.contains(STORE_FILE), "{needle}: {e}");
        }
        // A file of 0.1.0 (no format field) is read as format 1.
        let ok = serde_json::json!({"private_key": key, "clients": [client("a", "10.127.0.254", &key)]});
        std::fs::write(&path, ok.to_string()).unwrap();
        let old = Store::load_or_create(&path, n).unwrap();
        assert_eq!((old.clients.len(), old.format), (1, 1));
        // What this build writes says its format; a newer format is refused by name.
        let written = serde_json::to_value(&old).unwrap();
        assert_eq!(written["format"], STORE_FORMAT);
        let newer = serde_json::json!({"format": STORE_FORMAT + 1, "private_key": key, "clients": []});
        std::fs::write(&path, newer.to_string()).unwrap();
        let e = format!("{:#}", Store::load_or_create(&path, n).unwrap_err());
        assert!(e.contains("newer weft") && e.contains(STORE_FILE), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
