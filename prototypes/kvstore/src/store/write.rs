//! Writing: transactions applied to the tree and logged, checkpoints, and
//! the background worker that runs them and keeps clean pages in the pool.

use super::*;
use crate::meta::{encode_meta, Meta};
use crate::record;
use crate::tree::{self, PreparedPut, Txn};
use crate::{MAX_KEY, MAX_VALUE};
use journal_core::sync::Deadline;

/// What applying a transaction under the tree lock came to.
pub(super) enum Applied {
    /// Logged at this LSN; the tree's end after it.
    Done(Lsn, PageNo),
    /// Nothing to log (deletes of absent keys).
    Nothing,
    /// This page must be brought into the pool first.
    Missing(PageNo),
}

/// A transaction handed to the combiner.
pub(super) struct Pending {
    /// Its operations (taken back if it must go again), and a single
    /// put's leaf change prepared by its committer (taken by the
    /// combiner).
    work: Mutex<(Vec<Op>, Option<PreparedPut>)>,
    /// Durable before its outcome is given (`Transaction::commit`).
    wait: bool,
    /// Whether it may read from disk under the tree lock.
    allow_io: bool,
    /// Set once, by the combiner.
    outcome: Mutex<Option<Result<Applied>>>,
    /// Where its committer sleeps until then (a combiner usually settles
    /// its own transaction: the condvar makes no call with nobody asleep).
    done: Condvar,
}

impl Pending {
    fn new(ops: Vec<Op>, prepared: Option<PreparedPut>, wait: bool, allow_io: bool) -> Self {
        Pending {
            work: Mutex::new((ops, prepared)),
            wait,
            allow_io,
            outcome: Mutex::new(None),
            done: Condvar::new(),
        }
    }

    fn finish(&self, r: Result<Applied>) {
        *self.outcome.lock() = Some(r);
        self.done.notify_one();
    }
}

/// The data file is grown when the tree's end comes this close to it.
const GROW_SLACK: u64 = 64;

/// Pages a transaction fetches without the tree lock before it reads
/// under it.
const MAX_MISSES: u32 = 8;

/// Pages written home per batch (one log force each).
const WRITE_BATCH: usize = 64;

impl Inner {
    fn validate(ops: &[Op]) -> Result<()> {
        for op in ops {
            if op.key().len() > MAX_KEY {
                return Err(Error::KeyTooLarge {
                    len: op.key().len(),
                    max: MAX_KEY,
                });
            }
            if let Op::Put(_, v) = op {
                if v.len() > MAX_VALUE {
                    return Err(Error::ValueTooLarge {
                        len: v.len(),
                        max: MAX_VALUE,
                    });
                }
            }
        }
        Ok(())
    }

    /// Commits `ops` atomically: one log record; `wait`: durable on return.
    pub(super) fn apply(&self, ops: Vec<Op>, wait: bool) -> Result<Lsn> {
        self.check_writable()?;
        Self::validate(&ops)?;
        if ops.is_empty() {
            return Ok(self.journal.appended_lsn());
        }
        // A single put is prepared here, beside the combiner (it fetches
        // the pages it misses).
        let prepared = self.prepare(&ops);
        self.apply_prepared(ops, prepared, wait)
    }

    /// [`Inner::apply`], with `ops`' put prepared as `prepared`.
    fn apply_prepared(
        &self,
        ops: Vec<Op>,
        prepared: Option<PreparedPut>,
        wait: bool,
    ) -> Result<Lsn> {
        // Optimistic: under the tree lock, only pages in the pool are read;
        // a miss hands the transaction back, which fetches the page without
        // the lock and goes again (after a few misses, reads happen under
        // the lock).
        let mut pending = Arc::new(Pending::new(ops, prepared, wait, false));
        let mut tries = 0;
        let (lsn, end) = loop {
            match self.submit(&pending)? {
                Applied::Done(lsn, end) => break (lsn, end),
                // Nothing to log (deletes of absent keys) — but what this
                // transaction saw may not be durable yet (a delete that
                // made the key absent, committed without waiting, its
                // record not yet forced): an acknowledged operation is
                // durable with everything it observed.
                Applied::Nothing if wait => return self.force_applied(),
                Applied::Nothing => return Ok(self.journal.appended_lsn()),
                Applied::Missing(no) => {
                    self.pool.fetch(no, &self.journal)?;
                    tries += 1;
                    let ops = std::mem::take(&mut pending.work.lock().0);
                    let prepared = self.prepare(&ops);
                    pending = Arc::new(Pending::new(ops, prepared, wait, tries >= MAX_MISSES));
                }
            }
        };
        // (With `wait`, the combiner waited for durability; a failed flush
        // poisoned the store: applied but not durable, nothing may be
        // served any more.)
        let (frames, _) = self.pool.usage();
        if frames > self.pool.capacity() {
            self.pool
                .relieve(&self.journal)
                .map_err(|e| self.poison_with(e))?;
        }
        self.after_write(lsn, end);
        Ok(lsn)
    }

