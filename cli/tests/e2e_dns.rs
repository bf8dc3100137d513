//! End-to-end: Magic DNS. Every node answers `<host>.<domain>` for the members on its
//! overlay address (asked with dig, locally and across the tunnel), NXDOMAIN for an
//! unknown member, REFUSED for any other domain; a duplicate host name goes to the
//! member that held it first and the others get a stable suffix, also against a
//! member that ground a lower node id, and across a restart; a renamed member is
//! answered under its new name.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod grind;
mod netns;

use std::process::Command;
use std::time::Duration;

use grind::key_below;
use netns::{Lan, Netns, Node, TempDir, require_root, wait_until, weft_bin};

const NET: [&str; 4] = ["--network-name", "Dns Test", "--network-secret", "dns secret"];
const DOMAIN: &str = "dns-test.internal";

fn start(lan: &Lan, dir: &TempDir, i: usize, host: &str, extra: &[&str]) -> Node {
    let overlay = format!("10.125.0.{}/24", i + 1);
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let mut args = NET.to_vec();
    args.extend(["-i", &overlay, "--threads", "1", "--hostname", host]);
    if i > 0 {
        args.extend(["-p", &peer]);
    }
    args.extend(extra);
    Node::start(&lan.hosts[i], &dir.0, &format!("n{i}"), &args)
}

/// `dig @server name type`: (status, answers).
fn dig(ns: &Netns, server: &str, name: &str, rtype: &str) -> (String, Vec<String>) {
    let at = format!("@{server}");
    let out = ns.exec_ok(&["dig", "+time=1", "+tries=2", "+noall", "+comments", "+answer", &at, name, rtype]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no status in dig's answer: {text}"))
        .to_owned();
    let answers = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .collect();
    (status, answers)
}

fn node_id(n: &Node) -> String {
    n.status()["node_id"].as_str().unwrap().to_owned()
}

#[test]
fn members_resolve_by_name_and_nothing_else_does() {
    require_root();
    let lan = Lan::new(4);
    let dir = TempDir::new();
    let a = start(&lan, &dir, 0, "Alpha", &[]);
    let b = start(&lan, &dir, 1, "beta", &[]);
    let c = start(&lan, &dir, 2, "BETA", &[]);
    wait_until(Duration::from_secs(10), "a mesh of three", || {
        a.routes_to("10.125.0.2") && a.routes_to("10.125.0.3") && b.routes_to("10.125.0.3")
    });
    let cid = node_id(&c);
    // B and C share a name: B held it first (on A, and on B itself), whatever the ids;
    // C gets its id's start.
    let (plain, suffixed) = ("10.125.0.2", "10.125.0.3");
    let dup = format!("beta-{}.{DOMAIN}", &cid[..6]);
    let names = |n: &Node| n.status()["magic_dns"]["names"].as_u64();
    wait_until(Duration::from_secs(10), "every zone holds three names", || {
        [&a, &b, &c].iter().all(|n| names(n) == Some(3))
    });
    assert_eq!(a.status()["magic_dns"]["name"], format!("alpha.{DOMAIN}"));
    let alpha6 =
        a.status()["overlay6"].as_str().expect("an IPv6 overlay address").split('/').next().unwrap().to_owned();

    // Asked on its own host and from another member through the tunnel.
    for (ns, server) in [(&lan.hosts[0], "10.125.0.1"), (&lan.hosts[1], "10.125.0.1"), (&lan.hosts[2], "10.125.0.2")] {
        assert_eq!(dig(ns, server, &format!("alpha.{DOMAIN}"), "A"), ("NOERROR".into(), vec!["10.125.0.1".into()]));
        assert_eq!(dig(ns, server, &format!("BeTa.{DOMAIN}"), "A"), ("NOERROR".into(), vec![plain.into()]));
        assert_eq!(dig(ns, server, &dup, "A"), ("NOERROR".into(), vec![suffixed.into()]));
        // AAAA: the member's IPv6 overlay address (derived, as none was given).
        assert_eq!(dig(ns, server, &format!("alpha.{DOMAIN}"), "AAAA"), ("NOERROR".into(), vec![alpha6.clone()]));
        assert_eq!(dig(ns, server, &format!("gamma.{DOMAIN}"), "A"), ("NXDOMAIN".into(), vec![]));
        // No open resolver: other names are refused, not looked up.
        assert_eq!(dig(ns, server, "example.com", "A"), ("REFUSED".into(), vec![]));
        assert_eq!(dig(ns, server, "alpha.other.internal", "A"), ("REFUSED".into(), vec![]));
    }
    // Only on the overlay address: nothing answers on the LAN address.
    let out = lan.hosts[1]
        .cmd("dig")
        .args(["+time=1", "+tries=1", &format!("@{}", lan.addrs[0]), "example.com"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "DNS answered on the underlay: {}", String::from_utf8_lossy(&out.stdout));
    // Nor to a LAN neighbour that is no member and routes the overlay address to A's
    // LAN address (Linux accepts it there: any local address on any interface).
    lan.hosts[3].exec_ok(&["ip", "route", "add", "10.125.0.0/24", "via", &lan.addrs[0]]);
    let name = format!("alpha.{DOMAIN}");
    let out = lan.hosts[3].cmd("dig").args(["+time=1", "+tries=2", "@10.125.0.1", &name]).output().unwrap();
    assert!(!out.status.success(), "an outsider read the member list: {}", String::from_utf8_lossy(&out.stdout));

    // C renames itself: the mesh answers the new name and forgets the old one.
    drop(c);
    let c = start(&lan, &dir, 2, "gamma", &[]);
    wait_until(Duration::from_secs(15), "A answers C's new name", || {
        dig(&lan.hosts[0], "10.125.0.1", &format!("gamma.{DOMAIN}"), "A").1 == ["10.125.0.3"]
    });
    assert_eq!(dig(&lan.hosts[0], "10.125.0.1", &dup, "A").0, "NXDOMAIN");
    assert_eq!(dig(&lan.hosts[0], "10.125.0.1", &format!("beta.{DOMAIN}"), "A").1, ["10.125.0.2"]);
    assert!(c.status()["magic_dns"]["answered"].as_u64().is_some());
    let text = Command::new(weft_bin()).args(["status", "--control"]).arg(&a.control).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("alpha.{DOMAIN} on 10.125.0.1:53")), "{text}");
}

