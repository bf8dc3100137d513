//! The data plane's side of the connection transports: a registry of live
//! connections by [`Endpoint`], each with a bounded queue of framed batches in two
//! lanes ([`super::Lane`]) that the pipelines' [`super::Egress`] fills, and the
//! [`Inbound`] queues that carry
//! received batches to the connection RX threads: each connection is given one of them
//! when it registers (in turn), so its frames are opened in order by one thread and
//! many connections are opened by all of them.
//!
//! Nothing here blocks a pipeline: a full send queue drops the batch and counts it,
//! like a full socket buffer would drop a datagram, and the inner TCP backs off as it
//! would on loss. On the receiving side a connection's reader waits for room
//! ([`Connections::deliver`]): a stream's flow control, or quinn's datagram buffer, takes
//! up the slack instead of the tunnel losing what the connection already carried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::Instant;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use tokio::sync::mpsc as tmpsc;
use weft_core::queue::Codel;

use super::{Endpoint, Lane, Proto, frame};

/// Framed batches queued per connection before the sender drops.
pub const CONN_QUEUE: usize = 512;
/// Batches the sparse lane of a connection's send queue holds ([`Lane::Sparse`]):
/// past this, sparse batches join the bulk lane (in order behind it, never lost).
pub const CONN_SPARSE_QUEUE: usize = 64;
/// Bytes of sparse batches the writer takes in a row while bulk batches wait; then one
/// bulk batch goes (fq_codel's quantum, per lane). Many flows each under the bulk
/// rate (a torrent's hundreds of peers) can add up to more than the link carries:
/// first does not mean only, and a download is never starved by them.
pub const CONN_SPARSE_QUANTUM: usize = 64 << 10;
/// The wait in a connection's send queue CoDel tolerates (5 ms) and the interval it
/// must last before a drop (100 ms): RFC 8289's values for paths across the Internet.
/// On a fast link the writer keeps the queue near empty and nothing is dropped; on a
/// slow uplink what would stand here (up to [`CONN_QUEUE`] batches of 64 KiB, tens of
/// seconds at 10 Mbit/s) is cut to about the target, and the inner TCP senders slow
/// down instead of burying every other flow's packets behind theirs.
pub const LINK_TARGET_NS: u64 = 5_000_000;
/// See [`LINK_TARGET_NS`].
pub const LINK_INTERVAL_NS: u64 = 100_000_000;
/// A batch smaller than this (a ping, a keystroke, a game packet, an ACK: one or two
/// small frames) is never what CoDel drops: a drop asked for while such batches pass
/// falls on the next larger one, as the receive path spares sparse flows.
pub const LINK_SMALL_BATCH: usize = 1024;
/// Batch buffers kept for reuse (see [`Connections::buffer`]): enough for the batches in
/// flight of a few busy connections; each may hold up to 128 KiB, so at most 2 MiB.
const POOL: usize = 16;
/// Buffers larger than this are not kept.
const POOL_MAX_CAPACITY: usize = 2 * (frame::PREFIX + frame::MAX_FRAME);
/// Bytes of received batches (their buffers' capacity) waiting for one connection RX
/// thread: past this a connection's reader waits. Counting batches alone let 256 of
/// up to 128 KiB each wait (32 MiB) while the thread was behind; a few batches are
/// enough to keep it busy.
pub const INBOUND_BYTES: usize = 512 << 10;

/// Forwards relayed frames a connection received from the reader itself, without
/// opening them (see [`Connections::set_forward`]; the pipeline's `StreamRelay`).
pub trait Forward: Send + Sync {
    /// Queues the frames of `batch` (whole frames received from `from`) that go on to
    /// a next hop over a stream connection there, and gives back the batch with the
    /// rest in order (`None`: nothing left).
    fn forward(&self, conns: &Connections, from: Endpoint, batch: Vec<u8>) -> Option<Vec<u8>>;
}

/// Says whether an endpoint is a member's current path (see [`Connections::set_members`]).
pub type Members = Box<dyn Fn(&Endpoint) -> bool + Send + Sync>;

/// A batch buffer lent out by [`Connections::lend`]: back to the pool on drop.
struct Lent {
    buf: Vec<u8>,
    conns: Arc<Connections>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.conns.recycle(std::mem::take(&mut self.buf));
    }
}

/// Received frames of one connection, framed (see [`frame`]).
#[derive(Debug)]
pub struct Inbound {
    /// The connection they came on.
    pub from: Endpoint,
    /// One or more framed records.
    pub batch: Vec<u8>,
}

