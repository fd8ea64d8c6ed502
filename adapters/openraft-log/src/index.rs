//! What the adapter keeps in memory: the index from log index to the LSN
//! of each live entry's record, and a bounded cache of the newest entries.

use crate::format::Error;
use journal_core::Lsn;
use openraft::vote::RaftCommittedLeaderId;
use openraft::LogId;
use std::collections::{BTreeMap, VecDeque};

/// Log index → LSN of the entry's record, for the live entries (log
/// indexes are consecutive), and the leader ids by runs: a leader's
/// entries share one.
#[derive(Debug)]
pub(crate) struct LogIndex<L: RaftCommittedLeaderId> {
    /// The log index of `lsns[0]`.
    first: u64,
    lsns: VecDeque<Lsn>,
    /// `(first index of the run, its leader)`, ascending; the first run
    /// starts at or below `first`.
    leaders: Vec<(u64, L)>,
}

impl<L: RaftCommittedLeaderId> Default for LogIndex<L> {
    fn default() -> Self {
        Self {
            first: 0,
            lsns: VecDeque::new(),
            leaders: Vec::new(),
        }
    }
}

impl<L: RaftCommittedLeaderId> LogIndex<L> {
    /// Live entries.
    pub(crate) fn len(&self) -> u64 {
        self.lsns.len() as u64
    }

    /// The first live index.
    pub(crate) fn first(&self) -> Option<u64> {
        (!self.lsns.is_empty()).then_some(self.first)
    }

    /// The last live index.
    pub(crate) fn last(&self) -> Option<u64> {
        // `first + len - 1` cannot overflow: the entry at it was pushed.
        (!self.lsns.is_empty()).then(|| self.first + (self.lsns.len() as u64 - 1))
    }

    fn offset(&self, index: u64) -> Option<usize> {
        let off = usize::try_from(index.checked_sub(self.first)?).ok()?;
        (off < self.lsns.len()).then_some(off)
    }

    /// The LSN of entry `index`'s record, if it is live.
    pub(crate) fn lsn(&self, index: u64) -> Option<Lsn> {
        self.offset(index).map(|o| self.lsns[o])
    }

    /// The log id of entry `index`, if it is live.
    pub(crate) fn log_id(&self, index: u64) -> Option<LogId<L>> {
        self.offset(index)?;
        let run = self.leaders.partition_point(|(f, _)| *f <= index);
        let (_, leader) = self.leaders.get(run.checked_sub(1)?)?;
        Some(LogId::new(leader.clone(), index))
    }

    /// Adds entry `id` at `lsn`: the next index, or any index when no entry
    /// is live (the first entry, or the first after a purge or a snapshot).
    pub(crate) fn push(&mut self, id: &LogId<L>, lsn: Lsn) -> Result<(), Error> {
        match self.last() {
            None => {
                self.first = id.index;
                self.leaders.clear();
            }
            Some(last) => {
                let expected = last.checked_add(1).ok_or(Error::Gap {
                    expected: last,
                    got: id.index,
                })?;
                if id.index != expected {
                    return Err(Error::Gap {
                        expected,
                        got: id.index,
                    });
                }
            }
        }
        if self.leaders.last().is_none_or(|(_, l)| *l != id.leader_id) {
            self.leaders.push((id.index, id.leader_id.clone()));
        }
        self.lsns.push_back(lsn);
        Ok(())
    }

    /// Removes the entries at and after `since`.
    pub(crate) fn truncate(&mut self, since: u64) {
        let keep = since.saturating_sub(self.first).min(self.len());
        self.lsns.truncate(keep as usize);
        self.leaders.retain(|(f, _)| *f < since);
        if self.lsns.is_empty() {
            self.leaders.clear();
        }
    }

    /// Removes the entries up to and including `upto`.
    pub(crate) fn purge(&mut self, upto: u64) {
        let Some(new_first) = upto.checked_add(1) else {
            *self = Self::default();
            return;
        };
        let drop = new_first.saturating_sub(self.first).min(self.len());
        self.lsns.drain(..drop as usize);
        self.first = self.first.max(new_first);
        if self.lsns.is_empty() {
            self.leaders.clear();
            return;
        }
        // Keep the run that covers the new first entry, and those after.
        let run = self.leaders.partition_point(|(f, _)| *f <= self.first);
        self.leaders.drain(..run.saturating_sub(1));
        // Give back what the deque no longer needs (after a large purge).
        if self.lsns.capacity() > 4 * self.lsns.len().max(1024) {
            self.lsns.shrink_to_fit();
        }
    }
}

