//! The mesh half of the engine: topology records flooded over sessions, shortest
//! paths, relayed sessions with every member, latency probes, and hole punching that
//! moves a relayed peer to a direct path.
//!
//! Control messages travel inside sessions (data packets flagged
//! [`FLAG_CONTROL`]), so only members that proved the PSK can flood records.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_core::transport::{Endpoint, Proto};

use rand::RngCore;
use tracing::{debug, info, warn};
use weft_core::handshake::Hello;
use weft_core::route::{Route, RouteSnapshot};
use weft_core::wire::{DATA_HEADER_LEN, FLAG_CONTROL};

use crate::identity::NodeId;
use crate::node::{Dest, Node, ms_since};
use crate::peer::Peer;
use crate::status::{PathStatus, RouteStatus};
use crate::topology::{Neighbour, REFRESH, Reader, Record, emit_addr};

/// How often each peer is probed for latency and loss.
const PING_EVERY: Duration = Duration::from_secs(5);
/// First hole-punching retry delay (doubles up to `PUNCH_MAX`).
const PUNCH_FIRST: Duration = Duration::from_secs(2);
const PUNCH_MAX: Duration = Duration::from_secs(30);
/// Most candidate endpoints tried per punch.
const MAX_CANDIDATES: usize = 16;
/// A peer's punch requests are answered at most this often (its own retries back off
/// from `PUNCH_FIRST`).
const PUNCH_ANSWER_EVERY: Duration = Duration::from_secs(1);
/// First probe of a better transport (doubles up to `UPGRADE_MAX`).
const UPGRADE_FIRST: Duration = Duration::from_secs(5);
const UPGRADE_MAX: Duration = Duration::from_secs(60);

/// A control message inside a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    /// A topology record (ours or one we forward).
    Record(Box<Record>),
    /// Latency probe.
    Ping(u64),
    /// Answer to a probe.
    Pong(u64),
    /// "Send to me directly at these addresses now": the other half of a hole punch.
    Punch(Vec<Endpoint>),
}

impl Msg {
    pub(crate) fn emit(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Self::Record(r) => {
                out.push(1);
                r.emit(&mut out);
            }
            Self::Ping(n) => {
                out.push(2);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Self::Pong(n) => {
                out.push(3);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Self::Punch(eps) => {
                out.push(4);
                let eps = &eps[..eps.len().min(MAX_CANDIDATES)];
                out.push(eps.len() as u8);
                for e in eps {
                    emit_addr(e, &mut out);
                }
            }
        }
        out
    }

    pub(crate) fn parse(b: &[u8]) -> Option<Self> {
        let (&kind, rest) = b.split_first()?;
        Some(match kind {
            1 => Self::Record(Box::new(Record::parse(rest).ok()?)),
            2 => Self::Ping(u64::from_le_bytes(rest.get(..8)?.try_into().ok()?)),
            3 => Self::Pong(u64::from_le_bytes(rest.get(..8)?.try_into().ok()?)),
            4 => {
                let mut r = Reader(rest);
                Self::Punch((0..r.u8().ok()?).map(|_| r.addr()).collect::<Result<_, _>>().ok()?)
            }
            _ => return None,
        })
    }
}

/// Parses a control message as the engine does and encodes it again: `None` when the
/// engine would drop it. The control wire format's entry point for the fuzz targets.
pub fn reencode_message(b: &[u8]) -> Option<Vec<u8>> {
    Msg::parse(b).map(|m| m.emit())
}

impl Node {
    pub(crate) fn handle_message(&mut self, now: Instant, local_index: u32, bytes: &[u8]) {
        let Some(key) = self.key_of_session(local_index) else { return };
        let Some(msg) = Msg::parse(bytes) else {
            debug!(local_index, "malformed control message");
            return;
        };
        match msg {
            Msg::Record(rec) => self.handle_record(now, key, *rec),
            Msg::Ping(n) => self.send_msg(&key, &Msg::Pong(n), now),
            Msg::Pong(n) => {
                // Link latencies reach the mesh with the next periodic record.
                if let Some(p) = self.peers.get_mut(&key) {
                    p.probe.answered(n, now);
                }
            }
            Msg::Punch(eps) => self.handle_punch(now, key, &eps),
        }
    }

