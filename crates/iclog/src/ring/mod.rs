//! The ring of in-core log buffers and its state machine.

use crate::format::{self, ENTRY_HEADER_SIZE, HEADER_SIZE};
use crate::{Config, Error, FlushPolicy, IoFlags, LogDevice, Lsn};
use journal_sync::atomic::{AtomicU64, Ordering};
use journal_sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, StatCounter};
use journal_vfs::AlignedBuf;

mod chains;
mod io;

/// The state of one buffer (XFS `ic_state`).
///
/// ```text
/// ACTIVE ──switch──▶ WANT_SYNC ──last release──▶ SYNCING ──I/O done──▶ DONE_SYNC
///    ▲                                                                    │
///    └──── DIRTY ◀── completion processing, strictly in LSN order ◀──────┘
/// ```
///
/// DIRTY is transient here: completion processing resets a buffer and
/// makes it ACTIVE again in the same critical section, in ring order (the
/// oldest buffer first), so it never lingers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufState {
    /// Free, or taking writes if it is the ring's active buffer.
    Active,
    /// Switched out: no new writes; written once the last reference drops.
    WantSync,
    /// Its write is in flight.
    Syncing,
    /// Its write completed; waiting for every lower-LSN buffer to complete
    /// so completions are processed in log order.
    DoneSync,
}

#[derive(Debug)]
struct Slot {
    state: BufState,
    /// LSN of the record this buffer holds (valid once it has data).
    lsn: Lsn,
    /// Payload bytes reserved.
    used: usize,
    entries: u32,
    /// Writers that reserved space and have not released it (XFS
    /// `ic_refcnt`); the buffer cannot be written while non-zero.
    refs: u32,
    /// NEED_FUA (as [`IoFlags::FUA`]) set by a force.
    need: IoFlags,
    /// The tail LSN stamped into the header, once stamped.
    tail: Option<Lsn>,
    /// Flags the write was issued with.
    issued: IoFlags,
    /// Chain bits of the record ([`format::CONTINUED`], [`format::CONTINUES`]).
    chain: u16,
}

impl Slot {
    fn new() -> Self {
        Self {
            state: BufState::Active,
            lsn: Lsn::ZERO,
            used: 0,
            entries: 0,
            refs: 0,
            need: IoFlags::empty(),
            tail: None,
            issued: IoFlags::empty(),
            chain: 0,
        }
    }

    fn reset(&mut self) {
        *self = Self::new();
    }

    fn record_size(&self, align: u64) -> u64 {
        format::record_size(self.used, align)
    }

    /// Whether `lsn` falls in this buffer's record (header to padding).
    fn holds(&self, lsn: Lsn, align: u64) -> bool {
        self.used > 0 && self.lsn <= lsn && lsn < self.lsn.plus(self.record_size(align))
    }

    /// Whether the write of this buffer is (or will be) FUA.
    fn fua(&self) -> bool {
        (self.need | self.issued).contains(IoFlags::FUA)
    }
}

#[derive(Debug)]
struct RingState<E> {
    slots: Vec<Slot>,
    /// The buffer that takes writes (when ACTIVE).
    active: usize,
    /// The lowest-LSN buffer not yet completed and processed.
    oldest: usize,
    /// Where the next record starts: the active buffer's LSN once it takes data.
    next_lsn: Lsn,
    /// Every record below has completed its write (durable or not).
    written_lsn: Lsn,
    /// Every record below is durable.
    durable_lsn: Lsn,
    /// The log tail most recently reported.
    tail_lsn: Lsn,
    /// The tail carried by the last write that flushed after a tail move.
    flushed_tail: Lsn,
    /// The tail moved since the last durable log write.
    tail_moved: bool,
    /// A bare flush (no write) is in flight.
    flushing: bool,
    poisoned: Option<E>,
    /// Threads waiting on `progress` / on `space`: notifications are only
    /// sent when someone listens (a notify is a syscall even with nobody
    /// waiting).
    progress_waiters: u32,
    space_waiters: u32,
    /// A chain (an entry larger than a buffer) is being appended: every
    /// other append waits, so its parts are in consecutive records.
    chain_active: bool,
    /// No buffer is begun unless all of it lies below this LSN
    /// ([`Ring::set_append_limit`]; unlimited unless set).
    append_limit: Lsn,
    /// Whether [`Ring::set_append_limit`] was ever called.
    limit_set: bool,
    /// Chains not yet known durable: first part's LSN → last part's LSN
    /// (what a commit of the entry must force).
    chains: std::collections::BTreeMap<Lsn, Lsn>,
}

