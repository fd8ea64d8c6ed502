//! The state machine on a `SimVfs`: whatever instant the disk loses its
//! unsynced writes at, the reopened store holds exactly the log applied up
//! to the applied id it reports (so openraft's replay after it is exact);
//! a snapshot install is all or nothing.

mod common;
use common::batch_entry;

use journal_core::vfs::{CrashPolicy, OpenOptions, SimVfs, Vfs};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use raftkv::machine::Snapshot;
type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;
use common::vs;
use common::V::{Applied, Duplicate, Stale, UnknownSession};
use raftkv::kv::{DeleteRangeRequest, PutRequest, RequestOp};
use raftkv::machine::SnapshotFile;
use raftkv::{Command, RequestId, StateMachine};
use std::collections::BTreeMap;
use std::io::SeekFrom;
use std::sync::Arc;
use tokio::io::AsyncSeekExt;

const KEYS: u64 = 16;

fn entry(index: u64) -> Entry {
    let key = format!("k{}", index * 7 % KEYS).into_bytes();
    // Three clients, each with sequence numbers 1, 2, 3, ...
    let id = Some(RequestId {
        client: index % 3,
        seq: index.div_ceil(3),
    });
    let cmd = if index.is_multiple_of(11) {
        Command::delete(key, id)
    } else {
        Command::put(key, format!("v{index}"), id)
    };
    batch_entry(index, vec![cmd])
}

/// The store's content after applying entries `1..=applied`.
fn expected(applied: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for i in 1..=applied {
        let EntryPayload::Normal(batch) = entry(i).payload else {
            continue;
        };
        for cmd in batch.0 {
            match cmd {
                Command::Kv {
                    op: RequestOp::Put(PutRequest { key, value, .. }),
                    ..
                } => {
                    m.insert(key, value);
                }
                Command::Kv {
                    op: RequestOp::DeleteRange(DeleteRangeRequest { key, .. }),
                    ..
                } => {
                    m.remove(&key);
                }
                _ => {}
            }
        }
    }
    m
}

/// Copies a built snapshot's file into a file `dst` begins receiving, as
/// openraft's chunks do.
async fn transfer(snap: &mut Snapshot, dst: &mut StateMachine) -> SnapshotFile {
    let mut rx = dst.receive().unwrap();
    snap.snapshot.seek(SeekFrom::Start(0)).await.unwrap();
    tokio::io::copy(&mut snap.snapshot, &mut rx).await.unwrap();
    rx
}

fn content(sm: &StateMachine) -> BTreeMap<Vec<u8>, Vec<u8>> {
    (0..KEYS)
        .filter_map(|k| {
            let key = format!("k{k}").into_bytes();
            sm.get(&key).unwrap().map(|v| (key, v))
        })
        .collect()
}

