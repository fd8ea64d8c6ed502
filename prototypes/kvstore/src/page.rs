//! The data file's pages: 4 KiB, each with a CRC, its number and its
//! pageLSN (the LSN of the last log record applied to it, ARIES). Tree
//! pages are slotted (SQLite, PostgreSQL): a slot array of cell offsets in
//! key order grows from the header, the cells grow down from the end, and
//! the hole between them is free space. docs/FORMAT.md has the byte map.
//!
//! Every page read from disk or rebuilt from a log image goes through
//! [`Page::validate`] first: after it, every accessor's offsets are inside
//! the page, so a hostile page is a typed error and never a panic.

use journal_core::Lsn;
use std::sync::Arc;

mod spare;
pub(crate) use spare::Spare;

/// Bytes per page.
pub const PAGE_SIZE: usize = 4096;
/// Bytes of a page's header.
pub const HEADER: usize = 32;
/// Payload bytes of an overflow page.
pub const OVERFLOW_PAYLOAD: usize = PAGE_SIZE - HEADER;
/// The format version of the data file and the log records.
pub const FORMAT_VERSION: u16 = 3;
/// Free pages a free-list trunk lists (its own page aside).
pub const FREE_PER_TRUNK: usize = (PAGE_SIZE - HEADER) / 4;
/// The largest leaf cell stored inline: a longer value goes to overflow
/// pages. At most a third of a page's space, so a split of a full page
/// always leaves both halves within a page.
pub const MAX_INLINE_CELL: usize = 1200;

const PAGE_MAGIC: &[u8; 4] = b"KVB2";

/// A page number.
pub type PageNo = u32;

/// The first page of the tree in a new store (pages 0 and 1 are the two
/// copies of the meta page).
pub const FIRST_PAGE: PageNo = 2;

/// What a page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Keys and values (or overflow pointers), in key order.
    Leaf = 1,
    /// Separator keys and child pages; `link` is the leftmost child.
    Branch = 2,
    /// A piece of a long value; `link` is the next piece.
    Overflow = 3,
    /// A free-list trunk: free itself, it lists up to [`FREE_PER_TRUNK`]
    /// more free pages; `link` is the next trunk.
    Free = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Leaf,
            2 => Kind::Branch,
            3 => Kind::Overflow,
            4 => Kind::Free,
            _ => return None,
        })
    }
}

/// One page's bytes (always [`PAGE_SIZE`] of them), and the pool whose
/// spare buffers it goes back to when dropped, if it is a pool's
/// (`spare.rs`).
pub struct Page(Box<[u8]>, Option<Arc<Spare>>);

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Page")
            .field("number", &self.number())
            .field("kind", &self.kind())
            .field("lsn", &self.lsn())
            .field("count", &self.count())
            .finish()
    }
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The length of the cell at the start of `b` on a page of `kind`, if `b`
/// holds a whole cell.
fn cell_len(kind: Kind, b: &[u8]) -> Option<usize> {
    match kind {
        Kind::Leaf => {
            let h = b.get(..7)?;
            let klen = u16_at(h, 0) as usize;
            let vlen = u32_at(h, 3) as usize;
            let body = match h[2] {
                0 => vlen,
                1 => 4,
                _ => return None,
            };
            let n = 7 + klen + body;
            (n <= b.len()).then_some(n)
        }
        Kind::Branch => {
            let klen = u16_at(b.get(..6)?, 0) as usize;
            let n = 6 + klen;
            (n <= b.len()).then_some(n)
        }
        Kind::Overflow | Kind::Free => None,
    }
}

/// A leaf cell's value: inline, or the first of its overflow pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// The value itself.
    Inline(&'a [u8]),
    /// `len` bytes in a chain of overflow pages from `first`.
    Overflow {
        /// The value's length.
        len: u32,
        /// Its first page.
        first: PageNo,
    },
}

