//! End-to-end: rights come from keys, not from what a member says of itself (issue
//! 51). Without an authority: a member that copies another's host name, or names
//! itself after another's node id, gets none of its policy rights; a rule naming an
//! exit does not open the internet; a narrower or a wider prefix beside a subnet
//! router's is refused. With an authority: another network's signed policy is
//! refused; a signed policy whose test fails on a node leaves that node closed, not
//! open, and is not passed on; the last applied policy stays in force after an
//! authority rollover.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::time::Duration;

use netns::{Lan, Node, TempDir, ping, require_root, wait_until, weft, weft_out, write_private};

const OPEN: [&str; 4] = ["10.126.140.1", "10.126.140.2", "10.126.140.3", "10.126.140.4"];

#[test]
fn names_ids_exits_and_subnets_are_held_by_keys_not_claims() {
    require_root();
    let lan = Lan::new(5);
    let dir = TempDir::new();
    let first = format!("udp://{}:11010", lan.addrs[0]);
    let base = |ip: &str, name: &str| -> Vec<String> {
        ["--network-name", "claims", "--network-secret", "claims secret", "--threads", "1", "-p", &first]
            .iter()
            .map(|s| s.to_string())
            .chain(["-i".into(), format!("{ip}/24"), "--hostname".into(), name.into()])
            .collect()
    };
    let start = |i: usize, args: Vec<String>, name: &str| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        Node::start(&lan.hosts[i], &dir.0, name, &a)
    };
    // alice's key as `weft id` prints it (made before she starts), and her node id as
    // `weft peers` shows it.
    let alice_state = dir.0.join("alice-state");
    let alice_key = weft(&["id", "--state-dir", alice_state.to_str().unwrap()]);
    assert_eq!(alice_key.len(), 64, "{alice_key}");
    let key_bytes: Vec<u8> = (0..32).map(|i| u8::from_str_radix(&alice_key[2 * i..2 * i + 2], 16).unwrap()).collect();
    let alice_id: String = ring::digest::digest(&ring::digest::SHA256, &key_bytes).as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();

    // The server's policy names alice by host name (ping), by her key (tcp 22) and by
    // her node id (tcp 23); anyone may reach the server, an exit, on tcp 80.
    let pol = dir.0.join("srv-policy.toml");
    write_private(
        &pol,
        &format!(
            "[[allow]]\nfrom = [\"alice\"]\nto = [\"srv\"]\nproto = \"icmp\"\n\n\
             [[allow]]\nfrom = [\"{alice_key}\"]\nto = [\"srv\"]\nproto = \"tcp\"\nports = [\"22\"]\n\n\
             [[allow]]\nfrom = [\"{alice_id}\"]\nto = [\"srv\"]\nproto = \"tcp\"\nports = [\"23\"]\n\n\
             [[allow]]\nfrom = [\"*\"]\nto = [\"srv\"]\nproto = \"tcp\"\nports = [\"80\"]\n"
        ),
    );
    let mut srv_args: Vec<String> = base(OPEN[0], "srv");
    srv_args.retain(|a| a != "-p" && *a != first);
    let p = pol.to_str().unwrap().to_owned();
    srv_args.extend(["--listen".into(), "udp://0.0.0.0:11010".into(), "--exit-node".into(), "--policy".into(), p]);
    let srv = start(0, srv_args, "srv");
    let _alice = start(1, base(OPEN[1], "alice"), "alice");
    let mut rtr_args = base(OPEN[3], "rtr");
    rtr_args.extend(["--proxy-network".into(), "192.168.50.0/24".into()]);
    let rtr = start(4, rtr_args, "rtr");
    wait_until(Duration::from_secs(20), "alice and the router join", || {
        srv.peer_established(OPEN[1]) && srv.peer_established(OPEN[3])
    });
    assert_eq!(srv.peer(OPEN[1]).unwrap()["node_id"], alice_id.as_str());

    // Later members: one copies alice's name and proxies the lower half of the
    // router's LAN; one calls itself by alice's node id and proxies a wider prefix.
    let mut mal_args = base(OPEN[2], "alice");
    mal_args.extend(["--proxy-network".into(), "192.168.50.0/25".into()]);
    let _mal = start(2, mal_args, "mal");
    let mut mal2_args = base("10.126.140.5", &alice_id);
    mal2_args.extend(["--proxy-network".into(), "192.168.0.0/16".into()]);
    let _mal2 = start(3, mal2_args, "mal2");
    wait_until(Duration::from_secs(20), "the later members join", || {
        srv.peer_established(OPEN[2]) && srv.peer_established("10.126.140.5")
    });

    // The policy is recompiled each second as members come and go.
    let control = srv.control.to_str().unwrap().to_owned();
    let explain = |from: &str, to: &str| {
        let (ok, said) = weft_out(&["policy", "explain", from, to, "--control", &control]);
        assert!(ok, "{said}");
        said
    };
    wait_until(Duration::from_secs(10), "the server's policy knows the later members", || {
        explain("10.126.140.5", &format!("{}:22", OPEN[0])).contains("denied")
            && explain(OPEN[1], &format!("{}:22", OPEN[0])).contains("allowed")
    });
    assert!(ping(&lan.hosts[1], OPEN[0]), "alice pings the server");
    assert!(!ping(&lan.hosts[2], OPEN[0]), "the member that copied alice's name does not");
    let said = explain(OPEN[1], &format!("{}:22", OPEN[0]));
    assert!(said.contains("allowed by rule 2"), "alice's key as weft id prints it: {said}");
    let said = explain(OPEN[1], &format!("{}:23", OPEN[0]));
    assert!(said.contains("allowed by rule 3"), "alice's node id: {said}");
    for (who, port) in [(OPEN[2], 22), (OPEN[2], 23), ("10.126.140.5", 22), ("10.126.140.5", 23)] {
        let said = explain(who, &format!("{}:{port}", OPEN[0]));
        assert!(said.contains("denied"), "{who} -> {port}: {said}");
    }
    // `to = ["srv"]` on an exit is the exit's own addresses, not the internet.
    let said = explain(OPEN[1], &format!("{}:80", OPEN[0]));
    assert!(said.contains("allowed by rule 4"), "{said}");
    let said = explain(OPEN[1], "203.0.113.5:80");
    assert!(said.contains("denied"), "a rule naming an exit opened the internet: {said}");

    // The router holds 192.168.50.0/24: the narrower and the wider prefix are refused
    // on every node, with the reason.
    wait_until(Duration::from_secs(10), "the overlapping prefixes are refused", || {
        let refused = srv.status()["refused"].to_string();
        refused.contains("192.168.50.0/25: refused") && refused.contains("192.168.0.0/16: refused")
    });
    let refused = srv.status()["refused"].to_string();
    assert!(refused.contains("proxied first"), "{refused}");
    let routes = |ns: &netns::Netns| String::from_utf8_lossy(&ns.exec_ok(&["ip", "route", "show"]).stdout).into_owned();
    wait_until(Duration::from_secs(10), "the router's LAN is routed into the tunnel", || {
        routes(&lan.hosts[0]).contains("192.168.50.0/24")
    });
    let table = routes(&lan.hosts[0]);
    assert!(!table.contains("192.168.50.0/25") && !table.contains("192.168.0.0/16"), "{table}");
    let alice_refused = _alice.status()["refused"].to_string();
    assert!(alice_refused.contains("192.168.50.0/25: refused"), "alice too: {alice_refused}");
    drop(rtr);
}

