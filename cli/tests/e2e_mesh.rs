//! End-to-end mesh tests in network namespaces: relaying through a member that cannot
//! read the traffic, NAT hole punching to a direct path, and rerouting around a dead
//! relay.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::net::UdpSocket;
use std::time::Duration;

use netns::{Netns, Node, TempDir, ip, link, ping, ping_times, require_root, transfer, wait_until};

const NET: [&str; 4] = ["--network-name", "mesh", "--network-secret", "mesh secret"];

fn args<'a>(overlay: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    args_threads(overlay, "1", extra)
}

fn args_threads<'a>(overlay: &'a str, threads: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", overlay, "--threads", threads]);
    v.extend(extra);
    v
}

/// A -- B -- C: A and C share no link and no route; only B can relay between them.
fn chain() -> (Netns, Netns, Netns) {
    let (a, b, c) = (Netns::new(), Netns::new(), Netns::new());
    link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24");
    link(&b, "eth1", "198.51.100.2/24", &c, "eth0", "198.51.100.3/24");
    (a, b, c)
}

fn peer_path(n: &Node, overlay: &str) -> String {
    n.peer(overlay).map(|p| p["path"].as_str().unwrap_or("").to_owned()).unwrap_or_default()
}

fn via_host(n: &Node, overlay: &str) -> Option<String> {
    n.peer(overlay).and_then(|p| p["via"].as_str().map(str::to_owned))
}

#[test]
fn chain_relays_sealed_traffic_it_cannot_read() {
    require_root();
    let dir = TempDir::new();
    let (a, b, c) = chain();
    let nb = Node::start(&b, &dir.0, "b", &args("10.126.126.2/24", &[]));
    let na = Node::start(&a, &dir.0, "a", &args("10.126.126.1/24", &["-p", "udp://192.0.2.2:11010"]));
    let nc = Node::start(&c, &dir.0, "c", &args("10.126.126.3/24", &["-p", "udp://198.51.100.2:11010"]));
    wait_until(Duration::from_secs(15), "A and C learn each other through B", || {
        na.routes_to("10.126.126.3") && nc.routes_to("10.126.126.1")
    });
    // Members without traffic hold no session: the first packet makes one, and is
    // answered (held while the handshake runs, not dropped).
    assert_eq!(na.peer("10.126.126.3").unwrap()["state"], "idle");
    let first = a.cmd("ping").args(["-c", "1", "-W", "3", "10.126.126.3"]).output().unwrap();
    assert!(
        first.status.success(),
        "the first packet to an idle member was lost: {}\nA {}\nC {}",
        String::from_utf8_lossy(&first.stdout),
        na.status(),
        nc.status()
    );
    eprintln!(
        "first packet to an idle member: {}",
        String::from_utf8_lossy(&first.stdout).lines().nth(1).unwrap_or("")
    );
    assert!(ping(&a, "10.126.126.3"), "A -> C through B");
    assert!(ping(&c, "10.126.126.1"), "C -> A through B");
    assert!(na.peer_established("10.126.126.3") && nc.peer_established("10.126.126.1"));
    assert_eq!(peer_path(&na, "10.126.126.3"), "relay");
    assert_eq!(via_host(&na, "10.126.126.3"), Some(nb.status()["node_id"].as_str().unwrap().to_owned()));
    let routes = na.status()["routes"].as_array().unwrap().clone();
    let to_c = routes.iter().find(|r| r["overlay"] == "10.126.126.3").expect("route to C");
    assert_eq!(to_c["hops"], 2);

    // A known plaintext marker from A to C must not appear on B's wire.
    let marker = b"WEFT-PLAINTEXT-MARKER-7f3a9c";
    let pcap = dir.0.join("b.pcap");
    let dump = b.capture("eth1", "udp", &pcap, None);
    let got = c.within(|| {
        let rx = UdpSocket::bind("10.126.126.3:7777").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        a.within(|| {
            let tx = UdpSocket::bind("10.126.126.1:0").unwrap();
            for _ in 0..20 {
                tx.send_to(marker, "10.126.126.3:7777").unwrap();
            }
        });
        let mut buf = [0u8; 64];
        let (n, _) = rx.recv_from(&mut buf).unwrap();
        let first = buf[..n].to_vec();
        // The rest of the burst, so that every marker has crossed B before the capture
        // stops (stopping at the first lost the others to the race).
        rx.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut more = 0;
        while more < 19 && rx.recv_from(&mut buf).is_ok() {
            more += 1;
        }
        first
    });
    assert_eq!(got, marker, "C received the marker");
    // tcpdump writes each packet as it reads it (-U): wait for the burst's records
    // to be in the file before stopping it.
    let enough = 24 + 20 * 40;
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) <= enough && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    netns::stop_capture(dump);
    let captured = std::fs::read(&pcap).unwrap();
    assert!(captured.len() > enough as usize, "the capture saw the relayed packets ({} bytes)", captured.len());
    assert!(!captured.windows(marker.len()).any(|w| w == marker), "plaintext marker visible on the relay's link");
    assert!(nb.peer("10.126.126.1").is_some() && nb.peer("10.126.126.3").is_some());

    // Bulk data through the relay, both ways, arrives whole (scripts/test.sh runs this
    // again with every offload off: per-segment frames instead of GSO batches).
    for (from, to, ip) in [(&a, &c, "10.126.126.3"), (&c, &a, "10.126.126.1")] {
        let (sent, got, took) = transfer(from, to, ip, 32 << 20);
        assert_eq!(sent, got, "SHA-256 of the 32 MiB relayed transfer to {ip} differs");
        eprintln!("32 MiB relayed over UDP hops to {ip}: {:.0} Mbit/s", 32.0 * 8.0 * 1.048_576 / took.as_secs_f64());
    }
    assert_eq!(peer_path(&na, "10.126.126.3"), "relay", "the transfer went through B");
}

