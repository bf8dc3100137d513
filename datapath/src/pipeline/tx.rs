//! The TX half of a pipeline: TUN (or stack) -> split -> route lookup -> seal -> UDP or a
//! connection, a batch at a time.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;

use tracing::{debug, warn};
use tun_rs::{IDEAL_BATCH_SIZE, SyncDevice, VIRTIO_NET_HDR_LEN};

use super::coalesce::layer4;
use super::device::Device;
use super::{ControlEvent, PipelineConfig, PipelineStats, QUIC_INNER_MAX, Shared, TX_HEADROOM, Tally, now_ms};
use crate::gso;
use crate::transport::Outgoing;
use crate::transport::{Egress, Endpoint, Lane, Proto, frame};
use weft_core::crypto::TAG_LEN;
use weft_core::firewall::Firewall;
use weft_core::queue::FlowLoad;
use weft_core::route::{Lookup, RouteSnapshot};
use weft_core::stats::{DropCounters, DropReason};
use weft_core::wire::{FLAG_GSO, FLAG_ORDERED, FLAG_SPARSE, RELAY_HEADER_LEN, ip_addrs};

/// TUN -> UDP.
pub struct Tx {
    /// With offload: what the TUN returned (virtio header and a packet of up to
    /// 64 KiB) at [`TX_HEADROOM`], split from here or sealed here whole.
    pub(super) original: Vec<u8>,
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) sizes: Vec<usize>,
    pub(super) out: Vec<Outgoing>,
    /// Plaintext bytes of the datagrams in `out`.
    pub(super) sent_bytes: u64,
    /// Packets of the last batch for members without a session (the slow path: at
    /// most a few per member and snapshot, see [`weft_core::route::Demand`]).
    pub(super) unrouted: Vec<(std::net::IpAddr, Vec<u8>)>,
    /// The access policy's connection table: what this node sends may be answered.
    pub(super) firewall: Option<std::sync::Arc<Firewall>>,
    /// Each flow's rate, for packets to a connection: a sparse flow's take the lane
    /// its queue empties first ([`Lane::Sparse`]).
    pub(super) load: FlowLoad,
    /// An RX thread's answers ([`super::answer`]): a TCP segment it read belongs to a
    /// flow the TX thread may be sending too (the kernel sends data inside a write only
    /// for a flow with data waiting), so it takes the bulk lane and is never flagged.
    pub(super) answering: bool,
    /// Set when an answering `Tx` sealed such a TCP segment (the caller clears it).
    pub(super) answered_tcp_data: bool,
    /// ICMP "fragmentation needed" / ICMPv6 "packet too big" for packets of the last
    /// batch larger than their path carries, to write back to the device.
    pub(super) too_big: Vec<Vec<u8>>,
}

