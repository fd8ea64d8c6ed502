//! `fallocate(2)` — preallocation (with or without `FALLOC_FL_KEEP_SIZE`),
//! hole punching, zeroing a range — and `lseek(2)`'s `SEEK_DATA` and
//! `SEEK_HOLE`.
//!
//! metafs's block map has no unwritten extents: a preallocated block is a
//! block written with zeros before the transaction that maps it commits
//! (ordered mode, as for any new block), so it reads as zeros and counts as
//! data for `SEEK_DATA`. A range is handled [`CHUNK`] blocks per operation,
//! each a change of the running transaction like any other (which commits
//! when it fills): a crash keeps a prefix of a large preallocation, as
//! ext4's may. Preallocating and punching whole blocks change only
//! metadata (a block mapped, new and zeroed; a block unmapped and freed),
//! so each step is all or nothing across a crash; zeroing rewrites mapped
//! blocks in place, and the partial blocks at a range's ends are zeroed in
//! place, as ext4 zeroes them — data writes, which a crash may keep
//! before the metadata around them, as it may any overwrite.

use super::bmap::blocks_of;
use super::*;
use crate::layout::{span, tree_first, MAX_BLOCKS, PER_INDIRECT};

/// Blocks one step of a range covers (64 MiB).
const CHUNK: u64 = 16_384;

/// What [`Fs::fallocate`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Falloc {
    /// Maps every block of the range (zeros where there was a hole);
    /// grows the file to the range's end unless `keep_size`.
    Allocate {
        /// `FALLOC_FL_KEEP_SIZE`: blocks past the end stay past it.
        keep_size: bool,
    },
    /// `FALLOC_FL_PUNCH_HOLE`: the range reads as zeros and its whole
    /// blocks are freed; the size stays.
    PunchHole,
    /// `FALLOC_FL_ZERO_RANGE`: the range reads as zeros and is allocated;
    /// grows the file unless `keep_size`.
    ZeroRange {
        /// `FALLOC_FL_KEEP_SIZE`.
        keep_size: bool,
    },
}

/// One pass over whole blocks of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Holes mapped to new zeroed blocks.
    Map,
    /// Mapped blocks freed.
    Unmap,
    /// Mapped blocks zeroed in place.
    Zero,
}

impl Fs {
    /// `fallocate(2)` of `len` bytes at `offset` of regular file `ino`.
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: Falloc) -> Result<()> {
        let end = offset.checked_add(len).ok_or(Error::FileTooLarge)?;
        if len == 0 {
            return Err(Error::InvalidArgument("fallocate of no bytes"));
        }
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        let bs = BLOCK as u64;
        // Every block the range touches, and those it covers whole.
        let (first, end_block) = (offset / bs, end.div_ceil(bs));
        let (whole_first, whole_end) = (offset.div_ceil(bs), end / bs);
        let passes: &[(Pass, u64, u64)] = match mode {
            Falloc::Allocate { .. } => &[(Pass::Map, first, end_block)],
            Falloc::PunchHole => &[(Pass::Unmap, whole_first, whole_end)],
            Falloc::ZeroRange { .. } => &[
                (Pass::Zero, whole_first, whole_end),
                (Pass::Map, first, end_block),
            ],
        };
        if mode != Falloc::PunchHole {
            self.with_space(|st, img| st.room_for(img, ino, first, end_block - 1))?;
        }
        if !matches!(mode, Falloc::Allocate { .. }) {
            self.with(|st, img| st.zero_partial(img, ino, offset, end))?;
        }
        for &(pass, from, to) in passes {
            let mut at = from;
            while at < to {
                let next = to.min(at + CHUNK);
                self.with_space(|st, img| st.pass(img, ino, at, next, pass))?;
                at = next;
            }
        }
        self.with(|st, img| {
            let mut i = st.regular(img, ino)?;
            let (grow, changes_data) = match mode {
                Falloc::Allocate { keep_size } => (!keep_size, false),
                Falloc::ZeroRange { keep_size } => (!keep_size, true),
                Falloc::PunchHole => (false, true),
            };
            let now = Time::now();
            if grow && end > i.size {
                st.zero_tail(img, &i, end)?;
                i.size = end;
                i.mtime = now;
            }
            if changes_data {
                i.mtime = now;
            }
            i.ctime = now;
            st.set_inode(img, ino, &i)
        })
    }

    /// Blocks of data one new file could still be given: the free blocks
    /// less the tree blocks that would map them (about one in 1,024) —
    /// `statfs`'s `f_bavail`, so that a file of the size `df` reports
    /// available fits (xfstests's generic/103 preallocates all of it but
    /// 512 KiB). Blocks freed but not yet reusable count as free: a write
    /// or preallocation that needs them commits to have them
    /// (see `Fs::with_space`).
    pub fn data_available(&self) -> u64 {
        let free = self.free().0;
        free.saturating_sub(map_overhead(free))
    }

    /// `SEEK_DATA` (`data`) or `SEEK_HOLE` from `offset` in file `ino`:
    /// the first byte at or after `offset` in a mapped block (or a hole:
    /// an unmapped block, or the end of the file). `None` (`ENXIO`) at or
    /// past the end, or when no data follows.
    pub fn seek(&self, ino: Ino, offset: u64, data: bool) -> Result<Option<u64>> {
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            if offset >= i.size {
                return Ok(None);
            }
            let bs = BLOCK as u64;
            let end = blocks_of(i.size);
            let found = st.next_block(img, &i, offset / bs, end, data)?;
            Ok(match (found, data) {
                (Some(idx), _) => Some((idx * bs).max(offset)),
                (None, true) => None,
                (None, false) => Some(i.size),
            })
        })
    }
}

