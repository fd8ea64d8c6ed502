//! One run of a fault case, what it measures, and the matrix's table.

use super::cluster::ProcCluster;
use super::grpc::GrpcClient;
use super::load::{Load, Recorded};
use super::watchers;
use super::workload::{self, key_name, Api, Rec};
use super::{candidates, heal, inject, nanos, Fault, Params, Report, Rng};
use crate::client::Client;
use crate::history::{self, Kind, Op, Verdict};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

/// Runs `fault` once against a new three-node cluster of `exe` in `dir`
/// (with one member down throughout if `degraded`), seeded by `seed`, and
/// checks what the clients saw. An error is a run that could not be
/// carried out or whose cluster did not recover (no leader, or a final
/// read without an answer, 30 s after everything healed): a failure too.
pub async fn run_case(
    exe: &Path,
    dir: &Path,
    fault: Fault,
    degraded: bool,
    seed: u64,
    p: &Params,
) -> Result<Report, String> {
    let mut rng = Rng::new(seed ^ ((fault as u64) << 40) ^ u64::from(degraded));
    let (r, c) = if fault == Fault::LaggingFollower {
        if degraded {
            return Err("lagging-follower runs with all members only".into());
        }
        let mut c = ProcCluster::start(exe, 3, dir, &p.lag.serve_args).await?;
        (super::lag::drive(&mut c, seed, p).await, c)
    } else {
        let mut c = ProcCluster::start(exe, 3, dir, &p.serve_args).await?;
        (drive(&mut c, fault, degraded, seed, &mut rng, p).await, c)
    };
    // The processes are killed when the cluster drops; keep what they said
    // if the run failed or could not finish.
    match r {
        Ok(mut report) => {
            if !report.passed() {
                report.log = c.log.lines();
            }
            Ok(report)
        }
        Err(e) => Err(format!("{e}\n{}", c.log.lines().join("\n"))),
    }
}

/// A campaign: which cases, how long, where failures go.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The `raftkv` executable to run (built with `failpoints` for the
    /// faults that need them; the others run with any build).
    pub exe: std::path::PathBuf,
    /// The faults, each run with all members and with one down.
    pub faults: Vec<Fault>,
    /// Runs of each case, when there is no time budget.
    pub runs: usize,
    /// Go on, cycling through the cases with new seeds, until this much
    /// time has passed (a run started is finished).
    pub budget: Option<Duration>,
    /// The first seed; each run takes the next.
    pub seed: u64,
    /// How each run goes.
    pub params: Params,
    /// Where each failing run is kept as a file (its events, report,
    /// failing histories and the nodes' stderr).
    pub out: std::path::PathBuf,
}

/// Runs `c`, a line on stderr per run; a failing run (a violation,
/// undecided keys, or a cluster that did not recover) is kept in `c.out`.
/// Returns every run's report and the errors of the runs that could not
/// finish.
pub async fn campaign(c: &Campaign) -> (Vec<Report>, Vec<String>) {
    let start = Instant::now();
    let (mut reports, mut errors) = (Vec::new(), Vec::new());
    let mut seed = c.seed;
    let mut round = 0;
    'outer: loop {
        for &fault in &c.faults {
            for degraded in [false, true] {
                if degraded && !fault.with_one_down() {
                    continue;
                }
                let over = match c.budget {
                    Some(b) => start.elapsed() >= b,
                    None => round >= c.runs,
                };
                if over {
                    break 'outer;
                }
                let name = format!(
                    "{}-{}-{seed}",
                    fault.name(),
                    if degraded { "2of3" } else { "3of3" }
                );
                let dir = match tempfile::tempdir() {
                    Ok(d) => d,
                    Err(e) => {
                        errors.push(format!("{name}: {e}"));
                        break 'outer;
                    }
                };
                match run_case(&c.exe, dir.path(), fault, degraded, seed, &c.params).await {
                    Ok(r) => {
                        eprintln!(
                            "{name}: {} ops, {} acked writes ({} in doubt, {} not applied), {} violations, {} undecided, {} HashKV mismatches, {} watch events ({} resumed, {} compacted), {} watch violations",
                            r.ops, r.acked_writes, r.in_doubt, r.not_applied, r.violations, r.undecided, r.hash_mismatches,
                            r.watch_events, r.watch_resumed, r.watch_compacted, r.watch_violations
                        );
                        if let Some(l) = &r.lag {
                            eprint!("{}", super::lag::summary(l));
                        }
                        if !r.passed() {
                            keep(&c.out, &name, &r);
                        }
                        reports.push(r);
                    }
                    Err(e) => {
                        eprintln!("{name}: did not finish: {}", first_line(&e));
                        keep_error(&c.out, &name, &e);
                        errors.push(format!("{name}: {}", first_line(&e)));
                    }
                }
                seed += 1;
            }
        }
        round += 1;
    }
    (reports, errors)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// Writes a failing run to `out/NAME.txt`; says so on stderr.
