//! The userspace TCP/IP stack of a no-TUN node: smoltcp terminates the overlay traffic
//! addressed to this node (TCP, UDP, ICMP echo) so a member without a TUN device or
//! any capability still answers pings, accepts connections and opens them.
//!
//! One thread (`weft-netstack`) polls the stack: it wakes on a packet from the
//! pipeline, a poke from a socket handle, or smoltcp's next timer. Handles lock the same
//! state to move bytes and register wakers (smoltcp's `async` feature), so the tokio
//! tasks above them see ordinary `AsyncRead`/`AsyncWrite` streams and datagram sockets.
//!
//! ```text
//! pipeline RX --deliver (bounded, drop+count)--> [weft-netstack: iface.poll] --> pipeline TX
//!                                                       ^ lock, wakers |
//!                               tokio tasks (SOCKS5, forward, expose) -+
//! ```
//!
//! Checksums are computed on the way out and not verified on the way in: every packet
//! the stack receives was authenticated by the tunnel's AEAD, which already guarantees
//! it arrived as its sender wrote it.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::socket::{tcp, udp};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc as amp;
use weft_datapath::pipeline::UserPort;

/// Receive and send buffer of each TCP connection (window scaling lets a single
/// stream keep this much in flight).
pub const TCP_BUFFER: usize = 1024 * 1024;
/// Payload bytes a UDP socket queues each way.
const UDP_BUFFER: usize = 512 * 1024;
/// Datagrams a UDP socket queues each way.
const UDP_SLOTS: usize = 256;
/// Packets from the pipeline waiting for the stack; more are dropped and counted.
const INPUT_QUEUE: usize = 4096;
/// Packets from the stack waiting for the pipeline; more are dropped and counted.
const OUTPUT_QUEUE: usize = 4096;
/// Listening sockets kept ready per exposed TCP port (smoltcp takes one connection per
/// listening socket).
const BACKLOG: usize = 4;
/// How long a connection attempt waits for the other side.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A closed connection whose peer never finishes the close is reset after this.
const LINGER: Duration = Duration::from_secs(30);
/// Longest sleep of the polling thread.
const MAX_DELAY: Duration = Duration::from_millis(200);

/// Counters of the stack, shown in status.
#[derive(Debug, Default, Serialize)]
pub struct StackStats {
    /// Packets handed to the stack.
    pub packets_in: AtomicU64,
    /// Packets the stack sent.
    pub packets_out: AtomicU64,
    /// Packets dropped because the stack was behind.
    pub dropped_in: AtomicU64,
    /// Packets dropped because the pipeline was behind.
    pub dropped_out: AtomicU64,
    /// TCP connections this node opened.
    pub tcp_connects: AtomicU64,
    /// TCP connections members opened to exposed ports.
    pub tcp_accepts: AtomicU64,
}

enum Input {
    Packet(Vec<u8>),
    Poke,
}

/// smoltcp's device: packets in from the pipeline, out to it.
struct Port {
    rx: VecDeque<Vec<u8>>,
    tx: mpsc::SyncSender<Vec<u8>>,
    mtu: usize,
    /// Verify incoming checksums too.
    verify: bool,
    stats: Arc<StackStats>,
}

struct RxTok(Vec<u8>);

impl phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

struct TxTok<'a> {
    tx: &'a mpsc::SyncSender<Vec<u8>>,
    stats: &'a StackStats,
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        match self.tx.try_send(buf) {
            Ok(()) => self.stats.packets_out.fetch_add(1, Relaxed),
            Err(_) => self.stats.dropped_out.fetch_add(1, Relaxed),
        };
        r
    }
}

impl phy::Device for Port {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _: SmolInstant) -> Option<(RxTok, TxTok<'_>)> {
        let p = self.rx.pop_front()?;
        Some((RxTok(p), TxTok { tx: &self.tx, stats: &self.stats }))
    }

    fn transmit(&mut self, _: SmolInstant) -> Option<TxTok<'_>> {
        Some(TxTok { tx: &self.tx, stats: &self.stats })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        let mut sums = ChecksumCapabilities::default();
        // Outgoing packets need their checksums (the receiving kernel checks them);
        // incoming ones were authenticated by the tunnel.
        let c = if self.verify { Checksum::Both } else { Checksum::Tx };
        sums.ipv4 = c;
        sums.tcp = c;
        sums.udp = c;
        sums.icmpv4 = c;
        sums.icmpv6 = c;
        caps.checksum = sums;
        caps
    }
}

