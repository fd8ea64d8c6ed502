//! The journal: a durable, group-committing, crash-honest write-ahead log.
//!
//! [`Journal`] composes the workspace's crates over [`journal_vfs`]:
//! [`iclog`] (a ring of in-core log buffers that writes with PREFLUSH / FUA
//! only when needed), [`jbd_batch`] (commit batching: a lone committer
//! never waits), and [`segment_recycler`] (preallocated segment files,
//! recycled by rename behind a durability frontier).
//!
//! # Example
//!
//! ```
//! use journal_core::vfs::OpenOptions;
//! use journal_core::{Journal, Options};
//!
//! let tmp = tempfile::tempdir().unwrap();
//! let dir = tmp.path().join("wal");
//! let small = Options { segment_size: 1 << 20, logbsize: 64 << 10, ..Options::default() };
//!
//! // Open (creating it), and register a data file the log protects. Data
//! // files go through the journal's filesystem too, so a `SimVfs` crash
//! // test sees them.
//! let journal = Journal::open(&dir, small).unwrap();
//! let data = tmp.path().join("table.dat");
//! let table = journal.vfs().open(&data, OpenOptions::create()).unwrap();
//! journal.vfs().sync_dir(tmp.path()).unwrap(); // the new name is durable
//! journal.register_data_file(&data).unwrap();
//!
//! // Append and commit: commit returns once the record is durable.
//! let a = journal.append(b"insert k1=v1").unwrap();
//! journal.commit(a).unwrap();
//! let b = journal.append_durable(b"insert k2=v2").unwrap();
//!
//! // The data page is written in place (no fsync of its own); a checkpoint
//! // moves the tail past `a`: the next durable log write fdatasyncs the
//! // data file first.
//! table.write_at(b"k1=v1", 0).unwrap();
//! journal.checkpoint(b).unwrap();
//! journal.close().unwrap();
//! drop(journal);
//!
//! // Reopen: recovery finds the end; replay from the checkpoint.
//! let journal = Journal::open(&dir, small).unwrap();
//! let replay: Vec<_> = journal.read_from(journal.redo_lsn()).unwrap()
//!     .map(|r| r.unwrap().1).collect();
//! assert_eq!(replay, [b"insert k2=v2".to_vec()]);
//! ```
//!
//! # The commit path
//!
//! 1. [`Journal::append`] reserves space in the ACTIVE log buffer, copies
//!    the record, and returns its [`Lsn`].
//! 2. [`Journal::commit`] enters jbd-batch: it waits for joiners only when
//!    another committer holds a handle and it was not the last sync writer.
//! 3. The group's leader forces the log buffer holding the group's highest
//!    LSN: FUA, plus PREFLUSH when the tail moved or earlier buffers are not
//!    durable.
//! 4. The device maps the LSN to a segment (two writes if the record
//!    crosses a boundary), makes the segment's name durable if it is above
//!    the frontier, and turns the flags into the fewest syscalls
//!    ([`SyncMethod`]).
//! 5. Completions are processed in LSN order; every waiter whose LSN is now
//!    durable wakes.
//!
//! # Failure rules
//!
//! A failed write or sync poisons the journal: that call and every later
//! one return [`Error::Poisoned`] carrying the first failure. Nothing that
//! was not durable was acknowledged, and no sync is ever retried (a retried
//! fsync after EIO can report success for lost data). Reopen to recover.
//!
//! # Observability
//!
//! [`Journal::metrics`] counts everything the commit path does; with the
//! crate feature `tracing` the journal also emits `tracing` events for
//! recovery, checkpoints, poisoning and slow syncs ([`trace`]).
//!
//! # Recovery
//!
//! On open, the control file gives the redo LSN; the log is scanned from
//! there with iclog's parser ([`RecoveryReport`] says what it found). [`RecoveryMode`] decides what a
//! bad record means; stale records from recycled segments carry another
//! LSN and end the log; headers of unacknowledged in-flight records found
//! past the end are cleared so appends never chain into them.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod async_commit;
mod control;
mod damage;
mod device;
mod error;
mod follow;
mod geometry;
mod index;
pub mod inspect;
mod journal;
mod metrics;
mod open;
mod options;
mod pins;
mod poison;
mod read;
mod reader;
mod recovery;
mod space;
pub mod trace;

