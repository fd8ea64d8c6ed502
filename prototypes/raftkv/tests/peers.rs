//! Peers and clients nobody vouches for: a Raft RPC without the cluster's
//! peer secret is refused before its body is read; an admin call that
//! cannot finish is answered within its deadline; a connection that sends
//! half a request, or nothing, is closed; the file of a snapshot transfer
//! cut off is removed.

mod common;

use common::{Cluster, TEST_SECRET};
use raftkv::network::{CLUSTER_HEADER, TARGET_HEADER};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// What node `addr` answers to a raw HTTP request (its status line),
/// within 5 s.
fn raw(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request).unwrap();
    let mut buf = vec![0u8; 512];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_rpc_without_the_peer_secret_is_refused_before_its_body_is_read() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    let status: raftkv::api::Status = http
        .get(format!("http://{addr}/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = status.id.to_string();
    let vote = |auth: Option<String>| {
        let mut rpc = http
            .post(format!("http://{addr}/raft/vote"))
            .header(CLUSTER_HEADER, &status.cluster)
            .header(TARGET_HEADER, &id);
        if let Some(a) = auth {
            rpc = rpc.header("authorization", a);
        }
        async move {
            let r = rpc.body(vec![0xffu8; 64]).send().await.unwrap();
            r.status().as_u16()
        }
    };
    // The cluster id and node id are public (`/status`); they are no
    // credential.
    assert_eq!(vote(None).await, 401);
    assert_eq!(vote(Some("Bearer not-the-secret-at-all".into())).await, 403);
    assert_eq!(vote(Some(TEST_SECRET.into())).await, 403, "no Bearer");
    // With the secret, the same garbage is decoded, and refused as such.
    assert_eq!(vote(Some(format!("Bearer {TEST_SECRET}"))).await, 400);

    // Refused before the body is read: a request announcing 60 MiB and
    // sending none of it is answered at once.
    for path in ["/raft/append", "/raft/snapshot", "/raft/vote"] {
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\n{CLUSTER_HEADER}: {}\r\n{TARGET_HEADER}: {id}\r\n\
             content-length: 62914560\r\n\r\n",
            status.cluster
        );
        let line = raw(&addr, req.as_bytes());
        assert!(line.contains(" 401 "), "{path}: {line:?}");
    }
    // The cluster goes on.
    let mut client = raftkv_tools::client::Client::new(&cluster.endpoints(), 3).unwrap();
    client.put("k", b"v").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_member_that_never_answers_is_answered_within_the_admin_deadline() {
    let cluster = Cluster::start(3, &["--admin-timeout-s", "2"]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    // A log longer than a learner may lag behind and count as caught up
    // (1,000 entries): one entry per put.
    let mut client = raftkv_tools::client::Client::new(&cluster.endpoints(), 6).unwrap();
    for i in 0..1_100 {
        client.put(&format!("k{}", i % 10), b"v").await.unwrap();
    }
    // Nothing listens there: the learner never catches up.
    let dead = format!("127.0.0.1:{}", common::free_port());
    let began = Instant::now();
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/members"))
        .body(format!(r#"{{"op":"add","id":4,"addr":"{dead}"}}"#))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("an answer within 30 s");
    let code = r.status().as_u16();
    let err = r
        .headers()
        .get(raftkv::api::ERROR_HEADER)
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(code, 503, "{}", r.text().await.unwrap());
    assert_eq!(err.as_deref(), Some(raftkv::api::TIMED_OUT));
    assert!(began.elapsed() < Duration::from_secs(20));
}

/// Whether the server closes `s` (EOF or reset) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // An answer (a 408, say) before the close is fine.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_and_idle_connections_are_closed_at_their_deadline() {
    let cluster = Cluster::start(3, &["--connection-timeout-s", "2"]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    // Half a request's headers, then nothing.
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /status HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .unwrap();
    // A connection that sends nothing at all.
    let mut silent = TcpStream::connect(&addr).unwrap();
    // One that is served, then stays idle.
    let mut idle = TcpStream::connect(&addr).unwrap();
    idle.write_all(b"GET /status HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let began = Instant::now();
    assert!(closed_within(&mut half, Duration::from_secs(10)));
    assert!(closed_within(&mut silent, Duration::from_secs(10)));
    assert!(closed_within(&mut idle, Duration::from_secs(10)));
    assert!(began.elapsed() < Duration::from_secs(10));
    // A new client is served meanwhile and after.
    let mut client = raftkv_tools::client::Client::new(&cluster.endpoints(), 4).unwrap();
    client.put("k", b"v").await.unwrap();
}

/// The snapshot transfer files (`recv-*.tmp`) in node `dir`.
fn transfer_files(dir: &Path) -> Vec<String> {
    let snaps = dir.join("state").join(raftkv::machine::SNAPSHOT_DIR);
    std::fs::read_dir(snaps)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("recv-"))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_of_a_snapshot_transfer_cut_off_is_removed_and_strays_at_start() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let addr = cluster.nodes[follower].addr.clone();
    let status = raftkv_tools::client::Client::new(std::slice::from_ref(&addr), 5)
        .unwrap()
        .status(&addr)
        .await
        .unwrap();
    let request = format!(
        "POST /raft/snapshot HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TEST_SECRET}\r\n\
         {CLUSTER_HEADER}: {}\r\n{TARGET_HEADER}: {}\r\ncontent-length: 10000000\r\n\r\n",
        status.cluster, status.id
    );
    let dir = cluster.nodes[follower].dir.clone();
    // A head of length 0 is refused at once (it once spun forever), and
    // leaves nothing behind.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.write_all(&[0u8; 4096]).unwrap();
    let mut answer = [0u8; 64];
    let n = s.read(&mut answer).unwrap();
    assert!(
        String::from_utf8_lossy(&answer[..n]).contains(" 400 "),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    drop(s);
    // A snapshot transfer with a well-formed head that sends part of the
    // file, then is cut off.
    let head = raftkv::network::SnapshotHead {
        vote: openraft::Vote::new(status.term + 1, 1),
        meta: raftkv::machine::SnapshotMeta::default(),
    };
    let head = postcard::to_stdvec(&head).unwrap();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.write_all(&(head.len() as u32).to_le_bytes()).unwrap();
    s.write_all(&head).unwrap();
    s.write_all(&[0u8; 4096]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while transfer_files(&dir).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!transfer_files(&dir).is_empty(), "the transfer began");
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !transfer_files(&dir).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(transfer_files(&dir), Vec::<String>::new(), "removed");

    // One left by a process that died is removed at the next start.
    cluster.kill9(follower);
    let stray = dir
        .join("state")
        .join(raftkv::machine::SNAPSHOT_DIR)
        .join("recv-9.tmp");
    std::fs::write(&stray, b"half a snapshot").unwrap();
    cluster.spawn(follower).unwrap();
    assert!(!stray.exists());
}
