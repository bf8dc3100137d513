//! Invites: the one-line join of a network with an authority.
//!
//! An [`Invite`] is what the authority signs: "whoever shows this may have a member
//! certificate in this network, with these groups, until this time, this many
//! times". A [`Token`] is what the admin hands a new machine: the signed invite plus
//! what the machine needs to reach the network at all (the network secret and entry
//! points), written as one line, `weft-invite:<base64url>`. The new node proves the
//! invite to an issuer (a member holding the authority key) inside an IK handshake;
//! the issuer answers with a certificate or the reason it will not (see
//! [`crate::handshake::Hello::join`]). Only the signed invite leaves the new machine;
//! the secret and the entry points never travel.
//!
//! Invite, format 1 (integers big-endian):
//!
//! ```text
//!   u8 format (1)   [32] authority public key   [32] invite id (random)
//!   u64 expires (unix s)   u32 uses (0: unlimited)   u32 certificate lifetime (s)
//!   u8 len + network name   u8 n + n × (u8 len + group)
//!   [64] Ed25519 signature over "weft invite 1\0" ‖ everything before it
//! ```
//!
//! Token, format 1: `u8 1, u16 len + network secret, u8 n + n × (u8 len + entry
//! point URI), u16 len + invite`.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

use crate::cert::{
    AuthorityId, AuthorityKey, CertError, MAX_CERT_LEN, MAX_GROUPS, Reader, check_format, from_text, put_str, verify,
};

/// The invite and token format this build writes and reads.
pub const INVITE_FORMAT: u8 = 1;
/// Prefix of a token's text form.
pub const INVITE_PREFIX: &str = "weft-invite:";
const INVITE_DOMAIN: &[u8] = b"weft invite 1\0";
/// Longest signed invite (it travels in a hello, like a certificate).
pub const MAX_INVITE_LEN: usize = MAX_CERT_LEN;
/// Most entry points a token carries.
pub const MAX_ENTRY_POINTS: usize = 16;
/// Longest network secret a token carries.
pub const MAX_SECRET: usize = 1024;

/// What an invite grants, before it is signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InviteBody {
    /// The authority that signs it.
    pub authority: AuthorityId,
    /// The invite's id (random): what the issuer counts uses of, and what
    /// `weft authority revoke --invite` revokes.
    pub id: [u8; 32],
    /// Last moment it may be used, unix seconds.
    pub expires: u64,
    /// How many machines may join with it (0: any number until it expires).
    pub uses: u32,
    /// How long the certificates issued for it are valid, seconds.
    pub lifetime: u32,
    /// The network it joins.
    pub network: String,
    /// Groups the issued certificates carry.
    pub groups: Vec<String>,
}

/// A signed invite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invite {
    body: InviteBody,
    signature: [u8; 64],
}

impl InviteBody {
    /// Checks the format's limits and signs with `key` (whose public half must be
    /// `self.authority`).
    pub fn sign(self, key: &AuthorityKey) -> Result<Invite, CertError> {
        if key.id() != self.authority {
            return Err(CertError::Field("authority (not the signing key's)"));
        }
        let bytes = self.encode()?;
        if bytes.len() + 64 > MAX_INVITE_LEN {
            return Err(CertError::TooLarge("invite (over 512 bytes: fewer groups or shorter names)"));
        }
        let signature = key.sign(INVITE_DOMAIN, &bytes);
        Ok(Invite { body: self, signature })
    }

    fn encode(&self) -> Result<Vec<u8>, CertError> {
        let mut b = Vec::with_capacity(128);
        b.push(INVITE_FORMAT);
        b.extend_from_slice(&self.authority.0);
        b.extend_from_slice(&self.id);
        b.extend_from_slice(&self.expires.to_be_bytes());
        b.extend_from_slice(&self.uses.to_be_bytes());
        b.extend_from_slice(&self.lifetime.to_be_bytes());
        put_str(&mut b, &self.network, "network name")?;
        if self.groups.len() > MAX_GROUPS {
            return Err(CertError::TooLarge("groups"));
        }
        b.push(self.groups.len() as u8);
        for g in &self.groups {
            put_str(&mut b, g, "group")?;
        }
        Ok(b)
    }
}

fn u32_of(r: &mut Reader<'_>) -> Result<u32, CertError> {
    let b = r.take(4)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn u16_of(r: &mut Reader<'_>) -> Result<usize, CertError> {
    let b = r.take(2)?;
    Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
}

impl Invite {
    /// What it grants.
    pub fn body(&self) -> &InviteBody {
        &self.body
    }

    /// The encoded invite (body and signature).
    pub fn to_bytes(&self) -> Vec<u8> {
        // A body that signed has encoded once within the limits.
        let mut b = self.body.encode().unwrap_or_default();
        b.extend_from_slice(&self.signature);
        b
    }

    /// Parses an encoded invite (structure only; [`Invite::verify`] checks it).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CertError> {
        if bytes.len() > MAX_INVITE_LEN {
            return Err(CertError::TooLarge("invite (over 512 bytes)"));
        }
        let mut r = Reader(bytes);
        check_format(r.u8()?, INVITE_FORMAT)?;
        let authority = AuthorityId(r.key()?);
        let id = r.key()?;
        let expires = r.u64()?;
        let uses = u32_of(&mut r)?;
        let lifetime = u32_of(&mut r)?;
        let network = r.str("network name")?;
        let n = usize::from(r.u8()?);
        if n > MAX_GROUPS {
            return Err(CertError::TooLarge("groups"));
        }
        let groups = (0..n).map(|_| r.str("group")).collect::<Result<Vec<_>, _>>()?;
        let signature = r.signature()?;
        Ok(Self { body: InviteBody { authority, id, expires, uses, lifetime, network, groups }, signature })
    }

    /// Whether one of `trusted` signed it.
    pub fn verify(&self, trusted: &[AuthorityId]) -> bool {
        trusted.contains(&self.body.authority)
            && self.body.encode().is_ok_and(|b| verify(&self.body.authority, INVITE_DOMAIN, &b, &self.signature))
    }
}

