//! The closed sets of values status reports: a peer's state and path, the exit's state,
//! the kind of a failed or refused handshake, the port-mapping protocol. Each serializes as the `snake_case`
//! string scripts already match; a value a newer node sends that this build does not
//! know reads as the catch-all variant instead of failing the whole reply, so an older
//! GUI or `weft status` keeps working against a newer node.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Writes `as_str` for `Display` (log lines, metric labels, the text status).
macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}

/// The state of a peer's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    /// Handshaking, or waiting for the peer to confirm.
    Connecting,
    /// The last session died or failed; retrying.
    Down,
    /// A confirmed session carries traffic.
    Established,
    /// A member reachable without a session: one is made when traffic wants it.
    Idle,
    /// A state this build does not know (a newer node's).
    #[serde(other)]
    Unknown,
}

impl PeerState {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Down => "down",
            Self::Established => "established",
            Self::Idle => "idle",
            Self::Unknown => "unknown",
        }
    }
}

/// How traffic reaches a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    /// Straight to its endpoint.
    Direct,
    /// Through one or more relays.
    Relay,
    /// No usable path right now.
    None,
    /// A path this build does not know (a newer node's).
    #[serde(other)]
    Unknown,
}

impl PathKind {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Relay => "relay",
            Self::None => "none",
            Self::Unknown => "unknown",
        }
    }
}

/// What became of the exit node `--use-exit-node` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitState {
    /// The default route goes to it.
    Routing,
    /// It offers itself as an exit, but there is no route to it now.
    Unreachable,
    /// A member by that name exists but offers no exit.
    NotOffered,
    /// No member of the mesh has that name or id.
    UnknownMember,
    /// The member it was pinned to is gone and another one matches: traffic fails
    /// closed until `weft exit accept`.
    Changed,
    /// A state this build does not know (a newer node's).
    #[serde(other)]
    Unknown,
}

impl ExitState {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Routing => "routing",
            Self::Unreachable => "unreachable",
            Self::NotOffered => "not_offered",
            Self::UnknownMember => "unknown_member",
            Self::Changed => "changed",
            Self::Unknown => "unknown",
        }
    }
}

/// Why a handshake failed or was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The response did not decrypt or parse.
    BadResponse,
    /// The other end sent a reject.
    Rejected,
    /// We refused the other end's handshake (bad hello, wrong network).
    Refused,
    /// The hello claims an overlay address another member holds.
    AddressTaken,
    /// The hello claims an overlay address outside our overlay network.
    AddressOutsideOverlay,
    /// No response before the handshake's deadline.
    NoResponse,
    /// The session was never confirmed by a first data packet.
    NotConfirmed,
    /// The endpoint could not be reached (a connection failed).
    Unreachable,
    /// No path to the peer, direct or relayed.
    NoPath,
    /// The two nodes' protocol versions do not overlap (one is too old for the other).
    IncompatibleVersion,
    /// In a network with an authority: the peer has no member certificate.
    NoCertificate,
    /// Its certificate is unreadable, signed by another authority, for another
    /// network or key, not valid now, or revoked.
    CertificateRefused,
    /// It claims an address, name or IPv6 address its certificate does not grant.
    BeyondCertificate,
    /// It presents a certificate but this node has no authority: the peer's network
    /// has one this node is not set up for.
    AuthorityRequired,
    /// A kind this build does not know (a newer node's, or an older node that did not
    /// say).
    #[default]
    #[serde(other)]
    Other,
}

impl FailureKind {
    /// Every kind this build reports.
    pub const ALL: [Self; 14] = [
        Self::BadResponse,
        Self::Rejected,
        Self::Refused,
        Self::AddressTaken,
        Self::AddressOutsideOverlay,
        Self::NoResponse,
        Self::NotConfirmed,
        Self::Unreachable,
        Self::NoPath,
        Self::IncompatibleVersion,
        Self::NoCertificate,
        Self::CertificateRefused,
        Self::BeyondCertificate,
        Self::AuthorityRequired,
    ];

    /// The JSON spelling (also the metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadResponse => "bad_response",
            Self::Rejected => "rejected",
            Self::Refused => "refused",
            Self::AddressTaken => "address_taken",
            Self::AddressOutsideOverlay => "address_outside_overlay",
            Self::NoResponse => "no_response",
            Self::NotConfirmed => "not_confirmed",
            Self::Unreachable => "unreachable",
            Self::NoPath => "no_path",
            Self::IncompatibleVersion => "incompatible_version",
            Self::NoCertificate => "no_certificate",
            Self::CertificateRefused => "certificate_refused",
            Self::BeyondCertificate => "beyond_certificate",
            Self::AuthorityRequired => "authority_required",
            Self::Other => "other",
        }
    }
}

/// The port-mapping protocol a node's router answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortMapProtocol {
    /// NAT-PMP (RFC 6886).
    NatPmp,
    /// PCP (RFC 6887).
    Pcp,
    /// UPnP Internet Gateway Device.
    Upnp,
    /// A protocol this build does not know (a newer node's).
    #[serde(other)]
    Unknown,
}

impl PortMapProtocol {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NatPmp => "nat_pmp",
            Self::Pcp => "pcp",
            Self::Upnp => "upnp",
            Self::Unknown => "unknown",
        }
    }
}

display_as_str!(PeerState, PathKind, ExitState, FailureKind, PortMapProtocol);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_and_write_their_snake_case_names_and_tolerate_new_ones() {
        for k in FailureKind::ALL {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(serde_json::from_str::<FailureKind>(&json).unwrap(), k);
        }
        assert_eq!(serde_json::from_str::<FailureKind>("\"certificate_revoked\"").unwrap(), FailureKind::Other);
        assert_eq!(serde_json::from_str::<PeerState>("\"established\"").unwrap(), PeerState::Established);
        assert_eq!(serde_json::from_str::<PeerState>("\"quarantined\"").unwrap(), PeerState::Unknown);
        assert_eq!(serde_json::from_str::<PathKind>("\"relay\"").unwrap(), PathKind::Relay);
        assert_eq!(serde_json::from_str::<ExitState>("\"not_offered\"").unwrap(), ExitState::NotOffered);
        assert_eq!(ExitState::UnknownMember.to_string(), "unknown_member");
        // As map keys (handshake_failures), the same names.
        let m: std::collections::BTreeMap<FailureKind, u64> =
            serde_json::from_str(r#"{"no_path": 2, "from_the_future": 1}"#).unwrap();
        assert_eq!(m.get(&FailureKind::NoPath), Some(&2));
        assert_eq!(m.get(&FailureKind::Other), Some(&1));
    }
}
