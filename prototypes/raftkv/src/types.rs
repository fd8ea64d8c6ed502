//! The Raft type configuration, the commands in the log, their answers,
//! and the store's key layout.

use crate::kv::{self, KvError, RequestOp, ResponseOp};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A node's id in the cluster.
pub use raftkv_wire::NodeId;

openraft::declare_raft_types!(
    /// raftkv's Raft types: [`Batch`]es of commands in the log, [`Applied`] answers,
    /// `u64` node ids, nodes known by their HTTP address, snapshots in
    /// files.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = NodeId,
        Node = openraft::BasicNode,
);

/// The Raft handle of a raftkv node.
pub type Raft = openraft::Raft<TypeConfig, crate::machine::StateMachine>;

/// A client's request id: the client's id and its sequence number. The
/// state machine applies each id once, and a client's ids in increasing
/// order, so a write retried after its leader died is not applied twice.
/// (The HTTP API's clients send them; etcd's gRPC clients send none.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestId {
    /// The client's id (any `u64` it chose; a random one is safe).
    pub client: u64,
    /// The request's sequence number among the client's, from 1.
    pub seq: u64,
}

pub use raftkv_wire::Expect;

/// The etcd comparison an [`Expect`] is: what a conditional write of the
/// HTTP API is applied as.
pub trait ToCompare {
    /// The etcd comparison of `key` that holds exactly when this does.
    fn compare(&self, key: &[u8]) -> kv::Compare;
}

impl ToCompare for Expect {
    fn compare(&self, key: &[u8]) -> kv::Compare {
        use kv::{CompareResult as R, CompareTarget as T};
        let (result, target) = match self {
            Expect::Absent => (R::Equal, T::Create(0)),
            Expect::Present => (R::Greater, T::Create(0)),
            Expect::ModRevision(r) => (R::Equal, T::Mod(*r)),
            Expect::Value(v) => (R::Equal, T::Value(v.clone())),
        };
        kv::Compare {
            result,
            target,
            key: key.to_vec(),
            range_end: Vec::new(),
        }
    }
}

