//! UPnP-IGD answers, as a node asking its router for a port mapping reads them: the
//! SSDP reply, the device description, the service description and the SOAP answers
//! are parsed by igd-next (a kept crate, not ours), which the node's mapper drives
//! with bytes any host on the LAN may send. The body plays the router on loopback
//! with the input's bytes and drives igd-next as the mapper does: search, external
//! address, mapping, any-port mapping, deletion.
//!
//! The input is the four answers separated by NUL bytes (SSDP reply, device
//! description, service description, SOAP answer to every action), each served raw
//! (HTTP headers included). `192.168.77.1:5000` in the SSDP reply (the recorded
//! router's address) is replaced by the fake router's. A second, well-behaved router
//! answers the search too, after the input's one, so a search whose answers do not
//! parse still ends at once on the good one, whose SOAP answers are the input's as
//! well.
//!
//! A fuzzed answer names addresses of its choosing (the description's URLs, the
//! SSDP LOCATION): the body runs in a network namespace of its own thread that
//! holds only loopback, so nothing it is told to reach leaves the machine. Creating
//! it needs root (CAP_SYS_ADMIN); without it the body panics saying so.

use std::cell::Cell;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use igd_next::PortMappingProtocol;
use igd_next::aio::tokio::search_gateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// miniupnpd 2.3.1's recorded answers (cli's port-mapping fixtures).
mod recorded {
    pub(super) const SSDP: &str = include_str!("../../cli/src/services/portmap/fixtures/upnp/ssdp-response.txt");
    pub(super) const ROOT_DESC: &str = include_str!("../../cli/src/services/portmap/fixtures/upnp/rootDesc.http");
    pub(super) const SCPD: &str = include_str!("../../cli/src/services/portmap/fixtures/upnp/WANIPCn.http");
    /// SOAP answers: (seed name, answer).
    pub(super) const SOAP: &[(&str, &str)] = &[
        ("external-ip", include_str!("../../cli/src/services/portmap/fixtures/upnp/get-external-ip.http")),
        ("add", include_str!("../../cli/src/services/portmap/fixtures/upnp/add-port-mapping.http")),
        ("add-718", include_str!("../../cli/src/services/portmap/fixtures/upnp/add-port-mapping-718.http")),
        ("add-501", include_str!("../../cli/src/services/portmap/fixtures/upnp/add-port-mapping-501.http")),
        ("add-725", include_str!("../../cli/src/services/portmap/fixtures/upnp/add-port-mapping-725-handmade.http")),
        ("add-any", include_str!("../../cli/src/services/portmap/fixtures/upnp/add-any-port-mapping.http")),
        ("delete", include_str!("../../cli/src/services/portmap/fixtures/upnp/delete-port-mapping.http")),
        ("entry-714", include_str!("../../cli/src/services/portmap/fixtures/upnp/get-specific-entry-714.http")),
    ];
    /// The recorded router's HTTP address, in `SSDP`.
    pub(super) const LOCATION: &str = "192.168.77.1:5000";
}

/// Every request the client makes waits at most this long (the fake answers at once;
/// a hang would be igd-next's, bounded here as the mapper bounds it).
const LIMIT: Duration = Duration::from_secs(2);

/// The body of the `upnp_gateway` target.
pub fn upnp_gateway(data: &[u8]) {
    exchange(data);
}

/// Plays the router with `data`'s four answers and drives the client; how far it got.
fn exchange(data: &[u8]) -> Option<Reached> {
    own_network();
    let mut parts = data.splitn(4, |b| *b == 0).map(<[u8]>::to_vec);
    let mut next = || parts.next().unwrap_or_default();
    let (ssdp, desc, scpd, soap) = (next(), next(), next(), next());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(drive(ssdp, desc, scpd, soap))
}

/// How far the client got: the gateway it found (the input's or the good one), and
/// the external address it was told.
#[derive(Debug, PartialEq, Eq)]
struct Reached {
    /// The input's router was the one found.
    fuzzed_gateway: bool,
    /// GetExternalIPAddress's answer, if it parsed.
    external: Option<std::net::IpAddr>,
}

/// Seeds: the recorded answers, one per SOAP answer.
pub(crate) fn seeds() -> Vec<(String, Vec<u8>)> {
    recorded::SOAP
        .iter()
        .map(|(name, soap)| {
            let parts = [recorded::SSDP, recorded::ROOT_DESC, recorded::SCPD, soap];
            (format!("seed-miniupnpd-{name}"), parts.join("\0").into_bytes())
        })
        .collect()
}

thread_local! {
    /// Whether this thread is in its own network namespace yet.
    static OWN_NETWORK: Cell<bool> = const { Cell::new(false) };
}

