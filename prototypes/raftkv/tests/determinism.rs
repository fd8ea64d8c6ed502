//! Apply is a pure function of the log: no hash order, no clock, no
//! randomness, no dependence on how the entries are grouped into apply
//! calls decides what a replica writes or answers.
//!
//! - One recorded log (leases granted, keys attached and revoked in the
//!   entry that attached them, transactions — nested, with range deletes
//!   larger than an apply step inside —, range deletes, compactions,
//!   sessions with retries and stale ids) is applied by three processes —
//!   each has its own `HashMap` seeds — each grouping the entries
//!   differently; their stores (as snapshot files), versions (the watch
//!   history), hashes and answers must be the same, byte for byte. Then
//!   logs from other seeds the same way: one more in `cargo test`, new
//!   ones for a time budget in `cargo xtask raft-determinism`.
//! - The same over HTTP: leases revoked while clients attach keys to them;
//!   the history read from the leader and, once it is killed, from the
//!   new leader must be the same.
//! - The apply path names no hash container, clock or random source.

mod common;

use common::{batch_entry, put_leased, Cluster};
use journal_core::vfs::{SimVfs, SplitMix64};
use openraft::storage::RaftSnapshotBuilder;
use raftkv::api::WatchLine;
use raftkv::kv::{RequestOp, TxnRequest};
use raftkv::machine::lease_id;
use raftkv::ToCompare;
use raftkv::{Command, Expect, RequestId, StateMachine};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;

/// Set in a child process: `GROUPING:SEED:OUTPUT` (see `child`).
const CHILD: &str = "RAFTKV_DETERMINISM_CHILD";
/// The recorded log's seed in `cargo test`.
const SEED: u64 = 0x5eed_0007;
/// `cargo xtask raft-determinism`'s time budget, seconds: logs from new
/// seeds for that long (without it, one more fixed seed).
const SECONDS: &str = "RAFTKV_DETERMINISM_SECONDS";

fn op(cmd: Command) -> RequestOp {
    match cmd {
        Command::Kv { op, .. } => op,
        _ => unreachable!(),
    }
}

/// A transaction (comparisons on `key`) whose success branch holds a
/// nested transaction deleting `[from, to)` — more keys than a step
/// takes — and whose failure branch puts `key`.
fn nested_delete(key: &str, (from, to): (String, String)) -> Command {
    let inner = TxnRequest {
        compare: Vec::new(),
        success: vec![op(Command::delete_range(from, to, None))],
        failure: Vec::new(),
    };
    Command::txn(
        TxnRequest {
            compare: vec![Expect::Present.compare(key.as_bytes())],
            success: vec![
                op(Command::put("t/outer", "o", None)),
                RequestOp::Txn(inner),
            ],
            failure: vec![op(Command::put(key, "made", None))],
        },
        None,
    )
}

/// A random command among the many the log holds.
fn one_command(
    rng: &mut SplitMix64,
    (index, sub): (u64, u32),
    leases: &mut Vec<i64>,
    seqs: &mut [u64; 6],
    cmds: &mut Vec<Command>,
) -> Command {
    let key = format!("k/{:03}", rng.next_u64() % 300);
    let value = format!("v{index}.{sub}");
    match rng.next_u64() % 13 {
        0 => {
            leases.push(lease_id(index, sub));
            Command::LeaseGrant {
                lease: 0,
                ttl_s: 3600,
                id: None,
            }
        }
        1..=4 if !leases.is_empty() => {
            let lease = leases[(rng.next_u64() % leases.len() as u64) as usize];
            put_leased(&key, &value, lease)
        }
        5 if !leases.is_empty() => {
            // Revoked in the entry that attached keys to it.
            let lease = leases.remove((rng.next_u64() % leases.len() as u64) as usize);
            for i in 0..12 {
                cmds.push(put_leased(&format!("l/{lease:x}/{i:02}"), "x", lease));
            }
            Command::LeaseRevoke { lease, id: None }
        }
        6 if !leases.is_empty() => Command::LeaseKeepAlive {
            lease: leases[(rng.next_u64() % leases.len() as u64) as usize],
            id: None,
        },
        7 => Command::delete(key, None),
        8 => {
            let expect = if rng.next_u64().is_multiple_of(2) {
                Expect::Present
            } else {
                Expect::Absent
            };
            let other = format!("k/{:03}", rng.next_u64() % 300);
            Command::txn(
                TxnRequest {
                    compare: vec![expect.compare(key.as_bytes())],
                    success: vec![op(Command::put(key, value, None))],
                    failure: vec![op(Command::delete(other, None))],
                },
                None,
            )
        }
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
            let id = Some(RequestId {
                client: 100 + c as u64,
                seq,
            });
            Command::put(key, value, id)
        }
        10 => Command::CompactProgress,
        _ => Command::put(key, value, None),
    }
}

