//! The journal's errors: typed, with context, `#[non_exhaustive]`.

use crate::Damage;
use iclog::Lsn;
use journal_vfs::VfsError;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// A failed journal operation.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A filesystem call failed (the error names the call and the path).
    Io(Arc<VfsError>),
    /// The segment store failed (carries the path and segment number).
    Segment(Arc<segment_recycler::Error>),
    /// An earlier write or sync failed: the journal accepts nothing more.
    /// Carries the first failure. Nothing unsynced was acknowledged and no
    /// sync is retried; reopen the journal to recover what is durable.
    Poisoned(Arc<Error>),
    /// A record larger than [`crate::Options::max_record_size`]; nothing was
    /// written.
    RecordTooLarge {
        /// Its size.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The directory is locked by another open journal (in this process or
    /// another).
    Locked {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory does not exist and creation was not asked for.
    NotFound {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory holds something that is not this journal format.
    NotAJournal {
        /// The offending file or directory.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// A file written by a newer (or unknown) format version.
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u16,
    },
    /// A bad record where the log must go on: followed by valid current
    /// records (corruption in the middle of the log, not a torn tail), any
    /// bad record under [`crate::RecoveryMode::AbsoluteConsistency`], or no
    /// valid record below the durable LSN while reading.
    Corruption {
        /// Where the bad record is.
        lsn: Lsn,
        /// The segment holding it.
        segment: u64,
        /// What was found there.
        found: Damage,
        /// The next valid record after it, if one was found.
        next_valid: Option<Lsn>,
    },
    /// The log ends below the durable end recorded by the last checkpoint:
    /// records that were durable are gone (a lost segment, a control-file
    /// fallback to a slot whose segments were recycled), in every mode.
    LogEndsEarly {
        /// Where the scan ended.
        end: Lsn,
        /// The durable end when the last checkpoint was written.
        checkpoint_end: Lsn,
        /// What was found at `end`.
        found: Damage,
    },
    /// Invalid options; nothing was created or changed.
    InvalidOptions {
        /// The field of [`crate::Options`] at fault (for a combination, the
        /// one named second in `reason`).
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Options that contradict what the journal on disk was created with.
    OptionMismatch {
        /// Which option.
        option: &'static str,
        /// The value on disk.
        on_disk: u64,
        /// The value given.
        given: u64,
    },
    /// An LSN that was not appended yet.
    LsnNotAppended {
        /// The LSN.
        lsn: Lsn,
        /// The end of the appended log.
        appended: Lsn,
    },
    /// An LSN below the log tail (checkpointed away) or not at an entry.
    LsnNotInLog {
        /// The LSN.
        lsn: Lsn,
        /// The tail (redo position).
        tail: Lsn,
    },
    /// A read of an LSN that is not durable yet (appended, or not even
    /// that): reads return only what a crash would keep.
    LsnNotDurable {
        /// The LSN.
        lsn: Lsn,
        /// Every record below this is durable.
        durable: Lsn,
    },
    /// [`crate::Journal::read_at`] of an LSN inside the log that no append
    /// returned: it falls inside a record's header, an entry's bytes, or a
    /// later part of a chained record.
    NotAnEntry {
        /// The LSN.
        lsn: Lsn,
    },
    /// A [`crate::Follower`] fell more than
    /// [`crate::Options::follow_lag_limit`] behind and a checkpoint
    /// recycled segments it had not read: it can read no further (open a
    /// new one from the tail, or catch up another way).
    FollowerLagged {
        /// The next LSN it would have read.
        at: Lsn,
        /// The limit it passed.
        limit: u64,
    },
    /// The filesystem is full (ENOSPC, or EDQUOT): the segment the log
    /// needs next could not be created or preallocated. Nothing was
    /// appended and the journal is *not* poisoned — everything acknowledged
    /// is as durable as before, reads and checkpoints work — and an append
    /// succeeds again once a checkpoint recycles a segment or space returns.
    NoSpace {
        /// The segment that could not be made.
        segment: u64,
        /// What the filesystem said.
        source: Arc<segment_recycler::Error>,
    },
    /// The journal was closed.
    Closed,
}

impl Error {
    /// The first cause, looking through [`Error::Poisoned`].
    pub fn root(&self) -> &Error {
        match self {
            Error::Poisoned(e) => e.root(),
            e => e,
        }
    }

    /// The OS error number behind this error, if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self.root() {
            Error::Io(e) => e.raw_os_error(),
            Error::Segment(e) | Error::NoSpace { source: e, .. } => match &**e {
                segment_recycler::Error::Io { source, .. } => source.raw_os_error(),
                _ => None,
            },
            _ => None,
        }
    }
}

impl From<VfsError> for Error {
    fn from(e: VfsError) -> Self {
        Error::Io(Arc::new(e))
    }
}

impl From<iclog::ConfigError> for Error {
    fn from(e: iclog::ConfigError) -> Self {
        let option = match e {
            iclog::ConfigError::LogBufs(_) => "logbufs",
            iclog::ConfigError::LogBSize(_) | iclog::ConfigError::Misaligned { .. } => "logbsize",
            iclog::ConfigError::Alignment(_) => "alignment",
        };
        Error::InvalidOptions {
            option,
            reason: e.to_string(),
        }
    }
}

impl From<segment_recycler::ConfigError> for Error {
    fn from(e: segment_recycler::ConfigError) -> Self {
        let option = match e {
            segment_recycler::ConfigError::SegmentSize(_) => "segment_size",
            segment_recycler::ConfigError::PreallocateAhead => "preallocate_ahead",
            segment_recycler::ConfigError::MaxSegments(_) => "max_segments",
        };
        Error::InvalidOptions {
            option,
            reason: e.to_string(),
        }
    }
}

impl From<segment_recycler::Error> for Error {
    fn from(e: segment_recycler::Error) -> Self {
        Error::Segment(Arc::new(e))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "{e}"),
            Error::Segment(e) => write!(f, "{e}"),
            Error::Poisoned(e) => write!(f, "journal is poisoned by an earlier failure: {e}"),
            Error::RecordTooLarge { len, max } => {
                write!(f, "record of {len} bytes exceeds the maximum of {max}")
            }
            Error::Locked { dir } => {
                write!(f, "{} is locked by another open journal", dir.display())
            }
            Error::NotFound { dir } => write!(f, "{}: no such journal directory", dir.display()),
            Error::NotAJournal { path, reason } => {
                write!(f, "{}: not a journal: {reason}", path.display())
            }
            Error::UnsupportedVersion { path, found } => write!(
                f,
                "{}: format version {found} is newer than this build supports",
                path.display()
            ),
            Error::Corruption {
                lsn,
                segment,
                found,
                next_valid,
            } => {
                write!(f, "corrupt log at LSN {lsn} (segment {segment}): {found}")?;
                match next_valid {
                    Some(n) => write!(f, "; a valid record follows at LSN {n}"),
                    None => Ok(()),
                }
            }
            Error::LogEndsEarly {
                end,
                checkpoint_end,
                found,
            } => write!(
                f,
                "log lost: it ends at LSN {end} ({found}) but was durable up to {checkpoint_end} at the last checkpoint"
            ),
            Error::InvalidOptions { option, reason } => {
                write!(f, "invalid option {option}: {reason}")
            }
            Error::OptionMismatch {
                option,
                on_disk,
                given,
            } => write!(
                f,
                "option {option} is {given} but the journal was created with {on_disk}"
            ),
            Error::LsnNotAppended { lsn, appended } => {
                write!(f, "LSN {lsn} has not been appended (appended up to {appended})")
            }
            Error::LsnNotInLog { lsn, tail } => {
                write!(f, "LSN {lsn} is not in the log (tail is {tail})")
            }
            Error::LsnNotDurable { lsn, durable } => {
                write!(f, "LSN {lsn} is not durable yet (durable up to {durable})")
            }
            Error::NotAnEntry { lsn } => {
                write!(f, "LSN {lsn} is not the LSN of an entry")
            }
            Error::FollowerLagged { at, limit } => write!(
                f,
                "follower at LSN {at} fell more than {limit} bytes behind and its segments were recycled"
            ),
            Error::NoSpace { segment, source } => write!(
                f,
                "no space for log segment {segment} (checkpoint to recycle segments, or free space): {source}"
            ),
            Error::Closed => f.write_str("journal is closed"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(&**e),
            Error::Segment(e) => Some(&**e),
            Error::Poisoned(e) => Some(&**e),
            Error::NoSpace { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// The result type of journal operations.
pub type Result<T> = std::result::Result<T, Error>;
