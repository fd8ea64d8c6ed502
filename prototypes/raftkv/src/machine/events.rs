//! The watch history: every change the state machine applies is also
//! written, in the same store transaction, as an event under its
//! position — so it is identical on every replica, survives restarts,
//! travels in snapshots, and a watcher reads it back from any node.
//!
//! An event's position is its revision and its number among that
//! revision's events (a transaction or a range delete changes several
//! keys at one revision): `index.sub.n`. Keys and values:
//!
//! - `h` + log index (`u64`, big-endian) + position in the entry (`u32`,
//!   big-endian) + event number (`u32`, big-endian) → kind (`u8`: 0
//!   delete, 1 put), key length (`u16`, little-endian), the key, and for a
//!   put the value;
//! - `m/history` → the events held (`u64`) and the horizon: the first
//!   position not compacted (index `u64`, position `u32`, number `u32`),
//!   little-endian.
//!
//! The history keeps about the newest `retention` events: after each
//! entry, the oldest ones beyond it are deleted (at most
//! [`COMPACT_PER_ENTRY`] an entry) and the horizon moves past them, in the
//! transaction that also records the applied log id. What an entry
//! compacts depends on the log alone (and the node's retention), never on
//! how entries were grouped into store transactions, so replicas with one
//! retention hold the same history. The stored count and horizon always
//! match the applied id: a crash replays the entries after it, and their
//! events are written again at the same positions.

use super::{corrupt, Error};
use crate::types::Revision;
use kvstore::{Store, Transaction};

/// The prefix of the history's keys.
pub(super) const HISTORY: u8 = b'h';
/// The key of the history's count and horizon.
pub(super) const HISTORY_STATE: &[u8] = b"m/history";
/// A retention for a store that serves watches: 100 MiB of 1 KiB values,
/// 10–25 s of writes at the rates measured with 16 to 64 clients. (The default is
/// none: a history costs a second write of every change — measured in
/// docs/PERFORMANCE.md — so it is opt-in, as CockroachDB's rangefeeds
/// and DynamoDB's streams are.)
pub const SUGGESTED_RETENTION: u64 = 100_000;
/// Events compacted after one entry, at most: more than a full entry of
/// single puts writes, so a history over its retention (after a large
/// range delete, or a retention lowered) comes back to it entry by entry.
pub(super) const COMPACT_PER_ENTRY: u64 = 2048;

/// Where an event is in the history: its revision and its number among
/// that revision's events. Written `index.sub.n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// The change's revision.
    pub revision: Revision,
    /// The event's number among the revision's events, from 0.
    pub n: u32,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.revision, self.n)
    }
}

impl std::str::FromStr for Position {
    type Err = crate::BadInput;

    /// Parses `index.sub.n`.
    fn from_str(s: &str) -> Result<Position, crate::BadInput> {
        let (rev, n) = s.rsplit_once('.').ok_or(crate::BadInput::Revision)?;
        Ok(Position {
            revision: rev.parse()?,
            n: n.parse().map_err(|_| crate::BadInput::Revision)?,
        })
    }
}

impl Position {
    /// The position right after this one.
    pub fn next(self) -> Position {
        match self.n.checked_add(1) {
            Some(n) => Position { n, ..self },
            None => Position {
                revision: Revision {
                    sub: self.revision.sub.saturating_add(1),
                    ..self.revision
                },
                n: 0,
            },
        }
    }
}

/// What an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The key was set to this value.
    Put(Vec<u8>),
    /// The key was removed.
    Delete,
}

/// One change of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Where it is.
    pub position: Position,
    /// The client's key.
    pub key: Vec<u8>,
    /// What happened to it.
    pub change: Change,
}

/// The stored key of position `p`.
pub(super) fn key(p: Position) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(HISTORY);
    k.extend_from_slice(&p.revision.index.to_be_bytes());
    k.extend_from_slice(&p.revision.sub.to_be_bytes());
    k.extend_from_slice(&p.n.to_be_bytes());
    k
}

