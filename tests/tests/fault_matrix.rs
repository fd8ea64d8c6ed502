//! The fault matrix: EIO and ENOSPC injected at every I/O call site in
//! turn. The error surfaces, the journal is poisoned (every later call
//! fails with the first cause, no sync is retried), and after a crash and
//! reopen no acknowledged commit is lost.
#![cfg(not(loom))]

use journal_core::vfs::{CrashPolicy, Fault, Op, SimVfs};
use journal_core::{Error, Journal, Lsn, Options, SyncMethod};
use journal_tests::{open_sim, payload, small_options, verify};

/// The options of the matrix for call site `op`, with `in_flight` commits
/// in flight: 1 makes each commit one FUA write, 2 (the default) a plain
/// write and then a shared flush.
fn options(op: Op, in_flight: u32) -> Options {
    Options {
        commits_in_flight: in_flight,
        // RWF_DSYNC writes are the FUA call site; fdatasync the others.
        sync_method: if op == Op::FuaWrite {
            SyncMethod::Dsync
        } else {
            SyncMethod::Fdatasync
        },
        background_preallocation: false,
        // Few enough files that checkpoints remove segments as well as
        // recycle them (all removed at 3: two kept ahead plus the head).
        max_segments: if op == Op::Remove { 3 } else { 4 },
        logbufs: 2,
        ..small_options()
    }
}

/// Commits records and checkpoints until the first error; returns what was
/// acknowledged and the error.
fn workload(j: &Journal) -> (Vec<(Lsn, Vec<u8>)>, Option<Error>) {
    let mut acked = Vec::new();
    for seq in 0..240u32 {
        let p = payload(7, seq, 40 + (seq as usize * 211) % 3000);
        match j.append_durable(&p) {
            Ok(l) => acked.push((l, p)),
            Err(e) => return (acked, Some(e)),
        }
        if seq % 60 == 59 {
            if let Err(e) = j.checkpoint(acked[acked.len() - 20].0) {
                return (acked, Some(e));
            }
        }
    }
    (acked, None)
}

