//! End-to-end: exit nodes. X offers the internet (a "public" namespace one router
//! beyond its upstream 198.51.100.0/24, in 203.0.113.0/24 and 2001:db8:ff::/64); M
//! uses it and reaches the public server over IPv4 and IPv6 (the IPv6 overlay), which
//! sees X's addresses; members reach neither X's LAN nor cloud metadata, and nobody on
//! X's upstream reaches a member by routing the overlay via X;
//! N does not ask and cannot; when X dies nothing of M's leaks out of its underlay
//! interface; M's rules and routes are gone after it stops, X's nftables table too.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod grind;
mod netns;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grind::key_below;
use netns::{Lan, Netns, Node, TempDir, link, require_root, stop_capture, wait_until, weft_bin};

const NET: [&str; 4] = ["--network-name", "exit", "--network-secret", "exit secret"];
const PUBLIC: &str = "203.0.113.10";
const PUBLIC6: &str = "2001:db8:ff::10";
/// The members' own default gateway (it forwards nothing).
const GATEWAY: &str = "192.0.2.254";

fn args<'a>(i: usize, overlay: &'a str, peer: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = NET.to_vec();
    v.extend(["-i", overlay, "--threads", "1", "--hostname", ["xnode", "mnode", "nnode", "fnode", "unode"][i]]);
    if i > 0 {
        v.extend(["-p", peer]);
    }
    v.extend(extra);
    v
}

/// X's upstream: X (`exit`) at 198.51.100.2 and 2001:db8:fe::2, a router namespace
/// (returned) at .1 that also holds the cloud metadata address 169.254.169.254, and
/// the public server's namespace (returned) behind it. The exit's own networks are
/// refused as destinations, so the server must not be on one of them.
fn upstream(exit: &Netns) -> (Netns, Netns) {
    let (router, public) = (Netns::new(), Netns::new());
    link(exit, "pub0", "198.51.100.2/24", &router, "eth0", "198.51.100.1/24");
    link(&router, "eth1", "203.0.113.1/24", &public, "eth0", &format!("{PUBLIC}/24"));
    exit.exec_ok(&["ip", "-6", "addr", "add", "2001:db8:fe::2/64", "dev", "pub0", "nodad"]);
    router.exec_ok(&["ip", "-6", "addr", "add", "2001:db8:fe::1/64", "dev", "eth0", "nodad"]);
    router.exec_ok(&["ip", "-6", "addr", "add", "2001:db8:ff::1/64", "dev", "eth1", "nodad"]);
    public.exec_ok(&["ip", "-6", "addr", "add", &format!("{PUBLIC6}/64"), "dev", "eth0", "nodad"]);
    router.exec_ok(&["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"]);
    router.exec_ok(&["ip", "link", "set", "lo", "up"]);
    for (ns, v4, v6) in [(exit, "198.51.100.1", "2001:db8:fe::1"), (&public, "203.0.113.1", "2001:db8:ff::1")] {
        ns.exec_ok(&["ip", "route", "add", "default", "via", v4]);
        ns.exec_ok(&["ip", "-6", "route", "add", "default", "via", v6]);
    }
    router.exec_ok(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
    router.exec_ok(&["sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"]);
    (router, public)
}

/// A TCP server in `ns` that answers each connection with the address it saw.
fn public_server(ns: &Netns) -> Arc<Mutex<Vec<SocketAddr>>> {
    serve(ns, &[format!("{PUBLIC}:8080"), format!("[{PUBLIC6}]:8080")])
}

/// TCP servers in `ns` at `at` that answer each connection with the address they saw.
fn serve(ns: &Netns, at: &[String]) -> Arc<Mutex<Vec<SocketAddr>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    for at in at {
        let l = ns.within(|| TcpListener::bind(at).unwrap());
        let s = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let from = c.peer_addr().unwrap();
                s.lock().unwrap().push(from);
                let _ = c.write_all(from.to_string().as_bytes());
            }
        });
    }
    seen
}

