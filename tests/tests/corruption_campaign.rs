//! The corruption campaign: build journals with several checkpoints and
//! recycled segments, damage them one mutation at a time — bit flips
//! anywhere (control file, segment headers, record headers, payloads),
//! zeroed 512 B and 4 KiB blocks, swapped blocks, truncated, extended and
//! deleted files, foreign files — and open each damaged copy in every
//! recovery mode. Per mutation:
//!
//! - nothing panics;
//! - no wrong byte is ever returned: every entry read is an acknowledged
//!   record, at its LSN, byte for byte;
//! - every acknowledged record at or after the checkpoint is returned, or
//!   lies in a skipped range recovery reported, or the open (or the
//!   replay) failed with an error — never a silently shorter log, and the
//!   checkpoint never moves forward;
//! - damage wholly outside the live log (below the checkpoint, past the
//!   end, headers of segments the log does not use, foreign files) loses
//!   nothing: the default mode opens and returns every record.
//!
//! `cargo xtask corrupt --minutes N` runs it for N minutes (release build);
//! under `cargo test` it runs a few seconds. `JOURNAL_CORRUPT_SEED=S`
//! replays one seed. It prints counts per mutation class and mode.
#![cfg(not(loom))]

use journal_core::format::{parse_name, segment_name, NameKind, DATA_OFFSET, HEADER_SIZE};
use journal_core::vfs::{CrashPolicy, OpenOptions, SimVfs, SplitMix64, Vfs};
use journal_core::{read_control, Error, Geometry, Journal, Lsn, Options, RecoveryMode};
use journal_tests::{payload, sim_dir};
use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

const MODES: [RecoveryMode; 3] = [
    RecoveryMode::TolerateTornTail,
    RecoveryMode::AbsoluteConsistency,
    RecoveryMode::SkipCorrupt,
];

const CLASSES: [&str; 13] = [
    "flip-control",
    "flip-segment-header",
    "flip-record-header",
    "flip-payload",
    "flip-anywhere",
    "zero-512",
    "zero-4096",
    "swap-blocks",
    "truncate",
    "extend",
    "delete",
    "foreign-file",
    "garbage-segment",
];

/// `write_ahead` 0 keeps the in-flight window at the ring (32 KiB);
/// the default widens it past the whole log (1 MiB against 6 segments of
/// 64 KiB), leaving the durable-LSN stamps and the control file's end to
/// tell damage from a torn tail. Each base journal picks one.
fn options(mode: RecoveryMode, write_ahead: u64) -> Options {
    Options {
        write_ahead,
        segment_size: 64 << 10,
        logbufs: 2,
        logbsize: 16 << 10,
        max_segments: 6,
        preallocate_ahead: 1,
        background_preallocation: false,
        recovery_mode: mode,
        ..Options::default()
    }
}

fn geometry() -> Geometry {
    let o = options(RecoveryMode::TolerateTornTail, 0);
    Geometry::new(o.segment_size, o.alignment)
}

fn open(vfs: &SimVfs, mode: RecoveryMode, write_ahead: u64) -> journal_core::Result<Journal> {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    Journal::open_with(v, sim_dir(), options(mode, write_ahead))
}

/// A damaged-able journal: what was acknowledged, where the live log is.
struct Base {
    vfs: SimVfs,
    /// The `write_ahead` it was written and is opened with.
    write_ahead: u64,
    acked: BTreeMap<Lsn, Vec<u8>>,
    /// The first record of the live log and the end of the log.
    scan: Lsn,
    redo: Lsn,
    end: Lsn,
    /// Record starts in the live log.
    records: Vec<Lsn>,
    /// Closed cleanly (its durable end is recorded).
    closed: bool,
}

