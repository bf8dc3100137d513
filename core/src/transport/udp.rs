//! UDP with batched system calls: `recvmmsg` into a slab of slots and `sendmmsg` of
//! many datagrams at once, on blocking sockets (one per pipeline, `SO_REUSEPORT`).
#![allow(unsafe_code)]

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Largest number of datagrams moved by one system call.
pub const MAX_BATCH: usize = 128;
const SOCKET_BUFFER: usize = 4 << 20;

/// Binds `count` UDP sockets to `addr` with `SO_REUSEPORT`, so each pipeline owns one
/// and the kernel spreads peers across them by 4-tuple hash. Reads time out after
/// `read_timeout` so that receive loops can notice shutdown.
pub fn bind_reuseport(addr: SocketAddr, count: usize, read_timeout: Duration) -> io::Result<Vec<UdpSocket>> {
    let mut out = Vec::with_capacity(count);
    let mut bound = addr;
    for _ in 0..count.max(1) {
        let s = Socket::new(Domain::for_address(bound), Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_port(true)?;
        if bound.is_ipv6() {
            s.set_only_v6(false)?;
        }
        // Buffer sizes are best effort: the kernel caps them at rmem_max/wmem_max.
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
        s.set_read_timeout(Some(read_timeout))?;
        s.bind(&bound.into())?;
        // With port 0, every further socket must share the port the first one got.
        if let Some(local) = s.local_addr()?.as_socket() {
            bound = local;
        }
        out.push(s.into());
    }
    Ok(out)
}

/// Metadata of one received datagram.
#[derive(Debug, Clone, Copy)]
pub struct RecvMeta {
    /// Sender.
    pub from: SocketAddr,
    /// Bytes in the slot.
    pub len: usize,
    /// The datagram was larger than the slot and was cut.
    pub truncated: bool,
}

impl Default for RecvMeta {
    fn default() -> Self {
        Self { from: SocketAddr::V4(SocketAddrV4::new([0, 0, 0, 0].into(), 0)), len: 0, truncated: false }
    }
}

/// Receives up to `metas.len()` datagrams into consecutive `slot`-byte slots of `slab`,
/// blocking until at least one arrives (or the read timeout passes, which returns
/// `WouldBlock`). Returns how many arrived.
pub fn recv_batch(sock: &UdpSocket, slab: &mut [u8], slot: usize, metas: &mut [RecvMeta]) -> io::Result<usize> {
    let n = metas.len().min(MAX_BATCH).min(slab.len() / slot.max(1));
    if n == 0 {
        return Ok(0);
    }
    let mut iovs: [MaybeUninit<libc::iovec>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut names: [MaybeUninit<libc::sockaddr_storage>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut hdrs: [MaybeUninit<libc::mmsghdr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let base = slab.as_mut_ptr();
    for i in 0..n {
        // SAFETY: i * slot + slot <= slab.len() because n <= slab.len() / slot, so the
        // pointer stays inside the slab.
        let p = unsafe { base.add(i * slot) };
        iovs[i].write(libc::iovec { iov_base: p.cast(), iov_len: slot });
        // SAFETY: an all-zero msghdr is a valid value (null pointers, zero lengths).
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        h.msg_hdr.msg_name = names[i].as_mut_ptr().cast();
        h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_hdr.msg_iov = iovs[i].as_mut_ptr();
        h.msg_hdr.msg_iovlen = 1;
        hdrs[i].write(h);
    }
    // SAFETY: the first n entries of hdrs are initialised and point at live iovecs,
    // name storage and slab memory that outlive the call; the kernel writes at most
    // iov_len bytes per slot and msg_namelen bytes per name.
    let r = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr().cast(),
            n as libc::c_uint,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = r as usize;
    for i in 0..got {
        // SAFETY: the kernel filled the first `got` headers; entries < n were initialised.
        let h = unsafe { hdrs[i].assume_init_ref() };
        // SAFETY: the kernel wrote msg_namelen bytes of a sockaddr into names[i].
        let from = unsafe { sockaddr_to_std(names[i].as_ptr(), h.msg_hdr.msg_namelen) };
        metas[i] = RecvMeta {
            from: from.unwrap_or(metas[i].from),
            len: (h.msg_len as usize).min(slot),
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
        };
    }
    Ok(got)
}

/// One datagram to send: `len` bytes at the start of buffer `buf` of the batch.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing {
    /// Index into the buffer array.
    pub buf: usize,
    /// Bytes to send from the start of that buffer.
    pub len: usize,
    /// Destination.
    pub to: SocketAddr,
}

/// Sends every datagram in `out` with as few `sendmmsg` calls as possible. Returns the
/// number that could not be sent (each failing datagram is skipped, not retried).
pub fn send_batch<B: AsRef<[u8]>>(sock: &UdpSocket, bufs: &[B], out: &[Outgoing]) -> usize {
    let mut failed = 0;
    for chunk in out.chunks(MAX_BATCH) {
        let mut addrs: [MaybeUninit<SockAddr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
        let mut iovs: [MaybeUninit<libc::iovec>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
        let mut hdrs: [MaybeUninit<libc::mmsghdr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
        let mut n = 0;
        for o in chunk {
            let Some(data) = bufs.get(o.buf).and_then(|b| b.as_ref().get(..o.len)) else {
                failed += 1;
                continue;
            };
            let a = addrs[n].write(SockAddr::from(o.to));
            iovs[n].write(libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() });
            // SAFETY: an all-zero msghdr is a valid value.
            let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
            h.msg_hdr.msg_name = a.as_ptr() as *mut _;
            h.msg_hdr.msg_namelen = a.len();
            h.msg_hdr.msg_iov = iovs[n].as_mut_ptr();
            h.msg_hdr.msg_iovlen = 1;
            hdrs[n].write(h);
            n += 1;
        }
        let mut done = 0;
        while done < n {
            // SAFETY: entries done..n of hdrs are initialised and point at addresses,
            // iovecs and caller buffers that are alive for the whole call; the kernel
            // only reads them.
            let r = unsafe {
                libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr().add(done).cast(), (n - done) as libc::c_uint, 0)
            };
            if r <= 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The first datagram of the remainder failed: skip it, keep going.
                failed += 1;
                done += 1;
            } else {
                done += r as usize;
            }
        }
        // Drop the initialised SockAddrs (plain data, but keep the bookkeeping honest).
        for a in addrs.iter_mut().take(n) {
            // SAFETY: the first n entries were written above.
            unsafe { a.assume_init_drop() };
        }
    }
    failed
}

/// Converts a kernel-filled socket address to std's form.
///
/// # Safety
/// `ptr` must point at `len` initialised bytes of a `sockaddr` written by the kernel.
unsafe fn sockaddr_to_std(ptr: *const libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees ptr is valid; ss_family is the first field of every
    // sockaddr variant.
    let family = unsafe { (*ptr).ss_family } as libc::c_int;
    match family {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says this is a sockaddr_in and len covers it.
            let a = unsafe { &*ptr.cast::<libc::sockaddr_in>() };
            let ip = u32::from_be(a.sin_addr.s_addr);
            Some(SocketAddr::V4(SocketAddrV4::new(ip.into(), u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says this is a sockaddr_in6 and len covers it.
            let a = unsafe { &*ptr.cast::<libc::sockaddr_in6>() };
            let v6 = SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            );
            // Report IPv4-mapped senders as plain IPv4.
            Some(match v6.ip().to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, v6.port())),
                None => SocketAddr::V6(v6),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trip_on_loopback() {
        let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(500)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx[0].local_addr().unwrap();
        let bufs: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + i as usize]).collect();
        let out: Vec<Outgoing> = (0..10).map(|i| Outgoing { buf: i, len: 100 + i, to }).collect();
        assert_eq!(send_batch(&tx, &bufs, &out), 0);
        let slot = 2048;
        let mut slab = vec![0u8; slot * 16];
        let mut metas = [RecvMeta::default(); 16];
        let mut got = 0;
        while got < 10 {
            let n = recv_batch(&rx[0], &mut slab, slot, &mut metas).unwrap();
            for m in &metas[..n] {
                assert_eq!(m.from, tx.local_addr().unwrap());
                assert!(!m.truncated);
            }
            for (i, m) in metas[..n].iter().enumerate() {
                let first = slab[i * slot];
                assert_eq!(m.len, 100 + first as usize);
            }
            got += n;
        }
    }

    #[test]
    fn oversized_datagram_is_flagged_truncated() {
        let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(500)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(&[1u8; 3000], rx[0].local_addr().unwrap()).unwrap();
        let mut slab = vec![0u8; 1024 * 4];
        let mut metas = [RecvMeta::default(); 4];
        let n = recv_batch(&rx[0], &mut slab, 1024, &mut metas).unwrap();
        assert_eq!(n, 1);
        assert!(metas[0].truncated);
    }

    #[test]
    fn reuseport_sockets_share_the_port() {
        let socks = bind_reuseport("127.0.0.1:0".parse().unwrap(), 3, Duration::from_millis(100)).unwrap();
        let port = socks[0].local_addr().unwrap().port();
        assert!(socks.iter().all(|s| s.local_addr().unwrap().port() == port));
    }

    #[test]
    fn timeout_returns_would_block() {
        let s = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(50)).unwrap();
        let mut slab = vec![0u8; 2048];
        let mut metas = [RecvMeta::default(); 1];
        let e = recv_batch(&s[0], &mut slab, 2048, &mut metas).unwrap_err();
        assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut));
    }
}
