//! Handshake admission: what a node checks before it spends a Diffie-Hellman on a
//! datagram (WireGuard's mac1/mac2 and cookies, keyed by the network PSK).
//!
//! ```text
//! init, response, finish | header | noise | mac1 16 | mac2 16 |
//! reject                 | 8-byte reject           | mac1 16 |
//! cookie reply           | 7 0 0 0 | receiver u32 | nonce 12 | sealed cookie 16 + tag 16 | mac1 16 |
//! ```
//!
//! * `mac1 = HMAC-SHA256(subkey("mac1"), everything before it)[..16]`: only members know
//!   the key, so an outsider's datagram is dropped before snow is touched (and before it
//!   reaches the control plane's queue: the pipelines check it).
//! * Under load a responder answers an init whose `mac2` is not valid with a cookie
//!   reply instead of doing DH. `cookie = HMAC(secret rotated every 2 min, source)`,
//!   sealed with ChaCha20-Poly1305 under `subkey("cookie")` with the init's mac1 as
//!   associated data (a reply is only useful to whoever sent that init). The
//!   initiator resends with `mac2 = HMAC(cookie, everything before mac2)[..16]`; a
//!   spoofed source never sees its cookie, so it never passes.
//! * The cookie reply (68 bytes) is smaller than the smallest init (76): no
//!   amplification.
//!
//! Pure: no clock, no sockets; randomness comes from the caller.

use std::fmt;

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::hmac;

use crate::handshake::Psk;
use crate::wire::MessageType;

/// Length of one MAC.
pub const MAC_LEN: usize = 16;
/// Trailer of init, response and finish messages: mac1 and mac2.
pub const HANDSHAKE_MACS_LEN: usize = 2 * MAC_LEN;
/// Length of a cookie reply.
pub const COOKIE_REPLY_LEN: usize = 8 + 12 + MAC_LEN + 16 + MAC_LEN;

/// A cookie: proof that the holder receives datagrams at a source address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cookie(pub [u8; MAC_LEN]);

impl fmt::Debug for Cookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cookie(<redacted>)")
    }
}

/// How many bytes of MAC trail a message of this type (0: not a MACed type).
pub fn trailer_len(datagram: &[u8]) -> usize {
    match MessageType::of(datagram) {
        Some(MessageType::HandshakeInit | MessageType::HandshakeResponse | MessageType::HandshakeFinish) => {
            HANDSHAKE_MACS_LEN
        }
        Some(MessageType::Reject | MessageType::CookieReply) => MAC_LEN,
        _ => 0,
    }
}

/// Which of a network's two secrets: the current one, or the next one accepted
/// beside it while the secret rotates (`network-secret-next`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Which {
    /// The network secret.
    #[default]
    Current,
    /// The next network secret.
    Next,
}

/// The admission keys of one secret.
struct Keys {
    mac1: hmac::Key,
    cookie: LessSafeKey,
}

impl Keys {
    fn new(psk: &Psk) -> Self {
        let mac1 = hmac::Key::new(hmac::HMAC_SHA256, &psk.subkey(b"weft/v1/mac1"));
        // A 32-byte key is ChaCha20-Poly1305's own length: this cannot fail.
        #[allow(clippy::unwrap_used)]
        let cookie = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &psk.subkey(b"weft/v1/cookie")).unwrap());
        Self { mac1, cookie }
    }
}

/// The network's admission keys, derived from the PSK, and from the next PSK while
/// the secret rotates. Shared by the engine, the pipelines and the transports, and
/// changed in place on a reload ([`MacKeys::set`]).
pub struct MacKeys {
    sets: std::sync::RwLock<(Keys, Option<Keys>)>,
}

impl fmt::Debug for MacKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MacKeys(<redacted>)")
    }
}

impl MacKeys {
    /// Derives the keys of a network.
    pub fn new(psk: &Psk) -> Self {
        Self { sets: std::sync::RwLock::new((Keys::new(psk), None)) }
    }

