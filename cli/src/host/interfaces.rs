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

/// The IPv4 default gateway of the main routing table (`/proc/net/route`), the router
/// port mapping asks; `None` without a default route.
pub(crate) fn default_gateway() -> Option<std::net::Ipv4Addr> {
    let table = std::fs::read_to_string("/proc/net/route").ok()?;
    parse_default_gateway(&table)
}

/// The gateway of the first default route (destination and mask 0, flag G) of a
/// `/proc/net/route` table, whose addresses are hexadecimal in host (little-endian)
/// byte order.
fn parse_default_gateway(table: &str) -> Option<std::net::Ipv4Addr> {
    const RTF_UP: u32 = 0x1;
    const RTF_GATEWAY: u32 = 0x2;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let hex = |i: usize| f.get(i).and_then(|s| u32::from_str_radix(s, 16).ok());
        let (dest, gw, flags, mask) = (hex(1)?, hex(2)?, hex(3)?, hex(7)?);
        let default = dest == 0 && mask == 0 && flags & (RTF_UP | RTF_GATEWAY) == RTF_UP | RTF_GATEWAY;
        (default && gw != 0).then(|| std::net::Ipv4Addr::from(gw.swap_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_gateway_is_read_from_the_route_table() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                     eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(parse_default_gateway(table), Some(std::net::Ipv4Addr::new(192, 0, 2, 1)));
        // A default route without a gateway (a point-to-point link) names no router.
        let table = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                     ppp0\t00000000\t00000000\t0001\t0\t0\t0\t00000000\n";
        assert_eq!(parse_default_gateway(table), None);
        assert_eq!(parse_default_gateway("garbage\nx y z\n"), None);
        assert_eq!(parse_default_gateway(""), None);
    }
}
