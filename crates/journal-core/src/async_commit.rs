//! Durability as futures, for async callers, with no runtime dependency.
//!
//! A task that waits for an LSN to become durable registers its `Waker`
//! here, keyed by the LSN; the ring wakes the wakers a durable-LSN advance
//! covers, through its durable hook ([`iclog::Ring::set_durable_hook`]),
//! from every path that advances it (in-order completion, a bare flush),
//! outside its lock — so a commit, a force, a checkpoint, an append whose
//! buffer switch wrote with FUA, the forcer below all wake them alike.
//! A waiter registers, then looks at the durable LSN again, so a wakeup
//! between its first look and its registration is never lost.
//!
//! Forcing for async committers is the job of one thread per journal, the
//! *forcer* (WiredTiger's log flush server): started on the first async
//! commit, it commits on behalf of every task waiting at that moment,
//! through the batcher like any committer thread, so tasks and threads
//! share groups. No thread per waiter, no polling timer.
//!
//! A task's request signals the forcer only when it is asleep: under load
//! the forcer finds the next request when its commit returns, and the
//! tasks pay no wake call for it.

use crate::poison::Poison;
use crate::{Error, Journal, Lsn, Result};
use jbd_batch::Batcher;
use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::{thread, Condvar, Mutex};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

type SharedError = Arc<Error>;

#[derive(Default)]
struct State {
    next_id: u64,
    /// Tasks waiting for the durable LSN to pass their LSN.
    waiters: BTreeMap<(Lsn, u64), Waker>,
    /// The highest LSN an async committer asked to be forced.
    requested: Option<Lsn>,
    /// The highest LSN the forcer has forced.
    served: Option<Lsn>,
    forcer: Option<thread::JoinHandle<()>>,
    /// The forcer waits on `requests`: a request must signal it.
    forcer_asleep: bool,
    stop: bool,
}

/// The async waiters of one journal, and its forcer.
#[derive(Default)]
pub(crate) struct AsyncCommits {
    state: Mutex<State>,
    /// The forcer waits here for requests.
    requests: Condvar,
    /// Whether any task waits: the durable paths check this one atomic.
    waiting: AtomicBool,
}

impl std::fmt::Debug for AsyncCommits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCommits").finish_non_exhaustive()
    }
}

impl AsyncCommits {
    /// Wakes every task waiting for an LSN below `durable`.
    pub(crate) fn wake_durable(&self, durable: Lsn) {
        if !self.waiting.load(Ordering::Acquire) {
            return;
        }
        let woken: Vec<Waker> = {
            let mut st = self.state.lock();
            let rest = st.waiters.split_off(&(durable, 0));
            let covered = std::mem::replace(&mut st.waiters, rest);
            self.waiting
                .store(!st.waiters.is_empty(), Ordering::Release);
            covered.into_values().collect()
        };
        woken.into_iter().for_each(Waker::wake);
    }

    /// Wakes every waiting task (the journal was poisoned or closed: they
    /// find out when they look).
    pub(crate) fn wake_all(&self) {
        let woken: Vec<Waker> = {
            let mut st = self.state.lock();
            self.waiting.store(false, Ordering::Release);
            std::mem::take(&mut st.waiters).into_values().collect()
        };
        woken.into_iter().for_each(Waker::wake);
    }

    /// Registers (or refreshes) a waiter; returns its id.
    fn register(&self, lsn: Lsn, id: Option<u64>, waker: &Waker) -> u64 {
        let mut st = self.state.lock();
        let id = id.unwrap_or_else(|| {
            st.next_id += 1;
            st.next_id
        });
        match st.waiters.get_mut(&(lsn, id)) {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => w.clone_from(waker),
            None => {
                st.waiters.insert((lsn, id), waker.clone());
            }
        }
        self.waiting.store(true, Ordering::Release);
        id
    }

    fn deregister(&self, lsn: Lsn, id: u64) {
        let mut st = self.state.lock();
        st.waiters.remove(&(lsn, id));
        self.waiting
            .store(!st.waiters.is_empty(), Ordering::Release);
    }

    /// Asks the forcer to make `lsn` durable, starting it if needed.
    /// False if its thread could not be started: then the caller commits
    /// itself.
    fn request(self: &Arc<Self>, lsn: Lsn, forcer: impl FnOnce() -> Forcer) -> bool {
        let mut st = self.state.lock();
        if st.stop || st.requested.is_some_and(|r| r >= lsn) {
            return true;
        }
        if st.forcer.is_none() {
            let f = forcer();
            let me = self.clone();
            match thread::Builder::new()
                .name("journal-forcer".into())
                .spawn(move || me.forcer_loop(f))
            {
                Ok(h) => st.forcer = Some(h),
                Err(_) => return false,
            }
        }
        st.requested = Some(lsn);
        let asleep = st.forcer_asleep;
        drop(st);
        if asleep {
            self.requests.notify_one();
        }
        true
    }

