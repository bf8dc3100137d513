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
use crate::config::values::PeerUri;
use crate::control::server::Requests;
use crate::host::interfaces::local_endpoints;
use crate::host::net::enable_forwarding;
use crate::services::discovery::Discovery;
use crate::services::metrics::server as metrics;

impl Runtime {
    /// Applies a config read again: peers, listeners, proxied subnets, Magic DNS, LAN
    /// discovery, the metrics address and the log level change live (sessions stay
    /// up); every other difference is named in the reply and left as it was.
    pub(super) async fn reload(
        &mut self,
        new: Reloaded,
        discovery: &mut Option<Discovery>,
        metrics: &mut Option<tokio::task::JoinHandle<()>>,
        req_tx: &Requests<Ask>,
    ) -> Reply {
        let now = Instant::now();
        let Reloaded { cfg: new, peers } = new;
        let old = &self.cfg;
        let mut restart: Vec<&str> = Vec::new();
        let fixed = [
            ("network-name", old.network_name != new.network_name),
            ("network-secret", old.network_secret != new.network_secret),
            ("cipher", old.cipher != new.cipher),
            ("ipv4", if old.dhcp.is_some() { old.dhcp != new.dhcp } else { old.ipv4 != new.ipv4 }),
            ("ipv6", old.ipv6 != new.ipv6),
            ("dev-name", old.dev_name != new.dev_name),
            ("mtu", old.mtu != new.mtu),
            ("threads", old.threads != new.threads),
            ("hostname", old.hostname != new.hostname),
            ("state-dir", old.state_dir != new.state_dir),
            ("control", old.control != new.control),
            ("admin-group", old.admin_group != new.admin_group),
            ("offloads", old.offload != new.offload),
            ("pin", old.pin != new.pin),
            ("latency-first", old.latency_first != new.latency_first),
            ("accept-wide-subnets", old.accept_wide_subnets != new.accept_wide_subnets),
            ("max-connections", old.max_connections != new.max_connections),
            ("tls-cert/tls-key", old.tls != new.tls),
            ("wg-portal", old.wg_portal != new.wg_portal),
            ("log-format", old.log_format != new.log_format),
            ("exit-node", old.exit_node != new.exit_node),
            ("exit-allow-lan", old.exit_allow_lan != new.exit_allow_lan),
            ("use-exit-node", old.use_exit != new.use_exit),
            ("exit-fallback", old.exit_fallback != new.exit_fallback),
        ];
        restart.extend(fixed.iter().filter(|(_, changed)| *changed).map(|(name, _)| *name));
        let mut done: Vec<String> = Vec::new();
        let mut failed: Vec<String> = Vec::new();

        // Peers: dial the new ones, stop dialling the ones gone (peers added with
        // `weft peer add` are not in the file and stay).
        let gone: Vec<(PeerUri, Endpoint)> =
            self.dialled.iter().filter(|(u, _)| !peers.iter().any(|(n, _)| n == u)).cloned().collect();
        for (u, ep) in gone {
            match self.engine.remove_peer(now, PeerRef::Endpoint(ep)) {
                Ok(_) => done.push(format!("removed peer {u}")),
                Err(e) => failed.push(format!("peer {u}: {e}")),
            }
        }
        for (u, ep) in peers.iter().filter(|(u, _)| !self.dialled.iter().any(|(o, _)| o == u)) {
            self.connector.set_path(*ep, u.path.clone());
            match self.engine.add_peer(now, *ep) {
                Ok(()) => done.push(format!("added peer {u}")),
                Err(e) => failed.push(format!("peer {u}: {e}")),
            }
        }
        self.dialled = peers;
        self.cfg.peers = new.peers.clone();

        // Proxied subnets (the portal network stays among them).
        let mut proxied = new.proxy_networks.clone();
        if let Some(p) = &self.cfg.wg_portal {
            proxied.push(p.net.into());
        }
        if proxied != self.cfg.proxy_networks {
            if proxied.iter().any(|n| n.addr.is_ipv4()) {
                let _ = enable_forwarding(false);
            }
            if proxied.iter().any(|n| n.addr.is_ipv6()) {
                let _ = enable_forwarding(true);
            }
            self.engine.set_proxied(now, engine_proxied(&proxied, self.cfg.exit_node, self.ipv6.is_some()));
            let list: Vec<String> = new.proxy_networks.iter().map(ToString::to_string).collect();
            done.push(format!("proxied subnets now [{}]", list.join(", ")));
            self.cfg.proxy_networks = proxied;
            if let Some(o) = exit_offer(&self.cfg, self.ipv6).filter(|_| !self.cfg.no_tun)
                && let Err(e) = crate::services::exit::offer(&self.cfg.dev_name, &o)
            {
                failed.push(format!("exit rules for the new subnets: {e}"));
            }
            self.update_portal();
        }

        // Listeners. The UDP sockets move to the new address under the running
        // pipelines (peers follow us by roaming: our next packets come from there);
        // a closed QUIC listener keeps its connections and stops accepting.
        let mut listeners_changed = false;
        let mut udp_failed = false;
        let mut udp_moved = false;
        for proto in [Proto::Udp, Proto::Quic, Proto::Tcp, Proto::Ws, Proto::Wss] {
            let was = self.cfg.listeners.iter().find(|l| l.proto == proto).copied();
            let wanted = new.listeners.iter().find(|l| l.proto == proto).copied();
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
                            done.push(format!("listening on {b}"));
                        } else {
                            done.push(format!("udp listener closed (outgoing UDP from port {})", addr.port()));
                        }
                        listeners_changed = true;
                    }
                    Err(e) => {
                        udp_failed = true;
                        let l = wanted.map_or_else(|| "off".into(), |l| l.to_string());
                        failed.push(format!("udp listener {l}: {e:#}"));
                    }
                }
                continue;
            }
            if was.is_some()
                && let Some(bound) = self.listeners.iter().position(|b| b.proto == proto)
            {
                let b = self.listeners.remove(bound);
                self.connector.close_listener(b);
                done.push(format!("closed listener {b}"));
                listeners_changed = true;
            }
            if let Some(l) = wanted {
                match self.connector.listen(l).await {
                    Ok(addr) => {
                        let b = Endpoint::new(proto, addr);
                        self.listeners.push(b);
                        done.push(format!("listening on {b}"));
                        listeners_changed = true;
                    }
                    Err(e) => failed.push(format!("listener {l}: {e}")),
                }
            }
        }
        if listeners_changed {
            // What is configured now: the new config's listeners that bound, and the
            // UDP one as it was if it could not move.
            let udp_from = if udp_failed { &self.cfg.listeners } else { &new.listeners };
            let udp = udp_from.iter().find(|e| e.proto == Proto::Udp).copied();
            let mut l: Vec<Endpoint> = new
                .listeners
                .iter()
                .filter(|e| e.proto != Proto::Udp && self.listeners.iter().any(|b| b.proto == e.proto))
                .copied()
                .collect();
            l.extend(udp);
            self.cfg.listeners = l;
            let bound = self.listeners.clone();
            self.engine.set_endpoints(local_endpoints(
                &bound,
                self.cfg.ipv4.addr,
                &self.cfg.dev_name,
                self.portal_dev().as_deref(),
            ));
        }

        // LAN discovery (its beacons name our UDP port: start it again if that moved).
        if udp_moved && self.cfg.lan_discovery && new.lan_discovery {
            *discovery = None;
            self.cfg.lan_discovery = false;
        }
        if new.lan_discovery != self.cfg.lan_discovery {
            if new.lan_discovery {
                match self.discovery() {
                    Ok(d) => {
                        *discovery = Some(d);
                        self.cfg.lan_discovery = true;
                        done.push("LAN discovery on".into());
                    }
                    Err(e) => failed.push(format!("LAN discovery: {e:#}")),
                }
            } else {
                *discovery = None;
                self.cfg.lan_discovery = false;
                done.push("LAN discovery off".into());
            }
        }

        // Metrics: bind the new address before letting the old one go.
        if new.metrics != self.cfg.metrics {
            let bound = match new.metrics {
                Some(addr) => std::net::TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .and_then(tokio::net::TcpListener::from_std)
                    .map(Some)
                    .map_err(|e| format!("metrics on {addr}: {e}")),
                None => Ok(None),
            };
            match bound {
                Ok(l) => {
                    if let Some(old) = metrics.take() {
                        old.abort();
                    }
                    *metrics = l.map(|l| tokio::spawn(metrics::serve(l, req_tx.clone(), || Ask::Status)));
                    self.cfg.metrics = new.metrics;
                    done.push(new.metrics.map_or_else(|| "metrics off".into(), |a| format!("metrics on {a}")));
                }
                Err(e) => failed.push(e),
            }
        }

        // Log level (unless a flag or RUST_LOG chose it).
        if new.log_level != self.cfg.log_level && !self.log_level_pinned {
            let spec = new.log_level.clone().unwrap_or_else(|| "info".into());
            match crate::logging::set_log_level(&spec) {
                Ok(()) => {
                    done.push(format!("log level {spec}"));
                    self.cfg.log_level = new.log_level;
                }
                Err(e) => failed.push(format!("log level: {e}")),
            }
        }

        // Magic DNS: a new domain, on or off, registered or not.
        // The server keeps its socket through a change of domain: rebinding the same
        // port at once could find it still held by the aborted task.
        if new.dns_domain != self.cfg.dns_domain || new.accept_dns != self.cfg.accept_dns {
            if self.cfg.accept_dns && self.dns.is_some() {
                let dev = self.cfg.dev_name.clone();
                let _ = tokio::task::spawn_blocking(move || crate::services::dns::unregister(&dev)).await;
            }
            self.cfg.dns_domain.clone_from(&new.dns_domain);
            self.cfg.accept_dns = new.accept_dns;
            match self.cfg.dns_domain.clone() {
                None => {
                    self.dns = None;
                    done.push("Magic DNS off".into());
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
                        done.push(format!("Magic DNS for {d}"));
                    } else {
                        failed.push(format!("Magic DNS for {d}: cannot bind port 53 yet (retrying every second)"));
                    }
                }
            }
        }

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
}
