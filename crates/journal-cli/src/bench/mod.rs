//! `journal bench`: the group-commit benchmark and one A/B scenario per seed.
//!
//! Everything runs on a temporary directory of the local disk (or `--dir`),
//! except `wt-flush-wait`, which needs a slow device and models one on
//! SimVfs with injected latency. Results are printed as a table and, with
//! `--json FILE`, written as JSON; ratios are computed within one run.

mod async_tasks;
mod floor;
mod group_commit;
#[cfg(feature = "peers")]
mod peers;
mod probe;
mod reads;
mod replay;
mod scenarios;
pub mod svg;

pub use probe::DeviceProbe;

use bench_harness::closed_loop;
pub use bench_harness::{histogram, median, micros, progress_bar, table, write_file};

/// The median of `xs` with its range: `median (min–max)`.
pub fn spread(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0} ({lo:.0}–{hi:.0})", median(xs.to_vec()))
}
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use journal_core::sync::atomic::{AtomicU64, Ordering};
use journal_core::vfs::{OsVfs, Vfs};
use journal_core::{BatchPolicy, Journal, Options};
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A benchmark scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Closed-loop clients committing small records, against the device's
    /// own cost of one write + fdatasync of a group.
    GroupCommit,
    /// Seed 000: a log force waits on a condvar vs sleeps and polls
    /// (SimVfs with injected latency).
    WtFlushWait,
    /// Seed 004: batching policies with one, then eight sync writers.
    JbdLoneWriter,
    /// Seed 002: checkpoints recycling segments, batched vs per-segment
    /// durable renames.
    PgRecycle,
    /// Seed 003: 32 KiB vs 256 KiB buffers, NEED flags vs PREFLUSH|FUA on
    /// every write.
    XfsFlushFlags,
    /// Seed 001: record alignment 1, 512, 4096 with RWF_DSYNC writes.
    Alignment,
    /// Async committers: 1, 64 and 1,024 tasks on a 2-worker tokio runtime
    /// beside as many committer threads.
    Async,
    /// Reading a 1 GiB log back (recovery, `read_from`) against a plain
    /// sequential read of its files; 4 KiB and 1 MiB (chained) records.
    Replay,
    /// Reads by position on a 64 MiB and a 1 GiB log of 1 KiB entries:
    /// `read_at` of the newest and of random entries, `read_from` of the
    /// last 1,000, a follower's delivery after a commit.
    Reads,
    /// This journal beside okaywal, raft-engine and the bare device, same
    /// workload, interleaved rounds (needs the `peers` feature: `cargo xtask
    /// bench-peers`; not part of `all`).
    Peers,
    /// Every scenario above, in order.
    All,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    const EACH: [Scenario; 9] = [
        Scenario::GroupCommit,
        Scenario::WtFlushWait,
        Scenario::JbdLoneWriter,
        Scenario::PgRecycle,
        Scenario::XfsFlushFlags,
        Scenario::Alignment,
        Scenario::Async,
        Scenario::Replay,
        Scenario::Reads,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::GroupCommit => "group-commit",
            Scenario::WtFlushWait => "wt-flush-wait",
            Scenario::JbdLoneWriter => "jbd-lone-writer",
            Scenario::PgRecycle => "pg-recycle",
            Scenario::XfsFlushFlags => "xfs-flush-flags",
            Scenario::Alignment => "alignment",
            Scenario::Async => "async",
            Scenario::Replay => "replay",
            Scenario::Reads => "reads",
            Scenario::Peers => "peers",
            Scenario::All => "all",
        }
    }
}

/// The commit batching policy of the group-commit scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BatchPolicyArg {
    /// jbd2 (2009): wait clamp(average commit time, min, max) for joiners,
    /// never for a lone writer.
    Adaptive,
    /// jbd (2005): no wait when this thread was the last sync writer.
    LastSyncWriter,
    /// jbd before 2005: always sleep 1 ms for joiners.
    #[value(name = "fixed-sleep-1ms")]
    FixedSleep1ms,
    /// Never wait for joiners.
    None,
}

