//! Architecture rules that a test can check (rust-analyzer keeps its own in
//! `tidy.rs`): who may touch the filesystem, who may contain `unsafe`, which
//! crates may depend on which, where sleeping is banned, and whether
//! ARCHITECTURE.md's code map still matches the tree. See ARCHITECTURE.md,
//! "Invariants", for the why of each rule.
#![cfg(not(loom))]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The three crates that own one idea each and must not know each other.
const LEAVES: [&str; 3] = ["iclog", "jbd-batch", "segment-recycler"];

/// Crates whose code is a synchronisation protocol: no `thread::sleep`.
const PROTOCOL_CRATES: [&str; 5] = [
    "crates/journal-sync",
    "crates/iclog",
    "crates/jbd-batch",
    "crates/segment-recycler",
    "crates/journal-core",
];

/// The only crate that may touch the filesystem and contain `unsafe`.
const VFS: &str = "crates/journal-vfs";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace root")
        .to_path_buf()
}

fn manifest(path: &Path) -> toml::Table {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Workspace members, as paths relative to the root.
fn members() -> Vec<String> {
    let m = manifest(&root().join("Cargo.toml"));
    m["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .map(|v| v.as_str().expect("a member path").to_string())
        .collect()
}

/// Every `.rs` file below `dir`, relative to the root.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(root()).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The code lines of a file: comments (and so doc examples) left out.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    fs::read_to_string(root().join(path))
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect()
}

/// Whether `line` contains `needle` as a path (a needle starting with an
/// identifier must not continue one: `nix::` is not `unix::`).
fn mentions(line: &str, needle: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(needle).any(|(i, _)| {
        !needle.starts_with(ident) || !line[..i].chars().next_back().is_some_and(ident)
    })
}

/// Lines of `files` containing any of `needles`, as `file:line: text`.
fn offenders(files: &[PathBuf], needles: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        for (n, line) in code_lines(f) {
            if needles.iter().any(|needle| mentions(&line, needle)) {
                out.push(format!("{}:{n}: {}", f.display(), line.trim()));
            }
        }
    }
    out
}

/// Library and binary sources (`src/`) of every member but the test and
/// build tooling ones.
fn product_sources() -> Vec<(String, Vec<PathBuf>)> {
    members()
        .into_iter()
        .filter(|m| m != "tests" && m != "xtask")
        .map(|m| {
            let files = rust_files(&root().join(&m).join("src"));
            (m, files)
        })
        .collect()
}

#[test]
fn only_journal_vfs_touches_the_filesystem() {
    let mut bad = Vec::new();
    for (member, files) in product_sources() {
        if member != VFS {
            let found = offenders(
                &files,
                &["std::fs", "::fs::", "libc::", "nix::", "rustix::"],
            );
            // The one system call allowed outside journal-vfs: the futex
            // under journal-sync's `Gate` (a word in memory, no file).
            bad.extend(found.into_iter().filter(|hit| {
                !(member == "crates/journal-sync" && hit.ends_with("use rustix::thread::futex;"))
            }));
        }
    }
    assert!(
        bad.is_empty(),
        "filesystem access outside journal-vfs (go through journal_core::vfs):\n{}",
        bad.join("\n")
    );
}

#[test]
fn unsafe_lives_only_in_journal_vfs_and_every_other_crate_forbids_it() {
    let mut bad = Vec::new();
    for member in members() {
        if member == VFS {
            continue;
        }
        let files = rust_files(&root().join(&member));
        // Spelled in two halves so this file does not find itself.
        let needles: Vec<String> = ["{", "fn", "impl", "trait", "extern"]
            .iter()
            .map(|w| format!("{}{} {w}", "uns", "afe"))
            .collect();
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        bad.extend(offenders(&files, &needles));
    }
    assert!(
        bad.is_empty(),
        "unsafe outside journal-vfs:\n{}",
        bad.join("\n")
    );
    let mut unforbidden = Vec::new();
    for (member, _) in product_sources() {
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let p = root().join(&member).join(root_file);
            if p.exists() && member != VFS {
                let text = fs::read_to_string(&p).unwrap();
                if !text.contains("#![forbid(unsafe_code)]") {
                    unforbidden.push(format!("{member}/{root_file}"));
                }
            }
        }
    }
    assert!(
        unforbidden.is_empty(),
        "crate roots without #![forbid(unsafe_code)]: {unforbidden:?}"
    );
}

