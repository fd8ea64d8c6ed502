//! Applying entries in bounded steps.
//!
//! A step holds the state lock, applies entries (or part of one) through
//! one [`Writer`] and commits one store transaction; it ends once its
//! work — versions written, index entries walked, versions compacted —
//! reaches [`STEP_KEYS`], or after [`BATCH_ENTRIES`] entries or
//! [`BATCH_BYTES`] of values. Between two steps the caller releases the
//! lock and gives the runtime thread back, so a range delete of 200,000
//! keys neither holds the lock nor blocks the thread (heartbeats, reads,
//! other requests go on). A step that stops inside an entry commits where
//! it stopped as `m/applied`'s partial mark — the command it stopped in,
//! and where in it — exactly as a crash leaves it, so the next step and a
//! replay after a crash go on the same way.
//!
//! Until an entry is applied whole, the applied id stays at the one
//! before it; readers read at the revision of the last command applied
//! whole, so they never see part of a command. A snapshot built between
//! two steps holds the partial mark, and a node that installs it goes on
//! from there. After each entry the physical compaction goes on
//! (`compact.rs`), a bounded amount an entry.

use super::apply::{self, Progress};
use super::mvcc::MVCC_STATE;
use super::writer::Writer;
use super::{corrupt, Error, Partial, Resume, State};
use crate::kv::ResponseOp;
use crate::types::{layout, Applied, Command, TypeConfig};
use openraft::alias::{EntryOf, LogIdOf};
use openraft::{EntryPayload, StoredMembership};
use std::collections::VecDeque;

/// Keys a step writes, deletes or walks, about: it ends at the first
/// command boundary (or key of a range delete or revoke) past it. A step's
/// work is at most this plus one command's (a transaction's
/// [`crate::kv::MAX_TXN_OPS`] changes a branch) and one entry's physical
/// compaction (`compact.rs`).
pub const STEP_KEYS: usize = 1024;
/// Entries applied per step, at most.
const BATCH_ENTRIES: usize = 256;
/// Bytes of values per step, at most (beyond one entry).
const BATCH_BYTES: usize = 1 << 20;

/// Where a command is in the log: its entry's index and its position in
/// the entry. (The entry before it is the state's applied id until its
/// entry is applied whole.)
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) index: u64,
    pub(super) pos: u32,
}

/// The entry a step stopped in.
struct InEntry {
    log_id: LogIdOf<TypeConfig>,
    /// The position of the next command.
    sub: u32,
    /// The commands not yet applied whole (the one in progress first).
    cmds: VecDeque<Command>,
    reply: Applied,
    /// The answer so far of the command in progress, if it paused.
    acc: Option<ResponseOp>,
    /// Versions its commands wrote (the compaction's budget after it).
    versions: usize,
}

/// An apply call's entries, applied step by step.
pub(super) struct Run {
    queue: std::vec::IntoIter<EntryOf<TypeConfig>>,
    current: Option<InEntry>,
    /// The answers of the entries applied so far, in order.
    pub(super) out: Vec<Applied>,
}

