//! What a node's NAT does, judged from where other members see it, and why a pair of
//! members has no direct path.
//!
//! Each member's signed record lists its links and the UDP address it sees each of them
//! at (`Neighbour::observed`). A node seen at one public port by every observer has an
//! endpoint-independent mapping (a punch from anyone reaches that port); seen at
//! different ports by different observers, its NAT gives every destination a new port
//! (endpoint-dependent, "symmetric"), so the port a punch would have to hit is unknown.
//! With a single observer, a port equal to the node's own listening port (the NAT
//! preserved it) suggests an endpoint-independent NAT and any other port a dependent
//! one: a guess, marked as such.

use std::net::{IpAddr, SocketAddr};

use weft_core::endpoint::canonical;

pub mod birthday;

/// A NAT's mapping behaviour (RFC 4787).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// Nobody reported where they see the node.
    Unknown,
    /// Seen at one of its own addresses: no NAT in front of it.
    NoNat,
    /// One outside port whatever the destination.
    Independent,
    /// A new outside port per destination.
    Dependent,
}

impl Mapping {
    /// How status and `weft netcheck` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::NoNat => "no NAT",
            Self::Independent => "endpoint-independent",
            Self::Dependent => "endpoint-dependent",
        }
    }
}

/// What the observations of one node say about its NAT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatGuess {
    /// The mapping behaviour.
    pub mapping: Mapping,
    /// Two or more observers agree or disagree (not a guess from one).
    pub certain: bool,
    /// Whether the outside port is the node's own UDP port (None: nobody saw it).
    pub port_preserving: Option<bool>,
    /// How many distinct observers reported an address.
    pub observers: usize,
}

/// Judges a node's NAT from the UDP addresses `observed` by distinct observers (one
/// entry each) and the node's own UDP addresses `local` (its announced endpoints; an
/// unspecified address matches by port only).
pub fn classify(observed: &[SocketAddr], local: &[SocketAddr]) -> NatGuess {
    let observed: Vec<SocketAddr> = observed.iter().map(|a| canonical(*a)).collect();
    let local: Vec<SocketAddr> = local.iter().map(|a| canonical(*a)).collect();
    let observers = observed.len();
    if observers == 0 {
        return NatGuess { mapping: Mapping::Unknown, certain: false, port_preserving: None, observers };
    }
    let own_port = |a: &SocketAddr| local.iter().any(|l| l.port() == a.port());
    let port_preserving = Some(observed.iter().all(own_port));
    let own_ip = |ip: IpAddr| local.iter().any(|l| l.ip() == ip);
    if observed.iter().all(|a| own_ip(a.ip()) && own_port(a)) {
        return NatGuess { mapping: Mapping::NoNat, certain: observers > 1, port_preserving, observers };
    }
    let mut distinct = observed;
    distinct.sort();
    distinct.dedup();
    let mapping = if distinct.len() > 1 {
        Mapping::Dependent
    } else if observers > 1 || port_preserving == Some(true) {
        Mapping::Independent
    } else {
        Mapping::Dependent
    };
    NatGuess { mapping, certain: observers > 1, port_preserving, observers }
}

/// What is known of one side of a pair, for [`no_direct_reason`].
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    /// Its NAT.
    pub nat: &'a NatGuess,
    /// It announces a port its router maps (a UDP endpoint at the public address it
    /// is seen at, on another port): reachable there whatever its NAT's mapping.
    pub mapped: bool,
}

/// Why a relayed peer has no direct path, from this node's side (`ours`) and the
/// peer's (`theirs`), and how many punch rounds went unanswered.
pub fn no_direct_reason(ours: Side<'_>, theirs: Side<'_>, punches: u32) -> String {
    let hard = |s: Side<'_>| s.nat.mapping == Mapping::Dependent && !s.mapped;
    let guessed = |s: Side<'_>| if s.nat.certain { "" } else { " (guessed from one observer)" };
    // A side whose router maps a port is reachable there whatever either NAT's
    // mapping: then only the punch can have failed.
    let either_mapped = ours.mapped || theirs.mapped;
    match (hard(ours) && !either_mapped, hard(theirs) && !either_mapped) {
        (true, true) => format!(
            "both sides endpoint-dependent{}, no port mapping: stays relayed",
            if ours.nat.certain && theirs.nat.certain { "" } else { " (guessed)" }
        ),
        (true, false) => format!(
            "this node's NAT is endpoint-dependent{}: the port it uses towards the peer is unknown",
            guessed(ours)
        ),
        (false, true) => {
            format!("the peer's NAT is endpoint-dependent{}: the port it uses towards us is unknown", guessed(theirs))
        }
        (false, false) if punches > 0 => format!("punch unanswered ({punches} rounds)"),
        (false, false) => "not punched yet: punching starts with traffic".to_owned(),
    }
}

