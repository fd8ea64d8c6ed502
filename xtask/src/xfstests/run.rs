//! One `./check` run on one stage, under a watchdog, and what became of
//! each test.

use super::setup::Stage;
use super::Plan;
use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What became of one test on one filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It ran and passed (the fsck after it too).
    Passed,
    /// It ran and failed: the first line that tells why.
    Failed(String),
    /// It did not run: xfstests's reason.
    NotRun(String),
    /// The watchdog killed it.
    Hung,
}

impl Outcome {
    /// The table's word for it.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Passed => "pass",
            Outcome::Failed(_) => "FAIL",
            Outcome::NotRun(_) => "not run",
            Outcome::Hung => "HANG",
        }
    }
}

/// Outcomes by test name.
pub type Outcomes = BTreeMap<String, Outcome>;

/// Bytes of `./check`'s output, or its end.
enum Event {
    Bytes(Vec<u8>),
    Done,
}

/// Runs `./check` for `plan` on `stage`; a test running past
/// `plan.timeout` has its processes killed (and is counted hung).
pub fn check(xfstests: &Path, stage: &Stage, plan: &Plan) -> Result<Outcomes, String> {
    let mut cmd = Command::new("./check");
    cmd.current_dir(xfstests)
        .env("HOST_OPTIONS", &stage.config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if plan.tests.is_empty() {
        cmd.args(["-g", &format!("generic/{}", plan.group)]);
    } else {
        cmd.args(&plan.tests);
    }
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    eprintln!("xfstests: {}: {cmd:?}", stage.fs);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("./check: {e}"))?;
    let out = child.stdout.take().ok_or("no stdout from ./check")?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut out = out;
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(Event::Bytes(buf[..n].to_vec())).is_err() {
                break;
            }
        }
        let _ = tx.send(Event::Done);
    });
    let mut lines = Vec::new();
    let mut partial = String::new();
    let mut hung = Vec::new();
    // The test now running and since when: `./check` prints a test's name
    // when it starts it, and ends that line with its verdict.
    let mut current: Option<(String, Instant)> = None;
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::Bytes(b)) => {
                partial.push_str(&String::from_utf8_lossy(&b));
                while let Some(i) = partial.find('\n') {
                    let l: String = partial.drain(..=i).collect();
                    let l = l.trim_end().to_owned();
                    eprintln!("[{}] {l}", stage.fs);
                    lines.push(l);
                }
                if let Some(t) = test_name(&partial) {
                    if current.as_ref().is_none_or(|(c, _)| *c != t) {
                        current = Some((t, Instant::now()));
                    }
                }
            }
            Ok(Event::Done) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some((t, since)) = &current {
            if since.elapsed() > plan.timeout && !hung.contains(t) {
                eprintln!("xfstests: {} ran past {:?}: killing it", t, plan.timeout);
                hung.push(t.clone());
                kill_test(child.id())?;
            }
        }
    }
    if !partial.is_empty() {
        lines.push(partial);
    }
    let _ = reader.join();
    let st = child.wait().map_err(|e| e.to_string())?;
    eprintln!(
        "xfstests: {}: ./check exited {st} after {:.0} min",
        stage.fs,
        started.elapsed().as_secs_f64() / 60.0
    );
    // What the table is made from, kept beside `./check`'s own record
    // (its check.log has the Ran / Not run / Failures lines) so that
    // `--report` can make the table again from runs made one by one.
    let keep = format!("{}\n{}\n", plan.label(), hung.join(" "));
    fs::create_dir_all(&stage.results).map_err(|e| e.to_string())?;
    fs::write(stage.results.join(SAVED), keep).map_err(|e| e.to_string())?;
    outcomes(&lines, &hung, stage.fs, &stage.results, xfstests)
}

/// The file in a stage's results that names the run's group and its hung
/// tests.
const SAVED: &str = "metafs-run";

