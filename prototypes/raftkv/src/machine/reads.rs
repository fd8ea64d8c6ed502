//! What the state machine serves to readers: ranges at a revision, the
//! watch history (the versions themselves), the hash of the versions,
//! the store's revisions — each as applied on this node, read from the
//! committed store without holding the state lock.
//!
//! A reader takes the revision to read at under the lock — the store's,
//! or the one before a command whose steps are under way — and reads at
//! it ([`super::view`]): what was applied after is not seen, whatever it
//! wrote meanwhile. If a compaction passed that revision while it read,
//! it answers [`KvError::Compacted`].

use super::mvcc::{self, Position};
use super::view::{self, Found};
use super::{corrupt, Error, StateMachine};
use crate::kv::{self, KeyValue, KvError};
use std::sync::Arc;

/// Why a read is not answered.
#[derive(Debug)]
pub enum ReadError {
    /// etcd's refusal (a revision compacted or to come).
    Kv(KvError),
    /// The store failed.
    Store(Error),
}

impl From<Error> for ReadError {
    fn from(e: Error) -> Self {
        ReadError::Store(e)
    }
}

impl From<kvstore::Error> for ReadError {
    fn from(e: kvstore::Error) -> Self {
        ReadError::Store(Error::Store(e))
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Kv(e) => write!(f, "{e}"),
            ReadError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// The store's revisions as applied here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revisions {
    /// The revision readers see: every command applied whole.
    pub current: i64,
    /// The compaction's: reads below it are refused.
    pub compact: i64,
    /// The compaction whose removals are done.
    pub physical: i64,
}

/// A page of the watch history ([`StateMachine::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    /// The changes found, in order, each with its position.
    pub events: Vec<(Position, kv::Event)>,
    /// Where to read on from.
    pub next: Position,
    /// The revision read up to: every change at or below it that
    /// matched is in this page or before `from` — unless `next` is at or
    /// below it (the page stopped early: read on).
    pub revision: i64,
    /// The compaction's revision.
    pub compact_revision: i64,
}

/// A page of a range read in key order ([`StateMachine::range_page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangePage {
    /// The keys' versions at the revision read, in key order.
    pub kvs: Vec<KeyValue>,
    /// The first key not in the page, if the range goes on.
    pub next: Option<Vec<u8>>,
    /// The revision read at.
    pub revision: i64,
    /// The applied log index when the read began.
    pub index: u64,
}

impl StateMachine {
    /// The store's revisions as applied here.
    pub fn revisions(&self) -> Revisions {
        let st = self.inner.state.lock();
        Revisions {
            current: st.readable,
            compact: st.mvcc.compact,
            physical: st.mvcc.physical,
        }
    }

    /// The last applied index, watched: changes after every applied
    /// batch and installed snapshot.
    pub fn applied_index(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.applied_index.subscribe()
    }

    /// The revision readers see, watched: changes after every apply step
    /// that completed a command, and when a snapshot is installed.
    pub fn revision_watch(&self) -> tokio::sync::watch::Receiver<Revisions> {
        self.inner.revisions.subscribe()
    }

    /// The store and the revision to read at (`revision`, or the current
    /// one if 0 or less), checked against the compaction.
    fn read_at(&self, revision: i64) -> Result<(Arc<kvstore::Store>, i64, u64), ReadError> {
        let st = self.inner.state.lock();
        let at = if revision > 0 { revision } else { st.readable };
        if at > st.readable {
            return Err(ReadError::Kv(KvError::FutureRevision));
        }
        if at < st.mvcc.compact {
            return Err(ReadError::Kv(KvError::Compacted {
                compact_revision: st.mvcc.compact,
            }));
        }
        let index = st.applied.log_id.map_or(0, |l| l.index);
        Ok((st.store.clone(), at, index))
    }

    /// `Err(Compacted)` if a compaction passed `at` since a read at it
    /// began (what it read may miss versions), or if it `gone` found so.
    fn still_readable(&self, at: i64, gone: bool) -> Result<(), ReadError> {
        let compact = self.inner.state.lock().mvcc.compact;
        if compact > at || gone {
            return Err(ReadError::Kv(KvError::Compacted {
                compact_revision: compact,
            }));
        }
        Ok(())
    }

    /// etcd's range (filters, sort, limit, keys or count only) at its
    /// revision, as applied here; with the revision read at.
    pub fn range(&self, req: &kv::RangeRequest) -> Result<(kv::RangeResponse, i64), ReadError> {
        let (store, at, _) = self.read_at(req.revision)?;
        let found = view::range_at(&*store, req, at, view::keep_for(req))?;
        self.still_readable(at, found.gone)?;
        let current = self.inner.state.lock().readable;
        Ok((view::range_answer(req, found), current))
    }

