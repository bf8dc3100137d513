//! The TUN device: one queue per pipeline, with virtio-net offload when the kernel
//! accepts it (TSO super-packets split on read, GRO coalescing on write).

use std::io;
use std::net::Ipv4Addr;

use thiserror::Error;
use tracing::{info, warn};
use tun_rs::DeviceBuilder;
pub use tun_rs::SyncDevice;

/// What to create.
#[derive(Debug, Clone)]
pub struct TunConfig {
    /// Interface name.
    pub name: String,
    /// Overlay address of this node.
    pub ipv4: Ipv4Addr,
    /// Prefix length of the overlay network.
    pub prefix: u8,
    /// Inner MTU.
    pub mtu: u16,
    /// Number of queues (one per pipeline).
    pub queues: usize,
    /// Try virtio-net offload (falls back without it).
    pub offload: bool,
}

/// Errors opening the TUN device.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TunError {
    /// `/dev/net/tun` is missing.
    #[error(
        "TUN unavailable: /dev/net/tun does not exist (load the tun module, or pass the device into the container)"
    )]
    Unavailable(#[source] io::Error),
    /// Not root and no CAP_NET_ADMIN.
    #[error("permission denied creating TUN device {name:?}: run as root or grant CAP_NET_ADMIN")]
    Permission {
        /// Interface name.
        name: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Anything else the kernel refused.
    #[error("cannot create TUN device {name:?}")]
    Other {
        /// Interface name.
        name: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// The opened device: one `SyncDevice` per queue.
pub struct Tun {
    /// Queues; queue 0 is the device itself, the rest are clones.
    pub queues: Vec<SyncDevice>,
    /// Whether virtio-net offload is on.
    pub offload: bool,
}

impl std::fmt::Debug for Tun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tun").field("queues", &self.queues.len()).field("offload", &self.offload).finish()
    }
}

impl Tun {
    /// Creates and configures the device.
    pub fn open(cfg: &TunConfig) -> Result<Self, TunError> {
        if !std::path::Path::new("/dev/net/tun").exists() {
            return Err(TunError::Unavailable(io::Error::from(io::ErrorKind::NotFound)));
        }
        let first = if cfg.offload {
            match build(cfg, true) {
                Ok(d) => Some(d),
                Err(e) if is_permission(&e) => return Err(classify(cfg, e)),
                Err(e) => {
                    warn!(error = %e, "TUN offload refused by the kernel; continuing without it");
                    None
                }
            }
        } else {
            None
        };
        let (dev, offload) = match first {
            Some(d) => (d, true),
            None => (build(cfg, false).map_err(|e| classify(cfg, e))?, false),
        };
        let mut queues = Vec::with_capacity(cfg.queues);
        for _ in 1..cfg.queues {
            queues.push(dev.try_clone().map_err(|e| classify(cfg, e))?);
        }
        queues.insert(0, dev);
        info!(dev = %cfg.name, queues = queues.len(), offload, "TUN device up");
        Ok(Self { queues, offload })
    }
}

/// Turns the device's offloads off (`TUNSETOFFLOAD` with no `TUN_F_*` flag: no
/// partial checksums, TSO or USO): from then on the kernel checksums and segments
/// what it hands over itself. The mask is the device's, so one queue is enough; reads
/// and writes keep their virtio header. For a kernel whose offload corrupts packets
/// (members receive them with bad checksums).
#[allow(unsafe_code)]
pub fn disable_offload(queue: &SyncDevice) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the queue's descriptor stays open for the whole call, and TUNSETOFFLOAD
    // takes its argument (the flag mask) by value.
    let r = unsafe { libc::ioctl(queue.as_raw_fd(), libc::TUNSETOFFLOAD, libc::c_ulong::from(0u8)) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

fn build(cfg: &TunConfig, offload: bool) -> io::Result<SyncDevice> {
    DeviceBuilder::new()
        .name(&cfg.name)
        .ipv4(cfg.ipv4, cfg.prefix, None)
        .mtu(cfg.mtu)
        .tx_queue_len(1000)
        .offload(offload)
        .multi_queue(cfg.queues > 1)
        .build_sync()
}

fn is_permission(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied || e.raw_os_error() == Some(libc::EPERM)
}

fn classify(cfg: &TunConfig, e: io::Error) -> TunError {
    let name = cfg.name.clone();
    if is_permission(&e) {
        TunError::Permission { name, source: e }
    } else if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::ENODEV) {
        TunError::Unavailable(e)
    } else {
        TunError::Other { name, source: e }
    }
}
