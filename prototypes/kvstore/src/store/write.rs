//! Writing: transactions applied to the buckets and logged, checkpoints
//! (the background checkpointer included).

use super::*;

impl Inner {
    pub(super) fn check(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// The full image of a bucket as it stands: its pageLSN and content
    /// (its pages are a pure function of them).
    pub(super) fn image(bucket: &Bucket) -> (Lsn, Vec<u8>) {
        (bucket.lsn, bucket::serialize(&bucket.entries))
    }

    /// Commits `ops` atomically: one log record; `wait`: durable on return.
    pub(super) fn apply(&self, ops: Vec<Op>, wait: bool) -> Result<Lsn> {
        self.check()?;
        for op in &ops {
            if op.key().len() > MAX_KEY {
                return Err(Error::KeyTooLarge {
                    len: op.key().len(),
                    max: MAX_KEY,
                });
            }
            if let Op::Put(_, v) = op {
                if v.len() > MAX_VALUE {
                    return Err(Error::ValueTooLarge {
                        len: v.len(),
                        max: MAX_VALUE,
                    });
                }
            }
        }
        if ops.is_empty() {
            return Ok(self.journal.appended_lsn());
        }
        let n = self.buckets.len() as u32;
        // One section per bucket, in ascending bucket order (a single-op
        // transaction, the common case, allocates nothing more here).
        let mut sections: Vec<Section> = if ops.len() == 1 {
            let bucket = bucket_of(ops[0].key(), n);
            vec![Section {
                bucket,
                image: None,
                ops,
            }]
        } else {
            let mut by_bucket: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
            for op in ops {
                by_bucket
                    .entry(bucket_of(op.key(), n))
                    .or_default()
                    .push(op);
            }
            by_bucket
                .into_iter()
                .map(|(bucket, ops)| Section {
                    bucket,
                    image: None,
                    ops,
                })
                .collect()
        };
        // Buckets are locked in ascending order: no deadlock.
        let mut guards: Vec<MutexGuard<'_, Bucket>> = sections
            .iter()
            .map(|s| self.buckets[s.bucket as usize].lock())
            .collect();
        let max = self.journal.options().max_record();
        let (lsn, epoch) = loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            for (s, g) in sections.iter_mut().zip(&guards) {
                s.image = (g.image_epoch < epoch).then(|| Self::image(g));
            }
            let bytes = record::encoded_len(&sections);
            if bytes > max {
                return Err(Error::TransactionTooLarge { bytes, max });
            }
            let record = record::encode(&sections);
            // Shared: transactions append side by side; a checkpoint takes
            // it exclusively for the instant it bumps the epoch.
            let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            if self.epoch.load(Ordering::Acquire) != epoch {
                // A checkpoint began meanwhile: decide the images again.
                continue;
            }
            let lsn = self.journal.append(&record)?;
            drop(gate);
            break (lsn, epoch);
        };
        for (g, s) in guards.iter_mut().zip(sections) {
            for op in s.ops {
                apply_op(&mut g.entries, op);
            }
            g.lsn = lsn;
            g.dirty = true;
            g.image_epoch = epoch;
        }
        drop(guards);
        // Committed after the append, like a thread calling `commit`:
        // opening the commit before building the record
        // (`Journal::begin_commit`) measured slower here (leaders waited
        // for committers still building theirs).
        if wait {
            self.journal.commit(lsn)?;
        }
        // (From our own LSN: the log's end would cost the ring's lock.)
        let since = lsn.0.saturating_sub(self.last_redo.load(Ordering::Relaxed));
        if since > self.options.checkpoint_log_bytes {
            self.worker.lock().nudged = true;
            self.wake.notify_all();
        }
        Ok(lsn)
    }

    /// Writes the changed buckets home, then moves the log's tail.
    pub(super) fn checkpoint(&self) -> Result<CheckpointInfo> {
        let _one = self.checkpointing.lock();
        let redo = {
            let _gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.journal.appended_lsn()
        };
        self.last_redo.store(redo.0, Ordering::Relaxed);
        let mut writes = Vec::new();
        let mut buckets_written = 0;
        {
            let mut alloc = self.pages.lock();
            for (i, b) in self.buckets.iter().enumerate() {
                let mut g = b.lock();
                if !g.dirty {
                    continue;
                }
                let content = bucket::serialize(&g.entries);
                let need = bucket::pages_needed(content.len());
                let mut chain = std::mem::take(&mut g.chain);
                if chain.is_empty() {
                    chain.push(1 + i as u32);
                }
                let keep = need.min(chain.len());
                alloc.free.extend(chain.drain(keep..));
                while chain.len() < need {
                    chain.push(alloc.alloc());
                }
                writes.extend(bucket::to_pages(&chain, g.lsn, &content));
                g.chain = chain;
                g.dirty = false;
                buckets_written += 1;
            }
        }
        // Write-ahead: the log is durable over every page's LSN before
        // any page goes home.
        self.journal.force_all()?;
        for (n, p) in &writes {
            self.data.write_at(&p[..], *n as u64 * PAGE_SIZE as u64)?;
        }
        self.journal.checkpoint(redo)?;
        Ok(CheckpointInfo {
            redo_lsn: redo,
            buckets_written,
            pages_written: writes.len() as u64,
        })
    }

    /// The background checkpointer: every interval, or when nudged by log
    /// volume, until stopped.
    pub(super) fn checkpointer(&self) {
        loop {
            {
                let mut st = self.worker.lock();
                let deadline = self.options.checkpoint_interval.map(Deadline::after);
                while !st.stop && !st.nudged {
                    match &deadline {
                        Some(d) => {
                            let (g, expired) = self.wake.wait_deadline(st, d);
                            st = g;
                            if expired {
                                break;
                            }
                        }
                        None => st = self.wake.wait(st),
                    }
                }
                if st.stop {
                    return;
                }
                st.nudged = false;
            }
            if let Err(e) = self.checkpoint() {
                self.worker.lock().last_error = Some(e);
                return;
            }
        }
    }
}
