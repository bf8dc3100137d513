//! The session handshake: Noise through `snow`, with the network secret as PSK.
//!
//! ```text
//! first contact (XXpsk3)              known static key (IKpsk2)
//! I -> R  init   e                    I -> R  init   e, es, s, ss   + hello(I)
//! R -> I  resp   e, ee, s, es + hello(R)  R -> I  resp   e, ee, se, psk + hello(R)
//! I -> R  finish s, se, psk + hello(I)
//! ```
//!
//! Both hellos carry the sender's cipher and overlay address; the data keys are the
//! Noise split run through HKDF bound to the handshake hash. This module holds no
//! sockets and reads no clock; `snow` draws the ephemeral keys from the OS RNG.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use ring::hkdf;
use snow::{Builder, HandshakeState};
use thiserror::Error;

use crate::crypto::Cipher;
use crate::wire::Pattern;

const XX: &str = "Noise_XXpsk3_25519_ChaChaPoly_BLAKE2s";
const IK: &str = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
const PROLOGUE: &[u8] = b"weft/v1\0";
const HELLO_VERSION: u8 = 1;
/// Upper bound of any handshake message we send or accept: room for an issuer's IK
/// answer to a join, which carries its own certificate and the one it issues (up to
/// 512 bytes each) beside its hello.
pub const MAX_HANDSHAKE_MSG: usize = 2048;
/// Zero bytes an XX init carries as its (plaintext, unread) payload, so that the
/// init is at least as large as the response it asks for: a responder answers an
/// unproven sender with no more bytes than it sent (it sends a cookie instead). This
/// covers responders whose host names are up to 89 bytes long; longer ones ask for a
/// cookie round trip first. Releases before 0.2.0 send none and ignore it.
pub const XX_INIT_PADDING: usize = 192;

/// Errors from a handshake.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// A Noise message did not authenticate or decode: wrong network secret or name,
    /// stale static key, or garbage.
    #[error("handshake message did not authenticate (network name or secret differs?)")]
    Auth(#[source] snow::Error),
    /// The hello inside the handshake could not be parsed.
    #[error("malformed hello payload")]
    BadPayload,
    /// The message arrived in a state that does not expect it.
    #[error("unexpected handshake message")]
    Unexpected,
    /// snow refused to build the state (invalid key material).
    #[error("cannot set up noise state")]
    Setup(#[source] snow::Error),
}

/// The pre-shared key of a network: Argon2id of the secret, salted with the network
/// name, so that an offline guess of the secret (against a captured handshake MAC)
/// costs a memory-hard hash.
#[derive(Clone, PartialEq, Eq)]
pub struct Psk([u8; 32]);

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psk(<redacted>)")
    }
}

/// Argon2id cost of [`Psk::derive`]: 46 MiB, one pass, one lane (one of OWASP's
/// recommended Argon2id settings), tens of milliseconds per guess on a server core.
/// Above 32 MiB on purpose: glibc raises its mmap threshold to the size of a freed
/// mapping up to 32 MiB, after which the node's later allocations would stay in the
/// heap (about 20 MiB more resident memory for the node's whole life).
pub const PSK_KDF_MEMORY_KIB: u32 = 46 * 1024;
/// Argon2id passes of [`Psk::derive`].
pub const PSK_KDF_PASSES: u32 = 1;

impl Psk {
    /// Derives the PSK from the network name and secret (Argon2id; call it once at
    /// start, it costs tens of milliseconds by design).
    pub fn derive(network_name: &str, secret: &str) -> Self {
        // The salt must be at least 8 bytes; a fixed prefix also separates Weft's use
        // of the secret from any other.
        let mut salt = b"weft/v1/network-psk/".to_vec();
        salt.extend_from_slice(network_name.as_bytes());
        let params = argon2::Params::new(PSK_KDF_MEMORY_KIB, PSK_KDF_PASSES, 1, Some(32));
        let mut out = [0u8; 32];
        // The parameters are constants within Argon2's limits, the salt is at least 8
        // bytes and the output 32: hash_password_into cannot fail.
        #[allow(clippy::unwrap_used)]
        argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params.unwrap())
            .hash_password_into(secret.as_bytes(), &salt, &mut out)
            .unwrap();
        Self(out)
    }

    /// Builds a PSK from raw bytes (tests and benchmarks that must not pay for
    /// Argon2 per node).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A short public name of this PSK: what a hello says to tell which secrets its
    /// sender accepts while the network secret rotates (reveals nothing of it).
    pub fn fingerprint(&self) -> [u8; 8] {
        let k = self.subkey(b"weft/v1/fingerprint");
        [k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]]
    }

    /// A key for one purpose (handshake MACs, cookies, LAN beacons), derived from the
    /// PSK with HKDF-SHA256 and `label`; knowing it reveals nothing about the PSK.
    pub fn subkey(&self, label: &[u8]) -> [u8; 32] {
        expand(b"weft/v1/psk-subkey", &self.0, label)
    }
}

struct Len32;
impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

/// A node's long-term identity: an Ed25519 signing key, and the static X25519 key pair
/// Noise uses, derived from it (the X25519 private key is the Ed25519 secret scalar,
/// the public key the Montgomery form of the Ed25519 public key). So whoever knows a
/// node's X25519 public key (and with it its node id) can check that an Ed25519
/// public key is that node's: see [`verify_signed`].
#[derive(Clone)]
pub struct StaticKey {
    seed: [u8; 32],
    private: [u8; 32],
    /// The public X25519 half; the node id derives from it.
    pub public: [u8; 32],
    /// The Ed25519 public key (its Montgomery form is `public`).
    pub signing_public: [u8; 32],
}

impl fmt::Debug for StaticKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKey").field("public", &self.public).finish_non_exhaustive()
    }
}

impl StaticKey {
    /// Generates a fresh identity from the OS RNG.
    pub fn generate() -> Result<Self, HandshakeError> {
        use ring::rand::SecureRandom;
        let mut seed = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut seed).map_err(|_| HandshakeError::Unexpected)?;
        Ok(Self::from_seed(seed))
    }

    /// Rebuilds an identity from its Ed25519 seed (as stored in the key file).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let signing = ed25519_dalek::SigningKey::from_bytes(&seed);
        let verifying = signing.verifying_key();
        Self {
            seed,
            private: signing.to_scalar_bytes(),
            public: verifying.to_montgomery().to_bytes(),
            signing_public: verifying.to_bytes(),
        }
    }

    /// The Ed25519 seed, for writing to the key file.
    pub fn seed_bytes(&self) -> &[u8; 32] {
        &self.seed
    }

    /// Signs `msg` with the Ed25519 key.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        ed25519_dalek::SigningKey::from_bytes(&self.seed).sign(msg).to_bytes()
    }
}

