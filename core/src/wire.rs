//! The wire format: a fixed header in front of every datagram (16 bytes for data, 12 for
//! a handshake message, 8 for a reject before its mac1, 20 for a relay frame).
//!
//! ```text
//! data        | type=4 | flags | lane u16 | receiver_index u32 | counter u64 | ciphertext | tag 16 |
//! handshake   | type=1..3 | pattern | 0u16 | sender_index u32 | receiver_index u32 | noise message |
//! reject      | type=5 | reason | 0u16 | receiver_index u32 |
//! relay       | type=6 | hop_limit | 0u16 | dst node id 8 | src node id 8 | inner datagram |
//! ```
//!
//! docs/reference/wire.md describes these and the messages inside sessions.
//!
//! All integers are little-endian. Each header is a small `Copy` value: `parse` reads
//! it from the front of a datagram (handshakes also return the message that follows),
//! `emit` writes it back; nothing here holds on to the buffer.

use thiserror::Error;

/// Length of the data header, which is also the AAD of the AEAD.
pub const DATA_HEADER_LEN: usize = 16;
/// Length of the handshake header in front of a Noise message.
pub const HANDSHAKE_HEADER_LEN: usize = 12;
/// Length of the relay header in front of a forwarded datagram.
pub const RELAY_HEADER_LEN: usize = 20;
/// Hop limit of a fresh relay header (as IP's TTL: meshes that grow by members joining
/// through any other member form long chains of links; a loop costs at most this many
/// forwards).
pub const MAX_HOPS: u8 = 64;
/// Data header flag: the plaintext is a control message for the peer's control
/// plane, not an IP packet.
pub const FLAG_CONTROL: u8 = 0x01;
/// Data header flag: the plaintext is a GSO super-packet (a virtio-net header, then
/// one IP packet of up to 64 KiB; see `weft_datapath::gso`). Sent only on reliable
/// connections to peers whose hello says they take it.
pub const FLAG_GSO: u8 = 0x02;
/// Data header flag: the plaintext is a TCP segment with data, SYN, FIN or RST (not a
/// bare ACK) sent straight to a peer that takes [`FLAG_GSO`] records over QUIC, from a
/// node that sends them: the connection carries it on the record stream, in order with
/// the records, instead of as a datagram that would overtake the records queued ahead
/// of it (the peer's TCP would see its segments reordered and retransmit). Receivers
/// need not know it.
pub const FLAG_ORDERED: u8 = 0x04;
/// Data header flag: the packet belongs to a sparse inner flow (a ping, DNS, SSH, a
/// game or a call: under [`crate::queue::BULK_BYTES`] per window) and is not a bare TCP
/// ACK. A receiver with several UDP sockets steers it to another socket than the
/// session's bulk packets, so it is read and opened by a thread that is not working
/// through a download (`weft_datapath::transport::udp::steer_sparse`), relayed or
/// not; a relay passes a relayed frame of up to 1 KiB that carries it on in the sparse
/// lane of the next connection (or outside any GSO run of bulk datagrams). Set on every
/// transport.
/// Kernels and relays act on it before (or without) checking the tag: whoever sends a
/// datagram picks its socket and its lane with it, as with a source port, and gets
/// nothing more (the sparse lanes are bounded, what overflows them joins the bulk; a
/// flag set or cleared on the way fails the tag like any other). Receivers need not
/// know it.
pub const FLAG_SPARSE: u8 = 0x08;
/// Length of a reject message.
pub const REJECT_LEN: usize = 8;
/// Largest datagram Weft accepts or emits.
pub const MAX_DATAGRAM: usize = 65535;

/// First byte of every datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MessageType {
    /// First handshake message (XX msg 1 or IK msg 1).
    HandshakeInit = 1,
    /// Second handshake message.
    HandshakeResponse = 2,
    /// Third handshake message (XX only).
    HandshakeFinish = 3,
    /// Sealed tunnel data or keepalive.
    Data = 4,
    /// Unauthenticated notice that a handshake was refused, with a reason.
    Reject = 5,
    /// A datagram for another node, forwarded hop by hop; the inner datagram stays
    /// sealed end to end.
    Relay = 6,
    /// A responder under load answers an init with a cookie instead of doing DH
    /// (see [`crate::admission`]).
    CookieReply = 7,
}