fn build(rng: &mut SplitMix64) -> Base {
    let vfs = SimVfs::new();
    let write_ahead = if rng.chance(1, 2) {
        0
    } else {
        journal_core::DEFAULT_WRITE_AHEAD
    };
    let j = open(&vfs, RecoveryMode::TolerateTornTail, write_ahead).unwrap();
    let mut acked = BTreeMap::new();
    let n = rng.range(150, 400) as u32;
    let mut lsns = Vec::new();
    for s in 0..n {
        let p = payload(1, s, rng.range(1, 2500) as usize);
        let l = if rng.chance(1, 3) {
            // Several entries share a log record.
            let l = j.append(&p).unwrap();
            if rng.chance(1, 2) {
                j.commit(l).unwrap();
            }
            l
        } else {
            j.append_durable(&p).unwrap()
        };
        acked.insert(l, p);
        lsns.push(l);
        if s % 90 == 89 {
            j.checkpoint(lsns[lsns.len() - rng.range(1, 30) as usize])
                .unwrap();
        }
    }
    let closed = rng.chance(1, 2);
    if closed {
        j.close().unwrap();
    } else {
        j.force_all().unwrap();
    }
    drop(j);
    let c = read_control(&vfs, &sim_dir()).unwrap().unwrap();
    // The record starts of the live log, as a reader finds them.
    let j = open(
        &vfs.crash(CrashPolicy::DropUnsynced),
        RecoveryMode::AbsoluteConsistency,
        write_ahead,
    )
    .expect("the undamaged journal opens in every mode");
    let end = j.durable_lsn();
    let mut inspector =
        journal_core::inspect::Inspector::open_with(Arc::new(vfs.clone()), sim_dir())
            .expect("the undamaged journal inspects");
    let records: Vec<Lsn> = inspector
        .records(c.scan_lsn)
        .map(|r| r.expect("a valid live record").lsn)
        .take_while(|&l| l < end)
        .collect();
    drop(inspector);
    let replayed: Vec<_> = j
        .read_from(j.redo_lsn())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (l, b) in &replayed {
        assert_eq!(
            acked.get(l),
            Some(&b.to_vec()),
            "the undamaged journal replays what was written"
        );
    }
    drop(j);
    Base {
        vfs,
        write_ahead,
        acked,
        scan: c.scan_lsn,
        redo: c.redo_lsn,
        end,
        records,
        closed,
    }
}

/// The files of the journal directory.
fn files(vfs: &SimVfs) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = vfs
        .read_dir(&sim_dir())
        .unwrap()
        .into_iter()
        .map(|n| sim_dir().join(n))
        .collect();
    v.sort();
    v
}

fn segment_of_path(p: &std::path::Path) -> Option<u64> {
    match parse_name(p.file_name()?.to_str()?) {
        NameKind::Segment(n) => Some(n),
        _ => None,
    }
}

/// One mutation: its class, a description to replay it by, and whether it
/// lies wholly outside the live log.
struct Mutation {
    class: &'static str,
    what: String,
    outside: bool,
}

impl Base {
    /// Whether byte `off` of file `path` holds part of the live log (or
    /// the metadata the live log depends on).
    fn live_byte(&self, path: &std::path::Path, off: u64) -> bool {
        let Some(n) = segment_of_path(path) else {
            // The control file is metadata of the live log; other files
            // (LOCK, foreign) are not.
            return path.file_name().is_some_and(|f| f == "control");
        };
        let g = geometry();
        let live_segments = g.segment_of(self.scan)..=g.segment_of(Lsn(self.end.0.max(1) - 1));
        if off < DATA_OFFSET {
            return live_segments.contains(&n) && self.end > self.scan;
        }
        let lsn = Lsn(g.segment_start(n).0 + off - DATA_OFFSET);
        self.scan <= lsn && lsn < self.end
    }

    fn live_range(&self, path: &std::path::Path, from: u64, len: u64) -> bool {
        (from..from + len).any(|o| self.live_byte(path, o))
    }

    /// A whole file: live if any of it is (its size and name are).
    fn live_file(&self, path: &std::path::Path) -> bool {
        match segment_of_path(path) {
            Some(n) => {
                let g = geometry();
                self.end > self.scan
                    && (g.segment_of(self.scan)..=g.segment_of(Lsn(self.end.0 - 1))).contains(&n)
            }
            None => path.file_name().is_some_and(|f| f == "control"),
        }
    }
}

fn rewrite(vfs: &SimVfs, path: &std::path::Path, bytes: &[u8]) {
    let f = vfs.open(path, OpenOptions::write()).unwrap();
    f.set_len(0).unwrap();
    f.write_at(bytes, 0).unwrap();
    f.sync_all().unwrap();
}

