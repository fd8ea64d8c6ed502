//! `cargo xtask`: the scripts that drive the workspace, in Rust so they run
//! wherever cargo does.
//!
//! - `cargo xtask ci`: format check, clippy with `-D warnings`, the docs with
//!   `-D warnings`, the whole test suite, pjdfstest on a metafs mount
//!   (`fs-suite --quick`), `cargo package` of the six library crates, the
//!   loom suite, then the shuttle schedules. What `.ci/run` runs.
//! - `cargo xtask package`: `cargo package` of the library crates together
//!   (each verified by building it from its package).
//! - `cargo xtask test`: the whole test suite (all crates, all targets, doc
//!   tests, raftkv's fault matrix with its `failpoints` feature, and
//!   journal-core's `tracing` feature).
//! - `cargo xtask loom [CRATE...]`: the loom models, in release mode with
//!   `--cfg loom`, in their own target directory (`target/loom`), with
//!   `LOOM_MAX_PREEMPTIONS` 2 unless the environment says otherwise.
//! - `cargo xtask crash --minutes N`: the crash-consistency campaign for N
//!   minutes (release build); prints how many crash states it checked.
//! - `cargo xtask corrupt --minutes N`: the corruption campaign for N
//!   minutes (release build); prints counts per mutation class and mode.
//! - `cargo xtask fuzz --minutes N`: the hostile-input campaigns (fields
//!   set to hostile values, CRCs re-sealed), N minutes in all (the `fuzz`
//!   profile: release with overflow checks and debug assertions): half on
//!   the journal's files on every core (prints parser
//!   cases and whole opens), a quarter each on kvstore data files and
//!   metafs images.
//! - `cargo xtask kv-faults --minutes N`: kvstore's fault campaigns for N
//!   minutes in all (the `fuzz` profile): half the I/O-fault campaign
//!   (`tests/io_faults.rs`), a quarter the hostile and crafted pages, a
//!   quarter the crash campaign; each prints its cases and failures.
//! - `cargo xtask raft-determinism --minutes N`: raftkv's determinism
//!   campaign for N minutes (the `fuzz` profile): logs from new seeds, each
//!   applied by three processes grouped three ways, compared byte for
//!   byte (`tests/determinism.rs`); prints logs and failures.
//! - `cargo xtask bench-peers [ARGS...]`: `journal bench --scenario peers`
//!   built with the `peers` feature (okaywal, raft-engine and wal-db), ARGS
//!   passed on.
//! - `cargo xtask bench-raft [ARGS...]`: `raftkv-tools compare` — a
//!   three-node raftkv cluster beside a three-member etcd cluster (when
//!   `etcd` is on `PATH`: Debian's etcd-server), both driven by the same
//!   etcd gRPC client (puts, linearizable reads, watchers attached),
//!   interleaved rounds, medians; ARGS passed on (`--rounds`, `--keys`,
//!   `--dir`, ...).
//! - `cargo xtask raft-faults [--minutes N] [ARGS...]`: `raftkv-tools
//!   faults` on a `raftkv` server built with failpoints: raftkv's fault
//!   matrix (kills, pauses,
//!   partitions through proxies, slow and failing disks, crashes at
//!   failpoints; each with all members and with one down), random seeds
//!   for N minutes, a table at the end, every failing run kept as a file
//!   under `target/raft-faults`; ARGS passed on (`--faults`, `--seed`,
//!   `--json`). Without `--minutes`, each case once.
//! - `cargo xtask raft-soak [--minutes N] [ARGS...]`: `raftkv-tools
//!   soak`: a local cluster kept by `raftkv-tools cluster`'s supervisor under recorded
//!   load, `kill -9` of a random node every 10 s (`--kill-every`), every
//!   key's history checked at the end.
//! - `cargo xtask fs-suite [--quick] [--bindfs]`: pjdfstest on a metafs
//!   mount as root (every applicable test must pass), a 2 GiB file through
//!   the mount and back byte-exact (not with `--quick`), fsck; `--bindfs`
//!   runs the suite on ext4 through bindfs too. Installs what it needs.
//! - `cargo xtask xfstests [--group quick|auto] [--fs LIST] [--tests LIST]
//!   [--ci]`: xfstests (built at a pinned commit under `target/tools`) on
//!   metafs, on ext4 through bindfs and on ext4 itself, in one run; the
//!   table of outcomes into docs/XFSTESTS.md; `--fs metafs` (etc.) runs
//!   one, `--report` makes the table from the runs' saved results; `--ci`
//!   runs the fixed subset on metafs alone (not part of `ci`: `.ci/run`
//!   runs it when `XFSTESTS_GIT` names xfstests's source). As root;
//!   installs what it needs.
//! - `cargo xtask bench-fs [ARGS...]`: `metafs bench --scenario fs-mark`
//!   (the real fs_mark on a metafs mount beside ext4 through bindfs and
//!   native ext4), after installing Debian's fsmark and bindfs if missing;
//!   ARGS passed on (`--rounds`, `--threads`, `--files`, `--json`).
//! - `cargo xtask shuttle [--iterations N]`: the composed journal under
//!   shuttle's random and PCT schedulers (release, `--cfg shuttle`, in
//!   `target/shuttle`), N schedules in all (default 20,000; `ci` runs the
//!   default). A failure saves its schedule and prints the command that
//!   replays it: `JOURNAL_SHUTTLE_REPLAY=<run>:<file> cargo xtask shuttle`.
//!   Then kvstore's writers (`prototypes/kvstore/tests/shuttle.rs`), N / 20
//!   schedules per scheduler, and kvstore's unit-level models (its unit
//!   tests named `shuttle_`: a page load racing a writer's eviction,
//!   racing grows of the data file).
#![forbid(unsafe_code)]

