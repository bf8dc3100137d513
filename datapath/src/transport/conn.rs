//! The connection transports: TCP, WebSocket (plain and TLS) and QUIC, as listeners
//! and dialled connections on the node's tokio runtime.
//!
//! Each live connection is registered in [`Links`] under its [`Endpoint`] with a
//! bounded queue of framed batches; a writer task drains the queue (one `write_all`,
//! one WebSocket message, or a run of QUIC datagrams per batch) and a reader task
//! hands what arrives to the links RX thread. Frames are sealed end to end by the
//! sessions above, so TLS here only disguises the traffic as HTTPS: certificates are
//! not checked (a self-signed one is fine), the Noise handshake authenticates peers.
//!
//! Hostile or broken peers cost little. A listener holds at most `max_connections`
//! connections, and at most [`per_source_limit`] of them from one source (an IPv4
//! address or an IPv6 /48), so one address cannot take every slot. Every deadline is
//! total, never per read, so a peer that trickles a byte now and then gains nothing:
//! TLS, WebSocket and QUIC handshakes must finish within [`HANDSHAKE_TIMEOUT`]; an
//! accepted connection (TCP, WebSocket or QUIC) must then deliver a whole first frame
//! within the same time; on TCP and on QUIC's record stream a frame that started
//! arriving must be complete within [`STALL_TIMEOUT`]; a connection closes when no
//! whole frame (or WebSocket message, or QUIC frame) arrived for [`IDLE_TIMEOUT`] —
//! WebSocket pings and pongs and QUIC's own keepalives extend none of these. Anything
//! that is not our framing (a record stream that ends inside a frame too) closes the
//! connection. Every refusal and close is counted in [`LinkCounters`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, SinkExt, StreamExt};
use parking_lot::Mutex;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, timeout_at};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{debug, warn};

use super::links::{Inbound, LINK_QUEUE, LinkCounters, Links};
use super::{Endpoint, Proto, frame};

/// TLS, WebSocket and QUIC handshakes and TCP connects must finish within this, and
/// an accepted connection must deliver its first whole frame within this after that
/// (a total deadline, not one per read).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A frame that started arriving on a TCP stream (or QUIC's record stream) must be
/// complete within this (total, from its first byte).
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection on which no whole frame arrives for this long closes (sessions send
/// keepalives every few seconds on the path they use; WebSocket pings and QUIC
/// keepalives do not count).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Most connections one source may hold on a listener, whatever the limit.
pub const PER_SOURCE_MAX: usize = 8;
/// Accepted connections' remote ends remembered so that they are never dialled.
const ACCEPTED_MEMORY: usize = 4096;
/// Frames queued for a connection that is still being dialled.
const DIAL_QUEUE: usize = 32;
/// Largest WebSocket message accepted (a batch of frames).
const MAX_WS_MESSAGE: usize = 1 << 20;
/// Most queued batches a WebSocket writer sends before it flushes.
const WS_RUN: usize = 8;
/// Room of a stream connection's receive batch: two of the largest frames, so that
/// behind the part of a frame still arriving there is always room for a whole one.
const STREAM_RX: usize = 2 * (frame::PREFIX + frame::MAX_FRAME);
/// The least a batch of QUIC stream frames holds to be lent to quinn whole instead of
/// copied (a GSO record is larger).
const LEND_MIN: usize = 16 * 1024;
/// Bytes of received QUIC frames handed to the links RX thread at once.
const QUIC_BATCH: usize = 64 * 1024;
/// Flow-control windows of a QUIC connection (what the peer may send before we have
/// read it, what we keep of our own unacknowledged stream data), each way: the least,
/// which a short path keeps. On a short path a window only fills when the reader
/// falls behind, and then all of it is resident memory; 1 MiB kept the full rate
/// between two namespaces (bench/RESULTS.md §23).
const QUIC_WINDOW_MIN: u32 = 1 << 20;
/// The most a long path's windows grow to (at 50 ms, 1.3 Gbit/s for the record stream).
const QUIC_WINDOW_MAX: u32 = 8 << 20;
/// The rate the windows are sized for, bytes a second (4 Gbit/s): a window is the
/// path's minimum round trip times this, within [`QUIC_WINDOW_MIN`, `QUIC_WINDOW_MAX`].
const QUIC_WINDOW_RATE: u64 = 500_000_000;
/// How often a connection's windows follow its minimum round trip.
const QUIC_TUNE_EVERY: Duration = Duration::from_secs(1);
/// ALPN of QUIC connections.
const QUIC_ALPN: &[u8] = b"weft";

/// What went wrong setting up the transports.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// A socket could not be bound.
    #[error("cannot listen on {0}: {1}")]
    Bind(Endpoint, io::Error),
    /// The certificate or key is unusable.
    #[error("TLS certificate or key rejected: {0}")]
    Tls(String),
}

/// A certificate chain and its key, for the TLS of `wss://` and QUIC listeners.
#[derive(Debug)]
pub struct TlsIdentity {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
}

/// A connection's end, reported to the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkDown {
    /// The connection.
    pub endpoint: Endpoint,
    /// Why it ended or never started.
    pub error: String,
}

/// Opens and accepts connections; cheap to clone.
#[derive(Clone)]
pub struct Connector {
    inner: Arc<Inner>,
}

struct Inner {
    links: Arc<Links>,
    down: mpsc::Sender<LinkDown>,
    client_tls: Arc<rustls::ClientConfig>,
    server_tls: Option<Arc<rustls::ServerConfig>>,
    quic_client: quinn::ClientConfig,
    quic: Mutex<Option<quinn::Endpoint>>,
    /// Frames waiting for a connection being dialled.
    dialling: Mutex<HashMap<Endpoint, Vec<Vec<u8>>>>,
    /// Request paths of `ws://` and `wss://` endpoints (default `/`).
    paths: Mutex<HashMap<Endpoint, String>>,
    /// Remote ends of TCP connections others opened to us (never dialled: an
    /// ephemeral port), the most recent [`ACCEPTED_MEMORY`].
    accepted: Mutex<(HashSet<Endpoint>, VecDeque<Endpoint>)>,
    max_connections: usize,
    mtu: usize,
    /// Accept loops of the listeners, by bound endpoint (closed by aborting them,
    /// which drops a TCP socket; a QUIC one stops accepting and stays for the
    /// connections on it).
    listeners: Mutex<HashMap<Endpoint, tokio::task::AbortHandle>>,
}

