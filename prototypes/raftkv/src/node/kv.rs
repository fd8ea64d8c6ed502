//! The calls etcd's services make of a node: what the gRPC API (and the
//! JSON one) turn requests into, answered with etcd's payloads and a
//! [`Header`], refused with a [`KvError`] (etcd's code and message).
//!
//! | call | etcd's |
//! |---|---|
//! | [`Node::range`] | `KV.Range`: linearizable (read index) unless `serializable`, at `revision` (0: the newest) |
//! | [`Node::write`] | `KV.Put`, `KV.DeleteRange`, `KV.Txn`: through the log; a transaction of ranges only (in every branch) is a read, as etcd serves it |
//! | [`Node::compact`] | `KV.Compact`; with `physical`, answered once the versions it supersedes are removed |
//! | [`Node::events`], [`Node::revisions`] | `Watch`: the changes of a key range from a position on, and the store's revisions to wait on (no polling) |
//! | [`Node::compact_log`] | `Maintenance.Defragment` (and the HTTP API's `POST /compact`): a snapshot now, the Raft log purged to it |
//! | [`Node::hash_kv`] | `Maintenance.HashKV` ([`crate::StateMachine::hash_kv`]) |
//! | [`Node::lease_grant`], [`Node::lease_revoke`], [`Node::lease_keep_alive`], [`Node::lease_time_to_live`], [`Node::lease_leases`] | `Lease` |
//!
//! What needs the leader — writes, linearizable reads, keep-alives,
//! time-to-live — is answered [`KvError::NotLeader`] on another node
//! (forwarding is the caller's: [`crate::grpc`]), or
//! [`KvError::NoLeader`] when none is known. A write whose outcome is not
//! known in time is [`KvError::Timeout`]: it may still take effect. The
//! header's cluster and member ids are the node's ([`Node::cluster`],
//! [`Node::id`]).

use super::Node;
use crate::check;
use crate::kv::{self, KvError, RequestOp, ResponseOp};
use crate::machine::{EventPage, Position, ReadError, Revisions};
use crate::propose::Outcome;
use crate::types::{Answer, Command, Verdict};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{LinearizableReadError, RaftError};

/// etcd's response header, but for the ids (the node's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// The store's revision when the answer was made (a write's own if it
    /// changed the store).
    pub revision: i64,
    /// The Raft term this node is in.
    pub raft_term: u64,
}

/// What `LeaseTimeToLive` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTimeToLive {
    /// The lease.
    pub id: i64,
    /// Seconds left, by the leader's clock.
    pub ttl: i64,
    /// The time-to-live it was granted with, seconds.
    pub granted_ttl: i64,
    /// Its keys, if asked for, in key order.
    pub keys: Vec<Vec<u8>>,
}

fn read_error(e: ReadError) -> KvError {
    match e {
        ReadError::Kv(e) => e,
        // (The store failed: the node stops; the client may retry
        // elsewhere.)
        ReadError::Store(_) => KvError::Timeout,
    }
}

/// Runs a blocking read of the state machine off the runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ReadError> + Send + 'static,
) -> Result<T, KvError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(read_error),
        Err(_) => Err(KvError::Timeout),
    }
}

impl Node {
    /// The header of an answer at `revision`.
    fn header(&self, revision: i64) -> Header {
        Header {
            revision,
            raft_term: self.raft.metrics().borrow_watched().current_term,
        }
    }

