//! Recovery: the journal's transactions written home at mount.

use super::*;

/// Replays the journal into the image; returns what it did and the next
/// transaction id.
pub(super) fn replay(
    journal: &Journal,
    image: &dyn VfsFile,
    sb: &Super,
) -> Result<(MountReport, u64)> {
    let mut txns = Vec::new();
    for r in journal.read_from(journal.redo_lsn())? {
        let (_, bytes) = r?;
        txns.push(txn::decode(&bytes)?);
    }
    let mut report = MountReport {
        transactions: txns.len() as u64,
        ..MountReport::default()
    };
    // A block's image is replayed unless a transaction at or after it
    // revoked the block (jbd2's revoke table).
    let mut revoked_at: HashMap<u32, u64> = HashMap::new();
    for t in &txns {
        for &b in &t.revoked {
            let e = revoked_at.entry(b).or_insert(t.tid);
            *e = (*e).max(t.tid);
        }
    }
    let mut next_tid = 1;
    for t in &txns {
        for (b, img) in &t.blocks {
            if *b >= sb.blocks {
                return Err(Error::Corrupt(format!(
                    "transaction {} logs block {b}",
                    t.tid
                )));
            }
            if revoked_at.get(b).is_some_and(|&r| r >= t.tid) {
                report.blocks_revoked += 1;
                continue;
            }
            image.write_at(img, *b as u64 * BLOCK as u64)?;
            report.blocks_replayed += 1;
        }
        next_tid = next_tid.max(t.tid + 1);
    }
    if !txns.is_empty() {
        // The image holds everything now: flush it and move the tail.
        journal.checkpoint(journal.appended_lsn())?;
    }
    Ok((report, next_tid))
}
