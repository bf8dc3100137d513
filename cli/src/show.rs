//! Tables for people.

use std::fmt::Write;

use crate::control::StatusJson;

/// Renders `weft status`.
pub(crate) fn status(s: &StatusJson) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "node      {} ({})", s.node_id, s.hostname);
    let _ = writeln!(o, "network   {}", s.network_name);
    let _ = writeln!(o, "address   {} on {}", s.overlay, s.dev_name);
    let _ = writeln!(o, "cipher    {}", s.cipher);
    let _ = writeln!(o, "listen    {}", s.listeners.join(", "));
    let onoff = |b: bool| if b { "on" } else { "off" };
    let _ = writeln!(
        o,
        "pipelines {} (offload: tun {}, tun-gro {}, udp-gso {}, udp-gro {})",
        s.threads,
        onoff(s.offloads.tun),
        onoff(s.offloads.tun_gro),
        onoff(s.offloads.udp_gso),
        onoff(s.offloads.udp_gro)
    );
    let notable: Vec<String> =
        s.transport_counters.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(o, "links     {} connections {}", s.connections, notable.join(" "));
    let _ = writeln!(o, "uptime    {}", human_secs(s.uptime_secs));
    if !s.proxy_networks.is_empty() {
        let _ = writeln!(o, "proxies   {}", s.proxy_networks.join(", "));
    }
    for c in &s.address_conflicts {
        let _ = writeln!(o, "CONFLICT  {c}");
    }
    for r in &s.refused {
        let _ = writeln!(o, "REFUSED   {r}");
    }
    if s.rejected_records > 0 {
        let _ =
            writeln!(o, "FORGED    {} topology records not signed by their origin were dropped", s.rejected_records);
    }
    if !s.drops.is_empty() {
        let d: Vec<String> = s.drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(o, "drops     {}", d.join(" "));
    }
    let _ = writeln!(o);
    if s.peers.is_empty() {
        let _ = writeln!(o, "no peers");
    } else {
        o.push_str(&peers(s));
    }
    for p in &s.pending_peers {
        let _ = writeln!(
            o,
            "pending   {} after {} attempts: {}",
            p.endpoint,
            p.attempts,
            p.error.as_deref().unwrap_or("connecting")
        );
    }
    for r in &s.refused_handshakes {
        let _ = writeln!(o, "refused   {} x{} ({} ago): {}", r.from, r.count, human_secs(r.last_secs), r.reason);
    }
    o
}

/// Renders `weft peers`.
pub(crate) fn peers(s: &StatusJson) -> String {
    let rows: Vec<[String; 11]> = s
        .peers
        .iter()
        .map(|p| {
            let path = match (p.path.as_str(), &p.via_hostname, &p.via) {
                ("relay", Some(h), _) if !h.is_empty() => format!("relay via {h} ({} hops)", p.hops),
                ("relay", _, Some(v)) => format!("relay via {v} ({} hops)", p.hops),
                (other, _, _) => other.to_owned(),
            };
            [
                p.overlay.clone(),
                p.hostname.clone(),
                p.state.clone(),
                path,
                p.rtt_ms.map_or_else(|| "-".into(), |r| format!("{r:.1} ms")),
                p.loss.map_or_else(|| "-".into(), |l| format!("{:.0}%", l * 100.0)),
                format!("{} / {}", human_bytes(p.rx_bytes), human_bytes(p.tx_bytes)),
                p.transport.clone(),
                p.endpoint.clone().unwrap_or_else(|| "-".into()),
                p.last_handshake_secs.map_or_else(|| "-".into(), |x| format!("{} ago", human_secs(x))),
                p.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let mut o = String::new();
    if rows.is_empty() {
        o.push_str("no peers\n");
    } else {
        let head = [
            "OVERLAY",
            "HOST",
            "STATE",
            "PATH",
            "LATENCY",
            "LOSS",
            "RX / TX",
            "TRANSPORT",
            "ENDPOINT",
            "HANDSHAKE",
            "NOTE",
        ];
        table(&mut o, head, &rows);
    }
    o
}

/// Renders `weft routes`.
pub(crate) fn routes(s: &StatusJson) -> String {
    let rows: Vec<[String; 6]> = s
        .routes
        .iter()
        .map(|r| {
            [
                r.overlay.clone(),
                r.hostname.clone(),
                r.next_hop_hostname.clone().unwrap_or_else(|| r.next_hop.clone()),
                r.hops.to_string(),
                format!("{} ms", r.latency_ms),
                if r.proxied.is_empty() { "-".into() } else { r.proxied.join(",") },
            ]
        })
        .collect();
    let mut o = String::new();
    if rows.is_empty() {
        o.push_str("no routes\n");
    } else {
        table(&mut o, ["DESTINATION", "HOST", "NEXT HOP", "HOPS", "LATENCY", "PROXIED"], &rows);
    }
    o
}

fn table<const N: usize>(o: &mut String, head: [&str; N], rows: &[[String; N]]) {
    let mut w: [usize; N] = head.map(str::len);
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |o: &mut String, cells: &[&str]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let _ = write!(s, "{c:<width$}  ", width = w[i]);
        }
        let _ = writeln!(o, "{}", s.trim_end());
    };
    line(o, &head);
    for r in rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        line(o, &cells);
    }
}

fn human_secs(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(human_bytes(5), "5 B");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_secs(61), "1m01s");
        assert_eq!(human_secs(7300), "2h01m");
    }
}
