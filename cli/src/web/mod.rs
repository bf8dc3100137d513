//! `weft web`: the web console, a process beside the node. It asks the node over the
//! control socket (as `weft status` and weft-gui do, with the rights of the user who
//! runs it) and serves pages and a JSON API over HTTP (axum on hyper), or HTTPS
//! (rustls) on anything but loopback. Logins follow Jupyter's model: a random token in
//! the printed address buys a session cookie (`session.rs`). With `--authority-key` it
//! also signs (through `commands::authority`, the code of `weft authority`), and the
//! key never leaves this process.
//!
//! ```text
//!  browser --HTTP(S)--> routes (login, headers, CSRF) --> api / actions
//!                                                            |  control socket
//!                                                            v
//!                                                       weft up (the node)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tracing::{info, warn};

use crate::commands::authority::parse_duration;
use crate::config::args::WebArgs;
use crate::config::values::{Secret, UsageError, check_private};

pub(crate) mod actions;
pub(crate) mod routes;
pub(crate) mod serve;
pub(crate) mod session;
pub(crate) mod settings;
pub(crate) mod snapshot;
#[cfg(test)]
mod tests;

/// What the console holds: where the node is, the logins, and the authority's key when
/// it was given.
pub struct Console {
    /// The node's control socket.
    pub(crate) control: PathBuf,
    /// The login token and its sessions.
    pub(crate) sessions: parking_lot::Mutex<session::Sessions>,
    /// The authority's key and its file (the ledger lives beside it).
    pub(crate) authority: Option<(weft_core::cert::AuthorityKey, PathBuf)>,
    /// The network secret, which invites carry.
    pub(crate) secret: Option<Secret>,
    /// Whether it serves HTTPS (the cookie is then `Secure`).
    pub(crate) tls: bool,
    /// The node's status, shared by every page and event stream for a second.
    pub(crate) snapshot: snapshot::Snapshot,
}

impl Console {
    /// A console for the node at `control`, logins with `token` lasting `lifetime`.
    pub fn new(control: PathBuf, token: String, lifetime: Duration) -> Self {
        Self {
            snapshot: snapshot::Snapshot::new(control.clone()),
            control,
            sessions: parking_lot::Mutex::new(session::Sessions::new(token, lifetime)),
            authority: None,
            secret: None,
            tls: false,
        }
    }

    /// Gives the console the authority's key (its file: the ledger lives beside it).
    pub fn with_authority(mut self, key: weft_core::cert::AuthorityKey, path: PathBuf) -> Self {
        self.authority = Some((key, path));
        self
    }

    /// Gives the console the network secret, which invites carry.
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// The console's routes, for a server or a test.
    pub fn router(self) -> axum::Router {
        routes::router(Arc::new(self))
    }
}

/// Runs `weft web` until SIGINT or SIGTERM.
pub fn run(args: &WebArgs) -> Result<()> {
    let a = settings::Settings::of(args)?;
    let listen: SocketAddr = a.listen.parse().map_err(|_| {
        UsageError(format!("invalid listen address {:?}: expected ADDR:PORT such as 127.0.0.1:8787", a.listen))
    })?;
    let tls = match &a.tls {
        Some((c, k)) => Some(serve::tls_config(c, k)?),
        None => None,
    };
    if !listen.ip().is_loopback() && tls.is_none() {
        if !a.insecure_http {
            return Err(UsageError(format!(
                "--listen {listen} is not a loopback address: give --tls-cert and --tls-key, or --insecure-http to send the login over plain HTTP"
            ))
            .into());
        }
        warn!(%listen, "serving the console over plain HTTP on a non-loopback address (--insecure-http): the login token and session cookie cross the network in the clear");
    }
    let lifetime = Duration::from_secs(parse_duration(&a.session_lifetime)?);
    let token = match &a.token_file {
        Some(f) => token_from_file(f)?,
        None => session::hex(&session::random32()),
    };
    let mut console = Console::new(a.control.clone(), token.clone(), lifetime);
    console.tls = tls.is_some();
    if let Some(k) = &a.authority_key {
        let key = crate::daemon::state::load_key(k)?;
        info!(authority = %key.id(), "the console signs with the authority key (policies, invites, revocations)");
        console = console.with_authority(key, k.clone());
    }
    if let Some(s) = &a.network_secret {
        console = console.with_secret(s.clone());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("weft-web")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| UsageError(format!("cannot listen on {listen}: {e}")))?;
        let bound = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let host = if bound.ip().is_unspecified() { "127.0.0.1".to_owned() } else { bound.ip().to_string() };
        let host = if bound.is_ipv6() && !bound.ip().is_unspecified() { format!("[{host}]") } else { host };
        // The one line to open (Jupyter's): the token buys a session cookie.
        println!("{scheme}://{host}:{}/?token={token}", bound.port());
        info!(%bound, control = %a.control.display(), "web console serving");
        serve::serve(listener, console.router(), tls).await
    })
}

/// The token kept in `f` (mode 0600), made and written there when the file is absent.
fn token_from_file(f: &Path) -> Result<String> {
    match std::fs::read_to_string(f) {
        Ok(t) => {
            check_private(f, "token file", "")?;
            let t = t.trim().to_owned();
            if t.len() < 16 || !t.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(UsageError(format!(
                    "token file {}: expected one line of at least 16 letters, digits, '-' or '_'",
                    f.display()
                ))
                .into());
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let t = session::hex(&session::random32());
            let mut w = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(f)
                .with_context(|| format!("cannot write token file {}", f.display()))?;
            w.write_all(format!("{t}\n").as_bytes())?;
            w.sync_all()?;
            info!(file = %f.display(), "made a login token and kept it");
            Ok(t)
        }
        Err(e) => Err(UsageError(format!("cannot read token file {}: {e}", f.display())).into()),
    }
}
