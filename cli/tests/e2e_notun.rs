//! End-to-end: a member without a TUN device, root or any capability (`--no-tun`, run
//! as `nobody` with every capability dropped). Members ping it and reach the port it
//! exposes; local programs on it reach the mesh through SOCKS5 (CONNECT by address and
//! by member name, UDP ASSOCIATE) and `--forward`; 64 MiB SHA-256 transfers each way;
//! refusals get the right SOCKS reply; a relayed no-TUN member over TCP with SOCKS5
//! authentication; bad input exits 2, a port in use 1.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use netns::{Netns, Node, TempDir, link, ping, require_root, wait_until, weft_bin};
use ring::digest;

const NET: [&str; 4] = ["--network-name", "e2e-notun", "--network-secret", "no tun, no root, no problem"];
const DOMAIN: &str = "e2e-notun.internal";
const MIB64: usize = 64 << 20;

fn args<'a>(overlay: &'a str, host: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", overlay, "--hostname", host]);
    v.extend(extra);
    v
}

/// A destination as SOCKS5 encodes it.
enum Dst<'a> {
    Ip(SocketAddr),
    Name(&'a str, u16),
}

fn encode(d: &Dst<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    match d {
        Dst::Ip(SocketAddr::V4(a)) => {
            v.push(1);
            v.extend(a.ip().octets());
            v.extend(a.port().to_be_bytes());
        }
        Dst::Ip(SocketAddr::V6(a)) => {
            v.push(4);
            v.extend(a.ip().octets());
            v.extend(a.port().to_be_bytes());
        }
        Dst::Name(n, port) => {
            v.push(3);
            v.push(n.len() as u8);
            v.extend(n.as_bytes());
            v.extend(port.to_be_bytes());
        }
    }
    v
}

/// Method negotiation and, with `auth`, RFC 1929. Err: what the server said instead.
fn socks_hello(s: &mut TcpStream, auth: Option<(&str, &str)>) -> Result<(), String> {
    s.write_all(if auth.is_some() { &[5, 1, 2] } else { &[5, 1, 0] }).unwrap();
    let mut r = [0u8; 2];
    s.read_exact(&mut r).unwrap();
    if r[1] == 0xff {
        return Err("no acceptable method".into());
    }
    if let Some((u, p)) = auth {
        let mut m = vec![1, u.len() as u8];
        m.extend(u.as_bytes());
        m.push(p.len() as u8);
        m.extend(p.as_bytes());
        s.write_all(&m).unwrap();
        s.read_exact(&mut r).unwrap();
        if r[1] != 0 {
            return Err(format!("authentication refused ({:#x})", r[1]));
        }
    }
    Ok(())
}

/// One request; Ok(bound address) or Err(reply code).
fn socks_request(s: &mut TcpStream, cmd: u8, d: &Dst<'_>) -> Result<SocketAddr, u8> {
    let mut m = vec![5, cmd, 0];
    m.extend(encode(d));
    s.write_all(&m).unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).expect("a SOCKS reply, not a hang or a close");
    let len = match head[3] {
        1 => 4,
        4 => 16,
        t => panic!("reply address type {t}"),
    };
    let mut addr = vec![0u8; len + 2];
    s.read_exact(&mut addr).unwrap();
    if head[1] != 0 {
        return Err(head[1]);
    }
    let port = u16::from_be_bytes([addr[len], addr[len + 1]]);
    let ip: std::net::IpAddr = if len == 4 {
        <[u8; 4]>::try_from(&addr[..4]).unwrap().into()
    } else {
        <[u8; 16]>::try_from(&addr[..16]).unwrap().into()
    };
    Ok(SocketAddr::new(ip, port))
}

fn socks_connect(proxy: &str, auth: Option<(&str, &str)>, d: &Dst<'_>) -> Result<TcpStream, u8> {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    socks_hello(&mut s, auth).unwrap();
    socks_request(&mut s, 1, d).map(|_| s)
}

/// Writes `len` pseudo-random bytes and shuts the write side; returns their SHA-256.
fn send_all(s: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut ctx = digest::Context::new(&digest::SHA256);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut buf = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        for b in buf.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
        let n = left.min(buf.len());
        s.write_all(&buf[..n]).unwrap();
        ctx.update(&buf[..n]);
        left -= n;
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    ctx.finish().as_ref().to_vec()
}

