//! Chains: an entry larger than a buffer, or one split at the ACTIVE
//! buffer's end, laid out as parts over consecutive buffers while other
//! appends wait.

use super::*;

impl<D: LogDevice> Ring<D> {
    /// Appends an entry as a chain of parts over consecutive buffers: one
    /// too large for a buffer, or one that straddles the ACTIVE buffer's
    /// end with room worth filling there ([`Config::split_min`]). The first
    /// part ends the ACTIVE buffer (flagged CONTINUES), each later part
    /// starts the next one (CONTINUED; a middle part fills it alone), and
    /// the last part leaves its buffer ACTIVE for the appends that follow.
    /// Other appends wait while the parts are laid out (`chain_active`), so
    /// nothing interleaves with them. If the entry turns out to fit where
    /// the layout starts, it is written whole, as a plain entry.
    pub(super) fn append_chain(&self, payload: &[u8]) -> Result<Lsn, Error<D::Error>> {
        {
            let mut st = self.inner.state.lock();
            loop {
                st.poison()?;
                if !st.chain_active {
                    break;
                }
                st = self.wait_space(st);
            }
            // The whole chain must lie below the append limit (its parts
            // are begun without a check of their own): from wherever the
            // next part can start, one buffer per part and one to spare.
            let bsize = self.inner.config.logbsize as u64;
            let per_part = (self.inner.config.max_payload() - ENTRY_HEADER_SIZE) as u64;
            let parts = (payload.len() as u64).div_ceil(per_part.max(1)) + 1;
            let start = st.next_lsn.0.max(st.slots[st.active].lsn.0);
            let need = start
                .saturating_add(bsize)
                .saturating_add(parts.saturating_mul(bsize));
            if need > st.append_limit.0 {
                return Err(Error::NoRoom { need: Lsn(need) });
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
            let stable = st.durable_lsn;
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
    pub(super) fn chain_parts(
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
                    (st, h) = self.active_buffer(st, true, &mut waited)?;
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
}
