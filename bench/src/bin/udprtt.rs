//! Round trips of one small datagram through a UDP echo, on three kinds of socket:
//! plain (`recv_from`/`send_to` on one unconnected socket), connected (`connect`, then
//! `recv`/`send`, as boringtun's per-peer sockets) and Weft's own (a reuseport group
//! of two with the sparse-flow steering program, UDP GRO, arrival timestamps,
//! `recvmmsg`/`sendmmsg` through `weft_datapath::transport::udp`). What an idle hop of
//! the tunnel costs in the socket layer alone, without the pipeline:
//! `bench/netns/udprtt.sh` runs it between two namespaces. Both ends stop by
//! themselves (`--count` pings; the echo after `--seconds`).

use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use weft_core::wire::{FLAG_SPARSE, MessageType};
use weft_datapath::transport::Outgoing;
use weft_datapath::transport::udp::{self, Offload, RecvMeta};
use weft_datapath::transport::{Endpoint, Lane};

#[derive(Parser)]
#[command(about = "Idle UDP round trips on plain, connected and Weft's sockets")]
struct Args {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Answer every datagram to its sender, until `--seconds` pass.
    Echo {
        #[arg(long, value_enum)]
        mode: Mode,
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// The pinger's address (connected mode connects to it).
        #[arg(long)]
        peer: SocketAddr,
        #[arg(long)]
        seconds: u64,
        /// Sockets in Weft's reuseport group (one thread each; two or more get the
        /// steering program).
        #[arg(long, default_value_t = 2)]
        sockets: usize,
        /// Weft's sockets without UDP GRO.
        #[arg(long)]
        no_gro: bool,
    },
    /// Send `--count` datagrams `--interval-ms` apart, each after the last came back,
    /// and print the round trips' percentiles in microseconds.
    Ping {
        #[arg(long, value_enum)]
        mode: Mode,
        /// Address to send from.
        #[arg(long)]
        bind: SocketAddr,
        /// The echo.
        #[arg(long)]
        to: SocketAddr,
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        /// Weft's socket without UDP GRO.
        #[arg(long)]
        no_gro: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Plain,
    Connected,
    Weft,
}

/// Bytes of each datagram: about an ICMP echo sealed by the tunnel.
const SIZE: usize = 100;
/// How long a read waits before the loop looks at the clock again.
const READ_TIMEOUT: Duration = Duration::from_millis(200);

/// One end's socket and buffers.
struct End {
    mode: Mode,
    sock: UdpSocket,
    /// The connected socket's peer, read once (not a `getpeername` per receive).
    peer: Option<SocketAddr>,
    slab: Vec<u8>,
    metas: Vec<RecvMeta>,
    offload: Offload,
}

impl End {
    fn new(mode: Mode, sock: UdpSocket, gro: bool) -> Self {
        let gro = mode == Mode::Weft && gro && udp::enable_gro(&sock);
        let peer = sock.peer_addr().ok();
        // The receive thread's slots with GRO, as the tunnel's (four of 64 KiB).
        Self {
            mode,
            sock,
            peer,
            slab: vec![0u8; 4 * 65_536],
            metas: vec![RecvMeta::default(); 4],
            offload: Offload::new(false, gro),
        }
    }

    /// Receives one datagram: its length and sender (`None` on timeout).
    fn recv(&mut self) -> Result<Option<(usize, SocketAddr)>> {
        let r = match self.mode {
            Mode::Plain => self.sock.recv_from(&mut self.slab),
            Mode::Connected => {
                let peer = self.peer.context("connected socket without a peer")?;
                self.sock.recv(&mut self.slab).map(|n| (n, peer))
            }
            Mode::Weft => udp::recv_batch(&self.sock, &mut self.slab, 65_536, &mut self.metas)
                .map(|_| (self.metas[0].len, self.metas[0].from.addr)),
        };
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(e).context("receive"),
        }
    }

