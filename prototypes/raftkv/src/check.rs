//! Requests checked as etcd checks them before it proposes them
//! (etcd 3.4's `checkPutRequest`, `checkTxnRequest`, `checkIntervals`
//! and its request size limit), with raftkv's own bounds on key and
//! value lengths (its store's).
//!
//! Keys are any bytes, as etcd's (a client may send `\0`), 1 to
//! [`crate::MAX_KEY`] of them; values up to [`crate::MAX_VALUE`]. A key or
//! value over raftkv's bound is [`KvError::RequestTooLarge`], as is a
//! request whose keys, values and range ends pass
//! [`kv::MAX_REQUEST_BYTES`].

use crate::kv::{self, KvError, RequestOp, TxnRequest};
use crate::{MAX_KEY, MAX_VALUE};
use std::collections::BTreeSet;

/// Checks a key: not empty, at most [`MAX_KEY`] bytes.
pub fn check_key(key: &[u8]) -> Result<(), KvError> {
    if key.is_empty() {
        return Err(KvError::EmptyKey);
    }
    if key.len() > MAX_KEY {
        return Err(KvError::RequestTooLarge);
    }
    Ok(())
}

/// Checks a range end: empty, `[0]`, or a key.
fn check_end(end: &[u8]) -> Result<(), KvError> {
    if end.len() > MAX_KEY {
        return Err(KvError::RequestTooLarge);
    }
    Ok(())
}

/// Checks a request before it is proposed or served: what etcd refuses
/// at its API (empty keys, a value with `ignore_value`, a lease with
/// `ignore_lease`, too many operations, a key put twice or put and
/// deleted in one transaction, a request too large).
pub fn check_request(op: &RequestOp) -> Result<(), KvError> {
    check_op(op, kv::MAX_TXN_OPS)?;
    if request_bytes(op) > kv::MAX_REQUEST_BYTES {
        return Err(KvError::RequestTooLarge);
    }
    Ok(())
}

fn check_op(op: &RequestOp, max_ops: usize) -> Result<(), KvError> {
    match op {
        RequestOp::Range(r) => {
            check_key(&r.key)?;
            check_end(&r.range_end)
        }
        RequestOp::Put(p) => {
            check_key(&p.key)?;
            if p.ignore_value && !p.value.is_empty() {
                return Err(KvError::ValueProvided);
            }
            if p.ignore_lease && p.lease != 0 {
                return Err(KvError::LeaseProvided);
            }
            if p.value.len() > MAX_VALUE {
                return Err(KvError::RequestTooLarge);
            }
            Ok(())
        }
        RequestOp::DeleteRange(d) => {
            check_key(&d.key)?;
            check_end(&d.range_end)
        }
        RequestOp::Txn(t) => check_txn(t, max_ops),
    }
}

/// etcd's `checkTxnRequest`: at most `max_ops` comparisons and requests a
/// branch (a nested transaction gets what its parent left), keys given,
/// and no key changed twice in a branch (`checkIntervals`).
fn check_txn(t: &TxnRequest, max_ops: usize) -> Result<(), KvError> {
    let ops = t.compare.len().max(t.success.len()).max(t.failure.len());
    if ops > max_ops {
        return Err(KvError::TooManyOps);
    }
    for c in &t.compare {
        check_key(&c.key)?;
        check_end(&c.range_end)?;
        if let kv::CompareTarget::Value(v) = &c.target {
            if v.len() > MAX_VALUE {
                return Err(KvError::RequestTooLarge);
            }
        }
    }
    for op in t.success.iter().chain(&t.failure) {
        check_op(op, max_ops - ops)?;
    }
    changes(&t.success)?;
    changes(&t.failure)?;
    Ok(())
}

