//! `raftkv-tools compare` (what `cargo xtask bench-raft` runs): a three-node
//! raftkv cluster and, when an `etcd` binary is given, a three-member etcd
//! cluster, both on loopback with their data in one temporary directory of
//! the local disk, measured in the same run: for each round and client
//! count, each system in turn (the order alternating by round), the same
//! closed-loop put workload ([`crate::bench`]). While one system is
//! measured the other is paused (`SIGSTOP`; [`CompareOptions::pause_idle`]),
//! so that each pays for its own background work. Besides puts/s and latency
//! it reads, around each measurement, the CPU time of the system's three
//! server processes (`/proc/PID/stat`) and the flush requests completed by
//! the disk under the directory (`/sys/dev/block/M:m/stat`), and reports
//! both per put. Medians over rounds, with the range of puts/s. With
//! `--keys N`, each system is first loaded with N keys through its API
//! (timed), and the puts overwrite random keys among them; the resident
//! memory of every server process is sampled after each measurement, and
//! its peak (`VmHWM`) reported at the end; then a raftkv follower is
//! replaced (`replace.rs`) and its catch-up by snapshot timed, with every
//! node's memory sampled throughout.

mod replace;
pub use replace::Replacement;
pub(crate) use replace::{metric, sampler};

use crate::bench::{run_level, Level, System};
use crate::local::LocalCluster as Cluster;
use bench_harness::{device_counter, device_stat, read_small};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

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
    /// Keys loaded first and overwritten at random (0: each client
    /// rewrites 1,024 keys of its own).
    pub keys: u64,
    /// The directory the temporary data directory is made in.
    pub dir: PathBuf,
    /// The `etcd` binary, if etcd is compared.
    pub etcd: Option<PathBuf>,
    /// The first of the loopback ports used (raftkv: P..P+2, etcd clients
    /// P+10.., peers P+20..).
    pub base_port: u16,
    /// More arguments to every `raftkv serve` (an experiment's settings).
    pub node_args: Vec<String>,
    /// Pause (`SIGSTOP`) the system not being measured, and resume it
    /// (`SIGCONT`, then a warm-up) before its own measurement: the two
    /// share one disk, and an idle system's background work (etcd's
    /// compaction and backend commits, raftkv's checkpoints and snapshots)
    /// would otherwise land in the other's tail latency. Each system then
    /// pays for its own background work, in its own measurements.
    pub pause_idle: bool,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// "raftkv" or "etcd".
    pub system: &'static str,
    /// The round (from 1).
    pub round: usize,
    /// The bench's result.
    pub level: Level,
    /// CPU time of the three servers per acknowledged put, µs.
    pub cpu_us_per_put: f64,
    /// Disk flush requests per acknowledged put.
    pub flushes_per_put: f64,
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

