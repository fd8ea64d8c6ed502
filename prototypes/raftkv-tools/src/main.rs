//! `raftkv-tools`: start a local raftkv cluster, measure it beside etcd,
//! or put it through the fault matrix. The nodes are `raftkv serve`
//! processes of the `raftkv` binary beside this one ([`raftkv_tools::local::server_exe`]).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    version,
    about = "raftkv's tooling: a local cluster, benchmarks beside etcd, the fault matrix"
)]
struct Cli {
    /// The `raftkv` server binary the nodes run (default: `$RAFTKV_BIN`,
    /// else the `raftkv` beside this executable).
    #[arg(long, global = true)]
    raftkv: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Starts a local cluster, a `raftkv serve` process per node, until
    /// Ctrl-C (or SIGTERM); a node that exits is restarted after a backoff
    /// (100 ms doubling to 5 s) while the others go on.
    Cluster {
        /// Nodes.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// The directory holding one directory per node.
        #[arg(long)]
        dir: PathBuf,
        /// Node N listens on 127.0.0.1:(P + N - 1).
        #[arg(long, default_value_t = 7001)]
        base_port: u16,
        /// Leave a node that exits down (the others go on serving).
        #[arg(long)]
        no_restart: bool,
        /// More arguments for every node's `raftkv serve`, after `--`
        /// (e.g. `-- --election-timeout-ms 1000`).
        #[arg(last = true)]
        serve_args: Vec<String>,
    },
    /// The fault matrix: kills, pauses, partitions, slow and failing
    /// disks, crashes at failpoints, each with all members and with one
    /// down, every history checked for linearizability (`cargo xtask
    /// raft-faults`). Exits non-zero if any run failed.
    Faults {
        /// The faults, by name (default: all; see `raftkv_tools::faults::Fault`).
        #[arg(long, value_delimiter = ',')]
        faults: Vec<String>,
        /// Cycle through the cases with new seeds for this many minutes.
        #[arg(long)]
        minutes: Option<f64>,
        /// Runs of each case, without --minutes.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// The first seed (default: from the clock); run N takes seed + N.
        #[arg(long)]
        seed: Option<u64>,
        /// One fault window a run (the short pass) instead of three.
        #[arg(long)]
        short: bool,
        /// The API the recorded clients use: `grpc` (etcd's, no request
        /// ids: writes in doubt are not retried) or `http` (raftkv's, each
        /// write retried under its request id). Watchers use gRPC either
        /// way.
        #[arg(long, default_value = "grpc")]
        api: String,
        /// Where each failing run is kept as a file.
        #[arg(long, default_value = "target/raft-faults")]
        out: PathBuf,
        /// Also write every run's report here, as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// lagging-follower: keys loaded before the follower stops
        /// (issue 58's full run: 1000000).
        #[arg(long, default_value_t = raftkv_tools::faults::Lag::small().keys)]
        lag_keys: u64,
        /// lagging-follower: bytes per value.
        #[arg(long, default_value_t = raftkv_tools::faults::Lag::small().value_bytes)]
        lag_value_bytes: usize,
        /// lagging-follower: MiB of puts the others take while the
        /// follower is stopped (the full run: 1024).
        #[arg(long, default_value_t = raftkv_tools::faults::Lag::small().behind_bytes >> 20)]
        lag_mib: u64,
        /// lagging-follower: an argument for every node's `raftkv serve`
        /// (repeat it: `--lag-node-arg=--snapshot-min-mib
        /// --lag-node-arg=1000000` keeps the follower to appends).
        #[arg(long, allow_hyphen_values = true)]
        lag_node_arg: Vec<String>,
    },
    /// A local cluster kept by the supervisor of `cluster`, recorded
    /// clients, and `kill -9` of a random node every few seconds; every
    /// key's history checked at the end (`cargo xtask raft-soak`). Exits
    /// non-zero on a violation, an undecided key or a cluster that did not
    /// recover.
    Soak {
        /// How long the load and the kills go on.
        #[arg(long, default_value_t = 1.0)]
        minutes: f64,
        /// Seconds between kills.
        #[arg(long, default_value_t = 10.0)]
        kill_every: f64,
        /// Recorded clients.
        #[arg(long, default_value_t = 8)]
        clients: u64,
        /// Keys they spread over.
        #[arg(long, default_value_t = 4096)]
        keys: u32,
        /// The seed (default: from the clock).
        #[arg(long)]
        seed: Option<u64>,
        /// Also write the report here, as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Closed-loop clients on etcd's gRPC API (raftkv's, or an etcd
    /// cluster's: the same client), each on one endpoint, round robin.
    Bench {
        /// The members' client addresses, `host:port,host:port,...`.
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        /// Client counts, one measurement each.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
        clients: Vec<usize>,
        /// Bytes per value.
        #[arg(long, default_value_t = 100)]
        value_size: usize,
        /// Seconds per client count and op.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// What the clients send, one measurement each: `put` (each client
        /// rewrites 1,024 keys of its own), `get` (linearizable reads of
        /// them).
        #[arg(long, value_delimiter = ',', default_value = "put,get", value_parser = parse_op)]
        ops: Vec<raftkv_tools::bench::Op>,
        /// Also write the results here, as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A raftkv cluster beside an etcd cluster driven by the same etcd
    /// gRPC client: puts and linearizable reads with watchers attached,
    /// interleaved rounds, medians (what `cargo xtask bench-raft` runs).
    Compare {
        /// Interleaved rounds.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Client counts.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
        clients: Vec<usize>,
        /// Bytes per value.
        #[arg(long, default_value_t = 100)]
        value_size: usize,
        /// Load this many keys into each system first, then overwrite and
        /// read random ones of them (0: each client puts and reads 1,024
        /// keys of its own).
        #[arg(long, default_value_t = 0)]
        keys: u64,
        /// The phases of each measurement, each --seconds long: `put`,
        /// `get` (linearizable reads).
        #[arg(long, value_delimiter = ',', default_value = "put,get", value_parser = parse_op)]
        ops: Vec<raftkv_tools::bench::Op>,
        /// Watch streams on the keys' prefix during each measurement,
        /// round robin over the members (0: none).
        #[arg(long, default_value_t = 3)]
        watchers: usize,
        /// The revisions both systems keep when they auto-compact (etcd's
        /// and raftkv's `--auto-compaction-mode revision
        /// --auto-compaction-retention N`, every five minutes).
        #[arg(long, default_value_t = 10000)]
        compaction_retention: u64,
        /// Where the temporary data directory goes (default: the system's
        /// temporary directory; use one on the disk to measure).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The etcd binary (etcd is left out without it).
        #[arg(long)]
        etcd: Option<PathBuf>,
        /// The first loopback port used.
        #[arg(long, default_value_t = 17101)]
        base_port: u16,
        /// Also write the results here, as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// An argument for every raftkv node (repeat it:
        /// `--node-arg=--snapshot-min-mib --node-arg=256`); not the
        /// auto-compaction flags (--compaction-retention sets them).
        #[arg(long, allow_hyphen_values = true)]
        node_arg: Vec<String>,
        /// Keep the system not being measured running (by default it is
        /// paused with SIGSTOP, so its background disk work does not land
        /// in the other's measurement).
        #[arg(long)]
        idle_running: bool,
        /// Every load client on the leader (etcd's benchmark
        /// `--target-leader`), not round robin over the members.
        #[arg(long)]
        target_leader: bool,
    },
}

fn parse_op(s: &str) -> Result<raftkv_tools::bench::Op, String> {
    raftkv_tools::bench::Op::parse(s).ok_or_else(|| format!("{s:?} is not an op (put, get)"))
}

async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

async fn cluster(
    nodes: u64,
    dir: PathBuf,
    base_port: u16,
    no_restart: bool,
    extra: Vec<String>,
) -> Result<(), String> {
    let mut commands = raftkv_tools::local::NodeCommand::local(nodes, &dir, base_port)?;
    for c in &mut commands {
        c.extra.extend(extra.iter().cloned());
    }
    let restart = raftkv_tools::local::Restart {
        enabled: !no_restart,
        ..Default::default()
    };
    let started = |endpoints: &[String]| {
        for (n, e) in endpoints.iter().enumerate() {
            println!("node {} http://{e}", n + 1);
        }
        println!("(Ctrl-C stops the cluster)");
    };
    raftkv_tools::local::supervise(commands, restart, started, stop_signal()).await
}

async fn soak(
    minutes: f64,
    kill_every: f64,
    clients: u64,
    keys: u32,
    seed: Option<u64>,
    json: Option<PathBuf>,
) -> Result<(), String> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(minutes) || !positive(kill_every) || clients == 0 || keys == 0 {
        return Err("--minutes, --kill-every, --clients and --keys must be positive".into());
    }
    let s = raftkv_tools::faults::Soak {
        exe: raftkv_tools::local::server_exe()?,
        duration: Duration::from_secs_f64(minutes * 60.0),
        kill_every: Duration::from_secs_f64(kill_every),
        clients,
        keys,
        seed: seed.unwrap_or_else(clock_seed),
    };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    eprintln!(
        "soak: {:.0} s, kill -9 every {:.0} s, seed {}",
        s.duration.as_secs_f64(),
        s.kill_every.as_secs_f64(),
        s.seed
    );
    let r = raftkv_tools::faults::soak(&s, dir.path()).await?;
    println!(
        "| seconds | kills | ops | acked writes | error rate | keys | violations | undecided |\n|---|---|---|---|---|---|---|---|\n| {:.0} | {} | {} | {} | {:.2}% | {} | {} | {} |",
        r.seconds,
        r.kills,
        r.ops,
        r.acked_writes,
        100.0 * r.error_rate,
        r.keys,
        r.violations,
        r.undecided
    );
    if let Some(path) = json {
        let doc = serde_json::to_value(&r).map_err(|e| e.to_string())?;
        bench_harness::write_json(&path, &doc)?;
    }
    if r.violations + r.undecided > 0 {
        eprintln!("{}", r.log.join("\n"));
        return Err(format!(
            "{} keys not linearizable, {} undecided",
            r.violations, r.undecided
        ));
    }
    Ok(())
}

/// Runs `work` until it ends or SIGINT / SIGTERM comes; then it is
/// dropped, and with it (when the runtime shuts down) every node process
/// it started: they are killed on drop, never left running.
async fn interruptible(
    work: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), String> {
    tokio::select! {
        r = work => r,
        _ = stop_signal() => Err("interrupted; the nodes it started are killed".into()),
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs())
}

async fn faults(cmd: Cmd) -> Result<(), String> {
    use raftkv_tools::faults::{Campaign, Fault, Lag, Params};
    let Cmd::Faults {
        faults: names,
        minutes,
        runs,
        seed,
        short,
        api,
        out,
        json,
        lag_keys,
        lag_value_bytes,
        lag_mib,
        lag_node_arg,
    } = cmd
    else {
        return Err("not the faults command".into());
    };
    let lag = Lag {
        keys: lag_keys,
        value_bytes: lag_value_bytes,
        behind_bytes: lag_mib << 20,
        serve_args: lag_node_arg,
        ..Lag::small()
    };
    let faults = if names.is_empty() {
        Fault::ALL.to_vec()
    } else {
        names
            .iter()
            .map(|n| Fault::parse(n).ok_or_else(|| format!("--faults: no fault {n:?}")))
            .collect::<Result<_, _>>()?
    };
    if minutes.is_some_and(|m| !m.is_finite() || m <= 0.0) || runs == 0 {
        return Err("--minutes and --runs must be positive".into());
    }
    let api = raftkv_tools::faults::Api::parse(&api).ok_or("--api: grpc or http")?;
    let seed = seed.unwrap_or_else(clock_seed);
    let c = Campaign {
        exe: raftkv_tools::local::server_exe()?,
        faults,
        runs,
        budget: minutes.map(|m| Duration::from_secs_f64(m * 60.0)),
        seed,
        params: Params {
            lag,
            api,
            ..if short {
                Params::short()
            } else {
                Params::campaign()
            }
        },
        out,
    };
    eprintln!(
        "seeds from {seed}; clients through {}; failing runs kept in {}",
        api.name(),
        c.out.display()
    );
    let (reports, errors) = raftkv_tools::faults::campaign(&c).await;
    println!("{}", raftkv_tools::faults::table(&reports));
    for r in &reports {
        if let Some(l) = &r.lag {
            println!("{}", raftkv_tools::faults::lag::summary(l));
        }
    }
    if let Some(path) = json {
        let doc = serde_json::to_value(&reports).map_err(|e| e.to_string())?;
        bench_harness::write_json(&path, &doc)?;
    }
    let failed = reports.iter().filter(|r| !r.passed()).count();
    println!(
        "{} runs: {} passed, {} failed, {} did not finish",
        reports.len() + errors.len(),
        reports.len() - failed,
        failed,
        errors.len()
    );
    if failed > 0 || !errors.is_empty() {
        return Err(format!(
            "{failed} runs failed, {} did not finish",
            errors.len()
        ));
    }
    Ok(())
}

async fn bench(
    endpoints: Vec<String>,
    clients: Vec<usize>,
    ops: Vec<raftkv_tools::bench::Op>,
    value_size: usize,
    seconds: f64,
    json: Option<PathBuf>,
) -> Result<(), String> {
    let mut levels = Vec::new();
    let w = raftkv_tools::bench::Workload {
        value_size,
        keys: 0,
        rotation: 0,
    };
    println!("| clients | op | ops/s | p50 µs | p99 µs | failed |");
    println!("|---|---|---|---|---|---|");
    for c in clients {
        for &op in &ops {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_message(format!("{c} clients, {}s", op.name()));
            let l = raftkv_tools::bench::run_level(
                op,
                &endpoints,
                c,
                w,
                Duration::from_secs_f64(seconds),
                Some(bar.clone()),
            )
            .await?;
            bar.finish_and_clear();
            println!(
                "| {} | {} | {:.0} | {} | {} | {} |",
                l.clients,
                op.name(),
                l.ops_per_sec,
                l.p50_us,
                l.p99_us,
                l.failed
            );
            levels.push(l);
        }
    }
    if let Some(path) = json {
        let doc = serde_json::to_value(&levels).map_err(|e| e.to_string())?;
        bench_harness::write_json(&path, &doc)?;
    }
    Ok(())
}

async fn compare(
    o: raftkv_tools::compare::CompareOptions,
    json: Option<PathBuf>,
) -> Result<(), String> {
    if o.rounds == 0
        || !o.seconds.is_finite()
        || o.seconds <= 0.0
        || o.clients.is_empty()
        || o.ops.is_empty()
    {
        return Err("--rounds, --seconds, --clients and --ops must be given".into());
    }
    let report = raftkv_tools::compare::compare(&o).await?;
    let doc = raftkv_tools::compare::summarize(&report, &o.clients);
    if let Some(path) = json {
        bench_harness::write_json(&path, &doc)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(exe) = &cli.raftkv {
        // Before the runtime's threads exist: read by `local::server_exe`.
        std::env::set_var(raftkv_tools::local::SERVER_ENV, exe);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("raftkv-tools: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async move {
        match cli.command {
            Cmd::Cluster {
                nodes,
                dir,
                base_port,
                no_restart,
                serve_args,
            } => cluster(nodes, dir, base_port, no_restart, serve_args).await,
            c @ Cmd::Faults { .. } => interruptible(faults(c)).await,
            Cmd::Soak {
                minutes,
                kill_every,
                clients,
                keys,
                seed,
                json,
            } => interruptible(soak(minutes, kill_every, clients, keys, seed, json)).await,
            Cmd::Bench {
                endpoints,
                clients,
                value_size,
                seconds,
                ops,
                json,
            } => bench(endpoints, clients, ops, value_size, seconds, json).await,
            Cmd::Compare {
                rounds,
                seconds,
                clients,
                value_size,
                keys,
                ops,
                watchers,
                compaction_retention,
                dir,
                etcd,
                base_port,
                json,
                node_arg,
                idle_running,
                target_leader,
            } => {
                let o = raftkv_tools::compare::CompareOptions {
                    rounds,
                    seconds,
                    clients,
                    value_size,
                    keys,
                    ops,
                    watchers,
                    compaction_retention,
                    dir: dir.unwrap_or_else(std::env::temp_dir),
                    etcd,
                    base_port,
                    node_args: node_arg,
                    pause_idle: !idle_running,
                    target_leader,
                };
                compare(o, json).await
            }
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raftkv-tools: {e}");
            ExitCode::FAILURE
        }
    }
}