fn open(vfs: Arc<dyn Vfs>) -> StateMachine {
    // Small segments: a SimVfs holds every preallocated byte in memory.
    let options = kvstore::Options {
        checkpoint_interval: None,
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 256 << 10,
            preallocate_ahead: 1,
            ..kvstore::Options::default().journal
        },
        ..kvstore::Options::default()
    };
    StateMachine::open(vfs, "/node/state", options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_leaves_the_log_applied_up_to_the_applied_id() {
    let sim = SimVfs::new();
    let sm = open(Arc::new(sim.clone()));
    let mut next = 1;
    let mut crashes = 0;
    let mut seen_lost = false;
    // Batches of 1 to 40 entries; a power cut after every third batch.
    for round in 0..60u64 {
        let n = 1 + (round * 13) % 40;
        let batch: Vec<_> = (next..next + n).map(entry).collect();
        let replies = sm.apply_all(batch).await.unwrap();
        assert_eq!(replies.len() as u64, n);
        next += n;
        if round % 3 == 2 {
            crashes += 1;
            let image = sim.crash(CrashPolicy::DropUnsynced);
            let sm2 = open(Arc::new(image));
            let applied = sm2.applied().map_or(0, |l| l.index);
            assert!(applied < next, "applied {applied} beyond the log");
            seen_lost |= applied + 1 < next;
            assert_eq!(
                content(&sm2),
                expected(applied),
                "after a crash at {applied}"
            );
            sm2.close().unwrap();
        }
    }
    assert_eq!(content(&sm), expected(next - 1));
    // Applying does not wait for a sync: some crashes lost applied entries
    // (replayed from the Raft log after a restart).
    assert!(crashes == 20 && seen_lost);
    sm.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_is_applied_once() {
    let sim = SimVfs::new();
    let sm = open(Arc::new(sim.clone()));
    let put = |seq: u64, v: &str| Command::put("k", v, Some(RequestId { client: 9, seq }));
    let entry = batch_entry;
    // A retry in the same batch and in a later entry.
    let r = sm
        .apply_all(vec![
            entry(1, vec![put(1, "a"), put(2, "b"), put(1, "a")]),
            entry(2, vec![put(2, "b")]),
        ])
        .await
        .unwrap();
    assert_eq!(vs(&r[0]), [Applied, Applied, Stale]);
    // A retry is answered with the first answer: put(2) at revision 3.
    let first = Duplicate {
        revision: 3,
        succeeded: true,
    };
    assert_eq!(vs(&r[1]), [first]);
    // The late copy of seq 1 did not bring "a" back.
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"b"[..]));
    // The table survives a reopen: seq 2 again is a retry, 3 is new.
    sm.close().unwrap();
    drop(sm);
    let sm = open(Arc::new(sim));
    let r = sm
        .apply_all(vec![entry(3, vec![put(2, "c"), put(3, "d")])])
        .await
        .unwrap();
    assert_eq!(vs(&r[0]), [first, Applied]);
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"d"[..]));
}

