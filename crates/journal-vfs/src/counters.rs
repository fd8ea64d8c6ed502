//! Operation counters, by kind.

use journal_sync::StatCounter;

/// Live operation counters of one filesystem. Relaxed statistics: read them
/// with [`Counters::snapshot`] and subtract snapshots to measure an interval.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) writes: StatCounter,
    pub(crate) bytes_written: StatCounter,
    pub(crate) fua_writes: StatCounter,
    pub(crate) fua_fallbacks: StatCounter,
    pub(crate) fdatasyncs: StatCounter,
    pub(crate) fsyncs: StatCounter,
    pub(crate) dir_fsyncs: StatCounter,
    pub(crate) renames: StatCounter,
    pub(crate) creates: StatCounter,
    pub(crate) removes: StatCounter,
    pub(crate) maps: StatCounter,
}

/// A point-in-time copy of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Writes of any kind (plain and FUA), including zero-fill writes.
    pub writes: u64,
    /// Bytes written by those writes.
    pub bytes_written: u64,
    /// FUA writes (a subset of `writes`).
    pub fua_writes: u64,
    /// FUA writes that had to be emulated by write + fdatasync (the
    /// fdatasync is counted in `fdatasyncs` too).
    pub fua_fallbacks: u64,
    /// `fdatasync` calls.
    pub fdatasyncs: u64,
    /// `fsync` calls on files.
    pub fsyncs: u64,
    /// `fsync` calls on directories.
    pub dir_fsyncs: u64,
    /// Renames.
    pub renames: u64,
    /// Files created.
    pub creates: u64,
    /// Files removed.
    pub removes: u64,
    /// Files memory-mapped for reading.
    pub maps: u64,
}

impl Counters {
    /// A copy of the current values.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            writes: self.writes.get(),
            bytes_written: self.bytes_written.get(),
            fua_writes: self.fua_writes.get(),
            fua_fallbacks: self.fua_fallbacks.get(),
            fdatasyncs: self.fdatasyncs.get(),
            fsyncs: self.fsyncs.get(),
            dir_fsyncs: self.dir_fsyncs.get(),
            renames: self.renames.get(),
            creates: self.creates.get(),
            removes: self.removes.get(),
            maps: self.maps.get(),
        }
    }
}

impl CounterSnapshot {
    /// Every call that waits for the device: FUA writes, fdatasyncs, fsyncs
    /// and directory fsyncs. A FUA fallback counts once (its fdatasync).
    pub fn syncs(&self) -> u64 {
        self.fua_writes - self.fua_fallbacks + self.fdatasyncs + self.fsyncs + self.dir_fsyncs
    }

    /// The difference `self - earlier`, field by field.
    pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            writes: self.writes - earlier.writes,
            bytes_written: self.bytes_written - earlier.bytes_written,
            fua_writes: self.fua_writes - earlier.fua_writes,
            fua_fallbacks: self.fua_fallbacks - earlier.fua_fallbacks,
            fdatasyncs: self.fdatasyncs - earlier.fdatasyncs,
            fsyncs: self.fsyncs - earlier.fsyncs,
            dir_fsyncs: self.dir_fsyncs - earlier.dir_fsyncs,
            renames: self.renames - earlier.renames,
            creates: self.creates - earlier.creates,
            removes: self.removes - earlier.removes,
            maps: self.maps - earlier.maps,
        }
    }
}
