//! The buffer pool: the data file's pages in memory, bounded by a number
//! of frames, read on demand and evicted by clock (second chance).
//!
//! - **Steal**: a dirty page may be written home and evicted at any time
//!   between checkpoints, once the log is durable up to its pageLSN
//!   (write-ahead); only the pages a transaction is changing are pinned
//!   until its record is appended.
//! - **Copy-on-write**: a frame holds an `Arc<Page>`; a writer never
//!   changes a page a reader holds, it installs a new copy. A reader keeps
//!   the `Arc`s it needs, not frames, so an open iterator cannot pin the
//!   pool full.
//! - **Versions for snapshots**: while a snapshot is open, the version a
//!   writer replaces is kept so the snapshot still reads the tree as it
//!   was: in memory up to a bound, then in a scratch file (`versions.rs`).
//! - **I/O in progress**: a page being read is a `Loading` slot that
//!   others wait on, and a page being written stays in its frame, so no
//!   one ever reads a stale copy from disk.

use crate::page::{Invalid, Kind, Page, PageNo, Spare, PAGE_SIZE};
use crate::{Error, Result};
use journal_core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use journal_core::sync::{Condvar, Mutex, MutexGuard};
use journal_core::vfs::VfsFile;
use journal_core::{ForceMode, Journal, Lsn};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

mod cleaning;
mod doublewrite;
mod versions;
pub use doublewrite::DOUBLEWRITE_FILE;
pub(crate) use doublewrite::{read_page, restore, DoubleWrite, Restored};
use versions::{Picked, Versions};
pub(crate) use versions::{SnapshotHandle, Spill, SPILL_FILE};

/// The pageLSN of a page changed by a transaction whose record is not yet
/// appended: above every snapshot, so none reads it.
pub(crate) const PENDING: Lsn = Lsn(u64::MAX);

/// Page buffers kept for reuse at least (4 MiB), whatever the room in
/// the frames.
const SPARE_BUFFERS: usize = 1024;

/// Bytes a frame costs: the page and its bookkeeping.
pub(crate) const FRAME_BYTES: usize = PAGE_SIZE + 128;

struct Frame {
    page: Arc<Page>,
    dirty: bool,
    referenced: bool,
    /// Changed by the transaction in progress: not written, not evicted.
    pinned: bool,
    /// Being written home.
    writing: bool,
    /// On the clock. A pinned frame leaves it when the clock reaches it
    /// and comes back when unpinned, so a transaction pinning many pages
    /// (a large value's chain) does not make every eviction pass over
    /// them.
    in_clock: bool,
    /// The checkpoint epoch of the last full image logged of this page.
    image_epoch: u64,
}

enum Slot {
    Loading,
    Ready(Frame),
}

/// The pool's state, under its mutex.
pub(crate) struct State {
    frames: HashMap<PageNo, Slot>,
    clock: VecDeque<PageNo>,
    /// Entries ever taken off the clock's front (the only place entries
    /// leave it; they join at the back): `popped + i` names entry `i` for
    /// good, so the cleaner's cursor survives the hand moving.
    popped: u64,
    dirty: usize,
    versions: Versions,
}

/// The buffer pool of one data file.
pub(crate) struct Pool {
    data: Box<dyn VfsFile>,
    capacity: usize,
    version_limit: usize,
    state: Mutex<State>,
    /// Threads wait here for a change under `state`'s mutex (a page read
    /// in, a write finished, a page unpinned); whoever changes it notifies
    /// (no system call when nobody waits: `journal_sync::Condvar`).
    cond: Condvar,
    /// Page buffers let go, reused for the next copy or read: every page
    /// the pool holds gives its buffer back here when its last reference
    /// goes (`page/spare.rs` says why).
    spare: Arc<Spare>,
    /// Frames, dirty frames and version bytes, as of the last change
    /// (read without the mutex).
    frames_n: AtomicUsize,
    dirty_n: AtomicUsize,
    versions_n: AtomicUsize,
    spilled_n: AtomicUsize,
    spill: Spill,
    /// Nothing is written home (the store is open read-only): dirty
    /// pages stay in the pool, over its bound if need be.
    read_only: bool,
    /// Pages go home through this double-write buffer, if set (taken
    /// away by [`Pool::retire_doublewrite`]).
    doublewrite: Mutex<Option<Arc<DoubleWrite>>>,
}

/// A frame as it was before a transaction changed it (for a rollback):
/// its page, whether it was dirty, its image epoch; `None`: not in the
/// pool.
pub(crate) type Before = Option<(Arc<Page>, bool, u64)>;