/// A branch's changes: the keys it puts and the ranges it deletes
/// (`[key, end)`, `end` empty for one key), its nested transactions'
/// included; `DuplicateKey` if a key is put twice, or put and deleted
/// (a nested transaction's two branches may put one key: only one runs).
#[allow(clippy::type_complexity)]
fn changes(ops: &[RequestOp]) -> Result<(BTreeSet<Vec<u8>>, Vec<(Vec<u8>, Vec<u8>)>), KvError> {
    let mut dels: Vec<(Vec<u8>, Vec<u8>)> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(d) => Some((d.key.clone(), d.range_end.clone())),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[(Vec<u8>, Vec<u8>)], k: &[u8]| {
        dels.iter().any(|(key, end)| kv::in_range(k, key, end))
    };
    let mut puts = BTreeSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (then, then_dels) = changes(&t.success)?;
        let (other, else_dels) = changes(&t.failure)?;
        for k in &then {
            if puts.contains(k) || deleted(&dels, k) {
                return Err(KvError::DuplicateKey);
            }
        }
        for k in &other {
            if (puts.contains(k) && !then.contains(k)) || deleted(&dels, k) {
                return Err(KvError::DuplicateKey);
            }
        }
        puts.extend(then);
        puts.extend(other);
        dels.extend(then_dels);
        dels.extend(else_dels);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || deleted(&dels, &p.key) {
            return Err(KvError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// Bytes of keys, values and range ends in a request (what
/// [`kv::MAX_REQUEST_BYTES`] bounds).
pub fn request_bytes(op: &RequestOp) -> usize {
    match op {
        RequestOp::Range(r) => r.key.len() + r.range_end.len(),
        RequestOp::Put(p) => p.key.len() + p.value.len(),
        RequestOp::DeleteRange(d) => d.key.len() + d.range_end.len(),
        RequestOp::Txn(t) => {
            let compares: usize = t
                .compare
                .iter()
                .map(|c| {
                    let v = match &c.target {
                        kv::CompareTarget::Value(v) => v.len(),
                        _ => 8,
                    };
                    c.key.len() + c.range_end.len() + v
                })
                .sum();
            compares
                + t.success
                    .iter()
                    .chain(&t.failure)
                    .map(request_bytes)
                    .sum::<usize>()
        }
    }
}

/// Whether a request changes nothing wherever its comparisons lead (only
/// ranges, in every branch): etcd serves such a transaction as a read.
pub fn is_read_only(op: &RequestOp) -> bool {
    match op {
        RequestOp::Range(_) => true,
        RequestOp::Put(_) | RequestOp::DeleteRange(_) => false,
        RequestOp::Txn(t) => t.success.iter().chain(&t.failure).all(is_read_only),
    }
}

/// Whether a request adds data (a put anywhere in it): refused while the
/// disk-space alarm is raised ([`crate::space`]).
pub fn adds_data(op: &RequestOp) -> bool {
    match op {
        RequestOp::Put(_) => true,
        RequestOp::Range(_) | RequestOp::DeleteRange(_) => false,
        RequestOp::Txn(t) => t.success.iter().chain(&t.failure).any(adds_data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::{DeleteRangeRequest, PutRequest};

    fn put(k: &str) -> RequestOp {
        RequestOp::Put(PutRequest {
            key: k.into(),
            value: b"v".to_vec(),
            ..PutRequest::default()
        })
    }

    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp::DeleteRange(DeleteRangeRequest {
            key: k.into(),
            range_end: end.into(),
            prev_kv: false,
        })
    }

    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> RequestOp {
        RequestOp::Txn(TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        })
    }

    #[test]
    fn requests_are_checked_as_etcd_checks_them() {
        assert_eq!(check_request(&put("")), Err(KvError::EmptyKey));
        assert_eq!(check_request(&put("a\0\n\x7f")), Ok(()), "any bytes");
        let long = "k".repeat(MAX_KEY + 1);
        assert_eq!(check_request(&put(&long)), Err(KvError::RequestTooLarge));
        let ignore = RequestOp::Put(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ignore_value: true,
            ..PutRequest::default()
        });
        assert_eq!(check_request(&ignore), Err(KvError::ValueProvided));
        let lease = RequestOp::Put(PutRequest {
            key: b"k".to_vec(),
            lease: 5,
            ignore_lease: true,
            ..PutRequest::default()
        });
        assert_eq!(check_request(&lease), Err(KvError::LeaseProvided));
        let many = txn(
            (0..=kv::MAX_TXN_OPS)
                .map(|i| put(&format!("k{i}")))
                .collect(),
            vec![],
        );
        assert_eq!(check_request(&many), Err(KvError::TooManyOps));
        let enough = txn(
            (0..kv::MAX_TXN_OPS)
                .map(|i| put(&format!("k{i}")))
                .collect(),
            vec![],
        );
        assert_eq!(check_request(&enough), Ok(()));
        let big: Vec<RequestOp> = (0..3)
            .map(|i| {
                RequestOp::Put(PutRequest {
                    key: format!("k{i}").into_bytes(),
                    value: vec![0; MAX_VALUE],
                    ..PutRequest::default()
                })
            })
            .collect();
        assert_eq!(
            check_request(&txn(big, vec![])),
            Err(KvError::RequestTooLarge)
        );
    }

    #[test]
    fn a_key_changed_twice_in_a_branch_is_a_duplicate() {
        let dup = |t: RequestOp| check_request(&t) == Err(KvError::DuplicateKey);
        assert!(dup(txn(vec![put("a"), put("a")], vec![])));
        assert!(dup(txn(vec![del("a", "c"), put("b")], vec![])));
        assert!(dup(txn(
            vec![put("b"), txn(vec![put("b")], vec![])],
            vec![]
        )));
        assert!(dup(txn(
            vec![del("a", ""), txn(vec![], vec![put("a")])],
            vec![]
        )));
        // Different branches, and a nested transaction's two branches.
        assert!(!dup(txn(vec![put("a")], vec![put("a")])));
        assert!(!dup(txn(vec![txn(vec![put("a")], vec![put("a")])], vec![])));
        assert!(!dup(txn(vec![del("a", ""), put("b")], vec![])));
        // Deletes may overlap each other.
        assert!(!dup(txn(vec![del("a", "c"), del("b", "d")], vec![])));
    }
}
