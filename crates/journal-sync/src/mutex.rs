//! A poison-free mutex and its condition variable.

use crate::atomic::{AtomicUsize, Ordering};
use crate::Deadline;
use std::ops::{Deref, DerefMut};

#[cfg(loom)]
use loom::sync as imp;
#[cfg(shuttle)]
use shuttle::sync as imp;
#[cfg(not(any(loom, shuttle)))]
use std::sync as imp;

/// A mutual-exclusion lock that does not poison (see the crate docs for why).
#[derive(Debug, Default)]
pub struct Mutex<T>(imp::Mutex<T>);

/// The guard of a [`Mutex`]; the lock is released when it is dropped.
#[derive(Debug)]
pub struct MutexGuard<'a, T>(imp::MutexGuard<'a, T>);

impl<T> Mutex<T> {
    /// Creates an unlocked mutex holding `value`.
    pub fn new(value: T) -> Self {
        Self(imp::Mutex::new(value))
    }

    /// Acquires the lock, blocking until it is free. Never fails: a panic of
    /// a previous holder does not poison the lock.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Acquires the lock if it is free right now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(MutexGuard(g)),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(MutexGuard(e.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Consumes the mutex, returning the value.
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// A condition variable paired with [`Mutex`].
///
/// Waits can wake spuriously (std) and loom explores no spurious wakeups, so
/// every caller waits in a `while` loop on its own predicate.
///
/// It counts the threads waiting on it, and a notify with none waiting
/// makes no system call (std's makes one, waiter or not — on a commit path
/// that notifies at every commit, most of them for nobody). The count is
/// exact for every correct use: a waiter counts itself while it holds the
/// mutex, before the wait releases it, and a notifier changes the
/// predicate under that mutex first, so a notifier that finds no waiter
/// counted finds none that could still miss the change.
#[derive(Debug, Default)]
pub struct Condvar {
    inner: imp::Condvar,
    waiting: AtomicUsize,
}

impl Condvar {
    /// Creates a condition variable.
    pub fn new() -> Self {
        Self {
            inner: imp::Condvar::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Releases the lock, waits for a notification, reacquires the lock.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        // Counted under the mutex (see the type's docs for why that is
        // enough ordering).
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let g = MutexGuard(self.inner.wait(guard.0).unwrap_or_else(|e| e.into_inner()));
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        g
    }

    /// Like [`Condvar::wait`], but returns once `deadline` has passed.
    ///
    /// The boolean is `true` when the deadline has expired. Under loom and
    /// shuttle it is always `false`: time does not pass in a model, so the
    /// caller must also accept an explicit timer event (see the crate docs).
    pub fn wait_deadline<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: &Deadline,
    ) -> (MutexGuard<'a, T>, bool) {
        #[cfg(any(loom, shuttle))]
        {
            let _ = deadline;
            (self.wait(guard), false)
        }
        #[cfg(not(any(loom, shuttle)))]
        {
            let Some(remaining) = deadline.remaining() else {
                return (guard, true);
            };
            self.waiting.fetch_add(1, Ordering::Relaxed);
            let (g, _) = self
                .inner
                .wait_timeout(guard.0, remaining)
                .unwrap_or_else(|e| e.into_inner());
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            (MutexGuard(g), deadline.expired())
        }
    }

    /// Wakes one waiter, if any waits.
    pub fn notify_one(&self) {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.inner.notify_one();
        }
    }

    /// Wakes every waiter, if any waits.
    pub fn notify_all(&self) {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.inner.notify_all();
        }
    }
}
