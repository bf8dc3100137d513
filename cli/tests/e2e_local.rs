//! End-to-end, local trust: who may use the control socket for what, how many
//! clients it serves at once, what `weft up` says about a weak secret, and which LAN
//! beacons a node believes. Each node
//! runs alone in a network namespace made here; clients run as `nobody` through
//! `setpriv`, with the groups each case needs.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use netns::{Netns, Node, TempDir, require_root, wait_until, weft_bin};

/// The group that stands for `weft` (socket access) in these tests.
const SOCKET_GID: &str = "100"; // users
/// The group given to `--admin-group`.
const ADMIN_GROUP: &str = "staff";
const ADMIN_GID: &str = "50";

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v =
        vec!["--network-name", "local", "--network-secret", "Zq3-vT8pL2-xWn7-Kd4r-Hm9s", "-i", "10.126.126.1/24"];
    v.extend(["--threads", "1", "-l", "udp://127.0.0.1:11010"]);
    v.extend(extra);
    v
}

/// Runs `weft ARGS` as nobody with the supplementary groups `groups`.
fn as_nobody(groups: &str, argv: &[&str], control: &Path) -> Output {
    Command::new("setpriv")
        .args(["--reuid", "nobody", "--regid", "nogroup", "--groups", groups, "--inh-caps=-all", weft_bin()])
        .args(argv)
        .arg("--control")
        .arg(control)
        .output()
        .expect("setpriv")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn status_is_open_to_the_socket_group_changes_need_root_or_admin() {
    require_root();
    let ns = Netns::new();
    let dir = TempDir::new();
    let node = Node::start(&ns, &dir.0, "a", &args(&["--admin-group", ADMIN_GROUP]));
    // The socket (0660) belongs to the group standing for `weft`, as under systemd.
    let ok = Command::new("chgrp").arg(SOCKET_GID).arg(&node.control).status().unwrap();
    assert!(ok.success());

    // Outside the socket's group: cannot even connect.
    let out = as_nobody("65534", &["status"], &node.control);
    assert!(!out.status.success(), "{}", text(&out));

    // A member of the socket's group reads the status...
    let out = as_nobody(SOCKET_GID, &["status", "--json"], &node.control);
    assert!(out.status.success(), "status as a weft-group member: {}", text(&out));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["overlay"], "10.126.126.1/24");
    // ...but may not change the node, and is told what it takes.
    for argv in [["peer", "add", "udp://127.0.0.1:4001"], ["peer", "remove", "udp://127.0.0.1:4001"]] {
        let out = as_nobody(SOCKET_GID, &argv, &node.control);
        assert!(!out.status.success(), "{argv:?} as a plain member succeeded: {}", text(&out));
        assert!(text(&out).contains("changing the node needs root or the staff group"), "{argv:?}: {}", text(&out));
        assert!(!text(&out).contains("panicked"), "{}", text(&out));
    }
    assert!(node.status()["pending_peers"].as_array().unwrap().is_empty(), "a refused add changed the node");
    assert!(node.log_text().contains("control request refused"), "{}", node.log_text());
    assert!(!node.log_text().contains("WEAK NETWORK SECRET"), "a strong secret was called weak: {}", node.log_text());

    // A member of the admin group may.
    let both = format!("{SOCKET_GID},{ADMIN_GID}");
    let out = as_nobody(&both, &["peer", "add", "udp://127.0.0.1:4001"], &node.control);
    assert!(out.status.success(), "add as an admin-group member: {}", text(&out));
    // So may root.
    let out = Command::new(weft_bin())
        .args(["peer", "add", "udp://127.0.0.1:4002", "--control"])
        .arg(&node.control)
        .output()
        .unwrap();
    assert!(out.status.success(), "add as root: {}", text(&out));
    let pending = node.status()["pending_peers"].as_array().unwrap().len();
    assert_eq!(pending, 2, "{}", node.status());
    let out = as_nobody(&both, &["peer", "remove", "udp://127.0.0.1:4001"], &node.control);
    assert!(out.status.success(), "remove as an admin-group member: {}", text(&out));
}

