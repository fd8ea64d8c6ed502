//! The leader's lessor: lease deadlines and the log's clock, as etcd's
//! lessor keeps them.
//!
//! - **Deadlines live on the leader only**, by its monotonic clock
//!   ([`tokio::time::Instant`]), never in the state machine: when one
//!   passes, the leader proposes a revoke ([`Command::LeaseRevoke`]), so an
//!   expiry is a command in the log — the same on every replica, and it
//!   happens on an idle cluster too. Expiries go out a round at a time,
//!   about [`EXPIRY_BUDGET`] keys a round.
//! - **A new leader extends every lease** from its promotion: by its
//!   checkpointed remaining time-to-live, or its whole time-to-live. It
//!   first waits until it applied every entry of the terms before its own
//!   (a read index), so it knows every lease. No clock is compared
//!   between nodes: a leader whose wall clock is ahead expires nothing
//!   early.
//! - **A keep-alive is not a log entry**: the leader, once it confirmed
//!   its leadership after the request arrived (a heartbeat round), moves
//!   the lease's deadline to the arrival plus its time-to-live, in memory.
//!   Any later leader was elected after that round, so its promotion's
//!   extension already covers the keep-alive. Only a lease with a
//!   checkpointed remaining time-to-live needs its keep-alive in the log
//!   ([`Command::LeaseKeepAlive`] clears the checkpoint), or a new leader
//!   would give it the older, shorter remainder.
//! - **Checkpoints**: every `checkpoint_interval` the leader writes the
//!   remaining time-to-live of each lease longer than that interval into
//!   the log ([`Command::LeaseCheckpoint`]), so a lease does not outlive
//!   its time-to-live by a whole time-to-live at each leader change.
//!   Checkpoints and the keep-alives that clear them are proposed one at a
//!   time ([`Lessor::turn`]), so a checkpoint read before a keep-alive
//!   never lands after it.
//! - **The log's clock** (sessions expire by it, [`Command::Clock`]): a
//!   leader goes on from the clock its log holds at its promotion, by its
//!   monotonic clock ([`LogClock`]). It never runs faster than real time;
//!   the time between two leaders is not counted.
//!
//! What a `200` to a keep-alive promises: the lease is not revoked by
//! expiry before its time-to-live has passed since the request arrived,
//! whichever node leads then (nodes' clocks are assumed to run at about
//! the same rate; they need not agree).

