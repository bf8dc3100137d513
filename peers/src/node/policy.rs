//! The access policy as the engine sees it: the members a policy is compiled against
//! (names bound to keys), and the signed policy's distribution (held only once it
//! can be applied, bound to the network, passed to every member in pieces).

use std::collections::HashMap;

use weft_core::cert::Certificate;

use super::Node;
use crate::authority::grants;
use crate::identity::PeerKey;

impl Node {
    /// What this node knows of every member, itself included, for an access policy:
    /// node id and key, the host name bound to it, overlay addresses, certificate
    /// groups (with an authority) and the proxied subnets this node accepts from it.
    ///
    /// A name counts only for the member it is bound to: with an authority the
    /// certificate's name when one member carries it, and otherwise (or when two
    /// certificates name the same host) the member this node saw with it first
    /// ([`crate::Names`]). A member claiming a name another holds has none here.
    pub fn members(&self) -> Vec<weft_core::policy::Member> {
        let groups_of = |cert: Option<&[u8]>| -> Vec<String> {
            if self.cfg.authorities.is_empty() {
                return Vec::new();
            }
            cert.and_then(|c| Certificate::from_bytes(c).ok()).map(|c| c.body().groups.clone()).unwrap_or_default()
        };
        let hex = |k: &[u8; 32]| k.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let hello = &self.cfg.handshake.hello;
        let own = self.cfg.handshake.local.public;
        let mut claims: HashMap<String, usize> = HashMap::new();
        *claims.entry(hello.hostname.to_ascii_lowercase()).or_default() += 1;
        for r in self.mesh.topology.records().filter(|r| r.key != own) {
            *claims.entry(r.hostname.to_ascii_lowercase()).or_default() += 1;
        }
        let bound = |name: &str, id: crate::NodeId| -> String {
            let sole = !self.cfg.authorities.is_empty() && claims.get(&name.to_ascii_lowercase()) == Some(&1);
            if sole || self.cfg.names.holder(name) == Some(id) { name.to_owned() } else { String::new() }
        };
        let mut out = vec![weft_core::policy::Member {
            node_id: self.id().to_string(),
            key: hex(&own),
            name: bound(&hello.hostname, self.id()),
            addrs: std::iter::once(std::net::IpAddr::V4(hello.ipv4))
                .chain(hello.ipv6.map(|(a, _)| std::net::IpAddr::V6(a)))
                .collect(),
            groups: groups_of(hello.cert.as_deref()),
            subnets: self.cfg.proxied.clone(),
        }];
        let unrecorded = self.unrecorded_addresses();
        for r in self.mesh.topology.records() {
            if r.key == own {
                continue;
            }
            let subnets = r
                .proxied
                .iter()
                .filter(|&&(a, p)| {
                    p != 0
                        && grants(&self.cfg.authorities, r, a, p)
                        && self.proxied_refusal(r.node(), a, p, &unrecorded).is_none()
                })
                .copied()
                .collect();
            out.push(weft_core::policy::Member {
                node_id: r.node().to_string(),
                key: hex(&r.key),
                name: bound(&r.hostname, r.node()),
                addrs: std::iter::once(std::net::IpAddr::V4(r.overlay))
                    .chain(r.overlay6.map(std::net::IpAddr::V6))
                    .collect(),
                groups: groups_of(r.cert.as_deref()),
                subnets,
            });
        }
        out.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        out
    }

    /// Takes an access policy signed by the authority (encoded
    /// [`weft_core::policy::SignedPolicy`]: `weft policy push` or a member): a newer
    /// one than held that is for this network, parses, and whose tests hold here is
    /// held, announced ([`crate::Action::PolicyChanged`]) and passed to every member.
    /// One signed for this network that cannot be applied here is neither held nor
    /// passed on, and the node fails closed ([`crate::Action::PolicyRefused`]).
    /// Returns whether it was newer and taken.
    pub fn offer_policy(&mut self, now: std::time::Instant, bytes: Vec<u8>) -> Result<bool, String> {
        let new = self.take_policy(now, bytes, false);
        self.finish_step(now);
        new
    }

    /// The signed policy kept in the state directory at start: as
    /// [`Node::offer_policy`], but one an older release signed for no network is
    /// taken too (this node applied it before), and so is one whose authority is no
    /// longer trusted after a rollover — in force until a newer one from a trusted
    /// authority arrives, and never passed on.
    pub fn keep_policy(&mut self, now: std::time::Instant, bytes: Vec<u8>) -> Result<bool, String> {
        let new = self.take_policy(now, bytes, true);
        self.finish_step(now);
        new
    }

    /// This node's overlay networks (what a policy's `internet` is not).
    pub fn overlay_networks(&self) -> Vec<(std::net::IpAddr, u8)> {
        let h = &self.cfg.handshake.hello;
        std::iter::once((std::net::IpAddr::V4(h.ipv4), h.prefix))
            .chain(h.ipv6.map(|(a, p)| (std::net::IpAddr::V6(a), p)))
            .map(|(a, p)| (weft_core::route::network_ip(a, p), p))
            .collect()
    }

