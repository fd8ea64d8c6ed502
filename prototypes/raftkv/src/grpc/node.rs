//! [`EtcdBackend`] on a raftkv [`Node`], and the node-level steps the
//! Maintenance service shares.
//!
//! **Integration point.** This file is where the node's multi-version
//! store (issue 59, part 2: integer revisions, old versions, the history
//! as the store) meets the gRPC services. On the store as it is on this
//! branch — one version per key, `INDEX.SUB` revisions, no version
//! counts — the KV calls, the history (`events`), `hash_kv` and the list
//! of leases cannot keep etcd's meanings, so they answer
//! [`BackendError::Unsupported`] (`Unimplemented`) until the store's
//! calls replace them; the store's revision reads 0 meanwhile. The lease
//! calls that the store has — grant (with an id the store picks),
//! revoke, keep-alive through the leader's lessor, time-to-live — are
//! served, as is the store's size.

use super::backend::{
    Answer, BackendError, BackendResult, EtcdBackend, EventsPage, EventsRequest, KvHash,
    LeaseGrant, LeaseTtl, Revisions,
};
use crate::kv::{
    DeleteRangeRequest, DeleteRangeResponse, KvError, PutRequest, PutResponse, RangeRequest,
    RangeResponse, TxnRequest, TxnResponse,
};
use crate::node::Node;
use crate::propose::Outcome;
use crate::types::{Command, Verdict};
use openraft::async_runtime::WatchReceiver;
use std::path::Path;
use std::time::Duration;

/// What the calls that need the multi-version store answer until it is
/// integrated.
pub const NEEDS_MVCC: &str =
    "raftkv: this call needs the multi-version store (issue 59, part 2), not on this build yet";

/// The longest lease, seconds (a week, as `POST /lease`).
const MAX_LEASE_TTL: i64 = 7 * 24 * 3600;

/// How long a lease call waits for Raft.
const LEASE_TIMEOUT: Duration = crate::api::REQUEST_TIMEOUT;

/// Builds a snapshot of what `node` applied (the store synced first) and
/// purges its log up to it, within its admin deadline (`POST /compact`,
/// etcd's `Defragment`). Answers the index purged to.
pub async fn compact_log(node: &Node) -> Result<u64, String> {
    let applied = node
        .raft
        .metrics()
        .borrow_watched()
        .last_applied
        .map(|l| l.index);
    let Some(upto) = applied else {
        return Err("etcdserver: nothing applied yet".into());
    };
    let wait = || node.raft.wait(Some(node.admin_timeout));
    let run = async {
        node.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| e.to_string())?;
        wait()
            .metrics(|m| m.snapshot.is_some_and(|s| s.index >= upto), "snapshot")
            .await
            .map_err(|e| e.to_string())?;
        node.raft
            .trigger()
            .purge_log(upto)
            .await
            .map_err(|e| e.to_string())?;
        wait()
            .metrics(|m| m.purged.is_some_and(|p| p.index >= upto), "purge")
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(upto)
    };
    match tokio::time::timeout(node.admin_timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "etcdserver: request timed out: not done within {} s",
            node.admin_timeout.as_secs()
        )),
    }
}

/// The length of a snapshot file, through the node's filesystem.
pub fn file_len(node: &Node, file: &crate::machine::SnapshotFile) -> Result<u64, String> {
    let vfs = node.space.vfs();
    let f = vfs
        .open(file.path(), journal_core::vfs::OpenOptions::read())
        .map_err(|e| e.to_string())?;
    f.len().map_err(|e| e.to_string())
}

/// The bytes of the files under `dir`, recursively (entries that vanish
/// meanwhile are passed over).
fn tree_bytes(vfs: &dyn journal_core::vfs::Vfs, dir: &Path, depth: u32) -> u64 {
    let Ok(names) = vfs.read_dir(dir) else {
        return 0;
    };
    let mut total = 0u64;
    for name in names {
        let path = dir.join(name);
        match vfs.open(&path, journal_core::vfs::OpenOptions::read()) {
            Ok(f) => total = total.saturating_add(f.len().unwrap_or(0)),
            Err(_) if depth > 0 => total = total.saturating_add(tree_bytes(vfs, &path, depth - 1)),
            Err(_) => {}
        }
    }
    total
}

impl Node {
    /// Proposes a lease command and waits for its verdict.
    async fn lease_command(&self, cmd: Command) -> BackendResult<crate::types::Revision> {
        match tokio::time::timeout(LEASE_TIMEOUT, self.proposer.propose(cmd)).await {
            Err(_) => Err(KvError::Timeout.into()),
            Ok(Outcome::Applied {
                revision, verdict, ..
            }) => match verdict {
                Verdict::Applied | Verdict::Duplicate { .. } | Verdict::CompareFailed => {
                    Ok(revision)
                }
                Verdict::LeaseNotFound => Err(KvError::LeaseNotFound.into()),
                v => Err(BackendError::Failed(format!("etcdserver: {v:?}"))),
            },
            Ok(Outcome::Forward(_)) => Err(BackendError::NotLeader),
            Ok(Outcome::Failed(e)) => Err(BackendError::Failed(e)),
            Ok(Outcome::Busy) => Err(BackendError::Failed("etcdserver: too many requests".into())),
        }
    }

