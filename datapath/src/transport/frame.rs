//! Framing of sealed frames on stream transports (TCP, WebSocket) and in the queues
//! between the pipelines and the connections: each frame is a 2-byte big-endian length
//! followed by that many bytes. A *batch* is a run of such records, so a whole TX
//! batch to one connection is one buffer, one `write_all` or one WebSocket message.
//!
//! Lengths of zero are invalid (no message of ours is empty): a peer that sends one is
//! speaking something else, and its connection is closed.

use thiserror::Error;

/// Bytes of the length prefix.
pub const PREFIX: usize = 2;
/// Largest frame a record can carry.
pub const MAX_FRAME: usize = u16::MAX as usize;

/// A stream that does not carry our framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FrameError {
    /// A record announced a zero length.
    #[error("zero-length frame")]
    Empty,
    /// A complete batch ended inside a record.
    #[error("batch ends inside a frame")]
    Truncated,
}

/// Appends one frame to a batch. Frames longer than [`MAX_FRAME`] are refused
/// (returns false); the pipelines never produce them.
pub fn push(batch: &mut Vec<u8>, frame: &[u8]) -> bool {
    if frame.is_empty() || frame.len() > MAX_FRAME {
        return false;
    }
    batch.extend_from_slice(&(frame.len() as u16).to_be_bytes());
    batch.extend_from_slice(frame);
    true
}

/// The frames of a complete batch (a WebSocket message, a queued batch).
pub fn frames(batch: &[u8]) -> Frames<'_> {
    Frames { rest: batch }
}

/// Iterator over the frames of a complete batch; yields an error (and stops) at the
/// first malformed record.
pub struct Frames<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<&'a [u8], FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let r = match complete(self.rest) {
            Ok(Some(n)) => {
                let f = &self.rest[PREFIX..n];
                self.rest = &self.rest[n..];
                Ok(f)
            }
            Ok(None) => Err(FrameError::Truncated),
            Err(e) => Err(e),
        };
        if r.is_err() {
            self.rest = &[];
        }
        Some(r)
    }
}

/// How many leading bytes of `buf` form complete records (for a byte stream that
/// arrives in pieces): the caller passes those on as a batch and keeps the rest.
pub fn complete_prefix(buf: &[u8]) -> Result<usize, FrameError> {
    let mut used = 0;
    while let Some(n) = complete(&buf[used..])? {
        used += n;
    }
    Ok(used)
}

/// Where the frame of the first record of a complete batch lies (`None` at its
/// end), for handling frames in place.
pub fn first(batch: &[u8]) -> Option<Result<std::ops::Range<usize>, FrameError>> {
    if batch.is_empty() {
        return None;
    }
    Some(match complete(batch) {
        Ok(Some(n)) => Ok(PREFIX..n),
        Ok(None) => Err(FrameError::Truncated),
        Err(e) => Err(e),
    })
}

/// Length of the first record of `buf` if it is complete.
fn complete(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(head) = buf.first_chunk::<PREFIX>() else { return Ok(None) };
    let len = usize::from(u16::from_be_bytes(*head));
    if len == 0 {
        return Err(FrameError::Empty);
    }
    Ok((buf.len() >= PREFIX + len).then_some(PREFIX + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip() {
        let mut b = Vec::new();
        assert!(push(&mut b, b"abc"));
        assert!(push(&mut b, &[7u8; 1500]));
        assert!(!push(&mut b, b""));
        assert!(!push(&mut b, &vec![0u8; MAX_FRAME + 1]));
        assert_eq!(&b[..5], &[0, 3, b'a', b'b', b'c']);
        let got: Vec<&[u8]> = frames(&b).collect::<Result<_, _>>().unwrap();
        assert_eq!(got, [&b"abc"[..], &[7u8; 1500][..]]);
        assert_eq!(complete_prefix(&b), Ok(b.len()));
    }

    #[test]
    fn pieces_and_garbage() {
        let mut b = Vec::new();
        push(&mut b, b"hello");
        push(&mut b, b"world!");
        // A stream cut anywhere yields only whole records.
        for cut in 0..b.len() {
            let n = complete_prefix(&b[..cut]).unwrap();
            assert!(n == 0 || n == 7, "cut {cut} gave {n}");
            assert!(n <= cut);
        }
        assert_eq!(frames(&b[..9]).nth(1), Some(Err(FrameError::Truncated)));
        assert_eq!(complete_prefix(&[0, 0, 1]), Err(FrameError::Empty));
        assert_eq!(first(&b), Some(Ok(2..7)));
        assert_eq!(first(&b[7..]), Some(Ok(2..8)));
        assert_eq!(first(&b[..6]), Some(Err(FrameError::Truncated)));
        assert_eq!(first(&[]), None);
        let mut it = frames(&[0, 1, 9, 0, 0, 0, 1, 9]);
        assert_eq!(it.next(), Some(Ok(&[9u8][..])));
        assert_eq!(it.next(), Some(Err(FrameError::Empty)));
        assert_eq!(it.next(), None, "stops at the first error");
    }
}