/// Reads to the end; returns the byte count and SHA-256.
fn receive_all(s: &mut TcpStream) -> (usize, Vec<u8>) {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut ctx = digest::Context::new(&digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf).expect("receive");
        if n == 0 {
            break;
        }
        total += n;
        ctx.update(&buf[..n]);
    }
    (total, ctx.finish().as_ref().to_vec())
}

/// A TCP server in `ns` at `addr` that hashes one connection (runs on a thread).
fn sink(ns: &Netns, addr: &str) -> std::thread::JoinHandle<(usize, Vec<u8>)> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (ns, addr) = (ns.name.clone(), addr.to_owned());
    let h = std::thread::spawn(move || {
        Netns::enter_named(&ns, || {
            let l = TcpListener::bind(&addr).expect("bind sink");
            ready_tx.send(()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            receive_all(&mut c)
        })
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).expect("sink ready");
    h
}

/// A UDP echo server in `ns` at `addr` until `stop` is set, at most a minute (runs
/// on a thread).
fn echo_udp(ns: &Netns, addr: &str, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (ns, addr, stop) = (ns.name.clone(), addr.to_owned(), stop.clone());
    let h = std::thread::spawn(move || {
        Netns::enter_named(&ns, || {
            let s = UdpSocket::bind(&addr).expect("bind echo");
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            ready_tx.send(()).unwrap();
            let end = std::time::Instant::now() + Duration::from_secs(60);
            let mut buf = [0u8; 2048];
            while std::time::Instant::now() < end && !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = s.recv_from(&mut buf) {
                    let mut reply = b"echo:".to_vec();
                    reply.extend(&buf[..n]);
                    let _ = s.send_to(&reply, from);
                }
            }
        })
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).expect("echo ready");
    h
}

/// Sends `msg` from a fresh socket in the current namespace to `to` and waits for
/// the echo (a few tries: the first datagram may start a session).
fn udp_roundtrip(to: &str, msg: &[u8]) -> Vec<u8> {
    let any = if to.starts_with('[') { "[::]:0" } else { "0.0.0.0:0" };
    let s = UdpSocket::bind(any).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 2048];
    for _ in 0..8 {
        s.send_to(msg, to).unwrap();
        if let Ok((n, _)) = s.recv_from(&mut buf) {
            return buf[..n].to_vec();
        }
    }
    panic!("no UDP echo from {to}");
}

fn ns_has_tun(ns: &Netns) -> bool {
    String::from_utf8_lossy(&ns.exec_ok(&["ip", "-o", "link"]).stdout).contains("tun")
        || String::from_utf8_lossy(&ns.exec_ok(&["ip", "-o", "link"]).stdout).contains("weft")
}

