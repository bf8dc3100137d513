//! LAN discovery: multicast beacons that carry a hash of the network name, the
//! sender's node id, address and UDP port, and the time they were sent, sealed with
//! a MAC keyed from the PSK. Members that hear a fresh, authentic beacon of their own
//! network dial its sender; the handshake still needs the secret.
//!
//! A beacon is dropped (and counted) when its MAC fails (a stranger, or a member of
//! another network with the same name), when its time is more than [`MAX_SKEW`] from
//! ours (a replay), or when it did not come from the address it names (a replay from
//! elsewhere). So someone on the LAN without the secret can make a node dial nothing
//! but the real members, and only at the addresses they announce themselves.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use ring::{digest, hmac};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tracing::{debug, warn};
use weft_core::admission::{MAC_LEN, ct_eq, mac};

/// Multicast group and port of the beacons.
pub const GROUP: Ipv4Addr = Ipv4Addr::new(239, 255, 77, 77);
/// UDP port of the beacons.
pub const PORT: u16 = 11013;
/// Label of the beacon MAC key, derived from the PSK (`Psk::subkey`).
pub const KEY_LABEL: &[u8] = b"weft/v1/lan-beacon";
/// How far a beacon's time may be from ours.
pub const MAX_SKEW: Duration = Duration::from_secs(10);
const MAGIC: &[u8; 5] = b"WEFT2";
const BODY: usize = 5 + 8 + 8 + 4 + 2 + 8;
/// Length of a beacon on the wire.
pub const LEN: usize = BODY + MAC_LEN;

/// A beacon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beacon {
    /// First 8 bytes of SHA-256 of the network name.
    pub network: [u8; 8],
    /// The sender's node id.
    pub node: [u8; 8],
    /// The sender's address on the interface the beacon leaves from.
    pub addr: Ipv4Addr,
    /// The sender's UDP listen port.
    pub port: u16,
}

/// Why a beacon was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a beacon of this version (wrong length or magic).
    Malformed,
    /// A beacon of another network (normal on a shared LAN; not counted).
    OtherNetwork,
    /// The MAC does not verify: not made with our network's secret, or altered.
    BadMac,
    /// Sent more than [`MAX_SKEW`] before or after now: a replay, or a bad clock.
    Stale,
}

/// The MAC key of beacons, from the network's PSK subkey.
pub fn beacon_key(subkey: &[u8; 32]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, subkey)
}

impl Beacon {
    /// The network hash of `name`.
    pub fn network_hash(name: &str) -> [u8; 8] {
        let d = digest::digest(&digest::SHA256, format!("weft/v1/lan/{name}").as_bytes());
        let mut h = [0u8; 8];
        h.copy_from_slice(&d.as_ref()[..8]);
        h
    }

    /// Encodes the beacon stamped with `now_ms` (Unix milliseconds) and seals it
    /// with `key`: HMAC-SHA256 over everything before the tag, truncated to 16 bytes.
    pub fn seal(&self, key: &hmac::Key, now_ms: u64) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..5].copy_from_slice(MAGIC);
        b[5..13].copy_from_slice(&self.network);
        b[13..21].copy_from_slice(&self.node);
        b[21..25].copy_from_slice(&self.addr.octets());
        b[25..27].copy_from_slice(&self.port.to_le_bytes());
        b[27..35].copy_from_slice(&now_ms.to_le_bytes());
        let tag = mac(key, &b[..BODY]);
        b[BODY..].copy_from_slice(&tag);
        b
    }

    /// Checks and decodes a beacon of `network`: its form, its MAC under `key`
    /// (constant time), and that its time is within [`MAX_SKEW`] of `now_ms`.
    pub fn open(b: &[u8], network: &[u8; 8], key: &hmac::Key, now_ms: u64) -> Result<Self, Refused> {
        if b.len() != LEN || &b[..5] != MAGIC {
            return Err(Refused::Malformed);
        }
        if &b[5..13] != network {
            return Err(Refused::OtherNetwork);
        }
        if !ct_eq(&mac(key, &b[..BODY]), &b[BODY..]) {
            return Err(Refused::BadMac);
        }
        let mut sent = [0u8; 8];
        sent.copy_from_slice(&b[27..35]);
        if u64::from_le_bytes(sent).abs_diff(now_ms) > MAX_SKEW.as_millis() as u64 {
            return Err(Refused::Stale);
        }
        let mut node = [0u8; 8];
        node.copy_from_slice(&b[13..21]);
        Ok(Self {
            network: *network,
            node,
            addr: Ipv4Addr::new(b[21], b[22], b[23], b[24]),
            port: u16::from_le_bytes([b[25], b[26]]),
        })
    }
}

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Beacons dropped, by reason.
#[derive(Debug, Default)]
pub struct Drops {
    /// Wrong length or magic.
    pub malformed: AtomicU64,
    /// MAC did not verify.
    pub bad_mac: AtomicU64,
    /// Timestamp too far from now.
    pub stale: AtomicU64,
    /// Authentic, but from another address than the one it names.
    pub wrong_source: AtomicU64,
}

impl Drops {
    /// Nonzero counters, named for `weft status`.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        [
            ("lan_beacon_malformed", &self.malformed),
            ("lan_beacon_bad_mac", &self.bad_mac),
            ("lan_beacon_stale", &self.stale),
            ("lan_beacon_wrong_source", &self.wrong_source),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.load(Ordering::Relaxed)))
        .filter(|(_, v)| *v > 0)
        .collect()
    }
}

