//! `raftkv-tools compare` (what `cargo xtask bench-raft` runs): a three-node
//! raftkv cluster and, when an `etcd` binary is given, a three-member etcd
//! cluster, both on loopback with their data in one temporary directory of
//! the local disk, measured in the same run through **the same client**:
//! etcd's gRPC API through the `etcd-api` stubs ([`crate::bench`]), each
//! closed-loop client on one member, round robin, whichever leads. For each
//! round and client count, each system in turn (the order alternating by
//! round) takes the same workload: puts for `--seconds`, then linearizable
//! reads (`Range`, not serializable) for as long ([`CompareOptions::ops`]),
//! with a few watchers attached throughout ([`watch`]: `Watch` streams on
//! the prefix of the keys written, counting events, so that one sees
//! whether they kept up). While one system is measured the other is paused
//! (`SIGSTOP`; [`CompareOptions::pause_idle`]), so that each pays for its
//! own background work. Besides requests/s and latency it reads, around
//! each phase, the CPU time of the system's three server processes
//! (`/proc/PID/stat`) and the flush requests completed by the disk under
//! the directory (`/sys/dev/block/M:m/stat`), and reports both per
//! request. Medians over rounds, with the range of requests/s
//! ([`summarize`]). Both systems compact their old versions alike: etcd
//! with `--auto-compaction-mode revision --auto-compaction-retention N`,
//! raftkv with its `serve` flags of the same names, N
//! [`CompareOptions::compaction_retention`]. With `--keys N`, each system
//! is first loaded with N keys through the same client (timed), and the
//! puts overwrite random keys among them and the reads read random ones;
//! the resident memory of every server process is sampled after each
//! measurement, and its peak (`VmHWM`) reported at the end; then a raftkv
//! follower is replaced (`replace.rs`) and its catch-up by snapshot timed,
//! with every node's memory sampled throughout.

mod replace;
mod summary;
pub mod watch;
pub use replace::Replacement;
pub(crate) use replace::{metric, sampler};
pub use summary::summarize;
pub use watch::{WatchStats, Watchers};

use crate::bench::{run_level, Level, Op, Workload};
use crate::local::LocalCluster as Cluster;
use bench_harness::{device_counter, device_stat, read_small};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// The systems compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// raftkv, three `raftkv serve` processes.
    Raftkv,
    /// etcd, three `etcd` processes.
    Etcd,
}

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Interleaved rounds.
    pub rounds: usize,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Client counts.
    pub clients: Vec<usize>,
    /// Bytes per value.
    pub value_size: usize,
    /// Keys loaded first, then overwritten and read at random (0: each
    /// client puts and reads 1,024 keys of its own).
    pub keys: u64,
    /// The phases of each measurement, in order, each `seconds` long.
    pub ops: Vec<Op>,
    /// Watch streams attached during each measurement (0: none).
    pub watchers: usize,
    /// The revisions both systems keep when they compact (etcd's
    /// `--auto-compaction-retention` in `revision` mode, every five
    /// minutes; raftkv's flags of the same names, the same default
    /// interval).
    pub compaction_retention: u64,
    /// The directory the temporary data directory is made in.
    pub dir: PathBuf,
    /// The `etcd` binary, if etcd is compared.
    pub etcd: Option<PathBuf>,
    /// The first of the loopback ports used (raftkv: P..P+2, etcd clients
    /// P+10.., peers P+20..).
    pub base_port: u16,
    /// More arguments to every `raftkv serve` (an experiment's settings;
    /// not the auto-compaction flags, which [`Self::compaction_retention`]
    /// sets for both systems).
    pub node_args: Vec<String>,
    /// Pause (`SIGSTOP`) the system not being measured, and resume it
    /// (`SIGCONT`, then a warm-up) before its own measurement: the two
    /// share one disk, and an idle system's background work (etcd's
    /// compaction and backend commits, raftkv's checkpoints and snapshots)
    /// would otherwise land in the other's tail latency. Each system then
    /// pays for its own background work, in its own measurements.
    pub pause_idle: bool,
    /// Every load client on the member that leads (found by
    /// `Maintenance.Status` before each measurement, as etcd's benchmark
    /// tool's `--target-leader`), instead of round robin over the
    /// members: no request pays a follower's forwarding. The watchers stay
    /// round robin.
    pub target_leader: bool,
}

/// One phase of a measurement: one op's requests, and what the servers
/// and the disk did for them.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// The clients' result.
    pub level: Level,
    /// CPU time of the three servers per request answered, µs.
    pub cpu_us_per_op: f64,
    /// Disk flush requests per request answered.
    pub flushes_per_op: f64,
}

