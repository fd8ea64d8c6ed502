//! Unit tests of the versions' bookkeeping: which versions a snapshot's
//! close drops, the order's renumbering, and the bytes a version costs.

use super::*;
use crate::page::Kind;
use journal_core::vfs::SplitMix64;

fn page(lsn: u64) -> Arc<Page> {
    let mut p = Page::new(2, Kind::Leaf);
    p.set_lsn(Lsn(lsn));
    Arc::new(p)
}

/// Opens a snapshot at `lsn` as the pool does; its key.
fn open(v: &mut Versions, lsn: u64) -> (Lsn, u64) {
    let key = (Lsn(lsn), v.next_id);
    v.next_id += 1;
    let kept = v.kept();
    v.open.insert(key, (Arc::new(AtomicBool::new(false)), kept));
    key
}

fn close(v: &mut Versions, key: (Lsn, u64)) {
    let (_, from) = v.open.remove(&key).unwrap();
    drop(v.prune(from));
}

fn has(v: &Versions, no: PageNo, lsn: u64) -> bool {
    v.index.get(Key::new(no, Lsn(lsn))).is_some()
}

#[test]
fn dropping_gone_keys_from_the_order_renumbers_the_open_snapshots() {
    let mut v = Versions::default();
    // A long snapshot reads page 2's version 5; thousands of short
    // ones come and go, each the only reader of a version: their keys
    // in the order outnumber the versions, and are dropped.
    let long = open(&mut v, 10);
    v.stash(2, &page(5));
    for i in 0..3000u64 {
        let s = open(&mut v, 20 + 2 * i);
        v.stash(3 + i as u32, &page(20 + 2 * i));
        close(&mut v, s);
    }
    assert!(v.order.len() < 1100, "{}", v.order.len());
    assert!(has(&v, 2, 5));
    // A snapshot opened after the drop: its close finds the versions
    // kept since by their new numbers.
    let late = open(&mut v, 10_000);
    v.stash(7000, &page(9000));
    v.stash(7001, &page(9001));
    for i in 0..1500u64 {
        let s = open(&mut v, 10_000 + 2 * i);
        v.stash(8000 + i as u32, &page(10_000 + 2 * i));
        close(&mut v, s);
    }
    assert!(has(&v, 7000, 9000) && has(&v, 7001, 9001));
    close(&mut v, late);
    assert!(!has(&v, 7000, 9000) && !has(&v, 7001, 9001));
    assert!(has(&v, 2, 5));
    close(&mut v, long);
    assert_eq!((v.index.len(), v.order.len(), v.bytes), (0, 0, 0));
}

#[test]
fn the_newest_version_goes_with_the_last_snapshot_open_when_it_was_kept() {
    // The older snapshot reads page 2's version 5; the younger opens
    // after it was replaced (at 15) and reads that. The older closes
    // first: the version goes then, for the younger's close will not
    // look at it.
    let mut v = Versions::default();
    let older = open(&mut v, 10);
    v.stash(2, &page(5));
    let younger = open(&mut v, 20);
    close(&mut v, older);
    assert!(!has(&v, 2, 5));
    close(&mut v, younger);
    assert_eq!((v.index.len(), v.order.len(), v.bytes), (0, 0, 0));
}

#[test]
fn a_version_kept_again_is_read_by_the_snapshots_open_then() {
    // A transaction replaced page 2's version 5 and rolled back; a
    // snapshot opened meanwhile; run again, the transaction replaces
    // version 5 again (kept again): the new snapshot reads it, so the
    // older one's close must not drop it.
    let mut v = Versions::default();
    let older = open(&mut v, 10);
    v.stash(2, &page(5));
    let during = open(&mut v, 12);
    v.stash(2, &page(5));
    assert_eq!(v.index.len(), 1);
    close(&mut v, older);
    assert!(has(&v, 2, 5));
    close(&mut v, during);
    assert_eq!((v.index.len(), v.order.len(), v.bytes), (0, 0, 0));
}

/// Spills every version in memory (as `Pool::bound_versions` does).
fn spill_all(v: &mut Versions) {
    let written: Vec<_> = v
        .mem
        .iter()
        .map(|(k, p)| (k.no, p.clone()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|(no, p)| (no, p, v.take_slot()))
        .collect();
    v.settle(&written);
}

#[test]
fn expiring_to_a_bound_expires_the_oldest_snapshots_only() {
    // 40 snapshots, each the only reader of a version of 250 pages
    // (spilled): a bound of what 25 keep expires 15 and a few more (the
    // slots they free are listed), oldest first — though the room the
    // bookkeeping holds comes back only once it is fitted.
    let mut v = Versions::default();
    let mut snaps = Vec::new();
    for r in 0..40u64 {
        snaps.push(open(&mut v, 100 * r + 50));
        for no in 2..252 {
            v.stash(no, &page(100 * r + 1));
        }
        spill_all(&mut v);
    }
    assert_eq!(v.index.len(), 10_000);
    let limit = v.fitted_bytes() * 25 / 40;
    let mut freed = Vec::new();
    let expired = v.expire_to(limit, &mut freed, false);
    assert!(v.bytes <= limit, "{} > {limit}", v.bytes);
    assert!((15..=19).contains(&expired), "{expired} expired");
    assert_eq!(
        v.open.first_key_value().map(|(k, _)| *k),
        Some(snaps[expired])
    );
    assert_eq!(v.index.len(), 250 * (40 - expired));
}

#[test]
fn expiring_for_the_bookkeeping_leaves_the_pages_in_memory_to_the_spill() {
    // The same 40 snapshots, the last five's versions still in memory
    // (megabytes of pages, for the spill to take): the bookkeeping's
    // bound expires as many as it alone needs.
    let mut v = Versions::default();
    for r in 0..40u64 {
        open(&mut v, 100 * r + 50);
        for no in 2..252 {
            v.stash(no, &page(100 * r + 1));
        }
        if r < 35 {
            spill_all(&mut v);
        }
    }
    assert_eq!(v.mem.len(), 1250);
    let limit = v.fitted_index_bytes() * 25 / 40;
    let expired = v.expire_to(limit, &mut Vec::new(), true);
    // (15, and a few more for the slots they free and the list of the
    // pages in memory.)
    assert!((15..=21).contains(&expired), "{expired} expired");
    assert_eq!(v.mem.len(), 1250);
}

#[test]
fn a_scans_spilled_versions_cost_under_45_bytes_each_in_memory() {
    // One snapshot; writers replace 200,000 pages in random order, a
    // version each, spilled in batches as the pool does.
    let mut v = Versions::default();
    let _scan = open(&mut v, 100);
    let old = page(50);
    let mut rng = SplitMix64::new(7);
    let mut nos: Vec<u32> = (2..200_002).collect();
    for i in (1..nos.len()).rev() {
        nos.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for batch in nos.chunks(2000) {
        for no in batch {
            v.stash(*no, &old);
        }
        spill_all(&mut v);
    }
    assert_eq!((v.index.len(), v.mem.len()), (200_000, 0));
    let per = v.bytes as f64 / 200_000.0;
    println!("a spilled version costs {per:.1} bytes in memory");
    assert!(per < 45.0, "{per}");
}
