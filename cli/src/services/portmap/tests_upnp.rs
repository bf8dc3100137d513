//! The mapper against a UPnP-IGD on loopback that answers with miniupnpd's recorded
//! bytes (`fixtures/upnp/`; its README.md says how they were recorded): an SSDP
//! responder and an HTTP server over a table of mappings with leases, scripted to
//! refuse, fall silent, take only permanent leases or reboot and forget. PCP and
//! NAT-PMP are asked at a closed port, so they fail at once and UPnP is what maps.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use weft_control::PortMapProtocol;

use super::tests::{PORT, external, spawn, timing, until};
use super::{Settings, Timing};

/// miniupnpd 2.3.1's answers, as recorded (HTTP ones with their headers).
mod recorded {
    /// To the M-SEARCH for an `InternetGatewayDevice:1`.
    pub(super) const SSDP: &str = include_str!("fixtures/upnp/ssdp-response.txt");
    /// GET /rootDesc.xml.
    pub(super) const ROOT_DESC: &str = include_str!("fixtures/upnp/rootDesc.http");
    /// GET /WANIPCn.xml.
    pub(super) const SCPD: &str = include_str!("fixtures/upnp/WANIPCn.http");
    /// GetExternalIPAddress.
    pub(super) const EXTERNAL_IP: &str = include_str!("fixtures/upnp/get-external-ip.http");
    /// AddPortMapping, granted.
    pub(super) const ADD: &str = include_str!("fixtures/upnp/add-port-mapping.http");
    /// AddPortMapping of a port mapped to another host: 718 ConflictInMappingEntry.
    pub(super) const ADD_718: &str = include_str!("fixtures/upnp/add-port-mapping-718.http");
    /// AddPortMapping that failed inside the router: 501 ActionFailed.
    pub(super) const ADD_501: &str = include_str!("fixtures/upnp/add-port-mapping-501.http");
    /// Made by hand from `ADD_718` (miniupnpd never sends it): 725
    /// OnlyPermanentLeasesSupported.
    pub(super) const ADD_725: &str = include_str!("fixtures/upnp/add-port-mapping-725-handmade.http");
    /// AddAnyPortMapping, granted (`NewReservedPort` 40001).
    pub(super) const ADD_ANY: &str = include_str!("fixtures/upnp/add-any-port-mapping.http");
    /// DeletePortMapping, done.
    pub(super) const DELETE: &str = include_str!("fixtures/upnp/delete-port-mapping.http");
    /// DeletePortMapping of a port not mapped: success all the same.
    pub(super) const DELETE_UNKNOWN: &str = include_str!("fixtures/upnp/delete-port-mapping-unknown.http");
    /// 714 NoSuchEntryInArray (to GetSpecificPortMappingEntry; a fault does not name
    /// its action, so it stands for a strict router's answer to DeletePortMapping).
    pub(super) const NO_SUCH_ENTRY: &str = include_str!("fixtures/upnp/get-specific-entry-714.http");

    /// In `SSDP`'s LOCATION, replaced by the fake's own HTTP address.
    pub(super) const LOCATION: &str = "http://192.168.77.1:5000/";
    /// In `EXTERNAL_IP`, replaced by the fake router's external address.
    pub(super) const EXTERNAL: &str = "100.200.0.1";
    /// In `ADD_ANY`, replaced by the port the fake grants.
    pub(super) const RESERVED: &str = "<NewReservedPort>40001</NewReservedPort>";
}

/// The router's external address when it was recorded.
const RECORDED_EXTERNAL: Ipv4Addr = Ipv4Addr::new(100, 200, 0, 1);

/// Another host of the LAN (the recording's second one).
const OTHER_HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 3);

/// Not recorded: the fake's answer to a GET of anything but the two descriptions.
const NOT_FOUND: &str = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// How the fake answers AddPortMapping and AddAnyPortMapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// As miniupnpd does.
    Answer,
    /// With this recorded refusal.
    Refuse(&'static str),
    /// Not at all, and no other action either: connections stay open, unanswered.
    Silent,
}

