//! jbd-style commit batching: a lone synchronous writer never waits;
//! joiners are batched by an adaptive window.
//!
//! A committer opens a [`Handle`] on the running transaction (jbd2's
//! `t_updates` counts open handles), does its work (appends its record),
//! then stops the handle. A **synchronous** stop ([`Handle::stop_sync`])
//! returns only once a commit covers the committer's position; before
//! asking for that commit it may wait a little for other committers to
//! join the same group, so one durable write serves them all. How long it
//! waits is the [`BatchPolicy`]:
//!
//! | policy | waits for joiners… | origin |
//! |---|---|---|
//! | [`BatchPolicy::Adaptive`] (default) | unless nobody else has a handle open, or this thread was the last synchronous writer; up to `clamp(average commit time, min_batch, max_batch)` since the transaction started, ending early once every open handle has stopped | jbd (2005) + jbd2 (2009) + the lone-writer rule |
//! | [`BatchPolicy::LastSyncWriter`] | unless this thread was the last synchronous writer; a fixed window, extended while new handles keep joining | jbd, 2005 |
//! | [`BatchPolicy::FixedSleep`] | always: the window, extended while new handles keep joining | jbd before 2005 |
//! | [`BatchPolicy::None`] | never | — |
//!
//! **When each wins.** A lone writer streaming synchronous commits loses a
//! whole window per commit to any policy that waits (the 2005 patch saw
//! O_SYNC writes go 4–5× faster by skipping it): `Adaptive`, `None` and
//! `LastSyncWriter` skip it, `FixedSleep` does not. Many concurrent
//! committers gain from waiting only when the window is short compared with
//! the commit itself: `Adaptive` sizes it from the measured commit time
//! (jbd2, 2009, after fast devices lost throughput to fixed one-jiffy
//! sleeps), so it tracks the device; `None` is best when commits are so
//! cheap that batching cannot pay. Two writers that alternate defeat the
//! last-writer rule (each was not the last), and thread pools defeat it
//! too; the lone-writer rule ("no other handle is open, nobody can join")
//! does not depend on thread identity and covers both.
//!
//! **Committing.** After the batching wait, one thread per group becomes
//! the leader and runs the commit function given to [`Batcher::new`] with
//! the highest position stopped so far; the others sleep until the
//! committed position covers theirs. Each sleeps on its group's
//! [`Gate`](journal_sync::Gate), and the commit that settles a group (covering or failing
//! it) wakes the whole group with one futex call — the kernel wakes the
//! set in one pass, where one `unpark` per follower cost the leader a
//! system call and often an interrupt of another CPU each; a free commit
//! slot needing a leader nudges exactly one sleeper (its lane of the
//! gate). A covered committer returns without retaking the batcher's
//! lock, so it wakes once. Up to
//! [`BatchConfig::max_in_flight`] commits run at once (default 1): with
//! more, the next group's leader need not wait for the previous group's
//! commit to return (XFS keeps several iclog writes in flight); a stop
//! whose position an in-flight commit's target covers waits for that
//! commit instead of starting another, so targets in flight strictly
//! increase.
//!
//! **Staged commits.** A commit that is a write and then a cache flush
//! ([`Batcher::staged`]) reports the end of its write through [`Stage`];
//! the next group's leader starts only once every commit in flight has, so
//! its group gathers while the write runs and its own write overlaps the
//! flush. A commit that is alone — one member, nothing in flight, nobody
//! waiting, no handle open — is told so ([`Stage::alone`]): nothing can
//! overlap its flush, so it may skip the staging and make its record
//! durable in one step. Letting the next leader start as soon as a slot frees instead
//! (what [`Batcher::new`] does) splits the committers into half-sized
//! groups whose writes and flushes all run at once: on the development VM
//! that lost 7–15% against one commit in flight, where staging gained
//! 7–13% at 4 and 16 clients (journal-core's README). A group larger than
//! [`BatchConfig::overlap_max_group`] is not overlapped: it keeps the
//! device busy on its own, and splitting the next group off it cost more
//! (leader handoffs, flushes, CPU) than the overlap gained.
//!
//! No thread sleeps in a loop: every timeout is a condvar wait
//! with a [`Deadline`](journal_sync::Deadline) (the batching window), every other wait a sleep on
//! a gate that one thread opens, and under loom a timer is the explicit event
//! [`Batcher::fire_timer`].
//!
//! **Errors.** A commit function's error reaches every synchronous stop
//! whose position that commit was to cover, and it is the answer for those
//! positions from then on: a later stop at or below the failed target gets
//! the same error at once, and the commit function is not run again for it
//! — a failed commit is never retried (a retried fsync after EIO can report
//! success for lost data), unless a later commit succeeds past it, which
//! covers it. A stop above the failed target runs the commit function
//! again, which decides for itself whether it can succeed (journal-core's
//! log force fails for ever once the log is poisoned).
//!
//! Positions are plain ordered values (`P: Ord + Copy`); this crate knows
//! nothing of LSNs.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod batcher;
mod policy;

pub use batcher::{Batcher, Handle, Stage};
pub use policy::{BatchConfig, BatchPolicy, BatchStats, WaitDecision, GROUP_BUCKETS};
