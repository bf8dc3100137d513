//! Port mapping: the node asks its router to forward a port of the router's public
//! address to the node's UDP port, so that members elsewhere can reach it directly
//! even behind a NAT that gives every destination a new port (endpoint-dependent
//! mapping), where hole punching fails.
//!
//! ```text
//!   PortMapper task ── PCP MAP ─────────► gateway:5351   (answered? done)
//!                   ── NAT-PMP map ─────► gateway:5351   (else)
//!                   ── SSDP + SOAP ─────► UPnP IGD        (else, igd-next)
//!        │ renew at half the lease (or every `check_every`), re-map when the
//!        │ router's epoch shows it restarted or the lease lapsed, delete on stop
//!        ▼
//!   watch::Sender<State> ──► runtime: the mapped endpoint joins the endpoints our
//!                            topology record announces; status shows the state
//! ```
//!
//! The messages are `weft_core::portmap`'s; this module owns the sockets, timers and
//! retries (RFC 6886 §3.1 and RFC 6887 §8.1.1 backoff). Answers are accepted only from
//! the gateway's address and port (connected sockets) and parsed without trust.

mod exchange;
mod service;
mod upnp;

pub use service::Service;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use weft_control::{PortMapJson, PortMapProtocol};
use weft_core::portmap::{pcp, pmp};

use exchange::{Lease, Method};

/// Lifetime asked for (RFC 6886 recommends two hours).
pub const LIFETIME: u32 = 7200;

/// How long a node waits at shutdown for the router to confirm the deletion.
pub const DELETE_TIMEOUT: Duration = Duration::from_millis(1500);

/// The SSDP multicast group and port a UPnP-IGD search is sent to.
pub const SSDP_GROUP: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(239, 255, 255, 250), 1900));

/// Where and what to map.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The router's PCP/NAT-PMP address (the default gateway, port 5351).
    pub gateway: SocketAddr,
    /// Our address on the router's network (the source of our requests).
    pub local_ip: Ipv4Addr,
    /// The UDP port to map.
    pub internal_port: u16,
    /// Also try UPnP-IGD when PCP and NAT-PMP fail.
    pub upnp: bool,
    /// Where the SSDP search for a UPnP-IGD goes: [`SSDP_GROUP`], except in tests
    /// (a fake device on loopback).
    pub upnp_search_to: SocketAddr,
    /// Timers and retries.
    pub timing: Timing,
}

/// The client's timers. [`Timing::default`] follows the RFCs; tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Lifetime to ask for, in seconds.
    pub lifetime: u32,
    /// A held mapping is renewed at half its lifetime, or after this long if sooner:
    /// each renewal also shows, by the router's epoch, whether it restarted.
    pub check_every: Duration,
    /// PCP's first retransmission timeout (IRT, 3 s), doubling up to `pcp_max` (MRT).
    pub pcp_first: Duration,
    /// PCP's longest retransmission timeout.
    pub pcp_max: Duration,
    /// NAT-PMP's first retransmission timeout (250 ms), doubling up to `pmp_max`.
    pub pmp_first: Duration,
    /// NAT-PMP's longest retransmission timeout (64 s after nine tries).
    pub pmp_max: Duration,
    /// Requests sent to a router not yet known to answer a protocol before falling
    /// back to the next one (a router that answers nothing on 5351 costs this many
    /// timeouts; one that refuses or sends ICMP unreachable, none).
    pub discovery_tries: u32,
    /// How long an SSDP search for an IGD waits.
    pub upnp_search: Duration,
    /// How long one SOAP request to an IGD waits for its answer.
    pub upnp_request: Duration,
    /// After every protocol failed, the next round waits this long, doubling up to
    /// `retry_max`; so does a UPnP renewal that failed, tried again until the lease
    /// ends.
    pub retry_first: Duration,
    /// Longest wait between rounds.
    pub retry_max: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lifetime: LIFETIME,
            check_every: Duration::from_secs(120),
            pcp_first: Duration::from_secs(3),
            pcp_max: Duration::from_secs(1024),
            pmp_first: Duration::from_millis(250),
            pmp_max: Duration::from_secs(64),
            discovery_tries: 2,
            upnp_search: Duration::from_secs(3),
            upnp_request: Duration::from_secs(5),
            retry_first: Duration::from_secs(30),
            retry_max: Duration::from_secs(600),
        }
    }
}