#[test]
fn a_chosen_domain_and_magic_dns_off() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let a = start(&lan, &dir, 0, "alpha", &["--dns-domain", "Mesh.Example."]);
    let b = start(&lan, &dir, 1, "beta", &["--no-magic-dns"]);
    wait_until(Duration::from_secs(10), "A and B meet", || a.routes_to("10.125.0.2"));
    wait_until(Duration::from_secs(5), "A names B", || {
        dig(&lan.hosts[1], "10.125.0.1", "beta.mesh.example", "A").1 == ["10.125.0.2"]
    });
    assert_eq!(dig(&lan.hosts[1], "10.125.0.1", &format!("beta.{DOMAIN}"), "A").0, "REFUSED");
    assert!(b.status()["magic_dns"].is_null());
    let out =
        lan.hosts[0].cmd("dig").args(["+time=1", "+tries=1", "@10.125.0.2", "alpha.mesh.example"]).output().unwrap();
    assert!(!out.status.success(), "B answers DNS with --no-magic-dns");
}

#[test]
fn a_bad_domain_is_refused_at_start() {
    for bad in ["a..b", "-x.internal", "under_score.internal"] {
        let out = Command::new(weft_bin())
            .args([
                "up",
                "--network-name",
                "n",
                "--network-secret",
                "s",
                &format!("--dns-domain={bad}"),
                "-i",
                "10.0.0.1/24",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--dns-domain") && err.contains(bad), "{err}");
    }
}

#[test]
fn a_copied_name_stays_with_the_member_that_held_it_first() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let hub = start(&lan, &dir, 0, "hub", &[]);
    let server = start(&lan, &dir, 1, "server", &[]);
    let at = |n: &str| dig(&lan.hosts[0], "10.125.0.1", &format!("{n}.{DOMAIN}"), "A").1;
    wait_until(Duration::from_secs(15), "the hub resolves the server", || at("server") == ["10.125.0.2"]);
    // A member copies the name with a node id that sorts below the server's.
    let copier_id = key_below(&dir.0, "n2", &node_id(&server));
    let copier = start(&lan, &dir, 2, "server", &[]);
    assert_eq!(node_id(&copier), copier_id);
    wait_until(Duration::from_secs(15), "the hub knows the copier", || hub.routes_to("10.125.0.3"));
    let suffixed = format!("server-{}", &copier_id[..6]);
    wait_until(Duration::from_secs(5), "the copier is suffixed", || at(&suffixed) == ["10.125.0.3"]);
    assert_eq!(at("server"), ["10.125.0.2"], "the copier took the server's name");
    // The binding is kept in the state directory: a restarted hub still knows who
    // held the name first, whichever record reaches it first now.
    let mut hub = hub;
    hub.restart();
    wait_until(Duration::from_secs(15), "the restarted hub knows both", || {
        hub.routes_to("10.125.0.2") && hub.routes_to("10.125.0.3")
    });
    wait_until(Duration::from_secs(5), "its zone has both", || at(&suffixed) == ["10.125.0.3"]);
    assert_eq!(at("server"), ["10.125.0.2"]);
    let kept = std::fs::read_to_string(hub.state.join("names.json")).unwrap();
    assert!(kept.contains(&format!("\"server\": \"{}\"", node_id(&server))), "{kept}");
}
