//! `GET /metrics`: after writes through a three-node cluster, the leader's
//! metrics count them — proposals, the applied index, log flushes,
//! request latencies by route — in Prometheus's text format. (Snapshot
//! metrics: `tests/machine.rs`.)

mod common;

use common::Cluster;
use raftkv_tools::client::Client;

/// The value of the sample `name` (with its labels, as written) in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_counts_writes_flushes_and_requests() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 31).unwrap();
    for i in 0..20 {
        client.put(&format!("k{i}"), b"v").await.unwrap();
    }
    let addr = &cluster.nodes[leader].addr;
    let r = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ctype = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ctype.starts_with("text/plain"), "{ctype}");
    let text = r.text().await.unwrap();
    let at_least = |name: &str, min: f64| {
        let v = sample(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"));
        assert!(v >= min, "{name} = {v}, expected at least {min}");
    };
    at_least("raftkv_proposals_total", 20.0);
    at_least("raftkv_proposal_entries_total", 1.0);
    at_least("raftkv_applied_index", 20.0);
    at_least("raftkv_is_leader", 1.0);
    at_least("raftkv_leader_changes_total", 1.0);
    at_least("raftkv_log_flush_duration_seconds_count", 1.0);
    at_least(
        r#"raftkv_request_duration_seconds_count{code="200",method="PUT",route="/kv/{*key}"}"#,
        20.0,
    );
    // A follower proposes nothing and knows it is not the leader.
    let other = (0..3).find(|&i| i != leader).unwrap();
    let addr = &cluster.nodes[other].addr;
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(sample(&text, "raftkv_is_leader"), Some(0.0), "{text}");
    assert_eq!(sample(&text, "raftkv_proposals_total"), Some(0.0));
}
