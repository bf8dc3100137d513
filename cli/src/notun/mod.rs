//! What a no-TUN node offers local programs, on top of the userspace stack
//! ([`crate::notun::stack`]): a SOCKS5 server (CONNECT and UDP ASSOCIATE, RFC 1928, with
//! optional username/password, RFC 1929), `--forward` (a local port to a member's
//! port) and `--expose` (an overlay port to a local service).
//!
//! Destinations are checked before anything is sent: an address must be routed by the
//! mesh (a member's overlay address or a proxied subnet), and a name must be a member's
//! in the Magic DNS zone. Anything else is refused with the matching SOCKS reply, so a
//! client never waits for a connection that cannot happen.

pub mod stack;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use arc_swap::ArcSwap;
use serde::Serialize;
use socks5_impl::protocol::{AuthMethod, Command, Reply, Response, UdpHeader, handshake, password_method};
use socks5_impl::{Address, AsyncStreamOperation, StreamOperation};
use subtle::ConstantTimeEq;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tracing::{debug, info, warn};
use weft_control::UserspaceJson;
use weft_core::route::{Lookup, RouteSnapshot};

use crate::config::values::{Expose, Forward, L4};
use crate::notun::stack::{Stack, UdpConn};

/// A UDP flow (forward, expose, association) with no traffic for this long ends.
const UDP_IDLE: Duration = Duration::from_secs(60);
/// Largest datagram relayed.
const DATAGRAM: usize = 65535;
/// Copy buffer of a relayed TCP connection, each way.
const COPY_BUFFER: usize = 256 * 1024;

/// Why a destination is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Outside the overlay and its subnets (SOCKS 0x02).
    NotAllowed,
    /// Inside the overlay but no member holds it, or a name no member has (0x04).
    Unreachable,
}

impl Refusal {
    fn reply(self) -> Reply {
        match self {
            Self::NotAllowed => Reply::ConnectionNotAllowed,
            Self::Unreachable => Reply::HostUnreachable,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotAllowed => "outside the overlay and its subnets",
            Self::Unreachable => "no member has it",
        })
    }
}

/// What local programs may reach: the mesh's routes, its networks and names.
#[derive(Clone)]
pub struct Destinations {
    /// The data plane's route snapshot.
    pub routes: Arc<ArcSwap<RouteSnapshot>>,
    /// The Magic DNS zone (refreshed by the runtime).
    pub names: Arc<ArcSwap<crate::services::dns::Zone>>,
    /// The overlay networks (an address inside with no member is "unreachable", not
    /// "not allowed").
    pub nets: Arc<ArcSwap<Vec<(IpAddr, u8)>>>,
}

impl std::fmt::Debug for Destinations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Destinations")
    }
}

impl Destinations {
    /// Whether `ip` is reachable through the mesh.
    pub fn check(&self, ip: IpAddr) -> Result<IpAddr, Refusal> {
        let ip = ip.to_canonical();
        match self.routes.load().lookup(ip) {
            Lookup::Route(_) | Lookup::Demand(_) => Ok(ip),
            Lookup::None if self.nets.load().iter().any(|(n, p)| weft_core::route::overlaps_ip(*n, *p, ip, 128)) => {
                Err(Refusal::Unreachable)
            }
            Lookup::None => Err(Refusal::NotAllowed),
        }
    }

    /// An address, or a member's name (its IPv4 address, else its IPv6 one), checked.
    pub fn resolve(&self, host: &str) -> Result<IpAddr, Refusal> {
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            return self.check(ip);
        }
        let Some((v4, v6)) = self.names.load().resolve(host) else {
            return Err(if host.contains('.') && !self.in_domain(host) {
                Refusal::NotAllowed
            } else {
                Refusal::Unreachable
            });
        };
        self.check(IpAddr::V4(v4)).or_else(|e| v6.map_or(Err(e), |a| self.check(IpAddr::V6(a))))
    }

    fn in_domain(&self, host: &str) -> bool {
        let d = self.names.load().domain().to_ascii_lowercase();
        host.trim_end_matches('.').to_ascii_lowercase().ends_with(&format!(".{d}"))
    }
}