/// One measurement: a system at a client count in a round.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// "raftkv" or "etcd".
    pub system: &'static str,
    /// The round (from 1).
    pub round: usize,
    /// Concurrent closed-loop clients.
    pub clients: usize,
    /// The endpoint (index) client 0 was on; client `c` was on the
    /// `c`-th after it, round robin.
    pub first_endpoint: usize,
    /// The endpoint (index) of the leader before the measurement, if one
    /// named itself.
    pub leader: Option<usize>,
    /// The puts.
    pub put: Option<Phase>,
    /// The linearizable reads.
    pub get: Option<Phase>,
    /// What the watchers received during the puts.
    pub watch: Option<WatchStats>,
    /// Resident memory of each server after the measurement, MiB.
    pub rss_mib: Vec<f64>,
}

/// A system's figures besides the samples.
#[derive(Debug, Clone, Serialize)]
pub struct SystemReport {
    /// "raftkv" or "etcd".
    pub system: &'static str,
    /// Seconds to load the keys (`None` without `--keys`).
    pub load_s: Option<f64>,
    /// Resident memory after the load, MiB, per server.
    pub rss_after_load_mib: Vec<f64>,
    /// Peak resident memory of each server over the whole run, MiB.
    pub peak_rss_mib: Vec<f64>,
}

/// What [`compare`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Every measurement, in order.
    pub samples: Vec<Sample>,
    /// Per system: load time and memory.
    pub systems: Vec<SystemReport>,
    /// The raftkv member replacement (with `--keys`).
    pub replacement: Option<Replacement>,
    /// Why the replacement failed, if it did (the rest still stands).
    pub replacement_error: Option<String>,
}

/// A field of `/proc/PID/status` in kB (`VmRSS`, `VmHWM`), as MiB.
pub(crate) fn status_mib(pid: Option<u32>, field: &str) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let Ok(s) = read_small(Path::new(&format!("/proc/{pid}/status"))) else {
        return 0.0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// `field` of every server of `c`.
fn servers_mib(c: &Cluster, field: &str) -> Vec<f64> {
    c.children
        .iter()
        .map(|ch| status_mib(ch.id(), field))
        .collect()
}

fn name(s: System) -> &'static str {
    match s {
        System::Raftkv => "raftkv",
        System::Etcd => "etcd",
    }
}

/// The members of `c` whose process has exited (a zombie, or no longer
/// there), as a sentence to add to an error: a member that died says why
/// on stderr (a full disk, a panic).
fn gone(c: &Cluster) -> String {
    let dead: Vec<String> = c
        .children
        .iter()
        .enumerate()
        .filter(|(_, child)| {
            child.id().is_none_or(|pid| {
                read_small(Path::new(&format!("/proc/{pid}/stat"))).map_or(true, |s| {
                    s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
                })
            })
        })
        .map(|(i, _)| (i + 1).to_string())
        .collect();
    if dead.is_empty() {
        String::new()
    } else {
        format!(" (member {} exited: see its stderr above)", dead.join(", "))
    }
}

/// CPU seconds (user + system) of a process: `/proc/PID/stat` fields 14
/// and 15, in clock ticks of 1/100 s (Linux's USER_HZ).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = read_small(Path::new(&format!("/proc/{pid}/stat"))) else {
        return 0.0;
    };
    // The command name (field 2) may hold spaces: count after its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Flush requests completed by the disk (`stat` field 16).
fn flushes(stat: Option<&Path>) -> f64 {
    device_counter(stat, 15)
}

/// CPU seconds of a cluster's server processes.
fn cpu(c: &Cluster) -> f64 {
    c.children
        .iter()
        .filter_map(|p| p.id())
        .map(cpu_seconds)
        .sum()
}

/// Sends `sig` ("STOP" or "CONT") to every server of `c`.
async fn signal_all(c: &Cluster, sig: &str) -> Result<(), String> {
    for pid in c.children.iter().filter_map(|p| p.id()) {
        crate::local::signal(pid, sig).await?;
    }
    Ok(())
}

/// Before `systems[k]`'s turn: pauses every other system and resumes this
/// one. Returns whether it did (pausing on, more than one system): the
/// resumed system's Raft timers fired at the resume, and the caller's
/// warm-up waits out any election they start.
async fn only_active(
    systems: &[(System, Cluster)],
    k: usize,
    o: &CompareOptions,
) -> Result<bool, String> {
    if !o.pause_idle || systems.len() < 2 {
        return Ok(false);
    }
    for (i, (_, c)) in systems.iter().enumerate() {
        if i != k {
            signal_all(c, "STOP").await?;
        }
    }
    signal_all(&systems[k].1, "CONT").await?;
    Ok(true)
}

