//! The mapping protocols on the wire: requests to the gateway over a connected UDP
//! socket, retransmitted with each RFC's backoff, answers checked against what was
//! asked; and the order they are tried in (PCP, NAT-PMP, UPnP-IGD).

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::net::UdpSocket;
use tracing::debug;
use weft_core::portmap::{EpochVerdict, EpochWatch, Protocol, pcp, pmp};

use super::upnp::Igd;
use super::{Failure, Settings};

/// How a lease was made (and so is renewed and deleted).
#[derive(Debug, Clone)]
pub(crate) enum Method {
    /// PCP, with the nonce every renewal and the deletion repeat.
    Pcp {
        /// The mapping's nonce.
        nonce: [u8; 12],
    },
    /// NAT-PMP.
    NatPmp,
    /// UPnP-IGD, at the device the search found.
    Upnp(Box<Igd>),
}

/// A mapping held.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) method: Method,
    /// The gateway's address and port forwarded to us.
    pub(crate) external: SocketAddrV4,
    /// Seconds granted.
    pub(crate) lifetime: u32,
    /// When it was granted.
    pub(crate) granted: Instant,
    /// When the gateway drops it.
    pub(crate) expires: Instant,
}

impl Lease {
    fn new(method: Method, external: SocketAddrV4, lifetime: u32, now: Instant) -> Self {
        Self { method, external, lifetime, granted: now, expires: now + Duration::from_secs(u64::from(lifetime)) }
    }

    /// When to renew: at half the lifetime, or after `check_every` if sooner.
    pub(crate) fn renew_at(&self, check_every: Duration) -> Instant {
        let half = Duration::from_secs(u64::from(self.lifetime) / 2).max(Duration::from_secs(1));
        self.granted + half.min(check_every)
    }
}

/// A renewal's outcome: the lease now held, and whether the router had lost the
/// mapping (its epoch went back, or it refused the old one and a new one was made).
pub(crate) struct Renewed {
    pub(crate) lease: Lease,
    pub(crate) restarted: bool,
}

/// The client of one gateway.
pub(crate) struct Client {
    s: Settings,
    epoch: EpochWatch,
    origin: Instant,
}

/// How many times and how long to retransmit.
#[derive(Clone, Copy)]
struct Retry {
    first: Duration,
    max: Duration,
    /// Sends at most; `None`: until `until`.
    tries: Option<u32>,
    until: Option<Instant>,
}

impl Client {
    pub(crate) fn new(s: Settings) -> Self {
        Self { s, epoch: EpochWatch::default(), origin: Instant::now() }
    }

    /// A new mapping, by the first protocol the gateway answers.
    pub(crate) async fn map_any(&mut self) -> Result<Lease, Failure> {
        let t = self.s.timing;
        let mut failures = Vec::new();
        self.epoch.reset();
        let pcp = Retry { first: t.pcp_first, max: t.pcp_max, tries: Some(t.discovery_tries), until: None };
        match self.pcp(random_nonce(), self.s.internal_port, None, t.lifetime, pcp).await {
            Ok((lease, _)) => return Ok(lease),
            Err(e) => failures.push(format!("pcp: {e}")),
        }
        self.epoch.reset();
        let pmp = Retry { first: t.pmp_first, max: t.pmp_max, tries: Some(t.discovery_tries), until: None };
        match self.pmp(self.s.internal_port, t.lifetime, pmp).await {
            Ok((lease, _)) => return Ok(lease),
            Err(e) => failures.push(format!("nat-pmp: {e}")),
        }
        if self.s.upnp {
            match super::upnp::map(&self.s).await {
                Ok((igd, external, lifetime)) => {
                    return Ok(Lease::new(Method::Upnp(Box::new(igd)), external, lifetime, Instant::now()));
                }
                Err(e) => failures.push(format!("upnp: {e}")),
            }
        }
        Err(Failure::All(failures.join("; ")))
    }

