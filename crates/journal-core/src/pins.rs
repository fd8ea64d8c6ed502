//! Segment pins: what keeps a segment from being recycled while a reader,
//! an iterator's floor or a follower still needs it.

use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Segments that must not be recycled: each pin holds one segment (and,
/// by the journal's rule, every segment above it) until dropped. Plain pins
/// ([`SegmentPins::pin`]: a read iterator's floor, a mapped segment) hold
/// for as long as they live; a follower's pin ([`FollowPin`]) may be
/// revoked by a checkpoint once its follower lags too far.
#[derive(Debug, Default)]
pub struct SegmentPins {
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Segment → plain pins on it.
    plain: BTreeMap<u64, usize>,
    /// Follower id → (segment, revoked flag).
    follows: BTreeMap<u64, (u64, Arc<AtomicBool>)>,
    next_id: u64,
}

impl SegmentPins {
    /// Pins segment `seg` until the returned guard drops.
    pub fn pin(self: &Arc<Self>, seg: u64) -> SegmentPin {
        *self.held.lock().plain.entry(seg).or_insert(0) += 1;
        SegmentPin {
            pins: self.clone(),
            seg,
        }
    }

    /// A revocable pin on segment `seg`, for a follower.
    pub(crate) fn follow(self: &Arc<Self>, seg: u64) -> FollowPin {
        let revoked = Arc::new(AtomicBool::new(false));
        let mut held = self.held.lock();
        held.next_id += 1;
        let id = held.next_id;
        held.follows.insert(id, (seg, revoked.clone()));
        FollowPin {
            pins: self.clone(),
            id,
            revoked,
        }
    }

    /// The lowest pinned segment after revoking every follower pin for
    /// which `cut(segment)` holds (a checkpoint passes "below what it would
    /// recycle, and lagging past the limit").
    pub(crate) fn lowest_revoking(&self, cut: impl Fn(u64) -> bool) -> Option<u64> {
        let mut held = self.held.lock();
        held.follows.retain(|_, (seg, revoked)| {
            let keep = !cut(*seg);
            if !keep {
                revoked.store(true, Ordering::Release);
                crate::trace::event!(WARN, segment = *seg, "a lagging follower was cut loose");
            }
            keep
        });
        let plain = held.plain.keys().next().copied();
        let follows = held.follows.values().map(|(s, _)| *s).min();
        plain.into_iter().chain(follows).min()
    }
}

/// A pin on one segment ([`SegmentPins::pin`]).
#[derive(Debug)]
pub struct SegmentPin {
    pins: Arc<SegmentPins>,
    seg: u64,
}

impl Drop for SegmentPin {
    fn drop(&mut self) {
        let mut held = self.pins.held.lock();
        if let Some(n) = held.plain.get_mut(&self.seg) {
            *n -= 1;
            if *n == 0 {
                held.plain.remove(&self.seg);
            }
        }
    }
}

/// A follower's pin: moves forward as it reads, and is revoked (for good)
/// by a checkpoint when the follower lags past its limit.
#[derive(Debug)]
pub(crate) struct FollowPin {
    pins: Arc<SegmentPins>,
    id: u64,
    revoked: Arc<AtomicBool>,
}

impl FollowPin {
    /// Moves the pin to segment `seg` (forward); false once revoked.
    pub(crate) fn advance(&self, seg: u64) -> bool {
        let mut held = self.pins.held.lock();
        match held.follows.get_mut(&self.id) {
            Some((s, _)) => {
                *s = (*s).max(seg);
                true
            }
            None => false,
        }
    }

    /// Whether a checkpoint revoked it: segments it held may be gone.
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

impl Drop for FollowPin {
    fn drop(&mut self) {
        self.pins.held.lock().follows.remove(&self.id);
    }
}