/// A home-router namespace: masquerade out of `wan`, and a stateful firewall that drops
/// unsolicited inbound packets (so they leave no conntrack entry behind that would
/// make the NAT pick a new port for the punch, as a bare masquerade does).
fn nat_router(r: &Netns) {
    r.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let rules = concat!(
        "table ip nat {\n chain post {\n  type nat hook postrouting priority 100;\n  oifname \"wan\" masquerade\n }\n}\n",
        "table inet filter {\n chain input {\n  type filter hook input priority 0;\n  iifname \"wan\" ct state new drop\n }\n",
        " chain forward {\n  type filter hook forward priority 0;\n  iifname \"wan\" ct state new drop\n }\n}\n"
    );
    let path = std::env::temp_dir().join(format!("weft-nat-{}-{}.nft", std::process::id(), r.name));
    std::fs::write(&path, rules).unwrap();
    r.exec_ok(&["nft", "-f", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(path);
}

#[test]
fn nodes_behind_nat_punch_through_to_a_direct_path() {
    require_root();
    let dir = TempDir::new();
    // Public side: a bridge in a switch namespace with B, and the two routers' WANs.
    let sw = Netns::new();
    sw.exec_ok(&["ip", "link", "add", "br0", "type", "bridge"]);
    sw.exec_ok(&["ip", "link", "set", "br0", "up"]);
    let (b, ra, rc, a, c) = (Netns::new(), Netns::new(), Netns::new(), Netns::new(), Netns::new());
    for (ns, ifname, addr, port) in [
        (&b, "eth0", "203.0.113.2/24", "pb"),
        (&ra, "wan", "203.0.113.1/24", "pa"),
        (&rc, "wan", "203.0.113.3/24", "pc"),
    ] {
        ip(&["link", "add", ifname, "netns", &ns.name, "type", "veth", "peer", "name", port, "netns", &sw.name]);
        sw.exec_ok(&["ip", "link", "set", port, "master", "br0"]);
        sw.exec_ok(&["ip", "link", "set", port, "up"]);
        ns.exec_ok(&["ip", "addr", "add", addr, "dev", ifname]);
        ns.exec_ok(&["ip", "link", "set", ifname, "up"]);
    }
    link(&ra, "lan", "10.1.0.1/24", &a, "eth0", "10.1.0.2/24");
    link(&rc, "lan", "10.2.0.1/24", &c, "eth0", "10.2.0.2/24");
    a.exec_ok(&["ip", "route", "add", "default", "via", "10.1.0.1"]);
    c.exec_ok(&["ip", "route", "add", "default", "via", "10.2.0.1"]);
    nat_router(&ra);
    nat_router(&rc);

    let nb = Node::start(&b, &dir.0, "b", &args("10.126.126.2/24", &[]));
    let na = Node::start(&a, &dir.0, "a", &args("10.126.126.1/24", &["-p", "udp://203.0.113.2:11010"]));
    let nc = Node::start(&c, &dir.0, "c", &args("10.126.126.3/24", &["-p", "udp://203.0.113.2:11010"]));
    wait_until(Duration::from_secs(15), "A and C meet through B", || {
        na.routes_to("10.126.126.3") && nc.routes_to("10.126.126.1")
    });
    assert!(ping(&a, "10.126.126.3"), "A -> C works at once, relayed if need be");
    // A TCP connection opened while the path is relayed survives the move to direct:
    // half the data goes before the switch, half after, and all of it arrives in order.
    let (go_on_tx, go_on_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let chunk: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + i / 251) as u8).collect();
    let took = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            c.within(|| {
                let l = std::net::TcpListener::bind("10.126.126.3:5002").unwrap();
                ready_tx.send(()).unwrap();
                let (mut conn, _) = l.accept().unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let mut got = Vec::new();
                std::io::Read::read_to_end(&mut conn, &mut got).unwrap();
                got
            })
        });
        ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let (a_ns, data) = (&a, &chunk);
        let tx = s.spawn(move || {
            a_ns.within(move || {
                let mut conn = std::net::TcpStream::connect("10.126.126.3:5002").unwrap();
                std::io::Write::write_all(&mut conn, data).unwrap();
                go_on_rx.recv_timeout(Duration::from_secs(60)).unwrap();
                std::io::Write::write_all(&mut conn, data).unwrap();
            })
        });
        let took = wait_until(Duration::from_secs(30), "A and C go direct", || {
            peer_path(&na, "10.126.126.3") == "direct" && peer_path(&nc, "10.126.126.1") == "direct"
        });
        go_on_tx.send(()).unwrap();
        tx.join().unwrap();
        let got = rx.join().unwrap();
        assert_eq!(got.len(), 2 * chunk.len(), "bytes across the relayed-to-direct switch");
        assert!(got[..chunk.len()] == chunk[..] && got[chunk.len()..] == chunk[..], "data intact across the switch");
        took
    });
    eprintln!("direct path after {took:?}");
    // The direct endpoint A uses for C is C's router, not B.
    let ep = na.peer("10.126.126.3").unwrap()["endpoint"].as_str().unwrap().to_owned();
    assert!(ep.starts_with("udp://203.0.113.3:"), "A reaches C at its NAT's public address, got {ep}");

    // Traffic between A and C no longer crosses B.
    let b_packets = || {
        let out = b.exec_ok(&["cat", "/sys/class/net/eth0/statistics/rx_packets"]);
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap()
    };
    let before = b_packets();
    a.exec_ok(&["ping", "-c", "200", "-i", "0.01", "-q", "10.126.126.3"]);
    let crossed = b_packets() - before;
    // Relayed, each of A's 200 echo requests would cross B's link from A. What stays is
    // the A-B link's own traffic, busy for a while after it relayed: keepalives, loss
    // probes every 500 ms, path MTU confirmations (with a GSO batch every fourth);
    // 30-70 packets, more when CI's load stretches the 2 s of pings.
    assert!(crossed < 100, "{crossed} packets crossed B during 200 pings (keepalives and probes only)");

    // The direct path dies (A's router starts dropping everything for C's router):
    // traffic falls back to the relay through B.
    ra.exec_ok(&["nft", "add", "table", "ip", "cut"]);
    ra.exec_ok(&["nft", "add", "chain", "ip", "cut", "blk", "{ type filter hook forward priority -10; }"]);
    ra.exec_ok(&["nft", "add", "rule", "ip", "cut", "blk", "ip", "daddr", "203.0.113.3", "drop"]);
    ra.exec_ok(&["nft", "add", "rule", "ip", "cut", "blk", "ip", "saddr", "203.0.113.3", "drop"]);
    let back = || peer_path(&na, "10.126.126.3") == "relay" && ping(&a, "10.126.126.3");
    let start = std::time::Instant::now();
    while !back() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(back(), "no fallback: A {}\nC {}\n{}", na.status()["peers"], nc.status()["peers"], na.log_text());
    let took = start.elapsed();
    eprintln!("fell back to the relay after {took:?}");
    drop(nb);
}

