//! The route snapshot the data path reads, the proxied routes the kernel installs, and
//! the routes and paths status shows.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use weft_core::endpoint::Endpoint;
use weft_core::route::{Demand, Route, RouteSnapshot, Serves};

use crate::identity::{NodeId, PeerKey};
use crate::node::paths::DEMAND_BUDGET;
use crate::node::{Dest, Node};
use crate::peer::Peer;
use crate::status::{PathStatus, RouteStatus};

impl Node {
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
            // Of several routers, only the primary ([`crate::node::routers`]).
            if !self.routes_subnet_via(a, p, r.node()) {
                continue;
            }
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
    pub(crate) fn serves(&self) -> Serves {
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