/// Counters of the userspace services, shown in status.
#[derive(Debug, Default, Serialize)]
pub struct ServiceStats {
    /// SOCKS5 connections relayed (CONNECT).
    pub socks5_connects: AtomicU64,
    /// SOCKS5 UDP associations.
    pub socks5_associations: AtomicU64,
    /// SOCKS5 requests refused (destination, authentication, command).
    pub socks5_refused: AtomicU64,
    /// Connections relayed by --forward and --expose.
    pub relayed: AtomicU64,
    /// Connections and datagrams that could not be relayed.
    pub failed: AtomicU64,
    /// Connections and UDP flows an `--expose` refused because its cap was reached.
    pub expose_refused: AtomicU64,
}

/// Connections one `--expose` (TCP) relays at once; more are closed at once and
/// counted (`expose_refused`). Half-open ones are bounded by the stack: a TCP port
/// keeps 4 listening sockets, each holding one handshake in progress.
pub const MAX_EXPOSE_CONNECTIONS: usize = 256;
/// UDP flows (remote address and port) one `--expose` (UDP) keeps at once.
pub const MAX_EXPOSE_FLOWS: usize = 256;

enum Bound {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

/// The services of a no-TUN node, with their local sockets bound (so a port in use
/// fails the start, not a later connection).
pub struct Userspace {
    /// The stack.
    pub stack: Stack,
    dest: Destinations,
    socks5: Option<(std::net::TcpListener, Option<(String, String)>)>,
    forwards: Vec<(Forward, Bound)>,
    exposes: Vec<Expose>,
    /// Counters.
    pub stats: Arc<ServiceStats>,
    config: Shown,
}

/// The configuration as status shows it.
struct Shown {
    socks5: Option<SocketAddr>,
    socks5_auth: bool,
    forwards: Vec<String>,
    exposes: Vec<String>,
}

impl std::fmt::Debug for Userspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Userspace")
    }
}

fn listen_tcp(addr: SocketAddr, what: &str) -> Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {what}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

impl Userspace {
    /// Binds the local side of `--socks5` and every `--forward`.
    pub fn bind(
        stack: Stack,
        dest: Destinations,
        socks5: Option<SocketAddr>,
        auth: Option<(String, String)>,
        forwards: &[Forward],
        exposes: &[Expose],
    ) -> Result<Self> {
        let socks5 = match socks5 {
            Some(a) => Some((listen_tcp(a, &format!("--socks5 {a}"))?, auth)),
            None => None,
        };
        let mut bound = Vec::with_capacity(forwards.len());
        for f in forwards {
            let b = match f.proto {
                L4::Tcp => Bound::Tcp(listen_tcp(f.local, &format!("--forward {f}"))?),
                L4::Udp => {
                    let s = std::net::UdpSocket::bind(f.local)
                        .with_context(|| format!("cannot listen on --forward {f}"))?;
                    s.set_nonblocking(true)?;
                    Bound::Udp(s)
                }
            };
            bound.push((f.clone(), b));
        }
        let config = Shown {
            socks5: socks5.as_ref().and_then(|(l, _)| l.local_addr().ok()),
            socks5_auth: socks5.as_ref().is_some_and(|(_, a)| a.is_some()),
            forwards: forwards.iter().map(ToString::to_string).collect(),
            exposes: exposes.iter().map(ToString::to_string).collect(),
        };
        Ok(Self { stack, dest, socks5, forwards: bound, exposes: exposes.to_vec(), stats: Arc::default(), config })
    }

    /// What status shows.
    pub fn json(&self) -> UserspaceJson {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let (st, view) = (self.stack.stats(), self.stack.view());
        UserspaceJson {
            socks5: self.config.socks5.map(|a| a.to_string()),
            socks5_auth: self.config.socks5_auth,
            forwards: self.config.forwards.clone(),
            exposes: self.config.exposes.clone(),
            tcp_connections: view.tcp_connections,
            udp_sockets: view.udp_sockets,
            packets_in: l(&st.packets_in),
            packets_out: l(&st.packets_out),
            dropped_in: l(&st.dropped_in),
            dropped_out: l(&st.dropped_out),
            socks5_connects: l(&self.stats.socks5_connects),
            socks5_associations: l(&self.stats.socks5_associations),
            socks5_refused: l(&self.stats.socks5_refused),
            relayed: l(&self.stats.relayed),
            failed: l(&self.stats.failed),
            expose_refused: l(&self.stats.expose_refused),
        }
    }