/// A ping relayed beside a relayed download: on the relay and on the destination the
/// reuseport program steers relayed data by its node ids and the sender's sparse flag,
/// so the ping and its reply are read by another pipeline than the download's.
#[test]
fn a_relayed_ping_skips_a_relayed_download() {
    require_root();
    let dir = TempDir::new();
    let (a, b, c) = chain();
    let nb = Node::start(&b, &dir.0, "b", &args_threads("10.126.126.2/24", "2", &[]));
    let _na = Node::start(&a, &dir.0, "a", &args_threads("10.126.126.1/24", "2", &["-p", "udp://192.0.2.2:11010"]));
    let nc = Node::start(&c, &dir.0, "c", &args_threads("10.126.126.3/24", "2", &["-p", "udp://198.51.100.2:11010"]));
    wait_until(Duration::from_secs(15), "A reaches C through B", || ping(&a, "10.126.126.3"));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (times, transfers) = std::thread::scope(|s| {
        let bulk = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (sent, got, _) = transfer(&a, &c, "10.126.126.3", 32 << 20);
                assert_eq!(sent, got, "the relayed download arrived damaged");
                n += 1;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(300));
        let times = ping_times(&a, "10.126.126.3", 60);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (times, bulk.join().unwrap())
    });
    assert!(transfers >= 1);
    assert_eq!(times.len(), 60, "every relayed ping beside the download is answered: {times:?}");
    let pipes = |n: &Node, key: &str| -> Vec<u64> {
        n.status()["pipelines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["links"] != true)
            .map(|p| p[key].as_u64().unwrap())
            .collect()
    };
    // B relayed the pings and their replies on another pipeline than the download's
    // data and ACKs: it steers relayed frames by their two node ids, the same both
    // ways, and the sparse ones to the socket after.
    let forwarded = pipes(&nb, "forwarded");
    let bulk = (0..forwarded.len()).max_by_key(|&i| forwarded[i]).unwrap();
    assert!(
        forwarded.iter().enumerate().any(|(i, &f)| i != bulk && f >= 2 * 60),
        "B relayed the pings beside the download's frames: {forwarded:?}"
    );
    // C read the pings on another pipeline than the download: every frame from B
    // comes from one address and port, so the kernel's hash alone would put them all
    // on one socket.
    let (bytes, packets) = (pipes(&nc, "rx_bytes"), pipes(&nc, "rx_packets"));
    let bulk = (0..bytes.len()).max_by_key(|&i| bytes[i]).unwrap();
    assert!(
        packets.iter().enumerate().any(|(i, &p)| i != bulk && p >= 60),
        "the relayed pings arrived on the download's pipeline: bytes {bytes:?} packets {packets:?}"
    );
    let mut sorted = times;
    sorted.sort_by(f64::total_cmp);
    eprintln!("relayed, beside {transfers} x 32 MiB: ping p50 {:.2} ms, max {:.2} ms", sorted[30], sorted[59]);
}

