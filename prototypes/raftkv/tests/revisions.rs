//! etcd's revisions, through the node-level calls the gRPC API makes: a
//! sequence of puts, deletes, transactions, historic reads, a compaction,
//! a watch from a revision and a lease revoke, each answered with the
//! revisions, versions and payloads etcd 3.4.23 gave for the same
//! sequence (recorded once with `etcdctl -w json` against a fresh etcd:
//! the comments give each command). Then `HashKV` on three replicas, and
//! the answers of etcd's refusals.

mod common;

use journal_core::vfs::SimVfs;
use openraft::async_runtime::WatchReceiver;
use raftkv::kv::{
    self, DeleteRangeRequest, EventType, KeyValue, KvError, PutRequest, RangeRequest, RequestOp,
    ResponseOp, SortOrder, SortTarget, TxnRequest,
};
use raftkv::machine::Position;
use raftkv::{Expect, Node, NodeOptions, ToCompare};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// `n` in-process nodes on one runtime, without auto-compaction, serving
/// each other's Raft RPCs; the leader's index once every node follows it.
async fn start(n: u64) -> (Vec<Arc<Node>>, usize) {
    let peers: BTreeMap<u64, String> = (1..=n)
        .map(|id| (id, format!("127.0.0.1:{}", common::free_port())))
        .collect();
    let mut nodes = Vec::new();
    for id in 1..=n {
        let mut o = NodeOptions::new(id, "/node", peers[&id].clone());
        o.peers = peers.clone();
        o.init = id == 1;
        o.vfs = Arc::new(SimVfs::new());
        o.auto_compaction = None;
        let listener = tokio::net::TcpListener::bind(&peers[&id]).await.unwrap();
        let node = Arc::new(Node::start(o).await.unwrap());
        tokio::spawn(raftkv::serve(
            node.clone(),
            listener,
            std::future::pending(),
        ));
        nodes.push(node);
    }
    let started = std::time::Instant::now();
    loop {
        let m = nodes[0].raft.metrics().borrow_watched().clone();
        if let Some(l) = m.current_leader {
            let all = nodes
                .iter()
                .all(|n| n.raft.metrics().borrow_watched().current_leader == Some(l));
            if all {
                return (nodes, (l - 1) as usize);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kv(key: &str, create: i64, modified: i64, version: i64, value: &str) -> KeyValue {
    KeyValue {
        key: key.as_bytes().to_vec(),
        create_revision: create,
        mod_revision: modified,
        version,
        value: value.as_bytes().to_vec(),
        lease: 0,
    }
}

fn put(key: &str, value: &str) -> RequestOp {
    RequestOp::Put(PutRequest {
        key: key.into(),
        value: value.into(),
        ..PutRequest::default()
    })
}

fn del(key: &str, end: &str, prev_kv: bool) -> RequestOp {
    RequestOp::DeleteRange(DeleteRangeRequest {
        key: key.into(),
        range_end: end.into(),
        prev_kv,
    })
}

fn get(key: &str, revision: i64) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        revision,
        ..RangeRequest::default()
    }
}

/// Every key (etcd's `--from-key ""`).
fn all(revision: i64) -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision,
        ..RangeRequest::default()
    }
}

fn range_op(r: RangeRequest) -> RequestOp {
    RequestOp::Range(r)
}

/// The revision a write answers, and its answer.
async fn write(node: &Node, op: RequestOp) -> (i64, ResponseOp) {
    let (resp, header) = node.write(op).await.unwrap();
    (header.revision, resp)
}

fn deleted(r: &ResponseOp) -> (i64, Vec<KeyValue>) {
    match r {
        ResponseOp::DeleteRange(d) => (d.deleted, d.prev_kvs.clone()),
        r => panic!("{r:?}"),
    }
}

