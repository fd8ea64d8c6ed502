//! The users' time-budgeted campaigns: kvstore's fault campaigns and
//! raftkv's determinism campaign (the journal's own are in `main.rs`).

use crate::{cargo, run_tests};

/// `cargo xtask kv-faults --minutes N`: kvstore's fault campaigns for N
/// minutes in all — half the I/O-fault campaign (a write, sync or read of
/// the data file or the double-write area failing anywhere, then a crash
/// and a reopen), a quarter the hostile and crafted pages, a quarter the
/// crash campaign. Built with the `fuzz` profile (release, overflow checks
/// and debug assertions). Each prints its cases and failures.
pub(crate) fn kv_faults(minutes: f64) -> Result<(), String> {
    let secs = minutes * 60.0;
    for (what, test, var, share) in [
        (
            "kvstore I/O-fault campaign",
            "io_faults",
            "KVSTORE_IOFAULT_SECONDS",
            0.5,
        ),
        (
            "kvstore hostile and crafted pages",
            "hostile",
            "JOURNAL_FUZZ_SECONDS",
            0.25,
        ),
        (
            "kvstore crash campaign",
            "crash",
            "KVSTORE_CRASH_SECONDS",
            0.25,
        ),
    ] {
        let mut cmd = cargo();
        cmd.args([
            "test",
            "--profile",
            "fuzz",
            "--package",
            "kvstore",
            "--test",
            test,
            "--",
            "--nocapture",
        ]);
        cmd.env(var, (secs * share).to_string());
        run_tests(what, &mut cmd)?;
    }
    Ok(())
}

/// `cargo xtask raft-determinism --minutes N`: raftkv's determinism
/// campaign — logs from new seeds, each applied by three processes
/// grouped three ways, their answers, versions, hashes and stores
/// compared byte for byte — for N minutes. Built with the `fuzz` profile;
/// prints the logs applied and the failures.
pub(crate) fn raft_determinism(minutes: f64) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--profile",
        "fuzz",
        "--package",
        "raftkv",
        "--test",
        "determinism",
        "logs_from_many_seeds_apply_alike",
        "--",
        "--exact",
        "--nocapture",
    ]);
    cmd.env("RAFTKV_DETERMINISM_SECONDS", (minutes * 60.0).to_string());
    run_tests("raftkv determinism campaign", &mut cmd)
}
