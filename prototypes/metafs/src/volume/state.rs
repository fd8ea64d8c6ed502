//! The running transaction's view of the image: cached blocks, inodes,
//! the inode and block bitmaps and their allocators, and the snapshot a
//! commit takes. Block maps are in `bmap.rs`, directories in `dirs.rs`.

use super::*;
use crate::layout::BITS_PER_BLOCK;

impl State {
    /// The cached block `b`, read from the image on first use.
    fn block(&mut self, img: &dyn VfsFile, b: u32) -> Result<&mut Box<[u8]>> {
        if b >= self.sb.blocks {
            return Err(Error::Corrupt(format!("block {b} beyond the image")));
        }
        if self.cache.get_mut(b).is_none() {
            let mut buf = vec![0u8; BLOCK].into_boxed_slice();
            img.read_exact_at(&mut buf, b as u64 * BLOCK as u64)?;
            let dirty = &self.checkpoint_set;
            return Ok(self.cache.insert(b, buf, |x| dirty.contains(&x)));
        }
        self.cache.get_mut(b).ok_or_else(|| lost(b))
    }

    pub(super) fn get(&mut self, img: &dyn VfsFile, b: u32) -> Result<&[u8]> {
        Ok(self.block(img, b)?)
    }

    pub(super) fn get_mut(&mut self, img: &dyn VfsFile, b: u32) -> Result<&mut [u8]> {
        // Loaded first: a block is marked running only once it is cached.
        self.block(img, b)?;
        self.ops += 1;
        self.running.insert(b);
        self.checkpoint_set.insert(b);
        Ok(self.block(img, b)?)
    }

    /// A newly allocated metadata block: zeros, never read from disk.
    pub(super) fn fresh(&mut self, b: u32) -> &mut [u8] {
        self.ops += 1;
        self.running.insert(b);
        self.checkpoint_set.insert(b);
        let dirty = &self.checkpoint_set;
        self.cache
            .insert(b, vec![0u8; BLOCK].into_boxed_slice(), |x| {
                dirty.contains(&x)
            })
    }

