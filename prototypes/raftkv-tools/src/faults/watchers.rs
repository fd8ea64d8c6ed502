//! Watch streams recorded through a run, checked at its end
//! ([`crate::history::watch`]).
//!
//! A few watchers (each starting on a different member) watch every key
//! of the workload (the prefix `key-`) from revision 1 with `prev_kv`,
//! each over its own gRPC stream, and record every answer. When a stream
//! breaks (its member killed, or it ends the stream) the watcher connects
//! to the next member and watches again from the revision after the last
//! it had all of; a cancel by a compaction ends that stream (recorded)
//! and the watcher begins a new one at the compaction's revision. At the
//! end of the run each watcher asks for progress notifications until one
//! says it was sent everything up to the store's final revision (a
//! member that does not get there within [`STUCK`] is left for the next),
//! within [`FINISH_LIMIT`]: a watcher that never gets there is a failure
//! of the run, as a violation. Then the streams are checked against each
//! other and against what the clients were told: every acknowledged
//! write's revision, every write known not applied, every read's
//! `mod_revision` ([`inputs`]).

use super::workload::{key_name, Rec};
use crate::history::watch::{
    self, Event, EventKind, Item, Outcome, Read, Stream, Told, Version, Write,
};
use crate::history::Kind;
use etcd_api::etcdserverpb as pb;
use etcd_api::mvccpb;
use pb::watch_client::WatchClient;
use std::time::Duration;
use tokio::sync::{mpsc, watch as signal};
use tokio::time::Instant;
use tonic::transport::Endpoint;

/// The keys watched: the workload's.
pub const PREFIX: &str = "key-";

/// How long a watcher may take, at the end, to be sent everything up to
/// the final revision.
pub const FINISH_LIMIT: Duration = Duration::from_secs(30);

/// At the end, a member whose progress does not move for this long is
/// left for the next one (a member removed from the cluster, say, still
/// serves its own store).
pub const STUCK: Duration = Duration::from_secs(3);

/// The watchers of a run.
#[derive(Debug)]
pub struct Watchers {
    /// `Some((revision, members))` once they should finish at that
    /// revision, on those members' endpoints.
    finish: signal::Sender<Finish>,
    tasks: Vec<tokio::task::JoinHandle<(Vec<Stream>, i64)>>,
}

impl Watchers {
    /// Starts `n` watchers, watcher `i` first on member `i` (modulo their
    /// number).
    pub fn start(endpoints: &[String], n: usize) -> Watchers {
        let (finish, rx) = signal::channel(None);
        let tasks = (0..n)
            .map(|i| tokio::spawn(watcher(endpoints.to_vec(), i, rx.clone())))
            .collect();
        Watchers { finish, tasks }
    }

    /// Has them finish at `target` (the store's final revision), moving
    /// to the endpoints of `members` (the cluster's members now: the
    /// members a watcher started on may all have been replaced, and a
    /// removed member's store stops where it was removed): their streams,
    /// and what did not get there.
    pub async fn finish(
        self,
        target: i64,
        members: Vec<String>,
    ) -> Result<(Vec<Stream>, Vec<String>), String> {
        let _ = self.finish.send(Some((target, members)));
        let (mut streams, mut short) = (Vec::new(), Vec::new());
        for (i, t) in self.tasks.into_iter().enumerate() {
            let (s, done) = t.await.map_err(|e| e.to_string())?;
            if done < target {
                short.push(format!(
                    "watcher {} was sent all of only up to revision {done} of {target} within {FINISH_LIMIT:?}",
                    i + 1
                ));
            }
            streams.extend(s);
        }
        Ok((streams, short))
    }
}

/// The end of a run, once known: the final revision and the endpoints of
/// the members then.
type Finish = Option<(i64, Vec<String>)>;

/// How a connection of a watcher ended.
enum End {
    /// It broke, or the member would not answer: try the next one.
    Broken,
    /// A compaction at this revision canceled the watch.
    Compacted(i64),
    /// Everything up to the final revision was sent.
    Done,
}

/// A watcher's stream being recorded.
struct Recording {
    stream: Stream,
    /// The last revision it was sent all of.
    done: i64,
    /// Whether a connection of it was opened already.
    opened: bool,
}

impl Recording {
    fn new(name: String, start: i64) -> Recording {
        Recording {
            stream: Stream {
                name,
                start,
                prev_kv: true,
                items: Vec::new(),
            },
            done: start.saturating_sub(1),
            opened: false,
        }
    }
}

