//! End-to-end: real `weft` processes and TUN devices in network namespaces.
//!
//! Two nodes on a LAN: ping both ways, a 64 MiB checksummed TCP transfer per cipher
//! (with TUN offload on and off, and under constant rekeying), a wrong-secret node that
//! gets nothing through, a cipher mismatch reported on both sides, a restarted node that
//! comes back, and garbage at the listener that is dropped and counted.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::net::UdpSocket;
use std::time::Duration;

use netns::{Lan, Node, TempDir, ping, ping_times, require_root, transfer, tun_reads_without_waiting, wait_until};

const NET: [&str; 4] = ["--network-name", "e2e", "--network-secret", "correct horse"];
const A_IP: &str = "10.126.126.1";
const B_IP: &str = "10.126.126.2";

fn node_args<'a>(ip: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", ip, "--threads", "2"]);
    v.extend(extra);
    v
}

/// Two nodes: A listens, B dials A. Returns once both see each other established.
fn pair(lan: &Lan, dir: &TempDir, a_extra: &[&str], b_extra: &[&str]) -> (Node, Node) {
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", a_extra));
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let mut b_args = node_args("10.126.126.2/24", b_extra);
    b_args.extend(["-p", &peer]);
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &b_args);
    wait_until(Duration::from_secs(10), "session A<->B", || a.peer_established(B_IP) && b.peer_established(A_IP));
    (a, b)
}

fn ping_both_ways(lan: &Lan) {
    assert!(ping(&lan.hosts[0], B_IP), "A -> B ping");
    assert!(ping(&lan.hosts[1], A_IP), "B -> A ping");
}

fn check_transfer(lan: &Lan, label: &str) {
    let (sent, got, took) = transfer(&lan.hosts[0], &lan.hosts[1], B_IP, 64 << 20);
    assert_eq!(sent, got, "{label}: SHA-256 of the 64 MiB transfer differs");
    eprintln!("{label}: 64 MiB in {took:?} ({:.0} Mbit/s)", 64.0 * 8.0 * 1.048_576 / took.as_secs_f64());
}

#[test]
fn ping_and_transfer_aes_128_gcm() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let (a, b) = pair(&lan, &dir, &[], &[]);
    ping_both_ways(&lan);
    check_transfer(&lan, "aes-128-gcm");
    let s = b.status();
    assert_eq!(s["cipher"], "aes-128-gcm");
    let p = b.peer(A_IP).unwrap();
    assert!(p["rx_bytes"].as_u64().unwrap() > 64 << 20, "B's rx counter: {p}");
    assert_eq!(p["node_id"], a.status()["node_id"]);
    let p = a.peer(B_IP).unwrap();
    assert!(p["tx_bytes"].as_u64().unwrap() > 64 << 20, "A's tx counter: {p}");
}

#[test]
fn ping_and_transfer_chacha20_poly1305_while_rekeying() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let rekey = ["--cipher", "chacha20-poly1305", "--rekey-after", "1"];
    let (_a, b) = pair(&lan, &dir, &rekey, &rekey);
    ping_both_ways(&lan);
    let before = b.peer(A_IP).unwrap()["last_handshake_secs"].clone();
    check_transfer(&lan, "chacha20-poly1305 rekeying every second");
    std::thread::sleep(Duration::from_millis(1500));
    let p = b.peer(A_IP).unwrap();
    assert!(p["last_handshake_secs"].as_u64().unwrap() <= 2, "rekeys happened: {p} (before {before})");
    assert_eq!(p["state"], "established");
}

#[test]
fn ping_and_transfer_authenticated_none() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let (_a, _b) = pair(&lan, &dir, &["--cipher", "none"], &["--cipher", "none"]);
    ping_both_ways(&lan);
    check_transfer(&lan, "none");
}

