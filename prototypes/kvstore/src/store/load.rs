//! Sorted bulk load: a tree built leaves first, left to right, written
//! straight to the data file — not through the log or the pool — and made
//! the store's by one small log record.
//!
//! This is how PostgreSQL builds a B-tree index (`nbtsort.c`) and how
//! InnoDB's sorted index build works: with the keys in order, each leaf is
//! filled once and never split, its separator goes into the branch being
//! filled one level up, and a full branch passes its own lowest key up in
//! turn. Memory is one page in progress per level and one batch of sealed
//! pages, whatever the data's size.
//!
//! Crash safety, in order:
//! 1. every page goes to numbers from the tree's end on, which nothing in
//!    the log since the last checkpoint can name (the end never shrinks);
//! 2. the pages are written and the data file synced;
//! 3. only then is one record appended and forced: the old root (an empty
//!    leaf) freed, and the meta values naming the new root and end.
//!
//! A crash before 3 is durable leaves the store empty (the pages past its
//! end are never read); after it, recovery replays the record onto pages
//! that are already home. A loaded page's later writes home go through
//! the double-write buffer, or (with full-page images) its first later
//! change logs its full image (a page fetched from disk has no image
//! epoch), so a torn write home is repaired as any other page's.

use super::*;
use crate::page::{branch_cell, Kind, Page, HEADER};
use crate::page::{OVERFLOW_PAYLOAD, PAGE_SIZE};
use crate::tree::Txn;
use crate::{MAX_KEY, MAX_VALUE};

/// How full a loaded page is filled, in percent of its cell space:
/// PostgreSQL's default B-tree leaf fillfactor. The rest is room for
/// inserts and longer values before the first split.
const FILL_PERCENT: usize = 90;

/// The cell bytes (slots included) a loaded page is filled to.
const BUDGET: usize = (PAGE_SIZE - HEADER) * FILL_PERCENT / 100;

/// Pages sealed before they are written, in one call.
const BATCH_PAGES: usize = 256;

/// What a bulk load wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadInfo {
    /// Keys loaded.
    pub keys: u64,
    /// Pages written (leaves, branches and overflow pages).
    pub pages: u64,
    /// Levels of the tree, leaves included (0: nothing was loaded).
    pub height: usize,
    /// The log record that made the tree the store's (durable).
    pub lsn: Lsn,
}

/// One level's page in progress.
#[derive(Default)]
struct Level {
    /// A branch's leftmost child (0: none yet; unused in leaves).
    link: PageNo,
    /// The lowest key under the page: its separator in the level above.
    low: Vec<u8>,
    cells: Vec<Vec<u8>>,
    /// Bytes the cells and their slots take.
    used: usize,
}

impl Level {
    fn fits(&self, cell: &[u8]) -> bool {
        self.cells.is_empty() || self.used + cell.len() + 2 <= BUDGET
    }

    fn push(&mut self, cell: Vec<u8>) {
        self.used += cell.len() + 2;
        self.cells.push(cell);
    }
}

/// A sorted bulk load in progress (see [`Store::bulk_load`]). Keys go in
/// with [`BulkLoad::push`], in strictly increasing order; nothing is the
/// store's until [`BulkLoad::finish`] returns. Dropped unfinished, it
/// leaves the store as it was (empty).
pub struct BulkLoad<'s> {
    inner: &'s Inner,
    /// Held from start to finish: nothing else reads or writes the tree
    /// meanwhile.
    tree: RwLockWriteGuard<'s, TreeMeta>,
    /// The next page number to use.
    next: PageNo,
    /// Sealed pages from `batch_first` on, not yet written.
    batch: Vec<u8>,
    batch_first: PageNo,
    /// The pageLSN of every loaded page: the log's end at the start.
    lsn: Lsn,
    leaf: Level,
    /// Branch levels, lowest first.
    branches: Vec<Level>,
    last: Option<Vec<u8>>,
    keys: u64,
    pages: u64,
}

impl std::fmt::Debug for BulkLoad<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkLoad")
            .field("keys", &self.keys)
            .field("pages", &self.pages)
            .finish_non_exhaustive()
    }
}

