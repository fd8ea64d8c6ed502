//! Applying commands: each at its revision, through a [`Writer`] that
//! sees the step's own uncommitted changes.
//!
//! Apply is a pure function of the log: what it writes and the events it
//! emits depend on the commands and the store alone — no clock (time
//! comes in the log's `Clock` commands), no randomness, no iteration over
//! a hash container (whose order differs per process), and nothing on how
//! entries are grouped into steps or store transactions. A command whose
//! work has no small bound (a range delete, a revoke) walks its keys in
//! key order, from the store, and can stop after any key: the step then
//! commits where it stopped (`m/applied`'s partial mark) and the next step
//! — or, after a crash, the replay — goes on from there (`step.rs`).

use super::events::{self, Position};
use super::leases::{self, lease_id, Refused};
use super::record::{self, KeyMeta};
use super::sessions::Sessions;
use super::step::{commit_partial, At, STEP_KEYS};
use super::{corrupt, Error, Resume, State};
use crate::types::{layout, Command, Compare, Expect, RequestId, Revision, TxnOp, Verdict};
use kvstore::{Store, Transaction};
use std::collections::BTreeMap;

/// A store transaction, and what it changed in clients' keys so far: a
/// put needs the key's create revision and a comparison the key's state,
/// and the store answers only for what is committed.
pub(super) struct Writer<'s> {
    pub(super) store: &'s Store,
    txn: Transaction<'s>,
    /// Stored keys this transaction wrote: their stored bytes (header and
    /// value, as put), or `None` if it removed them. (Looked up only,
    /// never iterated.)
    written: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The position of the next event (`events.rs`).
    next_event: Position,
    /// Events written since [`Writer::take_events`].
    events: u64,
    /// The positions of the events written in this transaction, in order
    /// (history compaction may reach them before they are committed).
    fresh: Vec<Position>,
    /// Whether events are written at all (a watch history is kept).
    keep_events: bool,
    /// Keys written or deleted since the writer began: the step's work.
    pub(super) work: usize,
}

impl<'s> Writer<'s> {
    pub(super) fn new(store: &'s Store, keep_events: bool) -> Writer<'s> {
        Writer {
            store,
            txn: store.transaction(),
            written: BTreeMap::new(),
            next_event: Position::default(),
            events: 0,
            fresh: Vec::new(),
            keep_events,
            work: 0,
        }
    }

    /// The events written since the last call.
    pub(super) fn take_events(&mut self) -> u64 {
        std::mem::take(&mut self.events)
    }

    /// Compacts `history` to `retention` (at most `max` events), the
    /// events of this transaction included; how many it removed.
    pub(super) fn compact(
        &mut self,
        history: &mut events::History,
        (retention, max): (u64, u64),
    ) -> Result<u64, Error> {
        history.compact(self.store, &mut self.txn, &self.fresh, (retention, max))
    }

    /// The number the next event at `rev` gets.
    pub(super) fn next_event_number(&self, rev: Revision) -> u32 {
        if self.next_event.revision == rev {
            self.next_event.n
        } else {
            0
        }
    }

    /// Records a change of `key` at `rev` in the history.
    fn event(&mut self, rev: Revision, key: &[u8], value: Option<&[u8]>) {
        if self.next_event.revision != rev {
            self.next_event = Position {
                revision: rev,
                n: 0,
            };
        }
        let p = self.next_event;
        self.next_event = p.next();
        if self.keep_events {
            self.txn.put(&events::key(p), &events::encode(key, value));
            self.fresh.push(p);
            self.events += 1;
        }
    }

    /// The transaction, for the state machine's own keys.
    pub(super) fn txn(&mut self) -> &mut Transaction<'s> {
        &mut self.txn
    }

    /// Commits what is written so far (visible at once, durable later)
    /// and starts the next transaction.
    pub(super) fn commit_no_wait(&mut self) -> Result<(), Error> {
        std::mem::replace(&mut self.txn, self.store.transaction()).commit_no_wait()?;
        self.written.clear();
        self.fresh.clear();
        Ok(())
    }

    /// A client key's stored bytes (header and value), as this
    /// transaction leaves it, handed to `f`.
    fn with_stored<T>(
        &self,
        stored: &[u8],
        f: impl FnOnce(KeyMeta, &[u8]) -> T,
    ) -> Result<Option<T>, Error> {
        let decoded = |v: &[u8]| {
            record::decode(v)
                .map(|(meta, value)| f(meta, value))
                .ok_or_else(|| corrupt("a client value without its revision header"))
        };
        match self.written.get(stored) {
            Some(w) => w.as_deref().map(decoded).transpose(),
            None => self.store.get(stored)?.as_deref().map(decoded).transpose(),
        }
    }

    /// A client key's header, as this transaction leaves it (its value not
    /// copied: a put needs only the create revision and the lease).
    fn meta(&self, stored: &[u8]) -> Result<Option<KeyMeta>, Error> {
        self.with_stored(stored, |meta, _| meta)
    }

