//! End-to-end: Prometheus metrics of a running node pair, scraped over HTTP inside the
//! node's namespace, checked by `promtool check metrics` (Debian's prometheus package;
//! `scripts/test.sh` provides it as PROMTOOL) and shown to move with traffic.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use netns::{Lan, Netns, Node, TempDir, ping, require_root, wait_until};

const NET: [&str; 4] = ["--network-name", "metrics", "--network-secret", "metrics secret"];

/// `GET path` on 127.0.0.1:9108 inside `ns`: (status line, body).
fn get(ns: &Netns, path: &str) -> (String, String) {
    ns.within(|| {
        let mut s = TcpStream::connect("127.0.0.1:9108").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_owned(), body.to_owned())
    })
}

/// Every sample: `name{labels}` -> value.
fn samples(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

fn value(s: &BTreeMap<String, f64>, name: &str, label: &str) -> f64 {
    s.iter()
        .find(|(k, _)| k.starts_with(&format!("{name}{{")) && k.contains(label))
        .map_or_else(|| panic!("no {name} with {label} in {s:?}"), |(_, v)| *v)
}

fn promtool_check(body: &str) {
    let tool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&tool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {tool} (scripts/test.sh provides it as PROMTOOL): {e}"));
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn metrics_pass_promtool_and_move_with_traffic() {
    require_root();
    let lan = Lan::new(2);
    let dir = TempDir::new();
    let mut a_args = NET.to_vec();
    a_args.extend(["-i", "10.126.126.1/24", "--threads", "1", "--metrics", "127.0.0.1:9108"]);
    let a = Node::start(&lan.hosts[0], &dir.0, "a", &a_args);
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let mut b_args = NET.to_vec();
    b_args.extend(["-i", "10.126.126.2/24", "--threads", "1", "-p", &peer]);
    let b = Node::start(&lan.hosts[1], &dir.0, "b", &b_args);
    wait_until(Duration::from_secs(10), "session A<->B", || {
        a.peer_established("10.126.126.2") && b.peer_established("10.126.126.1")
    });

    let (status, before) = get(&lan.hosts[0], "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    promtool_check(&before);
    let first = samples(&before);
    assert!(first["weft_handshakes_total"] >= 1.0, "{before}");
    assert!(first["weft_control_transmit_bytes_total"] > 0.0 && first["weft_control_receive_packets_total"] > 0.0);
    assert_eq!(value(&first, "weft_build_info", "version=\""), 1.0);
    assert_eq!(value(&first, "weft_peer_session_up", "overlay=\"10.126.126.2\""), 1.0);
    assert!(value(&first, "weft_peer_session_up", "path=\"direct\"") == 1.0);

    for _ in 0..5 {
        assert!(ping(&lan.hosts[0], "10.126.126.2"));
    }
    let (_, after) = get(&lan.hosts[0], "/metrics");
    promtool_check(&after);
    let second = samples(&after);
    for name in [
        "weft_peer_transmit_bytes_total",
        "weft_peer_receive_bytes_total",
        "weft_peer_transmit_packets_total",
        "weft_peer_receive_packets_total",
    ] {
        let (x, y) = (value(&first, name, "10.126.126.2"), value(&second, name, "10.126.126.2"));
        assert!(y >= x + 10.0, "{name} did not move with 10 pings: {x} -> {y}");
    }
    assert!(
        value(&second, "weft_pipeline_transmit_packets_total", "pipeline=\"0\"")
            > value(&first, "weft_pipeline_transmit_packets_total", "pipeline=\"0\"")
    );
    assert!(second.contains_key("weft_uptime_seconds"), "{after}");

    // Anything but GET /metrics is answered plainly.
    assert_eq!(get(&lan.hosts[0], "/").0, "HTTP/1.1 404 Not Found");
    let (st, _) = lan.hosts[0].within(|| {
        let mut s = TcpStream::connect("127.0.0.1:9108").unwrap();
        s.write_all(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut t = String::new();
        s.read_to_string(&mut t).unwrap();
        (t.lines().next().unwrap().to_owned(), t)
    });
    assert_eq!(st, "HTTP/1.1 405 Method Not Allowed");
    // A port in use is a clear error at start.
    let out = lan.hosts[0]
        .cmd(netns::weft_bin())
        .arg("up")
        .args(NET)
        .args([
            "-i",
            "10.126.126.9/24",
            "-l",
            "udp://127.0.0.1:0",
            "--metrics",
            "127.0.0.1:9108",
            "--dev-name",
            "weftm",
        ])
        .arg("--state-dir")
        .arg(dir.0.join("c-state"))
        .arg("--control")
        .arg(dir.0.join("c.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--metrics 127.0.0.1:9108"), "{err}");
}
