//! A data session: the keys, counters and replay window of one handshake, shared by
//! the pipelines (which seal and open with it) and the control plane (which creates,
//! watches and retires it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::crypto::{Cipher, DataKey};
use crate::endpoint::Endpoint;
use crate::handshake::SessionKeys;
use crate::replay::ReplayWindow;
use crate::stats::{DropReason, PeerStats};
use crate::wire::{DATA_HEADER_LEN, DataHeader};

/// Keys older than this (ms) are never used to send or accept, even when rekeying
/// keeps failing (WireGuard's reject-after-time).
pub const REJECT_AFTER_MS: u64 = 180_000;

/// Everything the control plane decides about a new session.
#[derive(Debug)]
pub struct SessionParams {
    /// Index the peer puts in packets to us.
    pub local_index: u32,
    /// Index we put in packets to the peer.
    pub remote_index: u32,
    /// Data cipher.
    pub cipher: Cipher,
    /// Keys from the handshake.
    pub keys: SessionKeys,
    /// Where to send.
    pub endpoint: Endpoint,
    /// The overlay address the peer owns; inner packets from it must carry this source.
    pub peer_addr: Ipv4Addr,
    /// The peer's IPv6 overlay address, when it has one.
    pub peer_addr6: Option<Ipv6Addr>,
    /// Whether the peer already proved it holds the keys.
    pub confirmed: bool,
    /// Traffic counters of the peer.
    pub stats: Arc<PeerStats>,
}

/// A live session.
#[derive(Debug)]
pub struct Session {
    /// Index the peer puts in packets to us.
    pub local_index: u32,
    /// Index we put in packets to the peer.
    pub remote_index: u32,
    /// Where to send.
    pub endpoint: Endpoint,
    /// The overlay address the peer owns.
    pub peer_addr: Ipv4Addr,
    /// The peer's IPv6 overlay address, when it has one.
    pub peer_addr6: Option<Ipv6Addr>,
    /// Traffic counters of the peer.
    pub stats: Arc<PeerStats>,
    tx: DataKey,
    rx: DataKey,
    tx_counter: AtomicU64,
    replay: Mutex<ReplayWindow>,
    confirmed: AtomicBool,
    last_rx_ms: AtomicU64,
    last_tx_ms: AtomicU64,
    last_direct_rx_ms: AtomicU64,
    roam_reported_ms: AtomicU64,
    /// [`Endpoint::key`] of the source of the last report.
    roam_from: AtomicU64,
    /// When data on this session, after it was declared dead, was last reported.
    stale_reported_ms: AtomicU64,
    /// When an inner packet with a bad checksum on this session was last reported.
    checksum_reported_ms: AtomicU64,
    /// Pipeline-clock time (ms) from which the keys are refused; `u64::MAX` until the
    /// control plane sets it.
    expires_ms: AtomicU64,
    /// Whether the peer takes GSO super-packets as one record (its hello said so).
    peer_gso: AtomicBool,
    /// Whether it takes them over QUIC too.
    peer_gso_quic: AtomicBool,
    /// The largest inner packet the current path carries, as the control plane
    /// measured it (packetization-layer PMTU discovery); 0: not known, no limit.
    path_mtu: AtomicU16,
    /// UDP segmentation offload loses batches on the current path: send its
    /// datagrams one by one.
    gso_off: AtomicBool,
}

