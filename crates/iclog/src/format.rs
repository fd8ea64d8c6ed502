//! The log record: the bytes of one buffer write (docs/FORMAT.md).
//!
//! ```text
//! offset size field
//!      0    4 magic        0x474C_4349 ("ICLG" as little-endian bytes)
//!      4    2 version      2 (1 is still read)
//!      6    2 flags        bits 0-1: IoFlags the record was written with
//!                          (informational); bit 2 CONTINUED, bit 3 CONTINUES
//!      8    8 lsn          the record's own LSN
//!     16    8 tail_lsn     the log tail when the record was stamped
//!     24    4 len          payload bytes (entries), excluding header and padding
//!     28    4 entry_count  number of entries in the payload
//!     32    4 crc          CRC32C of header (crc field zeroed) + payload
//!     36    8 durable_lsn  the ring's durable LSN when the record was submitted
//!     44    4 reserved     zero
//!     48  len payload      entries: u32 length, then that many bytes, repeated
//!      …      padding      zeros up to the next multiple of the alignment
//! ```

use crate::{IoFlags, Lsn};
use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// "ICLG" read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"ICLG");
/// The record format version this crate writes.
pub const VERSION: u16 = 2;
/// The oldest record format version this crate reads (version 1 has no
/// continuation records; its flag bits 2 and 3 are always zero).
pub const MIN_VERSION: u16 = 1;
/// Header flag: the record's first entry continues the last entry of the
/// previous record (a chain's middle or last part).
pub const CONTINUED: u16 = 1 << 2;
/// Header flag: the record's last entry continues in the next record (a
/// chain's first or middle part).
pub const CONTINUES: u16 = 1 << 3;
/// Size of [`RecordHeader`].
pub const HEADER_SIZE: usize = 48;
/// Size of the length prefix of each entry.
pub const ENTRY_HEADER_SIZE: usize = 4;

/// The on-disk header of a log record.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RecordHeader {
    /// [`MAGIC`].
    pub magic: U32,
    /// [`VERSION`].
    pub version: U16,
    /// [`IoFlags`] bits the record was written with (bits 0-1), and the
    /// chain bits [`CONTINUED`] and [`CONTINUES`].
    pub flags: U16,
    /// The record's own LSN.
    pub lsn: U64,
    /// The log tail stamped into the record.
    pub tail_lsn: U64,
    /// Payload length in bytes.
    pub len: U32,
    /// Number of entries in the payload.
    pub entry_count: U32,
    /// CRC32C of the header with this field zero, then the payload.
    pub crc: U32,
    /// The ring's durable LSN when the record was submitted: every record
    /// below it was durable before this one was written. Recovery uses it
    /// to tell a damaged durable record from a torn in-flight one. Zero in
    /// records of writers that did not stamp it.
    pub durable_lsn: U64,
    /// Zero.
    pub reserved: [u8; 4],
}

const_assert_eq!(std::mem::size_of::<RecordHeader>(), HEADER_SIZE);

/// Rounds `n` up to a multiple of `align` (a power of two).
pub fn align_up(n: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (n + align - 1) & !(align - 1)
}

/// The on-disk size of a record with `payload_len` bytes of entries.
pub fn record_size(payload_len: usize, align: u64) -> u64 {
    align_up((HEADER_SIZE + payload_len) as u64, align)
}

/// The checksum of a record: CRC32C over the header with `crc` zeroed, then
/// the payload.
pub fn record_crc(header: &RecordHeader, payload: &[u8]) -> u32 {
    let mut h = *header;
    h.crc = U32::new(0);
    crc32c::crc32c_append(crc32c::crc32c(h.as_bytes()), payload)
}

/// Writes a complete header for `payload` into `out[..HEADER_SIZE]`;
/// `chain` is zero or a combination of [`CONTINUED`] and [`CONTINUES`].
#[allow(clippy::too_many_arguments)]
pub fn encode_header(
    out: &mut [u8],
    lsn: Lsn,
    tail_lsn: Lsn,
    durable_lsn: Lsn,
    flags: IoFlags,
    chain: u16,
    entry_count: u32,
    payload: &[u8],
) {
    debug_assert_eq!(chain & !(CONTINUED | CONTINUES), 0);
    let mut h = RecordHeader {
        magic: U32::new(MAGIC),
        version: U16::new(VERSION),
        flags: U16::new(flags.bits() | chain),
        lsn: U64::new(lsn.0),
        tail_lsn: U64::new(tail_lsn.0),
        len: U32::new(payload.len() as u32),
        entry_count: U32::new(entry_count),
        crc: U32::new(0),
        durable_lsn: U64::new(durable_lsn.0),
        reserved: [0; 4],
    };
    h.crc = U32::new(record_crc(&h, payload));
    out[..HEADER_SIZE].copy_from_slice(h.as_bytes());
}

