//! A client of etcd's gRPC API for the recorded workload (etcd-api's tonic
//! `KvClient`): puts, linearizable `Range`s, compare-and-set as a `Txn`
//! on the key's `mod_revision` (`create_revision == 0` for an absent
//! key), compactions.
//!
//! # Writes in doubt
//!
//! etcd's API has no request ids: a write sent twice may be applied
//! twice. So a write is sent again only when every attempt so far is
//! known not to have been applied; the first attempt whose fate is
//! unknown ends it, **in doubt** ([`Failure::InDoubt`]), never resent —
//! the checker then lets it take effect at most once, or not at all. An
//! attempt is known not applied ([`Failure::NotApplied`]) when:
//!
//! - it was never sent: this client's own connection to the member could
//!   not be made (each connection is made explicitly before a request
//!   goes on it, and dropped after any failure, so a connection error is
//!   always this client's, before sending — etcd's client retries a
//!   mutation in this case only);
//! - the member answered one of the refusals in [`NOT_APPLIED`]: raftkv
//!   answers "not leader" and "no leader" only before a write is proposed
//!   (openraft's `ForwardToLeader` comes before the entry is appended;
//!   a follower that forwards relays the leader's answer), "too many
//!   requests" before it is read, "database space exceeded" before it is
//!   proposed.
//!
//! Everything else is in doubt: the deadline passed, the connection broke
//! after the request went out, "request timed out", and any other
//! `Unavailable` — among them a follower's relayed failure to reach the
//! leader, which this client cannot tell from a leader that failed after
//! it took the write. A write whose attempts were all refused until the
//! deadline is recorded as not applied (the watch checker then expects
//! no event of its value); one in doubt as a write without an answer.
//!
//! Reads change nothing: a read is retried on any failure, at the next
//! member, until the deadline.

use super::workload::{key_name, Rec};
use etcd_api::etcdserverpb as pb;
use pb::kv_client::KvClient;
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// The refusals that prove a write was not applied (the message, or the
/// message followed by `": …"`), with code `Unavailable` or
/// `ResourceExhausted`.
pub const NOT_APPLIED: [&str; 4] = [
    "etcdserver: not leader",
    "etcdserver: no leader",
    "etcdserver: too many requests",
    "etcdserver: mvcc: database space exceeded",
];

/// How long a connection may take to be made.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The pause before a retry.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Why a call got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Known not to have been applied (never sent, or refused): a write
    /// may be sent again.
    NotApplied(String),
    /// It may have been applied: a write is not sent again.
    InDoubt(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotApplied(s) => write!(f, "not applied: {s}"),
            Failure::InDoubt(s) => write!(f, "in doubt: {s}"),
        }
    }
}

/// What an error status from a member says of a write (module docs).
pub fn classify(s: &Status) -> Failure {
    let m = s.message();
    let refused = matches!(s.code(), Code::Unavailable | Code::ResourceExhausted)
        && NOT_APPLIED.iter().any(|n| {
            m.strip_prefix(n)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
        });
    let what = format!("{:?}: {m}", s.code());
    if refused {
        Failure::NotApplied(what)
    } else {
        Failure::InDoubt(what)
    }
}

/// A call of the KV service.
#[derive(Debug, Clone)]
enum Call {
    Put(pb::PutRequest),
    Txn(pb::TxnRequest),
    Range(pb::RangeRequest),
    Compact(pb::CompactionRequest),
}

/// Its answer.
#[derive(Debug)]
enum Answer {
    Put(pb::PutResponse),
    Txn(pb::TxnResponse),
    Range(pb::RangeResponse),
    Compact,
}

async fn send(c: &mut KvClient<Channel>, call: Call) -> Result<Answer, Status> {
    Ok(match call {
        Call::Put(r) => Answer::Put(c.put(r).await?.into_inner()),
        Call::Txn(r) => Answer::Txn(c.txn(r).await?.into_inner()),
        Call::Range(r) => Answer::Range(c.range(r).await?.into_inner()),
        Call::Compact(r) => {
            c.compact(r).await?;
            Answer::Compact
        }
    })
}

fn revision(h: Option<&pb::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision)
}

/// A key's value and `mod_revision`, if it exists.
pub type Found = Option<(Vec<u8>, i64)>;

/// A gRPC client of the members at some endpoints.
#[derive(Debug)]
pub struct GrpcClient {
    endpoints: Vec<String>,
    channels: Vec<Option<Channel>>,
    /// The member the next attempt goes to.
    next: usize,
    /// How long a call may take, its retries included.
    pub deadline: Duration,
}

impl GrpcClient {
    /// A client of the members at `endpoints` (`host:port`).
    pub fn new(endpoints: &[String]) -> GrpcClient {
        GrpcClient {
            endpoints: endpoints.to_vec(),
            channels: vec![None; endpoints.len()],
            next: 0,
            deadline: Duration::from_secs(10),
        }
    }

