//! The namespace operations by inode: lookup, stat, readdir, create and
//! mknod, mkdir, symlink, link, unlink, rmdir, rename (with its flags),
//! and setattr (mode, owner, times, size).

use super::*;
use crate::acl::{self, Acl};
use crate::layout::xattr::Xattr;

/// What a new inode is made with ([`Fs::make_node`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewNode {
    /// Its kind (not [`Kind::Free`]).
    pub kind: Kind,
    /// Permission bits (`0o7777`).
    pub mode: u16,
    /// Owner.
    pub uid: u32,
    /// Group (replaced by the directory's own if it is set-group-ID).
    pub gid: u32,
    /// Device number (devices only).
    pub rdev: u32,
    /// The creator's umask: taken out of `mode` unless the directory has
    /// a default ACL, which then masks the mode instead (POSIX.1e).
    pub umask: u16,
}

impl NewNode {
    /// A node of `kind` with `mode`, owned by root, device 0, umask 0.
    pub fn new(kind: Kind, mode: u16) -> Self {
        NewNode {
            kind,
            mode,
            uid: 0,
            gid: 0,
            rdev: 0,
            umask: 0,
        }
    }
}

/// What [`Fs::rename_with`] does when the target name exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RenameMode {
    /// Replace it (plain `rename(2)`).
    #[default]
    Replace,
    /// Fail with [`Error::Exists`] (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap the two names, both of which must exist (`RENAME_EXCHANGE`).
    Exchange,
}

/// The attributes [`Fs::setattr`] changes: `None` leaves one as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// Permission bits.
    pub mode: Option<u16>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size (files only): truncates or extends with zeros.
    pub size: Option<u64>,
    /// Access time.
    pub atime: Option<Time>,
    /// Modification time.
    pub mtime: Option<Time>,
    /// Status-change time (default: now, as every change of attributes
    /// moves it).
    pub ctime: Option<Time>,
}

/// Most links one inode may have (ext4's limit).
pub const LINK_MAX: u32 = 65_000;

/// A new inode's mode and attributes: inherited from its directory's
/// default ACL, or its mode less the umask.
fn inherit(default: Option<&Acl>, node: &NewNode) -> (u16, Vec<Xattr>) {
    let mode = node.mode & 0o7777;
    let Some(def) = default else {
        return (mode & !node.umask, Vec::new());
    };
    let (access, mode) = def.create(mode);
    let mut attrs = Vec::new();
    if let Some(a) = access {
        attrs.push((acl::ACCESS.to_vec(), a.encode()));
    }
    if node.kind == Kind::Dir {
        attrs.push((acl::DEFAULT.to_vec(), def.encode()));
    }
    (mode, attrs)
}

pub(super) fn stat_of(ino: Ino, i: &Inode) -> Stat {
    Stat {
        ino,
        kind: i.kind,
        mode: i.mode,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        size: i.size,
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        rdev: i.rdev,
        blocks: i.blocks,
    }
}

impl Fs {
    /// The inode `name` names in directory `dir`.
    pub fn lookup(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        check_name(name)?;
        self.with(|st, img| st.find(img, dir, name)?.map(|f| f.2).ok_or(Error::NotFound))
    }

    /// Attributes of an inode.
    pub fn stat(&self, ino: Ino) -> Result<Stat> {
        self.with(|st, img| Ok(stat_of(ino, &st.live(img, ino)?)))
    }

    /// The entries of a directory: (name, inode, kind).
    pub fn readdir(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, Kind)>> {
        self.with(|st, img| st.entries(img, dir))
    }

    /// Up to `limit` entries of `dir` from position `pos` (0: the start):
    /// (position, name, inode, kind). Resume from the last position + 1;
    /// a position stays valid while its entry lives. A listing from the
    /// start moves the directory's access time as [`MountOptions::atime`]
    /// and [`MountOptions::diratime`] say.
    pub fn readdir_from(&self, dir: Ino, pos: u64, limit: usize) -> Result<Vec<EntryAt>> {
        let policy = match self.options.diratime {
            true => self.options.atime,
            false => Atime::Never,
        };
        self.with(|st, img| {
            let out = st.entries_from(img, dir, pos, limit)?;
            if pos == 0 {
                let d = st.dir(img, dir)?;
                st.accessed(img, dir, d, policy)?;
            }
            Ok(out)
        })
    }

