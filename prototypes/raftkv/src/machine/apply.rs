//! Applying commands: each at its revision, through a [`Writer`] that
//! sees the batch's own uncommitted changes.

use super::record::{self, KeyMeta};
use super::sessions::Sessions;
use super::{corrupt, Error};
use crate::types::{layout, Command, Compare, Expect, RequestId, Revision, TxnOp, Verdict};
use kvstore::{Store, Transaction};
use std::collections::HashMap;

/// A store transaction, and what it changed in clients' keys so far: a
/// put needs the key's create revision and a comparison the key's state,
/// and the store answers only for what is committed.
pub(super) struct Writer<'s> {
    store: &'s Store,
    txn: Transaction<'s>,
    /// Stored keys this transaction wrote: their header and value, or
    /// `None` if it removed them.
    written: HashMap<Vec<u8>, Option<(KeyMeta, Vec<u8>)>>,
}

impl<'s> Writer<'s> {
    pub(super) fn new(store: &'s Store) -> Writer<'s> {
        Writer {
            store,
            txn: store.transaction(),
            written: HashMap::new(),
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

    /// A client key's header and value, as this transaction leaves it.
    fn entry(&self, stored: &[u8]) -> Result<Option<(KeyMeta, Vec<u8>)>, Error> {
        if let Some(w) = self.written.get(stored) {
            return Ok(w.clone());
        }
        match self.store.get(stored)? {
            None => Ok(None),
            Some(v) => {
                let (meta, value) = record::decode(&v)
                    .ok_or_else(|| corrupt("a client value without its revision header"))?;
                Ok(Some((meta, value.to_vec())))
            }
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8], rev: Revision) -> Result<(), Error> {
        let stored = layout::user(key);
        let create = self.entry(&stored)?.map_or(rev, |(m, _)| m.create);
        let meta = KeyMeta {
            create,
            modified: rev,
        };
        self.txn.put(&stored, &record::encode(meta, value));
        self.written.insert(stored, Some((meta, value.to_vec())));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) {
        let stored = layout::user(key);
        self.txn.delete(&stored);
        self.written.insert(stored, None);
    }

    /// Whether `c` holds.
    fn holds(&self, c: &Compare) -> Result<bool, Error> {
        let e = self.entry(&layout::user(&c.key))?;
        Ok(match (&c.expect, e) {
            (Expect::Absent, e) => e.is_none(),
            (Expect::Present, e) => e.is_some(),
            (Expect::ModRevision(r), Some((m, _))) => m.modified == *r,
            (Expect::Value(v), Some((_, value))) => *v == value,
            (Expect::ModRevision(_) | Expect::Value(_), None) => false,
        })
    }
}

/// Applies one command at `rev`, unless its request id says otherwise
/// ([`Sessions::admit`]); what became of it. `bytes` counts the value
/// bytes written.
pub(super) fn apply_command(
    w: &mut Writer<'_>,
    sessions: &mut Sessions,
    cmd: Command,
    rev: Revision,
    bytes: &mut usize,
) -> Result<Verdict, Error> {
    if let Command::Clock {
        now_ms,
        session_ttl_ms,
    } = cmd
    {
        sessions.tick(now_ms, session_ttl_ms, w.txn());
        return Ok(Verdict::Applied);
    }
    let id = cmd.request_id();
    if let Some(id) = id {
        if let Err(v) = sessions.admit(id, w.txn()) {
            return Ok(v);
        }
    }
    let succeeded = match cmd {
        Command::Put { key, value, .. } => {
            *bytes += value.len();
            w.put(&key, &value, rev)?;
            true
        }
        Command::Delete { key, .. } => {
            w.delete(&key);
            true
        }
        Command::DeleteRange { start, end, .. } => {
            delete_range(w, start, end)?;
            true
        }
        Command::Txn {
            compares,
            success,
            failure,
            ..
        } => {
            let mut held = true;
            for c in &compares {
                if !w.holds(c)? {
                    held = false;
                    break;
                }
            }
            for op in if held { success } else { failure } {
                match op {
                    TxnOp::Put { key, value } => {
                        *bytes += value.len();
                        w.put(&key, &value, rev)?;
                    }
                    TxnOp::Delete { key } => w.delete(&key),
                }
            }
            held
        }
        Command::Clock { .. } => true,
    };
    record(sessions, w, id, rev, succeeded);
    Ok(if succeeded {
        Verdict::Applied
    } else {
        Verdict::CompareFailed
    })
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

/// Removes the client keys in `[start, end)`. What the batch applied
/// before it is committed first (without the applied id: a crash replays
/// the entry, and every command in it replays to the same state), so the
/// range's iterator sees it; the keys go in transactions of 1,024, the
/// last ones in the batch's.
fn delete_range(w: &mut Writer<'_>, start: Vec<u8>, end: Option<Vec<u8>>) -> Result<(), Error> {
    w.commit_no_wait()?;
    let store = w.store;
    let to = end.map_or_else(|| vec![layout::USER + 1], |e| layout::user(&e));
    let mut keys = Vec::new();
    for pair in store.range(layout::user(&start)..to)? {
        keys.push(pair?.0);
        if keys.len() == 1024 {
            let mut t = store.transaction();
            for k in keys.drain(..) {
                t.delete(&k);
            }
            t.commit_no_wait()?;
        }
    }
    for k in keys {
        w.txn.delete(&k);
        w.written.insert(k, None);
    }
    Ok(())
}
