//! Headless UI tests: the real dashboard and worker thread against a control socket
//! served here (a std UnixListener answering one JSON line per connection) that replays
//! the status of a real node (tests/data/status.json, made by tests/data/record.sh).
//! egui_kittest drives frames and queries the accessibility tree; no GPU, no display.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../cli/tests/netns/mod.rs"]
mod netns;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eframe::egui::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use netns::TempDir;
use weft_control::{Reply, StatusJson};
use weft_gui::client::Client;
use weft_gui::ui::Dashboard;

const STATUS: &str = include_str!("data/status.json");

fn recorded() -> StatusJson {
    serde_json::from_str(STATUS).expect("tests/data/status.json is a StatusJson")
}

/// A node's control socket: answers `status` with the recording, `add-peer` with an
/// error and `remove-peer` with done, and remembers every request line.
struct FakeNode {
    path: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeNode {
    fn start(path: &Path) -> Self {
        Self::serving(path, recorded())
    }

    /// A node whose status is `status`.
    fn serving(path: &Path, status: StatusJson) -> Self {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (Arc::clone(&lines), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut line = String::new();
                if BufReader::new(&conn).read_line(&mut line).is_err() || line.is_empty() {
                    continue;
                }
                let req: serde_json::Value = serde_json::from_str(&line).unwrap();
                l.lock().unwrap().push(line.trim_end().to_owned());
                let reply = match req["cmd"].as_str() {
                    Some("status") => Reply::Status(Box::new(status.clone())),
                    Some("add-peer") => Reply::Error {
                        message: format!("bad peer URI `{}`: expected udp://HOST:PORT", req["uri"].as_str().unwrap()),
                    },
                    Some("remove-peer") => {
                        Reply::Done { message: format!("removed {}", req["peer"].as_str().unwrap()) }
                    }
                    _ => Reply::Error { message: "bad request".into() },
                };
                let mut text = serde_json::to_string(&reply).unwrap();
                text.push('\n');
                let _ = (&conn).write_all(text.as_bytes());
            }
        });
        Self { path: path.to_owned(), lines, stop, thread: Some(thread) }
    }

    /// Request lines other than status polls.
    fn actions(&self) -> Vec<String> {
        self.lines.lock().unwrap().iter().filter(|l| !l.contains(r#""cmd":"status""#)).cloned().collect()
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A scratch directory for sockets, removed on drop.
struct Scratch(TempDir);

impl Scratch {
    fn new() -> Self {
        Self(TempDir::new())
    }
    fn sock(&self) -> PathBuf {
        self.0.0.join("node.sock")
    }
}

fn harness(control: PathBuf) -> Harness<'static, Dashboard> {
    let dashboard = Dashboard::new(Client::spawn(control, || {}));
    Harness::builder().with_size([1280.0, 800.0]).build_ui_state(|ui, d: &mut Dashboard| d.show(ui), dashboard)
}

/// Steps frames until `cond` holds (the worker thread answers in real time).
fn wait_for(h: &mut Harness<'_, Dashboard>, what: &str, cond: impl Fn(&Harness<'_, Dashboard>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        h.step();
        if cond(h) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn has(h: &Harness<'_, Dashboard>, label: &str) -> bool {
    h.query_all_by_label(label).next().is_some()
}

fn count(h: &Harness<'_, Dashboard>, label: &str) -> usize {
    h.query_all_by_label(label).count()
}

/// The overlay cell of a member's row: its addresses, IPv6 after IPv4.
fn peer_overlay(status: &StatusJson, host: &str) -> String {
    let p = status.peers.iter().find(|p| p.hostname == host).unwrap_or_else(|| panic!("no {host} in the recording"));
    match &p.overlay6 {
        Some(a6) => format!("{} {a6}", p.overlay),
        None => p.overlay.clone(),
    }
}

#[test]
fn the_recorded_node_shows_its_overview_peers_and_routes() {
    let dir = Scratch::new();
    let _node = FakeNode::start(&dir.sock());
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the peers table", |h| has(h, "Peers (3)"));
    let st = recorded();

    // Overview.
    assert!(has(&h, "Weft · lab"), "network name in the title");
    assert!(has(&h, &st.node_id));
    assert!(has(&h, &st.overlay));
    assert!(has(&h, "fd3c:9f1e:77a0:0:1dcf:1a0f:4581:bd3b/64"), "the IPv6 overlay address");
    assert!(has(&h, "10.126.126.2 fd3c:9f1e:77a0:0:2b2b:2b2b:2b2b:2b2b"), "a member's IPv6 address beside its IPv4");
    assert!(has(&h, "aes-128-gcm"));
    assert!(has(&h, &format!("• connected to {}", dir.sock().display())));

    // Peers: bravo and delta direct, charlie through bravo, delta down.
    for host in ["bravo", "charlie", "delta"] {
        assert!(has(&h, &peer_overlay(&st, host)), "{host}'s overlay address");
    }
    assert_eq!(count(&h, "relay via bravo"), 1, "charlie's path");
    assert_eq!(count(&h, "direct"), 1 + 1, "bravo's path and bravo's route");
    assert_eq!(count(&h, "none"), 1 + 1, "delta's path; no subnets proxied by bravo");
    assert_eq!(count(&h, "up"), 2 + 2, "two peer states up, two route sessions up");
    assert!(h.query_by_label_contains("DOWN").is_some(), "delta is shown as down");
    let delta = st.peers.iter().find(|p| p.hostname == "delta").unwrap();
    assert_ne!(delta.state, weft_control::PeerState::Established, "the recording has delta down");

    // Routes: one row per reachable member with next hop and proxied subnet.
    assert!(has(&h, "Routes (2)"));
    assert!(has(&h, "charlie (10.126.126.3)"));
    assert!(has(&h, "192.168.77.0/24"), "charlie's proxied subnet");
    let charlie = st.routes.iter().find(|r| r.hostname == "charlie").unwrap();
    assert_eq!(charlie.hops, 2);
    assert_eq!(count(&h, "bravo"), 2, "bravo as a peer's host and as charlie's next hop");
}

fn has_contains(h: &Harness<'_, Dashboard>, part: &str) -> bool {
    h.query_all_by_label_contains(part).next().is_some()
}

#[test]
fn no_node_running_is_said_plainly_and_the_window_reconnects() {
    let dir = Scratch::new();
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the no-node message", |h| has(h, "No Weft node is running here"));
    assert!(has(&h, &format!("Tried the control socket {}:", dir.sock().display())));
    assert!(has_contains(&h, "weft up"), "how to start a node");
    assert!(has_contains(&h, "No such file"), "the error itself");
    assert!(!has_contains(&h, "Peers ("));

    // The node comes up: the window finds it without any input.
    let node = FakeNode::start(&dir.sock());
    wait_for(&mut h, "the peers after the node started", |h| has(h, "Peers (3)"));
    // And goes away again (a stale socket file stays behind: connection refused).
    drop(node);
    std::fs::write(dir.sock(), b"").unwrap();
    wait_for(&mut h, "the problem after the node stopped", |h| !has_contains(h, "Peers ("));
    assert!(has_contains(&h, "Tried the control socket"));
}

#[test]
fn add_peer_sends_the_request_and_shows_the_nodes_error() {
    let dir = Scratch::new();
    let node = FakeNode::start(&dir.sock());
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the peers table", |h| has(h, "Peers (3)"));
    h.get_by_label("Add peer:").click();
    h.run_steps(2);
    h.get_by_label("Add peer:").type_text("tcp://198.51.100.9:1");
    h.run_steps(2);
    h.get_by_label("Add").click();
    wait_for(&mut h, "the error reply", |h| has_contains(h, "add-peer tcp://198.51.100.9:1 — error:"));
    assert_eq!(node.actions(), [r#"{"cmd":"add-peer","uri":"tcp://198.51.100.9:1"}"#]);
    assert!(has(
        &h,
        "add-peer tcp://198.51.100.9:1 — error: bad peer URI `tcp://198.51.100.9:1`: expected udp://HOST:PORT"
    ));
}

#[test]
fn remove_sends_the_peers_node_id_and_shows_done() {
    let dir = Scratch::new();
    let node = FakeNode::start(&dir.sock());
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the peers table", |h| has(h, "Peers (3)"));
    let st = recorded();
    let charlie = st.peers.iter().find(|p| p.hostname == "charlie").unwrap();
    // Rows are sorted by overlay: bravo (.2), charlie (.3), delta (.4).
    let removes: Vec<_> = h.query_all_by_label("Remove").collect();
    assert_eq!(removes.len(), 3);
    removes[1].click();
    wait_for(&mut h, "the done reply", |h| has_contains(h, "— done: removed"));
    assert_eq!(node.actions(), [format!(r#"{{"cmd":"remove-peer","peer":"{}"}}"#, charlie.node_id)]);
}

#[test]
fn clicking_a_header_sorts_and_clicking_again_reverses() {
    let dir = Scratch::new();
    let _node = FakeNode::start(&dir.sock());
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the peers table", |h| has(h, "Peers (3)"));
    let st = recorded();
    let top = |h: &Harness<'_, Dashboard>, host: &str| h.get_by_label(&peer_overlay(&st, host)).rect().top();
    assert!(top(&h, "bravo") < top(&h, "delta"), "overlay order first");
    h.get_by_role_and_label(Role::Button, "Host").click();
    h.run_steps(3);
    assert!(top(&h, "bravo") < top(&h, "charlie") && top(&h, "charlie") < top(&h, "delta"), "host, ascending");
    h.get_by_role_and_label(Role::Button, "Latency").click();
    h.run_steps(3);
    // Recorded latencies: bravo 0.29 ms, delta 0.64 ms, charlie 1.16 ms.
    assert!(top(&h, "bravo") < top(&h, "delta") && top(&h, "delta") < top(&h, "charlie"), "latency, ascending");
    h.get_by_role_and_label(Role::Button, "Latency").click();
    h.run_steps(3);
    assert!(top(&h, "charlie") < top(&h, "delta") && top(&h, "delta") < top(&h, "bravo"), "latency, descending");
}

#[test]
fn ticking_a_peer_adds_it_to_the_throughput_plot() {
    let dir = Scratch::new();
    let _node = FakeNode::start(&dir.sock());
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the peers table", |h| has(h, "Peers (3)"));
    assert!(h.state().summary().contains("plotted: ; map: "), "{}", h.state().summary());
    let boxes: Vec<_> = h.query_all_by_role(Role::CheckBox).collect();
    assert_eq!(boxes.len(), 3, "one plot toggle per peer");
    boxes[1].click(); // charlie (.3)
    h.run_steps(2);
    assert!(h.state().summary().contains("plotted: charlie 10.126.126.3; map: "), "{}", h.state().summary());
    h.query_all_by_role(Role::CheckBox).nth(1).unwrap().click();
    h.run_steps(2);
    assert!(h.state().summary().contains("plotted: ; map: "), "unticked: {}", h.state().summary());
}

#[test]
fn a_portal_lists_its_wireguard_clients() {
    let dir = Scratch::new();
    let mut st = recorded();
    st.wg_portal = Some(
        serde_json::from_value(serde_json::json!({
            "listen": "udp://0.0.0.0:51820", "net": "10.127.0.0/24", "dev_name": "wg-weft0",
            "public_key": "MQlwX7fONwNOqtpmaf3IpTuHTaIQbHwVnAI5UcdseDM=", "drops": {},
            "clients": [
                {"name": "alice-phone", "address": "10.127.0.2", "public_key": "p", "endpoint": "203.0.113.2:49404",
                 "last_handshake_secs": 40, "rx_bytes": 75_900_000, "tx_bytes": 917_000, "rx_packets": 1, "tx_packets": 1},
                {"name": "router", "address": "10.127.0.3", "public_key": "q", "endpoint": null,
                 "last_handshake_secs": null, "rx_bytes": 0, "tx_bytes": 0, "rx_packets": 0, "tx_packets": 0},
            ],
        }))
        .unwrap(),
    );
    let _node = FakeNode::serving(&dir.sock(), st);
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the portal table", |h| has(h, "WireGuard clients (2)"));
    for label in ["alice-phone", "10.127.0.2", "active", "203.0.113.2:49404", "40s ago", "75.9 MB / 917.0 kB"] {
        assert!(has(&h, label), "{label}");
    }
    for label in ["router", "never connected", "never"] {
        assert!(has(&h, label), "{label}");
    }
    assert!(has_contains(&h, "portal udp://0.0.0.0:51820 for 10.127.0.0/24"));
    // Without a portal there is no such table.
    let dir2 = Scratch::new();
    let _plain = FakeNode::start(&dir2.sock());
    let mut h2 = harness(dir2.sock());
    wait_for(&mut h2, "the peers table", |h| has(h, "Peers (3)"));
    assert!(!has_contains(&h2, "WireGuard clients"));
}

#[test]
fn the_mesh_map_shows_the_recorded_mesh() {
    let dir = Scratch::new();
    let _node = FakeNode::start(&dir.sock());
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the mesh map", |h| has_contains(h, "Mesh map: "));
    // The recording: bravo direct, charlie relayed through bravo, delta down.
    assert!(has(&h, "Mesh map: 4 members, 1 direct paths, 1 relayed, 1 down"));
    assert!(h.query_by_label("Mesh map").is_some(), "the collapsible section");
}

#[test]
fn magic_dns_and_the_exit_node_show_in_the_overview() {
    let dir = Scratch::new();
    let mut st = recorded();
    st.magic_dns = Some(
        serde_json::from_value(serde_json::json!({
            "domain": "lab.internal", "server": "10.126.126.1:53", "name": "alpha.lab.internal",
            "names": 4, "answered": 12, "dropped": 0,
        }))
        .unwrap(),
    );
    st.exit = Some(
        serde_json::from_value(serde_json::json!({
            "wanted": "bravo", "node_id": "aabbccddeeff0011", "hostname": "bravo", "state": "unreachable", "fallback": false,
        }))
        .unwrap(),
    );
    let _node = FakeNode::serving(&dir.sock(), st);
    let mut h = harness(dir.sock());
    wait_for(&mut h, "the overview", |h| has(h, "Peers (3)"));
    assert!(has(&h, "alpha.lab.internal (4 names in lab.internal)"));
    assert!(has(&h, "via bravo: unreachable"));
}
