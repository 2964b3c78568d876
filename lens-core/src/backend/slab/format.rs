//! The slab's bytes: a 16-byte header (a backend marker, the slab size, the payload
//! length, a format version) and the start of the payload.

use crate::error::{Disagreement, Error, Result};

/// Bytes of the slab header.
pub const HEADER_LEN: usize = 16;
const FORMAT: u32 = 1;

/// One backend's slab: its marker, its size (header included) and the largest payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabFormat {
    /// Four bytes naming the backend, so another program's broadcast is not taken for ours.
    pub magic: [u8; 4],
    /// Slab size in bytes, header included; every rank must use the same.
    pub slab_size: usize,
    /// Largest payload a header may announce.
    pub max_payload: usize,
}

impl SlabFormat {
    /// Payload bytes that fit in the slab after the header.
    pub fn capacity(&self) -> usize {
        self.slab_size.saturating_sub(HEADER_LEN)
    }

    /// Writes the header and as much of `payload` as fits into `slab` (at least
    /// `slab_size` bytes); returns how many payload bytes went in.
    pub fn fill(&self, slab: &mut [u8], payload: &[u8]) -> usize {
        let first = payload.len().min(self.capacity());
        slab[..4].copy_from_slice(&self.magic);
        slab[4..8].copy_from_slice(&(self.slab_size as u32).to_le_bytes());
        slab[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        slab[12..16].copy_from_slice(&FORMAT.to_le_bytes());
        slab[HEADER_LEN..HEADER_LEN + first].copy_from_slice(&payload[..first]);
        first
    }

    /// Reads the header of a slab received from `root`; returns the payload length.
    ///
    /// # Errors
    /// [`Error::Mismatch`] when the slab is not ours (another marker or format version) or
    /// the root uses another slab size; [`Error::Corrupt`] when the announced length is
    /// over the limit. After any of these the collective's state is unknown (the root may
    /// still send a remainder), so backends refuse further rounds.
    pub fn read(&self, slab: &[u8], root: usize) -> Result<usize> {
        let Some(h) = slab.get(..HEADER_LEN) else {
            return Err(Error::Corrupt {
                reason: format!("a slab of {} bytes has no room for its header", slab.len()),
            });
        };
        let word =
            |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]) as usize;
        if h[..4] != self.magic || word(12) != FORMAT as usize {
            return Err(Error::mismatch(
                Disagreement::Format,
                format!(
                    "the slab from root {root} has no lens header of this backend and version \
                     (another program's broadcast, or a different lens)"
                ),
            ));
        }
        if word(4) != self.slab_size {
            return Err(Error::mismatch(
                Disagreement::SlabSize,
                format!(
                    "root {root} uses {}-byte slabs, this rank {}-byte ones",
                    word(4),
                    self.slab_size
                ),
            ));
        }
        if word(8) > self.max_payload {
            return Err(Error::Corrupt {
                reason: format!(
                    "the slab announces {} payload bytes, over the limit of {}",
                    word(8),
                    self.max_payload
                ),
            });
        }
        Ok(word(8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: SlabFormat = SlabFormat {
        magic: *b"TEST",
        slab_size: 32,
        max_payload: 100,
    };

    fn slab(payload: &[u8]) -> Vec<u8> {
        let mut s = vec![0u8; F.slab_size];
        F.fill(&mut s, payload);
        s
    }

    /// One row per case: (why, slab bytes, expected length or error kind).
    #[test]
    fn read_table() {
        let other_size = SlabFormat { slab_size: 64, ..F };
        let mut big = vec![0u8; 64];
        other_size.fill(&mut big, b"x");
        let mut over = slab(b"");
        over[8..12].copy_from_slice(&101u32.to_le_bytes());
        let mut other_format = slab(b"x");
        other_format[12] = 2;
        let rows: Vec<(&str, Vec<u8>, std::result::Result<usize, &str>)> = vec![
            ("empty payload", slab(b""), Ok(0)),
            ("fits", slab(b"hello"), Ok(5)),
            ("exactly the capacity", slab(&[7; 16]), Ok(16)),
            (
                "longer than the slab: the length says so",
                slab(&[7; 40]),
                Ok(40),
            ),
            ("all zeros (nothing was sent)", vec![0; 32], Err("format")),
            (
                "another backend's marker",
                {
                    let mut s = slab(b"x");
                    s[0] = b'X';
                    s
                },
                Err("format"),
            ),
            ("another format version", other_format, Err("format")),
            ("another slab size", big, Err("slab size")),
            ("length over the limit", over, Err("corrupt")),
            ("shorter than a header", vec![0; 8], Err("corrupt")),
        ];
        for (why, bytes, want) in rows {
            let got = F.read(&bytes, 3).map_err(|e| match e {
                Error::Mismatch {
                    about: Disagreement::Format,
                    ..
                } => "format",
                Error::Mismatch {
                    about: Disagreement::SlabSize,
                    ..
                } => "slab size",
                Error::Corrupt { .. } => "corrupt",
                _ => "other",
            });
            assert_eq!(got, want, "{why}");
        }
    }

    #[test]
    fn fill_writes_the_first_part() {
        let mut s = vec![0u8; 32];
        assert_eq!(F.fill(&mut s, &[9; 40]), 16);
        assert_eq!(&s[HEADER_LEN..], &[9; 16]);
        assert_eq!(F.capacity(), 16);
    }
}
