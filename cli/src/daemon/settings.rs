//! Values the daemon derives from its config for the engine and the services: the
//! IPv6 overlay address, the subnets announced to members, the exit offer.

use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use anyhow::Result;
use tracing::info;
use weft_peers::NodeId;

use crate::config::NodeConfig;
use crate::config::values::Ipv6Overlay;
use crate::host::interfaces::local_networks;

/// The IPv6 overlay address this node takes: `--ipv6`, or the one derived from the
/// network name and node id unless the host has no IPv6 or the MTU is below IPv6's
/// minimum (then the overlay is IPv4 only, and said so).
pub(super) fn resolve_ipv6(cfg: &NodeConfig, id: NodeId) -> Result<Option<(Ipv6Addr, u8)>> {
    let host_has_ipv6 = Path::new("/proc/sys/net/ipv6").exists();
    match cfg.ipv6 {
        Ipv6Overlay::Off => Ok(None),
        Ipv6Overlay::Given(..) if !host_has_ipv6 => Err(anyhow::anyhow!(
            "--ipv6: this host has no IPv6 (/proc/sys/net/ipv6 is missing; was the kernel booted with ipv6.disable=1?)"
        )),
        Ipv6Overlay::Given(a, p) => Ok(Some((a, p))),
        Ipv6Overlay::Derived if !host_has_ipv6 => {
            info!("this host has no IPv6: the overlay is IPv4 only");
            Ok(None)
        }
        Ipv6Overlay::Derived if cfg.mtu < 1280 => {
            info!(mtu = cfg.mtu, "MTU below IPv6's 1280: the overlay is IPv4 only");
            Ok(None)
        }
        Ipv6Overlay::Derived => Ok(Some(weft_peers::default_ipv6(&cfg.network_name, id))),
    }
}

/// What this node forwards as an exit (`--exit-node`), for its nftables rules.
pub(super) fn exit_offer(cfg: &NodeConfig, ipv6: Option<(Ipv6Addr, u8)>) -> Option<crate::services::exit::Offer> {
    cfg.exit_node.then(|| crate::services::exit::Offer {
        overlay: cfg.ipv4.network().to_string(),
        overlay6: ipv6
            .map(|(a, p)| crate::config::values::IpNet { addr: IpAddr::V6(a), prefix: p }.network().to_string()),
        served: cfg.proxy_networks.iter().map(|n| n.pair()).collect(),
        local: local_networks(&cfg.dev_name),
        allow_lan: cfg.exit_allow_lan,
    })
}

/// The subnets the engine announces as ours: the proxied ones, and 0.0.0.0/0 (and
/// ::/0 with an IPv6 overlay) when this node is an exit.
pub(super) fn engine_proxied(
    proxied: &[crate::config::values::IpNet],
    exit_node: bool,
    ipv6: bool,
) -> Vec<(IpAddr, u8)> {
    let mut v: Vec<_> = proxied.iter().map(|n| n.pair()).collect();
    if exit_node {
        v.push(weft_peers::DEFAULT_ROUTE);
        if ipv6 {
            v.push(weft_peers::DEFAULT_ROUTE6);
        }
    }
    v
}