impl<E: Clone> RingState<E> {
    fn poison(&self) -> Result<(), Error<E>> {
        match &self.poisoned {
            Some(e) => Err(Error::Poisoned(e.clone())),
            None => Ok(()),
        }
    }

    /// The end of everything appended so far.
    fn appended_end(&self) -> Lsn {
        let h = &self.slots[self.active];
        if h.state == BufState::Active && h.used > 0 {
            h.lsn.plus((HEADER_SIZE + h.used) as u64)
        } else {
            self.next_lsn
        }
    }

    /// `lsn` was appended: a force or write-out of anything beyond is a
    /// caller's error.
    fn check_appended(&self, lsn: Lsn) -> Result<(), Error<E>> {
        let appended = self.appended_end();
        if lsn >= appended {
            return Err(Error::LsnNotAppended { lsn, appended });
        }
        Ok(())
    }

    /// Indices from the oldest in-flight buffer up to (excluding) `i`.
    fn before(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let n = self.slots.len();
        let count = (i + n - self.oldest) % n;
        (0..count).map(move |k| (self.oldest + k) % n)
    }
}

/// Counters of a ring (relaxed statistics).
#[derive(Debug, Default)]
struct Stats {
    appends: StatCounter,
    entry_bytes: StatCounter,
    switches: StatCounter,
    noiclog_waits: StatCounter,
    writes: StatCounter,
    writes_fua: StatCounter,
    writes_preflush: StatCounter,
    bare_flushes: StatCounter,
    bytes_written: StatCounter,
    padding_bytes: StatCounter,
}

/// A snapshot of a ring's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Entries appended.
    pub appends: u64,
    /// Payload bytes appended (without framing).
    pub entry_bytes: u64,
    /// Buffers switched out of ACTIVE.
    pub switches: u64,
    /// Appends that found no ACTIVE buffer and waited ("noiclog").
    pub noiclog_waits: u64,
    /// Record writes issued.
    pub writes: u64,
    /// Of those, with FUA.
    pub writes_fua: u64,
    /// Of those, with PREFLUSH.
    pub writes_preflush: u64,
    /// Flushes issued with no write (a force found its record written
    /// without FUA).
    pub bare_flushes: u64,
    /// Record bytes written (headers, entries, padding).
    pub bytes_written: u64,
    /// Padding bytes among them.
    pub padding_bytes: u64,
}

struct Inner<D: LogDevice> {
    config: Config,
    device: D,
    state: Mutex<RingState<D::Error>>,
    /// Record bytes of each buffer. Writers copy their entries here holding
    /// only this buffer's lock, never the ring lock; reservations never
    /// overlap, so the lock is only ever contended by writers of the same
    /// buffer for the duration of one copy.
    data: Vec<Mutex<AlignedBuf>>,
    /// Signalled when a buffer becomes ACTIVE again (noiclog waiters).
    space: Condvar,
    /// Signalled on every completion, flush, flag change or poisoning.
    progress: Condvar,
    stats: Stats,
    /// `durable_lsn`, published for readers that take no lock (set under
    /// the state lock whenever it moves).
    durable: AtomicU64,
    /// The highest end of an entry reserved so far (a lower bound of what
    /// is appended once `append` returned), for lock-free checks.
    reserved_end: AtomicU64,
    /// `chains.len()`, so [`Ring::commit_point`] takes no lock when no
    /// chain is pending.
    open_chains: AtomicU64,
    /// Told the durable LSN each time it advances ([`Ring::set_durable_hook`]).
    on_durable: OnceLock<DurableHook>,
    /// The highest durable LSN the hook has been told.
    announced: AtomicU64,
}

/// What [`Ring::set_durable_hook`] registers: called with the new durable
/// LSN, outside every ring lock.
pub type DurableHook = Box<dyn Fn(Lsn) + Send + Sync>;

/// Tells the ring's durable hook about any advance when a public call
/// returns (by every path, errors included): declared first in each entry
/// point, it drops after the ring lock guard, so the hook never runs under
/// the ring lock.
struct Announce<'a, D: LogDevice>(&'a Ring<D>);

