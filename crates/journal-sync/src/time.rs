//! Deadlines that loom can drive as explicit events.

use std::time::Duration;

/// A point in time after which a timed wait gives up.
///
/// Outside loom this is an `Instant`. Under loom a deadline never expires by
/// itself ([`Deadline::expired`] is always `false`): models fire timers as
/// explicit events instead (see the crate docs).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    #[cfg(not(loom))]
    at: std::time::Instant,
}

impl Deadline {
    /// A deadline `d` from now.
    pub fn after(d: Duration) -> Self {
        #[cfg(loom)]
        {
            let _ = d;
            Self {}
        }
        #[cfg(not(loom))]
        Self {
            at: std::time::Instant::now() + d,
        }
    }

    /// Time left before the deadline, or `None` once it has passed.
    pub fn remaining(&self) -> Option<Duration> {
        #[cfg(loom)]
        {
            Some(Duration::from_secs(3600))
        }
        #[cfg(not(loom))]
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
