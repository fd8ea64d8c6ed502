//! Leases: granted, kept alive and expired by the clock in the log, or
//! revoked; the keys attached to a lease are deleted with it (with their
//! watch events), a key put again without it is let go, a put naming a
//! lease that is gone is refused whole; the table survives a restart.
//! Then the same over HTTP.

mod common;

use common::Cluster;
use journal_core::vfs::SimVfs;
use openraft::impls::leader_id_adv::LeaderId;
use openraft::{EntryPayload, LogId};
type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;
use raftkv::api::LeaseReply;
use raftkv::machine::{lease_id, Change, Position};
use raftkv::Verdict::{Applied, LeaseFull, LeaseNotFound};
use raftkv::{Batch, Command, Revision, StateMachine, TxnOp};
use std::sync::Arc;

fn entry(index: u64, now_ms: u64, cmds: Vec<Command>) -> Entry {
    let clock = Command::Clock {
        now_ms,
        session_ttl_ms: u64::MAX,
    };
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(Batch(std::iter::once(clock).chain(cmds).collect())),
    }
}

fn put(key: &str, lease: Option<u64>) -> Command {
    Command::Txn {
        compares: Vec::new(),
        success: vec![TxnOp::Put {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
        }],
        failure: Vec::new(),
        id: None,
    }
}

fn grant(ttl_ms: u64) -> Command {
    Command::LeaseGrant { ttl_ms, id: None }
}

/// The state machine on `sim` (opened again after a close).
fn open(sim: &SimVfs) -> StateMachine {
    StateMachine::open(
        Arc::new(sim.clone()),
        "/n/state",
        kvstore::Options::default(),
    )
    .unwrap()
}

