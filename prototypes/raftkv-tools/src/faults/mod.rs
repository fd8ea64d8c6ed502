//! The fault matrix, after etcd's robustness tests: real `raftkv serve`
//! processes on loopback under a recorded workload, a fault injected and
//! healed, every key's history checked for linearizability and every
//! watch stream for order, completeness and agreement.
//!
//! Each [`Fault`] runs twice: with all three members, and **with one
//! member down** for the whole run (a rolling restart, a dead disk) — the
//! cluster that has no spare vote, where a restarted leader resumes its
//! old term. A run ([`run_case`]):
//!
//! 1. starts three nodes, each dialing its peers through a [`proxy::Link`]
//!    per direction; with `degraded`, `kill -9`s a follower for good;
//! 2. starts closed-loop clients on 16 keys (contended enough that reads
//!    meet recent writes; a run short enough that each key's history stays
//!    tractable for the checker), half unique-valued puts, half
//!    linearizable reads (half of them followed by a compare-and-set),
//!    through etcd's gRPC API by default — a write in doubt recorded so and
//!    never resent ([`grpc`] has the rule) — or raftkv's HTTP API, each
//!    write retried under its request id ([`Params::api`], [`workload`]);
//!    half the clients send each operation first to a home node; with
//!    gRPC, a compactor keeps the last [`Params::compact_keep`] revisions;
//!    and three watchers, one first on each member, record watch streams
//!    of every key from revision 1 ([`watchers`]);
//! 3. injects the fault `windows` times, each held for a random time, then
//!    healed (killed nodes restarted from their directories, paused ones
//!    resumed, links restored, failpoints disarmed), with a settle time;
//!    half the holds are under an election timeout; as a node is
//!    restarted, a linearizable read of every key waits in its backlog (a
//!    restarted leader may resume its term, and its state machine catches
//!    up within milliseconds: reads in those milliseconds are where a stale
//!    read hides);
//! 4. stops the clients, heals everything, reads every key linearizably
//!    once more (so a lost write shows), and checks each key's history
//!    within a step budget: a key is linearizable, a **violation**, or
//!    **undecided** (reported apart, never counted as passing); has the
//!    watchers finish at the store's revision and checks their streams
//!    against each other and against what the clients were told
//!    ([`crate::history::watch`]): each problem a **watch violation**;
//! 5. has every live member (not the one down, not a removed one) answer
//!    etcd's `HashKV` at one revision every member applied — the leader's
//!    current one after the final reads — and compares the answers (hash
//!    and compaction revision, as etcd does, [`hashes`]): a member that
//!    differs is a **HashKV mismatch**, each member's answer in the events.
//!
//! Faults that need failpoints (crashes at chosen points, slow or failing
//! fsyncs) arm them over HTTP on the chosen node, which needs a binary
//! built with the `failpoints` feature. A crash failpoint aborts the
//! process (`std::process::abort`): a panic in a tokio task is caught, so
//! it would be no crash.

mod change;
pub mod cluster;
pub mod grpc;
pub mod hashes;
pub mod lag;
mod load;
pub mod proxy;
mod run;
mod soak;
pub mod watchers;
pub mod workload;

pub use lag::{CatchUp, Lag};
pub use run::{campaign, run_case, table, Campaign};
pub use soak::{soak, Soak, SoakReport};
pub use workload::Api;

