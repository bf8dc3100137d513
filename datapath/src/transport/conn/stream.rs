//! Stream connections: TCP and WebSocket (over TCP or TLS): accepting, framing (length
//! prefixes, or one frame per WebSocket message) and running each connection.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout_at};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{debug, warn};

use super::slots::{Proof, Slots};
use super::{
    Connector, HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, MAX_WS_MESSAGE, STALL_TIMEOUT, STREAM_RX, WS_RUN, WS_RUN_BYTES,
};
use super::{Endpoint, Proto, frame};
use crate::transport::connections::Inbound;

impl Connector {
    pub(super) async fn accept_tcp(self, proto: Proto, listener: TcpListener) {
        let slots = Slots::new(self.inner.max_connections);
        let counters = &self.inner.conns.counters;
        loop {
            let (stream, from) = match listener.accept().await {
                // An IPv4 client of a dual-stack listener is the IPv4 address it is.
                Ok((s, from)) => (s, crate::transport::canonical(from)),
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (permit, place) = match slots.take(from.ip()) {
                Ok(p) => p,
                Err(refused) => {
                    refused.count(counters);
                    debug!(%from, ?refused, "connection refused");
                    continue;
                }
            };
            counters.accepted.fetch_add(1, Relaxed);
            let me = self.clone();
            tokio::spawn(async move {
                let ep = Endpoint::new(proto, from);
                me.remember_accepted(ep);
                let proof = Proof::accepted(place, me.inner.macs.clone());
                let r = me.serve_accepted(proto, stream, ep, proof).await;
                me.closed(ep, r);
                drop(permit);
            });
        }
    }

    pub(super) async fn serve_accepted(
        &self,
        proto: Proto,
        stream: TcpStream,
        ep: Endpoint,
        proof: Proof,
    ) -> Result<(), String> {
        super::short_send_buffer(&stream);
        match proto {
            Proto::Tcp => self.run_stream(stream, ep, proof).await,
            Proto::Ws => {
                let ws = self.ws_accept(stream).await?;
                self.run_ws(ws, ep, proof).await
            }
            Proto::Wss => {
                let tls = self.inner.server_tls.clone().ok_or("no certificate")?;
                let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                let tls = self.handshake(acceptor.accept(stream)).await.map_err(|e| format!("TLS: {e}"))?;
                let ws = self.ws_accept(tls).await?;
                self.run_ws(ws, ep, proof).await
            }
            Proto::Udp | Proto::Quic => Err("not a stream transport".into()),
        }
    }

    pub(super) async fn ws_accept<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: S,
    ) -> Result<WebSocketStream<S>, String> {
        let accept = tokio_tungstenite::accept_async_with_config(s, Some(ws_config()));
        self.handshake(accept).await.map_err(|e| format!("WebSocket: {e}"))
    }

