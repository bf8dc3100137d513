//! Membership signed by an authority: member certificates and revocations.
//!
//! An authority is an Ed25519 key pair the network's admin keeps. A [`Certificate`]
//! binds a node's static X25519 key (what its handshakes prove) to what it may claim
//! in one network: a host name, overlay addresses, groups, proxied subnets, whether it
//! may be an exit or a WireGuard portal, and a validity period. A [`Revocation`] says
//! the authority no longer admits a node key. Both are compact, versioned binary
//! values signed by the authority, written as one line of text (`weft-cert:…`,
//! `weft-revocation:…`, base64url). This module encodes, signs, parses and checks
//! them; deciding what a node may do with a checked certificate is the control
//! plane's business (`weft-peers`).
//!
//! Certificate, format 2 (every integer big-endian):
//!
//! ```text
//!   u8  format (2)          [32] authority public key   [32] node static key
//!   u64 not_before (unix s) u64  not_after (unix s)     u64  issued (unix s)
//!   u8  flags (1 exit, 2 portal, 4 issuer)
//!   u8 len + network name (empty: any network of this authority)
//!   u8 len + host name      [4] IPv4 + u8 prefix
//!   u8 has_ipv6 (0|1) [+ [16] IPv6 + u8 prefix]
//!   u8 n + n × (u8 len + group)
//!   u8 n + n × (u8 family 4|6 + [4|16] address + u8 prefix)     proxied subnets
//!   [64] Ed25519 signature over "weft certificate 1\0" ‖ everything before it
//! ```
//!
//! Format 1 (releases up to 0.3) is the same without `issued` and without the issuer
//! flag; it is still read, as issued at its `not_before`, and written back as it came
//! (a node whose certificate is of format 1 presents format 1, which every release
//! reads). The issue time orders an authority's certificates for one key: a node
//! refuses one older than the newest it has seen, so a member re-certified with
//! fewer rights cannot restart with its older certificate.
//!
//! Revocation, format 1: `u8 1, [32] authority, [32] node static key, u64 issued
//! (unix s), [64] signature over "weft revocation 1\0" ‖ everything before it`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

/// The certificate format this build writes (it reads this one and format 1).
pub const CERT_FORMAT: u8 = 2;
/// The first certificate format: no issue time, no issuer flag.
const CERT_FORMAT_1: u8 = 1;
/// The revocation format this build writes and reads.
pub const REVOCATION_FORMAT: u8 = 1;
/// Text prefix of an authority's public key.
pub const AUTHORITY_PREFIX: &str = "weft-authority:";
/// Text prefix of a certificate.
pub const CERT_PREFIX: &str = "weft-cert:";
/// Text prefix of a revocation.
pub const REVOCATION_PREFIX: &str = "weft-revocation:";

const CERT_DOMAIN: &[u8] = b"weft certificate 1\0";
const REVOCATION_DOMAIN: &[u8] = b"weft revocation 1\0";
const FLAG_EXIT: u8 = 1;
const FLAG_PORTAL: u8 = 2;
const FLAG_ISSUER: u8 = 4;

/// Most groups a certificate carries.
pub const MAX_GROUPS: usize = 32;
/// Most proxied subnets a certificate grants.
pub const MAX_SUBNETS: usize = 64;
/// Longest network name, host name or group, in bytes.
pub const MAX_NAME: usize = 255;
/// Longest encoded certificate (what a hello and a record carry): a certificate that
/// would be longer is not issued, and a longer one is not read.
pub const MAX_CERT_LEN: usize = 512;