struct Listener {
    port: u16,
    sockets: Vec<SocketHandle>,
    accepted: amp::UnboundedSender<TcpConn>,
}

struct State {
    iface: Interface,
    sockets: SocketSet<'static>,
    port: Port,
    listeners: Vec<Listener>,
    /// Connections closed by their handle, waiting for the close to finish.
    closing: Vec<(SocketHandle, std::time::Instant)>,
    next_port: u16,
}

struct Shared {
    state: Mutex<State>,
    input: mpsc::SyncSender<Input>,
    poked: AtomicBool,
    stats: Arc<StackStats>,
    epoch: std::time::Instant,
}

/// A handle on the stack; clones share it.
#[derive(Clone)]
pub struct Stack(Arc<Shared>);

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stack")
    }
}

fn smol_now(epoch: std::time::Instant) -> SmolInstant {
    SmolInstant::from_micros(epoch.elapsed().as_micros() as i64)
}

fn new_tcp() -> tcp::Socket<'static> {
    let mut s =
        tcp::Socket::new(tcp::SocketBuffer::new(vec![0; TCP_BUFFER]), tcp::SocketBuffer::new(vec![0; TCP_BUFFER]));
    s.set_nagle_enabled(false);
    s.set_keep_alive(Some(smoltcp::time::Duration::from_secs(30)));
    s.set_timeout(Some(smoltcp::time::Duration::from_secs(120)));
    s
}

impl Stack {
    /// Starts the stack with this node's overlay addresses; returns the handle and the
    /// pipeline's side of it.
    pub fn start(addrs: &[(IpAddr, u8)], mtu: u16) -> io::Result<(Self, UserPort)> {
        Self::start_with(addrs, mtu, false)
    }

