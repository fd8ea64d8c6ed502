//! What the cleaner and the checkpoint write home: the dirty pages, all
//! of them in page order or a batch at a time in clock order.

use super::{Pool, Slot};
use crate::page::PageNo;

impl Pool {
    /// The dirty pages, in page order.
    pub(crate) fn dirty_pages(&self) -> Vec<PageNo> {
        let st = self.state.lock();
        let mut v: Vec<PageNo> = st
            .frames
            .iter()
            .filter_map(|(no, s)| match s {
                Slot::Ready(f) if f.dirty => Some(*no),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Dirty pages to clean, in clock order from `cursor`, at most `n`;
    /// `cursor` is left after the last entry looked at. A cleaning pass
    /// starts its cursor at 0 (the hand) and passes it to every call, so
    /// each call walks on from where the last stopped, wrapping round once
    /// at most: the pages a call returned, clean by the next call, are not
    /// walked past again (starting at the hand every time made a pass
    /// quadratic in its batches, all under the pool's mutex).
    pub(crate) fn dirty_in_clock_order(&self, n: usize, cursor: &mut u64) -> Vec<PageNo> {
        let st = self.state.lock();
        let len = st.clock.len();
        // Before the hand (evicted or moved back since): start at it.
        let mut i = usize::try_from(cursor.saturating_sub(st.popped))
            .unwrap_or(usize::MAX)
            .min(len);
        let mut out = Vec::with_capacity(n.min(len));
        for _ in 0..len {
            if out.len() >= n {
                break;
            }
            if i == len {
                i = 0;
            }
            let no = st.clock[i];
            if matches!(st.frames.get(&no), Some(Slot::Ready(f)) if f.dirty && !f.pinned) {
                out.push(no);
            }
            i += 1;
        }
        *cursor = st.popped + i as u64;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::Spill;
    use super::*;
    use crate::page::{Kind, Page};
    use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
    use journal_core::Lsn;
    use std::sync::Arc;

    /// A pool of 64 frames holding pages 10..74, every one dirty.
    fn dirty_pool() -> Pool {
        let vfs: Arc<dyn Vfs> = Arc::new(SimVfs::new());
        vfs.create_dir_all("/db".as_ref()).unwrap();
        let data = vfs
            .open("/db/data.kv".as_ref(), OpenOptions::create())
            .unwrap();
        let spill = Spill::new(vfs, "/db/spill".into(), 0);
        let pool = Pool::new(
            data,
            64 * super::super::FRAME_BYTES,
            spill,
            false,
            None,
            Default::default(),
        );
        for no in 10..74 {
            pool.put(no, Page::new(no, Kind::Leaf), None);
            pool.stamp(&[(no, false)], Lsn(1), 0);
        }
        pool
    }

    #[test]
    fn a_cleaning_pass_walks_on_from_where_its_last_batch_stopped() {
        let pool = dirty_pool();
        let mut cursor = 0;
        // Nothing is written between the calls, so every page stays
        // dirty: a pass that started at the hand each time would hand
        // out the first batch again.
        let first = pool.dirty_in_clock_order(24, &mut cursor);
        let second = pool.dirty_in_clock_order(24, &mut cursor);
        let third = pool.dirty_in_clock_order(24, &mut cursor);
        assert_eq!(first, (10..34).collect::<Vec<_>>());
        assert_eq!(second, (34..58).collect::<Vec<_>>());
        // Round the clock once: the last 16, then the first 8 again.
        let wrapped: Vec<PageNo> = (58..74).chain(10..18).collect();
        assert_eq!(third, wrapped);
        // A new pass starts at the hand.
        assert_eq!(pool.dirty_in_clock_order(4, &mut 0), vec![10, 11, 12, 13]);
        assert_eq!(pool.dirty_pages(), (10..74).collect::<Vec<_>>());
    }

    #[test]
    fn every_page_the_pool_hands_out_gives_its_buffer_back_when_its_last_holder_lets_go() {
        let pool = dirty_pool();
        let spare = || pool.spare.len();
        let at_start = spare();
        let held = pool.with_cached(|look| look(10)).unwrap();
        drop(pool.copy(&held));
        assert_eq!(spare(), at_start + 1, "a transaction's copy");
        // (Each takes the spare buffer, and gives it back.)
        drop(pool.new_page::<&[u8]>(80, Kind::Leaf, 0, &[]));
        assert_eq!(spare(), at_start + 1, "a new page");
        // Page 10 replaced, its old version still read by `held` (a
        // scan's, say): its buffer comes back when `held` goes, not
        // before.
        let copy = pool.copy(&held);
        assert_eq!(spare(), at_start);
        let (before, _, _) = pool.put(10, copy, None);
        pool.stamp(&[(10, false)], Lsn(2), 0);
        drop(before);
        assert_eq!(spare(), at_start);
        drop(held);
        assert_eq!(
            spare(),
            at_start + 1,
            "the old version, once no one read it"
        );
    }
}
