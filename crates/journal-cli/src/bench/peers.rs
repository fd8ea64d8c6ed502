//! `--scenario peers` (feature `peers`): the same closed-loop workload —
//! one 256-byte record, durably committed, per client per iteration —
//! against this journal, okaywal, raft-engine and wal-db (the Rust WALs a
//! user would otherwise pick), and the bare device (each client its own file:
//! pwrite of 4 KiB + fdatasync). Systems are interleaved within each round
//! (each round starting with the next one), rounds repeated, medians
//! reported; then, where `perf` can count them, one more run per system
//! and level gives system calls per commit.

use super::{err, median, spread, svg, table, warmup_seconds, write_file, Env, Sample};
use journal_core::vfs::{process_usage, OpenOptions, OsVfs, Prealloc, Vfs};
use journal_core::{Journal, Options};
use serde_json::{json, Value as Json};
use std::sync::Arc;

type Op = Arc<dyn Fn(usize) -> Result<(), String> + Send + Sync>;

/// `n` clients running `op(client)` in a loop for `seconds` (the harness's
/// closed loop), with the process's CPU time and switches over the run:
/// one system runs at a time, so they are that system's.
fn closed_loop(n: usize, seconds: f64, op: Op) -> Result<Sample, String> {
    let each: Arc<bench_harness::Op<String>> = Arc::new(move |c, _| op(c));
    let u0 = process_usage().map_err(err)?;
    let r = bench_harness::closed_loop(n, seconds, each)?;
    let u = process_usage().map_err(err)?.since(&u0);
    Ok(Sample::new(r.ops, r.elapsed, &r.latency, &u))
}

/// The warm-up, then the measured run. With `count`, `perf stat` counts
/// the process's system calls (`raw_syscalls:sys_enter`, every thread)
/// over a window inside the measured run — a pass of its own, since a
/// counted call is a little slower — and the second value is system
/// calls per commit.
fn run(
    n: usize,
    warm: f64,
    secs: f64,
    op: Op,
    count: bool,
) -> Result<(Sample, Option<f64>), String> {
    closed_loop(n, warm, op.clone())?;
    if !count {
        return Ok((closed_loop(n, secs, op)?, None));
    }
    // perf attaches, then counts while `sleep` runs: well inside the run.
    let window = secs - COUNT_MARGIN;
    let perf = perf_stat(&["-p", &std::process::id().to_string()], window)?;
    let sample = closed_loop(n, secs, op)?;
    let calls = perf_count(perf)?;
    let per_commit = calls / window / sample.rate.max(f64::MIN_POSITIVE);
    Ok((sample, Some(per_commit)))
}

/// How much of a counted run lies outside perf's window (its start-up
/// before, and slack after).
const COUNT_MARGIN: f64 = 0.5;

