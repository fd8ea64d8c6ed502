//! The default scenario: closed-loop clients committing small records,
//! against the device's own cost of one write + fdatasync of a group.

use super::BenchArgs;
use super::{
    bench_options, commit_load_sliced, err, fresh_journal, options_json, svg, table, write_file,
    DeviceProbe, Env,
};
use serde_json::{json, Value as Json};

/// Slices of each measured point, with a device probe round between them.
const SLICES: usize = 6;

pub fn run(env: &Env, args: &BenchArgs) -> Result<Json, String> {
    let clients = if args.clients.is_empty() {
        if env.smoke {
            vec![1, 4]
        } else {
            vec![1, 4, 16, 64]
        }
    } else {
        args.clients.clone()
    };
    let size = args.record_size;
    if clients.contains(&0) || size == 0 {
        return Err("--clients and --record-size must be positive".into());
    }
    let base = bench_options(env);
    let options = journal_core::Options {
        batch_policy: args.batch_policy.policy(),
        sync_method: args.sync_method.map_or(base.sync_method, |m| m.method()),
        ..base
    };
    let payload = std::sync::Arc::new(vec![0xC3u8; size]);
    // The wake-up floor before each point, no journal open: it drifts
    // with the host as the load does, so each point's CPU is set against
    // the floor measured next to it.
    let floor_seconds = if env.smoke { 0.1 } else { 0.5 };
    let mut floors = Vec::new();
    let mut points = Vec::new();
    let mut rows = Vec::new();
    let mut series = (Vec::new(), Vec::new());
    for (i, &c) in clients.iter().enumerate() {
        let floor = super::floor::measure(floor_seconds)?;
        let Point {
            mut row,
            mut json,
            rate,
            limit,
            cpu_us,
        } = measure_point(env, &options, i, &clients, c, &payload)?;
        let over = cpu_us / floor.cpu_us.max(f64::MIN_POSITIVE);
        row.push(format!("{:.1}", floor.cpu_us));
        row.push(format!("{over:.2}"));
        json["wake_floor"] = floor.json();
        json["cpu_over_wake_floor"] = json!(over);
        floors.push(floor);
        series.0.push((c as f64, rate));
        series.1.push((c as f64, limit));
        rows.push(row);
        points.push(json);
    }
    println!(
        "group commit: {size}-byte records, closed-loop clients, {} s per point",
        env.seconds
    );
    table(
        &[
            "clients",
            "commits/s",
            "p50 µs",
            "p99 µs",
            "group",
            "syncs/commit",
            "syncs/s",
            "cpu µs/c",
            "vcsw/c",
            "device µs",
            "limit",
            "efficiency",
            "floor µs",
            "cpu/floor",
        ],
        &rows,
    );
    let cpus: Vec<f64> = floors.iter().map(|f| f.cpu_us).collect();
    let walls: Vec<f64> = floors.iter().map(|f| f.wall_us).collect();
    println!(
        "wake-up floor (one park + unpark pair between two threads, the journal's own lock and condvar, measured before each point): {} µs CPU, median {:.1} µs wall",
        spread1(&cpus),
        super::median(walls)
    );
    let floor = super::floor::Floor {
        cpu_us: super::median(cpus),
        wall_us: super::median(floors.iter().map(|f| f.wall_us).collect()),
        switches: super::median(floors.iter().map(|f| f.switches).collect()),
    };
    if let Some(path) = &args.plot {
        plot(path, size, series)?;
    }
    Ok(
        json!({"scenario": "group-commit", "options": options_json(&options), "record_size": size, "wake_floor": floor.json(), "points": points}),
    )
}

/// A chart series: (clients, value) pairs.
type Points = Vec<(f64, f64)>;

