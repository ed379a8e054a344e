//! GridFTP MODE E block header codec.
//!
//! Every block on a data connection starts with a 17-byte header, all fields
//! big-endian:
//!
//! ```text
//!  0        1                 9                 17
//!  +--------+-----------------+-----------------+-------------------+
//!  | desc u8| byte count u64  | offset u64      | count bytes data  |
//!  +--------+-----------------+-----------------+-------------------+
//! ```
//!
//! End of transfer follows GridFTP: one zero-length header carries EOF
//! (normally `EOF|EOD`, 0x48) and its *offset* field holds the number of
//! data connections used (the EOD count); every other connection ends with
//! a zero-length EOD (0x08).

use std::fmt;

/// Length of a MODE E block header in bytes.
pub const HEADER_LEN: usize = 17;

/// The descriptor byte of a block: a set of flag bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Descriptor(u8);

impl Descriptor {
    /// End of record (meaningless for image files; accepted and ignored).
    pub const EOR: Self = Self(0x80);
    /// End of file: the offset field carries the EOD count, byte count is 0.
    pub const EOF: Self = Self(0x40);
    /// The sender suspects errors in this block.
    pub const SUSPECT_ERRORS: Self = Self(0x20);
    /// The payload is a restart marker, not file data.
    pub const RESTART_MARKER: Self = Self(0x10);
    /// End of data on this connection.
    pub const EOD: Self = Self(0x08);
    /// The sender will close this connection after this block.
    pub const CLOSE: Self = Self(0x04);
    /// No flag set: a plain data block.
    pub const NONE: Self = Self(0);
    /// Every bit this codec knows; 0x02 and 0x01 are unassigned.
    const KNOWN: u8 = 0x80 | 0x40 | 0x20 | 0x10 | 0x08 | 0x04;

    /// The raw byte.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// A descriptor from a raw byte, refusing unassigned bits.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        if bits & !Self::KNOWN == 0 {
            Some(Self(bits))
        } else {
            None
        }
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Descriptor {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Descriptor({:#04x})", self.0)
    }
}

/// One decoded block header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BlockHeader {
    /// Flag bits.
    pub descriptor: Descriptor,
    /// Payload length in bytes following the header.
    pub count: u64,
    /// File offset of the payload, or the EOD count on an EOF block.
    pub offset: u64,
}

impl BlockHeader {
    /// A data block of `count` bytes at `offset`.
    pub const fn data(offset: u64, count: u64) -> Self {
        Self {
            descriptor: Descriptor::NONE,
            count,
            offset,
        }
    }

    /// The zero-length end-of-data block that ends one connection.
    pub const fn eod() -> Self {
        Self {
            descriptor: Descriptor::EOD,
            count: 0,
            offset: 0,
        }
    }

    /// The zero-length `EOF|EOD` block announcing that `eod_count` data
    /// connections (this one included) will each send one EOD.
    pub const fn eof(eod_count: u64) -> Self {
        Self {
            descriptor: Descriptor(Descriptor::EOF.0 | Descriptor::EOD.0),
            count: 0,
            offset: eod_count,
        }
    }

    /// The 17 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.descriptor.0;
        out[1..9].copy_from_slice(&self.count.to_be_bytes());
        out[9..17].copy_from_slice(&self.offset.to_be_bytes());
        out
    }

    /// Decode a header from the front of `buf`.
    ///
    /// `Ok(None)` means fewer than [`HEADER_LEN`] bytes are available yet;
    /// that is never an error. The header is validated: unassigned
    /// descriptor bits, an EOF block carrying data, and a data range that
    /// overflows `u64` are refused.
    pub fn decode(buf: &[u8]) -> Result<Option<Self>, BlockError> {
        let Some(raw) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let descriptor = Descriptor::from_bits(raw[0]).ok_or(BlockError::UnknownBits(raw[0]))?;
        let mut count = [0u8; 8];
        count.copy_from_slice(&raw[1..9]);
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&raw[9..17]);
        let h = Self {
            descriptor,
            count: u64::from_be_bytes(count),
            offset: u64::from_be_bytes(offset),
        };
        if descriptor.contains(Descriptor::EOF) {
            // The offset of an EOF block is a count, not a position.
            if h.count != 0 {
                return Err(BlockError::EofWithData { count: h.count });
            }
        } else if h.offset.checked_add(h.count).is_none() {
            return Err(BlockError::RangeOverflow {
                offset: h.offset,
                count: h.count,
            });
        }
        Ok(Some(h))
    }

    /// The end of the data range `[offset, offset + count)` (not for EOF).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.count)
    }
}

