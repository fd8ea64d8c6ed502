//! `kvstore compare`: kvstore beside the embedded stores a user would pick
//! instead (fjall, an LSM tree; redb, a copy-on-write B-tree; both with
//! the `peers` feature), at a real size: load N keys, then durable random
//! overwrites at each client count, random gets, 100-key range scans, and
//! one full scan of every key beside 16 overwriting clients and a client
//! of 100-key scans (a backup or a Raft snapshot: it must see one
//! snapshot, all N keys once, while the writers go on and memory stays
//! bounded); a 50/50 mix of gets and
//! durable puts; then half the keys deleted and as many new ones put (is
//! the freed space used again?). Each phase reports the bytes the disk
//! under the store wrote per operation. Then, in fresh processes: the
//! store reopened after a clean close, and again after `kill -9` of 16
//! writers.
//! Each engine runs in its own process (`kvstore engine`), so its peak RSS
//! is its own; rounds interleave the engines; medians are reported.
//!
//! Durability, per engine: kvstore `Transaction::commit` (the journal's
//! group commit); fjall `insert` then `Database::persist(SyncData)`; redb
//! a write transaction with `Durability::Immediate` (its default). The
//! cache budget is the same for each.

use bench_harness::{closed_loop, device_counter, device_stat, median, table, write_json, Op};
use journal_core::vfs::{process_usage, OsVfs, Vfs};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

mod engines;
use engines::{open_engine, Engine};

/// What `kvstore compare` and `kvstore engine` are told.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// Where to create the stores (a fresh directory inside DIR).
    pub dir: PathBuf,
    /// Keys loaded before the measured phases.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Value size, bytes.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Client counts of the overwrite phase, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 64])]
    pub clients: Vec<usize>,
    /// Seconds per measured phase.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Cache budget of every engine, MiB.
    #[arg(long, default_value_t = 64)]
    pub cache_mib: usize,
    /// Engines, comma-separated: kvstore (the default options), kvstore-bulk
    /// (loaded by `Store::bulk_load` instead of transactions),
    /// kvstore-images and kvstore-dw (torn pages handled by full-page
    /// images in the log, the default, or by the double-write buffer),
    /// fjall and redb (these two need the `peers` feature).
    #[arg(long, value_delimiter = ',', default_values_t = default_engines())]
    pub engines: Vec<String>,
    /// Rounds (each engine once per round, interleaved).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// (`engine` only) Just open the store in DIR and read one key.
    #[arg(long, hide = true)]
    pub open_only: bool,
    /// (`engine` only) Open the store in DIR, print `ready`, and overwrite
    /// random keys from 16 clients until killed.
    #[arg(long, hide = true)]
    pub write_until_killed: bool,
}

fn default_engines() -> Vec<String> {
    let mut v = vec!["kvstore".to_string()];
    if cfg!(feature = "peers") {
        v.extend(["fjall".to_string(), "redb".to_string()]);
    }
    v
}

/// Keys per loading transaction: 1,000, or fewer so that one holds at
/// most 16 MiB of values (a transaction's log record must fit one
/// journal record: 64 MiB by default).
fn batch_keys(value_size: usize) -> u64 {
    ((16 << 20) / value_size.max(1)).clamp(1, 1000) as u64
}

/// Key `i`: fixed width, so key order is number order.
fn key(i: u64) -> Vec<u8> {
    format!("key{i:012}").into_bytes()
}

/// A value of `size` bytes that depends on (`i`, `version`).
fn value(i: u64, version: u64, size: usize) -> Vec<u8> {
    let mut v = kvstore::bench_value(&key(i ^ version.rotate_left(40)), size);
    v.truncate(size);
    v
}

/// A well-mixed random number from (client, n).
fn mix(c: usize, n: u64) -> u64 {
    let mut x =
        (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 29)
}

/// Runs `op` from `clients` closed-loop clients for `seconds`; with the
/// CPU it took and the bytes the disk under the store (`stat`) wrote, per
/// operation (the disk's every writer counts: run on a quiet machine).
fn phase(
    clients: usize,
    seconds: f64,
    stat: Option<&Path>,
    op: Arc<Op<String>>,
) -> Result<Value, String> {
    let before = process_usage().map_err(|e| e.to_string())?;
    let sectors = device_counter(stat, 6);
    let r = closed_loop(clients, seconds, op)?;
    let written = (device_counter(stat, 6) - sectors) * 512.0;
    let cpu = process_usage()
        .map_err(|e| e.to_string())?
        .since(&before)
        .cpu;
    let ops = r.per_client.iter().sum::<u64>().max(1);
    Ok(json!({
        "clients": clients, "ops_per_s": r.rate(), "p50_us": r.q(0.5),
        "p99_us": r.q(0.99), "p999_us": r.q(0.999), "max_us": r.q(1.0),
        "cpu_us_per_op": cpu.as_secs_f64() * 1e6 / ops as f64,
        "device_bytes_per_op": written / ops as f64,
    }))
}

