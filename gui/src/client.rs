//! The worker thread that talks to the node's control socket.
//!
//! All socket I/O happens here, never on the UI thread: the worker polls
//! `Request::Status` every [`POLL_INTERVAL`], carries out the actions the window sends
//! through a channel, and publishes the outcome into [`State`] behind a mutex that it
//! holds only to copy results in. The window locks it once a frame to read.
//!
//! ```text
//!  UI thread ──Request (mpsc)──► worker ──weft_control::request──► node socket
//!      ▲                           │
//!      └──── State (Mutex) ◄───────┘  + repaint callback
//! ```

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use weft_control::{self, Reply, Request, StatusJson};

use crate::model::History;

/// How often the worker asks for status.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How many action outcomes the window keeps.
const OUTCOMES_KEPT: usize = 4;

/// What the window knows, written by the worker.
#[derive(Debug, Default)]
pub struct State {
    /// The connection to the node.
    pub link: Link,
    /// The latest status, while the node answers.
    pub status: Option<Arc<StatusJson>>,
    /// Snapshots of the last minutes, for rates and the plot.
    pub history: History,
    /// Outcomes of actions, oldest first.
    pub outcomes: Vec<Outcome>,
}

/// The state of the connection to the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Link {
    /// No answer yet.
    #[default]
    Connecting,
    /// The last status request was answered.
    Up,
    /// The last status request failed.
    Down(Problem),
}

/// Why the node cannot be reached, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// No socket at the path, or nothing listening on it.
    NoNode {
        /// The error as the client saw it.
        detail: String,
    },
    /// The socket exists but this user may not connect.
    Permission {
        /// The socket's group, when it has a name.
        group: Option<String>,
        /// The error as the client saw it.
        detail: String,
    },
    /// Anything else: a timeout, a malformed reply, an error reply.
    Failed {
        /// The error.
        detail: String,
    },
}

impl Problem {
    /// One line saying what is wrong.
    pub fn headline(&self) -> &'static str {
        match self {
            Self::NoNode { .. } => "No Weft node is running here",
            Self::Permission { .. } => "Permission denied on the control socket",
            Self::Failed { .. } => "The node did not answer properly",
        }
    }

    /// What to do about it.
    pub fn advice(&self) -> String {
        match self {
            Self::NoNode { .. } => "Start one with `sudo systemctl enable --now weft` (after setting network-name, \
                                    network-secret and ipv4 in /etc/weft/weft.toml) or `sudo weft up …`, or point \
                                    weft-gui at another socket with --control PATH."
                .to_owned(),
            Self::Permission { group, .. } => {
                let group = group.as_deref().unwrap_or("weft");
                format!(
                    "Run weft-gui as root, or join the socket's group `{group}`: \
                     `sudo usermod -aG {group} $USER`, then log out and in again."
                )
            }
            Self::Failed { .. } => "Retrying; if this persists, check the node's log (journalctl -u weft).".to_owned(),
        }
    }

    /// The underlying error text.
    pub fn detail(&self) -> &str {
        match self {
            Self::NoNode { detail } | Self::Permission { detail, .. } | Self::Failed { detail } => detail,
        }
    }
}

/// The result of one action, as the node reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What was asked, e.g. `add-peer udp://192.0.2.1:11010`.
    pub action: String,
    /// Whether the node carried it out.
    pub ok: bool,
    /// The node's message, or why it could not be asked.
    pub message: String,
}

/// The window's handle on the worker. Dropping it stops the worker after its current
/// request.
#[derive(Debug)]
pub struct Client {
    control: PathBuf,
    state: Arc<Mutex<State>>,
    actions: Sender<Request>,
}

impl Client {
    /// Starts the worker for the socket at `control`; it calls `repaint` after every
    /// change of [`State`].
    pub fn spawn(control: PathBuf, repaint: impl Fn() + Send + 'static) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let (actions, rx) = mpsc::channel();
        let worker =
            Worker { control: control.clone(), state: Arc::clone(&state), actions: rx, repaint: Box::new(repaint) };
        std::thread::Builder::new()
            .name("weft-gui-control".into())
            .spawn(move || worker.run())
            .unwrap_or_else(|e| panic!("cannot start the control thread: {e}")); // only fails when out of memory/threads
        Self { control, state, actions }
    }

