//! Leases: `POST /lease` grants one, `POST /lease/{id}/keepalive` renews
//! it, `DELETE /lease/{id}` revokes it (its keys deleted); `PUT
//! /kv/{key}?lease={id}` attaches a key (see the crate docs).

use super::write::{answer, decide};
use super::{text, WriteQuery, INDEX_HEADER};
use crate::node::Node;
use crate::types::Command;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The longest lease, seconds (a week).
pub const MAX_LEASE_TTL_S: u64 = 7 * 24 * 3600;

/// The body of `POST /lease`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// Its time-to-live, seconds (1 to a week).
    pub ttl_s: u64,
}

/// What `POST /lease` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseReply {
    /// The lease's id (for `?lease=` and `/lease/{id}`).
    pub id: i64,
    /// Its time-to-live, seconds.
    pub ttl_s: u64,
}

/// `POST /lease` with `{"ttl_s": N}`: `200` and a [`LeaseReply`] once
/// granted.
pub(super) async fn grant(
    State(node): State<Arc<Node>>,
    Query(q): Query<WriteQuery>,
    uri: Uri,
    body: Bytes,
) -> Response {
    let id = match q.id() {
        Ok(id) => id,
        Err(r) => return r,
    };
    let ttl_s = match serde_json::from_slice::<LeaseGrant>(&body) {
        Ok(g) if (1..=MAX_LEASE_TTL_S).contains(&g.ttl_s) => g.ttl_s,
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("a lease is {{\"ttl_s\": N}}, N from 1 to {MAX_LEASE_TTL_S}"),
            )
        }
    };
    let cmd = Command::LeaseGrant {
        lease: 0,
        ttl_s: ttl_s as i64,
        id,
    };
    match decide(&node, cmd, &uri).await {
        Ok(d) => {
            let reply = LeaseReply { id: d.lease, ttl_s };
            let mut r = Json(reply).into_response();
            r.headers_mut().insert(INDEX_HEADER, d.index.into());
            r
        }
        Err(r) => r,
    }
}

/// Proposes the lease command `cmd` makes of the request id and answers
/// as a write: `200`, or `404` if the lease is gone.
async fn lease_write(
    node: &Node,
    q: &WriteQuery,
    uri: &Uri,
    cmd: impl FnOnce(Option<crate::RequestId>) -> Command,
) -> Response {
    match q.id() {
        Ok(id) => answer(decide(node, cmd(id), uri).await),
        Err(r) => r,
    }
}

/// `POST /lease/{id}/keepalive`: `200` and a [`LeaseReply`] once renewed
/// for its time-to-live from the request's arrival; `404` if the lease is
/// gone. The leader's alone, not a log entry ([`crate::lessor`]): once it
/// confirmed its leadership after the request arrived (a heartbeat
/// round), it moves the lease's deadline. Only a lease whose remaining
/// time-to-live was checkpointed has its keep-alive written to the log.
pub(super) async fn keep_alive(
    State(node): State<Arc<Node>>,
    Path(lease): Path<i64>,
    Query(q): Query<WriteQuery>,
    uri: Uri,
) -> Response {
    let arrived = tokio::time::Instant::now();
    let id = match q.id() {
        Ok(id) => id,
        Err(r) => return r,
    };
    if let Err(r) = super::linearize(&node, &uri).await {
        return r;
    }
    // (One at a time with the leader's checkpoints.)
    let _turn = node.lessor.turn().await;
    let Some(held) = node.machine.lease(lease) else {
        let mut r = text(
            StatusCode::NOT_FOUND,
            "no such lease (never granted, expired or revoked)",
        );
        r.headers_mut().insert(
            super::ERROR_HEADER,
            axum::http::HeaderValue::from_static(super::LEASE_NOT_FOUND),
        );
        return r;
    };
    node.lessor.renew(lease, held.ttl_ms, arrived);
    if held.remaining_ms.is_some() {
        let cmd = Command::LeaseKeepAlive { lease, id };
        if let Err(r) = decide(&node, cmd, &uri).await {
            return r;
        }
    }
    Json(LeaseReply {
        id: lease,
        ttl_s: held.ttl_ms / 1000,
    })
    .into_response()
}

/// `DELETE /lease/{id}`: `200` once revoked and its keys deleted; `404`
/// if the lease is gone.
pub(super) async fn revoke(
    State(node): State<Arc<Node>>,
    Path(lease): Path<i64>,
    Query(q): Query<WriteQuery>,
    uri: Uri,
) -> Response {
    lease_write(&node, &q, &uri, |id| Command::LeaseRevoke { lease, id }).await
}
