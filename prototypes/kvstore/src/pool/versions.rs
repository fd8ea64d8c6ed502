//! Page versions kept for open snapshots: in memory up to a bound, then
//! spilled to a scratch file, so a long iterator beside writers (a full
//! scan, a Raft snapshot being built) keeps its snapshot in bounded
//! memory instead of expiring (WiredTiger's history store plays this
//! part; PostgreSQL and InnoDB keep old versions in the heap and the undo
//! log).
//!
//! - A writer replacing a page that an open snapshot still reads hands
//!   the old version here ([`Versions::stash`]). A version is read by the
//!   snapshots open when it was kept, from its LSN on and below the next
//!   kept version's LSN (a snapshot opened later reads the change that
//!   replaced it), and is dropped as soon as none of them is open
//!   ([`Versions::prune`]). So a snapshot can be the last reader only of
//!   versions kept while it was open, and its close looks at those
//!   alone: a 100-key scan beside a long one does not walk the thousands
//!   of versions the long one keeps.
//! - Versions take their room from the cache: the pool holds that many
//!   frames fewer ([`Pool::capacity`]). Counted are the versions in
//!   memory and the bookkeeping of every version, spilled or not: an
//!   index entry (`index.rs`: 20 bytes, in chunks whose bytes are known)
//!   and a key in the order kept (12 bytes) — about 41 bytes a version as
//!   a scan's versions come in (`tests.rs` measures it).
//! - Past the in-memory bound (a quarter of the cache), the versions in
//!   memory are written to `snapshots.spill` in the store directory, a
//!   page per slot, sealed with their CRC, and only their bookkeeping
//!   stays in memory. A spilled version read back is checked (CRC, page
//!   number, LSN) like any page from disk. Freed slots are reused; the
//!   file is cut back to nothing once no version is spilled.
//! - The oldest snapshots expire instead ([`crate::Error::SnapshotTooOld`])
//!   past the spill bound ([`crate::Options::snapshot_spill_bytes`]), when
//!   the spill file cannot be written, or when the bookkeeping alone
//!   fills the in-memory bound: with the default 64 MiB cache (16 MiB for
//!   versions) a full scan beside writers keeps about 400,000 versions
//!   (1.6 GiB spilled) before it expires — a 10 M-key store's scan needed
//!   about 200,000. The store itself is never affected.
//!
//! The spill file is scratch: never synced, removed when the store opens
//! and closes, and not part of the format.

use super::*;
use index::{Entry, Index, Key};
use std::mem::size_of;

mod index;
mod spill;
#[cfg(test)]
mod tests;

pub(crate) use spill::Spill;

/// The scratch file spilled versions go to, in the store directory.
pub const SPILL_FILE: &str = "snapshots.spill";

/// An entry's `at` with this bit: the version is in memory, at
/// `Versions::mem[at & !MEM]`; without it, in that slot of the spill file
/// (so at most 2^31 slots: 8 TiB).
const MEM: u32 = 1 << 31;

/// The version a snapshot reads, as found under the pool's mutex.
pub(super) enum Picked {
    Page(Arc<Page>),
    Spilled { lsn: Lsn, slot: u64 },
}

/// An open snapshot's "expired" flag, and how many versions had been
/// kept when it opened.
type Open = (Arc<AtomicBool>, u64);

/// Open snapshots and the page versions they still need.
#[derive(Default)]
pub(super) struct Versions {
    /// Open snapshots by (LSN, id).
    open: BTreeMap<(Lsn, u64), Open>,
    next_id: u64,
    /// Replaced versions of pages by (page, pageLSN): a page's versions
    /// are adjacent, oldest first (`index.rs`: 20 bytes an entry, and its
    /// bytes known).
    index: Index,
    /// The versions in memory, each with its key.
    mem: Vec<(Key, Arc<Page>)>,
    /// Each version's key in the order kept: `order[i]` is version number
    /// `order_base + i + 1` (a version kept again gets a new number: its
    /// index entry has its last). A snapshot can be the last reader only
    /// of versions kept while it was open (one kept before it opened was
    /// replaced by a change it sees), so its close looks at those alone,
    /// not at every version a long snapshot keeps. Keys of versions gone
    /// or kept again since are skipped, and dropped once at the front or
    /// once they outnumber the versions (the open snapshots' numbers
    /// follow).
    order_base: u64,
    order: VecDeque<Key>,
    /// Bytes of memory the versions hold, in whole frames: those in
    /// memory, and the bookkeeping of every version, spilled or not
    /// (`index`, `order`, `mem`, `free_slots`).
    pub(super) bytes: usize,
    /// Slots holding a version.
    pub(super) spilled: u64,
    /// Slots below `next_slot` holding none.
    free_slots: Vec<u32>,
    /// Slots the spill file holds.
    next_slot: u32,
    /// Someone is writing (or cutting back) the spill file.
    spilling: bool,
}

