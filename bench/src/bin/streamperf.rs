//! One TCP stream for a fixed time, directly or through a SOCKS5 proxy: what
//! `bench/netns/notun.sh` measures the no-TUN paths with (iperf3 cannot speak SOCKS5),
//! and the TUN path too, so every row is measured by the same tool.
//!
//! ```text
//! streamperf serve ADDR                                  # sink and source, forever
//! streamperf run ADDR [--socks5 PROXY] [--secs N] [--down]  # prints {"gbps": ...}
//! ```
//! ADDR of `run` may be a name (resolved by the proxy) when `--socks5` is given.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const BUF: usize = 256 << 10;

fn serve(addr: &str) -> Result<()> {
    let l = TcpListener::bind(addr)?;
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        std::thread::spawn(move || {
            let mut mode = [0u8; 9];
            if c.read_exact(&mut mode).is_err() {
                return;
            }
            let mut buf = vec![0u8; BUF];
            if mode[0] == b'd' {
                let ms = u64::from_be_bytes(mode[1..].try_into().unwrap_or([0; 8]));
                let end = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < end {
                    if c.write_all(&buf).is_err() {
                        return;
                    }
                }
            } else {
                while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
            }
        });
    }
    Ok(())
}

/// SOCKS5 CONNECT (no authentication) to `target` (ADDR:PORT or NAME:PORT).
fn socks5(proxy: &str, target: &str) -> Result<TcpStream> {
    let mut s = TcpStream::connect(proxy)?;
    s.write_all(&[5, 1, 0])?;
    let mut r = [0u8; 2];
    s.read_exact(&mut r)?;
    let (host, port) = target.rsplit_once(':').ok_or("target needs a port")?;
    let port: u16 = port.parse()?;
    let mut req = vec![5, 1, 0];
    match host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => {
            req.push(1);
            req.extend(a.octets());
        }
        Ok(std::net::IpAddr::V6(a)) => {
            req.push(4);
            req.extend(a.octets());
        }
        Err(_) => {
            req.push(3);
            req.push(u8::try_from(host.len())?);
            req.extend(host.as_bytes());
        }
    }
    req.extend(port.to_be_bytes());
    s.write_all(&req)?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head)?;
    if head[1] != 0 {
        return Err(format!("SOCKS5 reply {:#x}", head[1]).into());
    }
    let mut rest = vec![0u8; if head[3] == 4 { 18 } else { 6 }];
    s.read_exact(&mut rest)?;
    Ok(s)
}

fn run(target: &str, proxy: Option<&str>, secs: u64, down: bool) -> Result<()> {
    let mut s = match proxy {
        Some(p) => socks5(p, target)?,
        None => TcpStream::connect(target)?,
    };
    s.set_nodelay(true)?;
    let mut mode = vec![if down { b'd' } else { b'u' }];
    mode.extend((secs * 1000).to_be_bytes());
    s.write_all(&mode)?;
    let mut buf = vec![0u8; BUF];
    let start = Instant::now();
    let mut bytes = 0u64;
    if down {
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
        }
    } else {
        let end = start + Duration::from_secs(secs);
        while Instant::now() < end {
            s.write_all(&buf)?;
            bytes += buf.len() as u64;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        // Wait for the sink to take everything (it closes after EOF).
        let _ = s.read(&mut buf);
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{{\"gbps\": {:.4}, \"bytes\": {bytes}, \"secs\": {secs:.3}}}", bytes as f64 * 8.0 / secs / 1e9);
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => serve(args.get(1).ok_or("serve ADDR")?),
        Some("run") => {
            let target = args.get(1).ok_or("run ADDR")?;
            let mut proxy = None;
            let mut secs = 10;
            let mut down = false;
            let mut i = 2;
            while i < args.len() {
                match args[i].as_str() {
                    "--socks5" => {
                        proxy = args.get(i + 1).cloned();
                        i += 1;
                    }
                    "--secs" => {
                        secs = args.get(i + 1).ok_or("--secs N")?.parse()?;
                        i += 1;
                    }
                    "--down" => down = true,
                    a => return Err(format!("unknown argument {a}").into()),
                }
                i += 1;
            }
            run(target, proxy.as_deref(), secs, down)
        }
        _ => Err("usage: streamperf serve ADDR | streamperf run ADDR [--socks5 PROXY] [--secs N] [--down]".into()),
    }
}
