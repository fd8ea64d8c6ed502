//! A linearizability checker for the history of one key (a register).
//!
//! The failover tests record, for every client operation, when it was
//! invoked and when it completed (or that it never completed: a write
//! without an answer may or may not have happened) and what it wrote or
//! read. [`check`] searches for a linearization — a total order of the
//! operations, each placed between its invocation and its completion, in
//! which every read returns the last value written before it — with the
//! Wing–Gong–Lowe backtracking search, memoized on the set of operations
//! placed and the register's value. A write without an answer may be
//! placed anywhere after its invocation, or left out.
//!
//! [`watch`] checks the watch streams recorded beside such a history.

pub mod watch;

use std::collections::HashSet;

/// What an operation did.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Wrote the value (`None`: deleted the key).
    Write(Option<Vec<u8>>),
    /// Read the value (`None`: the key was absent).
    Read(Option<Vec<u8>>),
    /// Compare-and-set: if the value was `expect`, wrote `write`.
    /// `succeeded` is what the answer said (`None`: no answer — then it may
    /// have taken effect, if the value was `expect`, or not at all). With
    /// every value written unique, a comparison of revisions is one of
    /// values: the key holds the revision read exactly while it holds the
    /// value read.
    Cas {
        /// The value compared with (`None`: the key absent).
        expect: Option<Vec<u8>>,
        /// The value written if it held (`None`: the key deleted).
        write: Option<Vec<u8>>,
        /// Whether the answer said it held.
        succeeded: Option<bool>,
    },
}

impl Kind {
    /// Whether the operation may come next with the register at `value`,
    /// and the value it leaves.
    fn step(&self, value: &Option<Vec<u8>>) -> Option<Option<Vec<u8>>> {
        match self {
            Kind::Write(w) => Some(w.clone()),
            Kind::Read(r) => (r == value).then(|| value.clone()),
            Kind::Cas {
                expect,
                write,
                succeeded,
            } => match succeeded {
                // Unanswered: placed only where it takes effect (placed
                // where it fails, it is the same as left out).
                Some(true) | None => (expect == value).then(|| write.clone()),
                Some(false) => (expect != value).then(|| value.clone()),
            },
        }
    }
}

/// One operation on the key.
#[derive(Debug, Clone)]
pub struct Op {
    /// When it was invoked (any monotonic clock, in the same unit for all).
    pub invoked: u64,
    /// When its answer arrived; `None` for a write without an answer.
    pub completed: Option<u64>,
    /// What it did.
    pub kind: Kind,
}

/// Why a history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The operations the longest linearization found could place.
    pub placed: usize,
    /// The operations that had to be placed (the answered ones).
    pub required: usize,
}

/// What a bounded check concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A linearization exists.
    Linearizable,
    /// None exists: the search was exhausted.
    Violation(Violation),
    /// The search used its whole budget of steps without an answer.
    Undecided {
        /// The steps taken.
        steps: u64,
    },
}

/// Checks that `ops` (on one key, initially absent) are linearizable.
/// Reads without an answer must be left out by the caller.
pub fn check(ops: &[Op]) -> Result<(), Violation> {
    match check_bounded(ops, u64::MAX) {
        Verdict::Linearizable => Ok(()),
        Verdict::Violation(v) => Err(v),
        Verdict::Undecided { .. } => unreachable!("an unbounded search always decides"),
    }
}

