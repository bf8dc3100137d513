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
use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tracing::{debug, warn};
use tun_rs::{GROTable, IDEAL_BATCH_SIZE, SyncDevice, VIRTIO_NET_HDR_LEN};

use crate::gso;
use crate::transport::udp::{self, MAX_BATCH, Offload, Outgoing, RecvMeta};
use crate::transport::{Egress, Endpoint, Forward, Inbound, Links, Proto, frame};
use weft_core::admission::MacKeys;
use weft_core::crypto::TAG_LEN;
use weft_core::route::{Lookup, RouteSnapshot};
use weft_core::session::Session;
use weft_core::stats::{DropCounters, DropReason};
use weft_core::wire::{
    DATA_HEADER_LEN, DataHeader, FLAG_CONTROL, FLAG_GSO, FLAG_ORDERED, MAX_HOPS, MessageType, RELAY_HEADER_LEN,
    RelayHeader, ip_addrs,
};

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
        /// Sender (the last relay when `via` is set).
        from: Endpoint,
        /// The node that sent it through relays, if it was relayed.
        via: Option<[u8; 8]>,
        /// The datagram.
        bytes: Vec<u8>,
    },
    /// A control message arrived inside a session.
    Message {
        /// The session's local index.
        local_index: u32,
        /// The decrypted message.
        bytes: Vec<u8>,
    },
    /// Authenticated packets of a session arrive directly from `from` (reported at most
    /// once a second per session): a direct path exists, or the peer roamed.
    Direct {
        /// The session's local index.
        local_index: u32,
        /// Where they come from.
        from: Endpoint,
    },
    /// The first authenticated packet arrived on a session that was not yet confirmed.
    Confirmed {
        /// The session's local index.
        local_index: u32,
    },
    /// A packet from our TUN for a member without a session (at most a few per member
    /// and snapshot): the control plane starts the handshake and sends it afterwards.
    Unrouted {
        /// Its destination address.
        dst: std::net::IpAddr,
        /// The IP packet.
        packet: Vec<u8>,
    },
}

/// What all pipelines of a node share.
#[derive(Clone)]
pub struct Shared {
    /// The current route snapshot.
    pub routes: Arc<ArcSwap<RouteSnapshot>>,
    /// Control-plane queue.
    pub control: Arc<dyn ControlSink>,
    /// The network's handshake MAC keys: handshakes that fail mac1 are dropped here.
    pub macs: Arc<MacKeys>,
    /// Origin of the millisecond clock stored in sessions.
    pub epoch: Instant,
    /// Set to stop the RX loops (TX loops end with the process).
    pub stop: Arc<AtomicBool>,
    /// UDP offload state (GSO can be switched off at run time).
    pub offload: Arc<Offload>,
}

/// Counters of one pipeline, written once per batch by its own threads.
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Packets read from the TUN and sent.
    pub tx_packets: AtomicU64,
    /// Plaintext bytes sent.
    pub tx_bytes: AtomicU64,
    /// TUN reads that produced packets.
    pub tx_batches: AtomicU64,
    /// Packets written to the TUN.
    pub rx_packets: AtomicU64,
    /// Plaintext bytes written to the TUN.
    pub rx_bytes: AtomicU64,
    /// recvmmsg calls that returned datagrams.
    pub rx_batches: AtomicU64,
    /// GSO super-packets sent whole as one record ([`FLAG_GSO`]).
    pub tx_gso_records: AtomicU64,
    /// GSO records received and delivered.
    pub rx_gso_records: AtomicU64,
    /// Drops that belong to no peer, by reason.
    pub drops: DropCounters,
}

/// Where a pipeline reads the packets it seals and writes the packets it opens.
pub enum Device {
    /// A TUN queue.
    Tun(SyncDevice),
    /// A network stack in this process (no-TUN mode).
    User(UserPort),
}

/// The pipeline's side of an in-process network stack: packets the stack sends come
/// in through a channel, packets for the stack go out through a callback that must
/// not block (it returns false, and the packet is counted as a drop, when the stack is
/// behind).
pub struct UserPort {
    outbound: Mutex<mpsc::Receiver<Vec<u8>>>,
    deliver: Deliver,
}

/// Hands one packet to a userspace stack; false when it is behind.
pub type Deliver = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

impl UserPort {
    /// `outbound` yields what the stack sends; `deliver` hands it what arrives.
    pub fn new(outbound: mpsc::Receiver<Vec<u8>>, deliver: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> Self {
        Self { outbound: Mutex::new(outbound), deliver: Box::new(deliver) }
    }

    /// The channel of what the stack sends and the way in, for wiring a stack to
    /// something other than a pipeline (benches, tests).
    pub fn into_parts(self) -> (mpsc::Receiver<Vec<u8>>, Deliver) {
        (self.outbound.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner), self.deliver)
    }
}

impl std::fmt::Debug for UserPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserPort")
    }
}

/// RX's writer for a userspace stack: every packet is handed over whole (no
/// coalescing: the stack takes MTU-sized packets).
pub struct UserOut<'a> {
    port: &'a UserPort,
}

impl TunWriter for UserOut<'_> {
    fn write_batch(&mut self, _gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        let mut refused = 0;
        for b in bufs.iter() {
            if !(self.port.deliver)(&b[VIRTIO_NET_HDR_LEN..]) {
                refused += 1;
            }
        }
        if refused > 0 {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, format!("network stack refused {refused} packets")));
        }
        Ok(())
    }
}

enum DevOut<'a> {
    Tun(TunOut<'a>),
    User(UserOut<'a>),
}

impl<'a> DevOut<'a> {
    fn new(dev: &'a Device, offload: &'a Offload, vnet_hdr: bool) -> Self {
        match dev {
            Device::Tun(d) => Self::Tun(TunOut::new(d, offload, vnet_hdr)),
            Device::User(port) => Self::User(UserOut { port }),
        }
    }
}

impl TunWriter for DevOut<'_> {
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        match self {
            Self::Tun(t) => t.write_batch(gro, bufs),
            Self::User(u) => u.write_batch(gro, bufs),
        }
    }

    fn write_super(&mut self, gro: &mut GROTable, pkt: &mut [u8], scratch: &mut [Vec<u8>]) -> io::Result<usize> {
        match self {
            Self::Tun(t) => t.write_super(gro, pkt, scratch),
            Self::User(u) => u.write_super(gro, pkt, scratch),
        }
    }
}

/// Where RX writes decrypted packets: the TUN queue, or a collector in tests.
pub trait TunWriter {
    /// Writes `bufs` (each with `VIRTIO_NET_HDR_LEN` bytes of headroom), coalescing
    /// where it can. Errors are counted by the caller.
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()>;

    /// Writes one GSO super-packet (`pkt`: a virtio header, then the packet) and
    /// returns how many packets it stands for. By default it is split into `scratch`
    /// ([`gso::split_into`]) and the segments go through [`TunWriter::write_batch`];
    /// errors of kind `InvalidData` are malformed super-packets.
    fn write_super(&mut self, gro: &mut GROTable, pkt: &mut [u8], scratch: &mut [Vec<u8>]) -> io::Result<usize> {
        split_and_write(self, gro, pkt, scratch)
    }
}

/// Splits a super-packet into `scratch` and writes the segments as one batch.
fn split_and_write<W: TunWriter + ?Sized>(
    w: &mut W,
    gro: &mut GROTable,
    pkt: &mut [u8],
    scratch: &mut [Vec<u8>],
) -> io::Result<usize> {
    let n = gso::split_into(pkt, scratch)?;
    w.write_batch(gro, &mut scratch[..n])?;
    Ok(n)
}

