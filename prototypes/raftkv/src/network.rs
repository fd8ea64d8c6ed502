//! openraft's network over HTTP: each Raft RPC is a `POST` of its request
//! in postcard to `/raft/{append,vote,snapshot}` on the target's address,
//! answered with the postcard of `Result<response, RaftError>`.
//!
//! Every RPC carries the cluster's peer secret ([`crate::auth`]: `401` /
//! `403` without it, before the body is read), the cluster id (header
//! [`CLUSTER_HEADER`]) and the id of the node it is for
//! ([`TARGET_HEADER`], as etcd's `X-Raft-To`); a node of another cluster,
//! or another node whose address it now has, refuses it (409), so a
//! misconfigured or reused address cannot mix two clusters' logs, nor
//! hand a node a leader's message naming itself. A vote is bounded by the
//! timeout openraft gives it (the heartbeat interval); an append by that
//! plus the time its body takes at [`MIN_APPEND_RATE`]
//! ([`append_deadline`]), and its entries by [`APPEND_BUDGET`] bytes, so
//! that a follower far behind is sent appends it can take within their
//! deadline (a large one under the heartbeat's deadline would time out
//! and be resent forever). A refused connection is `Unreachable`, on which
//! openraft backs off, so a node that is down costs the others one
//! timeout, not a stall.

use crate::machine::Snapshot;
use crate::types::{NodeId, TypeConfig};
use openraft::alias::VoteOf;
use openraft::error::{
    NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The header carrying the cluster id (16 hex digits) on every Raft RPC.
pub const CLUSTER_HEADER: &str = "x-raftkv-cluster";

/// The header carrying the id (decimal) of the node a Raft RPC is for.
pub const TARGET_HEADER: &str = "x-raftkv-to";

/// The largest body a Raft RPC may have, as its receiver takes it: 64
/// MiB. A sender keeps an append to about [`APPEND_BUDGET`]; a snapshot is
/// streamed, whatever its size.
pub const MAX_RPC_BODY: usize = 64 << 20;

/// The most bytes of entries one append carries (beyond one entry, which
/// is always sent, whatever its size: at most
/// [`crate::propose::MAX_BATCH_BYTES`] and a command). The rest of a
/// batch is reported to openraft as a partial success, and sent next; the
/// leader's log reads for replication stop at it too
/// ([`crate::logstore::BoundedLog`]).
pub const APPEND_BUDGET: usize = 8 << 20;

/// The slowest a follower is assumed to take an append's body in, write
/// and flush it: an append's deadline grows by its body's size at this
/// rate ([`append_deadline`]).
pub use raftkv_wire::limits::MIN_APPEND_RATE;

/// An append's deadline: `base` (openraft's, the heartbeat interval) and
/// the time its `body` bytes take at [`MIN_APPEND_RATE`] — about 2 s more
/// for a full [`APPEND_BUDGET`], a millisecond for a 4 KiB one.
pub fn append_deadline(base: Duration, body: usize) -> Duration {
    let extra_ms = (body as u64).saturating_mul(1000) / MIN_APPEND_RATE;
    base.saturating_add(Duration::from_millis(extra_ms))
}

/// The bytes an entry takes in an append's body (its postcard encoding).
pub fn entry_bytes(e: &openraft::alias::EntryOf<TypeConfig>) -> usize {
    postcard::experimental::serialized_size(e).unwrap_or(usize::MAX)
}

/// How many of `entries`, from the first, fit in `budget` bytes: at
/// least one (if there is one).
pub fn within_budget(entries: &[openraft::alias::EntryOf<TypeConfig>], budget: usize) -> usize {
    let mut bytes = 0usize;
    for (n, e) in entries.iter().enumerate() {
        bytes = bytes.saturating_add(entry_bytes(e));
        if bytes > budget {
            return n.max(1);
        }
    }
    entries.len()
}

/// Bytes read from a snapshot file per piece of the streamed body.
const SNAPSHOT_PIECE: usize = 1 << 20;

/// Makes a [`Peer`] per target node; they share one connection pool.
#[derive(Debug, Clone)]
pub struct Network {
    client: reqwest::Client,
    cluster: u64,
    /// The `Authorization` value of every RPC, if the cluster has a
    /// secret.
    auth: Option<Arc<str>>,
    /// Where appends' body sizes are noted.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Where this node dials a peer instead of the address in the
    /// membership (`raftkv serve --peer-addr`): a proxy in front of it, so
    /// a fault test can cut or slow one direction of one link.
    dial: Arc<BTreeMap<NodeId, String>>,
}

impl Network {
    /// A network for the cluster `cluster`, its RPCs carrying `secret`,
    /// dialing the peers in `dial` at the addresses given there instead of
    /// their membership addresses.
    pub fn new(
        cluster: u64,
        secret: Option<&crate::auth::PeerSecret>,
        dial: BTreeMap<NodeId, String>,
    ) -> Result<Network, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .pool_max_idle_per_host(4)
            // Below the servers' idle deadline (`crate::server`): a
            // connection is not reused just as its server closes it.
            .pool_idle_timeout(crate::server::IDLE_TIMEOUT / 2)
            .build()?;
        Ok(Network {
            client,
            cluster,
            auth: secret.map(|s| s.header_value().into()),
            metrics: None,
            dial: Arc::new(dial),
        })
    }

    /// Notes the size of each append body sent in `metrics`.
    pub fn with_metrics(self, metrics: Arc<crate::metrics::Metrics>) -> Network {
        Network {
            metrics: Some(metrics),
            ..self
        }
    }
}

