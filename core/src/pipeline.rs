//! The forwarding pipelines: per queue, one TX thread (TUN -> seal -> UDP) and one RX
//! thread (UDP -> open -> TUN), each running to completion on blocking I/O over its own
//! buffers, reading the route snapshot once per batch. Nothing here allocates per
//! packet, takes a control-plane lock, or hands packets to another thread; control
//! datagrams leave through a bounded [`ControlSink`] that drops and counts when full.
//!
//! ```text
//! TUN queue i --recv_multiple--> split --lookup dst--> seal --sendmmsg--> UDP socket i
//! UDP socket i --recvmmsg--> type? --data--> replay+open --src check--> send_multiple --> TUN queue i
//!                                  \--handshake--> ControlSink (bounded)
//! ```

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tracing::{debug, warn};
use tun_rs::{GROTable, IDEAL_BATCH_SIZE, SyncDevice, VIRTIO_NET_HDR_LEN};

use crate::crypto::TAG_LEN;
use crate::route::RouteSnapshot;
use crate::session::Session;
use crate::stats::{DropCounters, DropReason};
use crate::transport::udp::{self, Outgoing, RecvMeta};
use crate::wire::{DATA_HEADER_LEN, DataHeader, MessageType, ipv4_addrs};

/// Where the data plane hands what it cannot handle itself.
pub trait ControlSink: Send + Sync + 'static {
    /// Queues an event; returns false (and the event is dropped) when full.
    fn try_push(&self, ev: ControlEvent) -> bool;
}

/// Events from the data plane to the control plane.
#[derive(Debug)]
pub enum ControlEvent {
    /// A handshake or reject datagram.
    Datagram {
        /// Sender.
        from: SocketAddr,
        /// The datagram.
        bytes: Vec<u8>,
    },
    /// The first authenticated packet arrived on a session that was not yet confirmed.
    Confirmed {
        /// The session's local index.
        local_index: u32,
    },
}

/// What all pipelines of a node share.
#[derive(Clone)]
pub struct Shared {
    /// The current route snapshot.
    pub routes: Arc<ArcSwap<RouteSnapshot>>,
    /// Drops that belong to no peer.
    pub drops: Arc<DropCounters>,
    /// Control-plane queue.
    pub control: Arc<dyn ControlSink>,
    /// Origin of the millisecond clock stored in sessions.
    pub epoch: Instant,
    /// Set to stop the RX loops (TX loops end with the process).
    pub stop: Arc<AtomicBool>,
}

/// Sizes of one pipeline.
#[derive(Debug, Clone, Copy)]
pub struct PipelineConfig {
    /// Inner MTU.
    pub mtu: u16,
    /// Whether the TUN has virtio-net offload.
    pub offload: bool,
}

/// Starts the TX and RX thread of pipeline `id`.
pub fn spawn(
    id: usize,
    tun: SyncDevice,
    sock: UdpSocket,
    cfg: PipelineConfig,
    shared: Shared,
) -> io::Result<[JoinHandle<()>; 2]> {
    let tun = Arc::new(tun);
    let sock = Arc::new(sock);
    let (t2, s2, sh2) = (tun.clone(), sock.clone(), shared.clone());
    let tx =
        std::thread::Builder::new().name(format!("weft-tx-{id}")).spawn(move || Tx::new(cfg).run(&t2, &s2, &sh2))?;
    let rx = std::thread::Builder::new()
        .name(format!("weft-rx-{id}"))
        .spawn(move || Rx::new(cfg).run(&tun, &sock, &shared))?;
    Ok([tx, rx])
}

fn now_ms(epoch: Instant) -> u64 {
    // +1 so that 0 keeps meaning "never".
    epoch.elapsed().as_millis() as u64 + 1
}

/// Accumulates per-session counters within a batch and flushes on change.
struct Tally<'a> {
    cur: Option<&'a Arc<Session>>,
    packets: u64,
    bytes: u64,
}

impl<'a> Tally<'a> {
    fn new() -> Self {
        Self { cur: None, packets: 0, bytes: 0 }
    }
    fn add(&mut self, s: &'a Arc<Session>, bytes: usize, rx: bool, now: u64) {
        if !self.cur.is_some_and(|c| Arc::ptr_eq(c, s)) {
            self.flush(rx, now);
            self.cur = Some(s);
        }
        self.packets += 1;
        self.bytes += bytes as u64;
    }
    fn flush(&mut self, rx: bool, now: u64) {
        if let Some(s) = self.cur.take() {
            if rx {
                s.stats.add_rx(self.packets, self.bytes);
            } else {
                s.stats.add_tx(self.packets, self.bytes);
                s.touch_tx(now);
            }
        }
        self.packets = 0;
        self.bytes = 0;
    }
}