impl Versions {
    /// Versions kept so far (the number of the last one).
    fn kept(&self) -> u64 {
        self.order_base + self.order.len() as u64
    }

    /// Bytes of the versions' bookkeeping: all but their pages in memory.
    fn index_bytes(&self) -> usize {
        self.index.bytes()
            + self.order.capacity() * size_of::<Key>()
            + self.mem.capacity() * size_of::<(Key, Arc<Page>)>()
            + self.free_slots.capacity() * size_of::<u32>()
    }

    /// The bytes `index_bytes` would count after [`Versions::fit`].
    fn fitted_index_bytes(&self) -> usize {
        self.index.fitted_bytes()
            + self.order.len() * size_of::<Key>()
            + self.mem.len() * size_of::<(Key, Arc<Page>)>()
            + self.free_slots.len() * size_of::<u32>()
    }

    /// The bytes of the versions in memory, and of `index` bytes of
    /// bookkeeping: in whole frames, since the pool holds a frame fewer
    /// for each ([`Pool::capacity`]).
    fn bytes_with(&self, index: usize) -> usize {
        self.mem.len() * FRAME_BYTES + index.div_ceil(FRAME_BYTES) * FRAME_BYTES
    }

    /// Counts the bytes again after a change.
    fn recount(&mut self) {
        self.bytes = self.bytes_with(self.index_bytes());
    }

    /// The bytes counted after [`Versions::fit`].
    fn fitted_bytes(&self) -> usize {
        self.bytes_with(self.fitted_index_bytes())
    }

    /// Gives back the room the bookkeeping holds beyond its entries.
    fn fit(&mut self) {
        self.index.fit();
        self.order.shrink_to_fit();
        self.mem.shrink_to_fit();
        self.free_slots.shrink_to_fit();
        self.recount();
    }

    /// Gives back the room of a list more than half empty (by a quarter
    /// more than it holds, so the next pushes do not grow it at once).
    fn trim<T>(v: &mut Vec<T>) {
        if v.capacity() > 2 * v.len() + 1024 {
            v.shrink_to(v.len() + v.len() / 4);
        }
    }

    /// Keeps `old`, the version of page `no` a writer replaces, if an open
    /// snapshot may read it. A version kept already (a pageLSN names one
    /// version of a page) is kept once, under a new number: a transaction
    /// rolled back and run again replaces the same version again, and a
    /// snapshot opened in between reads it too.
    pub(super) fn stash(&mut self, no: PageNo, old: &Arc<Page>) {
        let wanted = self
            .open
            .keys()
            .next_back()
            .is_some_and(|(s, _)| *s >= old.lsn());
        if !wanted || old.lsn() == PENDING {
            return;
        }
        let key = Key::new(no, old.lsn());
        // (An entry's number is its low half: `order` must stay narrower
        // than 2^32. It is far narrower: its bytes are bounded.)
        if self.order.len() >= u32::MAX as usize / 2 {
            return;
        }
        let number = self.kept() + 1;
        if let Some(e) = self.index.get_mut(key) {
            // Kept again: the snapshots open now may read it (one opened
            // since a rolled-back transaction first replaced it).
            e.set_number(number);
        } else {
            // (Never 2^31 versions in memory: they are bounded by the
            // cache.)
            let Some(at) = u32::try_from(self.mem.len()).ok().filter(|i| *i < MEM) else {
                return;
            };
            self.index.insert(Entry::new(key, at | MEM, number));
            self.mem.push((key, old.clone()));
        }
        if self.order.len() == self.order.capacity() {
            // By a quarter, not double: its bytes count.
            self.order.reserve_exact(self.order.len() / 4 + 64);
        }
        self.order.push_back(key);
        self.recount();
    }

