//! etcd's requests applied to the multi-version store: puts, deletes of
//! ranges, transactions (comparisons, then a branch of requests, nested
//! ones included), each command's changes at one revision.
//!
//! As etcd 3.4 applies them: a transaction's comparisons — its nested
//! transactions' too — are evaluated against the store before it (its
//! *base* revision), and so are the checks on the branch they choose (a
//! put's lease exists; `ignore_value` and `ignore_lease` find the key; a
//! range's revision is neither compacted nor to come): one that fails
//! refuses the whole command, nothing changed. Then the branch runs in
//! order; a range in it sees the changes before it. The command takes the
//! store's next revision at its first change, each change the next
//! sub-revision; a command that changes nothing takes none.
//!
//! A range delete walks the index from the store (and the step's
//! writes) in key order and can stop after any key: the step then
//! commits where it stopped — the path to the delete inside its
//! transaction, the key it goes on from, the sub-revisions used — and the
//! next step, or a replay after a crash, goes on from there
//! (`step.rs`). Its comparisons evaluated again at the base revision
//! choose the same branch. The answers of a command stopped that way are
//! kept in memory between steps; after a crash nobody waits for them.

use super::leases;
use super::mvcc::{self, IndexEntry, Position, Record};
use super::step::STEP_KEYS;
use super::view::{self, Found, View};
use super::writer::Writer;
use super::{corrupt, Error, State};
use crate::kv::{self, KeyValue, KvError, RequestOp, ResponseOp};

/// The command being applied: the revision its changes take.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cmd {
    /// Its revision: the store's next when it began.
    pub rev: i64,
    /// Changes made so far (the next sub-revision).
    pub sub: u32,
}

impl Cmd {
    /// A command beginning now.
    pub fn begin(st: &State) -> Cmd {
        Cmd {
            rev: st.mvcc.rev + 1,
            sub: 0,
        }
    }

    /// A command going on after `n` changes made.
    pub fn resume(st: &State, n: u32) -> Cmd {
        Cmd {
            rev: if n > 0 { st.mvcc.rev } else { st.mvcc.rev + 1 },
            sub: n,
        }
    }

    /// The revision before it: its comparisons' and checks'.
    pub fn base(&self) -> i64 {
        self.rev - 1
    }

    /// The position of its next change; the store is at its revision.
    fn next(&mut self, st: &mut State) -> Position {
        let p = Position {
            revision: self.rev,
            sub: self.sub,
        };
        self.sub += 1;
        st.mvcc.rev = self.rev;
        p
    }
}

/// How far a request got.
pub(super) enum Ran<T> {
    /// Done, with its answer.
    Done(T),
    /// Stopped inside a range delete (the step is full): the path to it
    /// (request indices through the branches run), the index key it goes
    /// on from, and the answer so far.
    Paused {
        path: Vec<u32>,
        key: Vec<u8>,
        partial: T,
    },
}

/// Writes a new version of `key`: `value` (a put) or a deletion (`None`),
/// the index entry `old` before it. Returns the version before, if it
/// was live and `want_prev` (with its value).
fn write_version(
    w: &mut Writer<'_>,
    st: &mut State,
    c: &mut Cmd,
    key: &[u8],
    old: Option<IndexEntry>,
    put: Option<(&[u8], i64)>,
    want_prev: bool,
) -> Result<Option<KeyValue>, Error> {
    let live = old.filter(|e| !e.tombstone);
    let prev = match live {
        Some(e) if want_prev => match view::version_at(w, key, &e, e.latest.revision, true)? {
            Found::Present(kv) => Some(kv),
            _ => return Err(corrupt("a key's latest version is not held")),
        },
        _ => None,
    };
    let p = c.next(st);
    let rec = match put {
        Some((_, lease)) => Record {
            put: true,
            key: key.to_vec(),
            create: live.map_or(p.revision, |e| e.create),
            version: live.map_or(1, |e| e.version + 1),
            lease,
            prev: old.map(|e| e.latest),
        },
        None => Record {
            put: false,
            key: key.to_vec(),
            create: 0,
            version: 0,
            lease: 0,
            prev: old.map(|e| e.latest),
        },
    };
    let entry = IndexEntry {
        create: rec.create,
        latest: p,
        version: rec.version,
        lease: rec.lease,
        tombstone: !rec.put,
    };
    let value = put.map_or(&[][..], |(v, _)| v);
    w.put(mvcc::record_key(p), mvcc::encode_record(&rec, value));
    w.put(mvcc::index_key(key), mvcc::encode_index(&entry));
    let from = live.map(|e| e.lease).filter(|l| *l != 0);
    let to = Some(rec.lease).filter(|l| *l != 0);
    st.leases.moved(key, from, to, w);
    w.work += 1;
    w.versions += 1;
    Ok(prev)
}

