//! The birthday method's bounds. The hard side (endpoint-dependent NAT) opens
//! [`BIRTHDAY_SOCKETS`] fresh sockets and sends one keepalive from each to the easy
//! side's endpoint: its NAT makes as many mappings, each on an unknown port, each
//! letting the easy side's endpoint in. The easy side sends keepalives to the hard
//! side's public address on [`BIRTHDAY_PROBES`] random ports per round: every probe
//! opens its own (endpoint-independent) NAT for the port it goes to, and one that hits
//! a mapped port reaches a socket of the hard side, which answers from it. With 256
//! mappings among ~64,500 ports, a round of 256 probes finds one with probability
//! 1 − (1 − 256/64512)^256 ≈ 64 %; [`BIRTHDAY_ROUNDS`] rounds miss all with ~0.03 %.

use std::time::{Duration, Instant};

/// Sockets (so NAT mappings) the hard side opens per round.
pub const BIRTHDAY_SOCKETS: usize = 256;
/// How long the hard side's sockets wait for a probe before they close.
pub const BIRTHDAY_HOLD: Duration = Duration::from_secs(4);
/// Probes per round, at most.
pub const BIRTHDAY_PROBES: u32 = 256;
/// Probes per second, at most (sent in bursts of a tenth every [`BIRTHDAY_TICK`]).
pub const BIRTHDAY_RATE: u32 = 100;
/// How often a burst of probes goes.
pub const BIRTHDAY_TICK: Duration = Duration::from_millis(100);
/// The first probe of a round waits this long after asking the hard side to open
/// its mappings (the request crosses the relay).
pub const BIRTHDAY_LEAD: Duration = Duration::from_millis(200);
/// A round starts at most this often.
pub const BIRTHDAY_EVERY: Duration = Duration::from_secs(4);
/// Rounds in a row before pausing.
pub const BIRTHDAY_ROUNDS: u32 = 8;
/// The pause after [`BIRTHDAY_ROUNDS`] unanswered rounds.
pub const BIRTHDAY_PAUSE: Duration = Duration::from_secs(300);
/// The hard side sends its sockets' keepalives in bursts of this many, one burst
/// every [`BIRTHDAY_TICK`]: a set of [`BIRTHDAY_SOCKETS`] goes out within 0.8 s
/// (ahead of the easy side's probes, which start after [`BIRTHDAY_LEAD`] and come
/// at a third of that pace), never as one burst of 256 packets.
pub const OPEN_BURST: usize = 32;
/// Sets of mappings the hard side opens for one peer before pausing for
/// [`BIRTHDAY_PAUSE`]: one per easy side's round, and as many for its own punches.
pub const OPEN_SETS: u32 = 2 * BIRTHDAY_ROUNDS;
/// The least time between two sets for one peer.
pub const OPEN_EVERY: Duration = Duration::from_secs(2);

/// The lowest port a NAT hands out (Linux picks from 1024–65535 for a source
/// port above 1023).
pub const PORT_MIN: u16 = 1024;

/// The easy side's probing of one peer: rounds, and the probes of the current one.
#[derive(Debug, Clone)]
pub struct Birthday {
    /// Rounds started since the last pause.
    rounds: u32,
    /// When the current round's first probe may go (None: no round running).
    round_start: Option<Instant>,
    /// Probes sent in the current round.
    sent: u32,
    /// Ports probed in the current round (never twice in one).
    ports: Vec<u16>,
    /// No round starts before this.
    next_round: Instant,
    /// Probes sent since probing began, and rounds (for status).
    pub total_probes: u64,
    /// Rounds started since probing began.
    pub total_rounds: u32,
}

impl Birthday {
    /// Probing that may start a round at once.
    pub fn new(now: Instant) -> Self {
        Self {
            rounds: 0,
            round_start: None,
            sent: 0,
            ports: Vec::new(),
            next_round: now,
            total_probes: 0,
            total_rounds: 0,
        }
    }

    /// Starts a round when one is due: the caller then asks the hard side to open
    /// its mappings. After [`BIRTHDAY_ROUNDS`] rounds probing pauses for
    /// [`BIRTHDAY_PAUSE`].
    pub fn start_round(&mut self, now: Instant) -> bool {
        if now < self.next_round {
            return false;
        }
        if self.rounds >= BIRTHDAY_ROUNDS {
            self.rounds = 0;
            self.round_start = None;
            self.next_round = now + BIRTHDAY_PAUSE;
            return false;
        }
        self.rounds += 1;
        self.total_rounds += 1;
        self.round_start = Some(now + BIRTHDAY_LEAD);
        self.sent = 0;
        self.ports.clear();
        self.next_round = now + BIRTHDAY_EVERY;
        true
    }