    /// Whether `order[i]` stands for a version still kept (and not kept
    /// again since: its entry carries that number).
    fn live(&self, i: usize, key: Key) -> bool {
        let number = self.order_base + i as u64 + 1;
        self.index.get(key).is_some_and(|e| e.is_number(number))
    }

    /// The version of page `no` a snapshot at `s` reads, given the page as
    /// it stands.
    pub(super) fn pick(&self, page: &Arc<Page>, no: PageNo, s: Lsn) -> Result<Picked> {
        if page.lsn() <= s {
            return Ok(Picked::Page(page.clone()));
        }
        let e = self
            .index
            .floor(Key::new(no, s))
            .filter(|e| e.key.no == no)
            .ok_or(Error::SnapshotTooOld)?;
        if e.at & MEM == 0 {
            return Ok(Picked::Spilled {
                lsn: e.key.lsn(),
                slot: u64::from(e.at),
            });
        }
        match self.mem.get((e.at & !MEM) as usize) {
            Some((_, p)) => Ok(Picked::Page(p.clone())),
            None => Err(Error::SnapshotTooOld),
        }
    }

    /// Takes the version at `mem[i]` out of memory (the last one moves to
    /// its place).
    fn take_mem(&mut self, i: usize) -> Arc<Page> {
        let (_, page) = self.mem.swap_remove(i);
        if let Some((moved, _)) = self.mem.get(i) {
            if let Some(e) = self.index.get_mut(*moved) {
                // (`i` is below `mem.len()`, itself below MEM.)
                e.at = i as u32 | MEM;
            }
        }
        page
    }

    /// Drops the versions no open snapshot reads any more, among those
    /// kept after the `from`-th (those a snapshot that opened then could
    /// have been the last reader of). A version is read by the snapshots
    /// that were open when it was (last) kept, from its LSN on, and below
    /// the next version's LSN if one is kept: a snapshot opened later
    /// reads the change that replaced it. (Not "every snapshot from its
    /// LSN on" when it is the newest kept: that counted a younger
    /// snapshot, whose close never looks at it, and the version stayed
    /// for good.) Their slots are freed; the pages held in memory are
    /// returned, for the pool to take their buffers back once its mutex
    /// is released.
    #[must_use]
    fn prune(&mut self, from: u64) -> Vec<Arc<Page>> {
        let start = usize::try_from(from.saturating_sub(self.order_base))
            .map_or(self.order.len(), |s| s.min(self.order.len()));
        let mut gone = Vec::new();
        for (j, &key) in self.order.range(start..).enumerate() {
            let i = start + j;
            if !self.live(i, key) {
                continue;
            }
            let number = self.order_base + i as u64 + 1;
            let next = self
                .index
                .above(key)
                .filter(|e| e.key.no == key.no)
                .map_or(Lsn(u64::MAX), |e| e.key.lsn());
            let lsn = key.lsn();
            let read = self
                .open
                .range((lsn, 0)..(next, 0))
                .any(|(_, (_, opened))| *opened < number);
            if !read {
                gone.push(key);
            }
        }
        let mut dropped = Vec::new();
        for key in gone {
            match self.index.remove(key) {
                Some(e) if e.at & MEM != 0 => dropped.push(self.take_mem((e.at & !MEM) as usize)),
                Some(e) => {
                    self.spilled -= 1;
                    self.free_slots.push(e.at);
                }
                None => {}
            }
        }
        while let Some(&key) = self.order.front() {
            if self.live(0, key) {
                break;
            }
            self.order.pop_front();
            self.order_base += 1;
        }
        if self.order.len() > 2 * self.index.len() + 1024 {
            self.compact_order();
        }
        if self.index.is_empty() {
            self.order = VecDeque::new();
            self.mem = Vec::new();
        } else if self.order.capacity() > 2 * self.order.len() + 1024 {
            self.order
                .shrink_to(self.order.len() + self.order.len() / 4);
        }
        Self::trim(&mut self.mem);
        Self::trim(&mut self.free_slots);
        self.recount();
        dropped
    }

