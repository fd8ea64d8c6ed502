//! The lagging follower (`lagging-follower`, run by name, not in
//! [`Fault::ALL`]): a cluster loaded as a user loads it — [`Lag::keys`]
//! keys of [`Lag::value_bytes`] through `POST /txn` transactions of 64
//! puts, [`Lag::load_clients`] at once — then one follower `SIGSTOP`ped
//! while the others take [`Lag::behind_bytes`] more of such puts
//! (overwrites of the same keys), then resumed. The recorded clients of
//! the matrix (`workload`'s client loop) run from before the stop to after
//! the catch-up, and every key's history is checked as in every run.
//!
//! The run fails (besides a violation or an undecided key) if the
//! follower does not reach the leader's applied index of the moment it
//! resumed within [`Lag::catch_up_bound`], or if any node's resident
//! memory — `VmRSS` of `/proc/PID/status` of the processes the run
//! started, sampled every 50 ms from their start to the end, and their
//! `VmHWM` at the end — passes [`Lag::rss_limit_mib`].

use super::cluster::ProcCluster;
use super::run::{compare_hashes, final_reads, measure};
use super::{nanos, workload, Fault, Params, Report};
use crate::compare::{metric, sampler, status_mib};
use base64::Engine;
use journal_core::sync::Mutex;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Puts of `entry` bytes (key and value) per loading transaction: as the
/// load issue 58 was found with, 64 puts and at most 1 MiB (well inside
/// etcd's bounds, [`raftkv_wire::limits::MAX_TXN_OPS`] and, base64 in JSON,
/// [`raftkv_wire::limits::MAX_REQUEST_BYTES`]).
fn txn_puts(entry: u64) -> u64 {
    let by_bytes = (1u64 << 20) / entry.max(1);
    by_bytes.clamp(1, 64)
}

/// Tries of one loading transaction before the load gives up.
const TXN_TRIES: u32 = 30;

/// Time the catch-up bound allows beyond moving the bytes: an election,
/// a snapshot built on the leader before it is sent.
pub const CATCH_UP_SLACK: Duration = Duration::from_secs(30);

/// How big a lagging-follower run is.
#[derive(Debug, Clone, Serialize)]
pub struct Lag {
    /// Keys loaded before the follower stops.
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Bytes of puts (keys and values acknowledged) the others take while
    /// the follower is stopped, overwriting the loaded keys in order.
    pub behind_bytes: u64,
    /// Loading clients, each one transaction at a time.
    pub load_clients: usize,
    /// The bound on every node's resident memory, MiB.
    pub rss_limit_mib: f64,
    /// The arguments of every `raftkv serve` of this fault (in place of
    /// [`Params::serve_args`]): the defaults, as a user runs it (the
    /// snapshot policy by bytes).
    pub serve_args: Vec<String>,
}

impl Lag {
    /// The small run (the test's and, by default, `raftkv-tools faults
    /// --faults lagging-follower`): 4,000 keys of 1 KiB, 32 MiB behind —
    /// four appends of the budget, below the 64 MiB floor of a snapshot
    /// by bytes, so caught up by appends.
    pub fn small() -> Lag {
        Lag {
            keys: 4_000,
            value_bytes: 1024,
            behind_bytes: 32 << 20,
            load_clients: 16,
            rss_limit_mib: 512.0,
            serve_args: Vec::new(),
        }
    }

    /// The full run of issue 58: 1 M keys of 1 KiB, 1 GiB behind.
    pub fn full() -> Lag {
        Lag {
            keys: 1_000_000,
            value_bytes: 1024,
            behind_bytes: 1 << 30,
            ..Lag::small()
        }
    }

    /// Keys the recorded clients spread over: one per MiB behind, 64 to
    /// 1,024 (a longer run spreads its operations over more keys, so that
    /// each key's history stays short enough to check).
    pub fn record_keys(&self) -> u32 {
        (self.behind_bytes >> 20).clamp(64, 1024) as u32
    }

    /// How long the follower may take to catch up once resumed:
    /// [`CATCH_UP_SLACK`] and the time the larger of what it missed (the
    /// bytes behind, if sent as appends) and the state (about keys ×
    /// value, if sent as a snapshot) takes at the slowest rate the
    /// append deadline assumes of a follower
    /// ([`raftkv_wire::limits::MIN_APPEND_RATE`], 4 MiB/s): 1 GiB, 286 s.
    pub fn catch_up_bound(&self) -> Duration {
        let state = self
            .keys
            .saturating_mul(self.value_bytes as u64 + key_bytes(self.keys));
        let bytes = self.behind_bytes.max(state);
        let secs = bytes as f64 / raftkv_wire::limits::MIN_APPEND_RATE as f64;
        CATCH_UP_SLACK + Duration::from_secs_f64(secs)
    }
}

