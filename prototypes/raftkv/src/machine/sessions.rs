//! Client sessions: each client's last applied sequence number and its
//! last activity by the log's clock, expired when idle for the
//! time-to-live the leader put in the log — so the table stays about
//! (new clients per second × TTL), and every replica holds the same one.
//!
//! A request `(client, seq)` is applied when `seq` is the session's next
//! (any higher number: a client may give up on a request and move on); a
//! client without a session opens one with `seq = 1`. The session's last
//! number again is a retry (not applied again, answered as applied
//! before); a lower one is stale (a late copy, or an id used twice), and
//! a client unknown with `seq > 1` has lost its session: both are refused,
//! never applied. Each session is a store key (`c` + client id: the last
//! sequence number and the last activity, 8 bytes each, little-endian),
//! so snapshots carry the table.

use crate::types::{layout, RequestId, Verdict};
use std::collections::{BTreeSet, HashMap};

/// The sessions, and the log's clock.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    /// Client id to (last sequence number, last activity in ms).
    by_id: HashMap<u64, (u64, u64)>,
    /// (last activity, client id), oldest first: what expires next.
    by_time: BTreeSet<(u64, u64)>,
    /// The log's clock: the latest `Clock` applied (ms).
    pub(super) clock: u64,
}

impl Sessions {
    /// The table as a store holds it, with the clock.
    pub(super) fn load(
        pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
        clock: u64,
    ) -> Option<Sessions> {
        let mut s = Sessions {
            clock,
            ..Sessions::default()
        };
        for (k, v) in pairs {
            let id = u64::from_be_bytes(k.get(1..9).filter(|_| k.len() == 9)?.try_into().ok()?);
            let (seq, at) = decode(&v)?;
            s.insert(id, seq, at);
        }
        Some(s)
    }

    /// Sessions held.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    fn insert(&mut self, id: u64, seq: u64, at: u64) {
        if let Some((_, old)) = self.by_id.insert(id, (seq, at)) {
            self.by_time.remove(&(old, id));
        }
        self.by_time.insert((at, id));
    }

    /// Advances the clock to `now` (never back) and expires the sessions
    /// idle longer than `ttl`; their keys are removed from `txn`.
    pub(super) fn tick(&mut self, now: u64, ttl: u64, txn: &mut kvstore::Transaction<'_>) {
        self.clock = self.clock.max(now);
        let horizon = self.clock.saturating_sub(ttl);
        while let Some(&(at, id)) = self.by_time.first() {
            if at >= horizon {
                break;
            }
            self.by_time.pop_first();
            self.by_id.remove(&id);
            txn.delete(&layout::client(id));
        }
        txn.put(layout::CLOCK, &self.clock.to_le_bytes());
    }

    /// Decides a request id, and records it in `txn` if it is applied.
    pub(super) fn admit(&mut self, id: RequestId, txn: &mut kvstore::Transaction<'_>) -> Verdict {
        let last = self.by_id.get(&id.client).map(|&(last, _)| last);
        let verdict = match last {
            None if id.seq == 1 => Verdict::Applied,
            None => return Verdict::UnknownSession,
            Some(last) if id.seq > last => Verdict::Applied,
            Some(last) if id.seq == last => Verdict::Duplicate,
            Some(_) => return Verdict::Stale,
        };
        // (A duplicate's seq is the session's last.)
        let seq = id.seq;
        // A retry refreshes the session too: its client is active.
        self.insert(id.client, seq, self.clock);
        txn.put(&layout::client(id.client), &encode(seq, self.clock));
        verdict
    }
}

fn encode(seq: u64, at: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v[8..].copy_from_slice(&at.to_le_bytes());
    v
}

/// A session's stored value: 16 bytes (sequence number, last activity),
/// or 8 (a store from before sessions expired: activity 0).
pub(super) fn decode(v: &[u8]) -> Option<(u64, u64)> {
    let u = |b: &[u8]| b.try_into().ok().map(u64::from_le_bytes);
    match v.len() {
        8 => Some((u(v)?, 0)),
        16 => Some((u(&v[..8])?, u(&v[8..])?)),
        _ => None,
    }
}
