//! etcd v3's gRPC API on the client port: the KV, Watch, Lease, Cluster
//! and Maintenance services of etcd 3.4 (`etcd_api`'s `etcdserverpb`), so
//! etcdctl and etcd's client libraries use raftkv with nothing changed but
//! the endpoint; and etcd's JSON gateway (`/v3/kv/range`, …: [`gateway`])
//! over the same calls.
//!
//! # One port, two protocols
//!
//! The server ([`crate::server`]) serves HTTP/1.1 and HTTP/2 cleartext on
//! the same listener (etcdctl connects with `--endpoints=http://…` and
//! HTTP/2's prior knowledge); a request whose `content-type` is
//! `application/grpc…` goes to [`GrpcRouter`], every other one to the
//! JSON API's router. The router picks the service by the path's
//! `/etcdserverpb.<Service>/` prefix; an unknown one, and the Auth
//! service (not served: raftkv has no users), answer `Unimplemented`.
//!
//! # What every answer carries
//!
//! Every response header carries etcd's four fields: `cluster_id` (the
//! cluster's id), `member_id` (the answering node's id), `revision` (the
//! store's revision the answer reflects: a write's own, a read's, else
//! the store's newest on this member) and `raft_term` (this member's
//! term). An error is a `tonic::Status` with [`crate::kv::KvError`]'s code
//! and etcd's message (clients match on the words).
//!
//! # Followers
//!
//! A request only the leader can serve — writes, compaction, linearizable
//! reads, leases, membership changes, `MoveLeader` — that reaches a
//! follower is forwarded to the leader over gRPC ([`forward`]) and its
//! answer relayed: never a redirect, which a gRPC client cannot follow. A
//! forwarded request carries [`FORWARDED`]; a member that receives one
//! and does not lead answers `Unavailable` "etcdserver: not leader"
//! rather than forward it again (the client retries). With no leader:
//! "etcdserver: no leader". Serializable reads, watches, `Status`,
//! `Alarm`, `Hash`, `HashKV`, `Defragment` and `Snapshot` are served by
//! the member asked, as etcd does.
//!
//! # The store behind it
//!
//! The services ask an [`EtcdBackend`] ([`backend`]): the node's
//! multi-version store. Cluster and Maintenance use openraft directly.

pub mod backend;
mod cluster;
mod convert;
pub mod forward;
pub mod gateway;
mod kv;
mod lease;
mod maintenance;
mod node;
pub mod watch;

pub use backend::{BackendError, BackendResult, EtcdBackend};
pub use watch::{MAX_STREAM_WATCHERS, PROGRESS_INTERVAL, WATCH_PAGE};

use crate::node::Node;
use crate::types::NodeId;
use etcd_api::etcdserverpb::ResponseHeader;
use openraft::async_runtime::WatchReceiver;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::{Code, Status};

/// The metadata key a follower sets on a request it forwards to the
/// leader.
pub const FORWARDED: &str = "x-raftkv-forwarded";

/// What the services share: the node (Raft, membership, identity), its
/// store (the backend), and the connections to the leader.
pub struct Etcd<B> {
    /// The node.
    pub node: Arc<Node>,
    /// Its store.
    pub store: Arc<B>,
    /// Channels to other members, for forwarding.
    pub forward: forward::Forwarder,
    /// How often a watcher that asked for progress notifications gets one
    /// while nothing happens ([`PROGRESS_INTERVAL`] by default).
    pub progress_interval: Duration,
}

/// Who serves a request that needs the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leader {
    /// This member.
    Me,
    /// Another member, at this address.
    Other(NodeId, String),
}

impl<B: EtcdBackend> Etcd<B> {
    /// The services of `node`, on `store`.
    pub fn new(node: Arc<Node>, store: Arc<B>) -> Etcd<B> {
        let forward = forward::Forwarder::new(node.admin_timeout);
        Etcd {
            node,
            store,
            forward,
            progress_interval: PROGRESS_INTERVAL,
        }
    }

