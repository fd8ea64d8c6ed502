//! A follower that falls far behind catches up: stopped while a load of
//! large batches goes on, then resumed, it reaches the leader's applied
//! index, sent appends no larger than their byte budget (the leader once
//! resent one append of tens of MiB under the heartbeat's deadline,
//! forever). The full-scale version (≥ 1 GiB behind, every node's memory
//! sampled) is the fault matrix's `lagging-follower`.

mod common;

use base64::Engine;
use common::Cluster;
use std::time::{Duration, Instant};

/// Clients of the load, transactions each, puts per transaction, bytes
/// per value: 8 × 40 × 64 × 1 KiB, 20 MiB of values.
const CLIENTS: usize = 8;
const TXNS: usize = 40;
const PUTS: usize = 64;
const VALUE: usize = 1024;

/// `TXNS` transactions of `PUTS` puts of `VALUE` bytes from client `c`,
/// each retried until the leader takes it.
async fn load(leader: String, c: usize) {
    let http = reqwest::Client::new();
    let value = base64::engine::general_purpose::STANDARD.encode(vec![b'a' + c as u8; VALUE]);
    for t in 0..TXNS {
        let success: Vec<serde_json::Value> = (0..PUTS)
            .map(|p| serde_json::json!({"put": {"key": format!("c{c}/t{t}/p{p}"), "value": value}}))
            .collect();
        let body = serde_json::json!({"compare": [], "success": success, "failure": []});
        let mut tries = 0;
        loop {
            let r = http
                .post(format!("http://{leader}/txn"))
                .json(&body)
                .timeout(Duration::from_secs(30))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => break,
                other => {
                    tries += 1;
                    assert!(tries < 20, "txn {c}/{t} not taken: {other:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// The value of gauge `name` in node `addr`'s metrics.
async fn gauge(addr: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in {addr}'s metrics")) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stopped_through_a_load_of_large_batches_catches_up() {
    // No snapshot: the follower must be caught up by appends.
    let cluster = Cluster::start(3, &["--snapshot-min-mib", "100000"]);
    let leader = cluster.leader(None).await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let addr = cluster.nodes[leader].addr.clone();
    cluster.signal(follower, "STOP");
    let loads: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(load(addr.clone(), c)))
        .collect();
    for l in loads {
        l.await.unwrap();
    }
    let client = raftkv_tools::client::Client::new(&cluster.endpoints(), 1).unwrap();
    let target = client.status(&addr).await.unwrap().applied_index.unwrap();
    let behind = client
        .status(&cluster.nodes[follower].addr)
        .await
        .ok()
        .and_then(|s| s.applied_index);
    assert!(behind.is_none(), "the follower was stopped: {behind:?}");
    cluster.signal(follower, "CONT");
    let resumed = Instant::now();
    let follower_addr = cluster.nodes[follower].addr.clone();
    loop {
        let at = client
            .status(&follower_addr)
            .await
            .ok()
            .and_then(|s| s.applied_index);
        if at >= Some(target) {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(120),
            "the follower is at {at:?} of {target}, 120 s after it resumed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let biggest = gauge(&addr, "raftkv_append_body_max_bytes").await;
    assert!(
        biggest <= (raftkv::network::APPEND_BUDGET + 64 * 1024) as u64,
        "an append of {biggest} bytes"
    );
    // Its catch-up needed several appends of the budget's size.
    assert!(
        biggest > (raftkv::network::APPEND_BUDGET / 2) as u64,
        "{biggest}"
    );
}
