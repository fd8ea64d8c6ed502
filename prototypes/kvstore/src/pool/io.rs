//! The pool's I/O: pages read in (one load per page at a time, never a
//! stale copy installed), written home (the log forced first; through the
//! double-write area if there is one), and the data file's syncs — every
//! failed write or sync poisoning the store before it is answered.

use super::*;
use crate::page::Invalid;

/// What [`Pool::load`] came to.
enum Loaded {
    /// A writer's copy stood; this is the version picked from it.
    Picked(Picked),
    /// The page read was installed: the version picked, and the pool may
    /// be over capacity.
    Installed(Result<Picked>),
    /// The load's slot was taken over: look again.
    Stale,
}

fn invalid(no: PageNo, e: Invalid) -> Error {
    match e {
        Invalid::Checksum => Error::TornPage { page: no },
        Invalid::Structure(reason) => Error::Corrupt { page: no, reason },
    }
}

impl Pool {
    /// Syncs the data file; a failure poisons the store. `Ok` means every
    /// write of the file issued before this call is durable: the syncs are
    /// serialized, so a failure someone else's sync met (which may have
    /// dropped these pages from the page cache, and which the kernel
    /// reports once) has poisoned the store by the time this one returns,
    /// and is returned here instead.
    pub(crate) fn sync_data(&self) -> Result<()> {
        let _one = self.sync_lock.lock();
        self.poison.fatal(self.data.sync_data())?;
        self.poison.check()
    }

    /// Writes `bytes` at `offset` of the data file (a meta page, a bulk
    /// load's pages); a failure poisons the store, and nothing is written
    /// once it is poisoned.
    pub(crate) fn write_data(&self, bytes: &[u8], offset: u64) -> Result<()> {
        self.poison.check()?;
        self.poison.fatal(self.data.write_at(bytes, offset))
    }

    /// Reads page `no` from disk, checked.
    pub(crate) fn read_disk(&self, no: PageNo) -> Result<Page> {
        let mut buf = self.buffer();
        let off = u64::from(no) * PAGE_SIZE as u64;
        let mut got = 0;
        while got < PAGE_SIZE {
            let r = self.data.read_at(&mut buf[got..], off + got as u64)?;
            if r == 0 {
                return Err(Error::Corrupt {
                    page: no,
                    reason: "a page past the data file's end",
                });
            }
            got += r;
        }
        Page::from_disk(buf, no)
            .map(|p| self.adopt(p))
            .map_err(|e| invalid(no, e))
    }

    /// Page `no` as it stands. Under the tree lock no transaction is half
    /// applied from the caller's point of view; without it (a writer
    /// preparing a put, a transaction fetching the page it missed) the
    /// page may be one a transaction in progress is replacing, and the
    /// caller must check what it read before it relies on it.
    pub(crate) fn fetch(&self, no: PageNo, journal: &Journal) -> Result<Arc<Page>> {
        match self.fetch_inner(no, None, journal)? {
            Picked::Page(p) => Ok(p),
            // (Only a snapshot reads an older version.)
            Picked::Spilled { .. } => Err(Error::SnapshotTooOld),
        }
    }

    fn pick(st: &State, page: &Arc<Page>, no: PageNo, at: Option<Lsn>) -> Result<Picked> {
        match at {
            Some(s) => st.versions.pick(page, no, s),
            None => Ok(Picked::Page(page.clone())),
        }
    }

    pub(super) fn fetch_inner(
        &self,
        no: PageNo,
        at: Option<Lsn>,
        journal: &Journal,
    ) -> Result<Picked> {
        let mut st = self.state.lock();
        loop {
            match st.frames.get_mut(&no) {
                Some(Slot::Ready(f)) => {
                    f.referenced = true;
                    let page = f.page.clone();
                    return Self::pick(&st, &page, no, at);
                }
                Some(Slot::Loading(_)) => st = self.cond.wait(st),
                None => {
                    match self.load(st, no, at)? {
                        Loaded::Picked(p) => return Ok(p),
                        Loaded::Installed(picked) => return self.after_load(picked, journal),
                        // The slot was taken over meanwhile: look again.
                        Loaded::Stale => st = self.state.lock(),
                    }
                }
            }
        }
    }

