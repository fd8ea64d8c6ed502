//! Page versions kept for open snapshots: in memory up to a bound, then
//! spilled to a scratch file, so a long iterator beside writers (a full
//! scan, a Raft snapshot being built) keeps its snapshot in bounded
//! memory instead of expiring (WiredTiger's history store plays this
//! part; PostgreSQL and InnoDB keep old versions in the heap and the undo
//! log).
//!
//! - A writer replacing a page that an open snapshot still reads hands
//!   the old version here ([`Versions::stash`]); version `i` of a page is
//!   read by the snapshots in [its LSN, the next version's LSN), and is
//!   dropped as soon as none is open there ([`Versions::prune`]). A
//!   snapshot can be the last reader only of versions kept while it was
//!   open — one kept before it opened was replaced by a change it sees —
//!   so its close looks at those alone: a 100-key scan beside a long one
//!   does not walk the thousands of versions the long one keeps.
//! - Versions in memory take their room from the cache: the pool holds
//!   that many frames fewer ([`Pool::capacity`]).
//! - Past the in-memory bound (a quarter of the cache), the versions are
//!   written to `snapshots.spill` in the store directory, a page per slot,
//!   sealed with their CRC, and only `(LSN, slot)` stays in memory (a few
//!   bytes instead of a page). A spilled version read back is checked
//!   (CRC, page number, LSN) like any page from disk. Freed slots are
//!   reused; the file is cut back to nothing once no version is spilled.
//! - Past the spill bound ([`crate::Options::snapshot_spill_bytes`]), or
//!   when the spill file cannot be written, the oldest snapshots expire
//!   instead ([`crate::Error::SnapshotTooOld`]): the store itself is never
//!   affected.
//!
//! The spill file is scratch: never synced, removed when the store opens
//! and closes, and not part of the format.

use super::*;
use journal_core::vfs::{OpenOptions, Vfs};
use std::path::PathBuf;

/// The scratch file spilled versions go to, in the store directory.
pub const SPILL_FILE: &str = "snapshots.spill";

/// A kept version of a page (its LSN is in the key it is kept under).
enum Kept {
    Mem(Arc<Page>),
    Spilled(u64),
}

/// The version a snapshot reads, as found under the pool's mutex.
pub(super) enum Picked {
    Page(Arc<Page>),
    Spilled { lsn: Lsn, slot: u64 },
}

/// An open snapshot's "expired" flag, and how many versions had been
/// kept when it opened.
type Open = (Arc<AtomicBool>, u64);

/// Open snapshots and the page versions they still need.
#[derive(Default)]
pub(super) struct Versions {
    /// Open snapshots by (LSN, id).
    open: BTreeMap<(Lsn, u64), Open>,
    next_id: u64,
    /// Replaced versions of pages by (page, pageLSN): a page's versions
    /// are adjacent, oldest first. One ordered map rather than a list per
    /// page: a full scan beside writers keeps a version of hundreds of
    /// thousands of pages, and a list each cost over 100 bytes a page
    /// (measured with heaptrack: 27 MiB at the peak of a 10 M-key scan).
    pages: BTreeMap<(PageNo, Lsn), Kept>,
    /// Versions kept so far, and each version's key in the order kept
    /// (its number in that order first). A snapshot can be the last
    /// reader only of versions kept while it was open (one kept before
    /// it opened was replaced by a change it sees), so its close looks at
    /// those alone, not at every version a long snapshot keeps. Entries
    /// of versions gone since are skipped, and dropped once at the front
    /// or once they outnumber the versions.
    kept: u64,
    order: VecDeque<(u64, PageNo, Lsn)>,
    /// Bytes of the versions in memory.
    pub(super) bytes: usize,
    /// Slots holding a version.
    pub(super) spilled: u64,
    /// Slots below `next_slot` holding none.
    free_slots: Vec<u64>,
    /// Slots the spill file holds.
    next_slot: u64,
    /// Someone is writing (or cutting back) the spill file.
    spilling: bool,
}

impl Versions {
    /// Keeps `old`, the version of page `no` a writer replaces, if an open
    /// snapshot may read it and it is not kept already (a transaction
    /// rolled back and run again replaces the same version again; a
    /// pageLSN names one version of a page).
    pub(super) fn stash(&mut self, no: PageNo, old: &Arc<Page>) {
        let wanted = self
            .open
            .keys()
            .next_back()
            .is_some_and(|(s, _)| *s >= old.lsn());
        if !wanted || old.lsn() == PENDING {
            return;
        }
        if let std::collections::btree_map::Entry::Vacant(e) = self.pages.entry((no, old.lsn())) {
            e.insert(Kept::Mem(old.clone()));
            self.bytes += FRAME_BYTES;
            self.kept += 1;
            self.order.push_back((self.kept, no, old.lsn()));
        }
    }