/// The beacon socket, joined on every IPv4 interface given.
pub struct Discovery {
    sock: UdpSocket,
    interfaces: Vec<Ipv4Addr>,
    network: [u8; 8],
    node: [u8; 8],
    port: u16,
    key: hmac::Key,
    /// Beacons dropped, by reason.
    pub drops: std::sync::Arc<Drops>,
}

impl Discovery {
    /// Binds the beacon port and joins the group on `interfaces`. Beacons announce
    /// `node` on `network` at UDP `port`, sealed with `key` ([`beacon_key`]).
    pub fn new(interfaces: Vec<Ipv4Addr>, network: [u8; 8], node: [u8; 8], port: u16, key: hmac::Key) -> Result<Self> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        weft_datapath::transport::mark_socket(&s)?;
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
        Ok(Self { sock, interfaces, network, node, port, key, drops: Default::default() })
    }

    /// Sends one beacon out of every interface.
    pub async fn announce(&self) {
        let now = unix_ms();
        for i in &self.interfaces {
            let beacon = Beacon { network: self.network, node: self.node, addr: *i, port: self.port };
            let bytes = beacon.seal(&self.key, now);
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
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let b = match Beacon::open(&buf[..n], &self.network, &self.key, unix_ms()) {
                Ok(b) => b,
                Err(why) => {
                    let counter = match why {
                        Refused::OtherNetwork => continue,
                        Refused::Malformed => &self.drops.malformed,
                        Refused::BadMac => &self.drops.bad_mac,
                        Refused::Stale => &self.drops.stale,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    debug!(%from, ?why, "LAN beacon dropped");
                    continue;
                }
            };
            if b.node == self.node {
                continue;
            }
            // A beacon names the address it was sent from: one replayed from elsewhere
            // would send us dialling the replayer.
            if from.ip() != b.addr {
                self.drops.wrong_source.fetch_add(1, Ordering::Relaxed);
                debug!(%from, addr = %b.addr, "LAN beacon dropped: not from the address it names");
                continue;
            }
            debug!(%from, port = b.port, "LAN beacon");
            return SocketAddr::new(b.addr.into(), b.port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_790_000_000_000;

    fn key(label: &[u8]) -> hmac::Key {
        let psk = weft_core::handshake::Psk::from_bytes([7; 32]);
        beacon_key(&psk.subkey(label))
    }

    fn beacon() -> Beacon {
        Beacon { network: Beacon::network_hash("office"), node: [7; 8], addr: [192, 168, 1, 20].into(), port: 11010 }
    }

    #[test]
    fn beacon_round_trip_and_hides_the_name() {
        let k = key(KEY_LABEL);
        let b = beacon();
        let bytes = b.seal(&k, NOW);
        assert_eq!(Beacon::open(&bytes, &b.network, &k, NOW), Ok(b));
        assert!(!bytes.windows(6).any(|w| w == b"office"));
        assert_ne!(Beacon::network_hash("office"), Beacon::network_hash("lab"));
        assert_eq!(Beacon::open(&bytes, &Beacon::network_hash("lab"), &k, NOW), Err(Refused::OtherNetwork));
    }

    #[test]
    fn wrong_key_fails() {
        let b = beacon();
        let bytes = b.seal(&key(KEY_LABEL), NOW);
        // Another secret, or the same PSK under another label.
        let other = beacon_key(&weft_core::handshake::Psk::from_bytes([8; 32]).subkey(KEY_LABEL));
        assert_eq!(Beacon::open(&bytes, &b.network, &other, NOW), Err(Refused::BadMac));
        assert_eq!(Beacon::open(&bytes, &b.network, &key(b"weft/v1/other"), NOW), Err(Refused::BadMac));
    }

    #[test]
    fn stale_or_future_timestamps_fail() {
        let k = key(KEY_LABEL);
        let b = beacon();
        let skew = MAX_SKEW.as_millis() as u64;
        for sent in [NOW - skew, NOW + skew, NOW - 1, NOW + 1] {
            assert_eq!(Beacon::open(&b.seal(&k, sent), &b.network, &k, NOW), Ok(b), "{sent}");
        }
        for sent in [NOW - skew - 1, NOW + skew + 1, NOW - 60_000, 0, u64::MAX] {
            assert_eq!(Beacon::open(&b.seal(&k, sent), &b.network, &k, NOW), Err(Refused::Stale), "{sent}");
        }
    }

    #[test]
    fn truncated_or_tampered_beacons_fail() {
        let k = key(KEY_LABEL);
        let b = beacon();
        let bytes = b.seal(&k, NOW);
        for n in [0, 5, BODY, LEN - 1] {
            assert_eq!(Beacon::open(&bytes[..n], &b.network, &k, NOW), Err(Refused::Malformed), "{n}");
        }
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(Beacon::open(&long, &b.network, &k, NOW), Err(Refused::Malformed));
        // Every byte after the network hash is covered by the MAC (the magic and the
        // hash are checked before it).
        for i in 13..LEN {
            let mut t = bytes;
            t[i] ^= 0x01;
            assert_eq!(Beacon::open(&t, &b.network, &k, NOW), Err(Refused::BadMac), "byte {i}");
        }
        let mut t = bytes;
        t[0] ^= 1;
        assert_eq!(Beacon::open(&t, &b.network, &k, NOW), Err(Refused::Malformed));
        // The old unauthenticated format is not a beacon any more.
        let mut old = [0u8; 23];
        old[..5].copy_from_slice(b"WEFT1");
        assert_eq!(Beacon::open(&old, &b.network, &k, NOW), Err(Refused::Malformed));
    }
}
