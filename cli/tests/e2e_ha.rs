//! End-to-end: routers people can depend on. Two members whose certificates grant the
//! same subnet both proxy it; a member pings a host on that subnet (which has no
//! route back to the overlay) every 200 ms while the primary router is killed,
//! restarted and the other one killed: the longest time without an answer stays
//! within 3 s, the member moves once and back once (no flapping). A router whose
//! `--proxy-health` target stops answering (a ping, then a TCP port) withdraws the
//! subnet, and members move to the other router. Two exits in order of preference: the member moves to the second
//! when the first dies, and with neither its internet traffic fails closed.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netns::{Lan, Netns, Node, TempDir, ip, link, ping, require_root, wait_until, weft};

const SUBNET: &str = "192.168.77.0/24";
const HOST: &str = "192.168.77.2";
/// A TCP port on the site's host that r2's health check connects to.
const HEALTH_PORT: u16 = 8443;

/// Certificates for `names` from a new authority, each with `--subnet`/`--exit` as
/// `grants` says; returns the authority and each member's certificate.
fn certify(dir: &TempDir, names: &[&str], ips: &[&str], grants: &[&[&str]]) -> (String, Vec<String>) {
    let key = dir.0.join("authority.key").to_str().unwrap().to_owned();
    let authority = weft(&["authority", "init", "--out", &key]);
    let certs = names
        .iter()
        .zip(ips)
        .zip(grants)
        .map(|((n, ip), g)| {
            let id = weft(&["id", "--state-dir", dir.0.join(format!("{n}-state")).to_str().unwrap()]);
            let ip = format!("{ip}/24");
            let mut a = vec!["authority", "sign", "--key", &key, "--node-id", &id, "--name", n, "--ipv4", &ip];
            a.extend_from_slice(g);
            weft(&a)
        })
        .collect();
    (authority, certs)
}

fn net_args(network: &str, authority: &str, cert: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--network-name", network, "--network-secret", "ha secret", "--threads", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(["--authority".into(), authority.into(), "--certificate".into(), cert.into()]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn start(ns: &Netns, dir: &TempDir, name: &str, args: &[String]) -> Node {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    Node::start(ns, &dir.0, name, &a)
}

/// The router `m` says is primary for `SUBNET`, if any.
fn primary(m: &Node) -> Option<String> {
    let st = m.try_status()?;
    let subnet = st["subnets"].as_array()?.iter().find(|s| s["subnet"] == SUBNET)?.clone();
    subnet["routers"]
        .as_array()?
        .iter()
        .find(|r| r["state"] == "primary")
        .map(|r| r["hostname"].as_str().unwrap_or("").to_owned())
}

