//! Data-plane AEAD: seal and open in place with counter nonces and the header as AAD.
//!
//! Keys come out of the handshake (see [`crate::handshake`]); this module never
//! derives or stores secrets beyond the `ring` key it wraps.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use ring::aead::{AES_128_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};
use subtle::ConstantTimeEq;
use thiserror::Error;

/// AEAD tag length for the real ciphers.
pub const TAG_LEN: usize = 16;

/// The data cipher of a network. Every member must use the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Cipher {
    /// AES-128-GCM (default; AES-NI/ARMv8 accelerated in ring).
    #[default]
    Aes128Gcm,
    /// ChaCha20-Poly1305, for CPUs without AES instructions.
    ChaCha20Poly1305,
    /// Authenticated, not encrypted: tunnel packets travel in plaintext, but every
    /// packet carries the AES-128-GCM tag its session key gives it (header as
    /// associated data, payload as the plaintext — sealed in a scratch copy, so the
    /// packet keeps its plaintext), so nothing unauthenticated is ever accepted. For
    /// links where confidentiality is not needed.
    ///
    /// The tag is exactly AES-128-GCM's: GHASH of the header and the encrypted
    /// payload, masked with AES of the counter's nonce block. Encryption is linear, so
    /// that is GHASH of the header and the *plaintext* plus a secret mask fresh for
    /// every counter (and length): a Wegman–Carter MAC with AES-128-GCM's own forgery
    /// bound; seeing payloads and tags together does not reveal the hash key. Counters
    /// never repeat under a key (one session direction, one mode). The first version
    /// put the whole packet in the associated data with an empty plaintext; ring hashes
    /// associated data one block at a time, which made `none` three times slower than
    /// encrypting (bench/RESULTS.md §24).
    AuthOnly,
}

impl Cipher {
    /// All ciphers (in a fixed order the fuzz targets index into; not wire-id order).
    pub const ALL: [Self; 3] = [Self::AuthOnly, Self::Aes128Gcm, Self::ChaCha20Poly1305];

    /// The command-line and config spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aes128Gcm => "aes-128-gcm",
            Self::ChaCha20Poly1305 => "chacha20-poly1305",
            Self::AuthOnly => "none",
        }
    }

    /// The id carried in handshake payloads.
    pub fn wire_id(self) -> u8 {
        match self {
            Self::Aes128Gcm => 1,
            Self::ChaCha20Poly1305 => 2,
            // 0 was the first `none` (whole packet as associated data), whose tags
            // differ: a node of that version is refused at the handshake, not left
            // dropping every packet.
            Self::AuthOnly => 3,
        }
    }

    /// Inverse of [`Cipher::wire_id`].
    pub fn from_wire_id(id: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.wire_id() == id)
    }

    /// Bytes the cipher appends to every packet: one tag, in every mode.
    pub fn overhead(self) -> usize {
        TAG_LEN
    }

    /// Whether the payload is encrypted (every mode authenticates).
    pub fn encrypts(self) -> bool {
        self != Self::AuthOnly
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A cipher name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown cipher {0:?} (expected aes-128-gcm, chacha20-poly1305 or none)")]
pub struct UnknownCipher(pub String);

impl FromStr for Cipher {
    type Err = UnknownCipher;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| UnknownCipher(s.to_owned()))
    }
}

/// Errors from the data AEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// The tag did not verify: tampered, truncated, or sealed under another key.
    #[error("authentication failed")]
    Auth,
    /// The buffer has no room for the tag, or is shorter than one.
    #[error("buffer too short")]
    Short,
}

/// One direction's data key.
pub struct DataKey {
    cipher: Cipher,
    key: LessSafeKey,
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataKey").field("cipher", &self.cipher).finish_non_exhaustive()
    }
}

impl DataKey {
    /// Builds a key from 32 bytes of key material (AES-128 uses the first 16).
    pub fn new(cipher: Cipher, material: &[u8; 32]) -> Self {
        let (alg, len) = match cipher {
            // `none` tags with AES-128-GCM and leaves the payload as it is.
            Cipher::Aes128Gcm | Cipher::AuthOnly => (&AES_128_GCM, 16),
            Cipher::ChaCha20Poly1305 => (&CHACHA20_POLY1305, 32),
        };
        // The key lengths above are the algorithms' own, so `UnboundKey::new` cannot fail.
        #[allow(clippy::unwrap_used)]
        let key = LessSafeKey::new(UnboundKey::new(alg, &material[..len]).unwrap());
        Self { cipher, key }
    }