fn keep(out: &Path, name: &str, r: &Report) {
    let mut text = format!("# {name}\n\n## events\n");
    for e in &r.events {
        text.push_str(e);
        text.push('\n');
    }
    text.push_str("\n## report\n");
    text.push_str(&serde_json::to_string_pretty(r).unwrap_or_default());
    text.push_str("\n\n## failing keys (invoked ns, completed ns or null, op)\n");
    for (k, h) in &r.bad_histories {
        text.push_str(&format!("### {k}\n"));
        let mut h = h.clone();
        h.sort_by_key(|o| o.invoked);
        for o in h {
            let what = match &o.kind {
                Kind::Write(v) => format!("write {}", show(v)),
                Kind::Read(v) => format!("read {}", show(v)),
                Kind::Cas {
                    expect,
                    write,
                    succeeded,
                } => format!(
                    "cas {} -> {} {}",
                    show(expect),
                    show(write),
                    succeeded.map_or("unknown", |s| if s { "won" } else { "lost" })
                ),
            };
            let done = o.completed.map_or("null".into(), |c| c.to_string());
            text.push_str(&format!("{} {done} {what}\n", o.invoked));
        }
    }
    text.push_str("\n## watch violations (the first)\n");
    for v in &r.watch_bad {
        text.push_str(v);
        text.push('\n');
    }
    text.push_str("\n## the nodes' stderr\n");
    text.push_str(&r.log.join("\n"));
    save(out, name, &text);
}

fn keep_error(out: &Path, name: &str, e: &str) {
    save(out, name, &format!("# {name}: did not finish\n\n{e}\n"));
}

fn save(out: &Path, name: &str, text: &str) {
    let path = out.join(format!("{name}.txt"));
    let vfs = journal_core::vfs::OsVfs::new();
    let r = journal_core::vfs::Vfs::create_dir_all(&vfs, out)
        .map_err(|e| e.to_string())
        .and_then(|()| bench_harness::write_file(&path, text));
    match r {
        Ok(()) => eprintln!("  kept in {}", path.display()),
        Err(e) => eprintln!("  could not keep it: {e}"),
    }
}

fn show(v: &Option<Vec<u8>>) -> String {
    v.as_ref().map_or("(absent)".into(), |v| {
        String::from_utf8_lossy(v).into_owned()
    })
}

async fn drive(
    c: &mut ProcCluster,
    fault: Fault,
    degraded: bool,
    seed: u64,
    rng: &mut Rng,
    p: &Params,
) -> Result<Report, String> {
    let all: Vec<usize> = (0..c.nodes.len()).collect();
    let first = c
        .leader(&all, Duration::from_secs(30))
        .await
        .ok_or("no leader within 30 s of the start")?;
    let base = Instant::now();
    let mut events = Vec::new();
    let stamp = |what: &str| format!("{:>7.3} s  {what}", base.elapsed().as_secs_f64());
    let down = if degraded {
        let followers: Vec<usize> = all.iter().copied().filter(|&i| i != first).collect();
        let d = rng.pick(&followers).ok_or("no follower")?;
        c.kill9(d).await?;
        events.push(stamp(&format!("node {} down for the run", d + 1)));
        Some(d)
    } else {
        None
    };
    let endpoints = c.endpoints();
    let load = Load::start(&endpoints, seed, base, p);
    tokio::time::sleep(p.warmup).await;
    let mut windows = Vec::new();
    let mut probes = Vec::new();
    for _ in 0..p.windows {
        let mut said = Vec::new();
        let start = nanos(base.elapsed());
        let injected = inject(c, fault, down, rng, &mut said).await?;
        events.extend(said.drain(..).map(|e| stamp(&e)));
        for e in hold(c, fault, &injected, rng, p).await {
            events.push(stamp(&e));
        }
        let mut probe = |addr: &str| {
            let (addr, keys, deadline) = (addr.to_string(), p.keys, p.op_deadline);
            probes.push(match p.api {
                Api::Http => tokio::spawn(workload::probe(addr, keys, base, deadline)),
                Api::Grpc => tokio::spawn(super::grpc::probe(addr, keys, base, deadline)),
            });
        };
        heal(c, injected, &mut said, &mut probe).await?;
        events.extend(said.drain(..).map(|e| stamp(&e)));
        events.push(stamp("healed"));
        windows.push((start, nanos(base.elapsed())));
        tokio::time::sleep(p.settle).await;
    }
    if !load
        .clients
        .acked_at_least(p.min_acked, super::MIN_ACKED_WAIT)
        .await
    {
        events.push(stamp(&format!(
            "fewer than {} writes acknowledged {} s after the last heal",
            p.min_acked,
            super::MIN_ACKED_WAIT.as_secs()
        )));
    }
    let mut recorded = load.stop(&mut events, &stamp).await?;
    for t in probes {
        recorded.recs.extend(t.await.map_err(|e| e.to_string())?);
    }
    let end = Ending {
        fault,
        degraded,
        seed,
        down,
        windows,
    };
    finish(c, end, recorded, base, p, events).await
}

