//! The journal's poison: the first failed write or sync, for good.

use crate::{Error, Result};
use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::Mutex;
use std::sync::Arc;

/// Set once, by the first failure; every call checks the flag (one atomic
/// load) and takes the lock only once it is set.
#[derive(Debug, Default)]
pub(crate) struct Poison {
    flag: AtomicBool,
    first: Mutex<Option<Arc<Error>>>,
}

impl Poison {
    /// `Err(Poisoned(first cause))` once poisoned.
    pub(crate) fn check(&self) -> Result<()> {
        if self.flag.load(Ordering::Acquire) {
            if let Some(e) = &*self.first.lock() {
                return Err(Error::Poisoned(e.clone()));
            }
        }
        Ok(())
    }

    /// Records `e` as the first failure (if it is the first) and returns
    /// the error every caller sees from now on.
    pub(crate) fn set(&self, e: Error) -> Error {
        if let Error::Poisoned(_) = e {
            return e;
        }
        let mut p = self.first.lock();
        let first = p.get_or_insert_with(|| Arc::new(e)).clone();
        self.flag.store(true, Ordering::Release);
        Error::Poisoned(first)
    }
}
