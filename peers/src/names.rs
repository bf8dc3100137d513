//! Who a name belongs to, as this node saw it: ssh's known_hosts model. A host name is
//! bound to the member that claimed it first; a later member with the same name gets
//! the suffixed name in Magic DNS and never `--use-exit-node`'s traffic. Node ids can
//! be ground in seconds, so "the lowest id wins" would hand a copied name to whoever
//! grinds one. The runtime keeps the bindings (and the exit pin) in the state
//! directory ([`crate::Action::SaveNames`]), so they survive restarts.
//!
//! Proxied subnets are bound the same way in a network without an authority: the
//! first member seen announcing a prefix holds it, and a later member's prefix that
//! overlaps it (narrower or wider) is refused, until the holder's own record stops
//! announcing it. With an authority, certificates say who may proxy what.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::identity::NodeId;

/// At most this many names are bound (a member minting keys and names cannot grow
/// the book, or the file, without bound; the oldest bindings stay).
pub const MAX_NAMES: usize = 4096;

/// Name bindings and the exit pin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// Lower-case host name → the member that claimed it first.
    by_name: BTreeMap<String, NodeId>,
    /// `--use-exit-node`'s value and the member it first matched.
    exit_pin: Option<(String, NodeId)>,
    /// Proxied prefix (masked) → the member seen announcing it first.
    subnets: BTreeMap<(IpAddr, u8), NodeId>,
}

impl Names {
    /// Bindings read back from the state directory.
    pub fn new(bindings: impl IntoIterator<Item = (String, NodeId)>, exit_pin: Option<(String, NodeId)>) -> Self {
        let mut by_name = BTreeMap::new();
        for (name, id) in bindings {
            if by_name.len() < MAX_NAMES && !name.is_empty() {
                by_name.entry(name.to_ascii_lowercase()).or_insert(id);
            }
        }
        Self { by_name, exit_pin, subnets: BTreeMap::new() }
    }

    /// These subnet bindings too (read back from the state directory).
    #[must_use]
    pub fn with_subnets(mut self, bindings: impl IntoIterator<Item = ((IpAddr, u8), NodeId)>) -> Self {
        for ((a, p), id) in bindings {
            self.bind_subnet(a, p, id);
        }
        self
    }

