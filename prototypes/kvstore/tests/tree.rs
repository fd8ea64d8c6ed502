//! The B+tree engine: a model check against a `BTreeMap` (puts, deletes,
//! overflow values, splits and freed pages, a cache small enough to evict
//! constantly, reopens); iterators that see one snapshot under concurrent
//! writers, never half a transaction; the page versions a long iterator
//! holds (spilled past their memory bound, expired past the spill bound
//! or when the spill file fails, kept while another iterator reads them);
//! memory bounded by the cache; and a
//! data-file write failure during a checkpoint, which poisons the store
//! and loses nothing; and pages torn at home put back from the
//! double-write area.

use journal_core::vfs::{CrashPolicy, Fault, Op as VfsOp, OpenOptions, SimVfs, SplitMix64, Vfs};
use kvstore::{Error, Options, Store, TornPages};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;
use common::{options, sim_open};

fn value(rng: &mut SplitMix64) -> Vec<u8> {
    let len = match rng.below(100) {
        0..=89 => rng.below(200),
        90..=97 => rng.range(200, 3000),
        _ => rng.range(3000, 20_000),
    };
    let mut v = vec![0u8; len as usize];
    rng.fill(&mut v);
    v
}

fn key(rng: &mut SplitMix64) -> Vec<u8> {
    let n = rng.below(1500);
    let mut k = format!("k{n:05}").into_bytes();
    k.resize(6 + (n % 7) as usize * 9, b'.');
    k
}

fn compare(s: &Store, model: &BTreeMap<Vec<u8>, Vec<u8>>, rng: &mut SplitMix64, ctx: &str) {
    for _ in 0..40 {
        let k = key(rng);
        assert_eq!(s.get(&k).unwrap().as_ref(), model.get(&k), "{ctx}: get");
    }
    let (a, b) = (key(rng), key(rng));
    let (a, b) = if a <= b { (a, b) } else { (b, a) };
    let got: Vec<_> = s
        .range(a.clone()..b.clone())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let want: Vec<_> = model
        .range(a..b)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(got, want, "{ctx}: range");
    let p = format!("k0{}", rng.below(10)).into_bytes();
    let got = s.prefix(&p).unwrap().count();
    assert_eq!(
        got,
        model.keys().filter(|k| k.starts_with(&p)).count(),
        "{ctx}: prefix"
    );
}

#[test]
fn the_tree_matches_a_model_through_splits_deletes_evictions_and_reopens() {
    for seed in 0..4u64 {
        let vfs = SimVfs::new();
        let mut s = sim_open(&vfs, options(24)).unwrap();
        let mut model = BTreeMap::new();
        let mut rng = SplitMix64::new(seed);
        for i in 0..4000u32 {
            let ctx = format!("seed {seed} op {i}");
            let mut t = s.transaction();
            let mut staged = model.clone();
            for _ in 0..if rng.chance(1, 10) {
                rng.range(2, 9)
            } else {
                1
            } {
                let k = key(&mut rng);
                if rng.chance(3, 10) {
                    t.delete(&k);
                    staged.remove(&k);
                } else {
                    let v = value(&mut rng);
                    t.put(&k, &v);
                    staged.insert(k, v);
                }
            }
            t.commit().unwrap();
            model = staged;
            if i % 500 == 499 {
                compare(&s, &model, &mut rng, &ctx);
            }
            if i == 2000 {
                s.checkpoint().unwrap();
            }
            if i == 3000 {
                // A crash with everything committed durable: redo rebuilds.
                let image = vfs.crash(CrashPolicy::DropUnsynced);
                drop(s);
                s = sim_open(&image, options(24)).unwrap();
                compare(&s, &model, &mut rng, &format!("{ctx} after a crash"));
            }
        }
        let all: Vec<_> = s.scan(..).unwrap();
        assert_eq!(all.len(), model.len(), "seed {seed}");
        assert!(all
            .iter()
            .zip(&model)
            .all(|(a, b)| (&a.0, &a.1) == (b.0, b.1)));
        assert_eq!(s.check().unwrap(), Vec::<String>::new(), "seed {seed}");
        let stats = s.cache_stats();
        assert!(stats.pages <= stats.capacity_pages + 64, "{stats:?}");
    }
}

