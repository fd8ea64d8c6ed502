//! `metafs bench`: an fs_mark-like run. N threads each create files of
//! 0-4 KiB in their own directory, with an fsync per file (each create is
//! durable when timed) or without (one sync at the end); creates/s and the
//! latency of one create (create + write + fsync), p50 and p99.
//! `--scenario xfs` runs the seed's experiment in the filesystem's own
//! unit: 32 KiB vs 256 KiB log buffers × NEED flags vs PREFLUSH|FUA on
//! every write, side by side. `--scenario dir-scale` creates 100,000
//! empty files in one directory and compares the create rate near the
//! end with the rate over the first 1,000 (interleaved rounds, medians).

use bench_harness::{histogram, median, micros, table, write_json};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use journal_core::vfs::SplitMix64;
use journal_core::FlushPolicy;
use metafs::{Fs, MkfsOptions, MountOptions};
use serde_json::{json, Value as Json};
use std::path::PathBuf;
use std::time::Instant;

/// Parses `4096`, `32k`, `256K`, `64M`, `1G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size {s:?}"))
}

/// A run of the default scenario or the xfs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Threads 1/4/16, with and without an fsync per file.
    Creates,
    /// 32 KiB vs 256 KiB log buffers × need-flags vs every-write, 16
    /// threads, an fsync per file.
    Xfs,
    /// Empty files created in one directory up to `--files` (100,000 when
    /// not given): creates/s over each 1,000, first against last.
    DirScale,
    /// The real fs_mark on a metafs mount, ext4 through bindfs and native
    /// ext4 (`--files` per thread, default 1,000; root and FUSE needed).
    FsMark,
}

/// The flush policy, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Policy {
    /// PREFLUSH / FUA only where needed (Linux 5.14).
    NeedFlags,
    /// PREFLUSH | FUA on every log write (before 5.14).
    EveryWrite,
}

impl Policy {
    fn flush(self) -> FlushPolicy {
        match self {
            Policy::NeedFlags => FlushPolicy::NeedFlags,
            Policy::EveryWrite => FlushPolicy::EveryWrite,
        }
    }
}

/// `metafs bench` options.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to run.
    #[arg(long, value_enum, default_value_t = Scenario::Creates)]
    scenario: Scenario,
    /// Thread counts, comma-separated (creates scenario).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16])]
    pub(crate) threads: Vec<usize>,
    /// Files per run, split over the threads [default: 4,000; dir-scale:
    /// 100,000].
    #[arg(long)]
    files: Option<usize>,
    /// Rounds (dir-scale, fs-mark).
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: usize,
    /// Log buffer size (creates scenario): 32k, 256k, ...
    #[arg(long, default_value = "256k", value_parser = parse_size)]
    logbsize: u64,
    /// Flush policy (creates scenario).
    #[arg(long, value_enum, default_value_t = Policy::NeedFlags)]
    flush_policy: Policy,
    /// Run in a fresh directory inside DIR (default: the system temporary
    /// directory; it must be on the disk you want to measure).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the results as JSON to FILE.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Tiny runs that only prove every path works.
    #[arg(long)]
    smoke: bool,
}

/// A new image of `size` bytes and `inodes` inodes, mounted.
fn fresh(
    image: &std::path::Path,
    size: u64,
    inodes: u32,
    journal: journal_core::Options,
) -> Result<Fs, String> {
    let inodes = Some(inodes);
    Fs::mkfs(
        image,
        MkfsOptions {
            size,
            inodes,
            journal,
        },
    )
    .map_err(|e| e.to_string())?;
    let mount = MountOptions {
        journal,
        ..MountOptions::default()
    };
    Fs::mount(image, mount).map_err(|e| e.to_string())
}

/// One measured point.
struct Point {
    creates_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    log_syncs: u64,
}

