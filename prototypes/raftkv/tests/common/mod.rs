//! A cluster of `raftkv serve` processes on loopback, and a recorded
//! client workload, for the failover tests.
#![allow(dead_code)]

use raftkv_tools::client::{Client, ClientError};
use raftkv_tools::history::{Kind, Op};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The peer secret of a test cluster.
pub const TEST_SECRET: &str = "test-cluster-peer-secret-0123456789";

/// A free loopback port for a node that may stop and start again on it.
///
/// Taken below Linux's ephemeral range (32768 and up by default), where
/// outgoing connections get their local ports: a port from `bind(0)` is in
/// that range, and while its node is down an outgoing connection (another
/// node's, a client's) may take it, so that the node's restart fails with
/// `EADDRINUSE`. Ports go out in turn from a base the process id picks, so
/// two tests of one process never get the same one; each is checked free
/// (bound, released) before it is handed out.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let base = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (base + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN);
}

/// `kill -SIG pid`, which must succeed.
pub fn kill(sig: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// One node process.
pub struct Proc {
    pub id: u64,
    pub addr: String,
    pub dir: PathBuf,
    pub child: Option<Child>,
}

/// A local cluster; its processes are killed when it drops.
pub struct Cluster {
    pub tmp: tempfile::TempDir,
    pub nodes: Vec<Proc>,
    pub peers: String,
    pub extra: Vec<String>,
}

impl Cluster {
    /// Starts `n` nodes (node 1 initializes the cluster).
    pub fn start(n: u64, extra: &[&str]) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("peer-secret"), TEST_SECRET).unwrap();
        let nodes: Vec<Proc> = (1..=n)
            .map(|id| Proc {
                id,
                addr: format!("127.0.0.1:{}", free_port()),
                dir: tmp.path().join(format!("node-{id}")),
                child: None,
            })
            .collect();
        let peers = nodes
            .iter()
            .map(|p| format!("{}={}", p.id, p.addr))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            tmp,
            nodes,
            peers,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..c.nodes.len() {
            c.spawn(i).unwrap();
        }
        c
    }

    /// The file holding the cluster's peer secret ([`TEST_SECRET`]).
    pub fn secret_file(&self) -> PathBuf {
        self.tmp.path().join("peer-secret")
    }

    /// The command that starts node `i` (0-based).
    pub fn command(&self, i: usize) -> Command {
        let p = &self.nodes[i];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_raftkv"));
        cmd.arg("serve")
            .args(["--id", &p.id.to_string(), "--listen", &p.addr])
            .arg("--dir")
            .arg(&p.dir)
            .args(["--peers", &self.peers])
            .arg("--peer-secret-file")
            .arg(self.secret_file())
            .args(&self.extra);
        if i == 0 {
            cmd.arg("--init");
        }
        cmd
    }

    /// Starts node `i` and waits until it listens (an error if it exits
    /// instead; its message is on the test's stderr).
    pub fn spawn(&mut self, i: usize) -> Result<(), String> {
        let mut child = self
            .command(i)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.contains("listening") {
            let status = child.wait().unwrap();
            return Err(format!("node {} exited: {status}", self.nodes[i].id));
        }
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// `kill -9` node `i`.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Sends `sig` (`"STOP"`, `"CONT"`) to node `i`.
    pub fn signal(&self, i: usize, sig: &str) {
        kill(sig, self.nodes[i].child.as_ref().unwrap().id());
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|p| p.addr.clone()).collect()
    }

    /// The index of the node that is leader by its own account and, in the
    /// same term, by every other node that answers (at least one), waiting
    /// up to 30 s. A node that only calls itself leader may be deposed at
    /// once by a member that never heard from it (at start, node 1
    /// campaigns before the others listen, and its first messages to them
    /// fail): once every member that answers acknowledges it, each has
    /// reset its election timer.
    pub async fn leader(&self, not: Option<usize>) -> usize {
        let probe = Client::new(&self.endpoints(), 0).unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            let mut seen = Vec::new();
            for (i, p) in self.nodes.iter().enumerate() {
                if p.child.is_none() || Some(i) == not {
                    continue;
                }
                if let Ok(s) = probe.status(&p.addr).await {
                    seen.push((i, s));
                }
            }
            let live = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(i, p)| p.child.is_some() && Some(*i) != not)
                .count();
            for (i, s) in &seen {
                let id = self.nodes[*i].id;
                if s.state != "Leader" || s.leader != Some(id) {
                    continue;
                }
                let others: Vec<_> = seen.iter().filter(|(j, _)| j != i).collect();
                let all_follow = others
                    .iter()
                    .all(|(_, f)| f.leader == Some(id) && f.term == s.term);
                if all_follow && (!others.is_empty() || live == 1) {
                    return *i;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no leader within 30 s");
    }

    /// Waits (up to 30 s) until node `i` applied at least `index`.
    pub async fn caught_up(&self, i: usize, index: u64) {
        let probe = Client::new(&self.endpoints(), 0).unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(s) = probe.status(&self.nodes[i].addr).await {
                if s.applied_index.unwrap_or(0) >= index {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("node {} did not catch up to {index} within 30 s", i + 1);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in &mut self.nodes {
            if let Some(mut c) = p.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A recorded operation: its key and what it did.
pub type Recorded = (String, Op);

/// `clients` closed-loop clients, `ops` operations each on `keys` keys
/// (half unique-valued puts, half linearizable reads, fixed seeds),
/// recorded. `done` counts completed operations.
pub async fn workload(
    endpoints: Vec<String>,
    clients: u64,
    ops: usize,
    keys: u64,
    done: Arc<AtomicUsize>,
    base: Instant,
) -> Vec<Recorded> {
    let mut tasks = Vec::new();
    for c in 1..=clients {
        let endpoints = endpoints.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = Client::new(&endpoints, 1000 + c).unwrap();
            client.deadline = Duration::from_secs(8);
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ c;
            let mut out = Vec::new();
            for n in 0..ops {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = format!("key-{}", x % keys);
                let now = || base.elapsed().as_nanos() as u64;
                let invoked = now();
                if (x >> 32).is_multiple_of(2) {
                    let value = format!("c{c}-{n}").into_bytes();
                    let completed = match client.put(&key, &value).await {
                        Ok(_) => Some(now()),
                        Err(ClientError::Unknown(_)) => None,
                        Err(e) => panic!("put {key}: {e}"),
                    };
                    let kind = Kind::Write(Some(value));
                    out.push((
                        key,
                        Op {
                            invoked,
                            completed,
                            kind,
                        },
                    ));
                } else {
                    match client.get(&key, false).await {
                        Ok(v) => {
                            let op = Op {
                                invoked,
                                completed: Some(now()),
                                kind: Kind::Read(v),
                            };
                            out.push((key, op));
                        }
                        Err(ClientError::Unknown(_)) => {}
                        Err(e) => panic!("get {key}: {e}"),
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// Checks every key's history; panics with the key that fails.
pub fn check_histories(ops: &[Recorded]) -> usize {
    let mut by_key: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
    for (k, op) in ops {
        by_key.entry(k).or_default().push(op.clone());
    }
    for (k, h) in &by_key {
        if let Err(v) = raftkv_tools::history::check(h) {
            panic!("key {k}: not linearizable ({v:?}): {h:#?}");
        }
    }
    by_key.len()
}

/// A linearizable read of `key`, recorded (the client retries until it
/// has an answer: a failed read is a test failure here).
pub async fn recorded_read(client: &mut Client, key: &str, base: Instant) -> Recorded {
    let invoked = base.elapsed().as_nanos() as u64;
    let v = client.get(key, false).await.unwrap();
    let completed = Some(base.elapsed().as_nanos() as u64);
    let op = Op {
        invoked,
        completed,
        kind: Kind::Read(v),
    };
    (key.to_string(), op)
}

/// The writes of a history that were acknowledged.
pub fn acknowledged_writes(history: &[Recorded]) -> usize {
    history
        .iter()
        .filter(|(_, op)| matches!(op.kind, Kind::Write(_)) && op.completed.is_some())
        .count()
}

/// A log entry of term 1 (leader 1) at `index` carrying `cmds`, for tests
/// that drive a `StateMachine` directly.
pub fn batch_entry(
    index: u64,
    cmds: Vec<raftkv::Command>,
) -> openraft::alias::EntryOf<raftkv::TypeConfig> {
    openraft::Entry {
        log_id: openraft::LogId::new(
            openraft::impls::leader_id_adv::LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: openraft::EntryPayload::Normal(raftkv::Batch(cmds)),
    }
}

/// A verdict summed up, for comparisons in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V {
    /// Applied (a transaction: its comparisons held).
    Applied,
    /// A transaction whose comparisons did not all hold.
    CompareFailed,
    /// Refused: the lease does not exist.
    LeaseNotFound,
    /// Refused: the lease holds its most keys.
    LeaseFull,
    /// Refused otherwise (etcd's message).
    Refused(&'static str),
    /// A retry, answered as first decided.
    Duplicate { revision: i64, succeeded: bool },
    /// No session.
    UnknownSession,
    /// A sequence number below the session's.
    Stale,
}

/// The verdicts of an applied batch, summed up.
pub fn vs(a: &raftkv::Applied) -> Vec<V> {
    use raftkv::kv::KvError;
    use raftkv::Verdict;
    a.verdicts
        .iter()
        .map(|v| match v {
            Verdict::Applied { .. } if v.succeeded() => V::Applied,
            Verdict::Applied { .. } => V::CompareFailed,
            Verdict::Refused(KvError::LeaseNotFound) => V::LeaseNotFound,
            Verdict::Refused(KvError::LeaseFull) => V::LeaseFull,
            Verdict::Refused(e) => V::Refused(e.message()),
            Verdict::Duplicate {
                revision,
                succeeded,
                ..
            } => V::Duplicate {
                revision: *revision,
                succeeded: *succeeded,
            },
            Verdict::UnknownSession => V::UnknownSession,
            Verdict::Stale => V::Stale,
        })
        .collect()
}

/// A put of `value` at `key`, attached to `lease` (0: none).
pub fn put_leased(key: &str, value: &str, lease: i64) -> raftkv::Command {
    raftkv::Command::Kv {
        op: raftkv::kv::RequestOp::Put(raftkv::kv::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            ..Default::default()
        }),
        id: None,
    }
}

/// The current version of `key` in `sm`.
pub fn kv_of(sm: &raftkv::StateMachine, key: &str) -> Option<raftkv::kv::KeyValue> {
    sm.get_at(key.as_bytes(), 0).unwrap()
}

/// Every change from `from` on in `sm`, as `revision.sub kind key[=value]`.
pub fn changes(sm: &raftkv::StateMachine, from: i64) -> Vec<String> {
    let mut out = Vec::new();
    let mut pos = raftkv::machine::Position::at(from);
    loop {
        let page = sm.events(pos, (b"\0", b"\0"), false, (1000, 1000)).unwrap();
        for (p, e) in &page.events {
            let key = String::from_utf8_lossy(&e.kv.key);
            out.push(match e.kind {
                raftkv::kv::EventType::Put => {
                    format!("{p} put {key}={}", String::from_utf8_lossy(&e.kv.value))
                }
                raftkv::kv::EventType::Delete => format!("{p} delete {key}"),
            });
        }
        if page.next.revision > page.revision {
            return out;
        }
        pos = page.next;
    }
}
