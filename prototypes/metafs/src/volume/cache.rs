//! The metadata block cache, bounded by [`MountOptions::cache_bytes`].
//!
//! A block may leave the cache only when its home copy in the image holds
//! what the cache holds: not changed by the running transaction, and not
//! changed since the last checkpoint wrote the changed blocks home (the
//! checkpoint set, which contains the running transaction's blocks). Such
//! a block is read back from the image on its next use. Blocks the
//! checkpoint set holds stay whatever the bound, so the cache may pass it
//! by them: at most the log written since the last checkpoint
//! ([`MountOptions::checkpoint_log_bytes`]) divided among 4 KiB images,
//! and the running transaction's blocks (committed once its record
//! reaches a quarter of the journal's largest).
//!
//! Eviction is the clock (second chance): a block used since the hand
//! last passed it is passed over once.

use super::*;
use std::collections::VecDeque;

/// The most clock entries one eviction looks at.
const HAND_STEPS: usize = 64;

/// One cached block.
struct Cached {
    data: Box<[u8]>,
    /// Used since the clock's hand last passed it.
    referenced: bool,
}

/// Metadata blocks by number, with their clock.
pub(super) struct BlockCache {
    blocks: HashMap<u32, Cached>,
    /// Block numbers in the order the hand meets them. An entry whose
    /// block has left the cache is dropped when the hand reaches it.
    clock: VecDeque<u32>,
    /// Clean blocks are evicted while more than this many are cached.
    limit: usize,
}

impl BlockCache {
    /// An empty cache of at most `bytes` (of clean blocks; at least 4).
    pub(super) fn new(bytes: usize) -> Self {
        Self {
            blocks: HashMap::new(),
            clock: VecDeque::new(),
            limit: (bytes / BLOCK).max(4),
        }
    }

    /// Blocks cached.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Block `b` if cached (not marked used: for commits and
    /// checkpoints, which are not uses).
    pub(super) fn peek(&self, b: u32) -> Option<&[u8]> {
        self.blocks.get(&b).map(|c| &c.data[..])
    }

    /// Block `b` if cached, marked used.
    pub(super) fn get_mut(&mut self, b: u32) -> Option<&mut Box<[u8]>> {
        self.blocks.get_mut(&b).map(|c| {
            c.referenced = true;
            &mut c.data
        })
    }

    /// Caches `data` as block `b` (replacing what was cached of it), after
    /// evicting clean blocks if the cache is at its bound; `dirty` says
    /// which blocks may not leave.
    pub(super) fn insert(
        &mut self,
        b: u32,
        data: Box<[u8]>,
        dirty: impl Fn(u32) -> bool,
    ) -> &mut Box<[u8]> {
        if !self.blocks.contains_key(&b) {
            self.evict(&dirty);
            self.clock.push_back(b);
        }
        let c = self.blocks.entry(b).or_insert(Cached {
            data: Box::default(),
            referenced: true,
        });
        c.data = data;
        c.referenced = true;
        &mut c.data
    }

    /// Forgets block `b` (a freed metadata block).
    pub(super) fn remove(&mut self, b: u32) {
        self.blocks.remove(&b);
    }

    /// Evicts clean blocks until there is room for one more, passing over
    /// dirty ones and giving used ones their second chance. The hand moves
    /// at most [`HAND_STEPS`] per call: when it finds nothing to evict
    /// there (the cache full of dirty blocks, before a checkpoint), the
    /// cache grows by the block instead of scanning all of itself at every
    /// miss.
    fn evict(&mut self, dirty: &impl Fn(u32) -> bool) {
        let mut budget = HAND_STEPS;
        while self.blocks.len() >= self.limit && budget > 0 {
            budget -= 1;
            let Some(b) = self.clock.pop_front() else {
                break;
            };
            let Some(c) = self.blocks.get_mut(&b) else {
                continue; // left the cache: the entry goes
            };
            if dirty(b) {
                self.clock.push_back(b);
            } else if c.referenced {
                c.referenced = false;
                self.clock.push_back(b);
            } else {
                self.blocks.remove(&b);
            }
        }
        // Entries of blocks that left and came back are doubled; keep the
        // clock from growing past the cache by them.
        if self.clock.len() > 2 * self.blocks.len() + 1024 {
            let blocks = &self.blocks;
            let mut seen = HashSet::new();
            self.clock
                .retain(|b| blocks.contains_key(b) && seen.insert(*b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(v: u8) -> Box<[u8]> {
        vec![v; BLOCK].into_boxed_slice()
    }

    #[test]
    fn clean_blocks_leave_at_the_bound_and_dirty_ones_stay() {
        let mut c = BlockCache::new(16 * BLOCK);
        // Blocks 0..8 dirty, the rest clean.
        let dirty = |b: u32| b < 8;
        for b in 0..100u32 {
            c.insert(b, block(b as u8), dirty);
            assert!(c.len() <= 16, "{} cached after block {b}", c.len());
        }
        for b in 0..8 {
            assert_eq!(
                c.peek(b),
                Some(&block(b as u8)[..]),
                "dirty block {b} evicted"
            );
        }
        assert_eq!(c.peek(99), Some(&block(99)[..]));
        // Nothing clean: the cache passes its bound rather than lose one.
        let mut c = BlockCache::new(16 * BLOCK);
        for b in 0..40u32 {
            c.insert(b, block(1), |_| true);
        }
        assert_eq!(c.len(), 40);
    }

    #[test]
    fn a_block_used_since_the_hand_passed_gets_a_second_chance() {
        let mut c = BlockCache::new(16 * BLOCK);
        for b in 0..16u32 {
            c.insert(b, block(0), |_| false);
        }
        // A first turn clears every mark and evicts block 0; block 1 is
        // used again after it.
        c.insert(100, block(0), |_| false);
        assert!(c.peek(0).is_none());
        assert!(c.get_mut(1).is_some());
        c.insert(101, block(0), |_| false);
        assert!(c.peek(1).is_some(), "a used block was evicted first");
        assert!(c.peek(2).is_none());
    }

    #[test]
    fn the_clock_does_not_grow_with_blocks_that_come_and_go() {
        let mut c = BlockCache::new(16 * BLOCK);
        for round in 0..10_000u32 {
            c.insert(round % 4, block(0), |_| false);
            c.remove(round % 4);
        }
        assert!(c.clock.len() <= 2 * c.len() + 1024 + 1, "{}", c.clock.len());
    }
}