#[allow(clippy::too_many_arguments)]
fn one(
    root: &std::path::Path,
    n: usize,
    threads: usize,
    files: usize,
    fsync: bool,
    logbsize: usize,
    policy: FlushPolicy,
    smoke: bool,
) -> Result<Point, String> {
    let image = root.join(format!("run{n}.img"));
    let journal = journal_core::Options {
        logbsize,
        flush_policy: policy,
        segment_size: if smoke { 1 << 20 } else { 16 << 20 },
        ..journal_core::Options::default()
    };
    let size = if smoke { 32 << 20 } else { 512 << 20 };
    let fs = fresh(&image, size, (files as u32 + 1024).max(4096), journal)?;
    for t in 0..threads {
        fs.mkdir_path(&format!("/t{t}"))
            .map_err(|e| e.to_string())?;
    }
    fs.sync().map_err(|e| e.to_string())?;
    let before = fs.journal().metrics().log_syncs;
    let per = files.div_ceil(threads);
    let start = Instant::now();
    let hists: Vec<Histogram<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || -> Result<Histogram<u64>, String> {
                    let mut h = histogram();
                    let mut rng = SplitMix64::new(t as u64);
                    let mut data = vec![0u8; 4096];
                    rng.fill(&mut data);
                    let dir = fs.resolve(&format!("/t{t}")).map_err(|e| e.to_string())?;
                    for i in 0..per {
                        let t0 = Instant::now();
                        let f = fs
                            .create(dir, format!("f{i:06}").as_bytes())
                            .map_err(|e| e.to_string())?;
                        let len = rng.below(4097) as usize;
                        fs.write(f, 0, &data[..len]).map_err(|e| e.to_string())?;
                        if fsync {
                            fs.fsync(f).map_err(|e| e.to_string())?;
                        }
                        h.saturating_record(micros(t0.elapsed()));
                    }
                    Ok(h)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a bench thread panicked".into()))
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    if !fsync {
        fs.sync().map_err(|e| e.to_string())?;
    }
    let secs = start.elapsed().as_secs_f64();
    let log_syncs = fs.journal().metrics().log_syncs - before;
    fs.unmount().map_err(|e| e.to_string())?;
    let mut all = histogram();
    for h in &hists {
        all.add(h).map_err(|e| e.to_string())?;
    }
    let done = per * threads;
    Ok(Point {
        creates_per_s: done as f64 / secs,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        log_syncs,
    })
}

/// `metafs bench`.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    let tmp = match &args.dir {
        Some(d) => tempfile::Builder::new()
            .prefix("metafs-bench")
            .tempdir_in(d),
        None => tempfile::Builder::new().prefix("metafs-bench").tempdir(),
    }
    .map_err(|e| format!("temporary directory: {e}"))?;
    let files = match (args.scenario, args.smoke) {
        (Scenario::DirScale, true) => 3000,
        (Scenario::DirScale, false) => args.files.unwrap_or(100_000),
        (Scenario::FsMark, true) => 20,
        (Scenario::FsMark, false) => args.files.unwrap_or(1000),
        (_, true) => 64,
        (_, false) => args.files.unwrap_or(4000),
    };
    let mut n = 0;
    match args.scenario {
        Scenario::Creates => creates(args, tmp.path(), files, &mut n),
        Scenario::Xfs => xfs(args, tmp.path(), files, &mut n),
        Scenario::DirScale => dir_scale(args, tmp.path(), files),
        Scenario::FsMark => crate::fsmark::bench(args, tmp.path(), files),
    }
}