    /// What local programs may reach (refreshed by the runtime).
    pub fn destinations(&self) -> &Destinations {
        &self.dest
    }

    /// Starts every service on the current tokio runtime.
    pub fn start(&mut self) -> Result<()> {
        if let Some((l, auth)) = self.socks5.take() {
            let l = TcpListener::from_std(l)?;
            info!(addr = %l.local_addr()?, auth = auth.is_some(), "serving SOCKS5");
            let (stack, dest, stats) = (self.stack.clone(), self.dest.clone(), self.stats.clone());
            tokio::spawn(socks5_loop(l, auth.map(Arc::new), stack, dest, stats));
        }
        for (f, b) in self.forwards.drain(..) {
            info!(forward = %f, "forwarding");
            let (stack, dest, stats) = (self.stack.clone(), self.dest.clone(), self.stats.clone());
            match b {
                Bound::Tcp(l) => {
                    tokio::spawn(forward_tcp(TcpListener::from_std(l)?, f, stack, dest, stats));
                }
                Bound::Udp(s) => {
                    tokio::spawn(forward_udp(UdpSocket::from_std(s)?, f, stack, dest, stats));
                }
            }
        }
        for e in self.exposes.drain(..) {
            info!(expose = %e, "exposing");
            let stats = self.stats.clone();
            match e.proto {
                L4::Tcp => {
                    let accepted = self.stack.listen(e.port);
                    tokio::spawn(expose_tcp(accepted, e.local, stats));
                }
                L4::Udp => {
                    let conn = self.stack.udp_bind(e.port)?;
                    tokio::spawn(expose_udp(conn, e.local, stats));
                }
            }
        }
        Ok(())
    }
}

/// Relays bytes both ways until both sides are done.
async fn relay<A, B>(mut a: A, mut b: B) -> io::Result<(u64, u64)>
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, COPY_BUFFER, COPY_BUFFER).await
}

async fn forward_tcp(l: TcpListener, f: Forward, stack: Stack, dest: Destinations, stats: Arc<ServiceStats>) {
    loop {
        let (local, from) = match l.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(forward = %f, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = local.set_nodelay(true);
        let (stack, dest, stats, f) = (stack.clone(), dest.clone(), stats.clone(), f.clone());
        tokio::spawn(async move {
            let to = match dest.resolve(&f.host) {
                Ok(ip) => SocketAddr::new(ip, f.port),
                Err(r) => {
                    stats.failed.fetch_add(1, Relaxed);
                    warn!(forward = %f, %from, "not forwarded: {} {r}", f.host);
                    return;
                }
            };
            match stack.connect(to).await {
                Ok(remote) => {
                    stats.relayed.fetch_add(1, Relaxed);
                    if let Err(e) = relay(local, remote).await {
                        debug!(forward = %f, error = %e, "forwarded connection ended");
                    }
                }
                Err(e) => {
                    stats.failed.fetch_add(1, Relaxed);
                    warn!(forward = %f, %to, error = %e, "cannot connect");
                }
            }
        });
    }
}

async fn expose_tcp(
    mut accepted: tokio::sync::mpsc::UnboundedReceiver<stack::TcpConn>,
    local: SocketAddr,
    stats: Arc<ServiceStats>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_EXPOSE_CONNECTIONS));
    while let Some(conn) = accepted.recv().await {
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Dropping `conn` closes it.
            if stats.expose_refused.fetch_add(1, Relaxed) == 0 {
                warn!(%local, "--expose: {MAX_EXPOSE_CONNECTIONS} connections at once, refusing more");
            }
            continue;
        };
        let stats = stats.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match TcpStream::connect(local).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    stats.relayed.fetch_add(1, Relaxed);
                    if let Err(e) = relay(conn, s).await {
                        debug!(%local, error = %e, "exposed connection ended");
                    }
                }
                Err(e) => {
                    // Dropping `conn` closes it: the member sees the connection end.
                    stats.failed.fetch_add(1, Relaxed);
                    warn!(%local, peer = %conn.peer, error = %e, "exposed service unreachable");
                }
            }
        });
    }
}

/// A UDP flow's overlay socket and when it last carried anything.
struct Flow {
    conn: Arc<UdpConn>,
    last: Arc<AtomicU64>,
}

