//! The connection transports: TCP, WebSocket (plain and TLS) and QUIC, as listeners
//! and dialled connections on the node's tokio runtime.
//!
//! Each live connection is registered in [`Connections`] under its [`Endpoint`] with a
//! bounded queue of framed batches; a writer task drains the queue (one `write_all`,
//! one WebSocket message, or a run of QUIC datagrams per batch) and a reader task
//! hands what arrives to the connection RX thread. Frames are sealed end to end by the
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
//! connection. Framing is not membership: an accepted connection must also carry a
//! handshake, reject or cookie message whose mac1 verifies (only members have the
//! key) within [`PROOF_TIMEOUT`] of its accept, and until it does it holds one of the
//! few places of the listener's pool of unproven connections ([`unproven_limit`], at
//! most [`UNPROVEN_PER_SOURCE`] per source). Every refusal and close is counted in
//! [`ConnCounters`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use parking_lot::Mutex;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tracing::debug;

use weft_core::admission::MacKeys;

use super::Lane;
use super::connections::{ConnCounters, ConnQueue, Connections, Queued};
use super::{Endpoint, Proto, frame};

mod fragment;
mod pinned;
mod quic;
mod slots;
mod stream;
mod tls;

pub use fragment::{MalformedDatagram, Reassembly, fragment};
pub use pinned::Pace;
pub use quic::on_quic_stream;
use quic::{quic_endpoint, quic_transport};
use slots::Proof;
pub use slots::{UNPROVEN_PER_SOURCE, per_source_limit, unproven_limit};
use stream::{bind_tcp, ws_config};
use tls::{AnyCert, transport_crypto};

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

/// An accepted connection must carry a handshake message with a valid mac1 (proof
/// that a member, not a stranger, holds it) within this from its accept, TLS and
/// WebSocket handshakes included; until then it holds a place in the listener's small
/// pool of unproven connections ([`unproven_limit`]).
pub const PROOF_TIMEOUT: Duration = Duration::from_secs(8);

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
/// Bytes past which a WebSocket writer flushes its run: small batches still go out
/// together, but a sparse batch never waits behind more than one record's worth fed
/// ahead of it (what is fed cannot be overtaken).
const WS_RUN_BYTES: usize = 64 << 10;

/// Room of a stream connection's receive batch: two of the largest frames, so that
/// behind the part of a frame still arriving there is always room for a whole one.
const STREAM_RX: usize = 2 * (frame::PREFIX + frame::MAX_FRAME);

/// The least a batch of QUIC stream frames holds to be lent to quinn whole instead of
/// copied (a GSO record is larger).
const LEND_MIN: usize = 16 * 1024;

/// Bytes of received QUIC frames handed to the connection RX thread at once.
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
pub struct ConnectionDown {
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
    conns: Arc<Connections>,
    down: mpsc::Sender<ConnectionDown>,
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
    /// The network's MAC keys: what an accepted connection proves itself with.
    macs: Arc<MacKeys>,
    /// Accept loops of the listeners, by bound endpoint (closed by aborting them,
    /// which drops a TCP socket; a QUIC one stops accepting and stays for the
    /// connections on it).
    listeners: Mutex<HashMap<Endpoint, tokio::task::AbortHandle>>,
    /// Sets of sockets open for the birthday method now (at most
    /// [`pinned::MAPPING_SETS`]).
    mapping_sets: std::sync::atomic::AtomicUsize,
    /// When a set of those sockets last pinned the path to each endpoint: a set opened
    /// before that finds its own hit too late and closes it, rather than move the path
    /// off the socket whose mapping the other side already uses.
    pinned_at: Mutex<HashMap<Endpoint, tokio::time::Instant>>,
}