    /// Authenticated packets of a session arrive straight from `from`: that address is
    /// a working direct path to the peer (a hole punch succeeded, or it roamed).
    ///
    /// The peer moves there when it is a better transport than the current path, or
    /// the current path is stale (nothing arrived on it lately): so a node prefers
    /// UDP, then QUIC, TCP, WebSocket, and follows whichever path still works.
    pub(crate) fn handle_direct(&mut self, now: Instant, local_index: u32, from: Endpoint) {
        let Some(key) = self.key_of_session(local_index) else { return };
        let stale_after = self.stale_after();
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.endpoint == Some(from) {
            p.path_seen = Some(now);
            if p.direct {
                return;
            }
        } else {
            let better = p.endpoint.is_none_or(|cur| from.proto < cur.proto);
            if p.direct && !better && !p.path_stale(now, stale_after) {
                return;
            }
        }
        info!(peer = %p.id, %from, "direct path up");
        p.endpoint = Some(from);
        p.direct = true;
        p.direct_since = Some(now);
        p.path_seen = Some(now);
        p.upgrade = Default::default();
        p.failover_next = None;
        p.punch = Default::default();
        self.record_dirty = true;
        self.routes_dirty = true;
        self.sync_topology(key, now);
    }

    fn handle_record(&mut self, now: Instant, from_key: [u8; 32], rec: Record) {
        let node = rec.node();
        let network = &self.cfg.handshake.network_name;
        if node == self.id {
            // Our own record came back: never older than what we publish, unless we
            // restarted; jump past it so ours wins. Only a record we signed ourselves
            // (in an earlier run) counts: nobody else can make us skip numbers, and
            // parsing caps the sequence far below u64::MAX.
            if rec.seq >= self.seq && rec.seq < crate::topology::MAX_SEQ && rec.verify(network) {
                self.seq = rec.seq + 1;
                self.record_dirty = true;
            }
            return;
        }
        // Only what would change our table is worth a signature check.
        if !self.topology.is_newer(&rec) {
            return;
        }
        if !rec.verify(network) {
            // A member altered or forged someone's record: drop it, never forward it.
            self.rejected_records += 1;
            warn!(from = %NodeId::from_public(&from_key), origin = %node, seq = rec.seq, "dropped a topology record whose signature is not its origin's");
            return;
        }
        let overlay = rec.overlay;
        let hostname = rec.hostname.clone();
        let key = rec.key;
        let before = self.topology.get(&node).map(|r| r.proxied.clone()).unwrap_or_default();
        if !self.topology.apply(rec.clone(), now) {
            return;
        }
        for (a, p) in rec.proxied.iter().filter(|s| !before.contains(s)) {
            if let Some(why) = self.subnet_refusal(*a, *p) {
                warn!(peer = %node, host = %rec.hostname, subnet = %format!("{a}/{p}"), "refused proxied subnet: {why}");
            }
        }
        // A member we have not met: it exists for routing and status from now on
        // (unless it claims our own address: that is a conflict, or a former identity
        // of this very node, and shows in status as such).
        // Nor when another member already holds the address: the first holder keeps it.
        let taken = self.address_owner(overlay, node, |_| false);
        if let Some(owner) = taken {
            debug!(peer = %node, %overlay, %owner, "member's record claims another member's address");
        }
        if !self.peers.contains_key(&key) && overlay != self.cfg.handshake.hello.ipv4 && taken.is_none() {
            let ours = &self.cfg.handshake.hello;
            let hello = Hello { cipher: ours.cipher, ipv4: overlay, prefix: ours.prefix, hostname };
            self.peers.insert(key, Peer::new(key, hello, None, now, Arc::default()));
            self.ids.insert(node, key);
            debug!(peer = %node, %overlay, "learned member from topology");
        }
        self.recompute_paths();
        // Flood on to every other direct neighbour.
        let from_id = NodeId::from_public(&from_key);
        let msg = Msg::Record(Box::new(rec));
        let targets: Vec<[u8; 32]> =
            self.direct_neighbours().filter(|k| NodeId::from_public(k) != from_id && *k != key).collect();
        for k in targets {
            self.send_msg(&k, &msg, now);
        }
    }

