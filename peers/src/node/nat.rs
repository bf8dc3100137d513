//! This node's NAT and its peers', as the signed records of their links report them
//! (`weft netcheck`, status `nat`), and why a relayed peer has no direct path.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use weft_core::endpoint::{Endpoint, Proto, canonical};

use super::Node;
use crate::identity::{NodeId, PeerKey};
use crate::nat::{Filtering, NatGuess, Side, classify, no_direct_reason};
use crate::status::NatStatus;

/// Where each node is seen: observed UDP address by observer, from every record.
pub(crate) type Sightings = BTreeMap<NodeId, Vec<(NodeId, SocketAddr)>>;

impl Node {
    /// Every UDP address at which a record's author sees one of its links.
    pub(crate) fn sightings(&self) -> Sightings {
        let mut out = Sightings::new();
        for r in self.mesh.topology.records() {
            let observer = r.node();
            for n in r.neighbours.iter().filter(|n| n.observed.proto == Proto::Udp) {
                out.entry(n.node).or_default().push((observer, n.observed.addr));
            }
        }
        out
    }

    /// The NAT of node `id` (this node or another) and whether it announces a port its
    /// router maps.
    pub(crate) fn nat_side(&self, id: NodeId, seen: &Sightings) -> (NatGuess, bool) {
        let observed: Vec<SocketAddr> = seen.get(&id).map(|v| v.iter().map(|(_, a)| *a).collect()).unwrap_or_default();
        let endpoints: Vec<Endpoint> = if id == self.id {
            self.cfg.endpoints.clone()
        } else {
            self.mesh.topology.get(&id).map(|r| r.endpoints.clone()).unwrap_or_default()
        };
        let local: Vec<SocketAddr> = endpoints.iter().filter(|e| e.proto == Proto::Udp).map(|e| e.addr).collect();
        let guess = classify(&observed, &local);
        // A UDP endpoint it announces at the public address it is seen at, on a port
        // nobody sees it at: its router forwards that port (port mapping).
        let mapped = local.iter().map(|a| canonical(*a)).any(|a| {
            observed.iter().any(|o| canonical(*o).ip() == a.ip()) && !observed.iter().any(|o| canonical(*o) == a)
        });
        (guess, mapped)
    }

    /// A packet arrived straight from `from`: if it is the first from a UDP address
    /// outside this node's networks that it never sent to, its NAT let it in unasked.
    pub(crate) fn note_arrival(&mut self, now: Instant, from: Endpoint) {
        if from.proto != Proto::Udp {
            return;
        }
        let ip = canonical(from.addr).ip();
        if self.cfg.local_networks.iter().any(|(n, len)| weft_core::route::overlaps_ip(*n, *len, ip, 128)) {
            return;
        }
        if self.report.filtering.arrived(from.addr, now) {
            tracing::info!(%from, "a packet got in from an address this node never sent to: its NAT's filter lets strangers in");
        }
    }