impl MessageType {
    /// Classifies a datagram by its first byte.
    pub fn of(datagram: &[u8]) -> Option<Self> {
        Some(match *datagram.first()? {
            1 => Self::HandshakeInit,
            2 => Self::HandshakeResponse,
            3 => Self::HandshakeFinish,
            4 => Self::Data,
            5 => Self::Reject,
            6 => Self::Relay,
            7 => Self::CookieReply,
            _ => return None,
        })
    }
}

/// Errors from parsing a datagram header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than its fixed header.
    #[error("datagram truncated")]
    Truncated,
    /// First byte names no known message type, or the wrong one for this view.
    #[error("unknown message type")]
    UnknownType,
    /// A field holds a value that is not allowed.
    #[error("invalid field value")]
    Invalid,
}

/// The 16-byte header in front of sealed data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Flag bits (`FLAG_*`), authenticated; unknown ones are ignored.
    pub flags: u8,
    /// Lane for multi-socket paths; zero today (the receive steering of sparse flows
    /// uses [`FLAG_SPARSE`], set where the other flags are).
    pub lane: u16,
    /// The receiver's session index.
    pub receiver_index: u32,
    /// Per-session packet counter, also the AEAD nonce.
    pub counter: u64,
}

impl DataHeader {
    /// Parses the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let h: &[u8; DATA_HEADER_LEN] =
            buf.get(..DATA_HEADER_LEN).and_then(|b| b.try_into().ok()).ok_or(WireError::Truncated)?;
        if h[0] != MessageType::Data as u8 {
            return Err(WireError::UnknownType);
        }
        Ok(Self {
            flags: h[1],
            lane: u16::from_le_bytes([h[2], h[3]]),
            receiver_index: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            counter: u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
        })
    }

    /// Writes the header into the first 16 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8; DATA_HEADER_LEN]) {
        buf[0] = MessageType::Data as u8;
        buf[1] = self.flags;
        buf[2..4].copy_from_slice(&self.lane.to_le_bytes());
        buf[4..8].copy_from_slice(&self.receiver_index.to_le_bytes());
        buf[8..16].copy_from_slice(&self.counter.to_le_bytes());
    }
}

/// Which Noise pattern a handshake message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Pattern {
    /// Noise_IKpsk2: the initiator knows the responder's static key.
    Ik = 1,
    /// Noise_XXpsk3: first contact, static keys exchanged in the handshake.
    Xx = 0,
}

/// The header of a handshake message; the Noise message follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeHeader {
    /// Which of the three handshake messages this is.
    pub kind: MessageType,
    /// Noise pattern.
    pub pattern: Pattern,
    /// The sender's session index.
    pub sender_index: u32,
    /// The receiver's session index, zero in an init message.
    pub receiver_index: u32,
}

impl HandshakeHeader {
    /// Parses a handshake header and returns it with the Noise message after it.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), WireError> {
        if buf.len() < HANDSHAKE_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let Some(kind @ (MessageType::HandshakeInit | MessageType::HandshakeResponse | MessageType::HandshakeFinish)) =
            MessageType::of(buf)
        else {
            return Err(WireError::UnknownType);
        };
        let pattern = match buf[1] {
            0 => Pattern::Xx,
            1 => Pattern::Ik,
            _ => return Err(WireError::Invalid),
        };
        if pattern == Pattern::Ik && kind == MessageType::HandshakeFinish {
            return Err(WireError::Invalid);
        }
        if buf[2] != 0 || buf[3] != 0 {
            return Err(WireError::Invalid);
        }
        let hdr = Self {
            kind,
            pattern,
            sender_index: u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]),
            receiver_index: u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]),
        };
        Ok((hdr, &buf[HANDSHAKE_HEADER_LEN..]))
    }

    /// Appends the header to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(self.pattern as u8);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.sender_index.to_le_bytes());
        out.extend_from_slice(&self.receiver_index.to_le_bytes());
    }
}

