//! Hostile data files: one to three fields of a page (of the data file,
//! or one case in six of a copy in the double-write area) — a meta page's
//! version, sequence, root, end or free-list head; a tree page's LSN,
//! number, kind, cell count, free-space bounds, link (leftmost child, next
//! overflow page or free-list trunk), a slot (in a trunk, part of a listed
//! free page's number), or a length, flag or child pointer
//! inside a cell — set to values a damaged or malicious file could hold,
//! the page's CRC re-sealed so the damage gets past the checksum. Child
//! pointers outside the file, cycles and counts past the page all come
//! out of this. Opening the store, reading every key, iterating, checking
//! and writing must each answer with a typed error or with data: never a
//! panic, a hang, or an allocation sized by a count read from the file.
//!
//! `cargo test` runs a fixed number of cases; `JOURNAL_FUZZ_SECONDS` runs
//! for a time budget instead (`cargo xtask fuzz --minutes N`).

use journal_core::vfs::{CrashPolicy, OpenOptions, SimVfs, SplitMix64, Vfs};
use kvstore::{Options, Store, TornPages};
use std::path::Path;
use std::sync::Arc;

const PAGE: usize = 4096;
const HEADER: usize = 32;
const DATA: &str = "/db/data.kv";
const DOUBLEWRITE: &str = "/db/doublewrite.kv";
/// Cases `cargo test` runs.
const CASES: u64 = 1000;

fn options() -> Options {
    Options {
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 64 << 10,
            background_preallocation: false,
            ..journal_core::Options::default()
        },
        checkpoint_interval: None,
        // Pages go home through the double-write area, so the base store
        // leaves copies there for the cases to damage.
        torn_pages: TornPages::DoubleWrite,
        ..Options::default()
    }
}

fn open(vfs: &SimVfs) -> kvstore::Result<Store> {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    Store::open_with(v, "/db", options())
}

/// Keys the base store holds.
const KEYS: u32 = 1500;

/// A closed store: a tree of three levels with overflow chains and free
/// pages, home in the data file; a few more keys only in the journal.
fn base() -> SimVfs {
    let vfs = SimVfs::new();
    let s = open(&vfs).unwrap();
    let mut rng = SplitMix64::new(7);
    for i in 0..KEYS {
        let len = if i % 10 == 0 {
            rng.range(1, 9000)
        } else {
            rng.range(1, 300)
        };
        let mut v = vec![0u8; len as usize];
        rng.fill(&mut v);
        s.put(format!("key-{i:05}").as_bytes(), &v).unwrap();
    }
    for i in (0..KEYS).step_by(7) {
        s.delete(format!("key-{i:05}").as_bytes()).unwrap();
    }
    s.checkpoint().unwrap();
    for i in 0..10u32 {
        s.put(format!("late-{i}").as_bytes(), b"in the journal only")
            .unwrap();
    }
    s.close().unwrap();
    vfs
}

/// kvstore's page CRC: CRC32C of the page with its CRC field zeroed.
fn seal(page: &mut [u8]) {
    let c = crc32c::crc32c(&page[..4]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    let c = crc32c::crc32c_append(c, &page[8..]);
    page[4..8].copy_from_slice(&c.to_le_bytes());
}

fn field(b: &[u8], off: usize, width: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..width].copy_from_slice(&b[off..off + width]);
    u64::from_le_bytes(w)
}

