//! Live reload: the config read again (off the loop), then each difference applied
//! or named as needing a restart.

use std::time::Instant;

use tracing::info;
use weft_control::Reply;
use weft_datapath::transport::{Endpoint, Proto};
use weft_peers::node::PeerRef;

use super::requests::{Ask, Reloaded};
use super::runtime::Runtime;
use super::settings::{engine_proxied, exit_offer};
use crate::config::NodeConfig;
use crate::config::values::IpNet;
use crate::config::values::PeerUri;
use crate::control::server::Requests;
use crate::host::net::enable_forwarding;
use crate::services::discovery::Discovery;
use std::net::SocketAddr;

/// What applying one subsystem's new settings did: lines for the reply.
#[derive(Default)]
pub(super) struct Outcome {
    done: Vec<String>,
    failed: Vec<String>,
}

impl Outcome {
    fn done(&mut self, what: impl Into<String>) {
        self.done.push(what.into());
    }

    fn failed(&mut self, what: impl Into<String>) {
        self.failed.push(what.into());
    }
}

/// The settings a reload applies live.
struct Live {
    peers: Vec<PeerUri>,
    proxy_networks: Vec<IpNet>,
    listeners: Vec<Endpoint>,
    lan_discovery: bool,
    port_mapping: bool,
    metrics: Option<SocketAddr>,
    log_level: Option<String>,
    dns_domain: Option<String>,
    accept_dns: bool,
    network_secret: crate::config::values::Secret,
    network_secret_next: Option<crate::config::values::Secret>,
    policy: Option<crate::config::policy::Loaded>,
}

/// Takes the new config apart field by field: the settings applied live, and the
/// names of the others that differ from `old` (they need a restart). A new setting
/// must be placed on one side or the other, or this does not compile.
fn split(old: &NodeConfig, new: NodeConfig) -> (Live, Vec<&'static str>) {
    let NodeConfig {
        // Applied live, each by its own step below.
        peers,
        proxy_networks,
        listeners,
        lan_discovery,
        port_mapping,
        metrics,
        log_level,
        dns_domain,
        accept_dns,
        network_secret,
        network_secret_next,
        policy,
        // Fixed until a restart.
        network_name,
        authorities,
        certificate,
        authority_key,
        cipher,
        ipv4,
        dhcp,
        ipv6,
        dev_name,
        mtu,
        threads,
        hostname,
        state_dir,
        control,
        admin_group,
        offload,
        pin,
        latency_first,
        accept_wide_subnets,
        max_connections,
        tls,
        wg_portal,
        log_format,
        exit_node,
        exit_allow_lan,
        use_exit,
        exit_fallback,
        snat_subnet_routes,
        router_priority,
        proxy_health,
        rekey_after,
        no_tun,
        socks5,
        socks5_auth,
        forwards,
        exposes,
    } = new;
    let fixed = [
        ("network-name", old.network_name != network_name),
        ("authority", old.authorities != authorities),
        ("certificate", old.certificate != certificate),
        ("authority-key", old.authority_key != authority_key),
        ("cipher", old.cipher != cipher),
        ("ipv4", if old.dhcp.is_some() { old.dhcp != dhcp } else { old.ipv4 != ipv4 }),
        ("ipv6", old.ipv6 != ipv6),
        ("dev-name", old.dev_name != dev_name),
        ("mtu", old.mtu != mtu),
        ("threads", old.threads != threads),
        ("hostname", old.hostname != hostname),
        ("state-dir", old.state_dir != state_dir),
        ("control", old.control != control),
        ("admin-group", old.admin_group != admin_group),
        ("offloads", old.offload != offload),
        ("pin", old.pin != pin),
        ("latency-first", old.latency_first != latency_first),
        ("accept-wide-subnets", old.accept_wide_subnets != accept_wide_subnets),
        ("max-connections", old.max_connections != max_connections),
        ("tls-cert/tls-key", old.tls != tls),
        ("wg-portal", old.wg_portal != wg_portal),
        ("log-format", old.log_format != log_format),
        ("exit-node", old.exit_node != exit_node),
        ("exit-allow-lan", old.exit_allow_lan != exit_allow_lan),
        ("use-exit-node", old.use_exit != use_exit),
        ("exit-fallback", old.exit_fallback != exit_fallback),
        ("no-snat-subnet-routes", old.snat_subnet_routes != snat_subnet_routes),
        ("router-priority", old.router_priority != router_priority),
        ("proxy-health", old.proxy_health != proxy_health),
        ("rekey-after", old.rekey_after != rekey_after),
        ("no-tun", old.no_tun != no_tun),
        ("socks5", old.socks5 != socks5),
        ("socks5-auth", old.socks5_auth != socks5_auth),
        ("forward", old.forwards != forwards),
        ("expose", old.exposes != exposes),
    ];
    let restart: Vec<&'static str> = fixed.iter().filter(|(_, changed)| *changed).map(|(name, _)| *name).collect();
    let live = Live {
        peers,
        proxy_networks,
        listeners,
        lan_discovery,
        port_mapping,
        metrics,
        log_level,
        dns_domain,
        accept_dns,
        network_secret,
        network_secret_next,
        policy,
    };
    (live, restart)
}