/// The `--plot` chart: commits/s and the device limit against clients.
fn plot(
    path: &std::path::Path,
    size: usize,
    (rates, limits): (Points, Points),
) -> Result<(), String> {
    let text = svg::chart(
        &format!("group commit, {size}-byte records"),
        "clients",
        "commits/s",
        &[
            svg::Series {
                name: "journal commits/s",
                color: svg::PALETTE[0],
                dashed: false,
                points: rates,
            },
            svg::Series {
                name: "limit = clients / device latency",
                color: svg::PALETTE[3],
                dashed: true,
                points: limits,
            },
        ],
    );
    write_file(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// `median (min–max)` with one decimal.
fn spread1(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.1} ({lo:.1}–{hi:.1})", super::median(xs.to_vec()))
}

/// One measured point of the scenario.
struct Point {
    /// Its row of the printed table (the floor's columns still to come).
    row: Vec<String>,
    /// Its JSON (the floor's fields still to come).
    json: Json,
    /// Commits per second.
    rate: f64,
    /// The device limit: clients / device latency, per second.
    limit: f64,
    /// CPU µs per commit, whole process.
    cpu_us: f64,
}

/// One point: the device probe and the sliced load with `c` clients.
fn measure_point(
    env: &Env,
    options: &journal_core::Options,
    i: usize,
    clients: &[usize],
    c: usize,
    payload: &std::sync::Arc<Vec<u8>>,
) -> Result<Point, String> {
    let options = *options;
    let size = payload.len();
    env.progress_bar(
        i,
        clients.len(),
        &format!("group-commit: device probe for {c} clients"),
    );
    // The device's own cost, with the journal's write method, sampled
    // after each slice of the point, each round past a warm-up (see
    // `DeviceProbe`): the median of every sample, so neither a
    // drifting device, nor a burst's cheaper syncs, nor one noisy round
    // defines the limit. No round before the load: the device is still
    // in its burst regime then (107–110 µs against 128–139 after the
    // slices, in three of four runs here).
    let (slices, warmup, samples) = if env.smoke {
        (1, 0, 20)
    } else {
        (SLICES, 300, 100)
    };
    let mut probe = DeviceProbe::open(
        env,
        c * size,
        options.alignment,
        options.sync_method,
        options.direct_io,
    )
    .map_err(err)?;
    env.progress_bar(
        i,
        clients.len(),
        &format!("group-commit: {c} clients, {} s", env.seconds),
    );
    let (j, dir) = fresh_journal(env, &format!("gc-{c}"), options).map_err(err)?;
    let p = payload.clone();
    let load = commit_load_sliced(
        &j,
        c,
        env.seconds,
        slices,
        || Ok(probe.round(warmup, samples)?),
        move |j, _, _| j.append_durable(&p).map(|_| ()),
    )
    .map_err(err)?;
    j.close().map_err(err)?;
    drop(j);
    env.discard(&dir);
    let dev = probe.median();
    probe.discard(env);
    let dev_s = dev.as_secs_f64();
    let limit = c as f64 / dev_s;
    let rate = load.rate();
    let efficiency = rate / limit;
    let row = vec![
        c.to_string(),
        format!("{rate:.0}"),
        load.q(0.5).to_string(),
        load.q(0.99).to_string(),
        format!("{:.2}", load.avg_group()),
        format!("{:.3}", load.syncs_per_commit()),
        format!("{:.0}", load.syncs_per_s()),
        format!("{:.1}", load.cpu_us_per_commit()),
        format!("{:.2}", load.switches_per_commit()),
        format!("{:.0}", dev.as_micros()),
        format!("{limit:.0}"),
        format!("{efficiency:.2}"),
    ];
    let json = json!({"clients": c, "record_size": size, "seconds": load.elapsed.as_secs_f64(), "commits": load.commits, "commits_per_s": rate, "p50_us": load.q(0.5), "p99_us": load.q(0.99), "avg_group_size": load.avg_group(), "syncs_per_commit": load.syncs_per_commit(), "syncs_per_s": load.syncs_per_s(), "cpu_us_per_commit": load.cpu_us_per_commit(), "voluntary_switches_per_commit": load.switches_per_commit(), "device_latency_us": dev.as_secs_f64() * 1e6, "limit": limit, "efficiency": efficiency});
    Ok(Point {
        row,
        json,
        rate,
        limit,
        cpu_us: load.cpu_us_per_commit(),
    })
}
