//! Leases, as etcd's: a lease is granted with a time-to-live, kept alive
//! by its client, and when it is revoked — by its client, or by the
//! leader once the lease was not kept alive for its time-to-live — the
//! keys attached to it are deleted.
//!
//! Time is not the state machine's business. The table here holds each
//! lease's time-to-live and, if the leader checkpointed it, its remaining
//! time-to-live ([`crate::types::Command::LeaseCheckpoint`]); it holds no
//! deadline and reads no clock. The leader's lessor ([`crate::lessor`])
//! keeps the deadlines, by its own monotonic clock, and proposes a revoke
//! when one passes; so an expiry is a command in the log, applied alike
//! on every replica, and no node's clock decides one.
//!
//! A lease's id is the client's (etcd's `LeaseGrant` with an id), or one
//! picked at apply from the grant's place in the log ([`lease_id`], the
//! next free one at or above it). Stored: `l` + id (`u64`, big-endian) → time-to-live and
//! checkpointed remaining time-to-live (ms, `u64` each, little-endian; 0:
//! none); `a` + id + client key → empty, one per attached key (a key's
//! index entry names its lease, so an overwrite moves it). The table is
//! held in memory too (as etcd's lessor holds it), with each lease's
//! number of keys but not the keys: a revoke reads them from the `a`
//! pairs, in key order, in bounded steps (`apply.rs`), so memory grows
//! with the leases, not with the keys attached to them. At most
//! [`MAX_LEASE_KEYS`] keys a lease.

use super::writer::Writer;
use std::collections::BTreeMap;

use kvstore::Result as StoreResult;

/// The prefix of lease records.
pub(super) const LEASE: u8 = b'l';
/// The prefix of attachments.
pub(super) const ATTACHED: u8 = b'a';
/// Keys one lease may hold.
pub const MAX_LEASE_KEYS: usize = 10_000;

/// The id a grant without one starts from: its entry's log index and its
/// position in it (`index << 16 | position`), positive.
pub fn lease_id(index: u64, pos: u32) -> i64 {
    let id = ((index << 16) | u64::from(pos & 0xffff)) & (i64::MAX as u64);
    (id as i64).max(1)
}

/// A lease as the state machine holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Its id.
    pub id: i64,
    /// Its time-to-live, ms.
    pub ttl_ms: u64,
    /// Its remaining time-to-live as the leader last checkpointed it, ms
    /// (`None`: not checkpointed since it was granted or renewed).
    pub remaining_ms: Option<u64>,
    /// Keys attached to it.
    pub keys: usize,
}

impl LeaseInfo {
    /// The time-to-live a new leader gives it from its promotion: the
    /// checkpointed remaining time-to-live, or the whole one.
    pub fn left_ms(&self) -> u64 {
        self.remaining_ms.unwrap_or(self.ttl_ms)
    }
}

/// A change of the table, told to the leader's lessor
/// ([`crate::StateMachine::take_lease_changes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseChange {
    /// Granted with this time-to-live (ms).
    Granted {
        /// The lease.
        id: i64,
        /// Its time-to-live, ms.
        ttl_ms: u64,
    },
    /// A keep-alive reached the log (its checkpoint cleared).
    Renewed {
        /// The lease.
        id: i64,
        /// Its time-to-live, ms.
        ttl_ms: u64,
    },
    /// Revoked (its keys deleted).
    Ended {
        /// The lease.
        id: i64,
    },
    /// The whole table was replaced (a snapshot installed).
    Reloaded,
}

#[derive(Debug, Default, Clone, Copy)]
struct Lease {
    ttl: u64,
    /// The checkpointed remaining time-to-live (0: none).
    remaining: u64,
    /// Keys attached.
    keys: usize,
}

/// The lease table.
#[derive(Debug, Default)]
pub(super) struct Leases {
    by_id: BTreeMap<i64, Lease>,
    /// Changes for the leader's lessor, while one listens.
    changes: Option<Vec<LeaseChange>>,
}

fn record_key(id: i64) -> Vec<u8> {
    let mut k = vec![LEASE];
    k.extend_from_slice(&(id as u64).to_be_bytes());
    k
}

/// The prefix of lease `id`'s attachments.
pub(super) fn attached_prefix(id: i64) -> Vec<u8> {
    let mut k = vec![ATTACHED];
    k.extend_from_slice(&(id as u64).to_be_bytes());
    k
}

/// The first stored key after every attachment of lease `id`.
pub(super) fn attached_end(id: i64) -> Vec<u8> {
    match id.checked_add(1) {
        Some(next) => attached_prefix(next),
        None => vec![ATTACHED + 1],
    }
}

fn attached_key(id: i64, key: &[u8]) -> Vec<u8> {
    let mut k = vec![ATTACHED];
    k.extend_from_slice(&(id as u64).to_be_bytes());
    k.extend_from_slice(key);
    k
}

fn record(ttl: u64, remaining: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&ttl.to_le_bytes());
    v[8..].copy_from_slice(&remaining.to_le_bytes());
    v
}

