//! etcd's Watch service: one bidirectional stream carries many watchers.
//!
//! A stream is served by one task that owns its watchers. It reads the
//! client's requests — create, cancel, progress — and, whenever a watcher
//! is behind the store's revision on this member, reads the history from
//! where that watcher is ([`EtcdBackend::events`], a page of
//! [`WATCH_PAGE`] events, whole revisions) and sends what passes its
//! filters; otherwise it sleeps until the revision moves
//! ([`EtcdBackend::revisions`]). So the events of a watcher come in
//! revision order, each once, whether they were applied before the watch
//! began (`start_revision` in the past) or after; a slow client only slows
//! its own stream (nothing is buffered beyond a page and the outbound
//! queue). As etcd:
//! - ids are the client's (`watch_id` ≠ 0) or the stream's next free one,
//!   from 0; a create answers `created` with the store's revision in its
//!   header (a watcher without `start_revision` reports changes after
//!   it); a duplicate id is answered `created` and `canceled` at once;
//! - a watcher whose next revision has been compacted gets one answer
//!   with `compact_revision` set and `canceled`, and is gone;
//! - `filters` drop puts (`NOPUT`) or deletes (`NODELETE`); `prev_kv`
//!   fills each event's previous version;
//! - `fragment`: an answer larger than etcd's request limit is split into
//!   several, every one but the last marked `fragment`; without it, an
//!   answer holds whole revisions, however large;
//! - a progress request is answered, once every watcher of the stream has
//!   been sent every event up to the revision, by one answer with
//!   `watch_id` -1 and that revision; a watcher with `progress_notify`
//!   that was sent nothing for [`PROGRESS_INTERVAL`] gets an empty answer
//!   with the store's revision;
//! - a cancel is answered `canceled`.
//!
//! A node serves at most [`crate::api::MAX_WATCHERS`] streams (shared with
//! `GET /watch`; beyond, `ResourceExhausted`), each with at most
//! [`MAX_STREAM_WATCHERS`] watchers, and ends them when it stops.

use super::backend::{EventKind, EventsRequest, Revisions};
use super::{convert, status, BackendError, Etcd, EtcdBackend};
use crate::kv::{KvError, MAX_REQUEST_BYTES};
use etcd_api::etcdserverpb as pb;
use prost::Message;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Events read from the history at a time, about (whole revisions).
pub const WATCH_PAGE: usize = 256;

/// Watchers one stream may hold.
pub const MAX_STREAM_WATCHERS: usize = 1024;

/// How often a watcher that asked for progress notifications gets one
/// when nothing else was sent to it (etcd's default: ten minutes).
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(600);

/// Answers a stream holds before its reader takes them.
const OUTBOUND: usize = 16;

/// The answers of a watch stream.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

/// The Watch service on a backend.
pub struct WatchService<B>(pub Arc<Etcd<B>>);

/// One watcher of a stream.
#[derive(Debug, Clone)]
struct Watcher {
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// The next revision to read.
    next: i64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    fragment: bool,
    progress_notify: bool,
    /// When it was last sent something.
    last_sent: Instant,
}

/// A stream's state, owned by its task.
struct StreamState<B> {
    etcd: Arc<Etcd<B>>,
    watchers: BTreeMap<i64, Watcher>,
    next_id: i64,
    tx: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    revs: tokio::sync::watch::Receiver<Revisions>,
    /// A progress request waiting for every watcher to catch up.
    progress_asked: bool,
    /// The watcher served last (to take turns).
    turn: i64,
}

/// Why a stream's task ends.
enum End {
    /// The client went away, or the node stops.
    Gone,
}

impl<B: EtcdBackend> StreamState<B> {
    async fn send(&self, r: pb::WatchResponse) -> Result<(), End> {
        self.tx.send(Ok(r)).await.map_err(|_| End::Gone)
    }

    fn response(&self, id: i64, revision: i64) -> pb::WatchResponse {
        pb::WatchResponse {
            header: Some(self.etcd.header(revision)),
            watch_id: id,
            ..Default::default()
        }
    }

