//! A client of the HTTP API that finds the leader and retries safely: each
//! write carries a request id, and is resent with the same id (to the
//! leader a `307` names, or to the next endpoint after a `503` or a
//! refused connection) until it is answered or its deadline passes.
//!
//! It keeps the rule for writes in doubt (crate docs, "Sessions and
//! writes in doubt"): a write is resent only under its own request id. If
//! its session is gone (`409 session-unknown`) after an attempt that may
//! have reached the cluster — no answer, or a `503` that did not say the
//! write was not taken — the first copy may have been applied before the
//! session expired, and a copy under a new session could apply it twice:
//! the write is reported in doubt ([`ClientError::Unknown`]) and not sent
//! again; the client's next write opens a new session. Only a write every
//! attempt of which was refused outright goes again under a new session.

use raftkv_wire::Expect;
use reqwest::StatusCode;
use std::time::{Duration, Instant};

/// How an operation ended without an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The cluster refused the request itself (`400`, `413`): retrying
    /// cannot help. The write did not happen.
    Refused(String),
    /// No answer before the deadline: a write may or may not have taken
    /// effect.
    Unknown(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Refused(s) => write!(f, "refused: {s}"),
            ClientError::Unknown(s) => write!(f, "no answer: {s}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// A client with its own request ids.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// The endpoint tried first: the last leader found.
    leader: String,
    id: u64,
    seq: u64,
    /// The index of the last answer (header [`raftkv_wire::http::INDEX_HEADER`]).
    last_index: Option<u64>,
    /// The last answer's [`raftkv_wire::http::ERROR_HEADER`].
    last_error: Option<String>,
    /// The last answer's revision: a read's `ETag`, a write's
    /// [`raftkv_wire::http::REVISION_HEADER`].
    last_revision: Option<i64>,
    /// Sessions this client started again under a new id.
    renewals: u64,
    /// Whether an attempt of the last call may have reached the cluster
    /// without an answer saying what became of it.
    in_doubt: bool,
    /// How long an operation retries before it gives up.
    pub deadline: Duration,
}

/// What an answer's headers said.
#[derive(Debug, Clone, Default)]
struct Said {
    index: Option<u64>,
    error: Option<String>,
    revision: Option<i64>,
}

enum Attempt {
    /// An answer: its status, body, and headers.
    Done(StatusCode, Vec<u8>, Said),
    /// Sent to another node (the leader a `307` named): retry at once.
    Redirected,
    /// No answer, or `503`: retry after a pause. Whether the request may
    /// have been taken (it may have reached a node, and no answer said it
    /// was not).
    Retry(String, bool),
}

impl Client {
    /// A client of the nodes at `endpoints` (`host:port`), with client id
    /// `id` (distinct per client; its request ids are `id` and 1, 2, ...:
    /// its first write opens its session). If the session expires, the
    /// next write is refused once and resent under a new random id —
    /// unless it was in doubt by then: it is then reported
    /// [`ClientError::Unknown`], never resent (see the module docs).
    pub fn new(endpoints: &[String], id: u64) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| ClientError::Refused(e.to_string()))?;
        let endpoints: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
        let leader = endpoints
            .first()
            .cloned()
            .ok_or_else(|| ClientError::Refused("no endpoints".into()))?;
        Ok(Client {
            http,
            endpoints,
            leader,
            id,
            seq: 0,
            last_index: None,
            last_error: None,
            last_revision: None,
            renewals: 0,
            in_doubt: false,
            deadline: Duration::from_secs(10),
        })
    }

    async fn attempt(
        &mut self,
        method: reqwest::Method,
        (path, condition): (&str, Option<(&str, String)>),
        body: &[u8],
        rotate: &mut usize,
    ) -> Attempt {
        let url = format!("{}{path}", self.leader);
        let mut req = self.http.request(method, &url).body(body.to_vec());
        if let Some((name, value)) = condition {
            req = req.header(name, value);
        }
        let mut next = |me: &mut Client, why: String, doubt: bool| {
            *rotate += 1;
            me.leader = me.endpoints[*rotate % me.endpoints.len()].clone();
            Attempt::Retry(why, doubt)
        };
        let resp = match req.send().await {
            Ok(r) => r,
            // (A connection never made carried nothing.)
            Err(e) => return next(self, format!("{url}: {e}"), !e.is_connect()),
        };
        let status = resp.status();
        if status == StatusCode::TEMPORARY_REDIRECT {
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .and_then(|l| l.strip_suffix(path).map(str::to_owned));
            return match to {
                Some(base) => {
                    self.leader = base;
                    Attempt::Redirected
                }
                None => next(
                    self,
                    format!("{url}: a redirect without the same path"),
                    false,
                ),
            };
        }
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let said = Said {
            index: header(raftkv_wire::http::INDEX_HEADER).and_then(|v| v.parse().ok()),
            error: header(raftkv_wire::http::ERROR_HEADER).map(str::to_owned),
            revision: header(raftkv_wire::http::REVISION_HEADER)
                .or_else(|| header(reqwest::header::ETAG.as_str()))
                .and_then(|v| v.trim_matches('"').parse().ok()),
        };
        // A `503` with `Retry-After` is a bound of the request path: the
        // write was not taken. Any other may come after it was proposed.
        let not_taken = resp.headers().contains_key(reqwest::header::RETRY_AFTER);
        match resp.bytes().await {
            Err(e) => next(self, format!("{url}: {e}"), true),
            Ok(_) if status == StatusCode::SERVICE_UNAVAILABLE => {
                next(self, format!("{url}: {status}"), !not_taken)
            }
            Ok(b) => Attempt::Done(status, b.to_vec(), said),
        }
    }

    async fn call(
        &mut self,
        method: reqwest::Method,
        path: &str,
        body: &[u8],
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        self.call_if(method, (path, None), body).await
    }

    async fn call_if(
        &mut self,
        method: reqwest::Method,
        (path, condition): (&str, Option<(&str, String)>),
        body: &[u8],
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        let start = Instant::now();
        let mut rotate = 0;
        let mut last = String::new();
        let mut backoff = Duration::from_millis(5);
        self.last_index = None;
        self.last_error = None;
        self.last_revision = None;
        self.in_doubt = false;
        while start.elapsed() < self.deadline {
            let target = (path, condition.clone());
            match self
                .attempt(method.clone(), target, body, &mut rotate)
                .await
            {
                Attempt::Done(s, b, said) => {
                    self.last_index = said.index;
                    self.last_error = said.error;
                    self.last_revision = said.revision;
                    return Ok((s, b));
                }
                Attempt::Redirected => {}
                Attempt::Retry(why, doubt) => {
                    self.in_doubt |= doubt;
                    last = why;
                    // A retry's pause: no leader yet, or a node down.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
        Err(ClientError::Unknown(last))
    }

    fn key_path(key: &str) -> String {
        let mut p = String::from("/kv/");
        for b in key.bytes() {
            if b.is_ascii_alphanumeric() || b"-_./~".contains(&b) {
                p.push(b as char);
            } else {
                p.push_str(&format!("%{b:02X}"));
            }
        }
        p
    }

    /// A write, conditional on `expect` (not `Expect::Value`): whether it
    /// was a retry applied before, and whether its condition held.
    async fn write(
        &mut self,
        method: reqwest::Method,
        key: &str,
        value: &[u8],
        expect: Option<&Expect>,
    ) -> Result<(bool, bool), ClientError> {
        let condition = match expect {
            None => None,
            Some(Expect::Absent) => Some(("if-none-match", "*".to_owned())),
            Some(Expect::Present) => Some(("if-match", "*".to_owned())),
            Some(Expect::ModRevision(r)) => Some(("if-match", format!("\"{r}\""))),
            Some(Expect::Value(_)) => {
                return Err(ClientError::Refused(
                    "a single-key write compares revisions, not values: use a transaction".into(),
                ))
            }
        };
        let mut renewed = false;
        loop {
            self.seq += 1;
            let path = format!(
                "{}?client={}&seq={}",
                Self::key_path(key),
                self.id,
                self.seq
            );
            let target = (path.as_str(), condition.clone());
            match self.call_if(method.clone(), target, value).await? {
                (code @ (StatusCode::OK | StatusCode::PRECONDITION_FAILED), body) => {
                    let retry = String::from_utf8_lossy(&body).contains("a retry");
                    return Ok((retry, code == StatusCode::OK));
                }
                // The session is gone: this copy was refused, and so will
                // every later one under this id be. If an earlier attempt
                // may have been applied (before the session expired), the
                // write is in doubt: never sent again under a new session,
                // which could apply it twice. Else it was never applied:
                // it goes again under a new session, once.
                (StatusCode::CONFLICT, _)
                    if self.last_error.as_deref() == Some(raftkv_wire::http::SESSION_UNKNOWN) =>
                {
                    let doubt = self.in_doubt;
                    self.renew();
                    if doubt {
                        return Err(ClientError::Unknown(format!(
                            "{method} {key}: the session expired while the write was in doubt: \
                             it may have been applied, and is not sent again under a new session"
                        )));
                    }
                    if renewed {
                        return Err(ClientError::Refused(format!(
                            "{method} {key}: a new session was refused at once"
                        )));
                    }
                    renewed = true;
                }
                (s, body) => {
                    return Err(ClientError::Refused(format!(
                        "{s}: {}",
                        String::from_utf8_lossy(&body).trim_end()
                    )))
                }
            }
        }
    }

    /// Starts a new session: a new client id (random), sequence numbers
    /// from 1 again.
    fn renew(&mut self) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut rng = journal_core::vfs::SplitMix64::new(nanos ^ self.id.rotate_left(17));
        self.id = rng.next_u64();
        self.seq = 0;
        self.renewals += 1;
    }

    /// The client id its writes carry now.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sessions this client started again under a new id (its session
    /// had expired).
    pub fn renewals(&self) -> u64 {
        self.renewals
    }

    /// Sets `key` to `value`; `Ok(true)` if the write was a retry that had
    /// already been applied.
    pub async fn put(&mut self, key: &str, value: &[u8]) -> Result<bool, ClientError> {
        Ok(self.write(reqwest::Method::PUT, key, value, None).await?.0)
    }

    /// Removes `key`.
    pub async fn delete(&mut self, key: &str) -> Result<bool, ClientError> {
        Ok(self.write(reqwest::Method::DELETE, key, &[], None).await?.0)
    }

    /// Sets `key` to `value` if `expect` holds when the write is applied
    /// (`Absent`, `Present` or `ModRevision`): `Ok(true)` if it did and
    /// the value was written, `Ok(false)` if not (`412`). A retry is
    /// answered as the first attempt was decided.
    pub async fn put_if(
        &mut self,
        key: &str,
        value: &[u8],
        expect: &Expect,
    ) -> Result<bool, ClientError> {
        let m = reqwest::Method::PUT;
        Ok(self.write(m, key, value, Some(expect)).await?.1)
    }

    /// Removes `key` if `expect` holds, as [`Client::put_if`].
    pub async fn delete_if(&mut self, key: &str, expect: &Expect) -> Result<bool, ClientError> {
        let m = reqwest::Method::DELETE;
        Ok(self.write(m, key, &[], Some(expect)).await?.1)
    }

    /// A linearizable read of `key` and the revision it was last changed
    /// at.
    pub async fn get_entry(&mut self, key: &str) -> Result<Option<(Vec<u8>, i64)>, ClientError> {
        let value = self.get(key, false).await?;
        match (value, self.last_revision) {
            (None, _) => Ok(None),
            (Some(v), Some(r)) => Ok(Some((v, r))),
            (Some(_), None) => Err(ClientError::Refused("a value without an ETag".into())),
        }
    }

    /// The revision the last answer carried: a write's (the store's
    /// revision after it), or the `ETag` of a value read (the revision it
    /// was last changed at).
    pub fn last_revision(&self) -> Option<i64> {
        self.last_revision
    }

    /// A linearizable read of `key` (a stale local one if `stale`).
    pub async fn get(&mut self, key: &str, stale: bool) -> Result<Option<Vec<u8>>, ClientError> {
        let mut path = Self::key_path(key);
        if stale {
            path.push_str("?stale=true");
        }
        match self.call(reqwest::Method::GET, &path, &[]).await? {
            (StatusCode::OK, body) => Ok(Some(body)),
            (StatusCode::NOT_FOUND, _) => Ok(None),
            (s, body) => Err(ClientError::Refused(format!(
                "{s}: {}",
                String::from_utf8_lossy(&body).trim_end()
            ))),
        }
    }

    /// Sends the next operation first to endpoint `i` (modulo their
    /// number) instead of the last leader found: a client that keeps a
    /// home node, as one behind a load balancer does.
    pub fn send_next_to(&mut self, i: usize) {
        self.leader = self.endpoints[i % self.endpoints.len()].clone();
    }

    /// The log index the last answer reflects, if it carried one: the
    /// entry a write was applied in, or a linearizable read's read index.
    pub fn last_index(&self) -> Option<u64> {
        self.last_index
    }

    /// The status of the node at `endpoint`.
    pub async fn status(&self, endpoint: &str) -> Result<raftkv_wire::http::Status, ClientError> {
        let r = self
            .http
            .get(format!("http://{endpoint}/status"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map_err(|e| ClientError::Unknown(e.to_string()))?;
        r.json()
            .await
            .map_err(|e| ClientError::Unknown(e.to_string()))
    }
}
