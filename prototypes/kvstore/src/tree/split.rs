//! Splits: a leaf with no room for a cell, and the branches above it.
//!
//! A split works on the cells of the page as borrowed slices (one copy,
//! into the new pages), and a cell appended past a leaf's last one — a
//! sequential load, or writers each appending in a key range of their
//! own — starts the new right leaf alone: the left one is not touched, so
//! it is neither copied nor logged. A leaf taking ascending keys in its
//! middle (writers appending each in a key range of its own, where the
//! next range's first keys share the leaf) splits at the insert, the new
//! cell last on the left (InnoDB's split by insert direction): the next
//! keys then append past the left leaf's end, instead of halving the same
//! leaf again and again with half a page logged each time. Which leaf
//! takes ascending keys is an in-memory hint ([`InsertHints`]), never
//! logged: a wrong or lost hint only changes where a split falls.

use super::{Step, Txn};
use crate::page::{branch_cell, Kind, Page, PageNo};
use crate::record::LogOp;
use crate::Result;

impl Txn<'_> {
    /// Splits the leaf at the end of `path` (`page`, which has no room for
    /// `cell` at `pos`). Appending at a leaf's end splits there (a
    /// sequential load fills its pages); anything else splits the bytes
    /// in half. Logged as the right page's image, the left's truncation
    /// (and the put, if the cell lands left) and the parent's new cell.
    pub(super) fn split_leaf(
        &mut self,
        path: &[Step],
        mut page: Page,
        pos: usize,
        cell: Vec<u8>,
    ) -> Result<()> {
        let leaf_no = path[path.len() - 1].0;
        if pos == page.count() && pos > 0 {
            // Past the last cell: the new cell alone starts the right page
            // and its key is the separator; the left page stays as it is.
            let right_no = self.alloc()?;
            let right = self.pool.new_page(right_no, Kind::Leaf, 0, &[&cell[..]]);
            let sep = right.key(0).to_vec();
            self.hints.note(right_no, 0);
            self.write(right_no, right, None);
            return self.insert_separator(path, path.len() - 1, &sep, right_no);
        }
        let ascending = self.hints.ascending(leaf_no, pos);
        let (right_no, right, sep, mid) = {
            let mut cells = page.cells();
            // The cells from `pos` on move right; the new one fits on the
            // left when they free at least its bytes.
            let moved: usize = cells[pos..].iter().map(|c| c.len() + 2).sum();
            let at_insert = ascending && moved >= cell.len() + 2;
            cells.insert(pos, &cell);
            let mid = match at_insert {
                true => pos + 1,
                false => split_point(&cells),
            };
            let right_no = self.alloc()?;
            let right = self.pool.new_page(right_no, Kind::Leaf, 0, &cells[mid..]);
            let sep = right.key(0).to_vec();
            (right_no, right, sep, mid)
        };
        page.truncate_from(&sep);
        let op = LogOp::Truncate {
            page: leaf_no,
            key: sep.clone(),
        };
        if pos < mid {
            self.hints.note(leaf_no, pos);
            self.write(leaf_no, self.pool.copy(&page), Some(op));
            let fit = page.put_cell(pos, &cell, false);
            debug_assert!(fit, "the left half has room for the new cell");
            let op = LogOp::Put {
                page: leaf_no,
                cell,
            };
            self.write(leaf_no, page, Some(op));
        } else {
            self.write(leaf_no, page, Some(op));
        }
        self.write(right_no, right, None);
        self.insert_separator(path, path.len() - 1, &sep, right_no)
    }

    /// After `path[level]` split, adds `right` (keys from `sep` on) to its
    /// parent, splitting upwards as needed.
    fn insert_separator(
        &mut self,
        path: &[Step],
        level: usize,
        sep: &[u8],
        right: PageNo,
    ) -> Result<()> {
        let cell = branch_cell(sep, right);
        if level == 0 {
            let root = self.alloc()?;
            let left = path[0].0;
            self.write(
                root,
                self.pool.new_page(root, Kind::Branch, left, &[cell]),
                None,
            );
            self.meta.root = root;
            return Ok(());
        }
        let (pno, parent, j) = &path[level - 1];
        let (pno, j) = (*pno, *j);
        let mut page = self.pool.copy(parent);
        if page.put_cell(j, &cell, false) {
            self.write(pno, page, Some(LogOp::BranchPut { page: pno, cell }));
            return Ok(());
        }
        let right_no = self.alloc()?;
        let (left, right_page, up_key) = {
            let mut cells = page.cells();
            cells.insert(j, &cell);
            let mid = split_point(&cells);
            let up = self.pool.new_page(0, Kind::Branch, 0, &cells[mid..=mid]);
            let (up_key, up_child) = (up.key(0).to_vec(), up.child(0));
            let left = self
                .pool
                .new_page(pno, Kind::Branch, page.link(), &cells[..mid]);
            let right_page =
                self.pool
                    .new_page(right_no, Kind::Branch, up_child, &cells[mid + 1..]);
            (left, right_page, up_key)
        };
        self.write(pno, left, None);
        self.write(right_no, right_page, None);
        self.insert_separator(path, level - 1, &up_key, right_no)
    }
}

/// Slots of [`InsertHints`] (a power of two).
const HINT_SLOTS: usize = 256;

/// Where the last insert into each of a few recently written leaves went
/// (direct-mapped by page number), and how many inserts in a row went
/// each one slot past the one before.
#[derive(Debug, Clone)]
pub(crate) struct InsertHints {
    /// (leaf, position of its last insert, inserts in the ascending run).
    slots: [(PageNo, u16, u16); HINT_SLOTS],
}

impl Default for InsertHints {
    fn default() -> Self {
        InsertHints {
            slots: [(0, 0, 0); HINT_SLOTS],
        }
    }
}

impl InsertHints {
    fn slot(&mut self, page: PageNo) -> &mut (PageNo, u16, u16) {
        &mut self.slots[page as usize % HINT_SLOTS]
    }

    /// A new cell went into leaf `page` at `pos`.
    pub(crate) fn note(&mut self, page: PageNo, pos: usize) {
        let pos = u16::try_from(pos).unwrap_or(u16::MAX);
        let s = self.slot(page);
        let run = match *s {
            (p, last, run) if p == page && last.checked_add(1) == Some(pos) => {
                run.saturating_add(1)
            }
            _ => 1,
        };
        *s = (page, pos, run);
    }

    /// Whether an insert at `pos` of leaf `page` continues a run of at
    /// least two ascending inserts there.
    fn ascending(&mut self, page: PageNo, pos: usize) -> bool {
        let (p, last, run) = *self.slot(page);
        p == page && run >= 2 && usize::from(last) + 1 == pos
    }
}

/// Where to split `cells` so both halves hold about as many bytes (each
/// side gets at least one cell).
fn split_point(cells: &[&[u8]]) -> usize {
    let total: usize = cells.iter().map(|c| c.len() + 2).sum();
    let mut acc = 0;
    for (i, c) in cells.iter().enumerate() {
        acc += c.len() + 2;
        if acc * 2 >= total {
            return (i + 1).clamp(1, cells.len() - 1);
        }
    }
    cells.len() / 2
}
