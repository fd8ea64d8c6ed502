//! Creation, preallocation, recycling, the frontier, the write-path check,
//! and the seed's crash window, on SimVfs.
#![cfg(not(loom))]

mod common;

use common::*;
use journal_vfs::{CrashPolicy, Fault, Op, OpenOptions, Vfs};
use segment_recycler::{
    parse_name, segment_name, NameKind, RecyclePolicy, SegmentHeader, StoreConfig,
};

#[test]
fn names_are_fixed_width_sortable_and_parsed() {
    assert_eq!(segment_name(1), "0000000000000001.seg");
    assert_eq!(segment_name(0xabc), "0000000000000abc.seg");
    let mut v: Vec<String> = [10u64, 2, 0xff, 1]
        .iter()
        .map(|&n| segment_name(n))
        .collect();
    v.sort();
    let back: Vec<NameKind> = v.iter().map(|n| parse_name(n)).collect();
    assert_eq!(
        back,
        [1u64, 2, 10, 0xff].map(NameKind::Segment),
        "lexical order is numeric order"
    );
    assert_eq!(
        parse_name("0000000000000003.seg.tmp"),
        NameKind::Temporary(3)
    );
    for other in [
        "LOCK",
        "control",
        "000000000000003.seg",
        "000000000000000G.seg",
        "0000000000000003.SEG",
    ] {
        assert_eq!(parse_name(other), NameKind::Other, "{other}");
    }
}

#[test]
fn the_writer_creates_a_missing_segment_and_counts_the_stall() {
    let vfs = sim();
    let (store, report) = open(&vfs, small());
    assert!(report.segments.is_empty());
    let f = store.file(0).unwrap();
    assert_eq!(f.len().unwrap(), 64 << 10);
    assert_eq!(store.stats().stalls, 1);
    assert_eq!(store.frontier(), Some(0));
    // Created durably: header and name survive a crash.
    let after = vfs.crash(CrashPolicy::DropUnsynced);
    let bytes = after.live_contents(&dir().join(segment_name(0))).unwrap();
    assert_eq!(bytes.len(), 64 << 10);
    assert!(
        matches!(SegmentHeader::check(&bytes), segment_recycler::HeaderCheck::Valid(h) if h.segment_no.get() == 0)
    );
    store.prepare_ahead().unwrap();
    assert_eq!(store.segments(), [0, 1]);
    store.file(1).unwrap();
    assert_eq!(store.stats().stalls, 1, "a prepared segment is no stall");
}