    /// The cipher of this key.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// Seals in place under `counter`: `buf[..aad_len]` is authenticated as is (the
    /// header), `buf[aad_len..aad_len + len]` is the payload (encrypted, or only
    /// authenticated with [`Cipher::AuthOnly`]), and the tag is written right after it.
    /// Returns the sealed length from `aad_len` on (payload and tag).
    pub fn seal(&self, counter: u64, buf: &mut [u8], aad_len: usize, len: usize) -> Result<usize, CryptoError> {
        let end = aad_len.checked_add(len).ok_or(CryptoError::Short)?;
        if buf.len() < end + TAG_LEN {
            return Err(CryptoError::Short);
        }
        let (head, rest) = buf.split_at_mut(end);
        let (aad, body) = head.split_at_mut(aad_len);
        let tag = if self.cipher.encrypts() {
            self.key
                .seal_in_place_separate_tag(nonce(counter), Aad::from(&*aad), body)
                .map_err(|_| CryptoError::Short)?
        } else {
            self.plain_tag(counter, aad, body)?
        };
        rest[..TAG_LEN].copy_from_slice(tag.as_ref());
        Ok(len + TAG_LEN)
    }

    /// Opens in place: `buf[..aad_len]` is the header, the rest payload and tag.
    /// Returns the payload length (the plaintext is at `buf[aad_len..aad_len + n]`).
    pub fn open(&self, counter: u64, buf: &mut [u8], aad_len: usize) -> Result<usize, CryptoError> {
        if buf.len() < aad_len + TAG_LEN {
            return Err(CryptoError::Short);
        }
        if self.cipher.encrypts() {
            let (aad, body) = buf.split_at_mut(aad_len);
            return self
                .key
                .open_in_place(nonce(counter), Aad::from(&*aad), body)
                .map(|p| p.len())
                .map_err(|_| CryptoError::Auth);
        }
        let (signed, tag) = buf.split_at(buf.len() - TAG_LEN);
        let (aad, body) = signed.split_at(aad_len);
        let expected = self.plain_tag(counter, aad, body).map_err(|_| CryptoError::Auth)?;
        if bool::from(expected.as_ref().ct_eq(tag)) { Ok(body.len()) } else { Err(CryptoError::Auth) }
    }

    /// [`Cipher::AuthOnly`]'s tag: AES-128-GCM's over `body` with `aad`, sealed in this
    /// thread's scratch copy so that `body` stays as it is.
    fn plain_tag(&self, counter: u64, aad: &[u8], body: &[u8]) -> Result<Tag, CryptoError> {
        SCRATCH.with_borrow_mut(|s| {
            s.clear();
            s.extend_from_slice(body);
            self.key.seal_in_place_separate_tag(nonce(counter), Aad::from(aad), s).map_err(|_| CryptoError::Short)
        })
    }
}