    /// What status says of this node's NAT.
    pub(crate) fn nat_status(&self, seen: &Sightings) -> NatStatus {
        let (guess, mapped) = self.nat_side(self.id, seen);
        let observed = seen
            .get(&self.id)
            .map(|v| {
                v.iter()
                    .map(|(by, a)| {
                        let host = self.mesh.topology.get(by).map(|r| r.hostname.clone()).unwrap_or_default();
                        (*by, host, *a)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let filtering = match (guess.mapping, mapped, self.report.filtering.unasked) {
            (crate::nat::Mapping::NoNat, ..) => Filtering::NoNat,
            (_, true, _) => Filtering::Mapped,
            (_, _, Some(_)) => Filtering::Open,
            _ => Filtering::NotSeenOpen,
        };
        NatStatus {
            guess,
            mapped,
            observed,
            candidates: self.candidates(&PeerKey(self.cfg.handshake.local.public)),
            filtering,
            unasked: self.report.filtering.unasked,
        }
    }

    /// Why relayed peer `key` has no direct path.
    pub(crate) fn no_direct(&self, key: &PeerKey, seen: &Sightings, ours: &(NatGuess, bool)) -> String {
        let theirs = self.nat_side(key.id(), seen);
        let Some(p) = self.peers.get(key) else { return String::new() };
        let why = no_direct_reason(
            Side { nat: &ours.0, mapped: ours.1 },
            Side { nat: &theirs.0, mapped: theirs.1 },
            p.punch_rounds,
        );
        if let Some((b, ip)) = &p.birthday {
            format!("{why}; hard NAT probing: {} probes to {ip} in {} rounds", b.total_probes, b.total_rounds)
        } else if p.opener.total > 0 && ours.0.mapping == crate::nat::Mapping::Dependent {
            format!("{why}; hard NAT probing: opened {} mappings for its probes", p.opener.total)
        } else {
            why
        }
    }
}

/// This node's part in the birthday method with a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// This node's NAT is endpoint-independent (or it has none) and the peer's is
    /// dependent: probe the peer's public address.
    Easy(std::net::IpAddr),
    /// The other way round: open mappings towards the peer's endpoint.
    Hard,
}

impl Node {
    /// Whether the pair of this node and `key` takes the birthday method, and which
    /// side this node is ([`crate::nat::birthday_side`]), with the peer's public
    /// address for the easy side.
    pub(crate) fn birthday_role(&self, now: Instant, key: &PeerKey) -> Option<Role> {
        let seen = self.sightings();
        let (ours, our_map) = self.nat_side(self.id, &seen);
        let (theirs, their_map) = self.nat_side(key.id(), &seen);
        let easy =
            crate::nat::birthday_side(Side { nat: &ours, mapped: our_map }, Side { nat: &theirs, mapped: their_map })?;
        if !easy {
            return Some(Role::Hard);
        }
        // Its public address as our own links see it (never an address it names).
        let mut at = Vec::new();
        self.push_observed(key.id(), self.links(now).filter(|k| k != key).map(|k| k.id()), &mut at);
        at.first().map(|e| Role::Easy(canonical(e.addr).ip()))
    }

    /// After a punch (ours, or the peer's request): start or stop the birthday
    /// method with `key`; the hard side opens its mappings towards `targets` (where
    /// the peer is seen) now.
    pub(crate) fn birthday_after_punch(&mut self, now: Instant, key: &PeerKey, targets: &[Endpoint]) {
        let role = self.birthday_role(now, key);
        let Some(p) = self.peers.get_mut(key) else { return };
        match role {
            Some(Role::Easy(ip)) => {
                if p.birthday.as_ref().is_none_or(|(_, at)| *at != ip) {
                    tracing::info!(peer = %p.id, %ip, "its NAT is endpoint-dependent, ours is not: probing its ports");
                    p.birthday = Some((crate::nat::birthday::Birthday::new(now), ip));
                    self.touch(*key);
                }
            }
            Some(Role::Hard) => {
                p.birthday = None;
                self.open_mappings(now, key, targets);
            }
            None => p.birthday = None,
        }
    }

    /// The hard side: asks the runtime for [`BIRTHDAY_SOCKETS`] fresh mappings towards
    /// the peer's first UDP target, each opened by a sealed keepalive, sent in bursts
    /// of [`OPEN_BURST`], as often as the peer's [`Opener`] allows.
    ///
    /// [`Opener`]: crate::nat::birthday::Opener
    fn open_mappings(&mut self, now: Instant, key: &PeerKey, targets: &[Endpoint]) {
        use crate::nat::birthday::{BIRTHDAY_HOLD, BIRTHDAY_SOCKETS, BIRTHDAY_TICK, OPEN_BURST};
        let epoch = self.cfg.epoch;
        let Some(to) = targets.iter().find(|e| e.proto == Proto::Udp).copied() else { return };
        let Some(p) = self.peers.get_mut(key) else { return };
        let Some(session) = p.tx().map(|s| s.session.clone()) else { return };
        if !p.opener.open(now) {
            return;
        }
        tracing::debug!(peer = %p.id, %to, sockets = BIRTHDAY_SOCKETS, "opening mappings for the peer's probes");
        let datagrams = (0..BIRTHDAY_SOCKETS).map(|_| super::keepalive(&session, now, epoch)).collect();
        self.actions.push_back(crate::node::Action::OpenMappings {
            to,
            datagrams,
            hold: BIRTHDAY_HOLD,
            burst: OPEN_BURST,
            every: BIRTHDAY_TICK,
        });
    }

    /// The easy side's rounds and probes towards a relayed peer: each round asks the
    /// hard side (a punch request through the relay) to open its mappings, then sends
    /// keepalives to random ports of its public address at the scheduler's pace.
    /// Stops when the path is direct or traffic stops.
    pub(crate) fn drive_birthday(&mut self, now: Instant, key: PeerKey, active: bool) {
        let epoch = self.cfg.epoch;
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.birthday.is_none() {
            return;
        }
        if p.path.is_direct() || !active {
            p.birthday = None;
            return;
        }
        let Some(session) = p.tx().map(|s| s.session.clone()) else { return };
        let Some((b, ip)) = p.birthday.as_mut() else { return };
        let ip = *ip;
        let started = b.start_round(now);
        let rng = &mut self.rng;
        let ports = b.due(now, || rand::RngCore::next_u32(rng) as u16);
        if started {
            let ours = self.candidates(&PeerKey(self.cfg.handshake.local.public));
            self.send_msg(&key, &crate::mesh::Msg::Punch(ours), now);
        }
        if let Some(p) = self.peers.get_mut(&key) {
            p.probes_sent += ports.len() as u64;
        }
        for port in ports {
            let to = Endpoint::udp(SocketAddr::new(ip, port));
            self.actions.push_back(super::Dest::direct(to).send(super::keepalive(&session, now, epoch)));
        }
    }
}