mod campaigns;
mod fs_suite;
mod xfstests;

use std::env;
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// Tests passed and failed across every `cargo test` run by this xtask,
/// summed from the harness's `test result:` lines.
static PASSED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// Crates that carry loom models (tests written with `journal_sync::model`).
const LOOM_CRATES: &[&str] = &[
    "journal-sync",
    "journal-vfs",
    "iclog",
    "jbd-batch",
    "segment-recycler",
    "journal-tests",
];

/// Where cargo puts what it builds: `$CARGO_TARGET_DIR`, else the
/// workspace's `target/`.
fn target_dir() -> std::path::PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
}

fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {what}: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Runs a `cargo test` command, echoing its output and adding its
/// `test result:` counts to the totals.
fn run_tests(what: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {what}: {cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    let out = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(out).lines() {
        let line = line.map_err(|e| format!("{what}: {e}"))?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| -> u64 {
                rest.split(';')
                    .find_map(|part| part.trim().strip_suffix(word))
                    .and_then(|n| n.trim().rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0)
            };
            PASSED.fetch_add(count(" passed"), Ordering::Relaxed);
            FAILED.fetch_add(count(" failed"), Ordering::Relaxed);
        }
    }
    let status = child.wait().map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

fn summary(what: &str) {
    println!(
        "{what}: {} passed, {} failed",
        PASSED.load(Ordering::Relaxed),
        FAILED.load(Ordering::Relaxed)
    );
}

fn fmt_check() -> Result<(), String> {
    run("fmt", cargo().args(["fmt", "--all", "--", "--check"]))
}

fn clippy() -> Result<(), String> {
    run(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // The optional tracing events compile, lint-clean, too.
    run(
        "clippy (journal-core, feature tracing)",
        cargo().args([
            "clippy",
            "--package",
            "journal-core",
            "--features",
            "tracing",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )
}

fn test() -> Result<(), String> {
    run_tests(
        "test",
        cargo().args(["test", "--workspace", "--all-targets"]),
    )?;
    run_tests("doctest", cargo().args(["test", "--workspace", "--doc"]))?;
    // raftkv's fault matrix, short pass, and its bounded request path: their
    // nodes arm failpoints, so
    // raftkv is built with them here (a default build has none).
    run_tests(
        "test (raftkv fault matrix, feature failpoints)",
        cargo().args([
            "test",
            "--package",
            "raftkv",
            "--features",
            "failpoints",
            "--test",
            "faults",
            "--test",
            "overload",
        ]),
    )?;
    // The etcd-client Rust crate, unmodified, against raftkv (feature
    // `etcd`: the crate builds with protoc, which .ci/run installs).
    run_tests(
        "test (raftkv, feature etcd: the etcd-client crate)",
        cargo().args([
            "test",
            "--package",
            "raftkv",
            "--features",
            "etcd",
            "--test",
            "etcd_client",
        ]),
    )?;
    // kvstore's injected panic in the combiner (failpoint
    // `kvstore::apply-before-log`).
    run_tests(
        "test (kvstore, feature failpoints)",
        cargo().args([
            "test",
            "--package",
            "kvstore",
            "--features",
            "failpoints",
            "--test",
            "panic",
        ]),
    )?;
    run_tests(
        "test (journal-core, feature tracing)",
        cargo().args([
            "test",
            "--package",
            "journal-core",
            "--features",
            "tracing",
            "--test",
            "tracing",
        ]),
    )
}

fn loom(crates: &[String]) -> Result<(), String> {
    let crates: Vec<String> = if crates.is_empty() {
        LOOM_CRATES.iter().map(|s| s.to_string()).collect()
    } else {
        crates.to_vec()
    };
    let rustflags = format!(
        "{} --cfg loom -C debug-assertions",
        env::var("RUSTFLAGS").unwrap_or_default()
    );
    let preemptions = env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| "2".into());
    for krate in &crates {
        run_tests(
            &format!("loom {krate}"),
            cargo()
                .args(["test", "--release", "--package", krate, "--tests"])
                .env("RUSTFLAGS", &rustflags)
                .env("CARGO_TARGET_DIR", "target/loom")
                .env("LOOM_MAX_PREEMPTIONS", &preemptions),
        )?;
    }
    Ok(())
}

/// The shuttle schedules of the composed journal, then of kvstore's
/// writers.
fn shuttle(args: &[String]) -> Result<(), String> {
    let iterations: u64 = match args {
        [] => 20_000,
        [flag, n] if flag == "--iterations" => n
            .parse()
            .map_err(|_| format!("--iterations wants a number, got {n}"))?,
        _ => return Err(usage()),
    };
    let rustflags = format!(
        "{} --cfg shuttle",
        env::var("RUSTFLAGS").unwrap_or_default()
    );
    release_test(
        "shuttle",
        "shuttle_journal",
        &[
            ("RUSTFLAGS", rustflags.clone()),
            ("CARGO_TARGET_DIR", "target/shuttle".into()),
            ("JOURNAL_SHUTTLE_ITERATIONS", iterations.to_string()),
        ],
    )?;
    // kvstore's writers (prepared puts against the combiner): a twentieth
    // of the journal's schedules, each run being a store's open, puts,
    // power cut and recovery.
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--package",
        "kvstore",
        "--test",
        "shuttle",
        "--",
        "--nocapture",
    ]);
    cmd.env("RUSTFLAGS", &rustflags)
        .env("CARGO_TARGET_DIR", "target/shuttle")
        .env(
            "KVSTORE_SHUTTLE_ITERATIONS",
            (iterations / 20).max(10).to_string(),
        );
    run_tests("shuttle (kvstore)", &mut cmd)?;
    // kvstore's unit-level models (a load racing a writer's eviction,
    // racing grows of the data file): the unit tests named `shuttle_`.
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--package",
        "kvstore",
        "--lib",
        "--",
        "shuttle_",
    ]);
    cmd.env("RUSTFLAGS", rustflags)
        .env("CARGO_TARGET_DIR", "target/shuttle")
        .env(
            "KVSTORE_SHUTTLE_ITERATIONS",
            (iterations / 20).max(10).to_string(),
        );
    run_tests("shuttle (kvstore models)", &mut cmd)
}

