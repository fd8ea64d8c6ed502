//! Loom model: the recycler races a writer doing the write-path check, over
//! SimVfs. Whatever the interleaving, a commit the writer acknowledged is
//! found under the right name in the image a crash leaves.

mod common;

use common::*;
use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::{model, thread, Arc};
use journal_vfs::CrashPolicy;
use segment_recycler::{segment_name, DATA_OFFSET};

#[test]
fn an_acknowledged_commit_in_a_recycled_segment_survives_a_crash() {
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

        let pending = store.recycle_begin(1).unwrap();
        let was_acked = acked.load(Ordering::Acquire);
        let img = vfs.crash(CrashPolicy::DropUnsynced);
        if was_acked {
            let b = img
                .live_contents(&dir().join(segment_name(2)))
                .expect("name survived");
            assert_eq!(
                &b[DATA_OFFSET as usize..DATA_OFFSET as usize + 6],
                b"commit"
            );
        }
        pending.finish().unwrap();
        writer.join().unwrap();
    });
}
