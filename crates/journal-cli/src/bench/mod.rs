//! `journal bench`: the group-commit benchmark and one A/B scenario per seed.
//!
//! Everything runs on a temporary directory of the local disk (or `--dir`),
//! except `wt-flush-wait`, which needs a slow device and models one on
//! SimVfs with injected latency. Results are printed as a table and, with
//! `--json FILE`, written as JSON; ratios are computed within one run.

mod group_commit;
pub mod json;
mod scenarios;
pub mod svg;

use crate::args::Args;
use hdrhistogram::Histogram;
use journal_core::{Journal, Options};
use journal_vfs::{OpenOptions, OsVfs, Prealloc, TempDir, Vfs};
use json::Json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Scenario names, in the order `all` runs them.
pub const SCENARIOS: &[&str] = &[
    "group-commit",
    "wt-flush-wait",
    "jbd-lone-writer",
    "pg-recycle",
    "xfs-flush-flags",
    "alignment",
];

/// Where and how long the bench runs.
pub struct Env {
    /// The directory journals are created in (removed at the end unless
    /// given with `--dir`).
    root: PathBuf,
    _tmp: Option<TempDir>,
    /// Seconds per measured point.
    pub seconds: f64,
    /// Tiny runs that only prove every path works (CI).
    pub smoke: bool,
    counter: AtomicU64,
    progress: Progress,
}

impl Env {
    /// A fresh, empty directory for one journal or probe.
    pub fn fresh_dir(&self, name: &str) -> PathBuf {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.root.join(format!("{n:03}-{name}"))
    }

    /// Removes a directory made by [`Env::fresh_dir`] (bench data only).
    pub fn discard(&self, dir: &Path) {
        let vfs = OsVfs::new();
        if let Ok(names) = vfs.read_dir(dir) {
            for n in names {
                let _ = vfs.remove_file(&dir.join(n));
            }
        }
        let _ = vfs.remove_dir(dir);
    }

    /// Reports progress on stderr.
    pub fn progress(&self, msg: &str) {
        self.progress.say(msg);
    }

    /// Reports progress with a bar: `done` of `total` steps finished.
    pub fn progress_bar(&self, done: usize, total: usize, msg: &str) {
        const WIDTH: usize = 20;
        let filled = WIDTH * done.min(total) / total.max(1);
        let bar = format!(
            "[{}{}] {done}/{total}",
            "#".repeat(filled),
            ".".repeat(WIDTH - filled)
        );
        self.progress.say(&format!("{bar} {msg}"));
    }
}

struct Progress {
    tty: bool,
    start: Instant,
}

impl Progress {
    fn say(&self, msg: &str) {
        let t = self.start.elapsed().as_secs_f64();
        if self.tty {
            eprint!("\r\x1b[2K[{t:6.1}s] {msg}");
        } else {
            eprintln!("[{t:6.1}s] {msg}");
        }
    }
    fn done(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// A latency histogram in microseconds (1 µs to 100 s, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

/// Microseconds of `d`, at least 1.
pub fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

/// The median latency of a bare aligned write of `bytes` plus `fdatasync`,
/// on the filesystem of `dir`: the device's own cost of one group commit.
pub fn device_latency(
    env: &Env,
    bytes: usize,
    alignment: u64,
    samples: usize,
) -> journal_vfs::Result<Duration> {
    let vfs = OsVfs::new();
    let dir = env.fresh_dir("device-probe");
    vfs.create_dir_all(&dir)?;
    let path = dir.join("probe");
    let size = alignment_up((bytes as u64).max(4096), alignment) as usize;
    let span = (size as u64 * 64).max(4 << 20);
    let f = vfs.open(&path, OpenOptions::create_new())?;
    f.preallocate(0, span, Prealloc::ZeroFill)?;
    f.sync_all()?;
    let buf = vec![0x5Au8; alignment_up(bytes as u64, alignment) as usize];
    let mut h = histogram();
    for i in 0..samples {
        let off = (i as u64 * buf.len() as u64) % (span - buf.len() as u64);
        let t = Instant::now();
        f.write_at(&buf, off)?;
        f.sync_data()?;
        h.record(micros(t.elapsed())).ok();
    }
    drop(f);
    env.discard(&dir);
    Ok(Duration::from_micros(h.value_at_quantile(0.5)))
}

fn alignment_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a.max(1)) * a.max(1)
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
}

impl Load {
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
    let op: Arc<Op> = Arc::new(op);
    run_clients(journal, clients, (seconds / 5.0).min(1.0), op.clone())?;
    run_clients(journal, clients, seconds, op)
}