/// Why bytes or text are not a certificate, a revocation or an authority key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The text does not begin with the expected prefix.
    #[error("expected text beginning {0:?}")]
    Prefix(&'static str),
    /// The text after the prefix is not base64url.
    #[error("not base64url after the prefix")]
    Base64,
    /// The value ends before its last field.
    #[error("truncated")]
    Truncated,
    /// Bytes follow the signature.
    #[error("{0} bytes after the signature")]
    Trailing(usize),
    /// A format newer than this build reads (a newer weft's).
    #[error("format {0}, newer than this build reads ({1}): upgrade weft")]
    Newer(u8, u8),
    /// A format number no release wrote.
    #[error("format {0}, which no release of weft writes")]
    Format(u8),
    /// A field that does not parse (named).
    #[error("bad {0}")]
    Field(&'static str),
    /// A value over a limit (named).
    #[error("too many or too long: {0}")]
    TooLarge(&'static str),
}

/// Why a well-formed certificate does not admit a node here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CertRefusal {
    /// Signed by an authority this network does not trust.
    #[error("signed by an authority this network does not trust")]
    UnknownAuthority,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// Issued for another network.
    #[error("issued for another network")]
    WrongNetwork,
    /// Issued to another node key than the one the handshake proved.
    #[error("issued to another node key")]
    WrongNode,
    /// Its validity has not begun.
    #[error("not valid yet")]
    NotYetValid,
    /// Its validity has ended.
    #[error("expired")]
    Expired,
    /// The authority revoked this node key.
    #[error("revoked")]
    Revoked,
}

/// An authority's public key: what members trust (`--authority`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AuthorityId(pub [u8; 32]);

impl fmt::Display for AuthorityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{AUTHORITY_PREFIX}{}", B64.encode(self.0))
    }
}

impl fmt::Debug for AuthorityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for AuthorityId {
    type Err = CertError;

    fn from_str(s: &str) -> Result<Self, CertError> {
        let bytes = from_text(s, AUTHORITY_PREFIX)?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| CertError::Field("authority key length"))?;
        // Only a valid curve point can ever verify: refuse the others now, by name.
        ed25519_dalek::VerifyingKey::from_bytes(&key).map_err(|_| CertError::Field("authority key"))?;
        Ok(Self(key))
    }
}

/// An authority's private key (kept by the admin; a node holds it only to issue).
pub struct AuthorityKey {
    seed: [u8; 32],
    public: AuthorityId,
}

impl fmt::Debug for AuthorityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthorityKey").field("public", &self.public).finish_non_exhaustive()
    }
}

impl AuthorityKey {
    /// Rebuilds the key from its Ed25519 seed (as stored in its file).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key().to_bytes();
        Self { seed, public: AuthorityId(public) }
    }

    /// The seed, for writing the key file.
    pub fn seed_bytes(&self) -> &[u8; 32] {
        &self.seed
    }

    /// The public half.
    pub fn id(&self) -> AuthorityId {
        self.public
    }

    pub(crate) fn sign(&self, domain: &[u8], body: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        let mut msg = Vec::with_capacity(domain.len() + body.len());
        msg.extend_from_slice(domain);
        msg.extend_from_slice(body);
        ed25519_dalek::SigningKey::from_bytes(&self.seed).sign(&msg).to_bytes()
    }
}

pub(crate) fn verify(authority: &AuthorityId, domain: &[u8], body: &[u8], sig: &[u8; 64]) -> bool {
    let Ok(vk) = ed25519_dalek::VerifyingKey::from_bytes(&authority.0) else { return false };
    let mut msg = Vec::with_capacity(domain.len() + body.len());
    msg.extend_from_slice(domain);
    msg.extend_from_slice(body);
    vk.verify_strict(&msg, &ed25519_dalek::Signature::from_bytes(sig)).is_ok()
}

/// An address prefix a certificate grants (a proxied subnet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    /// The network address (host bits zero).
    pub addr: IpAddr,
    /// Its length in bits.
    pub len: u8,
}