    /// [`Stack::start`], verifying the checksums of incoming packets when
    /// `verify_checksums` (what the tunnel's authentication makes redundant; benches
    /// measure what skipping them saves).
    pub fn start_with(addrs: &[(IpAddr, u8)], mtu: u16, verify_checksums: bool) -> io::Result<(Self, UserPort)> {
        let (out_tx, out_rx) = mpsc::sync_channel(OUTPUT_QUEUE);
        let (in_tx, in_rx) = mpsc::sync_channel(INPUT_QUEUE);
        let stats = Arc::new(StackStats::default());
        let epoch = std::time::Instant::now();
        let mut port = Port {
            rx: VecDeque::new(),
            tx: out_tx,
            mtu: usize::from(mtu),
            verify: verify_checksums,
            stats: stats.clone(),
        };
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = rand::random();
        let iface = Interface::new(config, &mut port, smol_now(epoch));
        let state = State {
            iface,
            sockets: SocketSet::new(Vec::new()),
            port,
            listeners: Vec::new(),
            closing: Vec::new(),
            next_port: 49152 + rand::random::<u16>() % 16384,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            input: in_tx.clone(),
            poked: AtomicBool::new(false),
            stats,
            epoch,
        });
        let stack = Self(shared);
        stack.set_addresses(addrs);
        let s2 = stack.clone();
        std::thread::Builder::new().name("weft-netstack".into()).spawn(move || s2.run(&in_rx))?;
        let st = stack.0.stats.clone();
        let user = UserPort::new(out_rx, move |p| {
            let ok = in_tx.try_send(Input::Packet(p.to_vec())).is_ok();
            if ok {
                st.packets_in.fetch_add(1, Relaxed);
            } else {
                st.dropped_in.fetch_add(1, Relaxed);
            }
            ok
        });
        Ok((stack, user))
    }

    /// The stack's counters.
    pub fn stats(&self) -> &StackStats {
        &self.0.stats
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn poke(&self) {
        if !self.0.poked.swap(true, Relaxed) {
            // A full queue wakes the thread anyway.
            let _ = self.0.input.try_send(Input::Poke);
        }
    }

    /// Replaces the stack's addresses (one per family); everything else in the overlay
    /// and its subnets is reached through the pipeline.
    pub fn set_addresses(&self, addrs: &[(IpAddr, u8)]) {
        let mut st = self.lock();
        st.iface.update_ip_addrs(|a| {
            a.clear();
            for (addr, prefix) in addrs {
                let _ = a.push(IpCidr::new(IpAddress::from(*addr), *prefix));
            }
        });
        let routes = st.iface.routes_mut();
        routes.remove_default_ipv4_route();
        routes.remove_default_ipv6_route();
        // Medium::Ip has no neighbours: a default route "via" our own address sends
        // every destination out through the device.
        for (addr, _) in addrs {
            match addr {
                IpAddr::V4(a) => {
                    let _ = routes.add_default_ipv4_route(*a);
                }
                IpAddr::V6(a) => {
                    let _ = routes.add_default_ipv6_route(*a);
                }
            }
        }
    }

    fn run(&self, input: &mpsc::Receiver<Input>) {
        let mut pending: VecDeque<Vec<u8>> = VecDeque::new();
        let mut delay = MAX_DELAY;
        let mut accepted = Vec::new();
        loop {
            let take = |i: Input, p: &mut VecDeque<Vec<u8>>| {
                if let Input::Packet(b) = i {
                    p.push_back(b);
                }
            };
            match input.recv_timeout(delay) {
                Ok(i) => take(i, &mut pending),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            while pending.len() < 512 {
                match input.try_recv() {
                    Ok(i) => take(i, &mut pending),
                    Err(_) => break,
                }
            }
            self.0.poked.store(false, Relaxed);
            {
                let mut g = self.lock();
                let st = &mut *g;
                st.port.rx.extend(pending.drain(..));
                let now = smol_now(self.0.epoch);
                st.iface.poll(now, &mut st.port, &mut st.sockets);
                self.housekeeping(st, &mut accepted);
                // What housekeeping changed (new listeners, aborts) goes out now.
                st.iface.poll(now, &mut st.port, &mut st.sockets);
                delay = st.iface.poll_delay(now, &st.sockets).map_or(MAX_DELAY, |d| d.into()).min(MAX_DELAY);
            }
            // Outside the lock: a connection nobody takes any more is dropped here,
            // and dropping takes the lock.
            for (tx, conn) in accepted.drain(..) {
                let tx: amp::UnboundedSender<TcpConn> = tx;
                let _ = tx.send(conn);
            }
        }
    }

    /// Hands established connections to their listeners (and keeps [`BACKLOG`]
    /// listening sockets per port), and removes closed connections.
    fn housekeeping(&self, st: &mut State, accepted: &mut Vec<(amp::UnboundedSender<TcpConn>, TcpConn)>) {
        for l in &mut st.listeners {
            let mut keep = Vec::with_capacity(l.sockets.len());
            for h in l.sockets.drain(..) {
                let s = st.sockets.get_mut::<tcp::Socket<'_>>(h);
                match s.state() {
                    tcp::State::Listen | tcp::State::SynReceived => keep.push(h),
                    tcp::State::Established | tcp::State::CloseWait => {
                        let peer = s.remote_endpoint().map(endpoint_addr);
                        let local = s.local_endpoint().map(endpoint_addr);
                        if let (Some(peer), Some(local)) = (peer, local) {
                            self.0.stats.tcp_accepts.fetch_add(1, Relaxed);
                            accepted
                                .push((l.accepted.clone(), TcpConn { stack: self.clone(), handle: h, peer, local }));
                        } else {
                            s.abort();
                            st.closing.push((h, std::time::Instant::now()));
                        }
                    }
                    _ => {
                        st.sockets.remove(h);
                    }
                }
            }
            l.sockets = keep;
            let listening = l
                .sockets
                .iter()
                .filter(|h| st.sockets.get::<tcp::Socket<'_>>(**h).state() == tcp::State::Listen)
                .count();
            if !l.accepted.is_closed() {
                for _ in listening..BACKLOG {
                    let mut s = new_tcp();
                    if s.listen(l.port).is_ok() {
                        l.sockets.push(st.sockets.add(s));
                    }
                }
            }
        }
        // A listener whose receiver is gone stops listening.
        st.listeners.retain(|l| {
            if l.accepted.is_closed() {
                for h in &l.sockets {
                    st.sockets.get_mut::<tcp::Socket<'_>>(*h).abort();
                    st.closing.push((*h, std::time::Instant::now()));
                }
                false
            } else {
                true
            }
        });
        let now = std::time::Instant::now();
        st.closing.retain(|(h, since)| {
            let s = st.sockets.get_mut::<tcp::Socket<'_>>(*h);
            match s.state() {
                tcp::State::Closed | tcp::State::TimeWait => {
                    st.sockets.remove(*h);
                    false
                }
                _ => {
                    if now.duration_since(*since) > LINGER {
                        s.abort();
                    }
                    true
                }
            }
        });
    }

    fn ephemeral(st: &mut State) -> u16 {
        loop {
            let p = st.next_port;
            st.next_port = if p == u16::MAX { 49152 } else { p + 1 };
            let taken = st.sockets.iter().any(|(_, s)| match s {
                smoltcp::socket::Socket::Tcp(t) => t.local_endpoint().is_some_and(|e| e.port == p),
                smoltcp::socket::Socket::Udp(u) => u.endpoint().port == p,
                _ => false,
            });
            if !taken {
                return p;
            }
        }
    }

    /// Opens a TCP connection to `remote` through the overlay.
    pub async fn connect(&self, remote: SocketAddr) -> io::Result<TcpConn> {
        let handle = {
            let mut g = self.lock();
            let st = &mut *g;
            let local = Self::ephemeral(st);
            let mut s = new_tcp();
            s.connect(st.iface.context(), IpEndpoint::from(remote), local)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("cannot connect to {remote}: {e}")))?;
            st.sockets.add(s)
        };
        self.poke();
        let local = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0);
        let mut conn = TcpConn { stack: self.clone(), handle, peer: remote, local };
        let established = poll_fn(|cx| {
            let mut st = self.lock();
            let s = st.sockets.get_mut::<tcp::Socket<'_>>(handle);
            match s.state() {
                tcp::State::SynSent | tcp::State::SynReceived => {
                    s.register_send_waker(cx.waker());
                    Poll::Pending
                }
                tcp::State::Closed => Poll::Ready(Err(io::Error::from(io::ErrorKind::ConnectionRefused))),
                _ => Poll::Ready(Ok(s.local_endpoint().map(endpoint_addr))),
            }
        });
        match tokio::time::timeout(CONNECT_TIMEOUT, established).await {
            Ok(Ok(local)) => {
                conn.local = local.unwrap_or(conn.local);
                self.0.stats.tcp_connects.fetch_add(1, Relaxed);
                Ok(conn)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::from(io::ErrorKind::TimedOut)),
        }
    }

    /// Accepts TCP connections to `port` on this node's overlay addresses; they arrive on
    /// the returned channel until it is dropped.
    pub fn listen(&self, port: u16) -> amp::UnboundedReceiver<TcpConn> {
        let (tx, rx) = amp::unbounded_channel();
        let mut st = self.lock();
        let mut sockets = Vec::with_capacity(BACKLOG);
        for _ in 0..BACKLOG {
            let mut s = new_tcp();
            if s.listen(port).is_ok() {
                sockets.push(st.sockets.add(s));
            }
        }
        st.listeners.push(Listener { port, sockets, accepted: tx });
        rx
    }

    /// A UDP socket on this node's overlay addresses: `port`, or an ephemeral one for 0.
    pub fn udp_bind(&self, port: u16) -> io::Result<UdpConn> {
        let mut g = self.lock();
        let st = &mut *g;
        let port = if port == 0 { Self::ephemeral(st) } else { port };
        let buf = || udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; UDP_SLOTS], vec![0; UDP_BUFFER]);
        let mut s = udp::Socket::new(buf(), buf());
        s.bind(port).map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, format!("overlay UDP port {port}: {e}")))?;
        let taken =
            st.sockets.iter().any(|(_, s)| matches!(s, smoltcp::socket::Socket::Udp(u) if u.endpoint().port == port));
        if taken {
            return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("overlay UDP port {port} is taken")));
        }
        let handle = st.sockets.add(s);
        Ok(UdpConn { stack: self.clone(), handle, port })
    }
}