/// Watcher `i`: its streams, and the last revision it had all of.
async fn watcher(
    mut endpoints: Vec<String>,
    i: usize,
    mut finish: signal::Receiver<Finish>,
) -> (Vec<Stream>, i64) {
    let mut n = endpoints.len().max(1);
    let mut node = i % n;
    let mut streams = Vec::new();
    let mut rec = Recording::new(format!("watcher {}", i + 1), 1);
    let mut limit = None;
    loop {
        let end = finish.borrow().clone();
        if let Some((target, members)) = end {
            if !members.is_empty() && members != endpoints {
                endpoints = members;
                n = endpoints.len();
                node = i % n;
            }
            let limit = *limit.get_or_insert_with(|| Instant::now() + FINISH_LIMIT);
            if rec.done >= target || Instant::now() >= limit {
                break;
            }
        }
        let Some(addr) = endpoints.get(node) else {
            break;
        };
        match connection(addr, &mut rec, &mut finish, &mut limit).await {
            End::Broken => {
                node = (node + 1) % n;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            End::Compacted(c) => {
                let name = format!("watcher {} from {c}", i + 1);
                let old = std::mem::replace(&mut rec, Recording::new(name, c));
                streams.push(old.stream);
            }
            End::Done => break,
        }
    }
    let done = rec.done;
    streams.push(rec.stream);
    (streams, done)
}

/// One connection of a watcher to the member at `addr`: watches from the
/// revision after the last it had all of, records what it is sent.
async fn connection(
    addr: &str,
    rec: &mut Recording,
    finish: &mut signal::Receiver<Finish>,
    limit: &mut Option<Instant>,
) -> End {
    let open = async {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel(4);
        let create = pb::WatchCreateRequest {
            key: PREFIX.as_bytes().to_vec(),
            range_end: raftkv_wire::prefix_end(PREFIX.as_bytes()),
            start_revision: rec.done.saturating_add(1),
            prev_kv: true,
            ..Default::default()
        };
        let req = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
        };
        tx.send(req).await.map_err(|e| e.to_string())?;
        let rx = tokio_stream::wrappers::ReceiverStream::new(rx);
        let inbound = WatchClient::new(ch)
            .watch(rx)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((tx, inbound.into_inner()))
    };
    let Ok(Ok((tx, mut inbound))) = tokio::time::timeout(Duration::from_secs(2), open).await else {
        return End::Broken;
    };
    if rec.opened {
        rec.stream
            .items
            .push(Item::Resumed(rec.done.saturating_add(1)));
    }
    rec.opened = true;
    let progress = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::ProgressRequest(
            pb::WatchProgressRequest {},
        )),
    };
    // At the end: when progress last moved.
    let mut moved = Instant::now();
    loop {
        let target = finish.borrow().as_ref().map(|(t, _)| *t);
        if target.is_some_and(|t| rec.done >= t) {
            return End::Done;
        }
        let ask = target.is_some();
        if ask && limit.is_none() {
            *limit = Some(Instant::now() + FINISH_LIMIT);
        }
        tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(r)) => {
                    let before = rec.done;
                    if let Some(end) = record(rec, r) {
                        return end;
                    }
                    if rec.done > before {
                        moved = Instant::now();
                    }
                }
                Ok(None) | Err(_) => return End::Broken,
            },
            r = finish.changed(), if !ask => {
                if r.is_err() {
                    return End::Done;
                }
                moved = Instant::now();
            }
            _ = tokio::time::sleep(Duration::from_millis(200)), if ask => {
                let late = limit.is_some_and(|l| Instant::now() >= l);
                if late || moved.elapsed() >= STUCK {
                    return End::Broken;
                }
                if tx.send(progress.clone()).await.is_err() {
                    return End::Broken;
                }
            }
        }
    }
}

/// Records answer `r`; how the connection ends, if it does.
fn record(rec: &mut Recording, r: pb::WatchResponse) -> Option<End> {
    if r.compact_revision > 0 {
        rec.stream.items.push(Item::Compacted(r.compact_revision));
        return Some(End::Compacted(r.compact_revision));
    }
    if r.canceled {
        return Some(End::Broken);
    }
    if r.created {
        return None;
    }
    if r.events.is_empty() {
        // A progress notification.
        let rev = r.header.map_or(0, |h| h.revision);
        rec.stream.items.push(Item::Progress(rev));
        rec.done = rec.done.max(rev);
    } else {
        let events: Vec<Event> = r.events.into_iter().map(event).collect();
        if let Some(last) = events.last() {
            rec.done = rec.done.max(last.revision());
        }
        rec.stream.items.push(Item::Events(events));
    }
    None
}

fn version(kv: mvccpb::KeyValue) -> Version {
    Version {
        key: kv.key,
        value: kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
    }
}

fn event(e: mvccpb::Event) -> Event {
    let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 {
        EventKind::Delete
    } else {
        EventKind::Put
    };
    Event {
        kind,
        kv: version(e.kv.unwrap_or_default()),
        prev: e.prev_kv.map(version),
    }
}

/// What the clients were told, for the watch checker: every write of a
/// value (a compare-and-set's too) and what became of it, every read
/// that found a value and its `mod_revision`.
pub fn inputs(recs: &[Rec]) -> (Vec<Write>, Vec<Read>) {
    let (mut writes, mut reads) = (Vec::new(), Vec::new());
    for r in recs {
        let key = key_name(r.key).into_bytes();
        let acked = r.op.completed.is_some();
        let outcome = |won: bool| {
            if r.not_applied || (acked && !won) {
                Outcome::NotApplied
            } else if acked {
                Outcome::Applied(r.revision)
            } else {
                Outcome::Unknown
            }
        };
        match &r.op.kind {
            Kind::Write(Some(v)) => writes.push(Write {
                key,
                value: v.clone(),
                outcome: outcome(true),
            }),
            Kind::Cas {
                write: Some(v),
                succeeded,
                ..
            } => writes.push(Write {
                key,
                value: v.clone(),
                outcome: outcome(*succeeded != Some(false)),
            }),
            Kind::Read(Some(v)) if !r.failed => {
                if let Some(rev) = r.revision {
                    reads.push(Read {
                        key,
                        value: v.clone(),
                        mod_revision: rev,
                    });
                }
            }
            _ => {}
        }
    }
    (writes, reads)
}

/// Checks the streams against `recs` and the revisions of the
/// `compactions` asked for: what was found.
pub fn check(streams: &[Stream], recs: &[Rec], compactions: Vec<i64>) -> watch::Summary {
    let (writes, reads) = inputs(recs);
    let told = Told {
        writes,
        reads,
        compactions,
    };
    // Every write of the run is to a key of the prefix: each revision of
    // the store is an event of every stream covering it.
    watch::check(streams, &told, true)
}
