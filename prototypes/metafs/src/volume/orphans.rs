//! Open files and orphans: an inode whose last name goes while it is open
//! keeps its blocks until the last close (POSIX), on the orphan list that
//! starts in the root inode, so a crash before that close cannot leak it:
//! mount frees every inode on the list (ext4's orphan list). Directories
//! too: one removed (or renamed over) while open stays, empty, with no
//! links, until its last close — `fstat` on it says `nlink` 0.

use super::*;

impl Fs {
    /// Opens inode `ino` (a file, or a directory: FUSE's `opendir`): until
    /// the matching [`Fs::release`], removing its last name does not free
    /// it.
    pub fn open(&self, ino: Ino) -> Result<()> {
        self.with(|st, img| {
            st.live(img, ino)?;
            *st.open.entry(ino).or_insert(0) += 1;
            Ok(())
        })
    }

    /// Closes one [`Fs::open`] of `ino`; the last close of an inode with
    /// no names left frees it.
    pub fn release(&self, ino: Ino) -> Result<()> {
        self.with(|st, img| {
            let Some(n) = st.open.get_mut(&ino) else {
                return Ok(());
            };
            *n -= 1;
            if *n > 0 {
                return Ok(());
            }
            st.open.remove(&ino);
            let i = st.live(img, ino)?;
            if i.nlink == 0 {
                st.unlist_orphan(img, ino)?;
                st.free_inode(img, ino)?;
            }
            Ok(())
        })
    }
}

impl State {
    /// The last name of `ino` went (a directory's only one: it is empty):
    /// free it, or if it is open, make it an orphan.
    pub(super) fn last_link_gone(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        if !self.open.contains_key(&ino) {
            return self.free_inode(img, ino);
        }
        let mut root = self.dir(img, ROOT)?;
        let mut i = self.live(img, ino)?;
        i.nlink = 0;
        i.ctime = Time::now();
        i.next_orphan = root.next_orphan;
        self.set_inode(img, ino, &i)?;
        root.next_orphan = ino;
        self.set_inode(img, ROOT, &root)
    }

    /// The orphan list, first to last (bounded: a loop on disk is corrupt).
    pub(super) fn orphans(&mut self, img: &dyn VfsFile) -> Result<Vec<Ino>> {
        let mut out = Vec::new();
        let mut next = self.dir(img, ROOT)?.next_orphan;
        while next != 0 {
            if out.len() >= self.sb.inodes as usize {
                return Err(Error::Corrupt("the orphan list loops".into()));
            }
            out.push(next);
            next = self.live(img, next)?.next_orphan;
        }
        Ok(out)
    }

    /// Takes `ino` off the orphan list.
    fn unlist_orphan(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let list = self.orphans(img)?;
        let Some(k) = list.iter().position(|&o| o == ino) else {
            return Ok(());
        };
        let after = self.live(img, ino)?.next_orphan;
        let prev = if k == 0 { ROOT } else { list[k - 1] };
        let mut p = self.live(img, prev)?;
        p.next_orphan = after;
        self.set_inode(img, prev, &p)
    }

    /// Frees every inode on the orphan list (at mount: nothing is open);
    /// returns whether there were any.
    pub(super) fn reap_orphans(&mut self, img: &dyn VfsFile) -> Result<bool> {
        let list = self.orphans(img)?;
        for &ino in &list {
            let i = self.live(img, ino)?;
            if i.nlink != 0 {
                return Err(Error::Corrupt(format!(
                    "orphan inode {ino} has {} links",
                    i.nlink
                )));
            }
        }
        for &ino in &list {
            self.free_inode(img, ino)?;
        }
        if !list.is_empty() {
            let mut root = self.dir(img, ROOT)?;
            root.next_orphan = 0;
            self.set_inode(img, ROOT, &root)?;
        }
        Ok(!list.is_empty())
    }
}
