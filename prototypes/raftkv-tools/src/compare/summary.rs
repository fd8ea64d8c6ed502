//! The summary of a `raftkv-tools compare` run: per client count and system,
//! the medians over rounds of each phase (with the range of requests/s),
//! printed as tables and returned as the JSON document `--json` writes.
//!
//! The document: `levels` (per client count: `clients`, then per system
//! `puts_per_sec`, `min`, `max`, `p50_us`, `p99_us`, `cpu_us_per_put`,
//! `flushes_per_put`; `gets_per_sec`, `gets_min`, `gets_max`,
//! `get_p50_us`, `get_p99_us`, `cpu_us_per_get`, `flushes_per_get`;
//! `watch_events_per_sec` (the slowest watcher's, median),
//! `watch_ratio` (its events over the puts, the lowest), `watch_lag_ms`
//! (the longest; `null` when a watcher did not catch up), `watch_errors`;
//! `rounds`; and `ratio` / `gets_ratio`, raftkv over etcd), `systems`
//! (load time and memory), `samples` (every measurement), `replacement`
//! and `replacement_error`.

use super::{replace, Phase, Report, Sample};
use bench_harness::median;
use serde_json::{json, Value};

/// The medians of one phase over the rounds.
struct Medians {
    rate: f64,
    lo: f64,
    hi: f64,
    p50: f64,
    p99: f64,
    cpu: f64,
    flushes: f64,
}

fn medians(v: &[&Phase]) -> Medians {
    let med = |f: &dyn Fn(&Phase) -> f64| median(v.iter().map(|p| f(p)).collect());
    let rates = v.iter().map(|p| p.level.ops_per_sec);
    Medians {
        rate: med(&|p| p.level.ops_per_sec),
        lo: rates.clone().fold(f64::MAX, f64::min),
        hi: rates.fold(0.0, f64::max),
        p50: med(&|p| p.level.p50_us as f64),
        p99: med(&|p| p.level.p99_us as f64),
        cpu: med(&|p| p.cpu_us_per_op),
        flushes: med(&|p| p.flushes_per_op),
    }
}

/// The row cells of one phase (`flushes`: with the flushes column).
fn cells(m: &Medians, flushes: bool) -> Vec<String> {
    let mut row = vec![
        format!("{:.0} ({:.0}–{:.0})", m.rate, m.lo, m.hi),
        format!("{:.0}", m.p50),
        format!("{:.0}", m.p99),
        format!("{:.0}", m.cpu),
    ];
    if flushes {
        row.push(format!("{:.2}", m.flushes));
    }
    row
}

/// The watchers' figures of `v` into `entry`, and their cells.
fn watch_summary(v: &[&Sample], entry: &mut Value) -> Vec<String> {
    let w: Vec<_> = v.iter().filter_map(|s| s.watch.as_ref()).collect();
    if w.is_empty() {
        return Vec::new();
    }
    let rate = median(w.iter().map(|w| w.events_per_sec).collect());
    let ratio = w.iter().map(|w| w.ratio).fold(f64::MAX, f64::min);
    let lag = w
        .iter()
        .map(|w| w.lag_ms)
        .try_fold(0.0, |worst: f64, l| l.map(|l| worst.max(l)));
    let errors: usize = w.iter().map(|w| w.errors.len()).sum();
    entry["watch_events_per_sec"] = json!(rate);
    entry["watch_ratio"] = json!(ratio);
    entry["watch_lag_ms"] = json!(lag);
    entry["watch_errors"] = json!(errors);
    vec![
        format!("{rate:.0} ({ratio:.2})"),
        lag.map_or("> 30 s".into(), |l| format!("{l:.0}")),
    ]
}

/// The systems present in `samples`, raftkv first.
fn systems_of(samples: &[Sample]) -> Vec<&'static str> {
    ["raftkv", "etcd"]
        .into_iter()
        .filter(|n| samples.iter().any(|s| s.system == *n))
        .collect()
}

/// raftkv's rate over etcd's, when both were measured.
fn ratio(rates: &[f64], row: &mut Vec<String>, entry: &mut Value, key: &str) {
    if let [r, e] = rates[..] {
        let x = r / e.max(f64::MIN_POSITIVE);
        row.push(format!("{x:.2}"));
        entry[key] = json!(x);
    }
}

