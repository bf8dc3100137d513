//! Prometheus metrics: with `--metrics ADDR:PORT` the node answers `GET /metrics` in
//! the text exposition format (0.0.4). Each scrape builds a fresh registry from the
//! node's status (the same numbers `weft status --json` shows) with the `prometheus`
//! crate, so the metrics never disagree with the status and cost nothing between
//! scrapes. Names follow the Prometheus conventions: `weft_` prefix, base units
//! (`_bytes`, `_seconds`, `_ratio`), `_total` on counters.

use std::collections::BTreeMap;

use prometheus::{Encoder, GaugeVec, IntCounterVec, Opts, Registry, TextEncoder};

use weft_control::{FailureKind, PeerState, StatusJson};

pub mod server;

/// Content type of the text exposition format.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Adds metric families to one registry.
struct Families {
    reg: Registry,
}

impl Families {
    fn counter<const N: usize>(
        &self,
        name: &str,
        help: &str,
        labels: [&str; N],
        samples: impl IntoIterator<Item = ([String; N], u64)>,
    ) -> prometheus::Result<()> {
        let c = IntCounterVec::new(Opts::new(name, help), &labels)?;
        for (values, v) in samples {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            c.get_metric_with_label_values(&values)?.inc_by(v);
        }
        self.reg.register(Box::new(c))
    }

    fn gauge<const N: usize>(
        &self,
        name: &str,
        help: &str,
        labels: [&str; N],
        samples: impl IntoIterator<Item = ([String; N], f64)>,
    ) -> prometheus::Result<()> {
        let g = GaugeVec::new(Opts::new(name, help), &labels)?;
        for (values, v) in samples {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            g.get_metric_with_label_values(&values)?.set(v);
        }
        self.reg.register(Box::new(g))
    }

    fn one_counter(&self, name: &str, help: &str, v: u64) -> prometheus::Result<()> {
        self.counter(name, help, [], [([], v)])
    }

    fn one_gauge(&self, name: &str, help: &str, v: f64) -> prometheus::Result<()> {
        self.gauge(name, help, [], [([], v)])
    }
}

fn by_key<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> impl Iterator<Item = ([String; 1], u64)> + '_ {
    m.iter().map(|(k, v)| ([k.to_string()], *v))
}

