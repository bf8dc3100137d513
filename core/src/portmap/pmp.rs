//! NAT-PMP (RFC 6886): a request for the gateway's external address, a request to map
//! a port (lifetime 0 deletes it), and the gateway's answers. Integers are big-endian.
//!
//! ```text
//! external address request | version=0 | op=0 |
//! map request              | version=0 | op=1 UDP, 2 TCP | 0u16 | internal port u16 | suggested external port u16 | lifetime u32 |
//! response header          | version=0 | 128 + op | result u16 | seconds since epoch u32 |
//!   external address       |   ... | address 4 |                       (12 bytes)
//!   map                    |   ... | internal port u16 | external port u16 | lifetime u32 |  (16 bytes)
//! ```
//!
//! An answer with a result other than success may stop after its header (8 bytes).

use std::net::Ipv4Addr;

use super::{ParseError, Protocol};

/// NAT-PMP's version number.
pub const VERSION: u8 = 0;
/// Length of an external address request.
pub const EXTERNAL_REQUEST_LEN: usize = 2;
/// Length of a map request.
pub const MAP_REQUEST_LEN: usize = 12;
const HEADER_LEN: usize = 8;
const EXTERNAL_RESPONSE_LEN: usize = 12;
const MAP_RESPONSE_LEN: usize = 16;
const OP_EXTERNAL: u8 = 0;
const OP_UDP: u8 = 1;
const OP_TCP: u8 = 2;
const OP_RESPONSE: u8 = 128;

/// A request to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// What is your external address?
    ExternalAddress,
    /// Map `external_port` (a suggestion; 0: any) to `internal_port` of the sender for
    /// `lifetime` seconds; a lifetime of 0 deletes the mapping.
    Map {
        /// TCP or UDP.
        protocol: Protocol,
        /// The sender's port.
        internal_port: u16,
        /// The external port wanted.
        external_port: u16,
        /// Seconds the mapping should live.
        lifetime: u32,
    },
}

impl Request {
    /// Length of the encoded request.
    pub fn buffer_len(&self) -> usize {
        match self {
            Self::ExternalAddress => EXTERNAL_REQUEST_LEN,
            Self::Map { .. } => MAP_REQUEST_LEN,
        }
    }

    /// The encoded request.
    pub fn emit(&self) -> Vec<u8> {
        match *self {
            Self::ExternalAddress => vec![VERSION, OP_EXTERNAL],
            Self::Map { protocol, internal_port, external_port, lifetime } => {
                let mut b = Vec::with_capacity(MAP_REQUEST_LEN);
                b.extend_from_slice(&[VERSION, op_of(protocol), 0, 0]);
                b.extend_from_slice(&internal_port.to_be_bytes());
                b.extend_from_slice(&external_port.to_be_bytes());
                b.extend_from_slice(&lifetime.to_be_bytes());
                b
            }
        }
    }

    /// Reads a request (what a gateway does; the tests' fake router uses it).
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        if b.len() < EXTERNAL_REQUEST_LEN {
            return Err(ParseError::Truncated { len: b.len() });
        }
        if b[0] != VERSION {
            return Err(ParseError::Version(b[0]));
        }
        let protocol = match b[1] {
            OP_EXTERNAL => return Ok(Self::ExternalAddress),
            OP_UDP => Protocol::Udp,
            OP_TCP => Protocol::Tcp,
            op => return Err(ParseError::Opcode(op)),
        };
        if b.len() < MAP_REQUEST_LEN {
            return Err(ParseError::Truncated { len: b.len() });
        }
        Ok(Self::Map {
            protocol,
            internal_port: be16(&b[4..6]),
            external_port: be16(&b[6..8]),
            lifetime: be32(&b[8..12]),
        })
    }
}

/// A NAT-PMP result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResultCode {
    /// 0: done.
    Success,
    /// 1: the gateway speaks another version (a PCP-only server, say).
    UnsupportedVersion,
    /// 2: the gateway supports mapping but it is switched off, or refused for us.
    NotAuthorized,
    /// 3: the gateway has no external address (its uplink is down).
    NetworkFailure,
    /// 4: no mapping left (table full, or the port is taken).
    OutOfResources,
    /// 5: the gateway does not do this operation.
    UnsupportedOpcode,
    /// Any other value.
    Other(u16),
}

impl ResultCode {
    /// The code of a number on the wire.
    pub fn from_wire(v: u16) -> Self {
        match v {
            0 => Self::Success,
            1 => Self::UnsupportedVersion,
            2 => Self::NotAuthorized,
            3 => Self::NetworkFailure,
            4 => Self::OutOfResources,
            5 => Self::UnsupportedOpcode,
            v => Self::Other(v),
        }
    }