/// The recorded log: 90 entries from `seed`.
fn recorded_log(seed: u64) -> Vec<Entry> {
    let mut rng = SplitMix64::new(seed);
    let mut leases: Vec<i64> = Vec::new();
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
                let value = vec![b'r'; (i % 17) as usize];
                cmds.push(Command::put(format!("r/{index}/{i:05}"), value, None));
            }
        }
        if index % 30 == 9 {
            let range = (
                format!("r/{}/", index - 4),
                format!("r/{}/02000", index - 4),
            );
            cmds.push(nested_delete("k/001", range));
        }
        if index % 30 == 19 {
            let (from, to) = (format!("r/{}/", index - 14), format!("r/{}0", index - 14));
            cmds.push(Command::delete_range(from, to, None));
        }
        if index % 10 == 7 {
            // Compactions, some refused (at or below the last one, or
            // past the store's revision); from index 37 on past the
            // second fill (the store is then above 5,000), so one takes
            // several entries' removals.
            let revision = (index * index / 3 + if index > 30 { 4000 } else { 0 }) as i64;
            for revision in [revision, revision, i64::MAX / 2] {
                cmds.push(Command::Compact {
                    revision,
                    physical: false,
                });
            }
        }
        let n = 4 + rng.next_u64() % 40;
        for _ in 0..n {
            let sub = cmds.len() as u32;
            let cmd = one_command(&mut rng, (index, sub), &mut leases, &mut seqs, &mut cmds);
            cmds.push(cmd);
        }
        entries.push(batch_entry(index, cmds));
    }
    entries
}