    /// Drops the keys of versions gone (or kept again since) from
    /// `order`, renumbering the rest and the open snapshots' numbers with
    /// them: a snapshot that opened after the `n`-th version kept now
    /// opened after the versions still kept among the first `n`.
    fn compact_order(&mut self) {
        let mut froms: Vec<u64> = self.open.values().map(|(_, f)| *f).collect();
        froms.sort_unstable();
        froms.dedup();
        let mut renumbered = Vec::with_capacity(froms.len());
        let mut order = VecDeque::with_capacity(self.index.len() + 1024);
        let mut f = 0;
        for (i, &key) in self.order.iter().enumerate() {
            let number = self.order_base + i as u64 + 1;
            while froms.get(f).is_some_and(|from| *from < number) {
                renumbered.push(self.order_base + order.len() as u64);
                f += 1;
            }
            if self.live(i, key) {
                order.push_back(key);
            }
        }
        for (i, key) in order.iter().enumerate() {
            if let Some(e) = self.index.get_mut(*key) {
                e.set_number(self.order_base + i as u64 + 1);
            }
        }
        while froms.get(f).is_some() {
            renumbered.push(self.order_base + order.len() as u64);
            f += 1;
        }
        for (_, from) in self.open.values_mut() {
            if let Some(n) = froms
                .binary_search(from)
                .ok()
                .and_then(|i| renumbered.get(i))
            {
                *from = *n;
            }
        }
        self.order = order;
    }

    /// Expires the oldest snapshots until the bytes (or with
    /// `index_only` those of the bookkeeping) are within `limit`, adding
    /// the pages they alone read to `freed`; how many expired.
    /// The bytes the bookkeeping would hold once fitted decide, and it is
    /// fitted after: the room its lists hold beyond their entries does
    /// not come back as versions go, and would expire every snapshot.
    fn expire_to(&mut self, limit: usize, freed: &mut Vec<Arc<Page>>, index_only: bool) -> usize {
        // (With `index_only`, the bookkeeping's bytes alone.)
        let mem = |v: &Versions| {
            if index_only {
                v.mem.len() * FRAME_BYTES
            } else {
                0
            }
        };
        let mut expired = 0;
        loop {
            while self.fitted_bytes() - mem(self) > limit && self.expire_oldest(freed) {
                expired += 1;
            }
            self.fit();
            if self.bytes - mem(self) <= limit || !self.expire_oldest(freed) {
                return expired;
            }
            expired += 1;
        }
    }

    /// Expires the oldest snapshot, adding the pages it alone read to
    /// `freed`; `false` if none is open.
    fn expire_oldest(&mut self, freed: &mut Vec<Arc<Page>>) -> bool {
        let Some((_, (flag, from))) = self.open.pop_first() else {
            return false;
        };
        flag.store(true, Ordering::Release);
        freed.extend(self.prune(from));
        true
    }

    /// Takes a slot in the spill file.
    fn take_slot(&mut self) -> u32 {
        self.free_slots.pop().unwrap_or_else(|| {
            self.next_slot += 1;
            self.next_slot - 1
        })
    }

    /// Frees every slot once no version is spilled and no one writes the
    /// spill file; `true` if so (the caller then cuts the file back and
    /// clears `spilling`).
    fn start_cut_back(&mut self) -> bool {
        if self.spilled > 0 || self.next_slot == 0 || self.spilling {
            return false;
        }
        self.spilling = true;
        self.next_slot = 0;
        self.free_slots = Vec::new();
        self.recount();
        true
    }

