//! The operations: the namespace (lookup, create, mkdir, unlink, rmdir,
//! rename), file data (write, read, truncate) and durability (fsync, sync,
//! commits, checkpoints, unmount).

use super::*;

impl Fs {
    // ---- namespace -------------------------------------------------------

    /// The inode `name` names in directory `dir`.
    pub fn lookup(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.with(|st, img| st.find(img, dir, name)?.map(|f| f.2).ok_or(Error::NotFound))
    }

    /// Attributes of an inode.
    pub fn stat(&self, ino: Ino) -> Result<Stat> {
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            let mut blocks = 0;
            let n = i.size.div_ceil(BLOCK as u64) as usize;
            for idx in 0..n.min(DIRECT + PER_INDIRECT) {
                blocks += (st.bmap(img, &i, idx)? != 0) as u64;
            }
            blocks += (i.indirect != 0) as u64;
            Ok(Stat {
                ino,
                kind: i.kind,
                size: i.size,
                nlink: i.nlink,
                mtime_ns: i.mtime_ns,
                blocks,
            })
        })
    }

    /// The entries of a directory: (name, inode, kind).
    pub fn readdir(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, Kind)>> {
        self.with(|st, img| {
            let entries = st.entries(img, dir)?;
            entries
                .into_iter()
                .map(|(n, ino)| Ok((n, ino, st.live(img, ino)?.kind)))
                .collect()
        })
    }

    /// The parent of a directory (the root is its own).
    pub fn parent(&self, dir: Ino) -> Result<Ino> {
        self.with(|st, img| Ok(st.dir(img, dir)?.parent))
    }

    pub(super) fn make(&self, dir: Ino, name: &[u8], kind: Kind) -> Result<Ino> {
        check_name(name)?;
        self.with(|st, img| {
            st.dir(img, dir)?;
            if st.find(img, dir, name)?.is_some() {
                return Err(Error::Exists);
            }
            if st.free_inodes == 0 || st.available() < st.add_needs(img, dir)? {
                return Err(Error::NoSpace);
            }
            let ino = st.alloc_inode(img, kind, dir)?;
            st.add_entry(img, dir, name, ino)?;
            let mut d = st.dir(img, dir)?;
            if kind == Kind::Dir {
                d.nlink += 1;
            }
            d.mtime_ns = now_ns();
            st.set_inode(img, dir, &d)?;
            Ok(ino)
        })
    }

    /// Creates an empty file `name` in `dir`.
    pub fn create(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.make(dir, name, Kind::File)
    }

    /// Creates a directory `name` in `dir`.
    pub fn mkdir(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.make(dir, name, Kind::Dir)
    }

    /// Removes the file `name` from `dir` (its inode and blocks are freed).
    pub fn unlink(&self, dir: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.with(|st, img| {
            let (b, slot, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            if st.live(img, ino)?.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            set_dirent(st.get_mut(img, b)?, slot, 0, b"");
            st.free_inode(img, ino)?;
            st.touch(img, dir)
        })
    }

    /// Removes the empty directory `name` from `dir`.
    pub fn rmdir(&self, dir: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.with(|st, img| {
            let (b, slot, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            if st.live(img, ino)?.kind != Kind::Dir {
                return Err(Error::NotADirectory);
            }
            if !st.is_empty_dir(img, ino)? {
                return Err(Error::NotEmpty);
            }
            set_dirent(st.get_mut(img, b)?, slot, 0, b"");
            st.free_inode(img, ino)?;
            let mut d = st.dir(img, dir)?;
            d.nlink -= 1;
            d.mtime_ns = now_ns();
            st.set_inode(img, dir, &d)
        })
    }

    /// Renames `dir/name` to `to_dir/to_name`, atomically, replacing a
    /// file there, or an empty directory when moving a directory.
    pub fn rename(&self, dir: Ino, name: &[u8], to_dir: Ino, to_name: &[u8]) -> Result<()> {
        check_name(name)?;
        check_name(to_name)?;
        self.with(|st, img| {
            let (sb_, sslot, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            st.dir(img, to_dir)?;
            let src = st.live(img, ino)?;
            if src.kind == Kind::Dir {
                // Not into itself or below itself.
                let mut p = to_dir;
                loop {
                    if p == ino {
                        return Err(Error::InvalidArgument(
                            "a directory cannot move below itself",
                        ));
                    }
                    if p == ROOT {
                        break;
                    }
                    p = st.dir(img, p)?.parent;
                }
            }
            let target = st.find(img, to_dir, to_name)?;
            if let Some((_, _, t)) = target {
                if t == ino {
                    return Ok(()); // the same file: nothing to do
                }
                let tk = st.live(img, t)?.kind;
                let empty = tk == Kind::Dir && st.is_empty_dir(img, t)?;
                match (src.kind, tk) {
                    (Kind::Dir, Kind::Dir) if !empty => return Err(Error::NotEmpty),
                    (Kind::Dir, Kind::Dir) => {}
                    (Kind::Dir, _) => return Err(Error::NotADirectory),
                    (_, Kind::Dir) => return Err(Error::IsADirectory),
                    _ => {}
                }
            } else if st.available() < st.add_needs(img, to_dir)? {
                return Err(Error::NoSpace);
            }
            // Checks done: from here nothing fails for want of space.
            set_dirent(st.get_mut(img, sb_)?, sslot, 0, b"");
            match target {
                Some((tb, tslot, t)) => {
                    let t_dir = st.live(img, t)?.kind == Kind::Dir;
                    set_dirent(st.get_mut(img, tb)?, tslot, ino, to_name);
                    st.free_inode(img, t)?;
                    if t_dir {
                        let mut d = st.dir(img, to_dir)?;
                        d.nlink -= 1;
                        st.set_inode(img, to_dir, &d)?;
                    }
                }
                None => st.add_entry(img, to_dir, to_name, ino)?,
            }
            if src.kind == Kind::Dir && dir != to_dir {
                let mut s = st.live(img, ino)?;
                s.parent = to_dir;
                st.set_inode(img, ino, &s)?;
                let mut from = st.dir(img, dir)?;
                from.nlink -= 1;
                st.set_inode(img, dir, &from)?;
                let mut to = st.dir(img, to_dir)?;
                to.nlink += 1;
                st.set_inode(img, to_dir, &to)?;
            }
            st.touch(img, dir)?;
            st.touch(img, to_dir)
        })
    }

    // ---- file data -------------------------------------------------------

    /// Writes `data` at `offset` of file `ino`; returns the bytes written
    /// (all, or an error with nothing changed).
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(Error::FileTooLarge)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            if data.is_empty() {
                return Ok(0);
            }
            let bs = BLOCK as u64;
            let (first, last) = ((offset / bs) as usize, ((end - 1) / bs) as usize);
            if st.available() < st.blocks_needed(img, &i, first, last)? {
                return Err(Error::NoSpace);
            }
            if offset > i.size {
                st.zero_tail(img, &i, offset)?;
            }
            for idx in first..=last {
                let blk_start = idx as u64 * bs;
                let lo = offset.max(blk_start);
                let hi = end.min(blk_start + bs);
                let part = &data[(lo - offset) as usize..(hi - offset) as usize];
                let mut b = st.bmap(img, &i, idx)?;
                if b == 0 {
                    b = st.alloc_block(img)?;
                    st.bmap_set(img, &mut i, idx, b)?;
                    // A new block: written whole, zeros around the data.
                    let mut whole = vec![0u8; BLOCK];
                    whole[(lo - blk_start) as usize..(hi - blk_start) as usize]
                        .copy_from_slice(part);
                    img.write_at(&whole, b as u64 * bs)?;
                } else {
                    img.write_at(part, b as u64 * bs + (lo - blk_start))?;
                }
            }
            st.data_dirty = true;
            st.ops += 1;
            i.size = i.size.max(end);
            i.mtime_ns = now_ns();
            st.set_inode(img, ino, &i)?;
            Ok(data.len())
        })
    }

    /// Reads up to `len` bytes at `offset` of file `ino` (fewer at the end).
    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            if offset >= i.size {
                return Ok(Vec::new());
            }
            let end = i.size.min(offset + len as u64);
            let bs = BLOCK as u64;
            let mut out = vec![0u8; (end - offset) as usize];
            let mut at = offset;
            while at < end {
                let idx = (at / bs) as usize;
                let hi = end.min((idx as u64 + 1) * bs);
                let b = st.bmap(img, &i, idx)?;
                let dst = &mut out[(at - offset) as usize..(hi - offset) as usize];
                if b != 0 {
                    img.read_exact_at(dst, b as u64 * bs + at % bs)?;
                }
                at = hi;
            }
            Ok(out)
        })
    }

    /// Sets the size of file `ino`: blocks past a smaller size are freed;
    /// a larger size reads as zeros.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            let bs = BLOCK as u64;
            if size < i.size {
                let keep = size.div_ceil(bs) as usize;
                st.free_blocks_from(img, &mut i, keep, false)?;
            } else if size > i.size {
                st.zero_tail(img, &i, size)?;
            }
            i.size = size;
            i.mtime_ns = now_ns();
            st.set_inode(img, ino, &i)
        })
    }

    // ---- durability ------------------------------------------------------

    /// Makes every operation that returned before this call durable (jbd2
    /// commits the whole running transaction for any fsync).
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        self.with(|st, img| st.live(img, ino).map(|_| ()))?;
        self.sync()
    }

    /// Commits the running transaction: returns once every operation that
    /// returned before the call is durable. One commit runs at a time,
    /// as jbd2's commit thread does: callers that arrive meanwhile wait
    /// for it, and the first of them not covered leads the next commit,
    /// whose snapshot takes every change made by then — so concurrent
    /// fsyncs share commits.
    pub fn sync(&self) -> Result<()> {
        self.check()?;
        let want = self.state.lock().ops;
        let mut c = self.committer.lock();
        loop {
            self.check()?;
            if c.durable >= want {
                break;
            }
            if c.committing {
                c = self.commit_done.wait(c);
                continue;
            }
            c.committing = true;
            let tid = c.next_tid;
            c.next_tid += 1;
            drop(c);
            let r = self.commit_running(tid);
            c = self.committer.lock();
            c.committing = false;
            self.commit_done.notify_all();
            let (ops, bytes) = r?;
            c.durable = c.durable.max(ops);
            c.since_checkpoint += bytes;
        }
        let due = c.since_checkpoint >= self.options.checkpoint_log_bytes;
        drop(c);
        self.release_frees();
        if due {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// One commit of the running transaction (the caller leads it): data
    /// first (ordered mode), then the record, then the journal's commit.
    /// Returns the change count it made durable and the log bytes written.
    pub(super) fn commit_running(&self, tid: u64) -> Result<(u64, u64)> {
        let snap = self.state.lock().take(tid);
        let bytes = snap.record.as_ref().map_or(0, |r| r.len() as u64);
        if let Some(lsn) = self.make_durable(&snap)? {
            self.state.lock().awaiting.push((lsn, snap.frees));
        }
        Ok((snap.ops, bytes))
    }

    /// A taken transaction made durable: the image's data synced first
    /// (ordered mode), then its record appended and committed. Returns the
    /// record's LSN (none when no metadata changed; frees always change the
    /// bitmap, so then there are none).
    pub(super) fn make_durable(&self, snap: &Snapshot) -> Result<Option<Lsn>> {
        if snap.data_dirty {
            self.image.sync_data().map_err(|e| self.poison(e.into()))?;
        }
        let Some(rec) = &snap.record else {
            return Ok(None);
        };
        let lsn = self
            .journal
            .append(rec)
            .map_err(|e| self.poison(e.into()))?;
        self.journal
            .commit(lsn)
            .map_err(|e| self.poison(e.into()))?;
        Ok(Some(lsn))
    }

    /// Blocks freed by transactions that are now durable become reusable.
    pub(super) fn release_frees(&self) {
        let durable = self.journal.durable_lsn();
        let mut st = self.state.lock();
        let mut keep = Vec::new();
        for (lsn, blocks) in std::mem::take(&mut st.awaiting) {
            if lsn < durable {
                for b in blocks {
                    st.unavailable.remove(&b);
                }
            } else {
                keep.push((lsn, blocks));
            }
        }
        st.awaiting = keep;
    }

    /// Commits, writes every metadata block changed since the last
    /// checkpoint home, and moves the journal's tail past it all (the
    /// journal flushes the image first). Holds the state lock from its
    /// commit through the home writes, so what goes home is exactly the
    /// committed state.
    pub fn checkpoint(&self) -> Result<()> {
        self.check()?;
        let mut c = self.committer.lock();
        while c.committing {
            c = self.commit_done.wait(c);
        }
        // Holding the committer lock: no commit starts until we are done.
        let mut st = self.state.lock();
        let snap = st.take(c.next_tid);
        c.next_tid += 1;
        self.make_durable(&snap)?;
        c.durable = c.durable.max(snap.ops);
        // Everything appended is durable now: every free may be reused.
        for (_, blocks) in std::mem::take(&mut st.awaiting) {
            for b in blocks {
                st.unavailable.remove(&b);
            }
        }
        for b in snap.frees {
            st.unavailable.remove(&b);
        }
        for b in std::mem::take(&mut st.checkpoint_set) {
            let img = &st.cache[&b];
            self.image
                .write_at(img, b as u64 * BLOCK as u64)
                .map_err(|e| self.poison(e.into()))?;
        }
        let redo = self.journal.appended_lsn();
        drop(st);
        self.journal
            .checkpoint(redo)
            .map_err(|e| self.poison(e.into()))?;
        c.since_checkpoint = 0;
        self.commit_done.notify_all();
        Ok(())
    }

    /// Checkpoints and closes the journal.
    pub fn unmount(self) -> Result<()> {
        self.close()
    }

    /// [`Fs::unmount`] through a shared reference: checkpoints and closes
    /// the journal; later operations fail.
    pub fn close(&self) -> Result<()> {
        self.checkpoint()?;
        self.journal.close()?;
        Ok(())
    }
}
