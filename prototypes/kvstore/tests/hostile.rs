//! Hostile data files: one to three fields of a page — the meta page's
//! version and bucket count, a page's LSN, number, next-page link, kind
//! and payload length, or a count or length inside a bucket's serialized
//! entries — set to values a damaged or malicious file could hold, the
//! page's CRC re-sealed so the damage gets past the checksum. Opening the
//! store, reading every key, scanning and writing must each answer with a
//! typed error or with data: never a panic, a hang, or an allocation sized
//! by a count read from the file.
//!
//! `cargo test` runs a fixed number of cases; `JOURNAL_FUZZ_SECONDS` runs
//! for a time budget instead (`cargo xtask fuzz --minutes N`).

use journal_core::vfs::{CrashPolicy, OpenOptions, SimVfs, SplitMix64, Vfs};
use kvstore::{Options, Store};
use std::path::Path;
use std::sync::Arc;

const PAGE: usize = 4096;
const HEADER: usize = 32;
const DATA: &str = "/db/data.kv";
/// Cases `cargo test` runs.
const CASES: u64 = 1000;

fn options() -> Options {
    Options {
        buckets: 8,
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 64 << 10,
            background_preallocation: false,
            ..journal_core::Options::default()
        },
        checkpoint_interval: None,
        ..Options::default()
    }
}

fn open(vfs: &SimVfs) -> kvstore::Result<Store> {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    Store::open_with(v, "/db", options())
}

/// A closed store: keys home in the data file (chains of several pages
/// for the larger buckets), a few more only in the journal.
fn base() -> SimVfs {
    let vfs = SimVfs::new();
    let s = open(&vfs).unwrap();
    let mut rng = SplitMix64::new(7);
    for i in 0..120u32 {
        let mut v = vec![0u8; rng.range(1, 3000) as usize];
        rng.fill(&mut v);
        s.put(format!("key-{i}").as_bytes(), &v).unwrap();
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
    let mut data = image.live_contents(Path::new(DATA)).unwrap();
    let pages = data.len() / PAGE;
    // The meta page one case in eight; else a page in use (non-zero).
    let p = if rng.chance(1, 8) {
        0
    } else {
        let used: Vec<usize> = (1..pages)
            .filter(|&p| data[p * PAGE..p * PAGE + 4] == *b"KVPG")
            .collect();
        used[rng.below(used.len() as u64) as usize]
    };
    let page = &mut data[p * PAGE..(p + 1) * PAGE];
    for _ in 0..rng.range(1, 3) {
        let (off, width) = if p == 0 {
            [(8, 2), (10, 2), (12, 4)][rng.below(3) as usize]
        } else {
            match rng.below(8) {
                0 => (8, 8),      // page LSN
                1 => (16, 4),     // page number
                2 => (20, 4),     // next page of the chain
                3 => (24, 2),     // kind
                4 => (26, 2),     // payload bytes
                5 => (HEADER, 4), // a head's entry count
                // A key or value length somewhere in the entries.
                6 => (HEADER + rng.below((PAGE - HEADER - 4) as u64) as usize, 2),
                _ => (HEADER + rng.below((PAGE - HEADER - 4) as u64) as usize, 4),
            }
        };
        let v = rng.hostile(field(page, off, width), width);
        page[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
    seal(page);
    let f = image.open(Path::new(DATA), OpenOptions::write()).unwrap();
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
    for i in 0..120u32 {
        let _ = s.get(format!("key-{i}").as_bytes());
    }
    let _ = s.scan(..);
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
