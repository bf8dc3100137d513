//! UDP with batched system calls: `recvmmsg` into a slab of slots and `sendmmsg` of
//! many datagrams at once, on blocking sockets (one per pipeline, `SO_REUSEPORT`).
#![allow(unsafe_code)]

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{Endpoint, Outgoing};

/// Largest number of datagrams moved by one system call.
pub const MAX_BATCH: usize = 128;
const SOCKET_BUFFER: usize = 4 << 20;
/// The receive buffer: a backlog the node cannot open fast enough waits here, in
/// arrival order, sparse packets behind bulk ones. 1 MiB (the kernel counts it twice,
/// with its overhead) is about 2 ms of what one receive thread opens here: room for
/// bursts, not a standing queue (bench/RESULTS.md, latency; CoDel keeps what stands
/// shorter for senders that slow down on loss, [`weft_core::queue`]).
const RECV_BUFFER: usize = 1 << 20;

/// Binds `count` UDP sockets to `addr` with `SO_REUSEPORT`, so each pipeline owns one
/// and the kernel spreads peers across them by 4-tuple hash. Reads time out after
/// `read_timeout` so that receive loops can notice shutdown.
pub fn bind_reuseport(addr: SocketAddr, count: usize, read_timeout: Duration) -> io::Result<Vec<UdpSocket>> {
    let mut out = Vec::with_capacity(count);
    let mut bound = addr;
    for _ in 0..count.max(1) {
        let s = Socket::new(Domain::for_address(bound), Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_port(true)?;
        super::mark_socket(&s)?;
        if bound.is_ipv6() {
            s.set_only_v6(false)?;
        }
        grow_buffers(&s);
        s.set_read_timeout(Some(read_timeout))?;
        s.bind(&bound.into())?;
        // With port 0, every further socket must share the port the first one got.
        if let Some(local) = s.local_addr()?.as_socket() {
            bound = local;
        }
        let s: UdpSocket = s.into();
        // How long each datagram waited: the receive path's queue control. Without it
        // (an old kernel) nothing is dropped for the queue's sake.
        enable_timestamps(&s);
        out.push(s);
    }
    if out.len() > 1
        && let Err(e) = steer_sparse(&out[0], out.len())
    {
        tracing::warn!(error = %e, "cannot steer sparse flows to their own UDP socket; they share the bulk one");
    }
    Ok(out)
}

// Classic BPF opcodes (linux/filter.h: class | size | mode, or class | op | source).
/// `ldb [k]`: BPF_LD (0x00) | BPF_B (0x10) | BPF_ABS (0x20).
const BPF_LD_B_ABS: u16 = 0x30;
/// `ja +k`: BPF_JMP | BPF_JA (0x00).
const BPF_JA: u16 = 0x05;
/// `xor x`: BPF_ALU | BPF_XOR (0xa0) | BPF_X (0x08).
const BPF_ALU_XOR_X: u16 = 0xac;
/// `tax`: BPF_MISC (0x07) | BPF_TAX (0x00).
const BPF_TAX: u16 = 0x07;
/// `ld M[k]`: BPF_LD | BPF_W | BPF_MEM (0x60).
const BPF_LD_MEM: u16 = 0x60;
/// `st M[k]`: BPF_ST (0x02).
const BPF_ST: u16 = 0x02;
/// `jeq #k`: BPF_JMP (0x05) | BPF_JEQ (0x10) | BPF_K (0x00).
const BPF_JEQ_K: u16 = 0x15;
/// `mod #k`: BPF_ALU (0x04) | BPF_MOD (0x90) | BPF_K.
const BPF_ALU_MOD_K: u16 = 0x94;
/// `and #k`: BPF_ALU | BPF_AND (0x50) | BPF_K.
const BPF_ALU_AND_K: u16 = 0x54;
/// `add #k`: BPF_ALU | BPF_ADD (0x00) | BPF_K.
const BPF_ALU_ADD_K: u16 = 0x04;
/// `ret a`: BPF_RET (0x06) | BPF_A (0x10).
const BPF_RET_A: u16 = 0x16;
/// `ret #k`: BPF_RET | BPF_K.
const BPF_RET_K: u16 = 0x06;

/// The reuseport program of [`steer_sparse`] for `count` sockets.
fn steering_program(count: usize) -> [libc::sock_filter; 26] {
    use weft_core::wire::{FLAG_SPARSE, MessageType, RELAY_HEADER_LEN};
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let n = u32::try_from(count).unwrap_or(u32::MAX);
    let relay = RELAY_HEADER_LEN as u32;
    [
        // The program sees the UDP payload; M[0] gets the key of the datagram's socket.
        op(BPF_LD_B_ABS, 0, 0, 0),
        op(BPF_JEQ_K, 0, 5, MessageType::Data as u32),
        // A data message: the session's key is the low byte of the receiver's index
        // (little-endian, chosen at random by the receiver).
        op(BPF_LD_B_ABS, 0, 0, 4),
        op(BPF_ALU_MOD_K, 0, 0, n),
        op(BPF_ST, 0, 0, 0),
        op(BPF_LD_B_ABS, 0, 0, 1),
        op(BPF_JA, 0, 0, 10),
        // A relayed data message: the key is the first bytes of the relay header's
        // destination and source node ids together (xor), the same both ways, so a
        // relay reads a relayed flow's packets and its answers on one socket, and a
        // relayed download's data and ACKs on one other; the flags are the sealed
        // header's behind the relay header (no hop changes either). Anything else (a
        // handshake, relayed or not): the kernel's own hash.
        op(BPF_JEQ_K, 0, 17, MessageType::Relay as u32),
        op(BPF_LD_B_ABS, 0, 0, relay),
        op(BPF_JEQ_K, 0, 15, MessageType::Data as u32),
        op(BPF_LD_B_ABS, 0, 0, 4),
        op(BPF_TAX, 0, 0, 0),
        op(BPF_LD_B_ABS, 0, 0, 12),
        op(BPF_ALU_XOR_X, 0, 0, 0),
        op(BPF_ALU_MOD_K, 0, 0, n),
        op(BPF_ST, 0, 0, 0),
        op(BPF_LD_B_ABS, 0, 0, relay + 1),
        // The flags in A.
        op(BPF_ALU_AND_K, 0, 0, u32::from(FLAG_SPARSE)),
        op(BPF_JEQ_K, 0, 2, 0),
        // Bulk (or a sender that does not flag): the key's socket.
        op(BPF_LD_MEM, 0, 0, 0),
        op(BPF_RET_A, 0, 0, 0),
        // A sparse flow's packet: the next socket over.
        op(BPF_LD_MEM, 0, 0, 0),
        op(BPF_ALU_ADD_K, 0, 0, 1),
        op(BPF_ALU_MOD_K, 0, 0, n),
        op(BPF_RET_A, 0, 0, 0),
        // An index past the group: the kernel falls back to its hash.
        op(BPF_RET_K, 0, 0, u32::MAX),
    ]
}

/// Attaches to the reuseport group of `sock` (one of `count` sockets bound in order,
/// pipeline `i` owning the `i`th) a classic BPF program that picks the socket of each
/// datagram: a data message goes to socket `index % count` of its session, where
/// `index` is the low byte of the receiver's session index, and one flagged
/// [`weft_core::wire::FLAG_SPARSE`] to the socket after that. A relayed data message
/// is steered alike on the relays and on its destination, by a key the same both ways
/// (its relay header's two node ids) and the flag of the sealed header behind it. A
/// datagram too short for what the program reads goes to the first socket. A download's packets and a ping's then never share a
/// receive queue, nor (the TUN steers a flow's outgoing packets to the queue that last
/// wrote its incoming ones) the thread that sends the answer, nor on a relay the
/// thread that forwards them: the ping's round trip skips the backlog a download keeps
/// in every node's bulk threads. Anything else keeps the kernel's address hash.
pub fn steer_sparse(sock: &UdpSocket, count: usize) -> io::Result<()> {
    let mut prog = steering_program(count);
    let fprog = libc::sock_fprog { len: prog.len() as libc::c_ushort, filter: prog.as_mut_ptr() };
    // SAFETY: `fprog` points at `prog`, alive and unmoved for the whole call; the kernel
    // copies the program.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&raw const fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Whether the UDP offloads are in use; shared by the pipelines of a node. GSO can be
/// switched off at run time when the kernel or NIC refuses it (EIO/EINVAL).
#[derive(Debug, Default)]
pub struct Offload {
    gso: AtomicBool,
    gro: AtomicBool,
    tun_gro: AtomicBool,
}

impl Offload {
    /// Starts with the given choices (after probing).
    pub fn new(gso: bool, gro: bool) -> Self {
        Self { gso: AtomicBool::new(gso), gro: AtomicBool::new(gro), tun_gro: AtomicBool::new(true) }
    }
    /// Coalesced (GRO) writes to the TUN; on until the kernel refuses one.
    pub fn tun_gro(&self) -> bool {
        self.tun_gro.load(Relaxed)
    }
    /// Turns TUN GRO writes off; returns whether they were on.
    pub fn disable_tun_gro(&self) -> bool {
        self.tun_gro.swap(false, Relaxed)
    }
    /// UDP GSO (UDP_SEGMENT) on send.
    pub fn gso(&self) -> bool {
        self.gso.load(Relaxed)
    }
    /// UDP GRO on receive.
    pub fn gro(&self) -> bool {
        self.gro.load(Relaxed)
    }
    fn disable_gso(&self) -> bool {
        self.gso.swap(false, Relaxed)
    }
}

/// Probes whether the kernel supports UDP GSO on this socket.
pub fn probe_gso(sock: &UdpSocket) -> bool {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(sock.as_raw_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, (&raw mut v).cast(), &raw mut len)
    };
    r == 0
}

/// Gives a UDP socket a 4 MiB send and a 1 MiB receive buffer: past `rmem_max`/`wmem_max` with
/// `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` when we hold CAP_NET_ADMIN (a node does, for its
/// TUN), else as far as those limits allow. A burst that overflows the receive buffer
/// is lost before any counter of ours sees it.
pub fn grow_buffers(s: &Socket) {
    for (force, size, size_fn) in [
        (libc::SO_RCVBUFFORCE, RECV_BUFFER, Socket::set_recv_buffer_size as fn(&Socket, usize) -> io::Result<()>),
        (libc::SO_SNDBUFFORCE, SOCKET_BUFFER, Socket::set_send_buffer_size),
    ] {
        if !set_int(s.as_raw_fd(), libc::SOL_SOCKET, force, size as libc::c_int) {
            let _ = size_fn(s, size);
        }
    }
}

/// Turns UDP GRO on for this socket; returns whether the kernel accepted it.
pub fn enable_gro(sock: &UdpSocket) -> bool {
    set_int(sock.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Sets an integer socket option; returns whether the kernel accepted it.
fn set_int(fd: std::os::fd::RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: `value` is a valid c_int for the duration of the call; `fd` is the
    // caller's open socket.
    let r = unsafe {
        libc::setsockopt(fd, level, name, (&raw const value).cast(), size_of::<libc::c_int>() as libc::socklen_t)
    };
    r == 0
}

/// Makes the descriptor of `target` refer to the socket `with` (`dup2`): every thread
/// holding `target` sends and receives on the new socket from its next system call,
/// and the old socket closes once a receive already blocked on it returns (within its
/// read timeout). This moves running pipelines to another port without stopping them.
pub fn replace(target: &UdpSocket, with: &UdpSocket) -> io::Result<()> {
    // SAFETY: both descriptors are open and owned by sockets borrowed for the whole
    // call; dup2 atomically closes what `target`'s number referred to and makes the
    // number refer to `with`'s socket, so each number keeps exactly one owner.
    let r = unsafe { libc::dup2(with.as_raw_fd(), target.as_raw_fd()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Metadata of one received message: with GRO it may hold several datagrams of
/// `stride` bytes each (the last may be shorter).
#[derive(Debug, Clone, Copy)]
pub struct RecvMeta {
    /// Sender.
    pub from: Endpoint,
    /// Bytes in the slot.
    pub len: usize,
    /// Size of each coalesced datagram; equals `len` without GRO.
    pub stride: usize,
    /// The message was larger than the slot and was cut.
    pub truncated: bool,
    /// When the kernel received it (`CLOCK_REALTIME` nanoseconds, from
    /// `SO_TIMESTAMPNS`; 0: not known): how long it waited in the socket.
    pub arrived_ns: u64,
}

impl RecvMeta {
    /// One whole datagram of `len` bytes from `from` (not coalesced, not cut, arrival
    /// time unknown): what a connection's frame or a test's datagram is.
    pub fn whole(from: Endpoint, len: usize) -> Self {
        Self { from, len, stride: len, truncated: false, arrived_ns: 0 }
    }
}

impl Default for RecvMeta {
    fn default() -> Self {
        Self::whole(Endpoint::udp(SocketAddr::V4(SocketAddrV4::new([0, 0, 0, 0].into(), 0))), 0)
    }
}

/// Control-message space per received message: UDP_GRO's int and SO_TIMESTAMPNS's
/// timespec, each with its header, and room to spare.
const RECV_CMSG: usize = 96;

/// Receives up to `metas.len()` messages into consecutive `slot`-byte slots of `slab`,
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
    // u64 elements keep the control buffers aligned for cmsghdr.
    // Only the first n are handed to the kernel (and zeroed): a receive thread offers
    // four slots with GRO, and zeroing all MAX_BATCH (12 KiB) was a cost of every idle
    // packet (bench/RESULTS.md §50).
    let mut cmsgs: [MaybeUninit<[u64; RECV_CMSG / 8]>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
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
        h.msg_hdr.msg_control = cmsgs[i].write([0; RECV_CMSG / 8]).as_mut_ptr().cast();
        h.msg_hdr.msg_controllen = RECV_CMSG;
        hdrs[i].write(h);
    }
    // SAFETY: the first n entries of hdrs are initialised and point at live iovecs,
    // name storage, control buffers and slab memory that outlive the call; the kernel
    // writes at most the lengths given.
    let r = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr().cast(),
            n as libc::c_uint,
            libc::MSG_WAITFORONE,
            ptr::null_mut(),
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
        let len = (h.msg_len as usize).min(slot);
        // SAFETY: msg_control/msg_controllen describe cmsgs[i] as updated by the kernel.
        let (stride, arrived_ns) = unsafe { control(&h.msg_hdr) };
        metas[i] = RecvMeta {
            from: from.map_or(metas[i].from, Endpoint::udp),
            len,
            stride: stride.filter(|s| *s > 0).unwrap_or(len),
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            arrived_ns,
        };
    }
    Ok(got)
}

/// Reads the UDP_GRO segment size and the SO_TIMESTAMPNS receive time (nanoseconds,
/// 0 when absent) from a received message's control data.
///
/// # Safety
/// `h.msg_control` must point at `h.msg_controllen` bytes of control data written by
/// the kernel (or zero length).
unsafe fn control(h: &libc::msghdr) -> (Option<usize>, u64) {
    let (mut stride, mut arrived) = (None, 0);
    // SAFETY: per the function contract the control buffer is valid; CMSG_FIRSTHDR and
    // CMSG_NXTHDR stay within msg_controllen and return null at the end.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                stride = usize::try_from(v).ok();
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let t = ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                arrived = (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    (stride, arrived)
}

/// Asks the kernel to stamp each datagram with its receive time (`SO_TIMESTAMPNS`),
/// so the receive path knows how long it waited ([`RecvMeta::arrived_ns`]). Returns
/// whether the kernel accepted.
pub fn enable_timestamps(sock: &UdpSocket) -> bool {
    set_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// The clock of [`RecvMeta::arrived_ns`] (`CLOCK_REALTIME`), now, in nanoseconds.
pub fn realtime_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut t) };
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// Most datagrams the kernel accepts in one GSO send (UDP_MAX_SEGMENTS).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Most payload bytes in one GSO send.
const MAX_GSO_BYTES: usize = 65000;

/// Sends every datagram in `out`, batching with `sendmmsg` and, when `offload` allows,
/// merging runs of equal-size datagrams to one destination into single GSO sends.
/// Returns the number of datagrams that could not be sent (skipped, not retried).
pub fn send_batch<B: AsRef<[u8]>>(sock: &UdpSocket, bufs: &[B], out: &[Outgoing], offload: &Offload) -> usize {
    let mut failed = 0;
    let mut rest = out;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(MAX_BATCH)];
        match send_chunk(sock, bufs, chunk, offload.gso()) {
            Ok(f) => {
                failed += f;
                rest = &rest[chunk.len()..];
            }
            Err((sent, e)) => {
                // The kernel refused a GSO send: turn GSO off for good and resend the
                // rest as plain datagrams.
                if offload.disable_gso() {
                    tracing::warn!(error = %e, "UDP GSO send failed; falling back to plain datagrams");
                }
                rest = &rest[sent..];
            }
        }
    }
    failed
}

/// Sends one chunk of at most MAX_BATCH datagrams. On a GSO-specific failure returns
/// how many datagrams went out before it, so the caller can resend the rest.
fn send_chunk<B: AsRef<[u8]>>(
    sock: &UdpSocket,
    bufs: &[B],
    out: &[Outgoing],
    gso: bool,
) -> Result<usize, (usize, io::Error)> {
    let mut failed = 0;
    let mut addrs: [MaybeUninit<SockAddr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut iovs: [MaybeUninit<libc::iovec>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut hdrs: [MaybeUninit<libc::mmsghdr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    // Written only for the messages that use them (a GSO run's segment size; the
    // first nmsg spans): a send of one datagram touches none of the 6 KiB.
    let mut cmsgs: [MaybeUninit<[u64; 4]>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    // First datagram index and datagram count of each message.
    let mut spans: [MaybeUninit<(usize, usize)>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let (mut nmsg, mut niov) = (0, 0);
    let mut i = 0;
    while i < out.len() {
        let first = out[i];
        let Some(data) = bufs.get(first.buf).and_then(|b| b.as_ref().get(first.start..first.start + first.len)) else {
            failed += 1;
            i += 1;
            continue;
        };
        let a = addrs[nmsg].write(SockAddr::from(first.to.addr));
        let iov_start = niov;
        iovs[niov].write(libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() });
        niov += 1;
        let (mut count, mut bytes) = (1, first.len);
        let mut j = i + 1;
        // A GSO run: same destination, same size; only the last datagram may be shorter.
        // Same lane too: the receiver steers a run by its first datagram's flags
        // ([`steer_sparse`]), so a sparse packet never rides at the end of a bulk run.
        while gso && !first.single && j < out.len() && count < MAX_GSO_SEGMENTS && bytes + out[j].len <= MAX_GSO_BYTES {
            let o = out[j];
            if o.to != first.to || o.len > first.len || o.lane != first.lane || o.single {
                break;
            }
            let Some(d) = bufs.get(o.buf).and_then(|b| b.as_ref().get(o.start..o.start + o.len)) else { break };
            iovs[niov].write(libc::iovec { iov_base: d.as_ptr() as *mut _, iov_len: d.len() });
            niov += 1;
            count += 1;
            bytes += o.len;
            j += 1;
            if o.len < first.len {
                break;
            }
        }
        // SAFETY: an all-zero msghdr is a valid value.
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        h.msg_hdr.msg_name = a.as_ptr() as *mut _;
        h.msg_hdr.msg_namelen = a.len();
        // SAFETY: iov_start < MAX_BATCH, so the pointer is inside the iovs array.
        h.msg_hdr.msg_iov = unsafe { iovs.as_mut_ptr().add(iov_start) }.cast();
        h.msg_hdr.msg_iovlen = count;
        if count > 1 {
            set_gso_segment(&mut h, cmsgs[nmsg].write([0; 4]), first.len as u16);
        }
        hdrs[nmsg].write(h);
        spans[nmsg].write((i, count));
        nmsg += 1;
        i = j.max(i + 1);
    }
    let mut done = 0;
    let mut result = Ok(());
    while done < nmsg {
        // SAFETY: entries done..nmsg of hdrs are initialised and point at addresses,
        // iovecs, control data and caller buffers alive for the whole call; the
        // kernel only reads them.
        let r = unsafe {
            libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr().add(done).cast(), (nmsg - done) as libc::c_uint, 0)
        };
        if r > 0 {
            done += r as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        // SAFETY: done < nmsg, and the first nmsg spans were written above.
        let (first, count) = unsafe { spans[done].assume_init() };
        if count > 1 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) {
            result = Err((first, e));
            break;
        }
        // This message failed for its own reasons (unreachable, too big): skip it.
        failed += count;
        done += 1;
    }
    for a in addrs.iter_mut().take(nmsg) {
        // SAFETY: the first nmsg entries were written above.
        unsafe { a.assume_init_drop() };
    }
    result.map(|()| failed)
}

/// Points `h`'s control data at `cmsg` and writes a UDP_SEGMENT header into it: the
/// kernel splits the message's payload into datagrams of `segment` bytes (GSO).
fn set_gso_segment(h: &mut libc::mmsghdr, cmsg: &mut [u64; 4], segment: u16) {
    let space = size_of_val(cmsg);
    h.msg_hdr.msg_control = cmsg.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    h.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
    debug_assert!(h.msg_hdr.msg_controllen <= space);
    // SAFETY: the control buffer is aligned (u64) and at least CMSG_SPACE(2) bytes
    // long, so the first header and its data fit in it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
        ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment);
    }
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
    use std::sync::Arc;

    use super::*;
    use weft_core::wire::{DataHeader, FLAG_SPARSE};

    /// Which of `socks` each datagram in `sent` (its first byte tells them apart)
    /// arrived on.
    fn arrivals(socks: &[UdpSocket], sent: usize) -> Vec<(u8, usize)> {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        for (i, s) in socks.iter().enumerate() {
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            while got.len() < sent {
                let Ok(n) = s.recv(&mut buf) else { break };
                got.push((buf[n - 1], i));
            }
        }
        got.sort_unstable();
        got
    }

    #[test]
    fn a_sparse_flows_datagram_lands_on_another_socket_than_its_sessions_bulk() {
        for count in [2usize, 3, 4] {
            let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), count, Duration::from_millis(500)).unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to = rx[0].local_addr().unwrap();
            // Sessions whose index's low byte is 0..8, each sending a bulk and a
            // sparse datagram; the last byte numbers the datagram.
            let mut expect = Vec::new();
            let mut tag = 0u8;
            for low in 0..8u32 {
                for flags in [0, FLAG_SPARSE] {
                    let mut d = vec![0u8; 40];
                    let head = d.first_chunk_mut().unwrap();
                    DataHeader { flags, lane: 0, receiver_index: 0xabcd_ef00 | low, counter: 7 }.emit(head);
                    d[39] = tag;
                    tx.send_to(&d, to).unwrap();
                    let session = low as usize % count;
                    expect.push((tag, if flags == 0 { session } else { (session + 1) % count }));
                    tag += 1;
                }
            }
            assert_eq!(arrivals(&rx, expect.len()), expect, "{count} sockets");
        }
    }

    #[test]
    fn a_relayed_datagram_is_steered_by_its_node_ids_the_same_both_ways() {
        use weft_core::wire::RelayHeader;
        for count in [2usize, 3] {
            let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), count, Duration::from_millis(500)).unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to = rx[0].local_addr().unwrap();
            // Pairs of nodes, each way, bulk and sparse: the key is the first bytes of
            // the two node ids together (xor), whatever the receiver's index inside.
            let mut expect = Vec::new();
            let mut tag = 0u8;
            for (x, y) in [(0x10u8, 0x20u8), (0x11, 0x20), (0x37, 0x52), (0xff, 0x01)] {
                for (dst, src) in [(x, y), (y, x)] {
                    for flags in [0, FLAG_SPARSE] {
                        let mut d = vec![0u8; 40];
                        let index = 0x0102_0300 | u32::from(tag);
                        DataHeader { flags, lane: 0, receiver_index: index, counter: 9 }
                            .emit(d.first_chunk_mut().unwrap());
                        d[39] = tag;
                        let relay = RelayHeader { hop_limit: 7, dst: [dst; 8], src: [src; 8] };
                        tx.send_to(&relay.wrap(&d), to).unwrap();
                        let key = usize::from(x ^ y) % count;
                        expect.push((tag, if flags == 0 { key } else { (key + 1) % count }));
                        tag += 1;
                    }
                }
            }
            assert_eq!(arrivals(&rx, expect.len()), expect, "{count} sockets");
        }
        // A relayed handshake: the kernel's hash, one socket for one source.
        let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 2, Duration::from_millis(500)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for tag in 0..6u8 {
            let mut inner = vec![1u8; 40];
            inner[4] = tag;
            inner[39] = tag;
            let relay = RelayHeader { hop_limit: 7, dst: [tag; 8], src: [0x11; 8] };
            tx.send_to(&relay.wrap(&inner), rx[0].local_addr().unwrap()).unwrap();
        }
        let got = arrivals(&rx, 6);
        assert_eq!(got.len(), 6);
        assert!(got.iter().all(|g| g.1 == got[0].1), "{got:?}");
    }

    #[test]
    fn datagrams_other_than_data_keep_the_kernels_hash() {
        // A handshake from one source: the kernel's hash of the addresses, one socket.
        let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 2, Duration::from_millis(500)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for tag in 0..6u8 {
            let mut d = vec![1u8; 40];
            d[4] = tag;
            d[39] = tag;
            tx.send_to(&d, rx[0].local_addr().unwrap()).unwrap();
        }
        let got = arrivals(&rx, 6);
        assert_eq!(got.len(), 6);
        assert!(got.iter().all(|g| g.1 == got[0].1), "{got:?}");
    }

    #[test]
    fn batch_round_trip_on_loopback() {
        let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(500)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx[0].local_addr().unwrap();
        let bufs: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + i as usize]).collect();
        let out: Vec<Outgoing> = (0..10)
            .map(|i| Outgoing {
                buf: i,
                start: 0,
                len: 100 + i,
                to: to.into(),
                lane: Default::default(),
                single: false,
            })
            .collect();
        assert_eq!(send_batch(&tx, &bufs, &out, &Offload::new(false, false)), 0);
        let slot = 2048;
        let mut slab = vec![0u8; slot * 16];
        let mut metas = [RecvMeta::default(); 16];
        let mut got = 0;
        while got < 10 {
            let n = recv_batch(&rx[0], &mut slab, slot, &mut metas).unwrap();
            for m in &metas[..n] {
                assert_eq!(m.from, Endpoint::udp(tx.local_addr().unwrap()));
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
    fn a_replaced_socket_sends_and_receives_on_the_new_port() {
        let old = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(100)).unwrap();
        let old_addr = old[0].local_addr().unwrap();
        let new = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(100)).unwrap();
        let new_addr = new[0].local_addr().unwrap();
        // A second handle on the old socket, as a pipeline's Arc would be.
        let held = Arc::new(old.into_iter().next().unwrap());
        replace(&held, &new[0]).unwrap();
        drop(new);
        assert_eq!(held.local_addr().unwrap(), new_addr);
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        peer.send_to(b"to the new port", new_addr).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = held.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"to the new port"[..], peer.local_addr().unwrap()));
        held.send_to(b"back", peer.local_addr().unwrap()).unwrap();
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"back"[..], new_addr));
        // The old port is closed: nothing bound there any more.
        assert!(UdpSocket::bind(old_addr).is_ok(), "the old port is still held");
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

