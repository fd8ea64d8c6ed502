//! `Store::check`: a read-only walk of the tree and the free list (its
//! trunks, and the pages they list) at one snapshot, so it neither
//! checkpoints nor blocks writers.
//!
//! Its memory does not grow with the store:
//! - The pages reached are marked in a bitmap (a bit per page, as e2fsck
//!   marks blocks) of at most [`BITMAP_SHARE`] of the cache. When the
//!   data file has more pages than that covers, the page numbers are
//!   checked in windows: one walk of the tree and the free list per
//!   window, each marking only the pages of its window (a page reached
//!   twice, a lost page) and reading the rest only to go past them. A
//!   page's own problems (its keys, its kind, its pageLSN, a failed read)
//!   are reported by the walk of its window, at its first reach — once;
//!   pointers outside the file by the first walk.
//! - A walk marking no page twice can reach no page twice in its window,
//!   but could go round a cycle of pages outside it: every walk stops
//!   after as many pages as the file holds (a sound store's walk reaches
//!   each page once), and says so.
//! - The walk holds one branch page and its two bounds per level (at most
//!   [`MAX_HEIGHT`] levels), not the children still to visit.
//! - At most [`MAX_PROBLEMS`] lines are kept, then a count of the rest.

use super::*;
use crate::page::{Kind, Page, Value, FIRST_PAGE, OVERFLOW_PAYLOAD};
use crate::pool::SnapshotHandle;
use crate::tree::MAX_HEIGHT;

/// The bitmap of pages reached is at most this share of
/// [`Options::cache_bytes`] (a sixteenth: 4 MiB, 128 GiB of data file per
/// window, with the default cache), and at least [`MIN_BITMAP`] bytes.
const BITMAP_SHARE: usize = 16;
/// The smallest bitmap, whatever the cache (512 pages a window).
const MIN_BITMAP: usize = 64;
/// Problem lines kept; those past it are counted in one more line.
const MAX_PROBLEMS: usize = 1000;

/// What [`Store::check_report`] found, and the memory its walk used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// One line per problem (none: the store is sound); past 1,000, one
    /// last line counts the rest.
    pub problems: Vec<String>,
    /// Pages checked: the data file's pages in use past the meta pages.
    pub pages: u64,
    /// Walks of the tree and the free list: one per window of page
    /// numbers.
    pub windows: u64,
    /// Bytes of the bitmap of pages reached (one window's, reused by
    /// every walk).
    pub bitmap_bytes: usize,
    /// The most branch levels the walk held at once.
    pub max_levels: usize,
}

/// Problem lines, bounded.
#[derive(Default)]
struct Problems {
    lines: Vec<String>,
    more: u64,
}

impl Problems {
    fn push(&mut self, line: String) {
        if self.lines.len() < MAX_PROBLEMS {
            self.lines.push(line);
        } else {
            self.more += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.more > 0 {
            self.lines
                .push(format!("... and {} more problems", self.more));
        }
        self.lines
    }
}

/// A branch being walked: its page, the next child to visit, and the key
/// bounds its parent gives it ([lo, hi)).
struct Level {
    page: Arc<Page>,
    depth: usize,
    next: usize,
    lo: Option<Vec<u8>>,
    hi: Option<Vec<u8>>,
}

/// The pages reached of one window, `[start, start + 64 × words)`.
struct Bitmap {
    start: PageNo,
    words: Vec<u64>,
}

impl Bitmap {
    fn covers(&self, no: PageNo) -> bool {
        no >= self.start && ((no - self.start) as usize) < self.words.len() * 64
    }

    /// Marks `no` (in the window); `false` if it was marked already.
    fn mark(&mut self, no: PageNo) -> bool {
        let i = (no - self.start) as usize;
        let bit = 1u64 << (i % 64);
        let was = self.words[i / 64] & bit != 0;
        self.words[i / 64] |= bit;
        !was
    }

    fn marked(&self, no: PageNo) -> bool {
        let i = (no - self.start) as usize;
        self.words[i / 64] & (1u64 << (i % 64)) != 0
    }
}

/// One walk of the tree and the free list, marking one window.
struct Walk<'a> {
    inner: &'a Inner,
    snap: &'a SnapshotHandle,
    end: PageNo,
    /// The first walk (reports pointers outside the file).
    first: bool,
    bits: Bitmap,
    /// Pages of the window marked, and of those the free list's.
    marked: u64,
    free: u64,
    /// Pages reached in this walk, and the most a sound store allows.
    reached: u64,
    most: u64,
    overrun: bool,
    /// The snapshot expired: nothing the walk reads means anything.
    expired: bool,
    leaf_depth: Option<usize>,
    max_levels: usize,
    problems: &'a mut Problems,
}