    /// The read barrier of a linearizable read: leadership confirmed by a
    /// majority after the call, and the state machine caught up with the
    /// read index (`crate::api`'s `linearize`).
    pub async fn read_barrier(&self) -> Result<(), KvError> {
        let read = tokio::time::timeout(
            crate::api::REQUEST_TIMEOUT,
            self.raft
                .ensure_linearizable(openraft::ReadPolicy::ReadIndex),
        )
        .await;
        match read {
            Err(_) => Err(KvError::Timeout),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f)))) => {
                Err(match f.leader_id {
                    Some(_) => KvError::NotLeader,
                    None => KvError::NoLeader,
                })
            }
            Ok(Err(_)) => Err(KvError::NoLeader),
        }
    }

    /// Proposes `cmd`; what applying it did, or etcd's error. With no
    /// leader (this one stepped down, an election under way) it waits for
    /// one, as etcd's proposals do, and proposes again if it is this
    /// member; bounded by [`crate::api::REQUEST_TIMEOUT`] in all.
    async fn propose_kv(&self, cmd: Command) -> Result<(i64, Answer), KvError> {
        let deadline = tokio::time::Instant::now() + crate::api::REQUEST_TIMEOUT;
        let proposed = tokio::time::timeout_at(deadline, self.proposer.propose(cmd.clone())).await;
        let out = match proposed {
            Ok(Outcome::Forward(None)) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let led = self
                    .raft
                    .wait(Some(left))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await;
                match led {
                    Ok(m) if m.current_leader == Some(self.id) => {
                        tokio::time::timeout_at(deadline, self.proposer.propose(cmd)).await
                    }
                    Ok(_) => return Err(KvError::NotLeader),
                    Err(_) => return Err(KvError::NoLeader),
                }
            }
            other => other,
        };
        match out {
            Err(_) | Ok(Outcome::Failed(_)) => Err(KvError::Timeout),
            // Turned away before it was proposed: certainly not applied.
            Ok(Outcome::Busy) => Err(KvError::TooManyRequests),
            Ok(Outcome::Forward(Some(_))) => Err(KvError::NotLeader),
            Ok(Outcome::Forward(None)) => Err(KvError::NoLeader),
            Ok(Outcome::Applied { verdict, .. }) => match verdict {
                Verdict::Applied { revision, answer } => Ok((revision, answer)),
                Verdict::Refused(e) => Err(e),
                // (No request id: no session answers.)
                Verdict::Duplicate { .. } | Verdict::UnknownSession | Verdict::Stale => {
                    Err(KvError::Timeout)
                }
            },
        }
    }

    /// etcd's `Range`.
    pub async fn range(
        &self,
        req: kv::RangeRequest,
    ) -> Result<(kv::RangeResponse, Header), KvError> {
        check::check_key(&req.key)?;
        if !req.serializable {
            self.read_barrier().await?;
        }
        let machine = self.machine.clone();
        let (resp, revision) = blocking(move || machine.range(&req)).await?;
        Ok((resp, self.header(revision)))
    }

    /// etcd's `Put`, `DeleteRange` or `Txn` (a `Range` too): checked as
    /// etcd checks it, then through the log — or, if it changes nothing
    /// in any branch, served as a read (linearizable unless every range
    /// in it is `serializable`).
    pub async fn write(&self, op: RequestOp) -> Result<(ResponseOp, Header), KvError> {
        check::check_request(&op)?;
        if check::is_read_only(&op) {
            if !serializable(&op) {
                self.read_barrier().await?;
            }
            let machine = self.machine.clone();
            let (resp, revision) = blocking(move || machine.read_only(&op)).await?;
            return Ok((resp, self.header(revision)));
        }
        if check::adds_data(&op) && self.space.full() {
            return Err(KvError::NoSpace);
        }
        match self.propose_kv(Command::Kv { op, id: None }).await? {
            (revision, Answer::Kv(resp)) => Ok((resp, self.header(revision))),
            _ => Err(KvError::Timeout),
        }
    }

    /// etcd's `Compact` at `revision`: reads below it are refused once it
    /// is applied; with `physical`, answered once the versions it
    /// supersedes are removed on this node (within the admin deadline).
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<Header, KvError> {
        let mut revisions = self.machine.revision_watch();
        let (rev, _) = self
            .propose_kv(Command::Compact { revision, physical })
            .await?;
        if physical {
            let done = revisions.wait_for(|r| r.physical >= revision);
            match tokio::time::timeout(self.admin_timeout, done).await {
                Ok(Ok(_)) => {}
                _ => return Err(KvError::Timeout),
            }
        }
        Ok(self.header(rev))
    }

    /// The changes of keys in `[key, range_end)` from `from` on, as applied
    /// here: at most `max` events, looking at most at `scan` versions
    /// ([`crate::StateMachine::events`]). Blocking (it reads the store).
    pub fn events(
        &self,
        from: Position,
        (key, range_end): (&[u8], &[u8]),
        prev_kv: bool,
        (max, scan): (usize, usize),
    ) -> Result<EventPage, KvError> {
        self.machine
            .events(from, (key, range_end), prev_kv, (max, scan))
            .map_err(read_error)
    }

    /// The store's revisions as applied here, watched: a watcher that read
    /// everything up to `current` waits for it to change.
    pub fn revisions(&self) -> tokio::sync::watch::Receiver<Revisions> {
        self.machine.revision_watch()
    }

    /// etcd's `HashKV` at `revision` (0: the current one): the hash, the
    /// compaction's revision, and the header (whose revision is the one
    /// hashed).
    pub async fn hash_kv(&self, revision: i64) -> Result<(u32, i64, Header), KvError> {
        let machine = self.machine.clone();
        let (hash, compact, at) = blocking(move || machine.hash_kv(revision)).await?;
        Ok((hash, compact, self.header(at)))
    }

    /// etcd's `LeaseGrant`: lease `id` (0: one picked at apply) of `ttl`
    /// seconds (raised to the shortest that outlives an election, as
    /// etcd's; at most [`crate::api::MAX_LEASE_TTL_S`], else
    /// `RequestTooLarge`). Answers the id and the time-to-live granted.
    pub async fn lease_grant(&self, id: i64, ttl: i64) -> Result<(i64, i64, Header), KvError> {
        if id < 0 {
            return Err(KvError::LeaseNotFound);
        }
        if ttl > crate::api::MAX_LEASE_TTL_S as i64 {
            return Err(KvError::RequestTooLarge);
        }
        if self.space.full() {
            return Err(KvError::NoSpace);
        }
        let election = self.raft.config().election_timeout_min;
        let min_ttl = (election * 3 / 2).div_ceil(1000).max(1) as i64;
        let cmd = Command::LeaseGrant {
            lease: id,
            ttl_s: ttl.max(min_ttl),
            id: None,
        };
        match self.propose_kv(cmd).await? {
            (rev, Answer::LeaseGranted { id, ttl_s }) => Ok((id, ttl_s, self.header(rev))),
            _ => Err(KvError::Timeout),
        }
    }

    /// etcd's `LeaseRevoke`: the lease ended, its keys deleted at one
    /// revision.
    pub async fn lease_revoke(&self, id: i64) -> Result<Header, KvError> {
        let (rev, _) = self
            .propose_kv(Command::LeaseRevoke {
                lease: id,
                id: None,
            })
            .await?;
        Ok(self.header(rev))
    }

    /// One keep-alive of etcd's `LeaseKeepAlive` stream: the lease renewed
    /// for its time-to-live from the call (by the leader, once a
    /// heartbeat round confirmed it leads: not a log entry, unless the
    /// lease's remaining time-to-live was checkpointed; [`crate::lessor`]).
    /// Answers the time-to-live, seconds.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<(i64, Header), KvError> {
        let arrived = tokio::time::Instant::now();
        self.read_barrier().await?;
        let _turn = self.lessor.turn().await;
        let held = self.machine.lease(id).ok_or(KvError::LeaseNotFound)?;
        self.lessor.renew(id, held.ttl_ms, arrived);
        if held.remaining_ms.is_some() {
            self.propose_kv(Command::LeaseKeepAlive {
                lease: id,
                id: None,
            })
            .await?;
        }
        let ttl = (held.ttl_ms / 1000) as i64;
        Ok((ttl, self.header(self.machine.revisions().current)))
    }

    /// etcd's `LeaseTimeToLive`: what is left of lease `id` by the
    /// leader's clock (on the leader only), and its keys if asked for.
    pub async fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<(LeaseTimeToLive, Header), KvError> {
        self.read_barrier().await?;
        let held = self.machine.lease(id).ok_or(KvError::LeaseNotFound)?;
        let left = match self.lessor.deadline(id) {
            Some(at) => at.saturating_duration_since(tokio::time::Instant::now()),
            // (Granted so recently that the lessor has not taken it in.)
            None if self.lessor.is_primary() => std::time::Duration::from_millis(held.ttl_ms),
            None => return Err(KvError::NotLeader),
        };
        let keys = if keys {
            let machine = self.machine.clone();
            blocking(move || machine.lease_keys(id).map_err(ReadError::Store)).await?
        } else {
            Vec::new()
        };
        let ttl = LeaseTimeToLive {
            id,
            ttl: left.as_secs() as i64,
            granted_ttl: (held.ttl_ms / 1000) as i64,
            keys,
        };
        Ok((ttl, self.header(self.machine.revisions().current)))
    }

    /// etcd's `LeaseLeases`: every lease held, as applied here.
    pub fn lease_leases(&self) -> (Vec<i64>, Header) {
        let ids = self.machine.lease_ids();
        (ids, self.header(self.machine.revisions().current))
    }
}

