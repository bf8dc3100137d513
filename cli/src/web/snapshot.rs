//! The node's status as the console shows it: asked over the control socket (on a
//! blocking thread: the client is synchronous) at most once a second, shared by every
//! page and event stream.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weft_control::{Reply, Request, StatusJson};

/// How long one answer of the node serves every reader.
const FRESH: Duration = Duration::from_millis(900);

/// The last status and when it came.
#[derive(Debug)]
pub(crate) struct Snapshot {
    control: PathBuf,
    last: tokio::sync::Mutex<Option<(Instant, Arc<StatusJson>)>>,
}

impl Snapshot {
    pub(crate) fn new(control: PathBuf) -> Self {
        Self { control, last: tokio::sync::Mutex::new(None) }
    }

    /// The node's status, at most [`FRESH`] old (readers wait for one request).
    pub(crate) async fn status(&self) -> Result<Arc<StatusJson>, String> {
        let mut last = self.last.lock().await;
        if let Some((at, s)) = last.as_ref()
            && at.elapsed() < FRESH
        {
            return Ok(s.clone());
        }
        let s = match ask(&self.control, Request::Status).await? {
            Reply::Status(s) => Arc::new(*s),
            Reply::Error { message } => return Err(format!("the node refused: {message}")),
            Reply::Done { .. } | Reply::WgClient(_) => return Err("unexpected reply from the node".into()),
        };
        *last = Some((Instant::now(), s.clone()));
        Ok(s)
    }

    /// Forgets the cached status (after a change, so the next page shows it).
    pub(crate) async fn invalidate(&self) {
        *self.last.lock().await = None;
    }
}

/// Sends `req` to the node on a blocking thread.
pub(crate) async fn ask(control: &std::path::Path, req: Request) -> Result<Reply, String> {
    let control = control.to_owned();
    tokio::task::spawn_blocking(move || weft_control::request(&control, &req))
        .await
        .map_err(|e| format!("the control request did not finish: {e}"))?
        .map_err(|e| e.to_string())
}