impl Runtime {
    /// Applies a config read again: peers, listeners, proxied subnets, Magic DNS, LAN
    /// discovery, the metrics address and the log level change live (sessions stay
    /// up); every other difference is named in the reply and left as it was. The
    /// config is taken apart field by field: a new setting must be placed here, as
    /// applied live or as needing a restart, or this does not compile.
    pub(super) async fn reload(
        &mut self,
        new: Reloaded,
        discovery: &mut Option<Discovery>,
        metrics: &mut Option<tokio::task::JoinHandle<()>>,
        req_tx: &Requests<Ask>,
    ) -> Reply {
        let Reloaded { cfg: new, peers: resolved, psks } = new;
        let (live, restart) = split(&self.cfg, new);
        let Live {
            peers,
            proxy_networks,
            listeners,
            lan_discovery,
            port_mapping,
            metrics: metrics_addr,
            log_level,
            dns_domain,
            accept_dns,
            network_secret,
            network_secret_next,
            policy,
        } = live;
        let mut out = Outcome::default();
        let now = Instant::now();
        self.reload_peers(now, peers, resolved, &mut out);
        self.reload_proxied(now, proxy_networks, &mut out);
        let udp_moved = self.reload_listeners(now, listeners, &mut out).await;
        self.reload_discovery(lan_discovery, udp_moved, discovery, &mut out);
        self.reload_port_mapping(port_mapping, udp_moved, &mut out);
        self.reload_metrics(metrics_addr, metrics, req_tx, &mut out);
        self.reload_log_level(log_level, &mut out);
        self.reload_dns(dns_domain, accept_dns, &mut out).await;
        self.reload_secrets(network_secret, network_secret_next, psks, &mut out);
        self.reload_policy(policy, &mut out);

        let Outcome { done, failed } = out;
        let file = self.args.config.as_ref().map_or_else(String::new, |p| format!(" {}", p.display()));
        let mut message = if done.is_empty() {
            format!("reloaded{file}: nothing changed")
        } else {
            format!("reloaded{file}: {}", done.join("; "))
        };
        if !failed.is_empty() {
            message.push_str(&format!("; FAILED: {}", failed.join("; ")));
        }
        if !restart.is_empty() {
            message.push_str(&format!("; needs a restart to change (left as it was): {}", restart.join(", ")));
        }
        info!("{message}");
        if failed.is_empty() { Reply::Done { message } } else { Reply::Error { message } }
    }

    /// The access policy: a new one (or a changed file) is in force at once; flows it
    /// no longer allows are cut, the others stay.
    fn reload_policy(&mut self, policy: Option<crate::config::policy::Loaded>, out: &mut Outcome) {
        if let Some(v) = self.policy.loaded.as_ref().and_then(|l| l.signed) {
            if self.cfg.policy != policy {
                out.done(format!("policy file noted; the policy the authority signed (version {v}) stays in force"));
                self.cfg.policy = policy;
            }
            return;
        }
        let was = self.policy.loaded.as_ref().map(|l| (l.path.clone(), l.version.clone()));
        let now = policy.as_ref().map(|l| (l.path.clone(), l.version.clone()));
        if was == now {
            return;
        }
        let what = match &policy {
            Some(l) => format!(
                "access policy {} version {} in force ({} rules)",
                l.path.display(),
                l.version,
                l.policy.rules.len()
            ),
            None => "access policy removed: every member reaches everything".to_owned(),
        };
        match self.apply_policy(policy.clone()) {
            Ok(()) => {
                self.cfg.policy = policy;
                out.done(what);
            }
            Err(e) => out.failed(e),
        }
    }

