//! The store's crash campaign on SimVfs, under both crash policies:
//! half the seeds start from a bulk-loaded store; transactions from
//! several threads (one value in eight an overflow chain), checkpoints
//! running, a crash at a random moment (also in the middle of a checkpoint writing pages home,
//! or of the pool stealing a page: the cache holds 24 pages),
//! recovery, and the checks: every transaction whose `commit()` returned is
//! there whole; no transaction is there in part; nothing appears that was
//! never written; `check` finds the pages sound. Each open picks one of the
//! two torn-page defences (full-page images or the double-write buffer). Seeded; a failure prints
//! its seed (`KVSTORE_CRASH_SEED=N` reruns it). `cargo test` runs a fixed
//! number of seeds (`SEEDS`, or `KVSTORE_CRASH_SEEDS`); `KVSTORE_CRASH_SECONDS`
//! runs them for a time budget instead.

use journal_core::vfs::{CrashPolicy, SimVfs, SplitMix64, Vfs};
use kvstore::{Options, Store, TornPages};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn options(torn_pages: TornPages) -> Options {
    Options {
        torn_pages,
        journal: journal_core::Options {
            segment_size: 256 << 10,
            logbufs: 4,
            logbsize: 64 << 10,
            max_segments: 8,
            ..journal_core::Options::default()
        },
        // 24 frames: pages are stolen (written home and evicted between
        // checkpoints) all the time, so crashes land among those writes too.
        cache_bytes: 24 * (4096 + 128),
        checkpoint_interval: None,
        checkpoint_log_bytes: u64::MAX,
        ..Options::default()
    }
}

/// Opens the store on `vfs`, each open with one of the two torn-page
/// defences picked by `rng` (recovery repairs by whichever the crashed
/// run used).
fn open(vfs: &SimVfs, rng: &mut SplitMix64) -> Store {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    let torn = if rng.chance(1, 2) {
        TornPages::DoubleWrite
    } else {
        TornPages::FullPageImages
    };
    Store::open_with(v, "/db", options(torn)).unwrap_or_else(|e| panic!("recovery failed: {e}"))
}

/// A transaction as issued: the keys it puts (with their values), or the
/// transaction whose keys it deletes.
#[derive(Clone, Debug)]
enum Txn {
    Put(Vec<(Vec<u8>, Vec<u8>)>),
    Delete(u64),
}

#[derive(Default)]
struct Log {
    /// Every transaction issued (committed or not), by id.
    issued: BTreeMap<u64, Txn>,
    /// Ids whose `commit()` returned.
    acked: BTreeSet<u64>,
}

/// The value transaction `txn` puts at `key`: one in eight an overflow
/// chain of two to five pages (so chains are freed, their pages listed
/// in free-list trunks and reused, around every crash), the rest small.
fn value(key: &[u8], txn: u64) -> Vec<u8> {
    let mut v = format!("{txn}:").into_bytes();
    v.extend_from_slice(key);
    let len = match txn % 8 {
        5 => 5_000 + (txn as usize).wrapping_mul(997) % 12_000,
        _ => 20 + (txn as usize * 13) % 180,
    };
    v.resize(len, b'.');
    v
}

fn worker(store: Arc<Store>, log: Arc<Mutex<Log>>, stop: Arc<AtomicBool>, thread: u64, seed: u64) {
    let mut rng = SplitMix64::new(seed ^ (thread << 40));
    let mut mine: Vec<u64> = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) && n < 400 {
        let id = (thread << 32) | n;
        n += 1;
        let txn = if !mine.is_empty() && rng.chance(1, 5) {
            Txn::Delete(mine.remove(rng.below(mine.len() as u64) as usize))
        } else {
            let keys = (0..rng.range(1, 4))
                .map(|i| {
                    let k = format!("t{thread}-{n}-{i}").into_bytes();
                    let v = value(&k, id);
                    (k, v)
                })
                .collect();
            Txn::Put(keys)
        };
        let mut t = store.transaction();
        match &txn {
            Txn::Put(kv) => {
                for (k, v) in kv {
                    t.put(k, v);
                }
            }
            Txn::Delete(target) => {
                let Txn::Put(kv) = &log.lock().unwrap().issued[target] else {
                    unreachable!("only puts are deleted")
                };
                for (k, _) in kv {
                    t.delete(k);
                }
            }
        }
        log.lock().unwrap().issued.insert(id, txn.clone());
        let no_wait = rng.chance(1, 6);
        let r = if no_wait {
            t.commit_no_wait()
        } else {
            t.commit()
        };
        if r.is_err() {
            return; // the store was closed under us
        }
        if !no_wait {
            log.lock().unwrap().acked.insert(id);
        }
        if let Txn::Put(_) = txn {
            mine.push(id);
        }
    }
}

