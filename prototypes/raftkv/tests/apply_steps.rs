//! A large range delete is applied in bounded steps: between two, the
//! state lock is free and the runtime thread is given back, so reads,
//! heartbeats and other requests go on while it runs — even on a runtime
//! of one thread (`raftkv-tools cluster` runs each node on one). Readers never
//! see part of it: they read at the revision before it until it is done.

mod common;

use common::{batch_entry, free_port};
use journal_core::vfs::SimVfs;
use openraft::async_runtime::WatchReceiver;
use raftkv::machine::STEP_KEYS;
use raftkv::propose::Outcome;
use raftkv::{Command, Node, NodeOptions, StateMachine};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const KEYS: u64 = 20_000;

fn key(i: u64) -> Vec<u8> {
    format!("big/{i:06}").into_bytes()
}

fn put(i: u64) -> Command {
    Command::put(key(i), vec![b'v'; 64], None)
}

fn range() -> Command {
    Command::delete_range(b"big/".to_vec(), b"big0".to_vec(), None)
}

/// Whether `sm` shows a command under way: apply steps taken since
/// `steps`, entry `index` not applied yet. A reader then still sees the
/// whole range (the revision before the delete).
fn under_way(sm: &StateMachine, steps: u64, index: u64) -> bool {
    let going = sm.apply_stats().steps > steps + 1 && sm.applied().map_or(0, |l| l.index) < index;
    if going {
        assert!(
            sm.get(&key(0)).unwrap().is_some() && sm.get(&key(KEYS - 1)).unwrap().is_some(),
            "a reader saw part of the delete"
        );
    }
    going
}

/// On a runtime of one thread, a task spawned beside the apply runs while
/// the range delete is under way, and sees it so: part of the range gone,
/// the entry not yet applied.
#[tokio::test(flavor = "current_thread")]
async fn a_range_delete_gives_the_thread_back_between_steps() {
    let sm = StateMachine::open(
        Arc::new(SimVfs::new()),
        "/n/state",
        kvstore::Options {
            checkpoint_interval: None,
            ..kvstore::Options::default()
        },
    )
    .unwrap();
    let fill: Vec<_> = (0..KEYS / 1000)
        .map(|e| batch_entry(e + 1, (e * 1000..(e + 1) * 1000).map(put).collect()))
        .collect();
    sm.apply_all(fill).await.unwrap();
    let index = KEYS / 1000 + 1;
    let watcher = sm.clone();
    let steps = sm.apply_stats().steps;
    let seen = tokio::spawn(async move {
        let mut seen = 0;
        loop {
            tokio::task::yield_now().await;
            let applied = watcher.applied().map_or(0, |l| l.index);
            if applied >= index {
                return seen;
            }
            if under_way(&watcher, steps, index) {
                seen += 1;
            }
        }
    });
    let out = sm
        .apply_all([batch_entry(index, vec![range(), put(KEYS + 1)])])
        .await
        .unwrap();
    let applied = |v: &raftkv::Verdict| matches!(v, raftkv::Verdict::Applied { .. });
    assert!(out[0].verdicts.iter().all(applied), "{:?}", out[0].verdicts);
    let seen = seen.await.unwrap();
    assert!(seen > 0, "nothing else ran while the range was deleted");
    assert!(sm.get(&key(KEYS - 1)).unwrap().is_none());
    assert!(sm.get(&key(KEYS + 1)).unwrap().is_some());
}

