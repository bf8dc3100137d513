#![allow(clippy::unwrap_used)] // test fixtures

use std::time::{Duration, Instant};

use serde_json::json;
use weft_control::{PeerJson, StatusJson};

use super::*;

fn peer(id: &str, overlay: &str, state: &str, path: &str, rx: u64, tx: u64) -> serde_json::Value {
    json!({
        "node_id": id, "hostname": format!("host-{id}"), "overlay": overlay, "endpoint": null,
        "path": path, "via": null, "via_hostname": null, "hops": 1, "transport": "udp",
        "rtt_ms": null, "loss": null, "state": state, "last_handshake_secs": null,
        "rx_bytes": rx, "rx_packets": 0, "tx_bytes": tx, "tx_packets": 0, "drops": {}, "error": null
    })
}

fn status(node: &str, uptime: u64, rx: u64, tx: u64, peers: Vec<serde_json::Value>) -> StatusJson {
    serde_json::from_value(json!({
        "node_id": node, "network_name": "n", "hostname": "h", "overlay": "10.126.126.1/24",
        "cipher": "aes-128-gcm", "listeners": [], "dev_name": "weft0",
        "offloads": {"tun": true, "tun_gro": true, "udp_gso": false, "udp_gro": true},
        "pipelines": [
            {"tx_packets": 0, "tx_bytes": tx / 2, "tx_batches": 0, "rx_packets": 0, "rx_bytes": rx / 2, "rx_batches": 0, "drops": {}},
            {"tx_packets": 0, "tx_bytes": tx - tx / 2, "tx_batches": 0, "rx_packets": 0, "rx_bytes": rx - rx / 2, "rx_batches": 0, "drops": {}}
        ],
        "threads": 2, "uptime_secs": uptime, "drops": {}, "peers": peers, "routes": [],
        "address_conflicts": [], "proxy_networks": [], "pending_peers": [], "refused_handshakes": []
    }))
    .unwrap()
}

fn row(p: serde_json::Value) -> PeerRow {
    let p: PeerJson = serde_json::from_value(p).unwrap();
    PeerRow::new(&p, &History::default())
}

#[test]
fn rates_come_from_counter_deltas() {
    let t0 = Instant::now();
    let mut h = History::default();
    h.push(t0, &status("a", 10, 1_000, 0, vec![peer("b", "10.126.126.2/24", "established", "direct", 100, 0)]));
    assert_eq!(h.total_rate(), None, "one snapshot has no rate");
    h.push(
        t0 + Duration::from_millis(500),
        &status("a", 10, 6_000, 2_000, vec![peer("b", "10.126.126.2/24", "established", "direct", 1_100, 400)]),
    );
    assert_eq!(h.total_rate(), Some(Rate { rx: 10_000.0, tx: 4_000.0 }));
    assert_eq!(h.peer_rate("b"), Some(Rate { rx: 2_000.0, tx: 800.0 }));
    assert_eq!(h.peer_rate("zz"), None);
}

#[test]
fn a_restart_clears_history_instead_of_a_negative_rate() {
    let t0 = Instant::now();
    let mut h = History::default();
    h.push(t0, &status("a", 100, 9_000, 9_000, vec![]));
    h.push(t0 + Duration::from_secs(1), &status("a", 101, 10_000, 10_000, vec![]));
    assert!(h.total_rate().is_some());
    // Same node id, shorter uptime: restarted; counters start again from zero.
    h.push(t0 + Duration::from_secs(2), &status("a", 1, 50, 50, vec![]));
    assert_eq!(h.total_rate(), None);
    h.push(t0 + Duration::from_secs(3), &status("a", 2, 150, 50, vec![]));
    assert_eq!(h.total_rate(), Some(Rate { rx: 100.0, tx: 0.0 }));
    // Another node on the same socket.
    h.push(t0 + Duration::from_secs(4), &status("other", 500, 1_000_000, 0, vec![]));
    assert_eq!(h.total_rate(), None);
}

#[test]
fn a_peer_counter_going_backwards_gives_zero_not_garbage() {
    let t0 = Instant::now();
    let mut h = History::default();
    h.push(t0, &status("a", 1, 0, 0, vec![peer("b", "10.126.126.2/24", "established", "direct", 5_000, 5_000)]));
    h.push(
        t0 + Duration::from_secs(1),
        &status("a", 2, 0, 0, vec![peer("b", "10.126.126.2/24", "established", "direct", 10, 20)]),
    );
    assert_eq!(h.peer_rate("b"), Some(Rate { rx: 0.0, tx: 0.0 }));
}

#[test]
fn history_keeps_five_minutes_with_x_relative_to_now() {
    let t0 = Instant::now();
    let mut h = History::default();
    for i in 0..=400u64 {
        h.push(t0 + Duration::from_secs(i), &status("a", i, i * 1000, 0, vec![]));
    }
    let now = t0 + Duration::from_secs(400);
    let s = h.total_series(now);
    assert_eq!(s.rx.len(), 301, "points of the last 300 s, both ends included");
    assert_eq!(s.rx.first().unwrap()[0], -300.0);
    assert_eq!(s.rx.last().unwrap(), &[0.0, 1000.0]);
    assert!(s.tx.iter().all(|p| p[1] == 0.0));
    assert!(h.peer_series(now, "b").rx.is_empty());
}