impl Walk<'_> {
    fn stopped(&self) -> bool {
        self.overrun || self.expired
    }

    /// Takes a reach of page `no` (a `what`, or a free page `trunk`
    /// lists): `None` (a problem noted if it is this walk's to report) if
    /// it is outside the file or reached twice in the window, or the walk
    /// stopped; else whether it is in the window (this walk reports its
    /// own problems).
    fn reach(&mut self, no: PageNo, what: &str, trunk: Option<PageNo>) -> Option<bool> {
        if self.stopped() {
            return None;
        }
        let name = |no| match trunk {
            Some(t) => format!("free page {no} (trunk {t})"),
            None => format!("{what} {no}"),
        };
        if !(FIRST_PAGE..self.end).contains(&no) {
            if self.first {
                let end = self.end;
                self.problems
                    .push(format!("{} is outside the file (end {end})", name(no)));
            }
            return None;
        }
        let mine = self.bits.covers(no);
        if mine {
            if !self.bits.mark(no) {
                self.problems.push(format!("{} is reached twice", name(no)));
                return None;
            }
            self.marked += 1;
        }
        self.reached += 1;
        if self.reached > self.most {
            self.overrun = true;
            return None;
        }
        Some(mine)
    }

    /// Fetches `no` at the snapshot if [`Walk::reach`] takes it: the page
    /// and whether it is in the window.
    fn visit(&mut self, no: PageNo, what: &str) -> Option<(Arc<Page>, bool)> {
        let mine = self.reach(no, what, None)?;
        match self.inner.pool.fetch_at(no, self.snap, &self.inner.journal) {
            Ok(p) => {
                if mine && p.lsn() > self.snap.lsn() {
                    self.problems
                        .push(format!("page {no}: pageLSN {} past the log", p.lsn()));
                }
                Some((p, mine))
            }
            Err(_) if self.snap.expired() => {
                self.expired = true;
                None
            }
            Err(e) => {
                if mine {
                    self.problems.push(format!("{what} {no}: {e}"));
                }
                None
            }
        }
    }

    /// Checks a node's keys: in order, and inside its bounds.
    fn keys(&mut self, page: &Page, no: PageNo, lo: Option<&[u8]>, hi: Option<&[u8]>) {
        for i in 0..page.count() {
            let k = page.key(i);
            if i > 0 && page.key(i - 1) >= k {
                self.problems
                    .push(format!("page {no}: keys out of order at cell {i}"));
            }
            if lo.is_some_and(|lo| k < lo) || hi.is_some_and(|hi| k >= hi) {
                self.problems
                    .push(format!("page {no}: key at cell {i} outside its separators"));
            }
        }
    }

    /// Visits the tree page `no` at `depth`, bounded by [lo, hi): a
    /// branch goes on the stack, a leaf's overflow chains are followed.
    fn enter(
        &mut self,
        no: PageNo,
        depth: usize,
        lo: Option<Vec<u8>>,
        hi: Option<Vec<u8>>,
        stack: &mut Vec<Level>,
    ) {
        let Some((page, mine)) = self.visit(no, "page") else {
            return;
        };
        // (Only a leaf or a branch has keys: a free-list trunk's count is
        // of the pages it lists. A node of another kind is reported below.)
        let node = matches!(page.kind(), Some(Kind::Leaf | Kind::Branch));
        if mine && node {
            self.keys(&page, no, lo.as_deref(), hi.as_deref());
        }
        match page.kind() {
            Some(Kind::Leaf) => {
                let first = *self.leaf_depth.get_or_insert(depth);
                if mine && first != depth {
                    self.problems
                        .push(format!("leaf {no} at depth {depth}, others at {first}"));
                }
                for i in 0..page.count() {
                    if let Value::Overflow { len, first } = page.value(i) {
                        self.overflow(first, len as usize);
                    }
                }
            }
            Some(Kind::Branch) if depth < MAX_HEIGHT => {
                stack.push(Level {
                    page,
                    depth,
                    next: 0,
                    lo,
                    hi,
                });
                self.max_levels = self.max_levels.max(stack.len());
            }
            Some(Kind::Branch) if mine => self
                .problems
                .push(format!("page {no}: deeper than any tree")),
            k if mine && !node => self
                .problems
                .push(format!("page {no}: a {k:?} page in the tree")),
            _ => {}
        }
    }

    /// Walks the tree from `root`, depth first, children left to right.
    fn tree(&mut self, root: PageNo) {
        let mut stack = Vec::with_capacity(MAX_HEIGHT);
        self.enter(root, 0, None, None, &mut stack);
        while let Some(top) = stack.last_mut() {
            let n = top.page.count();
            if top.next > n || self.stopped() {
                stack.pop();
                continue;
            }
            let j = top.next;
            top.next += 1;
            let lo = match j {
                0 => top.lo.clone(),
                _ => Some(top.page.key(j - 1).to_vec()),
            };
            let hi = if j == n {
                top.hi.clone()
            } else {
                Some(top.page.key(j).to_vec())
            };
            let (child, depth) = (top.page.nth_child(j), top.depth + 1);
            self.enter(child, depth, lo, hi, &mut stack);
        }
    }

    fn overflow(&mut self, first: PageNo, len: usize) {
        let mut no = first;
        for _ in 0..len.div_ceil(OVERFLOW_PAYLOAD) {
            let Some((p, mine)) = self.visit(no, "overflow page") else {
                return;
            };
            if p.kind() != Some(Kind::Overflow) {
                if mine {
                    self.problems
                        .push(format!("overflow page {no} is a {:?} page", p.kind()));
                }
                return;
            }
            no = p.link();
        }
    }

    /// Walks the free list: its trunks, and the pages they list (not
    /// read: their contents mean nothing; each must be in the file and
    /// reached once).
    fn free_list(&mut self, head: PageNo) {
        let mut no = head;
        while no != 0 {
            let Some((p, mine)) = self.visit(no, "free-list trunk") else {
                return;
            };
            if p.kind() != Some(Kind::Free) {
                if mine {
                    self.problems
                        .push(format!("free-list trunk {no} is a {:?} page", p.kind()));
                }
                return;
            }
            if mine {
                self.free += 1;
            }
            for i in 0..p.count() {
                if self.reach(p.free_entry(i), "", Some(no)) == Some(true) {
                    self.free += 1;
                }
            }
            no = p.link();
        }
    }
}

