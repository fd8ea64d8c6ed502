//! One A/B scenario per seed. Each returns its results and ratios as JSON
//! and prints a table.

use super::{
    bench_options, commit_load, err, fresh_journal, histogram, micros, options_json, table,
    warmup_seconds, Env,
};
use hdrhistogram::Histogram;
use journal_core::sync::atomic::{AtomicBool, Ordering};
use journal_core::vfs::{SimVfs, Vfs};
use journal_core::{
    BatchPolicy, FlushPolicy, ForceMode, Geometry, Journal, Lsn, Options, RecyclePolicy, SyncMethod,
};
use serde_json::{json, Value as Json};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Seed 000 (WiredTiger `__wt_log_flush`): a flusher forces the log while
/// writers keep earlier buffers in flight on a slow device. Ours waits on
/// the ring's condvar; the baseline is WiredTiger's old loop: sleep 1 ms,
/// force a buffer switch, look again. The device is SimVfs with injected
/// latency (slow syncs, slower plain writes), the "slow-sync host" of the
/// seed.
pub fn wt_flush_wait(env: &Env) -> Result<Json, String> {
    let sync_latency = Duration::from_micros(if env.smoke { 300 } else { 1500 });
    let write_latency = Duration::from_micros(if env.smoke { 100 } else { 400 });
    let mut rows = Vec::new();
    let mut variants = Vec::new();
    let mut p50 = Vec::new();
    for (i, (name, condvar)) in [("condvar-wait", true), ("sleep-poll-1ms", false)]
        .into_iter()
        .enumerate()
    {
        env.progress_bar(i, 2, &format!("wt-flush-wait: {name}"));
        let vfs = SimVfs::new();
        vfs.set_sync_latency(sync_latency);
        vfs.set_write_latency(write_latency);
        let options = Options {
            segment_size: 4 << 20,
            logbsize: 32 << 10,
            ..Options::default()
        };
        let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
        let j = Arc::new(Journal::open_with(v, "/wt", options).map_err(err)?);
        let stop = Arc::new(AtomicBool::new(false));
        // Writers append without committing (transaction_sync off): buffers
        // fill and are written as they switch.
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let (j, stop) = (j.clone(), stop.clone());
                std::thread::spawn(move || -> journal_core::Result<()> {
                    let rec = [0x77u8; 256];
                    while !stop.load(Ordering::Relaxed) {
                        j.append(&rec)?;
                    }
                    Ok(())
                })
            })
            .collect();
        let (wait_h, force_h, flushes) = flusher(&j, condvar, env.seconds.max(0.2) * 2.0)?;
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            // A writer that panicked panics the bench with its own message.
            w.join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
                .map_err(err)?;
        }
        let m = j.metrics();
        let (w50, f50) = (
            wait_h.value_at_quantile(0.5),
            force_h.value_at_quantile(0.5),
        );
        p50.push((w50 as f64, f50 as f64));
        rows.push(vec![
            name.to_string(),
            flushes.to_string(),
            w50.to_string(),
            f50.to_string(),
            m.log_writes.to_string(),
        ]);
        variants.push(
            json!({"variant": name, "flushes": flushes, "wait_loop_p50_us": w50, "force_p50_us": f50, "log_writes": m.log_writes}),
        );
    }
    println!(
        "wt-flush-wait (seed 000): flusher vs 4 writers, syncs {} µs, writes {} µs",
        sync_latency.as_micros(),
        write_latency.as_micros()
    );
    table(
        &[
            "variant",
            "flushes",
            "wait p50 µs",
            "force p50 µs",
            "log writes",
        ],
        &rows,
    );
    let wait_ratio = ratio(p50[1].0, p50[0].0);
    let force_ratio = ratio(p50[1].1, p50[0].1);
    println!("ratio sleep-poll / condvar: wait loop {wait_ratio:.2}x, force {force_ratio:.2}x (seed: ~1.5 ms -> ~0.31 ms)");
    Ok(
        json!({"scenario": "wt-flush-wait", "sync_latency_us": sync_latency.as_micros() as u64, "write_latency_us": write_latency.as_micros() as u64, "results": variants, "ratios": json!({"wait_loop_p50_sleep_poll_over_condvar": wait_ratio, "force_p50_sleep_poll_over_condvar": force_ratio})}),
    )
}