/// One case: a copy of `base` with one page made hostile and re-sealed.
fn mutate(base: &SimVfs, rng: &mut SplitMix64) -> SimVfs {
    let image = base.crash(CrashPolicy::DropUnsynced);
    let file = if rng.chance(1, 6) { DOUBLEWRITE } else { DATA };
    let mut data = image.live_contents(Path::new(file)).unwrap();
    let pages = data.len() / PAGE;
    let first = if file == DATA { 2 } else { 0 };
    // A meta page one case in eight (the newer one: it is the one read);
    // else a page in use, branches and leaves more often than the rest.
    let meta = file == DATA && rng.chance(1, 8);
    let p = if meta {
        let seq = |p: usize| field(&data[p * PAGE..], 32, 8);
        usize::from(seq(1) > seq(0))
    } else {
        let kind = |p: usize| data[p * PAGE + 20];
        let used: Vec<usize> = (first..pages)
            .filter(|&p| data[p * PAGE..p * PAGE + 4] == *b"KVB2")
            .collect();
        let nodes: Vec<usize> = used.iter().copied().filter(|&p| kind(p) <= 2).collect();
        let pick = if rng.chance(3, 4) && !nodes.is_empty() {
            &nodes
        } else {
            &used
        };
        pick[rng.below(pick.len() as u64) as usize]
    };
    let page = &mut data[p * PAGE..(p + 1) * PAGE];
    if file == DOUBLEWRITE {
        // Its home copy torn, so that recovery puts the hostile copy back.
        let home = field(page, 16, 4) as usize * PAGE;
        let f = image.open(Path::new(DATA), OpenOptions::write()).unwrap();
        f.write_at(&[0x55; 512], (home + 1024) as u64).unwrap();
    }
    for _ in 0..rng.range(1, 3) {
        let (off, width) = if meta {
            [(8, 2), (32, 8), (40, 4), (44, 4), (48, 4)][rng.below(5) as usize]
        } else {
            let upper = match field(page, 26, 2) as usize {
                0 => PAGE,
                u => u.clamp(HEADER, PAGE),
            };
            let count = field(page, 22, 2) as usize;
            match rng.below(10) {
                0 => (8, 8),  // page LSN
                1 => (16, 4), // page number
                2 => (20, 1), // kind
                3 => (22, 2), // cell count
                4 => (24, 2), // end of the slot array
                5 => (26, 2), // start of the cells
                6 => (28, 4), // leftmost child / next page
                // A slot.
                7 => (
                    HEADER + 2 * rng.below(count.clamp(1, 1000) as u64) as usize,
                    2,
                ),
                // A cell's length, flag or child pointer.
                8 if upper < PAGE - 8 => (rng.range(upper as u64, (PAGE - 8) as u64) as usize, 2),
                _ if upper < PAGE - 8 => (rng.range(upper as u64, (PAGE - 8) as u64) as usize, 4),
                _ => (28, 4),
            }
        };
        let v = rng.hostile(field(page, off, width), width);
        page[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
    seal(page);
    let f = image.open(Path::new(file), OpenOptions::write()).unwrap();
    f.write_at(&data[p * PAGE..(p + 1) * PAGE], (p * PAGE) as u64)
        .unwrap();
    f.sync_all().unwrap();
    image
}

/// An answer: data or a typed error — but a panic the store caught
/// while applying (which poisons it) is a failure like any panic.
fn answer<T>(r: kvstore::Result<T>) {
    if let Err(e @ kvstore::Error::Panicked { .. }) = r {
        panic!("{e}");
    }
}

/// Opens, reads every key, scans, writes and closes: `true` if the open
/// succeeded. Errors are answers; a panic fails the case.
fn exercise(image: &SimVfs) -> bool {
    let Ok(s) = open(image) else {
        return false;
    };
    for i in 0..KEYS {
        answer(s.get(format!("key-{i:05}").as_bytes()));
    }
    answer(s.scan(..));
    if let Ok(it) = s.range(b"key-00500".to_vec()..b"key-00900".to_vec()) {
        let _ = it.count();
    }
    answer(s.check());
    // Writes into the damaged page's neighbourhood, splits and merges
    // included: overwrites, inserts, deletes.
    for i in (0..KEYS).step_by(29) {
        let k = format!("key-{i:05}");
        answer(s.put(k.as_bytes(), &[7u8; 120]));
        answer(s.put(format!("{k}-x").as_bytes(), b"new"));
        if i % 2 == 0 {
            answer(s.delete(k.as_bytes()));
        }
    }
    answer(s.put(b"after", b"a write after a hostile open"));
    answer(s.checkpoint());
    answer(s.close());
    true
}

#[test]
fn hostile_pages_get_typed_errors_never_panics() {
    let base = base();
    let mut rng = SplitMix64::new(0x6b76);
    let run = bench_harness::hostile_campaign("a hostile page made the store", CASES, |_| {
        let image = mutate(&base, &mut rng);
        move || exercise(&image)
    });
    let (cases, opened) = (run.cases, run.accepted);
    println!(
        "kvstore hostile pages: {cases} CRC-valid hostile data files in {:.1} s: {opened} opened and read, the rest a typed error; 0 panics, 0 hangs",
        run.elapsed.as_secs_f64()
    );
}

/// Structure-aware damage, one page of the data file at a time, its CRC
/// re-sealed: cells made to overlap (a slot moved onto or into another
/// cell), a slot past the page's end, keys put out of order, a leaf made a
/// branch and a branch a leaf (the tree's levels broken), and cycles — a
/// child pointer to the page itself or to the root, an overflow chain or a
/// free-list trunk linked to itself, a child pointer to an overflow page
/// or a trunk. Each must be a typed error (or data), never a panic or a
/// hang, through open, reads, scans, check and writes.
fn craft(base: &SimVfs, rng: &mut SplitMix64) -> SimVfs {
    let image = base.crash(CrashPolicy::DropUnsynced);
    let mut data = image.live_contents(Path::new(DATA)).unwrap();
    let pages = data.len() / PAGE;
    let kind = |d: &[u8], p: usize| d[p * PAGE + 20];
    let count = |d: &[u8], p: usize| field(&d[p * PAGE..], 22, 2) as usize;
    let live = |d: &[u8], p: usize| d[p * PAGE..p * PAGE + 4] == *b"KVB2";
    let of_kind = |d: &[u8], k: u8| -> Vec<usize> {
        (2..pages)
            .filter(|&p| live(d, p) && kind(d, p) == k)
            .collect()
    };
    let (leaves, branches) = (of_kind(&data, 1), of_kind(&data, 2));
    let (overflows, trunks) = (of_kind(&data, 3), of_kind(&data, 4));
    let nodes: Vec<usize> = leaves.iter().chain(&branches).copied().collect();
    let any = |rng: &mut SplitMix64, v: &[usize]| v[rng.below(v.len() as u64) as usize];
    // The root: the meta page with the higher sequence names it.
    let seq = |p: usize| field(&data[p * PAGE..], 32, 8);
    let meta = usize::from(seq(1) > seq(0));
    let root = field(&data[meta * PAGE..], 40, 4) as usize;
    let slot = |d: &[u8], p: usize, i: usize| field(&d[p * PAGE..], HEADER + 2 * i, 2) as usize;
    let set = |d: &mut [u8], p: usize, off: usize, width: usize, v: u64| {
        d[p * PAGE + off..p * PAGE + off + width].copy_from_slice(&v.to_le_bytes()[..width]);
    };
    let p = match rng.below(9) {
        // Overlapping cells: every slot onto the largest cell, so that
        // together they claim more than the page (the free space would
        // underflow, a compaction overrun the page)...
        0 => {
            let p = any(rng, &nodes);
            let n = count(&data, p);
            let cells: Vec<usize> = (0..n).map(|i| slot(&data, p, i)).collect();
            // (The largest cell starts where the next one up is farthest.)
            let mut sorted = cells.clone();
            sorted.sort_unstable();
            sorted.push(PAGE);
            let biggest = (0..n)
                .max_by_key(|&i| sorted[i + 1] - sorted[i])
                .unwrap_or(0);
            for i in 0..n {
                set(&mut data, p, HEADER + 2 * i, 2, sorted[biggest] as u64);
            }
            p
        }
        // ... or one slot onto another cell, or a few bytes into it.
        1 => {
            let p = any(rng, &nodes);
            let n = count(&data, p);
            if n >= 2 {
                let (i, j) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
                let shift = if rng.chance(1, 2) {
                    0
                } else {
                    rng.range(1, 6) as usize
                };
                let to = (slot(&data, p, j) + shift).min(PAGE - 1);
                set(&mut data, p, HEADER + 2 * i, 2, to as u64);
            }
            p
        }
        // A slot at or past the page's end.
        2 => {
            let p = any(rng, &nodes);
            let i = rng.below(count(&data, p).max(1) as u64) as usize;
            set(
                &mut data,
                p,
                HEADER + 2 * i,
                2,
                rng.range(PAGE as u64 - 6, 65_535),
            );
            p
        }
        // Keys out of order: two slots swapped.
        3 => {
            let p = any(rng, &nodes);
            let n = count(&data, p);
            if n >= 2 {
                let i = rng.below(n as u64 - 1) as usize;
                let (a, b) = (slot(&data, p, i), slot(&data, p, i + 1));
                set(&mut data, p, HEADER + 2 * i, 2, b as u64);
                set(&mut data, p, HEADER + 2 * i + 2, 2, a as u64);
            }
            p
        }
        // Levels broken: a leaf made a branch, or a branch a leaf.
        4 => {
            let p = any(rng, &nodes);
            let k = kind(&data, p);
            data[p * PAGE + 20] = if k == 1 { 2 } else { 1 };
            p
        }
        // A child pointer (the leftmost, or a cell's) to the page itself,
        // the root, an overflow page, a free-list trunk or a leaf.
        5 | 6 if !branches.is_empty() => {
            let p = any(rng, &branches);
            let to = match rng.below(5) {
                0 => p,
                1 => root,
                2 if !overflows.is_empty() => any(rng, &overflows),
                3 if !trunks.is_empty() => any(rng, &trunks),
                _ => any(rng, &leaves),
            };
            let n = count(&data, p);
            if n == 0 || rng.chance(1, 3) {
                set(&mut data, p, 28, 4, to as u64);
            } else {
                let cell = slot(&data, p, rng.below(n as u64) as usize);
                if cell + 6 <= PAGE {
                    set(&mut data, p, cell + 2, 4, to as u64);
                }
            }
            p
        }
        // An overflow chain or a free-list trunk linked to itself.
        7 if !overflows.is_empty() => {
            let p = any(rng, &overflows);
            set(&mut data, p, 28, 4, p as u64);
            p
        }
        8 if !trunks.is_empty() => {
            let p = any(rng, &trunks);
            set(&mut data, p, 28, 4, p as u64);
            p
        }
        _ => {
            // A count one past the slots, the slot array grown to match.
            let p = any(rng, &nodes);
            let n = count(&data, p);
            set(&mut data, p, 22, 2, n as u64 + 1);
            set(&mut data, p, 24, 2, (HEADER + 2 * (n + 1)) as u64);
            p
        }
    };
    seal(&mut data[p * PAGE..(p + 1) * PAGE]);
    let f = image.open(Path::new(DATA), OpenOptions::write()).unwrap();
    f.write_at(&data[p * PAGE..(p + 1) * PAGE], (p * PAGE) as u64)
        .unwrap();
    f.sync_all().unwrap();
    image
}

/// Crafted cases `cargo test` runs.
const CRAFTED: u64 = 400;

#[test]
fn crafted_pages_get_typed_errors_never_panics_or_hangs() {
    let base = base();
    let mut rng = SplitMix64::new(0x0c4a_f7ed);
    let run = bench_harness::hostile_campaign("a crafted page made the store", CRAFTED, |_| {
        let image = craft(&base, &mut rng);
        move || exercise(&image)
    });
    println!(
        "kvstore crafted pages: {} CRC-valid pages with overlapping cells, slots past the end, keys out of order, broken levels and cycles in {:.1} s: {} opened and read, the rest a typed error; 0 panics, 0 hangs",
        run.cases,
        run.elapsed.as_secs_f64(),
        run.accepted
    );
}
