//! Revisions and transactions in the state machine: every key carries its
//! create and modification revisions; a transaction's comparisons are
//! evaluated when it is applied, against the batch's own earlier writes
//! too, so two compare-and-sets from one revision never both win; a retry
//! is answered as it was decided; a store of the format before revisions
//! is refused.

mod common;

use journal_core::vfs::{SimVfs, Vfs};
use raftkv::machine::{Error, KeyMeta};
use raftkv::Verdict::{Applied, CompareFailed, Duplicate};
use raftkv::{Command, Compare, Expect, RequestId, Revision, StateMachine, TxnOp};
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

fn rev(index: u64, sub: u32) -> Revision {
    Revision { index, sub }
}

fn put(key: &str, v: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: v.into(),
        id: None,
    }
}

/// Sets `key` to `v` if it was last put at `r`.
fn cas(key: &str, r: Revision, v: &str, id: Option<RequestId>) -> Command {
    Command::Txn {
        compares: vec![Compare {
            key: key.into(),
            expect: Expect::ModRevision(r),
        }],
        success: vec![TxnOp::Put {
            key: key.into(),
            value: v.into(),
            lease: None,
        }],
        failure: Vec::new(),
        id,
    }
}

fn meta(sm: &StateMachine, key: &str) -> Option<KeyMeta> {
    sm.entry(key.as_bytes()).unwrap().map(|(_, m)| m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_follow_creates_puts_and_deletes() {
    let sm = open(Arc::new(SimVfs::new())).unwrap();
    let del = Command::Delete {
        key: b"k".to_vec(),
        id: None,
    };
    sm.apply_all([entry(1, vec![put("k", "a"), put("j", "x")])])
        .await
        .unwrap();
    let created = KeyMeta {
        create: rev(1, 0),
        modified: rev(1, 0),
        lease: None,
    };
    assert_eq!(meta(&sm, "k"), Some(created));
    assert_eq!(meta(&sm, "j").unwrap().modified, rev(1, 1));
    // An overwrite keeps the create revision, in the same entry too.
    sm.apply_all([entry(2, vec![put("k", "b"), put("k", "c")])])
        .await
        .unwrap();
    assert_eq!(meta(&sm, "k").unwrap().create, rev(1, 0));
    assert_eq!(meta(&sm, "k").unwrap().modified, rev(2, 1));
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"c"[..]));
    // A put after a delete creates the key again.
    sm.apply_all([entry(3, vec![del, put("k", "d")])])
        .await
        .unwrap();
    assert_eq!(meta(&sm, "k").unwrap().create, rev(3, 1));
    let page = sm.range(b"", None, 10, 1 << 20).unwrap();
    let revs: Vec<_> = page.pairs.iter().map(|(_, _, m)| m.modified).collect();
    assert_eq!(revs, [rev(1, 1), rev(3, 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_compare_and_sets_from_one_revision_never_both_win() {
    let sm = open(Arc::new(SimVfs::new())).unwrap();
    sm.apply_all([entry(1, vec![put("k", "a")])]).await.unwrap();
    let r = rev(1, 0);
    // In one entry (the second sees the first's uncommitted write), and in
    // the next.
    let out = sm
        .apply_all([
            entry(2, vec![cas("k", r, "b", None), cas("k", r, "c", None)]),
            entry(
                3,
                vec![cas("k", r, "d", None), cas("k", rev(2, 0), "e", None)],
            ),
        ])
        .await
        .unwrap();
    assert_eq!(out[0].verdicts, [Applied, CompareFailed]);
    assert_eq!(out[1].verdicts, [CompareFailed, Applied]);
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"e"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_applies_one_branch_whole() {
    let sm = open(Arc::new(SimVfs::new())).unwrap();
    sm.apply_all([entry(1, vec![put("a", "1")])]).await.unwrap();
    let txn = |expect: Vec<(&str, Expect)>| Command::Txn {
        compares: expect
            .into_iter()
            .map(|(k, expect)| Compare {
                key: k.into(),
                expect,
            })
            .collect(),
        success: vec![
            TxnOp::Put {
                key: b"b".to_vec(),
                value: b"yes".to_vec(),
                lease: None,
            },
            TxnOp::Delete { key: b"a".to_vec() },
        ],
        failure: vec![TxnOp::Put {
            key: b"c".to_vec(),
            value: b"no".to_vec(),
            lease: None,
        }],
        id: None,
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
    assert_eq!(out[0].verdicts, [CompareFailed]);
    assert_eq!(out[1].verdicts, [Applied]);
    assert_eq!(sm.get(b"a").unwrap(), None);
    assert_eq!(sm.get(b"b").unwrap().as_deref(), Some(&b"yes"[..]));
    assert_eq!(sm.get(b"c").unwrap().as_deref(), Some(&b"no"[..]));
    assert_eq!(meta(&sm, "c").unwrap().modified, rev(2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_compare_and_set_gets_its_first_answer() {
    let sim = SimVfs::new();
    let sm = open(Arc::new(sim.clone())).unwrap();
    let id = |seq| Some(RequestId { client: 5, seq });
    sm.apply_all([entry(1, vec![put("k", "a")])]).await.unwrap();
    let out = sm
        .apply_all([entry(
            2,
            vec![put("k", "b"), cas("k", rev(1, 0), "c", id(1))],
        )])
        .await
        .unwrap();
    assert_eq!(out[0].verdicts, [Applied, CompareFailed]);
    // Retried after a restart, once the key holds the revision it
    // expected: still the first answer, and nothing written.
    sm.close().unwrap();
    drop(sm);
    let sm = open(Arc::new(sim)).unwrap();
    let out = sm
        .apply_all([entry(
            3,
            vec![put("k", "a"), cas("k", rev(3, 0), "c", id(1))],
        )])
        .await
        .unwrap();
    let first = Duplicate {
        revision: rev(2, 1),
        succeeded: false,
    };
    assert_eq!(out[0].verdicts, [Applied, first]);
    assert_eq!(sm.get(b"k").unwrap().as_deref(), Some(&b"a"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_revisions_is_refused() {
    let vfs: Arc<dyn Vfs> = Arc::new(SimVfs::new());
    // Format 1: an applied id and raw values, no format record.
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
    store.close().unwrap();
    drop(store);
    assert!(matches!(open(vfs.clone()), Err(Error::OldFormat(1))));
    // A new directory gets the format at once, and opens again.
    let sm = StateMachine::open(vfs.clone(), "/other", options()).unwrap();
    sm.close().unwrap();
    drop(sm);
    StateMachine::open(vfs, "/other", options()).unwrap();
}