use crate::kv::KvError;
use crate::machine::{LeaseChange, LeaseInfo, StateMachine};
use crate::propose::{Outcome, Proposer};
use crate::types::{Command, NodeId, Raft, Verdict, MAX_CHECKPOINT_LEASES};
use journal_core::sync::Mutex;
use openraft::async_runtime::WatchReceiver;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Keys of expired leases revoked in one round, about (always at least
/// one lease): a round is one modest group of entries.
pub const EXPIRY_BUDGET: usize = 10_000;
/// How long a revoke the leader proposed may take before it proposes it
/// again.
const RETRY: Duration = Duration::from_secs(1);
/// How long the lessor waits for a read index at promotion, or for its
/// proposals, before it tries again.
const WAIT: Duration = Duration::from_secs(5);

/// Lease deadlines on the leader (the pure part of the lessor: every
/// instant is given, none is read).
#[derive(Debug, Default)]
pub struct Deadlines {
    /// Lease id to (deadline, time-to-live).
    by_id: BTreeMap<i64, (Instant, Duration)>,
    /// (deadline, id), soonest first.
    by_time: BTreeSet<(Instant, i64)>,
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

impl Deadlines {
    /// The deadlines of a leader promoted at `now`: each lease's
    /// checkpointed remaining time-to-live, or its whole one, from `now`.
    pub fn promote(table: &[LeaseInfo], now: Instant) -> Deadlines {
        let mut d = Deadlines::default();
        for l in table {
            d.set(l.id, now + ms(l.left_ms()), ms(l.ttl_ms));
        }
        d
    }

    fn set(&mut self, id: i64, at: Instant, ttl: Duration) {
        if let Some((old, _)) = self.by_id.insert(id, (at, ttl)) {
            self.by_time.remove(&(old, id));
        }
        self.by_time.insert((at, id));
    }

    /// Moves lease `id`'s deadline to `at` if that is later (a grant, a
    /// keep-alive).
    pub fn extend(&mut self, id: i64, at: Instant, ttl: Duration) {
        match self.by_id.get(&id) {
            Some(&(old, _)) if old >= at => {}
            _ => self.set(id, at, ttl),
        }
    }

    /// Forgets lease `id` (it ended).
    pub fn remove(&mut self, id: i64) {
        if let Some((at, _)) = self.by_id.remove(&id) {
            self.by_time.remove(&(at, id));
        }
    }

    /// Lease `id`'s deadline.
    pub fn deadline(&self, id: i64) -> Option<Instant> {
        self.by_id.get(&id).map(|&(at, _)| at)
    }

    /// The soonest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.by_time.first().map(|&(at, _)| at)
    }

    /// Leases known.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no lease is known.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The leases past their deadline at `now`, soonest first, while their
    /// keys (`keys`) stay within `budget` (always at least one lease).
    pub fn expired(&self, now: Instant, keys: impl Fn(i64) -> usize, budget: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut total = 0usize;
        for &(at, id) in &self.by_time {
            if at > now {
                break;
            }
            let n = keys(id);
            if !out.is_empty() && total.saturating_add(n) > budget {
                break;
            }
            total = total.saturating_add(n);
            out.push(id);
        }
        out
    }

    /// The remaining time-to-live at `now` (ms, at least 1) of each lease
    /// whose time-to-live is longer than `longer_than`, by id.
    pub fn checkpoints(&self, now: Instant, longer_than: Duration) -> Vec<(i64, u64)> {
        self.by_id
            .iter()
            .filter(|(_, &(_, ttl))| ttl > longer_than)
            .map(|(&id, &(at, _))| {
                let left = at.saturating_duration_since(now).as_millis();
                (id, u64::try_from(left).unwrap_or(u64::MAX).max(1))
            })
            .collect()
    }

    /// Takes the state machine's changes in at `now`. `reload` gives the
    /// whole table when it was replaced.
    pub fn apply(
        &mut self,
        changes: &[LeaseChange],
        now: Instant,
        reload: impl FnOnce() -> Vec<LeaseInfo>,
    ) {
        for c in changes {
            match *c {
                LeaseChange::Granted { id, ttl_ms } | LeaseChange::Renewed { id, ttl_ms } => {
                    self.extend(id, now + ms(ttl_ms), ms(ttl_ms));
                }
                LeaseChange::Ended { id } => self.remove(id),
                LeaseChange::Reloaded => {
                    let table = reload();
                    let held: BTreeSet<i64> = table.iter().map(|l| l.id).collect();
                    let gone: Vec<i64> = self
                        .by_id
                        .keys()
                        .filter(|id| !held.contains(id))
                        .copied()
                        .collect();
                    for id in gone {
                        self.remove(id);
                    }
                    for l in &table {
                        if !self.by_id.contains_key(&l.id) {
                            self.set(l.id, now + ms(l.left_ms()), ms(l.ttl_ms));
                        }
                    }
                    // (The table already holds what followed.)
                    return;
                }
            }
        }
    }
}

/// The log's clock as the leader proposes it ([`Command::Clock`]).
#[derive(Debug, Default)]
pub struct LogClock {
    /// While this node leads: the log's clock at its promotion (ms), and
    /// the instant then.
    base: Mutex<Option<(u64, Instant)>>,
}

impl LogClock {
    /// The log's clock now: from the promotion's base by this node's
    /// monotonic clock while it leads; else the applied one (`applied`,
    /// asked only then), which it does not advance.
    pub fn now_ms(&self, applied: impl FnOnce() -> u64) -> u64 {
        let base = *self.base.lock();
        match base {
            Some((base, at)) => {
                let since = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
                base.saturating_add(since)
            }
            None => applied(),
        }
    }

    fn lead(&self, base: u64, now: Instant) {
        *self.base.lock() = Some((base, now));
    }

    fn stop(&self) {
        *self.base.lock() = None;
    }
}

/// The leader's lessor (one per node; primary while the node leads).
#[derive(Debug)]
pub struct Lessor {
    machine: StateMachine,
    /// `Some` while primary: the deadlines.
    primary: Mutex<Option<Deadlines>>,
    clock: Arc<LogClock>,
    /// Held while proposing a checkpoint or a keep-alive that clears one.
    log: tokio::sync::Mutex<()>,
    checkpoint_interval: Duration,
}

impl Lessor {
    /// The lessor of the node whose state machine is `machine`,
    /// checkpointing leases longer than `checkpoint_interval` at that
    /// interval.
    pub fn new(machine: StateMachine, checkpoint_interval: Duration) -> Lessor {
        Lessor {
            machine,
            primary: Mutex::new(None),
            clock: Arc::new(LogClock::default()),
            log: tokio::sync::Mutex::new(()),
            checkpoint_interval,
        }
    }

    /// The log's clock the proposer writes.
    pub fn clock(&self) -> Arc<LogClock> {
        self.clock.clone()
    }

    /// Whether this lessor is primary (its node leads and it took over
    /// the leases).
    pub fn is_primary(&self) -> bool {
        self.primary.lock().is_some()
    }

    /// Lease `id`'s deadline, while primary.
    pub fn deadline(&self, id: i64) -> Option<Instant> {
        self.primary.lock().as_ref().and_then(|d| d.deadline(id))
    }

    /// The turn to propose what changes a lease's remaining time-to-live
    /// (a checkpoint, or a keep-alive that clears one): one at a time.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.log.lock().await
    }

    /// A keep-alive of lease `id` (of time-to-live `ttl_ms`) that arrived
    /// at `arrived`, once the leadership was confirmed after it: the
    /// deadline moves to `arrived` + the time-to-live. (Not primary: the
    /// next promotion, later than `arrived`, extends every lease anyway.)
    pub fn renew(&self, id: i64, ttl_ms: u64, arrived: Instant) {
        if let Some(d) = self.primary.lock().as_mut() {
            d.extend(id, arrived + ms(ttl_ms), ms(ttl_ms));
        }
    }

    /// Takes over the leases at `now`: listens to the table's changes, and
    /// every lease is extended from `now`; the log's clock goes on from
    /// the applied one.
    fn promote(&self, now: Instant) {
        let table = self.machine.listen_to_leases();
        *self.primary.lock() = Some(Deadlines::promote(&table, now));
        self.clock.lead(self.machine.log_clock(), now);
    }

    fn demote(&self) {
        *self.primary.lock() = None;
        self.clock.stop();
        self.machine.stop_listening_to_leases();
    }

    fn take_changes(&self) {
        let changes = self.machine.take_lease_changes();
        if changes.is_empty() {
            return;
        }
        let now = Instant::now();
        if let Some(d) = self.primary.lock().as_mut() {
            d.apply(&changes, now, || self.machine.listen_to_leases());
        }
    }

    /// Proposes revokes of the leases past their deadline (a round of
    /// them, [`EXPIRY_BUDGET`]); a revoke not applied is proposed again
    /// [`RETRY`] later.
    async fn expire(&self, proposer: &Proposer) {
        let now = Instant::now();
        let due = {
            let mut primary = self.primary.lock();
            let Some(d) = primary.as_mut() else { return };
            let keys = |id| self.machine.lease(id).map_or(0, |l| l.keys);
            let due = d.expired(now, keys, EXPIRY_BUDGET);
            for &id in &due {
                let ttl = d.by_id.get(&id).map_or(Duration::ZERO, |&(_, t)| t);
                d.set(id, now + RETRY, ttl);
            }
            due
        };
        let revokes = due.iter().map(|&lease| async move {
            let cmd = Command::LeaseRevoke { lease, id: None };
            (
                lease,
                tokio::time::timeout(WAIT, proposer.propose(cmd)).await,
            )
        });
        for (lease, outcome) in futures_util::future::join_all(revokes).await {
            if let Ok(Outcome::Applied {
                verdict: Verdict::Refused(KvError::LeaseNotFound),
                ..
            }) = outcome
            {
                if let Some(d) = self.primary.lock().as_mut() {
                    d.remove(lease);
                }
            }
        }
    }

    /// Writes the remaining time-to-live of the long leases into the log.
    async fn checkpoint(&self, proposer: &Proposer) {
        let _turn = self.turn().await;
        let now = Instant::now();
        let all = match self.primary.lock().as_ref() {
            Some(d) => d.checkpoints(now, self.checkpoint_interval),
            None => return,
        };
        for leases in all.chunks(MAX_CHECKPOINT_LEASES) {
            let cmd = Command::LeaseCheckpoint {
                leases: leases.to_vec(),
            };
            if tokio::time::timeout(WAIT, proposer.propose(cmd))
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Runs the lessor of node `me` until Raft stops: primary whenever
    /// the node leads (see the module docs).
    pub async fn run(self: Arc<Self>, raft: Raft, proposer: Proposer, me: NodeId) {
        let mut server = raft.server_metrics();
        loop {
            let Some(vote) = leading(&server.borrow_watched(), me) else {
                if server.changed().await.is_err() {
                    return;
                }
                continue;
            };
            // Every entry before this term applied: every lease known.
            let read = raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex);
            if !matches!(tokio::time::timeout(WAIT, read).await, Ok(Ok(_))) {
                // (Leadership lost, or no majority yet: look again once
                // something changed, or a while later.)
                let _ = tokio::time::timeout(RETRY, server.changed()).await;
                continue;
            }
            self.promote(Instant::now());
            let stopped = self.lead(&mut server, &proposer, (me, vote)).await;
            self.demote();
            if stopped {
                return;
            }
        }
    }

    /// Primary while node `me` leads under `vote`; `true` if Raft stopped.
    async fn lead(
        &self,
        server: &mut Server,
        proposer: &Proposer,
        (me, vote): (NodeId, Vote),
    ) -> bool {
        let every = self.checkpoint_interval.max(Duration::from_millis(100));
        let mut checkpoints = tokio::time::interval(every);
        checkpoints.reset();
        loop {
            if leading(&server.borrow_watched(), me) != Some(vote) {
                return false;
            }
            // (Changes noted while proposing are taken before the next
            // deadline is read.)
            self.take_changes();
            let next = self.primary.lock().as_ref().and_then(Deadlines::next);
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = tokio::time::sleep_until(next.unwrap_or(far)) => self.expire(proposer).await,
                _ = self.machine.lease_changes() => {}
                _ = checkpoints.tick() => self.checkpoint(proposer).await,
                r = server.changed() => if r.is_err() {
                    return true;
                },
            }
        }
    }
}