async fn start_etcd(bin: &Path, dir: &Path, base: u16) -> Result<Cluster, String> {
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
            // 10,000 revisions (compacted every 5 minutes), and a quota (8 GiB, etcd's suggested maximum)
            // that a million 1 KiB keys and their overwrites fit in.
            .args(["--auto-compaction-mode", "revision"])
            .args(["--auto-compaction-retention", "10000"])
            .args(["--quota-backend-bytes", "8589934592"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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

/// Waits until a short bench against the cluster succeeds (a leader is
/// elected and answers), up to 30 s; it doubles as a warm-up.
async fn warm_up(system: System, c: &Cluster, value_size: usize) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let r = run_level(
            system,
            &c.endpoints,
            16,
            value_size,
            0,
            Duration::from_secs(1),
            None,
        )
        .await;
        match r {
            Ok(l) if l.puts > 0 && l.failed == 0 => return Ok(()),
            _ if start.elapsed() < Duration::from_secs(30) => {}
            Ok(l) => return Err(format!("{system:?}: {} puts, {} failed", l.puts, l.failed)),
            Err(e) => return Err(format!("{system:?}: {e}")),
        }
    }
}

/// One measurement of `system` at `clients`, with the CPU time of its
/// servers and the disk's flushes around it.
async fn measure(
    system: System,
    cluster: &Cluster,
    round: usize,
    clients: usize,
    o: &CompareOptions,
    stat: Option<&Path>,
) -> Result<Sample, String> {
    let (cpu0, fl0) = (cpu(cluster), flushes(stat));
    let bar = bench_harness::progress_bar(false);
    bar.set_message(format!("round {round}: {system:?}, {clients} clients"));
    let level = run_level(
        system,
        &cluster.endpoints,
        clients,
        o.value_size,
        o.keys,
        Duration::from_secs_f64(o.seconds),
        Some(bar.clone()),
    )
    .await?;
    bar.finish_and_clear();
    let puts = level.puts.max(1) as f64;
    Ok(Sample {
        system: name(system),
        rss_mib: servers_mib(cluster, "VmRSS"),
        round,
        cpu_us_per_put: (cpu(cluster) - cpu0) * 1e6 / puts,
        flushes_per_put: (flushes(stat) - fl0) / puts,
        level,
    })
}

/// Runs the comparison.
pub async fn compare(o: &CompareOptions) -> Result<Report, String> {
    let tmp = tempfile::Builder::new()
        .prefix("raftkv-compare-")
        .tempdir_in(&o.dir)
        .map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let stat = device_stat(tmp.path());
    let raftkv =
        crate::local::start(3, &tmp.path().join("raftkv"), o.base_port, &o.node_args).await?;
    let mut systems = vec![(System::Raftkv, raftkv)];
    if let Some(bin) = &o.etcd {
        systems.push((
            System::Etcd,
            start_etcd(bin, tmp.path(), o.base_port).await?,
        ));
    }
    let mut reports = Vec::new();
    for (k, (s, c)) in systems.iter().enumerate() {
        only_active(&systems, k, o).await?;
        warm_up(*s, c, o.value_size).await?;
        let load_s = match o.keys {
            0 => None,
            n => {
                let bar = bench_harness::progress_bar(false);
                bar.set_message(format!("{s:?}: loading {n} keys"));
                let t =
                    crate::bench::load(*s, &c.endpoints, n, o.value_size, 64, Some(bar.clone()))
                        .await?;
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
    let mut samples = Vec::new();
    for round in 1..=o.rounds {
        for &clients in &o.clients {
            let n = systems.len();
            for k in 0..n {
                let (system, cluster) = &systems[(k + round) % n];
                if only_active(&systems, (k + round) % n, o).await? {
                    warm_up(*system, cluster, o.value_size).await?;
                }
                samples.push(measure(*system, cluster, round, clients, o, stat.as_deref()).await?);
            }
        }
    }
    for ((_, c), r) in systems.iter().zip(&mut reports) {
        r.peak_rss_mib = servers_mib(c, "VmHWM");
    }
    if only_active(&systems, 0, o).await? {
        warm_up(systems[0].0, &systems[0].1, o.value_size).await?;
    }
    let replaced = match (o.keys, systems.first_mut()) {
        (1.., Some((System::Raftkv, c))) => {
            let dir = tmp.path().join("raftkv");
            Some(replace::replace(c, &dir, o.base_port, &o.node_args).await)
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

/// The medians of each system at each client count: prints the table and
/// returns it as JSON.
pub fn summarize(report: &Report, clients: &[usize]) -> serde_json::Value {
    use bench_harness::median;
    let samples = &report.samples[..];
    let of = |system: &str, c: usize| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| s.system == system && s.level.clients == c)
            .collect()
    };
    let med = |v: &[&Sample], f: &dyn Fn(&Sample) -> f64| median(v.iter().map(|s| f(s)).collect());
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for &c in clients {
        let mut row = vec![c.to_string()];
        let mut entry = serde_json::json!({ "clients": c });
        let mut rates = Vec::new();
        for system in ["raftkv", "etcd"] {
            let v = of(system, c);
            if v.is_empty() {
                continue;
            }
            let rate = med(&v, &|s| s.level.puts_per_sec);
            let lo = v
                .iter()
                .map(|s| s.level.puts_per_sec)
                .fold(f64::MAX, f64::min);
            let hi = v.iter().map(|s| s.level.puts_per_sec).fold(0.0, f64::max);
            let p99 = med(&v, &|s| s.level.p99_us as f64);
            let cpu = med(&v, &|s| s.cpu_us_per_put);
            let fl = med(&v, &|s| s.flushes_per_put);
            rates.push(rate);
            row.push(format!("{rate:.0} ({lo:.0}–{hi:.0})"));
            row.push(format!("{p99:.0}"));
            row.push(format!("{cpu:.0}"));
            row.push(format!("{fl:.2}"));
            entry[system] = serde_json::json!({
                "puts_per_sec": rate, "min": lo, "max": hi, "p99_us": p99,
                "cpu_us_per_put": cpu, "flushes_per_put": fl, "rounds": v.len(),
            });
        }
        if let [r, e] = rates[..] {
            row.push(format!("{:.2}", r / e.max(f64::MIN_POSITIVE)));
            entry["ratio"] = serde_json::json!(r / e.max(f64::MIN_POSITIVE));
        }
        rows.push(row);
        json.push(entry);
    }
    let mut header = vec!["clients"];
    let two = samples.iter().any(|s| s.system == "etcd");
    for _ in 0..if two { 2 } else { 1 } {
        header.extend(["puts/s (range)", "p99 µs", "CPU µs/put", "flushes/put"]);
    }
    if two {
        header.push("raftkv/etcd");
    }
    bench_harness::table(&header, &rows);
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|m| format!("{m:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let rows: Vec<Vec<String>> = report
        .systems
        .iter()
        .map(|r| {
            vec![
                r.system.to_string(),
                r.load_s.map_or("-".into(), |s| format!("{s:.1}")),
                fmt(&r.rss_after_load_mib),
                fmt(&r.peak_rss_mib),
            ]
        })
        .collect();
    bench_harness::table(
        &["system", "load s", "RSS after load MiB", "peak RSS MiB"],
        &rows,
    );
    if let Some(r) = &report.replacement {
        replace::print(r);
    }
    serde_json::json!({
        "levels": json, "systems": report.systems, "samples": samples,
        "replacement": report.replacement, "replacement_error": report.replacement_error,
    })
}