/// A mapping the router holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// The host it forwards to.
    client: Ipv4Addr,
    /// The port it forwards to.
    internal_port: u16,
    /// When the router drops it; `None`: permanent.
    expires: Option<Instant>,
}

/// What came of a SOAP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Done: a success answer.
    Done,
    /// Refused with this UPnP error code.
    Refused(u16),
    /// No answer (the router is silent).
    Unanswered,
}

/// A SOAP request the router saw.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    /// The action (after the `#` of the SOAPAction header).
    action: String,
    /// `NewExternalPort`, for the actions that carry it.
    port: Option<u16>,
    /// `NewLeaseDuration`, for the actions that carry it.
    lease: Option<u32>,
    /// What came of it.
    outcome: Outcome,
    /// The mapping made, for AddAnyPortMapping.
    reserved: Option<u16>,
}

/// The fake router's state and script.
#[derive(Debug)]
struct Router {
    /// The address GetExternalIPAddress answers.
    external: Ipv4Addr,
    /// How it answers requests to map.
    mode: Mode,
    /// Refuse (725) any lease but a permanent one.
    permanent_only: bool,
    /// DeletePortMapping of a port not mapped is refused (714), as most routers do,
    /// rather than answered with success, as the recorded miniupnpd does.
    strict_delete: bool,
    /// External port -> mapping.
    table: HashMap<u16, Entry>,
    /// Every SOAP request, in order.
    calls: Vec<Call>,
    /// External ports whose lease ended before they were renewed.
    lapsed: Vec<u16>,
    /// M-SEARCH requests answered.
    searches: u32,
}

impl Router {
    /// A router as recorded, answering, with no mapping.
    fn new() -> Self {
        Self {
            external: RECORDED_EXTERNAL,
            mode: Mode::Answer,
            permanent_only: false,
            strict_delete: false,
            table: HashMap::new(),
            calls: Vec::new(),
            lapsed: Vec::new(),
            searches: 0,
        }
    }

    /// The router restarts: it forgets every mapping and comes back at `external`.
    fn reboot(&mut self, external: Ipv4Addr) {
        self.table.clear();
        self.external = external;
    }

    /// Drops the mappings whose lease ended, noting them.
    fn expire(&mut self) {
        let now = Instant::now();
        let ended: Vec<u16> =
            self.table.iter().filter(|(_, e)| e.expires.is_some_and(|x| x <= now)).map(|(p, _)| *p).collect();
        for p in ended {
            self.table.remove(&p);
            self.lapsed.push(p);
        }
    }

    /// The mapping of `port`, if its lease has not ended.
    fn holds(&mut self, port: u16) -> Option<Entry> {
        self.expire();
        self.table.get(&port).copied()
    }

    /// The requests of `action`, in order.
    fn calls_of(&self, action: &str) -> Vec<Call> {
        self.calls.iter().filter(|c| c.action == action).cloned().collect()
    }

    /// Answers a SOAP action (`None`: silence), noting the call.
    fn soap(&mut self, action: &str, body: &str) -> Option<String> {
        self.expire();
        let port = arg(body, "NewExternalPort").and_then(|p| p.parse().ok());
        let lease = arg(body, "NewLeaseDuration").and_then(|l| l.parse().ok());
        let client = arg(body, "NewInternalClient").and_then(|c| c.parse().ok());
        let internal_port = arg(body, "NewInternalPort").and_then(|p| p.parse().ok());
        let mut reserved = None;
        let answer = if self.mode == Mode::Silent {
            None
        } else {
            Some(match action {
                "GetExternalIPAddress" => edit(recorded::EXTERNAL_IP, recorded::EXTERNAL, &self.external.to_string()),
                "AddPortMapping" => {
                    let (port, client, internal_port, lease) =
                        (port.unwrap(), client.unwrap(), internal_port.unwrap(), lease.unwrap());
                    match self.add(port, client, internal_port, lease) {
                        Ok(()) => recorded::ADD.to_owned(),
                        Err(refusal) => refusal.to_owned(),
                    }
                }
                "AddAnyPortMapping" => {
                    let (port, client, internal_port, lease) =
                        (port.unwrap(), client.unwrap(), internal_port.unwrap(), lease.unwrap());
                    match self.add_any(port, client, internal_port, lease) {
                        Ok(p) => {
                            reserved = Some(p);
                            let granted = format!("<NewReservedPort>{p}</NewReservedPort>");
                            edit(recorded::ADD_ANY, recorded::RESERVED, &granted)
                        }
                        Err(refusal) => refusal.to_owned(),
                    }
                }
                "DeletePortMapping" => match self.table.remove(&port.unwrap()) {
                    Some(_) => recorded::DELETE.to_owned(),
                    None if self.strict_delete => recorded::NO_SUCH_ENTRY.to_owned(),
                    None => recorded::DELETE_UNKNOWN.to_owned(),
                },
                other => panic!("the fake IGD does not know the action {other}"),
            })
        };
        let outcome = match &answer {
            None => Outcome::Unanswered,
            Some(a) => match arg(a, "errorCode") {
                Some(code) => Outcome::Refused(code.parse().unwrap()),
                None => Outcome::Done,
            },
        };
        self.calls.push(Call { action: action.to_owned(), port, lease, outcome, reserved });
        answer
    }