/// What this node's NAT lets in unasked, as far as seen: the UDP addresses this node
/// sent to (kept [`FilterSeen::KEEP`] after the last send, at most
/// [`FilterSeen::MAX`]), and the first packet that arrived from an address it had not
/// sent to. Such a packet got through the NAT's filter, so the filter is
/// endpoint-independent (or a port mapping forwards): netcheck's filtering.
#[derive(Debug, Default)]
pub(crate) struct FilterSeen {
    sent: std::collections::BTreeMap<SocketAddr, std::time::Instant>,
    /// The first unasked arrival: from where, when.
    pub(crate) unasked: Option<(SocketAddr, std::time::Instant)>,
}

impl FilterSeen {
    /// Addresses remembered at most.
    pub(crate) const MAX: usize = 4096;
    /// An address is remembered this long after the last send to it.
    pub(crate) const KEEP: std::time::Duration = std::time::Duration::from_secs(600);

    /// This node sent to `to` at `now`.
    pub(crate) fn sent(&mut self, to: SocketAddr, now: std::time::Instant) {
        self.sent.insert(canonical(to), now);
        if self.sent.len() > Self::MAX {
            self.sent.retain(|_, t| now.saturating_duration_since(*t) < Self::KEEP);
            while self.sent.len() > Self::MAX {
                let Some(oldest) = self.sent.iter().min_by_key(|(_, t)| **t).map(|(a, _)| *a) else { break };
                self.sent.remove(&oldest);
            }
        }
    }

    /// A packet arrived straight from `from` (not from this node's own networks):
    /// whether it is the first from an address never sent to.
    pub(crate) fn arrived(&mut self, from: SocketAddr, now: std::time::Instant) -> bool {
        if self.unasked.is_some() || self.sent.contains_key(&canonical(from)) {
            return false;
        }
        self.unasked = Some((canonical(from), now));
        true
    }
}

/// A node's filtering, as netcheck says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filtering {
    /// No NAT in front of it (seen at its own address).
    NoNat,
    /// Its router forwards its port (port mapping): anyone gets in.
    Mapped,
    /// A packet from an address it had not sent to got in.
    Open,
    /// Only answers got in so far: address- or port-dependent, or not tried yet.
    NotSeenOpen,
}

impl Filtering {
    /// How status and `weft netcheck` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoNat => "no NAT",
            Self::Mapped => "port mapped",
            Self::Open => "endpoint-independent",
            Self::NotSeenOpen => "dependent or untested",
        }
    }
}

#[cfg(test)]
mod filter_tests {
    use std::time::{Duration, Instant};

    use super::FilterSeen;