/// Whether `sig` is a valid Ed25519 signature of `msg` by `signing_public`, and that
/// key is the identity of the node whose static X25519 key is `static_public`
/// (strict verification: no weak keys, no malleable signatures).
pub fn verify_signed(signing_public: &[u8; 32], static_public: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> bool {
    let Ok(vk) = ed25519_dalek::VerifyingKey::from_bytes(signing_public) else { return false };
    if vk.to_montgomery().to_bytes() != *static_public {
        return false;
    }
    vk.verify_strict(msg, &ed25519_dalek::Signature::from_bytes(sig)).is_ok()
}

/// What each side tells the other inside the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The data cipher the sender uses.
    pub cipher: Cipher,
    /// The sender's overlay address.
    pub ipv4: Ipv4Addr,
    /// The prefix length of the sender's overlay network.
    pub prefix: u8,
    /// The sender's host name (at most 255 bytes, UTF-8).
    pub hostname: String,
    /// The sender's IPv6 overlay address and the prefix length of its IPv6 overlay
    /// network, when it has one (an optional trailing field: a hello without it
    /// parses as IPv4 only).
    pub ipv6: Option<(Ipv6Addr, u8)>,
    /// Whether the sender takes GSO super-packets as one record on reliable
    /// connections ([`crate::wire::FLAG_GSO`]; an optional trailing field: a hello
    /// without it, from an older node, says no).
    pub gso: bool,
    /// Whether the sender also takes them over QUIC, on a stream of the connection
    /// beside its datagrams (an optional field after the features: never read or
    /// written without `gso`).
    pub gso_quic: bool,
    /// The protocol the sender speaks (an optional field after the others: a hello
    /// without it is from a release before versioning, [`Protocol::UNVERSIONED`]).
    pub protocol: Option<Protocol>,
    /// When the sender made this IK init (an optional field after the protocol,
    /// written only in IK inits: [`Initiator::start`] sets it).
    pub stamp: Option<Stamp>,
    /// The sender's member certificate ([`crate::cert::Certificate`], encoded), in a
    /// network with an authority (an optional field after the protocol and the stamp,
    /// at most [`MAX_HELLO_CERT`] bytes; releases before 0.3.0 stop reading before it).
    pub cert: Option<Vec<u8>>,
    /// A new machine's signed invite ([`crate::invite::Invite`], encoded): "issue me a
    /// certificate" (only in the IK init of a join, after the certificate field).
    pub join: Option<Vec<u8>>,
    /// An issuer's answer to a join: the certificate it issued (only in the IK
    /// response to a join).
    pub issued: Option<Vec<u8>>,
    /// An issuer's answer to a join it refuses: why, in words (only in the IK
    /// response to a join; at most 255 bytes).
    pub join_refused: Option<String>,
    /// Fingerprints ([`Psk::fingerprint`]) of the network secrets the sender accepts:
    /// its current one, then its next one while the secret rotates (empty: not said).
    pub secrets: Vec<[u8; 8]>,
}

/// Longest certificate a hello carries (the longest one issued).
pub const MAX_HELLO_CERT: usize = crate::cert::MAX_CERT_LEN;

/// A protocol version and what the sender can do. Two nodes talk when each one's
/// version is at least the other's oldest; within that, they use the capabilities
/// both announce (new features are announced as capability bits, the way the GSO
/// flags were).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocol {
    /// The version the sender speaks.
    pub version: u16,
    /// The oldest version it still talks to.
    pub min: u16,
    /// Capability bits ([`caps`]); bits this build does not know are kept, unused.
    pub caps: u32,
}

/// Capability bits of [`Protocol::caps`]. GSO and GSO over QUIC are also said by the
/// hello's older fields, which receivers read (a protocol-1 peer has no bits); bits
/// for features added from protocol 2 on are read from here.
pub mod caps {
    /// Takes GSO super-packets as one record on stream connections.
    pub const GSO: u32 = 1 << 0;
    /// Takes them over QUIC too.
    pub const GSO_QUIC: u32 = 1 << 1;
    /// Understands the "leaving" control message (a stopping node says goodbye, and
    /// its neighbours close its sessions at once instead of waiting for a timeout).
    pub const LEAVE: u32 = 1 << 2;
    /// Takes and passes on the authority's revocations (the "revocation" control
    /// message, protocol 3).
    pub const REVOCATIONS: u32 = 1 << 3;
    /// Holds the authority key and issues certificates to machines with an invite
    /// (`--authority-key`).
    pub const ISSUER: u32 = 1 << 4;
    /// Takes and passes on access policies signed by the authority (the "policy part"
    /// control message).
    pub const POLICY: u32 = 1 << 5;
    /// Answers path MTU probes (the "probe" control message, padded to the size
    /// measured, with a "probe ack").
    pub const PMTU: u32 = 1 << 6;
}

impl Protocol {
    /// The protocol this build speaks. 1 is every release before the hello carried a
    /// version; 2 added the version itself (release 0.2.0); 3 the member certificate
    /// in the hello (0.3.0).
    pub const VERSION: u16 = 3;
    /// The oldest protocol this build still talks to: the release before.
    pub const MIN: u16 = 1;
    /// A hello without the field: a release before versioning.
    pub const UNVERSIONED: Self = Self { version: 1, min: 1, caps: 0 };

    /// This build's protocol with capabilities `caps`.
    pub fn ours(caps: u32) -> Self {
        Self { version: Self::VERSION, min: Self::MIN, caps }
    }

    /// Whether a node speaking `self` and one speaking `other` can talk.
    pub fn compatible(&self, other: &Self) -> bool {
        self.version >= other.min && other.version >= self.min
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "protocol {} (talks to {} and later)", self.version, self.min)
    }
}

/// When an IK init was made, as TAI64N (seconds since 1970 plus 2^62, then
/// nanoseconds, both big-endian: byte order is time order). A responder takes an IK
/// init from a static key only if its stamp is later than the last one it accepted
/// from that key, so a captured init replayed later costs it one Diffie-Hellman and
/// makes no state and no answer (WireGuard's rule). Only the holder of the static key
/// can write it: it travels encrypted inside the init.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Stamp(pub [u8; 12]);

impl Stamp {
    /// The stamp of `since_unix` (time since 1970-01-01 UTC).
    pub fn from_unix(since_unix: std::time::Duration) -> Self {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&(0x4000_0000_0000_0000u64.wrapping_add(since_unix.as_secs())).to_be_bytes());
        b[8..].copy_from_slice(&since_unix.subsec_nanos().to_be_bytes());
        Self(b)
    }
}

