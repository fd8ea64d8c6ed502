//! The `journal` command on small journals: dump, verify, stat on clean,
//! torn and corrupted journals; every error path; the bench in smoke mode.
//! No timing assertions anywhere.

use journal_core::{Journal, Lsn, Options};

use journal_core::format::segment_name;
use std::path::Path;
use std::process::{Command, Output};

const SEG: u64 = 64 << 10;

fn options() -> Options {
    Options {
        segment_size: SEG,
        logbufs: 4,
        logbsize: 16 << 10,
        ..Options::default()
    }
}

fn journal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_journal"))
        .args(args)
        .output()
        .expect("run journal")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A journal with `n` committed records, closed; returns their LSNs.
fn make(dir: &Path, n: u32) -> Vec<Lsn> {
    make_and(dir, n, true)
}

/// A journal with `n` committed records, closed or left as a crash would
/// leave it (no durable end recorded: a damaged last record then reads as
/// a torn one); returns their LSNs.
fn make_and(dir: &Path, n: u32, close: bool) -> Vec<Lsn> {
    // No batching wait: a commit made beside an open handle goes at once.
    let options = Options {
        batch_policy: journal_core::BatchPolicy::None,
        ..options()
    };
    let j = Journal::open(dir, options).unwrap();
    // Every other record is committed while another commit is open, so its
    // commit is staged: it goes out plain, made durable by a flush after
    // it. The rest are lone commits, one FUA write each, and the last is
    // forced, so it goes out FUA too.
    let lsns = (0..n)
        .map(|i| {
            let record = format!("record {i:04} {}", "x".repeat(600));
            if i + 1 < n && i % 2 == 0 {
                let other = j.begin_commit().unwrap();
                let lsn = j.append_durable(record.as_bytes()).unwrap();
                drop(other);
                lsn
            } else if i + 1 < n {
                j.append_durable(record.as_bytes()).unwrap()
            } else {
                let lsn = j.append(record.as_bytes()).unwrap();
                j.force_all().unwrap();
                lsn
            }
        })
        .collect();
    if close {
        j.close().unwrap();
    }
    lsns
}

/// Overwrites bytes of the log at `lsn`.
fn poke(dir: &Path, lsn: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let (seg, off) = journal_core::Geometry::new(SEG, 512).locate(journal_core::Lsn(lsn));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(segment_name(seg)))
        .unwrap();
    f.write_all_at(bytes, off).unwrap();
}

/// Every file's name and bytes, to prove a command modified nothing.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn clean_journal_dump_verify_stat() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let lsns = make(&dir, 30);
    let before = snapshot(&dir);
    let d = dir.to_str().unwrap();

    let out = journal(&["dump", d, "--entries"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert_eq!(
        s.lines().filter(|l| l.starts_with("lsn=")).count(),
        30,
        "{s}"
    );
    assert!(
        s.contains("flags=-") && s.contains("flags=FUA") && s.contains("crc=ok"),
        "{s}"
    );
    assert!(s.contains(&format!("entry lsn={}", lsns[3])), "{s}");
    assert!(s.contains("end at lsn="), "{s}");

    let out = journal(&["dump", d, "--from", &lsns[10].0.to_string(), "--limit", "5"]);
    assert_eq!(
        text(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("lsn="))
            .count(),
        5
    );

    let out = journal(&["verify", d]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("30 records"),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stderr).is_empty());

    let out = journal(&["stat", d]);
    assert!(out.status.success());
    let s = text(&out.stdout);
    for field in [
        "segments:",
        "frontier:",
        "checkpoint:",
        "last valid LSN:",
        "recyclable:",
        "preallocated:",
    ] {
        assert!(s.contains(field), "{field} missing in {s}");
    }
    assert_eq!(snapshot(&dir), before, "inspection modified the journal");
}