/// Checks a recovered store against what was issued and acknowledged.
fn verify(store: &Store, log: &Log, ctx: &str) {
    let all: BTreeMap<Vec<u8>, Vec<u8>> = store.scan(..).unwrap().into_iter().collect();
    let mut known = BTreeSet::new();
    let deleted_by: BTreeMap<u64, u64> = log
        .issued
        .iter()
        .filter_map(|(id, t)| match t {
            Txn::Delete(target) => Some((*target, *id)),
            Txn::Put(_) => None,
        })
        .collect();
    for (id, t) in &log.issued {
        let Txn::Put(kv) = t else { continue };
        let present: Vec<bool> = kv
            .iter()
            .map(|(k, v)| {
                known.insert(k.clone());
                match all.get(k) {
                    Some(got) => {
                        assert_eq!(
                            got,
                            v,
                            "{ctx}: txn {id:#x} key {:?} has a wrong value",
                            String::from_utf8_lossy(k)
                        );
                        true
                    }
                    None => false,
                }
            })
            .collect();
        let whole = present.iter().all(|p| *p);
        let none = present.iter().all(|p| !*p);
        assert!(
            whole || none,
            "{ctx}: txn {id:#x} is there in part: {present:?}"
        );
        let deleted = deleted_by.get(id);
        if log.acked.contains(id) && none {
            assert!(deleted.is_some(), "{ctx}: acknowledged txn {id:#x} lost");
        }
        if whole {
            if let Some(d) = deleted {
                assert!(
                    !log.acked.contains(d),
                    "{ctx}: txn {id:#x} survived its acknowledged delete {d:#x}"
                );
            }
        }
    }
    for k in all.keys() {
        assert!(
            known.contains(k),
            "{ctx}: key {:?} was never written",
            String::from_utf8_lossy(k)
        );
    }
    let problems = store.check().unwrap();
    assert!(problems.is_empty(), "{ctx}: check: {problems:?}");
}

fn run_seed(seed: u64) -> u64 {
    let mut rng = SplitMix64::new(seed);
    let mut vfs = SimVfs::new();
    let log = Arc::new(Mutex::new(Log::default()));
    let mut states = 0;
    for round in 0..3u64 {
        let ctx = format!("seed {seed} round {round}");
        let store = Arc::new(open(&vfs, &mut rng));
        if round > 0 {
            verify(&store, &log.lock().unwrap(), &ctx);
            states += 1;
        } else if rng.chance(1, 2) {
            bulk_load(&store, &log, rng.range(1, 600));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..rng.range(1, 4))
            .map(|t| {
                let (s, l, st) = (store.clone(), log.clone(), stop.clone());
                let thread = round * 10 + t;
                std::thread::spawn(move || worker(s, l, st, thread, seed))
            })
            .collect();
        // Checkpoints while they run; the crash comes at a random moment,
        // half the time in the middle of a checkpoint.
        let target = rng.range(5, 300) as usize;
        let (snapshot, image) = loop {
            let mid_checkpoint = rng.chance(1, 2);
            let policy = if rng.chance(1, 2) {
                CrashPolicy::DropUnsynced
            } else {
                CrashPolicy::TornSectors {
                    seed: rng.next_u64(),
                }
            };
            let acked_now = log.lock().unwrap().acked.len();
            let done = threads.iter().all(|t| t.is_finished());
            if acked_now >= target || done {
                let snapshot = log.lock().unwrap().clone_acked();
                if mid_checkpoint {
                    vfs.arm_crash(rng.range(1, 40), policy);
                    let _ = store.checkpoint();
                    if let Some(img) = vfs.take_crash() {
                        break (snapshot, img);
                    }
                }
                break (snapshot, vfs.crash(policy));
            }
            if rng.chance(1, 3) {
                store.checkpoint().unwrap();
            }
            std::thread::yield_now();
        };
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        drop(store);
        vfs = image;
        // What survives must include what was acknowledged before the crash.
        let mut l = log.lock().unwrap();
        l.acked = snapshot;
    }
    let store = open(&vfs, &mut rng);
    verify(&store, &log.lock().unwrap(), &format!("seed {seed} final"));
    states + 1
}

/// Fills the new store with `n` keys by a bulk load, logged as one
/// acknowledged transaction (a load is all or nothing, and durable once
/// `finish` returns); the crashes after it land on its pages too.
fn bulk_load(store: &Store, log: &Mutex<Log>, n: u64) {
    let id = 1 << 60;
    let kv: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            let k = format!("b{i:05}").into_bytes();
            let v = value(&k, id + i);
            (k, v)
        })
        .collect();
    let mut l = store.bulk_load().unwrap();
    for (k, v) in &kv {
        l.push(k, v).unwrap();
    }
    l.finish().unwrap();
    let mut log = log.lock().unwrap();
    log.issued.insert(id, Txn::Put(kv));
    log.acked.insert(id);
}

impl Log {
    fn clone_acked(&self) -> BTreeSet<u64> {
        self.acked.clone()
    }
}

/// Seeds `cargo test` runs: the same cases on any machine (`KVSTORE_CRASH_SECONDS`
/// runs seeds for a time budget instead).
const SEEDS: u64 = 60;

#[test]
fn store_crash_campaign() {
    if let Ok(s) = std::env::var("KVSTORE_CRASH_SEED") {
        let n = run_seed(s.parse().expect("a seed"));
        println!("kvstore crash campaign: 1 seed, {n} crash states");
        return;
    }
    let budget: Option<f64> = std::env::var("KVSTORE_CRASH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let fixed: u64 = std::env::var("KVSTORE_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS);
    let start = Instant::now();
    let (mut seeds, mut states) = (0u64, 0u64);
    while match budget {
        Some(b) => seeds == 0 || start.elapsed().as_secs_f64() < b,
        None => seeds < fixed,
    } {
        let seed = seeds;
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok(n) => states += n,
            Err(e) => {
                eprintln!("kvstore crash campaign failed at seed {seed}; rerun with KVSTORE_CRASH_SEED={seed}");
                std::panic::resume_unwind(e);
            }
        }
        seeds += 1;
    }
    println!(
        "kvstore crash campaign: {seeds} seeds, {states} crash states in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(states >= 3 * seeds);
}