/// Builds a leaf cell.
pub fn leaf_cell(key: &[u8], value: Value<'_>) -> Vec<u8> {
    // Sized exactly: an inline value's cell grown from the overflow
    // pointer's size was reallocated under the tree lock at every put.
    let tail = match value {
        Value::Inline(v) => v.len(),
        Value::Overflow { .. } => 4,
    };
    let mut c = Vec::with_capacity(7 + key.len() + tail);
    c.extend_from_slice(&(key.len() as u16).to_le_bytes());
    match value {
        Value::Inline(v) => {
            c.push(0);
            c.extend_from_slice(&(v.len() as u32).to_le_bytes());
            c.extend_from_slice(key);
            c.extend_from_slice(v);
        }
        Value::Overflow { len, first } => {
            c.push(1);
            c.extend_from_slice(&len.to_le_bytes());
            c.extend_from_slice(key);
            c.extend_from_slice(&first.to_le_bytes());
        }
    }
    c
}

/// The key of a whole, well-formed leaf cell (a logged one: checked
/// before redo uses it).
pub fn leaf_cell_key(cell: &[u8]) -> Option<&[u8]> {
    if cell_len(Kind::Leaf, cell)? != cell.len() {
        return None;
    }
    let klen = u16_at(cell, 0) as usize;
    cell.get(7..7 + klen)
}

/// The key of a whole, well-formed branch cell.
pub fn branch_cell_key(cell: &[u8]) -> Option<&[u8]> {
    if cell_len(Kind::Branch, cell)? != cell.len() {
        return None;
    }
    let klen = u16_at(cell, 0) as usize;
    cell.get(6..6 + klen)
}

/// Builds a branch cell: keys at and above `key` live under `child`.
pub fn branch_cell(key: &[u8], child: PageNo) -> Vec<u8> {
    let mut c = Vec::with_capacity(6 + key.len());
    c.extend_from_slice(&(key.len() as u16).to_le_bytes());
    c.extend_from_slice(&child.to_le_bytes());
    c.extend_from_slice(key);
    c
}

/// Why a page was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// Its checksum (or magic) does not hold: torn, damaged or never
    /// written.
    Checksum,
    /// The checksum holds but the contents do not make a page.
    Structure(&'static str),
}

impl Page {
    /// An empty page of `kind`.
    pub fn new(number: PageNo, kind: Kind) -> Page {
        Page::new_in(Box::new([0u8; PAGE_SIZE]), number, kind)
    }

    /// [`Page::new`] in `buf` (any contents: it is cleared).
    pub(crate) fn new_in(mut buf: Box<[u8; PAGE_SIZE]>, number: PageNo, kind: Kind) -> Page {
        buf.fill(0);
        let mut p = Page(buf, None);
        p.0[..4].copy_from_slice(PAGE_MAGIC);
        p.0[16..20].copy_from_slice(&number.to_le_bytes());
        p.0[20] = kind as u8;
        p.set_lower(HEADER);
        p.set_upper(PAGE_SIZE);
        p
    }

    /// A trunk's free page `i` (`i < count`).
    pub fn free_entry(&self, i: usize) -> PageNo {
        u32_at(&self.0[..], HEADER + 4 * i)
    }

    /// Adds `no` to a trunk's list; false if the trunk is full.
    pub fn push_free(&mut self, no: PageNo) -> bool {
        let n = self.count();
        if n >= FREE_PER_TRUNK {
            return false;
        }
        self.0[HEADER + 4 * n..HEADER + 4 * n + 4].copy_from_slice(&no.to_le_bytes());
        self.set_count(n + 1);
        self.set_lower(HEADER + 4 * (n + 1));
        true
    }

    /// Takes the last page off a trunk's list (`None`: the list is empty).
    pub fn pop_free(&mut self) -> Option<PageNo> {
        let n = self.count().checked_sub(1)?;
        let no = self.free_entry(n);
        self.0[HEADER + 4 * n..HEADER + 4 * n + 4].fill(0);
        self.set_count(n);
        self.set_lower(HEADER + 4 * n);
        Some(no)
    }

    /// An overflow page holding `payload` (at most [`OVERFLOW_PAYLOAD`]).
    pub fn overflow(number: PageNo, payload: &[u8], next: PageNo) -> Page {
        Page::overflow_on(Box::new([0u8; PAGE_SIZE]), number, payload, next)
    }