impl Prefix {
    /// Whether `other` lies inside this prefix (same family, at least as long).
    pub fn covers(&self, other: &Self) -> bool {
        match (self.addr, other.addr) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                other.len >= self.len && mask4(u32::from(a), self.len) == mask4(u32::from(b), self.len)
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                other.len >= self.len && mask6(u128::from(a), self.len) == mask6(u128::from(b), self.len)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

fn mask4(a: u32, len: u8) -> u32 {
    if len == 0 { 0 } else { a & (u32::MAX << (32 - u32::from(len))) }
}

fn mask6(a: u128, len: u8) -> u128 {
    if len == 0 { 0 } else { a & (u128::MAX << (128 - u32::from(len))) }
}

/// What a certificate says, before it is signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertBody {
    /// The authority that signs it.
    pub authority: AuthorityId,
    /// The node's static X25519 public key.
    pub node: [u8; 32],
    /// The network it is valid in; empty: any network that trusts this authority.
    pub network: String,
    /// The node's host name.
    pub name: String,
    /// The node's IPv4 overlay address and the network's prefix length.
    pub ipv4: (Ipv4Addr, u8),
    /// The node's IPv6 overlay address and prefix length, when granted.
    pub ipv6: Option<(Ipv6Addr, u8)>,
    /// Groups (tags) for access policy.
    pub groups: Vec<String>,
    /// Subnets the node may proxy into the mesh.
    pub subnets: Vec<Prefix>,
    /// Whether it may offer itself as an exit node.
    pub exit: bool,
    /// Whether it may run a WireGuard portal.
    pub portal: bool,
    /// Start of validity, unix seconds.
    pub not_before: u64,
    /// End of validity, unix seconds.
    pub not_after: u64,
    /// When the authority signed it, unix seconds; `None`: a certificate of format 1,
    /// which has no issue time (it counts as issued at `not_before`).
    pub issued: Option<u64>,
    /// Whether the member may issue certificates to machines with an invite (holds
    /// the authority key): joiners hand their invite only to a member marked so.
    /// Format 2 only.
    pub issuer: bool,
}

/// A signed certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    body: CertBody,
    signature: [u8; 64],
}

impl CertBody {
    /// Checks the limits the format holds and signs with `key` (whose public half
    /// must be `self.authority`).
    pub fn sign(self, key: &AuthorityKey) -> Result<Certificate, CertError> {
        if key.id() != self.authority {
            return Err(CertError::Field("authority (not the signing key's)"));
        }
        let bytes = self.encode()?;
        if bytes.len() + 64 > MAX_CERT_LEN {
            return Err(CertError::TooLarge("certificate (over 512 bytes: fewer groups or subnets, or shorter names)"));
        }
        let signature = key.sign(CERT_DOMAIN, &bytes);
        Ok(Certificate { body: self, signature })
    }

    fn encode(&self) -> Result<Vec<u8>, CertError> {
        let mut b = Vec::with_capacity(168);
        b.push(if self.issued.is_some() { CERT_FORMAT } else { CERT_FORMAT_1 });
        b.extend_from_slice(&self.authority.0);
        b.extend_from_slice(&self.node);
        b.extend_from_slice(&self.not_before.to_be_bytes());
        b.extend_from_slice(&self.not_after.to_be_bytes());
        match self.issued {
            Some(t) => b.extend_from_slice(&t.to_be_bytes()),
            None if self.issuer => return Err(CertError::Field("issuer mark (format 2 only: give an issue time)")),
            None => {}
        }
        b.push(
            (u8::from(self.exit) * FLAG_EXIT)
                | (u8::from(self.portal) * FLAG_PORTAL)
                | (u8::from(self.issuer) * FLAG_ISSUER),
        );
        put_str(&mut b, &self.network, "network name")?;
        put_str(&mut b, &self.name, "host name")?;
        if self.ipv4.1 > 32 {
            return Err(CertError::Field("IPv4 prefix"));
        }
        b.extend_from_slice(&self.ipv4.0.octets());
        b.push(self.ipv4.1);
        match self.ipv6 {
            None => b.push(0),
            Some((a, p)) => {
                if p > 128 {
                    return Err(CertError::Field("IPv6 prefix"));
                }
                b.push(1);
                b.extend_from_slice(&a.octets());
                b.push(p);
            }
        }
        if self.groups.len() > MAX_GROUPS {
            return Err(CertError::TooLarge("groups"));
        }
        b.push(self.groups.len() as u8);
        for g in &self.groups {
            put_str(&mut b, g, "group")?;
        }
        if self.subnets.len() > MAX_SUBNETS {
            return Err(CertError::TooLarge("subnets"));
        }
        b.push(self.subnets.len() as u8);
        for s in &self.subnets {
            match s.addr {
                IpAddr::V4(a) if s.len <= 32 => {
                    b.push(4);
                    b.extend_from_slice(&a.octets());
                }
                IpAddr::V6(a) if s.len <= 128 => {
                    b.push(6);
                    b.extend_from_slice(&a.octets());
                }
                _ => return Err(CertError::Field("subnet prefix")),
            }
            b.push(s.len);
        }
        Ok(b)
    }
}