    /// A TCP connection: length-framed batches both ways.
    pub(super) async fn run_stream<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: S,
        ep: Endpoint,
        proof: Proof,
    ) -> Result<(), String> {
        let accepted = proof.is_accepted();
        let (mut r, mut w) = tokio::io::split(s);
        let (mut queue, id) = self.register(ep, !accepted);
        let writer = async {
            while let Some(batch) = queue.recv().await {
                w.write_all(&batch).await.map_err(|e| e.to_string())?;
                self.inner.conns.recycle(batch);
            }
            Ok::<(), String>(())
        };
        let counters = &self.inner.conns.counters;
        let reader = async {
            let mut batch = self.stream_batch();
            let mut first = accepted;
            // Total deadlines: the first frame's from the accept, a partial frame's from
            // its first byte; reads do not extend them. `None`: idle between frames.
            let mut deadline = first.then(|| Instant::now() + HANDSHAKE_TIMEOUT);
            loop {
                let until = deadline.unwrap_or_else(|| Instant::now() + IDLE_TIMEOUT);
                match timeout_at(until, r.read_buf(&mut batch)).await {
                    Ok(Ok(0)) => return Ok(()),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(e.to_string()),
                    Err(_) => {
                        counters.timeouts.fetch_add(1, Relaxed);
                        return Err(if first {
                            format!("no whole frame within {} s", HANDSHAKE_TIMEOUT.as_secs())
                        } else if !batch.is_empty() {
                            format!("frame not complete within {} s", STALL_TIMEOUT.as_secs())
                        } else {
                            format!("nothing received for {} s", IDLE_TIMEOUT.as_secs())
                        });
                    }
                };
                let used = frame::complete_prefix(&batch).map_err(|e| {
                    counters.protocol_errors.fetch_add(1, Relaxed);
                    format!("not a weft stream: {e}")
                })?;
                if used > 0 {
                    first = false;
                    proof.check(&batch[..used]);
                    self.deliver_frames(id, ep, &mut batch, used).await?;
                }
                deadline = if first {
                    deadline
                } else if batch.is_empty() {
                    None
                } else if used > 0 || deadline.is_none() {
                    // A new frame started arriving.
                    Some(Instant::now() + STALL_TIMEOUT)
                } else {
                    deadline
                };
            }
        };
        let r = tokio::select! {
            r = writer => r,
            r = reader => r,
            why = proof.expired() => {
                counters.unproven_closed.fetch_add(1, Relaxed);
                Err(why)
            }
        };
        self.inner.conns.unregister(ep, id);
        r
    }

    /// A WebSocket connection: each binary message is a framed batch.
    pub(super) async fn run_ws<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        ws: WebSocketStream<S>,
        ep: Endpoint,
        proof: Proof,
    ) -> Result<(), String> {
        let accepted = proof.is_accepted();
        let (mut sink, mut stream) = ws.split();
        let (mut queue, id) = self.register(ep, !accepted);
        let writer = async {
            while let Some(batch) = queue.recv().await {
                // Up to WS_RUN batches (WS_RUN_BYTES) already queued behind this one go
                // out with it: tungstenite gathers messages in its write buffer and
                // writes once per 128 KiB, then one flush for the run.
                let (mut next, mut fed, mut bytes) = (Some(batch), 0, 0);
                while let Some(b) = next.take() {
                    bytes += b.len();
                    sink.feed(Message::Binary(self.inner.conns.lend(b))).await.map_err(|e| e.to_string())?;
                    fed += 1;
                    next = if fed < WS_RUN && bytes < WS_RUN_BYTES { queue.try_recv() } else { None };
                }
                sink.flush().await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        };
        let counters = &self.inner.conns.counters;
        let reader = async {
            let mut first = accepted;
            // Only binary messages move the deadline: pings and pongs never do.
            let mut deadline = Instant::now() + if first { HANDSHAKE_TIMEOUT } else { IDLE_TIMEOUT };
            loop {
                let msg = match timeout_at(deadline, stream.next()).await {
                    Ok(Some(Ok(m))) => m,
                    Ok(None) => return Ok(()),
                    Ok(Some(Err(e))) => {
                        counters.protocol_errors.fetch_add(1, Relaxed);
                        return Err(format!("WebSocket: {e}"));
                    }
                    Err(_) => {
                        counters.timeouts.fetch_add(1, Relaxed);
                        return Err(if first {
                            format!("no whole frame within {} s", HANDSHAKE_TIMEOUT.as_secs())
                        } else {
                            format!("nothing received for {} s", IDLE_TIMEOUT.as_secs())
                        });
                    }
                };
                match msg {
                    Message::Binary(b) => {
                        if frame::frames(&b).any(|f| f.is_err()) {
                            counters.protocol_errors.fetch_add(1, Relaxed);
                            return Err("not a weft stream: malformed batch".into());
                        }
                        first = false;
                        deadline = Instant::now() + IDLE_TIMEOUT;
                        proof.check(&b);
                        let mut batch = self.inner.conns.buffer();
                        batch.extend_from_slice(&b);
                        if !self.inner.conns.deliver(id, Inbound { from: ep, batch }).await {
                            return Err("the connection RX thread stopped".into());
                        }
                    }
                    Message::Ping(_) | Message::Pong(_) => {}
                    Message::Close(_) => return Ok(()),
                    Message::Text(_) | Message::Frame(_) => {
                        counters.protocol_errors.fetch_add(1, Relaxed);
                        return Err("not a weft stream: text message".into());
                    }
                }
            }
        };
        let r = tokio::select! {
            r = writer => r,
            r = reader => r,
            why = proof.expired() => {
                counters.unproven_closed.fetch_add(1, Relaxed);
                Err(why)
            }
        };
        self.inner.conns.unregister(ep, id);
        r
    }

    /// A pooled batch buffer with room for [`STREAM_RX`] bytes, into which a stream
    /// reader reads (no zeroing: `read_buf` fills the spare capacity).
    pub(super) fn stream_batch(&self) -> Vec<u8> {
        let mut batch = self.inner.conns.buffer();
        batch.reserve_exact(STREAM_RX);
        batch
    }

    /// Hands the `used` bytes of whole frames at the start of `batch`, read from a
    /// stream of connection `id`, to the connection RX (waiting for room) in that buffer:
    /// only what follows them (a frame still arriving, at most one) is copied, into a
    /// fresh batch that takes its place.
    pub(super) async fn deliver_frames(
        &self,
        id: u64,
        ep: Endpoint,
        batch: &mut Vec<u8>,
        used: usize,
    ) -> Result<(), String> {
        let mut next = self.stream_batch();
        next.extend_from_slice(&batch[used..]);
        batch.truncate(used);
        let whole = std::mem::replace(batch, next);
        if !self.inner.conns.deliver(id, Inbound { from: ep, batch: whole }).await {
            return Err("the connection RX thread stopped".into());
        }
        Ok(())
    }
}

/// A TCP listener on `addr`; `[::]` takes IPv4 clients too, whatever
/// `net.ipv6.bindv6only` says.
pub(super) fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    s.set_reuse_address(true)?;
    // Accepted connections answer with the listener's mark: without it, a node using
    // an exit would send its SYN-ACKs into the tunnel.
    crate::transport::mark_socket(&s)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    TcpListener::from_std(s.into())
}

pub(super) fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().max_message_size(Some(MAX_WS_MESSAGE)).max_frame_size(Some(MAX_WS_MESSAGE))
}
