//! `--scenario reads`: what a read costs, and whether that grows with the
//! log (issue: reads that cost what they read).
//!
//! Writes two logs of 1 KiB entries, 64 MiB and `--log-mib` MiB (default
//! 1,024), both left open, and reads their files once so the page cache
//! is warm (a log written with `O_DIRECT` is not in it: a cold read costs
//! a device read, whatever the log's length); then, in three rounds that
//! alternate between the two logs (medians):
//!
//! - `read_at` of the newest entry (in the active segment: `pread`) and of
//!   random entries (mostly in sealed, mapped segments), per call;
//! - `read_from` the entry 1,000 before the end, reading the last 1,000;
//! - a follower at the durable end: how long after an `append_durable`
//!   began the follower had the entry, beside how long the commit took
//!   (with `O_DIRECT` the follower's read of what was just written is a
//!   device read: `--direct-io false` shows the cost without it).
//!
//! Each figure for the large log over the small one says whether the cost
//! grows with the log (1.0 = not at all).

use super::{bench_options, err, median, options_json, table, Env};
use journal_core::vfs::SplitMix64;
use journal_core::{Journal, Lsn, Options};
use serde_json::{json, Value as Json};
use std::hint::black_box;
use std::time::{Duration, Instant};

const ENTRY: usize = 1024;

/// A log of `bytes` of 1 KiB entries, open, with its entries' LSNs.
struct Log {
    journal: Journal,
    lsns: Vec<Lsn>,
    dir: std::path::PathBuf,
}

fn write_log(env: &Env, bytes: u64) -> Result<Log, String> {
    let base = bench_options(env);
    let options = Options {
        max_segments: bytes / base.segment_size + 8,
        ..base
    };
    let dir = env.fresh_dir("reads");
    env.progress(&format!(
        "reads: writing {} MiB of 1 KiB entries",
        bytes >> 20
    ));
    let journal = Journal::open(&dir, options).map_err(err)?;
    let count = bytes / ENTRY as u64;
    let mut lsns = Vec::with_capacity(count as usize);
    let mut e = vec![0u8; ENTRY];
    for i in 0..count {
        e[..8].copy_from_slice(&i.to_le_bytes());
        lsns.push(journal.append(&e).map_err(err)?);
        if i % 4096 == 4095 {
            journal.force_all().map_err(err)?;
        }
    }
    journal.force_all().map_err(err)?;
    Ok(Log { journal, lsns, dir })
}

/// Median and 99th percentile of per-call microseconds.
fn per_call(mut us: Vec<f64>) -> Quantiles {
    us.sort_by(|a, b| a.total_cmp(b));
    let p99 = us[(us.len() * 99 / 100).min(us.len() - 1)];
    (us[us.len() / 2], p99)
}

