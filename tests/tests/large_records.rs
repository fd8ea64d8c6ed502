//! Records of any size: chains of parts across log buffers and segments
//! (docs/FORMAT.md, "Continuation records"), on the real disk and through
//! crashes in the middle of a chain.
#![cfg(not(loom))]

use journal_core::vfs::SimVfs;
use journal_core::{
    CrashPolicy, Damage, Error, FlushPolicy, Journal, Lsn, Options, RecoveryMode,
    DEFAULT_MAX_RECORD_SIZE,
};
use journal_tests::{open_sim, payload, replay, small_options, verify};
use std::future::Future;

/// A record of `len` bytes that says which it is.
fn big(seed: u8, len: usize) -> Vec<u8> {
    payload(seed, len as u32, len)
}

#[test]
fn records_of_every_size_commit_and_replay_byte_exact_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let opts = Options::default();
    let sizes = [
        1,
        300 << 10,
        13,
        20 << 20,
        opts.max_unchained_record(),
        opts.max_unchained_record() + 1,
        DEFAULT_MAX_RECORD_SIZE,
        700,
    ];
    let mut acked: Vec<(Lsn, Vec<u8>)> = Vec::new();
    {
        let j = Journal::open(&dir, opts).unwrap();
        for (i, &len) in sizes.iter().enumerate() {
            // A 1-byte record cannot describe itself: check it by value.
            let p = if len < 13 {
                vec![0xA5; len]
            } else {
                big(i as u8, len)
            };
            let lsn = if i % 2 == 0 {
                j.append_durable(&p).unwrap()
            } else {
                let l = j.append(&p).unwrap();
                j.commit(l).unwrap();
                l
            };
            // Durable means all of it: the durable LSN passed its end.
            assert!(j.durable_lsn().0 >= lsn.0 + len as u64, "size {len}");
            acked.push((lsn, p));
        }
        // One byte over the limit: a typed error, nothing written.
        let before = j.appended_lsn();
        match j.append(&vec![0u8; DEFAULT_MAX_RECORD_SIZE + 1]) {
            Err(Error::RecordTooLarge { len, max }) => {
                assert_eq!(
                    (len, max),
                    (DEFAULT_MAX_RECORD_SIZE + 1, DEFAULT_MAX_RECORD_SIZE)
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(j.appended_lsn(), before);
        check_replay(&j, &acked);
        // The 64 MiB record crossed segments: those it left behind are
        // sealed, and entries there are read in place from a mapping.
        let mapped = j
            .read_from(j.redo_lsn())
            .unwrap()
            .filter(|r| r.as_ref().unwrap().1.is_mapped())
            .count();
        assert!(mapped >= 3, "{mapped} entries read from mappings");
        j.close().unwrap();
    }
    let j = Journal::open(&dir, opts).unwrap();
    assert_eq!(j.recovery_report().torn_chain, None);
    check_replay(&j, &acked);
}

fn check_replay(j: &Journal, acked: &[(Lsn, Vec<u8>)]) {
    let got: Vec<(Lsn, usize)> = j
        .read_from(j.redo_lsn())
        .unwrap()
        .zip(acked)
        .map(|(r, (lsn, p))| {
            let (l, b) = r.unwrap();
            assert_eq!(l, *lsn);
            assert!(b == *p, "the record at {l} reads back byte for byte");
            (l, b.len())
        })
        .collect();
    assert_eq!(got.len(), acked.len());
    assert_eq!(j.read_from(j.redo_lsn()).unwrap().count(), acked.len());
}

/// Every buffer write is durable on its own (PREFLUSH | FUA), so a crash
/// in the middle of a chain leaves some of its parts durable and the rest
/// missing: the case recovery must cut.
fn every_write() -> Options {
    Options {
        flush_policy: FlushPolicy::EveryWrite,
        ..small_options()
    }
}

#[test]
fn a_chain_a_crash_cut_is_never_returned_and_later_appends_are() {
    let opts = every_write();
    let mut cut = 0;
    for n in 1..40 {
        let vfs = SimVfs::new();
        let j = open_sim(&vfs, opts).unwrap();
        let mut acked = Vec::new();
        for i in 0..5 {
            let p = payload(1, i, 200);
            acked.push((j.append_durable(&p).unwrap(), p));
        }
        // 300 KiB over 16 KiB buffers and 64 KiB segments: ~20 parts, 5
        // segments. The crash falls somewhere in it (or after).
        vfs.arm_crash(n, CrashPolicy::DropUnsynced);
        let chain = j.append_durable(&big(2, 300 << 10)).unwrap();
        drop(j);
        let Some(image) = vfs.take_crash() else {
            continue;
        };
        let ctx = format!("crash after {n} calls");
        let j = open_sim(&image, opts).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let torn = j.recovery_report().torn_chain;
        if torn.is_some() {
            cut += 1;
            assert_eq!(torn, Some(chain), "{ctx}");
            // Absolute consistency refuses it, naming the chain.
            match open_sim(
                &image.crash(CrashPolicy::DropUnsynced),
                Options {
                    recovery_mode: RecoveryMode::AbsoluteConsistency,
                    ..opts
                },
            ) {
                Err(Error::Corruption {
                    lsn,
                    found: Damage::ChainCut { first },
                    ..
                }) => assert_eq!((lsn, first), (chain, chain), "{ctx}"),
                other => panic!("{ctx}: {other:?}"),
            }
        }
        // No part of an unacknowledged chain is ever returned (`verify`
        // checks every entry read is a whole payload).
        verify(&j, &acked, &ctx);
        assert!(replay(&j).iter().all(|(_, b)| b.len() == 200), "{ctx}");
        // Appends after the cut chain are kept, and the chain's parts stay
        // dropped in every later session.
        let p = payload(3, 0, 5000);
        acked.push((j.append_durable(&p).unwrap(), p));
        let p = big(4, 100 << 10);
        acked.push((j.append_durable(&p).unwrap(), p));
        drop(j);
        let j = open_sim(&image.crash(CrashPolicy::DropUnsynced), opts).unwrap();
        assert_eq!(j.recovery_report().torn_chain, None, "{ctx}");
        verify(&j, &acked, &ctx);
        assert_eq!(replay(&j).len(), acked.len(), "{ctx}");
    }
    assert!(cut >= 5, "only {cut} crashes cut the chain");
}

#[test]
fn appenders_never_land_inside_another_threads_chain() {
    let vfs = SimVfs::new();
    let opts = small_options();
    let j = open_sim(&vfs, opts).unwrap();
    let acked = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..3u8 {
            let (j, acked) = (&j, &acked);
            s.spawn(move || {
                for i in 0..40u32 {
                    let len = if (i + t as u32).is_multiple_of(7) {
                        40_000 + i as usize * 997
                    } else {
                        100 + i as usize
                    };
                    let p = payload(t, i, len);
                    let l = j.append_durable(&p).unwrap();
                    acked.lock().unwrap().push((l, p));
                }
            });
        }
    });
    let acked = acked.into_inner().unwrap();
    verify(&j, &acked, "live");
    assert_eq!(replay(&j).len(), acked.len());
    drop(j);
    let j = open_sim(&vfs.crash(CrashPolicy::DropUnsynced), opts).unwrap();
    verify(&j, &acked, "recovered");
    assert_eq!(replay(&j).len(), acked.len());
}

