//! Directories: the entries in their blocks ([`crate::layout::dir`]) and
//! an index of each directory in memory, so lookup, create and unlink
//! cost the same in a directory of a hundred thousand entries as in one
//! of ten.
//!
//! The index of a directory (name → block and offset, and the largest
//! free space of each block) is built from its blocks the first time an
//! operation touches the directory after mount, and kept in step with
//! every change after; it is only ever derived from the cached blocks,
//! so dropping it (an error, a freed directory) loses nothing. Entries
//! never move while they live, so `(block, offset)` is also the position
//! `readdir` resumes from.

use super::*;
use crate::layout::dir::{self as dirblk, MAX_ENTRY};

/// One directory's index.
#[derive(Debug, Default)]
pub(super) struct DirIndex {
    /// name → (block index in the directory, byte offset, inode).
    names: HashMap<Box<[u8]>, (u32, u16, Ino)>,
    /// The directory's blocks, by index.
    blocks: Vec<u32>,
    /// The largest free space in each block.
    room: Vec<u16>,
    /// Blocks with room for the longest entry.
    roomy: BTreeSet<u32>,
}

impl DirIndex {
    fn set_room(&mut self, bi: u32, room: usize) {
        self.room[bi as usize] = room as u16;
        if room >= MAX_ENTRY {
            self.roomy.insert(bi);
        } else {
            self.roomy.remove(&bi);
        }
    }

    /// A block with room for an entry of `need` bytes.
    fn place_for(&self, need: usize) -> Option<u32> {
        if let Some(&bi) = self.roomy.iter().next() {
            return Some(bi);
        }
        let last = self.blocks.len().checked_sub(1)? as u32;
        (self.room[last as usize] as usize >= need).then_some(last)
    }
}

/// Where an entry is: (block number, offset in it, inode).
pub(super) type Place = (u32, usize, Ino);