/// `ping` every 200 ms with timestamps, until killed.
fn pinger(ns: &Netns, to: &str) -> Child {
    ns.cmd("ping")
        .args(["-D", "-i", "0.2", "-W", "1", to])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Stops the pinger; returns the longest time without an answer (between two answers,
/// or from the last one to the end) and how many came.
fn longest_gap(mut p: Child) -> (Duration, usize) {
    let end = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    Command::new("kill").args(["-INT", &p.id().to_string()]).status().unwrap();
    let mut out = String::new();
    p.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let _ = p.wait();
    let stamps: Vec<f64> = out
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect();
    let gap = stamps.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    // An outage at the end counts too (a ping's answer is stamped when it arrives).
    let tail = stamps.last().map_or(0.0, |last| end - last);
    (Duration::from_secs_f64(gap.max(tail).max(0.0)), stamps.len())
}

#[test]
fn a_subnet_keeps_answering_while_its_routers_come_and_go() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    // The site: one LAN (a bridge in the host's namespace) with both routers on it; the
    // host has no route to the overlay.
    let site = Netns::new();
    site.exec_ok(&["ip", "link", "add", "br0", "type", "bridge"]);
    site.exec_ok(&["ip", "addr", "add", &format!("{HOST}/24"), "dev", "br0"]);
    site.exec_ok(&["ip", "link", "set", "br0", "up"]);
    for (i, addr) in ["192.168.77.11/24", "192.168.77.12/24"].iter().enumerate() {
        let port = format!("r{i}");
        ip(&[
            "link",
            "add",
            "lan0",
            "netns",
            &lan.hosts[i].name,
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &site.name,
        ]);
        lan.hosts[i].exec_ok(&["ip", "addr", "add", addr, "dev", "lan0"]);
        lan.hosts[i].exec_ok(&["ip", "link", "set", "lan0", "up"]);
        site.exec_ok(&["ip", "link", "set", &port, "master", "br0"]);
        site.exec_ok(&["ip", "link", "set", &port, "up"]);
    }
    let names = ["r1", "r2", "m"];
    let ips = ["10.126.160.1", "10.126.160.2", "10.126.160.3"];
    let router: &[&str] = &["--subnet", SUBNET];
    let (authority, certs) = certify(&dir, &names, &ips, &[router, router, &[]]);
    let m_addr = format!("udp://{}:11010", lan.addrs[2]);
    // The member listens; the routers dial it (a restarted router is back at once).
    let m =
        start(&lan.hosts[2], &dir, "m", &net_args("ha", &authority, &certs[2], &["--listen", "udp://0.0.0.0:11010"]));
    let r_args = |i: usize, extra: &[&str]| {
        let mut e = vec!["--proxy-network", SUBNET, "-p", &m_addr];
        e.extend_from_slice(extra);
        net_args("ha", &authority, &certs[i], &e)
    };
    // r1 is preferred; it pings the site's host. r2 connects to a TCP port there.
    let health_tcp = format!("tcp://{HOST}:{HEALTH_PORT}");
    let service = site.within(|| TcpListener::bind((HOST, HEALTH_PORT)).unwrap());
    std::thread::spawn(move || service.incoming().for_each(drop));
    let r1_args = r_args(0, &["--router-priority", "200", "--proxy-health", HOST]);
    let r2_args = r_args(1, &["--proxy-health", &health_tcp]);
    let mut r1 = start(&lan.hosts[0], &dir, "r1", &r1_args);
    let mut r2 = start(&lan.hosts[1], &dir, "r2", &r2_args);
    wait_until(Duration::from_secs(20), "the member routes the subnet through r1", || {
        primary(&m).as_deref() == Some("r1") && m.peer_established(ips[1])
    });
    wait_until(Duration::from_secs(10), "the site's host answers through r1", || ping(&lan.hosts[2], HOST));
    let routes = weft(&["routes", "--control", m.control.to_str().unwrap()]);
    assert!(routes.contains("SUBNET") && routes.contains("primary") && routes.contains("standby"), "{routes}");

    // The primary dies and comes back (WEFT_HA_ROUNDS times: bench/netns/failover.sh
    // takes the median of 10), then the other one dies; pings every 200 ms
    // throughout, the longest time without an answer measured per round.
    let rounds: u64 = std::env::var("WEFT_HA_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let p = pinger(&lan.hosts[2], HOST);
    let mut gaps = Vec::new();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_secs(2));
        let round_pinger = pinger(&lan.hosts[2], HOST);
        std::thread::sleep(Duration::from_secs(1));
        r1.stop();
        let moved =
            wait_until(Duration::from_secs(10), "the member moves to r2", || primary(&m).as_deref() == Some("r2"));
        std::thread::sleep(Duration::from_secs(2));
        let (gap, _) = longest_gap(round_pinger);
        r1 = start(&lan.hosts[0], &dir, "r1", &r1_args);
        let back =
            wait_until(Duration::from_secs(30), "the member moves back to r1", || primary(&m).as_deref() == Some("r1"));
        eprintln!(
            "failover round {round}: moved after {moved:?}, longest time without an answer {gap:?}; back {back:?} \
             after r1 restarted"
        );
        gaps.push(gap);
    }
    std::thread::sleep(Duration::from_secs(1));
    r2.stop();
    std::thread::sleep(Duration::from_secs(3));
    let (gap, answers) = longest_gap(p);
    gaps.sort();
    let st = m.status();
    eprintln!(
        "failover: median longest time without an answer {:?} over {rounds} rounds; over the whole run {gap:?} \
         ({answers} answers); failovers {}, failbacks {}",
        gaps[gaps.len() / 2],
        st["failovers"],
        st["failbacks"]
    );
    assert!(gap <= Duration::from_secs(3), "no answer for {gap:?}");
    assert!(answers > 20, "only {answers} answers");
    assert_eq!(
        (st["failovers"].as_u64(), st["failbacks"].as_u64()),
        (Some(rounds), Some(rounds)),
        "the routes flapped: {st}"
    );

    // Up but broken: r1 loses its LAN; its health check withdraws the subnet and the
    // member moves to r2 (running again); r1 announces it again once the LAN is back.
    r2 = start(&lan.hosts[1], &dir, "r2", &r2_args);
    wait_until(Duration::from_secs(20), "r2 stands by again", || {
        m.try_status().is_some_and(|s| {
            s["subnets"][0]["routers"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["hostname"] == "r2" && r["state"] == "standby"))
        })
    });
    lan.hosts[0].exec_ok(&["ip", "link", "set", "lan0", "down"]);
    let withdrawn =
        wait_until(Duration::from_secs(10), "r1 withdraws the subnet", || r1.status()["withdrawn"].is_string());
    let moved = wait_until(Duration::from_secs(5), "the member moves to r2", || primary(&m).as_deref() == Some("r2"));
    eprintln!("health: r1 withdrew {withdrawn:?} after its LAN went down; the member moved {moved:?} after that");
    assert!(ping(&lan.hosts[2], HOST), "the site's host does not answer through r2");
    lan.hosts[0].exec_ok(&["ip", "link", "set", "lan0", "up"]);
    wait_until(Duration::from_secs(15), "r1 is primary again", || {
        r1.status()["withdrawn"].is_null() && primary(&m).as_deref() == Some("r1")
    });
    assert!(ping(&lan.hosts[2], HOST), "the site's host does not answer through r1 again");

    // r2's TCP check fails (the site's host refuses the port): r2 withdraws the subnet
    // and the member lists r1 alone; once the port answers again, r2 stands by again.
    site.exec_ok(&["nft", "add", "table", "inet", "svc"]);
    site.exec_ok(&["nft", "add", "chain", "inet", "svc", "in", "{ type filter hook input priority 0; }"]);
    let port = HEALTH_PORT.to_string();
    site.exec_ok(&["nft", "add", "rule", "inet", "svc", "in", "tcp", "dport", &port, "reject", "with", "tcp", "reset"]);
    wait_until(Duration::from_secs(10), "r2 withdraws the subnet", || {
        r2.status()["withdrawn"].as_str().is_some_and(|w| w.contains(&port))
    });
    wait_until(Duration::from_secs(10), "the member no longer lists r2", || {
        m.try_status().is_some_and(|s| {
            s["subnets"][0]["routers"].as_array().is_some_and(|r| r.iter().all(|r| r["hostname"] != "r2"))
        })
    });
    site.exec_ok(&["nft", "delete", "table", "inet", "svc"]);
    // One status read decides both: r2 listed on standby beside a primary, and that
    // primary still r1.
    let mut routers = serde_json::Value::Null;
    wait_until(Duration::from_secs(10), "r2 stands by again", || {
        r2.status()["withdrawn"].is_null()
            && m.try_status().is_some_and(|s| {
                routers = s["subnets"][0]["routers"].clone();
                routers.as_array().is_some_and(|r| {
                    r.iter().any(|r| r["hostname"] == "r2" && r["state"] == "standby")
                        && r.iter().any(|r| r["state"] == "primary")
                })
            })
    });
    let primary_now =
        routers.as_array().and_then(|r| r.iter().find(|r| r["state"] == "primary")).map(|r| &r["hostname"]);
    let log: Vec<String> = m.log_text().lines().filter(|l| l.contains("router")).map(str::to_owned).collect();
    assert_eq!(
        primary_now,
        Some(&serde_json::json!("r1")),
        "r2's return moved the primary: {routers}\n{}",
        log.join("\n")
    );
    drop((r1, r2));
}

