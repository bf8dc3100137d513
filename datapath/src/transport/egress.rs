//! Where a batch of sealed frames leaves: the pipelines hand an [`Egress`] their
//! datagrams, each an [`Outgoing`] naming its endpoint and lane; UDP ones go out in one
//! `sendmmsg` on the pipeline's socket, the others as one framed batch per connection
//! and lane through the registry of [`Connections`].

use std::net::UdpSocket;
use std::sync::Arc;

use super::connections::Connections;
use super::udp::{self, Offload};
use super::{Endpoint, Lane, Outgoing, Proto, frame};

/// Frames an [`Egress::send`] could not send, by where they were going.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unsent {
    /// UDP datagrams the kernel refused.
    pub udp: usize,
    /// Frames for connections that are down or whose queue is full.
    pub link: usize,
}

impl Unsent {
    /// Counts the failures into `drops`.
    pub fn count(self, drops: &weft_core::stats::DropCounters) {
        if self.udp > 0 {
            drops.add(weft_core::stats::DropReason::UdpSend, self.udp as u64);
        }
        if self.link > 0 {
            drops.add(weft_core::stats::DropReason::LinkSend, self.link as u64);
        }
    }
}

/// Where a pipeline thread sends sealed frames: UDP datagrams through its socket
/// (GSO where possible), everything else as one framed batch per connection and run.
pub struct Egress {
    udp: Arc<UdpSocket>,
    conns: Arc<Connections>,
    offload: Arc<Offload>,
    udp_out: Vec<Outgoing>,
}

impl Egress {
    /// An egress over a pipeline's UDP socket and the node's connections.
    pub fn new(udp: Arc<UdpSocket>, conns: Arc<Connections>, offload: Arc<Offload>) -> Self {
        Self { udp, conns, offload, udp_out: Vec::with_capacity(udp::MAX_BATCH) }
    }

    /// The UDP socket (for receiving on the same one).
    pub fn udp(&self) -> &UdpSocket {
        &self.udp
    }

    /// The node's connections.
    pub fn conns(&self) -> &Connections {
        &self.conns
    }

    /// Sends every frame in `out`; returns how many could not be sent.
    pub fn send<B: AsRef<[u8]>>(&mut self, bufs: &[B], out: &[Outgoing]) -> Unsent {
        // A UDP endpoint reached from a socket of its own (the birthday method's hard
        // side) is a connection here; while there is none, UDP skips the lookup.
        let pinned = self.conns.has_pinned_udp();
        let via_socket = |o: &Outgoing| o.to.proto == Proto::Udp && !(pinned && self.conns.contains(&o.to));
        if out.iter().all(|o| o.to.proto == Proto::Udp) && !pinned {
            return Unsent { udp: udp::send_batch(&self.udp, bufs, out, &self.offload), link: 0 };
        }
        self.udp_out.clear();
        let mut failed = 0;
        // Consecutive frames to one connection travel as one batch per lane: the
        // sparse flows' frames of a mixed batch as one of their own, queued first.
        let mut runs: [Option<(Endpoint, Vec<u8>, usize)>; 2] = [None, None];
        for o in out {
            if via_socket(o) {
                self.udp_out.push(*o);
                continue;
            }
            let Some(data) = bufs.get(o.buf).and_then(|b| b.as_ref().get(o.start..o.start + o.len)) else {
                failed += 1;
                continue;
            };
            let run = &mut runs[usize::from(o.lane == Lane::Sparse)];
            match run {
                Some((ep, batch, n)) if *ep == o.to => {
                    if frame::push(batch, data) {
                        *n += 1;
                    } else {
                        failed += 1;
                    }
                }
                _ => {
                    if let Some((ep, batch, n)) = run.take() {
                        failed += self.flush(ep, batch, n, o.lane);
                    }
                    let mut batch = self.conns.buffer();
                    batch.reserve(out.len() * (frame::PREFIX + data.len()));
                    if frame::push(&mut batch, data) {
                        *run = Some((o.to, batch, 1));
                    } else {
                        failed += 1;
                    }
                }
            }
        }
        let [bulk, sparse] = runs;
        for (run, lane) in [(sparse, Lane::Sparse), (bulk, Lane::Bulk)] {
            if let Some((ep, batch, n)) = run {
                failed += self.flush(ep, batch, n, lane);
            }
        }
        let udp =
            if self.udp_out.is_empty() { 0 } else { udp::send_batch(&self.udp, bufs, &self.udp_out, &self.offload) };
        Unsent { udp, link: failed }
    }