/// The flusher of `wt_flush_wait` for `seconds`: forces whatever was
/// appended since its last flush and waits for it — on the journal's
/// condvar (`condvar`), or by sleeping 1 ms and forcing out the active
/// buffer until it is durable (WiredTiger before the fix). Returns the
/// wait and force latencies and the flushes made.
fn flusher(
    j: &Journal,
    condvar: bool,
    seconds: f64,
) -> Result<(Histogram<u64>, Histogram<u64>, u64), String> {
    let (mut wait_h, mut force_h) = (histogram(), histogram());
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut flushes = 0u64;
    let mut flushed = Lsn(0);
    while Instant::now() < deadline {
        // Like MongoDB's JournalFlusher: flush as soon as something was
        // written since the last flush (the bench driver yields until
        // then; the journal itself never polls).
        let head = j.appended_lsn();
        if head <= flushed || j.durable_lsn() >= head {
            std::thread::yield_now();
            continue;
        }
        flushed = head;
        let lsn = Lsn(head.0 - 1);
        let t0 = Instant::now();
        j.force(lsn, ForceMode::Written).map_err(err)?;
        let t1 = Instant::now();
        if condvar {
            j.force(lsn, ForceMode::Durable).map_err(err)?;
        } else {
            // WiredTiger before the fix, deliberately: sleep 1 ms and
            // force out the active buffer on every iteration.
            while j.durable_lsn() <= lsn {
                std::thread::sleep(Duration::from_millis(1));
                let now = j.appended_lsn();
                if now.0 > 0 {
                    j.force(Lsn(now.0 - 1), ForceMode::Written).map_err(err)?;
                }
            }
        }
        let t2 = Instant::now();
        wait_h.record(micros(t2 - t1)).ok();
        force_h.record(micros(t2 - t0)).ok();
        flushes += 1;
    }
    Ok((wait_h, force_h, flushes))
}

/// Seed 004 (jbd 2005, jbd2 2009): one synchronous writer, then eight,
/// under each batching policy, on the real disk.
pub fn jbd_lone_writer(env: &Env) -> Result<Json, String> {
    let policies = [
        ("Adaptive", BatchPolicy::Adaptive),
        ("LastSyncWriter", BatchPolicy::LastSyncWriter),
        (
            "FixedSleep(1ms)",
            BatchPolicy::FixedSleep(Duration::from_millis(1)),
        ),
        ("None", BatchPolicy::None),
    ];
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut rate = std::collections::HashMap::new();
    for threads in [1usize, 8] {
        for (name, policy) in policies {
            env.progress(&format!("jbd-lone-writer: {threads} thread(s), {name}"));
            let options = Options {
                batch_policy: policy,
                ..bench_options(env)
            };
            let (j, dir) = fresh_journal(env, "jbd", options).map_err(err)?;
            let rec = Arc::new(vec![0x42u8; 512]);
            let load = commit_load(&j, threads, env.seconds, move |j, _, _| {
                j.append_durable(&rec).map(|_| ())
            })
            .map_err(err)?;
            drop(j);
            env.discard(&dir);
            rate.insert((threads, name), load.rate());
            rows.push(vec![
                threads.to_string(),
                name.to_string(),
                format!("{:.0}", load.rate()),
                load.q(0.5).to_string(),
                format!("{:.2}", load.avg_group()),
                load.waits_taken.to_string(),
            ]);
            results.push(
                json!({"threads": threads, "policy": name, "commits_per_s": load.rate(), "p50_us": load.q(0.5), "avg_group_size": load.avg_group(), "batch_waits_taken": load.waits_taken}),
            );
        }
    }
    println!("jbd-lone-writer (seed 004): synchronous 512-byte commits");
    table(
        &["threads", "policy", "commits/s", "p50 µs", "group", "waits"],
        &rows,
    );
    let lone = ratio(rate[&(1, "Adaptive")], rate[&(1, "FixedSleep(1ms)")]);
    let many = ratio(rate[&(8, "Adaptive")], rate[&(8, "FixedSleep(1ms)")]);
    println!("Adaptive / FixedSleep(1ms): 1 thread {lone:.2}x, 8 threads {many:.2}x (seed: lone O_SYNC writer 4-5x, many unchanged)");
    Ok(
        json!({"scenario": "jbd-lone-writer", "options": options_json(&bench_options(env)), "results": results, "ratios": json!({"lone_adaptive_over_fixed_sleep": lone, "eight_adaptive_over_fixed_sleep": many, "lone_adaptive_over_last_sync_writer": ratio(rate[&(1, "Adaptive")], rate[&(1, "LastSyncWriter")])})}),
    )
}

