//! `--scenario async`: async committers (the journal inside async
//! services) beside committer threads. N tasks on a 2-worker tokio runtime,
//! each awaiting `append_durable_async` in a loop, against N threads
//! calling `append_durable`, same record; the two alternate within each
//! round (which goes first alternates too), rounds repeated (`--rounds`),
//! medians with their ranges, and CPU and voluntary switches per commit
//! for each.

use super::{
    bench_options, commit_load, err, fresh_journal, histogram, median, micros, spread, table,
    warmup_seconds, Env, Sample,
};
use journal_core::vfs::process_usage;
use journal_core::Journal;
use serde_json::{json, Value as Json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the scenario.
pub fn async_tasks(env: &Env) -> Result<Json, String> {
    let levels: &[usize] = if env.smoke { &[1, 8] } else { &[1, 64, 1024] };
    let record = Arc::new(vec![0x5Du8; 256]);
    // samples[level][side][round]; side 0 = threads, 1 = tasks.
    let mut samples = vec![[Vec::new(), Vec::new()]; levels.len()];
    let steps = env.rounds * levels.len() * 2;
    let mut step = 0;
    for round in 0..env.rounds {
        for (li, &n) in levels.iter().enumerate() {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let what = if side == 0 { "threads" } else { "tasks" };
                env.progress_bar(step, steps, &format!("async: {n} {what}, round {round}"));
                step += 1;
                let (j, dir) = fresh_journal(env, what, bench_options(env)).map_err(err)?;
                let s = if side == 0 {
                    thread_load(&j, n, env.seconds)?
                } else {
                    task_load(&j, n, env.seconds, record.clone())?
                };
                j.close().map_err(err)?;
                drop(j);
                env.discard(&dir);
                samples[li][side].push(s);
            }
        }
    }
    let mut rows = Vec::new();
    let mut costs = Vec::new();
    let mut points = Vec::new();
    for (li, &n) in levels.iter().enumerate() {
        let [t, a] = &samples[li];
        let pick = |v: &[Sample], f: fn(&Sample) -> f64| v.iter().map(f).collect::<Vec<f64>>();
        let ratios: Vec<f64> = t.iter().zip(a).map(|(t, a)| a.rate / t.rate).collect();
        let (tr, ar) = (median(pick(t, |s| s.rate)), median(pick(a, |s| s.rate)));
        rows.push(vec![
            n.to_string(),
            spread(&pick(t, |s| s.rate)),
            spread(&pick(a, |s| s.rate)),
            format!("{:.2}", ar / tr),
            format!("{:.2}", median(ratios.clone())),
        ]);
        let cost = |v: &[Sample]| {
            format!(
                "{:.0} / {:.1} / {:.2}",
                median(pick(v, |s| s.p99)),
                median(pick(v, |s| s.cpu_us)),
                median(pick(v, |s| s.switches))
            )
        };
        costs.push(vec![n.to_string(), cost(t), cost(a)]);
        let side_json = |v: &[Sample]| {
            json!({"commits_per_s": median(pick(v, |s| s.rate)), "rounds_commits_per_s": pick(v, |s| s.rate),
                   "p99_us": median(pick(v, |s| s.p99)), "cpu_us_per_commit": median(pick(v, |s| s.cpu_us)),
                   "voluntary_switches_per_commit": median(pick(v, |s| s.switches))})
        };
        points.push(
            json!({"concurrency": n, "threads": side_json(t), "tasks": side_json(a),
                           "tasks_over_threads": ar / tr, "tasks_over_threads_per_round": ratios}),
        );
    }
    println!(
        "async: 256-byte records, tasks on a 2-worker tokio runtime vs committer threads, medians (and ranges) of {} interleaved rounds, {} s per point",
        env.rounds, env.seconds
    );
    table(
        &[
            "concurrency",
            "threads c/s",
            "tasks c/s",
            "tasks/threads",
            "median of round ratios",
        ],
        &rows,
    );
    println!("per commit, medians: p99 µs / CPU µs (whole process) / voluntary switches");
    table(&["concurrency", "threads", "tasks"], &costs);
    Ok(json!({"scenario": "async", "rounds": env.rounds, "points": points}))
}

/// `n` committer threads (after the load's own warm-up).
fn thread_load(j: &Arc<Journal>, n: usize, seconds: f64) -> Result<Sample, String> {
    let record = vec![0x5Du8; 256];
    let load = commit_load(j, n, seconds, move |j, _, _| {
        j.append_durable(&record).map(|_| ())
    })
    .map_err(err)?;
    Ok(Sample::new(
        load.commits,
        load.elapsed,
        &load.latency,
        &load.usage,
    ))
}

/// `n` tasks committing in a loop for `seconds` (after a short warm-up),
/// with the process's CPU time and switches over the measured run.
fn task_load(
    j: &Arc<Journal>,
    n: usize,
    seconds: f64,
    record: Arc<Vec<u8>>,
) -> Result<Sample, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(err)?;
    let run = |secs: f64| -> Result<(u64, Duration, hdrhistogram::Histogram<u64>), String> {
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(secs);
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (j, r) = (j.clone(), record.clone());
                rt.spawn(async move {
                    let mut h = histogram();
                    let mut c = 0u64;
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        j.append_durable_async(&r).await?;
                        h.record(micros(t.elapsed())).ok();
                        c += 1;
                    }
                    Ok::<_, journal_core::Error>((c, h))
                })
            })
            .collect();
        let mut total = histogram();
        let mut commits = 0;
        for t in tasks {
            let (c, h) = rt.block_on(t).map_err(err)?.map_err(err)?;
            commits += c;
            total.add(&h).ok();
        }
        Ok((commits, start.elapsed(), total))
    };
    run(warmup_seconds(seconds))?;
    let u0 = process_usage().map_err(err)?;
    let (commits, elapsed, latency) = run(seconds)?;
    let u = process_usage().map_err(err)?.since(&u0);
    Ok(Sample::new(commits, elapsed, &latency, &u))
}
