//! A database prototype on the journal: an embedded key-value store — a
//! B+tree of pages updated in place, a bounded buffer pool, physiological
//! redo, fuzzy checkpoints — the way PostgreSQL, InnoDB or WiredTiger use
//! a write-ahead log.
//!
//! # The data file
//!
//! `data.kv` holds 4 KiB pages, read and written through the journal's
//! filesystem (`journal_core::vfs`, so `SimVfs` crashes it too) and
//! registered with [`journal_core::Journal::register_data_file`]. Pages 0
//! and 1 are two copies of the meta page (journal id, root, end, free-list
//! head; the valid copy with the higher sequence wins). The rest are B+tree
//! pages — slotted leaves and branches, overflow pages for values too long
//! to sit in a leaf (up to [`MAX_VALUE`]), and free pages. The free list
//! is SQLite's: trunk pages each listing about a thousand free pages that
//! are never read or written while free, so freeing a long value's chain
//! changes one trunk (two if it fills one), not every page of the chain.
//! Every page carries a CRC, its number and its pageLSN. docs/FORMAT.md
//! has the byte map. A leaf a delete leaves under a quarter full is
//! merged into its neighbour if together they fill at most three
//! quarters (InnoDB's merge; the gap to a split's half-full pages keeps
//! merges and splits from undoing each other); a page is freed when it
//! empties, and freed pages are reused before the file grows; it grows by
//! extents, in the background.
//!
//! # Memory
//!
//! Pages live in a buffer pool of [`Options::cache_bytes`] (64 MiB by
//! default): read on demand, evicted by clock. It is a *steal* pool: a
//! dirty page may be written home between checkpoints, once the log is
//! durable over its pageLSN, so memory never waits for a checkpoint. The page versions open iterators keep — those in memory (up to a
//! quarter of the cache, spilled beyond) and the bookkeeping of every
//! version kept, spilled or not (about 41 bytes each) — take their room
//! from the cache: frames and versions together stay within
//! `cache_bytes`. [`Store::check`] marks the pages it reaches in a bitmap
//! of at most a sixteenth of the cache, walking the tree once per window
//! of page numbers past it. A page's buffer goes back
//! to the pool when its last reference is dropped, by whichever thread,
//! and the pool keeps as many spare buffers as its frames have room for
//! (at least 4 MiB), so the pool's pages cycle through one set of buffers
//! instead of spreading over the allocator's per-thread arenas: peak RSS
//! at 10 M bulk-loaded keys with the default cache measured 90–93 MiB
//! (docs/PERFORMANCE.md).
//!
//! # Logging
//!
//! One journal record per transaction, holding per page it changed either
//! the leaf operations (a cell put, a key removed) or the page's image:
//! structural changes log the whole page. A page a crash tore while it
//! was written home is repaired, by default, from a full image logged at
//! the page's first change after a checkpoint began (PostgreSQL's
//! full_page_writes), or, by [`Options::torn_pages`], from a double-write
//! buffer (InnoDB's: every batch of home writes goes to `doublewrite.kv`
//! and is synced there first; open puts torn pages back from it before
//! redo). docs/PERFORMANCE.md measures both. A
//! leaf split logs the new right page's image, the left page's truncation
//! (none when the new cell goes past the leaf's last one: it starts the
//! right page alone) and the separator's insertion into the parent;
//! because they are in the transaction's one record, a split replays
//! whole or not at all. Redo
//! applies an operation only to a page whose pageLSN is below the
//! record's: idempotent.
//!
//! # Checkpoints and recovery
//!
//! A checkpoint (in the background every [`Options::checkpoint_interval`]
//! or [`Options::checkpoint_log_bytes`] of log, or [`Store::checkpoint`])
//! picks the log's end as its redo position, writes every page dirty then
//! home in batches (the log forced over their pageLSNs first; a page is
//! marked clean only once its write succeeded), syncs the data file,
//! writes the meta page and syncs again, and moves the journal's tail
//! (`journal.checkpoint`). It holds the tree lock only to pick the redo
//! position. A failed write or sync of the data file or the double-write
//! area — by a checkpoint, the cleaner or an eviction — **poisons** the
//! store before it is answered: every later call, reads included,
//! returns the error, no page goes home after it, and the tail never
//! moves past a change that is not home. (Linux drops the pages of a
//! failed writeback and reports it once: a store that went on would find
//! its next sync "succeed".) A panic while a transaction is applied rolls
//! it back and poisons the store too ([`Error::Panicked`]). Opening reads the meta pages and replays the
//! log from the last checkpoint onto the pages it touches — never the
//! whole data file — so recovery after `kill -9` reads at most about
//! `checkpoint_log_bytes` of log (256 MiB by default).
//!
//! # Bulk load
//!
//! [`Store::bulk_load`] fills an empty store from keys in increasing
//! order the way PostgreSQL builds a B-tree index: leaves filled left to
//! right (to 90 %, room for a few inserts), each leaf's first key handed
//! to the branch being filled above it, pages written straight to the
//! data file — never through the log or the pool — and synced. Only then
//! does one small record, forced, free the old empty root and name the
//! new root and end: a crash before it leaves the store empty, after it
//! whole. raftkv installs snapshots so.
//!
//! # Visibility
//!
//! - A transaction is visible to [`Store::get`] and new iterators once it
//!   is applied: at once for [`Transaction::commit_no_wait`] (raftkv
//!   relies on this: its Raft log is the durable record), and for
//!   [`Transaction::commit`] before its flush completes — readers are not
//!   held back by the flush (not PostgreSQL's rule; a reader may see, for
//!   an instant, a commit that a crash would lose).
//! - After a failed commit nothing is served: the store is poisoned.
//! - [`Store::range`] and [`Store::prefix`] return lazy iterators over one
//!   snapshot: every transaction applied before the call, never half of
//!   one. They do not block writers: a writer that replaces a page an open
//!   snapshot may still read keeps the old version (a page taken off the
//!   free list too, read from disk if the pool no longer holds it); an
//!   iterator holds the path to its leaf only. Versions in memory, and
//!   the bookkeeping of every version kept (about 41 bytes each, spilled
//!   or not), are bounded by a quarter of the cache; beyond it the
//!   versions are spilled to a scratch file (`snapshots.spill`, up to
//!   [`Options::snapshot_spill_bytes`]), and only when that is full, or
//!   the bookkeeping alone fills the quarter, does the oldest snapshot
//!   expire, its iterator returning [`Error::SnapshotTooOld`]. So a full
//!   scan beside writers holds the cache's quarter of memory and at most
//!   about the tree's size of scratch disk, and keeps up to about 400,000
//!   page versions (1.6 GiB spilled) with the default 64 MiB cache
//!   before it expires.
//!
//! # Concurrency
//!
//! Writers change the tree under one lock, shared with readers, and append
//! their record under it (so records reach the log in the order the pages
//! changed); they wait for durability after releasing it, so committers
//! share the journal's group commit. Neither writers nor readers hold the
//! lock across a read from disk: a miss releases it, fetches the page and
//! retries.
//!
//! # Example
//!
//! ```
//! use kvstore::{Options, Store};
//! let tmp = tempfile::tempdir().unwrap();
//! let store = Store::open(tmp.path().join("db"), Options::default()).unwrap();
//! store.put(b"k1", b"v1").unwrap();
//! let mut t = store.transaction();
//! t.put(b"k2", b"v2").delete(b"k1");
//! t.commit().unwrap(); // atomic, durable when it returns
//! assert_eq!(store.get(b"k2").unwrap().as_deref(), Some(&b"v2"[..]));
//! assert_eq!(store.get(b"k1").unwrap(), None);
//! store.close().unwrap();
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod meta;
mod page;
mod poison;
mod pool;
mod record;
mod store;
mod tree;

pub use error::{Error, Result};
pub use page::{FORMAT_VERSION, PAGE_SIZE};
pub use pool::DOUBLEWRITE_FILE;
pub use record::Op;
pub use store::{
    prefix_end, BulkLoad, CacheStats, CheckReport, CheckpointInfo, Iter, LoadInfo, Options,
    RecoveryInfo, Store, TornPages, Transaction, DATA_FILE, WAL_DIR,
};

/// The longest key.
pub const MAX_KEY: usize = 1024;
/// The longest value (longer than a page's inline share, a value is
/// stored in a chain of overflow pages).
pub const MAX_VALUE: usize = 1 << 20;

/// The value `kvstore bench` writes for `key`: derived from the key, so a
/// reader (a crash test) can tell a written value from any other bytes.
pub fn bench_value(key: &[u8], size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(size);
    let mut x = crc32c::crc32c(key);
    while v.len() < size {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        v.push((x >> 24) as u8);
    }
    v
}

// Shared between threads by `Arc`.
static_assertions::assert_impl_all!(Store: Send, Sync);
