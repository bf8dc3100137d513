//! UPnP-IGD through igd-next (SSDP search, then SOAP to the device's control URL):
//! the last protocol tried, for routers that speak neither PCP nor NAT-PMP.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use igd_next::aio::tokio::{Tokio, search_gateway};
use igd_next::{AddPortError, PortMappingProtocol, SearchOptions};
use tracing::debug;

use super::Failure;

/// The description the mapping carries in the router's table.
const DESCRIPTION: &str = "weft";

/// An Internet Gateway Device found on the LAN.
pub(crate) type Igd = igd_next::aio::Gateway<Tokio>;

/// Finds the IGD (searching from `local`'s address, sending to `search_to`, the SSDP
/// group outside tests, and waiting at most `search`), asks it for its external
/// address and maps its port `local.port()` (or, when that one is taken, any port) to
/// `local` for `lifetime` seconds. Returns the device, the external endpoint and the
/// lifetime granted (0 would be permanent: a router that supports only permanent
/// leases gets one, renewed and deleted all the same).
pub(crate) async fn map(
    local: SocketAddrV4,
    lifetime: u32,
    search: Duration,
    search_to: SocketAddr,
) -> Result<(Igd, SocketAddrV4, u32), Failure> {
    let options = SearchOptions {
        bind_addr: SocketAddr::new(IpAddr::V4(*local.ip()), 0),
        broadcast_address: search_to,
        timeout: Some(search),
        single_search_timeout: Some(search),
    };
    let igd = search_gateway(options).await.map_err(|e| Failure::Upnp(format!("no gateway found: {e}")))?;
    debug!(gateway = %igd.addr, "UPnP gateway found");
    let ip = match igd.get_external_ip().await.map_err(|e| Failure::Upnp(format!("external address: {e}")))? {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(_) => return Err(Failure::Unusable("IPv6 external address")),
    };
    let (port, granted) = match add(&igd, local, local.port(), lifetime).await {
        Ok(granted) => (local.port(), granted),
        Err(AddPortError::PortInUse) => {
            let port = igd
                .add_any_port(PortMappingProtocol::UDP, SocketAddr::V4(local), lifetime, DESCRIPTION)
                .await
                .map_err(|e| Failure::Upnp(format!("mapping: {e}")))?;
            (port, lifetime)
        }
        Err(e) => return Err(Failure::Upnp(format!("mapping: {e}"))),
    };
    Ok((igd, SocketAddrV4::new(ip, port), granted))
}

/// Maps the same port again (the lease starts anew). Returns the lifetime granted.
pub(crate) async fn renew(igd: &Igd, local: SocketAddrV4, external: u16, lifetime: u32) -> Result<u32, Failure> {
    add(igd, local, external, lifetime).await.map_err(|e| Failure::Upnp(format!("renewal: {e}")))
}

/// Deletes the mapping of `external`.
pub(crate) async fn delete(igd: &Igd, external: u16) -> Result<(), Failure> {
    igd.remove_port(PortMappingProtocol::UDP, external).await.map_err(|e| Failure::Upnp(format!("deletion: {e}")))
}

/// AddPortMapping, with a permanent lease for a router that takes only those.
async fn add(igd: &Igd, local: SocketAddrV4, external: u16, lifetime: u32) -> Result<u32, AddPortError> {
    let local = SocketAddr::V4(local);
    match igd.add_port(PortMappingProtocol::UDP, external, local, lifetime, DESCRIPTION).await {
        Err(AddPortError::OnlyPermanentLeasesSupported) => {
            igd.add_port(PortMappingProtocol::UDP, external, local, 0, DESCRIPTION).await.map(|()| lifetime)
        }
        r => r.map(|()| lifetime),
    }
}
