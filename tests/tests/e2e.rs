//! End to end, on the real filesystem and on SimVfs: write across many
//! segments with checkpoints and recycling, reopen, replay byte for byte.
#![cfg(not(loom))]

use journal_core::vfs::{SimVfs, Vfs};
use journal_core::{Journal, Lsn, Options};
use journal_tests::{open_sim, payload, replay, sim_dir, small_options};

fn workload(j: &Journal) -> Vec<(Lsn, Vec<u8>)> {
    let mut acked = Vec::new();
    for seq in 0..1200u32 {
        let p = payload(0, seq, 10 + (seq as usize * 131) % 2500);
        let lsn = if seq % 3 == 0 {
            j.append_durable(&p).unwrap()
        } else {
            let l = j.append(&p).unwrap();
            if seq % 3 == 2 {
                j.commit(l).unwrap();
            }
            l
        };
        acked.push((lsn, p));
        if seq % 300 == 299 {
            j.checkpoint(acked[acked.len() - 100].0).unwrap();
        }
    }
    j.close().unwrap();
    acked
}

fn check_reopen(j: &Journal, acked: &[(Lsn, Vec<u8>)]) {
    let redo = j.redo_lsn();
    let want: Vec<(Lsn, Vec<u8>)> = acked.iter().filter(|(l, _)| *l >= redo).cloned().collect();
    assert_eq!(replay(j), want);
    // Every segment of the live log, from the one holding the checkpoint
    // to the one holding the end, is on disk.
    let g = j.geometry();
    let live = g.segment_of(j.redo_lsn())..=g.segment_of(j.durable_lsn());
    let segments = j.segments();
    for n in live.clone() {
        assert!(
            segments.contains(&n),
            "segment {n} of {live:?} missing: {segments:?}"
        );
    }
    // Appends continue after the last record.
    let l = j.append_durable(&payload(1, 0, 100)).unwrap();
    assert!(l > acked.last().unwrap().0);
}

#[test]
fn os_vfs_write_reopen_replay() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let j = Journal::open(&dir, small_options()).unwrap();
    let acked = workload(&j);
    let m = j.metrics();
    assert!(m.segments_recycled > 0, "{m:?}");
    assert!(m.checkpoints >= 4);
    assert!(
        m.split_records > 0,
        "records crossed segment boundaries: {m:?}"
    );
    drop(j);
    let j = Journal::open(&dir, small_options()).unwrap();
    assert!(j.recovery_report().records > 0);
    check_reopen(&j, &acked);
}

#[test]
fn sim_vfs_write_reopen_replay_for_every_sync_method() {
    for sync_method in [
        journal_core::SyncMethod::Fdatasync,
        journal_core::SyncMethod::Dsync,
        journal_core::SyncMethod::Fsync,
    ] {
        let vfs = SimVfs::new();
        let opts = Options {
            sync_method,
            ..small_options()
        };
        let j = open_sim(&vfs, opts).unwrap();
        let acked = workload(&j);
        drop(j);
        // A power cut after a clean close loses nothing.
        let vfs = vfs.crash(journal_core::vfs::CrashPolicy::DropUnsynced);
        let j = open_sim(&vfs, opts).unwrap();
        check_reopen(&j, &acked);
        assert!(vfs.exists(&sim_dir().join("control")).unwrap());
    }
}

/// Six threads commit at once: every commit is acknowledged once, counted
/// in exactly one group, and durable. (Whether groups form depends on the
/// schedule; jbd-batch's own tests and loom models check that they do.)
#[test]
fn concurrent_committers_are_durable_and_each_counted_once() {
    let vfs = SimVfs::new();
    vfs.set_sync_latency(std::time::Duration::from_micros(200));
    let j = std::sync::Arc::new(open_sim(&vfs, small_options()).unwrap());
    let threads: Vec<_> = (0..6u8)
        .map(|w| {
            let j = j.clone();
            std::thread::spawn(move || {
                (0..100u32)
                    .map(|s| {
                        let p = payload(w, s, 200);
                        (j.append_durable(&p).unwrap(), p)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let acked: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let m = j.metrics();
    assert_eq!(m.commits, 600);
    assert_eq!(m.group_sizes.iter().sum::<u64>(), m.groups, "{m:?}");
    assert!(m.groups >= 1 && m.groups <= m.commits, "{m:?}");
    j.close().unwrap();
    drop(j);
    let j = open_sim(
        &vfs.crash(journal_core::vfs::CrashPolicy::DropUnsynced),
        small_options(),
    )
    .unwrap();
    journal_tests::verify(&j, &acked, "concurrent");
}

/// A commit opened before its record is built (`begin_commit`): the
/// record is durable when it returns; a handle dropped unused changes
/// nothing; an LSN never appended is refused without poisoning.
#[test]
fn begin_commit_makes_the_record_durable_and_a_dropped_handle_is_harmless() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, small_options()).unwrap();
    let h = j.begin_commit().unwrap();
    let p = payload(3, 0, 500);
    let l = j.append(&p).unwrap();
    h.commit(l).unwrap();
    drop(j.begin_commit().unwrap());
    let head = j.appended_lsn();
    assert!(matches!(
        j.begin_commit().unwrap().commit(head),
        Err(journal_core::Error::LsnNotAppended { .. })
    ));
    let l2 = j.append_durable(&payload(3, 1, 500)).unwrap();
    assert_eq!(j.metrics().commits, 2);
    drop(j);
    let j = open_sim(
        &vfs.crash(journal_core::vfs::CrashPolicy::DropUnsynced),
        small_options(),
    )
    .unwrap();
    journal_tests::verify(&j, &[(l, p), (l2, payload(3, 1, 500))], "begin_commit");
}