/// `--minutes N` (default 1).
fn minutes(args: &[String]) -> Result<f64, String> {
    match args {
        [] => Ok(1.0),
        [flag, n] if flag == "--minutes" => n
            .parse()
            .map_err(|_| format!("--minutes wants a number, got {n}")),
        _ => Err(usage()),
    }
}

/// Runs one campaign test of journal-tests in release mode for `minutes`,
/// its budget passed in `budget_var`.
fn campaign(what: &str, test: &str, budget_var: &str, minutes: f64) -> Result<(), String> {
    release_test(what, test, &[(budget_var, (minutes * 60.0).to_string())])
}

/// `cargo xtask fuzz --minutes N`: the hostile-input campaigns, N minutes
/// in all — half on the journal's own files, a quarter each on kvstore's
/// data file and metafs's image.
/// Built with the `fuzz` profile (release, plus overflow checks and debug
/// assertions).
fn fuzz(minutes: f64) -> Result<(), String> {
    let secs = minutes * 60.0;
    for (what, package, test, share) in [
        (
            "hostile-input campaign",
            "journal-tests",
            "hostile_input",
            0.5,
        ),
        ("kvstore hostile pages", "kvstore", "hostile", 0.25),
        ("metafs hostile images", "metafs", "hostile", 0.25),
    ] {
        let mut cmd = cargo();
        cmd.args([
            "test",
            "--profile",
            "fuzz",
            "--package",
            package,
            "--test",
            test,
            "--",
            "--nocapture",
        ]);
        cmd.env("JOURNAL_FUZZ_SECONDS", (secs * share).to_string());
        run_tests(what, &mut cmd)?;
    }
    Ok(())
}