/// The TUN queue as RX's writer: GRO-coalesced writes while the kernel accepts them;
/// the first EINVAL (kernels with the virtio csum_start regression refuse coalesced
/// writes) turns coalescing off for the whole node and the packets go one by one.
pub struct TunOut<'a> {
    dev: &'a SyncDevice,
    offload: &'a Offload,
    vnet_hdr: bool,
}

impl<'a> TunOut<'a> {
    /// Wraps a TUN queue; `vnet_hdr` says whether it was opened with offload.
    pub fn new(dev: &'a SyncDevice, offload: &'a Offload, vnet_hdr: bool) -> Self {
        Self { dev, offload, vnet_hdr }
    }

    fn write_plain(&self, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        let mut result = Ok(());
        for b in bufs.iter_mut() {
            // With offload every write carries a virtio header; an all-zero one means
            // "no GSO, checksum complete".
            let start = if self.vnet_hdr {
                b[..VIRTIO_NET_HDR_LEN].fill(0);
                0
            } else {
                VIRTIO_NET_HDR_LEN
            };
            if let Err(e) = self.dev.send(&b[start..]) {
                result = Err(e);
            }
        }
        result
    }
}

impl TunWriter for TunOut<'_> {
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        if !self.vnet_hdr || !self.offload.tun_gro() {
            return self.write_plain(bufs);
        }
        match self.dev.send_multiple(gro, bufs, VIRTIO_NET_HDR_LEN) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if self.offload.disable_tun_gro() {
                    warn!(error = %e, "TUN refused a coalesced write; turning TUN GRO off");
                }
                // Some packets of the batch may have gone out already; TCP copes with
                // the duplicates, and this happens once.
                self.write_plain(bufs)
            }
            r => r.map(|_| ()),
        }
    }

    /// With offload the kernel takes the super-packet whole (after the header is
    /// checked) and segments it itself; otherwise, or once it refused a GSO write,
    /// it is split here.
    fn write_super(&mut self, gro: &mut GROTable, pkt: &mut [u8], scratch: &mut [Vec<u8>]) -> io::Result<usize> {
        if self.vnet_hdr && self.offload.tun_gro() {
            let (_, segments) = gso::normalize(pkt)?;
            if segments > gso::MAX_SEGMENTS {
                // No correct sender makes more (see `Tx::seal_super`): not the kernel's
                // work to cut a member's 64 KiB into 1-byte segments.
                return Err(io::Error::new(io::ErrorKind::InvalidData, "GSO record with too many segments"));
            }
            match self.dev.send(pkt) {
                Ok(_) => return Ok(segments),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    if self.offload.disable_tun_gro() {
                        warn!(error = %e, "TUN refused a GSO write; turning TUN GRO off");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        split_and_write(self, gro, pkt, scratch)
    }
}

/// Sizes of one pipeline.
#[derive(Debug, Clone, Copy)]
pub struct PipelineConfig {
    /// Inner MTU.
    pub mtu: u16,
    /// Whether the TUN has virtio-net offload.
    pub offload: bool,
    /// Whether the UDP socket has GRO on (receive slots must then hold 64 KiB).
    pub udp_gro: bool,
    /// Core to pin this pipeline's threads to, if any.
    pub pin: Option<usize>,
}

/// Starts the TX and RX thread of pipeline `id`: TUN queue `tun`, UDP socket `sock`
/// (the caller may keep it to move the pipeline to another port with
/// [`crate::transport::udp::replace`]), and the node's connections `links` for paths
/// over other transports.
pub fn spawn(
    id: usize,
    tun: Arc<Device>,
    sock: Arc<UdpSocket>,
    links: Arc<Links>,
    cfg: PipelineConfig,
    shared: Shared,
    stats: Arc<PipelineStats>,
) -> io::Result<[JoinHandle<()>; 2]> {
    let tx_egress = Egress::new(sock.clone(), links.clone(), shared.offload.clone());
    let rx_egress = Egress::new(sock, links, shared.offload.clone());
    let (t2, sh2, st2) = (tun.clone(), shared.clone(), stats.clone());
    let tx = std::thread::Builder::new().name(format!("weft-tx-{id}")).spawn(move || {
        pin(cfg.pin);
        Tx::new(cfg).run(&t2, tx_egress, &sh2, &st2)
    })?;
    let rx = std::thread::Builder::new().name(format!("weft-rx-{id}")).spawn(move || {
        pin(cfg.pin);
        Rx::new(cfg).run(&tun, rx_egress, &shared, &stats)
    })?;
    Ok([tx, rx])
}

/// Starts links RX thread `id`, which opens what the connections (TCP, WebSocket,
/// QUIC) given to it receive (see [`Links::sharded`]) and writes it to the TUN queue
/// `tun`; relayed frames leave through `egress`.
pub fn spawn_links_rx(
    id: usize,
    tun: Arc<Device>,
    inbound: mpsc::Receiver<Inbound>,
    egress: Egress,
    cfg: PipelineConfig,
    shared: Shared,
    stats: Arc<PipelineStats>,
) -> io::Result<JoinHandle<()>> {
    let cfg = PipelineConfig { udp_gro: false, ..cfg };
    std::thread::Builder::new()
        .name(format!("weft-links-{id}"))
        .spawn(move || Rx::new(cfg).run_links(id, &tun, &inbound, egress, &shared, &stats))
}

fn pin(core: Option<usize>) {
    let Some(core) = core else { return };
    let ok = core_affinity::get_core_ids()
        .and_then(|ids| ids.into_iter().find(|c| c.id == core))
        .is_some_and(core_affinity::set_for_current);
    if !ok {
        debug!(core, "could not pin pipeline thread");
    }
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
        self.add_n(s, 1, bytes as u64, rx, now);
    }
    fn add_n(&mut self, s: &'a Arc<Session>, packets: u64, bytes: u64, rx: bool, now: u64) {
        if !self.cur.is_some_and(|c| Arc::ptr_eq(c, s)) {
            self.flush(rx, now);
            self.cur = Some(s);
        }
        self.packets += packets;
        self.bytes += bytes;
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
    /// With offload: what the TUN returned (virtio header and a packet of up to
    /// 64 KiB) at [`TX_HEADROOM`], split from here or sealed here whole.
    original: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    out: Vec<Outgoing>,
    /// Plaintext bytes of the datagrams in `out`.
    sent_bytes: u64,
    /// Packets of the last batch for members without a session (the slow path: at
    /// most a few per member and snapshot, see [`weft_core::route::Demand`]).
    unrouted: Vec<(std::net::IpAddr, Vec<u8>)>,
}

impl Tx {
    /// Allocates the thread's buffers once.
    pub fn new(cfg: PipelineConfig) -> Self {
        let slot = TX_HEADROOM + usize::from(cfg.mtu).max(1500) + TAG_LEN + 64;
        let original =
            if cfg.offload { vec![0u8; TX_HEADROOM + VIRTIO_NET_HDR_LEN + 65535 + TAG_LEN + 64] } else { Vec::new() };
        Self {
            original,
            bufs: (0..IDEAL_BATCH_SIZE).map(|_| vec![0u8; slot]).collect(),
            sizes: vec![0; IDEAL_BATCH_SIZE],
            out: Vec::with_capacity(IDEAL_BATCH_SIZE),
            sent_bytes: 0,
            unrouted: Vec::new(),
        }
    }

    /// Whether this thread reads the TUN's super-packets (TUN offload): only then is
    /// there a buffer for them.
    fn reads_super_packets(&self) -> bool {
        !self.original.is_empty()
    }

    fn run(self, dev: &Device, egress: Egress, shared: &Shared, stats: &PipelineStats) {
        match dev {
            Device::Tun(tun) => self.run_tun(tun, egress, shared, stats),
            Device::User(port) => {
                let Ok(outbound) = port.outbound.lock() else { return };
                self.run_user(&outbound, egress, shared, stats);
            }
        }
    }

    fn run_user(
        mut self,
        outbound: &mpsc::Receiver<Vec<u8>>,
        mut egress: Egress,
        shared: &Shared,
        stats: &PipelineStats,
    ) {
        // The stack's packets are at most one MTU: no TSO split to do.
        while let Ok(first) = outbound.recv() {
            let mut n = 0;
            let mut next = Some(first);
            while let Some(p) = next.take() {
                let buf = &mut self.bufs[n];
                if TX_HEADROOM + p.len() > buf.len() {
                    stats.drops.add(DropReason::Malformed, 1);
                } else {
                    buf[TX_HEADROOM..TX_HEADROOM + p.len()].copy_from_slice(&p);
                    self.sizes[n] = p.len();
                    n += 1;
                }
                if n < self.bufs.len() {
                    next = outbound.try_recv().ok();
                }
            }
            self.send(n, &mut egress, shared, stats);
        }
    }

    fn send(&mut self, n: usize, egress: &mut Egress, shared: &Shared, stats: &PipelineStats) {
        let routes = shared.routes.load();
        self.process(&routes, &stats.drops, n, now_ms(shared.epoch));
        egress.send(&self.bufs, &self.out).count(&stats.drops);
        for (dst, packet) in self.unrouted.drain(..) {
            if !shared.control.try_push(ControlEvent::Unrouted { dst, packet }) {
                stats.drops.add(DropReason::ControlQueueFull, 1);
            }
        }
        stats.tx_batches.fetch_add(1, Relaxed);
        stats.tx_packets.fetch_add(self.out.len() as u64, Relaxed);
        stats.tx_bytes.fetch_add(self.sent_bytes, Relaxed);
    }

    fn run_tun(mut self, tun: &SyncDevice, mut egress: Egress, shared: &Shared, stats: &PipelineStats) {
        loop {
            let n = match self.read(tun, &mut egress, shared, stats) {
                Ok(0) => continue,
                Ok(n) => n,
                Err(e) => {
                    stats.drops.add(DropReason::Tun, 1);
                    if e.raw_os_error() == Some(libc::EBADFD) || e.raw_os_error() == Some(libc::EBADF) {
                        warn!(error = %e, "TUN queue closed; TX pipeline stops");
                        return;
                    }
                    debug!(error = %e, "TUN read failed");
                    continue;
                }
            };
            self.send(n, &mut egress, shared, stats);
        }
    }

    /// Reads from the TUN: returns how many packets to seal are in the buffers, or 0
    /// when what it read was a super-packet that went out whole.
    fn read(
        &mut self,
        tun: &SyncDevice,
        egress: &mut Egress,
        shared: &Shared,
        stats: &PipelineStats,
    ) -> io::Result<usize> {
        if !self.reads_super_packets() {
            return tun.recv_multiple(&mut self.original, &mut self.bufs, &mut self.sizes, TX_HEADROOM);
        }
        let len = tun.recv(&mut self.original[TX_HEADROOM..])?;
        let routes = shared.routes.load();
        if let Some((packets, bytes)) = self.seal_super(&routes, len, now_ms(shared.epoch)) {
            // The record is in `original`: send it from buffer 0's place.
            std::mem::swap(&mut self.bufs[0], &mut self.original);
            egress.send(&self.bufs, &self.out).count(&stats.drops);
            std::mem::swap(&mut self.bufs[0], &mut self.original);
            stats.tx_batches.fetch_add(1, Relaxed);
            stats.tx_gso_records.fetch_add(1, Relaxed);
            stats.tx_packets.fetch_add(packets, Relaxed);
            stats.tx_bytes.fetch_add(bytes, Relaxed);
            return Ok(0);
        }
        gso::split(&mut self.original[TX_HEADROOM..TX_HEADROOM + len], &mut self.bufs, &mut self.sizes, TX_HEADROOM)
    }

    /// The raw read buffer (virtio header and packet go at its start), for feeding
    /// super-packets without a TUN (tests and benches); empty without offload.
    pub fn raw_buffer(&mut self) -> &mut [u8] {
        self.original.get_mut(TX_HEADROOM..).unwrap_or_default()
    }

    /// Seals the super-packet of `len` bytes (virtio header included) in the raw
    /// buffer as one [`FLAG_GSO`] record when it goes to a peer that takes such
    /// records over a reliable connection (TCP, WebSocket), straight or through relays
    /// whose every link is one ([`weft_core::route::Route::relay_streams`]), or straight
    /// over QUIC when the peer takes them there (the connection's stream); lists it as
    /// the only entry of the outgoing list (buffer 0: [`Tx::super_record`]).
    /// Returns the packets and bytes it stands for, or `None` (nothing sealed) when
    /// it is to be split and sealed per packet instead.
    pub fn seal_super(&mut self, routes: &RouteSnapshot, len: usize, now: u64) -> Option<(u64, u64)> {
        let pkt = self.original.get(TX_HEADROOM..TX_HEADROOM + len)?;
        if gso::header(pkt).ok()?.gso_type == gso::GSO_NONE {
            return None;
        }
        let (_, dst) = ip_addrs(&pkt[VIRTIO_NET_HDR_LEN..])?;
        let Lookup::Route(route) = routes.lookup(dst) else { return None };
        let s = &route.session;
        let relay_len = if route.relay.is_some() { RELAY_HEADER_LEN } else { 0 };
        if (route.relay.is_some() && !route.relay_streams)
            || !(route.target.proto.is_stream() || records_over_quic(route))
            || !s.peer_gso()
            || s.is_expired(now)
            || relay_len + len + s.overhead() > frame::MAX_FRAME
        {
            return None;
        }
        let (_, segments) = gso::normalize(&mut self.original[TX_HEADROOM..TX_HEADROOM + len]).ok()?;
        if segments > gso::MAX_SEGMENTS {
            return None;
        }
        let sealed = s.seal_with_flags(&mut self.original[RELAY_HEADER_LEN..], len, FLAG_GSO)?;
        if let Some(h) = &route.relay
            && let Some(head) = self.original.first_chunk_mut::<RELAY_HEADER_LEN>()
        {
            h.emit(head);
        }
        let start = RELAY_HEADER_LEN - relay_len;
        self.out.clear();
        self.out.push(Outgoing { buf: 0, start, len: relay_len + sealed, to: route.target });
        let (packets, bytes) = (segments as u64, (len - VIRTIO_NET_HDR_LEN) as u64);
        s.stats.add_tx(packets, bytes);
        s.touch_tx(now);
        Some((packets, bytes))
    }

    /// The record the last successful [`Tx::seal_super`] sealed, and where it goes.
    pub fn super_record(&self) -> Option<(Endpoint, &[u8])> {
        let o = self.out.first()?;
        Some((o.to, self.original.get(o.start..o.start + o.len)?))
    }

    /// Seals the `n` packets read into the buffers (at [`TX_HEADROOM`]) and lists the
    /// datagrams to send.
    pub fn process(&mut self, routes: &RouteSnapshot, drops: &DropCounters, n: usize, now: u64) {
        self.out.clear();
        self.unrouted.clear();
        self.sent_bytes = 0;
        // Only a node reading super-packets sends records.
        let offload = self.reads_super_packets();
        let mut tally = Tally::new();
        for i in 0..n {
            let len = self.sizes[i];
            let buf = &mut self.bufs[i];
            let Some((_, dst)) = buf.get(TX_HEADROOM..TX_HEADROOM + len).and_then(ip_addrs) else {
                drops.add(DropReason::NotIp, 1);
                continue;
            };
            let route = match routes.lookup(dst) {
                Lookup::Route(r) => r,
                Lookup::Demand(d) if d.take() => {
                    self.unrouted.push((dst, buf[TX_HEADROOM..TX_HEADROOM + len].to_vec()));
                    continue;
                }
                Lookup::Demand(_) => {
                    drops.add(DropReason::NoSession, 1);
                    continue;
                }
                Lookup::None => {
                    drops.add(DropReason::NoRoute, 1);
                    continue;
                }
            };
            if route.session.is_expired(now) {
                route.session.stats.drops.add(DropReason::KeyExpired, 1);
                continue;
            }
            let mut flags = 0;
            if route.target.proto == Proto::Quic {
                // TCP connections over QUIC send segments that fit one datagram.
                let max = QUIC_INNER_MAX - if route.relay.is_some() { RELAY_HEADER_LEN } else { 0 };
                weft_core::wire::clamp_mss(&mut buf[TX_HEADROOM..TX_HEADROOM + len], max);
                // Where this node's super-packets go as records on the connection's
                // stream, a TCP segment of the same flows goes there too, behind them.
                if offload && records_over_quic(route) && tcp_in_order(&buf[TX_HEADROOM..TX_HEADROOM + len]) {
                    flags = FLAG_ORDERED;
                }
            }
            let Some(sealed) = route.session.seal_with_flags(&mut buf[RELAY_HEADER_LEN..], len, flags) else {
                drops.add(DropReason::Malformed, 1);
                continue;
            };
            let start = match &route.relay {
                Some(h) => {
                    if let Some(head) = buf.first_chunk_mut::<RELAY_HEADER_LEN>() {
                        h.emit(head);
                    }
                    0
                }
                None => RELAY_HEADER_LEN,
            };
            tally.add(&route.session, len, false, now);
            self.sent_bytes += len as u64;
            self.out.push(Outgoing { buf: i, start, len: RELAY_HEADER_LEN - start + sealed, to: route.target });
        }
        tally.flush(false, now);
    }

    /// Buffers and sizes, for feeding packets without a TUN (tests and benches).
    pub fn buffers(&mut self) -> (&mut [Vec<u8>], &mut [usize]) {
        (&mut self.bufs, &mut self.sizes)
    }

    /// The packets of the last [`Tx::process`] for members without a session (the
    /// runtime hands them to the control plane as [`ControlEvent::Unrouted`]).
    pub fn take_unrouted(&mut self) -> Vec<(std::net::IpAddr, Vec<u8>)> {
        std::mem::take(&mut self.unrouted)
    }

    /// The datagrams of the last [`Tx::process`].
    pub fn outgoing(&self) -> (&[Vec<u8>], &[Outgoing]) {
        (&self.bufs, &self.out)
    }
}

/// Whether super-packets to `route` go over QUIC as records: only straight to a peer
/// whose hello offers records there (a relay forwards records to stream hops only).
/// Then TCP segments that must keep their order go on the same stream
/// ([`FLAG_ORDERED`]).
fn records_over_quic(route: &weft_core::route::Route) -> bool {
    let s = &route.session;
    route.target.proto == Proto::Quic && route.relay.is_none() && s.peer_gso() && s.peer_gso_quic()
}

/// Whether `ip` (exactly one packet) is a TCP segment that must not overtake the
/// records ahead of it (IPv4, or IPv6 without extension headers): one with data, or
/// with SYN, FIN or RST. A bare acknowledgement may: its order does not matter to the
/// peer.
fn tcp_in_order(ip: &[u8]) -> bool {
    const SYN_FIN_RST: u8 = 0x02 | 0x01 | 0x04;
    layer4(ip).is_some_and(|l| {
        l.proto == 6 && (l.bytes.len() > l.header || l.bytes.get(13).is_some_and(|f| f & SYN_FIN_RST != 0))
    })
}

/// Room TX leaves in front of each packet it reads: a relay header and a data header.
pub const TX_HEADROOM: usize = RELAY_HEADER_LEN + DATA_HEADER_LEN;

/// The largest inner packet one QUIC datagram carries whole on a 1500-byte underlay
/// (IPv4 or IPv6): quinn's path MTU ceiling of 1452 bytes of UDP payload, less QUIC's
/// short header, AEAD tag and datagram frame (38), our datagram tag (1) and data
/// header and tag (32), with a byte to spare. TCP SYNs towards a QUIC hop get their
/// MSS clamped to it, so full-size segments are not split in two datagrams.
pub const QUIC_INNER_MAX: usize = 1380;

/// Receive slots without GRO: one datagram each.
const RX_SLOTS: usize = 64;
/// Opened packets RX gathers before one coalescing TUN write (at least
/// `gso::MAX_SEGMENTS`: they also hold a split GSO record's segments). Each has a
/// buffer of one packet's size; the first packet of each flow moves into a large one
/// before the write ([`Coalescer`]).
const RX_COALESCE: usize = IDEAL_BATCH_SIZE;
const _: () = assert!(RX_COALESCE >= gso::MAX_SEGMENTS);
/// Large coalescing buffers one write may use: flows past this many in one batch are
/// written without coalescing.
const RX_HEADS: usize = 32;
/// Room of a large coalescing buffer: a virtio header and a 65 535-byte IP packet, the
/// most one super-packet may be, plus the header tun-rs's room check reserves. TUN GRO
/// admits a segment to a head by the head's room alone, so a buffer with more room
/// grew past the IP length field, which wrapped, and the kernel dropped the whole
/// super-packet without an error (a TCP flow stalled until its sender's timeout).
/// `Vec::with_capacity` gives exactly this room.
const HEAD_ROOM: usize = 2 * VIRTIO_NET_HDR_LEN + u16::MAX as usize;
/// Receive slots with GRO: up to 64 coalesced datagrams each.
const RX_SLOTS_GRO: usize = 16;
const GRO_SLOT: usize = 65536;

/// RX's write buffers. TUN GRO appends a flow's later packets to an earlier one only
/// when that buffer has room for the whole super-packet (~64 KiB); giving every packet
/// slot that much made each RX thread keep 8 MiB resident (every slot is a head some
/// time). So every slot holds one packet, and before a write each packet GRO will
/// make a head — the first of its flow with data, or the first after the flow's
/// super-packet filled up or ended with a short or PSH segment — moves into one of a
/// few large buffers (one packet copied per ~45); after the write they come back. A
/// head that did not get one is written without what would have followed it.
struct Coalescer {
    bufs: Vec<Vec<u8>>,
    /// Large buffers not in `bufs`.
    big: Vec<Vec<u8>>,
    /// Small buffers whose slots a large one holds for the write.
    small: Vec<Vec<u8>>,
    big_cap: usize,
    /// The flows of the batch being written and their current head.
    flows: Vec<Head>,
}

/// A flow's current head while [`Coalescer::promote`] walks a batch.
struct Head {
    key: u64,
    /// IP length of the super-packet so far.
    len: usize,
    /// Payload of its first segment: GRO takes only segments of this size, the last
    /// one possibly shorter.
    segment: usize,
    /// A short or PSH segment ended it.
    ended: bool,
}

impl Coalescer {
    /// Slots of `small_cap` bytes; heads of `big_cap` (at most [`HEAD_ROOM`]).
    fn new(small_cap: usize, big_cap: usize) -> Self {
        assert!(big_cap <= HEAD_ROOM, "a GRO head with room past the IP length limit");
        Self {
            bufs: (0..RX_COALESCE).map(|_| Vec::with_capacity(small_cap)).collect(),
            big: Vec::new(),
            small: Vec::new(),
            big_cap,
            flows: Vec::with_capacity(RX_HEADS),
        }
    }

    /// Moves each packet among `bufs[..n]` that GRO will use as a head into a large
    /// buffer (at most [`RX_HEADS`]).
    fn promote(&mut self, n: usize) {
        self.flows.clear();
        let limit = self.big_cap - 2 * VIRTIO_NET_HDR_LEN;
        let mut heads = 0;
        for i in 0..n {
            let Some(f) = flow(&self.bufs[i][VIRTIO_NET_HDR_LEN..]) else { continue };
            let at = self.flows.iter().position(|h| h.key == f.key);
            if let Some(h) = at.map(|j| &mut self.flows[j])
                && !h.ended
                && f.payload <= h.segment
                && h.len + f.payload <= limit
            {
                h.len += f.payload;
                h.ended = f.psh || f.payload < h.segment;
                continue;
            }
            if heads == RX_HEADS {
                continue;
            }
            heads += 1;
            let head = Head { key: f.key, len: f.len, segment: f.payload, ended: f.psh };
            match at {
                Some(j) => self.flows[j] = head,
                None => self.flows.push(head),
            }
            let mut big = self.big.pop().unwrap_or_else(|| Vec::with_capacity(self.big_cap));
            big.clear();
            big.extend_from_slice(&self.bufs[i]);
            self.small.push(std::mem::replace(&mut self.bufs[i], big));
        }
    }

    /// Takes the large buffers back from `bufs[..n]` (GRO may have moved them between
    /// slots).
    fn demote(&mut self, n: usize) {
        if self.small.is_empty() {
            return;
        }
        for b in &mut self.bufs[..n] {
            if b.capacity() >= self.big_cap {
                let Some(small) = self.small.pop() else { break };
                self.big.push(std::mem::replace(b, small));
            }
        }
    }
}

/// What [`Coalescer::promote`] needs of a packet.
struct Flow {
    /// Hash of the 5-tuple.
    key: u64,
    /// IP length.
    len: usize,
    /// Data bytes.
    payload: usize,
    /// TCP PSH set.
    psh: bool,
}

/// The transport layer of a TCP or UDP packet (IPv4, or IPv6 without extension
/// headers), read from `ip`, which holds exactly the packet.
struct Layer4<'a> {
    proto: u8,
    /// Source and destination addresses.
    addrs: &'a [u8],
    /// The transport header and what follows it.
    bytes: &'a [u8],
    /// Length of the transport header.
    header: usize,
    /// TCP PSH set.
    psh: bool,
}

fn layer4(ip: &[u8]) -> Option<Layer4<'_>> {
    let (proto, addrs, bytes) = match ip.first()? >> 4 {
        4 if ip.len() >= 20 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            (ip[9], &ip[12..20], ip.get(ihl..)?)
        }
        6 if ip.len() >= 40 => (ip[6], &ip[8..40], &ip[40..]),
        _ => return None,
    };
    let (header, psh) = match proto {
        6 => (usize::from(bytes.get(12)? >> 4) * 4, bytes.get(13)? & 0x08 != 0),
        17 => (8, false),
        _ => return None,
    };
    Some(Layer4 { proto, addrs, bytes, header, psh })
}

