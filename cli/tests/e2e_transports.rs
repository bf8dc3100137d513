//! End-to-end: the transports beside UDP, with real `weft` processes in namespaces.
//!
//! Per transport (TCP, WebSocket, WebSocket over TLS, QUIC): ping and a 64 MiB
//! checksummed transfer with both nodes listening on that transport only. A three-node
//! mesh whose links each end up on a different transport because of per-pair
//! firewalls. UDP dropped by nftables mid-session: the pair moves to another
//! transport and keeps its session, then returns to UDP once it is allowed again.
//! Hostile clients (garbage, a trickled first frame, a bad WebSocket or TLS handshake,
//! too many connections from one address or from many) are closed or refused and
//! counted while the tunnel keeps working.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use netns::{
    Lan, Netns, Node, TempDir, ping, ping_times, require_root, transfer, tun_reads_without_waiting, wait_until,
};
use serde_json::Value;

const NET: [&str; 4] = ["--network-name", "e2e-transports", "--network-secret", "correct horse"];
const IPS: [&str; 3] = ["10.126.127.1", "10.126.127.2", "10.126.127.3"];

fn node_args(i: usize, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = NET.iter().map(|s| (*s).to_owned()).collect();
    v.extend(["-i".into(), format!("{}/24", IPS[i]), "--threads".into(), "2".into()]);
    v.extend(extra.iter().map(|s| (*s).to_owned()));
    v
}

