//! etcd's key-value model, as raftkv serves it: the requests and answers
//! of etcd v3's `KV` service (and the lease, watch and compaction calls
//! beside it) as plain Rust values — the one code path under the gRPC
//! API (`etcdserverpb`, for etcdctl and etcd's client libraries) and the
//! JSON one, and what the Raft log carries (serde).
//!
//! The meanings are etcd's (its API reference, v3.4):
//! - A **revision** is one store-wide integer: every request that changes
//!   the store (a put, a delete that deletes something, a transaction
//!   with a change, a revoke that deletes keys) takes the next one, its
//!   changes numbered within it by a sub-revision from 0. A read-only
//!   request, a failed comparison with no failure branch, or a delete of
//!   nothing takes none. A new store is at revision 1, so its first change
//!   takes revision 2 (as a new etcd cluster's).
//! - Each key has `create_revision` (the revision of the put that created
//!   it since it last did not exist), `mod_revision` (of its last change)
//!   and `version` (changes since it was created, from 1; a delete resets
//!   it: the key is absent until a put creates it again, `version` 1).
//! - A key range is `[key, range_end)`: `range_end` empty is the single
//!   key; `range_end` = `[0]` (one zero byte) is every key from `key` on;
//!   `key` = `[0]` with `range_end` = `[0]` is every key. [`prefix_end`]
//!   gives the `range_end` of a prefix.
//! - Old versions stay readable (a [`RangeRequest::revision`], a watch
//!   from a revision) until compacted: a request for a revision below the
//!   compaction is [`KvError::Compacted`], one above the store's is
//!   [`KvError::FutureRevision`].

use serde::{Deserialize, Serialize};

/// A key's version as stored (etcd's `mvccpb.KeyValue`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The revision of the put that created the key (since it last did
    /// not exist).
    pub create_revision: i64,
    /// The revision of the key's last change.
    pub mod_revision: i64,
    /// Changes to the key since it was created, from 1.
    pub version: i64,
    /// The value (empty with [`RangeRequest::keys_only`]).
    pub value: Vec<u8>,
    /// The lease the key is attached to; 0: none.
    pub lease: i64,
}

/// How a range's keys are ordered (etcd's `RangeRequest.SortOrder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SortOrder {
    /// As stored: by key, ascending.
    #[default]
    None,
    /// Ascending by the sort target.
    Ascend,
    /// Descending by the sort target.
    Descend,
}

/// What a range is sorted by (etcd's `RangeRequest.SortTarget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SortTarget {
    /// The key.
    #[default]
    Key,
    /// The version.
    Version,
    /// The create revision.
    Create,
    /// The mod revision.
    Mod,
    /// The value.
    Value,
}

/// A read of a key or a range (etcd's `RangeRequest`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RangeRequest {
    /// The key, or the range's first key.
    pub key: Vec<u8>,
    /// The range's end (see the module docs).
    pub range_end: Vec<u8>,
    /// The most keys returned; 0: no limit.
    pub limit: i64,
    /// The revision read at; 0 (or less): the newest.
    pub revision: i64,
    /// The order of the keys returned.
    pub sort_order: SortOrder,
    /// What they are sorted by.
    pub sort_target: SortTarget,
    /// Served from this member's copy, without a read index (may be
    /// stale).
    pub serializable: bool,
    /// Keys without their values.
    pub keys_only: bool,
    /// The count only, no keys.
    pub count_only: bool,
    /// Keys whose mod revision is below this are left out (0: no bound).
    pub min_mod_revision: i64,
    /// Keys whose mod revision is above this are left out (0: no bound).
    pub max_mod_revision: i64,
    /// Keys whose create revision is below this are left out (0: no
    /// bound).
    pub min_create_revision: i64,
    /// Keys whose create revision is above this are left out (0: no
    /// bound).
    pub max_create_revision: i64,
}