    /// The leader's read barrier: leadership confirmed by a majority.
    async fn confirm_leadership(&self) -> BackendResult<()> {
        let read = self
            .raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex);
        match tokio::time::timeout(LEASE_TIMEOUT, read).await {
            Err(_) => Err(KvError::Timeout.into()),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(BackendError::NotLeader),
        }
    }
}

impl EtcdBackend for Node {
    async fn range(&self, _: RangeRequest) -> BackendResult<Answer<RangeResponse>> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    async fn put(&self, _: PutRequest) -> BackendResult<Answer<PutResponse>> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    async fn delete_range(
        &self,
        _: DeleteRangeRequest,
    ) -> BackendResult<Answer<DeleteRangeResponse>> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    async fn txn(&self, _: TxnRequest) -> BackendResult<Answer<TxnResponse>> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    async fn compact(&self, _: i64, _: bool) -> BackendResult<i64> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    async fn events(&self, _: EventsRequest) -> BackendResult<EventsPage> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    fn revisions(&self) -> tokio::sync::watch::Receiver<Revisions> {
        // No integer revisions on this store: 0, and never a change (a
        // watch stream on it ends).
        tokio::sync::watch::channel(Revisions::default()).1
    }

    async fn hash_kv(&self, _: i64) -> BackendResult<KvHash> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    async fn lease_grant(&self, id: i64, ttl: i64) -> BackendResult<Answer<LeaseGrant>> {
        if id != 0 {
            return Err(BackendError::Unsupported(NEEDS_MVCC));
        }
        if self.space.full() {
            return Err(KvError::NoSpace.into());
        }
        // etcd raises a short time-to-live to its minimum; raftkv's
        // leases are 1 s to a week.
        let ttl = ttl.clamp(1, MAX_LEASE_TTL);
        let ttl_ms = u64::try_from(ttl).unwrap_or(1) * 1000;
        let rev = self
            .lease_command(Command::LeaseGrant { ttl_ms, id: None })
            .await?;
        let id = i64::try_from(crate::machine::lease_id(rev))
            .map_err(|_| BackendError::Failed("etcdserver: lease id out of range".into()))?;
        Ok(Answer {
            value: LeaseGrant { id, ttl },
            revision: 0,
        })
    }

    async fn lease_revoke(&self, id: i64) -> BackendResult<Answer<()>> {
        let lease = u64::try_from(id).map_err(|_| KvError::LeaseNotFound)?;
        self.lease_command(Command::LeaseRevoke { lease, id: None })
            .await?;
        Ok(Answer {
            value: (),
            revision: 0,
        })
    }

    async fn lease_keep_alive(&self, id: i64) -> BackendResult<i64> {
        let arrived = tokio::time::Instant::now();
        let lease = u64::try_from(id).map_err(|_| KvError::LeaseNotFound)?;
        self.confirm_leadership().await?;
        // One at a time with the leader's checkpoints.
        let _turn = self.lessor.turn().await;
        let held = self.machine.lease(lease).ok_or(KvError::LeaseNotFound)?;
        self.lessor.renew(lease, held.ttl_ms, arrived);
        if held.remaining_ms.is_some() {
            self.lease_command(Command::LeaseKeepAlive { lease, id: None })
                .await?;
        }
        Ok(i64::try_from(held.ttl_ms / 1000).unwrap_or(i64::MAX))
    }

    async fn lease_time_to_live(&self, id: i64, keys: bool) -> BackendResult<LeaseTtl> {
        let lease = u64::try_from(id).map_err(|_| KvError::LeaseNotFound)?;
        self.confirm_leadership().await?;
        let held = self.machine.lease(lease).ok_or(KvError::LeaseNotFound)?;
        if keys && held.keys > 0 {
            return Err(BackendError::Unsupported(NEEDS_MVCC));
        }
        let left = self
            .lessor
            .deadline(lease)
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
            .unwrap_or(Duration::from_millis(held.left_ms()));
        Ok(LeaseTtl {
            id,
            ttl: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            granted_ttl: i64::try_from(held.ttl_ms / 1000).unwrap_or(i64::MAX),
            keys: Vec::new(),
        })
    }

    async fn lease_leases(&self) -> BackendResult<Vec<i64>> {
        Err(BackendError::Unsupported(NEEDS_MVCC))
    }

    fn db_size(&self) -> BackendResult<(i64, i64)> {
        let dir = self.space.dir().join("state");
        let bytes = tree_bytes(&*self.space.vfs(), &dir, 3);
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        Ok((bytes, bytes))
    }
}