/// Why a protocol made no mapping.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Every request went unanswered.
    #[error("no answer")]
    NoAnswer,
    /// The gateway (or the kernel) said nothing listens there (ICMP unreachable).
    #[error("gateway unreachable: {0}")]
    Unreachable(#[source] std::io::Error),
    /// A socket error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// PCP's result code.
    #[error("refused ({0})")]
    Pcp(pcp::ResultCode),
    /// NAT-PMP's result code.
    #[error("refused ({0})")]
    Pmp(pmp::ResultCode),
    /// The gateway granted a mapping that cannot be used (IPv6, port 0, lifetime 0).
    #[error("unusable answer: {0}")]
    Unusable(&'static str),
    /// UPnP-IGD's error, as igd-next words it.
    #[error("{0}")]
    Upnp(String),
    /// Every protocol failed; each one's failure.
    #[error("{0}")]
    All(String),
}

/// A mapping the router granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    /// Which protocol made it.
    pub protocol: PortMapProtocol,
    /// The router's address and port forwarded to us.
    pub external: SocketAddrV4,
    /// When the router drops it unless renewed.
    pub expires: Instant,
}

/// What the mapper knows, published on every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The router asked.
    pub gateway: Option<IpAddr>,
    /// The UDP port mapped.
    pub internal_port: u16,
    /// The mapping held, if any.
    pub mapping: Option<Mapped>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// Mappings made again after the router lost one (restart, lapsed lease).
    pub remaps: u64,
}

impl State {
    /// The endpoint to announce to members: the mapped one, when its address is
    /// public (a private one means another NAT in front of the router).
    pub fn advertised(&self) -> Option<SocketAddr> {
        self.mapping.filter(|m| is_public(*m.external.ip())).map(|m| SocketAddr::V4(m.external))
    }

    /// The state for `weft status --json`.
    pub fn json(&self, now: Instant) -> PortMapJson {
        PortMapJson {
            gateway: self.gateway.map(|g| g.to_string()),
            internal_port: self.internal_port,
            protocol: self.mapping.map(|m| m.protocol),
            external: self.mapping.map(|m| m.external.to_string()),
            advertised: self.advertised().is_some(),
            expires_in_s: self.mapping.map(|m| m.expires.saturating_duration_since(now).as_secs()),
            last_error: self.last_error.clone(),
            remaps: self.remaps,
        }
    }
}

/// Where a mapper publishes its state: a channel shared by the mappers a node runs
/// one after another, written only by the current one (a mapper being stopped in the
/// background never overwrites its successor's state).
#[derive(Debug, Clone)]
pub struct Publisher {
    tx: Arc<watch::Sender<State>>,
    current: Arc<AtomicU64>,
    mine: u64,
}

impl Publisher {
    /// A publisher on `tx`, current.
    pub fn new(tx: Arc<watch::Sender<State>>) -> Self {
        Self { tx, current: Arc::new(AtomicU64::new(0)), mine: 0 }
    }

    /// A publisher for the next mapper: from now on, only it writes.
    pub fn next(&self) -> Self {
        let mine = self.current.fetch_add(1, Ordering::Relaxed) + 1;
        Self { tx: self.tx.clone(), current: self.current.clone(), mine }
    }

    /// A receiver of the state.
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.tx.subscribe()
    }

    /// The state now.
    pub fn borrow(&self) -> watch::Ref<'_, State> {
        self.tx.borrow()
    }

    /// Changes the state, if this publisher is still the current one.
    pub fn update(&self, f: impl FnOnce(&mut State)) {
        self.tx.send_if_modified(|s| {
            if self.current.load(Ordering::Relaxed) != self.mine {
                return false;
            }
            f(s);
            true
        });
    }
}

/// A running mapper, stopped (and its mapping deleted) by [`PortMapper::shut_down`].
pub struct PortMapper {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl PortMapper {
    /// Starts mapping `settings.internal_port` on `settings.gateway`, publishing what
    /// it knows through `state` (replaced now, updated on every change).
    pub fn spawn(settings: Settings, state: Publisher) -> Self {
        state.update(|s| {
            *s = State {
                gateway: Some(settings.gateway.ip()),
                internal_port: settings.internal_port,
                ..State::default()
            };
        });
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(run(settings, state, stop_rx));
        Self { stop: Some(stop), task }
    }

