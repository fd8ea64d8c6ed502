//! Loom models of the batcher (≤ 3 threads).

use jbd_batch::{BatchConfig, BatchPolicy, Batcher};
use journal_sync::{model, thread, Arc, Mutex};

/// The "device": records the committed position and checks that commits
/// never overlap (one leader at a time) and targets only grow.
#[derive(Default)]
struct Dev {
    in_commit: bool,
    durable: Option<u64>,
    commits: u32,
}

fn batcher(policy: BatchPolicy, fail: bool) -> (Batcher<u64, &'static str>, Arc<Mutex<Dev>>) {
    let dev = Arc::new(Mutex::new(Dev::default()));
    let d2 = dev.clone();
    let config = BatchConfig {
        policy,
        ..BatchConfig::default()
    };
    let b = Batcher::new(config, move |p| {
        {
            let mut d = d2.lock();
            assert!(!d.in_commit, "two leaders at once");
            d.in_commit = true;
        }
        thread::yield_now();
        let mut d = d2.lock();
        d.in_commit = false;
        d.commits += 1;
        if fail {
            return Err("device failed");
        }
        assert!(d.durable.is_none_or(|c| c < p), "targets only grow");
        d.durable = Some(p);
        Ok(())
    });
    (b, dev)
}

/// Two committers (one holding its handle while the other stops, so the
/// adaptive wait is taken): each returns only after a commit covering it,
/// exactly one leader runs at a time, and no wakeup is lost.
#[test]
fn every_sync_stop_returns_covered_with_one_leader_per_group() {
    model(|| {
        let (b, dev) = batcher(BatchPolicy::Adaptive, false);
        let h = b.start();
        let b2 = b.clone();
        let dev2 = dev.clone();
        let t = thread::spawn(move || {
            b2.start().stop_sync(1).unwrap();
            assert!(dev2.lock().durable >= Some(1));
        });
        h.stop_sync(2).unwrap();
        assert!(dev.lock().durable >= Some(2));
        t.join().unwrap();
    });
}

/// A failing commit wakes every waiter of its group with the error.
#[test]
fn a_failing_commit_wakes_all_its_waiters_with_the_error() {
    model(|| {
        let (b, _) = batcher(BatchPolicy::Adaptive, true);
        let h = b.start();
        let b2 = b.clone();
        let t = thread::spawn(move || b2.start().stop_sync(1));
        let mine = h.stop_sync(2);
        assert_eq!(mine, Err("device failed"));
        assert_eq!(t.join().unwrap(), Err("device failed"));
    });
}

/// A batching wait that nothing else would end is ended by the timer
/// event, fired by a timer thread.
#[test]
fn the_timer_event_ends_a_wait() {
    model(|| {
        let (b, dev) = batcher(BatchPolicy::Adaptive, false);
        let keeps_open = b.start(); // never stopped during the wait
        let b2 = b.clone();
        let timer = thread::spawn(move || b2.fire_timer());
        let d = b.start().stop_sync(1).unwrap();
        assert!(matches!(d, jbd_batch::WaitDecision::EndedByTimer), "{d:?}");
        assert_eq!(dev.lock().durable, Some(1));
        timer.join().unwrap();
        drop(keeps_open);
    });
}

/// Three committers, one of them waiting for joiners while the others
/// stop: every stop returns covered, by one leader at a time.
#[test]
fn three_committers_all_covered() {
    model(|| {
        let (b, dev) = batcher(BatchPolicy::Adaptive, false);
        let hs: Vec<_> = (1..=2u64)
            .map(|p| {
                let (b, dev) = (b.clone(), dev.clone());
                thread::spawn(move || {
                    b.start().stop_sync(p).unwrap();
                    assert!(dev.lock().durable >= Some(p));
                })
            })
            .collect();
        b.start().stop_sync(3).unwrap();
        assert!(dev.lock().durable >= Some(3));
        for h in hs {
            h.join().unwrap();
        }
    });
}
