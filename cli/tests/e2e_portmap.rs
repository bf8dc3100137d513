//! Port mapping against the real miniupnpd (Debian's miniupnpd-nftables, UPnP and
//! NAT-PMP/PCP on) as the router of a member behind an endpoint-dependent NAT.
//!
//! ```text
//!   M 10.1.0.2 ── R1 (miniupnpd; masquerade random) ─┐
//!                  wan 100.200.0.2                   ├─ switch ── P 203.0.113.2 (public)
//!   Q 10.2.0.2 ── R2 (masquerade random) ────────────┘
//!                  wan 203.0.113.3
//! ```
//!
//! Both routers give every destination a new port (`masquerade random`) and drop
//! unsolicited inbound packets, so M and Q, which meet through P, cannot punch a
//! direct path: they stay relayed. Once M's router maps M's UDP port and M announces
//! the mapping, Q reaches M there directly. The mapping is gone from the router when
//! M stops; the router refusing PCP (NAT-PMP answers) or both (UPnP-IGD answers) maps
//! all the same.
//!
//! miniupnpd refuses documentation ranges as its external address, so R1's WAN uses
//! 100.200.0.0/24: that range exists only inside this test's own namespaces (an
//! on-link route on each of them), like every address here.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netns::{Netns, Node, TempDir, ip, link, ping, require_root, wait_until, weft_bin};

const NET: [&str; 4] = ["--network-name", "portmap", "--network-secret", "portmap secret"];
/// R1's external address: outside the documentation ranges, inside the test only.
const EXTERNAL: &str = "100.200.0.2";

fn args<'a>(overlay: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", overlay, "--threads", "1"]);
    v.extend(extra);
    v
}

fn nft(ns: &Netns, dir: &Path, rules: &str) {
    let path = dir.join(format!("{}.nft", ns.name));
    std::fs::write(&path, rules).unwrap();
    ns.exec_ok(&["nft", "-f", path.to_str().unwrap()]);
}

/// An endpoint-dependent NAT out of `wan` (a new random port per destination) that
/// drops unsolicited inbound packets, except those a port mapping forwards.
fn hard_nat(r: &Netns, dir: &Path) {
    r.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    nft(
        r,
        dir,
        concat!(
            "table ip nat {\n chain post {\n  type nat hook postrouting priority 100;\n  oifname \"wan\" masquerade random\n }\n}\n",
            "table inet filter {\n chain input {\n  type filter hook input priority 0;\n  iifname \"wan\" ct state new drop\n }\n",
            " chain forward {\n  type filter hook forward priority 0;\n  iifname \"wan\" ct status dnat accept\n",
            "  iifname \"wan\" ct state new drop\n }\n}\n"
        ),
    );
}

/// miniupnpd in the foreground in `r`, killed (by its PID) on drop.
struct Miniupnpd(Child);

