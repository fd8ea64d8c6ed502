//! The benchmark harness of the workspace: what `journal bench`,
//! `kvstore bench` and `metafs bench` share, so that a figure means the
//! same thing in each.
//!
//! - [`closed_loop`]: `clients` threads, each calling an operation in a
//!   loop until a deadline, every call's latency in an HDR histogram
//!   ([`Clients`]). A closed loop: a client issues its next operation when
//!   the last returns, so the load adapts to the system (as the peers'
//!   benches and fs_mark do).
//! - [`median`], [`table`], [`progress_bar`], [`write_file`]: the medians
//!   of interleaved rounds, the printed table, the progress bar on
//!   stderr, the `--json` output (through `journal_core::vfs`, like every
//!   file access of the workspace).
//!
//! - [`hostile_campaign`]: the loop of the prototypes' hostile-input
//!   campaigns — a fixed number of cases in `cargo test`, a time budget
//!   under `cargo xtask fuzz` — each case on a thread of its own under a
//!   watchdog, so that a panic or a hang fails the campaign by name.
//!
//! Nothing here asserts a timing: benches report, tests never time.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use journal_core::sync::atomic::{AtomicBool, Ordering};
use journal_core::vfs::{OpenOptions, OsVfs, Vfs};
use std::fmt::Display;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A latency histogram in µs, 1 µs to 100 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, 100_000_000, 3) {
        Ok(h) => h,
        // The bounds are constants that hdrhistogram accepts (low ≥ 1,
        // high ≥ 2 × low, 3 significant figures).
        Err(e) => unreachable!("constant histogram bounds: {e}"),
    }
}

/// Microseconds of `d`, at least 1 (a histogram's lowest value).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// What a closed loop did.
#[derive(Debug, Clone)]
pub struct Clients {
    /// Operations completed, all clients.
    pub ops: u64,
    /// Operations completed by each client.
    pub per_client: Vec<u64>,
    /// Wall time.
    pub elapsed: Duration,
    /// Every operation's latency, µs.
    pub latency: Histogram<u64>,
}

impl Clients {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// A latency quantile, µs.
    pub fn q(&self, q: f64) -> u64 {
        self.latency.value_at_quantile(q)
    }

    /// Adds another run of the same load (its time, its operations).
    pub fn absorb(&mut self, other: Clients) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        for (mine, theirs) in self.per_client.iter_mut().zip(&other.per_client) {
            *mine += theirs;
        }
        // Both histograms have the same bounds: adding cannot fail.
        let _ = self.latency.add(&other.latency);
    }
}

/// One client's operation: `op(client, n)` is client `client`'s `n`th.
pub type Op<E> = dyn Fn(usize, u64) -> Result<(), E> + Send + Sync;

/// Runs `clients` threads calling `op` in a loop for `seconds`; the first
/// error any client meets stops every client and ends the run with that
/// error (as a string, with the client's number).
pub fn closed_loop<E: Display + Send + 'static>(
    clients: usize,
    seconds: f64,
    op: Arc<Op<E>>,
) -> Result<Clients, String> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds.max(0.0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::with_capacity(clients);
    for c in 0..clients {
        let (op, stop) = (op.clone(), stop.clone());
        let t = std::thread::Builder::new()
            .name(format!("client-{c}"))
            .spawn(move || -> Result<(u64, Histogram<u64>), String> {
                let mut h = histogram();
                let mut n = 0u64;
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if let Err(e) = op(c, n) {
                        stop.store(true, Ordering::Relaxed);
                        return Err(format!("client {c}: {e}"));
                    }
                    h.saturating_record(micros(t.elapsed()));
                    n += 1;
                }
                Ok((n, h))
            })
            .map_err(|e| format!("cannot start client {c}: {e}"))?;
        threads.push(t);
    }
    let mut latency = histogram();
    let (mut ops, mut per_client, mut first_error) = (0, Vec::new(), None);
    // Join every client, even after one failed: none is left running.
    for t in threads {
        match t.join() {
            Ok(Ok((n, h))) => {
                ops += n;
                per_client.push(n);
                let _ = latency.add(&h);
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
                per_client.push(0);
            }
            Err(_) => {
                first_error.get_or_insert_with(|| "a client panicked".to_string());
                per_client.push(0);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(Clients {
            ops,
            per_client,
            elapsed: start.elapsed(),
            latency,
        }),
    }
}

/// What a [`hostile_campaign`] did.
#[derive(Debug, Clone, Copy)]
pub struct Campaign {
    /// Cases run.
    pub cases: u64,
    /// Cases whose run returned `true` (opened and exercised; the others
    /// were refused with a typed error).
    pub accepted: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Runs hostile-input cases: `cases` of them, or, when the environment
/// variable `JOURNAL_FUZZ_SECONDS` holds a number (`cargo xtask fuzz`), as
/// many as fit in that many seconds. `make(n)` builds case `n` (the
/// hostile input, from the caller's seeded generator) and returns what
/// runs it; each run goes on a thread of its own. Panics, naming the case
/// and `what` ("a hostile page made the store"), if a run panics or has
/// not returned within 60 s.
pub fn hostile_campaign<F>(what: &str, cases: u64, mut make: impl FnMut(u64) -> F) -> Campaign
where
    F: FnOnce() -> bool + Send + 'static,
{
    let budget: Option<f64> = std::env::var("JOURNAL_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let start = Instant::now();
    let (mut n, mut accepted) = (0u64, 0u64);
    while match budget {
        Some(b) => start.elapsed().as_secs_f64() < b,
        None => n < cases,
    } {
        let run = make(n);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)));
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(a)) => accepted += u64::from(a),
            Ok(Err(_)) => panic!("case {n}: {what} panic"),
            Err(_) => panic!("case {n}: {what} hang"),
        }
        n += 1;
    }
    Campaign {
        cases: n,
        accepted,
        elapsed: start.elapsed(),
    }
}

