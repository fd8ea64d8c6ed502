//! A node whose disk fills refuses writes with a typed `507 nospace`,
//! goes on serving reads and deletes, and takes writes again once space
//! returns — without stopping (it once stopped on the full disk, and its
//! supervisor restarted it into the same full disk). On `SimVfs` with a
//! space limit.

mod common;

use journal_core::vfs::SimVfs;
use raftkv::{Node, NodeOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const RESERVE: u64 = 32 << 20;

async fn answer(r: reqwest::RequestBuilder) -> (u16, Option<String>) {
    let r = r.timeout(Duration::from_secs(20)).send().await.unwrap();
    let err = r
        .headers()
        .get(raftkv::api::ERROR_HEADER)
        .map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), err)
}

async fn status(http: &reqwest::Client, base: &str) -> raftkv::api::Status {
    http.get(format!("{base}/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_serves_reads_and_deletes_and_recovers() {
    let sim = SimVfs::new();
    let addr = format!("127.0.0.1:{}", common::free_port());
    let mut o = NodeOptions::new(1, "/node", addr.clone());
    o.peers = BTreeMap::from([(1, addr.clone())]);
    o.init = true;
    o.vfs = Arc::new(sim.clone());
    o.space_reserve = RESERVE;
    // No snapshot by bytes in this test's few MiB.
    o.snapshot_min_bytes = 1 << 40;
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    let node = Arc::new(Node::start(o).await.unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(raftkv::serve(node.clone(), listener, async {
        let _ = stopped.await;
    }));
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let mut client = raftkv_tools::client::Client::new(std::slice::from_ref(&addr), 1).unwrap();
    client.put("keep", b"kept").await.unwrap();

    // 80 MiB more than what the node holds now: the reserve is reached
    // after about 48 MiB of writes.
    sim.set_space_limit(Some(sim.space_used() + (80 << 20)));
    let value = vec![b'v'; 60 << 10];
    let mut refused = None;
    for i in 0..2_000 {
        let (code, err) = answer(http.put(format!("{base}/kv/fill{i}")).body(value.clone())).await;
        if code != 200 {
            refused = Some((i, code, err));
            break;
        }
    }
    let (i, code, err) = refused.expect("the disk never filled");
    assert_eq!((code, err.as_deref()), (507, Some("nospace")), "put {i}");
    assert!(i > 100, "refused after {i} puts only");
    let s = status(&http, &base).await;
    assert!(s.nospace);
    assert_eq!(s.error, None, "Raft still runs");

    // Writes that add data are refused; reads and deletes are served.
    for put in [
        http.put(format!("{base}/kv/more")).body("x"),
        http.post(format!("{base}/txn"))
            .body(r#"{"compare":[],"success":[{"put":{"key":"t","value":"eA=="}}],"failure":[]}"#),
        http.post(format!("{base}/lease")).body(r#"{"ttl_s":60}"#),
    ] {
        assert_eq!(answer(put).await, (507, Some("nospace".to_string())));
    }
    assert_eq!(
        client.get("keep", false).await.unwrap().as_deref(),
        Some(&b"kept"[..])
    );
    for j in 0..i.min(50) {
        let (code, _) = answer(http.delete(format!("{base}/kv/fill{j}"))).await;
        assert_eq!(code, 200, "delete fill{j}");
    }
    let (code, _) = answer(http.delete(format!("{base}/kv?prefix=fill5"))).await;
    assert_eq!(code, 200, "delete a range");
    let (code, _) = answer(
        http.post(format!("{base}/txn"))
            .body(r#"{"compare":[],"success":[{"delete":{"key":"fill60"}}],"failure":[]}"#),
    )
    .await;
    assert_eq!(code, 200, "a transaction of deletes");
    assert_eq!(client.get("fill0", false).await.unwrap(), None);

    // Space returns: writes are taken again, with no restart.
    sim.set_space_limit(None);
    let (code, _) = answer(http.put(format!("{base}/kv/more")).body("x")).await;
    assert_eq!(code, 200);
    assert!(!status(&http, &base).await.nospace);
    assert!(!served.is_finished(), "the node never stopped");
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}

/// The counter of declined snapshots, read off `/metrics`.
async fn declined(http: &reqwest::Client, base: &str) -> u64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("raftkv_snapshots_declined_total "))
        .expect("the counter is exported")
        .trim()
        .parse()
        .unwrap()
}

/// A snapshot takes about the store's size: a node whose disk has room
/// for its writes but not for a snapshot beside the reserve declines to
/// build one (it keeps its log), and builds it once room returns. (With
/// the versions compacted often, overwrites keep the store's size while
/// the bytes applied reach it, and the byte policy asks for snapshots.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_snapshot_is_built_into_the_reserve() {
    let sim = SimVfs::new();
    let addr = format!("127.0.0.1:{}", common::free_port());
    let mut o = NodeOptions::new(1, "/node", addr.clone());
    o.peers = BTreeMap::from([(1, addr.clone())]);
    o.init = true;
    o.vfs = Arc::new(sim.clone());
    o.space_reserve = 4 << 20;
    o.snapshot_min_bytes = 256 << 10;
    o.auto_compaction = Some(raftkv::autocompact::AutoCompaction::Revision {
        retention: 4,
        interval: Duration::from_millis(20),
    });
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    let node = Arc::new(Node::start(o).await.unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(raftkv::serve(node.clone(), listener, async {
        let _ = stopped.await;
    }));
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let mut client = raftkv_tools::client::Client::new(std::slice::from_ref(&addr), 1).unwrap();
    client.put("first", b"led").await.unwrap();
    let value = vec![b'v'; 16 << 10];
    let put = |i: usize| {
        let r = http
            .put(format!("{base}/kv/k{}", i % 64))
            .body(value.clone());
        answer(r)
    };
    // A store of about 1 MiB, overwritten until compactions keep its size.
    for i in 0..512 {
        assert_eq!(put(i).await, (200, None), "load {i}");
    }
    let store = node.machine.store_bytes();
    assert!(store >= 1 << 20, "a store of {store} bytes");
    // Room for the writes and the reserve, not for a snapshot beside them.
    sim.set_space_limit(Some(sim.space_used() + (4 << 20) + store * 3 / 4));
    let mut i = 0;
    while declined(&http, &base).await == 0 {
        assert!(i < 4_000, "no snapshot asked for after {i} overwrites");
        assert_eq!(put(i).await, (200, None), "overwrite {i}");
        i += 1;
    }
    let built = status(&http, &base).await.snapshot_index;
    assert!(!status(&http, &base).await.nospace);

    // Room returns: the next entries ask again, and one is built.
    sim.set_space_limit(None);
    let mut j = 0;
    while status(&http, &base).await.snapshot_index == built {
        assert!(j < 4_000, "no snapshot after room returned and {j} writes");
        assert_eq!(put(j).await.0, 200, "overwrite {j} with room");
        j += 1;
    }
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