    /// Every subnet binding, by prefix.
    pub fn subnet_bindings(&self) -> impl Iterator<Item = ((IpAddr, u8), NodeId)> + '_ {
        self.subnets.iter().map(|(k, id)| (*k, *id))
    }

    /// A bound prefix overlapping `a/p` that a member other than `id` holds.
    /// Looked up, not scanned (a route rebuild asks this for every announced subnet):
    /// the prefixes holding `a/p` are one per shorter length, and those inside it are
    /// one range of the book (its keys are masked and order by address first).
    pub fn subnet_holder(&self, a: IpAddr, p: u8, id: NodeId) -> Option<((IpAddr, u8), NodeId)> {
        let other = |k: (IpAddr, u8)| self.subnets.get(&k).filter(|h| **h != id).map(|h| (k, *h));
        let wider = (1..=p).find_map(|q| other((weft_core::route::network_ip(a, q), q)));
        wider.or_else(|| {
            let lo = weft_core::route::network_ip(a, p);
            let hi = match lo {
                IpAddr::V4(v) => IpAddr::V4((u32::from(v) | u32::MAX.checked_shr(u32::from(p)).unwrap_or(0)).into()),
                IpAddr::V6(v) => IpAddr::V6((u128::from(v) | u128::MAX.checked_shr(u32::from(p)).unwrap_or(0)).into()),
            };
            self.subnets
                .range((lo, 0)..=(hi, u8::MAX))
                .find(|(k, holder)| k.1 > p && **holder != id)
                .map(|(k, h)| (*k, *h))
        })
    }

    /// Binds `a/p` to `id` unless a prefix overlapping it is another member's (a /0,
    /// an exit's offer, is never bound); true when it was new.
    pub(crate) fn bind_subnet(&mut self, a: IpAddr, p: u8, id: NodeId) -> bool {
        let key = (weft_core::route::network_ip(a, p), p);
        if p == 0 || self.subnets.len() >= MAX_NAMES || self.subnets.contains_key(&key) {
            return false;
        }
        if self.subnet_holder(a, p, id).is_some() {
            return false;
        }
        self.subnets.insert(key, id);
        true
    }

    /// Releases the prefixes `id` holds that it no longer announces (`now`, from its
    /// own current record); true when any was released.
    pub(crate) fn release_subnets(&mut self, id: NodeId, now: &[(IpAddr, u8)]) -> bool {
        let before = self.subnets.len();
        self.subnets.retain(|&(b, q), holder| {
            *holder != id || now.iter().any(|&(a, p)| p == q && weft_core::route::network_ip(a, p) == b)
        });
        self.subnets.len() != before
    }

    /// The member `name` (any case) is bound to.
    pub fn holder(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(&name.to_ascii_lowercase()).copied()
    }

    /// Binds `name` to `id` unless it is bound already; true when it was new.
    pub(crate) fn bind(&mut self, name: &str, id: NodeId) -> bool {
        if name.is_empty() || self.by_name.len() >= MAX_NAMES {
            return false;
        }
        let key = name.to_ascii_lowercase();
        if self.by_name.contains_key(&key) {
            return false;
        }
        self.by_name.insert(key, id);
        true
    }

    /// Every binding, by name.
    pub fn bindings(&self) -> impl Iterator<Item = (&str, NodeId)> + '_ {
        self.by_name.iter().map(|(n, id)| (n.as_str(), *id))
    }

    /// The member `--use-exit-node wanted` is pinned to, if it was pinned under that
    /// very value.
    pub fn exit_pin(&self, wanted: &str) -> Option<NodeId> {
        self.exit_pin.as_ref().filter(|(w, _)| w == wanted).map(|(_, id)| *id)
    }

    /// The pin as stored (value and member), for the state file.
    pub fn exit_pin_entry(&self) -> Option<(&str, NodeId)> {
        self.exit_pin.as_ref().map(|(w, id)| (w.as_str(), *id))
    }

    /// Pins `--use-exit-node wanted` to `id`.
    pub(crate) fn pin_exit(&mut self, wanted: &str, id: NodeId) {
        self.exit_pin = Some((wanted.to_owned(), id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> NodeId {
        NodeId::from_bytes([b; 8])
    }

    #[test]
    fn the_first_holder_keeps_a_name_in_any_case() {
        let mut n = Names::default();
        assert!(n.bind("Gateway", id(9)));
        assert!(!n.bind("gateway", id(1)), "a lower id takes nothing");
        assert_eq!(n.holder("GATEWAY"), Some(id(9)));
        assert!(!n.bind("", id(3)));
        let back = Names::new(n.bindings().map(|(a, b)| (a.to_owned(), b)), None);
        assert_eq!(back, n);
    }

    #[test]
    fn the_exit_pin_holds_only_for_the_value_it_was_made_for() {
        let mut n = Names::default();
        n.pin_exit("gw", id(4));
        assert_eq!(n.exit_pin("gw"), Some(id(4)));
        assert_eq!(n.exit_pin("other"), None);
    }

    #[test]
    fn the_first_holder_keeps_a_prefix_against_narrower_and_wider_ones() {
        let net = |s: &str| -> (IpAddr, u8) {
            let (a, p) = s.split_once('/').unwrap();
            (a.parse().unwrap(), p.parse().unwrap())
        };
        let mut n = Names::default();
        let (a, p) = net("192.168.50.0/24");
        assert!(n.bind_subnet(a, p, id(1)));
        for other in ["192.168.50.0/25", "192.168.50.128/25", "192.168.0.0/16", "192.168.50.0/24"] {
            let (b, q) = net(other);
            assert!(!n.bind_subnet(b, q, id(2)), "{other}");
            assert_eq!(n.subnet_holder(b, q, id(2)), Some(((a, p), id(1))), "{other}");
            assert_eq!(n.subnet_holder(b, q, id(1)), None, "the holder's own");
        }
        let (b, q) = net("192.168.51.0/24");
        assert!(n.bind_subnet(b, q, id(2)), "beside it");
        assert!(n.bind_subnet("fd00:50::".parse().unwrap(), 64, id(4)), "another family");
        assert_eq!(n.subnet_holder("192.168.51.128".parse().unwrap(), 25, id(1)), Some(((b, q), id(2))));
        assert_eq!(n.subnet_holder("192.168.52.0".parse().unwrap(), 24, id(1)), None, "not overlapping");
        assert_eq!(n.subnet_holder("fd00:50::".parse().unwrap(), 48, id(1)).map(|x| x.1), Some(id(4)));
        assert!(!n.bind_subnet("0.0.0.0".parse().unwrap(), 0, id(3)), "an exit's offer");
        // The holder stops announcing it: the prefix is free again.
        assert!(n.release_subnets(id(1), &[]));
        assert!(n.bind_subnet(a, 25, id(2)));
        let back = Names::default().with_subnets(n.subnet_bindings());
        assert_eq!(back.subnet_bindings().collect::<Vec<_>>(), n.subnet_bindings().collect::<Vec<_>>());
    }

    #[test]
    fn the_book_is_bounded() {
        let mut n = Names::default();
        for i in 0..MAX_NAMES + 10 {
            n.bind(&format!("h{i}"), id(1));
        }
        assert_eq!(n.bindings().count(), MAX_NAMES);
        assert_eq!(n.holder("h0"), Some(id(1)));
    }
}