use crate::history;
use cluster::ProcCluster;
use proxy::Mode;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// `kill -9` of the leader, restarted after the window.
    KillLeader,
    /// `kill -9` of a follower.
    KillFollower,
    /// `kill -9` of a node chosen at random.
    KillRandom,
    /// `kill -9` of every running node at once.
    KillAll,
    /// `SIGSTOP` of the leader, `SIGCONT` after the window.
    PauseLeader,
    /// `SIGSTOP` of a follower.
    PauseFollower,
    /// The leader's links blackholed both ways.
    IsolateLeader,
    /// A follower's links blackholed both ways.
    IsolateFollower,
    /// The leader and one follower cannot reach each other; the third node
    /// reaches both.
    Bridge,
    /// The leader's requests to the others are blackholed; theirs to it
    /// pass.
    LeaderOutboundCut,
    /// Every link of the leader delays each chunk 20–150 ms.
    DelayLeader,
    /// A dead member (the one down for the run, or a follower killed for
    /// it) is replaced by a new node with an empty directory (added as a
    /// learner, promoted, the old one removed), and the leader is killed
    /// while the change goes on.
    ReplaceMember,
    /// A follower `SIGSTOP`ped while the others take a large load of
    /// transactions, then resumed: it must catch up within a bound, every
    /// node's memory within 512 MiB ([`lag`]). Not in [`Fault::ALL`] (its
    /// load is too heavy for the short pass, and a cluster one member
    /// down cannot take it): run by name, with its scale in
    /// [`Params::lag`].
    LaggingFollower,
    /// The leader's log flushes take 20–100 ms longer (failpoint).
    SlowFsyncLeader,
    /// A follower's log flushes take 20–100 ms longer (failpoint).
    SlowFsyncFollower,
    /// The followers' state machines fall behind (one apply 2.5–3.5 s
    /// late, failpoint) while the leader goes on acknowledging writes; then
    /// the leader is killed, held until a follower leads: the new leader
    /// must not serve a read before its apply reaches the read index.
    SlowApplyFailover,
    /// A node aborts just before entries go into its log (failpoint).
    CrashBeforeAppend,
    /// A node aborts after entries went into its log, before the flush.
    CrashBeforeFlush,
    /// A node aborts after the flush, before openraft hears of it.
    CrashAfterFlush,
    /// A node aborts just before it applies a batch.
    CrashBeforeApply,
    /// A node aborts after it applied a batch, before its answers.
    CrashAfterApply,
    /// A member that missed entries the leader then purged (the one down
    /// for the run, or a follower killed for it) comes back, is sent a
    /// snapshot and aborts while installing it (failpoint, at one of three
    /// points); restarted, it installs it again.
    CrashInstallSnapshot,
    /// A follower's log flush fails with EIO: it stops, the rest go on.
    DiskEioFollower,
    /// The leader's log flush fails with ENOSPC.
    DiskFullLeader,
}

impl Fault {
    /// Every fault, in table order.
    pub const ALL: [Fault; 23] = [
        Fault::KillLeader,
        Fault::KillFollower,
        Fault::KillRandom,
        Fault::KillAll,
        Fault::PauseLeader,
        Fault::PauseFollower,
        Fault::IsolateLeader,
        Fault::IsolateFollower,
        Fault::Bridge,
        Fault::LeaderOutboundCut,
        Fault::DelayLeader,
        Fault::ReplaceMember,
        Fault::SlowFsyncLeader,
        Fault::SlowFsyncFollower,
        Fault::SlowApplyFailover,
        Fault::CrashBeforeAppend,
        Fault::CrashBeforeFlush,
        Fault::CrashAfterFlush,
        Fault::CrashBeforeApply,
        Fault::CrashAfterApply,
        Fault::CrashInstallSnapshot,
        Fault::DiskEioFollower,
        Fault::DiskFullLeader,
    ];

    /// The faults run only when named (`raftkv-tools faults --faults NAME`),
    /// each with all members only.
    pub const BY_NAME: [Fault; 1] = [Fault::LaggingFollower];

    /// Whether it also runs with one member down.
    pub fn with_one_down(self) -> bool {
        !Fault::BY_NAME.contains(&self)
    }

    /// Its name in tables and on the command line.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The fault named `name`.
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL
            .into_iter()
            .chain(Fault::BY_NAME)
            .find(|f| f.name() == name)
    }

    /// Whether it arms a failpoint (a binary built with `failpoints`).
    pub fn needs_failpoints(self) -> bool {
        self >= Fault::SlowFsyncLeader
    }

    /// Whether the node it hits ends by itself (a crash at a failpoint, or
    /// a Raft core stopped by a failing disk): the fault is held until it
    /// did (10 s at most), and its run's events must show the exit.
    pub fn ends_the_node(self) -> bool {
        self >= Fault::CrashBeforeAppend
    }
}