/// The sequence of the module docs, up to the compaction.
async fn before_the_compaction(node: &Node) {
    // put a 1; put b 1; put a 2
    assert_eq!(write(node, put("a", "1")).await.0, 2);
    assert_eq!(write(node, put("b", "1")).await.0, 3);
    assert_eq!(write(node, put("a", "2")).await.0, 4);
    // del a (deleted 1, revision 5); del a again (0, still 5); put a 3
    let (rev, r) = write(node, del("a", "", false)).await;
    assert_eq!((rev, deleted(&r).0), (5, 1));
    let (rev, r) = write(node, del("a", "", false)).await;
    assert_eq!((rev, deleted(&r).0), (5, 0));
    assert_eq!(write(node, put("a", "3")).await.0, 6);
    // txn mod("a") = "6" then put c 1, put d 1, del b: one revision.
    let txn = |compare: Vec<kv::Compare>, success: Vec<RequestOp>| {
        RequestOp::Txn(TxnRequest {
            compare,
            success,
            failure: Vec::new(),
        })
    };
    let t = txn(
        vec![Expect::ModRevision(6).compare(b"a")],
        vec![put("c", "1"), put("d", "1"), del("b", "", false)],
    );
    let (rev, r) = write(node, t).await;
    let ResponseOp::Txn(t) = r else { panic!() };
    assert_eq!((rev, t.succeeded, t.responses.len()), (7, true, 3));
    assert_eq!(deleted(&t.responses[2]).0, 1);
    // txn ver("a") = "5": fails, no failure branch, no revision.
    let version = |v| kv::Compare {
        result: kv::CompareResult::Equal,
        target: kv::CompareTarget::Version(v),
        key: b"a".to_vec(),
        range_end: Vec::new(),
    };
    let (rev, r) = write(node, txn(vec![version(5)], vec![put("x", "x")])).await;
    assert_eq!((rev, r), (7, ResponseOp::Txn(kv::TxnResponse::default())));
    // txn ver("a") = "1" then get a: a read, at 7.
    let (rev, r) = write(node, txn(vec![version(1)], vec![range_op(get("a", 0))])).await;
    let ResponseOp::Txn(t) = r else { panic!() };
    let ResponseOp::Range(got) = &t.responses[0] else {
        panic!()
    };
    assert_eq!((rev, &got.kvs[..]), (7, &[kv("a", 6, 6, 1, "3")][..]));
    // txn: put e 1, get e (seeing it), put a 4, at 8.
    let t = txn(
        vec![],
        vec![put("e", "1"), range_op(get("e", 0)), put("a", "4")],
    );
    let (rev, r) = write(node, t).await;
    let ResponseOp::Txn(t) = r else { panic!() };
    let ResponseOp::Range(got) = &t.responses[1] else {
        panic!()
    };
    assert_eq!((rev, &got.kvs[..]), (8, &[kv("e", 8, 8, 1, "1")][..]));
    // del c e --prev-kv: 9, two deleted with their last versions.
    let (rev, r) = write(node, del("c", "e", true)).await;
    let want = vec![kv("c", 7, 7, 1, "1"), kv("d", 7, 7, 1, "1")];
    assert_eq!((rev, deleted(&r)), (9, (2, want)));
}

async fn reads_before_the_compaction(node: &Node) {
    let read = |r: RangeRequest| async move { node.range(r).await.unwrap() };
    // get a --rev=4; --rev=5 (absent); every key at 3; every key now.
    let (r, h) = read(get("a", 4)).await;
    assert_eq!((h.revision, r.kvs), (9, vec![kv("a", 2, 4, 2, "2")]));
    assert!(read(get("a", 5)).await.0.kvs.is_empty());
    let (r, _) = read(all(3)).await;
    assert_eq!(r.kvs, [kv("a", 2, 2, 1, "1"), kv("b", 3, 3, 1, "1")]);
    assert_eq!(r.count, 2);
    let (r, _) = read(all(0)).await;
    assert_eq!(r.kvs, [kv("a", 6, 8, 2, "4"), kv("e", 8, 8, 1, "1")]);
    // put a 5 --prev-kv: 10; get a --rev=9 still the old one.
    let prev = RequestOp::Put(PutRequest {
        key: b"a".to_vec(),
        value: b"5".to_vec(),
        prev_kv: true,
        ..PutRequest::default()
    });
    let (rev, r) = write(node, prev).await;
    let want = kv::PutResponse {
        prev_kv: Some(kv("a", 6, 8, 2, "4")),
    };
    assert_eq!((rev, r), (10, ResponseOp::Put(want)));
    assert_eq!(read(get("a", 9)).await.0.kvs, [kv("a", 6, 8, 2, "4")]);
}

