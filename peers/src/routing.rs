//! How packets reach peers: direct paths (failover, transport upgrades, hole
//! punching), where to send a peer's datagrams, the route snapshot the pipelines use,
//! and which overlay addresses and subnets members may own.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_core::endpoint::{Endpoint, Proto};

use rand::RngCore;
use tracing::{debug, info, warn};
use weft_core::route::{Demand, Route, RouteSnapshot, Serves};
use weft_core::wire::{DATA_HEADER_LEN, FLAG_CONTROL};

use crate::identity::{NodeId, PeerKey};
use crate::mesh::{MAX_CANDIDATES, Msg};
use crate::node::{Dest, Node, ms_since};
use crate::peer::{Driver, Peer, PeerPath};
use crate::status::{PathStatus, RouteStatus};
use crate::topology::Record;

/// First hole-punching retry delay (doubles up to `PUNCH_MAX`).
const PUNCH_FIRST: Duration = Duration::from_secs(2);
const PUNCH_MAX: Duration = Duration::from_secs(30);
/// A peer's punch requests are answered at most this often (its own retries back off
/// from `PUNCH_FIRST`).
const PUNCH_ANSWER_EVERY: Duration = Duration::from_secs(1);
/// Destinations remembered for the per-destination punch limit.
const MAX_PUNCHED: usize = 1024;
/// First probe of a better transport (doubles up to `UPGRADE_MAX`).
const UPGRADE_FIRST: Duration = Duration::from_secs(5);
const UPGRADE_MAX: Duration = Duration::from_secs(60);
/// Packets for a member without a session that one snapshot hands the engine, at most.
pub(crate) const DEMAND_BUDGET: u32 = 8;

/// Whether a direct path is watched (failover, upgrades, falling back when silent):
/// a link's always, a traffic shortcut's while data flows (an idle one is silent by
/// design and goes with its session).
fn watched(p: &Peer, now: Instant) -> bool {
    p.anchor() != crate::peer::Anchor::None || p.activity.active(now, crate::node::ACTIVE_WINDOW)
}

