//! A UDP forwarder that holds every datagram for a fixed time each way: a long path
//! for `bench/netns/wan.sh` on a machine without netem. The first address that sends
//! to `--listen` is the client; everything from it goes to `--to` from a second
//! socket, and what comes back goes to the client. Datagrams keep their order; a
//! queue that would hold more than `--queue` of them drops (and counts) the newest.
//! It stops by itself after `--seconds`.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;

#[derive(Parser)]
#[command(about = "UDP forwarder with a fixed delay each way (a long path without netem)")]
struct Args {
    /// Address the client sends to.
    #[arg(long)]
    listen: SocketAddr,
    /// Address to bind the socket that talks to the server (port 0: any).
    #[arg(long)]
    bind: SocketAddr,
    /// The server.
    #[arg(long)]
    to: SocketAddr,
    /// Delay each way, in milliseconds.
    #[arg(long)]
    delay_ms: u64,
    /// Datagrams a direction may hold at once.
    #[arg(long, default_value_t = 200_000)]
    queue: usize,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: u64,
}

struct Held {
    due: Instant,
    data: Vec<u8>,
}

/// Reads datagrams from `from` (only from `expect`, when given) and queues them with
/// their due time; the client's address is learnt from the first one when `client` is
/// to be set.
fn receive(
    from: &UdpSocket,
    queue: &SyncSender<Held>,
    delay: Duration,
    expect: Option<SocketAddr>,
    client: Option<&OnceLock<SocketAddr>>,
    dropped: &AtomicU64,
) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let Ok((n, src)) = from.recv_from(&mut buf) else { return };
        if expect.is_some_and(|e| e != src) {
            continue;
        }
        if let Some(c) = client
            && *c.get_or_init(|| src) != src
        {
            continue;
        }
        let held = Held { due: Instant::now() + delay, data: buf[..n].to_vec() };
        match queue.try_send(held) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                dropped.fetch_add(1, Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// How early a datagram may leave: those due within this of now go without a sleep
/// each (a sleep lasts at least the timer slack, ~50 us, which alone would cap the
/// forwarder at ~20 000 datagrams a second).
const EARLY: Duration = Duration::from_micros(500);

/// Sends each queued datagram when it is due (at most [`EARLY`] before).
fn release(queue: &Receiver<Held>, sock: &UdpSocket, to: impl Fn() -> Option<SocketAddr>) {
    while let Ok(h) = queue.recv() {
        let now = Instant::now();
        if h.due > now + EARLY {
            thread::sleep(h.due - now);
        }
        if let Some(to) = to() {
            let _ = sock.send_to(&h.data, to);
        }
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let front = Arc::new(UdpSocket::bind(a.listen).with_context(|| format!("bind {}", a.listen))?);
    let back = Arc::new(UdpSocket::bind(a.bind).with_context(|| format!("bind {}", a.bind))?);
    // A sender's burst (QUIC sends GSO runs) must not overflow the kernel's default
    // 208 KiB before the receiving thread gets to it: such drops reach no counter.
    for s in [&front, &back] {
        weft_datapath::transport::udp::grow_buffers(&socket2::SockRef::from(&**s));
    }
    let delay = Duration::from_millis(a.delay_ms);
    let client = Arc::new(OnceLock::new());
    let dropped = Arc::new(AtomicU64::new(0));
    let (up_tx, up_rx) = sync_channel(a.queue);
    let (down_tx, down_rx) = sync_channel(a.queue);
    {
        let (front, client, dropped) = (front.clone(), client.clone(), dropped.clone());
        thread::spawn(move || receive(&front, &up_tx, delay, None, Some(&client), &dropped));
    }
    {
        let (back, dropped, to) = (back.clone(), dropped.clone(), a.to);
        thread::spawn(move || receive(&back, &down_tx, delay, Some(to), None, &dropped));
    }
    let to = a.to;
    thread::spawn(move || release(&up_rx, &back, || Some(to)));
    thread::spawn(move || release(&down_rx, &front, || client.get().copied()));
    thread::sleep(Duration::from_secs(a.seconds));
    eprintln!("udpdelay: done after {} s, {} datagrams dropped", a.seconds, dropped.load(Relaxed));
    Ok(())
}
