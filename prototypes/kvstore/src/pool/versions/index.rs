//! The index of kept page versions, by (page, pageLSN): 20 bytes an
//! entry, in sorted chunks whose bytes are known exactly, so the versions'
//! bound can count them.
//!
//! A `BTreeMap` cost about 50 bytes an entry with its nodes and could not
//! say how many. Here entries sit in chunks of [`CHUNK`]: a full chunk
//! splits in two halves, a chunk emptied goes, and once the chunks are
//! over twice the entries' bytes they are packed again, full
//! ([`Index::fit`]): so at most 40 bytes an entry (and two chunks), about
//! 28 as a scan's versions come in at random, 20 once packed. Lookups are
//! two binary searches; an insert or removal moves at most a chunk
//! (5 KiB), a packing every entry, once per half of them removed.

use crate::page::PageNo;
use journal_core::Lsn;
use std::mem::size_of;

/// Entries a chunk holds.
const CHUNK: usize = 256;

/// A version's key: its page and pageLSN, ordered so (12 bytes: the LSN
/// in two halves keeps the alignment at 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) no: PageNo,
    hi: u32,
    lo: u32,
}

impl Key {
    pub(super) fn new(no: PageNo, lsn: Lsn) -> Key {
        Key {
            no,
            hi: (lsn.0 >> 32) as u32,
            lo: lsn.0 as u32,
        }
    }

    pub(super) fn lsn(&self) -> Lsn {
        Lsn(u64::from(self.hi) << 32 | u64::from(self.lo))
    }
}

/// A version's key, where it is (see `versions.rs`: in memory, or a slot
/// of the spill file), and the low half of its number in the order
/// versions were kept (the last time it was kept: the numbers of the
/// versions kept lie within a window narrower than 2^32, so the low half
/// tells them apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) key: Key,
    pub(super) at: u32,
    n: u32,
}

impl Entry {
    pub(super) fn new(key: Key, at: u32, number: u64) -> Entry {
        Entry {
            key,
            at,
            n: number as u32,
        }
    }

    /// Whether `number` is this version's (last) number.
    pub(super) fn is_number(&self, number: u64) -> bool {
        self.n == number as u32
    }

    pub(super) fn set_number(&mut self, number: u64) {
        self.n = number as u32;
    }
}

/// Entries in key order.
#[derive(Default)]
pub(super) struct Index {
    chunks: Vec<Vec<Entry>>,
    len: usize,
    /// Bytes the chunks hold (their capacity).
    chunk_bytes: usize,
}

impl Index {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of memory the index holds.
    pub(super) fn bytes(&self) -> usize {
        self.chunk_bytes + self.chunks.capacity() * size_of::<Vec<Entry>>()
    }

    /// The chunk of the first entry above `k` (`chunks.len()`: none), and
    /// its position there.
    fn above_at(&self, k: Key) -> (usize, usize) {
        let c = self
            .chunks
            .partition_point(|ch| ch.last().is_some_and(|e| e.key <= k));
        let i = self
            .chunks
            .get(c)
            .map_or(0, |ch| ch.partition_point(|e| e.key <= k));
        (c, i)
    }

    /// The chunk and position of `k`'s entry, if it is there.
    fn find(&self, k: Key) -> Option<(usize, usize)> {
        let c = self
            .chunks
            .partition_point(|ch| ch.last().is_some_and(|e| e.key < k));
        let i = self
            .chunks
            .get(c)?
            .binary_search_by_key(&k, |e| e.key)
            .ok()?;
        Some((c, i))
    }

    pub(super) fn get(&self, k: Key) -> Option<&Entry> {
        let (c, i) = self.find(k)?;
        self.chunks.get(c)?.get(i)
    }

    pub(super) fn get_mut(&mut self, k: Key) -> Option<&mut Entry> {
        let (c, i) = self.find(k)?;
        self.chunks.get_mut(c)?.get_mut(i)
    }

    /// The last entry at or below `k`.
    pub(super) fn floor(&self, k: Key) -> Option<&Entry> {
        let (c, i) = self.above_at(k);
        match i.checked_sub(1) {
            Some(i) => self.chunks.get(c)?.get(i),
            None => self.chunks.get(c.checked_sub(1)?)?.last(),
        }
    }

    /// The first entry above `k`.
    pub(super) fn above(&self, k: Key) -> Option<&Entry> {
        let (c, i) = self.above_at(k);
        self.chunks.get(c)?.get(i)
    }

    fn new_chunk(&mut self) -> Vec<Entry> {
        let ch = Vec::with_capacity(CHUNK);
        self.chunk_bytes += ch.capacity() * size_of::<Entry>();
        ch
    }

    fn drop_chunk(&mut self, c: usize) -> Vec<Entry> {
        let ch = self.chunks.remove(c);
        self.chunk_bytes -= ch.capacity() * size_of::<Entry>();
        ch
    }

