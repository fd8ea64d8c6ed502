//! [`EtcdBackend`] on a raftkv [`Node`]: each call is the node-level
//! call of [`crate::node::kv`] (the one path the gRPC services, the JSON
//! gateway and the HTTP API's watch share), its refusals etcd's; and the
//! node-level steps the Maintenance service shares.
//!
//! The history a watch reads is the store's versions
//! ([`StateMachine::events`]), paged here in whole revisions.

use super::backend::{
    Answer, BackendError, BackendResult, EtcdBackend, Event, EventsPage, EventsRequest, KvHash,
    LeaseGrant, LeaseTtl, Revisions,
};
use crate::kv::{
    DeleteRangeRequest, DeleteRangeResponse, KvError, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseOp, TxnRequest, TxnResponse,
};
use crate::machine::{Position, ReadError};
use crate::node::kv::Header;
use crate::node::CompactLogError;
use crate::node::Node;
use crate::StateMachine;
use std::path::Path;

/// [`Node::compact_log`] in etcd's words (`Maintenance.Defragment`):
/// the index purged to, or the message to answer.
pub async fn compact_log(node: &Node) -> Result<u64, String> {
    node.compact_log().await.map_err(|e| match e {
        CompactLogError::NothingApplied => "etcdserver: nothing applied yet".to_string(),
        CompactLogError::Failed(e) => e,
        CompactLogError::TimedOut(after) => format!(
            "etcdserver: request timed out: not done within {} s",
            after.as_secs()
        ),
    })
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

/// A backend error for a node-level call's refusal: "not leader" is
/// the service's to forward.
fn refused(e: KvError) -> BackendError {
    match e {
        KvError::NotLeader => BackendError::NotLeader,
        e => BackendError::Kv(e),
    }
}

/// The answer of a node-level call at its header's revision.
fn answer<T>(value: T, h: Header) -> Answer<T> {
    Answer {
        value,
        revision: h.revision,
    }
}

/// A write's answer of the kind `$variant`, or a timeout (another kind
/// cannot come back for the request).
macro_rules! write_as {
    ($node:expr, $op:expr, $variant:ident) => {{
        let (resp, h) = $node.write($op).await.map_err(refused)?;
        match resp {
            ResponseOp::$variant(r) => Ok(answer(r, h)),
            _ => Err(KvError::Timeout.into()),
        }
    }};
}

impl EtcdBackend for Node {
    async fn range(&self, req: RangeRequest) -> BackendResult<Answer<RangeResponse>> {
        let (resp, h) = Node::range(self, req).await.map_err(refused)?;
        Ok(answer(resp, h))
    }

    async fn put(&self, req: PutRequest) -> BackendResult<Answer<PutResponse>> {
        write_as!(self, RequestOp::Put(req), Put)
    }

    async fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> BackendResult<Answer<DeleteRangeResponse>> {
        write_as!(self, RequestOp::DeleteRange(req), DeleteRange)
    }

    async fn txn(&self, req: TxnRequest) -> BackendResult<Answer<TxnResponse>> {
        write_as!(self, RequestOp::Txn(req), Txn)
    }

    async fn compact(&self, revision: i64, physical: bool) -> BackendResult<i64> {
        let h = Node::compact(self, revision, physical)
            .await
            .map_err(refused)?;
        Ok(h.revision)
    }

    async fn events(&self, req: EventsRequest) -> BackendResult<EventsPage> {
        let machine = self.machine.clone();
        let read = tokio::task::spawn_blocking(move || whole_revisions(&machine, &req)).await;
        match read {
            Ok(r) => r,
            Err(e) => Err(BackendError::Failed(e.to_string())),
        }
    }

    fn revisions(&self) -> tokio::sync::watch::Receiver<Revisions> {
        Node::revisions(self)
    }

    async fn hash_kv(&self, revision: i64) -> BackendResult<KvHash> {
        let (hash, compact_revision, h) = Node::hash_kv(self, revision).await.map_err(refused)?;
        Ok(KvHash {
            hash,
            compact_revision,
            revision: h.revision,
        })
    }

    async fn lease_grant(&self, id: i64, ttl: i64) -> BackendResult<Answer<LeaseGrant>> {
        let (id, ttl, h) = Node::lease_grant(self, id, ttl).await.map_err(refused)?;
        Ok(answer(LeaseGrant { id, ttl }, h))
    }

    async fn lease_revoke(&self, id: i64) -> BackendResult<Answer<()>> {
        let h = Node::lease_revoke(self, id).await.map_err(refused)?;
        Ok(answer((), h))
    }

    async fn lease_keep_alive(&self, id: i64) -> BackendResult<i64> {
        let (ttl, _) = Node::lease_keep_alive(self, id).await.map_err(refused)?;
        Ok(ttl)
    }

    async fn lease_time_to_live(&self, id: i64, keys: bool) -> BackendResult<LeaseTtl> {
        let (t, _) = Node::lease_time_to_live(self, id, keys)
            .await
            .map_err(refused)?;
        Ok(LeaseTtl {
            id: t.id,
            ttl: t.ttl,
            granted_ttl: t.granted_ttl,
            keys: t.keys,
        })
    }

    async fn lease_leases(&self) -> BackendResult<Vec<i64>> {
        Ok(Node::lease_leases(self).0)
    }

    fn db_size(&self) -> BackendResult<(i64, i64)> {
        let dir = self.space.dir().join("state");
        let bytes = tree_bytes(&*self.space.vfs(), &dir, 3);
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        // In use: the store's data file (its pages), not the snapshots
        // and journal beside it.
        let in_use = i64::try_from(self.machine.db_size()).unwrap_or(i64::MAX);
        Ok((bytes, in_use.min(bytes)))
    }
}

/// Versions the history read looks at per call, at most: a range that
/// matches few keys still moves on (and the page says where it stopped).
const SCAN: usize = 4096;

/// A page of the history that holds whole revisions: where the store's
/// page ([`StateMachine::events`]) stopped inside a revision, the rest of
/// that revision is read on, so a revision's changes are never split
/// between two pages (a watch answer holds whole revisions, as etcd's;
/// a revision of 200,000 deletions makes one large page).
fn whole_revisions(machine: &StateMachine, req: &EventsRequest) -> BackendResult<EventsPage> {
    let span = (req.key.as_slice(), req.range_end.as_slice());
    let read = |from: Position, max: usize| {
        machine
            .events(from, span, req.prev_kv, (max, SCAN))
            .map_err(|e| match e {
                ReadError::Kv(e) => BackendError::Kv(e),
                ReadError::Store(e) => BackendError::Failed(e.to_string()),
            })
    };
    let page = read(Position::at(req.from.max(1)), req.limit.max(1))?;
    let upto = page.revision;
    let mut events: Vec<Event> = page.events.into_iter().map(|(_, e)| e).collect();
    if page.next.revision > upto {
        // Every version up to the store's revision looked at.
        return Ok(EventsPage {
            events,
            next: upto.saturating_add(1),
            revision: upto,
        });
    }
    // Stopped inside revision `tail` (maybe at its end): read the rest.
    let tail = page.next.revision;
    let mut from = page.next;
    while from.revision == tail {
        let more = read(from, usize::MAX)?;
        let rest = more.events.into_iter().filter(|(p, _)| p.revision == tail);
        events.extend(rest.map(|(_, e)| e));
        from = more.next;
    }
    Ok(EventsPage {
        events,
        next: tail.saturating_add(1),
        revision: upto,
    })
}
