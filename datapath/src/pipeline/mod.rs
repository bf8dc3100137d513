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
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use arc_swap::ArcSwap;
use tracing::debug;

use crate::transport::udp::Offload;
use crate::transport::{Connections, Egress, Endpoint, Inbound};
use weft_core::admission::MacKeys;
use weft_core::route::RouteSnapshot;
use weft_core::session::Session;
use weft_core::stats::DropCounters;
use weft_core::wire::{DATA_HEADER_LEN, RELAY_HEADER_LEN};

mod answer;
mod coalesce;
mod device;
mod relay;
mod rx;
mod tx;

use answer::Answers;
pub use device::{Deliver, Device, TunOut, TunWriter, UserOut, UserPort};
pub use relay::{RELAY_SPARSE_MAX, StreamRelay};
pub use rx::Rx;
pub use tx::Tx;

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
    /// Data authenticated by a session this node declared dead
    /// ([`RouteSnapshot::dropped_by_index`]; reported at most once a second per
    /// session): its peer still uses it, and the control plane may start a new one.
    StaleSession {
        /// The dropped session's local index.
        local_index: u32,
    },
    /// Inner packets with bad TCP/UDP checksums arrived on a session (RX checks a
    /// sample; reported at most once a second per session): its sender's TUN offload
    /// corrupts them, and the control plane tells it.
    BadChecksum {
        /// The session's local index.
        local_index: u32,
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
    /// The access policy and its connection table (none in force: everything passes).
    pub firewall: Arc<weft_core::firewall::Firewall>,
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
    /// GSO super-packets sent whole as one record ([`weft_core::wire::FLAG_GSO`]).
    pub tx_gso_records: AtomicU64,
    /// GSO records received and delivered.
    pub rx_gso_records: AtomicU64,
    /// Packets the RX thread read from its TUN queue and sent right after a write of
    /// sparse flows' packets (what the kernel answered inside that write); also in
    /// `tx_packets`.
    pub tx_answers: AtomicU64,
    /// Relayed frames for other nodes that this pipeline took to pass on (the work
    /// this node does as a relay; what could then not be sent is in `drops` too).
    pub forwarded: AtomicU64,
    /// Drops that belong to no peer, by reason.
    pub drops: DropCounters,
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
/// [`crate::transport::udp::replace`]), and the node's connections `conns` for paths
/// over other transports.
pub fn spawn(
    id: usize,
    tun: Arc<Device>,
    sock: Arc<UdpSocket>,
    conns: Arc<Connections>,
    cfg: PipelineConfig,
    shared: Shared,
    stats: Arc<PipelineStats>,
) -> io::Result<[JoinHandle<()>; 2]> {
    let tx_egress = Egress::new(sock.clone(), conns.clone(), shared.offload.clone());
    let rx_egress = Egress::new(sock, conns, shared.offload.clone());
    let answers = Answers::new(&tun, cfg, &shared);
    let (t2, sh2, st2) = (tun.clone(), shared.clone(), stats.clone());
    let tx = std::thread::Builder::new().name(format!("weft-tx-{id}")).spawn(move || {
        pin(cfg.pin);
        Tx::new(cfg).run(&t2, tx_egress, &sh2, &st2)
    })?;
    let rx = std::thread::Builder::new().name(format!("weft-rx-{id}")).spawn(move || {
        pin(cfg.pin);
        Rx::new(cfg).run(&tun, rx_egress, &shared, &stats, answers)
    })?;
    Ok([tx, rx])
}

/// Starts connection RX thread `id`, which opens what the connections (TCP, WebSocket,
/// QUIC) given to it receive (see [`Connections::sharded`]) and writes it to the TUN queue
/// `tun`; relayed frames leave through `egress`.
pub fn spawn_connections_rx(
    id: usize,
    tun: Arc<Device>,
    inbound: mpsc::Receiver<Inbound>,
    egress: Egress,
    cfg: PipelineConfig,
    shared: Shared,
    stats: Arc<PipelineStats>,
) -> io::Result<JoinHandle<()>> {
    let cfg = PipelineConfig { udp_gro: false, ..cfg };
    let answers = Answers::new(&tun, cfg, &shared);
    std::thread::Builder::new()
        .name(format!("weft-conns-{id}"))
        .spawn(move || Rx::new(cfg).run_connections(id, &tun, &inbound, egress, &shared, &stats, answers))
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

/// Sets the calling thread's scheduling priority (nice) to `nice` unless it is that
/// high already; threads it starts afterwards inherit it. Raising it needs
/// CAP_SYS_NICE.
#[allow(unsafe_code)]
pub fn raise_priority(nice: libc::c_int) -> io::Result<()> {
    // SAFETY: getpriority/setpriority act on the calling thread (`who` 0) and take no
    // pointers; errno is cleared first because -1 is a valid priority.
    let current = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    if io::Error::last_os_error().raw_os_error() == Some(0) && current <= nice {
        return Ok(());
    }
    // SAFETY: as above.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The data path's clock: milliseconds since `epoch` ([`Shared::epoch`]), the times of
/// sessions and of the connection table.
pub fn now_ms(epoch: Instant) -> u64 {
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

/// Room TX leaves in front of each packet it reads: a relay header and a data header.
pub const TX_HEADROOM: usize = RELAY_HEADER_LEN + DATA_HEADER_LEN;

/// The largest inner packet one QUIC datagram carries whole on a 1500-byte underlay
/// (IPv4 or IPv6): quinn's path MTU ceiling of 1452 bytes of UDP payload, less QUIC's
/// short header, AEAD tag and datagram frame (38), our datagram tag (1) and data
/// header and tag (32), with a byte to spare. TCP SYNs towards a QUIC hop get their
/// MSS clamped to it, so full-size segments are not split in two datagrams.
pub const QUIC_INNER_MAX: usize = 1380;

#[cfg(test)]
mod tests {
    use crate::pipeline::coalesce::{Coalescer, HEAD_ROOM, flow};
    use crate::pipeline::tx::tcp_in_order;
    use tun_rs::VIRTIO_NET_HDR_LEN;

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
