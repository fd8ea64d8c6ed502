//! A leader killed (`kill -9`) right after its last acknowledged write, in
//! a cluster with one member down, and restarted before the other live
//! member could start an election: its first linearizable read must see
//! that write.
//!
//! Nothing forces the log after the last write's commit, so the restarted
//! leader reads back a committed index from before that write. openraft
//! (0.9, and 0.10 with leader restore on) would bring it back as leader in
//! its old term, whose read index `max(first entry of its term, committed)`
//! is below the write until a replication answer moves the commit index.
//! raftkv turns leader restore off (`node.rs`): the node stands for
//! election in a new term, whose blank entry comes after the write. The
//! follower is paused (`SIGSTOP`) across the restart and until the read
//! has been sent, so that a resumed leadership would take its read index
//! before any answer. The test asserts the term rose and the read index
//! the answer carries ([`INDEX_HEADER`]), not only the value, which a read
//! may get right by luck when the apply catches up before it is served.
//!
//! [`INDEX_HEADER`]: raftkv::api::INDEX_HEADER

mod common;

use common::Cluster;
use raftkv_tools::client::Client;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_reads_at_or_after_every_write_it_acknowledged() {
    // A follower waits 4 to 8 s without a heartbeat before it stands for
    // election: far longer than a restart, so a leader that resumed its
    // term would do so before anyone else stood. The read's leadership
    // check waits up to a heartbeat interval (1 s).
    let mut cluster = Cluster::start(
        3,
        &["--heartbeat-ms", "1000", "--election-timeout-ms", "4000"],
    );
    let leader = cluster.leader(None).await;
    let down = (leader + 1) % 3;
    let live = (leader + 2) % 3;
    cluster.kill9(down);

    let at_leader = [cluster.nodes[leader].addr.clone()];
    let mut client = Client::new(&at_leader, 7).unwrap();
    client.deadline = Duration::from_secs(20);
    client.put("k", b"before").await.unwrap();
    client.put("k", b"after").await.unwrap();
    let acked = client
        .last_index()
        .expect("a write's answer carries its index");
    let before = client.status(&at_leader[0]).await.unwrap();
    cluster.signal(live, "STOP");
    cluster.kill9(leader);

    cluster.spawn(leader).unwrap();
    let mut reader = client.clone();
    let read = tokio::spawn(async move {
        let value = reader.get("k", false).await.unwrap();
        (value, reader.last_index())
    });
    // The read reaches the restarted leader's core (a few ms) while the
    // follower cannot answer anything; if it came later, the test would
    // pass without the rule it guards, never fail with it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.signal(live, "CONT");
    let (value, read_index) = read.await.unwrap();
    let read_index = read_index.expect("a read's answer carries its index");
    // The restarted leader did not resume its old term: an election came
    // first.
    let after = client.status(&at_leader[0]).await.unwrap();
    assert!(
        after.term > before.term,
        "the restarted leader resumed its term {} (now {})",
        before.term,
        after.term
    );
    assert!(
        read_index >= acked,
        "read index {read_index} after a restart is below the acknowledged write at {acked}"
    );
    assert_eq!(value.as_deref(), Some(&b"after"[..]));

    // The live follower agrees, and later reads and writes go on.
    client.put("k", b"later").await.unwrap();
    let mut other = Client::new(&[cluster.nodes[live].addr.clone()], 8).unwrap();
    assert_eq!(
        other.get("k", false).await.unwrap().as_deref(),
        Some(&b"later"[..])
    );
}