    /// AddPortMapping: maps `port`, or renews the mapping `client` holds there.
    fn add(&mut self, port: u16, client: Ipv4Addr, internal_port: u16, lease: u32) -> Result<(), &'static str> {
        self.may_map(lease)?;
        if self.table.get(&port).is_some_and(|e| e.client != client) {
            return Err(recorded::ADD_718);
        }
        self.table.insert(port, Entry { client, internal_port, expires: expiry(lease) });
        Ok(())
    }

    /// AddAnyPortMapping: `port` if free (or `client`'s), else the next free one, as
    /// miniupnpd picks (the recording's 40000 taken gave 40001).
    fn add_any(&mut self, port: u16, client: Ipv4Addr, internal_port: u16, lease: u32) -> Result<u16, &'static str> {
        self.may_map(lease)?;
        let mut p = port;
        while self.table.get(&p).is_some_and(|e| e.client != client) {
            p = p.checked_add(1).unwrap_or(1024);
        }
        self.table.insert(p, Entry { client, internal_port, expires: expiry(lease) });
        Ok(p)
    }

    /// The script's refusals of a mapping, before the table is looked at.
    fn may_map(&self, lease: u32) -> Result<(), &'static str> {
        if let Mode::Refuse(refusal) = self.mode {
            return Err(refusal);
        }
        if self.permanent_only && lease != 0 {
            return Err(recorded::ADD_725);
        }
        Ok(())
    }
}

/// When a lease of `lease` seconds granted now ends (0: never).
fn expiry(lease: u32) -> Option<Instant> {
    (lease != 0).then(|| Instant::now() + Duration::from_secs(u64::from(lease)))
}

/// The text of `<name>…</name>` in a SOAP body, found by plain search.
fn arg<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let len = body[start..].find(&format!("</{name}>"))?;
    Some(&body[start..start + len])
}

/// A recorded HTTP answer with `from` replaced by `to` in its body and its
/// Content-Length set to the new length.
fn edit(answer: &str, from: &str, to: &str) -> String {
    let (head, body) = answer.split_once("\r\n\r\n").expect("a recorded answer has a head and a body");
    assert!(body.contains(from), "the recorded answer no longer holds {from:?}");
    let body = body.replace(from, to);
    let head: Vec<String> = head
        .split("\r\n")
        .map(|l| {
            if l.to_ascii_lowercase().starts_with("content-length:") {
                format!("Content-Length: {}", body.len())
            } else {
                l.to_owned()
            }
        })
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n"))
}

/// An IGD on loopback: its SSDP address, and its router's state.
struct Fake {
    /// What the device answers and has seen, shared with its tasks.
    router: Arc<Mutex<Router>>,
    /// Where the mapper's M-SEARCH goes.
    ssdp: SocketAddr,
    /// The SSDP responder and the HTTP server's accept loop.
    tasks: Vec<JoinHandle<()>>,
}

