//! The cluster a fault case runs against: `raftkv serve` processes on
//! loopback, each dialing its peers through a [`Link`] proxy per direction,
//! killed, paused and restarted by their pid — only processes started
//! here.

use super::proxy::{Link, Mode};
use crate::client::Client;
use crate::local::{LogTail, NodeCommand};
use raftkv_wire::http::Status;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tokio::process::Child;

/// One node: how to start it, and its process while it runs.
#[derive(Debug)]
pub struct NodeProc {
    /// How to start it.
    pub cmd: NodeCommand,
    /// Its process, while it runs.
    pub child: Option<Child>,
    /// Whether it is paused (`SIGSTOP`).
    pub paused: bool,
    /// Whether it was removed from the membership (never restarted).
    pub removed: bool,
}

/// A cluster of node processes with proxied links.
#[derive(Debug)]
pub struct ProcCluster {
    /// The nodes, node 1 first.
    pub nodes: Vec<NodeProc>,
    /// The proxies, by (from, to) node index.
    pub links: BTreeMap<(usize, usize), Link>,
    /// The nodes' stderr, interleaved.
    pub log: LogTail,
    probe: Client,
    /// The arguments every node's `raftkv serve` gets.
    extra: Vec<String>,
    /// Where the node directories are.
    dir: std::path::PathBuf,
}

/// `n` free consecutive loopback ports for nodes (the first returned),
/// below Linux's ephemeral range (32768 and up): the proxies' listeners and
/// every outgoing connection take their ports from that range, and one of
/// them must not take the port of a node that is down for a while and will
/// listen on it again.
pub(super) fn free_ports(rng: &mut super::Rng, n: u16) -> Result<u16, String> {
    for _ in 0..1000 {
        let base = 20_000 + rng.below(12_000) as u16;
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return Ok(base);
        }
    }
    Err(format!("no {n} free ports in 20000..32000"))
}

