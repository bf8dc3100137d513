//! Transports that carry sealed frames between nodes: UDP (batched, GSO/GRO) on the
//! pipelines' own sockets, and the stream and QUIC transports (TCP, WebSocket over
//! plain TCP or TLS, QUIC datagrams) as connections managed by [`connections`].
//!
//! Everything above this module names a path by an [`Endpoint`] (transport plus
//! address) and hands frames to an [`Egress`]; whether they leave through `sendmmsg`
//! or a connection's queue is decided here, once per batch.

pub mod conn;
pub mod connections;
pub mod egress;
pub mod frame;
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

pub use conn::Pace;
pub use connections::{Connections, Forward, Inbound};
pub use egress::{Egress, Unsent};
pub use weft_core::endpoint::{Endpoint, Proto, canonical};

/// Which lane of a connection's send queue a batch waits in. The writer takes every
/// sparse batch before the next bulk one: a ping, a keystroke, a game packet, DNS or a
/// handshake never waits behind the downloads queued on the same connection (the
/// sparse-flow priority of fq_codel, per connection). Flows are told apart by their
/// rate ([`weft_core::queue::FlowLoad`]), so a flow's packets stay in one lane while
/// its rate does; a flow that becomes bulk moves from the lane taken first to the
/// other, and keeps its order. (A bulk flow idle for two of its windows turns sparse
/// again; should its last batches still wait in the bulk lane then, its next packet
/// may overtake them, as in fq_codel.) Sparse batches go first, not only:
/// [`connections::CONN_SPARSE_QUANTUM`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Bulk flows, and what nobody classified (relayed frames but the small ones their
    /// senders flag sparse): CoDel keeps this lane short.
    #[default]
    Bulk,
    /// Sparse flows and the node's own control messages: taken first, never dropped.
    Sparse,
}

/// One datagram to send: `len` bytes at offset `start` of buffer `buf` of the batch.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing {
    /// Index into the buffer array.
    pub buf: usize,
    /// Offset of the datagram in that buffer.
    pub start: usize,
    /// Bytes to send.
    pub len: usize,
    /// Destination.
    pub to: Endpoint,
    /// The lane of a connection's send queue it waits in (UDP: none, the batch goes
    /// out in one `sendmmsg`).
    pub lane: Lane,
    /// Sent as a datagram of its own, never in a UDP GSO run (the path loses
    /// segmentation-offloaded batches: [`weft_core::session::Session::gso_off`]).
    pub single: bool,
}