#[test]
fn every_call_site_fails_cleanly_and_loses_nothing_acknowledged() {
    let sites = [
        Op::Write,
        Op::FuaWrite,
        Op::SyncData,
        Op::Sync,
        Op::SyncDir,
        Op::Create,
        Op::Rename,
        Op::Preallocate,
        Op::Remove,
    ];
    let mut cases = 0;
    // Staged commits (2 in flight) write no FUA record: RWF_DSYNC writes
    // come only from one-stage commits.
    let runs = sites
        .iter()
        .flat_map(|&op| [(op, 1), (op, 2)])
        .filter(|&(op, in_flight)| !(op == Op::FuaWrite && in_flight > 1));
    for (op, in_flight) in runs {
        // How often the workload makes this call when nothing fails.
        let clean = SimVfs::new();
        let j = open_sim(&clean, options(op, in_flight)).unwrap();
        let before = clean.calls(op);
        let (_, err) = workload(&j);
        assert!(
            err.is_none(),
            "{op:?} ({in_flight} in flight): the clean run failed: {err:?}"
        );
        let calls = clean.calls(op) - before;
        assert!(
            calls > 0,
            "{op:?} ({in_flight} in flight): the workload never reaches this call site"
        );
        let mut nths: Vec<u64> = (1..=calls.min(6)).collect();
        nths.push(calls);
        nths.push(calls / 2 + 1);
        nths.dedup();
        for nth in nths {
            for (errno, fault) in [(5, Fault::eio(op, nth)), (28, Fault::enospc(op, nth))] {
                let ctx = format!("{op:?} call {nth}/{calls} errno {errno}, {in_flight} in flight");
                let vfs = SimVfs::new();
                let j = open_sim(&vfs, options(op, in_flight)).unwrap();
                vfs.inject(fault);
                let (acked, err) = workload(&j);
                let mut acked = acked;
                let err = err.unwrap_or_else(|| panic!("{ctx}: the fault did not surface"));
                if let Error::NoSpace { .. } = err {
                    // A full disk met while making the next segment: a
                    // condition, not a failure. Nothing is poisoned, and
                    // once the space is back (the fault fired once) the
                    // next append succeeds and survives with the rest.
                    assert_eq!((errno, err.raw_os_error()), (28, Some(28)), "{ctx}: {err}");
                    let p = payload(9, 0, 300);
                    let lsn = j
                        .append_durable(&p)
                        .unwrap_or_else(|e| panic!("{ctx}: after NoSpace: {e}"));
                    acked.push((lsn, p));
                    drop(j);
                    let j = open_sim(
                        &vfs.crash(CrashPolicy::DropUnsynced),
                        options(op, in_flight),
                    )
                    .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
                    verify(&j, &acked, &ctx);
                    cases += 1;
                    continue;
                }
                assert!(matches!(err, Error::Poisoned(_)), "{ctx}: {err:?}");
                assert_eq!(err.raw_os_error(), Some(errno), "{ctx}: {err}");
                // Poisoned for good: every later call fails with the first cause.
                for later in [
                    j.append(b"x").map(|_| ()),
                    j.append_durable(b"x").map(|_| ()),
                    j.force_all().map(|_| ()),
                    j.checkpoint(Lsn(0)).map(|_| ()),
                ] {
                    let e = later.expect_err(&ctx);
                    assert!(matches!(e, Error::Poisoned(_)), "{ctx}: {e:?}");
                    assert_eq!(e.raw_os_error(), Some(errno), "{ctx}");
                }
                drop(j);
                for policy in [
                    CrashPolicy::DropUnsynced,
                    CrashPolicy::TornSectors { seed: nth },
                ] {
                    let image = vfs.crash(policy);
                    let j = open_sim(&image, options(op, in_flight))
                        .unwrap_or_else(|e| panic!("{ctx} {policy:?}: reopen failed: {e}"));
                    verify(&j, &acked, &ctx);
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= (2 * sites.len() - 1) * 4);
}

/// Under the fsyncgate model (a failed fdatasync drops the dirty pages and
/// the next one "succeeds"), a journal that retried would acknowledge
/// records a crash then loses. The journal issues no log sync after the
/// first failure: every later call is refused before reaching the disk.
#[test]
fn after_a_failed_sync_no_sync_is_ever_retried() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, options(Op::SyncData, 2)).unwrap();
    let mut acked = Vec::new();
    for s in 0..20u32 {
        let p = payload(8, s, 300);
        acked.push((j.append_durable(&p).unwrap(), p));
    }
    vfs.inject(Fault::eio(Op::SyncData, 1));
    let e = j.append_durable(&payload(8, 20, 300)).unwrap_err();
    assert!(matches!(e, Error::Poisoned(_)), "{e:?}");
    let syncs = vfs.calls(Op::SyncData) + vfs.calls(Op::Sync) + vfs.calls(Op::FuaWrite);
    for s in 21..40u32 {
        let p = payload(8, s, 300);
        assert!(j.append_durable(&p).is_err());
        assert!(j.force_all().is_err());
    }
    assert_eq!(
        vfs.calls(Op::SyncData) + vfs.calls(Op::Sync) + vfs.calls(Op::FuaWrite),
        syncs,
        "a poisoned journal synced again"
    );
    drop(j);
    let j = open_sim(
        &vfs.crash(CrashPolicy::DropUnsynced),
        options(Op::SyncData, 2),
    )
    .unwrap();
    verify(&j, &acked, "after the failed sync");
}

/// A read that fails while recovering (or replaying) is an error, never a
/// shorter log.
#[test]
fn a_failed_read_during_recovery_is_an_error_not_a_shorter_log() {
    let base = SimVfs::new();
    let j = open_sim(&base, options(Op::Read, 2)).unwrap();
    let (acked, err) = workload(&j);
    assert!(err.is_none());
    drop(j);
    // How many reads an open and a full replay make.
    let probe = base.crash(CrashPolicy::DropUnsynced);
    let before = probe.calls(Op::Read);
    let j = open_sim(&probe, options(Op::Read, 2)).unwrap();
    verify(&j, &acked, "clean");
    drop(j);
    let reads = probe.calls(Op::Read) - before;
    assert!(reads > 0);
    for nth in 1..=reads {
        let vfs = base.crash(CrashPolicy::DropUnsynced);
        vfs.inject(Fault::eio(Op::Read, nth));
        match open_sim(&vfs, options(Op::Read, 2)) {
            Err(e) => assert_eq!(e.raw_os_error(), Some(5), "read {nth}/{reads}: {e}"),
            Ok(j) => {
                // The failing read came during replay: it must fail there.
                let r: Result<Vec<_>, _> = j.read_from(j.redo_lsn()).unwrap().collect();
                match r {
                    Err(e) => assert_eq!(e.raw_os_error(), Some(5), "read {nth}/{reads}: {e}"),
                    Ok(_) => panic!("read {nth}/{reads}: a failed read went unnoticed"),
                }
            }
        }
    }
}

/// A checkpoint's forced write is stamped with the moved tail, so it must
/// not become durable before the data files below that tail are: the device
/// joins the data-file flush the checkpoint started before that write goes
/// out. When the flush fails, the write is never issued — no durable record
/// vouches for a tail whose data is not stable — and the journal is
/// poisoned. (Without the join the record is written at once, and the
/// crash image holds a record whose tail the data files do not back.)
#[test]
fn a_failed_data_flush_stops_the_write_that_would_move_the_tail() {
    use journal_core::inspect::Inspector;
    use journal_core::vfs::{OpenOptions, Vfs};
    use std::path::Path;
    use std::sync::Arc;
    let vfs = SimVfs::new();
    // RWF_DSYNC: the FUA write is not an fdatasync, so the data file's is
    // the only SyncData call the checkpoint makes.
    let opts = Options {
        sync_method: SyncMethod::Dsync,
        commits_in_flight: 1,
        direct_io: false,
        background_preallocation: false,
        ..small_options()
    };
    let j = open_sim(&vfs, opts).unwrap();
    let data = Path::new("/table.dat");
    let f = vfs.open(data, OpenOptions::create()).unwrap();
    f.write_at(b"page", 0).unwrap();
    vfs.sync_dir(Path::new("/")).unwrap();
    j.register_data_file(data).unwrap();
    let acked = j.append_durable(b"acknowledged").unwrap();
    j.append(b"not yet durable").unwrap();
    let tail_before = Inspector::open_with(Arc::new(vfs.clone()), journal_tests::sim_dir())
        .unwrap()
        .control()
        .redo_lsn;
    vfs.inject(Fault::eio(Op::SyncData, 1));
    let redo = j.appended_lsn();
    assert!(j.checkpoint(redo).is_err(), "the data flush failed");
    assert!(j.append_durable(b"after").is_err(), "poisoned");

    let image = vfs.crash(CrashPolicy::DropUnsynced);
    let mut ins = Inspector::open_with(Arc::new(image), journal_tests::sim_dir()).unwrap();
    let records: Vec<_> = ins.records(Lsn(0)).map(|r| r.unwrap()).collect();
    assert!(
        records.iter().any(|r| r.lsn <= acked),
        "the acknowledged record"
    );
    for r in &records {
        assert!(
            r.tail <= tail_before,
            "record at {} is durable with tail {} although the data flush failed",
            r.lsn,
            r.tail
        );
    }
}
