//! The real filesystem, on std and rustix (rustix wraps the raw calls). The
//! one `unsafe` block of the workspace is here: mapping a segment file for
//! reading ([`VfsFile::map`]).

use crate::{
    CounterSnapshot, Counters, DirLock, Mapping, Op, OpenOptions, Prealloc, Result, Vfs, VfsError,
    VfsFile,
};
use journal_sync::atomic::{AtomicU8, Ordering};
use journal_sync::Arc;
use rustix::fs::{FallocateFlags, FlockOperation, OFlags};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Options of [`OsVfs`].
#[derive(Debug, Clone, Copy)]
pub struct OsVfsOptions {
    /// Never try `pwritev2(RWF_DSYNC)`: emulate every FUA write with
    /// `pwrite` + `fdatasync`. For tests of the fallback, and for comparing
    /// the two in benchmarks.
    pub force_fua_fallback: bool,
    /// Permission bits of the files it creates when the open does not say
    /// ([`OpenOptions::mode`]); default 0o600: a journal holds its users'
    /// data, and only its owner reads it.
    pub file_mode: u32,
    /// Permission bits of the directories [`Vfs::create_dir_all`] creates;
    /// default 0o700.
    pub dir_mode: u32,
}

impl Default for OsVfsOptions {
    fn default() -> Self {
        Self {
            force_fua_fallback: false,
            file_mode: 0o600,
            dir_mode: 0o700,
        }
    }
}

/// How [`OsVfs`] implements FUA writes, as detected on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuaMode {
    /// No FUA write has been issued yet.
    Unknown,
    /// `pwritev2(RWF_DSYNC)` works.
    Native,
    /// The kernel or filesystem refused `RWF_DSYNC` (or the fallback was
    /// forced): FUA writes are `pwrite` + `fdatasync`.
    Fallback,
}

const FUA_UNKNOWN: u8 = 0;
const FUA_NATIVE: u8 = 1;
const FUA_FALLBACK: u8 = 2;

#[derive(Debug)]
struct Shared {
    counters: Counters,
    fua: AtomicU8,
    file_mode: u32,
    dir_mode: u32,
}

/// The operating system's filesystem.
///
/// Cheap to clone; clones share counters and the detected [`FuaMode`].
#[derive(Debug, Clone)]
pub struct OsVfs {
    shared: Arc<Shared>,
}

impl Default for OsVfs {
    fn default() -> Self {
        Self::new()
    }
}

impl OsVfs {
    /// The real filesystem with default options.
    pub fn new() -> Self {
        Self::with_options(OsVfsOptions::default())
    }

    /// The real filesystem with `opts`.
    pub fn with_options(opts: OsVfsOptions) -> Self {
        let fua = if opts.force_fua_fallback {
            FUA_FALLBACK
        } else {
            FUA_UNKNOWN
        };
        Self {
            shared: Arc::new(Shared {
                counters: Counters::default(),
                fua: AtomicU8::new(fua),
                file_mode: opts.file_mode,
                dir_mode: opts.dir_mode,
            }),
        }
    }

    /// How FUA writes are implemented, once the first one has been issued.
    pub fn fua_mode(&self) -> FuaMode {
        match self.shared.fua.load(Ordering::Relaxed) {
            FUA_NATIVE => FuaMode::Native,
            FUA_FALLBACK => FuaMode::Fallback,
            _ => FuaMode::Unknown,
        }
    }
}

fn err(op: Op, path: &Path) -> impl FnOnce(io::Error) -> VfsError + '_ {
    move |e| VfsError::new(op, path, e)
}

/// An open's error, with `O_NOFOLLOW`'s ELOOP said plainly.
fn open_err(op: Op, path: &Path) -> impl FnOnce(io::Error) -> VfsError + '_ {
    move |e| {
        if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
            let why = "a symbolic link: refused, journal files are opened without following links";
            VfsError::new(
                op,
                path,
                io::Error::new(io::ErrorKind::PermissionDenied, why),
            )
        } else {
            VfsError::new(op, path, e)
        }
    }
}

/// Refuses a directory that another user owns: a journal's files are
/// created and trusted only inside a directory of the process's own user.
fn check_owner(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir).map_err(err(Op::Metadata, dir))?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        let why = format!(
            "owned by uid {}, not by this process's uid {me}: refused",
            meta.uid()
        );
        return Err(VfsError::new(
            Op::Lock,
            dir,
            io::Error::new(io::ErrorKind::PermissionDenied, why),
        ));
    }
    Ok(())
}

