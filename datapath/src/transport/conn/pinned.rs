//! UDP sockets of their own towards one endpoint: the hard side of the birthday
//! method (docs/nat-traversal.md). Behind an endpoint-dependent NAT every fresh socket
//! sending to the other side gets a mapping of its own; the socket whose mapping the
//! other side's probes hit carries the path from then on, registered like a
//! connection under the (UDP) endpoint.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tracing::debug;

use super::{Connector, IDLE_TIMEOUT};
use crate::transport::connections::Inbound;
use crate::transport::{Endpoint, frame};

/// The largest datagram read.
const MAX_DATAGRAM: usize = 65_535;

/// Sets of sockets open at once, whoever asks (each up to 256 sockets for a few
/// seconds): members asking more often than that cannot run the node out of file
/// descriptors.
pub(super) const MAPPING_SETS: usize = 4;

/// How a set's keepalives go out: `burst` at once, one burst every `every` (so a
/// set of 256 never leaves as one burst through the NAT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Keepalives sent back to back.
    pub burst: usize,
    /// The time between bursts.
    pub every: Duration,
}

/// Counts an open set of sockets; uncounted on drop.
struct SetSlot<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for SetSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A fresh unconnected UDP socket on an ephemeral port, marked like the node's others.
/// Whether `d` has the shape of a sealed data message (type, header and tag), the
/// only thing the easy side's probes are.
fn sealed_shape(d: &[u8]) -> bool {
    d.len() >= weft_core::wire::DATA_HEADER_LEN + weft_core::crypto::TAG_LEN
        && d.first() == Some(&(weft_core::wire::MessageType::Data as u8))
}

