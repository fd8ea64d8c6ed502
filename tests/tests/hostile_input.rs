//! The hostile-input campaign: damage that gets past the checksums.
//!
//! A bit flip is caught by a CRC; an attacker, a buggy tool or a
//! misdirected write that also rewrites the CRC is not. Each case takes a
//! journal image, sets one field of one structure to a hostile value —
//! zero, one, powers of two and their neighbours, `2^62`, `u64::MAX`, the
//! field's neighbours' values, random bits — and *re-seals* the structure's
//! CRC, so only the journal's own validation stands between the value and
//! an arithmetic overflow, a huge allocation or wrong bytes. Structures:
//! the control slots, segment headers, record headers, the entry lengths
//! inside a record, and a forged record past the end of the log.
//!
//! Two kinds of case, counted apart:
//! - **parser cases** hand the mutated bytes to one parser
//!   ([`read_control`], [`SegmentHeader::check`]):
//!   a verdict, never a panic;
//! - **whole cases** open the mutated image (recovery, then a full replay)
//!   and inspect it the way `journal stat`, `dump` and `verify` do
//!   ([`Inspector`]). The oracle: a typed error, or a replay whose every
//!   entry is one that was written, at its LSN, byte for byte, in LSN
//!   order — never a panic, never a hang, never wrong bytes.
//!
//! `cargo test` runs a fixed number of cases ([`WHOLE`], [`PARSER`] per
//! whole case); `cargo xtask fuzz --minutes N` runs for a time budget
//! (`JOURNAL_FUZZ_SECONDS`) on every core and prints the counts.
#![cfg(not(loom))]

use journal_core::format::{
    parse_name, NameKind, SegmentHeader, CONTINUED, CONTINUES, HEADER_SIZE, SEGMENT_HEADER_SIZE,
};
use journal_core::inspect::Inspector;
use journal_core::vfs::{CrashPolicy, OpenOptions, SimVfs, SplitMix64, Vfs};
use journal_core::{read_control, Journal, Lsn, Options, RecoveryMode, CONTROL_FILE};
use journal_tests::{check_payload, payload, sim_dir, small_options};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Whole cases `cargo test` runs.
const WHOLE: u64 = 400;
/// Parser cases per whole case.
const PARSER: u64 = 10;

/// The slot's byte layout (docs/FORMAT.md): (offset, width) per field,
/// the CRC32C of bytes 0..76 at 76.
const CONTROL_FIELDS: [(usize, usize); 11] = [
    (0, 4),  // magic
    (4, 2),  // version
    (8, 8),  // seq
    (16, 8), // journal id, first half
    (32, 8), // segment_size
    (40, 8), // redo_lsn
    (48, 8), // scan_lsn
    (56, 4), // alignment
    (60, 4), // inflight_window
    (64, 8), // end_lsn
    (72, 4), // reserved
];
const CONTROL_CRC: usize = 76;
const SLOT: usize = 512;

/// Segment header fields; CRC32C of bytes 0..44 at 44.
const SEGMENT_FIELDS: [(usize, usize); 6] = [(4, 2), (6, 2), (8, 8), (16, 8), (24, 8), (40, 4)];

/// Record header fields; the CRC at 32 covers the header (CRC zeroed)
/// and `len` payload bytes.
const RECORD_FIELDS: [(usize, usize); 8] = [
    (4, 2),  // version
    (6, 2),  // flags
    (8, 8),  // lsn
    (16, 8), // tail_lsn
    (24, 4), // len
    (28, 4), // entry_count
    (36, 8), // durable_lsn
    (44, 4), // reserved
];

fn options() -> Options {
    Options {
        background_preallocation: false,
        recovery_mode: RecoveryMode::TolerateTornTail,
        ..small_options()
    }
}

/// The journal every case starts from, and what was written to it.
struct Base {
    image: SimVfs,
    /// Every entry appended and made durable, by LSN.
    written: BTreeMap<Lsn, Vec<u8>>,
    /// The LSNs of its records, from the checkpoint on.
    records: Vec<Lsn>,
    /// The segment files, by number.
    segments: Vec<(u64, PathBuf)>,
}

