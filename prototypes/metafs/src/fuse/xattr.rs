//! Extended attributes and POSIX ACLs through FUSE.
//!
//! The mount asks the kernel for FUSE's `POSIX_ACL` (the kernel checks
//! access against the lists, caches them, and forwards `setfacl` as the
//! `system.posix_acl_*` attributes) and `DONT_MASK` (the kernel leaves the
//! umask to metafs, which drops it under a directory with a default ACL,
//! as POSIX.1e says). Setting an access list also drops the set-group-ID
//! bit when the caller is neither root nor in the file's group (the
//! kernel's `posix_acl_update_mode`; its own flag for it needs a FUSE
//! extension fuser lacks, so metafs looks at the caller's groups in
//! `/proc`).

use super::convert::{errno, ino};
use super::MetaFuse;
use crate::acl;
use crate::volume::XattrSet;
use fuser::{Errno, INodeNo, ReplyEmpty, ReplyXattr, Request};
use journal_core::vfs::{OpenOptions, OsVfs, Vfs};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// `setxattr(2)`'s `XATTR_CREATE` and `XATTR_REPLACE`.
const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;

/// Answers a get or a list: the size when asked for it (`size` 0), the
/// bytes when they fit, `ERANGE` when they do not.
fn sized(r: crate::Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() <= size as usize => reply.data(&v),
        Ok(_) => reply.error(Errno::from_i32(34)), // ERANGE
        Err(e) => reply.error(errno(&e)),
    }
}

/// Whether the caller of `req` is in group `gid`: its own, or one of its
/// supplementary groups as `/proc/PID/status` lists them.
fn in_group(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let path = PathBuf::from(format!("/proc/{}/status", req.pid()));
    let Ok(f) = OsVfs::new().open(&path, OpenOptions::read()) else {
        return false;
    };
    let mut buf = vec![0u8; 8192];
    let n = f.read_at(&mut buf, 0).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
}

impl MetaFuse {
    pub(super) fn do_getxattr(&self, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        sized(self.fs.getxattr(ino(i), name.as_bytes()), size, reply);
    }

    pub(super) fn do_listxattr(&self, i: INodeNo, size: u32, reply: ReplyXattr) {
        let names = self.fs.listxattr(ino(i)).map(|names| {
            let mut out = Vec::new();
            for n in names {
                out.extend_from_slice(&n);
                out.push(0);
            }
            out
        });
        sized(names, size, reply);
    }

    pub(super) fn do_setxattr(
        &self,
        req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        let how = match flags {
            0 => XattrSet::Any,
            XATTR_CREATE => XattrSet::Create,
            XATTR_REPLACE => XattrSet::Replace,
            _ => return reply.error(Errno::from_i32(22)),
        };
        let name = name.as_bytes();
        let drop_sgid = name == acl::ACCESS
            && req.uid() != 0
            && self
                .fs
                .stat(ino(i))
                .is_ok_and(|s| s.mode & 0o2000 != 0 && !in_group(req, s.gid));
        let r = self.fs.setxattr_with(ino(i), name, value, how, drop_sgid);
        Self::empty(r, reply);
    }

    pub(super) fn do_removexattr(&self, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.removexattr(ino(i), name.as_bytes()), reply);
    }
}
