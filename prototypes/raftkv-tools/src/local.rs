//! A local cluster: one `raftkv serve` process per node, on loopback ports
//! from a base (node N on `127.0.0.1:(base + N - 1)`), node 1 initializing
//! it at its first start; what `raftkv-tools cluster` and `raftkv-tools compare` run.
//!
//! [`supervise`] keeps such a cluster running as an init system keeps its
//! services: a node that exits — a crash, a `kill -9`, a Raft core that
//! stopped on a storage error — is restarted from its directory after a
//! backoff, with a line on stderr, while the others go on serving.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// The started nodes.
#[derive(Debug)]
pub struct LocalCluster {
    /// The node processes, node 1 first (killed when dropped).
    pub children: Vec<Child>,
    /// Their addresses, `host:port`.
    pub endpoints: Vec<String>,
}

/// How to start one node of a local cluster.
#[derive(Debug, Clone)]
pub struct NodeCommand {
    /// The `raftkv` executable.
    pub exe: PathBuf,
    /// The node's id.
    pub id: u64,
    /// Its address.
    pub addr: String,
    /// Its directory.
    pub dir: PathBuf,
    /// The seed members, `1=ADDR,2=ADDR,...`.
    pub peers: String,
    /// More arguments to `raftkv serve`.
    pub extra: Vec<String>,
    /// Keep the node's stderr here (default: inherited).
    pub log: Option<LogTail>,
    /// Environment variables for the process (a fault test's
    /// [`raftkv_wire::http::FAILPOINTS_ENV`]).
    pub env: Vec<(String, String)>,
}

/// The last lines a process wrote to its stderr (the newest
/// [`LogTail::LINES`]), prefixed with a tag; shared by the restarts of one
/// node.
#[derive(Debug, Clone, Default)]
pub struct LogTail(std::sync::Arc<journal_core::sync::Mutex<std::collections::VecDeque<String>>>);

impl LogTail {
    /// How many lines it keeps.
    pub const LINES: usize = 400;

    /// Adds a line, dropping the oldest beyond [`LogTail::LINES`].
    pub fn push(&self, line: String) {
        let mut q = self.0.lock();
        if q.len() == Self::LINES {
            q.pop_front();
        }
        q.push_back(line);
    }

    /// The lines kept, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().iter().cloned().collect()
    }
}

/// The environment variable naming the `raftkv` server binary the
/// tooling starts nodes of (`raftkv-tools --raftkv PATH` sets it).
pub const SERVER_ENV: &str = "RAFTKV_BIN";

/// The `raftkv` server binary: `$RAFTKV_BIN` if set, else the `raftkv`
/// beside this executable — as cargo builds them, `target/<profile>/`
/// (or its parent, for a test binary in `target/<profile>/deps/`).
pub fn server_exe() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(SERVER_ENV) {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let dirs = me.ancestors().skip(1).take(2);
    for d in dirs {
        let exe = d.join("raftkv");
        if exe.is_file() {
            return Ok(exe);
        }
    }
    Err(format!(
        "no raftkv server binary beside {} (build it: `cargo build -p raftkv`, or name it with --raftkv / ${SERVER_ENV})",
        me.display()
    ))
}

impl NodeCommand {
    /// The nodes of a local cluster of `nodes` nodes of the server
    /// ([`server_exe`]): see [`NodeCommand::local_of`].
    pub fn local(nodes: u64, dir: &Path, base_port: u16) -> Result<Vec<NodeCommand>, String> {
        NodeCommand::local_of(&server_exe()?, nodes, dir, base_port)
    }

    /// The nodes of a local cluster of `nodes` nodes of the server `exe`,
    /// directories `dir/node-N`, node N on `127.0.0.1:(base_port + N - 1)`,
    /// each with one runtime thread and the cluster's peer secret
    /// ([`peer_secret_args`]).
    pub fn local_of(
        exe: &Path,
        nodes: u64,
        dir: &Path,
        base_port: u16,
    ) -> Result<Vec<NodeCommand>, String> {
        let mut extra = vec!["--threads".to_string(), "1".to_string()];
        extra.extend(peer_secret_args(dir)?);
        let addr = |n: u64| format!("127.0.0.1:{}", u64::from(base_port) + n - 1);
        let peers: Vec<String> = (1..=nodes).map(|n| format!("{n}={}", addr(n))).collect();
        Ok((1..=nodes)
            .map(|n| NodeCommand {
                exe: exe.to_path_buf(),
                id: n,
                addr: addr(n),
                dir: dir.join(format!("node-{n}")),
                peers: peers.join(","),
                extra: extra.clone(),
                log: None,
                env: Vec::new(),
            })
            .collect())
    }

    /// Starts the node and waits (up to 30 s) until it listens. Node 1
    /// carries `--init`, which takes effect at its first start only.
    pub async fn spawn(&self) -> Result<Child, String> {
        let stderr = match &self.log {
            None => Stdio::inherit(),
            Some(_) => Stdio::piped(),
        };
        let mut child = Command::new(&self.exe)
            .arg("serve")
            .args(["--id", &self.id.to_string(), "--listen", &self.addr])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--peers", &self.peers])
            .args(&self.extra)
            .args(if self.id == 1 { &["--init"][..] } else { &[] })
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start node {}: {e}", self.id))?;
        let mut reader = None;
        if let (Some(tail), Some(err)) = (self.log.clone(), child.stderr.take()) {
            let id = self.id;
            reader = Some(tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    tail.push(format!("node {id}: {l}"));
                }
            }));
        }
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut lines = tokio::io::BufReader::new(out).lines();
        match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(l))) if l.contains("listening") => Ok(child),
            _ => {
                let _ = child.kill().await;
                // What it said before it died is in the tail once its
                // stderr closes.
                if let Some(r) = reader {
                    let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
                }
                Err(format!(
                    "node {} did not start (see its errors above)",
                    self.id
                ))
            }
        }
    }
}

