//! The spill file versions past the in-memory bound go to, and the
//! bound itself ([`Pool::bound_versions`]): what is spilled, and when the
//! oldest snapshots expire instead.

use super::*;
use journal_core::vfs::{OpenOptions, Vfs};
use std::path::PathBuf;

/// Where versions are spilled.
pub(crate) struct Spill {
    vfs: Arc<dyn Vfs>,
    path: PathBuf,
    /// Slots the file may hold (0: no spilling; at most 2^31 - 1).
    limit: u64,
    file: Mutex<Option<Box<dyn VfsFile>>>,
}

impl Spill {
    /// Spilling to `path` on `vfs`, up to `limit_bytes` (0: never; the
    /// oldest snapshot expires instead).
    pub(crate) fn new(vfs: Arc<dyn Vfs>, path: PathBuf, limit_bytes: u64) -> Spill {
        Spill {
            vfs,
            path,
            limit: (limit_bytes / PAGE_SIZE as u64).min(u64::from(MEM - 1)),
            file: Mutex::new(None),
        }
    }

    /// Removes the file (at open, a crashed run's; at close, ours).
    pub(crate) fn remove(&self) -> Result<()> {
        *self.file.lock() = None;
        if self.vfs.exists(&self.path)? {
            self.vfs.remove_file(&self.path)?;
        }
        Ok(())
    }

    /// Writes `batch` to its slots, cutting the file back to nothing
    /// first if `truncate`.
    fn write(
        &self,
        batch: &[(PageNo, Arc<Page>, u32)],
        truncate: bool,
        buf: &mut [u8; PAGE_SIZE],
    ) -> Result<()> {
        let mut file = self.file.lock();
        if file.is_none() {
            *file = Some(self.vfs.open(&self.path, OpenOptions::create())?);
        }
        let Some(f) = file.as_ref() else {
            return Ok(());
        };
        if truncate {
            f.set_len(0)?;
        }
        for (_, page, slot) in batch {
            page.seal_into(buf);
            f.write_at(&buf[..], u64::from(*slot) * PAGE_SIZE as u64)?;
        }
        Ok(())
    }
}

impl Pool {
    /// Reads a spilled version back, checked like a page from disk. Its
    /// slot is not reused while the snapshot is open; if the snapshot
    /// expired meanwhile, what was read is not trusted.
    pub(super) fn read_spilled(
        &self,
        no: PageNo,
        lsn: Lsn,
        slot: u64,
        snap: &SnapshotHandle,
    ) -> Result<Arc<Page>> {
        let mut buf = self.buffer();
        {
            let file = self.spill.file.lock();
            let Some(f) = file.as_ref() else {
                return Err(Error::SnapshotTooOld);
            };
            f.read_exact_at(&mut buf[..], slot * PAGE_SIZE as u64)?;
        }
        if snap.expired.load(Ordering::Acquire) {
            self.spare.give(buf);
            return Err(Error::SnapshotTooOld);
        }
        let bad = Error::Corrupt {
            page: no,
            reason: "a spilled page version failed its check",
        };
        match Page::from_disk(buf, no) {
            Ok(p) if p.lsn() == lsn => Ok(Arc::new(self.adopt(p))),
            _ => Err(bad),
        }
    }

    /// Cuts the spill file back to nothing, after
    /// [`Versions::start_cut_back`].
    fn cut_back(&self) {
        if let Some(f) = self.spill.file.lock().as_ref() {
            // Scratch space: a failure only leaves the file longer.
            let _ = f.set_len(0);
        }
        self.state.lock().versions.spilling = false;
    }

    /// Ends a change of the versions under the mutex: the spill file is
    /// cut back if no version is left in it, the counters published, and
    /// the pages of the versions dropped given back outside the mutex.
    pub(super) fn settled(&self, mut st: MutexGuard<'_, State>, freed: Vec<Arc<Page>>) {
        let cut_back = st.versions.start_cut_back();
        self.publish(&st);
        drop(st);
        drop(freed);
        if cut_back {
            self.cut_back();
        }
    }

    /// Keeps the versions' bytes within their bound. Their bookkeeping
    /// stays in memory whatever is spilled: past the bound on its own,
    /// the oldest snapshots expire until it holds three quarters of it
    /// (so expiries come in batches). Then the versions in memory are
    /// spilled to the spill file, down to half the bound (so spills come
    /// in batches), or, past the spill bound or on a spill error, the
    /// oldest snapshots expire until all is within the bound. Returns how
    /// many expired.
    pub(crate) fn bound_versions(&self) -> usize {
        if self.versions_n.load(Ordering::Relaxed) <= self.version_limit {
            return 0;
        }
        let mut st = self.state.lock();
        let v = &mut st.versions;
        if v.spilling || v.bytes <= self.version_limit {
            return 0;
        }
        let (mut expired, mut freed) = (0, Vec::new());
        if v.bytes - v.mem.len() * FRAME_BYTES > self.version_limit {
            expired += v.expire_to(self.version_limit / 4 * 3, &mut freed, true);
        }
        let want = v
            .bytes
            .saturating_sub(self.version_limit / 2)
            .div_ceil(FRAME_BYTES)
            .min(v.mem.len());
        if v.bytes <= self.version_limit || want == 0 {
            self.settled(st, freed);
            return expired;
        }
        if v.spilled + want as u64 > self.spill.limit {
            expired += v.expire_to(self.version_limit, &mut freed, false);
            self.settled(st, freed);
            return expired;
        }
        let truncate = v.spilled == 0 && v.next_slot > 0;
        if truncate {
            v.next_slot = 0;
            v.free_slots.clear();
        }
        let batch: Vec<(PageNo, Arc<Page>, u32)> = (0..want)
            .filter_map(|i| v.mem.get(i).map(|(key, p)| (key.no, p.clone())))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(no, page)| (no, page, v.take_slot()))
            .collect();
        v.spilling = true;
        drop(st);
        let mut buf = self.buffer();
        let wrote = self.spill.write(&batch, truncate, &mut buf);
        self.spare.give(buf);
        let mut st = self.state.lock();
        let v = &mut st.versions;
        v.spilling = false;
        match wrote {
            Ok(()) => v.settle(&batch),
            Err(_) => {
                v.free_slots.extend(batch.iter().map(|(_, _, slot)| *slot));
                expired += v.expire_to(self.version_limit, &mut freed, false);
            }
        }
        self.settled(st, freed);
        drop(batch);
        expired
    }

    /// Removes the spill file (the store is closing).
    pub(crate) fn remove_spill(&self) -> Result<()> {
        self.spill.remove()
    }

    /// Bytes of page versions spilled to the spill file.
    pub(crate) fn spilled_bytes(&self) -> u64 {
        self.spilled_n.load(Ordering::Relaxed) as u64 * PAGE_SIZE as u64
    }
}