    /// The network secret and the next one: handshakes from now on use them (sessions
    /// up keep their keys until their next rekey, so nothing is cut).
    fn reload_secrets(
        &mut self,
        secret: crate::config::values::Secret,
        next: Option<crate::config::values::Secret>,
        psks: (weft_core::handshake::Psk, Option<weft_core::handshake::Psk>),
        out: &mut Outcome,
    ) {
        if secret == self.cfg.network_secret && next == self.cfg.network_secret_next {
            return;
        }
        let (psk, next_psk) = psks;
        // The engine's keys are the pipelines' and the transports' (one instance).
        self.engine.set_secrets(psk, next_psk);
        let promoted = self.cfg.network_secret_next.as_ref() == Some(&secret);
        out.done(match (&next, secret == self.cfg.network_secret) {
            (Some(_), true) => "network-secret-next accepted beside the network secret".to_owned(),
            (None, true) => "network-secret-next dropped".to_owned(),
            (_, false) if promoted => "the next network secret is now the network secret".to_owned(),
            (_, false) => "network secret changed (members without it cannot handshake with this node)".to_owned(),
        });
        self.cfg.network_secret = secret;
        self.cfg.network_secret_next = next;
    }

    /// Peers: dial the new ones, stop dialling the ones gone (peers added with `weft
    /// peer add` are not in the file and stay).
    fn reload_peers(&mut self, now: Instant, uris: Vec<PeerUri>, peers: Vec<(PeerUri, Endpoint)>, out: &mut Outcome) {
        let gone: Vec<(PeerUri, Endpoint)> =
            self.dialled.iter().filter(|(u, _)| !peers.iter().any(|(n, _)| n == u)).cloned().collect();
        for (u, ep) in gone {
            match self.engine.remove_peer(now, PeerRef::Endpoint(ep)) {
                Ok(_) => out.done(format!("removed peer {u}")),
                Err(e) => out.failed(format!("peer {u}: {e}")),
            }
        }
        for (u, ep) in peers.iter().filter(|(u, _)| !self.dialled.iter().any(|(o, _)| o == u)) {
            self.connector.set_path(*ep, u.path.clone());
            match self.engine.add_peer(now, *ep) {
                Ok(()) => out.done(format!("added peer {u}")),
                Err(e) => out.failed(format!("peer {u}: {e}")),
            }
        }
        self.dialled = peers;
        self.cfg.peers = uris;
    }

    /// Proxied subnets (the portal network stays among them): forwarding, the
    /// engine's announcement, the exit rules and the portal's routes.
    fn reload_proxied(&mut self, now: Instant, networks: Vec<IpNet>, out: &mut Outcome) {
        let mut proxied = networks.clone();
        if let Some(p) = &self.cfg.wg_portal {
            proxied.push(p.net.into());
        }
        if proxied == self.cfg.proxy_networks {
            return;
        }
        if proxied.iter().any(|n| n.addr.is_ipv4()) {
            let _ = enable_forwarding(false);
        }
        if proxied.iter().any(|n| n.addr.is_ipv6()) {
            let _ = enable_forwarding(true);
        }
        self.engine.set_proxied(now, engine_proxied(&proxied, self.cfg.exit_node, self.ipv6.is_some()));
        let list: Vec<String> = networks.iter().map(ToString::to_string).collect();
        out.done(format!("proxied subnets now [{}]", list.join(", ")));
        self.cfg.proxy_networks = proxied;
        if let Some(o) = exit_offer(&self.cfg, self.ipv6).filter(|_| !self.cfg.no_tun)
            && let Err(e) = crate::services::exit::offer(&self.cfg.dev_name, &o)
        {
            out.failed(format!("exit rules for the new subnets: {e}"));
        }
        let snat = super::start::snat_subnets(&self.cfg);
        if snat.is_empty() {
            // A no-TUN node has no kernel state (and may run without root or nft).
            if !self.cfg.no_tun {
                crate::services::snat::withdraw(&self.cfg.dev_name);
            }
        } else if let Err(e) = crate::services::snat::apply(&self.cfg.dev_name, &snat) {
            out.failed(format!("source translation for the new subnets: {e}"));
        }
        self.update_portal();
    }

