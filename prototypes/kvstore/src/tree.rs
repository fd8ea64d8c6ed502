//! The B+tree: lookups for readers, and a transaction's changes — leaf
//! puts and removes, splits, overflow chains, the free list — gathered
//! with the log operations that redo them (see `record.rs`).
//!
//! A leaf change is logged as its cell operation; anything structural (a
//! split, a page allocated or freed, a branch changed) logs the image of
//! the page after it. All of a transaction's operations go in one record,
//! so a split replays whole. A leaf a delete leaves under a quarter full
//! is merged into a neighbour under the same parent if together they fill
//! at most three quarters (InnoDB merges below its MERGE_THRESHOLD the
//! same way; the gap to a split's half-full pages keeps the two from
//! undoing each other); a page that empties is freed. A store that shrinks
//! reuses the freed pages through the free list: trunk pages listing free
//! pages, which are neither read nor written while free (SQLite's). Branches
//! are not merged, only freed when empty.

use crate::page::{
    leaf_cell, Kind, Page, PageNo, Value, FIRST_PAGE, HEADER, MAX_INLINE_CELL, OVERFLOW_PAYLOAD,
    PAGE_SIZE,
};
use crate::pool::{Before, Pool};
use crate::record::LogOp;
use crate::{Error, Result};
use journal_core::Journal;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

mod free;
mod prepared;
mod split;
pub(crate) use prepared::{prepare_put, PreparedPut};
pub(crate) use split::InsertHints;

/// The deepest tree a lookup follows: a deeper path is a cycle or damage.
pub(crate) const MAX_HEIGHT: usize = 24;

/// A leaf a delete leaves with less than this many bytes of cells (a
/// quarter of its space) is merged into a neighbour, if together they
/// fill at most [`MERGE_UP_TO`].
const MERGE_BELOW: usize = (PAGE_SIZE - HEADER) / 4;
/// The fullest a merged leaf may be: three quarters, so that a merge is
/// not undone by the next few inserts, nor a split by the next few
/// deletes (the gap between a half-full split and a quarter-full merge).
const MERGE_UP_TO: usize = (PAGE_SIZE - HEADER) * 3 / 4;

/// Bytes of a page's cells and slots.
fn used(p: &Page) -> usize {
    PAGE_SIZE - HEADER - p.free_space()
}

/// The tree's shape, as the meta page and the log's meta operations hold
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TreeMeta {
    /// The root page.
    pub root: PageNo,
    /// The first page number never used.
    pub end: PageNo,
    /// The first free page (0: none).
    pub free_head: PageNo,
}

fn corrupt(page: PageNo, reason: &'static str) -> Error {
    Error::Corrupt { page, reason }
}

/// One step of a path from the root: the page, and for a branch the
/// position of the child taken.
pub(crate) type Step = (PageNo, Arc<Page>, usize);

/// The path from the root to the leaf that holds (or would hold) `key`,
/// fetching pages with `fetch`.
pub(crate) fn descend(
    root: PageNo,
    end: PageNo,
    key: &[u8],
    mut fetch: impl FnMut(PageNo) -> Result<Arc<Page>>,
) -> Result<Vec<Step>> {
    let mut path = Vec::with_capacity(8);
    let mut no = root;
    loop {
        if !(FIRST_PAGE..end).contains(&no) {
            return Err(corrupt(no, "a page pointer outside the file"));
        }
        if path.len() >= MAX_HEIGHT {
            return Err(corrupt(no, "a path deeper than any tree (a cycle?)"));
        }
        let page = fetch(no)?;
        match page.kind() {
            Some(Kind::Leaf) => {
                path.push((no, page, 0));
                return Ok(path);
            }
            Some(Kind::Branch) => {
                let j = page.child_for(key);
                let child = page.nth_child(j);
                path.push((no, page, j));
                no = child;
            }
            _ => return Err(corrupt(no, "a tree pointer to a page that is not a node")),
        }
    }
}

/// The value of `key`: a descent, then the leaf's cell and its overflow
/// chain, all fetched with `fetch`.
pub(crate) fn lookup(
    root: PageNo,
    end: PageNo,
    key: &[u8],
    mut fetch: impl FnMut(PageNo) -> Result<Arc<Page>>,
) -> Result<Option<Vec<u8>>> {
    let path = descend(root, end, key, &mut fetch)?;
    let leaf = &path[path.len() - 1].1;
    match leaf.search(key) {
        Ok(i) => Ok(Some(read_value(leaf, i, end, fetch)?)),
        Err(_) => Ok(None),
    }
}