impl BatchPolicyArg {
    fn policy(self) -> BatchPolicy {
        match self {
            BatchPolicyArg::Adaptive => BatchPolicy::Adaptive,
            BatchPolicyArg::LastSyncWriter => BatchPolicy::LastSyncWriter,
            BatchPolicyArg::FixedSleep1ms => BatchPolicy::FixedSleep(Duration::from_millis(1)),
            BatchPolicyArg::None => BatchPolicy::None,
        }
    }
}

/// [`journal_core::SyncMethod`], as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyncMethodArg {
    /// `pwrite` + `fdatasync`.
    Fdatasync,
    /// `pwritev2(RWF_DSYNC)`.
    Dsync,
    /// `pwrite` + `fsync`.
    Fsync,
}

impl SyncMethodArg {
    fn method(self) -> journal_core::SyncMethod {
        match self {
            SyncMethodArg::Fdatasync => journal_core::SyncMethod::Fdatasync,
            SyncMethodArg::Dsync => journal_core::SyncMethod::Dsync,
            SyncMethodArg::Fsync => journal_core::SyncMethod::Fsync,
        }
    }
}

/// `journal bench` options.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which scenario to run.
    #[arg(long, value_enum, default_value_t = Scenario::GroupCommit)]
    scenario: Scenario,
    /// Seconds per measured point [default: 3, or 0.2 with --smoke].
    #[arg(long)]
    seconds: Option<f64>,
    /// Client counts of the group-commit scenario, comma-separated
    /// [default: 1,4,16,64, or 1,4 with --smoke].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(usize))]
    clients: Vec<usize>,
    /// Record size of the group-commit scenario, bytes.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(usize))]
    record_size: usize,
    /// Commit batching policy of the group-commit scenario.
    #[arg(long, value_enum, default_value_t = BatchPolicyArg::Adaptive)]
    batch_policy: BatchPolicyArg,
    /// Group commits that may be in flight at once (every scenario; 1 to
    /// logbufs; 1 = one FUA write per commit, 2 or more = staged: write,
    /// then a shared flush) [default: the journal's default].
    #[arg(long, value_name = "N")]
    commits_in_flight: Option<u32>,
    /// How FUA log writes are made durable (group-commit scenario)
    /// [default: the journal's default].
    #[arg(long, value_enum)]
    sync_method: Option<SyncMethodArg>,
    /// Whether journals write their log with `O_DIRECT`, past the page
    /// cache (`Options::direct_io`; where the filesystem cannot, the page
    /// cache is used and the run says so) [default: the journal's default].
    #[arg(long, value_name = "BOOL")]
    direct_io: Option<bool>,
    /// Run in a fresh directory inside DIR (default: the system temporary
    /// directory; it must be on the disk you want to measure).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also plot commits/s against clients as SVG: with the device limit
    /// (group-commit scenario), or every system (peers scenario).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Size of the log the replay scenario writes and reads back, and of
    /// the reads scenario's large log, MiB
    /// [default: 1024, or 8 with --smoke].
    #[arg(long, value_name = "MIB")]
    log_mib: Option<u64>,
    /// Record size of the replay scenario's first variant, bytes (the
    /// second is always 1 MiB).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(usize))]
    replay_record_size: usize,
    /// Interleaved rounds of the peers and async scenarios [default: 5,
    /// or 1 with --smoke].
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Tiny runs that only prove every path works (CI).
    #[arg(long)]
    smoke: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Where and how long the bench runs.
pub struct Env {
    /// The directory journals are created in, removed at the end.
    root: tempfile::TempDir,
    /// Seconds per measured point.
    pub seconds: f64,
    /// Tiny runs that only prove every path works (CI).
    pub smoke: bool,
    /// Journals write their log past the page cache (`--direct-io`).
    pub direct_io: bool,
    /// Group commits in flight (`--commits-in-flight`).
    pub commits_in_flight: u32,
    /// Interleaved rounds of the peers and async scenarios (`--rounds`).
    pub rounds: usize,
    counter: AtomicU64,
    progress: ProgressBar,
}

impl Env {
    /// A fresh, empty directory for one journal or probe.
    pub fn fresh_dir(&self, name: &str) -> PathBuf {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.root.path().join(format!("{n:03}-{name}"))
    }