/// Most "too big" answers per batch (a super-packet split into many oversized
/// segments needs one: the sender's kernel lowers the path MTU of that destination).
const MAX_TOO_BIG: usize = 4;

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
            firewall: None,
            load: FlowLoad::default(),
            answering: false,
            answered_tcp_data: false,
            too_big: Vec::new(),
        }
    }

    /// Whether this thread reads the TUN's super-packets (TUN offload): only then is
    /// there a buffer for them.
    pub(super) fn reads_super_packets(&self) -> bool {
        !self.original.is_empty()
    }

    pub(super) fn run(self, dev: &Device, egress: Egress, shared: &Shared, stats: &PipelineStats) {
        match dev {
            Device::Tun(tun) => self.run_tun(tun, egress, shared, stats),
            Device::User(port) => {
                let Ok(outbound) = port.outbound.lock() else { return };
                self.run_user(dev, &outbound, egress, shared, stats);
            }
        }
    }

    pub(super) fn run_user(
        mut self,
        dev: &Device,
        outbound: &mpsc::Receiver<Vec<u8>>,
        mut egress: Egress,
        shared: &Shared,
        stats: &PipelineStats,
    ) {
        self.firewall = Some(shared.firewall.clone());
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
            if let Device::User(port) = dev {
                for p in self.too_big.drain(..) {
                    (port.deliver)(&p);
                }
            }
        }
    }

    pub(super) fn send(&mut self, n: usize, egress: &mut Egress, shared: &Shared, stats: &PipelineStats) {
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

    pub(super) fn run_tun(mut self, tun: &SyncDevice, mut egress: Egress, shared: &Shared, stats: &PipelineStats) {
        self.firewall = Some(shared.firewall.clone());
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
            // The senders of packets too big for their path learn the size it takes.
            let vnet = self.reads_super_packets();
            for p in self.too_big.drain(..) {
                let written = if vnet {
                    let mut b = vec![0u8; VIRTIO_NET_HDR_LEN + p.len()];
                    b[VIRTIO_NET_HDR_LEN..].copy_from_slice(&p);
                    tun.send(&b)
                } else {
                    tun.send(&p)
                };
                if written.is_err() {
                    stats.drops.add(DropReason::Tun, 1);
                }
            }
        }
    }

    /// Reads from the TUN: returns how many packets to seal are in the buffers, or 0
    /// when what it read was a super-packet that went out whole.
    pub(super) fn read(
        &mut self,
        tun: &SyncDevice,
        egress: &mut Egress,
        shared: &Shared,
        stats: &PipelineStats,
    ) -> io::Result<usize> {
        self.read_with(|buf| tun.recv(buf), egress, shared, stats)
    }

    /// [`Tx::read`] with `read` taking one packet from the TUN into the buffer it is
    /// given (a virtio header first with offload).
    pub(super) fn read_with(
        &mut self,
        read: impl FnOnce(&mut [u8]) -> io::Result<usize>,
        egress: &mut Egress,
        shared: &Shared,
        stats: &PipelineStats,
    ) -> io::Result<usize> {
        if !self.reads_super_packets() {
            self.sizes[0] = read(&mut self.bufs[0][TX_HEADROOM..])?;
            return Ok(1);
        }
        let len = read(&mut self.original[TX_HEADROOM..])?;
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
        if let Some(fw) = &self.firewall {
            fw.outbound(&pkt[VIRTIO_NET_HDR_LEN..], now);
        }
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
        // Told from the inner headers in place, before sealing overwrites them.
        let inner = self.original.get(TX_HEADROOM + VIRTIO_NET_HDR_LEN..TX_HEADROOM + len).unwrap_or_default();
        let lane =
            if self.answering { Lane::Bulk } else { lane_of(&mut self.load, inner, len - VIRTIO_NET_HDR_LEN, now) };
        let sealed = s.seal_with_flags(&mut self.original[RELAY_HEADER_LEN..], len, FLAG_GSO)?;
        if let Some(h) = &route.relay
            && let Some(head) = self.original.first_chunk_mut::<RELAY_HEADER_LEN>()
        {
            h.emit(head);
        }
        let start = RELAY_HEADER_LEN - relay_len;
        self.out.clear();
        self.out.push(Outgoing { buf: 0, start, len: relay_len + sealed, to: route.target, lane, single: false });
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
        self.too_big.clear();
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
            if let Some(fw) = &self.firewall {
                fw.outbound(&buf[TX_HEADROOM..TX_HEADROOM + len], now);
            }
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
            // Over UDP, the path MTU the control plane measured: a larger packet is
            // answered with ICMP and dropped (IPv4 without DF goes as it is), and TCP
            // connections are told the segment size that fits (MSS).
            let mtu = if route.target.proto == Proto::Udp { usize::from(route.session.path_mtu()) } else { 0 };
            if mtu != 0 {
                if len > mtu
                    && let Some(answer) =
                        weft_core::wire::too_big_reply(&buf[TX_HEADROOM..TX_HEADROOM + len], mtu as u16)
                {
                    if self.too_big.len() < MAX_TOO_BIG {
                        self.too_big.push(answer);
                    }
                    route.session.stats.drops.add(DropReason::TooBig, 1);
                    continue;
                }
                weft_core::wire::clamp_mss(&mut buf[TX_HEADROOM..TX_HEADROOM + len], mtu);
            }
            let ip = &buf[TX_HEADROOM..TX_HEADROOM + len];
            let mut lane = lane_of(&mut self.load, ip, len, now);
            if self.answering && tcp_in_order(ip) {
                lane = Lane::Bulk;
                self.answered_tcp_data = true;
            }
            // A sparse flow's packet is flagged, on every transport: relays read the
            // flag to keep it ahead of the bulk they pass on, and over UDP the receiver
            // steers it to a socket the session's bulk does not use. A bare ACK is not
            // flagged: it answers a download, and the TUN on the other side steers the
            // download to the queue its ACKs arrive on.
            let mut flags = if lane == Lane::Sparse && !is_bare_ack(ip) { FLAG_SPARSE } else { 0 };
            if route.target.proto == Proto::Udp && flags == 0 {
                // Over UDP the lane is where the receiver reads it.
                lane = Lane::Bulk;
            }
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
            let single = route.session.gso_off();
            self.out.push(Outgoing {
                buf: i,
                start,
                len: RELAY_HEADER_LEN - start + sealed,
                to: route.target,
                lane,
                single,
            });
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

    /// The ICMP answers the last [`Tx::process`] made to packets too big for their
    /// path (the pipeline writes them back to the TUN after the batch).
    pub fn too_big_answers(&self) -> &[Vec<u8>] {
        &self.too_big
    }

    /// The datagrams of the last [`Tx::process`].
    pub fn outgoing(&self) -> (&[Vec<u8>], &[Outgoing]) {
        (&self.bufs, &self.out)
    }
}

/// The lane of a connection's send queue for inner packet `ip` (its headers at least;
/// `len` bytes in all, more for a super-packet) at `now` (ms): a sparse flow's packets
/// go first. Only packets to a connection are told apart: a UDP batch leaves in one
/// `sendmmsg`, with no queue of this node's to wait in.
fn lane_of(load: &mut FlowLoad, ip: &[u8], len: usize, now: u64) -> Lane {
    if load.add(ip, len, now) { Lane::Bulk } else { Lane::Sparse }
}

/// Whether super-packets to `route` go over QUIC as records: only straight to a peer
/// whose hello offers records there (a relay forwards records to stream hops only).
/// Then TCP segments that must keep their order go on the same stream
/// ([`FLAG_ORDERED`]).
pub(super) fn records_over_quic(route: &weft_core::route::Route) -> bool {
    let s = &route.session;
    route.target.proto == Proto::Quic && route.relay.is_none() && s.peer_gso() && s.peer_gso_quic()
}

/// Whether `ip` (exactly one packet) is a TCP segment that carries nothing but an
/// acknowledgement (no data, no SYN, FIN or RST).
pub(super) fn is_bare_ack(ip: &[u8]) -> bool {
    layer4(ip).is_some_and(|l| l.proto == 6) && !tcp_in_order(ip)
}

/// Whether `ip` (exactly one packet) is a TCP segment that must not overtake the
/// records ahead of it (IPv4, or IPv6 without extension headers): one with data, or
/// with SYN, FIN or RST. A bare acknowledgement may: its order does not matter to the
/// peer.
pub(super) fn tcp_in_order(ip: &[u8]) -> bool {
    const SYN_FIN_RST: u8 = 0x02 | 0x01 | 0x04;
    layer4(ip).is_some_and(|l| {
        l.proto == 6 && (l.bytes.len() > l.header || l.bytes.get(13).is_some_and(|f| f & SYN_FIN_RST != 0))
    })
}
