//! Sliding replay window over packet counters (RFC 6479 style bitmap ring).
//!
//! Two steps, so that forged packets cannot move the window: [`ReplayWindow::check`]
//! before decrypting (cheap rejection of replays and stale counters) and
//! [`ReplayWindow::mark`] only after the packet authenticated.

const WORD_BITS: u64 = 64;
const RING_WORDS: usize = 128;
/// How far behind the highest counter seen a packet may still arrive.
pub const WINDOW: u64 = (RING_WORDS as u64 - 1) * WORD_BITS;
/// Counters at or above this are never accepted (the sender must rekey long before).
pub const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);

/// Replay state of one receiving session.
#[derive(Clone)]
pub struct ReplayWindow {
    /// Highest counter marked so far (meaningful once `any` is true).
    top: u64,
    any: bool,
    ring: [u64; RING_WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self { top: 0, any: false, ring: [0; RING_WORDS] }
    }
}

impl std::fmt::Debug for ReplayWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayWindow").field("top", &self.top).finish_non_exhaustive()
    }
}

impl ReplayWindow {
    /// Whether `counter` would be accepted (not seen, not too old).
    pub fn check(&self, counter: u64) -> bool {
        if counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        if !self.any || counter > self.top {
            return true;
        }
        if self.top - counter >= WINDOW {
            return false;
        }
        let (word, bit) = Self::slot(counter);
        self.ring[word] & bit == 0
    }

    /// Records `counter` as received. Returns false if it was a replay or too old.
    pub fn mark(&mut self, counter: u64) -> bool {
        if !self.check(counter) {
            return false;
        }
        if !self.any || counter > self.top {
            let old_word = if self.any { self.top / WORD_BITS } else { counter / WORD_BITS };
            let new_word = counter / WORD_BITS;
            let clear = (new_word - old_word).min(RING_WORDS as u64);
            for i in 1..=clear {
                self.ring[((old_word + i) % RING_WORDS as u64) as usize] = 0;
            }
            if !self.any {
                self.ring[(new_word % RING_WORDS as u64) as usize] = 0;
            }
            self.top = counter;
            self.any = true;
        }
        let (word, bit) = Self::slot(counter);
        self.ring[word] |= bit;
        true
    }

    fn slot(counter: u64) -> (usize, u64) {
        (((counter / WORD_BITS) % RING_WORDS as u64) as usize, 1 << (counter % WORD_BITS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_and_duplicates() {
        let mut w = ReplayWindow::default();
        for c in 0..1000 {
            assert!(w.check(c));
            assert!(w.mark(c));
            assert!(!w.check(c));
            assert!(!w.mark(c));
        }
    }

    #[test]
    fn reordered_within_window_accepted_once() {
        let mut w = ReplayWindow::default();
        assert!(w.mark(20000));
        assert!(w.mark(19000));
        assert!(!w.mark(19000));
        assert!(w.mark(20000 - WINDOW + 1), "oldest counter inside the window");
        assert!(!w.check(20000 - WINDOW), "first counter outside the window");
        assert!(!w.check(0));
    }

    #[test]
    fn big_jump_clears_old_bits() {
        let mut w = ReplayWindow::default();
        for c in 0..200 {
            w.mark(c);
        }
        // Jump far ahead: every ring word is reused; the old bits must not leak into
        // the new positions that share their slot.
        let far = 200 + (RING_WORDS as u64) * WORD_BITS;
        assert!(w.mark(far));
        assert!(w.check(far - 1));
        // Words 128..130 reuse the ring slots of old words 0..2 and lie inside the window.
        assert!(w.check(8192 + 5));
        assert!(w.check(8300));
        assert!(!w.check(150), "too old now");
    }

    #[test]
    fn first_counter_may_be_nonzero() {
        let mut w = ReplayWindow::default();
        assert!(w.mark(70));
        assert!(w.check(69));
        assert!(w.mark(69));
        assert!(!w.mark(70));
    }

    #[test]
    fn limits() {
        let w = ReplayWindow::default();
        assert!(!w.check(REJECT_AFTER_MESSAGES));
        assert!(!w.check(u64::MAX));
        assert!(w.check(REJECT_AFTER_MESSAGES - 1));
    }

    #[test]
    fn check_does_not_mutate() {
        let mut w = ReplayWindow::default();
        w.mark(10);
        assert!(w.check(11));
        assert!(w.check(11));
        assert!(w.mark(11));
    }
}
