//! etcd's Maintenance service: `Status`, `Alarm`, `Defragment`, `Hash`,
//! `HashKV`, `Snapshot`, `MoveLeader`.
//!
//! - `Status`: this member's Raft state (leader, term, last and applied
//!   index, learner or not), the store's size, the version of etcd's API
//!   matched ([`etcd_api::ETCD_VERSION`]), and in `errors` what stopped
//!   Raft and the disk-space alarm.
//! - `Alarm`: `NOSPACE` is each member's disk-space alarm
//!   ([`crate::space`]): raised below its reserve, as etcd raises it when
//!   its quota is reached. `GET` asks every member for its own (a member
//!   that does not answer within two seconds is left out); `DEACTIVATE`
//!   (disarm) has every member look again, clearing its alarm if it is
//!   back above its reserve (it rises again at once if not); `ACTIVATE`
//!   is refused: the alarm follows the disk alone.
//! - `Defragment`: etcd rewrites its file to give back free pages. Here
//!   the store is made durable and the Raft log's space given back: the
//!   member builds a snapshot of what it applied (which syncs the store
//!   first) and purges its log up to it, within the admin deadline.
//! - `Hash` / `HashKV`: the store's [`super::backend::KvHash`] at a
//!   revision, equal on every member at one revision.
//! - `Snapshot`: a new snapshot built as `Defragment` builds it, streamed
//!   in 32 KiB pieces, padded with zeros to a multiple of 512 bytes (etcd's
//!   file is bbolt's, page-aligned, and `etcdctl snapshot save` checks the
//!   size) and followed, as etcd's stream is, by the SHA-256 of every byte
//!   before it (`remaining_bytes` counts both). It is raftkv's snapshot
//!   file (docs/FORMAT.md), not a bbolt file: `etcdctl snapshot restore`
//!   cannot read it.
//! - `MoveLeader`: the leader hands over to the voter named (openraft's
//!   transfer-leader: the target campaigns at once), answered once it
//!   leads, within five seconds.

use super::{forward, status, Etcd, EtcdBackend};
use etcd_api::etcdserverpb as pb;
use etcd_api::etcdserverpb::maintenance_client::MaintenanceClient;
use openraft::async_runtime::WatchReceiver;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// The Maintenance service on a backend.
pub struct MaintenanceService<B>(pub Arc<Etcd<B>>);

/// The pieces of a snapshot stream.
pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotResponse, Status>> + Send>>;

/// A snapshot stream's piece.
pub const SNAPSHOT_PIECE: usize = 32 << 10;

/// A snapshot stream's length before its SHA-256 is a multiple of this.
pub const SNAPSHOT_ALIGN: u64 = 512;

/// How long `MoveLeader` waits for the target to lead.
pub const MOVE_LEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an alarm request waits for each other member.
const ALARM_PEER_TIMEOUT: Duration = Duration::from_secs(2);

impl<B: EtcdBackend> MaintenanceService<B> {
    /// This member's status.
    pub async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<pb::StatusResponse, Status> {
        let etcd = &self.0;
        let m = etcd.node.raft.metrics().borrow_watched().clone();
        let (db_size, in_use) = etcd.store.db_size().map_err(status)?;
        let mut errors: Vec<String> = m
            .running_state
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .into_iter()
            .collect();
        if etcd.node.space.full() {
            errors.push(format!("memberID:{} alarm:NOSPACE ", etcd.node.id));
        }
        // A learner is a member that is not a voter; a node that has not
        // yet received any membership (a member starting, its log still
        // empty) is not one.
        let membership = m.membership_config.membership();
        let is_learner = membership.learner_ids().any(|l| l == etcd.node.id);
        Ok(pb::StatusResponse {
            header: Some(etcd.header_now()),
            version: etcd_api::ETCD_VERSION.to_owned(),
            db_size,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors,
            db_size_in_use: in_use,
            is_learner,
        })
    }