fn now_secs(epoch: std::time::Instant) -> u64 {
    epoch.elapsed().as_secs()
}

async fn forward_udp(sock: UdpSocket, f: Forward, stack: Stack, dest: Destinations, stats: Arc<ServiceStats>) {
    let sock = Arc::new(sock);
    let flows: Arc<Mutex<HashMap<SocketAddr, Flow>>> = Arc::default();
    let epoch = std::time::Instant::now();
    let mut buf = vec![0u8; DATAGRAM];
    loop {
        let (n, client) = match sock.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                debug!(forward = %f, error = %e, "UDP receive failed");
                continue;
            }
        };
        let to = match dest.resolve(&f.host) {
            Ok(ip) => SocketAddr::new(ip, f.port),
            Err(r) => {
                stats.failed.fetch_add(1, Relaxed);
                debug!(forward = %f, "not forwarded: {} {r}", f.host);
                continue;
            }
        };
        let existing = flows.lock().ok().and_then(|m| m.get(&client).map(|fl| (fl.conn.clone(), fl.last.clone())));
        let (conn, last) = match existing {
            Some(c) => c,
            None => {
                let conn = match stack.udp_bind(0) {
                    Ok(c) => Arc::new(c),
                    Err(e) => {
                        stats.failed.fetch_add(1, Relaxed);
                        warn!(forward = %f, error = %e, "no overlay UDP socket");
                        continue;
                    }
                };
                let last = Arc::new(AtomicU64::new(now_secs(epoch)));
                if let Ok(mut m) = flows.lock() {
                    m.insert(client, Flow { conn: conn.clone(), last: last.clone() });
                }
                stats.relayed.fetch_add(1, Relaxed);
                tokio::spawn(udp_replies(conn.clone(), sock.clone(), client, flows.clone(), last.clone(), epoch));
                (conn, last)
            }
        };
        last.store(now_secs(epoch), Relaxed);
        if let Err(e) = conn.send_to(&buf[..n], to).await {
            stats.failed.fetch_add(1, Relaxed);
            debug!(forward = %f, error = %e, "UDP send failed");
        }
    }
}

/// Sends what a flow's overlay socket receives back to the local client, until the
/// flow has been idle for [`UDP_IDLE`].
async fn udp_replies(
    conn: Arc<UdpConn>,
    sock: Arc<UdpSocket>,
    client: SocketAddr,
    flows: Arc<Mutex<HashMap<SocketAddr, Flow>>>,
    last: Arc<AtomicU64>,
    epoch: std::time::Instant,
) {
    let mut buf = vec![0u8; DATAGRAM];
    loop {
        match tokio::time::timeout(UDP_IDLE, conn.recv_from(&mut buf)).await {
            Ok(Ok((n, _))) => {
                last.store(now_secs(epoch), Relaxed);
                let _ = sock.send_to(&buf[..n], client).await;
            }
            Ok(Err(e)) => {
                debug!(error = %e, "overlay UDP receive failed");
                break;
            }
            Err(_) if now_secs(epoch).saturating_sub(last.load(Relaxed)) >= UDP_IDLE.as_secs() => break,
            Err(_) => {}
        }
    }
    if let Ok(mut m) = flows.lock() {
        m.remove(&client);
    }
}

/// An exposed UDP flow's local socket and when it last carried anything.
type LocalFlow = (Arc<UdpSocket>, Arc<AtomicU64>);

