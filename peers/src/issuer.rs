//! Issuing member certificates to machines that bring an invite: what a member with
//! `--authority-key` does when an IK init's hello carries one
//! ([`weft_core::handshake::Hello::join`]).
//!
//! The new machine proved the network secret (the init's MAC and PSK) and its node
//! key (the init's `ss`); the invite says what it may have. The issuer (whose own
//! certificate carries the issuer mark) checks the invite (signed by a trusted
//! authority, for this network, not expired, not revoked, not used up), picks an
//! address and a host name that neither its ledger nor any certificate it has seen
//! gives another key (nor a member it sees holds), signs a certificate and answers
//! the init with it, or with the reason it will not. No session is made: the new
//! machine starts again as a member with its certificate. Each issue is kept in a
//! ledger (in the state directory, [`Action::SaveIssued`]): a machine asking again
//! (its answer was lost) gets the same address and name without using the invite
//! again, but only while the invite is valid (not expired, not revoked).

use std::net::Ipv4Addr;

use weft_core::cert::AuthorityKey;

/// One certificate an issuer issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The invite it was issued for.
    pub invite: [u8; 32],
    /// The node key it was issued to.
    pub node: [u8; 32],
    /// The address it grants.
    pub ipv4: Ipv4Addr,
    /// The host name it grants.
    pub name: String,
    /// When, unix seconds.
    pub at: u64,
}

/// A member that issues certificates: the authority key and what it issued.
#[derive(Debug)]
pub(crate) struct Issuer {
    pub(crate) key: AuthorityKey,
    pub(crate) ledger: Vec<Issued>,
}

/// Certificates one issuer keeps in its ledger, at most.
pub(crate) const MAX_LEDGER: usize = 65_536;