impl Connector {
    /// A connector whose connections register in `links` and report their end on
    /// `down`. `tls` is needed for `wss://` and `quic://` listeners; `mtu` is the
    /// largest frame the pipelines produce.
    pub fn new(
        links: Arc<Links>,
        down: mpsc::Sender<LinkDown>,
        tls: Option<TlsIdentity>,
        max_connections: usize,
        mtu: usize,
    ) -> Result<Self, ConnError> {
        let provider = Arc::new(transport_crypto());
        let client_tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| ConnError::Tls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider.clone())))
            .with_no_client_auth();
        let server_tls = match tls {
            Some(id) => Some(
                rustls::ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map_err(|e| ConnError::Tls(e.to_string()))?
                    .with_no_client_auth()
                    .with_single_cert(id.chain, id.key)
                    .map_err(|e| ConnError::Tls(e.to_string()))?,
            ),
            None => None,
        };
        let mut quic_tls = client_tls.clone();
        quic_tls.alpn_protocols = vec![QUIC_ALPN.to_vec()];
        let quic_crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(quic_tls).map_err(|e| ConnError::Tls(e.to_string()))?;
        let mut quic_client = quinn::ClientConfig::new(Arc::new(quic_crypto));
        quic_client.transport_config(Arc::new(quic_transport()));
        let mut client_tls = client_tls;
        client_tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            inner: Arc::new(Inner {
                links,
                down,
                client_tls: Arc::new(client_tls),
                server_tls: server_tls.map(Arc::new),
                quic_client,
                quic: Mutex::new(None),
                dialling: Mutex::new(HashMap::new()),
                paths: Mutex::new(HashMap::new()),
                accepted: Mutex::default(),
                max_connections,
                mtu,
                listeners: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The connection registry.
    pub fn links(&self) -> &Arc<Links> {
        &self.inner.links
    }

    /// Counters.
    pub fn counters(&self) -> &LinkCounters {
        &self.inner.links.counters
    }

    /// Remembers the request path to use when dialling a `ws://` or `wss://` endpoint.
    pub fn set_path(&self, ep: Endpoint, path: String) {
        self.inner.paths.lock().insert(ep, path);
    }

    /// Binds a listener for `ep` (TCP, WS, WSS or QUIC) and accepts connections in
    /// the background. Returns the bound address (useful with port 0).
    pub async fn listen(&self, ep: Endpoint) -> Result<SocketAddr, ConnError> {
        let bind = |e: io::Error| ConnError::Bind(ep, e);
        if ep.proto == Proto::Quic {
            let server = self.quic_server()?;
            let mut endpoint = quic_endpoint(ep.addr, Some(server)).map_err(bind)?;
            endpoint.set_default_client_config(self.inner.quic_client.clone());
            let local = endpoint.local_addr().map_err(bind)?;
            // Outgoing QUIC moves to the new socket (so peers see our listening port);
            // connections on an earlier one stay there until they end.
            *self.inner.quic.lock() = Some(endpoint.clone());
            let task = tokio::spawn(self.clone().accept_quic(endpoint));
            self.inner.listeners.lock().insert(Endpoint::new(Proto::Quic, local), task.abort_handle());
            return Ok(local);
        }
        if ep.proto == Proto::Wss && self.inner.server_tls.is_none() {
            return Err(ConnError::Tls("a wss:// listener needs a certificate".into()));
        }
        let listener = bind_tcp(ep.addr).map_err(bind)?;
        let local = listener.local_addr().map_err(bind)?;
        let task = tokio::spawn(self.clone().accept_tcp(ep.proto, listener));
        self.inner.listeners.lock().insert(Endpoint::new(ep.proto, local), task.abort_handle());
        Ok(local)
    }

    /// Closes a listener that [`Self::listen`] bound at `bound`; the connections it
    /// accepted stay up. A TCP, WebSocket or WebSocket-over-TLS port is free again at
    /// once. A QUIC socket also carries the connections on it (accepted and dialled),
    /// so it stops accepting, later dials use a socket of their own, and it closes
    /// when its last connection ends. Returns whether there was one.
    pub fn close_listener(&self, bound: Endpoint) -> bool {
        let Some(task) = self.inner.listeners.lock().remove(&bound) else {
            return false;
        };
        task.abort();
        if bound.proto == Proto::Quic {
            let mut q = self.inner.quic.lock();
            if let Some(e) = q.as_ref().filter(|e| e.local_addr().ok() == Some(bound.addr)) {
                e.set_server_config(None);
                *q = None;
            }
        }
        true
    }

    /// Sends one frame (a handshake or control message) to `to`: on its connection,
    /// or once the connection this starts dialling is up. Frames for a connection
    /// someone else opened to us, after it closed, are dropped: only they can redial.
    pub fn send(&self, to: Endpoint, frame_bytes: &[u8]) {
        let mut batch = Vec::with_capacity(frame::PREFIX + frame_bytes.len());
        if !frame::push(&mut batch, frame_bytes) {
            return;
        }
        match self.inner.links.send(to, batch) {
            Ok(_) => return,
            Err(_) if to.proto == Proto::Udp || self.inner.accepted.lock().0.contains(&to) => return,
            Err(_) => {}
        }
        let mut dialling = self.inner.dialling.lock();
        if let Some(q) = dialling.get_mut(&to) {
            if q.len() < DIAL_QUEUE {
                q.push(frame_bytes.to_vec());
            }
            return;
        }
        dialling.insert(to, vec![frame_bytes.to_vec()]);
        drop(dialling);
        tokio::spawn(self.clone().dial(to));
    }

    fn quic_server(&self) -> Result<quinn::ServerConfig, ConnError> {
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
    fn quic_endpoint(&self) -> io::Result<quinn::Endpoint> {
        let mut q = self.inner.quic.lock();
        if let Some(e) = &*q {
            return Ok(e.clone());
        }
        let mut e = quic_endpoint(SocketAddr::from(([0, 0, 0, 0], 0)), None)?;
        e.set_default_client_config(self.inner.quic_client.clone());
        *q = Some(e.clone());
        Ok(e)
    }

    async fn accept_tcp(self, proto: Proto, listener: TcpListener) {
        let slots = Slots::new(self.inner.max_connections);
        let counters = &self.inner.links.counters;
        loop {
            let (stream, from) = match listener.accept().await {
                // An IPv4 client of a dual-stack listener is the IPv4 address it is.
                Ok((s, from)) => (s, super::canonical(from)),
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let permit = match slots.take(from.ip()) {
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
                let r = me.serve_accepted(proto, stream, ep).await;
                me.closed(ep, r);
                drop(permit);
            });
        }
    }

    async fn serve_accepted(&self, proto: Proto, stream: TcpStream, ep: Endpoint) -> Result<(), String> {
        let _ = stream.set_nodelay(true);
        match proto {
            Proto::Tcp => self.run_stream(stream, ep, true).await,
            Proto::Ws => {
                let ws = self.ws_accept(stream).await?;
                self.run_ws(ws, ep, true).await
            }
            Proto::Wss => {
                let tls = self.inner.server_tls.clone().ok_or("no certificate")?;
                let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                let tls = self.handshake(acceptor.accept(stream)).await.map_err(|e| format!("TLS: {e}"))?;
                let ws = self.ws_accept(tls).await?;
                self.run_ws(ws, ep, true).await
            }
            Proto::Udp | Proto::Quic => Err("not a stream transport".into()),
        }
    }

    async fn ws_accept<S: AsyncRead + AsyncWrite + Unpin>(&self, s: S) -> Result<WebSocketStream<S>, String> {
        let accept = tokio_tungstenite::accept_async_with_config(s, Some(ws_config()));
        self.handshake(accept).await.map_err(|e| format!("WebSocket: {e}"))
    }

    /// Runs an inbound handshake under [`HANDSHAKE_TIMEOUT`], counting failures.
    async fn handshake<T, E: std::fmt::Display>(&self, f: impl Future<Output = Result<T, E>>) -> Result<T, String> {
        let r = match tokio::time::timeout(HANDSHAKE_TIMEOUT, f).await {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("handshake timed out".into()),
        };
        if r.is_err() {
            self.inner.links.counters.handshake_failures.fetch_add(1, Relaxed);
        }
        r
    }

    async fn accept_quic(self, endpoint: quinn::Endpoint) {
        let slots = Slots::new(self.inner.max_connections);
        while let Some(incoming) = endpoint.accept().await {
            let permit = match slots.take(incoming.remote_address().ip()) {
                Ok(p) => p,
                Err(refused) => {
                    refused.count(&self.inner.links.counters);
                    incoming.refuse();
                    continue;
                }
            };
            let me = self.clone();
            tokio::spawn(async move {
                // Not remembered as accepted: a peer dials from its listening socket,
                // so this address may be exactly where it can be dialled back.
                let ep = Endpoint::new(Proto::Quic, super::canonical(incoming.remote_address()));
                let r = match me.handshake(async { incoming.accept()?.await }).await {
                    Ok(conn) => {
                        me.inner.links.counters.accepted.fetch_add(1, Relaxed);
                        me.run_quic(conn, ep, true).await
                    }
                    Err(e) => Err(format!("QUIC: {e}")),
                };
                me.closed(ep, r);
                drop(permit);
            });
        }
    }

    async fn dial(self, to: Endpoint) {
        let r = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.connect(to)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} s", HANDSHAKE_TIMEOUT.as_secs())),
        };
        let r = match r {
            Ok(conn) => {
                self.inner.links.counters.dialled.fetch_add(1, Relaxed);
                debug!(%to, "connected");
                match conn {
                    Dialled::Tcp(s) => self.run_stream(s, to, false).await,
                    Dialled::Ws(ws) => self.run_ws(*ws, to, false).await,
                    Dialled::Wss(ws) => self.run_ws(*ws, to, false).await,
                    Dialled::Quic(c) => self.run_quic(c, to, false).await,
                }
            }
            Err(e) => {
                self.inner.links.counters.dial_failures.fetch_add(1, Relaxed);
                Err(e)
            }
        };
        // Frames still queued for a dial that never connected are lost.
        self.inner.dialling.lock().remove(&to);
        self.closed(to, r);
    }

    async fn connect(&self, to: Endpoint) -> Result<Dialled, String> {
        if to.proto == Proto::Quic {
            let endpoint = self.quic_endpoint().map_err(|e| e.to_string())?;
            let conn = endpoint.connect(to.addr, "weft").map_err(|e| e.to_string())?;
            return conn.await.map(Dialled::Quic).map_err(|e| e.to_string());
        }
        let sock = if to.addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }
            .map_err(|e| e.to_string())?;
        super::mark_socket(&socket2::SockRef::from(&sock)).map_err(|e| format!("cannot mark the socket: {e}"))?;
        let stream = sock.connect(to.addr).await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let path = self.inner.paths.lock().get(&to).cloned().unwrap_or_else(|| "/".into());
        let host = match to.addr {
            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
            SocketAddr::V4(a) => a.to_string(),
        };
        match to.proto {
            Proto::Tcp => Ok(Dialled::Tcp(stream)),
            Proto::Ws => {
                let url = format!("ws://{host}{path}");
                let (ws, _) = tokio_tungstenite::client_async_with_config(url, stream, Some(ws_config()))
                    .await
                    .map_err(|e| format!("WebSocket: {e}"))?;
                Ok(Dialled::Ws(Box::new(ws)))
            }
            Proto::Wss => {
                let connector = tokio_rustls::TlsConnector::from(self.inner.client_tls.clone());
                let name = ServerName::IpAddress(to.addr.ip().into());
                let tls = connector.connect(name, stream).await.map_err(|e| format!("TLS: {e}"))?;
                let url = format!("wss://{host}{path}");
                let (ws, _) = tokio_tungstenite::client_async_with_config(url, tls, Some(ws_config()))
                    .await
                    .map_err(|e| format!("WebSocket: {e}"))?;
                Ok(Dialled::Wss(Box::new(ws)))
            }
            Proto::Udp | Proto::Quic => Err("not a connection transport".into()),
        }
    }

    /// Registers a connection's queue; dialled connections first get the frames
    /// that waited for them.
    fn register(&self, ep: Endpoint, dialled: bool) -> (mpsc::Receiver<Vec<u8>>, u64) {
        let (tx, rx) = mpsc::channel(LINK_QUEUE);
        if dialled {
            let waiting = self.inner.dialling.lock().remove(&ep).unwrap_or_default();
            let mut batch = Vec::new();
            for f in &waiting {
                frame::push(&mut batch, f);
            }
            if !batch.is_empty() {
                let _ = tx.try_send(batch);
            }
        }
        let id = self.inner.links.register(ep, tx);
        (rx, id)
    }

    fn remember_accepted(&self, ep: Endpoint) {
        let mut a = self.inner.accepted.lock();
        if a.0.insert(ep) {
            a.1.push_back(ep);
            if a.1.len() > ACCEPTED_MEMORY
                && let Some(old) = a.1.pop_front()
            {
                a.0.remove(&old);
            }
        }
    }

    fn closed(&self, ep: Endpoint, r: Result<(), String>) {
        let error = match r {
            Ok(()) => "connection closed".to_owned(),
            Err(e) => e,
        };
        debug!(%ep, %error, "connection ended");
        // A connection replaced by a newer one to the same endpoint (both ends dialled
        // at once) is no news: the path still works.
        if self.inner.links.contains(&ep) {
            return;
        }
        // A full queue only delays the failover to the next tick's stale check.
        let _ = self.inner.down.try_send(LinkDown { endpoint: ep, error });
    }

    /// A TCP connection: length-framed batches both ways.
    async fn run_stream<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: S,
        ep: Endpoint,
        accepted: bool,
    ) -> Result<(), String> {
        let (mut r, mut w) = tokio::io::split(s);
        let (mut queue, id) = self.register(ep, !accepted);
        let writer = async {
            while let Some(batch) = queue.recv().await {
                w.write_all(&batch).await.map_err(|e| e.to_string())?;
                self.inner.links.recycle(batch);
            }
            Ok::<(), String>(())
        };
        let counters = &self.inner.links.counters;
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
        };
        self.inner.links.unregister(ep, id);
        r
    }

    /// A WebSocket connection: each binary message is a framed batch.
    async fn run_ws<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        ws: WebSocketStream<S>,
        ep: Endpoint,
        accepted: bool,
    ) -> Result<(), String> {
        let (mut sink, mut stream) = ws.split();
        let (mut queue, id) = self.register(ep, !accepted);
        let writer = async {
            while let Some(batch) = queue.recv().await {
                // Up to WS_RUN batches already queued behind this one go out with it:
                // tungstenite gathers messages in its write buffer and writes once per
                // 128 KiB, then one flush for the run.
                let (mut next, mut fed) = (Some(batch), 0);
                while let Some(b) = next.take() {
                    sink.feed(Message::Binary(self.inner.links.lend(b))).await.map_err(|e| e.to_string())?;
                    fed += 1;
                    next = if fed < WS_RUN { queue.try_recv().ok() } else { None };
                }
                sink.flush().await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        };
        let counters = &self.inner.links.counters;
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
                        let mut batch = self.inner.links.buffer();
                        batch.extend_from_slice(&b);
                        if !self.inner.links.deliver(id, Inbound { from: ep, batch }).await {
                            return Err("the links RX thread stopped".into());
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
        };
        self.inner.links.unregister(ep, id);
        r
    }

    /// A pooled batch buffer with room for [`STREAM_RX`] bytes, into which a stream
    /// reader reads (no zeroing: `read_buf` fills the spare capacity).
    fn stream_batch(&self) -> Vec<u8> {
        let mut batch = self.inner.links.buffer();
        batch.reserve_exact(STREAM_RX);
        batch
    }

    /// Hands the `used` bytes of whole frames at the start of `batch`, read from a
    /// stream of connection `id`, to the links RX (waiting for room) in that buffer:
    /// only what follows them (a frame still arriving, at most one) is copied, into a
    /// fresh batch that takes its place.
    async fn deliver_frames(&self, id: u64, ep: Endpoint, batch: &mut Vec<u8>, used: usize) -> Result<(), String> {
        let mut next = self.stream_batch();
        next.extend_from_slice(&batch[used..]);
        batch.truncate(used);
        let whole = std::mem::replace(batch, next);
        if !self.inner.links.deliver(id, Inbound { from: ep, batch: whole }).await {
            return Err("the links RX thread stopped".into());
        }
        Ok(())
    }

    /// A QUIC connection: each frame is a datagram, split in fragments when the path
    /// cannot carry it whole (frames are at most the tunnel MTU plus headers, a
    /// little over what QUIC fits in a 1500-byte packet) — except GSO records
    /// ([`weft_core::wire::FLAG_GSO`], up to 64 KiB, sent only to peers whose hello takes
    /// them over QUIC), which go on one unidirectional stream per direction, framed as
    /// on TCP, so that quinn packs them into full packets, and the TCP segments that
    /// must stay behind them ([`weft_core::wire::FLAG_ORDERED`]; see [`on_quic_stream`]).
    async fn run_quic(&self, conn: quinn::Connection, ep: Endpoint, accepted: bool) -> Result<(), String> {
        let (mut queue, id) = self.register(ep, !accepted);
        let mut next_id: u16 = 0;
        let writer = async {
            let mut stream: Option<quinn::SendStream> = None;
            let mut records = Vec::new();
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
                        s.write_chunk(self.inner.links.lend(batch)).await.map_err(|e| e.to_string())?;
                    }
                    continue;
                }
                let max = conn.max_datagram_size().ok_or("peer does not accept QUIC datagrams")?;
                for f in frame::frames(&batch).flatten() {
                    if on_quic_stream(f) {
                        frame::push(&mut records, f);
                        continue;
                    }
                    let parts = fragment(f, max, next_id);
                    if parts.len() > 1 {
                        self.inner.links.counters.quic_fragmented.fetch_add(1, Relaxed);
                    }
                    for d in parts {
                        // A full send buffer drops the oldest datagrams: loss, as on UDP.
                        conn.send_datagram(d).map_err(|e| e.to_string())?;
                    }
                    next_id = next_id.wrapping_add(1);
                }
                self.inner.links.recycle(batch);
                if records.is_empty() {
                    continue;
                }
                if stream.is_none() {
                    stream = Some(conn.open_uni().await.map_err(|e| e.to_string())?);
                }
                if let Some(s) = &mut stream {
                    s.write_all(&records).await.map_err(|e| e.to_string())?;
                }
                records.clear();
            }
            Ok::<(), String>(())
        };
        let counters = &self.inner.links.counters;
        // When the stream last brought a whole frame (ms after `base`, plus one; 0:
        // never): it keeps the connection from being idle too.
        let base = Instant::now();
        let stream_seen = std::sync::atomic::AtomicU64::new(0);
        let reader = async {
            let mut reasm = Reassembly::default();
            // Like streams: an accepted connection's first whole frame within
            // HANDSHAKE_TIMEOUT, then a whole frame at least every IDLE_TIMEOUT. QUIC's
            // own keepalives and stray fragments do not count.
            let mut first = accepted;
            let mut deadline = Instant::now() + if first { HANDSHAKE_TIMEOUT } else { IDLE_TIMEOUT };
            loop {
                // One wakeup takes every datagram already there, up to a batch, so the
                // links RX thread gets batches rather than single frames.
                let Ok(d) = timeout_at(deadline, conn.read_datagram()).await else {
                    let seen = stream_seen.load(Relaxed);
                    let last = base + Duration::from_millis(seen.saturating_sub(1));
                    if seen > 0 && last + IDLE_TIMEOUT > Instant::now() {
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
                let mut batch = self.inner.links.buffer();
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
                    self.inner.links.recycle(batch);
                } else {
                    first = false;
                    deadline = Instant::now() + IDLE_TIMEOUT;
                    if !self.inner.links.deliver(id, Inbound { from: ep, batch }).await {
                        return Err("the links RX thread stopped".into());
                    }
                }
            }
        };
        // The peer's stream of GSO records and the TCP segments kept behind them (at
        // most one stream open at a time), read like a TCP connection: whole frames go
        // to the links RX in batches.
        let stream_reader = async {
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
                        self.deliver_frames(id, ep, &mut batch, used).await?;
                        let ms = u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
                        stream_seen.store(ms + 1, Relaxed);
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
        };
        let tuner = async {
            let mut windows = QUIC_WINDOW_MIN;
            while conn.close_reason().is_none() {
                tokio::time::sleep(QUIC_TUNE_EVERY).await;
                windows = tune_quic_windows(&conn, windows, self.inner.links.is_member(&ep));
            }
            Ok(())
        };
        let r = tokio::select! {
            r = writer => r,
            r = reader => r,
            r = stream_reader => r,
            r = tuner => r,
        };
        self.inner.links.unregister(ep, id);
        conn.close(0u32.into(), b"");
        r
    }
}

