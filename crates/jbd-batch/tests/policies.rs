//! Policy decisions, asserted on statistics rather than on time.
#![cfg(not(loom))]

use jbd_batch::{BatchConfig, BatchPolicy, Batcher, WaitDecision};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A batcher whose commits record their targets.
fn batcher(config: BatchConfig) -> (Batcher<u64, String>, Arc<Mutex<Vec<u64>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l2 = log.clone();
    let b = Batcher::new(config, move |p| {
        l2.lock().unwrap().push(p);
        Ok(())
    });
    (b, log)
}

fn cfg(policy: BatchPolicy) -> BatchConfig {
    BatchConfig {
        policy,
        min_batch: Duration::from_millis(2),
        max_batch: Duration::from_millis(2),
        fixed_window: Duration::from_millis(2),
        ..BatchConfig::default()
    }
}

#[test]
fn a_lone_writer_never_waits() {
    let (b, log) = batcher(cfg(BatchPolicy::Adaptive));
    for p in 1..=50 {
        assert_eq!(b.start().stop_sync(p), Ok(WaitDecision::SkippedLone));
        assert_eq!(b.committed(), Some(p));
    }
    let s = b.stats();
    assert_eq!((s.waits_taken, s.skipped_lone, s.groups), (0, 50, 50));
    assert_eq!(log.lock().unwrap().len(), 50);
}

#[test]
fn the_last_sync_writer_does_not_wait() {
    let (b, _) = batcher(cfg(BatchPolicy::Adaptive));
    let other = b.start(); // someone else is working: not lone
    assert_eq!(b.start().stop_sync(1), Ok(WaitDecision::EndedByTimer));
    assert_eq!(b.start().stop_sync(2), Ok(WaitDecision::SkippedLastWriter));
    drop(other);
    let s = b.stats();
    assert_eq!((s.waits_taken, s.skipped_last_writer), (1, 1));
}

/// Two threads take turns. Neither was the last sync writer, so the 2005
/// rule makes each wait; with no other handle open, Adaptive never does.
fn alternate(policy: BatchPolicy) -> jbd_batch::BatchStats {
    let (b, _) = batcher(cfg(policy));
    let (to_b, from_a) = mpsc::channel::<u64>();
    let (to_a, from_b) = mpsc::channel::<u64>();
    let b2 = b.clone();
    let t = std::thread::spawn(move || {
        while let Ok(p) = from_a.recv() {
            b2.start().stop_sync(p + 1).unwrap();
            if to_a.send(p + 1).is_err() {
                break;
            }
        }
    });
    let mut p = 0;
    for _ in 0..10 {
        b.start().stop_sync(p + 1).unwrap();
        to_b.send(p + 1).unwrap();
        p = from_b.recv().unwrap();
    }
    drop(to_b);
    t.join().unwrap();
    b.stats()
}

#[test]
fn two_alternating_threads() {
    let adaptive = alternate(BatchPolicy::Adaptive);
    assert_eq!((adaptive.waits_taken, adaptive.skipped_lone), (0, 20));
    let jbd2005 = alternate(BatchPolicy::LastSyncWriter);
    assert_eq!((jbd2005.waits_taken, jbd2005.skipped_last_writer), (20, 0));
}

#[test]
fn a_complete_group_ends_the_wait_early() {
    let config = BatchConfig {
        min_batch: Duration::from_secs(30),
        max_batch: Duration::from_secs(30),
        ..BatchConfig::default()
    };
    let (b, log) = batcher(config);
    let h1 = b.start();
    let h2 = b.start();
    let b2 = b.clone();
    let t = std::thread::spawn(move || h1.stop_sync(10));
    // Wait until the first committer is in its batching wait, then stop the
    // last open handle: the group is complete and the wait ends at once.
    // (The batcher signals nothing for "a thread started waiting": poll its
    // counter, bounded.)
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while b.stats().waits_taken == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first committer never waited"
        );
        std::thread::yield_now();
    }
    h2.stop_async();
    let d1 = t.join().unwrap().unwrap();
    assert_eq!(d1, WaitDecision::EndedByGroup);
    let s = b2.stats();
    assert_eq!((s.waits_ended_by_group, s.waits_ended_by_timer), (1, 0));
    assert_eq!(*log.lock().unwrap(), [10]);
}