    /// Inserts `e`; `false` (nothing changed) if its key is there.
    pub(super) fn insert(&mut self, e: Entry) -> bool {
        let Some(last) = self.chunks.len().checked_sub(1) else {
            let mut ch = self.new_chunk();
            ch.push(e);
            self.chunks.push(ch);
            self.len = 1;
            return true;
        };
        let mut c = self
            .chunks
            .partition_point(|ch| ch.last().is_some_and(|x| x.key < e.key))
            .min(last);
        let Err(mut i) = self.chunks[c].binary_search_by_key(&e.key, |x| x.key) else {
            return false;
        };
        if self.chunks[c].len() >= CHUNK {
            let mut right = self.new_chunk();
            if c == last && i == CHUNK {
                // Past the last key: a new chunk, not two half ones.
                right.push(e);
                self.chunks.push(right);
                self.len += 1;
                return true;
            }
            right.extend(self.chunks[c].drain(CHUNK / 2..));
            self.chunks.insert(c + 1, right);
            if i > CHUNK / 2 {
                c += 1;
                i -= CHUNK / 2;
            }
        }
        self.chunks[c].insert(i, e);
        self.len += 1;
        true
    }

    /// Removes the entry of `k`, if there.
    pub(super) fn remove(&mut self, k: Key) -> Option<Entry> {
        let (c, i) = self.find(k)?;
        let e = self.chunks[c].remove(i);
        self.len -= 1;
        if self.chunks[c].is_empty() {
            self.drop_chunk(c);
        }
        if self.len == 0 {
            self.chunks = Vec::new();
        } else if self.bytes() > 2 * self.fitted_bytes() + 2 * CHUNK * size_of::<Entry>() {
            self.fit();
        }
        Some(e)
    }

    /// The bytes [`Index::fit`] would leave.
    pub(super) fn fitted_bytes(&self) -> usize {
        let chunks = self.len.div_ceil(CHUNK);
        chunks * (CHUNK * size_of::<Entry>() + size_of::<Vec<Entry>>())
    }

    /// Packs the entries again in full chunks.
    pub(super) fn fit(&mut self) {
        let old = std::mem::take(&mut self.chunks);
        self.chunk_bytes = 0;
        let mut chunks = Vec::with_capacity(self.len.div_ceil(CHUNK));
        let mut chunk = Vec::new();
        for e in old.into_iter().flatten() {
            if chunk.len() == chunk.capacity() {
                if !chunk.is_empty() {
                    chunks.push(chunk);
                }
                chunk = self.new_chunk();
            }
            chunk.push(e);
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        self.chunks = chunks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal_core::vfs::SplitMix64;
    use std::collections::BTreeMap;

    fn key(no: u32, lsn: u64) -> Key {
        Key::new(no, Lsn(lsn))
    }

    #[test]
    fn the_index_answers_as_an_ordered_map_and_knows_its_bytes() {
        let mut rng = SplitMix64::new(58);
        let mut ix = Index::default();
        let mut model = BTreeMap::new();
        let at = |e: &Entry| (e.key, e.at, e.n);
        for round in 0..40_000u32 {
            let k = key(rng.below(3000) as u32, rng.below(8) << 33 | rng.below(4));
            // Inserts first, then more removals: the index grows, then
            // shrinks.
            if rng.below(100) < if round < 20_000 { 70 } else { 25 } {
                let fresh = !model.contains_key(&k);
                let n = round * 3;
                assert_eq!(ix.insert(Entry::new(k, round, n.into())), fresh);
                model.entry(k).or_insert((round, n));
            } else {
                let got = ix.remove(k).map(|e| (e.at, e.n));
                assert_eq!(got, model.remove(&k));
            }
            assert_eq!(ix.len(), model.len());
            let probe = key(rng.below(3000) as u32, rng.below(8) << 33);
            let floor = model.range(..=probe).next_back();
            let want = |(k, (a, n)): (&Key, &(u32, u32))| (*k, *a, *n);
            assert_eq!(ix.floor(probe).map(at), floor.map(want));
            let above = model.range(probe..).find(|(k, _)| **k > probe);
            assert_eq!(ix.above(probe).map(at), above.map(want));
            assert_eq!(ix.get(probe).map(|e| e.at), model.get(&probe).map(|v| v.0));
            // At most twice the entries' bytes, and two chunks.
            if round % 1000 == 0 {
                let size = size_of::<Entry>();
                let chunks: usize = ix.chunks.iter().map(|c| c.capacity() * size).sum();
                assert_eq!(ix.chunk_bytes, chunks);
                assert!(ix.bytes() <= 2 * ix.fitted_bytes() + 2 * CHUNK * size);
                assert!(ix.fitted_bytes() <= (size + 1) * ix.len() + CHUNK * size + 24);
            }
            if round % 7919 == 0 {
                ix.fit();
                assert_eq!(ix.bytes(), ix.fitted_bytes());
            }
        }
        for k in model.keys() {
            ix.remove(*k).unwrap();
        }
        assert_eq!((ix.len(), ix.bytes()), (0, 0));
    }

    #[test]
    fn keys_in_order_fill_their_chunks() {
        let mut ix = Index::default();
        for i in 0..100_000u32 {
            assert!(ix.insert(Entry::new(key(i, 7), i, (5 << 32) + u64::from(i))));
        }
        assert_eq!(size_of::<Entry>(), 20);
        assert!(ix.bytes() <= 21 * ix.len(), "{}", ix.bytes());
        assert_eq!(ix.get(key(4242, 7)).map(|e| e.at), Some(4242));
        assert_eq!(ix.floor(key(4242, 6)).map(|e| e.at), Some(4241));
        assert_eq!(ix.above(key(4242, 7)).map(|e| e.at), Some(4243));
        assert!(ix.get(key(1, 7)).is_some_and(|e| e.is_number(1)));
        assert_eq!(key(1, u64::MAX - 5).lsn(), Lsn(u64::MAX - 5));
    }
}
