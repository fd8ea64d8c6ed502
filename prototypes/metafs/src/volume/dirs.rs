//! Directories: the entries in their blocks ([`crate::layout::dir`]) and
//! an index of each directory in memory, so lookup, create and unlink
//! cost the same in a directory of a hundred thousand entries as in one
//! of ten.
//!
//! The index of a directory (each name's block, by the name's hash; the
//! largest free space of each block) is built from its blocks the first
//! time an operation touches the directory after mount, and kept in step
//! with every change after; it is only ever derived from the directory's
//! blocks, so dropping it (an error, a freed directory) loses nothing. A
//! lookup hashes the name and scans the one block the index names for
//! it (two, rarely, when hashes collide). Entries
//! never move while they live, so `(block, offset)` is also the position
//! `readdir` resumes from.

use super::*;
use crate::layout::dir::{self as dirblk, MAX_ENTRY};
use std::collections::BTreeMap;

/// One directory's index.
#[derive(Debug, Default)]
pub(super) struct DirIndex {
    /// Where each name is: its block (found by the name's hash; the
    /// entry itself is found in the block by name).
    names: NameIndex,
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

/// The block index of each name in a directory, keyed by the name's
/// 64-bit hash (keyed per mount, so names cannot be chosen to collide):
/// a hash and a block index in the table, not the name, as ext4's htree
/// keeps hashes and finds the name itself in the leaf block. Names whose hashes
/// collide share a key, each with its block.
#[derive(Debug, Default)]
struct NameIndex {
    one: HashMap<u64, u32>,
    more: HashMap<u64, Vec<u32>>,
    len: usize,
}

impl NameIndex {
    fn insert(&mut self, hash: u64, bi: u32) {
        self.len += 1;
        if let Some(v) = self.more.get_mut(&hash) {
            v.push(bi);
        } else if let Some(first) = self.one.remove(&hash) {
            self.more.insert(hash, vec![first, bi]);
        } else {
            self.one.insert(hash, bi);
        }
    }

    /// The blocks that may hold a name of this hash.
    fn candidates(&self, hash: u64) -> &[u32] {
        match self.one.get(&hash) {
            Some(bi) => std::slice::from_ref(bi),
            None => self.more.get(&hash).map_or(&[], |v| &v[..]),
        }
    }

