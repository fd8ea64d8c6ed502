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

/// Opens, reads every key, scans, writes and closes: `true` if the open
/// succeeded. Errors are answers; a panic fails the case.
fn exercise(image: &SimVfs) -> bool {
    let Ok(s) = open(image) else {
        return false;
    };
    for i in 0..KEYS {
        let _ = s.get(format!("key-{i:05}").as_bytes());
    }
    let _ = s.scan(..);
    if let Ok(it) = s.range(b"key-00500".to_vec()..b"key-00900".to_vec()) {
        let _ = it.count();
    }
    let _ = s.check();
    let _ = s.put(b"after", b"a write after a hostile open");
    let _ = s.checkpoint();
    let _ = s.close();
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