impl Vfs for OsVfs {
    fn open(&self, path: &Path, opts: OpenOptions) -> Result<Box<dyn VfsFile>> {
        let mut o = std::fs::OpenOptions::new();
        let create = opts.create || opts.create_new;
        o.read(true).write(opts.write || create).append(opts.append);
        if opts.create_new {
            o.create_new(true);
        } else if create {
            o.create(true);
        }
        // std opens with O_CLOEXEC already.
        let mut flags = OFlags::NOFOLLOW;
        if opts.dsync {
            flags |= OFlags::DSYNC;
        }
        #[cfg(target_os = "linux")]
        if opts.direct {
            flags |= OFlags::DIRECT;
        }
        o.custom_flags(flags.bits() as i32)
            .mode(opts.mode.unwrap_or(self.shared.file_mode));
        let existed = create && path.exists();
        let op = if create { Op::Create } else { Op::Open };
        let file = o.open(path).map_err(open_err(op, path))?;
        if create && !existed {
            self.shared.counters.creates.incr();
        }
        Ok(Box::new(OsFile {
            file,
            path: path.to_path_buf(),
            shared: self.shared.clone(),
        }))
    }

    fn create_dir_all(&self, path: &Path) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(self.shared.dir_mode)
            .create(path)
            .map_err(err(Op::CreateDir, path))
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        std::fs::rename(from, to).map_err(err(Op::Rename, from))?;
        self.shared.counters.renames.incr();
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> Result<()> {
        std::fs::remove_file(path).map_err(err(Op::Remove, path))?;
        self.shared.counters.removes.incr();
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> Result<()> {
        std::fs::remove_dir(path).map_err(err(Op::Remove, path))
    }

    fn read_dir(&self, dir: &Path) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(err(Op::ReadDir, dir))? {
            let entry = entry.map_err(err(Op::ReadDir, dir))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        let d = File::open(dir).map_err(err(Op::SyncDir, dir))?;
        d.sync_all().map_err(err(Op::SyncDir, dir))?;
        self.shared.counters.dir_fsyncs.incr();
        Ok(())
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        path.try_exists().map_err(err(Op::Metadata, path))
    }

    fn lock_dir(&self, dir: &Path) -> Result<DirLock> {
        check_owner(dir)?;
        let lock_path = dir.join("LOCK");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(self.shared.file_mode)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(&lock_path)
            .map_err(open_err(Op::Lock, &lock_path))?;
        // The lock lives as long as the open file: closing it (dropping the
        // `DirLock`) releases it.
        rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| VfsError::new(Op::Lock, dir, e.into()))?;
        Ok(DirLock::new(Box::new(file)))
    }

    fn counters(&self) -> CounterSnapshot {
        self.shared.counters.snapshot()
    }

    fn available_space(&self, path: &Path) -> Result<u64> {
        let st =
            rustix::fs::statvfs(path).map_err(|e| VfsError::new(Op::Metadata, path, e.into()))?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }
}

/// A file of [`OsVfs`].
#[derive(Debug)]
struct OsFile {
    file: File,
    path: PathBuf,
    shared: Arc<Shared>,
}

impl OsFile {
    /// One `pwritev2(RWF_DSYNC)` attempt for all of `buf`, retrying short
    /// writes. `Ok(false)` means the kernel or filesystem does not support
    /// the flag (nothing was written).
    #[cfg(target_os = "linux")]
    fn pwrite_dsync(&self, buf: &[u8], offset: u64) -> io::Result<bool> {
        use rustix::io::{pwritev2, Errno, ReadWriteFlags};
        let mut done = 0usize;
        while done < buf.len() {
            let iov = [io::IoSlice::new(&buf[done..])];
            match pwritev2(
                &self.file,
                &iov,
                offset + done as u64,
                ReadWriteFlags::DSYNC,
            ) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(Errno::INTR) => continue,
                Err(Errno::OPNOTSUPP | Errno::NOSYS) if done == 0 => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(true)
    }

    #[cfg(not(target_os = "linux"))]
    fn pwrite_dsync(&self, _buf: &[u8], _offset: u64) -> io::Result<bool> {
        Ok(false)
    }
}

impl VfsFile for OsFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn map(&self) -> Result<Mapping> {
        if self
            .file
            .metadata()
            .map_err(err(Op::Read, &self.path))?
            .len()
            == 0
        {
            // mmap(2) refuses an empty length.
            return Ok(Mapping::from_vec(Vec::new()));
        }
        // No MAP_POPULATE: recovery probes only the first bytes of some
        // segments, and populating would read whole files from a cold
        // disk; faults with fault-around cost the same on a warm one
        // (measured by `journal bench --scenario replay`).
        let opts = memmap2::MmapOptions::new();
        // SAFETY: `Mmap` hands out `&[u8]` over file pages, which is sound
        // only while no byte the caller reads changes and the file is not
        // truncated below the mapped length (a touched page past the end
        // raises SIGBUS). `Mapping`'s documentation makes that the caller's
        // contract; its one caller, the journal's log reader, maps only
        // sealed segments (every byte below the durable end of the log,
        // never rewritten), which are never truncated (created full size,
        // recycled by rename, removed by unlinking, which leaves a mapping
        // valid) and are pinned against recycling while any view of them
        // lives. The mapping is read-only (`PROT_READ`), so nothing here
        // writes through it.
        #[allow(unsafe_code)]
        let map = unsafe { opts.map(&self.file) }.map_err(err(Op::Read, &self.path))?;
        // Readers go front to back: ask for aggressive readahead. Advice
        // only; a kernel that refuses it reads the same bytes.
        let _ = map.advise(memmap2::Advice::Sequential);
        self.shared.counters.maps.incr();
        Ok(Mapping::mapped(map))
    }

