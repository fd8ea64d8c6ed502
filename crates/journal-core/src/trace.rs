//! Optional [`tracing`](https://docs.rs/tracing) events, with the crate
//! feature `tracing` (off by default: nothing is forced on users). Events,
//! all under the target `journal_core`:
//!
//! - `info`, at open: what recovery found (the end, how it ended, records,
//!   skipped ranges, a cut chain);
//! - `debug`, per checkpoint: the new tail, segments recycled and removed;
//! - `error`, once: the failure that poisoned the journal;
//! - `warn`: a log sync slower than [`SLOW_SYNC`]; a follower cut loose
//!   for lagging.
//!
//! Without the feature the macro expands to nothing and costs nothing.

/// A log sync slower than this is reported (`warn`).
pub const SLOW_SYNC: std::time::Duration = std::time::Duration::from_millis(100);

/// `event!(Level, fields…)`: a `tracing` event with the feature, nothing
/// without it.
macro_rules! event {
    ($level:ident, $($arg:tt)+) => {{
        #[cfg(feature = "tracing")]
        ::tracing::event!(target: "journal_core", ::tracing::Level::$level, $($arg)+);
    }};
}
pub(crate) use event;
