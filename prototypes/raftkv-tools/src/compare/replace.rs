//! The member replacement of `raftkv-tools compare --keys N`: with the keys
//! loaded, a follower is replaced as etcd's runbook has it — the leader
//! snapshots and purges its log (`POST /compact`), the member is removed,
//! its directory wiped, a new node started empty under the same id, added
//! (a learner, caught up by the snapshot: the log it would need is gone),
//! and promoted. Timed, with the resident memory of every node sampled
//! every 50 ms throughout.

use super::{status_mib, Cluster};
use crate::local::NodeCommand;
use journal_core::sync::Mutex;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What replacing a member measured.
#[derive(Debug, Clone, Serialize)]
pub struct Replacement {
    /// The node replaced.
    pub node: u64,
    /// Seconds the leader took to snapshot and purge its log.
    pub compact_s: f64,
    /// Seconds from the add to the learner caught up (by snapshot).
    pub catch_up_s: f64,
    /// Of those, the seconds the new member spent installing the
    /// snapshot it received (its `/metrics`), and the file's bytes.
    pub install_s: f64,
    /// The snapshot file's size, bytes.
    pub snapshot_bytes: f64,
    /// Resident memory of each node before, MiB (the replaced node's: the
    /// old process's).
    pub steady_rss_mib: Vec<f64>,
    /// The most each node's resident memory reached during the
    /// replacement, MiB (the replaced node's: the new process's).
    pub peak_rss_mib: Vec<f64>,
    /// Resident memory of each node once it is over, MiB.
    pub after_rss_mib: Vec<f64>,
}

/// POSTs `body` to `url`, retrying a `503` (no leader for a moment: an
/// election under load) for up to 60 s.
async fn post(http: &reqwest::Client, url: String, body: String) -> Result<String, String> {
    let start = Instant::now();
    loop {
        let r = http
            .post(&url)
            .body(body.clone())
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let (status, text) = (r.status(), r.text().await.unwrap_or_default());
        if status.is_success() {
            return Ok(text);
        }
        if status != reqwest::StatusCode::SERVICE_UNAVAILABLE
            || start.elapsed() > Duration::from_secs(60)
        {
            return Err(format!("{url}: {status}: {}", text.trim()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Samples the peak `VmRSS` of `pids` (which may change) until `done`.
pub(crate) fn sampler(
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    done: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<f64>> {
    tokio::spawn(async move {
        let mut peak: Vec<f64> = Vec::new();
        while !*done.borrow() {
            let now: Vec<f64> = pids
                .lock()
                .iter()
                .map(|&pid| status_mib(pid, "VmRSS"))
                .collect();
            peak.resize(now.len(), 0.0);
            for (p, n) in peak.iter_mut().zip(now) {
                *p = p.max(n);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        peak
    })
}

/// Replaces a follower of `cluster` (nodes in `dir/node-N` from
/// `base_port`).
pub(super) async fn replace(
    cluster: &mut Cluster,
    dir: &Path,
    base_port: u16,
    node_args: &[String],
) -> Result<Replacement, String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .map_err(|e| e.to_string())?;
    let probe = crate::client::Client::new(&cluster.endpoints, 0).map_err(|e| e.to_string())?;
    let status = probe
        .status(&cluster.endpoints[0])
        .await
        .map_err(|e| e.to_string())?;
    let leader = status.leader.ok_or("no leader")?;
    // Not node 1 (it carries `--init`, which an empty directory obeys).
    let node = [2u64, 3]
        .into_iter()
        .find(|&n| n != leader)
        .ok_or("no follower")?;
    let i = usize::try_from(node - 1).map_err(|e| e.to_string())?;
    let leader_url = format!(
        "http://{}",
        cluster.endpoints[usize::try_from(leader - 1).map_err(|e| e.to_string())?]
    );
    let steady: Vec<f64> = cluster
        .children
        .iter()
        .map(|c| status_mib(c.id(), "VmRSS"))
        .collect();
    let pids = Arc::new(Mutex::new(
        cluster.children.iter().map(|c| c.id()).collect::<Vec<_>>(),
    ));
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let sampling = sampler(pids.clone(), done_rx);

    let t = Instant::now();
    post(&http, format!("{leader_url}/compact"), String::new()).await?;
    let compact_s = t.elapsed().as_secs_f64();
    let change =
        |body: serde_json::Value| post(&http, format!("{leader_url}/members"), body.to_string());
    change(serde_json::json!({"op": "remove", "id": node})).await?;
    let _ = cluster.children[i].kill().await;
    let mut cmd = NodeCommand::local(3, dir, base_port)?
        .into_iter()
        .nth(i)
        .ok_or("no such node")?;
    cmd.extra.extend_from_slice(node_args);
    let vfs = journal_core::vfs::OsVfs::new();
    remove_tree(&vfs, &cmd.dir)?;
    cluster.children[i] = cmd.spawn().await?;
    pids.lock()[i] = cluster.children[i].id();
    let t = Instant::now();
    change(serde_json::json!({"op": "add", "id": node, "addr": cmd.addr})).await?;
    let catch_up_s = t.elapsed().as_secs_f64();
    let metrics = http
        .get(format!("http://{}/metrics", cmd.addr))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    let install_s = metric(
        &metrics,
        "raftkv_snapshot_duration_seconds_sum{op=\"install\"}",
    );
    let snapshot_bytes = metric(&metrics, "raftkv_snapshot_bytes{op=\"install\"}");
    change(serde_json::json!({"op": "promote", "id": node})).await?;
    // A moment of serving as a voter before the memory is read again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = done_tx.send(true);
    let peak = sampling.await.map_err(|e| e.to_string())?;
    Ok(Replacement {
        node,
        compact_s,
        catch_up_s,
        install_s,
        snapshot_bytes,
        steady_rss_mib: steady,
        peak_rss_mib: peak,
        after_rss_mib: cluster
            .children
            .iter()
            .map(|c| status_mib(c.id(), "VmRSS"))
            .collect(),
    })
}

/// The value of the Prometheus sample `name` (with its labels) in `text`
/// (0 if absent).
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Prints `r` as a table.
pub(super) fn print(r: &Replacement) {
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|m| format!("{m:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    bench_harness::table(
        &[
            "replaced node",
            "compact s",
            "catch-up s",
            "of it install s",
            "snapshot MiB",
            "RSS before MiB",
            "peak MiB",
            "after MiB",
        ],
        &[vec![
            r.node.to_string(),
            format!("{:.1}", r.compact_s),
            format!("{:.1}", r.catch_up_s),
            format!("{:.1}", r.install_s),
            format!("{:.0}", r.snapshot_bytes / 1048576.0),
            fmt(&r.steady_rss_mib),
            fmt(&r.peak_rss_mib),
            fmt(&r.after_rss_mib),
        ]],
    );
}

/// Removes a directory and everything in it (through the Vfs: no
/// `std::fs` outside journal-vfs).
fn remove_tree(vfs: &dyn journal_core::vfs::Vfs, path: &Path) -> Result<(), String> {
    for name in vfs.read_dir(path).map_err(|e| e.to_string())? {
        let p = path.join(name);
        if vfs.remove_file(&p).is_err() {
            remove_tree(vfs, &p)?;
        }
    }
    vfs.remove_dir(path).map_err(|e| e.to_string())
}
