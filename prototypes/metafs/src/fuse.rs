//! The filesystem through FUSE (the `fuser` crate), so ordinary programs
//! use it: `cp -r`, `tar`, `rsync -a`, `git`, `make`, `ln`, `ln -s`,
//! `chmod`, `chown`, `touch -d`, `mkfifo`, `mknod`.
//!
//! FUSE inode numbers are metafs's own (the root is 1 in both). The mount
//! uses `default_permissions`: the kernel checks access against the mode,
//! owner and group metafs keeps, as it does for a disk filesystem, and a
//! new inode's owner is the caller's uid and gid. Reads do not move the
//! access time (`noatime`); every other change moves the times POSIX
//! says. `fsync` and `fsyncdir` commit (durable on return); since the
//! kernel does not forward `sync(2)`/`syncfs(2)` to FUSE, [`mount`] also
//! commits on a timer (jbd2's commit interval, here 1 s), so `sync`
//! followed by a second's wait is durable too; unmounting checkpoints.

use crate::volume::{Fs, NewNode, RenameMode, SetAttr, Stat};
use crate::{Error, Kind, Time};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use journal_core::sync::{Condvar, Deadline, Mutex};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache attributes and entries (names found and
/// names absent). Every change to the filesystem comes through this
/// kernel mount — nothing else writes the image while it is mounted — and
/// the kernel drops what it cached of an inode or name it changes, so the
/// cache cannot go stale; with a TTL of 0 every path component of every
/// call was looked up again (16 FUSE requests per create + fsync + close
/// in fs_mark, against 6 with it).
const TTL: Duration = Duration::from_secs(60);

/// Threads serving FUSE requests (see [`mount`]).
pub const DISPATCH_THREADS: usize = 2;

/// A mounted [`Fs`] as a FUSE filesystem.
#[derive(Debug)]
pub struct MetaFuse {
    fs: Arc<Fs>,
    /// Where fsyncs go when [`mount`] serves it (else they commit on the
    /// dispatch thread).
    syncer: Option<Arc<Syncer>>,
}

impl MetaFuse {
    /// Serves `fs`; each fsync commits on the thread that received it.
    pub fn new(fs: Arc<Fs>) -> Self {
        Self { fs, syncer: None }
    }

    /// An fsync answered once every change before it is durable: queued
    /// for the syncer when there is one.
    fn fsync_reply(&self, reply: ReplyEmpty) {
        match &self.syncer {
            Some(s) => s.queue(&self.fs, reply),
            None => Self::empty(self.fs.sync(), reply),
        }
    }
}

/// The commit thread of a mount (jbd2's kjournald): it takes every fsync
/// queued since its last commit, commits once — the commit covers every
/// change those fsyncs wait for, since each was made before its fsync
/// arrived — and answers them all; with none queued it commits on a timer
/// (jbd2's commit interval), since the kernel does not forward
/// `sync(2)`. The dispatch threads never wait for the disk, so a few of
/// them serve any number of fsync callers, and one commit carries every
/// fsync that arrived while the last was being written.
#[derive(Debug, Default)]
struct Syncer {
    state: Mutex<SyncQueue>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct SyncQueue {
    replies: Vec<ReplyEmpty>,
    /// A commit is running (the syncer's, or a lone fsync's inline).
    busy: bool,
    /// The last commit served one fsync and none arrived while it ran: a
    /// lone fsync caller, whose next fsync commits inline.
    crowded: bool,
    stop: bool,
}

impl Syncer {
    /// An fsync: committed right here when the caller is alone — nothing
    /// committing or queued, and the last commit had no company (so a lone
    /// fsync pays no hand-off to the syncer: jbd's lone writer that never
    /// waits) — else queued for the syncer's next commit. (Committing
    /// inline whenever nothing was running took a dispatch thread off the
    /// requests under load: 7,442 files/s at 4 fs_mark threads against
    /// 8,834 queued.)
    fn queue(&self, fs: &Fs, reply: ReplyEmpty) {
        let mut q = self.state.lock();
        if q.busy || q.crowded || !q.replies.is_empty() {
            q.replies.push(reply);
            drop(q);
            self.wake.notify_one();
            return;
        }
        q.busy = true;
        drop(q);
        let r = fs.sync();
        match &r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
        let mut q = self.state.lock();
        q.busy = false;
        q.crowded = !q.replies.is_empty();
        drop(q);
        // fsyncs that arrived meanwhile wait for the syncer.
        self.wake.notify_one();
    }

    fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_one();
    }

    /// The thread's loop: until stopped with nothing queued.
    fn run(&self, fs: &Fs, every: Duration) {
        let mut q = self.state.lock();
        loop {
            let deadline = Deadline::after(every);
            while (q.busy || q.replies.is_empty()) && !q.stop && !deadline.expired() {
                q = self.wake.wait_deadline(q, &deadline).0;
            }
            if q.stop && q.replies.is_empty() {
                return;
            }
            if q.busy {
                continue; // the timer fired during an inline commit
            }
            q.busy = true;
            let batch = std::mem::take(&mut q.replies);
            let n = batch.len();
            drop(q);
            // A failure poisons the filesystem: every later fsync gets it.
            let r = fs.sync();
            for reply in batch {
                match &r {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(e)),
                }
            }
            q = self.state.lock();
            q.busy = false;
            q.crowded = n > 1 || !q.replies.is_empty();
        }
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// A metafs time as the system's (out of range: the epoch).
pub fn system_time(t: Time) -> SystemTime {
    let at = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(t.sec as u64, t.nsec))
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
            .and_then(|s| s.checked_add(Duration::from_nanos(t.nsec as u64)))
    };
    at.unwrap_or(UNIX_EPOCH)
}

