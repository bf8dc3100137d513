//! The control socket's server: a Unix socket (mode 0660), at most 32 clients (and 4
//! more kept for admins), one request line of at most 64 KiB each within 5 s. Reading
//! needs access to the socket; changing the node needs root or the admin group
//! ([`crate::control::access`]). What a request means is the daemon's business: the
//! server parses it, checks who asks, lets the daemon `Prepare` it off the loop and
//! hands it over with a place for the reply.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, warn};
use weft_control::{Reply, Request};

/// Where prepared requests go, each with the sender of its reply.
pub(crate) type Requests<A> = mpsc::Sender<(A, oneshot::Sender<Reply>)>;

/// Turns a parsed request into what the daemon's loop takes (parsing URIs, resolving
/// names: work that must not stall the loop), or says what is wrong with it.
pub(crate) trait Prepare: Clone + Send + Sync + 'static {
    /// What the loop takes.
    type Ask: Send + 'static;
    /// Prepares `req` on the client's task.
    fn prepare(&self, req: Request) -> impl Future<Output = Result<Self::Ask, String>> + Send;
}

pub(crate) fn bind_control(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        // A socket nobody answers on is a leftover from a crash; a live one is another node.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "control socket {} is in use: another weft node is running (pass --control to run a second one)",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("cannot remove stale control socket {}", path.display()))?;
    }
    let l = UnixListener::bind(path).with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(l)
}

/// Control connections served at once; more are closed at once.
pub const MAX_CONTROL_CLIENTS: usize = 32;

/// Further connections kept for root and the admin group, so that plain members
/// holding every slot cannot lock the admins out.
pub const ADMIN_CONTROL_RESERVE: usize = 4;

/// Longest request line.
pub(crate) const MAX_REQUEST: u64 = 64 * 1024;

/// How long a client has to send its request, and to take the reply.
pub(crate) const CONTROL_IO_LIMIT: Duration = Duration::from_secs(5);

/// Who may change the node (see [`crate::control::access`]).
#[derive(Clone)]
pub(crate) struct Admins {
    /// The admin group's name (for the refusal message).
    pub(crate) group: String,
    /// Its id, when it exists.
    pub(crate) gid: Option<u32>,
}

/// Accepts clients for ever, each on a task of its own.
pub(crate) async fn accept_loop<P: Prepare>(
    listener: UnixListener,
    requests: Requests<P::Ask>,
    admins: Admins,
    prepare: P,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONTROL_CLIENTS));
    let reserve = Arc::new(tokio::sync::Semaphore::new(ADMIN_CONTROL_RESERVE));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // A client cannot make the server wait: a full house closes the new
                // connection at once, and each slot is free again within 5 s + 5 s.
                // Root and the admin group may still use the reserve.
                let slot = match slots.clone().try_acquire_owned() {
                    Ok(s) => Ok(s),
                    Err(_) if client_of(&stream).is_some_and(|c| c.may_change(admins.gid)) => {
                        reserve.clone().try_acquire_owned()
                    }
                    Err(e) => Err(e),
                };
                let Ok(slot) = slot else {
                    debug!("control socket: too many clients; closing a new connection");
                    drop(stream);
                    continue;
                };
                let (requests, admins, prepare) = (requests.clone(), admins.clone(), prepare.clone());
                tokio::spawn(async move {
                    serve_client(stream, requests, &admins, &prepare).await;
                    drop(slot);
                });
            }
            Err(e) => {
                error!(error = %e, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The credentials of the process at the other end of `stream` (SO_PEERCRED).
fn client_of(stream: &UnixStream) -> Option<crate::control::access::Client> {
    let cred = stream.peer_cred().ok()?;
    let groups =
        cred.pid().map(|p| crate::control::access::process_groups(p, cred.uid(), cred.gid())).unwrap_or_default();
    Some(crate::control::access::Client { uid: cred.uid(), gid: cred.gid(), groups })
}

async fn serve_client<P: Prepare>(stream: UnixStream, requests: Requests<P::Ask>, admins: &Admins, prepare: &P) {
    let client = client_of(&stream);
    let (r, mut w) = stream.into_split();
    // One request line, at most 64 KiB, within 5 s: a client that never sends a
    // newline is cut off.
    let mut lines = BufReader::new(r.take(MAX_REQUEST)).lines();
    let read = tokio::time::timeout(CONTROL_IO_LIMIT, lines.next_line()).await;
    let reply = match read {
        Ok(Ok(Some(line))) => match serde_json::from_str::<Request>(&line) {
            Ok(req) if req.changes_node() && !client.as_ref().is_some_and(|c| c.may_change(admins.gid)) => {
                // At most one warning every 10 s: a local client must not flood the log.
                static LAST_WARNING: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
                let now = Instant::now();
                let mut last = LAST_WARNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10)) {
                    *last = Some(now);
                    warn!(client = ?client, "control request refused: changing the node needs root or the admin group");
                } else {
                    debug!(client = ?client, "control request refused");
                }
                Reply::Error { message: crate::control::access::refusal(&admins.group) }
            }
            Ok(req) => match prepare.prepare(req).await {
                Ok(a) => {
                    let (tx, rx) = oneshot::channel();
                    if requests.send((a, tx)).await.is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(r) => r,
                        Err(_) => return,
                    }
                }
                Err(message) => Reply::Error { message },
            },
            Err(e) => Reply::Error { message: format!("bad request: {e}") },
        },
        _ => return,
    };
    if let Ok(mut text) = serde_json::to_string(&reply) {
        text.push('\n');
        // A client that does not read its reply loses it, and its slot.
        let _ = tokio::time::timeout(CONTROL_IO_LIMIT, w.write_all(text.as_bytes())).await;
    }
}
