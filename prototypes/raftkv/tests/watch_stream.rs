//! The Watch service's stream logic on a history held in memory (a
//! stand-in `EtcdBackend` whose events and revisions the test sets): ids,
//! `created`, events from a past revision and then live ones, filters,
//! progress requests, cancels, duplicate ids, a watcher compacted past,
//! fragments. What the multi-version store must answer is the backend's
//! contract (`raftkv::grpc::backend`); this checks what the service makes
//! of it.

mod common;

use etcd_api::etcdserverpb as pb;
use journal_core::sync::Mutex;
use raftkv::grpc::backend::{
    Answer, BackendError, BackendResult, Event, EventKind, EventsPage, EventsRequest, KvHash,
    LeaseGrant, LeaseTtl, Revisions,
};
use raftkv::grpc::{Etcd, EtcdBackend};
use raftkv::kv::{self, KeyValue, KvError};
use raftkv::{Node, NodeOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

/// A history in memory: `(revision, event)` in order, and the revisions.
struct Memory {
    events: Mutex<Vec<(i64, Event)>>,
    revs: tokio::sync::watch::Sender<Revisions>,
}

const NO: BackendError = BackendError::Unsupported("not in this stand-in");

impl Memory {
    fn new() -> Memory {
        Memory {
            events: Mutex::new(Vec::new()),
            revs: tokio::sync::watch::Sender::new(Revisions {
                current: 1,
                compact: 0,
                physical: 0,
            }),
        }
    }

    /// Appends a revision of changes `(kind, key, value)`.
    fn commit(&self, changes: &[(EventKind, &str, &str)]) -> i64 {
        let rev = self.revs.borrow().current + 1;
        let mut ev = self.events.lock();
        for (kind, k, v) in changes {
            let prev = ev
                .iter()
                .rev()
                .find(|(_, e)| e.kv.key == k.as_bytes())
                .filter(|(_, e)| e.kind == EventKind::Put)
                .map(|(_, e)| e.kv.clone());
            let kv = KeyValue {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
                create_revision: if *kind == EventKind::Put {
                    prev.as_ref().map_or(rev, |p| p.create_revision)
                } else {
                    0
                },
                mod_revision: rev,
                version: if *kind == EventKind::Put {
                    prev.as_ref().map_or(1, |p| p.version + 1)
                } else {
                    0
                },
                lease: 0,
            };
            ev.push((
                rev,
                Event {
                    kind: *kind,
                    kv,
                    prev_kv: prev,
                },
            ));
        }
        drop(ev);
        self.revs.send_modify(|r| r.current = rev);
        rev
    }
}

impl EtcdBackend for Memory {
    async fn range(&self, _: kv::RangeRequest) -> BackendResult<Answer<kv::RangeResponse>> {
        Err(NO)
    }
    async fn put(&self, _: kv::PutRequest) -> BackendResult<Answer<kv::PutResponse>> {
        Err(NO)
    }
    async fn delete_range(
        &self,
        _: kv::DeleteRangeRequest,
    ) -> BackendResult<Answer<kv::DeleteRangeResponse>> {
        Err(NO)
    }
    async fn txn(&self, _: kv::TxnRequest) -> BackendResult<Answer<kv::TxnResponse>> {
        Err(NO)
    }
    async fn compact(&self, revision: i64, _: bool) -> BackendResult<i64> {
        self.revs.send_modify(|r| r.compact = revision);
        Ok(self.revs.borrow().current)
    }
    async fn events(&self, req: EventsRequest) -> BackendResult<EventsPage> {
        let r = *self.revs.borrow();
        if req.from < r.compact {
            return Err(KvError::Compacted {
                compact_revision: r.compact,
            }
            .into());
        }
        let ev = self.events.lock();
        let mut events = Vec::new();
        let mut next = r.current + 1;
        for (rev, e) in ev.iter().filter(|(rev, _)| *rev >= req.from) {
            if events.len() >= req.limit && events.last().is_some_and(|(last, _)| last != rev) {
                next = *rev;
                break;
            }
            if kv::in_range(&e.kv.key, &req.key, &req.range_end) {
                let mut e = e.clone();
                if !req.prev_kv {
                    e.prev_kv = None;
                }
                events.push((*rev, e));
            }
        }
        Ok(EventsPage {
            events: events.into_iter().map(|(_, e)| e).collect(),
            next,
            revision: r.current,
        })
    }
    fn revisions(&self) -> tokio::sync::watch::Receiver<Revisions> {
        self.revs.subscribe()
    }
    async fn hash_kv(&self, _: i64) -> BackendResult<KvHash> {
        Err(NO)
    }
    async fn lease_grant(&self, _: i64, _: i64) -> BackendResult<Answer<LeaseGrant>> {
        Err(NO)
    }
    async fn lease_revoke(&self, _: i64) -> BackendResult<Answer<()>> {
        Err(NO)
    }
    async fn lease_keep_alive(&self, _: i64) -> BackendResult<i64> {
        Err(NO)
    }
    async fn lease_time_to_live(&self, _: i64, _: bool) -> BackendResult<LeaseTtl> {
        Err(NO)
    }
    async fn lease_leases(&self) -> BackendResult<Vec<i64>> {
        Err(NO)
    }
    fn db_size(&self) -> BackendResult<(i64, i64)> {
        Ok((0, 0))
    }
}

/// A one-node raftkv (for the headers and its limits) and the services
/// on a history in memory.
async fn services(dir: &std::path::Path) -> (Arc<Etcd<Memory>>, Arc<Memory>) {
    let addr = format!("127.0.0.1:{}", common::free_port());
    let mut o = NodeOptions::new(1, dir, addr.clone());
    o.peers = BTreeMap::from([(1, addr)]);
    o.init = true;
    let node = Arc::new(Node::start(o).await.unwrap());
    let mem = Arc::new(Memory::new());
    (Arc::new(Etcd::new(node, mem.clone())), mem)
}

type Answers = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::WatchResponse, tonic::Status>> + Send>,
>;

async fn next(a: &mut Answers) -> pb::WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), a.next())
        .await
        .expect("an answer within 10 s")
        .expect("the stream goes on")
        .expect("no error")
}

