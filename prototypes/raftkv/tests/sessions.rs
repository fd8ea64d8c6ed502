//! Client sessions over HTTP: a request id of a client without a session
//! is refused with `409` and `x-raftkv-error: session-unknown`, a stale one
//! with `session-stale`, never applied; a client whose session expired
//! (by the log's clock) starts a new one under a new id by itself.

mod common;

use common::Cluster;
use raftkv::client::Client;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_refuse_unknown_and_stale_ids_and_clients_renew_them() {
    let cluster = Cluster::start(3, &["--session-ttl-s", "1"]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    // A `503` (no leader for a moment, say) is sent again, as a client
    // would: each answer asserted below is the same on a second copy of
    // the request (a retried first write is a duplicate, answered `200`).
    let put = |q: &str| {
        let (http, url) = (http.clone(), format!("http://{addr}/kv/x?{q}"));
        async move {
            for _ in 0..100 {
                let r = http.put(&url).body("v").send().await.unwrap();
                let code = r.status().as_u16();
                let err = r
                    .headers()
                    .get(raftkv::api::ERROR_HEADER)
                    .map(|v| v.to_str().unwrap().to_owned());
                if code != 503 {
                    return (code, err);
                }
                eprintln!("{url}: 503 {}", r.text().await.unwrap_or_default());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{url}: 503 for 10 s");
        }
    };
    let unknown = Some(raftkv::api::SESSION_UNKNOWN.to_owned());
    let stale = Some(raftkv::api::SESSION_STALE.to_owned());
    assert_eq!(put("client=77&seq=3").await, (409, unknown.clone()));
    assert_eq!(put("client=77&seq=1").await, (200, None));
    assert_eq!(put("client=77&seq=2").await, (200, None));
    assert_eq!(put("client=77&seq=2").await, (200, None), "a retry");
    assert_eq!(put("client=77&seq=1").await, (409, stale));

    // A session idle past the TTL expires at the next entry's clock.
    let mut idle = Client::new(&cluster.endpoints(), 78).unwrap();
    idle.put("a", b"1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut busy = Client::new(&cluster.endpoints(), 79).unwrap();
    busy.put("b", b"2").await.unwrap();
    assert_eq!(put("client=77&seq=3").await, (409, unknown), "77 expired");
    // The idle client's next write is refused once, then goes through
    // under a new session.
    idle.put("a", b"3").await.unwrap();
    assert_eq!(idle.renewals(), 1);
    assert_ne!(idle.id(), 78);
    assert_eq!(
        idle.get("a", false).await.unwrap().as_deref(),
        Some(&b"3"[..])
    );
}
