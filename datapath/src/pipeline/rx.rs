//! The RX half of a pipeline: UDP (or a connection's frames) -> classify -> replay check
//! and open -> source check -> coalesce -> TUN; handshakes go to the control plane.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::time::Duration;

use tracing::{debug, warn};
use tun_rs::{GROTable, VIRTIO_NET_HDR_LEN};

use super::answer::Answers;
use super::coalesce::{Coalescer, GRO_SLOT, HEAD_ROOM, RX_SLOTS, RX_SLOTS_GRO};
use super::device::{DevOut, Device, TunWriter};
use super::relay::{Hop, relay_or_local, relayed_lane};
use super::tx::is_bare_ack;
use super::{ControlEvent, PipelineConfig, PipelineStats, Shared, Tally, now_ms};
use crate::transport::Outgoing;
use crate::transport::udp::{self, MAX_BATCH, RecvMeta};
use crate::transport::{Egress, Endpoint, Inbound, frame};
use weft_core::crypto::TAG_LEN;
use weft_core::queue::{Codel, FlowLoad, sparse_first};
use weft_core::route::RouteSnapshot;
use weft_core::session::Session;
use weft_core::stats::DropReason;
use weft_core::wire::{DATA_HEADER_LEN, DataHeader, FLAG_CONTROL, FLAG_GSO, MessageType, ip_addrs};

/// UDP -> TUN.
pub struct Rx {
    pub(super) slab: Vec<u8>,
    pub(super) slot: usize,
    pub(super) metas: Vec<RecvMeta>,
    pub(super) coal: Coalescer,
    pub(super) gro: GROTable,
    pub(super) pending: usize,
    /// Relayed frames to forward, as offsets into the slab.
    pub(super) fwd: Vec<Outgoing>,
    pub(super) vnet_hdr: bool,
    /// Queue control on how long datagrams waited in the socket ([`weft_core::queue`]).
    pub(super) codel: Codel,
    /// Which inner flows are bulk.
    pub(super) load: FlowLoad,
    /// Whether each pending packet's flow is bulk (one per write buffer): sparse ones
    /// are written first.
    pub(super) pending_bulk: Vec<bool>,
    /// Whether the last batch wrote to the device, and whether a bulk flow's packet.
    pub(super) wrote: bool,
    pub(super) wrote_bulk: bool,
    /// Counts plain packets: every [`CHECKSUM_SAMPLE`]th has its checksum checked.
    pub(super) checked: u32,
}

/// One plain packet in this many has its TCP/UDP checksum checked on the way to the
/// TUN (about 5 ns a packet on average with SIMD): enough to see a sender whose TUN
/// offload corrupts what it hands over, which spoils every packet it touches.
const CHECKSUM_SAMPLE: u32 = 16;

impl Rx {
    /// Allocates the thread's buffers once.
    pub fn new(cfg: PipelineConfig) -> Self {
        let (slot, slots) = if cfg.udp_gro {
            (GRO_SLOT, RX_SLOTS_GRO)
        } else {
            ((DATA_HEADER_LEN + usize::from(cfg.mtu) + TAG_LEN + 64).max(2048), RX_SLOTS)
        };
        let coal = Coalescer::new(VIRTIO_NET_HDR_LEN + usize::from(cfg.mtu) + 64, HEAD_ROOM);
        Self {
            slab: vec![0u8; slot * slots],
            slot,
            metas: vec![RecvMeta::default(); slots],
            pending_bulk: vec![false; coal.bufs.len()],
            coal,
            gro: GROTable::default(),
            pending: 0,
            fwd: Vec::with_capacity(MAX_BATCH),
            vnet_hdr: cfg.offload,
            codel: Codel::default(),
            load: FlowLoad::default(),
            wrote: false,
            wrote_bulk: false,
            checked: 0,
        }
    }