/// Kills a cluster's processes and waits for them.
async fn stop(mut c: Cluster) {
    for p in &mut c.children {
        let _ = p.kill().await;
    }
}

async fn start_etcd(bin: &Path, dir: &Path, base: u16, retention: u64) -> Result<Cluster, String> {
    let client = |n: u16| format!("127.0.0.1:{}", base + 10 + n - 1);
    let peer = |n: u16| format!("http://127.0.0.1:{}", base + 20 + n - 1);
    let initial: Vec<String> = (1..=3).map(|n| format!("e{n}={}", peer(n))).collect();
    let mut children = Vec::new();
    for n in 1..=3u16 {
        let url = format!("http://{}", client(n));
        let child = Command::new(bin)
            .args(["--name", &format!("e{n}")])
            .arg("--data-dir")
            .arg(dir.join(format!("etcd-{n}")))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer(n)])
            .args(["--initial-advertise-peer-urls", &peer(n)])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "raftkv-compare"])
            // etcd keeps every version until compacted: keep the last
            // `retention` revisions (compacted every 5 minutes, as
            // raftkv's nodes are told), and a quota (8 GiB, etcd's
            // suggested maximum) that a million 1 KiB keys and their
            // overwrites fit in.
            .args(["--auto-compaction-mode", "revision"])
            .args(["--auto-compaction-retention", &retention.to_string()])
            .args(["--quota-backend-bytes", "8589934592"])
            // Errors only, to our stderr: a member that dies (a full disk)
            // says why, and the info lines stay out.
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        children.push(child);
    }
    Ok(Cluster {
        children,
        endpoints: (1..=3).map(client).collect(),
    })
}

/// Every raftkv node's arguments: the auto-compaction etcd is given, then
/// the experiment's (which may not set it otherwise).
fn node_args(o: &CompareOptions) -> Result<Vec<String>, String> {
    let mut args: Vec<String> = [
        "--auto-compaction-mode",
        "revision",
        "--auto-compaction-retention",
    ]
    .map(String::from)
    .to_vec();
    args.push(o.compaction_retention.to_string());
    for a in &o.node_args {
        if a.starts_with("--auto-compaction-mode") || a.starts_with("--auto-compaction-retention") {
            return Err(format!(
                "--node-arg {a}: the auto-compaction is set for both systems by --compaction-retention"
            ));
        }
        args.push(a.clone());
    }
    Ok(args)
}

/// Waits until a short bench against the cluster succeeds (a leader is
/// elected and every member answers), up to 30 s; it doubles as a
/// warm-up.
async fn warm_up(system: System, c: &Cluster, value_size: usize) -> Result<(), String> {
    let start = Instant::now();
    let w = Workload {
        value_size,
        keys: 0,
        rotation: 0,
    };
    loop {
        let r = run_level(Op::Put, &c.endpoints, 16, w, Duration::from_secs(1), None).await;
        match r {
            Ok(l) if l.ops > 0 && l.failed == 0 => return Ok(()),
            _ if start.elapsed() < Duration::from_secs(30) => {
                // Not up yet (etcd starting, an election): try again.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(l) => {
                return Err(format!(
                    "{system:?}: {} puts, {} failed ({})",
                    l.ops,
                    l.failed,
                    l.first_error.unwrap_or_default()
                ))
            }
            Err(e) => return Err(format!("{system:?}: {e}")),
        }
    }
}

/// One measurement of `system` at `clients`: each phase of `o.ops` with
/// the watchers attached, the CPU time of its servers and the disk's
/// flushes around each.
async fn measure(
    system: System,
    cluster: &Cluster,
    round: usize,
    clients: usize,
    o: &CompareOptions,
    stat: Option<&Path>,
) -> Result<Sample, String> {
    let rotation = round.saturating_sub(1);
    let w = Workload {
        value_size: o.value_size,
        keys: o.keys,
        rotation,
    };
    let prefix = crate::bench::prefix(o.keys);
    let watchers = Watchers::start(&cluster.endpoints, o.watchers, rotation, prefix).await?;
    let leader = crate::bench::leader(&cluster.endpoints).await;
    let targets = match (o.target_leader, leader) {
        (true, Some(l)) => vec![cluster.endpoints[l].clone()],
        (true, None) => return Err(format!("{system:?}: no member names itself the leader")),
        (false, _) => cluster.endpoints.clone(),
    };
    let mut sample = Sample {
        system: name(system),
        round,
        clients,
        first_endpoint: match (o.target_leader, leader) {
            (true, Some(l)) => l,
            _ => rotation % cluster.endpoints.len().max(1),
        },
        leader,
        put: None,
        get: None,
        watch: None,
        rss_mib: Vec::new(),
    };
    for &op in &o.ops {
        let bar = bench_harness::progress_bar(false);
        bar.set_message(format!(
            "round {round}: {system:?}, {clients} clients, {}s",
            op.name()
        ));
        let (cpu0, fl0, seen) = (cpu(cluster), flushes(stat), watchers.counts());
        let seconds = Duration::from_secs_f64(o.seconds);
        let level = run_level(op, &targets, clients, w, seconds, Some(bar.clone())).await?;
        let (cpu1, fl1) = (cpu(cluster), flushes(stat));
        bar.finish_and_clear();
        let n = level.ops.max(1) as f64;
        if op == Op::Put && o.watchers > 0 {
            let l = &level;
            sample.watch = Some(watchers.stats(&seen, l.ops, l.seconds, l.revision).await);
        }
        let phase = Phase {
            cpu_us_per_op: (cpu1 - cpu0) * 1e6 / n,
            flushes_per_op: (fl1 - fl0) / n,
            level,
        };
        match op {
            Op::Put => sample.put = Some(phase),
            Op::Get => sample.get = Some(phase),
        }
    }
    sample.rss_mib = servers_mib(cluster, "VmRSS");
    Ok(sample)
}