#[test]
fn a_member_that_dropped_a_relayed_session_renews_it_when_data_arrives_on_it() {
    require_root();
    let dir = TempDir::new();
    let (a, b, c) = chain();
    let _nb = Node::start(&b, &dir.0, "b", &args("10.126.126.2/24", &[]));
    let na = Node::start(&a, &dir.0, "a", &args("10.126.126.1/24", &["-p", "udp://192.0.2.2:11010"]));
    let nc = Node::start(&c, &dir.0, "c", &args("10.126.126.3/24", &["-p", "udp://198.51.100.2:11010"]));
    wait_until(Duration::from_secs(15), "A reaches C through B", || ping(&a, "10.126.126.3"));
    // Everything relayed to C is lost (relay frames start with message type 6; C's
    // link with B carries none): C's pings to A go unanswered, and C declares A dead
    // and drops the session, while A, which sent no data since, keeps it.
    for rule in [
        "add table ip weftlose",
        "add chain ip weftlose input { type filter hook input priority 0; }",
        "add rule ip weftlose input udp dport 11010 @th,64,8 6 drop",
    ] {
        assert!(c.cmd("nft").arg(rule).status().unwrap().success(), "nft {rule}");
    }
    assert!(!c.exec_status(&["ping", "-c", "2", "-i", "0.5", "-W", "1", "10.126.126.1"]));
    wait_until(Duration::from_secs(20), "C declares A dead", || !nc.peer_established("10.126.126.1"));
    assert!(na.peer_established("10.126.126.3"), "A dropped the session too: {}", na.status());
    assert!(c.cmd("nft").arg("delete table ip weftlose").status().unwrap().success());

    // A sends on the session C dropped: C renews it at once, rather than dropping
    // A's data until A's own timer notices that nothing comes back.
    let times = ping_times(&a, "10.126.126.3", 40);
    eprintln!("after C dropped the session: {} of 40 pings 50 ms apart answered", times.len());
    assert!(times.len() >= 30, "A's pings were lost on the session C dropped: {} of 40 answered", times.len());
    assert!(nc.status()["stale_renewed"].as_u64().unwrap() >= 1, "{}", nc.status());
    assert!(!na.log_text().contains("not responding"), "A waited for its timer:\n{}", na.log_text());
}