#[test]
fn the_worker_keeps_segments_ready_ahead_of_the_head() {
    let vfs = sim();
    let cfg = StoreConfig {
        preallocate_ahead: 3,
        ..small()
    };
    let (store, _) = open(&vfs, cfg);
    let worker = store.start_worker();
    store.set_head(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.segments() != [0, 1, 2, 3] {
        assert!(
            std::time::Instant::now() < deadline,
            "worker did not prepare: {:?}",
            store.segments()
        );
        std::thread::yield_now();
    }
    drop(worker);
    assert!(store.stats().created >= 4);
}

#[test]
fn batched_recycling_pays_one_directory_fsync() {
    for (policy, dir_syncs) in [
        (RecyclePolicy::Batched, 1),
        (RecyclePolicy::PerSegmentDurableRename, 3),
    ] {
        let vfs = sim();
        let cfg = StoreConfig {
            recycle_policy: policy,
            ..small()
        };
        let store = store_with(&vfs, cfg, 5);
        store.set_head(4);
        let before = vfs.counters();
        let r = store.recycle(3).unwrap();
        let d = vfs.counters().since(&before);
        assert_eq!(r.recycled, [(0, 5), (1, 6), (2, 7)], "{policy:?}");
        assert!(r.removed.is_empty());
        assert_eq!(d.dir_fsyncs, dir_syncs, "{policy:?}");
        assert_eq!(d.renames, 3);
        assert_eq!(store.segments(), [3, 4, 5, 6, 7]);
        assert_eq!(store.frontier(), Some(7));
        // After a crash the names are durable. Per segment, the headers are
        // too; batched, a header rewrite may be lost, and open repairs it.
        let img = vfs.crash(CrashPolicy::DropUnsynced);
        drop(store);
        let (reopened, report) = open(&img, cfg);
        assert_eq!(reopened.segments(), [3, 4, 5, 6, 7]);
        let expect: &[u64] = if policy == RecyclePolicy::Batched {
            &[5, 6, 7]
        } else {
            &[]
        };
        assert_eq!(report.reinitialized, expect, "{policy:?}");
        for n in 5..=7 {
            let b = img.live_contents(&dir().join(segment_name(n))).unwrap();
            match SegmentHeader::check(&b) {
                segment_recycler::HeaderCheck::Valid(h) => assert_eq!(h.segment_no.get(), n),
                o => panic!("{o:?}"),
            }
        }
    }
}

#[test]
fn segments_beyond_max_segments_are_removed() {
    let vfs = sim();
    let cfg = StoreConfig {
        max_segments: 4,
        ..small()
    };
    let store = store_with(&vfs, cfg, 4);
    store.set_head(3);
    let r = store.recycle(3).unwrap();
    // One file is live (3): three old ones fit under max_segments = 4.
    assert_eq!(r.recycled.len() + r.removed.len(), 3);
    assert_eq!(store.segments().len(), 4);
    let vfs = sim();
    let store = store_with(
        &vfs,
        StoreConfig {
            max_segments: 2,
            ..small()
        },
        4,
    );
    store.set_head(3);
    let r = store.recycle(3).unwrap();
    assert_eq!((r.recycled.len(), r.removed.len()), (1, 2));
    assert_eq!(store.segments(), [3, 4]);
    assert!(!vfs.exists(&dir().join(segment_name(1))).unwrap());
}

#[test]
fn startup_reports_ignores_and_rejects() {
    let vfs = sim();
    let store = store_with(&vfs, small(), 3);
    drop(store);
    vfs.open(&dir().join("notes.txt"), OpenOptions::create())
        .unwrap();
    vfs.open(
        &dir().join("0000000000000009.seg.tmp"),
        OpenOptions::create(),
    )
    .unwrap();
    vfs.remove_file(&dir().join(segment_name(1))).unwrap();
    let (_, r) = open(&vfs, small());
    assert_eq!(r.segments, [0, 2]);
    assert_eq!(r.ignored, ["notes.txt"]);
    assert_eq!(r.removed_temporaries, ["0000000000000009.seg.tmp"]);
    assert_eq!(r.gaps, [1]);
    assert!(!vfs.exists(&dir().join("0000000000000009.seg.tmp")).unwrap());

    // A corrupt header is reported as damage naming the segment, which is
    // not installed (whether it may be replaced is the journal's call).
    let f = vfs
        .open(&dir().join(segment_name(2)), OpenOptions::write())
        .unwrap();
    f.write_at(b"X", 10).unwrap();
    let v: std::sync::Arc<dyn Vfs> = std::sync::Arc::new(vfs.clone());
    let (store, r) = segment_recycler::SegmentStore::open(v.clone(), &dir(), small(), ID).unwrap();
    assert_eq!(r.segments, [0]);
    assert_eq!(r.damaged.len(), 1);
    assert_eq!(r.damaged[0].segment, 2);
    assert!(
        matches!(
            *r.damaged[0].error,
            segment_recycler::Error::BadHeader { segment: 2, .. }
        ),
        "{}",
        r.damaged[0].error
    );
    drop(store);
    f.write_at(&SegmentHeader::new(2, 64 << 10, ID).to_bytes(), 0)
        .unwrap();
    // Another journal's segment.
    let e = segment_recycler::SegmentStore::open(v.clone(), &dir(), small(), *b"another-journal!")
        .unwrap_err();
    assert!(
        matches!(e, segment_recycler::Error::ForeignSegment { .. }),
        "{e}"
    );
    // A newer format version (its CRC holds: a flipped version bit would
    // be a bad header instead).
    let mut newer = SegmentHeader::new(2, 64 << 10, ID).to_bytes();
    newer[4..6].copy_from_slice(&7u16.to_le_bytes());
    let crc = crc32c::crc32c(&newer[..44]);
    newer[44..48].copy_from_slice(&crc.to_le_bytes());
    f.write_at(&newer, 0).unwrap();
    let e = segment_recycler::SegmentStore::open(v.clone(), &dir(), small(), ID).unwrap_err();
    assert!(
        matches!(
            e,
            segment_recycler::Error::UnsupportedVersion { version: 7, .. }
        ),
        "{e}"
    );
    // Another segment size.
    f.write_at(&SegmentHeader::new(2, 64 << 10, ID).to_bytes(), 0)
        .unwrap();
    let e = segment_recycler::SegmentStore::open(
        v.clone(),
        &dir(),
        StoreConfig {
            segment_size: 128 << 10,
            ..small()
        },
        ID,
    )
    .unwrap_err();
    assert!(
        matches!(e, segment_recycler::Error::SizeMismatch { .. }),
        "{e}"
    );
    // A lost (zero) header and a header left from before a recycle are
    // rewritten and reported.
    f.write_at(&[0u8; 48], 0).unwrap();
    let g = vfs
        .open(&dir().join(segment_name(0)), OpenOptions::write())
        .unwrap();
    vfs.rename(&dir().join(segment_name(0)), &dir().join(segment_name(5)))
        .unwrap();
    drop(g);
    let (store, r) = open(&vfs, small());
    assert_eq!(r.reinitialized, [2, 5]);
    assert_eq!(store.segments(), [2, 5]);
}

#[test]
fn header_round_trip_and_rejection() {
    let h = SegmentHeader::new(42, 1 << 24, ID);
    let b = h.to_bytes();
    assert_eq!(&b[..4], b"JSEG");
    assert_eq!(
        segment_recycler::SegmentHeader::check(&b),
        segment_recycler::HeaderCheck::Valid(h)
    );
    for i in 0..48 {
        for bit in 0..8 {
            let mut c = b;
            c[i] ^= 1 << bit;
            assert!(
                !matches!(
                    SegmentHeader::check(&c),
                    segment_recycler::HeaderCheck::Valid(_)
                ),
                "byte {i} bit {bit}"
            );
        }
    }
    assert_eq!(
        SegmentHeader::check(&[0u8; 48]),
        segment_recycler::HeaderCheck::Zeroes
    );
    assert_eq!(
        SegmentHeader::check(&b[..10]),
        segment_recycler::HeaderCheck::Short
    );
}

/// EIO or ENOSPC at each call site of creation and recycling: the error is
/// returned, the store stays consistent (it can go on once the fault is
/// gone), and a crash right after leaves a directory that opens.
#[test]
fn faults_at_every_call_site_leave_the_store_consistent() {
    let sites = [
        Op::Create,
        Op::Preallocate,
        Op::Write,
        Op::Sync,
        Op::Rename,
        Op::SyncDir,
        Op::Remove,
    ];
    let mut fired_at = std::collections::HashSet::new();
    for policy in [
        RecyclePolicy::Batched,
        RecyclePolicy::PerSegmentDurableRename,
    ] {
        for op in sites {
            for enospc in [false, true] {
                let vfs = sim();
                let cfg = StoreConfig {
                    recycle_policy: policy,
                    max_segments: 4,
                    ..small()
                };
                let store = store_with(&vfs, cfg, 4);
                store.set_head(3);
                let fault = if enospc {
                    Fault::enospc(op, 1)
                } else {
                    Fault::eio(op, 1)
                };
                vfs.inject(fault);
                // Creation of a new segment, then a recycle pass.
                let created = store.file(4);
                let recycled = store.recycle(3);
                let fired = vfs.calls(op) > 0 && (created.is_err() || recycled.is_err());
                vfs.clear_faults();
                let label = format!("{policy:?} {op:?} enospc={enospc}");
                if fired {
                    fired_at.insert(format!("{op:?}"));
                    let e = created.err().or(recycled.err()).unwrap();
                    let text = e.to_string();
                    assert!(
                        text.contains("Input/output") || text.contains("No space"),
                        "{label}: {text}"
                    );
                }
                // Consistent: every installed segment exists under its name.
                for n in store.segments() {
                    assert!(
                        vfs.exists(&dir().join(segment_name(n))).unwrap(),
                        "{label}: {n} missing"
                    );
                }
                // It goes on.
                store.set_head(4);
                store.file(4).unwrap();
                store.recycle(4).unwrap();
                // A crash now leaves a directory that opens.
                let img = vfs.crash(CrashPolicy::TornSectors { seed: 7 });
                let (_, r) = open(&img, cfg);
                assert!(!r.segments.is_empty(), "{label}");
            }
        }
    }
    assert_eq!(
        fired_at.len(),
        sites.len(),
        "every call site was hit: {fired_at:?}"
    );
}

/// A number a recycle retired is never created again: a writer that read
/// the log's position before a checkpoint and asks for a segment the
/// checkpoint is removing would otherwise bring the file back under the
/// recycle's feet (which then removed the new file and, one checkpoint
/// later, failed to remove it again: a journal poisoned by NotFound).
#[test]
fn a_retired_segment_is_never_created_again() {
    let vfs = sim();
    let cfg = StoreConfig {
        max_segments: 2,
        ..small()
    };
    let store = store_with(&vfs, cfg, 4);
    store.set_head(3);
    let r = store.recycle(3).unwrap();
    assert_eq!(r.removed, [1, 2]);
    for n in 0..3 {
        match store.file(n) {
            Err(segment_recycler::Error::Retired { segment }) => assert_eq!(segment, n),
            o => panic!("segment {n}: {o:?}"),
        }
        assert!(!vfs.exists(&dir().join(segment_name(n))).unwrap());
    }
    assert_eq!(store.segments(), [3, 4]);
    // The store goes on: the next checkpoint recycles what the log left.
    store.set_head(4);
    store.file(5).unwrap();
    store.recycle(4).unwrap();
    assert_eq!(store.segments(), [4, 5]);
}
