//! The table of a run: each test's outcome on ext4, on the passthrough and
//! on metafs, with a reason for every outcome that is not a pass; the
//! totals; docs/XFSTESTS.md's section of the group.

use super::run::{clip, Outcome, Outcomes};
use super::setup::DaemonReport;
use super::{Plan, SYSTEMS};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The fixed subset CI runs on metafs, each with the outcome it must have:
/// tests of the features metafs built for xfstests and of its everyday
/// paths, each a few seconds (docs/XFSTESTS.md times it).
pub const CI_TESTS: &[(&str, &str)] = &[
    ("generic/001", "pass"), // copies, renames, removes: everyday paths
    ("generic/003", "pass"), // access times as relatime/strictatime say
    ("generic/008", "pass"), // fallocate's zero range
    ("generic/013", "pass"), // fsstress
    ("generic/020", "pass"), // extended attributes
    ("generic/023", "pass"), // rename
    ("generic/035", "pass"), // an open directory replaced by a rename
    ("generic/099", "pass"), // POSIX ACLs
    ("generic/103", "pass"), // df's available space preallocated
    ("generic/105", "pass"), // ACLs and a directory's default list
    ("generic/213", "pass"), // space freed by a delete had again at once
    ("generic/237", "pass"), // ACLs set by the owner through setfacl
    ("generic/286", "pass"), // SEEK_DATA/SEEK_HOLE over preallocation
    ("generic/436", "pass"), // SEEK_DATA/SEEK_HOLE
    ("generic/448", "pass"), // SEEK_DATA/SEEK_HOLE at odd offsets
];

/// Reasons written by hand, for outcomes whose cause the output does not
/// say in a line: what FUSE cannot carry, what this machine does not allow.
const KNOWN: &[(&str, &str)] = &[
    ("generic/394", ULIMIT),
    ("generic/564", ULIMIT),
    ("generic/426", HANDLES),
    ("generic/467", HANDLES),
    ("generic/477", HANDLES),
    ("generic/756", HANDLES),
    ("generic/777", HANDLES),
    ("generic/683", KILL_SGID),
    ("generic/684", KILL_SGID),
    ("generic/685", KILL_SGID),
    ("generic/732", "the scratch device mounted on two directories at once: one daemon serves a metafs image, so the second mount is refused"),
];

const ULIMIT: &str = "this machine's root lacks CAP_SYS_RESOURCE: the test's `ulimit -f unlimited` fails, whatever the filesystem";
const HANDLES: &str = "open_by_handle once the kernel's caches are dropped: ESTALE, as on any FUSE filesystem without FUSE's export support (a LOOKUP of \".\" and \"..\" by node id, stable inode generations), which metafs does not offer";
const KILL_SGID: &str = "fallocate by a user outside the file's group keeps set-group-ID on a file that is not group-executable: the kernel's FUSE (fuse_setattr, without FUSE_HANDLE_KILLPRIV_V2) kills it only with group-execute, and metafs does not take over the killing";

/// One run's outcomes, by filesystem.
pub struct Table {
    group: String,
    systems: Vec<&'static str>,
    outcomes: Vec<Outcomes>,
    daemons: Option<DaemonReport>,
}

