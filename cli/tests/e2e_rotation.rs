//! End-to-end: the network secret rotates live. Three members started from config
//! files with the old secret; pings run between them the whole time. Each member is
//! given `network-secret-next` by `weft reload`, and its peers' sessions move to the
//! next secret at their next handshake (rekeys every 3 s here); then each makes the
//! next secret its network secret, in turn. No ping is lost, the status says which
//! secret each peer uses, and at the end a node with only the old secret is shut out
//! while one with only the new one is let in.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use netns::{Lan, Node, TempDir, ping, require_root, wait_until, weft_bin};

const OLD: &str = "the old secret of this network";
const NEW: &str = "the new secret of this network";
const IPS: [&str; 4] = ["10.126.131.1", "10.126.131.2", "10.126.131.3", "10.126.131.4"];

fn write_config(path: &Path, i: usize, peer: Option<&str>, secret: &str, next: Option<&str>) {
    let mut text = format!(
        "network-name = \"rotation\"\nnetwork-secret = \"{secret}\"\nipv4 = \"{}/24\"\nthreads = 1\nlisten = [\"udp://0.0.0.0:11010\"]\n",
        IPS[i]
    );
    if let Some(n) = next {
        text.push_str(&format!("network-secret-next = \"{n}\"\n"));
    }
    if let Some(p) = peer {
        text.push_str(&format!("peer = [\"{p}\"]\n"));
    }
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn reload(n: &Node) -> String {
    let out = Command::new(weft_bin()).args(["reload", "--control"]).arg(&n.control).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "reload: {text}");
    text
}

/// Whether every established peer of `n` uses secret `which` and there are `count`.
fn all_use(n: &Node, count: usize, which: &str) -> bool {
    let st = n.status();
    let peers = st["peers"].as_array().unwrap();
    let up: Vec<_> = peers.iter().filter(|p| p["state"] == "established").collect();
    up.len() >= count && up.iter().all(|p| p["secret"] == which)
}

#[test]
fn the_secret_rotates_under_load_with_no_ping_lost() {
    require_root();
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let first = format!("udp://{}:11010", lan.addrs[0]);
    let cfgs: Vec<PathBuf> = (0..3).map(|i| dir.0.join(format!("n{i}.toml"))).collect();
    let peer_of = |i: usize| (i != 0).then_some(first.as_str());
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            write_config(&cfgs[i], i, peer_of(i), OLD, None);
            Node::start(
                &lan.hosts[i],
                &dir.0,
                &format!("n{i}"),
                &["--config", cfgs[i].to_str().unwrap(), "--rekey-after", "3"],
            )
        })
        .collect();
    wait_until(Duration::from_secs(20), "the three members mesh", || {
        nodes[0].peer_established(IPS[1]) && nodes[0].peer_established(IPS[2]) && nodes[2].routes_to(IPS[1])
    });
    // B and C make their session when traffic wants it.
    assert!(ping(&lan.hosts[2], IPS[1]));
    wait_until(Duration::from_secs(10), "B and C have a session", || {
        nodes[1].peer_established(IPS[2]) && nodes[2].peer_established(IPS[1])
    });
    assert!(all_use(&nodes[0], 2, "current"));

    // Pings the whole time: C to B (a session of their own) and B to A, 20 per second.
    let pings: Vec<_> = [(2, IPS[1]), (1, IPS[0])]
        .into_iter()
        .map(|(from, to)| {
            lan.hosts[from]
                .cmd("ping")
                .args(["-n", "-q", "-i", "0.05", "-c", "700", "-W", "1", to])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();

    // Phase one: every member accepts the next secret; sessions move to it as they
    // rekey.
    for (i, n) in nodes.iter().enumerate() {
        write_config(&cfgs[i], i, peer_of(i), OLD, Some(NEW));
        let said = reload(n);
        assert!(said.contains("network-secret-next accepted"), "{said}");
    }
    let took = wait_until(Duration::from_secs(20), "every session moves to the next secret", || {
        nodes.iter().all(|n| all_use(n, 2, "next"))
    });
    eprintln!("every session used the next secret {took:?} after the last reload");

    // Phase two: each makes it the network secret, one after another.
    for (i, n) in nodes.iter().enumerate() {
        write_config(&cfgs[i], i, peer_of(i), NEW, None);
        let said = reload(n);
        assert!(said.contains("is now the network secret"), "{said}");
        std::thread::sleep(Duration::from_secs(2));
    }
    wait_until(Duration::from_secs(20), "every session uses the (new) current secret", || {
        nodes.iter().all(|n| all_use(n, 2, "current"))
    });

    for p in pings {
        let out = p.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let summary = text.lines().find(|l| l.contains("packets transmitted")).unwrap_or_default().to_owned();
        eprintln!("ping during the rotation: {summary}");
        assert!(summary.contains("700 packets transmitted, 700 received"), "pings were lost: {text}");
    }

    // The old secret is shut out now; the new one is let in.
    let stale = dir.0.join("stale.toml");
    write_config(&stale, 3, Some(&first), OLD, None);
    let s = Node::start(
        &lan.hosts[1],
        &dir.0,
        "stale",
        &["--config", stale.to_str().unwrap(), "--dev-name", "ws0", "--listen", "udp://0.0.0.0:11011"],
    );
    std::thread::sleep(Duration::from_secs(4));
    assert!(!nodes[0].peer_established(IPS[3]), "a node with the old secret got in");
    drop(s);
    let fresh = dir.0.join("fresh.toml");
    write_config(&fresh, 3, Some(&first), NEW, None);
    let f = Node::start(
        &lan.hosts[1],
        &dir.0,
        "fresh",
        &["--config", fresh.to_str().unwrap(), "--dev-name", "wf0", "--listen", "udp://0.0.0.0:11012"],
    );
    wait_until(Duration::from_secs(20), "a node with the new secret joins", || f.peer_established(IPS[0]));
}
