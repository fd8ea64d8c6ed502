//! Reads by position (`read_at`, `read_from`, `read_range`) and following
//! the log (`follow`): byte-exact, chains included, typed errors, no scan
//! from the checkpoint, every entry once and in order across segment
//! switches and checkpoints, a lagging follower cut loose, and the durable
//! wake-up in the ring (a checkpoint's force wakes durable-LSN waiters).
#![cfg(not(any(loom, shuttle)))]

use journal_core::sync::{thread, Arc, Mutex};
use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
use journal_core::{Error, Journal, Lsn, Options};
use journal_tests::{open_sim, payload, sim_dir, small_options};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// Sizes that give whole entries, entries split at a buffer's end and
/// chains over several 16 KiB buffers.
fn size(seq: u32) -> usize {
    match seq % 7 {
        0 => 40_000,
        1 => 9_000,
        2 => 3_000,
        _ => 100 + 37 * (seq as usize % 50),
    }
}

/// Appends `n` payloads of writer `w`, committing every third; returns
/// them with their LSNs.
fn append_some(j: &Journal, w: u8, n: u32) -> Vec<(Lsn, Vec<u8>)> {
    let mut out = Vec::new();
    for s in 0..n {
        let p = payload(w, s, size(s));
        let lsn = j.append(&p).unwrap();
        if s % 3 == 0 {
            j.commit(lsn).unwrap();
        }
        out.push((lsn, p));
    }
    j.force_all().unwrap();
    out
}

#[test]
fn read_at_returns_every_entry_byte_exact_across_segments_and_reopens() {
    let vfs = SimVfs::new();
    let opts = small_options();
    let j = open_sim(&vfs, opts).unwrap();
    let written = append_some(&j, 1, 120);
    assert!(j.segments().len() > 3, "the log spans several segments");
    let chained = written
        .iter()
        .filter(|(_, p)| p.len() > opts.max_unchained_record())
        .count();
    assert!(chained > 10);
    for (lsn, p) in &written {
        let got = j.read_at(*lsn).unwrap();
        assert_eq!(&*got, &p[..], "entry at {lsn}");
    }
    // After a checkpoint half-way and a reopen (the index is rebuilt by
    // recovery), every entry at or after the tail still reads back.
    let mid = written[60].0;
    j.checkpoint(mid).unwrap();
    j.close().unwrap();
    drop(j);
    let j = open_sim(&vfs, opts).unwrap();
    for (lsn, p) in &written[60..] {
        assert_eq!(&*j.read_at(*lsn).unwrap(), &p[..], "entry at {lsn}");
    }
    match j.read_at(written[0].0) {
        Err(Error::LsnNotInLog { lsn, tail }) => {
            assert_eq!((lsn, tail), (written[0].0, mid));
        }
        other => panic!("below the tail: {other:?}"),
    }
}

#[test]
fn read_from_and_read_range_start_at_the_entry() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, small_options()).unwrap();
    let written = append_some(&j, 2, 60);
    let entries = |it: journal_core::ReadIter| -> Vec<(Lsn, Vec<u8>)> {
        it.map(|r| r.map(|(l, b)| (l, b.to_vec())))
            .collect::<Result<_, _>>()
            .unwrap()
    };
    for i in [0, 1, 17, 30, 59] {
        assert_eq!(entries(j.read_from(written[i].0).unwrap()), written[i..]);
        // An LSN between entries starts at the next one.
        let inside = Lsn(written[i].0 .0 + 1);
        assert_eq!(entries(j.read_from(inside).unwrap()), written[i + 1..]);
    }
    for (a, b) in [(0, 5), (10, 11), (20, 45), (45, 59)] {
        let got = entries(j.read_range(written[a].0, written[b].0).unwrap());
        assert_eq!(got, written[a..b], "range {a}..{b}");
    }
    assert!(entries(j.read_range(written[7].0, written[7].0).unwrap()).is_empty());
}

