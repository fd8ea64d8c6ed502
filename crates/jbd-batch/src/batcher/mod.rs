//! The batcher: handles on the running transaction, the batching wait,
//! leadership of a group's commit, and the parked committers it settles.

mod parking;

use crate::policy::{bucket, Stats};
use crate::{BatchConfig, BatchPolicy, BatchStats, WaitDecision, GROUP_BUCKETS};
use journal_sync::thread::{self, ThreadId};
use journal_sync::{Arc, Condvar, Deadline, Gate, Mutex, MutexGuard, Stopwatch};
use parking::{Parked, Wakes, MAX_GATES};
use std::fmt;
use std::time::Duration;

struct State<P, E> {
    /// Open handles on the running transaction (jbd2 `t_updates`).
    updates: u32,
    /// Handles ever opened on the running transaction (`t_handle_count`).
    handle_count: u64,
    /// When the running transaction got its first handle.
    txn_start: Option<Stopwatch>,
    /// Highest position stopped synchronously and not yet taken by a leader.
    pending: Option<P>,
    /// Synchronous stops waiting for the next leader.
    pending_members: u64,
    /// Commits in flight, oldest first. Their targets strictly increase.
    flights: std::collections::VecDeque<Flight<P>>,
    /// Every position up to this one is committed.
    committed: Option<P>,
    /// The latest failed commit: its target and error.
    failed: Option<(P, E)>,
    last_sync_writer: Option<ThreadId>,
    /// Average commit time (jbd2 `j_average_commit_time`), ns.
    avg_commit_ns: u64,
    /// The timer event: the running transaction's batching window has
    /// elapsed. Cleared when a leader closes the transaction.
    window_elapsed: bool,
    /// Threads in a batching wait (so handle changes wake only them, and
    /// only when there are any).
    batch_waiters: u32,
    /// The id of the group the next leader will commit; stops registered
    /// now belong to it.
    next_group: u64,
    /// Committers asleep until a commit covers them (or they must look
    /// again: to lead, or to learn of a failure).
    parked: Vec<Parked<P>>,
    /// The lane the next parked committer sleeps in (round robin, so the
    /// members of one group rarely share one and a leader's nudge wakes
    /// only it).
    next_lane: u32,
}

/// A commit in flight.
struct Flight<P> {
    group: u64,
    target: P,
    /// Its write is done ([`Stage::written`]; from the start for a batcher
    /// made with [`Batcher::new`]): the next group may start its commit.
    written: bool,
    /// Synchronous stops in its group.
    members: u64,
}

type CommitFn<P, E> = dyn Fn(P, &Stage<'_, P, E>) -> Result<(), E> + Send + Sync;

/// What a commit function of a [`Batcher::staged`] batcher reports while
/// it runs: [`Stage::written`] once its write is done and only its flush
/// remains, so that the next group may start its commit (its write then
/// goes to the device while this flush runs).
pub struct Stage<'a, P, E> {
    batcher: &'a Batcher<P, E>,
    group: u64,
    alone: bool,
}

impl<P, E> fmt::Debug for Stage<'_, P, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stage")
            .field("group", &self.group)
            .field("alone", &self.alone)
            .finish()
    }
}

impl<P, E> Stage<'_, P, E>
where
    P: Ord + Copy + Send + 'static,
    E: Clone + Send + 'static,
{
    /// Whether this commit was alone when its leader took it: one member,
    /// nothing else in flight, nobody waiting, no handle open. Nothing
    /// could overlap its flush then, so the commit function may make it
    /// durable in one stage (a lone writer pays nothing for the overlap
    /// it cannot use), without calling [`Stage::written`]; a committer
    /// arriving meanwhile waits for it to complete.
    pub fn alone(&self) -> bool {
        self.alone
    }

    /// This commit's write is done: if a commit slot is free and a group
    /// is pending, its leader may start now (a parked committer is woken
    /// to lead it) — unless this commit's group is larger than
    /// [`BatchConfig::overlap_max_group`], in which case the next group
    /// waits for this commit to complete. Calling it again does nothing.
    pub fn written(&self) {
        let b = self.batcher;
        let mut st = b.inner.state.lock();
        match st.flights.iter_mut().find(|f| f.group == self.group) {
            Some(f) if !f.written && f.members <= b.inner.config.overlap_max_group => {
                f.written = true
            }
            _ => return,
        }
        let mut wakes = Wakes::default();
        if b.may_lead(&st) {
            wakes.nudge = b.pick_leader(&mut st);
        }
        drop(st);
        wakes.run(&b.inner.gates);
    }
}

