//! Between metafs's values and FUSE's: errors, times, kinds, attributes.

use crate::volume::Stat;
use crate::{Error, Kind, Time};
use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(super) fn errno(e: &Error) -> Errno {
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

pub(super) fn file_type(k: Kind) -> FileType {
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
pub(super) fn kind_of_mode(mode: u32) -> Option<Kind> {
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

pub(super) fn attr(s: &Stat) -> FileAttr {
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

pub(super) fn ino(i: INodeNo) -> u32 {
    u32::try_from(u64::from(i)).unwrap_or(0)
}

pub(super) fn time_or_now(t: TimeOrNow) -> Time {
    match t {
        TimeOrNow::Now => Time::now(),
        TimeOrNow::SpecificTime(s) => metafs_time(s),
    }
}