    /// The same mapping again before it lapses (retransmitting until it does). A
    /// router that lost it (restarted) and refuses the old port gets a fresh request.
    pub(crate) async fn renew(&mut self, lease: &Lease) -> Result<Renewed, Failure> {
        let t = self.s.timing;
        let until = Some(lease.expires);
        let (renewed, verdict) = match &lease.method {
            Method::Pcp { nonce } => {
                let retry = Retry { first: t.pcp_first, max: t.pcp_max, tries: None, until };
                let ip = Some(*lease.external.ip());
                match self.pcp(*nonce, lease.external.port(), ip, t.lifetime, retry).await {
                    Err(Failure::Pcp(code)) if !code.is_transient() => {
                        debug!(%code, "port mapping: the old mapping was refused; asking for a new one");
                        let (l, _) = self.pcp(random_nonce(), self.s.internal_port, None, t.lifetime, retry).await?;
                        (l, EpochVerdict::Reset)
                    }
                    r => r?,
                }
            }
            Method::NatPmp => {
                let retry = Retry { first: t.pmp_first, max: t.pmp_max, tries: None, until };
                match self.pmp(lease.external.port(), t.lifetime, retry).await {
                    Err(Failure::Pmp(pmp::ResultCode::OutOfResources)) => {
                        let (l, _) = self.pmp(self.s.internal_port, t.lifetime, retry).await?;
                        (l, EpochVerdict::Reset)
                    }
                    r => r?,
                }
            }
            Method::Upnp(igd) => {
                let r = super::upnp::renew(&self.s, igd, lease.external, lease.expires).await?;
                // UPnP shows no epoch. A mapping made again by a new search, at
                // another device address or another endpoint, was lost by the router.
                let (method, verdict) = match r.found {
                    None => (lease.method.clone(), EpochVerdict::Continuous),
                    Some(found) => {
                        let lost = found != **igd || r.external != lease.external;
                        (
                            Method::Upnp(Box::new(found)),
                            if lost { EpochVerdict::Reset } else { EpochVerdict::Continuous },
                        )
                    }
                };
                (Lease::new(method, r.external, r.lifetime, Instant::now()), verdict)
            }
        };
        Ok(Renewed { lease: renewed, restarted: verdict == EpochVerdict::Reset })
    }

    /// Deletes the mapping (lifetime 0).
    pub(crate) async fn delete(&mut self, lease: &Lease) -> Result<(), Failure> {
        let t = self.s.timing;
        let short = t.pmp_first.max(Duration::from_millis(100));
        let retry = Retry { first: short, max: short * 4, tries: Some(3), until: None };
        match &lease.method {
            Method::Pcp { nonce } => match self.pcp(*nonce, 0, None, 0, retry).await {
                Ok(_) | Err(Failure::Unusable(_)) => Ok(()),
                Err(e) => Err(e),
            },
            Method::NatPmp => match self.pmp(0, 0, retry).await {
                Ok(_) | Err(Failure::Unusable(_)) => Ok(()),
                Err(e) => Err(e),
            },
            Method::Upnp(igd) => super::upnp::delete(igd, lease.external.port(), t.upnp_request).await,
        }
    }

    /// A PCP MAP request (lifetime 0: deletion) and its answer.
    async fn pcp(
        &mut self,
        nonce: [u8; 12],
        external_port: u16,
        external_ip: Option<Ipv4Addr>,
        lifetime: u32,
        retry: Retry,
    ) -> Result<(Lease, EpochVerdict), Failure> {
        let sock = self.socket().await?;
        let client_ip = sock.local_addr()?.ip();
        let internal_port = self.s.internal_port;
        let req = pcp::MapRequest {
            nonce,
            protocol: Protocol::Udp,
            internal_port,
            external_port,
            external_ip: IpAddr::V4(external_ip.unwrap_or(Ipv4Addr::UNSPECIFIED)),
            client_ip,
            lifetime,
        };
        let answer = exchange(&sock, &req.emit(), retry, |b| {
            let r = pcp::Response::parse(b).ok()?;
            // Another request's answer (a nonce or port not ours) is not this one's.
            let ours = r
                .mapping
                .is_none_or(|m| m.nonce == nonce && m.protocol == Protocol::Udp && m.internal_port == internal_port);
            (ours && (r.result != pcp::ResultCode::Success || r.mapping.is_some())).then_some(r)
        })
        .await?;
        let verdict = self.epoch.observe(self.origin.elapsed(), answer.epoch);
        if answer.result != pcp::ResultCode::Success {
            return Err(Failure::Pcp(answer.result));
        }
        // Parsed with its body: a success always has one.
        let Some(m) = answer.mapping else { return Err(Failure::Unusable("no mapping")) };
        let IpAddr::V4(ip) = m.external_ip else { return Err(Failure::Unusable("IPv6 external address")) };
        if lifetime > 0 && (answer.lifetime == 0 || m.external_port == 0) {
            return Err(Failure::Unusable("no lifetime or port granted"));
        }
        let lease =
            Lease::new(Method::Pcp { nonce }, SocketAddrV4::new(ip, m.external_port), answer.lifetime, Instant::now());
        Ok((lease, verdict))
    }

