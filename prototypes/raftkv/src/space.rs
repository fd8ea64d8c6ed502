//! The disk-space alarm: writes are refused before the disk fills, so a
//! node never stops on a full disk (openraft stops its core on any
//! storage error, and a supervisor would restart it into the same full
//! disk).
//!
//! As etcd's `NOSPACE` alarm: a node checks the free space of its
//! directory's filesystem ([`journal_core::vfs::Vfs::available_space`])
//! before it proposes a write that adds data — a put, a transaction with
//! a put, a lease grant — and, below its reserve, answers `507` with
//! `x-raftkv-error: nospace` ([`NOSPACE`]) and proposes nothing. Reads,
//! deletes (of keys, ranges, leases), transactions of deletes only and
//! keep-alives go on: they take little room, and the reserve is there
//! for them (and for the Raft log's next segment, and the store's pages
//! a delete rewrites). The alarm clears by itself once the free space is
//! back at twice the reserve (space freed, the disk grown), no restart.
//! A follower whose free space is under half the reserve refuses appends
//! that carry data (a body over [`APPEND_FLOOR`] bytes) and snapshots
//! with `507`, rather than fail its log and stop: the leader retries it
//! later; heartbeats still pass, so it does not call elections.

use journal_core::sync::atomic::{AtomicBool, Ordering};
use journal_core::vfs::Vfs;
use std::path::PathBuf;
use std::sync::Arc;

/// The free space kept, by default: 256 MiB (sixteen of the Raft log's
/// segments).
pub const DEFAULT_RESERVE: u64 = 256 << 20;

/// The `x-raftkv-error` of a write refused for want of space.
pub const NOSPACE: &str = "nospace";

/// An append body a follower low on space takes still: a heartbeat, or a
/// few small entries.
pub const APPEND_FLOOR: u64 = 64 << 10;

/// A node's view of its disk's free space, and its alarm.
#[derive(Debug)]
pub struct Space {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    reserve: u64,
    alarm: AtomicBool,
}

impl Space {
    /// The alarm of the filesystem holding `dir`, keeping `reserve` bytes
    /// free.
    pub fn new(vfs: Arc<dyn Vfs>, dir: PathBuf, reserve: u64) -> Space {
        Space {
            vfs,
            dir,
            reserve,
            alarm: AtomicBool::new(false),
        }
    }

    /// The free space now (`None` if it cannot be read).
    fn free(&self) -> Option<u64> {
        self.vfs.available_space(&self.dir).ok()
    }

    /// Whether writes that add data are refused: the alarm, looked at
    /// again now — raised below the reserve, cleared at twice it. (If the
    /// free space cannot be read, the alarm stays as it was.)
    pub fn full(&self) -> bool {
        let Some(free) = self.free() else {
            return self.raised();
        };
        let on = match self.raised() {
            true => free < self.reserve.saturating_mul(2),
            false => free < self.reserve,
        };
        self.alarm.store(on, Ordering::Relaxed);
        on
    }

    /// Whether the alarm was raised when last looked at.
    pub fn raised(&self) -> bool {
        self.alarm.load(Ordering::Relaxed)
    }

    /// Whether `bytes` more fit on the disk with the reserve still free
    /// after them (`true` if the free space cannot be read: the write
    /// itself then says). A snapshot is built only if it fits: a node
    /// whose snapshot would eat the reserve keeps its log instead, which
    /// costs it nothing it has not already paid for.
    pub fn room_for(&self, bytes: u64) -> bool {
        self.free()
            .is_none_or(|f| f >= bytes.saturating_add(self.reserve))
    }

    /// Clears the alarm if the free space is back above the reserve
    /// (rather than twice it): etcd's `alarm disarm`. Answers whether the
    /// alarm is raised after it (at once again if still below).
    pub fn disarm(&self) -> bool {
        self.alarm.store(false, Ordering::Relaxed);
        self.full()
    }

    /// The filesystem it watches.
    pub fn vfs(&self) -> Arc<dyn Vfs> {
        self.vfs.clone()
    }

    /// The node's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Whether the disk is under half the reserve: too full to take a
    /// leader's entries.
    pub fn exhausted(&self) -> bool {
        self.free().is_some_and(|f| f < self.reserve / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal_core::vfs::{OpenOptions, SimVfs};

    #[test]
    fn the_alarm_rises_below_the_reserve_and_clears_at_twice_it() {
        let sim = SimVfs::new();
        sim.create_dir_all(std::path::Path::new("/n")).unwrap();
        let s = Space::new(Arc::new(sim.clone()), "/n".into(), 1000);
        sim.set_space_limit(Some(10_000));
        assert!(!s.full());
        let f = sim
            .open(std::path::Path::new("/n/f"), OpenOptions::create())
            .unwrap();
        f.write_at(&[0; 9_200], 0).unwrap();
        assert!(s.full(), "800 free");
        assert!(!s.exhausted());
        f.set_len(9_600).unwrap();
        assert!(s.exhausted(), "400 free");
        f.set_len(8_500).unwrap();
        assert!(s.full(), "1,500 free: still under twice the reserve");
        f.set_len(7_900).unwrap();
        assert!(!s.full(), "2,100 free: cleared");
        f.set_len(8_500).unwrap();
        assert!(!s.full(), "1,500 free: above the reserve");
        assert!(s.room_for(500), "1,500 free: 500 and the reserve fit");
        assert!(!s.room_for(501), "1,500 free: 501 would eat the reserve");
        f.set_len(9_200).unwrap();
        assert!(s.full(), "800 free: raised again");
        f.set_len(8_500).unwrap();
        assert!(
            s.full(),
            "1,500 free: still raised, under twice the reserve"
        );
        assert!(!s.disarm(), "a disarm clears it above the reserve");
        f.set_len(9_200).unwrap();
        assert!(s.disarm(), "below the reserve a disarm leaves it raised");
    }
}