pub use async_commit::{CommitFuture, DurableWatch};
pub use control::{
    read_control, Control, CONTROL_FILE, CONTROL_MAGIC, CONTROL_VERSION, MAX_LSN, SLOT_SIZE,
};
pub use damage::Damage;
pub use error::{Error, Result};
pub use follow::Follower;
pub use geometry::Geometry;
pub use index::STRIDE as INDEX_STRIDE;
pub use journal::{CheckpointReport, CommitHandle, ForceMode, Journal};
pub use metrics::Metrics;
pub use options::{
    Options, RecoveryMode, SyncMethod, DEFAULT_FILE_MODE, DEFAULT_FOLLOW_LAG_LIMIT,
    DEFAULT_MAX_RECORD_SIZE, DEFAULT_WRITE_AHEAD, MAX_WRITE_AHEAD,
};
pub use read::ReadIter;
pub use reader::{Entry, EntryBytes, MAX_PAYLOAD};
pub use recovery::{LogEnd, RecoveryReport, SkippedRange};

// The vocabulary the facade's API speaks, from the crates it composes, so a
// user depends on `journal-core` alone.
pub use iclog::{FlushPolicy, Lsn};
pub use jbd_batch::{BatchPolicy, GROUP_BUCKETS};
pub use journal_vfs::{CrashPolicy, OsVfs, Prealloc, SimVfs, Vfs, VfsError, VfsFile};
pub use segment_recycler::{
    DamagedSegment, Error as SegmentError, JournalId, RecyclePolicy, StartupReport,
};

/// The synchronisation primitives the journal is built on (from
/// `journal-sync`): poison-free `Mutex` and `Condvar` with deadlines, a
/// poison-free `RwLock`, atomics, threads, a small `block_on`. They are std's in a normal build
/// and loom's or shuttle's under `--cfg loom` / `--cfg shuttle`, so a
/// program that uses them for its own locks is model-checked together
/// with the journal (`model` runs a loom model; `shuttle` is the shuttle
/// runtime in a shuttle build).
pub mod sync {
    #[cfg(shuttle)]
    pub use journal_sync::shuttle;
    pub use journal_sync::{
        atomic, future, model, thread, Arc, Condvar, Deadline, Mutex, MutexGuard, OnceLock, RwLock,
        RwLockReadGuard, RwLockWriteGuard, StatCounter, Stopwatch,
    };
}

/// The filesystem boundary the journal runs on (from `journal-vfs`):
/// [`Vfs`] and [`VfsFile`], the real [`OsVfs`], and [`SimVfs`], the
/// crash-simulating filesystem with fault injection, for tests of programs
/// built on the journal. Data files a program wants crash-tested with its
/// journal go through this too.
pub mod vfs {
    pub use journal_vfs::{
        process_usage, AlignedBuf, CounterSnapshot, CrashPolicy, Fault, FuaMode, Mapping, Op,
        OpenOptions, OsVfs, OsVfsOptions, Prealloc, ProcessUsage, Result, SimVfs, SplitMix64, Vfs,
        VfsError, VfsFile,
    };
}

/// The on-disk format, for tools that write or check bytes themselves
/// (docs/FORMAT.md describes them): the log record's header and sizes,
/// the segment files' names and header, and the check of a record at the
/// LSN where it is expected. Reading a journal's records is [`inspect`]'s
/// job.
pub mod format {
    pub use iclog::format::{
        align_up, encode_header, parse_record, record_crc, record_size, Entries, Record,
        RecordCheck, RecordHeader, CONTINUED, CONTINUES, ENTRY_HEADER_SIZE, HEADER_SIZE, MAGIC,
        MIN_VERSION, VERSION,
    };
    pub use iclog::IoFlags;
    pub use segment_recycler::{
        parse_name, segment_name, NameKind, SegmentHeader, DATA_OFFSET, SEGMENT_HEADER_SIZE,
        SEGMENT_MAGIC, SEGMENT_VERSION,
    };
}

// The journal is shared between threads by `Arc`.
static_assertions::assert_impl_all!(Journal: Send, Sync);