/// Where the value of a key lies: in its leaf, or in an overflow chain.
pub(crate) enum Found {
    /// The value, copied from the leaf.
    Inline(Vec<u8>),
    /// A chain of `len` bytes from page `first`, named by a cell of leaf
    /// `leaf` as of its pageLSN `lsn`. The chain cannot change while that
    /// cell stands: a writer frees it only by changing the leaf.
    Overflow {
        leaf: PageNo,
        lsn: journal_core::Lsn,
        first: PageNo,
        len: usize,
    },
}

/// The cell of `key`, without reading an overflow chain.
pub(crate) fn find(
    root: PageNo,
    end: PageNo,
    key: &[u8],
    fetch: impl FnMut(PageNo) -> Result<Arc<Page>>,
) -> Result<Option<Found>> {
    let path = descend(root, end, key, fetch)?;
    let (no, leaf, _) = &path[path.len() - 1];
    let Ok(i) = leaf.search(key) else {
        return Ok(None);
    };
    Ok(Some(match leaf.value(i) {
        Value::Inline(v) => Found::Inline(v.to_vec()),
        Value::Overflow { len, first } => Found::Overflow {
            leaf: *no,
            lsn: leaf.lsn(),
            first,
            len: len as usize,
        },
    }))
}

/// Reads the value of leaf cell `i`, following its overflow chain.
pub(crate) fn read_value(
    leaf: &Page,
    i: usize,
    end: PageNo,
    mut fetch: impl FnMut(PageNo) -> Result<Arc<Page>>,
) -> Result<Vec<u8>> {
    match leaf.value(i) {
        Value::Inline(v) => Ok(v.to_vec()),
        Value::Overflow { len, first } => {
            let len = len as usize;
            if len > crate::MAX_VALUE {
                return Err(corrupt(leaf.number(), "a value longer than any value"));
            }
            let mut out = Vec::with_capacity(len);
            let mut no = first;
            while out.len() < len {
                if !(FIRST_PAGE..end).contains(&no) {
                    return Err(corrupt(no, "an overflow pointer outside the file"));
                }
                let p = fetch(no)?;
                if p.kind() != Some(Kind::Overflow) || p.payload().is_empty() {
                    return Err(corrupt(
                        no,
                        "an overflow chain through a page that is not one",
                    ));
                }
                let take = p.payload().len().min(len - out.len());
                out.extend_from_slice(&p.payload()[..take]);
                no = p.link();
            }
            Ok(out)
        }
    }
}

/// The leaf cell of `key` and `value`: the value inline if the cell stays
/// within a leaf's share ([`MAX_INLINE_CELL`]), else the first page of the
/// overflow chain `write_overflow` writes it to.
pub(crate) fn cell_for(
    key: &[u8],
    value: &[u8],
    write_overflow: impl FnOnce(&[u8]) -> Result<PageNo>,
) -> Result<Vec<u8>> {
    if 7 + key.len() + value.len() <= MAX_INLINE_CELL {
        return Ok(leaf_cell(key, Value::Inline(value)));
    }
    let first = write_overflow(value)?;
    Ok(leaf_cell(
        key,
        Value::Overflow {
            len: value.len() as u32,
            first,
        },
    ))
}

/// A page a transaction changed: the operations that redo the change on
/// it (`None`: structural, logged as its image), its image epoch before
/// the transaction, and its latest copy.
struct Touched {
    ops: Option<Vec<LogOp>>,
    image_epoch: u64,
    page: Arc<Page>,
}

/// A transaction's changes in progress (under the tree's write lock).
///
/// It reads only pages the pool holds (unless `allow_io`): a miss is
/// noted in `missing` and fails the transaction, which the caller rolls
/// back, fetches the page without the tree lock and runs again — so the
/// tree lock is never held across a read from disk.
pub(crate) struct Txn<'a> {
    pool: &'a Pool,
    journal: &'a Journal,
    pub(crate) meta: TreeMeta,
    orig_meta: TreeMeta,
    touched: BTreeMap<PageNo, Touched>,
    /// The pages read, as read (the committed versions: writers hold the
    /// tree lock), for the snapshots that may still read one the pool
    /// evicted before the transaction replaced it.
    read: HashMap<PageNo, Arc<Page>>,
    before: Vec<(PageNo, Before)>,
    allow_io: bool,
    /// The page whose absence from the pool stopped the transaction.
    pub(crate) missing: Option<PageNo>,
    /// Where recent inserts went (a hint for splits; not logged).
    hints: &'a mut InsertHints,
}

