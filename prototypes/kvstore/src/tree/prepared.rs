//! Puts prepared by their committers before the combiner, without the
//! tree lock, and taken by the combiner if the tree has not moved since.

use super::{descend, Step, Txn};
use crate::page::{leaf_cell, Page, PageNo, Value, MAX_INLINE_CELL};
use crate::pool::Pool;
use crate::Error;
use journal_core::Journal;

/// A put made ready by its committer, before the combiner and without
/// the tree lock ([`prepare_put`]): the path it descended from `root`,
/// and a copy of the leaf with the cell in place. The combiner applies it
/// only if the tree is still as it was ([`Txn::put_prepared`]). What it
/// gains is where leaves miss the cache: the committer fetches them, so
/// the put does not enter the combiner, miss, roll back and queue again
/// (+17–22 % at 64 clients at a million keys). On an empty store it
/// shortens the combiner's section without raising the rate
/// (docs/PERFORMANCE.md, "Puts prepared before the combiner").
pub(crate) struct PreparedPut {
    root: PageNo,
    path: Vec<Step>,
    page: Page,
    cell: Vec<u8>,
    pos: usize,
    replace: bool,
}

/// Prepares the put of `key` and `value` in the tree at `root` (as last
/// published: it may be stale, and the pages seen may be those of a
/// transaction still in progress; the combiner checks). Pages missing
/// from the pool are fetched, a few times at most. `None` when the put
/// needs more than its leaf (a split, an overflow chain to write or to
/// free), or on any error: the combiner then puts it the usual way, and
/// reports what is wrong.
pub(crate) fn prepare_put(
    pool: &Pool,
    journal: &Journal,
    root: PageNo,
    end: PageNo,
    key: &[u8],
    value: &[u8],
) -> Option<PreparedPut> {
    if 7 + key.len() + value.len() > MAX_INLINE_CELL {
        return None;
    }
    let mut path = None;
    for _ in 0..4 {
        let mut missing = None;
        let r = pool.with_cached(|look| {
            descend(root, end, key, |no| {
                look(no).ok_or_else(|| {
                    missing = Some(no);
                    Error::Closed
                })
            })
        });
        match (r, missing) {
            (Ok(p), _) => {
                path = Some(p);
                break;
            }
            (Err(_), Some(no)) => {
                pool.fetch(no, journal).ok()?;
            }
            (Err(_), None) => return None,
        }
    }
    let path = path?;
    let leaf = &path.last()?.1;
    let (pos, replace) = match leaf.search(key) {
        Ok(i) => (i, true),
        Err(i) => (i, false),
    };
    if replace && matches!(leaf.value(pos), Value::Overflow { .. }) {
        return None;
    }
    let cell = leaf_cell(key, Value::Inline(value));
    let mut page = pool.copy(leaf);
    if !page.put_cell(pos, &cell, replace) {
        return None;
    }
    Some(PreparedPut {
        root,
        path,
        page,
        cell,
        pos,
        replace,
    })
}

impl Txn<'_> {
    /// Applies a put its committer prepared, if the tree is as it was
    /// then: the same root, and every page of the path the version the
    /// pool holds now. That is enough for the descent to be the same: a
    /// change replaces a page's version (`Pool::put`), and the one change
    /// made in place, a stamp, happens only to a version no one else
    /// holds, while the prepared path holds every version it saw (so none
    /// can be freed and another put at its address). `false`: the tree
    /// moved, nothing changed, and the caller puts the usual way.
    pub(crate) fn put_prepared(&mut self, prep: PreparedPut) -> bool {
        let PreparedPut {
            root,
            mut path,
            page,
            cell,
            pos,
            replace,
        } = prep;
        let current = root == self.meta.root
            && self.touched.is_empty()
            && self
                .pool
                .is_current(path.iter().map(|(no, page, _)| (*no, page)));
        let leaf = path.pop().filter(|_| current);
        drop(path);
        let Some((leaf_no, leaf, _)) = leaf else {
            return false;
        };
        self.read.insert(leaf_no, leaf);
        self.write_leaf_put(leaf_no, page, cell, pos, replace);
        true
    }
}