/// How long a run's load may go on after its last settle to reach
/// [`Params::min_acked`]: a cluster that cannot acknowledge that many
/// writes this long after every fault healed is stuck, and the run says
/// so.
pub const MIN_ACKED_WAIT: Duration = Duration::from_secs(30);

/// How long and how hard a run is.
#[derive(Debug, Clone)]
pub struct Params {
    /// Closed-loop clients.
    pub clients: u64,
    /// Keys they spread over.
    pub keys: u32,
    /// Faults injected (and healed) per run.
    pub windows: usize,
    /// Load before the first fault.
    pub warmup: Duration,
    /// A fault is held for a random time in this range (or, half the
    /// time, 50–400 ms: under an election timeout).
    pub hold: (Duration, Duration),
    /// Load after each heal.
    pub settle: Duration,
    /// After the last settle, the load goes on (up to [`MIN_ACKED_WAIT`])
    /// until the clients had this many writes acknowledged in the run.
    pub min_acked: usize,
    /// How long a client retries one operation.
    pub op_deadline: Duration,
    /// The API the recorded clients use ([`workload`]).
    pub api: Api,
    /// Watchers recorded through the run ([`watchers`]), watcher `i`
    /// first on member `i`: three, so each member serves one.
    pub watchers: usize,
    /// With the gRPC API, the store is compacted this often, keeping
    /// [`Params::compact_keep`] revisions (`None`: never).
    pub compact_every: Option<Duration>,
    /// Revisions a compaction keeps.
    pub compact_keep: i64,
    /// Search steps per key before it is undecided.
    pub check_budget: u64,
    /// More arguments for every `raftkv serve`.
    pub serve_args: Vec<String>,
    /// The scale of [`Fault::LaggingFollower`] (its own `serve` arguments
    /// included).
    pub lag: Lag,
}

impl Params {
    /// The short pass `cargo test` runs: one fault window per case.
    pub fn short() -> Params {
        Params {
            clients: 6,
            keys: 16,
            windows: 1,
            warmup: Duration::from_millis(500),
            hold: (Duration::from_millis(500), Duration::from_millis(1500)),
            settle: Duration::from_millis(800),
            min_acked: 25,
            op_deadline: Duration::from_secs(4),
            api: Api::Grpc,
            watchers: 3,
            compact_every: Some(Duration::from_secs(1)),
            compact_keep: 50,
            check_budget: 2_000_000,
            serve_args: vec![
                "--threads".into(),
                "1".into(),
                "--snapshot-logs".into(),
                "300".into(),
            ],
            lag: Lag::small(),
        }
    }

    /// A campaign run: three fault windows.
    pub fn campaign() -> Params {
        Params {
            clients: 8,
            windows: 3,
            warmup: Duration::from_secs(1),
            hold: (Duration::from_millis(500), Duration::from_secs(4)),
            settle: Duration::from_millis(1500),
            ..Params::short()
        }
    }
}

/// A small deterministic generator (xorshift64*), one per run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64().checked_rem(n).unwrap_or(0)
    }

    /// A duration in `[lo, hi]`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_millis() as u64;
        lo + Duration::from_millis(self.below(span + 1))
    }

    /// An element of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> Option<T> {
        xs.get(self.below(xs.len() as u64) as usize).copied()
    }
}