impl<'a> Txn<'a> {
    /// A transaction on the tree `meta`.
    pub(crate) fn new(
        pool: &'a Pool,
        journal: &'a Journal,
        meta: TreeMeta,
        allow_io: bool,
        hints: &'a mut InsertHints,
    ) -> Self {
        Txn {
            pool,
            journal,
            meta,
            orig_meta: meta,
            touched: BTreeMap::new(),
            read: HashMap::new(),
            before: Vec::new(),
            allow_io,
            missing: None,
            hints,
        }
    }

    /// Page `no`: from the transaction's own copy, the pool, or (only with
    /// `allow_io`) the disk; remembered in `read` if the transaction may
    /// write it.
    fn get(&mut self, no: PageNo, may_write: bool) -> Result<Arc<Page>> {
        if let Some(t) = self.touched.get(&no) {
            return Ok(t.page.clone());
        }
        let p = if self.allow_io {
            self.pool.fetch(no, self.journal)?
        } else {
            match self.pool.with_cached(|look| look(no)) {
                Some(p) => p,
                None => {
                    self.missing = Some(no);
                    return Err(Error::Closed);
                }
            }
        };
        if may_write {
            self.read.insert(no, p.clone());
        }
        Ok(p)
    }

    /// Page `no`, which the transaction may change.
    fn read(&mut self, no: PageNo) -> Result<Arc<Page>> {
        self.read_opt(no, true)
    }

    fn read_opt(&mut self, no: PageNo, may_write: bool) -> Result<Arc<Page>> {
        if !(FIRST_PAGE..self.meta.end).contains(&no) {
            return Err(corrupt(no, "a page pointer outside the file"));
        }
        self.get(no, may_write)
    }

    fn write(&mut self, no: PageNo, page: Page, op: Option<LogOp>) {
        let read = match self.touched.contains_key(&no) {
            true => None,
            false => self.read.get(&no),
        };
        let (before, image_epoch, page) = self.pool.put(no, page, read);
        match self.touched.get_mut(&no) {
            Some(t) => {
                t.page = page;
                match (&mut t.ops, op) {
                    (Some(list), Some(op)) => list.push(op),
                    (ops, _) => *ops = None,
                }
            }
            None => {
                self.before.push((no, before));
                self.touched.insert(
                    no,
                    Touched {
                        ops: op.map(|o| vec![o]),
                        image_epoch,
                        page,
                    },
                );
            }
        }
    }

    fn descend(&mut self, key: &[u8]) -> Result<Vec<Step>> {
        let (root, end) = (self.meta.root, self.meta.end);
        if self.allow_io {
            return descend(root, end, key, |no| self.get(no, true));
        }
        let touched = &self.touched;
        let mut missing = None;
        let r = self.pool.with_cached(|look| {
            descend(root, end, key, |no| {
                if let Some(t) = touched.get(&no) {
                    return Ok(t.page.clone());
                }
                look(no).ok_or_else(|| {
                    missing = Some(no);
                    Error::Closed
                })
            })
        });
        if missing.is_some() {
            self.missing = missing;
        }
        if let Ok(path) = &r {
            for (no, page, _) in path {
                if !self.touched.contains_key(no) {
                    self.read.insert(*no, page.clone());
                }
            }
        }
        r
    }

    fn write_overflow(&mut self, value: &[u8]) -> Result<PageNo> {
        let chunks: Vec<&[u8]> = value.chunks(OVERFLOW_PAYLOAD).collect();
        let mut nos = Vec::with_capacity(chunks.len());
        for _ in &chunks {
            nos.push(self.alloc()?);
        }
        // In ascending order: pages taken off the free list come in the
        // reverse of their freeing, so a freed chain's pages make a
        // consecutive run again, which a reader reads in one call.
        nos.sort_unstable();
        for (i, chunk) in chunks.iter().enumerate() {
            let next = nos.get(i + 1).copied().unwrap_or(0);
            let page = Page::overflow_on(self.pool.buffer(), nos[i], chunk, next);
            self.write(nos[i], page, None);
        }
        Ok(nos[0])
    }

