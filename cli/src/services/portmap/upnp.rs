//! UPnP-IGD through igd-next (SSDP search, then SOAP to the device's control URL):
//! the last protocol tried, for routers that speak neither PCP nor NAT-PMP.
//!
//! igd-next's SOAP requests have no timeout of their own, so each is given
//! `Timing::upnp_request`. UPnP has no epoch that shows a restart: a renewal asks
//! for the external address again, and a device that fails a renewal is searched
//! for again, since a restarted miniupnpd may listen on another HTTP port.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use igd_next::aio::tokio::{Tokio, search_gateway};
use igd_next::{AddAnyPortError, AddPortError, PortMappingProtocol, RemovePortError, RequestError, SearchOptions};
use tracing::debug;

use super::{Failure, Settings};

/// The description the mapping carries in the router's table.
const DESCRIPTION: &str = "weft";

/// UPnP error 725 OnlyPermanentLeasesSupported.
const ONLY_PERMANENT_LEASES: u16 = 725;

/// An Internet Gateway Device found on the LAN.
pub(crate) type Igd = igd_next::aio::Gateway<Tokio>;

/// A renewal's outcome.
pub(crate) struct Renewal {
    /// The device found by a new search, when the one that held the mapping failed
    /// the renewal; `None`: that device renewed it.
    pub(crate) found: Option<Igd>,
    /// The router's address and port forwarded to us now.
    pub(crate) external: SocketAddrV4,
    /// Seconds granted.
    pub(crate) lifetime: u32,
}

/// Finds the IGD (searching from our address, sending to `s.upnp_search_to`, the
/// SSDP group outside tests), asks it for its external address and maps its port
/// `s.internal_port` (or, when that one is taken, any port) to us for the lifetime of
/// `s.timing`. Returns the device, the external endpoint and the lifetime granted (a
/// router that supports only permanent leases gets one, renewed and deleted all the
/// same).
pub(crate) async fn map(s: &Settings) -> Result<(Igd, SocketAddrV4, u32), Failure> {
    let t = s.timing;
    let local = SocketAddrV4::new(s.local_ip, s.internal_port);
    let options = SearchOptions {
        bind_addr: SocketAddr::new(IpAddr::V4(s.local_ip), 0),
        broadcast_address: s.upnp_search_to,
        timeout: Some(t.upnp_search),
        single_search_timeout: Some(t.upnp_search),
    };
    let igd = search_gateway(options).await.map_err(|e| Failure::Upnp(format!("no gateway found: {e}")))?;
    debug!(gateway = %igd.addr, "UPnP gateway found");
    let ip = external_ip(&igd, t.upnp_request).await?;
    let mapped = within(t.upnp_request, "mapping", add(&igd, local, local.port(), t.lifetime)).await?;
    let (port, granted) = match mapped {
        Ok(granted) => (local.port(), granted),
        Err(AddPortError::PortInUse) => {
            debug!(port = local.port(), "UPnP: the port is mapped to another host; asking for any port");
            within(t.upnp_request, "mapping", add_any(&igd, local, t.lifetime))
                .await?
                .map_err(|e| Failure::Upnp(format!("mapping: {e}")))?
        }
        Err(e) => return Err(Failure::Upnp(format!("mapping: {e}"))),
    };
    Ok((igd, SocketAddrV4::new(ip, port), granted))
}

