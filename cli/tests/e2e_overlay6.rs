//! End-to-end: the IPv6 overlay. Every member has an IPv6 overlay address (given with
//! `--ipv6`, or derived from the network name and node id); ping6 and a 64 MiB SHA-256
//! transfer work over it directly and through a relay; a member proxies an IPv6
//! subnet; Magic DNS answers AAAA on the IPv6 overlay address; `--no-ipv6` keeps a
//! member IPv4 only.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::time::Duration;

use netns::{Lan, Netns, Node, TempDir, link, ping, require_root, transfer, wait_until};

const NET: [&str; 4] = ["--network-name", "e2e-overlay6", "--network-secret", "six in the mesh"];

fn args<'a>(overlay: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", overlay, "--threads", "1"]);
    v.extend(extra);
    v
}

fn ping6(ns: &Netns, addr: &str) -> bool {
    ns.exec_status(&["ping", "-6", "-c", "2", "-i", "0.3", "-W", "2", addr])
}

fn overlay6(n: &Node) -> String {
    let s = n.status();
    s["overlay6"].as_str().unwrap_or_else(|| panic!("no IPv6 overlay address: {s}")).to_owned()
}

#[test]
fn ipv6_overlay_direct_relayed_and_a_proxied_subnet() {
    require_root();
    let dir = TempDir::new();
    // A - B - C in a chain (A and C cannot reach each other), and D on a LAN behind
    // B that B proxies (fd77:1::/64).
    let (a, b, c, d) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
    link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24");
    link(&b, "eth1", "198.51.100.2/24", &c, "eth0", "198.51.100.3/24");
    link(&b, "lan0", "172.31.0.1/24", &d, "eth0", "172.31.0.2/24");
    b.exec_ok(&["ip", "-6", "addr", "add", "fd77:1::1/64", "dev", "lan0", "nodad"]);
    d.exec_ok(&["ip", "-6", "addr", "add", "fd77:1::2/64", "dev", "eth0", "nodad"]);
    d.exec_ok(&["ip", "-6", "route", "add", "default", "via", "fd77:1::1"]);
    let nb = Node::start(
        &b,
        &dir.0,
        "b",
        &args("10.126.140.2/24", &["--ipv6", "fd7a:115c:a1e0::2/64", "--proxy-network", "fd77:1::/64"]),
    );
    let na = Node::start(
        &a,
        &dir.0,
        "a",
        &args("10.126.140.1/24", &["--ipv6", "fd7a:115c:a1e0::1/64", "-p", "udp://192.0.2.2:11010"]),
    );
    let nc = Node::start(
        &c,
        &dir.0,
        "c",
        &args("10.126.140.3/24", &["--ipv6", "fd7a:115c:a1e0::3/64", "-p", "udp://198.51.100.2:11010"]),
    );
    wait_until(Duration::from_secs(15), "A and C learn each other through B", || {
        na.routes_to("10.126.140.3") && nc.routes_to("10.126.140.1") && na.routes_to("10.126.140.2")
    });
    assert_eq!(overlay6(&na), "fd7a:115c:a1e0::1/64");
    // The TUN carries it, usable at once (no duplicate address detection).
    let shown = String::from_utf8_lossy(&a.exec_ok(&["ip", "-6", "addr", "show", "dev", "weft0"]).stdout).into_owned();
    assert!(shown.contains("fd7a:115c:a1e0::1/64") && !shown.contains("tentative"), "{shown}");
    assert!(!shown.contains("fe80"), "a link-local address on the TUN: {shown}");

    // Direct, then relayed: the first packet to an idle member starts its session.
    assert!(ping6(&a, "fd7a:115c:a1e0::2"), "A -> B over the IPv6 overlay");
    assert!(ping6(&a, "fd7a:115c:a1e0::3"), "A -> C over the IPv6 overlay, relayed by B");
    assert!(ping6(&c, "fd7a:115c:a1e0::1"), "C -> A");
    let to_c = na.peer("10.126.140.3").unwrap();
    assert_eq!((to_c["path"].as_str(), to_c["overlay6"].as_str()), (Some("relay"), Some("fd7a:115c:a1e0::3")));
    let route = na.status()["routes"].as_array().unwrap().iter().find(|r| r["overlay"] == "10.126.140.3").cloned();
    assert_eq!(route.unwrap()["overlay6"], "fd7a:115c:a1e0::3");
    for (to, ns, what) in [("fd7a:115c:a1e0::2", &b, "direct"), ("fd7a:115c:a1e0::3", &c, "relayed")] {
        let (sent, got, took) = transfer(&a, ns, to, 64 << 20);
        assert_eq!(sent, got, "64 MiB over the IPv6 overlay ({what}) arrived corrupted");
        eprintln!("64 MiB over the IPv6 overlay, {what}: {:.0} Mbit/s", 64.0 * 8.0 * 1.048_576 / took.as_secs_f64());
    }

    // The proxied IPv6 subnet: A and C reach D behind B; D sees their overlay address.
    wait_until(Duration::from_secs(10), "A routes B's IPv6 subnet", || {
        let r = String::from_utf8_lossy(&a.exec_ok(&["ip", "-6", "route", "show", "dev", "weft0"]).stdout).into_owned();
        r.contains("fd77:1::/64")
    });
    assert!(ping6(&a, "fd77:1::2"), "A -> D in B's proxied IPv6 subnet");
    assert!(ping6(&c, "fd77:1::2"), "C -> D, relayed to B, forwarded by B");
    let (sent, got, _) = transfer(&a, &d, "fd77:1::2", 4 << 20);
    assert_eq!(sent, got, "transfer into the proxied IPv6 subnet corrupted");
    let routes = nb.status()["proxy_networks"].to_string();
    assert!(routes.contains("fd77:1::/64"), "{routes}");
    // IPv4 still works beside it.
    assert!(ping(&a, "10.126.140.3"));
}