    /// The socket path.
    pub fn control(&self) -> &Path {
        &self.control
    }

    /// Locks the state for reading; hold it only for the span of one frame's copy.
    pub fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Queues an action (add-peer, remove-peer) for the worker.
    pub fn send(&self, req: Request) {
        // The worker outlives every Client (it ends only when the sender is dropped).
        let _ = self.actions.send(req);
    }
}

struct Worker {
    control: PathBuf,
    state: Arc<Mutex<State>>,
    actions: Receiver<Request>,
    repaint: Box<dyn Fn() + Send>,
}

impl Worker {
    fn run(self) {
        let mut next_poll = Instant::now();
        loop {
            match self.actions.recv_timeout(next_poll.saturating_duration_since(Instant::now())) {
                Ok(req) => {
                    let outcome = self.act(&req);
                    let mut st = lock(&self.state);
                    st.outcomes.push(outcome);
                    let excess = st.outcomes.len().saturating_sub(OUTCOMES_KEPT);
                    st.outcomes.drain(..excess);
                    drop(st);
                    // Show the effect at once.
                    next_poll = Instant::now();
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.poll();
                    next_poll = Instant::now() + POLL_INTERVAL;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
            (self.repaint)();
        }
    }

    fn poll(&self) {
        let reply = match weft_control::request(&self.control, &Request::Status) {
            Ok(Reply::Status(status)) => Ok(status),
            Ok(other) => Err(Problem::Failed { detail: format!("unexpected reply to status: {other:?}") }),
            Err(e) => Err(diagnose(&self.control, &format!("{e:#}"))),
        };
        let at = Instant::now();
        let mut st = lock(&self.state);
        match reply {
            Ok(status) => {
                st.history.push(at, &status);
                st.status = Some(Arc::from(status));
                st.link = Link::Up;
            }
            Err(problem) => {
                // Stale numbers would mislead: show the problem alone until the node is back.
                st.status = None;
                st.history.clear();
                st.link = Link::Down(problem);
            }
        }
    }

    fn act(&self, req: &Request) -> Outcome {
        let action = match req {
            Request::Status => "status".to_owned(),
            Request::AddPeer { uri } => format!("add-peer {uri}"),
            Request::RemovePeer { peer } => format!("remove-peer {peer}"),
            Request::WgAdd { name } => format!("wg-add {name}"),
            Request::WgRemove { name } => format!("wg-remove {name}"),
            Request::Reload => "reload".to_owned(),
            Request::AcceptExit => "exit accept".to_owned(),
            Request::AddRevocation { .. } => "revoke add".to_owned(),
            Request::ExplainPolicy { from, to, .. } => format!("policy explain {from} {to}"),
            Request::PushPolicy { .. } => "policy push".to_owned(),
        };
        let (ok, message) = match weft_control::request(&self.control, req) {
            Ok(Reply::Done { message }) => (true, message),
            Ok(Reply::Error { message }) => (false, message),
            Ok(Reply::Status(_)) => (true, "status received".to_owned()),
            Ok(Reply::WgClient(c)) => (true, format!("WireGuard client {} added at {}", c.name, c.address)),
            Err(e) => (false, format!("{e:#}")),
        };
        Outcome { action, ok, message }
    }
}

/// Works out why a request to `path` failed, so the window can say what to do.
fn diagnose(path: &Path, detail: &str) -> Problem {
    let detail = detail.to_owned();
    match std::fs::metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => Problem::NoNode { detail },
        // A directory on the way (e.g. /run/weft, mode 0750) is closed to us.
        Err(e) if e.kind() == ErrorKind::PermissionDenied => Problem::Permission { group: None, detail },
        Err(_) => Problem::Failed { detail },
        Ok(meta) if !meta.file_type().is_socket() => {
            Problem::Failed { detail: format!("{} is not a socket", path.display()) }
        }
        // The request's error text is for people; the connect error kind says which case
        // this is. A successful connect here just means the node is busy or answered
        // badly; the node drops a connection that sends nothing.
        Ok(meta) => match UnixStream::connect(path) {
            Err(e) if e.kind() == ErrorKind::PermissionDenied => {
                Problem::Permission { group: group_name(meta.gid()), detail }
            }
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) => {
                Problem::NoNode { detail }
            }
            _ => Problem::Failed { detail },
        },
    }
}