/// Connects from `ns` to the public server over IPv4; what it says it saw, or why not.
fn reach(ns: &Netns) -> Result<String, String> {
    reach_at(ns, &format!("{PUBLIC}:8080"))
}

/// The same over IPv6.
fn reach6(ns: &Netns) -> Result<String, String> {
    reach_at(ns, &format!("[{PUBLIC6}]:8080"))
}

fn reach_at(ns: &Netns, at: &str) -> Result<String, String> {
    ns.within(|| {
        let to: SocketAddr = at.parse().unwrap();
        let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).map_err(|e| e.to_string())?;
        Ok(s)
    })
}

/// What a command printed (a table that does not exist prints nothing).
fn ip_out(ns: &Netns, argv: &[&str]) -> String {
    let out = ns.cmd(argv[0]).args(&argv[1..]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_member_reaches_the_internet_through_the_exit_it_chose_and_only_then() {
    require_root();
    let lan = Lan::new(5);
    let (_router, public) = upstream(&lan.hosts[0]);
    for h in &lan.hosts[1..] {
        // A gateway that resolves but goes nowhere: a leak shows up as packets for the
        // public address on the underlay interface.
        h.exec_ok(&["ip", "neigh", "add", GATEWAY, "lladdr", "02:00:00:00:00:fe", "dev", "eth0", "nud", "permanent"]);
        h.exec_ok(&["ip", "route", "add", "default", "via", GATEWAY]);
        h.exec_ok(&[
            "ip",
            "-6",
            "neigh",
            "add",
            "fe80::fe",
            "lladdr",
            "02:00:00:00:00:fe",
            "dev",
            "eth0",
            "nud",
            "permanent",
        ]);
        h.exec_ok(&["ip", "-6", "route", "add", "default", "via", "fe80::fe", "dev", "eth0"]);
    }
    let seen = public_server(&public);
    let dir = TempDir::new();
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let x = Node::start(&lan.hosts[0], &dir.0, "x", &args(0, "10.124.0.1/24", &peer, &["--exit-node"]));
    let m = Node::start(&lan.hosts[1], &dir.0, "m", &args(1, "10.124.0.2/24", &peer, &["--use-exit-node", "xnode"]));
    let n = Node::start(&lan.hosts[2], &dir.0, "n", &args(2, "10.124.0.3/24", &peer, &[]));
    let fallback = ["--use-exit-node", "xnode", "--exit-fallback"];
    let f = Node::start(&lan.hosts[3], &dir.0, "f", &args(3, "10.124.0.4/24", &peer, &fallback));
    // U names a member that does not exist (a typo): status and the log say so.
    let u = Node::start(&lan.hosts[4], &dir.0, "u", &args(4, "10.124.0.5/24", &peer, &["--use-exit-node", "xnoed"]));
    wait_until(Duration::from_secs(10), "M routes through X", || m.status()["exit"]["state"] == "routing");
    wait_until(Duration::from_secs(10), "N knows X", || n.routes_to("10.124.0.1"));
    wait_until(Duration::from_secs(10), "F routes through X", || f.status()["exit"]["state"] == "routing");
    // With --exit-fallback the rules follow the engine on the netcfg thread.
    wait_until(Duration::from_secs(5), "F's rules are in", || {
        ip_out(&lan.hosts[3], &["ip", "-6", "rule", "list"]).contains("lookup 30566")
    });
    assert!(reach(&lan.hosts[3]).is_ok_and(|s| s.starts_with("198.51.100.2:")), "F goes through X while it is up");

    // M reaches the public server; the server sees X's public address.
    let said = reach(&lan.hosts[1]).expect("M reaches the public server through X");
    assert!(said.starts_with("198.51.100.2:"), "the server saw {said}");
    assert!(seen.lock().unwrap().iter().all(|a| a.ip().to_string() == "198.51.100.2"));
    // IPv6 goes through X too, over the IPv6 overlay, and leaves with X's address.
    assert!(ip_out(&lan.hosts[1], &["ip", "-6", "rule", "list"]).contains("lookup 30566"));
    assert!(ip_out(&lan.hosts[1], &["ip", "-6", "route", "show", "table", "30566"]).contains("default dev weft0"));
    // (Neighbour discovery on the two links beyond X may take longer than one
    // connect's 2 s on a loaded machine: a few tries.)
    let mut said6 = reach6(&lan.hosts[1]);
    for _ in 0..4 {
        if said6.is_ok() {
            break;
        }
        said6 = reach6(&lan.hosts[1]);
    }
    let said6 = said6.expect("M reaches the public server over IPv6 through X");
    assert!(said6.starts_with("[2001:db8:fe::2]:"), "the server saw {said6}");
    // N never asked: no default route of ours, no rule, and no way out.
    assert!(reach(&lan.hosts[2]).is_err(), "N reached the internet without asking for an exit");
    assert!(reach6(&lan.hosts[2]).is_err(), "N reached the IPv6 internet without asking for an exit");
    assert!(!ip_out(&lan.hosts[2], &["ip", "rule", "list"]).contains("30566"));
    assert!(ip_out(&lan.hosts[2], &["ip", "route", "show", "table", "30566"]).trim().is_empty());
    let routes = ip_out(&lan.hosts[2], &["ip", "route"]);
    assert!(
        !routes.lines().any(|l| l.starts_with("default") && l.contains("weft0")),
        "N routes the internet to us: {routes}"
    );
    assert_eq!(n.status()["exit_offers"][0]["hostname"], "xnode");
    wait_until(Duration::from_secs(10), "U knows the mesh", || u.routes_to("10.124.0.1"));
    assert_eq!(u.status()["exit"]["state"], "unknown_member");
    assert!(reach(&lan.hosts[4]).is_err(), "U fails closed without an exit");
    wait_until(Duration::from_secs(25), "U's log names the typo", || {
        u.log_text().contains("--use-exit-node names no member of the mesh") && u.log_text().contains("xnode (")
    });
    drop(u);
    assert!(n.status()["exit"].is_null());
    assert!(ip_out(&lan.hosts[0], &["nft", "list", "tables"]).contains("weft-exit-weft0"));

    // X dies: M fails closed, nothing for the public address leaves its underlay.
    let pcap = dir.0.join("m-underlay.pcap");
    let dump = lan.hosts[1].capture("eth0", &format!("host {PUBLIC} or host {PUBLIC6}"), &pcap, None);
    let f_pcap = dir.0.join("f-underlay.pcap");
    let f_dump = lan.hosts[3].capture("eth0", &format!("dst host {PUBLIC}"), &f_pcap, None);
    drop(x);
    wait_until(Duration::from_secs(30), "M sees its exit gone", || m.status()["exit"]["state"] != "routing");
    for _ in 0..3 {
        assert!(reach(&lan.hosts[1]).is_err(), "M reached the public server with its exit gone");
        assert!(reach6(&lan.hosts[1]).is_err(), "M reached the public server over IPv6 with its exit gone");
    }
    stop_capture(dump);
    let read = |p: &std::path::Path| {
        let out = Command::new("tcpdump").args(["-n", "-r"]).arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let leaked = read(&pcap);
    assert!(leaked.trim().is_empty(), "M's traffic left by its underlay:\n{leaked}");
    // F asked for the fallback: its traffic now leaves by its own route (which the
    // same capture sees: the check above can fail).
    wait_until(Duration::from_secs(30), "F sees its exit gone", || f.status()["exit"]["state"] != "routing");
    wait_until(Duration::from_secs(5), "F's rules are gone", || {
        !ip_out(&lan.hosts[3], &["ip", "rule", "list"]).contains("30566")
    });
    let _ = reach(&lan.hosts[3]);
    stop_capture(f_dump);
    assert!(!read(&f_pcap).trim().is_empty(), "F's traffic did not fall back to its own route");
    assert!(ip_out(&lan.hosts[0], &["nft", "list", "tables"]).contains("weft-exit-weft0"), "killed: its table stays");

    // M stops: its rules and table go with it.
    let mut m = m;
    m.terminate();
    for family in ["-4", "-6"] {
        assert!(!ip_out(&lan.hosts[1], &["ip", family, "rule", "list"]).contains("30566"), "{family}");
        assert!(
            ip_out(&lan.hosts[1], &["ip", family, "route", "show", "table", "30566"]).trim().is_empty(),
            "{family}"
        );
    }
    drop(n);
}

#[test]
fn an_exit_lets_no_one_in_and_members_reach_neither_its_lan_nor_metadata() {
    require_root();
    let lan = Lan::new(2);
    let (router, public) = upstream(&lan.hosts[0]);
    // X's private LAN (a docker or libvirt bridge, an office network) with a server.
    let office = Netns::new();
    link(&lan.hosts[0], "lan1", "10.9.9.1/24", &office, "eth0", "10.9.9.2/24");
    office.exec_ok(&["ip", "route", "add", "default", "via", "10.9.9.1"]);
    let seen_public = public_server(&public);
    let seen_office = serve(&office, &["10.9.9.2:8080".to_owned()]);
    let seen_metadata = serve(&router, &["169.254.169.254:8080".to_owned()]);
    let dir = TempDir::new();
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let x = Node::start(&lan.hosts[0], &dir.0, "x", &args(0, "10.124.0.1/24", &peer, &["--exit-node"]));
    let m = Node::start(&lan.hosts[1], &dir.0, "m", &args(1, "10.124.0.2/24", &peer, &["--use-exit-node", "xnode"]));
    wait_until(Duration::from_secs(10), "M routes through X", || m.status()["exit"]["state"] == "routing");
    // The internet works (so every refusal below is the exit's doing).
    let said = reach(&lan.hosts[1]).expect("M reaches the public server through X");
    assert!(said.starts_with("198.51.100.2:"), "the server saw {said}");
    assert_eq!(seen_public.lock().unwrap().len(), 1);

    // Members reach neither X's LAN nor the metadata service behind its gateway.
    for at in ["10.9.9.2:8080", "169.254.169.254:8080"] {
        assert!(reach_at(&lan.hosts[1], at).is_err(), "M reached {at} through the exit");
    }
    assert!(seen_office.lock().unwrap().is_empty() && seen_metadata.lock().unwrap().is_empty());
    // X's data path refused them before its kernel saw them.
    let drops = x.status()["drops"]["forbidden_destination"].as_u64().unwrap_or(0);
    assert!(drops >= 2, "X did not count the forbidden destinations: {}", x.status()["drops"]);

    // Someone on X's upstream routes the overlay via X and calls a member: refused.
    let listener = lan.hosts[1].within(|| TcpListener::bind("10.124.0.2:7000").unwrap());
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            let _ = c.write_all(b"member");
        }
    });
    router.exec_ok(&["ip", "route", "add", "10.124.0.0/24", "via", "198.51.100.2"]);
    assert!(reach_at(&router, "10.124.0.2:7000").is_err(), "the upstream reached a member through the exit");
    // The member's own listener works over the overlay (the refusal is the exit's).
    let x_ns = &lan.hosts[0];
    wait_until(Duration::from_secs(10), "X reaches M", || x.routes_to("10.124.0.2"));
    assert_eq!(reach_at(x_ns, "10.124.0.2:7000").as_deref(), Ok("member"));
    let rules = ip_out(x_ns, &["nft", "list", "table", "inet", "weft-exit-weft0"]);
    assert!(
        rules.contains("oifname \"weft0\" counter packets") && !rules.contains("oifname \"weft0\" counter packets 0 "),
        "{rules}"
    );
    drop((m, x));
}

