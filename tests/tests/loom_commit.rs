//! Loom model of the composed stack: two committers, the batcher, the ring
//! and the device over SimVfs. A commit returns only after its record is
//! durable in the SimVfs image.

use journal_core::format::{segment_name, ENTRY_HEADER_SIZE};
use journal_core::sync::{model, thread, Arc};
use journal_core::vfs::SimVfs;
use journal_core::{Geometry, Lsn, Options};
use journal_tests::{open_sim, sim_dir};

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
    let o = options();
    let (seg, off) = Geometry::new(o.segment_size, o.alignment).locate(lsn);
    let off = off as usize + ENTRY_HEADER_SIZE;
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

/// A task awaiting `commit_async` while a committer thread commits: the
/// task's waker is registered against the completion path and the forcer,
/// and whatever the interleaving it is woken, once its record is durable.
#[test]
fn an_async_commit_is_woken_once_its_record_is_durable() {
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
        let l = j.append(b"from-task").unwrap();
        journal_core::sync::future::block_on(j.commit_async(l)).unwrap();
        assert_eq!(
            durable_entry(&vfs, l, 9).as_deref(),
            Some(&b"from-task"[..])
        );
        t.join().unwrap();
        drop(j);
    });
}

/// A task waiting on the durable-LSN watch (which forces nothing) while a
/// committer thread makes its record durable: the registration of its
/// waker races the completion path's wakeup, and no interleaving loses it.
#[test]
fn a_durable_lsn_watcher_is_never_left_asleep() {
    model(|| {
        let vfs = SimVfs::new();
        let j = Arc::new(open_sim(&vfs, options()).unwrap());
        let l = j.append(b"watched").unwrap();
        let j2 = j.clone();
        let t = thread::spawn(move || j2.commit(l).unwrap());
        journal_core::sync::future::block_on(j.durable_lsn_watch().wait_for(l)).unwrap();
        assert_eq!(durable_entry(&vfs, l, 7).as_deref(), Some(&b"watched"[..]));
        t.join().unwrap();
        drop(j);
    });
}

/// A follower blocked at the durable end (a thread waiting on the
/// durable-LSN signal through its condvar waker) while a committer thread
/// makes the next entry durable: the ring's durable hook, called outside
/// its lock from the completion path, wakes it whatever the interleaving,
/// and it reads the entry back from the segment file.
#[test]
fn a_follower_blocked_at_the_durable_end_is_woken_by_a_commit() {
    model(|| {
        let vfs = SimVfs::new();
        let j = Arc::new(open_sim(&vfs, options()).unwrap());
        let mut follower = j.follow(j.appended_lsn()).unwrap();
        let j2 = j.clone();
        let t = thread::spawn(move || j2.append_durable(b"followed").unwrap());
        let (lsn, bytes) = follower.next().unwrap().unwrap();
        assert_eq!(&*bytes, b"followed");
        assert_eq!(lsn, t.join().unwrap());
        drop(follower);
        drop(j);
    });
}

/// Overlapped group commits (two in flight): one committer's record fills
/// the first buffer, the other's goes to the second, and both force at
/// once — two log writes in flight, completing in either order. Each
/// commit returns only once its own record is durable in the SimVfs image.
#[test]
fn overlapped_commits_return_only_once_their_records_are_durable() {
    model(|| {
        let vfs = SimVfs::new();
        let opts = Options {
            commits_in_flight: 2,
            batch_policy: journal_core::BatchPolicy::None,
            ..options()
        };
        let j = Arc::new(open_sim(&vfs, opts).unwrap());
        let big = vec![7u8; opts.max_unchained_record() - 64];
        let first = j.append(&big).unwrap();
        let (j2, v2) = (j.clone(), vfs.clone());
        let t = thread::spawn(move || {
            j2.commit(first).unwrap();
            assert_eq!(
                durable_entry(&v2, first, 64).as_deref(),
                Some(&[7u8; 64][..])
            );
        });
        let second = j.append(b"second buffer").unwrap();
        j.commit(second).unwrap();
        assert_eq!(
            durable_entry(&vfs, second, 13).as_deref(),
            Some(&b"second buffer"[..])
        );
        t.join().unwrap();
    });
}
