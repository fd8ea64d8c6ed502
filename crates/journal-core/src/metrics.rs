//! What the journal counts.

/// A snapshot of everything the journal counts. Subtract two snapshots
/// (field by field) to measure an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Metrics {
    /// Commits that returned Ok: `commit`, `append_durable`, and their
    /// async forms.
    pub commits: u64,
    /// Commit groups (log forces run by a batching leader).
    pub groups: u64,
    /// Average committers per group.
    pub avg_group_size: f64,
    /// Group sizes bucketed: 1, 2, 3–4, 5–8, 9–16, 17–32, 33–64, 65+.
    pub group_sizes: [u64; jbd_batch::GROUP_BUCKETS],
    /// Commits whose record was already durable when they asked.
    pub commits_already_durable: u64,
    /// fdatasync / fsync calls on log segments.
    pub log_syncs: u64,
    /// FUA log writes done as RWF_DSYNC writes.
    pub dsync_writes: u64,
    /// fdatasync calls on registered data files, before a log write that
    /// follows a tail move.
    pub data_preflushes: u64,
    /// Directory fsyncs (segment creation, recycling, fallbacks, control).
    pub dir_fsyncs: u64,
    /// Write-path checks that fsynced a segment and the directory because
    /// the segment was above the durability frontier.
    pub frontier_fallbacks: u64,
    /// Every call that waited for the device (FUA writes, fdatasyncs,
    /// fsyncs, directory fsyncs), from the filesystem's own counters.
    pub device_syncs: u64,
    /// Record bytes written to the log (headers, entries, padding).
    pub bytes_written: u64,
    /// Padding bytes among them.
    pub padding_bytes: u64,
    /// Records that crossed a segment boundary (written in two halves).
    pub split_records: u64,
    /// Log record writes.
    pub log_writes: u64,
    /// Of those, with FUA.
    pub log_writes_fua: u64,
    /// Of those, with PREFLUSH.
    pub log_writes_preflush: u64,
    /// Cache flushes issued with no write: a force found its record already
    /// written without FUA.
    pub log_bare_flushes: u64,
    /// Appends that found no free log buffer and waited.
    pub noiclog_waits: u64,
    /// Batching waits skipped: no other committer could join.
    pub batch_waits_skipped_lone: u64,
    /// Batching waits skipped: this thread was the last sync writer.
    pub batch_waits_skipped_last_writer: u64,
    /// Batching waits taken.
    pub batch_waits_taken: u64,
    /// Time spent in batching waits, ns.
    pub batch_wait_ns: u64,
    /// Average commit (log force) time, ns.
    pub avg_commit_ns: u64,
    /// Times the writer needed a segment that was not ready yet.
    pub prealloc_stalls: u64,
    /// Segments created.
    pub segments_created: u64,
    /// Segments recycled.
    pub segments_recycled: u64,
    /// Segments removed.
    pub segments_removed: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
}
