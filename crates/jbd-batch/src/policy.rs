//! What the batcher is configured with and what it counts.

use journal_sync::StatCounter;
use std::time::Duration;

/// How long a synchronous stop waits for other committers to join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchPolicy {
    /// Skip the wait when no other handle is open or this thread was the
    /// last synchronous writer; otherwise wait up to
    /// `clamp(average commit time, min_batch, max_batch)` since the
    /// transaction started, ending early when every handle has stopped.
    #[default]
    Adaptive,
    /// Skip the wait when this thread was the last synchronous writer;
    /// otherwise wait [`BatchConfig::fixed_window`], again while new
    /// handles keep joining.
    LastSyncWriter,
    /// Always wait this long, again while new handles keep joining.
    FixedSleep(Duration),
    /// Never wait.
    None,
}

/// Configuration of a [`Batcher`](crate::Batcher).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// The policy.
    pub policy: BatchPolicy,
    /// Lower bound of the adaptive window (jbd2 `min_batch_time`, default 0;
    /// above `max_batch`, `max_batch` wins).
    pub min_batch: Duration,
    /// Upper bound of the adaptive window (jbd2 `max_batch_time`, default
    /// 15 ms). Zero disables waiting under every policy.
    pub max_batch: Duration,
    /// The window of [`BatchPolicy::LastSyncWriter`] (default 1 ms, one
    /// jiffy at HZ=1000).
    pub fixed_window: Duration,
    /// Commit calls that may run at once (default 1; 0 counts as 1). With
    /// more than one, the next group's leader starts its commit while the
    /// previous group's is still in flight (XFS keeps several iclog writes
    /// in flight), so the commit function must accept concurrent calls and
    /// return only once every position up to its target is committed.
    pub max_in_flight: u32,
    /// The largest group whose flush a staged batcher lets the next group's
    /// write overlap ([`Batcher::staged`](crate::Batcher::staged); default 16). A larger group
    /// keeps the device busy on its own; overlapping it only makes the
    /// next group smaller and costs a leader handoff and a flush more: on
    /// the development VM (2 vCPUs) staging every group lost 5–6% at 64
    /// committers in a same-hour comparison (groups of 20 against 26–27)
    /// while it gained 7–13% at 4 and 16 (groups of 2–8); this bound
    /// brought 64 back to what one commit in flight gives.
    pub overlap_max_group: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            policy: BatchPolicy::Adaptive,
            min_batch: Duration::ZERO,
            max_batch: Duration::from_millis(15),
            fixed_window: Duration::from_millis(1),
            max_in_flight: 1,
            overlap_max_group: 16,
        }
    }
}

/// Why a synchronous stop did or did not wait (returned for tests and
/// tracing; also counted in [`BatchStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitDecision {
    /// No wait: no other handle was open.
    SkippedLone,
    /// No wait: this thread was the last synchronous writer.
    SkippedLastWriter,
    /// No wait: the policy or `max_batch = 0` says never.
    Disabled,
    /// No wait: the position was already committed.
    AlreadyCommitted,
    /// Waited; ended because every open handle stopped.
    EndedByGroup,
    /// Waited; ended by the timer.
    EndedByTimer,
    /// Waited; ended because another leader committed this position.
    EndedByCommit,
}

/// Number of buckets of the group-size histogram: sizes 1, 2, 3–4, 5–8,
/// 9–16, 17–32, 33–64, 65 and more.
pub const GROUP_BUCKETS: usize = 8;

/// A snapshot of a batcher's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Commits run (one per group).
    pub groups: u64,
    /// Synchronous stops that joined a group and were covered by its commit
    /// (the sum of group sizes).
    pub members: u64,
    /// Synchronous stops whose position a commit had already covered, or
    /// was covering (in flight), when they stopped: they shared an earlier
    /// group's durable write. With `members`, every synchronous stop is
    /// counted once.
    pub already_covered: u64,
    /// Group sizes, bucketed (see [`GROUP_BUCKETS`]).
    pub group_sizes: [u64; GROUP_BUCKETS],
    /// Waits skipped because no other handle was open.
    pub skipped_lone: u64,
    /// Waits skipped because this thread was the last synchronous writer.
    pub skipped_last_writer: u64,
    /// Waits taken.
    pub waits_taken: u64,
    /// Of those, ended early because every open handle stopped.
    pub waits_ended_by_group: u64,
    /// Of those, ended by the timer.
    pub waits_ended_by_timer: u64,
    /// Total time spent in batching waits, in nanoseconds.
    pub wait_ns: u64,
    /// The current average commit time, in nanoseconds.
    pub avg_commit_ns: u64,
}

impl BatchStats {
    /// Average group size (0 when no group committed yet).
    pub fn avg_group_size(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.members as f64 / self.groups as f64
        }
    }
}

/// The batcher's counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) groups: StatCounter,
    pub(crate) members: StatCounter,
    pub(crate) already_covered: StatCounter,
    pub(crate) group_sizes: [StatCounter; GROUP_BUCKETS],
    pub(crate) skipped_lone: StatCounter,
    pub(crate) skipped_last_writer: StatCounter,
    pub(crate) waits_taken: StatCounter,
    pub(crate) waits_ended_by_group: StatCounter,
    pub(crate) waits_ended_by_timer: StatCounter,
    pub(crate) wait_ns: StatCounter,
}

/// The histogram bucket of a group of `size` committers.
pub(crate) fn bucket(size: u64) -> usize {
    ((64 - (size.max(1) - 1).leading_zeros()) as usize).min(GROUP_BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented buckets: 1, 2, 3–4, 5–8, 9–16, 17–32, 33–64, 65+.
    #[test]
    fn group_sizes_fall_in_their_documented_buckets() {
        let cases = [
            (0, 0),
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (8, 3),
            (9, 4),
            (16, 4),
            (17, 5),
            (32, 5),
            (33, 6),
            (64, 6),
            (65, 7),
            (1 << 40, 7),
        ];
        for (size, want) in cases {
            assert_eq!(bucket(size), want, "group of {size}");
        }
    }
}