    fn direct_io_alignment(&self) -> Result<Option<u32>> {
        #[cfg(target_os = "linux")]
        {
            use rustix::fs::{statx, AtFlags, StatxFlags};
            let st = match statx(&self.file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
                Ok(st) => st,
                // No statx here: the kernel cannot say, so no direct I/O.
                Err(rustix::io::Errno::NOSYS) => return Ok(None),
                Err(e) => return Err(VfsError::new(Op::Metadata, &self.path, e.into())),
            };
            if st.stx_mask & StatxFlags::DIOALIGN.bits() == 0 || st.stx_dio_offset_align == 0 {
                return Ok(None);
            }
            Ok(Some(st.stx_dio_offset_align.max(st.stx_dio_mem_align)))
        }
        #[cfg(not(target_os = "linux"))]
        Ok(None)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        loop {
            match self.file.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r.map_err(err(Op::Read, &self.path)),
            }
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.file
            .write_all_at(buf, offset)
            .map_err(err(Op::Write, &self.path))?;
        let c = &self.shared.counters;
        c.writes.incr();
        c.bytes_written.add(buf.len() as u64);
        Ok(())
    }

    fn write_at_fua(&self, buf: &[u8], offset: u64) -> Result<()> {
        let c = &self.shared.counters;
        if self.shared.fua.load(Ordering::Relaxed) != FUA_FALLBACK {
            match self.pwrite_dsync(buf, offset) {
                Ok(true) => {
                    self.shared.fua.store(FUA_NATIVE, Ordering::Relaxed);
                    c.writes.incr();
                    c.fua_writes.incr();
                    c.bytes_written.add(buf.len() as u64);
                    return Ok(());
                }
                Ok(false) => self.shared.fua.store(FUA_FALLBACK, Ordering::Relaxed),
                Err(e) => return Err(VfsError::new(Op::FuaWrite, &self.path, e)),
            }
        }
        self.file
            .write_all_at(buf, offset)
            .map_err(err(Op::FuaWrite, &self.path))?;
        self.file
            .sync_data()
            .map_err(err(Op::FuaWrite, &self.path))?;
        c.writes.incr();
        c.fua_writes.incr();
        c.fua_fallbacks.incr();
        c.fdatasyncs.incr();
        c.bytes_written.add(buf.len() as u64);
        Ok(())
    }

    fn sync_data(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(err(Op::SyncData, &self.path))?;
        self.shared.counters.fdatasyncs.incr();
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        self.file.sync_all().map_err(err(Op::Sync, &self.path))?;
        self.shared.counters.fsyncs.incr();
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.file.set_len(len).map_err(err(Op::SetLen, &self.path))
    }

    fn len(&self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .map_err(err(Op::Metadata, &self.path))?
            .len())
    }

    fn preallocate(&self, offset: u64, len: u64, how: Prealloc) -> Result<()> {
        match how {
            Prealloc::Fallocate => {
                #[cfg(target_os = "linux")]
                {
                    rustix::fs::fallocate(&self.file, FallocateFlags::empty(), offset, len)
                        .map_err(|e| VfsError::new(Op::Preallocate, &self.path, e.into()))
                }
                #[cfg(not(target_os = "linux"))]
                {
                    if self.len()? < offset + len {
                        self.set_len(offset + len)?;
                    }
                    Ok(())
                }
            }
            Prealloc::ZeroFill => {
                const CHUNK: u64 = 1 << 20;
                let zeros = vec![0u8; CHUNK.min(len.max(1)) as usize];
                let mut at = offset;
                let end = offset + len;
                while at < end {
                    let n = (end - at).min(CHUNK) as usize;
                    self.file
                        .write_all_at(&zeros[..n], at)
                        .map_err(err(Op::Preallocate, &self.path))?;
                    let c = &self.shared.counters;
                    c.writes.incr();
                    c.bytes_written.add(n as u64);
                    at += n as u64;
                }
                Ok(())
            }
        }
    }
}
