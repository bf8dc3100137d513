//! The mapper against a router on loopback that answers as miniupnpd does (its
//! answers are `weft_core::portmap`'s, whose encoding the core tests check against
//! miniupnpd's recorded bytes), scripted to refuse, fall silent, let a lease lapse or
//! restart and forget its mappings.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::watch;
use weft_control::PortMapProtocol;
use weft_core::portmap::{pcp, pmp};

use super::{PortMapper, Publisher, Settings, State, Timing};

const EXTERNAL: Ipv4Addr = Ipv4Addr::new(100, 200, 0, 2);
/// The UDP port the mappers of these tests and of `tests_upnp` map.
pub(super) const PORT: u16 = 11010;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Answer,
    Refuse(u16),
    Silent,
    /// PCP only: answer as a NAT-PMP gateway does (unsupported version).
    NatPmpOnly,
}

/// What the fake router does and has done.
struct Script {
    pcp: Mode,
    pmp: Mode,
    /// Longest lifetime granted.
    max_lifetime: u32,
    /// The router's start (its epoch counts from here, plus `epoch_base`).
    booted: Instant,
    epoch_base: u32,
    /// Internal port -> external port.
    table: HashMap<u16, u16>,
    /// External ports another client holds.
    taken: Vec<u16>,
    /// Requests that deleted a mapping.
    deletes: u32,
    /// Requests of each kind.
    pcp_requests: u32,
    pmp_requests: u32,
}

impl Script {
    fn new(pcp: Mode, pmp: Mode) -> Self {
        Self {
            pcp,
            pmp,
            max_lifetime: 3600,
            booted: Instant::now(),
            epoch_base: 5000,
            table: HashMap::new(),
            taken: Vec::new(),
            deletes: 0,
            pcp_requests: 0,
            pmp_requests: 0,
        }
    }

    fn epoch(&self) -> u32 {
        self.epoch_base + self.booted.elapsed().as_secs() as u32
    }

    /// The router restarts: its epoch starts again and its table is empty.
    fn reboot(&mut self) {
        self.booted = Instant::now();
        self.epoch_base = 0;
        self.table.clear();
    }

    /// Maps `internal` to the suggested port if free, else the next free one.
    fn map(&mut self, internal: u16, suggested: u16, lifetime: u32) -> (u16, u32) {
        if lifetime == 0 {
            self.deletes += 1;
            self.table.remove(&internal);
            return (0, 0);
        }
        let port = match self.table.get(&internal) {
            Some(p) => *p,
            None => {
                let mut p = if suggested == 0 { 40000 } else { suggested };
                while self.taken.contains(&p) || self.table.values().any(|v| *v == p) {
                    p += 1;
                }
                self.table.insert(internal, p);
                p
            }
        };
        (port, lifetime.min(self.max_lifetime))
    }

    fn answer(&mut self, req: &[u8]) -> Option<Vec<u8>> {
        match *req.first()? {
            pcp::VERSION => {
                self.pcp_requests += 1;
                let r = pcp::MapRequest::parse(req).ok()?;
                let refuse = |code: u8| pcp::Response {
                    result: pcp::ResultCode::from_wire(code),
                    lifetime: 30,
                    epoch: self.epoch(),
                    mapping: None,
                };
                match self.pcp {
                    Mode::Silent => None,
                    Mode::NatPmpOnly => Some(vec![0, 0x81, 0, 1, 0, 0, 0, 0]),
                    Mode::Refuse(code) => Some(refuse(code as u8).emit()),
                    Mode::Answer => {
                        let (port, lifetime) = self.map(r.internal_port, r.external_port, r.lifetime);
                        let mapping = pcp::Mapping {
                            nonce: r.nonce,
                            protocol: r.protocol,
                            internal_port: r.internal_port,
                            external_port: port,
                            external_ip: EXTERNAL.into(),
                        };
                        let resp = pcp::Response {
                            result: pcp::ResultCode::Success,
                            lifetime,
                            epoch: self.epoch(),
                            mapping: Some(mapping),
                        };
                        Some(resp.emit())
                    }
                }
            }
            pmp::VERSION => {
                self.pmp_requests += 1;
                let r = pmp::Request::parse(req).ok()?;
                let op = match r {
                    pmp::Request::ExternalAddress => 0,
                    pmp::Request::Map { .. } => 1,
                };
                let answer = match (self.pmp, r) {
                    (Mode::Silent | Mode::NatPmpOnly, _) => return None,
                    (Mode::Refuse(code), _) => {
                        return Some(
                            pmp::Response {
                                result: pmp::ResultCode::from_wire(code),
                                epoch: self.epoch(),
                                answer: pmp::Answer::Refused { op },
                            }
                            .emit(),
                        );
                    }
                    (Mode::Answer, pmp::Request::ExternalAddress) => pmp::Answer::ExternalAddress(EXTERNAL),
                    (Mode::Answer, pmp::Request::Map { protocol, internal_port, external_port, lifetime }) => {
                        let (port, lifetime) = self.map(internal_port, external_port, lifetime);
                        pmp::Answer::Mapped { protocol, internal_port, external_port: port, lifetime }
                    }
                };
                Some(pmp::Response { result: pmp::ResultCode::Success, epoch: self.epoch(), answer }.emit())
            }
            _ => None,
        }
    }
}

