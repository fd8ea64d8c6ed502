//! Client sessions over HTTP: a request id of a client without a session
//! is refused with `409` and `x-raftkv-error: session-unknown`, a stale one
//! with `session-stale`, never applied; a client whose session expired
//! (by the log's clock) starts a new one under a new id by itself.

mod common;

use common::Cluster;
use raftkv_tools::client::Client;
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

/// A stand-in for a node that answers each request by a script: `None`
/// reads the request and closes the connection without an answer (the
/// write is in doubt), `Some(head)` answers with that status line and
/// headers. Returns its address and the request lines it received.
async fn scripted_node(
    script: Vec<Option<&'static str>>,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut script = script.into_iter();
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // The head, then as many body bytes as it says.
            let head_end = loop {
                let n = s.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the client closed before its request");
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < head_end + len {
                let n = s.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            log.lock()
                .unwrap()
                .push(head.lines().next().unwrap_or("").to_owned());
            match script.next().flatten() {
                None => drop(s),
                Some(reply) => {
                    let body = "answer";
                    let r = format!(
                        "{reply}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    s.write_all(r.as_bytes()).await.unwrap();
                }
            }
        }
    });
    (addr, seen)
}

const SESSION_GONE: &str = "HTTP/1.1 409 Conflict\r\nx-raftkv-error: session-unknown";

/// The client id a request line carries (`?client=C&seq=S`).
fn client_of(line: &str) -> String {
    let q = line.split_once("client=").unwrap().1;
    q.split('&').next().unwrap().to_owned()
}

/// The rule for a write in doubt: it is retried under its own request
/// id only. If its session is gone by then, the first copy may have been
/// applied before the session expired: sent again under a new session it
/// could apply twice. The client reports it as in doubt and does not send
/// it again; its next write opens a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_doubt_is_never_resent_under_a_new_session() {
    let ok = "HTTP/1.1 200 OK\r\nx-raftkv-revision: 5.1";
    let (addr, seen) = scripted_node(vec![None, Some(SESSION_GONE), Some(ok)]).await;
    let mut client = Client::new(&[addr], 77).unwrap();
    client.deadline = Duration::from_secs(5);
    let r = client.put("a", b"1").await;
    assert!(
        matches!(r, Err(raftkv_tools::client::ClientError::Unknown(_))),
        "{r:?}"
    );
    let lines = seen.lock().unwrap().clone();
    assert_eq!(lines.len(), 2, "sent again: {lines:?}");
    assert!(lines.iter().all(|l| client_of(l) == "77"), "{lines:?}");
    // Its next write opens a new session (a new id, sequence number 1).
    assert_eq!(client.put("b", b"2").await, Ok(false));
    let lines = seen.lock().unwrap().clone();
    assert_eq!(lines.len(), 3);
    assert_ne!(client_of(&lines[2]), "77");
    assert!(lines[2].contains("seq=1"), "{}", lines[2]);
}

/// A write whose every attempt was refused outright (its session was
/// gone at the first) cannot have been applied: it goes again under a
/// new session at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_outright_goes_again_under_a_new_session() {
    let ok = "HTTP/1.1 200 OK\r\nx-raftkv-revision: 5.1";
    let (addr, seen) = scripted_node(vec![Some(SESSION_GONE), Some(ok)]).await;
    let mut client = Client::new(&[addr], 78).unwrap();
    client.deadline = Duration::from_secs(5);
    assert_eq!(client.put("a", b"1").await, Ok(false));
    let lines = seen.lock().unwrap().clone();
    assert_eq!(lines.len(), 2);
    assert_eq!(client_of(&lines[0]), "78");
    assert_ne!(client_of(&lines[1]), "78");
    assert_eq!(client.renewals(), 1);
}