#[test]
fn ping_and_transfer_without_offload() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let (a, _b) = pair(&lan, &dir, &["--no-offload"], &["--no-offload"]);
    assert_eq!(a.status()["offloads"]["tun"], false);
    ping_both_ways(&lan);
    check_transfer(&lan, "aes-128-gcm, offload off");
}

#[test]
fn wrong_secret_gets_nothing_through() {
    require_root();
    let (lan, dir) = (Lan::new(3), TempDir::new());
    let (a, b) = pair(&lan, &dir, &[], &[]);
    let peer_a = format!("udp://{}:11010", lan.addrs[0]);
    let peer_b = format!("udp://{}:11010", lan.addrs[1]);
    let c = Node::start(
        &lan.hosts[2],
        &dir.0,
        "c",
        &["--network-name", "e2e", "--network-secret", "wrong", "-i", "10.126.126.3/24", "-p", &peer_a, "-p", &peer_b],
    );
    // A and B drop C's handshakes before any Diffie-Hellman (their MAC is not keyed by
    // the network's PSK): counted, not answered, no status row for an outsider.
    wait_until(Duration::from_secs(10), "A drops C's handshakes", || {
        a.status()["drops"]["handshake_mac"].as_u64().is_some_and(|n| n > 0)
    });
    for target in [A_IP, B_IP] {
        assert!(!ping(&lan.hosts[2], target), "C reached {target} with the wrong secret");
    }
    assert!(!ping(&lan.hosts[0], "10.126.126.3"), "A reached C");
    for n in [&a, &b] {
        let st = n.status();
        assert_eq!(st["refused_handshakes"], serde_json::json!([]), "an outsider left a status row: {st}");
    }
    let cs = c.status();
    assert!(cs["peers"].as_array().unwrap().is_empty(), "C has peers: {cs}");
    let pending = cs["pending_peers"].as_array().unwrap();
    assert_eq!(pending.len(), 2);
    for p in pending {
        assert!(p["error"].as_str().unwrap_or("").contains("secret"), "C's status says why: {p}");
    }
    for n in [&a, &b] {
        assert!(n.peer("10.126.126.3").is_none(), "C became a peer");
    }
    ping_both_ways(&lan);
}

#[test]
fn cipher_mismatch_is_reported_on_both_sides() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", &[]));
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let b = Node::start(
        &lan.hosts[1],
        &dir.0,
        "b",
        &node_args("10.126.126.2/24", &["--cipher", "chacha20-poly1305", "-p", &peer]),
    );
    // Neither side lets the other in; A (responder) lists a refused handshake, B
    // (initiator) a failed dial, and both name the two ciphers.
    let refused = || a.status()["refused_handshakes"][0]["reason"].as_str().unwrap_or("").to_owned();
    let pending = || b.status()["pending_peers"][0]["error"].as_str().unwrap_or("").to_owned();
    wait_until(Duration::from_secs(10), "mismatch on both sides", || {
        refused().contains("cipher mismatch") && pending().contains("cipher mismatch")
    });
    for text in [refused(), pending()] {
        assert!(text.contains("aes-128-gcm") && text.contains("chacha20-poly1305"), "{text}");
    }
    assert!(a.peer(B_IP).is_none() && b.peer(A_IP).is_none());
    assert!(!ping(&lan.hosts[1], A_IP));
}

#[test]
fn restarted_node_comes_back_without_touching_the_other() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    // A dials B this time, so B (restarted) is the passive side and A must notice.
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &node_args("10.126.126.2/24", &[]));
    let peer = format!("udp://{}:11010", lan.addrs[1]);
    let mut a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", &["-p", &peer]));
    wait_until(Duration::from_secs(10), "session", || a.peer_established(B_IP));
    let mut b = b;
    let a_pid = a.pid();
    let b_id = b.status()["node_id"].clone();
    b.stop();
    std::thread::sleep(Duration::from_secs(1));
    b.restart();
    assert_eq!(b.status()["node_id"], b_id, "same key, same node id after restart");
    let took = wait_until(Duration::from_secs(10), "A reaches restarted B", || ping(&lan.hosts[0], B_IP));
    eprintln!("restarted node reachable again after {took:?}");
    assert!(a.is_running() && a.pid() == a_pid, "A was not touched");
    wait_until(Duration::from_secs(5), "B sees A", || b.peer_established(A_IP));
}

