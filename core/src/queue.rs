//! Short queues: what keeps a keystroke or a game packet from waiting behind a
//! download inside the tunnel.
//!
//! When a node cannot open packets as fast as they arrive, the backlog stands in its
//! UDP socket's receive buffer, in arrival order, and everything waits behind it. Two
//! pieces, per receive thread, in the manner of fq_codel:
//!
//! * [`Codel`] (RFC 8289) watches how long each datagram waited in the socket (the
//!   kernel's receive timestamp against the time it is read). Once that stays above
//!   [`TARGET_NS`] for an [`INTERVAL_NS`], it asks for a drop, then more often (the
//!   interval over the square root of the drops) until the wait falls below the
//!   target: the inner TCP senders feel the bottleneck and slow down, instead of
//!   filling the buffer.
//! * [`FlowLoad`] counts each inner flow's bytes over a short window: a flow past
//!   [`BULK_BYTES`] in it is bulk. Only bulk flows' packets are dropped (a drop CoDel
//!   asks for while sparse packets pass is owed to the next bulk one), and in each
//!   batch written to the TUN sparse flows' packets go first ([`sparse_first`]).
//!
//! A stream connection's send queue uses [`Codel`] too, with its own target and
//! interval ([`Codel::new`]; `weft_datapath::transport::connections::ConnQueue`).
//!
//! Pure logic: the caller hands in the times and the packets.

/// The wait in the receive queue CoDel tolerates (0.25 ms).
pub const TARGET_NS: u64 = 250_000;
/// How long the wait must stay above the target before the first drop (4 ms), and the
/// base of the spacing of the next ones.
pub const INTERVAL_NS: u64 = 4_000_000;
/// Bytes a flow moves within one [`WINDOW_MS`] (half of the previous window's count
/// carried over) to be bulk: 64 KiB in 16 ms is about 33 Mbit/s. A game flow, a call,
/// SSH, DNS or a ping is far below.
pub const BULK_BYTES: u32 = 64 * 1024;
/// The window of [`FlowLoad`], in milliseconds.
pub const WINDOW_MS: u64 = 16;
/// Buckets of [`FlowLoad`]: flows hashed into them (a sparse flow that shares a bucket
/// with a bulk one is taken for bulk).
const BUCKETS: usize = 1024;

/// CoDel's state for one queue.
#[derive(Debug, Clone)]
pub struct Codel {
    /// The wait tolerated, nanoseconds.
    target: u64,
    /// How long the wait must stay above it before the first drop, nanoseconds.
    interval: u64,
    /// When the wait first went above the target plus one interval (0: it is below).
    first_above: u64,
    dropping: bool,
    drop_next: u64,
    count: u32,
    last_count: u32,
    /// A drop was asked for and no bulk packet has come since.
    owed: bool,
}

impl Default for Codel {
    /// The receive queue's: [`TARGET_NS`] and [`INTERVAL_NS`].
    fn default() -> Self {
        Self::new(TARGET_NS, INTERVAL_NS)
    }
}

impl Codel {
    /// A queue whose wait may stay above `target_ns` for at most `interval_ns` before
    /// CoDel drops.
    pub fn new(target_ns: u64, interval_ns: u64) -> Self {
        Self {
            target: target_ns,
            interval: interval_ns,
            first_above: 0,
            dropping: false,
            drop_next: 0,
            count: 0,
            last_count: 0,
            owed: false,
        }
    }

    /// One datagram read at `now` (nanoseconds) after waiting `sojourn` nanoseconds.
    /// Returns whether CoDel asks for a drop now.
    pub fn dequeue(&mut self, sojourn: u64, now: u64) -> bool {
        let ok_to_drop = if sojourn < self.target {
            self.first_above = 0;
            false
        } else if self.first_above == 0 {
            self.first_above = now.saturating_add(self.interval);
            false
        } else {
            now >= self.first_above
        };
        if self.dropping {
            if !ok_to_drop {
                self.dropping = false;
                false
            } else if now >= self.drop_next {
                self.count = self.count.saturating_add(1);
                self.drop_next = control_law(self.drop_next, self.count, self.interval);
                true
            } else {
                false
            }
        } else if ok_to_drop {
            self.dropping = true;
            // Dropping again soon after the last episode: start where it left off.
            let delta = self.count.saturating_sub(self.last_count);
            self.count = if delta > 1 && now.saturating_sub(self.drop_next) < 16 * self.interval { delta } else { 1 };
            self.drop_next = control_law(now, self.count, self.interval);
            self.last_count = self.count;
            true
        } else {
            false
        }
    }

