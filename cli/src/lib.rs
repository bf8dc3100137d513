//! weft: the node runtime and command line of Weft.
//!
//! This crate is the composition root: [`node`] owns the tokio runtime, the TUN, the
//! sockets and the pipeline threads, and drives the sans-IO engine of `weft-peers`;
//! [`control`] is the Unix-socket API that `weft status` (and later the GUI) use;
//! [`config`] turns flags, environment and the TOML file into one typed config.
//!
//! ```text
//!  flags/env/file --config--> NodeConfig --node::run--> TUN + UDP + pipelines (weft-core)
//!                                               \--> engine (weft-peers) <--> control socket
//! ```
#![warn(missing_docs)]

pub mod access;
pub mod args;
pub mod config;

pub mod discovery;
pub mod dns;
pub mod exit;
mod meta;
pub mod metrics;
pub mod netstack;
pub mod node;
pub mod portal;
pub mod secret;
mod show;
pub mod state;
pub mod userspace;

use anyhow::Result;

use crate::args::{Cli, Command, ExitCommand, PeerCommand, SecretCommand, WgCommand};
use crate::config::{NodeConfig, UsageError};

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let Cli { log_level, log_format, command } = cli;
    match command {
        Command::Up(args) => {
            // The config file may set the log level and format: read it first (its
            // errors go to standard error without a subscriber).
            let cfg = NodeConfig::resolve(&args)?;
            let pinned = log_level.is_some() || std::env::var("RUST_LOG").is_ok_and(|s| !s.is_empty());
            init_logging(log_level, log_format.as_deref(), cfg.log_level.as_deref(), cfg.log_format.as_deref())?;
            node::run(cfg, node::Reloadable { args: *args, log_level_pinned: pinned })
        }
        command => {
            init_logging(log_level, log_format.as_deref(), None, None)?;
            run_command(command)
        }
    }
}

/// Installs the tracing subscriber on standard error. Level: `--log-level` (or
/// WEFT_LOG_LEVEL), else RUST_LOG, else the config file's, else `info`; format:
/// `--log-format` (or WEFT_LOG_FORMAT), else the config file's, else text.
fn init_logging(
    level: Option<String>,
    format: Option<&str>,
    file_level: Option<&str>,
    file_format: Option<&str>,
) -> Result<()> {
    let env = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let level = level.or(env).or_else(|| file_level.map(str::to_owned));
    let filter = config::log_filter(level.as_deref().unwrap_or("info"))?;
    let format: config::LogFormat = format.or(file_format).unwrap_or("text").parse()?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        config::LogFormat::Text => {
            let b = fmt.with_ansi(ansi).with_filter_reloading();
            let h = b.reload_handle();
            let _ = LOG_RELOAD.set(Box::new(move |f| h.reload(f).map_err(|e| e.to_string())));
            b.init();
        }
        config::LogFormat::Json => {
            let b = fmt.json().with_current_span(false).with_span_list(false).with_filter_reloading();
            let h = b.reload_handle();
            let _ = LOG_RELOAD.set(Box::new(move |f| h.reload(f).map_err(|e| e.to_string())));
            b.init();
        }
    }
    Ok(())
}

/// Replaces the log filter of the installed subscriber.
type Reloader = Box<dyn Fn(tracing_subscriber::EnvFilter) -> Result<(), String> + Send + Sync>;
static LOG_RELOAD: std::sync::OnceLock<Reloader> = std::sync::OnceLock::new();

/// Sets the log level of the running process (a live reload).
pub fn set_log_level(spec: &str) -> Result<(), String> {
    let filter = config::log_filter(spec).map_err(|e| e.to_string())?;
    match LOG_RELOAD.get() {
        Some(reload) => reload(filter),
        None => Err("no log subscriber installed".into()),
    }
}