    fn flush(&self, to: Endpoint, batch: Vec<u8>, frames: usize, lane: Lane) -> usize {
        match self.conns.send(to, batch, lane) {
            Ok(true) => 0,
            _ => frames,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::connections::{CONN_QUEUE, CONN_SPARSE_QUEUE, ConnQueue};

    #[test]
    fn egress_batches_frames_per_connection_and_counts_the_unsendable() {
        let (conns, _rx) = Connections::new(4);
        let udp = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut eg = Egress::new(udp, conns.clone(), Arc::new(Offload::new(false, false)));
        let tcp = Endpoint::new(Proto::Tcp, "192.0.2.1:11010".parse().unwrap());
        let ws = Endpoint::new(Proto::Ws, "192.0.2.2:11011".parse().unwrap());
        let (tx, mut rx) = ConnQueue::channel(conns.clone());
        conns.register(tcp, tx);
        let bufs = vec![vec![1u8; 100], vec![2u8; 200], vec![3u8; 50], vec![4u8; 60]];
        let to_udp = Endpoint::udp(peer.local_addr().unwrap());
        let bulk = |buf, len, to| Outgoing { buf, start: 0, len, to, lane: Lane::Bulk, single: false };
        let out = [bulk(0, 100, tcp), bulk(1, 200, tcp), bulk(2, 50, to_udp), bulk(3, 60, ws)];
        // The ws connection does not exist: its frame fails; the rest goes out.
        assert_eq!(eg.send(&bufs, &out), Unsent { udp: 0, link: 1 });
        let batch = rx.try_recv().unwrap();
        let frames: Vec<&[u8]> = frame::frames(&batch).collect::<Result<_, _>>().unwrap();
        assert_eq!(frames, [&bufs[0][..], &bufs[1][..]]);
        let mut got = [0u8; 100];
        assert_eq!(peer.recv(&mut got).unwrap(), 50);
        // A full queue drops whole batches, counted as failed frames.
        for _ in 0..CONN_QUEUE {
            assert_eq!(eg.send(&bufs, &out[..1]), Unsent::default());
        }
        assert_eq!(eg.send(&bufs, &out[..2]), Unsent { udp: 0, link: 2 });
    }

    #[test]
    fn a_udp_endpoint_with_a_socket_of_its_own_takes_its_frames_and_the_rest_stays_on_the_socket() {
        let (conns, _rx) = Connections::new(4);
        let udp = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut eg = Egress::new(udp, conns.clone(), Arc::new(Offload::new(false, false)));
        // The birthday method's hard side: the easy side's endpoint is reached from a
        // socket of its own, registered under the (UDP) endpoint.
        let pinned = Endpoint::udp("192.0.2.7:11010".parse().unwrap());
        let plain = Endpoint::udp(peer.local_addr().unwrap());
        let bufs = vec![vec![1u8; 100], vec![2u8; 40]];
        let bulk = |buf, len, to| Outgoing { buf, start: 0, len, to, lane: Lane::Bulk, single: false };
        assert!(!conns.has_pinned_udp());
        let (tx, mut rx) = ConnQueue::channel(conns.clone());
        let id = conns.register(pinned, tx);
        assert!(conns.has_pinned_udp());
        assert_eq!(eg.send(&bufs, &[bulk(0, 100, pinned), bulk(1, 40, plain)]), Unsent::default());
        let batch = rx.try_recv().unwrap();
        let frames: Vec<&[u8]> = frame::frames(&batch).collect::<Result<_, _>>().unwrap();
        assert_eq!(frames, [&bufs[0][..]], "the pinned endpoint's frame goes to its socket's queue");
        let mut got = [0u8; 100];
        assert_eq!(peer.recv(&mut got).unwrap(), 40, "another UDP endpoint's goes out of the pipeline's socket");
        // Unregistered: back to the fast path, UDP only through the pipeline's socket.
        conns.unregister(pinned, id);
        assert!(!conns.has_pinned_udp());
        assert_eq!(eg.send(&bufs, &[bulk(1, 40, plain)]), Unsent::default());
        assert_eq!(peer.recv(&mut got).unwrap(), 40);
        assert_eq!(rx.try_recv(), None);
    }

    #[test]
    fn sparse_frames_leave_a_connection_before_the_bulk_batches_queued_ahead_of_them() {
        let (conns, _rx) = Connections::new(4);
        let udp = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let mut eg = Egress::new(udp, conns.clone(), Arc::new(Offload::new(false, false)));
        let tcp = Endpoint::new(Proto::Tcp, "192.0.2.1:11010".parse().unwrap());
        let (tx, mut q) = ConnQueue::channel(conns.clone());
        conns.register(tcp, tx);
        let bufs: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; 1400]).collect();
        let o = |buf, lane| Outgoing { buf, start: 0, len: 1400, to: tcp, lane, single: false };
        // A download queued three batches; then a batch that mixes its packets with a
        // ping's (buffer 4) and a game packet's (buffer 5).
        for _ in 0..3 {
            assert_eq!(eg.send(&bufs, &[o(0, Lane::Bulk), o(1, Lane::Bulk)]), Unsent::default());
        }
        let mixed = [o(2, Lane::Bulk), o(4, Lane::Sparse), o(3, Lane::Bulk), o(5, Lane::Sparse)];
        assert_eq!(eg.send(&bufs, &mixed), Unsent::default());
        let frames = |b: &[u8]| -> Vec<u8> { frame::frames(b).map(|f| f.unwrap()[0]).collect() };
        assert_eq!(frames(&q.try_recv().unwrap()), [4, 5], "the sparse frames first, as one batch, in order");
        for _ in 0..3 {
            assert_eq!(frames(&q.try_recv().unwrap()), [0, 1]);
        }
        assert_eq!(frames(&q.try_recv().unwrap()), [2, 3], "the bulk frames keep their order");
        assert_eq!(q.try_recv(), None);
        // A sparse lane that is full sends on through the bulk one: nothing is lost.
        for _ in 0..CONN_SPARSE_QUEUE + 2 {
            assert_eq!(conns.send(tcp, vec![9], Lane::Sparse), Ok(true));
        }
        assert_eq!(std::iter::from_fn(|| q.try_recv()).count(), CONN_SPARSE_QUEUE + 2);
    }
}
