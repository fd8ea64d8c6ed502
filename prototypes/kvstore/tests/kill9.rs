//! kill -9 of a `kvstore bench` process mid-run: every put it reported
//! committed is in the reopened store with its value, and `check` finds
//! the pages sound.

use kvstore::{bench_value, Options, Store};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

#[test]
fn every_committed_put_survives_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let mut committed: Vec<(usize, u64)> = Vec::new();
    for (round, kill_after) in [150usize, 700, 2500].into_iter().enumerate() {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvstore"))
            .args(["bench", dir.to_str().unwrap(), "--print-commits", "--quiet"])
            .args(["--clients", "4", "--seconds", "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kvstore");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let parse = |l: String| -> (usize, u64) {
            let mut f = l.split(' ');
            (
                f.next().unwrap().parse().unwrap(),
                f.next().unwrap().parse().unwrap(),
            )
        };
        for _ in 0..kill_after {
            let l = lines.next().expect("the bench stopped early").unwrap();
            committed.push(parse(l));
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "round {round}: killed mid-run");
        committed.extend(lines.map_while(Result::ok).map(parse));
        let s = Store::open(&dir, Options::default()).expect("reopen after kill -9");
        for &(c, n) in &committed {
            let k = format!("c{c:03}-{n:010}").into_bytes();
            assert_eq!(
                s.get(&k).unwrap(),
                Some(bench_value(&k, 100)),
                "round {round}: committed put {c} {n} lost"
            );
        }
        assert!(s.check().unwrap().is_empty());
        s.close().unwrap();
        // The next round's bench overwrites the same keys with the same
        // values: still committed.
    }
}