fn run_command(command: Command) -> Result<()> {
    match command {
        Command::Up(args) => {
            node::run(NodeConfig::resolve(&args)?, node::Reloadable { args: *args, log_level_pinned: true })
        }
        Command::Status(q) => query(&q, show::status),
        Command::Peers(q) => query(&q, show::peers),
        Command::Routes(q) => query(&q, show::routes),
        Command::Peer(PeerCommand::Add(a)) => change(&a.control, &weft_control::Request::AddPeer { uri: a.peer }),
        Command::Peer(PeerCommand::Remove(a)) => {
            change(&a.control, &weft_control::Request::RemovePeer { peer: a.peer })
        }
        Command::Wg(WgCommand::Add(a)) => wg_add(&a),
        Command::Wg(WgCommand::List(q)) => query(&q, show::portal),
        Command::Wg(WgCommand::Remove(a)) => change(&a.control, &weft_control::Request::WgRemove { name: a.name }),
        Command::Reload(a) => change(&a.control, &weft_control::Request::Reload),
        Command::Exit(ExitCommand::Accept(a)) => change(&a.control, &weft_control::Request::AcceptExit),
        Command::Secret(SecretCommand::Generate) => {
            println!("{}", secret::generate()?);
            Ok(())
        }
        Command::Completions(a) => meta::completions(a.shell),
        Command::Man(a) => meta::man(a.command.as_deref()),
    }
}

/// Asks the node for its status and prints it as JSON or with `table`.
fn query(q: &args::QueryArgs, table: fn(&weft_control::StatusJson) -> String) -> Result<()> {
    match weft_control::request(&q.control, &weft_control::Request::Status)? {
        weft_control::Reply::Status(s) if q.json => println!("{}", serde_json::to_string_pretty(&s)?),
        weft_control::Reply::Status(s) => print!("{}", table(&s)),
        weft_control::Reply::Error { message } => {
            anyhow::bail!("node refused the request: {}", show::printable(&message))
        }
        weft_control::Reply::Done { .. } | weft_control::Reply::WgClient(_) => {
            anyhow::bail!("unexpected reply from the node")
        }
    }
    Ok(())
}

/// `weft wg add`: prints the new client's config (and a QR code of it with `--qr`).
fn wg_add(a: &args::WgAddArgs) -> Result<()> {
    match weft_control::request(&a.control, &weft_control::Request::WgAdd { name: a.name.clone() })? {
        weft_control::Reply::WgClient(c) if a.json => println!("{}", serde_json::to_string_pretty(&c)?),
        weft_control::Reply::WgClient(c) => {
            print!("{}", c.config);
            if a.qr {
                let code = qrcode::QrCode::new(c.config.as_bytes())
                    .map_err(|e| anyhow::anyhow!("cannot make a QR code of the config: {e}"))?;
                let art = code
                    .render::<qrcode::render::unicode::Dense1x2>()
                    .dark_color(qrcode::render::unicode::Dense1x2::Light)
                    .light_color(qrcode::render::unicode::Dense1x2::Dark)
                    .build();
                println!("\n{art}");
            }
            eprintln!(
                "client {} has address {}; this is the only copy of its private key",
                show::printable(&c.name),
                c.address
            );
        }
        weft_control::Reply::Error { message } => return Err(UsageError(show::printable(&message).into_owned()).into()),
        _ => anyhow::bail!("unexpected reply from the node"),
    }
    Ok(())
}

/// Sends a request that changes the node and prints what it did. A refusal is the
/// caller's bad input (exit 2).
fn change(path: &std::path::Path, req: &weft_control::Request) -> Result<()> {
    match weft_control::request(path, req)? {
        // Messages may quote peer-supplied names: no raw control characters.
        weft_control::Reply::Done { message } => println!("{}", show::printable(&message)),
        weft_control::Reply::Error { message } => return Err(UsageError(show::printable(&message).into_owned()).into()),
        weft_control::Reply::Status(_) | weft_control::Reply::WgClient(_) => {
            anyhow::bail!("unexpected reply from the node")
        }
    }
    Ok(())
}

/// Exit status for an error: 2 for bad input, 1 for everything else.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<UsageError>().is_some() { 2 } else { 1 }
}
