//! End-to-end: a network with an authority. Members started with `--authority` and a
//! certificate (their addresses and names from it alone) mesh and ping; a node of this
//! release with the secret but no authority refuses them (`authority_required`) and
//! they hear why; a node of the previous release, which knows nothing of
//! certificates, is refused by them (`no_certificate`); a node whose certificate is
//! another node's, expired, or does not grant the address it is given does not start,
//! and says which.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::process::{Command, Stdio};
use std::time::Duration;

use netns::{Lan, Node, TempDir, ping, require_root, wait_until, weft, weft_bin};

const NET: [&str; 4] = ["--network-name", "e2e-authority", "--network-secret", "correct horse battery"];
const IPS: [&str; 3] = ["10.126.130.1", "10.126.130.2", "10.126.130.3"];

/// A certificate for the node whose state directory is `dir/NAME-state`.
fn certify(dir: &TempDir, key: &str, name: &str, ip: &str, expires: &str) -> String {
    certify_with(dir, key, name, ip, expires, &[])
}

/// [`certify`] with more flags of `weft authority sign` (`--issuer`).
fn certify_with(dir: &TempDir, key: &str, name: &str, ip: &str, expires: &str, extra: &[&str]) -> String {
    let id = weft(&["id", "--state-dir", dir.0.join(format!("{name}-state")).to_str().unwrap()]);
    let ip = format!("{ip}/24");
    let mut a = vec!["authority", "sign", "--key", key, "--node-id", &id, "--name", name, "--ipv4", &ip];
    a.extend(["--network-name", "e2e-authority", "--expires", expires]);
    a.extend_from_slice(extra);
    weft(&a)
}

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = NET.to_vec();
    a.extend(["--threads", "1"]);
    a.extend_from_slice(extra);
    a
}

/// Three hosts on a LAN, a directory for the nodes, and an authority: its key file and
/// its public key.
fn network() -> (Lan, TempDir, String, String) {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let key = dir.0.join("auth.key").to_str().unwrap().to_owned();
    let authority = weft(&["authority", "init", "--out", &key]);
    (lan, dir, key, authority)
}