fn invalid(no: PageNo, e: Invalid) -> Error {
    match e {
        Invalid::Checksum => Error::TornPage { page: no },
        Invalid::Structure(reason) => Error::Corrupt { page: no, reason },
    }
}

impl Pool {
    /// A pool of `cache_bytes` over `data`.
    pub(crate) fn new(
        data: Box<dyn VfsFile>,
        cache_bytes: usize,
        spill: Spill,
        read_only: bool,
        doublewrite: Option<DoubleWrite>,
    ) -> Pool {
        Pool {
            data,
            capacity: (cache_bytes / FRAME_BYTES).max(16),
            version_limit: (cache_bytes / 4).max(64 * FRAME_BYTES),
            state: Mutex::new(State {
                frames: HashMap::new(),
                clock: VecDeque::new(),
                popped: 0,
                dirty: 0,
                versions: Versions::default(),
            }),
            cond: Condvar::new(),
            spare: Arc::new(Spare::new(SPARE_BUFFERS)),
            frames_n: AtomicUsize::new(0),
            dirty_n: AtomicUsize::new(0),
            versions_n: AtomicUsize::new(0),
            spilled_n: AtomicUsize::new(0),
            spill,
            read_only,
            doublewrite: Mutex::new(doublewrite.map(Arc::new)),
        }
    }

    /// Whether pages go home through a double-write buffer.
    pub(crate) fn has_doublewrite(&self) -> bool {
        self.doublewrite.lock().is_some()
    }

    /// From now on pages go straight home (a batch already going through
    /// the area finishes there).
    pub(crate) fn retire_doublewrite(&self) {
        self.doublewrite.lock().take();
    }

    /// A page buffer: a spare one if any (its contents stale), else new.
    pub(crate) fn buffer(&self) -> Box<[u8; PAGE_SIZE]> {
        self.spare.take()
    }

    /// A private copy of `page` (a transaction's, to change), in a reused
    /// buffer, which goes back to the pool when the copy is dropped.
    pub(crate) fn copy(&self, page: &Page) -> Page {
        let mut b = self.buffer();
        b.copy_from_slice(page.bytes());
        self.adopt(Page::from_buffer(b))
    }

    /// [`Page::from_cells`] in a reused buffer (`cells` empty: an empty
    /// page), which goes back to the pool when the page is dropped.
    pub(crate) fn new_page<C: AsRef<[u8]>>(
        &self,
        no: PageNo,
        kind: Kind,
        link: PageNo,
        cells: &[C],
    ) -> Page {
        self.adopt(Page::from_cells_in(self.buffer(), no, kind, link, cells))
    }

    /// `page`, whose buffer goes back to the pool when it is dropped.
    pub(crate) fn adopt(&self, mut page: Page) -> Page {
        page.give_back_to(&self.spare);
        page
    }

    /// Publishes the counters after a change under the mutex.
    fn publish(&self, st: &State) {
        self.frames_n.store(st.frames.len(), Ordering::Relaxed);
        self.dirty_n.store(st.dirty, Ordering::Relaxed);
        self.versions_n.store(st.versions.bytes, Ordering::Relaxed);
        let spilled = usize::try_from(st.versions.spilled).unwrap_or(usize::MAX);
        self.spilled_n.store(spilled, Ordering::Relaxed);
        // Spare buffers: as many as the frames there is room for (after
        // a long snapshot's versions go, its room comes back as buffers
        // the frames then refill from), and a few more.
        let room = self.capacity().saturating_sub(st.frames.len());
        self.spare.set_limit(room.max(SPARE_BUFFERS));
    }

    /// Whether pages are never written home.
    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    /// The data file.
    pub(crate) fn file(&self) -> &dyn VfsFile {
        &*self.data
    }

    /// Frames the pool holds at most (between evictions): its capacity
    /// less the page versions kept in memory for open snapshots, so that
    /// frames and versions together stay within the cache's bytes. (The
    /// versions are spilled past a quarter of the cache, or 64 frames if
    /// that is more; the pool keeps 16 frames whatever they hold.)
    pub(crate) fn capacity(&self) -> usize {
        let versions = self.versions_n.load(Ordering::Relaxed) / FRAME_BYTES;
        self.capacity.saturating_sub(versions).max(16)
    }

    /// Frames the pool holds at most with no version kept.
    pub(crate) fn full_capacity(&self) -> usize {
        self.capacity
    }

