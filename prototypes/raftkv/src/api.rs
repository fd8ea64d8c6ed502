//! The HTTP server: the clients' API and the Raft RPCs, on one address.
//!
//! See the crate documentation for the clients' API. A request that needs
//! the leader and reaches another node is answered `307 Temporary
//! Redirect` with the leader's URL in `Location` (`curl -L` follows it, and
//! resends the body); `503` when there is no leader, or no majority
//! answered within [`REQUEST_TIMEOUT`] — never a hang.

use crate::network::MAX_RPC_BODY;
use crate::node::{CompactLogError, Node};
use crate::types::{NodeId, RequestId, TypeConfig};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

mod lease;
mod raft;
mod range;
mod watch;
mod write;
pub use lease::{LeaseGrant, LeaseReply, MAX_LEASE_TTL_S};
pub use raftkv_wire::http::{
    MemberChange, Status, COMPACTED, COMPARE_FAILED, CREATE_HEADER, ERROR_HEADER, FAILPOINTS_ENV,
    INDEX_HEADER, LEASE_FULL, LEASE_NOT_FOUND, REVISION_HEADER, SESSION_STALE, SESSION_UNKNOWN,
    TIMED_OUT, VERSION_HEADER,
};
pub use range::{KeyValue, RangeReply, RANGE_BYTES, RANGE_LIMIT};
pub use watch::{WatchLine, MAX_WATCHERS};
pub use write::{TxnChange, TxnCompare, TxnExpect, TxnReply, TxnRequest};

/// How long a client request waits for the cluster before `503`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a membership change (`POST /members`) or a `POST /compact`
/// may take, by default, before it is answered `503` with
/// `x-raftkv-error: timeout` (`serve --admin-timeout-s`): an added
/// learner that does not catch up (its address answers nothing) is not
/// waited for forever. The change may still take effect: look at
/// `GET /status`.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(60);

/// `503` with `x-raftkv-error: timeout`: an admin call passed its
/// deadline; what it asked for may still happen.
fn timed_out(what: &str, after: Duration) -> Response {
    let mut r = text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "{what} not done within {} s; it may still take effect (see GET /status)",
            after.as_secs()
        ),
    );
    r.headers_mut().insert(
        ERROR_HEADER,
        axum::http::HeaderValue::from_static(TIMED_OUT),
    );
    r
}

/// Client requests a node serves at once, by default; beyond, `503` with
/// `Retry-After` (each may hold a body of up to [`MAX_CLIENT_BODY`]).
pub const MAX_CLIENT_REQUESTS: usize = 1024;

/// The largest request body of the clients' API (a value beyond
/// [`crate::MAX_VALUE`] but under this is refused with `400`; beyond it,
/// `413`).
pub const MAX_CLIENT_BODY: usize = 1 << 20;

/// The router of a node: `/kv/{key}`, `/status`, `/metrics`, `/members`
/// and `/raft/*`.
pub fn router(node: Arc<Node>) -> Router {
    let raft = Router::new()
        .route("/raft/append", post(raft::append))
        .route("/raft/vote", post(raft::vote))
        .route("/raft/snapshot", post(raft::snapshot))
        .route("/raft/transfer-leader", post(raft::transfer_leader))
        .layer(DefaultBodyLimit::max(MAX_RPC_BODY))
        // Before the body is read: a peer without the secret gets nothing
        // decoded.
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            raft::authenticated,
        ));
    let router = Router::new()
        .route("/kv", get(range::range).delete(range::delete_range))
        .route(
            "/kv/{*key}",
            get(read).put(write::put).delete(write::delete),
        )
        .route("/txn", post(write::txn))
        .route("/compact", post(compact))
        .route("/lease", post(lease::grant))
        .route("/lease/{id}", axum::routing::delete(lease::revoke))
        .route("/lease/{id}/keepalive", post(lease::keep_alive))
        .route("/members", post(members))
        .layer(DefaultBodyLimit::max(MAX_CLIENT_BODY))
        .layer(axum::middleware::from_fn_with_state(node.clone(), bounded))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        // Long-lived: bounded by its own limit, not the requests'.
        .route("/watch", get(watch::watch))
        .merge(raft)
        .layer(axum::middleware::from_fn_with_state(node.clone(), timed));
    #[cfg(feature = "failpoints")]
    let router = router
        .route("/debug/failpoints", get(failpoints::list))
        .route(
            "/debug/failpoints/{name}",
            axum::routing::put(failpoints::set),
        );
    router.with_state(node)
}