/// The flow-control window for a path whose minimum round trip is `min_rtt`: what
/// [`QUIC_WINDOW_RATE`] moves in one round trip, within [`QUIC_WINDOW_MIN`] and
/// [`QUIC_WINDOW_MAX`]. The minimum, not the smoothed round trip: a receiver that
/// falls behind queues, which lengthens the smoothed one, which would widen the
/// window, which lets it queue more.
fn quic_window(min_rtt: Duration) -> u32 {
    let micros = u64::try_from(min_rtt.as_micros()).unwrap_or(u64::MAX);
    let bytes = micros.saturating_mul(QUIC_WINDOW_RATE) / 1_000_000;
    u32::try_from(bytes.clamp(u64::from(QUIC_WINDOW_MIN), u64::from(QUIC_WINDOW_MAX))).unwrap_or(QUIC_WINDOW_MAX)
}

/// Sets `conn`'s receive and send windows for its path's minimum round trip when
/// that differs from `current` (the windows it has); returns the windows it now has.
/// Only a `member` (a peer that proved the secret on this path) gets more than the
/// least: anyone can finish a QUIC handshake and delay its own acknowledgements.
fn tune_quic_windows(conn: &quinn::Connection, current: u32, member: bool) -> u32 {
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

/// The most connections one source may hold on a listener with `max_connections`
/// slots: a quarter of them, at least one, at most [`PER_SOURCE_MAX`].
pub fn per_source_limit(max_connections: usize) -> usize {
    (max_connections / 4).clamp(1, PER_SOURCE_MAX)
}

/// What counts as one source: an IPv4 address, or an IPv6 /48 (what one site is
/// usually given: a /64 each would let one site hold every slot with 32 of its
/// 65536 subnets); IPv4-mapped IPv6 addresses count as IPv4.
fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & (u128::MAX << 80))),
        v4 => v4,
    }
}

