//! Admission of handshakes: which datagrams may cost this node a Diffie-Hellman.
//! mac1 (the network's key) first, then a token bucket per source, then under load a
//! cookie round trip (mac2) that a spoofed source never completes, then room in the
//! pending tables. WireGuard's scheme, with relayed senders and their neighbours
//! budgeted apart.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;
use weft_core::admission::{Bucket, Cookie, CookieSecret, MacKeys, Which, mac1_of};
use weft_core::endpoint::Endpoint;
use weft_core::handshake::Stamp;
use weft_core::wire::HandshakeHeader;

use crate::identity::{NodeId, PeerKey};

/// XX responders waiting for their finish message, at most.
pub const MAX_PENDING_RESP: usize = 1024;
/// Finished handshakes waiting for the peer's proof of the PSK, at most.
pub const MAX_HELD: usize = 1024;

/// Inits a second (after mac1) above which the node is under load and answers inits
/// without a valid mac2 with a cookie instead of a Diffie-Hellman.
pub const LOAD_INITS_PER_SEC: u32 = 250;
/// Inits a second each source address (or relayed sender) may start, and its burst.
pub const SOURCE_RATE: f64 = 20.0;
/// Burst of [`SOURCE_RATE`].
pub const SOURCE_BURST: f64 = 40.0;
/// Relayed inits a second one relaying neighbour may bring us, whatever sender ids it
/// writes (a member relaying for itself could otherwise mint a bucket per frame).
pub const RELAY_RATE: f64 = 4.0 * SOURCE_RATE;
/// Burst of [`RELAY_RATE`].
pub const RELAY_BURST: f64 = 4.0 * SOURCE_BURST;
/// Source buckets kept at most (full ones are forgotten first).
const MAX_BUCKETS: usize = 4096;
/// The cookie secret rotates this often; a cookie we received is used this long.
const COOKIE_LIFETIME: Duration = Duration::from_secs(120);
/// Cookies we hold for destinations, at most.
const MAX_COOKIES: usize = 1024;
/// Static keys whose last IK init stamp we remember, at most (the oldest stamp is
/// forgotten first: a key that has not dialled for longest).
const MAX_STAMPS: usize = 8192;

/// What admission control did with handshake datagrams (status counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Handshake, reject or cookie datagrams whose mac1 did not verify.
    pub bad_mac: u64,
    /// Inits dropped by a source's token bucket.
    pub rate_limited: u64,
    /// Inits answered with a cookie (under load, no valid mac2).
    pub cookies_sent: u64,
    /// Cookie replies we accepted (and resent our init with mac2).
    pub cookies_received: u64,
    /// Unproven handshakes (XX responders waiting for their finish, sessions waiting
    /// for their first packet) dropped, oldest first, to make room for new ones.
    pub evicted: u64,
    /// IK inits dropped after their Diffie-Hellman because their stamp was not later
    /// than the last one the same key sent (replays of captured inits).
    pub replayed: u64,
    /// Whether the node is under load right now.
    pub under_load: bool,
}

/// Whom a handshake rate bucket belongs to: a source address, a relayed sender
/// (relays only forward frames from their authenticated neighbours), or the
/// neighbour relaying them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Source {
    Ip(IpAddr),
    Node(NodeId),
    Relay(IpAddr),
}

impl Source {
    /// Its bucket's rate and burst.
    pub(crate) fn limits(self) -> (f64, f64) {
        match self {
            Self::Ip(_) | Self::Node(_) => (SOURCE_RATE, SOURCE_BURST),
            Self::Relay(_) => (RELAY_RATE, RELAY_BURST),
        }
    }
}

/// Where a cookie we hold applies: an endpoint, and the node behind a relay.
pub(crate) type CookieDest = (Endpoint, Option<[u8; 8]>);

/// The size of the tables an admitted handshake would grow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tables {
    /// XX responders waiting for their finish.
    pub(crate) pending: usize,
    /// Finished handshakes waiting for the peer's proof.
    pub(crate) held: usize,
}

/// What becomes of an init.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It may cost a Diffie-Hellman.
    Admit,
    /// Its source (or relay) spent its tokens.
    RateLimited,
    /// Under load, or asking for an answer larger than itself, without a valid mac2:
    /// send this cookie reply instead.
    Cookie(Vec<u8>),
}