#[test]
fn dead_relay_is_routed_around() {
    require_root();
    let dir = TempDir::new();
    // A and C share no link; B and D each connect both.
    let (a, b, c, d) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
    link(&a, "a2b", "192.0.2.1/30", &b, "b2a", "192.0.2.2/30");
    link(&b, "b2c", "192.0.2.5/30", &c, "c2b", "192.0.2.6/30");
    link(&a, "a2d", "192.0.2.9/30", &d, "d2a", "192.0.2.10/30");
    link(&d, "d2c", "192.0.2.13/30", &c, "c2d", "192.0.2.14/30");
    let mut nb = Node::start(&b, &dir.0, "b", &args("10.126.126.2/24", &[]));
    let mut nd = Node::start(&d, &dir.0, "d", &args("10.126.126.4/24", &[]));
    let na = Node::start(
        &a,
        &dir.0,
        "a",
        &args("10.126.126.1/24", &["-p", "udp://192.0.2.2:11010", "-p", "udp://192.0.2.10:11010"]),
    );
    let _nc = Node::start(
        &c,
        &dir.0,
        "c",
        &args("10.126.126.3/24", &["-p", "udp://192.0.2.5:11010", "-p", "udp://192.0.2.13:11010"]),
    );
    wait_until(Duration::from_secs(15), "A and C through a relay", || {
        na.routes_to("10.126.126.3") && ping(&a, "10.126.126.3")
    });
    let via = via_host(&na, "10.126.126.3").expect("relayed");
    let b_id = nb.status()["node_id"].as_str().unwrap().to_owned();
    let d_id = nd.status()["node_id"].as_str().unwrap().to_owned();
    let other = if via == b_id {
        nb.stop();
        d_id
    } else {
        assert_eq!(via, d_id);
        nd.stop();
        b_id
    };
    let took = wait_until(Duration::from_secs(15), "A reaches C around the dead relay", || ping(&a, "10.126.126.3"));
    eprintln!("rerouted after {took:?}");
    wait_until(Duration::from_secs(5), "status shows the other relay", || {
        via_host(&na, "10.126.126.3").as_deref() == Some(other.as_str())
    });
    assert!(ping(&c, "10.126.126.1"));
}