/// A record that passed every check.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The header.
    pub header: RecordHeader,
    /// The entries, still framed.
    pub payload: &'a [u8],
    /// Bytes from the record's start to the next record (header, payload,
    /// padding).
    pub size: u64,
}

impl<'a> Record<'a> {
    /// The record's LSN.
    pub fn lsn(&self) -> Lsn {
        Lsn(self.header.lsn.get())
    }
    /// The LSN just past the record's padding, where the next record starts.
    pub fn end(&self) -> Lsn {
        self.lsn().plus(self.size)
    }
    /// The durable LSN stamped into the record at submission.
    pub fn durable_lsn(&self) -> Lsn {
        Lsn(self.header.durable_lsn.get())
    }

    /// The log tail stamped into the record.
    pub fn tail_lsn(&self) -> Lsn {
        Lsn(self.header.tail_lsn.get())
    }
    /// The flags it was written with (unknown bits dropped).
    pub fn flags(&self) -> IoFlags {
        IoFlags::from_bits_truncate(self.header.flags.get())
    }
    /// Whether its first entry continues the previous record's last one
    /// ([`CONTINUED`]).
    pub fn continued(&self) -> bool {
        self.header.flags.get() & CONTINUED != 0
    }
    /// Whether its last entry continues in the next record ([`CONTINUES`]).
    pub fn continues(&self) -> bool {
        self.header.flags.get() & CONTINUES != 0
    }
    /// The entries: `(lsn of the entry, payload bytes)`.
    pub fn entries(&self) -> Entries<'a> {
        Entries {
            rest: self.payload,
            lsn: self.lsn().plus(HEADER_SIZE as u64),
            left: self.header.entry_count.get(),
        }
    }
}

/// Iterator over the entries of a [`Record`]. The payload was covered by
/// the CRC, so a framing error here means a writer bug; it ends the
/// iteration early rather than panicking.
#[derive(Debug, Clone)]
pub struct Entries<'a> {
    rest: &'a [u8],
    lsn: Lsn,
    left: u32,
}

impl<'a> Iterator for Entries<'a> {
    type Item = (Lsn, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 || self.rest.len() < ENTRY_HEADER_SIZE {
            return None;
        }
        let (len, _) = U32::read_from_prefix(self.rest).ok()?;
        let len = len.get() as usize;
        let body = self.rest.get(ENTRY_HEADER_SIZE..ENTRY_HEADER_SIZE + len)?;
        let lsn = self.lsn;
        let step = ENTRY_HEADER_SIZE + len;
        self.rest = &self.rest[step..];
        self.lsn = self.lsn.plus(step as u64);
        self.left -= 1;
        Some((lsn, body))
    }
}

/// What a parser found at an expected LSN. Recovery decides what each
/// outcome means (end of log, torn write, corruption).
#[derive(Debug, Clone, Copy)]
pub enum RecordCheck<'a> {
    /// A valid record with the expected LSN.
    Valid(Record<'a>),
    /// The header is all zeros: never-written (zero-filled) space, the
    /// normal end of the log.
    Zeroes,
    /// Not a record header (and not zeros): garbage, or the end of the log
    /// in space that was never zero-filled.
    BadMagic {
        /// The magic found.
        found: u32,
    },
    /// A record written by a newer (or unknown) format version.
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// A well-formed header carrying another LSN: stale bytes left from an
    /// earlier use of a recycled file, never data of this position.
    LsnMismatch {
        /// The LSN in the header.
        found: Lsn,
    },
    /// The header claims more bytes than the buffer holds (a record cut
    /// short by the end of the data read, or a corrupt length).
    Truncated {
        /// The bytes the record needs (header + payload).
        needed: u64,
        /// The bytes available.
        available: u64,
    },
    /// Header and length are plausible but the checksum does not match: a
    /// torn or corrupt record.
    CrcMismatch {
        /// The checksum stored.
        stored: u32,
        /// The checksum computed.
        computed: u32,
    },
    /// The checksum matches but the entries do not tile the payload — an
    /// entry's length runs past it, bytes are left over, or their number
    /// is not `entry_count`: no writer makes such a record, so it is
    /// corrupt (rewritten with its CRC), and none of its entries is
    /// handed out.
    BadEntries {
        /// The entry count the header claims.
        claimed: u32,
    },
}