/// The answer to a [`RangeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RangeResponse {
    /// The keys (none with `count_only`), in the order asked, at most
    /// `limit`.
    pub kvs: Vec<KeyValue>,
    /// Whether more keys matched than `limit` let through.
    pub more: bool,
    /// How many keys the range holds at the revision read, before
    /// `limit` and before the filters on revisions (as etcd 3.4 counts).
    pub count: i64,
}

/// A put (etcd's `PutRequest`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PutRequest {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The lease to attach the key to; 0: none (detaching it from one).
    pub lease: i64,
    /// Answer with the key's version before the put.
    pub prev_kv: bool,
    /// Keep the key's value (`value` must be empty; the key must exist).
    pub ignore_value: bool,
    /// Keep the key's lease (`lease` must be 0; the key must exist).
    pub ignore_lease: bool,
}

/// The answer to a [`PutRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PutResponse {
    /// The key's version before, if asked for and the key existed.
    pub prev_kv: Option<KeyValue>,
}

/// A delete of a key or a range (etcd's `DeleteRangeRequest`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeleteRangeRequest {
    /// The key, or the range's first key.
    pub key: Vec<u8>,
    /// The range's end (see the module docs).
    pub range_end: Vec<u8>,
    /// Answer with the deleted keys' last versions.
    pub prev_kv: bool,
}

/// The answer to a [`DeleteRangeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeleteRangeResponse {
    /// How many keys were deleted.
    pub deleted: i64,
    /// Their last versions, if asked for.
    pub prev_kvs: Vec<KeyValue>,
}

/// How a [`Compare`] compares (etcd's `Compare.CompareResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    /// Equal.
    Equal,
    /// The key's is greater.
    Greater,
    /// The key's is less.
    Less,
    /// Not equal.
    NotEqual,
}

/// What a [`Compare`] compares, and with what (etcd's
/// `Compare.CompareTarget` and its `target_union`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    /// The key's version (0 if absent).
    Version(i64),
    /// The key's create revision (0 if absent).
    Create(i64),
    /// The key's mod revision (0 if absent).
    Mod(i64),
    /// The key's value (an absent key compares false, whatever the
    /// result asked).
    Value(Vec<u8>),
    /// The key's lease (0 if none or absent).
    Lease(i64),
}

/// One comparison of a transaction (etcd's `Compare`): it holds if it
/// holds for every key of `[key, range_end)` (one key if `range_end` is
/// empty); a range that holds no key is judged as one absent key
/// ([`compare_holds`] with `None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    /// How.
    pub result: CompareResult,
    /// What, with what.
    pub target: CompareTarget,
    /// The key, or the range's first key.
    pub key: Vec<u8>,
    /// The range's end (see the module docs).
    pub range_end: Vec<u8>,
}

/// One request of a transaction's branch (etcd's `RequestOp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestOp {
    /// A read, seeing the branch's earlier changes.
    Range(RangeRequest),
    /// A put.
    Put(PutRequest),
    /// A delete.
    DeleteRange(DeleteRangeRequest),
    /// A nested transaction.
    Txn(TxnRequest),
}

/// The answer to one [`RequestOp`] (etcd's `ResponseOp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseOp {
    /// To a range.
    Range(RangeResponse),
    /// To a put.
    Put(PutResponse),
    /// To a delete.
    DeleteRange(DeleteRangeResponse),
    /// To a nested transaction.
    Txn(TxnResponse),
}

/// A transaction (etcd's `TxnRequest`): if every comparison holds, the
/// `success` requests run, else the `failure` ones, in order, atomically,
/// all at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TxnRequest {
    /// The comparisons.
    pub compare: Vec<Compare>,
    /// The requests if they all hold.
    pub success: Vec<RequestOp>,
    /// The requests if one does not.
    pub failure: Vec<RequestOp>,
}

/// The answer to a [`TxnRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TxnResponse {
    /// Whether every comparison held.
    pub succeeded: bool,
    /// The answers of the branch that ran, in order.
    pub responses: Vec<ResponseOp>,
}