/// The flow of a TCP or UDP packet that carries data (IPv4, or IPv6 without
/// extension headers: what TUN GRO coalesces); `None` for anything GRO leaves alone.
fn flow(ip: &[u8]) -> Option<Flow> {
    use std::hash::{Hash, Hasher};
    let l = layer4(ip)?;
    if l.bytes.len() <= l.header {
        return None;
    }
    let mut h = rustc_hash::FxHasher::default();
    (l.proto, l.addrs, l.bytes.get(..4)?).hash(&mut h);
    Some(Flow { key: h.finish(), len: ip.len(), payload: l.bytes.len() - l.header, psh: l.psh })
}

/// UDP -> TUN.
pub struct Rx {
    slab: Vec<u8>,
    slot: usize,
    metas: Vec<RecvMeta>,
    coal: Coalescer,
    gro: GROTable,
    pending: usize,
    /// Relayed frames to forward, as offsets into the slab.
    fwd: Vec<Outgoing>,
    vnet_hdr: bool,
}

impl Rx {
    /// Allocates the thread's buffers once.
    pub fn new(cfg: PipelineConfig) -> Self {
        let (slot, slots) = if cfg.udp_gro {
            (GRO_SLOT, RX_SLOTS_GRO)
        } else {
            ((DATA_HEADER_LEN + usize::from(cfg.mtu) + TAG_LEN + 64).max(2048), RX_SLOTS)
        };
        Self {
            slab: vec![0u8; slot * slots],
            slot,
            metas: vec![RecvMeta::default(); slots],
            coal: Coalescer::new(VIRTIO_NET_HDR_LEN + usize::from(cfg.mtu) + 64, HEAD_ROOM),
            gro: GROTable::default(),
            pending: 0,
            fwd: Vec::with_capacity(MAX_BATCH),
            vnet_hdr: cfg.offload,
        }
    }

