//! LAN discovery: multicast beacons that carry only a hash of the network name, the
//! sender's node id and its listen port. Members that hear a beacon of their own
//! network dial its sender; the handshake still needs the secret.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use anyhow::{Context, Result};
use ring::digest;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tracing::{debug, warn};

/// Multicast group and port of the beacons.
pub const GROUP: Ipv4Addr = Ipv4Addr::new(239, 255, 77, 77);
/// UDP port of the beacons.
pub const PORT: u16 = 11013;
const MAGIC: &[u8; 5] = b"WEFT1";
const LEN: usize = 5 + 8 + 8 + 2;

/// A beacon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beacon {
    /// First 8 bytes of SHA-256 of the network name.
    pub network: [u8; 8],
    /// The sender's node id.
    pub node: [u8; 8],
    /// The sender's UDP listen port.
    pub port: u16,
}

impl Beacon {
    /// The network hash of `name`.
    pub fn network_hash(name: &str) -> [u8; 8] {
        let d = digest::digest(&digest::SHA256, format!("weft/v1/lan/{name}").as_bytes());
        let mut h = [0u8; 8];
        h.copy_from_slice(&d.as_ref()[..8]);
        h
    }

    /// Encodes the beacon.
    pub fn emit(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..5].copy_from_slice(MAGIC);
        b[5..13].copy_from_slice(&self.network);
        b[13..21].copy_from_slice(&self.node);
        b[21..23].copy_from_slice(&self.port.to_le_bytes());
        b
    }

    /// Parses a beacon.
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() != LEN || &b[..5] != MAGIC {
            return None;
        }
        Some(Self {
            network: b[5..13].try_into().ok()?,
            node: b[13..21].try_into().ok()?,
            port: u16::from_le_bytes([b[21], b[22]]),
        })
    }
}

/// The beacon socket, joined on every IPv4 interface given.
pub struct Discovery {
    sock: UdpSocket,
    interfaces: Vec<Ipv4Addr>,
    beacon: Beacon,
}

impl Discovery {
    /// Binds the beacon port and joins the group on `interfaces`.
    pub fn new(interfaces: Vec<Ipv4Addr>, beacon: Beacon) -> Result<Self> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_multicast_loop_v4(false)?;
        s.bind(&SocketAddr::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT)).into())
            .with_context(|| format!("cannot bind the LAN discovery port {PORT}"))?;
        for i in &interfaces {
            if let Err(e) = s.join_multicast_v4(&GROUP, i) {
                warn!(interface = %i, error = %e, "cannot join the discovery group");
            }
        }
        s.set_nonblocking(true)?;
        let sock = UdpSocket::from_std(s.into())?;
        Ok(Self { sock, interfaces, beacon })
    }

    /// Sends one beacon out of every interface.
    pub async fn announce(&self) {
        let bytes = self.beacon.emit();
        for i in &self.interfaces {
            let r = socket2::SockRef::from(&self.sock).set_multicast_if_v4(i);
            if r.is_ok() {
                let _ = self.sock.send_to(&bytes, SocketAddrV4::new(GROUP, PORT)).await;
            }
        }
    }

    /// Waits for a beacon of our network from another node; returns its endpoint.
    pub async fn next_peer(&self) -> SocketAddr {
        let mut buf = [0u8; 64];
        loop {
            let (n, from) = match self.sock.recv_from(&mut buf).await {
                Ok(x) => x,
                Err(e) => {
                    // Never spin on a socket error; beacons are best effort.
                    debug!(error = %e, "LAN discovery receive failed");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
            };
            let Some(b) = Beacon::parse(&buf[..n]) else { continue };
            if b.network != self.beacon.network || b.node == self.beacon.node {
                continue;
            }
            debug!(%from, port = b.port, "LAN beacon");
            return SocketAddr::new(from.ip(), b.port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beacon_round_trip_and_hides_the_name() {
        let b = Beacon { network: Beacon::network_hash("office"), node: [7; 8], port: 11010 };
        let bytes = b.emit();
        assert_eq!(Beacon::parse(&bytes), Some(b));
        assert!(!bytes.windows(6).any(|w| w == b"office"));
        assert_ne!(Beacon::network_hash("office"), Beacon::network_hash("lab"));
        assert_eq!(Beacon::parse(&bytes[..LEN - 1]), None);
        assert_eq!(Beacon::parse(&[0u8; LEN]), None);
    }
}
