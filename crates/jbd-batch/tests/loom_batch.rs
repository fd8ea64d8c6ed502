//! Loom models of the batcher (≤ 3 threads).

use jbd_batch::{BatchConfig, BatchPolicy, Batcher, Stage};
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

/// A "device" that lets writes overlap and completes them in position
/// order, as iclog's ring does: a commit returns once every commit with a
/// lower target has completed too, then the durable position is its
/// target.
#[derive(Default)]
struct Overlapping {
    /// Targets whose write is running or done but not yet durable.
    running: Vec<u64>,
    durable: u64,
    in_flight: u32,
    max_seen: u32,
    /// Commits in their write stage.
    writing: u32,
}

/// The overlapping device, shared with the commit function.
type Shared = Arc<(Mutex<Overlapping>, journal_sync::Condvar)>;

/// One commit of target `p` on the overlapping device: its write stage,
/// then its in-order completion. Under a staged batcher (`stage`), it
/// checks that no other commit is writing and reports the end of its
/// write before waiting.
fn overlapping_commit(
    dev: &Shared,
    p: u64,
    stage: Option<&Stage<'_, u64, &'static str>>,
) -> Result<(), &'static str> {
    let (m, cv) = &**dev;
    {
        let mut d = m.lock();
        if stage.is_some() {
            assert_eq!(d.writing, 0, "a commit started while another was writing");
        }
        d.writing += 1;
        d.in_flight += 1;
        d.max_seen = d.max_seen.max(d.in_flight);
        d.running.push(p);
    }
    thread::yield_now();
    m.lock().writing -= 1;
    if let Some(stage) = stage {
        stage.written();
    }
    let mut d = m.lock();
    // Complete in order: wait for every lower target first.
    while d.running.iter().any(|&q| q < p) {
        d = cv.wait(d);
    }
    d.running.retain(|&q| q != p);
    d.durable = d.durable.max(p);
    d.in_flight -= 1;
    cv.notify_all();
    Ok(())
}

/// A batcher on the overlapping device: plain ([`Batcher::new`]) or
/// staged ([`Batcher::staged`]).
fn overlapping(max_in_flight: u32, staged: bool) -> (Batcher<u64, &'static str>, Shared) {
    let dev = Arc::new((
        Mutex::new(Overlapping::default()),
        journal_sync::Condvar::new(),
    ));
    let d2 = dev.clone();
    let config = BatchConfig {
        policy: BatchPolicy::None,
        max_in_flight,
        ..BatchConfig::default()
    };
    let b = if staged {
        Batcher::staged(config, move |p, stage| {
            overlapping_commit(&d2, p, Some(stage))
        })
    } else {
        Batcher::new(config, move |p| overlapping_commit(&d2, p, None))
    };
    (b, dev)
}

/// Three committers at positions 1, 2 and 3 (two spawned threads and this
/// one): each returns only once the durable position covers it, and at
/// most two commits were ever in flight.
fn three_committers(b: Batcher<u64, &'static str>, dev: Shared) {
    let hs: Vec<_> = (1..=2u64)
        .map(|p| {
            let (b, dev) = (b.clone(), dev.clone());
            thread::spawn(move || {
                b.start().stop_sync(p).unwrap();
                assert!(dev.0.lock().durable >= p);
            })
        })
        .collect();
    b.start().stop_sync(3).unwrap();
    assert!(dev.0.lock().durable >= 3);
    for h in hs {
        h.join().unwrap();
    }
    assert!(dev.0.lock().max_seen <= 2, "at most two commits in flight");
}

/// Overlapped commits (two in flight): three committers at positions 1, 2,
/// 3; whoever leads, commits run at most two at a time, each stop returns
/// only once the durable position covers it, and none waits forever (a
/// position whose commit is in flight waits for that commit, and a leader
/// may lead a later group while its own position is still in flight).
#[test]
fn overlapped_commits_cover_every_stop_and_stay_within_the_bound() {
    model(|| {
        let (b, dev) = overlapping(2, false);
        three_committers(b, dev);
    });
}

/// With one commit allowed in flight, commits never overlap.
#[test]
fn one_in_flight_never_overlaps() {
    model(|| {
        let (b, dev) = overlapping(1, false);
        let b2 = b.clone();
        let t = thread::spawn(move || b2.start().stop_sync(1).unwrap());
        b.start().stop_sync(2).unwrap();
        t.join().unwrap();
        let d = dev.0.lock();
        assert!(d.durable >= 2);
        assert_eq!(d.max_seen, 1);
    });
}

/// Staged commits, two in flight: three committers at positions 1, 2, 3.
/// The next group's leader starts only once the commit in flight has
/// written (never two writes at once), a parked committer is woken to lead
/// when a write finishes, every stop returns covered, and none waits
/// forever.
#[test]
fn staged_commits_start_the_next_group_only_after_the_write() {
    model(|| {
        let (b, dev) = overlapping(2, true);
        three_committers(b, dev);
    });
}