impl Session {
    /// Builds a session from the handshake's outcome.
    pub fn new(p: SessionParams) -> Self {
        Self {
            local_index: p.local_index,
            remote_index: p.remote_index,
            endpoint: p.endpoint,
            peer_addr: p.peer_addr,
            peer_addr6: p.peer_addr6,
            stats: p.stats,
            tx: DataKey::new(p.cipher, &p.keys.send),
            rx: DataKey::new(p.cipher, &p.keys.recv),
            tx_counter: AtomicU64::new(0),
            replay: Mutex::new(ReplayWindow::default()),
            confirmed: AtomicBool::new(p.confirmed),
            last_rx_ms: AtomicU64::new(0),
            last_tx_ms: AtomicU64::new(0),
            last_direct_rx_ms: AtomicU64::new(0),
            roam_reported_ms: AtomicU64::new(0),
            stale_reported_ms: AtomicU64::new(0),
            checksum_reported_ms: AtomicU64::new(0),
            roam_from: AtomicU64::new(0),
            expires_ms: AtomicU64::new(u64::MAX),
            peer_gso: AtomicBool::new(false),
            peer_gso_quic: AtomicBool::new(false),
            path_mtu: AtomicU16::new(0),
            gso_off: AtomicBool::new(false),
        }
    }