/// Starts `perf stat` counting system calls for `target` while a `sleep`
/// of `window` seconds runs.
fn perf_stat(target: &[&str], window: f64) -> Result<std::process::Child, String> {
    std::process::Command::new("perf")
        .args(["stat", "-x,", "-e", "raw_syscalls:sys_enter"])
        .args(target)
        .args(["--", "sleep", &format!("{window:.3}")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("perf stat: {e}"))
}

/// The count `perf stat -x,` reported for `raw_syscalls:sys_enter`.
fn perf_count(perf: std::process::Child) -> Result<f64, String> {
    let out = perf
        .wait_with_output()
        .map_err(|e| format!("perf stat: {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .find(|l| l.contains("raw_syscalls:sys_enter"))
        .and_then(|l| l.split(',').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|_| out.status.success())
        .ok_or_else(|| format!("perf stat gave no count: {}", text.trim()))
}

/// Whether `perf stat` can count system calls here (installed, and allowed
/// to read the tracepoint); why not, otherwise.
fn perf_usable() -> Result<(), String> {
    perf_count(perf_stat(&[], 0.01)?).map(|_| ())
}

const SYSTEMS: [&str; 5] = ["journal", "okaywal", "raft-engine", "wal-db", "device"];

/// One measurement of `system` with `n` clients in a fresh directory
/// (with `count`, and system calls per commit: [`run`]).
fn measure(
    env: &Env,
    system: &str,
    n: usize,
    record: &Arc<Vec<u8>>,
    count: bool,
) -> Result<(Sample, Option<f64>), String> {
    let dir = env.fresh_dir(system);
    let secs = env.seconds;
    let warm = warmup_seconds(secs);
    let result = match system {
        "journal" => {
            let options = Options {
                direct_io: env.direct_io,
                ..Options::default()
            };
            let j = Arc::new(Journal::open(&dir, options).map_err(err)?);
            let (j2, r) = (j.clone(), record.clone());
            let op: Op = Arc::new(move |_| j2.append_durable(&r).map(|_| ()).map_err(err));
            let out = run(n, warm, secs, op, count)?;
            j.close().map_err(err)?;
            out
        }
        "okaywal" => {
            let wal = okaywal::WriteAheadLog::recover(&dir, okaywal::LogVoid).map_err(err)?;
            let r = record.clone();
            let w = wal.clone();
            let op: Op = Arc::new(move |_| {
                let mut e = w.begin_entry().map_err(err)?;
                e.write_chunk(&r).map_err(err)?;
                e.commit().map(|_| ()).map_err(err)
            });
            let out = run(n, warm, secs, op, count)?;
            wal.shutdown().map_err(err)?;
            out
        }
        "raft-engine" => {
            let cfg = raft_engine::Config {
                dir: dir.to_string_lossy().into_owned(),
                ..raft_engine::Config::default()
            };
            let engine = Arc::new(raft_engine::Engine::open(cfg).map_err(err)?);
            let (e, r) = (engine.clone(), record.clone());
            let op: Op = Arc::new(move |c| {
                let mut batch = raft_engine::LogBatch::default();
                batch
                    .put(c as u64 + 1, b"k".to_vec(), r.to_vec())
                    .map_err(err)?;
                e.write(&mut batch, true).map(|_| ()).map_err(err)
            });
            run(n, warm, secs, op, count)?
        }
        "wal-db" => {
            // Lock-free appends; concurrent syncs coalesce into one fsync.
            OsVfs::new().create_dir_all(&dir).map_err(err)?;
            let wal = Arc::new(wal_db::Wal::open(dir.join("peer.wal")).map_err(err)?);
            let (w, r) = (wal.clone(), record.clone());
            let op: Op = Arc::new(move |_| w.append_and_sync(&r).map(|_| ()).map_err(err));
            run(n, warm, secs, op, count)?
        }
        _ => {
            // The bare device: each client pwrites 4 KiB and fdatasyncs its
            // own preallocated file, through the journal's filesystem.
            let vfs = OsVfs::new();
            vfs.create_dir_all(&dir).map_err(err)?;
            let files: Vec<_> = (0..n)
                .map(|c| -> Result<_, String> {
                    let f = vfs
                        .open(&dir.join(format!("dev-{c}")), OpenOptions::create_new())
                        .map_err(err)?;
                    f.preallocate(0, 4 << 20, Prealloc::ZeroFill).map_err(err)?;
                    f.sync_all().map_err(err)?;
                    Ok(f)
                })
                .collect::<Result<_, _>>()?;
            let files = Arc::new(files);
            let block = Arc::new(vec![0x5Au8; 4096]);
            let counters: Arc<Vec<journal_core::sync::atomic::AtomicU64>> =
                Arc::new((0..n).map(|_| Default::default()).collect());
            let op: Op = Arc::new(move |c| {
                let k = counters[c].fetch_add(1, journal_core::sync::atomic::Ordering::Relaxed);
                let f = &files[c];
                f.write_at(&block, (k % 1024) * 4096).map_err(err)?;
                f.sync_data().map_err(err)
            });
            run(n, warm, secs, op, count)?
        }
    };
    env.discard(&dir);
    Ok(result)
}

/// One level's samples summed up: its table row (median and range of
/// commits/s, the ratios), its cost row, its JSON, and each system's
/// median commits/s.
fn summarize(
    n: usize,
    rounds: usize,
    samples: &[Vec<Sample>],
    syscalls: &[Option<f64>],
) -> (Vec<String>, Vec<String>, Json, Vec<f64>) {
    let of = |i: usize, f: fn(&Sample) -> f64| -> Vec<f64> { samples[i].iter().map(f).collect() };
    let med = |f: fn(&Sample) -> f64| -> Vec<f64> {
        (0..SYSTEMS.len()).map(|i| median(of(i, f))).collect()
    };
    let (r, p, cpu, sw) = (
        med(|s| s.rate),
        med(|s| s.p99),
        med(|s| s.cpu_us),
        med(|s| s.switches),
    );
    let vs_peer = r[0] / r[1].max(r[2]).max(r[3]);
    let vs_device = r[0] / r[4];
    let mut row = vec![n.to_string()];
    row.extend((0..SYSTEMS.len()).map(|i| spread(&of(i, |s| s.rate))));
    row.push(format!("{vs_peer:.2}"));
    row.push(format!("{vs_device:.2}"));
    let mut cost = vec![n.to_string()];
    for i in 0..SYSTEMS.len() {
        let calls = syscalls
            .get(i)
            .copied()
            .flatten()
            .map_or(String::new(), |c| format!(" / {c:.2}"));
        cost.push(format!("{:.0} / {:.1} / {:.2}{calls}", p[i], cpu[i], sw[i]));
    }
    let per = |v: &[f64]| -> Json {
        SYSTEMS
            .iter()
            .zip(v)
            .map(|(k, x)| (k.replace('-', "_"), json!(x)))
            .collect()
    };
    let each: Json = SYSTEMS
        .iter()
        .enumerate()
        .map(|(i, k)| (k.replace('-', "_"), json!(of(i, |s| s.rate))))
        .collect();
    let point = json!({
        "clients": n, "rounds": rounds,
        "commits_per_s": per(&r),
        "commits_per_s_each_round": each,
        "p99_us": per(&p),
        "cpu_us_per_commit": per(&cpu),
        "switches_per_commit": per(&sw),
        "syscalls_per_commit": SYSTEMS
            .iter()
            .zip(syscalls.iter().chain(std::iter::repeat(&None)))
            .map(|(k, c)| (k.replace('-', "_"), json!(c)))
            .collect::<serde_json::Map<_, _>>(),
        "journal_over_best_peer": vs_peer,
        "journal_over_device": vs_device,
    });
    (row, cost, point, r)
}

/// `journal bench --scenario peers`; with `plot`, every system on one chart.
pub fn peers(env: &Env, plot: Option<&std::path::Path>) -> Result<Json, String> {
    let levels: &[usize] = if env.smoke { &[1, 4] } else { &[1, 4, 16, 64] };
    let rounds = env.rounds;
    let record = Arc::new(vec![0xC3u8; 256]);
    let (mut rows, mut costs, mut points) = (Vec::new(), Vec::new(), Vec::new());
    let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::new(); SYSTEMS.len()];
    // System calls per commit: one more pass per level under `perf stat`.
    let count = match perf_usable() {
        Ok(()) if !env.smoke && env.seconds > 2.0 * COUNT_MARGIN => true,
        Ok(()) => false,
        Err(why) => {
            eprintln!("peers: no system-call counts ({why})");
            false
        }
    };
    let steps = levels.len() * (rounds + usize::from(count)) * SYSTEMS.len();
    let mut step = 0;
    for &n in levels {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); SYSTEMS.len()];
        for round in 0..rounds {
            // Each round starts with the next system, so none is always
            // first (a device drifts over minutes).
            for k in 0..SYSTEMS.len() {
                let i = (round + k) % SYSTEMS.len();
                let system = SYSTEMS[i];
                env.progress_bar(
                    step,
                    steps,
                    &format!("peers: {n} clients, {system}, round {}", round + 1),
                );
                step += 1;
                samples[i].push(measure(env, system, n, &record, false)?.0);
            }
        }
        let mut syscalls = vec![None; SYSTEMS.len()];
        for (i, system) in SYSTEMS.iter().enumerate().filter(|_| count) {
            env.progress_bar(
                step,
                steps,
                &format!("peers: {n} clients, {system}, counted"),
            );
            step += 1;
            syscalls[i] = measure(env, system, n, &record, true)?.1;
        }
        let (row, cost, point, r) = summarize(n, rounds, &samples, &syscalls);
        for (line, rate) in lines.iter_mut().zip(&r) {
            line.push((n as f64, *rate));
        }
        rows.push(row);
        costs.push(cost);
        points.push(point);
    }
    println!(
        "peers: 256-byte records, one durable commit per client per iteration, medians (and ranges) of {rounds} interleaved rounds, {} s per point",
        env.seconds
    );
    let mut head = vec!["clients"];
    head.extend(SYSTEMS);
    table(&[&head[..], &["ours/peer", "ours/dev"]].concat(), &rows);
    println!(
        "per commit, medians: p99 µs / CPU µs (whole process) / voluntary switches{}",
        if count {
            " / system calls (one more run under perf stat)"
        } else {
            ""
        }
    );
    table(&head, &costs);
    if let Some(path) = plot {
        let series: Vec<svg::Series<'_>> = SYSTEMS
            .iter()
            .zip(lines)
            .enumerate()
            .map(|(i, (name, points))| svg::Series {
                name,
                color: svg::PALETTE[i],
                dashed: *name == "device",
                points,
            })
            .collect();
        let text = svg::chart(
            "durable 256-byte commits: the journal beside its peers and the device",
            "clients",
            "commits/s",
            &series,
        );
        write_file(path, &text)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(json!({"scenario": "peers", "record_size": 256, "points": points}))
}