/// etcd's put (checked before: `precheck`).
fn run_put(
    w: &mut Writer<'_>,
    st: &mut State,
    c: &mut Cmd,
    p: &kv::PutRequest,
    bytes: &mut usize,
) -> Result<kv::PutResponse, Error> {
    let old = view::entry(w, &p.key)?;
    let live = old.filter(|e| !e.tombstone);
    let lease = match live {
        Some(e) if p.ignore_lease => e.lease,
        _ => p.lease,
    };
    let kept;
    let value = match live {
        Some(e) if p.ignore_value => {
            kept = match view::version_at(w, &p.key, &e, e.latest.revision, true)? {
                Found::Present(kv) => kv.value,
                _ => return Err(corrupt("a key's latest version is not held")),
            };
            kept.as_slice()
        }
        _ => p.value.as_slice(),
    };
    *bytes += value.len();
    let prev = write_version(w, st, c, &p.key, old, Some((value, lease)), p.prev_kv)?;
    Ok(kv::PutResponse { prev_kv: prev })
}

/// Whether every comparison of `t` holds at revision `at`; `None` if a
/// version it needed is gone (a compaction passed `at` meanwhile: only a
/// reader outside apply can see that).
pub(super) fn compares_hold(
    view: &impl View,
    t: &kv::TxnRequest,
    at: i64,
) -> Result<Option<bool>, Error> {
    for c in &t.compare {
        let value = matches!(c.target, kv::CompareTarget::Value(_));
        let held = if c.range_end.is_empty() {
            let kv = match view::entry(view, &c.key)? {
                None => None,
                Some(e) => match view::version_at(view, &c.key, &e, at, value)? {
                    Found::Present(kv) => Some(kv),
                    Found::Absent => None,
                    Found::Gone => return Ok(None),
                },
            };
            kv::compare_holds(c, kv.as_ref())
        } else {
            let req = kv::RangeRequest {
                key: c.key.clone(),
                range_end: c.range_end.clone(),
                keys_only: !value,
                ..kv::RangeRequest::default()
            };
            let found = view::range_at(view, &req, at, 0)?;
            if found.gone {
                return Ok(None);
            }
            match found.kvs.as_slice() {
                [] => kv::compare_holds(c, None),
                kvs => kvs.iter().all(|kv| kv::compare_holds(c, Some(kv))),
            }
        };
        if !held {
            return Ok(Some(false));
        }
    }
    Ok(Some(true))
}

/// [`compares_hold`] inside apply, where nothing is gone.
fn holds(w: &Writer<'_>, t: &kv::TxnRequest, at: i64) -> Result<bool, Error> {
    compares_hold(w, t, at)?.ok_or_else(|| corrupt("a version a comparison needs is not held"))
}

/// etcd's checks of what a command will run, at its base revision: a
/// refusal, or `None`.
pub(super) fn precheck(
    w: &Writer<'_>,
    st: &State,
    c: &Cmd,
    op: &RequestOp,
) -> Result<Option<KvError>, Error> {
    let base = c.base();
    match op {
        RequestOp::Range(r) if r.revision > base => Ok(Some(KvError::FutureRevision)),
        RequestOp::Range(r) if r.revision > 0 && r.revision < st.mvcc.compact => {
            Ok(Some(KvError::Compacted {
                compact_revision: st.mvcc.compact,
            }))
        }
        RequestOp::Range(_) | RequestOp::DeleteRange(_) => Ok(None),
        RequestOp::Put(p) if !p.ignore_value && !p.ignore_lease && p.lease == 0 => Ok(None),
        RequestOp::Put(p) => {
            let current = view::entry(w, &p.key)?.filter(|e| !e.tombstone);
            if (p.ignore_value || p.ignore_lease) && current.is_none() {
                return Ok(Some(KvError::KeyNotFound));
            }
            if p.lease != 0 {
                let now = current.map(|e| e.lease).filter(|l| *l != 0);
                match st.leases.can_take(p.lease, now) {
                    Ok(()) => {}
                    Err(leases::Refused::NotFound) => return Ok(Some(KvError::LeaseNotFound)),
                    Err(leases::Refused::Full) => return Ok(Some(KvError::LeaseFull)),
                }
            }
            Ok(None)
        }
        RequestOp::Txn(t) => {
            let ops = if holds(w, t, base)? {
                &t.success
            } else {
                &t.failure
            };
            for op in ops {
                if let Some(e) = precheck(w, st, c, op)? {
                    return Ok(Some(e));
                }
            }
            Ok(None)
        }
    }
}

