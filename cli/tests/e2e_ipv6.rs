//! End-to-end: an IPv6 underlay. Two hosts that share only IPv6 addresses (2001:db8::/64,
//! inside their namespaces) make a tunnel over every transport, the listener bound on
//! `[::]`; a dual-stack `[::]` listener also takes an IPv4 peer, whose address is
//! reported as IPv4; records announce the IPv6 endpoints.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::time::Duration;

use netns::{Lan, Netns, Node, TempDir, link, ping, require_root, transfer, wait_until};

const NET: [&str; 4] = ["--network-name", "e2e-ipv6", "--network-secret", "correct horse"];

fn args<'a>(overlay: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", overlay, "--threads", "1"]);
    v.extend(extra);
    v
}

fn pair() -> (Netns, Netns) {
    let (a, b) = (Netns::new(), Netns::new());
    // IPv4 too, for the dual-stack check; IPv6 without duplicate address detection,
    // so the addresses are usable at once.
    link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24");
    for (ns, addr) in [(&a, "2001:db8::1/64"), (&b, "2001:db8::2/64")] {
        ns.exec_ok(&["ip", "-6", "addr", "add", addr, "dev", "eth0", "nodad"]);
    }
    wait_until(Duration::from_secs(5), "IPv6 on the link", || {
        b.exec_status(&["ping", "-6", "-c", "1", "-W", "1", "2001:db8::1"])
    });
    (a, b)
}

#[test]
fn every_transport_works_over_an_ipv6_underlay() {
    require_root();
    let (ha, hb) = pair();
    let dir = TempDir::new();
    for (i, (scheme, port)) in
        [("udp", 11010), ("tcp", 11010), ("ws", 11011), ("wss", 11012), ("quic", 11012)].into_iter().enumerate()
    {
        let listen = format!("{scheme}://[::]:{port}");
        let peer = format!("{scheme}://[2001:db8::1]:{port}");
        let a = Node::start(&ha, &dir.0, &format!("a{i}"), &args("10.126.130.1/24", &["--listen", &listen]));
        let b =
            Node::start(&hb, &dir.0, &format!("b{i}"), &args("10.126.130.2/24", &["--listen", &listen, "-p", &peer]));
        wait_until(Duration::from_secs(10), &format!("a tunnel over {scheme} on IPv6"), || {
            b.peer_established("10.126.130.1") && a.peer_established("10.126.130.2")
        });
        let p = b.peer("10.126.130.1").unwrap();
        assert_eq!(p["transport"], scheme, "{p}");
        assert!(p["endpoint"].as_str().unwrap().contains("[2001:db8::1]"), "{p}");
        assert!(ping(&hb, "10.126.130.1"), "no ping over {scheme} on IPv6");
        let (sent, got, _) = transfer(&hb, &ha, "10.126.130.1", 4 << 20);
        assert_eq!(sent, got, "transfer over {scheme} on IPv6 corrupted");
        // A's record announces its IPv6 endpoint.
        let listeners = a.status()["listeners"].to_string();
        assert!(listeners.contains("[::]"), "{listeners}");
        drop((a, b));
    }
}

#[test]
fn a_dual_stack_listener_takes_ipv4_peers_too() {
    require_root();
    let (ha, hb) = pair();
    let dir = TempDir::new();
    let a = Node::start(
        &ha,
        &dir.0,
        "a",
        &args("10.126.130.1/24", &["--listen", "udp://[::]:11010", "--listen", "tcp://[::]:11010"]),
    );
    let b = Node::start(&hb, &dir.0, "b", &args("10.126.130.2/24", &["-p", "udp://192.0.2.1:11010"]));
    wait_until(Duration::from_secs(10), "B joins A over IPv4", || a.peer_established("10.126.130.2"));
    // Reported as the IPv4 address it is, not as ::ffff:192.0.2.2.
    let ep = a.peer("10.126.130.2").unwrap()["endpoint"].as_str().unwrap().to_owned();
    assert!(ep.starts_with("udp://192.0.2.2:"), "{ep}");
    assert!(ping(&hb, "10.126.130.1"));
    assert!(b.peer_established("10.126.130.1"));
}

#[test]
fn two_ipv6_hosts_behind_stateful_firewalls_punch_a_direct_path() {
    require_root();
    // A and C have only IPv6 and a firewall that lets in nothing new (what a home
    // router does for IPv6); B, which both dial, relays until they punch through.
    let lan = Lan::new(3);
    for (i, h) in lan.hosts.iter().enumerate() {
        if i != 1 {
            h.exec_ok(&["ip", "addr", "flush", "dev", "eth0"]);
        }
        h.exec_ok(&["ip", "-6", "addr", "add", &format!("2001:db8::{}/64", i + 1), "dev", "eth0", "nodad"]);
    }
    for i in [0, 2] {
        let h = &lan.hosts[i];
        h.exec_ok(&["nft", "add table inet fw"]);
        h.exec_ok(&["nft", "add chain inet fw input { type filter hook input priority 0; policy drop; }"]);
        // The underlay only: what the tunnel delivers on weft0 is let in.
        for rule in
            ["iifname != \"eth0\" accept", "ct state established,related accept", "meta l4proto ipv6-icmp accept"]
        {
            h.exec_ok(&["nft", &format!("add rule inet fw input {rule}")]);
        }
    }
    wait_until(Duration::from_secs(5), "IPv6 on the LAN", || {
        lan.hosts[0].exec_status(&["ping", "-6", "-c", "1", "-W", "1", "2001:db8::2"])
    });
    let dir = TempDir::new();
    let via_b = ["-p", "udp://[2001:db8::2]:11010"];
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &args("10.126.130.2/24", &[]));
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &args("10.126.130.1/24", &via_b));
    let c = Node::start(&lan.hosts[2], &dir.0, "c", &args("10.126.130.3/24", &via_b));
    wait_until(Duration::from_secs(15), "A and C meet through B", || {
        a.routes_to("10.126.130.3") && c.routes_to("10.126.130.1")
    });
    // B's record announces its IPv6 address (its listener is the dual-stack default).
    let listeners = b.status()["listeners"].to_string();
    assert!(listeners.contains("udp://[::]:11010"), "{listeners}");
    assert!(ping(&lan.hosts[0], "10.126.130.3"), "A -> C works at once, relayed if need be");
    let direct = |n: &Node, ip: &str| n.peer(ip).is_some_and(|p| p["path"] == "direct");
    wait_until(Duration::from_secs(30), "A and C punch a direct path", || {
        let _ = ping(&lan.hosts[0], "10.126.130.3");
        direct(&a, "10.126.130.3") && direct(&c, "10.126.130.1")
    });
    let ep = a.peer("10.126.130.3").unwrap()["endpoint"].as_str().unwrap().to_owned();
    assert_eq!(ep, "udp://[2001:db8::3]:11010");
    let (sent, got, _) = transfer(&lan.hosts[0], &lan.hosts[2], "10.126.130.3", 4 << 20);
    assert_eq!(sent, got);
    drop(b);
    assert!(ping(&lan.hosts[0], "10.126.130.3"), "the direct path needs no relay");
}