#[test]
fn a_member_without_root_or_tun_pings_serves_and_reaches_the_mesh() {
    require_root();
    let dir = TempDir::new();
    let (a, b) = (Netns::new(), Netns::new());
    link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24");
    let na = Node::start(
        &a,
        &dir.0,
        "alpha",
        &args("10.126.150.1/24", "alpha", &["--ipv6", "fd7a:150::1/64", "--threads", "1"]),
    );
    let fwd_tcp = format!("tcp://127.0.0.1:6000=alpha.{DOMAIN}:5001");
    let nb = Node::start_unprivileged(
        &b,
        &dir.0,
        "beta",
        &args(
            "10.126.150.2/24",
            "beta",
            &[
                "--ipv6",
                "fd7a:150::2/64",
                "--no-tun",
                "-l",
                "udp://0.0.0.0:11010",
                "-p",
                "udp://192.0.2.1:11010",
                "--socks5",
                "127.0.0.1:1080",
                "--forward",
                &fwd_tcp,
                "--forward",
                "udp://127.0.0.1:6053=10.126.150.1:5353",
                "--expose",
                "tcp://5002=127.0.0.1:7000",
                "--expose",
                "udp://5354=127.0.0.1:7001",
            ],
        ),
    );
    wait_until(Duration::from_secs(15), "alpha and beta in session", || {
        na.peer_established("10.126.150.2") && nb.peer_established("10.126.150.1")
    });
    // Unprivileged for real: uid nobody, no capabilities, no TUN in its namespace, and
    // the user-writable defaults for the control socket and state directory.
    let proc_status = std::fs::read_to_string(format!("/proc/{}/status", nb.pid())).unwrap();
    assert!(proc_status.lines().any(|l| l.starts_with("Uid:") && l.contains("65534")), "{proc_status}");
    assert!(proc_status.lines().any(|l| l == "CapEff:\t0000000000000000"), "{proc_status}");
    assert!(!ns_has_tun(&b), "a TUN device in the no-TUN node's namespace");
    assert!(nb.state.join("node.key").exists(), "the node key in ~/.local/state/weft");
    let st = nb.status();
    assert_eq!(st["userspace"]["socks5"], "127.0.0.1:1080", "{st}");
    assert_eq!(st["userspace"]["forwards"][0], fwd_tcp.as_str());
    assert_eq!(st["userspace"]["exposes"][0], "tcp://5002=127.0.0.1:7000");
    let text = Command::new(weft_bin()).args(["status", "--control"]).arg(&nb.control).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("userspace stack (no TUN)") && text.contains("socks5    127.0.0.1:1080"), "{text}");

    // Members ping it, on both families.
    assert!(ping(&a, "10.126.150.2"), "ping the no-TUN member");
    assert!(a.exec_status(&["ping", "-6", "-c", "2", "-i", "0.3", "-W", "2", "fd7a:150::2"]), "ping6");

    // SOCKS5 CONNECT by member name: 64 MiB from beta to alpha's server (on a port of
    // its own: rebinding an address:port right after a transfer can fail with EADDRINUSE).
    let server = sink(&a, "10.126.150.1:5003");
    let sent = b.within(|| {
        let mut s = socks_connect("127.0.0.1:1080", None, &Dst::Name(&format!("alpha.{DOMAIN}"), 5003)).unwrap();
        send_all(&mut s, MIB64)
    });
    let (n, got) = server.join().unwrap();
    assert_eq!((n, &got), (MIB64, &sent), "64 MiB through SOCKS5 (CONNECT by name)");

    // SOCKS5 CONNECT to an IPv6 overlay address.
    let server = sink(&a, "[fd7a:150::1]:5001");
    let sent = b.within(|| {
        let mut s = socks_connect("127.0.0.1:1080", None, &Dst::Ip("[fd7a:150::1]:5001".parse().unwrap())).unwrap();
        send_all(&mut s, 1 << 20)
    });
    assert_eq!(server.join().unwrap(), (1 << 20, sent), "SOCKS5 to an IPv6 overlay address");

    // --forward: beta's local port 6000 to alpha:5001.
    let server = sink(&a, "10.126.150.1:5001");
    let sent = b.within(|| {
        let mut s = TcpStream::connect("127.0.0.1:6000").unwrap();
        send_all(&mut s, MIB64)
    });
    assert_eq!(server.join().unwrap(), (MIB64, sent), "64 MiB through --forward");

    // --expose: alpha connects to beta's overlay port 5002, which reaches beta's local
    // service on 127.0.0.1:7000.
    let service = sink(&b, "127.0.0.1:7000");
    let sent = a.within(|| {
        let mut s = TcpStream::connect_timeout(&"10.126.150.2:5002".parse().unwrap(), Duration::from_secs(10)).unwrap();
        send_all(&mut s, MIB64)
    });
    assert_eq!(service.join().unwrap(), (MIB64, sent), "64 MiB through --expose");

    // UDP: through UDP ASSOCIATE, --forward and --expose.
    let stop = Arc::new(AtomicBool::new(false));
    let echo_a = echo_udp(&a, "10.126.150.1:5353", &stop);
    let echo_b = echo_udp(&b, "127.0.0.1:7001", &stop);
    b.within(|| {
        let mut ctl = TcpStream::connect("127.0.0.1:1080").unwrap();
        ctl.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        socks_hello(&mut ctl, None).unwrap();
        let relay = socks_request(&mut ctl, 3, &Dst::Ip("0.0.0.0:0".parse().unwrap())).expect("UDP ASSOCIATE");
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let dst: SocketAddr = "10.126.150.1:5353".parse().unwrap();
        let mut datagram = vec![0, 0, 0];
        datagram.extend(encode(&Dst::Ip(dst)));
        datagram.extend(b"via socks");
        let mut buf = [0u8; 2048];
        let reply = (0..8)
            .find_map(|_| {
                u.send_to(&datagram, relay).unwrap();
                u.recv_from(&mut buf).ok().map(|(n, _)| buf[..n].to_vec())
            })
            .expect("an answer through UDP ASSOCIATE");
        // RSV RSV FRAG, then the sender's address, then the payload.
        let mut header = vec![0, 0, 0];
        header.extend(encode(&Dst::Ip(dst)));
        assert_eq!(&reply[..header.len()], &header[..], "SOCKS5 UDP header of the reply");
        assert_eq!(&reply[header.len()..], b"echo:via socks");
        drop(ctl);
        assert_eq!(udp_roundtrip("127.0.0.1:6053", b"via forward"), b"echo:via forward");
    });
    a.within(|| assert_eq!(udp_roundtrip("10.126.150.2:5354", b"via expose"), b"echo:via expose"));
    stop.store(true, Ordering::Relaxed);
    echo_a.join().unwrap();
    echo_b.join().unwrap();

    // Refusals, each with its reply code and at once (no hang): outside the mesh (0x02),
    // an overlay address nobody holds and a name nobody has (0x04), a closed port on a
    // member (0x05), BIND (0x07).
    b.within(|| {
        let refused = |d: Dst<'_>| socks_connect("127.0.0.1:1080", None, &d).err();
        assert_eq!(refused(Dst::Ip("198.51.100.9:80".parse().unwrap())), Some(2));
        assert_eq!(refused(Dst::Name("example.org", 80)), Some(2));
        assert_eq!(refused(Dst::Ip("10.126.150.77:80".parse().unwrap())), Some(4));
        assert_eq!(refused(Dst::Name(&format!("nosuch.{DOMAIN}"), 80)), Some(4));
        assert_eq!(refused(Dst::Ip("10.126.150.1:81".parse().unwrap())), Some(5));
        let mut s = TcpStream::connect("127.0.0.1:1080").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        socks_hello(&mut s, None).unwrap();
        assert_eq!(socks_request(&mut s, 2, &Dst::Ip("10.126.150.1:80".parse().unwrap())), Err(7));
    });
    let u = &nb.status()["userspace"];
    assert!(u["socks5_refused"].as_u64().unwrap() >= 6, "{u}");
    assert!(u["socks5_connects"].as_u64().unwrap() >= 2, "{u}");
}

