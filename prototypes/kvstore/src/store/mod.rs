//! The store: open and recover, transactions, reads, snapshots and
//! iterators, checkpoints.

use crate::page::{PageNo, PAGE_SIZE};
use crate::poison::Poison;
use crate::pool::{Pool, Spill, SPILL_FILE};
use crate::record::Op;
use crate::tree::{self, TreeMeta};
use crate::{Error, Result};
use journal_core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use journal_core::sync::{thread, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use journal_core::vfs::{OsVfs, Vfs};
use journal_core::{Journal, Lsn, RecoveryReport};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod check;
mod iter;
mod load;
mod recovery;
mod value;
mod write;

pub use check::CheckReport;
pub use iter::{prefix_end, Iter};
pub use load::{BulkLoad, LoadInfo};

/// The journal directory inside a store directory.
pub const WAL_DIR: &str = "wal";
/// The data file inside a store directory.
pub const DATA_FILE: &str = "data.kv";

/// Everything [`Store::open`] can be told.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Create the store if there is none (default true).
    pub create_if_missing: bool,
    /// Open for reading only (default false): recovery replays the log
    /// into the pool but nothing is written home — no checkpoint at open
    /// or close, no background worker, no page cleaning (the pool may
    /// outgrow its bound by the pages the log touches) — and every write,
    /// [`Store::sync`] and [`Store::checkpoint`] returns
    /// [`Error::ReadOnly`]. The journal's own recovery still runs (it may
    /// cut off a torn tail). `kvstore check` opens so.
    pub read_only: bool,
    /// Bytes of the buffer pool (default 64 MiB): the pages in memory and
    /// the page versions open iterators read, these at most a quarter of
    /// it (beyond that they are spilled to a scratch file).
    pub cache_bytes: usize,
    /// Bytes of page versions open iterators may keep in the scratch file
    /// `snapshots.spill` beyond the quarter of the cache in memory
    /// (default 4 GiB; 0: none). Past it, the oldest iterator ends with
    /// [`Error::SnapshotTooOld`]. A full scan beside writers needs at most
    /// about the tree's size here. The bookkeeping of each version (about
    /// 41 bytes) stays in memory, within the cache's quarter: past it the
    /// oldest iterator expires too.
    pub snapshot_spill_bytes: u64,
    /// The journal's options. The default uses 1 MiB log buffers.
    pub journal: journal_core::Options,
    /// Checkpoint in the background this often (default 10 s; `None`: only
    /// by [`Store::checkpoint`] and by log volume).
    pub checkpoint_interval: Option<Duration>,
    /// Also checkpoint once this many log bytes were written since the
    /// last checkpoint began (default 256 MiB). It bounds recovery: open
    /// replays at most about this much log.
    pub checkpoint_log_bytes: u64,
    /// How a page torn by a crash while it was written home is repaired
    /// (default [`TornPages::FullPageImages`]). Either way, opening
    /// repairs from whatever the last run left: the choice can change
    /// from one open to the next.
    pub torn_pages: TornPages,
}

/// The two ways to survive a torn page write; docs/PERFORMANCE.md has
/// them measured side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TornPages {
    /// PostgreSQL's `full_page_writes`: a page's first change after a
    /// checkpoint began logs the page's whole image, and recovery rebuilds
    /// a torn page from it. Costs log bytes after every checkpoint: with
    /// data many times the cache, nearly a page image per put, and an
    /// image storm (latency spikes) after each checkpoint begins. The
    /// default: at a million keys it put 1.2–1.3× the double write's rate
    /// at 16 and 64 clients, with a third of its p99 at one client and
    /// half its device bytes.
    #[default]
    FullPageImages,
    /// InnoDB's doublewrite buffer: every batch of pages written home goes
    /// first to the file `doublewrite.kv` and is synced there, then home,
    /// then the data file is synced; recovery copies back a page torn at
    /// home. The log holds no page images for it; every page is written
    /// twice, with two syncs per batch of up to 64 pages (which a lone
    /// committer's flush may queue behind: a higher p99 at one client).
    /// With data many times the cache it avoids the image storms: lower
    /// tail latency and faster recovery after a crash.
    DoubleWrite,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            create_if_missing: true,
            read_only: false,
            cache_bytes: 64 << 20,
            snapshot_spill_bytes: 4 << 30,
            journal: journal_core::Options {
                logbsize: 1 << 20,
                ..journal_core::Options::default()
            },
            checkpoint_interval: Some(Duration::from_secs(10)),
            checkpoint_log_bytes: 256 << 20,
            torn_pages: TornPages::default(),
        }
    }
}