    pub(super) fn inode(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<Inode> {
        if ino == 0 || ino >= self.sb.inodes {
            return Err(Error::NotFound);
        }
        let (b, o) = self.sb.inode_place(ino);
        Inode::decode(&self.get(img, b)?[o..])
    }

    /// A live inode (not free).
    pub(super) fn live(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<Inode> {
        let i = self.inode(img, ino)?;
        if i.kind == Kind::Free {
            return Err(Error::NotFound);
        }
        Ok(i)
    }

    pub(super) fn dir(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<Inode> {
        let i = self.live(img, ino)?;
        if i.kind != Kind::Dir {
            return Err(Error::NotADirectory);
        }
        Ok(i)
    }

    pub(super) fn set_inode(&mut self, img: &dyn VfsFile, ino: Ino, i: &Inode) -> Result<()> {
        let (b, o) = self.sb.inode_place(ino);
        i.encode(&mut self.get_mut(img, b)?[o..]);
        Ok(())
    }

    /// Sets the modification and change times of `ino` to now.
    pub(super) fn touch(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let mut i = self.live(img, ino)?;
        let now = Time::now();
        (i.mtime, i.ctime) = (now, now);
        self.set_inode(img, ino, &i)
    }

    // ---- bitmaps ---------------------------------------------------------

    fn bit_in(&mut self, img: &dyn VfsFile, (blk, bit): (u32, usize)) -> Result<bool> {
        Ok(self.get(img, blk)?[bit / 8] & (1 << (bit % 8)) != 0)
    }

    fn set_bit_in(&mut self, img: &dyn VfsFile, (blk, bit): (u32, usize), on: bool) -> Result<()> {
        let byte = &mut self.get_mut(img, blk)?[bit / 8];
        if on {
            *byte |= 1 << (bit % 8);
        } else {
            *byte &= !(1 << (bit % 8));
        }
        Ok(())
    }

    /// Whether block `b` is marked in use.
    pub(super) fn bit(&mut self, img: &dyn VfsFile, b: u32) -> Result<bool> {
        let place = self.sb.bit_place(b);
        self.bit_in(img, place)
    }

    /// Whether inode `ino` is marked in use.
    pub(super) fn ibit(&mut self, img: &dyn VfsFile, ino: u32) -> Result<bool> {
        let place = self.sb.ibit_place(ino);
        self.bit_in(img, place)
    }

    /// Counts the clear bits of a bitmap (the first `bits` bits from
    /// block `start`), per bitmap block.
    pub(super) fn count_clear(
        &mut self,
        img: &dyn VfsFile,
        start: u32,
        bits: u32,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut left = bits;
        let mut blk = start;
        while left > 0 {
            let here = left.min(BITS_PER_BLOCK);
            let data = self.get(img, blk)?;
            let full = (here / 8) as usize;
            let mut used: u32 = data[..full].iter().map(|b| b.count_ones()).sum();
            if !here.is_multiple_of(8) {
                used += (data[full] & ((1u8 << (here % 8)) - 1)).count_ones();
            }
            out.push(here - used);
            left -= here;
            blk += 1;
        }
        Ok(out)
    }

    /// The first clear bit at or after `from` (below `limit`) of the bitmap
    /// at block `start`, skipping bitmap blocks `counts` says are full and
    /// bits `skip` refuses; scans whole bytes, so full stretches cost one
    /// comparison per eight bits.
    fn find_clear(
        &mut self,
        img: &dyn VfsFile,
        start: u32,
        (from, limit): (u32, u32),
        counts: &[u32],
        skip: &dyn Fn(u32) -> bool,
    ) -> Result<Option<u32>> {
        let mut bit = from;
        while bit < limit {
            let group = (bit / BITS_PER_BLOCK) as usize;
            let group_end = ((group as u32 + 1) * BITS_PER_BLOCK).min(limit);
            if counts.get(group).copied().unwrap_or(0) == 0 {
                bit = group_end;
                continue;
            }
            let data = self.get(img, start + group as u32)?;
            while bit < group_end {
                let off = bit % BITS_PER_BLOCK;
                let byte = data[(off / 8) as usize];
                if byte == 0xFF {
                    bit = (bit | 7) + 1;
                    continue;
                }
                if byte & (1 << (off % 8)) == 0 && !skip(bit) {
                    return Ok(Some(bit));
                }
                bit += 1;
            }
        }
        Ok(None)
    }

    /// Blocks that can be allocated now.
    pub(super) fn available(&self) -> u64 {
        self.free_blocks - self.unavailable.len() as u64
    }

    /// Allocates a block (the caller checked [`State::available`]).
    pub(super) fn alloc_block(&mut self, img: &dyn VfsFile) -> Result<u32> {
        let (lo, hi) = (self.sb.data_start, self.sb.blocks);
        let hint = self.block_hint.clamp(lo, hi - 1);
        let counts = std::mem::take(&mut self.group_free);
        let unavailable = std::mem::take(&mut self.unavailable);
        let skip = |b: u32| unavailable.contains(&b);
        let start = self.sb.bitmap_start;
        let found = match self.find_clear(img, start, (hint, hi), &counts, &skip) {
            Ok(None) => self.find_clear(img, start, (lo, hint), &counts, &skip),
            r => r,
        };
        self.group_free = counts;
        self.unavailable = unavailable;
        let b = found?.ok_or(Error::NoSpace)?;
        let place = self.sb.bit_place(b);
        self.set_bit_in(img, place, true)?;
        self.group_free[(b / BITS_PER_BLOCK) as usize] -= 1;
        self.free_blocks -= 1;
        self.block_hint = if b + 1 >= hi { lo } else { b + 1 };
        Ok(b)
    }

    /// `b` as a block map may point to it: 0 (a hole) or a data-area
    /// block. A pointer read from a hostile image that names the
    /// superblock, a bitmap, the inode table or a block past the end is
    /// corrupt, never followed, written or freed.
    pub(super) fn mapped(&self, b: u32) -> Result<u32> {
        if b != 0 && (b < self.sb.data_start || b >= self.sb.blocks) {
            return Err(Error::Corrupt(format!(
                "a block map points to block {b}, outside the data area"
            )));
        }
        Ok(b)
    }

    /// Frees a block; `meta`: it held metadata (it leaves the cache and is
    /// revoked).
    pub(super) fn free_block(&mut self, img: &dyn VfsFile, b: u32, meta: bool) -> Result<()> {
        if b == 0 {
            return Err(Error::Corrupt("freeing block 0".into()));
        }
        self.mapped(b)?;
        let place = self.sb.bit_place(b);
        self.set_bit_in(img, place, false)?;
        self.group_free[(b / BITS_PER_BLOCK) as usize] += 1;
        self.free_blocks += 1;
        self.pending_free.push(b);
        self.unavailable.insert(b);
        if meta {
            self.cache.remove(b);
            self.running.remove(&b);
            self.checkpoint_set.remove(&b);
            self.revoked.push(b);
        }
        Ok(())
    }

    /// Allocates an inode and writes `new` into it.
    pub(super) fn alloc_inode(&mut self, img: &dyn VfsFile, new: &Inode) -> Result<Ino> {
        let n = self.sb.inodes;
        let hint = self.inode_hint.clamp(ROOT + 1, n - 1);
        let counts = std::mem::take(&mut self.igroup_free);
        let start = self.sb.ibitmap_start;
        let none = |_: u32| false;
        let found = match self.find_clear(img, start, (hint, n), &counts, &none) {
            Ok(None) => self.find_clear(img, start, (ROOT + 1, hint), &counts, &none),
            r => r,
        };
        self.igroup_free = counts;
        let ino = found?.ok_or(Error::NoSpace)?;
        if self.inode(img, ino)?.kind != Kind::Free {
            return Err(Error::Corrupt(format!(
                "inode {ino} is marked free but in use"
            )));
        }
        let place = self.sb.ibit_place(ino);
        self.set_bit_in(img, place, true)?;
        self.igroup_free[(ino / BITS_PER_BLOCK) as usize] -= 1;
        self.set_inode(img, ino, new)?;
        self.free_inodes -= 1;
        self.inode_hint = ino + 1;
        Ok(ino)
    }

    /// Frees inode `ino`: its blocks and attributes, its bitmap bit, its
    /// directory index.
    pub(super) fn free_inode(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let mut i = self.inode(img, ino)?;
        let meta = i.kind == Kind::Dir;
        self.free_blocks_from(img, &mut i, 0, meta)?;
        self.free_xattrs(img, &mut i)?;
        self.set_inode(img, ino, &Inode::free())?;
        let place = self.sb.ibit_place(ino);
        self.set_bit_in(img, place, false)?;
        self.igroup_free[(ino / BITS_PER_BLOCK) as usize] += 1;
        self.free_inodes += 1;
        self.dirs.forget(ino);
        Ok(())
    }

    /// A file grows from `i.size` to `upto`: zeros the rest of its old last
    /// block up to there, which may hold bytes of an earlier, longer life
    /// of the file. (Beyond the old size: invisible until the new size
    /// commits, so this data write needs no ordering of its own.)
    pub(super) fn zero_tail(&mut self, img: &dyn VfsFile, i: &Inode, upto: u64) -> Result<()> {
        let bs = BLOCK as u64;
        if i.size.is_multiple_of(bs) {
            return Ok(());
        }
        let idx = i.size / bs;
        let b = self.bmap(img, i, idx)?;
        if b == 0 {
            return Ok(());
        }
        let from = i.size % bs;
        let to = if upto / bs == idx { upto % bs } else { bs };
        img.write_at(&vec![0u8; (to - from) as usize], b as u64 * bs + from)?;
        self.data_dirty = true;
        self.ops += 1;
        Ok(())
    }

    // ---- transactions --------------------------------------------------

    /// The length the running transaction's record would have now.
    pub(super) fn record_len(&self) -> usize {
        txn::encoded_len(self.running.len(), self.revoked.len())
    }

    /// Takes the running transaction: its record (if it changed metadata),
    /// the blocks it freed, and whether data was written since the last
    /// image sync.
    pub(super) fn take(&mut self, tid: u64) -> Result<Snapshot> {
        let data_dirty = std::mem::take(&mut self.data_dirty);
        let ops = self.ops;
        let frees = std::mem::take(&mut self.pending_free);
        if self.running.is_empty() && self.revoked.is_empty() {
            return Ok(Snapshot {
                record: None,
                frees,
                data_dirty,
                ops,
            });
        }
        let running = std::mem::take(&mut self.running);
        let revoked = std::mem::take(&mut self.revoked);
        let cache = &self.cache;
        // (A block of the running transaction is in the checkpoint set, so
        // it never left the cache.)
        let blocks = running
            .iter()
            .map(|b| Ok((*b, cache.peek(*b).ok_or_else(|| lost(*b))?)))
            .collect::<Result<Vec<(u32, &[u8])>>>()?;
        Ok(Snapshot {
            record: Some(txn::encode(tid, blocks.into_iter(), &revoked)),
            frees,
            data_dirty,
            ops,
        })
    }
}

/// A block missing from the cache where it may not be: a broken
/// invariant, answered with an error rather than a guess.
pub(super) fn lost(b: u32) -> Error {
    Error::Corrupt(format!("metadata block {b} missing from the cache"))
}