    /// Periodic mesh work: publish our record, expire old ones, probe, punch.
    pub(crate) fn drive_mesh(&mut self, now: Instant) {
        let t = self.cfg.timers;
        let epoch = self.cfg.epoch;
        let now_ms = ms_since(epoch, now);
        // A direct path that went silent falls back to relaying.
        for p in self.peers.values_mut() {
            if !p.direct {
                continue;
            }
            if !p.sessions.iter().any(|s| s.session.is_confirmed()) {
                continue;
            }
            let last = p.sessions.iter().map(|s| s.session.last_direct_rx_ms()).max().unwrap_or(0);
            let since = p.direct_since.map_or(0, |t| ms_since(epoch, t));
            let silent = now_ms.saturating_sub(last.max(since));
            if silent >= t.dead_after.as_millis() as u64 {
                info!(peer = %p.id, "direct path silent; falling back to relay");
                p.direct = false;
                self.record_dirty = true;
                self.routes_dirty = true;
            }
        }
        self.resolve_address_conflict(now);
        let expired = self.topology.expire(now, self.id);
        if !expired.is_empty() {
            debug!(count = expired.len(), "topology records aged out");
            self.recompute_paths();
        }
        if self.record_dirty || self.next_publish.is_none_or(|t| now >= t) {
            self.publish_record(now);
        }
        self.probe_peers(now);
        self.punch_relayed(now);
        self.probe_paths(now);
    }

    /// How long a direct path may stay quiet before other paths are tried: two
    /// missed keepalives and a little.
    pub(crate) fn stale_after(&self) -> Duration {
        2 * self.cfg.timers.keepalive + Duration::from_millis(500)
    }

    /// For direct peers: while the path is stale, send session keepalives over every
    /// other candidate (the first to answer becomes the path: failover, e.g. from a
    /// UDP path a firewall started dropping to TCP); while it works but a better
    /// transport is announced, try that now and then (upgrade, with backoff).
    fn probe_paths(&mut self, now: Instant) {
        let stale_after = self.stale_after();
        let keepalive = self.cfg.timers.keepalive;
        let due: Vec<([u8; 32], bool)> = self
            .peers
            .values()
            .filter(|p| p.direct && p.sessions.iter().any(|s| s.session.is_confirmed()))
            .filter_map(|p| {
                if p.path_stale(now, stale_after) {
                    p.failover_next.is_none_or(|t| now >= t).then_some((p.key, true))
                } else {
                    // Nothing beats UDP: no candidate scan for a peer already on it.
                    let improvable = p.endpoint.is_some_and(|e| e.proto != Proto::Udp);
                    (improvable && p.upgrade.next_attempt.is_none_or(|t| now >= t)).then_some((p.key, false))
                }
            })
            .collect();
        for (key, failover) in due {
            let current = self.peers.get(&key).and_then(|p| p.endpoint);
            let targets: Vec<Endpoint> = self
                .candidates(&key)
                .into_iter()
                .filter(|c| Some(*c) != current)
                .filter(|c| failover || current.is_some_and(|cur| c.proto < cur.proto))
                .collect();
            let jitter = self.rng.next_u32();
            let Some(p) = self.peers.get_mut(&key) else { continue };
            if failover {
                p.failover_next = Some(now + keepalive);
            } else {
                let d = &mut p.upgrade;
                d.backoff = if d.backoff.is_zero() { UPGRADE_FIRST } else { (d.backoff * 2).min(UPGRADE_MAX) };
                let spread = d.backoff.as_millis() as u64 / 4;
                d.next_attempt = Some(now + d.backoff + Duration::from_millis(u64::from(jitter) % spread.max(1)));
            }
            if !targets.is_empty() {
                debug!(peer = %p.id, failover, candidates = targets.len(), "probing other paths");
                self.punch_to(now, &key, &targets);
            }
        }
    }

    /// A connection (TCP, WebSocket, QUIC) closed or could not be opened: peers whose
    /// path it was look for another at once, and a handshake waiting on it fails now
    /// with the reason instead of timing out.
    pub(crate) fn handle_link_down(&mut self, now: Instant, endpoint: Endpoint, error: &str) {
        for p in self.peers.values_mut().filter(|p| p.endpoint == Some(endpoint)) {
            debug!(peer = %p.id, %endpoint, error, "path's connection is down");
            p.path_seen = None;
            p.failover_next = None;
        }
        self.fail_handshakes_to(now, endpoint, error);
    }

