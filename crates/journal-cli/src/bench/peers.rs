//! `--scenario peers` (feature `peers`): the same closed-loop workload —
//! one 256-byte record, durably committed, per client per iteration —
//! against this journal, okaywal, raft-engine and wal-db (the Rust WALs a
//! user would otherwise pick), and the bare device (each client its own file:
//! pwrite of 4 KiB + fdatasync). Systems are interleaved within each round,
//! rounds repeated, medians reported.

use super::{err, median, svg, table, warmup_seconds, write_file, Env};
use journal_core::vfs::{process_usage, OpenOptions, OsVfs, Prealloc, Vfs};
use journal_core::{Journal, Options};
use serde_json::{json, Value as Json};
use std::sync::Arc;

type Op = Arc<dyn Fn(usize) -> Result<(), String> + Send + Sync>;

/// One measured point of one system.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Commits per second.
    rate: f64,
    /// 99th-percentile commit latency, µs.
    p99: f64,
    /// CPU time of the whole process (user + system) per commit, µs.
    cpu_us: f64,
    /// Voluntary context switches of the whole process per commit.
    switches: f64,
}

/// `n` clients running `op(client)` in a loop for `seconds` (the harness's
/// closed loop), with the process's CPU time and switches over the run:
/// one system runs at a time, so they are that system's.
fn closed_loop(n: usize, seconds: f64, op: Op) -> Result<Sample, String> {
    let each: Arc<bench_harness::Op<String>> = Arc::new(move |c, _| op(c));
    let u0 = process_usage().map_err(err)?;
    let r = bench_harness::closed_loop(n, seconds, each)?;
    let u = process_usage().map_err(err)?.since(&u0);
    let commits = r.ops.max(1) as f64;
    Ok(Sample {
        rate: r.rate(),
        p99: r.latency.value_at_quantile(0.99) as f64,
        cpu_us: u.cpu.as_secs_f64() * 1e6 / commits,
        switches: u.voluntary_switches as f64 / commits,
    })
}

const SYSTEMS: [&str; 5] = ["journal", "okaywal", "raft-engine", "wal-db", "device"];

/// One measurement of `system` with `n` clients in a fresh directory.
fn measure(env: &Env, system: &str, n: usize, record: &Arc<Vec<u8>>) -> Result<Sample, String> {
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
            closed_loop(n, warm, op.clone())?;
            let out = closed_loop(n, secs, op)?;
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
            closed_loop(n, warm, op.clone())?;
            let out = closed_loop(n, secs, op)?;
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
            closed_loop(n, warm, op.clone())?;
            closed_loop(n, secs, op)?
        }
        "wal-db" => {
            // Lock-free appends; concurrent syncs coalesce into one fsync.
            OsVfs::new().create_dir_all(&dir).map_err(err)?;
            let wal = Arc::new(wal_db::Wal::open(dir.join("peer.wal")).map_err(err)?);
            let (w, r) = (wal.clone(), record.clone());
            let op: Op = Arc::new(move |_| w.append_and_sync(&r).map(|_| ()).map_err(err));
            closed_loop(n, warm, op.clone())?;
            closed_loop(n, secs, op)?
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
            let counters: Arc<Vec<std::sync::atomic::AtomicU64>> =
                Arc::new((0..n).map(|_| Default::default()).collect());
            let op: Op = Arc::new(move |c| {
                let k = counters[c].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let f = &files[c];
                f.write_at(&block, (k % 1024) * 4096).map_err(err)?;
                f.sync_data().map_err(err)
            });
            closed_loop(n, warm, op.clone())?;
            closed_loop(n, secs, op)?
        }
    };
    env.discard(&dir);
    Ok(result)
}

/// The median of `xs` with its range: `median (min–max)`.
fn spread(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0} ({lo:.0}–{hi:.0})", median(xs.to_vec()))
}

/// One level's samples summed up: its table row (median and range of
/// commits/s, the ratios), its cost row, its JSON, and each system's
/// median commits/s.
fn summarize(
    n: usize,
    rounds: usize,
    samples: &[Vec<Sample>],
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
        cost.push(format!("{:.0} / {:.1} / {:.2}", p[i], cpu[i], sw[i]));
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
    let steps = levels.len() * rounds * SYSTEMS.len();
    let mut step = 0;
    for &n in levels {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); SYSTEMS.len()];
        for round in 0..rounds {
            for (i, system) in SYSTEMS.iter().enumerate() {
                env.progress_bar(
                    step,
                    steps,
                    &format!("peers: {n} clients, {system}, round {}", round + 1),
                );
                step += 1;
                samples[i].push(measure(env, system, n, &record)?);
            }
        }
        let (row, cost, point, r) = summarize(n, rounds, &samples);
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
    println!("per commit, medians: p99 µs / CPU µs (whole process) / voluntary switches");
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
