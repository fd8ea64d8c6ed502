//! etcd's JSON gateway: the gRPC calls as `POST /v3/…` with JSON bodies,
//! over the same service code (one code path under both APIs).
//!
//! As etcd's grpc-gateway: the body is the request message in protobuf's
//! JSON mapping (bytes in base64, 64-bit integers as strings or numbers,
//! enums by name or number, field names as in the `.proto` or in
//! lowerCamelCase; an empty body is the empty message), the answer the
//! response message so (the `.proto` field names, fields at their zero
//! value left out). An error is the gRPC status as JSON — `{"error",
//! "code", "message"}` — under grpc-gateway's HTTP status for its code
//! (400, 404, 429, 501, 503, 504, …). The streams (`/v3/watch`,
//! `/v3/lease/keepalive`) take one request message or several, one per
//! line, and answer one `{"result": …}` line per response, until the
//! client goes away; `/v3/maintenance/snapshot` answers one line per
//! piece.
//!
//! | path | call |
//! |---|---|
//! | `/v3/kv/range`, `/v3/kv/put`, `/v3/kv/deleterange`, `/v3/kv/txn`, `/v3/kv/compaction` | KV |
//! | `/v3/watch` | Watch (stream) |
//! | `/v3/lease/grant`, `/v3/lease/revoke` (`/v3/kv/lease/revoke`), `/v3/lease/keepalive` (stream), `/v3/lease/timetolive` (`/v3/kv/lease/timetolive`), `/v3/lease/leases` (`/v3/kv/lease/leases`) | Lease |
//! | `/v3/cluster/member/{add,remove,update,list,promote}` | Cluster |
//! | `/v3/maintenance/{alarm,status,defragment,hash,snapshot,transfer-leadership}` | Maintenance (`hash` is `HashKV`, whose answer holds `Hash`'s) |
//! | `/v3/auth/…` | `501`: Auth is not served |

use super::cluster::ClusterService;
use super::kv::KvService;
use super::lease::LeaseService;
use super::maintenance::MaintenanceService;
use super::watch::WatchService;
use super::Etcd;
use crate::node::Node;
use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use etcd_api::etcdserverpb as pb;
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use tonic::{Code, Status};

/// grpc-gateway's HTTP status for a gRPC code.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The JSON of an error.
fn error_json(s: &Status) -> serde_json::Value {
    serde_json::json!({
        "error": s.message(),
        "code": s.code() as i32,
        "message": s.message(),
    })
}

/// A status as the gateway answers it.
pub fn error(s: &Status) -> Response {
    (http_status(s.code()), axum::Json(error_json(s))).into_response()
}

/// The request message of a body (empty: the default message).
fn parse<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        Status::invalid_argument(format!("the request body is not the message's JSON: {e}"))
    })
}

/// The request messages of a stream's body: one or more, a line each
/// (or one over several lines).
fn parse_many<T: DeserializeOwned + Default>(body: &[u8]) -> Result<Vec<T>, Status> {
    let bad = |e: serde_json::Error| {
        Status::invalid_argument(format!(
            "a request of the body is not the message's JSON: {e}"
        ))
    };
    let mut out = Vec::new();
    for v in serde_json::Deserializer::from_slice(body).into_iter::<T>() {
        out.push(v.map_err(bad)?);
    }
    if out.is_empty() {
        out.push(T::default());
    }
    Ok(out)
}