async fn expose_udp(conn: UdpConn, local: SocketAddr, stats: Arc<ServiceStats>) {
    let conn = Arc::new(conn);
    let flows: Arc<Mutex<HashMap<SocketAddr, LocalFlow>>> = Arc::default();
    let epoch = std::time::Instant::now();
    let mut buf = vec![0u8; DATAGRAM];
    loop {
        let (n, remote) = match conn.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, "overlay UDP receive failed");
                continue;
            }
        };
        let (existing, full) =
            flows.lock().map(|m| (m.get(&remote).cloned(), m.len() >= MAX_EXPOSE_FLOWS)).unwrap_or((None, true));
        let (sock, last) = match existing {
            Some(s) => s,
            None if full => {
                if stats.expose_refused.fetch_add(1, Relaxed) == 0 {
                    warn!(%local, "--expose: {MAX_EXPOSE_FLOWS} UDP flows at once, refusing new ones");
                }
                continue;
            }
            None => {
                let any: SocketAddr = if local.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
                let sock = match UdpSocket::bind(any).await {
                    Ok(s) if s.connect(local).await.is_ok() => Arc::new(s),
                    _ => {
                        stats.failed.fetch_add(1, Relaxed);
                        continue;
                    }
                };
                let last = Arc::new(AtomicU64::new(now_secs(epoch)));
                if let Ok(mut m) = flows.lock() {
                    m.insert(remote, (sock.clone(), last.clone()));
                }
                stats.relayed.fetch_add(1, Relaxed);
                let (conn, sock2, flows, last2) = (conn.clone(), sock.clone(), flows.clone(), last.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; DATAGRAM];
                    loop {
                        match tokio::time::timeout(UDP_IDLE, sock2.recv(&mut buf)).await {
                            Ok(Ok(n)) => {
                                last2.store(now_secs(epoch), Relaxed);
                                let _ = conn.send_to(&buf[..n], remote).await;
                            }
                            // The local service refused (ICMP port unreachable): keep the flow.
                            Ok(Err(_)) => {}
                            Err(_) if now_secs(epoch).saturating_sub(last2.load(Relaxed)) >= UDP_IDLE.as_secs() => {
                                break;
                            }
                            Err(_) => {}
                        }
                    }
                    if let Ok(mut m) = flows.lock() {
                        m.remove(&remote);
                    }
                });
                (sock, last)
            }
        };
        last.store(now_secs(epoch), Relaxed);
        let _ = sock.send(&buf[..n]).await;
    }
}

async fn socks5_loop(
    l: TcpListener,
    auth: Option<Arc<(String, String)>>,
    stack: Stack,
    dest: Destinations,
    stats: Arc<ServiceStats>,
) {
    loop {
        let (s, from) = match l.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "SOCKS5 accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = s.set_nodelay(true);
        let (auth, stack, dest, stats) = (auth.clone(), stack.clone(), dest.clone(), stats.clone());
        tokio::spawn(async move {
            if let Err(e) = socks5_client(s, auth.as_deref(), &stack, &dest, &stats).await {
                debug!(%from, error = %e, "SOCKS5 client ended");
            }
        });
    }
}

async fn reply(s: &mut TcpStream, r: Reply, addr: SocketAddr) -> io::Result<()> {
    Response::new(r, Address::SocketAddress(addr)).write_to_async_stream(s).await
}

fn unspecified() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 0))
}

/// One SOCKS5 client: method negotiation, authentication, one request.
async fn socks5_client(
    mut s: TcpStream,
    auth: Option<&(String, String)>,
    stack: &Stack,
    dest: &Destinations,
    stats: &ServiceStats,
) -> io::Result<()> {
    let hello = handshake::Request::retrieve_from_async_stream(&mut s).await?;
    let method = if auth.is_some() { AuthMethod::UserPass } else { AuthMethod::NoAuth };
    if !hello.evaluate_method(method) {
        stats.socks5_refused.fetch_add(1, Relaxed);
        handshake::Response::new(AuthMethod::NoAcceptableMethods).write_to_async_stream(&mut s).await?;
        return Ok(());
    }
    handshake::Response::new(method).write_to_async_stream(&mut s).await?;
    if let Some((user, pass)) = auth {
        let req = password_method::Request::retrieve_from_async_stream(&mut s).await?;
        // Compared in constant time (for equal lengths).
        let ok = bool::from(
            req.user_key.username_arr().ct_eq(user.as_bytes()) & req.user_key.password_arr().ct_eq(pass.as_bytes()),
        );
        let status = if ok { password_method::Status::Succeeded } else { password_method::Status::Failed };
        password_method::Response::new(status).write_to_async_stream(&mut s).await?;
        if !ok {
            stats.socks5_refused.fetch_add(1, Relaxed);
            return Ok(());
        }
    }
    // VER CMD RSV ATYP read here, so an unknown command or address type gets its own
    // reply (the crate's parser would only fail).
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await?;
    if head[0] != 5 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not SOCKS5"));
    }
    if !matches!(head[3], 1 | 3 | 4) {
        stats.socks5_refused.fetch_add(1, Relaxed);
        return reply(&mut s, Reply::AddressTypeNotSupported, unspecified()).await;
    }
    let atyp = [head[3]];
    let address = Address::retrieve_from_async_stream(&mut (&atyp[..]).chain(&mut s)).await?;
    let Ok(command @ (Command::Connect | Command::UdpAssociate)) = Command::try_from(head[1]) else {
        stats.socks5_refused.fetch_add(1, Relaxed);
        return reply(&mut s, Reply::CommandNotSupported, unspecified()).await;
    };
    match command {
        Command::Connect => {
            let to = match resolve(dest, &address) {
                Ok(a) => a,
                Err(r) => {
                    stats.socks5_refused.fetch_add(1, Relaxed);
                    debug!(dst = %address, "SOCKS5 CONNECT refused: {r}");
                    return reply(&mut s, r.reply(), unspecified()).await;
                }
            };
            let conn = match stack.connect(to).await {
                Ok(c) => c,
                Err(e) => {
                    stats.socks5_refused.fetch_add(1, Relaxed);
                    let r = match e.kind() {
                        io::ErrorKind::ConnectionRefused => Reply::ConnectionRefused,
                        io::ErrorKind::TimedOut => Reply::HostUnreachable,
                        _ => Reply::GeneralFailure,
                    };
                    debug!(%to, error = %e, "SOCKS5 CONNECT failed");
                    return reply(&mut s, r, unspecified()).await;
                }
            };
            reply(&mut s, Reply::Succeeded, conn.local).await?;
            stats.socks5_connects.fetch_add(1, Relaxed);
            relay(s, conn).await.map(|_| ())
        }
        _ => associate(s, stack, dest, stats).await,
    }
}