/// TUN -> UDP.
pub struct Tx {
    original: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    out: Vec<Outgoing>,
}

impl Tx {
    /// Allocates the thread's buffers once.
    pub fn new(cfg: PipelineConfig) -> Self {
        let slot = DATA_HEADER_LEN + usize::from(cfg.mtu).max(1500) + TAG_LEN + 64;
        let original = if cfg.offload { vec![0u8; VIRTIO_NET_HDR_LEN + 65535] } else { Vec::new() };
        Self {
            original,
            bufs: (0..IDEAL_BATCH_SIZE).map(|_| vec![0u8; slot]).collect(),
            sizes: vec![0; IDEAL_BATCH_SIZE],
            out: Vec::with_capacity(IDEAL_BATCH_SIZE),
        }
    }

    fn run(mut self, tun: &SyncDevice, sock: &UdpSocket, shared: &Shared) {
        loop {
            let n = match tun.recv_multiple(&mut self.original, &mut self.bufs, &mut self.sizes, DATA_HEADER_LEN) {
                Ok(n) => n,
                Err(e) => {
                    shared.drops.add(DropReason::Tun, 1);
                    if e.raw_os_error() == Some(libc::EBADFD) || e.raw_os_error() == Some(libc::EBADF) {
                        warn!(error = %e, "TUN queue closed; TX pipeline stops");
                        return;
                    }
                    debug!(error = %e, "TUN read failed");
                    continue;
                }
            };
            let routes = shared.routes.load();
            self.process(&routes, &shared.drops, n, now_ms(shared.epoch));
            let failed = udp::send_batch(sock, &self.bufs, &self.out);
            if failed > 0 {
                shared.drops.add(DropReason::UdpSend, failed as u64);
            }
        }
    }

    /// Seals the `n` packets read into the buffers and lists the datagrams to send.
    pub fn process(&mut self, routes: &RouteSnapshot, drops: &DropCounters, n: usize, now: u64) {
        self.out.clear();
        let mut tally = Tally::new();
        for i in 0..n {
            let len = self.sizes[i];
            let buf = &mut self.bufs[i];
            let Some((_, dst)) = buf.get(DATA_HEADER_LEN..DATA_HEADER_LEN + len).and_then(ipv4_addrs) else {
                drops.add(DropReason::NotIpv4, 1);
                continue;
            };
            let Some(session) = routes.session_for(dst) else {
                drops.add(DropReason::NoRoute, 1);
                continue;
            };
            let Some(total) = session.seal(buf, len) else {
                drops.add(DropReason::Malformed, 1);
                continue;
            };
            tally.add(session, len, false, now);
            self.out.push(Outgoing { buf: i, len: total, to: session.endpoint });
        }
        tally.flush(false, now);
    }

    /// Buffers and sizes, for feeding packets without a TUN (tests and benches).
    pub fn buffers(&mut self) -> (&mut [Vec<u8>], &mut [usize]) {
        (&mut self.bufs, &mut self.sizes)
    }

    /// The datagrams of the last [`Tx::process`].
    pub fn outgoing(&self) -> (&[Vec<u8>], &[Outgoing]) {
        (&self.bufs, &self.out)
    }
}

const RX_SLOTS: usize = 64;

/// UDP -> TUN.
pub struct Rx {
    slab: Vec<u8>,
    slot: usize,
    metas: Vec<RecvMeta>,
    coal: Vec<Vec<u8>>,
    gro: GROTable,
    pending: usize,
}

impl Rx {
    /// Allocates the thread's buffers once.
    pub fn new(cfg: PipelineConfig) -> Self {
        let slot = (DATA_HEADER_LEN + usize::from(cfg.mtu) + TAG_LEN + 64).max(2048);
        // GRO only coalesces into a head buffer with room for the whole super-packet.
        let cap = if cfg.offload { 2 * VIRTIO_NET_HDR_LEN + 65535 + 64 } else { VIRTIO_NET_HDR_LEN + slot };
        Self {
            slab: vec![0u8; slot * RX_SLOTS],
            slot,
            metas: vec![RecvMeta::default(); RX_SLOTS],
            coal: (0..IDEAL_BATCH_SIZE).map(|_| Vec::with_capacity(cap)).collect(),
            gro: GROTable::default(),
            pending: 0,
        }
    }

