//! An XFS-style ring of in-core log buffers ("iclogs") whose writes carry
//! PREFLUSH / FUA only when they need them.
//!
//! Writers append entries concurrently into the ACTIVE buffer of a ring of
//! [`Config::logbufs`] buffers; each buffer is written as one log record
//! ([`format`](mod@format)) to a [`LogDevice`]; completions are processed strictly in
//! LSN order, and every waiter whose LSN became durable is woken by a
//! condition variable. Everything here follows `fs/xfs/xfs_log.c`; the
//! names in parentheses are XFS's.
//!
//! # Buffer states ([`BufState`])
//!
//! - **ACTIVE** (`XLOG_STATE_ACTIVE`): free; the head buffer takes writes.
//! - **WANT_SYNC**: switched out (full, or forced) — no new writes; written
//!   by the last writer to drop its reference (`ic_refcnt`).
//! - **SYNCING**: its write is in flight.
//! - **DONE_SYNC**: its write completed; waits until every lower-LSN buffer
//!   completed too (`xlog_state_do_callback` processes in log order).
//! - **DIRTY → ACTIVE**: reset and reused, strictly in ring order. A writer
//!   that finds the head buffer not ACTIVE waits on a condvar
//!   (`l_flush_wait`), counted as a "noiclog" wait.
//!
//! # Flags (Linux 5.14, "journal IO cache flush reductions")
//!
//! - **NEED_FUA** ([`IoFlags::FUA`]): set on the buffer a force pushes. The
//!   record is durable when its write completes.
//! - **NEED_FLUSH** ([`IoFlags::PREFLUSH`]): added to a FUA write when
//!   (a) the caller reported with [`Ring::note_tail_moved`] that the log
//!   tail moved since the last durable log write (what was made stable
//!   before the move must be flushed first), or (b) the forced record
//!   depends on earlier records that are not durable and not on their way
//!   with FUA (XFS: start LSN ≠ commit LSN). Before issuing a PREFLUSH
//!   write, the submitter waits for those earlier writes to complete, since
//!   a cache flush only covers completed writes.
//! - A buffer that simply filled up goes out with **no flags** — unless its
//!   record would end more than [`Config::inflight_window`] bytes (the
//!   larger of [`Config::write_ahead`] and `logbufs × logbsize`) beyond
//!   the durable LSN: then it goes out FUA (and PREFLUSH, as it depends on
//!   the records before it). A crash may keep any subset of
//!   writes that were not made durable, and recovery takes valid records
//!   past a damaged one for leftovers of in-flight writes only within that
//!   window; this keeps every written, non-durable record inside it.
//! - [`FlushPolicy::EveryWrite`] restores the pre-5.14 behaviour:
//!   PREFLUSH | FUA on every write.
//! - **Tail stamping**: the tail LSN is stamped into a record by the first
//!   force that sets NEED_FUA on it (or at submission, for a plain write,
//!   with the last tail that was flushed) and never overwritten.
//!
//! A force that finds its record already written without FUA issues a bare
//! cache flush ([`LogDevice::flush`]) rather than rewriting anything. Bare
//! flushes run one at a time; a force arriving during one waits for it
//! (it may have begun before this record's write completed) and then
//! starts, or is covered by, the next. [`Ring::write_out`] uses that to
//! split a commit in two stages — write the record plain, then force it —
//! so that a committer can let the next group write while its flush runs
//! (on a device without FUA a FUA write is a write and a flush anyway).
//!
//! # Entries larger than a buffer, or split at its end (XLOG_CONTINUE_TRANS)
//!
//! An entry larger than [`Config::max_entry_size`] (the buffer less the
//! 48-byte record header and the 4-byte length prefix), up to
//! [`MAX_RECORD_SIZE`], is written as a *chain* of parts over consecutive
//! buffers: the first part fills what is left of the ACTIVE buffer and
//! switches it out (its record flagged [`format::CONTINUES`]), middle parts
//! fill whole buffers, and the last part starts a buffer (flagged
//! [`format::CONTINUED`]) and leaves it ACTIVE for the appends that follow.
//! While a chain is laid out every other append waits (on the same
//! condvar as a noiclog wait), so the parts are in consecutive records and
//! a reader finds them by position ([`format::Chains`]). The chain's LSN is
//! its first part's; [`Ring::commit_point`] maps it to the last part, which
//! is what a commit must force. Larger entries are refused with
//! [`Error::EntryTooLarge`] and nothing is written.
//!
//! An entry that fits a buffer but not the room left in the ACTIVE one is
//! split the same way, over that buffer's end and the next buffer's start,
//! when the room is at least [`Config::split_min`] (an eighth of a
//! buffer): XFS splits a log vector that straddles two iclogs rather than
//! pad, so a stream of large entries fills every buffer it writes (with
//! 12 KiB entries and 32 KiB buffers, 1.5 writes per 48 KiB instead of 2).
//! The layout ends as soon as the last part is reserved, and the last two
//! parts are released together, so the other appends never wait for a
//! device write behind a split.
//!
//! # Failure
//!
//! A device error poisons the ring: the durable LSN never moves again,
//! every waiter and every later call returns [`Error::Poisoned`] with the
//! first error.
//!
//! # Example
//!
//! ```
//! use iclog::{Config, DeviceError, IoFlags, LogDevice, Lsn, Ring};
//! use std::sync::{Arc, Mutex};
//!
//! /// Records (lsn, length, flags) of every write.
//! #[derive(Clone, Default)]
//! struct Mem(Arc<Mutex<Vec<(Lsn, usize, IoFlags)>>>);
//! impl LogDevice for Mem {
//!     type Error = DeviceError;
//!     fn write(&self, lsn: Lsn, bytes: &[u8], flags: IoFlags) -> Result<(), DeviceError> {
//!         self.0.lock().unwrap().push((lsn, bytes.len(), flags));
//!         Ok(())
//!     }
//!     fn flush(&self) -> Result<(), DeviceError> { Ok(()) }
//! }
//!
//! let dev = Mem::default();
//! let ring = Ring::new(Config::default(), dev.clone(), Lsn::ZERO, Lsn::ZERO).unwrap();
//! let lsn = ring.append(b"hello").unwrap();
//! ring.force(lsn).unwrap();
//! assert!(ring.durable_lsn() > lsn);
//! assert_eq!(dev.0.lock().unwrap()[0], (Lsn::ZERO, 512, IoFlags::FUA));
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod config;
mod device;
mod error;
pub mod format;
mod lsn;
mod ring;

pub use config::{
    Config, ConfigError, FlushPolicy, MAX_ALIGNMENT, MAX_LOGBSIZE, MAX_RECORD_SIZE, MIN_LOGBSIZE,
};
pub use device::{DeviceError, IoFlags, LogDevice};
pub use error::Error;
pub use lsn::Lsn;
pub use ring::{BufState, DurableHook, Ring, RingStats, BUFFER_ALIGN};
