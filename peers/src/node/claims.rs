//! Claims members make and which this node takes: overlay addresses (first holder,
//! `--dhcp` moves), proxied subnets (what they may capture, first holder without an
//! authority), and the refusals status lists.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use tracing::info;

use crate::address::derived_from;
use crate::identity::{NodeId, PeerKey};
use crate::node::Node;
use crate::peer::Peer;
use crate::topology::Record;

/// The last address of `a/p`.
pub(crate) fn last_ip(a: IpAddr, p: u8) -> IpAddr {
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

impl Node {
    /// Who claims each overlay address (peers with a session, every record), and
    /// whether more than one node does: an address with one claimant is its own
    /// without the per-member scan of `address_owner`, which settles the rare
    /// contested ones.
    pub(crate) fn claimants(&self) -> std::collections::HashMap<IpAddr, (NodeId, bool)> {
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
    pub(crate) fn owns6(
        &self,
        claims: &std::collections::HashMap<IpAddr, (NodeId, bool)>,
        id: NodeId,
        a: Ipv6Addr,
    ) -> bool {
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
    pub(crate) fn owns(&self, p: &Peer) -> bool {
        self.outside_overlay(IpAddr::V4(p.hello.ipv4)).is_none()
            && self.address_owner(p.hello.ipv4, p.id, |_| false).is_none()
            && self.mesh.topology.get(&p.id).is_none_or(|r| r.overlay == p.hello.ipv4)
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
    pub(crate) fn owns_address(&self, r: &Record, claims: &std::collections::HashMap<IpAddr, (NodeId, bool)>) -> bool {
        self.outside_overlay(IpAddr::V4(r.overlay)).is_none()
            && self.peers.get(&PeerKey(r.key)).is_some_and(|p| p.hello.ipv4 == r.overlay)
            && match claims.get(&IpAddr::V4(r.overlay)) {
                Some((id, false)) => *id == r.node(),
                _ => self.address_owner(r.overlay, r.node(), |_| false).is_none(),
            }
    }

    /// Subnets other members proxy that we accept, with the record announcing each.
    pub(crate) fn accepted_subnets(
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
}
