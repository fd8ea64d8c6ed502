//! kill -9: a child process commits in a loop and reports each acknowledged
//! LSN on a pipe; the parent kills it at random moments, reopens the
//! journal, and finds every acknowledged record.
#![cfg(not(loom))]

use journal_core::vfs::SplitMix64;
use journal_core::{Journal, Lsn};
use journal_tests::{payload, small_options, verify};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

#[test]
fn every_acknowledged_record_survives_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let mut rng = SplitMix64::new(0x9);
    let mut acked: Vec<(Lsn, Vec<u8>)> = Vec::new();
    for round in 0..4u8 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_journal-child"))
            .arg(&dir)
            .arg((round + 1).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let out = child.stdout.take().unwrap();
        let kill_after = rng.range(20, 400);
        let mut lines = BufReader::new(out).lines();
        for _ in 0..kill_after {
            let line = lines
                .next()
                .expect("the child stopped early")
                .expect("read the pipe");
            let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
            acked.push((Lsn(f[0]), payload(f[1] as u8, f[2] as u32, f[3] as usize)));
        }
        child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
        let status = child.wait().unwrap();
        // The child commits forever: it can only have ended by our SIGKILL,
        // mid-work (a child that exited on its own would test nothing).
        assert_eq!(status.signal(), Some(9), "round {round}: {status:?}");
        // Lines the child printed before dying were acknowledged too.
        for line in lines.map_while(Result::ok) {
            let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
            acked.push((Lsn(f[0]), payload(f[1] as u8, f[2] as u32, f[3] as usize)));
        }
        let j = Journal::open(&dir, small_options()).expect("reopen after kill -9");
        verify(&j, &acked, &format!("kill -9 round {round}"));
    }
}
