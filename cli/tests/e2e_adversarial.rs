//! End-to-end attacks on real nodes in namespaces this test makes and removes: an
//! outsider who tries to join a `--cipher none` network the way the old protocol
//! allowed, and a handshake flood (replayed inits and garbage from many spoofed
//! sources, bounded in time) during an iperf3 stream.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use netns::{Lan, Netns, Node, TempDir, link, ping, require_root, wait_until};
use weft_core::admission::MacKeys;
use weft_core::crypto::Cipher;
use weft_core::handshake::{Hello, Initiator, Params, Psk, Stamp, StaticKey};
use weft_core::session::{Session, SessionParams};
use weft_core::wire::{DataHeader, HandshakeHeader, MessageType};
use weft_datapath::transport::Endpoint;

const NAME: &str = "e2e";
const SECRET: &str = "correct horse";
const NET: [&str; 4] = ["--network-name", NAME, "--network-secret", SECRET];
const A_IP: &str = "10.126.126.1";
const B_IP: &str = "10.126.126.2";

fn node_args<'a>(ip: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", ip, "--threads", "2"]);
    v.extend(extra);
    v
}

fn init_bytes(p: &Params, remote: Option<&[u8; 32]>, index: u32) -> (Initiator, Vec<u8>) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let (init, msg) = Initiator::start(p, remote, Stamp::from_unix(now)).unwrap();
    let mut b = Vec::new();
    HandshakeHeader {
        kind: MessageType::HandshakeInit,
        pattern: init.pattern(),
        sender_index: index,
        receiver_index: 0,
    }
    .emit(&mut b);
    b.extend_from_slice(&msg);
    (init, b)
}

/// Everything an outsider without the secret can try: XX first contact to learn the
/// node's key and hello (before the PSK is mixed in), then IK with that key and a
/// `none` data packet to the new session's index (which once confirmed it). Each
/// message goes out bare (the old wire format) and with MACs keyed by a wrong secret.
/// Returns how many answers the outsider got.
fn outsider_attack(sock: &UdpSocket, target: SocketAddrV4) -> usize {
    let wrong = Params {
        local: StaticKey::generate().unwrap(),
        psk: Psk::derive(NAME, "a guess"),
        network_name: NAME.into(),
        hello: Hello {
            gso: true,
            gso_quic: true,
            ..Hello::new(Cipher::AuthOnly, Ipv4Addr::new(10, 126, 126, 9), 24, "x")
        },
    };
    let macs = MacKeys::new(&wrong.psk);
    let mut answers = 0;
    let mut buf = [0u8; 2048];
    for maced in [false, true] {
        let (xx, mut m1) = init_bytes(&wrong, None, 11);
        if maced {
            macs.seal(&mut m1, None);
        }
        sock.send_to(&m1, target).unwrap();
        let Ok(n) = sock.recv(&mut buf) else { continue };
        answers += 1;
        // The response carries the node's static key (and its hello) under ee/es only.
        let body = if maced { &buf[..n - 32] } else { &buf[..n] };
        let Ok((hdr, noise)) = HandshakeHeader::parse(body) else { continue };
        let Ok((done, _)) = xx.read_response(&wrong, noise) else { continue };
        eprintln!("outsider learned {:?} from an XX response", done.hello);
        let _ = hdr;
        let (_ik, mut m1) = init_bytes(&wrong, Some(&done.remote_static), 12);
        if maced {
            macs.seal(&mut m1, None);
        }
        sock.send_to(&m1, target).unwrap();
        let Ok(n) = sock.recv(&mut buf) else { continue };
        answers += 1;
        let Ok((resp, _)) = HandshakeHeader::parse(&buf[..n]) else { continue };
        // A data packet "from" 10.126.126.9 to the session the responder holds.
        for counter in 0..5u64 {
            let mut d = [0u8; 16];
            DataHeader { flags: 0, lane: 0, receiver_index: resp.sender_index, counter }.emit(&mut d);
            let mut pkt = d.to_vec();
            let mut ip = vec![0x45u8, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0, 10, 126, 126, 9, 10, 126, 126, 1];
            ip.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0]);
            pkt.extend_from_slice(&ip);
            pkt.extend_from_slice(&[0; 16]);
            sock.send_to(&pkt, target).unwrap();
        }
    }
    answers
}

