//! QUIC connections (quinn): endpoints, accepting, and running a connection: frames as
//! QUIC datagrams (fragmented when they do not fit), GSO records on a stream.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::io::AsyncReadExt;
use tokio::time::{Instant, timeout_at};

use super::fragment::{MalformedDatagram, Reassembly, fragment};
use super::slots::{Proof, Slots};
use super::{
    ConnError, Connector, HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, LEND_MIN, QUIC_ALPN, QUIC_BATCH, QUIC_TUNE_EVERY,
    QUIC_WINDOW_MAX, QUIC_WINDOW_MIN, QUIC_WINDOW_RATE, STALL_TIMEOUT,
};
use super::{Endpoint, Proto, frame};
use crate::transport::connections::Inbound;

impl Connector {
    pub(super) fn quic_server(&self) -> Result<quinn::ServerConfig, ConnError> {
        let Some(tls) = &self.inner.server_tls else {
            return Err(ConnError::Tls("a quic:// listener needs a certificate".into()));
        };
        let mut tls = (**tls).clone();
        tls.alpn_protocols = vec![QUIC_ALPN.to_vec()];
        let crypto =
            quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| ConnError::Tls(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        server.transport_config(Arc::new(quic_transport()));
        Ok(server)
    }

    /// The QUIC endpoint: the listener's socket when there is one (so peers see our
    /// listening port), else a client-only one bound on first use.
    pub(super) fn quic_endpoint(&self) -> io::Result<quinn::Endpoint> {
        let mut q = self.inner.quic.lock();
        if let Some(e) = &*q {
            return Ok(e.clone());
        }
        let mut e = quic_endpoint(SocketAddr::from(([0, 0, 0, 0], 0)), None)?;
        e.set_default_client_config(self.inner.quic_client.clone());
        *q = Some(e.clone());
        Ok(e)
    }

    pub(super) async fn accept_quic(self, endpoint: quinn::Endpoint) {
        let slots = Slots::new(self.inner.max_connections);
        while let Some(incoming) = endpoint.accept().await {
            let (permit, place) = match slots.take(incoming.remote_address().ip()) {
                Ok(p) => p,
                Err(refused) => {
                    refused.count(&self.inner.conns.counters);
                    incoming.refuse();
                    continue;
                }
            };
            let me = self.clone();
            let proof = Proof::accepted(place, self.inner.macs.clone());
            tokio::spawn(async move {
                // Not remembered as accepted: a peer dials from its listening socket,
                // so this address may be exactly where it can be dialled back.
                let ep = Endpoint::new(Proto::Quic, crate::transport::canonical(incoming.remote_address()));
                let r = match me.handshake(async { incoming.accept()?.await }).await {
                    Ok(conn) => {
                        me.inner.conns.counters.accepted.fetch_add(1, Relaxed);
                        me.run_quic(conn, ep, proof).await
                    }
                    Err(e) => Err(format!("QUIC: {e}")),
                };
                me.closed(ep, r);
                drop(permit);
            });
        }
    }

    /// A QUIC connection: each frame is a datagram, split in fragments when the path
    /// cannot carry it whole (frames are at most the tunnel MTU plus headers, a
    /// little over what QUIC fits in a 1500-byte packet) — except GSO records
    /// ([`weft_core::wire::FLAG_GSO`], up to 64 KiB, sent only to peers whose hello takes
    /// them over QUIC), which go on one unidirectional stream per direction, framed as
    /// on TCP, so that quinn packs them into full packets, and the TCP segments that
    /// must stay behind them ([`weft_core::wire::FLAG_ORDERED`]; see [`on_quic_stream`]).
    pub(super) async fn run_quic(&self, conn: quinn::Connection, ep: Endpoint, proof: Proof) -> Result<(), String> {
        let accepted = proof.is_accepted();
        let (queue, id) = self.register(ep, !accepted);
        // When the stream last brought a whole frame (ms after `base`, plus one; 0:
        // never): it keeps the connection from being idle too.
        let seen = StreamSeen { base: Instant::now(), ms: std::sync::atomic::AtomicU64::new(0) };
        let tuner = async {
            let mut windows = QUIC_WINDOW_MIN;
            while conn.close_reason().is_none() {
                tokio::time::sleep(QUIC_TUNE_EVERY).await;
                windows = tune_quic_windows(&conn, windows, self.inner.conns.is_member(&ep));
            }
            Ok(())
        };
        let r = tokio::select! {
            r = self.quic_writer(&conn, queue) => r,
            r = self.quic_reader(&conn, ep, id, &proof, &seen) => r,
            r = self.quic_stream_reader(&conn, ep, id, &proof, &seen) => r,
            r = tuner => r,
            why = proof.expired() => {
                self.inner.conns.counters.unproven_closed.fetch_add(1, Relaxed);
                conn.close(3u32.into(), b"unproven");
                Err(why)
            }
        };
        self.inner.conns.unregister(ep, id);
        conn.close(0u32.into(), b"");
        r
    }

    /// Sends what the pipelines queue for this connection: frames as datagrams
    /// (fragmented when they do not fit), GSO records and the TCP segments kept behind
    /// them on one stream. While a stream write waits (for the peer's flow-control
    /// credit, or quinn's send buffer), the sparse lane's frames still leave as
    /// datagrams ([`Connector::beside_stream_write`]).
    async fn quic_writer(
        &self,
        conn: &quinn::Connection,
        mut queue: crate::transport::connections::ConnQueue,
    ) -> Result<(), String> {
        let mut next_id: u16 = 0;
        let mut stream: Option<quinn::SendStream> = None;
        let mut records = Vec::new();
        // What a stream write is writing while `records` gathers what comes next.
        let mut writing = Vec::new();
        while let Some(batch) = queue.recv().await {
            // A large batch of stream frames alone goes as it is, lent rather than
            // copied: quinn keeps it until the peer acknowledges it, then it returns
            // to the pool. Decided before any frame is copied (reading headers only).
            // A small one (a lone ordered segment) is copied below: it would hold a
            // whole pooled buffer for a round trip.
            if batch.len() >= LEND_MIN && frame::frames(&batch).flatten().all(on_quic_stream) {
                if stream.is_none() {
                    stream = Some(conn.open_uni().await.map_err(|e| e.to_string())?);
                }
                if let Some(s) = &mut stream {
                    let write = async { s.write_chunk(self.inner.conns.lend(batch)).await.map_err(|e| e.to_string()) };
                    self.beside_stream_write(conn, &mut queue, write, &mut records, &mut next_id).await?;
                }
            } else {
                self.send_datagrams(conn, batch, &mut records, &mut next_id)?;
            }
            // Stream frames copied above or taken from the sparse lane meanwhile,
            // in the order they came.
            while !records.is_empty() {
                if stream.is_none() {
                    stream = Some(conn.open_uni().await.map_err(|e| e.to_string())?);
                }
                let Some(s) = &mut stream else { break };
                std::mem::swap(&mut records, &mut writing);
                let write = async { s.write_all(&writing).await.map_err(|e| e.to_string()) };
                self.beside_stream_write(conn, &mut queue, write, &mut records, &mut next_id).await?;
                writing.clear();
            }
        }
        Ok(())
    }

    /// Sends `batch`'s frames as datagrams (fragmented when they do not fit) and
    /// appends those that go on the stream to `records`; the batch's buffer goes
    /// back to the pool.
    fn send_datagrams(
        &self,
        conn: &quinn::Connection,
        batch: Vec<u8>,
        records: &mut Vec<u8>,
        next_id: &mut u16,
    ) -> Result<(), String> {
        let max = conn.max_datagram_size().ok_or("peer does not accept QUIC datagrams")?;
        for f in frame::frames(&batch).flatten() {
            if on_quic_stream(f) {
                frame::push(records, f);
                continue;
            }
            let parts = fragment(f, max, *next_id);
            if parts.len() > 1 {
                self.inner.conns.counters.quic_fragmented.fetch_add(1, Relaxed);
            }
            for d in parts {
                // A full send buffer drops the oldest datagrams: loss, as on UDP.
                conn.send_datagram(d).map_err(|e| e.to_string())?;
            }
            *next_id = next_id.wrapping_add(1);
        }
        self.inner.conns.recycle(batch);
        Ok(())
    }

    /// Awaits `write`, a write to the connection's stream — which waits while the
    /// peer's flow-control window or quinn's send buffer is full, as it is most of
    /// the time beside a download — and meanwhile sends the sparse lane's batches as
    /// datagrams: a ping does not wait for a download's credit. Stream frames among
    /// them go to `records`, to be written after `write`, in order.
    async fn beside_stream_write(
        &self,
        conn: &quinn::Connection,
        queue: &mut crate::transport::connections::ConnQueue,
        write: impl Future<Output = Result<(), String>>,
        records: &mut Vec<u8>,
        next_id: &mut u16,
    ) -> Result<(), String> {
        tokio::pin!(write);
        let mut sparse_open = true;
        loop {
            tokio::select! {
                biased;
                r = &mut write => return r,
                b = queue.recv_sparse(), if sparse_open => match b {
                    Some(batch) => self.send_datagrams(conn, batch, records, next_id)?,
                    None => sparse_open = false,
                },
            }
        }
    }

    /// Reads the peer's datagrams, reassembles frames and hands them to the connection RX
    /// thread in batches; closes the connection when it stays silent.
    async fn quic_reader(
        &self,
        conn: &quinn::Connection,
        ep: Endpoint,
        id: u64,
        proof: &Proof,
        seen: &StreamSeen,
    ) -> Result<(), String> {
        let accepted = proof.is_accepted();
        let counters = &self.inner.conns.counters;
        let mut reasm = Reassembly::default();
        // Like streams: an accepted connection's first whole frame within
        // HANDSHAKE_TIMEOUT, then a whole frame at least every IDLE_TIMEOUT. QUIC's
        // own keepalives and stray fragments do not count.
        let mut first = accepted;
        let mut deadline = Instant::now() + if first { HANDSHAKE_TIMEOUT } else { IDLE_TIMEOUT };
        loop {
            // One wakeup takes every datagram already there, up to a batch, so the
            // connection RX thread gets batches rather than single frames.
            let Ok(d) = timeout_at(deadline, conn.read_datagram()).await else {
                let seen_ms = seen.ms.load(Relaxed);
                let last = seen.base + Duration::from_millis(seen_ms.saturating_sub(1));
                if seen_ms > 0 && last + IDLE_TIMEOUT > Instant::now() {
                    first = false;
                    deadline = last + IDLE_TIMEOUT;
                    continue;
                }
                counters.timeouts.fetch_add(1, Relaxed);
                conn.close(2u32.into(), b"timeout");
                return Err(if first {
                    format!("no whole frame within {} s", HANDSHAKE_TIMEOUT.as_secs())
                } else {
                    format!("nothing received for {} s", IDLE_TIMEOUT.as_secs())
                });
            };
            let mut batch = self.inner.conns.buffer();
            let mut next = Some(d);
            while let Some(d) = next.take() {
                let d = d.map_err(|e| e.to_string())?;
                match reasm.push(&d, self.inner.mtu) {
                    Ok(Some(f)) => {
                        frame::push(&mut batch, &f);
                    }
                    Ok(None) => {}
                    Err(MalformedDatagram) => {
                        counters.protocol_errors.fetch_add(1, Relaxed);
                        conn.close(1u32.into(), b"malformed datagram");
                        return Err("not a weft connection: malformed datagram".into());
                    }
                }
                if batch.len() < QUIC_BATCH {
                    next = conn.read_datagram().now_or_never();
                }
            }
            if batch.is_empty() {
                self.inner.conns.recycle(batch);
            } else {
                first = false;
                deadline = Instant::now() + IDLE_TIMEOUT;
                proof.check(&batch);
                if !self.inner.conns.deliver(id, Inbound { from: ep, batch }).await {
                    return Err("the connection RX thread stopped".into());
                }
            }
        }
    }

    /// The peer's stream of GSO records and the TCP segments kept behind them (at most
    /// one stream open at a time), read like a TCP connection: whole frames go to the
    /// connection RX in batches.
    async fn quic_stream_reader(
        &self,
        conn: &quinn::Connection,
        ep: Endpoint,
        id: u64,
        proof: &Proof,
        seen: &StreamSeen,
    ) -> Result<(), String> {
        let counters = &self.inner.conns.counters;
        // Taken when the peer opens a stream, not for every connection.
        let mut batch = Vec::new();
        loop {
            let mut r = conn.accept_uni().await.map_err(|e| e.to_string())?;
            if batch.capacity() == 0 {
                batch = self.stream_batch();
            }
            // As on TCP: a frame that started arriving must be whole within
            // STALL_TIMEOUT of its first byte (its reads do not extend that).
            let mut stall: Option<Instant> = None;
            loop {
                let read = r.read_buf(&mut batch);
                let got = match stall {
                    Some(at) => timeout_at(at, read).await.map_err(|_| {
                        counters.timeouts.fetch_add(1, Relaxed);
                        conn.close(2u32.into(), b"timeout");
                        format!("frame not complete within {} s", STALL_TIMEOUT.as_secs())
                    })?,
                    None => read.await,
                };
                let n = got.map_err(|e| e.to_string())?;
                if n == 0 {
                    if !batch.is_empty() {
                        counters.protocol_errors.fetch_add(1, Relaxed);
                        conn.close(1u32.into(), b"malformed stream");
                        return Err("not a weft stream: it ended inside a frame".into());
                    }
                    break;
                }
                let used = frame::complete_prefix(&batch).map_err(|e| {
                    counters.protocol_errors.fetch_add(1, Relaxed);
                    conn.close(1u32.into(), b"malformed stream");
                    format!("not a weft stream: {e}")
                })?;
                if used > 0 {
                    proof.check(&batch[..used]);
                    self.deliver_frames(id, ep, &mut batch, used).await?;
                    let ms = u64::try_from(seen.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
                    seen.ms.store(ms + 1, Relaxed);
                }
                stall = if batch.is_empty() {
                    None
                } else if used > 0 || stall.is_none() {
                    Some(Instant::now() + STALL_TIMEOUT)
                } else {
                    stall
                };
            }
        }
    }
}

/// The flow-control window for a path whose minimum round trip is `min_rtt`: what
/// [`QUIC_WINDOW_RATE`] moves in one round trip, within [`QUIC_WINDOW_MIN`] and
/// [`QUIC_WINDOW_MAX`]. The minimum, not the smoothed round trip: a receiver that
/// falls behind queues, which lengthens the smoothed one, which would widen the
/// window, which lets it queue more.
pub(super) fn quic_window(min_rtt: Duration) -> u32 {
    let micros = u64::try_from(min_rtt.as_micros()).unwrap_or(u64::MAX);
    let bytes = micros.saturating_mul(QUIC_WINDOW_RATE) / 1_000_000;
    u32::try_from(bytes.clamp(u64::from(QUIC_WINDOW_MIN), u64::from(QUIC_WINDOW_MAX))).unwrap_or(QUIC_WINDOW_MAX)
}

/// Sets `conn`'s receive and send windows for its path's minimum round trip when
/// that differs from `current` (the windows it has); returns the windows it now has.
/// Only a `member` (a peer that proved the secret on this path) gets more than the
/// least: anyone can finish a QUIC handshake and delay its own acknowledgements.
pub(super) fn tune_quic_windows(conn: &quinn::Connection, current: u32, member: bool) -> u32 {
    let want = if member { quic_window(conn.stats().path.min_rtt) } else { QUIC_WINDOW_MIN };
    if want != current {
        conn.set_receive_window(quinn::VarInt::from_u32(want));
        conn.set_send_window(u64::from(want));
    }
    want
}

/// Whether a frame goes on a QUIC connection's stream: a GSO record, or a TCP segment
/// that must stay behind the records sent before it ([`weft_core::wire::FLAG_ORDERED`]).
/// Everything else is a datagram.
pub fn on_quic_stream(f: &[u8]) -> bool {
    use weft_core::wire::{DataHeader, FLAG_GSO, FLAG_ORDERED};
    DataHeader::parse(f).is_ok_and(|h| h.flags & (FLAG_GSO | FLAG_ORDERED) != 0)
}

/// A quinn endpoint on a UDP socket with large buffers: quinn drains its socket from
/// the tokio workers, slower than a pipeline thread drains its own, and the kernel's
/// default receive buffer overflowed at a few hundred Mbit/s (bench/RESULTS.md §6).
pub(super) fn quic_endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> io::Result<quinn::Endpoint> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, None)?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    crate::transport::udp::grow_buffers(&s);
    crate::transport::mark_socket(&s)?;
    s.bind(&addr.into())?;
    let runtime = quinn::default_runtime().ok_or_else(|| io::Error::other("no async runtime for QUIC"))?;
    let socket = Arc::new(FewBatches(runtime.wrap_udp_socket(s.into())?));
    quinn::Endpoint::new_with_abstract_socket(quinn::EndpointConfig::default(), server, socket, runtime)
}

