//! The load client of `raftkv bench` and `raftkv-tools compare`: closed-loop
//! clients on etcd v3's gRPC API, through the `etcd-api` crate's tonic
//! stubs (`KvClient`, `MaintenanceClient`), so that one client measures
//! raftkv and etcd alike — one client against two servers.
//!
//! Each client has its own HTTP/2 connection to one endpoint, round robin
//! ([`endpoint`]: client `c` of a rotation `r` on endpoint `(c + r) mod
//! n`), whatever the system and whichever member leads: a client on a
//! follower pays that system's forwarding to its leader. Each sends one
//! request and waits for its answer before the next ([`Op`]): a put of a
//! value of the given size, or a linearizable read of one key (a `Range`,
//! not serializable: the member confirms with its leader that it is up to
//! date, as etcd's read index does). Per client count: requests answered
//! per second and their latency distribution.
//!
//! Keys ([`Workload`]): by default each client puts and reads 1,024 keys
//! of its own (`bench/C/I`); with a keyspace of N keys (loaded first by
//! [`load`]), random keys among the N (`k/0000000042`), so the store is
//! as large as N makes it, and a read that finds no key is a failure.

use etcd_api::etcdserverpb as pb;
use pb::kv_client::KvClient;
use pb::maintenance_client::MaintenanceClient;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// How long one request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Keys each client rewrites without a keyspace.
const OWN_KEYS: u64 = 1024;

/// What a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// A put (`KV.Put`) of one key.
    Put,
    /// A linearizable read (`KV.Range`, not serializable) of one key.
    Get,
}

impl Op {
    /// The op named `s` (`put`, `get`).
    pub fn parse(s: &str) -> Option<Op> {
        match s {
            "put" | "puts" => Some(Op::Put),
            "get" | "gets" => Some(Op::Get),
            _ => None,
        }
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
        }
    }
}

/// The keys and values a measurement uses.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Bytes per value.
    pub value_size: usize,
    /// Keys loaded by [`load`] (0: each client its own 1,024 keys).
    pub keys: u64,
    /// The first endpoint's rotation (see [`endpoint`]).
    pub rotation: usize,
}

/// One client count's result for one op.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    /// What the clients sent.
    pub op: Op,
    /// Concurrent closed-loop clients.
    pub clients: usize,
    /// Requests answered.
    pub ops: u64,
    /// Requests that failed (errors, timeouts, a read that found no key
    /// of the keyspace).
    pub failed: u64,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Seconds measured.
    pub seconds: f64,
    /// Requests answered per second.
    pub ops_per_sec: f64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// The highest store revision an answer's header named.
    pub revision: i64,
}

/// The endpoint of client `c` in rotation `rotation`: round robin over
/// `endpoints`, the same rule for every system.
pub fn endpoint(endpoints: &[String], c: usize, rotation: usize) -> Result<&str, String> {
    match endpoints.len() {
        0 => Err("no endpoints".into()),
        n => Ok(&endpoints[c.wrapping_add(rotation) % n]),
    }
}

/// A connection to `addr` (`host:port` or a URL); requests time out after
/// `timeout` (`None`: never, for watch streams).
pub async fn channel(addr: &str, timeout: Option<Duration>) -> Result<Channel, String> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let mut e = Endpoint::from_shared(url)
        .map_err(|e| format!("{addr}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if let Some(t) = timeout {
        e = e.timeout(t);
    }
    e.connect().await.map_err(|e| format!("{addr}: {e}"))
}

/// The index in `endpoints` of the member that names itself the leader
/// (`Maintenance.Status`), if one does.
pub async fn leader(endpoints: &[String]) -> Option<usize> {
    for (i, e) in endpoints.iter().enumerate() {
        let Ok(ch) = channel(e, Some(Duration::from_secs(5))).await else {
            continue;
        };
        let Ok(s) = MaintenanceClient::new(ch)
            .status(pb::StatusRequest {})
            .await
        else {
            continue;
        };
        let s = s.into_inner();
        if s.header
            .is_some_and(|h| h.member_id == s.leader && s.leader != 0)
        {
            return Some(i);
        }
    }
    None
}

/// The key of index `i` in a keyspace of N keys.
pub fn key(i: u64) -> String {
    format!("k/{i:010}")
}

/// The prefix every key of a measurement with `keys` keys starts with
/// (what the watchers of `raftkv-tools compare` watch).
pub fn prefix(keys: u64) -> &'static str {
    if keys == 0 {
        "bench/"
    } else {
        "k/"
    }
}

/// The key of client `c`'s `i`-th request.
fn key_of(keys: u64, seed: u64, c: usize, i: u64) -> String {
    match keys {
        0 => format!("bench/{c}/{}", i % OWN_KEYS),
        n => key(mix(seed ^ c as u64, i) % n),
    }
}

