//! Loom model: the recycler races a writer doing the write-path check, over
//! SimVfs. Whatever the interleaving, a commit the writer acknowledged is
//! found under the right name in the image a crash in the window between
//! the batch's renames and its directory fsync leaves (the crash is taken
//! at the recycle's failpoint).

mod common;

use common::*;
use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::{model, thread, Arc};
use journal_vfs::CrashPolicy;
use segment_recycler::{segment_name, DATA_OFFSET, FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC};

/// Removes the failpoint's callback when dropped, also while a failing
/// execution unwinds: the callback holds the model's objects, which must
/// not outlive the execution.
struct RemoveOnDrop;

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        fail::remove(FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC);
    }
}

#[test]
fn an_acknowledged_commit_in_a_recycled_segment_survives_a_crash() {
    let _scenario = fail::FailScenario::setup();
    model(|| {
        let vfs = sim();
        let (store, _) = open(&vfs, small());
        store.file(0).unwrap();
        store.set_head(1);
        store.file(1).unwrap();
        let acked = Arc::new(AtomicBool::new(false));

        let (s2, a2) = (store.clone(), acked.clone());
        let writer = thread::spawn(move || {
            // Segment 2 is the recycled segment 0 (or waits for it).
            let f = s2.file(2).unwrap();
            s2.make_name_durable(2).unwrap();
            f.write_at_fua(b"commit", DATA_OFFSET).unwrap();
            a2.store(true, Ordering::Release);
        });

        let (v2, a3) = (vfs.clone(), acked.clone());
        let _remove = RemoveOnDrop;
        fail::cfg_callback(FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC, move || {
            let was_acked = a3.load(Ordering::Acquire);
            let img = v2.crash(CrashPolicy::DropUnsynced);
            if was_acked {
                let b = img
                    .live_contents(&dir().join(segment_name(2)))
                    .expect("an acknowledged commit's segment name survived the crash");
                assert_eq!(
                    &b[DATA_OFFSET as usize..DATA_OFFSET as usize + 6],
                    b"commit"
                );
            }
        })
        .unwrap();
        store.recycle(1).unwrap();
        writer.join().unwrap();
    });
}
