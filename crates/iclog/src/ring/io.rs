//! The ring's machinery: waiting and waking, reservation and release,
//! submission with its flag decisions, in-order completion, and forces.

use super::*;

impl<D: LogDevice> Ring<D> {
    // ---- waiting and waking -------------------------------------------------

    pub(super) fn wait_progress<'a>(
        &'a self,
        mut st: MutexGuard<'a, RingState<D::Error>>,
    ) -> MutexGuard<'a, RingState<D::Error>> {
        st.progress_waiters += 1;
        let mut st = self.inner.progress.wait(st);
        st.progress_waiters -= 1;
        st
    }

    pub(super) fn wait_space<'a>(
        &'a self,
        mut st: MutexGuard<'a, RingState<D::Error>>,
    ) -> MutexGuard<'a, RingState<D::Error>> {
        st.space_waiters += 1;
        let mut st = self.inner.space.wait(st);
        st.space_waiters -= 1;
        st
    }

    /// Wakes whoever waits for progress (and for space, if `space`).
    pub(super) fn wake(&self, st: &RingState<D::Error>, space: bool) {
        if st.progress_waiters > 0 {
            self.inner.progress.notify_all();
        }
        if space && st.space_waiters > 0 {
            self.inner.space.notify_all();
        }
    }

    // ---- reservation and release -------------------------------------

    /// Waits until the active buffer is ACTIVE (a "noiclog" wait, counted
    /// once per reservation through `waited`) and, unless the caller is the
    /// one laying out a chain (`chain_owner`), until no chain is being laid
    /// out; returns the active buffer's index, its LSN set if it is empty.
    pub(super) fn active_buffer<'a>(
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
            let h = st.active;
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
    pub(super) fn reserve(&self, total: usize) -> Result<Option<Reservation>, Error<D::Error>> {
        let cap = self.inner.config.max_payload();
        let split_min = self.inner.config.split_min();
        let mut st = self.inner.state.lock();
        let mut waited = false;
        loop {
            let h;
            (st, h) = self.active_buffer(st, false, &mut waited)?;
            let limit = st.append_limit;
            let slot = &mut st.slots[h];
            // A buffer is begun only if all of it lies below the limit: its
            // entries then never need log space that is not ready.
            let buffer_end = slot.lsn.0.saturating_add(self.inner.config.logbsize as u64);
            if slot.used == 0 && buffer_end > limit.0 {
                return Err(Error::NoRoom {
                    need: Lsn(buffer_end),
                });
            }
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
    pub(super) fn release(&self, idx: usize) -> Result<(), Error<D::Error>> {
        let mut st = self.inner.state.lock();
        if Self::drop_ref(&mut st, idx) {
            drop(self.submit(st, idx)?);
        }
        Ok(())
    }

    /// Drops one reference to buffer `i`; returns whether that was the
    /// last one out of a switched-out buffer, so the caller must write it.
    pub(super) fn drop_ref(st: &mut RingState<D::Error>, i: usize) -> bool {
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
    pub(super) fn release_pair(&self, earlier: usize, later: usize) -> Result<(), Error<D::Error>> {
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

    /// ACTIVE → WANT_SYNC for the active buffer; the next buffer becomes
    /// the active one. Returns whether the caller must submit it (no references).
    pub(super) fn switch(&self, st: &mut RingState<D::Error>) -> bool {
        let h = st.active;
        let align = self.inner.config.alignment;
        let slot = &mut st.slots[h];
        debug_assert_eq!(slot.state, BufState::Active);
        debug_assert!(slot.used > 0);
        slot.state = BufState::WantSync;
        let next = slot.lsn.plus(slot.record_size(align));
        let submit = slot.refs == 0;
        st.next_lsn = next;
        st.active = (h + 1) % st.slots.len();
        self.inner.stats.switches.incr();
        submit
    }

    // ---- submission and completion -------------------------------------

    /// Whether a write of buffer `i` must be preceded by a cache flush:
    /// bytes below it were written without FUA and are not yet durable.
    pub(super) fn earlier_not_covered(&self, st: &RingState<D::Error>, i: usize) -> bool {
        st.durable_lsn < st.written_lsn || st.before(i).any(|j| !st.slots[j].fua())
    }

    /// The flags buffer `i`'s write goes out with, decided under the lock
    /// (waiting, when it needs a PREFLUSH, for every earlier write without
    /// FUA to complete: a cache flush covers only completed writes).
    fn decide_flags<'a>(
        &'a self,
        mut st: MutexGuard<'a, RingState<D::Error>>,
        i: usize,
    ) -> Result<(StateGuard<'a, D>, IoFlags), Error<D::Error>> {
        let cfg = &self.inner.config;
        // The in-flight window recovery allows for: no record may be
        // written more than this far beyond the durable LSN.
        let window = cfg.inflight_window();
        loop {
            st.poison()?;
            let mut flags = st.slots[i].need;
            let end = st.slots[i].lsn.plus(st.slots[i].record_size(cfg.alignment));
            if end.0 > st.durable_lsn.0 + window {
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
                return Ok((st, flags));
            }
            st = self.wait_progress(st);
        }
    }

    /// WANT_SYNC → SYNCING: decides the flags, writes the record outside the
    /// lock, then processes completions. Returns the relocked state.
    pub(super) fn submit<'a>(
        &'a self,
        st: MutexGuard<'a, RingState<D::Error>>,
        i: usize,
    ) -> Result<MutexGuard<'a, RingState<D::Error>>, Error<D::Error>> {
        let (mut st, flags) = self.decide_flags(st, i)?;
        let cfg = &self.inner.config;
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
        let durable = st.durable_lsn;
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
    pub(super) fn process_completions(&self, st: &mut RingState<D::Error>) {
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
                st.durable_lsn = st.durable_lsn.max(lsn);
                self.inner
                    .durable
                    .store(st.durable_lsn.0, Ordering::Release);
            }
            st.written_lsn = end;
            if issued.contains(IoFlags::FUA) && st.durable_lsn == lsn {
                st.durable_lsn = end;
                self.inner.durable.store(end.0, Ordering::Release);
            }
            st.slots[i].reset();
            st.oldest = (i + 1) % n;
        }
    }

    // ---- forces ---------------------------------------------------------

    pub(super) fn force_inner(&self, lsn: Lsn, wait: bool) -> Result<(), Error<D::Error>> {
        let _announce = Announce(self);
        let align = self.inner.config.alignment;
        let mut st = self.inner.state.lock();
        loop {
            st.poison()?;
            if lsn < st.durable_lsn {
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
                        st.durable_lsn = st.durable_lsn.max(covered);
                        self.inner
                            .durable
                            .store(st.durable_lsn.0, Ordering::Release);
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

    /// The buffer holding `lsn`, which is below the appended end and at or above
    /// the written LSN (so in a buffer not yet written, or being written).
    pub(super) fn buffer_holding(st: &RingState<D::Error>, lsn: Lsn, align: u64) -> usize {
        (0..st.slots.len())
            .find(|&j| {
                let s = &st.slots[j];
                (s.state != BufState::Active || j == st.active) && s.holds(lsn, align)
            })
            .unwrap_or_else(|| {
                unreachable!(
                    "LSN {lsn} below the appended end and above the written LSN is in a buffer"
                )
            })
    }

    /// Sets NEED_FUA on buffer `i` and stamps the tail into it (the first
    /// FUA release stamps it; it is never overwritten).
    pub(super) fn mark_forced(&self, st: &mut RingState<D::Error>, i: usize) {
        let tail = st.tail_lsn;
        let slot = &mut st.slots[i];
        slot.need |= IoFlags::FUA;
        slot.tail.get_or_insert(tail);
    }
}
