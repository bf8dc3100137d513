//! End-to-end: meshes that mix this build with the previous release (the commit in
//! `packaging/previous-release`, built by `scripts/build-previous.sh`, whose path
//! `scripts/test.sh` passes in `WEFT_PREVIOUS`). Old–new direct on each transport,
//! new–old–new relayed through the old node (and old–new–old through the new one):
//! ping and a checksummed transfer each way, and status naming each peer's protocol.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::time::Duration;

use netns::{Lan, Node, TempDir, ping, require_root, transfer, wait_until};

const NET: [&str; 4] = ["--network-name", "e2e-mixed", "--network-secret", "correct horse battery"];
const IPS: [&str; 3] = ["10.126.128.1", "10.126.128.2", "10.126.128.3"];

/// The previous release's binary.
fn previous() -> String {
    match std::env::var("WEFT_PREVIOUS") {
        Ok(p) if !p.is_empty() => p,
        _ => panic!(
            "WEFT_PREVIOUS is not set: it names the previous release's weft (scripts/build-previous.sh builds it and prints its path; scripts/test.sh sets it)"
        ),
    }
}

/// The protocol version `bin --version` names (`weft 0.2.0 (abc1234) protocol 2`);
/// `None` for a release before 0.2.0, which had none.
fn protocol_of(bin: &str) -> Option<u64> {
    let out = std::process::Command::new(bin).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().rsplit_once(" protocol ").map(|(_, v)| v.parse().unwrap())
}

fn start(lan: &Lan, dir: &TempDir, i: usize, old: bool, extra: &[String]) -> Node {
    let mut args: Vec<String> = NET.iter().map(|s| (*s).to_owned()).collect();
    args.extend(["-i".into(), format!("{}/24", IPS[i]), "--threads".into(), "1".into()]);
    args.extend(extra.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let name = format!("n{i}");
    if old {
        Node::start_binary(&lan.hosts[i], &dir.0, &name, &previous(), &refs)
    } else {
        Node::start(&lan.hosts[i], &dir.0, &name, &refs)
    }
}

/// Ping and a checksummed transfer each way between hosts `i` and `j`.
fn both_ways(lan: &Lan, i: usize, j: usize, len: usize) {
    assert!(ping(&lan.hosts[i], IPS[j]), "ping {i} -> {j}");
    assert!(ping(&lan.hosts[j], IPS[i]), "ping {j} -> {i}");
    for (from, to) in [(i, j), (j, i)] {
        let (sent, got, _) = transfer(&lan.hosts[from], &lan.hosts[to], IPS[to], len);
        assert_eq!(sent, got, "transfer {from} -> {to} arrived corrupt");
    }
}

#[test]
fn the_previous_release_and_this_one_talk_directly_on_every_transport() {
    require_root();
    let _ = previous();
    for (scheme, port) in [("udp", 11010), ("tcp", 11010), ("ws", 11011), ("wss", 11012), ("quic", 11012)] {
        // Both roles: the old node dials the new one, then the new one dials the old.
        for old_dials in [true, false] {
            let lan = Lan::new(2);
            let dir = TempDir::new();
            let listen = |i: usize| format!("{scheme}://{}:{port}", lan.addrs[i]);
            let (dialler, listener) = if old_dials { (0, 1) } else { (1, 0) };
            let l = start(&lan, &dir, listener, listener == 0, &["--listen".into(), listen(listener)]);
            let d = start(
                &lan,
                &dir,
                dialler,
                dialler == 0,
                &["--listen".into(), listen(dialler), "--peer".into(), listen(listener)],
            );
            let (old, new) = if listener == 0 { (&l, &d) } else { (&d, &l) };
            wait_until(Duration::from_secs(20), &format!("{scheme}: the pair is up"), || {
                old.peer_established(IPS[1]) && new.peer_established(IPS[0])
            });
            both_ways(&lan, 0, 1, 4 << 20);
            // Each node names the protocol its peer speaks: the new node sees the
            // previous release's (none before 0.2.0, whose hello had no protocol field);
            // a previous release that knows the field sees ours.
            let p = new.peer(IPS[0]).unwrap();
            match protocol_of(&previous()) {
                Some(v) => assert_eq!(p["protocol"], v, "{scheme}: {p}"),
                None => assert!(p.get("protocol").is_none_or(serde_json::Value::is_null), "{scheme}: {p}"),
            }
            assert_eq!(p["transport"], scheme, "{scheme}: {p}");
            let ours = protocol_of(env!("CARGO_BIN_EXE_weft")).unwrap();
            assert_eq!(new.status()["protocol"], ours);
            if protocol_of(&previous()).is_some() {
                let q = old.peer(IPS[1]).unwrap();
                assert_eq!(q["protocol"], ours, "{scheme}: {q}");
            }
            if scheme == "udp" {
                // Each release's `weft status` reads the other's control socket (a GUI
                // or CLI of one release beside a daemon of the other during an upgrade).
                for (client, daemon) in [(previous(), new), (env!("CARGO_BIN_EXE_weft").to_owned(), old)] {
                    let out = std::process::Command::new(&client)
                        .args(["status", "--json", "--control"])
                        .arg(&daemon.control)
                        .output()
                        .unwrap();
                    assert!(
                        out.status.success(),
                        "{client} status against {}: {}",
                        daemon.control.display(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
        }
    }
}

#[test]
fn relays_of_either_release_carry_the_other() {
    require_root();
    let _ = previous();
    // A and C cannot reach each other (nftables in A); B relays. First B old, A and C
    // new; then B new, A and C old.
    for old_middle in [true, false] {
        let lan = Lan::new(3);
        let dir = TempDir::new();
        let listen = |i: usize| format!("udp://{}:11010", lan.addrs[i]);
        let b = start(&lan, &dir, 1, old_middle, &["--listen".into(), listen(1)]);
        let a = start(&lan, &dir, 0, !old_middle, &["--listen".into(), listen(0), "--peer".into(), listen(1)]);
        let c = start(&lan, &dir, 2, !old_middle, &["--listen".into(), listen(2), "--peer".into(), listen(1)]);
        for (ns, other) in [(&lan.hosts[0], &lan.addrs[2]), (&lan.hosts[2], &lan.addrs[0])] {
            ns.exec_ok(&["nft", "add", "table", "inet", "cut"]);
            ns.exec_ok(&["nft", "add", "chain", "inet", "cut", "o", "{ type filter hook output priority 0 ; }"]);
            ns.exec_ok(&["nft", "add", "rule", "inet", "cut", "o", "ip", "daddr", other, "drop"]);
        }
        wait_until(Duration::from_secs(30), "A and C route to each other through B", || {
            a.routes_to(IPS[2]) && c.routes_to(IPS[0])
        });
        both_ways(&lan, 0, 2, 2 << 20);
        let path = a.peer(IPS[2]).unwrap();
        assert_eq!(path["path"], "relay", "old middle {old_middle}: {path}");
        drop(b);
    }
}