/// A write in the Raft log. (The log of a raftkv of the store format
/// before this one is not read: such a member is replaced, docs/FORMAT.md.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// The log's clock when the leader proposed the entry, first in every
    /// batch it proposes, and the session time-to-live it runs with: the
    /// state machine expires client sessions by this time, decided in the
    /// log, so every replica expires the same sessions at the same index
    /// (the Raft dissertation, §6.3). No wall clock: a leader goes on from
    /// the clock its log holds when it takes over, by its own monotonic
    /// clock ([`crate::lessor::LogClock`]).
    Clock {
        /// The log's clock, ms (from 0 at the cluster's first leader).
        now_ms: u64,
        /// A session idle this long (by the log's clock) expires.
        session_ttl_ms: u64,
    },
    /// A request of etcd's KV service that changes the store: a put, a
    /// delete of a key or a range, a transaction (checked before it is
    /// proposed: [`crate::check::check_request`]). A range alone changes
    /// nothing and is answered like a read.
    Kv {
        /// The request.
        op: RequestOp,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// etcd's compaction: versions below `revision` are no longer read
    /// (at once), and the ones superseded at it are removed (in the
    /// entries that follow, a bounded number an entry). `physical` is
    /// the caller's wish to be answered once they are removed; apply does
    /// the same either way.
    Compact {
        /// The compaction's revision.
        revision: i64,
        /// Whether the caller waits for the removal.
        physical: bool,
    },
    /// Nothing but an entry for a physical compaction to go on in: the
    /// leader proposes these while one is under way on an idle cluster.
    CompactProgress,
    /// Grants a lease of `ttl_s` seconds (by the log's clock), as etcd's
    /// `LeaseGrant`: id `lease`, or if 0 one the state machine picks from
    /// the command's place in the log.
    LeaseGrant {
        /// The lease's id (0: picked at apply).
        lease: i64,
        /// Its time-to-live, seconds.
        ttl_s: i64,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// A keep-alive that must reach the log: the lease's checkpointed
    /// remaining time-to-live is cleared, so a new leader gives it its
    /// whole time-to-live. (A keep-alive of a lease without a checkpoint
    /// is the leader's alone: [`crate::lessor`].)
    LeaseKeepAlive {
        /// The lease.
        lease: i64,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// Ends a lease and deletes its keys, all at one revision: a client's
    /// revoke, or the leader's once the lease expired by its clock.
    LeaseRevoke {
        /// The lease.
        lease: i64,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// The leader's checkpoint of leases' remaining time-to-live (ms), so
    /// that a new leader gives each what was left rather than its whole
    /// time-to-live (etcd's lease checkpoints). A lease gone since is
    /// passed over.
    LeaseCheckpoint {
        /// (lease, remaining ms), at most [`MAX_CHECKPOINT_LEASES`].
        leases: Vec<(i64, u64)>,
    },
}

/// Leases one [`Command::LeaseCheckpoint`] holds, at most.
pub const MAX_CHECKPOINT_LEASES: usize = 1000;

impl Command {
    /// The client's request id the command carries, if any.
    pub fn request_id(&self) -> Option<RequestId> {
        match self {
            Command::Kv { id, .. }
            | Command::LeaseGrant { id, .. }
            | Command::LeaseKeepAlive { id, .. }
            | Command::LeaseRevoke { id, .. } => *id,
            Command::Clock { .. }
            | Command::Compact { .. }
            | Command::CompactProgress
            | Command::LeaseCheckpoint { .. } => None,
        }
    }

    /// A put of `value` at `key` (no lease, no previous version asked).
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, id: Option<RequestId>) -> Self {
        Command::Kv {
            op: RequestOp::Put(kv::PutRequest {
                key: key.into(),
                value: value.into(),
                ..kv::PutRequest::default()
            }),
            id,
        }
    }

    /// A delete of `key`.
    pub fn delete(key: impl Into<Vec<u8>>, id: Option<RequestId>) -> Self {
        Command::delete_range(key, Vec::new(), id)
    }

    /// A delete of `[key, range_end)` (etcd's range ends: [`crate::kv`]).
    pub fn delete_range(
        key: impl Into<Vec<u8>>,
        range_end: impl Into<Vec<u8>>,
        id: Option<RequestId>,
    ) -> Self {
        Command::Kv {
            op: RequestOp::DeleteRange(kv::DeleteRangeRequest {
                key: key.into(),
                range_end: range_end.into(),
                prev_kv: false,
            }),
            id,
        }
    }

    /// A transaction.
    pub fn txn(txn: kv::TxnRequest, id: Option<RequestId>) -> Self {
        Command::Kv {
            op: RequestOp::Txn(txn),
            id,
        }
    }

    /// Bytes of keys, values and range ends the command carries, about.
    pub fn size(&self) -> usize {
        match self {
            Command::Kv { op, .. } => crate::check::request_bytes(op),
            Command::LeaseCheckpoint { leases } => 16 * leases.len(),
            _ => 16,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        match self {
            Command::Clock { now_ms, .. } => write!(f, "clock {now_ms}"),
            Command::Kv { op, .. } => match op {
                RequestOp::Put(p) => write!(f, "put {} ({} bytes)", key(&p.key), p.value.len()),
                RequestOp::DeleteRange(d) => write!(f, "delete from {}", key(&d.key)),
                RequestOp::Range(r) => write!(f, "range from {}", key(&r.key)),
                RequestOp::Txn(t) => write!(
                    f,
                    "txn ({} compares, {}/{} requests)",
                    t.compare.len(),
                    t.success.len(),
                    t.failure.len()
                ),
            },
            Command::Compact { revision, .. } => write!(f, "compact at {revision}"),
            Command::CompactProgress => write!(f, "compaction progress"),
            Command::LeaseGrant { lease, ttl_s, .. } => {
                write!(f, "grant lease {lease:x} of {ttl_s} s")
            }
            Command::LeaseKeepAlive { lease, .. } => write!(f, "keep lease {lease:x} alive"),
            Command::LeaseRevoke { lease, .. } => write!(f, "revoke lease {lease:x}"),
            Command::LeaseCheckpoint { leases } => {
                write!(f, "checkpoint {} leases", leases.len())
            }
        }
    }
}

/// The commands of one log entry, applied in order. The leader gathers
/// the writes that arrive while earlier ones are being committed into one
/// entry: each entry costs a log flush on every member, so an entry per
/// write would cost a flush per write.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Batch(pub Vec<Command>);

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            all => write!(f, "{} commands", all.len()),
        }
    }
}

/// What an applied command answers, besides the store's revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// Nothing more (a clock, a compaction, a keep-alive, a revoke, a
    /// checkpoint).
    Done,
    /// etcd's answer to a [`Command::Kv`] (a transaction's tells whether
    /// its comparisons held).
    Kv(ResponseOp),
    /// A lease granted.
    LeaseGranted {
        /// Its id.
        id: i64,
        /// Its time-to-live, seconds.
        ttl_s: i64,
    },
}

