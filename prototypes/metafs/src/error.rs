//! Errors, typed like POSIX's.

use std::fmt;

/// A failed filesystem operation. Each maps to one errno ([`Error::errno`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No such file or directory (`ENOENT`).
    NotFound,
    /// The name exists already (`EEXIST`).
    Exists,
    /// The directory is not empty (`ENOTEMPTY`).
    NotEmpty,
    /// A path component, or the target, is not a directory (`ENOTDIR`).
    NotADirectory,
    /// The target is a directory (`EISDIR`).
    IsADirectory,
    /// No free block or inode left; nothing was changed (`ENOSPC`).
    NoSpace,
    /// A name longer than [`crate::NAME_MAX`] bytes (`ENAMETOOLONG`).
    NameTooLong,
    /// A name that is empty, `.`, `..`, or holds `/` or NUL (`EINVAL`).
    InvalidName,
    /// A file would grow past [`crate::MAX_FILE_SIZE`] (`EFBIG`).
    FileTooLarge,
    /// The operation is not allowed on this inode, such as a hard link to
    /// a directory (`EPERM`).
    NotPermitted,
    /// An inode would have more than [`crate::LINK_MAX`] links (`EMLINK`).
    TooManyLinks,
    /// An argument makes no sense, such as renaming a directory into
    /// itself (`EINVAL`).
    InvalidArgument(&'static str),
    /// No such extended attribute (`ENODATA`).
    NoData,
    /// Not something this filesystem keeps, such as an extended attribute
    /// of an unknown namespace or an `fallocate` mode it lacks
    /// (`EOPNOTSUPP`).
    NotSupported(&'static str),
    /// An extended attribute's value is larger than Linux allows
    /// (`E2BIG`).
    TooBig,
    /// An extended attribute's name is longer than Linux allows
    /// (`ERANGE`).
    OutOfRange,
    /// The image is not a metafs image (or its journal is not its own).
    NotMetafs(String),
    /// The image was made in another format version.
    UnsupportedVersion(u16),
    /// The image's metadata contradicts itself.
    Corrupt(String),
    /// The journal failed (poisoned journals included).
    Journal(journal_core::Error),
    /// The image file failed.
    Io(journal_core::VfsError),
    /// An earlier failure to make the image durable; the filesystem takes
    /// no more changes (unmount, and mount again to recover).
    Poisoned(String),
}

impl Error {
    /// The errno a POSIX interface (the FUSE mount) answers with.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => 2,            // ENOENT
            Error::Exists => 17,             // EEXIST
            Error::NotEmpty => 39,           // ENOTEMPTY
            Error::NotADirectory => 20,      // ENOTDIR
            Error::IsADirectory => 21,       // EISDIR
            Error::NoSpace => 28,            // ENOSPC
            Error::NameTooLong => 36,        // ENAMETOOLONG
            Error::InvalidName => 22,        // EINVAL
            Error::FileTooLarge => 27,       // EFBIG
            Error::NotPermitted => 1,        // EPERM
            Error::TooManyLinks => 31,       // EMLINK
            Error::InvalidArgument(_) => 22, // EINVAL
            Error::NoData => 61,             // ENODATA
            Error::NotSupported(_) => 95,    // EOPNOTSUPP
            Error::TooBig => 7,              // E2BIG
            Error::OutOfRange => 34,         // ERANGE
            // The disk under the journal is full: the commit failed and
            // poisoned the filesystem (its transaction was already
            // visible), but the caller learns why.
            Error::Journal(journal_core::Error::NoSpace { .. }) => 28, // ENOSPC
            _ => 5,                                                    // EIO
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => f.write_str("no such file or directory"),
            Error::Exists => f.write_str("file exists"),
            Error::NotEmpty => f.write_str("directory not empty"),
            Error::NotADirectory => f.write_str("not a directory"),
            Error::IsADirectory => f.write_str("is a directory"),
            Error::NoSpace => f.write_str("no space left on the filesystem"),
            Error::NameTooLong => write!(f, "name longer than {} bytes", crate::NAME_MAX),
            Error::InvalidName => {
                f.write_str("invalid name (empty, '.', '..', or holding '/' or NUL)")
            }
            Error::FileTooLarge => write!(f, "file larger than {} bytes", crate::MAX_FILE_SIZE),
            Error::NotPermitted => f.write_str("operation not permitted"),
            Error::TooManyLinks => f.write_str("too many links"),
            Error::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            Error::NoData => f.write_str("no such extended attribute"),
            Error::NotSupported(what) => write!(f, "not supported: {what}"),
            Error::TooBig => f.write_str("extended attribute value too large"),
            Error::OutOfRange => f.write_str("extended attribute name too long"),
            Error::NotMetafs(why) => write!(f, "not a metafs image: {why}"),
            Error::UnsupportedVersion(v) => {
                write!(
                    f,
                    "image format version {v}; this build reads version {}",
                    crate::FORMAT_VERSION
                )
            }
            Error::Corrupt(why) => write!(f, "corrupt image: {why}"),
            Error::Journal(e) => write!(f, "journal: {e}"),
            Error::Io(e) => write!(f, "image: {e}"),
            Error::Poisoned(why) => write!(f, "filesystem poisoned by an earlier failure: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Journal(e) => Some(e),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<journal_core::Error> for Error {
    fn from(e: journal_core::Error) -> Self {
        Error::Journal(e)
    }
}

impl From<journal_core::VfsError> for Error {
    fn from(e: journal_core::VfsError) -> Self {
        Error::Io(e)
    }
}

/// The result type of metafs.
pub type Result<T> = std::result::Result<T, Error>;