    /// Creates a watcher and answers `created` (or, for a duplicate id or
    /// one too many, `created` and `canceled`).
    async fn create(&mut self, c: pb::WatchCreateRequest) -> Result<(), End> {
        let current = self.revs.borrow().current;
        let id = if c.watch_id != 0 {
            c.watch_id
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id
        };
        let refused = if self.watchers.contains_key(&id) || id < 0 {
            Some("etcdserver: duplicate watch ID".to_owned())
        } else if self.watchers.len() >= MAX_STREAM_WATCHERS {
            Some(format!(
                "raftkv: a stream holds at most {MAX_STREAM_WATCHERS} watchers"
            ))
        } else {
            None
        };
        let mut r = self.response(if refused.is_some() { -1 } else { id }, current);
        r.created = true;
        if let Some(reason) = refused {
            r.canceled = true;
            r.cancel_reason = reason;
            return self.send(r).await;
        }
        if c.watch_id == 0 {
            self.next_id = id + 1;
        }
        use pb::watch_create_request::FilterType;
        let has = |f: FilterType| c.filters.contains(&(f as i32));
        let w = Watcher {
            next: if c.start_revision > 0 {
                c.start_revision
            } else {
                current + 1
            },
            key: c.key,
            range_end: c.range_end,
            no_put: has(FilterType::Noput),
            no_delete: has(FilterType::Nodelete),
            prev_kv: c.prev_kv,
            fragment: c.fragment,
            progress_notify: c.progress_notify,
            last_sent: Instant::now(),
        };
        self.watchers.insert(id, w);
        self.send(r).await
    }

    async fn cancel(&mut self, id: i64) -> Result<(), End> {
        if self.watchers.remove(&id).is_some() {
            let mut r = self.response(id, self.revs.borrow().current);
            r.canceled = true;
            return self.send(r).await;
        }
        Ok(())
    }

    /// A watcher that is behind the store's revision, taking turns.
    fn behind(&self) -> Option<i64> {
        let current = self.revs.borrow().current;
        let after = self.watchers.range(self.turn.saturating_add(1)..);
        let before = self.watchers.range(..=self.turn);
        after
            .chain(before)
            .find(|(_, w)| w.next <= current)
            .map(|(id, _)| *id)
    }

    /// Reads and sends one page of watcher `id`'s events.
    async fn pump(&mut self, id: i64) -> Result<(), End> {
        self.turn = id;
        let Some(w) = self.watchers.get(&id).cloned() else {
            return Ok(());
        };
        let req = EventsRequest {
            key: w.key.clone(),
            range_end: w.range_end.clone(),
            from: w.next.max(1),
            prev_kv: w.prev_kv,
            limit: WATCH_PAGE,
        };
        let page = match self.etcd.store.events(req).await {
            Ok(p) => p,
            Err(BackendError::Kv(KvError::Compacted { compact_revision })) => {
                self.watchers.remove(&id);
                let mut r = self.response(id, self.revs.borrow().current);
                r.compact_revision = compact_revision;
                r.canceled = true;
                r.cancel_reason = KvError::Compacted { compact_revision }.message().to_owned();
                return self.send(r).await;
            }
            Err(e) => {
                // The store failed: the stream ends with its status.
                let _ = self.tx.send(Err(status(e))).await;
                return Err(End::Gone);
            }
        };
        let events: Vec<_> = page
            .events
            .into_iter()
            .filter(|e| match e.kind {
                EventKind::Put => !w.no_put,
                EventKind::Delete => !w.no_delete,
            })
            .map(convert::event_out)
            .collect();
        // The revision this answer covers: all of it up to the page's end.
        let covered = (page.next - 1).min(page.revision).max(w.next - 1);
        if let Some(w) = self.watchers.get_mut(&id) {
            w.next = page.next.max(w.next);
            if !events.is_empty() {
                w.last_sent = Instant::now();
            }
        }
        if events.is_empty() {
            return Ok(());
        }
        let mut r = self.response(id, covered);
        r.events = events;
        for piece in fragments(r, w.fragment) {
            self.send(piece).await?;
        }
        Ok(())
    }

    /// Answers a progress request once every watcher caught up.
    async fn progress(&mut self) -> Result<(), End> {
        if !self.progress_asked || self.behind().is_some() {
            return Ok(());
        }
        self.progress_asked = false;
        let rev = self.revs.borrow().current;
        self.send(self.response(-1, rev)).await
    }

