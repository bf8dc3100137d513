//! Where a frame goes on the underlay: a transport ([`Proto`]) and a socket address,
//! together an [`Endpoint`]. Plain values: the I/O that reaches them lives in
//! `weft-datapath`'s transports.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// `addr` with an IPv4-mapped IPv6 address (a dual-stack socket's IPv4 peer) as the
/// IPv4 address it is: one peer has one endpoint whichever socket saw it.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// A transport, in order of preference: when several paths to a peer work, the one
/// with the smallest `Proto` carries the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// UDP datagrams: no head-of-line blocking, GSO/GRO.
    Udp = 0,
    /// QUIC datagrams (quinn): for networks that mangle plain UDP.
    Quic = 1,
    /// Length-framed datagrams over TCP.
    Tcp = 2,
    /// WebSocket binary messages over TCP.
    Ws = 3,
    /// WebSocket over TLS.
    Wss = 4,
}

impl Proto {
    /// Every transport, best first.
    pub const ALL: [Self; 5] = [Self::Udp, Self::Quic, Self::Tcp, Self::Ws, Self::Wss];

    /// The URI scheme.
    pub fn scheme(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Quic => "quic",
            Self::Tcp => "tcp",
            Self::Ws => "ws",
            Self::Wss => "wss",
        }
    }

    /// The wire code (topology records, punch lists).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`Proto::code`].
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.code() == c)
    }

    /// A reliable byte or message stream (TCP, WebSocket), which carries frames of up
    /// to 64 KiB whole: GSO records go over these only.
    pub fn is_stream(self) -> bool {
        matches!(self, Self::Tcp | Self::Ws | Self::Wss)
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scheme())
    }
}

impl FromStr for Proto {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Self::ALL.into_iter().find(|p| p.scheme() == s).ok_or(())
    }
}

/// One end of a path: a transport and a socket address. For UDP and for dialled
/// connections the address is the peer's listener; for an accepted connection it is
/// the remote end of that connection (unique while it lives).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// The transport.
    pub proto: Proto,
    /// The address.
    pub addr: SocketAddr,
}

impl Endpoint {
    /// A UDP endpoint.
    pub const fn udp(addr: SocketAddr) -> Self {
        Self { proto: Proto::Udp, addr }
    }

    /// An endpoint of `proto`.
    pub const fn new(proto: Proto, addr: SocketAddr) -> Self {
        Self { proto, addr }
    }

    /// A 64-bit digest (exact for IPv4), cheap enough to compare per packet.
    pub fn key(&self) -> u64 {
        match self.addr {
            SocketAddr::V4(a) => {
                (u64::from(self.proto.code()) << 56)
                    | (u64::from(u32::from(*a.ip())) << 16)
                    | u64::from(a.port())
                    | 1 << 63
            }
            SocketAddr::V6(_) => {
                let mut h = rustc_hash::FxHasher::default();
                std::hash::Hash::hash(self, &mut h);
                std::hash::Hasher::finish(&h) & !(1 << 63)
            }
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.proto, self.addr)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Endpoint {
    type Err = String;
    /// `SCHEME://IP:PORT` (numeric: names are resolved by the caller), or a bare
    /// `IP:PORT` for UDP.
    fn from_str(s: &str) -> Result<Self, String> {
        let (proto, addr) = match s.split_once("://") {
            Some((scheme, rest)) => (scheme.parse().map_err(|()| format!("unknown transport in {s:?}"))?, rest),
            None => (Proto::Udp, s),
        };
        let addr = addr.parse().map_err(|e| format!("bad address in {s:?}: {e}"))?;
        Ok(Self { proto, addr })
    }
}

impl From<SocketAddr> for Endpoint {
    /// A bare address is a UDP endpoint.
    fn from(addr: SocketAddr) -> Self {
        Self::udp(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preference_order_and_codes() {
        let mut v = Proto::ALL.to_vec();
        v.reverse();
        v.sort();
        assert_eq!(v, [Proto::Udp, Proto::Quic, Proto::Tcp, Proto::Ws, Proto::Wss]);
        for p in Proto::ALL {
            assert_eq!(Proto::from_code(p.code()), Some(p));
            assert_eq!(p.scheme().parse::<Proto>(), Ok(p));
        }
        assert_eq!(Proto::from_code(9), None);
        let e = Endpoint::new(Proto::Wss, "192.0.2.1:11012".parse().unwrap());
        assert_eq!(e.to_string(), "wss://192.0.2.1:11012");
        assert_eq!(e.to_string().parse::<Endpoint>(), Ok(e));
        assert_eq!("192.0.2.1:7".parse::<Endpoint>().map(|e| e.proto), Ok(Proto::Udp));
        assert!("gopher://192.0.2.1:7".parse::<Endpoint>().is_err());
        assert!("tcp://host:7".parse::<Endpoint>().is_err());
    }
}