/// Why a node refused a handshake. Sent unauthenticated, so it only informs status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectReason {
    /// The Noise message did not authenticate: the network secret (or name) differs,
    /// or the initiator used a stale static key.
    AuthFailed = 1,
    /// The payload could not be parsed (version skew).
    BadPayload = 2,
    /// The overlay address in the hello already belongs to another member.
    AddressTaken = 3,
    /// Membership by certificate: the other end's network has an authority and our
    /// certificate was missing, refused, or claims more than it grants; or ours has an
    /// authority and the other end has none (protocol 3; older nodes drop it).
    Membership = 4,
}

/// A reject message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectRepr {
    /// Why.
    pub reason: RejectReason,
    /// The sender index of the refused handshake message.
    pub receiver_index: u32,
}

impl RejectRepr {
    /// Parses a reject message.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; REJECT_LEN] = buf.get(..REJECT_LEN).and_then(|b| b.try_into().ok()).ok_or(WireError::Truncated)?;
        if b[0] != MessageType::Reject as u8 {
            return Err(WireError::UnknownType);
        }
        let reason = match b[1] {
            1 => RejectReason::AuthFailed,
            2 => RejectReason::BadPayload,
            3 => RejectReason::AddressTaken,
            4 => RejectReason::Membership,
            _ => return Err(WireError::Invalid),
        };
        Ok(Self { reason, receiver_index: u32::from_le_bytes([b[4], b[5], b[6], b[7]]) })
    }

    /// Returns the encoded message.
    pub fn emit(&self) -> [u8; REJECT_LEN] {
        let i = self.receiver_index.to_le_bytes();
        [MessageType::Reject as u8, self.reason as u8, 0, 0, i[0], i[1], i[2], i[3]]
    }
}

/// The header in front of a relayed datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayHeader {
    /// Hops left; a relay drops a frame whose limit is zero and decrements otherwise.
    pub hop_limit: u8,
    /// Node id of the final receiver.
    pub dst: [u8; 8],
    /// Node id of the original sender.
    pub src: [u8; 8],
}

impl RelayHeader {
    /// Parses the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; RELAY_HEADER_LEN] =
            buf.get(..RELAY_HEADER_LEN).and_then(|b| b.try_into().ok()).ok_or(WireError::Truncated)?;
        if b[0] != MessageType::Relay as u8 {
            return Err(WireError::UnknownType);
        }
        if b[2] != 0 || b[3] != 0 {
            return Err(WireError::Invalid);
        }
        let mut dst = [0u8; 8];
        let mut src = [0u8; 8];
        dst.copy_from_slice(&b[4..12]);
        src.copy_from_slice(&b[12..20]);
        Ok(Self { hop_limit: b[1], dst, src })
    }

    /// Writes the header into the first 20 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8; RELAY_HEADER_LEN]) {
        buf[0] = MessageType::Relay as u8;
        buf[1] = self.hop_limit;
        buf[2] = 0;
        buf[3] = 0;
        buf[4..12].copy_from_slice(&self.dst);
        buf[12..20].copy_from_slice(&self.src);
    }

    /// Returns `inner` wrapped in this header.
    pub fn wrap(&self, inner: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; RELAY_HEADER_LEN + inner.len()];
        let (h, rest) = out.split_at_mut(RELAY_HEADER_LEN);
        if let Ok(h) = <&mut [u8; RELAY_HEADER_LEN]>::try_from(h) {
            self.emit(h);
        }
        rest.copy_from_slice(inner);
        out
    }
}

/// Source and destination of an IPv4 or IPv6 packet, or `None` if `pkt` starts with
/// neither header.
pub fn ip_addrs(pkt: &[u8]) -> Option<(std::net::IpAddr, std::net::IpAddr)> {
    match pkt.first()? >> 4 {
        4 => ipv4_addrs(pkt).map(|(s, d)| (s.into(), d.into())),
        6 => {
            let src: [u8; 16] = pkt.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = pkt.get(24..40)?.try_into().ok()?;
            Some((std::net::Ipv6Addr::from(src).into(), std::net::Ipv6Addr::from(dst).into()))
        }
        _ => None,
    }
}

