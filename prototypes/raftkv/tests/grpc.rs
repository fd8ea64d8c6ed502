//! etcd's gRPC API and its JSON gateway on a 3-node raftkv, through the
//! `etcd-api` crate's own tonic clients (HTTP/2) and reqwest (HTTP/1.1)
//! on the same ports: response headers, forwarding from followers, the
//! lease keep-alive stream piped to the leader, Auth `Unimplemented`, the
//! gateway's JSON and errors, and raftkv's own HTTP API beside them; a
//! watch from a past revision read from a follower's versions.

mod common;

use common::Cluster;
use etcd_api::etcdserverpb as pb;
use pb::cluster_client::ClusterClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use std::time::Duration;
use tonic::transport::Channel;

async fn channel(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(20))
        .connect()
        .await
        .unwrap()
}

/// The cluster, its leader's index and the channels to every node.
async fn start() -> (Cluster, usize, Vec<Channel>) {
    let c = Cluster::start(3, &[]);
    let leader = c.leader(None).await;
    // Every member holds the leader's first entries (so the leader lists
    // each as started: its log matched).
    let probe = raftkv_tools::client::Client::new(&c.endpoints(), 0).unwrap();
    let applied = probe.status(&c.nodes[leader].addr).await.unwrap();
    for i in 0..c.nodes.len() {
        c.caught_up(i, applied.applied_index.unwrap_or(0)).await;
    }
    let mut channels = Vec::new();
    for p in &c.nodes {
        channels.push(channel(&p.addr).await);
    }
    (c, leader, channels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_header_names_the_cluster_the_member_and_the_term() {
    let (c, leader, ch) = start().await;
    let mut clusters = std::collections::BTreeSet::new();
    for (i, channel) in ch.iter().enumerate() {
        let s = MaintenanceClient::new(channel.clone())
            .status(pb::StatusRequest {})
            .await
            .unwrap()
            .into_inner();
        let h = s.header.unwrap();
        assert_eq!(h.member_id, c.nodes[i].id, "the answering member");
        assert_eq!(s.leader, c.nodes[leader].id);
        assert_eq!(h.raft_term, s.raft_term);
        assert!(h.raft_term >= 1);
        assert!(!s.is_learner);
        assert!(s.db_size > 0, "the store's files take room");
        clusters.insert(h.cluster_id);
        // A follower forwards the member list to the leader: the same
        // members whoever is asked.
        let m = ClusterClient::new(channel.clone())
            .member_list(pb::MemberListRequest {})
            .await
            .unwrap()
            .into_inner();
        let ids: Vec<u64> = m.members.iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert!(m.members.iter().all(|m| m.name.starts_with("raftkv-")));
    }
    assert_eq!(clusters.len(), 1, "one cluster id");
    let http = reqwest::Client::new();
    let st: raftkv::api::Status = http
        .get(format!("http://{}/status", c.nodes[0].addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cluster = clusters.into_iter().next().unwrap();
    assert_eq!(
        format!("{cluster:016x}"),
        st.cluster,
        "the cluster id is raftkv's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_lease_calls_and_pipes_keep_alives_to_the_leader() {
    let (_c, leader, ch) = start().await;
    let follower = ch[(leader + 1) % 3].clone();
    let mut lease = LeaseClient::new(follower.clone());
    let g = lease
        .lease_grant(pb::LeaseGrantRequest { ttl: 30, id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(g.id > 0);
    assert_eq!(g.ttl, 30);
    let t = lease
        .lease_time_to_live(pb::LeaseTimeToLiveRequest {
            id: g.id,
            keys: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.granted_ttl, 30);
    assert!((28..=30).contains(&t.ttl), "{t:?}");
    // The keep-alive stream from a follower: each request answered, a
    // missing lease with TTL 0 (as etcd answers it).
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = lease
        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for id in [g.id, g.id, 0x1234] {
        tx.send(pb::LeaseKeepAliveRequest { id }).await.unwrap();
        let a = tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(a.id, id);
        assert_eq!(a.ttl, if id == g.id { 30 } else { 0 });
        assert_eq!(
            a.header.unwrap().member_id,
            (leader + 1) as u64,
            "answered by the leader"
        );
    }
    drop(tx);
    lease
        .lease_revoke(pb::LeaseRevokeRequest { id: g.id })
        .await
        .unwrap();
    let gone = lease
        .lease_revoke(pb::LeaseRevokeRequest { id: g.id })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert_eq!(gone.message(), "etcdserver: requested lease not found");
    let t = lease
        .lease_time_to_live(pb::LeaseTimeToLiveRequest {
            id: g.id,
            keys: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.ttl, -1, "a revoked lease's time to live");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_is_unimplemented_with_a_message_that_says_so() {
    let (_c, _, ch) = start().await;
    let e = pb::auth_client::AuthClient::new(ch[0].clone())
        .authenticate(pb::AuthenticateRequest {
            name: "root".into(),
            password: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
    assert!(
        e.message().contains("does not serve etcd's Auth service"),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_gateway_answers_as_etcds_and_the_http_api_stays() {
    let (c, leader, _) = start().await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", c.nodes[(leader + 1) % 3].addr);
    let post = |path: &str, body: &str| {
        http.post(format!("{base}{path}"))
            .body(body.to_owned())
            .send()
    };
    let r = post("/v3/maintenance/status", "").await.unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["version"], etcd_api::ETCD_VERSION);
    assert_eq!(
        v["leader"],
        c.nodes[leader].id.to_string(),
        "64-bit integers as strings"
    );
    assert_eq!(
        v["header"]["member_id"],
        c.nodes[(leader + 1) % 3].id.to_string()
    );
    let r = post("/v3/lease/grant", r#"{"TTL": "40"}"#).await.unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["TTL"], "40");
    let id = v["ID"].as_str().unwrap().to_owned();
    let r = post("/v3/kv/lease/timetolive", &format!(r#"{{"ID": {id}}}"#))
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["grantedTTL"], "40");
    // Errors: the status as JSON under grpc-gateway's HTTP status.
    let r = post("/v3/lease/revoke", r#"{"ID": "4660"}"#).await.unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], 5);
    assert_eq!(v["error"], "etcdserver: requested lease not found");
    let r = post("/v3/kv/range", "{not json").await.unwrap();
    assert_eq!(r.status(), 400);
    let r = post("/v3/auth/authenticate", "{}").await.unwrap();
    assert_eq!(r.status(), 501);
    let r = post("/v3/cluster/member/list", "").await.unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["members"].as_array().unwrap().len(), 3);
    assert_eq!(
        v["members"][0]["peerURLs"][0],
        format!("http://{}", c.nodes[0].addr)
    );
    // raftkv's own API on the same port.
    let r = http.get(format!("{base}/status")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// Whether the server closes `s` within `within` (what it sends before,
/// an HTTP/2 GOAWAY say, is read and passed over).
fn closed_within(s: &mut std::net::TcpStream, within: Duration) -> bool {
    use std::io::Read;
    let end = std::time::Instant::now() + within;
    let mut buf = [0u8; 256];
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_at_its_deadline() {
    use std::io::Write;
    let c = Cluster::start(1, &["--connection-timeout-s", "2"]);
    let addr = &c.nodes[0].addr;
    // HTTP/2's preface and nothing more: the connection is HTTP/2, idle.
    let mut idle = std::net::TcpStream::connect(addr).unwrap();
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)),
        "an idle HTTP/2 connection stays open"
    );
    // Nothing at all: closed too.
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(10)),
        "a silent connection stays open"
    );
    // A gRPC call still works on a new one.
    let ch = channel(addr).await;
    let s = MaintenanceClient::new(ch)
        .status(pb::StatusRequest {})
        .await
        .unwrap();
    assert_eq!(s.into_inner().header.unwrap().member_id, 1);
}

/// Reads a watch stream until `n` events came (or an answer cancels it);
/// the answers, events and all.
async fn watch_answers(
    channel: Channel,
    create: pb::WatchCreateRequest,
    n: usize,
) -> Vec<pb::WatchResponse> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    })
    .await
    .unwrap();
    let mut stream = pb::watch_client::WatchClient::new(channel)
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut answers = Vec::new();
    let mut events = 0;
    while events < n {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.message());
        let r = next.await.expect("the watch went quiet").unwrap().unwrap();
        events += r.events.len();
        let canceled = r.canceled;
        answers.push(r);
        if canceled {
            break;
        }
    }
    drop(tx);
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_revision_reads_the_versions_each_revision_whole() {
    let (_c, leader, ch) = start().await;
    let mut kv = pb::kv_client::KvClient::new(ch[leader].clone());
    for i in 0..300 {
        let key = format!("big/{i:03}").into_bytes();
        let put = pb::PutRequest {
            key,
            value: b"v".to_vec(),
            ..Default::default()
        };
        kv.put(put).await.unwrap();
    }
    // Revisions 2..=301 the puts, 302 one deletion of 300 keys (more than
    // a page of the history), 303 a put.
    let del = pb::DeleteRangeRequest {
        key: b"big/".to_vec(),
        range_end: b"big0".to_vec(),
        ..Default::default()
    };
    let d = kv.delete_range(del).await.unwrap().into_inner();
    assert_eq!((d.deleted, d.header.unwrap().revision), (300, 302));
    let put = pb::PutRequest {
        key: b"big/after".to_vec(),
        value: b"w".to_vec(),
        ..Default::default()
    };
    kv.put(put).await.unwrap();
    let create = |start_revision| pb::WatchCreateRequest {
        key: b"big/".to_vec(),
        range_end: b"big0".to_vec(),
        start_revision,
        ..Default::default()
    };
    // From a follower: its copy of the versions.
    let follower = ch[(leader + 1) % 3].clone();
    let answers = watch_answers(follower, create(2), 601).await;
    let events: Vec<(i32, Vec<u8>, i64)> = answers
        .iter()
        .flat_map(|a| &a.events)
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (e.r#type, kv.key.clone(), kv.mod_revision)
        })
        .collect();
    let mut expected: Vec<(i32, Vec<u8>, i64)> = (0..300)
        .map(|i| (0, format!("big/{i:03}").into_bytes(), 2 + i))
        .collect();
    expected.extend((0..300).map(|i| (1, format!("big/{i:03}").into_bytes(), 302)));
    expected.push((0, b"big/after".to_vec(), 303));
    assert_eq!(events.len(), expected.len(), "every change once");
    assert!(events == expected, "every change once, in revision order");
    // The deletion's 300 events came in one answer.
    let split: Vec<usize> = answers
        .iter()
        .map(|a| {
            a.events
                .iter()
                .filter(|e| e.kv.as_ref().unwrap().mod_revision == 302)
                .count()
        })
        .filter(|n| *n > 0)
        .collect();
    assert_eq!(split, [300], "revision 302 split between answers");

    // Compacted past the start: one answer, canceled, naming the
    // compaction.
    let compact = pb::CompactionRequest {
        revision: 303,
        physical: true,
    };
    kv.compact(compact).await.unwrap();
    let answers = watch_answers(ch[leader].clone(), create(2), 1).await;
    let last = answers.last().unwrap();
    assert!(last.canceled, "{answers:?}");
    assert_eq!(last.compact_revision, 303);
    assert!(last.events.is_empty());
}