/// The admission state of a node: MAC keys, source buckets, the load window, the
/// cookie secret and the cookies others gave us.
pub(crate) struct Gate {
    pub(crate) macs: Arc<MacKeys>,
    cookie_secret: CookieSecret,
    cookie_rotated: Option<Instant>,
    cookies: BTreeMap<CookieDest, (Cookie, Instant)>,
    buckets: BTreeMap<Source, Bucket>,
    load_window: Option<Instant>,
    load_count: u32,
    prev_load_count: u32,
    overloaded_until: Option<Instant>,
    stats: AdmissionStats,
    /// The last IK init stamp accepted from each static key.
    stamps: HashMap<PeerKey, Stamp>,
    /// The wall time of the last stamp we wrote into an IK init (each one is later
    /// than the last).
    our_stamp: Duration,
}

impl Gate {
    pub(crate) fn new(macs: Arc<MacKeys>, secret: [u8; 32]) -> Self {
        Self {
            macs,
            cookie_secret: CookieSecret::new(secret),
            cookie_rotated: None,
            cookies: BTreeMap::new(),
            buckets: BTreeMap::new(),
            load_window: None,
            load_count: 0,
            prev_load_count: 0,
            overloaded_until: None,
            stats: AdmissionStats::default(),
            stamps: HashMap::new(),
            our_stamp: Duration::ZERO,
        }
    }

