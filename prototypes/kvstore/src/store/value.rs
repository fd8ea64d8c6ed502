//! `Store::get`. The key's cell is found under the shared tree lock from
//! pages in the pool (a miss drops the lock, fetches the page and looks
//! again, so writers never wait behind a read from disk). A long value's
//! overflow chain is then read without the lock and around the pool:
//! consecutive pages in one read, a page the pool holds (maybe newer than
//! the disk's copy) taken from it, none inserted (a 1 MiB value would
//! evict 256 pages of the tree). Then the cell is found again: if its
//! leaf's pageLSN is unchanged, no writer freed the chain meanwhile (a
//! chain is freed only by changing its leaf) and the bytes read are the
//! value — a seqlock's read. A page the pool holds changed by a
//! transaction in progress (pageLSN `PENDING`: it may yet roll back and
//! leave the leaf as it was) also makes the read start again; after a few
//! tries it reads under the lock.

use super::*;
use crate::page::{Invalid, Kind, Page, FIRST_PAGE, OVERFLOW_PAYLOAD};
use crate::pool::PENDING;
use crate::tree::Found;

/// Pages read from disk in one call at most (128 KiB).
const RUN_PAGES: usize = 32;
/// Lock-free reads of a chain a writer keeps replacing before reading it
/// under the lock.
const CHAIN_TRIES: usize = 4;

fn corrupt(page: PageNo, reason: &'static str) -> Error {
    Error::Corrupt { page, reason }
}