#[test]
fn a_member_copying_the_exit_s_name_with_a_lower_id_takes_no_traffic() {
    require_root();
    let lan = Lan::new(3);
    let (_router, public) = upstream(&lan.hosts[0]);
    let _seen = public_server(&public);
    let dir = TempDir::new();
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let x = Node::start(&lan.hosts[0], &dir.0, "x", &args(0, "10.124.0.1/24", &peer, &["--exit-node"]));
    let m = Node::start(&lan.hosts[1], &dir.0, "m", &args(1, "10.124.0.2/24", &peer, &["--use-exit-node", "xnode"]));
    wait_until(Duration::from_secs(10), "M routes through X", || m.status()["exit"]["state"] == "routing");
    let x_id = x.status()["node_id"].as_str().unwrap().to_owned();
    assert_eq!(m.status()["exit"]["pinned"], x_id.as_str());
    // C calls itself xnode too, offers an exit, and ground an id below X's.
    let c_id = key_below(&dir.0, "c", &x_id);
    let mut c_args = args(2, "10.124.0.3/24", &peer, &["--exit-node"]);
    let at = c_args.iter().position(|a| *a == "nnode").unwrap();
    c_args[at] = "xnode";
    let _c = Node::start(&lan.hosts[2], &dir.0, "c", &c_args);
    wait_until(Duration::from_secs(15), "M knows C", || m.routes_to("10.124.0.3"));
    std::thread::sleep(Duration::from_secs(2));
    let e = &m.status()["exit"];
    assert_eq!((e["state"].as_str(), e["node_id"].as_str()), (Some("routing"), Some(x_id.as_str())), "{e}");
    assert!(m.status()["exit_offers"].to_string().contains(&c_id));
    let said = reach(&lan.hosts[1]).expect("M still reaches the internet through X");
    assert!(said.starts_with("198.51.100.2:"), "the server saw {said}");
}

