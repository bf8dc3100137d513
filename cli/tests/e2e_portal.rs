//! End-to-end: the WireGuard portal with a WireGuard implementation nobody here wrote
//! as the client (wireguard-go and wg from Debian's packages), set up from the config
//! `weft wg add` prints, the way wg-quick does it.
//!
//! ```text
//!  W (client) --203.0.113.0/24-- P (portal) --192.0.2.0/24-- A --198.51.100.0/24-- B
//! ```
//! B has no link to P: the client reaches it two hops away through A.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netns::{Netns, Node, TempDir, link, ping, require_root, run, transfer, wait_until, weft_bin};
use serde_json::Value;

const NET: [&str; 4] = ["--network-name", "portal", "--network-secret", "portal secret"];

fn args<'a>(overlay: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", overlay, "--threads", "1"]);
    v.extend(extra);
    v
}

fn weft(args: &[&str]) -> std::process::Output {
    Command::new(weft_bin()).args(args).output().unwrap()
}

/// A wireguard-go client in `ns`, configured from a wg-quick file; stopped (by its
/// own PID) on drop.
struct WgClient<'a> {
    ns: &'a Netns,
    iface: String,
    child: Child,
    /// The wg(8) part of the config (what `wg-quick strip` leaves).
    setconf: PathBuf,
}

impl<'a> WgClient<'a> {
    fn up(ns: &'a Netns, iface: &str, config: &str, dir: &Path) -> Self {
        let conf = dir.join(format!("{iface}.conf"));
        std::fs::write(&conf, config).unwrap();
        let stripped = run(Command::new("wg-quick").arg("strip").arg(&conf)).stdout;
        let setconf = dir.join(format!("{iface}.wg"));
        std::fs::write(&setconf, stripped).unwrap();
        let log = std::fs::File::create(dir.join(format!("{iface}.log"))).unwrap();
        let child = ns
            .cmd("wireguard-go")
            .args(["-f", iface])
            .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("wireguard-go (apt install wireguard-go wireguard-tools)");
        let c = Self { ns, iface: iface.to_owned(), child, setconf };
        wait_until(Duration::from_secs(10), "wireguard-go creates its interface", || {
            ns.exec_status(&["wg", "show", iface])
        });
        c.setconf();
        // What wg-quick does with the rest: address, MTU, a route per AllowedIPs.
        let value = |key: &str| {
            config.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim_start_matches([' ', '=']).trim().to_owned()))
        };
        ns.exec_ok(&["ip", "addr", "add", &value("Address").unwrap(), "dev", iface]);
        ns.exec_ok(&["ip", "link", "set", "dev", iface, "mtu", &value("MTU").unwrap(), "up"]);
        for net in value("AllowedIPs").unwrap().split(',') {
            ns.exec_ok(&["ip", "route", "add", net.trim(), "dev", iface]);
        }
        c
    }

    /// Loads the peer configuration again (a new peer: the next packet handshakes).
    fn setconf(&self) {
        self.ns.exec_ok(&["wg", "setconf", &self.iface, self.setconf.to_str().unwrap()]);
    }
}

impl Drop for WgClient<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its control socket lives outside the namespace.
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{}.sock", self.iface));
    }
}

fn portal_status(n: &Node) -> Value {
    n.status()["wg_portal"].clone()
}

fn portal_drop(n: &Node, reason: &str) -> u64 {
    portal_status(n)["drops"][reason].as_u64().unwrap_or(0)
}