/// Sessions expire by the clock the leader puts in the log: with 100 new
/// clients a second for ten minutes of log time and a 60 s time-to-live,
/// the table never holds more than 100 × 60 plus the current second's,
/// and it does fill to that; an expired client's next request, or a new
/// one that does not start at 1, is refused, never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expire_by_the_log_clock_and_stay_bounded() {
    const RATE: u64 = 100;
    const TTL_S: u64 = 60;
    let sim = SimVfs::new();
    let sm = open(Arc::new(sim.clone()));
    let clock = |s: u64| Command::Clock {
        now_ms: 1_700_000_000_000 + s * 1000,
        session_ttl_ms: TTL_S * 1000,
    };
    let put = |client: u64, seq: u64| {
        Command::put(
            format!("k{}", client % 64),
            "v",
            Some(RequestId { client, seq }),
        )
    };
    let entry = batch_entry;
    let mut most = 0;
    for s in 0..600u64 {
        let cmds = std::iter::once(clock(s))
            .chain((0..RATE).map(|i| put(s * RATE + i, 1)))
            .collect();
        let r = sm.apply_all([entry(s + 1, cmds)]).await.unwrap();
        assert!(vs(&r[0]).iter().all(|v| *v == Applied), "second {s}");
        most = most.max(sm.sessions());
    }
    let bound = (RATE * (TTL_S + 1)) as usize;
    assert!(most <= bound, "{most} sessions, bound {bound}");
    assert!(
        most >= (RATE * TTL_S) as usize,
        "the table never filled: {most}"
    );
    // Client 0 (second 0) expired long ago; client 59,950 (second 599) is
    // live; client 10,000,000 is new.
    let r = sm
        .apply_all([entry(
            601,
            vec![
                clock(600),
                put(0, 2),
                put(59_950, 2),
                put(10_000_000, 7),
                put(10_000_001, 1),
            ],
        )])
        .await
        .unwrap();
    assert_eq!(
        vs(&r[0]),
        [Applied, UnknownSession, Applied, UnknownSession, Applied]
    );
    // The table survives a reopen.
    let n = sm.sessions();
    sm.close().unwrap();
    drop(sm);
    let sm = open(Arc::new(sim));
    assert_eq!(sm.sessions(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_install_is_all_or_nothing() {
    // The source: 200 entries applied, a snapshot built.
    let src_sim = SimVfs::new();
    let mut src = open(Arc::new(src_sim));
    src.apply_all((1..=200).map(entry).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut snap = src.build_snapshot().await.unwrap();
    assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(200));
    // The target has applied 50; a crash at every mutating call of the
    // install leaves either the old state or the snapshot's.
    let mut outcomes = [0, 0];
    for at in 1..400 {
        let sim = SimVfs::new();
        let dst = open(Arc::new(sim.clone()));
        dst.apply_all((1..=50).map(entry).collect::<Vec<_>>())
            .await
            .unwrap();
        dst.close().unwrap();
        drop(dst);
        let mut dst = open(Arc::new(sim.clone()));
        let rx = transfer(&mut snap, &mut dst).await;
        sim.arm_crash(at, CrashPolicy::DropUnsynced);
        dst.install_snapshot(&snap.meta, rx).await.unwrap();
        let Some(image) = sim.take_crash() else {
            // The install finished before the crash point: done.
            assert_eq!(content(&dst), expected(200));
            assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
            return;
        };
        let after = open(Arc::new(image));
        match after.applied().map_or(0, |l| l.index) {
            50 => outcomes[0] += 1,
            200 => outcomes[1] += 1,
            other => panic!("crash at call {at}: applied {other}"),
        }
        let applied = after.applied().map_or(0, |l| l.index);
        assert_eq!(content(&after), expected(applied), "crash at call {at}");
    }
    panic!("the install never finished within 400 calls");
}

/// A crash at any point of an install on a node that already holds a
/// snapshot leaves a current snapshot that covers the store's applied id.
/// At start openraft installs the current snapshot if it is newer than the
/// store, then purges the log up to the applied id if the log ends below
/// it, and refuses to start unless `purge_upto <= snapshot_last_log_id`
/// (raft_state/mod.rs). The install used to name the new store before the
/// received file was renamed into place: a crash between left the log
/// purged to 200 at start and the current snapshot still the old one at 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_an_install_leaves_a_snapshot_covering_the_applied_id() {
    let mut src = open(Arc::new(SimVfs::new()));
    src.apply_all((1..=200).map(entry).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut snap = src.build_snapshot().await.unwrap();
    for at in 1..400 {
        // The target: its log ends at 50, its own snapshot is at 50.
        let sim = SimVfs::new();
        let mut dst = open(Arc::new(sim.clone()));
        dst.apply_all((1..=50).map(entry).collect::<Vec<_>>())
            .await
            .unwrap();
        dst.build_snapshot().await.unwrap();
        let rx = transfer(&mut snap, &mut dst).await;
        sim.arm_crash(at, CrashPolicy::DropUnsynced);
        dst.install_snapshot(&snap.meta, rx).await.unwrap();
        let Some(image) = sim.take_crash() else {
            // Every call before `at` crashed an install: done.
            assert!(at > 1, "no crash point in the install");
            return;
        };
        // A restart as openraft's get_initial_state does it.
        let mut after = open(Arc::new(image.clone()));
        let current = after.get_current_snapshot().await.unwrap();
        let current = current.expect("a current snapshot after the crash");
        let snapshot_at = current.meta.last_log_id.map_or(0, |l| l.index);
        if current.meta.last_log_id > after.applied() {
            let meta = current.meta.clone();
            after
                .install_snapshot(&meta, current.snapshot)
                .await
                .unwrap();
        }
        let applied = after.applied().map_or(0, |l| l.index);
        let purge_upto = if 50 < applied { applied } else { 0 };
        assert!(
            purge_upto <= snapshot_at,
            "crash at call {at}: the log purged to {purge_upto} at start, \
             the current snapshot at {snapshot_at}"
        );
        assert_eq!(content(&after), expected(applied), "crash at call {at}");
        // And the restart's own install left a state that reopens the same.
        after.close().unwrap();
        drop(after);
        let mut again = open(Arc::new(image));
        let current = again.get_current_snapshot().await.unwrap();
        let snapshot_at = current.map_or(0, |s| s.meta.last_log_id.map_or(0, |l| l.index));
        assert_eq!(again.applied().map(|l| l.index), Some(applied));
        assert!(applied <= snapshot_at, "crash at call {at}, reopened");
    }
    panic!("the install never finished within 400 calls");
}

/// The Raft log's purge waits for the store: a purge up to entries the
/// store holds only after a snapshot install waits for the install; one
/// up to entries applied but not yet synced syncs them; one up to
/// entries held durably passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waits_until_the_store_holds_the_entries_durably() {
    let mut src = open(Arc::new(SimVfs::new()));
    src.apply_all((1..=200).map(entry).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut snap = src.build_snapshot().await.unwrap();

    let sim = SimVfs::new();
    let mut dst = open(Arc::new(sim.clone()));
    dst.apply_all((1..=50).map(entry).collect::<Vec<_>>())
        .await
        .unwrap();
    let gate = dst.purge_gate();
    // Applied, not yet synced: the gate syncs it, so a power cut now
    // keeps all 50.
    tokio::time::timeout(std::time::Duration::from_secs(10), gate(50))
        .await
        .expect("the gate synced what was applied instead of waiting")
        .unwrap();
    let image = sim.crash(CrashPolicy::DropUnsynced);
    assert_eq!(open(Arc::new(image)).applied().map(|l| l.index), Some(50));

    // Beyond what is applied: it waits for the install.
    // (Pending for good without the install: the timeout cannot fire
    // early on a slow machine, only late.)
    let mut waiting = tokio::spawn(gate(200));
    let early = tokio::time::timeout(std::time::Duration::from_millis(200), &mut waiting).await;
    assert!(early.is_err(), "the purge went ahead of the install");
    let rx = transfer(&mut snap, &mut dst).await;
    dst.install_snapshot(&snap.meta, rx).await.unwrap();
    waiting.await.unwrap().unwrap();
    gate(200).await.unwrap();
}

/// A built snapshot is a file that survives a restart: the reopened
/// machine offers it as its current snapshot, and it installs elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_file_survives_a_restart() {
    let sim = SimVfs::new();
    let mut src = open(Arc::new(sim.clone()));
    src.apply_all((1..=200).map(entry).collect::<Vec<_>>())
        .await
        .unwrap();
    let built = src.build_snapshot().await.unwrap();
    src.apply_all((201..=220).map(entry).collect::<Vec<_>>())
        .await
        .unwrap();
    // A power cut: the snapshot file was synced and renamed into place.
    let image = sim.crash(CrashPolicy::DropUnsynced);
    drop(src);
    let mut src = open(Arc::new(image));
    let mut snap = src
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("the snapshot file came back");
    assert_eq!(snap.meta, built.meta);
    let mut dst = open(Arc::new(SimVfs::new()));
    let rx = transfer(&mut snap, &mut dst).await;
    dst.install_snapshot(&snap.meta, rx).await.unwrap();
    assert_eq!(content(&dst), expected(200));
    assert_eq!(dst.applied().map(|l| l.index), Some(200));
}

/// A received snapshot file with a flipped byte anywhere is refused, and
/// the node keeps its state; the half-filled store is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_file_is_refused_and_changes_nothing() {
    let mut src = open(Arc::new(SimVfs::new()));
    src.apply_all((1..=200).map(entry).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut snap = src.build_snapshot().await.unwrap();
    let len = snap.snapshot.seek(SeekFrom::End(0)).await.unwrap();
    for at in [0, 5, 13, 40, len / 2, len - 9, len - 1] {
        let sim = SimVfs::new();
        let mut dst = open(Arc::new(sim.clone()));
        dst.apply_all((1..=50).map(entry).collect::<Vec<_>>())
            .await
            .unwrap();
        let rx = transfer(&mut snap, &mut dst).await;
        let f = sim.open(rx.path(), OpenOptions::write()).unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_at(&[b[0] ^ 0x10], at).unwrap();
        drop(f);
        let r = dst.install_snapshot(&snap.meta, rx).await;
        assert!(r.is_err(), "a flip at byte {at} of {len} was installed");
        assert_eq!(dst.applied().map(|l| l.index), Some(50), "byte {at}");
        assert_eq!(content(&dst), expected(50), "byte {at}");
        let dirs = sim.read_dir(std::path::Path::new("/node/state")).unwrap();
        assert!(!dirs.contains(&"sm-1".to_string()), "byte {at}: {dirs:?}");
    }
}

/// An entry putting `len` bytes under `key`.
fn put_entry(index: u64, key: String, len: usize) -> Entry {
    batch_entry(index, vec![Command::put(key, vec![index as u8; len], None)])
}

/// The byte policy: a snapshot is asked for once the value bytes applied
/// since the last one reach the store's size (and the floor), so a store
/// eight times larger needs several times the writes between snapshots;
/// building one starts the count again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_due_by_bytes_written_against_the_store_size() {
    const V: usize = 4096;
    let mut sm = open(Arc::new(SimVfs::new()));
    sm.snapshot_by_bytes(256 << 10);
    let mut index = 0;
    // Overwrites of one key until the policy asks: the bytes it took. Each
    // compacted at once: the store's size is the hot key's, not its old
    // versions'.
    async fn until_asked(sm: &mut StateMachine, index: &mut u64) -> usize {
        let mut bytes = 0;
        while !sm.snapshot_asked() {
            *index += 1;
            sm.apply_all([put_entry(*index, "hot".into(), V)])
                .await
                .unwrap();
            *index += 1;
            let revision = sm.revisions().current;
            let compact = Command::Compact {
                revision,
                physical: false,
            };
            sm.apply_all([batch_entry(*index, vec![compact])])
                .await
                .unwrap();
            bytes += V;
            assert!(bytes <= 256 << 20, "never asked");
        }
        bytes
    }
    let small = until_asked(&mut sm, &mut index).await;
    assert!(small >= 256 << 10, "asked below the floor: {small}");
    sm.build_snapshot().await.unwrap();
    assert!(
        !sm.snapshot_asked(),
        "a built snapshot starts the count again"
    );
    // Grow the store to 2,000 distinct values (8 MiB of them); a snapshot
    // after it.
    let load: Vec<_> = (0..2000)
        .map(|i| put_entry(index + 1 + i, format!("key-{i:05}"), V))
        .collect();
    index += 2000;
    sm.apply_all(load).await.unwrap();
    sm.build_snapshot().await.unwrap();
    let large = until_asked(&mut sm, &mut index).await;
    assert!(large >= 2000 * V, "{large} bytes against an 8 MiB store");
    assert!(
        large >= 4 * small,
        "small store {small}, large store {large}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_timed_and_sized_in_the_metrics() {
    let mut sm = open(Arc::new(SimVfs::new()));
    let m = Arc::new(raftkv::metrics::Metrics::new().unwrap());
    sm.set_metrics(m.clone());
    sm.build_snapshot().await.unwrap();
    let text = m.encode().unwrap();
    let sample = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
    };
    assert_eq!(
        sample(r#"raftkv_snapshot_duration_seconds_count{op="build"}"#),
        Some(1.0),
        "{text}"
    );
    let bytes = sample(r#"raftkv_snapshot_bytes{op="build"}"#).unwrap();
    assert!(bytes > 16.0, "{bytes}");
}

/// A range delete sees the writes before it in its own entry (not yet
/// committed: through the step's writer), and not the ones after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_delete_sees_the_writes_before_it_in_its_entry() {
    let sim = SimVfs::new();
    let sm = open(Arc::new(sim.clone()));
    let put = |k: &str| Command::put(k, "v", None);
    let del = Command::delete_range("x/", "x0", None);
    let many: Vec<Command> = (0..3000).map(|i| put(&format!("x/{i:05}"))).collect();
    let e1 = batch_entry(1, many);
    let e2 = batch_entry(2, vec![put("x/new"), del, put("x/after"), put("y")]);
    sm.apply_all([e1, e2]).await.unwrap();
    assert_eq!(sm.get(b"x/00000").unwrap(), None);
    assert_eq!(sm.get(b"x/new").unwrap(), None, "the write before it");
    assert_eq!(sm.get(b"x/after").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(sm.get(b"y").unwrap().as_deref(), Some(&b"v"[..]));
    let page = sm.range_page((&[0], &[0]), None, 0, (10, 1 << 20)).unwrap();
    let keys: Vec<_> = page.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, [&b"x/after"[..], b"y"]);
}
