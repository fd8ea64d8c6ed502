//! Loom model of the composed stack: two committers, the batcher, the ring
//! and the device over SimVfs. A commit returns only after its record is
//! durable in the SimVfs image.

use journal_core::{Lsn, Options};
use journal_sync::{model, thread, Arc};
use journal_tests::{open_sim, sim_dir};
use journal_vfs::SimVfs;
use segment_recycler::{segment_name, DATA_OFFSET};

fn options() -> Options {
    Options {
        segment_size: 64 << 10,
        logbufs: 2,
        logbsize: 16 << 10,
        preallocate_ahead: 1,
        max_segments: 4,
        background_preallocation: false,
        ..Options::default()
    }
}

/// The entry at `lsn` as a crash (dropping every unsynced write) would leave it.
fn durable_entry(vfs: &SimVfs, lsn: Lsn, len: usize) -> Option<Vec<u8>> {
    let data = (64 << 10) - DATA_OFFSET;
    let seg = lsn.0 / data;
    let off = (DATA_OFFSET + lsn.0 % data) as usize + 4;
    let bytes = vfs.durable_contents(&sim_dir().join(segment_name(seg)))?;
    bytes.get(off..off + len).map(|b| b.to_vec())
}

#[test]
fn a_commit_returns_only_once_its_record_is_durable() {
    model(|| {
        let vfs = SimVfs::new();
        let j = Arc::new(open_sim(&vfs, options()).unwrap());
        let (j2, v2) = (j.clone(), vfs.clone());
        let t = thread::spawn(move || {
            let l = j2.append_durable(b"from-thread").unwrap();
            assert_eq!(
                durable_entry(&v2, l, 11).as_deref(),
                Some(&b"from-thread"[..])
            );
        });
        let l = j.append(b"from-main").unwrap();
        j.commit(l).unwrap();
        assert_eq!(
            durable_entry(&vfs, l, 9).as_deref(),
            Some(&b"from-main"[..])
        );
        t.join().unwrap();
    });
}
