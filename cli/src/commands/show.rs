//! Tables for people.

use std::borrow::Cow;
use std::fmt::Write;

use weft_control::{PathKind, StatusJson};

/// Renders `weft status`.
pub(crate) fn status(s: &StatusJson) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "node      {} ({})", s.node_id, s.hostname);
    let _ = writeln!(o, "network   {}", s.network_name);
    match &s.userspace {
        Some(_) => {
            let _ = writeln!(o, "address   {} in the userspace stack (no TUN)", s.overlay);
        }
        None => {
            let _ = writeln!(o, "address   {} on {}", s.overlay, s.dev_name);
        }
    }
    if let Some(a6) = &s.overlay6 {
        let _ = writeln!(o, "ipv6      {a6}");
    }
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
    if let Some(why) = &s.offloads.tun_off {
        let _ = writeln!(o, "          TUN offload turned off: {}", printable(why));
    }
    let gso_off: Vec<String> =
        s.peers.iter().filter(|p| p.gso_off).map(|p| printable(&p.hostname).into_owned()).collect();
    if !gso_off.is_empty() {
        let _ = writeln!(
            o,
            "          UDP GSO off on the paths to {} (they lose offloaded batches; datagrams go one by one)",
            gso_off.join(", ")
        );
    }
    let notable: Vec<String> =
        s.transport_counters.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(o, "links     {} connections {}", s.connections, notable.join(" "));
    let _ = writeln!(o, "uptime    {}", human_secs(s.uptime_secs));
    if !s.proxy_networks.is_empty() {
        let _ = writeln!(o, "proxies   {}", s.proxy_networks.join(", "));
    }
    if let Some(p) = &s.wg_portal {
        let _ = writeln!(
            o,
            "portal    WireGuard on {} for {} ({} on {}), {} clients",
            p.listen,
            p.net,
            p.public_key,
            p.dev_name,
            p.clients.len()
        );
    }
    if s.exit_node {
        let _ = writeln!(o, "exit      this node offers the internet to members (--exit-node)");
    }
    if let Some(e) = &s.exit {
        let name = e.hostname.as_deref().unwrap_or(&e.wanted);
        let then = if e.fallback { "own route while unreachable" } else { "dropped while unreachable" };
        let _ = writeln!(o, "exit      via {name}: {} ({then})", e.state.as_str().replace('_', " "));
        if let Some(c) = &e.changed_to {
            let _ = writeln!(
                o,
                "          {:?} now matches member {} ({}), not the pinned {}: run `weft exit accept` to use it",
                printable(&e.wanted),
                printable(&c.node_id),
                printable(&c.hostname),
                e.pinned.as_deref().map(printable).unwrap_or_default()
            );
        }
        if !e.candidates.is_empty() {
            let names: Vec<String> = e.candidates.iter().map(|c| printable(&c.hostname).into_owned()).collect();
            let _ =
                writeln!(o, "          exits in order of preference: {} ({} failovers)", names.join(", "), s.failovers);
        }
    }
    if let Some(w) = &s.withdrawn {
        let _ = writeln!(o, "subnets   withdrawn from the mesh: {}", printable(w));
    }
    if let Some(u) = &s.userspace {
        if let Some(a) = &u.socks5 {
            let auth = if u.socks5_auth { ", user and password" } else { "" };
            let _ = writeln!(
                o,
                "socks5    {a}{auth}: {} connects, {} udp associations, {} refused",
                u.socks5_connects, u.socks5_associations, u.socks5_refused
            );
        }
        for f in &u.forwards {
            let _ = writeln!(o, "forward   {f}");
        }
        for e in &u.exposes {
            let _ = writeln!(o, "expose    {e}");
        }
        if u.expose_refused > 0 {
            let _ = writeln!(o, "expose    {} connections or flows refused at the cap", u.expose_refused);
        }
        let _ = writeln!(
            o,
            "stack     {} tcp connections, {} udp sockets, {} relayed, {} failed, packets {} in {} out, dropped {} in {} out",
            u.tcp_connections,
            u.udp_sockets,
            u.relayed,
            u.failed,
            u.packets_in,
            u.packets_out,
            u.dropped_in,
            u.dropped_out
        );
    }
    if let Some(m) = &s.port_mapping {
        let _ = writeln!(o, "port map  {}", port_mapping(m));
    }
    if let Some(d) = &s.magic_dns {
        let name = d.name.as_deref().unwrap_or("-");
        let _ = writeln!(o, "dns       {name} on {} ({} names in {})", d.server, d.names, d.domain);
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
    o.lines().map(|l| format!("{}\n", printable(l))).collect()
}