    /// A response header at the store's `revision`.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.node.cluster,
            member_id: self.node.id,
            revision,
            raft_term: self.node.raft.metrics().borrow_watched().current_term,
        }
    }

    /// A response header at the store's newest revision on this member.
    pub fn header_now(&self) -> ResponseHeader {
        self.header(self.store.revisions().borrow().current)
    }

    /// The leader, as this member knows it: `NoLeader` if none.
    pub fn leader(&self) -> Result<Leader, Status> {
        let m = self.node.raft.metrics().borrow_watched().clone();
        match m.current_leader {
            Some(id) if id == self.node.id => Ok(Leader::Me),
            Some(id) => match m.membership_config.membership().get_node(&id) {
                Some(n) => Ok(Leader::Other(id, n.addr.clone())),
                None => Err(kv_status(&crate::kv::KvError::NoLeader)),
            },
            None => Err(kv_status(&crate::kv::KvError::NoLeader)),
        }
    }

    /// The leader, waiting (up to [`crate::api::REQUEST_TIMEOUT`]) while
    /// this member knows none — an election under way — as etcd's
    /// requests wait for a leader rather than fail at once; `NoLeader` if
    /// none came.
    pub async fn leader_awaited(&self) -> Result<Leader, Status> {
        let none = self
            .node
            .raft
            .metrics()
            .borrow_watched()
            .current_leader
            .is_none();
        if none {
            let _ = self
                .node
                .raft
                .wait(Some(crate::api::REQUEST_TIMEOUT))
                .metrics(|m| m.current_leader.is_some(), "a leader")
                .await;
        }
        self.leader()
    }

    /// Where a request that needs the leader goes: `None` to serve it
    /// here, or the leader's address; `Unavailable` if there is no leader
    /// (after [`Etcd::leader_awaited`]), or if the request was forwarded
    /// to this member already and it does not lead.
    pub async fn route<T>(&self, req: &tonic::Request<T>) -> Result<Option<String>, Status> {
        self.route_marked(req.metadata().contains_key(FORWARDED))
            .await
    }

    /// [`Etcd::route`] of a request that was `forwarded` or not.
    pub async fn route_marked(&self, forwarded: bool) -> Result<Option<String>, Status> {
        match self.leader_awaited().await? {
            Leader::Me => Ok(None),
            Leader::Other(..) if forwarded => Err(kv_status(&crate::kv::KvError::NotLeader)),
            Leader::Other(_, addr) => Ok(Some(addr)),
        }
    }
}

/// etcd's status for a [`crate::kv::KvError`].
pub fn kv_status(e: &crate::kv::KvError) -> Status {
    Status::new(Code::from(e.code()), e.message())
}

/// The status of a backend error.
pub fn status(e: BackendError) -> Status {
    match e {
        BackendError::Kv(e) => kv_status(&e),
        BackendError::NotLeader => kv_status(&crate::kv::KvError::NotLeader),
        BackendError::Failed(m) => Status::unavailable(m),
        BackendError::Unsupported(m) => Status::unimplemented(m),
    }
}

/// The message of the Auth service's `Unimplemented`.
pub const AUTH_UNIMPLEMENTED: &str =
    "raftkv does not serve etcd's Auth service: it has no users or roles (issue 59)";

type GrpcResponse = http::Response<tonic::body::BoxBody>;
type GrpcFuture = Pin<Box<dyn Future<Output = Result<GrpcResponse, Infallible>> + Send>>;

/// The gRPC side of the client port: a tower service that dispatches a
/// request to its etcd service by path.
#[derive(Clone)]
pub struct GrpcRouter {
    /// The node's permits for client requests: a unary call holds one
    /// until it is answered.
    slots: Arc<tokio::sync::Semaphore>,
    kv: etcd_api::etcdserverpb::kv_server::KvServer<kv::KvService<Node>>,
    watch: etcd_api::etcdserverpb::watch_server::WatchServer<watch::WatchService<Node>>,
    lease: etcd_api::etcdserverpb::lease_server::LeaseServer<lease::LeaseService<Node>>,
    cluster: etcd_api::etcdserverpb::cluster_server::ClusterServer<cluster::ClusterService<Node>>,
    maintenance: etcd_api::etcdserverpb::maintenance_server::MaintenanceServer<
        maintenance::MaintenanceService<Node>,
    >,
}