/// Tag of the hello's IPv6 field.
const HELLO_IPV6: u8 = 6;
/// Tag of the hello's feature bits (one byte follows).
const HELLO_FEATURES: u8 = 7;
/// Feature bit: takes [`crate::wire::FLAG_GSO`] records.
const FEATURE_GSO: u8 = 0x01;
/// Tag of the hello's "GSO records over a QUIC stream" field (one byte, 1, follows:
/// a field rather than a feature bit, which older nodes would not have ignored).
const HELLO_GSO_QUIC: u8 = 8;
/// Tag of the hello's protocol field: version u16, oldest version u16, capability
/// bits u32, little-endian (8 bytes follow). Protocol 1 nodes stop reading before it.
const HELLO_PROTOCOL: u8 = 9;
/// Tag of the hello's [`Stamp`] (12 bytes follow); only after the protocol field,
/// only in IK inits. Protocol 1 nodes stop reading before it.
const HELLO_STAMP: u8 = 10;
/// Tag of the hello's certificate: length u16 LE, then the certificate. Only after the
/// protocol field (and the stamp, when there is one).
const HELLO_CERT: u8 = 11;
/// Tag of the hello's invite (a join): length u16 LE, then the invite. After the
/// certificate field's place.
const HELLO_JOIN: u8 = 12;
/// Tag of the certificate an issuer issued: length u16 LE, then the certificate.
const HELLO_ISSUED: u8 = 13;
/// Tag of an issuer's refusal of a join: length u8, then UTF-8 words.
const HELLO_JOIN_REFUSED: u8 = 14;
/// Tag of the secrets the sender accepts: a count (1 or 2), then 8 bytes each.
const HELLO_SECRETS: u8 = 15;

impl Hello {
    /// A hello that says only the cipher, the IPv4 overlay address and network and the
    /// host name: every optional field empty (the builder of a full one starts here).
    pub fn new(cipher: Cipher, ipv4: Ipv4Addr, prefix: u8, hostname: impl Into<String>) -> Self {
        Self {
            cipher,
            ipv4,
            prefix,
            hostname: hostname.into(),
            ipv6: None,
            gso: false,
            gso_quic: false,
            protocol: None,
            stamp: None,
            cert: None,
            join: None,
            issued: None,
            join_refused: None,
            secrets: Vec::new(),
        }
    }

    /// What this node (whose hello `self` is) knows of a member from its signed record
    /// alone: its addresses and name, with this node's cipher and network prefixes;
    /// the rest comes with the member's first handshake.
    pub fn for_member(&self, ipv4: Ipv4Addr, ipv6: Option<Ipv6Addr>, hostname: &str) -> Self {
        let prefix6 = self.ipv6.map_or(64, |(_, q)| q);
        Self { ipv6: ipv6.map(|a| (a, prefix6)), ..Self::new(self.cipher, ipv4, self.prefix, hostname) }
    }

    /// Appends the encoded hello to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let name = truncate_utf8(&self.hostname, 255);
        out.push(HELLO_VERSION);
        out.push(self.cipher.wire_id());
        out.extend_from_slice(&self.ipv4.octets());
        out.push(self.prefix);
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        if let Some((a, p)) = self.ipv6 {
            out.push(HELLO_IPV6);
            out.extend_from_slice(&a.octets());
            out.push(p);
        }
        if self.gso {
            out.extend_from_slice(&[HELLO_FEATURES, FEATURE_GSO]);
            if self.gso_quic {
                out.extend_from_slice(&[HELLO_GSO_QUIC, 1]);
            }
        }
        if let Some(p) = self.protocol {
            out.push(HELLO_PROTOCOL);
            out.extend_from_slice(&p.version.to_le_bytes());
            out.extend_from_slice(&p.min.to_le_bytes());
            out.extend_from_slice(&p.caps.to_le_bytes());
            if let Some(t) = self.stamp {
                out.push(HELLO_STAMP);
                out.extend_from_slice(&t.0);
            }
            if let Some(c) = self.cert.as_deref().filter(|c| c.len() <= MAX_HELLO_CERT) {
                out.push(HELLO_CERT);
                out.extend_from_slice(&(c.len() as u16).to_le_bytes());
                out.extend_from_slice(c);
            }
            for (tag, v) in [(HELLO_JOIN, &self.join), (HELLO_ISSUED, &self.issued)] {
                if let Some(v) = v.as_deref().filter(|v| v.len() <= MAX_HELLO_CERT) {
                    out.push(tag);
                    out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                    out.extend_from_slice(v);
                }
            }
            if let Some(why) = &self.join_refused {
                let why = truncate_utf8(why, 255);
                out.push(HELLO_JOIN_REFUSED);
                out.push(why.len() as u8);
                out.extend_from_slice(why.as_bytes());
            }
            if !self.secrets.is_empty() {
                let n = self.secrets.len().min(2);
                out.extend_from_slice(&[HELLO_SECRETS, n as u8]);
                for f in &self.secrets[..n] {
                    out.extend_from_slice(f);
                }
            }
        }
    }

    /// The length of the encoded hello.
    pub fn encoded_len(&self) -> usize {
        let mut v = Vec::new();
        self.emit(&mut v);
        v.len()
    }

    /// The sender's protocol ([`Protocol::UNVERSIONED`] when its hello has none).
    pub fn protocol(&self) -> Protocol {
        self.protocol.unwrap_or(Protocol::UNVERSIONED)
    }

    /// Parses a hello; unknown trailing bytes are ignored for forward compatibility.
    pub fn parse(b: &[u8]) -> Result<Self, HandshakeError> {
        let bad = HandshakeError::BadPayload;
        if b.len() < 8 || b[0] != HELLO_VERSION {
            return Err(bad);
        }
        let cipher = Cipher::from_wire_id(b[1]).ok_or(HandshakeError::BadPayload)?;
        let ipv4 = Ipv4Addr::new(b[2], b[3], b[4], b[5]);
        let prefix = b[6];
        if prefix > 32 {
            return Err(bad);
        }
        let n = b[7] as usize;
        let name = b.get(8..8 + n).ok_or(HandshakeError::BadPayload)?;
        let hostname = std::str::from_utf8(name).map_err(|_| HandshakeError::BadPayload)?;
        // A peer's name reaches logs and terminals: no control characters (escape
        // sequences, cursor moves). Each becomes '?', which never makes it longer.
        let hostname: String = hostname.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
        // Optional fields, in this order: IPv6, features, GSO over QUIC, protocol. Anything else (unknown,
        // cut, out of order, or feature bits this version does not know: a newer node
        // adds a field instead) ends the parse, so an older node's tail and a newer
        // node's additions are ignored and `emit` reproduces what was read.
        let mut rest = &b[8 + n..];
        let mut ipv6 = None;
        if let [HELLO_IPV6, f @ ..] = rest
            && f.len() >= 17
        {
            let a: [u8; 16] = f[..16].try_into().map_err(|_| HandshakeError::BadPayload)?;
            if f[16] > 128 {
                return Err(bad);
            }
            ipv6 = Some((Ipv6Addr::from(a), f[16]));
            rest = &f[17..];
        }
        let gso = matches!(rest, [HELLO_FEATURES, FEATURE_GSO, ..]);
        let gso_quic = matches!(rest, [HELLO_FEATURES, FEATURE_GSO, HELLO_GSO_QUIC, 1, ..]);
        rest = &rest[if gso_quic {
            4
        } else if gso {
            2
        } else {
            0
        }..];
        let mut hello = Self { ipv6, gso, gso_quic, ..Self::new(cipher, ipv4, prefix, hostname) };
        if let [HELLO_PROTOCOL, f @ ..] = rest
            && f.len() >= 8
        {
            hello.parse_protocol(f)?;
        }
        Ok(hello)
    }

    /// Reads the protocol field `f` (after its tag) and the fields that follow it:
    /// the IK stamp, the certificate, a join's invite and answer, the secrets.
    fn parse_protocol(&mut self, f: &[u8]) -> Result<(), HandshakeError> {
        let u16_at = |i: usize| u16::from_le_bytes([f[i], f[i + 1]]);
        let p = Protocol { version: u16_at(0), min: u16_at(2), caps: u32::from_le_bytes([f[4], f[5], f[6], f[7]]) };
        // A version below its own oldest, or below 2 (the first that says so), is not
        // one anybody sends.
        if p.min > p.version || p.version < 2 {
            return Err(HandshakeError::BadPayload);
        }
        self.protocol = Some(p);
        let mut tail = &f[8..];
        if let [HELLO_STAMP, t @ ..] = tail
            && let Some(t) = t.get(..12)
        {
            self.stamp = t.try_into().ok().map(Stamp);
            tail = &tail[13..];
        }
        // A certificate (or invite, or issued certificate) field that is cut or too
        // long is not ignored: the sender meant it to be checked.
        let field = |tail: &mut &[u8], tag: u8| -> Result<Option<Vec<u8>>, HandshakeError> {
            let [t, l0, l1, c @ ..] = *tail else { return Ok(None) };
            if *t != tag {
                return Ok(None);
            }
            let len = usize::from(u16::from_le_bytes([*l0, *l1]));
            if len > MAX_HELLO_CERT || c.len() < len {
                return Err(HandshakeError::BadPayload);
            }
            *tail = &c[len..];
            Ok(Some(c[..len].to_vec()))
        };
        self.cert = field(&mut tail, HELLO_CERT)?;
        self.join = field(&mut tail, HELLO_JOIN)?;
        self.issued = field(&mut tail, HELLO_ISSUED)?;
        if let [HELLO_JOIN_REFUSED, n, w @ ..] = tail {
            let n = usize::from(*n);
            let w = w.get(..n).ok_or(HandshakeError::BadPayload)?;
            let w = std::str::from_utf8(w).map_err(|_| HandshakeError::BadPayload)?;
            self.join_refused = Some(w.chars().map(|c| if c.is_control() { '?' } else { c }).collect());
            tail = &tail[2 + n..];
        }
        if let [HELLO_SECRETS, n @ (1 | 2), f @ ..] = tail {
            let f = f.get(..8 * usize::from(*n)).ok_or(HandshakeError::BadPayload)?;
            self.secrets = f.chunks_exact(8).filter_map(|c| c.try_into().ok()).collect();
        }
        Ok(())
    }
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Key material for one session, one key per direction.
pub struct SessionKeys {
    /// Key for packets this side sends.
    pub send: [u8; 32],
    /// Key for packets this side receives.
    pub recv: [u8; 32],
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys(<redacted>)")
    }
}