thread_local! {
    /// Where [`DataKey::plain_tag`] seals a copy of the payload: as large as the
    /// largest packet or record this thread has tagged (at most 64 KiB).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AAD: [u8; 16] = [4, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0];

    fn round_trip(cipher: Cipher, len: usize) {
        let k = DataKey::new(cipher, &[7u8; 32]);
        let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut buf = AAD.to_vec();
        buf.extend_from_slice(&plain);
        buf.resize(16 + len + TAG_LEN, 0);
        let n = k.seal(9, &mut buf, 16, len).unwrap();
        assert_eq!(n, len + cipher.overhead());
        if cipher.encrypts() && len > 0 {
            assert_ne!(&buf[16..16 + len], &plain[..], "ciphertext must differ from plaintext");
        } else {
            assert_eq!(&buf[16..16 + len], &plain[..], "none leaves the payload readable");
        }
        let m = k.open(9, &mut buf[..16 + n], 16).unwrap();
        assert_eq!(&buf[16..16 + m], &plain[..]);
    }

    #[test]
    fn every_cipher_round_trips() {
        for c in Cipher::ALL {
            for len in [0, 1, 64, 1420, 9000] {
                round_trip(c, len);
            }
        }
    }

    #[test]
    fn tampering_is_rejected_in_every_mode() {
        for c in Cipher::ALL {
            let k = DataKey::new(c, &[1u8; 32]);
            let mut sealed = AAD.to_vec();
            sealed.resize(16 + 100 + TAG_LEN, 0x33);
            let n = 16 + k.seal(5, &mut sealed, 16, 100).unwrap();
            for i in [0, 1, 15, 16, 66, 115, 116, n - 1] {
                let mut b = sealed.clone();
                b[i] ^= 0x80;
                assert_eq!(k.open(5, &mut b[..n], 16), Err(CryptoError::Auth), "{c} byte {i}");
            }
            // Wrong counter, wrong key, truncated, tag stripped.
            assert_eq!(k.open(6, &mut sealed.clone()[..n], 16), Err(CryptoError::Auth), "{c}");
            let other = DataKey::new(c, &[2u8; 32]);
            assert_eq!(other.open(5, &mut sealed.clone()[..n], 16), Err(CryptoError::Auth), "{c}");
            assert_eq!(k.open(5, &mut sealed.clone()[..20], 16), Err(CryptoError::Short), "{c}");
            assert_eq!(k.open(5, &mut sealed.clone()[..n - TAG_LEN], 16), Err(CryptoError::Auth), "{c}");
            assert_eq!(k.open(5, &mut sealed.clone()[..n], 16), Ok(100), "{c}");
        }
    }

    /// `none`'s tag is the one AES-128-GCM gives the same payload under the same key,
    /// counter and header (its forgery bound is AES-128-GCM's), while the payload stays
    /// readable.
    #[test]
    fn none_tags_as_aes_128_gcm_and_leaves_the_payload() {
        let material = [5u8; 32];
        for len in [0, 1, 100, 1420, 65_000] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let seal = |cipher| {
                let mut b = AAD.to_vec();
                b.extend_from_slice(&plain);
                b.resize(16 + len + TAG_LEN, 0);
                let n = DataKey::new(cipher, &material).seal(11, &mut b, 16, len).unwrap();
                b.truncate(16 + n);
                b
            };
            let (none, aes) = (seal(Cipher::AuthOnly), seal(Cipher::Aes128Gcm));
            assert_eq!(&none[16..16 + len], &plain[..], "{len}: payload readable");
            assert_eq!(none[16 + len..], aes[16 + len..], "{len}: AES-128-GCM's tag");
        }
    }

    #[test]
    fn none_never_accepts_an_untagged_packet() {
        // A packet built by someone without the session key: header and payload as
        // they would be in plaintext mode, followed by anything.
        let k = DataKey::new(Cipher::AuthOnly, &[3u8; 32]);
        let mut forged = AAD.to_vec();
        forged.extend_from_slice(&[0x45; 40]);
        for tail in [vec![], vec![0u8; TAG_LEN], vec![0xffu8; TAG_LEN]] {
            let mut b = forged.clone();
            b.extend_from_slice(&tail);
            assert!(k.open(9, &mut b, 16).is_err());
        }
    }

    /// RFC 8439 §2.8.2 test vector, through our nonce layout (constant prefix 07000000
    /// followed by the little-endian counter 0x4746454443424140).
    #[test]
    fn chacha20_poly1305_rfc8439_vector() {
        let key: [u8; 32] = core::array::from_fn(|i| 0x80 + i as u8);
        let aad = [0x50, 0x51, 0x52, 0x53, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7];
        let plain = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.";
        let k = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).unwrap());
        let mut n = [0u8; 12];
        n[0] = 7;
        n[4..].copy_from_slice(&0x4746_4544_4342_4140u64.to_le_bytes());
        let mut buf = plain.to_vec();
        let tag = k.seal_in_place_separate_tag(Nonce::assume_unique_for_key(n), Aad::from(&aad), &mut buf).unwrap();
        assert_eq!(&buf[..8], &[0xd3, 0x1a, 0x8d, 0x34, 0x64, 0x8e, 0x60, 0xdb]);
        assert_eq!(
            tag.as_ref(),
            &[0x1a, 0xe1, 0x0b, 0x59, 0x4f, 0x09, 0xe2, 0x6a, 0x7e, 0x90, 0x2e, 0xcb, 0xd0, 0x60, 0x06, 0x91]
        );
    }

    #[test]
    fn cipher_names_parse() {
        for c in Cipher::ALL {
            assert_eq!(c.name().parse::<Cipher>().unwrap(), c);
            assert_eq!(Cipher::from_wire_id(c.wire_id()), Some(c));
        }
        assert!("xor".parse::<Cipher>().is_err());
        assert_eq!(Cipher::from_wire_id(9), None);
        // The first `none`'s id: its tags do not verify here.
        assert_eq!(Cipher::from_wire_id(0), None);
    }
}