#[test]
fn control_clients_are_capped_and_cannot_hang_the_node() {
    require_root();
    let ns = Netns::new();
    let dir = TempDir::new();
    let node = Node::start(&ns, &dir.0, "a", &args(&[]));
    let ok = Command::new("chgrp").arg(SOCKET_GID).arg(&node.control).status().unwrap();
    assert!(ok.success());
    let member_status = || as_nobody(SOCKET_GID, &["status", "--json"], &node.control).status.success();
    assert!(member_status());
    // Everything below must happen within the 5 s after which the node cuts silent
    // clients off, however slowly a loaded machine runs it: no fixed sleeps, and the
    // waits end as soon as the node has accepted what the test opened.
    // 32 clients that connect and say nothing hold every slot...
    let idle: Vec<UnixStream> = (0..32).map(|_| UnixStream::connect(&node.control).unwrap()).collect();
    // ...so a plain member's next connection is closed at once instead of waiting (one
    // made before the node accepted all 32 may still be served: try again).
    let start = Instant::now();
    loop {
        let t = Instant::now();
        if !member_status() {
            assert!(t.elapsed() < Duration::from_secs(2), "closed at once, not after {:?}", t.elapsed());
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(3), "status still served beyond the cap");
    }
    // Root still gets in (a reserve of 4 for root and the admin group)...
    assert!(node.try_status().is_some(), "root locked out by idle clients");
    // ...until the reserve is taken too: then even root's connection is closed at once.
    // A probe the node served because it had not yet accepted every held connection
    // holds a slot like them; the next one must be closed.
    let mut held: Vec<UnixStream> = (0..4).map(|_| UnixStream::connect(&node.control).unwrap()).collect();
    let mut buf = [0u8; 16];
    let start = Instant::now();
    loop {
        let mut extra = UnixStream::connect(&node.control).unwrap();
        extra.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        match extra.read(&mut buf) {
            Ok(n) => {
                assert_eq!(n, 0, "closed without a reply");
                break;
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                assert!(held.len() < 8, "over-limit clients are left waiting, not closed");
                held.push(extra);
            }
            Err(e) => panic!("over-limit client: {e}"),
        }
    }
    assert!(start.elapsed() < Duration::from_secs(3), "closed at once, not after {:?}", start.elapsed());
    drop(held);
    // The silent clients are cut off after 5 s, and members are served again.
    let took = wait_until(Duration::from_secs(10), "status after the idle clients time out", member_status);
    assert!(took < Duration::from_secs(8), "{took:?}");
    let mut first = &idle[0];
    assert_eq!(first.read(&mut buf).unwrap(), 0, "an idle client is closed");

    // A request line without an end is cut at 64 KiB.
    let mut long = UnixStream::connect(&node.control).unwrap();
    long.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
    let junk = vec![b'x'; 100 * 1024];
    let _ = std::io::Write::write_all(&mut long, &junk);
    let mut reply = String::new();
    let _ = long.read_to_string(&mut reply);
    assert!(reply.is_empty() || reply.contains("bad request"), "{reply}");
    assert!(node.try_status().is_some());
}

#[test]
fn a_weak_secret_starts_with_a_loud_warning() {
    require_root();
    let ns = Netns::new();
    let dir = TempDir::new();
    let node = Node::start(
        &ns,
        &dir.0,
        "a",
        &[
            "--network-name",
            "local",
            "--network-secret",
            "s3cret",
            "-i",
            "10.126.126.1/24",
            "--threads",
            "1",
            "-l",
            "udp://127.0.0.1:11010",
        ],
    );
    let log = node.log_text();
    assert!(log.contains("WEAK NETWORK SECRET"), "{log}");
    assert!(log.contains("guess it offline"), "{log}");
    assert!(log.contains("weft secret generate"), "{log}");
    assert!(!log.contains("s3cret"), "the secret itself is never logged: {log}");
}

/// Sends `bytes` from a socket bound to `from` inside `ns` to the beacon port of `to`.
fn send_beacon(ns: &Netns, from: &str, to: &str, bytes: &[u8]) {
    let (from, to) = (format!("{from}:0"), format!("{to}:{}", weft::services::discovery::PORT));
    ns.within(|| {
        let s = std::net::UdpSocket::bind(&from).unwrap();
        s.send_to(bytes, &to).unwrap();
    });
}

fn drop_count(node: &Node, reason: &str) -> u64 {
    node.status()["drops"][reason].as_u64().unwrap_or(0)
}

