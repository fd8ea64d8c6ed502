//! A three-process cluster on loopback under load from several clients,
//! its leader killed (`kill -9`) or paused (`SIGSTOP`) mid-run: every
//! key's history of puts and linearizable reads stays linearizable (no
//! acknowledged write lost, no value never written, no stale read), and
//! the node that was hit catches up.

mod common;

use common::{acknowledged_writes, check_histories, recorded_read, workload, Cluster};
use raftkv_tools::client::Client;
use raftkv_tools::history::Kind;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: u64 = 4;
const OPS: usize = 150;
const KEYS: u64 = 6;

/// A workload under way.
struct Run {
    load: tokio::task::JoinHandle<Vec<common::Recorded>>,
    done: Arc<AtomicUsize>,
    base: Instant,
    /// The leader when the load began.
    leader: usize,
}

/// Starts the workload and returns once a third of it completed.
async fn begin(cluster: &Cluster) -> Run {
    let done = Arc::new(AtomicUsize::new(0));
    let base = Instant::now();
    let load = tokio::spawn(workload(
        cluster.endpoints(),
        CLIENTS,
        OPS,
        KEYS,
        done.clone(),
        base,
    ));
    let leader = cluster.leader(None).await;
    wait_done(&done, (CLIENTS as usize * OPS) / 3).await;
    assert!(!load.is_finished(), "the fault came after the load");
    Run {
        load,
        done,
        base,
        leader,
    }
}

/// Waits until `n` operations of the workload completed.
async fn wait_done(done: &AtomicUsize, n: usize) {
    let start = Instant::now();
    while done.load(Ordering::Relaxed) < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the load stalled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits for the workload, then for the node that was hit (`run.leader`)
/// to catch up; checks that its local copy is the cluster's, and that
/// every key's history (with `extra` operations, and a final
/// linearizable read of every key) is linearizable.
async fn finish(cluster: &Cluster, run: Run, extra: Vec<common::Recorded>) {
    let Run {
        load, base, leader, ..
    } = run;
    let mut history = load.await.unwrap();
    history.extend(extra);
    let now = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 1).unwrap();
    let probe = client.status(&cluster.nodes[now].addr).await.unwrap();
    cluster
        .caught_up(leader, probe.applied_index.unwrap())
        .await;
    let mut hit = Client::new(&[cluster.nodes[leader].addr.clone()], 2).unwrap();
    for k in 0..KEYS {
        let read = recorded_read(&mut client, &format!("key-{k}"), base).await;
        let Kind::Read(v) = &read.1.kind else {
            unreachable!("a read")
        };
        let local = hit.get(&read.0, true).await.unwrap();
        assert_eq!(&local, v, "{} on the node hit", read.0);
        history.push(read);
    }
    let acked = acknowledged_writes(&history);
    assert!(acked > 100, "only {acked} writes acknowledged");
    assert_eq!(check_histories(&history), KEYS as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_killed_under_load_loses_nothing() {
    // Snapshots every 200 entries: the restarted node may need one.
    let mut cluster = Cluster::start(3, &["--snapshot-logs", "200", "--threads", "1"]);
    let run = begin(&cluster).await;
    cluster.kill9(run.leader);
    // A new leader serves while the old one is down...
    assert_ne!(cluster.leader(Some(run.leader)).await, run.leader);
    let before = run.done.load(Ordering::Relaxed);
    wait_done(&run.done, before + 20).await;
    // ...and the killed node restarts from its directory.
    cluster.spawn(run.leader).unwrap();
    finish(&cluster, run, Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_acknowledges_nothing_it_did_not_commit() {
    let cluster = Cluster::start(3, &[]);
    let run = begin(&cluster).await;
    let old = run.leader;
    cluster.signal(old, "STOP");
    // Longer than the election timeout (500 to 1000 ms): the others elect
    // a leader, which acknowledges writes meanwhile.
    assert_ne!(cluster.leader(Some(old)).await, old);
    let before = run.done.load(Ordering::Relaxed);
    wait_done(&run.done, before + 20).await;
    // Reads sent to the paused leader now, after those writes: when it
    // wakes it still believes it leads, and must not answer from its own
    // stale copy.
    let mut readers = Vec::new();
    for k in 0..KEYS {
        let mut c = Client::new(&[cluster.nodes[old].addr.clone()], 3 + k).unwrap();
        let base = run.base;
        readers.push(tokio::spawn(async move {
            recorded_read(&mut c, &format!("key-{k}"), base).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.signal(old, "CONT");
    let mut extra = Vec::new();
    for r in readers {
        extra.push(r.await.unwrap());
    }
    finish(&cluster, run, extra).await;
}