/// Whether the entries of `payload` tile it exactly, `count` of them.
fn entries_tile(payload: &[u8], count: u32) -> bool {
    let mut rest = payload;
    let mut n = 0u32;
    while !rest.is_empty() {
        let Some(len) = rest.get(..ENTRY_HEADER_SIZE) else {
            return false;
        };
        let mut w = [0u8; ENTRY_HEADER_SIZE];
        w.copy_from_slice(len);
        let step = (u32::from_le_bytes(w) as usize).checked_add(ENTRY_HEADER_SIZE);
        match step.and_then(|s| rest.get(s..)) {
            Some(r) => rest = r,
            None => return false,
        }
        n = match n.checked_add(1) {
            Some(n) => n,
            None => return false,
        };
    }
    n == count
}

/// Validates the record at the start of `buf`, which was read at `expected`.
///
/// `max_payload` bounds the length field (a corrupt length larger than any
/// buffer could hold is reported as [`RecordCheck::Truncated`]); `align` is
/// the record alignment, used to compute [`Record::size`].
pub fn parse_record(buf: &[u8], expected: Lsn, max_payload: usize, align: u64) -> RecordCheck<'_> {
    let Ok((h, _)) = RecordHeader::read_from_prefix(buf) else {
        if buf.iter().all(|&b| b == 0) {
            return RecordCheck::Zeroes;
        }
        return RecordCheck::Truncated {
            needed: HEADER_SIZE as u64,
            available: buf.len() as u64,
        };
    };
    if h.magic.get() != MAGIC {
        if buf[..HEADER_SIZE].iter().all(|&b| b == 0) {
            return RecordCheck::Zeroes;
        }
        return RecordCheck::BadMagic {
            found: h.magic.get(),
        };
    }
    if h.lsn.get() != expected.0 {
        return RecordCheck::LsnMismatch {
            found: Lsn(h.lsn.get()),
        };
    }
    let len = h.len.get() as usize;
    let needed = (HEADER_SIZE + len) as u64;
    if len > max_payload || buf.len() < HEADER_SIZE + len {
        return RecordCheck::Truncated {
            needed,
            available: buf.len() as u64,
        };
    }
    let payload = &buf[HEADER_SIZE..HEADER_SIZE + len];
    let computed = record_crc(&h, payload);
    if computed != h.crc.get() {
        return RecordCheck::CrcMismatch {
            stored: h.crc.get(),
            computed,
        };
    }
    // The version is trusted only once the CRC vouches for it: a flipped
    // bit there is corruption, not a newer format (every version keeps
    // the 48-byte header and the CRC's place and coverage).
    if !(MIN_VERSION..=VERSION).contains(&h.version.get()) {
        return RecordCheck::UnsupportedVersion {
            found: h.version.get(),
        };
    }
    if !entries_tile(payload, h.entry_count.get()) {
        return RecordCheck::BadEntries {
            claimed: h.entry_count.get(),
        };
    }
    RecordCheck::Valid(Record {
        header: h,
        payload,
        size: record_size(len, align),
    })
}

/// The header at the start of `buf` if it carries the record magic (no
/// other check): a cheap probe for scanners looking for record starts.
pub fn peek_header(buf: &[u8]) -> Option<RecordHeader> {
    let (h, _) = RecordHeader::read_from_prefix(buf).ok()?;
    (h.magic.get() == MAGIC).then_some(h)
}

/// One piece of the entry structure, as [`Chains::feed`] hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// An entry written in one piece.
    Whole(Lsn, &'a [u8]),
    /// A part of a chain; the chain's LSN is `first` (the first part's).
    /// The parts of a chain come in order, the first with `lsn == first`.
    Part {
        /// The chain's LSN.
        first: Lsn,
        /// This part's bytes.
        bytes: &'a [u8],
        /// Whether this is the last part: the chain is whole.
        last: bool,
    },
    /// A part of a chain whose beginning was not fed (reading began in the
    /// middle of a chain): it can never be made whole here.
    Orphan(&'a [u8]),
    /// The open chain begun at this LSN will never be whole: the record
    /// just fed does not continue it. Only a crash in the middle of a
    /// chain (an unacknowledged append, cut as a torn tail) followed by new
    /// appends leaves this. Discard its parts.
    Abandoned(Lsn),
}

/// What [`Chains::feed`] dropped: parts that can never make a whole
/// entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// A chain begun at this LSN was not continued (also reported as
    /// [`Piece::Abandoned`]).
    pub abandoned: Option<Lsn>,
    /// The record started with a continuation of a chain whose beginning
    /// was not fed (reading began in the middle of a chain): skipped.
    pub orphan: bool,
}