/// The public side for the exits: each exit's upstream link into one router, the
/// public server behind it.
fn upstream(exits: &[&Netns]) -> (Netns, Netns) {
    let (router, public) = (Netns::new(), Netns::new());
    for (i, x) in exits.iter().enumerate() {
        link(
            x,
            "pub0",
            &format!("198.51.100.{}/30", 4 * i + 2),
            &router,
            &format!("x{i}"),
            &format!("198.51.100.{}/30", 4 * i + 1),
        );
        x.exec_ok(&["ip", "route", "add", "default", "via", &format!("198.51.100.{}", 4 * i + 1)]);
    }
    link(&router, "srv", "203.0.113.1/24", &public, "eth0", "203.0.113.10/24");
    public.exec_ok(&["ip", "route", "add", "default", "via", "203.0.113.1"]);
    router.exec_ok(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
    (router, public)
}

/// Connects from `ns` to the public server; what it says it saw.
fn reach(ns: &Netns) -> Result<String, String> {
    ns.within(|| {
        let to: SocketAddr = "203.0.113.10:8080".parse().unwrap();
        let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(1)).map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).map_err(|e| e.to_string())?;
        Ok(s)
    })
}

/// The public server: tells each TCP client the address it came from.
fn serve(public: &Netns) {
    let l = public.within(|| TcpListener::bind("203.0.113.10:8080").unwrap());
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let from = c.peer_addr().unwrap();
            let _ = c.write_all(from.ip().to_string().as_bytes());
        }
    });
}