    /// One datagram of a flow that is bulk or not ([`FlowLoad::add`]), read at `now`
    /// after waiting `sojourn`: whether to drop it. A drop asked for while sparse
    /// packets pass waits for the next bulk one (until the wait falls below target).
    pub fn drop_packet(&mut self, sojourn: u64, now: u64, bulk: bool) -> bool {
        if self.dequeue(sojourn, now) {
            self.owed = true;
        } else if !self.dropping {
            self.owed = false;
        }
        if bulk && self.owed {
            self.owed = false;
            return true;
        }
        false
    }

    /// Whether CoDel is dropping (the wait has stayed above target).
    pub fn dropping(&self) -> bool {
        self.dropping
    }
}

fn control_law(t: u64, count: u32, interval: u64) -> u64 {
    t.saturating_add((interval as f64 / f64::from(count.max(1)).sqrt()) as u64)
}

/// Bytes per inner flow over a short window, to tell bulk flows from sparse ones.
#[derive(Debug, Clone)]
pub struct FlowLoad {
    /// Per bucket: the window it was last counted in, and its bytes.
    buckets: Box<[(u64, u32)]>,
}

impl Default for FlowLoad {
    fn default() -> Self {
        Self { buckets: vec![(0, 0); BUCKETS].into_boxed_slice() }
    }
}

impl FlowLoad {
    /// Counts an IP packet (`packet`, its headers at least; `len` bytes on the wire,
    /// more than `packet` holds for a super-packet) at `now_ms`; returns whether its
    /// flow is bulk. Not IP: counted in one bucket of its own.
    pub fn add(&mut self, packet: &[u8], len: usize, now_ms: u64) -> bool {
        let window = now_ms / WINDOW_MS;
        let b = &mut self.buckets[bucket(packet)];
        if b.0 != window {
            b.1 = if b.0 + 1 == window { b.1 / 2 } else { 0 };
            b.0 = window;
        }
        b.1 = b.1.saturating_add(u32::try_from(len).unwrap_or(u32::MAX));
        b.1 >= BULK_BYTES
    }
}

/// The bucket of a packet's flow: addresses, protocol and (TCP, UDP) ports.
fn bucket(p: &[u8]) -> usize {
    let (key, proto, l4): (&[u8], u8, &[u8]) = match p.first().map(|v| v >> 4) {
        Some(4) if p.len() >= 20 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            (&p[12..20], p[9], p.get(ihl..).unwrap_or_default())
        }
        Some(6) if p.len() >= 40 => (&p[8..40], p[6], &p[40..]),
        _ => return 0,
    };
    // FNV-1a: short keys, one thread, no adversary who gains from a collision but
    // being taken for bulk.
    let mut h: u32 = 0x811c_9dc5;
    let ports = match proto {
        6 | 17 => l4.get(..4).unwrap_or_default(),
        _ => &[],
    };
    for &x in key.iter().chain([proto].iter()).chain(ports) {
        h = (h ^ u32::from(x)).wrapping_mul(0x0100_0193);
    }
    h as usize % BUCKETS
}

