//! Who a name belongs to, as this node saw it: ssh's known_hosts model. A host name is
//! bound to the member that claimed it first; a later member with the same name gets
//! the suffixed name in Magic DNS and never `--use-exit-node`'s traffic. Node ids can
//! be ground in seconds, so "the lowest id wins" would hand a copied name to whoever
//! grinds one. The runtime keeps the bindings (and the exit pin) in the state
//! directory ([`crate::Action::SaveNames`]), so they survive restarts.

use std::collections::BTreeMap;

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
        Self { by_name, exit_pin }
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
    fn the_book_is_bounded() {
        let mut n = Names::default();
        for i in 0..MAX_NAMES + 10 {
            n.bind(&format!("h{i}"), id(1));
        }
        assert_eq!(n.bindings().count(), MAX_NAMES);
        assert_eq!(n.holder("h0"), Some(id(1)));
    }
}
