//! Counters shared between the data plane (writers) and the control plane (readers).
//!
//! Plain `AtomicU64`s with `Relaxed` ordering: each counter is independent and only
//! ever summed for display. Writers add once per batch where they can.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why the data plane dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// Authentication tag did not verify (tampered or forged).
    AuthFailed,
    /// The control queue to the handshake engine was full.
    ControlQueueFull,
    /// A handshake, reject or cookie message whose MAC is not keyed by our network's
    /// PSK (an outsider, or another network on the same port): dropped before any
    /// Diffie-Hellman and before the control-plane queue.
    HandshakeMac,
    /// The session's keys are older than [`crate::session::REJECT_AFTER_MS`]: never
    /// used again to send or accept, whatever the rekey state.
    KeyExpired,
    /// A relayed frame ran out of hops (a routing loop, or a path too long).
    HopLimit,
    /// A frame for a connection (TCP, WebSocket, QUIC) that is down, or whose send
    /// queue is full.
    LinkSend,
    /// Datagram too short, unknown type, or a bad header field.
    Malformed,
    /// No session for the destination overlay address.
    NoRoute,
    /// The destination is a member without a session: its handshake is under way and
    /// the packets it holds meanwhile are already queued (a bounded few).
    NoSession,
    /// The inner packet is neither IPv4 nor IPv6.
    NotIp,
    /// A relayed frame from an address that is not a direct neighbour.
    RelayRefused,
    /// The inner destination is none of ours to deliver: not our overlay address, a
    /// subnet we proxy or (on an exit) the internet ([`crate::route::Serves`]).
    ForbiddenDestination,
    /// A new flow the access policy allows found no room in the connection table: its
    /// source address had started its share already
    /// ([`crate::firewall::PER_SOURCE`]), or the table was full of established flows.
    FlowLimit,
    /// Counter already seen, or too old for the replay window.
    Replay,
    /// The inner source address is not one the sending peer owns.
    Spoofed,
    /// A TUN read or write failed for this packet or batch.
    Tun,
    /// A UDP send failed.
    UdpSend,
    /// A control-plane datagram found the socket's send buffer full, or a control
    /// frame its connection's send queue full: the control loop never waits for the
    /// data plane, it drops and counts.
    ControlSendBlocked,
    /// Data for a session index we do not hold (stale or forged).
    UnknownSession,
    /// The access policy allows no such flow, and it answers none of ours.
    Policy,
    /// A bulk flow's packet dropped to keep the receive queue short (CoDel on the time
    /// datagrams waited in the socket): the flow's sender slows down, sparse flows
    /// never wait behind it.
    Queue,
    /// An inner packet larger than its path carries (the path MTU the control plane
    /// measured): its sender is told the size with ICMP "fragmentation needed" or
    /// ICMPv6 "packet too big", and sends smaller.
    TooBig,
    /// An inner TCP or UDP packet whose checksum does not verify (RX checks a sample):
    /// whatever handed it to the sender (its TUN's offload, as a kernel bug does, or an
    /// application) corrupted it. The sender is told and turns its TUN offload off.
    BadChecksum,
}

impl DropReason {
    /// All reasons, in counter order.
    pub const ALL: [Self; 23] = [
        Self::AuthFailed,
        Self::ControlQueueFull,
        Self::HandshakeMac,
        Self::KeyExpired,
        Self::HopLimit,
        Self::LinkSend,
        Self::Malformed,
        Self::NoRoute,
        Self::NoSession,
        Self::NotIp,
        Self::RelayRefused,
        Self::ForbiddenDestination,
        Self::Replay,
        Self::Spoofed,
        Self::Tun,
        Self::UdpSend,
        Self::ControlSendBlocked,
        Self::UnknownSession,
        Self::Policy,
        Self::Queue,
        Self::FlowLimit,
        Self::TooBig,
        Self::BadChecksum,
    ];

    /// The snake_case name used in status output.
    pub fn name(self) -> &'static str {
        match self {
            Self::AuthFailed => "auth_failed",
            Self::ControlQueueFull => "control_queue_full",
            Self::HandshakeMac => "handshake_mac",
            Self::KeyExpired => "key_expired",
            Self::HopLimit => "hop_limit",
            Self::LinkSend => "link_send",
            Self::Malformed => "malformed",
            Self::NoRoute => "no_route",
            Self::NoSession => "no_session",
            Self::NotIp => "not_ip",
            Self::RelayRefused => "relay_refused",
            Self::ForbiddenDestination => "forbidden_destination",
            Self::Replay => "replay",
            Self::Spoofed => "spoofed_source",
            Self::Tun => "tun_io",
            Self::UdpSend => "udp_send",
            Self::ControlSendBlocked => "control_send_blocked",
            Self::UnknownSession => "unknown_session",
            Self::Policy => "policy",
            Self::Queue => "queue",
            Self::FlowLimit => "flow_limit",
            Self::TooBig => "too_big",
            Self::BadChecksum => "bad_checksum",
        }
    }

    fn slot(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// One counter per [`DropReason`].
#[derive(Debug, Default)]
pub struct DropCounters([AtomicU64; DropReason::ALL.len()]);

impl DropCounters {
    /// Adds `n` drops for `reason`.
    pub fn add(&self, reason: DropReason, n: u64) {
        self.0[reason.slot()].fetch_add(n, Relaxed);
    }

    /// Current count for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason.slot()].load(Relaxed)
    }

    /// Non-zero counters by name.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        DropReason::ALL.iter().map(|r| (r.name(), self.get(*r))).filter(|(_, n)| *n > 0).collect()
    }
}

/// Traffic of one remote peer, kept across its sessions.
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Bytes of plaintext delivered to the TUN from this peer.
    pub rx_bytes: AtomicU64,
    /// Packets delivered from this peer.
    pub rx_packets: AtomicU64,
    /// Bytes of plaintext sent to this peer.
    pub tx_bytes: AtomicU64,
    /// Packets sent to this peer.
    pub tx_packets: AtomicU64,
    /// Packets from this peer that were dropped, by reason.
    pub drops: DropCounters,
}

impl PeerStats {
    /// Records a received batch.
    pub fn add_rx(&self, packets: u64, bytes: u64) {
        self.rx_packets.fetch_add(packets, Relaxed);
        self.rx_bytes.fetch_add(bytes, Relaxed);
    }

    /// Records a sent batch.
    pub fn add_tx(&self, packets: u64, bytes: u64) {
        self.tx_packets.fetch_add(packets, Relaxed);
        self.tx_bytes.fetch_add(bytes, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_counters_count_per_reason() {
        let d = DropCounters::default();
        d.add(DropReason::Replay, 2);
        d.add(DropReason::Malformed, 1);
        d.add(DropReason::Replay, 1);
        assert_eq!(d.get(DropReason::Replay), 3);
        assert_eq!(d.get(DropReason::AuthFailed), 0);
        assert_eq!(d.nonzero(), vec![("malformed", 1), ("replay", 3)]);
        let names: std::collections::HashSet<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), DropReason::ALL.len());
    }
}
