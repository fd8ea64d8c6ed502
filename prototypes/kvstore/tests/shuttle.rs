//! kvstore's writers under shuttle's schedulers: puts prepared by their
//! committers (`tree/prepared.rs`) race the combiner and each other on
//! one leaf, a reader reads beside them, and nothing acknowledged may be
//! lost — neither in the store as it runs nor after a power cut.
//!
//! Three threads: a writer, the main thread (writing, then reading), and
//! the store's background worker, checkpointing after every few puts. The
//! tree lock, the pool, the combiner
//! and the journal beneath are all journal-sync's, so every interleaving
//! point is under the scheduler.
//!
//! Built only with `--cfg shuttle` (`cargo xtask shuttle` runs it). A
//! failing schedule is printed by shuttle; `KVSTORE_SHUTTLE_ITERATIONS`
//! sets the schedules per exploration (default 200).
#![cfg(shuttle)]

use journal_core::sync::shuttle::scheduler::{PctScheduler, RandomScheduler};
use journal_core::sync::shuttle::{Config, Runner};
use journal_core::sync::thread;
use journal_core::vfs::{CrashPolicy, SimVfs};
use kvstore::{Options, Store};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn options() -> Options {
    Options {
        journal: journal_core::Options {
            segment_size: 64 << 10,
            logbufs: 2,
            logbsize: 16 << 10,
            preallocate_ahead: 1,
            max_segments: 4,
            background_preallocation: false,
            ..journal_core::Options::default()
        },
        checkpoint_interval: None,
        // The worker checkpoints after every few puts: pages go home (and
        // the log's tail moves) while the writers prepare and apply.
        checkpoint_log_bytes: 2 << 10,
        ..Options::default()
    }
}

/// Rounds of puts per writer.
const ROUNDS: u32 = 3;

fn key(i: u32) -> Vec<u8> {
    format!("k{i:02}").into_bytes()
}

/// Writer `w`'s `n`th value of key `k`.
fn value(w: u8, k: u32, n: u32) -> Vec<u8> {
    format!("w{w}-k{k}-n{n}").into_bytes()
}

/// Two writers put keys of one leaf (their own keys, interleaved, so each
/// put changes the leaf the other's prepared put was made on), while the
/// other's puts land; then every key holds its writer's last value, in
/// the store and after a power cut.
fn scenario(checkpointed: &AtomicUsize) {
    let vfs = SimVfs::new();
    let store = Arc::new(
        Store::open_with(Arc::new(vfs.clone()), "/db", options()).expect("the store opens"),
    );
    for k in 0..8 {
        store.put(&key(k), b"initial").unwrap();
    }
    // Writer 0 owns the even keys, writer 1 the odd ones; each puts
    // ROUNDS rounds.
    let run = |s: &Store, w: u8| {
        for n in 0..ROUNDS {
            for k in (u32::from(w)..8).step_by(2) {
                s.put(&key(k), &value(w, k, n)).unwrap();
            }
        }
    };
    let s = store.clone();
    let other = thread::spawn(move || run(&s, 1));
    run(&store, 0);
    // A reader beside the other writer: an even key is writer 0's, done.
    assert_eq!(
        store.get(&key(0)).unwrap(),
        Some(value(0, 0, ROUNDS - 1)),
        "a reader saw an old value of a finished writer's key"
    );
    other.join().unwrap();
    let check = |s: &Store, when: &str| {
        for k in 0..8 {
            let w = (k % 2) as u8;
            assert_eq!(
                s.get(&key(k)).unwrap(),
                Some(value(w, k, ROUNDS - 1)),
                "key {k} {when}: a put acknowledged and lost"
            );
        }
    };
    check(&store, "as the store runs");
    let problems = store.check().unwrap();
    assert!(problems.is_empty(), "the tree is unsound: {problems:?}");
    // Every put was durable when it returned: a power cut keeps them all.
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    let store = Arc::into_inner(store).expect("the writer is done");
    store.close().unwrap();
    let reopened = Store::open_with(Arc::new(image), "/db", options()).expect("recovery");
    check(&reopened, "after a power cut");
    // 32 puts in all: fewer records replayed means a checkpoint ran.
    if reopened.recovery_info().records < 32 {
        checkpointed.fetch_add(1, Ordering::Relaxed);
    }
    reopened.close().unwrap();
}

fn iterations() -> usize {
    std::env::var("KVSTORE_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

/// The seed of both explorations: every run explores the same schedules.
const SEED: u64 = 0x6b76_5eed;

/// Runs `scheduler`'s exploration; some of its schedules must have
/// checkpointed before the power cut, or the model does not cover what it
/// says. (`checkpointed` is a tally of the exploration, outside the model.)
fn explore(
    scheduler: impl journal_core::sync::shuttle::scheduler::Scheduler + 'static,
    checkpointed: &'static AtomicUsize,
) {
    Runner::new(scheduler, Config::new()).run(|| scenario(checkpointed));
    assert!(
        checkpointed.load(Ordering::Relaxed) > 0,
        "no schedule checkpointed before its power cut"
    );
}

#[test]
fn prepared_puts_under_random_schedules() {
    static CHECKPOINTED: AtomicUsize = AtomicUsize::new(0);
    explore(
        RandomScheduler::new_from_seed(SEED, iterations()),
        &CHECKPOINTED,
    );
}

#[test]
fn prepared_puts_under_pct_schedules() {
    static CHECKPOINTED: AtomicUsize = AtomicUsize::new(0);
    // Depth 3: two priority changes a run, the preemption bound the
    // workspace keeps in CI.
    explore(
        PctScheduler::new_from_seed(SEED, 3, iterations()),
        &CHECKPOINTED,
    );
}
