//! What status shows of the engine: the node, its peers and dials, admission counters.

use std::time::Instant;

use super::Node;
use crate::gate::AdmissionStats;
use crate::status::{DialStatus, NodeStatus, PeerStatus};

impl Node {
    /// What admission control did so far.
    pub fn admission(&self, now: Instant) -> AdmissionStats {
        self.gate.stats(now, self.tables())
    }

    /// A summary for status output.
    pub fn status(&self, now: Instant) -> NodeStatus {
        let seen = self.sightings();
        let ours = self.nat_side(self.id, &seen);
        let mut peers: Vec<PeerStatus> = self
            .peers
            .values()
            .map(|p| {
                let mut st = p.status(now, self.path_status(p), self.mesh.paths.contains_key(&p.id));
                if matches!(st.path, crate::status::PathStatus::Relay { .. }) {
                    st.no_direct = Some(self.no_direct(&p.key, &seen, &ours));
                }
                if p.anchor() == crate::peer::Anchor::None && self.crosses_our_nat(p, ours.0.mapping) {
                    st.nat_keepalive = Some(p.nat_keepalive);
                }
                // What its signed record and certificate say: the web console's member
                // page and mesh map.
                let record = self.mesh.topology.get(&p.id);
                if let Some(r) = record {
                    st.neighbours = r.neighbours.iter().map(|n| (n.node, n.rtt_ms)).collect();
                }
                let cert = p.hello.cert.as_deref().or_else(|| record.and_then(|r| r.cert.as_deref()));
                if let Some(c) = cert.and_then(|c| weft_core::cert::Certificate::from_bytes(c).ok()) {
                    st.groups = c.body().groups.clone();
                    st.cert_not_after = Some(c.body().not_after);
                }
                st
            })
            .collect();
        peers.sort_by_key(|p| p.overlay);
        let dials = self
            .dials
            .slots
            .values()
            .filter(|d| d.key.is_none_or(|k| !self.peers.contains_key(&k)))
            .map(|d| DialStatus { endpoint: d.endpoint, error: d.backoff.error.clone(), attempts: d.backoff.failures })
            .collect();
        NodeStatus {
            node_id: self.id,
            routes: self.route_status(),
            conflicts: self.conflicts(),
            peers,
            dials,
            inbound_failures: self.report.inbound_failures.iter().cloned().collect(),
            rejected_records: self.mesh.rejected_records,
            control_limited: self.mesh.control_limited,
            signature_cutoffs: self.mesh.signature_cutoffs,
            records_dropped: {
                let (table_full, evicted) = self.mesh.topology.full_counts();
                crate::status::RecordsDropped {
                    over_budget: self.mesh.records_over_budget,
                    table_full,
                    evicted,
                    uncertified: self.mesh.records_uncertified,
                }
            },
            refused: self.refused_claims(),
            queued_dropped: self.report.queued_dropped,
            handshakes_completed: self.report.handshakes_completed,
            stale_renewed: self.report.stale_renewed,
            handshake_failures: self.report.handshake_failures.clone(),
            exit_offers: self.exit_offers(),
            exit: self.exit_status(),
            subnets: self.subnet_status(now),
            failovers: (self.routers.failovers, self.routers.failbacks),
            withdrawn: self.withdrawn.clone(),
            nat: self.nat_status(&seen),
            checksum_reports: (self.report.checksum_reports_sent, self.report.checksum_reports_received),
            tun_offload_off: self.report.tun_offload_off.clone(),
        }
    }
}
