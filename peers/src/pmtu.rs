//! Packetization-layer path MTU discovery (RFC 8899) for one member's path, and the
//! check of UDP segmentation offload on it. Probes are padded control messages the
//! member acknowledges: a path that silently drops large packets (a black hole: no
//! ICMP ever comes back) is measured by what arrives, not by what routers say.
//!
//! A search sends one probe of every size of the ladder at once, and again a second
//! later (up to three rounds, fewer when the largest size is answered); the largest
//! acknowledged in any round is the path's MTU. Then the MTU is confirmed every
//! [`STEADY_EVERY`], beside a small probe, and the next size up tried now and then;
//! two rounds in a row where the small probe is answered and the MTU's is not (a black
//! hole appeared, not mere loss) start a new search. During a search a batch of
//! probes of a small size also goes as one segmentation-offloaded send: when the
//! single probe of that size is answered in every round and none of the batch ever
//! is, the path loses GSO batches and its datagrams go one by one. The batch goes
//! again beside every [`BATCH_EVERY`]th confirmation, with a single probe of its
//! size: an offload that breaks on a path already measured (a kernel or NIC change
//! under a running tunnel) is found the same way, two such rounds in a row.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use weft_core::endpoint::Endpoint;

/// Inner packet sizes a search tries (those up to the TUN's MTU, and the MTU itself).
const LADDER: [u16; 19] =
    [1500, 1480, 1460, 1440, 1420, 1400, 1380, 1360, 1340, 1320, 1300, 1280, 1260, 1240, 1220, 1200, 1100, 1000, 576];
/// A search round waits this long for its acknowledgements.
pub(crate) const ROUND: Duration = Duration::from_millis(1000);
/// Rounds of a search before it settles on the largest size acknowledged.
const SEARCH_ROUNDS: u32 = 3;
/// Rounds of a search that send the GSO batch; also the confirmations in a row whose
/// batch is lost while its size passes alone that find a broken offload.
const BATCH_ROUNDS: u32 = 2;
/// Once the MTU is found, every this many confirmations carry the GSO batch.
const BATCH_EVERY: u32 = 4;
/// The small probe sent beside each confirmation: a path that answers it and not the
/// MTU's lost large packets, not just packets.
const SMALL: u16 = 576;
/// The MTU is confirmed this often once found.
pub(crate) const STEADY_EVERY: Duration = Duration::from_secs(2);
/// Confirmations in a row that go unanswered before a new search.
const MISSES: u32 = 2;
/// Every this many confirmations, the next size up is tried too.
const UP_EVERY: u32 = 8;
/// A relayed path is measured once it has stayed relayed this long (most become
/// direct within a second, by punching: probes through the relay would be wasted).
const RELAYED_SETTLE: Duration = Duration::from_secs(10);
/// A search that got no answer at all is tried again after this.
const RETRY_AFTER: Duration = Duration::from_secs(20);
/// Size of the probes sent as one GSO batch, and how many.
pub(crate) const GSO_PROBE_SIZE: u16 = 1000;
pub(crate) const GSO_PROBE_COUNT: usize = 6;

/// One probe to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe {
    pub(crate) nonce: u64,
    /// Its size as an inner packet would be (the control message's length).
    pub(crate) size: u16,
    /// Part of the GSO batch.
    pub(crate) batch: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Searching, in round `n`.
    Search(u32),
    /// Found; `misses` confirmations in a row unanswered, `rounds` confirmations sent,
    /// `batch_misses` confirmations in a row whose batch was lost while its size
    /// passed alone.
    Steady { misses: u32, rounds: u32, batch_misses: u32 },
}

/// What the path of one member carries.
#[derive(Debug, Clone)]
pub(crate) struct PathMtu {
    /// The path measured (the first hop's endpoint and whether it is relayed): the
    /// measurement starts again when it changes.
    path: Option<(Endpoint, bool)>,
    /// The largest inner packet the path carried (0: not known yet).
    pub(crate) mtu: u16,
    state: State,
    /// Probes of the current round.
    sent: Vec<Probe>,
    /// Sizes acknowledged in the current round; whether a batch probe was.
    acked: BTreeSet<u16>,
    batch_acked: bool,
    /// Over the whole search: the largest size acknowledged, the rounds that sent the
    /// batch and that had its size answered alone, whether any of the batch was.
    best: Option<u16>,
    batch_rounds: u32,
    batch_single_rounds: u32,
    batch_ok: bool,
    /// When the next round starts.
    pub(crate) next: Option<Instant>,
    /// The path loses GSO batches (found by the last search).
    pub(crate) gso_broken: bool,
    /// Searches finished and MTU drops seen (for status and logs).
    pub(crate) searches: u32,
}