/// `kvstore engine`: one engine's whole run in this process; prints one
/// JSON object.
pub fn engine(name: &str, args: &ScaleArgs) -> Result<(), String> {
    let cache = args.cache_mib << 20;
    if args.open_only {
        // The time to open the store a run closed, and to read one key.
        let t = Instant::now();
        let e = open_engine(name, &args.dir, cache)?;
        e.get(&key(args.keys / 2))?;
        println!(
            "{}",
            json!({"open_after_close_s": t.elapsed().as_secs_f64()})
        );
        return Ok(());
    }
    if args.write_until_killed {
        return write_until_killed(name, args);
    }
    let stat = device_stat(&args.dir);
    let (n, size) = (args.keys, args.value_size);
    let empty = empty_store_puts(name, args, stat.as_deref())?;
    let e = open_engine(name, &args.dir, cache)?;
    let t = Instant::now();
    e.load(n, size)?;
    let load_s = t.elapsed().as_secs_f64();
    let load_disk = du(&args.dir);
    let rss_load = process_usage().map_err(|e| e.to_string())?.max_rss_bytes;
    let mut puts = Vec::new();
    for &c in &args.clients {
        let e2 = e.clone();
        puts.push(phase(
            c,
            args.seconds,
            stat.as_deref(),
            Arc::new(move |c, k| {
                let i = mix(c, k) % n;
                e2.put(&key(i), &value(i, k + 1, size))
            }),
        )?);
    }
    let max_c = args.clients.iter().copied().max().unwrap_or(1);
    let e2 = e.clone();
    let gets = phase(
        max_c,
        args.seconds,
        stat.as_deref(),
        Arc::new(move |c, k| {
            let i = mix(c, k ^ 0x5555) % n;
            match e2.get(&key(i))? {
                Some(v) if v.len() == size => Ok(()),
                other => Err(format!("key {i}: {:?} bytes", other.map(|v| v.len()))),
            }
        }),
    )?;
    let mixed = mixed_phase(&e, n, size, max_c.min(16), args.seconds, stat.as_deref())?;
    let e2 = e.clone();
    let scans = phase(
        max_c.min(16),
        args.seconds,
        stat.as_deref(),
        Arc::new(move |c, k| {
            let i = mix(c, k ^ 0xAAAA) % n.saturating_sub(100).max(1);
            match e2.scan(&key(i), 100)? {
                100 => Ok(()),
                got => Err(format!("a scan from key {i} read {got} entries")),
            }
        }),
    )?;
    let full_scan = full_scan_beside_writers(&e, n, size, 16)?;
    let space = delete_half_then_refill(&e, &args.dir, n, size)?;
    // A clean close; `compare` times the reopen in a fresh process.
    e.close()?;
    drop(e);
    let disk = du(&args.dir);
    let peak = process_usage().map_err(|e| e.to_string())?.max_rss_bytes;
    println!(
        "{}",
        json!({
            "engine": name, "keys": n, "value_size": size, "cache_mib": args.cache_mib,
            "load_s": load_s, "disk_after_load": load_disk, "rss_after_load_mib": rss_load as f64 / 1048576.0,
            "empty_puts": empty, "puts": puts, "gets": gets, "mixed": mixed, "scans": scans, "full_scan": full_scan,
            "space": space,
            "peak_rss_mib": peak as f64 / 1048576.0, "disk_bytes": disk,
            "logical_bytes": n * (15 + size as u64),
        })
    );
    Ok(())
}