/// Counters of the connection transports, for status.
#[derive(Debug, Default)]
pub struct ConnCounters {
    /// Connections accepted by a listener.
    pub accepted: AtomicU64,
    /// Connections we opened.
    pub dialled: AtomicU64,
    /// Dials that failed (refused, unreachable, timed out, handshake failed).
    pub dial_failures: AtomicU64,
    /// Connections turned away because the listener was at its limit.
    pub refused_full: AtomicU64,
    /// Connections turned away because their source address held its share of the
    /// listener's slots.
    pub refused_source: AtomicU64,
    /// Connections turned away because the listener's pool of unproven connections
    /// (or their source's share of it) was full.
    pub refused_unproven: AtomicU64,
    /// Accepted connections closed because they carried no handshake message with a
    /// valid mac1 within [`crate::transport::conn::PROOF_TIMEOUT`].
    pub unproven_closed: AtomicU64,
    /// Inbound TLS, WebSocket or QUIC handshakes that failed or timed out.
    pub handshake_failures: AtomicU64,
    /// Connections closed for speaking something other than our framing.
    pub protocol_errors: AtomicU64,
    /// Connections closed for missing a deadline: no first frame in time, a frame
    /// not complete in time, or idle.
    pub timeouts: AtomicU64,
    /// Received batches that found their connection RX thread behind (their reader waited
    /// for room).
    pub rx_queue_full: AtomicU64,
    /// Frames sent over QUIC as more than one datagram (too large for one).
    pub quic_fragmented: AtomicU64,
    /// Batches of relayed frames a reader handed to the next hop's connection itself
    /// (see [`Connections::set_forward`]), never through a connection RX thread.
    pub relayed_batches: AtomicU64,
    /// Batches CoDel dropped from a connection's send queue (see [`ConnQueue`]).
    pub queue_dropped: AtomicU64,
}

impl ConnCounters {
    /// Name and value of each counter.
    pub fn snapshot(&self) -> [(&'static str, u64); 14] {
        let l = |a: &AtomicU64| a.load(Relaxed);
        [
            ("accepted", l(&self.accepted)),
            ("dialled", l(&self.dialled)),
            ("dial_failures", l(&self.dial_failures)),
            ("refused_full", l(&self.refused_full)),
            ("refused_source", l(&self.refused_source)),
            ("refused_unproven", l(&self.refused_unproven)),
            ("unproven_closed", l(&self.unproven_closed)),
            ("handshake_failures", l(&self.handshake_failures)),
            ("protocol_errors", l(&self.protocol_errors)),
            ("timeouts", l(&self.timeouts)),
            ("rx_queue_full", l(&self.rx_queue_full)),
            ("quic_fragmented", l(&self.quic_fragmented)),
            ("relayed_batches", l(&self.relayed_batches)),
            ("queue_dropped", l(&self.queue_dropped)),
        ]
    }
}

/// One connection RX thread's queue and the bytes waiting in it.
struct Shard {
    tx: mpsc::SyncSender<Inbound>,
    bytes: AtomicUsize,
    /// Woken whenever the thread takes a batch: readers of streams wait on it.
    room: tokio::sync::Notify,
}

#[derive(Clone)]
struct Entry {
    id: u64,
    tx: ConnSender,
}

/// The senders' end of a connection's send queue (see [`ConnQueue::channel`]).
#[derive(Debug, Clone)]
pub struct ConnSender {
    bulk: tmpsc::Sender<Queued>,
    sparse: tmpsc::Sender<Queued>,
}

impl ConnSender {
    /// Queues `q` in `lane`: a sparse batch that finds its lane full joins the bulk
    /// lane. Gives it back when the (bulk) lane is full or the connection is gone.
    pub fn try_send(&self, q: Queued, lane: Lane) -> Result<(), tmpsc::error::TrySendError<Queued>> {
        let q = match lane {
            Lane::Sparse => match self.sparse.try_send(q) {
                Err(tmpsc::error::TrySendError::Full(q)) => q,
                other => return other,
            },
            Lane::Bulk => q,
        };
        self.bulk.try_send(q)
    }
}

/// A framed batch in a connection's send queue, with the time it was queued.
#[derive(Debug)]
pub struct Queued {
    /// The framed batch.
    pub batch: Vec<u8>,
    /// When it was queued.
    pub at: Instant,
}

impl Queued {
    /// `batch`, queued now.
    pub fn now(batch: Vec<u8>) -> Self {
        Self { batch, at: Instant::now() }
    }
}

/// The writer's end of a connection's send queue: two lanes ([`Lane`]), the sparse one
/// taken first. Each bulk batch taken has waited some time; CoDel ([`Codel`],
/// [`LINK_TARGET_NS`]) drops one now and then while that wait stays above its target,
/// so the queue stands no longer than that whatever the link's speed (the kernel's own
/// send buffer is kept short too: the connection's `TCP_NOTSENT_LOWAT`). Only bulk
/// batches of [`LINK_SMALL_BATCH`] or more are dropped; dropped batches are counted
/// (`queue_dropped`) and their buffers go back to the pool; the last batch waiting is
/// never dropped.
pub struct ConnQueue {
    bulk: tmpsc::Receiver<Queued>,
    sparse: tmpsc::Receiver<Queued>,
    /// Bytes of sparse batches taken since the last bulk one.
    sparse_run: usize,
    codel: Codel,
    epoch: Instant,
    conns: Arc<Connections>,
}

impl ConnQueue {
    /// A connection's send queue (its bulk lane holds [`CONN_QUEUE`] batches, its
    /// sparse lane [`CONN_SPARSE_QUEUE`]), for registering with `conns`
    /// ([`Connections::register`]).
    pub fn channel(conns: Arc<Connections>) -> (ConnSender, Self) {
        let (bulk_tx, bulk) = tmpsc::channel(CONN_QUEUE);
        let (sparse_tx, sparse) = tmpsc::channel(CONN_SPARSE_QUEUE);
        let codel = Codel::new(LINK_TARGET_NS, LINK_INTERVAL_NS);
        let queue = Self { bulk, sparse, sparse_run: 0, codel, epoch: Instant::now(), conns };
        (ConnSender { bulk: bulk_tx, sparse: sparse_tx }, queue)
    }