impl Default for PathMtu {
    fn default() -> Self {
        Self {
            path: None,
            mtu: 0,
            state: State::Search(0),
            sent: Vec::new(),
            acked: BTreeSet::new(),
            batch_acked: false,
            best: None,
            batch_rounds: 0,
            batch_single_rounds: 0,
            batch_ok: false,
            next: None,
            gso_broken: false,
            searches: 0,
        }
    }
}

/// What a round's end found out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing new.
    Nothing,
    /// A search settled on this MTU (it may be the same as before).
    Mtu(u16),
    /// The confirmed MTU stopped passing: searching again.
    Lost(u16),
    /// The path loses GSO batches.
    GsoBroken,
    /// A search got no answer at all: tried again after [`RETRY_AFTER`].
    NoAnswer,
}

impl PathMtu {
    /// The ladder's sizes up to `max` (the TUN's MTU), largest first, `max` included.
    fn ladder(max: u16) -> impl Iterator<Item = u16> {
        std::iter::once(max).chain(LADDER.into_iter().filter(move |s| *s < max))
    }

    /// Starts again when the member's path is no longer the one measured.
    pub(crate) fn follow(&mut self, path: (Endpoint, bool), now: Instant) {
        if self.path != Some(path) {
            let first = if path.1 { now + RELAYED_SETTLE } else { now };
            *self = Self { path: Some(path), next: Some(first), ..Self::default() };
        }
    }

