//! Issuing certificates to machines with an invite (`--authority-key`): the join asked
//! inside a handshake, checked, answered with a certificate or a refusal, and kept in
//! the ledger.

use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use tracing::{info, warn};
use weft_core::admission::Which;
use weft_core::cert::{AuthorityKey, CertBody, Certificate};
use weft_core::handshake::{Hello, IkRead};
use weft_core::invite::Invite;
use weft_core::wire::HandshakeHeader;

use crate::identity::{NodeId, PeerKey};
use crate::issuer::{Issued, Issuer, MAX_LEDGER};
use crate::node::{Action, Dest, Node};

impl Node {
    /// Makes this node an issuer for invites, holding the authority key `key` and
    /// the certificates it issued before (from the state directory).
    pub fn set_issuer(&mut self, key: AuthorityKey, ledger: Vec<Issued>) {
        self.trust.issuer = Some(Issuer { key, ledger });
    }

    /// The certificates this node issued (empty when it is no issuer).
    pub fn issued(&self) -> &[Issued] {
        self.trust.issuer.as_ref().map_or(&[], |i| &i.ledger)
    }

    /// Answers the IK init `read` (whose hello carries an invite) with a certificate
    /// or the reason for refusing one; never makes a session.
    pub(crate) fn answer_join(&mut self, now: Instant, back: &Dest, hdr: HandshakeHeader, read: IkRead, which: Which) {
        let key = PeerKey(read.remote_static);
        let mut mine = Hello { stamp: None, ..self.cfg.handshake.hello.clone() };
        match self.issue(now, &key, &read.hello) {
            Ok(cert) => mine.issued = Some(cert.to_bytes()),
            Err(why) => {
                warn!(node = %key.id(), host = %read.hello.hostname, "join refused: {why}");
                mine.join_refused = Some(why);
            }
        }
        match read.answer(&mine) {
            Ok((_, msg)) => {
                self.answer_init(back, hdr, &msg, which);
            }
            Err(e) => warn!(node = %key.id(), "cannot answer a join: {e}"),
        }
    }

    pub(crate) fn issue(&mut self, now: Instant, key: &PeerKey, hello: &Hello) -> Result<Certificate, String> {
        let unix = (self.cfg.wall + now.saturating_duration_since(self.cfg.epoch)).as_secs();
        if self.trust.issuer.is_none() {
            return Err("this member does not issue certificates (one started with --authority-key does)".into());
        }
        let bytes = hello.join.as_deref().unwrap_or_default();
        let invite = Invite::from_bytes(bytes).map_err(|e| format!("the invite is unreadable ({e})"))?;
        let b = invite.body();
        if !invite.verify(&self.cfg.authorities) {
            return Err(format!("the invite is not signed by this network's authority (it names {})", b.authority));
        }
        if b.network != self.cfg.handshake.network_name {
            return Err(format!("the invite is for network {:?}, not this one", b.network));
        }
        if self.trust.revocations.contains(&b.id) {
            return Err("the invite was revoked".into());
        }
        if self.trust.revocations.contains(&key.0) {
            return Err("this node key was revoked".into());
        }
        // Also a machine asking again: the invite renews nothing once it expired.
        if unix >= b.expires {
            return Err(format!("the invite expired {} s ago", unix - b.expires));
        }
        let marked = self
            .cfg
            .handshake
            .hello
            .cert
            .as_deref()
            .and_then(|c| Certificate::from_bytes(c).ok())
            .is_some_and(|c| c.body().issuer);
        if !marked {
            return Err(
                "this member's certificate does not mark it an issuer (the authority signs that with `weft authority sign --issuer`)"
                    .into(),
            );
        }
        let again = self
            .trust
            .issuer
            .as_ref()
            .and_then(|i| i.ledger.iter().find(|e| e.invite == b.id && e.node == key.0))
            .map(|e| (e.ipv4, e.name.clone()));
        let (ipv4, name) = match again.clone() {
            Some(e) => e,
            None => {
                let used =
                    self.trust.issuer.as_ref().map_or(0, |i| i.ledger.iter().filter(|e| e.invite == b.id).count());
                if b.uses != 0 && used >= b.uses as usize {
                    return Err(format!("the invite is used up ({used} of {} uses)", b.uses));
                }
                if self.trust.issuer.as_ref().is_some_and(|i| i.ledger.len() >= MAX_LEDGER) {
                    return Err(format!("this issuer already issued {MAX_LEDGER} certificates"));
                }
                (self.free_address(key)?, self.free_name(key, &hello.hostname))
            }
        };
        let mine = &self.cfg.handshake.hello;
        // The new member's IPv6 address, when the network has IPv6: its node id in the
        // issuer's /64, which no other node can hold.
        let ipv6 = mine.ipv6.filter(|&(_, p)| p == 64).map(|(a, p)| {
            let mut o = a.octets();
            o[8..].copy_from_slice(&key.id().to_bytes());
            (Ipv6Addr::from(o), p)
        });
        let Some(issuer) = self.trust.issuer.as_mut() else { return Err("no issuer".into()) };
        let body = CertBody {
            authority: issuer.key.id(),
            node: key.0,
            network: b.network.clone(),
            name: name.clone(),
            ipv4: (ipv4, mine.prefix),
            ipv6,
            groups: b.groups.clone(),
            subnets: Vec::new(),
            exit: false,
            portal: false,
            // A minute back: a new machine whose clock is a little behind takes it too.
            not_before: unix.saturating_sub(60),
            not_after: unix.saturating_add(u64::from(b.lifetime)),
            issued: Some(unix),
            issuer: false,
        };
        let cert = body.sign(&issuer.key).map_err(|e| format!("cannot sign a certificate: {e}"))?;
        if again.is_none() {
            issuer.ledger.push(Issued { invite: b.id, node: key.0, ipv4, name: name.clone(), at: unix });
            self.actions.push_back(Action::SaveIssued(issuer.ledger.clone()));
        }
        self.note_certificate(now, Some(&cert.to_bytes()));
        info!(node = %key.id(), %name, addr = %ipv4, invite = %NodeId::from_public(&b.id), "issued a member certificate for an invite");
        Ok(cert)
    }