#[test]
fn derived_addresses_magic_dns_aaaa_and_an_ipv4_only_member() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &args("10.126.141.1/24", &["--hostname", "alpha"]));
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &args("10.126.141.2/24", &["--hostname", "beta", "-p", &peer]));
    let c = Node::start(
        &lan.hosts[2],
        &dir.0,
        "c",
        &args("10.126.141.3/24", &["--hostname", "gamma", "--no-ipv6", "-p", &peer]),
    );
    wait_until(Duration::from_secs(10), "a mesh of three", || {
        a.peer_established("10.126.141.2") && a.peer_established("10.126.141.3")
    });
    // Derived: one /64 in fd00::/8 for the whole network, the node id as host part.
    let (a6, b6) = (overlay6(&a), overlay6(&b));
    assert!(a6.starts_with("fd") && a6.ends_with("/64"), "{a6}");
    let net = |s: &str| s.split(':').take(3).collect::<Vec<_>>().join(":");
    assert_eq!(net(&a6), net(&b6), "members share the derived prefix");
    let id = a.status()["node_id"].as_str().unwrap().to_owned();
    let host: Vec<u16> = (0..4).map(|i| u16::from_str_radix(&id[i * 4..i * 4 + 4], 16).unwrap()).collect();
    let a6_addr: std::net::Ipv6Addr = a6.split('/').next().unwrap().parse().unwrap();
    assert_eq!(&a6_addr.segments()[4..], &host[..], "the host part is the node id");
    let b6_addr = b6.split('/').next().unwrap().to_owned();
    assert!(ping6(&lan.hosts[0], &b6_addr), "A -> B over derived addresses");
    assert_eq!(b.peer("10.126.141.1").unwrap()["overlay6"], a6_addr.to_string());

    // Magic DNS answers AAAA, on the IPv6 overlay address too.
    let dig = |ns: &Netns, server: &str, name: &str, t: &str| {
        let at = format!("@{server}");
        let out = ns.exec_ok(&["dig", "+time=1", "+tries=2", "+short", &at, name, t]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let domain = "e2e-overlay6.internal";
    wait_until(Duration::from_secs(10), "B's zone holds three names", || {
        b.status()["magic_dns"]["names"].as_u64() == Some(3)
    });
    assert_eq!(dig(&lan.hosts[0], &b6_addr, &format!("alpha.{domain}"), "AAAA"), a6_addr.to_string());
    assert_eq!(dig(&lan.hosts[0], "10.126.141.2", &format!("alpha.{domain}"), "A"), "10.126.141.1");
    assert_eq!(dig(&lan.hosts[0], &b6_addr, &format!("gamma.{domain}"), "AAAA"), "", "an IPv4-only member");
    assert_eq!(dig(&lan.hosts[0], &b6_addr, &format!("gamma.{domain}"), "A"), "10.126.141.3");

    // The IPv4-only member: no IPv6 on its TUN, none in status, still reachable.
    let st = c.status();
    assert!(st["overlay6"].is_null(), "{st}");
    let shown = String::from_utf8_lossy(&lan.hosts[2].exec_ok(&["ip", "-6", "addr", "show", "dev", "weft0"]).stdout)
        .into_owned();
    assert!(shown.trim().is_empty(), "IPv6 on an IPv4-only member's TUN: {shown}");
    assert!(a.peer("10.126.141.3").unwrap()["overlay6"].is_null());
    assert!(ping(&lan.hosts[2], "10.126.141.1"));
    // Text output names the IPv6 address.
    let text =
        std::process::Command::new(netns::weft_bin()).args(["peers", "--control"]).arg(&b.control).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("IPV6") && text.contains(&a6_addr.to_string()), "{text}");
}