    fn run(mut self, dev: &Device, mut egress: Egress, shared: &Shared, stats: &PipelineStats) {
        let mut writer = DevOut::new(dev, &shared.offload, self.vnet_hdr);
        while !shared.stop.load(Relaxed) {
            let n = match udp::recv_batch(egress.udp(), &mut self.slab, self.slot, &mut self.metas) {
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
            stats.rx_batches.fetch_add(1, Relaxed);
            self.process(&routes, shared, stats, n, now_ms(shared.epoch), &mut writer);
            self.forward(&mut egress, stats);
        }
    }

    /// The links RX loop: batches received by the connections, copied into the slab
    /// (one frame per slot) and processed like UDP datagrams. Frames larger than a
    /// slot (GSO records) are handled where they lie, in order with the rest.
    fn run_links(
        mut self,
        shard: usize,
        dev: &Device,
        inbound: &mpsc::Receiver<Inbound>,
        mut egress: Egress,
        shared: &Shared,
        stats: &PipelineStats,
    ) {
        let mut writer = DevOut::new(dev, &shared.offload, self.vnet_hdr);
        while !shared.stop.load(Relaxed) {
            let first = match inbound.recv_timeout(Duration::from_millis(500)) {
                Ok(b) => b,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            // Fill the slots from this batch and whatever else is already waiting
            // (a bounded number of batches, so that `stop` is seen under load).
            let mut n = 0;
            let mut next = Some(first);
            let mut taken = 0;
            while let Some(mut b) = next.take() {
                taken += 1;
                let mut at = 0;
                while at < b.batch.len() {
                    let Some(Ok(r)) = frame::first(&b.batch[at..]) else {
                        stats.drops.add(DropReason::Malformed, 1);
                        break;
                    };
                    let (start, end) = (at + r.start, at + r.end);
                    at = end;
                    if end - start > self.slot {
                        if n > 0 {
                            self.flush_links(n, shared, stats, &mut writer, &mut egress);
                            n = 0;
                        }
                        let routes = shared.routes.load();
                        let now = now_ms(shared.epoch);
                        let big = &mut b.batch[start..end];
                        self.process_big(&routes, shared, stats, b.from, big, now, &mut writer, Some(&mut egress));
                        continue;
                    }
                    if n == self.metas.len() {
                        self.flush_links(n, shared, stats, &mut writer, &mut egress);
                        n = 0;
                    }
                    let len = end - start;
                    let slot = n * self.slot;
                    self.slab[slot..slot + len].copy_from_slice(&b.batch[start..end]);
                    self.metas[n] = RecvMeta { from: b.from, len, stride: len, truncated: false };
                    n += 1;
                }
                // The slots hold copies; big frames are done with: the buffer can go.
                egress.links().done(shard, b.batch);
                if n < self.metas.len() && taken < LINKS_BATCHES_PER_ROUND {
                    next = inbound.try_recv().ok();
                }
            }
            if n > 0 {
                self.flush_links(n, shared, stats, &mut writer, &mut egress);
            }
        }
    }

    fn flush_links(
        &mut self,
        n: usize,
        shared: &Shared,
        stats: &PipelineStats,
        writer: &mut impl TunWriter,
        egress: &mut Egress,
    ) {
        let routes = shared.routes.load();
        stats.rx_batches.fetch_add(1, Relaxed);
        self.process(&routes, shared, stats, n, now_ms(shared.epoch), writer);
        self.forward(egress, stats);
    }

    /// Handles one message larger than a slot where it lies: only a GSO record is that
    /// large. One for us is opened and written; one for someone else is forwarded
    /// when the next hop is a reliable connection too (a UDP or QUIC hop cannot carry
    /// it: dropped as [`DropReason::LinkSend`]); a plain packet over our MTU is
    /// malformed. Returns where a forwarded one goes (tests).
    #[allow(clippy::too_many_arguments)]
    pub fn process_big(
        &mut self,
        routes: &RouteSnapshot,
        shared: &Shared,
        stats: &PipelineStats,
        from: Endpoint,
        data: &mut [u8],
        now: u64,
        out: &mut impl TunWriter,
        egress: Option<&mut Egress>,
    ) -> Option<Endpoint> {
        match classify(routes, shared, stats, from, data, now) {
            Got::Packet { session, at, len, gso: true } => {
                if let Some((packets, bytes)) =
                    deliver_super(out, &mut self.gro, &mut self.coal.bufs, &mut data[at..at + len], stats)
                {
                    session.stats.add_rx(packets, bytes);
                    stats.rx_packets.fetch_add(packets, Relaxed);
                    stats.rx_bytes.fetch_add(bytes, Relaxed);
                }
            }
            Got::Packet { session, .. } => session.stats.drops.add(DropReason::Malformed, 1),
            Got::Forward(to) if to.proto.is_stream() => {
                if let Some(egress) = egress {
                    egress.send(&[&*data], &[Outgoing { buf: 0, start: 0, len: data.len(), to }]).count(&stats.drops);
                }
                return Some(to);
            }
            Got::Forward(_) => stats.drops.add(DropReason::LinkSend, 1),
            Got::Nothing => {}
        }
        None
    }

    fn forward(&mut self, egress: &mut Egress, stats: &PipelineStats) {
        if !self.fwd.is_empty() {
            egress.send(&[&self.slab[..]], &self.fwd).count(&stats.drops);
        }
    }

    /// Handles `n` received messages already in the slab at `now` (milliseconds on the
    /// sessions' clock), writing the packets that pass to `out`.
    pub fn process(
        &mut self,
        routes: &RouteSnapshot,
        shared: &Shared,
        stats: &PipelineStats,
        n: usize,
        now: u64,
        out: &mut impl TunWriter,
    ) {
        let mut tally = Tally::new();
        let (mut packets, mut bytes) = (0u64, 0u64);
        self.fwd.clear();
        for i in 0..n {
            let meta = self.metas[i];
            if meta.truncated || meta.len == 0 {
                stats.drops.add(DropReason::Malformed, 1);
                continue;
            }
            let base = i * self.slot;
            let stride = meta.stride.max(1);
            let mut off = 0;
            while off < meta.len {
                let seg = stride.min(meta.len - off);
                let start = base + off;
                off += seg;
                let (session, at, len) =
                    match classify(routes, shared, stats, meta.from, &mut self.slab[start..start + seg], now) {
                        Got::Packet { session, at, len, gso: false } => (session, start + at, len),
                        Got::Packet { session, at, len, gso: true } => {
                            // In order: what is pending goes first.
                            if self.pending > 0 {
                                self.write(stats, out);
                            }
                            let pkt = &mut self.slab[start + at..start + at + len];
                            if let Some((p, b)) = deliver_super(out, &mut self.gro, &mut self.coal.bufs, pkt, stats) {
                                packets += p;
                                bytes += b;
                                tally.add_n(session, p, b, true, now);
                            }
                            continue;
                        }
                        Got::Forward(to) => {
                            self.fwd.push(Outgoing { buf: 0, start, len: seg, to });
                            continue;
                        }
                        Got::Nothing => continue,
                    };
                let plain = &self.slab[at..at + len];
                let buf = &mut self.coal.bufs[self.pending];
                buf.clear();
                buf.resize(VIRTIO_NET_HDR_LEN, 0);
                buf.extend_from_slice(plain);
                self.pending += 1;
                packets += 1;
                bytes += len as u64;
                tally.add(session, len, true, now);
                if self.pending == self.coal.bufs.len() {
                    self.write(stats, out);
                }
            }
        }
        tally.flush(true, now);
        if self.pending > 0 {
            self.write(stats, out);
        }
        stats.rx_packets.fetch_add(packets, Relaxed);
        stats.rx_bytes.fetch_add(bytes, Relaxed);
    }

    /// Writes the pending packets, coalescing each flow into a large buffer (TUN
    /// offload only: nothing else coalesces).
    fn write(&mut self, stats: &PipelineStats, out: &mut impl TunWriter) {
        let n = std::mem::take(&mut self.pending);
        if self.vnet_hdr {
            self.coal.promote(n);
        }
        if let Err(e) = out.write_batch(&mut self.gro, &mut self.coal.bufs[..n]) {
            debug!(error = %e, "TUN write failed");
            stats.drops.add(DropReason::Tun, 1);
        }
        self.coal.demote(n);
    }

    /// Relayed frames the last [`Rx::process`] would forward: (destination, frame).
    pub fn forwarded(&self) -> impl Iterator<Item = (Endpoint, &[u8])> {
        self.fwd.iter().map(|o| (o.to, &self.slab[o.start..o.start + o.len]))
    }

    /// The slab and metadata, for feeding datagrams without a socket (tests, benches).
    pub fn slab(&mut self) -> (&mut [u8], usize, &mut [RecvMeta]) {
        (&mut self.slab, self.slot, &mut self.metas)
    }
}

/// Batches the links RX takes from its queue before it looks at `stop` again.
const LINKS_BATCHES_PER_ROUND: usize = 64;

/// What became of one received message.
enum Got<'r> {
    /// Opened: the plaintext is at `at..at + len` of the message; `gso` when it is a
    /// super-packet (virtio header first).
    Packet { session: &'r Arc<Session>, at: usize, len: usize, gso: bool },
    /// A relayed frame for someone else (hop limit already decremented).
    Forward(Endpoint),
    /// Handed to the control plane, a keepalive, or dropped and counted.
    Nothing,
}

/// Relay header, then authentication and checks: see [`relay_or_local`], [`open`].
fn classify<'r>(
    routes: &'r RouteSnapshot,
    shared: &Shared,
    stats: &PipelineStats,
    from: Endpoint,
    data: &mut [u8],
    now: u64,
) -> Got<'r> {
    match relay_or_local(routes, stats, from, data) {
        Hop::Local(skip, via) => match open(routes, shared, stats, from, via, &mut data[skip..], now) {
            Some((session, len, gso)) => Got::Packet { session, at: skip + DATA_HEADER_LEN, len, gso },
            None => Got::Nothing,
        },
        Hop::Forward(to) => Got::Forward(to),
        Hop::Drop => Got::Nothing,
    }
}