async fn after_the_compaction(node: &Node) {
    let read = |r: RangeRequest| async move { node.range(r).await };
    // compaction 4: 3 is gone, 4 is read.
    node.compact(4, true).await.unwrap();
    let gone = KvError::Compacted {
        compact_revision: 4,
    };
    assert_eq!(read(get("a", 3)).await.unwrap_err(), gone);
    assert_eq!(
        read(get("a", 4)).await.unwrap().0.kvs,
        [kv("a", 2, 4, 2, "2")]
    );
    // get --prefix "" --sort-by=VERSION --order=DESCEND; --limit=1.
    let sorted = RangeRequest {
        sort_order: SortOrder::Descend,
        sort_target: SortTarget::Version,
        ..all(0)
    };
    let want = [kv("a", 6, 10, 3, "5"), kv("e", 8, 8, 1, "1")];
    assert_eq!(read(sorted).await.unwrap().0.kvs, want);
    let (r, _) = read(RangeRequest { limit: 1, ..all(0) }).await.unwrap();
    assert_eq!((&r.kvs[..], r.more, r.count), (&want[..1], true, 2));
    // put f 1; del f; put f 2: created again, version 1.
    assert_eq!(write(node, put("f", "1")).await.0, 11);
    assert_eq!(write(node, del("f", "", false)).await.0, 12);
    assert_eq!(write(node, put("f", "2")).await.0, 13);
    assert_eq!(
        read(get("f", 0)).await.unwrap().0.kvs,
        [kv("f", 13, 13, 1, "2")]
    );
    // compaction 4 again, 100: refused as etcd refuses them.
    assert_eq!(node.compact(4, false).await.unwrap_err(), gone);
    assert_eq!(
        node.compact(100, false).await.unwrap_err(),
        KvError::FutureRevision
    );
}

/// `watch --rev=4 --prefix "" --prev-kv` after the compaction at 4: every
/// change from 4 on, deletions with the key and revision only, the
/// version before where it is still held.
fn the_watch_from_4(node: &Node) {
    let page = node
        .events(Position::at(4), (&[0], &[0]), true, (100, 1000))
        .unwrap();
    let got: Vec<(EventType, KeyValue, Option<KeyValue>)> = page
        .events
        .into_iter()
        .map(|(_, e)| (e.kind, e.kv, e.prev_kv))
        .collect();
    let put = |kv| (EventType::Put, kv, None);
    let with =
        |(kind, kv, _): (EventType, KeyValue, Option<KeyValue>), prev| (kind, kv, Some(prev));
    let gone = |key: &str, rev| {
        let kv = KeyValue {
            key: key.as_bytes().to_vec(),
            mod_revision: rev,
            ..KeyValue::default()
        };
        (EventType::Delete, kv, None)
    };
    let want = vec![
        put(kv("a", 2, 4, 2, "2")),
        with(gone("a", 5), kv("a", 2, 4, 2, "2")),
        put(kv("a", 6, 6, 1, "3")),
        put(kv("c", 7, 7, 1, "1")),
        put(kv("d", 7, 7, 1, "1")),
        with(gone("b", 7), kv("b", 3, 3, 1, "1")),
        put(kv("e", 8, 8, 1, "1")),
        with(put(kv("a", 6, 8, 2, "4")), kv("a", 6, 6, 1, "3")),
        with(gone("c", 9), kv("c", 7, 7, 1, "1")),
        with(gone("d", 9), kv("d", 7, 7, 1, "1")),
        with(put(kv("a", 6, 10, 3, "5")), kv("a", 6, 8, 2, "4")),
        put(kv("f", 11, 11, 1, "1")),
        with(gone("f", 12), kv("f", 11, 11, 1, "1")),
        put(kv("f", 13, 13, 1, "2")),
    ];
    assert_eq!(got, want);
    // From 3: compacted, with the compaction's revision (etcd cancels
    // the watcher with it).
    let r = node.events(Position::at(3), (&[0], &[0]), false, (10, 10));
    assert_eq!(
        r.unwrap_err(),
        KvError::Compacted {
            compact_revision: 4
        }
    );
}