/// A finished handshake.
#[derive(Debug)]
pub struct Completed {
    /// The peer's hello.
    pub hello: Hello,
    /// The peer's static public key.
    pub remote_static: [u8; 32],
    /// Data keys.
    pub keys: SessionKeys,
}

/// Shared inputs of both roles.
#[derive(Debug, Clone)]
pub struct Params {
    /// Our static key.
    pub local: StaticKey,
    /// The network PSK.
    pub psk: Psk,
    /// The network name, bound into the prologue.
    pub network_name: String,
    /// Our hello.
    pub hello: Hello,
}

impl Params {
    /// The Noise bytes of our response to an init of `pattern` (without the header
    /// and MACs): what answering it costs in bytes.
    pub fn response_len(&self, pattern: Pattern) -> usize {
        // e, then for XX s (encrypted: 32 + tag), then the hello encrypted (+ tag).
        let statics = match pattern {
            Pattern::Xx => 32 + 16,
            Pattern::Ik => 0,
        };
        32 + statics + self.hello.encoded_len() + 16
    }
}

/// The initiator's side of a handshake in flight.
pub struct Initiator {
    state: HandshakeState,
    pattern: Pattern,
}

impl fmt::Debug for Initiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Initiator").field("pattern", &self.pattern).finish_non_exhaustive()
    }
}

impl Initiator {
    /// Starts a handshake. With `remote` known it uses IK (its hello carries `stamp`,
    /// which must be later than every IK init this key sent before), else XX (padded
    /// to [`XX_INIT_PADDING`]). Returns the state and the Noise bytes of the first
    /// message.
    pub fn start(p: &Params, remote: Option<&[u8; 32]>, stamp: Stamp) -> Result<(Self, Vec<u8>), HandshakeError> {
        let (pattern, name, loc) = match remote {
            Some(_) => (Pattern::Ik, IK, 2),
            None => (Pattern::Xx, XX, 3),
        };
        let prologue = prologue(&p.network_name);
        let mut b = builder(name)
            .local_private_key(&p.local.private)
            .and_then(|b| b.psk(loc, &p.psk.0))
            .and_then(|b| b.prologue(&prologue))
            .map_err(HandshakeError::Setup)?;
        if let Some(rs) = remote {
            b = b.remote_public_key(rs).map_err(HandshakeError::Setup)?;
        }
        let mut state = b.build_initiator().map_err(HandshakeError::Setup)?;
        let mut payload = Vec::new();
        match pattern {
            Pattern::Ik => Hello { stamp: Some(stamp), ..p.hello.clone() }.emit(&mut payload),
            // A node with a certificate answers with it: its init is as much larger.
            Pattern::Xx => payload.resize(XX_INIT_PADDING + p.hello.cert.as_ref().map_or(0, |c| 3 + c.len()), 0),
        }
        let mut out = vec![0u8; MAX_HANDSHAKE_MSG];
        let n = state.write_message(&payload, &mut out).map_err(HandshakeError::Setup)?;
        out.truncate(n);
        Ok((Self { state, pattern }, out))
    }

    /// The pattern in use.
    pub fn pattern(&self) -> Pattern {
        self.pattern
    }