/// Seed 002 (PostgreSQL segment recycling): checkpoints that each recycle
/// 44 segments on the real disk, batched vs per-segment durable rename.
pub fn pg_recycle(env: &Env) -> Result<Json, String> {
    let per_round = if env.smoke { 6 } else { 44u64 };
    let rounds = if env.smoke { 2 } else { 11 };
    let segment_size: u64 = if env.smoke { 256 << 10 } else { 1 << 20 };
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut medians = Vec::new();
    for (name, policy) in [
        (
            "PerSegmentDurableRename",
            RecyclePolicy::PerSegmentDurableRename,
        ),
        ("Batched", RecyclePolicy::Batched),
    ] {
        let options = Options {
            segment_size,
            logbsize: 64 << 10,
            recycle_policy: policy,
            max_segments: per_round * 2 + 8,
            ..Options::default()
        };
        let (j, dir) = fresh_journal(env, "pg", options).map_err(err)?;
        let data = Geometry::new(segment_size, options.alignment).data_size();
        let rec = vec![0x11u8; 60 << 10];
        let mut times = Vec::new();
        let mut dir_fsyncs = 0;
        let mut recycled = 0;
        for round in 0..rounds {
            env.progress_bar(round, rounds, &format!("pg-recycle: {name}"));
            let target = j.appended_lsn().0 + per_round * data;
            while j.appended_lsn().0 < target {
                j.append(&rec).map_err(err)?;
            }
            let end = j.force_all().map_err(err)?;
            let before = j.vfs().counters();
            let t = Instant::now();
            let r = j.checkpoint(end).map_err(err)?;
            let took = t.elapsed();
            // The first round only creates segments: there is nothing to
            // recycle yet.
            if round > 0 {
                times.push(took);
                dir_fsyncs += j.vfs().counters().since(&before).dir_fsyncs;
                recycled += r.recycled.len() as u64;
            }
        }
        drop(j);
        env.discard(&dir);
        times.sort();
        let median = times[times.len() / 2];
        medians.push(median.as_secs_f64());
        let n = times.len() as u64;
        rows.push(vec![
            name.to_string(),
            format!("{:.2}", median.as_secs_f64() * 1e3),
            format!("{:.1}", recycled as f64 / n as f64),
            format!("{:.1}", dir_fsyncs as f64 / n as f64),
        ]);
        results.push(
            json!({"policy": name, "median_checkpoint_ms": median.as_secs_f64() * 1e3, "rounds": n, "recycled_per_checkpoint": recycled as f64 / n as f64, "dir_fsyncs_per_checkpoint": dir_fsyncs as f64 / n as f64}),
        );
    }
    println!(
        "pg-recycle (seed 002): checkpoints recycling {per_round} segments of {segment_size} bytes"
    );
    table(&["policy", "median ms", "recycled", "dir fsyncs"], &rows);
    let r = ratio(medians[0], medians[1]);
    println!("per-segment / batched median checkpoint time: {r:.2}x (seed: 138.6 ms -> 27.3 ms)");
    Ok(
        json!({"scenario": "pg-recycle", "segments_per_checkpoint": per_round, "segment_size": segment_size, "results": results, "ratios": json!({"per_segment_over_batched": r})}),
    )
}