/// Writers rewrite whole groups of ten keys in one transaction each;
/// iterators must always find every group uniform.
#[test]
fn iterators_see_one_snapshot_never_half_a_transaction() {
    let tmp = tempfile::tempdir().unwrap();
    // A cache whose version bound (a quarter of it) holds a version of
    // every leaf: the iterators here must not expire (that is the next
    // test's subject).
    let s = Arc::new(Store::open(tmp.path().join("db"), options(1024)).unwrap());
    let groups = 60u32;
    let mut t = s.transaction();
    for g in 0..groups {
        for i in 0..10 {
            t.put(format!("g{g:03}/{i}").as_bytes(), b"0");
        }
    }
    t.commit().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(w);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && n < 3000 {
                    n += 1;
                    let g = rng.below(u64::from(groups));
                    let v = format!("{w}-{n}-{}", "x".repeat(rng.below(300) as usize));
                    let mut t = s.transaction();
                    for i in 0..10 {
                        t.put(format!("g{g:03}/{i}").as_bytes(), v.as_bytes());
                    }
                    if n.is_multiple_of(2) {
                        t.commit().unwrap();
                    } else {
                        t.commit_no_wait().unwrap();
                    }
                }
            })
        })
        .collect();
    for round in 0..40 {
        let it = s.prefix(b"g").unwrap();
        // A key written after the iterator was made, inside its prefix,
        // is not in it (the row count below would catch it).
        s.put(format!("g~late-{round}").as_bytes(), b"x").unwrap();
        let mut rows = Vec::new();
        for (n, r) in it.enumerate() {
            rows.push(r.unwrap());
            if n % 50 == 0 {
                std::thread::yield_now();
            }
        }
        // The groups, then the late keys of the earlier rounds ('~' sorts
        // after the digits): this round's is not there.
        let (group_rows, late_rows) = rows.split_at(rows.len().min(groups as usize * 10));
        assert_eq!(group_rows.len(), groups as usize * 10, "round {round}");
        assert_eq!(late_rows.len(), round, "round {round}: late keys");
        for chunk in group_rows.chunks(10) {
            assert!(
                chunk.iter().all(|(_, v)| *v == chunk[0].1),
                "round {round}: half a transaction in {:?}",
                String::from_utf8_lossy(&chunk[0].0)
            );
        }
        // A new iterator sees every late key written so far.
        let late = s.prefix(b"g~late-").unwrap().count();
        assert_eq!(late, round + 1, "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    assert_eq!(
        s.cache_stats().version_bytes,
        0,
        "closed iterators keep no versions"
    );
}

/// 6,000 keys; an iterator opened after the first key; then every key
/// rewritten `rounds` times in transactions of 200 while it is open.
fn long_iterator_beside_rewrites(s: &Store, rounds: u8) -> kvstore::Iter {
    let v = vec![7u8; 150];
    for i in 0..6000u32 {
        s.put(format!("key-{i:05}").as_bytes(), &v).unwrap();
    }
    let mut it = s.range(..).unwrap();
    assert_eq!(it.next().unwrap().unwrap().1, v);
    for round in 0..rounds {
        let mut t = s.transaction();
        for i in 0..6000u32 {
            t.put(format!("key-{i:05}").as_bytes(), &[round; 150]);
            if i % 200 == 199 {
                std::mem::replace(&mut t, s.transaction()).commit().unwrap();
            }
        }
        t.commit().unwrap();
    }
    it
}

/// Rewrites every key of `long_iterator_beside_rewrites`'s store to
/// `byte`, in transactions of 200.
fn rewrite_all(s: &Store, byte: u8) {
    for chunk in 0..30u32 {
        let mut t = s.transaction();
        for i in chunk * 200..(chunk + 1) * 200 {
            t.put(format!("key-{i:05}").as_bytes(), &[byte; 150]);
        }
        t.commit().unwrap();
    }
}

/// Reads the rest of `it`, which was opened when every key held `byte`
/// and has returned the first key.
fn rest_is(it: kvstore::Iter, byte: u8) {
    let rest: Vec<_> = it.collect::<kvstore::Result<_>>().unwrap();
    assert_eq!(rest.len(), 5999);
    for (i, (k, v)) in rest.iter().enumerate() {
        assert_eq!(k, format!("key-{:05}", i + 1).as_bytes());
        assert_eq!(v, &vec![byte; 150], "key {i}: not the snapshot's value");
    }
}