/// Arms the failpoints named in `spec`, `name=actions` pairs separated by
/// `;` (the form of the `fail` crate's `FAILPOINTS` variable), so a
/// failpoint is armed before the node starts Raft. A build without the
/// `failpoints` feature refuses a non-empty `spec`.
pub fn arm_failpoints(spec: &str) -> Result<(), String> {
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, actions) = part
            .split_once('=')
            .ok_or_else(|| format!("failpoint {part:?} is not NAME=ACTIONS"))?;
        arm(name.trim(), actions.trim())?;
    }
    Ok(())
}

#[cfg(feature = "failpoints")]
fn arm(name: &str, actions: &str) -> Result<(), String> {
    fail::cfg(name, actions)
}

#[cfg(not(feature = "failpoints"))]
fn arm(name: &str, actions: &str) -> Result<(), String> {
    Err(format!(
        "failpoint {name}={actions}: this build has no failpoints (feature `failpoints`)"
    ))
}

/// `GET /debug/failpoints` (the armed ones, `name=actions` a line) and
/// `PUT /debug/failpoints/{name}` with the `fail` crate's actions as body
/// (`off` disarms): only in a build with the `failpoints` feature, for
/// the fault matrix. Never in a default build.
#[cfg(feature = "failpoints")]
mod failpoints {
    use super::text;
    use axum::extract::Path;
    use axum::http::StatusCode;
    use axum::response::Response;

    pub(super) async fn list() -> String {
        fail::list()
            .into_iter()
            .map(|(name, actions)| format!("{name}={actions}\n"))
            .collect()
    }

    pub(super) async fn set(Path(name): Path<String>, body: String) -> Response {
        let actions = body.trim();
        if actions == "off" {
            fail::remove(&name);
            return text(StatusCode::OK, "off");
        }
        match fail::cfg(&name, actions) {
            Ok(()) => text(StatusCode::OK, format!("{name}={actions}")),
            Err(e) => text(StatusCode::BAD_REQUEST, e),
        }
    }
}

/// `POST /compact`: builds a snapshot of what this node applied, purges
/// its log up to it, and answers once both are done (within the node's
/// admin deadline, else `503`):
/// frees the log's space, and a member behind it (a replacement) is then
/// sent the snapshot.
async fn compact(State(node): State<Arc<Node>>) -> Response {
    match node.compact_log().await {
        Ok(upto) => text(StatusCode::OK, format!("ok, purged to {upto}")),
        Err(CompactLogError::NothingApplied) => text(StatusCode::CONFLICT, "nothing applied"),
        Err(CompactLogError::Failed(e)) => text(StatusCode::SERVICE_UNAVAILABLE, e),
        Err(CompactLogError::TimedOut(after)) => timed_out("the compaction", after),
    }
}

/// `503` with `Retry-After: 1`: the node is at a limit; the request was not
/// taken.
fn busy(msg: &str) -> Response {
    let mut r = text(StatusCode::SERVICE_UNAVAILABLE, msg);
    r.headers_mut().insert(
        header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    );
    r
}

/// Serves a client request while fewer than the node's limit are in
/// progress; `503` with `Retry-After` beyond it, before the body is read.
async fn bounded(
    State(node): State<Arc<Node>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match node.client_slots.clone().try_acquire_owned() {
        Ok(_permit) => next.run(req).await,
        Err(_) => busy("too many requests in progress"),
    }
}

/// Times every request into `raftkv_request_duration_seconds`, by method,
/// route (the pattern, not the key) and status.
async fn timed(
    State(node): State<Arc<Node>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let began = std::time::Instant::now();
    let resp = next.run(req).await;
    node.metrics
        .observe_request(&method, &route, resp.status().as_u16(), began.elapsed());
    resp
}

