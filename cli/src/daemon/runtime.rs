//! The runtime loop: one tokio task that owns the engine, feeds it the pipelines'
//! events, timers and control requests, and carries out its actions.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use weft_control::Reply;
use weft_core::stats::{DropCounters, DropReason};
use weft_datapath::pipeline::{ControlEvent, ControlSink, PipelineStats, Shared};
use weft_datapath::transport::conn::{ConnectionDown, Connector};
use weft_datapath::transport::udp::{self};
use weft_datapath::transport::{Endpoint, Proto};
use weft_peers::NodeId;
use weft_peers::node::{Action, Input, Node};

use super::requests::{Ask, Asker, PortalAsk, load_again};
use crate::config::NodeConfig;
use crate::config::args::UpArgs;
use crate::config::values::PeerUri;
use crate::control::server::{Admins, Requests, accept_loop, bind_control};
use crate::daemon::state;
use crate::host::interfaces::{local_endpoints, local_ipv4s, local_networks};
use crate::host::net::{NetConfig, NetJob};
use crate::services::discovery::{Beacon, Discovery};
use crate::services::metrics::server as metrics;

pub(super) struct QueueSink {
    pub(super) events: mpsc::Sender<ControlEvent>,
    pub(super) handshakes: mpsc::Sender<ControlEvent>,
    /// Set when a handshake did not fit: the engine treats the next second as load.
    pub(super) overloaded: AtomicBool,
}

impl ControlSink for QueueSink {
    fn try_push(&self, ev: ControlEvent) -> bool {
        match ev {
            ControlEvent::Datagram { .. } => {
                let ok = self.handshakes.try_send(ev).is_ok();
                if !ok {
                    self.overloaded.store(true, Ordering::Relaxed);
                }
                ok
            }
            _ => self.events.try_send(ev).is_ok(),
        }
    }
}

pub(super) struct Runtime {
    pub(super) cfg: NodeConfig,
    /// The IPv6 overlay address in use (`cfg.ipv6` resolved at start).
    pub(super) ipv6: Option<(Ipv6Addr, u8)>,
    pub(super) engine: Node,
    pub(super) shared: Shared,
    /// The pipelines' UDP sockets; `sender` is the first.
    pub(super) sender: Arc<UdpSocket>,
    pub(super) udp_socks: Vec<Arc<UdpSocket>>,
    /// Whether each pipeline reads with UDP GRO (its receive slots are sized for it).
    pub(super) udp_gro: Vec<bool>,
    pub(super) started: Instant,
    /// A queue of the TUN when it was opened with offloads (which the engine may
    /// have turned off since: `NodeStatus::tun_offload_off` says why).
    pub(super) tun_queue: Option<Arc<weft_datapath::pipeline::Device>>,
    pub(super) pipelines: Vec<Arc<PipelineStats>>,
    /// Drops of the control plane's own sends.
    pub(super) drops: DropCounters,
    /// Kernel routes and addresses, changed on a thread of their own.
    pub(super) netcfg: NetConfig,
    /// Keeps the engine's name bindings and exit pin in the state directory.
    pub(super) state_writer: state::StateWriter,
    /// The last "certificate expires in" warning given (its threshold, seconds).
    pub(super) expiry_warned: Option<u64>,
    /// The access policy in force and the members it was compiled against.
    pub(super) policy: crate::services::policy::Enforced,
    /// TCP, WebSocket and QUIC connections.
    pub(super) connector: Connector,
    /// Counters of the threads that open what connections receive.
    pub(super) links_stats: Vec<Arc<PipelineStats>>,
    /// Bound listeners.
    pub(super) listeners: Vec<Endpoint>,
    /// Port of the UDP sockets (announced in LAN beacons).
    pub(super) udp_port: u16,
    /// MAC key of LAN beacons (from the PSK).
    pub(super) beacon_key: ring::hmac::Key,
    /// LAN beacons dropped, with `--lan-discovery`.
    pub(super) beacon_drops: Option<Arc<crate::services::discovery::Drops>>,
    /// The WireGuard portal (`--wg-portal`).
    pub(super) portal: Option<crate::services::portal::Portal>,
    /// The subnets other members proxy (routed into the TUN).
    pub(super) member_subnets: Vec<(IpAddr, u8)>,
    /// The peers of the config (file or flags), as resolved: a reload dials the new
    /// ones and stops dialling the ones gone.
    pub(super) dialled: Vec<(PeerUri, Endpoint)>,
    /// The `weft up` arguments, for reloads.
    pub(super) args: Arc<UpArgs>,
    /// A flag or RUST_LOG set the log level: reloads leave it.
    pub(super) log_level_pinned: bool,
    /// The control plane's own traffic.
    pub(super) control_traffic: weft_control::ControlTrafficJson,
    /// Magic DNS, when on and bound.
    pub(super) dns: Option<crate::services::dns::Server>,
    /// Whether the exit node's /0 is routed now (`--use-exit-node`).
    pub(super) exit_routed: bool,
    /// Whether the warning that `--use-exit-node` names nobody was given.
    pub(super) exit_name_warned: bool,
    /// The userspace stack and its services (`--no-tun`).
    pub(super) userspace: Option<crate::notun::Userspace>,
    /// Port mapping on the router (not with `--no-port-mapping`).
    pub(super) portmap: Option<crate::services::portmap::Service>,
    /// Where the port mapper publishes its state (the runtime watches it).
    pub(super) portmap_state: crate::services::portmap::Publisher,
    /// The mapped endpoint announced in our record.
    pub(super) mapped: Option<SocketAddr>,
}

