//! Where the pipelines read and write IP packets: a TUN queue (with virtio-net
//! offloads: split on read, coalesced on write) or the userspace stack's port (--no-tun).

use std::io;
use std::sync::{Mutex, mpsc};

use tracing::warn;
use tun_rs::{GROTable, SyncDevice, VIRTIO_NET_HDR_LEN};

use crate::gso;
use crate::transport::udp::Offload;

/// Where a pipeline reads the packets it seals and writes the packets it opens.
pub enum Device {
    /// A TUN queue.
    Tun(SyncDevice),
    /// A network stack in this process (no-TUN mode).
    User(UserPort),
}

/// The pipeline's side of an in-process network stack: packets the stack sends come
/// in through a channel, packets for the stack go out through a callback that must
/// not block (it returns false, and the packet is counted as a drop, when the stack is
/// behind).
pub struct UserPort {
    pub(super) outbound: Mutex<mpsc::Receiver<Vec<u8>>>,
    pub(super) deliver: Deliver,
}

/// Hands one packet to a userspace stack; false when it is behind.
pub type Deliver = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

impl UserPort {
    /// `outbound` yields what the stack sends; `deliver` hands it what arrives.
    pub fn new(outbound: mpsc::Receiver<Vec<u8>>, deliver: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> Self {
        Self { outbound: Mutex::new(outbound), deliver: Box::new(deliver) }
    }

    /// The channel of what the stack sends and the way in, for wiring a stack to
    /// something other than a pipeline (benches, tests).
    pub fn into_parts(self) -> (mpsc::Receiver<Vec<u8>>, Deliver) {
        (self.outbound.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner), self.deliver)
    }
}

impl std::fmt::Debug for UserPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserPort")
    }
}

/// RX's writer for a userspace stack: every packet is handed over whole (no
/// coalescing: the stack takes MTU-sized packets).
pub struct UserOut<'a> {
    pub(super) port: &'a UserPort,
}

impl TunWriter for UserOut<'_> {
    fn write_batch(&mut self, _gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        let mut refused = 0;
        for b in bufs.iter() {
            if !(self.port.deliver)(&b[VIRTIO_NET_HDR_LEN..]) {
                refused += 1;
            }
        }
        if refused > 0 {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, format!("network stack refused {refused} packets")));
        }
        Ok(())
    }
}

pub(super) enum DevOut<'a> {
    Tun(TunOut<'a>),
    User(UserOut<'a>),
}

impl<'a> DevOut<'a> {
    pub(super) fn new(dev: &'a Device, offload: &'a Offload, vnet_hdr: bool) -> Self {
        match dev {
            Device::Tun(d) => Self::Tun(TunOut::new(d, offload, vnet_hdr)),
            Device::User(port) => Self::User(UserOut { port }),
        }
    }
}

impl TunWriter for DevOut<'_> {
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        match self {
            Self::Tun(t) => t.write_batch(gro, bufs),
            Self::User(u) => u.write_batch(gro, bufs),
        }
    }

    fn write_super(&mut self, gro: &mut GROTable, pkt: &mut [u8], scratch: &mut [Vec<u8>]) -> io::Result<usize> {
        match self {
            Self::Tun(t) => t.write_super(gro, pkt, scratch),
            Self::User(u) => u.write_super(gro, pkt, scratch),
        }
    }
}

/// Where RX writes decrypted packets: the TUN queue, or a collector in tests.
pub trait TunWriter {
    /// Writes `bufs` (each with `VIRTIO_NET_HDR_LEN` bytes of headroom), coalescing
    /// where it can. Errors are counted by the caller.
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()>;

    /// Writes one GSO super-packet (`pkt`: a virtio header, then the packet) and
    /// returns how many packets it stands for. By default it is split into `scratch`
    /// ([`gso::split_into`]) and the segments go through [`TunWriter::write_batch`];
    /// errors of kind `InvalidData` are malformed super-packets.
    fn write_super(&mut self, gro: &mut GROTable, pkt: &mut [u8], scratch: &mut [Vec<u8>]) -> io::Result<usize> {
        split_and_write(self, gro, pkt, scratch)
    }
}

/// Splits a super-packet into `scratch` and writes the segments as one batch.
pub(super) fn split_and_write<W: TunWriter + ?Sized>(
    w: &mut W,
    gro: &mut GROTable,
    pkt: &mut [u8],
    scratch: &mut [Vec<u8>],
) -> io::Result<usize> {
    let n = gso::split_into(pkt, scratch)?;
    w.write_batch(gro, &mut scratch[..n])?;
    Ok(n)
}

/// The TUN queue as RX's writer: GRO-coalesced writes while the kernel accepts them;
/// the first EINVAL (kernels with the virtio csum_start regression refuse coalesced
/// writes) turns coalescing off for the whole node and the packets go one by one.
pub struct TunOut<'a> {
    pub(super) dev: &'a SyncDevice,
    pub(super) offload: &'a Offload,
    pub(super) vnet_hdr: bool,
}

impl<'a> TunOut<'a> {
    /// Wraps a TUN queue; `vnet_hdr` says whether it was opened with offload.
    pub fn new(dev: &'a SyncDevice, offload: &'a Offload, vnet_hdr: bool) -> Self {
        Self { dev, offload, vnet_hdr }
    }

    pub(super) fn write_plain(&self, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        let mut result = Ok(());
        for b in bufs.iter_mut() {
            // With offload every write carries a virtio header; an all-zero one means
            // "no GSO, checksum complete".
            let start = if self.vnet_hdr {
                b[..VIRTIO_NET_HDR_LEN].fill(0);
                0
            } else {
                VIRTIO_NET_HDR_LEN
            };
            if let Err(e) = self.dev.send(&b[start..]) {
                result = Err(e);
            }
        }
        result
    }
}

impl TunWriter for TunOut<'_> {
    fn write_batch(&mut self, gro: &mut GROTable, bufs: &mut [Vec<u8>]) -> io::Result<()> {
        if !self.vnet_hdr || !self.offload.tun_gro() {
            return self.write_plain(bufs);
        }
        match self.dev.send_multiple(gro, bufs, VIRTIO_NET_HDR_LEN) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if self.offload.disable_tun_gro() {
                    warn!(error = %e, "TUN refused a coalesced write; turning TUN GRO off");
                }
                // Some packets of the batch may have gone out already; TCP copes with
                // the duplicates, and this happens once.
                self.write_plain(bufs)
            }
            r => r.map(|_| ()),
        }
    }

    /// With offload the kernel takes the super-packet whole (after the header is
    /// checked) and segments it itself; otherwise, or once it refused a GSO write,
    /// it is split here.
    fn write_super(&mut self, gro: &mut GROTable, pkt: &mut [u8], scratch: &mut [Vec<u8>]) -> io::Result<usize> {
        if self.vnet_hdr && self.offload.tun_gro() {
            let (_, segments) = gso::normalize(pkt)?;
            if segments > gso::MAX_SEGMENTS {
                // No correct sender makes more (see `Tx::seal_super`): not the kernel's
                // work to cut a member's 64 KiB into 1-byte segments.
                return Err(io::Error::new(io::ErrorKind::InvalidData, "GSO record with too many segments"));
            }
            match self.dev.send(pkt) {
                Ok(_) => return Ok(segments),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    if self.offload.disable_tun_gro() {
                        warn!(error = %e, "TUN refused a GSO write; turning TUN GRO off");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        split_and_write(self, gro, pkt, scratch)
    }
}
