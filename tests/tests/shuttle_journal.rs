//! The composed journal under shuttle's schedulers: committers and a
//! checkpointer race over SimVfs, a crash is taken at an arbitrary moment,
//! and recovery must find every record acknowledged before it.
//!
//! Every failure replays. A failing schedule is saved to a file under
//! `target/shuttle-failures/`, and the harness prints the one command that
//! replays exactly it:
//! `JOURNAL_SHUTTLE_REPLAY=<run>:<file or schedule string> cargo xtask shuttle`,
//! where `<run>` names which of the four explorations failed
//! (`random-adaptive`, `random-none`, `pct-adaptive`, `pct-none`);
//! `shuttle::replay` then drives the same scenario through that one
//! schedule, and nothing else runs. `JOURNAL_SHUTTLE_SEED` reruns whole
//! explorations from another seed.
//!
//! Built only with `--cfg shuttle` (the journal-sync shim then hands out
//! shuttle's locks, condvars, atomics and threads, so every interleaving
//! point of the whole stack is under the scheduler's control):
//! `cargo xtask shuttle --iterations N`.
#![cfg(shuttle)]

use journal_core::sync::shuttle::scheduler::{PctScheduler, RandomScheduler};
use journal_core::sync::shuttle::{Config, FailurePersistence, Runner};
use journal_core::sync::{thread, Mutex};
use journal_core::vfs::{CrashPolicy, SimVfs};
use journal_core::{BatchPolicy, Lsn, Options};
use journal_tests::{open_sim, payload, verify};
use std::sync::Arc;

fn options(policy: BatchPolicy) -> Options {
    Options {
        segment_size: 64 << 10,
        logbufs: 2,
        logbsize: 16 << 10,
        preallocate_ahead: 1,
        max_segments: 4,
        background_preallocation: false,
        batch_policy: policy,
        ..Options::default()
    }
}

type Acked = Arc<Mutex<Vec<(Lsn, Vec<u8>)>>>;

/// Two committers and a checkpointer; a crash image taken while they run;
/// recovery checked against what was acknowledged before it.
fn scenario(policy: BatchPolicy) {
    let vfs = SimVfs::new();
    let opts = options(policy);
    let j = Arc::new(open_sim(&vfs, opts).unwrap());
    let acked: Acked = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..2u8)
        .map(|w| {
            let (j, acked) = (j.clone(), acked.clone());
            thread::spawn(move || {
                for s in 0..12u32 {
                    let p = payload(w, s, 300 + 700 * (s as usize % 3));
                    let lsn = match s % 3 {
                        0 => {
                            let l = j.append(&p).unwrap();
                            j.commit(l).unwrap();
                            l
                        }
                        1 => j.append_durable(&p).unwrap(),
                        _ => {
                            // Appended, never committed: not acknowledged.
                            j.append(&p).unwrap();
                            continue;
                        }
                    };
                    acked.lock().push((lsn, p));
                }
            })
        })
        .collect();
    // The checkpointer: moves the tail behind what is acknowledged.
    let mut image = None;
    for round in 0..3 {
        let redo = acked.lock().iter().map(|(l, _)| *l).min();
        if let Some(redo) = redo {
            if redo >= j.redo_lsn() {
                j.checkpoint(redo).unwrap();
            }
        }
        if round == 1 {
            // A power cut now: what was acknowledged before it must survive.
            let before = acked.lock().clone();
            image = Some((before, vfs.crash(CrashPolicy::DropUnsynced)));
        }
        thread::yield_now();
    }
    for w in writers {
        w.join().unwrap();
    }
    let (before, image) = image.expect("the crash was taken");
    let recovered = open_sim(&image, opts).expect("recovery after the crash");
    verify(&recovered, &before, "shuttle crash image");
    // And the whole run, closed cleanly.
    j.close().unwrap();
    drop(j);
    let all = acked.lock().clone();
    let reopened = open_sim(&vfs.crash(CrashPolicy::DropUnsynced), opts).unwrap();
    verify(&reopened, &all, "shuttle after close");
}