#[test]
fn read_at_gives_typed_errors_for_lsns_that_are_no_entry_or_not_durable() {
    let vfs = SimVfs::new();
    let opts = small_options();
    let j = open_sim(&vfs, opts).unwrap();
    let a = j.append_durable(b"first entry").unwrap();
    let big = payload(3, 0, 50_000);
    let chain = j.append(&big).unwrap();
    j.commit(chain).unwrap();
    // Inside an entry's bytes, inside a record header, at a chain's later
    // part: no append returned these.
    for lsn in [Lsn(a.0 + 5), Lsn(0), Lsn(chain.0 + 20_000)] {
        match j.read_at(lsn) {
            Err(Error::NotAnEntry { lsn: l }) => assert_eq!(l, lsn),
            other => panic!("{lsn}: {other:?}"),
        }
    }
    // Appended, not durable.
    let pending = j.append(b"not yet durable").unwrap();
    match j.read_at(pending) {
        Err(Error::LsnNotDurable { lsn, durable }) => {
            assert_eq!(lsn, pending);
            assert!(durable <= pending);
        }
        other => panic!("{other:?}"),
    }
    // A chain whose last part is not durable: its first parts may be.
    let chain2 = j.append(&payload(3, 1, 60_000)).unwrap();
    j.force(chain2, journal_core::ForceMode::Durable).unwrap();
    assert!(matches!(
        j.read_at(j.appended_lsn()),
        Err(Error::LsnNotDurable { .. })
    ));
    assert_eq!(&*j.read_at(chain).unwrap(), &big[..]);
    assert_eq!(&*j.read_at(a).unwrap(), b"first entry");
}

/// The read starts at the entry's record: damage far below it, between the
/// checkpoint and the entry, is never parsed (a scan from the checkpoint
/// would stop there).
#[test]
fn read_at_does_not_scan_from_the_checkpoint() {
    let vfs = SimVfs::new();
    let opts = Options {
        direct_io: false,
        ..small_options()
    };
    let j = open_sim(&vfs, opts).unwrap();
    let written = append_some(&j, 4, 90);
    let (first, newest) = (written[1].0, written[89].0);
    assert!(newest.0 - first.0 > 4 * journal_core::INDEX_STRIDE);
    // Damage the record holding the second entry, on disk.
    let g = j.geometry();
    let (seg, off) = g.locate(first);
    let path = sim_dir().join(journal_core::format::segment_name(seg));
    let f = vfs.open(&path, OpenOptions::write()).unwrap();
    f.write_at(&[0xA5; 64], off + 8).unwrap();
    f.sync_data().unwrap();
    drop(f);
    assert_eq!(&*j.read_at(newest).unwrap(), &written[89].1[..]);
    assert!(j.read_from(written[80].0).unwrap().all(|r| r.is_ok()));
    let from_tail: Result<Vec<_>, _> = j.read_from(j.redo_lsn()).unwrap().collect();
    assert!(
        matches!(from_tail, Err(Error::Corruption { .. })),
        "a scan from the tail meets the damage"
    );
    assert!(matches!(j.read_at(first), Err(Error::Corruption { .. })));
}

/// A waker that records that it was woken.
#[derive(Default)]
struct Flag(std::sync::atomic::AtomicBool);
impl Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A checkpoint makes the log durable through the ring's force-all: the
/// tasks waiting on the durable LSN are woken by the ring itself.
#[test]
fn a_checkpoint_that_forces_the_log_wakes_durable_waiters() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, small_options()).unwrap();
    let lsn = j.append(b"made durable by a checkpoint").unwrap();
    let flag = std::sync::Arc::new(Flag::default());
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let watch = j.durable_lsn_watch();
    let mut fut = pin!(watch.wait_for(lsn));
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    j.checkpoint(lsn).unwrap();
    assert!(j.durable_lsn() > lsn);
    assert!(
        flag.0.load(std::sync::atomic::Ordering::SeqCst),
        "the waiter was woken"
    );
    assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
}

/// What the writers acknowledged.
type Acked = Arc<Mutex<Vec<(Lsn, Vec<u8>)>>>;

fn follow_options() -> Options {
    Options {
        max_segments: 6,
        follow_lag_limit: 128 << 10,
        ..small_options()
    }
}

