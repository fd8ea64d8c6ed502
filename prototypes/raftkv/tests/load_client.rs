//! The load client of `raftkv-tools bench` and `compare` (etcd's gRPC
//! API through etcd-api's stubs) against a 3-node raftkv: a keyspace
//! loaded, then random puts and linearizable reads of it on every member
//! (round robin) with no failure, and watchers on the keys' prefix that
//! receive every acknowledged put.

mod common;

use common::Cluster;
use raftkv_tools::bench::{load, prefix, run_level, Op, Workload};
use raftkv_tools::compare::Watchers;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_reads_and_watchers_on_every_member() {
    let c = Cluster::start(3, &[]);
    c.leader(None).await;
    let endpoints = c.endpoints();
    let keys = 300;
    load(&endpoints, keys, 64, 6, None).await.unwrap();
    let watchers = Watchers::start(&endpoints, 3, 0, prefix(keys))
        .await
        .unwrap();
    let before = watchers.counts();
    let w = Workload {
        value_size: 64,
        keys,
        rotation: 1,
    };
    let second = Duration::from_secs(1);
    let puts = run_level(Op::Put, &endpoints, 6, w, second, None)
        .await
        .unwrap();
    assert_eq!((puts.failed, puts.first_error.as_deref()), (0, None));
    assert!(puts.ops > 0 && puts.revision > 0, "{puts:?}");
    let seen = watchers
        .stats(&before, puts.ops, puts.seconds, puts.revision)
        .await;
    assert!(seen.errors.is_empty(), "{seen:?}");
    assert!(seen.lag_ms.is_some(), "the watchers caught up: {seen:?}");
    // Every acknowledged put reached every watcher, once; none came
    // before the puts began.
    let after = watchers.counts();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a - b, puts.ops, "{seen:?}");
    }
    // Reads of keys of the keyspace find them (one that did not would
    // count as failed).
    let gets = run_level(Op::Get, &endpoints, 6, w, second, None)
        .await
        .unwrap();
    assert_eq!((gets.failed, gets.first_error.as_deref()), (0, None));
    assert!(gets.ops > 0 && gets.revision >= puts.revision, "{gets:?}");
    // A read of a key outside it is a failure.
    let missing = Workload {
        keys: keys * 1000,
        ..w
    };
    let gets = run_level(Op::Get, &endpoints, 1, missing, second, None)
        .await
        .unwrap();
    assert!(gets.failed > 0, "{gets:?}");
}
