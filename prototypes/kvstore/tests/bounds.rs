//! Memory bounds that must not grow with the data: `Store::check`'s
//! bitmap of pages reached (windows of page numbers past its share of the
//! cache), and the index of the page versions kept for open snapshots
//! (counted against the versions' quarter of the cache).

mod common;

use common::{options, sim_open};
use journal_core::vfs::{CrashPolicy, OpenOptions, SimVfs, SplitMix64, Vfs};
use kvstore::Options;
use std::path::Path;

const PAGE: usize = 4096;
const DATA: &str = "/db/data.kv";

/// A closed store of `keys` keys of 1,000 bytes (about three a leaf;
/// every 50th value of 5,000 bytes, in two overflow pages),
/// bulk-loaded, with keys `[freed.0, freed.1)` deleted again so their
/// leaves are freed (a free list of trunks and the pages they list).
fn store(keys: u32, freed: (u32, u32)) -> SimVfs {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(256)).unwrap();
    let mut load = s.bulk_load().unwrap();
    for i in 0..keys {
        // Every 50th value in two overflow pages.
        let len = if i % 50 == 0 { 5000 } else { 1000 };
        load.push(format!("key-{i:06}").as_bytes(), &vec![i as u8; len])
            .unwrap();
    }
    load.finish().unwrap();
    for chunk in (freed.0..freed.1).collect::<Vec<_>>().chunks(500) {
        let mut t = s.transaction();
        for i in chunk {
            t.delete(format!("key-{i:06}").as_bytes());
        }
        t.commit().unwrap();
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    s.close().unwrap();
    vfs
}

