//! Applying commands, each through a [`Writer`] that sees the step's own
//! uncommitted changes.
//!
//! Apply is a pure function of the log: what it writes depends on the
//! commands and the store alone — no clock (time comes in the log's
//! `Clock` commands), no randomness, no iteration over a hash container
//! (whose order differs per process), and nothing on how entries are
//! grouped into steps or store transactions. A command whose work has no
//! small bound (a range delete, a revoke) walks its keys in key order and
//! can stop after any key: the step then commits where it stopped
//! (`m/applied`'s partial mark) and the next step — or, after a crash, the
//! replay — goes on from there (`step.rs`).

use super::step::{commit_partial, At};
use super::txn::{self, Cmd, Ran};
use super::writer::Writer;
use super::{corrupt, Error, Resume, State};
use crate::kv::{KvError, ResponseOp};
use crate::types::{Answer, Command, RequestId, Verdict};

/// How far a command got in a step.
pub(super) enum Progress {
    /// Done, with its verdict.
    Done(Verdict),
    /// Stopped part way, the store committed up to where (the step's work
    /// reached the bound), with its answer so far: the next step goes on
    /// from there.
    Paused(Option<ResponseOp>),
}

/// Applies one command from its start, unless its request id says
/// otherwise ([`super::sessions::Sessions::admit`]). `bytes` counts the
/// value bytes written.
pub(super) fn apply_command(
    w: &mut Writer<'_>,
    st: &mut State,
    cmd: &Command,
    at: At,
    bytes: &mut usize,
) -> Result<Progress, Error> {
    if let Command::Clock {
        now_ms,
        session_ttl_ms,
    } = cmd
    {
        st.sessions.tick(*now_ms, *session_ttl_ms, w.txn());
        return Ok(done(st, Answer::Done));
    }
    let id = cmd.request_id();
    if let Some(id) = id {
        if let Err(v) = st.sessions.admit(id, w.txn()) {
            return Ok(Progress::Done(v));
        }
    }
    let mut c = Cmd::begin(st);
    let answer = match cmd {
        Command::Kv { op, .. } => {
            if let Some(e) = txn::precheck(w, st, &c, op)? {
                // Refused whole, nothing applied: not recorded either (a
                // retry is decided again).
                return Ok(Progress::Done(Verdict::Refused(e)));
            }
            match txn::run_op(w, st, &mut c, op, None, None, bytes)? {
                Ran::Done(r) => Answer::Kv(r),
                Ran::Paused { path, key, partial } => {
                    return pause(w, st, (at, c), (path, key), Some(partial))
                }
            }
        }
        Command::LeaseRevoke { lease, .. } => {
            if !st.leases.holds(*lease) {
                return Ok(Progress::Done(Verdict::Refused(KvError::LeaseNotFound)));
            }
            match txn::run_revoke(w, st, &mut c, *lease, None)? {
                Ran::Done(()) => Answer::Done,
                Ran::Paused { path, key, .. } => return pause(w, st, (at, c), (path, key), None),
            }
        }
        Command::Compact { revision, .. } => {
            if *revision <= st.mvcc.compact {
                return Ok(Progress::Done(Verdict::Refused(KvError::Compacted {
                    compact_revision: st.mvcc.compact,
                })));
            }
            if *revision > st.mvcc.rev {
                return Ok(Progress::Done(Verdict::Refused(KvError::FutureRevision)));
            }
            st.mvcc.compact = *revision;
            Answer::Done
        }
        Command::LeaseGrant { lease, ttl_s, .. } => {
            let lease = match *lease {
                0 => st.leases.pick_id(at.index, at.pos),
                l if l < 0 => return Ok(Progress::Done(Verdict::Refused(KvError::LeaseNotFound))),
                l if st.leases.holds(l) => {
                    return Ok(Progress::Done(Verdict::Refused(KvError::LeaseExists)))
                }
                l => l,
            };
            let ttl_s = (*ttl_s).max(1);
            let ttl_ms = u64::try_from(ttl_s)
                .unwrap_or(u64::MAX)
                .saturating_mul(1000);
            st.leases.grant(lease, ttl_ms, w.txn());
            Answer::LeaseGranted { id: lease, ttl_s }
        }
        Command::LeaseKeepAlive { lease, .. } => {
            if !st.leases.keep_alive(*lease, w.txn()) {
                return Ok(Progress::Done(Verdict::Refused(KvError::LeaseNotFound)));
            }
            Answer::Done
        }
        Command::LeaseCheckpoint { leases } => {
            for &(lease, remaining_ms) in leases {
                // (A lease revoked since the leader read it: nothing.)
                st.leases.checkpoint(lease, remaining_ms, w.txn());
            }
            Answer::Done
        }
        Command::CompactProgress | Command::Clock { .. } => Answer::Done,
    };
    Ok(finished(w, st, id, answer))
}