impl State {
    /// The index of directory `dir`, built on first use.
    fn index(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<DirIndex> {
        if let Some(ix) = self.dirs.remove(&dir) {
            return Ok(ix);
        }
        let d = self.dir(img, dir)?;
        let n = d.size / BLOCK as u64;
        let mut ix = DirIndex::default();
        for bi in 0..n {
            let b = self.bmap(img, &d, bi)?;
            if b == 0 {
                return Err(Error::Corrupt(format!(
                    "directory {dir} has a hole at block {bi}"
                )));
            }
            let blk = self.get(img, b)?;
            for e in dirblk::entries(blk)? {
                ix.names
                    .insert(e.name.into(), (bi as u32, e.offset as u16, e.ino));
            }
            let room = dirblk::largest_free(blk)?;
            ix.blocks.push(b);
            ix.room.push(0);
            ix.set_room(bi as u32, room);
        }
        Ok(ix)
    }

    /// Runs `f` with the index of `dir`, then keeps the index.
    fn with_index<T>(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        f: impl FnOnce(&mut State, &mut DirIndex) -> Result<T>,
    ) -> Result<T> {
        let mut ix = self.index(img, dir)?;
        let r = f(self, &mut ix);
        if r.is_ok() {
            self.dirs.insert(dir, ix);
        }
        r
    }

    /// Where `name` is in directory `dir`.
    pub(super) fn find(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        name: &[u8],
    ) -> Result<Option<Place>> {
        self.with_index(img, dir, |_, ix| {
            Ok(ix
                .names
                .get(name)
                .map(|&(bi, off, ino)| (ix.blocks[bi as usize], off as usize, ino)))
        })
    }

    /// Blocks adding an entry to `dir` needs: 0, or a new directory block
    /// and the tree blocks above it.
    pub(super) fn add_needs(&mut self, img: &dyn VfsFile, dir: Ino, name: &[u8]) -> Result<u64> {
        let need = dirblk::entry_size(name.len());
        let fits = self.with_index(img, dir, |_, ix| Ok(ix.place_for(need).is_some()))?;
        if fits {
            return Ok(0);
        }
        let d = self.dir(img, dir)?;
        let idx = d.size / BLOCK as u64;
        if idx >= crate::layout::MAX_BLOCKS {
            return Err(Error::NoSpace);
        }
        self.blocks_needed(img, &d, idx, idx)
    }

    /// Adds `name → ino` to `dir` (space checked by the caller).
    pub(super) fn add_entry(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        kind: Kind,
    ) -> Result<()> {
        self.with_index(img, dir, |st, ix| {
            let need = dirblk::entry_size(name.len());
            let bi = match ix.place_for(need) {
                Some(bi) => bi,
                None => {
                    let mut d = st.dir(img, dir)?;
                    let bi = d.size / BLOCK as u64;
                    let b = st.map_new(img, &mut d, bi)?;
                    dirblk::init(st.fresh(b));
                    d.size += BLOCK as u64;
                    st.set_inode(img, dir, &d)?;
                    ix.blocks.push(b);
                    ix.room.push(0);
                    ix.set_room(bi as u32, BLOCK);
                    bi as u32
                }
            };
            let blk = st.get_mut(img, ix.blocks[bi as usize])?;
            let off = dirblk::insert(blk, ino, kind, name)?.ok_or_else(|| {
                Error::Corrupt(format!(
                    "directory {dir} block {bi} has less room than indexed"
                ))
            })?;
            let room = dirblk::largest_free(blk)?;
            ix.set_room(bi, room);
            ix.names.insert(name.into(), (bi, off as u16, ino));
            Ok(())
        })
    }

    /// Removes `name` from `dir`; returns the inode it named.
    pub(super) fn remove_entry(&mut self, img: &dyn VfsFile, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.with_index(img, dir, |st, ix| {
            let (bi, off, ino) = ix.names.remove(name).ok_or(Error::NotFound)?;
            let blk = st.get_mut(img, ix.blocks[bi as usize])?;
            dirblk::remove(blk, off as usize)?;
            let room = dirblk::largest_free(blk)?;
            ix.set_room(bi, room);
            Ok(ino)
        })
    }

    /// Points the existing entry `name` of `dir` at `ino` (of `kind`).
    pub(super) fn retarget_entry(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        kind: Kind,
    ) -> Result<()> {
        self.with_index(img, dir, |st, ix| {
            let e = ix.names.get_mut(name).ok_or(Error::NotFound)?;
            e.2 = ino;
            let (bi, off) = (e.0, e.1);
            dirblk::retarget(
                st.get_mut(img, ix.blocks[bi as usize])?,
                off as usize,
                ino,
                kind,
            );
            Ok(())
        })
    }

    /// Whether `dir` has no entries.
    pub(super) fn is_empty_dir(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<bool> {
        self.with_index(img, dir, |_, ix| Ok(ix.names.is_empty()))
    }

    /// Entries of `dir` from position `pos` on (a position is
    /// `block index × 4096 + offset`; 0 is the start), at most `limit`:
    /// (position, name, inode, kind).
    pub(super) fn entries_from(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        pos: u64,
        limit: usize,
    ) -> Result<Vec<EntryAt>> {
        let d = self.dir(img, dir)?;
        let mut out = Vec::new();
        let n = d.size / BLOCK as u64;
        let mut bi = pos / BLOCK as u64;
        while bi < n && out.len() < limit {
            let b = self.bmap(img, &d, bi)?;
            for e in dirblk::entries(self.get(img, b)?)? {
                let at = bi * BLOCK as u64 + e.offset as u64;
                if at >= pos && out.len() < limit {
                    out.push((at, e.name, e.ino, e.kind));
                }
            }
            bi += 1;
        }
        Ok(out)
    }

    /// Every entry of `dir`: (name, inode, kind).
    pub(super) fn entries(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
    ) -> Result<Vec<(Vec<u8>, Ino, Kind)>> {
        Ok(self
            .entries_from(img, dir, 0, usize::MAX)?
            .into_iter()
            .map(|(_, n, i, k)| (n, i, k))
            .collect())
    }
}