#[test]
fn every_unsafe_block_in_journal_vfs_is_allowed_one_by_one_under_a_safety_paragraph() {
    let lib = fs::read_to_string(root().join(VFS).join("src/lib.rs")).unwrap();
    assert!(
        lib.contains("#![deny(unsafe_code)]"),
        "journal-vfs denies unsafe code by default"
    );
    let needle = format!("{}{} {{", "uns", "afe");
    let mut bad = Vec::new();
    let mut blocks = 0;
    for f in rust_files(&root().join(VFS).join("src")) {
        let text = fs::read_to_string(root().join(&f)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("//") || !line.contains(&needle) {
                continue;
            }
            blocks += 1;
            // Above it: `#[allow(unsafe_code)]`, and a comment paragraph
            // that starts with `// SAFETY:`.
            let above: Vec<&str> = lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| l.starts_with("//") || l.starts_with("#["))
                .collect();
            let allowed = above.iter().any(|l| l.starts_with("#[allow(unsafe_code)]"));
            let safety = above.iter().any(|l| l.starts_with("// SAFETY:"));
            if !(allowed && safety) {
                bad.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(blocks >= 1, "the mmap block is found");
    assert!(
        bad.is_empty(),
        "unsafe blocks without #[allow(unsafe_code)] and a // SAFETY: paragraph:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_leaf_crates_do_not_depend_on_each_other() {
    for leaf in LEAVES {
        let m = manifest(&root().join("crates").join(leaf).join("Cargo.toml"));
        for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let Some(deps) = m.get(section).and_then(|d| d.as_table()) else {
                continue;
            };
            for other in LEAVES.iter().filter(|o| **o != leaf) {
                assert!(
                    !deps.contains_key(*other),
                    "{leaf} depends on {other} in [{section}]: only journal-core composes them"
                );
            }
        }
    }
}

/// The crates inside the facade.
const INTERNAL: [&str; 5] = [
    "iclog",
    "jbd-batch",
    "segment-recycler",
    "journal-vfs",
    "journal-sync",
];

/// Members that use the journal: everything above journal-core.
fn users() -> Vec<String> {
    members()
        .into_iter()
        .filter(|m| {
            m.starts_with("prototypes/")
                || m.starts_with("adapters/")
                || m == "crates/journal-cli"
                || m == "crates/bench-harness"
                || m == "tests"
        })
        .collect()
}

#[test]
fn users_of_the_journal_name_no_crate_inside_the_facade() {
    let paths: Vec<String> = INTERNAL
        .iter()
        .map(|c| format!("{}::", c.replace('-', "_")))
        .collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let mut bad = Vec::new();
    for member in users() {
        // Every source: src, tests, benches, examples, binaries.
        bad.extend(offenders(&rust_files(&root().join(&member)), &paths));
    }
    assert!(
        bad.is_empty(),
        "paths into the crates inside the facade (use journal_core's re-exports):\n{}",
        bad.join("\n")
    );
}

#[test]
fn users_of_the_journal_depend_on_journal_core_alone() {
    let internal = INTERNAL;
    for member in users() {
        let m = manifest(&root().join(&member).join("Cargo.toml"));
        for section in ["dependencies", "dev-dependencies"] {
            let Some(deps) = m.get(section).and_then(|d| d.as_table()) else {
                continue;
            };
            for dep in internal {
                assert!(
                    !deps.contains_key(dep),
                    "{member} depends on {dep} directly: reach it through journal-core"
                );
            }
        }
    }
}

/// The synchronisation primitives `text` takes from `std::sync` itself
/// rather than through journal-sync (`std::sync::Mutex`, or a `Mutex` in
/// a `use std::sync::{..}` group, which may span lines).
fn std_primitives(text: &str) -> Vec<String> {
    const KINDS: [&str; 5] = ["Mutex", "RwLock", "Condvar", "Barrier", "atomic"];
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let needle = ["std", "::sync::"].concat();
    let mut found = Vec::new();
    for (i, _) in text.match_indices(&needle) {
        if text[..i].chars().next_back().is_some_and(ident) {
            continue;
        }
        let rest = &text[i + needle.len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(|c: char| !ident(c))
                .collect(),
            None => vec![rest.split(|c: char| !ident(c)).next().unwrap_or("")],
        };
        found.extend(
            names
                .into_iter()
                .filter(|n| KINDS.contains(n))
                .map(|n| format!("{needle}{n}")),
        );
    }
    found
}

#[test]
fn every_lock_condvar_and_atomic_comes_from_journal_sync() {
    let mut bad = Vec::new();
    for (member, files) in product_sources() {
        if member == "crates/journal-sync" {
            continue;
        }
        for f in files {
            let text: Vec<String> = code_lines(&f).into_iter().map(|(_, l)| l).collect();
            for p in std_primitives(&text.join("\n")) {
                bad.push(format!("{}: {p}", f.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "std's locks or atomics used directly (take them from journal_core::sync, \
         so that loom and shuttle see them):\n{}",
        bad.join("\n")
    );
    // The matcher itself: a group over lines, a path, and neither.
    let group = ["use ", "std", "::sync::{\n    Arc,\n    RwLock,\n};"].concat();
    assert_eq!(std_primitives(&group).len(), 1);
    let path = ["let m = ", "std", "::sync::Mutex::new(0);"].concat();
    assert_eq!(std_primitives(&path).len(), 1);
    let fine = ["", "std", "::sync::Arc<journal_core::sync::Mutex<u8>>"].concat();
    assert!(std_primitives(&fine).is_empty());
}

#[test]
fn no_protocol_crate_sleeps() {
    let mut bad = Vec::new();
    for member in PROTOCOL_CRATES {
        bad.extend(offenders(
            &rust_files(&root().join(member).join("src")),
            &["thread::sleep", "sleep("],
        ));
    }
    assert!(
        bad.is_empty(),
        "sleeping in a protocol (wait on a condvar that progress signals):\n{}",
        bad.join("\n")
    );
}

/// The code map: `### \`member\`` headings, and the file names in
/// backticks under each.
fn code_map() -> Vec<(String, Vec<String>)> {
    let text = fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let map = text
        .split("## Code map")
        .nth(1)
        .expect("ARCHITECTURE.md has a '## Code map' section");
    let map = map.split("\n## ").next().unwrap();
    let mut sections = Vec::new();
    for block in map.split("\n### ").skip(1) {
        let heading = block
            .lines()
            .next()
            .unwrap()
            .trim()
            .trim_matches('`')
            .to_string();
        let files = block
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|t| !t.contains(' ') && [".rs", ".toml", ".md"].iter().any(|x| t.ends_with(x)))
            .map(str::to_string)
            .collect();
        sections.push((heading, files));
    }
    sections
}

/// The sources of a member the code map must name: those of `src/` (and,
/// for the test crate, its whole tree), relative to `src/` and to the
/// member.
fn mapped_sources(member: &str) -> Vec<(String, String)> {
    let base = root().join(member);
    let dir = if member == "tests" {
        base.clone()
    } else {
        base.join("src")
    };
    rust_files(&dir)
        .into_iter()
        .map(|f| {
            let abs = root().join(&f);
            let rel = |b: &Path| abs.strip_prefix(b).unwrap_or(&abs).display().to_string();
            (rel(&base.join("src")), rel(&base))
        })
        .collect()
}

#[test]
fn the_code_map_names_every_source_file() {
    let map = code_map();
    let mut missing = Vec::new();
    for (heading, files) in &map {
        for (in_src, in_member) in mapped_sources(heading) {
            if !files.iter().any(|f| *f == in_src || *f == in_member) {
                missing.push(format!("{heading}: {in_member}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "source files ARCHITECTURE.md's code map does not name:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_code_map_names_every_member_and_only_files_that_exist() {
    let map = code_map();
    let headings: BTreeSet<&str> = map.iter().map(|(h, _)| h.as_str()).collect();
    for member in members() {
        assert!(
            headings.contains(member.as_str()),
            "ARCHITECTURE.md's code map has no section for the member {member}"
        );
    }
    for (heading, files) in &map {
        let base = root().join(heading);
        assert!(
            base.is_dir(),
            "ARCHITECTURE.md maps {heading}, which does not exist"
        );
        for f in files {
            let found = [base.join("src").join(f), base.join(f)]
                .iter()
                .any(|p| p.exists());
            assert!(
                found,
                "ARCHITECTURE.md names {heading}: {f}, which does not exist"
            );
        }
    }
}

/// The functions of a file longer than `max` lines, as `file:line name
/// (n lines)`: a function runs from its `fn` line to the first line after
/// it that closes a brace at the same indentation.
fn long_functions(path: &Path, max: usize) -> Vec<String> {
    let text = fs::read_to_string(root().join(path)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let indent = l.len() - t.len();
        let t = t
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ");
        if !t.starts_with("fn ") || l.trim_end().ends_with(';') {
            continue;
        }
        let close = " ".repeat(indent) + "}";
        let end = lines[i + 1..]
            .iter()
            .position(|m| m.starts_with(&close) && m.len() - m.trim_start().len() == indent);
        if let Some(e) = end {
            let n = e + 2;
            if n > max {
                let name: String = t[3..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(format!("{}:{} {name} ({n} lines)", path.display(), i + 1));
            }
        }
    }
    out
}

#[test]
fn no_source_file_over_700_lines_and_no_function_over_100() {
    let (mut files, mut functions) = (Vec::new(), Vec::new());
    for (_, sources) in product_sources() {
        for f in sources {
            let n = fs::read_to_string(root().join(&f)).unwrap().lines().count();
            if n > 700 {
                files.push(format!("{} ({n} lines)", f.display()));
            }
            functions.extend(long_functions(&f, 100));
        }
    }
    assert!(files.is_empty(), "source files over 700 lines: {files:?}");
    assert!(
        functions.is_empty(),
        "functions over 100 lines (name a step):\n{}",
        functions.join("\n")
    );
}

/// The lint line every product crate root carries: code a user runs answers
/// with an error, never with `unwrap`/`expect` (tests, built with
/// `cfg(test)`, are exempt). Each exception is an `#[allow]` in place with
/// a comment saying why it cannot fail.
const NO_UNWRAP: &str = "#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]";

#[test]
fn every_product_crate_root_denies_unwrap_and_expect() {
    let mut missing = Vec::new();
    for (member, _) in product_sources() {
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let p = root().join(&member).join(root_file);
            if p.exists() && !fs::read_to_string(&p).unwrap().contains(NO_UNWRAP) {
                missing.push(format!("{member}/{root_file}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "crate roots without `{NO_UNWRAP}`: {missing:?}"
    );
}
