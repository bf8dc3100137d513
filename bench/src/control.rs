//! A simulated node's control socket (`meshsim --control PATH`): node 0 of a converged
//! [`sim::Net`] answers `weft status` on a Unix socket while the virtual clock keeps
//! pace with the wall clock and node 0 sends a little traffic to its members in turn.
//! `weft web`, `weft status` and `weft peers` pointed at it see a mesh of hundreds of
//! real engines without starting any of them (bench/web/cost.sh measures the console
//! that way).
//!
//! It answers status only (the engine's part of it, [`weft::daemon::status::engine_json`],
//! with the node's name and addresses); any other request gets an error reply.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use weft_control::{Reply, Request, StatusJson};

use crate::sim::{self, Net};

/// How often the clock is advanced and the socket looked at.
const TICK: Duration = Duration::from_millis(50);
/// Packets node 0 sends per tick, to one member after another.
const PACKETS_PER_TICK: usize = 4;

/// What serving did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Served {
    /// Status requests answered.
    pub status: u64,
    /// Other requests, refused.
    pub refused: u64,
    /// Virtual time the mesh ran while serving.
    pub ran: Duration,
}

/// Node 0's status as its control socket gives it.
pub fn status(net: &Net) -> StatusJson {
    let st = net.status(0);
    StatusJson {
        network_name: sim::NET.to_owned(),
        hostname: "sim-0".to_owned(),
        overlay: format!("{}/16", sim::overlay(0)),
        cipher: "aes-128-gcm".to_owned(),
        listeners: vec![sim::addr(0).to_string()],
        dev_name: "sim0".to_owned(),
        threads: 1,
        uptime_secs: net.now_ms / 1000,
        ..weft::daemon::status::engine_json(&st, net.now())
    }
}

/// Serves node 0's status at `path` for `limit` (wall time), then removes the socket.
/// A socket left at `path` (by an earlier run) is replaced; anything else there is
/// refused, not removed.
pub fn serve(net: &mut Net, path: &Path, limit: Duration) -> std::io::Result<Served> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    listener.set_nonblocking(true)?;
    let start = Instant::now();
    let mut last = start;
    let mut served = Served::default();
    let mut next_member = 1;
    while start.elapsed() < limit {
        let step = last.elapsed().min(Duration::from_secs(1));
        last = Instant::now();
        if net.n() > 1 {
            net.send_data(0, next_member, PACKETS_PER_TICK, Duration::ZERO);
            next_member = next_member % (net.n() - 1) + 1;
        }
        net.run_for(step);
        served.ran += step;
        loop {
            match listener.accept() {
                Ok((conn, _)) => match answer(net, conn) {
                    Ok(true) => served.status += 1,
                    Ok(false) => served.refused += 1,
                    Err(e) => eprintln!("meshsim: control connection: {e}"),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        std::thread::sleep(TICK.saturating_sub(last.elapsed()));
    }
    std::fs::remove_file(path)?;
    Ok(served)
}

/// Reads one request from `conn` and answers it; true when it was a status request.
fn answer(net: &Net, conn: UnixStream) -> std::io::Result<bool> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let (reply, ok) = match serde_json::from_str::<Request>(&line) {
        Ok(Request::Status) => (Reply::Status(Box::new(status(net))), true),
        Ok(_) => (Reply::Error { message: "the simulated node answers status only".to_owned() }, false),
        Err(e) => (Reply::Error { message: format!("malformed request: {e}") }, false),
    };
    let mut text = serde_json::to_string(&reply).map_err(std::io::Error::other)?;
    text.push('\n');
    (&conn).write_all(text.as_bytes())?;
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Plan;

    #[test]
    fn the_simulated_node_answers_status_with_every_member_and_refuses_the_rest() {
        let (mut net, _) = sim::run(Plan::new(6, 7), Duration::from_secs(120), Duration::from_secs(1)).unwrap();
        let dir = std::env::temp_dir().join(format!("meshsim-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("weft.sock");
        let client = {
            let path = path.clone();
            std::thread::spawn(move || {
                while !path.exists() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let status = weft_control::request(&path, &Request::Status).unwrap();
                let other = weft_control::request(&path, &Request::Reload).unwrap();
                (status, other)
            })
        };
        let served = serve(&mut net, &path, Duration::from_millis(1500)).unwrap();
        let (status, other) = client.join().unwrap();
        let Reply::Status(s) = status else { panic!("{status:?}") };
        assert_eq!(s.peers.len(), 5, "{:?}", s.peers);
        assert_eq!(s.hostname, "sim-0");
        assert!(matches!(other, Reply::Error { .. }), "{other:?}");
        assert_eq!((served.status, served.refused), (1, 1));
        assert!(served.ran >= Duration::from_secs(1), "the clock kept pace: {:?}", served.ran);
        assert!(!path.exists(), "the socket is removed");
        // A file that is not a socket is left alone, with an error naming it.
        std::fs::write(&path, "keep me").unwrap();
        let e = serve(&mut net, &path, Duration::from_millis(10)).unwrap_err();
        assert!(e.to_string().contains("is not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
