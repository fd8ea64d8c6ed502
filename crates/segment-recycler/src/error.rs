//! Store errors: typed, with the path and the segment number.

use journal_vfs::VfsError;
use std::fmt;
use std::path::PathBuf;

/// A failed store operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A filesystem call failed (the error names the call and the path).
    Io {
        /// The segment concerned, if one was.
        segment: Option<u64>,
        /// The failure.
        source: VfsError,
    },
    /// A segment's header is not a valid header.
    BadHeader {
        /// The file.
        path: PathBuf,
        /// Its number, from its name.
        segment: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A segment written by a newer (or unknown) format version.
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u16,
    },
    /// A segment of another journal.
    ForeignSegment {
        /// The file.
        path: PathBuf,
        /// Its number.
        segment: u64,
    },
    /// A segment whose size differs from the journal's.
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// The size the journal uses.
        expected: u64,
        /// The size the header or the file says.
        found: u64,
    },
    /// A segment was asked for that is not installed.
    NotInstalled {
        /// Its number.
        segment: u64,
    },
    /// A segment below the redo segment of a completed or running recycle
    /// was asked for: it has been recycled or removed, and the log is past
    /// it (a caller that computed the number before the recycle is late).
    /// Nothing was created.
    Retired {
        /// Its number.
        segment: u64,
    },
    /// An invalid configuration.
    Config(crate::ConfigError),
}

impl Error {
    pub(crate) fn io(segment: Option<u64>) -> impl FnOnce(VfsError) -> Error {
        move |source| Error::Io { segment, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                segment: Some(n),
                source,
            } => write!(f, "segment {n}: {source}"),
            Error::Io {
                segment: None,
                source,
            } => write!(f, "{source}"),
            Error::BadHeader {
                path,
                segment,
                reason,
            } => write!(
                f,
                "segment {segment} ({}): bad header: {reason}",
                path.display()
            ),
            Error::UnsupportedVersion { path, version } => write!(
                f,
                "{}: segment format version {version} is not supported (this build reads {})",
                path.display(),
                crate::SEGMENT_VERSION
            ),
            Error::ForeignSegment { path, segment } => write!(
                f,
                "segment {segment} ({}) belongs to another journal",
                path.display()
            ),
            Error::SizeMismatch {
                path,
                expected,
                found,
            } => write!(
                f,
                "{}: segment size {found} differs from the journal's {expected}",
                path.display()
            ),
            Error::NotInstalled { segment } => write!(f, "segment {segment} is not installed"),
            Error::Retired { segment } => {
                write!(f, "segment {segment} was retired by a checkpoint")
            }
            Error::Config(e) => write!(f, "invalid segment configuration: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Config(e) => Some(e),
            _ => None,
        }
    }
}