    /// Consumes the response. For XX also returns the finish message to send.
    pub fn read_response(mut self, p: &Params, msg: &[u8]) -> Result<(Completed, Option<Vec<u8>>), HandshakeError> {
        let mut payload = vec![0u8; MAX_HANDSHAKE_MSG];
        let n = self.state.read_message(msg, &mut payload).map_err(HandshakeError::Auth)?;
        let hello = Hello::parse(&payload[..n])?;
        let finish = if self.pattern == Pattern::Xx {
            let mut mine = Vec::new();
            p.hello.emit(&mut mine);
            let mut out = vec![0u8; MAX_HANDSHAKE_MSG];
            let n = self.state.write_message(&mine, &mut out).map_err(HandshakeError::Setup)?;
            out.truncate(n);
            Some(out)
        } else {
            None
        };
        let done = complete(&mut self.state, hello, true)?;
        Ok((done, finish))
    }
}

/// The responder's side of an XX handshake waiting for its finish message.
pub struct Responder {
    state: HandshakeState,
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Responder")
    }
}

/// What the responder does after reading an init message.
#[derive(Debug)]
pub enum Responded {
    /// IK: done; send the response bytes.
    Completed(Box<Completed>, Vec<u8>),
    /// XX: send the response bytes and wait for the finish message.
    Pending(Box<Responder>, Vec<u8>),
}

/// An init read by the responder, before it answers.
pub enum Read {
    /// IK: the initiator's hello and key are known; [`IkRead::answer`] writes the
    /// response (with whatever hello the responder chooses).
    Ik(Box<IkRead>),
    /// XX: send the response bytes and wait for the finish message.
    Xx(Box<Responder>, Vec<u8>),
}

/// An IK init read: who sent it and what it said.
pub struct IkRead {
    state: HandshakeState,
    /// The initiator's hello.
    pub hello: Hello,
    /// The initiator's static public key (proven by the `ss` of its init).
    pub remote_static: [u8; 32],
}

impl fmt::Debug for IkRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IkRead").field("hello", &self.hello).finish_non_exhaustive()
    }
}

impl IkRead {
    /// Writes the response carrying hello `mine`; the handshake is complete.
    pub fn answer(mut self, mine: &Hello) -> Result<(Completed, Vec<u8>), HandshakeError> {
        let mut payload = Vec::new();
        mine.emit(&mut payload);
        let mut out = vec![0u8; MAX_HANDSHAKE_MSG];
        let m = self.state.write_message(&payload, &mut out).map_err(HandshakeError::Setup)?;
        out.truncate(m);
        Ok((complete(&mut self.state, self.hello, false)?, out))
    }
}

impl Responder {
    /// Reads an init message of the given pattern and writes the response.
    pub fn respond(p: &Params, pattern: Pattern, msg: &[u8]) -> Result<Responded, HandshakeError> {
        match Self::read(p, pattern, msg)? {
            Read::Ik(r) => {
                let (done, out) = r.answer(&p.hello)?;
                Ok(Responded::Completed(Box::new(done), out))
            }
            Read::Xx(r, out) => Ok(Responded::Pending(r, out)),
        }
    }

    /// Reads an init message of the given pattern. XX is answered at once (the
    /// initiator is not known yet); IK waits for [`IkRead::answer`].
    pub fn read(p: &Params, pattern: Pattern, msg: &[u8]) -> Result<Read, HandshakeError> {
        let (name, loc) = match pattern {
            Pattern::Ik => (IK, 2),
            Pattern::Xx => (XX, 3),
        };
        let prologue = prologue(&p.network_name);
        let mut state = builder(name)
            .local_private_key(&p.local.private)
            .and_then(|b| b.psk(loc, &p.psk.0))
            .and_then(|b| b.prologue(&prologue))
            .and_then(|b| b.build_responder())
            .map_err(HandshakeError::Setup)?;
        let mut payload = vec![0u8; MAX_HANDSHAKE_MSG];
        let n = state.read_message(msg, &mut payload).map_err(HandshakeError::Auth)?;
        match pattern {
            Pattern::Ik => {
                let hello = Hello::parse(&payload[..n])?;
                let remote_static: [u8; 32] =
                    state.get_remote_static().and_then(|k| k.try_into().ok()).ok_or(HandshakeError::Unexpected)?;
                Ok(Read::Ik(Box::new(IkRead { state, hello, remote_static })))
            }
            Pattern::Xx => {
                let mut mine = Vec::new();
                p.hello.emit(&mut mine);
                let mut out = vec![0u8; MAX_HANDSHAKE_MSG];
                let m = state.write_message(&mine, &mut out).map_err(HandshakeError::Setup)?;
                out.truncate(m);
                Ok(Read::Xx(Box::new(Self { state }), out))
            }
        }
    }

    /// Reads the XX finish message.
    pub fn finish(mut self, msg: &[u8]) -> Result<Completed, HandshakeError> {
        let mut payload = vec![0u8; MAX_HANDSHAKE_MSG];
        let n = self.state.read_message(msg, &mut payload).map_err(HandshakeError::Auth)?;
        let hello = Hello::parse(&payload[..n])?;
        complete(&mut self.state, hello, false)
    }
}

fn builder(name: &str) -> Builder<'static> {
    // Both pattern strings are constants that snow supports; parse cannot fail.
    #[allow(clippy::unwrap_used)]
    Builder::new(name.parse().unwrap())
}

fn prologue(network_name: &str) -> Vec<u8> {
    let mut v = PROLOGUE.to_vec();
    v.extend_from_slice(network_name.as_bytes());
    v
}

fn complete(state: &mut HandshakeState, hello: Hello, initiator: bool) -> Result<Completed, HandshakeError> {
    if !state.is_handshake_finished() {
        return Err(HandshakeError::Unexpected);
    }
    let remote_static: [u8; 32] =
        state.get_remote_static().and_then(|k| k.try_into().ok()).ok_or(HandshakeError::Unexpected)?;
    let hash = state.get_handshake_hash().to_vec();
    let (i2r, r2i) = state.dangerously_get_raw_split();
    let i2r = expand(&hash, &i2r, b"weft/v1/data/i2r");
    let r2i = expand(&hash, &r2i, b"weft/v1/data/r2i");
    let keys = if initiator { SessionKeys { send: i2r, recv: r2i } } else { SessionKeys { send: r2i, recv: i2r } };
    Ok(Completed { hello, remote_static, keys })
}

