//! Recovery tells a torn tail from mid-log corruption, in each mode, and
//! stale records from recycled segments end the log.
#![cfg(not(loom))]

use journal_core::format::segment_name;
use journal_core::format::IoFlags;
use journal_core::format::{encode_header, record_size, HEADER_SIZE};
use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
use journal_core::{Damage, Error, Geometry, LogEnd, Lsn, Options, RecoveryMode};
use journal_tests::{open_sim, payload, replay, sim_dir, small_options};

/// The layout of the journals these tests write.
fn geometry() -> Geometry {
    let o = small_options();
    Geometry::new(o.segment_size, o.alignment)
}

fn opts(mode: RecoveryMode) -> Options {
    Options {
        recovery_mode: mode,
        ..small_options()
    }
}

/// A journal with `n` committed records, one per log record, left as a
/// crash would leave it (no close: the control file records no durable
/// end, so a damaged last record is indistinguishable from a torn one);
/// returns their LSNs.
fn write(vfs: &SimVfs, n: u32) -> Vec<Lsn> {
    let j = open_sim(vfs, small_options()).unwrap();
    let lsns = (0..n)
        .map(|s| j.append_durable(&payload(1, s, 700)).unwrap())
        .collect();
    drop(j);
    lsns
}

/// Overwrites log bytes at `lsn` (a position in the log, not an entry).
fn poke(vfs: &SimVfs, lsn: Lsn, bytes: &[u8]) {
    let (seg, off) = geometry().locate(lsn);
    let f = vfs
        .open(&sim_dir().join(segment_name(seg)), OpenOptions::write())
        .unwrap();
    f.write_at(bytes, off).unwrap();
    f.sync_data().unwrap();
}

/// A complete, valid log record at `lsn` holding one entry.
fn craft_record(lsn: Lsn, body: &[u8]) -> Vec<u8> {
    let mut framed = (body.len() as u32).to_le_bytes().to_vec();
    framed.extend_from_slice(body);
    let mut rec = vec![0u8; record_size(framed.len(), 512) as usize];
    rec[HEADER_SIZE..HEADER_SIZE + framed.len()].copy_from_slice(&framed);
    encode_header(&mut rec, lsn, Lsn(0), Lsn(0), IoFlags::FUA, 0, 1, &framed);
    rec
}

fn record_of(entry: Lsn) -> Lsn {
    Lsn(entry.0 - HEADER_SIZE as u64)
}

