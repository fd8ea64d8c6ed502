//! Block maps: 12 direct pointers and three indirect trees (ext2's), read,
//! grown and cut back. Tree blocks are metadata (journaled); a file's
//! data blocks are not, a directory's are.

use super::*;
use crate::layout::{map_path, span, tree_first, MapPath, MAX_BLOCKS};

impl State {
    /// The pointer in slot `slot` of tree block `node`, checked.
    fn child(&mut self, img: &dyn VfsFile, node: u32, slot: usize) -> Result<u32> {
        let p = ptr_at(self.get(img, node)?, slot);
        self.mapped(p)
    }

    /// The block at index `idx` of an inode (0: a hole).
    pub(super) fn bmap(&mut self, img: &dyn VfsFile, i: &Inode, idx: u64) -> Result<u32> {
        match map_path(idx) {
            None => Ok(0),
            Some(MapPath::Direct(s)) => self.mapped(i.direct[s]),
            Some(MapPath::Tree { depth, slots }) => {
                let mut node = self.mapped(i.trees[depth - 1])?;
                for &slot in &slots[..depth] {
                    if node == 0 {
                        return Ok(0);
                    }
                    node = self.child(img, node, slot)?;
                }
                Ok(node)
            }
        }
    }

    /// Blocks a write of indices `[first, last]` must allocate: its holes
    /// and the tree blocks missing above them.
    pub(super) fn blocks_needed(
        &mut self,
        img: &dyn VfsFile,
        i: &Inode,
        first: u64,
        last: u64,
    ) -> Result<u64> {
        let mut n = 0;
        let mut missing: HashSet<(usize, usize, u64)> = HashSet::new();
        for idx in first..=last {
            let Some(MapPath::Tree { depth, slots }) = map_path(idx) else {
                n += (self.bmap(img, i, idx)? == 0) as u64;
                continue;
            };
            let mut node = self.mapped(i.trees[depth - 1])?;
            let rel = idx - tree_first(depth);
            for (level, &slot) in slots[..depth].iter().enumerate() {
                if node == 0 {
                    // This tree block and every one below it are new: one
                    // key per (tree, level, the indices it covers).
                    for l in level..depth {
                        missing.insert((depth, l, rel / span(depth - l)));
                    }
                    break;
                }
                node = self.child(img, node, slot)?;
            }
            n += (node == 0) as u64;
        }
        Ok(n + missing.len() as u64)
    }

    /// Maps index `idx` of `i` to a newly allocated block and returns it
    /// (tree blocks allocated on the way; the caller checked the space,
    /// and fills the block). Counts every block in `i.blocks`.
    pub(super) fn map_new(&mut self, img: &dyn VfsFile, i: &mut Inode, idx: u64) -> Result<u32> {
        let path = map_path(idx).ok_or(Error::FileTooLarge)?;
        let b = self.alloc_block(img)?;
        i.blocks += 1;
        let (depth, slots) = match path {
            MapPath::Direct(s) => {
                i.direct[s] = b;
                return Ok(b);
            }
            MapPath::Tree { depth, slots } => (depth, slots),
        };
        if i.trees[depth - 1] == 0 {
            let t = self.alloc_block(img)?;
            self.fresh(t);
            i.blocks += 1;
            i.trees[depth - 1] = t;
        }
        let mut node = self.mapped(i.trees[depth - 1])?;
        for (level, &slot) in slots[..depth].iter().enumerate() {
            if level + 1 == depth {
                set_ptr(self.get_mut(img, node)?, slot, b);
                break;
            }
            let mut next = self.child(img, node, slot)?;
            if next == 0 {
                next = self.alloc_block(img)?;
                self.fresh(next);
                i.blocks += 1;
                set_ptr(self.get_mut(img, node)?, slot, next);
            }
            node = next;
        }
        Ok(b)
    }

    /// Frees every block at index `from` and above (`meta`: they are
    /// directory blocks), and the tree blocks left with nothing below.
    pub(super) fn free_blocks_from(
        &mut self,
        img: &dyn VfsFile,
        i: &mut Inode,
        from: u64,
        meta: bool,
    ) -> Result<()> {
        for idx in (from.min(DIRECT as u64) as usize)..DIRECT {
            if i.direct[idx] != 0 {
                self.free_block(img, i.direct[idx], meta)?;
                i.direct[idx] = 0;
                i.blocks = i.blocks.saturating_sub(1);
            }
        }
        for depth in 1..=3 {
            let root = i.trees[depth - 1];
            let first = tree_first(depth);
            if root == 0 || first + span(depth) <= from {
                continue;
            }
            let mut freed = 0;
            if self.cut(img, root, depth, first, from, meta, &mut freed)? {
                self.free_block(img, root, true)?;
                freed += 1;
                i.trees[depth - 1] = 0;
            }
            i.blocks = i.blocks.saturating_sub(freed);
        }
        Ok(())
    }

    /// Cuts tree block `node` (`levels` above the data, its first index
    /// `base`) back to indices below `from`; counts the blocks freed in
    /// `freed` and returns whether `node` itself is now unused (the caller
    /// frees it). Recursion is at most three deep.
    #[allow(clippy::too_many_arguments)]
    fn cut(
        &mut self,
        img: &dyn VfsFile,
        node: u32,
        levels: usize,
        base: u64,
        from: u64,
        meta: bool,
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
                .filter(|&(k, p)| p != 0 && base + (k as u64 + 1) * child_span > from)
                .collect()
        };
        let mut cleared = Vec::new();
        for (k, p) in ptrs {
            let child_base = base + k as u64 * child_span;
            let whole = child_base >= from;
            if levels == 1 {
                self.free_block(img, p, meta)?;
                *freed += 1;
                cleared.push(k);
            } else if self.cut(img, p, levels - 1, child_base, from, meta, freed)? || whole {
                self.free_block(img, p, true)?;
                *freed += 1;
                cleared.push(k);
            }
        }
        if base >= from {
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
}

impl State {
    /// Every nonzero pointer of `i`'s map: (index, data block) pairs in
    /// index order, and the tree blocks.
    pub(super) fn walk(&mut self, img: &dyn VfsFile, i: &Inode) -> Result<BlockMap> {
        let mut data: Vec<(u64, u32)> = (0..DIRECT)
            .filter(|&k| i.direct[k] != 0)
            .map(|k| (k as u64, i.direct[k]))
            .collect();
        let mut trees = Vec::new();
        for depth in 1..=3 {
            let root = i.trees[depth - 1];
            if root == 0 {
                continue;
            }
            // (block, levels above the data, first index)
            let mut todo = vec![(root, depth, tree_first(depth))];
            while let Some((node, levels, base)) = todo.pop() {
                trees.push(node);
                // A hostile map may point many slots at one block: no
                // inode can own more blocks than the image has.
                if data.len() + trees.len() > self.sb.blocks as usize {
                    return Err(Error::Corrupt(
                        "a block map reaches more blocks than the image has".into(),
                    ));
                }
                let blk = self.get(img, node)?;
                for k in (0..PER_INDIRECT).rev() {
                    let p = ptr_at(blk, k);
                    if p == 0 {
                        continue;
                    }
                    let at = base + k as u64 * span(levels - 1);
                    if levels == 1 {
                        data.push((at, p));
                    } else {
                        todo.push((p, levels - 1, at));
                    }
                }
            }
        }
        data.sort_unstable();
        Ok((data, trees))
    }
}

/// The block index past the last a size of `size` bytes covers.
pub(super) fn blocks_of(size: u64) -> u64 {
    size.div_ceil(BLOCK as u64).min(MAX_BLOCKS)
}
