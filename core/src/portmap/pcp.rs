//! PCP (RFC 6887): the MAP request (lifetime 0 deletes the mapping) and the gateway's
//! response. Integers are big-endian; addresses are 16 bytes (IPv4 as `::ffff:a.b.c.d`).
//!
//! ```text
//! request header  | version=2 | R=0, opcode 7 bits | 0u16 | lifetime u32 | client address 16 |
//! response header | version=2 | R=1, opcode | 0u8 | result u8 | lifetime u32 | epoch u32 | 0 × 12 |
//! MAP body        | nonce 12 | protocol u8 | 0 × 3 | internal port u16 | external port u16 | external address 16 |
//! then options    | code u8 | 0u8 | length u16 | data, padded to 4 |
//! ```
//!
//! A gateway that speaks only NAT-PMP answers a PCP request with NAT-PMP's
//! "unsupported version" (version 0): [`Response::parse`] reads that as
//! [`ResultCode::UnsupportedVersion`], so a client falls back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{ParseError, Protocol};

/// PCP's version number.
pub const VERSION: u8 = 2;
/// Length of a MAP request (header and body, no options).
pub const MAP_REQUEST_LEN: usize = 60;
/// Longest PCP message (RFC 6887 §7).
pub const MAX_LEN: usize = 1100;
const HEADER_LEN: usize = 24;
const OP_MAP: u8 = 1;
const RESPONSE_BIT: u8 = 0x80;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// A MAP request: forward `external_port` (a suggestion; 0: any) of the gateway to
/// `internal_port` of `client` for `lifetime` seconds; lifetime 0 deletes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapRequest {
    /// Random, kept for the mapping's life: renewals and the deletion repeat it, and
    /// the gateway's answer echoes it.
    pub nonce: [u8; 12],
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The client's port.
    pub internal_port: u16,
    /// The external port wanted (0: any).
    pub external_port: u16,
    /// The external address wanted (unspecified: any).
    pub external_ip: IpAddr,
    /// The client's own address (the source of the request).
    pub client_ip: IpAddr,
    /// Seconds the mapping should live.
    pub lifetime: u32,
}

impl MapRequest {
    /// The encoded request.
    pub fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAP_REQUEST_LEN);
        b.extend_from_slice(&[VERSION, OP_MAP, 0, 0]);
        b.extend_from_slice(&self.lifetime.to_be_bytes());
        b.extend_from_slice(&v6(self.client_ip).octets());
        b.extend_from_slice(&self.nonce);
        b.extend_from_slice(&[proto_of(self.protocol), 0, 0, 0]);
        b.extend_from_slice(&self.internal_port.to_be_bytes());
        b.extend_from_slice(&self.external_port.to_be_bytes());
        b.extend_from_slice(&v6(self.external_ip).octets());
        b
    }

    /// Reads a MAP request (what a gateway does; the tests' fake router uses it).
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        if b.len() < MAP_REQUEST_LEN {
            return Err(ParseError::Truncated { len: b.len() });
        }
        if b[0] != VERSION {
            return Err(ParseError::Version(b[0]));
        }
        if b[1] != OP_MAP {
            return Err(ParseError::Opcode(b[1]));
        }
        let body = &b[HEADER_LEN..];
        Ok(Self {
            nonce: nonce(body),
            protocol: proto(body[12])?,
            internal_port: be16(&body[16..18]),
            external_port: be16(&body[18..20]),
            external_ip: addr(&body[20..36]),
            client_ip: addr(&b[8..24]),
            lifetime: be32(&b[4..8]),
        })
    }
}

/// A PCP result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResultCode {
    /// 0: done.
    Success,
    /// 1: the gateway speaks another version (NAT-PMP only, say).
    UnsupportedVersion,
    /// 2: the gateway refuses mappings for us.
    NotAuthorized,
    /// 3: the gateway could not read the request.
    MalformedRequest,
    /// 4: the gateway does not do MAP.
    UnsupportedOpcode,
    /// 5: an option the gateway requires us to understand is not supported.
    UnsupportedOption,
    /// 6: a malformed option.
    MalformedOption,
    /// 7: the gateway has no external address for now.
    NetworkFailure,
    /// 8: no mapping left for now.
    NoResources,
    /// 9: the protocol is not mapped.
    UnsupportedProtocol,
    /// 10: our share of mappings is used up.
    UserExceededQuota,
    /// 11: the external port or address asked for cannot be given.
    CannotProvideExternal,
    /// 12: the client address in the request is not the request's source (another
    /// NAT between us and the gateway).
    AddressMismatch,
    /// 13: too many remote peers.
    ExcessiveRemotePeers,
    /// Any other value.
    Other(u8),
}