#[test]
fn only_certified_members_mesh_and_each_refusal_is_named() {
    let (lan, dir, key, authority) = network();
    let key = key.as_str();
    let (cert_a, cert_b) = (certify(&dir, key, "n0", IPS[0], "1d"), certify(&dir, key, "n1", IPS[1], "1d"));
    let listen = |i: usize| format!("udp://{}:11010", lan.addrs[i]);

    let a = Node::start(
        &lan.hosts[0],
        &dir.0,
        "n0",
        &args(&["--authority", &authority, "--certificate", &cert_a, "--listen", &listen(0)]),
    );
    let b = Node::start(
        &lan.hosts[1],
        &dir.0,
        "n1",
        &args(&["--authority", &authority, "--certificate", &cert_b, "--listen", &listen(1), "--peer", &listen(0)]),
    );
    wait_until(Duration::from_secs(20), "the certified pair is up", || {
        a.peer_established(IPS[1]) && b.peer_established(IPS[0])
    });
    assert!(ping(&lan.hosts[0], IPS[1]) && ping(&lan.hosts[1], IPS[0]));
    let st = a.status();
    assert_eq!(st["authority"], authority.as_str(), "{st}");
    assert_eq!(st["overlay"], format!("{}/24", IPS[0]), "the address comes from the certificate");
    assert_eq!(st["hostname"], "n0");
    assert_eq!(st["certificate"]["name"], "n0");
    assert!(st["certificate"]["expires_in_s"].as_u64().unwrap() > 86_000, "{}", st["certificate"]);
    assert_eq!(a.peer(IPS[1]).unwrap()["hostname"], "n1");
    // A certificate valid for a day is within the day-ahead warning.
    let warned = (0..150).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        a.log_text().contains("this node's certificate expires in")
    });
    assert!(warned, "A did not warn that its certificate expires within a day:\n{}", a.log_text());

    // The secret without a certificate gets nothing, and both ends say why.
    let c = Node::start(
        &lan.hosts[2],
        &dir.0,
        "n2",
        &args(&["-i", &format!("{}/24", IPS[2]), "--listen", &listen(2), "--peer", &listen(0)]),
    );
    // C sees A's certificate in A's answer first and refuses it; A is told why.
    wait_until(Duration::from_secs(20), "C refuses A (authority required), A hears why", || {
        c.status()["handshake_failures"]["authority_required"].as_u64().unwrap_or(0) >= 1
            && a.status()["refused_handshakes"].to_string().contains("membership by certificate")
    });
    let why = c.status().to_string();
    assert!(why.contains("start it with --authority"), "{why}");
    assert!(a.peer(IPS[2]).is_none_or(|p| p["state"] != "established"), "{}", a.status()["peers"]);
    assert!(!ping(&lan.hosts[2], IPS[0]), "C reached A without a certificate");
    drop(c);

    // A node of the previous release (which knows nothing of certificates and refuses
    // nobody for them) with the secret: A refuses it for having no certificate.
    let previous =
        std::env::var("WEFT_PREVIOUS").expect("WEFT_PREVIOUS names the previous release (scripts/test.sh sets it)");
    let old = Node::start_binary(
        &lan.hosts[2],
        &dir.0,
        "old",
        &previous,
        &args(&["-i", &format!("{}/24", IPS[2]), "--listen", &listen(2), "--peer", &listen(0)]),
    );
    wait_until(Duration::from_secs(20), "A refuses the old node: no certificate", || {
        a.status()["handshake_failures"]["no_certificate"].as_u64().unwrap_or(0) >= 1
    });
    assert!(a.status()["refused_handshakes"].to_string().contains("has no member certificate"));
    assert!(!ping(&lan.hosts[2], IPS[0]), "a node without a certificate reached A");
    drop(old);

    // Certificates that cannot admit the node that holds them: refused at start, named.
    let refused = |name: &str, extra: &[&str], names: &str| {
        let state = dir.0.join(format!("{name}-state"));
        let mut all = args(&["--state-dir", state.to_str().unwrap(), "--authority", &authority]);
        all.extend_from_slice(extra);
        let out = lan.hosts[2].cmd(weft_bin()).arg("up").args(&all).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(names), "{name} should say {names:?}: {err}");
    };
    refused("n3", &["--certificate", &cert_b], "issued to another node key");
    refused("n1x", &["--certificate", &cert_b, "-i", &format!("{}/24", IPS[2])], "is not what the certificate grants");
    let short = certify(&dir, key, "n4", IPS[2], "1s");
    std::thread::sleep(Duration::from_millis(2100));
    refused("n4", &["--certificate", &short], "expired");
    refused("n5", &[], "needs this node's --certificate");
    refused("n6", &["--certificate", &cert_b, "--proxy-network", "192.168.99.0/24"], "not among the subnets");
    refused("n7", &["--certificate", &cert_b, "--exit-node"], "not let this node be an exit");
}

