//! Bad input gets a clear answer and changes nothing: an oversized value,
//! malformed keys and request ids, unknown member ids, a node started in
//! another cluster's (or another node's) directory.

mod common;

use common::Cluster;
use raftkv_tools::client::{Client, ClientError};
use std::process::Stdio;

async fn status_of(r: reqwest::Response) -> (u16, String) {
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_400_and_change_nothing() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let base = format!("http://{}", cluster.nodes[leader].addr);
    let http = reqwest::Client::new();
    let mut client = Client::new(&cluster.endpoints(), 7).unwrap();
    client.put("k", b"before").await.unwrap();

    let big = vec![b'x'; raftkv::MAX_VALUE + 1];
    let r = http
        .put(format!("{base}/kv/k"))
        .body(big)
        .send()
        .await
        .unwrap();
    let (code, text) = status_of(r).await;
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("request is too large"), "{text}");
    // Exactly at the limit is fine.
    let max = vec![b'y'; raftkv::MAX_VALUE];
    client.put("max", &max).await.unwrap();
    assert_eq!(client.get("max", false).await.unwrap(), Some(max));

    let long = "a".repeat(raftkv::MAX_KEY + 1);
    for (path, want) in [
        (format!("/kv/{long}"), "request is too large"),
        ("/kv/k?client=3".to_string(), "a request id is"),
        ("/kv/k?client=3&seq=0".to_string(), "a request id is"),
        ("/kv/k?client=x&seq=1".to_string(), "Failed to deserialize"),
    ] {
        let r = http
            .put(format!("{base}{path}"))
            .body("v")
            .send()
            .await
            .unwrap();
        let (code, text) = status_of(r).await;
        assert_eq!(code, 400, "{path}: {text}");
        assert!(text.contains(want), "{path}: {text}");
    }
    let r = http.get(format!("{base}/kv/")).send().await.unwrap();
    assert_ne!(r.status().as_u16(), 200);
    // A delete naming a lease is a mistake, refused (the key stays).
    let r = http
        .delete(format!("{base}/kv/k?lease=1"))
        .send()
        .await
        .unwrap();
    let (code, text) = status_of(r).await;
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("takes no lease"), "{text}");

    for (body, want) in [
        (r#"{"op":"remove","id":9}"#, "node 9 is not a member"),
        (r#"{"op":"promote","id":2}"#, "node 2 is not a learner"),
        (
            r#"{"op":"add","id":1,"addr":"127.0.0.1:1"}"#,
            "already a member",
        ),
        (r#"{"op":"explode"}"#, "bad membership change"),
    ] {
        let r = http
            .post(format!("{base}/members"))
            .body(body)
            .send()
            .await
            .unwrap();
        let (code, text) = status_of(r).await;
        assert_eq!(code, 400, "{body}: {text}");
        assert!(text.contains(want), "{body}: {text}");
    }
    // A Raft RPC from another cluster is refused.
    let auth = format!("Bearer {}", common::TEST_SECRET);
    let r = http
        .post(format!("{base}/raft/vote"))
        .header("authorization", &auth)
        .header(raftkv::network::CLUSTER_HEADER, "0000000000000001")
        .header(raftkv::network::TARGET_HEADER, "1")
        .body(vec![0u8; 8])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    // And one of this cluster for another node, or for no node: a port
    // reused by another node must not hand it a message naming a leader
    // it thinks is itself.
    let status = client.status(&cluster.nodes[leader].addr).await.unwrap();
    let here = status.id;
    for target in [Some((here % 3 + 1).to_string()), None] {
        let mut rpc = http
            .post(format!("http://{}/raft/vote", cluster.nodes[leader].addr))
            .header("authorization", &auth)
            .header(raftkv::network::CLUSTER_HEADER, status.cluster.clone());
        if let Some(t) = &target {
            rpc = rpc.header(raftkv::network::TARGET_HEADER, t.clone());
        }
        let r = rpc.body(vec![0u8; 8]).send().await.unwrap();
        let (code, text) = status_of(r).await;
        assert_eq!(code, 409, "{target:?}: {text}");
        assert!(text.contains(&format!("this is node {here}")), "{text}");
    }

    // Nothing changed: the key, the membership.
    assert_eq!(
        client.get("k", false).await.unwrap().as_deref(),
        Some(&b"before"[..])
    );
    let s = client.status(&cluster.nodes[leader].addr).await.unwrap();
    assert_eq!(s.voters.len(), 3);
    assert!(s.learners.is_empty());
    // The client reports a refusal as one, without retrying.
    let e = client.put(&long, b"v").await.unwrap_err();
    assert!(
        matches!(e, ClientError::Refused(ref m) if m.contains("400")),
        "{e}"
    );

    // A node started in another node's directory, or with another
    // cluster's id, is refused before it touches anything.
    cluster.kill9(2);
    let mut wrong_node = cluster.command(2);
    let args: Vec<String> = wrong_node
        .get_args()
        .map(|a| a.to_string_lossy().into())
        .collect();
    let dir = cluster.nodes[1].dir.clone();
    wrong_node = std::process::Command::new(env!("CARGO_BIN_EXE_raftkv"));
    wrong_node.args(args.iter().map(|a| {
        if a.ends_with("node-3") {
            dir.to_string_lossy().into_owned()
        } else {
            a.clone()
        }
    }));
    let out = wrong_node.stdout(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("it belongs to node 2"), "{err}");
    let out = cluster
        .command(2)
        .args(["--cluster-id", "00000000000000ff"])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("of cluster"), "{err}");
    // Started right, it rejoins.
    cluster.spawn(2).unwrap();
    let mut c3 = Client::new(&[cluster.nodes[2].addr.clone()], 8).unwrap();
    assert_eq!(
        c3.get("k", false).await.unwrap().as_deref(),
        Some(&b"before"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_a_write_is_answered_503_not_left_hanging() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 9).unwrap();
    client.put("k", b"v").await.unwrap();
    // Both followers gone: the leader cannot commit anything.
    for i in (0..3).filter(|&i| i != leader) {
        cluster.kill9(i);
    }
    let http = reqwest::Client::new();
    let base = format!("http://{}", cluster.nodes[leader].addr);
    let start = std::time::Instant::now();
    let r = http
        .put(format!("{base}/kv/k"))
        .body("w")
        .timeout(std::time::Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let (code, text) = status_of(r).await;
    assert_eq!(code, 503, "{text}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(15),
        "{text}"
    );
    // A linearizable read cannot confirm leadership either; a stale one
    // answers from the node's copy.
    let r = http.get(format!("{base}/kv/k")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let r = http
        .get(format!("{base}/kv/k?stale=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(status_of(r).await, (200, "v".to_string()));
}