impl Miniupnpd {
    fn start(r: &Netns, dir: &Path) -> Self {
        assert!(
            Path::new("/usr/sbin/miniupnpd").exists(),
            "this test needs miniupnpd: apt-get install miniupnpd-nftables"
        );
        // The chains miniupnpd 2.3.1 fills (its package lacks the script that makes them).
        nft(
            r,
            dir,
            concat!(
                "table inet miniupnpd {\n",
                " chain forward { type filter hook forward priority 0; policy accept; jump miniupnpd; }\n",
                " chain miniupnpd { }\n",
                " chain prerouting { type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd; }\n",
                " chain postrouting { type nat hook postrouting priority 100; policy accept; jump postrouting_miniupnpd; }\n",
                " chain prerouting_miniupnpd { }\n",
                " chain postrouting_miniupnpd { }\n",
                "}\n"
            ),
        );
        let conf = dir.join("miniupnpd.conf");
        std::fs::write(
            &conf,
            format!(
                "ext_ifname=wan\next_ip={EXTERNAL}\nlistening_ip=lan\nenable_natpmp=yes\nenable_upnp=yes\n\
                 secure_mode=yes\nupnp_table_name=miniupnpd\nupnp_nat_table_name=miniupnpd\n\
                 upnp_forward_chain=miniupnpd\nupnp_nat_chain=prerouting_miniupnpd\n\
                 upnp_nat_postrouting_chain=postrouting_miniupnpd\n\
                 allow 1024-65535 10.1.0.0/24 1024-65535\ndeny 0-65535 0.0.0.0/0 0-65535\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("miniupnpd.log")).unwrap();
        let child = r
            .cmd("/usr/sbin/miniupnpd")
            .args(["-d", "-f", conf.to_str().unwrap(), "-P", dir.join("miniupnpd.pid").to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let m = Self(child);
        wait_until(Duration::from_secs(10), "miniupnpd listens on 5351", || {
            let out = r.exec_ok(&["ss", "-uln"]);
            String::from_utf8_lossy(&out.stdout).contains(":5351")
        });
        m
    }
}

impl Drop for Miniupnpd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The port forwards miniupnpd holds (its DNAT rules).
fn forwards(r: &Netns) -> Vec<String> {
    let out = r.exec_ok(&["nft", "list", "chain", "inet", "miniupnpd", "prerouting_miniupnpd"]);
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("dnat")).map(|l| l.trim().to_owned()).collect()
}

fn peer_field(n: &Node, overlay: &str, field: &str) -> String {
    n.peer(overlay).map(|p| p[field].as_str().unwrap_or("").to_owned()).unwrap_or_default()
}

fn write_config(path: &Path, extra: &str) {
    let text = format!(
        "network-name = \"portmap\"\nnetwork-secret = \"portmap secret\"\nipv4 = \"10.126.126.1/24\"\n\
         threads = 1\npeer = [\"udp://203.0.113.2:11010\"]\n{extra}"
    );
    netns::write_private(path, &text);
}

fn reload(n: &Node) -> String {
    let out = Command::new(weft_bin()).args(["reload", "--control"]).arg(&n.control).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    said
}

#[test]
fn a_member_behind_a_hard_nat_goes_direct_through_its_routers_port_mapping() {
    require_root();
    let dir = TempDir::new();
    // The public side: a bridge in a switch namespace with P and both routers' WANs.
    let sw = Netns::new();
    sw.exec_ok(&["ip", "link", "add", "br0", "type", "bridge"]);
    sw.exec_ok(&["ip", "link", "set", "br0", "up"]);
    let (p, r1, r2, m, q) = (Netns::new(), Netns::new(), Netns::new(), Netns::new(), Netns::new());
    for (ns, ifname, addr, port) in [
        (&p, "eth0", "203.0.113.2/24", "pp"),
        (&r1, "wan", "100.200.0.2/24", "p1"),
        (&r2, "wan", "203.0.113.3/24", "p2"),
    ] {
        ip(&["link", "add", ifname, "netns", &ns.name, "type", "veth", "peer", "name", port, "netns", &sw.name]);
        sw.exec_ok(&["ip", "link", "set", port, "master", "br0"]);
        sw.exec_ok(&["ip", "link", "set", port, "up"]);
        ns.exec_ok(&["ip", "addr", "add", addr, "dev", ifname]);
        ns.exec_ok(&["ip", "link", "set", ifname, "up"]);
    }
    // 100.200.0.0/24 and 203.0.113.0/24 share the switch: on-link routes between them,
    // inside these namespaces only.
    p.exec_ok(&["ip", "route", "add", "100.200.0.0/24", "dev", "eth0"]);
    r2.exec_ok(&["ip", "route", "add", "100.200.0.0/24", "dev", "wan"]);
    r1.exec_ok(&["ip", "route", "add", "203.0.113.0/24", "dev", "wan"]);
    link(&r1, "lan", "10.1.0.1/24", &m, "eth0", "10.1.0.2/24");
    link(&r2, "lan", "10.2.0.1/24", &q, "eth0", "10.2.0.2/24");
    m.exec_ok(&["ip", "route", "add", "default", "via", "10.1.0.1"]);
    q.exec_ok(&["ip", "route", "add", "default", "via", "10.2.0.1"]);
    hard_nat(&r1, &dir.0);
    hard_nat(&r2, &dir.0);
    let _upnpd = Miniupnpd::start(&r1, &dir.0);

    // M starts with port mapping off (config file), Q with it on (its router has no
    // server: nothing to map). Both meet through P.
    let cfg = dir.0.join("m.toml");
    write_config(&cfg, "no-port-mapping = true\n");
    let np = Node::start(&p, &dir.0, "p", &args("10.126.126.2/24", &[]));
    let mut nm = Node::start(&m, &dir.0, "m", &["--config", cfg.to_str().unwrap()]);
    let nq = Node::start(&q, &dir.0, "q", &args("10.126.126.3/24", &["-p", "udp://203.0.113.2:11010"]));
    wait_until(Duration::from_secs(20), "M and Q meet through P", || {
        nm.routes_to("10.126.126.3") && nq.routes_to("10.126.126.1")
    });
    assert!(nm.status()["port_mapping"].is_null(), "port mapping is off");
    // P has no default route: no router to ask. Q's router runs no mapping server:
    // PCP and NAT-PMP meet its ICMP port unreachable, the SSDP search finds nothing.
    assert_eq!(np.status()["port_mapping"]["last_error"], "no IPv4 default gateway");
    wait_until(Duration::from_secs(15), "Q's router refuses every protocol", || {
        let e = nq.status()["port_mapping"]["last_error"].as_str().unwrap_or("").to_owned();
        e.contains("pcp: gateway unreachable") && e.contains("nat-pmp: gateway unreachable") && e.contains("upnp:")
    });
    assert!(nq.status()["port_mapping"]["external"].is_null());
    // Traffic for a while: both punch, neither NAT lets the other's punch in.
    for _ in 0..4 {
        assert!(ping(&q, "10.126.126.1"), "Q -> M works, relayed");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(peer_field(&nq, "10.126.126.1", "path"), "relay", "two endpoint-dependent NATs punched through");
    assert!(forwards(&r1).is_empty());

    // Port mapping on (a live reload): the router maps M's port, M announces it.
    write_config(&cfg, "");
    let said = reload(&nm);
    assert!(said.contains("port mapping on"), "{said}");
    wait_until(Duration::from_secs(15), "M maps its port", || nm.status()["port_mapping"]["external"].is_string());
    let pm = &nm.status()["port_mapping"];
    assert_eq!(pm["protocol"], "pcp", "miniupnpd answers PCP first: {pm}");
    assert_eq!(pm["external"], format!("{EXTERNAL}:11010"));
    assert_eq!(pm["advertised"], true);
    assert_eq!(pm["gateway"], "10.1.0.1");
    assert!(pm["expires_in_s"].as_u64().is_some_and(|e| e > 60), "{pm}");
    assert_eq!(forwards(&r1).len(), 1, "{:?}", forwards(&r1));
    let (ok, text) = netns::weft_out(&["status", "--control", nm.control.to_str().unwrap()]);
    assert!(ok && text.contains(&format!("port map  pcp {EXTERNAL}:11010 -> port 11010 (announced")), "{text}");

    // Q reaches M directly at the mapped endpoint.
    let took = wait_until(Duration::from_secs(45), "Q goes direct to M through the mapping", || {
        let _ = ping(&q, "10.126.126.1");
        peer_field(&nq, "10.126.126.1", "path") == "direct" && peer_field(&nm, "10.126.126.3", "path") == "direct"
    });
    eprintln!("direct through the port mapping {took:?} after it was made");
    assert_eq!(peer_field(&nq, "10.126.126.1", "endpoint"), format!("udp://{EXTERNAL}:11010"));
    // Traffic between Q and M no longer crosses P.
    let p_packets = || {
        let out = p.exec_ok(&["cat", "/sys/class/net/eth0/statistics/rx_packets"]);
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap()
    };
    let before = p_packets();
    q.exec_ok(&["ping", "-c", "100", "-i", "0.01", "-q", "10.126.126.1"]);
    let crossed = p_packets() - before;
    assert!(crossed < 40, "{crossed} packets crossed P during 100 pings");

    // M stops (SIGTERM): the mapping is deleted on the router.
    nm.terminate();
    assert!(forwards(&r1).is_empty(), "mapping left on the router: {:?}", forwards(&r1));

    // A router whose PCP is off (its answers rejected): NAT-PMP maps instead; then one
    // whose NAT-PMP is off too: UPnP-IGD. Each mapping is deleted on shutdown.
    r1.exec_ok(&["nft", "add", "table", "inet", "block"]);
    r1.exec_ok(&["nft", "add", "chain", "inet", "block", "in", "{ type filter hook input priority -10; }"]);
    r1.exec_ok(&["nft", "add", "rule", "inet", "block", "in", "udp", "dport", "5351", "@th,64,8", "2", "reject"]);
    for protocol in ["nat_pmp", "upnp"] {
        if protocol == "upnp" {
            r1.exec_ok(&["nft", "add", "rule", "inet", "block", "in", "udp", "dport", "5351", "reject"]);
        }
        nm.restart();
        wait_until(Duration::from_secs(20), "M maps its port again", || {
            nm.status()["port_mapping"]["external"].is_string()
        });
        let pm = &nm.status()["port_mapping"];
        assert_eq!(pm["protocol"], protocol, "{pm}");
        assert_eq!(pm["external"], format!("{EXTERNAL}:11010"));
        assert_eq!(forwards(&r1).len(), 1, "{:?}", forwards(&r1));
        nm.terminate();
        assert!(forwards(&r1).is_empty(), "{protocol} mapping left on the router: {:?}", forwards(&r1));
    }
}