/// Answers a unary call.
async fn unary<Req, Resp, Fut>(
    body: Bytes,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    Fut: Future<Output = Result<Resp, Status>>,
{
    let req = match parse::<Req>(&body) {
        Ok(r) => r,
        Err(s) => return error(&s),
    };
    match call(tonic::Request::new(req)).await {
        Ok(resp) => axum::Json(resp).into_response(),
        Err(s) => error(&s),
    }
}

/// Answers a stream: a `{"result": …}` line per message, an `{"error": …}`
/// line if it fails.
fn lines<T: Serialize + Send + 'static>(
    stream: impl Stream<Item = Result<T, Status>> + Send + 'static,
) -> Response {
    let body = stream.map(|r| {
        let v = match r {
            Ok(m) => serde_json::json!({ "result": m }),
            Err(s) => serde_json::json!({ "error": error_json(&s) }),
        };
        let mut line = serde_json::to_vec(&v).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// The requests of a stream's body, then nothing more until the answer
/// ends (the client's side stays open, as a gRPC client's does).
fn held_open<T: Send + 'static>(
    msgs: Vec<T>,
) -> impl Stream<Item = Result<T, Status>> + Send + Unpin {
    futures_util::stream::iter(msgs.into_iter().map(Ok)).chain(futures_util::stream::pending())
}

/// The gateway's routes, on the services of `etcd`.
pub fn routes(etcd: Arc<Etcd<Node>>) -> Router {
    let mut r = Router::new();
    macro_rules! route {
        ($path:expr, $svc:ident, $req:ty, |$s:ident, $q:ident| $call:expr) => {{
            let etcd = etcd.clone();
            r = r.route(
                $path,
                post(move |body: Bytes| {
                    let $s = $svc(etcd.clone());
                    async move {
                        unary(body, |$q: tonic::Request<$req>| async move { $call.await }).await
                    }
                }),
            );
        }};
    }
    route!("/v3/kv/range", KvService, pb::RangeRequest, |s, q| s
        .range(q));
    route!("/v3/kv/put", KvService, pb::PutRequest, |s, q| s.put(q));
    route!(
        "/v3/kv/deleterange",
        KvService,
        pb::DeleteRangeRequest,
        |s, q| s.delete_range(q)
    );
    route!("/v3/kv/txn", KvService, pb::TxnRequest, |s, q| s.txn(q));
    route!(
        "/v3/kv/compaction",
        KvService,
        pb::CompactionRequest,
        |s, q| s.compact(q)
    );
    route!(
        "/v3/lease/grant",
        LeaseService,
        pb::LeaseGrantRequest,
        |s, q| s.grant(q)
    );
    for path in ["/v3/lease/revoke", "/v3/kv/lease/revoke"] {
        route!(path, LeaseService, pb::LeaseRevokeRequest, |s, q| s
            .revoke(q));
    }
    for path in ["/v3/lease/timetolive", "/v3/kv/lease/timetolive"] {
        route!(path, LeaseService, pb::LeaseTimeToLiveRequest, |s, q| s
            .time_to_live(q));
    }
    for path in ["/v3/lease/leases", "/v3/kv/lease/leases"] {
        route!(path, LeaseService, pb::LeaseLeasesRequest, |s, q| s
            .leases(q));
    }
    route!(
        "/v3/cluster/member/add",
        ClusterService,
        pb::MemberAddRequest,
        |s, q| s.add(q)
    );
    route!(
        "/v3/cluster/member/remove",
        ClusterService,
        pb::MemberRemoveRequest,
        |s, q| s.remove(q)
    );
    route!(
        "/v3/cluster/member/update",
        ClusterService,
        pb::MemberUpdateRequest,
        |s, q| s.update(q)
    );
    route!(
        "/v3/cluster/member/list",
        ClusterService,
        pb::MemberListRequest,
        |s, q| s.list(q)
    );
    route!(
        "/v3/cluster/member/promote",
        ClusterService,
        pb::MemberPromoteRequest,
        |s, q| s.promote(q)
    );
    route!(
        "/v3/maintenance/alarm",
        MaintenanceService,
        pb::AlarmRequest,
        |s, q| s.alarm(q)
    );
    route!(
        "/v3/maintenance/status",
        MaintenanceService,
        pb::StatusRequest,
        |s, q| s.status(q)
    );
    route!(
        "/v3/maintenance/defragment",
        MaintenanceService,
        pb::DefragmentRequest,
        |s, _q| s.defragment()
    );
    for path in ["/v3/maintenance/hash", "/v3/maintenance/hashkv"] {
        route!(path, MaintenanceService, pb::HashKvRequest, |s, q| s
            .hash_kv(q.into_inner().revision));
    }
    route!(
        "/v3/maintenance/transfer-leadership",
        MaintenanceService,
        pb::MoveLeaderRequest,
        |s, q| s.move_leader(q)
    );
    let e = etcd.clone();
    r = r.route(
        "/v3/watch",
        post(move |body: Bytes| {
            let s = WatchService(e.clone());
            async move {
                match parse_many::<pb::WatchRequest>(&body) {
                    Ok(msgs) => match s.open_stream(held_open(msgs)).await {
                        Ok(out) => lines(out),
                        Err(st) => error(&st),
                    },
                    Err(st) => error(&st),
                }
            }
        }),
    );
    let e = etcd.clone();
    r = r.route(
        "/v3/lease/keepalive",
        post(move |body: Bytes| {
            let s = LeaseService(e.clone());
            async move {
                match parse_many::<pb::LeaseKeepAliveRequest>(&body) {
                    Ok(msgs) => match s.keep_alive_local(held_open(msgs)).await {
                        Ok(out) => lines(out),
                        Err(st) => error(&st),
                    },
                    Err(st) => error(&st),
                }
            }
        }),
    );
    let e = etcd;
    r = r.route(
        "/v3/maintenance/snapshot",
        post(move || {
            let s = MaintenanceService(e.clone());
            async move {
                match s.snapshot().await {
                    Ok(out) => lines(out),
                    Err(st) => error(&st),
                }
            }
        }),
    );
    r.route(
        "/v3/auth/{*call}",
        post(|| async { error(&Status::unimplemented(super::AUTH_UNIMPLEMENTED)) }),
    )
}