/// A snapshot's close looks only at the versions kept while it was open
/// (it cannot be the last reader of older ones); those another open
/// snapshot still reads stay, whichever of the two closes first.
#[test]
fn closing_one_of_two_iterators_keeps_the_versions_the_other_reads() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(64)).unwrap();
    let older = long_iterator_beside_rewrites(&s, 0);
    s.put(b"zzz", b"after the older one").unwrap();
    let mut younger = s.range(..).unwrap();
    younger.next().unwrap().unwrap();
    rewrite_all(&s, 1);
    drop(younger);
    rest_is(older, 7);
    // The other way round: the older one closes first.
    s.delete(b"zzz").unwrap();
    let mut older = s.range(..).unwrap();
    older.next().unwrap().unwrap();
    s.put(b"zzz", b"after the older one").unwrap();
    let mut younger = s.range(..).unwrap();
    younger.next().unwrap().unwrap();
    rewrite_all(&s, 2);
    drop(older);
    let rest: Vec<_> = younger.collect::<kvstore::Result<_>>().unwrap();
    assert_eq!(rest.len(), 6000, "5,999 keys and zzz");
    assert!(rest[..5999].iter().all(|(_, v)| v == &vec![1u8; 150]));
    let stats = s.cache_stats();
    assert_eq!((stats.version_bytes, stats.spilled_bytes), (0, 0));
}

/// The bound on versions in memory: a quarter of the cache, and never
/// under 64 frames.
const VERSION_LIMIT: usize = 64 * (4096 + 128);

#[test]
fn a_long_iterator_spills_its_versions_and_reads_its_snapshot_whole() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(64)).unwrap();
    let mut it = long_iterator_beside_rewrites(&s, 3);
    let stats = s.cache_stats();
    assert!(stats.version_bytes <= VERSION_LIMIT, "{stats:?}");
    assert!(stats.spilled_bytes > 0, "{stats:?}");
    // The rest of the snapshot, read partly back from the spill file.
    let rest: Vec<_> = it.by_ref().collect::<kvstore::Result<_>>().unwrap();
    assert_eq!(rest.len(), 5999);
    for (i, (k, v)) in rest.iter().enumerate() {
        assert_eq!(k, format!("key-{:05}", i + 1).as_bytes());
        assert_eq!(v, &vec![7u8; 150], "key {i}: not the snapshot's value");
    }
    drop(it);
    let stats = s.cache_stats();
    assert_eq!((stats.version_bytes, stats.spilled_bytes), (0, 0));
    // The scratch file is cut back once no version is spilled, and goes
    // with the store.
    let spill = std::path::Path::new("/db/snapshots.spill");
    assert_eq!(
        vfs.open(spill, OpenOptions::read()).unwrap().len().unwrap(),
        0
    );
    s.close().unwrap();
    assert!(!vfs.exists(spill).unwrap());
}

#[test]
fn versions_kept_for_an_iterator_take_their_frames_from_the_cache() {
    // A store larger than its cache of 256 frames, rewritten beside an
    // open iterator: the versions kept for it in memory (up to 64 frames
    // here) count against the cache, so frames and versions together
    // stay within the cache's bytes.
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(256)).unwrap();
    let it = long_iterator_beside_rewrites(&s, 3);
    let stats = s.cache_stats();
    assert!(stats.version_bytes > 0, "{stats:?}");
    let frame = 4096 + 128;
    assert!(
        stats.pages * frame + stats.version_bytes <= stats.capacity_pages * frame,
        "{stats:?}"
    );
    drop(it);
}

#[test]
fn a_long_iterator_expires_past_the_spill_bound() {
    for spill_pages in [0u64, 200] {
        let vfs = SimVfs::new();
        let o = Options {
            snapshot_spill_bytes: spill_pages * 4096,
            ..options(64)
        };
        let s = sim_open(&vfs, o).unwrap();
        let mut it = long_iterator_beside_rewrites(&s, 3);
        let stats = s.cache_stats();
        assert!(stats.version_bytes <= VERSION_LIMIT, "{stats:?}");
        assert!(stats.spilled_bytes <= spill_pages * 4096, "{stats:?}");
        let rest: Vec<_> = it.by_ref().collect();
        assert!(
            matches!(rest.last(), Some(Err(Error::SnapshotTooOld))),
            "spill bound {spill_pages} pages: the iterator expired: {:?}",
            rest.last().map(|r| r.as_ref().map(|_| ()))
        );
        drop(it);
        assert_eq!(s.cache_stats().version_bytes, 0);
        assert_eq!(s.cache_stats().spilled_bytes, 0);
    }
}