/// What opening the store found and replayed.
#[derive(Debug, Clone)]
pub struct RecoveryInfo {
    /// What the journal's own recovery found.
    pub journal: RecoveryReport,
    /// Transaction records read from the checkpoint on.
    pub records: u64,
    /// Page operations replayed onto pages whose pageLSN was below them.
    pub ops_applied: u64,
    /// Page operations skipped: their page already held them.
    pub ops_skipped: u64,
    /// Pages restored from a full image in the log (a torn page among
    /// them is repaired so).
    pub images_restored: u64,
    /// Data-file pages read by recovery (the pages the log since the
    /// checkpoint touches without an image, and the meta pages).
    pub pages_read: u64,
    /// Pages put back from the double-write buffer before the log was
    /// replayed (their home copy torn, damaged or older).
    pub doublewrite_restored: u64,
}

/// What a checkpoint did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The log position the checkpoint moved the tail to.
    pub redo_lsn: Lsn,
    /// Pages written home.
    pub pages_written: u64,
}

/// Counters of the buffer pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Frames the pool holds at most with no page version kept for a
    /// snapshot (the versions kept in memory take frames from it).
    pub capacity_pages: usize,
    /// Frames in use.
    pub pages: usize,
    /// Of those, pages changed since written home.
    pub dirty_pages: usize,
    /// Bytes of page versions kept in memory for open iterators, and of
    /// the bookkeeping of every version kept (spilled or not), in whole
    /// frames.
    pub version_bytes: usize,
    /// Bytes of page versions spilled to the scratch file for them.
    pub spilled_bytes: u64,
    /// Pages in the data file's tree, free list and meta pages.
    pub file_pages: u32,
}

pub(crate) struct Inner {
    dir: PathBuf,
    options: Options,
    journal: Journal,
    pool: Pool,
    /// The tree's shape. Writers hold it exclusively while they change
    /// pages and append their record; readers and a snapshot's opening
    /// hold it shared, so none sees half a transaction.
    tree: RwLock<TreeMeta>,
    /// Transactions waiting for the combiner (see `write.rs`).
    queue: Mutex<Vec<Arc<write::Pending>>>,
    /// Held by the writer applying the queue.
    combiner: Mutex<()>,
    /// The buffer records are encoded into (see `write.rs`).
    record_buf: Mutex<Vec<u8>>,
    /// Where recent inserts into each leaf went, so that a leaf taking
    /// ascending keys splits at the insert (`tree/split.rs`). Locked
    /// under the tree's write lock only: never contended.
    hints: Mutex<tree::InsertHints>,
    /// The tree's root (high half) and end (low half) as the last
    /// transaction left them, for writers preparing a put without the
    /// tree lock (`write.rs`).
    tree_hint: AtomicU64,
    /// The LSN of the last transaction applied: a new snapshot reads as of
    /// it.
    applied: AtomicU64,
    /// Bumped by every checkpoint as it picks its redo position; a page's
    /// first change in a newer epoch logs the page's full image.
    epoch: AtomicU64,
    /// The data file's length in pages, as last grown.
    file_pages: AtomicU64,
    /// One grow at a time (`write.rs`): two racing grows each read the
    /// length and set their own, and the later `set_len` of the smaller
    /// one would cut off pages written past it in between.
    grow_lock: Mutex<()>,
    /// The meta page's sequence number last written.
    meta_seq: AtomicU64,
    journal_id: journal_core::JournalId,
    /// One checkpoint at a time.
    checkpointing: Mutex<()>,
    /// The log position the last checkpoint began at.
    last_redo: AtomicU64,
    closed: AtomicBool,
    /// The first write or sync error on the data file, the double-write
    /// area or the log (or a panic while applying): every later call
    /// returns it. Shared with the pool, which poisons on the spot.
    poison: Arc<Poison>,
    worker: Mutex<WorkerState>,
    wake: Condvar,
    recovery: RecoveryInfo,
}

#[derive(Default)]
struct WorkerState {
    stop: bool,
    checkpoint: bool,
    clean: bool,
    grow: bool,
}

