//! `weft status`: the runtime's report of itself, from the engine's status, the
//! pipelines' counters and the services'.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use weft_control::{
    AdmissionJson, ExitState, OffloadJson, PathKind, PeerJson, PeerState, PendingJson, PipelineJson, RefusedJson,
    RouteJson, StatusJson,
};
use weft_core::stats::DropCounters;
use weft_peers::status::{NodeStatus, PathStatus};

use super::runtime::Runtime;

pub(crate) fn counters(d: &DropCounters) -> BTreeMap<String, u64> {
    d.nonzero().into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// One member in `weft status`; its drop counters are added to `drops` too.
fn peer_json(p: &weft_peers::status::PeerStatus, st: &NodeStatus, drops: &mut BTreeMap<String, u64>) -> PeerJson {
    let pd = counters(&p.stats.drops);
    for (k, v) in &pd {
        *drops.entry(k.clone()).or_default() += v;
    }
    let (path, via, hops) = match p.path {
        PathStatus::Direct => (PathKind::Direct, None, 1),
        PathStatus::Relay { via, hops } => (PathKind::Relay, Some(via), hops),
        PathStatus::None => (PathKind::None, None, 0),
    };
    let relay = via.and_then(|v| st.peers.iter().find(|q| q.node_id == v));
    // The transport of the first link: to the peer, or to the relay.
    let first_link = match relay {
        Some(r) => r.endpoint,
        None if path == PathKind::Direct => p.endpoint,
        None => None,
    };
    PeerJson {
        node_id: p.node_id.to_string(),
        hostname: p.hostname.clone(),
        overlay: p.overlay.to_string(),
        overlay6: p.overlay6.map(|a| a.to_string()),
        endpoint: p.endpoint.map(|e| e.to_string()),
        path,
        via: via.map(|v| v.to_string()),
        via_hostname: relay.map(|q| q.hostname.clone()),
        hops,
        transport: first_link.map_or_else(|| "none".into(), |e| e.proto.to_string()),
        rtt_ms: p.rtt.map(|r| r.as_secs_f64() * 1000.0),
        loss: p.loss,
        state: match p.state {
            weft_peers::status::PeerState::Connecting => PeerState::Connecting,
            weft_peers::status::PeerState::Down => PeerState::Down,
            weft_peers::status::PeerState::Established => PeerState::Established,
            weft_peers::status::PeerState::Idle => PeerState::Idle,
        },
        link: p.link,
        last_handshake_secs: p.last_handshake.map(|d| d.as_secs()),
        rx_bytes: p.stats.rx_bytes.load(Ordering::Relaxed),
        rx_packets: p.stats.rx_packets.load(Ordering::Relaxed),
        tx_bytes: p.stats.tx_bytes.load(Ordering::Relaxed),
        tx_packets: p.stats.tx_packets.load(Ordering::Relaxed),
        drops: pd,
        error: p.error.clone(),
        protocol: p.protocol,
        secret: p.secret.map(|w| match w {
            weft_core::admission::Which::Current => weft_control::SecretUse::Current,
            weft_core::admission::Which::Next => weft_control::SecretUse::Next,
        }),
        path_mtu: p.path_mtu,
        gso_off: p.gso_off,
        degraded: p.degraded.clone(),
        nat_keepalive_secs: p.nat_keepalive.map(|d| d.as_secs_f64()),
        no_direct: p.no_direct.clone(),
        hard_nat_probes: p.hard_nat.0,
        hard_nat_mappings: p.hard_nat.1,
        punch_packets: p.punches,
        key: crate::daemon::state::hex(&p.key),
        groups: p.groups.clone(),
        cert_not_after: p.cert_not_after,
        neighbours: p
            .neighbours
            .iter()
            .map(|(n, rtt_ms)| weft_control::NeighbourJson { node_id: n.to_string(), rtt_ms: *rtt_ms })
            .collect(),
    }
}

/// The engine's part of `weft status` at `now`: the members, routes, records, exits,
/// subnets and NAT it knows, whatever carries its packets (drops: those counted per
/// member). The runtime adds its own parts (configuration, pipelines, transports,
/// services); the simulator serves this part alone (`meshsim --control`).
pub fn engine_json(st: &NodeStatus, now: Instant) -> StatusJson {
    let mut drops = BTreeMap::new();
    let peers = st.peers.iter().map(|p| peer_json(p, st, &mut drops)).collect();
    StatusJson {
        node_id: st.node_id.to_string(),
        version: env!("CARGO_PKG_VERSION").into(),
        protocol: weft_core::handshake::Protocol::VERSION,
        min_protocol: weft_core::handshake::Protocol::MIN,
        drops,
        peers,
        routes: st
            .routes
            .iter()
            .map(|r| RouteJson {
                node_id: r.node.to_string(),
                hostname: r.hostname.clone(),
                overlay: r.overlay.to_string(),
                overlay6: r.overlay6.map(|a| a.to_string()),
                next_hop: r.next_hop.to_string(),
                next_hop_hostname: st.peers.iter().find(|q| q.node_id == r.next_hop).map(|q| q.hostname.clone()),
                hops: r.hops,
                latency_ms: r.latency_ms,
                session: r.session,
                proxied: r.proxied.iter().map(|(a, p)| format!("{a}/{p}")).collect(),
            })
            .collect(),
        rejected_records: st.rejected_records,
        control_limited: st.control_limited,
        signature_cutoffs: st.signature_cutoffs,
        records_dropped: [
            ("over_budget", st.records_dropped.over_budget),
            ("table_full", st.records_dropped.table_full),
            ("evicted", st.records_dropped.evicted),
            ("uncertified", st.records_dropped.uncertified),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        queued_dropped: st.queued_dropped,
        refused: st.refused.clone(),
        pending_peers: st
            .dials
            .iter()
            .map(|d| PendingJson { endpoint: d.endpoint.to_string(), attempts: d.attempts, error: d.error.clone() })
            .collect(),
        refused_handshakes: st
            .inbound_failures
            .iter()
            .map(|f| RefusedJson {
                from: f.from.to_string(),
                reason: f.reason.clone(),
                kind: f.kind,
                count: f.count,
                last_secs: now.saturating_duration_since(f.last).as_secs(),
            })
            .collect(),
        exit: st.exit.as_ref().map(|e| weft_control::ExitJson {
            wanted: e.wanted.clone(),
            node_id: e.node.as_ref().map(|(id, _)| id.to_string()),
            hostname: e.node.as_ref().map(|(_, h)| h.clone()),
            state: match (&e.node, e.routing) {
                (_, true) => ExitState::Routing,
                (Some(_), false) => ExitState::Unreachable,
                (None, false) if e.changed_to.is_some() => ExitState::Changed,
                (None, false) if e.known => ExitState::NotOffered,
                (None, false) => ExitState::UnknownMember,
            },
            fallback: false,
            pinned: e.pinned.map(|id| id.to_string()),
            changed_to: e
                .changed_to
                .as_ref()
                .map(|(id, h)| weft_control::ExitOfferJson { node_id: id.to_string(), hostname: h.clone() }),
            candidates: e
                .candidates
                .iter()
                .map(|(id, h)| weft_control::ExitOfferJson { node_id: id.to_string(), hostname: h.clone() })
                .collect(),
        }),
        subnets: st
            .subnets
            .iter()
            .map(|s| weft_control::SubnetJson {
                subnet: format!("{}/{}", s.prefix.0, s.prefix.1),
                routers: s
                    .routers
                    .iter()
                    .map(|r| weft_control::RouterJson {
                        node_id: r.node.to_string(),
                        hostname: r.hostname.clone(),
                        priority: r.priority,
                        state: match r.state {
                            weft_peers::status::RouterState::Primary => "primary",
                            weft_peers::status::RouterState::Standby => "standby",
                            weft_peers::status::RouterState::Down => "down",
                        }
                        .to_owned(),
                        why: r.why.clone(),
                    })
                    .collect(),
            })
            .collect(),
        failovers: st.failovers.0,
        failbacks: st.failovers.1,
        withdrawn: st.withdrawn.clone(),
        exit_offers: st
            .exit_offers
            .iter()
            .map(|(id, h)| weft_control::ExitOfferJson { node_id: id.to_string(), hostname: h.clone() })
            .collect(),
        handshakes_completed: st.handshakes_completed,
        stale_renewed: st.stale_renewed,
        handshake_failures: st.handshake_failures.clone(),
        nat: nat_json(&st.nat),
        ..StatusJson::default()
    }
}

impl Runtime {
    pub(super) fn status(&self) -> StatusJson {
        let now = Instant::now();
        let st: NodeStatus = self.engine.status(now);
        let mut drops = counters(&self.drops);
        for (k, v) in self.beacon_drops.iter().flat_map(|d| d.nonzero()) {
            drops.insert(k.to_owned(), v);
        }
        for (k, v) in self.portal.iter().flat_map(crate::services::portal::Portal::drops) {
            drops.insert(format!("wg_{k}"), v);
        }
        for p in self.pipelines.iter().chain(&self.links_stats) {
            for (k, v) in counters(&p.drops) {
                *drops.entry(k).or_default() += v;
            }
        }
        let engine = engine_json(&st, now);
        for (k, v) in &engine.drops {
            *drops.entry(k.clone()).or_default() += v;
        }
        StatusJson {
            network_name: self.cfg.network_name.clone(),
            authority: self.cfg.authorities.first().map(ToString::to_string),
            authorities: self.cfg.authorities.iter().map(ToString::to_string).collect(),
            certificate: self.cfg.certificate.as_ref().map(certificate_json),
            revocations: self.engine.revocations().iter().map(|r| crate::daemon::state::hex(&r.node)).collect(),
            policy: self.policy_json(),
            hostname: self.cfg.hostname.clone(),
            overlay: self.cfg.ipv4.to_string(),
            overlay6: self.ipv6.map(|(a, p)| format!("{a}/{p}")),
            cipher: self.cfg.cipher.to_string(),
            listeners: self.listeners.iter().map(ToString::to_string).collect(),
            connections: self.connector.conns().len(),
            transport_counters: self
                .connector
                .counters()
                .snapshot()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            dev_name: self.cfg.dev_name.clone(),
            offloads: OffloadJson {
                tun: self.tun_queue.is_some() && st.tun_offload_off.is_none(),
                tun_gro: self.tun_queue.is_some() && self.shared.offload.tun_gro(),
                tun_off: st.tun_offload_off.clone().filter(|_| self.tun_queue.is_some()),
                checksum_reports_sent: st.checksum_reports.0,
                checksum_reports_received: st.checksum_reports.1,
                udp_gso: self.shared.offload.gso(),
                udp_gro: self.shared.offload.gro(),
            },
            pipelines: self
                .pipelines
                .iter()
                .map(|p| (p, false))
                .chain(self.links_stats.iter().map(|p| (p, true)))
                .map(|(p, links)| {
                    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                    PipelineJson {
                        tx_packets: l(&p.tx_packets),
                        tx_bytes: l(&p.tx_bytes),
                        tx_batches: l(&p.tx_batches),
                        rx_packets: l(&p.rx_packets),
                        rx_bytes: l(&p.rx_bytes),
                        rx_batches: l(&p.rx_batches),
                        tx_gso_records: l(&p.tx_gso_records),
                        rx_gso_records: l(&p.rx_gso_records),
                        tx_answers: l(&p.tx_answers),
                        forwarded: l(&p.forwarded),
                        drops: counters(&p.drops),
                        links,
                    }
                })
                .collect(),
            threads: self.cfg.threads,
            uptime_secs: now.duration_since(self.started).as_secs(),
            address_conflicts: st
                .conflicts
                .iter()
                .map(|(id, host)| format!("{id} ({host}) also claims {}", self.cfg.ipv4.addr))
                .collect(),
            proxy_networks: self.cfg.proxy_networks.iter().map(ToString::to_string).collect(),
            admission: {
                let a = self.engine.admission(now);
                AdmissionJson {
                    bad_mac: a.bad_mac,
                    rate_limited: a.rate_limited,
                    cookies_sent: a.cookies_sent,
                    cookies_received: a.cookies_received,
                    state_full: 0,
                    evicted: a.evicted,
                    replayed: a.replayed,
                    under_load: a.under_load,
                }
            },
            wg_portal: self.portal.as_ref().map(crate::services::portal::Portal::status),
            exit_node: self.cfg.exit_node,
            magic_dns: self.dns.as_ref().map(|d| {
                let zone = d.zone.load();
                weft_control::MagicDnsJson {
                    domain: zone.domain(),
                    server: d.addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "),
                    name: zone.name_of(self.cfg.ipv4.addr),
                    names: zone.len(),
                    answered: d.stats.answered.load(Ordering::Relaxed),
                    dropped: d.stats.dropped.load(Ordering::Relaxed),
                }
            }),
            control_traffic: self.control_traffic.clone(),
            connections_by_transport: self.connector.conns().by_transport().into_iter().collect(),
            userspace: self.userspace.as_ref().map(crate::notun::Userspace::json),
            port_mapping: self.portmap.as_ref().map(|_| self.portmap_state.borrow().json(Instant::now())),
            drops,
            exit: engine.exit.clone().map(|e| weft_control::ExitJson { fallback: self.cfg.exit_fallback, ..e }),
            ..engine
        }
    }
}

impl Runtime {
    /// The access policy in force, for status.
    fn policy_json(&self) -> Option<weft_control::PolicyJson> {
        let fw = &self.shared.firewall;
        let (source, version, rules, rule_text) = match (&self.policy.loaded, &self.policy.refused) {
            (_, Some(_)) => {
                ("signed by the authority, not applicable here".to_owned(), "refused".to_owned(), 0, Vec::new())
            }
            (Some(l), None) => (
                l.source(),
                l.version.clone(),
                l.policy.rules.len(),
                l.policy.rules.iter().map(crate::services::policy::describe).collect(),
            ),
            (None, None) => return None,
        };
        let hits = fw.active().map(|a| a.hits.iter().map(|h| h.load(Ordering::Relaxed)).collect()).unwrap_or_default();
        Some(weft_control::PolicyJson {
            source,
            version,
            rules,
            refused: self.policy.refused.clone(),
            tests_passed: self.policy.tests.0,
            tests_skipped: self.policy.tests.1,
            flows: fw.flows(),
            denied: fw.denied.load(Ordering::Relaxed),
            table_full: fw.table_full.load(Ordering::Relaxed),
            source_full: fw.source_full.load(Ordering::Relaxed),
            hits,
            rule_text,
            recent_denials: denials_json(&fw.recent_denials(), super::runtime::clock_ms(self.shared.epoch)),
        })
    }
}

/// The firewall's recent denials at `now` (the pipelines' clock), for status.
fn denials_json(list: &[weft_core::firewall::Denial], now: u64) -> Vec<weft_control::DenialJson> {
    let ago = |ms: u64| now.saturating_sub(ms) / 1000;
    list.iter()
        .map(|d| weft_control::DenialJson {
            src: d.src.to_string(),
            dst: d.dst.to_string(),
            proto: weft_core::policy::proto::name(d.proto).into_owned(),
            port: d.dport,
            last_secs_ago: ago(d.last_ms),
            first_secs_ago: ago(d.first_ms),
            count: d.count,
        })
        .collect()
}

/// What this node's certificate grants, for status.
fn certificate_json(c: &weft_core::cert::Certificate) -> weft_control::CertificateJson {
    let b = c.body();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    weft_control::CertificateJson {
        node_id: crate::daemon::state::hex(&b.node),
        name: b.name.clone(),
        ipv4: format!("{}/{}", b.ipv4.0, b.ipv4.1),
        ipv6: b.ipv6.map(|(a, p)| format!("{a}/{p}")),
        groups: b.groups.clone(),
        subnets: b.subnets.iter().map(ToString::to_string).collect(),
        exit: b.exit,
        portal: b.portal,
        not_after: b.not_after,
        expires_in_s: b.not_after.saturating_sub(now),
    }
}

/// Status's `nat`: this node's NAT as its links see it.
fn nat_json(n: &weft_peers::status::NatStatus) -> weft_control::NatJson {
    weft_control::NatJson {
        mapping: n.guess.mapping.as_str().to_owned(),
        certain: n.guess.certain,
        port_preserving: n.guess.port_preserving,
        mapped: n.mapped,
        observed: n
            .observed
            .iter()
            .map(|(by, host, addr)| weft_control::NatObservationJson {
                by: by.to_string(),
                hostname: host.clone(),
                address: addr.to_string(),
            })
            .collect(),
        candidates: n.candidates.iter().map(ToString::to_string).collect(),
        filtering: n.filtering.as_str().to_owned(),
        unasked_from: n.unasked.map(|(a, _)| a.to_string()),
    }
}