/// Writes a super-packet; returns the packets and bytes delivered, or `None` (counted).
fn deliver_super(
    out: &mut impl TunWriter,
    gro: &mut GROTable,
    scratch: &mut [Vec<u8>],
    pkt: &mut [u8],
    stats: &PipelineStats,
) -> Option<(u64, u64)> {
    let bytes = pkt.len().saturating_sub(VIRTIO_NET_HDR_LEN) as u64;
    match out.write_super(gro, pkt, scratch) {
        Ok(n) => {
            stats.rx_gso_records.fetch_add(1, Relaxed);
            Some((n as u64, bytes))
        }
        Err(e) => {
            debug!(error = %e, "super-packet not delivered");
            let reason = if e.kind() == io::ErrorKind::InvalidData { DropReason::Malformed } else { DropReason::Tun };
            stats.drops.add(reason, 1);
            None
        }
    }
}

enum Hop {
    /// For us: the inner datagram starts at this offset; relayed by this node.
    Local(usize, Option<[u8; 8]>),
    /// A relayed frame for someone else, hop limit already decremented.
    Forward(Endpoint),
    /// Dropped and counted.
    Drop,
}

/// Unwraps a relay header addressed to us, or decides where a frame for someone else
/// goes. Relayed frames are accepted only from direct neighbours' current endpoints
/// (where their authenticated packets arrive), and forwarded with at most
/// [`MAX_HOPS`] hops left.
fn relay_or_local(routes: &RouteSnapshot, stats: &PipelineStats, from: Endpoint, data: &mut [u8]) -> Hop {
    if MessageType::of(data) != Some(MessageType::Relay) {
        return Hop::Local(0, None);
    }
    if !routes.is_neighbour(&from) {
        stats.drops.add(DropReason::RelayRefused, 1);
        return Hop::Drop;
    }
    match relay_rule(routes, data) {
        Ok(RelayTo::Us(src)) => Hop::Local(RELAY_HEADER_LEN, Some(src)),
        Ok(RelayTo::Next(next)) => {
            take_hop(&mut data[1]);
            Hop::Forward(next)
        }
        Err(reason) => {
            stats.drops.add(reason, 1);
            Hop::Drop
        }
    }
}