    /// Replaces the keys: those of `current`, and of `next` accepted beside them.
    pub fn set(&self, current: &Psk, next: Option<&Psk>) {
        let sets = (Keys::new(current), next.map(Keys::new));
        *self.sets.write().unwrap_or_else(std::sync::PoisonError::into_inner) = sets;
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, (Keys, Option<Keys>)> {
        self.sets.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends the MAC trailer to a message of a MACed type: mac1, and for handshake
    /// messages mac2 (from `cookie`, or zeros). Returns the mac1 written.
    pub fn seal(&self, msg: &mut Vec<u8>, cookie: Option<&Cookie>) -> [u8; MAC_LEN] {
        self.seal_as(msg, cookie, Which::Current)
    }

    /// [`MacKeys::seal`] with the keys of secret `which` (the current one's when
    /// there is no next).
    pub fn seal_as(&self, msg: &mut Vec<u8>, cookie: Option<&Cookie>, which: Which) -> [u8; MAC_LEN] {
        let both = trailer_len(msg) == HANDSHAKE_MACS_LEN;
        let sets = self.read();
        let keys = match (which, &sets.1) {
            (Which::Next, Some(n)) => n,
            _ => &sets.0,
        };
        let mac1 = mac(&keys.mac1, msg);
        msg.extend_from_slice(&mac1);
        if both {
            match cookie {
                Some(c) => {
                    let m2 = mac(&hmac::Key::new(hmac::HMAC_SHA256, &c.0), msg);
                    msg.extend_from_slice(&m2);
                }
                None => msg.extend_from_slice(&[0; MAC_LEN]),
            }
        }
        mac1
    }

    /// Checks the mac1 of a MACed message; returns the message without its trailer.
    /// `None` for a message of another type, one too short, or a wrong mac1.
    pub fn check<'a>(&self, msg: &'a [u8]) -> Option<&'a [u8]> {
        self.check_which(msg).map(|(body, _)| body)
    }

    /// [`MacKeys::check`], saying which secret's key made the mac1.
    pub fn check_which<'a>(&self, msg: &'a [u8]) -> Option<(&'a [u8], Which)> {
        let t = trailer_len(msg);
        if t == 0 || msg.len() < t + 8 {
            return None;
        }
        let body_end = msg.len() - t;
        let got = &msg[body_end..body_end + MAC_LEN];
        let sets = self.read();
        if ct_eq(&mac(&sets.0.mac1, &msg[..body_end]), got) {
            return Some((&msg[..body_end], Which::Current));
        }
        let next = sets.1.as_ref()?;
        ct_eq(&mac(&next.mac1, &msg[..body_end]), got).then_some((&msg[..body_end], Which::Next))
    }

    /// Builds a cookie reply to an init whose sender index is `receiver_index` and
    /// whose mac1 was `init_mac1`. `nonce` must be fresh random bytes.
    pub fn cookie_reply(
        &self,
        receiver_index: u32,
        init_mac1: &[u8; MAC_LEN],
        cookie: &Cookie,
        nonce: [u8; 12],
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(COOKIE_REPLY_LEN);
        out.extend_from_slice(&[MessageType::CookieReply as u8, 0, 0, 0]);
        out.extend_from_slice(&receiver_index.to_le_bytes());
        out.extend_from_slice(&nonce);
        let mut sealed = cookie.0.to_vec();
        // Sealing 16 bytes cannot exceed ChaCha20-Poly1305's length limit.
        #[allow(clippy::unwrap_used)]
        let tag = self
            .read()
            .0
            .cookie
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(init_mac1), &mut sealed)
            .unwrap();
        out.extend_from_slice(&sealed);
        out.extend_from_slice(tag.as_ref());
        self.seal(&mut out, None);
        out
    }

    /// Opens a cookie reply (mac1 already checked or not): returns the index of our
    /// init it answers, then, given that init's mac1, the cookie.
    pub fn cookie_reply_index(reply: &[u8]) -> Option<u32> {
        if reply.len() != COOKIE_REPLY_LEN || MessageType::of(reply) != Some(MessageType::CookieReply) {
            return None;
        }
        Some(u32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]))
    }

    /// Decrypts the cookie of a reply to the init that carried `init_mac1`.
    pub fn open_cookie_reply(&self, reply: &[u8], init_mac1: &[u8; MAC_LEN]) -> Option<Cookie> {
        Self::cookie_reply_index(reply)?;
        let nonce: [u8; 12] = reply[8..20].try_into().ok()?;
        let sets = self.read();
        // Sealed with the responder's current secret: ours, or our next one.
        [Some(&sets.0), sets.1.as_ref()].into_iter().flatten().find_map(|k| {
            let mut sealed = reply[20..20 + MAC_LEN + 16].to_vec();
            let plain =
                k.cookie.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(init_mac1), &mut sealed).ok()?;
            Some(Cookie(plain.try_into().ok()?))
        })
    }
}