#[test]
fn a_relayed_member_without_tun_over_tcp_with_socks5_authentication() {
    require_root();
    let dir = TempDir::new();
    // A - B - C in a chain; C (no TUN) reaches B over TCP only.
    let (a, b, c) = (Netns::new(), Netns::new(), Netns::new());
    link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24");
    link(&b, "eth1", "198.51.100.2/24", &c, "eth0", "198.51.100.3/24");
    let cipher = ["--cipher", "chacha20-poly1305"];
    let nb =
        Node::start(&b, &dir.0, "b", &args("10.126.151.2/24", "bravo", &[&cipher[..], &["--threads", "1"]].concat()));
    let na = Node::start(
        &a,
        &dir.0,
        "a",
        &args("10.126.151.1/24", "alpha", &[&cipher[..], &["--threads", "1", "-p", "udp://192.0.2.2:11010"]].concat()),
    );
    let nc = Node::start_unprivileged(
        &c,
        &dir.0,
        "c",
        &args(
            "10.126.151.3/24",
            "charlie",
            &[
                &cipher[..],
                &[
                    "--no-tun",
                    "-l",
                    "tcp://0.0.0.0:11010",
                    "-p",
                    "tcp://198.51.100.2:11010",
                    "--socks5",
                    "127.0.0.1:1080",
                ],
            ]
            .concat(),
        )
        .into_iter()
        .chain(["--socks5-auth", "weft:s3cret"])
        .collect::<Vec<_>>(),
    );
    wait_until(Duration::from_secs(20), "A and C learn each other through B", || {
        na.routes_to("10.126.151.3") && nc.routes_to("10.126.151.1")
    });
    assert!(ping(&a, "10.126.151.3"), "A pings the relayed no-TUN member");
    assert_eq!(na.peer("10.126.151.3").unwrap()["path"], "relay");
    let server = sink(&a, "10.126.151.1:5001");
    let sent = c.within(|| {
        let mut s = socks_connect("127.0.0.1:1080", Some(("weft", "s3cret")), &Dst::Name("alpha", 5001)).unwrap();
        send_all(&mut s, 16 << 20)
    });
    assert_eq!(server.join().unwrap(), (16 << 20, sent), "16 MiB relayed, through SOCKS5 with a password");
    c.within(|| {
        let mut s = TcpStream::connect("127.0.0.1:1080").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert!(socks_hello(&mut s, Some(("weft", "wrong"))).is_err(), "a wrong password is refused");
        let mut s = TcpStream::connect("127.0.0.1:1080").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert!(socks_hello(&mut s, None).is_err(), "no authentication is refused when one is set");
    });
    drop(nb);
}

