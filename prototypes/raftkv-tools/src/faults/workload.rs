//! Closed-loop clients over many keys, every operation recorded for the
//! checker: unique values; half puts, a quarter linearizable reads, a
//! quarter reads each followed by a compare-and-set from the revision
//! read; each client on its own fixed-seed sequence. Through either API
//! ([`Api`]):
//!
//! - **gRPC** (the default): etcd's `KV` service ([`super::grpc`]); a
//!   compare-and-set is a `Txn` on the key's `mod_revision`
//!   (`create_revision == 0` on an absent key). No request ids: a write
//!   is sent again only while it is known not applied, one in doubt is
//!   recorded so and left (the rule is [`super::grpc`]'s).
//! - **HTTP**: raftkv's JSON API ([`crate::client`]), each write retried
//!   under its request id until answered (`If-Match`, or `If-None-Match:
//!   *` on an absent key, for the compare-and-set).
//!
//! Each write records the revision its answer named, each read the
//! `mod_revision` it saw: the watch checker ([`crate::history::watch`])
//! holds the watch streams to them.

use super::grpc::{Failure, Found, GrpcClient};
use crate::client::{Client, ClientError};
use crate::history::{Kind, Op};
use raftkv_wire::Expect;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The API the recorded clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// etcd's gRPC API.
    #[default]
    Grpc,
    /// raftkv's HTTP API, with request ids.
    Http,
}

impl Api {
    /// The API named `s` (`grpc`, `http`).
    pub fn parse(s: &str) -> Option<Api> {
        match s {
            "grpc" => Some(Api::Grpc),
            "http" => Some(Api::Http),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Api::Grpc => "grpc",
            Api::Http => "http",
        }
    }
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Rec {
    /// The key's number (`key-N`).
    pub key: u32,
    /// What the checker sees. A read that got no answer is kept here for
    /// the error rate only, with [`Rec::failed`] set.
    pub op: Op,
    /// A read without an answer, or a write without one (in doubt, or
    /// [`Rec::not_applied`]).
    pub failed: bool,
    /// A write known not to have taken effect (every attempt refused):
    /// left out of the history, and its value must never be seen.
    pub not_applied: bool,
    /// An acknowledged write's revision; a read's `mod_revision` of the
    /// value it found.
    pub revision: Option<i64>,
}

impl Rec {
    /// When it ended (its invocation plus `deadline` if it never did).
    pub fn end(&self, deadline: Duration) -> u64 {
        self.op
            .completed
            .unwrap_or(self.op.invoked + deadline.as_nanos() as u64)
    }

    /// A read's record: `found` is `None` if it got no answer.
    pub fn read(key: u32, invoked: u64, completed: u64, found: Option<Found>) -> Rec {
        let failed = found.is_none();
        let found = found.flatten();
        Rec {
            key,
            revision: found.as_ref().map(|f| f.1),
            op: Op {
                invoked,
                completed: Some(completed),
                kind: Kind::Read(found.map(|f| f.0)),
            },
            failed,
            not_applied: false,
        }
    }
}

/// The name of key number `k`.
pub fn key_name(k: u32) -> String {
    format!("key-{k}")
}

/// Recorded clients at work until stopped.
#[derive(Debug)]
pub struct Clients {
    stop: watch::Sender<bool>,
    /// Writes acknowledged so far, by all the clients.
    acked: Arc<watch::Sender<usize>>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Rec>>>,
}

impl Clients {
    /// Starts clients 101 to 100 + `n` (`client`) on keys `0..keys`,
    /// through `api`.
    pub fn start(
        api: Api,
        endpoints: &[String],
        (n, keys): (u64, u32),
        seed: u64,
        base: Instant,
        deadline: Duration,
    ) -> Clients {
        let (stop, stopped) = watch::channel(false);
        let acked = Arc::new(watch::Sender::new(0));
        let tasks = (1..=n)
            .map(|id| {
                tokio::spawn(client(
                    Conn::new(api, endpoints, 100 + id, deadline),
                    100 + id,
                    (keys, seed),
                    base,
                    (stopped.clone(), acked.clone()),
                ))
            })
            .collect();
        Clients { stop, acked, tasks }
    }

