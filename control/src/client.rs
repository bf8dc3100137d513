//! The client end: one request, one reply.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use crate::{Reply, Request};

/// Why a request got no reply.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot connect to control socket {}: {source}{}", path.display(), hint(source))]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What connect said.
        source: std::io::Error,
    },
    /// Writing the request or reading the reply failed (or timed out).
    #[error("no reply from the node: {0}")]
    Io(#[from] std::io::Error),
    /// The node hung up without a reply.
    #[error("the node closed the control connection without replying")]
    Closed,
    /// The reply was not one this client understands.
    #[error("malformed reply from the node: {0}")]
    Malformed(#[from] serde_json::Error),
}

fn hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => " (is `weft up` running?)",
        ErrorKind::PermissionDenied => " (run as root or as a member of the socket's group)",
        _ => "",
    }
}

/// Sends one request to the node at `path` and returns its reply (5 s timeout).
pub fn request(path: &Path, req: &Request) -> Result<Reply, ClientError> {
    let mut s = UnixStream::connect(path).map_err(|source| ClientError::Connect { path: path.to_owned(), source })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    if reply.is_empty() {
        return Err(ClientError::Closed);
    }
    Ok(serde_json::from_str(&reply)?)
}
