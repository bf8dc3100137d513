//! Broken TUN offloads: RX checks the checksums of a sample of the inner packets
//! members send and drops the bad ones ([`weft_core::stats::DropReason::BadChecksum`]);
//! the engine tells the member that sent them, and a member told so turns its TUN
//! offload off ([`Action::TunOffloadOff`]). The AEAD covers every byte from the
//! sealing to the opening, so a bad checksum means the packet was wrong before its
//! sender sealed it: handed over so by a TUN offload the kernel gets wrong.

use std::time::Instant;

use tracing::warn;
use weft_core::stats::DropReason;

use super::Node;
use crate::mesh::Msg;
use crate::node::Action;

/// Bad checksums a member must have counted (in its sample of one packet in 16, so
/// about 16 times as many packets) before we believe our offload is at fault: one
/// corrupt packet forwarded from a LAN (the kernel forwards without checking) is not.
pub(crate) const OFFLOAD_SUSPECT_AFTER: u32 = 4;

impl Node {
    /// RX dropped inner packets with bad checksums on a session (reported at most once
    /// a second per session): the member that sent them is told how many so far.
    pub(super) fn handle_bad_checksum(&mut self, now: Instant, local_index: u32) {
        let Some(key) = self.key_of_session(local_index) else { return };
        let Some(p) = self.peers.get(&key) else { return };
        let count = p
            .sessions
            .iter()
            .find(|s| s.session.local_index == local_index)
            .map_or(1, |s| s.session.stats.drops.get(DropReason::BadChecksum));
        warn!(peer = %key.id(), hostname = %p.hello.hostname, count, "inner packets with bad checksums from a member: telling it");
        self.report.checksum_reports_sent += 1;
        self.send_msg(&key, &Msg::BadChecksums(u32::try_from(count).unwrap_or(u32::MAX)), now);
    }

    /// A member says our packets reach it with bad checksums (`count` so far on its
    /// session): past [`OFFLOAD_SUSPECT_AFTER`], the runtime is told once to turn the
    /// TUN offload off (the kernel then hands over whole packets it checksummed
    /// itself); a runtime without one has nothing to turn off.
    pub(super) fn told_bad_checksums(&mut self, key: crate::identity::PeerKey, count: u32) {
        self.report.checksum_reports_received += 1;
        if self.report.tun_offload_off.is_some() || count < OFFLOAD_SUSPECT_AFTER {
            return;
        }
        // A member's word, checked as far as it can be: it cannot have found more bad
        // packets than we sent it.
        let sent = self.peers.get(&key).map_or(0, |p| p.stats.tx_packets.load(std::sync::atomic::Ordering::Relaxed));
        if u64::from(count) > sent {
            warn!(peer = %key.id(), count, sent, "a member reports more bad packets than it was sent: ignored");
            return;
        }
        let name = self.peers.get(&key).map_or_else(|| key.id().to_string(), |p| p.hello.hostname.clone());
        let why = format!("{name} found bad checksums in {count} of the packets from this node it checked");
        self.report.tun_offload_off = Some(why.clone());
        self.actions.push_back(Action::TunOffloadOff { why });
    }
}
