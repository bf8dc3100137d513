//! Virtio-net GSO super-packets: what a TUN with offload hands TX (a virtio header,
//! then one IP packet of up to 64 KiB that the kernel would have cut into MTU-sized
//! segments), checked and either split here or carried whole.
//!
//! On reliable connections (TCP, WebSocket) a super-packet travels as one sealed
//! record ([`weft_core::wire::FLAG_GSO`]): one AEAD call and one frame instead of ~45, no
//! TSO split and no GRO on the far side. The receiver writes it to its TUN as is when
//! the TUN has offload, and splits it with [`split`] otherwise. Everything in the
//! header is checked first ([`normalize`]): the record comes from a member, and a
//! header the kernel or the splitter would misread is dropped instead.

use std::io;

use tun_rs::{
    VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6, VIRTIO_NET_HDR_GSO_UDP_L4, VIRTIO_NET_HDR_LEN, VirtioNetHdr,
};

/// `gso_type` of a packet that is not a super-packet.
pub const GSO_NONE: u8 = 0;
/// `flags`: the transport checksum is partial (from `csum_start`, stored at
/// `csum_start + csum_offset`).
pub const F_NEEDS_CSUM: u8 = 1;
/// Most segments a GSO record may stand for: a receiver splits it into that many
/// buffers (a 64 KiB super-packet of 1380-byte segments is 48). Larger ones, from a
/// path with a small MSS, are split by the sender.
pub const MAX_SEGMENTS: usize = 64;
/// `gso_type` bit: TCP with ECN.
const GSO_ECN: u8 = 0x80;