    /// Empty answers to watchers with `progress_notify` sent nothing for
    /// the interval (and caught up); when the next one is due.
    async fn notify(&mut self) -> Result<Instant, End> {
        let interval = self.etcd.progress_interval;
        let now = Instant::now();
        let current = self.revs.borrow().current;
        let due: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify && w.next > current && w.last_sent + interval <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if let Some(w) = self.watchers.get_mut(&id) {
                w.last_sent = now;
            }
            self.send(self.response(id, current)).await?;
        }
        let next = self
            .watchers
            .values()
            .filter(|w| w.progress_notify)
            .map(|w| w.last_sent + interval)
            .min();
        Ok(next.unwrap_or(now + interval))
    }

    async fn request(&mut self, r: pb::WatchRequest) -> Result<(), End> {
        use pb::watch_request::RequestUnion as U;
        match r.request_union {
            Some(U::CreateRequest(c)) => self.create(c).await,
            Some(U::CancelRequest(c)) => self.cancel(c.watch_id).await,
            Some(U::ProgressRequest(_)) => {
                self.progress_asked = true;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The stream's loop: requests first, then a page for a watcher that
    /// is behind, else a wait for the revision, a request, or a progress
    /// notification's time.
    async fn run(
        mut self,
        mut inbound: impl Stream<Item = Result<pb::WatchRequest, Status>> + Unpin,
    ) -> Result<(), End> {
        let mut stopping = self.etcd.node.stopping.subscribe();
        let mut notify_at = Instant::now() + self.etcd.progress_interval;
        loop {
            self.progress().await?;
            let behind = self.behind();
            tokio::select! {
                biased;
                _ = stopped(&mut stopping) => return Err(End::Gone),
                m = inbound.next() => match m {
                    Some(Ok(r)) => self.request(r).await?,
                    None | Some(Err(_)) => return Err(End::Gone),
                },
                _ = std::future::ready(()), if behind.is_some() => {
                    if let Some(id) = behind {
                        self.pump(id).await?;
                    }
                }
                r = self.revs.changed(), if behind.is_none() => {
                    if r.is_err() {
                        return Err(End::Gone);
                    }
                }
                _ = tokio::time::sleep_until(notify_at) => {
                    notify_at = self.notify().await?;
                }
            }
        }
    }
}

/// Completes once the node stops serving.
pub(super) async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

/// `r` as it is sent: whole, or (asked for `fragment` and larger than
/// etcd's request limit) in pieces of events, each marked `fragment` but
/// the last.
fn fragments(mut r: pb::WatchResponse, fragment: bool) -> Vec<pb::WatchResponse> {
    if !fragment || r.encoded_len() <= MAX_REQUEST_BYTES {
        return vec![r];
    }
    let events = std::mem::take(&mut r.events);
    let mut out = Vec::new();
    let mut piece = Vec::new();
    let mut size = 0;
    for e in events {
        // An event's bytes and its framing in the answer.
        let n = e.encoded_len() + 8;
        if size + n > MAX_REQUEST_BYTES && !piece.is_empty() {
            out.push(pb::WatchResponse {
                events: std::mem::take(&mut piece),
                fragment: true,
                ..r.clone()
            });
            size = 0;
        }
        size += n;
        piece.push(e);
    }
    out.push(pb::WatchResponse {
        events: piece,
        fragment: false,
        ..r
    });
    out
}

impl<B: EtcdBackend> WatchService<B> {
    /// Opens a watch stream on the client's requests.
    pub async fn open_stream(
        &self,
        inbound: impl Stream<Item = Result<pb::WatchRequest, Status>> + Send + Unpin + 'static,
    ) -> Result<WatchStream, Status> {
        let etcd = self.0.clone();
        let permit = etcd
            .node
            .watch_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                Status::resource_exhausted("etcdserver: too many requests: watch streams")
            })?;
        let (tx, rx) = mpsc::channel(OUTBOUND);
        let state = StreamState {
            revs: etcd.store.revisions(),
            etcd,
            watchers: BTreeMap::new(),
            next_id: 0,
            tx,
            progress_asked: false,
            turn: -1,
        };
        tokio::spawn(async move {
            let _permit = permit;
            let _ = state.run(inbound).await;
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

#[tonic::async_trait]
impl<B: EtcdBackend> pb::watch_server::Watch for WatchService<B> {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        self.open_stream(req.into_inner()).await.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_api::mvccpb;

    fn event(n: usize) -> mvccpb::Event {
        mvccpb::Event {
            r#type: 0,
            kv: Some(mvccpb::KeyValue {
                key: b"k".to_vec(),
                value: vec![7; n],
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    #[test]
    fn a_large_answer_is_fragmented_only_when_asked() {
        let r = pb::WatchResponse {
            watch_id: 3,
            header: Some(pb::ResponseHeader {
                revision: 9,
                ..Default::default()
            }),
            events: (0..5).map(|_| event(600 << 10)).collect(),
            ..Default::default()
        };
        assert_eq!(fragments(r.clone(), false).len(), 1);
        let pieces = fragments(r, true);
        assert!(pieces.len() >= 3, "{} pieces", pieces.len());
        let events: usize = pieces.iter().map(|p| p.events.len()).sum();
        assert_eq!(events, 5);
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(p.fragment, i + 1 < pieces.len());
            assert_eq!(p.watch_id, 3);
            assert_eq!(p.header.as_ref().map(|h| h.revision), Some(9));
            assert!(p.encoded_len() <= MAX_REQUEST_BYTES + (700 << 10));
        }
    }
}