fn run_clients(
    journal: &Arc<Journal>,
    clients: usize,
    seconds: f64,
    op: Arc<Op>,
) -> journal_core::Result<Load> {
    let m0 = journal.metrics();
    let v0 = journal.vfs().counters();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (j, op) = (journal.clone(), op.clone());
            std::thread::spawn(move || -> journal_core::Result<(u64, Histogram<u64>)> {
                let mut h = histogram();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    op(&j, c, n)?;
                    h.record(micros(t.elapsed())).ok();
                    n += 1;
                }
                Ok((n, h))
            })
        })
        .collect();
    let mut latency = histogram();
    let mut commits = 0;
    for t in threads {
        let (n, h) = t.join().expect("client thread panicked")?;
        commits += n;
        latency.add(&h).ok();
    }
    let elapsed = start.elapsed();
    let m1 = journal.metrics();
    let v1 = journal.vfs().counters();
    Ok(Load {
        commits,
        elapsed,
        latency,
        groups: m1.groups - m0.groups,
        syncs: v1.since(&v0).syncs(),
        waits_taken: m1.batch_waits_taken - m0.batch_waits_taken,
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
    Ok((Arc::new(j), dir))
}

/// Writes `text` to `path` (through the VFS, like every file access).
pub fn write_file(path: &Path, text: &str) -> journal_vfs::Result<()> {
    let vfs = OsVfs::new();
    let f = vfs.open(path, OpenOptions::create())?;
    f.set_len(0)?;
    f.write_at(text.as_bytes(), 0)?;
    Ok(())
}

/// Prints a table: a header row and rows of cells, right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:>w$}", w = widths[i]))
            .collect();
        println!("{}", parts.join("  "));
    };
    line(header.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

/// `journal bench`.
pub fn run(args: &Args) -> Result<(), String> {
    args.only(&[
        "scenario",
        "seconds",
        "clients",
        "record-size",
        "dir",
        "json",
        "plot",
        "smoke",
        "quiet",
        "batch-policy",
    ])?;
    let smoke = args.flag("smoke");
    let scenario = args.value("scenario").unwrap_or("group-commit");
    let names: Vec<&str> = if scenario == "all" {
        SCENARIOS.to_vec()
    } else if SCENARIOS.contains(&scenario) {
        vec![scenario]
    } else {
        return Err(format!(
            "unknown scenario {scenario:?} (one of: {}, all)",
            SCENARIOS.join(", ")
        ));
    };
    let seconds: f64 = args.parsed("seconds", if smoke { 0.2 } else { 3.0 })?;
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err("--seconds must be positive".into());
    }
    let (root, tmp) = match args.value("dir") {
        Some(d) => {
            let root = PathBuf::from(d);
            OsVfs::new()
                .create_dir_all(&root)
                .map_err(|e| e.to_string())?;
            let t = TempDir::new_in(&root, "journal-bench").map_err(|e| format!("{d}: {e}"))?;
            (t.path().to_path_buf(), Some(t))
        }
        None => {
            let t =
                TempDir::new("journal-bench").map_err(|e| format!("temporary directory: {e}"))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let env = Env {
        root,
        _tmp: tmp,
        seconds,
        smoke,
        counter: AtomicU64::new(0),
        progress: Progress {
            tty: std::io::stderr().is_terminal() && !args.flag("quiet"),
            start: Instant::now(),
        },
    };
    eprintln!(
        "journal bench: {} in {} ({} s per point{})",
        names.join(", "),
        env.root.display(),
        seconds,
        if smoke { ", smoke mode" } else { "" }
    );
    let mut results = Vec::new();
    for name in &names {
        let r = match *name {
            "group-commit" => group_commit::run(&env, args),
            "wt-flush-wait" => scenarios::wt_flush_wait(&env),
            "jbd-lone-writer" => scenarios::jbd_lone_writer(&env),
            "pg-recycle" => scenarios::pg_recycle(&env),
            "xfs-flush-flags" => scenarios::xfs_flush_flags(&env),
            "alignment" => scenarios::alignment(&env),
            _ => unreachable!(),
        };
        env.progress.done();
        results.push(r.map_err(|e| format!("{name}: {e}"))?);
    }
    let doc = if results.len() == 1 {
        results.pop().unwrap()
    } else {
        Json::obj().with("scenarios", results)
    };
    if let Some(path) = args.value("json") {
        write_file(Path::new(path), &doc.render()).map_err(|e| format!("{path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    Ok(())
}

/// The options every bench journal starts from.
pub fn bench_options(env: &Env) -> Options {
    Options {
        segment_size: if env.smoke { 1 << 20 } else { 16 << 20 },
        ..Options::default()
    }
}

/// A JSON description of journal options.
pub fn options_json(o: &Options) -> Json {
    Json::obj()
        .with("segment_size", o.segment_size)
        .with("logbufs", o.logbufs)
        .with("logbsize", o.logbsize)
        .with("alignment", o.alignment)
        .with("sync_method", format!("{:?}", o.sync_method))
        .with("batch_policy", format!("{:?}", o.batch_policy))
        .with("max_batch_us", o.max_batch.as_micros() as u64)
        .with("flush_policy", format!("{:?}", o.flush_policy))
        .with("recycle_policy", format!("{:?}", o.recycle_policy))
        .with("prealloc", format!("{:?}", o.prealloc))
}

/// Stringifies an I/O or journal error for the bench's error path.
pub fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}