/// A fake router on loopback; returns its address.
async fn router(script: Arc<Mutex<Script>>) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = sock.recv_from(&mut buf).await {
            let answer = script.lock().unwrap().answer(&buf[..n]);
            if let Some(a) = answer {
                let _ = sock.send_to(&a, from).await;
            }
        }
    });
    addr
}

/// Short timers: a test takes a few seconds at most.
pub(super) fn timing() -> Timing {
    Timing {
        lifetime: 3600,
        check_every: Duration::from_secs(3600),
        pcp_first: Duration::from_millis(100),
        pcp_max: Duration::from_millis(400),
        pmp_first: Duration::from_millis(50),
        pmp_max: Duration::from_millis(200),
        discovery_tries: 2,
        upnp_search: Duration::from_millis(100),
        upnp_request: Duration::from_millis(300),
        retry_first: Duration::from_millis(200),
        retry_max: Duration::from_millis(400),
    }
}

/// A mapper and its state.
pub(super) struct Running {
    mapper: PortMapper,
    /// What it publishes.
    pub(super) state: watch::Receiver<State>,
}

impl Running {
    /// Stops it, which deletes its mapping.
    pub(super) async fn shut_down(self) {
        self.mapper.shut_down().await;
    }
}

/// A mapper of `PORT` on `gateway`, PCP and NAT-PMP only.
fn start(gateway: SocketAddr, timing: Timing) -> Running {
    spawn(Settings {
        gateway,
        local_ip: Ipv4Addr::LOCALHOST,
        internal_port: PORT,
        upnp: false,
        upnp_search_to: super::SSDP_GROUP,
        timing,
    })
}

/// A mapper with these settings.
pub(super) fn spawn(settings: Settings) -> Running {
    let (tx, state) = watch::channel(State::default());
    Running { mapper: PortMapper::spawn(settings, Publisher::new(Arc::new(tx))), state }
}

/// Waits (at most 10 s) until the state satisfies `f`; returns it.
pub(super) async fn until(rx: &mut watch::Receiver<State>, what: &str, f: impl Fn(&State) -> bool) -> State {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        {
            let s = rx.borrow_and_update();
            if f(&s) {
                return s.clone();
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            _ => panic!("port mapper never reached: {what}; last state {:?}", rx.borrow()),
        }
    }
}

/// The external endpoint of the mapping held, if any.
pub(super) fn external(s: &State) -> Option<SocketAddrV4> {
    s.mapping.map(|m| m.external)
}