    /// The body of a datagram whose mac1 verifies (a handshake, reject or cookie
    /// datagram that does not is counted).
    pub(crate) fn check_mac1<'a>(&mut self, bytes: &'a [u8], counted: bool) -> Option<(&'a [u8], Which)> {
        let body = self.macs.check_which(bytes);
        if body.is_none() && counted {
            self.stats.bad_mac += 1;
        }
        body
    }

    /// The runtime could not queue a handshake datagram: the next second is load.
    pub(crate) fn note_overload(&mut self, now: Instant) {
        self.overloaded_until = Some(now + Duration::from_secs(1));
    }

    /// What admission did so far.
    pub(crate) fn stats(&self, now: Instant, tables: Tables) -> AdmissionStats {
        AdmissionStats { under_load: self.under_load(now, tables), ..self.stats }
    }

    /// Whether an init (mac1 already verified) may cost us a Diffie-Hellman: its source
    /// has tokens left, and under load, or when our answer (`answer_len` bytes) would
    /// be larger than the init, it proves with mac2 that it receives at its address
    /// (else it gets a cookie, smaller than any init: an unproven sender never draws
    /// more bytes than it sent). A full pending or held table makes room by dropping
    /// its oldest unproven entry (the node does that), never by refusing.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        now_ms: u64,
        from: Endpoint,
        via: Option<NodeId>,
        hdr: HandshakeHeader,
        bytes: &[u8],
        answer_len: usize,
        tables: Tables,
        rng: &mut dyn RngCore,
    ) -> Verdict {
        // Rate per source address; a relayed init also per claimed sender (relays
        // only accept frames from their authenticated neighbours, but the sender id is
        // the relay's to write), and the relaying neighbour's address has a budget of
        // its own, so random sender ids buy nothing.
        let sources = match via {
            Some(v) => [Some(Source::Node(v)), Some(Source::Relay(from.addr.ip()))],
            None => [Some(Source::Ip(from.addr.ip())), None],
        };
        for source in sources.into_iter().flatten() {
            if !self.take_token(source, now_ms) {
                self.stats.rate_limited += 1;
                return Verdict::RateLimited;
            }
        }
        // Load: inits a second past mac1, or a full queue in the runtime.
        match self.load_window {
            Some(start) if now.duration_since(start) < Duration::from_secs(1) => {
                self.load_count = self.load_count.saturating_add(1);
            }
            last => {
                // The window that just ended still counts for one more second.
                let recent = last.is_some_and(|s| now.duration_since(s) < Duration::from_secs(2));
                self.prev_load_count = if recent { self.load_count } else { 0 };
                self.load_window = Some(now);
                self.load_count = 1;
            }
        }
        if self.cookie_rotated.is_none_or(|t| now.duration_since(t) >= COOKIE_LIFETIME) {
            let mut random = [0u8; 32];
            rng.fill_bytes(&mut random);
            self.cookie_secret.rotate(random);
            self.cookie_rotated = Some(now);
        }
        let cookie_source = cookie_source(from, via);
        let must_prove = self.under_load(now, tables) || answer_len > bytes.len();
        if must_prove && !self.cookie_secret.check_mac2(&cookie_source, bytes) {
            let cookie = self.cookie_secret.cookie_for(&cookie_source);
            let mut nonce = [0u8; 12];
            rng.fill_bytes(&mut nonce);
            self.stats.cookies_sent += 1;
            return Verdict::Cookie(self.macs.cookie_reply(hdr.sender_index, &mac1_of(bytes), &cookie, nonce));
        }
        Verdict::Admit
    }

    /// Takes a token of `source`'s bucket; false when it has none (or no bucket can be
    /// made: the table is full of busy ones). Full buckets are forgotten first, each
    /// judged by its own kind's limits.
    fn take_token(&mut self, source: Source, now_ms: u64) -> bool {
        if self.buckets.len() >= MAX_BUCKETS && !self.buckets.contains_key(&source) {
            self.buckets.retain(|s, b| {
                let (rate, burst) = s.limits();
                !b.is_full(rate, burst, now_ms)
            });
        }
        let (rate, burst) = source.limits();
        if self.buckets.len() >= MAX_BUCKETS && !self.buckets.contains_key(&source) {
            return false;
        }
        self.buckets.entry(source).or_insert_with(|| Bucket::full(burst, now_ms)).take(rate, burst, now_ms)
    }

    /// Under load: more than [`LOAD_INITS_PER_SEC`] inits in the current one-second
    /// window or the one before it, a full queue in the last second, or the pending or
    /// held table half full (replayed inits from many spoofed sources, each below the
    /// rate, would otherwise fill them and keep real members out: under load they get
    /// cookies, which a spoofed source never receives).
    pub(crate) fn under_load(&self, now: Instant, tables: Tables) -> bool {
        if tables.pending >= MAX_PENDING_RESP / 2 || tables.held >= MAX_HELD / 2 {
            return true;
        }
        let busy = self.load_window.is_some_and(|s| {
            let age = now.duration_since(s);
            (age < Duration::from_secs(1)
                && (self.load_count > LOAD_INITS_PER_SEC || self.prev_load_count > LOAD_INITS_PER_SEC))
                || (age < Duration::from_secs(2) && self.load_count > LOAD_INITS_PER_SEC)
        });
        busy || self.overloaded_until.is_some_and(|t| now < t)
    }

    /// An unproven handshake was dropped to make room for a new one.
    pub(crate) fn count_evicted(&mut self) {
        self.stats.evicted += 1;
    }

    /// The stamp of an IK init we make at `wall` (time since 1970): later than any
    /// we made before, even within one clock tick.
    pub(crate) fn next_stamp(&mut self, wall: Duration) -> Stamp {
        self.our_stamp = wall.max(self.our_stamp + Duration::from_nanos(1));
        Stamp::from_unix(self.our_stamp)
    }

    /// Whether an IK init from `key` carrying `stamp` is new (and remember it): a
    /// stamp no later than the last one accepted from the key is a replay, and so is
    /// an unstamped init from a key that stamped before (only releases before 0.2.0
    /// send none). Counted when refused.
    pub(crate) fn accept_stamp(&mut self, key: PeerKey, stamp: Option<Stamp>) -> bool {
        let last = self.stamps.get(&key).copied();
        let fresh = match (stamp, last) {
            (Some(s), Some(l)) => s > l,
            (Some(_), None) | (None, None) => true,
            (None, Some(_)) => false,
        };
        if !fresh {
            self.stats.replayed += 1;
            return false;
        }
        if let Some(s) = stamp {
            if self.stamps.len() >= MAX_STAMPS
                && !self.stamps.contains_key(&key)
                && let Some(oldest) = self.stamps.iter().min_by_key(|(_, s)| **s).map(|(k, _)| *k)
            {
                self.stamps.remove(&oldest);
            }
            self.stamps.insert(key, s);
        }
        true
    }

    /// Keeps a cookie a responder gave us for `to` (the oldest goes when full).
    pub(crate) fn keep_cookie(&mut self, to: CookieDest, cookie: Cookie, now: Instant) {
        self.stats.cookies_received += 1;
        if self.cookies.len() >= MAX_COOKIES
            && let Some(oldest) = self.cookies.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k)
        {
            self.cookies.remove(&oldest);
        }
        self.cookies.insert(to, (cookie, now));
    }

    /// The cookie we hold for `to`, while it is fresh.
    pub(crate) fn cookie(&self, to: &CookieDest, now: Instant) -> Option<Cookie> {
        self.cookies.get(to).filter(|(_, got)| now.duration_since(*got) < COOKIE_LIFETIME).map(|(c, _)| *c)
    }
}

