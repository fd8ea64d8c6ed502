//! Directory blocks: variable-length entries, as ext2 lays them out.
//!
//! A directory block is a chain of entries that covers it exactly: each
//! entry's `rec_len` leads to the next, the last ends at byte 4096.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | inode (0: unused space) |
//! | 4 | 2 | `rec_len`: bytes to the next entry, a multiple of 8, at least 8 |
//! | 6 | 1 | name length (1..=255; 0 when unused) |
//! | 7 | 1 | the inode's kind (the [`Kind`] code), so a listing needs no inode |
//! | 8 | n | the name |
//!
//! A live entry's `rec_len` is at least [`entry_size`] of its name; what
//! it has beyond that is free space, where an insert splits it. Removing
//! an entry merges its space into the entry before it (the first entry of
//! a block becomes unused instead), so an entry never moves while it
//! lives and its byte offset is a stable `readdir` position. An empty
//! block is one unused entry of `rec_len` 4096.

use super::{u16_at, u32_at, Kind, BLOCK, NAME_MAX};
use crate::{Error, Result};

/// Bytes an entry with an `n`-byte name needs (header and name, rounded
/// up to 8).
pub const fn entry_size(n: usize) -> usize {
    (8 + n).div_ceil(8) * 8
}

/// The largest entry: a [`NAME_MAX`]-byte name.
pub const MAX_ENTRY: usize = entry_size(NAME_MAX);

/// A live entry read from a directory block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its byte offset in the block.
    pub offset: usize,
    /// The inode it names (never 0).
    pub ino: u32,
    /// The kind the entry records for it.
    pub kind: Kind,
    /// Its name.
    pub name: Vec<u8>,
}

/// Makes `block` an empty directory block.
pub fn init(block: &mut [u8]) {
    block[..BLOCK].fill(0);
    block[4..6].copy_from_slice(&(BLOCK as u16).to_le_bytes());
}

fn write_header(block: &mut [u8], o: usize, ino: u32, rec_len: usize, kind: Kind, name: &[u8]) {
    block[o..o + 4].copy_from_slice(&ino.to_le_bytes());
    block[o + 4..o + 6].copy_from_slice(&(rec_len as u16).to_le_bytes());
    block[o + 6] = name.len() as u8;
    block[o + 7] = kind.code();
    block[o + 8..o + 8 + name.len()].copy_from_slice(name);
}

/// One step of the chain: (offset, rec_len, ino, name length), checked.
fn chain(block: &[u8]) -> impl Iterator<Item = Result<(usize, usize, u32, usize)>> + '_ {
    let mut o = 0usize;
    std::iter::from_fn(move || {
        if o >= BLOCK {
            return None;
        }
        let rec = u16_at(block, o + 4) as usize;
        let ino = u32_at(block, o);
        let len = block[o + 6] as usize;
        let bad = rec < 8
            || !rec.is_multiple_of(8)
            || o + rec > BLOCK
            || (ino != 0 && (len == 0 || entry_size(len) > rec));
        if bad {
            let at = o;
            o = BLOCK; // stop after reporting
            return Some(Err(Error::Corrupt(format!(
                "directory entry at byte {at}: rec_len {rec}, name length {len}"
            ))));
        }
        let at = o;
        o += rec;
        Some(Ok((at, rec, ino, len)))
    })
}

/// The live entries of a directory block, in order.
pub fn entries(block: &[u8]) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for step in chain(block) {
        let (o, _, ino, len) = step?;
        if ino == 0 {
            continue;
        }
        let kind = Kind::from_code(block[o + 7])?;
        if kind == Kind::Free {
            return Err(Error::Corrupt(format!(
                "directory entry at byte {o} records a free inode's kind"
            )));
        }
        out.push(Entry {
            offset: o,
            ino,
            kind,
            name: block[o + 8..o + 8 + len].to_vec(),
        });
    }
    Ok(out)
}

/// The (offset, inode) of the entry named `name`, if the block holds it.
pub fn find(block: &[u8], name: &[u8]) -> Result<Option<(usize, u32)>> {
    for step in chain(block) {
        let (o, _, ino, len) = step?;
        if ino != 0 && len == name.len() && &block[o + 8..o + 8 + len] == name {
            return Ok(Some((o, ino)));
        }
    }
    Ok(None)
}

/// The largest entry an insert could place in the block now.
pub fn largest_free(block: &[u8]) -> Result<usize> {
    let mut best = 0;
    for step in chain(block) {
        let (_, rec, ino, len) = step?;
        let used = if ino == 0 { 0 } else { entry_size(len) };
        best = best.max(rec - used);
    }
    Ok(best)
}

