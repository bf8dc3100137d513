//! Answers sent while warm. When the RX thread writes a packet to the TUN, the kernel
//! handles it inside that write: an echo reply, or anything else the kernel answers
//! at once, is in the TUN queue before the write returns (the queue the flow was
//! written on). After a batch of only sparse flows' packets the RX thread reads that
//! queue without waiting (`preadv2` with `RWF_NOWAIT`, the descriptor stays blocking
//! for the TX thread) and seals and sends what it finds, instead of leaving it to the
//! TX thread, which has to be woken and get a CPU first — beside a download, a wait
//! for a busy CPU. Whichever thread reads a packet first sends it.

use std::io::{self, IoSliceMut};
use std::sync::atomic::Ordering::Relaxed;

use rustix::io::{ReadWriteFlags, preadv2};
use tracing::debug;
use tun_rs::SyncDevice;

use super::{Device, PipelineConfig, PipelineStats, Shared, Tx};
use crate::transport::Egress;

/// Reads after one batch, at most: the answers to a few sparse packets, not a second TX.
const READS: usize = 4;

/// The RX thread's own TX half, for the answers it reads.
pub(super) struct Answers {
    tx: Tx,
}

impl Answers {
    /// For a thread writing to `dev`, when it is a TUN queue.
    pub(super) fn new(dev: &Device, cfg: PipelineConfig, shared: &Shared) -> Option<Self> {
        let Device::Tun(_) = dev else { return None };
        let mut tx = Tx::new(cfg);
        tx.firewall = Some(shared.firewall.clone());
        tx.answering = true;
        Some(Self { tx })
    }

    /// Sends what waits in TUN queue `q` (up to [`READS`] reads, and none after a
    /// TCP segment that is not a bare ACK: data the kernel sent inside the write
    /// belongs to a flow with more waiting, the TX thread's), counted in
    /// [`PipelineStats::tx_answers`] (datagrams or records sent). Returns false when
    /// the TUN cannot be read this way (before Linux 6.4 a TUN refuses `RWF_NOWAIT`):
    /// the caller stops asking.
    pub(super) fn take(&mut self, q: &SyncDevice, egress: &mut Egress, shared: &Shared, stats: &PipelineStats) -> bool {
        let mut sent = 0;
        let mut usable = true;
        for _ in 0..READS {
            match self.tx.read_with(|buf| read_now(q, buf), egress, shared, stats) {
                // A super-packet sealed whole as one record (to a connection).
                Ok(0) => {
                    sent += 1;
                    break;
                }
                Ok(n) => {
                    self.tx.answered_tcp_data = false;
                    self.tx.send(n, egress, shared, stats);
                    sent += self.tx.out.len();
                    if self.tx.answered_tcp_data {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => break,
                Err(e) => {
                    debug!(error = %e, "the TUN queue cannot be read without waiting: answers stay with the TX thread");
                    usable = false;
                    break;
                }
            }
        }
        if sent > 0 {
            stats.tx_answers.fetch_add(sent as u64, Relaxed);
        }
        usable
    }
}

/// One packet from TUN queue `q` if one is there now: `WouldBlock` otherwise. The
/// descriptor's own mode is untouched (the TX thread's reads keep waiting).
fn read_now(q: &SyncDevice, buf: &mut [u8]) -> io::Result<usize> {
    // u64::MAX: the file's current position (a TUN has none).
    Ok(preadv2(q, &mut [IoSliceMut::new(buf)], u64::MAX, ReadWriteFlags::NOWAIT)?)
}