    /// Makes every transaction applied so far durable (a poisoning error
    /// if it cannot be); returns the log's end.
    fn force_applied(&self) -> Result<Lsn> {
        let seen = Lsn(self.applied.load(Ordering::Acquire));
        // (Right after open, `applied` is the end of the recovered log,
        // all of it durable.)
        if seen < self.journal.appended_lsn() {
            self.journal
                .commit(seen)
                .map_err(|e| self.poison_with(e.into()))?;
        }
        Ok(self.journal.appended_lsn())
    }

    /// A single put's leaf change, made before the combiner (see
    /// [`PreparedPut`]) on the tree as last published.
    fn prepare(&self, ops: &[Op]) -> Option<PreparedPut> {
        let [Op::Put(key, value)] = ops else {
            return None;
        };
        let (root, end) = self.tree_hint();
        tree::prepare_put(&self.pool, &self.journal, root, end, key, value)
    }

    /// The tree's root and end as the last transaction left them (read
    /// without the tree lock: possibly stale).
    fn tree_hint(&self) -> (PageNo, PageNo) {
        let v = self.tree_hint.load(Ordering::Acquire);
        ((v >> 32) as PageNo, v as PageNo)
    }

    /// Publishes the tree's root and end for [`Inner::prepare`].
    fn publish_tree(&self, tree: &TreeMeta) {
        let v = (u64::from(tree.root) << 32) | u64::from(tree.end);
        self.tree_hint.store(v, Ordering::Release);
    }