async fn leases(node: &Node) {
    // lease grant (no revision); two keys on it (14, 15); revoke: both
    // deleted at one revision, 16.
    let (id, ttl, h) = node.lease_grant(0, 100).await.unwrap();
    assert_eq!((ttl, h.revision), (100, 13));
    for key in ["la", "lb"] {
        let op = RequestOp::Put(PutRequest {
            key: key.into(),
            value: b"1".to_vec(),
            lease: id,
            ..PutRequest::default()
        });
        node.write(op).await.unwrap();
    }
    let (t, _) = node.lease_time_to_live(id, true).await.unwrap();
    assert_eq!((t.granted_ttl, t.keys.len()), (100, 2));
    assert!((99..=100).contains(&t.ttl), "{t:?}");
    assert_eq!(node.lease_revoke(id).await.unwrap().revision, 16);
    assert_eq!(node.revisions().borrow().current, 16);
    assert_eq!(
        node.lease_revoke(1234).await.unwrap_err(),
        KvError::LeaseNotFound
    );
    // A client's id, taken once.
    let (id, _, _) = node.lease_grant(77, 10).await.unwrap();
    assert_eq!(id, 77);
    assert_eq!(
        node.lease_grant(77, 10).await.unwrap_err(),
        KvError::LeaseExists
    );
    assert_eq!(node.lease_leases().0, [77]);
    // put z --ignore-value on an absent key; on a present one: kept.
    let ignore = |key: &str| {
        RequestOp::Put(PutRequest {
            key: key.into(),
            ignore_value: true,
            ..PutRequest::default()
        })
    };
    assert_eq!(
        node.write(ignore("z")).await.unwrap_err(),
        KvError::KeyNotFound
    );
    assert_eq!(write(node, ignore("a")).await.0, 17);
    assert_eq!(
        node.range(get("a", 0)).await.unwrap().0.kvs,
        [kv("a", 6, 17, 4, "5")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_versions_and_answers_are_etcds() {
    let (nodes, leader) = start(1).await;
    let node = &nodes[leader];
    before_the_compaction(node).await;
    reads_before_the_compaction(node).await;
    after_the_compaction(node).await;
    the_watch_from_4(node);
    leases(node).await;
}

/// `HashKV` at one revision is equal on every replica — with a
/// compaction under way on some of them, and after it — and moves with
/// the revision hashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_is_equal_on_every_replica() {
    let (nodes, leader) = start(3).await;
    let l = &nodes[leader];
    for i in 0..300u32 {
        let op = if i % 7 == 3 {
            del(&format!("h/{}", (i * 13) % 40), "", false)
        } else {
            put(&format!("h/{}", (i * 13) % 40), &format!("{i}"))
        };
        l.write(op).await.unwrap();
    }
    l.compact(150, false).await.unwrap();
    for i in 0..50u32 {
        l.write(put(&format!("g/{i}"), "after")).await.unwrap();
    }
    let at = l.revisions().borrow().current;
    let mut hashes = Vec::new();
    for n in &nodes {
        let mut r = n.revisions();
        tokio::time::timeout(Duration::from_secs(30), r.wait_for(|r| r.current >= at))
            .await
            .unwrap()
            .unwrap();
        let (hash, compact, h) = n.hash_kv(at).await.unwrap();
        assert_eq!((compact, h.revision), (150, at));
        hashes.push(hash);
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
    // A revision earlier hashes less.
    let (earlier, _, _) = l.hash_kv(at - 1).await.unwrap();
    assert_ne!(earlier, hashes[0]);
    // Below the compaction, or to come: etcd's refusals.
    let compacted = KvError::Compacted {
        compact_revision: 150,
    };
    assert_eq!(l.hash_kv(149).await.unwrap_err(), compacted);
    assert_eq!(
        l.hash_kv(at + 1).await.unwrap_err(),
        KvError::FutureRevision
    );
}
