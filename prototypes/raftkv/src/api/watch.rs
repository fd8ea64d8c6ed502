//! `GET /watch?prefix=P&from=REV` (or `&after=POS`): a stream of the
//! changes of keys under `P`, one JSON object a line, read from the
//! store's versions (see the crate docs).

use super::text;
use crate::kv::{self, EventType};
use crate::machine::Position;
use crate::node::Node;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Watch streams a node serves at once; beyond, `503` with
/// `Retry-After`.
pub const MAX_WATCHERS: usize = 256;
/// Events a stream sends per read of the history, at most.
const PAGE: usize = 256;
/// Events a read of the history looks at, at most (a prefix that matches
/// few of them still moves on).
const SCAN: usize = 4096;

/// The query of a watch.
#[derive(Debug, Deserialize)]
pub(super) struct WatchQuery {
    #[serde(default)]
    prefix: String,
    from: Option<i64>,
    after: Option<String>,
}

/// A line of a watch stream (JSON): an event, or why the stream ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchLine {
    /// The event's position, `revision.sub` (its number among its
    /// revision's changes): resume after it with `after=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos: Option<String>,
    /// The change's revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// `"put"` or `"delete"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A put's value, in base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Why the stream ends: `"compacted"` (a compaction passed the
    /// watcher; `first` is where a watch may start now) or the node's
    /// error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With a `"compacted"` error: the compaction's revision, the first a
    /// watch may start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<i64>,
}

fn line(p: Position, e: &kv::Event) -> WatchLine {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (kind, value) = match e.kind {
        EventType::Put => ("put", Some(b64.encode(&e.kv.value))),
        EventType::Delete => ("delete", None),
    };
    WatchLine {
        pos: Some(p.to_string()),
        revision: Some(p.revision),
        kind: Some(kind.into()),
        key: Some(String::from_utf8_lossy(&e.kv.key).into_owned()),
        value,
        error: None,
        first: None,
    }
}

fn ending(error: &str, first: Option<i64>) -> WatchLine {
    WatchLine {
        pos: None,
        revision: None,
        kind: None,
        key: None,
        value: None,
        error: Some(error.into()),
        first,
    }
}

fn ndjson(lines: &[WatchLine]) -> Bytes {
    let mut out = Vec::new();
    for l in lines {
        // (Serializing these plain structs cannot fail.)
        if serde_json::to_writer(&mut out, l).is_ok() {
            out.push(b'\n');
        }
    }
    Bytes::from(out)
}

/// What one step of a stream found.
enum Step {
    Lines(Vec<WatchLine>),
    /// Nothing new: wait for the next applied batch.
    Wait,
    /// The stream ends with this line.
    End(WatchLine),
}

struct Watcher {
    node: Arc<Node>,
    prefix: Vec<u8>,
    next: Position,
    revisions: tokio::sync::watch::Receiver<crate::machine::Revisions>,
    stopping: tokio::sync::watch::Receiver<bool>,
    done: bool,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Watcher {
    async fn step(&mut self) -> Step {
        // Seen before reading: a revision applied after the read wakes
        // the wait.
        self.revisions.borrow_and_update();
        let (node, prefix, next) = (self.node.clone(), self.prefix.clone(), self.next);
        let page = tokio::task::spawn_blocking(move || {
            let end = prefix_end(&prefix);
            node.events(next, (&prefix, &end), false, (PAGE, SCAN))
        })
        .await;
        match page {
            Err(e) => Step::End(ending(&e.to_string(), None)),
            Ok(Err(kv::KvError::Compacted { compact_revision })) => {
                Step::End(ending("compacted", Some(compact_revision)))
            }
            Ok(Err(e)) => Step::End(ending(&e.to_string(), None)),
            Ok(Ok(p)) => {
                let moved = p.next != self.next;
                self.next = p.next;
                match (p.events.is_empty(), moved) {
                    (false, _) => Step::Lines(p.events.iter().map(|(p, e)| line(*p, e)).collect()),
                    (true, true) => Step::Lines(Vec::new()),
                    (true, false) => Step::Wait,
                }
            }
        }
    }

    /// The next chunk of the stream; `None` once it ends.
    async fn chunk(mut self) -> Option<(Result<Bytes, std::io::Error>, Watcher)> {
        loop {
            if self.done || *self.stopping.borrow() {
                return None;
            }
            match self.step().await {
                Step::Lines(l) if l.is_empty() => continue,
                Step::Lines(l) => return Some((Ok(ndjson(&l)), self)),
                Step::End(l) => {
                    self.done = true;
                    return Some((Ok(ndjson(&[l])), self));
                }
                Step::Wait => {
                    let wait =
                        tokio::time::timeout(Duration::from_secs(30), self.revisions.changed());
                    tokio::select! {
                        r = wait => if let Ok(Err(_)) = r { return None },
                        _ = self.stopping.changed() => return None,
                    }
                }
            }
        }
    }
}

/// The `range_end` of the keys under `prefix` (every key if empty).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    if prefix.is_empty() {
        return vec![0];
    }
    kv::prefix_end(prefix)
}

/// `GET /watch`: `200` and a stream of [`WatchLine`]s (NDJSON), every
/// change of a key under `prefix` at or after revision `from`, or after
/// `after` (an event's position), or from the next revision applied on;
/// `410` if a compaction passed where it starts.
pub(super) async fn watch(State(node): State<Arc<Node>>, Query(q): Query<WatchQuery>) -> Response {
    let bad = |e: String| text(StatusCode::BAD_REQUEST, e);
    if q.prefix.len() > crate::MAX_KEY {
        return bad("the prefix is longer than a key".into());
    }
    let revisions = node.machine.revisions();
    let start = match (q.from, &q.after) {
        (Some(r), None) if r >= 0 => Position::at(r),
        (Some(_), None) => return bad("from= is a revision, from 0".into()),
        (None, Some(p)) => match p.parse::<Position>() {
            Ok(p) => p.next(),
            Err(e) => return bad(e),
        },
        (None, None) => Position::at(revisions.current + 1),
        (Some(_), Some(_)) => return bad("from= or after=, not both".into()),
    };
    let Ok(slot) = node.watch_slots.clone().try_acquire_owned() else {
        return super::busy("too many watchers");
    };
    if start.revision < revisions.compact {
        let body = ndjson(&[ending("compacted", Some(revisions.compact))]);
        return (StatusCode::GONE, body).into_response();
    }
    let watcher = Watcher {
        prefix: q.prefix.into_bytes(),
        next: start,
        revisions: node.machine.revision_watch(),
        stopping: node.stopping.subscribe(),
        node,
        done: false,
        _slot: slot,
    };
    let stream = futures_util::stream::unfold(watcher, Watcher::chunk);
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}