/// The connection to one target node.
#[derive(Debug)]
pub struct Peer {
    client: reqwest::Client,
    cluster: u64,
    auth: Option<Arc<str>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    target: NodeId,
    base: String,
}

#[derive(Debug)]
struct BadStatus(String);

impl std::fmt::Display for BadStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadStatus {}

impl Peer {
    async fn call<Req, Resp, E>(&self, path: &str, req: &Req, option: &RPCOption) -> Rpc<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = postcard::to_stdvec(req).map_err(|e| net(&e))?;
        self.send(path, reqwest::Body::from(body), option.hard_ttl())
            .await
    }

    /// Posts `body` to `path`, within `ttl`; decodes the answer.
    async fn send<Resp, E>(&self, path: &str, body: reqwest::Body, ttl: Duration) -> Rpc<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let mut post = self.client.post(format!("{}{path}", self.base));
        if let Some(auth) = &self.auth {
            post = post.header(crate::auth::AUTH_HEADER, &**auth);
        }
        let sent = post
            .header(CLUSTER_HEADER, format!("{:016x}", self.cluster))
            .header(TARGET_HEADER, self.target.to_string())
            .timeout(ttl)
            .body(body)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => return Err(net(&e)),
        };
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| net(&e))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
            return Err(net(&BadStatus(format!(
                "node {} answered {status}: {text}",
                self.target
            ))));
        }
        let r: Result<Resp, RaftError<TypeConfig, E>> =
            postcard::from_bytes(&bytes).map_err(|e| net(&e))?;
        r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// A network error carrying `e`'s message.
fn net<E: std::error::Error>(
    e: &dyn std::error::Error,
) -> RPCError<TypeConfig, RaftError<TypeConfig, E>> {
    RPCError::Network(NetworkError::new(&BadStatus(e.to_string())))
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            client: self.client.clone(),
            cluster: self.cluster,
            auth: self.auth.clone(),
            metrics: self.metrics.clone(),
            target,
            base: format!("http://{}", self.dial.get(&target).unwrap_or(&node.addr)),
        }
    }
}

type Rpc<T, E = openraft::error::Infallible> =
    Result<T, RPCError<TypeConfig, RaftError<TypeConfig, E>>>;

/// An RPC error as openraft's network traits take it (a remote Raft
/// error is the remote's answer, not a failure of the network).
fn flatten<T>(r: Rpc<T>) -> Result<T, RPCError<TypeConfig>> {
    r.map_err(|e| match e {
        RPCError::Timeout(t) => RPCError::Timeout(t),
        RPCError::Unreachable(u) => RPCError::Unreachable(u),
        RPCError::Network(n) => RPCError::Network(n),
        RPCError::RemoteError(r) => RPCError::Network(NetworkError::new(&BadStatus(format!(
            "node {}: {}",
            r.target, r.source
        )))),
    })
}