/// The mac1 field of a handshake message (zeros if it has none).
pub fn mac1_of(msg: &[u8]) -> [u8; MAC_LEN] {
    let t = trailer_len(msg);
    let mut out = [0u8; MAC_LEN];
    if t != 0 && msg.len() >= t {
        out.copy_from_slice(&msg[msg.len() - t..msg.len() - t + MAC_LEN]);
    }
    out
}

/// The responder's cookie secret: random, rotated by the caller every two minutes;
/// cookies from the previous secret stay valid until the next rotation.
pub struct CookieSecret {
    current: hmac::Key,
    previous: hmac::Key,
}

impl fmt::Debug for CookieSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CookieSecret(<redacted>)")
    }
}

impl CookieSecret {
    /// A secret from 32 random bytes.
    pub fn new(random: [u8; 32]) -> Self {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &random);
        Self { current: k.clone(), previous: k }
    }

    /// Moves to a new secret (the old one stays valid for one more period).
    pub fn rotate(&mut self, random: [u8; 32]) {
        self.previous = std::mem::replace(&mut self.current, hmac::Key::new(hmac::HMAC_SHA256, &random));
    }

    /// The cookie for a source (its address bytes, or a relayed sender's node id).
    pub fn cookie_for(&self, source: &[u8]) -> Cookie {
        Cookie(mac(&self.current, source))
    }

    /// Whether a handshake message carries a mac2 made with this source's cookie.
    pub fn check_mac2(&self, source: &[u8], msg: &[u8]) -> bool {
        if trailer_len(msg) != HANDSHAKE_MACS_LEN || msg.len() < HANDSHAKE_MACS_LEN + 8 {
            return false;
        }
        let (signed, got) = msg.split_at(msg.len() - MAC_LEN);
        [&self.current, &self.previous].into_iter().any(|secret| {
            let cookie = mac(secret, source);
            ct_eq(&mac(&hmac::Key::new(hmac::HMAC_SHA256, &cookie), signed), got)
        })
    }
}

/// HMAC-SHA256 of `data` truncated to [`MAC_LEN`] bytes (every MAC of Weft's wire:
/// handshakes, cookies, LAN beacons).
pub fn mac(key: &hmac::Key, data: &[u8]) -> [u8; MAC_LEN] {
    let tag = hmac::sign(key, data);
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&tag.as_ref()[..MAC_LEN]);
    out
}

/// Whether two MACs are equal, comparing every byte whatever the first difference.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token bucket: `rate` tokens a second up to `burst`, on the caller's clock (ms).
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    last_ms: u64,
}

