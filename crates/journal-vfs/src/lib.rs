//! The filesystem boundary of the journal workspace.
//!
//! No other crate touches the filesystem: everything goes through the [`Vfs`]
//! and [`VfsFile`] traits defined here. Two backends implement them:
//!
//! - [`OsVfs`]: the real thing, on `std` and rustix. Its FUA write is
//!   `pwritev2(RWF_DSYNC)`, falling back once and for all to
//!   `pwrite` + `fdatasync` when the kernel or filesystem refuses the flag.
//! - [`SimVfs`]: an in-memory filesystem with a volatile cache, the crash
//!   oracle of the test suite. It keeps, per file, the durable bytes and the
//!   writes not yet durable, and per directory the entries not yet durable;
//!   [`SimVfs::crash`] returns the image a power cut would leave, under a
//!   seeded [`CrashPolicy`]. It injects faults (the Nth call of a kind fails
//!   with EIO or ENOSPC) and latency (slow syncs, for benchmarks).
//!
//! Both count every operation by kind ([`Counters`]), which is how benchmarks
//! report syncs per commit.
//!
//! # Durability contract (what callers may rely on, on both backends)
//!
//! - [`VfsFile::write_at`] lands in a volatile cache: a crash may lose it, or
//!   (on [`SimVfs`] under [`CrashPolicy::TornSectors`]) keep any subset of its
//!   512-byte sectors.
//! - [`VfsFile::write_at_fua`] is durable when it returns. It says nothing
//!   about *other* writes to the file.
//! - [`VfsFile::sync_data`] / [`VfsFile::sync_all`] make every completed write
//!   to the file durable.
//! - A create, rename or remove is durable only after [`Vfs::sync_dir`] on the
//!   directory holding the name.
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod aligned;
mod counters;
mod error;
mod mapping;
mod os;
mod rng;
mod sim;
mod usage;

pub use aligned::AlignedBuf;
pub use counters::{CounterSnapshot, Counters};
pub use error::{Op, VfsError};
pub use mapping::Mapping;
pub use os::{FuaMode, OsVfs, OsVfsOptions};
pub use rng::SplitMix64;
pub use sim::{CrashPolicy, Fault, SimVfs};
pub use usage::{process_usage, ProcessUsage};

use std::fmt;
use std::path::Path;

/// The result type of every VFS call.
pub type Result<T> = std::result::Result<T, VfsError>;

/// How to open a file. Files are always opened readable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open for writing too.
    pub write: bool,
    /// Create the file if it does not exist (implies `write`).
    pub create: bool,
    /// Fail if the file exists (implies `create`).
    pub create_new: bool,
    /// `O_DSYNC`: every write is durable on return (where the OS has it).
    pub dsync: bool,
    /// `O_DIRECT`: bypass the page cache; buffers, offsets and lengths must
    /// then be aligned to the device's logical block size (where the OS has it).
    pub direct: bool,
    /// `O_APPEND`: every [`VfsFile::write_at`] goes at the end of the file
    /// as it is at that moment, whatever its offset says (Linux's `pwrite`
    /// on such a file): processes sharing a log each add whole lines.
    pub append: bool,
    /// Permission bits of a file this open creates (masked by the umask on
    /// [`OsVfs`]); `None` takes the filesystem's default
    /// ([`OsVfsOptions::file_mode`], 0o600). [`SimVfs`] keeps no modes.
    pub mode: Option<u32>,
}

impl OpenOptions {
    /// Read-only.
    pub fn read() -> Self {
        Self::default()
    }
    /// Read and write an existing file.
    pub fn write() -> Self {
        Self {
            write: true,
            ..Self::default()
        }
    }
    /// Read and write, creating the file if needed.
    pub fn create() -> Self {
        Self {
            write: true,
            create: true,
            ..Self::default()
        }
    }
    /// Read and write a file that must not exist yet.
    pub fn create_new() -> Self {
        Self {
            write: true,
            create: true,
            create_new: true,
            ..Self::default()
        }
    }
    /// Read and append, creating the file if needed (see
    /// [`OpenOptions::append`]).
    pub fn append() -> Self {
        Self {
            append: true,
            ..Self::create()
        }
    }
    /// The same, creating the file with permission bits `mode`.
    pub fn mode(self, mode: u32) -> Self {
        Self {
            mode: Some(mode),
            ..self
        }
    }
}

/// How [`VfsFile::preallocate`] reserves space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prealloc {
    /// Write zeros over the range: later `fdatasync`s then have no block
    /// allocation or unwritten-extent conversion to journal (PostgreSQL's
    /// `wal_init_zero`).
    ZeroFill,
    /// `fallocate(2)` the range: cheap now, but the first write into each
    /// unwritten extent makes the next `fdatasync` journal metadata.
    Fallocate,
}