    /// This member's own alarm after `action` (GET or DEACTIVATE).
    fn own_alarm(&self, action: pb::alarm_request::AlarmAction) -> Vec<pb::AlarmMember> {
        let space = &self.0.node.space;
        let was = space.raised();
        let now = match action {
            pb::alarm_request::AlarmAction::Deactivate => space.disarm(),
            _ => space.full(),
        };
        // A disarm answers the alarms it cleared, a get those raised.
        let listed = match action {
            pb::alarm_request::AlarmAction::Deactivate => was && !now,
            _ => now,
        };
        listed
            .then(|| pb::AlarmMember {
                member_id: self.0.node.id,
                alarm: pb::AlarmType::Nospace as i32,
            })
            .into_iter()
            .collect()
    }

    /// Lists or disarms the alarms of every member (see the module docs).
    pub async fn alarm(&self, req: Request<pb::AlarmRequest>) -> Result<pb::AlarmResponse, Status> {
        use pb::alarm_request::AlarmAction;
        let etcd = &self.0;
        let local = req.metadata().contains_key(super::FORWARDED);
        let r = req.into_inner();
        let action = AlarmAction::try_from(r.action).map_err(|_| {
            Status::invalid_argument(format!("etcdserver: unknown alarm action {}", r.action))
        })?;
        if action == AlarmAction::Activate {
            return Err(Status::invalid_argument(
                "etcdserver: raftkv raises NOSPACE from its disk's free space alone",
            ));
        }
        let wanted = |a: &pb::AlarmMember| {
            (r.member_id == 0 || r.member_id == a.member_id)
                && (r.alarm == pb::AlarmType::None as i32 || r.alarm == a.alarm)
        };
        let mut alarms = self.own_alarm(action);
        if !local {
            let m = etcd.node.raft.metrics().borrow_watched().clone();
            for (id, n) in m.membership_config.membership().nodes() {
                if *id == etcd.node.id {
                    continue;
                }
                let Ok(channel) = etcd.forward.channel(&n.addr) else {
                    continue;
                };
                let mut client = MaintenanceClient::new(channel);
                let ask = client.alarm(forward::request(r));
                if let Ok(Ok(a)) = tokio::time::timeout(ALARM_PEER_TIMEOUT, ask).await {
                    alarms.extend(a.into_inner().alarms);
                }
            }
        }
        alarms.retain(wanted);
        alarms.sort_by_key(|a| (a.member_id, a.alarm));
        Ok(pb::AlarmResponse {
            header: Some(etcd.header_now()),
            alarms,
        })
    }

    /// Makes the store durable and gives back the log's space (see the
    /// module docs).
    pub async fn defragment(&self) -> Result<pb::DefragmentResponse, Status> {
        super::node::compact_log(&self.0.node)
            .await
            .map_err(Status::unavailable)?;
        Ok(pb::DefragmentResponse {
            header: Some(self.0.header_now()),
        })
    }

    /// The store's hash at a revision (0: now).
    pub async fn hash_kv(&self, revision: i64) -> Result<pb::HashKvResponse, Status> {
        let h = self.0.store.hash_kv(revision).await.map_err(status)?;
        Ok(pb::HashKvResponse {
            header: Some(self.0.header(h.revision)),
            hash: h.hash,
            compact_revision: h.compact_revision,
        })
    }

    /// Hands the leadership to a voter.
    pub async fn move_leader(
        &self,
        req: Request<pb::MoveLeaderRequest>,
    ) -> Result<pb::MoveLeaderResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = MaintenanceClient::new(etcd.forward.channel(&addr)?);
            return Ok(c
                .move_leader(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let target = req.into_inner().target_id;
        let m = etcd.node.raft.metrics().borrow_watched().clone();
        if !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == target)
        {
            return Err(Status::failed_precondition(
                "etcdserver: bad leader transferee",
            ));
        }
        if target != etcd.node.id {
            etcd.node
                .raft
                .trigger()
                .transfer_leader(target)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            etcd.node
                .raft
                .wait(Some(MOVE_LEADER_TIMEOUT))
                .metrics(|m| m.current_leader == Some(target), "the transferee leads")
                .await
                .map_err(|_| {
                    Status::deadline_exceeded(
                        "etcdserver: request timed out, leader transfer took too long",
                    )
                })?;
        }
        Ok(pb::MoveLeaderResponse {
            header: Some(etcd.header_now()),
        })
    }