#[test]
fn entries_are_read_in_place_and_their_segments_outlive_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = small_options();
    let j = Journal::open(tmp.path().join("wal"), opts).unwrap();
    let first = payload(1, 0, 4000);
    let l0 = j.append(&first).unwrap();
    for i in 1..40 {
        j.append(&payload(1, i, 4000)).unwrap();
    }
    // A chained record among them.
    let chained = big(2, 40_000);
    let lc = j.append(&chained).unwrap();
    let end = j.force_all().unwrap();
    assert!(j.geometry().segment_of(end) >= 2);
    let (e0, ec) = {
        let mut it = j.read_from(j.redo_lsn()).unwrap();
        let (l, e0) = it.next().unwrap().unwrap();
        assert_eq!(l, l0);
        let ec = it.find(|r| r.as_ref().unwrap().0 == lc).unwrap().unwrap().1;
        (e0, ec)
    };
    // Segment 0 is sealed (wholly below the durable end): mapped.
    assert!(e0.is_mapped());
    assert!(e0 == first);
    assert!(ec.is_chained());
    assert!(ec.parts().count() >= 3);
    assert_eq!(ec.parts().flatten().copied().collect::<Vec<u8>>(), chained);
    assert!(ec == chained);
    // A checkpoint past segment 0 leaves it: an entry still views it.
    j.checkpoint(lc).unwrap();
    assert!(j.segments().contains(&0), "{:?}", j.segments());
    for i in 0..200 {
        j.append(&payload(3, i, 3000)).unwrap();
    }
    j.force_all().unwrap();
    assert!(
        e0 == first,
        "the mapped bytes never changed under the entry"
    );
    // Dropped: the next checkpoint recycles it.
    drop((e0, ec));
    j.checkpoint(j.appended_lsn()).unwrap();
    assert!(!j.segments().contains(&0), "{:?}", j.segments());
}

#[test]
fn async_commits_and_the_watch_cover_a_whole_chained_record() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, small_options()).unwrap();
    let p = big(5, 100 << 10);
    let lsn = j.append(&p).unwrap();
    // The first parts may well be durable already (their buffers filled
    // and, at some point, a force covered them); the record is durable
    // only once its last part is.
    journal_core::sync::future::block_on(j.commit_async(lsn)).unwrap();
    assert!(j.durable_lsn().0 >= lsn.0 + p.len() as u64);
    let q = big(6, 100 << 10);
    let lq = j.append(&q).unwrap();
    // The watch waits for the whole record: forcing its first part (a
    // position inside the record, not its LSN) does not end the wait.
    {
        let mut wait = std::pin::pin!(j.durable_lsn_watch().wait_for(lq));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        j.force(Lsn(lq.0 + 1), journal_core::ForceMode::Durable)
            .unwrap();
        assert!(j.durable_lsn() > lq, "the first part is durable");
        assert!(j.durable_lsn().0 < lq.0 + q.len() as u64, "the last is not");
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        j.force(lq, journal_core::ForceMode::Durable).unwrap();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        assert!(j.durable_lsn().0 >= lq.0 + q.len() as u64);
    }
    drop(j);
    let j = open_sim(&vfs.crash(CrashPolicy::DropUnsynced), small_options()).unwrap();
    let got = replay(&j);
    assert_eq!(got, vec![(lsn, p), (lq, q)]);
}
