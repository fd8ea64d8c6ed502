//! Writes: `PUT` and `DELETE /kv/{key}`, conditional on `If-Match` /
//! `If-None-Match`, and `POST /txn` (see the crate docs): each one of
//! etcd's requests ([`crate::kv`]) in the log.

use super::{
    busy, key_bytes, redirect, text, WriteQuery, COMPARE_FAILED, ERROR_HEADER, INDEX_HEADER,
    LEASE_FULL, LEASE_NOT_FOUND, REQUEST_TIMEOUT, REVISION_HEADER, SESSION_STALE, SESSION_UNKNOWN,
};
use crate::kv::{self, KvError, RequestOp};
use crate::node::Node;
use crate::propose::Outcome;
use crate::types::{Answer, Command, Expect, ToCompare, Verdict};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Whether `cmd` adds data (a put, a transaction with a put, a lease):
/// refused while the disk-space alarm is raised ([`crate::space`]).
fn adds_data(cmd: &Command) -> bool {
    match cmd {
        Command::Kv { op, .. } => crate::check::adds_data(op),
        Command::LeaseGrant { .. } => true,
        _ => false,
    }
}

/// `507` with `x-raftkv-error: nospace`: the node's disk is below its
/// reserve; the write was not taken (deletes and reads go on).
pub(super) fn no_space() -> Response {
    let mut r = text(
        StatusCode::INSUFFICIENT_STORAGE,
        "the disk is below its free-space reserve: writes that add data are refused \
         until space returns (reads and deletes go on)",
    );
    r.headers_mut().insert(
        ERROR_HEADER,
        HeaderValue::from_static(crate::space::NOSPACE),
    );
    r
}

/// How a write was decided, once it was.
pub(super) struct Decided {
    pub(super) index: u64,
    /// The store's revision after it.
    pub(super) revision: i64,
    succeeded: bool,
    retry: bool,
    /// The lease a grant granted (a retry's too).
    pub(super) lease: i64,
}

/// Proposes `cmd` and waits until it is decided; the answer to send if it
/// was not (a redirect, `503`, `409` from its session).
pub(super) async fn decide(node: &Node, cmd: Command, uri: &Uri) -> Result<Decided, Response> {
    if adds_data(&cmd) && node.space.full() {
        return Err(no_space());
    }
    let r = tokio::time::timeout(REQUEST_TIMEOUT, node.proposer.propose(cmd)).await;
    let (index, verdict) = match r {
        Err(_) => {
            return Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "no majority answered in time: the write may or may not take effect",
            ))
        }
        Ok(Outcome::Applied { index, verdict }) => (index, verdict),
        Ok(Outcome::Forward(leader)) => return Err(redirect(leader.as_ref(), uri)),
        Ok(Outcome::Failed(e)) => return Err(text(StatusCode::SERVICE_UNAVAILABLE, e)),
        Ok(Outcome::Busy) => return Err(busy("too many writes waiting: the write was not taken")),
    };
    let refused = |msg: &str, e: &'static str| {
        let code = if e == LEASE_NOT_FOUND {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::CONFLICT
        };
        let mut r = text(code, msg);
        r.headers_mut().insert(INDEX_HEADER, index.into());
        r.headers_mut()
            .insert(ERROR_HEADER, HeaderValue::from_static(e));
        r
    };
    let succeeded = verdict.succeeded();
    match verdict {
        Verdict::Applied { revision, answer } => {
            let lease = match answer {
                Answer::LeaseGranted { id, .. } => id,
                _ => 0,
            };
            Ok(Decided {
                index,
                revision,
                succeeded,
                retry: false,
                lease,
            })
        }
        Verdict::Duplicate {
            revision, lease, ..
        } => Ok(Decided {
            index,
            revision,
            succeeded,
            retry: true,
            lease,
        }),
        Verdict::UnknownSession => Err(refused(
            "the client has no session (expired, or never opened: a session opens with seq=1): not applied",
            SESSION_UNKNOWN,
        )),
        Verdict::Refused(KvError::LeaseNotFound) => Err(refused(
            "no such lease (never granted, expired or revoked): not applied",
            LEASE_NOT_FOUND,
        )),
        Verdict::Refused(KvError::LeaseFull) => Err(refused(
            "the lease holds its most keys: not applied",
            LEASE_FULL,
        )),
        Verdict::Refused(e) => {
            let mut r = text(StatusCode::BAD_REQUEST, format!("{e}: not applied"));
            r.headers_mut().insert(INDEX_HEADER, index.into());
            Err(r)
        }
        Verdict::Stale => Err(refused(
            "the sequence number is below the session's last (a late copy, or a client id used twice): not applied",
            SESSION_STALE,
        )),
    }
}

