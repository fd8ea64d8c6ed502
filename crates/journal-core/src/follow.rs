//! Following the log as it grows ([`Journal::follow`]): a replica, a
//! change-data-capture consumer, a cache kept warm from the log.
//!
//! A [`Follower`] reads entries up to the durable LSN like a read iterator,
//! then waits for the durable LSN to move — on the same signal a commit
//! waits on: the ring's durable hook wakes it, from every path that
//! advances the durable LSN, outside the ring's lock. It waits as a task
//! ([`Follower::next_async`]) or as a thread (the `Iterator`, or
//! [`Follower::next_timeout`]), a thread by polling the same future with a
//! waker that signals a condition variable, so both forms share one
//! wake-up path.
//!
//! It holds its segments against recycling with a revocable pin that moves
//! forward as it reads: checkpoints recycle nothing it has not read — until
//! it falls more than [`crate::Options::follow_lag_limit`] behind while a
//! checkpoint wants a segment it holds. Then the checkpoint revokes the pin
//! and the follower ends with [`Error::FollowerLagged`], rather than let an
//! idle consumer fill the disk.
//!
//! A follower reads with `pread` into buffers of its own (never through a
//! mapping), so the entries it hands out pin nothing: only the follower's
//! own pin holds segments.

use crate::async_commit::CommitFuture;
use crate::pins::FollowPin;
use crate::read::ReadIter;
use crate::reader::{Entry, LogReader};
use crate::{Error, Journal, Result};
use iclog::Lsn;
use journal_sync::{Condvar, Deadline, Mutex};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

impl Journal {
    /// Follows the log from `from`: returns every entry with LSN at or
    /// after it, in order, each once, as it becomes durable — across
    /// segment switches and checkpoints — blocking at the durable end
    /// (see [`Follower`]). `from` may be any LSN at or above the tail: an
    /// entry's, the appended or durable end (to see only what comes next).
    ///
    /// Errors: [`Error::LsnNotInLog`] below the tail; the follower itself
    /// ends with [`Error::Closed`] or [`Error::Poisoned`] when the journal
    /// does, and with [`Error::FollowerLagged`] past its lag limit.
    pub fn follow(&self, from: Lsn) -> Result<Follower<'_>> {
        let (start, pin) = self.pinned_start(from, |pins, seg| pins.follow(seg))?;
        let g = self.geometry();
        let durable = self.durable_lsn();
        let mut reader = LogReader::new(self.vfs().clone(), self.dir(), g);
        reader.refresh(g.segment_of(start), durable);
        let iter = ReadIter::new(
            reader,
            start,
            from,
            None,
            durable,
            None,
            self.recovery_report().skipped.clone(),
        );
        Ok(Follower {
            journal: self,
            iter,
            pin,
            timeout: None,
            failed: None,
        })
    }
}

/// Follows the log ([`Journal::follow`]).
///
/// As an `Iterator` it yields `Ok((lsn, bytes))` for each entry, blocking
/// at the durable end until more is durable; with
/// [`Follower::with_timeout`] a call that waits longer than the timeout
/// yields `None` (call `next` again to go on waiting). An error ends it:
/// every later call returns the same error.
pub struct Follower<'j> {
    journal: &'j Journal,
    iter: ReadIter,
    pin: FollowPin,
    timeout: Option<Duration>,
    failed: Option<Error>,
}

impl std::fmt::Debug for Follower<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("position", &self.iter.position())
            .finish_non_exhaustive()
    }
}

impl<'j> Follower<'j> {
    /// Makes each blocking `next` give up (yield `None`) after waiting
    /// `timeout` at the durable end.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The next entry, waiting at most `timeout` for one to become durable:
    /// `Ok(None)` if none did.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Entry>> {
        self.next_until(Some(Deadline::after(timeout)))
    }

    /// The next entry, as a task: resolves once one is durable (or with
    /// the error that ends the follower). Reading the segment files is
    /// plain blocking I/O, as a read of a file is.
    pub async fn next_async(&mut self) -> Result<Entry> {
        loop {
            if let Some(e) = self.poll_entry()? {
                return Ok(e);
            }
            CommitFuture::new(self.journal, self.iter.end, false).await?;
        }
    }

    /// Bytes of durable log it has not read yet (from the record it reads
    /// next to the durable LSN).
    pub fn lag(&self) -> u64 {
        self.journal
            .durable_lsn()
            .0
            .saturating_sub(self.iter.position().0)
    }

    fn next_until(&mut self, deadline: Option<Deadline>) -> Result<Option<Entry>> {
        loop {
            if let Some(e) = self.poll_entry()? {
                return Ok(Some(e));
            }
            if !self.wait_past(self.iter.end, deadline)? {
                return Ok(None);
            }
        }
    }

    /// The next entry if one is durable; `Ok(None)` at the durable end.
    fn poll_entry(&mut self) -> Result<Option<Entry>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.read_next();
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn read_next(&mut self) -> Result<Option<Entry>> {
        loop {
            if self.pin.revoked() {
                return Err(self.lagged());
            }
            match self.iter.next() {
                Some(Ok(e)) => {
                    // Everything before the record it reads next is read.
                    let seg = self.journal.geometry().segment_of(self.iter.position());
                    if !self.pin.advance(seg) {
                        return Err(self.lagged());
                    }
                    return Ok(Some(e));
                }
                // Bytes recycled under a revoked pin fail their checks.
                Some(Err(e)) => return Err(if self.pin.revoked() { self.lagged() } else { e }),
                None => {
                    let durable = self.journal.durable_lsn();
                    if durable > self.iter.end {
                        self.iter.extend(durable);
                        continue;
                    }
                    // Closing or poisoning the journal ends the follower.
                    self.journal.check()?;
                    return Ok(None);
                }
            }
        }
    }

    fn lagged(&self) -> Error {
        Error::FollowerLagged {
            at: self.iter.position(),
            limit: self.journal.options().follow_lag_limit,
        }
    }

    /// Blocks until the durable LSN passes `end` (true), or the deadline
    /// passes first (false), or the journal is closed or poisoned.
    fn wait_past(&self, end: Lsn, deadline: Option<Deadline>) -> Result<bool> {
        let signal = Arc::new(Signal::new());
        let waker = Waker::from(signal.clone());
        let mut cx = Context::from_waker(&waker);
        let mut durable = CommitFuture::new(self.journal, end, false);
        loop {
            match Pin::new(&mut durable).poll(&mut cx) {
                Poll::Ready(r) => return r.map(|()| true),
                Poll::Pending => {
                    if !signal.wait(deadline) {
                        return Ok(false);
                    }
                }
            }
        }
    }
}

impl Iterator for Follower<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        let deadline = self.timeout.map(Deadline::after);
        self.next_until(deadline).transpose()
    }
}

/// A waker that a blocked thread waits on.
struct Signal {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    fn new() -> Self {
        Self {
            woken: Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    /// Waits to be woken (true) or for the deadline (false).
    fn wait(&self, deadline: Option<Deadline>) -> bool {
        let mut woken = self.woken.lock();
        while !*woken {
            match &deadline {
                None => woken = self.cv.wait(woken),
                Some(d) => {
                    let (g, expired) = self.cv.wait_deadline(woken, d);
                    woken = g;
                    if expired && !*woken {
                        return false;
                    }
                }
            }
        }
        *woken = false;
        true
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        *self.woken.lock() = true;
        self.cv.notify_all();
    }
}
