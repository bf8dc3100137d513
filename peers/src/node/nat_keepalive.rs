//! Idle direct paths across a NAT. A link sends keepalives every couple of seconds; a
//! session that is not a link sends nothing while idle and lives for
//! [`IDLE_RETIRE`](crate::timing::IDLE_RETIRE): a NAT that forgets an idle UDP
//! mapping sooner (home routers after 30 s to a few minutes; RFC 4787 asks for at
//! least 2) would eat the first packets after a pause, and the pair would fall back to
//! a relay and punch again. So a member behind a NAT keeps each idle direct UDP path
//! that crosses it open with a keepalive every [`Peer::nat_keepalive`]:
//! [`NAT_KEEPALIVE`] at first, halved (down to [`NAT_KEEPALIVE_MIN`]) each time such a
//! path died in a pause. Where a path ends up is the keepalive its
//! NAT needs, measured on that path; a member on a public address or a path inside
//! its own networks sends none.

use std::time::{Duration, Instant};

use tracing::info;
use weft_core::endpoint::{Proto, canonical};

use super::Node;
use crate::identity::PeerKey;
use crate::nat::Mapping;
use crate::peer::Peer;
use crate::timing::{NAT_KEEPALIVE_MIN, ms_since};

#[cfg(doc)]
use crate::timing::NAT_KEEPALIVE;

/// How long this node's own NAT behaviour, as its links see it, is cached.
const MAPPING_FRESH: Duration = Duration::from_secs(10);

impl Node {
    /// This node's mapping behaviour as its links report it (cached a few seconds: it
    /// walks every record).
    pub(crate) fn own_mapping(&mut self, now: Instant) -> Mapping {
        if let Some((at, m)) = self.report.own_mapping
            && now.saturating_duration_since(at) < MAPPING_FRESH
        {
            return m;
        }
        let m = self.nat_side(self.id, &self.sightings()).0.mapping;
        self.report.own_mapping = Some((now, m));
        m
    }

    /// Whether the direct path to `p` leaves through this node's NAT: a UDP path to an
    /// address outside this node's own networks, while its links see it behind a NAT
    /// (or nobody has said yet).
    pub(crate) fn crosses_our_nat(&self, p: &Peer, mapping: Mapping) -> bool {
        let Some(d) = p.path.direct() else { return false };
        if d.endpoint.proto != Proto::Udp || mapping == Mapping::NoNat {
            return false;
        }
        let ip = canonical(d.endpoint.addr).ip();
        !self.cfg.local_networks.iter().any(|(n, len)| weft_core::route::overlaps_ip(*n, *len, ip, 128))
    }

    /// A session that is not a link, on an idle direct path across our NAT: a
    /// keepalive when nothing went out on it for the path's interval.
    pub(super) fn nat_keepalive_due(&mut self, now: Instant, key: &PeerKey) -> bool {
        let mapping = self.own_mapping(now);
        let epoch = self.cfg.epoch;
        let Some(p) = self.peers.get(key) else { return false };
        let Some(tx) = p.tx() else { return false };
        if p.anchor() != crate::peer::Anchor::None || !self.crosses_our_nat(p, mapping) {
            return false;
        }
        let last_tx = tx.session.last_tx_ms().max(ms_since(epoch, tx.created));
        let quiet = Duration::from_millis(ms_since(epoch, now).saturating_sub(last_tx));
        quiet >= p.nat_keepalive
    }

    /// Traffic to `key` resumed and found its direct path silent, the last thing from
    /// it having arrived at `seen`. When that silence began as a pause (longer than
    /// the failover's own wait plus [`NAT_KEEPALIVE_MIN`]: a path cut under traffic
    /// is found sooner) and the path crosses our NAT, the NAT forgot the mapping
    /// within the pause, though our keepalives came every `nat_keepalive`: the
    /// interval is halved, once per pause.
    pub(crate) fn nat_path_died(&mut self, now: Instant, key: &PeerKey, seen: Instant) {
        let mapping = self.own_mapping(now);
        let quiet = now.saturating_duration_since(seen);
        let Some(p) = self.peers.get(key) else { return };
        if p.anchor() != crate::peer::Anchor::None
            || !self.crosses_our_nat(p, mapping)
            || quiet < self.cfg.timers.dead_after + NAT_KEEPALIVE_MIN
            || p.nat_keepalive <= NAT_KEEPALIVE_MIN
            || p.nat_keepalive_shrunk_for == Some(seen)
        {
            return;
        }
        let every = (p.nat_keepalive / 2).max(NAT_KEEPALIVE_MIN);
        info!(
            peer = %key.id(),
            was_s = p.nat_keepalive.as_secs_f32(),
            now_s = every.as_secs_f32(),
            "an idle direct path died across our NAT: keepalives more often on it"
        );
        if let Some(p) = self.peers.get_mut(key) {
            p.nat_keepalive = every;
            p.nat_keepalive_shrunk_for = Some(seen);
        }
    }
}