/// A request that could not be encoded, as openraft's network error.
fn encode_error(e: &postcard::Error) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&BadStatus(e.to_string())))
}

/// The header of a streamed snapshot: the leader's vote and the
/// snapshot's meta, before the snapshot file's bytes.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct SnapshotHead {
    /// The sender's vote.
    pub vote: VoteOf<TypeConfig>,
    /// The snapshot's meta.
    pub meta: crate::machine::SnapshotMeta,
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = crate::machine::SnapshotFile;

    /// An append sends the first of its entries that fit in
    /// [`APPEND_BUDGET`] bytes (one at least), under [`append_deadline`]
    /// for its body, and reports that part as a partial success:
    /// openraft sends the rest next.
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let all = rpc.entries.len();
        rpc.entries
            .truncate(within_budget(&rpc.entries, APPEND_BUDGET));
        let body = postcard::to_stdvec(&rpc).map_err(|e| encode_error(&e))?;
        let last = rpc.entries.last().map(|e| e.log_id);
        let ttl = append_deadline(option.hard_ttl(), body.len());
        if let Some(m) = &self.metrics {
            m.observe_append_body(body.len());
        }
        let r: Rpc<AppendEntriesResponse<TypeConfig>> = self
            .send("/raft/append", reqwest::Body::from(body), ttl)
            .await;
        match flatten(r)? {
            AppendEntriesResponse::Success if rpc.entries.len() < all => {
                Ok(AppendEntriesResponse::PartialSuccess(last))
            }
            r => Ok(r),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        flatten(self.call("/raft/vote", &rpc, &option).await)
    }

    /// Asks the target to campaign now (the leader hands over: etcd's
    /// `MoveLeader`, `grpc/maintenance.rs`).
    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        flatten(self.call("/raft/transfer-leader", &rpc, &option).await)
    }

    /// Streams the snapshot file in one request (its head first: the vote
    /// and the meta), read a piece at a time: memory holds a piece, at
    /// any snapshot size.
    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let head = SnapshotHead {
            vote,
            meta: snapshot.meta.clone(),
        };
        let head = postcard::to_stdvec(&head).map_err(|e| NetworkError::new(&e))?;
        let len = u32::try_from(head.len()).map_err(|e| NetworkError::new(&e))?;
        let mut first = len.to_le_bytes().to_vec();
        first.extend_from_slice(&head);
        let file = snapshot.snapshot;
        let pieces = futures_util::stream::unfold(
            (Some(first), file, 0u64),
            |(first, file, pos)| async move {
                if let Some(f) = first {
                    return Some((Ok::<_, std::io::Error>(f), (None, file, pos)));
                }
                let (r, file) = tokio::task::spawn_blocking(move || {
                    let r = file.read_piece(pos, SNAPSHOT_PIECE);
                    (r, file)
                })
                .await
                .ok()?;
                match r {
                    Ok(b) if b.is_empty() => None,
                    Ok(b) => {
                        let n = b.len() as u64;
                        Some((Ok(b), (None, file, pos + n)))
                    }
                    Err(e) => Some((Err(e), (None, file, u64::MAX))),
                }
            },
        );
        let body = reqwest::Body::wrap_stream(pieces);
        // A snapshot takes as long as it takes: the soft TTL per piece is
        // not a bound on the whole; a closed replication cancels it.
        let ttl = option.hard_ttl().max(Duration::from_secs(600));
        let send = self.send::<SnapshotResponse<TypeConfig>, openraft::error::Infallible>(
            "/raft/snapshot",
            body,
            ttl,
        );
        let r = tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = send => match r {
                Ok(resp) => Ok(resp),
                Err(RPCError::Unreachable(u)) => Err(StreamingError::Unreachable(u)),
                Err(RPCError::Timeout(t)) => Err(StreamingError::Timeout(t)),
                Err(RPCError::Network(n)) => Err(StreamingError::Network(n)),
                Err(RPCError::RemoteError(r)) => Err(StreamingError::Network(NetworkError::new(
                    &BadStatus(format!("node {}: {}", r.target, r.source)),
                ))),
            },
        };
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Batch, Command};
    use journal_core::sync::atomic::{AtomicUsize, Ordering};
    use openraft::impls::leader_id_adv::LeaderId;
    use openraft::{EntryPayload, LogId, Vote};

    /// A stand-in follower that accepts any append after `delay`, and
    /// keeps the body size of the last (and its entry count, without a
    /// delay).
    async fn follower(delay: Duration) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (got, size) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (seen, sized) = (got.clone(), size.clone());
        let app = axum::Router::new()
            .route(
                "/raft/append",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let (seen, sized) = (seen.clone(), sized.clone());
                    async move {
                        tokio::time::sleep(delay).await;
                        // (A slow follower's answer is not held up by
                        // decoding, slow in a debug build.)
                        if delay.is_zero() {
                            let rpc: AppendEntriesRequest<TypeConfig> =
                                postcard::from_bytes(&body).unwrap();
                            seen.store(rpc.entries.len(), Ordering::SeqCst);
                        }
                        sized.store(body.len(), Ordering::SeqCst);
                        let r: Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>> =
                            Ok(AppendEntriesResponse::Success);
                        postcard::to_stdvec(&r).unwrap()
                    }
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::max(MAX_RPC_BODY));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (addr, got, size)
    }

    fn entries(n: u64, value: usize) -> AppendEntriesRequest<TypeConfig> {
        let big = |index| openraft::Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Normal(Batch(vec![Command::put(
                b"k".to_vec(),
                vec![7; value],
                None,
            )])),
        };
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: (1..=n).map(big).collect(),
        }
    }

    #[tokio::test]
    async fn an_append_over_the_byte_budget_sends_a_part_and_reports_it() {
        let (addr, got, size) = follower(Duration::ZERO).await;
        let mut net = Network::new(1, None, BTreeMap::new()).unwrap();
        let mut peer = net.new_client(2, &BasicNode { addr }).await;
        // Ten entries of a third of the budget each, the whole far under
        // the receiver's limit: three go.
        let rpc = entries(10, APPEND_BUDGET / 3 - 64);
        let option = RPCOption::new(Duration::from_secs(10));
        match peer.append_entries(rpc, option).await {
            Ok(AppendEntriesResponse::PartialSuccess(Some(l))) => assert_eq!(l.index, 3),
            other => panic!("not a partial success up to entry 3: {other:?}"),
        }
        assert_eq!(got.load(Ordering::SeqCst), 3, "three entries sent");
        assert!(size.load(Ordering::SeqCst) <= APPEND_BUDGET + 256);
        // One entry over the budget goes alone.
        let rpc = entries(2, APPEND_BUDGET + 1);
        let option = RPCOption::new(Duration::from_secs(10));
        match peer.append_entries(rpc, option).await {
            Ok(AppendEntriesResponse::PartialSuccess(Some(l))) => assert_eq!(l.index, 1),
            other => panic!("not a partial success up to entry 1: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_large_append_gets_the_time_its_body_takes() {
        // A follower that takes 400 ms over each append: a 4 MiB one
        // under the heartbeat's 100 ms deadline would time out, forever.
        let (addr, _, size) = follower(Duration::from_millis(400)).await;
        let mut net = Network::new(1, None, BTreeMap::new()).unwrap();
        let mut peer = net.new_client(2, &BasicNode { addr }).await;
        let rpc = entries(1, 4 << 20);
        let option = RPCOption::new(Duration::from_millis(100));
        match peer.append_entries(rpc, option).await {
            Ok(AppendEntriesResponse::Success) => {}
            other => panic!("not a success: {other:?}"),
        }
        assert!(size.load(Ordering::SeqCst) > 4 << 20);
        assert_eq!(
            append_deadline(Duration::from_millis(100), 4 << 20),
            Duration::from_millis(1100)
        );
        // A heartbeat keeps its deadline.
        assert_eq!(
            append_deadline(Duration::from_millis(100), 100),
            Duration::from_millis(100)
        );
    }
}
