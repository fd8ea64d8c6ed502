//! Compare-and-set over HTTP: 16 clients racing on one key, each reading
//! the key's revision and writing a unique value `If-Match` it — never
//! two winners from one revision, and the whole history (reads, wins and
//! losses) linearizable by the checker's CAS operation. Then the
//! conditional forms (`If-None-Match: *`, `If-Match: *`, a conditional
//! `DELETE`), `ETag` and create revision on reads, bad conditions (`400`),
//! and `POST /txn`.

mod common;

use base64::Engine as _;
use common::Cluster;
use raftkv::api::{TxnReply, CREATE_HEADER, REVISION_HEADER};
use raftkv::Expect;
use raftkv_tools::client::Client;
use raftkv_tools::history::{self, Kind, Op};
use std::collections::HashMap;
use std::time::Instant;

const CLIENTS: u64 = 16;
const ROUNDS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_compare_and_sets_never_both_win_one_revision() {
    let cluster = Cluster::start(3, &[]);
    cluster.leader(None).await;
    let base = Instant::now();
    let now = move || base.elapsed().as_nanos() as u64;
    let mut tasks = Vec::new();
    for id in 1..=CLIENTS {
        let endpoints = cluster.endpoints();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::new(&endpoints, 100 + id).unwrap();
            let mut ops = Vec::new();
            // (revision expected, value written) of each win.
            let mut wins = Vec::new();
            for round in 0..ROUNDS {
                let invoked = now();
                let read = c.get_entry("race").await.unwrap();
                ops.push(Op {
                    invoked,
                    completed: Some(now()),
                    kind: Kind::Read(read.clone().map(|(v, _)| v)),
                });
                let (expect, cond) = match read {
                    Some((v, r)) => (Some(v), Expect::ModRevision(r)),
                    None => (None, Expect::Absent),
                };
                let value = format!("c{id}-{round}").into_bytes();
                let invoked = now();
                let won = c.put_if("race", &value, &cond).await.unwrap();
                if won {
                    wins.push((cond.clone(), c.last_revision().unwrap()));
                }
                ops.push(Op {
                    invoked,
                    completed: Some(now()),
                    kind: Kind::Cas {
                        expect,
                        write: Some(value),
                        succeeded: Some(won),
                    },
                });
            }
            (ops, wins)
        }));
    }
    let (mut ops, mut wins) = (Vec::new(), Vec::new());
    for t in tasks {
        let (o, w) = t.await.unwrap();
        ops.extend(o);
        wins.extend(w);
    }
    // Each win's condition is distinct: no revision (nor "absent") was
    // won twice. And each win made a new revision, in a chain.
    let mut by_cond: HashMap<String, usize> = HashMap::new();
    for (cond, _) in &wins {
        *by_cond.entry(format!("{cond:?}")).or_default() += 1;
    }
    assert!(by_cond.values().all(|&n| n == 1), "{by_cond:?}");
    assert!(wins.len() >= ROUNDS, "only {} wins", wins.len());
    let mut made: Vec<i64> = wins.iter().map(|(_, r)| *r).collect();
    made.sort();
    for pair in made.windows(2) {
        let later = wins.iter().find(|(_, r)| *r == pair[1]).unwrap();
        assert_eq!(later.0, Expect::ModRevision(pair[0]), "a win skipped one");
    }
    assert_eq!(
        history::check_bounded(&ops, 50_000_000),
        history::Verdict::Linearizable
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_writes_etags_and_transactions() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(None).await;
    let addr = cluster.nodes[leader].addr.clone();
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://{addr}{p}");
    let put = |cond: Option<(&'static str, String)>, v: &'static str| {
        let mut r = http.put(url("/kv/k")).body(v);
        if let Some((h, c)) = cond {
            r = r.header(h, c);
        }
        r.send()
    };
    // Create only if absent: once.
    let cond = || Some(("if-none-match", "*".to_string()));
    let r = put(cond(), "a").await.unwrap();
    assert_eq!(r.status(), 200);
    let etag = r.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(put(cond(), "b").await.unwrap().status(), 412);
    // A read's ETag is the last put's revision; its create revision too.
    let r = http.get(url("/kv/k")).send().await.unwrap();
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
    let created = r.headers()[CREATE_HEADER].to_str().unwrap().to_string();
    assert_eq!(format!("\"{created}\""), etag);
    // If-Match the ETag: once; a stale one fails.
    let r = put(Some(("if-match", etag.clone())), "c").await.unwrap();
    assert_eq!(r.status(), 200);
    let newer = r.headers()[REVISION_HEADER].to_str().unwrap().to_string();
    let r = put(Some(("if-match", etag.clone())), "d").await.unwrap();
    assert_eq!(r.status(), 412);
    assert_eq!(r.headers()["x-raftkv-error"], "compare-failed");
    let r = http.get(url("/kv/k")).send().await.unwrap();
    assert_eq!(r.headers()[CREATE_HEADER].to_str().unwrap(), created);
    assert_eq!(r.text().await.unwrap(), "c");
    // Malformed conditions are 400, and change nothing.
    for (h, v) in [
        ("if-match", "\"1.0\""),
        ("if-none-match", "\"1\""),
        ("if-match", "a.b"),
        ("if-match", "\"0\""),
    ] {
        let r = put(Some((h, v.to_string())), "x").await.unwrap();
        assert_eq!(r.status(), 400, "{h}: {v}");
    }
    // A conditional delete: a stale revision fails, the current one wins.
    let del = |tag: String| http.delete(url("/kv/k")).header("if-match", tag).send();
    assert_eq!(del(etag).await.unwrap().status(), 412);
    assert_eq!(del(format!("\"{newer}\"")).await.unwrap().status(), 200);
    assert_eq!(http.get(url("/kv/k")).send().await.unwrap().status(), 404);
    // If-Match: * needs the key.
    assert_eq!(
        put(Some(("if-match", "*".into())), "e")
            .await
            .unwrap()
            .status(),
        412
    );

    // POST /txn: both branches, whole.
    let b64 = base64::engine::general_purpose::STANDARD;
    let txn = |body: serde_json::Value| {
        let http = http.clone();
        let u = url("/txn");
        async move {
            let r = http.post(u).json(&body).send().await.unwrap();
            let code = r.status().as_u16();
            (code, r.text().await.unwrap())
        }
    };
    let body = |absent: &str| {
        serde_json::json!({
            "compare": [{"key": absent, "expect": "absent"}],
            "success": [
                {"put": {"key": "t/1", "value": b64.encode("one")}},
                {"put": {"key": "t/2", "value": b64.encode("two")}}
            ],
            "failure": [{"delete": {"key": "t/1"}}]
        })
    };
    let (code, text) = txn(body("t/1")).await;
    assert_eq!(code, 200, "{text}");
    let reply: TxnReply = serde_json::from_str(&text).unwrap();
    assert!(reply.succeeded && !reply.retry);
    let (_, text) = txn(body("t/2")).await;
    let reply: TxnReply = serde_json::from_str(&text).unwrap();
    assert!(!reply.succeeded);
    let get = |k: &'static str| http.get(url(&format!("/kv/{k}"))).send();
    assert_eq!(
        get("t/1").await.unwrap().status(),
        404,
        "the failure branch"
    );
    assert_eq!(get("t/2").await.unwrap().text().await.unwrap(), "two");
    // Bad transactions are 400.
    let too_many: Vec<_> = (0..=raftkv::kv::MAX_TXN_OPS)
        .map(|i| serde_json::json!({"delete": {"key": format!("k{i}")}}))
        .collect();
    for bad in [
        serde_json::json!({"compare": [{"key": "a", "expect": "maybe"}]}),
        serde_json::json!({"success": [{"put": {"key": "a", "value": "not base64!"}}]}),
        serde_json::json!({"compare": [{"key": "a", "expect": {"mod_revision": "x"}}]}),
        serde_json::json!({"success": [{"delete": {"key": ""}}]}),
        serde_json::json!({"success": too_many}),
        serde_json::json!({"success": [
            {"put": {"key": "a", "value": ""}},
            {"put": {"key": "a", "value": ""}}
        ]}),
    ] {
        let (code, text) = txn(bad.clone()).await;
        assert_eq!(code, 400, "{bad}: {text}");
    }
}