fn start(lan: &Lan, dir: &TempDir, i: usize, extra: &[&str]) -> Node {
    let args = node_args(i, extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Node::start(&lan.hosts[i], &dir.0, &format!("n{i}"), &refs)
}

fn peer_field(n: &Node, ip: &str, field: &str) -> Option<String> {
    n.peer(ip).and_then(|p| p[field].as_str().map(str::to_owned))
}

fn transport_of(n: &Node, ip: &str) -> Option<String> {
    n.peer(ip)
        .filter(|p| p["state"] == "established" && p["path"] == "direct")
        .and_then(|p| p["transport"].as_str().map(str::to_owned))
}

/// A counter summed over a node's pipelines: GSO records sent (`tx_gso_records`) or
/// received (`rx_gso_records`), answers sent by receive threads (`tx_answers`).
fn summed(n: &Node, dir: &str) -> u64 {
    n.status()["pipelines"].as_array().unwrap().iter().map(|p| p[dir].as_u64().unwrap_or(0)).sum()
}

/// Whether this run keeps offloads on (scripts/test.sh runs the suite again with
/// `WEFT_NO_OFFLOAD=1`).
fn offload_on() -> bool {
    std::env::var_os("WEFT_NO_OFFLOAD").is_none_or(|v| v.is_empty() || v == "0")
}

fn counter(st: &Value, name: &str) -> u64 {
    st["transport_counters"][name].as_u64().unwrap_or(0)
}

/// Drops every packet of `proto` (and, if given, only to or from `port`) between this
/// namespace and `peer`, both ways.
fn block(ns: &Netns, peer: &str, proto: &str, port: Option<u16>) {
    let _ = ns.exec_status(&["nft", "add", "table", "inet", "weftblock"]);
    for (chain, hook, dir) in [("input", "input", "saddr"), ("output", "output", "daddr")] {
        let _ = ns.exec_status(&[
            "nft",
            "add",
            "chain",
            "inet",
            "weftblock",
            chain,
            &format!("{{ type filter hook {hook} priority 0 ; }}"),
        ]);
        let port_match = match port {
            Some(p) => format!("{proto} dport {p}"),
            None => format!("meta l4proto {proto}"),
        };
        let port_rev = match port {
            Some(p) => format!("{proto} sport {p}"),
            None => format!("meta l4proto {proto}"),
        };
        for m in [port_match, port_rev] {
            let rule = format!("ip {dir} {peer} {m} drop");
            let mut argv = vec!["nft", "add", "rule", "inet", "weftblock", chain];
            argv.extend(rule.split(' '));
            ns.exec_ok(&argv);
        }
    }
}

fn unblock(ns: &Netns) {
    ns.exec_ok(&["nft", "delete", "table", "inet", "weftblock"]);
}

/// Both nodes listen on `proto` only; B dials A. Ping, 64 MiB checksummed both
/// ways, and the status names the transport.
fn single_transport(proto: &str, port: u16) {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let listen = format!("{proto}://0.0.0.0:{port}");
    let a = start(&lan, &dir, 0, &["-l", &listen]);
    let path = if proto.starts_with("ws") { "/weft" } else { "" };
    let peer = format!("{proto}://{}:{port}{path}", lan.addrs[0]);
    let b = start(&lan, &dir, 1, &["-l", &listen, "-p", &peer]);
    let t = wait_until(Duration::from_secs(10), "session over the transport", || {
        transport_of(&a, IPS[1]).as_deref() == Some(proto) && transport_of(&b, IPS[0]).as_deref() == Some(proto)
    });
    eprintln!("{proto}: session up in {t:?}");
    assert!(ping(&lan.hosts[0], IPS[1]) && ping(&lan.hosts[1], IPS[0]), "{proto}: ping");
    // An echo reply leaves from the connection thread that wrote the request, unless the
    // TX thread, woken by the same reply, reads it first: of 20 pings each way, some.
    for (from, to, ip) in [(0, 1, IPS[1]), (1, 0, IPS[0])] {
        assert_eq!(ping_times(&lan.hosts[from], ip, 20).len(), 20, "{proto}: pings {from}->{to}");
    }
    for (n, name) in [(&a, "a"), (&b, "b")] {
        let answers = summed(n, "tx_answers");
        if tun_reads_without_waiting() {
            assert!(answers > 0, "{proto}: {name} answered no ping from a receive thread");
        } else {
            assert_eq!(answers, 0, "{proto}: this kernel's TUN cannot be read without waiting");
        }
    }
    for (from, to, ip) in [(0, 1, IPS[1]), (1, 0, IPS[0])] {
        let (sent, got, took) = transfer(&lan.hosts[from], &lan.hosts[to], ip, 64 << 20);
        assert_eq!(sent, got, "{proto}: SHA-256 of the 64 MiB transfer differs");
        eprintln!("{proto}: 64 MiB {from}->{to} in {took:?} ({:.0} Mbit/s)", 537.0 / took.as_secs_f64());
    }
    // With TUN offload the kernel's super-packets travel whole (one record each) in
    // both directions — over QUIC on the connection's stream; without offload there
    // are none.
    let offload = offload_on();
    for (n, name) in [(&a, "a"), (&b, "b")] {
        let (tx, rx) = (summed(n, "tx_gso_records"), summed(n, "rx_gso_records"));
        eprintln!("{proto}: {name} sent {tx} and received {rx} GSO records");
        if offload {
            assert!(tx > 0 && rx > 0, "{proto}: {name} sent {tx}, received {rx} GSO records");
        } else {
            assert_eq!((tx, rx), (0, 0), "{proto}: no GSO records without offload");
        }
    }
    if proto == "quic" {
        // TCP over QUIC gets its MSS clamped: ~50 000 full-size segments went out, and
        // only the few sent before the path MTU was discovered were split in two.
        for n in [&a, &b] {
            let split = counter(&n.status(), "quic_fragmented");
            eprintln!("quic: {split} frames split in two datagrams");
            assert!(split < 2000, "{split} frames split over QUIC");
        }
    }
    let st = b.status();
    assert_eq!(st["listeners"][0], listen.as_str());
    assert!(st["connections"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(peer_field(&b, IPS[0], "transport").as_deref(), Some(proto));
    let out =
        std::process::Command::new(netns::weft_bin()).args(["peers", "--control"]).arg(&b.control).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(proto), "weft peers shows the transport:\n{table}");
}

/// GSO records from a member with TUN offload to one without: the receiver splits
/// them itself (and sends none), and 64 MiB arrive intact both ways.
#[test]
fn gso_records_reach_a_member_without_tun_offload() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let a = start(&lan, &dir, 0, &["-l", "tcp://0.0.0.0:11030"]);
    let peer = format!("tcp://{}:11030", lan.addrs[0]);
    let b = start(&lan, &dir, 1, &["-l", "tcp://0.0.0.0:11030", "-p", &peer, "--no-tun-offload"]);
    wait_until(Duration::from_secs(10), "session over tcp", || transport_of(&a, IPS[1]).as_deref() == Some("tcp"));
    for (from, to, ip) in [(0, 1, IPS[1]), (1, 0, IPS[0])] {
        let (sent, got, _) = transfer(&lan.hosts[from], &lan.hosts[to], ip, 64 << 20);
        assert_eq!(sent, got, "SHA-256 of the 64 MiB transfer {from}->{to} differs");
    }
    if offload_on() {
        assert!(summed(&a, "tx_gso_records") > 0 && summed(&b, "rx_gso_records") > 0);
    }
    assert_eq!(summed(&b, "tx_gso_records"), 0, "no super-packets without TUN offload");
}

#[test]
fn tcp_carries_the_tunnel() {
    single_transport("tcp", 11010);
}

#[test]
fn websocket_carries_the_tunnel() {
    single_transport("ws", 11011);
}

#[test]
fn websocket_over_tls_carries_the_tunnel() {
    single_transport("wss", 11012);
}

#[test]
fn quic_carries_the_tunnel() {
    single_transport("quic", 11012);
}

/// Three nodes listening on every transport, behind firewalls that allow a different
/// best transport on each pair: A-B only QUIC (plain UDP on 11010 dropped), B-C no
/// UDP at all (TCP), A-C no UDP and no TCP on 11010 (WebSocket).
#[test]
fn three_nodes_each_link_on_another_transport() {
    require_root();
    let lan = Lan::new(3);
    let (a_ip, b_ip, c_ip) = (&lan.addrs[0], &lan.addrs[1], &lan.addrs[2]);
    for (ns, peer) in [(0, b_ip), (1, a_ip)] {
        block(&lan.hosts[ns], peer, "udp", Some(11010));
    }
    for (ns, peer) in [(1, c_ip), (2, b_ip)] {
        block(&lan.hosts[ns], peer, "udp", None);
    }
    for (ns, peer) in [(0, c_ip), (2, a_ip)] {
        block(&lan.hosts[ns], peer, "udp", None);
        block(&lan.hosts[ns], peer, "tcp", Some(11010));
    }
    let dir = TempDir::new();
    let a = start(&lan, &dir, 0, &[]);
    let b = start(&lan, &dir, 1, &["-p", &format!("quic://{a_ip}:11012")]);
    let c = start(&lan, &dir, 2, &["-p", &format!("tcp://{b_ip}:11010"), "-p", &format!("ws://{a_ip}:11011/")]);
    let want = [
        (&a, IPS[1], "quic"),
        (&b, IPS[0], "quic"),
        (&b, IPS[2], "tcp"),
        (&c, IPS[1], "tcp"),
        (&a, IPS[2], "ws"),
        (&c, IPS[0], "ws"),
    ];
    let t = wait_until(Duration::from_secs(30), "each link on its transport", || {
        want.iter().all(|(n, ip, proto)| transport_of(n, ip).as_deref() == Some(*proto))
    });
    eprintln!("three links on quic, tcp and ws after {t:?}");
    for (from, ip) in [(0, IPS[1]), (1, IPS[2]), (2, IPS[0]), (0, IPS[2])] {
        assert!(ping(&lan.hosts[from], ip), "ping {from} -> {ip}");
    }
    let (sent, got, _) = transfer(&lan.hosts[0], &lan.hosts[2], IPS[2], 16 << 20);
    assert_eq!(sent, got, "A -> C over WebSocket");
}

/// A session on UDP; nftables starts dropping UDP between the two: the pair moves to
/// TCP within seconds without a new handshake, a transfer running across the switch
/// completes intact; UDP allowed again: back to UDP.
#[test]
fn udp_blocked_falls_back_and_returns() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let a = start(&lan, &dir, 0, &[]);
    let b = start(&lan, &dir, 1, &["-p", &format!("udp://{}:11010", lan.addrs[0])]);
    wait_until(Duration::from_secs(10), "session on udp", || {
        transport_of(&a, IPS[1]).as_deref() == Some("udp") && transport_of(&b, IPS[0]).as_deref() == Some("udp")
    });
    let handshake_before = b.peer(IPS[0]).unwrap()["last_handshake_secs"].as_u64().unwrap();

    std::thread::scope(|s| {
        // A transfer that runs across the switch: TCP inside the tunnel retransmits
        // what was lost while the path changed.
        let flow = s.spawn(|| transfer(&lan.hosts[0], &lan.hosts[1], IPS[1], 48 << 20));
        std::thread::sleep(Duration::from_millis(300));
        let cut = Instant::now();
        block(&lan.hosts[0], &lan.addrs[1], "udp", None);
        block(&lan.hosts[1], &lan.addrs[0], "udp", None);
        let moved = wait_until(Duration::from_secs(15), "fallback off udp", || {
            let (x, y) = (transport_of(&a, IPS[1]), transport_of(&b, IPS[0]));
            x.is_some_and(|t| t != "udp") && y.is_some_and(|t| t != "udp")
        });
        eprintln!("udp blocked: moved to {:?} after {:?}", transport_of(&a, IPS[1]), cut.elapsed());
        assert!(moved <= Duration::from_secs(8), "fallback took {moved:?}");
        let (sent, got, took) = flow.join().unwrap();
        assert_eq!(sent, got, "transfer across the fallback");
        eprintln!("48 MiB across the fallback in {took:?}");
    });
    assert_eq!(transport_of(&a, IPS[1]).as_deref(), Some("tcp"), "UDP and QUIC are both blocked");
    assert!(ping(&lan.hosts[1], IPS[0]));
    let st = b.status();
    let handshake_after = st["peers"][0]["last_handshake_secs"].as_u64().unwrap();
    assert!(handshake_after >= handshake_before, "the session survived the move: {st}");

    unblock(&lan.hosts[0]);
    unblock(&lan.hosts[1]);
    let back = wait_until(Duration::from_secs(40), "back on udp", || {
        transport_of(&a, IPS[1]).as_deref() == Some("udp") && transport_of(&b, IPS[0]).as_deref() == Some("udp")
    });
    eprintln!("udp allowed again: back on udp after {back:?}");
    assert!(ping(&lan.hosts[0], IPS[1]));
}

