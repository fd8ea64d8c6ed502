//! Leases: granted, checkpointed, kept alive and revoked in the log — an
//! expiry is a revoke the leader proposes by its own clock, on an idle
//! cluster too, and a new leader extends every lease from its promotion;
//! no clock in the log ends a lease. The keys attached to a lease are
//! deleted with it (with their watch events), a key put again without it
//! is let go, a put naming a lease that is gone is refused whole; the
//! table survives a restart. Then the same over HTTP.

mod common;

use common::Cluster;
use journal_core::vfs::SimVfs;
use openraft::impls::leader_id_adv::LeaderId;
use openraft::{EntryPayload, LogId};
type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;
use common::V::{Applied, LeaseFull, LeaseNotFound};
use common::{changes, kv_of, put_leased, vs};
use raftkv::api::LeaseReply;
use raftkv::machine::lease_id;
use raftkv::{Batch, Command, StateMachine};
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

fn put(key: &str, lease: Option<i64>) -> Command {
    put_leased(key, "v", lease.unwrap_or(0))
}

/// A grant of `ttl_ms` (whole seconds) whose id apply picks.
fn grant(ttl_ms: u64) -> Command {
    Command::LeaseGrant {
        lease: 0,
        ttl_s: (ttl_ms / 1000) as i64,
        id: None,
    }
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

/// The state machine's side of a lease: granted, its remaining
/// time-to-live checkpointed and cleared by a keep-alive in the log, held
/// across a restart, and ended only by a revoke in the log — which the
/// leader proposes when the lease expires by its clock — deleting its
/// keys with their events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_takes_its_keys_with_it_when_it_is_revoked() {
    let sim = SimVfs::new();
    let sm = open(&sim);
    // Granted at index 1, position 1, for 5 s: the id picked from there.
    let lease = lease_id(1, 1);
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
    assert_eq!(vs(&out[0]), [Applied; 5]);
    assert_eq!(kv_of(&sm, "k1").unwrap().lease, lease);
    let held = sm.lease(lease).unwrap();
    assert_eq!(
        (held.ttl_ms, held.remaining_ms, held.keys),
        (5_000, None, 2)
    );
    // A put naming a lease that never was: refused, nothing written.
    let out = sm
        .apply_all([entry(2, 2_000, vec![put("k4", Some(lease + 1))])])
        .await
        .unwrap();
    assert_eq!(vs(&out[0]), [Applied, LeaseNotFound]);
    assert!(!has(&sm, "k4"));
    // The leader's checkpoint (a lease gone is passed over); k2 put again
    // without the lease.
    let checkpoint = Command::LeaseCheckpoint {
        leases: vec![(lease, 2_500), (lease + 7, 1)],
    };
    let out = sm
        .apply_all([entry(3, 4_000, vec![checkpoint, put("k2", None)])])
        .await
        .unwrap();
    assert_eq!(vs(&out[0]), [Applied; 3]);
    assert_eq!(kv_of(&sm, "k2").unwrap().lease, 0);
    assert_eq!(sm.lease(lease).unwrap().remaining_ms, Some(2_500));
    // Across a restart, held with its checkpoint; then a keep-alive in
    // the log clears it. No clock ends it, however far it goes.
    sm.close().unwrap();
    drop(sm);
    let sm = open(&sim);
    assert_eq!(sm.leases(), 1);
    let held = sm.lease(lease).unwrap();
    assert_eq!((held.remaining_ms, held.keys), (Some(2_500), 1));
    let keep = Command::LeaseKeepAlive { lease, id: None };
    sm.apply_all([entry(4, 900_000, vec![keep])]).await.unwrap();
    assert_eq!(sm.lease(lease).unwrap().remaining_ms, None);
    assert!(has(&sm, "k1"));
    // Revoked: gone with k1, at the revoke's revision (one more than the
    // store's: puts of k1, k2, k3 and k2 again took 2 to 5).
    let revoke = Command::LeaseRevoke { lease, id: None };
    sm.apply_all([entry(5, 900_001, vec![revoke])])
        .await
        .unwrap();
    assert_eq!(sm.leases(), 0);
    assert!(!has(&sm, "k1") && has(&sm, "k2") && has(&sm, "k3"));
    assert_eq!(sm.revisions().current, 6);
    assert_eq!(changes(&sm, 6), ["6.0 delete k1"]);
    // Gone: keeping it alive or revoking it is refused.
    let out = sm
        .apply_all([entry(
            6,
            900_002,
            vec![
                Command::LeaseKeepAlive { lease, id: None },
                Command::LeaseRevoke { lease, id: None },
            ],
        )])
        .await
        .unwrap();
    assert_eq!(vs(&out[0]), [Applied, LeaseNotFound, LeaseNotFound]);
}

/// A lease's keys are read from the store when it ends, not kept in
/// memory: a revoke in the same entry as changes to its keys sees them
/// (a key moved off it survives, a key just attached goes), and the count
/// that bounds a lease survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_sees_its_own_entrys_changes_and_the_bound_holds() {
    let sim = SimVfs::new();
    let mut sm = open(&sim);
    let lease = lease_id(1, 1);
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
    assert_eq!(vs(&out[0]), [Applied; 4]);
    let left: Vec<bool> = ["a0", "a1", "a2", "a3", "a4", "b"]
        .iter()
        .map(|k| has(&sm, k))
        .collect();
    assert_eq!(left, [false, true, false, false, false, false]);
    // The bound: a full lease refuses a new key, whole, but takes its own
    // again; after a restart too (the count is rebuilt from the store).
    let full = lease_id(3, 1);
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
        assert!(vs(&out[0]).iter().all(|v| *v == Applied));
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
            vs(&out[0]),
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
    // leader proposes the revoke when its timer runs out).
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
    for bad in [r#"{"ttl_s": 0}"#, "{}", r#"{"ttl_s": 99999999}"#] {
        let r = http.post(url("/lease")).body(bad).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
}

