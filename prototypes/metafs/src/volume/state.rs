//! The running transaction's view of the image: cached blocks, inodes,
//! the block and inode bitmaps, block maps, directory entries, and the
//! snapshot a commit takes.

use super::*;
use std::collections::hash_map::Entry;

impl State {
    /// The cached block `b`, read from the image on first use.
    fn block(&mut self, img: &dyn VfsFile, b: u32) -> Result<&mut Box<[u8]>> {
        if b >= self.sb.blocks {
            return Err(Error::Corrupt(format!("block {b} beyond the image")));
        }
        match self.cache.entry(b) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => {
                let mut buf = vec![0u8; BLOCK].into_boxed_slice();
                img.read_exact_at(&mut buf, b as u64 * BLOCK as u64)?;
                Ok(e.insert(buf))
            }
        }
    }

    pub(super) fn load(&mut self, img: &dyn VfsFile, b: u32) -> Result<()> {
        self.block(img, b).map(|_| ())
    }

    pub(super) fn get(&mut self, img: &dyn VfsFile, b: u32) -> Result<&[u8]> {
        Ok(self.block(img, b)?)
    }

    pub(super) fn get_mut(&mut self, img: &dyn VfsFile, b: u32) -> Result<&mut [u8]> {
        // Loaded first: a block is marked running only once it is cached.
        self.load(img, b)?;
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
        let block = self.cache.entry(b).or_default();
        *block = vec![0u8; BLOCK].into_boxed_slice();
        block
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

    pub(super) fn bit(&mut self, img: &dyn VfsFile, b: u32) -> Result<bool> {
        let (blk, bit) = self.sb.bit_place(b);
        Ok(self.get(img, blk)?[bit / 8] & (1 << (bit % 8)) != 0)
    }

    pub(super) fn set_bit(&mut self, img: &dyn VfsFile, b: u32, on: bool) -> Result<()> {
        let (blk, bit) = self.sb.bit_place(b);
        let byte = &mut self.get_mut(img, blk)?[bit / 8];
        if on {
            *byte |= 1 << (bit % 8);
        } else {
            *byte &= !(1 << (bit % 8));
        }
        Ok(())
    }

    /// Blocks that can be allocated now.
    pub(super) fn available(&self) -> u64 {
        self.free_blocks - self.unavailable.len() as u64
    }

    /// Allocates a block (the caller checked [`State::available`]).
    pub(super) fn alloc_block(&mut self, img: &dyn VfsFile) -> Result<u32> {
        let (lo, hi) = (self.sb.data_start, self.sb.blocks);
        let span = hi - lo;
        for k in 0..span {
            let b = lo + (self.block_hint - lo + k) % span;
            if !self.unavailable.contains(&b) && !self.bit(img, b)? {
                self.set_bit(img, b, true)?;
                self.free_blocks -= 1;
                self.block_hint = b + 1;
                if self.block_hint >= hi {
                    self.block_hint = lo;
                }
                return Ok(b);
            }
        }
        Err(Error::NoSpace)
    }

    /// Frees a block; `meta`: it held metadata (it leaves the cache and is
    /// revoked).
    pub(super) fn free_block(&mut self, img: &dyn VfsFile, b: u32, meta: bool) -> Result<()> {
        self.set_bit(img, b, false)?;
        self.free_blocks += 1;
        self.pending_free.push(b);
        self.unavailable.insert(b);
        if meta {
            self.cache.remove(&b);
            self.running.remove(&b);
            self.checkpoint_set.remove(&b);
            self.revoked.push(b);
        }
        Ok(())
    }

    pub(super) fn alloc_inode(
        &mut self,
        img: &dyn VfsFile,
        kind: Kind,
        parent: Ino,
    ) -> Result<Ino> {
        let n = self.sb.inodes;
        for k in 0..n {
            let ino = (self.inode_hint + k) % n;
            if ino <= ROOT {
                continue;
            }
            if self.inode(img, ino)?.kind == Kind::Free {
                self.set_inode(img, ino, &Inode::new(kind, parent, now_ns()))?;
                self.free_inodes -= 1;
                self.inode_hint = ino + 1;
                return Ok(ino);
            }
        }
        Err(Error::NoSpace)
    }

    pub(super) fn free_inode(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let mut i = self.inode(img, ino)?;
        let meta = i.kind == Kind::Dir;
        self.free_blocks_from(img, &mut i, 0, meta)?;
        self.set_inode(img, ino, &Inode::free())?;
        self.free_inodes += 1;
        Ok(())
    }

    /// The block at index `idx` of an inode (0: a hole).
    pub(super) fn bmap(&mut self, img: &dyn VfsFile, i: &Inode, idx: usize) -> Result<u32> {
        if idx < DIRECT {
            return Ok(i.direct[idx]);
        }
        if i.indirect == 0 {
            return Ok(0);
        }
        Ok(ptr_at(self.get(img, i.indirect)?, idx - DIRECT))
    }

    /// Blocks a write of indices `[first, last]` must allocate.
    pub(super) fn blocks_needed(
        &mut self,
        img: &dyn VfsFile,
        i: &Inode,
        first: usize,
        last: usize,
    ) -> Result<u64> {
        let mut n = 0;
        for idx in first..=last {
            if self.bmap(img, i, idx)? == 0 {
                n += 1;
            }
        }
        if last >= DIRECT && i.indirect == 0 {
            n += 1;
        }
        Ok(n)
    }

    /// Maps index `idx` of inode `i` to a newly allocated block `b`.
    pub(super) fn bmap_set(
        &mut self,
        img: &dyn VfsFile,
        i: &mut Inode,
        idx: usize,
        b: u32,
    ) -> Result<()> {
        if idx < DIRECT {
            i.direct[idx] = b;
            return Ok(());
        }
        if i.indirect == 0 {
            let ind = self.alloc_block(img)?;
            self.fresh(ind);
            i.indirect = ind;
        }
        set_ptr(self.get_mut(img, i.indirect)?, idx - DIRECT, b);
        Ok(())
    }

    /// Frees every block at index `from` and above (`meta`: they are
    /// directory blocks), and the indirect block if no longer needed.
    pub(super) fn free_blocks_from(
        &mut self,
        img: &dyn VfsFile,
        i: &mut Inode,
        from: usize,
        meta: bool,
    ) -> Result<()> {
        for idx in from..DIRECT {
            if i.direct[idx] != 0 {
                self.free_block(img, i.direct[idx], meta)?;
                i.direct[idx] = 0;
            }
        }
        if i.indirect != 0 {
            let start = from.saturating_sub(DIRECT);
            let ptrs: Vec<(usize, u32)> = {
                let blk = self.get(img, i.indirect)?;
                (start..PER_INDIRECT)
                    .map(|k| (k, ptr_at(blk, k)))
                    .filter(|&(_, p)| p != 0)
                    .collect()
            };
            for &(_, p) in &ptrs {
                self.free_block(img, p, meta)?;
            }
            if start == 0 {
                let ind = i.indirect;
                self.free_block(img, ind, true)?;
                i.indirect = 0;
            } else if !ptrs.is_empty() {
                let blk = self.get_mut(img, i.indirect)?;
                for (k, _) in ptrs {
                    set_ptr(blk, k, 0);
                }
            }
        }
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
        let b = self.bmap(img, i, idx as usize)?;
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

    // ---- directories ---------------------------------------------------

    pub(super) fn dir_blocks(&mut self, img: &dyn VfsFile, d: &Inode) -> Result<Vec<u32>> {
        let n = (d.size / BLOCK as u64) as usize;
        (0..n).map(|idx| self.bmap(img, d, idx)).collect()
    }

    /// The (block, slot, inode) of `name` in directory `dir`.
    pub(super) fn find(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        name: &[u8],
    ) -> Result<Option<(u32, usize, Ino)>> {
        let d = self.dir(img, dir)?;
        for b in self.dir_blocks(img, &d)? {
            let blk = self.get(img, b)?;
            for slot in 0..DIRENTS_PER_BLOCK {
                if let Some(ino) = dirent_is(blk, slot, name) {
                    return Ok(Some((b, slot, ino)));
                }
            }
        }
        Ok(None)
    }

    /// A free slot in `dir`, if one exists without growing it.
    pub(super) fn free_slot(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
    ) -> Result<Option<(u32, usize)>> {
        let d = self.dir(img, dir)?;
        for b in self.dir_blocks(img, &d)? {
            let blk = self.get(img, b)?;
            for slot in 0..DIRENTS_PER_BLOCK {
                if blk[slot * crate::layout::DIRENT_SIZE..][..4] == [0; 4] {
                    return Ok(Some((b, slot)));
                }
            }
        }
        Ok(None)
    }

    /// Blocks adding an entry to `dir` needs (0, 1, or 2 with an indirect).
    pub(super) fn add_needs(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<u64> {
        if self.free_slot(img, dir)?.is_some() {
            return Ok(0);
        }
        let d = self.dir(img, dir)?;
        let idx = (d.size / BLOCK as u64) as usize;
        if idx >= DIRECT + PER_INDIRECT {
            return Err(Error::NoSpace);
        }
        Ok(1 + (idx >= DIRECT && d.indirect == 0) as u64)
    }

    /// Adds `name → ino` to `dir` (space checked by the caller).
    pub(super) fn add_entry(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        name: &[u8],
        ino: Ino,
    ) -> Result<()> {
        let (b, slot) = match self.free_slot(img, dir)? {
            Some(s) => s,
            None => {
                let mut d = self.dir(img, dir)?;
                let idx = (d.size / BLOCK as u64) as usize;
                let b = self.alloc_block(img)?;
                self.fresh(b);
                self.bmap_set(img, &mut d, idx, b)?;
                d.size += BLOCK as u64;
                self.set_inode(img, dir, &d)?;
                (b, 0)
            }
        };
        set_dirent(self.get_mut(img, b)?, slot, ino, name);
        Ok(())
    }

    pub(super) fn entries(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<Vec<(Vec<u8>, Ino)>> {
        let d = self.dir(img, dir)?;
        let mut out = Vec::new();
        for b in self.dir_blocks(img, &d)? {
            let blk = self.get(img, b)?;
            for slot in 0..DIRENTS_PER_BLOCK {
                if let Some(e) = dirent_at(blk, slot)? {
                    out.push((e.name, e.ino));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn is_empty_dir(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<bool> {
        Ok(self.entries(img, dir)?.is_empty())
    }

    pub(super) fn touch(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let mut i = self.live(img, ino)?;
        i.mtime_ns = now_ns();
        self.set_inode(img, ino, &i)
    }

    // ---- transactions --------------------------------------------------

    /// Takes the running transaction: its record (if it changed metadata),
    /// the blocks it freed, and whether data was written since the last
    /// image sync.
    pub(super) fn take(&mut self, tid: u64) -> Snapshot {
        let data_dirty = std::mem::take(&mut self.data_dirty);
        let ops = self.ops;
        if self.running.is_empty() && self.revoked.is_empty() {
            return Snapshot {
                record: None,
                frees: std::mem::take(&mut self.pending_free),
                data_dirty,
                ops,
            };
        }
        let running = std::mem::take(&mut self.running);
        let revoked = std::mem::take(&mut self.revoked);
        let cache = &self.cache;
        let blocks: Vec<(u32, &[u8])> = running.iter().map(|b| (*b, &cache[b][..])).collect();
        let record = txn::encode(tid, blocks.into_iter(), &revoked);
        Snapshot {
            record: Some(record),
            frees: std::mem::take(&mut self.pending_free),
            data_dirty,
            ops,
        }
    }
}