    /// Listeners. The UDP sockets move to the new address under the running pipelines
    /// (peers follow us by roaming: our next packets come from there); a closed QUIC
    /// listener keeps its connections and stops accepting. Returns whether the UDP
    /// port moved.
    async fn reload_listeners(&mut self, now: Instant, wanted_all: Vec<Endpoint>, out: &mut Outcome) -> bool {
        let new_listeners = &wanted_all;
        let mut listeners_changed = false;
        let mut udp_failed = false;
        let mut udp_moved = false;
        for proto in [Proto::Udp, Proto::Quic, Proto::Tcp, Proto::Ws, Proto::Wss] {
            let was = self.cfg.listeners.iter().find(|l| l.proto == proto).copied();
            let wanted = new_listeners.iter().find(|l| l.proto == proto).copied();
            if was == wanted {
                continue;
            }
            if proto == Proto::Udp {
                match self.rebind_udp(wanted.map(|l| l.addr)) {
                    Ok(addr) => {
                        udp_moved = true;
                        self.engine.udp_moved(now);
                        self.listeners.retain(|b| b.proto != Proto::Udp);
                        if wanted.is_some() {
                            let b = Endpoint::new(Proto::Udp, addr);
                            self.listeners.push(b);
                            out.done(format!("listening on {b}"));
                        } else {
                            out.done(format!("udp listener closed (outgoing UDP from port {})", addr.port()));
                        }
                        listeners_changed = true;
                    }
                    Err(e) => {
                        udp_failed = true;
                        let l = wanted.map_or_else(|| "off".into(), |l| l.to_string());
                        out.failed(format!("udp listener {l}: {e:#}"));
                    }
                }
                continue;
            }
            if was.is_some()
                && let Some(bound) = self.listeners.iter().position(|b| b.proto == proto)
            {
                let b = self.listeners.remove(bound);
                self.connector.close_listener(b);
                out.done(format!("closed listener {b}"));
                listeners_changed = true;
            }
            if let Some(l) = wanted {
                match self.connector.listen(l).await {
                    Ok(addr) => {
                        let b = Endpoint::new(proto, addr);
                        self.listeners.push(b);
                        out.done(format!("listening on {b}"));
                        listeners_changed = true;
                    }
                    Err(e) => out.failed(format!("listener {l}: {e}")),
                }
            }
        }
        if listeners_changed {
            // What is configured now: the new config's listeners that bound, and the
            // UDP one as it was if it could not move.
            let udp_from = if udp_failed { &self.cfg.listeners } else { new_listeners };
            let udp = udp_from.iter().find(|e| e.proto == Proto::Udp).copied();
            let mut l: Vec<Endpoint> = new_listeners
                .iter()
                .filter(|e| e.proto != Proto::Udp && self.listeners.iter().any(|b| b.proto == e.proto))
                .copied()
                .collect();
            l.extend(udp);
            self.cfg.listeners = l;
            self.announce_endpoints();
        }

        udp_moved
    }

    /// Port mapping: started or stopped (the mapping deleted, its endpoint no longer
    /// announced); a moved UDP listener has its new port mapped instead.
    fn reload_port_mapping(&mut self, wanted: bool, udp_moved: bool, out: &mut Outcome) {
        if wanted != self.cfg.port_mapping {
            self.cfg.port_mapping = wanted;
            if wanted {
                self.start_port_mapping();
                out.done("port mapping on");
            } else {
                if let Some(p) = self.portmap.take() {
                    tokio::spawn(p.shut_down());
                }
                self.mapped = None;
                self.announce_endpoints();
                out.done("port mapping off");
            }
        } else if udp_moved && let Some(p) = &mut self.portmap {
            match self.listeners.iter().find(|l| l.proto == Proto::Udp) {
                Some(l) => p.set_listen(l.addr),
                None => {
                    // No UDP listener any more: nothing to map.
                    if let Some(p) = self.portmap.take() {
                        tokio::spawn(p.shut_down());
                    }
                    self.mapped = None;
                    self.announce_endpoints();
                }
            }
        } else if udp_moved {
            self.start_port_mapping();
        }
    }

    /// LAN discovery (its beacons name our UDP port: started again if that moved).
    fn reload_discovery(
        &mut self,
        wanted: bool,
        udp_moved: bool,
        discovery: &mut Option<Discovery>,
        out: &mut Outcome,
    ) {
        if udp_moved && self.cfg.lan_discovery && wanted {
            *discovery = None;
            self.cfg.lan_discovery = false;
        }
        if wanted != self.cfg.lan_discovery {
            if wanted {
                match self.discovery() {
                    Ok(d) => {
                        *discovery = Some(d);
                        self.cfg.lan_discovery = true;
                        out.done("LAN discovery on");
                    }
                    Err(e) => out.failed(format!("LAN discovery: {e:#}")),
                }
            } else {
                *discovery = None;
                self.cfg.lan_discovery = false;
                out.done("LAN discovery off");
            }
        }
    }