fn iterations() -> usize {
    std::env::var("JOURNAL_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
}

fn seed() -> u64 {
    std::env::var("JOURNAL_SHUTTLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed)
}

/// The directory failing schedules are saved in (the workspace's target).
fn failures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/shuttle-failures")
}

/// The policy of the scenario each exploration runs.
fn policy_of(run: &str) -> Option<BatchPolicy> {
    match run.rsplit('-').next()? {
        "adaptive" => Some(BatchPolicy::Adaptive),
        "none" => Some(BatchPolicy::None),
        _ => None,
    }
}

/// `JOURNAL_SHUTTLE_REPLAY=<run>:<schedule file or string>`, when set.
fn replay_request() -> Option<(String, String)> {
    let v = std::env::var("JOURNAL_SHUTTLE_REPLAY").ok()?;
    let (run, what) = v
        .split_once(':')
        .unwrap_or_else(|| panic!("JOURNAL_SHUTTLE_REPLAY wants <run>:<schedule>, got {v:?}"));
    Some((run.to_string(), what.to_string()))
}

/// Runs exploration `run` under `scheduler`, or, when a replay is asked
/// for, replays that schedule if it is `run`'s (and explores nothing). A failure saves its schedule and prints the replay command.
fn explore<S>(run: &str, scheduler: S)
where
    S: journal_core::sync::shuttle::scheduler::Scheduler + 'static,
{
    let policy = policy_of(run).expect("a known run name");
    if let Some((asked, what)) = replay_request() {
        assert!(
            policy_of(&asked).is_some()
                && (asked.starts_with("random-") || asked.starts_with("pct-")),
            "JOURNAL_SHUTTLE_REPLAY names no run: {asked:?}"
        );
        // A replay runs that one schedule and no exploration.
        if asked == run {
            println!("shuttle: replaying one schedule of {run}");
            let f = move || scenario(policy);
            if std::path::Path::new(&what).is_file() {
                journal_core::sync::shuttle::replay_from_file(f, &what);
            } else {
                journal_core::sync::shuttle::replay(f, &what);
            }
            println!("shuttle: the schedule passed");
        }
        return;
    }
    let dir = failures_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let before: std::collections::BTreeSet<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let mut config = Config::new();
    config.failure_persistence = FailurePersistence::File(Some(dir.clone()));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Runner::new(scheduler, config).run(move || scenario(policy))
    }));
    if let Err(panic) = outcome {
        // The first schedule saved is the failure's; shuttle may save
        // another while tearing the failed execution down.
        let mut saved: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !before.contains(p))
            .collect();
        saved.sort();
        if let Some(path) = saved.into_iter().next() {
            let path = path.canonicalize().unwrap_or(path);
            eprintln!(
                "shuttle: {run} failed; replay exactly this schedule with\n  \
                 JOURNAL_SHUTTLE_REPLAY={run}:{} cargo xtask shuttle",
                path.display()
            );
        }
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn random_schedules_of_the_composed_journal() {
    let n = iterations() / 2;
    let runs = ["random-adaptive", "random-none"];
    for (run, seed) in runs.iter().zip([seed(), seed() + 1]) {
        explore(run, RandomScheduler::new_from_seed(seed, n / 2));
    }
    if replay_request().is_none() {
        println!("shuttle: {n} random schedules passed");
    }
}

#[test]
fn pct_schedules_of_the_composed_journal() {
    let n = iterations() / 2;
    let runs = ["pct-adaptive", "pct-none"];
    for (run, seed) in runs.iter().zip([seed() + 2, seed() + 3]) {
        explore(run, PctScheduler::new_from_seed(seed, 3, n / 2));
    }
    if replay_request().is_none() {
        println!("shuttle: {n} PCT schedules (depth 3) passed");
    }
}