/// Loads each system (with `--keys`) after its warm-up: load time and
/// memory.
async fn load_all(
    systems: &[(System, Cluster)],
    o: &CompareOptions,
) -> Result<Vec<SystemReport>, String> {
    let mut reports = Vec::new();
    for (k, (s, c)) in systems.iter().enumerate() {
        only_active(systems, k, o).await?;
        warm_up(*s, c, o.value_size).await?;
        let load_s = match o.keys {
            0 => None,
            n => {
                let bar = bench_harness::progress_bar(false);
                bar.set_message(format!("{s:?}: loading {n} keys"));
                let t = crate::bench::load(&c.endpoints, n, o.value_size, 64, Some(bar.clone()))
                    .await
                    .map_err(|e| format!("{s:?}: {e}{}", gone(c)))?;
                bar.finish_and_clear();
                Some(t)
            }
        };
        reports.push(SystemReport {
            system: name(*s),
            load_s,
            rss_after_load_mib: servers_mib(c, "VmRSS"),
            peak_rss_mib: Vec::new(),
        });
    }
    Ok(reports)
}

/// Every round's measurements, each system in turn, the order alternating
/// by round.
async fn rounds(
    systems: &[(System, Cluster)],
    o: &CompareOptions,
    stat: Option<&Path>,
) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    for round in 1..=o.rounds {
        for &clients in &o.clients {
            let n = systems.len();
            for k in 0..n {
                let (system, cluster) = &systems[(k + round) % n];
                if only_active(systems, (k + round) % n, o).await? {
                    warm_up(*system, cluster, o.value_size).await?;
                }
                samples.push(measure(*system, cluster, round, clients, o, stat).await?);
            }
        }
    }
    Ok(samples)
}

/// Runs the comparison.
pub async fn compare(o: &CompareOptions) -> Result<Report, String> {
    let args = node_args(o)?;
    let tmp = tempfile::Builder::new()
        .prefix("raftkv-compare-")
        .tempdir_in(&o.dir)
        .map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let stat = device_stat(tmp.path());
    let raftkv = crate::local::start(3, &tmp.path().join("raftkv"), o.base_port, &args).await?;
    let mut systems = vec![(System::Raftkv, raftkv)];
    if let Some(bin) = &o.etcd {
        let etcd = start_etcd(bin, tmp.path(), o.base_port, o.compaction_retention).await?;
        systems.push((System::Etcd, etcd));
    }
    let mut reports = load_all(&systems, o).await?;
    let samples = rounds(&systems, o, stat.as_deref()).await?;
    for ((_, c), r) in systems.iter().zip(&mut reports) {
        r.peak_rss_mib = servers_mib(c, "VmHWM");
    }
    if only_active(&systems, 0, o).await? {
        warm_up(systems[0].0, &systems[0].1, o.value_size).await?;
    }
    let replaced = match (o.keys, systems.first_mut()) {
        (1.., Some((System::Raftkv, c))) => {
            let dir = tmp.path().join("raftkv");
            Some(replace::replace(c, &dir, o.base_port, &args).await)
        }
        _ => None,
    };
    let (replacement, replacement_error) = match replaced {
        Some(Ok(r)) => (Some(r), None),
        Some(Err(e)) => {
            eprintln!("raftkv-tools compare: the member replacement failed: {e}");
            (None, Some(e))
        }
        None => (None, None),
    };
    for (_, c) in systems {
        stop(c).await;
    }
    Ok(Report {
        samples,
        systems: reports,
        replacement,
        replacement_error,
    })
}