    /// Reads page `no` from disk into a `Loading` slot and installs it.
    /// `Stale` if a writer replaced the slot meanwhile and its copy is gone
    /// again (written home and evicted): what was read may be older than
    /// that copy, so it is dropped and the caller looks again.
    fn load(&self, mut st: MutexGuard<'_, State>, no: PageNo, at: Option<Lsn>) -> Result<Loaded> {
        let load = st.loads;
        st.loads += 1;
        st.frames.insert(no, Slot::Loading(load));
        drop(st);
        let read = self.read_disk(no);
        let mut st = self.state.lock();
        match st.frames.get(&no) {
            Some(Slot::Loading(l)) if *l == load => {}
            Some(Slot::Ready(_)) => {}
            // (Another load's slot, or none: this one was replaced.)
            _ => {
                self.cond.notify_all();
                return Ok(Loaded::Stale);
            }
        }
        if let Some(Slot::Ready(f)) = st.frames.get(&no) {
            // A writer installed a new copy while the page was read (it
            // had been evicted after the writer read it): the writer's
            // stands; the copy read is the version it replaced.
            let page = f.page.clone();
            if let Ok(old) = read {
                st.versions.stash(no, &Arc::new(old));
            }
            self.publish(&st);
            self.cond.notify_all();
            return Self::pick(&st, &page, no, at).map(Loaded::Picked);
        }
        let page = match read {
            Ok(p) => Arc::new(p),
            Err(e) => {
                st.frames.remove(&no);
                self.publish(&st);
                self.cond.notify_all();
                return Err(e);
            }
        };
        st.frames.insert(
            no,
            Slot::Ready(Frame {
                page: page.clone(),
                dirty: false,
                referenced: true,
                pinned: false,
                writing: false,
                in_clock: true,
                image_epoch: 0,
            }),
        );
        st.clock.push_back(no);
        self.publish(&st);
        self.cond.notify_all();
        Ok(Loaded::Installed(Self::pick(&st, &page, no, at)))
    }

    /// After a page was installed: back within capacity, evicting clean
    /// frames and, if there are none, writing dirty ones home first.
    fn after_load(&self, picked: Result<Picked>, journal: &Journal) -> Result<Picked> {
        let victims = self.evict(&mut self.state.lock());
        if !victims.is_empty() {
            // Nothing clean to evict: write some dirty pages home so the
            // next eviction finds them clean. (A failure has poisoned the
            // store: `write_batch`.)
            self.write_back(&victims, journal)?;
            self.evict(&mut self.state.lock());
        }
        picked
    }

    /// Writes the dirty pages among `nos` home: the log forced over their
    /// pageLSNs first; a page is marked clean only once its write succeeded
    /// and only if no one changed it meanwhile. With `wait`, waits for a
    /// pinned page to be unpinned (a checkpoint must write every page).
    /// Returns the pages written.
    pub(crate) fn write_back_opt(
        &self,
        nos: &[PageNo],
        journal: &Journal,
        wait: bool,
    ) -> Result<usize> {
        if self.read_only {
            return Ok(0);
        }
        let mut batch: Vec<(PageNo, Arc<Page>)> = Vec::with_capacity(nos.len());
        {
            let mut st = self.state.lock();
            for no in nos {
                loop {
                    match st.frames.get_mut(no) {
                        Some(Slot::Ready(f)) if f.dirty && !f.writing => {
                            if f.pinned {
                                if wait {
                                    st = self.cond.wait(st);
                                    continue;
                                }
                                break;
                            }
                            f.writing = true;
                            batch.push((*no, f.page.clone()));
                        }
                        Some(Slot::Ready(f)) if f.writing && wait => {
                            // Another writer has it: wait for its outcome.
                            st = self.cond.wait(st);
                            continue;
                        }
                        _ => {}
                    }
                    break;
                }
            }
        }
        let result = self.write_batch(&batch, journal);
        let mut st = self.state.lock();
        let st = &mut *st;
        for (no, written) in &batch {
            if let Some(Slot::Ready(f)) = st.frames.get_mut(no) {
                f.writing = false;
                if result.is_ok() && Arc::ptr_eq(&f.page, written) && f.dirty {
                    f.dirty = false;
                    st.dirty -= 1;
                }
            }
        }
        self.publish(st);
        self.cond.notify_all();
        result.map(|()| batch.len())
    }

    /// [`Pool::write_back_opt`] without waiting for pinned pages.
    pub(crate) fn write_back(&self, nos: &[PageNo], journal: &Journal) -> Result<usize> {
        self.write_back_opt(nos, journal, false)
    }

    /// Writes `batch` home (through the double-write area if there is
    /// one). Any failure poisons the store before it is returned, and a
    /// poisoned store writes nothing: after a failed batch the area is
    /// never overwritten, so a page the failure left torn at home keeps
    /// its copy there for recovery.
    fn write_batch(&self, batch: &[(PageNo, Arc<Page>)], journal: &Journal) -> Result<()> {
        let Some(max) = batch.iter().map(|(_, p)| p.lsn()).max() else {
            return Ok(());
        };
        self.poison.check()?;
        // Write-ahead: the log is durable over every page's LSN first. (The
        // journal decides: the record *at* `durable_lsn` is not durable
        // yet, and a chained record is durable only with its last part.)
        self.poison.fatal(journal.force(max, ForceMode::Durable))?;
        let doublewrite = self.doublewrite.lock().clone();
        if let Some(dw) = doublewrite {
            let r = dw.write_home(batch, &*self.data, &|| self.sync_data());
            return self.poison.fatal(r);
        }
        let mut sealed = self.buffer();
        let mut r = Ok(());
        for (no, page) in batch {
            page.seal_into(&mut sealed);
            r = self
                .data
                .write_at(&sealed[..], u64::from(*no) * PAGE_SIZE as u64);
            if r.is_err() {
                break;
            }
        }
        self.spare.give(sealed);
        self.poison.fatal(r)
    }
}