    /// The next batch to write: a sparse one if any waits, unless sparse ones have
    /// taken [`CONN_SPARSE_QUANTUM`] in a row while a bulk one waits (`None`: the
    /// connection was unregistered).
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(b) = self.try_recv() {
                return Some(b);
            }
            let q = tokio::select! {
                biased;
                Some(q) = self.sparse.recv() => return Some(self.took_sparse(q)),
                q = self.bulk.recv() => q?,
            };
            if let Some(b) = self.keep(q) {
                return Some(b);
            }
        }
    }

    /// The next sparse batch (`None`: the lane closed), for a writer that cannot take
    /// a bulk one now — its QUIC stream waits for the peer's flow-control credit — so
    /// that sparse flows do not wait with it.
    pub async fn recv_sparse(&mut self) -> Option<Vec<u8>> {
        let q = self.sparse.recv().await?;
        Some(self.took_sparse(q))
    }

    /// The next batch already waiting, if any, in the order of [`ConnQueue::recv`].
    pub fn try_recv(&mut self) -> Option<Vec<u8>> {
        if self.sparse_run < CONN_SPARSE_QUANTUM || self.bulk.is_empty() {
            match self.sparse.try_recv() {
                Ok(q) => return Some(self.took_sparse(q)),
                // The sparse lane is empty: its run is over.
                Err(_) => self.sparse_run = 0,
            }
        }
        loop {
            let q = self.bulk.try_recv().ok()?;
            if let Some(b) = self.keep(q) {
                return Some(b);
            }
        }
    }

    fn took_sparse(&mut self, q: Queued) -> Vec<u8> {
        self.sparse_run += q.batch.len();
        q.batch
    }

    /// Bulk batch `q`, unless CoDel drops it (the sparse lane's run starts again).
    fn keep(&mut self, q: Queued) -> Option<Vec<u8>> {
        self.sparse_run = 0;
        let now = Instant::now();
        // An empty queue has no standing wait to cut (RFC 8289: never below one packet).
        let sojourn = if self.bulk.is_empty() { 0 } else { now.saturating_duration_since(q.at).as_nanos() as u64 };
        let now_ns = now.saturating_duration_since(self.epoch).as_nanos() as u64 + 1;
        if self.codel.drop_packet(sojourn, now_ns, q.batch.len() >= LINK_SMALL_BATCH) {
            self.conns.counters.queue_dropped.fetch_add(1, Relaxed);
            self.conns.recycle(q.batch);
            return None;
        }
        Some(q.batch)
    }
}