    /// Waits until the clients have had `n` writes acknowledged in all,
    /// or `limit` passed; whether they did. (A run that ends before its
    /// clients did anything checks nothing: on a loaded machine a fixed
    /// time may not be enough, so a run waits for work, not for time.)
    pub async fn acked_at_least(&self, n: usize, limit: Duration) -> bool {
        let mut rx = self.acked.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|&c| c >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Stops them; what they recorded.
    pub async fn stop(self) -> Result<Vec<Rec>, String> {
        let _ = self.stop.send(true);
        let mut recs = Vec::new();
        for t in self.tasks {
            recs.extend(t.await.map_err(|e| e.to_string())?);
        }
        Ok(recs)
    }
}

/// What became of a write.
enum Written {
    /// Acknowledged (at this revision, if the answer said).
    Applied(Option<i64>),
    /// Known not applied.
    NotApplied,
    /// In doubt.
    InDoubt,
}

/// After a write in doubt, a client pauses this long: a member that fails
/// every write at once (a follower whose leader is gone) would otherwise
/// fill the history with writes in doubt.
const IN_DOUBT_PAUSE: Duration = Duration::from_millis(100);

/// A client of either API.
#[derive(Debug)]
enum Conn {
    Http(Client),
    Grpc(GrpcClient),
}

impl Conn {
    fn new(api: Api, endpoints: &[String], id: u64, deadline: Duration) -> Option<Conn> {
        match api {
            Api::Http => Client::new(endpoints, id).ok().map(|mut c| {
                c.deadline = deadline;
                Conn::Http(c)
            }),
            Api::Grpc => {
                let mut c = GrpcClient::new(endpoints);
                c.deadline = deadline;
                Some(Conn::Grpc(c))
            }
        }
    }

    fn send_next_to(&mut self, i: usize) {
        match self {
            Conn::Http(c) => c.send_next_to(i),
            Conn::Grpc(c) => c.send_next_to(i),
        }
    }

    async fn put(&mut self, key: &str, value: &[u8]) -> Written {
        match self {
            Conn::Http(c) => match c.put(key, value).await {
                Ok(_) => Written::Applied(c.last_revision()),
                Err(ClientError::Refused(_)) => Written::NotApplied,
                Err(ClientError::Unknown(_)) => Written::InDoubt,
            },
            Conn::Grpc(c) => match c.put(key, value).await {
                Ok(rev) => Written::Applied(Some(rev)),
                Err(Failure::NotApplied(_)) => Written::NotApplied,
                Err(Failure::InDoubt(_)) => Written::InDoubt,
            },
        }
    }

    /// A linearizable read; `None` without an answer.
    async fn get(&mut self, key: &str) -> Option<Found> {
        match self {
            Conn::Http(c) => c.get_entry(key).await.ok(),
            Conn::Grpc(c) => c.get(key).await.ok().map(|(found, _)| found),
        }
    }