/// Parses a pcap file (Ethernet link type) and returns the UDP payloads in it.
fn pcap_udp_payloads(data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let le = data[..4] == [0xd4, 0xc3, 0xb2, 0xa1] || data[..4] == [0x4d, 0x3c, 0xb2, 0xa1];
    let u32at = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if le { u32::from_le_bytes(a) } else { u32::from_be_bytes(a) }
    };
    let mut off = 24;
    while off + 16 <= data.len() {
        let incl = u32at(&data[off + 8..]) as usize;
        let frame = &data[off + 16..(off + 16 + incl).min(data.len())];
        off += 16 + incl;
        if frame.len() < 14 + 20 + 8 || frame[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &frame[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ip[9] != 17 || ip.len() < ihl + 8 {
            continue;
        }
        out.push(ip[ihl + 8..].to_vec());
    }
    out
}

#[test]
fn garbage_at_the_listener_is_dropped_and_counted() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let (a, _b) = pair(&lan, &dir, &[], &[]);
    // Capture real sealed packets from B to A, to replay and tamper with.
    let pcap = dir.0.join("b.pcap");
    let filter = format!("udp and dst host {} and dst port 11010", lan.addrs[0]);
    let mut dump = lan.hosts[1].capture("eth0", &filter, &pcap, Some(10));
    lan.hosts[1].exec_ok(&["ping", "-c", "10", "-i", "0.05", A_IP]);
    wait_until(Duration::from_secs(10), "capture", || matches!(dump.try_wait(), Ok(Some(_))));
    let captured: Vec<Vec<u8>> = pcap_udp_payloads(&std::fs::read(&pcap).unwrap())
        .into_iter()
        .filter(|p| p.first() == Some(&4) && p.len() > 32)
        .collect();
    assert!(captured.len() >= 5, "captured {} data packets", captured.len());

    let target = format!("{}:11010", lan.addrs[0]);
    lan.hosts[1].within(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for p in &captured {
            s.send_to(p, &target).unwrap(); // replay
            let mut t = p.clone();
            t[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes()); // fresh counter, bad tag
            s.send_to(&t, &target).unwrap();
            s.send_to(&p[..10], &target).unwrap(); // truncated
        }
        for i in 0..2000 {
            let len = (rnd() % 1500) as usize;
            let mut g: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            if i % 2 == 0 && !g.is_empty() {
                g[0] = 4; // data type with a random session index
            }
            s.send_to(&g, &target).unwrap();
        }
        let big = vec![4u8; 9000];
        s.send_to(&big, &target).unwrap();
    });
    let drops = |k: &str| a.status()["drops"][k].as_u64().unwrap_or(0);
    wait_until(Duration::from_secs(5), "drop counters", || {
        drops("replay") >= 5 && drops("auth_failed") >= 5 && drops("malformed") >= 5 && drops("unknown_session") >= 100
    });
    eprintln!("drops after garbage: {}", a.status()["drops"]);
    ping_both_ways(&lan);
    check_transfer(&lan, "after garbage");
}