/// What a new machine is given: the signed invite and how to reach the network.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The network secret.
    pub secret: String,
    /// Entry points (peer URIs, `udp://host:port` and the like); the join itself
    /// speaks to those over UDP.
    pub entry_points: Vec<String>,
    /// The signed invite.
    pub invite: Invite,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("entry_points", &self.entry_points)
            .field("invite", &self.invite)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// The encoded token.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CertError> {
        let mut b = vec![INVITE_FORMAT];
        if self.secret.len() > MAX_SECRET {
            return Err(CertError::TooLarge("network secret"));
        }
        b.extend_from_slice(&(self.secret.len() as u16).to_be_bytes());
        b.extend_from_slice(self.secret.as_bytes());
        if self.entry_points.len() > MAX_ENTRY_POINTS {
            return Err(CertError::TooLarge("entry points"));
        }
        b.push(self.entry_points.len() as u8);
        for e in &self.entry_points {
            put_str(&mut b, e, "entry point")?;
        }
        let inv = self.invite.to_bytes();
        b.extend_from_slice(&(inv.len() as u16).to_be_bytes());
        b.extend_from_slice(&inv);
        Ok(b)
    }

    /// Parses an encoded token.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CertError> {
        let mut r = Reader(bytes);
        check_format(r.u8()?, INVITE_FORMAT)?;
        let n = u16_of(&mut r)?;
        if n > MAX_SECRET {
            return Err(CertError::TooLarge("network secret"));
        }
        let secret = String::from_utf8(r.take(n)?.to_vec()).map_err(|_| CertError::Field("network secret"))?;
        let n = usize::from(r.u8()?);
        if n > MAX_ENTRY_POINTS {
            return Err(CertError::TooLarge("entry points"));
        }
        let entry_points = (0..n).map(|_| r.str("entry point")).collect::<Result<Vec<_>, _>>()?;
        let n = u16_of(&mut r)?;
        let invite = Invite::from_bytes(r.take(n)?)?;
        if !r.0.is_empty() {
            return Err(CertError::Trailing(r.0.len()));
        }
        Ok(Self { secret, entry_points, invite })
    }

    /// The one-line text form, `weft-invite:<base64url>`.
    pub fn to_text(&self) -> Result<String, CertError> {
        Ok(format!("{INVITE_PREFIX}{}", B64.encode(self.to_bytes()?)))
    }

    /// Parses the text form (surrounding white space ignored).
    pub fn from_text(text: &str) -> Result<Self, CertError> {
        Self::from_bytes(&from_text(text, INVITE_PREFIX)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AuthorityKey {
        AuthorityKey::from_seed([3; 32])
    }

    fn body(k: &AuthorityKey) -> InviteBody {
        InviteBody {
            authority: k.id(),
            id: [9; 32],
            expires: 1_800_000_000,
            uses: 1,
            lifetime: 90 * 86_400,
            network: "corp".into(),
            groups: vec!["dev".into(), "laptops".into()],
        }
    }

    #[test]
    fn a_token_round_trips_and_its_invite_verifies_only_under_its_authority() {
        let k = key();
        let invite = body(&k).sign(&k).unwrap();
        let token = Token {
            secret: "a long network secret".into(),
            entry_points: vec!["udp://198.51.100.7:11010".into(), "tcp://[2001:db8::1]:11010".into()],
            invite: invite.clone(),
        };
        let text = token.to_text().unwrap();
        assert!(text.starts_with(INVITE_PREFIX));
        let back = Token::from_text(&format!("  {text}\n")).unwrap();
        assert_eq!(back, token);
        assert!(back.invite.verify(&[k.id()]));
        assert!(!back.invite.verify(&[AuthorityKey::from_seed([4; 32]).id()]));
        assert_eq!(Invite::from_bytes(&invite.to_bytes()).unwrap(), invite);
        // The secret never shows in a debug print.
        assert!(!format!("{token:?}").contains("long network secret"));
    }

    #[test]
    fn a_changed_invite_does_not_verify() {
        let k = key();
        let mut bytes = body(&k).sign(&k).unwrap().to_bytes();
        // The uses field: 1 -> 2.
        bytes[1 + 32 + 32 + 8 + 3] = 2;
        let forged = Invite::from_bytes(&bytes).unwrap();
        assert_eq!(forged.body().uses, 2);
        assert!(!forged.verify(&[k.id()]));
    }

    #[test]
    fn malformed_tokens_are_errors_never_panics() {
        let k = key();
        let token =
            Token { secret: "s".into(), entry_points: vec!["udp://a:1".into()], invite: body(&k).sign(&k).unwrap() };
        let bytes = token.to_bytes().unwrap();
        for n in 0..bytes.len() {
            assert!(Token::from_bytes(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Token::from_bytes(&longer), Err(CertError::Trailing(1)));
        let mut newer = bytes;
        newer[0] = 2;
        assert!(matches!(Token::from_bytes(&newer), Err(CertError::Newer(2, 1))));
        assert_eq!(Token::from_text("weft-cert:AAAA"), Err(CertError::Prefix(INVITE_PREFIX)));
        assert_eq!(Token::from_text("weft-invite:@@"), Err(CertError::Base64));
        let many = InviteBody { groups: vec!["g".repeat(200); 3], ..body(&k) };
        assert!(many.sign(&k).is_err(), "over 512 bytes is not signed");
    }
}
