//! Direct paths and hole punching: which way a member is reached (direct, over which
//! transport, or through a relay), upgrades to a better transport, punches, and the
//! sealed control messages sent on those paths.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rand::RngCore;
use tracing::{debug, info};
use weft_core::endpoint::{Endpoint, Proto};
use weft_core::wire::{DATA_HEADER_LEN, FLAG_CONTROL};

use crate::identity::{NodeId, PeerKey};
use crate::mesh::{MAX_CANDIDATES, Msg};
use crate::node::{Dest, Node, ms_since};
use crate::peer::{Backoff, Peer, PeerPath};

/// First hole-punching retry delay (doubles up to `PUNCH_MAX`).
pub(crate) const PUNCH_FIRST: Duration = Duration::from_secs(2);

pub(crate) const PUNCH_MAX: Duration = Duration::from_secs(30);

/// A peer's punch requests are answered at most this often (its own retries back off
/// from `PUNCH_FIRST`).
pub(crate) const PUNCH_ANSWER_EVERY: Duration = Duration::from_secs(1);

/// Destinations remembered for the per-destination punch limit.
pub(crate) const MAX_PUNCHED: usize = 1024;

/// First probe of a better transport (doubles up to `UPGRADE_MAX`).
pub(crate) const UPGRADE_FIRST: Duration = Duration::from_secs(5);

pub(crate) const UPGRADE_MAX: Duration = Duration::from_secs(60);

/// A direct UDP path carrying data is probed this often for loss.
pub(crate) const LOSS_PROBE_EVERY: Duration = Duration::from_millis(500);
/// Probes decided on a direct path before its loss is judged.
const LOSS_SAMPLES: usize = 8;
/// A direct path losing this share of its probes (while keepalives pass) is left.
const LOSS_LIMIT: f32 = 0.3;
/// A degraded path is left this long the first time, twice as long each time it
/// degrades again soon after, at most [`DEGRADED_HOLD_MAX`].
const DEGRADED_HOLD: Duration = Duration::from_secs(15);
const DEGRADED_HOLD_MAX: Duration = Duration::from_secs(300);

/// Whether a peer's direct path is checked for loss: UDP, with data flowing.
pub(crate) fn loss_watched(p: &Peer, now: Instant) -> bool {
    p.path.direct().is_some_and(|d| d.endpoint.proto == Proto::Udp)
        && p.activity.active(now, crate::node::ACTIVE_WINDOW)
}

/// Packets for a member without a session that one snapshot hands the engine, at most.
pub(crate) const DEMAND_BUDGET: u32 = 8;

/// Whether a direct path is watched (failover, upgrades, falling back when silent):
/// a link's always, a traffic shortcut's while data flows (an idle one is silent by
/// design and goes with its session).
pub(crate) fn watched(p: &Peer, now: Instant) -> bool {
    p.anchor() != crate::peer::Anchor::None || p.activity.active(now, crate::node::ACTIVE_WINDOW)
}

/// Appends the endpoints of `eps` that `out` does not hold yet.
pub(crate) fn push_new<'a>(out: &mut Vec<Endpoint>, eps: impl IntoIterator<Item = &'a Endpoint>) {
    for e in eps {
        if !out.contains(e) {
            out.push(*e);
        }
    }
}