    /// [`Page::overflow`] in `buf` (any contents: it is cleared).
    pub(crate) fn overflow_on(
        mut buf: Box<[u8; PAGE_SIZE]>,
        number: PageNo,
        payload: &[u8],
        next: PageNo,
    ) -> Page {
        buf.fill(0);
        let mut p = Page(buf, None);
        p.0[..4].copy_from_slice(PAGE_MAGIC);
        p.0[16..20].copy_from_slice(&number.to_le_bytes());
        p.0[20] = Kind::Overflow as u8;
        p.set_lower(HEADER);
        p.set_upper(PAGE_SIZE);
        p.0[HEADER..HEADER + payload.len()].copy_from_slice(payload);
        p.set_lower(HEADER + payload.len());
        p.set_link(next);
        p
    }

    /// The raw bytes ([`PAGE_SIZE`] of them).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The page LSN.
    pub fn lsn(&self) -> Lsn {
        Lsn(u64::from_le_bytes(
            self.0[8..16].try_into().unwrap_or([0; 8]),
        ))
    }

    /// Sets the page LSN.
    pub fn set_lsn(&mut self, lsn: Lsn) {
        self.0[8..16].copy_from_slice(&lsn.0.to_le_bytes());
    }

    /// The page's number, as written in it.
    pub fn number(&self) -> PageNo {
        u32_at(&self.0[..], 16)
    }

    /// Its kind (`None` only on a page not yet validated).
    pub fn kind(&self) -> Option<Kind> {
        Kind::from_u8(self.0[20])
    }

    /// Cells on the page (a free-list trunk: the pages it lists).
    pub fn count(&self) -> usize {
        u16_at(&self.0[..], 22) as usize
    }

    fn set_count(&mut self, n: usize) {
        self.0[22..24].copy_from_slice(&(n as u16).to_le_bytes());
    }

    /// The end of the slot array (overflow: of the payload).
    pub fn lower(&self) -> usize {
        u16_at(&self.0[..], 24) as usize
    }

    fn set_lower(&mut self, v: usize) {
        self.0[24..26].copy_from_slice(&(v as u16).to_le_bytes());
    }

    /// The start of the cell area (`PAGE_SIZE` stored as 0).
    pub fn upper(&self) -> usize {
        match u16_at(&self.0[..], 26) as usize {
            0 => PAGE_SIZE,
            n => n,
        }
    }

    fn set_upper(&mut self, v: usize) {
        let v = if v == PAGE_SIZE { 0 } else { v as u16 };
        self.0[26..28].copy_from_slice(&v.to_le_bytes());
    }

    /// Branch: the leftmost child; overflow: the next page; free-list
    /// trunk: the next trunk.
    pub fn link(&self) -> PageNo {
        u32_at(&self.0[..], 28)
    }

    /// Sets [`Page::link`].
    pub fn set_link(&mut self, v: PageNo) {
        self.0[28..32].copy_from_slice(&v.to_le_bytes());
    }

    /// An overflow page's payload.
    pub fn payload(&self) -> &[u8] {
        &self.0[HEADER..self.lower()]
    }

    fn slot(&self, i: usize) -> usize {
        u16_at(&self.0[..], HEADER + 2 * i) as usize
    }

    fn set_slot(&mut self, i: usize, off: usize) {
        let at = HEADER + 2 * i;
        self.0[at..at + 2].copy_from_slice(&(off as u16).to_le_bytes());
    }

    fn page_kind(&self) -> Kind {
        self.kind().unwrap_or(Kind::Free)
    }

    /// Cell `i`'s bytes (the page is valid and `i < count`).
    pub fn cell(&self, i: usize) -> &[u8] {
        let off = self.slot(i);
        let n = cell_len(self.page_kind(), &self.0[off..]).unwrap_or(0);
        &self.0[off..off + n]
    }