#[test]
fn with_exit_allow_lan_members_reach_the_exit_s_lan() {
    require_root();
    let lan = Lan::new(2);
    let (_router, public) = upstream(&lan.hosts[0]);
    let office = Netns::new();
    link(&lan.hosts[0], "lan1", "10.9.9.1/24", &office, "eth0", "10.9.9.2/24");
    office.exec_ok(&["ip", "route", "add", "default", "via", "10.9.9.1"]);
    let _seen = public_server(&public);
    let seen_office = serve(&office, &["10.9.9.2:8080".to_owned()]);
    let dir = TempDir::new();
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let allow = ["--exit-node", "--exit-allow-lan"];
    let _x = Node::start(&lan.hosts[0], &dir.0, "x", &args(0, "10.124.0.1/24", &peer, &allow));
    let m = Node::start(&lan.hosts[1], &dir.0, "m", &args(1, "10.124.0.2/24", &peer, &["--use-exit-node", "xnode"]));
    wait_until(Duration::from_secs(10), "M routes through X", || m.status()["exit"]["state"] == "routing");
    let said = reach_at(&lan.hosts[1], "10.9.9.2:8080").expect("M reaches X's LAN with --exit-allow-lan");
    assert!(said.starts_with("10.9.9.1:"), "masqueraded as X: {said}");
    assert_eq!(seen_office.lock().unwrap().len(), 1);
}