/// The file a local cluster in `dir` keeps its peer secret in.
pub const PEER_SECRET_FILE: &str = "peer-secret";

/// The `raftkv serve` arguments that give a node of the local cluster in
/// `dir` its peer secret: `--peer-secret-file dir/peer-secret`, the file
/// made (a new random secret, mode 0600) if it is not there yet.
pub fn peer_secret_args(dir: &Path) -> Result<Vec<String>, String> {
    let path = dir.join(PEER_SECRET_FILE);
    let vfs = journal_core::vfs::OsVfs::new();
    raftkv_wire::auth::PeerSecret::load_or_create(&vfs, &path)?;
    Ok(vec![
        "--peer-secret-file".into(),
        path.to_string_lossy().into_owned(),
    ])
}

/// Starts `nodes` nodes of this executable with their directories under
/// `dir` (`node-N`), each with one runtime thread and `extra` arguments to
/// `raftkv serve`, and waits until each listens (up to 30 s each).
pub async fn start(
    nodes: u64,
    dir: &Path,
    base_port: u16,
    extra: &[String],
) -> Result<LocalCluster, String> {
    let mut commands = NodeCommand::local(nodes, dir, base_port)?;
    for c in &mut commands {
        c.extra.extend_from_slice(extra);
    }
    let mut children = Vec::new();
    for c in &commands {
        children.push(c.spawn().await?);
    }
    Ok(LocalCluster {
        children,
        endpoints: commands.into_iter().map(|c| c.addr).collect(),
    })
}

/// How [`supervise`] treats a node that exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    /// Restart it (`false`: leave it down, the others go on).
    pub enabled: bool,
    /// The first pause before a restart; doubled after each exit that
    /// follows a short run, up to [`Restart::max_backoff`].
    pub backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
    /// A node that ran this long before it exited starts again from
    /// [`Restart::backoff`].
    pub reset_after: Duration,
}

impl Default for Restart {
    fn default() -> Self {
        Restart {
            enabled: true,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            reset_after: Duration::from_secs(10),
        }
    }
}

/// Sends `sig` (`"STOP"`, `"CONT"`, ...) to `pid` through `kill(1)`.
pub async fn signal(pid: u32, sig: &str) -> Result<(), String> {
    let ok = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .await
        .map_err(|e| format!("kill -{sig} {pid}: {e}"))?
        .success();
    if ok {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pid} failed"))
    }
}

/// Sends `SIGTERM` to `child` (through `kill(1)`: no system call of its
/// own outside journal-vfs), then waits up to 10 s for it before `SIGKILL`.
async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// Runs one node until `stop` turns true: restarts it with backoff when it
/// exits (if `restart.enabled`), and says so on stderr.
async fn keep(
    node: NodeCommand,
    mut child: Option<Child>,
    restart: Restart,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = restart.backoff;
    loop {
        let started = tokio::time::Instant::now();
        let status: Result<ExitStatus, String> = match child.as_mut() {
            Some(c) => {
                let exited = tokio::select! {
                    s = c.wait() => Some(s.map_err(|e| e.to_string())),
                    _ = stop.wait_for(|s| *s) => None,
                };
                match exited {
                    Some(s) => s,
                    None => {
                        terminate(c).await;
                        return;
                    }
                }
            }
            None => Err("it did not start".into()),
        };
        let what = match status {
            Ok(s) => s.to_string(),
            Err(e) => e,
        };
        if !restart.enabled {
            eprintln!("node {} exited ({what}); not restarted", node.id);
            return;
        }
        if started.elapsed() >= restart.reset_after {
            backoff = restart.backoff;
        }
        eprintln!(
            "node {} exited ({what}); restarting in {} ms",
            node.id,
            backoff.as_millis()
        );
        let stopped = tokio::select! {
            _ = tokio::time::sleep(backoff) => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopped {
            return;
        }
        backoff = (backoff * 2).min(restart.max_backoff);
        child = match node.spawn().await {
            Ok(c) => {
                eprintln!("node {} restarted", node.id);
                Some(c)
            }
            Err(e) => {
                eprintln!("{e}");
                None
            }
        };
    }
}

/// Starts every node of `nodes` (waiting until each listens), calls
/// `started` with their addresses, then keeps them running — each node
/// that exits restarted per `restart` — until `stop` completes; then
/// stops them all (`SIGTERM`, `SIGKILL` after 10 s).
pub async fn supervise(
    nodes: Vec<NodeCommand>,
    restart: Restart,
    started: impl FnOnce(&[String]),
    stop: impl Future<Output = ()>,
) -> Result<(), String> {
    let mut children = Vec::new();
    for n in &nodes {
        children.push(n.spawn().await?);
    }
    let endpoints: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    started(&endpoints);
    let (tx, rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for (n, c) in nodes.into_iter().zip(children) {
        tasks.push(tokio::spawn(keep(n, Some(c), restart, rx.clone())));
    }
    stop.await;
    let _ = tx.send(true);
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}
