//! `cargo xtask xfstests`: xfstests (fstests) on metafs, beside the same
//! tests on ext4 through bindfs (the FUSE passthrough) and on ext4 itself,
//! in one run, and the table of their outcomes in docs/XFSTESTS.md.
//!
//! ```text
//! cargo xtask xfstests [--group quick|auto] [--fs ext4,bindfs,metafs]
//!                      [--tests generic/001,generic/002] [--no-doc]
//!                      [--source GIT] [--timeout-min N] [--report]
//! cargo xtask xfstests --ci        the fixed subset CI runs, on metafs alone
//! ```
//!
//! As root, with /dev/fuse. It installs what it needs (Debian's packages,
//! the `fsgqa` users), builds xfstests at [`setup::PIN`] from its source
//! (`--source`, else `$XFSTESTS_GIT`, else the public repository) under
//! `target/tools/xfstests` — built once, then reused — with one change of
//! ours to its `common/rc` ([`setup::HOOK_PATCH`]: the fsck hook), links
//! metafs's mount helpers into /sbin, makes fresh images and loop devices
//! under `target/xfstests`, and runs `./check` on each filesystem in turn,
//! every test under a watchdog. The tests it runs are `generic/` ones:
//! those any filesystem answers to. Each filesystem's results stay under
//! `target/xfstests/FS/results`; `--report` makes the group's table from
//! them without running anything (so the filesystems can be run one at a
//! time, or side by side).

use std::time::Duration;

mod report;
mod run;
mod setup;

/// The filesystems a run compares, in their column order.
pub const SYSTEMS: [&str; 3] = ["ext4", "bindfs", "metafs"];

/// What one run is asked for.
#[derive(Debug, Clone)]
struct Plan {
    /// `quick` or `auto` (of `generic/`), or `ci`.
    group: String,
    /// Explicit tests instead of the group.
    tests: Vec<String>,
    /// The filesystems to run, a subset of [`SYSTEMS`].
    systems: Vec<&'static str>,
    /// Rewrite the group's section of docs/XFSTESTS.md.
    doc: bool,
    /// Where xfstests's source comes from.
    source: String,
    /// A test running longer than this is killed (and counted a hang).
    timeout: Duration,
    /// Run nothing: make the group's table from the results the last runs
    /// left, filesystem by filesystem (`--report`).
    report: bool,
}

impl Plan {
    /// What a run was of, as its saved results name it: the group, or
    /// `tests` for a hand-picked list.
    fn label(&self) -> &str {
        if self.tests.is_empty() || self.group == "ci" {
            &self.group
        } else {
            "tests"
        }
    }
}

fn parse(args: &[String]) -> Result<Plan, String> {
    let mut plan = Plan {
        group: "quick".into(),
        tests: Vec::new(),
        systems: SYSTEMS.to_vec(),
        doc: true,
        source: std::env::var("XFSTESTS_GIT").unwrap_or_else(|_| setup::DEFAULT_SOURCE.into()),
        timeout: Duration::from_secs(30 * 60),
        report: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} wants a value"));
        match a.as_str() {
            "--group" => {
                plan.group = value()?;
                if !["quick", "auto"].contains(&plan.group.as_str()) {
                    return Err(format!("--group {}: quick or auto", plan.group));
                }
            }
            "--fs" => {
                let v = value()?;
                plan.systems = Vec::new();
                for s in v.split(',') {
                    let known = SYSTEMS.iter().find(|k| **k == s);
                    plan.systems
                        .push(*known.ok_or(format!("--fs {s}: one of {SYSTEMS:?}"))?);
                }
            }
            "--tests" => plan.tests = value()?.split(',').map(str::to_owned).collect(),
            "--no-doc" => plan.doc = false,
            "--report" => plan.report = true,
            "--source" => plan.source = value()?,
            "--timeout-min" => {
                let m: u64 = value()?.parse().map_err(|_| "--timeout-min N")?;
                plan.timeout = Duration::from_secs(m.max(1) * 60);
            }
            "--ci" => {
                plan.group = "ci".into();
                plan.systems = vec!["metafs"];
                plan.doc = false;
                plan.tests = report::CI_TESTS
                    .iter()
                    .map(|(t, _)| t.to_string())
                    .collect();
            }
            _ => return Err(format!("xfstests: unknown argument {a}")),
        }
    }
    if !plan.tests.is_empty() && plan.group != "ci" {
        plan.doc = false; // a hand-picked list is not a group's table
    }
    Ok(plan)
}

/// `cargo xtask xfstests ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    let plan = parse(args)?;
    let root = std::env::current_dir().map_err(|e| e.to_string())?;
    let work = root.join("target/xfstests");
    if plan.report {
        return report(&root, &work, &plan);
    }
    let xfstests = setup::prepare(&root, &plan.source)?;
    let tools = setup::build_metafs(&root)?;
    let mut results = Vec::new();
    for &fs in &plan.systems {
        let stage = setup::Stage::new(&work, fs, &tools)?;
        let outcome = run::check(&xfstests, &stage, &plan)?;
        let daemons = (fs == "metafs")
            .then(|| stage.daemon_report())
            .transpose()?;
        stage.teardown()?;
        results.push((fs, outcome, daemons));
    }
    let table = report::Table::new(&plan, results);
    table.print();
    if plan.group == "ci" {
        return table.check_ci();
    }
    if plan.doc {
        let doc = root.join("docs/XFSTESTS.md");
        table.write_doc(&doc, &setup::describe(&xfstests)?)?;
        eprintln!(
            "xfstests: wrote the {} table to {}",
            plan.group,
            doc.display()
        );
    }
    table.daemons_ok()
}

/// `--report`: the table of `plan`'s group from what the last run on each
/// filesystem left under `work` (runs made one filesystem at a time, e.g.
/// `--fs metafs` then `--fs bindfs`), written as a run's would be.
fn report(root: &std::path::Path, work: &std::path::Path, plan: &Plan) -> Result<(), String> {
    let xfstests = root.join("target/tools/xfstests");
    let mut results = Vec::new();
    for &fs in &plan.systems {
        let res = work.join(fs).join("results");
        if let Some(o) = run::saved(fs, &res, plan.label(), &xfstests)? {
            let daemons = (fs == "metafs").then(|| setup::DaemonReport::from_logs(&res));
            results.push((fs, o, daemons));
        }
    }
    if results.is_empty() {
        return Err(format!("xfstests --report: no saved {} run", plan.label()));
    }
    let table = report::Table::new(plan, results);
    table.print();
    if plan.doc {
        let doc = root.join("docs/XFSTESTS.md");
        table.write_doc(&doc, &setup::describe(&xfstests)?)?;
        eprintln!(
            "xfstests: wrote the {} table to {}",
            plan.group,
            doc.display()
        );
    }
    Ok(())
}