    fn run(mut self, tun: &SyncDevice, sock: &UdpSocket, shared: &Shared) {
        while !shared.stop.load(Ordering::Relaxed) {
            let n = match udp::recv_batch(sock, &mut self.slab, self.slot, &mut self.metas) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    warn!(error = %e, "UDP receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let routes = shared.routes.load();
            self.process(&routes, shared, n);
            self.flush(tun, &shared.drops);
        }
    }

    /// Handles `n` datagrams already in the slab.
    pub fn process(&mut self, routes: &RouteSnapshot, shared: &Shared, n: usize) {
        let now = now_ms(shared.epoch);
        let mut tally = Tally::new();
        for i in 0..n {
            let meta = self.metas[i];
            let data = &mut self.slab[i * self.slot..i * self.slot + meta.len];
            if meta.truncated {
                shared.drops.add(DropReason::Malformed, 1);
                continue;
            }
            match MessageType::of(data) {
                Some(MessageType::Data) => {}
                Some(_) => {
                    let ev = ControlEvent::Datagram { from: meta.from, bytes: data.to_vec() };
                    if !shared.control.try_push(ev) {
                        shared.drops.add(DropReason::ControlQueueFull, 1);
                    }
                    continue;
                }
                None => {
                    shared.drops.add(DropReason::Malformed, 1);
                    continue;
                }
            }
            let Ok(hdr) = DataHeader::parse(data) else {
                shared.drops.add(DropReason::Malformed, 1);
                continue;
            };
            let Some(session) = routes.session_by_index(hdr.receiver_index) else {
                shared.drops.add(DropReason::UnknownSession, 1);
                continue;
            };
            let len = match session.open(&hdr, data) {
                Ok(len) => len,
                Err(reason) => {
                    session.stats.drops.add(reason, 1);
                    continue;
                }
            };
            session.touch_rx(now);
            if session.confirm()
                && !shared.control.try_push(ControlEvent::Confirmed { local_index: session.local_index })
            {
                shared.drops.add(DropReason::ControlQueueFull, 1);
            }
            if len == 0 {
                continue; // keepalive
            }
            let plain = &data[DATA_HEADER_LEN..DATA_HEADER_LEN + len];
            match ipv4_addrs(plain) {
                Some((src, _)) if src == session.peer_addr => {}
                Some(_) => {
                    session.stats.drops.add(DropReason::Spoofed, 1);
                    continue;
                }
                None => {
                    session.stats.drops.add(DropReason::NotIpv4, 1);
                    continue;
                }
            }
            let out = &mut self.coal[self.pending];
            out.clear();
            out.resize(VIRTIO_NET_HDR_LEN, 0);
            out.extend_from_slice(plain);
            self.pending += 1;
            tally.add(session, len, true, now);
        }
        tally.flush(true, now);
    }

    /// Writes the packets gathered by [`Rx::process`] to the TUN, coalescing them.
    fn flush(&mut self, tun: &SyncDevice, drops: &DropCounters) {
        if self.pending == 0 {
            return;
        }
        if let Err(e) = tun.send_multiple(&mut self.gro, &mut self.coal[..self.pending], VIRTIO_NET_HDR_LEN) {
            debug!(error = %e, "TUN write failed");
            drops.add(DropReason::Tun, 1);
        }
        self.pending = 0;
    }

    /// The slab and metadata, for feeding datagrams without a socket (tests, benches).
    pub fn slab(&mut self) -> (&mut [u8], usize, &mut [RecvMeta]) {
        (&mut self.slab, self.slot, &mut self.metas)
    }

    /// Plaintext packets gathered by the last [`Rx::process`] and not yet written;
    /// taking them clears the batch.
    pub fn take_pending(&mut self) -> impl Iterator<Item = &[u8]> {
        let n = std::mem::take(&mut self.pending);
        self.coal[..n].iter().map(|b| &b[VIRTIO_NET_HDR_LEN..])
    }
}

// One received datagram yields at most one packet, so a batch never overflows `coal`.
const _: () = assert!(RX_SLOTS <= IDEAL_BATCH_SIZE);