/// The connection slots of one listener: a total limit and one per source.
struct Slots {
    total: Arc<Semaphore>,
    per_source: usize,
    by_source: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a listener turned a connection away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// Every slot is taken.
    Full,
    /// The source holds its share of the slots.
    Source,
}

impl Refused {
    fn count(self, c: &LinkCounters) {
        match self {
            Self::Full => c.refused_full.fetch_add(1, Relaxed),
            Self::Source => c.refused_source.fetch_add(1, Relaxed),
        };
    }
}

/// A taken slot, given back on drop.
struct Slot {
    slots: Arc<Slots>,
    source: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Slots {
    fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            total: Arc::new(Semaphore::new(max_connections)),
            per_source: per_source_limit(max_connections),
            by_source: Mutex::new(HashMap::new()),
        })
    }

    fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refused> {
        let source = source_of(ip);
        let mut by = self.by_source.lock();
        let held = by.get(&source).copied().unwrap_or(0);
        if held >= self.per_source {
            return Err(Refused::Source);
        }
        let permit = self.total.clone().try_acquire_owned().map_err(|_| Refused::Full)?;
        by.insert(source, held + 1);
        Ok(Slot { slots: self.clone(), source, _permit: permit })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by = self.slots.by_source.lock();
        if let Some(n) = by.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.source);
            }
        }
    }
}