#[test]
fn proxy_network_reaches_a_lan_host_behind_a_node() {
    require_root();
    let dir = TempDir::new();
    let (a, p, h) = (Netns::new(), Netns::new(), Netns::new());
    link(&a, "eth0", "192.0.2.1/24", &p, "eth0", "192.0.2.2/24");
    link(&p, "lan", "172.16.5.1/24", &h, "eth0", "172.16.5.2/24");
    h.exec_ok(&["ip", "route", "add", "default", "via", "172.16.5.1"]);
    let np = Node::start(&p, &dir.0, "p", &args("10.126.126.2/24", &["--proxy-network", "172.16.5.0/24"]));
    let na = Node::start(&a, &dir.0, "a", &args("10.126.126.1/24", &["-p", "udp://192.0.2.2:11010"]));
    wait_until(Duration::from_secs(15), "A learns the proxied subnet", || {
        na.status()["routes"].as_array().is_some_and(|r| {
            r.iter().any(|r| r["proxied"].as_array().is_some_and(|p| p.iter().any(|x| x == "172.16.5.0/24")))
        })
    });
    assert!(ping(&a, "172.16.5.2"), "A reaches the LAN host behind P through the tunnel");
    let route = a.exec_ok(&["ip", "route", "get", "172.16.5.2"]);
    assert!(String::from_utf8_lossy(&route.stdout).contains("dev weft0"), "the subnet is routed into the TUN");
    assert_eq!(np.status()["proxy_networks"][0], "172.16.5.0/24");
}

/// Whether UDP datagrams from `src` inside `from` reach `dst` inside `to` (four
/// tries, half a second each; no `ping` needed on the test machine).
fn udp_reaches(from: &Netns, src: &str, to: &Netns, dst: &str) -> bool {
    to.within(|| {
        let rx = UdpSocket::bind(format!("{dst}:7778")).unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        for _ in 0..4 {
            from.within(|| {
                let tx = UdpSocket::bind(format!("{src}:0")).unwrap();
                let _ = tx.send_to(b"weft-e2e-probe", format!("{dst}:7778"));
            });
            let mut buf = [0u8; 32];
            if let Ok((n, _)) = rx.recv_from(&mut buf)
                && &buf[..n] == b"weft-e2e-probe"
            {
                return true;
            }
        }
        false
    })
}

/// Every reason a node's status gives: refused handshakes, pending dials, peer errors,
/// refused claims, address conflicts.
fn reasons(n: &Node) -> String {
    let st = n.status();
    let mut v: Vec<String> = Vec::new();
    for (list, field) in [("refused_handshakes", "reason"), ("pending_peers", "error"), ("peers", "error")] {
        for e in st[list].as_array().into_iter().flatten() {
            v.extend(e[field].as_str().map(str::to_owned));
        }
    }
    for list in ["refused", "address_conflicts"] {
        v.extend(st[list].as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)));
    }
    v.join("\n")
}

#[test]
fn member_claiming_another_members_address_is_refused_everywhere() {
    require_root();
    let dir = TempDir::new();
    let lan = netns::Lan::new(3);
    let hub = |i: usize| format!("udp://{}:11010", lan.addrs[i]);
    let na = Node::start(&lan.hosts[0], &dir.0, "a", &args("10.126.126.1/24", &[]));
    let nb = Node::start(&lan.hosts[1], &dir.0, "b", &args("10.126.126.2/24", &["-p", &hub(0)]));
    wait_until(Duration::from_secs(15), "A and B", || {
        na.peer_established("10.126.126.2") && nb.peer_established("10.126.126.1")
    });
    let a_id = na.status()["node_id"].as_str().unwrap().to_owned();
    // C claims A's address and dials both.
    let nc = Node::start(&lan.hosts[2], &dir.0, "c", &args("10.126.126.1/24", &["-p", &hub(0), "-p", &hub(1)]));
    let c_id = nc.status()["node_id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(20), "every node says why C is refused", || {
        let (ra, rb, rc) = (reasons(&na), reasons(&nb), reasons(&nc));
        ra.contains("address conflict")
            && ra.contains(&c_id)
            && rb.contains(&format!("claims 10.126.126.1, which belongs to member {a_id}"))
            && rc.contains("already belongs to another member")
    });
    std::thread::sleep(Duration::from_secs(3));
    for n in [&na, &nb] {
        let peers = n.status()["peers"].as_array().unwrap().clone();
        assert!(peers.iter().all(|p| p["node_id"] != c_id.as_str()), "C became a peer: {peers:?}");
    }
    assert!(nc.status()["peers"].as_array().unwrap().iter().all(|p| p["state"] != "established"), "C got a session");
    // The owner keeps its traffic: B reaches A (and only A answers for the address).
    let (a, b, c) = (&lan.hosts[0], &lan.hosts[1], &lan.hosts[2]);
    assert!(udp_reaches(b, "10.126.126.2", a, "10.126.126.1"), "B -> A");
    assert!(udp_reaches(a, "10.126.126.1", b, "10.126.126.2"), "A -> B");
    assert!(!udp_reaches(c, "10.126.126.1", b, "10.126.126.2"), "C reaches B");
    assert!(nb.peer_established("10.126.126.1"));
    assert_eq!(nb.peer("10.126.126.1").unwrap()["node_id"], a_id.as_str());
}

