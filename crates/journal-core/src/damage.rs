//! What recovery and the readers found where a valid record was expected.

use crate::Geometry;
use iclog::format::{Record, RecordCheck};
use iclog::Lsn;
use std::fmt;

/// What was found at a position where a record was expected and no valid
/// one starts. Reported by recovery ([`crate::LogEnd`],
/// [`crate::Error::Corruption`], [`crate::SkippedRange`]) and by the
/// inspection tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Damage {
    /// An all-zero header: never-written (zero-filled) space.
    Zeroes,
    /// The segment file that would hold this position does not exist.
    NoSegment {
        /// Its number.
        segment: u64,
    },
    /// Not a record header, and not zeros.
    BadMagic {
        /// The magic found.
        found: u32,
    },
    /// A header of another format version.
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// A well-formed header of an earlier use of this very place in a
    /// recycled segment: its LSN is lower than the expected one by a whole
    /// number of segments. Stale bytes, never data of this position.
    StaleLsn {
        /// The LSN in the header.
        found: Lsn,
    },
    /// A header whose LSN is neither the expected one nor a stale one (not
    /// lower by a whole number of segments): the LSN field is damaged. (A
    /// single flipped bit never passes for stale: no power of two is a
    /// multiple of a segment's data size.)
    CorruptLsn {
        /// The LSN in the header.
        found: Lsn,
    },
    /// The header claims more bytes than the log holds there.
    Truncated {
        /// Bytes the record needs (header + payload).
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// Header and length are plausible but the checksum does not match.
    CrcMismatch {
        /// The checksum stored.
        stored: u32,
        /// The checksum computed.
        computed: u32,
    },
    /// The checksum matches but the entries do not tile the payload (a
    /// record rewritten along with its CRC): corrupt, and none of its
    /// entries is read.
    BadEntries {
        /// The entry count the header claims.
        claimed: u32,
    },
    /// The log ends inside a chained record (one written in parts across
    /// records): its last part never made it. Reported by
    /// [`crate::RecoveryMode::AbsoluteConsistency`]; the other modes cut
    /// the chain like a torn tail ([`crate::RecoveryReport::torn_chain`]).
    ChainCut {
        /// The LSN of the chain's first part (the record's LSN).
        first: Lsn,
    },
}

impl Damage {
    /// Splits a parser result for a record expected at `at` into the valid
    /// record or what was found instead.
    pub fn classify(
        check: RecordCheck<'_>,
        at: Lsn,
        geometry: Geometry,
    ) -> Result<Record<'_>, Damage> {
        Err(match check {
            RecordCheck::Valid(r) => return Ok(r),
            RecordCheck::Zeroes => Damage::Zeroes,
            RecordCheck::BadMagic { found } => Damage::BadMagic { found },
            RecordCheck::UnsupportedVersion { found } => Damage::UnsupportedVersion { found },
            RecordCheck::LsnMismatch { found } => {
                let stale = found < at && (at.0 - found.0).is_multiple_of(geometry.data_size());
                if stale {
                    Damage::StaleLsn { found }
                } else {
                    Damage::CorruptLsn { found }
                }
            }
            RecordCheck::Truncated { needed, available } => Damage::Truncated { needed, available },
            RecordCheck::CrcMismatch { stored, computed } => {
                Damage::CrcMismatch { stored, computed }
            }
            RecordCheck::BadEntries { claimed } => Damage::BadEntries { claimed },
        })
    }

    /// Whether this is a bad record (torn or corrupt: truncated, failed
    /// checksum, damaged LSN, unknown version) rather than what a clean end
    /// of the log looks like (zeros, stale bytes, no header, no segment).
    pub fn is_bad_record(&self) -> bool {
        matches!(
            self,
            Damage::UnsupportedVersion { .. }
                | Damage::Truncated { .. }
                | Damage::CrcMismatch { .. }
                | Damage::BadEntries { .. }
                | Damage::CorruptLsn { .. }
        )
    }
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::Zeroes => f.write_str("zeroes"),
            Damage::NoSegment { segment } => write!(f, "no segment file {segment}"),
            Damage::BadMagic { found } => write!(f, "no record (magic {found:#010x})"),
            Damage::UnsupportedVersion { found } => write!(f, "record format version {found}"),
            Damage::StaleLsn { found } => write!(f, "stale record of LSN {found}"),
            Damage::CorruptLsn { found } => write!(f, "record header with a damaged LSN ({found})"),
            Damage::Truncated { needed, available } => write!(
                f,
                "truncated record ({needed} bytes needed, {available} available)"
            ),
            Damage::CrcMismatch { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            Damage::BadEntries { claimed } => write!(
                f,
                "entries that do not fill the payload ({claimed} claimed), checksum valid"
            ),
            Damage::ChainCut { first } => {
                write!(f, "the log ends inside the chained record at {first}")
            }
        }
    }
}