enum Dialled {
    Tcp(TcpStream),
    Ws(Box<WebSocketStream<TcpStream>>),
    Wss(Box<WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>>),
    Quic(quinn::Connection),
}

/// A quinn endpoint on a UDP socket with large buffers: quinn drains its socket from
/// the tokio workers, slower than a pipeline thread drains its own, and the kernel's
/// default receive buffer overflowed at a few hundred Mbit/s (bench/RESULTS.md §6).
fn quic_endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> io::Result<quinn::Endpoint> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, None)?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    super::udp::grow_buffers(&s);
    super::mark_socket(&s)?;
    s.bind(&addr.into())?;
    let runtime = quinn::default_runtime().ok_or_else(|| io::Error::other("no async runtime for QUIC"))?;
    let socket = Arc::new(FewBatches(runtime.wrap_udp_socket(s.into())?));
    quinn::Endpoint::new_with_abstract_socket(quinn::EndpointConfig::default(), server, socket, runtime)
}

/// GRO batches quinn's endpoint reads from its socket in one call.
const QUIC_RECV_BATCHES: usize = 4;

/// quinn's socket with at most [`QUIC_RECV_BATCHES`] GRO batches per read. quinn
/// offers its socket 32 slots of up to 64 KiB each (`quinn_udp::BATCH_SIZE`), and a
/// busy endpoint filled them all: 2 MiB of the node's resident memory for the space
/// of one read, where four slots (256 KiB) carry a few Gbit/s with one more system
/// call per 256 KiB. The buffer is allocated zeroed and whole, so the slots never
/// offered are never touched and never become resident.
#[derive(Debug)]
struct FewBatches(Arc<dyn quinn::AsyncUdpSocket>);

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

/// A TCP listener on `addr`; `[::]` takes IPv4 clients too, whatever
/// `net.ipv6.bindv6only` says.
fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    s.set_reuse_address(true)?;
    // Accepted connections answer with the listener's mark: without it, a node using
    // an exit would send its SYN-ACKs into the tunnel.
    super::mark_socket(&s)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    TcpListener::from_std(s.into())
}

/// rustls's *ring* provider with AES-128-GCM first among the TLS 1.3 suites (its
/// default order puts AES-256-GCM first). Every frame inside is already sealed end to
/// end by the session keys; this outer layer hides the tunnel from the path and keeps
/// the QUIC connection's own packets from being forged, and AES-128 does that with
/// ten rounds instead of fourteen on every QUIC packet and TLS record. The other
/// suites stay for peers (or TLS-terminating proxies) that insist on them.
fn transport_crypto() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    rustls::crypto::CryptoProvider {
        cipher_suites: vec![TLS13_AES_128_GCM_SHA256, TLS13_CHACHA20_POLY1305_SHA256, TLS13_AES_256_GCM_SHA384],
        ..rustls::crypto::ring::default_provider()
    }
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().max_message_size(Some(MAX_WS_MESSAGE)).max_frame_size(Some(MAX_WS_MESSAGE))
}