    /// Sends the first `len` bytes of the slab to `to`.
    fn send(&self, len: usize, to: SocketAddr) -> Result<()> {
        match self.mode {
            Mode::Plain => {
                self.sock.send_to(&self.slab[..len], to).context("send")?;
            }
            Mode::Connected => {
                self.sock.send(&self.slab[..len]).context("send")?;
            }
            Mode::Weft => {
                let out = [Outgoing { buf: 0, start: 0, len, to: Endpoint::udp(to), lane: Lane::Bulk, single: false }];
                if udp::send_batch(&self.sock, &[&self.slab[..]], &out, &self.offload) != 0 {
                    bail!("send to {to} failed");
                }
            }
        }
        Ok(())
    }
}

fn plain_socket(addr: SocketAddr) -> Result<UdpSocket> {
    let s = UdpSocket::bind(addr).with_context(|| format!("bind {addr}"))?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    Ok(s)
}

fn echo(mode: Mode, listen: SocketAddr, peer: SocketAddr, seconds: u64, sockets: usize, gro: bool) -> Result<()> {
    let socks = match mode {
        Mode::Plain => vec![plain_socket(listen)?],
        Mode::Connected => {
            let s = plain_socket(listen)?;
            s.connect(peer).with_context(|| format!("connect {peer}"))?;
            vec![s]
        }
        // Two by default, as a two-core node has: the steering program sends a
        // sparse datagram to the socket after its session's.
        Mode::Weft => udp::bind_reuseport(listen, sockets, READ_TIMEOUT).with_context(|| format!("bind {listen}"))?,
    };
    let until = Instant::now() + Duration::from_secs(seconds);
    let threads: Vec<_> = socks
        .into_iter()
        .map(|s| {
            let mut end = End::new(mode, s, gro);
            thread::spawn(move || -> Result<()> {
                while Instant::now() < until {
                    if let Some((n, from)) = end.recv()? {
                        end.send(n, from)?;
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    }
    Ok(())
}

fn ping(mode: Mode, bind: SocketAddr, to: SocketAddr, count: u32, interval: Duration, gro: bool) -> Result<()> {
    let sock = match mode {
        Mode::Plain => plain_socket(bind)?,
        Mode::Connected => {
            let s = plain_socket(bind)?;
            s.connect(to).with_context(|| format!("connect {to}"))?;
            s
        }
        Mode::Weft => udp::bind_reuseport(bind, 1, READ_TIMEOUT)
            .with_context(|| format!("bind {bind}"))?
            .pop()
            .context("no socket")?,
    };
    let mut end = End::new(mode, sock, gro);
    let mut rtts = Vec::with_capacity(count as usize);
    let mut lost = 0;
    for seq in 0..count {
        thread::sleep(interval);
        // A sparse data message's first bytes, so that the echo's steering program
        // takes the path a ping through the tunnel takes.
        end.slab[..SIZE].fill(0);
        end.slab[0] = MessageType::Data as u8;
        end.slab[1] = FLAG_SPARSE;
        end.slab[8..16].copy_from_slice(&u64::from(seq).to_le_bytes());
        let sent = Instant::now();
        end.send(SIZE, to)?;
        loop {
            match end.recv()? {
                Some((n, _)) if n == SIZE && end.slab[8..16] == u64::from(seq).to_le_bytes() => {
                    rtts.push(sent.elapsed());
                    break;
                }
                Some(_) => {}
                None => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    if rtts.is_empty() {
        bail!("no datagram came back from {to}");
    }
    rtts.sort();
    let q = |p: f64| rtts[((rtts.len() as f64 * p) as usize).min(rtts.len() - 1)].as_secs_f64() * 1e6;
    let name = mode.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default();
    println!("{name} p50 {:.1} p90 {:.1} p99 {:.1} us n {} lost {lost}", q(0.5), q(0.9), q(0.99), rtts.len());
    Ok(())
}

fn main() -> Result<()> {
    match Args::parse().role {
        Role::Echo { mode, listen, peer, seconds, sockets, no_gro } => {
            echo(mode, listen, peer, seconds, sockets, !no_gro)
        }
        Role::Ping { mode, bind, to, count, interval_ms, no_gro } => {
            ping(mode, bind, to, count, Duration::from_millis(interval_ms), !no_gro)
        }
    }
}