pub(crate) fn no_portal() -> Reply {
    Reply::Error {
        message: "this node runs no WireGuard portal (start it with --wg-portal udp://ADDR:PORT --wg-portal-net CIDR)"
            .into(),
    }
}

impl Runtime {
    /// The networks of the mesh: the overlay, our proxied subnets (the portal
    /// network among them) and the other members'.
    pub(super) fn mesh_networks(&self) -> Vec<(IpAddr, u8)> {
        let mut v = vec![crate::config::values::IpNet::from(self.cfg.ipv4.network()).pair()];
        if let Some((a, p)) = self.ipv6 {
            v.push(crate::config::values::IpNet { addr: IpAddr::V6(a), prefix: p }.network().pair());
        }
        v.extend(self.cfg.proxy_networks.iter().map(|n| n.pair()));
        // Not an exit's /0: the portal is no way to the internet.
        v.extend(self.member_subnets.iter().copied().filter(|s| s.1 != 0));
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The IPv4 networks of the mesh (the WireGuard portal carries IPv4 only).
    pub(super) fn mesh_networks_v4(&self) -> Vec<(std::net::Ipv4Addr, u8)> {
        self.mesh_networks()
            .into_iter()
            .filter_map(|(a, p)| match a {
                IpAddr::V4(a) => Some((a, p)),
                IpAddr::V6(_) => None,
            })
            .collect()
    }

    /// Starts LAN discovery on this host's interfaces.
    pub(super) fn discovery(&mut self) -> Result<Discovery> {
        let ifs = local_ipv4s(self.cfg.ipv4.addr, self.portal_dev().as_deref());
        info!(interfaces = ifs.len(), "LAN discovery on");
        let d = Discovery::new(
            ifs,
            Beacon::network_hash(&self.cfg.network_name),
            self.engine.id().to_bytes(),
            self.udp_port,
            self.beacon_key.clone(),
        )?;
        self.beacon_drops = Some(d.drops.clone());
        Ok(d)
    }

    /// Moves every pipeline's UDP socket to `addr` (an ephemeral port when `None`):
    /// binds the new sockets first, so a port in use changes nothing, then swaps each
    /// descriptor in place. Returns the new local address.
    pub(super) fn rebind_udp(&mut self, addr: Option<SocketAddr>) -> Result<SocketAddr> {
        let bind = addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let socks = udp::bind_reuseport(bind, self.udp_socks.len(), Duration::from_millis(500))
            .with_context(|| format!("cannot bind udp://{bind}"))?;
        let local = socks[0].local_addr().context("UDP socket has no address")?;
        // GRO only where the pipeline's receive slots hold coalesced bursts: a socket
        // with GRO under a pipeline without would truncate them.
        let refused = self.udp_gro.iter().zip(&socks).filter(|(gro, s)| **gro && !udp::enable_gro(s)).count();
        if refused > 0 {
            warn!(
                sockets = refused,
                "UDP GRO refused on the new sockets; received bursts arrive one datagram at a time"
            );
        }
        for (old, new) in self.udp_socks.iter().zip(&socks) {
            udp::replace(old, new).context("cannot move the UDP socket")?;
        }
        info!(from = self.udp_port, to = local.port(), "UDP sockets moved");
        self.udp_port = local.port();
        Ok(local)
    }

    /// The Magic DNS zone of the mesh as this node knows it: itself and every member
    /// whose record it holds.
    pub(super) fn dns_zone(&self, domain: &str) -> crate::services::dns::Zone {
        let me = self.engine.id();
        let others = self.engine.topology().records().filter(|r| r.node() != me);
        let names = self.engine.names();
        crate::services::dns::Zone::new(
            domain,
            std::iter::once((me, self.cfg.hostname.as_str(), self.cfg.ipv4.addr, self.ipv6.map(|(a, _)| a)))
                .chain(others.map(|r| (r.node(), r.hostname.as_str(), r.overlay, r.overlay6))),
            |host| names.holder(host),
        )
        .for_clients(self.mesh_networks())
    }

    /// Starts Magic DNS on the overlay address (when on), and registers it with
    /// systemd-resolved (with `--accept-dns`). A port already taken turns it off with a
    /// warning: the mesh works without it.
    /// A failure is retried every second by [`Self::refresh_dns`] (warned of when `loud`).
    pub(super) fn start_dns(&mut self, loud: bool) {
        self.dns = None;
        // Without a TUN the overlay addresses are not the kernel's to bind.
        if self.userspace.is_some() {
            return;
        }
        let Some(domain) = self.cfg.dns_domain.clone() else { return };
        let zone = Arc::new(ArcSwap::from_pointee(self.dns_zone(&domain)));
        let addrs = self.dns_addrs();
        match crate::services::dns::Server::start(&addrs, zone) {
            Ok(s) => {
                info!(addrs = ?addrs, %domain, "Magic DNS on");
                self.dns = Some(s);
                self.register_dns();
            }
            Err(e) if loud => warn!(error = %e, "Magic DNS off: cannot bind its socket (retrying every second)"),
            Err(e) => debug!(error = %e, "Magic DNS: bind failed again"),
        }
    }

    /// Where Magic DNS listens: the overlay addresses, port 53.
    pub(super) fn dns_addrs(&self) -> Vec<SocketAddr> {
        std::iter::once(IpAddr::V4(self.cfg.ipv4.addr))
            .chain(self.ipv6.map(|(a, _)| IpAddr::V6(a)))
            .map(|ip| SocketAddr::new(ip, 53))
            .collect()
    }

    /// With `--accept-dns`, points systemd-resolved at the running server.
    pub(super) fn register_dns(&self) {
        if let (true, Some(domain)) = (self.cfg.accept_dns && self.dns.is_some(), self.cfg.dns_domain.clone()) {
            let dev = self.cfg.dev_name.clone();
            let ips: Vec<IpAddr> = self.dns_addrs().iter().map(SocketAddr::ip).collect();
            tokio::task::spawn_blocking(move || {
                if crate::services::dns::register(&dev, &ips, &domain) {
                    info!(%domain, "Magic DNS registered with systemd-resolved");
                }
            });
        }
    }

    /// Follows members coming, going and renaming, and our own address moving; starts
    /// the server again when its bind failed (the port was busy, the address not yet
    /// on the device).
    /// Gives the userspace services the mesh's current names and networks.
    pub(super) fn refresh_userspace(&self) {
        let Some(u) = &self.userspace else { return };
        let domain = self
            .cfg
            .dns_domain
            .clone()
            .unwrap_or_else(|| crate::config::domain::default_domain(&self.cfg.network_name));
        u.destinations().names.store(Arc::new(self.dns_zone(&domain)));
        u.destinations().nets.store(Arc::new(self.mesh_networks()));
    }

    pub(super) fn refresh_dns(&mut self) {
        if self.userspace.is_some() {
            return;
        }
        let Some(domain) = self.cfg.dns_domain.clone() else { return };
        let Some(d) = &self.dns else {
            self.start_dns(false);
            return;
        };
        if d.addrs != self.dns_addrs() {
            self.start_dns(true);
            return;
        }
        if d.update(self.dns_zone(&domain)) {
            debug!("Magic DNS zone changed");
        }
    }

    /// Says once, when this node has been in the mesh a while, that `--use-exit-node`
    /// names no member at all (a typo is otherwise only visible in status), with the
    /// members that do offer an exit.
    pub(super) fn check_exit_name(&mut self) {
        if self.exit_name_warned || self.started.elapsed() < Duration::from_secs(15) {
            return;
        }
        let st = self.engine.status(Instant::now());
        let Some(e) = &st.exit else { return };
        let in_mesh = st.peers.iter().any(|p| p.state == weft_peers::status::PeerState::Established);
        if e.node.is_some() || e.known || !in_mesh {
            return;
        }
        self.exit_name_warned = true;
        let offers: Vec<String> = st.exit_offers.iter().map(|(id, h)| format!("{h} ({id})")).collect();
        warn!(
            wanted = %e.wanted,
            "--use-exit-node names no member of the mesh; members offering an exit: [{}]",
            offers.join(", ")
        );
    }

    /// The exit node's /0 came or went: say so, and with --exit-fallback add or remove
    /// the policy routing that sends the default route into the TUN.
    pub(super) fn follow_exit(&mut self, routed: bool) {
        if self.cfg.use_exit.is_none() || routed == self.exit_routed {
            return;
        }
        self.exit_routed = routed;
        let fallback = self.cfg.exit_fallback;
        match (routed, fallback) {
            (true, _) => info!("exit node reachable: the default route goes through it"),
            (false, false) => warn!("exit node unreachable: traffic for the internet is dropped until it is back"),
            (false, true) => warn!(
                "exit node unreachable: traffic for the internet leaves by this host's own route (--exit-fallback)"
            ),
        }
        if fallback {
            self.netcfg.send(NetJob::ExitRoute(routed));
        }
    }

    /// The WireGuard portal's TUN device, when there is one.
    pub(super) fn portal_dev(&self) -> Option<String> {
        self.cfg.wg_portal.as_ref().map(|_| crate::services::portal::device_name(&self.cfg.dev_name))
    }

    /// Tells the portal where its clients may send.
    pub(super) fn update_portal(&self) {
        if let Some(p) = &self.portal {
            p.set_destinations(self.mesh_networks_v4());
        }
    }

    pub(super) fn handle_event(&mut self, ev: ControlEvent) {
        let now = Instant::now();
        let len = match &ev {
            ControlEvent::Datagram { bytes, .. } | ControlEvent::Message { bytes, .. } => Some(bytes.len()),
            _ => None,
        };
        if let Some(n) = len {
            self.control_traffic.received_packets += 1;
            self.control_traffic.received_bytes += n as u64;
        }
        match ev {
            ControlEvent::Datagram { from, via, bytes } => {
                let via = via.map(NodeId::from_bytes);
                self.engine.handle(now, Input::Datagram { from, via, bytes: &bytes })
            }
            ControlEvent::Confirmed { local_index } => self.engine.handle(now, Input::Confirmed { local_index }),
            ControlEvent::Message { local_index, bytes } => {
                self.engine.handle(now, Input::Message { local_index, bytes: &bytes })
            }
            ControlEvent::Direct { local_index, from } => self.engine.handle(now, Input::Direct { local_index, from }),
            ControlEvent::Unrouted { dst, packet } => self.engine.handle(now, Input::Unrouted { dst, packet: &packet }),
            ControlEvent::StaleSession { local_index } => self.engine.handle(now, Input::StaleSession { local_index }),
            ControlEvent::BadChecksum { local_index } => self.engine.handle(now, Input::BadChecksum { local_index }),
        }
    }

    pub(super) async fn serve(
        mut self,
        mut events: mpsc::Receiver<ControlEvent>,
        mut handshakes: mpsc::Receiver<ControlEvent>,
        sink: Arc<QueueSink>,
        mut connection_down: mpsc::Receiver<ConnectionDown>,
        metrics: Option<std::net::TcpListener>,
    ) -> Result<()> {
        let (req_tx, mut requests) = mpsc::channel::<(Ask, oneshot::Sender<Reply>)>(16);
        let accept = self.serve_control(&req_tx)?;
        let metrics = metrics.map(tokio::net::TcpListener::from_std).transpose()?;
        let mut metrics = metrics.map(|l| spawn_metrics(l, &req_tx));
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        let mut discovery = self.begin()?;
        let mut dns_timer = tokio::time::interval(Duration::from_secs(1));
        let mut beacon_timer = tokio::time::interval(Duration::from_secs(5));
        // Interfaces come and go: members' subnets are checked against the networks
        // this host is connected to now.
        let mut nets_timer = tokio::time::interval(Duration::from_secs(10));
        // `--proxy-health`: the subnets are withdrawn while the check fails.
        let mut health = match self.cfg.proxy_health {
            Some(t) => {
                info!(target = %t, "health check of the proxied subnets on");
                Some(crate::services::health::spawn(t)?)
            }
            None => None,
        };
        let mut port_mapping = self.portmap_state.subscribe();
        loop {
            // The engine's next deadline; with none, it waits for an input.
            let deadline = self.engine.poll_timeout().unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            // Every source gets its turn (tokio picks among the ready branches at
            // random): a flood of authenticated events from a member (each of its
            // control messages is one) must not starve the timers — keepalives,
            // rekeys, handshake retries — nor admin requests and handshakes, as a
            // flood of handshakes must not starve the rest. A member's control
            // messages are also rate-limited in the engine.
            tokio::select! {
                ev = events.recv() => {
                    let Some(ev) = ev else { break };
                    self.handle_event(ev);
                }
                () = tokio::time::sleep_until(deadline.into()) => self.engine.handle_timeout(Instant::now()),
                down = connection_down.recv() => {
                    if let Some(d) = down {
                        self.engine.handle(Instant::now(), Input::ConnectionDown { endpoint: d.endpoint, error: &d.error });
                    }
                }
                req = requests.recv() => {
                    if let Some((req, reply)) = req {
                        self.answer(req, reply, &mut discovery, &mut metrics, &req_tx).await;
                    }
                }
                _ = sighup.recv() => {
                    info!("SIGHUP: reloading the config");
                    tokio::spawn(reload_from_file(self.args.clone(), req_tx.clone()));
                }
                endpoint = async {
                    match &discovery {
                        Some(d) => d.next_peer().await,
                        None => std::future::pending().await,
                    }
                } => self.engine.handle(Instant::now(), Input::Discovered { endpoint: Endpoint::udp(endpoint) }),
                _ = beacon_timer.tick(), if discovery.is_some() => {
                    if let Some(d) = &discovery {
                        d.announce().await;
                    }
                }
                _ = nets_timer.tick() => self.every_ten_seconds(),
                changed = async {
                    match &mut health {
                        Some(h) => h.changed().await.map(|()| h.borrow_and_update().clone()),
                        None => std::future::pending().await,
                    }
                } => match changed {
                    Ok(why) => self.engine.set_withdrawn(Instant::now(), why),
                    Err(_) => {
                        warn!("the health check stopped: proxied subnets stay as they are");
                        health = None;
                    }
                },
                _ = port_mapping.changed() => self.port_mapping_changed(),
                _ = dns_timer.tick() => {
                    self.refresh_policy();
                    self.refresh_userspace();
                    self.refresh_dns();
                }
                _ = tokio::signal::ctrl_c() => { info!("interrupted; shutting down"); break }
                _ = sigterm.recv() => { info!("terminated; shutting down"); break }
                // Handshake datagrams (even replayed ones pass mac1) are one source
                // among the others, never ahead of them.
                ev = handshakes.recv() => {
                    let Some(ev) = ev else { break };
                    if sink.overloaded.swap(false, Ordering::Relaxed) {
                        self.engine.note_overload(Instant::now());
                    }
                    self.handle_event(ev);
                }
            }
            self.drain();
        }
        accept.abort();
        if let Some(m) = metrics {
            m.abort();
        }
        // Goodbye to the members we have sessions with, then a moment for the
        // connection writers to send it (none when nobody was told).
        if self.engine.leave(Instant::now()) > 0 {
            self.drain();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.shut_down().await;
        Ok(())
    }

    /// What runs once before the loop: the engine's first step, LAN discovery (when
    /// on), Magic DNS and the userspace stack.
    fn begin(&mut self) -> Result<Option<Discovery>> {
        self.engine.handle_timeout(Instant::now());
        self.drain();
        let discovery = if self.cfg.lan_discovery { Some(self.discovery()?) } else { None };
        self.start_dns(true);
        self.start_port_mapping();
        if let Some(u) = &mut self.userspace {
            u.start()?;
        }
        self.refresh_userspace();
        Ok(discovery)
    }

    /// The slow checks: the host's networks, the exit's name, this node's certificate,
    /// members' certificates and the firewall's idle flows.
    fn every_ten_seconds(&mut self) {
        self.engine.set_local_networks(local_networks(&self.cfg.dev_name));
        self.check_exit_name();
        self.check_certificate_expiry();
        self.engine.expire_members(Instant::now());
        self.shared.firewall.expire(clock_ms(self.shared.epoch));
        if let Some(p) = &mut self.portmap {
            p.refresh();
        }
    }

    /// The UDP listener's address, if this node has one (port mapping maps its port).
    pub(super) fn udp_listener(&self) -> Option<SocketAddr> {
        self.listeners.iter().find(|l| l.proto == Proto::Udp).map(|l| l.addr)
    }

    /// Starts port mapping, when on and the node listens on UDP.
    pub(super) fn start_port_mapping(&mut self) {
        if self.cfg.port_mapping
            && self.portmap.is_none()
            && let Some(listen) = self.udp_listener()
        {
            self.portmap = Some(crate::services::portmap::Service::start(self.portmap_state.clone(), listen));
        }
    }

    /// The port mapper's state changed: a new, moved or lost mapped endpoint is
    /// announced in our record (renewals that change nothing are not).
    pub(super) fn port_mapping_changed(&mut self) {
        let mapped = self.portmap_state.borrow().advertised();
        if mapped != self.mapped {
            info!(endpoint = ?mapped, "mapped endpoint announced to members");
            self.mapped = mapped;
            self.announce_endpoints();
        }
    }

    /// Puts the endpoints members may reach us at in our record: the mapped one
    /// first (records carry at most 32), then the listeners' addresses.
    pub(super) fn announce_endpoints(&mut self) {
        let mut eps: Vec<Endpoint> = self.mapped.map(Endpoint::udp).into_iter().collect();
        for e in local_endpoints(&self.listeners, self.cfg.ipv4.addr, &self.cfg.dev_name, self.portal_dev().as_deref())
        {
            if !eps.contains(&e) {
                eps.push(e);
            }
        }
        self.engine.set_endpoints(eps);
    }

    /// Binds the control socket and serves it on a task of its own.
    fn serve_control(&self, req_tx: &Requests<Ask>) -> Result<tokio::task::JoinHandle<()>> {
        let listener = bind_control(&self.cfg.control)?;
        let admins = Admins {
            group: self.cfg.admin_group.clone(),
            gid: crate::control::access::group_id(&self.cfg.admin_group),
        };
        if admins.gid.is_none() {
            info!(group = %admins.group, "admin group not found in /etc/group: only root may change the node");
        }
        Ok(tokio::spawn(accept_loop(listener, req_tx.clone(), admins, Asker { args: self.args.clone() })))
    }

    /// Stops the pipelines, deletes the port mapping, gives back the DNS registration
    /// and removes the socket.
    async fn shut_down(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // The router forgets our mapping now, not when its lease ends.
        if let Some(p) = self.portmap.take() {
            p.shut_down().await;
        }
        if self.dns.take().is_some() && self.cfg.accept_dns {
            let dev = self.cfg.dev_name.clone();
            let _ = tokio::task::spawn_blocking(move || crate::services::dns::unregister(&dev)).await;
        }
        let _ = std::fs::remove_file(&self.cfg.control);
    }

    pub(super) fn drain(&mut self) {
        while let Some(action) = self.engine.poll_action() {
            if let Action::Send { bytes, .. } = &action {
                self.control_traffic.sent_packets += 1;
                self.control_traffic.sent_bytes += bytes.len() as u64;
            }
            match action {
                Action::PublishRoutes(snap) => {
                    debug!(routes = snap.route_count(), "publishing routes");
                    self.shared.routes.store(snap);
                    // Names follow the routes at once: a SOCKS5 client may ask for a
                    // member the moment it can be reached.
                    self.refresh_userspace();
                }
                Action::InstallRoutes(subnets) => {
                    self.follow_exit(subnets.contains(&weft_peers::DEFAULT_ROUTE));
                    self.member_subnets.clone_from(&subnets);
                    self.update_portal();
                    let own = self.cfg.proxy_networks.iter().map(|n| n.pair()).collect();
                    self.netcfg.send(NetJob::Routes { wanted: subnets, own });
                }
                Action::SetAddress { old, new, prefix } => {
                    self.netcfg.send(NetJob::Address { old, new, prefix });
                    self.cfg.ipv4.addr = new;
                    if let Some(u) = &self.userspace {
                        let mut addrs = vec![(IpAddr::V4(new), prefix)];
                        addrs.extend(self.ipv6.map(|(a, p)| (IpAddr::V6(a), p)));
                        u.stack.set_addresses(&addrs);
                    }
                    info!(%new, "overlay address changed");
                }
                // (A UDP endpoint reached from a socket of its own goes below.)
                Action::Send { to, bytes } if to.proto == Proto::Udp && !self.connector.conns().contains(&to) => {
                    // The pipelines' socket is blocking; this send is not (MSG_DONTWAIT):
                    // the control loop never waits behind the data plane.
                    let sock = socket2::SockRef::from(&*self.sender);
                    match sock.send_to_with_flags(&bytes, &to.addr.into(), libc::MSG_DONTWAIT) {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.drops.add(DropReason::ControlSendBlocked, 1);
                        }
                        Err(e) => {
                            debug!(%to, error = %e, "control send failed");
                            self.drops.add(DropReason::UdpSend, 1);
                        }
                    }
                }
                Action::Send { to, bytes } => {
                    if !self.connector.send(to, &bytes) {
                        self.drops.add(DropReason::ControlSendBlocked, 1);
                    }
                }
                Action::OpenMappings { to, datagrams, hold, burst, every } => {
                    debug!(%to, sockets = datagrams.len(), "opening mappings for a peer's probes");
                    let pace = weft_datapath::transport::Pace { burst, every };
                    tokio::spawn(self.connector.clone().open_mappings(to, datagrams, pace, hold));
                }
                Action::SendBatch { to, datagrams } if self.connector.conns().contains(&to) => {
                    for d in datagrams {
                        if !self.connector.send(to, &d) {
                            self.drops.add(DropReason::ControlSendBlocked, 1);
                        }
                    }
                }
                Action::SendBatch { to, datagrams } => {
                    let out: Vec<weft_datapath::transport::Outgoing> = datagrams
                        .iter()
                        .enumerate()
                        .map(|(buf, d)| weft_datapath::transport::Outgoing {
                            buf,
                            start: 0,
                            len: d.len(),
                            to,
                            lane: weft_datapath::transport::Lane::Bulk,
                            single: false,
                        })
                        .collect();
                    let failed = udp::send_batch(&self.sender, &datagrams, &out, &self.shared.offload);
                    self.drops.add(DropReason::UdpSend, failed as u64);
                }
                Action::SaveNames(names) => self.state_writer.save(names),
                Action::SaveRevocations(list) => self.state_writer.save_revocations(list),
                Action::SaveIssued(list) => self.state_writer.save_issued(list),
                Action::SaveCertificates(list) => self.state_writer.save_certificates(list),
                Action::PolicyChanged(bytes) => self.signed_policy(&bytes),
                // Sent once by the engine: the device's offload mask is cleared and
                // coalesced writes stop.
                Action::TunOffloadOff { why } => {
                    if let Some(weft_datapath::pipeline::Device::Tun(q)) = self.tun_queue.as_deref() {
                        self.shared.offload.disable_tun_gro();
                        match weft_datapath::tun::disable_offload(q) {
                            Ok(()) => warn!("TUN offload turned off: {why}"),
                            Err(e) => {
                                warn!(error = %e, "TUN offload could not be turned off ({why}); coalesced writes are")
                            }
                        }
                    }
                }
                Action::PolicyRefused(why) => {
                    warn!("{why}: every flow but this node's own is denied");
                    self.policy.fail_closed(&self.shared.firewall, why);
                }
            }
        }
    }

    /// Answers a client: portal changes on a blocking thread (which replies), everything
    /// else here.
    pub(super) async fn answer(
        &mut self,
        ask: Ask,
        reply: oneshot::Sender<Reply>,
        discovery: &mut Option<Discovery>,
        metrics: &mut Option<tokio::task::JoinHandle<()>>,
        req_tx: &Requests<Ask>,
    ) {
        let now = Instant::now();
        let done = match ask {
            Ask::Portal(p) => return self.portal_request(p, reply),
            Ask::Reload(new) => {
                let _ = reply.send(self.reload(*new, discovery, metrics, req_tx).await);
                return;
            }
            Ask::Status => {
                let _ = reply.send(Reply::Status(Box::new(self.status())));
                return;
            }
            Ask::AddPeer(to, u) => {
                self.connector.set_path(to, u.path.clone());
                self.engine.add_peer(now, to).map(|()| format!("added {u}"))
            }
            Ask::RemovePeer(which) => self.engine.remove_peer(now, which),
            Ask::AcceptExit => self.engine.accept_exit(now),
            Ask::PushPolicy(bytes) => self.push_policy(now, bytes),
            Ask::Explain { from, to, proto } => self.policy.explain(&from, &to, &proto, &self.overlay_networks()),
            Ask::Revoke(r) => {
                let node = NodeId::from_public(&r.node);
                self.engine.revoke(now, *r).map(|new| {
                    if new {
                        format!("revoked {node}: its sessions are closed and the mesh is told")
                    } else {
                        format!("{node} was revoked already")
                    }
                })
            }
        };
        let _ = reply.send(match done {
            Ok(message) => Reply::Done { message },
            Err(message) => Reply::Error { message },
        });
    }
}

impl Runtime {
    /// Adds or removes a WireGuard portal client on a blocking thread (the client
    /// store is written and fsynced before the reply), so the loop goes on meanwhile.
    pub(super) fn portal_request(&self, ask: PortalAsk, reply: oneshot::Sender<Reply>) {
        let Some(p) = self.portal.clone() else {
            let _ = reply.send(no_portal());
            return;
        };
        // A new client routes the mesh's networks (not the portal network, which the
        // config always carries) through the portal.
        let own = self.cfg.wg_portal.as_ref().map(|c| (c.net.addr, c.net.prefix));
        let nets: Vec<_> = self.mesh_networks_v4().into_iter().filter(|n| Some(*n) != own).collect();
        let local = local_ipv4s(self.cfg.ipv4.addr, self.portal_dev().as_deref());
        tokio::task::spawn_blocking(move || {
            let r = match ask {
                PortalAsk::Add(name) => match p.add(&name, &nets, &local) {
                    Ok(c) => Reply::WgClient(Box::new(c)),
                    Err(message) => Reply::Error { message },
                },
                PortalAsk::Remove(name) => match p.remove(&name) {
                    Ok(message) => Reply::Done { message },
                    Err(message) => Reply::Error { message },
                },
            };
            let _ = reply.send(r);
        });
    }
}

/// SIGHUP: reads and resolves the config off the loop, hands it to the loop as a
/// reload request, and logs the outcome.
async fn reload_from_file(args: Arc<UpArgs>, req_tx: Requests<Ask>) {
    let reply = match load_again(args).await {
        Ok(new) => {
            let (tx, rx) = oneshot::channel();
            if req_tx.send((Ask::Reload(Box::new(new)), tx)).await.is_err() {
                return;
            }
            rx.await.ok()
        }
        Err(message) => Some(Reply::Error { message }),
    };
    match reply {
        Some(Reply::Done { message }) => info!("{message}"),
        Some(Reply::Error { message }) => warn!("reload refused: {message}"),
        _ => {}
    }
}

/// Milliseconds on the sessions' clock (what the data path stamps flows with).
pub(super) fn clock_ms(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Runtime {
    /// This node's overlay networks (what a policy's `internet` is not).
    pub(super) fn overlay_networks(&self) -> Vec<(IpAddr, u8)> {
        let v4 =
            crate::config::values::IpNet { addr: self.cfg.ipv4.addr.into(), prefix: self.cfg.ipv4.prefix }.network();
        let mut v = vec![(v4.addr, v4.prefix)];
        if let Some((a, p)) = self.ipv6 {
            let n = crate::config::values::IpNet { addr: a.into(), prefix: p }.network();
            v.push((n.addr, n.prefix));
        }
        v
    }

    /// Recompiles the access policy when the members changed.
    fn refresh_policy(&mut self) {
        if self.policy.loaded.is_none() || self.policy.refused.is_some() {
            return;
        }
        let (members, overlay) = (self.engine.members(), self.overlay_networks());
        self.policy.refresh(&self.shared.firewall, members, &overlay);
    }

    /// A newer policy signed by the authority: in force at once, and kept.
    fn signed_policy(&mut self, bytes: &[u8]) {
        let loaded = match crate::config::policy::Loaded::signed(bytes, &self.cfg.state_dir.join("policy")) {
            Ok(l) => l,
            Err(e) => {
                warn!("{e}: every flow but this node's own is denied");
                return self.policy.fail_closed(&self.shared.firewall, e);
            }
        };
        let (version, rules) = (loaded.signed.unwrap_or(0), loaded.policy.rules.len());
        match self.apply_policy(Some(loaded)) {
            Ok(()) => {
                info!(version, rules, "access policy signed by the authority in force");
                if let Ok(p) = weft_core::policy::SignedPolicy::from_bytes(bytes) {
                    self.state_writer.save_policy(p.to_text());
                }
            }
            Err(e) => {
                warn!("{e}: every flow but this node's own is denied");
                self.policy.fail_closed(&self.shared.firewall, e);
            }
        }
    }

    /// Checks a signed policy pushed by an admin (`weft policy push`) and offers it to
    /// the engine, which passes it to the mesh.
    pub(super) fn push_policy(&mut self, now: Instant, bytes: Vec<u8>) -> Result<String, String> {
        let loaded = crate::config::policy::Loaded::signed(&bytes, &self.cfg.state_dir.join("policy"))?;
        let (members, overlay) = (self.engine.members(), self.overlay_networks());
        loaded.policy.check_known_tests(&members, &overlay).map_err(|e| format!("refused: {e}"))?;
        let v = loaded.signed.unwrap_or(0);
        match self.engine.offer_policy(now, bytes)? {
            true => Ok(format!("access policy version {v} in force here and passed to the mesh")),
            false => Ok(format!("version {v} is not newer than the signed policy this node holds: nothing changed")),
        }
    }

    /// Puts `loaded` in force (start and reload).
    pub(super) fn apply_policy(&mut self, loaded: Option<crate::config::policy::Loaded>) -> Result<(), String> {
        let (members, overlay) = (self.engine.members(), self.overlay_networks());
        self.policy.apply(&self.shared.firewall, loaded, members, &overlay)
    }
}

/// Warnings before this node's certificate expires: a week, a day and an hour ahead,
/// and once it has (members refuse its handshakes from then on).
const EXPIRY_WARNINGS: [u64; 4] = [7 * 86_400, 86_400, 3_600, 0];

impl Runtime {
    /// Warns once per threshold of [`EXPIRY_WARNINGS`] as this node's certificate
    /// nears its end.
    fn check_certificate_expiry(&mut self) {
        let Some(c) = &self.cfg.certificate else { return };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let left = c.body().not_after.saturating_sub(now);
        let Some(&threshold) = EXPIRY_WARNINGS.iter().filter(|t| left <= **t).min() else { return };
        if self.expiry_warned.is_some_and(|w| w <= threshold) {
            return;
        }
        self.expiry_warned = Some(threshold);
        if left == 0 {
            warn!(
                "this node's certificate has expired: members refuse its handshakes; have a new one signed (weft authority sign) and restart with it"
            );
        } else {
            warn!(
                seconds_left = left,
                "this node's certificate expires in {} h: have a new one signed (weft authority sign) before then",
                left / 3600
            );
        }
    }
}

/// Serves `/metrics` on `listener` (status asked through the control loop), at start
/// and when a reload turns it on or moves it.
pub(super) fn spawn_metrics(listener: tokio::net::TcpListener, req_tx: &Requests<Ask>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(metrics::serve(listener, req_tx.clone(), || Ask::Status))
}
