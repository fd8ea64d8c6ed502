//! The filesystem through FUSE (the `fuser` crate), so ordinary programs
//! use it: `mkdir`, `cp -r`, `mv`, `rm -r`, `ls -l`, `tar x`, `cat`.
//!
//! FUSE inode numbers are metafs's own (the root is 1 in both). Attributes
//! the format does not keep are synthesised: permissions 0755 for
//! directories and 0644 for files, owner the caller, all times the
//! modification time; `chmod`, `chown` and `utimes` are accepted and
//! ignored. `fsync` and `fsyncdir` commit (durable on return); since the
//! kernel does not forward `sync(2)`/`syncfs(2)` to FUSE, [`mount`] also
//! commits on a timer (jbd2's commit interval, here 1 s), so `sync`
//! followed by a second's wait is durable too; unmounting checkpoints.

use crate::volume::{Fs, Stat};
use crate::{Error, Kind};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use journal_core::sync::{Condvar, Deadline, Mutex};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache attributes and entries: 0, so every
/// `stat` sees the filesystem as it is (no other writer exists, but it
/// keeps the mount honest in tests).
const TTL: Duration = Duration::ZERO;

/// A mounted [`Fs`] as a FUSE filesystem.
#[derive(Debug)]
pub struct MetaFuse {
    fs: Arc<Fs>,
}

impl MetaFuse {
    /// Serves `fs`.
    pub fn new(fs: Arc<Fs>) -> Self {
        Self { fs }
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn attr(s: &Stat, req: &Request) -> FileAttr {
    let t = UNIX_EPOCH + Duration::from_nanos(s.mtime_ns);
    let dir = s.kind == Kind::Dir;
    FileAttr {
        ino: INodeNo(s.ino as u64),
        size: s.size,
        blocks: s.blocks * (crate::layout::BLOCK as u64 / 512),
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o644 },
        nlink: s.nlink as u32,
        uid: req.uid(),
        gid: req.gid(),
        rdev: 0,
        flags: 0,
        blksize: crate::layout::BLOCK as u32,
    }
}

fn ino(i: INodeNo) -> u32 {
    u64::from(i) as u32
}

impl MetaFuse {
    fn entry(&self, req: &Request, r: crate::Result<u32>, reply: ReplyEntry) {
        match r.and_then(|i| self.fs.stat(i)) {
            Ok(s) => reply.entry(&TTL, &attr(&s, req), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Replies with inode `i`'s attributes once `r` (what the call did
    /// first) succeeded.
    fn attr(&self, req: &Request, r: crate::Result<()>, i: u32, reply: ReplyAttr) {
        match r.and_then(|()| self.fs.stat(i)) {
            Ok(s) => reply.attr(&TTL, &attr(&s, req)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn empty(r: crate::Result<()>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl Filesystem for MetaFuse {
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(req, self.fs.lookup(ino(parent), name.as_bytes()), reply);
    }

    fn getattr(&self, req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr(req, Ok(()), ino(i), reply);
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = match size {
            Some(n) => self.fs.truncate(ino(i), n),
            None => Ok(()),
        };
        self.attr(req, r, ino(i), reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files only (S_IFREG, or no type bits).
        let kind = mode & 0o170000;
        if kind != 0 && kind != 0o100000 {
            reply.error(Errno::from_i32(1)); // EPERM
            return;
        }
        self.entry(req, self.fs.create(ino(parent), name.as_bytes()), reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(req, self.fs.mkdir(ino(parent), name.as_bytes()), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.unlink(ino(parent), name.as_bytes()), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.rmdir(ino(parent), name.as_bytes()), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            reply.error(Errno::from_i32(22)); // EINVAL: not supported
            return;
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE)
            && self.fs.lookup(ino(newparent), newname.as_bytes()).is_ok()
        {
            reply.error(Errno::from_i32(17)); // EEXIST
            return;
        }
        let r = self.fs.rename(
            ino(parent),
            name.as_bytes(),
            ino(newparent),
            newname.as_bytes(),
        );
        Self::empty(r, reply);
    }

    fn open(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.stat(ino(i)) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino(i), offset, size as usize) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(ino(i), offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.fsync(ino(i)), reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let dir = ino(i);
        let parent = match self.fs.parent(dir) {
            Ok(p) => p,
            Err(e) => return reply.error(errno(&e)),
        };
        let entries = match self.fs.readdir(dir) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        let all = [
            (dir, FileType::Directory, b".".to_vec()),
            (parent, FileType::Directory, b"..".to_vec()),
        ]
        .into_iter()
        .chain(entries.into_iter().map(|(name, ino, kind)| {
            let t = if kind == Kind::Dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            (ino, t, name)
        }));
        for (k, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(
                INodeNo(ino as u64),
                k as u64 + 1,
                kind,
                OsStr::from_bytes(&name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.sync(), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let sb = self.fs.superblock();
        let (free_blocks, free_inodes) = self.fs.free();
        reply.statfs(
            sb.blocks as u64,
            free_blocks,
            free_blocks,
            sb.inodes as u64,
            free_inodes,
            crate::layout::BLOCK as u32,
            crate::NAME_MAX as u32,
            crate::layout::BLOCK as u32,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .fs
            .create(ino(parent), name.as_bytes())
            .and_then(|i| self.fs.stat(i))
        {
            Ok(s) => reply.created(
                &TTL,
                &attr(&s, req),
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

use fuser::ReplyOpen;

/// Mounts `fs` on `dir` and serves it until the mount is unmounted
/// (`umount DIR` or `fusermount3 -u DIR`); commits every `commit_every`
/// meanwhile. `on_mounted` runs once the mount is live. Returns the
/// filesystem for its caller to unmount (checkpoint) it.
pub fn mount(
    fs: Arc<Fs>,
    dir: &Path,
    commit_every: Duration,
    on_mounted: impl FnOnce(),
) -> std::io::Result<Arc<Fs>> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("metafs".into()),
        fuser::MountOption::Subtype("metafs".into()),
        fuser::MountOption::RW,
        fuser::MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(2);
    let session = fuser::spawn_mount(MetaFuse::new(fs.clone()), dir, &config)?;
    on_mounted();
    // The commit timer (jbd2's commit interval): a thread waiting on a
    // condvar with a deadline, so stopping it is immediate (no
    // sleep-and-poll). One that cannot be started fails the mount (the
    // session, dropped, unmounts).
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let (fs2, stop2) = (fs.clone(), stop.clone());
    let committer = std::thread::Builder::new()
        .name("metafs-commit".into())
        .spawn(move || {
            let (flag, cv) = &*stop2;
            let mut stopped = flag.lock();
            loop {
                let deadline = Deadline::after(commit_every);
                while !*stopped && !deadline.expired() {
                    stopped = cv.wait_deadline(stopped, &deadline).0;
                }
                if *stopped {
                    return;
                }
                drop(stopped);
                if fs2.sync().is_err() {
                    return;
                }
                stopped = flag.lock();
            }
        })?;
    let r = session.join();
    *stop.0.lock() = true;
    stop.1.notify_all();
    let _ = committer.join();
    r.map(|()| fs)
}