    fn free_value(&mut self, leaf: &Page, i: usize) -> Result<()> {
        let Value::Overflow { len, first } = leaf.value(i) else {
            return Ok(());
        };
        let pages = (len as usize).div_ceil(OVERFLOW_PAYLOAD);
        let mut no = first;
        for _ in 0..pages {
            // (Read for its link only: freed, not written, so not kept —
            // a chain of a thousand values would otherwise stay in memory
            // for the whole transaction.)
            let p = self.read_opt(no, false)?;
            if p.kind() != Some(Kind::Overflow) {
                return Err(corrupt(
                    no,
                    "an overflow chain through a page that is not one",
                ));
            }
            let next = p.link();
            self.free(no)?;
            no = next;
        }
        Ok(())
    }

    /// Inserts or replaces `key`.
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let path = self.descend(key)?;
        let cell = cell_for(key, value, |v| self.write_overflow(v))?;
        let (leaf_no, leaf, _) = &path[path.len() - 1];
        let leaf_no = *leaf_no;
        let mut page = self.pool.copy(leaf);
        let (pos, replace) = match page.search(key) {
            Ok(i) => (i, true),
            Err(i) => (i, false),
        };
        if replace {
            self.free_value(&page, pos)?;
        }
        if page.put_cell(pos, &cell, replace) {
            self.write_leaf_put(leaf_no, page, cell, pos, replace);
            return Ok(());
        }
        if replace {
            // The old cell goes first (logged); then the new one is an
            // insert that splits.
            let key = key.to_vec();
            page.remove_cell(pos);
            self.write(
                leaf_no,
                page.clone(),
                Some(LogOp::Delete { page: leaf_no, key }),
            );
        }
        self.split_leaf(&path, page, pos, cell)
    }

    /// Writes leaf `leaf_no` as `page`, which took `cell` at `pos` in
    /// place (no split), logged as the cell's put.
    fn write_leaf_put(
        &mut self,
        leaf_no: PageNo,
        page: Page,
        cell: Vec<u8>,
        pos: usize,
        replace: bool,
    ) {
        if !replace {
            self.hints.note(leaf_no, pos);
        }
        let op = LogOp::Put {
            page: leaf_no,
            cell,
        };
        self.write(leaf_no, page, Some(op));
    }

    /// Removes `key`; `false` if it was absent (nothing changes).
    pub(crate) fn delete(&mut self, key: &[u8]) -> Result<bool> {
        let path = self.descend(key)?;
        let (leaf_no, leaf, _) = &path[path.len() - 1];
        let leaf_no = *leaf_no;
        let Ok(i) = leaf.search(key) else {
            return Ok(false);
        };
        let mut page = self.pool.copy(leaf);
        self.free_value(&page, i)?;
        page.remove_cell(i);
        if page.count() == 0 && path.len() > 1 {
            self.free(leaf_no)?;
            self.remove_child(&path, path.len() - 2)?;
        } else if path.len() > 1 && used(&page) < MERGE_BELOW && self.merge(&path, &page)? {
            // Merged with a neighbour (logged as images).
        } else {
            let op = LogOp::Delete {
                page: leaf_no,
                key: key.to_vec(),
            };
            self.write(leaf_no, page, Some(op));
        }
        Ok(true)
    }

    /// Merges the leaf at the end of `path` (now `page`) with its left
    /// neighbour under the same parent (the right one if it is the first
    /// child) when both fit in [`MERGE_UP_TO`]: the right page's cells go
    /// to the end of the left one, the right page is freed and its
    /// separator leaves the parent (which may empty, or make a one-child
    /// root go). `false`: no neighbour, or they do not fit; nothing
    /// changed. All of it is logged as page images, so it replays whole.
    fn merge(&mut self, path: &[Step], page: &Page) -> Result<bool> {
        let leaf_no = path[path.len() - 1].0;
        let (_, parent, j) = &path[path.len() - 2];
        let j = *j;
        let (sibling_no, this_left) = if j > 0 {
            (parent.nth_child(j - 1), false)
        } else if j < parent.count() {
            (parent.nth_child(j + 1), true)
        } else {
            return Ok(false);
        };
        let sibling = self.read(sibling_no)?;
        if sibling.kind() != Some(Kind::Leaf) {
            return Err(corrupt(sibling_no, "a leaf's neighbour is not a leaf"));
        }
        if used(page) + used(&sibling) > MERGE_UP_TO {
            return Ok(false);
        }
        let (left_no, left, right_no, right) = if this_left {
            (leaf_no, page, sibling_no, &*sibling)
        } else {
            (sibling_no, &*sibling, leaf_no, page)
        };
        let mut cells = left.cells();
        cells.extend(right.cells());
        self.write(
            left_no,
            self.pool.new_page(left_no, Kind::Leaf, 0, &cells),
            None,
        );
        self.free(right_no)?;
        // The parent's step, moved to the right page: its separator goes.
        let mut up: Vec<Step> = path[..path.len() - 1].to_vec();
        let last = up.len() - 1;
        up[last].2 = if this_left { j + 1 } else { j };
        self.remove_child(&up, last)?;
        Ok(true)
    }

    /// `path[level]`, a branch, loses the child its step took (freed).
    fn remove_child(&mut self, path: &[Step], level: usize) -> Result<()> {
        let (bno, branch, j) = &path[level];
        let (bno, j) = (*bno, *j);
        let mut page = self.pool.copy(branch);
        if j == 0 {
            if page.count() == 0 {
                if level == 0 {
                    // The last child of the root: the tree is empty.
                    let empty = self.pool.new_page::<&[u8]>(bno, Kind::Leaf, 0, &[]);
                    self.write(bno, empty, None);
                    return Ok(());
                }
                self.free(bno)?;
                return self.remove_child(path, level - 1);
            }
            page.set_link(page.child(0));
            page.remove_cell(0);
        } else {
            page.remove_cell(j - 1);
        }
        if level == 0 && page.count() == 0 {
            // A root with one child: the child becomes the root.
            self.meta.root = page.link();
            return self.free(bno);
        }
        self.write(bno, page, None);
        Ok(())
    }

    /// Makes the tree a bulk load wrote the store's: `root`, with every
    /// page below `end` (the pages from the old end on are the load's,
    /// already durable). The old root, an empty leaf, goes to the free
    /// list. Logged as the free-list trunk's image and the meta values.
    pub(crate) fn adopt(&mut self, root: PageNo, end: PageNo) -> Result<()> {
        let old = self.meta.root;
        self.meta.end = end;
        self.free(old)?;
        self.meta.root = root;
        Ok(())
    }

    /// The log operations of the transaction: per page touched, its image
    /// (structural change, or its first change since checkpoint `epoch`
    /// began) or its leaf operations; then the meta values if they
    /// changed. Also the pages to stamp, with whether each was imaged.
    /// It lets go of its copies, so that the pool's frames hold the only
    /// references and [`Pool::stamp`] changes them in place.
    pub(crate) fn finish(&mut self, epoch: u64) -> (Vec<LogOp>, Vec<(PageNo, bool)>) {
        let mut ops = Vec::new();
        let mut stamp = Vec::with_capacity(self.touched.len());
        for (no, t) in std::mem::take(&mut self.touched) {
            match t.ops {
                Some(list) if t.image_epoch >= epoch => {
                    ops.extend(list);
                    stamp.push((no, false));
                }
                _ => {
                    ops.push(LogOp::Whole(t.page));
                    stamp.push((no, true));
                }
            }
        }
        if self.meta != self.orig_meta {
            ops.push(LogOp::Meta {
                root: self.meta.root,
                end: self.meta.end,
                free_head: self.meta.free_head,
            });
        }
        (ops, stamp)
    }

    /// Undoes every page change (the record was not appended).
    pub(crate) fn rollback(mut self) {
        self.undo();
    }

    /// The record was appended and its pages stamped: the changes are the
    /// tree's, nothing is undone when the transaction goes.
    pub(crate) fn committed(mut self) {
        self.before.clear();
    }

    fn undo(&mut self) {
        for (no, before) in std::mem::take(&mut self.before).into_iter().rev() {
            self.pool.restore(no, before);
        }
    }
}

/// A transaction dropped without [`Txn::committed`] — by an error path
/// that forgot it, or by a panic unwinding through the combiner — is rolled
/// back: its pages are unpinned and their frames restored, so a checkpoint
/// waiting for pinned pages, and every later writer, goes on.
impl Drop for Txn<'_> {
    fn drop(&mut self) {
        self.undo();
    }
}