/// Two writers, a checkpointer and two followers: each follower gets every
/// entry exactly once, in order, across segment switches and checkpoints.
/// The writers run in phases: within a phase the checkpointer chases them
/// (checkpoints racing appends and reads, as the scheduler has it); at a
/// phase's end it appends a marker and, once both followers have every
/// entry so far, checkpoints at the marker — ahead of every checkpoint
/// before it, so it recycles the segments the phase filled whatever the
/// scheduling was, while the followers still follow: recycling under
/// followers is covered on every machine.
#[test]
fn followers_get_every_entry_once_in_order_across_checkpoints() {
    use journal_core::sync::{Condvar, Deadline};
    let vfs = SimVfs::new();
    // A limit well past what the followers lag here: none is cut loose.
    let opts = Options {
        follow_lag_limit: 64 << 20,
        ..follow_options()
    };
    let j = Arc::new(open_sim(&vfs, opts).unwrap());
    let start = j.appended_lsn();
    const PHASES: u32 = 5;
    const PER_PHASE: u32 = 30;
    const PER_WRITER: u32 = PHASES * PER_PHASE;
    // Both writers' entries and one marker per phase.
    const ENTRIES: usize = (2 * PER_WRITER + PHASES) as usize;
    let acked: Acked = Arc::new(Mutex::new(Vec::new()));
    // Entries each follower has got so far (`None` until it follows: the
    // checkpointer must not move the tail past `start` before), and a
    // signal when one moves.
    let delivered = Arc::new((Mutex::new([None::<usize>; 2]), Condvar::new()));
    let followers: Vec<_> = (0..2)
        .map(|i| {
            let (j, delivered) = (j.clone(), delivered.clone());
            thread::spawn(move || {
                let mut f = j
                    .follow(start)
                    .unwrap()
                    .with_timeout(Duration::from_secs(20));
                delivered.0.lock()[i] = Some(0);
                delivered.1.notify_all();
                let mut got = Vec::new();
                while got.len() < ENTRIES {
                    match f.next() {
                        Some(Ok((lsn, bytes))) => got.push((lsn, bytes.to_vec())),
                        Some(Err(e)) => panic!("follower: {e}"),
                        None => panic!("follower timed out after {} entries", got.len()),
                    }
                    delivered.0.lock()[i] = Some(got.len());
                    delivered.1.notify_all();
                }
                got
            })
        })
        .collect();
    // Wait until both followers have every entry so far (`written`).
    let wait_followers = |written: usize, what: &str| {
        let deadline = Deadline::after(Duration::from_secs(30));
        let mut got = delivered.0.lock();
        while got.iter().any(|n| n.is_none_or(|n| n < written)) {
            let (g, expired) = delivered.1.wait_deadline(got, &deadline);
            got = g;
            assert!(!expired, "{what}: followers got {:?} of {written}", *got);
        }
    };
    wait_followers(0, "start");
    let checkpoint_at_last = |j: &Journal| {
        let redo = acked.lock().iter().map(|(l, _)| *l).max();
        if let Some(redo) = redo {
            if redo > j.redo_lsn() {
                j.checkpoint(redo).unwrap();
            }
        }
    };
    let mut recycled_under_followers = 0;
    for phase in 0..PHASES {
        let writers: Vec<_> = (0..2u8)
            .map(|w| {
                let (j, acked) = (j.clone(), acked.clone());
                thread::spawn(move || {
                    for s in phase * PER_PHASE..(phase + 1) * PER_PHASE {
                        let p = payload(w, s, size(s) / 4);
                        let lsn = j.append_durable(&p).unwrap();
                        acked.lock().push((lsn, p));
                    }
                })
            })
            .collect();
        // The checkpointer keeps the tail close behind the writers, so
        // segments may recycle while the followers read.
        while writers.iter().any(|w| !w.is_finished()) {
            checkpoint_at_last(&j);
            thread::yield_now();
        }
        for w in writers {
            w.join().unwrap();
        }
        // The marker; both followers get the phase (they are still
        // following), then the tail moves to the marker.
        let marker = payload(2, phase, 100);
        let marker_lsn = j.append_durable(&marker).unwrap();
        acked.lock().push((marker_lsn, marker));
        let written = acked.lock().len();
        wait_followers(written, &format!("phase {phase}"));
        let before = j.metrics().segments_recycled;
        j.checkpoint(marker_lsn).unwrap();
        recycled_under_followers += j.metrics().segments_recycled - before;
    }
    let mut all = acked.lock().clone();
    all.sort_by_key(|(l, _)| *l);
    for f in followers {
        assert_eq!(f.join().unwrap(), all, "a follower's entries");
    }
    assert!(
        recycled_under_followers > 0,
        "segments recycled while the followers followed"
    );
}

