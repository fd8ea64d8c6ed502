//! The end of a run: every live member's etcd `HashKV` at one revision,
//! compared — the consistency check etcd's operators run, here after
//! every fault.
//!
//! The revision is the leader's current one once the final reads are
//! done (no client writes any more): every revision a member applied was
//! committed, so every live member reaches it. Each member is asked
//! `HashKV` at it over etcd's gRPC API until it has applied that far
//! (bounded). As etcd compares them, the answer is the pair (hash,
//! compaction revision): two members' hashes at one revision are equal
//! when their stores hold the same versions since the same compaction.

use super::cluster::ProcCluster;
use etcd_api::etcdserverpb as pb;
use pb::maintenance_client::MaintenanceClient;
use std::time::Duration;
use tokio::time::Instant;

/// One member's answer to `HashKV` at the common revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberHash {
    /// The member's index (node `node + 1`).
    pub node: usize,
    /// The hash of its store's versions up to the revision.
    pub hash: u32,
    /// The revision its store was compacted at.
    pub compact_revision: i64,
}

/// How many members disagree with the answer most of them gave (the
/// first such answer when there is a tie): 0 when every (hash,
/// compaction revision) is equal.
pub fn mismatches(hashes: &[MemberHash]) -> usize {
    let key = |h: &MemberHash| (h.hash, h.compact_revision);
    let most = hashes
        .iter()
        .map(|h| hashes.iter().filter(|o| key(o) == key(h)).count())
        .max()
        .unwrap_or(0);
    hashes.len() - most
}

/// Asks every member in `members` for `HashKV` at the current revision of
/// `leader`, each until it has applied that far, `within` in all; the
/// revision and the answers. An error if a member gave none in time (a
/// cluster that did not recover).
pub async fn collect(
    c: &ProcCluster,
    members: &[usize],
    leader: usize,
    within: Duration,
) -> Result<(i64, Vec<MemberHash>), String> {
    let until = Instant::now() + within;
    let at = hash_kv_until(c, leader, 0, until)
        .await?
        .header
        .map_or(0, |h| h.revision);
    let mut out = Vec::new();
    for &i in members {
        let r = hash_kv_until(c, i, at, until).await?;
        out.push(MemberHash {
            node: i,
            hash: r.hash,
            compact_revision: r.compact_revision,
        });
    }
    Ok((at, out))
}

/// The events that say what [`collect`] found, and the number of members
/// that disagree.
pub fn describe(at: i64, hashes: &[MemberHash]) -> (Vec<String>, usize) {
    let each: Vec<String> = hashes
        .iter()
        .map(|h| {
            format!(
                "node {} hash {:08x} compact {}",
                h.node + 1,
                h.hash,
                h.compact_revision
            )
        })
        .collect();
    let bad = mismatches(hashes);
    let verdict = if bad == 0 { "equal" } else { "HASH MISMATCH" };
    let line = format!("HashKV at revision {at}: {}: {verdict}", each.join(", "));
    (vec![line], bad)
}

/// `HashKV` at `revision` (0: the current one) from node `i`, asked again
/// every 50 ms (a member not yet at the revision answers that it is in
/// the future; a restarted one may not listen yet) until `until`.
async fn hash_kv_until(
    c: &ProcCluster,
    i: usize,
    revision: i64,
    until: Instant,
) -> Result<pb::HashKvResponse, String> {
    let addr = &c.nodes[i].cmd.addr;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("node {}: {e}", i + 1))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let mut client = MaintenanceClient::new(channel);
    loop {
        let last = match client.hash_kv(pb::HashKvRequest { revision }).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) => format!("{:?}: {}", s.code(), s.message()),
        };
        if Instant::now() >= until {
            return Err(format!(
                "node {}: no HashKV at revision {revision} in time: {last}",
                i + 1
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(node: usize, hash: u32, compact_revision: i64) -> MemberHash {
        MemberHash {
            node,
            hash,
            compact_revision,
        }
    }

    #[test]
    fn equal_answers_are_no_mismatch() {
        assert_eq!(mismatches(&[h(0, 7, 3), h(1, 7, 3), h(2, 7, 3)]), 0);
        assert_eq!(mismatches(&[h(0, 7, 3), h(2, 7, 3)]), 0);
        assert_eq!(mismatches(&[]), 0);
        let (said, bad) = describe(12, &[h(0, 0xab, 0), h(1, 0xab, 0)]);
        assert_eq!(bad, 0);
        assert_eq!(
            said,
            ["HashKV at revision 12: node 1 hash 000000ab compact 0, node 2 hash 000000ab compact 0: equal"]
        );
    }

    #[test]
    fn a_different_hash_or_compaction_is_a_mismatch() {
        assert_eq!(mismatches(&[h(0, 7, 3), h(1, 8, 3), h(2, 7, 3)]), 1);
        // The same hash after another compaction is not the same store.
        assert_eq!(mismatches(&[h(0, 7, 3), h(1, 7, 3), h(2, 7, 4)]), 1);
        assert_eq!(mismatches(&[h(0, 7, 3), h(1, 8, 3)]), 1);
        assert_eq!(mismatches(&[h(0, 1, 0), h(1, 2, 0), h(2, 3, 0)]), 2);
        let (said, bad) = describe(5, &[h(0, 1, 0), h(2, 2, 0)]);
        assert_eq!(bad, 1);
        assert!(said[0].ends_with("HASH MISMATCH"), "{said:?}");
    }
}