    /// Its number on the wire.
    pub fn to_wire(self) -> u16 {
        match self {
            Self::Success => 0,
            Self::UnsupportedVersion => 1,
            Self::NotAuthorized => 2,
            Self::NetworkFailure => 3,
            Self::OutOfResources => 4,
            Self::UnsupportedOpcode => 5,
            Self::Other(v) => v,
        }
    }
}

impl std::fmt::Display for ResultCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Success => f.write_str("success"),
            Self::UnsupportedVersion => f.write_str("unsupported version"),
            Self::NotAuthorized => f.write_str("not authorized"),
            Self::NetworkFailure => f.write_str("network failure"),
            Self::OutOfResources => f.write_str("out of resources"),
            Self::UnsupportedOpcode => f.write_str("unsupported opcode"),
            Self::Other(v) => write!(f, "result code {v}"),
        }
    }
}

/// What a response says beyond its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The gateway refused (or failed); no body.
    Refused {
        /// The operation the refusal answers (0 external address, 1 UDP, 2 TCP).
        op: u8,
    },
    /// The gateway's external address.
    ExternalAddress(Ipv4Addr),
    /// A mapping made (or deleted, with lifetime 0).
    Mapped {
        /// TCP or UDP.
        protocol: Protocol,
        /// Our port.
        internal_port: u16,
        /// The port the gateway forwards to it.
        external_port: u16,
        /// Seconds the gateway keeps it.
        lifetime: u32,
    },
}

/// A gateway's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// The result.
    pub result: ResultCode,
    /// Seconds since the gateway's epoch (its start, or the last loss of mappings).
    pub epoch: u32,
    /// What it answered.
    pub answer: Answer,
}

impl Response {
    /// Reads an answer.
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        if b.len() < HEADER_LEN {
            return Err(ParseError::Truncated { len: b.len() });
        }
        if b[0] != VERSION {
            return Err(ParseError::Version(b[0]));
        }
        if b[1] < OP_RESPONSE {
            return Err(ParseError::Opcode(b[1]));
        }
        let op = b[1] - OP_RESPONSE;
        let result = ResultCode::from_wire(be16(&b[2..4]));
        let epoch = be32(&b[4..8]);
        let answer = if result != ResultCode::Success {
            Answer::Refused { op }
        } else {
            match op {
                OP_EXTERNAL => {
                    if b.len() < EXTERNAL_RESPONSE_LEN {
                        return Err(ParseError::Truncated { len: b.len() });
                    }
                    Answer::ExternalAddress(Ipv4Addr::new(b[8], b[9], b[10], b[11]))
                }
                OP_UDP | OP_TCP => {
                    if b.len() < MAP_RESPONSE_LEN {
                        return Err(ParseError::Truncated { len: b.len() });
                    }
                    Answer::Mapped {
                        protocol: if op == OP_UDP { Protocol::Udp } else { Protocol::Tcp },
                        internal_port: be16(&b[8..10]),
                        external_port: be16(&b[10..12]),
                        lifetime: be32(&b[12..16]),
                    }
                }
                op => return Err(ParseError::Opcode(op | OP_RESPONSE)),
            }
        };
        Ok(Self { result, epoch, answer })
    }

    /// The encoded answer (what a gateway sends; the tests' fake router uses it).
    pub fn emit(&self) -> Vec<u8> {
        let op = match self.answer {
            Answer::Refused { op } => op,
            Answer::ExternalAddress(_) => OP_EXTERNAL,
            Answer::Mapped { protocol, .. } => op_of(protocol),
        };
        let mut b = vec![VERSION, OP_RESPONSE | op];
        b.extend_from_slice(&self.result.to_wire().to_be_bytes());
        b.extend_from_slice(&self.epoch.to_be_bytes());
        match self.answer {
            Answer::Refused { .. } => {}
            Answer::ExternalAddress(a) => b.extend_from_slice(&a.octets()),
            Answer::Mapped { internal_port, external_port, lifetime, .. } => {
                b.extend_from_slice(&internal_port.to_be_bytes());
                b.extend_from_slice(&external_port.to_be_bytes());
                b.extend_from_slice(&lifetime.to_be_bytes());
            }
        }
        b
    }
}

