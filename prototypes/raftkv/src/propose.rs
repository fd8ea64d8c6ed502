//! Gathers concurrent client writes into one Raft entry.
//!
//! Every entry costs a log write and flush on every member (under
//! openraft 0.9 the leader's flush also came before replication, one
//! entry after the other; 0.10 replicates meanwhile). The
//! proposer keeps at most [`IN_FLIGHT`] entries on their way through Raft;
//! the writes that arrive meanwhile wait in its queue and go out together
//! as the next entry ([`crate::Batch`]) once one of those finishes — group
//! commit at the Raft level, as jbd2 does for a filesystem's handles. A
//! lone writer pays nothing for it: its entry leaves at once.

use crate::lessor::LogClock;
use crate::types::{Batch, Command, Raft, Verdict};
use crate::StateMachine;
use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Entries on their way through Raft at once: one being made durable on
/// the leader while the one before is replicated and applied. (Measured,
/// two rounds of `raftkv-tools compare` each: 1, 2, 3 and 6 in flight within the
/// noise at 1 and 64 clients; 2 ahead at 16, 6,274/6,358 puts/s against
/// 4,812–5,811 — docs/PERFORMANCE.md.)
pub const IN_FLIGHT: usize = 2;
/// The most commands in one entry.
pub const MAX_BATCH: usize = 1024;
/// The most value bytes in one entry (beyond its first command).
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Writes waiting for an entry, by default, before more are refused with
/// [`Outcome::Busy`]: four full entries.
pub const MAX_PENDING: usize = 4 * MAX_BATCH;

/// How a proposed command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Committed by a majority and applied at this log index, with what
    /// applying it did (its answer and the store's revision; a retry; a
    /// refusal).
    Applied {
        /// The entry's log index.
        index: u64,
        /// What applying it did.
        verdict: Verdict,
    },
    /// This node is not the leader; the leader, if one is known.
    Forward(Option<BasicNode>),
    /// Raft failed the write (it may or may not take effect).
    Failed(String),
    /// The queue of writes waiting for an entry is full: the write was not
    /// taken (retry later).
    Busy,
}

struct Pending {
    cmd: Command,
    reply: oneshot::Sender<Outcome>,
}

/// The proposer of one node (cheap to clone).
#[derive(Debug, Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
}

/// The next write of `rx` whose client still waits for it; a write whose
/// client has gone (it disconnected, or its request timed out) is dropped
/// here, before it is proposed: nobody would learn its outcome.
fn next_wanted(rx: &mut mpsc::Receiver<Pending>) -> Option<Pending> {
    loop {
        match rx.try_recv() {
            Ok(p) if p.reply.is_closed() => continue,
            Ok(p) => return Some(p),
            Err(_) => return None,
        }
    }
}

impl Proposer {
    /// Starts the proposer task of `raft` on the current runtime, with
    /// room for `max_pending` writes waiting for an entry; each entry
    /// begins with the log's clock (`clock`, or the one `machine` applied
    /// while this node does not lead) and the session time-to-live;
    /// counts what it proposes in `metrics`.
    pub fn start(
        raft: Raft,
        max_pending: usize,
        (clock, machine): (Arc<LogClock>, StateMachine),
        session_ttl: std::time::Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Proposer {
        let session_ttl_ms = u64::try_from(session_ttl.as_millis()).unwrap_or(u64::MAX);
        let (tx, mut rx) = mpsc::channel::<Pending>(max_pending.max(1));
        let permits = Arc::new(Semaphore::new(IN_FLIGHT));
        tokio::spawn(async move {
            loop {
                // Wait for room first: what arrives meanwhile joins the
                // next entry.
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else {
                    return;
                };
                if first.reply.is_closed() {
                    continue;
                }
                let mut bytes = first.cmd.size();
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                    match next_wanted(&mut rx) {
                        Some(p) => {
                            bytes += p.cmd.size();
                            batch.push(p);
                        }
                        None => break,
                    }
                }
                let raft = raft.clone();
                // The log's clock first: sessions expire by it.
                let now_ms = clock.now_ms(|| machine.log_clock());
                metrics.proposals.inc_by(batch.len() as u64);
                metrics.proposal_entries.inc();
                tokio::spawn(async move {
                    let clock = Command::Clock {
                        now_ms,
                        session_ttl_ms,
                    };
                    let (cmds, replies): (Vec<_>, Vec<_>) = std::iter::once((clock, None))
                        .chain(batch.into_iter().map(|p| (p.cmd, Some(p.reply))))
                        .unzip();
                    let r = raft.client_write(Batch(cmds)).await;
                    drop(permit);
                    // Each verdict moved to its client (an answer may
                    // carry many versions).
                    let (index, mut verdicts) = match r {
                        Ok(resp) => (resp.log_id.index, resp.data.verdicts.into_iter()),
                        Err(e) => {
                            let outcome = match e {
                                RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                                    Outcome::Forward(f.leader_node)
                                }
                                e => Outcome::Failed(e.to_string()),
                            };
                            for reply in replies.into_iter().flatten() {
                                let _ = reply.send(outcome.clone());
                            }
                            return;
                        }
                    };
                    for reply in replies {
                        let verdict = verdicts.next();
                        let Some(reply) = reply else { continue };
                        let outcome = match verdict {
                            Some(verdict) => Outcome::Applied { index, verdict },
                            None => Outcome::Failed("the state machine gave no verdict".into()),
                        };
                        // The client may have given up waiting: nothing to do.
                        let _ = reply.send(outcome);
                    }
                });
            }
        });
        Proposer { tx }
    }

    /// Proposes `cmd` and waits for its outcome; [`Outcome::Busy`] at once
    /// if the queue is full. Dropping the future before the outcome (the
    /// client went away) withdraws the write if it was not proposed yet.
    pub async fn propose(&self, cmd: Command) -> Outcome {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Pending { cmd, reply }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => return Outcome::Busy,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Outcome::Failed("the node is shutting down".into())
            }
        }
        rx.await
            .unwrap_or_else(|_| Outcome::Failed("the node is shutting down".into()))
    }
}