impl Run {
    pub(super) fn new(entries: Vec<EntryOf<TypeConfig>>) -> Run {
        Run {
            out: Vec::with_capacity(entries.len()),
            queue: entries.into_iter(),
            current: None,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StepDone {
    /// More remains to apply.
    pub(super) more: bool,
    /// Value bytes it wrote.
    pub(super) bytes: usize,
    /// Its work (client keys written or deleted, events compacted).
    pub(super) work: usize,
}

/// The entry `e` ready to apply (a membership is taken at once); after a
/// crash inside it, the commands its partial mark says are applied are
/// skipped (answered `Applied`: their answers went out then, if at all).
fn begin(st: &mut State, e: EntryOf<TypeConfig>) -> InEntry {
    let mut entry = InEntry {
        log_id: e.log_id,
        sub: 0,
        cmds: VecDeque::new(),
        reply: Applied::default(),
        acc: None,
        versions: 0,
    };
    match e.payload {
        EntryPayload::Blank => {}
        EntryPayload::Membership(m) => {
            st.applied.membership = StoredMembership::new(Some(e.log_id), m);
        }
        EntryPayload::Normal(batch) => entry.cmds = batch.0.into(),
    }
    let skip = match &st.applied.partial {
        Some(p) if p.index == e.log_id.index => p.sub,
        _ => {
            st.applied.partial = None;
            0
        }
    };
    while entry.sub < skip && entry.cmds.pop_front().is_some() {
        entry.reply.verdicts.push(crate::Verdict::Applied {
            revision: st.mvcc.rev,
            answer: crate::types::Answer::Done,
        });
        entry.sub += 1;
    }
    entry
}

/// Applies `e`'s commands until they are done or the step is full;
/// `true` if it stopped (committed where).
fn apply_commands(
    w: &mut Writer<'_>,
    st: &mut State,
    e: &mut InEntry,
    bytes: &mut usize,
) -> Result<bool, Error> {
    while let Some(cmd) = e.cmds.pop_front() {
        let at = At {
            index: e.log_id.index,
            pos: e.sub,
        };
        let resume = st
            .applied
            .partial
            .take()
            .filter(|p| p.index == at.index && p.sub == at.pos)
            .and_then(|p| p.resume);
        let before = w.versions;
        let progress = match resume {
            Some(from) => apply::resume_command(w, st, &cmd, at, (from, e.acc.take()), bytes)?,
            None => apply::apply_command(w, st, &cmd, at, bytes)?,
        };
        e.versions += w.versions - before;
        match progress {
            Progress::Done(v) => {
                e.reply.verdicts.push(v);
                e.sub += 1;
            }
            Progress::Paused(acc) => {
                e.acc = acc;
                e.cmds.push_front(cmd);
                return Ok(true);
            }
        }
        if w.work >= STEP_KEYS && !e.cmds.is_empty() {
            // The step is full: the next one begins at the next command.
            let next = At {
                index: e.log_id.index,
                pos: e.sub,
            };
            commit_partial(w, st, next, None)?;
            return Ok(true);
        }
    }
    Ok(false)
}

/// Ends entry `e`: it is the applied id, and the physical compaction
/// goes on (a bounded amount an entry, more after an entry that wrote
/// more: `compact.rs`).
fn finish(w: &mut Writer<'_>, st: &mut State, e: InEntry, run: &mut Run) -> Result<(), Error> {
    st.applied.log_id = Some(e.log_id);
    st.applied.partial = None;
    super::compact::compact_some(w, st, e.versions)?;
    run.out.push(e.reply);
    Ok(())
}

/// One step (see the module docs).
pub(super) fn step(st: &mut State, run: &mut Run) -> Result<StepDone, Error> {
    let store = st.store.clone();
    let mut w = Writer::new(&store);
    let mut done = StepDone::default();
    let mut entries = 0;
    loop {
        let mut e = match run.current.take() {
            Some(e) => e,
            None => match run.queue.next() {
                Some(entry) => begin(st, entry),
                None => break,
            },
        };
        if apply_commands(&mut w, st, &mut e, &mut done.bytes)? {
            // (Committed where it stopped.)
            run.current = Some(e);
            done.more = true;
            done.work = w.work;
            return Ok(done);
        }
        finish(&mut w, st, e, run)?;
        entries += 1;
        if entries == BATCH_ENTRIES || done.bytes >= BATCH_BYTES || w.work >= STEP_KEYS {
            break;
        }
    }
    if entries > 0 {
        commit_step(st, &mut w)?;
    }
    done.more = !run.queue.as_slice().is_empty();
    done.work = w.work;
    Ok(done)
}

/// Commits a step that ended between entries: the applied id, the
/// store's revisions.
fn commit_step(st: &mut State, w: &mut Writer<'_>) -> Result<(), Error> {
    w.txn().put(MVCC_STATE, &st.mvcc.encode());
    st.applied.partial = None;
    let state = postcard::to_stdvec(&st.applied).map_err(corrupt)?;
    w.txn().put(layout::APPLIED, &state);
    w.commit_no_wait()
}

/// Commits what is written so far as a partial apply of the entry `at`
/// is in: the store then holds the log through the applied id, and the
/// entry up to command `at.pos` — from `resume` in it, if it began.
pub(super) fn commit_partial(
    w: &mut Writer<'_>,
    st: &mut State,
    at: At,
    resume: Option<Resume>,
) -> Result<(), Error> {
    w.txn().put(MVCC_STATE, &st.mvcc.encode());
    st.applied.partial = Some(Partial {
        index: at.index,
        sub: at.pos,
        resume,
    });
    let state = postcard::to_stdvec(&st.applied).map_err(corrupt)?;
    w.txn().put(layout::APPLIED, &state);
    w.commit_no_wait()
}

impl super::StateMachine {
    /// Applies `entries` in order and returns their answers, as openraft's
    /// `apply` does (which hands each answer to its client): for tests and
    /// tools that drive a state machine without Raft. A failure marks the
    /// machine failed, as in `apply`.
    pub async fn apply_all(
        &self,
        entries: impl IntoIterator<Item = EntryOf<TypeConfig>>,
    ) -> Result<Vec<Applied>, Error> {
        let r = self.apply_entries(entries.into_iter().collect()).await;
        if let Err(e) = &r {
            self.mark_failed(&e.to_string());
        }
        r
    }

    /// Applies `entries` in steps, the state lock released and the
    /// runtime thread given back between two.
    pub(super) async fn apply_entries(
        &self,
        entries: Vec<EntryOf<TypeConfig>>,
    ) -> Result<Vec<Applied>, Error> {
        let mut run = Run::new(entries);
        loop {
            let more = self.step(&mut run)?;
            if !more {
                break;
            }
            tokio::task::yield_now().await;
        }
        Ok(run.out)
    }

    /// One step under the state lock; whether more remains.
    fn step(&self, run: &mut Run) -> Result<bool, Error> {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        let st = &mut *st;
        let before = st.applied.log_id;
        let revisions_before = (st.readable, st.mvcc.compact, st.mvcc.physical);
        let done = step(st, run)?;
        st.steps.steps += 1;
        st.steps.max_step_work = st.steps.max_step_work.max(done.work);
        st.bytes_since_snapshot += done.bytes as u64;
        if st.applied.log_id != before {
            if let Some(l) = st.applied.log_id {
                inner.applied_index.send_replace(l.index);
            }
        }
        if (st.readable, st.mvcc.compact, st.mvcc.physical) != revisions_before {
            inner.revisions.send_replace(super::reads::Revisions {
                current: st.readable,
                compact: st.mvcc.compact,
                physical: st.mvcc.physical,
            });
        }
        if st.leases.changed() {
            inner.lease_changed.notify_one();
        }
        if !st.snapshot_asked && super::snapshot::due(st) {
            st.snapshot_asked = true;
            inner.snapshot_due.notify_one();
        }
        Ok(done.more)
    }

    /// How the apply steps went so far.
    pub fn apply_stats(&self) -> super::ApplyStats {
        self.inner.state.lock().steps
    }
}
