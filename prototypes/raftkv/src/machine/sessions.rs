//! Client sessions: each client's last applied sequence number and its
//! last activity by the log's clock, expired when idle for the
//! time-to-live the leader put in the log — so the table stays about
//! (new clients per second × TTL), and every replica holds the same one.
//!
//! The log's clock is what the leaders wrote into it
//! ([`crate::types::Command::Clock`]): each leader goes on from the clock
//! its log holds when it takes over, by its own monotonic clock, so the
//! log's clock never runs faster than real time and a leader whose wall
//! clock is ahead expires nothing early (the time between two leaders is
//! not counted: a session may live a little longer, never shorter).
//!
//! A request `(client, seq)` is applied when `seq` is the session's next
//! (any higher number: a client may give up on a request and move on); a
//! client without a session opens one with `seq = 1`. The session's last
//! number again is a retry (not applied again, answered as applied
//! before); a lower one is stale (a late copy, or an id used twice), and
//! a client unknown with `seq > 1` has lost its session: both are refused,
//! never applied. A retry is answered with what was decided the first
//! time (the revision and whether its comparisons held), as the Raft
//! dissertation's sessions keep each client's last response. Each session
//! is a store key (`c` + client id, big-endian) holding 33 bytes,
//! little-endian: the last sequence number (8), the last activity (8),
//! the store's revision after the last answer (8), whether its
//! comparisons held (1: 0 or 1) and the lease it granted (8: a grant's,
//! else 0), so snapshots carry the table.

use crate::types::{layout, RequestId, Verdict};
use std::collections::{BTreeMap, BTreeSet};

/// One client's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Session {
    /// The last sequence number decided.
    seq: u64,
    /// The last activity, by the log's clock (ms).
    at: u64,
    /// The store's revision after the last request.
    revision: i64,
    /// Whether its comparisons held.
    succeeded: bool,
    /// The lease it granted, if a grant (else 0).
    lease: i64,
}

/// The sessions, and the log's clock.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    /// Client id to its session.
    by_id: BTreeMap<u64, Session>,
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
            s.insert(id, decode(&v)?);
        }
        Some(s)
    }

    /// Sessions held.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    fn insert(&mut self, id: u64, session: Session) {
        if let Some(old) = self.by_id.insert(id, session) {
            self.by_time.remove(&(old.at, id));
        }
        self.by_time.insert((session.at, id));
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

    /// Decides a request id: `Ok` if the request is to be applied now
    /// (then [`Sessions::record`] its answer), else the verdict to answer
    /// with — a retry's carries the first answer, and refreshes the
    /// session in `txn` (its client is active).
    pub(super) fn admit(
        &mut self,
        id: RequestId,
        txn: &mut kvstore::Transaction<'_>,
    ) -> Result<(), Verdict> {
        match self.by_id.get(&id.client).copied() {
            None if id.seq == 1 => Ok(()),
            None => Err(Verdict::UnknownSession),
            Some(s) if id.seq > s.seq => Ok(()),
            Some(s) if id.seq == s.seq => {
                let s = Session {
                    at: self.clock,
                    ..s
                };
                self.insert(id.client, s);
                txn.put(&layout::client(id.client), &encode(s));
                Err(Verdict::Duplicate {
                    revision: s.revision,
                    succeeded: s.succeeded,
                    lease: s.lease,
                })
            }
            Some(_) => Err(Verdict::Stale),
        }
    }

    /// Records the answer to a request [`Sessions::admit`] let through.
    pub(super) fn record(
        &mut self,
        id: RequestId,
        revision: i64,
        (succeeded, lease): (bool, i64),
        txn: &mut kvstore::Transaction<'_>,
    ) {
        let s = Session {
            seq: id.seq,
            at: self.clock,
            revision,
            succeeded,
            lease,
        };
        self.insert(id.client, s);
        txn.put(&layout::client(id.client), &encode(s));
    }
}

fn encode(s: Session) -> [u8; 33] {
    let mut v = [0u8; 33];
    v[..8].copy_from_slice(&s.seq.to_le_bytes());
    v[8..16].copy_from_slice(&s.at.to_le_bytes());
    v[16..24].copy_from_slice(&s.revision.to_le_bytes());
    v[24] = u8::from(s.succeeded);
    v[25..].copy_from_slice(&s.lease.to_le_bytes());
    v
}

/// A session's stored value (33 bytes), checked.
pub(super) fn decode(v: &[u8]) -> Option<Session> {
    let v: &[u8; 33] = v.try_into().ok()?;
    let u = |r: std::ops::Range<usize>| v.get(r)?.try_into().ok().map(u64::from_le_bytes);
    let i = |r: std::ops::Range<usize>| v.get(r)?.try_into().ok().map(i64::from_le_bytes);
    Some(Session {
        seq: u(0..8)?,
        at: u(8..16)?,
        revision: i(16..24)?,
        succeeded: match v[24] {
            0 => false,
            1 => true,
            _ => return None,
        },
        lease: i(25..33)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_round_trips_and_a_malformed_one_is_refused() {
        let s = Session {
            seq: 9,
            at: 1_700_000_000_000,
            revision: 44,
            succeeded: false,
            lease: 7,
        };
        assert_eq!(decode(&encode(s)), Some(s));
        let mut bad = encode(s);
        bad[24] = 2;
        assert_eq!(decode(&bad), None);
        assert_eq!(decode(&encode(s)[..16]), None);
    }
}