/// What applying one command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Applied: the store's revision after it (etcd's header revision:
    /// the command's own if it changed the store) and its answer.
    Applied {
        /// The store's revision after the command.
        revision: i64,
        /// What it answers.
        answer: Answer,
    },
    /// Refused as etcd refuses it when it is applied, nothing changed: a
    /// lease that does not exist or already does, `ignore_value` or
    /// `ignore_lease` on an absent key, a compaction at a revision
    /// compacted or to come, a lease holding its most keys
    /// ([`KvError::LeaseFull`]).
    Refused(KvError),
    /// Its request id is the session's last one: a retry of a request
    /// decided before; nothing changed this time. What was decided then:
    Duplicate {
        /// The store's revision after it.
        revision: i64,
        /// Whether its comparisons held (always, but for a transaction).
        succeeded: bool,
        /// The lease it granted (a grant), else 0.
        lease: i64,
    },
    /// Its client has no session (never opened — a session opens with
    /// sequence number 1 — or expired): not applied. The client starts a
    /// new session under a new id.
    UnknownSession,
    /// Its sequence number is below the session's last: a late copy of a
    /// request the client has moved on from, or a client id used twice.
    /// Not applied.
    Stale,
}

impl Verdict {
    /// Whether the command was applied with its comparisons holding (a
    /// put, a delete; a transaction that took its `success` branch).
    pub fn succeeded(&self) -> bool {
        match self {
            Verdict::Applied {
                answer: Answer::Kv(ResponseOp::Txn(t)),
                ..
            } => t.succeeded,
            Verdict::Applied { .. } => true,
            Verdict::Duplicate { succeeded, .. } => *succeeded,
            _ => false,
        }
    }
}

/// What applying a batch did, command by command.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Applied {
    /// For each command of the batch, in order.
    pub verdicts: Vec<Verdict>,
}

/// The longest key a client may use, in bytes (a stored index key is
/// one byte more: kvstore's bound).
pub const MAX_KEY: usize = kvstore::MAX_KEY - 1;
/// The longest value a client may store, in bytes: kvstore's bound for a
/// stored value, less room for a version record's header and the
/// longest key (`machine/mvcc.rs`).
pub const MAX_VALUE: usize = kvstore::MAX_VALUE - 2048;

/// The store's key layout (docs/FORMAT.md): the index `k` + client key,
/// the versions `r` + revision, the sessions `c` + client id, the leases
/// `l` + id and their keys `a` + id + key, and the state machine's own
/// `m/` keys — no client key can collide with them.
pub(crate) mod layout {
    /// The key of the last applied log id and membership.
    pub const APPLIED: &[u8] = b"m/applied";
    /// The prefix of the client sessions (last sequence number and last
    /// activity, by the log's clock).
    pub const CLIENT: u8 = b'c';
    /// The key of the log's clock (the last `Clock` applied, never back).
    pub const CLOCK: &[u8] = b"m/clock";
    /// The key of the store's format (`FORMAT`, a little-endian `u32`).
    pub const FORMAT_KEY: &[u8] = b"m/format";
    /// The format this build writes and reads: 4, the multi-version store
    /// (an index of keys, versions by integer revision, etcd's
    /// compaction; `machine/mvcc.rs`), sessions with their last answer,
    /// leases with their checkpointed remaining time-to-live, the log's
    /// clock from 0, and partial marks of any command. Formats 1 to 3 are
    /// refused.
    pub const FORMAT: u32 = 4;

    /// The stored key of a client's last sequence number.
    pub fn client(id: u64) -> Vec<u8> {
        let mut k = vec![CLIENT];
        k.extend_from_slice(&id.to_be_bytes());
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_are_etcd_comparisons() {
        let kv = kv::KeyValue {
            key: b"k".to_vec(),
            create_revision: 3,
            mod_revision: 7,
            version: 2,
            value: b"v".to_vec(),
            lease: 0,
        };
        let holds = |e: Expect, kv: Option<&kv::KeyValue>| kv::compare_holds(&e.compare(b"k"), kv);
        assert!(holds(Expect::Absent, None));
        assert!(!holds(Expect::Absent, Some(&kv)));
        assert!(holds(Expect::Present, Some(&kv)));
        assert!(!holds(Expect::Present, None));
        assert!(holds(Expect::ModRevision(7), Some(&kv)));
        assert!(!holds(Expect::ModRevision(6), Some(&kv)));
        assert!(!holds(Expect::ModRevision(0), Some(&kv)));
        assert!(holds(Expect::Value(b"v".to_vec()), Some(&kv)));
        assert!(!holds(Expect::Value(b"v".to_vec()), None));
    }
}