#[test]
fn a_failed_spill_expires_the_iterator_not_the_store() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(64)).unwrap();
    vfs.inject(Fault::eio(VfsOp::Write, 1).on("/db/snapshots.spill"));
    let mut it = long_iterator_beside_rewrites(&s, 3);
    let rest: Vec<_> = it.by_ref().collect();
    assert!(
        matches!(rest.last(), Some(Err(Error::SnapshotTooOld))),
        "{:?}",
        rest.last().map(|r| r.as_ref().map(|_| ()))
    );
    drop(it);
    // The store is not poisoned: scratch space failing is the iterator's
    // problem only.
    s.put(b"after", b"x").unwrap();
    assert_eq!(s.get(b"key-00042").unwrap(), Some(vec![2u8; 150]));
    assert_eq!(s.scan(..).unwrap().len(), 6001);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

#[test]
fn memory_stays_within_the_cache_while_the_data_outgrows_it() {
    let vfs = SimVfs::new();
    // No checkpoint at all: the recovery below replays every record
    // (a volume-triggered one in the background would make it depend on
    // timing).
    let o = Options {
        checkpoint_log_bytes: u64::MAX,
        ..options(128)
    };
    let s = sim_open(&vfs, o).unwrap();
    let mut rng = SplitMix64::new(3);
    for c in 0..40u32 {
        let mut t = s.transaction();
        for i in 0..1000u32 {
            let mut v = vec![0u8; 100];
            rng.fill(&mut v);
            t.put(
                format!("{:08}", (c * 1000 + i).wrapping_mul(2_654_435_761)).as_bytes(),
                &v,
            );
        }
        t.commit().unwrap();
        let st = s.cache_stats();
        assert!(st.pages <= st.capacity_pages + 64, "after {c}: {st:?}");
    }
    let st = s.cache_stats();
    assert!(st.file_pages as usize > 8 * st.capacity_pages, "{st:?}");
    assert_eq!(s.scan(..).unwrap().len(), 40_000);
    assert!(s.cache_stats().pages <= st.capacity_pages + 64);
    // Recovery after kill -9 replays the log since the checkpoint into the
    // same bounded pool, writing pages home as it fills.
    let image = vfs.crash(CrashPolicy::ProcessOnly);
    drop(s);
    let s = sim_open(&image, o).unwrap();
    let info = s.recovery_info();
    let replayed = info.ops_applied + info.images_restored;
    assert!(replayed as usize > 4 * st.capacity_pages, "{info:?}");
    let after = s.cache_stats();
    assert!(after.pages <= after.capacity_pages + 64, "{after:?}");
    assert_eq!(s.scan(..).unwrap().len(), 40_000);
}

