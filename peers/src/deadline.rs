//! The engine's timers: one deadline per key, in a table ordered by time, so that
//! the runtime sleeps until [`Deadlines::next`] (quinn's `poll_timeout` shape) and a
//! wake-up runs only what is due, never a sweep of every peer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Deadlines by key; each key has at most one.
#[derive(Debug)]
pub(crate) struct Deadlines<K: Ord + Copy> {
    by_time: BTreeSet<(Instant, K)>,
    by_key: BTreeMap<K, Instant>,
}

impl<K: Ord + Copy> Default for Deadlines<K> {
    fn default() -> Self {
        Self { by_time: BTreeSet::new(), by_key: BTreeMap::new() }
    }
}

impl<K: Ord + Copy> Deadlines<K> {
    /// Sets (or with `None` clears) `key`'s deadline.
    pub(crate) fn set(&mut self, key: K, at: Option<Instant>) {
        if let Some(old) = self.by_key.remove(&key) {
            self.by_time.remove(&(old, key));
        }
        if let Some(at) = at {
            self.by_key.insert(key, at);
            self.by_time.insert((at, key));
        }
    }

    /// Moves `key`'s deadline earlier to `at` (or sets it); a later `at` changes
    /// nothing.
    pub(crate) fn at_most(&mut self, key: K, at: Instant) {
        if self.by_key.get(&key).is_none_or(|old| at < *old) {
            self.set(key, Some(at));
        }
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.by_time.first().map(|(t, _)| *t)
    }

    /// Removes and returns the keys due at `now`, earliest first.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Vec<K> {
        let mut due = Vec::new();
        while let Some(&(t, k)) = self.by_time.first() {
            if t > now {
                break;
            }
            self.by_time.pop_first();
            self.by_key.remove(&k);
            due.push(k);
        }
        due
    }

    /// Number of keys with a deadline.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their own epoch
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn earliest_first_one_per_key() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut d = Deadlines::default();
        d.set(1, Some(s(5)));
        d.set(2, Some(s(3)));
        d.set(1, Some(s(4)));
        assert_eq!(d.next(), Some(s(3)));
        assert_eq!(d.len(), 2);
        d.at_most(2, s(9));
        assert_eq!(d.next(), Some(s(3)), "a later deadline does not move an earlier one");
        d.at_most(3, s(1));
        assert_eq!(d.pop_due(s(4)), vec![3, 2, 1]);
        assert_eq!(d.next(), None);
        d.set(4, Some(s(2)));
        d.set(4, None);
        assert_eq!(d.next(), None);
    }
}