fn pending(node: &Node) -> Vec<String> {
    node.status()["pending_peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["endpoint"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn lan_beacons_without_the_secret_or_replayed_are_dropped_and_counted() {
    use weft::services::discovery::{Beacon, KEY_LABEL, beacon_key, unix_ms};
    require_root();
    let dir = TempDir::new();
    let lan = netns::Lan::new(2);
    let secret = "Zq3-vT8pL2-xWn7-Kd4r-Hm9s";
    let a = Node::start(
        &lan.hosts[0],
        &dir.0,
        "a",
        &[
            "--network-name",
            "beacons",
            "--network-secret",
            secret,
            "-i",
            "10.126.126.1/24",
            "--threads",
            "1",
            "--lan-discovery",
        ],
    );
    // Same network name, wrong secret: its beacons fail the MAC and it is never dialled.
    let _b = Node::start(
        &lan.hosts[1],
        &dir.0,
        "b",
        &[
            "--network-name",
            "beacons",
            "--network-secret",
            "not-the-secret-at-all-9f8e7d",
            "-i",
            "10.126.126.2/24",
            "--threads",
            "1",
            "--lan-discovery",
        ],
    );
    wait_until(Duration::from_secs(15), "a beacon with a bad MAC is counted", || {
        drop_count(&a, "lan_beacon_bad_mac") > 0
    });
    assert!(pending(&a).is_empty(), "a node without the secret was dialled: {}", a.status());
    assert!(a.status()["refused_handshakes"].as_array().unwrap().is_empty());

    // Beacons made with the right key, from host 1.
    let key = beacon_key(&weft_core::handshake::Psk::derive("beacons", secret).subkey(KEY_LABEL));
    let me: std::net::Ipv4Addr = lan.addrs[1].parse().unwrap();
    let beacon = |addr: std::net::Ipv4Addr, port: u16| Beacon {
        network: Beacon::network_hash("beacons"),
        node: [0x42; 8],
        addr,
        port,
    };
    // A minute old: a replay.
    send_beacon(&lan.hosts[1], &lan.addrs[1], &lan.addrs[0], &beacon(me, 11010).seal(&key, unix_ms() - 60_000));
    wait_until(Duration::from_secs(5), "a stale beacon is counted", || drop_count(&a, "lan_beacon_stale") == 1);
    // Fresh, but naming an address it was not sent from.
    let elsewhere = std::net::Ipv4Addr::new(192, 0, 2, 77);
    send_beacon(&lan.hosts[1], &lan.addrs[1], &lan.addrs[0], &beacon(elsewhere, 11010).seal(&key, unix_ms()));
    wait_until(Duration::from_secs(5), "a misplaced beacon is counted", || {
        drop_count(&a, "lan_beacon_wrong_source") == 1
    });
    assert!(pending(&a).is_empty(), "{}", a.status());
    // Fresh and from where it says: dialled (b then refuses the handshake: wrong secret).
    send_beacon(&lan.hosts[1], &lan.addrs[1], &lan.addrs[0], &beacon(me, 11010).seal(&key, unix_ms()));
    let want = format!("udp://{}:11010", lan.addrs[1]);
    wait_until(Duration::from_secs(5), "an authentic beacon is dialled", || pending(&a).contains(&want));
}

#[test]
fn json_logs_are_one_object_per_line() {
    require_root();
    let ns = Netns::new();
    let dir = TempDir::new();
    // From the config file (the flag would win; RUST_LOG=info from the harness sets the level).
    let cfg = dir.0.join("weft.toml");
    std::fs::write(&cfg, "log-format = \"json\"\n").unwrap();
    let node = Node::start(&ns, &dir.0, "a", &args(&["--config", cfg.to_str().unwrap()]));
    let log = node.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string() && v["target"].is_string(), "{l}");
    }
    let start = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["fields"]["message"] == "node starting")
        .expect("the start line");
    assert_eq!(start["fields"]["addr"], "10.126.126.1/24", "{start}");
    assert_eq!(start["level"], "INFO");
}

/// Runs `weft up` as nobody with no XDG_RUNTIME_DIR, HOME or XDG_STATE_HOME (so it falls
/// back to /tmp/weft-65534), in a mount namespace with a /tmp of its own, after `prep`
/// (shell, run as root there) set that /tmp up. Returns its output (it must exit). The
/// binary is opened before the mount, which hides it when the tree is under /tmp.
fn up_in_private_tmp(prep: &str, ns: &Netns) -> Output {
    let script = format!(
        "exec 3<\"$0\" && mount -t tmpfs none /tmp && mkdir /tmp/bin && cat <&3 >/tmp/bin/weft && exec 3<&- && chmod 755 /tmp/bin /tmp/bin/weft && \
         {prep} && exec timeout 5 setpriv --reuid 65534 --regid 65534 --clear-groups --inh-caps=-all \
         env -u XDG_RUNTIME_DIR -u HOME -u XDG_STATE_HOME -u WEFT_CONTROL /tmp/bin/weft up --no-tun \
         --network-name local --network-secret Zq3-vT8pL2-xWn7-Kd4r-Hm9s -i 10.126.126.1/24 \
         -l udp://127.0.0.1:11010 --threads 1"
    );
    ns.cmd("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script, weft_bin()]).output().unwrap()
}

#[test]
fn a_non_root_node_refuses_a_fallback_runtime_dir_it_does_not_own() {
    require_root();
    let ns = Netns::new();
    ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
    // Another user (root here) created the name first: refused, and nothing is bound.
    let taken = up_in_private_tmp("mkdir -m 1777 /tmp/weft-65534", &ns);
    assert_eq!(taken.status.code(), Some(1), "{}", text(&taken));
    assert!(text(&taken).contains("/tmp/weft-65534 belongs to uid 0"), "{}", text(&taken));
    // Its own but open to others: refused too.
    let open = up_in_private_tmp("mkdir -m 755 /tmp/weft-65534 && chown 65534 /tmp/weft-65534", &ns);
    assert_eq!(open.status.code(), Some(1), "{}", text(&open));
    assert!(text(&open).contains("open to other users"), "{}", text(&open));
    // Made by the node itself: 0700, and the node runs (until `timeout` stops it).
    let fresh = up_in_private_tmp("true", &ns);
    assert_eq!(fresh.status.code(), Some(124), "the node did not run: {}", text(&fresh));
}