/// The metrics of a node, from its status.
pub fn render(s: &StatusJson) -> prometheus::Result<String> {
    let f = Families { reg: Registry::new() };
    f.gauge(
        "weft_build_info",
        "Version and commit of the running weft binary (always 1).",
        ["version", "commit"],
        [([env!("CARGO_PKG_VERSION").to_owned(), env!("WEFT_GIT_COMMIT").to_owned()], 1.0)],
    )?;
    f.gauge(
        "weft_node_info",
        "This node: id, host name, network, overlay address and cipher (always 1).",
        ["node_id", "hostname", "network", "overlay", "cipher"],
        [([s.node_id.clone(), s.hostname.clone(), s.network_name.clone(), s.overlay.clone(), s.cipher.clone()], 1.0)],
    )?;
    f.one_gauge("weft_uptime_seconds", "Seconds since the node started.", s.uptime_secs as f64)?;

    // Peers.
    let peer = |p: &weft_control::PeerJson| [p.node_id.clone(), p.hostname.clone(), p.overlay.clone()];
    let mut states: BTreeMap<PeerState, u64> = BTreeMap::new();
    for p in &s.peers {
        *states.entry(p.state).or_default() += 1;
    }
    f.gauge(
        "weft_peers",
        "Known members by session state (connecting, established, idle, down).",
        ["state"],
        states.iter().map(|(k, v)| ([k.to_string()], *v as f64)),
    )?;
    let labels = ["node_id", "hostname", "overlay"];
    f.counter(
        "weft_peer_receive_bytes_total",
        "Plaintext bytes received from the member.",
        labels,
        s.peers.iter().map(|p| (peer(p), p.rx_bytes)),
    )?;
    f.counter(
        "weft_peer_transmit_bytes_total",
        "Plaintext bytes sent to the member.",
        labels,
        s.peers.iter().map(|p| (peer(p), p.tx_bytes)),
    )?;
    f.counter(
        "weft_peer_receive_packets_total",
        "Packets received from the member.",
        labels,
        s.peers.iter().map(|p| (peer(p), p.rx_packets)),
    )?;
    f.counter(
        "weft_peer_transmit_packets_total",
        "Packets sent to the member.",
        labels,
        s.peers.iter().map(|p| (peer(p), p.tx_packets)),
    )?;
    f.gauge(
        "weft_peer_session_up",
        "1 when the end-to-end session with the member is established, with its path (direct, relay, none) and the transport of its first link.",
        ["node_id", "hostname", "overlay", "path", "transport"],
        s.peers.iter().map(|p| {
            let [id, host, overlay] = peer(p);
            ([id, host, overlay, p.path.to_string(), p.transport.clone()], f64::from(u8::from(p.state == PeerState::Established)))
        }),
    )?;
    f.gauge(
        "weft_peer_hops",
        "Links on the path to the member.",
        labels,
        s.peers.iter().map(|p| (peer(p), f64::from(p.hops))),
    )?;
    f.gauge(
        "weft_peer_rtt_seconds",
        "Smoothed round-trip time of the session with the member.",
        labels,
        s.peers.iter().filter_map(|p| p.rtt_ms.map(|r| (peer(p), r / 1000.0))),
    )?;
    f.gauge(
        "weft_peer_loss_ratio",
        "Fraction of recent probes to the member that were lost (0 to 1).",
        labels,
        s.peers.iter().filter_map(|p| p.loss.map(|l| (peer(p), f64::from(l)))),
    )?;
    f.gauge(
        "weft_peer_last_handshake_age_seconds",
        "Seconds since the last handshake with the member.",
        labels,
        s.peers.iter().filter_map(|p| p.last_handshake_secs.map(|a| (peer(p), a as f64))),
    )?;
    f.one_gauge("weft_routes", "Members this node has a route to.", s.routes.len() as f64)?;

    // Drops, handshakes, connections.
    f.counter("weft_drops_total", "Packets and datagrams dropped, by reason.", ["reason"], by_key(&s.drops))?;
    let mut refused: BTreeMap<FailureKind, u64> = BTreeMap::new();
    for r in &s.refused_handshakes {
        *refused.entry(r.kind).or_default() += r.count;
    }
    f.counter(
        "weft_handshakes_refused_total",
        "Handshakes refused after the PSK MAC passed, by kind (address_taken, refused, ...; sources currently remembered).",
        ["reason"],
        by_key(&refused),
    )?;
    let a = &s.admission;
    f.counter(
        "weft_admission_total",
        "Handshake admission control: bad_mac, rate_limited, cookies_sent, cookies_received, evicted, replayed.",
        ["event"],
        [
            (["bad_mac".to_owned()], a.bad_mac),
            (["rate_limited".to_owned()], a.rate_limited),
            (["cookies_sent".to_owned()], a.cookies_sent),
            (["cookies_received".to_owned()], a.cookies_received),
            (["evicted".to_owned()], a.evicted),
            (["replayed".to_owned()], a.replayed),
        ],
    )?;
    f.one_gauge(
        "weft_admission_under_load",
        "1 while the node answers handshakes with cookies.",
        f64::from(u8::from(a.under_load)),
    )?;
    f.gauge(
        "weft_connections",
        "Live TCP, WebSocket and QUIC connections, by transport.",
        ["transport"],
        // Every connection transport, 0 included: an alert on "no connections" needs
        // a series to compare.
        ["quic", "tcp", "ws", "wss"]
            .map(|t| ([t.to_owned()], s.connections_by_transport.get(t).copied().unwrap_or(0) as f64)),
    )?;
    f.one_counter(
        "weft_handshakes_total",
        "Handshakes that made a session (as initiator or responder).",
        s.handshakes_completed,
    )?;
    f.one_counter(
        "weft_router_failovers_total",
        "Moves to another subnet router or exit because the one in use was lost.",
        s.failovers,
    )?;
    f.one_counter(
        "weft_router_failbacks_total",
        "Moves back to a preferred subnet router or exit that returned.",
        s.failbacks,
    )?;
    f.one_counter(
        "weft_stale_sessions_renewed_total",
        "Handshakes started because a member sent data on a session this node had dropped.",
        s.stale_renewed,
    )?;
    f.counter(
        "weft_handshake_failures_total",
        "Handshakes that failed, by kind (bad_response, rejected, refused, address_taken, no_response, not_confirmed, unreachable, no_path).",
        ["reason"],
        by_key(&s.handshake_failures),
    )?;
    let c = &s.control_traffic;
    f.one_counter(
        "weft_control_transmit_bytes_total",
        "Bytes the control plane sent (handshakes, keepalives, probes, records, summaries).",
        c.sent_bytes,
    )?;
    f.one_counter("weft_control_transmit_packets_total", "Datagrams the control plane sent.", c.sent_packets)?;
    f.one_counter("weft_control_receive_bytes_total", "Bytes the control plane received.", c.received_bytes)?;
    f.one_counter(
        "weft_control_receive_packets_total",
        "Datagrams and messages the control plane received.",
        c.received_packets,
    )?;
    f.counter(
        "weft_transport_events_total",
        "Events of the connection transports (accepted, dialled, refused_full, handshake_failures, timeouts, ...).",
        ["event"],
        by_key(&s.transport_counters),
    )?;
    if let Some(d) = &s.magic_dns {
        f.one_counter("weft_dns_queries_total", "DNS queries Magic DNS answered (any response code).", d.answered)?;
        f.one_counter(
            "weft_dns_dropped_total",
            "Datagrams Magic DNS dropped unanswered: from outside the mesh, or no query.",
            d.dropped,
        )?;
        f.one_gauge("weft_dns_names", "Names in the Magic DNS zone.", d.names as f64)?;
    }
    f.one_counter(
        "weft_queued_dropped_total",
        "Packets for members without a session dropped while their sessions were being made.",
        s.queued_dropped,
    )?;
    f.one_counter(
        "weft_rejected_records_total",
        "Topology records dropped because their origin did not sign them.",
        s.rejected_records,
    )?;
    f.counter(
        "weft_records_dropped_total",
        "Topology records dropped by the table's limits (over_budget, table_full, evicted) or for their certificate (uncertified).",
        ["reason"],
        by_key(&s.records_dropped),
    )?;

    // Pipelines: "0", "1", … read the TUN and the UDP sockets; "links-0", … open what
    // connections receive.
    let labels: Vec<[String; 1]> = {
        let (mut udp, mut links) = (0, 0);
        s.pipelines
            .iter()
            .map(|p| {
                let (n, prefix) = if p.links { (&mut links, "links-") } else { (&mut udp, "") };
                *n += 1;
                [format!("{prefix}{}", *n - 1)]
            })
            .collect()
    };
    for (name, help, get) in [
        (
            "weft_pipeline_transmit_packets_total",
            "Packets sent by the pipeline.",
            (|p| p.tx_packets) as fn(&weft_control::PipelineJson) -> u64,
        ),
        ("weft_pipeline_transmit_bytes_total", "Plaintext bytes sent by the pipeline.", |p| p.tx_bytes),
        ("weft_pipeline_transmit_batches_total", "TUN read batches of the pipeline.", |p| p.tx_batches),
        ("weft_pipeline_receive_packets_total", "Packets the pipeline delivered to the TUN.", |p| p.rx_packets),
        ("weft_pipeline_receive_bytes_total", "Plaintext bytes the pipeline delivered.", |p| p.rx_bytes),
        ("weft_pipeline_receive_batches_total", "recvmmsg batches of the pipeline.", |p| p.rx_batches),
        (
            "weft_pipeline_transmit_gso_records_total",
            "TSO super-packets the pipeline sent whole as one record on a connection.",
            |p| p.tx_gso_records,
        ),
        ("weft_pipeline_receive_gso_records_total", "GSO records the pipeline received and delivered.", |p| {
            p.rx_gso_records
        }),
        (
            "weft_pipeline_transmit_answers_total",
            "Packets the receive thread sent right after writing: the kernel's answers to sparse packets.",
            |p| p.tx_answers,
        ),
        ("weft_pipeline_forwarded_total", "Relayed frames for other nodes the pipeline received and passed on.", |p| {
            p.forwarded
        }),
    ] {
        f.counter(name, help, ["pipeline"], s.pipelines.iter().zip(&labels).map(|(p, l)| (l.clone(), get(p))))?;
    }

    // The WireGuard portal.
    if let Some(p) = &s.wg_portal {
        let client = |c: &weft_control::PortalClientJson| [c.name.clone(), c.address.clone()];
        f.one_gauge("weft_wg_clients", "Clients of the WireGuard portal.", p.clients.len() as f64)?;
        f.counter(
            "weft_wg_client_receive_bytes_total",
            "Plaintext bytes received from the WireGuard client.",
            ["client", "address"],
            p.clients.iter().map(|c| (client(c), c.rx_bytes)),
        )?;
        f.counter(
            "weft_wg_client_transmit_bytes_total",
            "Plaintext bytes sent to the WireGuard client.",
            ["client", "address"],
            p.clients.iter().map(|c| (client(c), c.tx_bytes)),
        )?;
        f.gauge(
            "weft_wg_client_last_handshake_age_seconds",
            "Seconds since the WireGuard client's last handshake.",
            ["client", "address"],
            p.clients.iter().filter_map(|c| c.last_handshake_secs.map(|a| (client(c), a as f64))),
        )?;
        f.counter(
            "weft_wg_drops_total",
            "Datagrams and packets the portal dropped, by reason.",
            ["reason"],
            by_key(&p.drops),
        )?;
    }

    let mut out = Vec::new();
    TextEncoder::new().encode(&f.reg.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_renders_with_escaped_labels_and_every_family_typed() {
        let s: StatusJson = serde_json::from_value(serde_json::json!({
            "node_id": "00", "network_name": "n", "hostname": "a", "overlay": "10.0.0.1/24",
            "cipher": "aes-128-gcm", "listeners": [], "dev_name": "weft0",
            "offloads": {"tun": false, "tun_gro": false, "udp_gso": false, "udp_gro": false},
            "pipelines": [{"tx_packets": 1, "tx_bytes": 2, "tx_batches": 1, "rx_packets": 3, "rx_bytes": 4,
                "rx_batches": 1, "drops": {}},
                {"tx_packets": 0, "tx_bytes": 0, "tx_batches": 0, "rx_packets": 9, "rx_bytes": 90,
                "rx_batches": 2, "drops": {}, "links": true}],
            "threads": 1, "uptime_secs": 7, "drops": {"replay": 5}, "routes": [],
            "peers": [{"node_id": "11", "hostname": "evil\"\n\\host", "overlay": "10.0.0.2", "endpoint": null,
                "path": "direct", "via": null, "via_hostname": null, "hops": 1, "transport": "udp", "rtt_ms": 1.5,
                "loss": 0.25, "state": "established", "last_handshake_secs": 3, "rx_bytes": 100, "rx_packets": 2,
                "tx_bytes": 200, "tx_packets": 4, "drops": {}, "error": null}],
            "address_conflicts": [], "proxy_networks": [], "pending_peers": [],
            "refused_handshakes": [
                {"from": "udp://192.0.2.1:1", "reason": "member 1234 claims 10.0.0.9, which b holds", "kind": "address_taken",
                    "count": 2, "last_secs": 1},
                {"from": "udp://192.0.2.2:1", "reason": "member 5678 claims 10.0.0.9, which b holds", "kind": "address_taken",
                    "count": 1, "last_secs": 1},
                {"from": "udp://192.0.2.3:1", "reason": "from an older node", "count": 1, "last_secs": 1}],
        }))
        .unwrap();
        let text = render(&s).unwrap();
        assert!(text.contains("# TYPE weft_peer_receive_bytes_total counter"), "{text}");
        assert!(
            text.contains(
                r#"weft_peer_receive_bytes_total{hostname="evil\"\n\\host",node_id="11",overlay="10.0.0.2"} 100"#
            ),
            "{text}"
        );
        assert!(text.contains("weft_peer_rtt_seconds{") && text.contains("} 0.0015"), "{text}");
        assert!(text.contains(r#"weft_drops_total{reason="replay"} 5"#), "{text}");
        assert!(text.contains(r#"weft_pipeline_receive_bytes_total{pipeline="0"} 4"#), "{text}");
        assert!(text.contains(r#"weft_pipeline_receive_bytes_total{pipeline="links-0"} 90"#), "{text}");
        assert!(text.contains(r#"weft_peers{state="established"} 1"#), "{text}");
        // Refusals are labelled by kind, never by their free-text reason (one series
        // per kind, whatever the peers wrote).
        assert!(text.contains(r#"weft_handshakes_refused_total{reason="address_taken"} 3"#), "{text}");
        assert!(text.contains(r#"weft_handshakes_refused_total{reason="other"} 1"#), "{text}");
        assert!(!text.contains("claims"), "{text}");
        assert!(!text.contains("weft_wg_"), "no portal, no portal metrics");
        for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let name = family.split(' ').next().unwrap();
            assert!(text.contains(&format!("# HELP {name} ")), "{name} has no help");
            assert!(name.starts_with("weft_"), "{name}");
        }
    }
}

#[cfg(test)]
mod dashboard {
    /// Every metric the packaged Grafana dashboard queries is one the node exports.
    #[test]
    fn the_grafana_dashboard_queries_only_exported_metrics() {
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../../../packaging/grafana/weft-dashboard.json")).unwrap();
        let source = include_str!("mod.rs");
        let mut seen = 0;
        for p in dash["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                for name in
                    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("weft_"))
                {
                    assert!(
                        source.contains(&format!("\"{name}\"")),
                        "the dashboard queries {name}, which is not exported"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen >= 14, "{seen}");
    }
}
