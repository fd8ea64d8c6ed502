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
use axum::routing::{post, MethodRouter};
use axum::Router;
use etcd_api::etcdserverpb as pb;
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use tonic::{Code, Status};

/// The largest body: etcd's largest request, in base64, and its JSON.
pub const MAX_BODY: usize = crate::kv::MAX_REQUEST_BYTES / 3 * 4 + (64 << 10);

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

/// A unary call's route: the service `make` makes on `etcd`, `call`ed
/// with the body's message.
fn unary_route<S, Req, Resp, F, Fut>(
    etcd: &Arc<Etcd<Node>>,
    make: fn(Arc<Etcd<Node>>) -> S,
    call: F,
) -> MethodRouter
where
    S: Send + 'static,
    Req: DeserializeOwned + Default + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(S, tonic::Request<Req>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    let etcd = etcd.clone();
    post(move |body: Bytes| {
        let s = make(etcd.clone());
        let call = call.clone();
        async move { unary(body, move |q| call(s, q)).await }
    })
}

/// The KV calls' routes.
fn kv_routes(etcd: &Arc<Etcd<Node>>) -> Router {
    let kv = KvService;
    Router::new()
        .route(
            "/v3/kv/range",
            unary_route(etcd, kv, |s, q| async move { s.range(q).await }),
        )
        .route(
            "/v3/kv/put",
            unary_route(etcd, kv, |s, q| async move { s.put(q).await }),
        )
        .route(
            "/v3/kv/deleterange",
            unary_route(etcd, kv, |s, q| async move { s.delete_range(q).await }),
        )
        .route(
            "/v3/kv/txn",
            unary_route(etcd, kv, |s, q| async move { s.txn(q).await }),
        )
        .route(
            "/v3/kv/compaction",
            unary_route(etcd, kv, |s, q| async move { s.compact(q).await }),
        )
}

/// The Lease calls' routes (the keep-alive stream's too).
fn lease_routes(etcd: &Arc<Etcd<Node>>) -> Router {
    let l = LeaseService;
    let mut r = Router::new().route(
        "/v3/lease/grant",
        unary_route(etcd, l, |s, q| async move { s.grant(q).await }),
    );
    for prefix in ["/v3/lease", "/v3/kv/lease"] {
        r = r
            .route(
                &format!("{prefix}/revoke"),
                unary_route(etcd, l, |s, q| async move { s.revoke(q).await }),
            )
            .route(
                &format!("{prefix}/timetolive"),
                unary_route(etcd, l, |s, q| async move { s.time_to_live(q).await }),
            )
            .route(
                &format!("{prefix}/leases"),
                unary_route(etcd, l, |s, q| async move { s.leases(q).await }),
            );
    }
    r
}

/// The keep-alive stream's route.
fn lease_stream_route(etcd: &Arc<Etcd<Node>>) -> Router {
    let e = etcd.clone();
    Router::new().route(
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
    )
}

/// The Cluster calls' routes.
fn cluster_routes(etcd: &Arc<Etcd<Node>>) -> Router {
    let c = ClusterService;
    Router::new()
        .route(
            "/v3/cluster/member/add",
            unary_route(etcd, c, |s, q| async move { s.add(q).await }),
        )
        .route(
            "/v3/cluster/member/remove",
            unary_route(etcd, c, |s, q| async move { s.remove(q).await }),
        )
        .route(
            "/v3/cluster/member/update",
            unary_route(etcd, c, |s, q| async move { s.update(q).await }),
        )
        .route(
            "/v3/cluster/member/list",
            unary_route(etcd, c, |s, q| async move { s.list(q).await }),
        )
        .route(
            "/v3/cluster/member/promote",
            unary_route(etcd, c, |s, q| async move { s.promote(q).await }),
        )
}

/// The Maintenance calls' routes (the snapshot stream's too).
fn maintenance_routes(etcd: &Arc<Etcd<Node>>) -> Router {
    let m = MaintenanceService;
    let mut r = Router::new()
        .route(
            "/v3/maintenance/alarm",
            unary_route(etcd, m, |s, q| async move { s.alarm(q).await }),
        )
        .route(
            "/v3/maintenance/status",
            unary_route(etcd, m, |s, q| async move { s.status(q).await }),
        )
        .route(
            "/v3/maintenance/defragment",
            unary_route(
                etcd,
                m,
                |s, _: tonic::Request<pb::DefragmentRequest>| async move { s.defragment().await },
            ),
        )
        .route(
            "/v3/maintenance/transfer-leadership",
            unary_route(etcd, m, |s, q| async move { s.move_leader(q).await }),
        );
    for path in ["/v3/maintenance/hash", "/v3/maintenance/hashkv"] {
        r = r.route(
            path,
            unary_route(
                etcd,
                m,
                |s, q: tonic::Request<pb::HashKvRequest>| async move {
                    s.hash_kv(q.into_inner().revision).await
                },
            ),
        );
    }
    r
}

/// The snapshot stream's route.
fn snapshot_route(etcd: &Arc<Etcd<Node>>) -> Router {
    let e = etcd.clone();
    Router::new().route(
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
    )
}

/// The gateway's routes, on the services of `etcd`.
pub fn routes(etcd: Arc<Etcd<Node>>) -> Router {
    let e = etcd.clone();
    let watch = post(move |body: Bytes| {
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
    });
    // The unary calls hold one of the node's client permits, as the JSON
    // API's requests do; a body may carry a value of etcd's largest
    // request in base64.
    let slots = etcd.node.client_slots.clone();
    let bounded = axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let slots = slots.clone();
            async move {
                match slots.try_acquire_owned() {
                    Ok(_permit) => next.run(req).await,
                    Err(_) => error(&Status::resource_exhausted("etcdserver: too many requests")),
                }
            }
        },
    );
    let unary = Router::new()
        .merge(kv_routes(&etcd))
        .merge(lease_routes(&etcd))
        .merge(cluster_routes(&etcd))
        .merge(maintenance_routes(&etcd))
        .layer(bounded);
    Router::new()
        .merge(unary)
        .merge(lease_stream_route(&etcd))
        .merge(snapshot_route(&etcd))
        .route("/v3/watch", watch)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .route(
            "/v3/auth/{*call}",
            post(|| async { error(&Status::unimplemented(super::AUTH_UNIMPLEMENTED)) }),
        )
}