#[test]
fn peer_series_only_where_the_peer_existed() {
    let t0 = Instant::now();
    let mut h = History::default();
    h.push(t0, &status("a", 1, 0, 0, vec![]));
    h.push(t0 + Duration::from_secs(1), &status("a", 2, 0, 0, vec![peer("b", "x", "established", "direct", 0, 0)]));
    h.push(t0 + Duration::from_secs(2), &status("a", 3, 0, 0, vec![peer("b", "x", "established", "direct", 300, 0)]));
    let s = h.peer_series(t0 + Duration::from_secs(2), "b");
    assert_eq!(s.rx, vec![[0.0, 300.0]]);
}

#[test]
fn health_from_state_and_path() {
    let h = |state, path| row(peer("b", "10.126.126.2/24", state, path, 0, 0)).health;
    assert_eq!(h("established", "direct"), Health::Up);
    assert_eq!(h("established", "relay"), Health::Up);
    assert_eq!(h("established", "none"), Health::Down);
    assert_eq!(h("down", "direct"), Health::Down);
    assert_eq!(h("connecting", "relay"), Health::Connecting);
    assert_eq!(h("something-new", "direct"), Health::Down);
    assert_eq!(Health::Down.label(), "DOWN");
}

#[test]
fn relay_path_names_the_relay() {
    let mut p = peer("c", "10.126.126.3/24", "established", "relay", 0, 0);
    p["via"] = json!("00112233aabbccdd");
    assert_eq!(row(p.clone()).path, "relay via 00112233aabbccdd");
    p["via_hostname"] = json!("bravo");
    assert_eq!(row(p).path, "relay via bravo");
}

#[test]
fn sorting_by_overlay_is_numeric_and_clicks_flip_direction() {
    let mut rows = vec![
        row(peer("a", "10.126.126.10/24", "established", "direct", 0, 0)),
        row(peer("b", "10.126.126.9/24", "established", "direct", 0, 0)),
        row(peer("c", "10.126.126.100/24", "established", "direct", 0, 0)),
    ];
    let sort = Sort::default();
    sort.apply(&mut rows);
    let order = |rows: &[PeerRow]| rows.iter().map(|r| r.node_id.clone()).collect::<Vec<_>>();
    assert_eq!(order(&rows), ["b", "a", "c"]);
    let sort = sort.clicked(PeerColumn::Overlay);
    assert!(sort.descending);
    sort.apply(&mut rows);
    assert_eq!(order(&rows), ["c", "a", "b"]);
    assert_eq!(sort.clicked(PeerColumn::Latency), Sort { column: PeerColumn::Latency, descending: false });
}

#[test]
fn missing_values_sort_last_in_both_directions() {
    let with_rtt = |id: &str, ip: &str, rtt: Option<f64>| {
        let mut p = peer(id, ip, "established", "direct", 0, 0);
        p["rtt_ms"] = json!(rtt);
        row(p)
    };
    let mut rows = vec![
        with_rtt("none", "10.0.0.1/24", None),
        with_rtt("slow", "10.0.0.2/24", Some(40.0)),
        with_rtt("fast", "10.0.0.3/24", Some(0.5)),
    ];
    let order = |rows: &[PeerRow]| rows.iter().map(|r| r.node_id.clone()).collect::<Vec<_>>();
    let asc = Sort { column: PeerColumn::Latency, descending: false };
    asc.apply(&mut rows);
    assert_eq!(order(&rows), ["fast", "slow", "none"]);
    asc.clicked(PeerColumn::Latency).apply(&mut rows);
    assert_eq!(order(&rows), ["slow", "fast", "none"]);
}

#[test]
fn down_peers_sort_after_up_ones_by_state() {
    let mut rows = vec![
        row(peer("d", "10.0.0.1/24", "down", "none", 0, 0)),
        row(peer("u", "10.0.0.2/24", "established", "direct", 0, 0)),
        row(peer("c", "10.0.0.3/24", "connecting", "relay", 0, 0)),
    ];
    Sort { column: PeerColumn::State, descending: false }.apply(&mut rows);
    assert_eq!(rows.iter().map(|r| r.health).collect::<Vec<_>>(), [Health::Up, Health::Connecting, Health::Down]);
}

#[test]
fn route_rows_name_the_next_hop() {
    let r = |next: &str, name: Option<&str>| {
        let r: RouteJson = serde_json::from_value(json!({
            "node_id": "c", "hostname": "charlie", "overlay": "10.126.126.3", "next_hop": next,
            "next_hop_hostname": name, "hops": 2, "latency_ms": 3, "session": true,
            "proxied": ["192.168.7.0/24", "192.168.8.0/24"]
        }))
        .unwrap();
        RouteRow::new(&r)
    };
    assert_eq!(r("c", Some("charlie")).next_hop, "direct");
    assert_eq!(r("b", Some("bravo")).next_hop, "bravo");
    assert_eq!(r("b", None).next_hop, "b");
    assert_eq!(r("c", None).destination, "charlie (10.126.126.3)");
    assert_eq!(r("c", None).proxied, "192.168.7.0/24, 192.168.8.0/24");
}

