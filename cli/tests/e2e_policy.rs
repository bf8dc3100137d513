//! End-to-end: an access policy on a member. The server takes from the admins TCP
//! 5201 and ping, nothing else and from nobody else; its own flows get their answers;
//! `weft policy explain` names the deciding rule; a policy changed by `weft reload`
//! keeps a running iperf3 stream it still allows and cuts one it no longer allows.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::process::{Child, Stdio};
use std::time::Duration;

use netns::{Lan, Netns, Node, TempDir, ping, require_root, wait_until, weft, weft_out, write_private};

const IPS: [&str; 5] = ["10.126.132.1", "10.126.132.2", "10.126.132.3", "10.126.132.4", "10.126.132.5"];
const NAMES: [&str; 5] = ["srv", "adm", "oth", "db", "web"];

fn policy(extra: &str) -> String {
    format!(
        r#"[hosts]
srv = "10.126.132.1"
adm = "10.126.132.2"
oth = "10.126.132.3"

[groups]
admins = ["adm"]

[[allow]]
from  = ["group:admins"]
to    = ["srv"]
proto = "tcp"
ports = ["5201"]

[[allow]]
from  = ["group:admins"]
to    = ["srv"]
proto = "icmp"
{extra}
[[test]]
from = "adm"
to   = "srv:5201"
allow = true

[[test]]
from = "oth"
to   = "srv:5201"
allow = false
"#
    )
}

/// Whether a TCP connection from `ns` to `addr:port` opens within 3 s.
fn connects_to(ns: &Netns, addr: &str, port: u16) -> bool {
    ns.cmd("timeout").args(["3", "bash", "-c", &format!("exec 3<>/dev/tcp/{addr}/{port}")]).status().unwrap().success()
}

fn connects(ns: &Netns, port: u16) -> bool {
    connects_to(ns, IPS[0], port)
}