#[test]
fn max_batch_zero_never_waits() {
    for policy in [
        BatchPolicy::Adaptive,
        BatchPolicy::LastSyncWriter,
        BatchPolicy::FixedSleep(Duration::from_secs(30)),
    ] {
        let (b, _) = batcher(BatchConfig {
            policy,
            max_batch: Duration::ZERO,
            ..BatchConfig::default()
        });
        let other = b.start();
        for p in 1..=5 {
            assert_eq!(b.start().stop_sync(p), Ok(WaitDecision::Disabled));
        }
        drop(other);
        assert_eq!(b.stats().waits_taken, 0, "{policy:?}");
    }
}

#[test]
fn policy_none_never_waits_and_fixed_sleep_always_does() {
    let (b, _) = batcher(cfg(BatchPolicy::None));
    let other = b.start();
    assert_eq!(b.start().stop_sync(1), Ok(WaitDecision::Disabled));
    drop(other);
    let (b, _) = batcher(cfg(BatchPolicy::FixedSleep(Duration::from_millis(1))));
    assert_eq!(b.start().stop_sync(1), Ok(WaitDecision::EndedByTimer));
    assert_eq!(b.start().stop_sync(2), Ok(WaitDecision::EndedByTimer));
    assert_eq!(b.stats().waits_taken, 2);
}

#[test]
fn a_failed_commit_reaches_its_waiters_and_the_batcher_stays_usable() {
    let fail = Arc::new(Mutex::new(true));
    let calls = Arc::new(Mutex::new(0u32));
    let (f2, c2) = (fail.clone(), calls.clone());
    let b: Batcher<u64, String> = Batcher::new(BatchConfig::default(), move |p| {
        *c2.lock().unwrap() += 1;
        if *f2.lock().unwrap() {
            Err(format!("commit {p} failed"))
        } else {
            Ok(())
        }
    });
    assert_eq!(b.start().stop_sync(5), Err("commit 5 failed".into()));
    assert_eq!(b.committed(), None);
    assert_eq!(*calls.lock().unwrap(), 1);
    *fail.lock().unwrap() = false;
    // At or below the failed target: the same error, no retry of the
    // commit (even though it would succeed now).
    assert_eq!(b.start().stop_sync(5), Err("commit 5 failed".into()));
    assert_eq!(b.start().stop_sync(3), Err("commit 5 failed".into()));
    assert_eq!(*calls.lock().unwrap(), 1, "a failed commit is not retried");
    // Above it: the commit function runs again.
    assert!(b.start().stop_sync(6).is_ok());
    assert_eq!(*calls.lock().unwrap(), 2);
    assert_eq!(b.committed(), Some(6));
    // A later success covers the failed positions.
    assert!(b.start().stop_sync(5).is_ok());
}

#[test]
fn concurrent_committers_share_groups_and_every_stop_is_covered() {
    let (b, log) = batcher(BatchConfig::default());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let p = i * 8 + t;
                    b.start().stop_sync(p).unwrap();
                    assert!(b.committed().unwrap() >= p);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = b.stats();
    assert_eq!(s.members + s.already_covered, 400);
    assert_eq!(s.groups, log.lock().unwrap().len() as u64);
    assert_eq!(s.group_sizes.iter().sum::<u64>(), s.groups);
    let targets = log.lock().unwrap().clone();
    assert!(
        targets.windows(2).all(|w| w[0] < w[1]),
        "targets increase: one leader at a time"
    );
}