/// Creates with and without an fsync per file, at each thread count.
fn creates(
    args: &BenchArgs,
    root: &std::path::Path,
    files: usize,
    n: &mut usize,
) -> Result<(), String> {
    let (mut results, mut rows) = (Vec::new(), Vec::new());
    for &fsync in &[true, false] {
        for &threads in &args.threads {
            *n += 1;
            let p = one(
                root,
                *n,
                threads.max(1),
                files,
                fsync,
                args.logbsize as usize,
                args.flush_policy.flush(),
                args.smoke,
            )?;
            rows.push(vec![
                threads.to_string(),
                if fsync { "per file" } else { "at the end" }.to_string(),
                format!("{:.0}", p.creates_per_s),
                p.p50_us.to_string(),
                p.p99_us.to_string(),
                format!("{:.2}", p.log_syncs as f64 / files as f64),
            ]);
            results.push(json!({"threads": threads, "fsync_per_file": fsync,
                "creates_per_s": p.creates_per_s, "p50_us": p.p50_us, "p99_us": p.p99_us,
                "log_syncs": p.log_syncs, "files": files}));
        }
    }
    println!(
        "metafs bench: {files} files of 0-4 KiB per run, {} log buffers, {:?}",
        args.logbsize, args.flush_policy
    );
    table(
        &[
            "threads",
            "fsync",
            "creates/s",
            "p50 µs",
            "p99 µs",
            "log syncs/file",
        ],
        &rows,
    );
    finish(args, json!({"scenario": "creates", "results": results}))
}

/// The seed's experiment: 32 KiB vs 256 KiB log buffers, NEED flags vs
/// PREFLUSH|FUA on every write, 16 threads, with and without fsyncs.
fn xfs(
    args: &BenchArgs,
    root: &std::path::Path,
    files: usize,
    n: &mut usize,
) -> Result<(), String> {
    let (mut results, mut rows) = (Vec::new(), Vec::new());
    let threads = 16;
    let mut rates = std::collections::HashMap::new();
    for fsync in [true, false] {
        for logbsize in [32usize << 10, 256 << 10] {
            for policy in [Policy::NeedFlags, Policy::EveryWrite] {
                *n += 1;
                let p = one(
                    root,
                    *n,
                    threads,
                    files,
                    fsync,
                    logbsize,
                    policy.flush(),
                    args.smoke,
                )?;
                rates.insert((fsync, logbsize, policy), p.creates_per_s);
                rows.push(vec![
                    if fsync { "per file" } else { "at the end" }.to_string(),
                    format!("{} KiB", logbsize >> 10),
                    format!("{policy:?}"),
                    format!("{:.0}", p.creates_per_s),
                    p.p50_us.to_string(),
                    p.p99_us.to_string(),
                    p.log_syncs.to_string(),
                ]);
                results.push(json!({"fsync_per_file": fsync, "logbsize": logbsize,
                    "flush_policy": format!("{policy:?}"), "creates_per_s": p.creates_per_s,
                    "p50_us": p.p50_us, "p99_us": p.p99_us, "log_syncs": p.log_syncs}));
            }
        }
    }
    let r =
        |f: bool, b: usize| rates[&(f, b, Policy::NeedFlags)] / rates[&(f, b, Policy::EveryWrite)];
    let ratios = json!({
        "per_file_32k": r(true, 32 << 10), "per_file_256k": r(true, 256 << 10),
        "at_the_end_32k": r(false, 32 << 10), "at_the_end_256k": r(false, 256 << 10),
    });
    println!("metafs bench --scenario xfs: {threads} threads, {files} files of 0-4 KiB");
    table(
        &[
            "fsync",
            "log buffers",
            "flush policy",
            "creates/s",
            "p50 µs",
            "p99 µs",
            "log syncs",
        ],
        &rows,
    );
    println!(
        "need-flags / every-write: fsync per file {:.2}x (32 KiB), {:.2}x (256 KiB); one sync at the end {:.2}x (32 KiB), {:.2}x (256 KiB) — the seed: 32 KiB 152,851 -> 221,533 creates/s, 1.45x",
        r(true, 32 << 10),
        r(true, 256 << 10),
        r(false, 32 << 10),
        r(false, 256 << 10)
    );
    finish(
        args,
        json!({"scenario": "xfs", "threads": threads, "files": files, "results": results, "ratios": ratios}),
    )
}

/// Files per measured window of [`dir_scale`].
const WINDOW: usize = 1000;