/// A malformed block header. The peer is at fault in every case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// The descriptor sets bits 0x02 or 0x01, which MODE E does not assign.
    #[error("block descriptor {0:#04x} has unassigned bits")]
    UnknownBits(u8),
    /// An EOF block must be zero-length: its offset field is the EOD count.
    #[error("EOF block carries {count} bytes of data")]
    EofWithData {
        /// The byte count found.
        count: u64,
    },
    /// `offset + count` does not fit in 64 bits.
    #[error("block range {offset}+{count} overflows")]
    RangeOverflow {
        /// Offset field.
        offset: u64,
        /// Count field.
        count: u64,
    },
}

/// Fuzz entry: decode a whole byte stream as a sequence of blocks, skipping
/// payloads. Must never panic, whatever the input.
#[doc(hidden)]
pub fn fuzz_decode(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some(h)) = BlockHeader::decode(rest) {
        let skip = usize::try_from(h.count)
            .ok()
            .and_then(|c| c.checked_add(HEADER_LEN))
            .unwrap_or(usize::MAX);
        // Re-encoding a valid header must give back the same bytes.
        assert_eq!(&h.encode()[..], &rest[..HEADER_LEN]);
        if skip > rest.len() {
            break;
        }
        rest = &rest[skip..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_layout() {
        let h = BlockHeader::data(0x0102_0304_0506_0708, 0x1122);
        let b = h.encode();
        assert_eq!(b[0], 0);
        assert_eq!(&b[1..9], &[0, 0, 0, 0, 0, 0, 0x11, 0x22]);
        assert_eq!(&b[9..17], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(BlockHeader::decode(&b), Ok(Some(h)));
    }

    #[test]
    fn end_blocks_match_gridftp() {
        let eof = BlockHeader::eof(4).encode();
        assert_eq!(eof[0], 0x48);
        assert_eq!(u64::from_be_bytes(eof[9..17].try_into().unwrap()), 4);
        assert_eq!(BlockHeader::eod().encode()[0], 0x08);
    }

    #[test]
    fn short_input_needs_more() {
        let b = BlockHeader::data(5, 6).encode();
        for n in 0..HEADER_LEN {
            assert_eq!(BlockHeader::decode(&b[..n]), Ok(None));
        }
    }

    #[test]
    fn malformed_is_typed() {
        let mut b = BlockHeader::data(1, 1).encode();
        b[0] = 0x02;
        assert_eq!(BlockHeader::decode(&b), Err(BlockError::UnknownBits(2)));
        let mut e = BlockHeader::eof(1);
        e.count = 3;
        assert_eq!(
            BlockHeader::decode(&e.encode()),
            Err(BlockError::EofWithData { count: 3 })
        );
        let o = BlockHeader::data(u64::MAX, 2);
        assert!(matches!(
            BlockHeader::decode(&o.encode()),
            Err(BlockError::RangeOverflow { .. })
        ));
    }

    #[test]
    fn fuzz_entry_survives_garbage() {
        fuzz_decode(&[]);
        fuzz_decode(&[0xff; 40]);
        let mut s = Vec::new();
        s.extend_from_slice(&BlockHeader::data(0, 3).encode());
        s.extend_from_slice(b"abc");
        s.extend_from_slice(&BlockHeader::eof(1).encode());
        s.extend_from_slice(&[0x40, 0, 0, 0, 0, 0, 0, 0, 9]);
        fuzz_decode(&s);
        let mut x = 0x1234_5678u32;
        let junk: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x & 0x4c) as u8
            })
            .collect();
        fuzz_decode(&junk);
    }
}
