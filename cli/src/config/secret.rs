//! The network secret from the user's side: `weft secret generate` makes a strong one,
//! and [`estimate_bits`] tells `weft up` when the one given is weak.
//!
//! Why it matters: anyone who records a single handshake can test guesses of the
//! secret offline (each guess costs one Argon2id, see `weft_core::handshake::Psk`),
//! so the secret must be far beyond what a dictionary or brute force reaches.

use anyhow::{Context, Result};
use ring::rand::{SecureRandom, SystemRandom};

/// Below this estimate `weft up` warns.
pub const WEAK_BITS: f64 = 60.0;
/// Random bytes in a generated secret (256 bits).
const GENERATED_BYTES: usize = 32;
/// What one common word (or keyboard/number run) found in a secret is worth: about
/// the log2 of a 4000-word list of common passwords and words.
const WORD_BITS: f64 = 12.0;
/// What a character that repeats or continues a run (aaa, abc, 321) is worth.
const RUN_BITS: f64 = 1.0;

/// Words and runs that guessing tools try first (compared after undoing common
/// letter-for-digit swaps: 0→o, 1→i, 3→e, 4→a, 5→s, 7→t, @→a, $→s).
const COMMON: &[&str] = &[
    "password",
    "passwort",
    "passphrase",
    "secret",
    "letmein",
    "welcome",
    "qwerty",
    "qwertz",
    "azerty",
    "asdf",
    "zxcv",
    "iloveyou",
    "admin",
    "root",
    "login",
    "master",
    "dragon",
    "monkey",
    "shadow",
    "sunshine",
    "princess",
    "football",
    "baseball",
    "superman",
    "batman",
    "trustno",
    "changeme",
    "default",
    "network",
    "office",
    "mesh",
    "weft",
    "vpn",
    "test",
    "guest",
    "hello",
    "love",
    "summer",
    "winter",
    "spring",
    "autumn",
    "company",
    "server",
];

/// A new secret: 32 bytes from the operating system's random generator, base64url
/// without padding (43 characters, 256 bits).
pub fn generate() -> Result<String> {
    let mut bytes = [0u8; GENERATED_BYTES];
    SystemRandom::new().fill(&mut bytes).ok().context("the operating system's random generator failed")?;
    Ok(base64url(&bytes))
}

fn base64url(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, x)| n | u32::from(*x) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(A[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// A simple estimate of a secret's strength in bits, as a guesser would see it:
///
/// * the alphabet is the union of the classes present: lower case 26, upper case 26,
///   digits 10, ASCII symbols and space 33, anything else 100; each character is
///   worth log2 of that;
/// * a common word or keyboard run from a short built-in list (after undoing leet swaps) is
///   worth 12 bits in all, however long;
/// * a character equal to the previous one or next to it in code (aaa, abc, 987)
///   is worth 1 bit.
///
/// It overrates long phrases of ordinary words (it knows only a short list), so
/// it is a floor for warnings, not a proof of strength.
pub fn estimate_bits(secret: &str) -> f64 {
    let chars: Vec<char> = secret.chars().collect();
    let mut pool = 0u32;
    type Class = (fn(&char) -> bool, u32);
    let classes: [Class; 4] = [
        (char::is_ascii_lowercase, 26),
        (char::is_ascii_uppercase, 26),
        (char::is_ascii_digit, 10),
        (|c: &char| c.is_ascii_punctuation() || *c == ' ', 33),
    ];
    for (member, size) in classes {
        if chars.iter().any(member) {
            pool += size;
        }
    }
    if chars.iter().any(|c| !c.is_ascii_alphanumeric() && !c.is_ascii_punctuation() && *c != ' ') {
        pool += 100;
    }
    let per_char = f64::from(pool.max(1)).log2();

    let plain: Vec<char> = chars.iter().map(|c| unleet(*c)).collect();
    let mut covered = vec![false; chars.len()];
    let mut bits = 0.0;
    let mut words: Vec<&str> = COMMON.to_vec();
    words.sort_by_key(|w| std::cmp::Reverse(w.len()));
    for w in words {
        let w: Vec<char> = w.chars().collect();
        let mut i = 0;
        while i + w.len() <= plain.len() {
            if plain[i..i + w.len()] == w[..] && !covered[i..i + w.len()].iter().any(|c| *c) {
                covered[i..i + w.len()].iter_mut().for_each(|c| *c = true);
                bits += WORD_BITS;
                i += w.len();
            } else {
                i += 1;
            }
        }
    }
    for (i, c) in chars.iter().enumerate() {
        if covered[i] {
            continue;
        }
        let run = i > 0 && (u32::from(*c)).abs_diff(u32::from(chars[i - 1])) <= 1;
        bits += if run { RUN_BITS } else { per_char };
    }
    bits
}

fn unleet(c: char) -> char {
    match c.to_ascii_lowercase() {
        '0' => 'o',
        '1' | '!' => 'i',
        '3' => 'e',
        '4' | '@' => 'a',
        '5' | '$' => 's',
        '7' => 't',
        l => l,
    }
}

/// Logs a loud warning when `secret` is weak (never the secret itself).
pub fn warn_if_weak(secret: &str) {
    let bits = estimate_bits(secret);
    if bits < WEAK_BITS {
        tracing::warn!(
            estimated_bits = bits.round(),
            "WEAK NETWORK SECRET: about {:.0} bits by a simple estimate (want at least {WEAK_BITS:.0}); anyone who records a single handshake of this network can guess it offline and join. Make a strong one with `weft secret generate` and give it to every member",
            bits
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_long_random_and_strong() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{a}");
        assert!(estimate_bits(&a) > 200.0, "{a}: {}", estimate_bits(&a));
    }

    #[test]
    fn base64url_vectors() {
        // RFC 4648 test vectors, url alphabet, no padding.
        for (raw, enc) in
            [("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE")]
        {
            assert_eq!(base64url(raw.as_bytes()), enc);
        }
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn estimates() {
        for weak in [
            "s3cret",
            "secret",
            "password123",
            "P@ssw0rd!",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "abcdefghijklmnopqrstuvwxyz",
            "weft-office",
            "qwertyqwertyqwerty",
            "12345678901234567890",
        ] {
            let b = estimate_bits(weak);
            assert!(b < WEAK_BITS, "{weak:?} rated {b:.0} bits");
        }
        for strong in ["Zq3-vT8pL2-xWn7-Kd4r-Hm9s", "vaporous giraffe juggles ninety lanterns", "kX9#mQ2$wL7!pR4&"] {
            let b = estimate_bits(strong);
            assert!(b >= WEAK_BITS, "{strong:?} rated {b:.0} bits");
        }
        // Exact arithmetic on a small case: "ab1" = one run letter.
        let per = 36f64.log2();
        assert!((estimate_bits("ab1") - (per + 1.0 + per)).abs() < 1e-9);
        assert!((estimate_bits("s3cret") - WORD_BITS).abs() < 1e-9);
        assert_eq!(estimate_bits(""), 0.0);
    }
}