fn create(key: &str, f: impl FnOnce(&mut pb::WatchCreateRequest)) -> pb::WatchRequest {
    let mut c = pb::WatchCreateRequest {
        key: key.as_bytes().to_vec(),
        ..Default::default()
    };
    f(&mut c);
    pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(c)),
    }
}

fn summary(r: &pb::WatchResponse) -> Vec<String> {
    r.events
        .iter()
        .map(|e| {
            let kv = e.kv.clone().unwrap_or_default();
            let prev = e
                .prev_kv
                .as_ref()
                .map(|p| String::from_utf8_lossy(&p.value).into_owned());
            format!(
                "{}{} {}={} @{} prev {:?}",
                if e.r#type == 0 { "PUT" } else { "DEL" },
                "",
                String::from_utf8_lossy(&kv.key),
                String::from_utf8_lossy(&kv.value),
                kv.mod_revision,
                prev
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_get_the_past_then_the_new_changes_filtered_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, mem) = services(dir.path()).await;
    use EventKind::{Delete as D, Put as P};
    mem.commit(&[(P, "a", "1")]); // 2
    mem.commit(&[(P, "a", "2"), (P, "b", "x")]); // 3
    mem.commit(&[(D, "a", "")]); // 4
    let (tx, rx) = mpsc::channel(8);
    let svc = raftkv::grpc::watch::WatchService(etcd.clone());
    let mut a: Answers = svc
        .open_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok))
        .await
        .unwrap();
    // From revision 2 with previous values: three events, in order.
    tx.send(create("a", |c| {
        c.start_revision = 2;
        c.prev_kv = true;
    }))
    .await
    .unwrap();
    let r = next(&mut a).await;
    assert!(r.created && r.watch_id == 0 && !r.canceled);
    assert_eq!(
        r.header.as_ref().unwrap().revision,
        4,
        "created at the store's revision"
    );
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let r = next(&mut a).await;
        assert_eq!(r.watch_id, 0);
        seen.extend(summary(&r));
    }
    assert_eq!(
        seen,
        [
            "PUT a=1 @2 prev None",
            "PUT a=2 @3 prev Some(\"1\")",
            "DEL a= @4 prev Some(\"2\")"
        ]
    );
    // A prefix watcher from now on, deletes filtered out; the next id.
    tx.send(create("", |c| {
        c.range_end = vec![0];
        c.filters = vec![pb::watch_create_request::FilterType::Nodelete as i32];
    }))
    .await
    .unwrap();
    let r = next(&mut a).await;
    assert!(r.created && r.watch_id == 1);
    mem.commit(&[(P, "a", "3"), (D, "b", "")]); // 5
    let mut by_id: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    while by_id.values().map(Vec::len).sum::<usize>() < 2 {
        let r = next(&mut a).await;
        by_id.entry(r.watch_id).or_default().extend(summary(&r));
    }
    assert_eq!(by_id[&0], ["PUT a=3 @5 prev None"]);
    assert_eq!(
        by_id[&1],
        ["PUT a=3 @5 prev None"],
        "the delete of b filtered out"
    );
    // A progress request: answered once every watcher is caught up, with
    // the store's revision.
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::ProgressRequest(
            pb::WatchProgressRequest {},
        )),
    })
    .await
    .unwrap();
    let r = next(&mut a).await;
    assert_eq!((r.watch_id, r.events.len()), (-1, 0));
    assert_eq!(r.header.unwrap().revision, 5);
    // A duplicate id is refused; a cancel is answered.
    tx.send(create("z", |c| c.watch_id = 1)).await.unwrap();
    let r = next(&mut a).await;
    assert!(r.created && r.canceled && r.watch_id == -1, "{r:?}");
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CancelRequest(
            pb::WatchCancelRequest { watch_id: 1 },
        )),
    })
    .await
    .unwrap();
    let r = next(&mut a).await;
    assert!(r.canceled && r.watch_id == 1);
    mem.commit(&[(P, "q", "only watcher 0 ignores it")]); // 6
    mem.commit(&[(P, "a", "4")]); // 7
    let r = next(&mut a).await;
    assert_eq!(
        (r.watch_id, summary(&r)),
        (0, vec!["PUT a=4 @7 prev Some(\"3\")".to_owned()]),
        "watcher 1 is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_behind_the_compaction_is_told_and_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, mem) = services(dir.path()).await;
    for v in ["1", "2", "3"] {
        mem.commit(&[(EventKind::Put, "k", v)]);
    }
    mem.compact(3, false).await.unwrap();
    let (tx, rx) = mpsc::channel(8);
    let svc = raftkv::grpc::watch::WatchService(etcd.clone());
    let mut a: Answers = svc
        .open_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok))
        .await
        .unwrap();
    tx.send(create("k", |c| c.start_revision = 2))
        .await
        .unwrap();
    assert!(next(&mut a).await.created);
    let r = next(&mut a).await;
    assert!(r.canceled, "{r:?}");
    assert_eq!(r.compact_revision, 3);
    assert_eq!(
        r.cancel_reason,
        "etcdserver: mvcc: required revision has been compacted"
    );
    // From the compaction on it is served.
    tx.send(create("k", |c| c.start_revision = 3))
        .await
        .unwrap();
    assert!(next(&mut a).await.created);
    let r = next(&mut a).await;
    assert_eq!(
        summary(&r),
        ["PUT k=2 @3 prev None", "PUT k=3 @4 prev None"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_revision_is_fragmented_for_a_watcher_that_asks() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, mem) = services(dir.path()).await;
    let big = "x".repeat(600 << 10);
    let changes: Vec<(EventKind, String, &str)> = (0..5)
        .map(|i| (EventKind::Put, format!("f{i}"), big.as_str()))
        .collect();
    let changes: Vec<(EventKind, &str, &str)> = changes
        .iter()
        .map(|(k, key, v)| (*k, key.as_str(), *v))
        .collect();
    let (tx, rx) = mpsc::channel(8);
    let svc = raftkv::grpc::watch::WatchService(etcd.clone());
    let mut a: Answers = svc
        .open_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok))
        .await
        .unwrap();
    tx.send(create("f", |c| {
        c.range_end = kv::prefix_end(b"f");
        c.fragment = true;
    }))
    .await
    .unwrap();
    assert!(next(&mut a).await.created);
    let rev = mem.commit(&changes);
    let mut events = 0;
    let mut pieces = 0;
    loop {
        let r = next(&mut a).await;
        pieces += 1;
        events += r.events.len();
        assert!(r
            .events
            .iter()
            .all(|e| e.kv.as_ref().unwrap().mod_revision == rev));
        if !r.fragment {
            break;
        }
    }
    assert_eq!(events, 5);
    assert!(pieces >= 3, "{pieces} pieces");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_answer_comes_after_every_event_up_to_its_revision() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, mem) = services(dir.path()).await;
    for v in ["1", "2", "3"] {
        mem.commit(&[(EventKind::Put, "k", v)]);
    }
    // Both requests wait before the stream starts: the watcher is behind
    // when the progress request is read.
    let (tx, rx) = mpsc::channel(8);
    tx.send(create("k", |c| c.start_revision = 2))
        .await
        .unwrap();
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::ProgressRequest(
            pb::WatchProgressRequest {},
        )),
    })
    .await
    .unwrap();
    let svc = raftkv::grpc::watch::WatchService(etcd.clone());
    let mut a: Answers = svc
        .open_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok))
        .await
        .unwrap();
    assert!(next(&mut a).await.created);
    let mut events = 0;
    loop {
        let r = next(&mut a).await;
        if r.watch_id == -1 {
            assert_eq!(events, 3, "the progress answer came before the events");
            assert_eq!(r.header.unwrap().revision, 4);
            break;
        }
        events += r.events.len();
    }
}