const AUTH: [&str; 3] = ["10.126.141.1", "10.126.141.2", "10.126.141.3"];
const AUTH_NAMES: [&str; 3] = ["srv", "adm", "oth"];

#[test]
fn signed_policies_are_bound_to_their_network_applied_or_closed_and_outlive_a_rollover() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let key = dir.0.join("auth.key").to_str().unwrap().to_owned();
    let authority = weft(&["authority", "init", "--out", &key]);
    let key2 = dir.0.join("auth2.key").to_str().unwrap().to_owned();
    let authority2 = weft(&["authority", "init", "--out", &key2]);
    let certify = |k: &str, i: usize, groups: &str| {
        let id = weft(&["id", "--state-dir", dir.0.join(format!("{}-state", AUTH_NAMES[i])).to_str().unwrap()]);
        let ip = format!("{}/24", AUTH[i]);
        weft(&[
            "authority",
            "sign",
            "--key",
            k,
            "--node-id",
            &id,
            "--name",
            AUTH_NAMES[i],
            "--ipv4",
            &ip,
            "--groups",
            groups,
        ])
    };
    let certs = [certify(&key, 0, "servers"), certify(&key, 1, "admins"), certify(&key, 2, "others")];
    let first = format!("udp://{}:11010", lan.addrs[0]);
    let args = |i: usize, cert: &str, authorities: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["--network-name", "office", "--network-secret", "office secret", "--threads", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for au in authorities {
            a.extend(["--authority".into(), (*au).to_owned()]);
        }
        a.extend(["--certificate".into(), cert.to_owned()]);
        if i == 0 {
            a.extend(["--listen".into(), "udp://0.0.0.0:11010".into()]);
        } else {
            a.extend(["-p".into(), first.clone()]);
        }
        a
    };
    let start = |i: usize, a: &[String]| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Node::start(&lan.hosts[i], &dir.0, AUTH_NAMES[i], &a)
    };
    let both = [authority.as_str(), authority2.as_str()];
    let mut srv = start(0, &args(0, &certs[0], &both));
    let mut adm = start(1, &args(1, &certs[1], &both));
    let mut oth = start(2, &args(2, &certs[2], &both));
    wait_until(Duration::from_secs(30), "the members mesh", || {
        srv.peer_established(AUTH[1]) && srv.peer_established(AUTH[2])
    });

    // The same authority's policy for another network is refused, and goes nowhere.
    let pol = dir.0.join("p.toml");
    write_private(&pol, "[[allow]]\nfrom = [\"group:admins\"]\nto = [\"*\"]\nproto = \"icmp\"\n");
    let sign = |network: &str, version: &str| {
        weft(&[
            "authority",
            "sign-policy",
            "--key",
            &key,
            "--network-name",
            network,
            pol.to_str().unwrap(),
            "--policy-version",
            version,
        ])
    };
    let lab = sign("lab", "9");
    let (ok, said) = weft_out(&["policy", "push", &lab, "--control", adm.control.to_str().unwrap()]);
    assert!(!ok && said.contains("signed for network \"lab\""), "{said}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(srv.status()["policy"].is_null(), "{}", srv.status()["policy"]);
    assert!(ping(&lan.hosts[2], AUTH[0]), "no policy: oth pings srv");

    // A signed policy whose test fails on oth (kept in its state directory, as if it
    // arrived while it was down): oth denies every flow but its own, and passes the
    // policy to nobody.
    let bad = dir.0.join("bad.toml");
    write_private(
        &bad,
        "[[allow]]\nfrom = [\"group:admins\"]\nto = [\"*\"]\nproto = \"icmp\"\n\n\
         [[test]]\nfrom = \"10.126.141.99\"\nto = \"oth:22\"\nallow = true\n",
    );
    let bad_signed = weft(&[
        "authority",
        "sign-policy",
        "--key",
        &key,
        "--network-name",
        "office",
        bad.to_str().unwrap(),
        "--policy-version",
        "5",
    ]);
    oth.stop();
    write_private(&oth.state.join("policy"), &format!("weft-policy 1\n{bad_signed}\n"));
    oth.restart();
    wait_until(Duration::from_secs(20), "oth is back", || srv.peer_established(AUTH[2]));
    let st = oth.status();
    assert!(st["policy"]["refused"].as_str().is_some_and(|r| r.contains("test 1 fails")), "{}", st["policy"]);
    assert!(!ping(&lan.hosts[0], AUTH[2]), "a policy oth cannot apply left it open");
    assert!(ping(&lan.hosts[2], AUTH[0]), "oth's own flows get their answers");
    assert!(
        srv.status()["policy"].is_null(),
        "the policy oth could not apply was passed on: {}",
        srv.status()["policy"]
    );

    // A good version 7 reaches everyone, oth included (it replaces the refusal).
    let good = sign("office", "7");
    let said = weft(&["policy", "push", &good, "--control", adm.control.to_str().unwrap()]);
    assert!(said.contains("version 7 in force"), "{said}");
    wait_until(Duration::from_secs(10), "every member holds version 7", || {
        srv.status()["policy"]["version"] == "7" && oth.status()["policy"]["version"] == "7"
    });
    assert!(oth.status()["policy"]["refused"].is_null());
    let oth_control = oth.control.to_str().unwrap().to_owned();
    wait_until(Duration::from_secs(10), "oth's policy knows the admin", || {
        weft_out(&["policy", "explain", AUTH[1], AUTH[2], "--proto", "icmp", "--control", &oth_control])
            .1
            .contains("allowed")
    });
    assert!(ping(&lan.hosts[1], AUTH[2]), "the admin pings oth");
    assert!(!ping(&lan.hosts[2], AUTH[0]), "oth does not ping srv");

    // srv rolls over to the new authority only (adm gets a certificate of it too):
    // the policy srv applied stays in force until one of the new authority arrives.
    srv.stop();
    adm.stop();
    let srv_cert = certify(&key2, 0, "servers");
    let adm_cert = certify(&key2, 1, "admins");
    srv = start(0, &args(0, &srv_cert, &[authority2.as_str()]));
    adm = start(1, &args(1, &adm_cert, &both));
    wait_until(Duration::from_secs(20), "srv and adm are back", || srv.peer_established(AUTH[1]));
    assert_eq!(srv.status()["policy"]["version"], "7", "{}", srv.status()["policy"]);
    let srv_control = srv.control.to_str().unwrap().to_owned();
    wait_until(Duration::from_secs(10), "srv's policy knows the admin again", || {
        weft_out(&["policy", "explain", AUTH[1], AUTH[0], "--proto", "icmp", "--control", &srv_control])
            .1
            .contains("allowed")
    });
    assert!(ping(&lan.hosts[1], AUTH[0]), "the admin pings srv");
    drop(adm);
}

