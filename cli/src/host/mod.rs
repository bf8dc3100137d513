//! What the daemon changes on, and reads from, the machine: routes and addresses
//! through the `ip` command on a thread of its own, sysctls ([`net`]), and the local
//! interfaces and networks it announces or avoids ([`interfaces`]).

pub mod exit_route;
pub mod interfaces;
pub mod ip;
pub mod net;