/// An answer of `op`'s kind and nothing in it: for the requests a command
/// stopped after, once their answers are lost (a crash between steps).
fn placeholder(op: &RequestOp) -> ResponseOp {
    match op {
        RequestOp::Range(_) => ResponseOp::Range(kv::RangeResponse::default()),
        RequestOp::Put(_) => ResponseOp::Put(kv::PutResponse::default()),
        RequestOp::DeleteRange(_) => ResponseOp::DeleteRange(kv::DeleteRangeResponse::default()),
        RequestOp::Txn(_) => ResponseOp::Txn(kv::TxnResponse::default()),
    }
}

/// Runs `op` (checked); `resume`: where a paused one goes on, with its
/// answer so far (`acc`) if this process holds it.
pub(super) fn run_op(
    w: &mut Writer<'_>,
    st: &mut State,
    c: &mut Cmd,
    op: &RequestOp,
    resume: Option<(&[u32], Vec<u8>)>,
    acc: Option<ResponseOp>,
    bytes: &mut usize,
) -> Result<Ran<ResponseOp>, Error> {
    if resume.as_ref().is_some_and(|(path, _)| {
        !path.is_empty() && !matches!(op, RequestOp::Txn(_))
            || path.is_empty() && !matches!(op, RequestOp::DeleteRange(_))
    }) {
        return Err(corrupt(
            "m/applied: a partial mark that names no range delete",
        ));
    }
    Ok(match op {
        RequestOp::Range(r) => {
            let at = if r.revision > 0 {
                r.revision
            } else {
                st.mvcc.rev
            };
            let found = view::range_at(w, r, at, view::keep_for(r))?;
            Ran::Done(ResponseOp::Range(view::range_answer(r, found)))
        }
        RequestOp::Put(p) => Ran::Done(ResponseOp::Put(run_put(w, st, c, p, bytes)?)),
        RequestOp::DeleteRange(d) => {
            let acc = match acc {
                Some(ResponseOp::DeleteRange(r)) => Some(r),
                _ => None,
            };
            match run_delete(w, st, c, d, resume.map(|(_, k)| k), acc)? {
                Ran::Done(r) => Ran::Done(ResponseOp::DeleteRange(r)),
                Ran::Paused { path, key, partial } => Ran::Paused {
                    path,
                    key,
                    partial: ResponseOp::DeleteRange(partial),
                },
            }
        }
        RequestOp::Txn(t) => {
            let acc = match acc {
                Some(ResponseOp::Txn(r)) => Some(r),
                _ => None,
            };
            match run_txn(w, st, c, t, resume, acc, bytes)? {
                Ran::Done(r) => Ran::Done(ResponseOp::Txn(r)),
                Ran::Paused { path, key, partial } => Ran::Paused {
                    path,
                    key,
                    partial: ResponseOp::Txn(partial),
                },
            }
        }
    })
}

