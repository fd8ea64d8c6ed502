//! The request path is bounded: with the leader's log flush slowed
//! (failpoint `openraft-log::flush`, so writes pile up), writes beyond the
//! proposer's queue and requests beyond the concurrency limit are answered
//! `503` with `Retry-After` at once; a write whose client went away before
//! it was proposed is never applied; through etcd's gRPC API, writes beyond
//! the queue are answered etcd's `ResourceExhausted` "etcdserver: too many
//! requests" (not applied, so safe to retry), never an in-doubt timeout.
//! Needs the `failpoints` feature.

mod common;

use common::Cluster;
use etcd_api::etcdserverpb as pb;
use pb::kv_client::KvClient;
use std::time::Duration;

async fn arm(addr: &str, actions: &str) {
    let r = reqwest::Client::new()
        .put(format!(
            "http://{addr}/debug/failpoints/openraft-log::flush"
        ))
        .body(actions.to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

/// `n` concurrent PUTs of distinct keys at `addr`, no retries: each one's
/// status and whether it carried `Retry-After`.
async fn burst(addr: &str, n: usize, prefix: &str) -> Vec<(u16, bool)> {
    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..n {
        let req = http
            .put(format!("http://{addr}/kv/{prefix}-{i}"))
            .body("v")
            .timeout(Duration::from_secs(30));
        tasks.push(tokio::spawn(async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.headers().contains_key("retry-after"))
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// 64 writes at once at the leader of a cluster started with `limits`,
/// every member's flush slowed: at least `turned_away` answered `503` with
/// `Retry-After`, the rest `200`; then, unslowed, 4 more all pass.
async fn overflow(limits: &[&str], turned_away: usize) {
    let mut args = vec!["--election-timeout-ms", "3000"];
    args.extend_from_slice(limits);
    let cluster = Cluster::start(3, &args);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    // Every member's, not the leader's alone: two followers are a majority,
    // and their quick flushes would commit and free the admitted requests'
    // places while the burst is still arriving. Delayed, not sleeping: the
    // servers keep answering the burst meanwhile.
    for n in &cluster.nodes {
        arm(&n.addr, "return(1500)").await;
    }
    let answers = burst(&addr, 64, "a").await;
    for n in &cluster.nodes {
        arm(&n.addr, "off").await;
    }
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    let busy = answers.iter().filter(|(s, r)| *s == 503 && *r).count();
    assert_eq!(ok + busy, 64, "{answers:?}");
    assert!(ok >= 1, "{answers:?}");
    assert!(busy >= turned_away, "only {busy} turned away: {answers:?}");
    // The bounds leave no lasting mark: a later burst within them passes.
    let answers = burst(&addr, 4, "b").await;
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_past_the_proposer_queue_get_503_with_retry_after() {
    // 2 entries in flight and 4 writes waiting: of 64, the other 58 are
    // turned away at once, none waiting for the disk first.
    overflow(&["--max-pending-writes", "4"], 64 - 2 * 4 - 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_concurrency_limit_get_503_with_retry_after() {
    overflow(&["--max-client-requests", "8"], 64 - 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_client_went_away_before_it_was_proposed_is_not_applied() {
    // Long elections: slow flushes must not bring a new leader.
    let cluster = Cluster::start(3, &["--election-timeout-ms", "3000"]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    // Every member's flushes take 1.5 s (no majority has an entry durable
    // sooner: the leader's own disk alone does not hold a commit, as
    // openraft 0.10 replicates while it flushes): the two entries in
    // flight hold the proposer while the write queued behind them is
    // abandoned by its client (the server drops its handler when the
    // connection closes).
    for n in &cluster.nodes {
        arm(&n.addr, "return(1500)").await;
    }
    let http = reqwest::Client::new();
    let mut first = Vec::new();
    for i in 0..2 {
        let req = http.put(format!("http://{addr}/kv/first-{i}")).body("v");
        first.push(tokio::spawn(req.send()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Queued behind them; its client gives up after 200 ms.
    let gone = http
        .put(format!("http://{addr}/kv/gone"))
        .body("never")
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(gone.is_err(), "answered: {gone:?}");
    for n in &cluster.nodes {
        arm(&n.addr, "off").await;
    }
    // Their own answers (200, or 503 after the 5 s request timeout) do not
    // matter here.
    for f in first {
        let _ = f.await.unwrap();
    }
    // Every entry since is applied: a write after them, then the key.
    let later = http
        .put(format!("http://{addr}/kv/later"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(later.status(), 200);
    // No leader change meanwhile: the entries ahead of it were applied.
    for i in 0..2 {
        let r = http
            .get(format!("http://{addr}/kv/first-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "first-{i} lost: the leader changed");
    }
    let r = http
        .get(format!("http://{addr}/kv/gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the abandoned write was applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_writes_past_the_proposer_queue_are_too_many_requests() {
    let cluster = Cluster::start(
        3,
        &["--election-timeout-ms", "3000", "--max-pending-writes", "4"],
    );
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    for n in &cluster.nodes {
        arm(&n.addr, "return(1500)").await;
    }
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut kv = KvClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            let put = pb::PutRequest {
                key: format!("g-{i}").into_bytes(),
                value: b"v".to_vec(),
                ..Default::default()
            };
            match kv.put(put).await {
                Ok(_) => Ok(()),
                Err(s) => Err((s.code(), s.message().to_string())),
            }
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    for n in &cluster.nodes {
        arm(&n.addr, "off").await;
    }
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    let busy = answers
        .iter()
        .filter(|a| {
            matches!(a, Err((tonic::Code::ResourceExhausted, m)) if m == "etcdserver: too many requests")
        })
        .count();
    assert_eq!(ok + busy, 64, "{answers:?}");
    assert!(ok >= 1, "{answers:?}");
    // 2 entries in flight and 4 writes waiting: the rest turned away.
    assert!(
        busy >= 64 - 2 * 4 - 4,
        "only {busy} turned away: {answers:?}"
    );
}