    /// The version of page `no` a snapshot at `s` reads, given the page as
    /// it stands.
    pub(super) fn pick(&self, page: &Arc<Page>, no: PageNo, s: Lsn) -> Result<Picked> {
        if page.lsn() <= s {
            return Ok(Picked::Page(page.clone()));
        }
        match self.pages.range((no, Lsn(0))..=(no, s)).next_back() {
            Some((_, Kept::Mem(p))) => Ok(Picked::Page(p.clone())),
            Some(((_, lsn), Kept::Spilled(slot))) => Ok(Picked::Spilled {
                lsn: *lsn,
                slot: *slot,
            }),
            None => Err(Error::SnapshotTooOld),
        }
    }

    /// Drops the versions no open snapshot reads any more, among those
    /// kept after the `from`-th (those a snapshot that opened then could
    /// have been the last reader of): version `i` of a page is read by
    /// the snapshots in [its LSN, the next version's LSN). Their slots are
    /// freed; the pages held in memory are returned, for the pool to take
    /// their buffers back once its mutex is released.
    #[must_use]
    fn prune(&mut self, from: u64) -> Vec<Arc<Page>> {
        let start = self.order.partition_point(|(n, _, _)| *n <= from);
        let mut gone = Vec::new();
        for &(_, no, lsn) in self.order.range(start..) {
            if !self.pages.contains_key(&(no, lsn)) {
                continue;
            }
            let next = self
                .pages
                .range((no, Lsn(lsn.0.saturating_add(1)))..=(no, Lsn(u64::MAX)))
                .next()
                .map(|((_, l), _)| *l);
            let read = match next {
                Some(next) => self.open.range((lsn, 0)..(next, 0)).next().is_some(),
                None => self.open.range((lsn, 0)..).next().is_some(),
            };
            if !read {
                gone.push((no, lsn));
            }
        }
        let mut dropped = Vec::new();
        for key in gone {
            match self.pages.remove(&key) {
                Some(Kept::Mem(p)) => {
                    self.bytes -= FRAME_BYTES;
                    dropped.push(p);
                }
                Some(Kept::Spilled(slot)) => {
                    self.spilled -= 1;
                    self.free_slots.push(slot);
                }
                None => {}
            }
        }
        let pages = &self.pages;
        while let Some(&(_, no, lsn)) = self.order.front() {
            if pages.contains_key(&(no, lsn)) {
                break;
            }
            self.order.pop_front();
        }
        if self.order.len() > 2 * pages.len() + 1024 {
            self.order
                .retain(|(_, no, lsn)| pages.contains_key(&(*no, *lsn)));
        }
        dropped
    }

    /// Expires the oldest snapshot, adding the pages it alone read to
    /// `freed`; `false` if none is open.
    fn expire_oldest(&mut self, freed: &mut Vec<Arc<Page>>) -> bool {
        let Some((_, (flag, from))) = self.open.pop_first() else {
            return false;
        };
        flag.store(true, Ordering::Release);
        freed.extend(self.prune(from));
        true
    }

    /// Takes a slot in the spill file.
    fn take_slot(&mut self) -> u64 {
        self.free_slots.pop().unwrap_or_else(|| {
            self.next_slot += 1;
            self.next_slot - 1
        })
    }

    /// Puts spilled copies in place of the versions written out, if they
    /// are still kept; frees the slots of those that went meanwhile.
    fn settle(&mut self, written: &[(PageNo, Arc<Page>, u64)]) {
        for (no, page, slot) in written {
            match self.pages.get_mut(&(*no, page.lsn())) {
                Some(k) if matches!(&*k, Kept::Mem(p) if Arc::ptr_eq(p, page)) => {
                    *k = Kept::Spilled(*slot);
                    self.bytes -= FRAME_BYTES;
                    self.spilled += 1;
                }
                _ => self.free_slots.push(*slot),
            }
        }
    }
}

/// Where versions are spilled.
pub(crate) struct Spill {
    vfs: Arc<dyn Vfs>,
    path: PathBuf,
    /// Slots the file may hold (0: no spilling).
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
            limit: limit_bytes / PAGE_SIZE as u64,
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
        batch: &[(PageNo, Arc<Page>, u64)],
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
            f.write_at(&buf[..], slot * PAGE_SIZE as u64)?;
        }
        Ok(())
    }
}

/// A snapshot's registration: dropping it lets its versions go.
pub(crate) struct SnapshotHandle {
    key: (Lsn, u64),
    expired: Arc<AtomicBool>,
}

impl SnapshotHandle {
    /// The snapshot's LSN: it reads every page as of it.
    pub(crate) fn lsn(&self) -> Lsn {
        self.key.0
    }

    /// Whether the snapshot expired ([`crate::Error::SnapshotTooOld`]).
    pub(crate) fn expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }
}

impl Pool {
    /// Page `no` as snapshot `snap` reads it.
    pub(crate) fn fetch_at(
        &self,
        no: PageNo,
        snap: &SnapshotHandle,
        journal: &Journal,
    ) -> Result<Arc<Page>> {
        if snap.expired.load(Ordering::Acquire) {
            return Err(Error::SnapshotTooOld);
        }
        match self.fetch_inner(no, Some(snap.lsn()), journal)? {
            Picked::Page(p) => Ok(p),
            Picked::Spilled { lsn, slot } => self.read_spilled(no, lsn, slot, snap),
        }
    }

