//! Ranges: `GET /kv?prefix=P[&start=K]` and `GET /kv?start=A[&end=B]`
//! read one, `DELETE` with the same bounds removes it (see the crate
//! docs).

use super::write::write;
use super::{linearize, read_refused, text, WriteQuery, INDEX_HEADER};
use crate::node::Node;
use crate::types::Command;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Pairs a range read answers at most, by default and at most.
pub const RANGE_LIMIT: (usize, usize) = (1_000, 10_000);
/// Bytes of keys and values a range read answers, about, at most (past
/// its first pair).
pub const RANGE_BYTES: usize = 4 << 20;

/// The query of a range read or delete.
#[derive(Debug, Deserialize)]
pub(super) struct RangeQuery {
    prefix: Option<String>,
    start: Option<String>,
    end: Option<String>,
    limit: Option<usize>,
    #[serde(default)]
    stale: bool,
    /// The revision read at (0: the newest).
    #[serde(default)]
    revision: i64,
    client: Option<u64>,
    seq: Option<u64>,
}

/// A pair in a range read's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value, in base64 (standard alphabet, padded).
    pub value: String,
    /// The revision the key was created at.
    pub create_revision: i64,
    /// The revision it was last changed at.
    pub mod_revision: i64,
    /// Its changes since it was created, from 1.
    pub version: i64,
    /// Its lease (0: none).
    pub lease: i64,
}

/// What `GET /kv?…` answers (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeReply {
    /// The applied index when the page was read (also in
    /// `x-raftkv-index`).
    pub index: u64,
    /// The revision the page was read at: ask the next pages at it
    /// (`revision=`) for one snapshot of the whole range.
    pub revision: i64,
    /// The pairs, in key order.
    pub kvs: Vec<KeyValue>,
    /// If the range goes on: the key to ask from next (`start=`).
    pub next: Option<String>,
}

/// The range a query names, as etcd's `(key, range_end)`, and where in
/// it a page starts.
fn bounds(q: &RangeQuery) -> Option<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    match (&q.prefix, &q.start, &q.end) {
        // `start` within a prefix: the next page of it.
        (Some(p), a, None) => {
            let start = a.as_ref().filter(|a| a.as_str() > p.as_str()).unwrap_or(p);
            let p = p.clone().into_bytes();
            let end = crate::kv::prefix_end(&p);
            Some((p, end, start.clone().into_bytes()))
        }
        (None, Some(a), b) => {
            let end = b.clone().map_or(vec![0], String::into_bytes);
            Some((a.clone().into_bytes(), end, a.clone().into_bytes()))
        }
        _ => None,
    }
}

/// `DELETE /kv?prefix=P` or `DELETE /kv?start=A[&end=B]` (with an
/// optional request id): removes every key of the range, atomically with
/// the writes of its entry, as one command in the log. An empty prefix
/// or start (every key) is refused: deleting everything should not be a
/// typo away.
pub(super) async fn delete_range(
    State(node): State<Arc<Node>>,
    Query(q): Query<RangeQuery>,
    uri: Uri,
) -> Response {
    let id = match (WriteQuery {
        client: q.client,
        seq: q.seq,
        lease: None,
    })
    .id()
    {
        Ok(id) => id,
        Err(r) => return r,
    };
    let Some((key, end, _)) = bounds(&q).filter(|(k, _, _)| !k.is_empty()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "a range to delete is a non-empty prefix=P, or start=A with an optional end=B",
        );
    };
    write(&node, Command::delete_range(key, end, id), &uri).await
}

/// `GET /kv?prefix=P[&start=K]` or `GET /kv?start=A[&end=B]`, `limit=N`,
/// `stale=true`: a page of the keys in the range, from one snapshot of the
/// state machine, linearizable unless stale (see the crate docs).
pub(super) async fn range(
    State(node): State<Arc<Node>>,
    Query(q): Query<RangeQuery>,
    uri: Uri,
) -> Response {
    let Some((key, end, start)) = bounds(&q) else {
        return text(
            StatusCode::BAD_REQUEST,
            "a range is prefix=P (start=K for its next page), or start=A with an optional end=B",
        );
    };
    let limit = q.limit.unwrap_or(RANGE_LIMIT.0);
    if limit == 0 || limit > RANGE_LIMIT.1 {
        return text(
            StatusCode::BAD_REQUEST,
            format!("limit is 1 to {}", RANGE_LIMIT.1),
        );
    }
    if !q.stale {
        if let Err(r) = linearize(&node, &uri).await {
            return r;
        }
    }
    let machine = node.machine.clone();
    let revision = q.revision;
    let page = tokio::task::spawn_blocking(move || {
        let span = (key.as_slice(), end.as_slice());
        machine.range_page(span, Some(&start), revision, (limit, RANGE_BYTES))
    })
    .await;
    let page = match page {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return read_refused(e),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let reply = RangeReply {
        index: page.index,
        revision: page.revision,
        kvs: page
            .kvs
            .iter()
            .map(|kv| KeyValue {
                key: String::from_utf8_lossy(&kv.key).into_owned(),
                value: b64.encode(&kv.value),
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
                version: kv.version,
                lease: kv.lease,
            })
            .collect(),
        next: page.next.map(|k| String::from_utf8_lossy(&k).into_owned()),
    };
    let mut r = Json(reply).into_response();
    r.headers_mut().insert(INDEX_HEADER, page.index.into());
    r
}