    /// Sends the next call first to member `i` (modulo their number).
    pub fn send_next_to(&mut self, i: usize) {
        self.next = i.checked_rem(self.endpoints.len()).unwrap_or(0);
    }

    /// The connection to member `i`, made now if there is none.
    async fn channel(&mut self, i: usize) -> Result<Channel, String> {
        if let Some(Some(c)) = self.channels.get(i) {
            return Ok(c.clone());
        }
        let addr = self.endpoints.get(i).ok_or("no endpoints")?;
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let c = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
            .await
            .map_err(|_| format!("connecting to {addr}: timed out"))?
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        self.channels[i] = Some(c.clone());
        Ok(c)
    }

    /// One attempt of `call` within `left`, at the next member; after a
    /// failure its connection is dropped and the next attempt goes to
    /// the member after it.
    async fn attempt(&mut self, call: Call, left: Duration) -> Result<Answer, Failure> {
        let n = self.endpoints.len().max(1);
        let i = self.next % n;
        let r = match self.channel(i).await {
            Err(e) => Err(Failure::NotApplied(e)),
            Ok(ch) => {
                let mut c = KvClient::new(ch);
                match tokio::time::timeout(left, send(&mut c, call)).await {
                    Err(_) => Err(Failure::InDoubt(format!("no answer in {left:?}"))),
                    Ok(Ok(a)) => Ok(a),
                    Ok(Err(s)) => Err(classify(&s)),
                }
            }
        };
        if r.is_err() {
            if let Some(c) = self.channels.get_mut(i) {
                *c = None;
            }
            self.next = (i + 1) % n;
        }
        r
    }

    /// `call` (a write), sent again while its attempts are known not
    /// applied, until the deadline.
    async fn write(&mut self, call: Call) -> Result<Answer, Failure> {
        let start = Instant::now();
        loop {
            let left = self.deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Failure::NotApplied("refused until the deadline".into()));
            }
            match self.attempt(call.clone(), left).await {
                Err(Failure::NotApplied(_)) => tokio::time::sleep(RETRY_PAUSE).await,
                r => return r,
            }
        }
    }

    /// `call` (a read), retried on any failure until the deadline.
    async fn read(&mut self, call: Call) -> Result<Answer, String> {
        let start = Instant::now();
        loop {
            let left = self.deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err("no answer before the deadline".into());
            }
            match self.attempt(call.clone(), left).await {
                Ok(a) => return Ok(a),
                Err(_) => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
    }

    /// Puts `value` at `key`: the revision of the put.
    pub async fn put(&mut self, key: &str, value: &[u8]) -> Result<i64, Failure> {
        let req = pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            ..Default::default()
        };
        match self.write(Call::Put(req)).await? {
            Answer::Put(r) => Ok(revision(r.header.as_ref())),
            a => Err(Failure::InDoubt(format!("a put answered {a:?}"))),
        }
    }

    /// Puts `value` at `key` if the key's `mod_revision` is `expect`
    /// (`None`: if the key is absent): whether it did, and the revision
    /// of the answer (the put's if it did).
    pub async fn cas(
        &mut self,
        key: &str,
        expect: Option<i64>,
        value: &[u8],
    ) -> Result<(bool, i64), Failure> {
        use pb::compare::{CompareResult, CompareTarget, TargetUnion};
        let (target, operand) = match expect {
            Some(r) => (CompareTarget::Mod, TargetUnion::ModRevision(r)),
            None => (CompareTarget::Create, TargetUnion::CreateRevision(0)),
        };
        let put = pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            ..Default::default()
        };
        let req = pb::TxnRequest {
            compare: vec![pb::Compare {
                result: CompareResult::Equal as i32,
                target: target as i32,
                key: key.as_bytes().to_vec(),
                range_end: Vec::new(),
                target_union: Some(operand),
            }],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(put)),
            }],
            failure: Vec::new(),
        };
        match self.write(Call::Txn(req)).await? {
            Answer::Txn(r) => Ok((r.succeeded, revision(r.header.as_ref()))),
            a => Err(Failure::InDoubt(format!("a txn answered {a:?}"))),
        }
    }

    /// A linearizable read of `key`: its value and `mod_revision`, and the
    /// store's revision the answer reflects.
    pub async fn get(&mut self, key: &str) -> Result<(Found, i64), String> {
        let req = pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        };
        match self.read(Call::Range(req)).await? {
            Answer::Range(r) => {
                let found = r
                    .kvs
                    .into_iter()
                    .next()
                    .map(|kv| (kv.value, kv.mod_revision));
                Ok((found, revision(r.header.as_ref())))
            }
            a => Err(format!("a range answered {a:?}")),
        }
    }

    /// The store's revision, read linearizably.
    pub async fn revision(&mut self) -> Result<i64, String> {
        let req = pb::RangeRequest {
            key: vec![0],
            range_end: vec![0],
            count_only: true,
            ..Default::default()
        };
        match self.read(Call::Range(req)).await? {
            Answer::Range(r) => Ok(revision(r.header.as_ref())),
            a => Err(format!("a range answered {a:?}")),
        }
    }

    /// Compacts the store's history below `revision`.
    pub async fn compact(&mut self, revision: i64) -> Result<(), Failure> {
        let req = pb::CompactionRequest {
            revision,
            physical: false,
        };
        self.write(Call::Compact(req)).await.map(|_| ())
    }
}