/// A well-mixed random number from (client, n).
fn mix(c: u64, n: u64) -> u64 {
    let mut x = c.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 29)
}

/// A seed per run, from the clock: runs pick different random keys.
fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn status_text(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// Sends one request; the store revision its answer names.
async fn one(
    kv: &mut KvClient<Channel>,
    op: Op,
    key: String,
    value: &[u8],
    keyed: bool,
) -> Result<i64, String> {
    let header = match op {
        Op::Put => {
            let req = pb::PutRequest {
                key: key.into_bytes(),
                value: value.to_vec(),
                ..Default::default()
            };
            let r = kv.put(req).await.map_err(|s| status_text(&s))?;
            r.into_inner().header
        }
        Op::Get => {
            let req = pb::RangeRequest {
                key: key.into_bytes(),
                ..Default::default()
            };
            let r = kv.range(req).await.map_err(|s| status_text(&s))?;
            let r = r.into_inner();
            if keyed && r.kvs.is_empty() {
                return Err("a key of the keyspace not found".into());
            }
            r.header
        }
    };
    Ok(header.map_or(0, |h| h.revision))
}

/// Connects `clients` KV clients, round robin.
async fn connect_all(
    endpoints: &[String],
    clients: usize,
    rotation: usize,
) -> Result<Vec<KvClient<Channel>>, String> {
    let mut all = Vec::with_capacity(clients);
    for c in 0..clients {
        let addr = endpoint(endpoints, c, rotation)?;
        all.push(KvClient::new(channel(addr, Some(REQUEST_TIMEOUT)).await?));
    }
    Ok(all)
}

/// Puts keys `0..keys` (see [`key`]) with `clients` closed-loop clients,
/// each its share in order, a failed put retried (up to 10 tries, with a
/// growing pause); returns the seconds it took.
pub async fn load(
    endpoints: &[String],
    keys: u64,
    value_size: usize,
    clients: usize,
    progress: Option<indicatif::ProgressBar>,
) -> Result<f64, String> {
    let value = Arc::new(vec![b'l'; value_size]);
    let conns = connect_all(endpoints, clients.max(1), 0).await?;
    let step = conns.len() as u64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut kv) in conns.into_iter().enumerate() {
        let (value, progress) = (value.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = c as u64;
            while i < keys {
                let mut tries = 0u64;
                while let Err(e) = one(&mut kv, Op::Put, key(i), &value, false).await {
                    tries += 1;
                    if tries == 10 {
                        return Err(format!("loading key {i}: {e}"));
                    }
                    tokio::time::sleep(Duration::from_millis(100 * tries)).await;
                }
                if let Some(p) = &progress {
                    p.inc(1);
                }
                i += step;
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// What one client counted (`H`: bench-harness's histogram).
struct Tally<H> {
    latencies: H,
    failed: u64,
    first_error: Option<String>,
    revision: i64,
}

/// Runs `clients` closed-loop clients sending `op` for `duration` against
/// `endpoints` (connected first, outside the time measured).
pub async fn run_level(
    op: Op,
    endpoints: &[String],
    clients: usize,
    w: Workload,
    duration: Duration,
    progress: Option<indicatif::ProgressBar>,
) -> Result<Level, String> {
    let value = Arc::new(vec![b'v'; w.value_size]);
    let conns = connect_all(endpoints, clients, w.rotation).await?;
    let seed = seed();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut kv) in conns.into_iter().enumerate() {
        let (value, progress) = (value.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = Tally {
                latencies: bench_harness::histogram(),
                failed: 0,
                first_error: None,
                revision: 0,
            };
            let mut i = 0u64;
            while start.elapsed() < duration {
                let key = key_of(w.keys, seed, c, i);
                i += 1;
                let began = Instant::now();
                match one(&mut kv, op, key, &value, w.keys > 0).await {
                    Ok(revision) => {
                        t.latencies
                            .saturating_record(bench_harness::micros(began.elapsed()));
                        t.revision = t.revision.max(revision);
                        if let Some(p) = &progress {
                            p.inc(1);
                        }
                    }
                    Err(e) => {
                        t.failed += 1;
                        t.first_error.get_or_insert(e);
                    }
                }
            }
            t
        }));
    }
    let mut all = bench_harness::histogram();
    let (mut failed, mut first_error, mut revision) = (0, None, 0);
    for task in tasks {
        let t = task.await.map_err(|e| e.to_string())?;
        all.add(&t.latencies).map_err(|e| e.to_string())?;
        failed += t.failed;
        revision = revision.max(t.revision);
        first_error = first_error.or(t.first_error);
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Level {
        op,
        clients,
        ops: all.len(),
        failed,
        first_error,
        seconds,
        ops_per_sec: all.len() as f64 / seconds,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        revision,
    })
}