fn bad(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The virtio header in front of `pkt`.
pub fn header(pkt: &[u8]) -> io::Result<VirtioNetHdr> {
    if pkt.len() <= VIRTIO_NET_HDR_LEN {
        return Err(bad("packet shorter than its virtio header"));
    }
    VirtioNetHdr::decode(&pkt[..VIRTIO_NET_HDR_LEN])
}

/// Checks the super-packet `pkt` (virtio header, then the IP packet) and rewrites its
/// `hdr_len` from the packet's own headers (the kernel's may cover a whole forwarded
/// packet, a member's may be anything). Returns the header and the number of
/// segments it stands for. Errors for anything that is not a TCP or UDP super-packet
/// whose header agrees with the packet.
pub fn normalize(pkt: &mut [u8]) -> io::Result<(VirtioNetHdr, usize)> {
    let mut hdr = header(pkt)?;
    let ip = &pkt[VIRTIO_NET_HDR_LEN..];
    let v6 = match ip[0] >> 4 {
        4 => false,
        6 => true,
        _ => return Err(bad("not an IP packet")),
    };
    if hdr.gso_size == 0 {
        return Err(bad("GSO size zero"));
    }
    // The kernel marks every super-packet's checksum partial; without it a TUN may
    // refuse the write.
    if hdr.flags & F_NEEDS_CSUM == 0 {
        return Err(bad("GSO without a partial checksum"));
    }
    let base = hdr.gso_type & !GSO_ECN;
    let tcp = match base {
        VIRTIO_NET_HDR_GSO_TCPV4 if !v6 => true,
        VIRTIO_NET_HDR_GSO_TCPV6 if v6 => true,
        VIRTIO_NET_HDR_GSO_UDP_L4 if hdr.gso_type & GSO_ECN == 0 => false,
        _ => return Err(bad("GSO type does not match the packet")),
    };
    let start = usize::from(hdr.csum_start);
    if start < ip_header_len(ip) {
        return Err(bad("checksum start inside the IP header"));
    }
    let l4 = if tcp {
        let off = ip.get(start + 12).ok_or_else(|| bad("packet shorter than its TCP header"))?;
        let l = usize::from(off >> 4) * 4;
        if !(20..=60).contains(&l) {
            return Err(bad("bad TCP header length"));
        }
        l
    } else {
        8
    };
    let hdr_len = start + l4;
    if hdr_len > ip.len() || usize::from(hdr.csum_offset) != if tcp { 16 } else { 6 } {
        return Err(bad("virtio header does not match the packet"));
    }
    let payload = ip.len() - hdr_len;
    hdr.hdr_len = u16::try_from(hdr_len).map_err(|_| bad("header too long"))?;
    hdr.encode(&mut pkt[..VIRTIO_NET_HDR_LEN])?;
    Ok((hdr, payload.div_ceil(usize::from(hdr.gso_size))))
}

/// Splits what a TUN with offload returned (`pkt`: virtio header, then the packet)
/// into `bufs`, each packet at `offset` with its length in `sizes`, like the kernel
/// would have segmented it (checksums completed). Returns the number of packets.
pub fn split<B: AsRef<[u8]> + AsMut<[u8]>>(
    pkt: &mut [u8],
    bufs: &mut [B],
    sizes: &mut [usize],
    offset: usize,
) -> io::Result<usize> {
    let hdr = header(pkt)?;
    if hdr.gso_type == GSO_NONE {
        let ip = &mut pkt[VIRTIO_NET_HDR_LEN..];
        if hdr.flags & F_NEEDS_CSUM != 0 {
            complete_checksum(ip, usize::from(hdr.csum_start), usize::from(hdr.csum_offset))?;
        }
        let (Some(buf), Some(size)) = (bufs.first_mut(), sizes.first_mut()) else {
            return Err(bad("no buffer"));
        };
        let dst = buf.as_mut().get_mut(offset..offset + ip.len()).ok_or_else(|| bad("packet larger than a buffer"))?;
        dst.copy_from_slice(ip);
        *size = ip.len();
        return Ok(1);
    }
    let (hdr, _) = normalize(pkt)?;
    let v6 = pkt[VIRTIO_NET_HDR_LEN] >> 4 == 6;
    tun_rs::gso_split(&mut pkt[VIRTIO_NET_HDR_LEN..], hdr, bufs, sizes, offset, v6)
}

/// Splits the super-packet `pkt` into `bufs` resized for it, each packet behind
/// [`VIRTIO_NET_HDR_LEN`] bytes of headroom (RX's write layout). Returns the number
/// of packets.
pub fn split_into(pkt: &mut [u8], bufs: &mut [Vec<u8>]) -> io::Result<usize> {
    let hdr = header(pkt)?;
    let (count, each) = if hdr.gso_type == GSO_NONE {
        (1, pkt.len() - VIRTIO_NET_HDR_LEN)
    } else {
        let (h, segs) = normalize(pkt)?;
        (segs, usize::from(h.hdr_len) + usize::from(h.gso_size))
    };
    let mut sizes = [0usize; tun_rs::IDEAL_BATCH_SIZE];
    if count > bufs.len().min(sizes.len()) {
        return Err(bad("more segments than buffers"));
    }
    let bufs = &mut bufs[..count];
    for b in bufs.iter_mut() {
        b.resize(VIRTIO_NET_HDR_LEN + each, 0);
    }
    let n = split(pkt, bufs, &mut sizes[..count], VIRTIO_NET_HDR_LEN)?;
    for (b, s) in bufs.iter_mut().zip(sizes) {
        b.truncate(VIRTIO_NET_HDR_LEN + s);
    }
    Ok(n)
}

/// Length of the IP header of `ip` (IPv4: IHL; IPv6: the fixed header); the
/// transport header, and every field a virtio header may make us write, lies behind it.
fn ip_header_len(ip: &[u8]) -> usize {
    match ip.first().map(|b| b >> 4) {
        Some(4) => (usize::from(ip[0] & 0x0f) * 4).max(20),
        _ => 40,
    }
}

/// Completes a partial transport checksum in place (`NEEDS_CSUM` without GSO). The
/// header comes from a member on the receiving side: the checksum must start behind
/// the IP header and be a TCP or UDP one, or a member could rewrite the addresses it
/// was checked by.
fn complete_checksum(ip: &mut [u8], start: usize, offset: usize) -> io::Result<()> {
    if start < ip_header_len(ip) || (offset != 16 && offset != 6) {
        return Err(bad("partial checksum outside the transport header"));
    }
    let at = start.checked_add(offset).ok_or_else(|| bad("checksum offset overflows"))?;
    if at + 2 > ip.len() {
        return Err(bad("checksum field outside the packet"));
    }
    let initial = u16::from_be_bytes([ip[at], ip[at + 1]]);
    ip[at..at + 2].fill(0);
    let sum = tun_rs::checksum(&ip[start..], u64::from(initial));
    ip[at..at + 2].copy_from_slice(&(!sum).to_be_bytes());
    Ok(())
}

/// Whether the TCP or UDP checksum of the IP packet `ip` verifies: `Some` for an
/// unfragmented TCP or UDP packet (IPv4, or IPv6 without extension headers) whose
/// lengths agree, `None` for anything else (not checked). A UDP-over-IPv4 checksum
/// of zero means the sender computed none (RFC 768): it verifies.
///
/// RX checks a sample of what members send ([`crate::pipeline`]): a packet whose
/// checksum fails was corrupted before its sender sealed it (the AEAD covers the
/// rest of the way), which is what a TUN offload that the kernel gets wrong does.
pub fn transport_checksum_ok(ip: &[u8]) -> Option<bool> {
    let (proto, l4, pseudo) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            if ihl < 20 || total < ihl || total > ip.len() || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
                return None;
            }
            let l4 = &ip[ihl..total];
            let sum = tun_rs::checksum_no_fold(&ip[12..20], 0);
            (ip[9], l4, sum)
        }
        6 => {
            if ip.len() < 40 {
                return None;
            }
            let total = 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let l4 = ip.get(40..total)?;
            (ip[6], l4, tun_rs::checksum_no_fold(&ip[8..40], 0))
        }
        _ => return None,
    };
    let at = match proto {
        6 if l4.len() >= 20 => 16,
        17 if l4.len() >= 8 => 6,
        _ => return None,
    };
    if proto == 17 && ip[0] >> 4 == 4 && l4[at..at + 2] == [0, 0] {
        return Some(true);
    }
    let len = u32::try_from(l4.len()).ok()?;
    let sum = pseudo + u64::from(proto) + u64::from(len >> 16) + u64::from(len & 0xffff);
    Some(tun_rs::checksum(l4, sum) == 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP/IPv4 super-packet as a TUN with offload hands it out: `segs` segments of
    /// `mss` bytes, partial checksum.
    pub(crate) fn super_packet(mss: usize, segs: usize) -> Vec<u8> {
        let payload = mss * segs;
        let mut p = vec![0u8; VIRTIO_NET_HDR_LEN + 40 + payload];
        let hdr = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
            hdr_len: 40,
            gso_size: mss as u16,
            csum_start: 20,
            csum_offset: 16,
        };
        hdr.encode(&mut p).unwrap();
        let ip = &mut p[VIRTIO_NET_HDR_LEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 0, 0, 2]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 1]);
        ip[32] = 5 << 4;
        for (i, b) in ip[40..].iter_mut().enumerate() {
            *b = i as u8;
        }
        p
    }

    #[test]
    fn a_super_packet_splits_into_its_segments() {
        let mut p = super_packet(1000, 5);
        let mut bufs = vec![Vec::new(); 8];
        assert_eq!(split_into(&mut p, &mut bufs).unwrap(), 5);
        for (i, b) in bufs[..5].iter().enumerate() {
            let ip = &b[VIRTIO_NET_HDR_LEN..];
            assert_eq!(ip.len(), 1040);
            assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 1040);
            assert_eq!(ip[40], (i * 1000) as u8, "segment {i} carries its own bytes");
        }
    }

    #[test]
    fn headers_that_disagree_with_the_packet_are_refused() {
        type Spoil = fn(&mut VirtioNetHdr);
        let cases: [(&str, Spoil); 5] = [
            ("no partial checksum", |h| h.flags = 0),
            ("v6 type on v4", |h| h.gso_type = VIRTIO_NET_HDR_GSO_TCPV6),
            ("zero size", |h| h.gso_size = 0),
            ("start in IP header", |h| h.csum_start = 4),
            ("wrong offset", |h| h.csum_offset = 6),
        ];
        for (what, f) in cases {
            let mut p = super_packet(1000, 3);
            let mut h = header(&p).unwrap();
            f(&mut h);
            h.encode(&mut p).unwrap();
            assert!(normalize(&mut p).is_err(), "{what}");
            assert!(split_into(&mut p, &mut vec![Vec::new(); 8]).is_err(), "{what}");
        }
        // A TCP header longer than the packet, a header of 8 bytes.
        let mut p = super_packet(1000, 1);
        p.truncate(VIRTIO_NET_HDR_LEN + 33);
        assert!(normalize(&mut p).is_err());
        assert!(header(&[0u8; 10]).is_err());
    }

    #[test]
    fn a_partial_checksum_never_touches_the_ip_header() {
        // No GSO, NEEDS_CSUM at the start of the packet: completing it would rewrite
        // the version and length (a member could turn a checked IPv4 packet into an
        // IPv6 one with another source).
        for (start, offset) in [(0u16, 0u16), (0, 16), (12, 6), (20, 2)] {
            let mut p = super_packet(1000, 1);
            let mut h = header(&p).unwrap();
            h.gso_type = GSO_NONE;
            h.csum_start = start;
            h.csum_offset = offset;
            h.encode(&mut p).unwrap();
            let before = p[VIRTIO_NET_HDR_LEN..VIRTIO_NET_HDR_LEN + 20].to_vec();
            assert!(split_into(&mut p, &mut vec![Vec::new(); 4]).is_err(), "{start}/{offset}");
            assert_eq!(p[VIRTIO_NET_HDR_LEN..VIRTIO_NET_HDR_LEN + 20], before[..]);
        }
        // IPv4 options: the transport header starts behind them.
        let mut p = super_packet(1000, 2);
        p[VIRTIO_NET_HDR_LEN] = 0x46;
        assert!(normalize(&mut p).is_err(), "checksum start inside the options");
    }

    #[test]
    fn hdr_len_is_taken_from_the_packet() {
        let mut p = super_packet(1000, 3);
        let mut h = header(&p).unwrap();
        h.hdr_len = 3040;
        h.encode(&mut p).unwrap();
        let (h, segs) = normalize(&mut p).unwrap();
        assert_eq!((h.hdr_len, segs), (40, 3));
        assert_eq!(header(&p).unwrap().hdr_len, 40);
    }

    #[test]
    fn transport_checksums_are_verified_as_the_receiving_kernel_would() {
        // Segments this splitter completed verify; one flipped byte does not.
        let mut p = super_packet(1000, 3);
        let mut bufs = vec![Vec::new(); 4];
        let n = split_into(&mut p, &mut bufs).unwrap();
        for b in &mut bufs[..n] {
            let ip = &mut b[VIRTIO_NET_HDR_LEN..];
            assert_eq!(transport_checksum_ok(ip), Some(true));
            ip[500] ^= 0x40;
            assert_eq!(transport_checksum_ok(ip), Some(false));
        }
        // UDP over IPv6, checked against the scalar RFC 1071 sum of weft-core.
        let mut v6 = vec![0u8; 40 + 8 + 31];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&39u16.to_be_bytes());
        v6[6] = 17;
        v6[8..24].copy_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        v6[24..40].copy_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        v6[40..42].copy_from_slice(&5000u16.to_be_bytes());
        v6[42..44].copy_from_slice(&53u16.to_be_bytes());
        v6[44..46].copy_from_slice(&39u16.to_be_bytes());
        for (i, b) in v6[48..].iter_mut().enumerate() {
            *b = 0xa0 ^ i as u8;
        }
        let mut pseudo = v6[8..40].to_vec();
        pseudo.extend_from_slice(&[0, 0, 0, 39, 0, 0, 0, 17]);
        pseudo.extend_from_slice(&v6[40..]);
        let sum = weft_core::wire::checksum(&pseudo, 0);
        v6[46..48].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(transport_checksum_ok(&v6), Some(true));
        v6[60] ^= 1;
        assert_eq!(transport_checksum_ok(&v6), Some(false));
        // Not checked: UDP/IPv4 without a checksum verifies, fragments, other protocols,
        // lengths that disagree.
        let mut udp4 = vec![0u8; 20 + 8 + 10];
        udp4[0] = 0x45;
        udp4[2..4].copy_from_slice(&38u16.to_be_bytes());
        udp4[9] = 17;
        assert_eq!(transport_checksum_ok(&udp4), Some(true));
        let mut frag = udp4.clone();
        frag[6] = 0x20;
        assert_eq!(transport_checksum_ok(&frag), None);
        let mut icmp = udp4.clone();
        icmp[9] = 1;
        assert_eq!(transport_checksum_ok(&icmp), None);
        let mut long = udp4.clone();
        long[2..4].copy_from_slice(&400u16.to_be_bytes());
        assert_eq!(transport_checksum_ok(&long), None);
        assert_eq!(transport_checksum_ok(&[0x45]), None);
    }
}