    /// Metrics: binds the new address before letting the old one go.
    fn reload_metrics(
        &mut self,
        addr: Option<SocketAddr>,
        metrics: &mut Option<tokio::task::JoinHandle<()>>,
        req_tx: &Requests<Ask>,
        out: &mut Outcome,
    ) {
        if addr == self.cfg.metrics {
            return;
        }
        // The same bind (and warning) as at start.
        let bound = addr
            .map(|a| super::start::bind_metrics(a).and_then(|l| Ok(tokio::net::TcpListener::from_std(l)?)))
            .transpose();
        match bound {
            Ok(l) => {
                if let Some(old) = metrics.take() {
                    old.abort();
                }
                *metrics = l.map(|l| super::runtime::spawn_metrics(l, req_tx));
                self.cfg.metrics = addr;
                out.done(addr.map_or_else(|| "metrics off".into(), |a| format!("metrics on {a}")));
            }
            Err(e) => out.failed(format!("{e:#}")),
        }
    }

    /// The log level (unless a flag or RUST_LOG chose it).
    fn reload_log_level(&mut self, level: Option<String>, out: &mut Outcome) {
        if level != self.cfg.log_level && !self.log_level_pinned {
            let spec = level.clone().unwrap_or_else(|| "info".into());
            match crate::logging::set_log_level(&spec) {
                Ok(()) => {
                    out.done(format!("log level {spec}"));
                    self.cfg.log_level = level;
                }
                Err(e) => out.failed(format!("log level: {e}")),
            }
        }
    }

    /// Magic DNS: a new domain, on or off, registered or not. The server keeps its
    /// socket through a change of domain: rebinding the same port at once could find
    /// it still held by the aborted task.
    async fn reload_dns(&mut self, domain: Option<String>, accept: bool, out: &mut Outcome) {
        if domain != self.cfg.dns_domain || accept != self.cfg.accept_dns {
            if self.cfg.accept_dns && self.dns.is_some() {
                let dev = self.cfg.dev_name.clone();
                let _ = tokio::task::spawn_blocking(move || crate::services::dns::unregister(&dev)).await;
            }
            self.cfg.dns_domain.clone_from(&domain);
            self.cfg.accept_dns = accept;
            match self.cfg.dns_domain.clone() {
                None => {
                    self.dns = None;
                    out.done("Magic DNS off");
                }
                Some(d) => {
                    match &self.dns {
                        Some(server) => {
                            server.update(self.dns_zone(&d));
                            self.register_dns();
                        }
                        None => self.start_dns(true),
                    }
                    if self.dns.is_some() {
                        out.done(format!("Magic DNS for {d}"));
                    } else {
                        out.failed(format!("Magic DNS for {d}: cannot bind port 53 yet (retrying every second)"));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::args::UpArgs;
    use crate::config::values::{Secret, parse_forward};

    fn config() -> NodeConfig {
        let args = UpArgs {
            network_name: Some("office".into()),
            network_secret: Some("s3cret".into()),
            ipv4: Some("10.126.126.2/24".into()),
            ..UpArgs::default()
        };
        NodeConfig::resolve(&args).unwrap()
    }

    #[test]
    fn every_setting_is_applied_live_or_named_as_needing_a_restart() {
        let old = config();
        let (_, restart) = split(&old, old.clone());
        assert!(restart.is_empty(), "{restart:?}");

        // Settings the old list of restart keys forgot: they changed nothing and the
        // reply did not say so.
        let mut new = old.clone();
        new.no_tun = true;
        new.socks5 = Some("127.0.0.1:1080".parse().unwrap());
        new.socks5_auth = Some(("u".into(), Secret::from("p")));
        new.forwards = vec![parse_forward("tcp://127.0.0.1:2222=10.126.126.3:22").unwrap()];
        new.rekey_after = std::time::Duration::from_secs(60);
        new.cipher = weft_core::crypto::Cipher::ChaCha20Poly1305;
        let (_, restart) = split(&old, new);
        assert_eq!(restart, ["cipher", "rekey-after", "no-tun", "socks5", "socks5-auth", "forward"]);

        // Live settings come back to be applied, and are not named.
        let mut new = old.clone();
        new.log_level = Some("debug".into());
        new.lan_discovery = !old.lan_discovery;
        let (live, restart) = split(&old, new);
        assert!(restart.is_empty(), "{restart:?}");
        assert_eq!(live.log_level.as_deref(), Some("debug"));
        assert_eq!(live.lan_discovery, !old.lan_discovery);
    }
}
