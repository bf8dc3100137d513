//! weft: the node daemon and command line of Weft, laid out by what a reader looks for.
//!
//! * [`config`]: flags ([`config::args`]), the TOML file and environment, resolved into
//!   one typed [`config::NodeConfig`]; typed values are the leaf [`config::values`].
//! * [`daemon`]: `weft up`. Start as named steps ([`daemon::run`]), the runtime loop
//!   that drives the sans-IO engine (`weft-peers`) and the pipelines (`weft-datapath`),
//!   reload, status, and the state files ([`daemon::state`]).
//! * [`control`]: the control socket's server and who may use it (the protocol and its
//!   client are the `weft-control` crate).
//! * [`host`]: what the daemon changes on the machine: routes and addresses (the `ip`
//!   thread), sysctls, the local interfaces it reads.
//! * [`services`]: what a node offers beside the tunnel: exit node, WireGuard portal,
//!   Magic DNS, LAN discovery, `/metrics`.
//! * [`notun`]: `--no-tun`: the userspace TCP/IP stack, SOCKS5, forwards and exposes.
//! * [`commands`]: the other subcommands, clients of the control socket.
//! * [`web`]: `weft web`, the web console: a client of the control socket that serves
//!   pages and a JSON API over HTTP(S).
//!
//! ```text
//!  flags/env/file --config--> NodeConfig --daemon::run--> TUN + UDP + pipelines (weft-datapath)
//!                                               \--> engine (weft-peers) <--> control socket
//! ```
#![warn(missing_docs)]

pub mod commands;
pub mod config;
pub mod control;
pub mod daemon;
pub mod host;
pub mod logging;
mod meta;
pub mod notun;
pub mod services;
pub mod web;

use anyhow::Result;

use crate::config::NodeConfig;
use crate::config::args::{Cli, Command};
use crate::config::values::UsageError;

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let Cli { log_level, log_format, command } = cli;
    match command {
        Command::Up(args) => {
            // The config file may set the log level and format: read it first (its
            // errors go to standard error without a subscriber).
            let args = daemon::join::prepare(*args)?;
            let cfg = NodeConfig::resolve(&args)?;
            let pinned = log_level.is_some() || std::env::var("RUST_LOG").is_ok_and(|s| !s.is_empty());
            logging::init(log_level, log_format.as_deref(), cfg.log_level.as_deref(), cfg.log_format.as_deref())?;
            daemon::run(cfg, daemon::Reloadable { args, log_level_pinned: pinned })
        }
        Command::Web(args) => {
            logging::init(log_level, log_format.as_deref(), None, None)?;
            web::run(&args)
        }
        command => {
            logging::init(log_level, log_format.as_deref(), None, None)?;
            commands::run(command)
        }
    }
}

/// Exit status for an error: 2 for bad input, 1 for everything else.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<UsageError>().is_some() { 2 } else { 1 }
}