/// Creates `path` durably, holding `len` random bytes; returns `len`.
fn create_junk(vfs: &SimVfs, path: &std::path::Path, len: usize, rng: &mut SplitMix64) -> usize {
    let mut junk = vec![0u8; len];
    rng.fill(&mut junk);
    let f = vfs.open(path, OpenOptions::create()).unwrap();
    f.write_at(&junk, 0).unwrap();
    f.sync_all().unwrap();
    vfs.sync_dir(&sim_dir()).unwrap();
    len
}

/// Applies one random mutation of `class` to `vfs` (a copy of the base).
fn mutate(base: &Base, vfs: &SimVfs, class: &'static str, rng: &mut SplitMix64) -> Mutation {
    let all = files(vfs);
    let segs: Vec<PathBuf> = all
        .iter()
        .filter(|p| segment_of_path(p).is_some())
        .cloned()
        .collect();
    let pick = |rng: &mut SplitMix64, v: &[PathBuf]| v[rng.below(v.len() as u64) as usize].clone();
    let control = sim_dir().join("control");
    let flip = |rng: &mut SplitMix64, path: &std::path::Path, off: u64| -> Mutation {
        let mut b = vfs.live_contents(path).unwrap();
        let bit = rng.below(8);
        b[off as usize] ^= 1 << bit;
        rewrite(vfs, path, &b);
        Mutation {
            class,
            what: format!("flip bit {bit} of byte {off} of {}", path.display()),
            outside: !base.live_byte(path, off),
        }
    };
    let record_at = |rng: &mut SplitMix64| -> Option<(PathBuf, u64, Lsn)> {
        let r = *base
            .records
            .get(rng.below(base.records.len().max(1) as u64) as usize)?;
        let (seg, off) = geometry().locate(r);
        Some((sim_dir().join(segment_name(seg)), off, r))
    };
    match class {
        "flip-control" => {
            let off = rng.below(1024);
            flip(rng, &control, off)
        }
        "flip-segment-header" => {
            let p = pick(rng, &segs);
            let off = rng.below(48);
            flip(rng, &p, off)
        }
        "flip-record-header" | "flip-payload" => match record_at(rng) {
            Some((p, off, _)) => {
                let len = vfs.live_contents(&p).unwrap().len() as u64;
                let o = if class == "flip-record-header" {
                    off + rng.below(HEADER_SIZE as u64)
                } else {
                    off + HEADER_SIZE as u64 + rng.below(64)
                };
                flip(rng, &p, o.min(len - 1))
            }
            None => {
                let off = rng.below(1024);
                flip(rng, &control, off)
            }
        },
        "flip-anywhere" => {
            let p = pick(rng, &all);
            let len = vfs.live_contents(&p).unwrap().len() as u64;
            if len == 0 {
                return mutate(base, vfs, "delete", rng);
            }
            let off = rng.below(len);
            flip(rng, &p, off)
        }
        "zero-512" | "zero-4096" => {
            let block = if class == "zero-512" { 512 } else { 4096 };
            let p = pick(rng, &all);
            let mut b = vfs.live_contents(&p).unwrap();
            let blocks = (b.len() as u64).div_ceil(block).max(1);
            let at = rng.below(blocks) * block;
            let end = (at + block).min(b.len() as u64);
            b[at as usize..end as usize].fill(0);
            rewrite(vfs, &p, &b);
            Mutation {
                class,
                what: format!("zero {at}..{end} of {}", p.display()),
                outside: !base.live_range(&p, at, end - at),
            }
        }
        "swap-blocks" => {
            let p = pick(rng, &segs);
            let mut b = vfs.live_contents(&p).unwrap();
            let blocks = b.len() as u64 / 512;
            let (x, y) = (rng.below(blocks) * 512, rng.below(blocks) * 512);
            let bx = b[x as usize..x as usize + 512].to_vec();
            let by = b[y as usize..y as usize + 512].to_vec();
            b[x as usize..x as usize + 512].copy_from_slice(&by);
            b[y as usize..y as usize + 512].copy_from_slice(&bx);
            rewrite(vfs, &p, &b);
            Mutation {
                class,
                what: format!("swap blocks at {x} and {y} of {}", p.display()),
                outside: (x == y || bx == by)
                    || (!base.live_range(&p, x, 512) && !base.live_range(&p, y, 512)),
            }
        }
        "truncate" | "extend" => {
            let p = pick(rng, &all);
            let len = vfs.live_contents(&p).unwrap().len() as u64;
            let new = if class == "truncate" {
                rng.below(len.max(1))
            } else {
                len + rng.range(1, 8192)
            };
            let f = vfs.open(&p, OpenOptions::write()).unwrap();
            f.set_len(new).unwrap();
            f.sync_all().unwrap();
            Mutation {
                class,
                what: format!("set the length of {} from {len} to {new}", p.display()),
                outside: !base.live_file(&p),
            }
        }
        "delete" => {
            let p = pick(rng, &all);
            vfs.remove_file(&p).unwrap();
            vfs.sync_dir(&sim_dir()).unwrap();
            Mutation {
                class,
                what: format!("delete {}", p.display()),
                outside: !base.live_file(&p),
            }
        }
        "foreign-file" => {
            let names = [
                "notes.txt",
                "0000000000000007.seg.tmp",
                "control.tmp",
                "x.seg",
            ];
            let name = names[rng.below(names.len() as u64) as usize];
            let p = sim_dir().join(name);
            let len = create_junk(vfs, &p, rng.range(0, 5000) as usize, rng);
            Mutation {
                class,
                what: format!("create {} ({len} bytes)", p.display()),
                outside: true,
            }
        }
        "garbage-segment" => {
            // A file with a segment's name and garbage in it, where no
            // segment is.
            let top = segs
                .iter()
                .filter_map(|p| segment_of_path(p))
                .max()
                .unwrap_or(0);
            let n = top + rng.range(1, 4);
            let p = sim_dir().join(segment_name(n));
            let len = create_junk(vfs, &p, rng.range(0, 70000) as usize, rng);
            Mutation {
                class,
                what: format!("create {} with {len} garbage bytes", p.display()),
                outside: true,
            }
        }
        other => unreachable!("class {other}"),
    }
}

