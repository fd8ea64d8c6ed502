//! Damage that once made the log shorter without any error (each case
//! failed before recovery cross-checked what it found): a flipped bit in
//! the newest control slot, absolute consistency cutting at a zeroed or
//! stale header, a flipped version bit, a deleted segment in the middle of
//! the log, and a damaged preallocated segment. Now every such log either
//! opens whole, or fails with an error naming the cause, or (skip-corrupt)
//! reports what it skipped.
#![cfg(not(loom))]

use journal_core::format::{segment_name, HEADER_SIZE};
use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
use journal_core::{
    read_control, Damage, Error, Geometry, Journal, LogEnd, Lsn, Options, RecoveryMode, SLOT_SIZE,
};
use journal_tests::{open_sim, payload, replay, sim_dir, small_options, verify};

const MODES: [RecoveryMode; 3] = [
    RecoveryMode::TolerateTornTail,
    RecoveryMode::AbsoluteConsistency,
    RecoveryMode::SkipCorrupt,
];

/// Small options; segments are prepared at open (not in the background)
/// so the preallocated ones exist when a test damages them.
fn opts(mode: RecoveryMode) -> Options {
    Options {
        recovery_mode: mode,
        background_preallocation: false,
        ..small_options()
    }
}

/// Segments much larger than twice the in-flight window (256 KiB against
/// 2 × 16 KiB buffers, no write-ahead beyond them), as with the defaults
/// (16 MiB against 8 × 256 KiB): a scan that only looks a window past the
/// end sees nothing of the next segments.
fn wide(mode: RecoveryMode) -> Options {
    Options {
        segment_size: 256 << 10,
        logbufs: 2,
        logbsize: 16 << 10,
        write_ahead: 0,
        ..opts(mode)
    }
}

fn wide_geometry() -> Geometry {
    let o = wide(RecoveryMode::TolerateTornTail);
    Geometry::new(o.segment_size, o.alignment)
}

fn open_wide(vfs: &SimVfs, mode: RecoveryMode) -> journal_core::Result<Journal> {
    let v: std::sync::Arc<dyn Vfs> = std::sync::Arc::new(vfs.clone());
    Journal::open_with(v, sim_dir(), wide(mode))
}

fn geometry() -> Geometry {
    let o = small_options();
    Geometry::new(o.segment_size, o.alignment)
}

type Acked = Vec<(Lsn, Vec<u8>)>;

/// A journal across several segments with checkpoints (so segments were
/// recycled and both control slots hold checkpoints), left as a crash
/// would leave it. Returns what was acknowledged.
fn busy_journal(vfs: &SimVfs) -> Acked {
    let j = open_wide(vfs, RecoveryMode::TolerateTornTail).unwrap();
    let mut acked = Vec::new();
    for s in 0..2000u32 {
        let p = payload(1, s, 600 + (s as usize * 37) % 400);
        acked.push((j.append_durable(&p).unwrap(), p));
        if s % 500 == 499 {
            j.checkpoint(acked[acked.len() - 40].0).unwrap();
        }
    }
    drop(j);
    acked
}

/// Records with one log record each, left as a crash would leave them.
fn records(vfs: &SimVfs, n: u32, close: bool) -> Acked {
    let j = open_sim(vfs, opts(RecoveryMode::TolerateTornTail)).unwrap();
    let acked: Acked = (0..n)
        .map(|s| {
            let p = payload(2, s, 700);
            (j.append_durable(&p).unwrap(), p)
        })
        .collect();
    if close {
        j.close().unwrap();
    }
    acked
}

fn record_of(entry: Lsn) -> Lsn {
    Lsn(entry.0 - HEADER_SIZE as u64)
}

/// Overwrites bytes of a file, durably.
fn poke_file(vfs: &SimVfs, path: &std::path::Path, offset: u64, bytes: &[u8]) {
    let f = vfs.open(path, OpenOptions::write()).unwrap();
    f.write_at(bytes, offset).unwrap();
    f.sync_data().unwrap();
}

/// Overwrites log bytes at `lsn`.
fn poke(vfs: &SimVfs, lsn: Lsn, bytes: &[u8]) {
    let (seg, off) = geometry().locate(lsn);
    poke_file(vfs, &sim_dir().join(segment_name(seg)), off, bytes);
}

