//! PostgreSQL-style segment files: preallocated ahead of use, recycled by
//! rename, with renames made durable in batches behind a durability
//! frontier.
//!
//! The log lives in fixed-size segment files named by their number
//! ([`segment_name`]: 16 hex digits and `.seg`), each beginning with a
//! [`SegmentHeader`] in a 4 KiB header region. This crate knows segment
//! numbers, not LSNs: the journal facade maps one to the other.
//!
//! # Creating segments, off the commit path
//!
//! A segment is created under a temporary name, zero-filled (default;
//! writes into holes or unwritten extents make every later `fdatasync`
//! journal metadata) or fallocated, given its header, fsynced, renamed into
//! place, and the directory is fsynced. A **background worker**
//! ([`SegmentStore::start_worker`]) keeps `preallocate_ahead` segments ready
//! beyond the one being written; the writer tells it where it is with
//! [`SegmentStore::set_head`]. Only when the log outruns preallocation does
//! the writer wait for (or do) a creation itself: a counted *stall*.
//! [`SegmentStore::prepare_ahead`] does the same work synchronously for
//! callers without a worker.
//!
//! # Recycling and the durability frontier
//!
//! After a checkpoint, segments wholly below the redo position are renamed
//! to future numbers and their header rewritten (up to `max_segments` files
//! in all; the rest are removed). [`RecyclePolicy::Batched`] renames the
//! whole batch and rewrites each header (no per-file sync: a lost header
//! rewrite is detected and repaired at open, and records carry their own
//! LSNs), then fsyncs the directory once and advances the **durability
//! frontier**: the highest segment
//! number at or below which every segment's name is known durable.
//! [`RecyclePolicy::PerSegmentDurableRename`] pays fsync, rename, fsync and a
//! directory fsync per segment (PostgreSQL's `durable_rename`), for A/B runs.
//!
//! A recycled segment is usable as soon as it is renamed. That opens the
//! crash window of the seed: a writer commits into it, the power fails
//! before the directory fsync, the rename is lost and the commit with it.
//! The **write-path check** ([`SegmentStore::make_name_durable`]) closes it:
//! before the first durable write into a segment the writer asks for its
//! name to be durable — nothing to do at or below the frontier; above it,
//! the writer fsyncs the file and the directory itself (a counted
//! fallback).
//!
//! # Stale content
//!
//! A recycled segment still holds its old records. They are never mistaken
//! for data: each log record carries its own LSN, and an LSN in segment `n`
//! lies in `[n·D, (n+1)·D)` (`D` = data bytes per segment), so an old record
//! read at a new position has the wrong LSN and ends the log there. The
//! header carries the segment's number: at startup, an all-zero header, or
//! one whose number differs from the name's (a recycle cut short by a
//! crash: the header rewrite was lost, or the rename was), marks a segment
//! whose contents are stale — a segment is only recycled once it lies
//! wholly below a tail that was made durable first — so its header is
//! rewritten and reported. A bad magic or checksum, another journal's id,
//! another segment size or a newer version is a typed error.
//!
//! # Startup
//!
//! [`SegmentStore::open`] lists the directory: names that are not segments
//! are ignored and reported, leftovers of interrupted creations removed,
//! gaps in the numbering reported, and the directory fsynced once.
//! [`scan`] does the listing read-only, for inspection tools.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod config;
mod error;
mod header;
mod name;
mod store;

pub use config::{ConfigError, RecyclePolicy, StoreConfig};
pub use error::Error;
pub use header::{
    HeaderCheck, JournalId, SegmentHeader, DATA_OFFSET, SEGMENT_HEADER_SIZE, SEGMENT_MAGIC,
    SEGMENT_VERSION,
};
pub use name::{parse_name, segment_name, tmp_name, NameKind};
pub use store::{
    scan, DamagedSegment, RecycleReport, ScanReport, ScannedSegment, SegmentStore, StartupReport,
    StoreStats, Worker, FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC,
};