fn fresh_socket(v4: bool) -> std::io::Result<UdpSocket> {
    let bind: SocketAddr = if v4 { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
    let s = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
    crate::transport::mark_socket(&s)?;
    s.set_nonblocking(true)?;
    s.bind(&bind.into())?;
    UdpSocket::from_std(s.into())
}

impl Connector {
    /// Sends each of `datagrams` from a fresh socket of its own to `to` and waits up to
    /// `hold` for the first datagram from `to` on any of them. That socket becomes the
    /// path to `to` (what goes to `to` leaves from it; what it receives goes to the
    /// connection RX threads like a connection's frames, the first datagram with it);
    /// the others close. Returns whether one answered. The datagrams go at `pace`;
    /// `hold` counts from the last.
    /// At most `MAPPING_SETS` (4) sets are open at once; a request beyond that is dropped.
    pub async fn open_mappings(self, to: Endpoint, datagrams: Vec<Vec<u8>>, pace: Pace, hold: Duration) -> bool {
        let sets = &self.inner.mapping_sets;
        if sets.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= MAPPING_SETS {
            sets.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            debug!(%to, "too many mapping sets open; this one is not opened");
            return false;
        }
        let inner = self.inner.clone();
        let _slot = SetSlot(&inner.mapping_sets);
        let opened = tokio::time::Instant::now();
        let mut waiting = tokio::task::JoinSet::new();
        for (i, d) in datagrams.into_iter().enumerate() {
            if i > 0 && i % pace.burst.max(1) == 0 {
                tokio::time::sleep(pace.every).await;
            }
            let sock = match fresh_socket(to.addr.is_ipv4()) {
                Ok(s) => s,
                Err(e) => {
                    debug!(%to, error = %e, "cannot open a socket for a mapping");
                    break;
                }
            };
            if let Err(e) = sock.send_to(&d, to.addr).await {
                debug!(%to, error = %e, "mapping send failed");
                continue;
            }
            waiting.spawn(async move {
                let mut buf = vec![0u8; MAX_DATAGRAM];
                loop {
                    match sock.recv_from(&mut buf).await {
                        // Only the endpoint it sent to (its NAT lets nothing else in
                        // anyway), and only a sealed data message's shape: whatever
                        // else arrives there pins nothing (the RX thread still
                        // authenticates what the pinned socket delivers).
                        Ok((n, from)) if from == to.addr && sealed_shape(&buf[..n]) => {
                            buf.truncate(n);
                            return Some((sock, buf));
                        }
                        Ok(_) => {}
                        Err(_) => return None,
                    }
                }
            });
        }
        let deadline = tokio::time::Instant::now() + hold;
        loop {
            match tokio::time::timeout_at(deadline, waiting.join_next()).await {
                Ok(Some(Ok(Some((sock, first))))) => {
                    waiting.abort_all();
                    {
                        // Sets overlap (a round asks for a new one before the last
                        // closed): when both are hit, the first hit keeps the path. The
                        // other side answers the socket it heard first, so moving the
                        // path to this one would leave its packets for a closed port.
                        let mut pinned = inner.pinned_at.lock();
                        pinned.retain(|_, at| at.elapsed() < IDLE_TIMEOUT);
                        if pinned.get(&to).is_some_and(|at| *at >= opened) && inner.conns.contains(&to) {
                            debug!(%to, "a mapping was hit after another set's was: this one closes");
                            return true;
                        }
                        pinned.insert(to, tokio::time::Instant::now());
                    }
                    debug!(%to, local = ?sock.local_addr().ok(), "a mapping was hit: the path leaves from its socket");
                    tokio::spawn(self.run_pinned(sock, to, first));
                    return true;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return false,
            }
        }
    }

    /// Carries the path to `to` over `sock` until it is silent for [`IDLE_TIMEOUT`] or
    /// another registration for `to` replaces it.
    async fn run_pinned(self, sock: UdpSocket, to: Endpoint, first: Vec<u8>) {
        let (mut queue, id) = self.register(to, true);
        let conns = self.inner.conns.clone();
        let deliver = |data: &[u8]| {
            let mut batch = conns.buffer();
            frame::push(&mut batch, data).then_some(Inbound { from: to, batch })
        };
        let writer = async {
            while let Some(batch) = queue.recv().await {
                for f in frame::frames(&batch).flatten() {
                    if let Err(e) = sock.send_to(f, to.addr).await {
                        debug!(%to, error = %e, "send on a mapping's socket failed");
                    }
                }
                conns.recycle(batch);
            }
            Ok(())
        };
        let reader = async {
            if let Some(i) = deliver(&first)
                && !conns.deliver(id, i).await
            {
                return Err("the connection RX thread stopped".to_owned());
            }
            let mut buf = vec![0u8; MAX_DATAGRAM];
            loop {
                match tokio::time::timeout(IDLE_TIMEOUT, sock.recv_from(&mut buf)).await {
                    Err(_) => return Err(format!("nothing received for {} s", IDLE_TIMEOUT.as_secs())),
                    Ok(Err(e)) => return Err(e.to_string()),
                    Ok(Ok((n, from))) if from == to.addr => {
                        if let Some(i) = deliver(&buf[..n])
                            && !conns.deliver(id, i).await
                        {
                            return Err("the connection RX thread stopped".to_owned());
                        }
                    }
                    Ok(Ok(_)) => {}
                }
            }
        };
        let r = tokio::select! {
            r = writer => r,
            r = reader => r,
        };
        conns.unregister(to, id);
        self.closed(to, r);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::mpsc;
    use weft_core::admission::MacKeys;
    use weft_core::handshake::Psk;

    use super::*;
    use crate::transport::Proto;
    use crate::transport::connections::Connections;

    /// A datagram with a sealed data message's shape (what the easy side's probes are).
    fn probe() -> Vec<u8> {
        let mut d = vec![0u8; weft_core::wire::DATA_HEADER_LEN + weft_core::crypto::TAG_LEN];
        d[0] = weft_core::wire::MessageType::Data as u8;
        d
    }

    /// Two overlapping sets towards one endpoint, both hit, the later set first: the
    /// path stays on the socket hit first, so what the node sends leaves from it.
    #[tokio::test]
    async fn when_two_sets_are_hit_the_first_hit_keeps_the_path() {
        let (conns, _inbound) = Connections::new(8);
        let (down_tx, _down) = mpsc::channel(8);
        let macs = Arc::new(MacKeys::new(&Psk::derive("pinned", "secret")));
        let conn = Connector::new(conns.clone(), down_tx, None, 4, 1500, macs).expect("connector");
        let peer = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = Endpoint::new(Proto::Udp, peer.local_addr().unwrap());
        let hold = Duration::from_secs(5);
        let mut buf = vec![0u8; 2048];
        let pace = Pace { burst: 32, every: Duration::from_millis(100) };
        let open = |n: usize| tokio::spawn(conn.clone().open_mappings(to, vec![vec![1u8; 4]; n], pace, hold));
        let older = open(2);
        let (_, first_old) = peer.recv_from(&mut buf).await.unwrap();
        let (_, _) = peer.recv_from(&mut buf).await.unwrap();
        let newer = open(2);
        let (_, first_new) = peer.recv_from(&mut buf).await.unwrap();
        let (_, _) = peer.recv_from(&mut buf).await.unwrap();
        // The newer set is hit first, then the older one.
        peer.send_to(&probe(), first_new).await.unwrap();
        assert!(newer.await.unwrap(), "the newer set was hit");
        peer.send_to(&probe(), first_old).await.unwrap();
        assert!(older.await.unwrap(), "the older set was hit too");
        assert!(conns.contains(&to));
        assert!(conn.send(to, &[7u8; 40]), "the path takes a frame");
        let (n, from) = tokio::time::timeout(Duration::from_secs(5), peer.recv_from(&mut buf)).await.unwrap().unwrap();
        assert_eq!((n, from), (40, first_new), "the frame left from the socket hit first");
    }

    /// A set goes out in bursts: never more than `burst` datagrams before a pause of
    /// `every`, each from a socket (a source port) of its own.
    #[tokio::test]
    async fn a_set_goes_out_in_paced_bursts_from_sockets_of_their_own() {
        let (conns, _inbound) = Connections::new(8);
        let (down_tx, _down) = mpsc::channel(8);
        let macs = Arc::new(MacKeys::new(&Psk::derive("pinned", "secret")));
        let conn = Connector::new(conns, down_tx, None, 4, 1500, macs).expect("connector");
        let peer = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = Endpoint::new(Proto::Udp, peer.local_addr().unwrap());
        let pace = Pace { burst: 3, every: Duration::from_millis(150) };
        let set = tokio::spawn(conn.open_mappings(to, vec![vec![1u8; 4]; 7], pace, Duration::from_millis(100)));
        let mut buf = vec![0u8; 64];
        let mut got = Vec::new();
        for _ in 0..7 {
            let (_, from) = peer.recv_from(&mut buf).await.unwrap();
            got.push((tokio::time::Instant::now(), from.port()));
        }
        assert!(!set.await.unwrap(), "nobody answered");
        let mut ports: Vec<u16> = got.iter().map(|g| g.1).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 7, "a socket per datagram");
        // Bursts of 3, 3 and 1: the 4th and 7th come a pause after the 3rd and 6th.
        for i in [3, 6] {
            let gap = got[i].0 - got[i - 1].0;
            assert!(gap >= Duration::from_millis(140), "datagram {i} came {gap:?} after the one before");
        }
    }
}