impl Node {
    /// Authenticated packets of a session arrive straight from `from`: that address is
    /// a working direct path to the peer (a hole punch succeeded, or it roamed).
    ///
    /// The peer moves there when it is a better transport than the current path, the
    /// same host over UDP from another port (NAT rebinding, a moved listener), or
    /// the current path is stale (nothing arrived on it lately): so a node prefers
    /// UDP, then QUIC, TCP, WebSocket, and follows whichever path still works.
    pub(crate) fn handle_direct(&mut self, now: Instant, local_index: u32, from: Endpoint) {
        self.note_arrival(now, from);
        let Some(key) = self.key_of_session(local_index) else { return };
        if self.tunnelled(&from) {
            // It came through our own tunnel (the peer sent to one of our addresses
            // that its kernel routes into the overlay): a path over the overlay would
            // carry the overlay inside itself.
            debug!(%from, "not a direct path: the address is routed through the tunnel");
            return;
        }
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.degraded.as_ref().is_some_and(|g| g.refuses(&from, now)) {
            // Left because it lost data: not taken again before its hold ends (nor,
            // when left for a relay, another transport across the same lossy network).
            return;
        }
        let current = p.path.endpoint();
        if current == Some(from) {
            if let PeerPath::Direct(d) = &mut p.path {
                d.seen = Some(now);
                return;
            }
        } else {
            let better = current.is_none_or(|cur| from.proto < cur.proto);
            // The same host over UDP from another port: its NAT rebound or its node
            // moved its sockets (a reload), and the old port is gone. (Not for stream
            // transports: two connections between the same hosts would flap.)
            let moved = current.is_some_and(|cur| {
                cur.proto == Proto::Udp && from.proto == Proto::Udp && cur.addr.ip() == from.addr.ip()
            });
            if p.path.is_direct() && !better && !moved && !p.path_stale(now, &self.cfg.timers) {
                return;
            }
        }
        info!(peer = %p.id, %from, "direct path up");
        p.path.go_direct(from, now);
        p.punch = Backoff::default();
        p.punch_rounds = 0;
        p.birthday = None;
        self.mesh.record_changed(now);
        self.published.routes_dirty = true;
        if p.is_link(now) {
            self.send_summary(now, key);
        }
        // Answered at once from here: the other end learns the path too (after the
        // birthday method, this is the packet the easy side waits for).
        self.punch_to(now, &key, &[from]);
        self.touch(key);
    }

    /// A direct path's timers: silent for `dead_after`, it falls back to the relay;
    /// while stale, session keepalives go to every other candidate (the first to
    /// answer becomes the path: failover, e.g. from a UDP path a firewall started
    /// dropping to TCP); while it works but a better transport is announced, that one
    /// is tried now and then (upgrade, with backoff).
    pub(crate) fn drive_direct(&mut self, now: Instant, key: PeerKey) {
        let t = self.cfg.timers;
        let epoch = self.cfg.epoch;
        let now_ms = ms_since(epoch, now);
        let Some(p) = self.peers.get_mut(&key) else { return };
        let Some(d) = p.path.direct() else { return };
        if !p.is_up() || !watched(p, now) {
            return;
        }
        let last = p.sessions.iter().map(|s| s.session.last_direct_rx_ms()).max().unwrap_or(0);
        if now_ms.saturating_sub(last.max(ms_since(epoch, d.since))) >= t.dead_after.as_millis() as u64 {
            info!(peer = %p.id, "direct path silent; falling back to relay");
            if last > 0 {
                // Silent since a pause: the NAT may have forgotten the path.
                self.nat_path_died(now, &key, epoch + Duration::from_millis(last - 1));
            }
            let Some(p) = self.peers.get_mut(&key) else { return };
            p.path.lose_direct();
            self.mesh.record_changed(now);
            self.published.routes_dirty = true;
            return;
        }
        let stale = p.path_stale(now, &self.cfg.timers);
        if stale && let Some(seen) = d.seen {
            // Traffic resumed after a pause and found the path silent: the NAT may
            // have forgotten it (`nat_keepalive`).
            self.nat_path_died(now, &key, seen);
        }
        let Some(p) = self.peers.get_mut(&key) else { return };
        let Some(d) = p.path.direct() else { return };
        let due = if stale {
            d.failover_next.is_none_or(|x| now >= x)
        } else {
            // Nothing beats UDP: no candidate scan for a peer already on it.
            d.endpoint.proto != Proto::Udp && d.upgrade.next_attempt.is_none_or(|x| now >= x)
        };
        if !due {
            return;
        }
        let current = d.endpoint;
        let targets: Vec<Endpoint> =
            self.candidates(&key).into_iter().filter(|c| *c != current && (stale || c.proto < current.proto)).collect();
        let jitter = self.rng.next_u32();
        let Some(PeerPath::Direct(d)) = self.peers.get_mut(&key).map(|p| &mut p.path) else { return };
        if stale {
            d.failover_next = Some(now + t.keepalive);
        } else {
            d.upgrade.back_off(now, UPGRADE_FIRST, UPGRADE_MAX, jitter);
        }
        if !targets.is_empty() {
            debug!(peer = %key.id(), failover = stale, candidates = targets.len(), "probing other paths");
            self.punch_to(now, &key, &targets);
        }
    }