impl<D: LogDevice> Drop for Announce<'_, D> {
    fn drop(&mut self) {
        self.0.announce();
    }
}

/// Where a reservation landed: (buffer, payload offset, LSN).
type Reservation = (usize, usize, Lsn);

/// The ring's state, locked.
type StateGuard<'a, D> = MutexGuard<'a, RingState<<D as LogDevice>::Error>>;

/// An XFS-style ring of in-core log buffers. Shared between threads by
/// reference (it is `Sync`); see the crate docs for the protocol.
pub struct Ring<D: LogDevice> {
    inner: Arc<Inner<D>>,
}

impl<D: LogDevice> std::fmt::Debug for Ring<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl<D: LogDevice> Ring<D> {
    /// A ring writing to `device`, whose first record will start at `start`
    /// (the end of the log after recovery; aligned) with `tail` as the log
    /// tail. Everything below `start` is taken to be durable.
    pub fn new(
        config: Config,
        device: D,
        start: Lsn,
        tail: Lsn,
    ) -> Result<Self, crate::ConfigError> {
        config.validate()?;
        let slots = (0..config.logbufs).map(|_| Slot::new()).collect();
        let data = (0..config.logbufs)
            .map(|_| Mutex::new(AlignedBuf::zeroed(config.logbsize)))
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                device,
                state: Mutex::new(RingState {
                    slots,
                    active: 0,
                    oldest: 0,
                    next_lsn: start,
                    written_lsn: start,
                    durable_lsn: start,
                    tail_lsn: tail,
                    flushed_tail: tail,
                    tail_moved: false,
                    flushing: false,
                    poisoned: None,
                    progress_waiters: 0,
                    space_waiters: 0,
                    chain_active: false,
                    append_limit: Lsn(u64::MAX),
                    limit_set: false,
                    chains: std::collections::BTreeMap::new(),
                }),
                data,
                space: Condvar::new(),
                progress: Condvar::new(),
                stats: Stats::default(),
                durable: AtomicU64::new(start.0),
                reserved_end: AtomicU64::new(start.0),
                open_chains: AtomicU64::new(0),
                on_durable: OnceLock::new(),
                announced: AtomicU64::new(start.0),
            }),
        })
    }

    /// Registers `hook`, called with the new durable LSN whenever it
    /// advances: once the in-order completion path or a bare flush moved
    /// it, by the thread whose call moved it, before that call returns and
    /// outside every ring lock (so the hook may wake waiters that take
    /// their own locks, or call back into the ring). Calls may overlap and
    /// arrive out of order across threads (each carries the durable LSN it
    /// saw); every advance is covered by a call with an LSN at least as
    /// high, made after the advance is visible through
    /// [`Ring::durable_lsn`]. One hook per ring: a second is handed back.
    pub fn set_durable_hook(&self, hook: DurableHook) -> Result<(), DurableHook> {
        self.inner.on_durable.set(hook)
    }

    /// Calls the durable hook if the durable LSN passed what it was last
    /// told. One atomic load when nothing advanced.
    fn announce(&self) {
        let Some(hook) = self.inner.on_durable.get() else {
            return;
        };
        let durable = self.inner.durable.load(Ordering::Acquire);
        if durable <= self.inner.announced.load(Ordering::Acquire) {
            return;
        }
        if self.inner.announced.fetch_max(durable, Ordering::AcqRel) < durable {
            hook(Lsn(durable));
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The device the ring writes to (for its owner's statistics and
    /// registrations; writing to it behind the ring's back breaks the
    /// ring's ordering).
    pub fn device(&self) -> &D {
        &self.inner.device
    }

    /// Appends one entry and returns its LSN. The entry is in memory only:
    /// [`Ring::force`] makes it durable.
    ///
    /// Reserves space in the ACTIVE buffer (switching a full one out and, if
    /// no buffer is ACTIVE, waiting for one: a "noiclog" wait), copies the
    /// entry without the ring lock, and releases the reservation; the last
    /// writer to release a switched-out buffer writes it.
    ///
    /// An entry larger than [`Config::max_entry_size`] (up to
    /// [`crate::MAX_RECORD_SIZE`]) is written as a chain of parts over
    /// consecutive buffers ([`crate::format`]); other appends wait while a
    /// chain is being laid out. So is an entry that does not fit the room
    /// left in the ACTIVE buffer when that room is at least
    /// [`Config::split_min`]: split over this buffer and the next. Its LSN
    /// is its first part's; force it through [`Ring::commit_point`].
    pub fn append(&self, payload: &[u8]) -> Result<Lsn, Error<D::Error>> {
        // A buffer switch may write with FUA (EveryWrite, the window bound).
        let _announce = Announce(self);
        if payload.len() > crate::config::MAX_RECORD_SIZE {
            return Err(Error::EntryTooLarge {
                len: payload.len(),
                max: crate::config::MAX_RECORD_SIZE,
            });
        }
        if payload.len() > self.inner.config.max_entry_size() {
            return self.append_chain(payload);
        }
        let Some((idx, offset, lsn)) = self.reserve(ENTRY_HEADER_SIZE + payload.len())? else {
            // It straddles the ACTIVE buffer's end, and the room left is
            // worth filling: split it over this buffer and the next.
            return self.append_chain(payload);
        };
        self.copy_entry(idx, offset, payload);
        self.release(idx)?;
        let s = &self.inner.stats;
        s.appends.incr();
        s.entry_bytes.add(payload.len() as u64);
        Ok(lsn)
    }

    /// The LSN a commit of the entry at `lsn` must force: `lsn` itself, or,
    /// for an entry appended as a chain, its last part (forcing a part
    /// forces everything before it). Takes no lock unless a chain is
    /// pending.
    pub fn commit_point(&self, lsn: Lsn) -> Lsn {
        if self.inner.open_chains.load(Ordering::Acquire) == 0 {
            return lsn;
        }
        let mut st = self.inner.state.lock();
        let Some(&last) = st.chains.get(&lsn) else {
            return lsn;
        };
        if last < st.durable_lsn {
            st.chains.remove(&lsn);
            self.inner
                .open_chains
                .store(st.chains.len() as u64, Ordering::Release);
        }
        last
    }

    fn copy_entry(&self, idx: usize, offset: usize, payload: &[u8]) {
        let mut buf = self.inner.data[idx].lock();
        let at = HEADER_SIZE + offset;
        buf[at..at + ENTRY_HEADER_SIZE].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        buf[at + ENTRY_HEADER_SIZE..at + ENTRY_HEADER_SIZE + payload.len()]
            .copy_from_slice(payload);
    }

    /// Returns when the entry at `lsn` (and everything before it) is
    /// durable: the synchronous log force.
    ///
    /// Pushes the buffer holding `lsn` out of ACTIVE with NEED_FUA, waits
    /// for it; if the record was already written without FUA, issues a cache
    /// flush instead.
    pub fn force(&self, lsn: Lsn) -> Result<(), Error<D::Error>> {
        self.force_inner(lsn, true)
    }

    /// Starts making `lsn` durable without waiting for completions: the
    /// buffer holding it is switched out with NEED_FUA and, if nobody holds
    /// a reference, written by this thread before returning (the device
    /// interface is synchronous). Earlier records' completions are not
    /// waited for.
    pub fn start_force(&self, lsn: Lsn) -> Result<(), Error<D::Error>> {
        self.force_inner(lsn, false)
    }

    /// Returns when the record holding `lsn` (and every record before it)
    /// has been written, durable or not: the buffer holding it is switched
    /// out and written with only the flags the policy or an earlier force
    /// put on it — no NEED_FUA of its own. A later [`Ring::force`] of `lsn`
    /// then finds it written and issues a cache flush, which covers every
    /// record written before the flush began and is shared: one runs at a
    /// time, and a force arriving meanwhile waits for it and starts (or
    /// joins) the next. Splitting a commit in two this way lets the next
    /// group's write go to the device while this group's flush runs.
    pub fn write_out(&self, lsn: Lsn) -> Result<(), Error<D::Error>> {
        let _announce = Announce(self);
        let align = self.inner.config.alignment;
        let mut st = self.inner.state.lock();
        loop {
            st.poison()?;
            // (Durable implies written: durable_lsn never passes written_lsn.)
            if lsn < st.written_lsn {
                return Ok(());
            }
            st.check_appended(lsn)?;
            let i = Self::buffer_holding(&st, lsn, align);
            if st.slots[i].state == BufState::Active && self.switch(&mut st) {
                st = self.submit(st, i)?;
                continue;
            }
            // Written by the last writer to release it, or in flight.
            st = self.wait_progress(st);
        }
    }

    /// Forces everything appended so far and returns the durable LSN.
    pub fn force_all(&self) -> Result<Lsn, Error<D::Error>> {
        let end = self.inner.state.lock().appended_end();
        if end > self.durable_lsn() {
            self.force(Lsn(end.0 - 1))?;
        }
        Ok(self.durable_lsn())
    }

    /// Every record below this LSN is durable.
    pub fn durable_lsn(&self) -> Lsn {
        Lsn(self.inner.durable.load(Ordering::Acquire))
    }

    /// [`Ring::durable_lsn`], read under the ring's lock: ordered with
    /// every completion, for a waiter that registered itself and must not
    /// miss the wakeup of a completion racing its registration.
    pub fn durable_lsn_locked(&self) -> Lsn {
        self.inner.state.lock().durable_lsn
    }

    /// A lower bound of [`Ring::appended_lsn`] that takes no lock: every
    /// entry whose `append` returned ends at or below it.
    pub fn appended_lower_bound(&self) -> Lsn {
        Lsn(self.inner.reserved_end.load(Ordering::Acquire))
    }

    /// Raises the append limit to `limit`: from now on no append lays out
    /// bytes at or past it — an append whose buffer (or, for a chain, whose
    /// whole extent, bounded from above) would reach past it fails with
    /// [`Error::NoRoom`] before anything is reserved. The owner of the log
    /// space keeps the limit at the end of what the device can take (the
    /// journal: the last segment file ready), so a log write never needs
    /// space that is not there. Only ever raised; unlimited until first
    /// set, which may lower it.
    pub fn set_append_limit(&self, limit: Lsn) {
        let mut st = self.inner.state.lock();
        if !std::mem::replace(&mut st.limit_set, true) || limit > st.append_limit {
            st.append_limit = limit;
        }
    }

    /// The end of everything appended so far.
    pub fn appended_lsn(&self) -> Lsn {
        self.inner.state.lock().appended_end()
    }

    /// The caller moved the log tail (a checkpoint): the next durable log
    /// write carries PREFLUSH, so that whatever the caller made stable
    /// before moving the tail is flushed before a record naming the new tail
    /// can be durable.
    pub fn note_tail_moved(&self, tail: Lsn) {
        let mut st = self.inner.state.lock();
        if tail > st.tail_lsn {
            st.tail_lsn = tail;
            st.tail_moved = true;
        }
    }

    /// The caller moved the tail to `tail` and made everything it depends
    /// on stable itself (there was no log write to carry the flush, or a
    /// bare flush made the log durable): the tail is recorded as flushed,
    /// and unless it has moved past `tail` since, no PREFLUSH is owed.
    pub fn note_tail_flushed(&self, tail: Lsn) {
        let mut st = self.inner.state.lock();
        if tail > st.tail_lsn {
            st.tail_lsn = tail;
        }
        if tail > st.flushed_tail {
            st.flushed_tail = tail;
        }
        if st.flushed_tail >= st.tail_lsn {
            st.tail_moved = false;
        }
    }

    /// Whether a tail move is still waiting for its flushed log write.
    pub fn tail_move_pending(&self) -> bool {
        self.inner.state.lock().tail_moved
    }

    /// The first device error, if the ring is poisoned.
    pub fn poisoned(&self) -> Option<D::Error> {
        self.inner.state.lock().poisoned.clone()
    }

    /// The states of the buffers, in ring order from index 0 (for tests and
    /// inspection).
    pub fn buffer_states(&self) -> Vec<BufState> {
        self.inner
            .state
            .lock()
            .slots
            .iter()
            .map(|s| s.state)
            .collect()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RingStats {
        let s = &self.inner.stats;
        RingStats {
            appends: s.appends.get(),
            entry_bytes: s.entry_bytes.get(),
            switches: s.switches.get(),
            noiclog_waits: s.noiclog_waits.get(),
            writes: s.writes.get(),
            writes_fua: s.writes_fua.get(),
            writes_preflush: s.writes_preflush.get(),
            bare_flushes: s.bare_flushes.get(),
            bytes_written: s.bytes_written.get(),
            padding_bytes: s.padding_bytes.get(),
        }
    }
}

/// The memory alignment of every log buffer: a device may write buffers
/// with `O_DIRECT`, which needs the buffer's address aligned (to the
/// logical block size, at most a page on the filesystems that allow it).
pub const BUFFER_ALIGN: usize = AlignedBuf::ALIGN;
