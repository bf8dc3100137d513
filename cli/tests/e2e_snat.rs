//! End-to-end: a subnet router's LAN needs no route back to the overlay. The LAN host
//! here has no route to the overlay at all; a member reaches it through the router,
//! whose nftables table of its own translates the member's source to the router's LAN
//! address, and which removes that table when it stops. With
//! `--no-snat-subnet-routes` the member's source is kept and the host cannot answer.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::time::Duration;

use netns::{Lan, Netns, Node, TempDir, link, ping, require_root, wait_until};

const NET: [&str; 6] = ["--network-name", "snat", "--network-secret", "snat secret", "--threads", "1"];

fn args<'a>(ip: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", ip]);
    v.extend(extra);
    v
}

fn tables(ns: &Netns) -> String {
    String::from_utf8_lossy(&ns.exec_ok(&["nft", "list", "tables"]).stdout).into_owned()
}

#[test]
fn a_lan_host_without_a_route_back_answers_members_through_the_router() {
    require_root();
    let (lan, dir) = (Lan::new(2), TempDir::new());
    let r_ns = &lan.hosts[0];
    // The router's LAN: one host, no default route, no route to the overlay.
    let host = Netns::new();
    link(r_ns, "lan0", "192.168.77.1/24", &host, "eth0", "192.168.77.2/24");
    // The member listens; the router dials it, so a restarted router is back at once.
    let m = Node::start(&lan.hosts[1], &dir.0, "m", &args("10.126.150.2/24", &[]));
    let peer = format!("udp://{}:11010", lan.addrs[1]);
    let routed = || {
        let out = lan.hosts[1].exec_ok(&["ip", "route", "show", "192.168.77.0/24"]);
        String::from_utf8_lossy(&out.stdout).contains("weft0")
    };
    let router = |extra: &[&str]| {
        let mut a = args("10.126.150.1/24", &["--proxy-network", "192.168.77.0/24", "-p", &peer]);
        a.extend(extra);
        Node::start(r_ns, &dir.0, "r", &a)
    };

    // Sources kept: the LAN host has no way back.
    let mut r = router(&["--no-snat-subnet-routes"]);
    wait_until(Duration::from_secs(20), "the member routes the router's LAN", routed);
    assert!(!tables(r_ns).contains("weft-snat"), "{}", tables(r_ns));
    assert!(!ping(&lan.hosts[1], "192.168.77.2"), "the LAN host answered without a route back");
    r.stop();
    drop(r);

    // Translated: it answers the router, which hands the answer to the member.
    let mut r = router(&[]);
    wait_until(Duration::from_secs(20), "the router is back", || m.peer_established("10.126.150.1") && routed());
    assert!(tables(r_ns).contains("weft-snat-weft0"), "{}", tables(r_ns));
    assert!(ping(&lan.hosts[1], "192.168.77.2"), "the LAN host does not answer a member");
    let rules = String::from_utf8_lossy(&r_ns.exec_ok(&["nft", "list", "table", "inet", "weft-snat-weft0"]).stdout)
        .into_owned();
    let v4 = rules.lines().find(|l| l.contains("ip daddr @subnets4")).unwrap_or_default();
    assert!(v4.contains("masquerade") && !v4.contains("packets 0 "), "nothing was translated: {rules}");
    r.terminate();
    assert!(!tables(r_ns).contains("weft-snat"), "a stopped router left its table: {}", tables(r_ns));
}