/// Where a relayed frame from a direct neighbour goes.
enum RelayTo {
    /// Unwrapped here: the end-to-end sender.
    Us([u8; 8]),
    /// On to this next hop.
    Next(Endpoint),
}

/// The relay rules for `data`, a `RELAY` frame from a direct neighbour (both checked
/// by the caller); reads, never changes. Shared by the links RX path
/// ([`relay_or_local`]) and the readers' [`StreamRelay`].
fn relay_rule(routes: &RouteSnapshot, data: &[u8]) -> Result<RelayTo, DropReason> {
    let h = RelayHeader::parse(data).map_err(|_| DropReason::Malformed)?;
    if &h.dst == routes.local() {
        // A relay inside a relay is never produced by a correct node.
        if MessageType::of(&data[RELAY_HEADER_LEN..]) == Some(MessageType::Relay) {
            return Err(DropReason::Malformed);
        }
        return Ok(RelayTo::Us(h.src));
    }
    if h.hop_limit == 0 {
        return Err(DropReason::HopLimit);
    }
    routes.next_hop(&h.dst).map(RelayTo::Next).ok_or(DropReason::NoRoute)
}

/// Relays frames from the connections' readers ([`Forward`], set on the node's
/// [`Links`]): every relayed frame whose next hop is a stream connection goes to that
/// connection's queue from the reader, without a trip through a links RX thread and
/// back (those two thread hand-offs per batch were most of a WebSocket relay's cost,
/// bench/RESULTS.md §22). A batch of nothing else (the common case on a relay) goes in
/// the same buffer; in a mixed batch the relayed frames are copied out, in runs per
/// next hop, and the rest stays, in order, for the links RX thread. The rules are
/// `relay_or_local`'s, frame by frame, so a frame takes the same way whatever else
/// shares its batch: a flow is never reordered by it.
pub struct StreamRelay {
    routes: Arc<ArcSwap<RouteSnapshot>>,
    stats: Arc<PipelineStats>,
}