#[test]
fn a_revocation_reaches_every_member_including_one_that_was_offline() {
    let (lan, dir, key, authority) = network();
    let key = key.as_str();
    let certs: Vec<String> = (0..3).map(|i| certify(&dir, key, &format!("n{i}"), IPS[i], "1d")).collect();
    let listen = |i: usize| format!("udp://{}:11010", lan.addrs[i]);
    let start = |i: usize| {
        let mut extra = vec!["--authority", &authority, "--certificate", &certs[i]];
        let (l, p) = (listen(i), listen(0));
        let mut owned = vec![String::from("--listen"), l];
        if i != 0 {
            owned.extend(["--peer".to_owned(), p]);
        }
        extra.extend(owned.iter().map(String::as_str));
        Node::start(&lan.hosts[i], &dir.0, &format!("n{i}"), &args(&extra))
    };
    let a = start(0);
    let mut b = start(1);
    let c = start(2);
    wait_until(Duration::from_secs(20), "the three members mesh", || {
        a.peer_established(IPS[1]) && a.peer_established(IPS[2]) && b.routes_to(IPS[2])
    });
    assert!(ping(&lan.hosts[2], IPS[0]) && ping(&lan.hosts[2], IPS[1]));
    assert!(b.peer_established(IPS[2]), "B and C talk before the revocation");

    // B is offline while C is revoked at A.
    b.stop();
    let c_id = weft(&["id", "--state-dir", dir.0.join("n2-state").to_str().unwrap()]);
    let revocation = weft(&["authority", "revoke", "--key", key, &c_id]);
    let out =
        Command::new(weft_bin()).args(["revoke", "add", &revocation, "--control"]).arg(&a.control).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let took = wait_until(Duration::from_secs(5), "A closes C's sessions", || !a.peer_established(IPS[2]));
    eprintln!("A closed the revoked member's sessions {took:?} after `weft revoke add`");
    assert_eq!(a.status()["revocations"], serde_json::json!([c_id]));
    let reached = ping(&lan.hosts[2], IPS[0]);
    assert!(!reached, "the revoked member still reaches A: {}\n{}", a.status()["peers"], a.log_text());
    assert!(
        std::fs::read_to_string(a.state.join("revocations")).unwrap().contains(&revocation),
        "A keeps the revocation in its state directory"
    );

    // B comes back: it learns the revocation from A, the first member it meets, and
    // refuses C although C still holds a valid certificate.
    b.restart();
    wait_until(Duration::from_secs(20), "B learns the revocation from A", || {
        b.status()["revocations"] == serde_json::json!([c_id])
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(!b.peer_established(IPS[2]), "B has a session with the revoked member: {}", b.status()["peers"]);
    assert!(!ping(&lan.hosts[2], IPS[1]), "the revoked member reaches B");
    assert!(ping(&lan.hosts[1], IPS[0]), "B and A still talk");
    drop(c);
}

/// `weft up --join` on a machine that runs it and nothing else.
fn join_once(lan: &Lan, dir: &TempDir, name: &str, token: &str) -> (bool, String) {
    let state = dir.0.join(format!("{name}-state"));
    let out = lan.hosts[1]
        .cmd(weft_bin())
        .args(["up", "--join", token, "--state-dir", state.to_str().unwrap(), "--dev-name", "wj0"])
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_new_machine_joins_with_an_invite_alone_and_spent_revoked_or_expired_invites_are_refused() {
    let (lan, dir, key, authority) = network();
    let key = key.as_str();
    let cert_a = certify_with(&dir, key, "n0", IPS[0], "1d", &["--issuer"]);
    let cert_b = certify(&dir, key, "n1", IPS[1], "1d");
    let listen = |i: usize| format!("udp://{}:11010", lan.addrs[i]);
    // A issues (its certificate marks it an issuer); B is a member without the key.
    let a = Node::start(
        &lan.hosts[0],
        &dir.0,
        "n0",
        &args(&["--authority", &authority, "--certificate", &cert_a, "--authority-key", key, "--listen", &listen(0)]),
    );
    let b = Node::start(
        &lan.hosts[1],
        &dir.0,
        "n1",
        &args(&["--authority", &authority, "--certificate", &cert_b, "--listen", &listen(1), "--peer", &listen(0)]),
    );
    wait_until(Duration::from_secs(20), "the certified pair is up", || {
        a.peer_established(IPS[1]) && b.peer_established(IPS[0])
    });
    let invite = |extra: &[&str]| {
        let mut all = vec!["authority", "invite", "--key", key, "--network-name", "e2e-authority"];
        all.extend(["--network-secret", NET[3]]);
        all.extend_from_slice(extra);
        weft(&all)
    };
    // B first, which does not issue, then A: the new machine asks each in turn.
    let token = invite(&["-p", &listen(1), "-p", &listen(0), "--groups", "dev", "--uses", "1", "--expires", "1h"]);
    assert!(token.starts_with("weft-invite:"), "{token}");

    // The new machine: the token and nothing else (the harness adds only where its
    // state directory, control socket and log go).
    let mut c = Node::start(&lan.hosts[2], &dir.0, "n2", &["--join", &token, "--threads", "1"]);
    let st = c.status();
    let addr = st["overlay"].as_str().unwrap().split('/').next().unwrap().to_owned();
    assert!(addr.starts_with("10.126.130.") && addr != IPS[0] && addr != IPS[1], "{st}");
    assert_eq!(st["authority"], authority.as_str());
    assert_eq!(st["certificate"]["groups"], serde_json::json!(["dev"]), "{st}");
    wait_until(Duration::from_secs(20), "the joined machine reaches both members", || {
        c.peer_established(IPS[0]) && c.routes_to(IPS[1])
    });
    assert!(ping(&lan.hosts[2], IPS[0]) && ping(&lan.hosts[2], IPS[1]), "{}", c.log_text());
    assert!(ping(&lan.hosts[0], &addr), "A reaches the new member");
    let log = c.log_text();
    assert!(log.contains("does not issue certificates"), "B was asked first and said no:\n{log}");
    let ledger = std::fs::read_to_string(a.state.join("issued")).unwrap();
    assert_eq!(ledger.lines().count(), 2, "A keeps one issue in its ledger:\n{ledger}");

    // Restarted with the same token: the kept certificate, no second use.
    c.restart();
    wait_until(Duration::from_secs(20), "the joined machine is back", || c.peer_established(IPS[0]));
    assert_eq!(c.status()["overlay"], st["overlay"]);
    assert!(c.log_text().contains("joined before"), "{}", c.log_text());
    assert_eq!(std::fs::read_to_string(a.state.join("issued")).unwrap(), ledger);

    // A second machine with the spent token is refused, and told why.
    let (ok, err) = join_once(&lan, &dir, "n3", &token);
    assert!(!ok && err.contains("used up (1 of 1 uses)"), "{err}");

    // An invite revoked through the mesh (handed to B, carried to A) is refused.
    let many = invite(&["-p", &listen(0), "--uses", "0"]);
    let revocation = weft(&["authority", "revoke", "--key", key, "--invite", &many]);
    let out =
        Command::new(weft_bin()).args(["revoke", "add", &revocation, "--control"]).arg(&b.control).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until(Duration::from_secs(10), "A learns the invite's revocation", || {
        a.status()["revocations"].as_array().is_some_and(|r| !r.is_empty())
    });
    let (ok, err) = join_once(&lan, &dir, "n4", &many);
    assert!(!ok && err.contains("the invite was revoked"), "{err}");

    // An expired invite is refused.
    let short = invite(&["-p", &listen(0), "--expires", "1s"]);
    std::thread::sleep(Duration::from_millis(2100));
    let (ok, err) = join_once(&lan, &dir, "n5", &short);
    assert!(!ok && err.contains("the invite expired"), "{err}");
    // A token that is not one is a usage error naming it.
    let (ok, err) = join_once(&lan, &dir, "n6", "weft-invite:nonsense!");
    assert!(!ok && err.contains("invalid --join token"), "{err}");
}

#[test]
fn a_certificate_that_expires_while_its_sessions_are_up_stops_working_by_itself() {
    let (lan, dir, key, authority) = network();
    let key = key.as_str();
    let (cert_a, cert_b) = (certify(&dir, key, "n0", IPS[0], "1d"), certify(&dir, key, "n1", IPS[1], "20s"));
    let listen = |i: usize| format!("udp://{}:11010", lan.addrs[i]);
    let a = Node::start(
        &lan.hosts[0],
        &dir.0,
        "n0",
        &args(&["--authority", &authority, "--certificate", &cert_a, "--listen", &listen(0)]),
    );
    let b = Node::start(
        &lan.hosts[1],
        &dir.0,
        "n1",
        &args(&["--authority", &authority, "--certificate", &cert_b, "--listen", &listen(1), "--peer", &listen(0)]),
    );
    wait_until(Duration::from_secs(15), "the pair is up", || a.peer_established(IPS[1]) && b.peer_established(IPS[0]));
    assert!(ping(&lan.hosts[1], IPS[0]));
    // No restart, no rekey needed: the sessions end within the 10 s check after expiry.
    let took = wait_until(Duration::from_secs(40), "A cuts off the member whose certificate expired", || {
        !a.peer_established(IPS[1])
    });
    eprintln!("A closed the expired member's sessions {took:?} into the test");
    assert!(a.log_text().contains("a member's certificate expired"), "{}", a.log_text());
    std::thread::sleep(Duration::from_secs(3));
    assert!(!a.peer_established(IPS[1]), "the expired member got back in: {}", a.status()["peers"]);
    assert!(!ping(&lan.hosts[1], IPS[0]), "the expired member still reaches A");
    assert!(b.log_text().contains("this node's certificate has expired"), "B warns: {}", b.log_text());
}

#[test]
fn a_member_revoked_under_an_iperf3_stream_is_cut_off_everywhere_within_seconds() {
    require_root();
    let lan = Lan::new(4);
    let dir = TempDir::new();
    let key = dir.0.join("auth.key").to_str().unwrap().to_owned();
    let authority = weft(&["authority", "init", "--out", &key]);
    let ips = ["10.126.130.1", "10.126.130.2", "10.126.130.3", "10.126.130.4"];
    let certs: Vec<String> = (0..4).map(|i| certify(&dir, &key, &format!("n{i}"), ips[i], "1d")).collect();
    let listen = |i: usize| format!("udp://{}:11010", lan.addrs[i]);
    let nodes: Vec<Node> = (0..4)
        .map(|i| {
            let (l, p) = (listen(i), listen(0));
            let mut extra = vec!["--authority", authority.as_str(), "--certificate", certs[i].as_str(), "--listen", &l];
            if i != 0 {
                extra.extend(["--peer", &p]);
            }
            Node::start(&lan.hosts[i], &dir.0, &format!("n{i}"), &args(&extra))
        })
        .collect();
    wait_until(Duration::from_secs(20), "four members mesh", || (1..4).all(|i| nodes[0].peer_established(ips[i])));
    // Every member has a session with D (the one to be revoked); A streams to it.
    // n1 and n2 learn D from n0's records, a moment after n0's sessions are up.
    for i in 1..3 {
        wait_until(Duration::from_secs(15), &format!("n{i} reaches D"), || ping(&lan.hosts[i], ips[3]));
    }
    let mut server = lan.hosts[3].cmd("iperf3").args(["-s", "-B", ips[3]]).stdout(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut client = lan.hosts[0]
        .cmd("iperf3")
        .args(["-c", ips[3], "-t", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "the stream to D runs", || {
        nodes[0].peer(ips[3]).is_some_and(|p| p["tx_bytes"].as_u64().unwrap_or(0) > 20_000_000)
    });

    // Revoked at B; A (which streams) and C learn it through the mesh.
    let d_id = weft(&["id", "--state-dir", dir.0.join("n3-state").to_str().unwrap()]);
    let revocation = weft(&["authority", "revoke", "--key", &key, &d_id]);
    let given = std::time::Instant::now();
    let out = Command::new(weft_bin())
        .args(["revoke", "add", &revocation, "--control"])
        .arg(&nodes[1].control)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut gone = [None; 3];
    while gone.iter().any(Option::is_none) && given.elapsed() < Duration::from_secs(5) {
        for (i, g) in gone.iter_mut().enumerate() {
            if g.is_none() && !nodes[i].peer_established(ips[3]) {
                *g = Some(given.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = client.kill();
    let _ = client.wait();
    let _ = server.kill();
    let _ = server.wait();
    eprintln!(
        "sessions with the revoked member gone after `weft revoke add` at B: A {:?}, B {:?}, C {:?}",
        gone[0], gone[1], gone[2]
    );
    assert!(gone.iter().all(Option::is_some), "not every member cut D off within 5 s: {gone:?}");
    for (i, ip) in ips.iter().enumerate().take(3) {
        assert!(!ping(&lan.hosts[3], ip), "the revoked member still reaches n{i}");
    }
}
