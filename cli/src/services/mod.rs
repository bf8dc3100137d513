//! What a node offers beside the tunnel, one module each: the exit node ([`exit`]),
//! the source translation of subnet routes ([`snat`]) and their health check ([`health`]),
//! the WireGuard portal ([`portal`]), Magic DNS ([`dns`]), LAN discovery
//! ([`discovery`]), the Prometheus endpoint ([`metrics`]), the access policy
//! ([`policy`]) and port mapping on the router ([`portmap`]).

pub mod discovery;
pub mod dns;
pub mod exit;
pub mod health;
pub mod metrics;
pub mod policy;
pub mod portal;
pub mod portmap;
pub mod snat;