/// Linearizable reads of keys `0..keys`, all at once, at `endpoint`
/// alone, once a connection to it is made (tried every 2 ms until
/// `deadline`, the node started just after this is): the node binds its
/// port before it starts Raft, so these reads wait in its backlog and are
/// among the first it serves — when a restarted node's state machine may
/// not have caught up yet. A read without an answer is recorded failed.
pub async fn probe(endpoint: String, keys: u32, base: Instant, deadline: Duration) -> Vec<Rec> {
    let start = Instant::now();
    let Ok(endpoint) = Endpoint::from_shared(format!("http://{endpoint}")) else {
        return Vec::new();
    };
    let ch = loop {
        match endpoint.connect().await {
            Ok(ch) => break ch,
            Err(_) if start.elapsed() < deadline => {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(_) => return Vec::new(),
        }
    };
    let reads: Vec<_> = (0..keys)
        .map(|k| {
            let mut c = KvClient::new(ch.clone());
            tokio::spawn(async move {
                let invoked = base.elapsed().as_nanos() as u64;
                let req = pb::RangeRequest {
                    key: key_name(k).into_bytes(),
                    ..Default::default()
                };
                let r = tokio::time::timeout(deadline, c.range(req)).await;
                let found = match r {
                    Ok(Ok(r)) => Some(
                        r.into_inner()
                            .kvs
                            .into_iter()
                            .next()
                            .map(|kv| (kv.value, kv.mod_revision)),
                    ),
                    _ => None,
                };
                Rec::read(k, invoked, base.elapsed().as_nanos() as u64, found)
            })
        })
        .collect();
    let mut out = Vec::new();
    for r in reads {
        if let Ok(rec) = r.await {
            out.push(rec);
        }
    }
    out
}

/// Compacts the store every `every`, keeping the last `keep` revisions,
/// until `stop` turns true: the revisions of the compactions asked for,
/// each with whether it was acknowledged. (Watchers behind a compaction
/// are canceled; members restarted or sent a snapshot must agree on it
/// in `HashKV`.)
pub async fn compactor(
    endpoints: Vec<String>,
    every: Duration,
    keep: i64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(i64, bool)> {
    let mut c = GrpcClient::new(&endpoints);
    c.deadline = Duration::from_secs(2);
    let mut asked: Vec<(i64, bool)> = Vec::new();
    loop {
        let stopped = tokio::time::timeout(every, stop.wait_for(|s| *s))
            .await
            .is_ok();
        if stopped {
            return asked;
        }
        let Ok(rev) = c.revision().await else {
            continue;
        };
        let at = rev.saturating_sub(keep);
        let last = asked.iter().filter(|a| a.1).map(|a| a.0).max().unwrap_or(0);
        if at > last {
            let ok = c.compact(at).await.is_ok();
            asked.push((at, ok));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_refusals_listed_are_not_applied() {
        let na = |s: Status| matches!(classify(&s), Failure::NotApplied(_));
        assert!(na(Status::unavailable("etcdserver: not leader")));
        assert!(na(Status::unavailable("etcdserver: no leader")));
        assert!(na(Status::resource_exhausted(
            "etcdserver: too many requests"
        )));
        assert!(na(Status::resource_exhausted(
            "etcdserver: too many requests: watch streams"
        )));
        assert!(na(Status::resource_exhausted(
            "etcdserver: mvcc: database space exceeded"
        )));
        // A write that may have been proposed, or a transport's failure.
        assert!(!na(Status::unavailable("etcdserver: request timed out")));
        assert!(!na(Status::unavailable("etcdserver: leader changed")));
        assert!(!na(Status::unavailable("etcdserver: not leaderish")));
        assert!(!na(Status::unavailable("error trying to connect: refused")));
        assert!(!na(Status::unknown("etcdserver: not leader")));
        assert!(!na(Status::cancelled("Timeout expired")));
        assert!(!na(Status::internal("h2 protocol error")));
    }
}