    /// Whether a round is due.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|t| now >= t)
    }

    /// Ends the current round (what was acknowledged), starts the next: returns what
    /// the round found and the probes to send now (`nonce` draws their nonces).
    pub(crate) fn round(&mut self, now: Instant, max: u16, mut nonce: impl FnMut() -> u64) -> (Found, Vec<Probe>) {
        let found = self.finish_round();
        self.sent.clear();
        self.acked.clear();
        self.batch_acked = false;
        if found == Found::NoAnswer {
            self.next = Some(now + RETRY_AFTER);
            return (found, Vec::new());
        }
        let mut probe = |size: u16, batch: bool| Probe { nonce: nonce(), size, batch };
        let probes: Vec<Probe> = match self.state {
            State::Search(n) => {
                if n == 0 {
                    self.best = None;
                    self.batch_rounds = 0;
                    self.batch_single_rounds = 0;
                    self.batch_ok = false;
                }
                let mut v: Vec<Probe> = Self::ladder(max).map(|s| probe(s, false)).collect();
                if n < BATCH_ROUNDS && GSO_PROBE_SIZE <= max {
                    v.extend((0..GSO_PROBE_COUNT).map(|_| probe(GSO_PROBE_SIZE, true)));
                }
                self.next = Some(now + ROUND);
                v
            }
            State::Steady { rounds, .. } => {
                let mut v = vec![probe(self.mtu, false), probe(SMALL.min(self.mtu), false)];
                if rounds % UP_EVERY == UP_EVERY - 1
                    && let Some(up) = Self::ladder(max).filter(|s| *s > self.mtu).last()
                {
                    v.push(probe(up, false));
                }
                if rounds % BATCH_EVERY == 1 && !self.gso_broken && GSO_PROBE_SIZE <= self.mtu {
                    v.push(probe(GSO_PROBE_SIZE, false));
                    v.extend((0..GSO_PROBE_COUNT).map(|_| probe(GSO_PROBE_SIZE, true)));
                }
                self.next = Some(now + STEADY_EVERY);
                v
            }
        };
        self.sent.clone_from(&probes);
        (found, probes)
    }

    /// What the round that just ended found, and the state it leaves.
    fn finish_round(&mut self) -> Found {
        if self.sent.is_empty() {
            return Found::Nothing;
        }
        match self.state {
            State::Search(n) => {
                if self.sent.iter().any(|p| p.batch) {
                    self.batch_rounds += 1;
                    if self.acked.contains(&GSO_PROBE_SIZE) {
                        self.batch_single_rounds += 1;
                    }
                }
                self.batch_ok |= self.batch_acked;
                let best = self.acked.iter().next_back().copied().max(self.best);
                self.best = best;
                let top = self.sent.iter().map(|p| p.size).max();
                let settled = best.is_some() && ((best == top && n + 1 >= BATCH_ROUNDS) || n + 1 >= SEARCH_ROUNDS);
                if let (true, Some(mtu)) = (settled, best) {
                    self.mtu = mtu;
                    self.state = State::Steady { misses: 0, rounds: 0, batch_misses: 0 };
                    self.searches += 1;
                    // Every round that sent the batch had its size answered alone,
                    // and none of the batch ever was: not loss, the offload.
                    let broken = self.batch_rounds >= BATCH_ROUNDS
                        && self.batch_single_rounds == self.batch_rounds
                        && !self.batch_ok;
                    if broken && !self.gso_broken {
                        self.gso_broken = true;
                        return Found::GsoBroken;
                    }
                    return Found::Mtu(mtu);
                }
                if n + 1 >= SEARCH_ROUNDS {
                    // Nothing answered: try again later, measuring nothing meanwhile.
                    self.state = State::Search(0);
                    return Found::NoAnswer;
                }
                self.state = State::Search(n + 1);
                Found::Nothing
            }
            State::Steady { misses, rounds, batch_misses } => {
                // A round that sent the batch: lost while its size passed alone
                // counts towards a broken offload; any of it answered clears that.
                let batch_sent = self.sent.iter().any(|p| p.batch);
                let batch_misses = if self.batch_acked {
                    0
                } else if batch_sent && self.acked.contains(&GSO_PROBE_SIZE) {
                    batch_misses + 1
                } else {
                    batch_misses
                };
                if batch_misses >= BATCH_ROUNDS && !self.gso_broken {
                    self.gso_broken = true;
                    self.state = State::Steady { misses, rounds: rounds + 1, batch_misses: 0 };
                    return Found::GsoBroken;
                }
                let confirmed = self.acked.contains(&self.mtu);
                // Only a round where the small probe came back and the MTU's did not
                // counts against the MTU; with both lost it says nothing.
                let small_ok = self.acked.contains(&SMALL.min(self.mtu));
                let up = self.acked.iter().any(|s| *s > self.mtu);
                if up {
                    // A larger size passes now: search again, upwards.
                    self.state = State::Search(0);
                    return Found::Nothing;
                }
                if confirmed {
                    self.state = State::Steady { misses: 0, rounds: rounds + 1, batch_misses };
                    return Found::Nothing;
                }
                if !small_ok {
                    self.state = State::Steady { misses, rounds: rounds + 1, batch_misses };
                    return Found::Nothing;
                }
                if misses + 1 >= MISSES {
                    let lost = self.mtu;
                    self.state = State::Search(0);
                    return Found::Lost(lost);
                }
                self.state = State::Steady { misses: misses + 1, rounds: rounds + 1, batch_misses };
                Found::Nothing
            }
        }
    }

    /// A probe was acknowledged; false when it is none of ours in this round.
    pub(crate) fn ack(&mut self, nonce: u64) -> bool {
        let Some(p) = self.sent.iter().find(|p| p.nonce == nonce).copied() else { return false };
        if p.batch {
            self.batch_acked = true;
        } else {
            self.acked.insert(p.size);
        }
        true
    }

    /// Whether the last search measured the path.
    pub(crate) fn known(&self) -> bool {
        self.mtu != 0
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their own clock
mod tests {
    use super::*;

    fn ep(last: u8) -> (Endpoint, bool) {
        (std::net::SocketAddr::from(([192, 0, 2, last], 11010)).into(), false)
    }

    /// Runs rounds one `ROUND` apart from `*t` (every probe `passes` lets through is
    /// acknowledged) until one finds something other than nothing, at most `limit`.
    /// A measurement that follows a fresh path from now.
    fn following() -> (PathMtu, Instant) {
        let t = Instant::now();
        let mut m = PathMtu::default();
        m.follow(ep(1), t);
        (m, t)
    }

    fn until(m: &mut PathMtu, t: &mut Instant, passes: impl Fn(&Probe) -> bool, limit: u32) -> Option<Found> {
        let mut n = 0u64;
        for _ in 0..limit {
            let (found, probes) = m.round(*t, 1420, || {
                n += 1;
                n
            });
            *t += ROUND;
            for p in probes.iter().filter(|p| passes(p)) {
                assert!(m.ack(p.nonce));
            }
            if found != Found::Nothing {
                return Some(found);
            }
        }
        None
    }

    #[test]
    fn a_search_finds_the_largest_size_that_passes_and_a_black_hole_starts_another() {
        let (mut m, mut t) = following();
        assert!(m.due(t));
        let limit = std::cell::Cell::new(1220u16);
        let passes = |p: &Probe| p.size <= limit.get();
        assert_eq!(until(&mut m, &mut t, passes, 5), Some(Found::Mtu(1220)));
        assert_eq!(m.mtu, 1220);
        // Steady: confirmed while it passes.
        assert_eq!(until(&mut m, &mut t, passes, 5), None);
        // The path shrinks below it: the small probe passes and the MTU's does not.
        limit.set(1100);
        assert_eq!(until(&mut m, &mut t, passes, 5), Some(Found::Lost(1220)));
        assert_eq!(until(&mut m, &mut t, passes, 5), Some(Found::Mtu(1100)));
    }

    #[test]
    fn loss_of_everything_is_not_a_black_hole() {
        let (mut m, mut t) = following();
        assert_eq!(until(&mut m, &mut t, |_| true, 5), Some(Found::Mtu(1420)));
        // Nothing comes back for a while (both probes lost each round): no new search.
        assert_eq!(until(&mut m, &mut t, |_| false, 10), None);
        assert_eq!(m.mtu, 1420);
    }

    #[test]
    fn the_full_size_passing_settles_soon_and_larger_sizes_are_tried_again() {
        let (mut m, mut t) = following();
        let t0 = t;
        assert_eq!(until(&mut m, &mut t, |_| true, 5), Some(Found::Mtu(1420)));
        assert!(t - t0 <= ROUND * 3, "took {:?}", t - t0);
        // A new path starts over.
        m.follow(ep(9), t);
        assert_eq!(m.mtu, 0);
        // From a smaller MTU, a larger size is tried now and then and found.
        let limit = std::cell::Cell::new(1300u16);
        let passes = |p: &Probe| p.size <= limit.get();
        assert_eq!(until(&mut m, &mut t, passes, 5), Some(Found::Mtu(1300)));
        limit.set(1420);
        assert_eq!(until(&mut m, &mut t, passes, 40), Some(Found::Mtu(1420)));
    }

    #[test]
    fn a_path_that_drops_gso_batches_is_found_and_one_that_does_not_is_not() {
        for (drops_batches, broken) in [(true, true), (false, false)] {
            let (mut m, mut t) = following();
            let passes = |p: &Probe| !(drops_batches && p.batch);
            let found = until(&mut m, &mut t, passes, 5);
            assert_eq!(found == Some(Found::GsoBroken), broken);
            assert_eq!(m.gso_broken, broken);
            assert_eq!(m.mtu, 1420);
        }
        // Heavy random loss (every other probe and every batch lost) is not taken for
        // a broken offload: the single probe must pass in every round.
        let (mut m, mut t) = following();
        let odd = std::cell::Cell::new(0u32);
        let lossy = |p: &Probe| {
            odd.set(odd.get() + 1);
            !p.batch && (p.size != GSO_PROBE_SIZE || odd.get() < 20)
        };
        until(&mut m, &mut t, lossy, 5);
        assert!(!m.gso_broken);
        // A path that answers nothing measures nothing, and waits before trying again.
        let (mut m, mut t) = following();
        assert_eq!(until(&mut m, &mut t, |_| false, 5), Some(Found::NoAnswer));
        assert!(!m.known());
        assert_eq!(m.next, Some(t - ROUND + RETRY_AFTER));
        // A stray acknowledgement is refused.
        assert!(!m.ack(u64::MAX));
    }

    #[test]
    fn an_offload_that_breaks_on_a_measured_path_is_found_by_the_confirmations() {
        let (mut m, mut t) = following();
        let broken = std::cell::Cell::new(false);
        let passes = |p: &Probe| !(broken.get() && p.batch);
        assert_eq!(until(&mut m, &mut t, passes, 5), Some(Found::Mtu(1420)));
        // Working batches: nothing found over many confirmations, and some carried one.
        let mut sent_batches = 0;
        for _ in 0..(BATCH_EVERY * 4) {
            let (found, probes) = m.round(t, 1420, || 7);
            t += STEADY_EVERY;
            sent_batches += probes.iter().filter(|p| p.batch).count();
            for p in &probes {
                m.ack(p.nonce);
            }
            assert_eq!(found, Found::Nothing);
        }
        assert!(sent_batches > 0, "no confirmation carried the batch");
        // The offload breaks: found within two batch rounds, and not searched again.
        broken.set(true);
        let t0 = t;
        assert_eq!(until(&mut m, &mut t, passes, BATCH_EVERY * 3), Some(Found::GsoBroken));
        assert!(m.gso_broken);
        assert_eq!(m.mtu, 1420);
        assert!(t - t0 <= ROUND * BATCH_EVERY * 3);
        // Once off, confirmations carry no batch.
        for _ in 0..(BATCH_EVERY * 2) {
            let (_, probes) = m.round(t, 1420, || 9);
            t += STEADY_EVERY;
            assert!(probes.iter().all(|p| !p.batch));
        }
    }

    #[test]
    fn a_lost_batch_beside_a_lost_single_probe_of_its_size_is_loss_not_the_offload() {
        let (mut m, mut t) = following();
        assert_eq!(until(&mut m, &mut t, |_| true, 5), Some(Found::Mtu(1420)));
        // Every probe of the batch's size is lost, alone or batched (a burst of loss
        // at that size): no verdict on the offload.
        let passes = |p: &Probe| p.size != GSO_PROBE_SIZE;
        assert_eq!(until(&mut m, &mut t, passes, BATCH_EVERY * 6), None);
        assert!(!m.gso_broken);
    }
}
