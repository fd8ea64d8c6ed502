//! The segment header (docs/FORMAT.md).
//!
//! ```text
//! offset size field
//!      0    4 magic         "JSEG"
//!      4    2 version       1
//!      6    2 flags         0
//!      8    8 segment_no    the segment's number
//!     16    8 segment_size  bytes in the file, header region included
//!     24   16 journal_id    identifies the journal the segment belongs to
//!     40    4 data_offset   where log data starts (4096)
//!     44    4 crc           CRC32C of bytes 0..44
//! ```
//! The rest of the 4096-byte header region is zero.

use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `JSEG` as a little-endian `u32`.
pub const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"JSEG");
/// The segment format version.
pub const SEGMENT_VERSION: u16 = 1;
/// Size of [`SegmentHeader`].
pub const SEGMENT_HEADER_SIZE: usize = 48;
/// Bytes reserved at the start of every segment for the header: log data
/// starts here, aligned for any record alignment up to 4 KiB.
pub const DATA_OFFSET: u64 = 4096;

/// A journal's identity, stamped into each of its segments.
pub type JournalId = [u8; 16];

/// The on-disk segment header.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct SegmentHeader {
    /// [`SEGMENT_MAGIC`].
    pub magic: U32,
    /// [`SEGMENT_VERSION`].
    pub version: U16,
    /// Zero.
    pub flags: U16,
    /// The segment's number.
    pub segment_no: U64,
    /// The segment's size in bytes.
    pub segment_size: U64,
    /// The journal's identity.
    pub journal_id: JournalId,
    /// [`DATA_OFFSET`].
    pub data_offset: U32,
    /// CRC32C of the preceding 44 bytes.
    pub crc: U32,
}

const_assert_eq!(std::mem::size_of::<SegmentHeader>(), SEGMENT_HEADER_SIZE);

/// Why a header was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderCheck {
    /// Valid.
    Valid(SegmentHeader),
    /// All zeros: a header never written (or lost before it was synced).
    Zeroes,
    /// Not a segment header.
    BadMagic,
    /// The checksum does not match.
    BadCrc,
    /// Written by another format version.
    UnsupportedVersion(u16),
    /// Fewer bytes than a header.
    Short,
}

impl SegmentHeader {
    /// A header for segment `n`.
    pub fn new(n: u64, segment_size: u64, journal_id: JournalId) -> Self {
        let mut h = Self {
            magic: U32::new(SEGMENT_MAGIC),
            version: U16::new(SEGMENT_VERSION),
            flags: U16::new(0),
            segment_no: U64::new(n),
            segment_size: U64::new(segment_size),
            journal_id,
            data_offset: U32::new(DATA_OFFSET as u32),
            crc: U32::new(0),
        };
        h.crc = U32::new(crc32c::crc32c(&h.as_bytes()[..44]));
        h
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; SEGMENT_HEADER_SIZE] {
        let mut out = [0u8; SEGMENT_HEADER_SIZE];
        out.copy_from_slice(self.as_bytes());
        out
    }

    /// Validates the header at the start of `buf`.
    pub fn check(buf: &[u8]) -> HeaderCheck {
        let Ok((h, _)) = SegmentHeader::read_from_prefix(buf) else {
            return HeaderCheck::Short;
        };
        if h.as_bytes().iter().all(|&b| b == 0) {
            return HeaderCheck::Zeroes;
        }
        if h.magic.get() != SEGMENT_MAGIC {
            return HeaderCheck::BadMagic;
        }
        if crc32c::crc32c(&h.as_bytes()[..44]) != h.crc.get() {
            return HeaderCheck::BadCrc;
        }
        // Trusted only once the CRC vouches for it (a flipped bit is
        // damage, not a newer format).
        if h.version.get() != SEGMENT_VERSION {
            return HeaderCheck::UnsupportedVersion(h.version.get());
        }
        HeaderCheck::Valid(h)
    }
}