/// Source and destination of an IPv4 packet, or `None` if `pkt` is not a
/// well-formed IPv4 header.
pub fn ipv4_addrs(pkt: &[u8]) -> Option<(std::net::Ipv4Addr, std::net::Ipv4Addr)> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 {
        return None;
    }
    let src = std::net::Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]);
    let dst = std::net::Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
    Some((src, dst))
}

/// Lowers the MSS option of a TCP SYN (or SYN-ACK) in the IP packet `pkt` so that the
/// connection's segments are at most `max_packet` bytes long (IP and TCP headers
/// included), fixing the TCP checksum; returns true when it changed the packet. Other
/// packets, a SYN without the option or with a smaller one, IPv4 fragments and IPv6
/// packets with extension headers are left alone.
pub fn clamp_mss(pkt: &mut [u8], max_packet: usize) -> bool {
    let (ip_len, fixed) = match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= 20 && pkt[9] == 6 && u16::from_be_bytes([pkt[6], pkt[7]]) & 0x1fff == 0 => {
            (usize::from(pkt[0] & 0x0f) * 4, 40)
        }
        Some(6) if pkt.len() >= 40 && pkt[6] == 6 => (40, 60),
        _ => return false,
    };
    let Some(tcp) = pkt.get_mut(ip_len..) else { return false };
    if ip_len < 20 || tcp.len() < 20 || tcp[13] & 0x02 == 0 {
        return false;
    }
    let doff = usize::from(tcp[12] >> 4) * 4;
    if !(20..=60).contains(&doff) || doff > tcp.len() {
        return false;
    }
    let limit = u16::try_from(max_packet.saturating_sub(fixed)).unwrap_or(u16::MAX);
    let mut at = 20;
    while at < doff {
        match tcp[at] {
            0 => break,
            1 => at += 1,
            kind => {
                let Some(&len) = tcp.get(at + 1) else { break };
                let len = usize::from(len);
                if len < 2 || at + len > doff {
                    break;
                }
                if kind == 2 && len == 4 {
                    let old = u16::from_be_bytes([tcp[at + 2], tcp[at + 3]]);
                    if old <= limit {
                        return false;
                    }
                    tcp[at + 2..at + 4].copy_from_slice(&limit.to_be_bytes());
                    // RFC 1624: HC' = ~(~HC + ~m + m').
                    let hc = u16::from_be_bytes([tcp[16], tcp[17]]);
                    let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(limit);
                    while sum > 0xffff {
                        sum = (sum & 0xffff) + (sum >> 16);
                    }
                    tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
                    return true;
                }
                at += len;
            }
        }
    }
    false
}

