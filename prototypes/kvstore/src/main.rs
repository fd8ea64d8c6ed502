//! The `kvstore` command: get, put, del, scan, check, bench.
//!
//! Exit codes: 0 success (`get`: found); 1 `get` found nothing, `check`
//! found problems, or a bench failed; 2 a usage error or a store that
//! cannot be opened.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use journal_core::vfs::{OpenOptions, OsVfs, Vfs};
use journal_core::Journal;
use kvstore::{bench_value, Options, Store};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An embedded key-value store on the journal.
#[derive(Debug, Parser)]
#[command(name = "kvstore", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the value of KEY (exit 1 if absent).
    Get {
        /// The store directory.
        dir: PathBuf,
        /// The key.
        key: String,
    },
    /// Set KEY to VALUE, durably.
    Put {
        /// The store directory (created if missing).
        dir: PathBuf,
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// Delete KEY, durably.
    Del {
        /// The store directory.
        dir: PathBuf,
        /// The key.
        key: String,
    },
    /// Print the entries with keys in [FROM, TO), one "key<TAB>value" per
    /// line.
    Scan {
        /// The store directory.
        dir: PathBuf,
        /// The first key [default: the first].
        #[arg(long)]
        from: Option<String>,
        /// The key after the last [default: none].
        #[arg(long)]
        to: Option<String>,
    },
    /// Check every page's CRC, every chain, every key reachable once (exit
    /// 0: sound, 1: one line per problem).
    Check {
        /// The store directory.
        dir: PathBuf,
    },
    /// Closed-loop clients, one put per durable transaction, beside the
    /// bare journal's group commit with records of the same size; then a
    /// read phase.
    Bench(BenchArgs),
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Where to create the bench stores (a fresh directory inside DIR).
    dir: PathBuf,
    /// Client counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16, 64])]
    clients: Vec<usize>,
    /// Seconds per point [default: 3, or 0.3 with --smoke].
    #[arg(long)]
    seconds: Option<f64>,
    /// Value size, bytes.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Tiny runs that only prove every path works.
    #[arg(long)]
    smoke: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Write into DIR itself (no fresh directory, no comparison, no read
    /// phase) and print "CLIENT SEQ" for every committed put, at once: for
    /// crash tests that kill the process.
    #[arg(long, hide = true)]
    print_commits: bool,
    /// Run only the store's points (no bare-journal comparison), for
    /// profiling one side.
    #[arg(long, hide = true)]
    store_only: bool,
}

fn open(dir: &Path, create: bool) -> Result<Store, kvstore::Error> {
    Store::open(
        dir,
        Options {
            create_if_missing: create,
            ..Options::default()
        },
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Get { dir, key } => open(&dir, false).and_then(|s| {
            Ok(match s.get(key.as_bytes())? {
                Some(v) => {
                    println!("{}", String::from_utf8_lossy(&v));
                    0
                }
                None => 1,
            })
        }),
        Command::Put { dir, key, value } => open(&dir, true).and_then(|s| {
            s.put(key.as_bytes(), value.as_bytes())?;
            s.close()?;
            Ok(0)
        }),
        Command::Del { dir, key } => open(&dir, false).and_then(|s| {
            s.delete(key.as_bytes())?;
            s.close()?;
            Ok(0)
        }),
        Command::Scan { dir, from, to } => open(&dir, false).and_then(|s| {
            let from = from.map(String::into_bytes).unwrap_or_default();
            let entries = match to {
                Some(to) => s.scan(from..to.into_bytes())?,
                None => s.scan(from..)?,
            };
            for (k, v) in entries {
                println!("{}\t{}", String::from_utf8_lossy(&k), String::from_utf8_lossy(&v));
            }
            Ok(0)
        }),
        Command::Check { dir } => open(&dir, false).and_then(|s| {
            let problems = s.check()?;
            for p in &problems {
                println!("{p}");
            }
            let info = s.recovery_info();
            eprintln!(
                "{}: {} problems; recovery replayed {} operations, restored {} buckets from the log",
                dir.display(),
                problems.len(),
                info.ops_applied,
                info.images_restored
            );
            s.close()?;
            Ok(if problems.is_empty() { 0 } else { 1 })
        }),
        Command::Bench(args) => match bench(&args) {
            Ok(()) => Ok(0),
            Err(e) => {
                eprintln!("kvstore bench: {e}");
                return ExitCode::from(1);
            }
        },
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("kvstore: {e}");
            ExitCode::from(2)
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid bounds")
}

struct Point {
    commits: u64,
    /// Operations per client.
    per_client: Vec<u64>,
    secs: f64,
    latency: Histogram<u64>,
}

impl Point {
    fn rate(&self) -> f64 {
        self.commits as f64 / self.secs
    }
}

/// `clients` threads running `op(client, seq)` in a loop for `seconds`.
fn closed_loop(
    clients: usize,
    seconds: f64,
    op: Arc<dyn Fn(usize, u64) -> Result<(), String> + Send + Sync>,
) -> Result<Point, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (op, stop) = (op.clone(), stop.clone());
            std::thread::spawn(move || -> Result<(u64, Histogram<u64>), String> {
                let mut h = histogram();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    op(c, n)?;
                    h.record((t.elapsed().as_micros() as u64).max(1)).ok();
                    n += 1;
                }
                Ok((n, h))
            })
        })
        .collect();
    // The driver waits out the point (the clients never wait on it).
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latency = histogram();
    let mut commits = 0;
    let mut per_client = Vec::new();
    for t in threads {
        let (n, h) = t.join().map_err(|_| "a client panicked".to_string())??;
        commits += n;
        per_client.push(n);
        latency.add(&h).ok();
    }
    Ok(Point {
        commits,
        per_client,
        secs: start.elapsed().as_secs_f64(),
        latency,
    })
}