/// Why etcd's API refuses a request: each with etcd's gRPC code and
/// message, which clients match on ([`KvError::code`],
/// [`KvError::message`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvError {
    /// A key is empty.
    EmptyKey,
    /// A revision below the compaction was asked for.
    Compacted {
        /// The compaction's revision.
        compact_revision: i64,
    },
    /// A revision above the store's was asked for.
    FutureRevision,
    /// A lease that does not exist (never granted, expired or revoked).
    LeaseNotFound,
    /// A lease id a grant asked for exists already.
    LeaseExists,
    /// A transaction with more than [`MAX_TXN_OPS`] operations in a
    /// branch, or comparisons.
    TooManyOps,
    /// A transaction that puts a key twice, or puts and deletes one.
    DuplicateKey,
    /// A request larger than [`MAX_REQUEST_BYTES`].
    RequestTooLarge,
    /// `ignore_value` with a value.
    ValueProvided,
    /// `ignore_lease` with a lease.
    LeaseProvided,
    /// `ignore_value` or `ignore_lease` on a key that does not exist.
    KeyNotFound,
    /// This member is not the leader and cannot serve it (a leader change
    /// under way): retry, here or elsewhere.
    NotLeader,
    /// The cluster has no leader now: retry.
    NoLeader,
    /// The request did not complete in time: it may still take effect.
    Timeout,
    /// The disk-space alarm is raised: writes that add data are refused.
    NoSpace,
    /// A put would attach a key to a lease that holds raftkv's most keys
    /// ([`crate::machine::MAX_LEASE_KEYS`]; etcd has no such bound): not
    /// applied. (Added with the multi-version store.)
    LeaseFull,
    /// The leader's queue of writes for the next entry is full (etcd's
    /// `ErrTooManyRequests`): not proposed, so not applied — retry later.
    TooManyRequests,
}

impl KvError {
    /// etcd's gRPC status code for it (`google.rpc.Code`, as tonic's
    /// `Code` numbers it).
    pub fn code(&self) -> i32 {
        match self {
            // InvalidArgument
            KvError::EmptyKey
            | KvError::TooManyOps
            | KvError::DuplicateKey
            | KvError::RequestTooLarge
            | KvError::ValueProvided
            | KvError::LeaseProvided
            | KvError::KeyNotFound => 3,
            // OutOfRange
            KvError::Compacted { .. } | KvError::FutureRevision => 11,
            // NotFound
            KvError::LeaseNotFound => 5,
            // FailedPrecondition
            KvError::LeaseExists => 9,
            // Unavailable
            KvError::NotLeader | KvError::NoLeader | KvError::Timeout => 14,
            // ResourceExhausted
            KvError::NoSpace | KvError::LeaseFull | KvError::TooManyRequests => 8,
        }
    }

    /// etcd's message for it (clients match on these words).
    pub fn message(&self) -> &'static str {
        match self {
            KvError::EmptyKey => "etcdserver: key is not provided",
            KvError::Compacted { .. } => "etcdserver: mvcc: required revision has been compacted",
            KvError::FutureRevision => "etcdserver: mvcc: required revision is a future revision",
            KvError::LeaseNotFound => "etcdserver: requested lease not found",
            KvError::LeaseExists => "etcdserver: lease already exists",
            KvError::TooManyOps => "etcdserver: too many operations in txn request",
            KvError::DuplicateKey => "etcdserver: duplicate key given in txn request",
            KvError::RequestTooLarge => "etcdserver: request is too large",
            KvError::ValueProvided => "etcdserver: value is provided",
            KvError::LeaseProvided => "etcdserver: lease is provided",
            KvError::KeyNotFound => "etcdserver: key not found",
            KvError::NotLeader => "etcdserver: not leader",
            KvError::NoLeader => "etcdserver: no leader",
            KvError::Timeout => "etcdserver: request timed out",
            KvError::NoSpace => "etcdserver: mvcc: database space exceeded",
            KvError::LeaseFull => "etcdserver: too many keys attached to the lease",
            KvError::TooManyRequests => "etcdserver: too many requests",
        }
    }
}

impl std::fmt::Display for KvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for KvError {}