    /// The parent of a directory (the root is its own).
    pub fn parent(&self, dir: Ino) -> Result<Ino> {
        self.with(|st, img| Ok(st.dir(img, dir)?.parent))
    }

    /// Creates `name` in `dir` as `node` describes: a file, directory,
    /// symlink (empty: use [`Fs::symlink`]), FIFO, socket or device. In a
    /// set-group-ID directory the new inode takes the directory's group,
    /// and a new directory the set-group-ID bit. Under a directory with a
    /// default ACL the new inode inherits it (its access list, and a
    /// directory its default list too); elsewhere the umask applies.
    pub fn make_node(&self, dir: Ino, name: &[u8], node: NewNode) -> Result<Ino> {
        check_name(name)?;
        if node.kind == Kind::Free {
            return Err(Error::InvalidArgument("a new inode needs a kind"));
        }
        self.with(|st, img| st.make(img, dir, name, node))
    }

    /// Creates an empty file `name` in `dir` (mode 0644, owner root).
    pub fn create(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.make_node(dir, name, NewNode::new(Kind::File, 0o644))
    }

    /// Creates a directory `name` in `dir` (mode 0755, owner root).
    pub fn mkdir(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.make_node(dir, name, NewNode::new(Kind::Dir, 0o755))
    }

    /// Creates a symlink `name` in `dir` to `target` (1..=4095 bytes),
    /// owned by `uid`:`gid`.
    pub fn symlink(&self, dir: Ino, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Ino> {
        check_name(name)?;
        if target.is_empty() || target.contains(&0) {
            return Err(Error::InvalidName);
        }
        if target.len() > crate::layout::SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        self.with(|st, img| {
            // Its block is allocated with the inode, so the space check
            // covers both before anything changes.
            if st.available() < 1 + st.add_needs(img, dir, name)? {
                return Err(Error::NoSpace);
            }
            let node = NewNode {
                uid,
                gid,
                ..NewNode::new(Kind::Symlink, 0o777)
            };
            let ino = st.make(img, dir, name, node)?;
            let mut i = st.live(img, ino)?;
            st.write_data(img, &mut i, 0, target)?;
            st.set_inode(img, ino, &i)?;
            Ok(ino)
        })
    }

    /// Adds the name `dir/name` for the existing inode `ino` (a hard link;
    /// not to a directory).
    pub fn link(&self, ino: Ino, dir: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::NotPermitted);
            }
            if i.nlink >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            st.dir(img, dir)?;
            if st.find(img, dir, name)?.is_some() {
                return Err(Error::Exists);
            }
            if st.available() < st.add_needs(img, dir, name)? {
                return Err(Error::NoSpace);
            }
            st.add_entry(img, dir, name, ino, i.kind)?;
            i.nlink += 1;
            i.ctime = Time::now();
            st.set_inode(img, ino, &i)?;
            st.touch(img, dir)
        })
    }

    /// Removes the name `name` from `dir` (not a directory); the inode and
    /// its blocks are freed with its last link.
    pub fn unlink(&self, dir: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.with(|st, img| {
            st.dir(img, dir)?;
            let (_, _, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            if st.live(img, ino)?.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            st.remove_entry(img, dir, name)?;
            st.drop_link(img, ino)?;
            st.touch(img, dir)
        })
    }

    /// Removes the empty directory `name` from `dir`.
    pub fn rmdir(&self, dir: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.with(|st, img| {
            st.dir(img, dir)?;
            let (_, _, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            if st.live(img, ino)?.kind != Kind::Dir {
                return Err(Error::NotADirectory);
            }
            if !st.is_empty_dir(img, ino)? {
                return Err(Error::NotEmpty);
            }
            st.remove_entry(img, dir, name)?;
            st.last_link_gone(img, ino)?;
            st.add_links(img, dir, -1)?;
            st.touch(img, dir)
        })
    }

    /// Renames `dir/name` to `to_dir/to_name`, atomically, replacing a
    /// file there, or an empty directory when moving a directory.
    pub fn rename(&self, dir: Ino, name: &[u8], to_dir: Ino, to_name: &[u8]) -> Result<()> {
        self.rename_with(dir, name, to_dir, to_name, RenameMode::Replace)
    }

    /// [`Fs::rename`] with `renameat2`'s choices for an existing target.
    pub fn rename_with(
        &self,
        dir: Ino,
        name: &[u8],
        to_dir: Ino,
        to_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        check_name(name)?;
        check_name(to_name)?;
        self.with(|st, img| st.rename(img, (dir, name), (to_dir, to_name), mode))
    }

    /// Changes the attributes `a` names; returns them all after. A new
    /// mode rewrites an access ACL's owner, mask (or group) and other
    /// entries with it.
    pub fn setattr(&self, ino: Ino, a: &SetAttr) -> Result<Stat> {
        if let Some(size) = a.size {
            self.truncate(ino, size)?;
        }
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            if let Some(m) = a.mode {
                st.chmod(img, &mut i, m)?;
            }
            i.uid = a.uid.unwrap_or(i.uid);
            i.gid = a.gid.unwrap_or(i.gid);
            i.atime = a.atime.unwrap_or(i.atime);
            i.mtime = a.mtime.unwrap_or(i.mtime);
            i.ctime = a.ctime.unwrap_or_else(Time::now);
            st.set_inode(img, ino, &i)?;
            Ok(stat_of(ino, &i))
        })
    }
}

