//! Recycling segments wholly below the checkpoint: renamed to future
//! numbers, their names made durable in one directory fsync per batch.

use super::*;

/// What a recycle pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecycleReport {
    /// `(old number, new number)` of each recycled segment.
    pub recycled: Vec<(u64, u64)>,
    /// Old segments removed.
    pub removed: Vec<u64>,
}

impl SegmentStore {
    /// Recycles every segment wholly below `redo_segment` (the segment
    /// holding the redo position): renamed to future numbers with their
    /// header rewritten, up to `max_segments` files in all; the rest are
    /// removed. Then makes the names durable as the policy says.
    ///
    /// Under [`RecyclePolicy::Batched`] the renamed segments are installed
    /// and usable before the one directory fsync of the batch: the failpoint
    /// [`FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC`] sits in that window (the crash
    /// window of the durability frontier), for tests to write and crash in.
    pub fn recycle(&self, redo_segment: u64) -> Result<RecycleReport, Error> {
        let pending = self.recycle_begin(redo_segment)?;
        fail::fail_point!(FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC, |_| {
            Err(Error::Io {
                segment: None,
                source: journal_vfs::VfsError::new(
                    journal_vfs::Op::SyncDir,
                    &self.inner.dir,
                    std::io::Error::other("failpoint"),
                ),
            })
        });
        pending.finish()
    }

    /// The first half of [`SegmentStore::recycle`]: renames (and removals)
    /// done, recycled segments installed and usable, but under
    /// [`RecyclePolicy::Batched`] their names are not durable until
    /// [`PendingRecycle::finish`] fsyncs the directory.
    fn recycle_begin(&self, redo_segment: u64) -> Result<PendingRecycle, Error> {
        let cfg = self.inner.config;
        let mut st = self.inner.state.lock();
        while st.recycling {
            st = self.inner.cv.wait(st);
        }
        let redo = redo_segment.min(st.head);
        st.retired_below = st.retired_below.max(redo);
        let old: Vec<(u64, File)> = st
            .segs
            .range(..redo)
            .map(|(&n, s)| (n, s.file.clone()))
            .collect();
        for (n, _) in &old {
            st.segs.remove(n);
        }
        let kept = st.segs.len() as u64 + st.creating.len() as u64;
        let room = cfg.max_segments.saturating_sub(kept) as usize;
        let mut targets = Vec::new();
        for _ in 0..old.len().min(room) {
            let t = st.next_free_number();
            st.creating.insert(t);
            targets.push(t);
        }
        st.recycling = true;
        self.inner.stats.checkpoints.incr();
        drop(st);

        let mut pending = PendingRecycle {
            store: self.clone(),
            report: RecycleReport::default(),
            unsynced: Vec::new(),
            done: false,
        };
        let mut result = Ok(());
        for (i, (n, file)) in old.into_iter().enumerate() {
            if result.is_err() {
                break;
            }
            result = match targets.get(i) {
                Some(&t) => self.recycle_one(n, file, t, &mut pending),
                None => self.remove_one(n, &mut pending),
            };
        }
        // Release reservations that were not installed.
        let mut st = self.inner.state.lock();
        for t in &targets {
            st.creating.remove(t);
        }
        drop(st);
        self.inner.cv.notify_all();
        result.map(|_| pending)
    }

    fn recycle_one(
        &self,
        old: u64,
        old_file: File,
        new: u64,
        pending: &mut PendingRecycle,
    ) -> Result<(), Error> {
        let vfs = &self.inner.vfs;
        let cfg = &self.inner.config;
        let per_segment = cfg.recycle_policy == RecyclePolicy::PerSegmentDurableRename;
        let (from, to) = (self.path(old), self.path(new));
        if per_segment {
            old_file.sync_all().map_err(Error::io(Some(old)))?;
        }
        drop(old_file);
        vfs.rename(&from, &to).map_err(Error::io(Some(old)))?;
        let file: File = vfs
            .open(&to, OpenOptions::write())
            .map_err(Error::io(Some(new)))?
            .into();
        let header = SegmentHeader::new(new, cfg.segment_size, self.inner.journal_id);
        file.write_at(&header.to_bytes(), 0)
            .map_err(Error::io(Some(new)))?;
        if per_segment {
            file.sync_all().map_err(Error::io(Some(new)))?;
            vfs.sync_dir(&self.inner.dir)
                .map_err(Error::io(Some(new)))?;
        } else {
            // No fdatasync for the header: if it is lost, open finds a
            // number other than the name's and rewrites it; the records
            // written into the segment later carry their own LSNs, which is
            // what recovery trusts. The first fdatasync of a log write into
            // the segment makes the header durable along the way.
            pending.unsynced.push(new);
        }
        let mut st = self.inner.state.lock();
        st.creating.remove(&new);
        st.segs.insert(
            new,
            Seg {
                file,
                name_durable: per_segment,
            },
        );
        drop(st);
        self.inner.cv.notify_all();
        self.inner.stats.recycled.incr();
        pending.report.recycled.push((old, new));
        Ok(())
    }

    fn remove_one(&self, old: u64, pending: &mut PendingRecycle) -> Result<(), Error> {
        self.inner
            .vfs
            .remove_file(&self.path(old))
            .map_err(Error::io(Some(old)))?;
        self.inner.stats.removed.incr();
        pending.report.removed.push(old);
        Ok(())
    }

    fn end_recycle(&self, durable: &[u64]) {
        let mut st: MutexGuard<'_, State> = self.inner.state.lock();
        for n in durable {
            if let Some(s) = st.segs.get_mut(n) {
                s.name_durable = true;
            }
        }
        st.recycling = false;
        drop(st);
        self.inner.cv.notify_all();
    }
}

/// The failpoint between the renames of a recycle batch and its directory
/// fsync (crate feature `failpoints`). Configured with
/// `fail::cfg_callback`, it runs the test's code in the crash window; with
/// `fail::cfg(.., "return")`, the recycle fails there as if the directory
/// fsync had.
pub const FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC: &str = "segment-recycler::recycle-before-dir-fsync";

/// A recycle whose renames are done but whose directory fsync is not
/// (under [`RecyclePolicy::Batched`]). Dropping it without
/// [`PendingRecycle::finish`] leaves the names to the write-path check.
#[derive(Debug)]
struct PendingRecycle {
    store: SegmentStore,
    report: RecycleReport,
    unsynced: Vec<u64>,
    done: bool,
}

impl PendingRecycle {
    /// One directory fsync for the whole batch (and the removals), then the
    /// durability frontier advances over the recycled segments.
    fn finish(mut self) -> Result<RecycleReport, Error> {
        let s = &self.store;
        let needs_sync = !self.unsynced.is_empty() || !self.report.removed.is_empty();
        let result = if needs_sync {
            s.inner.vfs.sync_dir(&s.inner.dir).map_err(Error::io(None))
        } else {
            Ok(())
        };
        self.done = true;
        match result {
            Ok(()) => {
                s.end_recycle(&self.unsynced);
                Ok(std::mem::take(&mut self.report))
            }
            Err(e) => {
                s.end_recycle(&[]);
                Err(e)
            }
        }
    }
}

impl Drop for PendingRecycle {
    fn drop(&mut self) {
        if !self.done {
            self.store.end_recycle(&[]);
        }
    }
}