impl ResultCode {
    /// The code of a number on the wire.
    pub fn from_wire(v: u8) -> Self {
        match v {
            0 => Self::Success,
            1 => Self::UnsupportedVersion,
            2 => Self::NotAuthorized,
            3 => Self::MalformedRequest,
            4 => Self::UnsupportedOpcode,
            5 => Self::UnsupportedOption,
            6 => Self::MalformedOption,
            7 => Self::NetworkFailure,
            8 => Self::NoResources,
            9 => Self::UnsupportedProtocol,
            10 => Self::UserExceededQuota,
            11 => Self::CannotProvideExternal,
            12 => Self::AddressMismatch,
            13 => Self::ExcessiveRemotePeers,
            v => Self::Other(v),
        }
    }

    /// Its number on the wire.
    pub fn to_wire(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::UnsupportedVersion => 1,
            Self::NotAuthorized => 2,
            Self::MalformedRequest => 3,
            Self::UnsupportedOpcode => 4,
            Self::UnsupportedOption => 5,
            Self::MalformedOption => 6,
            Self::NetworkFailure => 7,
            Self::NoResources => 8,
            Self::UnsupportedProtocol => 9,
            Self::UserExceededQuota => 10,
            Self::CannotProvideExternal => 11,
            Self::AddressMismatch => 12,
            Self::ExcessiveRemotePeers => 13,
            Self::Other(v) => v,
        }
    }

    /// Whether the failure may go away by itself (RFC 6887 §7.4: a short-lifetime
    /// error), as opposed to one that asking again will not change.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::NetworkFailure | Self::NoResources | Self::UserExceededQuota | Self::ExcessiveRemotePeers)
    }
}

impl std::fmt::Display for ResultCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Self::Success => "success",
            Self::UnsupportedVersion => "unsupported version",
            Self::NotAuthorized => "not authorized",
            Self::MalformedRequest => "malformed request",
            Self::UnsupportedOpcode => "unsupported opcode",
            Self::UnsupportedOption => "unsupported option",
            Self::MalformedOption => "malformed option",
            Self::NetworkFailure => "network failure",
            Self::NoResources => "no resources",
            Self::UnsupportedProtocol => "unsupported protocol",
            Self::UserExceededQuota => "user exceeded quota",
            Self::CannotProvideExternal => "cannot provide external",
            Self::AddressMismatch => "address mismatch",
            Self::ExcessiveRemotePeers => "excessive remote peers",
            Self::Other(v) => return write!(f, "result code {v}"),
        };
        f.write_str(s)
    }
}

/// The mapping a MAP response describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// The request's nonce, echoed.
    pub nonce: [u8; 12],
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Our port.
    pub internal_port: u16,
    /// The gateway's port forwarded to it.
    pub external_port: u16,
    /// The gateway's address.
    pub external_ip: IpAddr,
}

/// A gateway's answer to a MAP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// The result.
    pub result: ResultCode,
    /// On success, seconds the mapping lives; on an error, how long the error holds.
    pub lifetime: u32,
    /// Seconds since the gateway's epoch (0 from a NAT-PMP-only gateway's refusal).
    pub epoch: u32,
    /// The mapping (a MAP response with its body; `None` for a refusal without one).
    pub mapping: Option<Mapping>,
}