    /// The version of `key` at `revision` (0: the current one), as
    /// applied here; `None` if absent then.
    pub fn get_at(&self, key: &[u8], revision: i64) -> Result<Option<KeyValue>, ReadError> {
        let (store, at, _) = self.read_at(revision)?;
        let found = match view::entry(&*store, key)? {
            None => Found::Absent,
            Some(e) => view::version_at(&*store, key, &e, at, true)?,
        };
        self.still_readable(at, matches!(found, Found::Gone))?;
        Ok(match found {
            Found::Present(kv) => Some(kv),
            _ => None,
        })
    }

    /// The current value of `key`, as applied here.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReadError> {
        Ok(self.get_at(key, 0)?.map(|kv| kv.value))
    }

    /// A page of `[key, range_end)` from `start` on (the range's first key
    /// if `None`) at `revision` (0: the current one): at most `limit` keys
    /// and, past the first, about `max_bytes`.
    pub fn range_page(
        &self,
        (key, range_end): (&[u8], &[u8]),
        start: Option<&[u8]>,
        revision: i64,
        (limit, max_bytes): (usize, usize),
    ) -> Result<RangePage, ReadError> {
        let (store, at, index) = self.read_at(revision)?;
        let (mut from, to) = view::index_bounds(key, range_end);
        if let Some(s) = start {
            from = from.max(mvcc::index_key(s));
        }
        let mut page = RangePage {
            kvs: Vec::new(),
            next: None,
            revision: at,
            index,
        };
        let (mut bytes, mut gone) = (0, false);
        view::walk_index(&*store, (from, to), |k, e| {
            if page.kvs.len() == limit || (bytes >= max_bytes && !page.kvs.is_empty()) {
                page.next = Some(k.to_vec());
                return Ok(false);
            }
            match view::version_at(&*store, k, e, at, true)? {
                Found::Present(kv) => {
                    bytes += kv.key.len() + kv.value.len();
                    page.kvs.push(kv);
                }
                Found::Absent => {}
                Found::Gone => {
                    gone = true;
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        self.still_readable(at, gone)?;
        Ok(page)
    }

    /// The changes of keys in `[key, range_end)` from `from` on, as
    /// applied here (etcd's watch events, `prev_kv` if asked): at most
    /// `max` of them, looking at most at `scan` versions (a page that
    /// finds none still moves `next` on). `Compacted` if `from` is below
    /// the compaction (or a compaction passed it meanwhile).
    pub fn events(
        &self,
        from: Position,
        (key, range_end): (&[u8], &[u8]),
        prev_kv: bool,
        (max, scan): (usize, usize),
    ) -> Result<EventPage, ReadError> {
        // The iterator is taken under the lock: one snapshot of the store
        // at `upto`, whatever a compaction removes meanwhile.
        let (store, iter, upto, compact) = {
            let st = self.inner.state.lock();
            if from.revision < st.mvcc.compact {
                return Err(ReadError::Kv(KvError::Compacted {
                    compact_revision: st.mvcc.compact,
                }));
            }
            let upto = st.readable;
            let to = mvcc::record_key(Position::at(upto.saturating_add(1)));
            let iter = if from.revision > upto {
                None
            } else {
                Some(st.store.range(mvcc::record_key(from)..to)?)
            };
            (st.store.clone(), iter, upto, st.mvcc.compact)
        };
        let mut page = EventPage {
            events: Vec::new(),
            next: from,
            revision: upto,
            compact_revision: compact,
        };
        let mut stopped = false;
        for (seen, pair) in iter.into_iter().flatten().enumerate() {
            let (k, v) = pair.map_err(Error::from)?;
            let p =
                mvcc::record_position(&k).ok_or_else(|| corrupt("a version key is malformed"))?;
            let (rec, value) =
                mvcc::decode_record(&v).ok_or_else(|| corrupt("a version record is malformed"))?;
            page.next = p.next();
            if kv::in_range(&rec.key, key, range_end) {
                page.events
                    .push((p, view::event(&*store, p, &rec, value, prev_kv)?));
            }
            if page.events.len() == max || seen + 1 == scan {
                stopped = true;
                break;
            }
        }
        if !stopped {
            // Every version up to `upto` looked at.
            page.next = page.next.max(Position::at(upto.saturating_add(1)));
        }
        Ok(page)
    }

    /// A request that changes nothing (ranges, and transactions of
    /// ranges in every branch), answered at the current revision as
    /// etcd serves a read-only transaction; with that revision.
    pub fn read_only(&self, op: &kv::RequestOp) -> Result<(kv::ResponseOp, i64), ReadError> {
        let (store, at, _) = self.read_at(0)?;
        let compact = self.inner.state.lock().mvcc.compact;
        let mut gone = false;
        let resp = read_op(&store, op, (at, compact), &mut gone)?;
        self.still_readable(at, gone)?;
        Ok((resp, at))
    }

    /// The keys attached to lease `id`, in key order, as applied here.
    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, Error> {
        let store = self.inner.state.lock().store.clone();
        let from = super::leases::attached_prefix(id);
        let to = super::leases::attached_end(id);
        let mut keys = Vec::new();
        for pair in store.range(from..to)? {
            let (k, _) = pair?;
            keys.push(k.get(9..).unwrap_or_default().to_vec());
        }
        Ok(keys)
    }

    /// Bytes of the store's data file.
    pub fn db_size(&self) -> u64 {
        let store = self.inner.state.lock().store.clone();
        u64::from(store.cache_stats().file_pages) * kvstore::PAGE_SIZE as u64
    }

    /// etcd's `HashKV` as raftkv defines it: CRC32C over the versions
    /// with revisions from the compaction's to `revision` (0: the current
    /// one), in revision order — each version's stored key (`r`,
    /// revision, sub-revision) and value (docs/FORMAT.md) — with the
    /// compaction's revision and the revision hashed. Equal on every
    /// member that applied the log up to the same compaction, at any
    /// revision both hold; the compaction's revision says whether two
    /// hashes can be compared.
    pub fn hash_kv(&self, revision: i64) -> Result<(u32, i64, i64), ReadError> {
        // One iterator, taken under the lock: one snapshot of the store,
        // whatever is applied meanwhile.
        let (iter, at, compact) = {
            let st = self.inner.state.lock();
            let at = if revision > 0 { revision } else { st.readable };
            if at > st.readable {
                return Err(ReadError::Kv(KvError::FutureRevision));
            }
            if at < st.mvcc.compact {
                return Err(ReadError::Kv(KvError::Compacted {
                    compact_revision: st.mvcc.compact,
                }));
            }
            let from = mvcc::record_key(Position::at(st.mvcc.compact));
            let to = mvcc::record_key(Position::at(at.saturating_add(1)));
            (st.store.range(from..to)?, at, st.mvcc.compact)
        };
        let mut crc = 0u32;
        for pair in iter {
            let (k, v) = pair.map_err(Error::from)?;
            crc = crc32c::crc32c_append(crc, &k);
            crc = crc32c::crc32c_append(crc, &v);
        }
        Ok((crc, compact, at))
    }
}

/// A read-only request at `at` (the compaction at `compact`); `gone` set
/// if a version it needed was removed meanwhile.
fn read_op(
    store: &kvstore::Store,
    op: &kv::RequestOp,
    (at, compact): (i64, i64),
    gone: &mut bool,
) -> Result<kv::ResponseOp, ReadError> {
    match op {
        kv::RequestOp::Range(r) => {
            let rev = if r.revision > 0 { r.revision } else { at };
            if rev > at {
                return Err(ReadError::Kv(KvError::FutureRevision));
            }
            if rev < compact {
                return Err(ReadError::Kv(KvError::Compacted {
                    compact_revision: compact,
                }));
            }
            let found = view::range_at(store, r, rev, view::keep_for(r))?;
            *gone |= found.gone;
            Ok(kv::ResponseOp::Range(view::range_answer(r, found)))
        }
        kv::RequestOp::Txn(t) => {
            let Some(succeeded) = super::txn::compares_hold(store, t, at)? else {
                *gone = true;
                return Ok(kv::ResponseOp::Txn(kv::TxnResponse::default()));
            };
            let ops = if succeeded { &t.success } else { &t.failure };
            let mut responses = Vec::with_capacity(ops.len());
            for op in ops {
                responses.push(read_op(store, op, (at, compact), gone)?);
            }
            Ok(kv::ResponseOp::Txn(kv::TxnResponse {
                succeeded,
                responses,
            }))
        }
        kv::RequestOp::Put(_) | kv::RequestOp::DeleteRange(_) => {
            Err(ReadError::Store(corrupt("a change in a read")))
        }
    }
}