pub(crate) fn put_str(b: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), CertError> {
    if s.len() > MAX_NAME {
        return Err(CertError::TooLarge(what));
    }
    b.push(s.len() as u8);
    b.extend_from_slice(s.as_bytes());
    Ok(())
}

/// A reader over a value's bytes that names what ran short.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], CertError> {
        if self.0.len() < n {
            return Err(CertError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, CertError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u64(&mut self) -> Result<u64, CertError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(b))
    }

    pub(crate) fn key(&mut self) -> Result<[u8; 32], CertError> {
        let mut b = [0u8; 32];
        b.copy_from_slice(self.take(32)?);
        Ok(b)
    }

    pub(crate) fn str(&mut self, what: &'static str) -> Result<String, CertError> {
        let n = usize::from(self.u8()?);
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| CertError::Field(what))
    }

    pub(crate) fn signature(&mut self) -> Result<[u8; 64], CertError> {
        let mut b = [0u8; 64];
        b.copy_from_slice(self.take(64)?);
        if !self.0.is_empty() {
            return Err(CertError::Trailing(self.0.len()));
        }
        Ok(b)
    }
}

impl Certificate {
    /// What it says.
    pub fn body(&self) -> &CertBody {
        &self.body
    }

    /// The encoded certificate (body and signature).
    pub fn to_bytes(&self) -> Vec<u8> {
        // A body that signed has encoded once within the limits.
        let mut b = self.body.encode().unwrap_or_default();
        b.extend_from_slice(&self.signature);
        b
    }