/// What a cookie is bound to: the source endpoint, or a relayed sender's node id and
/// the relaying neighbour it came through (a cookie another member opened cannot be
/// used through another neighbour).
fn cookie_source(from: Endpoint, via: Option<NodeId>) -> Vec<u8> {
    match via {
        Some(v) => [&b"node "[..], &v.to_bytes(), b" via ", from.to_string().as_bytes()].concat(),
        None => from.to_string().into_bytes(),
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their own epoch
mod tests {
    use rand::SeedableRng;
    use weft_core::handshake::Psk;
    use weft_core::wire::{MessageType, Pattern};

    use super::*;

    #[test]
    fn an_init_is_admitted_rate_limited_or_sent_a_cookie() {
        let macs = Arc::new(MacKeys::new(&Psk::derive("net", "a secret of some length")));
        let mut gate = Gate::new(macs, [7; 32]);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let now = Instant::now();
        let hdr = HandshakeHeader {
            kind: MessageType::HandshakeInit,
            pattern: Pattern::Ik,
            sender_index: 1,
            receiver_index: 0,
        };
        let bytes = vec![0u8; 148];
        let idle = Tables { pending: 0, held: 0 };
        let from = Endpoint::udp("192.0.2.1:1000".parse().unwrap());
        for _ in 0..SOURCE_BURST as usize {
            assert_eq!(gate.admit(now, 1, from, None, hdr, &bytes, 100, idle, &mut rng), Verdict::Admit);
        }
        assert_eq!(gate.admit(now, 1, from, None, hdr, &bytes, 100, idle, &mut rng), Verdict::RateLimited);
        // Another source while the held table is half full: load, so a cookie first.
        let other = Endpoint::udp("192.0.2.2:1000".parse().unwrap());
        let busy = Tables { pending: 0, held: MAX_HELD / 2 };
        assert!(matches!(gate.admit(now, 1, other, None, hdr, &bytes, 100, busy, &mut rng), Verdict::Cookie(_)));
        let s = gate.stats(now, busy);
        assert_eq!((s.rate_limited, s.cookies_sent, s.under_load), (1, 1, true));
        assert!(!gate.stats(now, idle).under_load, "load came from the tables only");
        // Without load, an init asking for more bytes than it carries proves its
        // address first: the cookie is smaller than the init.
        let third = Endpoint::udp("192.0.2.3:1000".parse().unwrap());
        let Verdict::Cookie(c) = gate.admit(now, 1, third, None, hdr, &bytes, 149, idle, &mut rng) else {
            panic!("a larger answer than the init needs a cookie")
        };
        assert!(c.len() < bytes.len());
        assert_eq!(gate.admit(now, 1, third, None, hdr, &bytes, 148, idle, &mut rng), Verdict::Admit);
    }

    #[test]
    fn ik_stamps_must_grow_per_key_and_ours_always_do() {
        let macs = Arc::new(MacKeys::new(&Psk::derive("net", "a secret of some length")));
        let mut gate = Gate::new(macs, [7; 32]);
        let (a, b) = (PeerKey([1; 32]), PeerKey([2; 32]));
        let t = |s| Some(Stamp::from_unix(Duration::from_secs(s)));
        assert!(gate.accept_stamp(a, None), "a release before stamps");
        assert!(gate.accept_stamp(a, t(100)));
        assert!(!gate.accept_stamp(a, t(100)), "the same init again");
        assert!(!gate.accept_stamp(a, t(99)), "an older one");
        assert!(!gate.accept_stamp(a, None), "an unstamped one from a key that stamps");
        assert!(gate.accept_stamp(b, t(50)), "stamps are per key");
        assert!(gate.accept_stamp(a, t(101)));
        assert_eq!(gate.stats(Instant::now(), Tables { pending: 0, held: 0 }).replayed, 3);

        let wall = Duration::from_secs(1_800_000_000);
        let first = gate.next_stamp(wall);
        let second = gate.next_stamp(wall);
        let third = gate.next_stamp(wall - Duration::from_secs(5));
        assert!(first < second && second < third, "one tick, or a clock stepped back, still grows");
        assert!(gate.next_stamp(wall + Duration::from_secs(1)) > third);
    }
}