/// The newest entries, bounded by their encoded size; the oldest go first.
#[derive(Debug)]
pub(crate) struct Cache<E> {
    entries: BTreeMap<u64, (E, usize)>,
    bytes: usize,
    limit: usize,
}

impl<E> Cache<E> {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            entries: BTreeMap::new(),
            bytes: 0,
            limit,
        }
    }

    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
        self.evict();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&self, index: u64) -> Option<&E> {
        self.entries.get(&index).map(|(e, _)| e)
    }

    /// Caches entry `index` of `size` encoded bytes (the newest).
    pub(crate) fn insert(&mut self, index: u64, e: E, size: usize) {
        if let Some((_, old)) = self.entries.insert(index, (e, size)) {
            self.bytes -= old;
        }
        self.bytes += size;
        self.evict();
    }

    fn evict(&mut self) {
        while self.bytes > self.limit {
            match self.entries.pop_first() {
                Some((_, (_, size))) => self.bytes -= size,
                None => break,
            }
        }
    }

    /// Drops the entries at and after `since`.
    pub(crate) fn truncate(&mut self, since: u64) {
        for (_, (_, size)) in self.entries.split_off(&since) {
            self.bytes -= size;
        }
    }

    /// Drops the entries up to and including `upto`.
    pub(crate) fn purge(&mut self, upto: u64) {
        let keep = match upto.checked_add(1) {
            Some(from) => self.entries.split_off(&from),
            None => BTreeMap::new(),
        };
        for (_, (_, size)) in std::mem::replace(&mut self.entries, keep) {
            self.bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::impls::leader_id_adv::LeaderId;

    type Leader = LeaderId<u64, u64>;

    fn id(term: u64, index: u64) -> LogId<Leader> {
        LogId::new(LeaderId { term, node_id: 1 }, index)
    }

    #[test]
    fn the_index_follows_appends_truncations_and_purges() {
        let mut ix = LogIndex::<Leader>::default();
        for i in 1..=10 {
            ix.push(&id(1 + i / 4, i), Lsn(i * 100)).unwrap();
        }
        assert_eq!((ix.first(), ix.last()), (Some(1), Some(10)));
        assert_eq!(ix.log_id(5), Some(id(2, 5)));
        assert_eq!(ix.log_id(9), Some(id(3, 9)));
        assert_eq!(ix.lsn(7), Some(Lsn(700)));
        assert!(matches!(
            ix.push(&id(3, 12), Lsn(1)),
            Err(Error::Gap {
                expected: 11,
                got: 12
            })
        ));
        ix.truncate(8);
        assert_eq!(ix.last(), Some(7));
        ix.push(&id(5, 8), Lsn(2000)).unwrap();
        assert_eq!(ix.log_id(8), Some(id(5, 8)));
        assert_eq!(ix.log_id(7), Some(id(2, 7)));
        ix.purge(5);
        assert_eq!((ix.first(), ix.last()), (Some(6), Some(8)));
        assert_eq!(ix.log_id(6), Some(id(2, 6)));
        assert_eq!(ix.log_id(5), None);
        assert_eq!(ix.lsn(8), Some(Lsn(2000)));
        // A purge past the end empties it; the next entry may be any index.
        ix.purge(20);
        assert_eq!(ix.first(), None);
        ix.push(&id(6, 21), Lsn(3000)).unwrap();
        assert_eq!(ix.log_id(21), Some(id(6, 21)));
        ix.purge(u64::MAX);
        assert_eq!(ix.len(), 0);
    }

    #[test]
    fn the_cache_keeps_the_newest_entries_within_its_bound() {
        let mut c = Cache::new(300);
        for i in 0..10u64 {
            c.insert(i, i, 100);
        }
        assert_eq!(c.len(), 3);
        assert!(c.get(6).is_none() && c.get(7).is_some() && c.get(9).is_some());
        c.truncate(9);
        assert_eq!(c.len(), 2);
        c.purge(7);
        assert_eq!(c.len(), 1);
        assert_eq!(c.get(8), Some(&8));
        c.set_limit(0);
        assert_eq!(c.len(), 0);
    }
}