impl Response {
    /// Reads an answer: a PCP MAP response, or NAT-PMP's refusal of PCP's version.
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        // A NAT-PMP gateway: | 0 | 128 + op | result u16 = 1 | epoch u32 |.
        if b.len() >= 4 && b[0] == super::pmp::VERSION {
            if b[1] & RESPONSE_BIT != 0 && u16::from_be_bytes([b[2], b[3]]) == 1 {
                return Ok(Self { result: ResultCode::UnsupportedVersion, lifetime: 0, epoch: 0, mapping: None });
            }
            return Err(ParseError::Version(0));
        }
        if b.len() < 4 {
            return Err(ParseError::Truncated { len: b.len() });
        }
        if b[1] & RESPONSE_BIT == 0 {
            return Err(ParseError::Opcode(b[1]));
        }
        let result = ResultCode::from_wire(b[3]);
        // "Unsupported version" names the versions the server speaks in the version
        // field; its body may be cut short.
        if result == ResultCode::UnsupportedVersion {
            let lifetime = if b.len() >= 8 { be32(&b[4..8]) } else { 0 };
            let epoch = if b.len() >= 12 { be32(&b[8..12]) } else { 0 };
            return Ok(Self { result, lifetime, epoch, mapping: None });
        }
        if b[0] != VERSION {
            return Err(ParseError::Version(b[0]));
        }
        if b.len() < HEADER_LEN {
            return Err(ParseError::Truncated { len: b.len() });
        }
        if b.len() > MAX_LEN || !b.len().is_multiple_of(4) {
            return Err(ParseError::Length { len: b.len() });
        }
        if b[1] & !RESPONSE_BIT != OP_MAP {
            return Err(ParseError::Opcode(b[1]));
        }
        let lifetime = be32(&b[4..8]);
        let epoch = be32(&b[8..12]);
        let body = &b[HEADER_LEN..];
        if body.len() < MAP_REQUEST_LEN - HEADER_LEN {
            // Errors may come without the opcode's body; a success never does.
            if result == ResultCode::Success || !body.is_empty() {
                return Err(ParseError::Truncated { len: b.len() });
            }
            return Ok(Self { result, lifetime, epoch, mapping: None });
        }
        options(&body[MAP_REQUEST_LEN - HEADER_LEN..])?;
        let mapping = Mapping {
            nonce: nonce(body),
            protocol: proto(body[12])?,
            internal_port: be16(&body[16..18]),
            external_port: be16(&body[18..20]),
            external_ip: addr(&body[20..36]),
        };
        Ok(Self { result, lifetime, epoch, mapping: Some(mapping) })
    }

    /// The encoded answer (what a gateway sends; the tests' fake router uses it).
    pub fn emit(&self) -> Vec<u8> {
        let mut b = vec![VERSION, RESPONSE_BIT | OP_MAP, 0, self.result.to_wire()];
        b.extend_from_slice(&self.lifetime.to_be_bytes());
        b.extend_from_slice(&self.epoch.to_be_bytes());
        b.extend_from_slice(&[0; 12]);
        if let Some(m) = &self.mapping {
            b.extend_from_slice(&m.nonce);
            b.extend_from_slice(&[proto_of(m.protocol), 0, 0, 0]);
            b.extend_from_slice(&m.internal_port.to_be_bytes());
            b.extend_from_slice(&m.external_port.to_be_bytes());
            b.extend_from_slice(&v6(m.external_ip).octets());
        }
        b
    }
}

/// Checks that the options after a body fit the message (their contents are not read:
/// MAP's options are for requests we never make).
fn options(mut b: &[u8]) -> Result<(), ParseError> {
    while !b.is_empty() {
        if b.len() < 4 {
            return Err(ParseError::Option);
        }
        let len = usize::from(be16(&b[2..4]));
        let padded = len.div_ceil(4) * 4;
        if b.len() - 4 < padded {
            return Err(ParseError::Option);
        }
        b = &b[4 + padded..];
    }
    Ok(())
}

/// An address as PCP carries it: IPv4 mapped into IPv6.
fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The address of 16 bytes: IPv4 when mapped (`::` reads as IPv4's unspecified).
fn addr(b: &[u8]) -> IpAddr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[..16]);
    let a = Ipv6Addr::from(o);
    if a.is_unspecified() {
        return IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    }
    a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)
}

fn nonce(body: &[u8]) -> [u8; 12] {
    let mut n = [0u8; 12];
    n.copy_from_slice(&body[..12]);
    n
}

fn proto(v: u8) -> Result<Protocol, ParseError> {
    match v {
        PROTO_UDP => Ok(Protocol::Udp),
        PROTO_TCP => Ok(Protocol::Tcp),
        v => Err(ParseError::Protocol(v)),
    }
}