fn has(sm: &StateMachine, key: &str) -> bool {
    sm.get(key.as_bytes()).unwrap().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_takes_its_keys_with_it_when_it_expires() {
    let sim = SimVfs::new();
    let sm = open(&sim);
    sm.keep_events(raftkv::machine::SUGGESTED_RETENTION);
    // Granted at 1,000 ms for 5 s: lease 1.1.
    let lease = lease_id(Revision { index: 1, sub: 1 });
    let out = sm
        .apply_all([entry(
            1,
            1_000,
            vec![
                grant(5_000),
                put("k1", Some(lease)),
                put("k2", Some(lease)),
                put("k3", None),
            ],
        )])
        .await
        .unwrap();
    assert_eq!(out[0].verdicts, [Applied; 5]);
    assert_eq!(sm.entry(b"k1").unwrap().unwrap().1.lease, Some(lease));
    // A put naming a lease that never was: refused, nothing written.
    let out = sm
        .apply_all([entry(2, 2_000, vec![put("k4", Some(lease + 1))])])
        .await
        .unwrap();
    assert_eq!(out[0].verdicts, [Applied, LeaseNotFound]);
    assert!(!has(&sm, "k4"));
    // Kept alive at 4,000 (deadline 9,000); k2 put again without it.
    let keep = Command::LeaseKeepAlive { lease, id: None };
    sm.apply_all([entry(3, 4_000, vec![keep, put("k2", None)])])
        .await
        .unwrap();
    assert_eq!(sm.entry(b"k2").unwrap().unwrap().1.lease, None);
    // Across a restart, still held at 8,000.
    sm.close().unwrap();
    drop(sm);
    let sm = open(&sim);
    sm.keep_events(raftkv::machine::SUGGESTED_RETENTION);
    assert_eq!(sm.leases(), 1);
    sm.apply_all([entry(4, 8_000, vec![])]).await.unwrap();
    assert!(has(&sm, "k1"));
    // Past its deadline: gone with k1, at the clock's revision.
    sm.apply_all([entry(5, 9_500, vec![])]).await.unwrap();
    assert_eq!(sm.leases(), 0);
    assert!(!has(&sm, "k1") && has(&sm, "k2") && has(&sm, "k3"));
    let from = Position {
        revision: Revision { index: 5, sub: 0 },
        n: 0,
    };
    let page = sm.events(from, b"", 10, 10).unwrap();
    let deleted: Vec<_> = page
        .events
        .iter()
        .map(|e| (e.key.as_slice(), e.change.clone()))
        .collect();
    assert_eq!(deleted, [(&b"k1"[..], Change::Delete)]);
    // Gone: keeping it alive or revoking it is refused.
    let out = sm
        .apply_all([entry(
            6,
            9_600,
            vec![
                Command::LeaseKeepAlive { lease, id: None },
                Command::LeaseRevoke { lease, id: None },
            ],
        )])
        .await
        .unwrap();
    assert_eq!(out[0].verdicts, [Applied, LeaseNotFound, LeaseNotFound]);
    // A revoke deletes a lease's keys at once.
    let second = lease_id(Revision { index: 7, sub: 1 });
    sm.apply_all([
        entry(7, 10_000, vec![grant(60_000), put("r", Some(second))]),
        entry(
            8,
            10_001,
            vec![Command::LeaseRevoke {
                lease: second,
                id: None,
            }],
        ),
    ])
    .await
    .unwrap();
    assert!(!has(&sm, "r"));
    assert_eq!(sm.leases(), 0);
}

/// A lease's keys are read from the store when it ends, not kept in
/// memory: a revoke in the same entry as changes to its keys sees them
/// (a key moved off it survives, a key just attached goes), and the count
/// that bounds a lease survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_sees_its_own_entrys_changes_and_the_bound_holds() {
    let sim = SimVfs::new();
    let mut sm = open(&sim);
    let lease = lease_id(Revision { index: 1, sub: 1 });
    let mut first = vec![grant(60_000)];
    first.extend((0..5).map(|i| put(&format!("a{i}"), Some(lease))));
    sm.apply_all([entry(1, 1_000, first)]).await.unwrap();
    let revoke = Command::LeaseRevoke { lease, id: None };
    let out = sm
        .apply_all([entry(
            2,
            1_001,
            vec![put("a1", None), put("b", Some(lease)), revoke],
        )])
        .await
        .unwrap();
    assert_eq!(out[0].verdicts, [Applied; 4]);
    let left: Vec<bool> = ["a0", "a1", "a2", "a3", "a4", "b"]
        .iter()
        .map(|k| has(&sm, k))
        .collect();
    assert_eq!(left, [false, true, false, false, false, false]);
    // The bound: a full lease refuses a new key, whole, but takes its own
    // again; after a restart too (the count is rebuilt from the store).
    let full = lease_id(Revision { index: 3, sub: 1 });
    sm.apply_all([entry(3, 2_000, vec![grant(60_000)])])
        .await
        .unwrap();
    let n = raftkv::machine::MAX_LEASE_KEYS;
    let mut index = 4;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let cmds = chunk
            .iter()
            .map(|i| put(&format!("f{i:05}"), Some(full)))
            .collect();
        let out = sm.apply_all([entry(index, 2_000, cmds)]).await.unwrap();
        assert!(out[0].verdicts.iter().all(|v| *v == Applied));
        index += 1;
    }
    for restart in [false, true] {
        if restart {
            sm.close().unwrap();
            drop(sm);
            sm = open(&sim);
        }
        let out = sm
            .apply_all([entry(
                index,
                2_000,
                vec![put("over", Some(full)), put("f00007", Some(full))],
            )])
            .await
            .unwrap();
        assert_eq!(
            out[0].verdicts,
            [Applied, LeaseFull, Applied],
            "restart {restart}"
        );
        assert!(!has(&sm, "over"));
        index += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_over_http() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://{addr}{p}");
    let r = http
        .post(url("/lease"))
        .body(r#"{"ttl_s": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let lease: LeaseReply = r.json().await.unwrap();
    let r = http
        .put(url(&format!("/kv/eph?lease={}", lease.id)))
        .body("here")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let keep = url(&format!("/lease/{}/keepalive", lease.id));
    assert_eq!(http.post(&keep).send().await.unwrap().status(), 200);
    // Not kept alive any more: the key goes within about a second (the
    // leader's clock reaches the log with the next entries).
    let start = std::time::Instant::now();
    loop {
        http.put(url("/kv/tick")).body("x").send().await.unwrap();
        if http.get(url("/kv/eph")).send().await.unwrap().status() == 404 {
            break;
        }
        assert!(start.elapsed().as_secs() < 10, "the lease never expired");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(http.post(&keep).send().await.unwrap().status(), 404);
    let r = http
        .put(url(&format!("/kv/eph?lease={}", lease.id)))
        .body("again")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-raftkv-error"], "lease-not-found");
    // (These nodes keep no watch history: no watch.)
    let r = http.get(url("/watch")).send().await.unwrap();
    assert_eq!(r.status(), 501);
    for bad in [r#"{"ttl_s": 0}"#, "{}", r#"{"ttl_s": 99999999}"#] {
        let r = http.post(url("/lease")).body(bad).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
}
