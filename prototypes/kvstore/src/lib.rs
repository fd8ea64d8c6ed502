//! A database prototype on the journal: an embedded key-value store with
//! pages updated in place, checkpoints and redo — the way a database uses
//! a write-ahead log.
//!
//! # How it uses the journal
//!
//! - **Data file** (`data.kv`): 4 KiB pages updated in place, through the
//!   journal's filesystem (`journal_core::vfs`, so `SimVfs` crashes it
//!   too) and registered with [`journal_core::Journal::register_data_file`].
//!   A hash table of buckets: bucket `b` is a chain of pages from its head
//!   page `1 + b`. Every page carries a CRC and its pageLSN (the LSN of the
//!   last log record applied to it). Page 0 holds the journal's id, so a
//!   data file of another store is refused.
//! - **Log records**: one per transaction, holding its operations grouped
//!   by bucket. A bucket's first change after a checkpoint began also
//!   logs the bucket's full image (PostgreSQL's full_page_writes): its
//!   content and pageLSN, from which its pages are rebuilt exactly — a page
//!   torn by a crash while a checkpoint wrote it is restored from it. (The
//!   pages are a pure function of the content, so their free space is left
//!   out, as PostgreSQL leaves out a page's hole.)
//! - **Checkpoints** (in the background, by log volume, and
//!   [`Store::checkpoint`]): bump the image epoch and take the log's end
//!   as the redo position; write every changed bucket home after forcing
//!   the log over their pageLSNs (write-ahead), with no fsync of their own;
//!   then `journal.checkpoint(redo)`, whose PREFLUSH makes the pages
//!   stable before the tail moves and segments recycle.
//! - **Recovery**: read the pages; restore every bucket whose image the
//!   log holds since the checkpoint (pass 1); replay every operation whose
//!   record LSN is above its bucket's pageLSN (pass 2, idempotent).
//!
//! Reads see a transaction as soon as it is committed, before it is
//! durable when committed with [`Transaction::commit_no_wait`].
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
mod pool;
mod record;
mod store;
mod tree;

pub use error::{Error, Result};
pub use page::{FORMAT_VERSION, PAGE_SIZE};
pub use record::Op;
pub use store::{
    CacheStats, CheckpointInfo, Iter, Options, RecoveryInfo, Store, Transaction, DATA_FILE, WAL_DIR,
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
