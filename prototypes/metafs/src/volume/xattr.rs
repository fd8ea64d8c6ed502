//! Extended attributes: `user.`, `trusted.` and `security.` ones, and the
//! POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`,
//! kept in step with the mode: [`crate::acl`]).
//!
//! An inode's attributes are one run of bytes over a chain of metadata
//! blocks ([`crate::layout::xattr`]), read through the block cache — no
//! attribute is held in memory beyond it — and rewritten whole by a change,
//! inside the running transaction like any other metadata change: the
//! chain, the inode (its mode too, for an ACL) and the block bitmap move
//! together, or not at all.

use super::*;
use crate::acl::{self, Acl};
use crate::layout::xattr::{self as xa, Xattr, MAX_CHAIN, PAYLOAD};

/// What [`Fs::setxattr`] does when the attribute exists, or not
/// (`setxattr(2)`'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrSet {
    /// Create or replace.
    #[default]
    Any,
    /// `XATTR_CREATE`: fail with [`Error::Exists`] if it exists.
    Create,
    /// `XATTR_REPLACE`: fail with [`Error::NoData`] if it does not.
    Replace,
}

/// Checks an attribute's full name: 1..=255 bytes, a namespace metafs
/// keeps (`user.`, `trusted.`, `security.` with a name after it, or one
/// of the two ACL names); any other is [`Error::NotSupported`].
pub fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.len() > xa::NAME_MAX {
        return Err(Error::OutOfRange);
    }
    if name.is_empty() || name.contains(&0) {
        return Err(Error::InvalidArgument("an empty extended attribute name"));
    }
    if name == acl::ACCESS || name == acl::DEFAULT {
        return Ok(());
    }
    for ns in [&b"user."[..], b"trusted.", b"security."] {
        if let Some(rest) = name.strip_prefix(ns) {
            return match rest.is_empty() {
                true => Err(Error::InvalidArgument(
                    "an attribute name of only its namespace",
                )),
                false => Ok(()),
            };
        }
    }
    Err(Error::NotSupported("extended attributes of that namespace"))
}

impl Fs {
    /// The value of attribute `name` of `ino`.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            let attrs = st.xattrs(img, &i)?;
            attrs
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v)
                .ok_or(Error::NoData)
        })
    }

    /// The names of `ino`'s attributes, in the order they were made.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            Ok(st.xattrs(img, &i)?.into_iter().map(|(n, _)| n).collect())
        })
    }

    /// Sets attribute `name` of `ino` to `value`, as `how` says. An access
    /// ACL sets the mode's permission bits too, and is not kept when the
    /// mode says it whole; a default ACL is for directories only.
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrSet) -> Result<()> {
        self.setxattr_with(ino, name, value, how, false)
    }

    /// [`Fs::setxattr`]; `drop_sgid`: an access ACL set by a caller
    /// neither privileged nor in the file's group also clears the
    /// set-group-ID bit, in the same transaction (the kernel's
    /// `posix_acl_update_mode`; the caller knows who is asking).
    pub fn setxattr_with(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
        drop_sgid: bool,
    ) -> Result<()> {
        check_xattr_name(name)?;
        if value.len() > xa::VALUE_MAX {
            return Err(Error::TooBig);
        }
        let parsed = match name == acl::ACCESS || name == acl::DEFAULT {
            true => Some(Acl::decode(value)?),
            false => None,
        };
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            let mut attrs = st.xattrs(img, &i)?;
            let at = attrs.iter().position(|(n, _)| n == name);
            match (how, at) {
                (XattrSet::Create, Some(_)) => return Err(Error::Exists),
                (XattrSet::Replace, None) => return Err(Error::NoData),
                _ => {}
            }
            let mut keep = true;
            if let Some(a) = &parsed {
                if name == acl::DEFAULT && i.kind != Kind::Dir {
                    return Err(Error::InvalidArgument("a default ACL on a non-directory"));
                }
                if name == acl::ACCESS {
                    let (mode, whole) = a.mode(i.mode);
                    i.mode = if drop_sgid { mode & !0o2000 } else { mode };
                    keep = !whole;
                }
            }
            match (at, keep) {
                (Some(k), true) => attrs[k].1 = value.to_vec(),
                (None, true) => attrs.push((name.to_vec(), value.to_vec())),
                (Some(k), false) => drop(attrs.remove(k)),
                (None, false) => {}
            }
            i.ctime = Time::now();
            st.write_xattrs(img, &mut i, &attrs)?;
            st.set_inode(img, ino, &i)
        })
    }

    /// Removes attribute `name` of `ino`.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        check_xattr_name(name)?;
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            let mut attrs = st.xattrs(img, &i)?;
            let k = attrs
                .iter()
                .position(|(n, _)| n == name)
                .ok_or(Error::NoData)?;
            attrs.remove(k);
            i.ctime = Time::now();
            st.write_xattrs(img, &mut i, &attrs)?;
            st.set_inode(img, ino, &i)
        })
    }
}