fn proto_of(p: Protocol) -> u8 {
    match p {
        Protocol::Udp => PROTO_UDP,
        Protocol::Tcp => PROTO_TCP,
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

    fn request() -> MapRequest {
        MapRequest {
            nonce: NONCE,
            protocol: Protocol::Udp,
            internal_port: 11010,
            external_port: 11010,
            external_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            client_ip: IpAddr::V4(Ipv4Addr::new(192, 168, 1, 2)),
            lifetime: 7200,
        }
    }

    #[test]
    fn a_map_request_encodes_as_the_rfc_lays_it_out() {
        let b = request().emit();
        assert_eq!(b.len(), MAP_REQUEST_LEN);
        assert_eq!(&b[..8], &[2, 1, 0, 0, 0, 0, 0x1c, 0x20]);
        assert_eq!(&b[8..24], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2]);
        assert_eq!(&b[24..36], &NONCE);
        assert_eq!(&b[36..44], &[17, 0, 0, 0, 0x2b, 0x02, 0x2b, 0x02]);
        // "Any address" is IPv4's unspecified, mapped.
        assert_eq!(&b[44..60], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!(MapRequest::parse(&b), Ok(request()));
    }

    // The answer of miniupnpd 2.3.1 (Debian 12) to the request above (from
    // 192.168.77.2), captured in a test namespace.
    const RECORDED: [u8; 60] = [
        2, 129, 0, 0, 0, 0, 28, 32, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
        12, 17, 0, 0, 0, 43, 2, 43, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 100, 200, 0, 2,
    ];
    // Its answer to a request of version 3: "unsupported version", naming 2.
    const RECORDED_VERSION_REFUSAL: [u8; 12] = [2, 129, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];

    #[test]
    fn a_recorded_answer_parses() {
        let r = Response::parse(&RECORDED).unwrap();
        assert_eq!(r.result, ResultCode::Success);
        assert_eq!(r.lifetime, 7200);
        assert_eq!(r.epoch, 1);
        let m = r.mapping.unwrap();
        assert_eq!(m.nonce, NONCE);
        assert_eq!((m.protocol, m.internal_port, m.external_port), (Protocol::Udp, 11010, 11010));
        assert_eq!(m.external_ip, IpAddr::V4(Ipv4Addr::new(100, 200, 0, 2)));
        assert_eq!(r.emit(), RECORDED);
    }

    #[test]
    fn errors_carry_their_code_with_or_without_a_body() {
        let mut b = RECORDED;
        b[3] = 8;
        b[4..8].copy_from_slice(&[0, 0, 0, 30]);
        let r = Response::parse(&b).unwrap();
        assert_eq!(r.result, ResultCode::NoResources);
        assert!(r.result.is_transient());
        assert_eq!(r.lifetime, 30);
        let r = Response::parse(&b[..24]).unwrap();
        assert_eq!((r.result, r.mapping), (ResultCode::NoResources, None));
        for v in 0..=255u8 {
            assert_eq!(ResultCode::from_wire(v).to_wire(), v);
        }
        assert!(!ResultCode::NotAuthorized.is_transient());
        // A NAT-PMP-only gateway refuses PCP's version in NAT-PMP's format.
        let r = Response::parse(&[0, 0x82, 0, 1, 0, 0, 0, 5]).unwrap();
        assert_eq!(r.result, ResultCode::UnsupportedVersion);
        // A PCP gateway refusing another version names its own (the rest of its
        // 60 bytes, zeros, are not read).
        let mut b = RECORDED_VERSION_REFUSAL.to_vec();
        b.resize(60, 0);
        let r = Response::parse(&b).unwrap();
        assert_eq!((r.result, r.epoch, r.mapping), (ResultCode::UnsupportedVersion, 1, None));
    }

    #[test]
    fn options_after_the_body_are_skipped_when_they_fit() {
        let mut b = RECORDED.to_vec();
        b.extend_from_slice(&[1, 0, 0, 4, 9, 9, 9, 9]);
        assert!(Response::parse(&b).is_ok());
        let mut b = RECORDED.to_vec();
        b.extend_from_slice(&[1, 0, 0, 8, 9, 9, 9, 9]);
        assert_eq!(Response::parse(&b), Err(ParseError::Option));
    }

    #[test]
    fn malformed_answers_are_errors() {
        assert_eq!(Response::parse(&[]), Err(ParseError::Truncated { len: 0 }));
        assert_eq!(Response::parse(&RECORDED[..40]), Err(ParseError::Truncated { len: 40 }));
        // A success needs its body.
        assert_eq!(Response::parse(&RECORDED[..24]), Err(ParseError::Truncated { len: 24 }));
        assert_eq!(Response::parse(&RECORDED[..58]), Err(ParseError::Length { len: 58 }));
        // Our own request reflected back.
        assert_eq!(Response::parse(&request().emit()), Err(ParseError::Opcode(1)));
        let mut b = RECORDED;
        b[36] = 1;
        assert_eq!(Response::parse(&b), Err(ParseError::Protocol(1)));
        let mut b = RECORDED;
        b[1] = 0x82;
        assert_eq!(Response::parse(&b), Err(ParseError::Opcode(0x82)));
        assert_eq!(Response::parse(&[0, 0, 0, 0]), Err(ParseError::Version(0)));
        let mut long = vec![0u8; 1104];
        long[..2].copy_from_slice(&[2, 0x81]);
        assert_eq!(Response::parse(&long), Err(ParseError::Length { len: 1104 }));
    }
}
