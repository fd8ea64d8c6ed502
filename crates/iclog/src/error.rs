//! Errors of ring operations.

use crate::{DeviceError, Lsn};
use std::fmt;

/// A failed ring operation. `E` is the device's error type
/// ([`crate::LogDevice::Error`]). Deliberately exhaustive: the journal
/// facade maps every variant to its own error, and a new one must make
/// that mapping fail to compile rather than fall into a catch-all.
#[derive(Debug, Clone)]
pub enum Error<E = DeviceError> {
    /// The entry is larger than [`crate::MAX_RECORD_SIZE`]; nothing was
    /// written.
    EntryTooLarge {
        /// Its size.
        len: usize,
        /// The largest accepted size.
        max: usize,
    },
    /// A force named an LSN that has not been appended yet.
    LsnNotAppended {
        /// The LSN asked for.
        lsn: Lsn,
        /// The end of what has been appended.
        appended: Lsn,
    },
    /// The entry would be laid out past the append limit
    /// ([`crate::Ring::set_append_limit`]): nothing was reserved or
    /// written, and the ring is not poisoned. The owner makes room up to
    /// `need` (exclusive), raises the limit, and appends again.
    NoRoom {
        /// The end of the log space the append needs.
        need: Lsn,
    },
    /// A device write or flush failed: the ring is poisoned, nothing more is
    /// written, and every caller gets this error (the first one).
    Poisoned(E),
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EntryTooLarge { len, max } => {
                write!(f, "entry of {len} bytes exceeds the maximum of {max}")
            }
            Error::LsnNotAppended { lsn, appended } => {
                write!(
                    f,
                    "LSN {lsn} has not been appended (appended up to {appended})"
                )
            }
            Error::NoRoom { need } => {
                write!(
                    f,
                    "no room for the entry: log space up to {need} is not ready"
                )
            }
            Error::Poisoned(e) => write!(f, "log device failed, log is poisoned: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Poisoned(e) => Some(e),
            _ => None,
        }
    }
}