/// Follows the chain structure of valid records fed in LSN order, with no
/// gap between them (format version 2; see the module docs), and tells
/// each entry's place in it. It copies nothing: [`Assembler`] builds on
/// it to concatenate chains, a zero-copy reader keeps the parts as views.
#[derive(Debug, Default, Clone, Copy)]
pub struct Chains {
    /// The LSN of the chain whose next part is expected.
    open: Option<Lsn>,
}

impl Chains {
    /// No chain open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next record; `out` receives its pieces in LSN order: one
    /// per entry ([`Piece::Whole`], [`Piece::Part`], [`Piece::Orphan`]),
    /// after a [`Piece::Abandoned`] if the record ends an open chain.
    pub fn feed<'a>(&mut self, rec: &Record<'a>, mut out: impl FnMut(Piece<'a>)) -> Dropped {
        let mut dropped = Dropped::default();
        let n = rec.header.entry_count.get() as usize;
        let mut entries = rec.entries().enumerate();
        if rec.continued() {
            match (self.open.take(), entries.next()) {
                (Some(first), Some((i, (_, bytes)))) => {
                    let last = !(i + 1 == n && rec.continues());
                    out(Piece::Part { first, bytes, last });
                    if !last {
                        self.open = Some(first);
                    }
                }
                (None, Some((_, (_, bytes)))) => {
                    dropped.orphan = true;
                    out(Piece::Orphan(bytes));
                }
                (open, None) => self.open = open,
            }
        } else if let Some(first) = self.open.take() {
            dropped.abandoned = Some(first);
            out(Piece::Abandoned(first));
        }
        for (i, (lsn, bytes)) in entries {
            if i + 1 == n && rec.continues() {
                self.open = Some(lsn);
                out(Piece::Part {
                    first: lsn,
                    bytes,
                    last: false,
                });
            } else {
                out(Piece::Whole(lsn, bytes));
            }
        }
        dropped
    }

    /// The LSN of a chain still open (its last part not fed yet).
    pub fn pending(&self) -> Option<Lsn> {
        self.open
    }

    /// Forgets the open chain (the reader skipped ahead); returns its LSN.
    pub fn reset(&mut self) -> Option<Lsn> {
        self.open.take()
    }
}

/// A whole entry, as [`Assembler::feed`] hands it out.
#[derive(Debug)]
pub enum Whole<'a> {
    /// An entry written in one piece: borrowed from the record.
    Single(Lsn, &'a [u8]),
    /// A chain whose last part this record held, its parts concatenated.
    Chained(Lsn, Vec<u8>),
}

/// Reassembles whole entries from valid records fed in LSN order, copying
/// each chain's parts into one buffer ([`Chains`] does the bookkeeping).
#[derive(Debug, Default)]
pub struct Assembler {
    chains: Chains,
    /// The bytes of the open chain so far.
    bytes: Vec<u8>,
}

impl Assembler {
    /// An assembler with no chain open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next record; `out` receives every whole entry it
    /// completes, in LSN order.
    pub fn feed<'a>(&mut self, rec: &Record<'a>, mut out: impl FnMut(Whole<'a>)) -> Dropped {
        let bytes = &mut self.bytes;
        self.chains.feed(rec, |p| match p {
            Piece::Whole(l, b) => out(Whole::Single(l, b)),
            Piece::Part {
                first,
                bytes: b,
                last,
            } => {
                bytes.extend_from_slice(b);
                if last {
                    out(Whole::Chained(first, std::mem::take(bytes)));
                }
            }
            Piece::Abandoned(_) => bytes.clear(),
            Piece::Orphan(_) => {}
        })
    }

    /// The first LSN of a chain still open (its last part not fed yet).
    pub fn pending(&self) -> Option<Lsn> {
        self.chains.pending()
    }

    /// Forgets the open chain (the reader skipped ahead); returns its LSN.
    pub fn reset(&mut self) -> Option<Lsn> {
        self.bytes.clear();
        self.chains.reset()
    }
}
