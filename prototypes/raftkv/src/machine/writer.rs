//! A step's store transaction, and what it wrote so far: the store
//! answers only for what is committed, so reads inside apply (a put's
//! index entry, a comparison, a range inside a transaction, a range
//! delete's walk, the physical compaction) go through the [`Writer`],
//! which lays its own uncommitted writes over the store. What it reads is
//! the store as the log so far makes it, however the entries were
//! grouped into steps and transactions.

use super::view::{Pairs, View};
use super::Error;
use kvstore::{Store, Transaction};
use std::collections::BTreeMap;

/// A store transaction and its writes.
pub(super) struct Writer<'s> {
    pub(super) store: &'s Store,
    txn: Transaction<'s>,
    /// Stored keys this transaction wrote (the index and the versions):
    /// their values, or `None` if it removed them.
    written: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Keys written, deleted or walked since the writer began: the step's
    /// work.
    pub(super) work: usize,
    /// Versions written since the count was last taken (the physical
    /// compaction's budget grows with them).
    pub(super) versions: usize,
}

impl<'s> Writer<'s> {
    pub(super) fn new(store: &'s Store) -> Writer<'s> {
        Writer {
            store,
            txn: store.transaction(),
            written: BTreeMap::new(),
            work: 0,
            versions: 0,
        }
    }

    /// The transaction, for the state machine's own keys (sessions,
    /// leases, `m/`), which are never read back inside apply.
    pub(super) fn txn(&mut self) -> &mut Transaction<'s> {
        &mut self.txn
    }

    /// Puts a key of the index or the versions.
    pub(super) fn put(&mut self, k: Vec<u8>, v: Vec<u8>) {
        self.txn.put(&k, &v);
        self.written.insert(k, Some(v));
    }

    /// Removes a key of the index or the versions.
    pub(super) fn delete(&mut self, k: Vec<u8>) {
        self.txn.delete(&k);
        self.written.insert(k, None);
    }

    /// Commits what is written so far (visible at once, durable later)
    /// and starts the next transaction.
    pub(super) fn commit_no_wait(&mut self) -> Result<(), Error> {
        std::mem::replace(&mut self.txn, self.store.transaction()).commit_no_wait()?;
        self.written.clear();
        Ok(())
    }
}

impl View for Writer<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match self.written.get(k) {
            Some(w) => Ok(w.clone()),
            None => Ok(self.store.get(k)?),
        }
    }

    /// The store's pairs and this transaction's, merged (its own win).
    fn scan(&self, from: &[u8], to: &[u8], max: usize) -> Result<Pairs, Error> {
        let mut out = Vec::new();
        if from >= to || max == 0 {
            return Ok(out);
        }
        let range = from.to_vec()..to.to_vec();
        let mut stored = self.store.range(range.clone())?;
        let mut mine = self.written.range(range);
        let mut a = stored.next().transpose()?;
        let mut b = mine.next();
        while out.len() < max {
            let take_mine = match (&a, &b) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((ka, _)), Some((kb, _))) => kb.as_slice() <= ka.as_slice(),
            };
            if take_mine {
                if let Some((kb, vb)) = b.take() {
                    if a.as_ref().is_some_and(|(ka, _)| ka == kb) {
                        a = stored.next().transpose()?;
                    }
                    if let Some(v) = vb {
                        out.push((kb.clone(), v.clone()));
                    }
                }
                b = mine.next();
            } else if let Some(pair) = a.take() {
                out.push(pair);
                a = stored.next().transpose()?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal_core::vfs::SimVfs;
    use std::sync::Arc;

    #[test]
    fn a_scan_lays_the_transactions_writes_over_the_store() {
        let store =
            Store::open_with(Arc::new(SimVfs::new()), "/s", kvstore::Options::default()).unwrap();
        let mut t = store.transaction();
        for k in ["a", "c", "e", "g"] {
            t.put(k.as_bytes(), b"old");
        }
        t.commit().unwrap();
        let mut w = Writer::new(&store);
        w.put(b"b".to_vec(), b"new".to_vec());
        w.put(b"c".to_vec(), b"new".to_vec());
        w.delete(b"e".to_vec());
        w.put(b"h".to_vec(), b"new".to_vec());
        let all = w.scan(b"a", b"z", 100).unwrap();
        let got: Vec<(&[u8], &[u8])> = all.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let want: Vec<(&[u8], &[u8])> = vec![
            (b"a", b"old"),
            (b"b", b"new"),
            (b"c", b"new"),
            (b"g", b"old"),
            (b"h", b"new"),
        ];
        assert_eq!(got, want);
        assert_eq!(w.scan(b"b", b"g", 2).unwrap().len(), 2);
        assert_eq!(w.scan(b"d", b"f", 10).unwrap(), Vec::new());
        assert_eq!(View::get(&w, b"e").unwrap(), None);
        assert_eq!(View::get(&w, b"g").unwrap().as_deref(), Some(&b"old"[..]));
        w.commit_no_wait().unwrap();
        assert_eq!(w.scan(b"a", b"z", 100).unwrap(), all);
    }
}
