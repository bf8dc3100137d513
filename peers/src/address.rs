//! Overlay addresses every member derives alike: the default routes an exit announces
//! and the IPv6 overlay address made from the network name and node id.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::identity::NodeId;

/// The default route: what an exit node announces (`--exit-node`).
pub const DEFAULT_ROUTE: (IpAddr, u8) = (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
/// The IPv6 default route, which an exit node with an IPv6 overlay announces too.
pub const DEFAULT_ROUTE6: (IpAddr, u8) = (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);

/// The IPv6 overlay address a node has without `--ipv6`: in the unique local
/// prefix `fdXX:XXXX:XXXX::/48` whose 40-bit global id is a hash of the network name
/// (RFC 4193), subnet 0, with the node id as interface identifier — so every member
/// of a network shares one /64 and has an address no other member can claim.
pub fn default_ipv6(network: &str, id: NodeId) -> (Ipv6Addr, u8) {
    let h = ring::digest::digest(
        &ring::digest::SHA256,
        [b"weft/v1/ula/".as_slice(), network.as_bytes()].concat().as_slice(),
    );
    let mut o = [0u8; 16];
    o[0] = 0xfd;
    o[1..6].copy_from_slice(&h.as_ref()[..5]);
    o[8..].copy_from_slice(&id.to_bytes());
    (Ipv6Addr::from(o), 64)
}

/// Whether `a` is the IPv6 address derived from node `id` in some /64: the id is its
/// interface identifier, which no other node can hold.
pub fn derived_from(a: Ipv6Addr, id: NodeId) -> bool {
    a.octets()[8..] == id.to_bytes()
}