/// Puts the items not marked `bulk` first, each group in its order (a stable
/// partition): sparse flows' packets leave a batch before bulk ones, and no flow's
/// packets are reordered. `bulk` is as long as `items`.
pub fn sparse_first<T>(items: &mut [T], bulk: &mut [bool]) {
    let mut w = 0;
    for i in 0..items.len().min(bulk.len()) {
        if !bulk[i] {
            // Only a sparse item behind a bulk one moves (all sparse or all bulk: none).
            if w < i {
                items[w..=i].rotate_right(1);
                bulk[w..=i].rotate_right(1);
            }
            w += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(src: u8, sport: u16, len: usize) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, src, 10, 0, 0, 1];
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&9000u16.to_be_bytes());
        p.resize(len, 0);
        p
    }

    fn icmp(src: u8, seq: u8) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 1, 0, 0, 10, 0, 0, src, 10, 0, 0, 1];
        p.extend_from_slice(&[8, 0, seq, !seq, 0, 7, 0, seq]);
        p
    }

    #[test]
    fn a_sparse_flow_leaves_the_batch_before_a_backlog_of_bulk_packets() {
        let mut load = FlowLoad::default();
        // A download under way (its earlier packets), then a batch: a ping and a game
        // packet behind 30 and 60 of its packets.
        for _ in 0..100 {
            load.add(&udp(2, 5000, 1400), 1400, 96);
        }
        let mut batch: Vec<Vec<u8>> = (0..60).map(|i| udp(2, 5000, 1400 + i % 2)).collect();
        batch.insert(30, icmp(3, 1));
        batch.push(udp(4, 7777, 100));
        batch.extend((0..3).map(|_| udp(2, 5000, 1400)));
        let mut bulk: Vec<bool> = batch.iter().map(|p| load.add(p, p.len(), 100)).collect();
        let order: Vec<usize> = (0..batch.len()).collect();
        let (mut items, before) = (batch.iter().cloned().zip(order).collect::<Vec<_>>(), bulk.clone());
        sparse_first(&mut items, &mut bulk);
        assert_eq!(before.iter().filter(|b| !**b).count(), 2, "the download is bulk, the ping and the game not");
        assert_eq!(items[0].0, icmp(3, 1), "the ping goes first");
        assert_eq!(items.iter().position(|(p, _)| *p == udp(4, 7777, 100)).unwrap(), 1, "then the game packet");
        // The download's own packets stay in their order.
        let download: Vec<usize> = items.iter().filter(|(p, _)| p[15] == 2).map(|(_, i)| *i).collect();
        assert!(download.windows(2).all(|w| w[0] < w[1]));
        assert!(!bulk[0] && !bulk[1] && bulk[2..].iter().all(|b| *b));
    }

    #[test]
    fn flows_are_bulk_by_their_rate_and_stop_being_so() {
        let mut load = FlowLoad::default();
        // A 50-packet/s game flow, 100 bytes each, for 10 s: never bulk.
        assert!((0..500).all(|i| !load.add(&udp(4, 7777, 100), 100, i * 20)));
        // Pings ten a second: never.
        assert!((0..100u8).all(|i| !load.add(&icmp(3, i), 84, u64::from(i) * 100)));
        // A download: bulk once it has moved 64 KiB within a window, and so on.
        let d = udp(2, 5000, 1400);
        let bulk: Vec<bool> = (0..100).map(|_| load.add(&d, 1400, 20_000)).collect();
        assert!(!bulk[0] && bulk[50..].iter().all(|b| *b));
        // Idle for two windows: sparse again.
        assert!(!load.add(&d, 1400, 20_000 + 3 * WINDOW_MS));
        // A super-packet counts its whole length: two make a flow bulk.
        assert!(!load.add(&udp(5, 1, 60), 65_000, 30_000));
        assert!(load.add(&udp(5, 1, 60), 65_000, 30_000));
    }

    #[test]
    fn codel_drops_only_while_the_wait_stays_above_target() {
        let mut c = Codel::default();
        let ms = 1_000_000u64;
        // A wait below target never drops, however long it lasts.
        assert!((0..10_000).all(|i| !c.dequeue(TARGET_NS - 1, i * 10_000)));
        // Above target: nothing for one interval, then a drop, then faster ones.
        let mut drops = Vec::new();
        for i in 0..4_000u64 {
            let now = 200 * ms + i * 10_000; // a datagram every 10 µs for 40 ms
            if c.dequeue(2 * TARGET_NS, now) {
                drops.push(now - 200 * ms);
            }
        }
        assert!(drops[0] >= INTERVAL_NS && drops[0] < INTERVAL_NS + 20_000, "{drops:?}");
        let gaps: Vec<u64> = drops.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 4 && gaps.windows(2).all(|g| g[1] <= g[0] + 10_000), "ever closer: {gaps:?}");
        assert!(c.dropping());
        // The wait falls below target: dropping stops at once.
        assert!(!c.dequeue(TARGET_NS / 2, 241 * ms));
        assert!(!c.dropping());
    }

    #[test]
    fn a_drop_asked_for_while_sparse_packets_pass_falls_on_the_next_bulk_one() {
        let mut c = Codel::default();
        let mut now = 0;
        let mut step = |c: &mut Codel, bulk: bool| {
            now += 10_000;
            c.drop_packet(10 * TARGET_NS, now, bulk)
        };
        // Only sparse packets while the first drop comes due: none of them is dropped.
        let sparse_dropped = (0..1_000).filter(|_| step(&mut c, false)).count();
        assert_eq!(sparse_dropped, 0);
        assert!(c.dropping());
        assert!(step(&mut c, true), "the owed drop falls on the first bulk packet");
        assert!(!step(&mut c, true), "once");
    }
}