#[test]
fn formatting() {
    assert_eq!(format_rate(0.0), "0 B/s");
    assert_eq!(format_rate(999.0), "999 B/s");
    assert_eq!(format_rate(1_500.0), "1.5 kB/s");
    assert_eq!(format_rate(118_000_000.0), "118.0 MB/s");
    assert_eq!(format_bytes(-5.0), "0 B");
    assert_eq!(format_duration(9), "9s");
    assert_eq!(format_duration(250), "4m 10s");
    assert_eq!(format_duration(7_500), "2h 5m");
    assert_eq!(format_duration(3 * 86_400 + 4 * 3600 + 1), "3d 4h");
}

#[test]
fn a_column_of_rates_reads_in_one_unit() {
    let unit = unit_for(8.2e6);
    assert_eq!(format_rate_in(8.2e6, unit), "8.2 MB/s");
    assert_eq!(format_rate_in(3.0e5, unit), "0.3 MB/s", "not 300.0 kB/s under 8.2 MB/s");
    assert_eq!(format_rate_in(0.0, unit), "0.0 MB/s");
    assert_eq!(format_rate_in(512.0, unit_for(512.0)), "512 B/s");
    assert_eq!(format_rate(3.0e5), "300.0 kB/s", "a single value keeps its own unit");
}

#[test]
fn portal_rows_say_whether_a_client_is_connected() {
    let mut st = status("n", 10, 0, 0, vec![]);
    assert!(PortalRow::rows(&st).is_empty(), "no portal, no rows");
    st.wg_portal = Some(
        serde_json::from_value(serde_json::json!({
            "listen": "udp://0.0.0.0:51820", "net": "10.127.0.0/24", "dev_name": "wg-weft0", "public_key": "k",
            "drops": {},
            "clients": [
                {"name": "phone", "address": "10.127.0.3", "public_key": "p", "endpoint": null,
                 "last_handshake_secs": null, "rx_bytes": 0, "tx_bytes": 0, "rx_packets": 0, "tx_packets": 0},
                {"name": "laptop", "address": "10.127.0.2", "public_key": "q", "endpoint": "203.0.113.9:4444",
                 "last_handshake_secs": 42, "rx_bytes": 1500000, "tx_bytes": 2000, "rx_packets": 9, "tx_packets": 3},
                {"name": "router", "address": "10.127.0.4", "public_key": "r", "endpoint": "203.0.113.7:51820",
                 "last_handshake_secs": 600, "rx_bytes": 1, "tx_bytes": 1, "rx_packets": 1, "tx_packets": 1},
            ],
        }))
        .unwrap(),
    );
    let rows = PortalRow::rows(&st);
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["laptop", "phone", "router"]);
    assert_eq!((rows[0].state, rows[0].handshake.as_str()), (ClientState::Active, "42s ago"));
    assert_eq!(rows[0].traffic, "1.5 MB / 2.0 kB");
    assert_eq!(
        (rows[1].state, rows[1].endpoint.as_str(), rows[1].handshake.as_str()),
        (ClientState::Never, "-", "never")
    );
    assert_eq!(rows[2].state, ClientState::Idle);
}

#[test]
fn the_mesh_map_draws_direct_and_relayed_paths_from_the_status() {
    let mut relayed = peer("cc", "10.0.0.3", "established", "relay", 0, 0);
    relayed["via"] = json!("bb");
    relayed["via_hostname"] = json!("host-bb");
    relayed["hops"] = json!(2);
    let st = status(
        "me",
        10,
        0,
        0,
        vec![
            peer("dd", "10.0.0.4", "down", "none", 0, 0),
            relayed,
            peer("bb", "10.0.0.2", "established", "direct", 0, 0),
            peer("ee", "10.0.0.5", "idle", "direct", 0, 0),
        ],
    );
    let map = MeshMap::new(&st);
    let ids: Vec<&str> = map.nodes.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids, ["me", "bb", "cc", "dd", "ee"], "this node first, then by overlay");
    assert!(map.nodes[0].me && !map.nodes[1].me);
    assert_eq!(
        map.edges,
        [
            MapEdge { from: 0, to: 1, kind: EdgeKind::Direct },
            MapEdge { from: 1, to: 2, kind: EdgeKind::Relayed },
            MapEdge { from: 0, to: 4, kind: EdgeKind::Direct },
        ],
        "bb direct, cc relayed from bb, dd without a path, ee direct"
    );
    assert_eq!(map.nodes[3].health, Health::Down);
    assert!(map.nodes[2].detail.contains("relayed via host-bb (2 hops)"), "{}", map.nodes[2].detail);
    assert_eq!(map.summary(), "Mesh map: 5 members, 2 direct paths, 1 relayed, 1 down");
}