/// Durable single puts at 16 clients (or the most asked for) into an
/// empty store of the engine's own (DIR`.empty`), beside the run's: the
/// rate the loaded store's is measured against, in the same process and
/// run.
fn empty_store_puts(name: &str, args: &ScaleArgs, stat: Option<&Path>) -> Result<Value, String> {
    let dir = args.dir.with_extension("empty");
    let e = open_engine(name, &dir, args.cache_mib << 20)?;
    let c = if args.clients.contains(&16) {
        16
    } else {
        args.clients.iter().copied().max().unwrap_or(1)
    };
    let size = args.value_size;
    let e2 = e.clone();
    let r = phase(
        c,
        args.seconds,
        stat,
        Arc::new(move |c, k| e2.put(&key(mix(c, k) % 1_000_000_000), &value(k, 1, size))),
    )?;
    // (The directory goes with the run's, which `compare` removes.)
    e.close()?;
    Ok(r)
}

/// Half gets, half durable puts, of random keys.
fn mixed_phase(
    e: &Arc<dyn Engine>,
    n: u64,
    size: usize,
    clients: usize,
    seconds: f64,
    stat: Option<&Path>,
) -> Result<Value, String> {
    let e = e.clone();
    phase(
        clients,
        seconds,
        stat,
        Arc::new(move |c, k| {
            let r = mix(c, k ^ 0x3333);
            let i = (r >> 1) % n;
            if r & 1 == 0 {
                return e.put(&key(i), &value(i, k + 3, size));
            }
            match e.get(&key(i))? {
                Some(v) if v.len() == size => Ok(()),
                other => Err(format!("key {i}: {:?} bytes", other.map(|v| v.len()))),
            }
        }),
    )
}

/// `kvstore engine --write-until-killed`: 16 clients overwrite random keys
/// of the store in DIR durably until the process is killed (`compare`
/// kills it with SIGKILL, then times the reopen).
fn write_until_killed(name: &str, args: &ScaleArgs) -> Result<(), String> {
    let e = open_engine(name, &args.dir, args.cache_mib << 20)?;
    let n = args.keys.max(1);
    println!("ready");
    let e2 = e.clone();
    let size = args.value_size;
    // Far longer than `compare` lets it run.
    closed_loop(
        16,
        3600.0,
        Arc::new(move |c: usize, k: u64| {
            let i = mix(c + 77, k) % n;
            e2.put(&key(i), &value(i, k + 11, size))
        }),
    )?;
    Ok(())
}

/// Scans all `n` keys from one snapshot while `writers` clients overwrite
/// random keys durably and one more client runs 100-key scans (each its
/// own snapshot, opened and closed beside the long one); the full scan
/// must count exactly `n`, each short one 100 keys or the rest.
fn full_scan_beside_writers(
    e: &Arc<dyn Engine>,
    n: u64,
    size: usize,
    writers: usize,
) -> Result<Value, String> {
    use journal_core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = AtomicBool::new(false);
    let (written, short) = (AtomicU64::new(0), AtomicU64::new(0));
    let t = Instant::now();
    let (scanned, scan_s, failed) = std::thread::scope(|s| {
        let (e2, stop2, short2) = (e.clone(), &stop, &short);
        let scanner = s.spawn(move || -> Result<(), String> {
            let mut k = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let i = mix(2000, k) % n;
                let got = e2.scan(&key(i), 100)?;
                if got != 100.min((n - i) as usize) {
                    return Err(format!("a scan from key {i} read {got} entries"));
                }
                short2.fetch_add(1, Ordering::Relaxed);
                k += 1;
            }
            Ok(())
        });
        let handles: Vec<_> = (0..writers)
            .map(|c| {
                let (e, stop, written) = (e.clone(), &stop, &written);
                s.spawn(move || -> Result<(), String> {
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let i = mix(c + 1000, k) % n;
                        e.put(&key(i), &value(i, k + 7, size))?;
                        written.fetch_add(1, Ordering::Relaxed);
                        k += 1;
                    }
                    Ok(())
                })
            })
            .collect();
        let scanned = e.scan(&key(0), usize::MAX);
        let scan_s = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let failed = handles
            .into_iter()
            .chain([scanner])
            .map(|h| h.join().unwrap_or_else(|_| Err("a writer panicked".into())))
            .find_map(Result::err);
        (scanned, scan_s, failed)
    });
    if let Some(f) = failed {
        return Err(f);
    }
    let scanned = scanned?;
    if scanned as u64 != n {
        return Err(format!("the full scan read {scanned} keys of {n}"));
    }
    let puts = written.load(Ordering::Relaxed);
    let rss = process_usage().map_err(|e| e.to_string())?.max_rss_bytes;
    Ok(json!({
        "keys": scanned, "seconds": scan_s, "keys_per_s": scanned as f64 / scan_s,
        "writers": writers, "writer_puts_per_s": puts as f64 / scan_s,
        "short_scans_per_s": short.load(Ordering::Relaxed) as f64 / scan_s,
        "peak_rss_mib_so_far": rss as f64 / 1048576.0,
    }))
}