/// [`check`] within `budget` search steps (a placement or a backtrack
/// each): a history of many concurrent writes without answers — a
/// partition's — can make the search exponential, and a fault campaign
/// must report such a key as undecided, apart from a violation, instead
/// of running without end.
pub fn check_bounded(ops: &[Op], budget: u64) -> Verdict {
    let mut ops: Vec<&Op> = ops.iter().collect();
    ops.sort_by_key(|o| o.invoked);
    let n = ops.len();
    let required = ops.iter().filter(|o| o.completed.is_some()).count();
    let words = n.div_ceil(64);
    let mut placed = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, Option<Vec<u8>>)> = HashSet::new();
    let mut best = 0;
    // Iterative depth-first search: a stack of (op placed, value before).
    let mut stack: Vec<(usize, Option<Vec<u8>>)> = Vec::new();
    let mut value: Option<Vec<u8>> = None;
    let mut done_required = 0;
    let mut start = 0;
    let mut steps: u64 = 0;
    loop {
        if done_required == required {
            return Verdict::Linearizable;
        }
        if steps >= budget {
            return Verdict::Undecided { steps };
        }
        steps += 1;
        // The earliest completion among operations not yet placed: an
        // operation invoked after it cannot come next.
        let horizon = (0..n)
            .filter(|&i| placed[i / 64] & (1 << (i % 64)) == 0)
            .filter_map(|i| ops[i].completed)
            .min()
            .unwrap_or(u64::MAX);
        let mut next = None;
        for i in start..n {
            if placed[i / 64] & (1 << (i % 64)) != 0 {
                continue;
            }
            if ops[i].invoked > horizon {
                break;
            }
            let Some(new_value) = ops[i].kind.step(&value) else {
                continue;
            };
            let mut after = placed.clone();
            after[i / 64] |= 1 << (i % 64);
            if seen.insert((after, new_value)) {
                next = Some(i);
                break;
            }
        }
        match next {
            Some(i) => {
                placed[i / 64] |= 1 << (i % 64);
                let before = value.clone();
                if let Some(v) = ops[i].kind.step(&value) {
                    value = v;
                }
                if ops[i].completed.is_some() {
                    done_required += 1;
                }
                stack.push((i, before));
                best = best.max(stack.len());
                start = 0;
            }
            None => {
                // Backtrack: undo the last placement, try the ones after it.
                let Some((i, before)) = stack.pop() else {
                    return Verdict::Violation(Violation {
                        placed: best,
                        required,
                    });
                };
                placed[i / 64] &= !(1 << (i % 64));
                value = before;
                if ops[i].completed.is_some() {
                    done_required -= 1;
                }
                start = i + 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(invoked: u64, completed: Option<u64>, v: &str) -> Op {
        Op {
            invoked,
            completed,
            kind: Kind::Write(Some(v.as_bytes().to_vec())),
        }
    }

    fn r(invoked: u64, completed: u64, v: Option<&str>) -> Op {
        Op {
            invoked,
            completed: Some(completed),
            kind: Kind::Read(v.map(|v| v.as_bytes().to_vec())),
        }
    }

    #[test]
    fn sequential_and_concurrent_histories_pass() {
        assert!(check(&[r(0, 1, None), w(2, Some(3), "a"), r(4, 5, Some("a"))]).is_ok());
        // A read concurrent with a write may see either value.
        assert!(check(&[w(0, Some(10), "a"), r(1, 2, Some("a")), r(3, 4, None)]).is_err());
        assert!(check(&[w(0, Some(10), "a"), r(1, 2, None), r(3, 4, Some("a"))]).is_ok());
        // Two concurrent writes, reads that order them.
        let h = [
            w(0, Some(5), "a"),
            w(1, Some(6), "b"),
            r(7, 8, Some("b")),
            r(9, 10, Some("b")),
        ];
        assert!(check(&h).is_ok());
    }

    #[test]
    fn a_stale_read_fails() {
        // "a" then "b" acknowledged one after the other; a later read of
        // "a" is stale.
        let h = [w(0, Some(1), "a"), w(2, Some(3), "b"), r(4, 5, Some("a"))];
        assert_eq!(
            check(&h),
            Err(Violation {
                placed: 2,
                required: 3
            })
        );
    }

    #[test]
    fn a_lost_write_and_a_phantom_value_fail() {
        // An acknowledged write that a later read does not see.
        assert!(check(&[w(0, Some(1), "a"), r(2, 3, None)]).is_err());
        // A value nobody wrote.
        assert!(check(&[w(0, Some(1), "a"), r(2, 3, Some("z"))]).is_err());
    }

    #[test]
    fn a_search_over_its_budget_is_undecided_not_a_verdict() {
        // Twelve writes without answers, then a read of none of them: the
        // search must try every subset before it can say "violation".
        let mut h: Vec<Op> = (0..12).map(|i| w(i, None, &format!("v{i}"))).collect();
        h.push(r(100, 101, Some("never")));
        assert!(matches!(
            check_bounded(&h, 50),
            Verdict::Undecided { steps: 50 }
        ));
        assert!(matches!(check_bounded(&h, u64::MAX), Verdict::Violation(_)));
        let ok = [w(0, Some(1), "a"), r(2, 3, Some("a"))];
        assert_eq!(check_bounded(&ok, 10), Verdict::Linearizable);
    }

    fn cas(
        invoked: u64,
        completed: Option<u64>,
        expect: Option<&str>,
        v: &str,
        ok: Option<bool>,
    ) -> Op {
        Op {
            invoked,
            completed,
            kind: Kind::Cas {
                expect: expect.map(|e| e.as_bytes().to_vec()),
                write: Some(v.as_bytes().to_vec()),
                succeeded: ok,
            },
        }
    }

    #[test]
    fn compare_and_set_is_checked() {
        // Sequential: a CAS from the value read wins; one from an old value fails.
        let h = [
            w(0, Some(1), "a"),
            cas(2, Some(3), Some("a"), "b", Some(true)),
            cas(4, Some(5), Some("a"), "c", Some(false)),
            r(6, 7, Some("b")),
        ];
        assert!(check(&h).is_ok());
        // Two concurrent CASes from the same value cannot both win.
        let both = [
            w(0, Some(1), "a"),
            cas(2, Some(10), Some("a"), "b", Some(true)),
            cas(3, Some(11), Some("a"), "c", Some(true)),
        ];
        assert!(check(&both).is_err());
        // A CAS that says it failed while the value was what it expected.
        assert!(check(&[
            w(0, Some(1), "a"),
            cas(2, Some(3), Some("a"), "b", Some(false))
        ])
        .is_err());
        // A win over an absent key, and a failure once it exists.
        let h = [
            cas(0, Some(1), None, "a", Some(true)),
            cas(2, Some(3), None, "b", Some(false)),
            r(4, 5, Some("a")),
        ];
        assert!(check(&h).is_ok());
        // Unanswered: either it took effect (only from its expected value) or not.
        let h = [
            w(0, Some(1), "a"),
            cas(2, None, Some("a"), "b", None),
            r(5, 6, Some("b")),
        ];
        assert!(check(&h).is_ok());
        let h = [
            w(0, Some(1), "x"),
            cas(2, None, Some("a"), "b", None),
            r(5, 6, Some("b")),
        ];
        assert!(check(&h).is_err());
    }

    #[test]
    fn an_unanswered_write_may_or_may_not_happen() {
        assert!(check(&[w(0, None, "a"), r(5, 6, None)]).is_ok());
        assert!(check(&[w(0, None, "a"), r(5, 6, Some("a"))]).is_ok());
        // ...but once seen it cannot be unseen.
        assert!(check(&[w(0, None, "a"), r(5, 6, Some("a")), r(7, 8, None)]).is_err());
    }
}
