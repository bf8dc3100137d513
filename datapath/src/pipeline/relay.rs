//! Relaying: frames for another member go on toward it (hop limit clamped, only from
//! neighbours), whether they came over UDP or a stream connection.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use arc_swap::ArcSwap;

use super::PipelineStats;
use crate::transport::{Connections, Endpoint, Forward, Lane, frame};
use weft_core::route::RouteSnapshot;
use weft_core::stats::DropReason;
use weft_core::wire::{FLAG_GSO, FLAG_SPARSE, MAX_HOPS, MessageType, RELAY_HEADER_LEN, RelayHeader};

pub(super) enum Hop {
    /// For us: the inner datagram starts at this offset; relayed by this node.
    Local(usize, Option<[u8; 8]>),
    /// A relayed frame for someone else, hop limit already decremented.
    Forward(Endpoint),
    /// Dropped and counted.
    Drop,
}

/// Unwraps a relay header addressed to us, or decides where a frame for someone else
/// goes. Relayed frames are accepted only from direct neighbours' current endpoints
/// (where their authenticated packets arrive), and forwarded with at most
/// [`MAX_HOPS`] hops left.
pub(super) fn relay_or_local(routes: &RouteSnapshot, stats: &PipelineStats, from: Endpoint, data: &mut [u8]) -> Hop {
    if MessageType::of(data) != Some(MessageType::Relay) {
        return Hop::Local(0, None);
    }
    if !routes.is_neighbour(&from) {
        stats.drops.add(DropReason::RelayRefused, 1);
        return Hop::Drop;
    }
    match relay_rule(routes, data) {
        Ok(RelayTo::Us(src)) => Hop::Local(RELAY_HEADER_LEN, Some(src)),
        Ok(RelayTo::Next(next)) => {
            take_hop(&mut data[1]);
            Hop::Forward(next)
        }
        Err(reason) => {
            stats.drops.add(reason, 1);
            Hop::Drop
        }
    }
}

/// Where a relayed frame from a direct neighbour goes.
pub(super) enum RelayTo {
    /// Unwrapped here: the end-to-end sender.
    Us([u8; 8]),
    /// On to this next hop.
    Next(Endpoint),
}

/// The relay rules for `data`, a `RELAY` frame from a direct neighbour (both checked
/// by the caller); reads, never changes. Shared by the connection RX path
/// ([`relay_or_local`]) and the readers' [`StreamRelay`].
pub(super) fn relay_rule(routes: &RouteSnapshot, data: &[u8]) -> Result<RelayTo, DropReason> {
    let h = RelayHeader::parse(data).map_err(|_| DropReason::Malformed)?;
    if &h.dst == routes.local() {
        // A relay inside a relay is never produced by a correct node.
        if MessageType::of(&data[RELAY_HEADER_LEN..]) == Some(MessageType::Relay) {
            return Err(DropReason::Malformed);
        }
        return Ok(RelayTo::Us(h.src));
    }
    if h.hop_limit == 0 {
        return Err(DropReason::HopLimit);
    }
    routes.next_hop(&h.dst).map(RelayTo::Next).ok_or(DropReason::NoRoute)
}

/// Relays frames from the connections' readers ([`Forward`], set on the node's
/// [`Connections`]): every relayed frame whose next hop is a stream connection goes to that
/// connection's queue from the reader, without a trip through a connection RX thread and
/// back (those two thread hand-offs per batch were most of a WebSocket relay's cost,
/// bench/RESULTS.md §22). A batch of nothing else for one next hop and lane (the
/// common case on a relay) goes in the same buffer; in a mixed batch the relayed
/// frames are copied out, in one batch per next hop and lane (`relayed_lane`), and
/// the rest stays, in order, for the connection RX thread. The rules are `relay_or_local`'s,
/// frame by frame, so a frame takes the same way whatever else shares its batch: a
/// flow is never reordered by it (but for one whose frames change lane, as on the
/// sender's own connection).
pub struct StreamRelay {
    pub(super) routes: Arc<ArcSwap<RouteSnapshot>>,
    pub(super) stats: Arc<PipelineStats>,
}

impl StreamRelay {
    /// A relay on the current route snapshot in `routes`, counting what it cannot
    /// send in `stats`.
    pub fn new(routes: Arc<ArcSwap<RouteSnapshot>>, stats: Arc<PipelineStats>) -> Self {
        Self { routes, stats }
    }

    /// Queues `batch` (`frames` relayed frames) in `lane` of the connection to `to`.
    pub(super) fn send(&self, conns: &Connections, to: Endpoint, batch: Vec<u8>, frames: usize, lane: Lane) {
        self.stats.forwarded.fetch_add(frames as u64, Relaxed);
        if matches!(conns.send(to, batch, lane), Ok(true)) {
            conns.counters.relayed_batches.fetch_add(1, Relaxed);
        } else {
            self.stats.drops.add(DropReason::LinkSend, frames as u64);
        }
    }
}