/// The default route: what an exit node announces (`--exit-node`).
pub const DEFAULT_ROUTE: (IpAddr, u8) = (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
/// The IPv6 default route, which an exit node with an IPv6 overlay announces too.
pub const DEFAULT_ROUTE6: (IpAddr, u8) = (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);

/// Whether a member's record offers it as an exit node.
fn offers_exit(r: &Record) -> bool {
    r.proxied.contains(&DEFAULT_ROUTE)
}

/// The IPv6 overlay address a node has without `--ipv6`: in the unique local
/// prefix `fdXX:XXXX:XXXX::/48` whose 40-bit global id is a hash of the network name
/// (RFC 4193), subnet 0, with the node id as interface identifier — so every member
/// of a network shares one /64 and has an address no other member can claim.
pub fn default_ipv6(network: &str, id: NodeId) -> (Ipv6Addr, u8) {
    let h = ring::digest::digest(
        &ring::digest::SHA256,
        [b"weft/v1/ula/".as_slice(), network.as_bytes()].concat().as_slice(),
    );
    let mut o = [0u8; 16];
    o[0] = 0xfd;
    o[1..6].copy_from_slice(&h.as_ref()[..5]);
    o[8..].copy_from_slice(&id.to_bytes());
    (Ipv6Addr::from(o), 64)
}

/// Whether `a` is the IPv6 address derived from node `id` in some /64: the id is its
/// interface identifier, which no other node can hold.
pub fn derived_from(a: Ipv6Addr, id: NodeId) -> bool {
    a.octets()[8..] == id.to_bytes()
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
        let Some(key) = self.key_of_session(local_index) else { return };
        if self.tunnelled(&from) {
            // It came through our own tunnel (the peer sent to one of our addresses
            // that its kernel routes into the overlay): a path over the overlay would
            // carry the overlay inside itself.
            debug!(%from, "not a direct path: the address is routed through the tunnel");
            return;
        }
        let Some(p) = self.peers.get_mut(&key) else { return };
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
        p.punch = Driver::default();
        self.mesh.record_changed(now);
        self.published.routes_dirty = true;
        if p.is_link(now) {
            self.send_summary(now, key);
        }
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
            p.path.lose_direct();
            self.mesh.record_changed(now);
            self.published.routes_dirty = true;
            return;
        }
        let stale = p.path_stale(now, &self.cfg.timers);
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
    pub(crate) fn handle_link_down(&mut self, now: Instant, endpoint: Endpoint, error: &str) {
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
        self.send_msg(&key, &Msg::Punch(ours), now);
        self.punch_to(now, &key, &theirs);
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
    }

    /// Sends a keepalive of `key`'s session straight to each address, each address at
    /// most once a second whoever asks (many members aiming at one address get one
    /// datagram a second out of this node).
    fn punch_to(&mut self, now: Instant, key: &PeerKey, eps: &[Endpoint]) {
        let Some(session) = self.peers.get(key).and_then(Peer::tx).map(|s| s.session.clone()) else { return };
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
        }
    }

    /// Where node `key` was seen, so that a punch towards it reaches it and nobody
    /// else: the UDP addresses our own links observe it at (in their signed records:
    /// a link is a member we hold a session with, not whoever the requester names as
    /// its neighbour), and its announced endpoints that lie in a network this node is
    /// connected to (two members on one LAN).
    pub(crate) fn punchable(&self, now: Instant, key: &PeerKey) -> Vec<Endpoint> {
        let id = key.id();
        // Where we see it ourselves, when it is a direct neighbour.
        let mut out: Vec<Endpoint> =
            self.peers.get(key).and_then(|p| p.path.direct()).map(|d| d.endpoint).into_iter().collect();
        self.push_observed(id, self.links(now).filter(|k| k != key).map(|k| k.id()), &mut out);
        if let Some(own) = self.mesh.topology.get(&id) {
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
    fn push_observed(&self, id: NodeId, observers: impl Iterator<Item = NodeId>, out: &mut Vec<Endpoint>) {
        for r in observers.filter_map(|o| self.mesh.topology.get(&o)) {
            let seen = r.neighbours.iter().filter(|m| m.node == id && m.observed.proto == Proto::Udp);
            push_new(out, seen.map(|m| &m.observed));
        }
    }

    /// Candidates as paths: none routed into the tunnel, best transport first (stable,
    /// so observed addresses stay before announced ones), at most [`MAX_CANDIDATES`].
    fn ranked(&self, mut out: Vec<Endpoint>) -> Vec<Endpoint> {
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
        let failures = p.driver.failures as usize;
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

    pub(crate) fn snapshot(&self) -> RouteSnapshot {
        let mut routes = Vec::new();
        let mut demand: Vec<(IpAddr, Arc<Demand>)> = Vec::new();
        let claims = self.claimants();
        let owns = |p: &Peer| match claims.get(&IpAddr::V4(p.hello.ipv4)) {
            Some((id, false)) => *id == p.id && self.outside_overlay(IpAddr::V4(p.hello.ipv4)).is_none(),
            _ => self.owns(p),
        };
        let owns6 = |p: &Peer| p.hello.ipv6.map(|(a, _)| a).filter(|a| self.owns6(&claims, p.id, *a));
        for p in self.peers.values() {
            match p.tx() {
                Some(tx) => {
                    let Some(dest) = self.dest_for(&p.key) else { continue };
                    // GSO records through a relay: one relay, that took them in its
                    // own hello (an older relay would drop a frame over its slot size),
                    // and every link a stream by the records.
                    let relay_streams = dest.relay.is_some()
                        && dest.to.proto.is_stream()
                        && self.mesh.paths.get(&p.id).is_some_and(|path| {
                            path.streams
                                && path.hops == 2
                                && self
                                    .peer_by_id(path.next_hop)
                                    .and_then(|hop| hop.tx())
                                    .is_some_and(|hop| hop.session.peer_gso())
                        });
                    let route =
                        Route { session: tx.session.clone(), target: dest.to, relay: dest.relay, relay_streams };
                    if let Some(a) = owns6(p) {
                        routes.push((IpAddr::V6(a), route.clone()));
                    }
                    if self.outside_overlay(IpAddr::V4(p.hello.ipv4)).is_none() {
                        routes.push((IpAddr::V4(p.hello.ipv4), route));
                    }
                }
                // A member we can reach but hold no session with: its first packets
                // start one.
                None if self.mesh.paths.contains_key(&p.id) && owns(p) => {
                    let d = Arc::new(Demand::new(p.id.to_bytes(), DEMAND_BUDGET));
                    if let Some(a) = owns6(p) {
                        demand.push((IpAddr::V6(a), d.clone()));
                    }
                    demand.push((IpAddr::V4(p.hello.ipv4), d));
                }
                None => {}
            }
        }
        let receiving = self.peers.values().flat_map(|p| p.sessions.iter().map(|s| s.session.clone()));
        // Forwarding table for relayed frames: every reachable node through its first hop.
        let mut next_hops: BTreeMap<[u8; 8], Endpoint> = BTreeMap::new();
        for (id, path) in &self.mesh.paths {
            if let Some(d) = self.peer_by_id(path.next_hop).and_then(|hop| hop.path.direct()) {
                next_hops.insert(id.to_bytes(), d.endpoint);
            }
        }
        for p in self.peers.values() {
            if let Some(d) = p.path.direct() {
                next_hops.insert(p.id.to_bytes(), d.endpoint);
            }
        }
        // Relayed frames are taken only from these: the current (authenticated) endpoint
        // of each direct neighbour with a confirmed session.
        let neighbours: Vec<Endpoint> =
            self.peers.values().filter(|p| p.is_up()).filter_map(|p| p.path.direct()).map(|d| d.endpoint).collect();
        let by_overlay: BTreeMap<IpAddr, Route> = routes.iter().cloned().collect();
        let by_demand: BTreeMap<IpAddr, Arc<Demand>> = demand.iter().cloned().collect();
        let mut subnets = Vec::new();
        let mut demand_subnets = Vec::new();
        for (r, a, p) in self.accepted_subnets(&claims) {
            if let Some(route) = by_overlay.get(&IpAddr::V4(r.overlay)) {
                subnets.push((a, p, route.clone()));
            } else if let Some(d) = by_demand.get(&IpAddr::V4(r.overlay)) {
                demand_subnets.push((a, p, d.clone()));
            }
        }
        RouteSnapshot::with_relays(self.id.to_bytes(), routes, receiving, next_hops, neighbours)
            .with_subnets(subnets)
            .with_demand(demand, demand_subnets)
            .with_serves(self.serves())
            .with_dropped(self.peers.values().filter_map(|p| p.dropped.as_ref().map(|s| s.session.clone())))
            .with_held(self.held_sessions())
    }

    /// What this node takes from the tunnel ([`Serves`]): its overlay addresses, the
    /// subnets it proxies, and as an exit what lies outside the overlay and
    /// [`weft_core::route::exit_refused`].
    fn serves(&self) -> Serves {
        let hello = &self.cfg.handshake.hello;
        let own = std::iter::once(IpAddr::V4(hello.ipv4)).chain(hello.ipv6.map(|(a, _)| IpAddr::V6(a))).collect();
        let subnets = self.cfg.proxied.iter().filter(|(_, p)| *p != 0).copied().collect();
        let exit = self.cfg.proxied.iter().any(|(_, p)| *p == 0);
        let exit_except = exit.then(|| {
            let overlays = std::iter::once((IpAddr::V4(hello.ipv4), hello.prefix))
                .chain(hello.ipv6.map(|(a, q)| (IpAddr::V6(a), q)));
            let refused = weft_core::route::exit_refused(self.cfg.exit_allow_lan, &self.cfg.local_networks);
            overlays.chain(refused).collect()
        });
        Serves::Only { own, subnets, exit_except }
    }

    /// Who claims each overlay address (peers with a session, every record), and
    /// whether more than one node does: an address with one claimant is its own
    /// without the per-member scan of `address_owner`, which settles the rare
    /// contested ones.
    fn claimants(&self) -> std::collections::HashMap<IpAddr, (NodeId, bool)> {
        let mut claims: std::collections::HashMap<IpAddr, (NodeId, bool)> = std::collections::HashMap::new();
        let mut claim = |addr: IpAddr, id: NodeId| {
            claims.entry(addr).and_modify(|(first, contested)| *contested |= *first != id).or_insert((id, false));
        };
        if let Some((a, _)) = self.cfg.handshake.hello.ipv6 {
            claim(IpAddr::V6(a), self.id);
        }
        for p in self.peers.values().filter(|p| p.is_up()) {
            claim(IpAddr::V4(p.hello.ipv4), p.id);
            if let Some((a, _)) = p.hello.ipv6 {
                claim(IpAddr::V6(a), p.id);
            }
        }
        for r in self.mesh.topology.records() {
            claim(IpAddr::V4(r.overlay), r.node());
            if let Some(a) = r.overlay6 {
                claim(IpAddr::V6(a), r.node());
            }
        }
        claims
    }

    /// Why overlay address `a` cannot be a member's: it lies outside this node's
    /// overlay network of its family (or we have no overlay of that family). A member
    /// announcing a public server's address, or one inside a proxied subnet or the
    /// portal network, would otherwise take the traffic meant for it.
    pub(crate) fn outside_overlay(&self, a: IpAddr) -> Option<String> {
        let hello = &self.cfg.handshake.hello;
        let net = match a {
            IpAddr::V4(_) => Some((IpAddr::V4(hello.ipv4), hello.prefix)),
            IpAddr::V6(_) => hello.ipv6.map(|(b, q)| (IpAddr::V6(b), q)),
        };
        match net {
            Some((b, q)) if weft_core::route::overlaps_ip(b, q, a, if a.is_ipv4() { 32 } else { 128 }) => None,
            Some((b, q)) => {
                Some(format!("{a} lies outside this node's overlay network {}/{q}", weft_core::route::network_ip(b, q)))
            }
            None => Some(format!("{a} is IPv6 and this node has no IPv6 overlay")),
        }
    }

    /// Whether IPv6 overlay address `a` is member `id`'s to route to: nobody else
    /// claims it (in a hello or a record, ourselves included), or it is derived from
    /// `id` itself ([`derived_from`]), which settles a contest.
    fn owns6(&self, claims: &std::collections::HashMap<IpAddr, (NodeId, bool)>, id: NodeId, a: Ipv6Addr) -> bool {
        if self.outside_overlay(IpAddr::V6(a)).is_some() {
            return false;
        }
        if derived_from(a, id) {
            return true;
        }
        match claims.get(&IpAddr::V6(a)) {
            Some((first, false)) => *first == id,
            Some((_, true)) => false,
            None => true,
        }
    }

    /// Whether the overlay address in `p`'s hello is its own to route to.
    fn owns(&self, p: &Peer) -> bool {
        self.outside_overlay(IpAddr::V4(p.hello.ipv4)).is_none()
            && self.address_owner(p.hello.ipv4, p.id, |_| false).is_none()
            && self.mesh.topology.get(&p.id).is_none_or(|r| r.overlay == p.hello.ipv4)
    }

    /// Subnets other members proxy and that we can reach: the kernel should route them
    /// into the TUN.
    pub(crate) fn proxied_routes(&self) -> Vec<(IpAddr, u8)> {
        let mut v: Vec<(IpAddr, u8)> = self
            .accepted_subnets(&self.claimants())
            .into_iter()
            .filter(|(r, _, _)| self.mesh.paths.contains_key(&r.node()))
            .map(|(_, a, p)| (a, p))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// With `--dhcp`: if a member claims our address and it is static, or dynamic with a
    /// lower node id, move to the first free address of the range.
    pub(crate) fn resolve_address_conflict(&mut self, now: Instant) {
        if self.cfg.dynamic.is_none() {
            return;
        }
        let ours = self.cfg.handshake.hello.ipv4;
        let must_move = self
            .mesh
            .topology
            .records()
            .any(|r| r.node() != self.id && r.overlay == ours && (!r.dynamic || r.node() < self.id));
        if must_move {
            self.move_address(now, None);
        }
    }

    /// Moves a `--dhcp` node to a free address (also avoiding `avoid`, a conflicting
    /// address learned in a handshake). Does nothing for static addresses.
    pub(crate) fn move_address(&mut self, now: Instant, avoid: Option<Ipv4Addr>) {
        let Some((net, prefix)) = self.cfg.dynamic else { return };
        let ours = self.cfg.handshake.hello.ipv4;
        let mut used: std::collections::HashSet<Ipv4Addr> =
            self.mesh.topology.records().filter(|r| r.node() != self.id).map(|r| r.overlay).collect();
        used.extend(self.peers.values().map(|p| p.hello.ipv4));
        used.extend(avoid);
        used.insert(ours);
        let Some(new) = crate::mesh::pick_address(net, prefix, self.id, &used) else {
            tracing::warn!("no free overlay address left in the --dhcp range");
            return;
        };
        info!(old = %ours, new = %new, "overlay address taken by another member; moving");
        self.cfg.handshake.hello.ipv4 = new;
        self.mesh.record_changed(now);
        self.published.routes_dirty = true;
        self.actions.push_back(crate::node::Action::SetAddress { old: ours, new, prefix });
        // Peers learn the new address through a new handshake (the hello carries it).
        let keys: Vec<PeerKey> = self.peers.values().filter(|p| p.is_up()).map(|p| p.key).collect();
        for k in keys {
            self.rehandshake(now, k);
        }
    }

    /// Whether `r`'s node is the member we route its overlay address to (a record
    /// claiming an address another member holds gets nothing routed). `claims`
    /// ([`Node::claimants`]) settles an address only one member claims without the
    /// scan of [`Node::address_owner`].
    fn owns_address(&self, r: &Record, claims: &std::collections::HashMap<IpAddr, (NodeId, bool)>) -> bool {
        self.outside_overlay(IpAddr::V4(r.overlay)).is_none()
            && self.peers.get(&PeerKey(r.key)).is_some_and(|p| p.hello.ipv4 == r.overlay)
            && match claims.get(&IpAddr::V4(r.overlay)) {
                Some((id, false)) => *id == r.node(),
                _ => self.address_owner(r.overlay, r.node(), |_| false).is_none(),
            }
    }

    /// Subnets other members proxy that we accept, with the record announcing each.
    fn accepted_subnets(
        &self,
        claims: &std::collections::HashMap<IpAddr, (NodeId, bool)>,
    ) -> Vec<(&Record, IpAddr, u8)> {
        // An exit's offer (the /0) is routed only from the one member we chose.
        let exit = self.exit_node().map(Record::node);
        let unrecorded = self.unrecorded_addresses();
        self.mesh
            .topology
            .records()
            .filter(|r| !r.proxied.is_empty() && r.node() != self.id && self.owns_address(r, claims))
            .flat_map(|r| r.proxied.iter().map(move |(a, p)| (r, *a, *p)))
            .filter(|(r, a, p)| {
                crate::authority::grants(&self.cfg.authorities, r, *a, *p)
                    && if *p == 0 {
                        exit == Some(r.node())
                    } else {
                        self.proxied_refusal(r.node(), *a, *p, &unrecorded).is_none()
                    }
            })
            .collect()
    }

    /// Why this node refuses member `id`'s claim to proxy `a/p` (not a /0), if it
    /// does: [`Node::subnet_refusal`], or without an authority a prefix overlapping
    /// it that another member announced first ([`crate::Names`]).
    pub(crate) fn proxied_refusal(
        &self,
        id: NodeId,
        a: IpAddr,
        p: u8,
        unrecorded: &[(IpAddr, NodeId)],
    ) -> Option<String> {
        if let Some(why) = self.subnet_refusal(a, p, unrecorded) {
            return Some(why);
        }
        if self.cfg.authorities.is_empty()
            && let Some(((b, q), holder)) = self.cfg.names.subnet_holder(a, p, id)
        {
            let who = if holder == self.id { "this node".to_owned() } else { format!("member {holder}") };
            return Some(format!("overlaps {b}/{q}, which {who} proxied first"));
        }
        None
    }

    /// The exit in use: the member `--use-exit-node` was pinned to (the one it first
    /// matched, [`crate::Names`]), while it still matches and offers an exit. Another
    /// member taking the name (or an id with the same first digits) never moves the
    /// exit: that fails closed until `weft exit accept` ([`Node::accept_exit`]).
    pub(crate) fn exit_node(&self) -> Option<&Record> {
        let wanted = self.cfg.use_exit.as_deref()?;
        let chosen = self.cfg.names.exit_pin(wanted).or_else(|| self.exit_choice())?;
        self.named_exit().find(|r| r.node() == chosen).filter(|r| {
            offers_exit(r) && crate::authority::grants(&self.cfg.authorities, r, Ipv4Addr::UNSPECIFIED.into(), 0)
        })
    }

    /// The member `--use-exit-node` would pin now: among those it names, the one its
    /// name is bound to ([`crate::Names::holder`]), else the lowest node id (an id
    /// prefix shared by several).
    fn exit_choice(&self) -> Option<NodeId> {
        let bound = self.cfg.use_exit.as_deref().and_then(|w| self.cfg.names.holder(w));
        let named: Vec<NodeId> = self.named_exit().map(Record::node).collect();
        named.iter().copied().find(|id| Some(*id) == bound).or_else(|| named.iter().copied().min())
    }

    /// Another member `--use-exit-node` names while the pinned one is gone or no
    /// longer matches: the exit does not move to it.
    fn exit_changed(&self) -> Option<&Record> {
        let wanted = self.cfg.use_exit.as_deref()?;
        let pinned = self.cfg.names.exit_pin(wanted)?;
        if self.named_exit().any(|r| r.node() == pinned) {
            return None;
        }
        let other = self.exit_choice()?;
        self.named_exit().find(|r| r.node() == other)
    }

    /// Pins `--use-exit-node` to the member it first matches, and says once when
    /// another member matches instead.
    pub(crate) fn pin_exit(&mut self) {
        let Some(wanted) = self.cfg.use_exit.clone() else { return };
        let Some(pinned) = self.cfg.names.exit_pin(&wanted) else {
            let Some(id) = self.exit_choice() else { return };
            info!(exit = %wanted, node = %id, "--use-exit-node pinned to the member it first matched");
            self.cfg.names.pin_exit(&wanted, id);
            self.actions.push_back(crate::node::Action::SaveNames(self.cfg.names.clone()));
            return;
        };
        if let Some(other) = self.exit_changed().map(Record::node)
            && self.report.exit_warned != Some(other)
        {
            self.report.exit_warned = Some(other);
            warn!(
                exit = %wanted,
                %pinned,
                now = %other,
                "--use-exit-node now matches member {other}, not the member {pinned} it was pinned to: internet \
                 traffic fails closed; `weft exit accept` uses the new member (a node id names an exit \
                 unambiguously)"
            );
        }
    }

    /// `weft exit accept`: pins `--use-exit-node` to the member it matches now.
    pub fn accept_exit(&mut self, now: Instant) -> Result<String, String> {
        let wanted = self.cfg.use_exit.clone().ok_or("this node uses no exit (--use-exit-node)")?;
        if let Some(pinned) = self.cfg.names.exit_pin(&wanted)
            && self.named_exit().any(|r| r.node() == pinned)
        {
            return Ok(format!("--use-exit-node {wanted} already uses member {pinned}"));
        }
        let id = self.exit_choice().ok_or_else(|| format!("no member matches --use-exit-node {wanted}"))?;
        self.cfg.names.pin_exit(&wanted, id);
        self.report.exit_warned = None;
        self.actions.push_back(crate::node::Action::SaveNames(self.cfg.names.clone()));
        self.published.routes_dirty = true;
        self.finish_step(now);
        warn!(exit = %wanted, node = %id, "exit accepted: --use-exit-node now pinned to member {id}");
        Ok(format!("--use-exit-node {wanted} now uses member {id}"))
    }

    /// Other members that `--use-exit-node` names, whether they offer an exit or not.
    fn named_exit(&self) -> impl Iterator<Item = &Record> + '_ {
        let wanted = self.cfg.use_exit.as_deref().unwrap_or_default();
        let lower = wanted.to_ascii_lowercase();
        self.mesh.topology.records().filter(move |r| {
            !wanted.is_empty()
                && r.node() != self.id
                && (r.hostname.eq_ignore_ascii_case(wanted)
                    || (lower.len() >= 6 && r.node().to_string().starts_with(&lower)))
        })
    }

    /// Members offering themselves as exits.
    pub(crate) fn exit_offers(&self) -> Vec<(NodeId, String)> {
        self.mesh
            .topology
            .records()
            .filter(|r| r.node() != self.id && offers_exit(r))
            .map(|r| (r.node(), r.hostname.clone()))
            .collect()
    }

    /// The exit in use, for status.
    pub(crate) fn exit_status(&self) -> Option<crate::status::ExitStatus> {
        let wanted = self.cfg.use_exit.clone()?;
        let node = self.exit_node().map(|r| (r.node(), r.hostname.clone()));
        let routing = self.published.installed_subnets.contains(&DEFAULT_ROUTE);
        let known = self.named_exit().next().is_some();
        let pinned = self.cfg.names.exit_pin(&wanted);
        let changed_to = self.exit_changed().map(|r| (r.node(), r.hostname.clone()));
        Some(crate::status::ExitStatus { wanted, node, routing, known, pinned, changed_to })
    }

    /// Overlay addresses of members that their records do not say (a session's hello
    /// that differs, a member without a record): what [`Node::subnet_refusal`]
    /// checks beside the records' index.
    pub(crate) fn unrecorded_addresses(&self) -> Vec<(IpAddr, NodeId)> {
        let unrecorded = self.peers.values().filter(|x| {
            self.mesh
                .topology
                .get(&x.id)
                .is_none_or(|r| r.overlay != x.hello.ipv4 || r.overlay6 != x.hello.ipv6.map(|(a, _)| a))
        });
        unrecorded
            .flat_map(|x| {
                std::iter::once((IpAddr::V4(x.hello.ipv4), x.id))
                    .chain(x.hello.ipv6.map(|(a, _)| (IpAddr::V6(a), x.id)))
            })
            .filter(|(addr, _)| self.outside_overlay(*addr).is_none())
            .collect()
    }

    /// Why we will not route subnet `a/p` that a member proxies, if we will not: it
    /// would capture traffic that is not the member's to take.
    /// `unrecorded`: the members' addresses outside the records' index
    /// ([`Node::unrecorded_addresses`], computed once for a whole rebuild).
    pub(crate) fn subnet_refusal(&self, a: IpAddr, p: u8, unrecorded: &[(IpAddr, NodeId)]) -> Option<String> {
        let overlaps = |b: IpAddr, q: u8| weft_core::route::overlaps_ip(a, p, b, q);
        if p == 0 {
            return Some("a /0 is an exit's offer: routed only from the member --use-exit-node names".into());
        }
        if let IpAddr::V6(v6) = a
            && (v6.is_multicast() || v6.is_unicast_link_local() || v6.is_loopback() || v6.to_ipv4_mapped().is_some())
        {
            return Some("multicast, link-local, loopback and IPv4-mapped prefixes are no member's to proxy".into());
        }
        let widest = if a.is_ipv4() { 8 } else { 16 };
        if p < widest && !self.cfg.accept_wide_subnets {
            return Some(format!(
                "/{p} is shorter than /{widest} (accepted only with --accept-wide-subnets on this node)"
            ));
        }
        let hello = &self.cfg.handshake.hello;
        let ours =
            std::iter::once((IpAddr::V4(hello.ipv4), hello.prefix)).chain(hello.ipv6.map(|(a, q)| (IpAddr::V6(a), q)));
        for (b, q) in ours {
            if overlaps(b, q) {
                let net = weft_core::route::network_ip(b, q);
                return Some(format!("overlaps the overlay network {net}/{q}"));
            }
        }
        // Members' addresses inside the subnet: the records' from their index (one
        // range query, not a scan per subnet), and those of members whose hello
        // differs from their record or who have none (a session, a dial).
        let (lo, hi) = (weft_core::route::network_ip(a, p), last_ip(a, p));
        let recorded = self.mesh.topology.addresses_within(lo, hi).find(|(m, _)| self.outside_overlay(*m).is_none());
        let claimed = recorded.or_else(|| unrecorded.iter().find(|(m, _)| overlaps(*m, 128)).copied());
        if let Some((m, id)) = claimed {
            return Some(format!("holds member {id}'s overlay address {m}"));
        }
        if let Some((b, q)) = self.cfg.local_networks.iter().find(|(b, q)| overlaps(*b, *q)) {
            return Some(format!("overlaps {b}/{q}, a network this node is directly connected to"));
        }
        None
    }

    /// Claims in other members' records that we refuse, each with the reason (for
    /// status): an overlay address another member holds.
    pub(crate) fn refused_claims(&self) -> Vec<String> {
        let mut v = Vec::new();
        let claims = self.claimants();
        let unrecorded = self.unrecorded_addresses();
        for r in self.mesh.topology.records().filter(|r| r.node() != self.id) {
            if let Some(why) = self.outside_overlay(IpAddr::V4(r.overlay)) {
                v.push(format!(
                    "member {} ({:?}) claims overlay address {}: refused, {why}",
                    r.node(),
                    r.hostname,
                    r.overlay
                ));
                continue;
            }
            if let Some(a) = r.overlay6
                && let Some(why) = self.outside_overlay(IpAddr::V6(a))
            {
                v.push(format!(
                    "member {} ({:?}) claims IPv6 overlay address {a}: refused, {why}",
                    r.node(),
                    r.hostname
                ));
            }
            let contested = claims.get(&IpAddr::V4(r.overlay)).is_some_and(|(_, c)| *c);
            if let Some(owner) = contested.then(|| self.address_owner(r.overlay, r.node(), |_| false)).flatten() {
                v.push(format!(
                    "member {} ({:?}) claims overlay address {}, which belongs to member {owner}: refused",
                    r.node(),
                    r.hostname,
                    r.overlay
                ));
                continue;
            }
            if let Some(a) = r.overlay6
                && self.outside_overlay(IpAddr::V6(a)).is_none()
                && !self.owns6(&claims, r.node(), a)
            {
                v.push(format!(
                    "member {} ({:?}) claims IPv6 overlay address {a}, which another member claims too: refused",
                    r.node(),
                    r.hostname
                ));
            }
            // An exit's offer is listed in `exit_offers`, not as a refusal.
            for (a, p) in r.proxied.iter() {
                if !crate::authority::grants(&self.cfg.authorities, r, *a, *p) {
                    let what = if *p == 0 { "offers itself as an exit".to_owned() } else { format!("proxies {a}/{p}") };
                    v.push(format!(
                        "member {} ({:?}) {what}: refused, its certificate does not grant it",
                        r.node(),
                        r.hostname
                    ));
                    continue;
                }
                if *p == 0 {
                    continue;
                }
                if let Some(why) = self.proxied_refusal(r.node(), *a, *p, &unrecorded) {
                    v.push(format!("member {} ({:?}) proxies {a}/{p}: refused, {why}", r.node(), r.hostname));
                }
            }
        }
        v
    }

    /// Members whose record claims our overlay address.
    pub(crate) fn conflicts(&self) -> Vec<(NodeId, String)> {
        let ours = self.cfg.handshake.hello.ipv4;
        self.mesh
            .topology
            .records()
            .filter(|r| r.node() != self.id && r.overlay == ours)
            .map(|r| (r.node(), r.hostname.clone()))
            .collect()
    }

    pub(crate) fn path_status(&self, p: &Peer) -> PathStatus {
        match self.dest_for(&p.key) {
            Some(Dest { relay: None, .. }) if p.path.is_direct() => PathStatus::Direct,
            Some(Dest { to, relay: Some(_) }) => {
                // Before the paths are computed (once per tick) the relay is the
                // neighbour the session's handshake came through.
                let path = self.mesh.paths.get(&p.id);
                let via = path.map(|x| x.next_hop).or_else(|| {
                    self.peers.values().find(|n| n.path.direct().is_some_and(|d| d.endpoint == to)).map(|n| n.id)
                });
                PathStatus::Relay { via: via.unwrap_or(p.id), hops: path.map_or(2, |x| x.hops) }
            }
            _ => PathStatus::None,
        }
    }

    pub(crate) fn route_status(&self) -> Vec<RouteStatus> {
        let mut v: Vec<RouteStatus> = self
            .mesh
            .paths
            .iter()
            .filter_map(|(id, path)| {
                let rec = self.mesh.topology.get(id)?;
                let session = self.peers.get(&PeerKey(rec.key)).is_some_and(Peer::is_up);
                Some(RouteStatus {
                    node: *id,
                    hostname: rec.hostname.clone(),
                    overlay: rec.overlay,
                    overlay6: rec.overlay6,
                    proxied: rec.proxied.clone(),
                    next_hop: path.next_hop,
                    hops: path.hops,
                    latency_ms: path.latency_ms,
                    session,
                })
            })
            .collect();
        v.sort_by_key(|r| r.overlay);
        v
    }

    pub(crate) fn peer_by_id(&self, id: NodeId) -> Option<&Peer> {
        self.peers.by_id(&id)
    }

    /// The peer holding the session with this local index.
    pub(crate) fn key_of_session(&self, local_index: u32) -> Option<PeerKey> {
        let indexed = self.peers.session_owner(local_index);
        if let Some(k) = indexed
            && self.peers.get(&k).is_some_and(|p| p.sessions.iter().any(|s| s.session.local_index == local_index))
        {
            return Some(k);
        }
        // A session added since the index was rebuilt (it is rebuilt with every snapshot).
        self.peers.values().find(|p| p.sessions.iter().any(|s| s.session.local_index == local_index)).map(|p| p.key)
    }
}

/// Appends the endpoints of `eps` that `out` does not hold yet.
fn push_new<'a>(out: &mut Vec<Endpoint>, eps: impl IntoIterator<Item = &'a Endpoint>) {
    for e in eps {
        if !out.contains(e) {
            out.push(*e);
        }
    }
}

/// The last address of `a/p`.
fn last_ip(a: IpAddr, p: u8) -> IpAddr {
    match a {
        IpAddr::V4(v4) => {
            let host = u32::MAX.checked_shr(u32::from(p)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) | host))
        }
        IpAddr::V6(v6) => {
            let host = u128::MAX.checked_shr(u32::from(p)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) | host))
        }
    }
}
