//! `--wg-portal` and its companions, parsed and checked against the overlay and the
//! proxied subnets (the portal itself is `services::portal`).

use std::net::{Ipv4Addr, SocketAddr};

use super::values::{IpNet, Ipv4Net, UsageError};

/// `--wg-portal` and its companions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalConfig {
    /// UDP address the portal listens on.
    pub listen: SocketAddr,
    /// The portal network: the portal has its first host, clients get the others.
    pub net: Ipv4Net,
    /// `HOST:PORT` written as the Endpoint of client configs (default: the listen
    /// address, or this host's first address when it listens on all of them).
    pub endpoint: Option<String>,
}

impl PortalConfig {
    /// Parses `--wg-portal udp://ADDR:PORT`, `--wg-portal-net CIDR` and
    /// `--wg-portal-endpoint HOST:PORT`, and checks that the portal network overlaps
    /// neither the overlay nor a proxied subnet.
    pub fn parse(
        listen: &str,
        net: Option<&str>,
        endpoint: Option<&str>,
        overlay: Ipv4Net,
        proxied: &[IpNet],
    ) -> Result<Self, UsageError> {
        let uri: crate::config::values::PeerUri = listen
            .parse()
            .map_err(|e: UsageError| UsageError(format!("invalid --wg-portal: {e} (expected udp://ADDR:PORT)")))?;
        if uri.proto != weft_datapath::transport::Proto::Udp {
            return Err(UsageError(format!(
                "invalid --wg-portal {listen:?}: WireGuard clients speak UDP only (expected udp://ADDR:PORT)"
            )));
        }
        let listen = uri.resolve()?.addr;
        let Some(net) = net else {
            return Err(UsageError(
                "--wg-portal needs --wg-portal-net CIDR: the addresses its clients get (e.g. 10.127.0.0/24)".into(),
            ));
        };
        let Some(given) = Ipv4Net::parse_cidr(net) else {
            return Err(UsageError(format!("invalid --wg-portal-net {net:?}: expected a CIDR such as 10.127.0.0/24")));
        };
        if !(8..=30).contains(&given.prefix) {
            return Err(UsageError(format!(
                "invalid --wg-portal-net {net:?}: the prefix must be /8 to /30 (room for the portal and a client)"
            )));
        }
        let net = given.network();
        if net.overlaps(overlay) {
            return Err(UsageError(format!("--wg-portal-net {net} overlaps the overlay network {overlay}")));
        }
        if let Some(p) = proxied.iter().find(|p| IpNet::from(net).overlaps(**p)) {
            return Err(UsageError(format!("--wg-portal-net {net} overlaps --proxy-network {p}")));
        }
        if let Some(e) = endpoint {
            let ok = e.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok || e.contains(char::is_whitespace) {
                return Err(UsageError(format!("invalid --wg-portal-endpoint {e:?}: expected HOST:PORT")));
            }
        }
        Ok(Self { listen, net, endpoint: endpoint.map(str::to_owned) })
    }

    /// The portal's own address: the first host of the portal network.
    pub fn portal_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.net.addr) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        let (a, p) = s.split_once('/').unwrap();
        Ipv4Net { addr: a.parse().unwrap(), prefix: p.parse().unwrap() }
    }

    #[test]
    fn bad_portal_options_name_themselves() {
        let overlay = net("10.126.126.1/24");
        let proxied = [IpNet::from(net("192.168.7.0/24"))];
        let ok = PortalConfig::parse("udp://0.0.0.0:51820", Some("10.127.0.9/24"), None, overlay, &proxied).unwrap();
        assert_eq!(ok.net, net("10.127.0.0/24"), "host bits are cleared");
        assert_eq!(ok.portal_addr(), Ipv4Addr::new(10, 127, 0, 1));
        for (listen, n, endpoint, needle) in [
            ("tcp://0.0.0.0:51820", Some("10.127.0.0/24"), None, "UDP only"),
            ("udp://0.0.0.0", Some("10.127.0.0/24"), None, "--wg-portal"),
            ("udp://0.0.0.0:51820", None, None, "--wg-portal-net"),
            ("udp://0.0.0.0:51820", Some("10.127.0.0"), None, "10.127.0.0"),
            ("udp://0.0.0.0:51820", Some("10.127.0.0/31"), None, "/8 to /30"),
            ("udp://0.0.0.0:51820", Some("10.126.0.0/16"), None, "overlaps the overlay"),
            ("udp://0.0.0.0:51820", Some("192.168.7.128/25"), None, "overlaps --proxy-network"),
            ("udp://0.0.0.0:51820", Some("10.127.0.0/24"), Some("vpn.example.org"), "HOST:PORT"),
        ] {
            let e = PortalConfig::parse(listen, n, endpoint, overlay, &proxied).unwrap_err().to_string();
            assert!(e.contains(needle), "{listen} {n:?} {endpoint:?}: {e}");
        }
    }
}
