//! A local cluster: one `raftkv serve` process per node, on loopback ports
//! from a base (node N on `127.0.0.1:(base + N - 1)`), node 1 initializing
//! it at its first start; what `raftkv cluster` and `raftkv compare` run.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The started nodes.
#[derive(Debug)]
pub struct LocalCluster {
    /// The node processes, node 1 first (killed when dropped).
    pub children: Vec<Child>,
    /// Their addresses, `host:port`.
    pub endpoints: Vec<String>,
}

/// Starts `nodes` nodes of this executable with their directories under
/// `dir` (`node-N`), each with one runtime thread, and waits until each
/// listens (up to 30 s each).
pub async fn start(nodes: u64, dir: &Path, base_port: u16) -> Result<LocalCluster, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let addr = |n: u64| format!("127.0.0.1:{}", u64::from(base_port) + n - 1);
    let peers: Vec<String> = (1..=nodes).map(|n| format!("{n}={}", addr(n))).collect();
    let mut children = Vec::new();
    for n in 1..=nodes {
        let mut child = Command::new(&exe)
            .arg("serve")
            .args(["--id", &n.to_string(), "--listen", &addr(n)])
            .arg("--dir")
            .arg(dir.join(format!("node-{n}")))
            .args(["--peers", &peers.join(","), "--threads", "1"])
            .args(if n == 1 { &["--init"][..] } else { &[] })
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start node {n}: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut lines = tokio::io::BufReader::new(out).lines();
        match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(l))) if l.contains("listening") => {}
            _ => return Err(format!("node {n} did not start (see its errors above)")),
        }
        children.push(child);
    }
    Ok(LocalCluster {
        children,
        endpoints: (1..=nodes).map(addr).collect(),
    })
}