    /// Removes a directory made by [`Env::fresh_dir`] and everything below
    /// it (bench data only; peers make subdirectories).
    pub fn discard(&self, dir: &Path) {
        let vfs = OsVfs::new();
        if let Ok(names) = vfs.read_dir(dir) {
            for n in names {
                let p = dir.join(n);
                if vfs.remove_file(&p).is_err() {
                    self.discard(&p);
                }
            }
        }
        let _ = vfs.remove_dir(dir);
    }

    /// Reports what is running now (a spinner line on a terminal).
    pub fn progress(&self, msg: &str) {
        self.progress.set_length(0);
        self.progress.set_message(msg.to_string());
    }

    /// Reports progress with a bar: `done` of `total` steps finished.
    pub fn progress_bar(&self, done: usize, total: usize, msg: &str) {
        self.progress.set_length(total as u64);
        self.progress.set_position(done as u64);
        self.progress.set_message(msg.to_string());
    }
}

/// One measured run of a closed-loop load, as the peers and async
/// scenarios keep it for their medians: rate, tail latency, and what the
/// whole process spent per commit over the run (one system or side runs
/// at a time, so it is that one's).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Commits per second.
    pub rate: f64,
    /// 99th-percentile commit latency, µs.
    pub p99: f64,
    /// CPU time (user + system) per commit, µs.
    pub cpu_us: f64,
    /// Voluntary context switches per commit.
    pub switches: f64,
}

impl Sample {
    /// `commits` over `elapsed`, their latency (µs), and the process's
    /// usage over the same run.
    pub fn new(
        commits: u64,
        elapsed: Duration,
        latency: &Histogram<u64>,
        usage: &journal_core::vfs::ProcessUsage,
    ) -> Self {
        let per = commits.max(1) as f64;
        Self {
            rate: commits as f64 / elapsed.as_secs_f64().max(f64::MIN_POSITIVE),
            p99: latency.value_at_quantile(0.99) as f64,
            cpu_us: usage.cpu.as_secs_f64() * 1e6 / per,
            switches: usage.voluntary_switches as f64 / per,
        }
    }
}

/// The outcome of a closed-loop commit load.
pub struct Load {
    /// Commits completed.
    pub commits: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Commit latency, µs.
    pub latency: Histogram<u64>,
    /// Journal metrics over the load.
    pub groups: u64,
    /// Device syncs over the load (from the VFS counters).
    pub syncs: u64,
    /// Batching waits taken.
    pub waits_taken: u64,
    /// What the process spent over the load (CPU, voluntary context
    /// switches), all threads.
    pub usage: journal_core::vfs::ProcessUsage,
}

impl Load {
    /// Adds another slice of the same load.
    fn absorb(&mut self, other: Load) {
        self.commits += other.commits;
        self.elapsed += other.elapsed;
        self.latency.add(&other.latency).ok();
        self.groups += other.groups;
        self.syncs += other.syncs;
        self.waits_taken += other.waits_taken;
        self.usage.cpu += other.usage.cpu;
        self.usage.voluntary_switches += other.usage.voluntary_switches;
    }

    /// Commits per second.
    pub fn rate(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64()
    }
    /// Average commits per group.
    pub fn avg_group(&self) -> f64 {
        self.commits as f64 / self.groups.max(1) as f64
    }
    /// Device syncs per commit.
    pub fn syncs_per_commit(&self) -> f64 {
        self.syncs as f64 / self.commits.max(1) as f64
    }
    /// Latency quantile in µs.
    pub fn q(&self, q: f64) -> u64 {
        self.latency.value_at_quantile(q)
    }
    /// CPU µs spent per commit (all threads of the process).
    pub fn cpu_us_per_commit(&self) -> f64 {
        self.usage.cpu.as_secs_f64() * 1e6 / self.commits.max(1) as f64
    }
    /// Voluntary context switches per commit.
    pub fn switches_per_commit(&self) -> f64 {
        self.usage.voluntary_switches as f64 / self.commits.max(1) as f64
    }
    /// Device syncs per second.
    pub fn syncs_per_s(&self) -> f64 {
        self.syncs as f64 / self.elapsed.as_secs_f64()
    }
}