    /// Queues a transaction, applies the queue if no one else is, and
    /// waits for the outcome.
    fn submit(&self, p: &Arc<Pending>) -> Result<Applied> {
        self.queue.lock().push(p.clone());
        self.combine();
        let mut g = p.outcome.lock();
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = p.done.wait(g);
        }
    }

    /// Flat combining: the first writer to find the combiner free applies
    /// every queued transaction under one hold of the tree lock, in queue
    /// order, each its own record; the others sleep until theirs is done.
    /// With many committers this replaces a chain of lock hand-offs (a
    /// wake-up each, on the critical path) by one. Having let go, the
    /// combiner looks at the queue again: a writer that queued while it
    /// held the combiner (and so found it taken) is never left behind.
    fn combine(&self) {
        loop {
            let mut durable = Vec::new();
            while let Some(combiner) = self.combiner.try_lock() {
                {
                    let mut tree = self.write_tree();
                    loop {
                        let batch = std::mem::take(&mut *self.queue.lock());
                        if batch.is_empty() {
                            break;
                        }
                        for p in batch {
                            let r = self.apply_caught(&mut tree, &p);
                            match r {
                                Ok(Applied::Done(lsn, end)) if p.wait => {
                                    durable.push((p, lsn, end))
                                }
                                r => p.finish(r),
                            }
                        }
                    }
                }
                drop(combiner);
                if self.queue.lock().is_empty() {
                    break;
                }
            }
            // One durable wait for the commits applied, outside the locks
            // (a combiner that comes meanwhile applies beside the flush): a
            // committer sleeps once, not once for the lock and again for
            // the flush.
            let Some(max) = durable.iter().map(|(_, lsn, _)| *lsn).max() else {
                return;
            };
            let r = self
                .journal
                .commit(max)
                .map_err(|e| self.poison_with(e.into()));
            for (p, lsn, end) in durable {
                p.finish(r.clone().map(|()| Applied::Done(lsn, end)));
            }
            if self.queue.lock().is_empty() {
                return;
            }
        }
    }

    /// [`Inner::apply_locked`] for a queued transaction, with a panic
    /// caught: the transaction was rolled back as the panic unwound
    /// through it (`Txn`'s drop), and the store is poisoned with the panic's
    /// message, so this transaction's committer, those after it in the
    /// queue and every later call get an error — none sleeps forever on a
    /// combiner that is gone, nothing writes to a tree a panic left.
    fn apply_caught(&self, tree: &mut TreeMeta, p: &Pending) -> Result<Applied> {
        self.check()?;
        let mut work = p.work.lock();
        let work = &mut *work;
        let run = std::panic::AssertUnwindSafe(|| {
            self.apply_locked(tree, &work.0, work.1.take(), p.allow_io)
        });
        std::panic::catch_unwind(run).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(self.poison_with(Error::Panicked { message }))
        })
    }

    /// Applies one transaction to the tree and appends its record (the
    /// caller holds the tree lock exclusively). Anything short of the
    /// append is rolled back.
    fn apply_locked(
        &self,
        tree: &mut TreeMeta,
        ops: &[Op],
        prepared: Option<PreparedPut>,
        allow_io: bool,
    ) -> Result<Applied> {
        let mut hints = self.hints.lock();
        let mut txn = Txn::new(&self.pool, &self.journal, *tree, allow_io, &mut hints);
        // A single put its committer prepared goes in as prepared, if the
        // tree has not moved since; else it goes the usual way.
        let ops = match prepared.map(|p| txn.put_prepared(p)) {
            Some(true) => &[],
            _ => ops,
        };
        for op in ops {
            let r = match op {
                Op::Put(k, v) => txn.put(k, v),
                Op::Delete(k) => txn.delete(k).map(|_| ()),
            };
            if let Err(e) = r {
                let missing = txn.missing;
                txn.rollback();
                return match missing {
                    Some(no) => Ok(Applied::Missing(no)),
                    None => Err(e),
                };
            }
        }
        // (A panic here, with the pages changed and pinned, is what the
        // tests inject: `panic` in the failpoints build.)
        fail::fail_point!("kvstore::apply-before-log");
        match self.log_txn(tree, txn)? {
            Some(lsn) => Ok(Applied::Done(lsn, tree.end)),
            // Deletes of absent keys: nothing changed.
            None => Ok(Applied::Nothing),
        }
    }

    /// Logs a transaction's changes (the caller holds the tree lock
    /// exclusively) and makes them the tree's: its pages stamped with the
    /// record's LSN, `tree` its new shape. `None`: nothing changed, and
    /// nothing was logged. A failure rolls every change back.
    pub(super) fn log_txn(&self, tree: &mut TreeMeta, mut txn: Txn<'_>) -> Result<Option<Lsn>> {
        // With a double-write buffer no page is imaged for its first
        // change (epoch 0 is behind every page's).
        let epoch = match self.options.torn_pages {
            TornPages::FullPageImages => self.epoch.load(Ordering::Acquire),
            TornPages::DoubleWrite => 0,
        };
        let (log_ops, stamp) = txn.finish(epoch);
        if log_ops.is_empty() {
            txn.rollback();
            return Ok(None);
        }
        let bytes = record::encoded_len(&log_ops);
        let max = self.journal.options().max_record();
        if bytes > max {
            txn.rollback();
            return Err(Error::TransactionTooLarge { bytes, max });
        }
        // One record buffer, reused (only the combiner encodes, under the
        // tree lock), so a long value's record is not a fresh allocation
        // of its size at every put; kept at most 4 MiB between records.
        let mut buf = self.record_buf.lock();
        record::encode_into(&log_ops, &mut buf);
        let appended = self.journal.append(&buf);
        if buf.capacity() > 4 << 20 {
            *buf = Vec::new();
        }
        drop(buf);
        // (The images' pages: the pool's frames hold the only references
        // again, so `stamp` changes them in place.)
        drop(log_ops);
        let lsn = match appended {
            Ok(lsn) => lsn,
            Err(e) => {
                // Nothing was logged: undo, and leave the store usable
                // (the journal poisons itself if it must).
                txn.rollback();
                return Err(e.into());
            }
        };
        self.pool.stamp(&stamp, lsn, epoch);
        if *tree != txn.meta {
            *tree = txn.meta;
            self.publish_tree(tree);
        }
        self.applied.store(lsn.0, Ordering::Release);
        // (The versions it replaced go back to the pool's buffers once no
        // one else holds them.)
        txn.committed();
        Ok(Some(lsn))
    }

    /// Grows the data file by an extent (an eighth of it, 1–64 MiB) once
    /// the tree's end comes within a few pages of it, so page writes land
    /// in space the file already has. Best effort: a write past the end
    /// still extends the file, and fails (poisoning) only if the disk is
    /// full. Grows never overlap and never shrink the file: a grow that
    /// read the length before another grew it would otherwise cut off
    /// the pages written past its own new end meanwhile.
    pub(super) fn grow(&self, end: PageNo) {
        let _one = self.grow_lock.lock();
        let f = self.pool.file();
        let Ok(len) = f.len() else { return };
        let want = pages_bytes(u64::from(end) + GROW_SLACK);
        if len < want {
            let extent = (len / 8).clamp(1 << 20, 64 << 20);
            let new_len = (want + extent).next_multiple_of(PAGE_SIZE as u64);
            if f.set_len(new_len).is_ok() {
                self.file_pages
                    .store(new_len / PAGE_SIZE as u64, Ordering::Relaxed);
            }
        }
    }

    /// Wakes the worker when the log since the checkpoint grew past its
    /// trigger, or dirty pages fill half the pool.
    fn after_write(&self, lsn: Lsn, end: PageNo) {
        self.pool.bound_versions();
        let grow = u64::from(end) + GROW_SLACK >= self.file_pages.load(Ordering::Relaxed);
        let since = lsn.0.saturating_sub(self.last_redo.load(Ordering::Relaxed));
        let checkpoint = since > self.options.checkpoint_log_bytes;
        let (frames, dirty) = self.pool.usage();
        let clean = dirty * 2 > self.pool.capacity() || frames > self.pool.capacity();
        if checkpoint || clean || grow {
            let mut w = self.worker.lock();
            w.checkpoint |= checkpoint;
            w.clean |= clean;
            w.grow |= grow;
            drop(w);
            self.wake.notify_all();
        }
    }

    /// Writes every page dirty when it began home, then the meta page, then
    /// moves the log's tail. Holds the tree lock only to pick the redo
    /// position; a failed write poisons the store and the tail stays.
    pub(super) fn checkpoint(&self) -> Result<CheckpointInfo> {
        let _one = self.checkpointing.lock();
        let (redo, meta) = {
            let tree = self.write_tree();
            self.epoch.fetch_add(1, Ordering::AcqRel);
            (self.journal.appended_lsn(), *tree)
        };
        self.last_redo.store(redo.0, Ordering::Relaxed);
        self.grow(meta.end);
        let dirty = self.pool.dirty_pages();
        let mut written = 0u64;
        for chunk in dirty.chunks(WRITE_BATCH) {
            written += self
                .pool
                .write_back_opt(chunk, &self.journal, true)
                .map_err(|e| self.poison_with(e))? as u64;
        }
        // The pages (and the file's length) are durable before the meta
        // page can name them: a meta page never points past the file.
        self.pool.sync_data()?;
        let seq = self.meta_seq.load(Ordering::Acquire) + 1;
        let page = encode_meta(&Meta {
            journal_id: self.journal_id,
            sequence: seq,
            root: meta.root,
            end: meta.end,
            free_head: meta.free_head,
        });
        self.pool.write_data(&page[..], pages_bytes(seq % 2))?;
        self.meta_seq.store(seq, Ordering::Release);
        // The meta page durable, and no write of the data file lost since
        // the checkpoint began (a failed sync anywhere has poisoned the
        // store by the time this one returns: `Pool::sync_data`), before
        // the log may forget the records behind it.
        self.pool.sync_data()?;
        self.journal
            .checkpoint(redo)
            .map_err(|e| self.poison_with(e.into()))?;
        Ok(CheckpointInfo {
            redo_lsn: redo,
            pages_written: written,
        })
    }

    /// Cleans dirty pages in clock order until a quarter of the pool is
    /// dirty, so evictions find clean pages; then evicts down to capacity.
    fn clean(&self) -> Result<()> {
        let mut cursor = 0;
        loop {
            let (_, dirty) = self.pool.usage();
            if dirty * 4 <= self.pool.capacity() {
                self.pool.shrink();
                return Ok(());
            }
            let batch = self.pool.dirty_in_clock_order(WRITE_BATCH, &mut cursor);
            if batch.is_empty() {
                return Ok(());
            }
            if self.pool.write_back(&batch, &self.journal)? == 0 {
                return Ok(());
            }
        }
    }

    /// The background worker: checkpoints every interval or when nudged by
    /// log volume; cleans pages when dirty ones fill half the pool; stops
    /// at its first error, which poisons the store.
    pub(super) fn background(&self) {
        loop {
            let (checkpoint, _clean, grow) = {
                let mut st = self.worker.lock();
                let deadline = self.options.checkpoint_interval.map(Deadline::after);
                let mut expired = false;
                while !st.stop && !st.checkpoint && !st.clean && !st.grow && !expired {
                    match &deadline {
                        Some(d) => {
                            let (g, e) = self.wake.wait_deadline(st, d);
                            st = g;
                            expired = e;
                        }
                        None => st = self.wake.wait(st),
                    }
                }
                if st.stop {
                    return;
                }
                let r = (st.checkpoint || expired, st.clean, st.grow);
                st.checkpoint = false;
                st.clean = false;
                st.grow = false;
                r
            };
            if self.check().is_err() {
                return;
            }
            if grow {
                self.grow(self.read_tree().end);
            }
            let r = if checkpoint {
                self.checkpoint().map(|_| ())
            } else {
                self.clean()
            };
            if let Err(e) = r {
                self.poison_with(e);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal_core::vfs::SimVfs;

    fn store() -> Store {
        let o = Options {
            checkpoint_interval: None,
            ..Options::default()
        };
        Store::open_with(Arc::new(SimVfs::new()), "/db", o).unwrap()
    }

    /// A store holding keys k000..k099, all in one leaf.
    fn store_of_100_keys() -> Store {
        let s = store();
        for i in 0..100u32 {
            s.put(format!("k{i:03}").as_bytes(), b"v").unwrap();
        }
        s
    }

    fn put(k: &[u8], v: &[u8]) -> Vec<Op> {
        vec![Op::Put(k.to_vec(), v.to_vec())]
    }

    /// Whether the combiner would take `prep` as prepared (the store's
    /// state is left as it was).
    fn taken(inner: &Inner, prep: PreparedPut) -> bool {
        let tree = inner.write_tree();
        let mut hints = inner.hints.lock();
        let mut txn = Txn::new(&inner.pool, &inner.journal, *tree, false, &mut hints);
        let taken = txn.put_prepared(prep);
        txn.rollback();
        taken
    }

    #[test]
    fn a_dropped_transaction_unpins_and_restores_its_pages() {
        let s = Arc::new(store_of_100_keys());
        {
            let inner = &s.inner;
            let tree = inner.write_tree();
            let mut hints = inner.hints.lock();
            let mut txn = Txn::new(&inner.pool, &inner.journal, *tree, false, &mut hints);
            txn.put(b"k050", b"changed").unwrap();
            // Neither logged nor rolled back: as a panic unwinding
            // through the combiner leaves it.
            drop(txn);
        }
        assert_eq!(s.get(b"k050").unwrap().as_deref(), Some(&b"v"[..]));
        // Nothing is left pinned: a checkpoint (which waits for pinned
        // pages to be unpinned) finishes.
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = s.clone();
        std::thread::spawn(move || tx.send(s2.checkpoint().map(|_| ())));
        let done = rx.recv_timeout(Duration::from_secs(60));
        assert!(matches!(done, Ok(Ok(()))), "the checkpoint hung or failed");
        s.put(b"k050", b"new").unwrap();
        assert_eq!(s.get(b"k050").unwrap().as_deref(), Some(&b"new"[..]));
    }

    #[test]
    fn a_put_prepared_on_the_tree_as_it_stands_is_taken_as_prepared() {
        let s = store_of_100_keys();
        let prep = s.inner.prepare(&put(b"k050", b"new")).expect("prepared");
        assert!(taken(&s.inner, prep), "a current path was refused");
        let prep = s.inner.prepare(&put(b"k050", b"new")).expect("prepared");
        s.inner
            .apply_prepared(put(b"k050", b"new"), Some(prep), true)
            .unwrap();
        assert_eq!(s.get(b"k050").unwrap().as_deref(), Some(&b"new"[..]));
    }

    #[test]
    fn a_put_prepared_on_a_leaf_changed_since_is_put_again_and_loses_nothing() {
        let s = store_of_100_keys();
        // Prepared on the leaf as it was; then another put changes that
        // leaf. Taken as prepared, the copy would undo that put.
        let prep = s.inner.prepare(&put(b"k050", b"new")).expect("prepared");
        s.put(b"k051", b"changed").unwrap();
        s.inner
            .apply_prepared(put(b"k050", b"new"), Some(prep), true)
            .unwrap();
        assert_eq!(s.get(b"k050").unwrap().as_deref(), Some(&b"new"[..]));
        assert_eq!(s.get(b"k051").unwrap().as_deref(), Some(&b"changed"[..]));
        let prep = s.inner.prepare(&put(b"k052", b"new")).expect("prepared");
        s.delete(b"k053").unwrap();
        assert!(!taken(&s.inner, prep), "a stale leaf was taken");
    }

    #[test]
    fn a_put_prepared_before_its_path_split_is_put_again() {
        let s = store();
        s.put(b"a", b"v").unwrap();
        let root = s.inner.read_tree().root;
        // The root is the only leaf; then enough puts to split it.
        let prep = s.inner.prepare(&put(b"a", b"new")).expect("prepared");
        for i in 0..200u32 {
            s.put(format!("k{i:03}").as_bytes(), &[7u8; 40]).unwrap();
        }
        assert_ne!(s.inner.read_tree().root, root, "the root did not split");
        assert_eq!(s.inner.tree_hint().0, s.inner.read_tree().root);
        s.inner
            .apply_prepared(put(b"a", b"new"), Some(prep), true)
            .unwrap();
        assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"new"[..]));
        for i in 0..200u32 {
            assert!(s.get(format!("k{i:03}").as_bytes()).unwrap().is_some());
        }
    }

    /// Under shuttle (`cargo xtask shuttle`; `--cfg shuttle`, run by the
    /// test name filter `shuttle_`): two grows racing, each having read the
    /// file's length before the other grew it.
    #[cfg(shuttle)]
    mod shuttle_models {
        use super::*;
        use journal_core::sync::shuttle::scheduler::{PctScheduler, RandomScheduler};
        use journal_core::sync::shuttle::{Config, Runner};

        fn scenario() {
            let s = Arc::new(store());
            let len = s.inner.pool.file().len().unwrap();
            let pages = (len / PAGE_SIZE as u64) as PageNo;
            // A grow to just past the file, and one far past it.
            let (near, far) = (pages, pages + 2048);
            let s2 = s.clone();
            let other = thread::spawn(move || s2.inner.grow(near));
            s.inner.grow(far);
            other.join().unwrap();
            let len = s.inner.pool.file().len().unwrap();
            assert!(
                len >= pages_bytes(u64::from(far) + GROW_SLACK),
                "a grow shrank the file under a larger one: {len} bytes"
            );
            s.close().unwrap();
        }

        #[test]
        fn shuttle_racing_grows_never_shrink_the_file_random() {
            let s = RandomScheduler::new_from_seed(0x6e0, 200);
            Runner::new(s, Config::new()).run(scenario);
        }

        #[test]
        fn shuttle_racing_grows_never_shrink_the_file_pct() {
            let s = PctScheduler::new_from_seed(0x6e0, 3, 200);
            Runner::new(s, Config::new()).run(scenario);
        }
    }
}