/// What a run's end needs to know of it.
struct Ending {
    fault: Fault,
    degraded: bool,
    seed: u64,
    down: Option<usize>,
    windows: Vec<(u64, u64)>,
}

/// Ends a run: everything healed and running (but the member down for
/// the run, and members replaced), one more linearizable read of every
/// key (so a lost write shows), the watchers finished at the store's
/// revision, `HashKV` compared; then every check.
async fn finish(
    c: &mut ProcCluster,
    end: Ending,
    recorded: Recorded,
    base: Instant,
    p: &Params,
    mut events: Vec<String>,
) -> Result<Report, String> {
    let stamp = |what: &str| format!("{:>7.3} s  {what}", base.elapsed().as_secs_f64());
    let Recorded {
        mut recs,
        watchers,
        compactions,
    } = recorded;
    c.heal().await?;
    for i in 0..c.nodes.len() {
        if Some(i) != end.down && !c.nodes[i].removed && !c.running(i) {
            c.spawn(i).await?;
            events.push(stamp(&format!(
                "restart node {} for the final reads",
                i + 1
            )));
        }
    }
    let live = candidates(c, end.down);
    let leader = c
        .leader(&live, Duration::from_secs(30))
        .await
        .ok_or("no leader within 30 s of the final heal")?;
    let endpoints = c.endpoints();
    final_reads(p.api, &endpoints, &mut recs, base).await?;
    let mut reader = GrpcClient::new(&endpoints);
    reader.deadline = Duration::from_secs(30);
    let target = reader.revision().await?;
    let members: Vec<String> = live
        .iter()
        .filter(|&&i| !c.nodes[i].removed)
        .map(|&i| c.nodes[i].cmd.addr.clone())
        .collect();
    let (streams, short) = watchers.finish(target, members).await?;
    events.push(stamp(&format!(
        "{} watch streams finished at revision {target}",
        streams.len()
    )));
    events.extend(short.iter().map(|e| stamp(e)));
    let members: Vec<usize> = live.into_iter().filter(|&i| !c.nodes[i].removed).collect();
    // A member that does not answer ends the run; what happened goes with
    // the error.
    let (said, hash_mismatches) = compare_hashes(c, &members, leader)
        .await
        .map_err(|e| format!("{e}\n{}", events.join("\n")))?;
    events.extend(said.iter().map(|e| stamp(e)));
    let w = watchers::check(&streams, &recs, compactions);
    let mut report = measure(
        end.fault,
        end.degraded,
        end.seed,
        &recs,
        &end.windows,
        p,
        events,
    );
    report.hash_mismatches = hash_mismatches;
    report.watch_violations = w.violations.len() + short.len();
    report.watch_events = w.events;
    report.watch_covered = w.covered;
    report.watch_resumed = w.resumed;
    report.watch_compacted = w.compacted;
    report.watch_bad = short
        .into_iter()
        .chain(w.violations.iter().map(ToString::to_string))
        .take(WATCH_KEPT)
        .collect();
    Ok(report)
}

/// Watch violations kept in a report.
const WATCH_KEPT: usize = 50;

/// Every member in `members` answers etcd's `HashKV` at the current
/// revision of `leader` (30 s for all to reach it): what each said, and how
/// many disagree ([`super::hashes`]).
pub(super) async fn compare_hashes(
    c: &ProcCluster,
    members: &[usize],
    leader: usize,
) -> Result<(Vec<String>, usize), String> {
    let start = Instant::now();
    let (at, hashes) = super::hashes::collect(c, members, leader, Duration::from_secs(30)).await?;
    let (mut said, bad) = super::hashes::describe(at, &hashes);
    said.push(format!(
        "HashKV compared in {} ms",
        start.elapsed().as_millis()
    ));
    Ok((said, bad))
}