impl Table {
    /// The table of a run's results.
    pub fn new(plan: &Plan, results: Vec<(&'static str, Outcomes, Option<DaemonReport>)>) -> Table {
        let mut t = Table {
            group: plan.group.clone(),
            systems: Vec::new(),
            outcomes: Vec::new(),
            daemons: None,
        };
        for (fs, o, d) in results {
            t.systems.push(fs);
            t.outcomes.push(o);
            if d.is_some() {
                t.daemons = d;
            }
        }
        t
    }

    fn of(&self, fs: &str) -> Option<&Outcomes> {
        self.systems
            .iter()
            .position(|s| *s == fs)
            .map(|i| &self.outcomes[i])
    }

    fn tests(&self) -> BTreeSet<&String> {
        self.outcomes.iter().flat_map(|o| o.keys()).collect()
    }

    /// (ran to a verdict, passed, failed, not run, hung) on `fs`.
    fn totals(&self, fs: &str) -> Option<[usize; 5]> {
        let o = self.of(fs)?;
        let count = |f: &dyn Fn(&Outcome) -> bool| o.values().filter(|x| f(x)).count();
        let passed = count(&|x| *x == Outcome::Passed);
        let failed = count(&|x| matches!(x, Outcome::Failed(_)));
        let hung = count(&|x| *x == Outcome::Hung);
        let not_run = count(&|x| matches!(x, Outcome::NotRun(_)));
        Some([passed + failed + hung, passed, failed, not_run, hung])
    }

    fn totals_table(&self) -> String {
        let mut s = String::from(
            "| filesystem | ran | passed | failed | not run | hung |\n|---|---:|---:|---:|---:|---:|\n",
        );
        for fs in SYSTEMS {
            if let Some([ran, p, f, n, h]) = self.totals(fs) {
                s += &format!("| {} | {ran} | {p} | {f} | {n} | {h} |\n", name(fs));
            }
        }
        s
    }

    fn daemon_line(&self) -> String {
        match &self.daemons {
            Some(d) => format!(
                "metafs's daemons: {} mounts served, {} clean exits (unmounted, checkpointed), {} errors or panics{}.",
                d.starts,
                d.clean_exits,
                d.problems.len(),
                if d.problems.is_empty() {
                    String::new()
                } else {
                    format!(": {}", d.problems.join("; "))
                }
            ),
            None => String::new(),
        }
    }

    /// The reason shown for `test`: a hand-written one, else metafs's
    /// own, else the first other filesystem's that did not pass.
    fn reason(&self, test: &str) -> String {
        let all_passed = self
            .outcomes
            .iter()
            .all(|o| o.get(test).is_none_or(|x| *x == Outcome::Passed));
        if all_passed {
            return String::new();
        }
        if let Some((_, why)) = KNOWN.iter().find(|(t, _)| *t == test) {
            return why.to_string();
        }
        let why = |o: &Outcome| match o {
            Outcome::Passed => None,
            Outcome::Failed(w) | Outcome::NotRun(w) => Some(w.clone()),
            Outcome::Hung => Some("killed by the watchdog".into()),
        };
        for fs in ["metafs", "bindfs", "ext4"] {
            if let Some(w) = self.of(fs).and_then(|o| o.get(test)).and_then(why) {
                let w = clip(&w.replace('|', "\\|"));
                return if fs == "metafs" {
                    w
                } else {
                    format!("{}: {w}", name(fs))
                };
            }
        }
        String::new()
    }

    fn rows(&self) -> String {
        let mut s = String::from(
            "| test | ext4 | passthrough | metafs | reason |\n|---|---|---|---|---|\n",
        );
        for t in self.tests() {
            let cell = |fs: &str| {
                self.of(fs)
                    .map(|o| o.get(t).map_or("—", |x| x.word()))
                    .unwrap_or("")
            };
            s += &format!(
                "| {t} | {} | {} | {} | {} |\n",
                cell("ext4"),
                cell("bindfs"),
                cell("metafs"),
                self.reason(t)
            );
        }
        s
    }

    /// Prints the totals and, for metafs, every test it did not pass.
    pub fn print(&self) {
        println!("xfstests generic/{}:\n{}", self.group, self.totals_table());
        println!("{}", self.daemon_line());
        if let Some(m) = self.of("metafs") {
            for (t, o) in m.iter().filter(|(_, o)| **o != Outcome::Passed) {
                println!("  {t}: {} — {}", o.word(), self.reason(t));
            }
        }
    }

    /// CI's verdict: every test of [`CI_TESTS`] had its outcome.
    pub fn check_ci(&self) -> Result<(), String> {
        let m = self.of("metafs").ok_or("no metafs results")?;
        let wrong: Vec<String> = CI_TESTS
            .iter()
            .filter(|(t, want)| m.get(*t).map(Outcome::word) != Some(want))
            .map(|(t, want)| format!("{t}: wanted {want}, got {:?}", m.get(*t)))
            .collect();
        self.daemons_ok()?;
        if wrong.is_empty() {
            println!(
                "xfstests CI subset on metafs: {} tests as expected",
                CI_TESTS.len()
            );
            Ok(())
        } else {
            Err(format!(
                "xfstests CI subset on metafs:\n  {}",
                wrong.join("\n  ")
            ))
        }
    }

    /// Whether every metafs daemon exited cleanly.
    pub fn daemons_ok(&self) -> Result<(), String> {
        match &self.daemons {
            Some(d) if !d.problems.is_empty() || d.clean_exits != d.starts => {
                Err(format!("metafs's daemons: {}", self.daemon_line()))
            }
            _ => Ok(()),
        }
    }

    /// Replaces the group's section of the document (made if missing).
    pub fn write_doc(&self, doc: &Path, environment: &str) -> Result<(), String> {
        let begin = format!("<!-- xfstests:{}:begin -->", self.group);
        let end = format!("<!-- xfstests:{}:end -->", self.group);
        let section = format!(
            "{begin}\n## generic/{group}\n\n{environment}; filesystems: {systems}.\n\n{totals}\n{daemons}\n\n{rows}{end}",
            group = self.group,
            systems = self.systems.iter().map(|s| name(s)).collect::<Vec<_>>().join(", "),
            totals = self.totals_table(),
            daemons = self.daemon_line(),
            rows = self.rows(),
        );
        let text = fs::read_to_string(doc).unwrap_or_else(|_| "# xfstests\n".into());
        let text = match (text.find(&begin), text.find(&end)) {
            (Some(b), Some(e)) if b < e => {
                format!("{}{section}{}", &text[..b], &text[e + end.len()..])
            }
            _ => format!("{}\n{section}\n", text.trim_end()),
        };
        fs::write(doc, text).map_err(|e| format!("{}: {e}", doc.display()))
    }
}

/// A filesystem's name in the tables.
fn name(fs: &str) -> &str {
    match fs {
        "bindfs" => "ext4 through bindfs (FUSE passthrough)",
        f => f,
    }
}