/// An embedded key-value store on the journal. `Send + Sync`: share it
/// with `Arc`; many threads commit at once and share the journal's group
/// commit.
pub struct Store {
    inner: Arc<Inner>,
    worker: Mutex<Option<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

/// A batch of puts and deletes, committed atomically.
#[derive(Debug)]
pub struct Transaction<'s> {
    store: &'s Store,
    ops: Vec<Op>,
}

impl Transaction<'_> {
    /// Inserts or replaces `key`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> &mut Self {
        self.ops.push(Op::Put(key.to_vec(), value.to_vec()));
        self
    }

    /// Removes `key` (nothing if it is absent).
    pub fn delete(&mut self, key: &[u8]) -> &mut Self {
        self.ops.push(Op::Delete(key.to_vec()));
        self
    }

    /// Commits: every operation or none, durable when this returns.
    pub fn commit(self) -> Result<Lsn> {
        self.store.inner.apply(self.ops, true)
    }

    /// Commits without waiting for durability: visible at once, durable
    /// with the next group commit or [`Store::sync`].
    pub fn commit_no_wait(self) -> Result<Lsn> {
        self.store.inner.apply(self.ops, false)
    }
}

impl Inner {
    fn read_tree(&self) -> RwLockReadGuard<'_, TreeMeta> {
        self.tree.read()
    }

    fn write_tree(&self) -> RwLockWriteGuard<'_, TreeMeta> {
        self.tree.write()
    }

    pub(super) fn check(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.poison.check()
    }

    /// Records the first fatal error; returns it.
    /// [`Inner::check`], and not read-only.
    pub(super) fn check_writable(&self) -> Result<()> {
        self.check()?;
        if self.options.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    pub(super) fn poison_with(&self, e: Error) -> Error {
        self.poison.set(e)
    }
}

