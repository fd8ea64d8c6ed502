//! The composed journal under shuttle's schedulers: committers and a
//! checkpointer race over SimVfs, a crash is taken at an arbitrary moment,
//! and recovery must find every record acknowledged before it. Each
//! schedule is reproducible: shuttle prints the failing seed, and
//! `JOURNAL_SHUTTLE_SEED` reruns the campaign from it.
//!
//! Built only with `--cfg shuttle` (the journal-sync shim then hands out
//! shuttle's locks, condvars, atomics and threads, so every interleaving
//! point of the whole stack is under the scheduler's control):
//! `cargo xtask shuttle --iterations N`.
#![cfg(shuttle)]

use journal_core::sync::shuttle::scheduler::{PctScheduler, RandomScheduler};
use journal_core::sync::shuttle::{Config, Runner};
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

#[test]
fn random_schedules_of_the_composed_journal() {
    let n = iterations() / 2;
    for (policy, seed) in [
        (BatchPolicy::Adaptive, seed()),
        (BatchPolicy::None, seed() + 1),
    ] {
        let scheduler = RandomScheduler::new_from_seed(seed, n / 2);
        Runner::new(scheduler, Config::new()).run(move || scenario(policy));
    }
    println!("shuttle: {n} random schedules passed");
}

#[test]
fn pct_schedules_of_the_composed_journal() {
    let n = iterations() / 2;
    for (policy, seed) in [
        (BatchPolicy::Adaptive, seed() + 2),
        (BatchPolicy::None, seed() + 3),
    ] {
        let scheduler = PctScheduler::new_from_seed(seed, 3, n / 2);
        Runner::new(scheduler, Config::new()).run(move || scenario(policy));
    }
    println!("shuttle: {n} PCT schedules (depth 3) passed");
}