/// Garbage, a trickled first frame, bad WebSocket and TLS handshakes, more
/// connections from one address than its share, and more connections than allowed:
/// each closed or refused and counted, and the tunnel between the two nodes keeps
/// working. An unreachable tcp:// peer is retried and its error shown.
#[test]
fn hostile_connections_are_closed_and_counted() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    // Eight slots, at most two per source address.
    let a = start(&lan, &dir, 0, &["--max-connections", "8"]);
    let unreachable = format!("tcp://{}:9", lan.addrs[0]);
    let b = start(&lan, &dir, 1, &["-p", &format!("tcp://{}:11010", lan.addrs[0]), "-p", &unreachable]);
    wait_until(Duration::from_secs(10), "session", || a.peer_established(IPS[1]) && b.peer_established(IPS[0]));
    // More source addresses for host 1 (inside its namespace, gone with it).
    let extra: Vec<String> = (101..105).map(|i| format!("192.0.2.{i}")).collect();
    for e in &extra {
        lan.hosts[1].exec_ok(&["ip", "addr", "add", &format!("{e}/24"), "dev", "eth0"]);
    }
    let a_ip = lan.addrs[0].clone();
    lan.hosts[1].within(|| {
        let connect_from = |src: Option<&str>, port: u16| {
            let to: std::net::SocketAddr = format!("{a_ip}:{port}").parse().unwrap();
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            if let Some(src) = src {
                s.bind(&format!("{src}:0").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
            }
            s.connect_timeout(&to.into(), Duration::from_secs(2)).unwrap();
            let c: TcpStream = s.into();
            c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            c
        };
        let connect = |port: u16| connect_from(None, port);
        // Each is closed by the node (read returns 0 or an error, never hangs).
        let closed = |what: &str, c: &mut TcpStream, within: Duration| {
            let started = Instant::now();
            let mut buf = [0u8; 4096];
            loop {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            assert!(started.elapsed() < within, "{what} was not closed within {within:?}");
        };
        // Not our framing: a zero length. (B's own connection holds one of the two
        // slots of this address on 11010; this takes the other.)
        let mut g = connect(11010);
        g.write_all(&[0, 0, 1, 2, 3]).unwrap();
        closed("garbage", &mut g, Duration::from_secs(3));
        // A WebSocket client that speaks plain text instead of an HTTP upgrade.
        let mut w = connect(11011);
        w.write_all(b"hello there\r\n\r\n").unwrap();
        // A TLS client that sends garbage instead of a ClientHello.
        let mut t = connect(11012);
        t.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5]).unwrap();
        closed("ws garbage", &mut w, Duration::from_secs(14));
        closed("tls garbage", &mut t, Duration::from_secs(14));
        // Slow loris: a first frame trickled one byte a second never completes in
        // time, although every read arrives well within the deadline.
        let mut s = connect(11010);
        let mut sw = s.try_clone().unwrap();
        let trickler = std::thread::spawn(move || {
            let mut frame = vec![0u8, 200];
            frame.extend([7u8; 200]);
            for byte in frame {
                if sw.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        closed("slow loris", &mut s, Duration::from_secs(9));
        drop(s);
        trickler.join().unwrap();
        // One address beyond its share: refused at once, the real peer's link stays.
        let mut over: Vec<TcpStream> = (0..6).map(|_| connect(11010)).collect();
        for (i, c) in over.iter_mut().enumerate().skip(1) {
            closed(&format!("connection {i} beyond the share"), c, Duration::from_secs(2));
        }
        drop(over);
        // Many addresses: two each from four more fill the listener; the rest is refused.
        let held: Vec<TcpStream> =
            extra.iter().flat_map(|e| [connect_from(Some(e), 11010), connect_from(Some(e), 11010)]).collect();
        std::thread::sleep(Duration::from_millis(500));
        drop(held);
    });
    let st = a.status();
    // (Eight slots give a pool of two unproven connections: the four extra sources
    // find it full before they find the listener full.)
    for (name, at_least) in [
        ("protocol_errors", 1),
        ("handshake_failures", 2),
        ("timeouts", 1),
        ("refused_source", 4),
        ("refused_unproven", 1),
    ] {
        assert!(counter(&st, name) >= at_least, "{name} not counted: {}", st["transport_counters"]);
    }
    assert!(a.peer_established(IPS[1]), "the real peer stayed up");
    assert!(ping(&lan.hosts[1], IPS[0]), "A: {}\nB: {}\nA status: {}", a.log_text(), b.log_text(), a.status());
    let pending = b.status()["pending_peers"].clone();
    let entry = pending.as_array().unwrap().iter().find(|p| p["endpoint"] == unreachable.as_str()).cloned();
    let entry = entry.unwrap_or_else(|| panic!("unreachable peer not listed: {pending}"));
    assert!(entry["error"].as_str().unwrap_or("").contains("refused"), "{entry}");
}

/// An attacker with 32 IPv6 /64s (one /48) opens connections to a node's TCP
/// listener and keeps each busy with well-framed frames that no member would send
/// (before: the per-source cap counted /64s, and frames kept connections open, so 32
/// /64s held every slot). A member then joins over TCP: it gets in, and the stranger's
/// connections are closed by the proof deadline and counted.
#[test]
fn a_member_joins_over_tcp_while_32_ipv6_subnets_hold_framed_connections() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let a = start(&lan, &dir, 0, &["--max-connections", "64"]);
    lan.hosts[0].exec_ok(&["ip", "-6", "addr", "add", "fd00:a::1/16", "dev", "eth0", "nodad"]);
    let sources: Vec<String> = (0..32).map(|n| format!("fd00:b:0:{n:x}::1")).collect();
    for src in &sources {
        lan.hosts[2].exec_ok(&["ip", "-6", "addr", "add", &format!("{src}/16"), "dev", "eth0", "nodad"]);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (held, b) = std::thread::scope(|s| {
        let attack = s.spawn(|| {
            lan.hosts[2].within(|| {
                // Two connections per /64, each sent a 1-byte frame every 500 ms.
                let mut conns: Vec<TcpStream> = Vec::new();
                let to: std::net::SocketAddr = "[fd00:a::1]:11010".parse().unwrap();
                for src in sources.iter().flat_map(|s| [s, s]) {
                    let sock = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).unwrap();
                    sock.bind(&format!("[{src}]:0").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
                    if sock.connect_timeout(&to.into(), Duration::from_secs(2)).is_ok() {
                        conns.push(sock.into());
                    }
                }
                let start = Instant::now();
                let mut most_open = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && start.elapsed() < Duration::from_secs(30) {
                    conns.retain_mut(|c| c.write_all(&[0, 1, 0x42]).is_ok());
                    most_open = most_open.max(conns.len());
                    std::thread::sleep(Duration::from_millis(500));
                }
                (most_open, start.elapsed())
            })
        });
        std::thread::sleep(Duration::from_secs(2));
        let b = start(&lan, &dir, 1, &["-p", &format!("tcp://{}:11010", lan.addrs[0])]);
        wait_until(Duration::from_secs(15), "B joins over TCP", || {
            a.peer_established(IPS[1]) && b.peer_established(IPS[0])
        });
        // The stranger's connections are all closed by the proof deadline.
        wait_until(Duration::from_secs(15), "the stranger's connections closed", || {
            counter(&a.status(), "unproven_closed") + counter(&a.status(), "refused_unproven") >= 64
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (attack.join().unwrap(), b)
    });
    let st = a.status();
    eprintln!("the attacker saw at most {} connections open on its side; A: {}", held.0, st["transport_counters"]);
    assert!(counter(&st, "unproven_closed") >= 1, "{}", st["transport_counters"]);
    assert!(ping(&lan.hosts[1], IPS[0]), "A: {}\nB: {}", a.log_text(), b.log_text());
}

/// A and C cannot reach each other at all; A-B is TCP only (no UDP), B-C WebSocket
/// only (no UDP, no TCP on 11010): A and C talk end to end through B, the relay
/// forwarding sealed frames from one kind of connection to the other.
#[test]
fn relay_between_two_transports() {
    require_root();
    let lan = Lan::new(3);
    let (a_ip, b_ip, c_ip) = (&lan.addrs[0], &lan.addrs[1], &lan.addrs[2]);
    for proto in ["udp", "tcp"] {
        block(&lan.hosts[0], c_ip, proto, None);
        block(&lan.hosts[2], a_ip, proto, None);
    }
    block(&lan.hosts[0], b_ip, "udp", None);
    block(&lan.hosts[1], a_ip, "udp", None);
    block(&lan.hosts[1], c_ip, "udp", None);
    block(&lan.hosts[1], c_ip, "tcp", Some(11010));
    block(&lan.hosts[2], b_ip, "udp", None);
    block(&lan.hosts[2], b_ip, "tcp", Some(11010));
    let dir = TempDir::new();
    let b = start(&lan, &dir, 1, &[]);
    let a = start(&lan, &dir, 0, &["-p", &format!("tcp://{b_ip}:11010")]);
    let c = start(&lan, &dir, 2, &["-p", &format!("ws://{b_ip}:11011/")]);
    let relayed = |n: &Node, ip: &str| n.peer(ip).is_some_and(|p| p["state"] == "established" && p["path"] == "relay");
    // A and C learn each other through B; the first packet makes their session.
    wait_until(Duration::from_secs(30), "A and C learn each other", || a.routes_to(IPS[2]) && c.routes_to(IPS[0]));
    let t = wait_until(Duration::from_secs(30), "A and C relayed through B", || {
        ping(&lan.hosts[0], IPS[2]) && relayed(&a, IPS[2]) && relayed(&c, IPS[0])
    });
    eprintln!("A <-> C relayed after {t:?}");
    assert_eq!(
        peer_field(&a, IPS[2], "transport").as_deref(),
        Some("tcp"),
        "A's first link is TCP: {}",
        a.status()["peers"]
    );
    assert_eq!(peer_field(&c, IPS[0], "transport").as_deref(), Some("ws"), "C's first link is WebSocket");
    assert!(ping(&lan.hosts[0], IPS[2]) && ping(&lan.hosts[2], IPS[0]));
    let (sent, got, took) = transfer(&lan.hosts[0], &lan.hosts[2], IPS[2], 16 << 20);
    assert_eq!(sent, got, "A -> C through the relay");
    eprintln!("16 MiB A -> C over tcp + ws through B in {took:?}");
    let (sent, got, _) = transfer(&lan.hosts[2], &lan.hosts[0], IPS[0], 16 << 20);
    assert_eq!(sent, got, "C -> A through the relay");
    // Both links are streams: with TUN offload, super-packets crossed B whole, as GSO
    // records it forwarded without opening.
    let (a_tx, c_rx, c_tx, a_rx) = (
        summed(&a, "tx_gso_records"),
        summed(&c, "rx_gso_records"),
        summed(&c, "tx_gso_records"),
        summed(&a, "rx_gso_records"),
    );
    eprintln!("GSO records through B: A sent {a_tx}, C received {c_rx}; C sent {c_tx}, A received {a_rx}");
    if offload_on() {
        assert!(a_tx > 0 && c_rx > 0 && c_tx > 0 && a_rx > 0, "GSO records did not cross the relay");
    }
    // B's readers handed whole batches of relayed frames from one connection to the
    // other themselves, without a connection RX thread.
    let relayed = counter(&b.status(), "relayed_batches");
    eprintln!("batches B relayed whole from reader to writer: {relayed}");
    assert!(relayed > 0, "no batch relayed whole: {}", b.status()["transport_counters"]);
}

/// Dialled over WebSocket, both listening on every transport: the pair learns each
/// other's endpoints from their records and moves to UDP, the preferred transport.
#[test]
fn dialled_over_websocket_upgrades_to_udp() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let a = start(&lan, &dir, 0, &[]);
    let b = start(&lan, &dir, 1, &["-p", &format!("ws://{}:11011/weft", lan.addrs[0])]);
    wait_until(Duration::from_secs(10), "session", || a.peer_established(IPS[1]) && b.peer_established(IPS[0]));
    let t = wait_until(Duration::from_secs(20), "upgrade to udp", || {
        transport_of(&a, IPS[1]).as_deref() == Some("udp") && transport_of(&b, IPS[0]).as_deref() == Some("udp")
    });
    eprintln!("ws -> udp after {t:?}");
    assert!(ping(&lan.hosts[1], IPS[0]));
}

/// A hub with two pipelines and two members, each on a TCP connection (no UDP
/// anywhere): each connection's frames are opened by a connection thread of its own, and
/// 32 MiB from each member arrive intact.
#[test]
fn two_connections_are_opened_on_two_threads() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let listen = ["-l", "tcp://0.0.0.0:11040"];
    let hub = start(&lan, &dir, 0, &listen);
    let dial = ["-p", &format!("tcp://{}:11040", lan.addrs[0])].map(str::to_owned);
    let args = [&listen[..], &[dial[0].as_str(), dial[1].as_str()]].concat();
    let (b, c) = (start(&lan, &dir, 1, &args), start(&lan, &dir, 2, &args));
    wait_until(Duration::from_secs(10), "both members on their connection", || {
        transport_of(&b, IPS[0]).as_deref() == Some("tcp") && transport_of(&c, IPS[0]).as_deref() == Some("tcp")
    });
    for from in [1, 2] {
        let (sent, got, _) = transfer(&lan.hosts[from], &lan.hosts[0], IPS[0], 32 << 20);
        assert_eq!(sent, got, "SHA-256 of the 32 MiB transfer {from} -> hub differs");
    }
    let st = hub.status();
    let links: Vec<u64> = st["pipelines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["links"] == true)
        .map(|p| p["rx_bytes"].as_u64().unwrap())
        .collect();
    eprintln!("hub: {} connections, bytes opened per links thread {links:?}", st["connections"]);
    assert_eq!(links.len(), 2, "one links thread per pipeline: {}", st["pipelines"]);
    assert!(links.iter().all(|&b| b >= 16 << 20), "each member's transfer on its own thread: {links:?}");
}

/// A download over a TCP connection on a slow link (tbf at 20 Mbit/s each way; Reno,
/// a loss-based sender like CUBIC, which a namespace may not choose): the connection's
/// send queue drops batches while they keep waiting (CoDel, `queue_dropped`) instead
/// of holding the backlog, the download arrives intact, and the pings beside it are
/// answered (small batches are never dropped; a ping that shares a batch with bulk
/// frames may be).
#[test]
fn a_download_on_a_slow_tcp_link_keeps_the_send_queue_short() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    for h in &lan.hosts {
        h.exec_ok(&[
            "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "20mbit", "burst", "64kbit", "latency", "100ms",
        ]);
        h.exec_ok(&["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"]);
    }
    let a = start(&lan, &dir, 0, &["-l", "tcp://0.0.0.0:11050"]);
    let b = start(&lan, &dir, 1, &["-l", "tcp://0.0.0.0:11050", "-p", &format!("tcp://{}:11050", lan.addrs[0])]);
    wait_until(Duration::from_secs(15), "A and B talk over tcp", || transport_of(&a, IPS[1]).as_deref() == Some("tcp"));
    let ((sent, got), times) = std::thread::scope(|s| {
        let bulk = s.spawn(|| {
            let (sent, got, _) = transfer(&lan.hosts[0], &lan.hosts[1], IPS[1], 8 << 20);
            (sent, got)
        });
        std::thread::sleep(Duration::from_millis(500));
        let times = ping_times(&lan.hosts[0], IPS[1], 20);
        (bulk.join().unwrap(), times)
    });
    assert_eq!(sent, got, "the download arrived damaged");
    let dropped = counter(&a.status(), "queue_dropped");
    eprintln!("beside 8 MiB at 20 Mbit/s over tcp: {} of 20 pings answered, {dropped} batches dropped", times.len());
    assert!(dropped > 0, "A's send queue to B never dropped: {}", a.status()["transport_counters"]);
    assert!(times.len() >= 18, "pings beside the download: {times:?}");
    drop(b);
}