impl Connector {
    /// A connector whose connections register in `conns` and report their end on
    /// `down`. `tls` is needed for `wss://` and `quic://` listeners; `mtu` is the
    /// largest frame the pipelines produce; accepted connections prove themselves with
    /// a message MACed with `macs` (the network's).
    pub fn new(
        conns: Arc<Connections>,
        down: mpsc::Sender<ConnectionDown>,
        tls: Option<TlsIdentity>,
        max_connections: usize,
        mtu: usize,
        macs: Arc<MacKeys>,
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
                conns,
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
                macs,
                listeners: Mutex::new(HashMap::new()),
                mapping_sets: std::sync::atomic::AtomicUsize::new(0),
                pinned_at: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The connection registry.
    pub fn conns(&self) -> &Arc<Connections> {
        &self.inner.conns
    }

    /// Counters.
    pub fn counters(&self) -> &ConnCounters {
        &self.inner.conns.counters
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
    /// Returns false when a full queue (the connection's, or the dial's) dropped the
    /// frame: the caller counts it.
    pub fn send(&self, to: Endpoint, frame_bytes: &[u8]) -> bool {
        let mut batch = Vec::with_capacity(frame::PREFIX + frame_bytes.len());
        if !frame::push(&mut batch, frame_bytes) {
            debug!(%to, len = frame_bytes.len(), "control frame too long to frame");
            return true;
        }
        // Handshakes and keepalives do not wait behind a download.
        match self.inner.conns.send(to, batch, Lane::Sparse) {
            Ok(queued) => return queued,
            Err(_) if to.proto == Proto::Udp || self.inner.accepted.lock().0.contains(&to) => return true,
            Err(_) => {}
        }
        let mut dialling = self.inner.dialling.lock();
        if let Some(q) = dialling.get_mut(&to) {
            if q.len() >= DIAL_QUEUE {
                return false;
            }
            q.push(frame_bytes.to_vec());
            return true;
        }
        dialling.insert(to, vec![frame_bytes.to_vec()]);
        drop(dialling);
        tokio::spawn(self.clone().dial(to));
        true
    }

    /// Runs an inbound handshake under [`HANDSHAKE_TIMEOUT`], counting failures.
    async fn handshake<T, E: std::fmt::Display>(&self, f: impl Future<Output = Result<T, E>>) -> Result<T, String> {
        let r = match tokio::time::timeout(HANDSHAKE_TIMEOUT, f).await {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("handshake timed out".into()),
        };
        if r.is_err() {
            self.inner.conns.counters.handshake_failures.fetch_add(1, Relaxed);
        }
        r
    }

    async fn dial(self, to: Endpoint) {
        let r = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.connect(to)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} s", HANDSHAKE_TIMEOUT.as_secs())),
        };
        let r = match r {
            Ok(conn) => {
                self.inner.conns.counters.dialled.fetch_add(1, Relaxed);
                debug!(%to, "connected");
                match conn {
                    Dialled::Tcp(s) => self.run_stream(s, to, Proof::dialled()).await,
                    Dialled::Ws(ws) => self.run_ws(*ws, to, Proof::dialled()).await,
                    Dialled::Wss(ws) => self.run_ws(*ws, to, Proof::dialled()).await,
                    Dialled::Quic(c) => self.run_quic(c, to, Proof::dialled()).await,
                }
            }
            Err(e) => {
                self.inner.conns.counters.dial_failures.fetch_add(1, Relaxed);
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
        short_send_buffer(&stream);
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
    fn register(&self, ep: Endpoint, dialled: bool) -> (ConnQueue, u64) {
        let (tx, queue) = ConnQueue::channel(self.inner.conns.clone());
        if dialled {
            let waiting = self.inner.dialling.lock().remove(&ep).unwrap_or_default();
            let mut batch = Vec::new();
            for f in &waiting {
                frame::push(&mut batch, f);
            }
            if !batch.is_empty() {
                let _ = tx.try_send(Queued::now(batch), Lane::Sparse);
            }
        }
        let id = self.inner.conns.register(ep, tx);
        (queue, id)
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
        if self.inner.conns.contains(&ep) {
            return;
        }
        // A full queue only delays the failover to the next tick's stale check.
        let _ = self.inner.down.try_send(ConnectionDown { endpoint: ep, error });
    }
}

enum Dialled {
    Tcp(TcpStream),
    Ws(Box<WebSocketStream<TcpStream>>),
    Wss(Box<WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>>),
    Quic(quinn::Connection),
}

/// Unsent bytes a stream connection's socket may hold before it stops taking more
/// (`TCP_NOTSENT_LOWAT`): beyond what is in flight, the kernel keeps only this much
/// waiting, so a backlog stands in the send queue, where CoDel sees and cuts it
/// ([`ConnQueue`]), instead of in a send buffer that grows to 4 MiB (seconds on a slow
/// uplink). What is unsent waits ahead of any sparse packet: 32 KiB is 5 ms at
/// 50 Mbit/s (128 KiB kept a ping 28 ms behind a download there, 32 KiB 15 ms), and
/// still a fast link's writer loses nothing measurable (bench/RESULTS.md §41).
pub const NOTSENT_LOWAT: u32 = 32 << 10;

/// No Nagle, and a short unsent queue ([`NOTSENT_LOWAT`]) on a stream connection's
/// socket (either failing only costs latency).
pub(super) fn short_send_buffer(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = socket2::SockRef::from(stream).set_tcp_notsent_lowat(NOTSENT_LOWAT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Inbound;
    use bytes::Bytes;
    use fragment::{PART, WHOLE};
    use futures_util::{SinkExt, StreamExt};
    use quic::{quic_window, tune_quic_windows};
    use slots::source_of;
    use std::net::IpAddr;
    use tokio::io::{AsyncRead, AsyncWrite};
    use tokio_tungstenite::tungstenite::Message;

    #[tokio::test]
    async fn a_stream_socket_keeps_its_unsent_queue_short() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        short_send_buffer(&s);
        let sock = socket2::SockRef::from(&s);
        assert_eq!(sock.tcp_notsent_lowat().unwrap(), NOTSENT_LOWAT);
        assert!(sock.tcp_nodelay().unwrap());
    }

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
            _down: mpsc::Receiver<ConnectionDown>,
        }

        fn tls() -> TlsIdentity {
            let cert = rcgen::generate_simple_self_signed(vec!["weft".to_owned()]).expect("certificate");
            TlsIdentity {
                chain: vec![cert.cert.der().clone()],
                key: PrivateKeyDer::try_from(cert.signing_key.serialize_der()).expect("key"),
            }
        }

        /// The network keys of these tests (derived once: the PSK is memory-hard).
        fn macs() -> Arc<MacKeys> {
            static MACS: std::sync::OnceLock<Arc<MacKeys>> = std::sync::OnceLock::new();
            MACS.get_or_init(|| Arc::new(MacKeys::new(&weft_core::handshake::Psk::derive("hostile", "secret")))).clone()
        }

        /// A frame only a member can make: a reject whose mac1 verifies.
        fn member_frame() -> Vec<u8> {
            let reject =
                weft_core::wire::RejectRepr { reason: weft_core::wire::RejectReason::AuthFailed, receiver_index: 7 };
            let mut msg = reject.emit().to_vec();
            macs().seal(&mut msg, None);
            let mut f = Vec::new();
            assert!(frame::push(&mut f, &msg));
            f
        }

        async fn listener(proto: Proto, max: usize) -> Listener {
            let (conns, inbound) = Connections::new(64);
            let (down_tx, down) = mpsc::channel(64);
            let conn = Connector::new(conns, down_tx, Some(tls()), max, 1500, macs()).expect("connector");
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
            // A member's (proven) connection: only the stall deadline applies.
            w.write_all(&member_frame()).await.expect("first frame");
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

        /// A control frame that finds its connection's send queue full is dropped and
        /// said to be (the runtime counts `control_send_blocked`), not lost silently.
        #[tokio::test]
        async fn a_control_frame_dropped_for_a_full_queue_is_reported() {
            use crate::transport::connections::{CONN_QUEUE, CONN_SPARSE_QUEUE, ConnQueue};
            let (conns, _inbound) = Connections::new(8);
            let (down_tx, _down) = mpsc::channel(8);
            let conn = Connector::new(conns.clone(), down_tx, None, 4, 1500, macs()).expect("connector");
            let to = Endpoint::new(Proto::Tcp, "192.0.2.7:11010".parse().expect("addr"));
            // A connection whose writer takes nothing.
            let (tx, _queue) = ConnQueue::channel(conns.clone());
            conns.register(to, tx);
            for i in 0..CONN_SPARSE_QUEUE + CONN_QUEUE {
                assert!(conn.send(to, &[1, 2, 3]), "frame {i} had room");
            }
            assert!(!conn.send(to, &[1, 2, 3]));
        }

        /// A QUIC connection to `addr` from a connector of our own (kept alive by the
        /// returned one), with nothing sent yet.
        async fn quic_client(addr: SocketAddr) -> (quinn::Connection, Connector) {
            let (conns, _inbound) = Connections::new(8);
            let (down_tx, _down) = mpsc::channel(8);
            let client = Connector::new(conns, down_tx, None, 4, 1500, macs()).expect("client");
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
            let (conns, inbound) = Connections::new(64);
            let (down_tx, _down) = mpsc::channel(64);
            let server = Connector::new(conns.clone(), down_tx, Some(tls()), 16, 1500, macs()).expect("connector");
            let addr =
                server.listen(Endpoint::new(Proto::Quic, "127.0.0.1:0".parse().expect("addr"))).await.expect("listen");
            // The connection RX thread's part: take each batch and give its room back, until
            // the test is over.
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let drain = {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Relaxed) {
                        if let Ok(i) = inbound.recv_timeout(Duration::from_millis(50)) {
                            conns.done(0, i.batch);
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

        /// A peer that reads none of the record stream holds the writer's stream write
        /// (quinn waits for flow-control credit, as beside a download whose receiver
        /// is behind); a sparse frame queued meanwhile still leaves, as a datagram.
        #[tokio::test]
        async fn quic_sparse_frames_leave_while_the_stream_waits_for_credit() {
            use crate::transport::Lane;
            use weft_core::wire::{DATA_HEADER_LEN, DataHeader, FLAG_GSO, FLAG_SPARSE};
            let l = listener(Proto::Quic, 16).await;
            let conns = l.conn.conns().clone();
            let (conn, client) = quic_client(l.addr).await;
            let port = client.quic_endpoint().expect("client endpoint").local_addr().expect("local").port();
            let ep = Endpoint::new(Proto::Quic, SocketAddr::from(([127, 0, 0, 1], port)));
            let mut w = conn.open_uni().await.expect("stream");
            w.write_all(&member_frame()).await.expect("a member's first frame");
            let until = StdInstant::now() + Duration::from_secs(5);
            while !conns.contains(&ep) && StdInstant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(conns.contains(&ep), "the server registered no link for {ep}");

            let frame_with = |flags: u8, len: usize| {
                let mut f = vec![0u8; DATA_HEADER_LEN + len];
                let h = DataHeader { flags, lane: 0, receiver_index: 7, counter: 1 };
                h.emit((&mut f[..DATA_HEADER_LEN]).try_into().expect("header"));
                f
            };
            // 2.4 MB of GSO records: more than the peer's 1 MiB window.
            let mut bulk = Vec::new();
            for _ in 0..40 {
                assert!(frame::push(&mut bulk, &frame_with(FLAG_GSO, 60_000)));
            }
            assert_eq!(conns.send(ep, bulk, Lane::Bulk), Ok(true));
            tokio::time::sleep(Duration::from_millis(300)).await;
            let ping = frame_with(FLAG_SPARSE, 84);
            let mut sparse = Vec::new();
            assert!(frame::push(&mut sparse, &ping));
            assert_eq!(conns.send(ep, sparse, Lane::Sparse), Ok(true));
            let got = tokio::time::timeout(Duration::from_secs(5), conn.read_datagram()).await;
            let d = got.expect("the sparse frame waited for the stream's credit").expect("datagram");
            assert!(d.ends_with(&ping), "{} bytes", d.len());
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
            w.write_all(&member_frame()).await.expect("first frame");
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
                // Members' connections: proven, they leave the unproven pool.
                let mut c = connect_from([127, 0, 0, 1], l.addr).await;
                c.write_all(&member_frame()).await.expect("member frame");
                held.push(c);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
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

        #[tokio::test]
        async fn well_framed_strangers_are_closed_at_the_proof_deadline_and_members_stay() {
            let l = listener(Proto::Tcp, 16).await;
            let (mut stranger, mut sw) = connect_from([127, 0, 0, 1], l.addr).await.into_split();
            let (mut member, mut mw) = connect_from([127, 0, 0, 2], l.addr).await.into_split();
            mw.write_all(&member_frame()).await.expect("member frame");
            // Both send a well-framed frame every second: enough for every framing
            // deadline, not for the proof one.
            let keep = |mut w: tokio::net::tcp::OwnedWriteHalf| {
                tokio::spawn(async move {
                    while w.write_all(&[0, 1, 0x42]).await.is_ok() {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                })
            };
            sw.write_all(&[0, 1, 0x42]).await.expect("frame");
            keep(sw);
            keep(mw);
            let start = StdInstant::now();
            let took = closed_within(&mut stranger, PROOF_TIMEOUT + Duration::from_secs(3)).await;
            assert!(took.is_some(), "a stranger's well-framed connection stayed open");
            assert!(start.elapsed() >= PROOF_TIMEOUT - Duration::from_millis(300), "closed early: {took:?}");
            assert_eq!(closed_within(&mut member, Duration::from_secs(2)).await, None, "a member's was closed");
            let c = l.conn.counters();
            assert_eq!(c.unproven_closed.load(Relaxed), 1);
            assert_eq!(c.timeouts.load(Relaxed), 0);
        }

        #[tokio::test]
        async fn unproven_connections_share_a_small_pool_of_their_own() {
            let max = 16;
            assert_eq!((unproven_limit(max), UNPROVEN_PER_SOURCE, per_source_limit(max)), (4, 2, 4));
            let l = listener(Proto::Tcp, max).await;
            let mut open = Vec::new();
            for src in [1, 1, 2, 2] {
                open.push(connect_from([127, 0, 0, src], l.addr).await);
            }
            // A third unproven one from a source (it has slots left, not pool places),
            // and one from a new source (the pool is full): refused at once.
            for src in [1, 3] {
                let mut c = connect_from([127, 0, 0, src], l.addr).await;
                assert!(closed_within(&mut c, Duration::from_secs(2)).await.is_some(), "from {src}: not refused");
            }
            assert_eq!(l.conn.counters().refused_unproven.load(Relaxed), 2);
            // One proves itself: its place goes back, a newcomer gets it, and the
            // proven one stays.
            open[0].write_all(&member_frame()).await.expect("member frame");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut newcomer = connect_from([127, 0, 0, 3], l.addr).await;
            assert_eq!(closed_within(&mut newcomer, Duration::from_millis(300)).await, None);
            assert_eq!(closed_within(&mut open[0], Duration::from_millis(100)).await, None);
            assert_eq!(l.conn.counters().refused_unproven.load(Relaxed), 2);
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
