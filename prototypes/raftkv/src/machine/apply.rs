//! Applying commands: each at its revision, through a [`Writer`] that
//! sees the batch's own uncommitted changes.

use super::events::{self, Position, HISTORY_STATE};
use super::leases::{self, lease_id, Refused};
use super::record::{self, KeyMeta};
use super::sessions::Sessions;
use super::{corrupt, AppliedState, Error, Partial, State};
use crate::types::TypeConfig;
use crate::types::{
    layout, Applied, Batch, Command, Compare, Expect, RequestId, Revision, TxnOp, Verdict,
};
use kvstore::{Store, Transaction};
use openraft::alias::LogIdOf;
use std::collections::HashMap;

/// A store transaction, and what it changed in clients' keys so far: a
/// put needs the key's create revision and a comparison the key's state,
/// and the store answers only for what is committed.
pub(super) struct Writer<'s> {
    store: &'s Store,
    txn: Transaction<'s>,
    /// Stored keys this transaction wrote: their stored bytes (header and
    /// value, as put), or `None` if it removed them.
    written: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// The position of the next event (`events.rs`).
    next_event: Position,
    /// Events written since [`Writer::take_events`].
    events: u64,
    /// Whether events are written at all (a watch history is kept).
    keep_events: bool,
}

impl<'s> Writer<'s> {
    pub(super) fn new(store: &'s Store, keep_events: bool) -> Writer<'s> {
        Writer {
            store,
            txn: store.transaction(),
            written: HashMap::new(),
            next_event: Position::default(),
            events: 0,
            keep_events,
        }
    }

    /// The events written since the last call.
    pub(super) fn take_events(&mut self) -> u64 {
        std::mem::take(&mut self.events)
    }

    /// The number the next event at `rev` gets.
    fn next_event_number(&self, rev: Revision) -> u32 {
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
        Ok(old.and_then(|m| m.lease))
    }

    /// Removes `key`, with an event if it was there; the lease it was
    /// attached to.
    fn delete(&mut self, key: &[u8], rev: Revision) -> Result<Option<u64>, Error> {
        let stored = layout::user(key);
        let old = self.meta(&stored)?;
        if old.is_some() {
            self.event(rev, key, None);
        }
        self.txn.delete(&stored);
        self.written.insert(stored, None);
        Ok(old.and_then(|m| m.lease))
    }

    /// The lease `key` is attached to, as this transaction leaves it.
    fn lease_of(&self, key: &[u8]) -> Result<Option<u64>, Error> {
        Ok(self.meta(&layout::user(key))?.and_then(|m| m.lease))
    }

    /// The client keys attached to `lease`, as this transaction leaves
    /// them: the committed attachments (read from the store, in key
    /// order) that the transaction did not move, and the keys it attached.
    fn attached(&self, lease: u64) -> Result<Vec<Vec<u8>>, Error> {
        let mut keys = Vec::new();
        for pair in self.store.prefix(&leases::attached_prefix(lease))? {
            let (k, _) = pair?;
            let key = k.get(9..).unwrap_or_default();
            let moved = self.written.get(&layout::user(key)).map(|w| {
                w.as_deref()
                    .and_then(record::decode)
                    .is_none_or(|(m, _)| m.lease != Some(lease))
            });
            if moved != Some(true) {
                keys.push(key.to_vec());
            }
        }
        let committed = keys.len();
        for (stored, w) in &self.written {
            if let Some((m, _)) = w.as_deref().and_then(record::decode) {
                let key = stored.get(1..).unwrap_or_default();
                if m.lease == Some(lease)
                    && keys[..committed]
                        .binary_search_by(|k| k.as_slice().cmp(key))
                        .is_err()
                {
                    keys.push(key.to_vec());
                }
            }
        }
        Ok(keys)
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

/// Where a command is applied: the log id applied before its entry, and
/// its revision.
#[derive(Debug, Clone, Copy)]
struct At {
    prev: Option<LogIdOf<TypeConfig>>,
    rev: Revision,
}

/// Applies the commands of entry `index` (`prev` the entry applied before
/// it), each at its revision; after a crash inside the entry, from where
/// its last partial commit stopped ([`Partial`]).
pub(super) fn apply_batch(
    w: &mut Writer<'_>,
    st: &mut State,
    (prev, index): (Option<LogIdOf<TypeConfig>>, u64),
    batch: Batch,
    bytes: &mut usize,
) -> Result<Applied, Error> {
    let partial = st.applied.partial.take().filter(|p| p.index == index);
    let mut reply = Applied::default();
    for (sub, cmd) in (0u32..).zip(batch.0) {
        let at = At {
            prev,
            rev: Revision { index, sub },
        };
        let v = match &partial {
            // Applied before the crash (its answer went out then, if at all).
            Some(p) if sub < p.sub => Verdict::Applied,
            Some(p) if sub == p.sub => match cmd {
                Command::DeleteRange { end, .. } => {
                    delete_range(w, st, at, (p.resume.clone(), end), p.n)?;
                    Verdict::Applied
                }
                _ => {
                    return Err(corrupt(
                        "m/applied: a partial entry that is not a range delete",
                    ))
                }
            },
            _ => apply_command(w, st, cmd, at, bytes)?,
        };
        reply.verdicts.push(v);
    }
    Ok(reply)
}

/// Applies one command, unless its request id says otherwise
/// ([`Sessions::admit`]); what became of it. `bytes` counts the value
/// bytes written.
fn apply_command(
    w: &mut Writer<'_>,
    st: &mut State,
    cmd: Command,
    at: At,
    bytes: &mut usize,
) -> Result<Verdict, Error> {
    let rev = at.rev;
    if let Command::Clock {
        now_ms,
        session_ttl_ms,
    } = cmd
    {
        st.sessions.tick(now_ms, session_ttl_ms, w.txn());
        // Leases past their deadline end, their keys deleted.
        for lease in st.leases.expired(st.sessions.clock) {
            revoke(w, st, lease, rev)?;
        }
        return Ok(Verdict::Applied);
    }
    let id = cmd.request_id();
    if let Some(id) = id {
        if let Err(v) = st.sessions.admit(id, w.txn()) {
            return Ok(v);
        }
    }
    let succeeded = match cmd {
        Command::Put { key, value, .. } => {
            *bytes += value.len();
            let old = w.put(&key, &value, rev, None)?;
            st.leases.moved(&key, old, None, w.txn());
            true
        }
        Command::Delete { key, .. } => {
            let old = w.delete(&key, rev)?;
            st.leases.moved(&key, old, None, w.txn());
            true
        }
        Command::DeleteRange { start, end, .. } => {
            // (The session's answer goes in the first partial commit.)
            record(&mut st.sessions, w, id, rev, true);
            delete_range(w, st, at, (layout::user(&start), end), 0)?;
            return Ok(Verdict::Applied);
        }
        Command::Txn {
            compares,
            success,
            failure,
            ..
        } => match apply_txn(w, st, &compares, (success, failure), rev, bytes)? {
            Ok(held) => held,
            // Refused whole, nothing applied: not recorded either (a retry
            // is decided again).
            Err(v) => return Ok(v),
        },
        Command::LeaseGrant { ttl_ms, .. } => {
            let now = st.sessions.clock;
            st.leases.grant(lease_id(rev), ttl_ms, now, w.txn());
            true
        }
        Command::LeaseKeepAlive { lease, .. } => {
            let now = st.sessions.clock;
            if !st.leases.keep_alive(lease, now, w.txn()) {
                return Ok(Verdict::LeaseNotFound);
            }
            true
        }
        Command::LeaseRevoke { lease, .. } => {
            if !revoke(w, st, lease, rev)? {
                return Ok(Verdict::LeaseNotFound);
            }
            true
        }
        Command::Clock { .. } => true,
    };
    record(&mut st.sessions, w, id, rev, succeeded);
    Ok(if succeeded {
        Verdict::Applied
    } else {
        Verdict::CompareFailed
    })
}

/// Evaluates a transaction's comparisons and applies the branch they
/// choose: whether they held — or, if a lease that branch attaches a key
/// to cannot take it, that verdict, with nothing applied.
fn apply_txn(
    w: &mut Writer<'_>,
    st: &mut State,
    compares: &[Compare],
    (success, failure): (Vec<TxnOp>, Vec<TxnOp>),
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
    for op in &ops {
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
                let old = w.put(&key, &value, rev, lease)?;
                st.leases.moved(&key, old, lease, w.txn());
            }
            TxnOp::Delete { key } => {
                let old = w.delete(&key, rev)?;
                st.leases.moved(&key, old, None, w.txn());
            }
        }
    }
    Ok(Ok(held))
}

/// Ends lease `lease` and deletes its keys at `rev`; `false` if there is
/// no such lease.
fn revoke(w: &mut Writer<'_>, st: &mut State, lease: u64, rev: Revision) -> Result<bool, Error> {
    if !st.leases.holds(lease) {
        return Ok(false);
    }
    let keys = w.attached(lease)?;
    st.leases.revoke(lease, &keys, w.txn());
    for k in keys {
        w.delete(&k, rev)?;
    }
    Ok(true)
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

/// Commits what is written so far as a partial apply of the entry at
/// `at`: the store then holds the log through `at.prev`, and the entry up
/// to `resume` in its range delete.
fn commit_partial(
    w: &mut Writer<'_>,
    st: &mut State,
    at: At,
    resume: Vec<u8>,
) -> Result<(), Error> {
    st.history.count += w.take_events();
    w.txn().put(HISTORY_STATE, &st.history.encode());
    let state = AppliedState {
        log_id: at.prev,
        membership: st.applied.membership.clone(),
        partial: Some(Partial {
            index: at.rev.index,
            sub: at.rev.sub,
            resume,
            n: w.next_event_number(at.rev),
        }),
    };
    let state = postcard::to_stdvec(&state).map_err(corrupt)?;
    w.txn().put(layout::APPLIED, &state);
    w.commit_no_wait()
}

/// Removes the client keys from the stored key `from` on, before `end`,
/// each with its event (numbered from `n`). The store transaction is
/// committed first, as a partial apply (so the range's iterator sees
/// what came before), and after every 1,024 keys; the last ones go in the
/// batch's transaction.
fn delete_range(
    w: &mut Writer<'_>,
    st: &mut State,
    at: At,
    (from, end): (Vec<u8>, Option<Vec<u8>>),
    n: u32,
) -> Result<(), Error> {
    w.next_event = Position {
        revision: at.rev,
        n,
    };
    commit_partial(w, st, at, from.clone())?;
    let store = w.store;
    let to = end.map_or_else(|| vec![layout::USER + 1], |e| layout::user(&e));
    let mut in_txn = 0;
    for pair in store.range(from..to)? {
        let (k, v) = pair?;
        let key = k.get(1..).unwrap_or_default();
        let lease = record::decode(&v).and_then(|(m, _)| m.lease);
        st.leases.moved(key, lease, None, w.txn());
        w.event(at.rev, key, None);
        w.txn.delete(&k);
        in_txn += 1;
        if in_txn == 1024 {
            // Goes on from the smallest key after `k`.
            let mut resume = k;
            resume.push(0);
            commit_partial(w, st, at, resume)?;
            in_txn = 0;
        } else {
            w.written.insert(k, None);
        }
    }
    Ok(())
}