/// Seed 003 (XFS NEED_FLUSH / NEED_FUA): writers commit transactions that
/// span several buffers; 32 KiB vs 256 KiB buffers, NEED flags vs
/// PREFLUSH|FUA on every write. The four configurations run in interleaved
/// rounds (a fresh journal each time); rates are medians over the rounds,
/// the other figures those of the median run.
pub fn xfs_flush_flags(env: &Env) -> Result<Json, String> {
    let writers = if env.smoke { 2 } else { 8 };
    let rounds = if env.smoke { 1 } else { 3 };
    let configs = [
        (32usize << 10, "NeedFlags", FlushPolicy::NeedFlags),
        (32 << 10, "EveryWrite", FlushPolicy::EveryWrite),
        (256 << 10, "NeedFlags", FlushPolicy::NeedFlags),
        (256 << 10, "EveryWrite", FlushPolicy::EveryWrite),
    ];
    let base = bench_options(env);
    let prepared = prepared_segments(env, &base);
    // Per configuration, one (rate, run figures) per round.
    let mut runs: Vec<Vec<(f64, Json)>> = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        for (k, &(logbsize, fname, policy)) in configs.iter().enumerate() {
            env.progress_bar(
                round * configs.len() + k,
                rounds * configs.len(),
                &format!("xfs-flush-flags: logbsize {} KiB, {fname}", logbsize >> 10),
            );
            runs[k].push(xfs_run(env, &base, prepared, writers, logbsize, policy)?);
        }
    }
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut rate = std::collections::HashMap::new();
    for (&(logbsize, fname, _), mut r) in configs.iter().zip(runs) {
        // The median run (the upper one of an even count) gives the rate
        // and the figures.
        r.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (med, figures) = &r[r.len() / 2];
        let med = *med;
        rate.insert((logbsize, fname), med);
        let all: Vec<f64> = r.iter().map(|(x, _)| *x).collect();
        let f = |k: &str| figures[k].as_f64().unwrap_or(0.0);
        rows.push(vec![
            format!("{}", logbsize >> 10),
            fname.to_string(),
            format!("{med:.0}"),
            format!("{:.0}-{:.0}", all[0], all[all.len() - 1]),
            format!("{:.3}", f("syncs_per_commit")),
            format!("{:.0}", f("preflush_writes")),
            format!("{:.0}", f("bare_flushes")),
            format!("{:.0}", f("groups")),
            format!("{:.0}", f("noiclog_waits")),
            format!("{:.0}", f("prealloc_stalls")),
        ]);
        results.push(
            json!({"logbsize": logbsize, "flush_policy": fname, "commits_per_s": med, "rounds_commits_per_s": all, "median_run": figures}),
        );
    }
    println!(
        "xfs-flush-flags (seed 003): {writers} writers, 48 KiB transactions, medians of {rounds} interleaved rounds, {} s per point",
        env.seconds
    );
    table(
        &[
            "logbsize KiB",
            "policy",
            "commits/s",
            "range",
            "syncs/commit",
            "preflush writes",
            "bare flushes",
            "groups",
            "noiclog",
            "stalls",
        ],
        &rows,
    );
    let r32 = ratio(
        rate[&(32 << 10, "NeedFlags")],
        rate[&(32 << 10, "EveryWrite")],
    );
    let r256 = ratio(
        rate[&(256 << 10, "NeedFlags")],
        rate[&(256 << 10, "EveryWrite")],
    );
    let gap = ratio(
        rate[&(32 << 10, "NeedFlags")],
        rate[&(256 << 10, "NeedFlags")],
    );
    println!("NeedFlags / EveryWrite: 32 KiB {r32:.2}x, 256 KiB {r256:.2}x; 32 KiB / 256 KiB with NeedFlags {gap:.2} (seed: 32 KiB 152,851 -> 221,533, 256 KiB 228,286)");
    Ok(
        json!({"scenario": "xfs-flush-flags", "writers": writers, "rounds": rounds, "results": results, "ratios": json!({"need_flags_over_every_write_32k": r32, "need_flags_over_every_write_256k": r256, "need_flags_32k_over_256k": gap})}),
    )
}