#[test]
fn a_stock_wireguard_client_reaches_the_mesh_through_the_portal() {
    require_root();
    let dir = TempDir::new();
    let (w, p, a, b) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
    link(&w, "eth0", "203.0.113.2/24", &p, "wan", "203.0.113.1/24");
    link(&p, "eth0", "192.0.2.1/24", &a, "eth0", "192.0.2.2/24");
    link(&a, "eth1", "198.51.100.2/24", &b, "eth0", "198.51.100.3/24");
    let portal = ["--wg-portal", "udp://0.0.0.0:51820", "--wg-portal-net", "10.127.0.0/24"];
    let mut np = Node::start(&p, &dir.0, "p", &args("10.126.126.1/24", &portal));
    let na = Node::start(&a, &dir.0, "a", &args("10.126.126.2/24", &["-p", "udp://192.0.2.1:11010"]));
    let nb = Node::start(&b, &dir.0, "b", &args("10.126.126.3/24", &["-p", "udp://198.51.100.2:11010"]));
    wait_until(Duration::from_secs(20), "P and B learn each other through A", || {
        np.routes_to("10.126.126.3") && nb.routes_to("10.126.126.1")
    });
    // The mesh learns the portal network as a subnet P proxies.
    wait_until(Duration::from_secs(10), "B routes the portal network to P", || {
        nb.status()["routes"].as_array().unwrap().iter().any(|r| {
            r["overlay"] == "10.126.126.1" && r["proxied"].as_array().unwrap().iter().any(|s| s == "10.127.0.0/24")
        })
    });
    let ctl = |n: &Node| n.control.to_str().unwrap().to_owned();

    // Bad input: names, duplicates, a node without a portal.
    let out = weft(&["wg", "add", "bad name", "--control", &ctl(&np)]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid client name"));
    let out = weft(&["wg", "add", "alice", "--control", &ctl(&na)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no WireGuard portal"));

    let out = weft(&["wg", "add", "alice", "--json", "--control", &ctl(&np)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let added: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(added["address"], "10.127.0.2");
    let config = added["config"].as_str().unwrap().to_owned();
    assert!(
        config.contains("Endpoint = 203.0.113.1:51820") || config.contains("Endpoint = 192.0.2.1:51820"),
        "{config}"
    );
    assert!(config.contains("AllowedIPs = 10.126.126.0/24, 10.127.0.0/24"), "{config}");
    let dup = weft(&["wg", "add", "alice", "--control", &ctl(&np)]);
    assert_eq!(dup.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&dup.stderr).contains("exists already"));
    // The client dials the address on its side of the link.
    let config = config.replace("Endpoint = 192.0.2.1:51820", "Endpoint = 203.0.113.1:51820");
    let iface = format!("wgt{}", std::process::id() % 100_000);
    let wg = WgClient::up(&w, &iface, &config, &dir.0);

    // The client reaches the portal, a member behind it and one two hops away; members
    // reach the client.
    for (to, what) in
        [("10.126.126.1", "the portal"), ("10.126.126.2", "A behind the portal"), ("10.126.126.3", "B two hops away")]
    {
        assert!(ping(&w, to) || ping(&w, to), "client -> {what}\nP {}", np.status());
    }
    assert!(ping(&a, "10.127.0.2"), "A -> client");
    assert!(ping(&b, "10.127.0.2"), "B -> client (two hops)");
    let st = portal_status(&np);
    let alice = &st["clients"][0];
    assert_eq!(alice["name"], "alice");
    assert!(alice["endpoint"].as_str().is_some_and(|e| e.starts_with("203.0.113.2:")), "{st}");
    assert!(alice["last_handshake_secs"].as_u64().is_some(), "{st}");
    let peers = weft(&["peers", "--control", &ctl(&np)]);
    let text = String::from_utf8_lossy(&peers.stdout);
    assert!(text.contains("alice") && text.contains("10.127.0.2"), "weft peers lists portal clients: {text}");

    // 64 MiB both ways, checksummed.
    let (sent, got, took) = transfer(&w, &a, "10.126.126.2", 64 << 20);
    assert_eq!(sent, got, "client -> A: SHA-256 differs");
    eprintln!("client -> A: 64 MiB in {took:?}");
    let (sent, got, took) = transfer(&b, &w, "10.127.0.2", 64 << 20);
    assert_eq!(sent, got, "B -> client: SHA-256 differs");
    eprintln!("B -> client: 64 MiB in {took:?}");
    assert!(portal_status(&np)["clients"][0]["rx_bytes"].as_u64().unwrap() > 64 << 20);

    // A client sending as another client (bob) gets nothing through, counted; A sees
    // nothing of it.
    let bob = weft(&["wg", "add", "bob", "--json", "--control", &ctl(&np)]);
    assert!(bob.status.success(), "{}", String::from_utf8_lossy(&bob.stderr));
    let bob: Value = serde_json::from_slice(&bob.stdout).unwrap();
    assert_eq!(bob["address"], "10.127.0.3");
    w.exec_ok(&["ip", "addr", "add", "10.127.0.3/32", "dev", &iface]);
    let spoofed_before = portal_drop(&np, "spoofed_source");
    let got = a.within(|| {
        let rx = std::net::UdpSocket::bind("10.126.126.2:7777").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        w.within(|| {
            let tx = std::net::UdpSocket::bind("10.127.0.3:0").unwrap();
            for _ in 0..20 {
                tx.send_to(b"as bob", "10.126.126.2:7777").unwrap();
            }
        });
        let mut buf = [0u8; 16];
        rx.recv_from(&mut buf).ok()
    });
    assert!(got.is_none(), "a datagram with bob's address as source reached A from alice");
    assert!(portal_drop(&np, "spoofed_source") >= spoofed_before + 20, "{}", portal_status(&np));
    // The portal is no router to the networks beside it (here A's underlay).
    let portal_key = config.lines().find_map(|l| l.strip_prefix("PublicKey = ")).unwrap();
    let wider = "10.126.126.0/24,10.127.0.0/24,192.0.2.0/24";
    w.exec_ok(&["wg", "set", &iface, "peer", portal_key, "allowed-ips", wider]);
    w.exec_ok(&["ip", "route", "add", "192.0.2.0/24", "dev", &iface]);
    assert!(!ping(&w, "192.0.2.2"), "the portal routed a client to its own LAN");
    assert!(portal_drop(&np, "forbidden_destination") > 0, "{}", portal_status(&np));

    // Garbage and truncated WireGuard messages from anywhere are dropped and counted;
    // the portal keeps serving.
    w.within(|| {
        let s = std::net::UdpSocket::bind("203.0.113.2:0").unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..2000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // The sizes of every message type, crossed with every type (so that inits,
            // responses and cookie replies of the right size reach the mac1 check and
            // data of any size the session lookup), reserved bytes zero as in real ones.
            let len = [0usize, 3, 4, 32, 64, 92, 148, 1500][(i % 8) as usize];
            let mut d: Vec<u8> = (0..len).map(|k| (x >> (k % 8 * 8)) as u8 ^ k as u8).collect();
            if len >= 4 {
                d[..4].copy_from_slice(&(1 + (i / 8) % 4).to_le_bytes());
            }
            let _ = s.send_to(&d, "203.0.113.1:51820");
        }
    });
    wait_until(Duration::from_secs(5), "the portal counts the garbage", || {
        portal_drop(&np, "bad_packet") > 100 && portal_drop(&np, "unknown_session") > 100
    });
    assert!(ping(&w, "10.126.126.2"), "the portal stopped serving after garbage");

    // An unknown key gets nothing through, counted.
    let key = run(Command::new("wg").arg("genkey")).stdout;
    let key_file = dir.0.join("other.key");
    std::fs::write(&key_file, key).unwrap();
    w.exec_ok(&["wg", "set", &iface, "private-key", key_file.to_str().unwrap()]);
    assert!(!ping(&w, "10.126.126.2"), "an unknown key got through");
    wait_until(Duration::from_secs(5), "the portal counts the unknown key", || portal_drop(&np, "unknown_key") > 0);

    // Clients persist: after a restart the portal knows alice (same key) and lets her in.
    np.restart();
    let after = portal_status(&np);
    assert_eq!(after["clients"][0]["public_key"], added["public_key"], "{after}");
    wait_until(Duration::from_secs(20), "P routes to A again", || np.routes_to("10.126.126.2"));
    wg.setconf();
    assert!(ping(&w, "10.126.126.2") || ping(&w, "10.126.126.2"), "the client is let in after a restart");

    // A removed client gets nothing through: neither on the session it has, nor with
    // a new handshake.
    let out = weft(&["wg", "remove", "alice", "--control", &ctl(&np)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (sessions_before, keys_before) = (portal_drop(&np, "unknown_session"), portal_drop(&np, "unknown_key"));
    assert!(!ping(&w, "10.126.126.2"), "a removed client got through on its session");
    assert!(portal_drop(&np, "unknown_session") > sessions_before, "{}", portal_status(&np));
    wg.setconf();
    assert!(!ping(&w, "10.126.126.2"), "a removed client got through with a new handshake");
    wait_until(Duration::from_secs(5), "the portal counts the removed key", || {
        portal_drop(&np, "unknown_key") > keys_before
    });
    let list = String::from_utf8_lossy(&weft(&["wg", "list", "--control", &ctl(&np)]).stdout).into_owned();
    assert!(!list.contains("alice") && list.contains("bob"), "{list}");
    let removed = std::fs::read_to_string(np.state.join("wg-portal.json")).unwrap();
    assert!(!removed.contains("alice") && removed.contains("bob"), "{removed}");

    // --qr prints the config and a QR code of it.
    let out = weft(&["wg", "add", "phone", "--qr", "--control", &ctl(&np)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("[Interface]") && text.contains('▀'), "{text}");
    drop(na);
}

/// Whether a TCP connection from `ns` to `addr` opens within 3 s.
fn connects(ns: &Netns, addr: &str) -> bool {
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    ns.within(|| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).is_ok())
}

/// Listens on `port` (all addresses) in `ns`, accepting and closing connections until
/// the process ends.
fn listen(ns: &Netns, port: u16) {
    let l = ns.within(|| std::net::TcpListener::bind(("0.0.0.0", port)).unwrap());
    std::thread::spawn(move || {
        for c in l.incoming() {
            drop(c);
        }
    });
}

#[test]
fn the_portal_enforces_the_access_policy_for_its_clients_both_ways() {
    require_root();
    let dir = TempDir::new();
    let (w, p, a) = (Netns::new(), Netns::new(), Netns::new());
    link(&w, "eth0", "203.0.113.2/24", &p, "wan", "203.0.113.1/24");
    link(&p, "eth0", "192.0.2.1/24", &a, "eth0", "192.0.2.2/24");
    // The portal node's policy (a local one: this network has no authority). The client
    // alice reaches A's SSH and pings it; A reaches alice's port 7000; nothing else,
    // and nothing of the portal node itself.
    let policy = dir.0.join("portal-policy.toml");
    std::fs::write(
        &policy,
        r#"[hosts]
alice = "10.127.0.2"
a = "10.126.126.2"
p = "10.126.126.1"

[[allow]]
from  = ["alice"]
to    = ["a"]
proto = "tcp"
ports = ["22"]

[[allow]]
from  = ["alice"]
to    = ["a"]
proto = "icmp"

[[allow]]
from  = ["a"]
to    = ["alice"]
proto = "tcp"
ports = ["7000"]

[[test]]
from  = "alice"
to    = "p:22"
allow = false
"#,
    )
    .unwrap();
    let portal = [
        "--wg-portal",
        "udp://0.0.0.0:51820",
        "--wg-portal-net",
        "10.127.0.0/24",
        "--policy",
        policy.to_str().unwrap(),
    ];
    let np = Node::start(&p, &dir.0, "p", &args("10.126.126.1/24", &portal));
    let na = Node::start(&a, &dir.0, "a", &args("10.126.126.2/24", &["-p", "udp://192.0.2.1:11010"]));
    wait_until(Duration::from_secs(20), "P and A learn each other", || {
        np.routes_to("10.126.126.2") && na.routes_to("10.126.126.1")
    });
    let ctl = np.control.to_str().unwrap().to_owned();
    let out = weft(&["wg", "add", "alice", "--json", "--control", &ctl]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let added: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(added["address"], "10.127.0.2");
    let config =
        added["config"].as_str().unwrap().replace("Endpoint = 192.0.2.1:51820", "Endpoint = 203.0.113.1:51820");
    let iface = format!("wgp{}", std::process::id() % 100_000);
    let _wg = WgClient::up(&w, &iface, &config, &dir.0);
    for port in [22, 23] {
        listen(&a, port);
        listen(&p, port);
    }
    for port in [7000, 7001] {
        listen(&w, port);
    }

    // What the policy allows, and the answers to it.
    assert!(ping(&w, "10.126.126.2") || ping(&w, "10.126.126.2"), "alice -> A (ping)\nP {}", np.status());
    assert!(connects(&w, "10.126.126.2:22"), "alice -> A:22");
    assert!(connects(&a, "10.127.0.2:7000"), "A -> alice:7000");
    // What it does not, though A has no policy and alice none either: the portal is
    // their boundary. The portal node itself is not reachable from its own clients.
    assert!(!connects(&w, "10.126.126.2:23"), "alice -> A:23");
    assert!(!connects(&w, "10.126.126.1:22"), "alice -> the portal node's own SSH");
    assert!(!ping(&w, "10.126.126.1"), "alice -> the portal node (ping)");
    assert!(!connects(&a, "10.127.0.2:7001"), "A -> alice:7001");
    assert!(!ping(&a, "10.127.0.2"), "A -> alice (ping)");
    assert!(!connects(&p, "10.127.0.2:7000"), "the portal node -> alice:7000 (only A may)");
    let drops = portal_drop(&np, "policy");
    assert!(drops >= 4, "the portal counts what its policy drops: {}", portal_status(&np));
    let st = np.status()["policy"].clone();
    assert!(st["denied"].as_u64().unwrap() >= drops, "{st}");
    let said = weft(&["policy", "explain", "alice", "p:22", "--control", &ctl]);
    let said = String::from_utf8_lossy(&said.stdout).into_owned() + &String::from_utf8_lossy(&said.stderr);
    assert!(said.contains("denied"), "{said}");
    // Still serving what is allowed.
    assert!(connects(&w, "10.126.126.2:22"), "alice -> A:22 after the drops");
    drop(na);
}