/// A transaction: its comparisons at the base revision choose a branch,
/// whose requests run in order.
fn run_txn(
    w: &mut Writer<'_>,
    st: &mut State,
    c: &mut Cmd,
    t: &kv::TxnRequest,
    resume: Option<(&[u32], Vec<u8>)>,
    acc: Option<kv::TxnResponse>,
    bytes: &mut usize,
) -> Result<Ran<kv::TxnResponse>, Error> {
    let succeeded = holds(w, t, c.base())?;
    let ops = if succeeded { &t.success } else { &t.failure };
    let mut resp = acc.unwrap_or(kv::TxnResponse {
        succeeded,
        responses: Vec::new(),
    });
    resp.succeeded = succeeded;
    let mut resume = resume;
    let start = resume
        .as_ref()
        .map_or(0, |(path, _)| path.first().map_or(0, |&i| i as usize));
    if start > ops.len() || (resume.is_some() && start == ops.len()) {
        return Err(corrupt(
            "m/applied: a partial mark past a transaction's end",
        ));
    }
    let mut child = None;
    if resume.is_some() {
        if resp.responses.len() > start {
            child = Some(resp.responses.remove(start));
        }
        resp.responses.truncate(start);
        while resp.responses.len() < start {
            resp.responses.push(placeholder(&ops[resp.responses.len()]));
        }
    } else {
        resp.responses.clear();
    }
    for (i, op) in ops.iter().enumerate().skip(start) {
        let ran = match resume.take() {
            Some((path, key)) => {
                run_op(w, st, c, op, Some((&path[1..], key)), child.take(), bytes)?
            }
            None => run_op(w, st, c, op, None, None, bytes)?,
        };
        match ran {
            Ran::Done(r) => resp.responses.push(r),
            Ran::Paused { path, key, partial } => {
                resp.responses.push(partial);
                let mut full = vec![i as u32];
                full.extend(path);
                return Ok(Ran::Paused {
                    path: full,
                    key,
                    partial: resp,
                });
            }
        }
    }
    Ok(Ran::Done(resp))
}

/// A delete of `[key, range_end)` from the index key `from` on (its
/// start if `None`), each live key's deletion a version, until the step
/// is full.
fn run_delete(
    w: &mut Writer<'_>,
    st: &mut State,
    c: &mut Cmd,
    d: &kv::DeleteRangeRequest,
    from: Option<Vec<u8>>,
    acc: Option<kv::DeleteRangeResponse>,
) -> Result<Ran<kv::DeleteRangeResponse>, Error> {
    let mut resp = acc.unwrap_or_default();
    let (start, to) = view::index_bounds(&d.key, &d.range_end);
    let mut from = from.unwrap_or(start);
    loop {
        let room = STEP_KEYS.saturating_sub(w.work).clamp(1, 256);
        let chunk = w.scan(&from, &to, room)?;
        let Some((last, _)) = chunk.last() else {
            return Ok(Ran::Done(resp));
        };
        let next = {
            let mut k = last.clone();
            k.push(0);
            k
        };
        for (k, v) in chunk {
            if w.work >= STEP_KEYS {
                return Ok(Ran::Paused {
                    path: Vec::new(),
                    key: k,
                    partial: resp,
                });
            }
            w.work += 1;
            let e = mvcc::decode_index(&v).ok_or_else(|| corrupt("an index entry is malformed"))?;
            if e.tombstone {
                continue;
            }
            let key = k[1..].to_vec();
            let prev = write_version(w, st, c, &key, Some(e), None, d.prev_kv)?;
            resp.deleted += 1;
            resp.prev_kvs.extend(prev);
        }
        from = next;
    }
}

/// Ends lease `lease`: its keys deleted (from the attachment `from` on,
/// or the first), in key order, until the step is full; its record goes
/// once the last key is.
pub(super) fn run_revoke(
    w: &mut Writer<'_>,
    st: &mut State,
    c: &mut Cmd,
    lease: i64,
    from: Option<Vec<u8>>,
) -> Result<Ran<()>, Error> {
    let mut from = from.unwrap_or_else(|| leases::attached_prefix(lease));
    let to = leases::attached_end(lease);
    loop {
        let room = STEP_KEYS.saturating_sub(w.work).clamp(1, 256);
        let chunk = w.scan(&from, &to, room)?;
        let Some((last, _)) = chunk.last() else {
            st.leases.end(lease, w.txn());
            return Ok(Ran::Done(()));
        };
        let next = {
            let mut k = last.clone();
            k.push(0);
            k
        };
        for (k, _) in chunk {
            if w.work >= STEP_KEYS {
                return Ok(Ran::Paused {
                    path: Vec::new(),
                    key: k,
                    partial: (),
                });
            }
            let key = k.get(9..).unwrap_or_default().to_vec();
            match view::entry(w, &key)? {
                Some(e) if !e.tombstone && e.lease == lease => {
                    write_version(w, st, c, &key, Some(e), None, false)?;
                }
                _ => {
                    // (An attachment whose key left the lease: only it goes.)
                    st.leases.moved(&key, Some(lease), None, w);
                    w.work += 1;
                }
            }
        }
        from = next;
    }
}