impl State {
    /// Makes `dir/name` (checked by the caller) as `node` describes.
    fn make(&mut self, img: &dyn VfsFile, dir: Ino, name: &[u8], node: NewNode) -> Result<Ino> {
        let d = self.dir(img, dir)?;
        if self.find(img, dir, name)?.is_some() {
            return Err(Error::Exists);
        }
        let default = match node.kind {
            Kind::Symlink => None,
            _ => self.acl_of(img, &d, acl::DEFAULT)?,
        };
        // The inherited lists take one attribute block at most.
        let extra = default.is_some() as u64;
        if self.free_inodes == 0 || self.available() < self.add_needs(img, dir, name)? + extra {
            return Err(Error::NoSpace);
        }
        if d.kind == Kind::Dir && node.kind == Kind::Dir && d.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let (mode, attrs) = inherit(default.as_ref(), &node);
        let mut new = Inode::new(node.kind, mode, node.uid, node.gid, dir, Time::now());
        new.rdev = node.rdev;
        if d.mode & 0o2000 != 0 {
            new.gid = d.gid;
            if node.kind == Kind::Dir {
                new.mode |= 0o2000;
            }
        }
        let ino = self.alloc_inode(img, &new)?;
        if !attrs.is_empty() {
            self.write_xattrs(img, &mut new, &attrs)?;
            self.set_inode(img, ino, &new)?;
        }
        self.add_entry(img, dir, name, ino, node.kind)?;
        if node.kind == Kind::Dir {
            self.add_links(img, dir, 1)?;
        }
        self.touch(img, dir)?;
        Ok(ino)
    }

    /// `chmod`: the mode's permission bits, and an access ACL's entries
    /// with them (the caller writes `i` back).
    fn chmod(&mut self, img: &dyn VfsFile, i: &mut Inode, mode: u16) -> Result<()> {
        i.mode = mode & 0o7777;
        let Some(mut list) = self.acl_of(img, i, acl::ACCESS)? else {
            return Ok(());
        };
        list.chmod(i.mode);
        let mut attrs = self.xattrs(img, i)?;
        for (n, v) in &mut attrs {
            if n == acl::ACCESS {
                *v = list.encode();
            }
        }
        self.write_xattrs(img, i, &attrs)
    }

    /// Changes the link count of `ino` by `by`.
    fn add_links(&mut self, img: &dyn VfsFile, ino: Ino, by: i64) -> Result<()> {
        let mut i = self.live(img, ino)?;
        i.nlink = u32::try_from(i.nlink as i64 + by)
            .map_err(|_| Error::Corrupt(format!("inode {ino}'s link count underflows")))?;
        self.set_inode(img, ino, &i)
    }

    /// One name of non-directory `ino` is gone: its link count drops, and
    /// with the last link the inode is freed (or, while open, orphaned).
    fn drop_link(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let mut i = self.live(img, ino)?;
        if i.nlink <= 1 {
            return self.last_link_gone(img, ino);
        }
        i.nlink -= 1;
        i.ctime = Time::now();
        self.set_inode(img, ino, &i)
    }

    /// Fails if directory `ino` is `below` or one of its ancestors (a
    /// directory cannot move below itself).
    fn not_above(&mut self, img: &dyn VfsFile, ino: Ino, below: Ino) -> Result<()> {
        let mut p = below;
        // Bounded by the inode count: a parent cycle on disk cannot hang.
        for _ in 0..self.sb.inodes {
            if p == ino {
                return Err(Error::InvalidArgument(
                    "a directory cannot move below itself",
                ));
            }
            if p == ROOT {
                return Ok(());
            }
            p = self.dir(img, p)?.parent;
        }
        Err(Error::Corrupt(format!("directory {below}'s parents loop")))
    }