/// The exit `m` uses now, by host name.
fn exit_in_use(m: &Node) -> Option<String> {
    Some(m.try_status()?["exit"]["hostname"].as_str()?.to_owned())
}

#[test]
fn a_member_moves_to_its_next_exit_and_fails_closed_with_none() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let (_router, public) = upstream(&[&lan.hosts[0], &lan.hosts[1]]);
    serve(&public);
    // The member's own default route goes nowhere: a leak would have to use it.
    lan.hosts[2].exec_ok(&["ip", "route", "add", "default", "via", "192.0.2.254"]);
    let names = ["x1", "x2", "m"];
    let ips = ["10.126.161.1", "10.126.161.2", "10.126.161.3"];
    let exit: &[&str] = &["--exit"];
    let (authority, certs) = certify(&dir, &names, &ips, &[exit, exit, &[]]);
    let m_addr = format!("udp://{}:11010", lan.addrs[2]);
    let m = start(
        &lan.hosts[2],
        &dir,
        "m",
        &net_args("exits", &authority, &certs[2], &["--listen", "udp://0.0.0.0:11010", "--use-exit-node", "x1,x2"]),
    );
    let x_args = |i: usize| net_args("exits", &authority, &certs[i], &["--exit-node", "-p", &m_addr]);
    let mut x1 = start(&lan.hosts[0], &dir, "x1", &x_args(0));
    let mut x2 = start(&lan.hosts[1], &dir, "x2", &x_args(1));
    wait_until(Duration::from_secs(20), "the member goes out through x1", || {
        reach(&lan.hosts[2]).is_ok_and(|s| s == "198.51.100.2")
    });
    wait_until(Duration::from_secs(10), "both exits are candidates", || {
        m.status()["exit"]["candidates"].as_array().map(Vec::len) == Some(2)
    });

    // x1 dies (killed, no goodbye) while the member pings the internet every 200 ms:
    // out through x2 within 2 s.
    let p = pinger(&lan.hosts[2], "203.0.113.10");
    std::thread::sleep(Duration::from_secs(2));
    x1.stop();
    let moved =
        wait_until(Duration::from_secs(10), "the member moves to x2", || exit_in_use(&m).as_deref() == Some("x2"));
    wait_until(Duration::from_secs(10), "the member goes out through x2", || {
        reach(&lan.hosts[2]).is_ok_and(|s| s == "198.51.100.6")
    });
    std::thread::sleep(Duration::from_secs(1));
    let (gap, answers) = longest_gap(p);
    eprintln!("exit failover: moved to x2 {moved:?} after x1 died; longest time without an answer {gap:?}");
    assert!(gap <= Duration::from_secs(3), "no answer from the internet for {gap:?}");
    assert!(answers > 10, "only {answers} answers");
    // Neither: fails closed.
    x2.stop();
    wait_until(Duration::from_secs(10), "the exit is gone", || m.status()["exit"]["state"] != "routing");
    for _ in 0..3 {
        assert!(reach(&lan.hosts[2]).is_err(), "reached the internet with no exit");
    }
    // x1 returns: it is used again.
    x1 = start(&lan.hosts[0], &dir, "x1", &x_args(0));
    wait_until(Duration::from_secs(30), "the member goes out through x1 again", || {
        reach(&lan.hosts[2]).is_ok_and(|s| s == "198.51.100.2")
    });
    drop((x1, x2));
}