/// Whether every range in `op` is `serializable` (etcd's
/// `isTxnSerializable`): then no read index is needed.
fn serializable(op: &RequestOp) -> bool {
    match op {
        RequestOp::Range(r) => r.serializable,
        RequestOp::Put(_) | RequestOp::DeleteRange(_) => false,
        RequestOp::Txn(t) => t.success.iter().chain(&t.failure).all(serializable),
    }
}

/// Why [`Node::compact_log`] did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompactLogError {
    /// The state machine has applied nothing yet: nothing to snapshot.
    NothingApplied,
    /// openraft refused the snapshot or the purge (it stopped).
    Failed(String),
    /// Not done within the node's admin deadline (it may still be).
    TimedOut(std::time::Duration),
}

impl Node {
    /// Builds a snapshot of what this node applied (the store synced
    /// first) and purges its Raft log up to it, within the admin deadline
    /// (`serve --admin-timeout-s`): a member behind it is then sent the
    /// snapshot. Answers the index purged to.
    pub async fn compact_log(&self) -> Result<u64, CompactLogError> {
        let applied = self
            .raft
            .metrics()
            .borrow_watched()
            .last_applied
            .map(|l| l.index);
        let Some(upto) = applied else {
            return Err(CompactLogError::NothingApplied);
        };
        let wait = || self.raft.wait(Some(self.admin_timeout));
        let failed = |e: &dyn std::fmt::Display| CompactLogError::Failed(e.to_string());
        let run = async {
            self.raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| failed(&e))?;
            wait()
                .metrics(|m| m.snapshot.is_some_and(|s| s.index >= upto), "snapshot")
                .await
                .map_err(|e| failed(&e))?;
            self.raft
                .trigger()
                .purge_log(upto)
                .await
                .map_err(|e| failed(&e))?;
            wait()
                .metrics(|m| m.purged.is_some_and(|p| p.index >= upto), "purge")
                .await
                .map_err(|e| failed(&e))?;
            Ok(upto)
        };
        match tokio::time::timeout(self.admin_timeout, run).await {
            Ok(r) => r,
            Err(_) => Err(CompactLogError::TimedOut(self.admin_timeout)),
        }
    }
}
