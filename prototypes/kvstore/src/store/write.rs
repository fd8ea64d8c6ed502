//! Writing: transactions applied to the tree and logged, checkpoints, and
//! the background worker that runs them and keeps clean pages in the pool.

use super::*;
use crate::meta::{encode_meta, Meta};
use crate::record;
use crate::tree::Txn;
use crate::{MAX_KEY, MAX_VALUE};
use journal_core::sync::Deadline;

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
        self.check()?;
        Self::validate(&ops)?;
        if ops.is_empty() {
            return Ok(self.journal.appended_lsn());
        }
        // Optimistic: under the tree lock, only pages in the pool are read;
        // a miss rolls back, fetches the page without the lock, and runs
        // again (after a few misses, reads happen under the lock).
        let mut tries = 0;
        let (mut tree, txn) = loop {
            let tree = self.write_tree();
            self.check()?;
            let mut txn = Txn::new(&self.pool, &self.journal, *tree, tries >= MAX_MISSES);
            let mut failed = None;
            for op in &ops {
                let r = match op {
                    Op::Put(k, v) => txn.put(k, v),
                    Op::Delete(k) => txn.delete(k).map(|_| ()),
                };
                if let Err(e) = r {
                    failed = Some(e);
                    break;
                }
            }
            let Some(e) = failed else {
                break (tree, txn);
            };
            let missing = txn.missing;
            txn.rollback();
            drop(tree);
            match missing {
                Some(no) => {
                    self.pool.fetch(no, &self.journal)?;
                    tries += 1;
                }
                None => return Err(e),
            }
        };
        let epoch = self.epoch.load(Ordering::Acquire);
        let (log_ops, stamp) = txn.finish(epoch);
        if log_ops.is_empty() {
            // Deletes of absent keys: nothing changed.
            txn.rollback();
            return Ok(self.journal.appended_lsn());
        }
        let bytes = record::encoded_len(&log_ops);
        let max = self.journal.options().max_record();
        if bytes > max {
            txn.rollback();
            return Err(Error::TransactionTooLarge { bytes, max });
        }
        let lsn = match self.journal.append(&record::encode(&log_ops)) {
            Ok(lsn) => lsn,
            Err(e) => {
                // Nothing was logged: undo, and leave the store usable
                // (the journal poisons itself if it must).
                txn.rollback();
                return Err(e.into());
            }
        };
        self.pool.stamp(&stamp, lsn, epoch);
        let end = txn.meta.end;
        *tree = txn.meta;
        self.applied.store(lsn.0, Ordering::Release);
        drop(tree);
        if wait {
            // Applied but not durable: nothing may be served any more.
            self.journal
                .commit(lsn)
                .map_err(|e| self.poison_with(e.into()))?;
        }
        let (frames, _) = self.pool.usage();
        if frames > self.pool.capacity() {
            self.pool
                .relieve(&self.journal)
                .map_err(|e| self.poison_with(e))?;
        }
        self.after_write(lsn, end);
        Ok(lsn)
    }

    /// Grows the data file by an extent (an eighth of it, 1–64 MiB) once
    /// the tree's end comes within a few pages of it, so page writes land
    /// in space the file already has. Best effort: a write past the end
    /// still extends the file, and fails (poisoning) only if the disk is
    /// full.
    pub(super) fn grow(&self, end: PageNo) {
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
        self.pool
            .file()
            .sync_data()
            .map_err(|e| self.poison_with(e.into()))?;
        let seq = self.meta_seq.load(Ordering::Acquire) + 1;
        let page = encode_meta(&Meta {
            journal_id: self.journal_id,
            sequence: seq,
            root: meta.root,
            end: meta.end,
            free_head: meta.free_head,
        });
        self.pool
            .file()
            .write_at(&page[..], pages_bytes(seq % 2))
            .map_err(|e| self.poison_with(e.into()))?;
        self.meta_seq.store(seq, Ordering::Release);
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
        loop {
            let (_, dirty) = self.pool.usage();
            if dirty * 4 <= self.pool.capacity() {
                self.pool.shrink();
                return Ok(());
            }
            let batch = self.pool.dirty_in_clock_order(WRITE_BATCH);
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