    fn publish_record(&mut self, now: Instant) {
        self.seq += 1;
        self.record_dirty = false;
        self.next_publish = Some(now + REFRESH);
        let rec = self.own_record(now);
        self.topology.apply(rec.clone(), now);
        self.recompute_paths();
        let msg = Msg::Record(Box::new(rec));
        let targets: Vec<[u8; 32]> = self.direct_neighbours().collect();
        for k in targets {
            self.send_msg(&k, &msg, now);
        }
    }

    /// Our record, signed.
    fn own_record(&self, now: Instant) -> Record {
        let hello = &self.cfg.handshake.hello;
        let mut neighbours: Vec<Neighbour> = self
            .peers
            .values()
            .filter(|p| p.direct && p.sessions.iter().any(|s| s.session.is_confirmed()))
            .filter_map(|p| {
                Some(Neighbour {
                    node: p.id,
                    rtt_ms: p.probe.rtt.map_or(0, |r| r.as_millis().min(u128::from(u32::MAX)) as u32),
                    loss_pct: p.probe.loss(now).map_or(0, |l| (l * 100.0).round().clamp(0.0, 100.0) as u8),
                    observed: p.endpoint?,
                })
            })
            .collect();
        neighbours.sort_by_key(|n| n.node);
        let mut rec = Record {
            key: self.cfg.handshake.local.public,
            signer: self.cfg.handshake.local.signing_public,
            sig: [0; 64],
            seq: self.seq,
            hostname: hello.hostname.clone(),
            overlay: hello.ipv4,
            endpoints: self.cfg.endpoints.clone(),
            neighbours,
            proxied: self.cfg.proxied.clone(),
            dynamic: self.cfg.dynamic.is_some(),
        };
        rec.sign(&self.cfg.handshake.local, &self.cfg.handshake.network_name);
        rec
    }

    /// Sends every record we know to a new neighbour.
    pub(crate) fn sync_topology(&mut self, key: [u8; 32], now: Instant) {
        let mut recs: Vec<Record> = self.topology.records().cloned().collect();
        if !recs.iter().any(|r| r.node() == self.id) {
            recs.push(self.own_record(now));
        }
        // Our own record may be stale in the table when a neighbour just appeared.
        self.record_dirty = true;
        for r in recs {
            self.send_msg(&key, &Msg::Record(Box::new(r)), now);
        }
    }

    /// Marks the paths stale; they are recomputed once per tick ([`Node::refresh_paths`]),
    /// not once per record, which is what keeps a 200-node mesh cheap to converge.
    pub(crate) fn recompute_paths(&mut self) {
        self.paths_dirty = true;
    }

    pub(crate) fn refresh_paths(&mut self) {
        if self.paths_dirty {
            self.paths_dirty = false;
            self.paths = self.topology.paths(self.id, self.cfg.latency_first);
            self.routes_dirty = true;
        }
    }

    fn probe_peers(&mut self, now: Instant) {
        let due: Vec<[u8; 32]> = self
            .peers
            .values()
            .filter(|p| p.sessions.iter().any(|s| s.session.is_confirmed()))
            .filter(|p| p.probe.next.is_none_or(|t| now >= t))
            .map(|p| p.key)
            .collect();
        for key in due {
            let nonce = self.rng.next_u64();
            if let Some(p) = self.peers.get_mut(&key) {
                p.probe.sent(nonce, now);
                p.probe.next = Some(now + PING_EVERY);
            }
            self.send_msg(&key, &Msg::Ping(nonce), now);
        }
    }

    /// For relayed peers: send to their known addresses directly and ask them (through
    /// the relay) to do the same towards ours, so both NATs open at once.
    fn punch_relayed(&mut self, now: Instant) {
        let due: Vec<[u8; 32]> = self
            .peers
            .values()
            .filter(|p| !p.direct && p.sessions.iter().any(|s| s.session.is_confirmed()))
            .filter(|p| p.punch.next_attempt.is_none_or(|t| now >= t))
            .map(|p| p.key)
            .collect();
        for key in due {
            let theirs = self.candidates(&key);
            let ours = self.candidates(&self.cfg.handshake.local.public);
            if theirs.is_empty() && ours.is_empty() {
                continue;
            }
            let jitter = self.rng.next_u32();
            if let Some(p) = self.peers.get_mut(&key) {
                let d = &mut p.punch;
                d.backoff = if d.backoff.is_zero() { PUNCH_FIRST } else { (d.backoff * 2).min(PUNCH_MAX) };
                let spread = d.backoff.as_millis() as u64 / 4;
                d.next_attempt = Some(now + d.backoff + Duration::from_millis(u64::from(jitter) % spread.max(1)));
            }
            self.send_msg(&key, &Msg::Punch(ours), now);
            self.punch_to(now, &key, &theirs);
        }
    }