/// What one run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The fault.
    pub fault: Fault,
    /// Run with one member down throughout.
    pub degraded: bool,
    /// The run's seed.
    pub seed: u64,
    /// Operations recorded (the final reads included).
    pub ops: usize,
    /// Operations whose span overlaps a fault window.
    pub ops_in_fault: usize,
    /// Writes acknowledged.
    pub acked_writes: usize,
    /// Writes (and compare-and-sets) without an answer that may have been
    /// applied: in doubt.
    pub in_doubt: usize,
    /// Writes known not applied: every attempt refused until the deadline.
    pub not_applied: usize,
    /// Keys whose history is not linearizable.
    pub violations: usize,
    /// Keys the checker could not decide within its budget.
    pub undecided: usize,
    /// Keys checked.
    pub keys: usize,
    /// The watch streams' violations ([`crate::history::watch`]), and
    /// watchers that were not sent everything up to the final revision.
    pub watch_violations: usize,
    /// Events the watchers were sent.
    pub watch_events: usize,
    /// Revisions covered, summed over the watch streams.
    pub watch_covered: u64,
    /// Watch streams resumed on another member after a break.
    pub watch_resumed: usize,
    /// Watch streams a compaction ended.
    pub watch_compacted: usize,
    /// The first watch violations, for the record.
    pub watch_bad: Vec<String>,
    /// Live members whose etcd `HashKV` (hash, compaction revision) at the
    /// common revision after the final reads differs from the others'
    /// ([`hashes`]; each member's answer is in the events).
    pub hash_mismatches: usize,
    /// The longest time from a fault to the first write invoked after it
    /// that succeeded, over the windows (ms).
    pub recovery_write_ms: Option<u64>,
    /// The same for linearizable reads (ms).
    pub recovery_read_ms: Option<u64>,
    /// Operations without an answer, of all.
    pub error_rate: f64,
    /// The p99 latency of the answered operations overlapping a fault
    /// window (ms).
    pub p99_in_fault_ms: Option<f64>,
    /// What happened, in order (faults, heals, exits).
    pub events: Vec<String>,
    /// The violating and undecided keys' histories, for the record.
    #[serde(skip)]
    pub bad_histories: BTreeMap<String, Vec<history::Op>>,
    /// The nodes' stderr, kept when the run did not pass.
    #[serde(skip)]
    pub log: Vec<String>,
    /// What [`Fault::LaggingFollower`] measured.
    pub lag: Option<CatchUp>,
}

impl Report {
    /// Whether the run passed: no violation (of a key's history or of
    /// the watch streams), nothing undecided, every live member's
    /// `HashKV` equal (and a lagging follower caught up
    /// within its bounds).
    pub fn passed(&self) -> bool {
        self.violations == 0
            && self.undecided == 0
            && self.watch_violations == 0
            && self.hash_mismatches == 0
            && self.lag.as_ref().is_none_or(CatchUp::passed)
    }
}