#[tokio::test]
async fn pcp_maps_and_the_mapping_is_deleted_on_shutdown() {
    let script = Arc::new(Mutex::new(Script::new(Mode::Answer, Mode::Answer)));
    let gw = router(script.clone()).await;
    let mut m = start(gw, timing());
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    let mapped = s.mapping.unwrap();
    assert_eq!(mapped.protocol, PortMapProtocol::Pcp);
    assert_eq!(mapped.external, SocketAddrV4::new(EXTERNAL, PORT));
    assert_eq!(s.last_error, None);
    // 100.200.0.2 is not a private range: members are told of it.
    assert_eq!(s.advertised(), Some(SocketAddr::V4(SocketAddrV4::new(EXTERNAL, PORT))));
    let json = s.json(Instant::now());
    assert_eq!(json.protocol, Some(PortMapProtocol::Pcp));
    assert!(json.expires_in_s.is_some_and(|e| e > 3500 && e <= 3600), "{json:?}");
    assert_eq!(script.lock().unwrap().pmp_requests, 0, "NAT-PMP is not asked when PCP answers");
    m.shut_down().await;
    let s = script.lock().unwrap();
    assert_eq!(s.deletes, 1);
    assert!(s.table.is_empty());
}

#[tokio::test]
async fn a_refusal_by_pcp_falls_back_to_nat_pmp() {
    // NOT_AUTHORIZED from PCP, then NAT-PMP maps.
    let script = Arc::new(Mutex::new(Script::new(Mode::Refuse(2), Mode::Answer)));
    let gw = router(script.clone()).await;
    let mut m = start(gw, timing());
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(s.mapping.unwrap().protocol, PortMapProtocol::NatPmp);
    assert_eq!(external(&s), Some(SocketAddrV4::new(EXTERNAL, PORT)));
    assert_eq!(script.lock().unwrap().pcp_requests, 1, "a refusal is final: no retransmission");
    m.shut_down().await;
    assert_eq!(script.lock().unwrap().deletes, 1);
}

#[tokio::test]
async fn a_nat_pmp_only_router_is_spoken_to_in_nat_pmp() {
    let script = Arc::new(Mutex::new(Script::new(Mode::NatPmpOnly, Mode::Answer)));
    let gw = router(script.clone()).await;
    let mut m = start(gw, timing());
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(s.mapping.unwrap().protocol, PortMapProtocol::NatPmp);
    m.shut_down().await;
}

#[tokio::test]
async fn refusals_of_every_protocol_are_reported_and_retried() {
    // PCP NO_RESOURCES, NAT-PMP "not authorized".
    let script = Arc::new(Mutex::new(Script::new(Mode::Refuse(8), Mode::Refuse(2))));
    let gw = router(script.clone()).await;
    let mut m = start(gw, timing());
    let s = until(&mut m.state, "an error", |s| s.last_error.is_some()).await;
    let e = s.last_error.unwrap();
    assert!(e.contains("pcp: refused (no resources)") && e.contains("nat-pmp: refused (not authorized)"), "{e}");
    assert_eq!(s.mapping, None);
    // The router changes its mind: the next round maps.
    script.lock().unwrap().pmp = Mode::Answer;
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(s.last_error, None);
    assert_eq!(s.remaps, 0, "a first mapping is no re-map");
    m.shut_down().await;
}

#[tokio::test]
async fn a_router_without_a_server_fails_at_once() {
    // A port nothing listens on: the kernel's ICMP port unreachable ends each attempt.
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut m = start(closed, timing());
    let s = until(&mut m.state, "an error", |s| s.last_error.is_some()).await;
    let e = s.last_error.unwrap();
    assert!(e.contains("pcp: gateway unreachable") && e.contains("nat-pmp: gateway unreachable"), "{e}");
    m.shut_down().await;
}

