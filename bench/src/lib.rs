//! weft-bench: benchmarks of Weft. The criterion benches live in `benches/`, the netns
//! throughput comparison in `netns/compare.sh`, and recorded results in `RESULTS.md`.
//! This library holds the synthetic traffic the benches share, the virtual-clock
//! [`harness`] that drives real engines and the real data plane in memory, and the
//! mesh simulator [`sim`] behind the `meshsim` binary and `tests/sim.rs`, whose node
//! can answer `weft status` on a control socket ([`control`]).
//!
//! ```text
//!  sim::Net (event queue, links, loss, partitions)
//!     |  Deliver / Timer / Boot events on a virtual clock
//!     v
//!  harness::Host (weft_peers::Node + snapshot + TUN) --- harness::DataPlane (real Rx/Tx)
//! ```
//!
//! It is not part of any shipped binary: nothing here runs in `weft up`.
#![warn(missing_docs)]

pub mod control;
pub mod harness;
pub mod sim;

/// Length of the IPv4 + TCP headers of the synthetic packets.
pub const HEADERS: usize = 40;

/// A TCP/IPv4 packet from `src` to `dst` with `payload` bytes, checksums left zero.
pub fn tcp4_packet(src: [u8; 4], dst: [u8; 4], seq: u32, payload: usize) -> Vec<u8> {
    let total = HEADERS + payload;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    let csum = ipv4_checksum(&p[..20]);
    p[10..12].copy_from_slice(&csum.to_be_bytes());
    p[20..22].copy_from_slice(&5001u16.to_be_bytes());
    p[22..24].copy_from_slice(&40000u16.to_be_bytes());
    p[24..28].copy_from_slice(&seq.to_be_bytes());
    p[32] = 5 << 4; // data offset
    p[33] = 0x10; // ACK
    p[34..36].copy_from_slice(&65535u16.to_be_bytes());
    for (i, b) in p[HEADERS..].iter_mut().enumerate() {
        *b = i as u8;
    }
    p
}

/// The ones' complement checksum of an IPv4 header.
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checksum_verifies() {
        let p = tcp4_packet([10, 0, 0, 1], [10, 0, 0, 2], 1, 100);
        assert_eq!(ipv4_checksum(&p[..20]), 0);
        assert_eq!(p.len(), 140);
    }
}
