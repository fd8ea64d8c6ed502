//! The store's errors: typed, `#[non_exhaustive]`.

use std::fmt;
use std::path::PathBuf;

/// A failed store operation.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A key longer than [`crate::MAX_KEY`]; nothing was written.
    KeyTooLarge {
        /// Its length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A value longer than [`crate::MAX_VALUE`]; nothing was written.
    ValueTooLarge {
        /// Its length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A transaction whose log record (its operations, plus the full
    /// images of pages it changes structurally, or with full-page images
    /// first since a checkpoint) exceeds what one journal record holds;
    /// nothing was written.
    TransactionTooLarge {
        /// The record's size.
        bytes: usize,
        /// The journal's maximum.
        max: usize,
    },
    /// The directory holds no store, or something that is not one.
    NotAStore {
        /// The offending path.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// The data file belongs to another store (its journal id differs).
    ForeignDataFile {
        /// The data file.
        path: PathBuf,
    },
    /// A data file or log record of another format version (format 1 is
    /// the hash-bucket store before the B+tree).
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// A page with a bad checksum (a torn or damaged write) that neither
    /// the double-write area nor a full image in the log restored.
    TornPage {
        /// The page number.
        page: u32,
    },
    /// A page whose checksum holds but whose contents make no tree: a
    /// pointer outside the file, a cycle, a count past the page. Typed,
    /// never a panic or a loop.
    Corrupt {
        /// The page number.
        page: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// An iterator's snapshot expired: the page versions it needed
    /// outgrew their bounds (a quarter of the cache in memory and
    /// [`crate::Options::snapshot_spill_bytes`] spilled) while it was open,
    /// or the spill file could not be written.
    SnapshotTooOld,
    /// A log record the store cannot decode (its checksum held in the
    /// journal, so this is a bug or a foreign writer).
    BadRecord {
        /// The record's LSN.
        lsn: journal_core::Lsn,
    },
    /// The store directory is open in another store (in this process or
    /// another).
    Locked {
        /// The directory.
        dir: PathBuf,
    },
    /// The journal failed; a write or sync failure poisons the journal and
    /// so the store (every later call fails).
    Journal(journal_core::Error),
    /// A bulk load into a store that holds keys ([`crate::Store::bulk_load`]
    /// builds a tree from nothing).
    NotEmpty,
    /// A bulk load's key that does not sort after the key before it.
    OutOfOrder,
    /// The store was closed.
    Closed,
    /// A write, sync or checkpoint on a store opened with
    /// [`crate::Options::read_only`].
    ReadOnly,
    /// A panic while a transaction was applied to the tree (a bug, or
    /// damage no validation caught): the transaction was rolled back, the
    /// store is poisoned, and every committer waiting on it was told.
    Panicked {
        /// The panic's message, if it carried one.
        message: String,
    },
}

impl From<journal_core::Error> for Error {
    fn from(e: journal_core::Error) -> Self {
        match e {
            journal_core::Error::Locked { dir } => Error::Locked { dir },
            e => Error::Journal(e),
        }
    }
}

impl From<journal_core::VfsError> for Error {
    fn from(e: journal_core::VfsError) -> Self {
        Error::Journal(e.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::KeyTooLarge { len, max } => write!(f, "key of {len} bytes exceeds {max}"),
            Error::ValueTooLarge { len, max } => write!(f, "value of {len} bytes exceeds {max}"),
            Error::TransactionTooLarge { bytes, max } => write!(
                f,
                "transaction's log record of {bytes} bytes exceeds the journal's {max}"
            ),
            Error::NotAStore { path, reason } => {
                write!(f, "{}: not a store: {reason}", path.display())
            }
            Error::ForeignDataFile { path } => {
                write!(f, "{}: data file of another store", path.display())
            }
            Error::UnsupportedVersion { found } => {
                write!(
                    f,
                    "format version {found} is not this build's ({})",
                    crate::FORMAT_VERSION
                )
            }
            Error::TornPage { page } => write!(
                f,
                "page {page} is torn or damaged, and neither the double-write area nor a log image restored it"
            ),
            Error::Corrupt { page, reason } => write!(f, "page {page} is corrupt: {reason}"),
            Error::SnapshotTooOld => f.write_str(
                "the iterator's snapshot expired: the page versions it needed outgrew their bounds",
            ),
            Error::BadRecord { lsn } => write!(f, "undecodable log record at LSN {lsn}"),
            Error::Locked { dir } => write!(f, "{} is open in another store", dir.display()),
            Error::Journal(e) => write!(f, "journal: {e}"),
            Error::ReadOnly => f.write_str("the store is open read-only"),
            Error::Closed => f.write_str("store is closed"),
            Error::NotEmpty => f.write_str("a bulk load needs an empty store"),
            Error::OutOfOrder => {
                f.write_str("a bulk load's key does not sort after the one before")
            }
            Error::Panicked { message } => {
                write!(f, "a panic while applying a transaction: {message}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Journal(e) => Some(e),
            _ => None,
        }
    }
}

/// The result type of store operations.
pub type Result<T> = std::result::Result<T, Error>;