/// One round of measurements on `log`: (read_at newest, read_at random,
/// read_from last 1,000) medians in µs.
fn round(log: &Log, calls: usize, seed: u64) -> Result<[f64; 3], String> {
    let j = &log.journal;
    let newest = *log.lsns.last().ok_or("an empty log")?;
    let mut t_newest = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        black_box(j.read_at(newest).map_err(err)?.len());
        t_newest.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut rng = SplitMix64::new(seed);
    let mut t_random = Vec::with_capacity(calls);
    for _ in 0..calls {
        let lsn = log.lsns[rng.below(log.lsns.len() as u64) as usize];
        let t = Instant::now();
        black_box(j.read_at(lsn).map_err(err)?.len());
        t_random.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let from = log.lsns[log.lsns.len().saturating_sub(1000)];
    let mut t_tail = Vec::new();
    for _ in 0..(calls / 20).max(3) {
        let t = Instant::now();
        let mut n = 0;
        for r in j.read_from(from).map_err(err)? {
            black_box(r.map_err(err)?.1.len());
            n += 1;
        }
        t_tail.push(t.elapsed().as_secs_f64() * 1e6);
        if n != log.lsns.len().min(1000) {
            return Err(format!("read_from returned {n} entries"));
        }
    }
    Ok([per_call(t_newest).0, per_call(t_random).0, median(t_tail)])
}

/// Median and 99th percentile, µs.
type Quantiles = (f64, f64);

/// A follower at the end of `log`: per entry, µs from the start of its
/// `append_durable` to the follower having it, and the commit's µs.
fn follow(log: &Log, entries: usize) -> Result<(Quantiles, Quantiles), String> {
    let j = &log.journal;
    let from = j.appended_lsn();
    let started = Instant::now();
    std::thread::scope(|s| {
        let follower = s.spawn(move || -> Result<Vec<Duration>, String> {
            let mut f = j.follow(from).map_err(err)?;
            let mut at = Vec::with_capacity(entries);
            for _ in 0..entries {
                match f.next_timeout(Duration::from_secs(10)).map_err(err)? {
                    Some(_) => at.push(started.elapsed()),
                    None => return Err("the follower waited 10 s".into()),
                }
            }
            Ok(at)
        });
        let e = vec![7u8; ENTRY];
        let mut begun = Vec::with_capacity(entries);
        let mut commit = Vec::with_capacity(entries);
        for _ in 0..entries {
            let b = started.elapsed();
            j.append_durable(&e).map_err(err)?;
            commit.push((started.elapsed() - b).as_secs_f64() * 1e6);
            begun.push(b);
        }
        let got = follower.join().map_err(|_| "the follower panicked")??;
        let delivery = got
            .iter()
            .zip(&begun)
            .map(|(g, b)| g.saturating_sub(*b).as_secs_f64() * 1e6)
            .collect();
        Ok((per_call(delivery), per_call(commit)))
    })
}

/// The reads scenario.
pub fn reads(env: &Env, log_mib: Option<u64>) -> Result<Json, String> {
    let (small, large) = if env.smoke {
        (2u64 << 20, 8u64 << 20)
    } else {
        (64 << 20, log_mib.unwrap_or(1024) << 20)
    };
    let calls = if env.smoke { 200 } else { 5000 };
    let logs = [write_log(env, small)?, write_log(env, large)?];
    // Warm the page cache: the log was written past it (O_DIRECT), and
    // what is measured is the read path, not the device.
    let vfs = journal_core::vfs::OsVfs::new();
    for log in &logs {
        super::replay::plain_read(&vfs, &log.dir)?;
    }
    let rounds = 3;
    let mut m: [[Vec<f64>; 3]; 2] = Default::default();
    for r in 0..rounds {
        for (i, log) in logs.iter().enumerate() {
            env.progress_bar(r * 2 + i, rounds * 2, "reads: read_at, read_from");
            let got = round(log, calls, 0x5eed + r as u64)?;
            for k in 0..3 {
                m[i][k].push(got[k]);
            }
        }
    }
    let med: Vec<[f64; 3]> = m
        .iter()
        .map(|per| {
            [
                median(per[0].clone()),
                median(per[1].clone()),
                median(per[2].clone()),
            ]
        })
        .collect();
    env.progress("reads: a follower at the durable end");
    let follows = [follow(&logs[0], calls / 5)?, follow(&logs[1], calls / 5)?];
    let names = [
        "read_at newest µs",
        "read_at random µs",
        "read_from last 1,000 µs",
    ];
    let mut rows = Vec::new();
    for k in 0..3 {
        rows.push(vec![
            names[k].to_string(),
            format!("{:.1}", med[0][k]),
            format!("{:.1}", med[1][k]),
            format!("{:.2}", med[1][k] / med[0][k]),
        ]);
    }
    let ((d0, _), (c0, _)) = follows[0];
    let ((d1, _), (c1, _)) = follows[1];
    rows.push(vec![
        "follow: delivered after µs".into(),
        format!("{d0:.0} (commit {c0:.0})"),
        format!("{d1:.0} (commit {c1:.0})"),
        format!("{:.2}", d1 / d0),
    ]);
    println!(
        "reads: 1 KiB entries, warm cache, medians of {rounds} alternating rounds ({calls} calls each)"
    );
    let (small_h, large_h) = (
        format!("{} MiB log", small >> 20),
        format!("{} MiB log", large >> 20),
    );
    table(&["", &small_h, &large_h, "large / small"], &rows);
    let follow_json = |f: (Quantiles, Quantiles)| {
        json!({"delivered_p50_us": f.0 .0, "delivered_p99_us": f.0 .1,
               "commit_p50_us": f.1 .0, "commit_p99_us": f.1 .1})
    };
    let log_json = |i: usize, bytes: u64| {
        json!({"log_bytes": bytes, "entries": logs[i].lsns.len(),
               "read_at_newest_us": med[i][0], "read_at_random_us": med[i][1],
               "read_from_last_1000_us": med[i][2], "follow": follow_json(follows[i])})
    };
    let doc = json!({
        "scenario": "reads", "entry_bytes": ENTRY, "calls": calls, "rounds": rounds,
        "small": log_json(0, small), "large": log_json(1, large),
        "large_over_small": {"read_at_newest": med[1][0] / med[0][0],
                             "read_at_random": med[1][1] / med[0][1],
                             "read_from_last_1000": med[1][2] / med[0][2]},
        "options": options_json(logs[0].journal.options()),
    });
    for log in logs {
        log.journal.close().map_err(err)?;
        let dir = log.dir.clone();
        drop(log);
        env.discard(&dir);
    }
    Ok(doc)
}