impl Bucket {
    /// A full bucket at `now_ms`.
    pub fn full(burst: f64, now_ms: u64) -> Self {
        Self { tokens: burst, last_ms: now_ms }
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, rate: f64, burst: f64, now_ms: u64) -> bool {
        let dt = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = self.last_ms.max(now_ms);
        self.tokens = (self.tokens + dt * rate).min(burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full again at `now_ms` (it can be forgotten).
    pub fn is_full(&self, rate: f64, burst: f64, now_ms: u64) -> bool {
        self.tokens + now_ms.saturating_sub(self.last_ms) as f64 / 1000.0 * rate >= burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: &str) -> MacKeys {
        let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
        MacKeys::new(&Psk::from_bytes(d.as_ref().try_into().unwrap()))
    }

    fn init() -> Vec<u8> {
        let mut m = vec![1u8, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&[0x42; 32]);
        m
    }

    fn psk(secret: &str) -> Psk {
        let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
        Psk::from_bytes(d.as_ref().try_into().unwrap())
    }

    #[test]
    fn while_the_secret_rotates_both_are_accepted_and_each_is_named() {
        let (old, new) = (psk("old"), psk("new"));
        let rotating = MacKeys::new(&old);
        rotating.set(&old, Some(&new));
        let (only_old, only_new) = (MacKeys::new(&old), MacKeys::new(&new));
        for (sender, which) in [(&only_old, Which::Current), (&only_new, Which::Next)] {
            let mut m = init();
            sender.seal(&mut m, None);
            assert_eq!(rotating.check_which(&m).map(|(_, w)| w), Some(which));
        }
        // It seals with either; a node with only one of them reads only that one.
        let mut m = init();
        rotating.seal_as(&mut m, None, Which::Next);
        assert!(only_new.check(&m).is_some() && only_old.check(&m).is_none());
        // A cookie reply sealed with the responder's current secret opens with our next.
        let mut probe = init();
        let mac1 = rotating.seal_as(&mut probe, None, Which::Next);
        let reply = only_new.cookie_reply(7, &mac1, &Cookie([5; MAC_LEN]), [1; 12]);
        assert_eq!(rotating.open_cookie_reply(&reply, &mac1).map(|c| c.0), Some([5; MAC_LEN]));
        // Dropping the next secret stops accepting it.
        rotating.set(&new, None);
        let mut m = init();
        only_old.seal(&mut m, None);
        assert!(rotating.check(&m).is_none());
        assert_ne!(old.fingerprint(), new.fingerprint());
    }

    #[test]
    fn mac1_admits_members_only() {
        let (k, other) = (keys("a"), keys("b"));
        let mut m = init();
        k.seal(&mut m, None);
        assert_eq!(m.len(), 12 + 32 + HANDSHAKE_MACS_LEN);
        assert_eq!(k.check(&m), Some(&m[..44]));
        assert_eq!(other.check(&m), None, "another network's key");
        for i in 0..m.len() - MAC_LEN {
            let mut t = m.clone();
            t[i] ^= 1;
            assert_eq!(k.check(&t), None, "byte {i}");
        }
        // mac2 is not covered by mac1: it can change (a resend with a cookie).
        assert!(k.check(&m[..m.len() - 1]).is_none());
        assert!(k.check(&[1, 0, 0]).is_none());
        assert!(k.check(&[]).is_none());
        let mut data = vec![4u8; 60];
        k.seal(&mut data, None);
        assert!(k.check(&data).is_none(), "data packets carry no mac");
    }

    #[test]
    fn reject_carries_mac1_only() {
        let k = keys("a");
        let mut r = vec![5u8, 1, 0, 0, 9, 0, 0, 0];
        k.seal(&mut r, None);
        assert_eq!(r.len(), 8 + MAC_LEN);
        assert_eq!(k.check(&r), Some(&r[..8]));
    }

    #[test]
    fn cookie_round_trip_and_mac2() {
        let k = keys("a");
        let secret = CookieSecret::new([9; 32]);
        let src = b"udp 198.51.100.7:4000";
        let mut m = init();
        let mac1 = k.seal(&mut m, None);
        assert!(!secret.check_mac2(src, &m), "zeros are no mac2");
        let cookie = secret.cookie_for(src);
        let reply = k.cookie_reply(7, &mac1, &cookie, [3; 12]);
        assert_eq!(reply.len(), COOKIE_REPLY_LEN);
        assert!(reply.len() < m.len(), "no amplification");
        assert!(k.check(&reply).is_some());
        assert_eq!(MacKeys::cookie_reply_index(&reply), Some(7));
        assert_eq!(k.open_cookie_reply(&reply, &mac1), Some(cookie));
        assert_eq!(k.open_cookie_reply(&reply, &[0; 16]), None, "bound to the init it answers");
        assert_eq!(keys("b").open_cookie_reply(&reply, &mac1), None);
        // The resend carries mac2 from the cookie; valid for that source only.
        let mut again = init();
        k.seal(&mut again, Some(&cookie));
        assert!(k.check(&again).is_some());
        assert!(secret.check_mac2(src, &again));
        assert!(!secret.check_mac2(b"udp 198.51.100.8:4000", &again));
        // Survives one rotation, not two.
        let mut s = secret;
        s.rotate([10; 32]);
        assert!(s.check_mac2(src, &again));
        s.rotate([11; 32]);
        assert!(!s.check_mac2(src, &again));
    }

    #[test]
    fn bucket_limits_rate() {
        let mut b = Bucket::full(3.0, 0);
        assert!((0..3).all(|_| b.take(10.0, 3.0, 0)));
        assert!(!b.take(10.0, 3.0, 0));
        assert!(b.take(10.0, 3.0, 100));
        assert!(!b.take(10.0, 3.0, 100));
        assert!(!b.is_full(10.0, 3.0, 200));
        assert!(b.is_full(10.0, 3.0, 1000));
    }
}