    /// Sets `key` to `value` at `rev`, attached to `lease`; the lease it
    /// was attached to.
    fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        rev: Revision,
        lease: Option<u64>,
    ) -> Result<Option<u64>, Error> {
        let stored = layout::user(key);
        let old = self.meta(&stored)?;
        let meta = KeyMeta {
            create: old.map_or(rev, |m| m.create),
            modified: rev,
            lease,
        };
        let bytes = record::encode(meta, value);
        self.txn.put(&stored, &bytes);
        self.written.insert(stored, Some(bytes));
        self.event(rev, key, Some(value));
        self.work += 1;
        Ok(old.and_then(|m| m.lease))
    }

    /// Removes `key`, with an event if it was there; its header if it was.
    fn delete(&mut self, key: &[u8], rev: Revision) -> Result<Option<KeyMeta>, Error> {
        let stored = layout::user(key);
        let old = self.meta(&stored)?;
        if old.is_some() {
            self.event(rev, key, None);
        }
        self.txn.delete(&stored);
        self.written.insert(stored, None);
        self.work += 1;
        Ok(old)
    }

    /// The lease `key` is attached to, as this transaction leaves it.
    fn lease_of(&self, key: &[u8]) -> Result<Option<u64>, Error> {
        Ok(self.meta(&layout::user(key))?.and_then(|m| m.lease))
    }

    /// Whether `c` holds.
    fn holds(&self, c: &Compare) -> Result<bool, Error> {
        let stored = layout::user(&c.key);
        Ok(match &c.expect {
            Expect::Absent => self.meta(&stored)?.is_none(),
            Expect::Present => self.meta(&stored)?.is_some(),
            Expect::ModRevision(r) => self.meta(&stored)?.is_some_and(|m| m.modified == *r),
            Expect::Value(v) => self
                .with_stored(&stored, |_, value| value == v.as_slice())?
                .unwrap_or(false),
        })
    }
}

/// How far a command got in a step.
pub(super) enum Progress {
    /// Done, with its verdict.
    Done(Verdict),
    /// Stopped part way, the store committed up to where (the step's work
    /// reached [`STEP_KEYS`]): the next step goes on from there.
    Paused,
}

/// Applies one command from its start, unless its request id says
/// otherwise ([`Sessions::admit`]). `bytes` counts the value bytes
/// written.
pub(super) fn apply_command(
    w: &mut Writer<'_>,
    st: &mut State,
    cmd: &Command,
    at: At,
    bytes: &mut usize,
) -> Result<Progress, Error> {
    let rev = at.rev;
    if let Command::Clock {
        now_ms,
        session_ttl_ms,
    } = cmd
    {
        st.sessions.tick(*now_ms, *session_ttl_ms, w.txn());
        return Ok(Progress::Done(Verdict::Applied));
    }
    let id = cmd.request_id();
    if let Some(id) = id {
        if let Err(v) = st.sessions.admit(id, w.txn()) {
            return Ok(Progress::Done(v));
        }
    }
    let succeeded = match cmd {
        Command::Put { key, value, .. } => {
            *bytes += value.len();
            let old = w.put(key, value, rev, None)?;
            st.leases.moved(key, old, None, w.txn());
            true
        }
        Command::Delete { key, .. } => {
            let old = w.delete(key, rev)?.and_then(|m| m.lease);
            st.leases.moved(key, old, None, w.txn());
            true
        }
        Command::DeleteRange { start, end, .. } => {
            // (The session's answer goes in the first partial commit.)
            record(&mut st.sessions, w, id, rev, true);
            let from = Resume {
                key: layout::user(start),
                n: 0,
            };
            return delete_range(w, st, at, from, end.as_deref());
        }
        Command::LeaseRevoke { lease, .. } => {
            if !st.leases.holds(*lease) {
                return Ok(Progress::Done(Verdict::LeaseNotFound));
            }
            record(&mut st.sessions, w, id, rev, true);
            let from = Resume {
                key: leases::attached_prefix(*lease),
                n: 0,
            };
            return revoke(w, st, *lease, at, from);
        }
        Command::Txn {
            compares,
            success,
            failure,
            ..
        } => match apply_txn(w, st, compares, (success, failure), rev, bytes)? {
            Ok(held) => held,
            // Refused whole, nothing applied: not recorded either (a retry
            // is decided again).
            Err(v) => return Ok(Progress::Done(v)),
        },
        Command::LeaseGrant { ttl_ms, .. } => {
            st.leases.grant(lease_id(rev), *ttl_ms, w.txn());
            true
        }
        Command::LeaseKeepAlive { lease, .. } => {
            if !st.leases.keep_alive(*lease, w.txn()) {
                return Ok(Progress::Done(Verdict::LeaseNotFound));
            }
            true
        }
        Command::LeaseCheckpoint { leases } => {
            for &(lease, remaining_ms) in leases {
                // (A lease revoked since the leader read it: nothing.)
                st.leases.checkpoint(lease, remaining_ms, w.txn());
            }
            true
        }
        Command::Clock { .. } => true,
    };
    record(&mut st.sessions, w, id, rev, succeeded);
    Ok(Progress::Done(if succeeded {
        Verdict::Applied
    } else {
        Verdict::CompareFailed
    }))
}

