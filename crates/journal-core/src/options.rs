//! Options of [`crate::Journal::open`], with documented defaults.

use crate::Error;
use iclog::FlushPolicy;
use jbd_batch::BatchPolicy;
use journal_vfs::Prealloc;
use segment_recycler::RecyclePolicy;
use std::time::Duration;

/// How a FUA write of the log is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMethod {
    /// `pwrite` + `fdatasync` (default; PostgreSQL's `fdatasync`).
    #[default]
    Fdatasync,
    /// `pwritev2(RWF_DSYNC)`: the write itself is durable (PostgreSQL's
    /// `open_datasync`), falling back to `pwrite` + `fdatasync` where the
    /// kernel refuses the flag.
    Dsync,
    /// `pwrite` + `fsync`.
    Fsync,
}

/// How recovery treats what it finds where the log stops being valid.
///
/// In every mode, a log that stops below the durable end recorded by the
/// last checkpoint or clean close is an error ([`crate::Error::LogEndsEarly`]),
/// and a record with a valid CRC and a newer format version is refused.
///
/// How the log ends at the first position `P` where no valid record is
/// (`W` is the in-flight window; docs/FORMAT.md, "Recovery, in terms of
/// the format"):
///
/// | found at `P` | TolerateTornTail | AbsoluteConsistency | SkipCorrupt |
/// |---|---|---|---|
/// | zeros, bad magic, stale LSN, no segment; nothing valid after | clean end | clean end | clean end |
/// | bad CRC, truncated, damaged LSN; nothing valid after | torn tail, cut and reported | error | torn tail, cut and reported |
/// | anything, valid records in `[P, P + W)` only, none written after `P` was durable | end (leftovers cleared) | error | end (leftovers cleared) |
/// | anything, a record in `[P, P + W)` written after `P` was durable | error (corruption) | error (corruption) | skipped to it, reported |
/// | anything, a valid record beyond the window | error (corruption) | error (corruption) | skipped to it, reported |
/// | anything, below the checkpoint's durable end | error (log ends early) | error | error |
/// | a record with a valid CRC and a newer version | error | error | error |
/// | the end falls inside a chained record (its last part missing) | chain cut, reported | error | chain cut, reported |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Default. A bad record (CRC mismatch, truncated, damaged LSN) at the
    /// head, with no valid current record beyond the in-flight window after
    /// it, is a torn write: cut off and reported. Zeros, stale bytes or a
    /// missing segment there are a clean end. Anything followed by valid
    /// current records beyond that window (or in a later segment) is
    /// corruption: an error naming the LSN and the next valid record.
    #[default]
    TolerateTornTail,
    /// Any bad record, and any valid record after the end of the log (even
    /// within the in-flight window), is an error.
    AbsoluteConsistency,
    /// Corruption is skipped to the next valid current record and each
    /// skipped range is reported ([`crate::SkippedRange`]). A torn tail is
    /// cut as in the default mode.
    SkipCorrupt,
}