impl State {
    /// The blocks of `i`'s attribute chain, checked: each a chain block,
    /// in the data area, at most [`MAX_CHAIN`] of them.
    pub(super) fn xattr_chain(&mut self, img: &dyn VfsFile, i: &Inode) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut b = self.mapped(i.xattr)?;
        while b != 0 {
            if out.len() >= MAX_CHAIN || out.contains(&b) {
                return Err(Error::Corrupt(format!(
                    "an extended attribute chain longer than {MAX_CHAIN} blocks, or a loop"
                )));
            }
            out.push(b);
            let (next, _) = xa::header(self.get(img, b)?)?;
            b = self.mapped(next)?;
        }
        Ok(out)
    }

    /// `i`'s attributes.
    pub(super) fn xattrs(&mut self, img: &dyn VfsFile, i: &Inode) -> Result<Vec<Xattr>> {
        let mut run = Vec::new();
        for b in self.xattr_chain(img, i)? {
            let blk = self.get(img, b)?;
            let (_, used) = xa::header(blk)?;
            run.extend_from_slice(xa::payload(blk, used));
        }
        xa::decode(&run)
    }

    /// The list in attribute `name` of `i`, if it has one.
    pub(super) fn acl_of(
        &mut self,
        img: &dyn VfsFile,
        i: &Inode,
        name: &[u8],
    ) -> Result<Option<Acl>> {
        if i.xattr == 0 {
            return Ok(None);
        }
        let attrs = self.xattrs(img, i)?;
        match attrs.iter().find(|(n, _)| n == name) {
            Some((_, v)) => Acl::decode(v)
                .map(Some)
                .map_err(|_| Error::Corrupt(format!("a stored ACL of {} bytes", v.len()))),
            None => Ok(None),
        }
    }

    /// Rewrites `i`'s chain (the caller writes `i` back) to hold
    /// `attrs`: its blocks reused in order, more allocated or the rest
    /// freed. Nothing changes when it fails for want of room.
    pub(super) fn write_xattrs(
        &mut self,
        img: &dyn VfsFile,
        i: &mut Inode,
        attrs: &[Xattr],
    ) -> Result<()> {
        let run = xa::encode(attrs);
        let need = run.len().div_ceil(PAYLOAD);
        if need > MAX_CHAIN {
            return Err(Error::NoSpace);
        }
        let old = self.xattr_chain(img, i)?;
        if need > old.len() && self.available() < (need - old.len()) as u64 {
            return Err(Error::NoSpace);
        }
        let mut blocks: Vec<u32> = old.iter().copied().take(need).collect();
        while blocks.len() < need {
            blocks.push(self.alloc_block(img)?);
            i.blocks += 1;
        }
        for &b in old.iter().skip(need) {
            self.free_block(img, b, true)?;
            i.blocks = i.blocks.saturating_sub(1);
        }
        for (k, part) in run.chunks(PAYLOAD).enumerate() {
            let next = blocks.get(k + 1).copied().unwrap_or(0);
            let b = blocks[k];
            let blk = match k < old.len() {
                true => self.get_mut(img, b)?,
                false => self.fresh(b),
            };
            xa::fill(blk, next, part);
        }
        i.xattr = blocks.first().copied().unwrap_or(0);
        Ok(())
    }

    /// Frees `i`'s chain (an inode being freed).
    pub(super) fn free_xattrs(&mut self, img: &dyn VfsFile, i: &mut Inode) -> Result<()> {
        for b in self.xattr_chain(img, i)? {
            self.free_block(img, b, true)?;
            i.blocks = i.blocks.saturating_sub(1);
        }
        i.xattr = 0;
        Ok(())
    }
}