/// The gRPC services of `node`, on its own store.
pub fn router(node: Arc<Node>) -> GrpcRouter {
    let etcd = Arc::new(Etcd::new(node.clone(), node));
    router_on(etcd)
}

/// The gRPC services on `etcd`.
pub fn router_on(etcd: Arc<Etcd<Node>>) -> GrpcRouter {
    use etcd_api::etcdserverpb::*;
    // A value may be up to etcd's request limit, and a range answer holds
    // many: no limit on what is sent; what is received is bounded a bit
    // above the request limit (its framing).
    let max_in = crate::kv::MAX_REQUEST_BYTES + (64 << 10);
    GrpcRouter {
        slots: etcd.node.client_slots.clone(),
        kv: kv_server::KvServer::new(kv::KvService(etcd.clone())).max_decoding_message_size(max_in),
        watch: watch_server::WatchServer::new(watch::WatchService(etcd.clone())),
        lease: lease_server::LeaseServer::new(lease::LeaseService(etcd.clone())),
        cluster: cluster_server::ClusterServer::new(cluster::ClusterService(etcd.clone())),
        maintenance: maintenance_server::MaintenanceServer::new(maintenance::MaintenanceService(
            etcd,
        )),
    }
}

impl GrpcRouter {
    /// Serves one gRPC request.
    pub fn call<Bd>(&self, req: http::Request<Bd>) -> GrpcFuture
    where
        Bd: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        Bd::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let path = req.uri().path().to_owned();
        let mut parts = path.trim_start_matches('/').split('/');
        let service = parts.next().unwrap_or("");
        let method = parts.next().unwrap_or("");
        // A unary call takes one of the node's client permits while it is
        // served, as an HTTP request does; beyond them, etcd's "too many
        // requests". The streams are bounded by their own limits.
        let streaming = matches!(
            (service, method),
            ("etcdserverpb.Watch", _)
                | ("etcdserverpb.Lease", "LeaseKeepAlive")
                | ("etcdserverpb.Maintenance", "Snapshot")
        );
        let permit = match streaming {
            true => None,
            false => match self.slots.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    let resp =
                        Status::resource_exhausted("etcdserver: too many requests").into_http();
                    return Box::pin(async move { Ok(resp) });
                }
            },
        };
        let call = self.dispatch(service, req);
        Box::pin(async move {
            let r = call.await;
            drop(permit);
            r
        })
    }

    /// The service a request goes to, by its path's first part.
    fn dispatch<Bd>(&self, service: &str, req: http::Request<Bd>) -> GrpcFuture
    where
        Bd: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        Bd::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        use tower_service::Service;
        match service {
            "etcdserverpb.KV" => Box::pin(self.kv.clone().call(req)),
            "etcdserverpb.Watch" => Box::pin(self.watch.clone().call(req)),
            "etcdserverpb.Lease" => Box::pin(self.lease.clone().call(req)),
            "etcdserverpb.Cluster" => Box::pin(self.cluster.clone().call(req)),
            "etcdserverpb.Maintenance" => Box::pin(self.maintenance.clone().call(req)),
            "etcdserverpb.Auth" => unimplemented(AUTH_UNIMPLEMENTED),
            _ => unimplemented(
                "raftkv serves etcd's KV, Watch, Lease, Cluster and Maintenance services",
            ),
        }
    }
}

impl<Bd> tower_service::Service<http::Request<Bd>> for GrpcRouter
where
    Bd: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    Bd::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = GrpcResponse;
    type Error = Infallible;
    type Future = GrpcFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Bd>) -> GrpcFuture {
        GrpcRouter::call(self, req)
    }
}

/// A trailers-only gRPC answer `Unimplemented` with `msg`.
fn unimplemented(msg: &'static str) -> GrpcFuture {
    let resp = Status::unimplemented(msg).into_http();
    Box::pin(async move { Ok(resp) })
}

/// Whether a request is gRPC (its `content-type` is `application/grpc`,
/// maybe with a `+proto` or other suffix).
pub fn is_grpc<T>(req: &http::Request<T>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}
