//! Watch: the versions the state machine writes at apply are the watch
//! history — every change, in revision order, until compacted; a watch
//! from a compacted revision is told so, and goes on from the
//! compaction's; a watcher on any node, reconnecting after its last
//! position, sees every change exactly once and in order — through a
//! leader killed and every node restarted.

mod common;

use base64::Engine as _;
use common::{changes, Cluster};
use journal_core::vfs::SimVfs;
type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;
use raftkv::api::WatchLine;
use raftkv::kv::{KvError, RequestOp, TxnRequest};
use raftkv::machine::{Position, ReadError};
use raftkv::ToCompare;
use raftkv::{Command, Expect, StateMachine};
use raftkv_tools::client::Client;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::batch_entry as entry;

fn put(key: &str, v: &str) -> Command {
    Command::put(key, v, None)
}

fn del(key: &str) -> Command {
    Command::delete(key, None)
}

fn op(cmd: Command) -> RequestOp {
    match cmd {
        Command::Kv { op, .. } => op,
        _ => unreachable!(),
    }
}

fn compact(revision: i64) -> Command {
    Command::Compact {
        revision,
        physical: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_holds_every_change_in_order_and_compacts() {
    let sim = SimVfs::new();
    let options = kvstore::Options {
        checkpoint_interval: None,
        ..kvstore::Options::default()
    };
    let sm = StateMachine::open(Arc::new(sim.clone()), "/n/state", options).unwrap();
    let txn = Command::txn(
        TxnRequest {
            compare: vec![Expect::Present.compare(b"a")],
            success: vec![op(put("t", "1")), op(del("b"))],
            failure: Vec::new(),
        },
        None,
    );
    sm.apply_all([
        entry(1, vec![put("a", "1"), put("b", "2"), del("missing")]),
        entry(2, vec![txn, put("r/1", "x"), put("r/2", "y")]),
        entry(
            3,
            vec![Command::delete_range("r/", "r0", None), put("a", "3")],
        ),
    ])
    .await
    .unwrap();
    let want = [
        "2.0 put a=1",
        "3.0 put b=2",
        // (No event, no revision, for deleting a key that was not there.)
        "4.0 put t=1",
        "4.1 delete b",
        "5.0 put r/1=x",
        "6.0 put r/2=y",
        "7.0 delete r/1",
        "7.1 delete r/2",
        "8.0 put a=3",
    ];
    assert_eq!(changes(&sm, 0), want);
    // A range, and a start inside the history, with the version before.
    let from = Position::at(5);
    let page = sm.events(from, (b"r/", b"r0"), true, (1, 100)).unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].0, from);
    let page = sm
        .events(Position::at(7), (b"r/", b"r0"), true, (10, 100))
        .unwrap();
    let prev = page.events[1].1.prev_kv.clone().unwrap();
    assert_eq!(
        (prev.key, prev.value, prev.mod_revision),
        (b"r/2".to_vec(), b"y".to_vec(), 6)
    );
    // Held across a restart.
    sm.close().unwrap();
    drop(sm);
    let sm = StateMachine::open(Arc::new(sim), "/n/state", options).unwrap();
    assert_eq!(changes(&sm, 0), want);
    // A compaction at 7: a read from before it is told so; from 7 on the
    // changes are all there; what the compaction supersedes is gone (the
    // versions at or below 7 but each key's latest), the rest kept.
    sm.apply_all([entry(4, vec![compact(7), put("z", "1")])])
        .await
        .unwrap();
    let r = sm.events(Position::at(6), (b"\0", b"\0"), false, (10, 10));
    assert!(
        matches!(
            r,
            Err(ReadError::Kv(KvError::Compacted {
                compact_revision: 7
            }))
        ),
        "{r:?}"
    );
    assert_eq!(
        changes(&sm, 7),
        [
            "7.0 delete r/1",
            "7.1 delete r/2",
            "8.0 put a=3",
            "9.0 put z=1"
        ]
    );
    let at7 = |k: &str| sm.get_at(k.as_bytes(), 7).unwrap().map(|kv| kv.value);
    assert_eq!(at7("t"), Some(b"1".to_vec()), "the latest version kept");
    assert_eq!(at7("a"), Some(b"1".to_vec()));
    assert_eq!(at7("b"), None);
    assert!(matches!(
        sm.get_at(b"a", 6),
        Err(ReadError::Kv(KvError::Compacted { .. }))
    ));
}