fn position(k: &[u8]) -> Option<Position> {
    if k.len() != 17 || k[0] != HISTORY {
        return None;
    }
    Some(Position {
        revision: Revision {
            index: u64::from_be_bytes(k[1..9].try_into().ok()?),
            sub: u32::from_be_bytes(k[9..13].try_into().ok()?),
        },
        n: u32::from_be_bytes(k[13..17].try_into().ok()?),
    })
}

pub(super) fn encode(key: &[u8], change: Option<&[u8]>) -> Vec<u8> {
    let mut v = Vec::with_capacity(3 + key.len() + change.map_or(0, <[u8]>::len));
    v.push(u8::from(change.is_some()));
    // (A client key is at most `MAX_KEY` bytes: it fits.)
    v.extend_from_slice(&u16::try_from(key.len()).unwrap_or(u16::MAX).to_le_bytes());
    v.extend_from_slice(key);
    if let Some(value) = change {
        v.extend_from_slice(value);
    }
    v
}

/// An event from its stored pair; `None` if malformed.
pub(super) fn decode(k: &[u8], v: &[u8]) -> Option<Event> {
    let position = position(k)?;
    let len = usize::from(u16::from_le_bytes(v.get(1..3)?.try_into().ok()?));
    let key = v.get(3..3 + len)?.to_vec();
    let rest = v.get(3 + len..)?;
    let change = match v[0] {
        0 if rest.is_empty() => Change::Delete,
        1 => Change::Put(rest.to_vec()),
        _ => return None,
    };
    crate::types::check_key(&key).ok()?;
    Some(Event {
        position,
        key,
        change,
    })
}

/// The history's bookkeeping (mirrors `m/history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct History {
    /// Events held.
    pub(super) count: u64,
    /// The first position not compacted: every event at or after it is
    /// held.
    pub(super) horizon: Position,
}

impl History {
    pub(super) fn load(store: &Store) -> Result<History, Error> {
        let Some(v) = store.get(HISTORY_STATE)? else {
            return Ok(History::default());
        };
        History::decode(&v).ok_or_else(|| corrupt("m/history is malformed"))
    }

    pub(super) fn decode(v: &[u8]) -> Option<History> {
        let v: &[u8; 24] = v.try_into().ok()?;
        let u64_at = |i: usize| v[i..i + 8].try_into().ok().map(u64::from_le_bytes);
        let u32_at = |i: usize| v[i..i + 4].try_into().ok().map(u32::from_le_bytes);
        Some(History {
            count: u64_at(0)?,
            horizon: Position {
                revision: Revision {
                    index: u64_at(8)?,
                    sub: u32_at(16)?,
                },
                n: u32_at(20)?,
            },
        })
    }

    pub(super) fn encode(&self) -> [u8; 24] {
        let mut v = [0u8; 24];
        v[..8].copy_from_slice(&self.count.to_le_bytes());
        v[8..16].copy_from_slice(&self.horizon.revision.index.to_le_bytes());
        v[16..20].copy_from_slice(&self.horizon.revision.sub.to_le_bytes());
        v[20..].copy_from_slice(&self.horizon.n.to_le_bytes());
        v
    }

    /// Deletes the oldest events beyond `retention` (at most `max` of
    /// them) in `txn`: the committed ones from the horizon on, then those
    /// `fresh` holds (written in `txn`, in order); returns how many. The
    /// caller records the count and horizon. What it removes depends only
    /// on the events written so far, never on what was committed when.
    pub(super) fn compact(
        &mut self,
        store: &Store,
        txn: &mut Transaction<'_>,
        fresh: &[Position],
        (retention, max): (u64, u64),
    ) -> Result<u64, Error> {
        let excess = self.count.saturating_sub(retention).min(max);
        let mut removed = 0;
        if excess == 0 {
            return Ok(0);
        }
        for pair in store.range(key(self.horizon)..vec![HISTORY + 1])? {
            if removed == excess {
                break;
            }
            let (k, _) = pair?;
            let p = position(&k).ok_or_else(|| corrupt("a history key is malformed"))?;
            txn.delete(&k);
            self.horizon = p.next();
            removed += 1;
        }
        for &p in fresh {
            if removed == excess {
                break;
            }
            if p >= self.horizon {
                txn.delete(&key(p));
                self.horizon = p.next();
                removed += 1;
            }
        }
        self.count -= removed;
        Ok(removed)
    }
}