/// What one open of a damaged copy did.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
enum Outcome {
    /// Opened and returned every acknowledged record.
    Whole,
    /// Opened, reporting skipped ranges or failing the replay with an error.
    Reported,
    /// Opened, ending the log at damage to its last records (a journal
    /// that was not closed: indistinguishable from a crash mid-write).
    EndedEarly,
    /// Refused to open, with an error.
    Refused,
}

/// Opens a damaged copy in `mode` and checks the campaign's invariants.
fn judge(base: &Base, vfs: &SimVfs, mode: RecoveryMode, m: &Mutation, ctx: &str) -> Outcome {
    let j = match open(
        &vfs.crash(CrashPolicy::DropUnsynced),
        mode,
        base.write_ahead,
    ) {
        Err(e) => {
            assert!(
                !(m.outside && mode == RecoveryMode::TolerateTornTail),
                "{ctx}: damage outside the live log refused the open: {e}"
            );
            return Outcome::Refused;
        }
        Ok(j) => j,
    };
    assert!(
        j.redo_lsn() <= base.redo,
        "{ctx}: the checkpoint moved forward ({} > {})",
        j.redo_lsn(),
        base.redo
    );
    let mut got = HashMap::new();
    let mut failed: Option<Error> = None;
    for r in j.read_from(j.redo_lsn()).unwrap() {
        match r {
            Ok((l, b)) => {
                assert_eq!(
                    base.acked.get(&l),
                    Some(&b.to_vec()),
                    "{ctx}: an entry at {l} that was never written ({} bytes)",
                    b.len()
                );
                got.insert(l, ());
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let skipped = j.recovery_report().skipped.clone();
    let end = j.recovery_report().end_lsn;
    let mut complete = failed.is_none();
    let mut cut_at_end = false;
    for l in base.acked.keys().filter(|l| **l >= j.redo_lsn()) {
        if got.contains_key(l) {
            continue;
        }
        complete = false;
        let named = failed.is_some() || skipped.iter().any(|s| s.from <= *l && *l < s.to);
        // Records past the end the report names, of a journal that was not
        // closed (a clean close records its durable end, and recovery then
        // refuses to end earlier): damage to the last records, with no
        // later record written after them, reads exactly as a crash in
        // mid-write. No journal can tell; the report names where it ended.
        let at_the_end = !base.closed && *l >= end;
        cut_at_end |= at_the_end && !named;
        assert!(
            named || at_the_end,
            "{ctx}: acknowledged record at {l} lost in silence: {:?}",
            j.recovery_report()
        );
    }
    if m.outside && mode == RecoveryMode::TolerateTornTail {
        assert!(
            complete,
            "{ctx}: damage outside the live log lost records: {failed:?} {:?}",
            j.recovery_report()
        );
    }
    if cut_at_end {
        Outcome::EndedEarly
    } else if complete && skipped.is_empty() {
        Outcome::Whole
    } else {
        Outcome::Reported
    }
}

type Tally = BTreeMap<(&'static str, String, Outcome), u64>;

/// One seed: a fresh base journal, then `per_base` mutations of it.
fn run_seed(seed: u64, per_base: u64, tally: &mut Tally) -> u64 {
    let mut rng = SplitMix64::new(seed);
    let base = build(&mut rng);
    for i in 0..per_base {
        let class = CLASSES[rng.below(CLASSES.len() as u64) as usize];
        let vfs = base.vfs.crash(CrashPolicy::DropUnsynced);
        let m = mutate(&base, &vfs, class, &mut rng);
        for mode in MODES {
            let ctx = format!(
                "seed {seed} mutation {i} ({}: {}, {}) {mode:?}",
                m.class,
                m.what,
                if m.outside {
                    "outside the live log"
                } else {
                    "in the live log"
                }
            );
            let r =
                std::panic::catch_unwind(AssertUnwindSafe(|| judge(&base, &vfs, mode, &m, &ctx)));
            match r {
                Ok(o) => *tally.entry((m.class, format!("{mode:?}"), o)).or_default() += 1,
                Err(e) => {
                    eprintln!("corruption campaign failed: {ctx}; replay with JOURNAL_CORRUPT_SEED={seed}");
                    std::panic::resume_unwind(e);
                }
            }
        }
    }
    per_base
}

/// Base journals (seeds) `cargo test` runs.
const SEEDS: u64 = 12;

#[test]
fn corruption_campaign() {
    let per_base = 60;
    let mut tally = Tally::new();
    if let Ok(s) = std::env::var("JOURNAL_CORRUPT_SEED") {
        let seed: u64 = s.parse().expect("JOURNAL_CORRUPT_SEED is a number");
        run_seed(seed, per_base, &mut tally);
        return;
    }
    let budget: Option<f64> = std::env::var("JOURNAL_CORRUPT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let fixed: u64 = std::env::var("JOURNAL_CORRUPT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS);
    let start = Instant::now();
    let (mut seeds, mut mutations) = (0u64, 0u64);
    while match budget {
        Some(b) => seeds == 0 || start.elapsed().as_secs_f64() < b,
        None => seeds < fixed,
    } {
        mutations += run_seed(seeds, per_base, &mut tally);
        seeds += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "corruption campaign: {seeds} journals, {mutations} mutations × {} modes in {secs:.1} s ({:.0} mutations/s)",
        MODES.len(),
        mutations as f64 / secs
    );
    println!(
        "{:<20} {:<20} {:>8} {:>9} {:>8} {:>8}",
        "class", "mode", "whole", "reported", "end-cut", "refused"
    );
    for class in CLASSES {
        for mode in MODES {
            let mode = format!("{mode:?}");
            let n = |o| tally.get(&(class, mode.clone(), o)).copied().unwrap_or(0);
            println!(
                "{class:<20} {mode:<20} {:>8} {:>9} {:>8} {:>8}",
                n(Outcome::Whole),
                n(Outcome::Reported),
                n(Outcome::EndedEarly),
                n(Outcome::Refused)
            );
        }
    }
    // Over the fixed seeds every class of damage was tried, and damage was
    // both survived whole and caught (reported or refused).
    if budget.is_none() && fixed >= SEEDS {
        let tried = |class: &&str| tally.iter().any(|((c, _, _), n)| c == class && *n > 0);
        let untried: Vec<_> = CLASSES.iter().filter(|c| !tried(c)).collect();
        assert!(untried.is_empty(), "classes never tried: {untried:?}");
        let seen = |o| tally.iter().any(|((_, _, x), n)| *x == o && *n > 0);
        assert!(seen(Outcome::Whole) && (seen(Outcome::Reported) || seen(Outcome::Refused)));
    }
}
