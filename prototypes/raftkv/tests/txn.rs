//! Revisions and transactions in the state machine: every change takes
//! the store's next revision, every key carries its create and mod
//! revisions and its version; a transaction's comparisons are evaluated
//! when it is applied, against the batch's own earlier writes too, so two
//! compare-and-sets from one revision never both win; a retry is answered
//! as it was decided; stores of older formats are refused.

mod common;

use common::V::{Applied, CompareFailed, Duplicate};
use common::{kv_of, vs};
use journal_core::vfs::{SimVfs, Vfs};
use raftkv::kv::{RequestOp, TxnRequest};
use raftkv::machine::Error;
use raftkv::{Command, Expect, RequestId, StateMachine, ToCompare};
use std::sync::Arc;

fn options() -> kvstore::Options {
    kvstore::Options {
        checkpoint_interval: None,
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 256 << 10,
            preallocate_ahead: 1,
            ..kvstore::Options::default().journal
        },
        ..kvstore::Options::default()
    }
}

fn open(vfs: Arc<dyn Vfs>) -> Result<StateMachine, Error> {
    StateMachine::open(vfs, "/node/state", options())
}

use common::batch_entry as entry;

fn put(key: &str, v: &str) -> Command {
    Command::put(key, v, None)
}

fn put_op(key: &str, v: &str) -> RequestOp {
    match put(key, v) {
        Command::Kv { op, .. } => op,
        _ => unreachable!(),
    }
}

fn del_op(key: &str) -> RequestOp {
    match Command::delete(key, None) {
        Command::Kv { op, .. } => op,
        _ => unreachable!(),
    }
}

/// Sets `key` to `v` if it was last changed at `r`.
fn cas(key: &str, r: i64, v: &str, id: Option<RequestId>) -> Command {
    Command::txn(
        TxnRequest {
            compare: vec![Expect::ModRevision(r).compare(key.as_bytes())],
            success: vec![put_op(key, v)],
            failure: Vec::new(),
        },
        id,
    )
}