/// One more linearizable read of every key `recs` touched, through
/// `api`, recorded (so a lost write shows); an error if one gets no
/// answer in 30 s.
pub(super) async fn final_reads(
    api: Api,
    endpoints: &[String],
    recs: &mut Vec<Rec>,
    base: Instant,
) -> Result<(), String> {
    let deadline = Duration::from_secs(30);
    let touched: BTreeSet<u32> = recs.iter().map(|r| r.key).collect();
    let mut http = None;
    let mut grpc = GrpcClient::new(endpoints);
    grpc.deadline = deadline;
    for k in touched {
        let invoked = nanos(base.elapsed());
        let found = match api {
            Api::Grpc => grpc.get(&key_name(k)).await.map(|(f, _)| f),
            Api::Http => {
                let reader = match &mut http {
                    Some(r) => r,
                    None => {
                        let mut r = Client::new(endpoints, 99).map_err(|e| e.to_string())?;
                        r.deadline = deadline;
                        http.insert(r)
                    }
                };
                reader
                    .get_entry(&key_name(k))
                    .await
                    .map_err(|e| e.to_string())
            }
        }
        .map_err(|e| format!("final read of {}: {e}", key_name(k)))?;
        recs.push(Rec::read(k, invoked, nanos(base.elapsed()), Some(found)));
    }
    Ok(())
}

/// Holds a fault in force: half the time 50–400 ms (under an election
/// timeout: a node back before anyone stood for election; a partition
/// that flaps), else for a time in `p.hold`; a
/// fault armed to end its node is held until the node exited (a loaded
/// machine may not reach the k-th hit within a short hold), 10 s at most.
/// Returns what happened.
async fn hold(
    c: &mut ProcCluster,
    fault: Fault,
    injected: &super::Injected,
    rng: &mut Rng,
    p: &Params,
) -> Vec<String> {
    let hold = if rng.below(2) == 0 {
        rng.between(Duration::from_millis(50), Duration::from_millis(400))
    } else {
        rng.between(p.hold.0, p.hold.1)
    };
    tokio::time::sleep(hold).await;
    let mut said = Vec::new();
    if fault.ends_the_node() {
        for &t in &injected.killed {
            if let Some(status) = c.exited(t, Duration::from_secs(10)).await {
                said.push(format!("node {} exited: {status}", t + 1));
            }
        }
    }
    said
}

fn overlaps(r: &Rec, windows: &[(u64, u64)], deadline: Duration) -> bool {
    let (a, b) = (r.op.invoked, r.end(deadline));
    windows.iter().any(|&(s, e)| a <= e && b >= s)
}

/// What checking every key's history found.
pub(super) struct Checked {
    /// Keys checked.
    pub keys: usize,
    /// Keys whose history is not linearizable.
    pub violations: usize,
    /// Keys not decided within the budget.
    pub undecided: usize,
    /// The histories of both.
    pub bad_histories: BTreeMap<String, Vec<Op>>,
}

/// Checks each key's history of `recs` within `budget` steps a key.
pub(super) fn check_all(recs: &[Rec], budget: u64) -> Checked {
    let mut by_key: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    for r in recs {
        // A read without an answer says nothing; a write or a CAS without
        // one may or may not have happened (completed is None).
        // A write known not applied is left out.
        let answered_read = matches!(r.op.kind, Kind::Read(_)) && !r.failed;
        let write = matches!(r.op.kind, Kind::Write(_) | Kind::Cas { .. }) && !r.not_applied;
        if answered_read || write {
            by_key.entry(r.key).or_default().push(r.op.clone());
        }
    }
    let mut c = Checked {
        keys: by_key.len(),
        violations: 0,
        undecided: 0,
        bad_histories: BTreeMap::new(),
    };
    for (k, h) in by_key {
        match history::check_bounded(&h, budget) {
            Verdict::Linearizable => continue,
            Verdict::Violation(_) => c.violations += 1,
            Verdict::Undecided { .. } => c.undecided += 1,
        }
        c.bad_histories.insert(key_name(k), h);
    }
    c
}