impl Inner {
    /// The cell of `key` and the tree's end, from pages in the pool under
    /// the shared tree lock (fetching a missing page without it), or,
    /// after many misses, under it.
    fn find_cell(&self, key: &[u8]) -> Result<(Option<Found>, PageNo)> {
        for _ in 0..16 {
            let tree = self.read_tree();
            let mut missing = None;
            let r = self.pool.with_cached(|look| {
                tree::find(tree.root, tree.end, key, |no| {
                    // A miss ends the lookup; it is retried below.
                    look(no).ok_or_else(|| {
                        missing = Some(no);
                        Error::Closed
                    })
                })
            });
            let end = tree.end;
            drop(tree);
            match missing {
                Some(no) => {
                    self.pool.fetch(no, &self.journal)?;
                }
                None => return r.map(|f| (f, end)),
            }
        }
        // A store evicting faster than this reader fetches: read under the
        // lock.
        let tree = self.read_tree();
        let f = tree::find(tree.root, tree.end, key, |no| {
            self.pool.fetch(no, &self.journal)
        })?;
        Ok((f, tree.end))
    }

    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_between(key, &mut || {})
    }

    /// [`Inner::get`], calling `between` after a chain's cell is found
    /// and before the chain is read (where a test puts a writer).
    fn get_between(&self, key: &[u8], between: &mut dyn FnMut()) -> Result<Option<Vec<u8>>> {
        self.check()?;
        for _ in 0..CHAIN_TRIES {
            let (found, end) = self.find_cell(key)?;
            let (leaf, lsn, first, len) = match found {
                None => return Ok(None),
                Some(Found::Inline(v)) => return Ok(Some(v)),
                Some(Found::Overflow {
                    leaf,
                    lsn,
                    first,
                    len,
                }) => (leaf, lsn, first, len),
            };
            between();
            let value = self.read_chain(first, len, end, None);
            let same = matches!(self.find_cell(key)?.0, Some(Found::Overflow {
                    leaf: l,
                    lsn: s,
                    first: f,
                    len: n,
                }) if (l, s, f, n) == (leaf, lsn, first, len));
            match value {
                Ok(v) if same => return Ok(Some(v)),
                // Changed meanwhile, or a page of a transaction in
                // progress seen (it may yet roll back, leaving the leaf as
                // it was): what was read may be another value's. An error
                // too may be such a page's: the read under the lock below
                // is the one that says.
                _ => continue,
            }
        }
        let tree = self.read_tree();
        tree::lookup(tree.root, tree.end, key, |no| {
            self.pool.fetch(no, &self.journal)
        })
    }

    /// Reads `len` bytes of the overflow chain from `first`, in runs of
    /// consecutive pages. With `at`, for a snapshot: a page changed after
    /// it is an error (the snapshot reads that page's kept version).
    pub(super) fn read_chain(
        &self,
        first: PageNo,
        len: usize,
        end: PageNo,
        at: Option<Lsn>,
    ) -> Result<Vec<u8>> {
        let after = |lsn: Lsn| at.is_some_and(|s| lsn > s);
        if len > crate::MAX_VALUE {
            return Err(corrupt(first, "a value longer than any value"));
        }
        let mut out = Vec::with_capacity(len);
        let mut buf = vec![0u8; RUN_PAGES * PAGE_SIZE];
        let mut no = first;
        while out.len() < len {
            if !(FIRST_PAGE..end).contains(&no) {
                return Err(corrupt(no, "an overflow pointer outside the file"));
            }
            let left = (len - out.len()).div_ceil(OVERFLOW_PAYLOAD);
            let k = left.min(RUN_PAGES).min((end - no) as usize);
            let cached: Vec<Option<Arc<Page>>> = self
                .pool
                .with_cached(|look| (0..k as PageNo).map(|i| look(no + i)).collect());
            let from_disk = cached
                .iter()
                .rposition(Option::is_none)
                .map_or(0, |i| i + 1);
            let got = self.read_pages(no, &mut buf[..from_disk * PAGE_SIZE])?;
            let mut next = 0;
            for (i, c) in cached.iter().enumerate() {
                let this = no + i as PageNo;
                let (payload, link) = match c {
                    // A transaction in progress has changed the page.
                    Some(p) if p.lsn() == PENDING || after(p.lsn()) => return Err(Error::Closed),
                    Some(p) if p.kind() == Some(Kind::Overflow) => (p.payload(), p.link()),
                    Some(_) => (&[][..], 0),
                    None if (i + 1) * PAGE_SIZE > got => {
                        return Err(corrupt(this, "a page past the data file's end"))
                    }
                    None => {
                        let bytes = &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                        let r = Page::overflow_in(bytes, this).map_err(|e| match e {
                            Invalid::Checksum => Error::TornPage { page: this },
                            Invalid::Structure(reason) => corrupt(this, reason),
                        })?;
                        if after(Lsn(u64::from_le_bytes(
                            bytes[8..16].try_into().unwrap_or([0; 8]),
                        ))) {
                            return Err(Error::Closed);
                        }
                        r
                    }
                };
                if payload.is_empty() {
                    return Err(corrupt(
                        this,
                        "an overflow chain through a page that is not one",
                    ));
                }
                let take = payload.len().min(len - out.len());
                out.extend_from_slice(&payload[..take]);
                next = link;
                if out.len() == len || link != this + 1 {
                    break;
                }
            }
            no = next;
        }
        Ok(out)
    }

    /// Reads pages from `first` into `buf` up to the file's end: the bytes
    /// read.
    fn read_pages(&self, first: PageNo, buf: &mut [u8]) -> Result<usize> {
        let off = u64::from(first) * PAGE_SIZE as u64;
        let mut got = 0;
        while got < buf.len() {
            let r = self
                .pool
                .file()
                .read_at(&mut buf[got..], off + got as u64)?;
            if r == 0 {
                break;
            }
            got += r;
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal_core::vfs::SimVfs;

    fn store() -> Store {
        let o = Options {
            cache_bytes: 64 * crate::pool::FRAME_BYTES,
            checkpoint_interval: None,
            ..Options::default()
        };
        Store::open_with(Arc::new(SimVfs::new()), "/db", o).unwrap()
    }

    fn value(tag: u8) -> Vec<u8> {
        (0..50_000u32).map(|i| (i % 251) as u8 ^ tag).collect()
    }

    #[test]
    fn a_chain_freed_and_reused_while_read_is_read_again() {
        let s = store();
        s.put(b"k", &value(1)).unwrap();
        // Between finding the cell and reading its chain, two overwrites:
        // the second reuses the first value's freed pages. The chain read
        // is of another value; the leaf's pageLSN says so.
        let mut n = 0;
        let got = s
            .inner
            .get_between(b"k", &mut || {
                if n == 0 {
                    s.put(b"k", &value(2)).unwrap();
                    s.put(b"k", &value(3)).unwrap();
                }
                n += 1;
            })
            .unwrap();
        assert!(got == Some(value(3)), "a get returned bytes of no value");
        assert_eq!(n, 2, "read twice");
    }

    #[test]
    fn a_page_of_a_transaction_in_progress_is_not_read() {
        let s = store();
        s.put(b"k", &value(1)).unwrap();
        let (found, end) = s.inner.find_cell(b"k").unwrap();
        let Some(Found::Overflow { first, len, .. }) = found else {
            panic!("not a chain");
        };
        assert!(s.inner.read_chain(first, len, end, None).unwrap() == value(1));
        // A writer's copy of the chain's first page, not yet logged (as
        // a transaction has it before it appends or rolls back).
        let copy = s
            .inner
            .pool
            .copy(&s.inner.pool.fetch(first, &s.inner.journal).unwrap());
        let (before, _, _) = s.inner.pool.put(first, copy, None);
        assert!(s.inner.read_chain(first, len, end, None).is_err());
        s.inner.pool.restore(first, before);
        assert!(s.inner.read_chain(first, len, end, None).unwrap() == value(1));
    }
}
