//! End-to-end: two members flood a node's connection table and a third still gets in.
//! D's policy lets everyone reach its TCP 5201; F1 and F2 each send 40,000 SYNs to it
//! through the tunnel, from as many source ports (raw packets whose TCP checksum is
//! left 0, so D's kernel drops them unanswered: SYNs whose answers never come, the
//! flows that lived 12 minutes). Before the per-source share they filled all 65,536
//! flows and then nobody reached D, nor D anybody (the answers to its own connections
//! found no room either). Now each flooder gets its share (a sixteenth), C connects to
//! D:5201, D connects to C, and the refused SYNs are counted as `flow_limit` drops.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use netns::{Lan, Netns, Node, TempDir, require_root, wait_until};

const IPS: [&str; 4] = ["10.126.141.1", "10.126.141.2", "10.126.141.3", "10.126.141.4"];
const NAMES: [&str; 4] = ["d", "f1", "f2", "c"];
/// SYNs each flooder sends.
const SYNS: u32 = 40_000;

/// Sends `count` TCP SYNs from `src` to `dst`:5201, source ports 1024 on, about 20,000 a
/// second (bursts of 50, 2.5 ms apart: the receiving node's socket keeps up).
const FLOOD: &str = r#"
import socket, struct, sys, time
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst))
for i in range(count):
    syn = struct.pack("!HHIIBBHHH", 1024 + i, 5201, i, 0, 5 << 4, 0x02, 64240, 0, 0)
    while True:
        try:
            s.sendto(ip + syn, (dst, 0))
            break
        except OSError:
            time.sleep(0.001)
    if i % 50 == 49:
        time.sleep(0.0025)
"#;

/// Whether a TCP connection from `ns` to `addr:port` opens within 3 s.
fn connects_to(ns: &Netns, addr: &str, port: u16) -> bool {
    ns.cmd("timeout").args(["3", "bash", "-c", &format!("exec 3<>/dev/tcp/{addr}/{port}")]).status().unwrap().success()
}

#[test]
fn two_members_flooding_syns_leave_room_for_a_third_and_for_the_node_s_own_flows() {
    require_root();
    let lan = Lan::new(4);
    let dir = TempDir::new();
    let pol = dir.0.join("policy.toml");
    std::fs::write(
        &pol,
        format!("[[allow]]\nfrom  = [\"*\"]\nto    = [\"{}\"]\nproto = \"tcp\"\nports = [\"5201\"]\n", IPS[0]),
    )
    .unwrap();
    std::fs::set_permissions(&pol, std::fs::Permissions::from_mode(0o600)).unwrap();
    let first = format!("udp://{}:11010", lan.addrs[0]);
    let nodes: Vec<Node> = (0..4)
        .map(|i| {
            let ip = format!("{}/24", IPS[i]);
            let mut args = vec![
                "--network-name",
                "flowtable",
                "--network-secret",
                "flowtable secret",
                "-i",
                &ip,
                "--hostname",
                NAMES[i],
                "--threads",
                "1",
            ];
            let pol = pol.to_str().unwrap();
            if i == 0 {
                args.extend(["--policy", pol]);
            } else {
                args.extend(["-p", &first]);
            }
            Node::start(&lan.hosts[i], &dir.0, NAMES[i], &args)
        })
        .collect();
    let d = &nodes[0];
    wait_until(Duration::from_secs(20), "the members mesh", || IPS[1..].iter().all(|ip| d.peer_established(ip)));
    assert_eq!(d.status()["policy"]["rules"], 1);
    // D listens on 5201, C on 7000 (the kernel completes connections; nobody accepts).
    let _d_server = lan.hosts[0].within(|| TcpListener::bind((IPS[0], 5201)).unwrap());
    let _c_server = lan.hosts[3].within(|| TcpListener::bind((IPS[3], 7000)).unwrap());
    assert!(connects_to(&lan.hosts[3], IPS[0], 5201), "before the flood, C reaches D:5201");

    let start = Instant::now();
    let flooders: Vec<_> = [1, 2]
        .iter()
        .map(|&i| {
            lan.hosts[i]
                .cmd("python3")
                .args(["-c", FLOOD, IPS[i], IPS[0], &SYNS.to_string()])
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut f in flooders {
        assert!(f.wait().unwrap().success(), "the flood script failed");
    }
    // Every SYN has come through once D has judged them all: admitted or refused
    // (before the share, the table's refusals were counted as hits too).
    let judged = |s: &serde_json::Value| {
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        n(&s["policy"]["hits"][0]) + n(&s["policy"]["source_full"]) + n(&s["policy"]["table_full"])
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while judged(&d.status()) < 2 * u64::from(SYNS) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = d.status();
    eprintln!(
        "flood of {} SYNs sent in {:?}; D: {} flows, {} judged, policy {}, drops {}",
        2 * SYNS,
        start.elapsed(),
        st["policy"]["flows"],
        judged(&st),
        st["policy"],
        st["drops"]
    );

    let c_reaches_d = connects_to(&lan.hosts[3], IPS[0], 5201);
    let d_reaches_c = connects_to(&lan.hosts[0], IPS[3], 7000);
    assert!(
        c_reaches_d && d_reaches_c,
        "after the flood, C reaches D:5201: {c_reaches_d}; D reaches C (the answers to its own flow pass): {d_reaches_c}"
    );
    let st = d.status();
    let flows = st["policy"]["flows"].as_u64().unwrap();
    assert!(flows <= 2 * 4096 + 16, "each flooder holds at most its share: {flows} flows");
    assert!(st["policy"]["source_full"].as_u64().unwrap() > 0, "{}", st["policy"]);
    assert!(st["drops"]["flow_limit"].as_u64().unwrap_or(0) > 0, "refused SYNs are counted: {}", st["drops"]);
    drop(nodes);
}