    /// Streams a new snapshot of this member's store.
    pub async fn snapshot(&self) -> Result<SnapshotStream, Status> {
        let etcd = self.0.clone();
        super::node::compact_log(&etcd.node)
            .await
            .map_err(Status::unavailable)?;
        let snap = etcd
            .node
            .raft
            .get_snapshot()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .ok_or_else(|| Status::unavailable("etcdserver: no snapshot"))?;
        let file = Arc::new(snap.snapshot);
        let len = tokio::task::spawn_blocking({
            let (file, node) = (file.clone(), etcd.node.clone());
            move || super::node::file_len(&node, &file)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::unavailable(e.to_string()))?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(send_snapshot(etcd, file, len, tx));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Sends `file` (`len` bytes) in pieces, then its SHA-256, until the
/// reader goes away.
async fn send_snapshot<B: EtcdBackend>(
    etcd: Arc<Etcd<B>>,
    file: Arc<crate::machine::SnapshotFile>,
    len: u64,
    tx: tokio::sync::mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
) {
    use sha2::Digest;
    let mut sum = sha2::Sha256::new();
    let mut pos = 0u64;
    let padded = len.div_ceil(SNAPSHOT_ALIGN) * SNAPSHOT_ALIGN;
    let total = padded + 32;
    loop {
        let piece = tokio::task::spawn_blocking({
            let file = file.clone();
            move || file.read_piece(pos, SNAPSHOT_PIECE)
        })
        .await;
        let blob = match piece {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                let _ = tx.send(Err(Status::unavailable(e.to_string()))).await;
                return;
            }
            Err(e) => {
                let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                return;
            }
        };
        let mut blob = blob;
        let last = blob.is_empty() || pos + blob.len() as u64 >= len;
        pos += blob.len() as u64;
        if last {
            // The zeros up to the alignment.
            let pad = usize::try_from(padded.saturating_sub(pos)).unwrap_or(0);
            blob.resize(blob.len() + pad, 0);
            pos = padded;
        }
        sum.update(&blob);
        let remaining = total.saturating_sub(pos);
        let r = pb::SnapshotResponse {
            header: Some(etcd.header_now()),
            remaining_bytes: remaining,
            blob,
        };
        if tx.send(Ok(r)).await.is_err() {
            return;
        }
        if last {
            break;
        }
    }
    let r = pb::SnapshotResponse {
        header: Some(etcd.header_now()),
        remaining_bytes: 0,
        blob: sum.finalize().to_vec(),
    };
    let _ = tx.send(Ok(r)).await;
}

#[tonic::async_trait]
impl<B: EtcdBackend> pb::maintenance_server::Maintenance for MaintenanceService<B> {
    async fn alarm(
        &self,
        req: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        MaintenanceService::alarm(self, req)
            .await
            .map(Response::new)
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        MaintenanceService::status(self, req)
            .await
            .map(Response::new)
    }

    async fn defragment(
        &self,
        _: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        MaintenanceService::defragment(self)
            .await
            .map(Response::new)
    }

    async fn hash(
        &self,
        _: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        let h = MaintenanceService::hash_kv(self, 0).await?;
        Ok(Response::new(pb::HashResponse {
            header: h.header,
            hash: h.hash,
        }))
    }

    async fn hash_kv(
        &self,
        req: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        MaintenanceService::hash_kv(self, req.into_inner().revision)
            .await
            .map(Response::new)
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _: Request<pb::SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        MaintenanceService::snapshot(self).await.map(Response::new)
    }

    async fn move_leader(
        &self,
        req: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        MaintenanceService::move_leader(self, req)
            .await
            .map(Response::new)
    }
}