    /// The UDP receive loop. With `answers`, what the kernel answered to a batch of
    /// sparse flows' packets while this thread wrote them is sent from here.
    pub(super) fn run(
        mut self,
        dev: &Device,
        mut egress: Egress,
        shared: &Shared,
        stats: &PipelineStats,
        mut answers: Option<Answers>,
    ) {
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
            drop(routes);
            let sparse = self.wrote_sparse_only();
            Self::answer(sparse, &mut answers, dev, &mut egress, shared, stats);
        }
    }

    /// After a batch that wrote only sparse flows' packets (`sparse`), sends what the
    /// kernel answered to them ([`Answers`]); forgets `answers` where the TUN cannot.
    fn answer(
        sparse: bool,
        answers: &mut Option<Answers>,
        dev: &Device,
        egress: &mut Egress,
        shared: &Shared,
        stats: &PipelineStats,
    ) {
        if let (Some(a), Device::Tun(q)) = (answers.as_mut(), dev)
            && sparse
            && !a.take(q, egress, shared, stats)
        {
            *answers = None;
        }
    }

    /// Whether the last batch wrote packets to the device, all of sparse flows and
    /// none a bare ACK (bulk, records and ACKs count as bulk).
    pub fn wrote_sparse_only(&self) -> bool {
        self.wrote && !self.wrote_bulk
    }

    /// The connection RX loop: batches received by the connections, copied into the slab
    /// (one frame per slot) and processed like UDP datagrams. Frames larger than a
    /// slot (GSO records) are handled where they lie, in order with the rest. With
    /// `answers`, as in [`Rx::run`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_connections(
        mut self,
        shard: usize,
        dev: &Device,
        inbound: &mpsc::Receiver<Inbound>,
        mut egress: Egress,
        shared: &Shared,
        stats: &PipelineStats,
        mut answers: Option<Answers>,
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
            // Whether an earlier write of this round carried bulk: no answers then.
            let mut bulk = false;
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
                            self.flush_connections(n, shared, stats, &mut writer, &mut egress);
                            bulk |= self.wrote_bulk;
                            n = 0;
                        }
                        let routes = shared.routes.load();
                        let now = now_ms(shared.epoch);
                        let big = &mut b.batch[start..end];
                        self.process_big(&routes, shared, stats, b.from, big, now, &mut writer, Some(&mut egress));
                        bulk |= self.wrote_bulk;
                        continue;
                    }
                    if n == self.metas.len() {
                        self.flush_connections(n, shared, stats, &mut writer, &mut egress);
                        bulk |= self.wrote_bulk;
                        n = 0;
                    }
                    let len = end - start;
                    let slot = n * self.slot;
                    self.slab[slot..slot + len].copy_from_slice(&b.batch[start..end]);
                    self.metas[n] = RecvMeta::whole(b.from, len);
                    n += 1;
                }
                // The slots hold copies; big frames are done with: the buffer can go.
                egress.conns().done(shard, b.batch);
                if n < self.metas.len() && taken < LINKS_BATCHES_PER_ROUND {
                    next = inbound.try_recv().ok();
                }
            }
            if n > 0 {
                self.flush_connections(n, shared, stats, &mut writer, &mut egress);
                let sparse = !bulk && self.wrote_sparse_only();
                Self::answer(sparse, &mut answers, dev, &mut egress, shared, stats);
            }
        }
    }

    pub(super) fn flush_connections(
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
                (self.wrote, self.wrote_bulk) = (true, true);
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
                    stats.forwarded.fetch_add(1, Relaxed);
                    egress
                        .send(
                            &[&*data],
                            &[Outgoing {
                                buf: 0,
                                start: 0,
                                len: data.len(),
                                to,
                                lane: relayed_lane(data),
                                single: false,
                            }],
                        )
                        .count(&stats.drops);
                }
                return Some(to);
            }
            Got::Forward(_) => stats.drops.add(DropReason::LinkSend, 1),
            Got::Nothing => {}
        }
        None
    }

    pub(super) fn forward(&mut self, egress: &mut Egress, stats: &PipelineStats) {
        if !self.fwd.is_empty() {
            stats.forwarded.fetch_add(self.fwd.len() as u64, Relaxed);
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
        (self.wrote, self.wrote_bulk) = (false, false);
        // The kernel's receive times are on the realtime clock: read it once a batch.
        let now_ns = if self.metas[..n].iter().any(|m| m.arrived_ns != 0) { udp::realtime_ns() } else { 0 };
        for i in 0..n {
            let meta = self.metas[i];
            if meta.truncated || meta.len == 0 {
                stats.drops.add(DropReason::Malformed, 1);
                continue;
            }
            // How long it waited in the socket (0: not known, never dropped for it).
            let sojourn = if meta.arrived_ns == 0 { 0 } else { now_ns.saturating_sub(meta.arrived_ns) };
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
                            let ip = self.slab.get(start + at + VIRTIO_NET_HDR_LEN..start + at + len);
                            let bulk = self.load.add(ip.unwrap_or_default(), len, now);
                            if self.codel.drop_packet(sojourn, now_ns, bulk) {
                                session.stats.drops.add(DropReason::Queue, 1);
                                continue;
                            }
                            (self.wrote, self.wrote_bulk) = (true, true);
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
                            let lane = relayed_lane(&self.slab[start..start + seg]);
                            self.fwd.push(Outgoing { buf: 0, start, len: seg, to, lane, single: false });
                            continue;
                        }
                        Got::Nothing => continue,
                    };
                let plain = &self.slab[at..at + len];
                self.checked = self.checked.wrapping_add(1);
                if self.checked.is_multiple_of(CHECKSUM_SAMPLE)
                    && crate::gso::transport_checksum_ok(plain) == Some(false)
                {
                    bad_checksum(session, shared, stats, now);
                    continue;
                }
                let bulk = self.load.add(plain, len, now);
                // A bare ACK answers data this node sends: what the kernel sends
                // inside its write is that flow's next data, the TX thread's.
                let answers_ours = is_bare_ack(plain);
                if self.codel.drop_packet(sojourn, now_ns, bulk) {
                    session.stats.drops.add(DropReason::Queue, 1);
                    continue;
                }
                self.pending_bulk[self.pending] = bulk;
                (self.wrote, self.wrote_bulk) = (true, self.wrote_bulk || bulk || answers_ours);
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
    pub(super) fn write(&mut self, stats: &PipelineStats, out: &mut impl TunWriter) {
        let n = std::mem::take(&mut self.pending);
        // Sparse flows' packets first (each flow's own order kept).
        sparse_first(&mut self.coal.bufs[..n], &mut self.pending_bulk[..n]);
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

/// Batches the connection RX takes from its queue before it looks at `stop` again.
pub(super) const LINKS_BATCHES_PER_ROUND: usize = 64;

/// What became of one received message.
pub(super) enum Got<'r> {
    /// Opened: the plaintext is at `at..at + len` of the message; `gso` when it is a
    /// super-packet (virtio header first).
    Packet { session: &'r Arc<Session>, at: usize, len: usize, gso: bool },
    /// A relayed frame for someone else (hop limit already decremented).
    Forward(Endpoint),
    /// Handed to the control plane, a keepalive, or dropped and counted.
    Nothing,
}

/// Relay header, then authentication and checks: see [`relay_or_local`], [`open`].
pub(super) fn classify<'r>(
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

/// An inner packet whose checksum failed: dropped and counted on its session, and
/// reported to the control plane (at most once a second per session).
fn bad_checksum(session: &Session, shared: &Shared, stats: &PipelineStats, now: u64) {
    session.stats.drops.add(DropReason::BadChecksum, 1);
    if session.should_report_checksum(now)
        && !shared.control.try_push(ControlEvent::BadChecksum { local_index: session.local_index })
    {
        stats.drops.add(DropReason::ControlQueueFull, 1);
    }
}

/// Writes a super-packet; returns the packets and bytes delivered, or `None` (counted).
pub(super) fn deliver_super(
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

/// Classifies, authenticates and checks one datagram. Returns the session it belongs
/// to, the plaintext length (plaintext at `data[16..]`) and whether it is a GSO
/// super-packet, for a packet to deliver; `None` for anything else (handed to the
/// control plane, a keepalive, or a drop).
pub(super) fn open<'r>(
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
        // A session this node declared dead, whose peer proves with its keys that it
        // still sends on it: the control plane (told once a second) may start a new
        // one. Anything else for an unknown index changes nothing.
        if let Some(dropped) = routes.dropped_by_index(hdr.receiver_index)
            && !dropped.is_expired(now)
            && dropped.open(&hdr, data).is_ok()
            && dropped.should_report_stale(now)
            && !shared.control.try_push(ControlEvent::StaleSession { local_index: dropped.local_index })
        {
            stats.drops.add(DropReason::ControlQueueFull, 1);
        }
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
            if !routes.delivers_to(dst) {
                session.stats.drops.add(DropReason::ForbiddenDestination, 1);
                None
            } else if let Err(reason) = shared.firewall.inbound(&data[ip..DATA_HEADER_LEN + len], now) {
                session.stats.drops.add(reason, 1);
                None
            } else {
                Some((session, len, gso))
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
