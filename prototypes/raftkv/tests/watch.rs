//! Watch: the state machine writes every change into its history at
//! apply, in order, compacted to a retention; a watcher on any node,
//! reconnecting after its last position, sees every change exactly once
//! and in order — through a leader killed and every node restarted.

mod common;

use base64::Engine as _;
use common::Cluster;
use journal_core::vfs::SimVfs;
type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;
use raftkv::api::WatchLine;
use raftkv::client::Client;
use raftkv::machine::{Change, Position, SUGGESTED_RETENTION};
use raftkv::{Command, Compare, Expect, Revision, StateMachine, TxnOp};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::batch_entry as entry;

fn put(key: &str, v: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: v.into(),
        id: None,
    }
}

fn del(key: &str) -> Command {
    Command::Delete {
        key: key.into(),
        id: None,
    }
}

/// Every event from the start: (position, key, value or None).
fn all_events(sm: &StateMachine, mut from: Position) -> Vec<(String, String, Option<String>)> {
    let mut out = Vec::new();
    loop {
        let page = sm.events(from, b"", 1000, 1000).unwrap();
        assert_eq!(page.compacted, None);
        if page.next == from {
            return out;
        }
        from = page.next;
        out.extend(page.events.into_iter().map(|e| {
            let v = match e.change {
                Change::Put(v) => Some(String::from_utf8(v).unwrap()),
                Change::Delete => None,
            };
            (e.position.to_string(), String::from_utf8(e.key).unwrap(), v)
        }));
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
    sm.keep_events(SUGGESTED_RETENTION);
    let txn = Command::Txn {
        compares: vec![Compare {
            key: b"a".to_vec(),
            expect: Expect::Present,
        }],
        success: vec![
            TxnOp::Put {
                key: b"t".to_vec(),
                value: b"1".to_vec(),
                lease: None,
            },
            TxnOp::Delete { key: b"b".to_vec() },
        ],
        failure: Vec::new(),
        id: None,
    };
    let range = Command::DeleteRange {
        start: b"r/".to_vec(),
        end: Some(b"r0".to_vec()),
        id: None,
    };
    sm.apply_all([
        entry(1, vec![put("a", "1"), put("b", "2"), del("missing")]),
        entry(2, vec![txn, put("r/1", "x"), put("r/2", "y")]),
        entry(3, vec![range, put("a", "3")]),
    ])
    .await
    .unwrap();
    let s = |x: &str| x.to_string();
    let want = vec![
        (s("1.0.0"), s("a"), Some(s("1"))),
        (s("1.1.0"), s("b"), Some(s("2"))),
        // (No event for deleting a key that was not there.)
        (s("2.0.0"), s("t"), Some(s("1"))),
        (s("2.0.1"), s("b"), None),
        (s("2.1.0"), s("r/1"), Some(s("x"))),
        (s("2.2.0"), s("r/2"), Some(s("y"))),
        (s("3.0.0"), s("r/1"), None),
        (s("3.0.1"), s("r/2"), None),
        (s("3.1.0"), s("a"), Some(s("3"))),
    ];
    assert_eq!(all_events(&sm, Position::default()), want);
    // A prefix, and a start inside the history.
    let from: Position = "2.1.0".parse().unwrap();
    let page = sm.events(from, b"r/", 1, 100).unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].position, from);
    assert_eq!(sm.history(), (Position::default(), 9));
    // Held across a restart.
    sm.close().unwrap();
    drop(sm);
    let sm = StateMachine::open(Arc::new(sim), "/n/state", options).unwrap();
    sm.keep_events(SUGGESTED_RETENTION);
    assert_eq!(all_events(&sm, Position::default()), want);
    // Compaction to a retention of 4: the oldest go, the horizon moves
    // past them, and a read from before it is told so.
    sm.keep_events(4);
    sm.apply_all([entry(4, vec![put("z", "1")])]).await.unwrap();
    let (horizon, held) = sm.history();
    assert_eq!(held, 4);
    // (Just past the last event removed: 2.2.0.)
    assert_eq!(horizon.to_string(), "2.2.1");
    let page = sm.events(Position::default(), b"", 10, 10).unwrap();
    assert_eq!(page.compacted, Some(horizon));
    assert!(page.events.is_empty());
    let rest = all_events(&sm, horizon);
    assert_eq!(rest.len(), 4);
    assert_eq!(rest[3], (s("4.0.0"), s("z"), Some(s("1"))));
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
            None => "from=0.0".to_string(),
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
    let mut cluster = Cluster::start(3, &["--watch-history", "100000"]);
    cluster.leader(None).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = tokio::spawn(watcher(cluster.endpoints(), stop.clone()));
    let mut client = Client::new(&cluster.endpoints(), 77).unwrap();
    // (value, revision) of every acknowledged write; every value tried.
    let mut acked: Vec<(String, Revision)> = Vec::new();
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
        }
    }
    // The last write's event reaches the watcher, then it stops.
    let last = acked.last().unwrap().1;
    let started = Instant::now();
    loop {
        let probe = Client::new(&cluster.endpoints(), 0).unwrap();
        let mut done = 0;
        for p in &cluster.nodes {
            if let Ok(s) = probe.status(&p.addr).await {
                done += usize::from(s.applied_index.unwrap_or(0) >= last.index);
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
    let got: BTreeMap<String, Revision> = lines
        .iter()
        .map(|l| {
            let v = String::from_utf8(b64.decode(l.value.as_ref().unwrap()).unwrap()).unwrap();
            let rev: Revision = l.revision.as_ref().unwrap().parse().unwrap();
            (v, rev)
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
    let cluster = Cluster::start(3, &["--watch-history", "16"]);
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 5).unwrap();
    for i in 0..40 {
        client.put(&format!("g/{i}"), b"v").await.unwrap();
    }
    let addr = &cluster.nodes[leader].addr;
    let http = reqwest::Client::new();
    let r = http
        .get(format!("http://{addr}/watch?from=0.0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 410);
    let l: WatchLine = serde_json::from_str(r.text().await.unwrap().trim()).unwrap();
    assert_eq!(l.error.as_deref(), Some("compacted"));
    // From where the history starts: the newest events, then it waits.
    let first = l.first.unwrap();
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
    for q in ["from=x", "after=1.0", "from=1.0&after=1.0.0", "prefix=%0A"] {
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
        cmds.push(Command::DeleteRange {
            start: b"r/".to_vec(),
            end: Some(b"r/6".to_vec()),
            id: None,
        });
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
    sm.keep_events(SUGGESTED_RETENTION);
    rf.keep_events(SUGGESTED_RETENTION);
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
            sm.keep_events(SUGGESTED_RETENTION);
            // openraft replays what the store does not hold.
            let applied = sm.applied().map_or(0, |l| l.index);
            replayed += next - 1 - applied;
            beyond += applied.saturating_sub(synced);
            kept += applied;
            sm.apply_all((applied + 1..next).map(mixed)).await.unwrap();
        }
        let (horizon, held) = sm.history();
        let events = all_events(&sm, horizon);
        assert_eq!(
            held,
            events.len() as u64,
            "round {round}: the count drifted"
        );
        assert_eq!(
            events,
            all_events(&rf, Position::default()),
            "round {round}"
        );
    }
    // The crashes kept some applied entries and lost others, which were
    // replayed.
    eprintln!("replayed {replayed}, kept {kept}, beyond {beyond}");
    assert!(replayed > 0 && kept > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_history_no_event_is_written_and_every_start_is_gone() {
    let sm = StateMachine::open(
        Arc::new(SimVfs::new()),
        "/n/state",
        kvstore::Options::default(),
    )
    .unwrap();
    sm.keep_events(SUGGESTED_RETENTION);
    sm.apply_all([entry(1, vec![put("a", "1"), put("b", "2")])])
        .await
        .unwrap();
    assert_eq!(sm.history().1, 2);
    // Turned off: what is held is compacted away, nothing new is written,
    // and the horizon follows the applied index.
    sm.keep_events(0);
    assert!(!sm.keeps_history());
    sm.apply_all([entry(2, vec![put("c", "3")])]).await.unwrap();
    let (horizon, held) = sm.history();
    assert_eq!((horizon.to_string().as_str(), held), ("3.0.0", 0));
    let page = sm.events(Position::default(), b"", 10, 10).unwrap();
    assert_eq!(page.compacted, Some(horizon));
    assert!(all_events(&sm, horizon).is_empty());
    // On again: events from the next entry on.
    sm.keep_events(10);
    sm.apply_all([entry(3, vec![put("d", "4")])]).await.unwrap();
    let s = |x: &str| x.to_string();
    assert_eq!(
        all_events(&sm, horizon),
        [(s("3.0.0"), s("d"), Some(s("4")))]
    );
}