#[test]
fn torn_tail_is_a_warning_and_corruption_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let lsns = make_and(&dir, 200, false);
    let d = dir.to_str().unwrap();
    // Tear the last record.
    let last = lsns.last().unwrap().0 - 48;
    poke(&dir, last + 300, &[0xEE; 64]);
    let out = journal(&["verify", d]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("warning: torn tail at LSN"),
        "{}",
        text(&out.stderr)
    );
    let out = journal(&["dump", d]);
    assert!(
        text(&out.stdout).contains("crc=bad"),
        "{}",
        text(&out.stdout)
    );
    // Absolute consistency refuses the torn record.
    let out = journal(&["verify", d, "--mode", "absolute-consistency"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // Corrupt a record far from the head.
    let mid = lsns[20].0 - 48;
    poke(&dir, mid + 100, &[0x55; 8]);
    let out = journal(&["verify", d]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("corrupt log at LSN {}", Lsn(mid))),
        "{err}"
    );
}

#[test]
fn a_damaged_record_below_the_durable_end_of_a_closed_journal_is_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let lsns = make(&dir, 50);
    let last = lsns.last().unwrap().0 - 48;
    poke(&dir, last + 300, &[0xEE; 64]);
    for mode in ["tolerate-torn-tail", "absolute-consistency", "skip-corrupt"] {
        let out = journal(&["verify", dir.to_str().unwrap(), "--mode", mode]);
        assert_eq!(out.status.code(), Some(1), "{mode}");
        let err = text(&out.stderr);
        // Absolute consistency objects to the bad record itself first.
        let named = err.contains("log lost")
            || (mode == "absolute-consistency" && err.contains("corrupt log"));
        assert!(named, "{mode}: {err}");
    }
}