/// Everything [`crate::Journal::open`] can be told. `Options::default()`
/// is a sensible production configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Create the directory and a new journal if there is none (default true).
    pub create_if_missing: bool,
    /// Bytes per segment file (default 16 MiB; power of two, 64 KiB–1 GiB).
    /// Fixed when the journal is created.
    pub segment_size: u64,
    /// In-core log buffers (default 8; 2–8).
    pub logbufs: usize,
    /// Bytes per log buffer (default 256 KiB; 16 KiB–1 MiB; at most a
    /// segment's data area).
    pub logbsize: usize,
    /// Record alignment (default 512; power of two, 1–4096). Fixed when the
    /// journal is created.
    pub alignment: u64,
    /// How FUA log writes are made durable (default fdatasync): the
    /// commits of `commits_in_flight = 1`, forces and checkpoints. Staged
    /// commits (`commits_in_flight` ≥ 2) write plain and then flush with
    /// `fdatasync` (`fsync` under [`SyncMethod::Fsync`]).
    pub sync_method: SyncMethod,
    /// Write the log with `O_DIRECT`, past the page cache, as XFS writes
    /// its log (default true). Each log write then reaches the device when
    /// it returns, so a sync has no page-cache writeback left to do
    /// (README, "Direct I/O": measured faster for small commits and much
    /// faster for bulk logging). Used only where the filesystem supports
    /// direct I/O at an alignment that divides the journal's record
    /// alignment (so not with `alignment` 1), and dropped for good if the
    /// filesystem refuses a direct write after all; otherwise the log is
    /// written through the page cache — [`crate::Journal::direct_io`] says
    /// which. Readers always read through the page cache.
    pub direct_io: bool,
    /// Commit batching policy (default adaptive).
    pub batch_policy: BatchPolicy,
    /// Lower bound of the adaptive batching window (default 0).
    pub min_batch: Duration,
    /// Upper bound of the adaptive batching window (default 15 ms; 0
    /// disables batching waits).
    pub max_batch: Duration,
    /// When log writes carry PREFLUSH / FUA (default NEED flags, Linux 5.14).
    pub flush_policy: FlushPolicy,
    /// How far past its durable end the log may be written before a commit
    /// makes it durable, in bytes (default 1 MiB; at most 64 MiB). The
    /// in-flight window is the larger of this and `logbufs × logbsize`
    /// ([`Options::inflight_window`]): a log write that would end past it
    /// goes out FUA, and recovery takes valid records after a damaged one
    /// for leftovers of unacknowledged writes (a torn tail) only within it
    /// — beyond it they mean corruption. With small buffers a group of
    /// large transactions spans more than the ring: a window no larger
    /// than the ring made those writes FUA (README, `xfs-flush-flags`).
    pub write_ahead: u64,
    /// Group commits that may be in flight at once (default 2; 1 to
    /// `logbufs`). With 1, a group's commit is one FUA write of its buffer
    /// (`pwrite` + `fdatasync`) and the next group waits for it. Above 1, a
    /// commit comes in two stages: the buffer is written plain, then a
    /// cache flush (one at a time, shared by every group written before it
    /// began) makes it durable; the next group's leader starts once the
    /// write is done, so its write goes to the device while this flush
    /// runs (XFS keeps several iclogs in flight) — unless the group holds
    /// more than 16 committers, which keep the device busy on their own.
    /// Completions stay in LSN order. On the development VM 2 gave +13% /
    /// +7% at 4 / 16 clients and tied at 1 and 64 (README).
    pub commits_in_flight: u32,
    /// How checkpoints make recycled names durable (default batched).
    pub recycle_policy: RecyclePolicy,
    /// Zero-fill (default) or fallocate new segments.
    pub prealloc: Prealloc,
    /// Segments prepared ahead of the writer (default 2).
    pub preallocate_ahead: u64,
    /// Most segment files kept (default 64).
    pub max_segments: u64,
    /// How recovery treats bad records (default tolerate a torn tail).
    pub recovery_mode: RecoveryMode,
    /// Largest record accepted by `append` (default 64 MiB; 1 byte to
    /// 1 GiB). A record larger than what one log buffer holds
    /// (`logbsize - 52`) is written as a chain of parts over consecutive
    /// buffers and segments (docs/FORMAT.md, "Continuation records").
    pub max_record_size: usize,
    /// Prepare segments ahead on a background thread (default true). When
    /// false, segments are prepared at open and the writer creates the rest
    /// itself (counted as stalls): for single-threaded embedders and loom.
    pub background_preallocation: bool,
    /// How far a [`crate::Follower`] may fall behind (default 256 MiB; at
    /// least one segment): bytes of log from the start of the oldest
    /// segment it still needs to the durable end. A follower holds its
    /// segments against recycling; once a checkpoint would recycle one it
    /// holds and it lags by more than this, it is cut loose — its next read
    /// returns [`crate::Error::FollowerLagged`] — instead of keeping
    /// segments until the disk fills.
    pub follow_lag_limit: u64,
    /// Permission bits of the control and segment files the journal
    /// creates (default 0o600: owner read and write; the umask still
    /// applies). The owner bits must include read and write. Directories
    /// the [`journal_vfs::OsVfs`] creates get 0o700, and it refuses a journal
    /// directory owned by another user and a journal file that is a
    /// symbolic link.
    pub file_mode: u32,
}

/// The default [`Options::file_mode`]: 0o600.
pub const DEFAULT_FILE_MODE: u32 = 0o600;

/// The default [`Options::follow_lag_limit`]: 256 MiB.
pub const DEFAULT_FOLLOW_LAG_LIMIT: u64 = 256 << 20;

/// The default [`Options::write_ahead`]: 1 MiB.
pub const DEFAULT_WRITE_AHEAD: u64 = 1 << 20;
/// The largest [`Options::write_ahead`]: 64 MiB.
pub const MAX_WRITE_AHEAD: u64 = 64 << 20;

/// The default [`Options::max_record_size`]: 64 MiB.
pub const DEFAULT_MAX_RECORD_SIZE: usize = 64 << 20;

