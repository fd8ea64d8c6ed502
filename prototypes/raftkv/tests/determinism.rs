//! Apply is a pure function of the log: no hash order, no clock, no
//! randomness, no dependence on how the entries are grouped into apply
//! calls decides what a replica writes or emits.
//!
//! - One recorded log (leases granted, keys attached and revoked in the
//!   entry that attached them, transactions, range deletes larger than an
//!   apply step, sessions with retries and stale ids) is applied by three
//!   processes — each has its own `HashMap` seeds — each grouping the
//!   entries differently; their stores (as snapshot files), event streams
//!   and answers must be the same, byte for byte.
//! - The same over HTTP: leases revoked while clients attach keys to them;
//!   the history read from the leader and, once it is killed, from the
//!   new leader must be the same.
//! - The apply path names no hash container, clock or random source.

mod common;

use common::{batch_entry, Cluster};
use journal_core::vfs::{SimVfs, SplitMix64};
use openraft::storage::RaftSnapshotBuilder;
use raftkv::api::WatchLine;
use raftkv::machine::{lease_id, Change};
use raftkv::{Command, Compare, Expect, RequestId, Revision, StateMachine, TxnOp};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;

/// Set in a child process: `GROUPING:OUTPUT` (see `child`).
const CHILD: &str = "RAFTKV_DETERMINISM_CHILD";
/// Events the history keeps in the children: small, so that compaction
/// runs all along.
const RETENTION: u64 = 1500;

fn txn_put(key: String, value: Vec<u8>, lease: Option<u64>) -> Command {
    Command::Txn {
        compares: Vec::new(),
        success: vec![TxnOp::Put {
            key: key.into_bytes(),
            value,
            lease,
        }],
        failure: Vec::new(),
        id: None,
    }
}

/// The recorded log: 90 entries from a fixed seed.
fn recorded_log() -> Vec<Entry> {
    let mut rng = SplitMix64::new(0x5eed_0007);
    let mut leases: Vec<u64> = Vec::new();
    let mut seqs = [0u64; 6];
    let mut entries = Vec::new();
    for index in 1..=90u64 {
        let mut cmds = vec![Command::Clock {
            now_ms: 1_000 * index,
            session_ttl_ms: 30_000,
        }];
        if index % 30 == 5 {
            // A range larger than several apply steps, filled in one entry
            // and deleted a few entries later (with keys outside it kept).
            for i in 0..2_500u64 {
                cmds.push(Command::Put {
                    key: format!("r/{index}/{i:05}").into_bytes(),
                    value: vec![b'r'; (i % 17) as usize],
                    id: None,
                });
            }
        }
        if index % 30 == 9 {
            cmds.push(Command::DeleteRange {
                start: format!("r/{}/", index - 4).into_bytes(),
                end: Some(format!("r/{}/02000", index - 4).into_bytes()),
                id: None,
            });
        }
        let n = 4 + rng.next_u64() % 40;
        for _ in 0..n {
            let sub = cmds.len() as u32;
            let key = format!("k/{:03}", rng.next_u64() % 300);
            let value = format!("v{index}.{sub}").into_bytes();
            let cmd = match rng.next_u64() % 12 {
                0 => {
                    leases.push(lease_id(Revision { index, sub }));
                    Command::LeaseGrant {
                        ttl_ms: 3_600_000,
                        id: None,
                    }
                }
                1..=4 if !leases.is_empty() => {
                    let lease = leases[(rng.next_u64() % leases.len() as u64) as usize];
                    txn_put(key, value, Some(lease))
                }
                5 if !leases.is_empty() => {
                    // Revoked in the entry that attached keys to it.
                    let lease = leases.remove((rng.next_u64() % leases.len() as u64) as usize);
                    for i in 0..12 {
                        cmds.push(txn_put(
                            format!("l/{lease:x}/{i:02}"),
                            b"x".to_vec(),
                            Some(lease),
                        ));
                    }
                    Command::LeaseRevoke { lease, id: None }
                }
                6 if !leases.is_empty() => Command::LeaseKeepAlive {
                    lease: leases[(rng.next_u64() % leases.len() as u64) as usize],
                    id: None,
                },
                7 => Command::Delete {
                    key: key.into_bytes(),
                    id: None,
                },
                8 => Command::Txn {
                    compares: vec![Compare {
                        key: key.clone().into_bytes(),
                        expect: if rng.next_u64().is_multiple_of(2) {
                            Expect::Present
                        } else {
                            Expect::Absent
                        },
                    }],
                    success: vec![TxnOp::Put {
                        key: key.into_bytes(),
                        value,
                        lease: None,
                    }],
                    failure: vec![TxnOp::Delete {
                        key: format!("k/{:03}", rng.next_u64() % 300).into_bytes(),
                    }],
                    id: None,
                },
                9 => {
                    // A session's write: new, retried, or stale.
                    let c = (rng.next_u64() % 6) as usize;
                    let seq = match rng.next_u64() % 4 {
                        0 if seqs[c] > 1 => seqs[c] - 1,
                        1 if seqs[c] > 0 => seqs[c],
                        _ => {
                            seqs[c] += 1;
                            seqs[c]
                        }
                    };
                    Command::Put {
                        key: key.into_bytes(),
                        value,
                        id: Some(RequestId {
                            client: 100 + c as u64,
                            seq,
                        }),
                    }
                }
                _ => Command::Put {
                    key: key.into_bytes(),
                    value,
                    id: None,
                },
            };
            cmds.push(cmd);
        }
        entries.push(batch_entry(index, cmds));
    }
    entries
}

