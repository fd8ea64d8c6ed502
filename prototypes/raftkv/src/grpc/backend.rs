//! [`EtcdBackend`]: what the gRPC services (and the JSON gateway) need from
//! the multi-version store, as calls on [`crate::kv`]'s values.
//!
//! The services translate etcd's protobuf messages into `kv.rs` values,
//! ask the backend, and translate its answers back; the response headers,
//! the leader forwarding, the watch streams, the lease keep-alive streams,
//! the Cluster and Maintenance services are theirs. The backend owns
//! what depends on the store: reads, writes, the watch history, the
//! compaction, the hash, the leases. Its calls keep etcd's meanings
//! (`kv.rs`'s module docs); where this trait says "linearizable" it means a
//! read that sees every write acknowledged before it began (a read index
//! on this member, or the leader's answer).

use crate::kv::{
    DeleteRangeRequest, DeleteRangeResponse, KvError, PutRequest, PutResponse, RangeRequest,
    RangeResponse, TxnRequest, TxnResponse,
};
use std::future::Future;

/// Why a backend call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// Refused as etcd refuses it (its gRPC code and message).
    Kv(KvError),
    /// Only the leader can serve it and this member does not lead: the
    /// service forwards it to the leader.
    NotLeader,
    /// The store or Raft failed (a storage error, Raft stopped): the
    /// message says what; answered `Unavailable`.
    Failed(String),
    /// This backend does not serve the call: answered `Unimplemented`
    /// with the message (a stand-in backend's; the node serves every
    /// call).
    Unsupported(&'static str),
}

impl From<KvError> for BackendError {
    fn from(e: KvError) -> Self {
        BackendError::Kv(e)
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Kv(e) => write!(f, "{e}"),
            BackendError::NotLeader => f.write_str("etcdserver: not leader"),
            BackendError::Failed(m) => f.write_str(m),
            BackendError::Unsupported(m) => f.write_str(m),
        }
    }
}

/// A backend call's result.
pub type BackendResult<T> = Result<T, BackendError>;

/// An answer and the store's revision it was made at (the response
/// header's `revision`: for a write, the revision it was applied at, or
/// the store's revision then if it changed nothing; for a read, the
/// revision it read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<T> {
    /// The answer.
    pub value: T,
    /// The store's revision.
    pub revision: i64,
}

/// What a change did to its key (etcd's `mvccpb.Event.EventType`).
pub use crate::kv::EventType as EventKind;

/// One change from the store's history (etcd's `mvccpb.Event`): the
/// key's new version (for a delete, the key and the delete's revision as
/// `mod_revision`, the rest zero), and the version before it if asked.
pub use crate::kv::Event;

/// A read of the history: the changes to keys of `[key, range_end)` at
/// revisions `from..` (`kv.rs`'s range meanings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsRequest {
    /// The key, or the range's first key.
    pub key: Vec<u8>,
    /// The range's end.
    pub range_end: Vec<u8>,
    /// The first revision to read (at least 1).
    pub from: i64,
    /// Fill each event's `prev_kv`.
    pub prev_kv: bool,
    /// About the most events to return: a page holds whole revisions, so
    /// it may exceed this by the rest of its last revision.
    pub limit: usize,
}

/// A page of the history.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventsPage {
    /// The changes, in revision order (and sub-revision order within
    /// one), each revision whole.
    pub events: Vec<Event>,
    /// Where the next page starts: past the last revision read (the
    /// store's revision + 1 once the page reached it).
    pub next: i64,
    /// The store's revision when the page was read.
    pub revision: i64,
}

/// The store's revisions on a member, as they move: `current` (the
/// newest applied whole), `compact` (versions below it are gone; 0:
/// none) and `physical` (the compaction whose removals are done).
pub use crate::machine::Revisions;

/// A lease as granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Its id.
    pub id: i64,
    /// Its time-to-live, seconds.
    pub ttl: i64,
}

/// A lease's remaining time (etcd's `LeaseTimeToLiveResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTtl {
    /// Its id.
    pub id: i64,
    /// Seconds left (by the leader's clock).
    pub ttl: i64,
    /// The time-to-live it was granted, seconds.
    pub granted_ttl: i64,
    /// Its keys, if asked for.
    pub keys: Vec<Vec<u8>>,
}

