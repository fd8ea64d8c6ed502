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
//!   one ever reads a stale copy from disk. A load whose slot a writer
//!   replaced meanwhile (and whose copy may since have gone home and been
//!   evicted) reads again rather than install what it read.
//! - **Failures are fatal**: a failed write or sync of the data file or
//!   the double-write area poisons the store before the pool answers
//!   (`poison.rs` says why), and no page goes home after that.

use crate::page::{Kind, Page, PageNo, Spare, PAGE_SIZE};
use crate::poison::Poison;
use crate::{Error, Result};
use journal_core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use journal_core::sync::{Condvar, Mutex, MutexGuard};
use journal_core::vfs::VfsFile;
use journal_core::{ForceMode, Journal, Lsn};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

mod cleaning;
mod doublewrite;
mod io;
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
    /// Being read from disk by the load with this number.
    Loading(u64),
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
    /// The number of the next load (names its `Loading` slot).
    loads: u64,
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
    /// The store's poison: set by the pool itself on a failed write or
    /// sync, checked before any page goes home.
    poison: Arc<Poison>,
    /// Held across each sync of the data file ([`Pool::sync_data`]), so
    /// that a sync that fails has poisoned the store before any other
    /// sync of the file can return: after a successful sync, a clean
    /// poison means every write issued before it is durable.
    sync_lock: Mutex<()>,
}

/// A frame as it was before a transaction changed it (for a rollback):
/// its page, whether it was dirty, its image epoch; `None`: not in the
/// pool.
pub(crate) type Before = Option<(Arc<Page>, bool, u64)>;

impl Pool {
    /// A pool of `cache_bytes` over `data`.
    pub(crate) fn new(
        data: Box<dyn VfsFile>,
        cache_bytes: usize,
        spill: Spill,
        read_only: bool,
        doublewrite: Option<DoubleWrite>,
        poison: Arc<Poison>,
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
                loads: 0,
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
            poison,
            sync_lock: Mutex::new(()),
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

    /// Evicts clean frames while over capacity; returns dirty frames to
    /// write home if that was not enough.
    pub(super) fn evict(&self, st: &mut MutexGuard<'_, State>) -> Vec<PageNo> {
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
}

#[cfg(test)]
mod tests;