    /// An address in this node's overlay network that no member, peer or earlier
    /// issue holds, starting from a place the node key picks (two issuers rarely
    /// pick the same one).
    pub(crate) fn free_address(&self, key: &PeerKey) -> Result<Ipv4Addr, String> {
        let mine = &self.cfg.handshake.hello;
        let prefix = mine.prefix;
        if prefix >= 31 || prefix == 0 {
            return Err(format!("this issuer's overlay network (/{prefix}) has no room for members"));
        }
        let mut taken: HashSet<Ipv4Addr> = HashSet::new();
        taken.insert(mine.ipv4);
        taken.extend(self.peers.values().map(|p| p.hello.ipv4));
        taken.extend(self.mesh.topology.records().map(|r| r.overlay));
        if let Some(i) = &self.trust.issuer {
            taken.extend(i.ledger.iter().filter(|e| e.node != key.0).map(|e| e.ipv4));
        }
        // And every address a certificate seen grants another key, its holder online
        // or not (a joiner grinding keys never lands on an offline member's address).
        taken.extend(self.trust.newest.certs().filter(|c| c.body().node != key.0).map(|c| c.body().ipv4.0));
        let size = 1u64 << (32 - prefix);
        let net = u32::from(mine.ipv4) & (u32::MAX << (32 - prefix));
        let id = key.id().to_bytes();
        let start = u64::from(u32::from_be_bytes([id[0], id[1], id[2], id[3]])) % size;
        (0..size)
            .map(|i| (start + i) % size)
            // Neither the network's nor its broadcast address.
            .filter(|&h| h != 0 && h != size - 1)
            .map(|h| Ipv4Addr::from(net + h as u32))
            .find(|a| !taken.contains(a))
            .ok_or_else(|| format!("no free address left in {}/{prefix}", Ipv4Addr::from(net)))
    }

    /// `wanted` made a host name (lower case, letters, digits and '-'), with a
    /// number after it when another member uses it already.
    pub(crate) fn free_name(&self, key: &PeerKey, wanted: &str) -> String {
        let mut base: String = wanted
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>()
            .trim_matches('-')
            .chars()
            .take(48)
            .collect();
        if base.is_empty() {
            base = format!("node-{}", &key.id().to_string()[..8]);
        }
        let mut taken: HashSet<&str> = HashSet::new();
        taken.insert(self.cfg.handshake.hello.hostname.as_str());
        taken.extend(self.peers.values().filter(|p| p.key != *key).map(|p| p.hello.hostname.as_str()));
        taken.extend(self.mesh.topology.records().filter(|r| r.key != key.0).map(|r| r.hostname.as_str()));
        if let Some(i) = &self.trust.issuer {
            taken.extend(i.ledger.iter().filter(|e| e.node != key.0).map(|e| e.name.as_str()));
        }
        taken.extend(self.trust.newest.certs().filter(|c| c.body().node != key.0).map(|c| c.body().name.as_str()));
        if !taken.contains(base.as_str()) {
            return base;
        }
        (2..).map(|n| format!("{base}-{n}")).find(|n| !taken.contains(n.as_str())).unwrap_or(base)
    }
}