impl<'s> BulkLoad<'s> {
    /// Starts a load into the store of `inner`, which must hold no key.
    pub(super) fn start(inner: &'s Inner) -> Result<BulkLoad<'s>> {
        inner.check_writable()?;
        let tree = inner.write_tree();
        let root = inner.pool.fetch(tree.root, &inner.journal)?;
        if root.kind() != Some(Kind::Leaf) || root.count() != 0 {
            return Err(Error::NotEmpty);
        }
        let next = tree.end;
        Ok(BulkLoad {
            inner,
            tree,
            next,
            batch: Vec::with_capacity(BATCH_PAGES * PAGE_SIZE),
            batch_first: next,
            lsn: inner.journal.appended_lsn(),
            leaf: Level::default(),
            branches: Vec::new(),
            last: None,
            keys: 0,
            pages: 0,
        })
    }

    /// Adds `key` with `value`. `key` must sort after every key pushed
    /// before ([`Error::OutOfOrder`] otherwise: nothing of this call is
    /// kept, and the load may go on with a later key).
    pub fn push(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if key.len() > MAX_KEY {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: MAX_KEY,
            });
        }
        if value.len() > MAX_VALUE {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: MAX_VALUE,
            });
        }
        if self.last.as_deref().is_some_and(|l| key <= l) {
            return Err(Error::OutOfOrder);
        }
        let cell = crate::tree::cell_for(key, value, |v| self.write_overflow(v))?;
        if !self.leaf.fits(&cell) {
            self.flush_leaf()?;
        }
        if self.leaf.cells.is_empty() {
            self.leaf.low = key.to_vec();
        }
        self.leaf.push(cell);
        match &mut self.last {
            Some(l) => {
                l.clear();
                l.extend_from_slice(key);
            }
            None => self.last = Some(key.to_vec()),
        }
        self.keys += 1;
        Ok(())
    }

    /// Ends the load: the last pages written, the data file synced, and the
    /// tree made the store's by one forced log record. Durable on return.
    pub fn finish(mut self) -> Result<LoadInfo> {
        if self.keys == 0 {
            return Ok(LoadInfo {
                keys: 0,
                pages: 0,
                height: 0,
                lsn: self.inner.journal.appended_lsn(),
            });
        }
        self.flush_leaf()?;
        // Close each level's page into the one above, up to a level whose
        // page holds a single child: that child is the root.
        let mut level = 0;
        let root = loop {
            let l = &self.branches[level];
            if level + 1 == self.branches.len() && l.cells.is_empty() {
                break l.link;
            }
            self.flush_branch(level)?;
            level += 1;
        };
        self.write_batch()?;
        let inner = self.inner;
        // The pages are durable before a record can name them.
        inner.pool.sync_data()?;
        let mut hints = tree::InsertHints::default();
        let mut txn = Txn::new(&inner.pool, &inner.journal, *self.tree, true, &mut hints);
        if let Err(e) = txn.adopt(root, self.next) {
            txn.rollback();
            return Err(e);
        }
        let Some(lsn) = inner.log_txn(&mut self.tree, txn)? else {
            return Err(Error::Corrupt {
                page: root,
                reason: "a bulk load's record came out empty",
            });
        };
        let end = self.tree.end;
        drop(self.tree);
        inner
            .journal
            .commit(lsn)
            .map_err(|e| inner.poison_with(e.into()))?;
        inner.grow(end);
        Ok(LoadInfo {
            keys: self.keys,
            pages: self.pages,
            height: level + 1,
            lsn,
        })
    }

    fn alloc(&mut self) -> Result<PageNo> {
        let no = self.next;
        self.next = no.checked_add(1).ok_or(Error::Corrupt {
            page: no,
            reason: "the data file is full (2^32 pages)",
        })?;
        Ok(no)
    }

    /// Seals `page` (numbered `self.next - 1`: pages are emitted in the
    /// order their numbers were taken) into the batch.
    fn emit(&mut self, mut page: Page) -> Result<()> {
        debug_assert_eq!(
            u64::from(page.number()),
            u64::from(self.batch_first) + (self.batch.len() / PAGE_SIZE) as u64
        );
        page.set_lsn(self.lsn);
        page.seal_onto(&mut self.batch);
        self.pages += 1;
        if self.batch.len() >= BATCH_PAGES * PAGE_SIZE {
            self.write_batch()?;
        }
        Ok(())
    }

    fn write_batch(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let inner = self.inner;
        inner
            .pool
            .write_data(&self.batch, pages_bytes(u64::from(self.batch_first)))?;
        self.batch_first += (self.batch.len() / PAGE_SIZE) as PageNo;
        self.batch.clear();
        Ok(())
    }

    /// Writes `value` as a chain of overflow pages; its first page.
    fn write_overflow(&mut self, value: &[u8]) -> Result<PageNo> {
        let first = self.next;
        let n = value.chunks(OVERFLOW_PAYLOAD).count();
        for (i, chunk) in value.chunks(OVERFLOW_PAYLOAD).enumerate() {
            let no = self.alloc()?;
            let next = if i + 1 < n { no + 1 } else { 0 };
            self.emit(Page::overflow(no, chunk, next))?;
        }
        Ok(first)
    }

    /// Writes the leaf in progress and hands its separator up.
    fn flush_leaf(&mut self) -> Result<()> {
        if self.leaf.cells.is_empty() {
            return Ok(());
        }
        let no = self.alloc()?;
        self.emit(Page::from_cells(no, Kind::Leaf, 0, &self.leaf.cells))?;
        let low = std::mem::take(&mut self.leaf.low);
        self.leaf.cells.clear();
        self.leaf.used = 0;
        self.add_child(0, low, no)
    }

    /// Adds `child`, whose keys start at `low`, to branch level `level`.
    fn add_child(&mut self, level: usize, low: Vec<u8>, child: PageNo) -> Result<()> {
        if self.branches.len() == level {
            self.branches.push(Level::default());
        }
        if self.branches[level].link == 0 {
            let l = &mut self.branches[level];
            l.link = child;
            l.low = low;
            return Ok(());
        }
        let cell = branch_cell(&low, child);
        if !self.branches[level].fits(&cell) {
            self.flush_branch(level)?;
            let l = &mut self.branches[level];
            l.link = child;
            l.low = low;
            return Ok(());
        }
        self.branches[level].push(cell);
        Ok(())
    }

    /// Writes level `level`'s page in progress and hands its separator
    /// up.
    fn flush_branch(&mut self, level: usize) -> Result<()> {
        let no = self.alloc()?;
        let l = std::mem::take(&mut self.branches[level]);
        self.emit(Page::from_cells(no, Kind::Branch, l.link, &l.cells))?;
        self.add_child(level + 1, l.low, no)
    }
}