#[test]
fn error_paths_print_one_line_and_modify_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    for cmd in ["dump", "verify", "stat"] {
        let out = journal(&[cmd, missing.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("no such directory"), "{err}");
        assert!(!missing.exists());
    }
    // A directory that is not a journal.
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::write(plain.join("notes.txt"), b"hello").unwrap();
    for cmd in ["dump", "verify", "stat"] {
        let out = journal(&[cmd, plain.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("not a journal"), "{err}");
    }
    assert_eq!(
        snapshot(&plain),
        vec![("notes.txt".to_string(), b"hello".to_vec())]
    );
    // A newer format version.
    let dir = tmp.path().join("wal");
    make(&dir, 3);
    let mut c = std::fs::read(dir.join("control")).unwrap();
    for slot in [0usize, 512] {
        if &c[slot..slot + 4] == b"JCTL" {
            c[slot + 4..slot + 6].copy_from_slice(&9u16.to_le_bytes());
            let crc = crc32c(&c[slot..slot + 76]);
            c[slot + 76..slot + 80].copy_from_slice(&crc.to_le_bytes());
        }
    }
    std::fs::write(dir.join("control"), &c).unwrap();
    let before = snapshot(&dir);
    for cmd in ["dump", "verify", "stat"] {
        let out = journal(&[cmd, dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("version 9"), "{err}");
    }
    assert_eq!(snapshot(&dir), before);
    // Usage errors.
    assert_eq!(journal(&[]).status.code(), Some(2));
    assert_eq!(journal(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(
        journal(&["dump", dir.to_str().unwrap(), "--bogus", "1"])
            .status
            .code(),
        Some(2)
    );
}

/// CRC32C (Castagnoli), bitwise: enough for a test fixture.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn bench_smoke_runs_every_scenario_and_writes_json_and_svg() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("bench.json");
    let svg = tmp.path().join("bench.svg");
    let out = journal(&[
        "bench",
        "--smoke",
        "--scenario",
        "all",
        "--clients",
        "1,2",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let scenarios = doc["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "group-commit",
            "wt-flush-wait",
            "jbd-lone-writer",
            "pg-recycle",
            "xfs-flush-flags",
            "alignment",
            "async",
            "replay",
            "reads",
        ]
    );
    let points = scenarios[0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "one point per --clients value");
    for p in points {
        for field in [
            "commits_per_s",
            "p50_us",
            "p99_us",
            "avg_group_size",
            "syncs_per_commit",
            "limit",
            "efficiency",
        ] {
            assert!(p[field].as_f64().unwrap() > 0.0, "{field} in {p}");
        }
    }
    // The seeds' A/Bs carry their ratios; the async scenario its points.
    for s in &scenarios[1..6] {
        assert!(s["ratios"].is_object(), "{s}");
    }
    for p in scenarios[6]["points"].as_array().unwrap() {
        assert!(p["tasks"]["commits_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["threads"]["commits_per_s"].as_f64().unwrap() > 0.0, "{p}");
    }
    // Replay: both record sizes read back whole, with rates and the ratio.
    let replay = scenarios[7]["results"].as_array().unwrap();
    assert_eq!(replay.len(), 2);
    for r in replay {
        for field in [
            "recovery_mb_per_s",
            "read_from_mb_per_s",
            "plain_read_mb_per_s",
            "read_over_plain",
        ] {
            assert!(r[field].as_f64().unwrap() > 0.0, "{field} in {r}");
        }
    }
    assert_eq!(replay[1]["record_size"], 1 << 20);
    // Reads: both logs measured, every figure and ratio present.
    let reads = &scenarios[8];
    for log in ["small", "large"] {
        assert!(reads[log]["entries"].as_u64().unwrap() > 0, "{reads}");
        for field in [
            "read_at_newest_us",
            "read_at_random_us",
            "read_from_last_1000_us",
        ] {
            assert!(
                reads[log][field].as_f64().unwrap() > 0.0,
                "{field} in {reads}"
            );
        }
        assert!(reads[log]["follow"]["delivered_p50_us"].as_f64().unwrap() > 0.0);
    }
    assert!(
        reads["large_over_small"]["read_at_random"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let table = text(&out.stdout);
    assert!(
        table.contains("efficiency") && table.contains("commits/s"),
        "{table}"
    );
    // Bad arguments are refused as usage errors.
    let out = journal(&["bench", "--scenario", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("invalid value 'nope'"));
}

#[test]
fn every_command_answers_help_and_version() {
    for cmd in [
        &["--help"][..],
        &["--version"],
        &["bench", "--help"],
        &["dump", "--help"],
        &["verify", "--help"],
        &["stat", "--help"],
    ] {
        let out = journal(cmd);
        assert_eq!(out.status.code(), Some(0), "{cmd:?}: {}", text(&out.stderr));
        let s = text(&out.stdout);
        assert!(
            s.contains("Usage:") || s.starts_with("journal "),
            "{cmd:?}: {s}"
        );
    }
    let s = text(&journal(&["--version"]).stdout);
    assert_eq!(s.trim(), format!("journal {}", env!("CARGO_PKG_VERSION")));
    let s = text(&journal(&["bench", "--help"]).stdout);
    for option in [
        "--scenario",
        "--clients",
        "--batch-policy",
        "--json",
        "--smoke",
    ] {
        assert!(s.contains(option), "{option} missing in {s}");
    }
}

#[test]
fn dump_and_stat_speak_json() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let lsns = make(&dir, 12);
    let d = dir.to_str().unwrap();
    let out = journal(&["dump", d, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // A header line, one line per record, one for the end.
    assert_eq!(lines.len(), 12 + 2);
    assert_eq!(lines[0]["segment_size"], SEG);
    let records = &lines[1..13];
    for (r, l) in records.iter().zip(&lsns) {
        let entries = r["entries"].as_array().unwrap();
        assert_eq!(entries[0]["lsn"], l.0);
        assert_eq!(r["crc_ok"], true);
    }
    assert_eq!(lines[13]["found"], "zeroes");
    let out = journal(&["stat", d, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(s["records"], 12);
    assert_eq!(s["segment_size"], SEG);
    assert_eq!(s["end"], "clean end");
}

#[test]
fn dump_shows_chain_parts_and_whole_records_and_verify_counts_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let big = vec![0x5Au8; 50_000]; // four parts over 16 KiB buffers
    {
        let j = Journal::open(&dir, options()).unwrap();
        j.append_durable(b"small one").unwrap();
        let lsn = j.append_durable(&big).unwrap();
        j.append_durable(b"small two").unwrap();
        j.close().unwrap();
        let out = journal(&["dump", "--entries", dir.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let s = text(&out.stdout);
        assert!(s.contains("chain=first"), "{s}");
        assert!(s.contains("chain=middle"), "{s}");
        assert!(s.contains("chain=last"), "{s}");
        assert!(s.contains(&format!("part 1 of {lsn}:")), "{s}");
        assert!(
            s.contains(&format!("chained record lsn={lsn} len=50000 parts=4")),
            "{s}"
        );
        let out = journal(&["dump", "--json", dir.to_str().unwrap()]);
        let s = text(&out.stdout);
        let whole: Vec<serde_json::Value> = s
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|v| v.get("chained_record").cloned())
            .collect();
        assert_eq!(whole.len(), 1, "{s}");
        assert_eq!(whole[0]["lsn"], lsn.0);
        assert_eq!(whole[0]["len"], 50_000);
    }
    let out = journal(&["verify", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("(1 chained records)"),
        "{}",
        text(&out.stdout)
    );
}

/// A change to a control slot's bytes.
type Edit = fn(&mut [u8]);

/// Rewrites every slot of `dir`'s control file with `edit` applied and
/// the CRC recomputed: damage that gets past the checksum.
fn reseal_control(dir: &Path, edit: impl Fn(&mut [u8])) {
    let path = dir.join("control");
    let mut bytes = std::fs::read(&path).unwrap();
    for slot in bytes.chunks_mut(512) {
        edit(slot);
        let crc = crc32c(&slot[..76]);
        slot[76..80].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(&path, bytes).unwrap();
}

/// A control file whose CRC holds but whose values no journal writes: a
/// tiny or odd segment size, a bad alignment, a scan position near the end
/// of the LSN space, an update counter about to wrap. Every command refuses it with one line and exit 2 (it
/// panicked before on the segment size), and so does `Journal::open`.
#[test]
fn a_control_file_with_a_valid_crc_and_impossible_values_is_refused() {
    let edits: [(&str, Edit); 5] = [
        ("segment size 4096", |s| {
            s[32..40].copy_from_slice(&4096u64.to_le_bytes())
        }),
        ("segment size not a power of two", |s| {
            s[32..40].copy_from_slice(&((1u64 << 20) + 512).to_le_bytes())
        }),
        ("alignment 3", |s| {
            s[56..60].copy_from_slice(&3u32.to_le_bytes())
        }),
        ("scan position near u64::MAX", |s| {
            s[40..48].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
            s[48..56].copy_from_slice(&(u64::MAX - 100).to_le_bytes());
        }),
        // The next control update would wrap it to 0, a slot that loses to
        // the older one (found by the fuzz profile's overflow checks).
        ("update counter u64::MAX", |s| {
            s[8..16].copy_from_slice(&u64::MAX.to_le_bytes())
        }),
    ];
    for (what, edit) in edits {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("j");
        make(&dir, 5);
        reseal_control(&dir, edit);
        for cmd in ["stat", "dump", "verify"] {
            let out = journal(&[cmd, dir.to_str().unwrap()]);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{what}: {cmd}: {err}");
            assert!(
                err.contains("not a journal") && err.lines().count() == 1,
                "{what}: {cmd}: {err}"
            );
        }
        match Journal::open(&dir, options()) {
            Err(journal_core::Error::NotAJournal { reason, .. }) => {
                assert!(reason.starts_with("control file:"), "{what}: {reason}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}