/// Proposes a `PUT` or `DELETE` and answers: `200` with the revision, or
/// `412` if its condition did not hold.
pub(super) async fn write(node: &Node, cmd: Command, uri: &Uri) -> Response {
    answer(decide(node, cmd, uri).await)
}

/// The answer to a write decided as `d`.
pub(super) fn answer(d: Result<Decided, Response>) -> Response {
    let d = match d {
        Ok(d) => d,
        Err(r) => return r,
    };
    let retry = if d.retry {
        " (a retry: applied before)"
    } else {
        ""
    };
    let mut r = if d.succeeded {
        text(
            StatusCode::OK,
            format!("ok, revision {}{retry}", d.revision),
        )
    } else {
        let mut r = text(
            StatusCode::PRECONDITION_FAILED,
            format!(
                "the condition did not hold at revision {}{retry}: not applied",
                d.revision
            ),
        );
        r.headers_mut()
            .insert(ERROR_HEADER, HeaderValue::from_static(COMPARE_FAILED));
        r
    };
    r.headers_mut().insert(INDEX_HEADER, d.index.into());
    if let Ok(v) = HeaderValue::from_str(&d.revision.to_string()) {
        r.headers_mut().insert(REVISION_HEADER, v);
    }
    r
}

/// A revision as an entity tag carries it: `"812"` (quoted or not).
fn parse_revision(s: &str) -> Option<i64> {
    let t = s.trim();
    let t = t
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(t);
    t.parse().ok().filter(|r| *r > 0)
}

/// The condition of a `PUT` or `DELETE`: `If-Match: *`,
/// `If-Match: "<revision>"` or `If-None-Match: *`.
fn condition(headers: &HeaderMap) -> Result<Option<Expect>, Response> {
    let get = |h| headers.get(h).map(|v| v.to_str().unwrap_or("\u{0}").trim());
    let bad = || {
        text(
            StatusCode::BAD_REQUEST,
            "a condition is If-Match: * or If-Match: \"<revision>\" (a revision from 1), or If-None-Match: *",
        )
    };
    Ok(Some(
        match (get(header::IF_MATCH), get(header::IF_NONE_MATCH)) {
            (None, None) => return Ok(None),
            (Some("*"), None) => Expect::Present,
            (Some(r), None) => Expect::ModRevision(parse_revision(r).ok_or_else(bad)?),
            (None, Some("*")) => Expect::Absent,
            _ => return Err(bad()),
        },
    ))
}

/// A write, conditional if `cond` says so: a transaction of the
/// condition and the change.
fn conditional(cond: Option<Expect>, op: RequestOp, id: Option<crate::RequestId>) -> Command {
    match cond {
        None => Command::Kv { op, id },
        Some(expect) => {
            let key = match &op {
                RequestOp::Put(p) => p.key.clone(),
                RequestOp::DeleteRange(d) => d.key.clone(),
                _ => Vec::new(),
            };
            Command::txn(
                kv::TxnRequest {
                    compare: vec![expect.compare(&key)],
                    success: vec![op],
                    failure: Vec::new(),
                },
                id,
            )
        }
    }
}