    /// NAT-PMP: the external address, then the mapping (lifetime 0: deletion).
    async fn pmp(&mut self, external_port: u16, lifetime: u32, retry: Retry) -> Result<(Lease, EpochVerdict), Failure> {
        let sock = self.socket().await?;
        let internal_port = self.s.internal_port;
        let mut verdict = EpochVerdict::Continuous;
        let ip = if lifetime == 0 {
            Ipv4Addr::UNSPECIFIED
        } else {
            let a = exchange(&sock, &pmp::Request::ExternalAddress.emit(), retry, |b| {
                let r = pmp::Response::parse(b).ok()?;
                matches!(r.answer, pmp::Answer::ExternalAddress(_) | pmp::Answer::Refused { op: 0 }).then_some(r)
            })
            .await?;
            verdict = self.epoch.observe(self.origin.elapsed(), a.epoch);
            match a.answer {
                pmp::Answer::ExternalAddress(ip) => ip,
                _ => return Err(Failure::Pmp(a.result)),
            }
        };
        let req = pmp::Request::Map { protocol: Protocol::Udp, internal_port, external_port, lifetime };
        let r = exchange(&sock, &req.emit(), retry, |b| {
            let r = pmp::Response::parse(b).ok()?;
            let ours = match r.answer {
                pmp::Answer::Mapped { protocol, internal_port: p, .. } => {
                    protocol == Protocol::Udp && p == internal_port
                }
                pmp::Answer::Refused { op } => op == 1,
                pmp::Answer::ExternalAddress(_) => false,
            };
            ours.then_some(r)
        })
        .await?;
        // A restart shows in either answer's epoch.
        if self.epoch.observe(self.origin.elapsed(), r.epoch) == EpochVerdict::Reset {
            verdict = EpochVerdict::Reset;
        }
        let pmp::Answer::Mapped { external_port, lifetime: granted, .. } = r.answer else {
            return Err(Failure::Pmp(r.result));
        };
        if lifetime > 0 && (granted == 0 || external_port == 0) {
            return Err(Failure::Unusable("no lifetime or port granted"));
        }
        let lease = Lease::new(Method::NatPmp, SocketAddrV4::new(ip, external_port), granted, Instant::now());
        Ok((lease, verdict))
    }

    /// A socket from our LAN address to the gateway's port 5351: answers from anyone
    /// else never reach it, and an ICMP unreachable fails the next receive.
    async fn socket(&self) -> Result<UdpSocket, Failure> {
        let sock = UdpSocket::bind(SocketAddrV4::new(self.s.local_ip, 0)).await?;
        sock.connect(self.s.gateway).await?;
        Ok(sock)
    }
}

/// Sends `req` and waits for an answer `accept` takes, retransmitting after `first`,
/// doubling up to `max`, each timeout ±10 % (RFC 6887 §8.1.1's RAND), until the tries
/// or the time run out. Datagrams `accept` refuses are ignored (counted in the log).
async fn exchange<T>(
    sock: &UdpSocket,
    req: &[u8],
    retry: Retry,
    mut accept: impl FnMut(&[u8]) -> Option<T>,
) -> Result<T, Failure> {
    let mut timeout = retry.first;
    let mut sent = 0u32;
    let mut buf = [0u8; pcp::MAX_LEN + 4];
    loop {
        let now = Instant::now();
        if retry.tries.is_some_and(|n| sent >= n) || retry.until.is_some_and(|u| now >= u) {
            return Err(Failure::NoAnswer);
        }
        sock.send(req).await.map_err(classify)?;
        sent += 1;
        let jitter = rand::thread_rng().gen_range(0.9..1.1);
        let mut wait_until = now + timeout.mul_f64(jitter);
        if let Some(u) = retry.until {
            wait_until = wait_until.min(u);
        }
        loop {
            match tokio::time::timeout_at(wait_until.into(), sock.recv(&mut buf)).await {
                Err(_) => break,
                Ok(Err(e)) => return Err(classify(e)),
                Ok(Ok(n)) => match accept(&buf[..n]) {
                    Some(v) => return Ok(v),
                    None => debug!(len = n, "port mapping: ignored an answer that is not ours"),
                },
            }
        }
        timeout = (timeout * 2).min(retry.max);
    }
}

/// ICMP port or host unreachable (reported on a connected socket) ends a protocol's
/// attempt at once.
fn classify(e: std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::HostUnreachable => Failure::Unreachable(e),
        _ => Failure::Io(e),
    }
}

fn random_nonce() -> [u8; 12] {
    let mut n = [0u8; 12];
    rand::thread_rng().fill(&mut n);
    n
}