#[test]
fn an_outsider_cannot_join_a_none_network() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", &["--cipher", "none"]));
    let target: SocketAddrV4 = format!("{}:11010", lan.addrs[0]).parse().unwrap();
    let answers = lan.hosts[1].within(|| {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
        outsider_attack(&sock, target)
    });
    assert_eq!(answers, 0, "the node answered an outsider");
    std::thread::sleep(Duration::from_secs(1));
    let st = a.status();
    assert!(st["peers"].as_array().unwrap().is_empty(), "the outsider became a peer: {st}");
    assert_eq!(st["refused_handshakes"], serde_json::json!([]), "an outsider left a status row");
    assert!(st["drops"]["handshake_mac"].as_u64().unwrap() >= 2, "{}", st["drops"]);
    assert!(!ping(&lan.hosts[0], "10.126.126.9"));
}

/// A member's handshake parameters (it holds the secret) with overlay address `ipv4`.
fn member_params(ipv4: Ipv4Addr) -> Params {
    Params {
        local: StaticKey::generate().unwrap(),
        psk: Psk::derive(NAME, SECRET),
        network_name: NAME.into(),
        hello: Hello { gso: true, gso_quic: true, ..Hello::new(Cipher::Aes128Gcm, ipv4, 24, "m") },
    }
}

/// A member's first-contact init with a valid mac1, as an observer would capture it.
fn captured_init(member: &Params) -> Vec<u8> {
    let (_, mut init) = init_bytes(member, None, 5);
    MacKeys::new(&member.psk).seal(&mut init, None);
    init
}

/// A raw IPv4 socket for datagrams from spoofed sources ([`spoofed_udp`]) to `target`.
fn raw_sender(target: SocketAddrV4) -> (socket2::Socket, socket2::SockAddr) {
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::from(255))).unwrap();
    (sock, socket2::SockAddr::from(std::net::SocketAddr::V4(target)))
}