/// The name of group `gid` from /etc/group.
fn group_name(gid: u32) -> Option<String> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    group_name_in(&groups, gid)
}

fn group_name_in(groups: &str, gid: u32) -> Option<String> {
    groups.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let id: u32 = f.nth(1)?.parse().ok()?;
        (id == gid).then(|| name.to_owned())
    })
}

/// Locks the state; a panic elsewhere while holding it leaves plain data worth showing.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn group_names_from_etc_group() {
        let groups = "root:x:0:\nweft:x:998:alice,bob\nbroken\n";
        assert_eq!(group_name_in(groups, 998).as_deref(), Some("weft"));
        assert_eq!(group_name_in(groups, 0).as_deref(), Some("root"));
        assert_eq!(group_name_in(groups, 5), None);
    }

    #[test]
    fn a_missing_socket_means_no_node() {
        let p = std::env::temp_dir().join(format!("weft-gui-none-{}.sock", std::process::id()));
        assert_eq!(diagnose(&p, "x"), Problem::NoNode { detail: "x".into() });
    }

    #[test]
    fn a_stale_socket_means_no_node_and_a_file_is_not_a_socket() {
        let dir = std::env::temp_dir().join(format!("weft-gui-diag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let sock = dir.join("stale.sock");
        let _ = std::fs::remove_file(&sock);
        // Bound, then closed: the file stays, nobody listens.
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap_or_else(|e| panic!("{e}")));
        // Another test of this process forking then (the setpriv below) holds a copy
        // of the listener until its exec: the socket may answer for that moment.
        let mut stale = diagnose(&sock, "refused");
        for _ in 0..50 {
            if matches!(stale, Problem::NoNode { .. }) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            stale = diagnose(&sock, "refused");
        }
        assert!(matches!(stale, Problem::NoNode { .. }), "{stale:?}");
        let file = dir.join("plain");
        std::fs::write(&file, b"").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(diagnose(&file, "x"), Problem::Failed { detail } if detail.contains("not a socket")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// As root, runs itself again as `nobody` (setpriv) against a socket of mode 0660
    /// owned by root's group: the connect is refused and the problem names the group.
    #[test]
    fn permission_denied_names_the_sockets_group() {
        if let Some(sock) = std::env::var_os("WEFT_GUI_TEST_SOCKET_AS_NOBODY") {
            let problem = diagnose(Path::new(&sock), "denied");
            assert_eq!(problem, Problem::Permission { group: Some("root".into()), detail: "denied".into() });
            return;
        }
        let root = std::fs::read_to_string("/proc/self/status")
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")));
        if !root {
            eprintln!("skipped: needs root to run a copy of itself as nobody");
            return;
        }
        let dir = std::env::temp_dir().join(format!("weft-gui-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let sock = dir.join("node.sock");
        let _ = std::fs::remove_file(&sock);
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o660)).unwrap_or_else(|e| panic!("{e}"));
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .args(["--exact", "client::tests::permission_denied_names_the_sockets_group", "--nocapture"])
            .env("WEFT_GUI_TEST_SOCKET_AS_NOBODY", &sock)
            .output()
            .unwrap_or_else(|e| panic!("setpriv: {e}"));
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "as nobody: {text}");
    }

    #[test]
    fn every_problem_says_what_to_do() {
        let p = Problem::Permission { group: Some("weft".into()), detail: String::new() };
        assert!(p.advice().contains("usermod -aG weft"));
        assert!(Problem::NoNode { detail: String::new() }.advice().contains("weft up"));
    }
}