fn endpoint_addr(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(IpAddr::from(e.addr), e.port)
}

/// A TCP connection through the overlay, as a tokio stream.
pub struct TcpConn {
    stack: Stack,
    handle: SocketHandle,
    /// The other end.
    pub peer: SocketAddr,
    /// This end.
    pub local: SocketAddr,
}

impl std::fmt::Debug for TcpConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConn").field("peer", &self.peer).field("local", &self.local).finish()
    }
}

impl AsyncRead for TcpConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut st = self.stack.lock();
        let s = st.sockets.get_mut::<tcp::Socket<'_>>(self.handle);
        if s.can_recv() {
            let n = s.recv_slice(buf.initialize_unfilled()).map_err(|e| io::Error::other(e.to_string()))?;
            buf.advance(n);
            drop(st);
            // The window opened: tell the sender.
            self.stack.poke();
            return Poll::Ready(Ok(()));
        }
        if !s.may_recv() {
            return match s.state() {
                // Reset before the other side closed.
                tcp::State::Closed if s.remote_endpoint().is_none() => {
                    Poll::Ready(Err(io::Error::from(io::ErrorKind::ConnectionReset)))
                }
                _ => Poll::Ready(Ok(())),
            };
        }
        s.register_recv_waker(cx.waker());
        Poll::Pending
    }
}