fn id_of(k: &[u8]) -> Option<i64> {
    Some(u64::from_be_bytes(k.get(1..9)?.try_into().ok()?) as i64)
}

/// A lease record's value, checked: time-to-live and remaining (ms).
pub(super) fn decode_record(v: &[u8]) -> Option<(u64, u64)> {
    let v: &[u8; 16] = v.try_into().ok()?;
    Some((
        u64::from_le_bytes(v[..8].try_into().ok()?),
        u64::from_le_bytes(v[8..].try_into().ok()?),
    ))
}

/// Whether a stored `l` or `a` pair is well formed (a snapshot's check).
pub(super) fn valid(k: &[u8], v: &[u8]) -> bool {
    match k.first() {
        Some(&LEASE) => k.len() == 9 && decode_record(v).is_some(),
        Some(&ATTACHED) => k.len() > 9 && v.is_empty() && crate::check::check_key(&k[9..]).is_ok(),
        _ => false,
    }
}

/// Why a lease cannot take a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    NotFound,
    Full,
}

impl Leases {
    /// The table from the store's `l` and `a` pairs (read as they come,
    /// the attachments only counted). `Ok(None)`: a malformed pair.
    pub(super) fn load(
        leases: impl IntoIterator<Item = StoreResult<(Vec<u8>, Vec<u8>)>>,
        attached: impl IntoIterator<Item = StoreResult<(Vec<u8>, Vec<u8>)>>,
    ) -> StoreResult<Option<Leases>> {
        let mut t = Leases::default();
        for pair in leases {
            let (k, v) = pair?;
            let (Some((ttl, remaining)), Some(id)) =
                (decode_record(&v), id_of(&k).filter(|_| k.len() == 9))
            else {
                return Ok(None);
            };
            t.by_id.insert(
                id,
                Lease {
                    ttl,
                    remaining,
                    keys: 0,
                },
            );
        }
        for pair in attached {
            let (k, _) = pair?;
            let lease = id_of(&k)
                .filter(|_| k.len() > 9)
                .and_then(|id| t.by_id.get_mut(&id));
            let Some(l) = lease else {
                return Ok(None);
            };
            l.keys += 1;
        }
        Ok(Some(t))
    }

    /// Leases held.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    fn info(id: i64, l: &Lease) -> LeaseInfo {
        LeaseInfo {
            id,
            ttl_ms: l.ttl,
            remaining_ms: (l.remaining != 0).then_some(l.remaining),
            keys: l.keys,
        }
    }

    /// Lease `id`, if held.
    pub(super) fn get(&self, id: i64) -> Option<LeaseInfo> {
        self.by_id.get(&id).map(|l| Leases::info(id, l))
    }

    /// Every lease held, by id.
    pub(super) fn all(&self) -> Vec<LeaseInfo> {
        self.by_id
            .iter()
            .map(|(&id, l)| Leases::info(id, l))
            .collect()
    }

    /// Starts (or stops) noting changes for a lessor; a start discards
    /// what was noted before.
    pub(super) fn listen(&mut self, on: bool) {
        self.changes = on.then(Vec::new);
    }

    /// Whether a lessor listens.
    pub(super) fn listening(&self) -> bool {
        self.changes.is_some()
    }

    /// The changes noted since the last call.
    pub(super) fn take_changes(&mut self) -> Vec<LeaseChange> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether changes wait for the lessor.
    pub(super) fn changed(&self) -> bool {
        self.changes.as_ref().is_some_and(|c| !c.is_empty())
    }

    /// Notes that the whole table was replaced.
    pub(super) fn reloaded(&mut self) {
        self.note(LeaseChange::Reloaded);
    }

    fn note(&mut self, c: LeaseChange) {
        if let Some(changes) = &mut self.changes {
            changes.push(c);
        }
    }

    /// Grants lease `id` for `ttl` ms.
    pub(super) fn grant(&mut self, id: i64, ttl: u64, txn: &mut kvstore::Transaction<'_>) {
        self.by_id.insert(
            id,
            Lease {
                ttl,
                remaining: 0,
                keys: 0,
            },
        );
        txn.put(&record_key(id), &record(ttl, 0));
        self.note(LeaseChange::Granted { id, ttl_ms: ttl });
    }

    /// A keep-alive that reached the log: lease `id`'s checkpointed
    /// remaining time-to-live is cleared (the leader counts its whole
    /// time-to-live from the renewal); `false` if there is no such lease.
    pub(super) fn keep_alive(&mut self, id: i64, txn: &mut kvstore::Transaction<'_>) -> bool {
        if !self.set_remaining(id, 0, txn) {
            return false;
        }
        let ttl_ms = self.by_id.get(&id).map_or(0, |l| l.ttl);
        self.note(LeaseChange::Renewed { id, ttl_ms });
        true
    }

    /// Records lease `id`'s remaining time-to-live (ms, at least 1), as
    /// the leader checkpointed it; `false` if there is no such lease.
    pub(super) fn checkpoint(
        &mut self,
        id: i64,
        remaining: u64,
        txn: &mut kvstore::Transaction<'_>,
    ) -> bool {
        self.set_remaining(id, remaining.max(1), txn)
    }

    fn set_remaining(
        &mut self,
        id: i64,
        remaining: u64,
        txn: &mut kvstore::Transaction<'_>,
    ) -> bool {
        let Some(l) = self.by_id.get_mut(&id) else {
            return false;
        };
        if l.remaining != remaining {
            l.remaining = remaining;
            txn.put(&record_key(id), &record(l.ttl, remaining));
        }
        true
    }

    /// Whether lease `id` may take a key attached now to `current`.
    pub(super) fn can_take(&self, id: i64, current: Option<i64>) -> Result<(), Refused> {
        let l = self.by_id.get(&id).ok_or(Refused::NotFound)?;
        if l.keys >= MAX_LEASE_KEYS && current != Some(id) {
            return Err(Refused::Full);
        }
        Ok(())
    }

    /// Moves `key` from lease `from` to lease `to` (either may be none);
    /// the attachments through `w` (a revoke walks them back through it).
    pub(super) fn moved(
        &mut self,
        key: &[u8],
        from: Option<i64>,
        to: Option<i64>,
        w: &mut Writer<'_>,
    ) {
        if from == to {
            return;
        }
        if let Some(id) = from {
            if let Some(l) = self.by_id.get_mut(&id) {
                l.keys = l.keys.saturating_sub(1);
            }
            w.delete(attached_key(id, key));
        }
        if let Some(id) = to {
            if let Some(l) = self.by_id.get_mut(&id) {
                l.keys += 1;
                w.put(attached_key(id, key), Vec::new());
            }
        }
    }

    /// The id for a grant without one at log `index`, position `pos`:
    /// [`lease_id`] of it, or the next one not held.
    pub(super) fn pick_id(&self, index: u64, pos: u32) -> i64 {
        let mut id = lease_id(index, pos);
        while self.by_id.contains_key(&id) {
            id = id.checked_add(1).unwrap_or(1);
        }
        id
    }

    /// Ends lease `id` once its keys are deleted: its record is removed
    /// in `txn`. `false` if there is no such lease.
    pub(super) fn end(&mut self, id: i64, txn: &mut kvstore::Transaction<'_>) -> bool {
        if self.by_id.remove(&id).is_none() {
            return false;
        }
        txn.delete(&record_key(id));
        self.note(LeaseChange::Ended { id });
        true
    }

    /// Whether lease `id` is held.
    pub(super) fn holds(&self, id: i64) -> bool {
        self.by_id.contains_key(&id)
    }
}

