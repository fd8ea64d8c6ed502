//! Where committers wait for their commit: each on its group's
//! [`Gate`], woken with the whole group by the commit that settles it, or
//! nudged alone to lead the pending group.

use super::{Batcher, State};
use journal_sync::atomic::{AtomicU8, Ordering};
use journal_sync::{Arc, Gate, MutexGuard};

/// A committer asleep on its group's [`Gate`] until the commit that
/// settles it opens that gate (one wake call for the whole group), or
/// until it is nudged to lead: it then returns without retaking the
/// batcher's lock if covered (one wakeup per commit, no herd on the
/// mutex).
pub(super) struct Parked<P> {
    pub(super) pos: P,
    /// The group it waits for: its gate is `gates[group % gates.len()]`.
    pub(super) group: u64,
    /// Its lane on that gate.
    pub(super) lane: u32,
    pub(super) wake: Arc<AtomicU8>,
}

/// The wakes a settling thread owes once it has dropped the batcher's
/// lock: gates to open (each wakes a whole group; a bit per gate) and one
/// committer to nudge into leading the pending group.
#[derive(Default)]
pub(super) struct Wakes {
    open: u64,
    pub(super) nudge: Option<(usize, u32)>,
}

impl Wakes {
    pub(super) fn open(&mut self, gate: usize) {
        self.open |= 1 << gate;
    }

    /// The leader first: it is on the commit path, and a group woken
    /// before it may run ahead of it on the CPUs. (Measured against the
    /// other order: within noise; kept for the reason.)
    pub(super) fn run(self, gates: &[Gate]) {
        if let Some((g, lane)) = self.nudge {
            gates[g].nudge(lane);
        }
        let mut open = self.open;
        while open != 0 {
            gates[open.trailing_zeros() as usize].open();
            open &= open - 1;
        }
    }
}

journal_sync::thread_local! {
    /// This thread's [`Parked::wake`] flag, reused by each of its parks (a
    /// thread waits in one batcher at a time, and a flag is set only while
    /// its entry is on a parked list, under the lock): no allocation per
    /// commit.
    static WAKE: Arc<AtomicU8> = Arc::new(AtomicU8::new(ASLEEP));
}

/// [`Parked::wake`]: still asleep.
const ASLEEP: u8 = 0;
/// [`Parked::wake`]: a commit covered it; return Ok.
const COVERED: u8 = 1;
/// [`Parked::wake`]: look at the state again (lead, or a failure).
const LOOK: u8 = 2;

/// The most gates a batcher keeps ([`Wakes`] names them in a `u64`).
pub(super) const MAX_GATES: usize = 64;

impl<P, E> Batcher<P, E>
where
    P: Ord + Copy + Send + 'static,
    E: Clone + Send + 'static,
{
    /// The gate of `group`.
    pub(super) fn gate_of(&self, group: u64) -> usize {
        (group % self.inner.gates.len() as u64) as usize
    }

    /// Sleeps on the gate of `group` until whoever settles `pos` wakes this
    /// thread: `None` once it is covered, else the relocked state, to look
    /// again.
    pub(super) fn park<'a>(
        &'a self,
        mut st: MutexGuard<'a, State<P, E>>,
        pos: P,
        group: u64,
    ) -> Option<MutexGuard<'a, State<P, E>>> {
        let flag = WAKE.with(Arc::clone);
        flag.store(ASLEEP, Ordering::Relaxed);
        let lane = st.next_lane;
        st.next_lane = lane.wrapping_add(1);
        st.parked.push(Parked {
            pos,
            group,
            lane,
            wake: flag.clone(),
        });
        let gate = &self.inner.gates[self.gate_of(group)];
        // The gate's generation first, then the flag: whoever sets the
        // flag moves the generation after it, so a wake between the two
        // looks is never lost (the wait returns at once).
        let mut seen = gate.generation();
        drop(st);
        let woke = loop {
            match flag.load(Ordering::Acquire) {
                ASLEEP => {
                    gate.wait(seen, lane);
                    seen = gate.generation();
                }
                w => break w,
            }
        };
        (woke != COVERED).then(|| self.inner.state.lock())
    }

    /// Takes out of the parked list everyone whose wait is over — covered
    /// (woken to return), failed (woken to look) — and, when the pending
    /// group may be led, one more to lead it. Returns the wakes owed once
    /// the lock is dropped: the gates of the settled groups, opened once
    /// each however many sleep there, and the nudge of the new leader.
    pub(super) fn settle_parked(&self, st: &mut State<P, E>) -> Wakes {
        let mut wakes = Wakes::default();
        let committed = st.committed;
        let failed = st.failed.as_ref().map(|(t, _)| *t);
        st.parked.retain(|w| {
            let outcome = if committed.is_some_and(|c| w.pos <= c) {
                COVERED
            } else if failed.is_some_and(|t| w.pos <= t) {
                LOOK
            } else {
                return true;
            };
            w.wake.store(outcome, Ordering::Release);
            wakes.open(self.gate_of(w.group));
            false
        });
        if self.may_lead(st) {
            wakes.nudge = self.pick_leader(st);
        }
        wakes
    }

    /// Takes one parked committer out to lead the pending group (any
    /// thread may lead it); its gate and lane, to nudge after the lock
    /// drops.
    pub(super) fn pick_leader(&self, st: &mut State<P, E>) -> Option<(usize, u32)> {
        let w = st.parked.pop()?;
        w.wake.store(LOOK, Ordering::Release);
        Some((self.gate_of(w.group), w.lane))
    }
}