/// The Internet checksum (RFC 1071) of `b`, starting from the partial sum `sum`.
pub fn checksum(b: &[u8], mut sum: u32) -> u16 {
    for c in b.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The answer to an inner packet `pkt` that is larger than its path carries (`mtu`
/// bytes): ICMP "fragmentation needed" (type 3, code 4, RFC 1191) for IPv4 with Don't
/// Fragment set, ICMPv6 "packet too big" (type 2, RFC 8201; never below 1280) for
/// IPv6, from the packet's destination to its source, quoting as much of it as the
/// RFCs allow. `None` for an IPv4 packet without DF (it may be fragmented on the way),
/// an ICMP error (never answered with one), a packet whose source is unspecified or
/// multicast, and anything that does not parse.
pub fn too_big_reply(pkt: &[u8], mtu: u16) -> Option<Vec<u8>> {
    match pkt.first()? >> 4 {
        4 => {
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            if pkt.len() < 20 || ihl < 20 || pkt.len() < ihl || pkt[6] & 0x40 == 0 {
                return None;
            }
            let (src, dst) = ipv4_addrs(pkt)?;
            if src.is_unspecified() || src.is_multicast() || src.is_broadcast() {
                return None;
            }
            // An ICMP error (not an echo or timestamp) is never answered.
            if pkt[9] == 1 && pkt.get(ihl).is_some_and(|t| matches!(t, 3 | 4 | 5 | 11 | 12)) {
                return None;
            }
            let quote = &pkt[..pkt.len().min(ihl + 8)];
            let total = 20 + 8 + quote.len();
            let mut out = vec![0u8; total];
            out[0] = 0x45;
            out[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            out[8] = 64;
            out[9] = 1;
            out[12..16].copy_from_slice(&dst.octets());
            out[16..20].copy_from_slice(&src.octets());
            let ip = checksum(&out[..20], 0);
            out[10..12].copy_from_slice(&ip.to_be_bytes());
            out[20] = 3;
            out[21] = 4;
            out[26..28].copy_from_slice(&mtu.to_be_bytes());
            out[28..].copy_from_slice(quote);
            let icmp = checksum(&out[20..], 0);
            out[22..24].copy_from_slice(&icmp.to_be_bytes());
            Some(out)
        }
        6 => {
            if pkt.len() < 40 {
                return None;
            }
            let src: [u8; 16] = pkt[8..24].try_into().ok()?;
            let dst: [u8; 16] = pkt[24..40].try_into().ok()?;
            let s = std::net::Ipv6Addr::from(src);
            if s.is_unspecified() || s.is_multicast() {
                return None;
            }
            // ICMPv6 errors (types below 128) are never answered.
            if pkt[6] == 58 && pkt.get(40).is_some_and(|t| *t < 128) {
                return None;
            }
            // The whole reply fits the IPv6 minimum MTU.
            let quote = &pkt[..pkt.len().min(1280 - 48)];
            let plen = 8 + quote.len();
            let mut out = vec![0u8; 40 + plen];
            out[0] = 0x60;
            out[4..6].copy_from_slice(&(plen as u16).to_be_bytes());
            out[6] = 58;
            out[7] = 64;
            out[8..24].copy_from_slice(&dst);
            out[24..40].copy_from_slice(&src);
            out[40] = 2;
            out[44..48].copy_from_slice(&u32::from(mtu.max(1280)).to_be_bytes());
            out[48..].copy_from_slice(quote);
            // The pseudo-header: source, destination, length, next header.
            let mut sum = 0u32;
            for c in out[8..40].chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
            sum += plen as u32 + 58;
            let c = checksum(&out[40..], sum);
            out[42..44].copy_from_slice(&c.to_be_bytes());
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_big_answers_ipv4_with_df_and_ipv6_and_nothing_else() {
        // IPv4, DF, 1400 bytes of TCP from 10.0.0.1 to 10.0.0.2.
        let mut p = vec![0u8; 1400];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&1400u16.to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let r = too_big_reply(&p, 1220).unwrap();
        assert_eq!(r.len(), 20 + 8 + 28);
        assert_eq!((&r[12..16], &r[16..20]), (&[10, 0, 0, 2][..], &[10, 0, 0, 1][..]), "from the destination back");
        assert_eq!((r[20], r[21], u16::from_be_bytes([r[26], r[27]])), (3, 4, 1220));
        assert_eq!(checksum(&r[..20], 0), 0, "IP header checksum");
        assert_eq!(checksum(&r[20..], 0), 0, "ICMP checksum");
        assert_eq!(&r[28..], &p[..28], "quotes the header and 8 bytes");
        // Without DF: none (it may be fragmented).
        let mut no_df = p.clone();
        no_df[6] = 0;
        assert!(too_big_reply(&no_df, 1220).is_none());
        // An ICMP error is never answered; an echo is.
        let mut icmp = p.clone();
        icmp[9] = 1;
        icmp[20] = 3;
        assert!(too_big_reply(&icmp, 1220).is_none());
        icmp[20] = 8;
        assert!(too_big_reply(&icmp, 1220).is_some());
        // IPv6: packet too big, never below 1280, quoted up to the minimum MTU.
        let mut v6 = vec![0u8; 1500];
        v6[0] = 0x60;
        v6[6] = 6;
        v6[8..24].copy_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        v6[24..40].copy_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        let r = too_big_reply(&v6, 1220).unwrap();
        assert_eq!(r.len(), 1280);
        assert_eq!((r[40], u32::from_be_bytes([r[44], r[45], r[46], r[47]])), (2, 1280));
        let mut sum = 0u32;
        for c in r[8..40].chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        sum += (r.len() - 40) as u32 + 58;
        assert_eq!(checksum(&r[40..], sum), 0, "ICMPv6 checksum");
        // Cut packets: no answer, no panic.
        for cut in 0..40 {
            assert!(too_big_reply(&v6[..cut], 1300).is_none());
            assert_eq!(too_big_reply(&p[..cut], 1300).is_some(), cut >= 20);
        }
    }

    /// An IPv4 TCP SYN with options NOP, NOP, MSS `mss`, SACK-permitted, and a valid
    /// checksum.
    fn syn(mss: u16) -> Vec<u8> {
        let mut p = vec![0u8; 20 + 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&48u16.to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let t = &mut p[20..];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&80u16.to_be_bytes());
        t[12] = 7 << 4;
        t[13] = 0x02;
        t[20..28].copy_from_slice(&[1, 1, 2, 4, (mss >> 8) as u8, mss as u8, 4, 2]);
        let c = tcp_checksum(&p);
        p[36..38].copy_from_slice(&c.to_be_bytes());
        p
    }

    fn tcp_checksum(p: &[u8]) -> u16 {
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&p[12..20]);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&((p.len() - 20) as u16).to_be_bytes());
        let mut t = p[20..].to_vec();
        t[16..18].fill(0);
        pseudo.extend_from_slice(&t);
        let mut sum: u32 =
            pseudo.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn mss_is_clamped_with_a_correct_checksum() {
        let mut p = syn(1380);
        assert!(clamp_mss(&mut p, 1380));
        assert_eq!(u16::from_be_bytes([p[44], p[45]]), 1340);
        assert_eq!(u16::from_be_bytes([p[36], p[37]]), tcp_checksum(&p), "checksum updated");
        // Already small enough, not a SYN, a fragment, UDP: unchanged.
        let mut small = syn(1200);
        assert!(!clamp_mss(&mut small, 1380));
        assert_eq!(small, syn(1200));
        let mut ack = syn(1380);
        ack[33] = 0x10;
        assert!(!clamp_mss(&mut ack, 1380));
        let mut frag = syn(1380);
        frag[7] = 1;
        assert!(!clamp_mss(&mut frag, 1380));
        let mut udp = syn(1380);
        udp[9] = 17;
        assert!(!clamp_mss(&mut udp, 1380));
        // Hostile option lengths never read past the header.
        for cut in [0u8, 1, 9] {
            let mut bad = syn(1380);
            bad[43] = cut;
            clamp_mss(&mut bad, 1380);
        }
        assert!(!clamp_mss(&mut [0x45; 30], 1380));
    }

    static DATA_BYTES: [u8; 16] =
        [0x04, 0x00, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01];

    #[test]
    fn data_header_vector() {
        let h = DataHeader::parse(&DATA_BYTES).unwrap();
        assert_eq!(h, DataHeader { flags: 0, lane: 0, receiver_index: 0x1234_5678, counter: 0x0102_0304_0506_0708 });
        let mut out = [0u8; 16];
        h.emit(&mut out);
        assert_eq!(out, DATA_BYTES);
    }

    #[test]
    fn data_header_rejects_short_and_wrong_type() {
        assert_eq!(DataHeader::parse(&DATA_BYTES[..15]), Err(WireError::Truncated));
        let mut b = DATA_BYTES;
        b[0] = 1;
        assert_eq!(DataHeader::parse(&b), Err(WireError::UnknownType));
    }

    static INIT_BYTES: [u8; 14] = [0x01, 0x01, 0x00, 0x00, 0xef, 0xbe, 0xad, 0xde, 0x00, 0x00, 0x00, 0x00, 0xaa, 0xbb];

    #[test]
    fn handshake_header_vector() {
        let (h, rest) = HandshakeHeader::parse(&INIT_BYTES).unwrap();
        assert_eq!(
            h,
            HandshakeHeader {
                kind: MessageType::HandshakeInit,
                pattern: Pattern::Ik,
                sender_index: 0xdead_beef,
                receiver_index: 0
            }
        );
        assert_eq!(rest, &[0xaa, 0xbb]);
        let mut out = Vec::new();
        h.emit(&mut out);
        assert_eq!(out, &INIT_BYTES[..12]);
    }

    #[test]
    fn handshake_header_rejects_bad_fields() {
        assert_eq!(HandshakeHeader::parse(&INIT_BYTES[..11]), Err(WireError::Truncated));
        let mut b = INIT_BYTES;
        b[1] = 7;
        assert_eq!(HandshakeHeader::parse(&b), Err(WireError::Invalid));
        let mut b = INIT_BYTES;
        b[0] = 3; // IK has no finish message
        assert_eq!(HandshakeHeader::parse(&b), Err(WireError::Invalid));
        let mut b = INIT_BYTES;
        b[0] = 9;
        assert_eq!(HandshakeHeader::parse(&b), Err(WireError::UnknownType));
    }

    #[test]
    fn reject_round_trip() {
        let r = RejectRepr { reason: RejectReason::AuthFailed, receiver_index: 7 };
        let b = r.emit();
        assert_eq!(b, [5, 1, 0, 0, 7, 0, 0, 0]);
        assert_eq!(RejectRepr::parse(&b), Ok(r));
        assert_eq!(RejectRepr::parse(&b[..7]), Err(WireError::Truncated));
        assert_eq!(RejectRepr::parse(&[5, 9, 0, 0, 0, 0, 0, 0]), Err(WireError::Invalid));
        let taken = RejectRepr { reason: RejectReason::AddressTaken, receiver_index: 7 };
        assert_eq!(RejectRepr::parse(&taken.emit()), Ok(taken));
    }

    static RELAY_BYTES: [u8; 20] = [6, 5, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

    #[test]
    fn relay_header_vector() {
        let h = RelayHeader::parse(&RELAY_BYTES).unwrap();
        assert_eq!(
            h,
            RelayHeader { hop_limit: 5, dst: [1, 2, 3, 4, 5, 6, 7, 8], src: [9, 10, 11, 12, 13, 14, 15, 16] }
        );
        let mut out = [0u8; 20];
        h.emit(&mut out);
        assert_eq!(out, RELAY_BYTES);
        assert_eq!(RelayHeader::parse(&RELAY_BYTES[..19]), Err(WireError::Truncated));
        let mut bad = RELAY_BYTES;
        bad[2] = 1;
        assert_eq!(RelayHeader::parse(&bad), Err(WireError::Invalid));
        assert_eq!(&h.wrap(&[0xaa])[..], &[&RELAY_BYTES[..], &[0xaa]].concat()[..]);
    }

    #[test]
    fn ipv4_addrs_parses_and_rejects() {
        let mut p = [0u8; 20];
        p[0] = 0x45;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(ipv4_addrs(&p), Some(([10, 0, 0, 1].into(), [10, 0, 0, 2].into())));
        assert_eq!(ipv4_addrs(&p[..19]), None);
        p[0] = 0x60;
        assert_eq!(ipv4_addrs(&p), None);
        assert_eq!(ip_addrs(&p), None, "an IPv6 header is 40 bytes");
        let mut q = [0u8; 40];
        q[0] = 0x60;
        q[8..24].copy_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        q[24..40].copy_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(ip_addrs(&q), Some(("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())));
        assert_eq!(ip_addrs(&q[..39]), None);
        q[0] = 0x50;
        assert_eq!(ip_addrs(&q), None);
        p[0] = 0x45;
        assert_eq!(ip_addrs(&p), Some(("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())));
    }
}