fn expand(hash: &[u8], key: &[u8; 32], label: &[u8]) -> [u8; 32] {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, hash).extract(key);
    let info = [label];
    let mut out = [0u8; 32];
    // 32 bytes is within HKDF-SHA256's output limit.
    #[allow(clippy::unwrap_used)]
    prk.expand(&info, Len32).unwrap().fill(&mut out).unwrap();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(name: &str, secret: &str, ip: [u8; 4], cipher: Cipher) -> Params {
        Params {
            local: StaticKey::generate().unwrap(),
            psk: Psk::derive(name, secret),
            network_name: name.into(),
            hello: Hello { gso: true, gso_quic: true, ..Hello::new(cipher, ip.into(), 24, format!("h{}", ip[3])) },
        }
    }

    fn xx(a: &Params, b: &Params) -> Result<(Completed, Completed), HandshakeError> {
        let (init, m1) = Initiator::start(a, None, Stamp::default())?;
        let Responded::Pending(resp, m2) = Responder::respond(b, Pattern::Xx, &m1)? else {
            panic!("XX must wait for the finish message")
        };
        let (a_done, m3) = init.read_response(a, &m2)?;
        let b_done = resp.finish(&m3.unwrap())?;
        Ok((a_done, b_done))
    }

    #[test]
    fn x25519_key_derives_from_the_signing_key_and_signatures_bind_to_it() {
        use snow::params::DHChoice;
        use snow::resolvers::{CryptoResolver, DefaultResolver};
        for seed in [[0u8; 32], [7u8; 32], [0xff; 32]] {
            let k = StaticKey::from_seed(seed);
            // The public key snow computes from our private key (it clamps) is the
            // Montgomery form of the Ed25519 public key.
            let mut dh = DefaultResolver.resolve_dh(&DHChoice::Curve25519).unwrap();
            dh.set(&k.private);
            assert_eq!(dh.pubkey(), k.public);
            assert_eq!(StaticKey::from_seed(*k.seed_bytes()).public, k.public);
            let sig = k.sign(b"record");
            assert!(verify_signed(&k.signing_public, &k.public, b"record", &sig));
            assert!(!verify_signed(&k.signing_public, &k.public, b"recorD", &sig));
            // Someone else's signing key, however valid its signature, is not bound
            // to this node's X25519 key.
            let other = StaticKey::from_seed([9u8; 32]);
            assert!(!verify_signed(&other.signing_public, &k.public, b"record", &other.sign(b"record")));
            let mut bad = sig;
            bad[63] ^= 0x80;
            assert!(!verify_signed(&k.signing_public, &k.public, b"record", &bad));
        }
    }

    #[test]
    fn xx_then_ik_agree_on_keys_and_hellos() {
        let a = params("office", "s3cret", [10, 0, 0, 1], Cipher::Aes128Gcm);
        let b = params("office", "s3cret", [10, 0, 0, 2], Cipher::Aes128Gcm);
        let (ad, bd) = xx(&a, &b).unwrap();
        assert_eq!(ad.keys.send, bd.keys.recv);
        assert_eq!(ad.keys.recv, bd.keys.send);
        assert_ne!(ad.keys.send, ad.keys.recv);
        assert_eq!(ad.hello, b.hello);
        assert_eq!(bd.hello, a.hello);
        assert_eq!(ad.remote_static, b.local.public);
        assert_eq!(bd.remote_static, a.local.public);

        // Second contact: IK with the learned key.
        let (init, m1) = Initiator::start(&a, Some(&ad.remote_static), Stamp::default()).unwrap();
        assert_eq!(init.pattern(), Pattern::Ik);
        let Responded::Completed(bd2, m2) = Responder::respond(&b, Pattern::Ik, &m1).unwrap() else {
            panic!("IK completes on the responder after message one")
        };
        let (ad2, fin) = init.read_response(&a, &m2).unwrap();
        assert!(fin.is_none());
        assert_eq!(ad2.keys.send, bd2.keys.recv);
        assert_ne!(ad2.keys.send, ad.keys.send, "fresh keys per session");
        assert_eq!(bd2.hello, a.hello);
    }

    #[test]
    fn wrong_secret_fails_xx_at_responder() {
        let a = params("office", "s3cret", [10, 0, 0, 1], Cipher::Aes128Gcm);
        let b = params("office", "other", [10, 0, 0, 2], Cipher::Aes128Gcm);
        let (init, m1) = Initiator::start(&a, None, Stamp::default()).unwrap();
        let Responded::Pending(resp, m2) = Responder::respond(&b, Pattern::Xx, &m1).unwrap() else { panic!() };
        let (_, m3) = init.read_response(&a, &m2).unwrap();
        assert!(matches!(resp.finish(&m3.unwrap()), Err(HandshakeError::Auth(_))));
    }

    #[test]
    fn wrong_secret_fails_ik_at_initiator() {
        let a = params("office", "s3cret", [10, 0, 0, 1], Cipher::Aes128Gcm);
        let b = params("office", "other", [10, 0, 0, 2], Cipher::Aes128Gcm);
        let (init, m1) = Initiator::start(&a, Some(&b.local.public), Stamp::default()).unwrap();
        // psk2 is mixed after message one, so the responder cannot tell yet...
        let Responded::Completed(_, m2) = Responder::respond(&b, Pattern::Ik, &m1).unwrap() else { panic!() };
        // ...but the initiator can.
        assert!(matches!(init.read_response(&a, &m2), Err(HandshakeError::Auth(_))));
    }

    #[test]
    fn wrong_network_name_fails() {
        let a = params("office", "s3cret", [10, 0, 0, 1], Cipher::Aes128Gcm);
        let b = params("lab", "s3cret", [10, 0, 0, 2], Cipher::Aes128Gcm);
        assert!(matches!(xx(&a, &b), Err(HandshakeError::Auth(_))));
    }

    #[test]
    fn stale_static_key_fails_ik() {
        let a = params("office", "s3cret", [10, 0, 0, 1], Cipher::Aes128Gcm);
        let b = params("office", "s3cret", [10, 0, 0, 2], Cipher::Aes128Gcm);
        let old = StaticKey::generate().unwrap();
        let (_, m1) = Initiator::start(&a, Some(&old.public), Stamp::default()).unwrap();
        assert!(matches!(Responder::respond(&b, Pattern::Ik, &m1), Err(HandshakeError::Auth(_))));
    }

    #[test]
    fn garbage_is_rejected() {
        let b = params("office", "s3cret", [10, 0, 0, 2], Cipher::Aes128Gcm);
        for len in [0, 1, 31, 32, 48, 96, 200] {
            let junk = vec![0x5au8; len];
            assert!(Responder::respond(&b, Pattern::Ik, &junk).is_err());
        }
    }

    #[test]
    fn hello_round_trip_and_bad_input() {
        let h = Hello::new(Cipher::ChaCha20Poly1305, [10, 1, 2, 3].into(), 16, "node-α");
        let mut b = Vec::new();
        h.emit(&mut b);
        assert_eq!(&b[..8], &[1, 2, 10, 1, 2, 3, 16, 7]);
        let v6 = Hello { ipv6: Some(("fd12::7".parse().unwrap(), 64)), ..h.clone() };
        let mut b6 = Vec::new();
        v6.emit(&mut b6);
        assert_eq!(Hello::parse(&b6).unwrap(), v6);
        assert_eq!(Hello::parse(&b6[..b6.len() - 1]).unwrap(), h, "a cut IPv6 field is an unknown tail");
        let g = Hello { gso: true, ..v6.clone() };
        let mut bg = Vec::new();
        g.emit(&mut bg);
        assert_eq!(Hello::parse(&bg).unwrap(), g);
        assert_eq!(&bg[b6.len()..], &[7, 1]);
        // An older node reads the IPv6 field where it always was and ignores the rest.
        assert_eq!(&bg[..b6.len()], &b6[..]);
        let g4 = Hello { gso: true, ..h.clone() };
        let mut bg4 = Vec::new();
        g4.emit(&mut bg4);
        assert_eq!(Hello::parse(&bg4).unwrap(), g4, "features without an IPv6 field");
        // GSO over QUIC: a field after the features; an older node reads "gso" and
        // stops there.
        let q = Hello { gso_quic: true, ..g.clone() };
        let mut bq = Vec::new();
        q.emit(&mut bq);
        assert_eq!(&bq[bg.len()..], &[8, 1]);
        assert_eq!(Hello::parse(&bq).unwrap(), q);
        assert_eq!(Hello::parse(&bq[..bq.len() - 1]).unwrap(), g, "a cut field is a tail");
        let mut other = bg.clone();
        other.extend_from_slice(&[8, 2]);
        assert_eq!(Hello::parse(&other).unwrap(), g, "a value this version does not know");
        let mut alone = Vec::new();
        Hello { gso_quic: true, ..h.clone() }.emit(&mut alone);
        assert_eq!(alone, b, "only with gso");
        // Feature bits this version does not know, or features before IPv6: ignored
        // (a newer node adds a field), never half-read.
        let mut unknown = b.clone();
        unknown.extend_from_slice(&[7, 0xff]);
        assert_eq!(Hello::parse(&unknown).unwrap(), h);
        let mut swapped = bg4.clone();
        swapped.extend_from_slice(&b6[b.len()..]);
        assert_eq!(Hello::parse(&swapped).unwrap(), g4, "an IPv6 field after the features is a tail");
        let mut bad = b6.clone();
        *bad.last_mut().unwrap() = 129;
        assert!(Hello::parse(&bad).is_err(), "an IPv6 prefix over 128");
        assert_eq!(Hello::parse(&b).unwrap(), h);
        assert!(Hello::parse(&b[..b.len() - 1]).is_err());
        let mut bad = b.clone();
        bad[1] = 9;
        assert!(Hello::parse(&bad).is_err());
        let mut bad = b.clone();
        bad[6] = 33;
        assert!(Hello::parse(&bad).is_err());
        let long = Hello { hostname: "é".repeat(200), ..h };
        let mut b = Vec::new();
        long.emit(&mut b);
        assert!(Hello::parse(&b).unwrap().hostname.len() <= 255);
    }

    #[test]
    fn hello_protocol_field_is_read_by_new_nodes_and_skipped_by_old_ones() {
        let old = Hello {
            ipv6: Some(("fd12::7".parse().unwrap(), 64)),
            gso: true,
            gso_quic: true,
            ..Hello::new(Cipher::Aes128Gcm, [10, 1, 2, 3].into(), 24, "n")
        };
        let new = Hello { protocol: Some(Protocol::ours(caps::GSO | caps::GSO_QUIC | 1 << 31)), ..old.clone() };
        let (mut bo, mut bn) = (Vec::new(), Vec::new());
        old.emit(&mut bo);
        new.emit(&mut bn);
        // The field comes last: a protocol-1 node's parse (which stops at a tag it does
        // not know) reads exactly the old hello from the new bytes.
        assert_eq!(&bn[..bo.len()], &bo[..]);
        assert_eq!(bn[bo.len()], 9);
        assert_eq!(Hello::parse(&bn).unwrap(), new, "unknown capability bits are kept");
        assert_eq!(Hello::parse(&bo).unwrap().protocol(), Protocol::UNVERSIONED);
        // Without the optional fields before it, too.
        let bare = Hello { ipv6: None, gso: false, gso_quic: false, ..new.clone() };
        let mut bb = Vec::new();
        bare.emit(&mut bb);
        assert_eq!(Hello::parse(&bb).unwrap(), bare);
        // Cut: a tail; nonsense versions: refused.
        assert_eq!(Hello::parse(&bn[..bn.len() - 1]).unwrap(), old);
        for (v, min) in [(1u16, 1u16), (3, 4)] {
            let mut bad = bo.clone();
            bad.push(9);
            bad.extend_from_slice(&v.to_le_bytes());
            bad.extend_from_slice(&min.to_le_bytes());
            bad.extend_from_slice(&0u32.to_le_bytes());
            assert!(Hello::parse(&bad).is_err(), "version {v} oldest {min}");
        }
    }

    #[test]
    fn ik_inits_carry_their_stamp_and_xx_inits_are_as_large_as_the_answer() {
        let mut a = params("office", "s3cret", [10, 0, 0, 1], Cipher::Aes128Gcm);
        let mut b = params("office", "s3cret", [10, 0, 0, 2], Cipher::Aes128Gcm);
        for p in [&mut a, &mut b] {
            p.hello.protocol = Some(Protocol::ours(caps::GSO | caps::GSO_QUIC));
            p.hello.ipv6 = Some(("fd00::2".parse().unwrap(), 64));
            p.hello.hostname = "h".repeat(89);
        }
        // TAI64N orders as the times do, across a second boundary too.
        let t = |s, n| Stamp::from_unix(std::time::Duration::new(s, n));
        assert!(t(10, 999_999_999) < t(11, 0) && t(11, 0) < t(11, 1));
        assert_eq!(t(0, 0).0[..8], 0x4000_0000_0000_0000u64.to_be_bytes());

        let (_, m1) = Initiator::start(&a, Some(&b.local.public), t(1_800_000_000, 5)).unwrap();
        let Responded::Completed(done, m2) = Responder::respond(&b, Pattern::Ik, &m1).unwrap() else { panic!() };
        assert_eq!(done.hello.stamp, Some(t(1_800_000_000, 5)));
        assert_eq!(Hello { stamp: None, ..done.hello }, a.hello);
        assert_eq!(m2.len(), b.response_len(Pattern::Ik));

        let (init, m1) = Initiator::start(&a, None, Stamp::default()).unwrap();
        let Responded::Pending(resp, m2) = Responder::respond(&b, Pattern::Xx, &m1).unwrap() else { panic!() };
        assert_eq!(m2.len(), b.response_len(Pattern::Xx));
        assert!(m1.len() >= m2.len(), "an XX init ({}) is no smaller than its answer ({})", m1.len(), m2.len());
        let (_, m3) = init.read_response(&a, &m2).unwrap();
        assert_eq!(resp.finish(&m3.unwrap()).unwrap().hello.stamp, None, "only IK inits are stamped");
    }

    #[test]
    fn certificates_ride_in_both_hellos_and_keep_xx_inits_as_large_as_the_answer() {
        let mut a = params("office", "s3cret", [10, 0, 0, 1], Cipher::Aes128Gcm);
        let mut b = params("office", "s3cret", [10, 0, 0, 2], Cipher::Aes128Gcm);
        for (p, fill) in [(&mut a, 0xa5u8), (&mut b, 0x5a)] {
            p.hello.protocol = Some(Protocol::ours(0));
            p.hello.cert = Some(vec![fill; 250]);
        }
        let t = Stamp::from_unix(std::time::Duration::from_secs(1_800_000_000));
        let (_, m1) = Initiator::start(&a, Some(&b.local.public), t).unwrap();
        let Responded::Completed(done, _) = Responder::respond(&b, Pattern::Ik, &m1).unwrap() else { panic!() };
        assert_eq!(done.hello.cert, a.hello.cert);
        assert_eq!(done.hello.stamp, Some(t), "the stamp and the certificate both ride");
        let (init, m1) = Initiator::start(&a, None, Stamp::default()).unwrap();
        let Responded::Pending(resp, m2) = Responder::respond(&b, Pattern::Xx, &m1).unwrap() else { panic!() };
        assert!(m1.len() >= m2.len(), "an XX init ({}) is no smaller than its answer ({})", m1.len(), m2.len());
        let (got, m3) = init.read_response(&a, &m2).unwrap();
        assert_eq!(got.hello.cert, b.hello.cert);
        assert_eq!(resp.finish(&m3.unwrap()).unwrap().hello.cert, a.hello.cert);
        // A cut or oversized certificate field is refused, not ignored.
        let mut h = Vec::new();
        a.hello.emit(&mut h);
        assert!(Hello::parse(&h[..h.len() - 1]).is_err());
        let at = h.len() - 250 - 2;
        h[at..at + 2].copy_from_slice(&((MAX_HELLO_CERT + 1) as u16).to_le_bytes());
        assert!(Hello::parse(&h).is_err());
        // Without a protocol field there is no certificate field either.
        let old = Hello { protocol: None, ..a.hello.clone() };
        let mut o = Vec::new();
        old.emit(&mut o);
        assert_eq!(Hello::parse(&o).unwrap().cert, None);
    }

    #[test]
    fn a_join_shows_its_invite_in_an_ik_init_and_the_answer_carries_a_certificate_or_why_not() {
        let mut a = params("office", "s3cret", [0, 0, 0, 0], Cipher::Aes128Gcm);
        let mut b = params("office", "s3cret", [10, 0, 0, 2], Cipher::Aes128Gcm);
        a.hello.protocol = Some(Protocol::ours(0));
        b.hello.protocol = Some(Protocol::ours(caps::ISSUER));
        // The largest: an issuer's own certificate beside the one it issues.
        b.hello.cert = Some(vec![0x5a; MAX_HELLO_CERT]);
        a.hello.join = Some(vec![0x11; 180]);
        let t = Stamp::from_unix(std::time::Duration::from_secs(1_800_000_000));
        for answer in [
            Hello { issued: Some(vec![0x22; MAX_HELLO_CERT]), ..b.hello.clone() },
            Hello { join_refused: Some("the invite is used up (1 of 1 uses)\n".into()), ..b.hello.clone() },
        ] {
            let (init, m1) = Initiator::start(&a, Some(&b.local.public), t).unwrap();
            let Read::Ik(read) = Responder::read(&b, Pattern::Ik, &m1).unwrap() else { panic!("IK is read first") };
            assert_eq!(read.hello.join, a.hello.join);
            assert_eq!(read.remote_static, a.local.public, "the issuer knows whom it certifies");
            let (_, m2) = read.answer(&answer).unwrap();
            let (got, fin) = init.read_response(&a, &m2).unwrap();
            assert!(fin.is_none());
            assert_eq!(got.hello.issued, answer.issued);
            assert_eq!(got.hello.cert, b.hello.cert, "the issuer's own certificate rides beside");
            // A control character in the reason is made '?'.
            assert_eq!(got.hello.join_refused, answer.join_refused.map(|w| w.replace('\n', "?")));
        }
        // Each field round-trips, and a cut one is refused.
        let all =
            Hello { join: Some(vec![1; 10]), issued: Some(vec![2; 10]), join_refused: Some("no".into()), ..a.hello };
        let mut h = Vec::new();
        all.emit(&mut h);
        assert_eq!(Hello::parse(&h).unwrap(), all);
        assert!(Hello::parse(&h[..h.len() - 1]).is_err());
    }

    #[test]
    fn protocols_talk_when_each_is_at_least_the_others_oldest() {
        let p = |version, min| Protocol { version, min, caps: 0 };
        let ours = Protocol::ours(0);
        assert!(ours.compatible(&Protocol::UNVERSIONED), "this release talks to the one before");
        assert!(Protocol::UNVERSIONED.compatible(&ours));
        assert!(p(5, 3).compatible(&p(3, 2)));
        assert!(!p(5, 4).compatible(&p(3, 2)), "the other is too old");
        assert!(!p(3, 2).compatible(&p(5, 4)), "the other is too new for us");
        assert_eq!(p(3, 2).to_string(), "protocol 3 (talks to 2 and later)");
    }

    #[test]
    fn hello_host_name_control_characters_are_replaced() {
        let h = Hello {
            gso: true,
            gso_quic: true,
            ..Hello::new(Cipher::Aes128Gcm, [10, 1, 2, 3].into(), 24, "ev\x1b[31mil\u{9b}2J\x7f\r\n-α")
        };
        let mut b = Vec::new();
        h.emit(&mut b);
        let got = Hello::parse(&b).unwrap();
        assert_eq!(got.hostname, "ev?[31mil?2J???-α");
        assert!(got.hostname.len() <= h.hostname.len());
    }

    #[test]
    fn psk_depends_on_name_and_secret() {
        assert_eq!(Psk::derive("a", "s"), Psk::derive("a", "s"));
        assert_ne!(Psk::derive("a", "s"), Psk::derive("b", "s"));
        assert_ne!(Psk::derive("a", "s"), Psk::derive("a", "t"));
        assert_eq!(format!("{:?}", Psk::derive("a", "s")), "Psk(<redacted>)");
        let p = Psk::derive("a", "s");
        assert_ne!(p.subkey(b"mac1"), p.subkey(b"cookie"));
        assert_ne!(p.subkey(b"mac1"), p.0);
    }
}