/// The puts and gets tables' rows and the JSON `levels`.
fn levels(samples: &[Sample], clients: &[usize]) -> (Vec<Vec<String>>, Vec<Vec<String>>, Value) {
    let (mut puts, mut gets, mut json) = (Vec::new(), Vec::new(), Vec::new());
    for &c in clients {
        let (mut put_row, mut get_row) = (vec![c.to_string()], vec![c.to_string()]);
        let mut entry = json!({ "clients": c });
        let (mut put_rates, mut get_rates) = (Vec::new(), Vec::new());
        for system in systems_of(samples) {
            let v: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.system == system && s.clients == c)
                .collect();
            let mut e = json!({ "rounds": v.len() });
            let p: Vec<&Phase> = v.iter().filter_map(|s| s.put.as_ref()).collect();
            if !p.is_empty() {
                let m = medians(&p);
                put_rates.push(m.rate);
                put_row.extend(cells(&m, true));
                e["puts_per_sec"] = json!(m.rate);
                e["min"] = json!(m.lo);
                e["max"] = json!(m.hi);
                e["p50_us"] = json!(m.p50);
                e["p99_us"] = json!(m.p99);
                e["cpu_us_per_put"] = json!(m.cpu);
                e["flushes_per_put"] = json!(m.flushes);
                put_row.extend(watch_summary(&v, &mut e));
            }
            let g: Vec<&Phase> = v.iter().filter_map(|s| s.get.as_ref()).collect();
            if !g.is_empty() {
                let m = medians(&g);
                get_rates.push(m.rate);
                get_row.extend(cells(&m, false));
                e["gets_per_sec"] = json!(m.rate);
                e["gets_min"] = json!(m.lo);
                e["gets_max"] = json!(m.hi);
                e["get_p50_us"] = json!(m.p50);
                e["get_p99_us"] = json!(m.p99);
                e["cpu_us_per_get"] = json!(m.cpu);
                e["flushes_per_get"] = json!(m.flushes);
            }
            entry[system] = e;
        }
        ratio(&put_rates, &mut put_row, &mut entry, "ratio");
        ratio(&get_rates, &mut get_row, &mut entry, "gets_ratio");
        puts.push(put_row);
        gets.push(get_row);
        json.push(entry);
    }
    (puts, gets, Value::Array(json))
}

/// A table's header: per system its columns, the first named with the
/// system, then raftkv / etcd.
fn header(systems: &[&'static str], first: &str, rest: &[&str]) -> Vec<String> {
    let mut h = vec!["clients".to_string()];
    for s in systems {
        h.push(format!("{s} {first}"));
        h.extend(rest.iter().map(|c| c.to_string()));
    }
    if systems.len() == 2 {
        h.push("raftkv/etcd".into());
    }
    h
}

/// In how many measurements per system client 0 was on the leader.
fn on_leader(samples: &[Sample]) -> String {
    systems_of(samples)
        .iter()
        .map(|system| {
            let v: Vec<&Sample> = samples.iter().filter(|s| s.system == *system).collect();
            let on = v
                .iter()
                .filter(|s| s.leader == Some(s.first_endpoint))
                .count();
            format!("{system} {on} of {}", v.len())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The medians of each system at each client count: prints the tables
/// and returns the JSON document.
pub fn summarize(report: &Report, clients: &[usize]) -> Value {
    let samples = &report.samples[..];
    let systems = systems_of(samples);
    let (puts, gets, json) = levels(samples, clients);
    let watched = samples.iter().any(|s| s.watch.is_some());
    let table = |h: Vec<String>, rows: &[Vec<String>]| {
        let h: Vec<&str> = h.iter().map(String::as_str).collect();
        bench_harness::table(&h, rows);
    };
    if samples.iter().any(|s| s.put.is_some()) {
        let mut rest = vec!["p50 µs", "p99 µs", "CPU µs/put", "flushes/put"];
        if watched {
            rest.extend(["watch ev/s (of puts)", "watch lag ms"]);
        }
        table(header(&systems, "puts/s (range)", &rest), &puts);
    }
    if samples.iter().any(|s| s.get.is_some()) {
        let rest = ["p50 µs", "p99 µs", "CPU µs/get"];
        table(header(&systems, "gets/s (range)", &rest), &gets);
    }
    println!("client 0 on the leader: {}", on_leader(samples));
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|m| format!("{m:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let rows: Vec<Vec<String>> = report
        .systems
        .iter()
        .map(|r| {
            vec![
                r.system.to_string(),
                r.load_s.map_or("-".into(), |s| format!("{s:.1}")),
                fmt(&r.rss_after_load_mib),
                fmt(&r.peak_rss_mib),
            ]
        })
        .collect();
    bench_harness::table(
        &["system", "load s", "RSS after load MiB", "peak RSS MiB"],
        &rows,
    );
    if let Some(r) = &report.replacement {
        replace::print(r);
    }
    json!({
        "levels": json, "systems": report.systems, "samples": samples,
        "replacement": report.replacement, "replacement_error": report.replacement_error,
    })
}