/// Either the open failed with an error naming loss or corruption, or (in
/// skip-corrupt) every acknowledged record at or after the tail was
/// returned or lies in a reported skipped range. Never a silent shorter log.
fn lost_nothing_in_silence(r: journal_core::Result<Journal>, acked: &Acked, ctx: &str) {
    match r {
        Err(Error::Corruption { .. } | Error::LogEndsEarly { .. } | Error::Segment(_)) => {}
        Err(e) => panic!("{ctx}: unexpected error {e}"),
        Ok(j) => {
            let got: std::collections::HashSet<Lsn> = replay(&j).into_iter().map(|e| e.0).collect();
            let skipped = &j.recovery_report().skipped;
            for (lsn, _) in acked.iter().filter(|(l, _)| *l >= j.redo_lsn()) {
                let in_skip = skipped.iter().any(|s| s.from <= *lsn && *lsn < s.to);
                assert!(
                    got.contains(lsn) || in_skip,
                    "{ctx}: acknowledged record at {lsn} lost in silence: {:?}",
                    j.recovery_report()
                );
            }
        }
    }
}

#[test]
fn one_flipped_bit_in_the_newest_control_slot_never_empties_the_log_in_silence() {
    let base = SimVfs::new();
    let acked = busy_journal(&base);
    let c = read_control(&base, &sim_dir()).unwrap().unwrap();
    let newest = (c.seq % 2) * SLOT_SIZE as u64;
    for mode in MODES {
        let vfs = base.crash(journal_core::CrashPolicy::DropUnsynced);
        // One bit of the newest slot's redo LSN: its CRC fails, the reader
        // falls back to the older slot, whose segments were recycled.
        let control = sim_dir().join("control");
        let mut b = vfs.live_contents(&control).unwrap();
        b[newest as usize + 41] ^= 0x04;
        poke_file(&vfs, &control, 0, &b);
        let r = open_wide(&vfs, mode);
        if mode != RecoveryMode::SkipCorrupt {
            assert!(
                r.is_err(),
                "{mode:?}: the fallback opened: {:?}",
                r.map(|j| j.recovery_report().clone())
            );
        }
        lost_nothing_in_silence(r, &acked, &format!("{mode:?}"));
    }
}

#[test]
fn absolute_consistency_refuses_a_zeroed_bad_or_stale_header_followed_by_records() {
    let stale = |vfs: &SimVfs, at: Lsn| -> Vec<u8> {
        // The record that sat one segment's worth of LSNs earlier at the
        // same place of a recycled file: well formed, valid CRC, stale.
        let d = geometry().data_size();
        let (seg, off) = geometry().locate(Lsn(at.0 - d));
        let old = vfs
            .live_contents(&sim_dir().join(segment_name(seg)))
            .unwrap();
        let mut h = old[off as usize..off as usize + HEADER_SIZE].to_vec();
        if h[..4] != *b"ICLG" {
            // Not a record start there: fake one with the stale LSN.
            h = vec![0; HEADER_SIZE];
            h[..4].copy_from_slice(b"ICLG");
            h[4..6].copy_from_slice(&1u16.to_le_bytes());
            h[8..16].copy_from_slice(&(at.0 - d).to_le_bytes());
        }
        h
    };
    for (what, damage) in [("zeroed", 0u8), ("bad magic", 1), ("stale LSN", 2)] {
        let vfs = SimVfs::new();
        let acked = records(&vfs, 120, false);
        // Three records before the end: valid records follow within the
        // in-flight window.
        let at = record_of(acked[acked.len() - 3].0);
        assert!(at.0 > geometry().data_size());
        let bytes = match damage {
            0 => vec![0u8; HEADER_SIZE],
            1 => b"JUNK".to_vec(),
            _ => stale(&vfs, at),
        };
        poke(&vfs, at, &bytes);
        match open_sim(&vfs, opts(RecoveryMode::AbsoluteConsistency)) {
            Err(Error::Corruption {
                lsn, next_valid, ..
            }) => {
                assert_eq!(lsn, at, "{what}");
                assert_eq!(
                    next_valid,
                    Some(record_of(acked[acked.len() - 2].0)),
                    "{what}"
                );
            }
            other => panic!("{what}: {:?}", other.map(|j| j.recovery_report().clone())),
        }
        // The later records were written after this one was durable (they
        // stamp the durable LSN): the default mode knows it is damage, not
        // a torn in-flight write, and refuses too.
        match open_sim(&vfs, opts(RecoveryMode::TolerateTornTail)) {
            Err(Error::Corruption { lsn, .. }) => assert_eq!(lsn, at, "{what}"),
            other => panic!("{what}: {:?}", other.map(|j| j.recovery_report().clone())),
        }
    }
}