impl StreamRelay {
    /// A relay on the current route snapshot in `routes`, counting what it cannot
    /// send in `stats`.
    pub fn new(routes: Arc<ArcSwap<RouteSnapshot>>, stats: Arc<PipelineStats>) -> Self {
        Self { routes, stats }
    }

    /// Queues `batch` (`frames` relayed frames) on the connection to `to`.
    fn send(&self, links: &Links, to: Endpoint, batch: Vec<u8>, frames: usize) {
        if matches!(links.send(to, batch), Ok(true)) {
            links.counters.relayed_batches.fetch_add(1, Relaxed);
        } else {
            self.stats.drops.add(DropReason::LinkSend, frames as u64);
        }
    }
}

impl Forward for StreamRelay {
    fn forward(&self, links: &Links, from: Endpoint, mut batch: Vec<u8>) -> Option<Vec<u8>> {
        let routes = self.routes.load();
        if !routes.is_neighbour(&from) {
            return Some(batch);
        }
        // Where each frame goes: all to one stream next hop, none, or some.
        let (mut one, mut relayed, mut all) = (None, 0usize, true);
        let mut at = 0;
        while let Some(Ok(r)) = frame::first(&batch[at..]) {
            match stream_next_hop(&routes, &batch[at + r.start..at + r.end]) {
                Some(next) if one.is_none_or(|o| o == next) => {
                    one = Some(next);
                    relayed += 1;
                }
                Some(_) => {
                    relayed += 1;
                    all = false;
                }
                None => all = false,
            }
            at += r.end;
        }
        if relayed == 0 {
            return Some(batch);
        }
        if let (true, true, Some(to)) = (all, at == batch.len(), one) {
            let mut at = 0;
            while let Some(Ok(r)) = frame::first(&batch[at..]) {
                take_hop(&mut batch[at + r.start + 1]);
                at += r.end;
            }
            self.send(links, to, batch, relayed);
            return None;
        }
        // Mixed: relayed frames leave in runs per next hop; the rest moves up, in order.
        let (mut keep, mut at) = (0, 0);
        let mut run: Option<(Endpoint, Vec<u8>, usize)> = None;
        while let Some(Ok(r)) = frame::first(&batch[at..]) {
            let (record, data) = (at..at + r.end, at + r.start..at + r.end);
            at += r.end;
            let Some(next) = stream_next_hop(&routes, &batch[data.clone()]) else {
                batch.copy_within(record.clone(), keep);
                keep += record.len();
                continue;
            };
            take_hop(&mut batch[data.start + 1]);
            if run.as_ref().is_some_and(|(to, _, _)| *to != next)
                && let Some((to, b, n)) = run.take()
            {
                self.send(links, to, b, n);
            }
            let (_, b, n) = run.get_or_insert_with(|| (next, links.buffer(), 0));
            frame::push(b, &batch[data]);
            *n += 1;
        }
        if let Some((to, b, n)) = run {
            self.send(links, to, b, n);
        }
        // What does not parse stays too, for the links RX thread to count.
        let tail = batch.len() - at;
        batch.copy_within(at.., keep);
        batch.truncate(keep + tail);
        if batch.is_empty() {
            links.recycle(batch);
            return None;
        }
        Some(batch)
    }
}

/// Takes one hop from a relayed frame's hop limit (checked above zero before), after
/// clamping it to [`MAX_HOPS`]: a sender may start a frame with any hop limit, but no
/// frame crosses more than MAX_HOPS relays, so a member cannot make one circle the
/// mesh for long.
fn take_hop(hop_limit: &mut u8) {
    *hop_limit = (*hop_limit).min(MAX_HOPS) - 1;
}