#[test]
fn an_automatic_exit_moves_on_and_falls_back_to_the_hosts_own_route() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    // The member has an internet link of its own too (198.51.100.10), for the fallback.
    let (_router, public) = upstream(&[&lan.hosts[0], &lan.hosts[1], &lan.hosts[2]]);
    serve(&public);
    let names = ["x1", "x2", "m"];
    let ips = ["10.126.162.1", "10.126.162.2", "10.126.162.3"];
    let exit: &[&str] = &["--exit"];
    let (authority, certs) = certify(&dir, &names, &ips, &[exit, exit, &[]]);
    let m_addr = format!("udp://{}:11010", lan.addrs[2]);
    let m_args = ["--listen", "udp://0.0.0.0:11010", "--use-exit-node", "auto", "--exit-fallback"];
    let m = start(&lan.hosts[2], &dir, "m", &net_args("auto", &authority, &certs[2], &m_args));
    // Before any exit is up, the fallback: out by the member's own route.
    wait_until(Duration::from_secs(10), "the member goes out by its own route", || {
        reach(&lan.hosts[2]).is_ok_and(|s| s == "198.51.100.10")
    });
    let x_args = |i: usize| net_args("auto", &authority, &certs[i], &["--exit-node", "-p", &m_addr]);
    let mut xs = vec![start(&lan.hosts[0], &dir, "x1", &x_args(0)), start(&lan.hosts[1], &dir, "x2", &x_args(1))];
    let seen_at = |name: &str| if name == "x1" { "198.51.100.2" } else { "198.51.100.6" };
    // `auto` takes the nearest exit this member may use, and lists both.
    wait_until(Duration::from_secs(20), "the member goes out through an exit", || {
        m.try_status().is_some_and(|s| s["exit"]["candidates"].as_array().map(Vec::len) == Some(2))
            && exit_in_use(&m).is_some_and(|x| reach(&lan.hosts[2]).is_ok_and(|s| s == seen_at(&x)))
    });
    let first = exit_in_use(&m).unwrap();
    let nearest = m.status()["exit"]["candidates"][0]["hostname"].as_str().unwrap().to_owned();
    assert_eq!(first, nearest, "auto did not take the first of its candidates");
    let (gone, other) = if first == "x1" { (0, "x2") } else { (1, "x1") };
    // The exit in use dies under traffic: the member moves to the other one.
    let p = pinger(&lan.hosts[2], "203.0.113.10");
    std::thread::sleep(Duration::from_secs(2));
    xs[gone].stop();
    let moved = wait_until(Duration::from_secs(10), "the member moves to the other exit", || {
        exit_in_use(&m).as_deref() == Some(other)
    });
    wait_until(Duration::from_secs(10), "the member goes out through the other exit", || {
        reach(&lan.hosts[2]).is_ok_and(|s| s == seen_at(other))
    });
    std::thread::sleep(Duration::from_secs(1));
    let (gap, _) = longest_gap(p);
    eprintln!(
        "auto exit: {first} first, moved to {other} {moved:?} after it died; longest time without an answer {gap:?}"
    );
    assert!(gap <= Duration::from_secs(3), "no answer from the internet for {gap:?}");
    // No exit left: out by the member's own route again (--exit-fallback).
    xs[1 - gone].stop();
    wait_until(Duration::from_secs(10), "the member falls back to its own route", || {
        reach(&lan.hosts[2]).is_ok_and(|s| s == "198.51.100.10")
    });
    let text = weft(&["status", "--control", m.control.to_str().unwrap()]);
    assert!(text.contains("own route while unreachable"), "{text}");
    drop(xs);
}