/// A system time as metafs keeps it.
pub fn metafs_time(s: SystemTime) -> Time {
    match s.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            sec: d.as_secs().min(i64::MAX as u64) as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let sec = -(d.as_secs().min(i64::MAX as u64) as i64);
            match d.subsec_nanos() {
                0 => Time { sec, nsec: 0 },
                n => Time {
                    sec: sec.saturating_sub(1),
                    nsec: 1_000_000_000 - n,
                },
            }
        }
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
        Kind::File | Kind::Free => FileType::RegularFile,
    }
}

/// The kind a `mknod` mode's `S_IFMT` bits name (none: a regular file).
fn kind_of_mode(mode: u32) -> Option<Kind> {
    Some(match mode & 0o170000 {
        0 | 0o100000 => Kind::File,
        0o010000 => Kind::Fifo,
        0o020000 => Kind::CharDevice,
        0o060000 => Kind::BlockDevice,
        0o140000 => Kind::Socket,
        0o040000 => Kind::Dir,
        _ => return None,
    })
}

fn attr(s: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(s.ino as u64),
        size: s.size,
        blocks: s.blocks * (crate::layout::BLOCK as u64 / 512),
        atime: system_time(s.atime),
        mtime: system_time(s.mtime),
        ctime: system_time(s.ctime),
        crtime: system_time(s.ctime),
        kind: file_type(s.kind),
        perm: s.mode,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        rdev: s.rdev,
        flags: 0,
        blksize: crate::layout::BLOCK as u32,
    }
}

fn ino(i: INodeNo) -> u32 {
    u32::try_from(u64::from(i)).unwrap_or(0)
}

fn time_or_now(t: TimeOrNow) -> Time {
    match t {
        TimeOrNow::Now => Time::now(),
        TimeOrNow::SpecificTime(s) => metafs_time(s),
    }
}