/// Three nodes on one runtime thread: while the leader (and every
/// follower) deletes a range of 20,000 keys, the leader confirms its
/// leadership with a majority — a heartbeat round — and answers it
/// before the delete is done.
#[tokio::test(flavor = "current_thread")]
async fn heartbeats_go_on_while_a_range_is_deleted() {
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
    let mut nodes = Vec::new();
    let mut stops = Vec::new();
    for id in 1..=3 {
        let mut o = NodeOptions::new(id, "/node", peers[&id].clone());
        o.peers = peers.clone();
        o.init = id == 1;
        o.vfs = Arc::new(SimVfs::new());
        let listener = tokio::net::TcpListener::bind(&peers[&id]).await.unwrap();
        let node = Arc::new(Node::start(o).await.unwrap());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(raftkv::serve(node.clone(), listener, async {
            let _ = rx.await;
        }));
        stops.push((stop, served));
        nodes.push(node);
    }
    // The leader, once the others follow it.
    let leader = loop {
        let m = nodes[0].raft.metrics().borrow_watched().clone();
        if let Some(l) = m.current_leader {
            let all = nodes
                .iter()
                .all(|n| n.raft.metrics().borrow_watched().current_leader == Some(l));
            if all {
                break nodes[(l - 1) as usize].clone();
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let writes = chunk.iter().map(|&i| leader.proposer.propose(put(i)));
        for o in futures_util::future::join_all(writes).await {
            assert!(matches!(o, Outcome::Applied { .. }), "{o:?}");
        }
    }
    let done = Arc::new(AtomicBool::new(false));
    let steps = leader.machine.apply_stats().steps;
    let index = leader.machine.applied().map_or(0, |l| l.index) + 1;
    let deleting = {
        let (leader, done) = (leader.clone(), done.clone());
        tokio::spawn(async move {
            let o = leader.proposer.propose(range()).await;
            done.store(true, Ordering::SeqCst);
            o
        })
    };
    // Wait for the delete to be under way on the leader, then confirm
    // leadership: a round of heartbeats to the followers and back.
    while !under_way(&leader.machine, steps, index) {
        assert!(!done.load(Ordering::SeqCst), "the delete ran in one piece");
        tokio::task::yield_now().await;
    }
    let _confirmed = leader
        .raft
        .get_read_linearizer(openraft::ReadPolicy::ReadIndex)
        .await
        .unwrap();
    assert!(
        !done.load(Ordering::SeqCst) && under_way(&leader.machine, steps, index),
        "the heartbeat round was answered only after the delete"
    );
    assert!(matches!(deleting.await.unwrap(), Outcome::Applied { .. }));
    assert!(leader.machine.get(&key(KEYS - 1)).unwrap().is_none());
    for (stop, served) in stops {
        let _ = stop.send(());
        served.await.unwrap().unwrap();
    }
}

/// Small log buffers: the store's log is written (not synced) as the
/// steps commit, so a crash can keep any prefix of them.
fn small_options() -> kvstore::Options {
    kvstore::Options {
        checkpoint_interval: None,
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 16 << 10,
            preallocate_ahead: 1,
            ..kvstore::Options::default().journal
        },
        ..kvstore::Options::default()
    }
}

fn open_on(sim: &SimVfs) -> StateMachine {
    StateMachine::open(Arc::new(sim.clone()), "/n/state", small_options()).unwrap()
}

/// The lease of [`two_entries`].
const LEASE: i64 = 7;

/// Entry 1 fills a range and a lease with 1,500 keys each; entry 2
/// deletes the range and revokes the lease among other writes: several
/// steps, stopping inside both.
fn two_entries() -> Vec<openraft::alias::EntryOf<raftkv::TypeConfig>> {
    let mut fill = vec![Command::LeaseGrant {
        lease: LEASE,
        ttl_s: 60,
        id: None,
    }];
    for i in 0..1500u64 {
        fill.push(put(i));
        fill.push(Command::Kv {
            op: raftkv::kv::RequestOp::Put(raftkv::kv::PutRequest {
                key: format!("l/{i:05}").into_bytes(),
                value: b"l".to_vec(),
                lease: LEASE,
                ..Default::default()
            }),
            id: None,
        });
    }
    let work = vec![
        put(KEYS + 1),
        range(),
        put(KEYS + 2),
        Command::LeaseRevoke {
            lease: LEASE,
            id: None,
        },
        put(KEYS + 3),
    ];
    vec![batch_entry(1, fill), batch_entry(2, work)]
}

/// The whole store as a snapshot file's bytes (its meta too).
async fn store_bytes(sm: &mut StateMachine) -> Vec<u8> {
    use openraft::storage::RaftSnapshotBuilder;
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut snap = sm.build_snapshot().await.unwrap();
    snap.snapshot
        .seek(std::io::SeekFrom::Start(0))
        .await
        .unwrap();
    let mut bytes = Vec::new();
    snap.snapshot.read_to_end(&mut bytes).await.unwrap();
    bytes
}

/// Asserts two stores' bytes are the same; says where they first differ.
fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: the store differs from the run without a crash ({} bytes against {}, first at byte {at:?})",
            got.len(),
            want.len()
        );
    }
}