    /// Parses an encoded certificate. Checks its structure only: [`Certificate::check`]
    /// checks the signature and what it is valid for.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CertError> {
        if bytes.len() > MAX_CERT_LEN {
            return Err(CertError::TooLarge("certificate (over 512 bytes)"));
        }
        let mut r = Reader(bytes);
        let format = r.u8()?;
        if format != CERT_FORMAT_1 {
            check_format(format, CERT_FORMAT)?;
        }
        let authority = AuthorityId(r.key()?);
        let node = r.key()?;
        let not_before = r.u64()?;
        let not_after = r.u64()?;
        let issued = if format == CERT_FORMAT_1 { None } else { Some(r.u64()?) };
        let flags = r.u8()?;
        let known =
            if format == CERT_FORMAT_1 { FLAG_EXIT | FLAG_PORTAL } else { FLAG_EXIT | FLAG_PORTAL | FLAG_ISSUER };
        if flags & !known != 0 {
            return Err(CertError::Field("flags"));
        }
        let network = r.str("network name")?;
        let name = r.str("host name")?;
        let v4 = r.take(4)?;
        let ipv4 = (Ipv4Addr::new(v4[0], v4[1], v4[2], v4[3]), r.u8()?);
        if ipv4.1 > 32 {
            return Err(CertError::Field("IPv4 prefix"));
        }
        let ipv6 = match r.u8()? {
            0 => None,
            1 => {
                let a: [u8; 16] = r.take(16)?.try_into().map_err(|_| CertError::Truncated)?;
                let p = r.u8()?;
                if p > 128 {
                    return Err(CertError::Field("IPv6 prefix"));
                }
                Some((Ipv6Addr::from(a), p))
            }
            _ => return Err(CertError::Field("IPv6 presence")),
        };
        let n = usize::from(r.u8()?);
        if n > MAX_GROUPS {
            return Err(CertError::TooLarge("groups"));
        }
        let groups = (0..n).map(|_| r.str("group")).collect::<Result<Vec<_>, _>>()?;
        let n = usize::from(r.u8()?);
        if n > MAX_SUBNETS {
            return Err(CertError::TooLarge("subnets"));
        }
        let mut subnets = Vec::with_capacity(n);
        for _ in 0..n {
            let (addr, max) = match r.u8()? {
                4 => {
                    let a: [u8; 4] = r.take(4)?.try_into().map_err(|_| CertError::Truncated)?;
                    (IpAddr::from(a), 32)
                }
                6 => {
                    let a: [u8; 16] = r.take(16)?.try_into().map_err(|_| CertError::Truncated)?;
                    (IpAddr::from(a), 128)
                }
                _ => return Err(CertError::Field("subnet family")),
            };
            let len = r.u8()?;
            if len > max {
                return Err(CertError::Field("subnet prefix"));
            }
            subnets.push(Prefix { addr, len });
        }
        let signature = r.signature()?;
        let body = CertBody {
            authority,
            node,
            network,
            name,
            ipv4,
            ipv6,
            groups,
            subnets,
            exit: flags & FLAG_EXIT != 0,
            portal: flags & FLAG_PORTAL != 0,
            not_before,
            not_after,
            issued,
            issuer: flags & FLAG_ISSUER != 0,
        };
        Ok(Self { body, signature })
    }

    /// When the authority issued it, unix seconds (a format-1 certificate: its
    /// `not_before`). Of two certificates for one key, the later issued wins.
    pub fn issued(&self) -> u64 {
        self.body.issued.unwrap_or(self.body.not_before)
    }

    /// The one-line text form, `weft-cert:<base64url>`.
    pub fn to_text(&self) -> String {
        format!("{CERT_PREFIX}{}", B64.encode(self.to_bytes()))
    }

    /// Parses the text form (surrounding white space ignored).
    pub fn from_text(text: &str) -> Result<Self, CertError> {
        Self::from_bytes(&from_text(text, CERT_PREFIX)?)
    }

    /// Whether the authority it names signed it (whoever trusts that authority).
    pub fn signed_by_its_authority(&self) -> bool {
        self.body.encode().is_ok_and(|bytes| verify(&self.body.authority, CERT_DOMAIN, &bytes, &self.signature))
    }

    /// Whether this certificate admits the node whose handshake proved `node` into
    /// `network` at `now` (unix seconds), signed by one of `trusted`.
    pub fn check(&self, trusted: &[AuthorityId], network: &str, node: &[u8; 32], now: u64) -> Result<(), CertRefusal> {
        let b = &self.body;
        if !trusted.contains(&b.authority) {
            return Err(CertRefusal::UnknownAuthority);
        }
        if !self.signed_by_its_authority() {
            return Err(CertRefusal::BadSignature);
        }
        if !b.network.is_empty() && b.network != network {
            return Err(CertRefusal::WrongNetwork);
        }
        if b.node != *node {
            return Err(CertRefusal::WrongNode);
        }
        if now < b.not_before {
            return Err(CertRefusal::NotYetValid);
        }
        if now >= b.not_after {
            return Err(CertRefusal::Expired);
        }
        Ok(())
    }
}

/// A signed revocation of one node key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// The authority that revokes.
    pub authority: AuthorityId,
    /// The revoked node's static X25519 public key.
    pub node: [u8; 32],
    /// When it was made, unix seconds.
    pub issued: u64,
    signature: [u8; 64],
}

impl Revocation {
    /// Makes and signs a revocation of `node`.
    pub fn issue(key: &AuthorityKey, node: [u8; 32], issued: u64) -> Self {
        let mut r = Self { authority: key.id(), node, issued, signature: [0; 64] };
        r.signature = key.sign(REVOCATION_DOMAIN, &r.body());
        r
    }

