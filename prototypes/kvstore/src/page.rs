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

/// Bytes per page.
pub const PAGE_SIZE: usize = 4096;
/// Bytes of a page's header.
pub const HEADER: usize = 32;
/// Payload bytes of an overflow page.
pub const OVERFLOW_PAYLOAD: usize = PAGE_SIZE - HEADER;
/// The format version of the data file and the log records.
pub const FORMAT_VERSION: u16 = 2;
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
    /// On the free list; `link` is the next free page.
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

/// One page's bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Page(Box<[u8; PAGE_SIZE]>);

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
    let mut c = Vec::with_capacity(7 + key.len() + 8);
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
        let mut p = Page(Box::new([0u8; PAGE_SIZE]));
        p.0[..4].copy_from_slice(PAGE_MAGIC);
        p.0[16..20].copy_from_slice(&number.to_le_bytes());
        p.0[20] = kind as u8;
        p.set_lower(HEADER);
        p.set_upper(PAGE_SIZE);
        p
    }

    /// A free page pointing at the next free page.
    pub fn free(number: PageNo, next: PageNo) -> Page {
        let mut p = Page::new(number, Kind::Free);
        p.set_link(next);
        p
    }

    /// An overflow page holding `payload` (at most [`OVERFLOW_PAYLOAD`]).
    pub fn overflow(number: PageNo, payload: &[u8], next: PageNo) -> Page {
        let mut p = Page::new(number, Kind::Overflow);
        p.0[HEADER..HEADER + payload.len()].copy_from_slice(payload);
        p.set_lower(HEADER + payload.len());
        p.set_link(next);
        p
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8; PAGE_SIZE] {
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

    /// Cells on the page.
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

    /// Branch: the leftmost child; overflow and free: the next page.
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
    pub fn cells(&self) -> Vec<Vec<u8>> {
        (0..self.count()).map(|i| self.cell(i).to_vec()).collect()
    }

    /// A page of `kind` holding `cells` (which fit: the caller split them).
    pub fn from_cells(number: PageNo, kind: Kind, link: PageNo, cells: &[Vec<u8>]) -> Page {
        let mut p = Page::new(number, kind);
        p.set_link(link);
        for (i, c) in cells.iter().enumerate() {
            let fit = p.put_cell(i, c, false);
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
        let mut p = Page(Box::new([0u8; PAGE_SIZE]));
        self.seal_into(&mut p.0);
        p
    }

    /// A page over a buffer (its bytes are this page's copy).
    pub(crate) fn from_buffer(b: Box<[u8; PAGE_SIZE]>) -> Page {
        Page(b)
    }

    /// The page's buffer, for reuse.
    pub(crate) fn into_buffer(self) -> Box<[u8; PAGE_SIZE]> {
        self.0
    }

    /// Checks a page read from disk: magic, CRC, then [`Page::validate`].
    pub fn from_disk(bytes: Box<[u8; PAGE_SIZE]>, number: PageNo) -> Result<Page, Invalid> {
        let p = Page(bytes);
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
            Kind::Overflow | Kind::Free => {
                if n != 0 || upper != PAGE_SIZE || (kind == Kind::Free && lower != HEADER) {
                    return bad("an overflow or free page with cells");
                }
                return Ok(());
            }
            Kind::Leaf | Kind::Branch => {}
        }
        if lower != HEADER + 2 * n {
            return bad("the slot array's end disagrees with the cell count");
        }
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
        let mut p = Page(Box::new([0u8; PAGE_SIZE]));
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
mod tests {
    use super::*;

    #[test]
    fn cells_stay_sorted_through_puts_replaces_and_removes() {
        let mut p = Page::new(5, Kind::Leaf);
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for i in (0..100u32).rev() {
            let k = format!("key{i:03}").into_bytes();
            let c = leaf_cell(&k, Value::Inline(&[i as u8; 40]));
            let at = p.search(&k).unwrap_err();
            if !p.put_cell(at, &c, false) {
                break;
            }
            keys.insert(0, k);
        }
        assert!(keys.len() > 60 && keys.len() < 100, "{}", keys.len());
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(p.key(i), &k[..]);
        }
        // Replace with a longer value, remove every other: still sorted,
        // and the page refills (compaction reclaims the fragments).
        let k = keys[3].clone();
        assert!(p.put_cell(3, &leaf_cell(&k, Value::Inline(&[9; 41])), true));
        assert_eq!(p.value(3), Value::Inline(&[9; 41]));
        for i in (0..p.count()).rev().step_by(2) {
            p.remove_cell(i);
        }
        let before = p.count();
        let mut added = 0;
        for i in 0..100u32 {
            let k = format!("zz{i:03}").into_bytes();
            let at = p.search(&k).unwrap_err();
            if p.put_cell(at, &leaf_cell(&k, Value::Inline(&[1; 40])), false) {
                added += 1;
            }
        }
        assert!(added >= before - 1, "{added} vs {before}");
        p.validate(5).unwrap();
        for i in 1..p.count() {
            assert!(p.key(i - 1) < p.key(i));
        }
    }

    #[test]
    fn pages_round_trip_through_disk_and_images_and_every_bit_flip_is_caught() {
        let mut p = Page::new(7, Kind::Branch);
        p.set_link(3);
        assert!(p.put_cell(0, &branch_cell(b"m", 9), false));
        p.set_lsn(Lsn(99));
        let disk = Page::from_disk(p.sealed().0, 7).unwrap();
        assert_eq!(disk.child(0), 9);
        assert_eq!(disk.nth_child(0), 3);
        assert_eq!(
            Page::from_disk(p.sealed().0, 8).unwrap_err(),
            Invalid::Structure("the page's number is another page's")
        );
        for bit in [0usize, 37, 64, 130, 8 * 200, 8 * 4095 + 7] {
            let mut q = p.sealed();
            q.0[bit / 8] ^= 1 << (bit % 8);
            assert!(Page::from_disk(q.0, 7).is_err(), "bit {bit}");
        }
        let (head, tail) = p.image();
        assert_eq!(head.len() + tail.len(), HEADER + 2 + 7);
        let back = Page::from_image(7, head, tail, Lsn(100)).unwrap();
        assert_eq!(
            (back.lsn(), back.child(0), back.key(0)),
            (Lsn(100), 9, &b"m"[..])
        );
    }

    #[test]
    fn hostile_cells_are_refused_by_validate() {
        let mut p = Page::new(4, Kind::Leaf);
        assert!(p.put_cell(0, &leaf_cell(b"k", Value::Inline(b"v")), false));
        let off = p.slot(0);
        // A value length running past the page.
        let mut q = p.clone();
        q.0[off + 3..off + 7].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(q.validate(4).is_err());
        // A slot pointing into the header.
        let mut q = p.clone();
        q.set_slot(0, 2);
        assert!(q.validate(4).is_err());
        // A count past the slot array.
        let mut q = p.clone();
        q.set_count(900);
        assert!(q.validate(4).is_err());
    }
}
