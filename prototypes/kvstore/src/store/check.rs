//! `Store::check`: a read-only walk of the tree and the free list (its
//! trunks, and the pages they list) at one snapshot, so it neither
//! checkpoints nor blocks writers.

use super::*;
use crate::page::{Kind, Page, Value, FIRST_PAGE, OVERFLOW_PAYLOAD};
use crate::tree::MAX_HEIGHT;
use std::collections::HashSet;

/// A page to visit: its number, depth, and the key bounds its parent
/// gives it ([lo, hi)).
struct Visit {
    no: PageNo,
    depth: usize,
    lo: Option<Vec<u8>>,
    hi: Option<Vec<u8>>,
}

struct Walk<'a> {
    inner: &'a Inner,
    snap: crate::pool::SnapshotHandle,
    end: PageNo,
    seen: HashSet<PageNo>,
    leaf_depth: Option<usize>,
    problems: Vec<String>,
}

impl Walk<'_> {
    /// Fetches `no` at the snapshot, once: `None` (a problem noted) if it
    /// is outside the file, seen before, or unreadable.
    fn visit(&mut self, no: PageNo, what: &str) -> Option<Arc<Page>> {
        if !(FIRST_PAGE..self.end).contains(&no) {
            self.problems.push(format!(
                "{what} {no} is outside the file (end {})",
                self.end
            ));
            return None;
        }
        if !self.seen.insert(no) {
            self.problems.push(format!("{what} {no} is reached twice"));
            return None;
        }
        match self
            .inner
            .pool
            .fetch_at(no, &self.snap, &self.inner.journal)
        {
            Ok(p) => {
                if p.lsn() > self.snap.lsn() {
                    self.problems
                        .push(format!("page {no}: pageLSN {} past the log", p.lsn()));
                }
                Some(p)
            }
            Err(e) => {
                self.problems.push(format!("{what} {no}: {e}"));
                None
            }
        }
    }

    fn node(&mut self, v: Visit, todo: &mut Vec<Visit>) {
        let Some(page) = self.visit(v.no, "page") else {
            return;
        };
        // (Only a leaf or a branch has keys: a free-list trunk's count is
        // of the pages it lists. A node of another kind is reported below.)
        let node = matches!(page.kind(), Some(Kind::Leaf | Kind::Branch));
        let n = if node { page.count() } else { 0 };
        for i in 0..n {
            let k = page.key(i);
            if i > 0 && page.key(i - 1) >= k {
                self.problems
                    .push(format!("page {}: keys out of order at cell {i}", v.no));
            }
            if v.lo.as_deref().is_some_and(|lo| k < lo) || v.hi.as_deref().is_some_and(|hi| k >= hi)
            {
                self.problems.push(format!(
                    "page {}: key at cell {i} outside its separators",
                    v.no
                ));
            }
        }
        match page.kind() {
            Some(Kind::Leaf) => {
                if *self.leaf_depth.get_or_insert(v.depth) != v.depth {
                    self.problems.push(format!(
                        "leaf {} at depth {}, others at {:?}",
                        v.no, v.depth, self.leaf_depth
                    ));
                }
                for i in 0..n {
                    if let Value::Overflow { len, first } = page.value(i) {
                        self.overflow(first, len as usize);
                    }
                }
            }
            Some(Kind::Branch) if v.depth < MAX_HEIGHT => {
                for j in 0..=n {
                    let lo = if j == 0 {
                        v.lo.clone()
                    } else {
                        Some(page.key(j - 1).to_vec())
                    };
                    let hi = if j == n {
                        v.hi.clone()
                    } else {
                        Some(page.key(j).to_vec())
                    };
                    todo.push(Visit {
                        no: page.nth_child(j),
                        depth: v.depth + 1,
                        lo,
                        hi,
                    });
                }
            }
            Some(Kind::Branch) => self
                .problems
                .push(format!("page {}: deeper than any tree", v.no)),
            k => self
                .problems
                .push(format!("page {}: a {k:?} page in the tree", v.no)),
        }
    }

    fn overflow(&mut self, first: PageNo, len: usize) {
        let mut no = first;
        for _ in 0..len.div_ceil(OVERFLOW_PAYLOAD) {
            let Some(p) = self.visit(no, "overflow page") else {
                return;
            };
            if p.kind() != Some(Kind::Overflow) {
                self.problems
                    .push(format!("overflow page {no} is a {:?} page", p.kind()));
                return;
            }
            no = p.link();
        }
    }
}

pub(super) fn check(inner: &Inner) -> Result<Vec<String>> {
    let (snap, meta) = {
        let tree = inner.read_tree();
        let lsn = Lsn(inner.applied.load(Ordering::Acquire));
        (inner.pool.open_snapshot(lsn), *tree)
    };
    let mut w = Walk {
        inner,
        snap,
        end: meta.end,
        seen: HashSet::new(),
        leaf_depth: None,
        problems: Vec::new(),
    };
    let mut todo = vec![Visit {
        no: meta.root,
        depth: 0,
        lo: None,
        hi: None,
    }];
    while let Some(v) = todo.pop() {
        w.node(v, &mut todo);
    }
    let in_tree = w.seen.len();
    let mut free = 0usize;
    let mut no = meta.free_head;
    while no != 0 {
        let Some(p) = w.visit(no, "free-list trunk") else {
            break;
        };
        if p.kind() != Some(Kind::Free) {
            w.problems
                .push(format!("free-list trunk {no} is a {:?} page", p.kind()));
            break;
        }
        free += 1;
        // The pages a trunk lists are not read: their contents mean
        // nothing. Each must be in the file and counted once.
        for i in 0..p.count() {
            let listed = p.free_entry(i);
            if !(FIRST_PAGE..w.end).contains(&listed) {
                w.problems.push(format!(
                    "free page {listed} (trunk {no}) is outside the file (end {})",
                    w.end
                ));
            } else if !w.seen.insert(listed) {
                w.problems
                    .push(format!("free page {listed} (trunk {no}) is reached twice"));
            } else {
                free += 1;
            }
        }
        no = p.link();
    }
    let pages = (meta.end - FIRST_PAGE) as usize;
    if in_tree + free != pages {
        let lost: Vec<PageNo> = (FIRST_PAGE..meta.end)
            .filter(|p| !w.seen.contains(p))
            .take(5)
            .collect();
        w.problems.push(format!(
            "{} pages in the tree and {free} free of {pages}: lost pages, e.g. {lost:?}",
            in_tree
        ));
    }
    inner.pool.close_snapshot(&w.snap);
    Ok(w.problems)
}
