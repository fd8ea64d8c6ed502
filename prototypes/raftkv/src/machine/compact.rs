//! The physical compaction: once a compaction at revision C is applied
//! (reads below C refused at once), the versions it supersedes are
//! removed, a bounded number after each entry.
//!
//! It walks the versions in revision order from where it stopped up to
//! C. A version V at or below C supersedes the one before it (V's
//! `prev`), which goes; a deletion below C goes too, and so does its
//! key's index entry if the deletion is still the key's latest. What
//! stays below C is each key's latest version at or below C that is a
//! put — and the deletions at exactly C, so that a watch from C still
//! sees every change at C (those are removed by the next compaction, whose
//! walk begins at C again). A version of C whose `prev` was already
//! removed (a deletion a compaction removed before the key came back)
//! deletes nothing.
//!
//! How much an entry compacts depends on the entry alone —
//! [`COMPACT_PER_ENTRY`] versions, and twice as many more as the entry
//! wrote, so that a compaction keeps ahead of the writes — and it reads
//! the store through the step's writer, so what it removes is the same
//! however entries are grouped into steps: a pure function of the log.
//! The walk's position and the compaction done are in `m/mvcc`, written
//! in the same transaction.

use super::mvcc::{self, Position};
use super::view::View;
use super::writer::Writer;
use super::{corrupt, Error, State};

/// Versions the physical compaction looks at after each entry, at least
/// (an entry with no command but the clock: [`crate::Command::CompactProgress`]).
pub const COMPACT_PER_ENTRY: usize = 1024;

/// Goes on with the physical compaction after an entry that wrote
/// `written` versions; the versions it looked at.
pub(super) fn compact_some(
    w: &mut Writer<'_>,
    st: &mut State,
    written: usize,
) -> Result<usize, Error> {
    let target = st.mvcc.compact;
    if st.mvcc.physical >= target {
        return Ok(0);
    }
    let mut budget = COMPACT_PER_ENTRY.saturating_add(written.saturating_mul(2));
    let to = mvcc::record_key(Position::at(target.saturating_add(1)));
    let mut seen = 0;
    while budget > 0 {
        let from = mvcc::record_key(st.mvcc.cursor);
        let chunk = w.scan(&from, &to, budget.min(256))?;
        if chunk.is_empty() {
            // Every version up to the target looked at: done. The next
            // compaction walks from the target's first version again
            // (its deletions stayed).
            st.mvcc.physical = target;
            st.mvcc.cursor = Position::at(target);
            break;
        }
        for (k, v) in chunk {
            let p =
                mvcc::record_position(&k).ok_or_else(|| corrupt("a version key is malformed"))?;
            let (rec, _) =
                mvcc::decode_record(&v).ok_or_else(|| corrupt("a version record is malformed"))?;
            if let Some(prev) = rec.prev {
                w.delete(mvcc::record_key(prev));
            }
            if !rec.put && p.revision < target {
                w.delete(k);
                let index = mvcc::index_key(&rec.key);
                let latest = match w.get(&index)? {
                    Some(e) => {
                        mvcc::decode_index(&e)
                            .ok_or_else(|| corrupt("an index entry is malformed"))?
                            .latest
                    }
                    None => Position::default(),
                };
                if latest == p {
                    w.delete(index);
                }
            }
            st.mvcc.cursor = p.next();
            w.work += 1;
            seen += 1;
            budget -= 1;
        }
    }
    Ok(seen)
}