/// Checks each key's history and measures the run.
pub(super) fn measure(
    fault: Fault,
    degraded: bool,
    seed: u64,
    recs: &[Rec],
    windows: &[(u64, u64)],
    p: &Params,
    events: Vec<String>,
) -> Report {
    let Checked {
        keys,
        violations,
        undecided,
        bad_histories,
    } = check_all(recs, p.check_budget);
    let first_ok = |write: bool, s: u64| {
        recs.iter()
            .filter(|r| !r.failed && r.op.invoked >= s)
            .filter(|r| matches!(r.op.kind, Kind::Write(_)) == write)
            .filter_map(|r| r.op.completed)
            .min()
            .map(|t| (t - s) / 1_000_000)
    };
    let worst = |write: bool| {
        windows
            .iter()
            .map(|&(s, _)| first_ok(write, s))
            .try_fold(0u64, |m, x| x.map(|x| m.max(x)))
    };
    let mut lat: Vec<u64> = recs
        .iter()
        .filter(|r| !r.failed && overlaps(r, windows, p.op_deadline))
        .filter_map(|r| r.op.completed.map(|c| c - r.op.invoked))
        .collect();
    lat.sort_unstable();
    let p99 = (!lat.is_empty()).then(|| {
        let i = (lat.len() * 99).div_ceil(100).saturating_sub(1);
        lat[i] as f64 / 1e6
    });
    let failed = recs.iter().filter(|r| r.failed).count();
    Report {
        fault,
        degraded,
        seed,
        ops: recs.len(),
        ops_in_fault: recs
            .iter()
            .filter(|r| overlaps(r, windows, p.op_deadline))
            .count(),
        acked_writes: recs
            .iter()
            .filter(|r| matches!(r.op.kind, Kind::Write(_)) && r.op.completed.is_some())
            .count(),
        in_doubt: recs
            .iter()
            .filter(|r| r.op.completed.is_none() && !r.not_applied)
            .count(),
        not_applied: recs.iter().filter(|r| r.not_applied).count(),
        violations,
        undecided,
        keys,
        watch_violations: 0,
        watch_events: 0,
        watch_covered: 0,
        watch_resumed: 0,
        watch_compacted: 0,
        watch_bad: Vec::new(),
        hash_mismatches: 0,
        recovery_write_ms: worst(true),
        recovery_read_ms: worst(false),
        error_rate: if recs.is_empty() {
            0.0
        } else {
            failed as f64 / recs.len() as f64
        },
        p99_in_fault_ms: p99,
        events,
        bad_histories,
        log: Vec::new(),
        lag: None,
    }
}

/// The matrix as a Markdown table: a row per fault and cluster shape, its
/// runs summed (operations, writes, problems) or at their worst (recovery,
/// p99; the error rate is the mean).
pub fn table(reports: &[Report]) -> String {
    let mut rows: BTreeMap<(Fault, bool), Vec<&Report>> = BTreeMap::new();
    for r in reports {
        rows.entry((r.fault, r.degraded)).or_default().push(r);
    }
    let mut out = String::from(
        "| fault | members | runs | ops overlapping a fault | acked writes | violations | undecided | watch events | watch violations | HashKV mismatches | first write after fault, worst (ms) | first read after fault, worst (ms) | error rate | p99 during fault (ms) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let ms = |x: Option<u64>| x.map_or("none".to_string(), |x| x.to_string());
    for ((fault, degraded), rs) in rows {
        let worst = |f: &dyn Fn(&Report) -> Option<u64>| {
            rs.iter()
                .map(|r| f(r))
                .try_fold(0u64, |m, x| x.map(|x| m.max(x)))
        };
        let p99 = rs
            .iter()
            .filter_map(|r| r.p99_in_fault_ms)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}% | {} |\n",
            fault.name(),
            if degraded { "2 of 3" } else { "3 of 3" },
            rs.len(),
            rs.iter().map(|r| r.ops_in_fault).sum::<usize>(),
            rs.iter().map(|r| r.acked_writes).sum::<usize>(),
            rs.iter().map(|r| r.violations).sum::<usize>(),
            rs.iter().map(|r| r.undecided).sum::<usize>(),
            rs.iter().map(|r| r.watch_events).sum::<usize>(),
            rs.iter().map(|r| r.watch_violations).sum::<usize>(),
            rs.iter().map(|r| r.hash_mismatches).sum::<usize>(),
            ms(worst(&|r| r.recovery_write_ms)),
            ms(worst(&|r| r.recovery_read_ms)),
            100.0 * rs.iter().map(|r| r.error_rate).sum::<f64>() / rs.len() as f64,
            p99.map_or("none".to_string(), |x| format!("{x:.0}")),
        ));
    }
    out
}