#[test]
fn member_announcing_wide_or_overlay_subnets_gets_them_refused() {
    require_root();
    let dir = TempDir::new();
    let lan = netns::Lan::new(3);
    let hub = format!("udp://{}:11010", lan.addrs[0]);
    // A already routes 172.16.5.0/24 somewhere else: weft must not replace that route.
    lan.hosts[0].exec_ok(&["ip", "route", "add", "blackhole", "172.16.5.0/24"]);
    let na = Node::start(&lan.hosts[0], &dir.0, "a", &args("10.126.126.1/24", &[]));
    let nb = Node::start(&lan.hosts[1], &dir.0, "b", &args("10.126.126.2/24", &["-p", &hub]));
    // P announces half the internet, the overlay range, A's overlay address, the LAN
    // everyone sits on, and one ordinary subnet.
    let mut pargs = args("10.126.126.3/24", &["-p", &hub]);
    for n in ["0.0.0.0/1", "10.126.126.0/24", "10.126.126.1/32", "192.0.2.0/24", "172.16.5.0/24"] {
        pargs.extend(["--proxy-network", n]);
    }
    let np = Node::start(&lan.hosts[2], &dir.0, "p", &pargs);
    let proxied = |n: &Node| {
        n.status()["routes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["proxied"].as_array().is_some_and(|p| p.len() == 5))
    };
    wait_until(Duration::from_secs(20), "A and B hold P's record", || {
        na.routes_to("10.126.126.3") && nb.routes_to("10.126.126.3") && proxied(&na) && proxied(&nb)
    });
    std::thread::sleep(Duration::from_secs(1));
    for (name, node, host) in [("A", &na, &lan.hosts[0]), ("B", &nb, &lan.hosts[1])] {
        let refused = node.status()["refused"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join("\n");
        for (what, why) in [
            ("0.0.0.0/1", "shorter than /8"),
            ("10.126.126.0/24", "overlay network"),
            ("10.126.126.1/32", "overlay"),
            ("192.0.2.0/24", "directly connected"),
        ] {
            assert!(
                refused.lines().any(|l| l.contains(what) && l.contains(why)),
                "{name}: {what} not refused ({why}): {refused}"
            );
        }
        assert!(!refused.contains("172.16.5.0/24"), "{name}: {refused}");
        let routes = String::from_utf8_lossy(&host.exec_ok(&["ip", "route", "show"]).stdout).into_owned();
        for bad in ["0.0.0.0/1", "10.126.126.1 dev", "192.0.2.0/24 dev weft0"] {
            assert!(!routes.contains(bad), "{name} installed {bad}: {routes}");
        }
        // No default route here: unreachable is right, the tunnel is not.
        let get = String::from_utf8_lossy(&host.cmd("ip").args(["route", "get", "8.8.8.8"]).output().unwrap().stdout)
            .into_owned();
        assert!(!get.contains("weft0"), "{name} routes the internet into the tunnel: {get}");
    }
    // B installs the ordinary subnet; A keeps its own route for it.
    let b_routes = String::from_utf8_lossy(&lan.hosts[1].exec_ok(&["ip", "route", "show"]).stdout).into_owned();
    assert!(b_routes.contains("172.16.5.0/24 dev weft0"), "{b_routes}");
    let a_routes = String::from_utf8_lossy(&lan.hosts[0].exec_ok(&["ip", "route", "show"]).stdout).into_owned();
    assert!(
        a_routes.contains("blackhole 172.16.5.0/24") && !a_routes.contains("172.16.5.0/24 dev weft0"),
        "{a_routes}"
    );
    // Overlay traffic still goes to its owners.
    assert!(udp_reaches(&lan.hosts[1], "10.126.126.2", &lan.hosts[0], "10.126.126.1"));
    assert!(udp_reaches(&lan.hosts[0], "10.126.126.1", &lan.hosts[2], "10.126.126.3"));
    let _ = np;
}

#[test]
fn lan_discovery_joins_members_without_peers() {
    require_root();
    let dir = TempDir::new();
    let lan = netns::Lan::new(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let overlay = format!("10.126.126.{}/24", i + 1);
            let name = format!("n{i}");
            let mut v = args("", &["--lan-discovery"]);
            v[5] = &overlay;
            Node::start(&lan.hosts[i], &dir.0, &name, &v)
        })
        .collect();
    wait_until(Duration::from_secs(20), "every member finds every other", || {
        (0..3).all(|i| (0..3).filter(|j| *j != i).all(|j| nodes[i].peer_established(&format!("10.126.126.{}", j + 1))))
    });
    assert!(ping(&lan.hosts[0], "10.126.126.3"));
    // A node of another network on the same LAN is not even dialled.
    let other = Node::start(
        &lan.hosts[0],
        &dir.0,
        "other",
        &[
            "--network-name",
            "elsewhere",
            "--network-secret",
            "x",
            "-i",
            "10.9.9.9/24",
            "--lan-discovery",
            "-l",
            "udp://0.0.0.0:12010",
            "--dev-name",
            "weft9",
        ],
    );
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        nodes[1].status()["refused_handshakes"].as_array().unwrap().is_empty(),
        "beacons of other networks are ignored"
    );
    assert!(other.status()["peers"].as_array().unwrap().is_empty());
}

