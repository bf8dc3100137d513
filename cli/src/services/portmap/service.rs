//! Port mapping as the daemon runs it: one mapper for the current default gateway and
//! UDP port, replaced when either changes (the old one deletes its mapping in the
//! background), its state on a channel the runtime watches.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tracing::info;

use super::{PortMapper, Publisher, SSDP_GROUP, Settings, State, Timing, local_ip_towards};
use crate::host::interfaces::default_gateway;

/// What the mapper was started for: the gateway, and our address and port.
type Target = (Ipv4Addr, Ipv4Addr, u16);

/// Port mapping of one node.
pub struct Service {
    publisher: Publisher,
    mapper: Option<PortMapper>,
    target: Option<Target>,
    /// The UDP listener (its address may be the wildcard).
    listen: SocketAddr,
}

impl Service {
    /// Starts mapping the UDP port of `listen` on the default gateway (at once if
    /// there is one; otherwise status says so until a [`Service::refresh`] finds one).
    pub fn start(publisher: Publisher, listen: SocketAddr) -> Self {
        let mut s = Self { publisher, mapper: None, target: None, listen };
        let target = s.target();
        s.switch(target);
        s
    }

    /// Follows the host: a new default gateway, or a new address towards it, starts a
    /// new mapper (the old one deletes its mapping in the background).
    pub fn refresh(&mut self) {
        let target = self.target();
        if target != self.target {
            self.switch(target);
        }
    }

    /// Our UDP listener moved (a reload): the new port is mapped instead.
    pub fn set_listen(&mut self, listen: SocketAddr) {
        self.listen = listen;
        self.refresh();
    }

    /// Stops the mapper (in the background) and starts one for `target`, or says
    /// that there is no gateway to ask.
    fn switch(&mut self, target: Option<Target>) {
        if let Some(old) = self.mapper.take() {
            tokio::spawn(old.shut_down());
        }
        self.target = target;
        let publisher = self.publisher.next();
        let port = self.listen.port();
        match target {
            Some((gw, local_ip, internal_port)) => {
                info!(gateway = %gw, local = %local_ip, port = internal_port, "port mapping: asking the router");
                let settings = Settings {
                    gateway: SocketAddr::from((gw, weft_core::portmap::SERVER_PORT)),
                    local_ip,
                    internal_port,
                    upnp: true,
                    upnp_search_to: SSDP_GROUP,
                    timing: Timing::default(),
                };
                self.mapper = Some(PortMapper::spawn(settings, publisher));
            }
            None => publisher.update(|s| {
                *s = State {
                    internal_port: port,
                    last_error: Some("no IPv4 default gateway".to_owned()),
                    ..State::default()
                };
            }),
        }
    }

    /// Stops, deleting the mapping held (waits for the router's answer, bounded).
    pub async fn shut_down(mut self) {
        let last = self.publisher.next();
        if let Some(m) = self.mapper.take() {
            m.shut_down().await;
        }
        last.update(|s| *s = State::default());
    }

    /// The gateway, and our address and port to map: the listener's address when it
    /// is a given IPv4 one, else the one the host sends to the gateway from.
    fn target(&self) -> Option<Target> {
        let gw = default_gateway()?;
        let local = match self.listen.ip() {
            IpAddr::V4(a) if !a.is_unspecified() => a,
            _ => local_ip_towards(gw).ok()?,
        };
        Some((gw, local, self.listen.port()))
    }
}