/// The outcomes a finished run left in `results` (a stage's results
/// directory), if that run was of `label`'s group.
pub fn saved(
    fs: &str,
    results: &Path,
    label: &str,
    xfstests: &Path,
) -> Result<Option<Outcomes>, String> {
    let Ok(keep) = fs::read_to_string(results.join(SAVED)) else {
        return Ok(None);
    };
    let mut keep = keep.lines();
    if keep.next() != Some(label) {
        return Ok(None);
    }
    let hung: Vec<String> = keep
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let log = fs::read_to_string(results.join("check.log")).map_err(|e| e.to_string())?;
    let lines: Vec<String> = log.lines().map(str::to_owned).collect();
    outcomes(&lines, &hung, fs, results, xfstests).map(Some)
}

/// The test a line of `./check`'s output starts, if it starts one.
fn test_name(line: &str) -> Option<String> {
    let first = line.split_whitespace().next()?;
    let (dir, num) = first.split_once('/')?;
    (["generic", "shared"].contains(&dir) && num.chars().all(|c| c.is_ascii_digit()))
        .then(|| first.to_owned())
}

/// Kills every process below `./check` but `./check` itself: the test
/// script and what it started. `./check` then records the test as failed
/// and goes on.
fn kill_test(check: u32) -> Result<(), String> {
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    for e in fs::read_dir("/proc").map_err(|e| e.to_string())?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the comm may hold spaces.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        if let Some(pp) = ppid {
            parent.insert(pid, pp);
        }
    }
    let below = |mut p: u32| {
        for _ in 0..64 {
            match parent.get(&p) {
                Some(&pp) if pp == check => return true,
                Some(&pp) if pp > 1 => p = pp,
                _ => return false,
            }
        }
        false
    };
    for (&pid, _) in parent.iter().filter(|(&pid, _)| pid != check && below(pid)) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    Ok(())
}

/// Every test's outcome, from `./check`'s summary lines and the files it
/// left in its results directory.
fn outcomes(
    lines: &[String],
    hung: &[String],
    fs_name: &str,
    results: &Path,
    xfstests: &Path,
) -> Result<Outcomes, String> {
    let list = |prefix: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(prefix))
            .flat_map(|rest| rest.split_whitespace().map(str::to_owned))
            .collect()
    };
    let (ran, not_run, failed) = (list("Ran: "), list("Not run: "), list("Failures: "));
    if ran.is_empty() {
        return Err(format!("{fs_name}: ./check ran nothing (see its output)"));
    }
    let mut out = Outcomes::new();
    for t in ran {
        let res = results.join(&t);
        let o = if hung.contains(&t) {
            Outcome::Hung
        } else if not_run.contains(&t) {
            let why = fs::read_to_string(res.with_extension("notrun")).unwrap_or_default();
            Outcome::NotRun(why.trim().to_owned())
        } else if failed.contains(&t) {
            Outcome::Failed(failure(&t, &res, xfstests))
        } else {
            Outcome::Passed
        };
        out.insert(t, o);
    }
    Ok(out)
}

/// Why `test` failed, in a line: the fsck hook's verdict, a kernel
/// warning, or the first line of its output that differs from the
/// expected.
fn failure(test: &str, res: &Path, xfstests: &Path) -> String {
    let read = |ext: &str| fs::read_to_string(res.with_extension(ext)).unwrap_or_default();
    let full = read("full");
    if let Some(l) = full.lines().find(|l| l.contains("_check_fuse_filesystem")) {
        return l.trim().to_owned();
    }
    let dmesg = read("dmesg");
    if let Some(l) = dmesg
        .lines()
        .find(|l| l.contains("WARNING") || l.contains("BUG"))
    {
        return format!("dmesg: {}", l.trim());
    }
    let bad = read("out.bad");
    let want =
        fs::read_to_string(xfstests.join("tests").join(format!("{test}.out"))).unwrap_or_default();
    let mut w = want.lines();
    for l in bad.lines() {
        if w.next() != Some(l) {
            return clip(l.trim());
        }
    }
    if w.next().is_some() {
        return "output ends early".into();
    }
    "failed (see its .full)".into()
}

/// At most 160 characters of `s`.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