    /// Stops it: the mapping it holds is deleted on the router (waiting at most
    /// [`DELETE_TIMEOUT`] for the answer). It publishes nothing after.
    pub async fn shut_down(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if tokio::time::timeout(DELETE_TIMEOUT + Duration::from_millis(500), &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Drop for PortMapper {
    fn drop(&mut self) {
        // Dropped without `shut_down`: the task must not outlive it.
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

/// The mapper's loop: map (each protocol in turn), hold and renew, map again when the
/// lease lapses, delete when told to stop.
async fn run(settings: Settings, tx: Publisher, mut stop: oneshot::Receiver<()>) {
    let t = settings.timing;
    let mut client = exchange::Client::new(settings);
    let mut retry = t.retry_first;
    let mut lost = false;
    loop {
        let attempt = tokio::select! {
            r = client.map_any() => r,
            _ = &mut stop => return,
        };
        let mut lease = match attempt {
            Ok(l) => l,
            Err(e) => {
                info!(error = %e, "port mapping: the router made none; trying again in {} s", retry.as_secs());
                tx.update(|s| {
                    s.mapping = None;
                    s.last_error = Some(e.to_string());
                });
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    _ = &mut stop => return,
                }
                retry = (retry * 2).min(t.retry_max);
                continue;
            }
        };
        retry = t.retry_first;
        let remapped = std::mem::take(&mut lost);
        info!(protocol = %lease.protocol(), external = %lease.external, lifetime_s = lease.lifetime, "port mapped");
        tx.update(|s| {
            s.remaps += u64::from(remapped);
            s.mapping = Some(lease.mapped());
            s.last_error = None;
        });
        // Hold it: renew until stopped or the lease lapses.
        loop {
            let renew_at = lease.renew_at(t.check_every);
            tokio::select! {
                () = tokio::time::sleep_until(renew_at.into()) => {}
                _ = &mut stop => {
                    match tokio::time::timeout(DELETE_TIMEOUT, client.delete(&lease)).await {
                        Ok(Ok(())) => info!(external = %lease.external, "port mapping deleted"),
                        Ok(Err(e)) => warn!(error = %e, "port mapping: the router did not delete the mapping"),
                        Err(_) => warn!("port mapping: no answer to the deletion; the router drops it when its lease ends"),
                    }
                    return;
                }
            }
            let renewed = tokio::select! {
                r = client.renew(&lease) => r,
                _ = &mut stop => {
                    let _ = tokio::time::timeout(DELETE_TIMEOUT, client.delete(&lease)).await;
                    return;
                }
            };
            match renewed {
                Ok(r) => {
                    if r.restarted {
                        info!(protocol = %lease.protocol(), "port mapping: the router restarted and lost its mappings; mapped again");
                    }
                    if r.lease.external != lease.external {
                        info!(from = %lease.external, to = %r.lease.external, "port mapping moved");
                    }
                    debug!(external = %r.lease.external, lifetime_s = r.lease.lifetime, "port mapping renewed");
                    lease = r.lease;
                    tx.update(|s| {
                        s.remaps += u64::from(r.restarted);
                        s.mapping = Some(lease.mapped());
                        s.last_error = None;
                    });
                }
                Err(e) => {
                    warn!(error = %e, external = %lease.external, "port mapping lapsed");
                    tx.update(|s| {
                        s.mapping = None;
                        s.last_error = Some(format!("lease lapsed: {e}"));
                    });
                    lost = true;
                    break;
                }
            }
        }
    }
}

/// Whether an external address is one members elsewhere can reach: not private,
/// shared (carrier-grade NAT, 100.64.0.0/10), loopback, link-local or unspecified.
pub fn is_public(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    let shared = o[0] == 100 && (64..128).contains(&o[1]);
    !(ip.is_private() || shared || ip.is_loopback() || ip.is_link_local() || ip.is_unspecified() || ip.is_broadcast())
}

/// The address this host would send to `gateway` from (its LAN address).
pub fn local_ip_towards(gateway: Ipv4Addr) -> std::io::Result<Ipv4Addr> {
    let s = std::net::UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    s.connect(SocketAddr::from((gateway, weft_core::portmap::SERVER_PORT)))?;
    match s.local_addr()?.ip() {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => Err(std::io::Error::other("no IPv4 address towards the gateway")),
    }
}

impl Lease {
    fn mapped(&self) -> Mapped {
        let protocol = match self.method {
            Method::Pcp { .. } => PortMapProtocol::Pcp,
            Method::NatPmp => PortMapProtocol::NatPmp,
            Method::Upnp(_) => PortMapProtocol::Upnp,
        };
        Mapped { protocol, external: self.external, expires: self.expires }
    }

    fn protocol(&self) -> PortMapProtocol {
        self.mapped().protocol
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_upnp;