    /// A direct path that passes keepalives but loses data: when it lost more than
    /// [`LOSS_LIMIT`] of its last probes, traffic moves to a relay (a shortcut
    /// between members that both reach a relay) or another of the member's transports
    /// (a link), and the path is left alone for a while ([`DEGRADED_HOLD`], doubling
    /// while it keeps degrading); then it is tried again, and kept if it is healthy.
    pub(crate) fn check_degraded(&mut self, now: Instant, key: PeerKey) {
        let Some(p) = self.peers.get(&key) else { return };
        let Some(d) = p.path.direct() else { return };
        if !loss_watched(p, now) {
            return;
        }
        let (decided, lost) = p.probe.decided_since(d.since, now);
        if decided < LOSS_SAMPLES || (lost as f32) < LOSS_LIMIT * decided as f32 {
            return;
        }
        let endpoint = d.endpoint;
        let relay = self
            .mesh
            .paths
            .get(&p.id)
            .filter(|path| path.next_hop != p.id)
            .and_then(|path| self.peer_by_id(path.next_hop))
            .filter(|hop| hop.is_up() && hop.path.is_direct())
            .map(|hop| hop.hello.hostname.clone());
        let other = self.candidates(&key).into_iter().any(|c| c != endpoint && c.proto != Proto::Udp);
        if relay.is_none() && !other {
            // Nowhere else to go: a lossy path beats none.
            return;
        }
        let Some(p) = self.peers.get_mut(&key) else { return };
        let hold = match &p.degraded {
            Some(g) if now < g.until + 2 * g.hold => (g.hold * 2).min(DEGRADED_HOLD_MAX),
            _ => DEGRADED_HOLD,
        };
        let pct = lost * 100 / decided;
        let to = match &relay {
            Some(h) => format!("relayed through {h}"),
            None => "another transport".to_owned(),
        };
        let why =
            format!("direct path {endpoint} lost {pct}% of its probes: {to}, tried again in {} s", hold.as_secs());
        tracing::warn!(peer = %p.id, "{why}");
        p.degraded = Some(crate::peer::Degraded { endpoint, until: now + hold, hold, why, relayed: relay.is_some() });
        p.probe.recent.clear();
        if relay.is_some() {
            p.path.lose_direct();
        } else if let PeerPath::Direct(d) = &mut p.path {
            // Stale: every other candidate is probed, and the first to answer takes over.
            d.seen = None;
            d.failover_next = None;
        }
        self.mesh.record_changed(now);
        self.published.routes_dirty = true;
        self.touch(key);
    }

    /// When [`Node::drive_direct`] next has work for a peer.
    pub(crate) fn direct_deadline(&self, p: &Peer, now: Instant) -> Option<Instant> {
        let d = p.path.direct()?;
        if !p.is_up() || !watched(p, now) {
            return None;
        }
        if p.path_stale(now, &self.cfg.timers) {
            return Some(d.failover_next.unwrap_or(d.since));
        }
        let stale_at = d.seen.unwrap_or(d.since) + self.cfg.timers.stale_after();
        let upgrade = (d.endpoint.proto != Proto::Udp).then(|| d.upgrade.next_attempt.unwrap_or(d.since));
        Some(upgrade.map_or(stale_at, |u| u.min(stale_at)))
    }