fn build() -> Base {
    let vfs = SimVfs::new();
    let v: std::sync::Arc<dyn Vfs> = std::sync::Arc::new(vfs.clone());
    let j = Journal::open_with(v, sim_dir(), options()).unwrap();
    let mut written = BTreeMap::new();
    for s in 0..240u32 {
        // Every 40th is chained over buffers (16 KiB each).
        let len = if s % 40 == 7 {
            40_000
        } else {
            30 + (s as usize * 97) % 2500
        };
        let p = payload(1, s, len);
        let lsn = j.append_durable(&p).unwrap();
        written.insert(lsn, p);
        if s == 120 {
            j.checkpoint(lsn).unwrap();
        }
    }
    j.close().unwrap();
    drop(j);
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    let v: std::sync::Arc<dyn Vfs> = std::sync::Arc::new(image.clone());
    let mut ins = Inspector::open_with(v, sim_dir()).unwrap();
    let records = ins.records(Lsn(0)).map(|r| r.unwrap().lsn).collect();
    let mut segments: Vec<(u64, PathBuf)> = image
        .read_dir(&sim_dir())
        .unwrap()
        .into_iter()
        .filter_map(|n| match parse_name(&n) {
            NameKind::Segment(k) => Some((k, sim_dir().join(n))),
            _ => None,
        })
        .collect();
    segments.sort();
    drop(ins);
    Base {
        image,
        written,
        records,
        segments,
    }
}

/// The little-endian field `width` bytes wide at `off`.
fn get(b: &[u8], off: usize, width: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..width].copy_from_slice(&b[off..off + width]);
    u64::from_le_bytes(w)
}

fn put(b: &mut [u8], off: usize, width: usize, v: u64) {
    b[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

fn rewrite(vfs: &SimVfs, path: &Path, bytes: &[u8]) {
    let f = vfs.open(path, OpenOptions::write()).unwrap();
    f.set_len(0).unwrap();
    f.write_at(bytes, 0).unwrap();
    f.sync_all().unwrap();
}

/// What a mutation did, for the failure message.
#[derive(Debug)]
#[expect(
    dead_code,
    reason = "the fields are printed (Debug) in failure messages"
)]
struct Mutation {
    what: &'static str,
    at: u64,
    field: usize,
    value: u64,
    /// It changed a record's chain bits ([`CONTINUED`], [`CONTINUES`]).
    forges_chain: bool,
}