    fn body(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(73);
        b.push(REVOCATION_FORMAT);
        b.extend_from_slice(&self.authority.0);
        b.extend_from_slice(&self.node);
        b.extend_from_slice(&self.issued.to_be_bytes());
        b
    }

    /// The encoded revocation.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = self.body();
        b.extend_from_slice(&self.signature);
        b
    }

    /// Parses an encoded revocation (structure only; [`Revocation::verify`] checks it).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CertError> {
        let mut r = Reader(bytes);
        let format = r.u8()?;
        check_format(format, REVOCATION_FORMAT)?;
        let authority = AuthorityId(r.key()?);
        let node = r.key()?;
        let issued = r.u64()?;
        let signature = r.signature()?;
        Ok(Self { authority, node, issued, signature })
    }

    /// The one-line text form, `weft-revocation:<base64url>`.
    pub fn to_text(&self) -> String {
        format!("{REVOCATION_PREFIX}{}", B64.encode(self.to_bytes()))
    }

    /// Parses the text form (surrounding white space ignored).
    pub fn from_text(text: &str) -> Result<Self, CertError> {
        Self::from_bytes(&from_text(text, REVOCATION_PREFIX)?)
    }

    /// Whether one of `trusted` signed it.
    pub fn verify(&self, trusted: &[AuthorityId]) -> bool {
        trusted.contains(&self.authority) && verify(&self.authority, REVOCATION_DOMAIN, &self.body(), &self.signature)
    }
}

pub(crate) fn check_format(format: u8, ours: u8) -> Result<(), CertError> {
    match format {
        f if f == ours => Ok(()),
        f if f > ours => Err(CertError::Newer(f, ours)),
        f => Err(CertError::Format(f)),
    }
}