    /// A peer asks us to send to it directly at `eps` now. Only addresses where it may
    /// really be are used (the endpoints its signed record announces, and the UDP
    /// addresses its neighbours observe), never an arbitrary address a member names
    /// (that would make us send to a third party for it), and at most once a second
    /// per peer.
    fn handle_punch(&mut self, now: Instant, key: [u8; 32], eps: &[Endpoint]) {
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.punch_answer_next.is_some_and(|t| now < t) {
            debug!(peer = %p.id, "punch request too soon; ignored");
            return;
        }
        p.punch_answer_next = Some(now + PUNCH_ANSWER_EVERY);
        let known = self.candidates(&key);
        let targets: Vec<Endpoint> = eps.iter().filter(|e| known.contains(e)).copied().collect();
        debug!(peer = %NodeId::from_public(&key), asked = eps.len(), used = targets.len(), "punch request");
        self.punch_to(now, &key, &targets);
    }

    /// Sends a keepalive of `key`'s session straight to each address.
    fn punch_to(&mut self, now: Instant, key: &[u8; 32], eps: &[Endpoint]) {
        let Some(p) = self.peers.get(key) else { return };
        let Some(tx) = p.sessions.iter().find(|s| s.session.is_confirmed()) else { return };
        let session = tx.session.clone();
        for ep in eps.iter().take(MAX_CANDIDATES) {
            let ka = crate::node::keepalive(&session, now, self.cfg.epoch);
            self.actions.push_back(Dest::direct(*ep).send(ka));
        }
    }

    /// Where a node may be reachable directly, best transport first: the endpoints it
    /// announces and the UDP addresses its neighbours observe for it (a connection's
    /// observed address is an ephemeral port nobody can dial).
    pub(crate) fn candidates(&self, key: &[u8; 32]) -> Vec<Endpoint> {
        let id = NodeId::from_public(key);
        let mut out: Vec<Endpoint> = Vec::new();
        for r in self.topology.records() {
            for n in &r.neighbours {
                if n.node == id && n.observed.proto == Proto::Udp && !out.contains(&n.observed) {
                    out.push(n.observed);
                }
            }
        }
        if let Some(r) = self.topology.get(&id) {
            for e in &r.endpoints {
                if !out.contains(e) {
                    out.push(*e);
                }
            }
        }
        // Stable: observed addresses before announced ones within a transport.
        out.sort_by_key(|e| e.proto);
        out.truncate(MAX_CANDIDATES);
        out
    }

    /// Seals a control message on the peer's session and sends it along its path.
    pub(crate) fn send_msg(&mut self, key: &[u8; 32], msg: &Msg, now: Instant) {
        let Some(dest) = self.dest_for(key) else { return };
        let Some(p) = self.peers.get(key) else { return };
        let Some(tx) = p.sessions.iter().find(|s| s.session.is_confirmed()) else { return };
        let body = msg.emit();
        let mut buf = vec![0u8; DATA_HEADER_LEN + body.len() + 16];
        buf[DATA_HEADER_LEN..DATA_HEADER_LEN + body.len()].copy_from_slice(&body);
        let Some(n) = tx.session.seal_with_flags(&mut buf, body.len(), FLAG_CONTROL) else { return };
        buf.truncate(n);
        tx.session.touch_tx(ms_since(self.cfg.epoch, now));
        self.actions.push_back(dest.send(buf));
    }