impl Fake {
    /// Starts the SSDP responder and the HTTP server.
    async fn start() -> Self {
        let router = Arc::new(Mutex::new(Router::new()));
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let location = format!("http://{}/", http.local_addr().unwrap());
        let ssdp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let ssdp_addr = ssdp.local_addr().unwrap();
        let r = router.clone();
        let search = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = ssdp.recv_from(&mut buf).await {
                let req = String::from_utf8_lossy(&buf[..n]);
                if req.starts_with("M-SEARCH * HTTP/1.1\r\n")
                    && req.contains("ST:urn:schemas-upnp-org:device:InternetGatewayDevice:1\r\n")
                {
                    r.lock().unwrap().searches += 1;
                    let answer = recorded::SSDP.replace(recorded::LOCATION, &location);
                    let _ = ssdp.send_to(answer.as_bytes(), from).await;
                }
            }
        });
        let r = router.clone();
        let serve = tokio::spawn(async move {
            while let Ok((stream, _)) = http.accept().await {
                tokio::spawn(serve(stream, r.clone()));
            }
        });
        Self { router, ssdp: ssdp_addr, tasks: vec![search, serve] }
    }

    /// The router's state (the lock is held as long as the guard lives).
    fn router(&self) -> MutexGuard<'_, Router> {
        self.router.lock().unwrap()
    }

    /// Settings that send the SSDP search here: PCP and NAT-PMP at a closed port.
    fn settings(&self, timing: Timing) -> Settings {
        let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        Settings {
            gateway: closed,
            local_ip: Ipv4Addr::LOCALHOST,
            internal_port: PORT,
            upnp: true,
            upnp_search_to: self.ssdp,
            timing,
        }
    }

    /// Waits (at most 10 s) until the router's state satisfies `f`.
    async fn until(&self, what: &str, f: impl Fn(&mut Router) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f(&mut self.router()) {
            assert!(Instant::now() < deadline, "the router never reached: {what}; it saw {:?}", self.router().calls);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Fake {
    /// Stops the responder and the server (connections left silent end with the test).
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One HTTP exchange: the descriptions by GET, the actions by POST.
async fn serve(mut stream: TcpStream, router: Arc<Mutex<Router>>) {
    let Some((line, action, body)) = read_request(&mut stream).await else { return };
    let answer = match (line.split(' ').next(), line.split(' ').nth(1), action) {
        (Some("GET"), Some("/rootDesc.xml"), _) => Some(recorded::ROOT_DESC.to_owned()),
        (Some("GET"), Some("/WANIPCn.xml"), _) => Some(recorded::SCPD.to_owned()),
        (Some("POST"), Some("/ctl/IPConn"), Some(action)) => router.lock().unwrap().soap(&action, &body),
        _ => Some(NOT_FOUND.to_owned()),
    };
    match answer {
        Some(a) => {
            let _ = stream.write_all(a.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        // Silent: the connection stays open and unanswered until the test ends.
        None => std::future::pending::<()>().await,
    }
}

/// Reads one request: its first line, the action its SOAPAction header names, its body.
async fn read_request(stream: &mut TcpStream) -> Option<(String, Option<String>, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let mut lines = head.split("\r\n");
            let line = lines.next()?.to_owned();
            let mut len = 0;
            let mut action = None;
            for (name, value) in lines.filter_map(|l| l.split_once(':')) {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => len = value.trim().parse().ok()?,
                    "soapaction" => action = value.trim().trim_matches('"').rsplit_once('#').map(|(_, a)| a.to_owned()),
                    _ => {}
                }
            }
            if buf.len() >= end + 4 + len {
                let body = String::from_utf8(buf[end + 4..end + 4 + len].to_vec()).ok()?;
                return Some((line, action, body));
            }
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Short timers, with time for the search and each request on a busy machine.
fn upnp_timing() -> Timing {
    Timing { upnp_search: Duration::from_secs(1), upnp_request: Duration::from_secs(1), ..timing() }
}

/// Our endpoint at the recorded external address.
fn recorded_at(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(RECORDED_EXTERNAL, port)
}

/// The fixtures are as the fake expects them: each HTTP answer whole (its
/// Content-Length is its body's), and the parts the fake replaces where they were.
#[test]
fn the_recorded_answers_are_whole() {
    for (name, answer) in [
        ("rootDesc", recorded::ROOT_DESC),
        ("WANIPCn", recorded::SCPD),
        ("external ip", recorded::EXTERNAL_IP),
        ("add", recorded::ADD),
        ("718", recorded::ADD_718),
        ("501", recorded::ADD_501),
        ("725", recorded::ADD_725),
        ("add any", recorded::ADD_ANY),
        ("delete", recorded::DELETE),
        ("delete unknown", recorded::DELETE_UNKNOWN),
        ("714", recorded::NO_SUCH_ENTRY),
    ] {
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let len: usize = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).unwrap().parse().unwrap();
        assert_eq!(len, body.len(), "{name}: Content-Length");
    }
    assert!(recorded::SSDP.contains(&format!("LOCATION: {}rootDesc.xml\r\n", recorded::LOCATION)));
    assert_eq!(arg(recorded::ADD_718, "errorCode"), Some("718"));
    assert_eq!(arg(recorded::ADD_725, "errorCode"), Some("725"));
    assert_eq!(arg(recorded::EXTERNAL_IP, "NewExternalIPAddress"), Some(recorded::EXTERNAL));
    assert_eq!(RECORDED_EXTERNAL.to_string(), recorded::EXTERNAL);
}

/// The router maps our port for the lifetime asked; the state publishes the
/// recorded external address with protocol UPnP; shutdown deletes the mapping.
#[tokio::test]
async fn upnp_maps_publishes_and_deletes_on_shutdown() {
    let fake = Fake::start().await;
    let mut m = spawn(fake.settings(upnp_timing()));
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    let mapped = s.mapping.unwrap();
    assert_eq!(mapped.protocol, PortMapProtocol::Upnp);
    assert_eq!(mapped.external, recorded_at(PORT));
    assert_eq!(s.advertised(), Some(SocketAddr::V4(recorded_at(PORT))));
    assert_eq!(s.last_error, None);
    let json = s.json(Instant::now());
    assert_eq!(json.protocol, Some(PortMapProtocol::Upnp));
    assert!(json.expires_in_s.is_some_and(|e| e > 3500 && e <= 3600), "{json:?}");
    {
        let mut r = fake.router();
        assert_eq!(r.searches, 1);
        let e = r.holds(PORT).expect("the router maps our port");
        assert_eq!((e.client, e.internal_port), (Ipv4Addr::LOCALHOST, PORT));
        assert!(e.expires.is_some_and(|x| x > Instant::now() + Duration::from_secs(3500)));
        let add = r.calls_of("AddPortMapping");
        assert_eq!(add.len(), 1);
        assert_eq!((add[0].port, add[0].lease, add[0].outcome), (Some(PORT), Some(3600), Outcome::Done));
    }
    m.shut_down().await;
    let r = fake.router();
    let delete = r.calls_of("DeletePortMapping");
    assert_eq!(delete.len(), 1, "{:?}", r.calls);
    assert_eq!((delete[0].port, delete[0].outcome), (Some(PORT), Outcome::Done));
    assert!(r.table.is_empty());
}

/// Our port is mapped to another host (718): the router's choice of another port
/// is what the state publishes, deleted on shutdown.
#[tokio::test]
async fn a_port_mapped_to_another_host_is_mapped_with_add_any_port_mapping() {
    let fake = Fake::start().await;
    let theirs = Entry { client: OTHER_HOST, internal_port: PORT, expires: None };
    fake.router().table.insert(PORT, theirs);
    let mut m = spawn(fake.settings(upnp_timing()));
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    let port = {
        let r = fake.router();
        let add = r.calls_of("AddPortMapping");
        assert_eq!(add.len(), 1);
        assert_eq!((add[0].port, add[0].outcome), (Some(PORT), Outcome::Refused(718)));
        // The service description lists AddAnyPortMapping (IGD v2): igd-next asks for
        // it rather than trying random ports with AddPortMapping.
        let any = r.calls_of("AddAnyPortMapping");
        assert_eq!(any.len(), 1);
        assert_eq!((any[0].lease, any[0].outcome), (Some(3600), Outcome::Done));
        any[0].reserved.unwrap()
    };
    assert_ne!(port, PORT);
    assert_eq!(external(&s), Some(recorded_at(port)));
    assert_eq!(fake.router().holds(port).map(|e| e.client), Some(Ipv4Addr::LOCALHOST));
    m.shut_down().await;
    let r = fake.router();
    assert_eq!(r.calls_of("DeletePortMapping").last().and_then(|c| c.port), Some(port));
    assert_eq!(r.table.get(&PORT), Some(&theirs), "the other host's mapping is left alone");
    assert_eq!(r.table.len(), 1);
}

/// A router that refuses leases (725) gets a permanent mapping, renewed all the
/// same and deleted on shutdown.
#[tokio::test]
async fn a_router_that_takes_only_permanent_leases_gets_one_renewed_and_deleted() {
    let fake = Fake::start().await;
    fake.router().permanent_only = true;
    let t = Timing { check_every: Duration::from_millis(500), ..upnp_timing() };
    let mut m = spawn(fake.settings(t));
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(external(&s), Some(recorded_at(PORT)));
    fake.until("renewed twice", |r| r.calls_of("AddPortMapping").len() >= 6).await;
    {
        let mut r = fake.router();
        // Each time: refused for an hour (725), granted for ever.
        for pair in r.calls_of("AddPortMapping").chunks(2).take(3) {
            assert_eq!((pair[0].lease, pair[0].outcome), (Some(3600), Outcome::Refused(725)));
            assert_eq!((pair[1].lease, pair[1].outcome), (Some(0), Outcome::Done));
        }
        assert_eq!(r.holds(PORT).map(|e| e.expires), Some(None), "a permanent mapping");
    }
    let s = m.state.borrow().clone();
    assert_eq!(external(&s), Some(recorded_at(PORT)));
    assert_eq!(s.last_error, None);
    m.shut_down().await;
    let r = fake.router();
    assert_eq!(r.calls_of("DeletePortMapping").len(), 1);
    assert!(r.table.is_empty(), "deleted on shutdown: {:?}", r.table);
}

/// A refusal (501 ActionFailed) is reported in the state, with each protocol's
/// failure, and the next round asks again.
#[tokio::test]
async fn a_refusal_is_reported_and_retried() {
    let fake = Fake::start().await;
    fake.router().mode = Mode::Refuse(recorded::ADD_501);
    let mut m = spawn(fake.settings(upnp_timing()));
    let s = until(&mut m.state, "an error", |s| s.last_error.is_some()).await;
    let e = s.last_error.unwrap();
    assert!(e.contains("pcp: gateway unreachable") && e.contains("nat-pmp: gateway unreachable"), "{e}");
    assert!(e.contains("upnp: mapping: ") && e.contains("501") && e.contains("ActionFailed"), "{e}");
    assert_eq!(s.mapping, None);
    fake.until("asked again", |r| r.calls_of("AddPortMapping").len() >= 2).await;
    assert!(fake.router().calls_of("AddPortMapping").iter().all(|c| c.outcome == Outcome::Refused(501)));
    // The router recovers: the next round maps.
    fake.router().mode = Mode::Answer;
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(external(&s), Some(recorded_at(PORT)));
    assert_eq!(s.last_error, None);
    assert_eq!(s.remaps, 0, "a first mapping is no re-map");
    assert!(fake.router().holds(PORT).is_some());
    m.shut_down().await;
}

/// Renewals refused (501) for a while: the mapping, which the router holds until its
/// lease ends, stays published, and a later renewal keeps it (no re-map).
#[tokio::test]
async fn a_renewal_refused_for_a_while_keeps_the_mapping() {
    let fake = Fake::start().await;
    let t = Timing { check_every: Duration::from_millis(500), ..upnp_timing() };
    let mut m = spawn(fake.settings(t));
    until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    fake.router().mode = Mode::Refuse(recorded::ADD_501);
    let refused =
        |r: &mut Router| r.calls_of("AddPortMapping").iter().filter(|c| c.outcome == Outcome::Refused(501)).count();
    fake.until("three refusals", |r| refused(r) >= 3).await;
    let s = m.state.borrow().clone();
    assert_eq!(external(&s), Some(recorded_at(PORT)), "still published");
    assert_eq!(s.last_error, None);
    let asked = {
        let mut r = fake.router();
        r.mode = Mode::Answer;
        r.calls_of("AddPortMapping").len()
    };
    fake.until("renewed", |r| r.calls_of("AddPortMapping")[asked..].iter().any(|c| c.outcome == Outcome::Done)).await;
    let s = m.state.borrow().clone();
    assert_eq!(external(&s), Some(recorded_at(PORT)));
    assert_eq!((s.remaps, s.last_error), (0, None));
    m.shut_down().await;
    assert!(fake.router().table.is_empty());
}

/// A router that restarts and forgets its mappings, with a new external address
/// (as a restart often brings): the next renewal maps the port again and the state
/// (and so the record) says where it is now.
#[tokio::test]
async fn a_router_that_reboots_and_forgets_is_mapped_again_at_the_next_renewal() {
    let fake = Fake::start().await;
    let t = Timing { check_every: Duration::from_millis(500), ..upnp_timing() };
    let mut m = spawn(fake.settings(t));
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(external(&s), Some(recorded_at(PORT)));
    fake.until("a renewal", |r| r.calls_of("AddPortMapping").len() >= 2).await;
    let moved = Ipv4Addr::new(100, 200, 0, 7);
    let asked = {
        let mut r = fake.router();
        r.reboot(moved);
        assert_eq!(r.holds(PORT), None);
        r.calls_of("AddPortMapping").len()
    };
    // A renewal may straddle the reboot (its AddPortMapping before, its
    // GetExternalIPAddress after): the one after maps the port again.
    fake.until("mapped again", |r| {
        r.calls_of("AddPortMapping")[asked..].iter().any(|c| c.port == Some(PORT) && c.outcome == Outcome::Done)
    })
    .await;
    assert_eq!(fake.router().holds(PORT).map(|e| e.client), Some(Ipv4Addr::LOCALHOST));
    let s = until(&mut m.state, "the new address", |s| external(s) == Some(SocketAddrV4::new(moved, PORT))).await;
    assert_eq!(s.last_error, None);
    m.shut_down().await;
    assert!(fake.router().table.is_empty());
}

/// The router restarts, forgets, and another host takes our port before our next
/// renewal: the renewal's 718 ends in a mapping of another port, counted as a re-map.
#[tokio::test]
async fn a_rebooted_router_that_gave_our_port_away_maps_another() {
    let fake = Fake::start().await;
    let t = Timing { check_every: Duration::from_millis(500), ..upnp_timing() };
    let mut m = spawn(fake.settings(t));
    until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    {
        let mut r = fake.router();
        r.reboot(RECORDED_EXTERNAL);
        r.table.insert(PORT, Entry { client: OTHER_HOST, internal_port: PORT, expires: None });
    }
    let s = until(&mut m.state, "re-mapped", |s| s.remaps == 1 && s.mapping.is_some()).await;
    let port = fake.router().calls_of("AddAnyPortMapping").last().and_then(|c| c.reserved).unwrap();
    assert_ne!(port, PORT);
    assert_eq!(external(&s), Some(recorded_at(port)));
    assert_eq!(s.last_error, None);
    m.shut_down().await;
    let r = fake.router();
    assert_eq!(r.table.keys().copied().collect::<Vec<_>>(), vec![PORT], "ours deleted, theirs kept");
}

/// The router stops answering (connections accepted, never answered) and the lease
/// ends: the mapping is withdrawn then, not before, and made again once it answers.
#[tokio::test]
async fn a_lease_that_lapses_while_the_router_is_silent_is_made_again() {
    let fake = Fake::start().await;
    // A 2 s lifetime, renewed after 1 s; requests that wait 300 ms, so that the
    // renewal is tried more than once before the lease ends.
    let t = Timing { lifetime: 2, upnp_request: Duration::from_millis(300), ..upnp_timing() };
    let mut m = spawn(fake.settings(t));
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    let first = s.mapping.unwrap();
    fake.router().mode = Mode::Silent;
    let s = until(&mut m.state, "lapsed", |s| s.mapping.is_none()).await;
    assert!(Instant::now() >= first.expires, "withdrawn before the router dropped it");
    assert!(s.last_error.as_deref().is_some_and(|e| e.starts_with("lease lapsed: ")), "{s:?}");
    let unanswered = fake.router().calls.iter().filter(|c| c.outcome == Outcome::Unanswered).count();
    assert!(unanswered >= 2, "the renewal was tried again ({unanswered} unanswered requests)");
    fake.router().mode = Mode::Answer;
    let s = until(&mut m.state, "mapped again", |s| s.mapping.is_some()).await;
    assert_eq!(external(&s), Some(recorded_at(PORT)));
    assert_eq!(s.remaps, 1);
    assert_eq!(s.last_error, None);
    {
        let mut r = fake.router();
        assert_eq!(r.lapsed, vec![PORT], "the router dropped the mapping when its lease ended");
        assert!(r.holds(PORT).is_some(), "and holds it again");
    }
    m.shut_down().await;
}

/// A router whose IGD accepts connections and never answers: each attempt ends,
/// reported, rather than holding the mapper for ever.
#[tokio::test]
async fn a_silent_router_fails_the_attempt_and_is_asked_again() {
    let fake = Fake::start().await;
    fake.router().mode = Mode::Silent;
    let t = Timing { upnp_request: Duration::from_millis(300), ..upnp_timing() };
    let mut m = spawn(fake.settings(t));
    let s = until(&mut m.state, "an error", |s| s.last_error.is_some()).await;
    let e = s.last_error.unwrap();
    assert!(e.contains("upnp: external address: no answer"), "{e}");
    fake.until("searched again", |r| r.searches >= 2).await;
    fake.router().mode = Mode::Answer;
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    assert_eq!(external(&s), Some(recorded_at(PORT)));
    m.shut_down().await;
}

/// A strict router answers 714 to the deletion of a mapping it lost (restarted):
/// the mapping is gone, as asked, and no failure is reported.
#[tokio::test]
async fn deleting_a_mapping_the_router_lost_is_no_failure() {
    let fake = Fake::start().await;
    let s = fake.settings(upnp_timing());
    let (igd, external, _) = super::upnp::map(&s).await.unwrap();
    assert_eq!(external, recorded_at(PORT));
    {
        let mut r = fake.router();
        r.strict_delete = true;
        r.reboot(RECORDED_EXTERNAL);
    }
    super::upnp::delete(&igd, PORT, s.timing.upnp_request).await.unwrap();
    assert_eq!(fake.router().calls_of("DeletePortMapping")[0].outcome, Outcome::Refused(714));
}

/// A router that takes only permanent leases, and our port held by another host:
/// AddAnyPortMapping is refused (725) for a lease, granted for a permanent one.
#[tokio::test]
async fn a_permanent_lease_router_with_our_port_taken_maps_any_port_for_ever() {
    let fake = Fake::start().await;
    {
        let mut r = fake.router();
        r.permanent_only = true;
        r.table.insert(PORT, Entry { client: OTHER_HOST, internal_port: PORT, expires: None });
    }
    let mut m = spawn(fake.settings(upnp_timing()));
    let s = until(&mut m.state, "mapped", |s| s.mapping.is_some()).await;
    let any = fake.router().calls_of("AddAnyPortMapping");
    assert_eq!(any.len(), 2, "{any:?}");
    assert_eq!((any[0].lease, any[0].outcome), (Some(3600), Outcome::Refused(725)));
    assert_eq!((any[1].lease, any[1].outcome), (Some(0), Outcome::Done));
    let port = any[1].reserved.unwrap();
    assert_eq!(external(&s), Some(recorded_at(port)));
    assert_eq!(fake.router().holds(port).map(|e| e.expires), Some(None));
    m.shut_down().await;
    assert_eq!(fake.router().table.len(), 1, "ours deleted, theirs kept");
}