/// A fault in force, and how to heal it.
#[derive(Debug, Default)]
struct Injected {
    /// Nodes killed (or crashed) to restart at the heal.
    killed: Vec<usize>,
    /// Failpoints armed: (node, name).
    armed: Vec<(usize, &'static str)>,
    /// A membership change under way, finished at the heal.
    replacing: Option<change::Replacing>,
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// The nodes a fault may target: those running, not `down`.
fn candidates(c: &mut ProcCluster, down: Option<usize>) -> Vec<usize> {
    c.live().into_iter().filter(|&i| Some(i) != down).collect()
}

/// The nodes a fault may hit, chosen when it is injected.
#[derive(Debug, Clone, Copy)]
struct Targets {
    /// The leader (or, with none at the moment, some live node).
    lead: usize,
    /// A live follower (the leader if there is none).
    follower: usize,
    /// A live node at random.
    any: usize,
}

/// Injects `fault`; says what it did in `events`.
async fn inject(
    c: &mut ProcCluster,
    fault: Fault,
    down: Option<usize>,
    rng: &mut Rng,
    events: &mut Vec<String>,
) -> Result<Injected, String> {
    let live = candidates(c, down);
    let leader = c.leader(&live, Duration::from_secs(5)).await;
    let followers: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| Some(i) != leader)
        .collect();
    // With no leader at the moment (a fault not yet healed by an
    // election), a fault "of the leader" hits some live node.
    let lead = leader
        .or_else(|| rng.pick(&live))
        .ok_or("no node running")?;
    let t = Targets {
        lead,
        follower: rng.pick(&followers).unwrap_or(lead),
        any: rng.pick(&live).unwrap_or(lead),
    };
    if fault == Fault::ReplaceMember {
        change::replace(c, t, down, rng, events).await
    } else if fault == Fault::CrashInstallSnapshot {
        change::crash_install(c, t, down, rng, events).await
    } else if fault.needs_failpoints() {
        arm(c, fault, t, rng, events).await
    } else if fault >= Fault::IsolateLeader {
        cut(c, fault, t, rng, events);
        Ok(Injected::default())
    } else {
        stop(c, fault, t, &live, events).await
    }
}

/// The faults on processes: kills and pauses.
async fn stop(
    c: &mut ProcCluster,
    fault: Fault,
    t: Targets,
    live: &[usize],
    events: &mut Vec<String>,
) -> Result<Injected, String> {
    let mut done = Injected::default();
    match fault {
        Fault::KillAll => {
            for &n in live {
                c.kill9(n).await?;
                done.killed.push(n);
            }
            events.push(format!("kill -9 nodes {:?}", one_based(live)));
        }
        Fault::PauseLeader | Fault::PauseFollower => {
            let n = if fault == Fault::PauseLeader {
                t.lead
            } else {
                t.follower
            };
            c.pause(n, true).await?;
            events.push(format!("SIGSTOP node {}", n + 1));
        }
        _ => {
            let n = match fault {
                Fault::KillLeader => t.lead,
                Fault::KillFollower => t.follower,
                _ => t.any,
            };
            c.kill9(n).await?;
            events.push(format!("kill -9 node {}", n + 1));
            done.killed.push(n);
        }
    }
    Ok(done)
}

/// The faults on links: partitions and delays.
fn cut(c: &mut ProcCluster, fault: Fault, t: Targets, rng: &mut Rng, events: &mut Vec<String>) {
    let n = c.nodes.len();
    let lead = t.lead;
    match fault {
        Fault::IsolateLeader | Fault::IsolateFollower => {
            let x = if fault == Fault::IsolateLeader {
                lead
            } else {
                t.follower
            };
            for o in (0..n).filter(|&o| o != x) {
                c.set_link(x, o, Mode::Blackhole);
                c.set_link(o, x, Mode::Blackhole);
            }
            events.push(format!("isolate node {}", x + 1));
        }
        Fault::Bridge => {
            let bridge = t.follower;
            let other = (0..n).find(|&o| o != lead && o != bridge).unwrap_or(bridge);
            c.set_link(lead, other, Mode::Blackhole);
            c.set_link(other, lead, Mode::Blackhole);
            events.push(format!(
                "cut {} <-> {}, node {} bridges",
                lead + 1,
                other + 1,
                bridge + 1
            ));
        }
        Fault::LeaderOutboundCut => {
            for o in (0..n).filter(|&o| o != lead) {
                c.set_link(lead, o, Mode::Blackhole);
            }
            events.push(format!("blackhole node {}'s requests", lead + 1));
        }
        _ => {
            let d = rng.between(Duration::from_millis(20), Duration::from_millis(150));
            for o in (0..n).filter(|&o| o != lead) {
                c.set_link(lead, o, Mode::Delay(d));
                c.set_link(o, lead, Mode::Delay(d));
            }
            events.push(format!("delay node {}'s links {d:?}", lead + 1));
        }
    }
}

/// The faults at failpoints: slow and failing flushes, crashes.
async fn arm(
    c: &mut ProcCluster,
    fault: Fault,
    t: Targets,
    rng: &mut Rng,
    events: &mut Vec<String>,
) -> Result<Injected, String> {
    let mut done = Injected::default();
    let (node, point, action) = match fault {
        Fault::SlowFsyncLeader | Fault::SlowFsyncFollower => {
            let n = if fault == Fault::SlowFsyncLeader {
                t.lead
            } else {
                t.follower
            };
            let ms = rng.between(Duration::from_millis(20), Duration::from_millis(100));
            done.armed.push((n, FLUSH));
            (n, FLUSH, format!("sleep({})", ms.as_millis()))
        }
        Fault::SlowApplyFailover => {
            // One apply on each follower takes 2.5–3.5 s longer; those
            // queued behind it wait: their state machines fall behind what
            // the leader acknowledges, while their logs keep up.
            let ms = rng.between(Duration::from_millis(2500), Duration::from_millis(3500));
            let action = format!("1*return({})", ms.as_millis());
            let followers: Vec<usize> = candidates(c, None)
                .into_iter()
                .filter(|&n| n != t.lead)
                .collect();
            for &n in &followers {
                c.failpoint(n, APPLY_DELAY, &action).await?;
                done.armed.push((n, APPLY_DELAY));
            }
            events.push(format!(
                "nodes {:?}: {APPLY_DELAY}={action}",
                one_based(&followers)
            ));
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.kill9(t.lead).await?;
            events.push(format!("kill -9 node {}", t.lead + 1));
            done.killed.push(t.lead);
            // The fault is the failover: hold it until one of them leads
            // (with one member down for the run, none can).
            if let Some(l) = c.leader(&followers, Duration::from_secs(10)).await {
                events.push(format!("node {} leads", l + 1));
            }
            return Ok(done);
        }
        Fault::DiskEioFollower => (t.follower, FLUSH, "return(eio)".to_string()),
        Fault::DiskFullLeader => (t.lead, FLUSH, "return(enospc)".to_string()),
        _ => {
            let point = match fault {
                Fault::CrashBeforeAppend => APPEND,
                Fault::CrashBeforeFlush => FLUSH,
                Fault::CrashAfterFlush => FLUSHED,
                Fault::CrashBeforeApply => APPLY,
                _ => APPLIED,
            };
            // The leader or a follower, at random: both append and apply;
            // a few hits pass first, so the crash lands mid-stream.
            let action = match rng.below(20) {
                0 => "return(abort)".to_string(),
                k => format!("{k}*off->return(abort)"),
            };
            (t.any, point, action)
        }
    };
    c.failpoint(node, point, &action).await?;
    events.push(format!("node {}: {point}={action}", node + 1));
    if fault.ends_the_node() {
        done.killed.push(node);
    }
    Ok(done)
}

fn one_based(xs: &[usize]) -> Vec<usize> {
    xs.iter().map(|x| x + 1).collect()
}

/// The failpoint before entries go into the Raft log.
pub const APPEND: &str = "openraft-log::append";
/// The failpoint of the Raft log's flush (`sleep`, `return(eio)`,
/// `return(enospc)`, `return(abort)`).
pub const FLUSH: &str = "openraft-log::flush";
/// The failpoint after the flush, before openraft hears of it.
pub const FLUSHED: &str = "openraft-log::flushed";
/// The failpoint before the state machine applies a batch.
pub const APPLY: &str = "raftkv::apply";
/// The failpoint after a batch is applied, before its answers.
pub const APPLIED: &str = "raftkv::applied";
/// The failpoint that delays each batch's apply by `return(MS)` ms.
pub const APPLY_DELAY: &str = "raftkv::apply-delay";

/// Heals what `inject` did: links, pauses, failpoints; nodes that died
/// (killed, or crashed by a failpoint) restarted from their directories,
/// `before_restart` called with each one's address just before.
async fn heal(
    c: &mut ProcCluster,
    injected: Injected,
    events: &mut Vec<String>,
    before_restart: &mut dyn FnMut(&str),
) -> Result<(), String> {
    c.heal().await?;
    for (t, point) in &injected.armed {
        if c.running(*t) {
            // Best effort: a node that died meanwhile forgot it anyway.
            let _ = c.failpoint(*t, point, "off").await;
        }
    }
    for t in injected.killed {
        if c.running(t) {
            // A crash failpoint not reached, or a disk fault the node
            // survived: disarm what may still be armed.
            for p in [APPEND, FLUSH, FLUSHED, APPLY, APPLIED, APPLY_DELAY]
                .into_iter()
                .chain(change::INSTALL_POINTS)
            {
                let _ = c.failpoint(t, p, "off").await;
            }
            continue;
        }
        if let Some(s) = c.exited(t, Duration::from_millis(10)).await {
            events.push(format!("node {} exited: {s}", t + 1));
        }
        before_restart(&c.nodes[t].cmd.addr);
        c.spawn(t).await?;
        events.push(format!("restart node {}", t + 1));
    }
    if let Some(r) = injected.replacing {
        r.finish(c, events).await?;
    }
    Ok(())
}