    /// A connection (TCP, WebSocket, QUIC) closed or could not be opened: peers whose
    /// path it was look for another at once, and a handshake waiting on it fails now
    /// with the reason instead of timing out.
    pub(crate) fn handle_connection_down(&mut self, now: Instant, endpoint: Endpoint, error: &str) {
        let mut hit = Vec::new();
        for p in self.peers.values_mut() {
            if let PeerPath::Direct(d) = &mut p.path
                && d.endpoint == endpoint
            {
                debug!(peer = %p.id, %endpoint, error, "path's connection is down");
                d.seen = None;
                d.failover_next = None;
                hit.push(p.key);
            }
        }
        for k in hit {
            self.touch(k);
        }
        self.fail_handshakes_to(now, endpoint, error);
    }

    /// For a relayed peer with traffic: send to its known addresses directly and ask
    /// it (through the relay) to do the same towards ours, so both NATs open at once.
    pub(crate) fn punch(&mut self, now: Instant, key: PeerKey) {
        let theirs = self.punchable(now, &key);
        let ours = self.candidates(&PeerKey(self.cfg.handshake.local.public));
        let jitter = self.rng.next_u32();
        let Some(p) = self.peers.get_mut(&key) else { return };
        p.punch.back_off(now, PUNCH_FIRST, PUNCH_MAX, jitter);
        if theirs.is_empty() && ours.is_empty() {
            return;
        }
        p.punch_rounds = p.punch_rounds.saturating_add(1);
        self.send_msg(&key, &Msg::Punch(ours), now);
        self.punch_to(now, &key, &theirs);
        self.birthday_after_punch(now, &key, &theirs);
    }

    /// A peer asks us to send to it directly at `eps` now. Only addresses where it
    /// was really seen are used ([`Node::punchable`]), never an address a member names
    /// or announces in its own record (that would make us send to a third party for
    /// it), at most once a second per peer and once a second per destination.
    pub(crate) fn handle_punch(&mut self, now: Instant, key: PeerKey, eps: &[Endpoint]) {
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.punch_answer_next.is_some_and(|t| now < t) {
            debug!(peer = %p.id, "punch request too soon; ignored");
            return;
        }
        p.punch_answer_next = Some(now + PUNCH_ANSWER_EVERY);
        let known = self.punchable(now, &key);
        let targets: Vec<Endpoint> = eps.iter().filter(|e| known.contains(e)).copied().collect();
        debug!(peer = %key.id(), asked = eps.len(), used = targets.len(), "punch request");
        self.punch_to(now, &key, &targets);
        if !self.peers.get(&key).is_some_and(|p| p.path.is_direct()) {
            self.birthday_after_punch(now, &key, &targets);
        }
    }

    /// Sends a keepalive of `key`'s session straight to each address, each address at
    /// most once a second whoever asks (many members aiming at one address get one
    /// datagram a second out of this node).
    pub(crate) fn punch_to(&mut self, now: Instant, key: &PeerKey, eps: &[Endpoint]) {
        let Some(session) = self.peers.get(key).and_then(Peer::tx).map(|s| s.session.clone()) else { return };
        let mut sent = 0;
        for ep in eps.iter().take(MAX_CANDIDATES) {
            if self.dials.punched.get(&ep.addr).is_some_and(|t| now < *t) {
                continue;
            }
            if self.dials.punched.len() >= MAX_PUNCHED {
                self.dials.punched.retain(|_, t| now < *t);
                if self.dials.punched.len() >= MAX_PUNCHED {
                    continue;
                }
            }
            self.dials.punched.insert(ep.addr, now + PUNCH_ANSWER_EVERY);
            let ka = crate::node::keepalive(&session, now, self.cfg.epoch);
            self.actions.push_back(Dest::direct(*ep).send(ka));
            sent += 1;
        }
        if let Some(p) = self.peers.get_mut(key) {
            p.punches_sent += sent;
        }
    }