    /// Puts spilled copies in place of the versions written out, if they
    /// are still kept; frees the slots of those that went meanwhile.
    fn settle(&mut self, written: &[(PageNo, Arc<Page>, u32)]) {
        for (no, page, slot) in written {
            let key = Key::new(*no, page.lsn());
            let i = match self.index.get_mut(key) {
                Some(e) if e.at & MEM != 0 => {
                    let i = (e.at & !MEM) as usize;
                    if !self.mem.get(i).is_some_and(|(_, p)| Arc::ptr_eq(p, page)) {
                        self.free_slots.push(*slot);
                        continue;
                    }
                    e.at = *slot;
                    i
                }
                _ => {
                    self.free_slots.push(*slot);
                    continue;
                }
            };
            // (The batch still holds the page: its buffer goes back once
            // the batch is dropped, outside the pool's mutex.)
            drop(self.take_mem(i));
            self.spilled += 1;
        }
        self.recount();
    }
}

/// A snapshot's registration: dropping it lets its versions go.
pub(crate) struct SnapshotHandle {
    key: (Lsn, u64),
    expired: Arc<AtomicBool>,
}

impl SnapshotHandle {
    /// The snapshot's LSN: it reads every page as of it.
    pub(crate) fn lsn(&self) -> Lsn {
        self.key.0
    }

    /// Whether the snapshot expired ([`crate::Error::SnapshotTooOld`]).
    pub(crate) fn expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }
}

impl Pool {
    /// Page `no` as snapshot `snap` reads it.
    pub(crate) fn fetch_at(
        &self,
        no: PageNo,
        snap: &SnapshotHandle,
        journal: &Journal,
    ) -> Result<Arc<Page>> {
        if snap.expired.load(Ordering::Acquire) {
            return Err(Error::SnapshotTooOld);
        }
        match self.fetch_inner(no, Some(snap.lsn()), journal)? {
            Picked::Page(p) => Ok(p),
            Picked::Spilled { lsn, slot } => self.read_spilled(no, lsn, slot, snap),
        }
    }

    /// Keeps the current version of page `no` for the open snapshots,
    /// before a writer replaces it without having read it: a page taken
    /// off the free list or made a free-list trunk, whose old contents (a
    /// freed value's overflow page) a snapshot older than the free may
    /// still read. From the pool if it holds the page — kept now, since
    /// the frame may be evicted before the writer's copy replaces it —
    /// else from the disk (current for a page the pool does not hold or
    /// is still loading). Only while a snapshot is open. A page that does
    /// not validate on disk was never written home as part of a tree, so
    /// no snapshot reads it. The caller holds the tree lock, so no
    /// snapshot opens meanwhile; a version kept twice is kept once.
    pub(crate) fn keep_for_snapshots(&self, no: PageNo) {
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            if st.versions.open.is_empty() {
                return;
            }
            if let Some(Slot::Ready(f)) = st.frames.get(&no) {
                let page = f.page.clone();
                st.versions.stash(no, &page);
                self.publish(st);
                return;
            }
        }
        let Ok(page) = self.read_disk(no) else {
            return;
        };
        let mut st = self.state.lock();
        st.versions.stash(no, &Arc::new(page));
        self.publish(&st);
    }

    /// Opens a snapshot at `lsn` (the caller holds the tree lock shared,
    /// so no transaction is half applied).
    pub(crate) fn open_snapshot(&self, lsn: Lsn) -> SnapshotHandle {
        let mut st = self.state.lock();
        let v = &mut st.versions;
        let id = v.next_id;
        v.next_id += 1;
        let expired = Arc::new(AtomicBool::new(false));
        let kept = v.kept();
        v.open.insert((lsn, id), (expired.clone(), kept));
        SnapshotHandle {
            key: (lsn, id),
            expired,
        }
    }

    /// Closes a snapshot: the versions only it read go (none if it
    /// expired: they went then); the spill file is cut back once it holds
    /// none.
    pub(crate) fn close_snapshot(&self, h: &SnapshotHandle) {
        let mut st = self.state.lock();
        let freed = match st.versions.open.remove(&h.key) {
            Some((_, from)) => st.versions.prune(from),
            None => Vec::new(),
        };
        self.settled(st, freed);
    }

    /// Bytes of page versions kept in memory for snapshots, and of the
    /// bookkeeping of every version kept, spilled or not (in whole
    /// frames).
    pub(crate) fn version_bytes(&self) -> usize {
        self.versions_n.load(Ordering::Relaxed)
    }
}
