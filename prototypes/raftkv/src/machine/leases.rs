//! Leases, as etcd's: a lease is granted with a time-to-live, kept alive
//! by its client, and when it expires — by the log's clock, so every
//! replica expires it at the same index — or is revoked, the keys
//! attached to it are deleted.
//!
//! A lease's id is derived from the revision that granted it
//! ([`lease_id`]). Stored: `l` + id (`u64`, big-endian) → time-to-live and
//! deadline (ms, `u64` each, little-endian); `a` + id + client key → empty,
//! one per attached key (a key's value header names its lease, so an
//! overwrite moves it). The table is held in memory too (as etcd's lessor
//! holds it), with each lease's number of keys but not the keys: a
//! revocation or expiry reads them from the `a` pairs (and the batch's own
//! changes, `apply.rs`), so memory grows with the leases, not with the keys
//! attached to them. At most [`MAX_LEASE_KEYS`] keys a lease, and the keys
//! deleted at one clock tick are bounded by [`EXPIRY_BUDGET`], so an expiry
//! never makes a store transaction too large.

use crate::types::Revision;
use std::collections::{BTreeSet, HashMap};

use kvstore::Result as StoreResult;

/// The prefix of lease records.
pub(super) const LEASE: u8 = b'l';
/// The prefix of attachments.
pub(super) const ATTACHED: u8 = b'a';
/// Keys one lease may hold.
pub const MAX_LEASE_KEYS: usize = 10_000;
/// Keys deleted by expiries at one clock tick, about (the leases past it
/// expire at the next tick).
pub(super) const EXPIRY_BUDGET: usize = 10_000;

/// The id of the lease granted at `rev`.
pub fn lease_id(rev: Revision) -> u64 {
    (rev.index << 16) | u64::from(rev.sub & 0xffff)
}

#[derive(Debug, Default)]
struct Lease {
    ttl: u64,
    deadline: u64,
    /// Keys attached.
    keys: usize,
}

/// The lease table.
#[derive(Debug, Default)]
pub(super) struct Leases {
    by_id: HashMap<u64, Lease>,
    /// (deadline, id), soonest first.
    by_deadline: BTreeSet<(u64, u64)>,
}

fn record_key(id: u64) -> Vec<u8> {
    let mut k = vec![LEASE];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// The prefix of lease `id`'s attachments.
pub(super) fn attached_prefix(id: u64) -> Vec<u8> {
    let mut k = vec![ATTACHED];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn attached_key(id: u64, key: &[u8]) -> Vec<u8> {
    let mut k = vec![ATTACHED];
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(key);
    k
}

fn record(ttl: u64, deadline: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&ttl.to_le_bytes());
    v[8..].copy_from_slice(&deadline.to_le_bytes());
    v
}

fn id_of(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.get(1..9)?.try_into().ok()?))
}

/// A lease record's value, checked.
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
        Some(&ATTACHED) => k.len() > 9 && v.is_empty() && crate::types::check_key(&k[9..]).is_ok(),
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
            let (Some((ttl, deadline)), Some(id)) =
                (decode_record(&v), id_of(&k).filter(|_| k.len() == 9))
            else {
                return Ok(None);
            };
            t.by_id.insert(
                id,
                Lease {
                    ttl,
                    deadline,
                    keys: 0,
                },
            );
            t.by_deadline.insert((deadline, id));
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

    /// Grants lease `id` for `ttl` ms from `now`.
    pub(super) fn grant(
        &mut self,
        id: u64,
        ttl: u64,
        now: u64,
        txn: &mut kvstore::Transaction<'_>,
    ) {
        let deadline = now.saturating_add(ttl);
        self.by_id.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys: 0,
            },
        );
        self.by_deadline.insert((deadline, id));
        txn.put(&record_key(id), &record(ttl, deadline));
    }

    /// Renews lease `id` for its time-to-live from `now`; `false` if there
    /// is none.
    pub(super) fn keep_alive(
        &mut self,
        id: u64,
        now: u64,
        txn: &mut kvstore::Transaction<'_>,
    ) -> bool {
        let Some(l) = self.by_id.get_mut(&id) else {
            return false;
        };
        self.by_deadline.remove(&(l.deadline, id));
        l.deadline = now.saturating_add(l.ttl).max(l.deadline);
        self.by_deadline.insert((l.deadline, id));
        txn.put(&record_key(id), &record(l.ttl, l.deadline));
        true
    }

    /// Whether lease `id` may take a key attached now to `current`.
    pub(super) fn can_take(&self, id: u64, current: Option<u64>) -> Result<(), Refused> {
        let l = self.by_id.get(&id).ok_or(Refused::NotFound)?;
        if l.keys >= MAX_LEASE_KEYS && current != Some(id) {
            return Err(Refused::Full);
        }
        Ok(())
    }

    /// Moves `key` from lease `from` to lease `to` (either may be none).
    pub(super) fn moved(
        &mut self,
        key: &[u8],
        from: Option<u64>,
        to: Option<u64>,
        txn: &mut kvstore::Transaction<'_>,
    ) {
        if from == to {
            return;
        }
        if let Some(l) = from.and_then(|id| self.by_id.get_mut(&id)) {
            l.keys = l.keys.saturating_sub(1);
            txn.delete(&attached_key(from.unwrap_or_default(), key));
        }
        if let Some(l) = to.and_then(|id| self.by_id.get_mut(&id)) {
            l.keys += 1;
            txn.put(&attached_key(to.unwrap_or_default(), key), &[]);
        }
    }

    /// Ends lease `id`: its record is removed in `txn`; `keys` are the
    /// keys attached to it, whose attachments are removed too (the caller
    /// deletes the keys). `false` if there is no such lease.
    pub(super) fn revoke(
        &mut self,
        id: u64,
        keys: &[Vec<u8>],
        txn: &mut kvstore::Transaction<'_>,
    ) -> bool {
        let Some(l) = self.by_id.remove(&id) else {
            return false;
        };
        self.by_deadline.remove(&(l.deadline, id));
        txn.delete(&record_key(id));
        for k in keys {
            txn.delete(&attached_key(id, k));
        }
        true
    }

    /// Whether lease `id` is held.
    pub(super) fn holds(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// The leases past their deadline at `now`, soonest first, while their
    /// keys stay within [`EXPIRY_BUDGET`] (always at least one lease).
    pub(super) fn expired(&self, now: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut keys = 0;
        for &(deadline, id) in &self.by_deadline {
            if deadline >= now {
                break;
            }
            let n = self.by_id.get(&id).map_or(0, |l| l.keys);
            if !out.is_empty() && keys + n > EXPIRY_BUDGET {
                break;
            }
            keys += n;
            out.push(id);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_ids_are_distinct_per_revision() {
        assert_eq!(decode_record(&record(5, 9)), Some((5, 9)));
        assert_eq!(decode_record(&[0; 15]), None);
        let a = lease_id(Revision { index: 7, sub: 1 });
        let b = lease_id(Revision { index: 7, sub: 2 });
        let c = lease_id(Revision { index: 8, sub: 1 });
        assert!(a != b && b != c && a < b && b < c);
        assert!(valid(&record_key(a), &record(1, 2)));
        assert!(valid(&attached_key(a, b"k"), &[]));
        assert!(!valid(&attached_key(a, b""), &[]));
        assert!(!valid(&attached_key(a, b"k"), b"x"));
    }
}