/// The bytes of a loaded key's name.
fn key_bytes(keys: u64) -> u64 {
    crate::bench::key(keys).len() as u64
}

/// What a lagging-follower run measured.
#[derive(Debug, Clone, Serialize)]
pub struct CatchUp {
    /// The scale.
    pub lag: Lag,
    /// The follower stopped (from 1).
    pub node: usize,
    /// Seconds the load of the keys took.
    pub load_s: f64,
    /// Bytes of puts acknowledged while the follower was stopped.
    pub bytes_behind: u64,
    /// Log entries the leader had applied past the follower when it
    /// resumed.
    pub entries_behind: u64,
    /// Seconds the follower was stopped.
    pub stopped_s: f64,
    /// Seconds from its resume to its applied index reaching the
    /// leader's of that moment (`None`: not within the bound).
    pub catch_up_s: Option<f64>,
    /// The bound, seconds.
    pub bound_s: f64,
    /// Snapshots the follower installed meanwhile (0: caught up by
    /// appends alone).
    pub snapshot_installs: u64,
    /// The largest append the leader sent (its metric), bytes.
    pub largest_append_bytes: u64,
    /// The most each node's sampled `VmRSS` reached, MiB.
    pub peak_rss_mib: Vec<f64>,
    /// Each node's `VmHWM` at the end (the kernel's own peak), MiB.
    pub hwm_mib: Vec<f64>,
}

impl CatchUp {
    /// The most any node's memory reached, MiB.
    pub fn worst_rss_mib(&self) -> f64 {
        self.peak_rss_mib
            .iter()
            .chain(&self.hwm_mib)
            .fold(0.0, |m: f64, &x| m.max(x))
    }

    /// Whether the follower caught up within the bound and no node
    /// passed the memory bound.
    pub fn passed(&self) -> bool {
        self.catch_up_s.is_some() && self.worst_rss_mib() <= self.lag.rss_limit_mib
    }
}

/// A transaction's body: puts of keys `first..first + n` (modulo
/// `keys`), each its own value of `value_bytes` from `seed`.
fn txn_body(first: u64, n: u64, keys: u64, value_bytes: usize, seed: &mut u64) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut value = vec![0u8; value_bytes];
    let success: Vec<serde_json::Value> = (first..first + n)
        .map(|i| {
            for chunk in value.chunks_mut(8) {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                let bytes = seed.to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
            let key = crate::bench::key(i.checked_rem(keys).unwrap_or(0));
            serde_json::json!({"put": {"key": key, "value": b64.encode(&value)}})
        })
        .collect();
    serde_json::json!({"success": success})
        .to_string()
        .into_bytes()
}

/// Puts `puts` keys from key number `first` (modulo [`Lag::keys`], values
/// of [`Lag::value_bytes`]) through transactions of [`txn_puts`],
/// `clients` at once, each sent to the first of `endpoints` (the leader)
/// and, after a failure, to the next (a `307` is followed; a `503` or no
/// answer retried, [`TXN_TRIES`] times; another `4xx` ends the load).
/// Returns the bytes of keys and values acknowledged.
async fn load(
    endpoints: &[String],
    first: u64,
    puts: u64,
    lag: &Lag,
    clients: usize,
) -> Result<u64, String> {
    let (keys, value_bytes) = (lag.keys, lag.value_bytes);
    let entry = key_bytes(keys) + value_bytes as u64;
    let per_txn = txn_puts(entry);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let txns = puts.div_ceil(per_txn);
    let clients = (clients.max(1) as u64).min(txns.max(1));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (http, endpoints) = (http.clone(), endpoints.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut seed = (first ^ c.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
            let (mut acked, mut at) = (0u64, 0usize);
            for t in (c..txns).step_by(clients as usize) {
                let from = first + t * per_txn;
                let n = per_txn.min(puts - t * per_txn);
                let body = txn_body(from, n, keys, value_bytes, &mut seed);
                let mut tries = 0;
                loop {
                    let url = format!("http://{}/txn", endpoints[at % endpoints.len()]);
                    let why = match http.post(&url).body(body.clone()).send().await {
                        Ok(r) if r.status().is_success() => break,
                        Ok(r) => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            if status.is_client_error() {
                                return Err(format!("txn of keys from {from}: {status} {text}"));
                            }
                            format!("{status} {}", text.trim())
                        }
                        Err(e) => e.to_string(),
                    };
                    tries += 1;
                    if tries == TXN_TRIES {
                        return Err(format!(
                            "txn of keys from {from}: {tries} tries, the last at {url}: {why}"
                        ));
                    }
                    at += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                acked += n * entry;
            }
            Ok::<_, String>(acked)
        }));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await.map_err(|e| e.to_string())??;
    }
    Ok(acked)
}

