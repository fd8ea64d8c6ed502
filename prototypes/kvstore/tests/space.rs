//! The B+tree's use of space: pages freed by deletes (and by merging
//! leaves that deletes thinned) are reused by later inserts, and a leaf
//! taking ascending keys in its middle splits at the insert, so writers
//! interleaving ascending ranges fill leaves as a sorted load does.

use journal_core::vfs::{CrashPolicy, SimVfs};

mod common;
use common::{options, sim_open};

#[test]
fn deleting_half_the_keys_frees_pages_that_inserts_reuse() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(256)).unwrap();
    let v = vec![1u8; 100];
    let put_all = |prefix: &str| {
        for c in 0..20u32 {
            let mut t = s.transaction();
            for i in 0..1000u32 {
                t.put(format!("{prefix}{:05}", c * 1000 + i).as_bytes(), &v);
            }
            t.commit().unwrap();
        }
    };
    put_all("a");
    assert_eq!(s.scan(..).unwrap().len(), 20_000);
    let full = s.cache_stats().file_pages;
    for c in 0..10u32 {
        let mut t = s.transaction();
        for i in 0..1000u32 {
            t.delete(format!("a{:05}", c * 1000 + i).as_bytes());
        }
        t.commit().unwrap();
    }
    // Half the keys again, under new names: the freed pages take them.
    for c in 0..10u32 {
        let mut t = s.transaction();
        for i in 0..1000u32 {
            t.put(format!("b{:05}", c * 1000 + i).as_bytes(), &v);
        }
        t.commit().unwrap();
    }
    let after = s.cache_stats().file_pages;
    assert!(after <= full + full / 10, "{full} pages, then {after}");
    assert_eq!(s.scan(..).unwrap().len(), 20_000);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

#[test]
fn leaves_thinned_by_deletes_merge_and_their_pages_are_reused() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(256)).unwrap();
    let v = vec![1u8; 100];
    let put = |keys: &mut dyn Iterator<Item = String>| loop {
        let mut t = s.transaction();
        let mut n = 0;
        for k in (&mut *keys).take(1000) {
            t.put(k.as_bytes(), &v);
            n += 1;
        }
        if n == 0 {
            return;
        }
        t.commit().unwrap();
    };
    put(&mut (0..20_000u32).map(|i| format!("a{i:05}")));
    let full = s.cache_stats().file_pages;
    // Four keys of five deleted, spread over every leaf: no leaf empties,
    // every one falls under a quarter full.
    for c in 0..20u32 {
        let mut t = s.transaction();
        for i in (c * 1000..(c + 1) * 1000).filter(|i| i % 5 != 0) {
            t.delete(format!("a{i:05}").as_bytes());
        }
        t.commit().unwrap();
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    // As many new keys as were deleted, after the last: the merged-away
    // leaves take most of them (merged leaves are at most three quarters
    // full, so some room stays in them; without merges the file grows by
    // about four fifths).
    put(&mut (0..16_000u32).map(|i| format!("b{i:05}")));
    let after = s.cache_stats().file_pages;
    assert!(after <= full + full / 4, "{full} pages, then {after}");
    assert_eq!(s.scan(..).unwrap().len(), 20_000);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    // And it all replays: a crash, then the same tree.
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    drop(s);
    let s = sim_open(&image, options(256)).unwrap();
    assert_eq!(s.scan(..).unwrap().len(), 20_000);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

/// Pages a store holds after the keys of `ranges` ranges, `per_range`
/// each, are put range by range or interleaved (one transaction per round
/// of one key a range); the store is then crashed and replayed.
fn pages_after_puts(ranges: u32, per_range: u32, interleaved: bool) -> u32 {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(1024)).unwrap();
    let v = vec![7u8; 100];
    let key = |r: u32, i: u32| format!("r{r:03}-{i:06}").into_bytes();
    if interleaved {
        for i in 0..per_range {
            let mut t = s.transaction();
            for r in 0..ranges {
                t.put(&key(r, i), &v);
            }
            t.commit().unwrap();
        }
    } else {
        for r in 0..ranges {
            let mut t = s.transaction();
            for i in 0..per_range {
                t.put(&key(r, i), &v);
            }
            t.commit().unwrap();
        }
    }
    let n = (ranges * per_range) as usize;
    assert_eq!(s.scan(..).unwrap().len(), n);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    let pages = s.cache_stats().file_pages;
    // The splits replay: every key back after a crash (all committed
    // durable), the tree checks clean.
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    drop(s);
    let s = sim_open(&image, options(1024)).unwrap();
    let got = s.scan(..).unwrap();
    assert_eq!(got.len(), n);
    assert!(got.iter().all(|(_, val)| *val == v));
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    pages
}

/// Writers appending each in a key range of its own (the first keys of
/// the next range share the leaf they append to) fill their leaves as a
/// sorted load does: the leaf splits at the insert, not in half each time.
#[test]
fn ascending_inserts_in_the_middle_of_a_leaf_split_at_the_insert() {
    let sorted = pages_after_puts(16, 600, false);
    let interleaved = pages_after_puts(16, 600, true);
    assert!(
        interleaved <= sorted + sorted / 5,
        "{interleaved} pages interleaved against {sorted} sorted"
    );
}