    fn forcer_loop(&self, f: Forcer) {
        loop {
            let target = {
                let mut st = self.state.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    match st.requested {
                        Some(r) if st.served.is_none_or(|s| s < r) => break r,
                        _ => {
                            st.forcer_asleep = true;
                            st = self.requests.wait(st);
                            st.forcer_asleep = false;
                        }
                    }
                }
            };
            // One committer among the others: the batcher may group it
            // with committer threads and lets a lone one go at once.
            match f.batcher.start().stop_sync(target) {
                // The ring woke the tasks it made durable (its durable
                // hook), before the batcher returned.
                Ok(_) => self.state.lock().served = Some(target),
                Err(e) => {
                    f.poison.set((*e).clone());
                    self.wake_all();
                    return;
                }
            }
        }
    }

    /// Stops the forcer (at close and drop) and wakes every waiter.
    pub(crate) fn shut_down(&self) {
        let handle = {
            let mut st = self.state.lock();
            st.stop = true;
            st.forcer.take()
        };
        self.requests.notify_all();
        if let Some(h) = handle {
            let _ = h.join();
        }
        self.wake_all();
    }
}

/// What the forcer needs of the journal.
pub(crate) struct Forcer {
    pub(crate) batcher: Batcher<Lsn, SharedError>,
    pub(crate) poison: Arc<Poison>,
}

/// The future of [`Journal::commit_async`] (forcing) and of
/// [`DurableWatch::wait_for`] (not forcing): resolves once the record at
/// its LSN is durable, or with the error that poisoned or closed the
/// journal. Dropping it is safe and loses nothing: the record stays
/// appended and becomes durable with the next force.
#[must_use = "a future does nothing unless awaited"]
pub struct CommitFuture<'j> {
    journal: &'j Journal,
    lsn: Lsn,
    force: bool,
    registered: Option<u64>,
}

impl std::fmt::Debug for CommitFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitFuture")
            .field("lsn", &self.lsn)
            .finish_non_exhaustive()
    }
}

impl<'j> CommitFuture<'j> {
    pub(crate) fn new(journal: &'j Journal, lsn: Lsn, force: bool) -> Self {
        Self {
            journal,
            lsn,
            force,
            registered: None,
        }
    }

    /// Ready? `registered`: this task's waker is registered, so the durable
    /// LSN is read under the ring's lock — ordered with the completion that
    /// advances it, whose wakeup then sees the registration (a lock-free
    /// read here could miss both: the store-buffer race).
    fn done(&mut self, registered: bool) -> Option<Result<()>> {
        if let Err(e) = self.journal.check() {
            return Some(Err(e));
        }
        let durable = if registered {
            self.journal.durable_lsn_locked()
        } else {
            self.journal.durable_lsn()
        };
        if self.lsn >= durable {
            return None;
        }
        if self.force {
            // A commit (not a passive watch): counted like a thread's.
            self.journal.count_commit();
        }
        Some(Ok(()))
    }
}

impl Future for CommitFuture<'_> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if this.registered.is_none() {
            let appended = this.journal.appended_lsn();
            if this.force && this.lsn >= appended {
                return Poll::Ready(Err(Error::LsnNotAppended {
                    lsn: this.lsn,
                    appended,
                }));
            }
        }
        if let Some(r) = this.done(false) {
            if let Some(id) = this.registered.take() {
                this.journal.asyncs().deregister(this.lsn, id);
            }
            return Poll::Ready(r);
        }
        let asyncs = this.journal.asyncs();
        let id = asyncs.register(this.lsn, this.registered, cx.waker());
        let first = this.registered.is_none();
        this.registered = Some(id);
        if first && this.force && !asyncs.request(this.lsn, || this.journal.forcer()) {
            // No forcer thread could be started: commit here (blocking
            // this task's thread, but never losing or faking durability).
            this.registered = None;
            asyncs.deregister(this.lsn, id);
            return Poll::Ready(this.journal.commit(this.lsn));
        }
        // Registered, then looked again: a wakeup in between is not lost.
        match this.done(true) {
            Some(r) => {
                this.registered = None;
                asyncs.deregister(this.lsn, id);
                Poll::Ready(r)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for CommitFuture<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.registered.take() {
            self.journal.asyncs().deregister(self.lsn, id);
        }
    }
}

/// Lets tasks wait for the durable LSN to pass a position, without forcing
/// anything ([`Journal::durable_lsn_watch`]).
#[derive(Debug, Clone, Copy)]
pub struct DurableWatch<'j> {
    pub(crate) journal: &'j Journal,
}

impl<'j> DurableWatch<'j> {
    /// Everything below this LSN is durable now.
    pub fn current(&self) -> Lsn {
        self.journal.durable_lsn()
    }

    /// Resolves once the durable LSN has passed `lsn` (the record at `lsn`
    /// is durable — all of it, for a record written as a chain of parts),
    /// or with the error that poisoned or closed the journal.
    pub fn wait_for(&self, lsn: Lsn) -> CommitFuture<'j> {
        CommitFuture::new(self.journal, self.journal.commit_point(lsn), false)
    }
}