/// iperf3 servers on `addr` in `ns`, ports 5201 and 5202, stopped on drop.
fn iperf_servers(ns: &Netns, addr: &str) -> Vec<Kill> {
    let servers = [5201u16, 5202]
        .iter()
        .map(|p| {
            let args = ["-s", "-B", addr, "-p", &p.to_string()];
            Kill(ns.cmd("iperf3").args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    servers
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_policy_lets_in_what_it_allows_and_the_answers_to_what_the_node_sends() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let pol = dir.0.join("policy.toml");
    write_private(&pol, &policy(""));
    let (ok, said) = weft_out(&["policy", "check", pol.to_str().unwrap()]);
    assert!(ok && said.contains("2 rule(s), 2 test(s) passed"), "{said}");
    // A policy whose test fails is refused, by the check and at start.
    let bad = dir.0.join("bad.toml");
    write_private(&bad, &policy("[[allow]]\nfrom = [\"oth\"]\nto = [\"*\"]\n"));
    let (ok, said) = weft_out(&["policy", "check", bad.to_str().unwrap()]);
    assert!(!ok && said.contains("test 2 fails: oth -> srv:5201 is allowed by rule 3"), "{said}");

    let cfg = dir.0.join("srv.toml");
    let base = format!(
        "network-name = \"policy\"\nnetwork-secret = \"policy secret\"\nipv4 = \"{}/24\"\nhostname = \"srv\"\nthreads = 1\nlisten = [\"udp://0.0.0.0:11010\"]\npolicy = \"{}\"\n",
        IPS[0],
        pol.display()
    );
    write_private(&cfg, &base);
    let srv = Node::start(&lan.hosts[0], &dir.0, "srv", &["--config", cfg.to_str().unwrap()]);
    let first = format!("udp://{}:11010", lan.addrs[0]);
    let others: Vec<Node> = (1..3)
        .map(|i| {
            let ip = format!("{}/24", IPS[i]);
            let args = [
                "--network-name",
                "policy",
                "--network-secret",
                "policy secret",
                "-i",
                &ip,
                "--hostname",
                NAMES[i],
                "--threads",
                "1",
                "-p",
                &first,
            ];
            Node::start(&lan.hosts[i], &dir.0, NAMES[i], &args)
        })
        .collect();
    wait_until(Duration::from_secs(20), "the members mesh", || {
        srv.peer_established(IPS[1]) && srv.peer_established(IPS[2])
    });
    let st = srv.status();
    assert_eq!(st["policy"]["rules"], 2, "{}", st["policy"]);
    let servers = iperf_servers(&lan.hosts[0], IPS[0]);

    assert!(ping(&lan.hosts[1], IPS[0]), "the admin pings the server");
    assert!(connects(&lan.hosts[1], 5201), "the admin reaches 5201");
    assert!(!connects(&lan.hosts[1], 5202), "the admin does not reach 5202");
    assert!(!ping(&lan.hosts[2], IPS[0]), "another member does not ping the server");
    assert!(!connects(&lan.hosts[2], 5201), "nor reach 5201");
    assert!(ping(&lan.hosts[0], IPS[2]), "the server's own ping to it gets its answers");
    let control = srv.control.to_str().unwrap().to_owned();
    let (ok, said) = weft_out(&["policy", "explain", "adm", "srv:5201", "--control", &control]);
    assert!(ok && said.contains("allowed by rule 1"), "{said}");
    let (ok, said) = weft_out(&["policy", "explain", "oth", "srv:5201", "--control", &control]);
    assert!(ok && said.contains("denied (no rule allows it"), "{said}");
    let p = srv.status()["policy"].clone();
    assert!(p["denied"].as_u64().unwrap() > 0 && p["hits"][0].as_u64().unwrap() >= 1, "{p}");
    assert!(srv.status()["drops"]["policy"].as_u64().unwrap_or(0) > 0, "{}", srv.status()["drops"]);
    // The admin sees which flows were denied: the admin's try at 5202 and the other
    // member's at 5201 and its ping, each once however many packets it took.
    let denials = p["recent_denials"].as_array().cloned().unwrap_or_default();
    let denied = |src: &str, proto: &str, port: Option<u64>| {
        denials.iter().any(|d| {
            d["src"] == src && d["dst"] == IPS[0] && d["proto"] == proto && port.is_none_or(|p| d["port"] == p)
        })
    };
    assert!(denied(IPS[1], "tcp", Some(5202)) && denied(IPS[2], "tcp", Some(5201)), "{p}");
    assert!(denied(IPS[2], "icmp", None), "{p}");
    assert!(!denied(IPS[1], "tcp", Some(5201)), "an allowed flow is listed: {p}");
    let (ok, said) = weft_out(&["policy", "denials", "--control", &control]);
    assert!(ok && said.contains(&format!("oth ({})", IPS[2])) && said.contains("5202"), "{said}");

    // A new version that still allows the admin's stream and now lets the other
    // member ping: the stream lives on, the ping passes.
    let stream = |secs: &str| {
        lan.hosts[1]
            .cmd("iperf3")
            .args(["-c", IPS[0], "-p", "5201", "-t", secs, "-J"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let run = stream("4");
    std::thread::sleep(Duration::from_secs(1));
    write_private(&pol, &policy("[[allow]]\nfrom = [\"oth\"]\nto = [\"srv\"]\nproto = \"icmp\"\n"));
    let (ok, said) = weft_out(&["reload", "--control", &control]);
    assert!(ok && said.contains("access policy"), "{said}");
    let out = run.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sent = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(out.status.success() && sent > 1_000_000, "the allowed stream died: {v}");
    assert!(ping(&lan.hosts[2], IPS[0]), "the new rule lets the other member ping");

    // A version without the admins' TCP rule cuts the running stream within a second.
    let rx = |n: &Node| n.peer(IPS[1]).map_or(0, |p| p["rx_bytes"].as_u64().unwrap_or(0));
    let at = rx(&srv);
    let run = Kill(stream("8"));
    wait_until(Duration::from_secs(5), "the second stream runs", || rx(&srv) > at + 5_000_000);
    let text = policy("").replace("ports = [\"5201\"]", "ports = [\"5203\"]").replace(
        "[[test]]\nfrom = \"adm\"\nto   = \"srv:5201\"\nallow = true",
        "[[test]]\nfrom = \"adm\"\nto   = \"srv:5201\"\nallow = false",
    );
    write_private(&pol, &text);
    let denied_before = srv.status()["policy"]["denied"].as_u64().unwrap();
    let (ok, said) = weft_out(&["reload", "--control", &control]);
    assert!(ok, "{said}");
    std::thread::sleep(Duration::from_secs(1));
    let denied_after = srv.status()["policy"]["denied"].as_u64().unwrap();
    assert!(
        denied_after > denied_before + 10,
        "the cut stream's packets are dropped: {denied_before} -> {denied_after}"
    );
    drop(run);
    assert!(!connects(&lan.hosts[1], 5201), "a new connection is refused too");
    drop(servers);
    drop(others);
}

/// A network with an authority, five members: a policy the authority signs, handed to
/// one member, reaches the other three online within seconds and the one that was
/// offline from the first member it meets; each enforces it with the groups of the
/// members' certificates.
#[test]
fn a_signed_policy_handed_to_one_member_reaches_every_member_and_uses_certificate_groups() {
    require_root();
    let lan = Lan::new(5);
    let dir = TempDir::new();
    let key = dir.0.join("auth.key").to_str().unwrap().to_owned();
    let authority = weft(&["authority", "init", "--out", &key]);
    let certify = |i: usize, groups: &str| {
        let id = weft(&["id", "--state-dir", dir.0.join(format!("{}-state", NAMES[i])).to_str().unwrap()]);
        let ip = format!("{}/24", IPS[i]);
        let mut a = vec!["authority", "sign", "--key", &key, "--node-id", &id, "--name", NAMES[i], "--ipv4", &ip];
        if !groups.is_empty() {
            a.extend(["--groups", groups]);
        }
        weft(&a)
    };
    let certs = [certify(0, "servers"), certify(1, "admins"), certify(2, ""), certify(3, "servers"), certify(4, "")];
    let first = format!("udp://{}:11010", lan.addrs[0]);
    let start = |i: usize| {
        let mut a = vec!["--network-name", "policy", "--network-secret", "policy secret", "--threads", "1"];
        a.extend(["--authority", authority.as_str(), "--certificate", certs[i].as_str()]);
        if i != 0 {
            a.extend(["-p", first.as_str()]);
        }
        Node::start(&lan.hosts[i], &dir.0, NAMES[i], &a)
    };
    let srv = start(0);
    let adm = start(1);
    let mut oth = start(2);
    let db = start(3);
    let web = start(4);
    wait_until(Duration::from_secs(30), "the five members mesh", || IPS[1..].iter().all(|ip| srv.peer_established(ip)));
    assert!(ping(&lan.hosts[2], IPS[0]), "no policy yet: everyone pings");
    oth.stop();

    let pol = dir.0.join("signed.toml");
    write_private(&pol, "[[allow]]\nfrom = [\"group:admins\"]\nto = [\"*\"]\nproto = \"icmp\"\n");
    let signed = weft(&[
        "authority",
        "sign-policy",
        "--key",
        &key,
        "--network-name",
        "policy",
        pol.to_str().unwrap(),
        "--policy-version",
        "7",
    ]);
    assert!(signed.starts_with("weft-policy:"), "{signed}");
    let pushed = std::time::Instant::now();
    let said = weft(&["policy", "push", &signed, "--control", adm.control.to_str().unwrap()]);
    assert!(said.contains("version 7 in force"), "{said}");
    let took = wait_until(Duration::from_secs(10), "the server takes the policy from the admin", || {
        srv.status()["policy"]["version"] == "7"
    });
    eprintln!(
        "a signed policy pushed to one member was in force on another {took:?} later ({:?} since the push)",
        pushed.elapsed()
    );
    assert_eq!(srv.status()["policy"]["source"], "signed by the authority, version 7");
    let all = wait_until(Duration::from_secs(10), "every member online takes it", || {
        [&db, &web].iter().all(|n| n.status()["policy"]["version"] == "7")
    });
    eprintln!("in force on all four online members {:?} after the push", pushed.elapsed().max(all));
    assert!(ping(&lan.hosts[1], IPS[3]), "the admins ping db");
    assert!(!ping(&lan.hosts[4], IPS[3]), "web (no group) does not ping db");
    assert!(ping(&lan.hosts[1], IPS[0]), "the admins (a certificate group) ping the server");

    // The member that was offline learns it from the first member it meets.
    oth.restart();
    wait_until(Duration::from_secs(20), "the returning member holds the policy", || {
        oth.try_status().is_some_and(|s| s["policy"]["version"] == "7")
    });
    assert!(oth.state.join("policy").exists(), "it keeps the signed policy in its state directory");
    assert!(!ping(&lan.hosts[2], IPS[0]), "a member outside the group does not ping the server");
    // Until its records arrive (the next summary exchange, within 5 s) it knows no
    // member's groups: closed, not open.
    wait_until(Duration::from_secs(15), "the returning member lets the admins in", || ping(&lan.hosts[1], IPS[2]));
    // An older version is not taken.
    let old = weft(&[
        "authority",
        "sign-policy",
        "--key",
        &key,
        "--network-name",
        "policy",
        pol.to_str().unwrap(),
        "--policy-version",
        "6",
    ]);
    let said = weft(&["policy", "push", &old, "--control", srv.control.to_str().unwrap()]);
    assert!(said.contains("not newer"), "{said}");
}

/// A subnet router with a policy: the contractor reaches one port of one host on the
/// subnet behind it, and nothing else there; another member reaches nothing there.
#[test]
fn a_contractor_reaches_one_port_of_one_host_on_a_proxied_subnet() {
    require_root();
    let dir = TempDir::new();
    let (a, b, p, h) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
    netns::link(&a, "eth0", "192.0.2.1/24", &p, "eth0", "192.0.2.2/24");
    netns::link(&b, "eth0", "192.0.3.1/24", &p, "eth1", "192.0.3.2/24");
    netns::link(&p, "lan", "172.16.5.1/24", &h, "eth0", "172.16.5.2/24");
    h.exec_ok(&["ip", "route", "add", "default", "via", "172.16.5.1"]);
    let pol = dir.0.join("router.toml");
    write_private(
        &pol,
        "[[allow]]\nfrom = [\"contractor\"]\nto = [\"172.16.5.2\"]\nproto = \"tcp\"\nports = [\"5201\"]\n\n\
         [[test]]\nfrom = \"contractor\"\nto = \"172.16.5.2:5201\"\nallow = true\n\
         [hosts]\ncontractor = \"10.126.133.1\"\n",
    );
    let net = ["--network-name", "subnet-policy", "--network-secret", "subnet policy secret", "--threads", "1"];
    fn with<'a>(net: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        net.iter().chain(extra).copied().collect()
    }
    let router = Node::start(
        &p,
        &dir.0,
        "router",
        &with(
            &net,
            &[
                "-i",
                "10.126.133.9/24",
                "--hostname",
                "router",
                "--proxy-network",
                "172.16.5.0/24",
                "--policy",
                pol.to_str().unwrap(),
            ],
        ),
    );
    let con = Node::start(
        &a,
        &dir.0,
        "con",
        &with(&net, &["-i", "10.126.133.1/24", "--hostname", "contractor", "-p", "udp://192.0.2.2:11010"]),
    );
    let other = Node::start(
        &b,
        &dir.0,
        "other",
        &with(&net, &["-i", "10.126.133.2/24", "--hostname", "other", "-p", "udp://192.0.3.2:11010"]),
    );
    let learned = |n: &Node| {
        n.status()["routes"].as_array().is_some_and(|r| {
            r.iter().any(|r| r["proxied"].as_array().is_some_and(|p| p.iter().any(|x| x == "172.16.5.0/24")))
        })
    };
    wait_until(Duration::from_secs(20), "both members learn the subnet", || learned(&con) && learned(&other));
    let _servers = iperf_servers(&h, "172.16.5.2");
    let reaches = |ns: &Netns, port: u16| connects_to(ns, "172.16.5.2", port);
    assert!(reaches(&a, 5201), "the contractor reaches the web port on the subnet");
    assert!(!reaches(&a, 5202), "but not another port");
    assert!(!ping(&a, "172.16.5.2"), "nor ping");
    assert!(!reaches(&b, 5201), "another member reaches nothing there");
    assert!(router.status()["policy"]["denied"].as_u64().unwrap() > 0);
    drop(con);
    drop(other);
}
