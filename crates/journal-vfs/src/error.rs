//! VFS errors: the operation, the path, and the OS error.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The kind of a filesystem operation: names errors, selects counters and
/// targets injected faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Opening an existing file.
    Open,
    /// Creating a file.
    Create,
    /// A positional read.
    Read,
    /// A positional write into the volatile cache.
    Write,
    /// A write that is durable on return.
    FuaWrite,
    /// `fdatasync`.
    SyncData,
    /// `fsync` of a file.
    Sync,
    /// `fsync` of a directory.
    SyncDir,
    /// `ftruncate`.
    SetLen,
    /// `fallocate` or zero-fill.
    Preallocate,
    /// `rename`.
    Rename,
    /// `unlink`.
    Remove,
    /// Listing a directory.
    ReadDir,
    /// Creating a directory.
    CreateDir,
    /// Taking the directory lock.
    Lock,
    /// Reading metadata (length, existence).
    Metadata,
    /// Starting a thread that works on these files (a preallocator, a
    /// data-file flush, a checkpointer).
    Spawn,
}

impl Op {
    /// A short lowercase name, as in syscall names.
    pub fn name(self) -> &'static str {
        match self {
            Op::Open => "open",
            Op::Create => "create",
            Op::Read => "read",
            Op::Write => "write",
            Op::FuaWrite => "fua-write",
            Op::SyncData => "fdatasync",
            Op::Sync => "fsync",
            Op::SyncDir => "fsync-dir",
            Op::SetLen => "set-len",
            Op::Preallocate => "preallocate",
            Op::Rename => "rename",
            Op::Remove => "remove",
            Op::ReadDir => "read-dir",
            Op::CreateDir => "create-dir",
            Op::Lock => "lock",
            Op::Metadata => "metadata",
            Op::Spawn => "spawn",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed filesystem operation.
#[derive(Debug)]
pub struct VfsError {
    op: Op,
    path: PathBuf,
    source: io::Error,
}

impl VfsError {
    /// An error of `op` on `path`.
    pub fn new(op: Op, path: &Path, source: io::Error) -> Self {
        Self {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
    /// The operation that failed.
    pub fn op(&self) -> Op {
        self.op
    }
    /// The path it failed on.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The underlying OS error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }
    /// The kind of the underlying OS error.
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
    /// The errno, when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

impl fmt::Display for VfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl std::error::Error for VfsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
