//! `GET /watch?prefix=P&from=REV` (or `&after=POS`): a stream of the
//! changes of keys under `P`, one JSON object a line, from the state
//! machine's history (see the crate docs).

use super::text;
use crate::machine::{Change, Event, Position};
use crate::node::Node;
use crate::types::Revision;
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
    from: Option<String>,
    after: Option<String>,
}

/// A line of a watch stream (JSON): an event, or why the stream ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchLine {
    /// The event's position, `index.sub.n`: resume after it with
    /// `after=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos: Option<String>,
    /// The change's revision, `index.sub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// `"put"` or `"delete"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A put's value, in base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Why the stream ends: `"compacted"` (the watcher fell behind the
    /// history; `first` is where it starts now) or the node's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With a `"compacted"` error: the first position the history holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
}

fn line(e: &Event) -> WatchLine {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (kind, value) = match &e.change {
        Change::Put(v) => ("put", Some(b64.encode(v))),
        Change::Delete => ("delete", None),
    };
    WatchLine {
        pos: Some(e.position.to_string()),
        revision: Some(e.position.revision.to_string()),
        kind: Some(kind.into()),
        key: Some(String::from_utf8_lossy(&e.key).into_owned()),
        value,
        error: None,
        first: None,
    }
}

fn ending(error: &str, first: Option<Position>) -> WatchLine {
    WatchLine {
        pos: None,
        revision: None,
        kind: None,
        key: None,
        value: None,
        error: Some(error.into()),
        first: first.map(|p| p.to_string()),
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
    applied: tokio::sync::watch::Receiver<u64>,
    stopping: tokio::sync::watch::Receiver<bool>,
    done: bool,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Watcher {
    async fn step(&mut self) -> Step {
        // Seen before reading: a batch applied after the read wakes the wait.
        self.applied.borrow_and_update();
        let (machine, prefix, next) = (self.node.machine.clone(), self.prefix.clone(), self.next);
        let page = tokio::task::spawn_blocking(move || machine.events(next, &prefix, PAGE, SCAN))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match page {
            Err(e) => Step::End(ending(&e, None)),
            Ok(p) if p.compacted.is_some() => Step::End(ending("compacted", p.compacted)),
            Ok(p) => {
                let moved = p.next != self.next;
                self.next = p.next;
                match (p.events.is_empty(), moved) {
                    (false, _) => Step::Lines(p.events.iter().map(line).collect()),
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
                        tokio::time::timeout(Duration::from_secs(30), self.applied.changed());
                    tokio::select! {
                        r = wait => if let Ok(Err(_)) = r { return None },
                        _ = self.stopping.changed() => return None,
                    }
                }
            }
        }
    }
}

/// `GET /watch`: `200` and a stream of [`WatchLine`]s (NDJSON), every
/// change of a key under `prefix` at or after `from` (a revision, or a
/// position: the `first` a `compacted` answer gives), or
/// after `after` (an event's position), or from the next applied entry on;
/// `410` if that part of the history was compacted.
pub(super) async fn watch(State(node): State<Arc<Node>>, Query(q): Query<WatchQuery>) -> Response {
    if !node.machine.keeps_history() {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            "this node keeps no watch history (serve --watch-history 0)",
        );
    }
    let bad = |e: String| text(StatusCode::BAD_REQUEST, e);
    if !q.prefix.is_empty() {
        if let Err(e) = crate::types::check_key(q.prefix.as_bytes()) {
            return bad(e.to_string());
        }
    }
    let start = match (&q.from, &q.after) {
        // A revision, or a position (`first` of a `compacted` line).
        (Some(r), None) => match (r.parse::<Revision>(), r.parse::<Position>()) {
            (Ok(revision), _) => Position { revision, n: 0 },
            (_, Ok(p)) => p,
            _ => return bad("from= is a revision INDEX.SUB or a position INDEX.SUB.N".into()),
        },
        (None, Some(p)) => match p.parse::<Position>() {
            Ok(p) => p.next(),
            Err(_) => return bad("a position is INDEX.SUB.N".into()),
        },
        (None, None) => Position {
            revision: Revision {
                index: *node.machine.applied_index().borrow() + 1,
                sub: 0,
            },
            n: 0,
        },
        (Some(_), Some(_)) => return bad("from= or after=, not both".into()),
    };
    let Ok(slot) = node.watch_slots.clone().try_acquire_owned() else {
        return super::busy("too many watchers");
    };
    let (first, _) = node.machine.history();
    if start < first {
        let body = ndjson(&[ending("compacted", Some(first))]);
        return (StatusCode::GONE, body).into_response();
    }
    let watcher = Watcher {
        prefix: q.prefix.into_bytes(),
        next: start,
        applied: node.machine.applied_index(),
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