/// `weft peer add|remove` on a running node: the added peer comes up and carries
/// traffic; bad requests exit 2 with the node's reason; a removed peer's sessions close.
#[test]
fn peers_added_and_removed_at_run_time() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &node_args("10.126.126.1/24", &[]));
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &node_args("10.126.126.2/24", &[]));
    let uri = format!("udp://{}:11010", lan.addrs[1]);
    let peer = |verb: &str, what: &str| {
        std::process::Command::new(netns::weft_bin())
            .args(["peer", verb, what, "--control"])
            .arg(&a.control)
            .output()
            .unwrap()
    };
    let out = peer("add", &uri);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until(Duration::from_secs(10), "added peer", || a.peer_established(B_IP) && b.peer_established(A_IP));
    assert!(ping(&lan.hosts[0], B_IP));

    for (verb, what, says) in [
        ("add", uri.as_str(), "already a configured peer"),
        ("add", "udp://10.0.0.1", "missing :PORT"),
        ("add", "gopher://10.0.0.1:70", "unknown scheme"),
        ("remove", "udp://192.0.2.9:11010", "not a configured peer"),
        ("remove", "0123456789abcdef", "no peer with node id"),
    ] {
        let out = peer(verb, what);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "weft peer {verb} {what}: {err}");
        assert!(err.contains(says), "weft peer {verb} {what}: {err}");
    }

    let out = peer("remove", &uri);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("closed the sessions"));
    let st = a.status();
    assert!(st["routes"].as_array().unwrap().iter().all(|r| r["overlay"] != B_IP || r["session"] == false));
    assert!(st["pending_peers"].as_array().unwrap().is_empty(), "the dial is gone: {st}");
}

#[test]
fn pings_are_answered_while_a_bulk_transfer_runs() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let (a, b) = pair(&lan, &dir, &[], &[]);
    // The data path runs at a raised priority (every thread inherits it).
    for n in [&a, &b] {
        let task = std::fs::read_dir(format!("/proc/{}/task", n.pid())).unwrap();
        for t in task {
            let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap();
            let nice: i32 = stat.rsplit(')').next().unwrap().split_whitespace().nth(16).unwrap().parse().unwrap();
            assert_eq!(nice, -10, "a thread of weft runs at nice {nice}: {stat}");
        }
    }
    // Idle, an echo reply leaves from the receive thread that wrote the request: it is
    // in the TUN queue when the write returns (unless the TX thread, woken by it, reads
    // it first: of 20, some).
    assert_eq!(ping_times(&lan.hosts[0], B_IP, 20).len(), 20);
    let answers = |n: &Node| -> u64 {
        n.status()["pipelines"].as_array().unwrap().iter().map(|p| p["tx_answers"].as_u64().unwrap()).sum()
    };
    if tun_reads_without_waiting() {
        assert!(answers(&b) > 0, "no echo reply was sent by a receive thread");
    } else {
        assert_eq!(answers(&b), 0, "this kernel's TUN cannot be read without waiting");
    }
    // Downloads A -> B back to back while B's pings go the same way through A's queues.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (times, transfers) = std::thread::scope(|s| {
        let bulk = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (sent, got, _) = transfer(&lan.hosts[0], &lan.hosts[1], B_IP, 64 << 20);
                assert_eq!(sent, got, "the download arrived damaged");
                n += 1;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(300));
        let times = ping_times(&lan.hosts[0], B_IP, 60);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (times, bulk.join().unwrap())
    });
    assert!(transfers >= 1);
    assert_eq!(times.len(), 60, "every ping beside the download is answered: {times:?}");
    // Over UDP the pings reach B on another pipeline than the download (flagged sparse
    // by A, steered by B's reuseport program): they never queue behind it.
    let st = b.status();
    let pipes: Vec<(u64, u64)> = st["pipelines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["links"] != true)
        .map(|p| (p["rx_bytes"].as_u64().unwrap(), p["rx_packets"].as_u64().unwrap()))
        .collect();
    let bulk = (0..pipes.len()).max_by_key(|&i| pipes[i].0).unwrap();
    assert!(
        pipes.iter().enumerate().any(|(i, p)| i != bulk && p.1 >= 60),
        "the pings arrived on the download's pipeline: {pipes:?}"
    );
    let mut sorted = times;
    sorted.sort_by(f64::total_cmp);
    eprintln!(
        "beside {transfers} x 64 MiB: ping p50 {:.2} ms, max {:.2} ms; B's drops {}",
        sorted[30],
        sorted[59],
        b.status()["drops"]
    );
}
