//! Ring configuration.

use crate::format::{ENTRY_HEADER_SIZE, HEADER_SIZE};
use std::fmt;

/// When a buffer write carries PREFLUSH / FUA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// Linux 5.14 and later: a forced buffer goes out FUA; PREFLUSH is added
    /// only when the log tail moved since the last durable log write or when
    /// earlier records are not yet durable (and not on their way with FUA);
    /// a buffer that simply filled up goes out with no flags.
    #[default]
    NeedFlags,
    /// Before Linux 5.14: every buffer write is PREFLUSH | FUA.
    EveryWrite,
}

/// The shape of a ring. [`Config::default`] is 8 buffers of 256 KiB,
/// 512-byte alignment, [`FlushPolicy::NeedFlags`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Number of buffers (XFS `logbufs`): 2 to 8.
    pub logbufs: usize,
    /// Size of each buffer in bytes, header included (XFS `logbsize`):
    /// 16 KiB to 1 MiB, a multiple of `alignment`.
    pub logbsize: usize,
    /// Records are padded to a multiple of this: a power of two from 1 to
    /// 4096 (XFS stripe round-off; seed 001's alignment question).
    pub alignment: u64,
    /// When writes carry PREFLUSH / FUA.
    pub flush_policy: FlushPolicy,
    /// How far past the durable LSN a record may be written without FUA,
    /// in bytes: the in-flight window is the larger of this and the ring's
    /// capacity, `logbufs × logbsize` ([`Config::inflight_window`]). 0 (the
    /// default) keeps it at the capacity, as XFS does.
    pub write_ahead: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            logbufs: 8,
            logbsize: 256 * 1024,
            alignment: 512,
            flush_policy: FlushPolicy::NeedFlags,
            write_ahead: 0,
        }
    }
}

/// Smallest allowed `logbsize`.
pub const MIN_LOGBSIZE: usize = 16 * 1024;
/// Largest allowed `logbsize`.
pub const MAX_LOGBSIZE: usize = 1024 * 1024;
/// The largest entry [`crate::Ring::append`] accepts (1 GiB), chained
/// across as many buffers as it needs; larger ones are refused with
/// [`crate::Error::EntryTooLarge`].
pub const MAX_RECORD_SIZE: usize = 1 << 30;
/// Largest allowed alignment.
pub const MAX_ALIGNMENT: u64 = 4096;

/// An invalid [`Config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// `logbufs` outside 2..=8.
    LogBufs(usize),
    /// `logbsize` outside 16 KiB..=1 MiB.
    LogBSize(usize),
    /// `alignment` not a power of two in 1..=4096.
    Alignment(u64),
    /// `logbsize` not a multiple of `alignment`.
    Misaligned {
        /// The buffer size.
        logbsize: usize,
        /// The alignment.
        alignment: u64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::LogBufs(n) => write!(f, "logbufs {n} is outside 2..=8"),
            ConfigError::LogBSize(n) => {
                write!(f, "logbsize {n} is outside {MIN_LOGBSIZE}..={MAX_LOGBSIZE}")
            }
            ConfigError::Alignment(a) => {
                write!(
                    f,
                    "alignment {a} is not a power of two in 1..={MAX_ALIGNMENT}"
                )
            }
            ConfigError::Misaligned {
                logbsize,
                alignment,
            } => write!(
                f,
                "logbsize {logbsize} is not a multiple of alignment {alignment}"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(2..=8).contains(&self.logbufs) {
            return Err(ConfigError::LogBufs(self.logbufs));
        }
        if !(MIN_LOGBSIZE..=MAX_LOGBSIZE).contains(&self.logbsize) {
            return Err(ConfigError::LogBSize(self.logbsize));
        }
        if !self.alignment.is_power_of_two() || self.alignment > MAX_ALIGNMENT {
            return Err(ConfigError::Alignment(self.alignment));
        }
        if !(self.logbsize as u64).is_multiple_of(self.alignment) {
            return Err(ConfigError::Misaligned {
                logbsize: self.logbsize,
                alignment: self.alignment,
            });
        }
        Ok(())
    }

    /// The largest entry one record holds: the buffer size less the record
    /// header and the entry's length prefix. A larger entry (up to
    /// [`MAX_RECORD_SIZE`]) is written as a chain of parts across buffers
    /// (see [`crate::format`]).
    pub fn max_entry_size(&self) -> usize {
        self.logbsize - HEADER_SIZE - ENTRY_HEADER_SIZE
    }

    /// The in-flight window: no record is written more than this many
    /// bytes past the durable LSN (a plain write that would end beyond it
    /// goes out FUA), so recovery takes valid records past a damaged one
    /// for leftovers of unacknowledged writes only this far out. The larger
    /// of [`Config::write_ahead`] and `logbufs × logbsize`: small buffers
    /// write a group of large transactions over more than the ring, and a
    /// window no larger than the ring would make those writes FUA.
    pub fn inflight_window(&self) -> u64 {
        self.write_ahead.max((self.logbufs * self.logbsize) as u64)
    }

    /// The largest payload (all entries, framed) of one record.
    pub fn max_payload(&self) -> usize {
        self.logbsize - HEADER_SIZE
    }

    /// The least room left in the ACTIVE buffer for which an entry that
    /// does not fit there is split over it and the next buffer (as XFS
    /// splits a log vector that straddles two iclogs) rather than written
    /// whole into the next buffer, leaving the room as padding: an eighth
    /// of the buffer's payload. Below that the padding costs less than the
    /// chain (a second lock on commit, a copy on replay).
    pub fn split_min(&self) -> usize {
        self.max_payload() / 8
    }
}