    fn rename(
        &mut self,
        img: &dyn VfsFile,
        (dir, name): (Ino, &[u8]),
        (to_dir, to_name): (Ino, &[u8]),
        mode: RenameMode,
    ) -> Result<()> {
        self.dir(img, dir)?;
        self.dir(img, to_dir)?;
        let (_, _, ino) = self.find(img, dir, name)?.ok_or(Error::NotFound)?;
        let src = self.live(img, ino)?;
        let target = self.find(img, to_dir, to_name)?.map(|p| p.2);
        match (mode, target) {
            (RenameMode::NoReplace, Some(_)) => return Err(Error::Exists),
            (RenameMode::Exchange, None) => return Err(Error::NotFound),
            _ => {}
        }
        if target == Some(ino) {
            return Ok(()); // two names of one inode: nothing to do
        }
        if src.kind == Kind::Dir {
            self.not_above(img, ino, to_dir)?;
        }
        if let (RenameMode::Exchange, Some(t)) = (mode, target) {
            return self.exchange(img, (dir, name, ino), (to_dir, to_name, t));
        }
        if let Some(t) = target {
            let tk = self.live(img, t)?.kind;
            match (src.kind == Kind::Dir, tk == Kind::Dir) {
                (true, true) if !self.is_empty_dir(img, t)? => return Err(Error::NotEmpty),
                (true, false) => return Err(Error::NotADirectory),
                (false, true) => return Err(Error::IsADirectory),
                _ => {}
            }
        } else if self.available() < self.add_needs(img, to_dir, to_name)? {
            return Err(Error::NoSpace);
        }
        // Checks done: from here nothing fails for want of space.
        self.remove_entry(img, dir, name)?;
        match target {
            Some(t) => {
                self.retarget_entry(img, to_dir, to_name, ino, src.kind)?;
                if self.live(img, t)?.kind == Kind::Dir {
                    self.last_link_gone(img, t)?;
                    self.add_links(img, to_dir, -1)?;
                } else {
                    self.drop_link(img, t)?;
                }
            }
            None => self.add_entry(img, to_dir, to_name, ino, src.kind)?,
        }
        if src.kind == Kind::Dir && dir != to_dir {
            self.reparent(img, ino, dir, to_dir)?;
        }
        self.moved(img, ino, dir, to_dir)
    }

    /// `RENAME_EXCHANGE`: the two names swap inodes.
    fn exchange(
        &mut self,
        img: &dyn VfsFile,
        (dir, name, a): (Ino, &[u8], Ino),
        (to_dir, to_name, b): (Ino, &[u8], Ino),
    ) -> Result<()> {
        let (ak, bk) = (self.live(img, a)?.kind, self.live(img, b)?.kind);
        if bk == Kind::Dir {
            self.not_above(img, b, dir)?;
        }
        self.retarget_entry(img, dir, name, b, bk)?;
        self.retarget_entry(img, to_dir, to_name, a, ak)?;
        if dir != to_dir {
            if ak == Kind::Dir {
                self.reparent(img, a, dir, to_dir)?;
            }
            if bk == Kind::Dir {
                self.reparent(img, b, to_dir, dir)?;
            }
        }
        self.moved(img, b, to_dir, dir)?;
        self.moved(img, a, dir, to_dir)
    }

    /// Directory `ino` moved from `from` to `to`: its parent and both link
    /// counts follow.
    fn reparent(&mut self, img: &dyn VfsFile, ino: Ino, from: Ino, to: Ino) -> Result<()> {
        let mut s = self.live(img, ino)?;
        s.parent = to;
        self.set_inode(img, ino, &s)?;
        self.add_links(img, from, -1)?;
        self.add_links(img, to, 1)
    }

    /// The times a move changes: the inode's ctime, both directories'.
    fn moved(&mut self, img: &dyn VfsFile, ino: Ino, from: Ino, to: Ino) -> Result<()> {
        let mut i = self.live(img, ino)?;
        i.ctime = Time::now();
        self.set_inode(img, ino, &i)?;
        self.touch(img, from)?;
        self.touch(img, to)
    }
}
