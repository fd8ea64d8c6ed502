//! Page buffers let go, kept for the next page: a pool's pages come from
//! a stable set of buffers instead of the allocator.
//!
//! Why: the pool's pages are allocated by whichever thread reads or
//! copies one, and freed by whichever thread lets go of the last
//! reference. With glibc's per-thread arenas, a buffer freed goes back to
//! the arena it came from, and a thread that then needs one takes fresh
//! memory from its own: as the work moves between threads (writers, a
//! long scan, one thread deleting in batches) the arenas together end up
//! holding the cache several times over. Measured at 10 M keys
//! (docs/PERFORMANCE.md, "Page buffers that come back"): the main
//! thread's heap grew by 46 MiB during a batch delete while thirteen
//! writer arenas held 5–9 MiB each of buffers freed into them.
//!
//! So a page installed in the pool carries its pool's [`Spare`], and its
//! buffer goes back there when the last reference to it is dropped,
//! wherever that happens (an iterator done with a leaf, a checkpoint's
//! batch, a version no snapshot reads any more). The list keeps at most
//! [`Spare::set_limit`] buffers — the pool sets it to the frames it has
//! room for — so frames, kept versions and spare buffers together stay
//! within the cache.

use super::{Page, PAGE_SIZE};
use journal_core::sync::atomic::{AtomicUsize, Ordering};
use journal_core::sync::Mutex;
use std::sync::Arc;

/// Buffers let go, up to a limit. Its lock is the innermost of the
/// store's: a page may be dropped under the pool's mutex (an eviction),
/// and nothing is locked while this one is held.
pub(crate) struct Spare {
    list: Mutex<Vec<Box<[u8; PAGE_SIZE]>>>,
    limit: AtomicUsize,
}

impl Spare {
    /// An empty list keeping at most `limit` buffers.
    pub(crate) fn new(limit: usize) -> Spare {
        Spare {
            list: Mutex::new(Vec::new()),
            limit: AtomicUsize::new(limit),
        }
    }

    /// A buffer: a spare one if any (its contents stale), else new.
    pub(crate) fn take(&self) -> Box<[u8; PAGE_SIZE]> {
        self.list
            .lock()
            .pop()
            .unwrap_or_else(|| Box::new([0u8; PAGE_SIZE]))
    }

    /// Keeps `b` for reuse, or frees it if the list is at its limit.
    pub(crate) fn give(&self, b: Box<[u8; PAGE_SIZE]>) {
        let mut list = self.list.lock();
        if list.len() < self.limit.load(Ordering::Relaxed) {
            list.push(b);
        }
    }

    /// Keeps at most `limit` buffers from now on (those kept over it are
    /// taken first; none is added until the list is under it).
    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Buffers kept now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.list.lock().len()
    }
}

// A page's buffer: where it comes from and where it goes.

impl PartialEq for Page {
    fn eq(&self, other: &Page) -> bool {
        self.0 == other.0
    }
}

impl Eq for Page {}

impl Clone for Page {
    /// A copy, in a buffer of the same pool's if it is a pool's.
    fn clone(&self) -> Page {
        let mut b = match &self.1 {
            Some(spare) => spare.take(),
            None => Box::new([0u8; PAGE_SIZE]),
        };
        b.copy_from_slice(&self.0);
        Page(b, self.1.clone())
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        if let Some(spare) = self.1.take() {
            if let Ok(b) = Box::<[u8; PAGE_SIZE]>::try_from(std::mem::take(&mut self.0)) {
                spare.give(b);
            }
        }
    }
}

impl Page {
    /// A page over a buffer (its bytes are this page's copy).
    pub(crate) fn from_buffer(b: Box<[u8; PAGE_SIZE]>) -> Page {
        Page(b, None)
    }

    /// The page's buffer (not given back to a pool).
    pub(crate) fn into_buffer(mut self) -> Box<[u8; PAGE_SIZE]> {
        self.1 = None;
        Box::<[u8; PAGE_SIZE]>::try_from(std::mem::take(&mut self.0))
            .unwrap_or_else(|_| Box::new([0u8; PAGE_SIZE]))
    }

    /// From now on the page's buffer goes back to `spare` when the page
    /// is dropped (unless it already goes to a pool's).
    pub(crate) fn give_back_to(&mut self, spare: &Arc<Spare>) {
        if self.1.is_none() {
            self.1 = Some(spare.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::{Kind, Page};
    use std::sync::Arc;

    fn page_of(spare: &Arc<Spare>, no: u32) -> Page {
        let mut p = Page::new(no, Kind::Leaf);
        p.give_back_to(spare);
        p
    }

    #[test]
    fn a_buffer_comes_back_when_its_last_holder_lets_go_up_to_the_limit() {
        let spare = Arc::new(Spare::new(2));
        let a = Arc::new(page_of(&spare, 1));
        let b = a.clone();
        drop(a);
        assert_eq!(spare.len(), 0, "another holder still reads it");
        drop(b);
        assert_eq!(spare.len(), 1);
        // A copy is made in a spare buffer, and comes back too.
        let p = page_of(&spare, 2);
        let copy = p.clone();
        assert_eq!(spare.len(), 0);
        assert_eq!(copy, p);
        drop((p, copy));
        assert_eq!(spare.len(), 2);
        // Past the limit a buffer is freed; a page of no pool's is not
        // kept at all.
        drop(page_of(&spare, 3));
        drop(Page::new(4, Kind::Leaf));
        assert_eq!(spare.len(), 2);
        spare.set_limit(3);
        drop(page_of(&spare, 5));
        assert_eq!(spare.len(), 3);
        let _taken = spare.take();
        assert_eq!(spare.len(), 2);
    }
}