impl Store {
    /// Opens (creating it if asked) the store in `dir` on the real
    /// filesystem, recovering it: the meta page is read, torn pages are
    /// put back from the double-write area, and the log is replayed from
    /// the last checkpoint onto the pages it touches (full images first,
    /// which repair torn pages too).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Self::open_with(Arc::new(OsVfs::new()), dir, options)
    }

    /// Like [`Store::open`], on any filesystem (a `SimVfs` in tests).
    pub fn open_with(vfs: Arc<dyn Vfs>, dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        let inner = Arc::new(recovery::open(vfs, dir.as_ref(), options)?);
        let replayed = inner.recovery.records > 0;
        if replayed && !options.read_only {
            // Write the recovered pages home now, repairing torn ones.
            inner.checkpoint()?;
        }
        if options.torn_pages == TornPages::FullPageImages && inner.pool.has_doublewrite() {
            // The last run used the double-write area, and the log since
            // the checkpoint just taken (or, with nothing replayed, the
            // empty log) needs no page image: the area can go.
            inner.pool.retire_doublewrite();
            inner.retire_doublewrite_file()?;
        }
        if options.read_only {
            return Ok(Store {
                inner,
                worker: Mutex::new(None),
            });
        }
        let i2 = inner.clone();
        let worker = thread::Builder::new()
            .name("kvstore-checkpointer".into())
            .spawn(move || i2.background())
            .map_err(|e| {
                Error::from(journal_core::VfsError::new(
                    journal_core::vfs::Op::Spawn,
                    &inner.dir,
                    e,
                ))
            })?;
        Ok(Store {
            inner,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The journal the store logs to (for its metrics and reports).
    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// What opening the store found and replayed.
    pub fn recovery_info(&self) -> &RecoveryInfo {
        &self.inner.recovery
    }

    /// The buffer pool's counters.
    pub fn cache_stats(&self) -> CacheStats {
        let (pages, dirty_pages) = self.inner.pool.usage();
        CacheStats {
            capacity_pages: self.inner.pool.full_capacity(),
            pages,
            dirty_pages,
            version_bytes: self.inner.pool.version_bytes(),
            spilled_bytes: self.inner.pool.spilled_bytes(),
            file_pages: self.inner.read_tree().end,
        }
    }

    /// The value of `key`, if present. Sees every applied transaction:
    /// one committed with [`Transaction::commit_no_wait`] at once, and one
    /// committed with [`Transaction::commit`] as soon as it is applied —
    /// before its commit returns (and so, for an instant, before it is
    /// durable: readers are not held back by the flush).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    /// Puts `key` in a transaction of its own; durable when this returns.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<Lsn> {
        self.inner
            .apply(vec![Op::Put(key.to_vec(), value.to_vec())], true)
    }

    /// Deletes `key` in a transaction of its own; durable when this returns.
    pub fn delete(&self, key: &[u8]) -> Result<Lsn> {
        self.inner.apply(vec![Op::Delete(key.to_vec())], true)
    }

    /// A lazy iterator over the entries whose keys fall in `range`, in key
    /// order, as of one snapshot: every transaction applied before this
    /// call, none after (never half of one). It does not block writers.
    pub fn range<R: RangeBounds<Vec<u8>>>(&self, range: R) -> Result<Iter> {
        self.inner.check()?;
        Ok(Iter::new(
            self.inner.clone(),
            range.start_bound().cloned(),
            range.end_bound().cloned(),
        ))
    }

    /// A lazy iterator over the entries whose keys start with `prefix`
    /// (see [`Store::range`]).
    pub fn prefix(&self, prefix: &[u8]) -> Result<Iter> {
        use std::ops::Bound;
        let end = match iter::prefix_end(prefix) {
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        };
        self.inner.check()?;
        Ok(Iter::new(
            self.inner.clone(),
            Bound::Included(prefix.to_vec()),
            end,
        ))
    }

    /// The entries whose keys fall in `range`, in key order, collected
    /// from [`Store::range`].
    pub fn scan<R: RangeBounds<Vec<u8>>>(&self, range: R) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.range(range)?.collect()
    }

    /// Starts a sorted bulk load into this store, which must hold no key
    /// ([`Error::NotEmpty`]): keys pushed in increasing order are built
    /// into a tree leaves first, left to right, its pages filled to 90 %
    /// and written straight to the data file, and made the store's by one
    /// small log record at [`BulkLoad::finish`]: no log of the data, no
    /// split, each page written once. Memory: a page per level and a
    /// megabyte of pages in flight. For filling a new store, e.g. from a
    /// snapshot: every other call on this store waits until the load
    /// finishes or is dropped, so the thread loading must not call it.
    pub fn bulk_load(&self) -> Result<BulkLoad<'_>> {
        BulkLoad::start(&self.inner)
    }

    /// A new transaction.
    pub fn transaction(&self) -> Transaction<'_> {
        Transaction {
            store: self,
            ops: Vec::new(),
        }
    }

    /// Makes every transaction committed so far durable.
    pub fn sync(&self) -> Result<Lsn> {
        self.inner.check_writable()?;
        self.inner
            .journal
            .force_all()
            .map_err(|e| self.inner.poison_with(e.into()))
    }

    /// Writes every changed page home and moves the log's tail to the
    /// position the checkpoint began at (segments are recycled as it
    /// moves). The data file is synced before the meta page names its
    /// pages; the journal syncs it again (a registered data file) before
    /// the log forgets the records behind the meta page. A failed
    /// page write poisons the store: the tail never moves past a change
    /// that is not home.
    pub fn checkpoint(&self) -> Result<CheckpointInfo> {
        self.inner.check_writable()?;
        self.inner.checkpoint()
    }

    /// Stops the background worker, checkpoints, and closes the journal.
    /// Later calls return [`Error::Closed`].
    pub fn close(&self) -> Result<()> {
        self.inner.check()?;
        self.stop_worker();
        if !self.inner.options.read_only {
            self.inner.checkpoint()?;
        }
        self.inner.closed.store(true, Ordering::Release);
        self.inner.pool.remove_spill()?;
        self.inner.journal.close()?;
        Ok(())
    }

    fn stop_worker(&self) {
        self.inner.worker.lock().stop = true;
        self.inner.wake.notify_all();
        if let Some(h) = self.worker.lock().take() {
            let _ = h.join();
        }
    }

    /// Checks the tree as it stands, read-only (no checkpoint first): every
    /// page reachable once, keys in order and inside their separators,
    /// every leaf at one depth, overflow chains whole, pageLSNs not past
    /// the log, and the free list holding exactly the pages the tree does
    /// not. Returns one line per problem (none: the store is sound).
    pub fn check(&self) -> Result<Vec<String>> {
        self.inner.check()?;
        check::check(&self.inner)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

/// The bytes of `n` pages.
pub(crate) fn pages_bytes(n: u64) -> u64 {
    n * PAGE_SIZE as u64
}