fn resolve(dest: &Destinations, a: &Address) -> Result<SocketAddr, Refusal> {
    match a {
        Address::SocketAddress(sa) => dest.check(sa.ip()).map(|ip| SocketAddr::new(ip, sa.port())),
        Address::DomainAddress(host, port) => dest.resolve(host).map(|ip| SocketAddr::new(ip, *port)),
    }
}

/// UDP ASSOCIATE: a local UDP socket for the client's datagrams (accepted only from
/// the client's address), one overlay socket for the association; ends with the TCP
/// connection.
async fn associate(mut s: TcpStream, stack: &Stack, dest: &Destinations, stats: &ServiceStats) -> io::Result<()> {
    let client_ip = s.peer_addr()?.ip();
    let udp = UdpSocket::bind(SocketAddr::new(s.local_addr()?.ip(), 0)).await?;
    let conn = match stack.udp_bind(0) {
        Ok(c) => c,
        Err(e) => {
            reply(&mut s, Reply::GeneralFailure, unspecified()).await?;
            return Err(e);
        }
    };
    reply(&mut s, Reply::Succeeded, udp.local_addr()?).await?;
    stats.socks5_associations.fetch_add(1, Relaxed);
    let mut client: Option<SocketAddr> = None;
    let (mut up, mut down) = (vec![0u8; DATAGRAM], vec![0u8; DATAGRAM]);
    let mut ctl = [0u8; 64];
    loop {
        tokio::select! {
            r = s.read(&mut ctl) => match r {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            },
            r = udp.recv_from(&mut up) => {
                let Ok((n, from)) = r else { continue };
                if from.ip() != client_ip {
                    continue;
                }
                client = Some(from);
                let mut rd = &up[..n];
                let Ok(h) = UdpHeader::retrieve_from_stream(&mut rd) else { continue };
                // Fragments are not reassembled (RFC 1928 allows dropping them).
                if h.frag != 0 {
                    continue;
                }
                match resolve(dest, &h.address) {
                    Ok(to) => {
                        if conn.send_to(rd, to).await.is_err() {
                            stats.failed.fetch_add(1, Relaxed);
                        }
                    }
                    Err(r) => {
                        stats.socks5_refused.fetch_add(1, Relaxed);
                        debug!(dst = %h.address, "SOCKS5 datagram refused: {r}");
                    }
                }
            }
            r = conn.recv_from(&mut down) => {
                let (Ok((n, src)), Some(to)) = (r, client) else { continue };
                let mut out = Vec::with_capacity(n + 22);
                UdpHeader::new(0, Address::SocketAddress(src)).write_to_buf(&mut out);
                out.extend_from_slice(&down[..n]);
                let _ = udp.send_to(&out, to).await;
            }
        }
    }
}