fn op_of(p: Protocol) -> u8 {
    match p {
        Protocol::Udp => OP_UDP,
        Protocol::Tcp => OP_TCP,
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

    #[test]
    fn requests_encode_as_the_rfc_lays_them_out() {
        assert_eq!(Request::ExternalAddress.emit(), [0, 0]);
        let map = Request::Map { protocol: Protocol::Udp, internal_port: 11010, external_port: 11010, lifetime: 7200 };
        let b = map.emit();
        assert_eq!(b, [0, 1, 0, 0, 0x2b, 0x02, 0x2b, 0x02, 0, 0, 0x1c, 0x20]);
        assert_eq!(b.len(), map.buffer_len());
        assert_eq!(Request::parse(&b), Ok(map));
        assert_eq!(Request::parse(&[0, 0]), Ok(Request::ExternalAddress));
        assert_eq!(Request::parse(&[0, 1, 0, 0]), Err(ParseError::Truncated { len: 4 }));
        assert_eq!(Request::parse(&[2, 1]), Err(ParseError::Version(2)));
    }

    // Answers of miniupnpd 2.3.1 (Debian 12) to `Request::ExternalAddress`, to the map
    // request above and to its deletion (lifetime 0), captured in test namespaces.
    const RECORDED_EXTERNAL: [u8; 12] = [0, 128, 0, 0, 0, 0, 0, 1, 100, 200, 0, 2];
    const RECORDED_MAP: [u8; 16] = [0, 129, 0, 0, 0, 0, 0, 1, 43, 2, 43, 2, 0, 0, 28, 32];
    const RECORDED_DELETE: [u8; 16] = [0, 129, 0, 0, 0, 0, 0, 1, 43, 2, 0, 0, 0, 0, 0, 0];

    #[test]
    fn recorded_answers_parse() {
        let r = Response::parse(&RECORDED_EXTERNAL).unwrap();
        assert_eq!(r.result, ResultCode::Success);
        assert_eq!(r.epoch, 1);
        assert_eq!(r.answer, Answer::ExternalAddress(Ipv4Addr::new(100, 200, 0, 2)));
        let r = Response::parse(&RECORDED_MAP).unwrap();
        assert_eq!(r.epoch, 1);
        assert_eq!(
            r.answer,
            Answer::Mapped { protocol: Protocol::Udp, internal_port: 11010, external_port: 11010, lifetime: 7200 }
        );
        assert_eq!(r.emit(), RECORDED_MAP);
        let r = Response::parse(&RECORDED_DELETE).unwrap();
        assert_eq!(
            r.answer,
            Answer::Mapped { protocol: Protocol::Udp, internal_port: 11010, external_port: 0, lifetime: 0 }
        );
    }

    #[test]
    fn refusals_carry_their_code_and_may_stop_after_the_header() {
        // A PCP-only server answers NAT-PMP's version with "unsupported version".
        let r = Response::parse(&[0, 0x81, 0, 1, 0, 0, 1, 0]).unwrap();
        assert_eq!(r.result, ResultCode::UnsupportedVersion);
        assert_eq!(r.epoch, 256);
        assert_eq!(r.answer, Answer::Refused { op: 1 });
        for (code, want) in [
            (2, ResultCode::NotAuthorized),
            (3, ResultCode::NetworkFailure),
            (4, ResultCode::OutOfResources),
            (5, ResultCode::UnsupportedOpcode),
            (77, ResultCode::Other(77)),
        ] {
            let b = [0, 0x81, 0, code, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0];
            let r = Response::parse(&b).unwrap();
            assert_eq!(r.result, want);
            assert_eq!(r.result.to_wire(), u16::from(code));
        }
    }

    #[test]
    fn malformed_answers_are_errors() {
        assert_eq!(Response::parse(&[]), Err(ParseError::Truncated { len: 0 }));
        assert_eq!(Response::parse(&RECORDED_MAP[..7]), Err(ParseError::Truncated { len: 7 }));
        // A success without its body.
        assert_eq!(Response::parse(&RECORDED_MAP[..12]), Err(ParseError::Truncated { len: 12 }));
        assert_eq!(Response::parse(&RECORDED_EXTERNAL[..10]), Err(ParseError::Truncated { len: 10 }));
        // A request echoed back, PCP's version, an unknown operation.
        assert_eq!(Response::parse(&[0, 1, 0, 0, 0, 0, 0, 0]), Err(ParseError::Opcode(1)));
        assert_eq!(Response::parse(&[2, 0x81, 0, 0, 0, 0, 0, 0]), Err(ParseError::Version(2)));
        assert_eq!(Response::parse(&[0, 0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(ParseError::Opcode(0x83)));
    }
}