type Vote = openraft::alias::VoteOf<crate::TypeConfig>;
type Server = openraft::alias::WatchReceiverOf<
    crate::TypeConfig,
    openraft::metrics::RaftServerMetrics<crate::TypeConfig>,
>;

/// The vote this node leads under, if it leads.
fn leading(
    m: &openraft::metrics::RaftServerMetrics<crate::TypeConfig>,
    me: NodeId,
) -> Option<Vote> {
    (m.state.is_leader() && m.current_leader == Some(me)).then_some(m.vote)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: i64, ttl_ms: u64, remaining_ms: Option<u64>, keys: usize) -> LeaseInfo {
        LeaseInfo {
            id,
            ttl_ms,
            remaining_ms,
            keys,
        }
    }

    #[test]
    fn a_new_leader_extends_every_lease_from_its_promotion() {
        let t0 = Instant::now();
        let promoted = t0 + Duration::from_secs(100);
        let d = Deadlines::promote(
            &[lease(1, 10_000, None, 0), lease(2, 600_000, Some(5_000), 0)],
            promoted,
        );
        // By its whole time-to-live, or by what its checkpoint left.
        assert_eq!(d.deadline(1), Some(promoted + ms(10_000)));
        assert_eq!(d.deadline(2), Some(promoted + ms(5_000)));
        assert_eq!(d.next(), Some(promoted + ms(5_000)));
        assert_eq!(
            d.expired(promoted + ms(4_999), |_| 0, 10),
            Vec::<i64>::new()
        );
        assert_eq!(d.expired(promoted + ms(5_000), |_| 0, 10), [2]);
        assert_eq!(d.expired(promoted + ms(10_000), |_| 0, 10), [2, 1]);
    }

    #[test]
    fn keep_alives_and_grants_only_extend_and_an_end_forgets() {
        let t0 = Instant::now();
        let mut d = Deadlines::promote(&[lease(1, 10_000, None, 0)], t0);
        d.extend(1, t0 + ms(3_000), ms(10_000));
        assert_eq!(d.deadline(1), Some(t0 + ms(10_000)), "never shortened");
        d.extend(1, t0 + ms(12_000), ms(10_000));
        assert_eq!(d.deadline(1), Some(t0 + ms(12_000)));
        let t1 = t0 + ms(1_000);
        d.apply(
            &[
                LeaseChange::Granted {
                    id: 7,
                    ttl_ms: 2_000,
                },
                LeaseChange::Ended { id: 1 },
                LeaseChange::Renewed {
                    id: 7,
                    ttl_ms: 2_000,
                },
            ],
            t1,
            Vec::new,
        );
        assert_eq!(d.deadline(1), None);
        assert_eq!(d.deadline(7), Some(t1 + ms(2_000)));
        assert_eq!(d.len(), 1);
        // A reload keeps what it knows, adds what is new, drops what went.
        let t2 = t1 + ms(1_000);
        d.apply(&[LeaseChange::Reloaded], t2, || {
            vec![lease(7, 2_000, None, 0), lease(9, 4_000, Some(1_000), 0)]
        });
        assert_eq!(d.deadline(7), Some(t1 + ms(2_000)));
        assert_eq!(d.deadline(9), Some(t2 + ms(1_000)));
        d.apply(&[LeaseChange::Reloaded], t2, || {
            vec![lease(9, 4_000, None, 0)]
        });
        assert_eq!(d.deadline(7), None);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn a_round_of_expiries_is_bounded_by_keys_but_takes_one_lease_at_least() {
        let t0 = Instant::now();
        let table: Vec<_> = (1..=5)
            .map(|id| lease(id, 1_000 * id as u64, None, 0))
            .collect();
        let d = Deadlines::promote(&table, t0);
        let keys = |id: i64| if id == 1 { 50_000 } else { 4_000 };
        let late = t0 + ms(10_000);
        assert_eq!(d.expired(late, keys, EXPIRY_BUDGET), [1]);
        let d2 = Deadlines::promote(&table[1..], t0);
        assert_eq!(d2.expired(late, keys, EXPIRY_BUDGET), [2, 3]);
    }

    #[test]
    fn checkpoints_hold_what_is_left_of_the_long_leases() {
        let t0 = Instant::now();
        let d = Deadlines::promote(&[lease(1, 60_000, None, 0), lease(2, 1_000, None, 0)], t0);
        let cps = d.checkpoints(t0 + ms(20_000), Duration::from_secs(30));
        assert_eq!(cps, [(1, 40_000)]);
        let late = d.checkpoints(t0 + ms(90_000), Duration::from_secs(30));
        assert_eq!(late, [(1, 1)]);
    }

    #[test]
    fn the_log_clock_goes_on_from_the_log_and_never_back() {
        let c = LogClock::default();
        assert_eq!(c.now_ms(|| 500), 500);
        c.lead(1_000, Instant::now() - ms(250));
        let now = c.now_ms(|| panic!("the applied clock is not read while leading"));
        assert!((1_250..1_250 + 60_000).contains(&now), "{now}");
        assert!(c.now_ms(|| 0) >= now, "never back");
        c.stop();
        assert_eq!(c.now_ms(|| 700), 700);
    }
}