/// Reads a watch stream from `base`, resuming after the last position
/// seen, until `stop` is set; returns every event line.
async fn watcher(
    endpoints: Vec<String>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<WatchLine> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut seen: Vec<WatchLine> = Vec::new();
    let mut attempt = 0usize;
    let mut reconnects = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        attempt += 1;
        let node = &endpoints[attempt % endpoints.len()];
        let q = match seen.last() {
            Some(l) => format!("after={}", l.pos.clone().unwrap()),
            None => "from=0".to_string(),
        };
        let r = http
            .get(format!("http://{node}/watch?prefix=w/&{q}"))
            .send()
            .await;
        let mut resp = match r {
            Ok(r) if r.status() == 200 => r,
            Ok(r) => panic!("watch answered {}: {:?}", r.status(), r.text().await),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        reconnects += 1;
        let mut buf = Vec::new();
        loop {
            let chunk = tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await;
            let bytes = match chunk {
                Ok(Ok(Some(b))) => b,
                // Ended, failed: reconnect. Quiet: look at `stop`, go on.
                Ok(_) => break,
                Err(_) if stop.load(std::sync::atomic::Ordering::Relaxed) => break,
                Err(_) => continue,
            };
            buf.extend_from_slice(&bytes);
            // Only whole lines count: a line cut by a broken connection is
            // read again after the last whole one.
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let l: WatchLine = serde_json::from_slice(&buf[..nl]).unwrap();
                buf.drain(..=nl);
                assert_eq!(l.error, None, "the stream ended: {l:?}");
                seen.push(l);
            }
        }
        // Every few lines, change node on purpose, too.
        if reconnects % 3 == 0 {
            attempt += 1;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resuming_watcher_sees_every_change_once_in_order_through_restarts() {
    let mut cluster = Cluster::start(3, &[]);
    cluster.leader(None).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = tokio::spawn(watcher(cluster.endpoints(), stop.clone()));
    let mut client = Client::new(&cluster.endpoints(), 77).unwrap();
    // (value, revision) of every acknowledged write; every value tried.
    let mut acked: Vec<(String, i64)> = Vec::new();
    let mut last_index = 0;
    let mut tried = HashSet::new();
    for i in 0..240 {
        if i == 80 {
            let leader = cluster.leader(None).await;
            cluster.kill9(leader);
            cluster.spawn(leader).unwrap();
        }
        if i == 160 {
            for n in 0..3 {
                cluster.kill9(n);
            }
            for n in 0..3 {
                cluster.spawn(n).unwrap();
            }
        }
        let (key, value) = (format!("w/{}", i % 7), format!("v{i}"));
        tried.insert(value.clone());
        if client.put(&key, value.as_bytes()).await.is_ok() {
            acked.push((value, client.last_revision().unwrap()));
            last_index = client.last_index().unwrap();
        }
    }
    // The last write's event reaches the watcher, then it stops.
    let started = Instant::now();
    loop {
        let probe = Client::new(&cluster.endpoints(), 0).unwrap();
        let mut done = 0;
        for p in &cluster.nodes {
            if let Ok(s) = probe.status(&p.addr).await {
                done += usize::from(s.applied_index.unwrap_or(0) >= last_index);
            }
        }
        if done == 3 || started.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let lines = watch.await.unwrap();
    // Positions strictly increase: nothing twice, in order.
    let positions: Vec<Position> = lines
        .iter()
        .map(|l| l.pos.as_ref().unwrap().parse().unwrap())
        .collect();
    assert!(
        positions.windows(2).all(|p| p[0] < p[1]),
        "out of order or twice"
    );
    // Every acknowledged write once, at its revision; nothing never tried.
    let b64 = base64::engine::general_purpose::STANDARD;
    let got: BTreeMap<String, i64> = lines
        .iter()
        .map(|l| {
            let v = String::from_utf8(b64.decode(l.value.as_ref().unwrap()).unwrap()).unwrap();
            (v, l.revision.unwrap())
        })
        .collect();
    assert_eq!(got.len(), lines.len(), "a value seen twice");
    for (v, rev) in &acked {
        assert_eq!(got.get(v), Some(rev), "{v} not seen at its revision");
    }
    assert!(got.keys().all(|v| tried.contains(v)));
    assert!(
        acked.len() >= 200,
        "only {} writes acknowledged",
        acked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_is_gone() {
    let cluster = Cluster::start(
        3,
        &[
            "--auto-compaction-retention",
            "16",
            "--auto-compaction-interval-s",
            "1",
        ],
    );
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 5).unwrap();
    for i in 0..40 {
        client.put(&format!("g/{i}"), b"v").await.unwrap();
    }
    let last = client.last_revision().unwrap();
    let addr = &cluster.nodes[leader].addr;
    let http = reqwest::Client::new();
    // The leader compacts every second to 16 revisions behind its newest:
    // a compaction may come in the middle of the writes, and one after
    // them compacts to `last - 16`. (Waited for, whatever the machine's
    // speed: bounded, not a fixed time.)
    let started = Instant::now();
    let first = loop {
        let r = http
            .get(format!("http://{addr}/watch?from=0"))
            .send()
            .await
            .unwrap();
        if r.status() != 200 {
            assert_eq!(r.status(), 410);
            let l: WatchLine = serde_json::from_str(r.text().await.unwrap().trim()).unwrap();
            assert_eq!(l.error.as_deref(), Some("compacted"));
            let first = l.first.unwrap();
            assert!((2..=last - 16).contains(&first), "{first} of {last}");
            if first == last - 16 {
                break first;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never compacted to {}",
            last - 16
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // From where the history starts (the compaction's revision): the
    // newest events, then it waits.
    let mut r = http
        .get(format!("http://{addr}/watch?from={first}&prefix=g/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut text = Vec::new();
    while let Ok(Some(c)) = tokio::time::timeout(Duration::from_millis(500), r.chunk())
        .await
        .map(|c| c.unwrap())
    {
        text.extend_from_slice(&c);
    }
    let lines: Vec<WatchLine> = String::from_utf8(text)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!((8..=40).contains(&lines.len()), "{} events", lines.len());
    assert_eq!(lines.last().unwrap().key.as_deref(), Some("g/39"));
    // Bad queries.
    for q in ["from=x", "after=1", "from=1&after=1.0", "from=-1"] {
        let r = http
            .get(format!("http://{addr}/watch?{q}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
    }
}

/// Entry `i` of a log with range deletes in it: a range delete commits
/// its entry's earlier writes before the batch ends.
fn mixed(i: u64) -> Entry {
    // Values large enough that the store's log buffers fill and are
    // written (not synced): a torn crash keeps some of them.
    let mut cmds = vec![put(&format!("r/{}", i % 13), &format!("{i}"))];
    if i.is_multiple_of(5) {
        cmds.push(Command::delete_range("r/", "r/6", None));
    }
    if i.is_multiple_of(17) {
        // (A compaction at the revision a few entries back: removals go
        // on over the next entries.)
        cmds.push(compact(i as i64 * 2));
    }
    cmds.push(put(&format!("r/{}", i % 7), &format!("{i}b")));
    entry(i, cmds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_the_replayed_history_is_the_same_and_counted_once() {
    use journal_core::vfs::CrashPolicy;
    let options = kvstore::Options {
        checkpoint_interval: None,
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 16 << 10,
            preallocate_ahead: 1,
            ..kvstore::Options::default().journal
        },
        ..kvstore::Options::default()
    };
    let (mut sim, reference) = (SimVfs::new(), SimVfs::new());
    let mut sm = StateMachine::open(Arc::new(sim.clone()), "/n/state", options).unwrap();
    let rf = StateMachine::open(Arc::new(reference), "/n/state", options).unwrap();
    let (mut next, mut replayed, mut kept) = (1, 0, 0);
    let mut synced = 0;
    let mut beyond = 0;
    for round in 0..60u64 {
        let n = 20 + (round * 37) % 80;
        sm.apply_all((next..next + n).map(mixed)).await.unwrap();
        rf.apply_all((next..next + n).map(mixed)).await.unwrap();
        next += n;
        if round % 2 == 0 {
            // Durable up to here (the store synced, as a log purge has it).
            (sm.purge_gate())(next - 1).await.unwrap();
            synced = next - 1;
        }
        if round % 2 == 1 {
            drop(sm);
            // A power cut, or a process crash (what was written, synced
            // or not, survives: it can end inside an entry).
            sim = sim.crash(match round % 4 {
                1 => CrashPolicy::TornSectors { seed: round },
                _ => CrashPolicy::ProcessOnly,
            });
            sm = StateMachine::open(Arc::new(sim.clone()), "/n/state", options).unwrap();
            // openraft replays what the store does not hold.
            let applied = sm.applied().map_or(0, |l| l.index);
            replayed += next - 1 - applied;
            beyond += applied.saturating_sub(synced);
            kept += applied;
            sm.apply_all((applied + 1..next).map(mixed)).await.unwrap();
        }
        let (r, want) = (sm.revisions(), rf.revisions());
        assert_eq!(r, want, "round {round}");
        assert_eq!(
            changes(&sm, r.compact),
            changes(&rf, r.compact),
            "round {round}"
        );
        assert_eq!(
            sm.hash_kv(0).unwrap(),
            rf.hash_kv(0).unwrap(),
            "round {round}"
        );
    }
    // The crashes kept some applied entries and lost others, which were
    // replayed.
    eprintln!("replayed {replayed}, kept {kept}, beyond {beyond}");
    assert!(replayed > 0 && kept > 0);
}

/// A watcher reading from a revision while a compaction passes it is
/// told so (etcd cancels it with the compaction's revision); from that
/// revision on every change is there, and the latest version of every
/// key before it is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_across_a_compaction_is_told_and_goes_on_from_it() {
    let sm = StateMachine::open(
        Arc::new(SimVfs::new()),
        "/n/state",
        kvstore::Options::default(),
    )
    .unwrap();
    let fill: Vec<Entry> = (1..=50u64)
        .map(|i| entry(i, vec![put(&format!("w/{}", i % 10), &format!("{i}"))]))
        .collect();
    sm.apply_all(fill).await.unwrap();
    // A watcher from 2 reads a page of ten, then the compaction at 40.
    let page = sm
        .events(Position::at(2), (b"w/", b"w0"), false, (10, 100))
        .unwrap();
    assert_eq!(page.events.len(), 10);
    assert_eq!(page.next.revision, 11);
    sm.apply_all([entry(51, vec![compact(40)])]).await.unwrap();
    let r = sm.events(page.next, (b"w/", b"w0"), false, (10, 100));
    assert!(
        matches!(
            r,
            Err(ReadError::Kv(KvError::Compacted {
                compact_revision: 40
            }))
        ),
        "{r:?}"
    );
    // From 40: the eleven changes at 40 to 51 (w/x put at revision x + 1).
    let rest = changes(&sm, 40);
    assert_eq!(rest.len(), 12, "{rest:?}");
    assert_eq!(rest[0], "40.0 put w/9=39");
    // Every key's latest version at or below 40 is still read at 40; the
    // ones before are gone.
    for k in 0..10 {
        let kv = sm.get_at(format!("w/{k}").as_bytes(), 40).unwrap().unwrap();
        let latest = (1..=39).rev().find(|i| i % 10 == k).unwrap();
        assert_eq!(kv.value, latest.to_string().into_bytes(), "w/{k}");
    }
    assert_eq!(sm.revisions().physical, 40, "removed in the same entry");
}
