//! The HTTP API's vocabulary: the headers of its answers, the error codes
//! an answer's `x-raftkv-error` carries, and the document `GET /status`
//! answers (the server's `raftkv::api` documents every route).

use crate::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The header on a `409` to a write refused by its session: what was
/// wrong ([`SESSION_UNKNOWN`] or [`SESSION_STALE`]).
pub const ERROR_HEADER: &str = "x-raftkv-error";
/// The client has no session (it expired, or was never opened): start a
/// new one, under a new client id, with `seq=1`.
pub const SESSION_UNKNOWN: &str = "session-unknown";
/// The sequence number is below the session's last.
pub const SESSION_STALE: &str = "session-stale";

/// The `x-raftkv-error` of an admin call that passed its deadline.
pub const TIMED_OUT: &str = "timeout";

/// The header on a `200` to a write or a linearizable read: the log index
/// the answer reflects — the entry a write was applied in; for a read, its
/// read index (the state machine had applied at least this far when the
/// value was read).
pub const INDEX_HEADER: &str = "x-raftkv-index";

/// The header on a `200` to `GET /kv/{key}`: the revision the key was
/// created at (its `ETag` is the revision it was last changed at).
pub const CREATE_HEADER: &str = "x-raftkv-create-revision";

/// The header on a `200` to `GET /kv/{key}`: the key's version (changes
/// since it was created, from 1).
pub const VERSION_HEADER: &str = "x-raftkv-version";

/// The environment variable `raftkv serve` reads failpoints from at its
/// start, before Raft starts (the server's `api::arm_failpoints`).
pub const FAILPOINTS_ENV: &str = "RAFTKV_FAILPOINTS";

/// The [`ERROR_HEADER`] of a `410`: the revision asked for was compacted.
pub const COMPACTED: &str = "compacted";

/// What `GET /status` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// This node's id.
    pub id: NodeId,
    /// The id of the process serving it.
    pub pid: u32,
    /// The cluster id (16 hex digits).
    pub cluster: String,
    /// Leader, Follower, Candidate or Learner.
    pub state: String,
    /// The leader this node knows of.
    pub leader: Option<NodeId>,
    /// The current term.
    pub term: u64,
    /// The index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// The index of the last entry applied to its state machine.
    pub applied_index: Option<u64>,
    /// The last index its latest snapshot covers.
    pub snapshot_index: Option<u64>,
    /// The last index purged from its log (a member behind it is sent a
    /// snapshot).
    pub purged_index: Option<u64>,
    /// The voters, id to address.
    pub voters: BTreeMap<NodeId, String>,
    /// The learners, id to address.
    pub learners: BTreeMap<NodeId, String>,
    /// Why Raft stopped on this node, if it did (a storage error: the
    /// node answers nothing until restarted).
    pub error: Option<String>,
    /// On the leader: the last index each member's log is known to hold
    /// (a member holding none is absent). A node starting with an empty
    /// directory that its leader lists here lost its log and vote.
    #[serde(default)]
    pub matched: BTreeMap<NodeId, u64>,
    /// Whether this node's disk-space alarm is raised: writes that add
    /// data are refused (`507`; the server's `space` module).
    #[serde(default)]
    pub nospace: bool,
}

/// The header on the answer to a write: the store's revision after it
/// (the write's own revision if it changed the store); on a retry, the
/// one of its first application.
pub const REVISION_HEADER: &str = "x-raftkv-revision";
/// The [`ERROR_HEADER`] of a `412`: a comparison did not hold.
pub const COMPARE_FAILED: &str = "compare-failed";
/// The [`ERROR_HEADER`] of a `404` to a write naming a lease that does not
/// exist (never granted, expired or revoked).
pub const LEASE_NOT_FOUND: &str = "lease-not-found";
/// The [`ERROR_HEADER`] of a `409` to a put whose lease holds its most
/// keys.
pub const LEASE_FULL: &str = "lease-full";

/// A membership change (`POST /members`, JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum MemberChange {
    /// Adds node `id` at `addr` as a learner; answers once it caught up.
    Add {
        /// The new node's id.
        id: NodeId,
        /// Its address (`host:port`).
        addr: String,
    },
    /// Makes learner `id` a voter.
    Promote {
        /// The learner's id.
        id: NodeId,
    },
    /// Removes member `id` (voter or learner).
    Remove {
        /// The member's id.
        id: NodeId,
    },
}
