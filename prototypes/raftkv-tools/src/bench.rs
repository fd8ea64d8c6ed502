//! `raftkv-tools bench`: closed-loop clients writing through the HTTP API, or
//! (feature `etcd`, `--etcd`) through etcd's own gRPC client to an etcd
//! cluster, the same workload.
//!
//! Each client sends one put (a fresh request id, a value of the given
//! size) and waits for its answer before the next: puts per second and
//! the latency distribution of the acknowledged puts, per client count.
//! Keys: by default each client rewrites 1,024 of its own; with a
//! keyspace of N keys (loaded first by [`load`]), random keys among the
//! N, so the store is as large as N makes it.
//! Each client has its own connection. etcd's clients talk to its leader
//! (found through its status API), as raftkv's follow the `307` to theirs:
//! neither pays a follower's forwarding hop.

use crate::client::Client;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One client count's result.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    /// Concurrent closed-loop clients.
    pub clients: usize,
    /// Acknowledged puts.
    pub puts: u64,
    /// Puts that got no answer (timeouts, refusals).
    pub failed: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Acknowledged puts per second.
    pub puts_per_sec: f64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
}

/// The system a bench writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// raftkv's HTTP API.
    Raftkv,
    /// etcd's gRPC API (feature `etcd`).
    Etcd,
}

/// One client's connection.
enum Putter {
    Raftkv(Client),
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::Client>),
}

impl Putter {
    async fn put(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        match self {
            Putter::Raftkv(c) => c
                .put(key, value)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            #[cfg(feature = "etcd")]
            Putter::Etcd(c) => c
                .put(key, value, None)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }
}

/// The endpoint of etcd's leader among `endpoints`.
#[cfg(feature = "etcd")]
async fn etcd_leader(endpoints: &[String]) -> Result<String, String> {
    for e in endpoints {
        let Ok(mut c) = etcd_client::Client::connect([e.as_str()], None).await else {
            continue;
        };
        if let Ok(s) = c.status().await {
            if s.header().map(|h| h.member_id()) == Some(s.leader()) {
                return Ok(e.clone());
            }
        }
    }
    Err(format!("no etcd leader among {endpoints:?}"))
}

async fn connect(system: System, endpoints: &[String], id: u64) -> Result<Putter, String> {
    match system {
        System::Raftkv => Ok(Putter::Raftkv(
            Client::new(endpoints, id).map_err(|e| e.to_string())?,
        )),
        #[cfg(feature = "etcd")]
        System::Etcd => {
            let leader = etcd_leader(endpoints).await?;
            let c = etcd_client::Client::connect([leader], None)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Putter::Etcd(Box::new(c)))
        }
        #[cfg(not(feature = "etcd"))]
        System::Etcd => Err("built without the `etcd` feature".into()),
    }
}

/// The key of index `i` in a keyspace of N keys.
pub fn key(i: u64) -> String {
    format!("k/{i:010}")
}

/// A well-mixed random number from (client, n).
fn mix(c: u64, n: u64) -> u64 {
    let mut x = c.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 29)
}

/// Distinct client ids per run: a bench run does not collide with an
/// earlier one's request ids.
fn client_base() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        & !0xffff
}

/// Puts keys `0..keys` (see [`key`]) with `clients` closed-loop clients,
/// each its share in order; returns the seconds it took.
pub async fn load(
    system: System,
    endpoints: &[String],
    keys: u64,
    value_size: usize,
    clients: usize,
    progress: Option<indicatif::ProgressBar>,
) -> Result<f64, String> {
    let value = Arc::new(vec![b'l'; value_size]);
    let start = Instant::now();
    let base = client_base();
    let clients = clients.max(1) as u64;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = connect(system, endpoints, base | c).await?;
        let (value, progress) = (value.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while i < keys {
                let mut tries = 0;
                while let Err(e) = client.put(&key(i), &value).await {
                    tries += 1;
                    if tries == 10 {
                        return Err(format!("loading key {i}: {e}"));
                    }
                }
                if let Some(p) = &progress {
                    p.inc(1);
                }
                i += clients;
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Runs `clients` closed-loop clients for `duration` against `endpoints`:
/// each rewrites 1,024 keys of its own, or (`keys` > 0) random keys of a
/// keyspace of `keys` loaded by [`load`].
pub async fn run_level(
    system: System,
    endpoints: &[String],
    clients: usize,
    value_size: usize,
    keys: u64,
    duration: Duration,
    progress: Option<indicatif::ProgressBar>,
) -> Result<Level, String> {
    let value = Arc::new(vec![b'v'; value_size]);
    let start = Instant::now();
    let mut tasks = Vec::new();
    let base = client_base();
    for c in 0..clients {
        let mut client = connect(system, endpoints, base | c as u64).await?;
        let value = value.clone();
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = bench_harness::histogram();
            let mut failed = 0u64;
            let mut i = 0u64;
            while start.elapsed() < duration {
                let key = match keys {
                    0 => format!("bench/{c}/{}", i % 1024),
                    n => key(mix(base | c as u64, i) % n),
                };
                i += 1;
                let t = Instant::now();
                match client.put(&key, &value).await {
                    Ok(_) => {
                        h.saturating_record(bench_harness::micros(t.elapsed()));
                        if let Some(p) = &progress {
                            p.inc(1);
                        }
                    }
                    Err(_) => failed += 1,
                }
            }
            Ok::<_, String>((h, failed))
        }));
    }
    let mut all = bench_harness::histogram();
    let mut failed = 0;
    for t in tasks {
        let (h, f) = t.await.map_err(|e| e.to_string())??;
        all.add(&h).map_err(|e| e.to_string())?;
        failed += f;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Level {
        clients,
        puts: all.len(),
        failed,
        seconds,
        puts_per_sec: all.len() as f64 / seconds,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
    })
}