    /// The ports to probe now: as many as the rate allows since the round began,
    /// at most [`BIRTHDAY_PROBES`] in the round, none twice; `random` gives
    /// candidate ports (any u16; those below [`PORT_MIN`] are skipped).
    pub fn due(&mut self, now: Instant, mut random: impl FnMut() -> u16) -> Vec<u16> {
        let Some(start) = self.round_start else { return Vec::new() };
        if now < start {
            return Vec::new();
        }
        let burst = BIRTHDAY_RATE / 10;
        let ticks = (now - start).as_millis() / BIRTHDAY_TICK.as_millis();
        let allowed = (ticks as u64 + 1).saturating_mul(u64::from(burst)).min(u64::from(BIRTHDAY_PROBES)) as u32;
        let n = allowed.saturating_sub(self.sent);
        let mut out = Vec::with_capacity(n as usize);
        // Bounded: a random source that keeps repeating gives fewer ports, never a
        // longer loop.
        let mut tries = 0;
        while out.len() < n as usize && tries < 16 * n {
            tries += 1;
            let p = random();
            if p >= PORT_MIN && !self.ports.contains(&p) {
                self.ports.push(p);
                out.push(p);
            }
        }
        self.sent += n;
        self.total_probes += out.len() as u64;
        if self.sent >= BIRTHDAY_PROBES {
            self.round_start = None;
        }
        out
    }

    /// Whether a round is sending probes.
    pub fn probing(&self) -> bool {
        self.round_start.is_some()
    }

    /// When [`Birthday::due`] or [`Birthday::start_round`] next has work.
    pub fn deadline(&self) -> Instant {
        match self.round_start {
            Some(start) => {
                let burst = BIRTHDAY_RATE / 10;
                start + BIRTHDAY_TICK * (self.sent / burst)
            }
            None => self.next_round,
        }
    }
}

/// The hard side's sets of mappings for one peer: whoever asks (the easy side's
/// rounds, or this node's own punches), a set goes at most every [`OPEN_EVERY`], and
/// after [`OPEN_SETS`] sets no more for [`BIRTHDAY_PAUSE`]. A quiet spell as long as
/// the pause starts the count afresh.
#[derive(Debug, Clone, Default)]
pub struct Opener {
    /// Sets since the count last started.
    sets: u32,
    /// No set before this.
    next: Option<Instant>,
    /// When the last set was opened.
    last: Option<Instant>,
    /// Mappings opened since start (for status).
    pub total: u64,
}

impl Opener {
    /// Whether a set may be opened now; if so it is counted.
    pub fn open(&mut self, now: Instant) -> bool {
        if self.next.is_some_and(|t| now < t) {
            return false;
        }
        if self.last.is_some_and(|l| now.saturating_duration_since(l) >= BIRTHDAY_PAUSE) {
            self.sets = 0;
        }
        if self.sets >= OPEN_SETS {
            self.sets = 0;
            self.last = None;
            self.next = Some(now + BIRTHDAY_PAUSE);
            return false;
        }
        self.sets += 1;
        self.last = Some(now);
        self.next = Some(now + OPEN_EVERY);
        self.total += BIRTHDAY_SOCKETS as u64;
        true
    }
}