/// `PUT /kv/{key}`.
pub(super) async fn put(
    State(node): State<Arc<Node>>,
    Path(key): Path<String>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Response {
    let (key, id) = match (key_bytes(&key), q.id()) {
        (Ok(k), Ok(id)) => (k, id),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let op = RequestOp::Put(kv::PutRequest {
        key,
        value: body.to_vec(),
        lease: q.lease.unwrap_or(0),
        ..kv::PutRequest::default()
    });
    if let Err(e) = crate::check::check_request(&op) {
        return text(StatusCode::BAD_REQUEST, e.to_string());
    }
    let cond = match condition(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut r = write(&node, conditional(cond, op, id), &uri).await;
    // A put's revision is the key's new modification revision: its ETag.
    if r.status() == StatusCode::OK {
        if let Some(v) = r.headers().get(REVISION_HEADER).cloned() {
            if let Ok(tag) = HeaderValue::from_str(&format!("\"{}\"", v.to_str().unwrap_or(""))) {
                r.headers_mut().insert(header::ETAG, tag);
            }
        }
    }
    r
}

/// `DELETE /kv/{key}`.
pub(super) async fn delete(
    State(node): State<Arc<Node>>,
    Path(key): Path<String>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let (key, id) = match (key_bytes(&key), q.id()) {
        (Ok(k), Ok(id)) => (k, id),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    if q.lease.is_some() {
        // A delete attaches nothing: a lease here is a client's mistake,
        // not something to ignore.
        return text(
            StatusCode::BAD_REQUEST,
            "a DELETE takes no lease (a key leaves its lease when deleted)",
        );
    }
    let cond = match condition(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let op = RequestOp::DeleteRange(kv::DeleteRangeRequest {
        key,
        range_end: Vec::new(),
        prev_kv: false,
    });
    write(&node, conditional(cond, op, id), &uri).await
}

/// What a comparison of `POST /txn` expects (JSON: `"absent"`,
/// `"present"`, `{"mod_revision": 812}`, `{"value": "<base64>"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxnExpect {
    /// The key is absent.
    Absent,
    /// The key is present.
    Present,
    /// The key was last changed at this revision.
    ModRevision(i64),
    /// The key holds this value (base64).
    Value(String),
}

/// A comparison of `POST /txn`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnCompare {
    /// The key.
    pub key: String,
    /// What it must be.
    pub expect: TxnExpect,
}

/// A change of `POST /txn` (JSON: `{"put": {"key", "value" (base64)}}`
/// or `{"delete": {"key"}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxnChange {
    /// Sets a key.
    Put {
        /// The key.
        key: String,
        /// The value, in base64.
        value: String,
        /// The lease to attach it to.
        #[serde(default)]
        lease: Option<i64>,
    },
    /// Removes a key.
    Delete {
        /// The key.
        key: String,
    },
}

/// The body of `POST /txn`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TxnRequest {
    /// Comparisons that must all hold.
    #[serde(default)]
    pub compare: Vec<TxnCompare>,
    /// Changes made if they do.
    #[serde(default)]
    pub success: Vec<TxnChange>,
    /// Changes made if one does not.
    #[serde(default)]
    pub failure: Vec<TxnChange>,
}

/// What `POST /txn` answers (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnReply {
    /// Whether every comparison held (the `success` changes were made).
    pub succeeded: bool,
    /// The store's revision after the transaction (its own if it changed
    /// the store).
    pub revision: i64,
    /// A retry of a transaction decided before: this is its first answer.
    pub retry: bool,
}

/// The command of a `POST /txn` body.
fn txn_command(req: TxnRequest, id: Option<crate::RequestId>) -> Result<Command, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let bytes = |s: String| -> Result<Vec<u8>, String> {
        b64.decode(s)
            .map_err(|e| format!("a value is not base64: {e}"))
    };
    let mut compare = Vec::with_capacity(req.compare.len().min(kv::MAX_TXN_OPS + 1));
    for c in req.compare {
        let expect = match c.expect {
            TxnExpect::Absent => Expect::Absent,
            TxnExpect::Present => Expect::Present,
            TxnExpect::ModRevision(r) => Expect::ModRevision(r),
            TxnExpect::Value(v) => Expect::Value(bytes(v)?),
        };
        compare.push(expect.compare(c.key.as_bytes()));
    }
    let ops = |changes: Vec<TxnChange>| -> Result<Vec<RequestOp>, String> {
        changes
            .into_iter()
            .map(|c| match c {
                TxnChange::Put { key, value, lease } => Ok(RequestOp::Put(kv::PutRequest {
                    key: key.into_bytes(),
                    value: bytes(value)?,
                    lease: lease.unwrap_or(0),
                    ..kv::PutRequest::default()
                })),
                TxnChange::Delete { key } => Ok(RequestOp::DeleteRange(kv::DeleteRangeRequest {
                    key: key.into_bytes(),
                    range_end: Vec::new(),
                    prev_kv: false,
                })),
            })
            .collect()
    };
    let op = RequestOp::Txn(kv::TxnRequest {
        compare,
        success: ops(req.success)?,
        failure: ops(req.failure)?,
    });
    crate::check::check_request(&op).map_err(|e| e.to_string())?;
    Ok(Command::Kv { op, id })
}

/// `POST /txn` (with an optional request id): `200` and a [`TxnReply`]
/// once applied, whether its comparisons held or not.
pub(super) async fn txn(
    State(node): State<Arc<Node>>,
    Query(q): Query<WriteQuery>,
    uri: Uri,
    body: Bytes,
) -> Response {
    let id = match q.id() {
        Ok(id) => id,
        Err(r) => return r,
    };
    let cmd = serde_json::from_slice::<TxnRequest>(&body)
        .map_err(|e| format!("not a transaction: {e}"))
        .and_then(|req| txn_command(req, id));
    let cmd = match cmd {
        Ok(c) => c,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    match decide(&node, cmd, &uri).await {
        Ok(d) => {
            let reply = TxnReply {
                succeeded: d.succeeded,
                revision: d.revision,
                retry: d.retry,
            };
            let mut r = Json(reply).into_response();
            r.headers_mut().insert(INDEX_HEADER, d.index.into());
            if let Ok(v) = HeaderValue::from_str(&d.revision.to_string()) {
                r.headers_mut().insert(REVISION_HEADER, v);
            }
            r
        }
        Err(r) => r,
    }
}