/// Inserts `name → ino`; returns the entry's offset, or `None` if no free
/// space in the block is large enough.
pub fn insert(block: &mut [u8], ino: u32, kind: Kind, name: &[u8]) -> Result<Option<usize>> {
    let need = entry_size(name.len());
    let mut place = None;
    for step in chain(block) {
        let (o, rec, cur, len) = step?;
        let used = if cur == 0 { 0 } else { entry_size(len) };
        if rec - used >= need {
            place = Some((o, rec, cur, used));
            break;
        }
    }
    let Some((o, rec, cur, used)) = place else {
        return Ok(None);
    };
    if cur == 0 {
        write_header(block, o, ino, rec, kind, name);
        return Ok(Some(o));
    }
    // Split: the live entry keeps what it uses, the new one the rest.
    block[o + 4..o + 6].copy_from_slice(&(used as u16).to_le_bytes());
    write_header(block, o + used, ino, rec - used, kind, name);
    Ok(Some(o + used))
}

/// Removes the live entry at `offset`.
pub fn remove(block: &mut [u8], offset: usize) -> Result<()> {
    let mut prev: Option<usize> = None;
    let mut found = None;
    for step in chain(block) {
        let (o, rec, ino, _) = step?;
        if o == offset {
            found = (ino != 0).then_some((prev, rec));
            break;
        }
        prev = Some(o);
    }
    let Some((prev, rec)) = found else {
        return Err(Error::Corrupt(format!(
            "no directory entry at byte {offset}"
        )));
    };
    match prev {
        Some(p) => {
            let merged = u16_at(block, p + 4) as usize + rec;
            block[p + 4..p + 6].copy_from_slice(&(merged as u16).to_le_bytes());
            block[offset..offset + rec].fill(0);
        }
        None => {
            block[offset..offset + 4].fill(0);
            block[offset + 6..offset + rec].fill(0);
        }
    }
    Ok(())
}

/// Changes the inode and kind the live entry at `offset` names (a rename
/// over an existing name).
pub fn retarget(block: &mut [u8], offset: usize, ino: u32, kind: Kind) {
    block[offset..offset + 4].copy_from_slice(&ino.to_le_bytes());
    block[offset + 7] = kind.code();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_insert_find_remove_and_reuse_space() {
        let mut b = vec![0u8; BLOCK];
        init(&mut b);
        assert_eq!(largest_free(&b).unwrap(), BLOCK);
        let a = insert(&mut b, 5, Kind::File, b"alpha").unwrap().unwrap();
        let c = insert(&mut b, 6, Kind::Dir, &[b'c'; NAME_MAX])
            .unwrap()
            .unwrap();
        assert_eq!((a, c), (0, 16));
        assert_eq!(find(&b, b"alpha").unwrap(), Some((0, 5)));
        assert_eq!(find(&b, b"alph").unwrap(), None);
        let e = entries(&b).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].kind, Kind::Dir);
        // Remove the first: its space stays in place, unused.
        remove(&mut b, 0).unwrap();
        assert_eq!(find(&b, b"alpha").unwrap(), None);
        assert_eq!(entries(&b).unwrap().len(), 1);
        assert_eq!(insert(&mut b, 7, Kind::File, b"x").unwrap(), Some(0));
        // Remove the long one: its space merges into the entry before.
        remove(&mut b, 16).unwrap();
        assert_eq!(largest_free(&b).unwrap(), BLOCK - 16);
        // Fill the block: 4096 / 16 entries of 1..8-byte names.
        init(&mut b);
        let mut n = 0;
        while insert(&mut b, 9, Kind::File, format!("{n}").as_bytes())
            .unwrap()
            .is_some()
        {
            n += 1;
        }
        assert_eq!(n, BLOCK / 16);
        assert_eq!(largest_free(&b).unwrap(), 0);
    }

    #[test]
    fn a_broken_chain_is_corrupt_not_a_panic() {
        let mut b = vec![0u8; BLOCK];
        init(&mut b);
        insert(&mut b, 5, Kind::File, b"alpha").unwrap();
        insert(&mut b, 6, Kind::File, b"beta").unwrap(); // at byte 16
        for (at, v) in [(4usize, 0u16), (4, 12), (4, 8000), (20, 4)] {
            let mut x = b.clone();
            x[at..at + 2].copy_from_slice(&v.to_le_bytes());
            assert!(entries(&x).is_err(), "rec_len {v} at {at}");
        }
        let mut k = b.clone();
        k[7] = 0;
        assert!(matches!(entries(&k), Err(Error::Corrupt(_))));
        let mut l = b.clone();
        l[6] = 200; // longer than its rec_len
        assert!(matches!(entries(&l), Err(Error::Corrupt(_))));
    }
}
