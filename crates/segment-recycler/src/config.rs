//! Store configuration.

use journal_vfs::Prealloc;
use std::fmt;

/// How a checkpoint makes its renames durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecyclePolicy {
    /// Rename the whole batch and rewrite each header (no per-file sync),
    /// then one directory fsync, then advance the durability frontier. Writers that
    /// reach a recycled segment above the frontier make its name durable
    /// themselves (the write-path check).
    #[default]
    Batched,
    /// PostgreSQL's `durable_rename` per segment: fsync the old name,
    /// rename, fsync the new name, fsync the directory.
    PerSegmentDurableRename,
}

/// Configuration of a [`crate::SegmentStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Bytes per segment file, header region included: a power of two from
    /// 64 KiB to 1 GiB. Default 16 MiB (PostgreSQL's default).
    pub segment_size: u64,
    /// How new segments are preallocated (default zero-fill).
    pub prealloc: Prealloc,
    /// Future segments kept ready ahead of the one being written (default 2).
    pub preallocate_ahead: u64,
    /// Most segment files kept (live + future); old segments beyond it are
    /// removed rather than recycled (PostgreSQL's `max_wal_size`). Default 64.
    pub max_segments: u64,
    /// How recycled names are made durable.
    pub recycle_policy: RecyclePolicy,
    /// Permission bits of new segment files (default 0o600).
    pub file_mode: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            segment_size: 16 << 20,
            prealloc: Prealloc::ZeroFill,
            preallocate_ahead: 2,
            max_segments: 64,
            recycle_policy: RecyclePolicy::Batched,
            file_mode: 0o600,
        }
    }
}

/// An invalid [`StoreConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// `segment_size` not a power of two in 64 KiB..=1 GiB.
    SegmentSize(u64),
    /// `preallocate_ahead` is zero.
    PreallocateAhead,
    /// `max_segments` smaller than `preallocate_ahead + 1`.
    MaxSegments(u64),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::SegmentSize(s) => {
                write!(
                    f,
                    "segment size {s} is not a power of two in 64 KiB..=1 GiB"
                )
            }
            ConfigError::PreallocateAhead => f.write_str("preallocate_ahead must be at least 1"),
            ConfigError::MaxSegments(m) => {
                write!(
                    f,
                    "max_segments {m} leaves no room for the segments kept ahead"
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl StoreConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = self.segment_size;
        if !s.is_power_of_two() || !(64 << 10..=1 << 30).contains(&s) {
            return Err(ConfigError::SegmentSize(s));
        }
        if self.preallocate_ahead == 0 {
            return Err(ConfigError::PreallocateAhead);
        }
        if self.max_segments < self.preallocate_ahead + 1 {
            return Err(ConfigError::MaxSegments(self.max_segments));
        }
        Ok(())
    }

    /// Log bytes one segment holds (its size less the header region).
    pub fn data_size(&self) -> u64 {
        self.segment_size - crate::DATA_OFFSET
    }
}