#[test]
fn an_exit_node_that_stops_removes_its_rules_and_one_that_crashed_is_cleaned_at_start() {
    require_root();
    let lan = Lan::new(1);
    let dir = TempDir::new();
    let mut x = Node::start(&lan.hosts[0], &dir.0, "x", &args(0, "10.124.0.1/24", "", &["--exit-node"]));
    let tables = || ip_out(&lan.hosts[0], &["nft", "list", "tables"]);
    assert!(tables().contains("weft-exit-weft0"));
    let pid = x.pid().to_string();
    assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    wait_until(Duration::from_secs(5), "X is gone", || !x.is_running());
    assert!(tables().contains("weft-exit-weft0"), "a crash leaves the table");
    x.restart();
    assert_eq!(tables().matches("weft-exit-weft0").count(), 1, "{}", tables());
    x.terminate();
    assert!(!tables().contains("weft-exit-weft0"), "{}", tables());

    // A start that fails after the rules went in (its metrics port is taken) takes
    // them away again.
    let held = lan.hosts[0].within(|| TcpListener::bind("127.0.0.1:9177").unwrap());
    let mut argv = vec!["netns", "exec", &lan.hosts[0].name, weft_bin(), "up"];
    let state = dir.0.join("x2-state");
    let control = dir.0.join("x2.sock");
    argv.extend(args(0, "10.124.0.1/24", "", &["--exit-node", "--metrics", "127.0.0.1:9177"]));
    argv.extend(["--state-dir", state.to_str().unwrap(), "--control", control.to_str().unwrap()]);
    let out = Command::new("ip").args(&argv).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("9177"));
    assert!(!tables().contains("weft-exit-weft0"), "a failed start left its table: {}", tables());
    drop(held);
}

