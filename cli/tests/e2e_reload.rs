//! End-to-end: live reload. A node started from a config file gets a peer and a
//! proxied subnet by editing the file and `weft reload`, loses them again by SIGHUP,
//! keeps its other sessions (no new handshake), and names what needs a restart.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use netns::{Lan, Node, TempDir, require_root, wait_until, weft_bin};

const NET: [&str; 4] = ["--network-name", "reload", "--network-secret", "reload secret"];
const SUBNET: &str = "192.168.50.0/24";

fn write_config(path: &Path, extra: &str) {
    let base =
        "network-name = \"reload\"\nnetwork-secret = \"reload secret\"\nipv4 = \"10.126.126.1/24\"\nthreads = 1\n";
    // Two listeners unless the test gives its own.
    let listen =
        if extra.contains("listen") { "" } else { "listen = [\"udp://0.0.0.0:11010\", \"tcp://0.0.0.0:11010\"]\n" };
    std::fs::write(path, format!("{base}{listen}{extra}")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn proxies(n: &Node, owner: &str) -> Vec<String> {
    n.status()["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["overlay"] == owner)
        .map(|r| r["proxied"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn handshake_age(n: &Node, addr: &str) -> u64 {
    n.peer(addr).unwrap()["last_handshake_secs"].as_u64().unwrap()
}

#[test]
fn reload_adds_and_removes_peers_and_subnets_without_dropping_sessions() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let cfg = dir.0.join("a.toml");
    write_config(&cfg, "");
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &["--config", cfg.to_str().unwrap()]);
    let mut b_args = NET.to_vec();
    b_args.extend(["-i", "10.126.126.2/24", "--threads", "1"]);
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &b_args);
    let a_peer = format!("udp://{}:11010", lan.addrs[0]);
    let mut c_args = NET.to_vec();
    c_args.extend(["-i", "10.126.126.3/24", "--threads", "1", "-p", &a_peer]);
    let c = Node::start(&lan.hosts[2], &dir.0, "c", &c_args);
    wait_until(Duration::from_secs(10), "C joins A", || a.peer_established("10.126.126.3"));
    assert!(a.peer("10.126.126.2").is_none(), "A knows B before it was told to");
    std::thread::sleep(Duration::from_secs(2));
    let age_before = handshake_age(&a, "10.126.126.3");

    // Add a peer and a subnet by editing the file.
    let b_peer = format!("udp://{}:11010", lan.addrs[1]);
    write_config(
        &cfg,
        &format!(
            "peer = [\"{b_peer}\"]\nproxy-network = [\"{SUBNET}\"]\ndns-domain = \"mesh.example\"\nmetrics = \"127.0.0.1:9109\"\nlisten = [\"udp://0.0.0.0:11010\", \"tcp://0.0.0.0:11020\", \"ws://0.0.0.0:11021\"]\n"
        ),
    );
    let out = Command::new(weft_bin()).args(["reload", "--control"]).arg(&a.control).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains(&format!("added peer {b_peer}")) && said.contains(SUBNET), "{said}");
    assert!(said.contains("metrics on 127.0.0.1:9109"), "{said}");
    // Magic DNS answers for the new domain at once (same socket, new zone).
    assert!(said.contains("Magic DNS for mesh.example"), "{said}");
    assert_eq!(a.status()["magic_dns"]["domain"], "mesh.example");
    assert!(
        said.contains("closed listener tcp://0.0.0.0:11010") && said.contains("listening on tcp://0.0.0.0:11020"),
        "{said}"
    );
    let ports = lan.hosts[0].within(|| {
        let up = |p: u16| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
        (up(11010), up(11020), up(11021))
    });
    assert_eq!(ports, (false, true, true), "tcp 11010 closed, tcp 11020 and ws 11021 open");
    wait_until(Duration::from_secs(10), "A dials B", || a.peer_established("10.126.126.2"));
    wait_until(Duration::from_secs(10), "B and C route the new subnet to A", || {
        proxies(&b, "10.126.126.1") == [SUBNET] && proxies(&c, "10.126.126.1") == [SUBNET]
    });
    // The session with C was not made again.
    let age_after = handshake_age(&a, "10.126.126.3");
    assert!(age_after >= age_before, "A re-handshook with C on reload: {age_before}s then {age_after}s");
    assert_eq!(a.status()["proxy_networks"], serde_json::json!([SUBNET]));
    let scraped = lan.hosts[0].within(|| std::net::TcpStream::connect("127.0.0.1:9109").is_ok());
    assert!(scraped, "the metrics listener came up on reload");

    // Take them away again with SIGHUP, and ask for what cannot change live.
    write_config(&cfg, "cipher = \"chacha20-poly1305\"\n");
    let pid = a.pid().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    wait_until(Duration::from_secs(10), "B and C forget the subnet", || {
        proxies(&b, "10.126.126.1").is_empty() && proxies(&c, "10.126.126.1").is_empty()
    });
    // A stops dialling B (B stays a member of the network: it may come back through
    // the mesh or by its own dial, like a peer removed with `weft peer remove`).
    let log = a.log_text();
    assert!(log.contains(&format!("removed peer {b_peer}")), "{log}");
    assert!(log.contains("needs a restart to change (left as it was): cipher"), "{log}");
    assert_eq!(a.status()["cipher"], "aes-128-gcm");
    assert_eq!(a.status()["magic_dns"]["domain"], "reload.internal", "the default domain is back");
    assert!(a.peer_established("10.126.126.3"), "the session with C survived both reloads");
    assert!(handshake_age(&a, "10.126.126.3") >= age_after, "A re-handshook with C on SIGHUP");
    let gone = lan.hosts[0].within(|| std::net::TcpStream::connect("127.0.0.1:9109").is_err());
    assert!(gone, "the metrics listener closed when the key went");

    // A broken file is refused, named, and changes nothing.
    std::fs::write(&cfg, "network-name = \"reload\"\nbogus = 1\n").unwrap();
    let out = Command::new(weft_bin()).args(["reload", "--control"]).arg(&a.control).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bogus") && err.contains("a.toml"), "{err}");
    assert!(a.peer_established("10.126.126.3"));
}

fn endpoint(n: &Node, addr: &str) -> String {
    n.peer(addr).and_then(|p| p["endpoint"].as_str().map(str::to_owned)).unwrap_or_default()
}

fn bound_udp(ns: &netns::Netns, port: u16) -> bool {
    ns.within(|| std::net::UdpSocket::bind(("0.0.0.0", port)).is_err())
}

#[test]
fn reload_moves_udp_and_quic_listeners_under_running_sessions() {
    require_root();
    let lan = Lan::new(4);
    let dir = TempDir::new();
    let cfg = dir.0.join("a.toml");
    write_config(&cfg, "listen = [\"udp://0.0.0.0:11010\", \"quic://0.0.0.0:11011\"]\n");
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &["--config", cfg.to_str().unwrap()]);
    let peer_of = |i: usize, overlay: &'static str, uri: String| {
        let mut args: Vec<String> = NET.iter().map(|s| (*s).to_owned()).collect();
        args.extend(["-i".into(), overlay.into(), "--threads".into(), "1".into(), "-p".into(), uri]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Node::start(&lan.hosts[i], &dir.0, &format!("n{i}"), &refs)
    };
    let b = peer_of(1, "10.126.126.2/24", format!("udp://{}:11010", lan.addrs[0]));
    let c = peer_of(2, "10.126.126.3/24", format!("quic://{}:11011", lan.addrs[0]));
    wait_until(Duration::from_secs(10), "B and C join A", || {
        a.peer_established("10.126.126.2") && a.peer_established("10.126.126.3")
    });
    assert_eq!(b.peer("10.126.126.1").unwrap()["transport"], "udp");
    std::thread::sleep(Duration::from_secs(2));
    let (age_b, age_c) = (handshake_age(&a, "10.126.126.2"), handshake_age(&a, "10.126.126.3"));

    write_config(&cfg, "listen = [\"udp://0.0.0.0:11030\", \"quic://0.0.0.0:11031\"]\n");
    let out = Command::new(weft_bin()).args(["reload", "--control"]).arg(&a.control).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("listening on udp://0.0.0.0:11030"), "{said}");
    assert!(
        said.contains("closed listener quic://0.0.0.0:11011") && said.contains("listening on quic://0.0.0.0:11031"),
        "{said}"
    );
    assert!(!said.contains("restart"), "{said}");
    assert!(bound_udp(&lan.hosts[0], 11030) && bound_udp(&lan.hosts[0], 11031), "the new ports are not bound");
    // The old UDP socket closes once the receive blocked on it times out (the old QUIC
    // socket stays while connections accepted on it live).
    wait_until(Duration::from_secs(3), "udp 11010 is free", || !bound_udp(&lan.hosts[0], 11010));
    let listening = a.status()["listeners"].to_string();
    assert!(listening.contains("udp://0.0.0.0:11030") && listening.contains("quic://0.0.0.0:11031"), "{listening}");

    // B follows A to the new port by roaming, and C (which reached A over QUIC, then
    // took the UDP path A announced) too; neither session is made again.
    assert!(netns::ping(&lan.hosts[1], "10.126.126.1"), "B lost A after the UDP port moved");
    assert!(netns::ping(&lan.hosts[2], "10.126.126.1"), "C lost A after the QUIC listener moved");
    assert!(c.peer_established("10.126.126.1"));
    let new_ep = format!("udp://{}:11030", lan.addrs[0]);
    wait_until(Duration::from_secs(30), "B sends to A's new port", || endpoint(&b, "10.126.126.1") == new_ep);
    assert!(handshake_age(&a, "10.126.126.2") >= age_b, "A re-handshook with B");
    assert!(handshake_age(&a, "10.126.126.3") >= age_c, "A re-handshook with C");

    // A newcomer that knows only the new QUIC port joins (its first handshake can go
    // nowhere else: A's UDP endpoint reaches it only in A's record, after the session).
    let d = peer_of(3, "10.126.126.4/24", format!("quic://{}:11031", lan.addrs[0]));
    wait_until(Duration::from_secs(10), "D joins A over QUIC on the new port", || a.peer_established("10.126.126.4"));
    drop(d);

    // Without a udp:// listener the sockets move to an ephemeral port, still carrying
    // the sessions.
    write_config(&cfg, "listen = [\"quic://0.0.0.0:11031\"]\n");
    let out = Command::new(weft_bin()).args(["reload", "--control"]).arg(&a.control).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("udp listener closed"), "{said}");
    wait_until(Duration::from_secs(3), "udp 11030 is free", || !bound_udp(&lan.hosts[0], 11030));
    assert!(netns::ping(&lan.hosts[1], "10.126.126.1"), "B lost A after the UDP listener closed");
}