/// When the keepalive of a set's `i`-th socket goes, after the set was opened: in
/// bursts of [`OPEN_BURST`] every [`BIRTHDAY_TICK`].
pub fn open_at(i: usize) -> Duration {
    BIRTHDAY_TICK * u32::try_from(i / OPEN_BURST).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their own epoch
mod tests {
    use super::*;

    /// Drives probing every `step` for `span`, counting what went out when.
    fn drive(b: &mut Birthday, t0: Instant, step: Duration, span: Duration) -> Vec<(Duration, usize, bool)> {
        let mut out = Vec::new();
        let mut seed = 12345u32;
        let mut now = t0;
        while now < t0 + span {
            let started = b.start_round(now);
            let ports = b.due(now, || {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (seed >> 16) as u16
            });
            out.push((now - t0, ports.len(), started));
            now += step;
        }
        out
    }

    #[test]
    fn a_round_sends_at_most_its_probes_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Birthday::new(t0);
        let log = drive(&mut b, t0, Duration::from_millis(7), BIRTHDAY_EVERY - Duration::from_millis(1));
        let sent: usize = log.iter().map(|l| l.1).sum();
        assert_eq!(sent, BIRTHDAY_PROBES as usize, "one round, all its probes");
        assert_eq!(log.iter().filter(|l| l.2).count(), 1);
        // Never faster than the rate: in any window of w ms after the lead, at most
        // rate * w / 1000 + one burst.
        for (i, (t, _, _)) in log.iter().enumerate() {
            for w in [100u64, 500, 1000] {
                let until = *t + Duration::from_millis(w);
                let in_window: usize = log[i..].iter().take_while(|l| l.0 < until).map(|l| l.1).sum();
                let cap = (u64::from(BIRTHDAY_RATE) * w / 1000 + u64::from(BIRTHDAY_RATE / 10)) as usize;
                assert!(in_window <= cap, "{in_window} probes in {w} ms from {t:?}");
            }
        }
        // Nothing before the lead.
        assert!(log.iter().take_while(|l| l.0 < BIRTHDAY_LEAD).all(|l| l.1 == 0));
    }

    #[test]
    fn rounds_are_spaced_bounded_and_then_pause() {
        let t0 = Instant::now();
        let mut b = Birthday::new(t0);
        let span = BIRTHDAY_EVERY * (BIRTHDAY_ROUNDS + 2);
        let log = drive(&mut b, t0, Duration::from_millis(50), span);
        let starts: Vec<Duration> = log.iter().filter(|l| l.2).map(|l| l.0).collect();
        assert_eq!(starts.len(), BIRTHDAY_ROUNDS as usize);
        assert!(starts.windows(2).all(|w| w[1] - w[0] >= BIRTHDAY_EVERY));
        let sent: usize = log.iter().map(|l| l.1).sum();
        assert_eq!(sent as u64, u64::from(BIRTHDAY_ROUNDS) * u64::from(BIRTHDAY_PROBES));
        assert_eq!(b.total_probes, sent as u64);
        // Paused: nothing more until the pause is over, then a new round.
        let later = t0 + span;
        assert!(!b.start_round(later) && b.deadline() > later + BIRTHDAY_PAUSE / 2);
        assert!(b.start_round(b.deadline()));
    }

    #[test]
    fn ports_are_above_the_minimum_and_never_repeat_in_a_round() {
        let t0 = Instant::now();
        let mut b = Birthday::new(t0);
        assert!(b.start_round(t0));
        let mut next = 0u16;
        let mut all = Vec::new();
        let mut now = t0;
        while b.probing() {
            now += BIRTHDAY_TICK;
            // A poor source: counts up from 0 and wraps at 2,000 (repeats).
            all.extend(b.due(now, || {
                next = (next + 1) % 2000;
                next
            }));
        }
        assert!(all.iter().all(|p| *p >= PORT_MIN));
        let mut d = all.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), all.len());
        // The source repeats: fewer ports than probes, and the loop still ended.
        assert!(all.len() <= BIRTHDAY_PROBES as usize);
        // A source that gives nothing usable ends too.
        let mut b = Birthday::new(t0);
        b.start_round(t0);
        assert!(b.due(t0 + Duration::from_secs(1), || 80).len() <= 1);
    }

    #[test]
    fn the_hard_side_opens_sets_spaced_bounded_and_then_pauses() {
        let t0 = Instant::now();
        let mut o = Opener::default();
        // Asked every 100 ms for ten minutes (a peer asking far too often).
        let mut opened = Vec::new();
        let mut now = t0;
        while now < t0 + Duration::from_secs(600) {
            if o.open(now) {
                opened.push(now - t0);
            }
            now += Duration::from_millis(100);
        }
        assert!(opened.windows(2).all(|w| w[1] - w[0] >= OPEN_EVERY), "{opened:?}");
        // OPEN_SETS sets, a pause, OPEN_SETS more: never more in any pause-long window.
        for (i, t) in opened.iter().enumerate() {
            let within = opened[i..].iter().take_while(|u| **u < *t + BIRTHDAY_PAUSE).count();
            assert!(within <= OPEN_SETS as usize, "{within} sets within a pause from {t:?}");
        }
        assert_eq!(opened.len(), 2 * OPEN_SETS as usize, "{opened:?}");
        assert!(opened[OPEN_SETS as usize] - opened[OPEN_SETS as usize - 1] >= BIRTHDAY_PAUSE);
        assert_eq!(o.total, opened.len() as u64 * BIRTHDAY_SOCKETS as u64);
    }

    #[test]
    fn a_quiet_spell_starts_the_hard_sides_count_afresh() {
        let t0 = Instant::now();
        let mut o = Opener::default();
        let mut now = t0;
        for _ in 0..OPEN_SETS - 1 {
            assert!(o.open(now));
            now += OPEN_EVERY;
        }
        // Quiet for a pause: the next ones are a new count, not the last of the old.
        now += BIRTHDAY_PAUSE;
        for _ in 0..OPEN_SETS {
            assert!(o.open(now));
            now += OPEN_EVERY;
        }
        assert!(!o.open(now), "the count's end pauses");
    }

    #[test]
    fn a_set_goes_out_in_bursts_ahead_of_the_probes() {
        let at: Vec<Duration> = (0..BIRTHDAY_SOCKETS).map(open_at).collect();
        // Never more than a burst in one tick.
        for t in &at {
            assert!(at.iter().filter(|u| *u == t).count() <= OPEN_BURST);
        }
        // Every mapping is open before the easy side could have sent that many probes.
        for (i, t) in at.iter().enumerate() {
            let probes_by_then = (t.saturating_sub(BIRTHDAY_LEAD).as_millis() / BIRTHDAY_TICK.as_millis() + 1) as usize
                * (BIRTHDAY_RATE / 10) as usize;
            assert!(i + 1 >= probes_by_then.min(BIRTHDAY_PROBES as usize) || *t < BIRTHDAY_LEAD, "socket {i} at {t:?}");
        }
        assert!(*at.last().unwrap() < Duration::from_secs(1));
    }
}
