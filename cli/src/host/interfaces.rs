//! The machine's own interfaces: the addresses this node announces to peers, and the
//! networks it is directly on (never routed into the tunnel, never punched from
//! outside).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use weft_datapath::transport::Endpoint;

/// The addresses peers may reach this node at: the listen address, or with a wildcard
/// listener every non-loopback IPv4 interface address except the overlay's own.
pub(crate) fn local_endpoints(
    listeners: &[Endpoint],
    overlay: std::net::Ipv4Addr,
    dev: &str,
    portal_dev: Option<&str>,
) -> Vec<Endpoint> {
    let ips = local_ipv4s(overlay, portal_dev);
    let ips6 = if listeners.iter().any(|l| l.addr.is_ipv6()) { local_ipv6s(dev, portal_dev) } else { Vec::new() };
    let mut out = Vec::new();
    for l in listeners {
        if l.addr.ip().is_unspecified() {
            out.extend(ips.iter().map(|a| Endpoint::new(l.proto, SocketAddr::new((*a).into(), l.addr.port()))));
            // `[::]` is dual-stack: its IPv6 addresses too.
            if l.addr.is_ipv6() {
                out.extend(ips6.iter().map(|a| Endpoint::new(l.proto, SocketAddr::new((*a).into(), l.addr.port()))));
            }
        } else {
            out.push(*l);
        }
    }
    out
}

/// Non-loopback, non-link-local IPv4 addresses of this host, except the overlay's own
/// and those of the WireGuard portal's device (both live inside the overlay: a member
/// that dialled them would carry the overlay through itself).
pub(crate) fn local_ipv4s(overlay: std::net::Ipv4Addr, portal_dev: Option<&str>) -> Vec<std::net::Ipv4Addr> {
    let Ok(ifs) = if_addrs::get_if_addrs() else { return Vec::new() };
    ifs.into_iter()
        .filter(|i| !i.is_loopback() && Some(i.name.as_str()) != portal_dev)
        .filter_map(|i| match i.ip() {
            IpAddr::V4(v4) if v4 != overlay && !v4.is_link_local() => Some(v4),
            _ => None,
        })
        .collect()
}

/// This host's IPv6 addresses a member elsewhere could reach: not loopback, not
/// link-local (they need a scope), not the TUN's (the IPv6 overlay) nor the portal
/// device's.
pub(crate) fn local_ipv6s(dev: &str, portal_dev: Option<&str>) -> Vec<Ipv6Addr> {
    let Ok(ifs) = if_addrs::get_if_addrs() else { return Vec::new() };
    ifs.into_iter()
        .filter(|i| !i.is_loopback() && i.name != dev && Some(i.name.as_str()) != portal_dev)
        .filter_map(|i| match i.ip() {
            IpAddr::V6(v6) if !v6.is_unicast_link_local() && !v6.is_loopback() => Some(v6),
            _ => None,
        })
        .collect()
}

/// The IPv4 networks this host is directly connected to (every interface but the
/// tunnel, loopback included): a member proxying one of them is refused.
pub(crate) fn local_networks(dev_name: &str) -> Vec<(IpAddr, u8)> {
    let Ok(ifs) = if_addrs::get_if_addrs() else { return Vec::new() };
    let mut v: Vec<(IpAddr, u8)> = ifs
        .into_iter()
        .filter(|i| i.name != dev_name)
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) => {
                let prefix = u32::from(a.netmask).leading_ones() as u8;
                Some((weft_core::route::network_ip(IpAddr::V4(a.ip), prefix), prefix))
            }
            // Link-local and loopback prefixes are every host's; they say nothing.
            if_addrs::IfAddr::V6(a) if !a.ip.is_unicast_link_local() && !a.ip.is_loopback() => {
                let prefix = u128::from(a.netmask).leading_ones() as u8;
                Some((weft_core::route::network_ip(IpAddr::V6(a.ip), prefix), prefix))
            }
            if_addrs::IfAddr::V6(_) => None,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}