impl Forward for StreamRelay {
    fn forward(&self, conns: &Connections, from: Endpoint, mut batch: Vec<u8>) -> Option<Vec<u8>> {
        let routes = self.routes.load();
        if !routes.is_neighbour(&from) {
            return Some(batch);
        }
        // Where each frame goes: all to one stream next hop in one lane, none, or some.
        let (mut one, mut relayed, mut all) = (None, 0usize, true);
        let mut at = 0;
        while let Some(Ok(r)) = frame::first(&batch[at..]) {
            let data = &batch[at + r.start..at + r.end];
            match stream_next_hop(&routes, data).map(|next| (next, relayed_lane(data))) {
                Some(next) if one.is_none_or(|o| o == next) => {
                    one = Some(next);
                    relayed += 1;
                }
                Some(_) => {
                    relayed += 1;
                    all = false;
                }
                None => all = false,
            }
            at += r.end;
        }
        if relayed == 0 {
            return Some(batch);
        }
        if let (true, true, Some((to, lane))) = (all, at == batch.len(), one) {
            let mut at = 0;
            while let Some(Ok(r)) = frame::first(&batch[at..]) {
                take_hop(&mut batch[at + r.start + 1]);
                at += r.end;
            }
            self.send(conns, to, batch, relayed, lane);
            return None;
        }
        // Mixed: relayed frames leave in one batch per next hop and lane, each in the
        // order it came; the rest moves up, in order.
        let (mut keep, mut at) = (0, 0);
        let mut runs: Vec<((Endpoint, Lane), Vec<u8>, usize)> = Vec::new();
        while let Some(Ok(r)) = frame::first(&batch[at..]) {
            let (record, data) = (at..at + r.end, at + r.start..at + r.end);
            at += r.end;
            let Some(next) = stream_next_hop(&routes, &batch[data.clone()]) else {
                batch.copy_within(record.clone(), keep);
                keep += record.len();
                continue;
            };
            let next = (next, relayed_lane(&batch[data.clone()]));
            take_hop(&mut batch[data.start + 1]);
            let i = match runs.iter().position(|(to, _, _)| *to == next) {
                Some(i) => i,
                None => {
                    runs.push((next, conns.buffer(), 0));
                    runs.len() - 1
                }
            };
            let (_, b, n) = &mut runs[i];
            frame::push(b, &batch[data]);
            *n += 1;
        }
        for ((to, lane), b, n) in runs {
            self.send(conns, to, b, n, lane);
        }
        // What does not parse stays too, for the connection RX thread to count.
        let tail = batch.len() - at;
        batch.copy_within(at.., keep);
        batch.truncate(keep + tail);
        if batch.is_empty() {
            conns.recycle(batch);
            return None;
        }
        Some(batch)
    }
}

/// Largest relayed frame a relay passes on in the sparse lane: a ping, a keystroke, a
/// game packet or a DNS query fits; a member that flags its bulk gains nothing on
/// relays with full-size packets (the sparse lane is never CoDel's to drop).
pub const RELAY_SPARSE_MAX: usize = 1024;

/// The lane a relayed frame `data` (relay header first) goes on in: a small packet of
/// a sparse flow, as its sender flagged it ([`FLAG_SPARSE`] in the sealed data header
/// the relay header carries; never a GSO record, never over [`RELAY_SPARSE_MAX`]),
/// waits in no bulk lane of the next connection, nor in a GSO run of bulk datagrams;
/// everything else is bulk. Relays never open the frame: a sender picks its small
/// frames' lane on each relay with the flag, as it would its own.
pub(super) fn relayed_lane(data: &[u8]) -> Lane {
    let inner = data.get(RELAY_HEADER_LEN..).unwrap_or_default();
    match inner {
        [t, flags, ..]
            if *t == MessageType::Data as u8
                && flags & (FLAG_SPARSE | FLAG_GSO) == FLAG_SPARSE
                && data.len() <= RELAY_SPARSE_MAX =>
        {
            Lane::Sparse
        }
        _ => Lane::Bulk,
    }
}

/// Takes one hop from a relayed frame's hop limit (checked above zero before), after
/// clamping it to [`MAX_HOPS`]: a sender may start a frame with any hop limit, but no
/// frame crosses more than MAX_HOPS relays, so a member cannot make one circle the
/// mesh for long.
pub(super) fn take_hop(hop_limit: &mut u8) {
    *hop_limit = (*hop_limit).min(MAX_HOPS) - 1;
}

/// Where [`relay_or_local`] would forward frame `data` (from a direct neighbour), when
/// that is a stream connection; `None` for anything else. Reads, never changes.
pub(super) fn stream_next_hop(routes: &RouteSnapshot, data: &[u8]) -> Option<Endpoint> {
    if MessageType::of(data) != Some(MessageType::Relay) {
        return None;
    }
    match relay_rule(routes, data) {
        Ok(RelayTo::Next(next)) if next.proto.is_stream() => Some(next),
        _ => None,
    }
}