    /// Where node `key` was seen, so that a punch towards it reaches it and nobody
    /// else: the UDP addresses our own links observe it at (in their signed records:
    /// a link is a member we hold a session with, not whoever the requester names as
    /// its neighbour), its announced endpoints that lie in a network this node is
    /// connected to (two members on one LAN), and its announced UDP endpoints at an
    /// address where it is seen: other ports of its own NAT's public address, such as
    /// the one its router maps to it (port mapping), which the NAT forwards to it
    /// whatever port the member's own traffic leaves from.
    pub(crate) fn punchable(&self, now: Instant, key: &PeerKey) -> Vec<Endpoint> {
        let id = key.id();
        // Where we see it ourselves, when it is a direct neighbour.
        let mut out: Vec<Endpoint> =
            self.peers.get(key).and_then(|p| p.path.direct()).map(|d| d.endpoint).into_iter().collect();
        self.push_observed(id, self.links(now).filter(|k| k != key).map(|k| k.id()), &mut out);
        if let Some(own) = self.mesh.topology.get(&id) {
            let seen: Vec<IpAddr> = out
                .iter()
                .filter(|e| e.proto == Proto::Udp)
                .map(|e| weft_core::endpoint::canonical(e.addr).ip())
                .collect();
            let mapped =
                |e: &&Endpoint| e.proto == Proto::Udp && seen.contains(&weft_core::endpoint::canonical(e.addr).ip());
            push_new(&mut out, own.endpoints.iter().filter(mapped));
            let on_lan = |e: &&Endpoint| {
                let ip = weft_core::endpoint::canonical(e.addr).ip();
                self.cfg.local_networks.iter().any(|(n, p)| weft_core::route::overlaps_ip(*n, *p, ip, 128))
            };
            push_new(&mut out, own.endpoints.iter().filter(on_lan));
        }
        self.ranked(out)
    }

    /// Where a node may be reachable directly, best transport first: the endpoints it
    /// announces and the UDP addresses its neighbours observe for it (a connection's
    /// observed address is an ephemeral port nobody can dial).
    pub(crate) fn candidates(&self, key: &PeerKey) -> Vec<Endpoint> {
        let id = key.id();
        let mut out: Vec<Endpoint> = Vec::new();
        let Some(own) = self.mesh.topology.get(&id) else { return out };
        // Its neighbours are the records that can observe it.
        self.push_observed(id, own.neighbours.iter().map(|n| n.node), &mut out);
        push_new(&mut out, &own.endpoints);
        self.ranked(out)
    }

    /// Adds the UDP addresses at which the records of `observers` see node `id`.
    pub(crate) fn push_observed(&self, id: NodeId, observers: impl Iterator<Item = NodeId>, out: &mut Vec<Endpoint>) {
        for r in observers.filter_map(|o| self.mesh.topology.get(&o)) {
            let seen = r.neighbours.iter().filter(|m| m.node == id && m.observed.proto == Proto::Udp);
            push_new(out, seen.map(|m| &m.observed));
        }
    }

    /// Candidates as paths: none routed into the tunnel, best transport first (stable,
    /// so observed addresses stay before announced ones), at most [`MAX_CANDIDATES`].
    pub(crate) fn ranked(&self, mut out: Vec<Endpoint>) -> Vec<Endpoint> {
        out.retain(|e| !self.tunnelled(e));
        out.sort_by_key(|e| e.proto);
        out.truncate(MAX_CANDIDATES);
        out
    }

