//! The `etcd-client` Rust crate, unmodified, against a 3-node raftkv and
//! against etcd 3.4 beside it: the same calls on both, their answers
//! written as one transcript each (what legitimately differs — ids,
//! terms, hashes — left out), and the transcripts compared. Built with
//! the `etcd` feature (etcd-client's build needs `protoc`: Debian's
//! protobuf-compiler); `cargo test -p raftkv --features etcd --test
//! etcd_client`. The KV, watch and hash calls need the multi-version
//! store behind `raftkv::grpc::EtcdBackend`.

mod common;
mod etcd;

use etcd::{same, serial, Pair};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use std::fmt::Write;
use std::time::Duration;

async fn connect(endpoints: &[String]) -> Client {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(20));
    Client::connect(endpoints, Some(opts)).await.unwrap()
}

/// A result as the transcript shows it: the value, or the error's text.
fn show<T>(r: Result<T, etcd_client::Error>, f: impl FnOnce(T) -> String) -> String {
    match r {
        Ok(v) => f(v),
        Err(etcd_client::Error::GRpcStatus(s)) => format!("error {:?}: {}", s.code(), s.message()),
        Err(e) => format!("error {e}"),
    }
}

fn kvs<'a>(kvs: impl IntoIterator<Item = &'a etcd_client::KeyValue>) -> String {
    kvs.into_iter()
        .map(|kv| {
            format!(
                "{}={} (c{} m{} v{})",
                kv.key_str().unwrap_or("?"),
                kv.value_str().unwrap_or("?"),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The key-value calls: puts, gets, a compare-and-swap, a watch from a
/// revision with previous values.
async fn kv_script(c: &mut Client) -> String {
    let mut t = String::new();
    for (k, v) in [("a", "1"), ("b", "2"), ("a", "3")] {
        let r = c.put(k, v, Some(PutOptions::new().with_prev_key())).await;
        let _ = writeln!(
            t,
            "put {k}: {}",
            show(r, |r| format!(
                "prev [{}] rev {}",
                kvs(r.prev_key()),
                r.header().map_or(0, |h| h.revision())
            ))
        );
    }
    let r = c.get("", Some(GetOptions::new().with_all_keys())).await;
    let _ = writeln!(
        t,
        "get all: {}",
        show(r, |r| format!("{} count {}", kvs(r.kvs()), r.count()))
    );
    let r = c.get("a", Some(GetOptions::new().with_revision(2))).await;
    let _ = writeln!(t, "get a at 2: {}", show(r, |r| kvs(r.kvs())));
    // Compare-and-swap on the mod revision: the first wins, the second
    // reads.
    for _ in 0..2 {
        let txn = Txn::new()
            .when([Compare::mod_revision("a", CompareOp::Equal, 4)])
            .and_then([TxnOp::put("a", "cas", None)])
            .or_else([TxnOp::get("a", None)]);
        let r = c.txn(txn).await;
        let _ = writeln!(
            t,
            "cas: {}",
            show(r, |r| format!(
                "succeeded {} ops {}",
                r.succeeded(),
                r.op_responses().len()
            ))
        );
    }
    let r = c.delete("b", None).await;
    let _ = writeln!(
        t,
        "delete b: {}",
        show(r, |r| format!("deleted {}", r.deleted()))
    );
    let r = c
        .watch(
            "a",
            Some(WatchOptions::new().with_start_revision(2).with_prev_key()),
        )
        .await;
    match r {
        Ok((_watcher, mut stream)) => {
            let mut seen = 0;
            while seen < 3 {
                let m = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
                let Ok(Ok(Some(m))) = m else {
                    let _ = writeln!(t, "watch: ended");
                    break;
                };
                for e in m.events() {
                    seen += 1;
                    let kind = if e.event_type() == EventType::Put {
                        "PUT"
                    } else {
                        "DELETE"
                    };
                    let _ = writeln!(
                        t,
                        "watch: {kind} {} prev [{}]",
                        kvs(e.kv()),
                        kvs(e.prev_kv())
                    );
                }
            }
        }
        Err(e) => {
            let _ = writeln!(t, "watch: error {e}");
        }
    }
    t
}

/// The lease calls: grant, keep-alive (stream), time to live, list,
/// revoke.
async fn lease_script(c: &mut Client) -> String {
    let mut t = String::new();
    let g = c.lease_grant(60, None).await.unwrap();
    let _ = writeln!(t, "grant: ttl {}", g.ttl());
    let (mut keeper, mut stream) = c.lease_keep_alive(g.id()).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
    let _ = writeln!(
        t,
        "keep-alive: {:?}",
        m.ok().and_then(|m| m.ok()).flatten().map(|m| m.ttl())
    );
    let r = c.lease_time_to_live(g.id(), None).await;
    let _ = writeln!(
        t,
        "ttl: {}",
        show(r, |r| format!(
            "granted {} left ~{}",
            r.granted_ttl(),
            (r.ttl() + 5) / 10 * 10
        ))
    );
    let r = c.leases().await;
    let _ = writeln!(t, "leases: {}", show(r, |r| r.leases().len().to_string()));
    let r = c.lease_revoke(g.id()).await;
    let _ = writeln!(t, "revoke: {}", show(r, |_| "ok".into()));
    let r = c.lease_revoke(g.id()).await;
    let _ = writeln!(t, "revoke again: {}", show(r, |_| "ok".into()));
    t
}

/// The cluster and maintenance calls.
async fn admin_script(c: &mut Client) -> String {
    let mut t = String::new();
    let r = c.member_list().await;
    let _ = writeln!(
        t,
        "members: {}",
        show(r, |r| format!(
            "{} started {}",
            r.members().len(),
            r.members().iter().filter(|m| !m.name().is_empty()).count()
        ))
    );
    let r = c.status().await;
    let _ = writeln!(
        t,
        "status: {}",
        show(r, |r| format!(
            "leader known {} learner {}",
            r.leader() != 0,
            r.is_learner()
        ))
    );
    let r = c
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await;
    let _ = writeln!(t, "alarms: {}", show(r, |r| r.alarms().len().to_string()));
    let r = c.defragment().await;
    let _ = writeln!(t, "defragment: {}", show(r, |_| "ok".into()));
    match c.snapshot().await {
        Ok(mut s) => {
            let mut bytes = 0usize;
            while let Ok(Some(m)) = s.message().await {
                bytes += m.blob().len();
            }
            let _ = writeln!(
                t,
                "snapshot: {} bytes, 32 past a 512-byte multiple: {}",
                if bytes > 0 { "some" } else { "no" },
                bytes % 512 == 32
            );
        }
        Err(e) => {
            let _ = writeln!(t, "snapshot: error {e}");
        }
    }
    t
}

fn both(
    p: &Pair,
    what: &str,
    script: for<'a> fn(
        &'a mut Client,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + 'a>>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let e = rt.block_on(async { script(&mut connect(&p.e.endpoints).await).await });
    let r = rt.block_on(async { script(&mut connect(&p.r.endpoints).await).await });
    same(what, &r, &e);
}

#[test]
fn kv_calls_answer_as_etcds() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    both(&p, "kv", |c| Box::pin(kv_script(c)));
}

#[test]
fn lease_calls_answer_as_etcds() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    both(&p, "lease", |c| Box::pin(lease_script(c)));
}

#[test]
fn cluster_and_maintenance_calls_answer_as_etcds() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    both(&p, "admin", |c| Box::pin(admin_script(c)));
}
