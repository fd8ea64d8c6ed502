//! Lazy, consistent range iterators.
//!
//! An iterator reads the tree as of the snapshot taken when it was made:
//! the LSN of the last transaction applied then. A page whose LSN is above
//! it was changed since, and the iterator reads the version the pool kept
//! for it (see `pool.rs`). It holds the path from the root to its leaf —
//! O(tree height) pages, as `Arc`s, not frames — and no lock between
//! steps, so writers never wait for it. The versions kept for open
//! snapshots stay in memory up to a quarter of the cache (taking their
//! room from it) and are spilled to a scratch file beyond it
//! (`pool/versions.rs`); past the spill bound
//! the oldest snapshot expires and its iterator ends with
//! [`crate::Error::SnapshotTooOld`].

use super::*;
use crate::page::Page;
use crate::pool::SnapshotHandle;
use crate::tree::MAX_HEIGHT;
use std::ops::Bound;

/// The first key after every key that starts with `prefix` (`None`: no
/// such key: the prefix is empty or all 0xff). raftkv bounds its prefix
/// reads with it.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

struct Position {
    /// Branches from the root, each with the next child to visit.
    stack: Vec<(Arc<Page>, usize)>,
    leaf: Arc<Page>,
    pos: usize,
}

/// An iterator over a range of the store as of one snapshot (see
/// [`Store::range`]). Yields `(key, value)` in key order; an error ends it.
pub struct Iter {
    inner: Arc<Inner>,
    snap: SnapshotHandle,
    root: PageNo,
    file_end: PageNo,
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    at: Option<Position>,
    last: Option<Vec<u8>>,
    done: bool,
}

impl std::fmt::Debug for Iter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iter")
            .field("snapshot", &self.snap.lsn())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

fn corrupt(page: PageNo, reason: &'static str) -> Error {
    Error::Corrupt { page, reason }
}

impl Iter {
    pub(super) fn new(inner: Arc<Inner>, start: Bound<Vec<u8>>, end: Bound<Vec<u8>>) -> Iter {
        let (snap, root, file_end) = {
            let tree = inner.read_tree();
            let lsn = Lsn(inner.applied.load(Ordering::Acquire));
            (inner.pool.open_snapshot(lsn), tree.root, tree.end)
        };
        Iter {
            inner,
            snap,
            root,
            file_end,
            start,
            end,
            at: None,
            last: None,
            done: false,
        }
    }

    /// The snapshot's LSN: the iterator sees every transaction up to it.
    pub fn snapshot_lsn(&self) -> Lsn {
        self.snap.lsn()
    }

    fn fetch(&self, no: PageNo) -> Result<Arc<Page>> {
        if !(crate::page::FIRST_PAGE..self.file_end).contains(&no) {
            return Err(corrupt(no, "a page pointer outside the file"));
        }
        self.inner
            .pool
            .fetch_at(no, &self.snap, &self.inner.journal)
    }

    /// Descends from `no` to a leaf, by `key` (or leftmost), pushing the
    /// branches passed.
    fn descend(
        &self,
        mut no: PageNo,
        key: Option<&[u8]>,
        stack: &mut Vec<(Arc<Page>, usize)>,
    ) -> Result<Arc<Page>> {
        loop {
            if stack.len() >= MAX_HEIGHT {
                return Err(corrupt(no, "a path deeper than any tree (a cycle?)"));
            }
            let page = self.fetch(no)?;
            match page.kind() {
                Some(crate::page::Kind::Leaf) => return Ok(page),
                Some(crate::page::Kind::Branch) => {
                    let j = key.map_or(0, |k| page.child_for(k));
                    no = page.nth_child(j);
                    stack.push((page, j + 1));
                }
                _ => return Err(corrupt(no, "a tree pointer to a page that is not a node")),
            }
        }
    }

    fn seek(&mut self) -> Result<()> {
        let mut stack = Vec::new();
        let key = match &self.start {
            Bound::Included(k) | Bound::Excluded(k) => Some(k.as_slice()),
            Bound::Unbounded => None,
        };
        let leaf = self.descend(self.root, key, &mut stack)?;
        let pos = match &self.start {
            Bound::Included(k) => leaf.search(k).unwrap_or_else(|i| i),
            Bound::Excluded(k) => leaf.search(k).map_or_else(|i| i, |i| i + 1),
            Bound::Unbounded => 0,
        };
        self.at = Some(Position { stack, leaf, pos });
        Ok(())
    }

    /// Moves to the next leaf; `false` at the end of the tree.
    fn next_leaf(&mut self) -> Result<bool> {
        let Some(mut at) = self.at.take() else {
            return Ok(false);
        };
        loop {
            let Some((branch, j)) = at.stack.last_mut() else {
                return Ok(false);
            };
            if *j > branch.count() {
                at.stack.pop();
                continue;
            }
            let child = branch.nth_child(*j);
            *j += 1;
            at.leaf = self.descend(child, None, &mut at.stack)?;
            at.pos = 0;
            self.at = Some(at);
            return Ok(true);
        }
    }

    fn step(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.inner.check()?;
        if self.at.is_none() {
            self.seek()?;
        }
        loop {
            let Some(at) = &mut self.at else {
                return Ok(None);
            };
            if at.pos < at.leaf.count() {
                let (leaf, i) = (at.leaf.clone(), at.pos);
                at.pos += 1;
                let key = leaf.key(i);
                let past = match &self.end {
                    Bound::Included(e) => key > e.as_slice(),
                    Bound::Excluded(e) => key >= e.as_slice(),
                    Bound::Unbounded => false,
                };
                if past {
                    return Ok(None);
                }
                if self.last.as_deref().is_some_and(|l| l >= key) {
                    return Err(corrupt(leaf.number(), "keys out of order across pages"));
                }
                // A long value in runs around the pool if every page read
                // is the snapshot's version (the usual case); else page by
                // page through the snapshot's versions.
                let chain = match leaf.value(i) {
                    crate::page::Value::Overflow { len, first } => self
                        .inner
                        .read_chain(first, len as usize, self.file_end, Some(self.snap.lsn()))
                        .ok(),
                    crate::page::Value::Inline(_) => None,
                };
                let value = match chain {
                    Some(v) => v,
                    None => tree::read_value(&leaf, i, self.file_end, |no| self.fetch(no))?,
                };
                self.last = Some(key.to_vec());
                return Ok(Some((key.to_vec(), value)));
            }
            if !self.next_leaf()? {
                return Ok(None);
            }
        }
    }
}

impl Iterator for Iter {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
            self.at = None;
            self.inner.pool.close_snapshot(&self.snap);
        }
        r
    }
}

impl Drop for Iter {
    fn drop(&mut self) {
        self.inner.pool.close_snapshot(&self.snap);
    }
}
