//! Range reads, `GET /kv?prefix=` and `?start=&end=`: pages in key order
//! from one snapshot, continued from `next` until the range is done —
//! every key exactly once — linearizable on the leader or stale on a
//! follower; bad ranges are `400`. `DELETE` with the same bounds removes
//! a range, and nothing outside it.

mod common;

use base64::Engine as _;
use common::Cluster;
use raftkv::api::RangeReply;
use raftkv_tools::client::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_is_read_in_pages_every_key_once_in_order() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 41).unwrap();
    let mut want = Vec::new();
    for i in 0..25 {
        let (k, v) = (format!("a/{i:02}"), vec![i as u8; i + 1]);
        client.put(&k, &v).await.unwrap();
        want.push((k, v));
    }
    client.put("a", b"not under a/").await.unwrap();
    client.put("b/1", b"other").await.unwrap();
    let http = reqwest::Client::new();
    let get = |addr: String, q: String| {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://{addr}/kv?{q}"))
                .send()
                .await
                .unwrap();
            let code = r.status().as_u16();
            (code, r.text().await.unwrap())
        }
    };
    let leader_addr = cluster.nodes[leader].addr.clone();
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut got = Vec::new();
    let mut q = "prefix=a/&limit=10".to_string();
    loop {
        let (code, body) = get(leader_addr.clone(), q.clone()).await;
        assert_eq!(code, 200, "{body}");
        let page: RangeReply = serde_json::from_str(&body).unwrap();
        assert!(page.kvs.len() <= 10);
        for kv in page.kvs {
            got.push((kv.key, b64.decode(kv.value).unwrap()));
        }
        match page.next {
            Some(next) => q = format!("prefix=a/&limit=10&start={next}"),
            None => break,
        }
    }
    assert_eq!(got, want);
    // start/end, stale on a follower once it applied everything.
    let other = (0..3).find(|&i| i != leader).unwrap();
    let applied = client.last_index().unwrap();
    cluster.caught_up(other, applied).await;
    let (code, body) = get(
        cluster.nodes[other].addr.clone(),
        "start=a/20&end=b&stale=true".into(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let page: RangeReply = serde_json::from_str(&body).unwrap();
    let keys: Vec<_> = page.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["a/20", "a/21", "a/22", "a/23", "a/24"]);
    assert_eq!(page.next, None);
    for bad in [
        "",
        "limit=5",
        "prefix=a&end=b",
        "start=a&limit=0",
        "start=a&limit=10001",
    ] {
        let (code, body) = get(leader_addr.clone(), bad.into()).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_is_deleted_and_nothing_outside_it() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let mut client = Client::new(&cluster.endpoints(), 42).unwrap();
    for k in ["a", "a/1", "a/2", "a/3", "b/1", "b/2", "c"] {
        client.put(k, k.as_bytes()).await.unwrap();
    }
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, q: &str| {
        let (http, url) = (http.clone(), format!("http://{addr}/kv?{q}"));
        async move {
            let r = http.request(method, url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let del = reqwest::Method::DELETE;
    let (code, body) = send(del.clone(), "prefix=a/&client=900&seq=1").await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = send(del.clone(), "start=b/2&end=c").await;
    assert_eq!(code, 200, "{body}");
    for bad in [
        "",
        "prefix=",
        "start=",
        "prefix=a&end=b",
        "prefix=a&client=1",
    ] {
        let (code, body) = send(del.clone(), bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
    let (code, body) = send(reqwest::Method::GET, "start=%20").await;
    assert_eq!(code, 200, "{body}");
    let page: RangeReply = serde_json::from_str(&body).unwrap();
    let keys: Vec<_> = page.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["a", "b/1", "c"]);
}