    /// Whether `addr` is one of the peer's own overlay addresses (IPv4 or IPv6).
    pub fn owns(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => a == self.peer_addr,
            IpAddr::V6(a) => self.peer_addr6 == Some(a),
        }
    }

    /// Marks the keys as created at `now_ms` on the pipeline clock: from
    /// `now_ms + REJECT_AFTER_MS` on, the session neither seals nor opens.
    pub fn set_created_ms(&self, now_ms: u64) {
        self.expires_ms.store(now_ms.saturating_add(REJECT_AFTER_MS), Relaxed);
    }

    /// Whether the keys are too old to use at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_ms.load(Relaxed)
    }

    /// When the keys expire, on the pipeline clock (`u64::MAX`: not set).
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_ms.load(Relaxed)
    }

    /// Records that the peer takes GSO super-packets as one record
    /// ([`crate::wire::FLAG_GSO`]), as its hello said.
    pub fn set_peer_gso(&self, yes: bool) {
        self.peer_gso.store(yes, Relaxed);
    }

    /// Whether TX may send the peer whole super-packets on reliable connections.
    pub fn peer_gso(&self) -> bool {
        self.peer_gso.load(Relaxed)
    }

    /// Records that the peer takes GSO records over QUIC too (on a stream beside the
    /// connection's datagrams), as its hello said.
    pub fn set_peer_gso_quic(&self, yes: bool) {
        self.peer_gso_quic.store(yes, Relaxed);
    }

    /// Whether TX may send the peer whole super-packets over a direct QUIC connection.
    pub fn peer_gso_quic(&self) -> bool {
        self.peer_gso_quic.load(Relaxed)
    }

    /// Sets the largest inner packet the path carries (0: not known).
    pub fn set_path_mtu(&self, mtu: u16) {
        self.path_mtu.store(mtu, Relaxed);
    }

    /// The largest inner packet the path carries (0: not known, no limit).
    pub fn path_mtu(&self) -> u16 {
        self.path_mtu.load(Relaxed)
    }

    /// Turns UDP segmentation offload off (or on again) for this session's path.
    pub fn set_gso_off(&self, off: bool) {
        self.gso_off.store(off, Relaxed);
    }

    /// Whether datagrams of this session go one by one (UDP GSO loses them).
    pub fn gso_off(&self) -> bool {
        self.gso_off.load(Relaxed)
    }

    /// Bytes `seal` adds in front of and behind the payload.
    pub fn overhead(&self) -> usize {
        DATA_HEADER_LEN + self.tx.cipher().overhead()
    }

    /// Seals the payload at `buf[16..16 + len]` in place: writes the header, encrypts,
    /// appends the tag. Returns the datagram length, or `None` if `buf` is too short.
    pub fn seal(&self, buf: &mut [u8], len: usize) -> Option<usize> {
        self.seal_with_flags(buf, len, 0)
    }

    /// [`Session::seal`] with header flags (e.g. [`crate::wire::FLAG_CONTROL`]).
    pub fn seal_with_flags(&self, buf: &mut [u8], len: usize, flags: u8) -> Option<usize> {
        let counter = self.tx_counter.fetch_add(1, Relaxed);
        let hdr: &mut [u8; DATA_HEADER_LEN] = buf.get_mut(..DATA_HEADER_LEN)?.try_into().ok()?;
        DataHeader { flags, lane: 0, receiver_index: self.remote_index, counter }.emit(hdr);
        let n = self.tx.seal(counter, buf, DATA_HEADER_LEN, len).ok()?;
        Some(DATA_HEADER_LEN + n)
    }

    /// Opens a data datagram in place (header already parsed as `hdr`). On success the
    /// plaintext is at `buf[16..16 + n]` and `n` is returned.
    pub fn open(&self, hdr: &DataHeader, buf: &mut [u8]) -> Result<usize, DropReason> {
        if !self.replay.lock().check(hdr.counter) {
            return Err(DropReason::Replay);
        }
        if buf.len() < DATA_HEADER_LEN {
            return Err(DropReason::Malformed);
        }
        let n = self.rx.open(hdr.counter, buf, DATA_HEADER_LEN).map_err(|_| DropReason::AuthFailed)?;
        // Another thread may have accepted the same counter meanwhile; mark decides.
        if !self.replay.lock().mark(hdr.counter) {
            return Err(DropReason::Replay);
        }
        Ok(n)
    }

    /// Marks the session confirmed; returns true if it was not before.
    pub fn confirm(&self) -> bool {
        !self.confirmed.swap(true, Relaxed)
    }

    /// Undoes [`Session::confirm`] when the control plane could not be told.
    pub fn unconfirm(&self) {
        self.confirmed.store(false, Relaxed);
    }

    /// Whether the peer proved it holds the keys (an authenticated packet arrived, or
    /// the handshake itself proved it).
    pub fn is_confirmed(&self) -> bool {
        self.confirmed.load(Relaxed)
    }

    /// Records receive activity at `now_ms` on the caller's clock.
    pub fn touch_rx(&self, now_ms: u64) {
        self.last_rx_ms.store(now_ms, Relaxed);
    }

    /// Records send activity at `now_ms`.
    pub fn touch_tx(&self, now_ms: u64) {
        self.last_tx_ms.store(now_ms, Relaxed);
    }

    /// Last receive time in ms on the pipeline clock; 0 if never.
    pub fn last_rx_ms(&self) -> u64 {
        self.last_rx_ms.load(Relaxed)
    }

    /// Last send time in ms on the pipeline clock; 0 if never.
    pub fn last_tx_ms(&self) -> u64 {
        self.last_tx_ms.load(Relaxed)
    }

    /// Records an authenticated packet that arrived directly (not relayed).
    pub fn touch_direct(&self, now_ms: u64) {
        self.last_direct_rx_ms.store(now_ms, Relaxed);
    }

    /// Last direct (not relayed) receive time; 0 if never.
    pub fn last_direct_rx_ms(&self) -> u64 {
        self.last_direct_rx_ms.load(Relaxed)
    }

    /// Whether to tell the control plane where this direct packet came from: at
    /// once when it came from another endpoint than the last one reported (a single
    /// probe over a better transport must not go unheard), else once a second.
    pub fn should_report_roam(&self, now_ms: u64, from: &Endpoint) -> bool {
        let key = from.key();
        if self.roam_from.load(Relaxed) != key {
            self.roam_from.store(key, Relaxed);
            self.roam_reported_ms.store(now_ms, Relaxed);
            return true;
        }
        let last = self.roam_reported_ms.load(Relaxed);
        now_ms.saturating_sub(last) >= 1000
            && self.roam_reported_ms.compare_exchange(last, now_ms, Relaxed, Relaxed).is_ok()
    }

    /// Whether authenticated data on this session, which its node declared dead, is
    /// to be reported at `now_ms`: once a second.
    pub fn should_report_stale(&self, now_ms: u64) -> bool {
        let last = self.stale_reported_ms.load(Relaxed);
        (last == 0 || now_ms.saturating_sub(last) >= 1000)
            && self.stale_reported_ms.compare_exchange(last, now_ms, Relaxed, Relaxed).is_ok()
    }

    /// Whether an inner packet with a bad checksum that arrived on this session is to
    /// be reported to the control plane at `now_ms`: once a second.
    pub fn should_report_checksum(&self, now_ms: u64) -> bool {
        let last = self.checksum_reported_ms.load(Relaxed);
        (last == 0 || now_ms.saturating_sub(last) >= 1000)
            && self.checksum_reported_ms.compare_exchange(last, now_ms, Relaxed, Relaxed).is_ok()
    }

    /// Packets sealed so far (the next counter).
    pub fn sent_packets(&self) -> u64 {
        self.tx_counter.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::TAG_LEN;

    pub(crate) fn pair(cipher: Cipher) -> (Session, Session) {
        let k1 = [1u8; 32];
        let k2 = [2u8; 32];
        let mk = |local, remote, send, recv, addr: [u8; 4]| {
            Session::new(SessionParams {
                local_index: local,
                remote_index: remote,
                cipher,
                keys: SessionKeys { send, recv },
                endpoint: "127.0.0.1:1".parse().unwrap(),
                peer_addr: addr.into(),
                peer_addr6: None,
                confirmed: true,
                stats: Arc::default(),
            })
        };
        (mk(10, 20, k1, k2, [10, 0, 0, 2]), mk(20, 10, k2, k1, [10, 0, 0, 1]))
    }

    #[test]
    fn data_on_a_dropped_session_is_reported_once_a_second() {
        let (a, _) = pair(Cipher::Aes128Gcm);
        assert!(a.should_report_stale(5));
        assert!(!a.should_report_stale(5));
        assert!(!a.should_report_stale(1004));
        assert!(a.should_report_stale(1005));
        assert!(!a.should_report_stale(1500));
    }

    #[test]
    fn seal_open_replay_and_tamper() {
        for cipher in Cipher::ALL {
            let (a, b) = pair(cipher);
            let mut buf = vec![0u8; DATA_HEADER_LEN + 100 + TAG_LEN];
            buf[DATA_HEADER_LEN..DATA_HEADER_LEN + 100].fill(0xab);
            let n = a.seal(&mut buf, 100).unwrap();
            assert_eq!(n, a.overhead() + 100);
            let sealed = buf[..n].to_vec();
            let hdr = DataHeader::parse(&sealed).unwrap();
            assert_eq!(hdr.receiver_index, 20);
            assert_eq!(hdr.counter, 0);
            let mut d = sealed.clone();
            assert_eq!(b.open(&hdr, &mut d), Ok(100));
            assert!(d[DATA_HEADER_LEN..DATA_HEADER_LEN + 100].iter().all(|x| *x == 0xab));
            let mut d = sealed.clone();
            assert_eq!(b.open(&hdr, &mut d), Err(DropReason::Replay), "{cipher}");
            {
                // A tampered copy with a fresh counter must fail authentication and
                // must not advance the window, in every mode including `none`.
                let mut t = sealed.clone();
                t[8] = 1; // counter 1 in the header (also the AAD)
                let th = DataHeader::parse(&t).unwrap();
                assert_eq!(b.open(&th, &mut t), Err(DropReason::AuthFailed));
                let mut buf = vec![0u8; DATA_HEADER_LEN + 10 + TAG_LEN];
                let n = a.seal(&mut buf, 10).unwrap();
                let h1 = DataHeader::parse(&buf).unwrap();
                assert_eq!(h1.counter, 1);
                assert_eq!(b.open(&h1, &mut buf[..n]), Ok(10));
            }
        }
    }

    #[test]
    fn seal_refuses_short_buffer() {
        let (a, _) = pair(Cipher::Aes128Gcm);
        let mut buf = vec![0u8; DATA_HEADER_LEN + 10];
        assert_eq!(a.seal(&mut buf, 10), None);
    }
}