#[test]
fn dhcp_nodes_get_distinct_addresses_and_move_on_conflict() {
    require_root();
    let dir = TempDir::new();
    let lan = netns::Lan::new(4);
    let hub = format!("udp://{}:11010", lan.addrs[0]);
    let _b = Node::start(&lan.hosts[0], &dir.0, "b", &args("10.126.126.250/24", &[]));
    let overlay = |n: &Node| n.status()["overlay"].as_str().unwrap().split('/').next().unwrap().to_owned();
    let mut dyn_args = NET.to_vec();
    dyn_args.extend(["--dhcp", "--threads", "1", "-p", &hub]);
    let d1 = Node::start(&lan.hosts[1], &dir.0, "d1", &dyn_args);
    let mut d2 = Node::start(&lan.hosts[2], &dir.0, "d2", &dyn_args);
    let (a1, a2) = (overlay(&d1), overlay(&d2));
    assert_ne!(a1, a2, "two --dhcp nodes picked the same address");
    assert!(a1.starts_with("10.126.126.") && a2.starts_with("10.126.126."));
    wait_until(Duration::from_secs(15), "the dhcp nodes reach each other", || ping(&lan.hosts[1], &a2));

    // A static node takes d2's address while d2 is away; d2 comes back and must move.
    d2.stop();
    let taken = format!("{a2}/24");
    let st = Node::start(&lan.hosts[3], &dir.0, "st", &args(&taken, &["-p", &hub]));
    wait_until(Duration::from_secs(15), "static node joined", || st.peer_established("10.126.126.250"));
    d2.restart();
    let moved = || {
        let now = overlay(&d2);
        now != a2 && ping(&lan.hosts[1], &now)
    };
    let start = std::time::Instant::now();
    while !moved() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    if !moved() {
        panic!("d2 did not move: d2 {} / st {} / b {}\n{}", d2.status(), st.status(), _b.status(), d2.log_text());
    }
    let took = start.elapsed();
    eprintln!("moved to {} after {took:?}", overlay(&d2));
    assert!(ping(&lan.hosts[3], &overlay(&d2)), "the static node reaches d2 at its new address");
    assert_eq!(overlay(&st), a2, "the static node keeps its address");
}