/// One round of `dir-scale`: creates/s over each window of 1,000 creates
/// into one directory, no data, no fsync (one sync at the end).
fn dir_scale_round(root: &std::path::Path, round: usize, files: usize) -> Result<Vec<f64>, String> {
    let image = root.join(format!("scale{round}.img"));
    let journal = journal_core::Options {
        segment_size: 16 << 20,
        ..journal_core::Options::default()
    };
    let size = ((files as u64 * 4096) / 8).max(64 << 20);
    let fs = fresh(&image, size, files as u32 + 1024, journal)?;
    let dir = fs.mkdir_path("/one").map_err(|e| e.to_string())?;
    let mut rates = Vec::new();
    let mut t = Instant::now();
    for i in 0..files {
        fs.create(dir, format!("file-{i:07}").as_bytes())
            .map_err(|e| e.to_string())?;
        if (i + 1) % WINDOW == 0 {
            rates.push(WINDOW as f64 / t.elapsed().as_secs_f64());
            t = Instant::now();
        }
    }
    fs.sync().map_err(|e| e.to_string())?;
    fs.unmount().map_err(|e| e.to_string())?;
    Ok(rates)
}

/// Creates/s as one directory fills: the first window against the last,
/// per round, then medians.
fn dir_scale(args: &BenchArgs, root: &std::path::Path, files: usize) -> Result<(), String> {
    if files < 2 * WINDOW {
        return Err(format!(
            "dir-scale needs --files of at least {}",
            2 * WINDOW
        ));
    }
    let rounds = args.rounds.max(1);
    // Per round: the first 1,000 creates (a directory of 1,000, as fs_mark
    // -n 1000 measures it), the whole run (fs_mark -n FILES), the last
    // 1,000 (the directory at its fullest).
    let (mut small, mut whole, mut last) = (Vec::new(), Vec::new(), Vec::new());
    let mut results = Vec::new();
    for r in 0..rounds {
        let rates = dir_scale_round(root, r, files)?;
        let secs: f64 = rates.iter().map(|x| WINDOW as f64 / x).sum();
        let (a, b, c) = (
            rates[0],
            (rates.len() * WINDOW) as f64 / secs,
            rates[rates.len() - 1],
        );
        eprintln!("round {r}: {a:.0} creates/s for {WINDOW} files, {b:.0} for {files}, {c:.0} over the last {WINDOW}");
        small.push(a);
        whole.push(b);
        last.push(c);
        results.push(json!({"round": r, "window": WINDOW, "rates": rates}));
    }
    let ratios = |v: &[f64]| -> Vec<f64> { v.iter().zip(&small).map(|(x, y)| x / y).collect() };
    let span = |v: &[f64]| {
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(0.0, f64::max);
        format!("{:.2} ({lo:.2}–{hi:.2})", median(v.to_vec()))
    };
    println!("metafs bench --scenario dir-scale: empty files created in one directory, no fsync, {rounds} rounds (medians)");
    let rows = vec![
        vec![
            format!("{WINDOW} files"),
            format!("{:.0}", median(small.clone())),
            "1".into(),
        ],
        vec![
            format!("{files} files"),
            format!("{:.0}", median(whole.clone())),
            span(&ratios(&whole)),
        ],
        vec![
            format!("the last {WINDOW} of {files}"),
            format!("{:.0}", median(last.clone())),
            span(&ratios(&last)),
        ],
    ];
    table(&["run", "creates/s", "against 1,000 files"], &rows);
    finish(
        args,
        json!({"scenario": "dir-scale", "files": files, "window": WINDOW, "rounds": results,
            "small_median": median(small.clone()), "whole_median": median(whole.clone()),
            "last_median": median(last.clone()), "whole_over_small_median": median(ratios(&whole)),
            "last_over_small_median": median(ratios(&last))}),
    )
}

fn finish(args: &BenchArgs, doc: Json) -> Result<(), String> {
    if let Some(path) = &args.json {
        write_json(path, &doc)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
