//! Closed-loop clients over many keys, every operation recorded for the
//! checker: unique values; half puts, a quarter linearizable reads, a
//! quarter reads each followed by a compare-and-set from the revision
//! read (`If-Match`, or `If-None-Match: *` on an absent key); each client
//! on its own fixed-seed sequence.

use crate::client::{Client, ClientError};
use crate::history::{Kind, Op};
use raftkv_wire::Expect;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Rec {
    /// The key's number (`key-N`).
    pub key: u32,
    /// What the checker sees. A read that got no answer is kept here for
    /// the error rate only, with [`Rec::failed`] set.
    pub op: Op,
    /// A read without an answer, or a write whose outcome is unknown.
    pub failed: bool,
}

impl Rec {
    /// When it ended (its invocation plus `deadline` if it never did).
    pub fn end(&self, deadline: Duration) -> u64 {
        self.op
            .completed
            .unwrap_or(self.op.invoked + deadline.as_nanos() as u64)
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
    /// Starts clients 101 to 100 + `n` ([`client`]) on keys `0..keys`.
    pub fn start(
        endpoints: &[String],
        n: u64,
        keys: u32,
        seed: u64,
        base: Instant,
        deadline: Duration,
    ) -> Clients {
        let (stop, stopped) = watch::channel(false);
        let acked = Arc::new(watch::Sender::new(0));
        let tasks = (1..=n)
            .map(|id| {
                tokio::spawn(client(
                    endpoints.to_vec(),
                    100 + id,
                    keys,
                    seed,
                    base,
                    deadline,
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

/// Runs client `id` until `stop` turns true, each operation retried by the
/// client up to `deadline`, counting its acknowledged puts in `acked`;
/// returns what it recorded. Times are
/// nanoseconds since `base`. An odd `id` sends every operation first to
/// its home node (`id` modulo the nodes), as clients spread over the
/// members do, and follows a redirect to the leader from there; an even
/// one keeps to the last leader it found.
pub async fn client(
    endpoints: Vec<String>,
    id: u64,
    keys: u32,
    seed: u64,
    base: Instant,
    deadline: Duration,
    (stop, acked): (watch::Receiver<bool>, Arc<watch::Sender<usize>>),
) -> Vec<Rec> {
    let mut out = Vec::new();
    let Ok(mut c) = Client::new(&endpoints, id) else {
        return out;
    };
    c.deadline = deadline;
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
            // A refused write (4xx) did not happen, but treating it as
            // unknown is never wrong for the checker.
            let r = c.put(&name, &value).await;
            let ok = r.is_ok();
            if ok {
                acked.send_modify(|a| *a += 1);
            }
            out.push(Rec {
                key,
                op: Op {
                    invoked,
                    completed: ok.then(now),
                    kind: Kind::Write(Some(value)),
                },
                failed: !ok,
            });
        } else {
            let (kind, completed, failed) = match c.get_entry(&name).await {
                Ok(v) => (Kind::Read(v.clone().map(|(v, _)| v)), Some(now()), false),
                Err(ClientError::Unknown(_) | ClientError::Refused(_)) => {
                    (Kind::Read(None), Some(now()), true)
                }
            };
            let read = (!failed).then(|| match &kind {
                Kind::Read(v) => v.clone().map(|v| (v, c.last_revision())),
                _ => None,
            });
            out.push(Rec {
                key,
                op: Op {
                    invoked,
                    completed,
                    kind,
                },
                failed,
            });
            if let Some(read) = read.filter(|_| (x >> 33).is_multiple_of(2)) {
                n += 1;
                if let Some(rec) = cas(&mut c, key, read, format!("c{id}-{n}"), base).await {
                    out.push(rec);
                }
            }
        }
    }
    out
}

/// A compare-and-set of key `key` from what a read found (its value and
/// revision; `None`: absent) to `value`, recorded; none if the read had
/// no revision.
async fn cas(
    c: &mut Client,
    key: u32,
    read: Option<(Vec<u8>, Option<i64>)>,
    value: String,
    base: Instant,
) -> Option<Rec> {
    let now = || base.elapsed().as_nanos() as u64;
    let invoked = now();
    let (expect, cond) = match read {
        None => (None, Expect::Absent),
        Some((v, Some(r))) => (Some(v), Expect::ModRevision(r)),
        Some((_, None)) => return None,
    };
    let value = value.into_bytes();
    let r = c.put_if(&key_name(key), &value, &cond).await;
    Some(Rec {
        key,
        op: Op {
            invoked,
            completed: r.is_ok().then(now),
            kind: Kind::Cas {
                expect,
                write: Some(value),
                succeeded: r.as_ref().ok().copied(),
            },
        },
        failed: r.is_err(),
    })
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
                let completed = Some(base.elapsed().as_nanos() as u64);
                return Rec {
                    key: k,
                    op: Op {
                        invoked,
                        completed,
                        kind: Kind::Read(answer.clone().flatten()),
                    },
                    failed: answer.is_none(),
                };
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