    /// Reads a spilled version back, checked like a page from disk. Its
    /// slot is not reused while the snapshot is open; if the snapshot
    /// expired meanwhile, what was read is not trusted.
    fn read_spilled(
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

    /// Keeps the current version of page `no` for the open snapshots,
    /// before a writer replaces it without having read it: a page taken
    /// off the free list or made a free-list trunk, whose old contents (a
    /// freed value's overflow page) a snapshot older than the free may
    /// still read. From the pool if it holds the page — kept now, since
    /// the frame may be evicted before the writer's copy replaces it —
    /// else from the disk (current for a page the pool does not hold or
    /// is still loading). Only while a snapshot is open. A page that does
    /// not validate on disk was never written home as part of a tree, so
    /// no snapshot reads it. The caller holds the tree lock, so no
    /// snapshot opens meanwhile; a version kept twice is kept once.
    pub(crate) fn keep_for_snapshots(&self, no: PageNo) {
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            if st.versions.open.is_empty() {
                return;
            }
            if let Some(Slot::Ready(f)) = st.frames.get(&no) {
                let page = f.page.clone();
                st.versions.stash(no, &page);
                self.publish(st);
                return;
            }
        }
        let Ok(page) = self.read_disk(no) else {
            return;
        };
        let mut st = self.state.lock();
        st.versions.stash(no, &Arc::new(page));
        self.publish(&st);
    }

    /// Opens a snapshot at `lsn` (the caller holds the tree lock shared,
    /// so no transaction is half applied).
    pub(crate) fn open_snapshot(&self, lsn: Lsn) -> SnapshotHandle {
        let mut st = self.state.lock();
        let v = &mut st.versions;
        let id = v.next_id;
        v.next_id += 1;
        let expired = Arc::new(AtomicBool::new(false));
        v.open.insert((lsn, id), (expired.clone(), v.kept));
        SnapshotHandle {
            key: (lsn, id),
            expired,
        }
    }

    /// Closes a snapshot: the versions only it read go; the spill file is
    /// cut back once it holds none.
    pub(crate) fn close_snapshot(&self, h: &SnapshotHandle) {
        let mut st = self.state.lock();
        let Some((_, from)) = st.versions.open.remove(&h.key) else {
            return;
        };
        let freed = st.versions.prune(from);
        self.publish(&st);
        let v = &mut st.versions;
        let cut_back = v.spilled == 0 && v.next_slot > 0 && !v.spilling;
        if cut_back {
            v.spilling = true;
            v.next_slot = 0;
            v.free_slots.clear();
        }
        drop(st);
        // (Their buffers go back to the spare list, outside the lock.)
        drop(freed);
        if cut_back {
            if let Some(f) = self.spill.file.lock().as_ref() {
                // Scratch space: a failure only leaves the file longer.
                let _ = f.set_len(0);
            }
            self.state.lock().versions.spilling = false;
        }
    }

    /// Keeps the versions in memory within their bound: spills the excess
    /// to the spill file, or, past the spill bound or on a spill error,
    /// expires the oldest snapshots. Returns how many expired.
    pub(crate) fn bound_versions(&self) -> usize {
        if self.versions_n.load(Ordering::Relaxed) <= self.version_limit {
            return 0;
        }
        let mut st = self.state.lock();
        let v = &mut st.versions;
        if v.spilling || v.bytes <= self.version_limit {
            return 0;
        }
        // Down to half the bound, so spills come in batches.
        let want = ((v.bytes - self.version_limit / 2) / FRAME_BYTES) as u64;
        let (mut expired, mut freed) = (0, Vec::new());
        if v.spilled + want > self.spill.limit {
            while v.bytes > self.version_limit && v.expire_oldest(&mut freed) {
                expired += 1;
            }
            self.publish(&st);
            drop(st);
            drop(freed);
            return expired;
        }
        let truncate = v.spilled == 0 && v.next_slot > 0;
        if truncate {
            v.next_slot = 0;
            v.free_slots.clear();
        }
        let mut batch = Vec::new();
        let candidates: Vec<(PageNo, Arc<Page>)> = v
            .pages
            .iter()
            .filter_map(|((no, _), k)| match k {
                Kept::Mem(p) => Some((*no, p.clone())),
                Kept::Spilled(_) => None,
            })
            .take(want as usize)
            .collect();
        for (no, page) in candidates {
            let slot = v.take_slot();
            batch.push((no, page, slot));
        }
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
                while v.bytes > self.version_limit && v.expire_oldest(&mut freed) {
                    expired += 1;
                }
            }
        }
        self.publish(&st);
        drop(st);
        drop(freed);
        drop(batch);
        expired
    }

    /// Removes the spill file (the store is closing).
    pub(crate) fn remove_spill(&self) -> Result<()> {
        self.spill.remove()
    }

    /// Bytes of page versions kept in memory for snapshots.
    pub(crate) fn version_bytes(&self) -> usize {
        self.versions_n.load(Ordering::Relaxed)
    }

    /// Bytes of page versions spilled to the spill file.
    pub(crate) fn spilled_bytes(&self) -> u64 {
        self.spilled_n.load(Ordering::Relaxed) as u64 * PAGE_SIZE as u64
    }
}
