//! What the connection table reads of a packet: addresses, protocol, ports, TCP flags,
//! the flow an ICMP error is about, and where a fragment stands in its datagram.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::policy::proto;

/// IPv6 extension headers walked before the transport header; a longer chain does not parse.
const MAX_EXTENSIONS: usize = 8;

const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const DESTINATION: u8 = 60;

/// What one packet says about its flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol: the transport header's, after IPv6's hop-by-hop, routing, fragment
    /// and destination options headers (anything else is its own protocol number).
    pub proto: u8,
    /// Source port (an ICMP echo request: its identifier).
    pub sport: u16,
    /// Destination port (an ICMP echo reply: its identifier).
    pub dport: u16,
    /// A TCP FIN or RST: the flow is closing.
    pub closing: bool,
    /// A TCP SYN (with or without ACK).
    pub syn: bool,
    /// An ICMP error: the flow it is about, as that packet's own [`Packet`] (sent by
    /// the receiver of the error).
    pub about: Option<(IpAddr, IpAddr, u8, u16, u16)>,
    /// Where it stands among its datagram's fragments.
    pub fragment: Fragment,
}

/// Where a packet stands among the fragments of its datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    /// The first fragment (it carries the transport header) of the datagram with this
    /// identification.
    First(u32),
    /// A later fragment: no transport header, `offset` 8-byte units into the datagram.
    Later {
        /// The datagram's identification.
        id: u32,
        /// The fragment offset, in 8-byte units.
        offset: u16,
    },
    /// Not a fragment.
    Whole,
}

impl Packet {
    /// Reads an IPv4 or IPv6 packet's addresses, protocol, ports and flags. `None`:
    /// not IP, or nothing the connection table can judge (it denies those): an ICMP
    /// message shorter than its 8-byte header, an ICMP error whose quoted packet has
    /// no readable IP header (or, for TCP and UDP, no ports) or is a later fragment, a
    /// TCP header shorter than 20 bytes or a UDP one shorter than 8 where one should
    /// be (a tiny first fragment: RFC 1858), more than 8 IPv6 extension headers.
    pub fn parse(p: &[u8]) -> Option<Self> {
        let ip = ip_header(p)?;
        let mut pkt = Self {
            src: ip.src,
            dst: ip.dst,
            proto: ip.proto,
            sport: 0,
            dport: 0,
            closing: false,
            syn: false,
            about: None,
            fragment: ip.fragment,
        };
        if matches!(ip.fragment, Fragment::Later { .. }) {
            return Some(pkt);
        }
        let l4 = ip.rest;
        (pkt.sport, pkt.dport) = ports(ip.proto, l4, TCP_HEADER)?;
        match ip.proto {
            proto::TCP => {
                let flags = l4[13];
                pkt.closing = flags & 0x05 != 0;
                pkt.syn = flags & 0x02 != 0;
            }
            proto::ICMP | proto::ICMPV6 if error(ip.proto, l4[0]) => {
                // The quoted packet went the other way: from the receiver of the error.
                let inner = ip_header(&l4[8..])?;
                if matches!(inner.fragment, Fragment::Later { .. }) {
                    return None;
                }
                // RFC 792 quotes 8 bytes of the transport header: TCP's ports, not its flags.
                let (sp, dp) = ports(inner.proto, inner.rest, 8)?;
                pkt.about = Some((inner.src, inner.dst, inner.proto, sp, dp));
            }
            _ => {}
        }
        Some(pkt)
    }
}

/// TCP's header without options.
const TCP_HEADER: usize = 20;

/// Whether ICMP (or ICMPv6) type `t` is an error that quotes a packet.
fn error(proto: u8, t: u8) -> bool {
    matches!((proto, t), (proto::ICMP, 3 | 4 | 5 | 11 | 12) | (proto::ICMPV6, 1..=4))
}

/// A transport header's ports: TCP's (its header at least `tcp` bytes long) and UDP's;
/// for an ICMP echo, the identifier on the asker's side (a reply matches the request's
/// flow, a request from the other side does not); 0 for everything else. `None`: the
/// header is too short to read.
fn ports(proto: u8, l4: &[u8], tcp: usize) -> Option<(u16, u16)> {
    let be = |i: usize| u16::from_be_bytes([l4[i], l4[i + 1]]);
    match proto {
        proto::TCP if l4.len() >= tcp.max(4) => Some((be(0), be(2))),
        proto::UDP if l4.len() >= 8 => Some((be(0), be(2))),
        proto::ICMP | proto::ICMPV6 if l4.len() >= 8 => Some(match (proto, l4[0]) {
            (proto::ICMP, 8) | (proto::ICMPV6, 128) => (be(4), 0),
            (proto::ICMP, 0) | (proto::ICMPV6, 129) => (0, be(4)),
            _ => (0, 0),
        }),
        proto::TCP | proto::UDP | proto::ICMP | proto::ICMPV6 => None,
        _ => Some((0, 0)),
    }
}

/// An IP header's source, destination, transport protocol and fragment place, and the
/// bytes after it (empty for a later fragment).
struct IpHeader<'a> {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    fragment: Fragment,
    rest: &'a [u8],
}

fn ip_header(p: &[u8]) -> Option<IpHeader<'_>> {
    match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if ihl < 20 || p.len() < ihl {
                return None;
            }
            let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
            let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
            let id = u32::from(u16::from_be_bytes([p[4], p[5]]));
            let word = u16::from_be_bytes([p[6], p[7]]);
            let (offset, more) = (word & 0x1fff, word & 0x2000 != 0);
            let (fragment, rest) = match (offset, more) {
                (0, false) => (Fragment::Whole, &p[ihl..]),
                (0, true) => (Fragment::First(id), &p[ihl..]),
                _ => (Fragment::Later { id, offset }, &p[..0]),
            };
            Some(IpHeader { src: src.into(), dst: dst.into(), proto: p[9], fragment, rest })
        }
        6 => {
            let h = p.get(..40)?;
            let src: [u8; 16] = h[8..24].try_into().ok()?;
            let dst: [u8; 16] = h[24..40].try_into().ok()?;
            let (mut next, mut rest, mut fragment) = (h[6], &p[40..], Fragment::Whole);
            let mut walked = 0;
            while matches!(next, HOP_BY_HOP | ROUTING | FRAGMENT | DESTINATION) {
                if walked == MAX_EXTENSIONS {
                    return None;
                }
                walked += 1;
                if next == FRAGMENT {
                    let f = rest.get(..8)?;
                    let offset = u16::from_be_bytes([f[2], f[3]]) >> 3;
                    let id = u32::from_be_bytes([f[4], f[5], f[6], f[7]]);
                    next = f[0];
                    if offset != 0 {
                        fragment = Fragment::Later { id, offset };
                        rest = &rest[..0];
                        break;
                    }
                    // An atomic fragment (no more to come, RFC 6946) is whole.
                    if f[3] & 1 != 0 {
                        fragment = Fragment::First(id);
                    }
                    rest = &rest[8..];
                } else {
                    let len = (usize::from(*rest.get(1)?) + 1) * 8;
                    next = rest[0];
                    rest = rest.get(len..)?;
                }
            }
            Some(IpHeader {
                src: Ipv6Addr::from(src).into(),
                dst: Ipv6Addr::from(dst).into(),
                proto: next,
                fragment,
                rest,
            })
        }
        _ => None,
    }
}