impl super::StateMachine {
    /// Every lease held, by id, as applied here.
    pub fn lease_ids(&self) -> Vec<i64> {
        self.inner
            .state
            .lock()
            .leases
            .all()
            .iter()
            .map(|l| l.id)
            .collect()
    }

    /// Lease `id`, as applied here.
    pub fn lease(&self, id: i64) -> Option<LeaseInfo> {
        self.inner.state.lock().leases.get(id)
    }

    /// Starts noting the lease table's changes for a lessor (the leader's,
    /// [`crate::lessor`]) and returns the table as it is now: every change
    /// applied after it is noted ([`crate::StateMachine::take_lease_changes`]).
    pub fn listen_to_leases(&self) -> Vec<LeaseInfo> {
        let mut st = self.inner.state.lock();
        st.leases.listen(true);
        st.leases.all()
    }

    /// Stops noting the lease table's changes.
    pub fn stop_listening_to_leases(&self) {
        self.inner.state.lock().leases.listen(false);
    }

    /// The lease table's changes noted since the last call.
    pub fn take_lease_changes(&self) -> Vec<LeaseChange> {
        self.inner.state.lock().leases.take_changes()
    }

    /// Waits until changes were noted (or were, since the last wait).
    pub async fn lease_changes(&self) {
        self.inner.lease_changed.notified().await;
    }

    /// The log's clock, as applied here (ms; what the last `Clock`
    /// command said, never back).
    pub fn log_clock(&self) -> u64 {
        self.inner.state.lock().sessions.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_ids_are_distinct_per_place_in_the_log() {
        assert_eq!(decode_record(&record(5, 9)), Some((5, 9)));
        assert_eq!(decode_record(&[0; 15]), None);
        let a = lease_id(7, 1);
        let b = lease_id(7, 2);
        let c = lease_id(8, 1);
        assert!(lease_id(u64::MAX, 0) > 0);
        assert!(a != b && b != c && a < b && b < c);
        assert!(valid(&record_key(a), &record(1, 2)));
        assert!(valid(&attached_key(a, b"k"), &[]));
        assert!(!valid(&attached_key(a, b""), &[]));
        assert!(!valid(&attached_key(a, b"k"), b"x"));
        assert!(attached_key(a, b"\x7e\x7e") < attached_end(a));
        assert!(attached_end(a) <= attached_prefix(a + 1));
        assert_eq!(attached_end(i64::MAX), vec![ATTACHED + 1]);
    }
}