/// A closed-loop operation: one durable commit by client `c`, its `n`th.
pub type Op = dyn Fn(&Journal, usize, u64) -> journal_core::Result<()> + Send + Sync;

/// Runs `clients` closed-loop threads, each calling `op` (one durable
/// commit) in a loop: first an unmeasured warm-up (a fifth of the time, at
/// most one second: the preallocator fills its first segments, caches warm
/// up), then `seconds` measured, with latency and the journal's counters.
pub fn commit_load(
    journal: &Arc<Journal>,
    clients: usize,
    seconds: f64,
    op: impl Fn(&Journal, usize, u64) -> journal_core::Result<()> + Send + Sync + 'static,
) -> journal_core::Result<Load> {
    commit_load_sliced(journal, clients, seconds, 1, || Ok(()), op)
}

/// [`commit_load`] measured in `slices` equal slices, with `between` run
/// after each one (clients stopped): a device probe sampled between the
/// slices sees the device as the load did. The figures are summed over the
/// slices; what `between` does is not in them.
pub fn commit_load_sliced(
    journal: &Arc<Journal>,
    clients: usize,
    seconds: f64,
    slices: usize,
    mut between: impl FnMut() -> journal_core::Result<()>,
    op: impl Fn(&Journal, usize, u64) -> journal_core::Result<()> + Send + Sync + 'static,
) -> journal_core::Result<Load> {
    let op: Arc<Op> = Arc::new(op);
    run_clients(journal, clients, warmup_seconds(seconds), op.clone())?;
    let slices = slices.max(1);
    let slice = seconds / slices as f64;
    let mut total = run_clients(journal, clients, slice, op.clone())?;
    between()?;
    for _ in 1..slices {
        total.absorb(run_clients(journal, clients, slice, op.clone())?);
        between()?;
    }
    Ok(total)
}

fn run_clients(
    journal: &Arc<Journal>,
    clients: usize,
    seconds: f64,
    op: Arc<Op>,
) -> journal_core::Result<Load> {
    let m0 = journal.metrics();
    let v0 = journal.vfs().counters();
    let u0 = journal_core::vfs::process_usage().map_err(|e| {
        journal_core::Error::from(journal_core::VfsError::new(
            journal_core::vfs::Op::Metadata,
            Path::new("getrusage"),
            e,
        ))
    })?;
    let j = journal.clone();
    let clients_run = closed_loop(
        clients,
        seconds,
        Arc::new(move |c, n| op(&j, c, n)) as Arc<bench_harness::Op<journal_core::Error>>,
    )
    .map_err(|e| {
        journal_core::Error::from(journal_core::VfsError::new(
            journal_core::vfs::Op::Metadata,
            Path::new("bench client"),
            std::io::Error::other(e),
        ))
    })?;
    let (commits, latency) = (clients_run.ops, clients_run.latency);
    let elapsed = clients_run.elapsed;
    let m1 = journal.metrics();
    let v1 = journal.vfs().counters();
    let usage = journal_core::vfs::process_usage()
        .map(|u1| u1.since(&u0))
        .unwrap_or_default();
    Ok(Load {
        commits,
        elapsed,
        latency,
        groups: m1.groups - m0.groups,
        syncs: v1.since(&v0).syncs(),
        waits_taken: m1.batch_waits_taken - m0.batch_waits_taken,
        usage,
    })
}

/// Opens a fresh journal for one measurement.
pub fn fresh_journal(
    env: &Env,
    name: &str,
    options: Options,
) -> journal_core::Result<(Arc<Journal>, PathBuf)> {
    let dir = env.fresh_dir(name);
    let j = Journal::open(&dir, options)?;
    if options.direct_io && !j.direct_io() {
        eprintln!(
            "note: {} cannot take direct I/O at this alignment; the log goes through the page cache",
            dir.display()
        );
    }
    Ok((Arc::new(j), dir))
}

