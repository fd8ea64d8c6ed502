//! Deadlines that loom can drive as explicit events.

use std::time::Duration;

/// A point in time after which a timed wait gives up.
///
/// Outside loom this is an `Instant`. Under loom a deadline never expires by
/// itself ([`Deadline::expired`] is always `false`): models fire timers as
/// explicit events instead (see the crate docs).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    #[cfg(not(any(loom, shuttle)))]
    at: std::time::Instant,
}

impl Deadline {
    /// A deadline `d` from now.
    pub fn after(d: Duration) -> Self {
        #[cfg(any(loom, shuttle))]
        {
            let _ = d;
            Self {}
        }
        #[cfg(not(any(loom, shuttle)))]
        Self {
            at: std::time::Instant::now() + d,
        }
    }

    /// Time left before the deadline, or `None` once it has passed.
    pub fn remaining(&self) -> Option<Duration> {
        #[cfg(any(loom, shuttle))]
        {
            Some(Duration::from_secs(3600))
        }
        #[cfg(not(any(loom, shuttle)))]
        {
            let now = std::time::Instant::now();
            (now < self.at).then(|| self.at - now)
        }
    }

    /// Whether the deadline has passed (never under loom).
    pub fn expired(&self) -> bool {
        self.remaining().is_none()
    }
}

/// Measures elapsed time. Under loom time does not pass: [`Stopwatch::elapsed`]
/// is always zero, so code that derives decisions from durations behaves as
/// if everything were instantaneous, and timers are explicit events.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch {
    #[cfg(not(any(loom, shuttle)))]
    start: std::time::Instant,
}

impl Stopwatch {
    /// Starts measuring now.
    pub fn start() -> Self {
        Self {
            #[cfg(not(any(loom, shuttle)))]
            start: std::time::Instant::now(),
        }
    }

    /// Time since [`Stopwatch::start`] (zero under loom).
    pub fn elapsed(&self) -> Duration {
        #[cfg(any(loom, shuttle))]
        {
            Duration::ZERO
        }
        #[cfg(not(any(loom, shuttle)))]
        self.start.elapsed()
    }
}