/// Runs one test target of journal-tests in release mode, its output shown,
/// with `envs` set.
fn release_test(what: &str, test: &str, envs: &[(&str, String)]) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--package",
        "journal-tests",
        "--test",
        test,
        "--",
        "--nocapture",
    ]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run_tests(what, &mut cmd)
}

/// The crates published to crates.io, in dependency order.
const LIBRARY_CRATES: &[&str] = &[
    "journal-sync",
    "journal-vfs",
    "iclog",
    "jbd-batch",
    "segment-recycler",
    "journal-core",
];

/// `cargo package` of every library crate, together (the unpublished
/// path dependencies resolve to each other's packages).
fn package() -> Result<(), String> {
    let target = clear_stale_package_sources();
    let mut cmd = cargo();
    cmd.args(["package", "--allow-dirty"])
        .env("CARGO_TARGET_DIR", target);
    for c in LIBRARY_CRATES {
        cmd.args(["--package", c]);
    }
    run("package", &mut cmd)
}

/// Cargo verifies the packages against a temporary local registry and
/// extracts each into `$CARGO_HOME/registry/src/<that registry>/`, where an
/// extraction of the same name and version is reused: a package changed
/// since, under the same version, would be verified against its old
/// sources. Our crates' extractions from registries other than crates.io
/// are removed first. The verification builds go to a target directory of
/// their own, removed first too (cargo reuses a registry crate's build by
/// name and version, so a shared one would hold stale builds). Returns it.
fn clear_stale_package_sources() -> std::path::PathBuf {
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("package-check");
    let _ = std::fs::remove_dir_all(&target);
    let home = env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry").join("src")) else {
        return target;
    };
    let Ok(registries) = std::fs::read_dir(&src) else {
        return target;
    };
    for reg in registries.flatten() {
        if reg
            .file_name()
            .to_string_lossy()
            .starts_with("index.crates.io")
        {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(reg.path()) else {
            continue;
        };
        for c in crates.flatten() {
            let name = c.file_name().to_string_lossy().into_owned();
            if LIBRARY_CRATES
                .iter()
                .any(|l| name.starts_with(&format!("{l}-")))
            {
                let _ = std::fs::remove_dir_all(c.path());
            }
        }
    }
    target
}

/// The documentation of every crate, broken links and missing docs refused.
fn docs() -> Result<(), String> {
    let flags = format!(
        "{} -D warnings",
        env::var("RUSTDOCFLAGS").unwrap_or_default()
    );
    run(
        "doc",
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", flags),
    )
}

