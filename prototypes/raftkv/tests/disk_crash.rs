//! Disks crashing under the nodes: three in-process nodes, each on its own
//! `SimVfs`.
//!
//! - With one member down: node 2 is down while clients write, so every
//!   write is committed by nodes 1 and 3; then node 3's disk loses every
//!   unsynced write (a power cut) and node 1 stops for good. Node 3
//!   restarts from what its disk kept and, with node 2 back, must still
//!   hold every acknowledged write: node 2 never saw them.
//! - With all members: a power cut on all three at once, right after the
//!   last acknowledgement; all restart from what their disks kept.
//! - The same with the leader's disk slow to sync: openraft 0.10
//!   replicates while the leader's own flush runs, so the followers commit
//!   entries the leader's disk may not keep. The leader comes back with a
//!   shorter log than the entries it acknowledged; it must not lead again
//!   in its old term (openraft's leader restore, off in raftkv), nor serve
//!   a read below them.

mod common;

use common::{acknowledged_writes, check_histories, free_port, recorded_read, workload};
use journal_core::vfs::{CrashPolicy, SimVfs};
use raftkv::{Node, NodeOptions};
use raftkv_tools::client::Client;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Running {
    node: Arc<Node>,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), String>>,
}

async fn start(id: u64, sim: &SimVfs, peers: &BTreeMap<u64, String>) -> Running {
    let addr = peers[&id].clone();
    let mut o = NodeOptions::new(id, "/node", addr.clone());
    o.peers = peers.clone();
    o.init = id == 1;
    o.vfs = Arc::new(sim.clone());
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    let node = Arc::new(Node::start(o).await.unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel();
    let served = tokio::spawn(raftkv::serve(node.clone(), listener, async {
        let _ = rx.await;
    }));
    Running { node, stop, served }
}

/// Three nodes on loopback ports, each on its own new `SimVfs`.
async fn start_three() -> (BTreeMap<u64, String>, Vec<SimVfs>, Vec<Option<Running>>) {
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
    let sims: Vec<SimVfs> = (0..3).map(|_| SimVfs::new()).collect();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(Some(start(id, &sims[id as usize - 1], &peers).await));
    }
    (peers, sims, nodes)
}

async fn stop(r: Running) {
    let _ = r.stop.send(());
    r.served.await.unwrap().unwrap();
    drop(r.node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_disk_crashed_rejoins_with_nothing_acknowledged_lost() {
    let (peers, sims, mut nodes) = start_three().await;
    stop(nodes[1].take().unwrap()).await;
    let endpoints: Vec<String> = peers.values().cloned().collect();
    let base = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let mut history = workload(endpoints.clone(), 4, 60, 5, done, base).await;
    // The power cut on node 3, right after the last acknowledgement.
    let image = sims[2].crash(CrashPolicy::DropUnsynced);
    for i in [2, 0] {
        stop(nodes[i].take().unwrap()).await;
    }
    let n2 = start(2, &sims[1], &peers).await;
    let n3 = start(3, &image, &peers).await;
    // Nodes 2 and 3 elect a leader and answer for every key.
    let live = vec![peers[&2].clone(), peers[&3].clone()];
    let mut client = Client::new(&live, 1).unwrap();
    client.deadline = Duration::from_secs(30);
    for k in 0..5 {
        history.push(recorded_read(&mut client, &format!("key-{k}"), base).await);
    }
    let acked = acknowledged_writes(&history);
    assert!(acked > 50, "only {acked} writes acknowledged");
    assert_eq!(check_histories(&history), 5);
    stop(n3).await;
    stop(n2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_power_cut_on_every_node_at_once_loses_nothing_acknowledged() {
    power_cut_everywhere(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_flushes_lag_its_followers_loses_nothing_acknowledged_in_a_power_cut() {
    power_cut_everywhere(Some(Duration::from_millis(300))).await;
}

/// The leader, as node 1's metrics name it.
async fn leader_of(node: &raftkv::Node) -> u64 {
    use openraft::async_runtime::WatchReceiver;
    let mut rx = node.raft.metrics();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(l) = rx.borrow_watched().current_leader {
            return l;
        }
        assert!(Instant::now() < deadline, "no leader in 20 s");
        let _ = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
    }
}

/// A power cut on all three nodes right after the last acknowledgement;
/// `leader_sync`: every sync of the leader's disk takes this long (its
/// log's flushes lag its followers').
async fn power_cut_everywhere(leader_sync: Option<Duration>) {
    let (peers, sims, mut nodes) = start_three().await;
    if let Some(d) = leader_sync {
        let leader = leader_of(&nodes[0].as_ref().unwrap().node).await;
        sims[leader as usize - 1].set_sync_latency(d);
    }
    let endpoints: Vec<String> = peers.values().cloned().collect();
    let base = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let mut history = workload(endpoints.clone(), 4, 60, 5, done, base).await;
    // The power cut everywhere, right after the last acknowledgement: what
    // each disk kept is what it had synced.
    let images: Vec<SimVfs> = sims
        .iter()
        .map(|s| s.crash(CrashPolicy::DropUnsynced))
        .collect();
    for n in &mut nodes {
        stop(n.take().unwrap()).await;
    }
    let mut restarted = Vec::new();
    for id in 1..=3u64 {
        restarted.push(start(id, &images[id as usize - 1], &peers).await);
    }
    let mut client = Client::new(&endpoints, 1).unwrap();
    client.deadline = Duration::from_secs(30);
    for k in 0..5 {
        history.push(recorded_read(&mut client, &format!("key-{k}"), base).await);
    }
    let acked = acknowledged_writes(&history);
    assert!(acked > 50, "only {acked} writes acknowledged");
    assert_eq!(check_histories(&history), 5);
    for r in restarted {
        stop(r).await;
    }
}
