//! The engine's timing: the timers a node is configured with ([`Timers`]), the fixed
//! intervals and limits of sessions and handshakes, and the millisecond clock the
//! pipelines share. State types (peers, sessions) read these without the engine.

use std::time::{Duration, Instant};

/// Timing of the session engine.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    /// Start a new handshake when the session is this old.
    pub rekey_after: Duration,
    /// Send a keepalive when nothing was sent for this long.
    pub keepalive: Duration,
    /// Declare a peer dead when nothing was received for this long.
    pub dead_after: Duration,
    /// First handshake retry delay; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    /// Largest handshake retry delay.
    pub max_backoff: Duration,
    /// How long a peer that we did not dial is retried after it went silent.
    pub learned_retry: Duration,
}

impl Timers {
    /// When a session's keys are renewed: the initiator at `rekey_after`, the
    /// responder a quarter later (so that both ends do not start one at once).
    pub fn rekey_due(&self, initiator: bool) -> Duration {
        if initiator { self.rekey_after } else { self.rekey_after + self.rekey_after / 4 }
    }

    /// How long a direct path may stay quiet before other paths are tried: two missed
    /// keepalives and a little.
    pub fn stale_after(&self) -> Duration {
        2 * self.keepalive + Duration::from_millis(500)
    }

    /// Whether a path on which nothing arrived for `quiet` is stale: the one test
    /// every caller uses ([`Timers::stale_after`] or more).
    pub fn is_stale(&self, quiet: Duration) -> bool {
        quiet >= self.stale_after()
    }
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            rekey_after: Duration::from_secs(120),
            keepalive: Duration::from_secs(2),
            dead_after: Duration::from_secs(6),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(8),
            learned_retry: Duration::from_secs(60),
        }
    }
}

/// Rekey once a session has sent this many packets (about 47 GB at 1420 bytes), well
/// inside AES-GCM's usage limit.
pub const REKEY_AFTER_PACKETS: u64 = 1 << 25;
/// A session with a member that is not a link is retired after this long without data
/// either way (no keepalives keep it in between).
pub const IDLE_RETIRE: Duration = Duration::from_secs(120);
/// An idle direct path that crosses this node's NAT gets a keepalive this often at
/// first (WireGuard's advice for persistent keepalives: it outlasts most NATs' UDP
/// timers); per path, halved each time such a path died in a pause.
pub(crate) const NAT_KEEPALIVE: Duration = Duration::from_secs(25);
/// The shortest NAT keepalive interval a path is shortened to.
pub(crate) const NAT_KEEPALIVE_MIN: Duration = Duration::from_secs(5);
/// Data within this window makes a session active: it is probed for latency and loss,
/// and hole punching is tried while it is relayed.
pub(crate) const ACTIVE_WINDOW: Duration = Duration::from_secs(10);
/// Links and active sessions are probed for latency and loss this often.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(5);
/// A packet for a member keeps its handshake retried this long.
pub(crate) const WANTED_FOR: Duration = Duration::from_secs(10);
/// An XX responder waiting for the finish message gives up after this.
pub(crate) const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// A finished handshake whose peer never proves the PSK is dropped after this.
pub(crate) const HELD_TIMEOUT: Duration = Duration::from_secs(5);
/// An older session is retired once it has been idle this long.
pub(crate) const RETIRE_IDLE: Duration = Duration::from_secs(10);
/// Milliseconds from `epoch` to `now` on the pipeline clock (0 means "never").
pub(crate) fn ms_since(epoch: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(epoch).as_millis() as u64 + 1
}