/// `s` with every control character (C0, DEL, C1: what a terminal may take for the
/// start of an escape sequence or a cursor move) and every bidirectional override
/// (which reorders what follows on the line) shown as a `\u{..}` escape. Host names
/// and error texts come from peers; they must not reach a terminal raw.
pub(crate) fn printable(s: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.chars().map(|c| if unsafe_char(c) { c.escape_unicode().to_string() } else { c.to_string() }).collect())
}

/// Renders `weft peers`.
pub(crate) fn peers(s: &StatusJson) -> String {
    let rows: Vec<[String; 12]> = s
        .peers
        .iter()
        .map(|p| {
            let path = match (p.path, &p.via_hostname, &p.via) {
                (PathKind::Relay, Some(h), _) if !h.is_empty() => format!("relay via {h} ({} hops)", p.hops),
                (PathKind::Relay, _, Some(v)) => format!("relay via {v} ({} hops)", p.hops),
                (other, _, _) => other.to_string(),
            };
            [
                p.overlay.clone(),
                p.overlay6.clone().unwrap_or_else(|| "-".into()),
                p.hostname.clone(),
                p.state.to_string(),
                path,
                p.rtt_ms.map_or_else(|| "-".into(), |r| format!("{r:.1} ms")),
                p.loss.map_or_else(|| "-".into(), |l| format!("{:.0}%", l * 100.0)),
                format!("{} / {}", human_bytes(p.rx_bytes), human_bytes(p.tx_bytes)),
                p.transport.clone(),
                p.endpoint.clone().unwrap_or_else(|| "-".into()),
                p.last_handshake_secs.map_or_else(|| "-".into(), |x| format!("{} ago", human_secs(x))),
                // Why the path is what it is, then the last error.
                [
                    p.degraded.clone(),
                    p.no_direct.clone(),
                    p.error.clone(),
                    p.gso_off.then(|| "UDP GSO off for this path".to_owned()),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; "),
            ]
        })
        .collect();
    let mut o = String::new();
    if rows.is_empty() {
        o.push_str("no peers\n");
    } else {
        let head = [
            "OVERLAY",
            "IPV6",
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
    if s.wg_portal.as_ref().is_some_and(|p| !p.clients.is_empty()) {
        o.push('\n');
        o.push_str(&portal(s));
    }
    o
}

/// Renders `weft wg list`.
pub(crate) fn portal(s: &StatusJson) -> String {
    let Some(p) = &s.wg_portal else {
        return "this node runs no WireGuard portal (start it with --wg-portal udp://ADDR:PORT --wg-portal-net CIDR)\n"
            .into();
    };
    let mut o = String::new();
    let _ = writeln!(o, "portal {} for {} (public key {})", p.listen, p.net, p.public_key);
    if !p.drops.is_empty() {
        let d: Vec<String> = p.drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(o, "drops  {}", d.join(" "));
    }
    if p.clients.is_empty() {
        o.push_str("no clients (add one with `weft wg add NAME`)\n");
        return o.lines().map(|l| format!("{}\n", printable(l))).collect();
    }
    let rows: Vec<[String; 6]> = p
        .clients
        .iter()
        .map(|c| {
            [
                c.name.clone(),
                c.address.clone(),
                c.endpoint.clone().unwrap_or_else(|| "-".into()),
                c.last_handshake_secs.map_or_else(|| "never".into(), |x| format!("{} ago", human_secs(x))),
                format!("{} / {}", human_bytes(c.rx_bytes), human_bytes(c.tx_bytes)),
                c.public_key.clone(),
            ]
        })
        .collect();
    table(&mut o, ["CLIENT", "ADDRESS", "ENDPOINT", "HANDSHAKE", "RX / TX", "PUBLIC KEY"], &rows);
    o
}

/// Renders `weft routes`.
pub(crate) fn routes(s: &StatusJson) -> String {
    let rows: Vec<[String; 7]> = s
        .routes
        .iter()
        .map(|r| {
            [
                r.overlay.clone(),
                r.overlay6.clone().unwrap_or_else(|| "-".into()),
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
        table(&mut o, ["DESTINATION", "IPV6", "HOST", "NEXT HOP", "HOPS", "LATENCY", "PROXIED"], &rows);
    }
    // Subnets with their routers: which is primary and why.
    let rows: Vec<[String; 5]> = s
        .subnets
        .iter()
        .flat_map(|n| {
            n.routers.iter().enumerate().map(|(i, r)| {
                [
                    if i == 0 { n.subnet.clone() } else { String::new() },
                    r.hostname.clone(),
                    r.priority.to_string(),
                    r.state.clone(),
                    r.why.clone(),
                ]
            })
        })
        .collect();
    if !rows.is_empty() {
        o.push('\n');
        table(&mut o, ["SUBNET", "ROUTER", "PRIORITY", "STATE", "WHY"], &rows);
        let _ = writeln!(o, "failovers {}, back to a preferred router {}", s.failovers, s.failbacks);
    }
    o
}

fn table<const N: usize>(o: &mut String, head: [&str; N], rows: &[[String; N]]) {
    let rows: Vec<[String; N]> = rows.iter().map(|r| r.clone().map(|c| printable(&c).into_owned())).collect();
    let rows = rows.as_slice();
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
    // Decimal units, as the desktop window shows them.
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

/// `weft policy denials`: the last flows the policy denied, with member names.
pub(crate) fn denials(s: &StatusJson) -> String {
    let Some(p) = &s.policy else { return "no access policy: nothing is denied\n".to_owned() };
    if p.recent_denials.is_empty() {
        return format!("no flow denied since the node started ({} packets denied in all)\n", p.denied);
    }
    let own = s.overlay.split('/').next().unwrap_or_default();
    let who = |a: &str| {
        let name = s.peers.iter().find(|m| m.overlay == a).map(|m| m.hostname.as_str());
        let name = if a == own { Some(s.hostname.as_str()) } else { name };
        match name {
            Some(n) if !n.is_empty() => format!("{} ({a})", printable(n)),
            _ => a.to_owned(),
        }
    };
    let mut o = format!("{:<36} {:<36} {:<7} {:>5} {:>9} {:>8}\n", "FROM", "TO", "PROTO", "PORT", "LAST", "TIMES");
    for d in &p.recent_denials {
        let _ = writeln!(
            o,
            "{:<36} {:<36} {:<7} {:>5} {:>9} {:>8}",
            who(&d.src),
            who(&d.dst),
            printable(&d.proto),
            d.port,
            format!("{} s ago", d.last_secs_ago),
            d.count
        );
    }
    let _ = writeln!(o, "{} packets denied in all", p.denied);
    o
}

/// Renders `weft netcheck`: this node's NAT as its links see it, its port mapping,
/// its candidates, and why each relayed member has no direct path.
pub(crate) fn netcheck(s: &StatusJson) -> String {
    let n = &s.nat;
    let mut o = String::new();
    let how = if n.certain {
        format!("seen by {} members", n.observed.len())
    } else if n.observed.is_empty() {
        "no member reported where it sees this node yet".to_owned()
    } else {
        "a guess: seen by one member only".to_owned()
    };
    let _ = writeln!(o, "mapping      {} ({how})", printable(&n.mapping));
    let preserving = match n.port_preserving {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    };
    let _ = writeln!(o, "port kept    {preserving}");
    if !n.filtering.is_empty() {
        let why = match (n.filtering.as_str(), &n.unasked_from) {
            ("endpoint-independent", Some(from)) => format!(" (a packet from {} got in unasked)", printable(from)),
            ("dependent or untested", _) => " (only answers to this node's own packets got in so far)".to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(o, "filtering    {}{why}", printable(&n.filtering));
    }
    for seen in &n.observed {
        let host = if seen.hostname.is_empty() { &seen.by } else { &seen.hostname };
        let _ = writeln!(o, "seen by      {} at {}", printable(host), printable(&seen.address));
    }
    let mapping = s.port_mapping.as_ref().map_or_else(|| "off".to_owned(), port_mapping);
    let _ = writeln!(o, "port map     {mapping}");
    let candidates =
        if n.candidates.is_empty() { "none".to_owned() } else { printable(&n.candidates.join(" ")).into_owned() };
    let _ = writeln!(o, "candidates   {candidates}");
    for p in s.peers.iter().filter(|p| p.path == PathKind::Relay) {
        let why = p.no_direct.as_deref().unwrap_or("-");
        let _ = writeln!(o, "relayed      {} ({}): {}", printable(&p.hostname), p.overlay, printable(why));
    }
    o
}

/// The port mapping line of `weft status`: what the router mapped, or why nothing.
fn port_mapping(m: &weft_control::PortMapJson) -> String {
    match (&m.protocol, &m.external) {
        (Some(p), Some(e)) => {
            let told = if m.advertised { "announced" } else { "not announced: the router's address is private" };
            let expires = m.expires_in_s.map(|s| format!(", lease {s} s")).unwrap_or_default();
            let remaps = if m.remaps > 0 { format!(", mapped again {} times", m.remaps) } else { String::new() };
            format!("{p} {} -> port {} ({told}{expires}{remaps})", printable(e), m.internal_port)
        }
        _ => {
            let gw = m.gateway.as_deref().map(|g| format!(" by {}", printable(g))).unwrap_or_default();
            match &m.last_error {
                Some(e) => format!("none{gw}: {}", printable(e)),
                None => format!("asking{gw} for port {}", m.internal_port),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_mapping_line_says_what_was_mapped_or_why_not() {
        let mut m = weft_control::PortMapJson {
            gateway: Some("10.1.0.1".into()),
            internal_port: 11010,
            protocol: Some(weft_control::PortMapProtocol::Pcp),
            external: Some("100.200.0.2:11010".into()),
            advertised: true,
            expires_in_s: Some(7190),
            last_error: None,
            remaps: 0,
        };
        assert_eq!(port_mapping(&m), "pcp 100.200.0.2:11010 -> port 11010 (announced, lease 7190 s)");
        m.remaps = 2;
        m.advertised = false;
        assert!(port_mapping(&m).contains("not announced") && port_mapping(&m).ends_with("mapped again 2 times)"));
        m.protocol = None;
        m.external = None;
        m.last_error = Some("pcp: no answer\x1b[2J".into());
        assert_eq!(port_mapping(&m), "none by 10.1.0.1: pcp: no answer\\u{1b}[2J");
    }

    #[test]
    fn netcheck_says_what_the_nat_does_and_why_members_are_relayed() {
        let mut s: StatusJson = serde_json::from_value(serde_json::json!({
            "node_id": "00", "network_name": "n", "hostname": "a", "overlay": "10.0.0.1/24",
            "cipher": "aes-128-gcm", "listeners": [], "dev_name": "weft0",
            "offloads": {"tun": false, "tun_gro": false, "udp_gso": false, "udp_gro": false},
            "pipelines": [], "threads": 1, "uptime_secs": 1, "drops": {}, "peers": [], "routes": [],
            "address_conflicts": [], "proxy_networks": [], "pending_peers": [], "refused_handshakes": [],
            "nat": {"mapping": "endpoint-dependent", "certain": true, "port_preserving": false, "mapped": false,
                    "observed": [{"by": "11", "hostname": "p", "address": "198.51.100.7:40000"},
                                 {"by": "22", "hostname": "", "address": "198.51.100.7:52113"}],
                    "candidates": ["udp://198.51.100.7:40000", "udp://10.1.0.2:11010"]},
        }))
        .unwrap();
        for (id, path, why) in [("33", "relay", Some("both sides endpoint-dependent\x1b[2J")), ("44", "direct", None)] {
            s.peers.push(
                serde_json::from_value(serde_json::json!({
                    "node_id": id, "hostname": "b", "overlay": format!("10.0.0.{id}"), "endpoint": null,
                    "path": path, "via": null, "via_hostname": null, "hops": 2, "transport": "udp",
                    "rtt_ms": null, "loss": null, "state": "established", "last_handshake_secs": null,
                    "rx_bytes": 0, "rx_packets": 0, "tx_bytes": 0, "tx_packets": 0, "drops": {}, "error": null,
                    "no_direct": why,
                }))
                .unwrap(),
            );
        }
        let text = netcheck(&s);
        assert!(text.starts_with("mapping      endpoint-dependent (seen by 2 members)\nport kept    no\n"), "{text}");
        // An observer without a host name is named by its id.
        assert!(
            text.contains("seen by      p at 198.51.100.7:40000\nseen by      22 at 198.51.100.7:52113\n"),
            "{text}"
        );
        assert!(text.contains("port map     off\n"), "{text}");
        assert!(text.contains("candidates   udp://198.51.100.7:40000 udp://10.1.0.2:11010\n"), "{text}");
        // Relayed members only, their reason escaped.
        assert!(text.ends_with("relayed      b (10.0.0.33): both sides endpoint-dependent\\u{1b}[2J\n"), "{text}");
        assert!(!text.contains("10.0.0.44"), "{text}");
        // The same reason is the NOTE of `weft peers`.
        assert!(peers(&s).contains("both sides endpoint-dependent"));
    }

    #[test]
    fn units() {
        assert_eq!(human_bytes(5), "5 B");
        assert_eq!(human_bytes(2048), "2.0 kB");
        assert_eq!(human_bytes(75_900_000), "75.9 MB");
        assert_eq!(human_secs(61), "1m01s");
        assert_eq!(human_secs(7300), "2h01m");
    }

    #[test]
    fn peer_strings_cannot_drive_the_terminal() {
        assert_eq!(printable("node-α 1"), "node-α 1");
        assert_eq!(printable("evil\x1b[2J\x1b]0;pwned\x07"), "evil\\u{1b}[2J\\u{1b}]0;pwned\\u{7}");
        assert_eq!(printable("a\u{9b}31mb\x7f\r\n"), "a\\u{9b}31mb\\u{7f}\\u{d}\\u{a}");
        assert_eq!(printable("gpj.\u{202e}exe"), "gpj.\\u{202e}exe");

        // Whole tables: a host name with an ANSI escape arrives escaped in every view.
        let evil = "h\x1b[31mred\x1b[0m";
        let mut s: StatusJson = serde_json::from_value(serde_json::json!({
            "node_id": "00", "network_name": "n", "hostname": evil, "overlay": "10.0.0.1/24",
            "cipher": "aes-128-gcm", "listeners": [], "dev_name": "weft0",
            "offloads": {"tun": false, "tun_gro": false, "udp_gso": false, "udp_gro": false},
            "pipelines": [], "threads": 1, "uptime_secs": 1, "drops": {}, "peers": [], "routes": [],
            "address_conflicts": [format!("11 ({evil}) also claims 10.0.0.1")], "proxy_networks": [],
            "pending_peers": [{"endpoint": "udp://1.2.3.4:5", "attempts": 1, "error": evil}],
            "refused_handshakes": [{"from": "udp://1.2.3.4:5", "reason": evil, "count": 1, "last_secs": 1}],
        }))
        .unwrap();
        s.peers.push(
            serde_json::from_value(serde_json::json!({
                "node_id": "11", "hostname": evil, "overlay": "10.0.0.2", "endpoint": null, "path": "relay",
                "via": "22", "via_hostname": evil, "hops": 2, "transport": "udp", "rtt_ms": null, "loss": null,
                "state": "established", "last_handshake_secs": null, "rx_bytes": 0, "rx_packets": 0,
                "tx_bytes": 0, "tx_packets": 0, "drops": {}, "error": evil,
            }))
            .unwrap(),
        );
        s.routes.push(
            serde_json::from_value(serde_json::json!({
                "node_id": "11", "hostname": evil, "overlay": "10.0.0.2", "next_hop": "22",
                "next_hop_hostname": evil, "hops": 2, "latency_ms": 1, "session": true, "proxied": [],
            }))
            .unwrap(),
        );
        s.wg_portal = Some(
            serde_json::from_value(serde_json::json!({
                "listen": "udp://0.0.0.0:51820", "net": "10.127.0.0/24", "dev_name": "wg-weft0",
                "public_key": "k", "drops": {},
                "clients": [{"name": evil, "address": "10.127.0.2", "public_key": "p", "endpoint": null,
                    "last_handshake_secs": null, "rx_bytes": 0, "tx_bytes": 0, "rx_packets": 0, "tx_packets": 0}],
            }))
            .unwrap(),
        );
        assert!(!status(&s).contains("GSO off"));
        s.peers[0].gso_off = true;
        assert!(status(&s).contains("UDP GSO off on the paths to h\\u{1b}[31mred"), "{}", status(&s));
        for out in [status(&s), peers(&s), routes(&s), portal(&s)] {
            assert!(!out.contains('\x1b'), "{out}");
            assert!(out.contains("h\\u{1b}[31mred"), "{out}");
            assert!(out.chars().all(|c| c == '\n' || !c.is_control()), "{out}");
        }
    }
}