/// A filesystem: the operations a journal needs, and nothing else.
///
/// Paths are used as given; callers join file names onto the journal
/// directory. Implementations are shared between threads.
pub trait Vfs: Send + Sync + fmt::Debug {
    /// Opens (or creates) a file. [`OsVfs`] never follows a symbolic link
    /// in the last component (`O_NOFOLLOW`): a link where a journal file
    /// should be is refused with [`std::io::ErrorKind::PermissionDenied`].
    fn open(&self, path: &Path, opts: OpenOptions) -> Result<Box<dyn VfsFile>>;
    /// Creates a directory and its parents (durable immediately on
    /// [`SimVfs`]; on [`OsVfs`] sync the parent if that matters to you, and
    /// new directories get [`OsVfsOptions::dir_mode`], 0o700).
    fn create_dir_all(&self, path: &Path) -> Result<()>;
    /// Renames a file, replacing `to` if it exists. Durable only after
    /// [`Vfs::sync_dir`] of the directory (both directories if they differ).
    fn rename(&self, from: &Path, to: &Path) -> Result<()>;
    /// Removes a file's name. Durable only after [`Vfs::sync_dir`].
    fn remove_file(&self, path: &Path) -> Result<()>;
    /// Removes an empty directory.
    fn remove_dir(&self, path: &Path) -> Result<()>;
    /// Names of the entries of a directory (files and subdirectories), in no
    /// particular order.
    fn read_dir(&self, dir: &Path) -> Result<Vec<String>>;
    /// Makes the directory's entries (creates, renames, removes) durable.
    fn sync_dir(&self, dir: &Path) -> Result<()>;
    /// Whether a file or directory exists under this name.
    fn exists(&self, path: &Path) -> Result<bool>;
    /// Takes an exclusive lock on a directory, held until the guard drops.
    /// On [`OsVfs`] the lock is an `flock` on `dir/LOCK`, so it excludes
    /// other processes as well as other opens in this one; and a directory
    /// owned by another user is refused (before anything is created in it)
    /// with [`std::io::ErrorKind::PermissionDenied`].
    fn lock_dir(&self, dir: &Path) -> Result<DirLock>;
    /// The operation counters of this filesystem (shared by all its files).
    fn counters(&self) -> CounterSnapshot;
    /// Bytes still free to an unprivileged writer on the filesystem that
    /// holds `path` (which must exist): on [`OsVfs`] `statvfs`'s
    /// `f_bavail × f_frsize`; on [`SimVfs`] its space limit less the bytes
    /// its files hold ([`SimVfs::set_space_limit`]; `u64::MAX` without
    /// one). For a store that must refuse writes before its disk fills.
    fn available_space(&self, path: &Path) -> Result<u64>;
}

/// An open file.
pub trait VfsFile: Send + Sync + fmt::Debug {
    /// The path the file was opened under.
    fn path(&self) -> &Path;
    /// Reads at `offset`; returns fewer bytes than asked only at end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize>;
    /// Writes all of `buf` at `offset` into the volatile cache.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Writes all of `buf` at `offset`, durable on return (FUA semantics).
    fn write_at_fua(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// `fdatasync`: every completed write to this file becomes durable.
    fn sync_data(&self) -> Result<()>;
    /// `fsync`: like [`VfsFile::sync_data`], plus all metadata.
    fn sync_all(&self) -> Result<()>;
    /// Truncates or extends the file (volatile until synced).
    fn set_len(&self, len: u64) -> Result<()>;
    /// The current length of the file.
    fn len(&self) -> Result<u64>;
    /// Reserves `[offset, offset + len)`, extending the file if needed.
    /// [`Prealloc::ZeroFill`] overwrites the range with zeros. Volatile until
    /// synced.
    fn preallocate(&self, offset: u64, len: u64, how: Prealloc) -> Result<()>;

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with
    /// `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Err(VfsError::new(
                    Op::Read,
                    self.path(),
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                ));
            }
            done += n;
        }
        Ok(())
    }
    /// Whether the file is empty.
    fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The alignment `O_DIRECT` I/O on this file needs — of the offset,
    /// the length and the buffer's address alike — or `None` when direct
    /// I/O is not available for it. [`OsVfs`] asks `statx(STATX_DIOALIGN)`
    /// (Linux 6.1 and later; `None` where the kernel or filesystem does not
    /// say); [`SimVfs`] says 512 and refuses misaligned writes on a file
    /// opened with [`OpenOptions::direct`], so tests catch them.
    fn direct_io_alignment(&self) -> Result<Option<u32>> {
        Ok(None)
    }

    /// The whole file, read-only: a memory mapping on [`OsVfs`] (see
    /// [`Mapping`] for what the caller must guarantee while it lives), a
    /// copy read with [`VfsFile::read_at`] otherwise (the default;
    /// [`SimVfs`] copies the file in one read call, so its read faults
    /// apply).
    fn map(&self) -> Result<Mapping> {
        let len = self.len()? as usize;
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let n = self.read_at(&mut buf[done..], done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(Mapping::from_vec(buf))
    }
}

/// An exclusive lock on a directory; released when dropped.
pub struct DirLock {
    _held: Box<dyn Send + Sync>,
}

impl DirLock {
    pub(crate) fn new(held: Box<dyn Send + Sync>) -> Self {
        Self { _held: held }
    }
}

impl fmt::Debug for DirLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DirLock")
    }
}
