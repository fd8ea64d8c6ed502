//! The ring of in-core log buffers and its state machine.

use crate::format::{self, ENTRY_HEADER_SIZE, HEADER_SIZE};
use crate::{Config, Error, FlushPolicy, IoFlags, LogDevice, Lsn};
use journal_sync::atomic::{AtomicU64, Ordering};
use journal_sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, StatCounter};

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
    /// Free, or taking writes if it is the head of the ring.
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
    head: usize,
    /// The lowest-LSN buffer not yet completed and processed.
    oldest: usize,
    /// Where the next record starts: the head's LSN once it takes data.
    next_lsn: Lsn,
    /// Every record below has completed its write (durable or not).
    written_lsn: Lsn,
    /// Every record below is durable.
    stable_lsn: Lsn,
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
        let h = &self.slots[self.head];
        if h.state == BufState::Active && h.used > 0 {
            h.lsn.plus((HEADER_SIZE + h.used) as u64)
        } else {
            self.next_lsn
        }
    }

    /// `lsn` was appended: a force or write-out of anything beyond is a
    /// caller's error.
    fn check_appended(&self, lsn: Lsn) -> Result<(), Error<E>> {
        let head = self.appended_end();
        if lsn >= head {
            return Err(Error::LsnBeyondHead { lsn, head });
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
    /// `stable_lsn`, published for readers that take no lock (set under
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
                    head: 0,
                    oldest: 0,
                    next_lsn: start,
                    written_lsn: start,
                    stable_lsn: start,
                    tail_lsn: tail,
                    flushed_tail: tail,
                    tail_moved: false,
                    flushing: false,
                    poisoned: None,
                    progress_waiters: 0,
                    space_waiters: 0,
                    chain_active: false,
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
        if last < st.stable_lsn {
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

    /// Appends an entry as a chain of parts over consecutive buffers: one
    /// too large for a buffer, or one that straddles the ACTIVE buffer's
    /// end with room worth filling there ([`Config::split_min`]). The first
    /// part ends the ACTIVE buffer (flagged CONTINUES), each later part
    /// starts the next one (CONTINUED; a middle part fills it alone), and
    /// the last part leaves its buffer ACTIVE for the appends that follow.
    /// Other appends wait while the parts are laid out (`chain_active`), so
    /// nothing interleaves with them. If the entry turns out to fit where
    /// the layout starts, it is written whole, as a plain entry.
    fn append_chain(&self, payload: &[u8]) -> Result<Lsn, Error<D::Error>> {
        {
            let mut st = self.inner.state.lock();
            loop {
                st.poison()?;
                if !st.chain_active {
                    break;
                }
                st = self.wait_space(st);
            }
            st.chain_active = true;
        }
        let mut laying_out = true;
        let result = self.chain_parts(payload, &mut laying_out);
        if laying_out {
            // Failed before the last part was reserved: end the layout so
            // nobody waits for it (the ring is poisoned; they will see it).
            let mut st = self.inner.state.lock();
            st.chain_active = false;
            self.wake(&st, true);
        }
        let (first, last) = result?;
        if first != last {
            let mut st = self.inner.state.lock();
            let stable = st.stable_lsn;
            st.chains.retain(|_, l| *l >= stable);
            st.chains.insert(first, last);
            self.inner
                .open_chains
                .store(st.chains.len() as u64, Ordering::Release);
        }
        let s = &self.inner.stats;
        s.appends.incr();
        s.entry_bytes.add(payload.len() as u64);
        Ok(first)
    }

    /// Lays out and copies the parts of a chain; returns the LSNs of the
    /// first and last parts. A part's reservation is released (which may
    /// write its buffer) only once the next part is reserved, and the
    /// layout ends (`chain_active` cleared, `*laying_out` = false) as soon
    /// as the last part is reserved: an entry split over two buffers keeps
    /// the other appends waiting for no device write.
    ///
    /// Holding the previous part's buffer (switched out, so WANT_SYNC)
    /// while waiting for the next one to become ACTIVE cannot deadlock: the
    /// next buffer is the oldest in the ring, whose write and completion
    /// wait for nothing later (and there are at least two buffers).
    fn chain_parts(
        &self,
        payload: &[u8],
        laying_out: &mut bool,
    ) -> Result<(Lsn, Lsn), Error<D::Error>> {
        let cfg = &self.inner.config;
        let cap = cfg.max_payload();
        // The least room the first part takes: any payload byte for an
        // entry larger than a buffer; for one that fits a buffer, what
        // makes a split worth it (else it starts the next buffer whole).
        let first_min = if payload.len() > cfg.max_entry_size() {
            ENTRY_HEADER_SIZE + 1
        } else {
            cfg.split_min()
        };
        let mut rest = payload;
        let mut first: Option<Lsn> = None;
        // The reserved part not yet copied and released: (buffer, offset, bytes).
        let mut held: Option<(usize, usize, &[u8])> = None;
        loop {
            let (idx, offset, lsn, len, more) = {
                let mut st = self.inner.state.lock();
                let mut waited = false;
                loop {
                    let h;
                    (st, h) = self.active_head(st, true, &mut waited)?;
                    let slot = &mut st.slots[h];
                    let room = cap - slot.used;
                    let fits = ENTRY_HEADER_SIZE + rest.len() <= room;
                    if !fits && (room <= ENTRY_HEADER_SIZE || (first.is_none() && room < first_min))
                    {
                        // Not worth starting here: start in the next buffer.
                        // (Only a first part gets here, holding nothing.)
                        debug_assert!(held.is_none());
                        if self.switch(&mut st) {
                            st = self.submit(st, h)?;
                        }
                        continue;
                    }
                    // Every part after the first starts its buffer: nobody
                    // else appends while the chain is laid out, and the
                    // previous part switched its buffer out.
                    debug_assert!(first.is_none() || slot.used == 0);
                    let len = rest.len().min(room - ENTRY_HEADER_SIZE);
                    let offset = slot.used;
                    slot.used += ENTRY_HEADER_SIZE + len;
                    slot.entries += 1;
                    slot.refs += 1;
                    if first.is_some() {
                        slot.chain |= format::CONTINUED;
                    }
                    let lsn = slot.lsn.plus((HEADER_SIZE + offset) as u64);
                    let more = len < rest.len();
                    if more {
                        slot.chain |= format::CONTINUES;
                        // Nothing may follow this part in its record: switch
                        // it out now (we hold a reference, so our release
                        // writes it).
                        let submit = self.switch(&mut st);
                        debug_assert!(!submit);
                    } else {
                        // The last part is in place: appends may go on
                        // behind it while the parts are copied.
                        st.chain_active = false;
                        *laying_out = false;
                        if st.space_waiters > 0 {
                            self.inner.space.notify_all();
                        }
                    }
                    self.inner
                        .reserved_end
                        .fetch_max(lsn.0 + (ENTRY_HEADER_SIZE + len) as u64, Ordering::AcqRel);
                    break (h, offset, lsn, len, more);
                }
            };
            let first = *first.get_or_insert(lsn);
            let (part, after) = rest.split_at(len);
            rest = after;
            if !more {
                self.copy_entry(idx, offset, part);
                match held.take() {
                    Some((i, o, prev)) => {
                        self.copy_entry(i, o, prev);
                        self.release_pair(i, idx)?;
                    }
                    None => self.release(idx)?,
                }
                return Ok((first, lsn));
            }
            if let Some((i, o, prev)) = held.take() {
                self.copy_entry(i, o, prev);
                self.release(i)?;
            }
            held = Some((idx, offset, part));
        }
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
    pub fn force_async(&self, lsn: Lsn) -> Result<(), Error<D::Error>> {
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
            // (Durable implies written: stable_lsn never passes written_lsn.)
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
        self.inner.state.lock().stable_lsn
    }

    /// A lower bound of [`Ring::appended_lsn`] that takes no lock: every
    /// entry whose `append` returned ends at or below it.
    pub fn appended_lower_bound(&self) -> Lsn {
        Lsn(self.inner.reserved_end.load(Ordering::Acquire))
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
    /// on stable itself (there was no log write to carry the flush): the
    /// tail is recorded as flushed and no PREFLUSH is owed.
    pub fn note_tail_flushed(&self, tail: Lsn) {
        let mut st = self.inner.state.lock();
        if tail > st.tail_lsn {
            st.tail_lsn = tail;
        }
        if tail > st.flushed_tail {
            st.flushed_tail = tail;
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

    // ---- waiting and waking -------------------------------------------------

    fn wait_progress<'a>(
        &'a self,
        mut st: MutexGuard<'a, RingState<D::Error>>,
    ) -> MutexGuard<'a, RingState<D::Error>> {
        st.progress_waiters += 1;
        let mut st = self.inner.progress.wait(st);
        st.progress_waiters -= 1;
        st
    }

    fn wait_space<'a>(
        &'a self,
        mut st: MutexGuard<'a, RingState<D::Error>>,
    ) -> MutexGuard<'a, RingState<D::Error>> {
        st.space_waiters += 1;
        let mut st = self.inner.space.wait(st);
        st.space_waiters -= 1;
        st
    }

    /// Wakes whoever waits for progress (and for space, if `space`).
    fn wake(&self, st: &RingState<D::Error>, space: bool) {
        if st.progress_waiters > 0 {
            self.inner.progress.notify_all();
        }
        if space && st.space_waiters > 0 {
            self.inner.space.notify_all();
        }
    }

    // ---- reservation and release -------------------------------------

    /// Waits until the head buffer is ACTIVE (a "noiclog" wait, counted
    /// once per reservation through `waited`) and, unless the caller is the
    /// one laying out a chain (`chain_owner`), until no chain is being laid
    /// out; returns the head's index, its LSN set if it is empty.
    fn active_head<'a>(
        &'a self,
        mut st: MutexGuard<'a, RingState<D::Error>>,
        chain_owner: bool,
        waited: &mut bool,
    ) -> Result<(StateGuard<'a, D>, usize), Error<D::Error>> {
        loop {
            st.poison()?;
            if st.chain_active && !chain_owner {
                // A chain is being laid out: its parts must be consecutive.
                st = self.wait_space(st);
                continue;
            }
            let h = st.head;
            if st.slots[h].state != BufState::Active {
                if !std::mem::replace(waited, true) {
                    self.inner.stats.noiclog_waits.incr();
                }
                st = self.wait_space(st);
                continue;
            }
            let next = st.next_lsn;
            let slot = &mut st.slots[h];
            if slot.used == 0 {
                slot.lsn = next;
            }
            return Ok((st, h));
        }
    }

    /// Reserves `total` framed bytes; returns (buffer, payload offset, LSN),
    /// or `None` when the entry does not fit the ACTIVE buffer and the room
    /// left there is at least [`Config::split_min`]: the caller then lays it
    /// out as a chain split over this buffer and the next.
    fn reserve(&self, total: usize) -> Result<Option<Reservation>, Error<D::Error>> {
        let cap = self.inner.config.max_payload();
        let split_min = self.inner.config.split_min();
        let mut st = self.inner.state.lock();
        let mut waited = false;
        loop {
            let h;
            (st, h) = self.active_head(st, false, &mut waited)?;
            let slot = &mut st.slots[h];
            if slot.used + total <= cap {
                let offset = slot.used;
                slot.used += total;
                slot.entries += 1;
                slot.refs += 1;
                let lsn = slot.lsn.plus((HEADER_SIZE + offset) as u64);
                self.inner
                    .reserved_end
                    .fetch_max(lsn.0 + total as u64, Ordering::AcqRel);
                return Ok(Some((h, offset, lsn)));
            }
            // Does not fit (and the buffer is not empty: `total <= cap`).
            if cap - slot.used >= split_min {
                return Ok(None);
            }
            if self.switch(&mut st) {
                st = self.submit(st, h)?;
            }
        }
    }

    /// Drops a reservation; the last one out of a WANT_SYNC buffer writes it.
    fn release(&self, idx: usize) -> Result<(), Error<D::Error>> {
        let mut st = self.inner.state.lock();
        if Self::drop_ref(&mut st, idx) {
            drop(self.submit(st, idx)?);
        }
        Ok(())
    }

    /// Drops one reference to buffer `i`; returns whether that was the
    /// last one out of a switched-out buffer, so the caller must write it.
    fn drop_ref(st: &mut RingState<D::Error>, i: usize) -> bool {
        let slot = &mut st.slots[i];
        slot.refs -= 1;
        slot.refs == 0 && slot.state == BufState::WantSync
    }

    /// Drops the reservations of a chain's last two parts, `earlier` (whose
    /// buffer is switched out) and `later`, at once, then writes whichever
    /// this made the last one out, the earlier first: releasing them one by
    /// one would hold `later` through `earlier`'s write, so a full `later`
    /// could not be written meanwhile (and releasing `later` first could
    /// wait, in a PREFLUSH write, for `earlier`, which this thread holds).
    fn release_pair(&self, earlier: usize, later: usize) -> Result<(), Error<D::Error>> {
        let mut st = self.inner.state.lock();
        let write_earlier = Self::drop_ref(&mut st, earlier);
        let write_later = Self::drop_ref(&mut st, later);
        if write_earlier {
            st = self.submit(st, earlier)?;
        }
        if write_later {
            st = self.submit(st, later)?;
        }
        drop(st);
        Ok(())
    }

    /// ACTIVE → WANT_SYNC for the head buffer; the next buffer becomes the
    /// head. Returns whether the caller must submit it (no references).
    fn switch(&self, st: &mut RingState<D::Error>) -> bool {
        let h = st.head;
        let align = self.inner.config.alignment;
        let slot = &mut st.slots[h];
        debug_assert_eq!(slot.state, BufState::Active);
        debug_assert!(slot.used > 0);
        slot.state = BufState::WantSync;
        let next = slot.lsn.plus(slot.record_size(align));
        let submit = slot.refs == 0;
        st.next_lsn = next;
        st.head = (h + 1) % st.slots.len();
        self.inner.stats.switches.incr();
        submit
    }

    // ---- submission and completion -------------------------------------

    /// Whether a write of buffer `i` must be preceded by a cache flush:
    /// bytes below it were written without FUA and are not yet durable.
    fn earlier_not_covered(&self, st: &RingState<D::Error>, i: usize) -> bool {
        st.stable_lsn < st.written_lsn || st.before(i).any(|j| !st.slots[j].fua())
    }

    /// WANT_SYNC → SYNCING: decides the flags, writes the record outside the
    /// lock, then processes completions. Returns the relocked state.
    fn submit<'a>(
        &'a self,
        mut st: MutexGuard<'a, RingState<D::Error>>,
        i: usize,
    ) -> Result<MutexGuard<'a, RingState<D::Error>>, Error<D::Error>> {
        let cfg = &self.inner.config;
        // The in-flight window recovery allows for: no record may be
        // written more than this far beyond the durable LSN.
        let window = cfg.inflight_window();
        let flags = loop {
            st.poison()?;
            let mut flags = st.slots[i].need;
            let end = st.slots[i].lsn.plus(st.slots[i].record_size(cfg.alignment));
            if end.0 > st.stable_lsn.0 + window {
                // A plain write here could outlive, in a crash, records
                // before it that are not durable, farther out than recovery
                // takes for in-flight leftovers: it goes out FUA, which makes
                // everything before it durable too.
                flags |= IoFlags::FUA;
            }
            if cfg.flush_policy == FlushPolicy::EveryWrite {
                flags = IoFlags::PREFLUSH | IoFlags::FUA;
            } else if flags.contains(IoFlags::FUA)
                && (st.tail_moved || self.earlier_not_covered(&st, i))
            {
                flags |= IoFlags::PREFLUSH;
            }
            // A cache flush covers only completed writes: before a PREFLUSH
            // write, wait until every earlier write without FUA completed.
            // (A force may add NEED_FUA meanwhile: decide again after.)
            let blocked = flags.contains(IoFlags::PREFLUSH)
                && st.before(i).any(|j| {
                    let s = &st.slots[j];
                    s.state != BufState::DoneSync && !s.fua()
                });
            if !blocked {
                break flags;
            }
            st = self.wait_progress(st);
        };
        if st.tail_moved && flags.contains(IoFlags::PREFLUSH | IoFlags::FUA) {
            st.tail_moved = false;
            st.flushed_tail = st.tail_lsn;
        }
        let tail = if flags.contains(IoFlags::FUA) {
            st.tail_lsn
        } else {
            st.flushed_tail
        };
        // Every record below this was durable before this one was written:
        // recovery uses the stamp to tell damage from a torn write.
        let durable = st.stable_lsn;
        let slot = &mut st.slots[i];
        let tail = *slot.tail.get_or_insert(tail);
        slot.issued = flags;
        slot.state = BufState::Syncing;
        let (lsn, used, entries, chain) = (slot.lsn, slot.used, slot.entries, slot.chain);
        drop(st);

        let size = format::record_size(used, cfg.alignment) as usize;
        let result = {
            let mut buf = self.inner.data[i].lock();
            let (head, rest) = buf.split_at_mut(HEADER_SIZE);
            format::encode_header(
                head,
                lsn,
                tail,
                durable,
                flags,
                chain,
                entries,
                &rest[..used],
            );
            buf[HEADER_SIZE + used..size].fill(0);
            self.inner.device.write(lsn, &buf[..size], flags)
        };
        let s = &self.inner.stats;
        s.writes.incr();
        s.bytes_written.add(size as u64);
        s.padding_bytes.add((size - HEADER_SIZE - used) as u64);
        if flags.contains(IoFlags::FUA) {
            s.writes_fua.incr();
        }
        if flags.contains(IoFlags::PREFLUSH) {
            s.writes_preflush.incr();
        }

        let mut st = self.inner.state.lock();
        match result {
            Ok(()) => {
                st.slots[i].state = BufState::DoneSync;
                self.process_completions(&mut st);
            }
            Err(e) => {
                if st.poisoned.is_none() {
                    st.poisoned = Some(e);
                }
            }
        }
        self.wake(&st, true);
        st.poison()?;
        Ok(st)
    }

    /// DONE_SYNC → (callbacks) → DIRTY → ACTIVE, strictly in LSN order: a
    /// buffer whose write finished early waits for every lower one.
    fn process_completions(&self, st: &mut RingState<D::Error>) {
        let align = self.inner.config.alignment;
        let n = st.slots.len();
        loop {
            let i = st.oldest;
            let slot = &st.slots[i];
            if slot.state != BufState::DoneSync {
                break;
            }
            let (lsn, end, issued) = (
                slot.lsn,
                slot.lsn.plus(slot.record_size(align)),
                slot.issued,
            );
            if issued.contains(IoFlags::PREFLUSH) {
                // Every earlier write had completed before the flush.
                st.stable_lsn = st.stable_lsn.max(lsn);
                self.inner.durable.store(st.stable_lsn.0, Ordering::Release);
            }
            st.written_lsn = end;
            if issued.contains(IoFlags::FUA) && st.stable_lsn == lsn {
                st.stable_lsn = end;
                self.inner.durable.store(end.0, Ordering::Release);
            }
            st.slots[i].reset();
            st.oldest = (i + 1) % n;
        }
    }

    // ---- forces ---------------------------------------------------------

    fn force_inner(&self, lsn: Lsn, wait: bool) -> Result<(), Error<D::Error>> {
        let _announce = Announce(self);
        let align = self.inner.config.alignment;
        let mut st = self.inner.state.lock();
        loop {
            st.poison()?;
            if lsn < st.stable_lsn {
                return Ok(());
            }
            st.check_appended(lsn)?;
            if lsn < st.written_lsn {
                // Written without FUA and not flushed since: a bare flush.
                if st.flushing {
                    if !wait {
                        return Ok(());
                    }
                    st = self.wait_progress(st);
                    continue;
                }
                st.flushing = true;
                let covered = st.written_lsn;
                drop(st);
                let result = self.inner.device.flush();
                self.inner.stats.bare_flushes.incr();
                st = self.inner.state.lock();
                st.flushing = false;
                match result {
                    Ok(()) => {
                        st.stable_lsn = st.stable_lsn.max(covered);
                        self.inner.durable.store(st.stable_lsn.0, Ordering::Release);
                    }
                    Err(e) => {
                        if st.poisoned.is_none() {
                            st.poisoned = Some(e);
                        }
                    }
                }
                self.wake(&st, false);
                continue;
            }
            let i = Self::buffer_holding(&st, lsn, align);
            match st.slots[i].state {
                BufState::Active => {
                    self.mark_forced(&mut st, i);
                    if self.switch(&mut st) {
                        st = self.submit(st, i)?;
                    }
                    if !wait {
                        return Ok(());
                    }
                }
                BufState::WantSync => {
                    self.mark_forced(&mut st, i);
                    if !wait {
                        return Ok(());
                    }
                    st = self.wait_progress(st);
                }
                BufState::Syncing | BufState::DoneSync => {
                    if !wait {
                        return Ok(());
                    }
                    st = self.wait_progress(st);
                }
            }
        }
    }

    /// The buffer holding `lsn`, which is below the head and at or above
    /// the written LSN (so in a buffer not yet written, or being written).
    fn buffer_holding(st: &RingState<D::Error>, lsn: Lsn, align: u64) -> usize {
        (0..st.slots.len())
            .find(|&j| {
                let s = &st.slots[j];
                (s.state != BufState::Active || j == st.head) && s.holds(lsn, align)
            })
            .unwrap_or_else(|| {
                unreachable!("LSN {lsn} below the head and above the written LSN is in a buffer")
            })
    }

    /// Sets NEED_FUA on buffer `i` and stamps the tail into it (the first
    /// FUA release stamps it; it is never overwritten).
    fn mark_forced(&self, st: &mut RingState<D::Error>, i: usize) {
        let tail = st.tail_lsn;
        let slot = &mut st.slots[i];
        slot.need |= IoFlags::FUA;
        slot.tail.get_or_insert(tail);
    }
}

/// The memory alignment of every log buffer: a device may write buffers
/// with `O_DIRECT`, which needs the buffer's address aligned (to the
/// logical block size, at most a page on the filesystems that allow it).
pub const BUFFER_ALIGN: usize = 4096;

/// A zeroed byte buffer whose first byte sits at a multiple of
/// [`BUFFER_ALIGN`] in memory: a `Vec` with room to spare, viewed from its
/// first aligned byte (safe code; the heap block never moves, since the
/// `Vec` never grows).
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn zeroed(len: usize) -> Self {
        let raw = vec![0u8; len + BUFFER_ALIGN];
        let start = (BUFFER_ALIGN - raw.as_ptr() as usize % BUFFER_ALIGN) % BUFFER_ALIGN;
        Self { raw, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}