/// Renews the mapping of `external` at `igd` (its lease starts anew) and asks for
/// the external address again. When the device fails (no answer, an error, our
/// port given to another host after a restart), a new [`map`] follows it; when that
/// fails too, both are tried again after `retry_first`, doubling up to `retry_max`,
/// until `until`, when the lease ends: the last failure is returned then.
pub(crate) async fn renew(s: &Settings, igd: &Igd, external: SocketAddrV4, until: Instant) -> Result<Renewal, Failure> {
    let t = s.timing;
    let local = SocketAddrV4::new(s.local_ip, s.internal_port);
    let mut last = Failure::NoAnswer;
    let attempts = async {
        let mut wait = t.retry_first;
        loop {
            match again(igd, local, external.port(), s).await {
                Ok((ip, lifetime)) => {
                    return Renewal { found: None, external: SocketAddrV4::new(ip, external.port()), lifetime };
                }
                Err(e) => {
                    debug!(error = %e, "UPnP: the device did not renew the mapping; searching again");
                    last = e;
                }
            }
            match map(s).await {
                Ok((found, external, lifetime)) => return Renewal { found: Some(found), external, lifetime },
                Err(e) => {
                    debug!(error = %e, "UPnP: no mapping; trying again in {} ms", wait.as_millis());
                    last = e;
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(t.retry_max);
        }
    };
    match tokio::time::timeout_at(until.into(), attempts).await {
        Ok(renewal) => Ok(renewal),
        Err(_) => Err(last),
    }
}

/// Deletes the mapping of `external`. A router that no longer has it (714: it
/// restarted, or the lease ended) has done what was asked.
pub(crate) async fn delete(igd: &Igd, external: u16, limit: Duration) -> Result<(), Failure> {
    match within(limit, "deletion", igd.remove_port(PortMappingProtocol::UDP, external)).await? {
        Ok(()) | Err(RemovePortError::NoSuchPortMapping) => Ok(()),
        Err(e) => Err(Failure::Upnp(format!("deletion: {e}"))),
    }
}

/// One renewal at the device: AddPortMapping of the same port, then the external
/// address. Returns the address and the lifetime granted.
async fn again(igd: &Igd, local: SocketAddrV4, port: u16, s: &Settings) -> Result<(Ipv4Addr, u32), Failure> {
    let t = s.timing;
    let lifetime = within(t.upnp_request, "renewal", add(igd, local, port, t.lifetime))
        .await?
        .map_err(|e| Failure::Upnp(format!("renewal: {e}")))?;
    let ip = external_ip(igd, t.upnp_request).await?;
    Ok((ip, lifetime))
}

/// GetExternalIPAddress, IPv4 only.
async fn external_ip(igd: &Igd, limit: Duration) -> Result<Ipv4Addr, Failure> {
    match within(limit, "external address", igd.get_external_ip()).await? {
        Ok(IpAddr::V4(ip)) => Ok(ip),
        Ok(IpAddr::V6(_)) => Err(Failure::Unusable("IPv6 external address")),
        Err(e) => Err(Failure::Upnp(format!("external address: {e}"))),
    }
}

/// AddPortMapping, with a permanent lease for a router that takes only those.
/// Returns the lifetime the renewals are timed by.
async fn add(igd: &Igd, local: SocketAddrV4, external: u16, lifetime: u32) -> Result<u32, AddPortError> {
    let local = SocketAddr::V4(local);
    match igd.add_port(PortMappingProtocol::UDP, external, local, lifetime, DESCRIPTION).await {
        Err(AddPortError::OnlyPermanentLeasesSupported) => {
            igd.add_port(PortMappingProtocol::UDP, external, local, 0, DESCRIPTION).await.map(|()| lifetime)
        }
        r => r.map(|()| lifetime),
    }
}

/// AddAnyPortMapping (or igd-next's AddPortMapping of random ports, for a device
/// without it), with a permanent lease for a router that takes only those. Returns
/// the port and the lifetime the renewals are timed by.
async fn add_any(igd: &Igd, local: SocketAddrV4, lifetime: u32) -> Result<(u16, u32), AddAnyPortError> {
    let local = SocketAddr::V4(local);
    match igd.add_any_port(PortMappingProtocol::UDP, local, lifetime, DESCRIPTION).await {
        // igd-next names 725 for AddPortMapping, not for AddAnyPortMapping.
        Err(
            AddAnyPortError::OnlyPermanentLeasesSupported
            | AddAnyPortError::RequestError(RequestError::ErrorCode(ONLY_PERMANENT_LEASES, _)),
        ) => igd.add_any_port(PortMappingProtocol::UDP, local, 0, DESCRIPTION).await.map(|p| (p, lifetime)),
        r => r.map(|p| (p, lifetime)),
    }
}

/// `request`'s outcome, or a failure naming `what` when the device has not answered
/// within `limit`.
async fn within<T>(limit: Duration, what: &str, request: impl Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(limit, request)
        .await
        .map_err(|_| Failure::Upnp(format!("{what}: no answer within {} ms", limit.as_millis())))
}