    /// A compare-and-set from `expect` (a `mod_revision`, `None`: absent):
    /// what became of it, and whether it held if answered.
    async fn cas(
        &mut self,
        key: &str,
        expect: Option<i64>,
        value: &[u8],
    ) -> (Written, Option<bool>) {
        match self {
            Conn::Http(c) => {
                let cond = expect.map_or(Expect::Absent, Expect::ModRevision);
                match c.put_if(key, value, &cond).await {
                    Ok(true) => (Written::Applied(c.last_revision()), Some(true)),
                    Ok(false) => (Written::NotApplied, Some(false)),
                    Err(ClientError::Refused(_)) => (Written::NotApplied, None),
                    Err(ClientError::Unknown(_)) => (Written::InDoubt, None),
                }
            }
            Conn::Grpc(c) => match c.cas(key, expect, value).await {
                Ok((true, rev)) => (Written::Applied(Some(rev)), Some(true)),
                Ok((false, _)) => (Written::NotApplied, Some(false)),
                Err(Failure::NotApplied(_)) => (Written::NotApplied, None),
                Err(Failure::InDoubt(_)) => (Written::InDoubt, None),
            },
        }
    }
}

/// The record of a write (`kind`) invoked at `invoked` that ended as
/// `w`, answered now if it was.
fn written(key: u32, invoked: u64, now: u64, kind: Kind, w: &Written) -> Rec {
    let answered = match &kind {
        Kind::Cas { succeeded, .. } => succeeded.is_some(),
        _ => matches!(w, Written::Applied(_)),
    };
    Rec {
        key,
        op: Op {
            invoked,
            completed: answered.then_some(now),
            kind,
        },
        failed: !answered,
        not_applied: !answered && matches!(w, Written::NotApplied),
        revision: match w {
            Written::Applied(r) => *r,
            _ => None,
        },
    }
}

/// Runs client `id` on `conn` until `stop` turns true, counting its
/// acknowledged puts in `acked`; returns what it recorded. Times are
/// nanoseconds since `base`. An odd `id` sends every operation first to
/// its home member (`id` modulo the members), as clients spread over the
/// members do; an even one keeps to the last member that answered.
async fn client(
    conn: Option<Conn>,
    id: u64,
    (keys, seed): (u32, u64),
    base: Instant,
    (stop, acked): (watch::Receiver<bool>, Arc<watch::Sender<usize>>),
) -> Vec<Rec> {
    let mut out = Vec::new();
    let Some(mut c) = conn else {
        return out;
    };
    let mut x = seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let now = || base.elapsed().as_nanos() as u64;
    let mut n = 0u64;
    let home = (id % 2 == 1).then_some(id as usize);
    while !*stop.borrow() {
        if let Some(h) = home {
            c.send_next_to(h);
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = (x % u64::from(keys.max(1))) as u32;
        let name = key_name(key);
        let invoked = now();
        n += 1;
        if (x >> 32).is_multiple_of(2) {
            let value = format!("c{id}-{n}").into_bytes();
            let w = c.put(&name, &value).await;
            if matches!(w, Written::Applied(_)) {
                acked.send_modify(|a| *a += 1);
            }
            out.push(written(key, invoked, now(), Kind::Write(Some(value)), &w));
            if matches!(w, Written::InDoubt) {
                tokio::time::sleep(IN_DOUBT_PAUSE).await;
            }
            continue;
        }
        let found = c.get(&name).await;
        out.push(Rec::read(key, invoked, now(), found.clone()));
        let Some(found) = found.filter(|_| (x >> 33).is_multiple_of(2)) else {
            continue;
        };
        n += 1;
        let value = format!("c{id}-{n}").into_bytes();
        let invoked = now();
        let (w, succeeded) = c.cas(&name, found.as_ref().map(|f| f.1), &value).await;
        let kind = Kind::Cas {
            expect: found.map(|f| f.0),
            write: Some(value),
            succeeded,
        };
        out.push(written(key, invoked, now(), kind, &w));
        if matches!(w, Written::InDoubt) {
            tokio::time::sleep(IN_DOUBT_PAUSE).await;
        }
    }
    out
}

/// Linearizable reads of keys `0..keys`, all at once, at `endpoint`
/// alone, each retrying its connection every 2 ms until the node listens
/// (started just before the node is): the node binds its port before it
/// starts Raft, so these reads wait in its backlog and are the first it
/// serves — when a restarted node's state machine has not caught up
/// yet. An answer other than a value (a redirect, `503`) is recorded as a
/// failed read.
pub async fn probe(endpoint: String, keys: u32, base: Instant, deadline: Duration) -> Vec<Rec> {
    let Ok(http) = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(deadline)
        .build()
    else {
        return Vec::new();
    };
    let mut reads = Vec::new();
    for k in 0..keys {
        let url = format!("http://{endpoint}/kv/{}", key_name(k));
        let http = http.clone();
        reads.push(tokio::spawn(async move {
            let start = Instant::now();
            loop {
                let invoked = base.elapsed().as_nanos() as u64;
                let r = http.get(&url).send().await;
                let answer = match r {
                    Err(e) if e.is_connect() && start.elapsed() < deadline => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    Err(_) => None,
                    Ok(resp) => {
                        let status = resp.status();
                        match resp.bytes().await {
                            Ok(b) if status == reqwest::StatusCode::OK => Some(Some(b.to_vec())),
                            Ok(_) if status == reqwest::StatusCode::NOT_FOUND => Some(None),
                            _ => None,
                        }
                    }
                };
                let completed = base.elapsed().as_nanos() as u64;
                let found = answer.map(|a| a.map(|v| (v, 0)));
                let mut rec = Rec::read(k, invoked, completed, found);
                // (The HTTP probe does not read the ETag.)
                rec.revision = None;
                return rec;
            }
        }));
    }
    let mut out = Vec::new();
    for r in reads {
        if let Ok(rec) = r.await {
            out.push(rec);
        }
    }
    out
}
