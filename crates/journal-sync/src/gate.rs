//! [`Gate`]: many threads asleep on one word, woken together by one call.

/// A generation counter that threads sleep on until it moves: one
/// [`Gate::open`] wakes every sleeper in one system call, and
/// [`Gate::nudge`] wakes the sleepers of one *lane* (a thread waits in the
/// lane it chose, out of [`Gate::LANES`]).
///
/// It exists for group commit: a commit that covers twenty committers
/// wakes them with one call instead of twenty `unpark`s. On Linux it is a
/// futex (`FUTEX_WAIT_BITSET` / `FUTEX_WAKE_BITSET`, the lane being the
/// bit): the kernel wakes the whole set in one pass, so the waker pays one
/// system-call entry for the group and a woken CPU is interrupted once for
/// all the threads that land on it, not once per thread. Elsewhere, and
/// under loom and shuttle, it is a [`crate::Mutex`] and a
/// [`crate::Condvar`] (every wake wakes every sleeper).
///
/// The protocol a waiter follows, so that no wakeup is lost: read
/// [`Gate::generation`], then look at its own condition (which whoever
/// wakes it changed *before* moving the generation), and only if that
/// condition says "wait" call [`Gate::wait`] with the generation it read.
/// A wait may return spuriously, or because the gate moved for other
/// threads: the waiter reads the generation and looks again.
///
/// ```
/// use journal_sync::atomic::{AtomicBool, Ordering};
/// use journal_sync::{Arc, Gate};
///
/// let gate = Arc::new(Gate::new());
/// let done = Arc::new(AtomicBool::new(false));
/// let (g, d) = (gate.clone(), done.clone());
/// let waiter = std::thread::spawn(move || loop {
///     let seen = g.generation();
///     if d.load(Ordering::Acquire) {
///         return;
///     }
///     g.wait(seen, 0);
/// });
/// done.store(true, Ordering::Release); // the condition first,
/// gate.open(); // then the generation, and the wake
/// waiter.join().unwrap();
/// ```
#[derive(Debug, Default)]
pub struct Gate {
    imp: imp::Gate,
}

impl Gate {
    /// How many lanes a gate has: [`Gate::wait`] takes a lane below this.
    pub const LANES: u32 = 32;

    /// A gate at generation 0 with nobody waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current generation.
    pub fn generation(&self) -> u32 {
        self.imp.generation()
    }

    /// Sleeps in `lane` (taken modulo [`Gate::LANES`]) while the
    /// generation is still `seen`. Returns when the gate moves, and may
    /// return spuriously: the caller looks at its condition again.
    pub fn wait(&self, seen: u32, lane: u32) {
        self.imp.wait(seen, lane % Self::LANES);
    }

    /// Moves the generation and wakes every sleeper, in every lane.
    pub fn open(&self) {
        self.imp.wake(u32::MAX);
    }

    /// Moves the generation and wakes the sleepers of `lane` (modulo
    /// [`Gate::LANES`]); sleepers in other lanes sleep on. A thread about
    /// to sleep sees the generation moved and looks again, so a nudge is
    /// never lost.
    pub fn nudge(&self, lane: u32) {
        self.imp.wake(1 << (lane % Self::LANES));
    }
}

#[cfg(all(target_os = "linux", not(any(loom, shuttle))))]
mod imp {
    use rustix::thread::futex;
    use std::num::NonZeroU32;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug, Default)]
    pub(super) struct Gate {
        generation: AtomicU32,
    }

    impl Gate {
        pub(super) fn generation(&self) -> u32 {
            self.generation.load(Ordering::Acquire)
        }

        pub(super) fn wait(&self, seen: u32, lane: u32) {
            let bits = NonZeroU32::new(1 << lane).unwrap_or(NonZeroU32::MAX);
            // EAGAIN (the generation moved) and EINTR are the spurious
            // returns the caller is ready for; nothing else can fail here.
            let _ = futex::wait_bitset(&self.generation, futex::Flags::PRIVATE, seen, None, bits);
        }

        pub(super) fn wake(&self, lanes: u32) {
            self.generation.fetch_add(1, Ordering::AcqRel);
            let Some(bits) = NonZeroU32::new(lanes) else {
                return;
            };
            // Cannot fail for a valid private futex word; a failure would
            // leave sleepers asleep, so it is not ignored silently in
            // debug builds.
            let woke = futex::wake_bitset(
                &self.generation,
                futex::Flags::PRIVATE,
                i32::MAX as u32,
                bits,
            );
            debug_assert!(woke.is_ok(), "FUTEX_WAKE_BITSET failed: {woke:?}");
        }
    }
}

#[cfg(not(all(target_os = "linux", not(any(loom, shuttle)))))]
mod imp {
    use crate::{Condvar, Mutex};

    #[derive(Debug)]
    pub(super) struct Gate {
        generation: Mutex<u32>,
        moved: Condvar,
    }

    impl Default for Gate {
        fn default() -> Self {
            Self {
                generation: Mutex::new(0),
                moved: Condvar::new(),
            }
        }
    }

    impl Gate {
        pub(super) fn generation(&self) -> u32 {
            *self.generation.lock()
        }

        pub(super) fn wait(&self, seen: u32, _lane: u32) {
            let g = self.generation.lock();
            if *g == seen {
                drop(self.moved.wait(g));
            }
        }

        pub(super) fn wake(&self, _lanes: u32) {
            let mut g = self.generation.lock();
            *g = g.wrapping_add(1);
            drop(g);
            self.moved.notify_all();
        }
    }
}