/// Applies the recorded log in groups of `grouping` entries (0: all in
/// one call) and writes what it produced to `out`: every answer, the
/// history's horizon and count, every event held, then the store as a
/// snapshot file, byte for byte.
async fn child(grouping: usize, out: &std::path::Path) {
    let sim = SimVfs::new();
    let options = kvstore::Options {
        checkpoint_interval: None,
        ..kvstore::Options::default()
    };
    let mut sm = StateMachine::open(Arc::new(sim), "/n/state", options).unwrap();
    sm.keep_events(RETENTION);
    let log = recorded_log();
    let chunk = if grouping == 0 { log.len() } else { grouping };
    let mut bytes = Vec::new();
    for group in log.chunks(chunk) {
        for applied in sm.apply_all(group.to_vec()).await.unwrap() {
            bytes.extend_from_slice(format!("{:?}\n", applied.verdicts).as_bytes());
        }
    }
    let (horizon, count) = sm.history();
    bytes.extend_from_slice(format!("history {horizon} {count}\n").as_bytes());
    let mut from = horizon;
    loop {
        let page = sm.events(from, b"", 1000, 1000).unwrap();
        assert_eq!(page.compacted, None);
        if page.next == from {
            break;
        }
        from = page.next;
        for e in page.events {
            let change = match e.change {
                Change::Put(v) => format!("put {}", String::from_utf8_lossy(&v)),
                Change::Delete => "delete".into(),
            };
            let key = String::from_utf8_lossy(&e.key);
            bytes.extend_from_slice(format!("{} {key} {change}\n", e.position).as_bytes());
        }
    }
    let mut snap = sm.build_snapshot().await.unwrap();
    snap.snapshot
        .seek(std::io::SeekFrom::Start(0))
        .await
        .unwrap();
    let mut file = Vec::new();
    snap.snapshot.read_to_end(&mut file).await.unwrap();
    bytes.extend_from_slice(b"store\n");
    bytes.extend_from_slice(&file);
    std::fs::write(out, bytes).unwrap();
}