#[cfg(test)]
mod gso_tests {
    use super::*;

    /// GSO on send, GRO on receive: 40 equal datagrams and a short tail arrive intact,
    /// in order, whether or not the kernel coalesced them.
    #[test]
    fn gso_send_and_gro_receive_on_loopback() {
        let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(500)).unwrap();
        let gro = enable_gro(&rx[0]);
        let tx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(500)).unwrap();
        let off = Offload::new(probe_gso(&tx[0]), gro);
        let to = rx[0].local_addr().unwrap();
        let mut bufs: Vec<Vec<u8>> = (0..41u8).map(|i| vec![i; 1200]).collect();
        bufs[40].truncate(300);
        let out: Vec<Outgoing> = (0..41)
            .map(|i| Outgoing {
                buf: i,
                start: 0,
                len: bufs[i].len(),
                to: to.into(),
                lane: Default::default(),
                single: false,
            })
            .collect();
        assert_eq!(send_batch(&tx[0], &bufs, &out, &off), 0);
        let slot = 65536;
        let mut slab = vec![0u8; slot * 8];
        let mut metas = [RecvMeta::default(); 8];
        let mut seen = Vec::new();
        while seen.len() < 41 {
            let n = recv_batch(&rx[0], &mut slab, slot, &mut metas).unwrap();
            for (i, m) in metas[..n].iter().enumerate() {
                assert!(!m.truncated);
                let data = &slab[i * slot..i * slot + m.len];
                for d in data.chunks(m.stride) {
                    seen.push((d[0], d.len()));
                }
            }
        }
        let want: Vec<(u8, usize)> = (0..41u8).map(|i| (i, if i == 40 { 300 } else { 1200 })).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn a_sparse_datagram_never_rides_at_the_end_of_a_bulk_run() {
        use crate::transport::Lane;
        use weft_core::wire::{DataHeader, FLAG_SPARSE};
        let rx = bind_reuseport("127.0.0.1:0".parse().unwrap(), 2, Duration::from_millis(200)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let off = Offload::new(probe_gso(&tx), false);
        assert!(off.gso(), "loopback takes UDP GSO");
        let to = rx[0].local_addr().unwrap();
        // Three bulk datagrams of one session (socket 0), then a shorter sparse one of
        // the same session, which a run could take as its last datagram.
        let bufs: Vec<Vec<u8>> = (0..4u8)
            .map(|i| {
                let mut d = vec![i; if i < 3 { 600 } else { 100 }];
                let flags = if i < 3 { 0 } else { FLAG_SPARSE };
                DataHeader { flags, lane: 0, receiver_index: 0x1000, counter: u64::from(i) }
                    .emit(d.first_chunk_mut().unwrap());
                d
            })
            .collect();
        let out: Vec<Outgoing> = (0..4)
            .map(|i| Outgoing {
                buf: i,
                start: 0,
                len: bufs[i].len(),
                to: to.into(),
                lane: if i < 3 { Lane::Bulk } else { Lane::Sparse },
                single: false,
            })
            .collect();
        assert_eq!(send_batch(&tx, &bufs, &out, &off), 0);
        let mut buf = [0u8; 2048];
        for (sock, want) in [(&rx[0], vec![0u8, 1, 2]), (&rx[1], vec![3u8])] {
            let mut got = Vec::new();
            while let Ok(n) = sock.recv(&mut buf) {
                got.push(buf[n - 1]);
            }
            assert_eq!(got, want);
        }
    }

    #[test]
    fn mixed_destinations_and_sizes_split_into_runs() {
        let a = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(500)).unwrap();
        let b = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, Duration::from_millis(500)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let off = Offload::new(probe_gso(&tx), false);
        let (ta, tb) = (a[0].local_addr().unwrap(), b[0].local_addr().unwrap());
        let bufs: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; 500 + usize::from(i % 2) * 100]).collect();
        let to = [ta, ta, tb, tb, ta, tb];
        let out: Vec<Outgoing> = (0..6)
            .map(|i| Outgoing {
                buf: i,
                start: 0,
                len: bufs[i].len(),
                to: to[i].into(),
                lane: Default::default(),
                single: false,
            })
            .collect();
        assert_eq!(send_batch(&tx, &bufs, &out, &off), 0);
        for (sock, want) in [(&a[0], vec![0u8, 1, 4]), (&b[0], vec![2u8, 3, 5])] {
            let mut slab = vec![0u8; 2048 * 8];
            let mut metas = [RecvMeta::default(); 8];
            let mut got = Vec::new();
            while got.len() < 3 {
                let n = recv_batch(sock, &mut slab, 2048, &mut metas).unwrap();
                for (i, m) in metas[..n].iter().enumerate() {
                    assert_eq!(m.len, 500 + usize::from(slab[i * 2048] % 2) * 100);
                    got.push(slab[i * 2048]);
                }
            }
            assert_eq!(got, want);
        }
    }
}