impl Default for Options {
    fn default() -> Self {
        Self {
            create_if_missing: true,
            segment_size: 16 << 20,
            logbufs: 8,
            logbsize: 256 << 10,
            alignment: 512,
            sync_method: SyncMethod::Fdatasync,
            direct_io: true,
            batch_policy: BatchPolicy::Adaptive,
            min_batch: Duration::ZERO,
            max_batch: Duration::from_millis(15),
            flush_policy: FlushPolicy::NeedFlags,
            write_ahead: DEFAULT_WRITE_AHEAD,
            commits_in_flight: 2,
            recycle_policy: RecyclePolicy::Batched,
            prealloc: Prealloc::ZeroFill,
            preallocate_ahead: 2,
            max_segments: 64,
            recovery_mode: RecoveryMode::TolerateTornTail,
            max_record_size: DEFAULT_MAX_RECORD_SIZE,
            background_preallocation: true,
            follow_lag_limit: DEFAULT_FOLLOW_LAG_LIMIT,
            file_mode: DEFAULT_FILE_MODE,
        }
    }
}

impl Options {
    pub(crate) fn iclog(&self) -> iclog::Config {
        iclog::Config {
            logbufs: self.logbufs,
            logbsize: self.logbsize,
            alignment: self.alignment,
            flush_policy: self.flush_policy,
            write_ahead: self.write_ahead,
        }
    }

    pub(crate) fn store(&self) -> segment_recycler::StoreConfig {
        segment_recycler::StoreConfig {
            segment_size: self.segment_size,
            prealloc: self.prealloc,
            preallocate_ahead: self.preallocate_ahead,
            max_segments: self.max_segments,
            recycle_policy: self.recycle_policy,
            file_mode: self.file_mode,
        }
    }

    pub(crate) fn batch(&self) -> jbd_batch::BatchConfig {
        jbd_batch::BatchConfig {
            policy: self.batch_policy,
            min_batch: self.min_batch,
            max_batch: self.max_batch,
            max_in_flight: self.commits_in_flight,
            ..jbd_batch::BatchConfig::default()
        }
    }

    /// The largest record `append` accepts ([`Options::max_record_size`]).
    pub fn max_record(&self) -> usize {
        self.max_record_size
    }

    /// The largest record written in one piece (larger ones are chained).
    pub fn max_unchained_record(&self) -> usize {
        self.iclog().max_entry_size()
    }

    /// Bytes that may be written and not yet durable at a crash: the
    /// larger of [`Options::write_ahead`] and every buffer of the ring.
    pub fn inflight_window(&self) -> u64 {
        self.iclog().inflight_window()
    }

    /// Checks every option and their combinations.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |option, reason: String| Err(Error::InvalidOptions { option, reason });
        self.iclog().validate()?;
        self.store().validate()?;
        if self.logbsize as u64 > self.store().data_size() {
            return bad(
                "logbsize",
                format!(
                    "{} exceeds the {} data bytes of a {}-byte segment",
                    self.logbsize,
                    self.store().data_size(),
                    self.segment_size
                ),
            );
        }
        if self.commits_in_flight == 0 || self.commits_in_flight as usize > self.logbufs {
            return bad(
                "commits_in_flight",
                format!(
                    "{} is not between 1 and logbufs ({})",
                    self.commits_in_flight, self.logbufs
                ),
            );
        }
        if self.write_ahead > MAX_WRITE_AHEAD {
            return bad(
                "write_ahead",
                format!(
                    "{} exceeds the limit of {MAX_WRITE_AHEAD}",
                    self.write_ahead
                ),
            );
        }
        if self.file_mode > 0o777 || self.file_mode & 0o600 != 0o600 {
            return bad(
                "file_mode",
                format!(
                    "{:#o} is not permission bits that let the owner read and write",
                    self.file_mode
                ),
            );
        }
        if self.min_batch > self.max_batch {
            return bad(
                "min_batch",
                format!(
                    "{:?} exceeds max_batch {:?}",
                    self.min_batch, self.max_batch
                ),
            );
        }
        if self.follow_lag_limit < self.segment_size {
            return bad(
                "follow_lag_limit",
                format!(
                    "{} is less than one segment ({})",
                    self.follow_lag_limit, self.segment_size
                ),
            );
        }
        match self.max_record_size {
            0 => bad("max_record_size", "must be at least 1".into()),
            m if m > iclog::MAX_RECORD_SIZE => bad(
                "max_record_size",
                format!("{m} exceeds the limit of {}", iclog::MAX_RECORD_SIZE),
            ),
            _ => Ok(()),
        }
    }
}
