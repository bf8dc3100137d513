//! Logins of the web console: the login token (Jupyter's model: printed once, in the
//! address to open), the sessions it buys, their expiry and their CSRF tokens.
//! Pure: the clock and the random bytes are handed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "weft_session";
/// The header a state-changing request carries its session's CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-weft-csrf";
/// A session unused this long ends, whatever its lifetime.
pub(crate) const IDLE: Duration = Duration::from_secs(3600);
/// At most this many sessions at once: a new one replaces the least recently used.
const MAX_SESSIONS: usize = 64;

/// One login.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// What a state-changing request must carry in [`CSRF_HEADER`].
    pub(crate) csrf: String,
    created: Instant,
    used: Instant,
}

/// The login token and the sessions it bought.
#[derive(Debug)]
pub(crate) struct Sessions {
    token: String,
    lifetime: Duration,
    live: HashMap<String, Session>,
}

impl Sessions {
    /// Sessions bought with `token`, each lasting at most `lifetime`.
    pub(crate) fn new(token: String, lifetime: Duration) -> Self {
        Self { token, lifetime, live: HashMap::new() }
    }

    /// Whether `given` is the login token (compared in constant time).
    pub(crate) fn token_matches(&self, given: &str) -> bool {
        !given.is_empty() && bool::from(given.as_bytes().ct_eq(self.token.as_bytes()))
    }

    /// A new session for a correct token: its id (the cookie's value) and CSRF token
    /// come from `random` (two 32-byte draws, as hex).
    pub(crate) fn open(&mut self, now: Instant, mut random: impl FnMut() -> [u8; 32]) -> (String, Session) {
        self.expire(now);
        if self.live.len() >= MAX_SESSIONS
            && let Some(oldest) = self.live.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| k.clone())
        {
            self.live.remove(&oldest);
        }
        let id = hex(&random());
        let s = Session { csrf: hex(&random()), created: now, used: now };
        self.live.insert(id.clone(), s.clone());
        (id, s)
    }

    /// The live session with cookie value `id`, marked used at `now`; `None` when it is
    /// unknown, past its lifetime or idle too long (then it is forgotten).
    pub(crate) fn check(&mut self, now: Instant, id: &str) -> Option<Session> {
        let lifetime = self.lifetime;
        let s = self.live.get_mut(id)?;
        if expired(s, lifetime, now) {
            self.live.remove(id);
            return None;
        }
        s.used = now;
        Some(s.clone())
    }

    /// Ends the session with cookie value `id` (logout).
    pub(crate) fn close(&mut self, id: &str) {
        self.live.remove(id);
    }

    /// How long a session lasts at most (the cookie's Max-Age).
    pub(crate) fn lifetime(&self) -> Duration {
        self.lifetime
    }

    fn expire(&mut self, now: Instant) {
        let lifetime = self.lifetime;
        self.live.retain(|_, s| !expired(s, lifetime, now));
    }
}

/// Whether session `s` is past its lifetime or has been idle too long at `now`.
fn expired(s: &Session, lifetime: Duration, now: Instant) -> bool {
    now.saturating_duration_since(s.created) >= lifetime || now.saturating_duration_since(s.used) >= IDLE
}

/// Whether the CSRF token a request carried is its session's (constant time).
pub(crate) fn csrf_matches(session: &Session, given: Option<&str>) -> bool {
    given.is_some_and(|g| !g.is_empty() && bool::from(g.as_bytes().ct_eq(session.csrf.as_bytes())))
}

/// The value of cookie `name` in a `Cookie` header.
pub(crate) fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').filter_map(|kv| kv.trim().split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v.trim())
}

/// 32 random bytes from the OS, as the login token's or a session's material.
pub(crate) fn random32() -> [u8; 32] {
    let mut b = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    b
}

/// Lowercase hex.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> impl FnMut() -> [u8; 32] {
        let mut n = 0u8;
        move || {
            n += 1;
            [n; 32]
        }
    }

    #[test]
    fn only_the_token_opens_a_session_and_sessions_expire_by_age_and_by_idleness() {
        let t0 = Instant::now();
        let mut s = Sessions::new("secret-token".into(), Duration::from_secs(3 * 3600));
        assert!(s.token_matches("secret-token"));
        for bad in ["", "secret-toke", "secret-token2", "SECRET-TOKEN"] {
            assert!(!s.token_matches(bad), "{bad:?}");
        }
        let mut r = counter();
        let (id, sess) = s.open(t0, &mut r);
        assert_eq!(id.len(), 64);
        assert_ne!(id, sess.csrf, "the cookie and the CSRF token are different secrets");
        assert!(s.check(t0 + Duration::from_secs(10), &id).is_some());
        assert!(s.check(t0, "nope").is_none());
        // Used every 50 minutes, it lives until its lifetime ends.
        for m in [50, 100, 150] {
            assert!(s.check(t0 + Duration::from_secs(m * 60), &id).is_some(), "{m} min");
        }
        assert!(s.check(t0 + Duration::from_secs(3 * 3600), &id).is_none(), "past its lifetime");
        assert!(s.check(t0 + Duration::from_secs(10), &id).is_none(), "forgotten once expired");
        // Idle for an hour, it ends sooner.
        let (id2, _) = s.open(t0, &mut r);
        assert!(s.check(t0 + IDLE, &id2).is_none());
        // Logout.
        let (id3, _) = s.open(t0, &mut r);
        s.close(&id3);
        assert!(s.check(t0, &id3).is_none());
    }

    #[test]
    fn sessions_are_bounded_and_csrf_and_cookies_are_read_exactly() {
        let t0 = Instant::now();
        let mut s = Sessions::new("t".into(), Duration::from_secs(3600));
        let mut n = 0u64;
        let mut r = move || {
            n += 1;
            let mut b = [0u8; 32];
            b[..8].copy_from_slice(&n.to_le_bytes());
            b
        };
        let (first, sess) = s.open(t0, &mut r);
        for i in 1..=MAX_SESSIONS as u64 {
            s.open(t0 + Duration::from_millis(i), &mut r);
        }
        assert_eq!(s.live.len(), MAX_SESSIONS);
        assert!(s.check(t0, &first).is_none(), "the least recently used session made room");
        assert!(csrf_matches(&sess, Some(&sess.csrf)));
        assert!(!csrf_matches(&sess, Some("")));
        assert!(!csrf_matches(&sess, None));
        assert!(!csrf_matches(&sess, Some(&sess.csrf[1..])));
        assert_eq!(cookie("a=1; weft_session=abc ; b=2", COOKIE), Some("abc"));
        assert_eq!(cookie("xweft_session=abc", COOKIE), None);
        assert_eq!(cookie("", COOKIE), None);
    }
}
