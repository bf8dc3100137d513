//! Node identity: the node id is derived from the static public key.

use std::fmt;

use ring::digest;

/// A member's static public key: how the engine knows a peer (its sessions, its
/// records, its table entry). Its [`NodeId`] is derived from it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerKey(pub [u8; 32]);

impl PeerKey {
    /// The node id derived from this key.
    pub fn id(&self) -> NodeId {
        NodeId::from_public(&self.0)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerKey({})", self.id())
    }
}

/// A short, stable name for a node: the first 8 bytes of SHA-256 of its public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId([u8; 8]);

impl NodeId {
    /// Derives the id of the node whose static public key is `public`.
    pub fn from_public(public: &[u8; 32]) -> Self {
        let d = digest::digest(&digest::SHA256, public);
        let mut id = [0u8; 8];
        id.copy_from_slice(&d.as_ref()[..8]);
        Self(id)
    }

    /// The raw 8 bytes (as carried in relay headers and records).
    pub fn to_bytes(self) -> [u8; 8] {
        self.0
    }

    /// Rebuilds an id from its 8 bytes.
    pub fn from_bytes(b: [u8; 8]) -> Self {
        Self(b)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for NodeId {
    type Err = String;
    /// Parses the 16 hex digits that [`NodeId`]'s `Display` prints.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid node id {s:?}: expected 16 hex digits");
        if s.len() != 16 || !s.is_ascii() {
            return Err(bad());
        }
        let mut id = [0u8; 8];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(id))
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_is_stable_hex() {
        let id = NodeId::from_public(&[0u8; 32]);
        // SHA-256 of 32 zero bytes begins 66687aadf862bd77.
        assert_eq!(id.to_string(), "66687aadf862bd77");
        assert_ne!(id, NodeId::from_public(&[1u8; 32]));
        assert_eq!("66687aadf862bd77".parse::<NodeId>(), Ok(id));
        assert!("66687aadf862bd7".parse::<NodeId>().is_err());
        assert!("66687aadf862bd7x".parse::<NodeId>().is_err());
        assert!("6668\u{e9}aadf862bd7".parse::<NodeId>().is_err());
    }
}