/// GRO batches quinn's endpoint reads from its socket in one call.
pub(super) const QUIC_RECV_BATCHES: usize = 4;

/// quinn's socket with at most [`QUIC_RECV_BATCHES`] GRO batches per read. quinn
/// offers its socket 32 slots of up to 64 KiB each (`quinn_udp::BATCH_SIZE`), and a
/// busy endpoint filled them all: 2 MiB of the node's resident memory for the space
/// of one read, where four slots (256 KiB) carry a few Gbit/s with one more system
/// call per 256 KiB. The buffer is allocated zeroed and whole, so the slots never
/// offered are never touched and never become resident.
#[derive(Debug)]
pub(super) struct FewBatches(Arc<dyn quinn::AsyncUdpSocket>);

impl quinn::AsyncUdpSocket for FewBatches {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn quinn::UdpPoller>> {
        self.0.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> io::Result<()> {
        self.0.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<io::Result<usize>> {
        let n = bufs.len().min(meta.len()).min(QUIC_RECV_BATCHES);
        self.0.poll_recv(cx, &mut bufs[..n], &mut meta[..n])
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.0.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.0.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.0.may_fragment()
    }
}

pub(super) fn quic_transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    // One unidirectional stream each way, for GSO records; its windows bound what a
    // connection buffers (quinn's defaults allow ~10 MB in flight per stream).
    t.max_concurrent_bidi_streams(0u32.into())
        .max_concurrent_uni_streams(1u32.into())
        // The stream may take the largest window; the connection's windows, which
        // bound it, start at the least and follow the path (`tune_quic_windows`).
        .stream_receive_window(quinn::VarInt::from_u32(QUIC_WINDOW_MAX))
        .receive_window(quinn::VarInt::from_u32(QUIC_WINDOW_MIN))
        .send_window(u64::from(QUIC_WINDOW_MIN))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(IDLE_TIMEOUT).unwrap_or_else(|_| quinn::VarInt::MAX.into()),
        ))
        .datagram_receive_buffer_size(Some(8 << 20))
        .datagram_send_buffer_size(8 << 20)
        // The tunnel's own TCP already reacts to loss; a loss-based controller on top
        // halves the window again for every random drop (bench/RESULTS.md §6).
        .congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()));
    t
}

/// When a QUIC connection's stream last brought a whole frame: ms after `base`, plus
/// one (0: never).
pub(super) struct StreamSeen {
    base: Instant,
    ms: std::sync::atomic::AtomicU64,
}
