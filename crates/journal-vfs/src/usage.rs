//! What this process has spent so far (getrusage, through nix): the cost
//! figures of benchmarks. Here because journal-vfs is where raw calls live.

use std::time::Duration;

/// CPU time and voluntary context switches of this process, summed over
/// all its threads, live and exited. Subtract two to measure an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessUsage {
    /// User plus system CPU time.
    pub cpu: Duration,
    /// Voluntary context switches (a thread blocked: a futex wait, a sync).
    pub voluntary_switches: u64,
    /// The peak resident set so far, bytes (`ru_maxrss`): not a
    /// difference, [`ProcessUsage::since`] keeps the later one's.
    pub max_rss_bytes: u64,
}

impl ProcessUsage {
    /// What was spent between `earlier` and `self`.
    pub fn since(&self, earlier: &ProcessUsage) -> ProcessUsage {
        ProcessUsage {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            voluntary_switches: self
                .voluntary_switches
                .saturating_sub(earlier.voluntary_switches),
            max_rss_bytes: self.max_rss_bytes,
        }
    }
}

/// This process's usage so far.
pub fn process_usage() -> std::io::Result<ProcessUsage> {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_SELF).map_err(std::io::Error::from)?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Ok(ProcessUsage {
        cpu: tv(u.user_time()) + tv(u.system_time()),
        voluntary_switches: u.voluntary_context_switches().max(0) as u64,
        // Linux reports KiB.
        max_rss_bytes: (u.max_rss().max(0) as u64).saturating_mul(1024),
    })
}