/// Applies the recorded log in groups of `grouping` entries (0: all in
/// one call) and writes what it produced to `out`: every answer, the
/// store's revisions, every change held from the compaction on, the hash
/// of the versions, then the store as a snapshot file, byte for byte.
async fn child(grouping: usize, seed: u64, out: &std::path::Path) {
    let sim = SimVfs::new();
    let options = kvstore::Options {
        checkpoint_interval: None,
        ..kvstore::Options::default()
    };
    let mut sm = StateMachine::open(Arc::new(sim), "/n/state", options).unwrap();
    let log = recorded_log(seed);
    let chunk = if grouping == 0 { log.len() } else { grouping };
    let mut bytes = Vec::new();
    for group in log.chunks(chunk) {
        for applied in sm.apply_all(group.to_vec()).await.unwrap() {
            bytes.extend_from_slice(format!("{:?}\n", applied.verdicts).as_bytes());
        }
    }
    let r = sm.revisions();
    bytes.extend_from_slice(format!("revisions {r:?}\n").as_bytes());
    for change in common::changes(&sm, r.compact) {
        bytes.extend_from_slice(format!("{change}\n").as_bytes());
    }
    let hash = sm.hash_kv(0).unwrap();
    bytes.extend_from_slice(format!("hash {hash:?}\n").as_bytes());
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
fn spawn_child(grouping: usize, seed: u64, out: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "one_log_applies_byte_for_byte_alike_in_three_processes",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{grouping}:{seed}:{}", out.display()))
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The log from `seed` applied by three processes, grouped by
/// `groupings`: what the first produced, or where another differs.
async fn three_processes(seed: u64, groupings: [usize; 3]) -> Result<String, String> {
    let tmp = tempfile::tempdir().unwrap();
    let outs: Vec<_> = (0..3)
        .map(|i| tmp.path().join(format!("out-{i}")))
        .collect();
    let children: Vec<_> = groupings
        .iter()
        .zip(&outs)
        .map(|(g, out)| spawn_child(*g, seed, out))
        .collect();
    for mut c in children {
        // Dropped on a timeout: the rest are killed with it.
        let status = tokio::time::timeout(Duration::from_secs(300), c.wait())
            .await
            .map_err(|_| format!("seed {seed}: a child did not finish within 300 s"))?
            .unwrap();
        if !status.success() {
            return Err(format!("seed {seed}: a child failed: {status}"));
        }
    }
    let results: Vec<Vec<u8>> = outs.iter().map(|o| std::fs::read(o).unwrap()).collect();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    for (i, r) in results.iter().enumerate().skip(1) {
        if r != &results[0] {
            let (a, b) = (text(&results[0]), text(r));
            let at = a.lines().zip(b.lines()).position(|(x, y)| x != y);
            let line = |s: &str| at.and_then(|n| s.lines().nth(n)).unwrap_or("").to_owned();
            return Err(format!(
                "seed {seed}: process {i} (grouping {}) differs from process 0 (grouping {}) at line {at:?}: {:?} against {:?}",
                groupings[i],
                groupings[0],
                line(&b),
                line(&a),
            ));
        }
    }
    Ok(text(&results[0]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_log_applies_byte_for_byte_alike_in_three_processes() {
    if let Ok(arg) = std::env::var(CHILD) {
        let mut parts = arg.splitn(3, ':');
        let (grouping, seed, out) = (parts.next(), parts.next(), parts.next());
        let (grouping, seed) = (grouping.unwrap().parse(), seed.unwrap().parse());
        let out = std::path::Path::new(out.unwrap());
        child(grouping.unwrap(), seed.unwrap(), out).await;
        return;
    }
    // One entry per call, all at once, and groups of 7.
    let first = three_processes(SEED, [1, 0, 7]).await.unwrap();
    // The log did what it is meant to exercise.
    assert!(first.lines().any(|l| l.contains(" delete l/")));
    assert!(first.lines().any(|l| l.contains(" delete r/")));
    assert!(first.contains("Duplicate") && first.contains("Stale"));
    assert!(first.contains("Compacted") && first.contains("FutureRevision"));
    let revisions = first.lines().find(|l| l.starts_with("revisions ")).unwrap();
    assert!(
        !revisions.contains("compact: 0,") && revisions.contains("physical"),
        "no compaction applied: {revisions}"
    );
}

/// Logs from other seeds, each grouped three ways (one entry a call, all
/// at once, and groups of 2 to 14 chosen by the seed): one more fixed
/// seed in `cargo test`; new seeds for `RAFTKV_DETERMINISM_SECONDS`
/// (`cargo xtask raft-determinism --minutes N`), from
/// `RAFTKV_DETERMINISM_SEED` or the clock. Prints the logs applied and
/// the failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_from_many_seeds_apply_alike() {
    let budget = std::env::var(SECONDS).ok().map(|s| {
        Duration::from_secs_f64(s.parse().expect("RAFTKV_DETERMINISM_SECONDS is seconds"))
    });
    let first_seed = match std::env::var("RAFTKV_DETERMINISM_SEED") {
        Ok(s) => s.parse().expect("RAFTKV_DETERMINISM_SEED is a number"),
        Err(_) if budget.is_some() => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
        Err(_) => 0x5eed_0008,
    };
    let start = Instant::now();
    let (mut logs, mut failures) = (0u64, Vec::new());
    loop {
        let seed = first_seed.wrapping_add(logs);
        let grouping = 2 + (seed % 13) as usize;
        if let Err(e) = three_processes(seed, [1, 0, grouping]).await {
            failures.push(e);
        }
        logs += 1;
        if budget.is_none_or(|b| start.elapsed() >= b) {
            break;
        }
    }
    println!(
        "determinism: {logs} logs from seed {first_seed} on, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
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
    let mut cluster = Cluster::start(3, &["--auto-compaction-retention", "0"]);
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