/// At most the tree blocks that map `n` data blocks of one file: a leaf
/// per [`PER_INDIRECT`] data blocks, a node above per `PER_INDIRECT`
/// leaves, the three trees' roots, and one more leaf and node where a
/// run straddles two of them.
fn map_overhead(n: u64) -> u64 {
    let per = PER_INDIRECT as u64;
    n.div_ceil(per) + n.div_ceil(per * per) + 3 + 2
}

impl State {
    /// Whether the blocks `[first, last]` of `ino` would need can be had.
    fn room_for(&mut self, img: &dyn VfsFile, ino: Ino, first: u64, last: u64) -> Result<()> {
        let i = self.regular(img, ino)?;
        // At least this many are holes, whatever the map: a quick refusal
        // of a range far larger than the free space.
        let at_least = (last - first + 1).saturating_sub(i.blocks);
        if at_least > self.available() {
            return Err(Error::NoSpace);
        }
        if self.blocks_needed(img, &i, first, last)? > self.available() {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Zeroes the bytes of `[from, to)` in the range's partial first and
    /// last blocks, where they are mapped and below the file's end.
    fn zero_partial(&mut self, img: &dyn VfsFile, ino: Ino, from: u64, to: u64) -> Result<()> {
        let i = self.regular(img, ino)?;
        let bs = BLOCK as u64;
        let mut edges = vec![(from, to.min((from / bs + 1) * bs))];
        if !to.is_multiple_of(bs) && to / bs != from / bs {
            edges.push(((to / bs) * bs, to));
        }
        for (lo, hi) in edges {
            if lo.is_multiple_of(bs) && hi - lo == bs {
                continue; // a whole block: the caller's
            }
            let b = self.bmap(img, &i, lo / bs)?;
            if b != 0 && lo < hi {
                img.write_at(&vec![0u8; (hi - lo) as usize], b as u64 * bs + lo % bs)?;
                self.data_dirty = true;
                self.ops += 1;
            }
        }
        Ok(())
    }

    /// One pass over blocks `[from, to)` of `ino`.
    fn pass(&mut self, img: &dyn VfsFile, ino: Ino, from: u64, to: u64, pass: Pass) -> Result<()> {
        let mut i = self.regular(img, ino)?;
        let mut zeros = ZeroRuns::default();
        match pass {
            Pass::Unmap => self.free_range(img, &mut i, from, to)?,
            Pass::Map => {
                if self.blocks_needed(img, &i, from, to - 1)? > self.available() {
                    return Err(Error::NoSpace);
                }
                let mut idx = from;
                while let Some(hole) = self.next_block(img, &i, idx, to, false)? {
                    let b = self.map_new(img, &mut i, hole)?;
                    zeros.add(img, b)?;
                    idx = hole + 1;
                }
            }
            Pass::Zero => {
                let mut idx = from;
                while let Some(at) = self.next_block(img, &i, idx, to, true)? {
                    zeros.add(img, self.bmap(img, &i, at)?)?;
                    idx = at + 1;
                }
            }
        }
        zeros.flush(img)?;
        if zeros.any {
            self.data_dirty = true;
            self.ops += 1;
        }
        self.set_inode(img, ino, &i)
    }

    /// Frees the data blocks of `[from, to)` and the tree blocks left
    /// with nothing below them.
    fn free_range(&mut self, img: &dyn VfsFile, i: &mut Inode, from: u64, to: u64) -> Result<()> {
        for idx in from.min(DIRECT as u64)..to.min(DIRECT as u64) {
            let b = self.mapped(i.direct[idx as usize])?;
            if b != 0 {
                self.free_block(img, b, false)?;
                i.direct[idx as usize] = 0;
                i.blocks = i.blocks.saturating_sub(1);
            }
        }
        for depth in 1..=3 {
            let (root, base) = (i.trees[depth - 1], tree_first(depth));
            if root == 0 || base + span(depth) <= from || base >= to {
                continue;
            }
            let mut freed = 0;
            if self.cut_range(img, root, depth, base, (from, to), &mut freed)? {
                self.free_block(img, root, true)?;
                freed += 1;
                i.trees[depth - 1] = 0;
            }
            i.blocks = i.blocks.saturating_sub(freed);
        }
        Ok(())
    }

    /// Frees what tree block `node` (`levels` above the data, its first
    /// index `base`) maps in `[from, to)`; counts the blocks freed in
    /// `freed`; returns whether `node` now maps nothing (the caller frees
    /// it). Recursion is at most three deep.
    fn cut_range(
        &mut self,
        img: &dyn VfsFile,
        node: u32,
        levels: usize,
        base: u64,
        (from, to): (u64, u64),
        freed: &mut u64,
    ) -> Result<bool> {
        self.mapped(node)?;
        if *freed > self.sb.blocks as u64 {
            return Err(Error::Corrupt(
                "a block map frees more blocks than the image has".into(),
            ));
        }
        let child_span = span(levels - 1);
        let ptrs: Vec<(usize, u32)> = {
            let blk = self.get(img, node)?;
            (0..PER_INDIRECT)
                .map(|k| (k, ptr_at(blk, k)))
                .filter(|&(_, p)| p != 0)
                .collect()
        };
        let mut cleared = Vec::new();
        for &(k, p) in &ptrs {
            let cb = base + k as u64 * child_span;
            if cb + child_span <= from || cb >= to {
                continue;
            }
            let whole = cb >= from && cb + child_span <= to;
            let gone = match levels {
                1 => true,
                _ => self.cut_range(img, p, levels - 1, cb, (from, to), freed)? || whole,
            };
            if gone {
                self.free_block(img, self.mapped(p)?, levels > 1)?;
                *freed += 1;
                cleared.push(k);
            }
        }
        if cleared.len() == ptrs.len() {
            return Ok(true);
        }
        if !cleared.is_empty() {
            let blk = self.get_mut(img, node)?;
            for k in cleared {
                set_ptr(blk, k, 0);
            }
        }
        Ok(false)
    }

    /// The first block index in `[from, end)` of `i` that is mapped
    /// (`data`) or a hole (not `data`).
    pub(super) fn next_block(
        &mut self,
        img: &dyn VfsFile,
        i: &Inode,
        from: u64,
        end: u64,
        data: bool,
    ) -> Result<Option<u64>> {
        let end = end.min(MAX_BLOCKS);
        for idx in from..end.min(DIRECT as u64) {
            if (self.mapped(i.direct[idx as usize])? != 0) == data {
                return Ok(Some(idx));
            }
        }
        for depth in 1..=3 {
            let base = tree_first(depth);
            if base >= end {
                break;
            }
            if base + span(depth) <= from {
                continue;
            }
            let root = self.mapped(i.trees[depth - 1])?;
            let found = match root {
                0 if !data => Some(from.max(base)),
                0 => None,
                r => self.scan(img, r, depth, base, (from, end), data)?,
            };
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// [`State::next_block`] within tree block `node`.
    fn scan(
        &mut self,
        img: &dyn VfsFile,
        node: u32,
        levels: usize,
        base: u64,
        (from, end): (u64, u64),
        data: bool,
    ) -> Result<Option<u64>> {
        let child_span = span(levels - 1);
        let first = from.saturating_sub(base) / child_span;
        for k in first as usize..PER_INDIRECT {
            let cb = base + k as u64 * child_span;
            if cb >= end {
                break;
            }
            let raw = ptr_at(self.get(img, node)?, k);
            let p = self.mapped(raw)?;
            let found = match (p, levels) {
                (0, _) if !data => Some(from.max(cb)),
                (0, _) => None,
                (_, 1) if data => Some(from.max(cb)),
                (_, 1) => None,
                (p, l) => self.scan(img, p, l - 1, cb, (from, end), data)?,
            };
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }
}

/// New blocks to zero on the image, written a run of consecutive blocks
/// at a time.
#[derive(Default)]
struct ZeroRuns {
    run: Option<(u32, u32)>,
    any: bool,
}

/// The longest run written at once (1 MiB).
const RUN: u32 = 256;

impl ZeroRuns {
    fn add(&mut self, img: &dyn VfsFile, b: u32) -> Result<()> {
        self.any = true;
        match self.run {
            Some((start, n)) if start + n == b && n < RUN => self.run = Some((start, n + 1)),
            _ => {
                self.flush(img)?;
                self.run = Some((b, 1));
            }
        }
        Ok(())
    }

    fn flush(&mut self, img: &dyn VfsFile) -> Result<()> {
        if let Some((start, n)) = self.run.take() {
            img.write_at(&vec![0u8; n as usize * BLOCK], start as u64 * BLOCK as u64)?;
        }
        Ok(())
    }
}
