//! Routes, addresses and sysctls: the `ip` command run on a thread of its own (so a
//! slow `ip` never stalls the control loop) and the forwarding switches.

use std::net::{IpAddr, Ipv6Addr};

use anyhow::Result;
use tracing::{debug, info, warn};

use crate::host::ip::{ip, run_ip};

/// Gives the TUN its IPv6 overlay address: without SLAAC, router solicitations or a
/// link-local address (the overlay has no routers; their chatter would only be
/// dropped), and without duplicate address detection (the mesh settles ownership), so
/// the address is usable at once.
pub(crate) fn configure_ipv6(dev: &str, addr: Ipv6Addr, prefix: u8) -> Result<(), String> {
    let conf = |key: &str, value: &str| {
        let path = format!("/proc/sys/net/ipv6/conf/{dev}/{key}");
        if let Err(e) = std::fs::write(&path, value) {
            debug!(%path, error = %e, "cannot set");
        }
    };
    // A host whose new interfaces start without IPv6 (default.disable_ipv6).
    conf("disable_ipv6", "0");
    conf("accept_ra", "0");
    conf("router_solicitations", "0");
    // Through netlink, which works where /proc/sys is read-only (the systemd unit):
    // no address generation, and away with the link-local address given at creation.
    for args in
        [&["link", "set", "dev", dev, "addrgenmode", "none"][..], &["-6", "addr", "flush", "dev", dev, "scope", "link"]]
    {
        if let Err(e) = ip(args) {
            debug!(error = %e, "ip {}", args.join(" "));
        }
    }
    ip(&["-6", "addr", "add", &format!("{addr}/{prefix}"), "dev", dev, "nodad"])
}

/// Turns IPv4 forwarding on (proxied subnets and the portal need it). Under systemd
/// this file is the one tunable the unit leaves writable (ReadWritePaths=); an admin
/// who enabled forwarding already (sysctl.d) needs no write at all.
/// Turns on forwarding of one family (IPv6: `ipv6`), for proxied subnets, the
/// portal or an exit node.
pub(crate) fn enable_forwarding(ipv6: bool) -> Result<(), String> {
    let (path, family, sysctl) = if ipv6 {
        ("/proc/sys/net/ipv6/conf/all/forwarding", "IPv6", "net.ipv6.conf.all.forwarding")
    } else {
        ("/proc/sys/net/ipv4/ip_forward", "IPv4", "net.ipv4.ip_forward")
    };
    if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        info!("{family} forwarding already on");
        return Ok(());
    }
    match std::fs::write(path, "1") {
        Ok(()) => {
            info!("{family} forwarding enabled (proxied subnets, the portal or an exit node)");
            Ok(())
        }
        Err(e) => {
            let msg = format!(
                "cannot enable {family} forwarding ({path}: {e}); under systemd the unit needs ReadWritePaths={path}, or set {sysctl}=1 in sysctl.d"
            );
            warn!("{msg}; proxied subnets will not be reachable");
            Err(msg)
        }
    }
}

/// A change to the host's network configuration (`ip` commands).
pub(crate) enum NetJob {
    /// Route these subnets (other members proxy them) into the TUN, except `own`.
    Routes { wanted: Vec<(IpAddr, u8)>, own: Vec<(IpAddr, u8)> },
    /// Move the TUN's overlay address.
    Address { old: std::net::Ipv4Addr, new: std::net::Ipv4Addr, prefix: u8 },
    /// Send the default route into the TUN (true) or stop (--exit-fallback).
    ExitRoute(bool),
}

/// The thread that runs `ip` commands, in order, so that the control loop never
/// waits for a process.
pub(crate) struct NetConfig {
    /// None without a TUN: there is no kernel state to change.
    jobs: Option<std::sync::mpsc::Sender<NetJob>>,
}

impl NetConfig {
    pub(crate) fn none() -> Self {
        Self { jobs: None }
    }

    pub(crate) fn spawn(dev: String, ipv6: bool) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<NetJob>();
        std::thread::Builder::new().name("weft-netcfg".into()).spawn(move || {
            // Proxied subnets currently routed into the TUN (by us).
            let mut kernel_routes: Vec<(IpAddr, u8)> = Vec::new();
            while let Ok(job) = rx.recv() {
                match job {
                    NetJob::Routes { mut wanted, own } => {
                        // An exit's /0 is never a main-table route: policy routing
                        // (super::exit_route) carries the default route.
                        wanted.retain(|s| s.1 != 0);
                        kernel_routes = install_routes(&dev, &kernel_routes, wanted, &own)
                    }
                    NetJob::ExitRoute(true) => {
                        super::exit_route::unroute();
                        if let Err(e) = super::exit_route::route_through(&dev, ipv6) {
                            warn!(error = %e, "cannot route through the exit node");
                        }
                    }
                    NetJob::ExitRoute(false) => super::exit_route::unroute(),
                    NetJob::Address { old, new, prefix } => {
                        // Delete first: removing a primary address also removes the
                        // secondaries of its subnet (promote_secondaries is off by default).
                        run_ip(&["addr", "del", &format!("{old}/{prefix}"), "dev", &dev]);
                        run_ip(&["addr", "add", &format!("{new}/{prefix}"), "dev", &dev]);
                    }
                }
            }
        })?;
        Ok(Self { jobs: Some(jobs) })
    }

    pub(crate) fn send(&self, job: NetJob) {
        let Some(jobs) = &self.jobs else { return };
        if jobs.send(job).is_err() {
            warn!("the network configuration thread is gone; kernel routes are not updated");
        }
    }
}

/// Routes the subnets other members proxy into our TUN (and removes the ones we added
/// that are gone); returns what is routed now. Routes are added, never replaced: a
/// prefix this host already routes elsewhere keeps its route (and is logged); only
/// routes we added are ever removed.
pub(crate) fn install_routes(
    dev: &str,
    current: &[(IpAddr, u8)],
    subnets: Vec<(IpAddr, u8)>,
    own: &[(IpAddr, u8)],
) -> Vec<(IpAddr, u8)> {
    let wanted: Vec<(IpAddr, u8)> = subnets.into_iter().filter(|r| !own.contains(r)).collect();
    for (a, p) in current.iter().filter(|r| !wanted.contains(r)) {
        run_ip(&["route", "del", &format!("{a}/{p}"), "dev", dev]);
    }
    let mut installed = Vec::new();
    for (a, p) in wanted {
        let cidr = format!("{a}/{p}");
        if current.contains(&(a, p)) {
            installed.push((a, p));
            continue;
        }
        match ip(&["route", "add", &cidr, "dev", dev]) {
            Ok(()) => installed.push((a, p)),
            Err(e) if e.contains("File exists") => {
                warn!(subnet = %cidr, "not routing a member's subnet into the tunnel: this host already has a route for it");
            }
            Err(e) => warn!(subnet = %cidr, error = %e, "cannot route a member's subnet into the tunnel"),
        }
    }
    installed
}
