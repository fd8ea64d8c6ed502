//! The `kvstore` command: get, put, del, scan, check, bench, compare.
//!
//! Exit codes: 0 success (`get`: found); 1 `get` found nothing, `check`
//! found problems, or a bench failed; 2 a usage error or a store that
//! cannot be opened.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod compare;

use bench_harness::{closed_loop, median, progress_bar, table, write_json, Clients, Op};
use clap::{Parser, Subcommand};
use indicatif::ProgressBar;
use journal_core::vfs::{OsVfs, Vfs};
use journal_core::Journal;
use kvstore::{bench_value, Options, Store};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

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
    /// Walk the tree and the free list: every page reachable once, keys in
    /// order within their separators, leaves at one depth, overflow chains
    /// whole, no page lost (exit 0: sound, 1: one line per problem). Reads
    /// the store as recovery finds it; writes nothing home (no checkpoint).
    Check {
        /// The store directory.
        dir: PathBuf,
    },
    /// Closed-loop clients, one put per durable transaction, beside the
    /// bare journal's group commit with records of the same size; then a
    /// read phase.
    Bench(BenchArgs),
    /// At a real size: load N keys, then durable random overwrites, gets
    /// and range scans — kvstore beside fjall and redb (feature `peers`),
    /// each in its own process.
    Compare(compare::ScaleArgs),
    /// One engine's run of `compare`, in this process (prints JSON).
    #[command(hide = true)]
    Engine {
        /// kvstore, fjall or redb.
        engine: String,
        #[command(flatten)]
        args: compare::ScaleArgs,
    },
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
                Some(to) => s.range(from..to.into_bytes())?,
                None => s.range(from..)?,
            };
            // Streamed from one snapshot: the store's size does not matter.
            let mut out = std::io::stdout().lock();
            for e in entries {
                let (k, v) = e?;
                let line = format!("{}\t{}", String::from_utf8_lossy(&k), String::from_utf8_lossy(&v));
                if writeln!(out, "{line}").is_err() {
                    break;
                }
            }
            Ok(0)
        }),
        // Read-only: no checkpoint before or after the walk; what the log
        // holds stays in the log.
        Command::Check { dir } => Store::open(
            &dir,
            Options {
                create_if_missing: false,
                read_only: true,
                ..Options::default()
            },
        )
        .and_then(|s| {
            let problems = s.check()?;
            for p in &problems {
                println!("{p}");
            }
            let info = s.recovery_info();
            eprintln!(
                "{}: {} problems; recovery replayed {} page operations and restored {} page images from the log",
                dir.display(),
                problems.len(),
                info.ops_applied,
                info.images_restored
            );
            s.close()?;
            Ok(if problems.is_empty() { 0 } else { 1 })
        }),
        Command::Compare(args) => match compare::compare(&args) {
            Ok(()) => Ok(0),
            Err(e) => {
                eprintln!("kvstore compare: {e}");
                return ExitCode::from(1);
            }
        },
        Command::Engine { engine, args } => match compare::engine(&engine, &args) {
            Ok(()) => Ok(0),
            Err(e) => {
                eprintln!("kvstore engine {engine}: {e}");
                return ExitCode::from(1);
            }
        },
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

fn key(c: usize, n: u64) -> Vec<u8> {
    format!("c{c:03}-{n:010}").into_bytes()
}

/// One store operation of client `c`, its `n`th.
type ClientOp = Arc<Op<String>>;

fn err(e: kvstore::Error) -> String {
    e.to_string()
}

