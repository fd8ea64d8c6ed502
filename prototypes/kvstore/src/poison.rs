//! The store's poison: the first fatal error, shared by the store and its
//! buffer pool, so that whichever of them meets a failed write or sync of
//! the data file, the double-write area or the log poisons the store on
//! the spot — not only when the error happens to reach a caller that
//! remembers to.
//!
//! Why on the spot: Linux drops the dirty pages of a file whose writeback
//! failed and reports the error once ("fsyncgate"), so after a failed sync
//! of `data.kv` the next one succeeds having written nothing. A pool that
//! answered the failure to one reader and went on would let the next
//! checkpoint move the log's tail past pages (or a meta page) that never
//! reached the disk. So the pool poisons before it answers, every later
//! page write refuses to start, and a checkpoint looks at the poison after
//! its last sync and before it lets the journal move the tail.

use crate::Error;
use journal_core::sync::atomic::{AtomicBool, Ordering};
use journal_core::sync::Mutex;

/// The first fatal error, once there is one.
#[derive(Default)]
pub(crate) struct Poison {
    /// Set once `first` holds an error (checked without the mutex on every
    /// call and every step of an iterator).
    set: AtomicBool,
    first: Mutex<Option<Error>>,
}

impl Poison {
    /// `Ok` while nothing is poisoned; else the first error.
    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.set.load(Ordering::Acquire) {
            if let Some(e) = &*self.first.lock() {
                return Err(e.clone());
            }
        }
        Ok(())
    }

    /// Records `e` unless an error is recorded already; returns the first.
    pub(crate) fn set(&self, e: Error) -> Error {
        let mut first = self.first.lock();
        let e = first.get_or_insert(e).clone();
        self.set.store(true, Ordering::Release);
        e
    }

    /// `r`, with an error recorded first: for a result of a write or sync
    /// whose failure is fatal.
    pub(crate) fn fatal<T, E: Into<Error>>(&self, r: Result<T, E>) -> Result<T, Error> {
        r.map_err(|e| self.set(e.into()))
    }
}