/// Node `i`'s applied index, if it answers.
async fn applied(c: &ProcCluster, i: usize) -> Option<u64> {
    c.status(i).await.and_then(|s| s.applied_index)
}

/// Node `i`'s Prometheus text (empty if it does not answer).
async fn metrics(c: &ProcCluster, i: usize) -> String {
    let url = format!("http://{}/metrics", c.nodes[i].cmd.addr);
    match reqwest::get(&url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Waits until node `i`'s applied index reaches `target`, up to `bound`;
/// the seconds it took.
async fn caught_up(c: &ProcCluster, i: usize, target: u64, bound: Duration) -> Option<f64> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if applied(c, i).await >= Some(target) {
            return Some(start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// The pids of `c`'s nodes.
fn pids(c: &ProcCluster) -> Vec<Option<u32>> {
    c.nodes
        .iter()
        .map(|n| n.child.as_ref().and_then(|ch| ch.id()))
        .collect()
}

/// A follower stopped while the others took a load: where things stood
/// when it was resumed.
struct Behind {
    /// The follower.
    node: usize,
    /// The leader when it was resumed.
    leader: usize,
    /// The leader's applied index then.
    target: u64,
    /// The follower's applied index just before it stopped.
    from: u64,
    /// Bytes of puts acknowledged meanwhile.
    bytes: u64,
    /// Seconds it was stopped.
    stopped_s: f64,
}

/// Stops a follower of `c` (`SIGSTOP`), loads [`Lag::behind_bytes`] of
/// puts through the others, and resumes it; says so in `events`.
async fn fall_behind(
    c: &mut ProcCluster,
    lag: &Lag,
    events: &mut Vec<String>,
    stamp: &dyn Fn(&str) -> String,
) -> Result<Behind, String> {
    let all: Vec<usize> = (0..c.nodes.len()).collect();
    let leader = c
        .leader(&all, Duration::from_secs(10))
        .await
        .ok_or("no leader after the load")?;
    let node = all
        .iter()
        .copied()
        .find(|&i| i != leader)
        .ok_or("no follower")?;
    let from = applied(c, node).await.unwrap_or(0);
    c.pause(node, true).await?;
    events.push(stamp(&format!(
        "SIGSTOP node {} at applied index {from}",
        node + 1
    )));
    let stopped_at = Instant::now();
    let endpoints = c.endpoints();
    let others: Vec<String> = std::iter::once(leader)
        .chain(all.iter().copied().filter(|&i| i != leader && i != node))
        .map(|i| endpoints[i].clone())
        .collect();
    let entry = lag.value_bytes as u64 + key_bytes(lag.keys);
    let puts = lag.behind_bytes.div_ceil(entry.max(1));
    let bytes = load(&others, lag.keys, puts, lag, lag.load_clients).await?;
    let live: Vec<usize> = all.iter().copied().filter(|&i| i != node).collect();
    let leader = c
        .leader(&live, Duration::from_secs(10))
        .await
        .ok_or("no leader after the lag")?;
    let target = applied(c, leader)
        .await
        .ok_or("the leader did not answer")?;
    let stopped_s = stopped_at.elapsed().as_secs_f64();
    c.pause(node, false).await?;
    events.push(stamp(&format!(
        "SIGCONT node {}: {:.1} MiB of puts behind, leader node {} at applied index {target}",
        node + 1,
        bytes as f64 / 1048576.0,
        leader + 1
    )));
    Ok(Behind {
        node,
        leader,
        target,
        from,
        bytes,
        stopped_s,
    })
}

/// The lagging-follower run on `c` (three nodes, started with
/// [`Lag::serve_args`]): load, recorded clients, a follower stopped
/// through [`Lag::behind_bytes`] of puts ([`fall_behind`]), resumed, its
/// catch-up timed, every node's memory sampled throughout; then the final
/// reads and the check.
pub(super) async fn drive(c: &mut ProcCluster, seed: u64, p: &Params) -> Result<Report, String> {
    let lag = &p.lag;
    let all: Vec<usize> = (0..c.nodes.len()).collect();
    let leader = c
        .leader(&all, Duration::from_secs(30))
        .await
        .ok_or("no leader within 30 s of the start")?;
    let base = Instant::now();
    let stamp = |what: &str| format!("{:>8.3} s  {what}", base.elapsed().as_secs_f64());
    let (sampled, sampling_done) = watch::channel(false);
    let sampling = sampler(Arc::new(Mutex::new(pids(c))), sampling_done);
    let mut events = Vec::new();
    let endpoints = c.endpoints();
    let leader_first: Vec<String> = std::iter::once(leader)
        .chain(all.iter().copied().filter(|&i| i != leader))
        .map(|i| endpoints[i].clone())
        .collect();
    let start = Instant::now();
    load(&leader_first, 0, lag.keys, lag, lag.load_clients).await?;
    let load_s = start.elapsed().as_secs_f64();
    events.push(stamp(&format!("{} keys loaded in {load_s:.1} s", lag.keys)));

    let clients = workload::Clients::start(
        p.api,
        &endpoints,
        (p.clients, lag.record_keys()),
        seed,
        base,
        p.op_deadline,
    );
    tokio::time::sleep(p.warmup).await;
    let window_start = nanos(base.elapsed());
    let b = fall_behind(c, lag, &mut events, &stamp).await?;
    let bound = lag.catch_up_bound();
    let catch_up_s = caught_up(c, b.node, b.target, bound).await;
    let window = (window_start, nanos(base.elapsed()));
    events.push(stamp(&match catch_up_s {
        Some(s) => format!("node {} caught up in {s:.1} s", b.node + 1),
        None => format!("node {} not caught up within {bound:?}", b.node + 1),
    }));
    tokio::time::sleep(p.settle).await;
    let mut recs = clients.stop().await?;
    // A cluster that does not recover ends the run; what happened before
    // goes with the error.
    let said = |e: &str| format!("{e}\n{}", events.join("\n"));
    let leader = c
        .leader(&all, Duration::from_secs(30))
        .await
        .ok_or_else(|| said("no leader within 30 s of the catch-up"))?;
    final_reads(p.api, &endpoints, &mut recs, base)
        .await
        .map_err(|e| said(&e))?;
    let (hashes, hash_mismatches) = compare_hashes(c, &all, leader)
        .await
        .map_err(|e| said(&e))?;
    events.extend(hashes.iter().map(|e| stamp(e)));
    let (follower, leader) = (metrics(c, b.node).await, metrics(c, b.leader).await);
    let hwm_mib = pids(c)
        .into_iter()
        .map(|p| status_mib(p, "VmHWM"))
        .collect();
    let _ = sampled.send(true);
    let peak_rss_mib = sampling.await.map_err(|e| e.to_string())?;
    let mut report = measure(
        Fault::LaggingFollower,
        false,
        seed,
        &recs,
        &[window],
        p,
        events,
    );
    report.hash_mismatches = hash_mismatches;
    report.lag = Some(CatchUp {
        lag: lag.clone(),
        node: b.node + 1,
        load_s,
        bytes_behind: b.bytes,
        entries_behind: b.target.saturating_sub(b.from),
        stopped_s: b.stopped_s,
        catch_up_s,
        bound_s: bound.as_secs_f64(),
        snapshot_installs: metric(
            &follower,
            "raftkv_snapshot_duration_seconds_count{op=\"install\"}",
        ) as u64,
        largest_append_bytes: metric(&leader, "raftkv_append_body_max_bytes") as u64,
        peak_rss_mib,
        hwm_mib,
    });
    Ok(report)
}

/// `c` as a Markdown table of one row.
pub fn summary(c: &CatchUp) -> String {
    let mib = |v: &[f64]| {
        v.iter()
            .map(|m| format!("{m:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    format!(
        "| keys × value | node stopped | load s | MiB behind | entries behind | stopped s | catch-up s (bound) | by | largest append MiB | peak RSS MiB (sampled) | VmHWM MiB | bound MiB | passed |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n\
         | {} × {} B | {} | {:.1} | {:.0} | {} | {:.1} | {} ({:.0}) | {} | {:.1} | {} | {} | {:.0} | {} |\n",
        c.lag.keys,
        c.lag.value_bytes,
        c.node,
        c.load_s,
        c.bytes_behind as f64 / 1048576.0,
        c.entries_behind,
        c.stopped_s,
        c.catch_up_s
            .map_or("not caught up".into(), |s| format!("{s:.1}")),
        c.bound_s,
        match c.snapshot_installs {
            0 => "appends".to_string(),
            n => format!("{n} snapshot install(s)"),
        },
        c.largest_append_bytes as f64 / 1048576.0,
        mib(&c.peak_rss_mib),
        mib(&c.hwm_mib),
        c.lag.rss_limit_mib,
        c.passed()
    )
}