#[test]
fn after_a_clean_close_no_mode_cuts_acknowledged_records_in_silence() {
    for mode in MODES {
        let vfs = SimVfs::new();
        let acked = records(&vfs, 40, true);
        let at = record_of(acked[acked.len() - 3].0);
        poke(&vfs, at, &[0u8; HEADER_SIZE]);
        match open_sim(&vfs, opts(mode)) {
            Err(Error::LogEndsEarly {
                end,
                checkpoint_end,
                found: Damage::Zeroes,
            }) => {
                assert_eq!(end, at);
                assert!(checkpoint_end > at);
            }
            // Or first to the records after it, written once it was
            // durable.
            Err(Error::Corruption {
                lsn,
                found: Damage::Zeroes,
                next_valid: Some(_),
                ..
            }) => assert_eq!(lsn, at),
            // Skip-corrupt skips the damaged record and reports it.
            Ok(j) if mode == RecoveryMode::SkipCorrupt => {
                let s = &j.recovery_report().skipped;
                assert!(s.iter().any(|s| s.from == at), "{s:?}");
                assert_eq!(replay(&j).len(), acked.len() - 1);
            }
            other => panic!("{mode:?}: {:?}", other.map(|j| j.recovery_report().clone())),
        }
    }
}

#[test]
fn a_flipped_version_bit_is_damage_not_a_newer_format() {
    // The last record, of a crashed journal: a torn tail in the default
    // and skip-corrupt modes.
    let base = SimVfs::new();
    let acked = records(&base, 20, false);
    let last = record_of(acked.last().unwrap().0);
    let (seg, off) = geometry().locate(last);
    let mut b = base
        .live_contents(&sim_dir().join(segment_name(seg)))
        .unwrap();
    b[off as usize + 4] ^= 0x01;
    poke(&base, last, &b[off as usize..off as usize + 8]);
    // Each mode on its own copy (an open clears the torn record's header).
    let copy = || base.crash(journal_core::CrashPolicy::DropUnsynced);
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::SkipCorrupt] {
        let j = open_sim(&copy(), opts(mode)).unwrap();
        match &j.recovery_report().end {
            LogEnd::TornTail { lsn, found } => {
                assert_eq!(*lsn, last, "{mode:?}");
                assert!(
                    matches!(found, Damage::CrcMismatch { .. }),
                    "{mode:?}: {found}"
                );
            }
            other => panic!("{mode:?}: {other:?}"),
        }
    }
    assert!(matches!(
        open_sim(&copy(), opts(RecoveryMode::AbsoluteConsistency)),
        Err(Error::Corruption {
            found: Damage::CrcMismatch { .. },
            ..
        })
    ));
    // A record in the middle: skip-corrupt skips it and reports it.
    let vfs = SimVfs::new();
    let acked = records(&vfs, 200, false);
    let mid = record_of(acked[20].0);
    let (seg, off) = geometry().locate(mid);
    let mut b = vfs
        .live_contents(&sim_dir().join(segment_name(seg)))
        .unwrap();
    b[off as usize + 5] ^= 0x80;
    poke(&vfs, mid, &b[off as usize..off as usize + 8]);
    let j = open_sim(&vfs, opts(RecoveryMode::SkipCorrupt)).unwrap();
    let s = &j.recovery_report().skipped;
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].from, s[0].to), (mid, record_of(acked[21].0)));
    assert_eq!(replay(&j).len(), 199);
    // A segment header's version bit: damage too, not a newer format. A
    // live segment's is an error naming it; a preallocated one is replaced.
    let vfs = SimVfs::new();
    let acked = records(&vfs, 20, false);
    let head = geometry().segment_of(acked.last().unwrap().0);
    let ahead = sim_dir().join(segment_name(head + 1));
    assert!(vfs.exists(&ahead).unwrap(), "a preallocated segment ahead");
    let mut h = vfs.live_contents(&ahead).unwrap();
    h[4] ^= 0x01;
    poke_file(&vfs, &ahead, 0, &h[..8]);
    let j = open_sim(&vfs, opts(RecoveryMode::TolerateTornTail)).unwrap();
    assert_eq!(j.startup_report().replaced, [head + 1]);
    verify(&j, &acked, "after replacing a preallocated segment");
    drop(j);
    let live = sim_dir().join(segment_name(head));
    let mut h = vfs.live_contents(&live).unwrap();
    h[4] ^= 0x01;
    poke_file(&vfs, &live, 0, &h[..8]);
    match open_sim(&vfs, opts(RecoveryMode::TolerateTornTail)) {
        Err(Error::Segment(e)) => assert!(e.to_string().contains("checksum"), "{e}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn a_deleted_segment_in_the_middle_of_the_log_is_never_cut_in_silence() {
    let base = SimVfs::new();
    let j = open_wide(&base, RecoveryMode::TolerateTornTail).unwrap();
    let acked = records_into(&j, 1400);
    drop(j);
    let g = wide_geometry();
    let first = g.segment_of(acked[0].0);
    let last = g.segment_of(acked.last().unwrap().0);
    assert!(last >= first + 3, "the log spans several segments");
    // Every middle segment in turn (the old scan missed one in six).
    for gone in first + 1..last {
        for mode in MODES {
            let vfs = base.crash(journal_core::CrashPolicy::DropUnsynced);
            vfs.remove_file(&sim_dir().join(segment_name(gone)))
                .unwrap();
            vfs.sync_dir(&sim_dir()).unwrap();
            let r = open_wide(&vfs, mode);
            match (&r, mode) {
                (Ok(j), RecoveryMode::SkipCorrupt) => {
                    let s = &j.recovery_report().skipped;
                    assert!(
                        s.iter().any(
                            |s| matches!(s.found, Damage::NoSegment { segment } if segment == gone)
                        ),
                        "segment {gone}: {s:?}"
                    );
                }
                (Err(Error::Corruption { found, .. }), _) => {
                    assert!(
                        matches!(found, Damage::NoSegment { segment } if *segment == gone)
                            || found.is_bad_record(),
                        "segment {gone} {mode:?}: {found}"
                    );
                }
                _ => panic!(
                    "segment {gone} {mode:?}: {:?}",
                    r.as_ref().map(|j| j.recovery_report().clone())
                ),
            }
            lost_nothing_in_silence(r, &acked, &format!("segment {gone} {mode:?}"));
        }
    }
}

#[test]
fn a_preallocated_segment_of_the_wrong_size_is_replaced_losing_nothing() {
    for delta in [-1i64, 1] {
        for mode in MODES {
            let vfs = SimVfs::new();
            let acked = records(&vfs, 30, true);
            let head = geometry().segment_of(acked.last().unwrap().0);
            let ahead = sim_dir().join(segment_name(head + 1));
            let f = vfs.open(&ahead, OpenOptions::write()).unwrap();
            f.set_len((small_options().segment_size as i64 + delta) as u64)
                .unwrap();
            f.sync_all().unwrap();
            drop(f);
            let j =
                open_sim(&vfs, opts(mode)).unwrap_or_else(|e| panic!("{delta:+} {mode:?}: {e}"));
            assert_eq!(j.startup_report().replaced, [head + 1], "{mode:?}");
            verify(&j, &acked, &format!("{delta:+} {mode:?}"));
            // The journal goes on into the replaced number.
            let more = records_into(&j, 80);
            drop(j);
            let j = open_sim(&vfs, opts(mode)).unwrap();
            verify(&j, &more, "after writing past the replaced segment");
        }
    }
}

fn records_into(j: &Journal, n: u32) -> Acked {
    (0..n)
        .map(|s| {
            let p = payload(3, s, 900);
            (j.append_durable(&p).unwrap(), p)
        })
        .collect()
}