/// Mutates one field of one structure of `vfs` (a copy of the base) and
/// re-seals its CRC.
fn mutate(base: &Base, vfs: &SimVfs, rng: &mut SplitMix64) -> Mutation {
    match rng.below(5) {
        0 => {
            let path = sim_dir().join(CONTROL_FILE);
            let mut b = vfs.live_contents(&path).unwrap();
            // The slot with the higher sequence number is the current one.
            let slot = if get(&b, 8, 8) >= get(&b, SLOT + 8, 8) {
                0
            } else {
                SLOT
            };
            let (off, width) = CONTROL_FIELDS[rng.below(CONTROL_FIELDS.len() as u64) as usize];
            let value = rng.hostile(get(&b, slot + off, width), width);
            put(&mut b, slot + off, width, value);
            let crc = crc32c::crc32c(&b[slot..slot + CONTROL_CRC]);
            put(&mut b, slot + CONTROL_CRC, 4, crc as u64);
            rewrite(vfs, &path, &b);
            Mutation {
                what: "control slot",
                at: slot as u64,
                field: off,
                value,
                forges_chain: false,
            }
        }
        1 => {
            let (n, path) = &base.segments[rng.below(base.segments.len() as u64) as usize];
            let mut b = vfs.live_contents(path).unwrap();
            let (off, width) = SEGMENT_FIELDS[rng.below(SEGMENT_FIELDS.len() as u64) as usize];
            let value = rng.hostile(get(&b, off, width), width);
            put(&mut b, off, width, value);
            let crc = crc32c::crc32c(&b[..44]);
            put(&mut b, 44, 4, crc as u64);
            rewrite(vfs, path, &b);
            Mutation {
                what: "segment header",
                at: *n,
                field: off,
                value,
                forges_chain: false,
            }
        }
        k => {
            // A record header (2), an entry length inside a record (3), or
            // a record forged where the log ends (4).
            let g = journal_core::Geometry::new(options().segment_size, options().alignment);
            let lsn = if k == 4 {
                *base.records.last().unwrap()
            } else {
                base.records[rng.below(base.records.len() as u64) as usize]
            };
            let (seg, off) = g.locate(lsn);
            let Some((_, path)) = base.segments.iter().find(|(n, _)| *n == seg) else {
                return Mutation {
                    what: "nothing (segment gone)",
                    at: lsn.0,
                    field: 0,
                    value: 0,
                    forges_chain: false,
                };
            };
            let mut b = vfs.live_contents(path).unwrap();
            let off = off as usize;
            if off + HEADER_SIZE > b.len() {
                return Mutation {
                    what: "nothing (short)",
                    at: lsn.0,
                    field: 0,
                    value: 0,
                    forges_chain: false,
                };
            }
            let (field, value, forges_chain) = if k == 3 {
                // The first entry's 4-byte length, just after the header.
                let at = off + HEADER_SIZE;
                let value = rng.hostile(get(&b, at, 4), 4);
                put(&mut b, at, 4, value);
                (HEADER_SIZE, value, false)
            } else {
                let (f, width) = RECORD_FIELDS[rng.below(RECORD_FIELDS.len() as u64) as usize];
                let old = get(&b, off + f, width);
                let value = rng.hostile(old, width);
                put(&mut b, off + f, width, value);
                let chain_bits = u64::from(CONTINUED | CONTINUES);
                (f, value, f == 6 && (old ^ value) & chain_bits != 0)
            };
            // Re-seal: the CRC over the header and as much of the payload
            // as `len` now claims and the file holds.
            let len = (get(&b, off + 24, 4) as usize).min(b.len() - off - HEADER_SIZE);
            let mut header = b[off..off + HEADER_SIZE].to_vec();
            header[32..36].fill(0);
            let crc = crc32c::crc32c_append(
                crc32c::crc32c(&header),
                &b[off + HEADER_SIZE..off + HEADER_SIZE + len],
            );
            put(&mut b, off + 32, 4, crc as u64);
            rewrite(vfs, path, &b);
            let what = [
                "",
                "",
                "record header",
                "entry length",
                "forged last record",
            ][k as usize];
            Mutation {
                what,
                at: lsn.0,
                field,
                value,
                forges_chain,
            }
        }
    }
}

/// Parser cases on `vfs`'s mutated bytes: each parser gives a verdict.
fn parse_all(vfs: &SimVfs, base: &Base) {
    let _ = read_control(vfs, &sim_dir());
    for (_, path) in &base.segments {
        if let Some(b) = vfs.live_contents(path) {
            let _ = SegmentHeader::check(&b[..SEGMENT_HEADER_SIZE.min(b.len())]);
        }
    }
}

/// One whole case: open, replay, inspect. Returns a description of what
/// went wrong, if anything did besides a typed error.
fn judge(base: &Base, vfs: &SimVfs, m: &Mutation) -> Option<String> {
    let v: std::sync::Arc<dyn Vfs> = std::sync::Arc::new(vfs.clone());
    // The read-only tools first (they must not need the journal to open).
    if let Ok(mut ins) = Inspector::open_with(v.clone(), sim_dir()) {
        let _ = ins.segments();
        let _ = ins.scan(RecoveryMode::TolerateTornTail);
        for r in ins.records(Lsn(0)).take(10_000) {
            if r.is_err() {
                break;
            }
        }
    }
    let j = match Journal::open_with(v, sim_dir(), options()) {
        Ok(j) => j,
        Err(_) => return None, // a typed error: fine
    };
    OPENED.fetch_add(1, Ordering::Relaxed);
    let mut last = None;
    let iter = match j.read_from(j.redo_lsn()) {
        Ok(it) => it,
        Err(_) => return None,
    };
    for r in iter.take(100_000) {
        let Ok((lsn, bytes)) = r else { break };
        if last.is_some_and(|l| lsn <= l) {
            return Some(format!("{m:?}: entries out of order at {lsn}"));
        }
        last = Some(lsn);
        match base.written.get(&lsn) {
            Some(w) if bytes[..] == w[..] => {}
            Some(_) => return Some(format!("{m:?}: wrong bytes at {lsn}")),
            None if check_payload(&bytes).is_none() => {
                return Some(format!(
                    "{m:?}: an entry never written at {lsn} ({} bytes)",
                    bytes.len()
                ))
            }
            None => return Some(format!("{m:?}: an entry at {lsn}, where none was written")),
        }
    }
    None
}