fn key(c: usize, n: u64) -> Vec<u8> {
    format!("c{c:03}-{n:010}").into_bytes()
}

fn bench(args: &BenchArgs) -> Result<(), String> {
    let err = |e: kvstore::Error| e.to_string();
    let seconds = args.seconds.unwrap_or(if args.smoke { 0.3 } else { 3.0 });
    let size = args.value_size;
    if args.print_commits {
        let store = Arc::new(open(&args.dir, true).map_err(err)?);
        let s = store.clone();
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let op: Arc<dyn Fn(usize, u64) -> Result<(), String> + Send + Sync> =
            Arc::new(move |c, n| {
                let k = key(c, n);
                s.put(&k, &bench_value(&k, size)).map_err(err)?;
                let mut o = out.lock().expect("stdout");
                writeln!(o, "{c} {n}")
                    .and_then(|_| o.flush())
                    .map_err(|e| e.to_string())
            });
        closed_loop(args.clients[0], seconds, op)?;
        store.close().map_err(err)?;
        return Ok(());
    }
    OsVfs::new()
        .create_dir_all(&args.dir)
        .map_err(|e| e.to_string())?;
    let root = tempfile::Builder::new()
        .prefix("kvstore-bench")
        .tempdir_in(&args.dir)
        .map_err(|e| e.to_string())?;
    let bar = if args.quiet {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
    } else {
        ProgressBar::new(args.clients.len() as u64 * 2 * if args.smoke { 1 } else { 3 })
    };
    bar.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
            .expect("a valid template"),
    );
    let mut rows = Vec::new();
    let mut points = Vec::new();
    let mut last_store = None;
    let rounds = if args.smoke || args.store_only { 1 } else { 3 };
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    for (i, &clients) in args.clients.iter().enumerate() {
        // Rounds alternate the bare journal and the store, each on a fresh
        // directory; medians over the rounds.
        let (mut jr, mut sr, mut s50, mut s99, mut j50) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut groups, mut jgroups) = (vec![], vec![]);
        for round in 0..rounds {
            // The bare journal: one append_durable per commit of a record of
            // the store's size, with the same client work (key, value).
            bar.set_message(format!("journal, {clients} clients, round {}", round + 1));
            let jdir = root.path().join(format!("journal-{i}-{round}"));
            let journal = Arc::new(
                Journal::open(&jdir, Options::default().journal).map_err(|e| e.to_string())?,
            );
            let j = journal.clone();
            let journal_seconds = if args.store_only { 0.05 } else { seconds };
            let jp = closed_loop(
                clients,
                journal_seconds,
                Arc::new(move |c, n| {
                    let k = key(c, n);
                    let mut record = Vec::with_capacity(25 + k.len() + size);
                    record.extend_from_slice(&[0x5A; 25]);
                    record.extend_from_slice(&k);
                    record.extend_from_slice(&bench_value(&k, size));
                    j.append_durable(&record)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }),
            )?;
            jgroups.push(journal.metrics().avg_group_size);
            journal.close().map_err(|e| e.to_string())?;
            drop(journal);
            bar.inc(1);
            // The store.
            bar.set_message(format!("store, {clients} clients, round {}", round + 1));
            let store =
                Arc::new(open(&root.path().join(format!("store-{i}-{round}")), true).map_err(err)?);
            let s = store.clone();
            let sp = closed_loop(
                clients,
                seconds,
                Arc::new(move |c, n| {
                    let k = key(c, n);
                    s.put(&k, &bench_value(&k, size)).map(|_| ()).map_err(err)
                }),
            )?;
            bar.inc(1);
            groups.push(store.journal().metrics().avg_group_size);
            jr.push(jp.rate());
            sr.push(sp.rate());
            j50.push(jp.latency.value_at_quantile(0.5) as f64);
            s50.push(sp.latency.value_at_quantile(0.5) as f64);
            s99.push(sp.latency.value_at_quantile(0.99) as f64);
            if let Some((old, _)) = last_store.replace((store, sp.per_client)) {
                old.close().map_err(err)?;
            }
        }
        let (jrate, srate) = (median(jr), median(sr));
        let overhead = 1.0 - srate / jrate;
        let (p50, p99) = (median(s50), median(s99));
        rows.push(format!(
            "{clients:>7} {srate:>10.0} {p50:>8.0} {p99:>8.0} {jrate:>12.0} {:>9.1}%",
            overhead * 100.0
        ));
        points.push(json!({
            "clients": clients,
            "value_size": size,
            "rounds": rounds,
            "commits_per_s": srate,
            "p50_us": p50,
            "p99_us": p99,
            "journal_commits_per_s": jrate,
            "journal_p50_us": median(j50),
            "overhead": overhead,
            "avg_group_size": median(groups),
            "journal_avg_group_size": median(jgroups),
        }));
    }
    bar.finish_and_clear();
    println!(
        "kvstore: one put ({size}-byte value) per durable transaction, {seconds} s per point, medians of {rounds} rounds"
    );
    println!(
        "{:>7} {:>10} {:>8} {:>8} {:>12} {:>10}",
        "clients", "commits/s", "p50 µs", "p99 µs", "journal c/s", "overhead"
    );
    for r in &rows {
        println!("{r}");
    }
    // The read phase: gets of keys the last point wrote.
    let mut reads = json!(null);
    if let Some((store, written)) = last_store.filter(|_| !args.store_only) {
        let clients = written.len();
        let s = store.clone();
        let rp = closed_loop(
            clients,
            seconds,
            Arc::new(move |c, n| {
                // Every key this client's writer committed is there.
                let k = key(c, n % written[c].max(1));
                match s.get(&k).map_err(err)? {
                    Some(v) if v == bench_value(&k, size) => Ok(()),
                    Some(_) => Err(format!("wrong value for {}", String::from_utf8_lossy(&k))),
                    None if written[c] == 0 => Ok(()),
                    None => Err(format!("{} lost", String::from_utf8_lossy(&k))),
                }
            }),
        )?;
        println!(
            "reads: {clients} clients, {:.0} gets/s, p50 {} µs, p99 {} µs",
            rp.rate(),
            rp.latency.value_at_quantile(0.5),
            rp.latency.value_at_quantile(0.99)
        );
        reads = json!({"clients": clients, "gets_per_s": rp.rate(),
                       "p50_us": rp.latency.value_at_quantile(0.5),
                       "p99_us": rp.latency.value_at_quantile(0.99)});
        store.close().map_err(err)?;
    }
    if let Some(path) = &args.json {
        let doc = json!({"bench": "kvstore", "points": points, "reads": reads});
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n";
        let vfs = OsVfs::new();
        let f = vfs
            .open(path, OpenOptions::create())
            .map_err(|e| e.to_string())?;
        f.set_len(0).map_err(|e| e.to_string())?;
        f.write_at(text.as_bytes(), 0).map_err(|e| e.to_string())?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