/// (create, mod, version) of `key`.
fn revs(sm: &StateMachine, key: &str) -> Option<(i64, i64, i64)> {
    kv_of(sm, key).map(|kv| (kv.create_revision, kv.mod_revision, kv.version))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_follow_creates_puts_and_deletes() {
    let sm = open(Arc::new(SimVfs::new())).unwrap();
    assert_eq!(sm.revisions().current, 1, "a new store is at revision 1");
    sm.apply_all([entry(1, vec![put("k", "a"), put("j", "x")])])
        .await
        .unwrap();
    assert_eq!(revs(&sm, "k"), Some((2, 2, 1)));
    assert_eq!(revs(&sm, "j"), Some((3, 3, 1)));
    // An overwrite keeps the create revision, in the same entry too.
    sm.apply_all([entry(2, vec![put("k", "b"), put("k", "c")])])
        .await
        .unwrap();
    assert_eq!(revs(&sm, "k"), Some((2, 5, 3)));
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"c"[..]));
    // A delete takes a revision; a delete of nothing takes none; a put
    // after a delete creates the key again, version 1.
    let out = sm
        .apply_all([entry(
            3,
            vec![
                Command::delete("k", None),
                Command::delete("k", None),
                put("k", "d"),
            ],
        )])
        .await
        .unwrap();
    let revisions: Vec<i64> = out[0]
        .verdicts
        .iter()
        .map(|v| match v {
            raftkv::Verdict::Applied { revision, .. } => *revision,
            v => panic!("{v:?}"),
        })
        .collect();
    assert_eq!(revisions, [6, 6, 7]);
    assert_eq!(revs(&sm, "k"), Some((7, 7, 1)));
    let page = sm.range_page((&[0], &[0]), None, 0, (10, 1 << 20)).unwrap();
    let mods: Vec<_> = page.kvs.iter().map(|kv| kv.mod_revision).collect();
    assert_eq!(mods, [3, 7]);
    assert_eq!(page.revision, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_compare_and_sets_from_one_revision_never_both_win() {
    let sm = open(Arc::new(SimVfs::new())).unwrap();
    sm.apply_all([entry(1, vec![put("k", "a")])]).await.unwrap();
    let r = 2;
    // In one entry (the second sees the first's uncommitted write), and in
    // the next.
    let out = sm
        .apply_all([
            entry(2, vec![cas("k", r, "b", None), cas("k", r, "c", None)]),
            entry(3, vec![cas("k", r, "d", None), cas("k", 3, "e", None)]),
        ])
        .await
        .unwrap();
    assert_eq!(vs(&out[0]), [Applied, CompareFailed]);
    assert_eq!(vs(&out[1]), [CompareFailed, Applied]);
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"e"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_applies_one_branch_whole() {
    let sm = open(Arc::new(SimVfs::new())).unwrap();
    sm.apply_all([entry(1, vec![put("a", "1")])]).await.unwrap();
    let txn = |expect: Vec<(&str, Expect)>| {
        Command::txn(
            TxnRequest {
                compare: expect
                    .iter()
                    .map(|(k, e)| e.compare(k.as_bytes()))
                    .collect(),
                success: vec![put_op("b", "yes"), del_op("a")],
                failure: vec![put_op("c", "no")],
            },
            None,
        )
    };
    let failing = txn(vec![
        ("a", Expect::Value(b"1".to_vec())),
        ("b", Expect::Present),
    ]);
    let holding = txn(vec![
        ("a", Expect::Value(b"1".to_vec())),
        ("b", Expect::Absent),
    ]);
    let out = sm
        .apply_all([entry(2, vec![failing]), entry(3, vec![holding])])
        .await
        .unwrap();
    assert_eq!(vs(&out[0]), [CompareFailed]);
    assert_eq!(vs(&out[1]), [Applied]);
    assert_eq!(sm.get(b"a").unwrap(), None);
    assert_eq!(sm.get(b"b").unwrap().as_deref(), Some(&b"yes"[..]));
    assert_eq!(sm.get(b"c").unwrap().as_deref(), Some(&b"no"[..]));
    // One revision for a whole branch: c at 3, b and a's deletion at 4.
    assert_eq!(revs(&sm, "c"), Some((3, 3, 1)));
    assert_eq!(revs(&sm, "b"), Some((4, 4, 1)));
    assert_eq!(sm.revisions().current, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_compare_and_set_gets_its_first_answer() {
    let sim = SimVfs::new();
    let sm = open(Arc::new(sim.clone())).unwrap();
    let id = |seq| Some(RequestId { client: 5, seq });
    sm.apply_all([entry(1, vec![put("k", "a")])]).await.unwrap();
    let out = sm
        .apply_all([entry(2, vec![put("k", "b"), cas("k", 2, "c", id(1))])])
        .await
        .unwrap();
    assert_eq!(vs(&out[0]), [Applied, CompareFailed]);
    // Retried after a restart, once the key holds the revision it
    // expected... it cannot: revisions are never given twice. Retried
    // anyway: still the first answer (the store at revision 3 then), and
    // nothing written.
    sm.close().unwrap();
    drop(sm);
    let sm = open(Arc::new(sim)).unwrap();
    let out = sm
        .apply_all([entry(3, vec![put("k", "a"), cas("k", 4, "c", id(1))])])
        .await
        .unwrap();
    let first = Duplicate {
        revision: 3,
        succeeded: false,
    };
    assert_eq!(vs(&out[0]), [Applied, first]);
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"a"[..]));
}

/// Writes a store of format `format` (1: no format record, raw values).
fn old_store(vfs: &Arc<dyn Vfs>, format: Option<u32>) {
    vfs.create_dir_all("/node/state".as_ref()).unwrap();
    let f = vfs
        .open(
            "/node/state/CURRENT".as_ref(),
            journal_core::vfs::OpenOptions::create(),
        )
        .unwrap();
    f.write_at(b"sm-0\n", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let store = kvstore::Store::open_with(vfs.clone(), "/node/state/sm-0", options()).unwrap();
    store.put(b"m/applied", &[0, 0]).unwrap();
    store.put(b"ukey", b"raw value").unwrap();
    if let Some(v) = format {
        store.put(b"m/format", &v.to_le_bytes()).unwrap();
    }
    store.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_of_older_formats_are_refused() {
    for (format, want) in [(None, 1), (Some(3), 3)] {
        let vfs: Arc<dyn Vfs> = Arc::new(SimVfs::new());
        old_store(&vfs, format);
        match open(vfs.clone()) {
            Err(Error::OldFormat(v)) => assert_eq!(v, want),
            r => panic!("format {want}: {r:?}"),
        }
    }
    // A new directory gets the format at once, and opens again.
    let vfs: Arc<dyn Vfs> = Arc::new(SimVfs::new());
    let sm = StateMachine::open(vfs.clone(), "/other", options()).unwrap();
    sm.close().unwrap();
    drop(sm);
    StateMachine::open(vfs, "/other", options()).unwrap();
}