fn bench(args: &BenchArgs) -> Result<(), String> {
    let seconds = args.seconds.unwrap_or(if args.smoke { 0.3 } else { 3.0 });
    if args.print_commits {
        return print_commits(args, seconds);
    }
    OsVfs::new()
        .create_dir_all(&args.dir)
        .map_err(|e| e.to_string())?;
    let root = tempfile::Builder::new()
        .prefix("kvstore-bench")
        .tempdir_in(&args.dir)
        .map_err(|e| e.to_string())?;
    let rounds = if args.smoke || args.store_only { 1 } else { 3 };
    let bar = progress_bar(args.quiet);
    bar.set_length(args.clients.len() as u64 * 2 * rounds as u64);
    let (mut rows, mut points, mut last_store) = (Vec::new(), Vec::new(), None);
    for (i, &clients) in args.clients.iter().enumerate() {
        let p = bench_point(args, root.path(), &bar, i, clients, rounds, seconds)?;
        rows.push(p.row);
        points.push(p.json);
        if let Some((old, _)) = last_store.replace(p.last_store) {
            old.close().map_err(err)?;
        }
    }
    bar.finish_and_clear();
    println!(
        "kvstore: one put ({}-byte value) per durable transaction, {seconds} s per point, medians of {rounds} rounds",
        args.value_size
    );
    table(
        &[
            "clients",
            "commits/s",
            "p50 µs",
            "p99 µs",
            "CPU µs",
            "journal c/s",
            "journal CPU µs",
            "overhead",
        ],
        &rows,
    );
    let mut reads = json!(null);
    if let Some((store, written)) = last_store {
        if !args.store_only {
            reads = read_phase(&store, written, seconds, args.value_size)?;
        }
        store.close().map_err(err)?;
    }
    if let Some(path) = &args.json {
        write_json(
            path,
            &json!({"bench": "kvstore", "points": points, "reads": reads}),
        )?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `--print-commits`: one client's acknowledged puts printed as they
/// return (the kill -9 test reads them).
fn print_commits(args: &BenchArgs, seconds: f64) -> Result<(), String> {
    let size = args.value_size;
    let store = Arc::new(open(&args.dir, true).map_err(err)?);
    let s = store.clone();
    let out = Arc::new(journal_core::sync::Mutex::new(std::io::stdout()));
    let op: ClientOp = Arc::new(move |c, n| {
        let k = key(c, n);
        s.put(&k, &bench_value(&k, size)).map_err(err)?;
        let mut o = out.lock();
        writeln!(o, "{c} {n}")
            .and_then(|_| o.flush())
            .map_err(|e| e.to_string())
    });
    closed_loop(args.clients[0], seconds, op)?;
    store.close().map_err(err)
}

/// One point: rounds alternating the bare journal and the store, each on a
/// fresh directory; medians over the rounds.
struct Point {
    row: Vec<String>,
    json: serde_json::Value,
    /// The store of the last round and each client's puts (the read phase
    /// reads them back).
    last_store: (Arc<Store>, Vec<u64>),
}

fn bench_point(
    args: &BenchArgs,
    root: &Path,
    bar: &ProgressBar,
    i: usize,
    clients: usize,
    rounds: usize,
    seconds: f64,
) -> Result<Point, String> {
    let size = args.value_size;
    let (mut jr, mut sr, mut s50, mut s99, mut j50) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut groups, mut jgroups, mut scpu, mut jcpu) = (vec![], vec![], vec![], vec![]);
    let mut last: Option<(Arc<Store>, Vec<u64>)> = None;
    for round in 0..rounds {
        // The last round's store closes first: its background work is not
        // this round's.
        if let Some((old, _)) = last.take() {
            old.close().map_err(err)?;
        }
        bar.set_message(format!("journal, {clients} clients, round {}", round + 1));
        let journal_seconds = if args.store_only { 0.05 } else { seconds };
        let jdir = root.join(format!("journal-{i}-{round}"));
        let u0 = usage()?;
        let (jp, jg) = journal_round(&jdir, clients, journal_seconds, size)?;
        jcpu.push(cpu_us_per(&u0, jp.ops)?);
        bar.inc(1);
        bar.set_message(format!("store, {clients} clients, round {}", round + 1));
        let store = Arc::new(open(&root.join(format!("store-{i}-{round}")), true).map_err(err)?);
        let s = store.clone();
        let u0 = usage()?;
        let sp = closed_loop(
            clients,
            seconds,
            Arc::new(move |c, n| {
                let k = key(c, n);
                s.put(&k, &bench_value(&k, size)).map(|_| ()).map_err(err)
            }) as ClientOp,
        )?;
        scpu.push(cpu_us_per(&u0, sp.ops)?);
        bar.inc(1);
        groups.push(store.journal().metrics().avg_group_size);
        jgroups.push(jg);
        jr.push(jp.rate());
        sr.push(sp.rate());
        j50.push(jp.q(0.5) as f64);
        s50.push(sp.q(0.5) as f64);
        s99.push(sp.q(0.99) as f64);
        last = Some((store, sp.per_client));
    }
    let last_store = last.ok_or("no round ran")?;
    let (jrate, srate) = (median(jr), median(sr));
    let overhead = 1.0 - srate / jrate;
    let (p50, p99) = (median(s50), median(s99));
    let (scpu, jcpu) = (median(scpu), median(jcpu));
    Ok(Point {
        row: vec![
            clients.to_string(),
            format!("{srate:.0}"),
            format!("{p50:.0}"),
            format!("{p99:.0}"),
            format!("{scpu:.1}"),
            format!("{jrate:.0}"),
            format!("{jcpu:.1}"),
            format!("{:.1}%", overhead * 100.0),
        ],
        json: json!({
            "clients": clients, "value_size": size, "rounds": rounds,
            "commits_per_s": srate, "p50_us": p50, "p99_us": p99,
            "cpu_us_per_commit": scpu,
            "journal_commits_per_s": jrate, "journal_p50_us": median(j50),
            "journal_cpu_us_per_commit": jcpu,
            "overhead": overhead, "avg_group_size": median(groups),
            "journal_avg_group_size": median(jgroups),
        }),
        last_store,
    })
}

/// This process's CPU and switches so far.
fn usage() -> Result<journal_core::vfs::ProcessUsage, String> {
    journal_core::vfs::process_usage().map_err(|e| format!("getrusage: {e}"))
}

/// CPU µs of the whole process since `u0`, per one of `ops`.
fn cpu_us_per(u0: &journal_core::vfs::ProcessUsage, ops: u64) -> Result<f64, String> {
    let cpu = usage()?.since(u0).cpu;
    Ok(cpu.as_secs_f64() * 1e6 / ops.max(1) as f64)
}

/// The bare journal: one `append_durable` per commit of a record of the
/// store's size, with the same client work (key, value). Returns the load
/// and the journal's average group size.
fn journal_round(
    dir: &Path,
    clients: usize,
    seconds: f64,
    size: usize,
) -> Result<(Clients, f64), String> {
    let journal =
        Arc::new(Journal::open(dir, Options::default().journal).map_err(|e| e.to_string())?);
    let j = journal.clone();
    let load = closed_loop(
        clients,
        seconds,
        Arc::new(move |c, n| {
            let k = key(c, n);
            let mut record = Vec::with_capacity(25 + k.len() + size);
            record.extend_from_slice(&[0x5A; 25]);
            record.extend_from_slice(&k);
            record.extend_from_slice(&bench_value(&k, size));
            j.append_durable(&record)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }) as ClientOp,
    )?;
    let groups = journal.metrics().avg_group_size;
    journal.close().map_err(|e| e.to_string())?;
    Ok((load, groups))
}

/// The read phase: gets of the keys the last point's clients wrote, each
/// checked.
fn read_phase(
    store: &Arc<Store>,
    written: Vec<u64>,
    seconds: f64,
    size: usize,
) -> Result<serde_json::Value, String> {
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
        }) as ClientOp,
    )?;
    println!(
        "reads: {clients} clients, {:.0} gets/s, p50 {} µs, p99 {} µs",
        rp.rate(),
        rp.q(0.5),
        rp.q(0.99)
    );
    Ok(json!({"clients": clients, "gets_per_s": rp.rate(),
              "p50_us": rp.q(0.5), "p99_us": rp.q(0.99)}))
}
