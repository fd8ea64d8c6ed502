//! The fault matrix's short pass ([`raftkv_tools::faults`]): every fault once
//! with all three members and once with one member down, against real
//! `raftkv serve` processes, the clients through etcd's gRPC API, each
//! run's every key checked for linearizability (no violation, nothing
//! undecided) and its watch streams checked (no violation, every watcher
//! sent everything up to the final revision), each run with acknowledged
//! writes and watch events, and each fault seen to happen. Needs the
//! `failpoints` feature (`cargo test -p raftkv --features failpoints
//! --test faults`; `cargo xtask test` runs it); `cargo xtask raft-faults
//! --minutes N` runs random seeds for a time budget. The lagging follower,
//! run by name only, is run here at its small scale, before or after the
//! matrix (never beside it).

use raftkv_tools::faults::{campaign, run_case, table, Api, Campaign, Fault, Params};

/// The two tests one after the other: each loads the machine's two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_with_all_members_and_with_one_down_stays_linearizable() {
    let _serial = SERIAL.lock().await;
    let out = tempfile::tempdir().unwrap();
    let c = Campaign {
        exe: env!("CARGO_BIN_EXE_raftkv").into(),
        faults: Fault::ALL.to_vec(),
        runs: 1,
        budget: None,
        seed: 20_261_203,
        params: Params::short(),
        out: out.path().to_path_buf(),
    };
    assert_eq!(c.params.api, Api::Grpc);
    let (reports, errors) = campaign(&c).await;
    println!("{}", table(&reports));
    assert!(errors.is_empty(), "runs that did not finish: {errors:#?}");
    assert_eq!(reports.len(), 2 * Fault::ALL.len());
    let mut bad = Vec::new();
    for r in &reports {
        let name = format!(
            "{} ({} of 3, seed {})",
            r.fault.name(),
            if r.degraded { 2 } else { 3 },
            r.seed
        );
        if !r.passed() {
            bad.push(format!(
                "{name}: {} violations, {} undecided, {} HashKV mismatches, {} watch violations: {:#?}\n{:#?}\n{:#?}",
                r.violations,
                r.undecided,
                r.hash_mismatches,
                r.watch_violations,
                r.events,
                r.watch_bad,
                r.bad_histories
            ));
        }
        // The watchers were sent the run's changes (each of the three
        // every acknowledged write, but for what a compaction that
        // passed one may have taken).
        if r.watch_events < r.acked_writes {
            bad.push(format!(
                "{name}: {} watch events for {} acknowledged writes",
                r.watch_events, r.acked_writes
            ));
        }
        // Every live member's HashKV was compared at the end.
        if !r.events.iter().any(|e| e.contains("HashKV at revision")) {
            bad.push(format!("{name}: no HashKV comparison in the events"));
        }
        // A run must have done something: its load goes on after the
        // last heal until 25 writes were acknowledged (bounded by
        // MIN_ACKED_WAIT), so fewer is a cluster that did not recover.
        if r.acked_writes < c.params.min_acked {
            bad.push(format!(
                "{name}: only {} acknowledged writes",
                r.acked_writes
            ));
        }
        if r.ops_in_fault == 0 {
            bad.push(format!("{name}: no operation overlapped the fault"));
        }
        if r.fault == Fault::ReplaceMember && !r.events.iter().any(|e| e.contains("replaced by")) {
            bad.push(format!("{name}: no member was replaced: {:#?}", r.events));
        }
        if r.fault.ends_the_node() && !r.events.iter().any(|e| e.contains("exited")) {
            bad.push(format!(
                "{name}: the node hit did not exit: {:#?}",
                r.events
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stopped_through_a_large_load_catches_up_in_bounded_memory() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let p = Params::short();
    assert!(Fault::parse("lagging-follower") == Some(Fault::LaggingFollower));
    assert!(!Fault::ALL.contains(&Fault::LaggingFollower));
    let r = run_case(
        env!("CARGO_BIN_EXE_raftkv").as_ref(),
        dir.path(),
        Fault::LaggingFollower,
        false,
        20_261_207,
        &p,
    )
    .await
    .unwrap_or_else(|e| panic!("the run did not finish: {e}"));
    let l = r.lag.as_ref().expect("a lagging-follower report");
    println!("{}", raftkv_tools::faults::lag::summary(l));
    assert!(
        l.catch_up_s.is_some(),
        "not caught up within {} s: {:#?}",
        l.bound_s,
        r.events
    );
    assert!(
        l.worst_rss_mib() <= p.lag.rss_limit_mib,
        "{} MiB",
        l.worst_rss_mib()
    );
    assert!(r.passed(), "{:#?}\n{:#?}", r.events, r.bad_histories);
    // It was behind by what it was asked, and the memory was sampled.
    assert!(l.bytes_behind >= p.lag.behind_bytes, "{}", l.bytes_behind);
    assert!(l.entries_behind > 0);
    assert_eq!(l.peak_rss_mib.len(), 3);
    assert!(l.peak_rss_mib.iter().chain(&l.hwm_mib).all(|&m| m > 0.0));
    assert!(
        r.acked_writes >= 50,
        "only {} acknowledged writes",
        r.acked_writes
    );
    // At this scale it is caught up by appends (no snapshot by bytes
    // below 64 MiB), each within the leader's byte budget.
    assert_eq!(l.snapshot_installs, 0);
    assert!(
        l.largest_append_bytes <= (raftkv::network::APPEND_BUDGET + 64 * 1024) as u64,
        "an append of {} bytes",
        l.largest_append_bytes
    );
}
