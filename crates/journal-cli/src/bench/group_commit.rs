//! The default scenario: closed-loop clients committing small records,
//! against the device's own cost of one write + fdatasync of a group.

use super::json::Json;
use super::{
    bench_options, commit_load, device_latency, err, fresh_journal, options_json, svg, table,
    write_file, Env,
};
use crate::args::Args;
use std::path::Path;

pub fn run(env: &Env, args: &Args) -> Result<Json, String> {
    let clients = args.list("clients", if env.smoke { &[1, 4] } else { &[1, 4, 16, 64] })?;
    let size: usize = args.parsed("record-size", 256)?;
    if clients.contains(&0) || size == 0 {
        return Err("--clients and --record-size must be positive".into());
    }
    let batch_policy = match args.value("batch-policy").unwrap_or("adaptive") {
        "adaptive" => jbd_batch::BatchPolicy::Adaptive,
        "last-sync-writer" => jbd_batch::BatchPolicy::LastSyncWriter,
        "fixed-sleep-1ms" => {
            jbd_batch::BatchPolicy::FixedSleep(std::time::Duration::from_millis(1))
        }
        "none" => jbd_batch::BatchPolicy::None,
        other => {
            return Err(format!(
                "--batch-policy {other:?}: one of adaptive, last-sync-writer, fixed-sleep-1ms, none"
            ))
        }
    };
    let options = journal_core::Options {
        batch_policy,
        ..bench_options(env)
    };
    let payload = std::sync::Arc::new(vec![0xC3u8; size]);
    let mut points = Vec::new();
    let mut rows = Vec::new();
    let mut series = (Vec::new(), Vec::new());
    for (i, &c) in clients.iter().enumerate() {
        env.progress_bar(
            i,
            clients.len(),
            &format!("group-commit: device probe for {c} clients"),
        );
        let samples = if env.smoke { 20 } else { 200 };
        let dev = device_latency(env, c * size, options.alignment, samples).map_err(err)?;
        env.progress_bar(
            i,
            clients.len(),
            &format!("group-commit: {c} clients, {} s", env.seconds),
        );
        let (j, dir) = fresh_journal(env, &format!("gc-{c}"), options).map_err(err)?;
        let p = payload.clone();
        let load = commit_load(&j, c, env.seconds, move |j, _, _| {
            j.append_durable(&p).map(|_| ())
        })
        .map_err(err)?;
        j.close().map_err(err)?;
        drop(j);
        env.discard(&dir);
        let dev_s = dev.as_secs_f64();
        let limit = c as f64 / dev_s;
        let rate = load.rate();
        let efficiency = rate / limit;
        series.0.push((c as f64, rate));
        series.1.push((c as f64, limit));
        rows.push(vec![
            c.to_string(),
            format!("{rate:.0}"),
            load.q(0.5).to_string(),
            load.q(0.99).to_string(),
            format!("{:.2}", load.avg_group()),
            format!("{:.3}", load.syncs_per_commit()),
            format!("{:.0}", dev.as_micros()),
            format!("{limit:.0}"),
            format!("{efficiency:.2}"),
        ]);
        points.push(
            Json::obj()
                .with("clients", c)
                .with("record_size", size)
                .with("seconds", load.elapsed.as_secs_f64())
                .with("commits", load.commits)
                .with("commits_per_s", rate)
                .with("p50_us", load.q(0.5))
                .with("p99_us", load.q(0.99))
                .with("avg_group_size", load.avg_group())
                .with("syncs_per_commit", load.syncs_per_commit())
                .with("device_latency_us", dev.as_secs_f64() * 1e6)
                .with("limit", limit)
                .with("efficiency", efficiency),
        );
    }
    eprintln!();
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
            "device µs",
            "limit",
            "efficiency",
        ],
        &rows,
    );
    if let Some(path) = args.value("plot") {
        let text = svg::chart(
            &format!("group commit, {size}-byte records"),
            "clients",
            "commits/s",
            &[
                svg::Series {
                    name: "journal commits/s",
                    color: "#1f77b4",
                    dashed: false,
                    points: series.0,
                },
                svg::Series {
                    name: "limit = clients / device latency",
                    color: "#777",
                    dashed: true,
                    points: series.1,
                },
            ],
        );
        write_file(Path::new(path), &text).map_err(|e| format!("{path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    Ok(Json::obj()
        .with("scenario", "group-commit")
        .with("options", options_json(&options).with("record_size", size))
        .with("points", points))
}