    /// Cell `i`'s key.
    pub fn key(&self, i: usize) -> &[u8] {
        let c = self.cell(i);
        let klen = u16_at(c, 0) as usize;
        match self.page_kind() {
            Kind::Leaf => &c[7..7 + klen],
            _ => &c[6..6 + klen],
        }
    }

    /// Leaf cell `i`'s value.
    pub fn value(&self, i: usize) -> Value<'_> {
        let c = self.cell(i);
        let klen = u16_at(c, 0) as usize;
        let vlen = u32_at(c, 3);
        if c[2] == 0 {
            Value::Inline(&c[7 + klen..])
        } else {
            Value::Overflow {
                len: vlen,
                first: u32_at(c, 7 + klen),
            }
        }
    }

    /// Branch cell `i`'s child.
    pub fn child(&self, i: usize) -> PageNo {
        u32_at(self.cell(i), 2)
    }

    /// A branch's child `j` of `count + 1`: 0 is the leftmost (`link`).
    pub fn nth_child(&self, j: usize) -> PageNo {
        if j == 0 {
            self.link()
        } else {
            self.child(j - 1)
        }
    }

    /// The cell whose key is `key` (`Ok`) or where it would go (`Err`).
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// A branch's child for `key`, as its position `j` (see
    /// [`Page::nth_child`]).
    pub fn child_for(&self, key: &[u8]) -> usize {
        match self.search(key) {
            Ok(i) => i + 1,
            Err(i) => i,
        }
    }

    /// Free bytes, the fragments left by removed cells included.
    pub fn free_space(&self) -> usize {
        let used: usize = (0..self.count()).map(|i| self.cell(i).len()).sum();
        PAGE_SIZE - HEADER - 2 * self.count() - used
    }

    /// Rewrites the cells packed against the end (drops the fragments).
    fn compact(&mut self) {
        let cells: Vec<Vec<u8>> = (0..self.count()).map(|i| self.cell(i).to_vec()).collect();
        let mut upper = PAGE_SIZE;
        let lower = self.lower();
        self.0[lower..].fill(0);
        for (i, c) in cells.iter().enumerate() {
            upper -= c.len();
            self.0[upper..upper + c.len()].copy_from_slice(c);
            self.set_slot(i, upper);
        }
        self.set_upper(upper);
    }

    /// Puts `cell` at position `i`, replacing the cell there if `replace`.
    /// `false` (nothing changed) if it does not fit: the caller splits.
    /// Deterministic, so redo rebuilds the same bytes.
    pub fn put_cell(&mut self, i: usize, cell: &[u8], replace: bool) -> bool {
        let n = self.count();
        let freed = if replace { self.cell(i).len() } else { 0 };
        let slot = if replace { 0 } else { 2 };
        // The hole alone is enough, the common case: no need to add up the
        // fragments.
        let hole = self.upper() - self.lower();
        if hole < cell.len() + slot && self.free_space() + freed < cell.len() + slot {
            return false;
        }
        if replace {
            self.remove_cell(i);
        }
        if self.upper() - self.lower() < cell.len() + 2 {
            self.compact();
        }
        let upper = self.upper() - cell.len();
        self.0[upper..upper + cell.len()].copy_from_slice(cell);
        self.set_upper(upper);
        let count = if replace { n - 1 } else { n };
        let at = HEADER + 2 * i;
        self.0.copy_within(at..HEADER + 2 * count, at + 2);
        self.set_slot(i, upper);
        self.set_count(count + 1);
        self.set_lower(HEADER + 2 * (count + 1));
        true
    }

    /// Removes cell `i` (its bytes become a fragment).
    pub fn remove_cell(&mut self, i: usize) {
        let n = self.count();
        let off = self.slot(i);
        let len = self.cell(i).len();
        self.0[off..off + len].fill(0);
        let at = HEADER + 2 * i;
        self.0.copy_within(at + 2..HEADER + 2 * n, at);
        self.0[HEADER + 2 * (n - 1)..HEADER + 2 * n].fill(0);
        self.set_count(n - 1);
        self.set_lower(HEADER + 2 * (n - 1));
        if off == self.upper() {
            // The lowest cell went: the hole grows instead of a fragment.
            let next = (0..n - 1).map(|j| self.slot(j)).min().unwrap_or(PAGE_SIZE);
            self.set_upper(next);
        }
    }

    /// Removes every cell from `key` on (a split's left half).
    pub fn truncate_from(&mut self, key: &[u8]) {
        let from = self.search(key).unwrap_or_else(|i| i);
        for i in (from..self.count()).rev() {
            self.remove_cell(i);
        }
    }

    /// Every cell, in order.
    pub fn cells(&self) -> Vec<&[u8]> {
        (0..self.count()).map(|i| self.cell(i)).collect()
    }

    /// A page of `kind` holding `cells` (which fit: the caller split them).
    pub fn from_cells<C: AsRef<[u8]>>(
        number: PageNo,
        kind: Kind,
        link: PageNo,
        cells: &[C],
    ) -> Page {
        Page::from_cells_in(Box::new([0u8; PAGE_SIZE]), number, kind, link, cells)
    }

    /// [`Page::from_cells`] in `buf` (any contents: it is cleared).
    pub(crate) fn from_cells_in<C: AsRef<[u8]>>(
        buf: Box<[u8; PAGE_SIZE]>,
        number: PageNo,
        kind: Kind,
        link: PageNo,
        cells: &[C],
    ) -> Page {
        let mut p = Page::new_in(buf, number, kind);
        p.set_link(link);
        for (i, c) in cells.iter().enumerate() {
            let fit = p.put_cell(i, c.as_ref(), false);
            debug_assert!(fit, "cells that fit a page");
        }
        p
    }

    pub(crate) fn crc_of(bytes: &[u8; PAGE_SIZE]) -> u32 {
        let c = crc32c::crc32c(&bytes[..4]);
        let c = crc32c::crc32c_append(c, &[0; 4]);
        crc32c::crc32c_append(c, &bytes[8..])
    }

    fn crc(&self) -> u32 {
        let c = crc32c::crc32c(&self.0[..4]);
        let c = crc32c::crc32c_append(c, &[0; 4]);
        crc32c::crc32c_append(c, &self.0[8..])
    }

    /// The page as written home, into `out`: its CRC filled in.
    pub fn seal_into(&self, out: &mut [u8; PAGE_SIZE]) {
        out.copy_from_slice(&self.0[..]);
        let c = Page::crc_of(out);
        out[4..8].copy_from_slice(&c.to_le_bytes());
    }

    /// The page as written home, appended to `out`: its CRC filled in.
    pub fn seal_onto(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.0[..]);
        let c = self.crc();
        out[at + 4..at + 8].copy_from_slice(&c.to_le_bytes());
    }

    /// The page as written home: its CRC filled in.
    pub fn sealed(&self) -> Page {
        let mut b = Box::new([0u8; PAGE_SIZE]);
        self.seal_into(&mut b);
        Page(b, None)
    }

    /// Checks an overflow page read from disk, in place (magic, CRC,
    /// number, kind, payload bounds: what [`Page::from_disk`] checks of
    /// one): its payload and the next page of its chain.
    pub fn overflow_in(bytes: &[u8], number: PageNo) -> Result<(&[u8], PageNo), Invalid> {
        let Ok(b) = <&[u8; PAGE_SIZE]>::try_from(bytes) else {
            return Err(Invalid::Structure("an overflow page of the wrong size"));
        };
        if &b[..4] != PAGE_MAGIC || u32_at(b, 4) != Page::crc_of(b) {
            return Err(Invalid::Checksum);
        }
        let lower = u16_at(b, 24) as usize;
        if u32_at(b, 16) != number {
            return Err(Invalid::Structure("the page's number is another page's"));
        }
        if b[20] != Kind::Overflow as u8 || u16_at(b, 22) != 0 || u16_at(b, 26) != 0 {
            return Err(Invalid::Structure("not an overflow page"));
        }
        if !(HEADER..=PAGE_SIZE).contains(&lower) {
            return Err(Invalid::Structure("free-space bounds outside the page"));
        }
        Ok((&b[HEADER..lower], u32_at(b, 28)))
    }

    /// Checks a page read from disk: magic, CRC, then [`Page::validate`].
    pub fn from_disk(bytes: Box<[u8; PAGE_SIZE]>, number: PageNo) -> Result<Page, Invalid> {
        let p = Page(bytes, None);
        if &p.0[..4] != PAGE_MAGIC || u32_at(&p.0[..], 4) != p.crc() {
            return Err(Invalid::Checksum);
        }
        p.validate(number)?;
        Ok(p)
    }

    /// Checks that the page's fields and cells stay inside it: after this,
    /// no accessor reads outside the page.
    pub fn validate(&self, number: PageNo) -> Result<(), Invalid> {
        let bad = |why| Err(Invalid::Structure(why));
        if self.number() != number {
            return bad("the page's number is another page's");
        }
        let Some(kind) = self.kind() else {
            return bad("unknown page kind");
        };
        let (lower, upper, n) = (self.lower(), self.upper(), self.count());
        if lower < HEADER || lower > upper || upper > PAGE_SIZE {
            return bad("free-space bounds outside the page");
        }
        match kind {
            Kind::Overflow => {
                if n != 0 || upper != PAGE_SIZE {
                    return bad("an overflow page with cells");
                }
                return Ok(());
            }
            Kind::Free => {
                if n > FREE_PER_TRUNK || lower != HEADER + 4 * n || upper != PAGE_SIZE {
                    return bad("a free-list trunk whose count disagrees with its list");
                }
                return Ok(());
            }
            Kind::Leaf | Kind::Branch => {}
        }
        if lower != HEADER + 2 * n {
            return bad("the slot array's end disagrees with the cell count");
        }
        // Every cell inside the cell area, and no two overlapping: the
        // cells' bytes then add up to at most the area, so the free space
        // (and the compaction that packs the cells) cannot underflow.
        // (At most 2,032 cells: the slot array fits the page.)
        let mut cells: Vec<(usize, usize)> = Vec::with_capacity(n);
        for i in 0..n {
            let off = self.slot(i);
            if off < upper || off >= PAGE_SIZE {
                return bad("a cell outside the cell area");
            }
            let Some(len) = cell_len(kind, &self.0[off..]) else {
                return bad("a cell running past the page");
            };
            if kind == Kind::Leaf
                && self.0[off + 2] == 1
                && len != 7 + u16_at(&self.0[..], off) as usize + 4
            {
                return bad("a malformed overflow cell");
            }
            cells.push((off, len));
        }
        cells.sort_unstable();
        if cells.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return bad("two cells overlap");
        }
        // Keys strictly ascending: a search over them finds each key at
        // one place, as every split, merge and redo assumes.
        if (1..n).any(|i| self.key(i - 1) >= self.key(i)) {
            return bad("keys out of order");
        }
        Ok(())
    }

    /// The page's image for the log: the bytes below the hole and above
    /// it (PostgreSQL leaves a page's hole out of its full-page images).
    pub fn image(&self) -> (&[u8], &[u8]) {
        (&self.0[..self.lower()], &self.0[self.upper()..])
    }

    /// The page rebuilt from a logged image, stamped with `lsn`.
    pub fn from_image(number: PageNo, head: &[u8], tail: &[u8], lsn: Lsn) -> Result<Page, Invalid> {
        if head.len() < HEADER || head.len() + tail.len() > PAGE_SIZE {
            return Err(Invalid::Structure("an image of the wrong size"));
        }
        let mut p = Page(Box::new([0u8; PAGE_SIZE]), None);
        p.0[..head.len()].copy_from_slice(head);
        p.0[PAGE_SIZE - tail.len()..].copy_from_slice(tail);
        if &p.0[..4] != PAGE_MAGIC || p.lower() != head.len() || p.upper() != PAGE_SIZE - tail.len()
        {
            return Err(Invalid::Structure(
                "an image whose header disagrees with it",
            ));
        }
        p.set_lsn(lsn);
        p.validate(number)?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests;
