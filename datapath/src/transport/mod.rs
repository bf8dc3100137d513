//! Transports that carry sealed frames between nodes: UDP (batched, GSO/GRO) on the
//! pipelines' own sockets, and the stream and QUIC transports (TCP, WebSocket over
//! plain TCP or TLS, QUIC datagrams) as connections managed by [`links`].
//!
//! Everything above this module names a path by an [`Endpoint`] (transport plus
//! address) and hands frames to an [`Egress`]; whether they leave through `sendmmsg`
//! or a connection's queue is decided here, once per batch.

pub mod conn;
pub mod frame;
pub mod links;
pub mod udp;

/// Firewall mark put on every socket Weft opens on the underlay (0: none). With an
/// exit node in use, policy routing sends unmarked traffic into the tunnel; the mark
/// keeps Weft's own packets on the main routing table.
static SOCKET_MARK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Sets the mark of the underlay sockets opened from now on (before any is opened).
pub fn set_socket_mark(mark: u32) {
    SOCKET_MARK.store(mark, std::sync::atomic::Ordering::Relaxed);
}

/// Puts the mark of [`set_socket_mark`] on `s`, when there is one (needs
/// CAP_NET_ADMIN).
pub fn mark_socket(s: &socket2::Socket) -> std::io::Result<()> {
    match SOCKET_MARK.load(std::sync::atomic::Ordering::Relaxed) {
        0 => Ok(()),
        m => s.set_mark(m),
    }
}

/// Lets the process use at most two malloc arenas. glibc gives each thread that
/// allocates an arena of its own (up to 8 per core); connection batch buffers are
/// taken on one thread and freed on another, and pages stayed resident in several
/// arenas: peak RSS of a TCP or QUIC end under traffic fell about 1–1.5 MiB with two
/// (bench/RESULTS.md §20). Call once, early; a no-op off glibc.
#[allow(unsafe_code)]
pub fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter, under the allocator's own lock.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

pub use links::{Egress, Forward, Inbound, Lane, Links, Unsent};
pub use weft_core::endpoint::{Endpoint, Proto, canonical};