/// Live connections by endpoint.
pub struct Connections {
    map: RwLock<FxHashMap<Endpoint, Entry>>,
    /// One queue per connection RX thread; a connection's registration id picks one.
    inbound: Vec<Shard>,
    /// Emptied batch buffers on their way back to be filled again (from the connection RX
    /// to the readers, from the connection writers to the pipelines): a fresh
    /// 64–128 KiB allocation per batch is an mmap and its page faults.
    pool: parking_lot::Mutex<Vec<Vec<u8>>>,
    next_id: AtomicU64,
    /// Takes the relayed frames bound for a stream connection out of received batches
    /// before they reach a connection RX thread, once set.
    forward: std::sync::OnceLock<Box<dyn Forward>>,
    /// Whether an endpoint is a member's current path (it proved the secret), once set.
    members: std::sync::OnceLock<Members>,
    /// UDP endpoints registered here (sockets of their own: [`Connections::register`]
    /// of a UDP endpoint), so that the pipelines look up UDP destinations only while
    /// there are some.
    pinned_udp: AtomicUsize,
    /// Counters.
    pub counters: ConnCounters,
}

impl Connections {
    /// A registry whose received batches go to the returned receiver (at most
    /// `depth` waiting): one connection RX thread.
    pub fn new(depth: usize) -> (Arc<Self>, mpsc::Receiver<Inbound>) {
        let (conns, mut rx) = Self::sharded(depth, 1);
        (conns, rx.remove(0))
    }