fn quic_transport() -> quinn::TransportConfig {
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

/// Datagram tag: a whole frame follows.
const WHOLE: u8 = 0;
/// Datagram tag: a fragment follows, after `id: u16, index: u8, count: u8`.
const PART: u8 = 1;
const PART_HEADER: usize = 5;

/// Splits a frame into QUIC datagrams of at most `max` bytes (none when it would
/// take more than 255).
pub fn fragment(f: &[u8], max: usize, id: u16) -> Vec<Bytes> {
    if f.len() < max {
        let mut d = Vec::with_capacity(1 + f.len());
        d.push(WHOLE);
        d.extend_from_slice(f);
        return vec![d.into()];
    }
    let chunk = max.saturating_sub(PART_HEADER).max(1);
    let count = f.len().div_ceil(chunk);
    if count > usize::from(u8::MAX) {
        return Vec::new();
    }
    f.chunks(chunk)
        .enumerate()
        .map(|(i, c)| {
            let mut d = Vec::with_capacity(PART_HEADER + c.len());
            d.push(PART);
            d.extend_from_slice(&id.to_be_bytes());
            d.push(i as u8);
            d.push(count as u8);
            d.extend_from_slice(c);
            d.into()
        })
        .collect()
}

/// A QUIC datagram that no weft node sends; its connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed QUIC datagram")]
pub struct MalformedDatagram;

/// Reassembles fragmented frames of one QUIC connection; keeps a few incomplete ones
/// (a lost fragment loses its frame, like a lost datagram). Pure: public so that the
/// fuzz targets reach it.
#[derive(Debug, Default)]
pub struct Reassembly {
    /// (id, count, received parts).
    partial: Vec<(u16, u8, Vec<Option<Bytes>>)>,
}

impl Reassembly {
    const KEEP: usize = 8;

    /// Takes one datagram; returns a complete frame when there is one (at most `mtu`
    /// bytes), an error for a datagram no weft node sends.
    pub fn push(&mut self, d: &Bytes, mtu: usize) -> Result<Option<Vec<u8>>, MalformedDatagram> {
        match d.first() {
            Some(&WHOLE) if d.len() > 1 => Ok(Some(d[1..].to_vec())),
            Some(&PART) if d.len() > PART_HEADER => {
                let id = u16::from_be_bytes([d[1], d[2]]);
                let (index, count) = (d[3], d[4]);
                let max_parts = mtu.div_ceil(16).min(usize::from(u8::MAX));
                if count < 2 || index >= count || usize::from(count) > max_parts {
                    return Err(MalformedDatagram);
                }
                let pos = match self.partial.iter().position(|p| p.0 == id && p.1 == count) {
                    Some(p) => p,
                    None => {
                        if self.partial.len() == Self::KEEP {
                            self.partial.remove(0);
                        }
                        self.partial.push((id, count, vec![None; usize::from(count)]));
                        self.partial.len() - 1
                    }
                };
                self.partial[pos].2[usize::from(index)] = Some(d.slice(PART_HEADER..));
                if self.partial[pos].2.iter().all(Option::is_some) {
                    let (_, _, parts) = self.partial.remove(pos);
                    let mut f = Vec::new();
                    for p in parts.into_iter().flatten() {
                        f.extend_from_slice(&p);
                    }
                    if f.len() > mtu {
                        return Err(MalformedDatagram);
                    }
                    return Ok(Some(f));
                }
                Ok(None)
            }
            _ => Err(MalformedDatagram),
        }
    }
}

/// Accepts any certificate: the TLS of `wss://` and QUIC carries frames already
/// sealed by Noise sessions whose handshakes authenticate both ends (the network
/// PSK and the node keys); TLS only makes the traffic look like HTTPS. Handshake
/// signatures are still verified, so the TLS session itself is sound.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_reassemble_and_garbage_is_refused() {
        let f: Vec<u8> = (0..1452u32).map(|i| i as u8).collect();
        let parts = fragment(&f, 1200, 7);
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.len() <= 1200));
        let mut r = Reassembly::default();
        // Out of order, with another frame's fragment in between.
        assert_eq!(r.push(&parts[1], 1500), Ok(None));
        let other = fragment(&f, 1000, 8);
        assert_eq!(r.push(&other[0], 1500), Ok(None));
        assert_eq!(r.push(&parts[0], 1500), Ok(Some(f)));
        let whole = fragment(b"small", 1200, 9);
        assert_eq!(whole.len(), 1);
        assert_eq!(r.push(&whole[0], 1500), Ok(Some(b"small".to_vec())));
        for bad in [&b""[..], &[WHOLE], &[9, 1, 2], &[PART, 0, 1, 3, 2, 0xff], &[PART, 0, 1, 0, 1, 0xff]] {
            assert_eq!(r.push(&Bytes::copy_from_slice(bad), 1500), Err(MalformedDatagram), "{bad:?}");
        }
        // A frame larger than the MTU does not come together.
        let big = fragment(&vec![1u8; 3000], 1200, 10);
        let mut r = Reassembly::default();
        let last = big.iter().map(|p| r.push(p, 1500)).last();
        assert_eq!(last, Some(Err(MalformedDatagram)));
    }

    /// Hostile clients of the listeners, on loopback with the real deadlines: each
    /// test takes a few seconds because the deadlines are the production ones.
    mod hostile {
        use std::time::Instant as StdInstant;

        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio::net::{TcpSocket, TcpStream};

        use super::*;

        struct Listener {
            conn: Connector,
            addr: SocketAddr,
            // Kept so that deliveries and link-down reports have somewhere to go.
            _inbound: std::sync::mpsc::Receiver<Inbound>,
            _down: mpsc::Receiver<LinkDown>,
        }

        fn tls() -> TlsIdentity {
            let cert = rcgen::generate_simple_self_signed(vec!["weft".to_owned()]).expect("certificate");
            TlsIdentity {
                chain: vec![cert.cert.der().clone()],
                key: PrivateKeyDer::try_from(cert.signing_key.serialize_der()).expect("key"),
            }
        }

        async fn listener(proto: Proto, max: usize) -> Listener {
            let (links, inbound) = Links::new(64);
            let (down_tx, down) = mpsc::channel(64);
            let conn = Connector::new(links, down_tx, Some(tls()), max, 1500).expect("connector");
            let addr = conn.listen(Endpoint::new(proto, "127.0.0.1:0".parse().expect("addr"))).await.expect("listen");
            Listener { conn, addr, _inbound: inbound, _down: down }
        }

        /// Reads until the server closes the connection; returns when, or `None`
        /// if it was still open after `within`.
        async fn closed_within(r: &mut (impl AsyncRead + Unpin), within: Duration) -> Option<Duration> {
            let start = StdInstant::now();
            let mut b = [0u8; 256];
            let end = tokio::time::timeout(within, async {
                loop {
                    match r.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
            end.await.ok().map(|()| start.elapsed())
        }

        /// Writes `bytes` one byte at a time, `every` apart, until the write fails.
        fn trickle(mut w: impl AsyncWrite + Unpin + Send + 'static, bytes: Vec<u8>, every: Duration) {
            tokio::spawn(async move {
                for b in bytes {
                    tokio::time::sleep(every).await;
                    if w.write_all(&[b]).await.is_err() {
                        return;
                    }
                }
            });
        }

        /// The outer TLS layer settles on AES-128-GCM between two nodes, and still
        /// admits a client that offers only AES-256-GCM.
        #[tokio::test]
        async fn wss_prefers_aes_128_and_admits_a_client_without_it() {
            use rustls::crypto::ring::cipher_suite::{TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384};
            let l = listener(Proto::Wss, 16).await;
            let name = ServerName::IpAddress(l.addr.ip().into());
            let ours = tokio_rustls::TlsConnector::from(l.conn.inner.client_tls.clone());
            let tcp = TcpStream::connect(l.addr).await.expect("connect");
            let tls = ours.connect(name.clone(), tcp).await.expect("handshake");
            let suite = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
            assert_eq!(suite, Some(TLS13_AES_128_GCM_SHA256.suite()));

            let provider = rustls::crypto::CryptoProvider {
                cipher_suites: vec![TLS13_AES_256_GCM_SHA384],
                ..rustls::crypto::ring::default_provider()
            };
            let provider = Arc::new(provider);
            let theirs = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .expect("TLS 1.3")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
                .with_no_client_auth();
            let tcp = TcpStream::connect(l.addr).await.expect("connect");
            let tls = tokio_rustls::TlsConnector::from(Arc::new(theirs)).connect(name, tcp).await.expect("handshake");
            let suite = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
            assert_eq!(suite, Some(TLS13_AES_256_GCM_SHA384.suite()));
        }

        #[tokio::test]
        async fn tcp_first_frame_trickled_closes_at_the_deadline() {
            let l = listener(Proto::Tcp, 16).await;
            let (mut r, w) = TcpStream::connect(l.addr).await.expect("connect").into_split();
            // A 200-byte frame, one byte per second: every read comes well within the
            // handshake timeout, the whole frame never does.
            let mut frame = vec![0u8, 200];
            frame.extend([7u8; 200]);
            trickle(w, frame, Duration::from_secs(1));
            let took = closed_within(&mut r, HANDSHAKE_TIMEOUT + Duration::from_secs(4)).await;
            assert!(took.is_some(), "a trickled first frame held the connection open");
            assert_eq!(l.conn.counters().timeouts.load(Relaxed), 1);
        }

        #[tokio::test]
        async fn tcp_frame_trickled_after_the_first_closes_at_the_stall_deadline() {
            let l = listener(Proto::Tcp, 16).await;
            let (mut r, mut w) = TcpStream::connect(l.addr).await.expect("connect").into_split();
            w.write_all(&[0, 1, 0x42]).await.expect("first frame");
            let mut frame = vec![0u8, 100];
            frame.extend([7u8; 100]);
            let start = StdInstant::now();
            trickle(w, frame, Duration::from_secs(1));
            let took = closed_within(&mut r, STALL_TIMEOUT + Duration::from_secs(4)).await;
            assert!(took.is_some(), "a trickled frame held the connection open");
            assert!(start.elapsed() >= STALL_TIMEOUT - Duration::from_millis(100), "closed early");
            assert_eq!(l.conn.counters().timeouts.load(Relaxed), 1);
        }

        #[tokio::test]
        async fn ws_pings_do_not_extend_the_first_frame_deadline() {
            let l = listener(Proto::Ws, 16).await;
            let tcp = TcpStream::connect(l.addr).await.expect("connect");
            let url = format!("ws://{}/", l.addr);
            let (ws, _) = tokio_tungstenite::client_async(url, tcp).await.expect("websocket");
            let (mut sink, mut stream) = ws.split();
            tokio::spawn(async move {
                while sink.send(Message::Ping(Bytes::from_static(b"hi"))).await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            });
            let start = StdInstant::now();
            let ended = tokio::time::timeout(HANDSHAKE_TIMEOUT + Duration::from_secs(4), async {
                while let Some(Ok(_)) = stream.next().await {}
            })
            .await;
            assert!(ended.is_ok(), "pings kept a connection without a frame open");
            assert!(start.elapsed() < HANDSHAKE_TIMEOUT + Duration::from_secs(2));
            assert_eq!(l.conn.counters().timeouts.load(Relaxed), 1);
        }

        /// A QUIC connection to `addr` from a connector of our own (kept alive by the
        /// returned one), with nothing sent yet.
        async fn quic_client(addr: SocketAddr) -> (quinn::Connection, Connector) {
            let (links, _inbound) = Links::new(8);
            let (down_tx, _down) = mpsc::channel(8);
            let client = Connector::new(links, down_tx, None, 4, 1500).expect("client");
            let endpoint = client.quic_endpoint().expect("client endpoint");
            let conn = endpoint.connect(addr, "weft").expect("connect").await.expect("QUIC handshake");
            (conn, client)
        }

        /// A UDP forwarder on loopback that holds every datagram `delay` before passing
        /// it on: the first sender is the client, `server` the other end. Returns its
        /// address; it runs until the test's runtime ends.
        async fn delaying_proxy(server: SocketAddr, delay: Duration) -> SocketAddr {
            let sock = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
            let addr = sock.local_addr().expect("proxy address");
            tokio::spawn(async move {
                let mut client: Option<SocketAddr> = None;
                let mut buf = vec![0u8; 65536];
                while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                    let to = if from == server {
                        let Some(c) = client else { continue };
                        c
                    } else {
                        client = Some(from);
                        server
                    };
                    let (sock, d) = (sock.clone(), buf[..n].to_vec());
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = sock.send_to(&d, to).await;
                    });
                }
            });
            addr
        }

        #[test]
        fn quic_windows_follow_the_minimum_round_trip() {
            let min = QUIC_WINDOW_MIN;
            assert_eq!(quic_window(Duration::ZERO), min);
            assert_eq!(quic_window(Duration::from_micros(300)), min, "a LAN keeps the least");
            assert_eq!(quic_window(Duration::from_millis(4)), 2_000_000);
            assert_eq!(quic_window(Duration::from_millis(10)), 5_000_000);
            assert_eq!(quic_window(Duration::from_millis(50)), QUIC_WINDOW_MAX);
            assert_eq!(quic_window(Duration::MAX), QUIC_WINDOW_MAX);
        }

        /// Windows measured on real connections: loopback keeps the least; a path
        /// with a 10 ms round trip (5 ms each way through a forwarder) gets what
        /// 4 Gbit/s moves in it.
        #[tokio::test]
        async fn quic_windows_grow_on_a_long_path_and_stay_small_on_a_short_one() {
            let l = listener(Proto::Quic, 16).await;
            let (near, _client) = quic_client(l.addr).await;
            // Loopback answers in well under the 2 ms that would widen the window,
            // unless the machine is starved; the rule holds for what was measured.
            let near_rtt = near.stats().path.min_rtt;
            let near_w = tune_quic_windows(&near, QUIC_WINDOW_MIN, true);
            assert_eq!(near_w, quic_window(near_rtt), "{near_rtt:?}");
            if near_rtt < Duration::from_millis(2) {
                assert_eq!(near_w, QUIC_WINDOW_MIN);
            }

            let proxy = delaying_proxy(l.addr, Duration::from_millis(5)).await;
            let (far, _client) = quic_client(proxy).await;
            let min_rtt = far.stats().path.min_rtt;
            assert!(min_rtt >= Duration::from_millis(10), "{min_rtt:?}");
            // Not yet a member: the least, however long the path.
            assert_eq!(tune_quic_windows(&far, QUIC_WINDOW_MIN, false), QUIC_WINDOW_MIN);
            let w = tune_quic_windows(&far, QUIC_WINDOW_MIN, true);
            assert!((5_000_000..=QUIC_WINDOW_MAX).contains(&w), "{w} for {min_rtt:?}");
            // The peer is told: the connection carries on under the new windows.
            let mut s = far.open_uni().await.expect("stream");
            s.write_all(&[0, 1, 0x42]).await.expect("a frame under the new windows");
        }

        /// quinn is built with larger GSO sends (third_party/quinn/WEFT.md): a bulk
        /// stream goes to the kernel in more than upstream's 10 packets per send on
        /// average (upstream cannot exceed 10; it measured ~8 here, the copy ~20), and
        /// no more than 64 KiB per send on average. Through a forwarder that holds datagrams
        /// 2 ms, so that acknowledgements arrive in bunches as from a busy peer: on
        /// bare loopback in one thread each ACK frees a couple of packets, and every
        /// build sends about three at a time.
        #[tokio::test]
        async fn quic_bulk_data_leaves_in_sends_of_more_than_ten_packets() {
            let (links, inbound) = Links::new(64);
            let (down_tx, _down) = mpsc::channel(64);
            let server = Connector::new(links.clone(), down_tx, Some(tls()), 16, 1500).expect("connector");
            let addr =
                server.listen(Endpoint::new(Proto::Quic, "127.0.0.1:0".parse().expect("addr"))).await.expect("listen");
            // The links RX thread's part: take each batch and give its room back, until
            // the test is over.
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let drain = {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Relaxed) {
                        if let Ok(i) = inbound.recv_timeout(Duration::from_millis(50)) {
                            links.done(0, i.batch);
                        }
                    }
                })
            };
            let proxy = delaying_proxy(addr, Duration::from_millis(2)).await;
            let (conn, _client) = quic_client(proxy).await;
            let before = conn.stats().udp_tx;
            let mut records = Vec::new();
            for _ in 0..128 {
                assert!(frame::push(&mut records, &[0x42; 60_000]));
            }
            let mut s = conn.open_uni().await.expect("stream");
            s.write_all(&records).await.expect("records");
            s.finish().expect("finish");
            let done = tokio::time::timeout(Duration::from_secs(20), s.stopped()).await;
            assert!(matches!(done, Ok(Ok(None))), "the stream was not read to its end: {done:?}");
            let tx = conn.stats().udp_tx;
            let (datagrams, ios, bytes) =
                (tx.datagrams - before.datagrams, tx.ios - before.ios, tx.bytes - before.bytes);
            assert!(bytes >= records.len() as u64, "{bytes} bytes sent for {}", records.len());
            assert!(datagrams > 10 * ios, "{datagrams} packets in {ios} sends");
            assert!(bytes <= 65_507 * ios, "{bytes} bytes in {ios} sends");
            stop.store(true, Relaxed);
            drain.join().expect("drain thread");
        }

        #[tokio::test]
        async fn quic_silent_connection_closes_at_the_first_frame_deadline() {
            let l = listener(Proto::Quic, 16).await;
            let (conn, _client) = quic_client(l.addr).await;
            let start = StdInstant::now();
            let closed = tokio::time::timeout(HANDSHAKE_TIMEOUT + Duration::from_secs(4), conn.closed()).await;
            assert!(closed.is_ok(), "a silent QUIC connection stayed open");
            assert!(start.elapsed() < HANDSHAKE_TIMEOUT + Duration::from_secs(2));
            assert_eq!(l.conn.counters().timeouts.load(Relaxed), 1);
        }

        #[tokio::test]
        async fn quic_record_trickled_closes_at_the_stall_deadline() {
            let l = listener(Proto::Quic, 16).await;
            let (conn, _client) = quic_client(l.addr).await;
            // A whole frame on the record stream (it counts as the first), then a
            // 100-byte one a byte a second.
            let mut w = conn.open_uni().await.expect("stream");
            w.write_all(&[0, 1, 0x42]).await.expect("first frame");
            let mut frame = vec![0u8, 100];
            frame.extend([7u8; 100]);
            let start = StdInstant::now();
            trickle(w, frame, Duration::from_secs(1));
            let closed = tokio::time::timeout(STALL_TIMEOUT + Duration::from_secs(4), conn.closed()).await;
            assert!(closed.is_ok(), "a trickled record held the connection open");
            assert!(start.elapsed() >= STALL_TIMEOUT - Duration::from_millis(100), "closed early");
            assert_eq!(l.conn.counters().timeouts.load(Relaxed), 1);
        }

        #[tokio::test]
        async fn quic_record_stream_ending_inside_a_frame_closes_the_connection() {
            let l = listener(Proto::Quic, 16).await;
            let (conn, _client) = quic_client(l.addr).await;
            let mut w = conn.open_uni().await.expect("stream");
            w.write_all(&[0, 1, 0x42, 0, 100, 7, 7, 7]).await.expect("a frame and a half");
            w.finish().expect("finish");
            let closed = tokio::time::timeout(Duration::from_secs(3), conn.closed()).await;
            assert!(closed.is_ok(), "a record stream ending inside a frame was ignored");
            assert_eq!(l.conn.counters().protocol_errors.load(Relaxed), 1);
        }

        async fn connect_from(src: [u8; 4], to: SocketAddr) -> TcpStream {
            let s = TcpSocket::new_v4().expect("socket");
            s.bind(SocketAddr::from((src, 0))).expect("bind");
            s.connect(to).await.expect("connect")
        }

        #[tokio::test]
        async fn one_source_cannot_take_every_slot() {
            let max = 8;
            let per = per_source_limit(max);
            assert_eq!(per, 2);
            let l = listener(Proto::Tcp, max).await;
            let mut held = Vec::new();
            for _ in 0..per {
                held.push(connect_from([127, 0, 0, 1], l.addr).await);
            }
            let mut extra = connect_from([127, 0, 0, 1], l.addr).await;
            assert!(
                closed_within(&mut extra, Duration::from_secs(2)).await.is_some(),
                "a source got more than its share"
            );
            for s in &mut held {
                assert_eq!(closed_within(s, Duration::from_millis(200)).await, None, "its share stays open");
            }
            // Another source still gets in, and a freed slot is reusable.
            let mut other = connect_from([127, 0, 0, 2], l.addr).await;
            assert_eq!(closed_within(&mut other, Duration::from_millis(200)).await, None);
            drop(held.pop());
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut again = connect_from([127, 0, 0, 1], l.addr).await;
            assert_eq!(closed_within(&mut again, Duration::from_millis(200)).await, None);
            let c = l.conn.counters();
            assert_eq!(c.refused_source.load(Relaxed), 1);
            assert_eq!(c.refused_full.load(Relaxed), 0);
            assert_eq!(c.accepted.load(Relaxed), 4);
        }

        #[test]
        fn sources_and_shares() {
            assert_eq!(per_source_limit(1), 1);
            assert_eq!(per_source_limit(7), 1);
            assert_eq!(per_source_limit(16), 4);
            assert_eq!(per_source_limit(256), PER_SOURCE_MAX);
            let v4: IpAddr = "192.0.2.1".parse().expect("v4");
            let mapped: IpAddr = "::ffff:192.0.2.1".parse().expect("mapped");
            assert_eq!(source_of(mapped), v4);
            let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().expect("v6");
            let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().expect("v6");
            let c: IpAddr = "2001:db8:1:3::1".parse().expect("v6");
            let d: IpAddr = "2001:db8:2::1".parse().expect("v6");
            assert_eq!(source_of(a), source_of(b), "one /64 is one source");
            assert_eq!(source_of(a), source_of(c), "and so is one /48");
            assert_ne!(source_of(a), source_of(d));
        }
    }
}