/// A new leader whose clock is an hour ahead of the last one's writes it
/// into the log: no lease may end by it. Only a revoke in the log ends a
/// lease (the leader proposes one when its own timer runs out), so a
/// clock read by one node never decides an expiry on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_in_the_log_ends_no_lease() {
    let sim = SimVfs::new();
    let sm = open(&sim);
    let lease = lease_id(1, 1);
    sm.apply_all([entry(1, 1_000, vec![grant(10_000), put("k", Some(lease))])])
        .await
        .unwrap();
    // The next leader's clock: an hour ahead.
    let mut ahead = entry(2, 3_601_000, vec![put("other", None)]);
    ahead.log_id.leader_id.term = 2;
    sm.apply_all([ahead]).await.unwrap();
    assert_eq!(sm.leases(), 1);
    assert!(has(&sm, "k"));
}

/// A lease ends on a cluster that takes no writes: the leader's timer,
/// not a write, brings its end into the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_expires_on_an_idle_cluster() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    let r = http
        .post(format!("http://{addr}/lease"))
        .body(r#"{"ttl_s": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let lease: LeaseReply = r.json().await.unwrap();
    let r = http
        .put(format!("http://{addr}/kv/idle?lease={}", lease.id))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Reads only from here on (a linearizable read writes nothing).
    let start = std::time::Instant::now();
    loop {
        let r = http
            .get(format!("http://{addr}/kv/idle"))
            .send()
            .await
            .unwrap();
        if r.status() == 404 {
            break;
        }
        assert_eq!(r.status(), 200);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "a 1 s lease still holds its key after 30 s on an idle cluster"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        http.post(format!("http://{addr}/lease/{}/keepalive", lease.id))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

/// A new leader takes the leases over: a lease kept alive just before its
/// leader died still holds its key on the next leader (extended from its
/// promotion), and expires there once no one keeps it alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_extends_a_lease_then_expires_it() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    let r = http
        .post(format!("http://{addr}/lease"))
        .body(r#"{"ttl_s": 8}"#)
        .send()
        .await
        .unwrap();
    let lease: LeaseReply = r.json().await.unwrap();
    let r = http
        .put(format!("http://{addr}/kv/held?lease={}", lease.id))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .post(format!("http://{addr}/lease/{}/keepalive", lease.id))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let renewed: LeaseReply = r.json().await.unwrap();
    assert_eq!(renewed, lease);
    cluster.kill9(leader);
    let next = cluster.leader(Some(leader)).await;
    let addr = cluster.nodes[next].addr.clone();
    let get = || http.get(format!("http://{addr}/kv/held")).send();
    assert_eq!(
        get().await.unwrap().status(),
        200,
        "expired at the takeover"
    );
    let start = std::time::Instant::now();
    while get().await.unwrap().status() == 200 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(40),
            "the next leader never expired the lease"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The leader checkpoints the remaining time-to-live of the long leases
/// into the log, and a keep-alive of a checkpointed lease goes through
/// the log to clear it (else a new leader would give the lease the older,
/// shorter remainder). One in-process node, checkpointing every 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_leases_are_checkpointed_and_a_keep_alive_clears_the_checkpoint() {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut o = raftkv::NodeOptions::new(1, "/node", addr.clone());
    o.peers = [(1, addr.clone())].into_iter().collect();
    o.init = true;
    o.vfs = Arc::new(SimVfs::new());
    o.lease_checkpoint_interval = std::time::Duration::from_millis(500);
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    let node = Arc::new(raftkv::Node::start(o).await.unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(raftkv::serve(node.clone(), listener, async {
        let _ = rx.await;
    }));
    let http = reqwest::Client::new();
    let grant = |ttl_s: u64| {
        let (http, url) = (http.clone(), format!("http://{addr}/lease"));
        async move {
            loop {
                let r = http
                    .post(&url)
                    .body(format!("{{\"ttl_s\": {ttl_s}}}"))
                    .send()
                    .await
                    .unwrap();
                if r.status() == 200 {
                    return r.json::<LeaseReply>().await.unwrap().id;
                }
                // (No leader yet.)
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    let long = grant(3600).await;
    assert_eq!(node.machine.lease(long).unwrap().remaining_ms, None);
    let checkpointed = |id| node.machine.lease(id).and_then(|l| l.remaining_ms);
    let mut changes = node.machine.applied_index();
    while checkpointed(long).is_none() {
        tokio::time::timeout(std::time::Duration::from_secs(30), changes.changed())
            .await
            .expect("no checkpoint within 30 s")
            .unwrap();
    }
    let left = checkpointed(long).unwrap();
    assert!(left <= 3_600_000 && left > 3_500_000, "{left}");
    let r = http
        .post(format!("http://{addr}/lease/{long}/keepalive"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The keep-alive went through the log: cleared when it was answered
    // (unless a checkpoint landed since, which holds the whole time-to-live
    // again: the keep-alive moved the deadline first).
    let after = checkpointed(long);
    assert!(after.is_none_or(|l| l > left), "{after:?} after {left}");
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