    /// A registry with `shards` receivers (at least one), one per connection RX thread,
    /// each with at most `depth` batches waiting. Connections are spread over them in
    /// the order they register.
    pub fn sharded(depth: usize, shards: usize) -> (Arc<Self>, Vec<mpsc::Receiver<Inbound>>) {
        let (inbound, rx): (Vec<_>, Vec<_>) = (0..shards.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::sync_channel(depth);
                (Shard { tx, bytes: AtomicUsize::new(0), room: tokio::sync::Notify::new() }, rx)
            })
            .unzip();
        let conns = Self {
            map: RwLock::new(FxHashMap::default()),
            inbound,
            pool: parking_lot::Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            forward: std::sync::OnceLock::new(),
            members: std::sync::OnceLock::new(),
            pinned_udp: AtomicUsize::new(0),
            counters: ConnCounters::default(),
        };
        (Arc::new(conns), rx)
    }

    /// Registers a connection's send queue under `ep` (replacing an older one, whose
    /// queue then closes) and returns its registration id, which the connection
    /// passes to [`Connections::deliver`].
    pub fn register(&self, ep: Endpoint, tx: ConnSender) -> u64 {
        let id = self.next_id.fetch_add(1, Relaxed);
        if self.map.write().insert(ep, Entry { id, tx }).is_none() && ep.proto == Proto::Udp {
            self.pinned_udp.fetch_add(1, Relaxed);
        }
        id
    }

    /// Whether a UDP endpoint is registered (reached from a socket of its own).
    pub fn has_pinned_udp(&self) -> bool {
        self.pinned_udp.load(Relaxed) > 0
    }

    /// Removes the registration `id` of `ep` (a newer one stays).
    pub fn unregister(&self, ep: Endpoint, id: u64) {
        let mut m = self.map.write();
        if m.get(&ep).is_some_and(|e| e.id == id) {
            m.remove(&ep);
            if ep.proto == Proto::Udp {
                self.pinned_udp.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Whether a connection to `ep` is up.
    pub fn contains(&self, ep: &Endpoint) -> bool {
        self.map.read().contains_key(ep)
    }

    /// Live connections.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// Live connections by transport (`tcp`, `ws`, `wss`, `quic`), each named once.
    pub fn by_transport(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = Vec::new();
        for ep in self.map.read().keys() {
            let name = ep.proto.to_string();
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, c)) => *c += 1,
                None => out.push((name, 1)),
            }
        }
        out.sort();
        out
    }

    /// Whether no connection is up.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets `f` relay frames from the connections' readers before their batches are
    /// queued for a connection RX thread (the first call wins). A relay then hands a batch
    /// from one stream connection to the next in the same buffer: the two thread
    /// hand-offs through a connection RX thread were most of a WebSocket relay's cost.
    pub fn set_forward(&self, f: Box<dyn Forward>) {
        let _ = self.forward.set(f);
    }

    /// Lets `f` say whether an endpoint is a member's current path (the first call
    /// wins): what a connection from there may grow (QUIC windows) waits for that.
    pub fn set_members(&self, f: Members) {
        let _ = self.members.set(f);
    }

    /// Whether `ep` is a member's current path: false until [`Connections::set_members`].
    pub fn is_member(&self, ep: &Endpoint) -> bool {
        self.members.get().is_some_and(|f| f(ep))
    }

    /// Queues a framed batch in `lane` of the connection to `to`. Returns the batch
    /// back when there is no such connection, and `Ok(false)` when its queue is full
    /// (dropped).
    pub fn send(&self, to: Endpoint, batch: Vec<u8>, lane: Lane) -> Result<bool, Vec<u8>> {
        // Queued under the read lock (a try_send never waits): no sender clone per batch.
        let map = self.map.read();
        let Some(e) = map.get(&to) else { return Err(batch) };
        match e.tx.try_send(Queued::now(batch), lane) {
            Ok(()) => Ok(true),
            Err(tmpsc::error::TrySendError::Full(_)) => Ok(false),
            Err(tmpsc::error::TrySendError::Closed(q)) => Err(q.batch),
        }
    }

    /// An empty buffer for a received batch (one handed back by [`Connections::recycle`]
    /// when there is one).
    pub fn buffer(&self) -> Vec<u8> {
        self.pool.lock().pop().unwrap_or_default()
    }

    /// Which connection RX thread opens what connection `id` receives.
    pub fn shard(&self, id: u64) -> usize {
        (id % self.inbound.len() as u64) as usize
    }

    /// Takes back a batch connection RX thread `shard` took from its queue and is done with
    /// (its buffer unchanged in size).
    pub fn done(&self, shard: usize, batch: Vec<u8>) {
        if let Some(s) = self.inbound.get(shard) {
            s.bytes.fetch_sub(batch.capacity(), Relaxed);
            s.room.notify_waiters();
        }
        self.recycle(batch);
    }

    /// Bytes waiting for connection RX thread `shard`.
    #[cfg(test)]
    fn waiting(&self, shard: usize) -> usize {
        self.inbound.get(shard).map_or(0, |s| s.bytes.load(Relaxed))
    }

    /// Lends batch buffer `buf` as [`Bytes`](bytes::Bytes) (for a sink that takes
    /// ownership, the WebSocket one); the buffer comes back to the pool when the last
    /// `Bytes` of it is dropped. Dropping it instead emptied the pool on a relay
    /// forwarding to a WebSocket, and every batch paid a fresh allocation and its page
    /// faults.
    pub fn lend(self: &Arc<Self>, buf: Vec<u8>) -> bytes::Bytes {
        bytes::Bytes::from_owner(Lent { buf, conns: self.clone() })
    }

    /// Takes back a batch buffer nobody needs any more.
    pub fn recycle(&self, mut buf: Vec<u8>) {
        if buf.capacity() > POOL_MAX_CAPACITY {
            return;
        }
        buf.clear();
        let mut pool = self.pool.lock();
        if pool.len() < POOL {
            pool.push(buf);
        }
    }

    /// Hands frames received by connection `id` (its registration) on: relayed frames
    /// the [`Forward`] set takes go straight to their next hop; the rest to the
    /// connection's connection RX thread, which hands each batch back with [`Connections::done`]. While that thread is
    /// behind ([`INBOUND_BYTES`] waiting, one batch always may, or as many batches as
    /// the queue holds) it waits for room (counted once) rather than dropping: the
    /// connection's own flow control (TCP, WebSocket, QUIC's record stream) or
    /// quinn's datagram buffer slows the sender or absorbs the burst. Dropping QUIC
    /// datagram batches here made a TCP flow inside lose a window's worth at a time;
    /// a userspace sender (a no-TUN member) then stalled for tens of seconds. False
    /// when the thread is gone.
    pub async fn deliver(&self, id: u64, mut inbound: Inbound) -> bool {
        if let Some(f) = self.forward.get() {
            match f.forward(self, inbound.from, inbound.batch) {
                None => return true,
                Some(rest) => inbound.batch = rest,
            }
        }
        let shard = &self.inbound[self.shard(id)];
        let mut waited = false;
        loop {
            // Created before the attempt: a `done` between the attempt and the wait
            // still wakes it.
            let room = shard.room.notified();
            match self.try_deliver(id, inbound) {
                Ok(()) => return true,
                Err(Some(back)) => {
                    inbound = back;
                    if !waited {
                        waited = true;
                        self.counters.rx_queue_full.fetch_add(1, Relaxed);
                    }
                    // Bounded, so that a reader never waits on a wake-up that will
                    // not come (the thread stops only when the node does).
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), room).await;
                }
                Err(None) => return false,
            }
        }
    }

    /// Queues `inbound` for its thread; gives it back when the thread is behind, or
    /// `None` when the thread is gone.
    fn try_deliver(&self, id: u64, inbound: Inbound) -> Result<(), Option<Inbound>> {
        let shard = &self.inbound[self.shard(id)];
        let cost = inbound.batch.capacity();
        let waiting = shard.bytes.fetch_add(cost, Relaxed);
        if waiting != 0 && waiting + cost > INBOUND_BYTES {
            shard.bytes.fetch_sub(cost, Relaxed);
            return Err(Some(inbound));
        }
        match shard.tx.try_send(inbound) {
            Ok(()) => Ok(()),
            Err(e) => {
                shard.bytes.fetch_sub(cost, Relaxed);
                match e {
                    mpsc::TrySendError::Full(back) => Err(Some(back)),
                    mpsc::TrySendError::Disconnected(_) => Err(None),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Proto;

    #[test]
    fn a_send_queue_that_stands_past_its_target_is_cut_but_never_its_last_batch() {
        let (conns, _rx) = Connections::new(4);
        let (tx, mut q) = ConnQueue::channel(conns.clone());
        // Batches taken as fast as they come: nothing is dropped.
        for i in 0..20u8 {
            tx.try_send(Queued::now(vec![i]), Lane::Bulk).unwrap();
            assert_eq!(q.try_recv(), Some(vec![i]));
        }
        // A backlog that waited a second: CoDel waits one interval before its first drop.
        let old =
            || Queued { batch: vec![7; LINK_SMALL_BATCH], at: Instant::now() - std::time::Duration::from_secs(1) };
        for _ in 0..8 {
            tx.try_send(old(), Lane::Bulk).unwrap();
        }
        for _ in 0..4 {
            assert_eq!(q.try_recv(), Some(vec![7; LINK_SMALL_BATCH]));
        }
        assert_eq!(conns.counters.queue_dropped.load(Relaxed), 0);
        std::thread::sleep(std::time::Duration::from_nanos(LINK_INTERVAL_NS + 10_000_000));
        let mut kept = 0;
        while q.try_recv().is_some() {
            kept += 1;
        }
        let dropped = conns.counters.queue_dropped.load(Relaxed);
        assert!(dropped >= 1 && kept >= 1 && dropped + kept == 4, "dropped {dropped}, kept {kept}");
        // One old batch alone in the queue is never dropped.
        let before = dropped;
        tx.try_send(old(), Lane::Bulk).unwrap();
        assert_eq!(q.try_recv(), Some(vec![7; LINK_SMALL_BATCH]));
        assert_eq!(conns.counters.queue_dropped.load(Relaxed), before);
        // Still standing: small batches (a ping) pass, the drop they were owed falls on
        // the next large one.
        let small = || Queued { batch: vec![1; 100], at: Instant::now() - std::time::Duration::from_secs(1) };
        tx.try_send(small(), Lane::Bulk).unwrap();
        tx.try_send(small(), Lane::Bulk).unwrap();
        assert_eq!(q.try_recv(), Some(vec![1; 100]));
        std::thread::sleep(std::time::Duration::from_nanos(LINK_INTERVAL_NS + 10_000_000));
        for _ in 0..5 {
            tx.try_send(small(), Lane::Bulk).unwrap();
        }
        tx.try_send(old(), Lane::Bulk).unwrap();
        tx.try_send(old(), Lane::Bulk).unwrap();
        for _ in 0..6 {
            assert_eq!(q.try_recv(), Some(vec![1; 100]), "a small batch is never dropped");
        }
        assert_eq!(q.try_recv(), Some(vec![7; LINK_SMALL_BATCH]), "the last batch waiting is kept");
        assert_eq!(q.try_recv(), None);
        assert_eq!(conns.counters.queue_dropped.load(Relaxed), before + 1, "the owed drop fell on a large batch");
    }

    #[test]
    fn sparse_batches_go_first_but_never_starve_the_bulk_lane() {
        let (conns, _rx) = Connections::new(4);
        let (tx, mut q) = ConnQueue::channel(conns);
        // Many flows each under the bulk rate keep the sparse lane full, a download
        // waits in the bulk lane.
        let sparse = 3000;
        for _ in 0..CONN_SPARSE_QUEUE {
            tx.try_send(Queued::now(vec![1; sparse]), Lane::Sparse).unwrap();
        }
        for _ in 0..3 {
            tx.try_send(Queued::now(vec![2; LINK_SMALL_BATCH]), Lane::Bulk).unwrap();
        }
        let order: Vec<u8> = std::iter::from_fn(|| q.try_recv()).map(|b| b[0]).collect();
        let per_quantum = CONN_SPARSE_QUANTUM.div_ceil(sparse);
        assert_eq!(order.len(), CONN_SPARSE_QUEUE + 3);
        assert!(order[..per_quantum].iter().all(|&b| b == 1), "sparse first: {order:?}");
        assert_eq!(order[per_quantum], 2, "then one bulk batch after a quantum of sparse ones: {order:?}");
        assert!(order[per_quantum + 1..2 * per_quantum + 1].iter().all(|&b| b == 1), "{order:?}");
        assert_eq!(order[2 * per_quantum + 1], 2, "{order:?}");
        // The sparse lane empty: its run is over, and a new sparse batch goes first again.
        tx.try_send(Queued::now(vec![2; LINK_SMALL_BATCH]), Lane::Bulk).unwrap();
        tx.try_send(Queued::now(vec![1; sparse]), Lane::Sparse).unwrap();
        assert_eq!(q.try_recv().map(|b| b[0]), Some(1));
        assert_eq!(q.try_recv().map(|b| b[0]), Some(2));
    }

    #[tokio::test]
    async fn a_writer_waiting_for_batches_takes_a_sparse_one_first() {
        let (conns, _rx) = Connections::new(4);
        let (tx, mut q) = ConnQueue::channel(conns.clone());
        for i in 0..4u8 {
            tx.try_send(Queued::now(vec![i; LINK_SMALL_BATCH]), Lane::Bulk).unwrap();
        }
        tx.try_send(Queued::now(vec![7]), Lane::Sparse).unwrap();
        assert_eq!(q.recv().await, Some(vec![7]));
        assert_eq!(q.recv().await, Some(vec![0; LINK_SMALL_BATCH]));
        // Unregistered (the senders gone): what waits still goes out, then the end.
        drop(tx);
        assert_eq!(std::iter::from_fn(|| q.try_recv()).count(), 3);
        assert_eq!(q.recv().await, None);
    }

    #[test]
    fn connections_are_spread_over_the_links_threads_in_turn() {
        let (conns, rx) = Connections::sharded(4, 3);
        assert_eq!(rx.len(), 3);
        let ids: Vec<u64> = (0..6u16)
            .map(|i| {
                let ep = Endpoint::new(Proto::Tcp, std::net::SocketAddr::from(([192, 0, 2, 1], 11010 + i)));
                conns.register(ep, ConnQueue::channel(conns.clone()).0)
            })
            .collect();
        let shards: Vec<usize> = ids.iter().map(|&id| conns.shard(id)).collect();
        for s in 0..3 {
            assert_eq!(shards.iter().filter(|&&x| x == s).count(), 2, "{shards:?}");
        }
        // A connection's batches all reach its thread's queue, in order.
        let ep = Endpoint::new(Proto::Tcp, "192.0.2.9:11010".parse().unwrap());
        for b in 0..3u8 {
            assert!(conns.try_deliver(ids[4], Inbound { from: ep, batch: vec![b] }).is_ok());
        }
        let got: Vec<Vec<u8>> = rx[shards[4]].try_iter().map(|i| i.batch).collect();
        assert_eq!(got, [vec![0], vec![1], vec![2]]);
        for (s, r) in rx.iter().enumerate() {
            if s != shards[4] {
                assert!(r.try_recv().is_err(), "thread {s} got another connection's batch");
            }
        }
        assert_eq!(Connections::sharded(1, 0).1.len(), 1, "at least one thread");
    }

    #[test]
    fn a_links_thread_takes_batches_up_to_its_byte_budget() {
        let (conns, rx) = Connections::sharded(1000, 1);
        let ep = Endpoint::new(Proto::Tcp, "192.0.2.9:11010".parse().unwrap());
        let id = conns.register(ep, ConnQueue::channel(conns.clone()).0);
        let batch = || Inbound { from: ep, batch: Vec::with_capacity(INBOUND_BYTES / 4) };
        let sent = (0..8).filter(|_| conns.try_deliver(id, batch()).is_ok()).count();
        assert_eq!(sent, 4, "a quarter of the budget each");
        // The thread takes one and hands it back: room for one more.
        let b = rx[0].recv().unwrap();
        conns.done(0, b.batch);
        assert!(conns.waiting(0) <= 3 * INBOUND_BYTES / 4 + 64);
        assert!(conns.try_deliver(id, batch()).is_ok());
        assert!(matches!(conns.try_deliver(id, batch()), Err(Some(_))));
        // Drained, a batch larger than the whole budget still goes.
        for b in rx[0].try_iter() {
            conns.done(0, b.batch);
        }
        assert_eq!(conns.waiting(0), 0);
        assert!(conns.try_deliver(id, Inbound { from: ep, batch: Vec::with_capacity(2 * INBOUND_BYTES) }).is_ok());
    }

    #[tokio::test]
    async fn a_reader_waits_for_room_instead_of_dropping() {
        let (conns, rx) = Connections::sharded(1000, 1);
        let ep = Endpoint::new(Proto::Tcp, "192.0.2.9:11010".parse().unwrap());
        let id = conns.register(ep, ConnQueue::channel(conns.clone()).0);
        let batch = move || Inbound { from: ep, batch: Vec::with_capacity(INBOUND_BYTES / 2) };
        assert!(conns.deliver(id, batch()).await);
        assert!(conns.deliver(id, batch()).await);
        let waiting = {
            let conns = conns.clone();
            tokio::spawn(async move { conns.deliver(id, batch()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the budget is full: it waits");
        let b = rx[0].recv().unwrap();
        conns.done(0, b.batch);
        assert!(waiting.await.unwrap(), "room again: delivered");
        assert_eq!(conns.counters.rx_queue_full.load(Relaxed), 1, "one batch waited");
        for b in rx[0].try_iter() {
            conns.done(0, b.batch);
        }
        drop(rx);
        assert!(!conns.deliver(id, batch()).await, "the thread is gone");
    }

    #[test]
    fn registrations_replace_and_unregister_by_id() {
        let (conns, rx) = Connections::new(1);
        let ep = Endpoint::new(Proto::Quic, "192.0.2.1:11012".parse().unwrap());
        let (a, _ra) = ConnQueue::channel(conns.clone());
        let (b, mut rb) = ConnQueue::channel(conns.clone());
        let first = conns.register(ep, a);
        let second = conns.register(ep, b);
        conns.unregister(ep, first);
        assert!(conns.contains(&ep), "an old id does not remove the new connection");
        assert_eq!(conns.send(ep, vec![0, 1, 9], Lane::Bulk), Ok(true));
        assert_eq!(rb.try_recv().unwrap(), vec![0, 1, 9]);
        conns.unregister(ep, second);
        assert_eq!(conns.send(ep, vec![1], Lane::Bulk), Err(vec![1]));
        assert!(conns.try_deliver(second, Inbound { from: ep, batch: vec![] }).is_ok());
        assert!(
            matches!(conns.try_deliver(second, Inbound { from: ep, batch: vec![] }), Err(Some(_))),
            "queue of one is full"
        );
        drop(rx);
        // Batch buffers come back empty, with their room.
        let mut b = conns.buffer();
        b.extend_from_slice(&[1; 1000]);
        let cap = b.capacity();
        conns.recycle(b);
        let again = conns.buffer();
        assert!(again.is_empty() && again.capacity() == cap);
        conns.recycle(Vec::with_capacity(POOL_MAX_CAPACITY + 1));
        assert_eq!(conns.buffer().capacity(), 0, "an oversized buffer is not kept");
    }

    #[test]
    fn a_lent_buffer_returns_to_the_pool_when_its_last_bytes_goes() {
        let (conns, _rx) = Connections::new(1);
        let mut b = conns.buffer();
        b.extend_from_slice(&[7; 3000]);
        let cap = b.capacity();
        let lent = conns.lend(b);
        let view = lent.slice(10..20);
        drop(lent);
        assert_eq!(conns.buffer().capacity(), 0, "still lent: a slice of it lives");
        assert_eq!(&view[..], &[7; 10]);
        drop(view);
        let again = conns.buffer();
        assert!(again.is_empty() && again.capacity() == cap, "back, emptied, with its room");
    }
}