/// What a watch [`Event`] is (etcd's `mvccpb.Event.EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// The key was put.
    Put,
    /// The key was deleted.
    Delete,
}

/// One change of the store, as a watch sends it (etcd's `mvccpb.Event`).
/// A put's `kv` is the key's new version; a delete's holds the key and
/// the deletion's revision as its `mod_revision`, every other field 0 or
/// empty, as etcd's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Put or delete.
    pub kind: EventType,
    /// The key's version the change made (a delete's: see above).
    pub kv: KeyValue,
    /// The key's version before the change, if asked for and still held
    /// (not compacted).
    pub prev_kv: Option<KeyValue>,
}

pub use raftkv_wire::limits::{MAX_REQUEST_BYTES, MAX_TXN_OPS};

pub use raftkv_wire::prefix_end;

/// Whether `k` lies in `[key, range_end)`, with etcd's meanings of an
/// empty `range_end` (the key alone) and of `[0]` (every key from `key`
/// on).
pub fn in_range(k: &[u8], key: &[u8], range_end: &[u8]) -> bool {
    match range_end {
        [] => k == key,
        [0] => k >= key,
        end => k >= key && k < end,
    }
}

/// Whether one key's state satisfies `c` (`kv`: `None` if absent). A
/// value comparison with an absent key is false, whatever the result
/// asked; the other targets read 0 for an absent key.
pub fn compare_holds(c: &Compare, kv: Option<&KeyValue>) -> bool {
    use std::cmp::Ordering;
    let ord = match (&c.target, kv) {
        (CompareTarget::Value(_), None) => return false,
        (CompareTarget::Value(v), Some(kv)) => kv.value.as_slice().cmp(v.as_slice()),
        (CompareTarget::Version(v), kv) => kv.map_or(0, |kv| kv.version).cmp(v),
        (CompareTarget::Create(v), kv) => kv.map_or(0, |kv| kv.create_revision).cmp(v),
        (CompareTarget::Mod(v), kv) => kv.map_or(0, |kv| kv.mod_revision).cmp(v),
        (CompareTarget::Lease(v), kv) => kv.map_or(0, |kv| kv.lease).cmp(v),
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
        CompareResult::NotEqual => ord != Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_and_ranges_mean_what_etcd_means() {
        assert_eq!(prefix_end(b"abc"), b"abd");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
        assert!(in_range(b"k", b"k", b""));
        assert!(!in_range(b"k2", b"k", b""));
        assert!(in_range(b"zzz", b"k", &[0]));
        assert!(!in_range(b"a", b"k", &[0]));
        assert!(in_range(b"abz", b"ab", &prefix_end(b"ab")));
        assert!(!in_range(b"ac", b"ab", &prefix_end(b"ab")));
    }

    #[test]
    fn comparisons_read_zero_for_an_absent_key_and_values_never_match_one() {
        let kv = KeyValue {
            key: b"k".to_vec(),
            create_revision: 3,
            mod_revision: 7,
            version: 2,
            value: b"v".to_vec(),
            lease: 0,
        };
        let c = |result, target| Compare {
            result,
            target,
            key: b"k".to_vec(),
            range_end: vec![],
        };
        use CompareResult::*;
        assert!(compare_holds(&c(Equal, CompareTarget::Mod(7)), Some(&kv)));
        assert!(compare_holds(
            &c(Greater, CompareTarget::Version(1)),
            Some(&kv)
        ));
        assert!(compare_holds(&c(Less, CompareTarget::Create(4)), Some(&kv)));
        assert!(compare_holds(&c(Equal, CompareTarget::Create(0)), None));
        assert!(!compare_holds(
            &c(NotEqual, CompareTarget::Value(b"x".to_vec())),
            None
        ));
        assert!(compare_holds(
            &c(NotEqual, CompareTarget::Value(b"x".to_vec())),
            Some(&kv)
        ));
        assert!(compare_holds(&c(Equal, CompareTarget::Lease(0)), Some(&kv)));
    }
}