/// Bytes under `dir` (`du -sb`), if `du` answers.
fn du(dir: &Path) -> Option<u64> {
    let o = std::process::Command::new("du")
        .args(["-sb"])
        .arg(dir)
        .output()
        .ok()?;
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Deletes every other key (1,000 per durable transaction), then puts as
/// many new keys: does the space the deletes freed get used again? The
/// disk under the store before, after the deletes and after the refill.
fn delete_half_then_refill(
    e: &Arc<dyn Engine>,
    dir: &Path,
    n: u64,
    size: usize,
) -> Result<Value, String> {
    let before = du(dir);
    let t = Instant::now();
    // The keys of one transaction at a time: a list of all of them would
    // be the process's largest allocation (280 MiB at 10 M keys, counted
    // in the engine's peak RSS).
    let mut from = 0;
    while from < n {
        let chunk: Vec<Vec<u8>> = (from..(from + 2000).min(n)).step_by(2).map(key).collect();
        e.delete_batch(&chunk)?;
        from += 2000;
    }
    let delete_s = t.elapsed().as_secs_f64();
    let deleted = du(dir);
    let t = Instant::now();
    let mut i = n;
    while i < n + n / 2 {
        let step = batch_keys(size);
        let batch: Vec<_> = (i..(i + step).min(n + n / 2))
            .map(|j| (key(j), value(j, 0, size)))
            .collect();
        e.put_batch(&batch)?;
        i += step;
    }
    let refill_s = t.elapsed().as_secs_f64();
    if e.get(&key(0))?.is_some() {
        return Err("key 0 survived its delete".into());
    }
    Ok(json!({
        "deleted_keys": n.div_ceil(2), "delete_s": delete_s, "refill_s": refill_s,
        "disk_before": before, "disk_after_delete": deleted, "disk_after_refill": du(dir),
    }))
}

/// Runs `kvstore engine NAME DIR ARGS` in a child process; its JSON.
fn run_engine(exe: &Path, name: &str, dir: &Path, args: &[&str]) -> Result<Value, String> {
    let out = std::process::Command::new(exe)
        .arg("engine")
        .arg(name)
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{name}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{name}: {e}"))
}

/// Starts 16 writers on the store in `dir` in a child process, kills it
/// with SIGKILL two seconds in, and times the reopen (recovery and one
/// read) in a fresh process.
fn open_after_kill(exe: &Path, name: &str, dir: &Path, args: &ScaleArgs) -> Result<Value, String> {
    use std::io::BufRead;
    let keys = args.keys.to_string();
    let cache = args.cache_mib.to_string();
    let mut child = std::process::Command::new(exe)
        .args(["engine", name])
        .arg(dir)
        .args([
            "--keys",
            &keys,
            "--cache-mib",
            &cache,
            "--write-until-killed",
        ])
        .args(["--value-size", &args.value_size.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{name}: the writer did not start ({line:?})"));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    child.kill().map_err(|e| e.to_string())?;
    child.wait().map_err(|e| e.to_string())?;
    let o = run_engine(
        exe,
        name,
        dir,
        &["--keys", &keys, "--cache-mib", &cache, "--open-only"],
    )?;
    Ok(o["open_after_close_s"].clone())
}

/// `kvstore compare`: every engine in its own process, rounds interleaved.
pub fn compare(args: &ScaleArgs) -> Result<(), String> {
    OsVfs::new()
        .create_dir_all(&args.dir)
        .map_err(|e| e.to_string())?;
    let root = tempfile::Builder::new()
        .prefix("kvstore-compare")
        .tempdir_in(&args.dir)
        .map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut runs: Vec<Value> = Vec::new();
    for round in 0..args.rounds {
        for name in &args.engines {
            let run = tempfile::Builder::new()
                .prefix(&format!("{name}-{round}-"))
                .tempdir_in(root.path())
                .map_err(|e| e.to_string())?;
            let dir = run.path().join("store");
            eprintln!("round {}: {name}, {} keys…", round + 1, args.keys);
            let clients: Vec<String> = args.clients.iter().map(usize::to_string).collect();
            let mut v = run_engine(
                &exe,
                name,
                &dir,
                &[
                    "--keys",
                    &args.keys.to_string(),
                    "--value-size",
                    &args.value_size.to_string(),
                    "--clients",
                    &clients.join(","),
                    "--seconds",
                    &args.seconds.to_string(),
                    "--cache-mib",
                    &args.cache_mib.to_string(),
                ],
            )?;
            let o = run_engine(
                &exe,
                name,
                &dir,
                &[
                    "--keys",
                    &args.keys.to_string(),
                    "--cache-mib",
                    &args.cache_mib.to_string(),
                    "--open-only",
                ],
            )?;
            v["open_after_close_s"] = o["open_after_close_s"].clone();
            v["open_after_kill_s"] = open_after_kill(&exe, name, &dir, args)?;
            runs.push(v);
            drop(run);
        }
    }
    report(args, &runs);
    if let Some(path) = &args.json {
        write_json(path, &json!({"bench": "kvstore-compare", "runs": runs}))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn report(args: &ScaleArgs, runs: &[Value]) {
    let med = |name: &str, f: &dyn Fn(&Value) -> Option<f64>| {
        median(
            runs.iter()
                .filter(|r| r["engine"] == name)
                .filter_map(f)
                .collect(),
        )
    };
    println!(
        "{} keys × {} B, cache {} MiB, durable single-put transactions, medians of {} rounds",
        args.keys, args.value_size, args.cache_mib, args.rounds
    );
    let mut header = vec![
        "engine".to_string(),
        "load s".to_string(),
        "MiB loaded".to_string(),
        "empty-store puts/s".to_string(),
    ];
    for c in &args.clients {
        header.push(format!("puts/s @{c}"));
        header.push(format!("p99 µs @{c}"));
    }
    header.extend(
        [
            "gets/s",
            "scans/s",
            "full scan s",
            "puts/s beside it",
            "scans/s beside it",
            "mix ops/s",
            "dev B/put",
            "open s",
            "open s after kill",
            "peak RSS MiB",
            "disk MiB",
            "MiB full/half/refilled",
        ]
        .map(String::from),
    );
    let mut rows = Vec::new();
    for name in &args.engines {
        // The median over the rounds of one JSON field, by its path.
        let cell = |decimals: usize, path: &[&str], scale: f64| {
            let m = med(name, &|r| {
                let v = path.iter().fold(r, |v, k| match k.parse::<usize>() {
                    Ok(i) => &v[i],
                    Err(_) => &v[*k],
                });
                v.as_f64().map(|x| x * scale)
            });
            format!("{m:.decimals$}")
        };
        let mut row = vec![
            name.clone(),
            cell(1, &["load_s"], 1.0),
            cell(0, &["disk_after_load"], 1.0 / 1048576.0),
            cell(0, &["empty_puts", "ops_per_s"], 1.0),
        ];
        for i in 0..args.clients.len() {
            let i = i.to_string();
            row.push(cell(0, &["puts", &i, "ops_per_s"], 1.0));
            row.push(cell(0, &["puts", &i, "p99_us"], 1.0));
        }
        row.push(cell(0, &["gets", "ops_per_s"], 1.0));
        row.push(cell(0, &["scans", "ops_per_s"], 1.0));
        row.push(cell(1, &["full_scan", "seconds"], 1.0));
        row.push(cell(0, &["full_scan", "writer_puts_per_s"], 1.0));
        row.push(cell(0, &["full_scan", "short_scans_per_s"], 1.0));
        row.push(cell(0, &["mixed", "ops_per_s"], 1.0));
        // At the most clients of the put phases.
        let last = (args.clients.len().max(1) - 1).to_string();
        row.push(cell(0, &["puts", &last, "device_bytes_per_op"], 1.0));
        row.push(cell(2, &["open_after_close_s"], 1.0));
        row.push(cell(2, &["open_after_kill_s"], 1.0));
        row.push(cell(0, &["peak_rss_mib"], 1.0));
        row.push(cell(0, &["disk_bytes"], 1.0 / 1048576.0));
        row.push(format!(
            "{}/{}/{}",
            cell(0, &["space", "disk_before"], 1.0 / 1048576.0),
            cell(0, &["space", "disk_after_delete"], 1.0 / 1048576.0),
            cell(0, &["space", "disk_after_refill"], 1.0 / 1048576.0)
        ));
        rows.push(row);
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    table(&header, &rows);
}