/// The bitmap bytes a check of `pages` pages uses with a cache of
/// `cache_bytes`: the whole file's if it fits its share, else the share.
fn bitmap_bytes(cache_bytes: usize, pages: u64) -> usize {
    let share = (cache_bytes / BITMAP_SHARE).max(MIN_BITMAP) / 8 * 8;
    let whole = usize::try_from(pages.div_ceil(64) * 8).unwrap_or(usize::MAX);
    whole.min(share)
}

/// The problems [`Store::check`] returns.
pub(super) fn check(inner: &Inner) -> Result<Vec<String>> {
    report(inner).map(|r| r.problems)
}

fn report(inner: &Inner) -> Result<CheckReport> {
    let (snap, meta) = {
        let tree = inner.read_tree();
        let lsn = Lsn(inner.applied.load(Ordering::Acquire));
        (inner.pool.open_snapshot(lsn), *tree)
    };
    let r = walk(inner, &snap, &meta);
    inner.pool.close_snapshot(&snap);
    r
}

/// Walks the tree and the free list once per window of page numbers.
fn walk(inner: &Inner, snap: &SnapshotHandle, meta: &TreeMeta) -> Result<CheckReport> {
    let pages = u64::from(meta.end.saturating_sub(FIRST_PAGE));
    let bytes = bitmap_bytes(inner.options.cache_bytes, pages);
    let window = bytes as u64 * 8;
    let windows = pages.div_ceil(window.max(1)).max(1);
    let mut problems = Problems::default();
    let (mut in_tree, mut free) = (0u64, 0u64);
    let (mut lost, mut overrun) = (Vec::new(), Vec::new());
    let mut words = vec![0u64; bytes / 8];
    let mut max_levels = 0;
    for w in 0..windows {
        words.fill(0);
        // (Below the end, a page number: the conversions cannot fail.)
        let start = u32::try_from(u64::from(FIRST_PAGE) + w * window).unwrap_or(u32::MAX);
        let stop = u32::try_from(u64::from(start) + window).map_or(meta.end, |s| s.min(meta.end));
        let mut walk = Walk {
            inner,
            snap,
            end: meta.end,
            first: w == 0,
            bits: Bitmap { start, words },
            marked: 0,
            free: 0,
            reached: 0,
            most: pages,
            overrun: false,
            expired: false,
            leaf_depth: None,
            max_levels: 0,
            problems: &mut problems,
        };
        walk.tree(meta.root);
        let tree_marked = walk.marked;
        walk.free_list(meta.free_head);
        if walk.expired {
            return Err(Error::SnapshotTooOld);
        }
        max_levels = max_levels.max(walk.max_levels);
        if walk.overrun {
            overrun.push((start, stop));
        } else {
            in_tree += tree_marked;
            free += walk.free;
            let room = 5 - lost.len();
            lost.extend((start..stop).filter(|&p| !walk.bits.marked(p)).take(room));
        }
        words = walk.bits.words;
    }
    if !overrun.is_empty() {
        problems.push(format!(
            "the walk reached more pages than the file holds ({pages}): pages reached more than once; lost pages not counted in windows {overrun:?}"
        ));
    } else if in_tree + free != pages {
        problems.push(format!(
            "{in_tree} pages in the tree and {free} free of {pages}: lost pages, e.g. {lost:?}"
        ));
    }
    Ok(CheckReport {
        problems: problems.finish(),
        pages,
        windows,
        bitmap_bytes: bytes,
        max_levels,
    })
}

impl Store {
    /// [`Store::check`], with what the check used. Its memory is bounded
    /// by the cache whatever the store's size: a bitmap of the pages
    /// reached of at most a sixteenth of [`Options::cache_bytes`] (past
    /// it, the page numbers are checked in windows, a walk of the tree
    /// each), a branch page and two keys per level of the tree, and at
    /// most 1,000 problem lines (then one counting the rest).
    pub fn check_report(&self) -> Result<CheckReport> {
        self.inner.check()?;
        report(&self.inner)
    }
}