struct Inner<P, E> {
    config: BatchConfig,
    commit: Box<CommitFn<P, E>>,
    /// Whether commits report their write done ([`Batcher::staged`]).
    staged: bool,
    state: Mutex<State<P, E>>,
    /// Batching waits: signalled when the last handle closes, the timer
    /// fires, or a commit completes.
    batch_cv: Condvar,
    /// Where parked committers sleep, one gate per live group: group `g`
    /// on `gates[g % len]`. At most `max_in_flight` groups are in flight
    /// and one is pending, so with `max_in_flight + 2` gates (up to
    /// [`MAX_GATES`]) no two live groups share one. (Sharing would cost
    /// spurious wakeups, never a lost one: a woken committer looks at its
    /// own flag.)
    gates: Vec<Gate>,
    stats: Stats,
}

/// The commit batcher. Cheap to clone; clones share one running
/// transaction.
pub struct Batcher<P, E> {
    inner: Arc<Inner<P, E>>,
}

impl<P, E> Clone for Batcher<P, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<P, E> fmt::Debug for Batcher<P, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl<P, E> Batcher<P, E>
where
    P: Ord + Copy + Send + 'static,
    E: Clone + Send + 'static,
{
    /// A batcher whose leaders call `commit(position)`: it must return once
    /// every position up to `position` is committed (durable), or fail.
    /// With [`BatchConfig::max_in_flight`] above 1, the next group's leader
    /// starts as soon as a commit slot is free.
    pub fn new(
        config: BatchConfig,
        commit: impl Fn(P) -> Result<(), E> + Send + Sync + 'static,
    ) -> Self {
        Self::build(
            config,
            false,
            Box::new(move |p, _: &Stage<'_, P, E>| commit(p)),
        )
    }

    /// A batcher whose commits come in two stages, a write then a flush:
    /// leaders call `commit(position, stage)`, which must call
    /// [`Stage::written`] once its write is done, and return once every
    /// position up to `position` is committed (durable), or fail. With
    /// [`BatchConfig::max_in_flight`] above 1, the next group's leader
    /// starts only once every commit in flight has reported its write
    /// done: its group gathers while the writes run, and its write overlaps
    /// the flushes still running (a write and a flush to the device at
    /// once, rather than two half-sized groups writing together).
    pub fn staged(
        config: BatchConfig,
        commit: impl Fn(P, &Stage<'_, P, E>) -> Result<(), E> + Send + Sync + 'static,
    ) -> Self {
        Self::build(config, true, Box::new(commit))
    }

    fn build(config: BatchConfig, staged: bool, commit: Box<CommitFn<P, E>>) -> Self {
        let gates = (0..(config.max_in_flight.max(1) as usize + 2).min(MAX_GATES))
            .map(|_| Gate::new())
            .collect();
        Self {
            inner: Arc::new(Inner {
                config,
                commit,
                staged,
                state: Mutex::new(State {
                    updates: 0,
                    handle_count: 0,
                    txn_start: None,
                    pending: None,
                    pending_members: 0,
                    flights: std::collections::VecDeque::new(),
                    committed: None,
                    failed: None,
                    last_sync_writer: None,
                    avg_commit_ns: 0,
                    window_elapsed: false,
                    batch_waiters: 0,
                    next_group: 0,
                    parked: Vec::new(),
                    next_lane: 0,
                }),
                batch_cv: Condvar::new(),
                gates,
                stats: Stats::default(),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BatchConfig {
        &self.inner.config
    }

    /// Opens a handle on the running transaction.
    pub fn start(&self) -> Handle<P, E> {
        let mut st = self.inner.state.lock();
        st.updates += 1;
        st.handle_count += 1;
        if st.txn_start.is_none() {
            st.txn_start = Some(Stopwatch::start());
        }
        // No batching waiter needs to know: a new handle only matters to
        // the policies that extend their window, and they look when it
        // elapses.
        drop(st);
        Handle {
            batcher: self.clone(),
            open: true,
        }
    }

    /// Every position up to this one is committed.
    pub fn committed(&self) -> Option<P> {
        self.inner.state.lock().committed
    }

    /// Handles open right now.
    pub fn open_handles(&self) -> u32 {
        self.inner.state.lock().updates
    }

    /// The timer event: the running transaction's batching window has
    /// elapsed, so every batching wait on it ends (and later stops on it do
    /// not wait). In production a waiter's own deadline fires it; loom
    /// models call it from a "timer" thread, since loom's clock never moves.
    pub fn fire_timer(&self) {
        self.inner.state.lock().window_elapsed = true;
        self.inner.batch_cv.notify_all();
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> BatchStats {
        let s = &self.inner.stats;
        let mut group_sizes = [0; GROUP_BUCKETS];
        for (out, c) in group_sizes.iter_mut().zip(&s.group_sizes) {
            *out = c.get();
        }
        BatchStats {
            groups: s.groups.get(),
            members: s.members.get(),
            already_covered: s.already_covered.get(),
            group_sizes,
            skipped_lone: s.skipped_lone.get(),
            skipped_last_writer: s.skipped_last_writer.get(),
            waits_taken: s.waits_taken.get(),
            waits_ended_by_group: s.waits_ended_by_group.get(),
            waits_ended_by_timer: s.waits_ended_by_timer.get(),
            wait_ns: s.wait_ns.get(),
            avg_commit_ns: self.inner.state.lock().avg_commit_ns,
        }
    }

    fn close_handle(&self, st: &mut State<P, E>) {
        st.updates -= 1;
    }

    fn covered(st: &State<P, E>, pos: P) -> bool {
        st.committed.is_some_and(|c| pos <= c)
    }

    /// The batching wait of a synchronous stop at `pos`. The caller's
    /// handle is already closed.
    fn batch_wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, State<P, E>>,
        pos: P,
    ) -> (MutexGuard<'a, State<P, E>>, WaitDecision) {
        let cfg = &self.inner.config;
        let stats = &self.inner.stats;
        let me = thread::current().id();
        let was_last = st.last_sync_writer == Some(me);
        st.last_sync_writer = Some(me);
        if Self::covered(&st, pos) {
            stats.already_covered.incr();
            return (st, WaitDecision::AlreadyCommitted);
        }
        let (window, extend_while_joining) = match cfg.policy {
            _ if cfg.max_batch.is_zero() => return (st, WaitDecision::Disabled),
            BatchPolicy::None => return (st, WaitDecision::Disabled),
            BatchPolicy::Adaptive => {
                if st.updates == 0 {
                    stats.skipped_lone.incr();
                    return (st, WaitDecision::SkippedLone);
                }
                if was_last {
                    stats.skipped_last_writer.incr();
                    return (st, WaitDecision::SkippedLastWriter);
                }
                let avg = Duration::from_nanos(st.avg_commit_ns);
                // Not `clamp`, which panics when min > max: the upper
                // bound wins.
                (avg.max(cfg.min_batch).min(cfg.max_batch), false)
            }
            BatchPolicy::LastSyncWriter => {
                if was_last {
                    stats.skipped_last_writer.incr();
                    return (st, WaitDecision::SkippedLastWriter);
                }
                (cfg.fixed_window, true)
            }
            BatchPolicy::FixedSleep(d) => (d, true),
        };
        stats.waits_taken.incr();
        let waited = Stopwatch::start();
        let age = st.txn_start.map(|t| t.elapsed()).unwrap_or_default();
        let mut deadline = Deadline::after(window.saturating_sub(age));
        let mut seen_handles = st.handle_count;
        let decision = loop {
            if Self::covered(&st, pos) {
                break WaitDecision::EndedByCommit;
            }
            if !extend_while_joining && st.updates == 0 {
                stats.waits_ended_by_group.incr();
                break WaitDecision::EndedByGroup;
            }
            if st.window_elapsed {
                if extend_while_joining && st.handle_count != seen_handles {
                    // jbd: sleep again while new handles keep joining.
                    seen_handles = st.handle_count;
                    st.window_elapsed = false;
                    deadline = Deadline::after(window);
                    continue;
                }
                stats.waits_ended_by_timer.incr();
                break WaitDecision::EndedByTimer;
            }
            st.batch_waiters += 1;
            let (g, expired) = self.inner.batch_cv.wait_deadline(st, &deadline);
            st = g;
            st.batch_waiters -= 1;
            if expired {
                st.window_elapsed = true; // the timer event, fired by the clock
            }
        };
        stats.wait_ns.add(waited.elapsed().as_nanos() as u64);
        (st, decision)
    }

    /// Registers a synchronous stop at `pos` for the next group, before any
    /// batching wait: whoever leads next commits it too, even while this
    /// thread is still waiting for joiners (its wait then ends by commit).
    /// Returns the id of the group it joined (none if already covered).
    fn register(&self, st: &mut State<P, E>, pos: P) -> Option<u64> {
        if Self::covered(st, pos) {
            return None;
        }
        // A commit in flight whose target covers it: wait for that one
        // (counted here: that commit's group did not count it).
        if let Some(f) = st.flights.iter().find(|f| pos <= f.target) {
            self.inner.stats.already_covered.incr();
            return Some(f.group);
        }
        st.pending = Some(st.pending.map_or(pos, |p| p.max(pos)));
        st.pending_members += 1;
        Some(st.next_group)
    }

    /// Whether the pending group may be led now: a commit slot is free and
    /// every commit in flight has its write done.
    fn may_lead(&self, st: &State<P, E>) -> bool {
        st.pending.is_some()
            && (st.flights.len() as u32) < self.inner.config.max_in_flight.max(1)
            && st.flights.iter().all(|f| f.written)
    }

    /// Returns once `pos` is committed, leading the commit if nobody is.
    ///
    /// `wake_batch`: this thread closed the last open handle while others
    /// were in their batching wait, and has not woken them: if it leads
    /// the commit, the commit's end wakes them (once, covered); if it does
    /// not lead, it wakes them before it returns or sleeps, so one of
    /// them can.
    fn commit_through<'a>(
        &'a self,
        mut st: MutexGuard<'a, State<P, E>>,
        pos: P,
        group: Option<u64>,
        mut wake_batch: bool,
    ) -> Result<(), E> {
        loop {
            let outcome = if Self::covered(&st, pos) {
                Some(Ok(()))
            } else {
                match &st.failed {
                    Some((target, e)) if pos <= *target => Some(Err(e.clone())),
                    _ => None,
                }
            };
            if let Some(outcome) = outcome {
                // This thread may have been the one woken to lead the next
                // group, yet be covered already (its position arrived out of
                // order): pass that wakeup on, or nobody would lead.
                let mut wakes = Wakes::default();
                if self.may_lead(&st) {
                    wakes.nudge = self.pick_leader(&mut st);
                }
                if wake_batch && st.batch_waiters > 0 {
                    self.inner.batch_cv.notify_all();
                }
                drop(st);
                wakes.run(&self.inner.gates);
                return outcome;
            }
            if self.may_lead(&st) {
                // The commit's end wakes the batching waiters.
                wake_batch = false;
                st = self.lead(st);
                continue;
            }
            if std::mem::take(&mut wake_batch) && st.batch_waiters > 0 {
                self.inner.batch_cv.notify_all();
            }
            debug_assert!(group.is_some(), "an uncovered stop joined a group");
            let group = group.unwrap_or(st.next_group);
            match self.park(st, pos, group) {
                None => return Ok(()),
                Some(relocked) => st = relocked,
            }
        }
    }

    /// Leads the pending group (any thread may lead it, even one whose own
    /// position is in flight in an earlier group): takes it in flight,
    /// commits it outside the lock, records the result and wakes the
    /// parked committers it settled. Returns the relocked state.
    fn lead<'a>(&'a self, mut st: MutexGuard<'a, State<P, E>>) -> MutexGuard<'a, State<P, E>> {
        let stats = &self.inner.stats;
        let Some(target) = st.pending.take() else {
            return st;
        };
        let members = std::mem::take(&mut st.pending_members);
        let this_group = st.next_group;
        st.next_group += 1;
        let alone =
            members <= 1 && st.flights.is_empty() && st.parked.is_empty() && st.updates == 0;
        st.flights.push_back(Flight {
            group: this_group,
            target,
            written: !self.inner.staged,
            members,
        });
        // The leader closes the running transaction: a new one starts.
        st.txn_start = if st.updates > 0 {
            Some(Stopwatch::start())
        } else {
            None
        };
        st.window_elapsed = false;
        drop(st);
        let clock = Stopwatch::start();
        let stage = Stage {
            batcher: self,
            group: this_group,
            alone,
        };
        let result = (self.inner.commit)(target, &stage);
        let took = clock.elapsed().as_nanos() as u64;
        st = self.inner.state.lock();
        st.flights.retain(|f| f.group != this_group);
        st.avg_commit_ns = if stats.groups.get() == 0 {
            took
        } else {
            (took + 3 * st.avg_commit_ns) / 4
        };
        stats.groups.incr();
        stats.members.add(members);
        stats.group_sizes[bucket(members)].incr();
        match result {
            Ok(()) => st.committed = Some(st.committed.map_or(target, |c| c.max(target))),
            // The highest failed target: with commits overlapping,
            // a lower one may fail after a higher one did.
            Err(e) => {
                let t = st.failed.as_ref().map_or(target, |(t, _)| (*t).max(target));
                st.failed = Some((t, e));
            }
        }
        // Wake exactly the parked committers this commit covered
        // (or whose failure it is), one more to lead the pending
        // group if a commit slot is free, and any batching waiter.
        let wakes = self.settle_parked(&mut st);
        if st.batch_waiters > 0 {
            self.inner.batch_cv.notify_all();
        }
        drop(st);
        wakes.run(&self.inner.gates);
        self.inner.state.lock()
    }
}

/// An open handle on the running transaction. Stop it with
/// [`Handle::stop_sync`] or [`Handle::stop_async`]; dropping it stops it
/// asynchronously with no position.
pub struct Handle<P, E>
where
    P: Ord + Copy + Send + 'static,
    E: Clone + Send + 'static,
{
    batcher: Batcher<P, E>,
    open: bool,
}

impl<P, E> fmt::Debug for Handle<P, E>
where
    P: Ord + Copy + Send + 'static,
    E: Clone + Send + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle").field("open", &self.open).finish()
    }
}

impl<P, E> Handle<P, E>
where
    P: Ord + Copy + Send + 'static,
    E: Clone + Send + 'static,
{
    /// Stops the handle and returns once a commit covers `pos`: waits for
    /// joiners as the policy says, then leads or follows a commit.
    pub fn stop_sync(self, pos: P) -> Result<WaitDecision, E> {
        self.stop_sync_inner(pos)
    }

    fn stop_sync_inner(mut self, pos: P) -> Result<WaitDecision, E> {
        let b = self.batcher.clone();
        let mut st = b.inner.state.lock();
        b.close_handle(&mut st);
        self.open = false;
        // Batching waiters wait for the last handle to close. When this
        // one is the last, this thread does not wake them: it goes on to
        // lead the commit, whose end wakes them once, covered (one wakeup
        // per follower instead of two). It wakes them itself if it ends up
        // not leading.
        let wake_batch = st.updates == 0 && st.batch_waiters > 0;
        let group = b.register(&mut st, pos);
        let (st, decision) = b.batch_wait(st, pos);
        b.commit_through(st, pos, group, wake_batch)?;
        Ok(decision)
    }

    /// Stops the handle without waiting for a commit.
    pub fn stop_async(mut self) {
        self.close();
    }

    fn close(&mut self) {
        if std::mem::take(&mut self.open) {
            let mut st = self.batcher.inner.state.lock();
            self.batcher.close_handle(&mut st);
            // The last handle closed without a commit to follow: the
            // batching waiters end their wait.
            let wake = st.updates == 0 && st.batch_waiters > 0;
            drop(st);
            if wake {
                self.batcher.inner.batch_cv.notify_all();
            }
        }
    }
}

impl<P, E> Drop for Handle<P, E>
where
    P: Ord + Copy + Send + 'static,
    E: Clone + Send + 'static,
{
    fn drop(&mut self) {
        self.close();
    }
}