impl MetaFuse {
    fn entry(&self, r: crate::Result<u32>, reply: ReplyEntry) {
        match r.and_then(|i| self.fs.stat(i)) {
            Ok(s) => reply.entry(&TTL, &attr(&s), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn empty(r: crate::Result<()>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A new node in `parent` owned by the caller (`mode`: the umask
    /// already taken out).
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: Kind,
        mode: u32,
        rdev: u32,
    ) -> crate::Result<u32> {
        let node = NewNode {
            kind,
            mode: (mode & 0o7777) as u16,
            uid: req.uid(),
            gid: req.gid(),
            rdev,
        };
        self.fs.make_node(ino(parent), name.as_bytes(), node)
    }
}

impl Filesystem for MetaFuse {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(self.fs.lookup(ino(parent), name.as_bytes()), reply);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.stat(ino(i)) {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = SetAttr {
            mode: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(metafs_time),
        };
        match self.fs.setattr(ino(i), &a) {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino(i)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = match kind_of_mode(mode) {
            Some(Kind::Dir) | None => Err(Error::InvalidArgument("mknod of no file type")),
            Some(k) => self.make(req, parent, name, k, mode & !umask, rdev),
        };
        self.entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            self.make(req, parent, name, Kind::Dir, mode & !umask, 0),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.unlink(ino(parent), name.as_bytes()), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.rmdir(ino(parent), name.as_bytes()), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.fs.symlink(
            ino(parent),
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
            req.uid(),
            req.gid(),
        );
        self.entry(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self
            .fs
            .link(ino(i), ino(newparent), newname.as_bytes())
            .map(|()| ino(i));
        self.entry(r, reply);
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
        let mode = if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::from_i32(22)); // EINVAL: overlayfs's, not ours
        } else if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            RenameMode::Exchange
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            RenameMode::NoReplace
        } else {
            RenameMode::Replace
        };
        let r = self.fs.rename_with(
            ino(parent),
            name.as_bytes(),
            ino(newparent),
            newname.as_bytes(),
            mode,
        );
        Self::empty(r, reply);
    }

    fn open(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(ino(i)) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.release(ino(i)), reply);
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
        // Nothing to do at close (data is written through, durability is
        // fsync's): ENOSYS tells the kernel so, and it stops sending FLUSH
        // — one FUSE round trip less per close.
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The inode is checked now; the commit is the syncer's.
        match self.fs.stat(ino(i)) {
            Ok(_) => self.fsync_reply(reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Cookies: 1 is ".", 2 is "..", 3 + p the entry at position p
        // (stable while the entry lives, so a listing resumes exactly).
        let dir = ino(i);
        let parent = match self.fs.parent(dir) {
            Ok(p) => p,
            Err(e) => return reply.error(errno(&e)),
        };
        for (cookie, at, name) in [(1, dir, "."), (2, parent, "..")] {
            if offset < cookie && reply.add(INodeNo(at as u64), cookie, FileType::Directory, name) {
                return reply.ok();
            }
        }
        let mut from = offset.saturating_sub(2);
        loop {
            let batch = match self.fs.readdir_from(dir, from, 256) {
                Ok(b) => b,
                Err(e) => return reply.error(errno(&e)),
            };
            let Some(last) = batch.last().map(|e| e.0) else {
                return reply.ok();
            };
            for (pos, name, child, kind) in batch {
                let full = reply.add(
                    INodeNo(child as u64),
                    pos + 3,
                    file_type(kind),
                    OsStr::from_bytes(&name),
                );
                if full {
                    return reply.ok();
                }
            }
            from = last + 1;
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_reply(reply);
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
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .make(req, parent, name, Kind::File, mode & !umask, 0)
            .and_then(|i| self.fs.open(i).and_then(|()| self.fs.stat(i)))
        {
            Ok(s) => reply.created(
                &TTL,
                &attr(&s),
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// How [`mount`] serves a filesystem.
#[derive(Debug, Clone, Copy)]
pub struct MountConfig {
    /// Commit the running transaction this often (the kernel does not
    /// forward `sync(2)`).
    pub commit_every: Duration,
    /// FUSE's `allow_other`: users other than the mounter reach the mount
    /// (access still checked against each file's mode and owner).
    pub allow_other: bool,
}

impl Default for MountConfig {
    fn default() -> Self {
        Self {
            commit_every: Duration::from_secs(1),
            allow_other: false,
        }
    }
}

/// Mounts `fs` on `dir` and serves it until the mount is unmounted
/// (`umount DIR` or `fusermount3 -u DIR`); commits every
/// `config.commit_every` meanwhile. `on_mounted` runs once the mount is live. Returns the
/// filesystem for its caller to unmount (checkpoint) it.
pub fn mount(
    fs: Arc<Fs>,
    dir: &Path,
    config: MountConfig,
    on_mounted: impl FnOnce(),
) -> std::io::Result<Arc<Fs>> {
    let MountConfig {
        commit_every,
        allow_other,
    } = config;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("metafs".into()),
        fuser::MountOption::Subtype("metafs".into()),
        fuser::MountOption::RW,
        fuser::MountOption::DefaultPermissions,
    ];
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    // Threads that take requests from the kernel. None waits for the
    // disk (fsyncs go to the syncer), so two keep both cores busy; 32, with
    // fsyncs answered on them, spent 40% of the server's time switching
    // threads (perf) for fewer files/s.
    config.n_threads = Some(DISPATCH_THREADS);
    let syncer = Arc::new(Syncer::default());
    // The syncer: one that cannot be started fails the mount.
    let (fs2, s2) = (fs.clone(), syncer.clone());
    let thread = std::thread::Builder::new()
        .name("metafs-commit".into())
        .spawn(move || s2.run(&fs2, commit_every))?;
    let served = MetaFuse {
        fs: fs.clone(),
        syncer: Some(syncer.clone()),
    };
    let r = fuser::spawn_mount(served, dir, &config).map(|session| {
        on_mounted();
        session.join()
    });
    syncer.stop();
    let _ = thread.join();
    r?.map(|()| fs)
}
