//! Reads of the multi-version store at a revision, through a [`View`]:
//! the store as committed (reads served to clients), or a step's
//! [`super::writer::Writer`], which adds what its transaction wrote and
//! has not committed (reads inside apply: comparisons, ranges inside a
//! transaction, a range delete's walk, the physical compaction).
//!
//! A read at revision R needs, per key, the latest version at or below R.
//! The index names the key's latest version; if that is above R the
//! read follows the versions' chain back (each version names the one
//! before it) to the first at or below R. Versions are never changed
//! once written, so a read is right at R whatever was written after it —
//! but a compaction applied meanwhile may remove what it follows: a
//! version missing from the chain is either a deletion a compaction
//! removed (the key was absent at R) or, if a compaction passed R since
//! the read began, gone: the caller checks the compaction's revision
//! after the read and answers [`crate::kv::KvError::Compacted`] then.

use super::mvcc::{self, decode_index, decode_record, IndexEntry, Position, Record};
use super::{corrupt, Error};
use crate::kv::{self, KeyValue};
use kvstore::Store;

/// Pairs a scan reads at a time.
const CHUNK: usize = 256;

/// Stored pairs, in key order.
pub(super) type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A view of the store: committed, or with a step's writes.
pub(super) trait View {
    /// A stored key's value.
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    /// Stored pairs in `[from, to)`, in key order, at most `max`.
    fn scan(&self, from: &[u8], to: &[u8], max: usize) -> Result<Pairs, Error>;
}

impl View for Store {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(Store::get(self, k)?)
    }

    fn scan(&self, from: &[u8], to: &[u8], max: usize) -> Result<Pairs, Error> {
        let mut out = Vec::new();
        if from >= to {
            return Ok(out);
        }
        for pair in self.range(from.to_vec()..to.to_vec())?.take(max) {
            out.push(pair?);
        }
        Ok(out)
    }
}

/// What a key was at a revision.
#[derive(Debug)]
pub(super) enum Found {
    /// Absent (never put, or deleted).
    Absent,
    /// This version (without its value if none was asked for).
    Present(KeyValue),
    /// A version the read needed was removed meanwhile: a compaction
    /// passed the revision read.
    Gone,
}

/// The index entry of `key`.
pub(super) fn entry(view: &impl View, key: &[u8]) -> Result<Option<IndexEntry>, Error> {
    match view.get(&mvcc::index_key(key))? {
        None => Ok(None),
        Some(v) => decode_index(&v)
            .map(Some)
            .ok_or_else(|| corrupt("an index entry is malformed")),
    }
}

/// The version at `p` and its value; `None` if it is not held.
pub(super) fn record(view: &impl View, p: Position) -> Result<Option<(Record, Vec<u8>)>, Error> {
    match view.get(&mvcc::record_key(p))? {
        None => Ok(None),
        Some(v) => {
            let (rec, value) =
                decode_record(&v).ok_or_else(|| corrupt("a version record is malformed"))?;
            Ok(Some((rec, value.to_vec())))
        }
    }
}

/// What the key whose index entry is `e` was at revision `at`, with its
/// value if `value`.
pub(super) fn version_at(
    view: &impl View,
    key: &[u8],
    e: &IndexEntry,
    at: i64,
    value: bool,
) -> Result<Found, Error> {
    if e.latest.revision <= at {
        if e.tombstone {
            return Ok(Found::Absent);
        }
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision: e.create,
            mod_revision: e.latest.revision,
            version: e.version,
            value: Vec::new(),
            lease: e.lease,
        };
        if !value {
            return Ok(Found::Present(kv));
        }
        return Ok(match record(view, e.latest)? {
            Some((_, v)) => Found::Present(KeyValue { value: v, ..kv }),
            None => Found::Gone,
        });
    }
    // Back along the chain, to the first version at or below `at`.
    let mut p = e.latest;
    loop {
        let Some((rec, _)) = record(view, p)? else {
            return Ok(Found::Gone);
        };
        let Some(prev) = rec.prev else {
            return Ok(Found::Absent);
        };
        if prev.revision > at {
            p = prev;
            continue;
        }
        // (A version at or below `at` that is not held was a deletion a
        // compaction at or below `at` removed.)
        return Ok(match record(view, prev)? {
            Some((rec, v)) if rec.put => {
                let v = if value { v } else { Vec::new() };
                Found::Present(rec.kv(prev, &v))
            }
            _ => Found::Absent,
        });
    }
}

/// The stored bounds of the index over `[key, range_end)` (etcd's range
/// ends, [`crate::kv`]).
pub(super) fn index_bounds(key: &[u8], range_end: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let from = mvcc::index_key(key);
    let to = match range_end {
        [] => {
            let mut k = from.clone();
            k.push(0);
            k
        }
        [0] => vec![mvcc::INDEX + 1],
        end => mvcc::index_key(end),
    };
    (from, to)
}

/// Visits every index entry in `[from, to)` in key order, handing each
/// (client key, entry) to `f`, which says whether to go on.
pub(super) fn walk_index(
    view: &impl View,
    (from, to): (Vec<u8>, Vec<u8>),
    mut f: impl FnMut(&[u8], &IndexEntry) -> Result<bool, Error>,
) -> Result<(), Error> {
    let mut from = from;
    loop {
        let chunk = view.scan(&from, &to, CHUNK)?;
        let full = chunk.len() == CHUNK;
        for (k, v) in &chunk {
            let e = decode_index(v).ok_or_else(|| corrupt("an index entry is malformed"))?;
            if !f(&k[1..], &e)? {
                return Ok(());
            }
        }
        match chunk.last() {
            Some((k, _)) if full => {
                from = k.clone();
                from.push(0);
            }
            _ => return Ok(()),
        }
    }
}

