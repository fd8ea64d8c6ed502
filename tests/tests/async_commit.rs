//! The async API under tokio: many tasks on a 2-worker runtime commit
//! through the journal's futures; an acknowledged future means durable;
//! a dropped future loses nothing; poisoning wakes every waiting task with
//! the error; the durable-LSN watch wakes a passive waiter.
#![cfg(not(loom))]

use journal_core::format::{segment_name, ENTRY_HEADER_SIZE};
use journal_core::vfs::{CrashPolicy, Fault, Op, SimVfs};
use journal_core::{Error, Geometry, Journal, Lsn, Options};
use journal_tests::{open_sim, payload, sim_dir, small_options, verify};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The entry at `lsn` as a crash (dropping every unsynced write) would
/// leave it (its bytes may continue in the next segment).
fn durable_entry(vfs: &SimVfs, o: &Options, lsn: Lsn, len: usize) -> Option<Vec<u8>> {
    let g = Geometry::new(o.segment_size, o.alignment);
    let mut at = lsn.plus(ENTRY_HEADER_SIZE as u64);
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let (seg, off) = g.locate(at);
        let n = (g.room_in_segment(at) as usize).min(len - out.len());
        let bytes = vfs.durable_contents(&sim_dir().join(segment_name(seg)))?;
        out.extend_from_slice(bytes.get(off as usize..off as usize + n)?);
        at = at.plus(n as u64);
    }
    Some(out)
}

#[test]
fn many_tasks_commit_and_an_acknowledged_future_means_durable() {
    let vfs = SimVfs::new();
    let o = small_options();
    let j = Arc::new(open_sim(&vfs, o).unwrap());
    let rt = runtime();
    let acked = rt.block_on(async {
        let tasks: Vec<_> = (0..64u8)
            .map(|t| {
                let (j, vfs) = (j.clone(), vfs.clone());
                tokio::spawn(async move {
                    let mut mine = Vec::new();
                    for s in 0..20u32 {
                        let p = payload(t, s, 100 + (s as usize * 53) % 900);
                        let l = if s % 2 == 0 {
                            j.append_durable_async(&p).await.unwrap()
                        } else {
                            let l = j.append(&p).unwrap();
                            j.commit_async(l).await.unwrap();
                            l
                        };
                        assert_eq!(
                            durable_entry(&vfs, &o, l, p.len()).as_deref(),
                            Some(&p[..]),
                            "acknowledged but not durable"
                        );
                        mine.push((l, p));
                    }
                    mine
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    assert_eq!(acked.len(), 64 * 20);
    // Every acknowledged future counted once; whatever the schedule,
    // every group covered at least one commit.
    let m = j.metrics();
    assert_eq!(m.commits, 64 * 20, "{m:?}");
    assert!(m.groups >= 1 && m.groups <= m.commits, "{m:?}");
    drop(rt);
    drop(j);
    let j = open_sim(&vfs.crash(CrashPolicy::DropUnsynced), o).unwrap();
    verify(&j, &acked, "after the async run");
}

#[test]
fn a_dropped_future_loses_nothing() {
    let vfs = SimVfs::new();
    let o = small_options();
    let j = open_sim(&vfs, o).unwrap();
    let l = j.append(b"abandoned").unwrap();
    {
        let mut fut = std::pin::pin!(j.durable_lsn_watch().wait_for(l));
        let mut cx = Context::from_waker(Waker::noop());
        // Registered and pending (nothing forces a passive wait)...
        assert!(fut.as_mut().poll(&mut cx).is_pending());
    } // ...then dropped mid-wait.
    let mut fut = std::pin::pin!(j.commit_async(l));
    let mut cx = Context::from_waker(Waker::noop());
    // The forcing future may still be pending: wait for it on this thread.
    if fut.as_mut().poll(&mut cx).is_pending() {
        journal_core::sync::future::block_on(fut).unwrap();
    }
    assert_eq!(
        durable_entry(&vfs, &o, l, 9).as_deref(),
        Some(&b"abandoned"[..])
    );
    // An LSN never appended is refused at once.
    let head = j.appended_lsn();
    assert!(matches!(
        journal_core::sync::future::block_on(j.commit_async(head)),
        Err(Error::LsnNotAppended { .. })
    ));
}

#[test]
fn poisoning_wakes_every_waiting_task_with_the_error() {
    let vfs = SimVfs::new();
    vfs.set_sync_latency(std::time::Duration::from_millis(2));
    let j = Arc::new(open_sim(&vfs, small_options()).unwrap());
    j.append_durable(b"before").unwrap();
    vfs.inject(Fault::eio(Op::SyncData, 1));
    let rt = runtime();
    let results = rt.block_on(async {
        let tasks: Vec<_> = (0..40u8)
            .map(|t| {
                let j = j.clone();
                tokio::spawn(async move { j.append_durable_async(&payload(t, 0, 200)).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    for r in results {
        let e = r.expect_err("no commit survives the failed sync");
        assert!(matches!(e, Error::Poisoned(_)), "{e:?}");
        assert_eq!(e.raw_os_error(), Some(5));
    }
}

#[test]
fn the_durable_lsn_watch_wakes_a_passive_waiter() {
    let vfs = SimVfs::new();
    let j = Arc::new(open_sim(&vfs, small_options()).unwrap());
    let l = j.append(b"watched").unwrap();
    let rt = runtime();
    let j2 = j.clone();
    let waiter = rt.spawn(async move { j2.durable_lsn_watch().wait_for(l).await });
    // A committer thread makes it durable; the waiter forces nothing.
    let j3: Arc<Journal> = j.clone();
    std::thread::spawn(move || j3.commit(l).unwrap())
        .join()
        .unwrap();
    rt.block_on(waiter).unwrap().unwrap();
    assert!(j.durable_lsn_watch().current() > l);
}
