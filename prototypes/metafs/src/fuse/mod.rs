//! The filesystem through FUSE (the `fuser` crate), so ordinary programs
//! use it: `cp -r`, `tar`, `rsync -a`, `git`, `make`, `ln`, `ln -s`,
//! `chmod`, `chown`, `touch -d`, `mkfifo`, `mknod`.
//!
//! FUSE inode numbers are metafs's own (the root is 1 in both). The mount
//! uses `default_permissions`: the kernel checks access against the mode,
//! owner and group metafs keeps, as it does for a disk filesystem, and a
//! new inode's owner is the caller's uid and gid. Reads move the access
//! time as the mount's atime option says (the kernel leaves atime to a
//! FUSE filesystem; relatime by default); every other change moves the
//! times POSIX says. `fsync` and `fsyncdir` commit (durable on return); since the
//! kernel does not forward `sync(2)`/`syncfs(2)` to FUSE, [`mount`] also
//! commits on a timer (jbd2's commit interval, here 1 s), so `sync`
//! followed by a second's wait is durable too; unmounting checkpoints.

use crate::volume::{Falloc, Fs, NewNode, RenameMode, SetAttr};
use crate::{Error, Kind};
use convert::{attr, errno, file_type, ino, kind_of_mode, time_or_now};
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use syncer::Syncer;

mod convert;
mod session;
mod syncer;
mod xattr;

pub use convert::{metafs_time, system_time};
pub use session::{mount, MountConfig};

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

    /// A new node in `parent` owned by the caller (metafs takes the umask
    /// out, or inherits the directory's default ACL).
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: Kind,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> crate::Result<u32> {
        let node = NewNode {
            kind,
            mode: (mode & 0o7777) as u16,
            uid: req.uid(),
            gid: req.gid(),
            rdev,
            umask: (umask & 0o777) as u16,
        };
        self.fs.make_node(ino(parent), name.as_bytes(), node)
    }
}

impl Filesystem for MetaFuse {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // POSIX ACLs checked by the kernel, kept by metafs; the umask
        // left to metafs (a default ACL replaces it). A kernel without
        // them gets neither, and metafs works as before.
        use fuser::InitFlags as F;
        let _ = config.add_capabilities(F::FUSE_POSIX_ACL | F::FUSE_DONT_MASK);
        Ok(())
    }

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
            Some(k) => self.make(req, parent, name, k, mode, umask, rdev),
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
            self.make(req, parent, name, Kind::Dir, mode, umask, 0),
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

    fn setxattr(
        &self,
        req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.do_setxattr(req, i, name, value, flags, reply);
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.do_getxattr(i, name, size, reply);
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        self.do_listxattr(i, size, reply);
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.do_removexattr(i, name, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // FALLOC_FL_KEEP_SIZE 1, PUNCH_HOLE 2, ZERO_RANGE 0x10; the rest
        // (collapse, insert, unshare, ...) metafs does not do.
        let how = match mode {
            0 | 1 => Falloc::Allocate {
                keep_size: mode == 1,
            },
            3 => Falloc::PunchHole,
            0x10 | 0x11 => Falloc::ZeroRange {
                keep_size: mode == 0x11,
            },
            _ => return reply.error(Errno::from_i32(95)), // EOPNOTSUPP
        };
        Self::empty(self.fs.fallocate(ino(i), offset, length, how), reply);
    }

    fn lseek(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let found = match seek_request(offset, whence) {
            Err(e) => return reply.error(Errno::from_i32(e)),
            Ok(None) => Ok(None),
            Ok(Some((offset, data))) => self.fs.seek(ino(i), offset, data),
        };
        match found {
            Ok(Some(at)) => reply.offset(at as i64),
            Ok(None) => reply.error(Errno::from_i32(ENXIO)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Counted like a file's open: a directory removed while open
        // lives on, empty and unlinked, until its releasedir.
        match self.fs.open(ino(i)) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.release(ino(i)), reply);
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
            self.fs.data_available(),
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
            .make(req, parent, name, Kind::File, mode, umask, 0)
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

const ENXIO: i32 = 6;

/// What an `lseek` the kernel passes on asks for: `(offset, SEEK_DATA?)`,
/// `None` for a negative offset — nothing there, `ENXIO`, as Linux
/// answers for any filesystem (xfstests's generic/448) — or the errno of
/// a request metafs does not take (the kernel sends only `SEEK_DATA`, 3,
/// and `SEEK_HOLE`, 4).
fn seek_request(offset: i64, whence: i32) -> Result<Option<(u64, bool)>, i32> {
    if !matches!(whence, 3 | 4) {
        return Err(22); // EINVAL
    }
    Ok(u64::try_from(offset).ok().map(|o| (o, whence == 3)))
}

#[cfg(test)]
mod tests {
    use super::seek_request;

    #[test]
    fn a_negative_seek_data_or_hole_offset_finds_nothing_and_others_are_refused() {
        assert_eq!(seek_request(-1, 3), Ok(None));
        assert_eq!(seek_request(i64::MIN, 4), Ok(None));
        assert_eq!(seek_request(0, 3), Ok(Some((0, true))));
        assert_eq!(seek_request(4096, 4), Ok(Some((4096, false))));
        assert_eq!(seek_request(0, 0), Err(22));
        assert_eq!(seek_request(-1, 2), Err(22));
    }
}