    #[test]
    #[allow(clippy::disallowed_methods)] // tests make their own epoch
    fn only_an_arrival_from_an_address_never_sent_to_counts_and_only_the_first() {
        let t = Instant::now();
        let mut f = FilterSeen::default();
        let p = "203.0.113.2:11010".parse().unwrap();
        let q = "198.51.100.7:40000".parse().unwrap();
        f.sent(p, t);
        assert!(!f.arrived(p, t), "an answer");
        assert!(!f.arrived("[::ffff:203.0.113.2]:11010".parse().unwrap(), t), "the same address, mapped form");
        assert!(f.arrived(q, t + Duration::from_secs(1)), "unasked");
        assert_eq!(f.unasked, Some((q, t + Duration::from_secs(1))));
        assert!(!f.arrived("192.0.2.9:1".parse().unwrap(), t), "only the first is kept");
        // Bounded: the oldest sends are forgotten first.
        let mut f = FilterSeen::default();
        for i in 0..=FilterSeen::MAX as u32 {
            f.sent((std::net::Ipv4Addr::from(0x0a00_0000 + i), 1).into(), t + Duration::from_millis(u64::from(i)));
        }
        assert!(f.arrived("10.0.0.0:1".parse().unwrap(), t), "the oldest went");
        let mut g = FilterSeen::default();
        g.sent("10.0.0.5:1".parse().unwrap(), t);
        assert!(!g.arrived("10.0.0.5:1".parse().unwrap(), t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    const LOCAL: &str = "10.1.0.2:11010";

    #[test]
    fn nobody_saw_it() {
        let g = classify(&[], &[a(LOCAL)]);
        assert_eq!(g.mapping, Mapping::Unknown);
        assert_eq!(g.port_preserving, None);
    }

    #[test]
    fn seen_at_its_own_address_is_no_nat() {
        let g = classify(&[a("203.0.113.2:11010"), a("203.0.113.2:11010")], &[a("203.0.113.2:11010")]);
        assert_eq!(g.mapping, Mapping::NoNat);
        assert!(g.certain);
        // A wildcard listener matches by port; the address must still be its own.
        let g = classify(&[a("203.0.113.2:11010")], &[a("0.0.0.0:11010")]);
        assert_eq!(g.mapping, Mapping::Independent, "a preserved port behind NAT is not no NAT");
    }

    #[test]
    fn one_port_for_every_observer_is_endpoint_independent() {
        let g = classify(&[a("198.51.100.7:11010"), a("198.51.100.7:11010")], &[a(LOCAL)]);
        assert_eq!((g.mapping, g.certain, g.port_preserving), (Mapping::Independent, true, Some(true)));
        // Not port preserving, but the same port for both: still independent.
        let g = classify(&[a("198.51.100.7:40000"), a("198.51.100.7:40000")], &[a(LOCAL)]);
        assert_eq!((g.mapping, g.certain, g.port_preserving), (Mapping::Independent, true, Some(false)));
    }

    #[test]
    fn different_ports_for_different_observers_is_endpoint_dependent() {
        let g = classify(&[a("198.51.100.7:40000"), a("198.51.100.7:52113")], &[a(LOCAL)]);
        assert_eq!((g.mapping, g.certain, g.port_preserving), (Mapping::Dependent, true, Some(false)));
        // Even when one of them got the preserved port.
        let g = classify(&[a("198.51.100.7:11010"), a("198.51.100.7:52113")], &[a(LOCAL)]);
        assert_eq!(g.mapping, Mapping::Dependent);
    }

    #[test]
    fn a_single_observer_gives_a_guess_from_the_port() {
        let g = classify(&[a("198.51.100.7:11010")], &[a(LOCAL)]);
        assert_eq!((g.mapping, g.certain), (Mapping::Independent, false));
        let g = classify(&[a("198.51.100.7:61234")], &[a(LOCAL)]);
        assert_eq!((g.mapping, g.certain, g.port_preserving), (Mapping::Dependent, false, Some(false)));
    }

    #[test]
    fn the_birthday_method_only_between_an_easy_and_a_hard_nat_without_mappings() {
        let g = |mapping| NatGuess { mapping, certain: false, port_preserving: None, observers: 1 };
        let (easy, hard, open, unknown) =
            (g(Mapping::Independent), g(Mapping::Dependent), g(Mapping::NoNat), g(Mapping::Unknown));
        let s = |nat, mapped| Side { nat, mapped };
        assert_eq!(birthday_side(s(&easy, false), s(&hard, false)), Some(true));
        assert_eq!(birthday_side(s(&hard, false), s(&easy, false)), Some(false));
        // Both hard, both easy, a side not judged yet, or a side without NAT: no.
        for (a, b) in
            [(&hard, &hard), (&easy, &easy), (&easy, &unknown), (&unknown, &hard), (&open, &hard), (&hard, &open)]
        {
            assert_eq!(birthday_side(s(a, false), s(b, false)), None, "{:?} / {:?}", a.mapping, b.mapping);
        }
        // A mapped port on either side: the mapping is the way.
        assert_eq!(birthday_side(s(&easy, true), s(&hard, false)), None);
        assert_eq!(birthday_side(s(&easy, false), s(&hard, true)), None);
    }

    #[test]
    fn reasons_name_the_side_that_is_hard() {
        let easy = NatGuess { mapping: Mapping::Independent, certain: true, port_preserving: Some(true), observers: 2 };
        let hard = NatGuess { mapping: Mapping::Dependent, certain: true, port_preserving: Some(false), observers: 2 };
        let one = NatGuess { certain: false, observers: 1, ..hard };
        let s = |nat, mapped| Side { nat, mapped };
        assert!(no_direct_reason(s(&hard, false), s(&hard, false), 3).starts_with("both sides endpoint-dependent,"));
        assert!(
            no_direct_reason(s(&hard, false), s(&one, false), 3).starts_with("both sides endpoint-dependent (guessed)")
        );
        assert!(no_direct_reason(s(&easy, false), s(&hard, false), 3).starts_with("the peer's NAT"));
        assert!(no_direct_reason(s(&hard, false), s(&easy, false), 3).starts_with("this node's NAT"));
        assert!(no_direct_reason(s(&easy, false), s(&one, false), 0).contains("guessed from one observer"));
        // A mapped port makes a hard side reachable: then it is about the punches.
        assert_eq!(no_direct_reason(s(&hard, true), s(&hard, false), 1), "punch unanswered (1 rounds)");
        assert_eq!(no_direct_reason(s(&easy, false), s(&hard, true), 2), "punch unanswered (2 rounds)");
        assert_eq!(
            no_direct_reason(s(&easy, false), s(&easy, false), 0),
            "not punched yet: punching starts with traffic"
        );
    }
}

/// Which side of the birthday method this node takes towards a peer: `Some(true)`
/// the easy side (it probes), `Some(false)` the hard side (it opens mappings), `None`
/// neither. Only when both NATs are judged (known, or guessed from one observer), one
/// endpoint-independent and the other dependent (a side without NAT takes a plain
/// punch; two dependent ones cannot meet), and neither announces a mapped port (the
/// mapping is the way then).
pub fn birthday_side(ours: Side<'_>, theirs: Side<'_>) -> Option<bool> {
    if ours.mapped || theirs.mapped {
        return None;
    }
    match (ours.nat.mapping, theirs.nat.mapping) {
        (Mapping::Independent, Mapping::Dependent) => Some(true),
        (Mapping::Dependent, Mapping::Independent) => Some(false),
        _ => None,
    }
}
