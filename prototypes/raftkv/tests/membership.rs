//! Membership through `POST /members`: a fourth node joins an existing
//! cluster as a learner (catching up from a snapshot: the log it needs
//! was purged), is promoted to voter, and a member is removed; the
//! cluster keeps serving and nothing written is lost.

mod common;

use common::{free_port, Cluster};
use raftkv_tools::client::Client;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the process when the test ends, passed or not.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_from_a_snapshot_is_promoted_and_a_member_leaves() {
    // Snapshots every 50 entries, 1,000 kept behind: 1,500 puts purge the
    // start of the log.
    let mut cluster = Cluster::start(3, &["--snapshot-logs", "50"]);
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 11).unwrap();
    for i in 0..1500 {
        client
            .put(&format!("k{}", i % 100), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    let leader_addr = cluster.nodes[leader].addr.clone();
    let status = client.status(&leader_addr).await.unwrap();

    // Node 4, started with the cluster's id and no seed members.
    let addr4 = format!("127.0.0.1:{}", free_port());
    let mut node4 = Command::new(env!("CARGO_BIN_EXE_raftkv"))
        .args([
            "serve",
            "--id",
            "4",
            "--listen",
            &addr4,
            "--cluster-id",
            &status.cluster,
        ])
        .arg("--dir")
        .arg(cluster.tmp.path().join("node-4"))
        .arg("--peer-secret-file")
        .arg(cluster.secret_file())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = node4.stdout.take().unwrap();
    let _node4 = Guard(node4);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    assert!(line.contains("listening"), "{line}");

    let http = reqwest::Client::new();
    let post = |body: String| {
        let http = http.clone();
        let url = format!("http://{leader_addr}/members");
        async move {
            let r = http.post(url).body(body).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let add = format!(r#"{{"op":"add","id":4,"addr":"{addr4}"}}"#);
    let (code, text) = post(add).await;
    assert_eq!(code, 200, "{text}");
    // The learner's log caught up before the answer; once it applied it,
    // its own copy has the data.
    let target = client
        .status(&leader_addr)
        .await
        .unwrap()
        .applied_index
        .unwrap();
    let start = Instant::now();
    while client
        .status(&addr4)
        .await
        .unwrap()
        .applied_index
        .unwrap_or(0)
        < target
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "node 4 did not apply"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut local4 = Client::new(std::slice::from_ref(&addr4), 12).unwrap();
    assert_eq!(
        local4.get("k99", true).await.unwrap().as_deref(),
        Some(&b"v1499"[..])
    );
    // It got there by a snapshot install: its store is a later generation.
    let current = std::fs::read_to_string(cluster.tmp.path().join("node-4/state/CURRENT")).unwrap();
    assert_ne!(current, "sm-0\n", "no snapshot was installed");
    let s4 = client.status(&addr4).await.unwrap();
    assert_eq!(s4.learners.get(&4), Some(&addr4), "{s4:?}");

    let (code, text) = post(r#"{"op":"promote","id":4}"#.into()).await;
    assert_eq!(code, 200, "{text}");
    let (code, text) = post(r#"{"op":"promote","id":4}"#.into()).await;
    assert_eq!(code, 400, "a voter is promoted again: {text}");
    // Remove a follower (not the leader), then write and read on.
    let gone = (0..3).find(|&i| i != leader).unwrap();
    let gone_id = cluster.nodes[gone].id;
    let (code, text) = post(format!(r#"{{"op":"remove","id":{gone_id}}}"#)).await;
    assert_eq!(code, 200, "{text}");
    let s = client.status(&leader_addr).await.unwrap();
    let voters: Vec<u64> = s.voters.keys().copied().collect();
    assert_eq!(voters.len(), 3, "{s:?}");
    assert!(voters.contains(&4) && !voters.contains(&gone_id), "{s:?}");
    cluster.kill9(gone);
    client.put("after", b"change").await.unwrap();
    assert_eq!(
        client.get("after", false).await.unwrap().as_deref(),
        Some(&b"change"[..])
    );
    assert_eq!(
        client.get("k0", false).await.unwrap().as_deref(),
        Some(&b"v1400"[..])
    );
}

/// A member whose directory was wiped forgot its vote and its log: started
/// again under its old id it is refused (its leader still holds a log for
/// it), and stays refused until it is replaced — removed, started empty,
/// added back as a learner that catches up, promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_directory_was_wiped_is_refused_until_replaced() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 21).unwrap();
    for i in 0..50 {
        client.put(&format!("k{i}"), b"v").await.unwrap();
    }
    // A follower other than the seed (whose command carries --init).
    let gone = (1..3).find(|&i| i != leader).unwrap();
    let (gone_id, gone_addr) = (cluster.nodes[gone].id, cluster.nodes[gone].addr.clone());
    let leader_addr = cluster.nodes[leader].addr.clone();
    let start = Instant::now();
    while !client
        .status(&leader_addr)
        .await
        .unwrap()
        .matched
        .contains_key(&gone_id)
    {
        assert!(start.elapsed() < Duration::from_secs(10), "never matched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.kill9(gone);
    std::fs::remove_dir_all(&cluster.nodes[gone].dir).unwrap();
    assert!(
        cluster.spawn(gone).is_err(),
        "a wiped member was let back in"
    );
    // Refused without claiming the directory: refused again.
    assert!(cluster.spawn(gone).is_err(), "refused only once");

    let http = reqwest::Client::new();
    let post = |body: String| {
        let (http, url) = (http.clone(), format!("http://{leader_addr}/members"));
        async move {
            let r = http.post(url).body(body).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (code, text) = post(format!(r#"{{"op":"remove","id":{gone_id}}}"#)).await;
    assert_eq!(code, 200, "{text}");
    let start = Instant::now();
    while client
        .status(&leader_addr)
        .await
        .unwrap()
        .matched
        .contains_key(&gone_id)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still replicated"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.spawn(gone).expect("a removed member starts empty");
    let add = format!(r#"{{"op":"add","id":{gone_id},"addr":"{gone_addr}"}}"#);
    let (code, text) = post(add).await;
    assert_eq!(code, 200, "{text}");
    let (code, text) = post(format!(r#"{{"op":"promote","id":{gone_id}}}"#)).await;
    assert_eq!(code, 200, "{text}");
    let target = client.status(&leader_addr).await.unwrap().applied_index;
    cluster.caught_up(gone, target.unwrap()).await;
    let mut local = Client::new(std::slice::from_ref(&gone_addr), 22).unwrap();
    assert_eq!(
        local.get("k49", true).await.unwrap().as_deref(),
        Some(&b"v"[..])
    );
    client.put("after", b"replaced").await.unwrap();
}