/// Installs a snapshot of `src` into a new state machine.
async fn copy_by_snapshot(src: &mut StateMachine) -> StateMachine {
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    use tokio::io::AsyncSeekExt;
    let mut snap = src.build_snapshot().await.unwrap();
    let mut dst = open_on(&SimVfs::new());
    let mut rx = dst.receive().unwrap();
    snap.snapshot
        .seek(std::io::SeekFrom::Start(0))
        .await
        .unwrap();
    tokio::io::copy(&mut snap.snapshot, &mut rx).await.unwrap();
    dst.install_snapshot(&snap.meta, rx).await.unwrap();
    dst
}

/// A crash at any point of a stepped entry (the store keeps the steps it
/// wrote, up to a partial mark) replays to the very store and history of
/// a run without a crash; so does a node that installs a snapshot of the
/// crashed store, partial mark included, and applies the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_inside_a_stepped_entry_replays_to_the_same_store() {
    let log = two_entries();
    let mut reference = open_on(&SimVfs::new());
    reference.apply_all(log.clone()).await.unwrap();
    assert!(reference.apply_stats().steps > 3);
    let want = store_bytes(&mut reference).await;
    // Entry 1 applied and closed once; each run starts from a copy.
    let base = SimVfs::new();
    let sm = open_on(&base);
    sm.apply_all(log[..1].to_vec()).await.unwrap();
    let first = sm.revisions().current;
    sm.close().unwrap();
    drop(sm);
    let (mut inside, mut crashes) = (0, 0);
    for at in 1..2000 {
        let sim = base.crash(journal_core::vfs::CrashPolicy::ProcessOnly);
        let sm = open_on(&sim);
        let policy = match at % 3 {
            0 => journal_core::vfs::CrashPolicy::TornSectors { seed: at },
            _ => journal_core::vfs::CrashPolicy::ProcessOnly,
        };
        sim.arm_crash(at, policy);
        sm.apply_all(log[1..].to_vec()).await.unwrap();
        let Some(image) = sim.take_crash() else {
            break;
        };
        drop(sm);
        crashes += 1;
        let mut after = open_on(&image);
        let applied = after.applied().map_or(0, |l| l.index);
        // Part of entry 2 held: its first command (a revision taken)
        // but not the whole entry.
        let part = applied == 1 && after.revisions().current > first;
        if part {
            inside += 1;
            let mut copy = copy_by_snapshot(&mut after).await;
            copy.apply_all(log[1..].to_vec()).await.unwrap();
            same(
                &store_bytes(&mut copy).await,
                &want,
                &format!("a copy, crash at {at}"),
            );
        }
        after
            .apply_all(log[applied as usize..].to_vec())
            .await
            .unwrap();
        same(
            &store_bytes(&mut after).await,
            &want,
            &format!("crash at call {at}"),
        );
    }
    eprintln!("{crashes} crashes, {inside} inside the entry");
    assert!(
        crashes > 5 && inside > 2,
        "{crashes} crashes, {inside} inside"
    );
}

/// Each step does bounded work: at most [`STEP_KEYS`] keys written or
/// walked, plus one command's that cannot stop part way (a
/// transaction's changes) — here, a range delete of 20,000 keys and a
/// revoke of 1,500 (nothing compacted: that adds at most an entry's
/// compaction, `raftkv::machine::COMPACT_PER_ENTRY` and twice what the
/// entry wrote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_does_bounded_work() {
    let sm = open_on(&SimVfs::new());
    let fill: Vec<_> = (0..KEYS / 1000)
        .map(|e| batch_entry(e + 3, (e * 1000..(e + 1) * 1000).map(put).collect()))
        .collect();
    let mut log = two_entries();
    log.extend(fill);
    log.push(batch_entry(KEYS / 1000 + 3, vec![range()]));
    sm.apply_all(log).await.unwrap();
    assert!(sm.get(&key(KEYS - 1)).unwrap().is_none());
    let stats = sm.apply_stats();
    let bound = STEP_KEYS + 2 * raftkv::kv::MAX_TXN_OPS;
    assert!(stats.max_step_work <= bound, "{stats:?}");
    // 23,000 keys written, then deleted: many steps.
    assert!(stats.steps >= 46_000 / bound as u64, "{stats:?}");
}
