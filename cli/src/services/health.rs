//! `--proxy-health`: a subnet router checks a target on its LAN side every second (a
//! ping, or a TCP connection) and withdraws its subnets from the mesh while the check
//! fails, so that members move to another router of the same subnet instead of
//! sending into a router that is up but cut off from its LAN.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::config::values::HealthTarget;

/// A check runs this often.
const EVERY: Duration = Duration::from_secs(1);
/// A check fails when no answer came within this.
const TIMEOUT: Duration = Duration::from_millis(800);
/// Failures in a row that withdraw the subnets.
pub const FAILS_TO_WITHDRAW: u32 = 3;
/// Passes in a row that announce them again.
pub const PASSES_TO_RETURN: u32 = 2;

/// The verdict of consecutive checks: withdrawn after [`FAILS_TO_WITHDRAW`] failures
/// in a row, announced again after [`PASSES_TO_RETURN`] passes in a row (a single
/// lost ping moves nothing).
#[derive(Debug, Default)]
pub struct Verdict {
    fails: u32,
    passes: u32,
    withdrawn: Option<String>,
}

impl Verdict {
    /// Takes one check's result; returns the new state when it changed (`Some(None)`:
    /// announce again, `Some(Some(why))`: withdraw).
    pub fn take(&mut self, result: Result<(), String>) -> Option<Option<String>> {
        match result {
            Ok(()) => {
                self.fails = 0;
                self.passes += 1;
                if self.withdrawn.is_some() && self.passes >= PASSES_TO_RETURN {
                    self.withdrawn = None;
                    return Some(None);
                }
            }
            Err(e) => {
                self.passes = 0;
                self.fails += 1;
                if self.withdrawn.is_none() && self.fails >= FAILS_TO_WITHDRAW {
                    let why = format!("health check failing ({} in a row): {e}", self.fails);
                    self.withdrawn = Some(why.clone());
                    return Some(Some(why));
                }
            }
        }
        None
    }
}

/// Starts checking `target` on a thread of its own (`weft-health`); the receiver
/// holds why the subnets are withdrawn (`None`: healthy). The thread ends when the
/// receiver is dropped.
pub fn spawn(target: HealthTarget) -> std::io::Result<watch::Receiver<Option<String>>> {
    let (tx, rx) = watch::channel(None);
    std::thread::Builder::new().name("weft-health".into()).spawn(move || {
        let mut verdict = Verdict::default();
        let mut seq: u16 = 0;
        loop {
            let started = Instant::now();
            seq = seq.wrapping_add(1);
            let result = check(target, seq);
            if let Err(e) = &result {
                debug!(%target, "health check failed: {e}");
            }
            if let Some(state) = verdict.take(result) {
                if let Some(why) = &state {
                    warn!(%target, "{why}: proxied subnets withdrawn");
                }
                if tx.send(state).is_err() {
                    return;
                }
            }
            if tx.is_closed() {
                return;
            }
            std::thread::sleep(EVERY.saturating_sub(started.elapsed()));
        }
    })?;
    Ok(rx)
}

/// One check.
pub fn check(target: HealthTarget, seq: u16) -> Result<(), String> {
    match target {
        HealthTarget::Tcp(sa) => match TcpStream::connect_timeout(&sa, TIMEOUT) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::TimedOut => Err(format!("no answer from {sa} within {TIMEOUT:?}")),
            Err(e) => Err(format!("TCP {sa}: {e}")),
        },
        HealthTarget::Icmp(a) => ping(a, seq),
    }
}

/// Sends one ICMP (or ICMPv6) echo request to `a` on a raw socket and waits for its
/// reply (same identifier and sequence, from `a`).
fn ping(a: IpAddr, seq: u16) -> Result<(), String> {
    let (domain, proto, request, reply) = match a {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128u8, 129u8),
    };
    let sock = Socket::new(domain, Type::RAW, Some(proto)).map_err(|e| format!("ICMP socket: {e} (needs root)"))?;
    // Datagram calls (sendto, recvfrom) on the raw socket.
    let sock = UdpSocket::from(sock);
    sock.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    let id = (std::process::id() as u16) ^ 0x5746;
    let mut msg = vec![request, 0, 0, 0];
    msg.extend_from_slice(&id.to_be_bytes());
    msg.extend_from_slice(&seq.to_be_bytes());
    msg.extend_from_slice(b"weft-health-check");
    // ICMPv6's checksum covers a pseudo-header: the kernel fills it in.
    if a.is_ipv4() {
        let sum = weft_core::wire::checksum(&msg, 0);
        msg[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    sock.send_to(&msg, SocketAddr::new(a, 0)).map_err(|e| format!("ping {a}: {e}"))?;
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("ping {a}: {e}")),
        };
        let got = &buf[..n];
        if from.ip() != a {
            continue;
        }
        // A raw IPv4 socket hands over the IP header too.
        let icmp = if a.is_ipv4() {
            let ihl = usize::from(got.first().map_or(0, |b| b & 0x0f)) * 4;
            got.get(ihl..).unwrap_or_default()
        } else {
            got
        };
        if icmp.len() >= 8 && icmp[0] == reply && icmp[4..6] == id.to_be_bytes() && icmp[6..8] == seq.to_be_bytes() {
            return Ok(());
        }
    }
    Err(format!("no echo reply from {a} within {TIMEOUT:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failure_moves_nothing_three_withdraw_two_passes_return() {
        let mut v = Verdict::default();
        let fail = || Err("no echo reply".to_owned());
        assert_eq!(v.take(fail()), None);
        assert_eq!(v.take(Ok(())), None, "a pass resets the count");
        assert_eq!(v.take(fail()), None);
        assert_eq!(v.take(fail()), None);
        let withdrawn = v.take(fail()).expect("third failure in a row withdraws");
        assert!(withdrawn.unwrap().contains("3 in a row"));
        assert_eq!(v.take(fail()), None, "said once");
        assert_eq!(v.take(Ok(())), None, "one pass is not enough");
        assert_eq!(v.take(fail()), None);
        assert_eq!(v.take(Ok(())), None);
        assert_eq!(v.take(Ok(())), Some(None), "two passes in a row announce again");
    }

    #[test]
    fn a_closed_tcp_port_on_loopback_fails_and_an_open_one_passes() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap();
        assert_eq!(check(HealthTarget::Tcp(open), 1), Ok(()));
        drop(l);
        let e = check(HealthTarget::Tcp(open), 2).unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }
}
