//! Data-plane AEAD: seal and open in place with counter nonces and the header as AAD.
//!
//! Keys come out of the handshake (see [`crate::handshake`]); this module never
//! derives or stores secrets beyond the `ring` key it wraps.

use std::fmt;
use std::str::FromStr;

use ring::aead::{AES_128_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
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
    /// No data encryption or authentication: the handshake is still authenticated,
    /// but tunnel packets travel in plaintext. For trusted links and benchmarks only.
    InsecureNone,
}

impl Cipher {
    /// All ciphers, in wire-id order.
    pub const ALL: [Self; 3] = [Self::InsecureNone, Self::Aes128Gcm, Self::ChaCha20Poly1305];

    /// The command-line and config spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aes128Gcm => "aes-128-gcm",
            Self::ChaCha20Poly1305 => "chacha20-poly1305",
            Self::InsecureNone => "none",
        }
    }

    /// The id carried in handshake payloads.
    pub fn wire_id(self) -> u8 {
        match self {
            Self::InsecureNone => 0,
            Self::Aes128Gcm => 1,
            Self::ChaCha20Poly1305 => 2,
        }
    }

    /// Inverse of [`Cipher::wire_id`].
    pub fn from_wire_id(id: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.wire_id() == id)
    }

    /// Bytes the cipher appends to every packet.
    pub fn overhead(self) -> usize {
        match self {
            Self::InsecureNone => 0,
            _ => TAG_LEN,
        }
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
    key: Option<LessSafeKey>,
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataKey").field("cipher", &self.cipher).finish_non_exhaustive()
    }
}

impl DataKey {
    /// Builds a key from 32 bytes of key material (AES-128 uses the first 16).
    pub fn new(cipher: Cipher, material: &[u8; 32]) -> Self {
        let key = match cipher {
            Cipher::InsecureNone => None,
            Cipher::Aes128Gcm => UnboundKey::new(&AES_128_GCM, &material[..16]).ok(),
            Cipher::ChaCha20Poly1305 => UnboundKey::new(&CHACHA20_POLY1305, material).ok(),
        }
        .map(LessSafeKey::new);
        // The key lengths above are the algorithms' own, so `UnboundKey::new` cannot fail
        // for a real cipher; a `None` here would mean ring changed its contract.
        debug_assert!(key.is_some() || cipher == Cipher::InsecureNone);
        Self { cipher, key }
    }

    /// The cipher of this key.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// Seals `buf[..len]` in place under `counter`, authenticating `aad`, and appends the
    /// tag at `buf[len..len + 16]`. Returns the sealed length.
    pub fn seal(&self, counter: u64, aad: &[u8], buf: &mut [u8], len: usize) -> Result<usize, CryptoError> {
        let Some(key) = &self.key else { return Ok(len) };
        if buf.len() < len + TAG_LEN {
            return Err(CryptoError::Short);
        }
        let (body, rest) = buf.split_at_mut(len);
        let tag =
            key.seal_in_place_separate_tag(nonce(counter), Aad::from(aad), body).map_err(|_| CryptoError::Short)?;
        rest[..TAG_LEN].copy_from_slice(tag.as_ref());
        Ok(len + TAG_LEN)
    }

    /// Opens `buf` (ciphertext and tag) in place; returns the plaintext length.
    pub fn open(&self, counter: u64, aad: &[u8], buf: &mut [u8]) -> Result<usize, CryptoError> {
        let Some(key) = &self.key else { return Ok(buf.len()) };
        if buf.len() < TAG_LEN {
            return Err(CryptoError::Short);
        }
        key.open_in_place(nonce(counter), Aad::from(aad), buf).map(|p| p.len()).map_err(|_| CryptoError::Auth)
    }
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
        let mut buf = plain.clone();
        buf.resize(len + TAG_LEN, 0);
        let n = k.seal(9, &AAD, &mut buf, len).unwrap();
        assert_eq!(n, len + cipher.overhead());
        if cipher != Cipher::InsecureNone && len > 0 {
            assert_ne!(&buf[..len], &plain[..], "ciphertext must differ from plaintext");
        }
        let m = k.open(9, &AAD, &mut buf[..n]).unwrap();
        assert_eq!(&buf[..m], &plain[..]);
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
    fn tampering_is_rejected() {
        for c in [Cipher::Aes128Gcm, Cipher::ChaCha20Poly1305] {
            let k = DataKey::new(c, &[1u8; 32]);
            let mut sealed = vec![0u8; 100 + TAG_LEN];
            let n = k.seal(5, &AAD, &mut sealed, 100).unwrap();
            for i in [0, 50, 99, 100, n - 1] {
                let mut b = sealed.clone();
                b[i] ^= 0x80;
                assert_eq!(k.open(5, &AAD, &mut b[..n]), Err(CryptoError::Auth), "{c} byte {i}");
            }
            // Wrong counter, wrong header, wrong key, truncated.
            assert_eq!(k.open(6, &AAD, &mut sealed.clone()[..n]), Err(CryptoError::Auth));
            let mut aad = AAD;
            aad[1] = 1;
            assert_eq!(k.open(5, &aad, &mut sealed.clone()[..n]), Err(CryptoError::Auth));
            let other = DataKey::new(c, &[2u8; 32]);
            assert_eq!(other.open(5, &AAD, &mut sealed.clone()[..n]), Err(CryptoError::Auth));
            assert_eq!(k.open(5, &AAD, &mut sealed.clone()[..10]), Err(CryptoError::Short));
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
    }
}