/// Peak resident memory of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn revocations_outlive_an_authority_rollover_and_65536_load_in_bounded_memory() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let key_a = dir.0.join("a.key").to_str().unwrap().to_owned();
    let key_b = dir.0.join("b.key").to_str().unwrap().to_owned();
    let auth_a = weft(&["authority", "init", "--out", &key_a]);
    let auth_b = weft(&["authority", "init", "--out", &key_b]);
    let names = ["gw", "x"];
    let ips = ["10.126.142.1", "10.126.142.2"];
    let ids: Vec<String> = names
        .iter()
        .map(|n| weft(&["id", "--state-dir", dir.0.join(format!("{n}-state")).to_str().unwrap()]))
        .collect();
    // Both members are certified by B; gw trusts A and B while A rolls over to B.
    let cert = |i: usize| {
        let ip = format!("{}/24", ips[i]);
        weft(&["authority", "sign", "--key", &key_b, "--node-id", &ids[i], "--name", names[i], "--ipv4", &ip])
    };
    let gw_cert = cert(0);
    let x_cert = cert(1);
    let net = ["--network-name", "roll", "--network-secret", "roll secret", "--threads", "1"];
    let gw_args = |authorities: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = net.iter().map(|s| s.to_string()).collect();
        for au in authorities {
            a.extend(["--authority".into(), (*au).to_owned()]);
        }
        a.extend(["--certificate".into(), gw_cert.clone(), "--listen".into(), "udp://0.0.0.0:11010".into()]);
        a
    };
    let start = |i: usize, a: &[String]| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Node::start(&lan.hosts[i], &dir.0, names[i], &a)
    };
    let mut gw = start(0, &gw_args(&[&auth_a, &auth_b]));
    let first = format!("udp://{}:11010", lan.addrs[0]);
    let mut x_args: Vec<String> = net.iter().map(|s| s.to_string()).collect();
    x_args.extend(["--authority".into(), auth_b.clone(), "--certificate".into(), x_cert, "-p".into(), first]);
    let _x = start(1, &x_args);
    wait_until(Duration::from_secs(20), "x joins", || gw.peer_established(ips[1]));

    // A revokes x's key; then gw trusts B alone: the revocation stays.
    let revocation = weft(&["authority", "revoke", "--key", &key_a, &ids[1]]);
    weft(&["revoke", "add", &revocation, "--control", gw.control.to_str().unwrap()]);
    wait_until(Duration::from_secs(5), "x is cut off", || !gw.peer_established(ips[1]));
    wait_until(Duration::from_secs(5), "gw keeps the revocation", || {
        std::fs::read_to_string(gw.state.join("revocations")).is_ok_and(|t| t.contains(revocation.trim()))
    });
    gw.stop();
    gw = start(0, &gw_args(&[&auth_b]));
    assert_eq!(gw.status()["revocations"].as_array().map(Vec::len), Some(1), "the revocation was dropped at start");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!gw.peer_established(ips[1]), "a key A revoked is back after the rollover to B");
    assert!(!ping(&lan.hosts[1], ips[0]), "x reaches gw");
    let kept = std::fs::read_to_string(gw.state.join("revocations")).unwrap();
    assert!(kept.contains(revocation.trim()), "the state file lost it: {kept}");

    // 65,536 kept revocations: gw starts, holds them all, in bounded memory.
    gw.stop();
    let a = weft_core::cert::AuthorityKey::from_seed([7; 32]);
    let mut text = kept;
    for i in 0..65_535u32 {
        let mut node = [0u8; 32];
        node[..4].copy_from_slice(&i.to_be_bytes());
        node[31] = 1;
        text.push_str(&weft_core::cert::Revocation::issue(&a, node, 1_000).to_text());
        text.push('\n');
    }
    write_private(&gw.state.join("revocations"), &text);
    let started = std::time::Instant::now();
    gw = start(0, &gw_args(&[&auth_b]));
    let took = started.elapsed();
    let count = gw.status()["revocations"].as_array().map_or(0, Vec::len);
    let peak = peak_rss_kib(gw.pid());
    eprintln!("65,536 kept revocations: control socket up after {took:?}, peak RSS {peak} KiB");
    assert_eq!(count, 65_536);
    assert!(peak < 256 * 1024, "peak RSS {peak} KiB with 65,536 revocations");
    assert!(!gw.peer_established(ips[1]));
}
