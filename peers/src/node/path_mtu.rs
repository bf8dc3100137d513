//! Each member's path MTU and offload check ([`crate::pmtu::PathMtu`]): rounds of
//! padded probes on the member's UDP path, the answers to its probes, and what the
//! pipelines are told (the largest inner packet the path carries, whether its
//! datagrams must go one by one).

use std::time::Instant;

use rand::RngCore;
use tracing::{debug, info, warn};
use weft_core::endpoint::Proto;
use weft_core::handshake::caps;
use weft_core::wire::{DATA_HEADER_LEN, FLAG_CONTROL};

use crate::identity::PeerKey;
use crate::mesh::Msg;
use crate::node::{Action, Node, ms_since};
use crate::pmtu::{Found, STEADY_EVERY};

impl Node {
    /// Runs a round of the member's path MTU measurement when one is due: only on a
    /// UDP path (a stream carries any size) to a member that answers probes.
    pub(super) fn drive_path_mtu(&mut self, now: Instant, key: PeerKey) {
        let Some(dest) = self.dest_for(&key) else { return };
        let max = self.cfg.mtu;
        let Some(p) = self.peers.get_mut(&key) else { return };
        if p.hello.protocol().caps & caps::PMTU == 0 || max == 0 {
            return;
        }
        if dest.to.proto != Proto::Udp {
            // Streams carry any size: looked at again later (the path may move).
            p.pmtu.next = Some(now + STEADY_EVERY);
            return;
        }
        p.pmtu.follow((dest.to, dest.relay.is_some()), now);
        if !p.pmtu.due(now) {
            return;
        }
        let rng = &mut self.rng;
        let (found, probes) = p.pmtu.round(now, max, || rng.next_u64());
        let id = p.id;
        match found {
            Found::Mtu(m) if m < max => {
                info!(peer = %id, mtu = m, "path MTU measured: larger packets are answered with ICMP")
            }
            Found::Mtu(m) => debug!(peer = %id, mtu = m, "path MTU measured: the full size passes"),
            Found::Lost(m) => {
                warn!(peer = %id, was = m, "packets of the measured path MTU stopped arriving: measuring again")
            }
            Found::GsoBroken => warn!(
                peer = %id,
                "the path loses segmentation-offloaded (GSO) batches while single datagrams pass: UDP GSO off for it"
            ),
            Found::NoAnswer => debug!(peer = %id, "no path MTU probe answered: trying again later"),
            Found::Nothing => {}
        }
        self.apply_path_mtu(&key);
        let mut batch = Vec::new();
        for probe in probes {
            let body = Msg::Probe { nonce: probe.nonce, len: probe.size }.emit();
            if probe.batch {
                if dest.relay.is_none()
                    && let Some(bytes) = self.seal_for(&key, &body, now)
                {
                    batch.push(bytes);
                }
            } else {
                self.send_sealed(&key, &body, FLAG_CONTROL, now);
            }
        }
        if !batch.is_empty() {
            self.actions.push_back(Action::SendBatch { to: dest.to, datagrams: batch });
        }
    }

    /// Tells the member's sessions what its path carries: the measured MTU when it is
    /// below the TUN's (larger packets are then answered with ICMP), and whether its
    /// datagrams go one by one.
    pub(super) fn apply_path_mtu(&self, key: &PeerKey) {
        let Some(p) = self.peers.get(key) else { return };
        let mtu = if p.pmtu.mtu != 0 && p.pmtu.mtu < self.cfg.mtu { p.pmtu.mtu } else { 0 };
        for s in &p.sessions {
            s.session.set_path_mtu(mtu);
            s.session.set_gso_off(p.pmtu.gso_broken);
        }
    }

    /// A control message sealed on the member's session (without a relay header: for
    /// the direct path only).
    fn seal_for(&self, key: &PeerKey, body: &[u8], now: Instant) -> Option<Vec<u8>> {
        let tx = self.peers.get(key)?.tx()?;
        let mut buf = vec![0u8; DATA_HEADER_LEN + body.len() + 16];
        buf[DATA_HEADER_LEN..DATA_HEADER_LEN + body.len()].copy_from_slice(body);
        let n = tx.session.seal_with_flags(&mut buf, body.len(), FLAG_CONTROL)?;
        buf.truncate(n);
        tx.session.touch_tx(ms_since(self.cfg.epoch, now));
        Some(buf)
    }

    /// A member's probe: acknowledged at once.
    pub(super) fn answer_probe(&mut self, now: Instant, key: PeerKey, nonce: u64) {
        self.send_msg(&key, &Msg::ProbeAck(nonce), now);
    }

    /// The acknowledgement of one of our probes.
    pub(super) fn probe_acked(&mut self, key: PeerKey, nonce: u64) {
        if let Some(p) = self.peers.get_mut(&key) {
            p.pmtu.ack(nonce);
        }
    }
}
