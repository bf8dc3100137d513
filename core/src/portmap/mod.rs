//! Port mapping on the wire, pure: NAT-PMP (RFC 6886, [`pmp`]) and PCP (RFC 6887,
//! [`pcp`]) messages a node sends its default gateway on UDP port [`SERVER_PORT`] to
//! have a port forwarded to it, and the gateway's answers; [`EpochWatch`] reads the
//! gateway's "seconds since its epoch" to tell a router that rebooted (and forgot
//! every mapping) from one that did not.
//!
//! ```text
//!   node ── pmp::Request / pcp::MapRequest ──► gateway:5351
//!   node ◄── pmp::Response / pcp::Response ─── gateway   (result, lifetime, epoch)
//! ```
//!
//! Answers come from whoever is on the LAN: every parser here returns an error for
//! anything malformed and never panics (fuzzed by `weft-fuzz`). Sockets, retries and
//! lease renewal are the daemon's (`weft::services::portmap`).

pub mod pcp;
pub mod pmp;

use std::time::Duration;

use thiserror::Error;

/// The UDP port PCP and NAT-PMP servers listen on.
pub const SERVER_PORT: u16 = 5351;

/// The transport protocol of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// An answer that is not one: too short, of another protocol version, not a response,
/// or with fields that contradict each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ParseError {
    /// Shorter than its fixed part.
    #[error("answer truncated ({len} bytes)")]
    Truncated {
        /// Its length.
        len: usize,
    },
    /// Longer than a message of this protocol may be, or not a multiple of 4 (PCP).
    #[error("answer of {len} bytes has an invalid length")]
    Length {
        /// Its length.
        len: usize,
    },
    /// A version this parser does not read.
    #[error("answer of protocol version {0}")]
    Version(u8),
    /// A request, or a response to an operation we never send.
    #[error("unexpected operation code {0}")]
    Opcode(u8),
    /// A transport protocol that is neither TCP nor UDP.
    #[error("unexpected transport protocol {0}")]
    Protocol(u8),
    /// A PCP option whose length runs past the end of the answer.
    #[error("malformed option")]
    Option,
}

/// What [`EpochWatch::observe`] concludes from a gateway's epoch time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochVerdict {
    /// The first answer seen: nothing to compare with.
    First,
    /// The gateway's clock went on with ours: its mappings are still there.
    Continuous,
    /// The gateway's epoch went back or jumped: it restarted (or another gateway
    /// answers) and has lost its mappings, which must be made again.
    Reset,
}

/// The gateway epoch check of RFC 6887 §8.5 (also NAT-PMP's, RFC 6886 §3.6): each
/// answer carries the seconds since the gateway's epoch; between two answers they must
/// grow as our own clock does, within a second or two and 1/16 of the time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochWatch {
    prev: Option<(Duration, u32)>,
}

impl EpochWatch {
    /// Notes an answer received at `client` (our monotonic clock, any fixed origin)
    /// that carried `server` seconds since the gateway's epoch.
    pub fn observe(&mut self, client: Duration, server: u32) -> EpochVerdict {
        let prev = self.prev.replace((client, server));
        let Some((prev_client, prev_server)) = prev else { return EpochVerdict::First };
        // Time never goes back by more than a second.
        if u64::from(server) + 1 < u64::from(prev_server) {
            return EpochVerdict::Reset;
        }
        let client_delta = client.saturating_sub(prev_client).as_secs();
        let server_delta = u64::from(server.saturating_sub(prev_server));
        if client_delta + 2 < server_delta - server_delta / 16 || server_delta + 2 < client_delta - client_delta / 16 {
            return EpochVerdict::Reset;
        }
        EpochVerdict::Continuous
    }

    /// Forgets the last answer (a new gateway, or mappings made afresh).
    pub fn reset(&mut self) {
        self.prev = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_gateway_clock_that_keeps_pace_is_continuous() {
        let mut w = EpochWatch::default();
        assert_eq!(w.observe(s(100), 5000), EpochVerdict::First);
        assert_eq!(w.observe(s(160), 5060), EpochVerdict::Continuous);
        // Within two seconds and a sixteenth either way.
        assert_eq!(w.observe(s(3760), 8700), EpochVerdict::Continuous);
        assert_eq!(w.observe(s(3761), 8700), EpochVerdict::Continuous);
    }

    #[test]
    fn a_gateway_clock_that_goes_back_or_jumps_is_a_reset() {
        let mut w = EpochWatch::default();
        w.observe(s(100), 5000);
        // Rebooted: the epoch started again.
        assert_eq!(w.observe(s(160), 30), EpochVerdict::Reset);
        // Rebooted between two answers long apart: less time passed on its side.
        let mut w = EpochWatch::default();
        w.observe(s(0), 1000);
        assert_eq!(w.observe(s(3600), 1300), EpochVerdict::Reset);
        // Its clock ran far ahead of ours: not the same epoch either.
        let mut w = EpochWatch::default();
        w.observe(s(0), 1000);
        assert_eq!(w.observe(s(10), 2000), EpochVerdict::Reset);
        // A second back is tolerated (rounding).
        let mut w = EpochWatch::default();
        w.observe(s(0), 1000);
        assert_eq!(w.observe(s(0), 999), EpochVerdict::Continuous);
        w.reset();
        assert_eq!(w.observe(s(5), 1), EpochVerdict::First);
    }
}