/// A page of the history ([`crate::StateMachine::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    /// The events found, in order.
    pub events: Vec<Event>,
    /// Where to read on from.
    pub next: Position,
    /// Set when the position asked for was compacted: the first position
    /// held (nothing else is returned).
    pub compacted: Option<Position>,
}

/// Reads events of keys under `prefix` from `from` on: at most `max`
/// events, looking at most at `scan` of them.
pub(super) fn read(
    iter: kvstore::Iter,
    from: Position,
    prefix: &[u8],
    (max, scan): (usize, usize),
) -> Result<EventPage, Error> {
    let mut page = EventPage {
        events: Vec::new(),
        next: from,
        compacted: None,
    };
    for (seen, pair) in iter.enumerate() {
        let (k, v) = pair?;
        let e = decode(&k, &v).ok_or_else(|| corrupt("a history event is malformed"))?;
        page.next = e.position.next();
        if e.key.starts_with(prefix) {
            page.events.push(e);
        }
        if page.events.len() == max || seen + 1 == scan {
            break;
        }
    }
    Ok(page)
}

/// Whether a stored `h` pair is well formed (a snapshot's check).
pub(super) fn valid(k: &[u8], v: &[u8]) -> bool {
    decode(k, v).is_some()
}

impl super::StateMachine {
    /// Events of keys under `prefix` from position `from` on, as applied
    /// here: at most `max` of them, looking at most at `scan` events (a
    /// page that finds none still moves `next` on). If `from` was
    /// compacted, none, and the first position held.
    pub fn events(
        &self,
        from: Position,
        prefix: &[u8],
        max: usize,
        scan: usize,
    ) -> Result<EventPage, Error> {
        let iter = {
            let st = self.inner.state.lock();
            if from < st.history.horizon {
                return Ok(EventPage {
                    events: Vec::new(),
                    next: from,
                    compacted: Some(st.history.horizon),
                });
            }
            st.store.range(key(from)..vec![HISTORY + 1])?
        };
        read(iter, from, prefix, (max, scan))
    }

    /// The last applied index, watched: changes after every applied batch
    /// and installed snapshot.
    pub fn applied_index(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.applied_index.subscribe()
    }

    /// Keeps about the newest `events` events in the watch history
    /// (default 0: none — no events are written,
    /// what is held is compacted away, and there is no watch).
    pub fn keep_events(&self, events: u64) {
        self.inner.state.lock().retention = events;
    }

    /// Whether this node keeps a watch history.
    pub fn keeps_history(&self) -> bool {
        self.inner.state.lock().retention > 0
    }

    /// The watch history's first position held and the events it holds.
    pub fn history(&self) -> (Position, u64) {
        let st = self.inner.state.lock();
        (st.history.horizon, st.history.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_events_and_the_state_round_trip() {
        let p = Position {
            revision: Revision { index: 9, sub: 2 },
            n: 4,
        };
        assert_eq!(p.to_string().parse::<Position>(), Ok(p));
        assert!("9.2".parse::<Position>().is_err());
        assert!(key(p) < key(p.next()));
        let put = encode(b"k/1", Some(b"v"));
        assert_eq!(
            decode(&key(p), &put),
            Some(Event {
                position: p,
                key: b"k/1".to_vec(),
                change: Change::Put(b"v".to_vec())
            })
        );
        let del = encode(b"k/1", None);
        assert_eq!(decode(&key(p), &del).unwrap().change, Change::Delete);
        // Malformed: a short key, a length past the value, a bad kind, a
        // delete with a value.
        assert_eq!(decode(&key(p)[..16], &del), None);
        assert_eq!(decode(&key(p), &[1, 200, 0, b'k']), None);
        assert_eq!(decode(&key(p), &[7, 1, 0, b'k']), None);
        assert_eq!(decode(&key(p), &[0, 1, 0, b'k', b'x']), None);
        let h = History {
            count: 12,
            horizon: p,
        };
        assert_eq!(History::decode(&h.encode()), Some(h));
        assert_eq!(History::decode(&h.encode()[..23]), None);
    }
}