/// This test's binary run again as a child process, in `child` mode.
fn spawn_child(grouping: usize, out: &std::path::Path) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "one_log_applies_byte_for_byte_alike_in_three_processes",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{grouping}:{}", out.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_log_applies_byte_for_byte_alike_in_three_processes() {
    if let Ok(arg) = std::env::var(CHILD) {
        let (grouping, out) = arg.split_once(':').unwrap();
        child(grouping.parse().unwrap(), std::path::Path::new(out)).await;
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // One entry per call, all at once, and groups of 7.
    let groupings = [1usize, 0, 7];
    let outs: Vec<_> = (0..3)
        .map(|i| tmp.path().join(format!("out-{i}")))
        .collect();
    let mut children: Vec<_> = groupings
        .iter()
        .zip(&outs)
        .map(|(g, out)| spawn_child(*g, out))
        .collect();
    let start = Instant::now();
    for c in &mut children {
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                assert!(status.success(), "a child failed: {status}");
                break;
            }
            if start.elapsed() > Duration::from_secs(300) {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                panic!("the children did not finish within 300 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let results: Vec<Vec<u8>> = outs.iter().map(|o| std::fs::read(o).unwrap()).collect();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    // The log did what it is meant to exercise.
    let first = text(&results[0]);
    assert!(first
        .lines()
        .any(|l| l.contains(" l/") && l.ends_with("delete")));
    assert!(first
        .lines()
        .any(|l| l.contains(" r/") && l.ends_with("delete")));
    assert!(first.contains("Duplicate") && first.contains("Stale"));
    let horizon = first.lines().find(|l| l.starts_with("history ")).unwrap();
    assert_ne!(horizon, "history 0.0.0 0", "the history never compacted");
    for (i, r) in results.iter().enumerate().skip(1) {
        if r != &results[0] {
            let (a, b) = (text(&results[0]), text(r));
            let at = a.lines().zip(b.lines()).position(|(x, y)| x != y);
            let line = |s: &str| at.and_then(|n| s.lines().nth(n)).unwrap_or("").to_owned();
            panic!(
                "process {i} (grouping {}) differs from process 0 (grouping {}) at line {at:?}: {:?} against {:?}",
                groupings[i],
                groupings[0],
                line(&b),
                line(&a),
            );
        }
    }
}

/// Every event of the history from revision `from` up to the put of key
/// `end`, as the node at `addr` streams it.
async fn history(addr: &str, from: &str, end: &str) -> Vec<String> {
    let http = reqwest::Client::new();
    let mut resp = http
        .get(format!("http://{addr}/watch?from={from}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no end key in 60 s"
        );
        let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), resp.chunk())
            .await
            .unwrap()
            .unwrap()
        else {
            panic!("the stream ended");
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let l: WatchLine = serde_json::from_slice(&buf[..nl]).unwrap();
            buf.drain(..=nl);
            assert_eq!(l.error, None);
            let key = l.key.clone().unwrap();
            out.push(format!("{} {} {key}", l.pos.unwrap(), l.kind.unwrap()));
            if key == end {
                return out;
            }
        }
    }
}

/// The measured case of issue 58: five leases, each revoked while 8
/// clients put keys attached to it; the history read from the leader and
/// from the next one must be the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_is_the_same_on_the_next_leader_after_revokes_under_load() {
    let mut cluster = Cluster::start(3, &["--watch-history", "100000"]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    let r = http
        .put(format!("http://{addr}/kv/begin"))
        .body("b")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let from = r.headers()[raftkv::api::REVISION_HEADER]
        .to_str()
        .unwrap()
        .to_owned();
    for l in 0..5 {
        let r = http
            .post(format!("http://{addr}/lease"))
            .body(r#"{"ttl_s": 600}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let lease: raftkv::api::LeaseReply = r.json().await.unwrap();
        let puts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut clients = Vec::new();
        for c in 0..8 {
            let (http, addr, puts) = (http.clone(), addr.clone(), puts.clone());
            clients.push(tokio::spawn(async move {
                for i in 0..400 {
                    let url = format!("http://{addr}/kv/d/{l}/{c}/{i}?lease={}", lease.id);
                    let r = http.put(url).body("x").send().await.unwrap();
                    match r.status().as_u16() {
                        200 => puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        404 => return,
                        s => panic!("put answered {s}"),
                    };
                }
            }));
        }
        while puts.load(std::sync::atomic::Ordering::Relaxed) < 80 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let r = http
            .delete(format!("http://{addr}/lease/{}", lease.id))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        for c in clients {
            c.await.unwrap();
        }
    }
    let r = http
        .put(format!("http://{addr}/kv/end"))
        .body("e")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let before = history(&addr, &from, "end").await;
    assert!(before.iter().filter(|l| l.contains(" delete d/")).count() >= 5 * 80);
    cluster.kill9(leader);
    let next = cluster.leader(Some(leader)).await;
    let after = history(&cluster.nodes[next].addr, &from, "end").await;
    assert_eq!(before.len(), after.len());
    if let Some(i) = (0..before.len()).find(|&i| before[i] != after[i]) {
        panic!(
            "the histories differ at event {i}: {} on the old leader, {} on the new",
            before[i], after[i]
        );
    }
}

/// The apply path (`src/machine/`) names no hash container (whose
/// iteration order differs per process), no clock and no random source;
/// a snapshot's build and install time themselves, outside the apply.
#[test]
fn the_apply_path_names_no_hash_container_clock_or_random_source() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/machine");
    let mut files = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/machine.rs")];
    for e in std::fs::read_dir(&dir).unwrap() {
        files.push(e.unwrap().path());
    }
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let mut banned = vec![
                "HashMap",
                "HashSet",
                "SystemTime",
                "RandomState",
                "rand::",
                "thread_rng",
                "getrandom",
            ];
            if name != "snapshot.rs" {
                banned.push("Instant");
            }
            for b in banned {
                if code.contains(b) {
                    found.push(format!("{name}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(files.len() > 5);
    assert!(found.is_empty(), "the apply path names: {found:#?}");
}