/// Whole cases whose image opened (the rest got a typed error).
static OPENED: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Counts {
    whole: AtomicU64,
    parser: AtomicU64,
    /// Whole cases whose forged chain bits made an entry read wrong.
    forged_chains: AtomicU64,
}

/// Runs cases from `seed` on until `more` says stop; panics on the first
/// finding, naming the case.
fn run(base: &Base, seed: u64, counts: &Counts, more: &dyn Fn(u64) -> bool) {
    let mut n = 0;
    while more(n) {
        let mut rng = SplitMix64::new(seed.wrapping_mul(1_000_003).wrapping_add(n));
        let vfs = base.image.crash(CrashPolicy::DropUnsynced);
        for _ in 0..PARSER {
            let copy = vfs.crash(CrashPolicy::DropUnsynced);
            mutate(base, &copy, &mut rng);
            parse_all(&copy, base);
            counts.parser.fetch_add(1, Ordering::Relaxed);
        }
        // One to three mutations on the image of the whole case.
        let ms: Vec<Mutation> = (0..1 + rng.below(3))
            .map(|_| mutate(base, &vfs, &mut rng))
            .collect();
        let verdict = judge(base, &vfs, &ms[0]);
        match verdict {
            // A record whose chain bits were rewritten with its CRC says,
            // consistently, that an entry ends (or goes on) where it does
            // not: nothing in the format contradicts it until a later
            // record, after the entry was handed out (docs/FORMAT.md,
            // "What the checksums cannot catch"). Counted, not failed.
            Some(_) if ms.iter().any(|m| m.forges_chain) => {
                counts.forged_chains.fetch_add(1, Ordering::Relaxed);
            }
            Some(bad) => panic!("hostile input, seed {seed} case {n}: {bad} (all: {ms:?})"),
            None => {}
        }
        counts.whole.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
}

#[test]
fn hostile_inputs_get_typed_errors_or_exact_bytes() {
    let budget: Option<f64> = std::env::var("JOURNAL_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let base = build();
    assert!(base.records.len() > 20 && base.segments.len() > 2);
    let counts = Counts::default();
    let start = Instant::now();
    let cores = match budget {
        Some(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        None => 1,
    } as u64;
    let (tick, ticks) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let runners: Vec<_> = (0..cores)
            .map(|c| {
                let (base, counts, tick) = (&base, &counts, tick.clone());
                s.spawn(move || {
                    let more = |n: u64| {
                        let _ = tick.send(());
                        match budget {
                            Some(b) => start.elapsed().as_secs_f64() < b,
                            None => n < WHOLE,
                        }
                    };
                    run(base, c, counts, &more)
                })
            })
            .collect();
        drop(tick);
        // A case that takes a minute is a hang: fail rather than wait.
        loop {
            match ticks.recv_timeout(Duration::from_secs(60)) {
                Ok(()) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("hostile input: no case finished in 60 s (a hang)")
                }
            }
        }
        for r in runners {
            if let Err(e) = r.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let (whole, parser) = (
        counts.whole.load(Ordering::Relaxed),
        counts.parser.load(Ordering::Relaxed),
    );
    let forged = counts.forged_chains.load(Ordering::Relaxed);
    println!(
        "hostile input: {} CRC-valid mutated inputs in {secs:.1} s on {cores} threads: {parser} parser cases, {whole} whole cases ({} opened and replayed, the rest a typed error), each inspected too; 0 panics, 0 hangs, 0 wrong bytes (besides {forged} from forged chain bits)",
        parser + whole,
        OPENED.load(Ordering::Relaxed)
    );
    if budget.is_none() {
        assert_eq!(whole, WHOLE);
    }
}