#[test]
fn a_failed_page_write_in_a_checkpoint_poisons_and_loses_nothing() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(512)).unwrap();
    let val = |i: u32| format!("value-{i}-{}", "v".repeat((i % 50) as usize)).into_bytes();
    for c in 0..4u32 {
        let mut t = s.transaction();
        for i in c * 500..(c + 1) * 500 {
            t.put(format!("key-{i:05}").as_bytes(), &val(i));
        }
        t.commit().unwrap();
    }
    vfs.inject(Fault::eio(VfsOp::Write, 3).on("/db/data.kv"));
    let e = s.checkpoint().unwrap_err();
    assert!(matches!(e, Error::Journal(_)), "{e}");
    // Poisoned: every call, reads included, answers the error.
    assert!(s.get(b"key-00001").is_err());
    assert!(s.put(b"more", b"x").is_err());
    assert!(s.range(..).is_err());
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    drop(s);
    let s = sim_open(&image, options(512)).unwrap();
    for i in 0..2000u32 {
        assert_eq!(
            s.get(format!("key-{i:05}").as_bytes()).unwrap(),
            Some(val(i)),
            "key {i}"
        );
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

#[test]
fn a_page_torn_at_home_is_put_back_from_the_double_write_area() {
    let vfs = SimVfs::new();
    let o = Options {
        torn_pages: TornPages::DoubleWrite,
        ..options(512)
    };
    let s = sim_open(&vfs, o).unwrap();
    let val = |i: u32| format!("value-{i}-{}", "v".repeat((i % 50) as usize)).into_bytes();
    let mut t = s.transaction();
    for i in 0..2000u32 {
        t.put(format!("key-{i:05}").as_bytes(), &val(i));
    }
    t.commit().unwrap();
    s.checkpoint().unwrap();
    // Keys changed after the checkpoint: with the double-write buffer the
    // log holds no image of their pages.
    for i in (0..2000u32).step_by(100) {
        s.put(format!("key-{i:05}").as_bytes(), b"changed").unwrap();
    }
    // A crash while the last batch went home: every page of it torn.
    let area = vfs.live_contents(Path::new("/db/doublewrite.kv")).unwrap();
    let data = vfs
        .open(Path::new("/db/data.kv"), OpenOptions::write())
        .unwrap();
    let mut pages: Vec<u32> = area
        .chunks_exact(4096)
        .filter(|copy| copy[..4] == *b"KVB2")
        .map(|copy| u32::from_le_bytes(copy[16..20].try_into().unwrap()))
        .collect();
    pages.sort_unstable();
    pages.dedup();
    assert!(!pages.is_empty(), "the area holds the last batch");
    for no in &pages {
        data.write_at(&[0xA5; 1024], u64::from(*no) * 4096 + 2048)
            .unwrap();
    }
    data.sync_all().unwrap();
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    drop(s);
    // Read-only (as `kvstore check` opens), the copies go to the pool and
    // nothing is written; then a writable open puts them home.
    let ro = Options {
        read_only: true,
        ..o
    };
    let s = sim_open(&image, ro).unwrap();
    assert_eq!(s.recovery_info().doublewrite_restored, pages.len() as u64);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    drop(s);
    let s = sim_open(&image, o).unwrap();
    let restored = s.recovery_info().doublewrite_restored;
    assert_eq!(restored, pages.len() as u64);
    for i in 0..2000u32 {
        let want = if i % 100 == 0 {
            b"changed".to_vec()
        } else {
            val(i)
        };
        let got = s.get(format!("key-{i:05}").as_bytes()).unwrap();
        assert_eq!(got, Some(want), "key {i}");
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

/// A log written with the double-write buffer holds no page images, so a
/// store reopened with full-page images keeps writing pages home through
/// the area until its first checkpoint (at open) is done: a crash tearing
/// any of those writes, at every point of that checkpoint, loses nothing.
#[test]
fn switching_to_full_page_images_keeps_the_area_until_a_checkpoint() {
    let vfs = SimVfs::new();
    let dw = Options {
        torn_pages: TornPages::DoubleWrite,
        ..options(512)
    };
    let fpi = Options {
        torn_pages: TornPages::FullPageImages,
        ..options(512)
    };
    let val = |i: u32, round: u32| format!("value-{i}-{round}-{}", "v".repeat(40)).into_bytes();
    let s = sim_open(&vfs, dw).unwrap();
    let mut t = s.transaction();
    for i in 0..12_000u32 {
        t.put(format!("key-{i:05}").as_bytes(), &val(i, 0));
    }
    t.commit().unwrap();
    s.checkpoint().unwrap();
    // Changes to many more pages than the area holds, logged without
    // images, then a crash.
    for i in (0..12_000u32).step_by(7) {
        s.put(format!("key-{i:05}").as_bytes(), &val(i, 1)).unwrap();
    }
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    drop(s);
    let want = |i: u32| val(i, u32::from(i.is_multiple_of(7)));
    let mut torn = 0;
    for at in (1..2000).step_by(7) {
        let v = image.crash(CrashPolicy::DropUnsynced);
        v.arm_crash(at, CrashPolicy::TornSectors { seed: at });
        let s = sim_open(&v, fpi).unwrap();
        drop(s);
        let Some(crashed) = v.take_crash() else {
            break;
        };
        torn += 1;
        let s = sim_open(&crashed, fpi).unwrap_or_else(|e| panic!("crash at {at}: {e}"));
        for i in (0..12_000u32).step_by(13) {
            let got = s.get(format!("key-{i:05}").as_bytes()).unwrap();
            assert_eq!(got, Some(want(i)), "crash at {at}: key {i}");
        }
        assert_eq!(s.check().unwrap(), Vec::<String>::new(), "crash at {at}");
    }
    assert!(torn > 10, "{torn} crash points");
}