/// What a range read found.
#[derive(Debug, Default)]
pub(super) struct Ranged {
    /// The keys, in key order (values only if asked for), before the
    /// request's filters, sort and limit.
    pub kvs: Vec<KeyValue>,
    /// Keys the range held at the revision.
    pub count: i64,
    /// A version the read needed was removed meanwhile.
    pub gone: bool,
}

/// etcd's range at revision `at`: every key of the range as it was then
/// (with values unless `keys_only` or `count_only`), counted; at most
/// `keep` of them kept (0: all), the rest only counted.
pub(super) fn range_at(
    view: &impl View,
    req: &kv::RangeRequest,
    at: i64,
    keep: usize,
) -> Result<Ranged, Error> {
    let mut out = Ranged::default();
    // (Sorted by value, keys only still reads the values, as etcd.)
    let want_values =
        !req.count_only && (!req.keys_only || req.sort_target == kv::SortTarget::Value);
    walk_index(view, index_bounds(&req.key, &req.range_end), |key, e| {
        let keeping = !req.count_only && (keep == 0 || out.kvs.len() < keep);
        if !keeping && e.latest.revision <= at {
            // Counted from the index alone.
            out.count += i64::from(!e.tombstone);
            return Ok(true);
        }
        match version_at(view, key, e, at, want_values && keeping)? {
            Found::Absent => {}
            Found::Present(kv) => {
                out.count += 1;
                if keeping {
                    out.kvs.push(kv);
                }
            }
            Found::Gone => {
                out.gone = true;
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    Ok(out)
}

/// etcd's answer to a range request from what was read at `at`: the
/// filters on revisions, the sort, the limit (`more`), keys only.
pub(super) fn range_answer(req: &kv::RangeRequest, found: Ranged) -> kv::RangeResponse {
    use kv::{SortOrder, SortTarget};
    let mut kvs = found.kvs;
    let bound = |v: i64, lo: i64, hi: i64| (lo == 0 || v >= lo) && (hi == 0 || v <= hi);
    kvs.retain(|kv| {
        bound(kv.mod_revision, req.min_mod_revision, req.max_mod_revision)
            && bound(
                kv.create_revision,
                req.min_create_revision,
                req.max_create_revision,
            )
    });
    let order = match (req.sort_order, req.sort_target) {
        // By key ascending is the order read.
        (SortOrder::None, SortTarget::Key) | (SortOrder::Ascend, SortTarget::Key) => None,
        (SortOrder::None, _) => Some(SortOrder::Ascend),
        (o, _) => Some(o),
    };
    if let Some(order) = order {
        let key = |kv: &KeyValue| -> (i64, Vec<u8>) {
            match req.sort_target {
                SortTarget::Key => (0, kv.key.clone()),
                SortTarget::Version => (kv.version, Vec::new()),
                SortTarget::Create => (kv.create_revision, Vec::new()),
                SortTarget::Mod => (kv.mod_revision, Vec::new()),
                SortTarget::Value => (0, kv.value.clone()),
            }
        };
        // Stable: keys stay in key order among equals, either way, as
        // etcd's (Go's insertion sort for short ranges).
        if order == SortOrder::Descend {
            kvs.sort_by_key(|kv| std::cmp::Reverse(key(kv)));
        } else {
            kvs.sort_by_key(key);
        }
    }
    let mut more = false;
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    kv::RangeResponse {
        kvs,
        more,
        count: found.count,
    }
}

/// How many keys a range read keeps with their values: all of them when
/// etcd reads everything before it sorts or filters, else one past the
/// limit (to tell `more`).
pub(super) fn keep_for(req: &kv::RangeRequest) -> usize {
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    let sorted = !matches!(
        (req.sort_order, req.sort_target),
        (
            kv::SortOrder::None | kv::SortOrder::Ascend,
            kv::SortTarget::Key
        )
    );
    if req.limit <= 0 || filtered || sorted {
        0
    } else {
        usize::try_from(req.limit).unwrap_or(usize::MAX - 1) + 1
    }
}

/// A watch event from the stored version at `p` (and the version before
/// it, if `prev_kv` and still held).
pub(super) fn event(
    view: &impl View,
    p: Position,
    rec: &Record,
    value: &[u8],
    prev_kv: bool,
) -> Result<kv::Event, Error> {
    let kv = if rec.put {
        rec.kv(p, value)
    } else {
        KeyValue {
            key: rec.key.clone(),
            mod_revision: p.revision,
            ..KeyValue::default()
        }
    };
    let prev = match rec.prev.filter(|_| prev_kv) {
        None => None,
        Some(q) => match record(view, q)? {
            Some((r, v)) if r.put => Some(r.kv(q, &v)),
            _ => None,
        },
    };
    Ok(kv::Event {
        kind: if rec.put {
            kv::EventType::Put
        } else {
            kv::EventType::Delete
        },
        kv,
        prev_kv: prev,
    })
}