/// The router grants 2 s leases, then falls silent: the renewals (retransmitted)
/// go unanswered, the mapping is withdrawn when its lease ends (not before), and made
/// again once the router answers, counted as a re-map. `pcp` is how the router
/// answers PCP (NatPmpOnly: a NAT-PMP gateway).
async fn a_lease_lapses(pcp: Mode, protocol: PortMapProtocol) {
    let script = Arc::new(Mutex::new(Script::new(pcp, Mode::Answer)));
    script.lock().unwrap().max_lifetime = 2;
    let gw = router(script.clone()).await;
    let mut m = start(gw, timing());
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    let first = s.mapping.unwrap();
    assert_eq!(first.protocol, protocol);
    assert!(first.expires <= Instant::now() + Duration::from_secs(2));
    // The router stops answering: renewals at 1 s go unanswered until the lease ends.
    let asked = |s: &Script| if protocol == PortMapProtocol::Pcp { s.pcp_requests } else { s.pmp_requests };
    let before = asked(&script.lock().unwrap());
    script.lock().unwrap().pcp = Mode::Silent;
    script.lock().unwrap().pmp = Mode::Silent;
    let s = until(&mut m.state, "lapsed", |s| s.mapping.is_none()).await;
    assert!(Instant::now() >= first.expires, "withdrawn before the router dropped it");
    assert!(s.last_error.as_deref().is_some_and(|e| e.starts_with("lease lapsed: no answer")), "{s:?}");
    let renewals = asked(&script.lock().unwrap()) - before;
    assert!(renewals >= 2, "the renewal was retransmitted ({renewals} requests in {protocol:?})");
    // It answers again: mapped anew, counted as a re-map.
    script.lock().unwrap().pcp = pcp;
    script.lock().unwrap().pmp = Mode::Answer;
    let s = until(&mut m.state, "mapped again", |s| s.mapping.is_some()).await;
    assert_eq!(s.mapping.unwrap().protocol, protocol);
    assert_eq!(s.remaps, 1);
    assert_eq!(s.last_error, None);
    m.shut_down().await;
}

#[tokio::test]
async fn a_pcp_lease_that_lapses_is_withdrawn_then_made_again() {
    a_lease_lapses(Mode::Answer, PortMapProtocol::Pcp).await;
}

#[tokio::test]
async fn a_nat_pmp_lease_that_lapses_is_withdrawn_then_made_again() {
    a_lease_lapses(Mode::NatPmpOnly, PortMapProtocol::NatPmp).await;
}

/// The router restarts and forgets its mappings, and another client took our old
/// port meanwhile: the next renewal sees the epoch start again, the mapping is made
/// anew and the new port is what the state (and so the record) says.
async fn reboot_forgets_the_mapping(pcp: Mode) {
    let script = Arc::new(Mutex::new(Script::new(pcp, Mode::Answer)));
    let gw = router(script.clone()).await;
    let t = Timing { check_every: Duration::from_millis(500), ..timing() };
    let mut m = start(gw, t);
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(external(&s), Some(SocketAddrV4::new(EXTERNAL, PORT)));
    // A renewal while the router runs on: same mapping, no re-map.
    let renewed_at = Instant::now();
    let s = until(&mut m.state, "renewed", |s| {
        s.mapping.is_some_and(|m| m.expires > renewed_at + Duration::from_secs(3500))
    })
    .await;
    assert_eq!(s.remaps, 0);
    {
        let mut r = script.lock().unwrap();
        r.reboot();
        r.taken.push(PORT);
    }
    let s = until(&mut m.state, "re-mapped", |s| s.remaps == 1).await;
    assert_eq!(external(&s), Some(SocketAddrV4::new(EXTERNAL, PORT + 1)));
    assert_eq!(s.last_error, None);
    m.shut_down().await;
    assert!(script.lock().unwrap().table.is_empty());
}

#[tokio::test]
async fn a_pcp_router_that_restarts_is_mapped_again() {
    reboot_forgets_the_mapping(Mode::Answer).await;
}

#[tokio::test]
async fn a_nat_pmp_router_that_restarts_is_mapped_again() {
    reboot_forgets_the_mapping(Mode::NatPmpOnly).await;
}

#[test]
fn only_public_external_addresses_are_advertised() {
    use super::is_public;
    assert!(is_public(EXTERNAL));
    assert!(is_public(Ipv4Addr::new(203, 0, 113, 7)));
    for private in ["192.168.1.1", "10.0.0.1", "172.16.0.1", "100.64.0.1", "100.127.255.1", "127.0.0.1", "169.254.1.1"]
    {
        assert!(!is_public(private.parse().unwrap()), "{private}");
    }
}