impl AsyncWrite for TcpConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let mut st = self.stack.lock();
        let s = st.sockets.get_mut::<tcp::Socket<'_>>(self.handle);
        if !s.may_send() {
            return Poll::Ready(Err(io::Error::from(io::ErrorKind::BrokenPipe)));
        }
        if s.can_send() {
            let n = s.send_slice(data).map_err(|e| io::Error::other(e.to_string()))?;
            drop(st);
            self.stack.poke();
            return Poll::Ready(Ok(n));
        }
        s.register_send_waker(cx.waker());
        Poll::Pending
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stack.lock().sockets.get_mut::<tcp::Socket<'_>>(self.handle).close();
        self.stack.poke();
        Poll::Ready(Ok(()))
    }
}

impl Drop for TcpConn {
    fn drop(&mut self) {
        {
            let mut st = self.stack.lock();
            st.sockets.get_mut::<tcp::Socket<'_>>(self.handle).close();
            st.closing.push((self.handle, std::time::Instant::now()));
        }
        self.stack.poke();
    }
}

/// A UDP socket on the overlay.
pub struct UdpConn {
    stack: Stack,
    handle: SocketHandle,
    /// Its overlay port.
    pub port: u16,
}

impl std::fmt::Debug for UdpConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpConn").field("port", &self.port).finish()
    }
}

impl UdpConn {
    /// Sends one datagram to `to` (waits while the socket's queue is full).
    pub async fn send_to(&self, data: &[u8], to: SocketAddr) -> io::Result<()> {
        poll_fn(|cx| {
            let mut st = self.stack.lock();
            let s = st.sockets.get_mut::<udp::Socket<'_>>(self.handle);
            match s.send_slice(data, IpEndpoint::from(to)) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(udp::SendError::BufferFull) => {
                    s.register_send_waker(cx.waker());
                    Poll::Pending
                }
                Err(e) => Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidInput, format!("UDP to {to}: {e}")))),
            }
        })
        .await?;
        self.stack.poke();
        Ok(())
    }

    /// Receives one datagram: its length and sender.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        poll_fn(|cx| {
            let mut st = self.stack.lock();
            let s = st.sockets.get_mut::<udp::Socket<'_>>(self.handle);
            match s.recv_slice(buf) {
                Ok((n, meta)) => Poll::Ready(Ok((n, endpoint_addr(meta.endpoint)))),
                Err(udp::RecvError::Exhausted) => {
                    s.register_recv_waker(cx.waker());
                    Poll::Pending
                }
                Err(e) => Poll::Ready(Err(io::Error::other(e.to_string()))),
            }
        })
        .await
    }
}

impl Drop for UdpConn {
    fn drop(&mut self) {
        self.stack.lock().sockets.remove(self.handle);
    }
}

/// What the stack holds now, for status.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StackView {
    /// Open TCP connections.
    pub tcp_connections: usize,
    /// Open UDP sockets.
    pub udp_sockets: usize,
}

impl Stack {
    /// Counts the stack's sockets.
    pub fn view(&self) -> StackView {
        let st = self.lock();
        let mut v = StackView::default();
        for (_, s) in st.sockets.iter() {
            match s {
                smoltcp::socket::Socket::Tcp(t) if t.is_active() => v.tcp_connections += 1,
                smoltcp::socket::Socket::Udp(_) => v.udp_sockets += 1,
                _ => {}
            }
        }
        v
    }
}