/// A follower that reads nothing holds its segments only up to its lag
/// limit: then a checkpoint cuts it loose, the log recycles, and the
/// follower's next read says why.
#[test]
fn a_stalled_follower_past_its_lag_limit_is_cut_loose() {
    let vfs = SimVfs::new();
    let opts = follow_options();
    let j = open_sim(&vfs, opts).unwrap();
    let first = j.append_durable(&payload(5, 0, 500)).unwrap();
    let mut stalled = j.follow(first).unwrap();
    let mut recycled_early = 0;
    for s in 1..400u32 {
        let lsn = j.append_durable(&payload(5, s, 2_000)).unwrap();
        j.checkpoint(lsn).unwrap();
        if j.durable_lsn().0 - first.0 < opts.follow_lag_limit {
            recycled_early = j.metrics().segments_recycled + j.metrics().segments_removed;
        }
    }
    assert_eq!(
        recycled_early, 0,
        "nothing it pinned recycled within its limit"
    );
    assert!(
        j.metrics().segments_recycled > 0,
        "the log recycled past the limit"
    );
    assert!(j.segments().len() <= 6);
    match stalled.next_timeout(Duration::from_secs(5)) {
        Err(Error::FollowerLagged { at, limit }) => {
            assert_eq!(limit, opts.follow_lag_limit);
            assert!(at <= first);
        }
        other => panic!("{other:?}"),
    }
    // And it stays ended.
    assert!(matches!(
        stalled.next(),
        Some(Err(Error::FollowerLagged { .. }))
    ));
}

#[test]
fn closing_the_journal_ends_a_blocked_follower() {
    let vfs = SimVfs::new();
    let j = Arc::new(open_sim(&vfs, small_options()).unwrap());
    let lsn = j.append_durable(b"one").unwrap();
    let j2 = j.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        let mut f = j2.follow(lsn).unwrap();
        let first = f.next().unwrap().unwrap();
        tx.send(()).unwrap();
        (first.0, f.next())
    });
    rx.recv().unwrap();
    j.close().unwrap();
    let (first, after) = t.join().unwrap();
    assert_eq!(first, lsn);
    assert!(matches!(after, Some(Err(Error::Closed))), "{after:?}");
}

#[test]
fn a_follower_times_out_at_the_durable_end_and_goes_on() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, small_options()).unwrap();
    let mut f = j.follow(j.appended_lsn()).unwrap();
    assert!(f.next_timeout(Duration::from_millis(20)).unwrap().is_none());
    let lsn = j.append_durable(b"later").unwrap();
    let (l, b) = f.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!((l, &*b), (lsn, &b"later"[..]));
    assert_eq!(f.lag(), 0);
}

#[test]
fn an_async_follower_is_woken_by_commits() {
    let dir = tempfile::tempdir().unwrap();
    let j = Arc::new(Journal::open(dir.path().join("wal"), small_options()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let j2 = j.clone();
    let from = j.appended_lsn();
    let follower = rt.spawn(async move {
        let mut f = j2.follow(from).unwrap();
        let mut got = Vec::new();
        for _ in 0..50 {
            let (lsn, bytes) = f.next_async().await.unwrap();
            got.push((lsn, bytes.to_vec()));
        }
        got
    });
    let mut want = Vec::new();
    for s in 0..50 {
        let p = payload(6, s, 300);
        want.push((j.append_durable(&p).unwrap(), p));
    }
    let got = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), follower).await })
        .expect("the follower finished")
        .unwrap();
    assert_eq!(got, want);
}

#[test]
fn poisoning_the_journal_ends_a_blocked_follower_with_the_error() {
    use journal_core::vfs::{Fault, Op};
    let vfs = SimVfs::new();
    let opts = Options {
        direct_io: false,
        ..small_options()
    };
    let j = Arc::new(open_sim(&vfs, opts).unwrap());
    let from = j.appended_lsn();
    let j2 = j.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        // A timeout, so a lost wake-up fails the test instead of hanging it.
        let mut f = j2
            .follow(from)
            .unwrap()
            .with_timeout(Duration::from_secs(10));
        tx.send(()).unwrap();
        f.next()
    });
    rx.recv().unwrap();
    // The next log write's sync fails: the journal is poisoned.
    vfs.inject(Fault::eio(Op::SyncData, 1));
    vfs.inject(Fault::eio(Op::FuaWrite, 1));
    assert!(j.append_durable(b"never acknowledged").is_err());
    match t.join().unwrap() {
        Some(Err(Error::Poisoned(_))) => {}
        other => panic!("{other:?}"),
    }
}