    /// Forgets one name of this hash in block `bi`.
    fn remove(&mut self, hash: u64, bi: u32) {
        if self.one.get(&hash) == Some(&bi) {
            self.one.remove(&hash);
            self.len -= 1;
            return;
        }
        let Some(v) = self.more.get_mut(&hash) else {
            return;
        };
        if let Some(i) = v.iter().position(|&b| b == bi) {
            v.swap_remove(i);
            self.len -= 1;
        }
        if v.len() == 1 {
            self.one.insert(hash, v[0]);
            self.more.remove(&hash);
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The directories' indexes, those of directories not in use dropped
/// oldest first while they hold more than a budget of names in all. The
/// indexes of the [`KEEP_RECENT`] directories used last are kept whatever
/// their size: a path's lookups touch every directory on it, and dropping
/// a large one among them would rebuild it at every operation.
#[derive(Debug)]
pub(super) struct DirIndexes {
    map: HashMap<Ino, (DirIndex, u64)>,
    /// Each kept index by its last use.
    order: BTreeMap<u64, Ino>,
    tick: u64,
    /// Names in the kept indexes.
    names: usize,
    budget: usize,
}

/// Indexes kept whatever the budget: those of the directories used last.
const KEEP_RECENT: usize = 8;

impl DirIndexes {
    /// No indexes; they may hold `budget` names in all.
    pub(super) fn new(budget: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            names: 0,
            budget,
        }
    }

    /// Takes `dir`'s index out, if kept.
    fn take(&mut self, dir: Ino) -> Option<DirIndex> {
        let (ix, used) = self.map.remove(&dir)?;
        self.order.remove(&used);
        self.names -= ix.names.len;
        Some(ix)
    }

    /// Keeps `dir`'s index as the one used last, then drops the oldest
    /// while over the budget.
    fn put(&mut self, dir: Ino, ix: DirIndex) {
        self.tick += 1;
        self.names += ix.names.len;
        self.order.insert(self.tick, dir);
        if let Some((old, used)) = self.map.insert(dir, (ix, self.tick)) {
            self.order.remove(&used);
            self.names -= old.names.len;
        }
        while self.names > self.budget && self.order.len() > KEEP_RECENT {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((ix, _)) = self.map.remove(&oldest) {
                self.names -= ix.names.len;
            }
        }
    }

    /// Drops `dir`'s index (the directory was freed).
    pub(super) fn forget(&mut self, dir: Ino) {
        self.take(dir);
    }
}

/// Where an entry is: (block number, offset in it, inode).
pub(super) type Place = (u32, usize, Ino);

impl State {
    /// The index of directory `dir`, built on first use.
    fn index(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<DirIndex> {
        if let Some(ix) = self.dirs.take(dir) {
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
            let (entries, room) = (dirblk::entries(blk)?, dirblk::largest_free(blk)?);
            for e in entries {
                ix.names
                    .insert(self.dir_hasher.hash_one(&e.name[..]), bi as u32);
            }
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
            self.dirs.put(dir, ix);
        }
        r
    }

    /// Where `name` is in the directory of index `ix`: (block index,
    /// offset, inode).
    fn locate(
        &mut self,
        img: &dyn VfsFile,
        ix: &DirIndex,
        name: &[u8],
    ) -> Result<Option<(u32, usize, Ino)>> {
        let hash = self.dir_hasher.hash_one(name);
        for &bi in ix.names.candidates(hash) {
            let b = *ix.blocks.get(bi as usize).ok_or_else(|| {
                Error::Corrupt(format!("directory index names block {bi}, past its end"))
            })?;
            if let Some((off, ino)) = dirblk::find(self.get(img, b)?, name)? {
                return Ok(Some((bi, off, ino)));
            }
        }
        Ok(None)
    }

    /// Where `name` is in directory `dir`.
    pub(super) fn find(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        name: &[u8],
    ) -> Result<Option<Place>> {
        self.with_index(img, dir, |st, ix| {
            Ok(st
                .locate(img, ix, name)?
                .map(|(bi, off, ino)| (ix.blocks[bi as usize], off, ino)))
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
            dirblk::insert(blk, ino, kind, name)?.ok_or_else(|| {
                Error::Corrupt(format!(
                    "directory {dir} block {bi} has less room than indexed"
                ))
            })?;
            let room = dirblk::largest_free(blk)?;
            ix.set_room(bi, room);
            ix.names.insert(st.dir_hasher.hash_one(name), bi);
            Ok(())
        })
    }

    /// Removes `name` from `dir`; returns the inode it named.
    pub(super) fn remove_entry(&mut self, img: &dyn VfsFile, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.with_index(img, dir, |st, ix| {
            let (bi, off, ino) = st.locate(img, ix, name)?.ok_or(Error::NotFound)?;
            ix.names.remove(st.dir_hasher.hash_one(name), bi);
            let blk = st.get_mut(img, ix.blocks[bi as usize])?;
            dirblk::remove(blk, off)?;
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
            let (bi, off, _) = st.locate(img, ix, name)?.ok_or(Error::NotFound)?;
            dirblk::retarget(st.get_mut(img, ix.blocks[bi as usize])?, off, ino, kind);
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

#[cfg(test)]
mod tests {
    use super::{DirIndex, DirIndexes, NameIndex, KEEP_RECENT};

    fn index(names: usize) -> DirIndex {
        let mut ix = DirIndex::default();
        for h in 0..names as u64 {
            ix.names.insert(h, 0);
        }
        ix
    }

    #[test]
    fn indexes_past_the_budget_go_oldest_first_but_never_the_last_used() {
        let mut d = DirIndexes::new(100);
        // A directory far over the budget alone, used with a few small
        // ones: it stays among the last used.
        d.put(1, index(1_000));
        for dir in 2..2 + KEEP_RECENT as u32 - 1 {
            d.put(dir, index(1));
        }
        assert!(
            d.map.contains_key(&1),
            "a directory among the last used was dropped"
        );
        // Then others come: the big one is the oldest, and goes.
        d.put(50, index(1));
        assert!(!d.map.contains_key(&1));
        assert_eq!(d.names, KEEP_RECENT);
        // Many small ones: the budget holds once more than the recent few
        // are kept.
        for dir in 100..400 {
            d.put(dir, index(5));
        }
        assert!(d.names <= 100, "{} names kept", d.names);
        assert_eq!(
            d.names,
            d.map.values().map(|(ix, _)| ix.names.len).sum::<usize>()
        );
        // Taken out and put back: counted once.
        let ix = d.take(399).unwrap();
        d.put(399, ix);
        assert_eq!(
            d.names,
            d.map.values().map(|(ix, _)| ix.names.len).sum::<usize>()
        );
        assert_eq!(d.order.len(), d.map.len());
        d.forget(399);
        assert!(!d.map.contains_key(&399));
    }

    #[test]
    fn names_whose_hashes_collide_keep_each_its_block() {
        let mut ix = NameIndex::default();
        ix.insert(7, 0);
        ix.insert(9, 1);
        ix.insert(7, 2);
        ix.insert(7, 2);
        assert_eq!(ix.candidates(7), &[0, 2, 2]);
        assert_eq!(ix.candidates(9), &[1]);
        assert_eq!(ix.candidates(8), &[] as &[u32]);
        ix.remove(7, 2);
        assert_eq!(ix.candidates(7), &[0, 2]);
        ix.remove(7, 0);
        assert_eq!(ix.candidates(7), &[2]);
        // A name not where the index says: nothing changes.
        ix.remove(7, 5);
        ix.remove(3, 0);
        assert_eq!(ix.candidates(7), &[2]);
        ix.remove(7, 2);
        ix.remove(9, 1);
        assert!(ix.is_empty());
        assert!(ix.one.is_empty() && ix.more.is_empty());
    }
}