/// One xfs-flush-flags run: `writers` committing 48 KiB transactions with
/// `logbsize` buffers under `policy`. Returns its rate and its figures.
fn xfs_run(
    env: &Env,
    base: &Options,
    prepared: u64,
    writers: usize,
    logbsize: usize,
    policy: FlushPolicy,
) -> Result<(f64, Json), String> {
    let options = Options {
        logbsize,
        flush_policy: policy,
        // Every segment the run writes is prepared at open, before
        // the timed window: XFS's log is preallocated, and a journal
        // in steady state recycles its segments, so zero-fill (half
        // the device's write traffic here otherwise) stays out of a
        // comparison of log-write flags.
        background_preallocation: false,
        preallocate_ahead: prepared,
        max_segments: prepared + 4,
        ..*base
    };
    let (j, dir) = fresh_journal(env, "xfs", options).map_err(err)?;
    // A transaction: four 12 KiB entries, committed at the last.
    let entry = Arc::new(vec![0x33u8; 12 << 10]);
    let load = commit_load(&j, writers, env.seconds, move |j, _, _| {
        let mut last = Lsn(0);
        for _ in 0..4 {
            last = j.append(&entry)?;
        }
        j.commit(last)
    })
    .map_err(err)?;
    let m = j.metrics();
    drop(j);
    env.discard(&dir);
    Ok((
        load.rate(),
        json!({"commits_per_s": load.rate(), "syncs_per_commit": load.syncs_per_commit(), "p50_us": load.q(0.5), "log_writes": m.log_writes, "preflush_writes": m.log_writes_preflush, "bare_flushes": m.log_bare_flushes, "groups": m.groups, "noiclog_waits": m.noiclog_waits, "prepared_segments": prepared, "prealloc_stalls": m.prealloc_stalls}),
    ))
}

/// Segments to prepare at open for one xfs-flush-flags run: what the
/// warm-up and the timed window write at 1.5 GB/s (above what this
/// workload reached on the development VM, 1 GB/s), so the writer never
/// prepares one itself (the table's `stalls` column says if it did). A
/// smoke run, on small segments, prepares a few and lets the writer make
/// the rest.
fn prepared_segments(env: &Env, options: &Options) -> u64 {
    if env.smoke {
        return 4;
    }
    let data = Geometry::new(options.segment_size, options.alignment).data_size();
    let seconds = env.seconds + warmup_seconds(env.seconds);
    (seconds * 1.5e9 / data as f64).ceil() as u64
}

/// Seed 001 (alignment): records rounded to 1, 512 and 4096 bytes, written
/// with RWF_DSYNC; sync latency and commits/s.
pub fn alignment(env: &Env) -> Result<Json, String> {
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut rates = Vec::new();
    for (i, align) in [1u64, 512, 4096].into_iter().enumerate() {
        env.progress_bar(i, 3, &format!("alignment: {align}"));
        let options = Options {
            alignment: align,
            sync_method: SyncMethod::Dsync,
            ..bench_options(env)
        };
        let (j, dir) = fresh_journal(env, "align", options).map_err(err)?;
        let rec = Arc::new(vec![0x66u8; 300]);
        let load = commit_load(&j, 1, env.seconds, move |j, _, _| {
            j.append_durable(&rec).map(|_| ())
        })
        .map_err(err)?;
        let m = j.metrics();
        drop(j);
        env.discard(&dir);
        rates.push(load.rate());
        rows.push(vec![
            align.to_string(),
            format!("{:.0}", load.rate()),
            load.q(0.5).to_string(),
            load.q(0.99).to_string(),
            m.padding_bytes.to_string(),
        ]);
        results.push(
            json!({"alignment": align, "commits_per_s": load.rate(), "sync_p50_us": load.q(0.5), "sync_p99_us": load.q(0.99), "padding_bytes": m.padding_bytes}),
        );
    }
    println!("alignment (seed 001): one client, 300-byte records, RWF_DSYNC writes");
    table(
        &[
            "alignment",
            "commits/s",
            "p50 µs",
            "p99 µs",
            "padding bytes",
        ],
        &rows,
    );
    let r512 = ratio(rates[1], rates[0]);
    let r4096 = ratio(rates[2], rates[0]);
    println!("commits/s relative to alignment 1: 512 -> {r512:.2}x, 4096 -> {r4096:.2}x");
    Ok(
        json!({"scenario": "alignment", "results": results, "ratios": json!({"align_512_over_1": r512, "align_4096_over_1": r4096})}),
    )
}