/// A process killed (by its own PID) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs an iperf3 client in `ns` to `server` for `secs`; returns received Mbit/s.
fn iperf(ns: &Netns, server: &str, secs: u32) -> f64 {
    let out = ns.cmd("iperf3").args(["-c", server, "-t", &secs.to_string(), "-J"]).output().expect("iperf3");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J output");
    v["end"]["sum_received"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6
}

/// IPv4 + UDP header for a raw socket (IP_HDRINCL): the kernel fills the IP checksum;
/// UDP checksum 0 means none.
fn spoofed_udp(src: Ipv4Addr, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let total = (28 + payload.len()) as u16;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.ip().octets());
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&dst.port().to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

#[test]
fn a_handshake_flood_drops_no_session() {
    require_root();
    let (lan, dir) = (Lan::new(3), TempDir::new());
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", &[]));
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let mut b_args = node_args("10.126.126.2/24", &[]);
    b_args.extend(["-p", &peer]);
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &b_args);
    wait_until(Duration::from_secs(10), "session A<->B", || a.peer_established(B_IP) && b.peer_established(A_IP));
    let _server =
        Proc(lan.hosts[0].cmd("iperf3").args(["-s", "-B", A_IP]).stdout(Stdio::null()).spawn().expect("iperf3"));
    std::thread::sleep(Duration::from_millis(300));
    let quiet = iperf(&lan.hosts[1], A_IP, 4);

    // The flood: a member's init (valid mac1, as if captured and replayed) and garbage,
    // from 250 spoofed addresses of the LAN, for 8 s at most.
    let replay = captured_init(&member_params(Ipv4Addr::new(10, 126, 126, 7)));
    let mut garbage = replay.clone();
    garbage[40] ^= 0xff;
    let target: SocketAddrV4 = format!("{}:11010", lan.addrs[0]).parse().unwrap();
    let attacker = &lan.hosts[2];
    let flooding = std::thread::scope(|s| {
        let flood = s.spawn(|| {
            attacker.within(|| {
                let (sock, to) = raw_sender(target);
                let start = Instant::now();
                let mut sent = 0u64;
                while start.elapsed() < Duration::from_secs(8) {
                    for i in 0..250u32 {
                        let src = Ipv4Addr::new(192, 0, 2, 4 + (i % 250) as u8);
                        let payload = if i % 2 == 0 { &replay } else { &garbage };
                        if sock.send_to(&spoofed_udp(src, target, payload), &to).is_ok() {
                            sent += 1;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                sent
            })
        });
        std::thread::sleep(Duration::from_secs(1));
        let mut up = true;
        let flooded = s.spawn(|| iperf(&lan.hosts[1], A_IP, 4));
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            up &= a.peer_established(B_IP) && b.peer_established(A_IP);
            std::thread::sleep(Duration::from_millis(250));
        }
        (flooded.join().unwrap(), flood.join().unwrap(), up)
    });
    let (flooded, sent, up) = flooding;
    let st = a.status();
    eprintln!(
        "handshake flood: {sent} datagrams in 8 s; iperf3 {quiet:.0} Mbit/s quiet, {flooded:.0} Mbit/s flooded \
         (ratio {:.2}); admission {}; drops {}",
        flooded / quiet,
        st["admission"],
        st["drops"]
    );
    assert!(up, "a session dropped during the flood");
    assert!(flooded > 0.0, "no traffic got through during the flood");
    assert!(st["drops"]["handshake_mac"].as_u64().unwrap_or(0) > 0, "garbage not counted: {}", st["drops"]);
    assert!(st["admission"]["cookies_sent"].as_u64().unwrap_or(0) > 0, "no cookies under load: {}", st["admission"]);
    assert!(st["peers"].as_array().unwrap().len() == 1, "the replayed init became a peer: {st}");
}

/// A member that holds the secret and runs no weft: it makes an XX session with a
/// node by hand and sends it whatever IP packets it likes (a stolen laptop with a
/// modified build).
struct Rogue {
    sock: UdpSocket,
    target: SocketAddrV4,
    session: Session,
}

impl Rogue {
    fn join(sock: UdpSocket, target: SocketAddrV4, overlay: Ipv4Addr) -> Self {
        let p = member_params(overlay);
        let macs = MacKeys::new(&p.psk);
        let (xx, mut m1) = init_bytes(&p, None, 77);
        macs.seal(&mut m1, None);
        sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        sock.send_to(&m1, target).unwrap();
        let mut buf = [0u8; 2048];
        let n = sock.recv(&mut buf).expect("an XX response to a member's init");
        let (hdr, noise) = HandshakeHeader::parse(&buf[..n - 32]).unwrap();
        let (done, finish) = xx.read_response(&p, noise).unwrap();
        let mut fin = Vec::new();
        HandshakeHeader {
            kind: MessageType::HandshakeFinish,
            pattern: hdr.pattern,
            sender_index: 77,
            receiver_index: hdr.sender_index,
        }
        .emit(&mut fin);
        fin.extend_from_slice(&finish.expect("XX has a finish"));
        macs.seal(&mut fin, None);
        sock.send_to(&fin, target).unwrap();
        let session = Session::new(SessionParams {
            local_index: 77,
            remote_index: hdr.sender_index,
            cipher: Cipher::Aes128Gcm,
            keys: done.keys,
            endpoint: Endpoint::udp(std::net::SocketAddr::V4(target)),
            peer_addr: done.hello.ipv4,
            peer_addr6: None,
            confirmed: true,
            stats: Default::default(),
        });
        let r = Self { sock, target, session };
        r.send(&[]); // a keepalive proves the PSK: the node promotes the session
        r
    }

    /// Seals control message `msg` (what only a member's own code sends) and sends it.
    fn send_control(&self, msg: &[u8]) {
        let mut b = vec![0u8; 16 + msg.len() + 16];
        b[16..16 + msg.len()].copy_from_slice(msg);
        let n = self.session.seal_with_flags(&mut b, msg.len(), weft_core::wire::FLAG_CONTROL).unwrap();
        let _ = self.sock.send_to(&b[..n], self.target);
    }

    /// Seals `ip` (an IP packet, or nothing for a keepalive) and sends it.
    fn send(&self, ip: &[u8]) {
        let mut b = vec![0u8; 16 + ip.len() + 16];
        b[16..16 + ip.len()].copy_from_slice(ip);
        let n = self.session.seal(&mut b, ip.len()).unwrap();
        self.sock.send_to(&b[..n], self.target).unwrap();
    }
}

/// An IPv4 UDP datagram `src` -> `dst` with a valid header checksum (the kernel drops
/// others) and no UDP checksum.
fn udp4(src: Ipv4Addr, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut p = spoofed_udp(src, dst, payload);
    let sum = p[..20].chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum::<u32>();
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    p[10..12].copy_from_slice(&(!(folded as u16)).to_be_bytes());
    p
}

#[test]
fn a_member_reaches_only_what_a_subnet_router_serves() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    // R proxies 192.168.50.0/24 (h1) and is also on 192.168.60.0/24 (h2), which it
    // does not offer; it forwards for the proxied one, so forwarding is on.
    let r_ns = &lan.hosts[0];
    let (h1, h2) = (Netns::new(), Netns::new());
    link(r_ns, "lan1", "192.168.50.1/24", &h1, "eth0", "192.168.50.2/24");
    link(r_ns, "lan2", "192.168.60.1/24", &h2, "eth0", "192.168.60.2/24");
    let r = Node::start(r_ns, &dir.0, "r", &node_args("10.126.126.1/24", &["--proxy-network", "192.168.50.0/24"]));
    let listen = |ns: &Netns, at: &str| {
        ns.within(|| {
            let s = UdpSocket::bind(at).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
            s
        })
    };
    let (l1, l2) = (listen(&h1, "192.168.50.2:7000"), listen(&h2, "192.168.60.2:7000"));
    let l_own = listen(r_ns, "10.126.126.1:7000");
    let target: SocketAddrV4 = format!("{}:11010", lan.addrs[0]).parse().unwrap();
    let rogue = lan.hosts[1]
        .within(|| Rogue::join(UdpSocket::bind("0.0.0.0:0").unwrap(), target, Ipv4Addr::new(10, 126, 126, 7)));
    wait_until(Duration::from_secs(5), "R holds the rogue's session", || r.peer_established("10.126.126.7"));
    let src = Ipv4Addr::new(10, 126, 126, 7);
    let got = |l: &UdpSocket| {
        let mut buf = [0u8; 64];
        l.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
    };
    for (to, l, expected) in
        [("192.168.50.2:7000", &l1, true), ("10.126.126.1:7000", &l_own, true), ("192.168.60.2:7000", &l2, false)]
    {
        for _ in 0..3 {
            rogue.send(&udp4(src, to.parse().unwrap(), b"rogue"));
        }
        assert_eq!(got(l).is_some(), expected, "to {to}");
    }
    let drops = r.status()["drops"]["forbidden_destination"].as_u64().unwrap_or(0);
    assert!(drops >= 3, "{}", r.status()["drops"]);
}

#[test]
fn a_member_claiming_an_address_outside_the_overlay_takes_nothing() {
    require_root();
    let (lan, dir) = (Lan::new(3), TempDir::new());
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", &[]));
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let _b = Node::start(
        &lan.hosts[1],
        &dir.0,
        "b",
        &node_args("10.126.126.2/24", &["-p", &peer, "--proxy-network", "172.16.50.0/24"]),
    );
    let a_routes_subnet = || {
        let out = lan.hosts[0].cmd("ip").args(["route", "show", "172.16.50.0/24"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains("weft0")
    };
    wait_until(Duration::from_secs(15), "A routes B's subnet", a_routes_subnet);
    // One rogue claims a "public server's" address, the other one inside B's subnet.
    let target: SocketAddrV4 = format!("{}:11010", lan.addrs[0]).parse().unwrap();
    let claims = [Ipv4Addr::new(198, 51, 100, 99), Ipv4Addr::new(172, 16, 50, 7)];
    let _rogues: Vec<Rogue> = claims
        .iter()
        .map(|c| lan.hosts[2].within(|| Rogue::join(UdpSocket::bind("0.0.0.0:0").unwrap(), target, *c)))
        .collect();
    wait_until(Duration::from_secs(10), "A says why both are refused", || {
        let st = a.status();
        let why = st["refused_handshakes"].to_string();
        claims.iter().all(|c| {
            why.contains(&format!("{c}: refused, {c} lies outside this node's overlay network 10.126.126.0/24"))
        })
    });
    std::thread::sleep(Duration::from_secs(2));
    let st = a.status();
    assert!(st["handshake_failures"]["address_outside_overlay"].as_u64().unwrap_or(0) >= 2, "{st}");
    assert!(st["peers"].as_array().unwrap().iter().all(|p| p["overlay"] == B_IP), "{}", st["peers"]);
    assert!(!a.routes_to("198.51.100.99") && !a.routes_to("172.16.50.7"));
    // B's subnet is still routed: an address outside the overlay is nobody's.
    assert!(!st["refused"].to_string().contains("172.16.50.0/24"), "A refused B's subnet: {}", st["refused"]);
    assert!(a_routes_subnet(), "A dropped B's subnet");
}

#[test]
fn a_member_joins_while_a_captured_init_is_replayed_below_every_rate() {
    require_root();
    let (lan, dir) = (Lan::new(3), TempDir::new());
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", &[]));
    // A member's captured first-contact init (valid mac1), replayed from 16 spoofed
    // addresses at 200 a second in all: each source below its rate limit, the whole
    // below the load threshold, for 20 s. Without the half-full rule the responder's
    // table of pending XX responses (1024, 10 s each) stays full and new members are
    // dropped silently.
    let replay = captured_init(&member_params(Ipv4Addr::new(10, 126, 126, 7)));
    let target: SocketAddrV4 = format!("{}:11010", lan.addrs[0]).parse().unwrap();
    let attacker = &lan.hosts[2];
    // Whatever A sends back to the spoofed sources, counted on A's way out.
    for rule in [
        "add table ip wtcount",
        "add chain ip wtcount out { type filter hook output priority 0 ; }",
        "add rule ip wtcount out ip daddr 192.0.2.96/28 counter",
    ] {
        assert!(lan.hosts[0].cmd("nft").arg(rule).status().unwrap().success(), "nft {rule}");
    }
    let (joined, replayed) = std::thread::scope(|s| {
        let flood = s.spawn(|| {
            attacker.within(|| {
                let (sock, to) = raw_sender(target);
                let start = Instant::now();
                let mut i = 0u32;
                while start.elapsed() < Duration::from_secs(20) {
                    let src = Ipv4Addr::new(192, 0, 2, 100 + (i % 16) as u8);
                    let _ = sock.send_to(&spoofed_udp(src, target, &replay), &to);
                    i += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                i
            })
        });
        // Long enough for the table to fill at that rate.
        std::thread::sleep(Duration::from_secs(6));
        let peer = format!("udp://{}:11010", lan.addrs[0]);
        let b = Node::start(&lan.hosts[1], &dir.0, "b", &node_args("10.126.126.2/24", &["-p", &peer]));
        let start = Instant::now();
        let mut joined = None;
        while start.elapsed() < Duration::from_secs(13) {
            if a.peer_established(B_IP) && b.peer_established(A_IP) {
                joined = Some(start.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        (joined, flood.join().unwrap())
    });
    let st = a.status();
    // IP and UDP headers on both sides.
    let replayed_bytes = u64::from(replayed) * (replay.len() as u64 + 28);
    let out = lan.hosts[0].cmd("nft").args(["list", "table", "ip", "wtcount"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let answered_bytes: u64 = listing
        .split_whitespace()
        .skip_while(|w| *w != "bytes")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {listing}"));
    eprintln!(
        "replayed init at 200/s from 16 sources: B joined after {joined:?}; {replayed_bytes} bytes replayed, \
         {answered_bytes} answered; admission {}",
        st["admission"]
    );
    assert!(answered_bytes <= replayed_bytes, "answered {answered_bytes} bytes to {replayed_bytes} replayed");
    assert!(joined.is_some(), "B did not join during the replay: {}", st["admission"]);
    assert!(st["admission"]["cookies_sent"].as_u64().unwrap_or(0) > 0, "{}", st["admission"]);
    // No init was dropped for want of room (a member's own would have been among them).
    assert_eq!(st["admission"]["evicted"], 0, "{}", st["admission"]);
    assert_eq!(st["peers"].as_array().unwrap().len(), 1, "the replayed init became a peer: {st}");
}

/// A member floods a node with control messages (pings, each one answered) for six
/// seconds: the node drops what is over the member's budget (counted) instead of
/// answering them all (about 630,000 answers before the budget), keeps serving its
/// other members' data, and a new member's handshake completes meanwhile.
#[test]
fn a_control_flood_from_a_member_starves_neither_handshakes_nor_other_members() {
    require_root();
    let (lan, dir) = (Lan::new(4), TempDir::new());
    let r = Node::start(&lan.hosts[0], &dir.0, "r", &node_args("10.126.126.1/24", &[]));
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let _b = Node::start(&lan.hosts[1], &dir.0, "b", &node_args("10.126.126.2/24", &["-p", &peer]));
    wait_until(Duration::from_secs(10), "B joins", || r.peer_established("10.126.126.2"));
    let target: SocketAddrV4 = format!("{}:11010", lan.addrs[0]).parse().unwrap();
    let rogue = lan.hosts[2]
        .within(|| Rogue::join(UdpSocket::bind("0.0.0.0:0").unwrap(), target, Ipv4Addr::new(10, 126, 126, 7)));
    wait_until(Duration::from_secs(5), "R holds the rogue's session", || r.peer_established("10.126.126.7"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut sent, until) = (0u64, Instant::now() + Duration::from_secs(6));
            while Instant::now() < until && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut ping = [2u8, 0, 0, 0, 0, 0, 0, 0, 0];
                ping[1..].copy_from_slice(&sent.to_le_bytes());
                rogue.send_control(&ping);
                sent += 1;
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // A new member joins while the flood runs, and B's data keeps flowing.
    let c = Node::start(&lan.hosts[3], &dir.0, "c", &node_args("10.126.126.3/24", &["-p", &peer]));
    let joined = wait_until(Duration::from_secs(10), "C joins during the flood", || r.peer_established("10.126.126.3"));
    assert!(ping(&lan.hosts[1], "10.126.126.1"), "B's pings to R are lost during the flood");
    let sent = flood.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let st = r.status();
    let limited = st["control_limited"].as_u64().unwrap_or(0);
    eprintln!("flood: {sent} control messages in 6 s; R dropped {limited} over budget; C joined after {joined:?}");
    assert!(limited > 0, "no control message was dropped over the member's budget: {st}");
    // Each ping taken is answered: what R sent is bounded by the budget (a burst of
    // 8,000, then 2,000 a second), not by what the member sent.
    let answered = st["control_traffic"]["sent_packets"].as_u64().unwrap_or(0);
    assert!(answered < 40_000, "R answered {answered} of {sent} control messages from one member");
    assert!(c.peer_established("10.126.126.1"));
}
