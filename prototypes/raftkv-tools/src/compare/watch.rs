//! The watchers of a `raftkv-tools compare` measurement: a few `Watch` streams
//! (etcd's gRPC API, the `etcd-api` stubs) on the prefix of every key the
//! clients write, each its own connection, round robin over the members
//! as the clients are, counting the events they receive. What they show
//! is whether the watchers kept up with the puts: the events of the
//! slowest watcher in the time of the puts against the puts acknowledged,
//! and how long after the last put its event reached every watcher.

use crate::bench::{channel, endpoint};
use etcd_api::etcdserverpb as pb;
use pb::watch_client::WatchClient;
use serde::Serialize;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;

/// How long a watcher may take to be created, and the watchers to catch up
/// with the last put once the puts have stopped.
const CATCH_UP: Duration = Duration::from_secs(30);

/// What a watcher has received.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// Events.
    events: u64,
    /// The revision of the last event.
    revision: i64,
    /// Why the stream ended, if it did.
    ended: Option<String>,
}

/// Watch streams attached to a system.
pub struct Watchers {
    seen: Vec<watch::Receiver<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What the watchers received while the puts ran.
#[derive(Debug, Clone, Serialize)]
pub struct WatchStats {
    /// Watch streams.
    pub watchers: usize,
    /// Events each received in the time of the puts.
    pub events: Vec<u64>,
    /// The slowest watcher's events per second.
    pub events_per_sec: f64,
    /// The slowest watcher's events over the puts acknowledged (about 1
    /// when the watchers kept up).
    pub ratio: f64,
    /// Milliseconds from the end of the puts until every watcher had
    /// received the last acknowledged put (`None`: not within 30 s).
    pub lag_ms: Option<f64>,
    /// Streams that ended, and why.
    pub errors: Vec<String>,
}

impl Watchers {
    /// Starts `n` watchers on `prefix` (after the store's current
    /// revision), watcher `w` on [`endpoint`]`(endpoints, w, rotation)`,
    /// and waits until each is created.
    pub async fn start(
        endpoints: &[String],
        n: usize,
        rotation: usize,
        prefix: &str,
    ) -> Result<Watchers, String> {
        let mut w = Watchers {
            seen: Vec::new(),
            tasks: Vec::new(),
        };
        for i in 0..n {
            let addr = endpoint(endpoints, i, rotation)?;
            let (seen, task) = start_one(addr, prefix).await?;
            w.seen.push(seen);
            w.tasks.push(task);
        }
        Ok(w)
    }

    /// Events received so far, per watcher.
    pub fn counts(&self) -> Vec<u64> {
        self.seen.iter().map(|s| s.borrow().events).collect()
    }

    /// What the watchers received between `before` (their [`counts`]
    /// when the puts began) and now, `puts` acknowledged in `seconds`, the
    /// last at `revision`; waits for the watchers to receive it.
    ///
    /// [`counts`]: Watchers::counts
    pub async fn stats(
        &self,
        before: &[u64],
        puts: u64,
        seconds: f64,
        revision: i64,
    ) -> WatchStats {
        let now = self.counts();
        let events: Vec<u64> = now
            .iter()
            .zip(before)
            .map(|(n, b)| n.saturating_sub(*b))
            .collect();
        let slowest = events.iter().copied().min().unwrap_or(0) as f64;
        let t = Instant::now();
        let mut caught_up = true;
        for s in &self.seen {
            let mut s = s.clone();
            let left = CATCH_UP.saturating_sub(t.elapsed());
            let wait = s.wait_for(|s| s.revision >= revision || s.ended.is_some());
            let ok = matches!(
                tokio::time::timeout(left, wait).await,
                Ok(Ok(s)) if s.ended.is_none()
            );
            caught_up &= ok;
        }
        WatchStats {
            watchers: self.seen.len(),
            events,
            events_per_sec: slowest / seconds.max(f64::MIN_POSITIVE),
            ratio: slowest / (puts.max(1) as f64),
            lag_ms: caught_up.then(|| t.elapsed().as_secs_f64() * 1e3),
            errors: self
                .seen
                .iter()
                .filter_map(|s| s.borrow().ended.clone())
                .collect(),
        }
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One watcher on `prefix` at `addr`: its counts, and the task reading
/// its stream.
async fn start_one(
    addr: &str,
    prefix: &str,
) -> Result<(watch::Receiver<Seen>, tokio::task::JoinHandle<()>), String> {
    let mut client = WatchClient::new(channel(addr, None).await?);
    let (requests, rx) = mpsc::channel(1);
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: raftkv_wire::prefix_end(prefix.as_bytes()),
                ..Default::default()
            },
        )),
    };
    requests
        .send(create)
        .await
        .map_err(|_| format!("{addr}: watch stream closed"))?;
    let open = client.watch(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut stream = tokio::time::timeout(CATCH_UP, open)
        .await
        .map_err(|_| format!("{addr}: no watch stream in 30 s"))?
        .map_err(|s| format!("{addr}: watch: {}", s.message()))?
        .into_inner();
    let first = tokio::time::timeout(CATCH_UP, stream.next()).await;
    match first {
        Ok(Some(Ok(r))) if r.created && !r.canceled => {}
        Ok(Some(Ok(r))) => return Err(format!("{addr}: watch not created: {r:?}")),
        Ok(Some(Err(s))) => return Err(format!("{addr}: watch: {}", s.message())),
        Ok(None) => return Err(format!("{addr}: watch stream ended")),
        Err(_) => return Err(format!("{addr}: no watch created in 30 s")),
    }
    let (tx, seen) = watch::channel(Seen::default());
    let task = tokio::spawn(async move {
        // The request side stays open while the watcher reads.
        let _requests = requests;
        let why = loop {
            match stream.next().await {
                Some(Ok(r)) if r.canceled => {
                    break format!(
                        "canceled: {} (compacted at {})",
                        r.cancel_reason, r.compact_revision
                    )
                }
                Some(Ok(r)) => tx.send_modify(|s| {
                    s.events += r.events.len() as u64;
                    let last = r
                        .events
                        .iter()
                        .filter_map(|e| e.kv.as_ref())
                        .map(|kv| kv.mod_revision);
                    s.revision = last.fold(s.revision, i64::max);
                }),
                Some(Err(e)) => break format!("{:?}: {}", e.code(), e.message()),
                None => break "the stream ended".into(),
            }
        };
        tx.send_modify(|s| s.ended = Some(why));
    });
    Ok((seen, task))
}