/// Moves this thread into a network namespace of its own with loopback up (once per
/// thread; a process it starts, such as `ip`, starts in it too).
fn own_network() {
    if OWN_NETWORK.get() {
        return;
    }
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        panic!("upnp_gateway: cannot make a network namespace to hold the fake router ({e}): run as root");
    }
    let up = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status();
    assert!(up.as_ref().is_ok_and(|s| s.success()), "upnp_gateway: `ip link set lo up` in its namespace: {up:?}");
    OWN_NETWORK.set(true);
}

/// One HTTP server: answers each connection's request with `get(n)` for its `n`th GET
/// and `post` for any POST, then closes.
async fn http(listener: TcpListener, get: Vec<Vec<u8>>, post: Vec<u8>) {
    let mut gets = 0usize;
    loop {
        let Ok((mut s, _)) = listener.accept().await else { return };
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        // The request's head (and for a POST some of its body); the answer does not
        // depend on the rest.
        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 65536 {
            match tokio::time::timeout(LIMIT, s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => req.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let answer = if req.starts_with(b"POST") {
            &post
        } else {
            gets += 1;
            get.get(gets - 1).or_else(|| get.last()).unwrap_or(&post)
        };
        let _ = s.write_all(answer).await;
        let _ = s.shutdown().await;
    }
}

async fn drive(ssdp: Vec<u8>, desc: Vec<u8>, scpd: Vec<u8>, soap: Vec<u8>) -> Option<Reached> {
    let lo = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let fuzzed = TcpListener::bind(lo(0)).await.unwrap();
    let good = TcpListener::bind(lo(0)).await.unwrap();
    let (fuzzed_at, good_at) = (fuzzed.local_addr().unwrap(), good.local_addr().unwrap());
    let servers = [
        tokio::spawn(http(fuzzed, vec![desc, scpd], soap.clone())),
        tokio::spawn(http(
            good,
            vec![recorded::ROOT_DESC.as_bytes().to_vec(), recorded::SCPD.as_bytes().to_vec()],
            soap,
        )),
    ];
    // SSDP: the input's reply, then a good one.
    let responder = UdpSocket::bind(lo(0)).await.unwrap();
    let ssdp_at = responder.local_addr().unwrap();
    let replies = [
        replace(&ssdp, recorded::LOCATION.as_bytes(), fuzzed_at.to_string().as_bytes()),
        recorded::SSDP.replace(recorded::LOCATION, &good_at.to_string()).into_bytes(),
    ];
    let ssdp_task = tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        if let Ok((_, from)) = responder.recv_from(&mut buf).await {
            for r in replies {
                let _ = responder.send_to(&r, from).await;
            }
        }
    });
    let options = igd_next::SearchOptions {
        bind_addr: lo(0),
        broadcast_address: ssdp_at,
        timeout: Some(LIMIT),
        single_search_timeout: Some(LIMIT),
    };
    let found = search_gateway(options).await;
    let mut reached = None;
    if let Ok(igd) = found {
        let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 11010).into();
        let external = tokio::time::timeout(LIMIT, igd.get_external_ip()).await.ok().and_then(Result::ok);
        reached = Some(Reached { fuzzed_gateway: igd.addr == fuzzed_at, external });
        let _ = tokio::time::timeout(LIMIT, igd.add_port(PortMappingProtocol::UDP, 11010, local, 120, "weft")).await;
        let _ = tokio::time::timeout(LIMIT, igd.add_any_port(PortMappingProtocol::UDP, local, 120, "weft")).await;
        let _ = tokio::time::timeout(LIMIT, igd.remove_port(PortMappingProtocol::UDP, 11010)).await;
    }
    ssdp_task.abort();
    for s in servers {
        s.abort();
    }
    reached
}

/// `data` with every `from` replaced by `to`.
fn replace(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_answers_reach_the_soap_actions_on_the_inputs_router() {
        let (_, seed) = seeds().into_iter().find(|s| s.0.ends_with("external-ip")).unwrap();
        let got = exchange(&seed);
        assert_eq!(got, Some(Reached { fuzzed_gateway: true, external: Some([100, 200, 0, 1].into()) }));
    }

    #[test]
    fn answers_that_do_not_parse_end_on_the_good_router_at_once() {
        let got = exchange(b"HTTP/1.1 200 OK\r\nLOCATION: nowhere\r\n\0<root/>\0\0garbage");
        // The good router was found (the search did not time out on the input's).
        assert_eq!(got, Some(Reached { fuzzed_gateway: false, external: None }));
    }
}