    pub(crate) fn take_policy(&mut self, now: std::time::Instant, bytes: Vec<u8>, kept: bool) -> Result<bool, String> {
        if self.cfg.authorities.is_empty() {
            return Err("this node has no authority (--authority) to check a signed policy against".into());
        }
        let p = weft_core::policy::SignedPolicy::from_bytes(&bytes).map_err(|e| format!("not a signed policy: {e}"))?;
        let held = self.trust.policy.as_ref().map(|h| h.version);
        // A policy kept across an authority rollover yields to any policy of a
        // trusted authority: the new authority's versions start where it likes.
        if held.is_some_and(|v| v >= p.version) && !self.trust.policy.as_ref().is_some_and(|h| h.untrusted) {
            return Ok(false);
        }
        if self.trust.policy_refused.as_ref().is_some_and(|(v, _)| *v >= p.version) {
            return Ok(false);
        }
        let trusted = p.verify(&self.cfg.authorities);
        let untrusted = !trusted && kept && p.verify(&[p.authority]);
        if !trusted && !untrusted {
            return Err(format!("not signed by this network's authority (it names {})", p.authority));
        }
        if let Some(why) = p.network_refusal(&self.cfg.handshake.network_name)
            && !(kept && p.network.is_none())
        {
            return Err(format!("refused: {why}"));
        }
        // Held only once it can be applied here: it parses and its tests hold
        // against the members this node knows. Otherwise the node fails closed.
        let applies = weft_core::policy::Policy::parse(&p.text).map_err(|e| e.to_string()).and_then(|policy| {
            policy.check_known_tests(&self.members(), &self.overlay_networks()).map_err(|e| e.to_string())
        });
        if let Err(e) = applies {
            let why = format!("signed policy version {} cannot be applied here: {e}", p.version);
            tracing::warn!("{why}: this node denies every flow but its own until a policy it can apply arrives");
            self.trust.policy_refused = Some((p.version, why.clone()));
            self.actions.push_back(crate::Action::PolicyRefused(why.clone()));
            return Err(why);
        }
        self.trust.policy_refused = None;
        if untrusted {
            tracing::warn!(
                version = p.version,
                authority = %p.authority,
                "the kept access policy's authority is no longer trusted: it stays in force until one of a trusted authority arrives"
            );
        } else {
            tracing::info!(version = p.version, "access policy signed by the authority: newer, passed to the mesh");
        }
        self.trust.policy = Some(crate::node::HeldPolicy { version: p.version, bytes: bytes.clone(), untrusted });
        self.actions.push_back(crate::Action::PolicyChanged(bytes));
        if !untrusted {
            let up: Vec<PeerKey> = self.peers.values().filter(|p| p.is_up()).map(|p| p.key).collect();
            for k in up {
                self.send_policy(now, k);
            }
        }
        Ok(true)
    }

    /// Sends member `key` our signed policy, in pieces, unless its session has it.
    pub(crate) fn send_policy(&mut self, now: std::time::Instant, key: PeerKey) {
        let Some(held) = self.trust.policy.as_ref().filter(|h| !h.untrusted) else { return };
        let (version, bytes) = (held.version, held.bytes.clone());
        let Some(p) = self.peers.get(&key) else { return };
        if p.policy_sent >= version || !p.is_up() || p.hello.protocol().caps & weft_core::handshake::caps::POLICY == 0 {
            return;
        }
        let parts = bytes.chunks(crate::mesh::POLICY_PART).count() as u16;
        for (i, chunk) in bytes.chunks(crate::mesh::POLICY_PART).enumerate() {
            let msg = crate::mesh::Msg::PolicyPart { version, part: i as u16, parts, bytes: chunk.to_vec() };
            self.send_msg(&key, &msg, now);
        }
        if let Some(p) = self.peers.get_mut(&key) {
            p.policy_sent = version;
        }
    }

    /// A piece of a signed policy from member `from`: kept (per member, one version
    /// at a time, at most 64 pieces of 1000 bytes) until the policy is whole.
    pub(crate) fn policy_part(
        &mut self,
        now: std::time::Instant,
        from: PeerKey,
        version: u64,
        part: u16,
        parts: u16,
        bytes: Vec<u8>,
    ) {
        let held = self.trust.policy.as_ref().filter(|h| !h.untrusted).map(|h| h.version);
        if self.cfg.authorities.is_empty() || held.is_some_and(|v| v >= version) {
            return;
        }
        let Some(peer) = self.peers.get_mut(&from) else { return };
        // A newer version, or the same one cut differently, starts over.
        if peer.policy_parts.as_ref().is_none_or(|(v, p)| *v != version || p.len() != usize::from(parts)) {
            peer.policy_parts = Some((version, vec![None; usize::from(parts)]));
        }
        let Some((_, pieces)) = peer.policy_parts.as_mut() else { return };
        if let Some(slot) = pieces.get_mut(usize::from(part)) {
            *slot = Some(bytes);
        }
        if pieces.iter().all(Option::is_some) {
            let whole: Vec<u8> = pieces.iter().flatten().flatten().copied().collect();
            peer.policy_parts = None;
            if let Err(e) = self.take_policy(now, whole, false) {
                tracing::debug!(peer = %from.id(), "signed policy from a member refused: {e}");
                if e.starts_with("not signed") {
                    self.signature_failed(now, from);
                }
            }
        }
    }
}
