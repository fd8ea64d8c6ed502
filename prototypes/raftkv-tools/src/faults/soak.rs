//! The soak (`raftkv-tools soak`, `cargo xtask raft-soak`): a local cluster kept
//! by the supervisor of `raftkv-tools cluster` ([`crate::local::supervise`]),
//! closed-loop recorded clients, and `kill -9` of a random node every few
//! seconds for a time budget; the supervisor restarts each, and every
//! key's history must stay linearizable.

use super::workload::{self, Api, Rec};
use super::{Params, Rng};
use crate::client::Client;
use crate::history::Kind;
use crate::local::{LogTail, NodeCommand, Restart};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

/// How a soak runs.
#[derive(Debug, Clone)]
pub struct Soak {
    /// The `raftkv` executable.
    pub exe: std::path::PathBuf,
    /// How long the load and the kills go on.
    pub duration: Duration,
    /// A random node is killed this often.
    pub kill_every: Duration,
    /// Recorded clients.
    pub clients: u64,
    /// Keys they spread over (many: a long run's histories stay short).
    pub keys: u32,
    /// The seed.
    pub seed: u64,
}

/// What a soak found.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// Seconds it ran.
    pub seconds: f64,
    /// Nodes killed.
    pub kills: usize,
    /// Operations recorded (the final reads included).
    pub ops: usize,
    /// Writes acknowledged.
    pub acked_writes: usize,
    /// Operations without an answer, of all.
    pub error_rate: f64,
    /// Keys checked.
    pub keys: usize,
    /// Keys whose history is not linearizable.
    pub violations: usize,
    /// Keys the checker could not decide.
    pub undecided: usize,
    /// The supervisor's and the nodes' last lines on stderr.
    #[serde(skip)]
    pub log: Vec<String>,
}

/// Runs the soak in a cluster under `dir`.
pub async fn soak(s: &Soak, dir: &Path) -> Result<SoakReport, String> {
    let mut rng = Rng::new(s.seed);
    let log = LogTail::default();
    let mut nodes = NodeCommand::local(3, dir, super::cluster::free_ports(&mut rng, 3)?)?;
    for n in &mut nodes {
        n.exe = s.exe.clone();
        n.log = Some(log.clone());
    }
    let endpoints: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let (stop_cluster, stopped) = tokio::sync::oneshot::channel::<()>();
    let supervisor = tokio::spawn(crate::local::supervise(
        nodes,
        Restart::default(),
        |_| {},
        async move {
            let _ = stopped.await;
        },
    ));
    let probe = Client::new(&endpoints, 0).map_err(|e| e.to_string())?;
    let base = Instant::now();
    let deadline = Params::short().op_deadline;
    // (The soak keeps to the HTTP API: `raftkv cluster`'s clients.)
    let counts = (s.clients, s.keys);
    let clients = workload::Clients::start(Api::Http, &endpoints, counts, s.seed, base, deadline);
    let mut kills = 0;
    while base.elapsed() + s.kill_every <= s.duration {
        tokio::time::sleep(s.kill_every).await;
        let i = rng.below(3) as usize;
        // The node's pid from itself: the supervisor's child, started by
        // this run.
        if let Ok(st) = probe.status(&endpoints[i]).await {
            let killed = tokio::process::Command::new("kill")
                .args(["-KILL", &st.pid.to_string()])
                .status()
                .await
                .is_ok_and(|s| s.success());
            if killed {
                kills += 1;
                eprintln!(
                    "{:>8.1} s  kill -9 node {} (pid {})",
                    base.elapsed().as_secs_f64(),
                    i + 1,
                    st.pid
                );
            }
        }
    }
    let mut recs: Vec<Rec> = clients.stop().await?;
    let failure = super::run::final_reads(Api::Http, &endpoints, &mut recs, base)
        .await
        .err();
    let seconds = base.elapsed().as_secs_f64();
    let _ = stop_cluster.send(());
    supervisor.await.map_err(|e| e.to_string())??;
    if let Some(f) = failure {
        return Err(format!("{f}\n{}", log.lines().join("\n")));
    }
    let checked = super::run::check_all(&recs, Params::short().check_budget);
    let failed = recs.iter().filter(|r| r.failed).count();
    Ok(SoakReport {
        seconds,
        kills,
        ops: recs.len(),
        acked_writes: recs
            .iter()
            .filter(|r| matches!(r.op.kind, Kind::Write(_)) && r.op.completed.is_some())
            .count(),
        error_rate: failed as f64 / recs.len().max(1) as f64,
        keys: checked.keys,
        violations: checked.violations,
        undecided: checked.undecided,
        log: if checked.violations + checked.undecided > 0 {
            log.lines()
        } else {
            Vec::new()
        },
    })
}