/// With `min_batch < max_batch` the adaptive window is the average commit
/// time clamped between them — not `max_batch`: with no commit measured
/// yet (average 0) a waiting committer's window is `min_batch` (zero
/// here), so it ends by its timer at once instead of waiting 30 s for a
/// joiner that never stops.
#[test]
fn the_adaptive_window_is_the_average_clamped_not_the_maximum() {
    let (b, _) = batcher(BatchConfig {
        policy: BatchPolicy::Adaptive,
        min_batch: Duration::ZERO,
        max_batch: Duration::from_secs(30),
        fixed_window: Duration::from_millis(2),
        ..BatchConfig::default()
    });
    let other = b.start(); // someone else has a handle open: not lone
    assert_eq!(b.start().stop_sync(1), Ok(WaitDecision::EndedByTimer));
    let s = b.stats();
    assert_eq!(s.waits_taken, 1);
    assert!(
        s.wait_ns < Duration::from_secs(5).as_nanos() as u64,
        "waited {} ns: the window was max_batch",
        s.wait_ns
    );
    drop(other);
}

/// Four threads each stop `per_thread` times at the next position (the
/// positions 1, 2, … in the order the threads take them); every stop
/// returns covered.
fn four_threads_stop(b: &Batcher<u64, String>, per_thread: u64) {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (b, next) = (b.clone(), next.clone());
            s.spawn(move || {
                for _ in 0..per_thread {
                    let h = b.start();
                    let p = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    h.stop_sync(p).unwrap();
                    assert!(b.committed().unwrap() >= p);
                }
            });
        }
    });
}

/// A staged batcher with two commits in flight under four threads: a
/// commit never starts while another is still in its write stage, at most
/// two run at once, targets in flight only grow, and every stop returns
/// covered. (That they do overlap is the next test's.)
#[test]
fn staged_commits_never_start_during_a_write_and_never_exceed_two() {
    #[derive(Default)]
    struct Dev {
        writing: u32,
        in_flight: u32,
        max_in_flight: u32,
        last_target: u64,
    }
    let dev = Arc::new(Mutex::new(Dev::default()));
    let d2 = dev.clone();
    let config = BatchConfig {
        policy: BatchPolicy::None,
        max_in_flight: 2,
        ..BatchConfig::default()
    };
    let b: Batcher<u64, String> = Batcher::staged(config, move |p, stage| {
        {
            let mut d = d2.lock().unwrap();
            assert_eq!(d.writing, 0, "a commit started during another's write");
            assert!(p > d.last_target, "targets in flight only grow");
            d.last_target = p;
            d.writing += 1;
            d.in_flight += 1;
            d.max_in_flight = d.max_in_flight.max(d.in_flight);
        }
        std::thread::yield_now();
        d2.lock().unwrap().writing -= 1;
        stage.written();
        std::thread::yield_now();
        d2.lock().unwrap().in_flight -= 1;
        Ok(())
    });
    four_threads_stop(&b, 300);
    let d = dev.lock().unwrap();
    assert!(d.max_in_flight <= 2);
    assert_eq!(d.writing, 0);
    assert_eq!(b.committed(), Some(1200));
}

/// The overlap itself: while one commit is in its flush stage, a stop for a
/// later position starts the next commit at once, rather than waiting for
/// the flush. The first commit's flush waits until the second commit has
/// started (bounded: a batcher that does not overlap fails on the bound).
#[test]
fn a_staged_commit_starts_while_the_previous_one_flushes() {
    let (reached_flush, flushing) = mpsc::channel::<()>();
    let (second_started, go_on) = mpsc::channel::<u32>();
    let go_on = Mutex::new(go_on);
    let in_flight = Arc::new(Mutex::new(0u32));
    let f2 = in_flight.clone();
    // What commit 1's flush saw: how many commits were in flight when
    // commit 2 began, or a timeout. Asserted outside the commit, so a
    // batcher that does not overlap fails the test instead of hanging it.
    let seen = Arc::new(Mutex::new(None));
    let seen2 = seen.clone();
    let config = BatchConfig {
        policy: BatchPolicy::None,
        max_in_flight: 2,
        ..BatchConfig::default()
    };
    let b: Batcher<u64, String> = Batcher::staged(config, move |p, stage| {
        let now = {
            let mut n = f2.lock().unwrap();
            *n += 1;
            *n
        };
        stage.written();
        if p == 1 {
            reached_flush.send(()).unwrap();
            // The flush of commit 1 lasts until commit 2 has begun.
            let got = go_on.lock().unwrap().recv_timeout(Duration::from_secs(10));
            *seen2.lock().unwrap() = Some(got);
        } else {
            let _ = second_started.send(now);
        }
        *f2.lock().unwrap() -= 1;
        Ok(())
    });
    std::thread::scope(|s| {
        let b1 = b.clone();
        let first = s.spawn(move || b1.start().stop_sync(1).unwrap());
        flushing.recv_timeout(Duration::from_secs(20)).unwrap();
        b.start().stop_sync(2).unwrap();
        first.join().unwrap();
    });
    assert_eq!(
        *seen.lock().unwrap(),
        Some(Ok(2)),
        "commit 2 did not start while commit 1 flushed"
    );
    assert_eq!(b.committed(), Some(2));
    assert_eq!(*in_flight.lock().unwrap(), 0);
}