impl ProcCluster {
    /// Starts `n` nodes of `exe` with directories under `dir`, `extra`
    /// arguments for each `raftkv serve`; node 1 initializes the cluster.
    pub async fn start(
        exe: &Path,
        n: usize,
        dir: &Path,
        extra: &[String],
    ) -> Result<ProcCluster, String> {
        let mut rng = super::Rng::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()),
        );
        let mut addrs: Vec<String> = Vec::new();
        while addrs.len() < n {
            let a = format!("127.0.0.1:{}", free_ports(&mut rng, 1)?);
            if !addrs.contains(&a) {
                addrs.push(a);
            }
        }
        let peers: Vec<String> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let mut links = BTreeMap::new();
        for from in 0..n {
            for (to, target) in addrs.iter().enumerate() {
                if from != to {
                    let link = Link::start(target.clone())
                        .await
                        .map_err(|e| e.to_string())?;
                    links.insert((from, to), link);
                }
            }
        }
        let log = LogTail::default();
        let mut extra = extra.to_vec();
        extra.extend(crate::local::peer_secret_args(dir)?);
        let mut nodes = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let dial: Vec<String> = (0..n)
                .filter(|&to| to != i)
                .map(|to| format!("{}={}", to + 1, links[&(i, to)].addr()))
                .collect();
            let mut extra_i = extra.to_vec();
            extra_i.extend(["--peer-addr".into(), dial.join(",")]);
            nodes.push(NodeProc {
                cmd: NodeCommand {
                    exe: exe.to_path_buf(),
                    id: i as u64 + 1,
                    addr: addr.clone(),
                    dir: dir.join(format!("node-{}", i + 1)),
                    peers: peers.join(","),
                    extra: extra_i,
                    log: Some(log.clone()),
                    env: Vec::new(),
                },
                child: None,
                paused: false,
                removed: false,
            });
        }
        let probe = Client::new(&addrs, 0).map_err(|e| e.to_string())?;
        let mut c = ProcCluster {
            nodes,
            links,
            log,
            probe,
            extra,
            dir: dir.to_path_buf(),
        };
        for i in 0..n {
            c.spawn(i).await?;
        }
        Ok(c)
    }

    /// The nodes' addresses.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.cmd.addr.clone()).collect()
    }

    /// Starts node `i` (from its directory) and waits until it listens.
    pub async fn spawn(&mut self, i: usize) -> Result<(), String> {
        self.spawn_with_env(i, Vec::new()).await
    }

    /// Starts node `i` with `env` added to its environment this once.
    pub async fn spawn_with_env(
        &mut self,
        i: usize,
        env: Vec<(String, String)>,
    ) -> Result<(), String> {
        let mut cmd = self.nodes[i].cmd.clone();
        cmd.env.extend(env);
        let child = cmd.spawn().await?;
        self.nodes[i].child = Some(child);
        self.nodes[i].paused = false;
        Ok(())
    }

    /// Starts a new node with an empty directory and the next id, not yet
    /// a member (it joins by `POST /members`); it dials its peers at their
    /// own addresses, not through proxies. Returns its index.
    pub async fn add_node(&mut self, rng: &mut super::Rng) -> Result<usize, String> {
        let i = self.nodes.len();
        let seed = self.nodes.first().ok_or("no nodes")?.cmd.clone();
        let addr = loop {
            let a = format!("127.0.0.1:{}", free_ports(rng, 1)?);
            if !self.nodes.iter().any(|n| n.cmd.addr == a) {
                break a;
            }
        };
        self.nodes.push(NodeProc {
            cmd: NodeCommand {
                id: i as u64 + 1,
                addr,
                dir: self.dir.join(format!("node-{}", i + 1)),
                extra: self.extra.clone(),
                env: Vec::new(),
                ..seed
            },
            child: None,
            paused: false,
            removed: false,
        });
        self.spawn(i).await?;
        Ok(i)
    }

    /// Whether node `i`'s process runs (paused counts as running).
    pub fn running(&mut self, i: usize) -> bool {
        match self.nodes[i].child.as_mut() {
            None => false,
            Some(c) => matches!(c.try_wait(), Ok(None)),
        }
    }

    /// The indexes of the nodes whose process runs.
    pub fn live(&mut self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.running(i)).collect()
    }

    /// Waits for node `i`'s process to exit on its own, up to `within`;
    /// its exit status if it did.
    pub async fn exited(&mut self, i: usize, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.nodes[i].child.as_mut()?;
        match tokio::time::timeout(within, child.wait()).await {
            Ok(Ok(s)) => {
                self.nodes[i].child = None;
                Some(s)
            }
            _ => None,
        }
    }

    /// `kill -9` node `i` (resuming it first if paused, so it dies now).
    pub async fn kill9(&mut self, i: usize) -> Result<(), String> {
        if let Some(mut c) = self.nodes[i].child.take() {
            c.kill().await.map_err(|e| e.to_string())?;
        }
        self.nodes[i].paused = false;
        Ok(())
    }

    /// Pauses (`SIGSTOP`) or resumes (`SIGCONT`) node `i`.
    pub async fn pause(&mut self, i: usize, paused: bool) -> Result<(), String> {
        let Some(pid) = self.nodes[i].child.as_ref().and_then(Child::id) else {
            return Err(format!("node {} is not running", i + 1));
        };
        crate::local::signal(pid, if paused { "STOP" } else { "CONT" }).await?;
        self.nodes[i].paused = paused;
        Ok(())
    }

    /// Sets the link from node `from` to node `to`.
    pub fn set_link(&self, from: usize, to: usize, mode: Mode) {
        if let Some(l) = self.links.get(&(from, to)) {
            l.set(mode);
        }
    }

    /// Every link passes again; paused nodes resume.
    pub async fn heal(&mut self) -> Result<(), String> {
        for l in self.links.values() {
            l.set(Mode::Pass);
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused && self.running(i) {
                self.pause(i, false).await?;
            }
        }
        Ok(())
    }

    /// Node `i`'s status, if it answers within 2 s.
    pub async fn status(&self, i: usize) -> Option<Status> {
        self.probe.status(&self.nodes[i].cmd.addr).await.ok()
    }

    /// The node that is leader by its own account among `among`, waiting
    /// up to `within`.
    pub async fn leader(&mut self, among: &[usize], within: Duration) -> Option<usize> {
        let start = tokio::time::Instant::now();
        while start.elapsed() < within {
            for &i in among {
                if self.nodes[i].paused || !self.running(i) {
                    continue;
                }
                if let Some(s) = self.status(i).await {
                    if s.state == "Leader" && s.leader == Some(s.id) {
                        return Some(i);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Has node `i` build a snapshot and purge its log up to what it
    /// applied (`POST /compact`); its answer.
    pub async fn compact(&self, i: usize) -> Result<String, String> {
        let url = format!("http://{}/compact", self.nodes[i].cmd.addr);
        let r = reqwest::Client::new()
            .post(&url)
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = r.status();
        let body = r.text().await.unwrap_or_default();
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{url}: {status} {body}"))
        }
    }

    /// Arms failpoint `name` on node `i` with `actions` (the `fail`
    /// crate's syntax; `off` disarms); an error if the node was built
    /// without the `failpoints` feature.
    pub async fn failpoint(&self, i: usize, name: &str, actions: &str) -> Result<(), String> {
        let url = format!("http://{}/debug/failpoints/{name}", self.nodes[i].cmd.addr);
        let r = reqwest::Client::new()
            .put(&url)
            .body(actions.to_string())
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!("{url}: {}", r.status()))
        }
    }
}