    /// Frames in use and dirty frames.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (
            self.frames_n.load(Ordering::Relaxed),
            self.dirty_n.load(Ordering::Relaxed),
        )
    }

    /// Looks pages up without I/O, under one lock: `f` gets a lookup that
    /// answers `None` for a page not in the pool.
    pub(crate) fn with_cached<R>(
        &self,
        f: impl FnOnce(&mut dyn FnMut(PageNo) -> Option<Arc<Page>>) -> R,
    ) -> R {
        let mut st = self.state.lock();
        let mut look = |no: PageNo| match st.frames.get_mut(&no) {
            Some(Slot::Ready(f)) => {
                f.referenced = true;
                Some(f.page.clone())
            }
            _ => None,
        };
        f(&mut look)
    }

    /// Whether each of `pages` is the version the pool holds of its page
    /// now (the same allocation, not only the same bytes).
    pub(crate) fn is_current<'p>(
        &self,
        mut pages: impl Iterator<Item = (PageNo, &'p Arc<Page>)>,
    ) -> bool {
        let st = self.state.lock();
        pages.all(|(no, page)| {
            matches!(st.frames.get(&no), Some(Slot::Ready(f)) if Arc::ptr_eq(&f.page, page))
        })
    }

    /// Reads page `no` from disk, checked.
    pub(crate) fn read_disk(&self, no: PageNo) -> Result<Page> {
        let mut buf = self.buffer();
        let off = u64::from(no) * PAGE_SIZE as u64;
        let mut got = 0;
        while got < PAGE_SIZE {
            let r = self.data.read_at(&mut buf[got..], off + got as u64)?;
            if r == 0 {
                return Err(Error::Corrupt {
                    page: no,
                    reason: "a page past the data file's end",
                });
            }
            got += r;
        }
        Page::from_disk(buf, no)
            .map(|p| self.adopt(p))
            .map_err(|e| invalid(no, e))
    }

    /// Page `no` as it stands. Under the tree lock no transaction is half
    /// applied from the caller's point of view; without it (a writer
    /// preparing a put, a transaction fetching the page it missed) the
    /// page may be one a transaction in progress is replacing, and the
    /// caller must check what it read before it relies on it.
    pub(crate) fn fetch(&self, no: PageNo, journal: &Journal) -> Result<Arc<Page>> {
        match self.fetch_inner(no, None, journal)? {
            Picked::Page(p) => Ok(p),
            // (Only a snapshot reads an older version.)
            Picked::Spilled { .. } => Err(Error::SnapshotTooOld),
        }
    }

    fn pick(st: &State, page: &Arc<Page>, no: PageNo, at: Option<Lsn>) -> Result<Picked> {
        match at {
            Some(s) => st.versions.pick(page, no, s),
            None => Ok(Picked::Page(page.clone())),
        }
    }

    fn fetch_inner(&self, no: PageNo, at: Option<Lsn>, journal: &Journal) -> Result<Picked> {
        let mut st = self.state.lock();
        loop {
            match st.frames.get_mut(&no) {
                Some(Slot::Ready(f)) => {
                    f.referenced = true;
                    let page = f.page.clone();
                    return Self::pick(&st, &page, no, at);
                }
                Some(Slot::Loading) => st = self.cond.wait(st),
                None => break,
            }
        }
        st.frames.insert(no, Slot::Loading);
        drop(st);
        let read = self.read_disk(no);
        let mut st = self.state.lock();
        if let Some(Slot::Ready(f)) = st.frames.get(&no) {
            // A writer installed a new copy while the page was read (it
            // had been evicted after the writer read it): the writer's
            // stands; the copy read is the version it replaced.
            let page = f.page.clone();
            if let Ok(old) = read {
                st.versions.stash(no, &Arc::new(old));
            }
            self.publish(&st);
            self.cond.notify_all();
            return Self::pick(&st, &page, no, at);
        }
        let page = match read {
            Ok(p) => Arc::new(p),
            Err(e) => {
                st.frames.remove(&no);
                self.publish(&st);
                self.cond.notify_all();
                return Err(e);
            }
        };
        st.frames.insert(
            no,
            Slot::Ready(Frame {
                page: page.clone(),
                dirty: false,
                referenced: true,
                pinned: false,
                writing: false,
                in_clock: true,
                image_epoch: 0,
            }),
        );
        st.clock.push_back(no);
        self.publish(&st);
        self.cond.notify_all();
        let picked = Self::pick(&st, &page, no, at);
        let victims = self.evict(&mut st);
        drop(st);
        if !victims.is_empty() {
            // Nothing clean to evict: write some dirty pages home so the
            // next eviction finds them clean.
            self.write_back(&victims, journal)?;
            self.evict(&mut self.state.lock());
        }
        picked
    }

    /// Evicts clean frames while over capacity; returns dirty frames to
    /// write home if that was not enough.
    fn evict(&self, st: &mut MutexGuard<'_, State>) -> Vec<PageNo> {
        self.evict_to(st, self.capacity())
    }

    /// Evicts clean frames by the clock until at most `target` remain;
    /// the dirty frames passed over (for the caller to write home) if
    /// that was not enough.
    fn evict_to(&self, st: &mut MutexGuard<'_, State>, target: usize) -> Vec<PageNo> {
        let mut dirty = Vec::new();
        let want = st.frames.len().saturating_sub(target).max(32);
        let mut budget = 2 * st.clock.len();
        while st.frames.len() > target && budget > 0 {
            budget -= 1;
            let Some(no) = st.clock.pop_front() else {
                break;
            };
            st.popped += 1;
            let Some(Slot::Ready(f)) = st.frames.get_mut(&no) else {
                continue;
            };
            if f.pinned {
                // Back on the clock when unpinned.
                f.in_clock = false;
                continue;
            }
            if f.writing || f.referenced || f.dirty {
                if f.dirty && !f.writing && dirty.len() < want {
                    dirty.push(no);
                }
                f.referenced = false;
                st.clock.push_back(no);
                continue;
            }
            // (Its buffer goes back to the spare list once no reader
            // holds the page.)
            st.frames.remove(&no);
        }
        self.publish(st);
        if st.frames.len() > target {
            dirty
        } else {
            Vec::new()
        }
    }

    /// Evicts clean frames while the pool is over capacity.
    pub(crate) fn shrink(&self) {
        self.evict(&mut self.state.lock());
    }

    /// Evicts clean frames until an eighth of the pool is free (recovery,
    /// after writing every dirty page home: the pages it reads next then
    /// need no eviction of their own).
    pub(crate) fn shrink_with_room(&self) {
        let room = self.capacity();
        self.evict_to(&mut self.state.lock(), room - room / 8);
    }

    /// Brings the pool back within capacity: evicts clean frames, and if
    /// that is not enough, writes dirty ones home (the log forced first)
    /// and evicts them. For a writer that pushed the pool over its bound
    /// faster than the background cleaner drained it.
    pub(crate) fn relieve(&self, journal: &Journal) -> Result<()> {
        for _ in 0..4 {
            let victims = self.evict(&mut self.state.lock());
            if victims.is_empty() {
                return Ok(());
            }
            self.write_back(&victims, journal)?;
        }
        self.shrink();
        Ok(())
    }

    /// Installs a transaction's new copy of page `no`, pinned and dirty
    /// (its LSN is [`PENDING`] until [`Pool::stamp`]). `read` is the
    /// version the transaction read, if it did: kept for open snapshots
    /// in the frame's stead if the frame was evicted since. Returns the
    /// frame as it was, its image epoch, and the copy installed.
    pub(crate) fn put(
        &self,
        no: PageNo,
        mut page: Page,
        read: Option<&Arc<Page>>,
    ) -> (Before, u64, Arc<Page>) {
        page.set_lsn(PENDING);
        let page = Arc::new(self.adopt(page));
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let r = match st.frames.get_mut(&no) {
            Some(Slot::Ready(f)) => {
                let before = Some((f.page.clone(), f.dirty, f.image_epoch));
                st.versions.stash(no, &f.page);
                f.page = page.clone();
                f.pinned = true;
                f.referenced = true;
                if !f.dirty {
                    f.dirty = true;
                    st.dirty += 1;
                }
                (before, f.image_epoch, page)
            }
            _ => {
                if let Some(old) = read {
                    st.versions.stash(no, old);
                }
                st.frames.insert(
                    no,
                    Slot::Ready(Frame {
                        page: page.clone(),
                        dirty: true,
                        referenced: true,
                        pinned: true,
                        writing: false,
                        // (On the clock once unpinned.)
                        in_clock: false,
                        image_epoch: 0,
                    }),
                );
                st.dirty += 1;
                (None, 0, page)
            }
        };
        self.publish(st);
        r
    }

    /// Undoes [`Pool::put`] for a transaction that failed before its
    /// record was appended.
    pub(crate) fn restore(&self, no: PageNo, before: Before) {
        let mut st = self.state.lock();
        let was_dirty = matches!(st.frames.get(&no), Some(Slot::Ready(f)) if f.dirty);
        match before {
            Some((page, dirty, image_epoch)) => {
                if let Some(Slot::Ready(f)) = st.frames.get_mut(&no) {
                    f.page = page;
                    f.dirty = dirty;
                    f.pinned = false;
                    f.image_epoch = image_epoch;
                    if !f.in_clock {
                        f.in_clock = true;
                        st.clock.push_back(no);
                    }
                }
                if was_dirty && !dirty {
                    st.dirty -= 1;
                }
            }
            None => {
                st.frames.remove(&no);
                if was_dirty {
                    st.dirty -= 1;
                }
            }
        }
        self.publish(&st);
        self.cond.notify_all();
    }

    /// Gives the pages of an appended transaction their LSN and unpins
    /// them; `imaged` pages were logged whole in `epoch`.
    pub(crate) fn stamp(&self, pages: &[(PageNo, bool)], lsn: Lsn, epoch: u64) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        for (no, imaged) in pages {
            if let Some(Slot::Ready(f)) = st.frames.get_mut(no) {
                Arc::make_mut(&mut f.page).set_lsn(lsn);
                f.pinned = false;
                if *imaged {
                    f.image_epoch = epoch;
                }
                if !f.in_clock {
                    f.in_clock = true;
                    st.clock.push_back(*no);
                }
            }
        }
        self.publish(st);
        self.cond.notify_all();
    }

    /// Installs a page rebuilt by recovery: dirty, not pinned.
    pub(crate) fn install_recovered(&self, no: PageNo, page: Page) {
        let lsn = page.lsn();
        self.put(no, page, None);
        self.stamp(&[(no, false)], lsn, 0);
    }

    /// Writes the dirty pages among `nos` home: the log forced over their
    /// pageLSNs first; a page is marked clean only once its write succeeded
    /// and only if no one changed it meanwhile. With `wait`, waits for a
    /// pinned page to be unpinned (a checkpoint must write every page).
    /// Returns the pages written.
    pub(crate) fn write_back_opt(
        &self,
        nos: &[PageNo],
        journal: &Journal,
        wait: bool,
    ) -> Result<usize> {
        if self.read_only {
            return Ok(0);
        }
        let mut batch: Vec<(PageNo, Arc<Page>)> = Vec::with_capacity(nos.len());
        {
            let mut st = self.state.lock();
            for no in nos {
                loop {
                    match st.frames.get_mut(no) {
                        Some(Slot::Ready(f)) if f.dirty && !f.writing => {
                            if f.pinned {
                                if wait {
                                    st = self.cond.wait(st);
                                    continue;
                                }
                                break;
                            }
                            f.writing = true;
                            batch.push((*no, f.page.clone()));
                        }
                        Some(Slot::Ready(f)) if f.writing && wait => {
                            // Another writer has it: wait for its outcome.
                            st = self.cond.wait(st);
                            continue;
                        }
                        _ => {}
                    }
                    break;
                }
            }
        }
        let result = self.write_batch(&batch, journal);
        let mut st = self.state.lock();
        let st = &mut *st;
        for (no, written) in &batch {
            if let Some(Slot::Ready(f)) = st.frames.get_mut(no) {
                f.writing = false;
                if result.is_ok() && Arc::ptr_eq(&f.page, written) && f.dirty {
                    f.dirty = false;
                    st.dirty -= 1;
                }
            }
        }
        self.publish(st);
        self.cond.notify_all();
        result.map(|()| batch.len())
    }

    /// [`Pool::write_back_opt`] without waiting for pinned pages.
    pub(crate) fn write_back(&self, nos: &[PageNo], journal: &Journal) -> Result<usize> {
        self.write_back_opt(nos, journal, false)
    }

    fn write_batch(&self, batch: &[(PageNo, Arc<Page>)], journal: &Journal) -> Result<()> {
        let Some(max) = batch.iter().map(|(_, p)| p.lsn()).max() else {
            return Ok(());
        };
        // Write-ahead: the log is durable over every page's LSN first. (The
        // journal decides: the record *at* `durable_lsn` is not durable
        // yet, and a chained record is durable only with its last part.)
        journal.force(max, ForceMode::Durable)?;
        let doublewrite = self.doublewrite.lock().clone();
        if let Some(dw) = doublewrite {
            return dw.write_home(batch, &*self.data);
        }
        let mut sealed = self.buffer();
        let mut r = Ok(());
        for (no, page) in batch {
            page.seal_into(&mut sealed);
            r = self
                .data
                .write_at(&sealed[..], u64::from(*no) * PAGE_SIZE as u64);
            if r.is_err() {
                break;
            }
        }
        self.spare.give(sealed);
        Ok(r?)
    }
}