#[test]
fn bad_exit_settings_exit_2() {
    let cases: [(&[&str], &str); 4] = [
        (&["--exit-node", "--use-exit-node", "other"], "--exit-node"),
        (&["--hostname", "me", "--use-exit-node", "me"], "names this node"),
        (&["--use-exit-node", ""], "--use-exit-node"),
        (&["--exit-allow-lan"], "--exit-node"),
    ];
    for (extra, says) in cases {
        let out = Command::new(weft_bin())
            .args(["up", "--network-name", "n", "--network-secret", "s", "-i", "10.0.0.1/24"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}

/// An exit whose access policy lets one group out: the member in it reaches the
/// internet through the exit, the other member asks for the same exit and is not
/// let out (`weft policy explain` on the exit says why).
#[test]
fn an_exit_with_a_policy_lets_only_its_group_out() {
    require_root();
    let lan = Lan::new(3);
    let (_router, public) = upstream(&lan.hosts[0]);
    let _seen = public_server(&public);
    let dir = TempDir::new();
    let pol = dir.0.join("exit-policy.toml");
    std::fs::write(
        &pol,
        "[groups]\ntravel = [\"mnode\"]\n\n[[allow]]\nfrom = [\"group:travel\"]\nto = [\"internet\"]\nproto = \"tcp\"\n",
    )
    .unwrap();
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let x = Node::start(
        &lan.hosts[0],
        &dir.0,
        "x",
        &args(0, "10.124.0.1/24", &peer, &["--exit-node", "--policy", pol.to_str().unwrap()]),
    );
    let m = Node::start(&lan.hosts[1], &dir.0, "m", &args(1, "10.124.0.2/24", &peer, &["--use-exit-node", "xnode"]));
    let n = Node::start(&lan.hosts[2], &dir.0, "n", &args(2, "10.124.0.3/24", &peer, &["--use-exit-node", "xnode"]));
    wait_until(Duration::from_secs(15), "both members route through X", || {
        m.status()["exit"]["state"] == "routing" && n.status()["exit"]["state"] == "routing"
    });
    // The exit compiles the group once it knows M's record (its 1 s tick).
    wait_until(Duration::from_secs(10), "the travel group reaches the internet", || reach(&lan.hosts[1]).is_ok());
    assert!(reach(&lan.hosts[2]).is_err(), "a member outside the group got out through the exit");
    let out = Command::new(weft_bin())
        .args(["policy", "explain", "nnode", &format!("{PUBLIC}:8080"), "--control"])
        .arg(&x.control)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("denied"), "{said}");
    assert!(x.status()["policy"]["denied"].as_u64().unwrap() > 0);
}
