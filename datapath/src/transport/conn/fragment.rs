//! Frames larger than a QUIC datagram: split into numbered parts and reassembled, with
//! bounds on what a peer can make us hold.

use bytes::Bytes;

/// Datagram tag: a whole frame follows.
pub(super) const WHOLE: u8 = 0;

/// Datagram tag: a fragment follows, after `id: u16, index: u8, count: u8`.
pub(super) const PART: u8 = 1;

pub(super) const PART_HEADER: usize = 5;

/// Splits a frame into QUIC datagrams of at most `max` bytes (none when it would
/// take more than 255).
pub fn fragment(f: &[u8], max: usize, id: u16) -> Vec<Bytes> {
    if f.len() < max {
        let mut d = Vec::with_capacity(1 + f.len());
        d.push(WHOLE);
        d.extend_from_slice(f);
        return vec![d.into()];
    }
    let chunk = max.saturating_sub(PART_HEADER).max(1);
    let count = f.len().div_ceil(chunk);
    if count > usize::from(u8::MAX) {
        return Vec::new();
    }
    f.chunks(chunk)
        .enumerate()
        .map(|(i, c)| {
            let mut d = Vec::with_capacity(PART_HEADER + c.len());
            d.push(PART);
            d.extend_from_slice(&id.to_be_bytes());
            d.push(i as u8);
            d.push(count as u8);
            d.extend_from_slice(c);
            d.into()
        })
        .collect()
}

/// A QUIC datagram that no weft node sends; its connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed QUIC datagram")]
pub struct MalformedDatagram;

/// Reassembles fragmented frames of one QUIC connection; keeps a few incomplete ones
/// (a lost fragment loses its frame, like a lost datagram). Pure: public so that the
/// fuzz targets reach it.
#[derive(Debug, Default)]
pub struct Reassembly {
    /// (id, count, received parts).
    pub(super) partial: Vec<(u16, u8, Vec<Option<Bytes>>)>,
}

impl Reassembly {
    const KEEP: usize = 8;

    /// Takes one datagram; returns a complete frame when there is one (at most `mtu`
    /// bytes), an error for a datagram no weft node sends.
    pub fn push(&mut self, d: &Bytes, mtu: usize) -> Result<Option<Vec<u8>>, MalformedDatagram> {
        match d.first() {
            Some(&WHOLE) if d.len() > 1 => Ok(Some(d[1..].to_vec())),
            Some(&PART) if d.len() > PART_HEADER => {
                let id = u16::from_be_bytes([d[1], d[2]]);
                let (index, count) = (d[3], d[4]);
                let max_parts = mtu.div_ceil(16).min(usize::from(u8::MAX));
                if count < 2 || index >= count || usize::from(count) > max_parts {
                    return Err(MalformedDatagram);
                }
                let pos = match self.partial.iter().position(|p| p.0 == id && p.1 == count) {
                    Some(p) => p,
                    None => {
                        if self.partial.len() == Self::KEEP {
                            self.partial.remove(0);
                        }
                        self.partial.push((id, count, vec![None; usize::from(count)]));
                        self.partial.len() - 1
                    }
                };
                self.partial[pos].2[usize::from(index)] = Some(d.slice(PART_HEADER..));
                if self.partial[pos].2.iter().all(Option::is_some) {
                    let (_, _, parts) = self.partial.remove(pos);
                    let mut f = Vec::new();
                    for p in parts.into_iter().flatten() {
                        f.extend_from_slice(&p);
                    }
                    if f.len() > mtu {
                        return Err(MalformedDatagram);
                    }
                    return Ok(Some(f));
                }
                Ok(None)
            }
            _ => Err(MalformedDatagram),
        }
    }
}
