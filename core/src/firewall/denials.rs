//! The last flows a firewall denied, for the people who run the mesh (`weft status`'s
//! policy, the web console's policy page): a short list, newest first, where a flood
//! of one flow is one line with a count.
//!
//! Noting costs the deny path one atomic load and, at most once a millisecond, a lock
//! that is never waited for: a packet denied while another thread holds it, or within
//! the same millisecond as the last one noted, is counted in
//! [`Firewall::denied`](super::Firewall::denied) only. So `count` says how often a
//! flow was noted, a floor of how often it was denied.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use super::Packet;

/// Flows kept, newest first.
pub const RECENT_DENIALS: usize = 32;

/// A denied flow: what was denied, when first and last, how often noted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    /// Where it came from (a member's overlay address, or a host behind one).
    pub src: IpAddr,
    /// Where it went.
    pub dst: IpAddr,
    /// IP protocol number.
    pub proto: u8,
    /// Destination port (an ICMP echo: its identifier).
    pub dport: u16,
    /// When it was first and last noted (the pipelines' clock, milliseconds).
    pub first_ms: u64,
    /// When it was last noted.
    pub last_ms: u64,
    /// How often it was noted.
    pub count: u64,
}

impl Denial {
    fn same_flow(&self, p: &Packet) -> bool {
        self.src == p.src && self.dst == p.dst && self.proto == p.proto && self.dport == p.dport
    }
}

/// The recent denials of one firewall.
#[derive(Debug, Default)]
pub(super) struct Denials {
    /// One past the millisecond of the last note (0: none yet).
    next_ms: AtomicU64,
    list: Mutex<VecDeque<Denial>>,
}

impl Denials {
    /// Notes that `p` was denied at `now` (milliseconds), unless one was noted this
    /// millisecond or another thread is noting one.
    pub(super) fn note(&self, p: &Packet, now: u64) {
        let next = self.next_ms.load(Relaxed);
        if now < next || self.next_ms.compare_exchange(next, now + 1, Relaxed, Relaxed).is_err() {
            return;
        }
        let Some(mut list) = self.list.try_lock() else { return };
        let seen = list.iter().position(|d| d.same_flow(p)).and_then(|i| list.remove(i));
        let noted = match seen {
            Some(d) => Denial { last_ms: now, count: d.count + 1, ..d },
            None => {
                Denial { src: p.src, dst: p.dst, proto: p.proto, dport: p.dport, first_ms: now, last_ms: now, count: 1 }
            }
        };
        list.push_front(noted);
        list.truncate(RECENT_DENIALS);
    }

    /// The list, newest first.
    pub(super) fn recent(&self) -> Vec<Denial> {
        self.list.lock().iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::firewall::Fragment;

    fn packet(src: u8, dport: u16) -> Packet {
        Packet {
            src: Ipv4Addr::new(10, 126, 0, src).into(),
            dst: Ipv4Addr::new(10, 126, 0, 1).into(),
            proto: 6,
            sport: 40_000,
            dport,
            closing: false,
            syn: true,
            about: None,
            fragment: Fragment::Whole,
        }
    }

    #[test]
    fn one_line_per_flow_newest_first_at_most_one_note_a_millisecond() {
        let d = Denials::default();
        d.note(&packet(2, 22), 10);
        d.note(&packet(2, 22), 10); // same millisecond: not noted
        d.note(&packet(3, 80), 11);
        d.note(&packet(2, 22), 12); // the first flow again: moves to the front
        let r = d.recent();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].dport, r[0].count, r[0].first_ms, r[0].last_ms), (22, 2, 10, 12));
        assert_eq!((r[1].dport, r[1].count), (80, 1));
    }

    #[test]
    fn the_list_keeps_only_the_newest_flows() {
        let d = Denials::default();
        for i in 0..(RECENT_DENIALS as u16 + 10) {
            d.note(&packet(2, 1000 + i), u64::from(i));
        }
        let r = d.recent();
        assert_eq!(r.len(), RECENT_DENIALS);
        assert_eq!(r[0].dport, 1000 + RECENT_DENIALS as u16 + 9, "newest first");
        assert_eq!(r[RECENT_DENIALS - 1].dport, 1010, "the oldest ten went");
    }
}
