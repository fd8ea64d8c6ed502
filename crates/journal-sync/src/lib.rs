//! The synchronisation shim of the journal workspace.
//!
//! Every lock, condition variable, atomic, `Arc` and thread used by the journal
//! crates comes from here. In a normal build these are thin wrappers over
//! `std`; in a build with `RUSTFLAGS="--cfg loom"` they are
//! [loom](https://docs.rs/loom)'s model-checked twins, so one loom build checks
//! the whole stack: iclog, jbd-batch, segment-recycler, journal-core and the
//! simulated filesystem underneath them.
//!
//! # Poisoning: what a panic while holding a lock means
//!
//! [`Mutex`] does not poison, nor does [`RwLock`]. A panic inside a critical section of the journal
//! is a bug in the journal (critical sections never call user code and never
//! do I/O that could fail by panicking), and turning it into a `PoisonError` on
//! every later `lock()` would only convert one panic into a cascade of panics
//! in unrelated threads. Instead, the journal crates keep their own,
//! *explicit* poison state for the failures that matter — a failed write or
//! sync — and report it as a typed error (`Error::Poisoned` in journal-core).
//! A thread that panics while holding a lock releases it; the protected state
//! is whatever the panicking code left, and the journal's own invariant checks
//! (debug assertions, recovery) are the defence.
//!
//! # Timers under loom
//!
//! loom's `Condvar::wait_timeout` never times out, and loom cannot model the
//! passage of time. Code that waits "until a condition holds or a deadline
//! passes" therefore uses [`Deadline`] with [`Condvar::wait_deadline`] **and**
//! accepts an explicit *timer event*: a flag in its own mutex-protected state
//! that a timer sets before notifying the condvar. In production the waiter
//! fires the event itself when [`Condvar::wait_deadline`] reports expiry; in a
//! loom model a dedicated "timer" thread fires it, so loom explores every
//! interleaving of the timer with the rest of the protocol. Under loom a
//! [`Deadline`] never expires by itself.
//!
//! ```
//! use journal_sync::{Condvar, Deadline, Mutex};
//! use std::time::Duration;
//!
//! struct State { done: bool, timer_fired: bool }
//! let m = Mutex::new(State { done: false, timer_fired: false });
//! let cv = Condvar::new();
//! let deadline = Deadline::after(Duration::from_millis(1));
//! let mut g = m.lock();
//! while !g.done && !g.timer_fired {
//!     let (g2, expired) = cv.wait_deadline(g, &deadline);
//!     g = g2;
//!     if expired { g.timer_fired = true; } // the timer event, fired by the clock
//! }
//! assert!(g.timer_fired);
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod gate;
mod mutex;
mod rwlock;
mod time;

pub use gate::Gate;
pub use mutex::{Condvar, Mutex, MutexGuard};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use time::{Deadline, Stopwatch};

/// A write-once cell, std's under every build: neither loom nor shuttle
/// models one. For caches of values that are the same whoever computes
/// them (a reassembled record's bytes), never for a protocol's state.
pub use std::sync::OnceLock;

/// std's `Arc` under every build, for bytes shared copy-on-write (SimVfs's
/// file contents and the mappings and crash images that share them): a
/// reference count on data no thread mutates while it is shared, not a
/// protocol's state, so neither loom nor shuttle needs to model it — and
/// it offers `Arc::make_mut`, which their twins do not.
pub use std::sync::Arc as DataArc;

/// `Arc`, from std, loom or shuttle.
#[cfg(loom)]
pub use loom::sync::Arc;
/// `Arc`, from std, loom or shuttle.
#[cfg(shuttle)]
pub use shuttle::sync::Arc;
/// `Arc`, from std, loom or shuttle.
#[cfg(not(any(loom, shuttle)))]
pub use std::sync::Arc;

/// Atomic integers and booleans, from std, loom or shuttle.
pub mod atomic {
    #[cfg(loom)]
    pub use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
    #[cfg(shuttle)]
    pub use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
    pub use std::sync::atomic::Ordering;
    #[cfg(not(any(loom, shuttle)))]
    pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
}

/// Threads, from std, loom or shuttle. `spawn`, `yield_now`,
/// `JoinHandle`, and `park` / `Thread::unpark` (a waiter woken by exactly
/// the thread that completes its wait, without retaking a lock) only:
/// sleeping is not a synchronisation primitive in this workspace.
pub mod thread {
    #[cfg(loom)]
    pub use loom::thread::{
        current, park, spawn, yield_now, Builder, JoinHandle, Thread, ThreadId,
    };
    #[cfg(shuttle)]
    pub use shuttle::thread::{
        current, park, spawn, yield_now, Builder, JoinHandle, Thread, ThreadId,
    };
    #[cfg(not(any(loom, shuttle)))]
    pub use std::thread::{current, park, spawn, yield_now, Builder, JoinHandle, Thread, ThreadId};
}

/// Running a future to completion on this thread: loom's or shuttle's
/// `block_on` in a model (so a model can await the journal's futures), a
/// small park/unpark executor otherwise.
pub mod future {
    #[cfg(loom)]
    pub use loom::future::block_on;
    #[cfg(shuttle)]
    pub use shuttle::future::block_on;

    /// Polls `f` on this thread until it is ready, parking between polls
    /// (the waker unparks the thread).
    #[cfg(not(any(loom, shuttle)))]
    pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
        use std::sync::Arc;
        use std::task::{Context, Poll, Wake, Waker};
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            match f.as_mut().poll(&mut cx) {
                Poll::Ready(v) => return v,
                // A spurious unpark only costs another poll.
                Poll::Pending => std::thread::park(),
            }
        }
    }
}

/// The shuttle runtime, in a `--cfg shuttle` build: tests drive the whole
/// stack under its random and PCT schedulers, and replay a failing
/// schedule from its seed.
#[cfg(shuttle)]
pub use shuttle;

/// `thread_local!`: std's, or loom's or shuttle's model-aware twin (each
/// model thread gets its own value).
#[cfg(loom)]
pub use loom::thread_local;
/// `thread_local!`: std's, or loom's or shuttle's model-aware twin (each
/// model thread gets its own value).
#[cfg(shuttle)]
pub use shuttle::thread_local;
/// `thread_local!`: std's, or loom's or shuttle's model-aware twin (each
/// model thread gets its own value).
#[cfg(not(any(loom, shuttle)))]
pub use std::thread_local;

/// Runs `f` as a loom model (every interleaving, bounded by
/// `LOOM_MAX_PREEMPTIONS`), or simply calls it once outside loom.
///
/// Tests written with `model` therefore run in both builds: as ordinary
/// smoke tests under `cargo test`, and exhaustively under `cargo xtask loom`.
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    #[cfg(loom)]
    {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(2);
        }
        builder.check(f);
    }
    #[cfg(shuttle)]
    shuttle::check_random(f, 100);
    #[cfg(not(any(loom, shuttle)))]
    f();
}

/// A statistics counter: a relaxed `u64` that orders nothing.
///
/// Counters (syncs by kind, bytes written, waits taken) are read by
/// benchmarks and metrics, never used to synchronise. They are therefore
/// always `std` atomics, even under loom: modelling them would multiply the
/// interleavings loom explores without checking anything.
#[derive(Debug, Default)]
pub struct StatCounter(std::sync::atomic::AtomicU64);

impl StatCounter {
    /// A counter at zero.
    pub const fn new() -> Self {
        Self(std::sync::atomic::AtomicU64::new(0))
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    /// Adds one.
    pub fn incr(&self) {
        self.add(1);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}