fn up(args: &[&str]) -> (i32, String) {
    let out = Command::new(weft_bin())
        .arg("up")
        .args(NET)
        .args(["-i", "10.126.152.1/24"])
        .args(args)
        .env_remove("WEFT_SOCKS5_AUTH")
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_no_tun_input_is_refused_clearly() {
    for (bad, says) in [
        (&["--no-tun", "--dev-name", "x0"][..], "--dev-name needs a TUN device"),
        (&["--no-tun", "--proxy-network", "10.9.0.0/24"], "--proxy-network needs a TUN device"),
        (&["--no-tun", "--exit-node"], "--exit-node needs a TUN device"),
        (&["--socks5", "127.0.0.1:1080"], "--socks5 needs --no-tun"),
        (&["--forward", "tcp://127.0.0.1:6000=10.0.0.1:80"], "--forward needs --no-tun"),
        (&["--no-tun", "--forward", "tcp://127.0.0.1:6000"], "invalid --forward"),
        (&["--no-tun", "--forward", "sctp://127.0.0.1:6000=10.0.0.1:80"], "unknown protocol \"sctp\""),
        (&["--no-tun", "--forward", "tcp://127.0.0.1:6000=10.0.0.1:0"], "remote port"),
        (&["--no-tun", "--forward", "tcp://127.0.0.1:6000=bad_host!:80"], "neither an address nor a member name"),
        (&["--no-tun", "--expose", "tcp://0=127.0.0.1:80"], "overlay port"),
        (&["--no-tun", "--expose", "udp://53=nowhere"], "invalid --expose"),
        (&["--no-tun", "--expose", "tcp://80=127.0.0.1:8080", "--expose", "tcp://80=127.0.0.1:8081"], "exposed twice"),
        (&["--no-tun", "--socks5", "localhost"], "invalid --socks5"),
        (&["--no-tun", "--socks5", "127.0.0.1:1080", "--socks5-auth", "nocolon"], "invalid --socks5-auth"),
        (&["--no-tun", "--socks5-auth", "a:b"], "--socks5-auth needs --socks5"),
    ] {
        let (code, err) = up(bad);
        assert_eq!(code, 2, "weft up {bad:?}: {err}");
        assert!(err.contains(says), "weft up {bad:?} should say {says:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_local_port_in_use_fails_the_start() {
    require_root();
    let dir = TempDir::new();
    let ns = Netns::new();
    ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
    // Held in the node's namespace while it starts.
    let (code, err) = ns.within(|| {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let out = Command::new(weft_bin())
            .arg("up")
            .args(NET)
            .args(["-i", "10.126.152.1/24", "--no-tun", "-l", "udp://127.0.0.1:0"])
            .arg("--state-dir")
            .arg(dir.0.join("state"))
            .arg("--control")
            .arg(dir.0.join("c.sock"))
            .args(["--socks5", &format!("127.0.0.1:{port}")])
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot listen on --socks5"), "{err}");
}

#[test]
fn every_transport_and_cipher_carries_a_no_tun_member() {
    require_root();
    for (proto, port, cipher) in [
        ("tcp", 11010, "none"),
        ("ws", 11011, "aes-128-gcm"),
        ("wss", 11012, "chacha20-poly1305"),
        ("quic", 11012, "none"),
    ] {
        let dir = TempDir::new();
        let (a, b) = (Netns::new(), Netns::new());
        link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24");
        let listen = format!("{proto}://0.0.0.0:{port}");
        let path = if proto.starts_with("ws") { "/weft" } else { "" };
        let peer = format!("{proto}://192.0.2.1:{port}{path}");
        let common = ["--cipher", cipher, "--no-ipv6"];
        let na = Node::start(
            &a,
            &dir.0,
            "a",
            &args("10.126.153.1/24", "alpha", &[&common[..], &["--threads", "1", "-l", &listen]].concat()),
        );
        let nb = Node::start_unprivileged(
            &b,
            &dir.0,
            "b",
            &args(
                "10.126.153.2/24",
                "beta",
                &[
                    &common[..],
                    &["--no-tun", "-l", &listen, "-p", &peer, "--forward", "tcp://127.0.0.1:6000=alpha:5001"],
                ]
                .concat(),
            ),
        );
        wait_until(Duration::from_secs(15), "a session over the transport", || {
            na.peer("10.126.153.2").is_some_and(|p| p["state"] == "established" && p["transport"] == proto)
        });
        assert!(ping(&a, "10.126.153.2"), "{proto}/{cipher}: ping the no-TUN member");
        let server = sink(&a, "10.126.153.1:5001");
        let sent = b.within(|| {
            let mut s = TcpStream::connect("127.0.0.1:6000").unwrap();
            send_all(&mut s, 8 << 20)
        });
        assert_eq!(server.join().unwrap(), (8 << 20, sent), "{proto}/{cipher}: 8 MiB through --forward");
        assert_eq!(nb.peer("10.126.153.1").unwrap()["transport"], proto);
    }
}

#[test]
fn an_exposed_port_is_capped_and_services_beyond_loopback_are_warned_of() {
    require_root();
    let dir = TempDir::new();
    let (a, b) = (Netns::new(), Netns::new());
    link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24");
    b.exec_ok(&["ip", "link", "set", "lo", "up"]);
    // B's local service holds every connection it gets.
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let service = b.within(|| TcpListener::bind("127.0.0.1:7003").unwrap());
    let h = held.clone();
    std::thread::spawn(move || {
        for c in service.incoming().flatten() {
            h.lock().unwrap().push(c);
        }
    });
    let b_extra = [
        "--no-tun",
        "--threads",
        "1",
        "--expose",
        "tcp://5003=127.0.0.1:7003",
        "--metrics",
        "0.0.0.0:9109",
        "--socks5",
        "0.0.0.0:1081",
    ];
    let nb = Node::start(&b, &dir.0, "b", &args("10.126.152.2/24", "bravo", &b_extra));
    let na = Node::start(
        &a,
        &dir.0,
        "a",
        &args("10.126.152.1/24", "alpha", &["--threads", "1", "-p", "udp://192.0.2.2:11010"]),
    );
    wait_until(Duration::from_secs(15), "A reaches B", || na.routes_to("10.126.152.2"));
    let log = nb.log_text();
    assert!(log.contains("--metrics listens beyond loopback: anyone who can reach any address of this host"), "{log}");
    assert!(log.contains("--socks5 without --socks5-auth listens beyond loopback"), "{log}");
    // A opens more connections than one exposed port relays at once.
    let cap = 256;
    let conns: Vec<TcpStream> = a.within(|| {
        (0..cap + 8)
            .filter_map(|_| {
                TcpStream::connect_timeout(&"10.126.152.2:5003".parse().unwrap(), Duration::from_secs(3)).ok()
            })
            .collect()
    });
    assert!(conns.len() > cap, "only {} connections opened", conns.len());
    wait_until(Duration::from_secs(10), "B refuses what is over the cap", || {
        nb.status()["userspace"]["expose_refused"].as_u64().unwrap_or(0) >= (conns.len() - cap) as u64
    });
    assert!(held.lock().unwrap().len() <= cap, "the service got {} connections", held.lock().unwrap().len());
    drop(conns);
}
