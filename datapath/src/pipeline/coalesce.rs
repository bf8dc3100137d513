//! RX coalescing: opened TCP and UDP segments of one flow are merged into one
//! super-packet for the TUN's GRO write (tun-rs's GROTable), within the IP length limit.

use tun_rs::{IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN};

use crate::gso;

/// Receive slots without GRO: one datagram each.
pub(super) const RX_SLOTS: usize = 64;

/// Opened packets RX gathers before one coalescing TUN write (at least
/// `gso::MAX_SEGMENTS`: they also hold a split GSO record's segments). Each has a
/// buffer of one packet's size; the first packet of each flow moves into a large one
/// before the write ([`Coalescer`]).
pub(super) const RX_COALESCE: usize = IDEAL_BATCH_SIZE;

const _: () = assert!(RX_COALESCE >= gso::MAX_SEGMENTS);

/// Large coalescing buffers one write may use: flows past this many in one batch are
/// written without coalescing.
pub(super) const RX_HEADS: usize = 32;

/// Room of a large coalescing buffer: a virtio header and a 65 535-byte IP packet, the
/// most one super-packet may be, plus the header tun-rs's room check reserves. TUN GRO
/// admits a segment to a head by the head's room alone, so a buffer with more room
/// grew past the IP length field, which wrapped, and the kernel dropped the whole
/// super-packet without an error (a TCP flow stalled until its sender's timeout).
/// `Vec::with_capacity` gives exactly this room.
pub(super) const HEAD_ROOM: usize = 2 * VIRTIO_NET_HDR_LEN + u16::MAX as usize;

/// Receive slots with GRO: up to 64 coalesced datagrams each. Four (256 KiB, about
/// half a millisecond of opening here) bound what one receive takes in: a packet that
/// arrives while a batch is opened waits for that batch only; with 16 slots (1 MiB) a
/// ping's median wait beside a download was about 0.8 ms, with 4 about 0.6 ms
/// (bench/RESULTS.md §37).
pub(super) const RX_SLOTS_GRO: usize = 4;

pub(super) const GRO_SLOT: usize = 65536;

/// RX's write buffers. TUN GRO appends a flow's later packets to an earlier one only
/// when that buffer has room for the whole super-packet (~64 KiB); giving every packet
/// slot that much made each RX thread keep 8 MiB resident (every slot is a head some
/// time). So every slot holds one packet, and before a write each packet GRO will
/// make a head — the first of its flow with data, or the first after the flow's
/// super-packet filled up or ended with a short or PSH segment — moves into one of a
/// few large buffers (one packet copied per ~45); after the write they come back. A
/// head that did not get one is written without what would have followed it.
pub(super) struct Coalescer {
    pub(super) bufs: Vec<Vec<u8>>,
    /// Large buffers not in `bufs`.
    pub(super) big: Vec<Vec<u8>>,
    /// Small buffers whose slots a large one holds for the write.
    pub(super) small: Vec<Vec<u8>>,
    pub(super) big_cap: usize,
    /// The flows of the batch being written and their current head.
    pub(super) flows: Vec<Head>,
}

/// A flow's current head while [`Coalescer::promote`] walks a batch.
pub(super) struct Head {
    pub(super) key: u64,
    /// IP length of the super-packet so far.
    pub(super) len: usize,
    /// Payload of its first segment: GRO takes only segments of this size, the last
    /// one possibly shorter.
    pub(super) segment: usize,
    /// A short or PSH segment ended it.
    pub(super) ended: bool,
}

impl Coalescer {
    /// Slots of `small_cap` bytes; heads of `big_cap` (at most [`HEAD_ROOM`]).
    pub(super) fn new(small_cap: usize, big_cap: usize) -> Self {
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
    pub(super) fn promote(&mut self, n: usize) {
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
    pub(super) fn demote(&mut self, n: usize) {
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
pub(super) struct Flow {
    /// Hash of the 5-tuple.
    pub(super) key: u64,
    /// IP length.
    pub(super) len: usize,
    /// Data bytes.
    pub(super) payload: usize,
    /// TCP PSH set.
    pub(super) psh: bool,
}

/// The transport layer of a TCP or UDP packet (IPv4, or IPv6 without extension
/// headers), read from `ip`, which holds exactly the packet.
pub(super) struct Layer4<'a> {
    pub(super) proto: u8,
    /// Source and destination addresses.
    pub(super) addrs: &'a [u8],
    /// The transport header and what follows it.
    pub(super) bytes: &'a [u8],
    /// Length of the transport header.
    pub(super) header: usize,
    /// TCP PSH set.
    pub(super) psh: bool,
}

pub(super) fn layer4(ip: &[u8]) -> Option<Layer4<'_>> {
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
pub(super) fn flow(ip: &[u8]) -> Option<Flow> {
    use std::hash::{Hash, Hasher};
    let l = layer4(ip)?;
    if l.bytes.len() <= l.header {
        return None;
    }
    let mut h = rustc_hash::FxHasher::default();
    (l.proto, l.addrs, l.bytes.get(..4)?).hash(&mut h);
    Some(Flow { key: h.finish(), len: ip.len(), payload: l.bytes.len() - l.header, psh: l.psh })
}
