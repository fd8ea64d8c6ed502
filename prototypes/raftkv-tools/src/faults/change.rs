//! The faults that change what the cluster is made of: a member replaced
//! while the leader dies, and a member brought back by a snapshot that it
//! crashes installing.

use super::cluster::ProcCluster;
use super::{Injected, Rng, Targets};
use crate::client::Client;
use raftkv_wire::http::{MemberChange, FAILPOINTS_ENV};
use raftkv_wire::NodeId;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The failpoints in a snapshot install, in the order it reaches them:
/// the new store written but without its applied state; whole and
/// durable but not named current; current, before openraft purged the
/// log it replaces.
pub const INSTALL_POINTS: [&str; 3] = [
    "raftkv::install",
    "raftkv::install-switch",
    "raftkv::installed",
];

/// How long a membership change may take, leader kills included.
const CHANGE_WITHIN: Duration = Duration::from_secs(60);

/// A membership change under way: `old` replaced by `new` (node indexes).
#[derive(Debug)]
pub(super) struct Replacing {
    old: usize,
    new: usize,
    task: JoinHandle<Result<Vec<String>, String>>,
}

impl Replacing {
    /// Waits for the change to finish (it retries through the fault); the
    /// old member is removed for good. An error if it did not finish.
    pub(super) async fn finish(
        self,
        c: &mut ProcCluster,
        events: &mut Vec<String>,
    ) -> Result<(), String> {
        let said = self
            .task
            .await
            .map_err(|e| format!("the membership change: {e}"))??;
        events.extend(said);
        c.nodes[self.old].removed = true;
        events.push(format!(
            "node {} replaced by node {}",
            self.old + 1,
            self.new + 1
        ));
        Ok(())
    }
}

/// The member a fault takes out: the one down for the run, or a live
/// follower; killed if it runs.
async fn victim(
    c: &mut ProcCluster,
    t: Targets,
    down: Option<usize>,
    events: &mut Vec<String>,
) -> Result<usize, String> {
    let v = down.filter(|&d| !c.nodes[d].removed).unwrap_or(t.follower);
    if v == t.lead {
        return Err("no follower to take out".into());
    }
    if c.running(v) {
        c.kill9(v).await?;
        events.push(format!("kill -9 node {}", v + 1));
    }
    Ok(v)
}

/// [`super::Fault::ReplaceMember`]: a new node is started and the member
/// replaced by it through `POST /members`, retried until done; as the
/// change sends one of its three steps (chosen at random), the leader is
/// killed (restarted at the heal, which waits for the change to finish).
pub(super) async fn replace(
    c: &mut ProcCluster,
    t: Targets,
    down: Option<usize>,
    rng: &mut Rng,
    events: &mut Vec<String>,
) -> Result<Injected, String> {
    let old = victim(c, t, down, events).await?;
    let new = c.add_node(rng).await?;
    events.push(format!(
        "start node {} to replace node {}",
        new + 1,
        old + 1
    ));
    let endpoints = c.endpoints();
    let step = rng.below(3) as usize;
    let (at_step, reached) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(change_membership(
        endpoints,
        c.nodes[old].cmd.id,
        c.nodes[new].cmd.id,
        c.nodes[new].cmd.addr.clone(),
        (step, at_step),
    ));
    // The kill races the step's request: it lands before, during or after
    // the leader takes it.
    let _ = tokio::time::timeout(CHANGE_WITHIN, reached).await;
    tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_millis(10))).await;
    c.kill9(t.lead).await?;
    events.push(format!(
        "kill -9 node {} (the leader) at step {} of the change",
        t.lead + 1,
        step + 1
    ));
    Ok(Injected {
        killed: vec![t.lead],
        replacing: Some(Replacing { old, new, task }),
        ..Injected::default()
    })
}

/// Replaces member `old` by `new` at `addr`: adds it as a learner,
/// promotes it, removes `old`, each step sent to the leader of the moment
/// and decided from its membership, so a step lost to a dead leader is
/// sent again. As it first sends step `signal.0` (0: add, 1: promote,
/// 2: remove) it fires `signal.1`. Returns what each attempt answered.
async fn change_membership(
    endpoints: Vec<String>,
    old: NodeId,
    new: NodeId,
    addr: String,
    signal: (usize, tokio::sync::oneshot::Sender<()>),
) -> Result<Vec<String>, String> {
    let (signal_step, signal) = signal;
    let mut signal = Some(signal);
    let probe = Client::new(&endpoints, 0).map_err(|e| e.to_string())?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut said = Vec::new();
    while start.elapsed() < CHANGE_WITHIN {
        let mut leader = None;
        for e in &endpoints {
            if let Ok(s) = probe.status(e).await {
                if s.state == "Leader" && s.leader == Some(s.id) {
                    leader = Some((e.clone(), s));
                    break;
                }
            }
        }
        let Some((at, s)) = leader else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (step, change) = if s.learners.contains_key(&new) {
            (1, MemberChange::Promote { id: new })
        } else if !s.voters.contains_key(&new) {
            let add = MemberChange::Add {
                id: new,
                addr: addr.clone(),
            };
            (0, add)
        } else if s.voters.contains_key(&old) || s.learners.contains_key(&old) {
            (2, MemberChange::Remove { id: old })
        } else {
            return Ok(said);
        };
        if step >= signal_step {
            if let Some(tx) = signal.take() {
                let _ = tx.send(());
            }
        }
        let body = serde_json::to_vec(&change).map_err(|e| e.to_string())?;
        let r = http
            .post(format!("http://{at}/members"))
            .body(body)
            .send()
            .await;
        let (ok, answer) = match r {
            Ok(resp) => (
                resp.status().is_success(),
                format!(
                    "{} {}",
                    resp.status(),
                    resp.text().await.unwrap_or_default()
                ),
            ),
            Err(e) => (false, e.to_string()),
        };
        said.push(format!(
            "+{:.3} s {change:?} at node {}: {}",
            start.elapsed().as_secs_f64(),
            s.id,
            answer.trim()
        ));
        if !ok {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Err(format!(
        "replacing node {old} by node {new} did not finish in {CHANGE_WITHIN:?}: {said:#?}"
    ))
}

/// [`super::Fault::CrashInstallSnapshot`]: the member is taken out, the
/// others write on for 300–800 ms, the leader snapshots and purges its
/// log past it, and the member is restarted with a failpoint in the
/// snapshot install armed from its start: it aborts there (the hold waits
/// for it) and the heal restarts it clean.
pub(super) async fn crash_install(
    c: &mut ProcCluster,
    t: Targets,
    down: Option<usize>,
    rng: &mut Rng,
    events: &mut Vec<String>,
) -> Result<Injected, String> {
    let v = victim(c, t, down, events).await?;
    tokio::time::sleep(rng.between(Duration::from_millis(300), Duration::from_millis(800))).await;
    let others: Vec<usize> = c.live().into_iter().filter(|&i| i != v).collect();
    let leader = c
        .leader(&others, Duration::from_secs(10))
        .await
        .ok_or("no leader to compact its log")?;
    let answer = c.compact(leader).await?;
    events.push(format!("node {}: snapshot, {}", leader + 1, answer.trim()));
    let point = rng.pick(&INSTALL_POINTS).unwrap_or(INSTALL_POINTS[0]);
    let spec = format!("{point}=return");
    c.spawn_with_env(v, vec![(FAILPOINTS_ENV.to_string(), spec.clone())])
        .await?;
    events.push(format!("restart node {} with {spec}", v + 1));
    Ok(Injected {
        killed: vec![v],
        ..Injected::default()
    })
}