    /// Where to send a handshake to a peer: its current path first; when that is a
    /// direct one, after each failure the next of its other candidates in turn (the
    /// path's transport may have stopped working while another still does).
    pub(crate) fn handshake_dest(&self, key: &[u8; 32]) -> Option<Dest> {
        let p = self.peers.get(key)?;
        let first = self.dest_for(key);
        let failures = p.driver.failures as usize;
        let direct = first.is_some_and(|d| d.relay.is_none());
        if failures == 0 || !direct || p.sessions.iter().any(|s| s.session.is_confirmed()) {
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
    /// a configured endpoint with no relay path), else through the first relay.
    pub(crate) fn dest_for(&self, key: &[u8; 32]) -> Option<Dest> {
        let p = self.peers.get(key)?;
        if p.direct
            && let Some(e) = p.endpoint
        {
            return Some(Dest::direct(e));
        }
        if let Some(path) = self.paths.get(&p.id)
            && path.next_hop != p.id
            && let Some(hop) = self.peer_by_id(path.next_hop)
            && hop.direct
            && let Some(to) = hop.endpoint
        {
            return Some(Dest::relayed(to, p.id, self.id));
        }
        // No path computed yet (paths refresh once per tick): a session that came
        // through a relay goes back the way its handshake came.
        if let Some(s) = p.sessions.iter().find(|s| s.session.is_confirmed())
            && Some(s.session.endpoint) != p.endpoint
            && self.peers.values().any(|n| n.direct && n.endpoint == Some(s.session.endpoint))
        {
            return Some(Dest::relayed(s.session.endpoint, p.id, self.id));
        }
        p.endpoint.map(Dest::direct)
    }

    pub(crate) fn snapshot(&self) -> RouteSnapshot {
        let mut routes = Vec::new();
        for p in self.peers.values() {
            let Some(tx) = p.sessions.iter().find(|s| s.session.is_confirmed()) else { continue };
            let Some(dest) = self.dest_for(&p.key) else { continue };
            routes.push((p.hello.ipv4, Route { session: tx.session.clone(), target: dest.to, relay: dest.relay }));
        }
        let receiving = self.peers.values().flat_map(|p| p.sessions.iter().map(|s| s.session.clone()));
        // Forwarding table for relayed frames: every reachable node through its first hop.
        let mut next_hops: BTreeMap<[u8; 8], Endpoint> = BTreeMap::new();
        for (id, path) in &self.paths {
            if let Some(hop) = self.peer_by_id(path.next_hop)
                && hop.direct
                && let Some(e) = hop.endpoint
            {
                next_hops.insert(id.to_bytes(), e);
            }
        }
        for p in self.peers.values().filter(|p| p.direct) {
            if let Some(e) = p.endpoint {
                next_hops.insert(p.id.to_bytes(), e);
            }
        }
        // Relayed frames are taken only from these: the current (authenticated) endpoint
        // of each direct neighbour with a confirmed session.
        let neighbours: Vec<Endpoint> = self
            .peers
            .values()
            .filter(|p| p.direct && p.sessions.iter().any(|s| s.session.is_confirmed()))
            .filter_map(|p| p.endpoint)
            .collect();
        let by_overlay: BTreeMap<std::net::Ipv4Addr, Route> = routes.iter().cloned().collect();
        let subnets: Vec<(std::net::Ipv4Addr, u8, Route)> = self
            .accepted_subnets()
            .into_iter()
            .filter_map(|(r, a, p)| Some((a, p, by_overlay.get(&r.overlay)?.clone())))
            .collect();
        RouteSnapshot::with_relays(self.id.to_bytes(), routes, receiving, next_hops, neighbours)
            .with_subnets(subnets)
            .with_held(self.held_sessions())
    }

    /// Subnets other members proxy and that we can reach: the kernel should route them
    /// into the TUN.
    pub(crate) fn proxied_routes(&self) -> Vec<(std::net::Ipv4Addr, u8)> {
        let mut v: Vec<(std::net::Ipv4Addr, u8)> = self
            .accepted_subnets()
            .into_iter()
            .filter(|(r, _, _)| self.paths.contains_key(&r.node()))
            .map(|(_, a, p)| (a, p))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// With `--dhcp`: if a member claims our address and it is static, or dynamic with a
    /// lower node id, move to the first free address of the range.
    fn resolve_address_conflict(&mut self, now: Instant) {
        if self.cfg.dynamic.is_none() {
            return;
        }
        let ours = self.cfg.handshake.hello.ipv4;
        let must_move = self
            .topology
            .records()
            .any(|r| r.node() != self.id && r.overlay == ours && (!r.dynamic || r.node() < self.id));
        if must_move {
            self.move_address(now, None);
        }
    }

    /// Moves a `--dhcp` node to a free address (also avoiding `avoid`, a conflicting
    /// address learned in a handshake). Does nothing for static addresses.
    pub(crate) fn move_address(&mut self, now: Instant, avoid: Option<std::net::Ipv4Addr>) {
        let Some((net, prefix)) = self.cfg.dynamic else { return };
        let ours = self.cfg.handshake.hello.ipv4;
        let mut used: std::collections::HashSet<std::net::Ipv4Addr> =
            self.topology.records().filter(|r| r.node() != self.id).map(|r| r.overlay).collect();
        used.extend(self.peers.values().map(|p| p.hello.ipv4));
        used.extend(avoid);
        used.insert(ours);
        let Some(new) = pick_address(net, prefix, self.id, &used) else {
            tracing::warn!("no free overlay address left in the --dhcp range");
            return;
        };
        info!(old = %ours, new = %new, "overlay address taken by another member; moving");
        self.cfg.handshake.hello.ipv4 = new;
        self.record_dirty = true;
        self.routes_dirty = true;
        self.actions.push_back(crate::node::Action::SetAddress { old: ours, new, prefix });
        // Peers learn the new address through a new handshake (the hello carries it).
        let keys: Vec<[u8; 32]> = self
            .peers
            .values()
            .filter(|p| p.sessions.iter().any(|s| s.session.is_confirmed()))
            .map(|p| p.key)
            .collect();
        for k in keys {
            self.rehandshake(now, k);
        }
    }

    /// Whether `r`'s node is the member we route its overlay address to (a record
    /// claiming an address another member holds gets nothing routed).
    fn owns_address(&self, r: &Record) -> bool {
        self.peers.get(&r.key).is_some_and(|p| p.hello.ipv4 == r.overlay)
            && self.address_owner(r.overlay, r.node(), |_| false).is_none()
    }

    /// Subnets other members proxy that we accept, with the record announcing each.
    fn accepted_subnets(&self) -> Vec<(&Record, std::net::Ipv4Addr, u8)> {
        self.topology
            .records()
            .filter(|r| !r.proxied.is_empty() && r.node() != self.id && self.owns_address(r))
            .flat_map(|r| r.proxied.iter().map(move |(a, p)| (r, *a, *p)))
            .filter(|(_, a, p)| self.subnet_refusal(*a, *p).is_none())
            .collect()
    }

    /// Why we will not route subnet `a/p` that a member proxies, if we will not: it
    /// would capture traffic that is not the member's to take.
    pub(crate) fn subnet_refusal(&self, a: std::net::Ipv4Addr, p: u8) -> Option<String> {
        let overlaps = |b: std::net::Ipv4Addr, q: u8| {
            let m = weft_core::route::prefix_mask(p.min(q));
            u32::from(a) & m == u32::from(b) & m
        };
        if p == 0 {
            return Some("a /0 would route every destination, the underlay included, to that member".into());
        }
        if p < 8 && !self.cfg.accept_wide_subnets {
            return Some(format!("/{p} is shorter than /8 (accepted only with --accept-wide-subnets on this node)"));
        }
        let hello = &self.cfg.handshake.hello;
        if overlaps(hello.ipv4, hello.prefix) {
            let m = weft_core::route::prefix_mask(hello.prefix);
            let net = std::net::Ipv4Addr::from(u32::from(hello.ipv4) & m);
            return Some(format!("overlaps the overlay network {net}/{}", hello.prefix));
        }
        let members = self
            .topology
            .records()
            .map(|r| (r.overlay, r.node()))
            .chain(self.peers.values().map(|x| (x.hello.ipv4, x.id)));
        for (addr, id) in members {
            if overlaps(addr, 32) {
                return Some(format!("holds member {id}'s overlay address {addr}"));
            }
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
        for r in self.topology.records().filter(|r| r.node() != self.id) {
            if let Some(owner) = self.address_owner(r.overlay, r.node(), |_| false) {
                v.push(format!(
                    "member {} ({:?}) claims overlay address {}, which belongs to member {owner}: refused",
                    r.node(),
                    r.hostname,
                    r.overlay
                ));
                continue;
            }
            for (a, p) in &r.proxied {
                if let Some(why) = self.subnet_refusal(*a, *p) {
                    v.push(format!("member {} ({:?}) proxies {a}/{p}: refused, {why}", r.node(), r.hostname));
                }
            }
        }
        v
    }

    /// Members whose record claims our overlay address.
    pub(crate) fn conflicts(&self) -> Vec<(NodeId, String)> {
        let ours = self.cfg.handshake.hello.ipv4;
        self.topology
            .records()
            .filter(|r| r.node() != self.id && r.overlay == ours)
            .map(|r| (r.node(), r.hostname.clone()))
            .collect()
    }

    pub(crate) fn path_status(&self, p: &Peer) -> PathStatus {
        match self.dest_for(&p.key) {
            Some(Dest { relay: None, .. }) if p.direct => PathStatus::Direct,
            Some(Dest { to, relay: Some(_) }) => {
                // Before the paths are computed (once per tick) the relay is the
                // neighbour the session's handshake came through.
                let path = self.paths.get(&p.id);
                let via = path
                    .map(|x| x.next_hop)
                    .or_else(|| self.peers.values().find(|n| n.direct && n.endpoint == Some(to)).map(|n| n.id));
                PathStatus::Relay { via: via.unwrap_or(p.id), hops: path.map_or(2, |x| x.hops) }
            }
            _ => PathStatus::None,
        }
    }

    pub(crate) fn route_status(&self) -> Vec<RouteStatus> {
        let mut v: Vec<RouteStatus> = self
            .paths
            .iter()
            .filter_map(|(id, path)| {
                let rec = self.topology.get(id)?;
                let session =
                    self.peers.get(&rec.key).is_some_and(|p| p.sessions.iter().any(|s| s.session.is_confirmed()));
                Some(RouteStatus {
                    node: *id,
                    hostname: rec.hostname.clone(),
                    overlay: rec.overlay,
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

    fn direct_neighbours(&self) -> impl Iterator<Item = [u8; 32]> + '_ {
        self.peers.values().filter(|p| p.direct && p.sessions.iter().any(|s| s.session.is_confirmed())).map(|p| p.key)
    }

    fn peer_by_id(&self, id: NodeId) -> Option<&Peer> {
        self.ids.get(&id).and_then(|k| self.peers.get(k))
    }

    fn key_of_session(&self, local_index: u32) -> Option<[u8; 32]> {
        self.peers.values().find(|p| p.sessions.iter().any(|s| s.session.local_index == local_index)).map(|p| p.key)
    }
}

/// The first free host address of `net/prefix`, starting from a position derived from
/// the node id so that nodes joining at once rarely pick the same one.
pub fn pick_address(
    net: std::net::Ipv4Addr,
    prefix: u8,
    node: NodeId,
    used: &std::collections::HashSet<std::net::Ipv4Addr>,
) -> Option<std::net::Ipv4Addr> {
    let host_bits = 32 - u32::from(prefix.min(30));
    let size = 1u64 << host_bits;
    let base = u32::from(net) & !((size - 1) as u32);
    let hosts = size - 2; // no network or broadcast address
    let start = u64::from_le_bytes(node.to_bytes()) % hosts;
    (0..hosts)
        .map(|i| base + 1 + ((start + i) % hosts) as u32)
        .map(std::net::Ipv4Addr::from)
        .find(|a| !used.contains(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_addresses_stay_in_range_and_skip_used_ones() {
        let net: std::net::Ipv4Addr = [10, 126, 126, 0].into();
        let id = NodeId::from_public(&[3; 32]);
        let mut used = std::collections::HashSet::new();
        let first = pick_address(net, 24, id, &used).unwrap();
        assert_eq!(first.octets()[..3], [10, 126, 126]);
        assert!((1..=254).contains(&first.octets()[3]));
        used.insert(first);
        let second = pick_address(net, 24, id, &used).unwrap();
        assert_ne!(first, second);
        let all: std::collections::HashSet<_> = (1..=254u8).map(|h| std::net::Ipv4Addr::new(10, 126, 126, h)).collect();
        assert_eq!(pick_address(net, 24, id, &all), None);
    }

    #[test]
    fn messages_round_trip() {
        for m in [Msg::Ping(7), Msg::Pong(u64::MAX), Msg::Punch(vec!["203.0.113.5:11010".parse().unwrap()])] {
            assert_eq!(Msg::parse(&m.emit()), Some(m));
        }
        assert_eq!(Msg::parse(&[]), None);
        assert_eq!(Msg::parse(&[9, 1, 2]), None);
        assert_eq!(Msg::parse(&[2, 1]), None);
    }
}