/// A hash of the store's keys (etcd's `HashKV`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvHash {
    /// CRC-32C over every version of every key from the compaction to
    /// `revision`, in (revision, sub-revision) order: equal on every
    /// member at one revision.
    pub hash: u32,
    /// The compaction's revision when it was computed.
    pub compact_revision: i64,
    /// The revision it covers.
    pub revision: i64,
}

/// What the etcd services need from the node's multi-version store.
///
/// Every call is this member's; a call that only the leader can serve
/// (writes, lease calls that read the leader's clock) answers
/// [`BackendError::NotLeader`] on another member, and the service forwards
/// the request to the leader over gRPC (never a redirect). The futures
/// are `Send`: the services run on tokio's multi-threaded runtime.
pub trait EtcdBackend: Send + Sync + 'static {
    /// Reads a key or a range: linearizable unless `req.serializable`
    /// (then this member's copy, maybe behind); at `req.revision` if
    /// given (`Compacted`, `FutureRevision`).
    fn range(
        &self,
        req: RangeRequest,
    ) -> impl Future<Output = BackendResult<Answer<RangeResponse>>> + Send;

    /// Puts a key (the leader's; acknowledged once a majority holds it
    /// durably and it is applied).
    fn put(
        &self,
        req: PutRequest,
    ) -> impl Future<Output = BackendResult<Answer<PutResponse>>> + Send;

    /// Deletes a key or a range (the leader's).
    fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> impl Future<Output = BackendResult<Answer<DeleteRangeResponse>>> + Send;

    /// Runs a transaction (the leader's), its comparisons evaluated when
    /// it is applied.
    fn txn(
        &self,
        req: TxnRequest,
    ) -> impl Future<Output = BackendResult<Answer<TxnResponse>>> + Send;

    /// Compacts the store at `revision` (the leader's): every version
    /// below it that a later one replaced is dropped; with `physical`, the
    /// answer waits until this member reclaimed their space. Answers the
    /// store's revision.
    fn compact(
        &self,
        revision: i64,
        physical: bool,
    ) -> impl Future<Output = BackendResult<i64>> + Send;

    /// A page of the history from `req.from` on this member (no wait:
    /// empty once it reached the store's revision); `Compacted` if
    /// `req.from` is below the compaction.
    fn events(&self, req: EventsRequest) -> impl Future<Output = BackendResult<EventsPage>> + Send;

    /// The store's revision and compaction on this member, told as they
    /// move (a watch stream waits on it).
    fn revisions(&self) -> tokio::sync::watch::Receiver<Revisions>;

    /// The hash of the store at `revision` (0: the newest) on this member.
    fn hash_kv(&self, revision: i64) -> impl Future<Output = BackendResult<KvHash>> + Send;

    /// Grants a lease of `ttl` seconds with id `id` (0: the store picks
    /// one) (the leader's).
    fn lease_grant(
        &self,
        id: i64,
        ttl: i64,
    ) -> impl Future<Output = BackendResult<Answer<LeaseGrant>>> + Send;

    /// Revokes a lease and deletes its keys (the leader's).
    fn lease_revoke(&self, id: i64) -> impl Future<Output = BackendResult<Answer<()>>> + Send;

    /// Renews a lease for its time-to-live from now (the leader's, not a
    /// log entry); answers that time-to-live, seconds.
    fn lease_keep_alive(&self, id: i64) -> impl Future<Output = BackendResult<i64>> + Send;

    /// A lease's remaining time (the leader's clock), with its keys if
    /// asked.
    fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> impl Future<Output = BackendResult<LeaseTtl>> + Send;

    /// Every lease's id.
    fn lease_leases(&self) -> impl Future<Output = BackendResult<Vec<i64>>> + Send;

    /// The store's size on disk and the part of it in use, bytes
    /// (`StatusResponse.dbSize`, `dbSizeInUse`).
    fn db_size(&self) -> BackendResult<(i64, i64)>;
}