/// Where [`relay_or_local`] would forward frame `data` (from a direct neighbour), when
/// that is a stream connection; `None` for anything else. Reads, never changes.
fn stream_next_hop(routes: &RouteSnapshot, data: &[u8]) -> Option<Endpoint> {
    if MessageType::of(data) != Some(MessageType::Relay) {
        return None;
    }
    match relay_rule(routes, data) {
        Ok(RelayTo::Next(next)) if next.proto.is_stream() => Some(next),
        _ => None,
    }
}

/// Classifies, authenticates and checks one datagram. Returns the session it belongs
/// to, the plaintext length (plaintext at `data[16..]`) and whether it is a GSO
/// super-packet, for a packet to deliver; `None` for anything else (handed to the
/// control plane, a keepalive, or a drop).
fn open<'r>(
    routes: &'r RouteSnapshot,
    shared: &Shared,
    stats: &PipelineStats,
    from: Endpoint,
    via: Option<[u8; 8]>,
    data: &mut [u8],
    now: u64,
) -> Option<(&'r Arc<Session>, usize, bool)> {
    match MessageType::of(data) {
        Some(MessageType::Data) => {}
        Some(_) => {
            // Only members can MAC a handshake: outsiders never reach the queue.
            if shared.macs.check(data).is_none() {
                stats.drops.add(DropReason::HandshakeMac, 1);
                return None;
            }
            let ev = ControlEvent::Datagram { from, via, bytes: data.to_vec() };
            if !shared.control.try_push(ev) {
                stats.drops.add(DropReason::ControlQueueFull, 1);
            }
            return None;
        }
        None => {
            stats.drops.add(DropReason::Malformed, 1);
            return None;
        }
    }
    let Ok(hdr) = DataHeader::parse(data) else {
        stats.drops.add(DropReason::Malformed, 1);
        return None;
    };
    let Some(session) = routes.session_by_index(hdr.receiver_index) else {
        stats.drops.add(DropReason::UnknownSession, 1);
        return None;
    };
    if session.is_expired(now) {
        session.stats.drops.add(DropReason::KeyExpired, 1);
        return None;
    }
    let len = match session.open(&hdr, data) {
        Ok(len) => len,
        Err(reason) => {
            session.stats.drops.add(reason, 1);
            return None;
        }
    };
    session.touch_rx(now);
    if !session.is_confirmed()
        && session.confirm()
        && !shared.control.try_push(ControlEvent::Confirmed { local_index: session.local_index })
    {
        // The next authenticated packet tries again: a lost confirmation would
        // strand the session as held.
        session.unconfirm();
        stats.drops.add(DropReason::ControlQueueFull, 1);
    }
    if via.is_none() {
        session.touch_direct(now);
        if session.should_report_roam(now, &from)
            && !shared.control.try_push(ControlEvent::Direct { local_index: session.local_index, from })
        {
            stats.drops.add(DropReason::ControlQueueFull, 1);
        }
    }
    if hdr.flags & FLAG_CONTROL != 0 {
        let bytes = data[DATA_HEADER_LEN..DATA_HEADER_LEN + len].to_vec();
        if !shared.control.try_push(ControlEvent::Message { local_index: session.local_index, bytes }) {
            stats.drops.add(DropReason::ControlQueueFull, 1);
        }
        return None;
    }
    if len == 0 {
        return None; // keepalive
    }
    let gso = hdr.flags & FLAG_GSO != 0;
    let ip = if gso { DATA_HEADER_LEN + VIRTIO_NET_HDR_LEN } else { DATA_HEADER_LEN };
    match data.get(ip..DATA_HEADER_LEN + len).and_then(ip_addrs) {
        Some((src, dst)) if routes.may_send_from(session, src) => {
            if routes.delivers_to(dst) {
                Some((session, len, gso))
            } else {
                session.stats.drops.add(DropReason::ForbiddenDestination, 1);
                None
            }
        }
        Some(_) => {
            session.stats.drops.add(DropReason::Spoofed, 1);
            None
        }
        None => {
            session.stats.drops.add(DropReason::NotIp, 1);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 TCP segment with `data` bytes of payload from source port `port`.
    fn tcp(port: u16, data: usize) -> Vec<u8> {
        let mut b = vec![0u8; VIRTIO_NET_HDR_LEN + 40 + data];
        let ip = &mut b[VIRTIO_NET_HDR_LEN..];
        ip[0] = 0x45;
        ip[9] = 6;
        ip[20..22].copy_from_slice(&port.to_be_bytes());
        ip[32] = 5 << 4;
        b
    }

    #[test]
    fn tcp_in_order_is_told_from_bare_acks_other_protocols_and_cut_packets() {
        let v4 = |data: usize| tcp(1, data)[VIRTIO_NET_HDR_LEN..].to_vec();
        assert!(tcp_in_order(&v4(1)));
        assert!(!tcp_in_order(&v4(0)), "a bare ACK");
        for (flag, what) in [(0x01, "FIN"), (0x02, "SYN"), (0x04, "RST")] {
            let mut p = v4(0);
            p[33] = 0x10 | flag;
            assert!(tcp_in_order(&p), "{what} without data");
        }
        let mut udp = v4(10);
        udp[9] = 17;
        assert!(!tcp_in_order(&udp));
        assert!(!tcp_in_order(&v4(10)[..30]), "cut inside the TCP header");
        assert!(!tcp_in_order(&[]));
        // IPv6: next header 6, the TCP header at 40.
        let mut v6 = vec![0u8; 40 + 20 + 5];
        v6[0] = 0x60;
        v6[6] = 6;
        v6[52] = 5 << 4;
        assert!(tcp_in_order(&v6));
        assert!(!tcp_in_order(&v6[..60]), "no payload");
        v6[52] = 10 << 4;
        assert!(!tcp_in_order(&v6), "options fill what followed the header");
    }

    #[test]
    fn each_flow_with_data_gets_one_large_buffer_for_the_write_and_gives_it_back() {
        let mut c = Coalescer::new(1500, 65_000);
        let batch = [tcp(1, 100), tcp(2, 100), tcp(1, 100), tcp(3, 0), tcp(2, 100), tcp(4, 100)];
        for (b, p) in c.bufs.iter_mut().zip(&batch) {
            b.clone_from(p);
        }
        c.promote(batch.len());
        let big: Vec<usize> = (0..batch.len()).filter(|&i| c.bufs[i].capacity() >= 65_000).collect();
        assert_eq!(big, [0, 1, 5], "first packet of each flow with data (port 3 is a bare ACK)");
        assert!(c.bufs.iter().zip(&batch).all(|(b, p)| b == p), "contents unchanged");
        // GRO may move a head to another slot.
        c.bufs.swap(0, 2);
        c.demote(batch.len());
        assert!(c.bufs.iter().all(|b| b.capacity() < 65_000));
        assert_eq!((c.big.len(), c.small.len()), (3, 0));
        // The next write reuses them.
        c.promote(batch.len());
        assert_eq!(c.big.len(), 0);
        // One flow of 120 full segments: a new head whenever the last one holds 64 KiB
        // (47 segments of 1380 bytes); a PSH segment ends one too.
        let mut c = Coalescer::new(1500, HEAD_ROOM);
        for (i, b) in c.bufs.iter_mut().enumerate().take(120) {
            *b = tcp(9, 1380);
            if i == 100 {
                b[VIRTIO_NET_HDR_LEN + 33] = 0x18;
            }
        }
        c.promote(120);
        let heads: Vec<usize> = (0..120).filter(|&i| c.bufs[i].capacity() > 60_000).collect();
        assert_eq!(heads, [0, 47, 94, 101]);
        c.demote(120);
        assert!(flow(&[0x45; 10]).is_none(), "short");
        assert!(flow(&tcp(1, 0)[VIRTIO_NET_HDR_LEN..]).is_none(), "no data");
    }
}