    /// Whether `ep`'s address lies in the overlay network or in a subnet the kernel
    /// routes into the tunnel (a member's proxied subnet, such as a WireGuard
    /// portal's network): such an address is never an underlay path. A member that
    /// announces one (a wildcard listener on a host with such an interface) would
    /// otherwise be dialled through the overlay itself.
    pub(crate) fn tunnelled(&self, ep: &Endpoint) -> bool {
        let ip = weft_core::endpoint::canonical(ep.addr).ip();
        let hello = &self.cfg.handshake.hello;
        let within = |a: IpAddr, p: u8| weft_core::route::overlaps_ip(a, p, ip, 128);
        // The subnets routed into the TUN now (kept from the last route update, so this
        // costs no topology walk per endpoint).
        // (Not the exit's /0: policy routing keeps our own sockets out of the tunnel.)
        within(IpAddr::V4(hello.ipv4), hello.prefix)
            || hello.ipv6.is_some_and(|(a, p)| within(IpAddr::V6(a), p))
            || self.published.installed_subnets.iter().any(|s| s.1 != 0 && within(s.0, s.1))
    }

    /// Seals a control message on the peer's session and sends it along its path.
    pub(crate) fn send_msg(&mut self, key: &PeerKey, msg: &Msg, now: Instant) {
        self.send_sealed(key, &msg.emit(), FLAG_CONTROL, now);
    }

    /// Seals `body` (a control message, or an IP packet with `flags` 0) on the peer's
    /// session and sends it along its path. Returns whether it went.
    pub(crate) fn send_sealed(&mut self, key: &PeerKey, body: &[u8], flags: u8, now: Instant) -> bool {
        let Some(dest) = self.dest_for(key) else { return false };
        let Some(tx) = self.peers.get(key).and_then(Peer::tx) else { return false };
        let mut buf = vec![0u8; DATA_HEADER_LEN + body.len() + 16];
        buf[DATA_HEADER_LEN..DATA_HEADER_LEN + body.len()].copy_from_slice(body);
        let Some(n) = tx.session.seal_with_flags(&mut buf, body.len(), flags) else { return false };
        buf.truncate(n);
        tx.session.touch_tx(ms_since(self.cfg.epoch, now));
        if flags & FLAG_CONTROL == 0 {
            // An IP packet queued while the session was made: data, as the pipelines count it.
            tx.session.stats.add_tx(1, body.len() as u64);
        }
        self.actions.push_back(dest.send(buf));
        true
    }

    /// Where to send a handshake to a peer: its current path first; when that is a
    /// direct one, after each failure the next of its other candidates in turn (the
    /// path's transport may have stopped working while another still does).
    pub(crate) fn handshake_dest(&self, key: &PeerKey) -> Option<Dest> {
        let p = self.peers.get(key)?;
        let first = self.dest_for(key);
        let failures = p.backoff.failures as usize;
        let direct = first.is_some_and(|d| d.relay.is_none());
        if failures == 0 || !direct || p.is_up() {
            return first;
        }
        let mut options: Vec<Dest> = first.into_iter().collect();
        for c in self.candidates(key) {
            let d = Dest::direct(c);
            if !options.contains(&d) {
                options.push(d);
            }
        }
        options.get(failures % options.len().max(1)).copied()
    }

    /// How to reach a peer right now: directly when its direct path works (or it is
    /// an endpoint we dial with no relay path), else through the first relay.
    pub(crate) fn dest_for(&self, key: &PeerKey) -> Option<Dest> {
        let p = self.peers.get(key)?;
        if let Some(d) = p.path.direct() {
            return Some(Dest::direct(d.endpoint));
        }
        if let Some(path) = self.mesh.paths.get(&p.id)
            && path.next_hop != p.id
            && let Some(hop) = self.peer_by_id(path.next_hop)
            && let Some(d) = hop.path.direct()
        {
            return Some(Dest::relayed(d.endpoint, p.id, self.id));
        }
        // No path computed yet: a session that came through a relay goes back the
        // way its handshake came.
        if let Some(s) = p.tx()
            && Some(s.session.endpoint) != p.path.endpoint()
            && self.peers.values().any(|n| n.path.direct().is_some_and(|d| d.endpoint == s.session.endpoint))
        {
            return Some(Dest::relayed(s.session.endpoint, p.id, self.id));
        }
        p.path.endpoint().map(Dest::direct)
    }
}