#[test]
fn a_torn_record_at_the_head_is_cut_off_and_reported() {
    let vfs = SimVfs::new();
    let lsns = write(&vfs, 20);
    let last = record_of(*lsns.last().unwrap());
    poke(&vfs, Lsn(last.0 + 600), &[0xEE; 100]); // tear the last record's tail
    let j = open_sim(&vfs, opts(RecoveryMode::TolerateTornTail)).unwrap();
    match &j.recovery_report().end {
        LogEnd::TornTail { lsn, found } => {
            assert_eq!(*lsn, last);
            assert!(matches!(found, Damage::CrcMismatch { .. }), "{found}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(replay(&j).len(), 19);
    // Appends continue where the torn record was, overwriting it safely.
    let l = j.append_durable(&payload(2, 0, 100)).unwrap();
    assert_eq!(record_of(l), last);
    drop(j);
    let j = open_sim(&vfs, opts(RecoveryMode::AbsoluteConsistency)).unwrap();
    assert_eq!(replay(&j).len(), 20);
    assert!(matches!(j.recovery_report().end, LogEnd::Clean { .. }));
}

#[test]
fn absolute_consistency_refuses_a_torn_tail() {
    let vfs = SimVfs::new();
    let lsns = write(&vfs, 5);
    let last = record_of(*lsns.last().unwrap());
    poke(&vfs, Lsn(last.0 + 100), &[0xEE; 8]);
    match open_sim(&vfs, opts(RecoveryMode::AbsoluteConsistency)) {
        Err(Error::Corruption { lsn, .. }) => assert_eq!(lsn, last),
        other => panic!("{other:?}"),
    }
}

#[test]
fn mid_log_corruption_is_an_error_naming_the_lsn_or_skipped_and_reported() {
    let vfs = SimVfs::new();
    // Enough records that the corrupt one is followed by records written
    // once it was durable (each record stamps the durable LSN).
    let lsns = write(&vfs, 400);
    let bad = record_of(lsns[50]);
    poke(&vfs, Lsn(bad.0 + 200), &[0x55; 16]);
    for mode in [
        RecoveryMode::TolerateTornTail,
        RecoveryMode::AbsoluteConsistency,
    ] {
        match open_sim(&vfs, opts(mode)) {
            Err(Error::Corruption {
                lsn,
                segment,
                found,
                next_valid,
            }) => {
                assert_eq!(next_valid, Some(record_of(lsns[51])), "{mode:?}");
                assert_eq!(lsn, bad, "{mode:?}");
                assert_eq!(segment, geometry().segment_of(bad));
                assert!(matches!(found, Damage::CrcMismatch { .. }), "{found}");
            }
            other => panic!("{mode:?}: {other:?}"),
        }
    }
    let j = open_sim(&vfs, opts(RecoveryMode::SkipCorrupt)).unwrap();
    let r = j.recovery_report();
    assert_eq!(r.skipped.len(), 1);
    assert_eq!(r.skipped[0].from, bad);
    assert_eq!(r.skipped[0].to, record_of(lsns[51]));
    assert!(matches!(r.skipped[0].found, Damage::CrcMismatch { .. }));
    let got = replay(&j);
    assert_eq!(got.len(), 399, "every record but the corrupt one");
    assert!(got.iter().all(|(l, _)| *l != lsns[50]));
}

#[test]
fn a_stale_record_from_a_recycled_file_ends_the_log() {
    let vfs = SimVfs::new();
    let lsns = write(&vfs, 100);
    let end = open_sim(&vfs, small_options()).unwrap().durable_lsn();
    // Bytes of the file's previous life: a valid record, one segment's
    // worth of LSNs earlier, sitting exactly where the next record goes.
    assert!(end.0 > geometry().data_size());
    let stale_lsn = Lsn(end.0 - geometry().data_size());
    poke(&vfs, end, &craft_record(stale_lsn, &payload(9, 9, 300)));
    let j = open_sim(&vfs, opts(RecoveryMode::AbsoluteConsistency)).unwrap();
    match &j.recovery_report().end {
        LogEnd::Clean { found } => {
            assert_eq!(*found, Damage::StaleLsn { found: stale_lsn }, "{found}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(j.recovery_report().end_lsn, end);
    assert_eq!(replay(&j).len(), lsns.len());
}

#[test]
fn unacknowledged_in_flight_records_past_the_end_are_cleared() {
    let vfs = SimVfs::new();
    let lsns = write(&vfs, 8);
    let end = open_sim(&vfs, small_options()).unwrap().durable_lsn();
    // A valid record two records past the end, as if written by a later
    // buffer whose predecessor never completed.
    let ghost = Lsn(end.0 + 1024);
    let body = payload(3, 3, 100);
    poke(&vfs, ghost, &craft_record(ghost, &body));
    let j = open_sim(&vfs, small_options()).unwrap();
    assert_eq!(j.recovery_report().cleared, [ghost]);
    // New records can now never chain into the ghost.
    for s in 0..4 {
        j.append_durable(&payload(4, s, 300)).unwrap();
    }
    drop(j);
    let j = open_sim(&vfs, small_options()).unwrap();
    let got = replay(&j);
    assert_eq!(got.len(), lsns.len() + 4);
    assert!(got.iter().all(|(_, b)| b != &body));
}

#[test]
fn a_damaged_lsn_field_is_a_bad_record_not_a_stale_one() {
    let vfs = SimVfs::new();
    let lsns = write(&vfs, 20);
    let last = record_of(*lsns.last().unwrap());
    // Flip one bit of the last record's LSN field (bytes 8..16).
    let (seg, off) = geometry().locate(last);
    let path = sim_dir().join(segment_name(seg));
    let mut b = vfs.live_contents(&path).unwrap();
    b[off as usize + 9] ^= 0x10;
    poke(&vfs, last, &b[off as usize..off as usize + 16]);
    let j = open_sim(&vfs, opts(RecoveryMode::TolerateTornTail)).unwrap();
    match &j.recovery_report().end {
        LogEnd::TornTail { lsn, found } => {
            assert_eq!(*lsn, last);
            assert!(matches!(found, Damage::CorruptLsn { .. }), "{found}");
        }
        other => panic!("{other:?}"),
    }
    drop(j);
    assert!(matches!(
        open_sim(&vfs, opts(RecoveryMode::AbsoluteConsistency)),
        Err(Error::Corruption {
            found: Damage::CorruptLsn { .. },
            ..
        })
    ));
}

/// With alignment 1 a header can cross a segment boundary. Recovery clears
/// the headers of in-flight leftovers past the log's end; one that crosses
/// into the next segment is cleared piece by piece, each file within its
/// size (writing all 48 bytes into the first file once made it 65,555 bytes
/// long, and the next open refused the journal).
#[test]
fn a_leftover_header_across_a_segment_boundary_is_cleared_within_each_file() {
    let o = Options {
        alignment: 1,
        direct_io: false,
        background_preallocation: false,
        ..small_options()
    };
    let g = Geometry::new(o.segment_size, 1);
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, o).unwrap();
    // Fill to 100 bytes short of the place the forged header goes: 20
    // bytes before the end of segment 2's data area.
    let x = g.segment_start(3).0 - 20;
    while j.appended_lsn().0 + 20_000 < x {
        j.append_durable(&payload(1, 0, 9_000)).unwrap();
    }
    let last = (x - 100) - j.appended_lsn().0 - 52;
    j.append_durable(&payload(1, 1, last as usize)).unwrap();
    assert_eq!(j.appended_lsn().0, x - 100);
    j.close().unwrap();
    drop(j);
    // A leftover: a header claiming its own LSN `x`, 20 bytes in segment 2
    // and 28 in segment 3 (which preallocation made).
    let mut h = [0u8; HEADER_SIZE];
    encode_header(&mut h, Lsn(x), Lsn(0), Lsn(0), IoFlags::empty(), 0, 0, &[]);
    for (seg, bytes) in [(2u64, &h[..20]), (3, &h[20..])] {
        let (s, off) = g.locate(Lsn(if seg == 2 { x } else { x + 20 }));
        assert_eq!(s, seg);
        let f = vfs
            .open(&sim_dir().join(segment_name(seg)), OpenOptions::write())
            .unwrap();
        f.write_at(bytes, off).unwrap();
        f.sync_data().unwrap();
    }
    let j = open_sim(&vfs, o).unwrap();
    assert_eq!(j.recovery_report().cleared, vec![Lsn(x)]);
    drop(j);
    for seg in [2u64, 3] {
        let len = vfs
            .live_contents(&sim_dir().join(segment_name(seg)))
            .unwrap()
            .len() as u64;
        assert_eq!(len, o.segment_size, "segment {seg}");
    }
    let j = open_sim(&vfs, o).expect("the journal opens again");
    assert_eq!(replay(&j).len(), j.recovery_report().entries as usize);
}
