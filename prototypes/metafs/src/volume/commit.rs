//! Durability: fsync, sync, commits one at a time (jbd2's commit
//! thread), frees held until durable, checkpoints and unmount.

use super::*;

impl Fs {
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
        let snap = self.state.lock().take(tid).map_err(|e| self.poison(e))?;
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

    /// [`Fs::with`] for an operation that checks its space before it
    /// changes anything (a write, a step of `fallocate`): refused for want
    /// of space while blocks freed by recent transactions wait to become
    /// reusable (a free is reusable once durable), it is tried once more
    /// after a commit — and if that leaves frees held, a checkpoint — has
    /// released them. ext4 does the same: an allocation that fails while
    /// jbd2 holds freed blocks forces a commit and retries
    /// (`ext4_should_retry_alloc`). Without it, a file deleted and its
    /// space taken again at once (xfstests's generic/213) is refused space
    /// that `statfs` counts free.
    pub(super) fn with_space<T>(
        &self,
        mut op: impl FnMut(&mut State, &dyn VfsFile) -> Result<T>,
    ) -> Result<T> {
        match self.with(&mut op) {
            Err(Error::NoSpace) if self.frees_held() => {
                self.sync()?;
                if self.frees_held() {
                    self.checkpoint()?;
                }
                self.with(op)
            }
            r => r,
        }
    }

    fn frees_held(&self) -> bool {
        !self.state.lock().unavailable.is_empty()
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
        let snap = st.take(c.next_tid).map_err(|e| self.poison(e))?;
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
            // (The checkpoint set's blocks never leave the cache.)
            let img = st
                .cache
                .peek(b)
                .ok_or_else(|| self.poison(super::state::lost(b)))?;
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