/// `journal bench`.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    let names: Vec<Scenario> = match args.scenario {
        Scenario::All => Scenario::EACH.to_vec(),
        one => vec![one],
    };
    let smoke = args.smoke;
    let seconds = args.seconds.unwrap_or(if smoke { 0.2 } else { 3.0 });
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err("--seconds must be positive".into());
    }
    let root = match &args.dir {
        Some(d) => {
            OsVfs::new().create_dir_all(d).map_err(err)?;
            tempfile::Builder::new()
                .prefix("journal-bench")
                .tempdir_in(d)
                .map_err(|e| format!("{}: {e}", d.display()))?
        }
        None => tempfile::Builder::new()
            .prefix("journal-bench")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?,
    };
    let env = Env {
        root,
        seconds,
        smoke,
        direct_io: args.direct_io.unwrap_or(Options::default().direct_io),
        commits_in_flight: args
            .commits_in_flight
            .unwrap_or(Options::default().commits_in_flight),
        rounds: args.rounds.unwrap_or(if smoke { 1 } else { 5 }),
        counter: AtomicU64::new(0),
        progress: progress_bar(args.quiet),
    };
    if env.rounds == 0 {
        return Err("--rounds must be positive".into());
    }
    eprintln!(
        "journal bench: {} in {} ({} s per point{})",
        names
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        env.root.path().display(),
        seconds,
        if smoke { ", smoke mode" } else { "" }
    );
    let mut results = Vec::new();
    for scenario in &names {
        let r = match scenario {
            Scenario::GroupCommit => group_commit::run(&env, args),
            Scenario::WtFlushWait => scenarios::wt_flush_wait(&env),
            Scenario::JbdLoneWriter => scenarios::jbd_lone_writer(&env),
            Scenario::PgRecycle => scenarios::pg_recycle(&env),
            Scenario::XfsFlushFlags => scenarios::xfs_flush_flags(&env),
            Scenario::Alignment => scenarios::alignment(&env),
            Scenario::Async => async_tasks::async_tasks(&env),
            Scenario::Replay => replay::replay(&env, args),
            Scenario::Reads => reads::reads(&env, args.log_mib),
            #[cfg(feature = "peers")]
            Scenario::Peers => peers::peers(&env, args.plot.as_deref()),
            #[cfg(not(feature = "peers"))]
            Scenario::Peers => {
                Err("built without the peers feature: run `cargo xtask bench-peers`".into())
            }
            Scenario::All => unreachable!("expanded above"),
        };
        env.progress.set_message("");
        results.push(r.map_err(|e| format!("{}: {e}", scenario.name()))?);
    }
    env.progress.finish_and_clear();
    let doc = match results.pop() {
        Some(only) if results.is_empty() => only,
        Some(last) => {
            results.push(last);
            json!({ "scenarios": results })
        }
        None => json!({ "scenarios": [] }),
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&doc).map_err(err)? + "\n";
        write_file(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The options every bench journal starts from.
pub fn bench_options(env: &Env) -> Options {
    Options {
        segment_size: if env.smoke { 1 << 20 } else { 16 << 20 },
        direct_io: env.direct_io,
        commits_in_flight: env.commits_in_flight,
        ..Options::default()
    }
}

/// A JSON description of journal options.
pub fn options_json(o: &Options) -> Json {
    json!({"segment_size": o.segment_size, "logbufs": o.logbufs, "logbsize": o.logbsize, "alignment": o.alignment, "sync_method": format!("{:?}", o.sync_method), "batch_policy": format!("{:?}", o.batch_policy), "max_batch_us": o.max_batch.as_micros() as u64, "flush_policy": format!("{:?}", o.flush_policy), "commits_in_flight": o.commits_in_flight, "recycle_policy": format!("{:?}", o.recycle_policy), "prealloc": format!("{:?}", o.prealloc), "direct_io": o.direct_io, "write_ahead": o.write_ahead})
}

/// The unmeasured warm-up before a point of `seconds`: a fifth of it, at
/// most one second.
pub fn warmup_seconds(seconds: f64) -> f64 {
    (seconds / 5.0).min(1.0)
}

/// Stringifies an I/O or journal error for the bench's error path.
pub fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}