pub(crate) fn from_text(text: &str, prefix: &'static str) -> Result<Vec<u8>, CertError> {
    let rest = text.trim().strip_prefix(prefix).ok_or(CertError::Prefix(prefix))?;
    B64.decode(rest).map_err(|_| CertError::Base64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authority() -> AuthorityKey {
        AuthorityKey::from_seed([7; 32])
    }

    fn body(key: &AuthorityKey) -> CertBody {
        CertBody {
            authority: key.id(),
            node: [9; 32],
            network: "office".into(),
            name: "build-01".into(),
            ipv4: (Ipv4Addr::new(10, 126, 0, 5), 24),
            ipv6: Some(("fd00::5".parse().unwrap(), 64)),
            groups: vec!["dev".into(), "ci".into()],
            subnets: vec![Prefix { addr: "192.168.50.0".parse().unwrap(), len: 24 }],
            exit: true,
            portal: false,
            not_before: 1_800_000_000,
            not_after: 1_800_000_000 + 90 * 86_400,
            issued: Some(1_800_000_007),
            issuer: false,
        }
    }

    #[test]
    fn a_certificate_encodes_to_its_vector_and_back() {
        let key = authority();
        let cert = body(&key).sign(&key).unwrap();
        let bytes = cert.to_bytes();
        // The fields in order, then the (deterministic) Ed25519 signature.
        let mut want = vec![2u8];
        want.extend_from_slice(&key.id().0);
        want.extend_from_slice(&[9; 32]);
        want.extend_from_slice(&1_800_000_000u64.to_be_bytes());
        want.extend_from_slice(&1_807_776_000u64.to_be_bytes());
        want.extend_from_slice(&1_800_000_007u64.to_be_bytes());
        want.push(1); // exit
        want.extend_from_slice(b"\x06office\x08build-01");
        want.extend_from_slice(&[10, 126, 0, 5, 24]);
        want.push(1);
        want.extend_from_slice(&"fd00::5".parse::<Ipv6Addr>().unwrap().octets());
        want.push(64);
        want.extend_from_slice(b"\x02\x03dev\x02ci");
        want.extend_from_slice(&[1, 4, 192, 168, 50, 0, 24]);
        assert_eq!(&bytes[..bytes.len() - 64], &want[..]);
        assert_eq!(bytes.len(), want.len() + 64);
        let text = cert.to_text();
        assert!(text.starts_with("weft-cert:") && !text.contains(char::is_whitespace), "{text}");
        assert_eq!(Certificate::from_text(&format!("  {text}\n")).unwrap(), cert);
        assert_eq!(Certificate::from_bytes(&bytes).unwrap(), cert);
        // The authority key's text form round-trips.
        assert_eq!(key.id().to_string().parse::<AuthorityId>().unwrap(), key.id());
    }

    #[test]
    fn check_refuses_each_mismatch_by_name() {
        let key = authority();
        let cert = body(&key).sign(&key).unwrap();
        let trusted = [key.id()];
        let now = 1_800_000_100;
        assert_eq!(cert.check(&trusted, "office", &[9; 32], now), Ok(()));
        let other = AuthorityKey::from_seed([8; 32]);
        assert_eq!(cert.check(&[other.id()], "office", &[9; 32], now), Err(CertRefusal::UnknownAuthority));
        // A second trusted key (a rollover) admits as well.
        assert_eq!(cert.check(&[other.id(), key.id()], "office", &[9; 32], now), Ok(()));
        assert_eq!(cert.check(&trusted, "lab", &[9; 32], now), Err(CertRefusal::WrongNetwork));
        assert_eq!(cert.check(&trusted, "office", &[1; 32], now), Err(CertRefusal::WrongNode));
        assert_eq!(cert.check(&trusted, "office", &[9; 32], 1_799_999_999), Err(CertRefusal::NotYetValid));
        assert_eq!(cert.check(&trusted, "office", &[9; 32], 1_807_776_000), Err(CertRefusal::Expired));
        // Any change to a signed field breaks the signature.
        let mut bytes = cert.to_bytes();
        let name_at = 1 + 32 + 32 + 8 + 8 + 8 + 1 + 7 + 1;
        bytes[name_at] ^= 1;
        let forged = Certificate::from_bytes(&bytes).unwrap();
        assert_eq!(forged.check(&trusted, "office", &[9; 32], now), Err(CertRefusal::BadSignature));
        // A certificate for any network of its authority.
        let mut any = body(&key);
        any.network.clear();
        let any = any.sign(&key).unwrap();
        assert_eq!(any.check(&trusted, "lab", &[9; 32], now), Ok(()));
        // Signing with a key other than the named authority is refused.
        assert!(body(&key).sign(&other).is_err());
    }

    #[test]
    fn malformed_values_are_refused_never_panic() {
        let key = authority();
        let bytes = body(&key).sign(&key).unwrap().to_bytes();
        for n in 0..bytes.len() {
            assert!(Certificate::from_bytes(&bytes[..n]).is_err(), "a certificate cut at {n} parsed");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Certificate::from_bytes(&long), Err(CertError::Trailing(1)));
        let mut newer = bytes;
        newer[0] = 3;
        assert_eq!(Certificate::from_bytes(&newer), Err(CertError::Newer(3, 2)));
        newer[0] = 0;
        assert_eq!(Certificate::from_bytes(&newer), Err(CertError::Format(0)));
        assert_eq!(Certificate::from_text("weft-revocation:AA"), Err(CertError::Prefix(CERT_PREFIX)));
        assert_eq!(Certificate::from_text("weft-cert:!!"), Err(CertError::Base64));
        assert!("weft-authority:AAAA".parse::<AuthorityId>().is_err());
        let mut b = body(&key);
        b.groups = vec!["g".into(); MAX_GROUPS + 1];
        assert_eq!(b.sign(&key), Err(CertError::TooLarge("groups")));
        // Within every field's limit but longer than a hello carries: not issued.
        let mut b = body(&key);
        b.groups = vec!["g".repeat(40); MAX_GROUPS];
        assert!(matches!(b.sign(&key), Err(CertError::TooLarge(w)) if w.starts_with("certificate")));
        assert!(Certificate::from_bytes(&vec![1; MAX_CERT_LEN + 1]).is_err());
        let mut b = body(&key);
        b.ipv4.1 = 33;
        assert!(b.sign(&key).is_err());
    }

    #[test]
    fn format_1_certificates_are_still_read_as_issued_at_not_before_and_kept_as_they_came() {
        let key = authority();
        let mut old = body(&key);
        old.issued = None;
        let cert = old.clone().sign(&key).unwrap();
        let bytes = cert.to_bytes();
        // Format 1: no issue time, the flags right after not_after.
        assert_eq!(bytes[0], 1);
        assert_eq!(bytes[1 + 32 + 32 + 16], 1, "the exit flag follows not_after");
        let back = Certificate::from_bytes(&bytes).unwrap();
        assert_eq!(back.body().issued, None);
        assert_eq!(back.issued(), 1_800_000_000, "a format-1 certificate counts as issued at not_before");
        assert_eq!(back.to_bytes(), bytes, "presented again in the format it was signed in");
        assert_eq!(back.check(&[key.id()], "office", &[9; 32], 1_800_000_100), Ok(()));
        // The issuer flag does not exist in format 1: not signed, not read.
        old.issuer = true;
        assert!(old.sign(&key).is_err());
        let mut flagged = bytes;
        flagged[1 + 32 + 32 + 16] |= 4;
        assert_eq!(Certificate::from_bytes(&flagged), Err(CertError::Field("flags")));
        // Format 2 carries both, signed.
        let mut new = body(&key);
        new.issuer = true;
        let new = new.sign(&key).unwrap();
        let back = Certificate::from_bytes(&new.to_bytes()).unwrap();
        assert!(back.body().issuer);
        assert_eq!(back.issued(), 1_800_000_007);
        let mut unmarked = new.to_bytes();
        unmarked[1 + 32 + 32 + 24] &= !4;
        let unmarked = Certificate::from_bytes(&unmarked).unwrap();
        assert!(!unmarked.body().issuer);
        assert_eq!(unmarked.check(&[key.id()], "office", &[9; 32], 1_800_000_100), Err(CertRefusal::BadSignature));
        let mut later = new.to_bytes();
        later[1 + 32 + 32 + 16 + 7] ^= 1;
        let later = Certificate::from_bytes(&later).unwrap();
        assert_eq!(later.check(&[key.id()], "office", &[9; 32], 1_800_000_100), Err(CertRefusal::BadSignature));
    }

    #[test]
    fn revocations_round_trip_and_verify_only_under_their_authority() {
        let key = authority();
        let r = Revocation::issue(&key, [9; 32], 1_800_000_000);
        let text = r.to_text();
        let back = Revocation::from_text(&text).unwrap();
        assert_eq!(back, r);
        assert!(back.verify(&[key.id()]));
        assert!(!back.verify(&[AuthorityKey::from_seed([8; 32]).id()]));
        let mut bytes = r.to_bytes();
        assert_eq!(bytes.len(), 1 + 32 + 32 + 8 + 64);
        bytes[40] ^= 1; // another node
        assert!(!Revocation::from_bytes(&bytes).unwrap().verify(&[key.id()]));
        for n in 0..bytes.len() {
            assert!(Revocation::from_bytes(&bytes[..n]).is_err());
        }
    }

    #[test]
    fn prefixes_cover_what_lies_inside_them() {
        let p = |s: &str, len| Prefix { addr: s.parse().unwrap(), len };
        assert!(p("192.168.0.0", 16).covers(&p("192.168.50.0", 24)));
        assert!(!p("192.168.0.0", 16).covers(&p("192.0.0.0", 8)));
        assert!(!p("192.168.0.0", 16).covers(&p("192.169.0.0", 24)));
        assert!(p("0.0.0.0", 0).covers(&p("10.0.0.0", 8)));
        assert!(p("fd00::", 8).covers(&p("fd12::", 16)));
        assert!(!p("fd00::", 8).covers(&p("10.0.0.0", 8)));
    }
}