/// The median of `v` (the upper one of an even count); 0 for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Prints a table: a header row and rows of cells, right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            } else {
                widths.push(c.chars().count());
            }
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:>w$}", w = widths[i]))
            .collect();
        println!("{}", parts.join("  "));
    };
    line(&header.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    for r in rows {
        line(r);
    }
}

/// A progress bar on stderr (hidden with `quiet`, or when stderr is not a
/// terminal), ticking on its own.
pub fn progress_bar(quiet: bool) -> ProgressBar {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(None, target);
    if let Ok(style) =
        ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Writes `text` to `path`, replacing it (through the VFS, like every file
/// access of the workspace).
pub fn write_file(path: &Path, text: &str) -> Result<(), String> {
    let vfs = OsVfs::new();
    let write = || -> journal_core::vfs::Result<()> {
        let f = vfs.open(path, OpenOptions::create())?;
        f.set_len(0)?;
        f.write_at(text.as_bytes(), 0)?;
        Ok(())
    };
    write().map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads a small file: a `/proc` or `/sys` one, whose length says 0 (at
/// most about 1 MiB of it).
pub fn read_small(path: &Path) -> Result<String, String> {
    let vfs = OsVfs::new();
    let f = vfs
        .open(path, OpenOptions::read())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = f
            .read_at(&mut buf, out.len() as u64)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 || out.len() > 1 << 20 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The block device's `stat` file for the filesystem holding `dir`, found
/// in `/proc/self/mountinfo` (the longest mount point above it); the whole
/// disk's when that is a partition. `None` where there is none (a tmpfs,
/// an overlay).
pub fn device_stat(dir: &Path) -> Option<std::path::PathBuf> {
    let info = read_small(Path::new("/proc/self/mountinfo")).ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(dev), Some(mnt)) = (f.get(2), f.get(4)) else {
            continue;
        };
        if dir.starts_with(mnt) && best.as_ref().is_none_or(|(l, _)| mnt.len() > *l) {
            best = Some((mnt.len(), dev.to_string()));
        }
    }
    let sys = Path::new("/sys/dev/block").join(best?.1);
    let vfs = OsVfs::new();
    if vfs.exists(&sys.join("partition")).unwrap_or(false) {
        Some(sys.join("..").join("stat"))
    } else {
        Some(sys.join("stat"))
    }
}

/// Field `i` (from 0) of a block device's `stat` file: 6 is sectors
/// written (of 512 bytes), 15 flush requests completed. 0 if unreadable.
pub fn device_counter(stat: Option<&Path>, i: usize) -> f64 {
    stat.and_then(|p| read_small(p).ok())
        .and_then(|s| s.split_whitespace().nth(i).and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// Writes `doc` to `path` as pretty JSON (a benchmark's `--json FILE`).
pub fn write_json(path: &Path, doc: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())? + "\n";
    write_file(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal_core::sync::atomic::AtomicU64;

    #[test]
    fn a_campaign_counts_its_cases_and_what_they_accepted() {
        let run = hostile_campaign("a case made the test", 10, |n| move || n % 3 == 0);
        assert_eq!((run.cases, run.accepted), (10, 4));
    }

    #[test]
    #[should_panic(expected = "case 4: a case made the test panic")]
    fn a_panicking_case_fails_the_campaign_by_name() {
        hostile_campaign("a case made the test", 10, |n| {
            move || {
                assert_ne!(n, 4, "case 4 breaks");
                true
            }
        });
    }

    #[test]
    fn a_closed_loop_counts_every_operation_of_every_client() {
        let calls = Arc::new(AtomicU64::new(0));
        let c2 = calls.clone();
        let op: Arc<Op<String>> = Arc::new(move |_, _| {
            c2.fetch_add(1, Ordering::Relaxed);
            Ok(())
        });
        let r = closed_loop(3, 0.05, op).unwrap();
        assert_eq!(r.per_client.len(), 3);
        assert_eq!(r.ops, calls.load(Ordering::Relaxed));
        assert_eq!(r.ops, r.per_client.iter().sum::<u64>());
        assert_eq!(r.latency.len(), r.ops);
    }

    #[test]
    fn a_failing_client_ends_the_run_with_its_error() {
        let op: Arc<Op<String>> = Arc::new(|c, n| {
            if c == 1 && n == 3 {
                Err("boom".into())
            } else {
                Ok(())
            }
        });
        let e = closed_loop(2, 5.0, op).unwrap_err();
        assert_eq!(e, "client 1: boom");
    }

    #[test]
    fn medians_take_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(vec![]), 0.0);
    }
}