/// Goes on with a command a step (or a crash) stopped part way: a range
/// delete or a revoke, from `from`.
pub(super) fn resume_command(
    w: &mut Writer<'_>,
    st: &mut State,
    cmd: &Command,
    at: At,
    from: Resume,
) -> Result<Progress, Error> {
    match cmd {
        Command::DeleteRange { end, .. } => delete_range(w, st, at, from, end.as_deref()),
        Command::LeaseRevoke { lease, .. } => revoke(w, st, *lease, at, from),
        _ => Err(corrupt(
            "m/applied: a partial entry that is not a range delete or a revoke",
        )),
    }
}

/// Evaluates a transaction's comparisons and applies the branch they
/// choose: whether they held — or, if a lease that branch attaches a key
/// to cannot take it, that verdict, with nothing applied.
fn apply_txn(
    w: &mut Writer<'_>,
    st: &mut State,
    compares: &[Compare],
    (success, failure): (&[TxnOp], &[TxnOp]),
    rev: Revision,
    bytes: &mut usize,
) -> Result<Result<bool, Verdict>, Error> {
    let mut held = true;
    for c in compares {
        if !w.holds(c)? {
            held = false;
            break;
        }
    }
    let ops = if held { success } else { failure };
    for op in ops {
        if let TxnOp::Put {
            key,
            lease: Some(lease),
            ..
        } = op
        {
            match st.leases.can_take(*lease, w.lease_of(key)?) {
                Ok(()) => {}
                Err(Refused::NotFound) => return Ok(Err(Verdict::LeaseNotFound)),
                Err(Refused::Full) => return Ok(Err(Verdict::LeaseFull)),
            }
        }
    }
    for op in ops {
        match op {
            TxnOp::Put { key, value, lease } => {
                *bytes += value.len();
                let old = w.put(key, value, rev, *lease)?;
                st.leases.moved(key, old, *lease, w.txn());
            }
            TxnOp::Delete { key } => {
                let old = w.delete(key, rev)?.and_then(|m| m.lease);
                st.leases.moved(key, old, None, w.txn());
            }
        }
    }
    Ok(Ok(held))
}

fn record(
    sessions: &mut Sessions,
    w: &mut Writer<'_>,
    id: Option<RequestId>,
    rev: Revision,
    succeeded: bool,
) {
    if let Some(id) = id {
        sessions.record(id, rev, succeeded, w.txn());
    }
}

/// Walks the stored keys from `from.key` on, before `to`, in key order,
/// handing each to `each`; events numbered from `from.n`. The store
/// transaction is committed first, as a partial apply (so the walk sees
/// everything before it); once the step's work reaches [`STEP_KEYS`] the
/// walk stops, committing where it stopped.
fn walk(
    w: &mut Writer<'_>,
    st: &mut State,
    at: At,
    (from, to): (Resume, Vec<u8>),
    mut each: impl FnMut(&mut Writer<'_>, &mut State, &[u8], &[u8]) -> Result<(), Error>,
) -> Result<Progress, Error> {
    w.next_event = Position {
        revision: at.rev,
        n: from.n,
    };
    commit_partial(w, st, at, Some(from.clone()))?;
    let store = w.store;
    for pair in store.range(from.key..to)? {
        let (k, v) = pair?;
        if w.work >= STEP_KEYS {
            let n = w.next_event_number(at.rev);
            commit_partial(w, st, at, Some(Resume { key: k, n }))?;
            return Ok(Progress::Paused);
        }
        each(w, st, &k, &v)?;
    }
    Ok(Progress::Done(Verdict::Applied))
}

/// Removes the client keys from the stored key `from` on, before `end`,
/// each with its event, in steps ([`walk`]).
fn delete_range(
    w: &mut Writer<'_>,
    st: &mut State,
    at: At,
    from: Resume,
    end: Option<&[u8]>,
) -> Result<Progress, Error> {
    let to = end.map_or_else(|| vec![layout::USER + 1], layout::user);
    walk(w, st, at, (from, to), |w, st, k, v| {
        let key = k.get(1..).unwrap_or_default();
        let lease = record::decode(v).and_then(|(m, _)| m.lease);
        st.leases.moved(key, lease, None, w.txn());
        w.event(at.rev, key, None);
        w.txn.delete(k);
        w.written.insert(k.to_vec(), None);
        w.work += 1;
        Ok(())
    })
}

/// Ends lease `lease` and deletes its keys, in key order, in steps
/// ([`walk`] over its attachments, from `from`); its record goes last.
fn revoke(
    w: &mut Writer<'_>,
    st: &mut State,
    lease: u64,
    at: At,
    from: Resume,
) -> Result<Progress, Error> {
    let to = leases::attached_end(lease);
    let walked = walk(w, st, at, (from, to), |w, st, k, _| {
        let key = k.get(9..).unwrap_or_default();
        if w.lease_of(key)? == Some(lease) {
            w.delete(key, at.rev)?;
        }
        // (Removes the attachment, and counts the key off the lease.)
        st.leases.moved(key, Some(lease), None, w.txn());
        Ok(())
    })?;
    if let Progress::Done(_) = walked {
        st.leases.end(lease, w.txn());
    }
    Ok(walked)
}