/// `GET /metrics`: the node's metrics in Prometheus's text format
/// ([`crate::metrics`]).
async fn metrics(State(node): State<Arc<Node>>) -> Response {
    match node.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn text(code: StatusCode, msg: impl Into<String>) -> Response {
    let mut m = msg.into();
    m.push('\n');
    (code, m).into_response()
}

// ---- Clients' API ----------------------------------------------------------

/// The query of a write: an optional request id (`?client=C&seq=S`).
#[derive(Debug, Deserialize)]
struct WriteQuery {
    client: Option<u64>,
    seq: Option<u64>,
    /// The lease a `PUT` attaches its key to.
    lease: Option<i64>,
}

impl WriteQuery {
    fn id(&self) -> Result<Option<RequestId>, Response> {
        match (self.client, self.seq) {
            (Some(client), Some(seq)) if seq > 0 => Ok(Some(RequestId { client, seq })),
            (None, None) => Ok(None),
            _ => Err(text(
                StatusCode::BAD_REQUEST,
                "a request id is client=C&seq=S, both, with S from 1",
            )),
        }
    }
}

/// The query of a read.
#[derive(Debug, Deserialize)]
struct ReadQuery {
    #[serde(default)]
    stale: bool,
    /// The revision read at (0: the newest).
    #[serde(default)]
    revision: i64,
}

fn redirect(leader: Option<&BasicNode>, uri: &Uri) -> Response {
    match leader {
        Some(n) => {
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let location = format!("http://{}{path}", n.addr);
            (
                StatusCode::TEMPORARY_REDIRECT,
                [(header::LOCATION, location.clone())],
                format!("the leader is at {location}\n"),
            )
                .into_response()
        }
        None => text(StatusCode::SERVICE_UNAVAILABLE, "no leader at the moment"),
    }
}

fn forward(f: &ForwardToLeader<TypeConfig>, uri: &Uri) -> Response {
    redirect(f.leader_node.as_ref(), uri)
}

fn key_bytes(key: &str) -> Result<Vec<u8>, Response> {
    crate::check::check_key(key.as_bytes())
        .map_err(|e| text(StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(key.as_bytes().to_vec())
}

/// The answer to a read the state machine refused: `410` for a revision
/// compacted (with `x-raftkv-error: compacted`), `400` for one to come,
/// `500` if the store failed.
fn read_refused(e: crate::machine::ReadError) -> Response {
    use crate::kv::KvError;
    use crate::machine::ReadError;
    match e {
        ReadError::Kv(KvError::Compacted { compact_revision }) => {
            let mut r = text(
                StatusCode::GONE,
                format!("{e}: the compaction is at revision {compact_revision}"),
            );
            r.headers_mut().insert(
                ERROR_HEADER,
                axum::http::HeaderValue::from_static(COMPACTED),
            );
            r
        }
        ReadError::Kv(e) => text(StatusCode::BAD_REQUEST, e.to_string()),
        ReadError::Store(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The read index of a linearizable read: leadership confirmed by a
/// majority (openraft's read index, `max(the leader's blank entry of its
/// term, committed)`). A restarted leader does not resume its old term
/// (leader restore is off, `node.rs`), so every leader's read index is at
/// or after every entry committed before its term.
async fn linearize(node: &Node, uri: &Uri) -> Result<u64, Response> {
    let late = || {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no majority answered in time",
        )
    };
    let read = match tokio::time::timeout(
        REQUEST_TIMEOUT,
        node.raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex),
    )
    .await
    {
        Err(_) => return Err(late()),
        Ok(Ok(read)) => read,
        Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f)))) => {
            return Err(forward(&f, uri))
        }
        Ok(Err(e)) => return Err(text(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    };
    Ok(read.index())
}

async fn read(
    State(node): State<Arc<Node>>,
    Path(key): Path<String>,
    Query(q): Query<ReadQuery>,
    uri: Uri,
) -> Response {
    let key = match key_bytes(&key) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let index = if q.stale {
        None
    } else {
        match linearize(&node, &uri).await {
            Ok(i) => Some(i),
            Err(r) => return r,
        }
    };
    let mut r = match node.machine.get_at(&key, q.revision) {
        Ok(Some(kv)) => {
            let etag = format!("\"{}\"", kv.mod_revision);
            let headers = [
                (header::ETAG.as_str(), etag),
                (CREATE_HEADER, kv.create_revision.to_string()),
                (VERSION_HEADER, kv.version.to_string()),
            ];
            (StatusCode::OK, headers, kv.value).into_response()
        }
        Ok(None) => text(StatusCode::NOT_FOUND, "no such key"),
        Err(e) => return read_refused(e),
    };
    if let Some(i) = index {
        r.headers_mut().insert(INDEX_HEADER, i.into());
    }
    r
}

async fn status(State(node): State<Arc<Node>>) -> Json<Status> {
    let m = node.raft.metrics().borrow_watched().clone();
    let membership = m.membership_config.membership();
    let voter_ids: BTreeSet<NodeId> = membership.voter_ids().collect();
    let (mut voters, mut learners) = (BTreeMap::new(), BTreeMap::new());
    for (id, n) in membership.nodes() {
        if voter_ids.contains(id) {
            voters.insert(*id, n.addr.clone());
        } else {
            learners.insert(*id, n.addr.clone());
        }
    }
    Json(Status {
        id: node.id,
        pid: std::process::id(),
        cluster: format!("{:016x}", node.cluster),
        state: format!("{:?}", m.state),
        leader: m.current_leader,
        term: m.current_term,
        last_log_index: m.last_log_index,
        applied_index: m.last_applied.map(|l| l.index),
        snapshot_index: m.snapshot.map(|l| l.index),
        purged_index: m.purged.map(|l| l.index),
        voters,
        learners,
        error: m.running_state.as_ref().err().map(|e| e.to_string()),
        matched: m
            .replication
            .iter()
            .flatten()
            .filter_map(|(id, l)| Some((*id, l.as_ref()?.index)))
            .collect(),
        nospace: node.space.full(),
    })
}

async fn members(State(node): State<Arc<Node>>, uri: Uri, body: Bytes) -> Response {
    let change: MemberChange = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("bad membership change: {e}"),
            )
        }
    };
    let m = node.raft.metrics().borrow_watched().clone();
    let membership = m.membership_config.membership().clone();
    let known = |id: NodeId| membership.get_node(&id).is_some();
    let voter = |id: NodeId| membership.voter_ids().any(|v| v == id);
    let bad = |msg: String| text(StatusCode::BAD_REQUEST, msg);
    let raft = node.raft.clone();
    let change = match change {
        MemberChange::Add { id, addr } => {
            if id == 0 || known(id) {
                return bad(format!("node {id} is already a member, or 0"));
            }
            Box::pin(async move { raft.add_learner(id, BasicNode { addr }, true).await })
                as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>
        }
        MemberChange::Promote { id } => {
            if !known(id) || voter(id) {
                return bad(format!("node {id} is not a learner"));
            }
            let ids: BTreeSet<NodeId> = [id].into();
            Box::pin(async move {
                raft.change_membership(ChangeMembers::AddVoterIds(ids), false)
                    .await
            })
        }
        MemberChange::Remove { id } => {
            if !known(id) {
                return bad(format!("node {id} is not a member"));
            }
            let ids: BTreeSet<NodeId> = [id].into();
            let change = if voter(id) {
                ChangeMembers::RemoveVoters(ids)
            } else {
                ChangeMembers::RemoveNodes(ids)
            };
            Box::pin(async move { raft.change_membership(change, false).await })
        }
    };
    let Ok(r) = tokio::time::timeout(node.admin_timeout, change).await else {
        return timed_out("the membership change", node.admin_timeout);
    };
    match r {
        Ok(resp) => text(
            StatusCode::OK,
            format!("ok, log index {}", resp.log_id.index),
        ),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => forward(&f, &uri),
        Err(RaftError::APIError(e)) => text(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}
