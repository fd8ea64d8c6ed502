//! The shim behaves like std outside loom and drives loom inside it.

use journal_sync::{model, thread, Arc, Condvar, Deadline, Mutex};
use std::time::Duration;

/// A waiter always wakes for a notifier's hand-off (no lost wakeup: loom
/// reports a deadlock otherwise) and sees what the notifier published under
/// the lock, in every interleaving loom explores.
#[test]
fn condvar_handoff_has_no_lost_wakeup() {
    model(|| {
        let pair = Arc::new((Mutex::new(None::<u64>), Condvar::new()));
        let p2 = pair.clone();
        let t = thread::spawn(move || {
            *p2.0.lock() = Some(42);
            p2.1.notify_all();
        });
        let mut g = pair.0.lock();
        while g.is_none() {
            g = pair.1.wait(g);
        }
        assert_eq!(*g, Some(42), "the waiter sees the published value");
        drop(g);
        t.join().unwrap();
    });
}

/// A timed wait ends by the explicit timer event, the way loom models drive
/// timers; outside loom the clock could also end it.
#[test]
fn timer_event_ends_a_timed_wait() {
    model(|| {
        struct S {
            fired: bool,
        }
        let pair = Arc::new((Mutex::new(S { fired: false }), Condvar::new()));
        let p2 = pair.clone();
        let timer = thread::spawn(move || {
            p2.0.lock().fired = true;
            p2.1.notify_all();
        });
        let deadline = Deadline::after(Duration::from_secs(30));
        let mut g = pair.0.lock();
        while !g.fired {
            let (g2, expired) = pair.1.wait_deadline(g, &deadline);
            g = g2;
            assert!(!expired, "a 30 s deadline cannot expire here");
        }
        drop(g);
        timer.join().unwrap();
    });
}

#[cfg(not(loom))]
#[test]
fn deadline_expires_by_the_clock_outside_loom() {
    let m = Mutex::new(());
    let cv = Condvar::new();
    let d = Deadline::after(Duration::from_millis(5));
    let mut g = m.lock();
    loop {
        let (g2, expired) = cv.wait_deadline(g, &d);
        g = g2;
        if expired {
            break;
        }
    }
    assert!(d.expired());
}

#[cfg(not(loom))]
#[test]
fn a_panic_while_locked_does_not_poison() {
    let m = std::sync::Arc::new(Mutex::new(1));
    let m2 = m.clone();
    let r = std::thread::spawn(move || {
        let _g = m2.lock();
        panic!("deliberate");
    })
    .join();
    assert!(r.is_err());
    assert_eq!(*m.lock(), 1);
    assert!(m.try_lock().is_some());
}

/// A gate's waiter that follows the protocol (generation, then its own
/// condition, then wait) always wakes for an open that follows the
/// condition's change, in every interleaving (loom reports a deadlock
/// otherwise; outside loom the real futex runs it).
#[test]
fn gate_open_after_the_condition_is_never_lost() {
    use journal_sync::atomic::{AtomicBool, Ordering};
    use journal_sync::Gate;
    model(|| {
        let gate = Arc::new(Gate::new());
        let done = Arc::new(AtomicBool::new(false));
        let (g, d) = (gate.clone(), done.clone());
        let opener = thread::spawn(move || {
            d.store(true, Ordering::Release);
            g.open();
        });
        loop {
            let seen = gate.generation();
            if done.load(Ordering::Acquire) {
                break;
            }
            gate.wait(seen, 3);
        }
        opener.join().unwrap();
    });
}

/// One open wakes every sleeper of every lane; a nudge wakes a sleeper of
/// its lane. Many rounds on the real futex (outside loom: eight threads).
/// A lost wakeup fails the round once a generous deadline passes (the
/// sleeper is left behind; the process ends with the test binary).
#[cfg(not(any(loom, shuttle)))]
#[test]
fn gate_open_wakes_all_lanes_and_a_nudge_wakes_its_lane() {
    use journal_sync::atomic::{AtomicU32, Ordering};
    use journal_sync::Gate;
    const THREADS: u32 = 8;
    const ROUNDS: u32 = 300;
    let gate = Arc::new(Gate::new());
    // Round r is released for thread k once `release[k] >= r`.
    let release: Arc<Vec<AtomicU32>> = Arc::new((0..THREADS).map(|_| AtomicU32::new(0)).collect());
    let done = Arc::new(AtomicU32::new(0));
    // Far beyond any round's need (microseconds) on a loaded machine.
    const ROUND_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);
    let threads: Vec<_> = (0..THREADS)
        .map(|k| {
            let (gate, release, done) = (gate.clone(), release.clone(), done.clone());
            std::thread::spawn(move || {
                for round in 1..=ROUNDS {
                    loop {
                        let seen = gate.generation();
                        if release[k as usize].load(Ordering::Acquire) >= round {
                            break;
                        }
                        gate.wait(seen, k);
                    }
                    done.fetch_add(1, Ordering::AcqRel);
                }
            })
        })
        .collect();
    for round in 1..=ROUNDS {
        if round % 2 == 0 {
            for r in release.iter() {
                r.store(round, Ordering::Release);
            }
            gate.open();
        } else {
            for (k, r) in release.iter().enumerate() {
                r.store(round, Ordering::Release);
                gate.nudge(k as u32);
            }
        }
        let started = std::time::Instant::now();
        loop {
            let woke = done.load(Ordering::Acquire);
            if woke >= round * THREADS {
                break;
            }
            let missing = round * THREADS - woke;
            assert!(
                started.elapsed() < ROUND_DEADLINE,
                "round {round}: {missing} of {THREADS} threads not woken in {ROUND_DEADLINE:?} (a lost wakeup)"
            );
            std::thread::yield_now();
        }
    }
    for t in threads {
        t.join().unwrap();
    }
}