/// Opens the store read-only with a cache of `cache_bytes`.
fn open_ro(vfs: &SimVfs, cache_bytes: usize) -> kvstore::Store {
    let o = Options {
        read_only: true,
        cache_bytes,
        ..options(16)
    };
    sim_open(vfs, o).unwrap()
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes([b[at], b[at + 1]]) as usize
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The data file's pages, and the end the newer meta page names.
fn pages(vfs: &SimVfs) -> (Vec<u8>, u32) {
    let data = vfs.live_contents(Path::new(DATA)).unwrap();
    let seq = |p: usize| u64::from_le_bytes(data[p * PAGE + 32..p * PAGE + 40].try_into().unwrap());
    let meta = usize::from(seq(1) > seq(0));
    let end = u32_at(&data, meta * PAGE + 44);
    (data, end)
}

/// Writes page `no` back, its CRC sealed again (kvstore's: CRC32C of the
/// page with the CRC field zeroed).
fn write_page(vfs: &SimVfs, no: u32, page: &mut [u8]) {
    page[4..8].fill(0);
    let c = crc32c::crc32c(page);
    page[4..8].copy_from_slice(&c.to_le_bytes());
    let f = vfs.open(Path::new(DATA), OpenOptions::write()).unwrap();
    f.write_at(page, u64::from(no) * PAGE as u64).unwrap();
    f.sync_all().unwrap();
}

/// The first page at or past `from` of `kind` (2 branch, 4 trunk) with
/// at least `count` cells or entries.
fn find(data: &[u8], end: u32, from: u32, kind: u8, count: usize) -> u32 {
    (from..end)
        .find(|&p| {
            let b = &data[p as usize * PAGE..];
            b[20] == kind && u16_at(b, 22) >= count
        })
        .unwrap_or_else(|| panic!("no page of kind {kind} past {from}"))
}

#[test]
fn check_memory_is_bounded_by_the_cache_not_the_store() {
    // A cache of 2 KiB: a bitmap of 128 bytes, 1,024 pages a window.
    let cache = 2048;
    let mut seen = Vec::new();
    for keys in [4_000u32, 12_000] {
        let vfs = store(keys, (0, 0));
        let r = open_ro(&vfs, cache).check_report().unwrap();
        assert_eq!(r.problems, Vec::<String>::new());
        assert!(r.bitmap_bytes <= cache / 16, "{keys} keys: {r:?}");
        assert_eq!(r.windows, r.pages.div_ceil(r.bitmap_bytes as u64 * 8));
        assert!(r.max_levels <= 3, "{r:?}");
        // With the default cache the whole file fits one bitmap.
        let whole = open_ro(&vfs, Options::default().cache_bytes)
            .check_report()
            .unwrap();
        assert_eq!((whole.windows, whole.problems.len()), (1, 0));
        assert_eq!(whole.bitmap_bytes as u64, r.pages.div_ceil(64) * 8);
        seen.push(r);
    }
    // Three times the pages: the same bitmap, three times the windows.
    let (small, large) = (&seen[0], &seen[1]);
    assert!(large.pages > 2 * small.pages && small.pages > 1024);
    assert_eq!(small.bitmap_bytes, large.bitmap_bytes);
    assert!(large.windows > small.windows && small.windows >= 2);
}

/// The problems of a check, sorted (walks in windows report them in
/// another order), and its windows.
fn problems(vfs: &SimVfs, cache: usize) -> (Vec<String>, u64) {
    let mut r = open_ro(vfs, cache).check_report().unwrap();
    r.problems.sort();
    (r.problems, r.windows)
}

#[test]
fn a_check_in_windows_finds_every_problem_a_whole_bitmap_finds() {
    // 3,300 leaves, those of keys 4,000..8,000 freed (more than a trunk
    // lists: a second trunk past the first window), checked in windows of
    // 1,024 pages.
    let vfs = store(10_000, (4_000, 8_000));
    let (data, end) = pages(&vfs);
    // Past the first window: a branch, and the trunk.
    let branch = find(&data, end, 1100, 2, 8);
    let trunk = find(&data, end, 1026, 4, 8);
    let mut b = data[branch as usize * PAGE..][..PAGE].to_vec();
    let child = |b: &[u8], i: usize| u32_at(b, u16_at(b, 32 + 2 * i) + 2);
    // Cell 1's child becomes cell 2's: that leaf is reached twice (first
    // with the wrong separators), cell 1's own leaf is lost. Cell 4's
    // child points past the end: its leaf is lost too.
    let (twice, lost_leaf, out_leaf) = (child(&b, 2), child(&b, 1), child(&b, 4));
    let at = u16_at(&b, 34) + 2;
    set_u32(&mut b, at, twice);
    let at = u16_at(&b, 32 + 8) + 2;
    set_u32(&mut b, at, end + 5);
    write_page(&vfs, branch, &mut b);
    // The trunk: its entry 3 repeats entry 4, entry 5 points past the
    // end, and its last entry is dropped (count and lower one less).
    let mut t = data[trunk as usize * PAGE..][..PAGE].to_vec();
    let n = u16_at(&t, 22);
    let entry = |t: &[u8], i: usize| u32_at(t, 32 + 4 * i);
    let (dup, lost3, lost5, dropped) = (entry(&t, 4), entry(&t, 3), entry(&t, 5), entry(&t, n - 1));
    set_u32(&mut t, 32 + 12, dup);
    set_u32(&mut t, 32 + 20, end + 9);
    t[22..24].copy_from_slice(&(n as u16 - 1).to_le_bytes());
    t[24..26].copy_from_slice(&((32 + 4 * (n - 1)) as u16).to_le_bytes());
    write_page(&vfs, trunk, &mut t);

    let (whole, one) = problems(&vfs, 64 << 20);
    let (windowed, windows) = problems(&vfs, 2048);
    assert_eq!(one, 1);
    assert!(windows >= 3, "{windows} windows");
    assert_eq!(windowed, whole, "windows report what one bitmap does");
    let has = |s: &str| windowed.iter().any(|p| p.contains(s));
    assert!(
        has(&format!("page {twice} is reached twice")),
        "{windowed:#?}"
    );
    assert!(has(&format!(
        "page {twice}: key at cell 0 outside its separators"
    )));
    assert!(has(&format!(
        "page {} is outside the file (end {end})",
        end + 5
    )));
    assert!(
        has(&format!("free page {dup} (trunk {trunk}) is reached twice")),
        "{windowed:#?}"
    );
    assert!(has(&format!(
        "free page {} (trunk {trunk}) is outside the file (end {end})",
        end + 9
    )));
    let mut lost = vec![lost_leaf, out_leaf, lost3, lost5, dropped];
    lost.sort();
    assert!(has(&format!("lost pages, e.g. {lost:?}")), "{windowed:#?}");
}

#[test]
fn a_cycle_outside_a_window_ends_the_walk_not_the_check() {
    // The trunk's next trunk is itself: the walk of its window finds it
    // reached twice; the others, which do not mark it, stop after as many
    // pages as the file holds instead of going round for ever.
    let vfs = store(10_000, (4_000, 8_000));
    let (data, end) = pages(&vfs);
    let trunk = find(&data, end, 1026, 4, 8);
    let mut t = data[trunk as usize * PAGE..][..PAGE].to_vec();
    set_u32(&mut t, 28, trunk);
    write_page(&vfs, trunk, &mut t);
    let (whole, _) = problems(&vfs, 64 << 20);
    let (windowed, windows) = problems(&vfs, 2048);
    let twice = format!("free-list trunk {trunk} is reached twice");
    assert!(whole.contains(&twice), "{whole:#?}");
    assert!(windowed.contains(&twice), "{windowed:#?}");
    assert!(windows >= 3);
    assert!(
        windowed
            .iter()
            .any(|p| p.starts_with("the walk reached more pages than the file holds")),
        "{windowed:#?}"
    );
}

#[test]
fn a_check_keeps_a_thousand_problem_lines_and_counts_the_rest() {
    // Every entry of the trunk points past the end: one problem each,
    // over a thousand.
    let vfs = store(10_000, (5_000, 7_000));
    let (data, end) = pages(&vfs);
    let trunk = find(&data, end, 2, 4, 8);
    let mut t = data[trunk as usize * PAGE..][..PAGE].to_vec();
    let n = 1016;
    for i in 0..n {
        set_u32(&mut t, 32 + 4 * i, end + 1 + i as u32);
    }
    t[22..24].copy_from_slice(&(n as u16).to_le_bytes());
    t[24..26].copy_from_slice(&((32 + 4 * n) as u16).to_le_bytes());
    write_page(&vfs, trunk, &mut t);
    let r = open_ro(&vfs, 2048).check_report().unwrap();
    assert_eq!(r.problems.len(), 1001, "{:?}", &r.problems[990..]);
    let last = r.problems.last().unwrap();
    assert!(
        last.starts_with("... and ") && last.ends_with("more problems"),
        "{last}"
    );
}

#[test]
fn a_check_in_windows_beside_writers_reads_one_snapshot() {
    // The check's snapshot is held across its walks while a writer
    // changes the tree: every walk reads the same tree, so a sound store
    // shows no problem (a walk reading another tree would see pages lost
    // or reached twice).
    let vfs = SimVfs::new();
    let o = Options {
        cache_bytes: 2048,
        ..options(16)
    };
    let s = sim_open(&vfs, o).unwrap();
    for i in 0..4000u32 {
        s.put(format!("key-{i:05}").as_bytes(), &[1; 1000]).unwrap();
    }
    std::thread::scope(|sc| {
        let w = sc.spawn(|| {
            for i in 0..2000u32 {
                let k = (i * 7919) % 6000;
                s.put(format!("key-{k:05}").as_bytes(), &[2; 900]).unwrap();
            }
        });
        let r = s.check_report().unwrap();
        assert_eq!(r.problems, Vec::<String>::new());
        assert!(r.windows >= 2, "{r:?}");
        w.join().unwrap();
    });
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

/// The offsets of the page pointers in page `b`: a branch's children, a
/// leaf's first overflow pages, an overflow page's next, a trunk's next
/// and the pages it lists.
fn pointers(b: &[u8]) -> Vec<usize> {
    let n = u16_at(b, 22);
    let cell = |i: usize| u16_at(b, 32 + 2 * i);
    match b[20] {
        2 => std::iter::once(28)
            .chain((0..n).map(|i| cell(i) + 2))
            .collect(),
        1 => (0..n)
            .filter(|&i| b[cell(i) + 2] == 1)
            .map(|i| cell(i) + 7 + u16_at(b, cell(i)))
            .collect(),
        3 if u32_at(b, 28) != 0 => vec![28],
        4 => std::iter::once(28)
            .chain((0..n).map(|i| 32 + 4 * i))
            .collect(),
        _ => Vec::new(),
    }
}

#[test]
fn damaged_pointers_are_found_in_windows_as_with_one_bitmap() {
    // One pointer of a page (a child, an overflow page, a trunk's next or
    // a listed free page) set to another page, or past the end, or 0:
    // the check in windows reports every line the whole bitmap does (a
    // subtree reached twice is walked again by the windows not marking
    // it, so they may report more below it), unless a walk stopped at
    // its bound; and each finds a problem if the other does.
    let base = store(10_000, (4_000, 8_000));
    let (data, end) = pages(&base);
    let targets: Vec<(u32, usize)> = (2..end)
        .flat_map(|p| {
            let b = &data[p as usize * PAGE..][..PAGE];
            pointers(b).into_iter().map(move |at| (p, at))
        })
        .collect();
    let mut rng = SplitMix64::new(58);
    let mut stopped = 0;
    for case in 0..40 {
        let (no, at) = targets[rng.below(targets.len() as u64) as usize];
        let image = base.crash(CrashPolicy::DropUnsynced);
        let mut b = data[no as usize * PAGE..][..PAGE].to_vec();
        let to = rng.below(u64::from(end) + 4) as u32;
        set_u32(&mut b, at, to);
        write_page(&image, no, &mut b);
        let (whole, _) = problems(&image, 64 << 20);
        let (windowed, windows) = problems(&image, 2048);
        assert!(windows >= 3);
        let ctx = format!("case {case}: page {no} offset {at} -> {to}");
        assert_eq!(whole.is_empty(), windowed.is_empty(), "{ctx}");
        if windowed
            .iter()
            .any(|p| p.starts_with("the walk reached more"))
        {
            stopped += 1;
            continue;
        }
        for p in &whole {
            assert!(windowed.contains(p), "{ctx}: {p} not found in windows");
        }
    }
    assert!(stopped < 10, "{stopped} cases stopped at the bound");
}

/// The bound on versions in memory with `options(16)`: a quarter of the
/// cache, and never under 64 frames.
const VERSION_LIMIT: usize = 64 * (4096 + 128);

#[test]
fn snapshots_beside_writers_expire_oldest_first_when_the_versions_index_fills_its_bound() {
    // 6,000 keys in about 250 leaves. Each round opens an iterator and
    // then changes every leaf, so each round's snapshot keeps a version
    // of every leaf: 60 rounds keep 15,000 versions, spilled, with the
    // spill bound (4 GiB) far away. Their index stays in memory and
    // counts against the versions' bound (64 frames here): past it, the
    // oldest snapshots expire instead of the index growing.
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(16)).unwrap();
    let mut t = s.transaction();
    for i in 0..6000u32 {
        t.put(format!("key-{i:05}").as_bytes(), &[0; 150]);
    }
    t.commit().unwrap();
    let mut its = Vec::new();
    let mut most_spilled = 0;
    for round in 0..60u32 {
        let mut it = s.range(..).unwrap();
        assert_eq!(it.next().unwrap().unwrap().0, b"key-00000");
        its.push(it);
        for chunk in 0..6u32 {
            let mut t = s.transaction();
            for i in (chunk * 1000..(chunk + 1) * 1000).step_by(20) {
                t.put(format!("key-{i:05}").as_bytes(), &[round as u8 + 1; 150]);
            }
            t.commit().unwrap();
            let st = s.cache_stats();
            assert!(st.version_bytes <= VERSION_LIMIT, "round {round}: {st:?}");
            most_spilled = most_spilled.max(st.spilled_bytes);
        }
    }
    // Every spilled version keeps a 20-byte entry at least in memory.
    assert!(most_spilled / 4096 <= (VERSION_LIMIT / 20) as u64);
    // The oldest expired, and only the oldest: the youngest (opened
    // after round 58's writes) reads its snapshot whole.
    let youngest = its.pop().unwrap();
    let rest: Vec<_> = youngest.collect::<kvstore::Result<_>>().unwrap();
    assert_eq!(rest.len(), 5999);
    for (i, (_, v)) in rest.iter().enumerate() {
        let want = if (i + 1) % 20 == 0 { 59 } else { 0 };
        assert_eq!(v, &vec![want; 150], "key {}", i + 1);
    }
    let expired: Vec<bool> = its
        .into_iter()
        .map(|it| {
            let rest: Vec<_> = it.collect();
            matches!(rest.last(), Some(Err(kvstore::Error::SnapshotTooOld)))
        })
        .collect();
    let n = expired.iter().filter(|e| **e).count();
    println!("{n} of 60 snapshots expired, at most {most_spilled} bytes spilled");
    assert!(expired[0], "the oldest snapshot did not expire");
    assert!(
        expired.iter().skip(n).all(|e| !e),
        "not oldest first: {expired:?}"
    );
    assert!(n <= 45, "{n} of 59 snapshots expired: not only the oldest");
    let st = s.cache_stats();
    assert_eq!((st.version_bytes, st.spilled_bytes), (0, 0), "{st:?}");
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

#[test]
fn versions_only_an_older_snapshot_read_go_when_it_closes_before_a_younger_one() {
    // The older iterator opens; every key is rewritten (the versions it
    // reads are kept); a younger iterator opens (it reads the new
    // pages); the older closes first, then the younger: nothing is kept.
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(64)).unwrap();
    let mut t = s.transaction();
    for i in 0..3000u32 {
        t.put(format!("key-{i:05}").as_bytes(), &[0; 150]);
    }
    t.commit().unwrap();
    let mut older = s.range(..).unwrap();
    older.next().unwrap().unwrap();
    let mut t = s.transaction();
    for i in 0..3000u32 {
        t.put(format!("key-{i:05}").as_bytes(), &[1; 150]);
    }
    t.commit().unwrap();
    assert!(s.cache_stats().version_bytes > 0);
    let mut younger = s.range(..).unwrap();
    younger.next().unwrap().unwrap();
    let rest: Vec<_> = older.collect::<kvstore::Result<_>>().unwrap();
    assert!(rest.iter().all(|(_, v)| v == &vec![0u8; 150]));
    let rest: Vec<_> = younger.collect::<kvstore::Result<_>>().unwrap();
    assert!(rest.iter().all(|(_, v)| v == &vec![1u8; 150]));
    let st = s.cache_stats();
    assert_eq!((st.version_bytes, st.spilled_bytes), (0, 0), "{st:?}");
}