/// [`Stage::alone`]: a commit with one member, nothing in flight, nobody
/// waiting and no handle open is told it is alone (so it may skip its
/// staging); one taken while another handle is open is not.
#[test]
fn a_staged_commit_is_alone_only_when_nothing_else_is_going_on() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let config = BatchConfig {
        policy: BatchPolicy::None,
        max_in_flight: 2,
        ..BatchConfig::default()
    };
    let b: Batcher<u64, String> = Batcher::staged(config, move |p, stage| {
        s2.lock().unwrap().push((p, stage.alone()));
        if !stage.alone() {
            stage.written();
        }
        Ok(())
    });
    b.start().stop_sync(1).unwrap();
    let other = b.start();
    b.start().stop_sync(2).unwrap();
    drop(other);
    b.start().stop_sync(3).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(1, true), (2, false), (3, true)]);
    assert_eq!(b.committed(), Some(3));
}

/// With `overlap_max_group` below every group's size, a staged batcher
/// never lets a commit start while another is in flight, whatever the
/// commits report: large groups keep one commit in flight.
#[test]
fn staged_groups_larger_than_the_overlap_bound_are_not_overlapped() {
    let in_flight = Arc::new(Mutex::new((0u32, 0u32)));
    let f2 = in_flight.clone();
    let config = BatchConfig {
        policy: BatchPolicy::None,
        max_in_flight: 2,
        overlap_max_group: 0,
        ..BatchConfig::default()
    };
    let b: Batcher<u64, String> = Batcher::staged(config, move |_, stage| {
        {
            let mut f = f2.lock().unwrap();
            f.0 += 1;
            f.1 = f.1.max(f.0);
        }
        stage.written();
        std::thread::yield_now();
        f2.lock().unwrap().0 -= 1;
        Ok(())
    });
    four_threads_stop(&b, 200);
    assert_eq!(in_flight.lock().unwrap().1, 1, "never two commits at once");
    assert_eq!(b.committed(), Some(800));
}

/// A window whose lower bound exceeds its upper bound (the batcher's own
/// API takes any config): the upper bound wins; nothing panics.
#[test]
fn a_min_batch_above_max_batch_is_the_max_not_a_panic() {
    let cfg = BatchConfig {
        min_batch: Duration::from_millis(50),
        max_batch: Duration::from_millis(1),
        ..BatchConfig::default()
    };
    let b: Batcher<u64, String> = Batcher::new(cfg, |_| Ok(()));
    // Another handle is open and this stop was not the last sync writer:
    // the adaptive policy computes its window.
    let other = b.start();
    b.start().stop_sync(1).unwrap();
    let h = b.start();
    let waiter = std::thread::spawn(move || h.stop_sync(2));
    assert!(waiter.join().expect("no panic").is_ok());
    drop(other);
    assert!(
        b.stats().waits_taken >= 1,
        "a window was computed: {:?}",
        b.stats()
    );
}
