//! Applying entries in bounded steps.
//!
//! A step holds the state lock, applies entries (or part of one) through
//! one [`Writer`] and commits one store transaction; it ends once its
//! work — client keys written or deleted, history events compacted —
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
//! before it: reads may see part of an entry being applied (a page of a
//! range, a stale read), never an applied index that claims it. A
//! snapshot built between two steps holds the partial mark, and a node
//! that installs it goes on from there.

use super::apply::{self, Progress, Writer};
use super::events::{self, COMPACT_PER_ENTRY, HISTORY_STATE};
use super::{corrupt, Error, Partial, Resume, State};
use crate::types::{layout, Applied, Command, Revision, TypeConfig};
use openraft::alias::{EntryOf, LogIdOf};
use openraft::{EntryPayload, StoredMembership};
use std::collections::VecDeque;

/// Client keys a step writes or deletes, about: it ends at the first
/// command boundary (or key of a range delete or revoke) past it. A step's
/// work is at most this plus one command's (a transaction's
/// [`crate::MAX_TXN_OPS`] changes, or an entry's history compaction).
pub const STEP_KEYS: usize = 1024;
/// Entries applied per step, at most.
const BATCH_ENTRIES: usize = 256;
/// Bytes of values per step, at most (beyond one entry).
const BATCH_BYTES: usize = 1 << 20;

/// Where a command is applied: its revision. (The entry before it is the
/// state's applied id until its entry is applied whole.)
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) rev: Revision,
}

/// The entry a step stopped in.
struct InEntry {
    log_id: LogIdOf<TypeConfig>,
    /// The position of the next command.
    sub: u32,
    /// The commands not yet applied whole (the one in progress first).
    cmds: VecDeque<Command>,
    reply: Applied,
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
        entry.reply.verdicts.push(crate::Verdict::Applied);
        entry.sub += 1;
    }
    entry
}

/// Applies `e`'s commands until they are done or the step is full.
fn apply_commands(
    w: &mut Writer<'_>,
    st: &mut State,
    e: &mut InEntry,
    bytes: &mut usize,
) -> Result<Progress, Error> {
    while let Some(cmd) = e.cmds.pop_front() {
        let at = At {
            rev: Revision {
                index: e.log_id.index,
                sub: e.sub,
            },
        };
        let resume = st
            .applied
            .partial
            .take()
            .filter(|p| p.index == at.rev.index && p.sub == at.rev.sub)
            .and_then(|p| p.resume);
        let progress = match resume {
            Some(from) => apply::resume_command(w, st, &cmd, at, from)?,
            None => apply::apply_command(w, st, &cmd, at, bytes)?,
        };
        match progress {
            Progress::Done(v) => {
                e.reply.verdicts.push(v);
                e.sub += 1;
            }
            Progress::Paused => {
                e.cmds.push_front(cmd);
                return Ok(Progress::Paused);
            }
        }
        if w.work >= STEP_KEYS && !e.cmds.is_empty() {
            // The step is full: the next one begins at the next command.
            let next = At {
                rev: Revision {
                    index: e.log_id.index,
                    sub: e.sub,
                },
            };
            commit_partial(w, st, next, None)?;
            return Ok(Progress::Paused);
        }
    }
    Ok(Progress::Done(crate::Verdict::Applied))
}

/// Ends entry `e`: it is the applied id, and the history is compacted to
/// the retention (a bounded number of events an entry).
fn finish(w: &mut Writer<'_>, st: &mut State, e: InEntry, run: &mut Run) -> Result<(), Error> {
    st.applied.log_id = Some(e.log_id);
    st.applied.partial = None;
    st.history.count += w.take_events();
    let removed = w.compact(&mut st.history, (st.retention, COMPACT_PER_ENTRY))?;
    w.work += removed as usize;
    if st.retention == 0 && st.history.count == 0 {
        // No history kept: a watch from anything applied is told so.
        let horizon = events::Position {
            revision: Revision {
                index: e.log_id.index + 1,
                sub: 0,
            },
            n: 0,
        };
        st.history.horizon = st.history.horizon.max(horizon);
    }
    run.out.push(e.reply);
    Ok(())
}

/// One step (see the module docs).
pub(super) fn step(st: &mut State, run: &mut Run) -> Result<StepDone, Error> {
    let store = st.store.clone();
    let mut w = Writer::new(&store, st.retention > 0);
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
        if let Progress::Paused = apply_commands(&mut w, st, &mut e, &mut done.bytes)? {
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
/// history's count and horizon.
fn commit_step(st: &mut State, w: &mut Writer<'_>) -> Result<(), Error> {
    w.txn().put(HISTORY_STATE, &st.history.encode());
    st.applied.partial = None;
    let state = postcard::to_stdvec(&st.applied).map_err(corrupt)?;
    w.txn().put(layout::APPLIED, &state);
    w.commit_no_wait()
}

/// Commits what is written so far as a partial apply of the entry `at`
/// is in: the store then holds the log through the applied id, and the
/// entry up to command `at.rev.sub` — from `resume` in it, if it began.
pub(super) fn commit_partial(
    w: &mut Writer<'_>,
    st: &mut State,
    at: At,
    resume: Option<Resume>,
) -> Result<(), Error> {
    st.history.count += w.take_events();
    w.txn().put(HISTORY_STATE, &st.history.encode());
    st.applied.partial = Some(Partial {
        index: at.rev.index,
        sub: at.rev.sub,
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
        let done = step(st, run)?;
        st.steps.steps += 1;
        st.steps.max_step_work = st.steps.max_step_work.max(done.work);
        st.bytes_since_snapshot += done.bytes as u64;
        if st.applied.log_id != before {
            if let Some(l) = st.applied.log_id {
                inner.applied_index.send_replace(l.index);
            }
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