/// The first `name` on `PATH`.
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    env::var_os("PATH").and_then(|paths| {
        env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Builds the `raftkv` server (with `features`) and runs `raftkv-tools
/// ARGS` against it (release builds, the tools' `--raftkv` naming the
/// server built).
fn raft_tools(what: &str, features: &[&str], args: &[String]) -> Result<(), String> {
    let mut build = cargo();
    build.args(["build", "--release", "--package", "raftkv"]);
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    run(&format!("{what} (build the server)"), &mut build)?;
    let server = target_dir().join("release").join("raftkv");
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--package", "raftkv-tools", "--"])
        .arg("--raftkv")
        .arg(server)
        .args(args);
    run(what, &mut cmd)
}

/// `raftkv-tools compare`: raftkv beside etcd when `etcd` is on `PATH`,
/// raftkv alone otherwise; both driven through the same gRPC client
/// (etcd-api's stubs: no `protoc` needed).
fn bench_raft(args: &[String]) -> Result<(), String> {
    let mut all = vec!["compare".to_string()];
    match on_path("etcd") {
        Some(e) => {
            all.push("--etcd".into());
            all.push(e.to_string_lossy().into_owned());
        }
        None => eprintln!("bench-raft: no etcd on PATH (Debian's etcd-server); raftkv alone"),
    }
    all.extend(args.iter().cloned());
    raft_tools("bench-raft", &[], &all)
}

fn usage() -> String {
    "usage: cargo xtask <ci | test | package | loom [CRATE...] | shuttle [--iterations N] | bench-peers [ARGS...] | bench-raft [ARGS...] | raft-faults [--minutes N] [ARGS...] | raft-soak [--minutes N] [ARGS...] | fs-suite [--quick] [--bindfs] | xfstests [--group quick|auto] [--ci] | bench-fs [ARGS...] | crash [--minutes N] | corrupt [--minutes N] | fuzz [--minutes N] | kv-faults [--minutes N] | raft-determinism [--minutes N]>"
        .into()
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => fmt_check()
            .and_then(|_| clippy())
            .and_then(|_| docs())
            .and_then(|_| test())
            .and_then(|_| fs_suite::run(&["--quick".into()]))
            .and_then(|_| package())
            .and_then(|_| loom(&[]))
            .and_then(|_| shuttle(&[])),
        Some("test") => test(),
        Some("package") => package(),
        Some("loom") => loom(&args[1..]),
        Some("crash") => minutes(&args[1..]).and_then(|m| {
            campaign(
                "crash campaign",
                "crash_campaign",
                "JOURNAL_CRASH_SECONDS",
                m,
            )
        }),
        Some("shuttle") => shuttle(&args[1..]),
        Some("bench-peers") => run(
            "bench-peers",
            cargo()
                .args([
                    "run",
                    "--release",
                    "--package",
                    "journal-cli",
                    "--features",
                    "peers",
                    "--",
                    "bench",
                    "--scenario",
                    "peers",
                ])
                .args(&args[1..]),
        ),
        Some("bench-raft") => bench_raft(&args[1..]),
        Some("raft-soak") => raft_tools(
            "raft-soak",
            &[],
            &[&["soak".to_string()], &args[1..]].concat(),
        ),
        Some("raft-faults") => raft_tools(
            "raft-faults",
            &["failpoints"],
            &[&["faults".to_string()], &args[1..]].concat(),
        ),
        Some("fs-suite") => fs_suite::run(&args[1..]),
        Some("bench-fs") => fs_suite::bench_fs(&args[1..]),
        Some("xfstests") => xfstests::run(&args[1..]),
        Some("corrupt") => minutes(&args[1..]).and_then(|m| {
            campaign(
                "corruption campaign",
                "corruption_campaign",
                "JOURNAL_CORRUPT_SECONDS",
                m,
            )
        }),
        Some("fuzz") => minutes(&args[1..]).and_then(fuzz),
        Some("kv-faults") => minutes(&args[1..]).and_then(campaigns::kv_faults),
        Some("raft-determinism") => minutes(&args[1..]).and_then(campaigns::raft_determinism),
        _ => Err(usage()),
    };
    if matches!(
        args.first().map(String::as_str),
        Some(
            "ci" | "test"
                | "loom"
                | "shuttle"
                | "crash"
                | "corrupt"
                | "fuzz"
                | "kv-faults"
                | "raft-determinism"
        )
    ) {
        summary(&args[0]);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