/// The verdict of a command done with `answer`, the store at its
/// revision: readers see it from now on.
fn done(st: &mut State, answer: Answer) -> Progress {
    st.readable = st.mvcc.rev;
    Progress::Done(Verdict::Applied {
        revision: st.mvcc.rev,
        answer,
    })
}

/// A command done: its answer recorded in its client's session, if any.
fn finished(w: &mut Writer<'_>, st: &mut State, id: Option<RequestId>, answer: Answer) -> Progress {
    record(st, w, id, &answer);
    done(st, answer)
}

fn record(st: &mut State, w: &mut Writer<'_>, id: Option<RequestId>, answer: &Answer) {
    let Some(id) = id else { return };
    let (succeeded, lease) = match answer {
        Answer::Kv(ResponseOp::Txn(t)) => (t.succeeded, 0),
        Answer::LeaseGranted { id, .. } => (true, *id),
        _ => (true, 0),
    };
    st.sessions
        .record(id, st.mvcc.rev, (succeeded, lease), w.txn());
}

/// Commits a command stopped at `key` (on `path`) as the entry's partial
/// mark.
fn pause(
    w: &mut Writer<'_>,
    st: &mut State,
    (at, c): (At, Cmd),
    (path, key): (Vec<u32>, Vec<u8>),
    partial: Option<ResponseOp>,
) -> Result<Progress, Error> {
    let resume = Resume {
        path,
        key,
        n: c.sub,
    };
    commit_partial(w, st, at, Some(resume))?;
    Ok(Progress::Paused(partial))
}

/// Goes on with a command a step (or a crash) stopped part way: a range
/// delete (alone or in a transaction) or a revoke, from `from`, with its
/// answer so far if this process holds it.
pub(super) fn resume_command(
    w: &mut Writer<'_>,
    st: &mut State,
    cmd: &Command,
    at: At,
    (from, acc): (Resume, Option<ResponseOp>),
    bytes: &mut usize,
) -> Result<Progress, Error> {
    let mut c = Cmd::resume(st, from.n);
    let answer = match cmd {
        Command::Kv { op, .. } => {
            match txn::run_op(w, st, &mut c, op, Some((&from.path, from.key)), acc, bytes)? {
                Ran::Done(r) => Answer::Kv(r),
                Ran::Paused { path, key, partial } => {
                    return pause(w, st, (at, c), (path, key), Some(partial))
                }
            }
        }
        Command::LeaseRevoke { lease, .. } => {
            match txn::run_revoke(w, st, &mut c, *lease, Some(from.key))? {
                Ran::Done(()) => Answer::Done,
                Ran::Paused { path, key, .. } => return pause(w, st, (at, c), (path, key), None),
            }
        }
        _ => {
            return Err(corrupt(
                "m/applied: a partial entry that is not a range delete or a revoke",
            ))
        }
    };
    Ok(finished(w, st, cmd.request_id(), answer))
}
