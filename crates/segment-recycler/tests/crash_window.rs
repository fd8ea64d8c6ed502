//! The crash window of batched recycling, driven through the failpoint
//! between a batch's renames and its directory fsync: a commit goes into
//! a just-recycled segment and the power fails before the fsync.
//!
//! Its own test binary: failpoints are process-global, and every test here
//! holds a `FailScenario` so none sees another's configuration. The loom
//! model of the same window is `loom_frontier.rs`.
#![cfg(not(loom))]

mod common;

use common::*;
use journal_vfs::{CrashPolicy, Vfs};
use segment_recycler::{Error, SegmentStore, DATA_OFFSET, FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC};
use std::sync::{Arc, Mutex};

/// Recycles the segments below `redo` with `in_window` run in the window
/// before the directory fsync; returns the report and what the window
/// produced.
fn in_the_window<T: Send + 'static>(
    store: &SegmentStore,
    redo: u64,
    in_window: impl Fn(&SegmentStore) -> T + Send + Sync + 'static,
) -> (segment_recycler::RecycleReport, T) {
    let out = Arc::new(Mutex::new(None));
    let (s2, o2) = (store.clone(), out.clone());
    fail::cfg_callback(FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC, move || {
        *o2.lock().unwrap() = Some(in_window(&s2));
    })
    .unwrap();
    let report = store.recycle(redo).unwrap();
    let got = out.lock().unwrap().take().expect("the failpoint ran");
    (report, got)
}

/// The commit bytes a power cut in the window leaves in segment 2.
fn crash_window(use_check: bool) -> Option<Vec<u8>> {
    let _scenario = fail::FailScenario::setup();
    let vfs = sim();
    let store = store_with(&vfs, small(), 2);
    store.set_head(1);
    let v2 = vfs.clone();
    let (report, image) = in_the_window(&store, 1, move |store| {
        let f = store.file(2).unwrap();
        if use_check {
            store.make_name_durable(2).unwrap();
        }
        f.write_at_fua(b"committed", DATA_OFFSET).unwrap();
        v2.crash(CrashPolicy::DropUnsynced)
    });
    assert_eq!(report.recycled, [(0, 2)]);
    image
        .live_contents(&dir().join(segment_recycler::segment_name(2)))
        .map(|b| b[DATA_OFFSET as usize..DATA_OFFSET as usize + 9].to_vec())
}

#[test]
fn the_write_path_check_closes_the_crash_window() {
    assert_eq!(crash_window(true).as_deref(), Some(&b"committed"[..]));
}

#[test]
fn without_the_check_the_commit_is_lost() {
    assert_ne!(crash_window(false).as_deref(), Some(&b"committed"[..]));
}

#[test]
fn the_check_is_free_at_or_below_the_frontier_and_counted_above_it() {
    let _scenario = fail::FailScenario::setup();
    let vfs = sim();
    let store = store_with(&vfs, small(), 3);
    store.set_head(2);
    let before = vfs.counters();
    store.make_name_durable(1).unwrap();
    assert_eq!(
        vfs.counters().since(&before).syncs(),
        0,
        "segment 1 is at or below the frontier"
    );
    let (_, (frontier_before, fallbacks, frontier_after)) = in_the_window(&store, 2, |store| {
        let frontier_before = store.frontier();
        store.make_name_durable(3).unwrap();
        (
            frontier_before,
            store.stats().frontier_fallbacks,
            store.frontier(),
        )
    });
    assert_eq!(frontier_before, Some(2));
    assert_eq!(fallbacks, 1);
    assert_eq!(
        frontier_after,
        Some(4),
        "the fallback's directory fsync covered the batch"
    );
}

#[test]
fn a_recycle_failing_before_its_directory_fsync_reports_it_and_leaves_the_store_usable() {
    let _scenario = fail::FailScenario::setup();
    let vfs = sim();
    let store = store_with(&vfs, small(), 3);
    store.set_head(2);
    fail::cfg(FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC, "return").unwrap();
    assert!(matches!(store.recycle(2), Err(Error::Io { .. })));
    fail::remove(FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC);
    // The renamed segments are installed; their names become durable by
    // the write-path check.
    store.make_name_durable(3).unwrap();
    assert!(matches!(
        store.make_name_durable(99),
        Err(Error::NotInstalled { segment: 99 })
    ));
}
