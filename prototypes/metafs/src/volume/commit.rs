//! Durability: fsync, sync, commits (records appended in order, forced
//! concurrently by the journal's group commit), frees held until durable,
//! checkpoints and unmount.

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
    /// returned before the call is durable.
    ///
    /// Appending is sequenced and forcing is not, as XFS does it: under
    /// the committer lock a caller takes the running transaction, syncs
    /// the image's data if any was written (ordered mode: before the
    /// record that points to it is in the log), and appends the record;
    /// then, with no lock held, it waits for the journal to make that LSN
    /// durable. Callers that arrive meanwhile append their own records
    /// behind it (or find theirs already appended and just wait for it),
    /// and the journal's group commit makes them all durable in shared log
    /// writes — so concurrent fsyncs share device flushes, as they share
    /// jbd2's commits.
    pub fn sync(&self) -> Result<()> {
        self.check()?;
        let want = self.state.lock().ops;
        let mut c = self.committer.lock();
        if c.durable >= want {
            drop(c);
            return self.after_commit();
        }
        // Appended already (by another caller's commit)? Else append.
        let (lsn, ops) = match c.appended {
            Some((lsn, ops)) if ops >= want => (lsn, ops),
            _ => {
                let tid = c.next_tid;
                c.next_tid += 1;
                let snap = self.state.lock().take(tid);
                let lsn = self.append(&snap)?;
                if let Some(rec) = &snap.record {
                    c.since_checkpoint += rec.len() as u64;
                }
                // Nothing to log (only data was written): what is owed is
                // the log as far as it was appended.
                let lsn = lsn.or(c.appended.map(|a| a.0));
                if let Some(l) = lsn {
                    c.appended = Some((l, snap.ops));
                    if !snap.frees.is_empty() {
                        self.state.lock().awaiting.push((l, snap.frees));
                    }
                }
                match lsn {
                    Some(l) => (l, snap.ops),
                    None => {
                        c.durable = c.durable.max(snap.ops);
                        drop(c);
                        return self.after_commit();
                    }
                }
            }
        };
        drop(c);
        self.journal
            .commit(lsn)
            .map_err(|e| self.poison(e.into()))?;
        let mut c = self.committer.lock();
        c.durable = c.durable.max(ops);
        drop(c);
        self.after_commit()
    }

    /// After a commit: frees whose records are durable become reusable,
    /// and a checkpoint runs when enough log was written.
    fn after_commit(&self) -> Result<()> {
        self.release_frees();
        let due = self.committer.lock().since_checkpoint >= self.options.checkpoint_log_bytes;
        if due {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// A taken transaction into the log (the caller holds the committer
    /// lock): the image's data synced first if any was written (ordered
    /// mode), then its record appended. Returns the record's LSN (none
    /// when no metadata changed; frees always change the bitmap, so then
    /// there are none).
    pub(super) fn append(&self, snap: &Snapshot) -> Result<Option<Lsn>> {
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
        // Holding the committer lock: nothing is appended until we are
        // done; commits of records appended before may still be waiting
        // for the journal, and ours covers them.
        let mut st = self.state.lock();
        let snap = st.take(c.next_tid);
        c.next_tid += 1;
        if let Some(lsn) = self.append(&snap)?.or(c.appended.map(|a| a.0)) {
            self.journal
                .commit(lsn)
                .map_err(|e| self.poison(e.into()))?;
            c.appended = Some((lsn, snap.ops));
        }
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
