//! `journal dump`, `journal verify`, `journal stat`: read-only inspection.
//!
//! They open every file read-only. They take the directory lock only when
//! it is free, for as long as they run: then no writer can change the
//! segments, and they are read in place through memory mappings. When a
//! live writer holds the lock they read with `pread` instead, never
//! blocking it, and what they report is a snapshot that may end
//! mid-flight.

use clap::Args;
use journal_core::format::IoFlags;
use journal_core::inspect::{EntryRole, HeaderCheck, Inspector, ScanReport};
use journal_core::{Control, Error, LogEnd, Lsn, RecoveryMode};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// The journal directory argument of every inspection command.
#[derive(Debug, Args)]
pub struct DirArgs {
    /// The journal directory.
    dir: PathBuf,
}

/// `journal dump` options.
#[derive(Debug, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    dir: DirArgs,
    /// Show records ending after this LSN (decimal or 0x-hex) [default: the
    /// checkpoint].
    #[arg(long, value_parser = parse_lsn)]
    from: Option<Lsn>,
    /// Show at most N records.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Also show each entry (LSN, length, first bytes).
    #[arg(long)]
    entries: bool,
    /// One JSON object per line per record (and one for the end), instead
    /// of text.
    #[arg(long)]
    json: bool,
}

/// `journal verify` options.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    dir: DirArgs,
    /// Judge the log as recovery would in this mode.
    #[arg(long, value_enum, default_value_t = Mode::TolerateTornTail)]
    mode: Mode,
}

/// A recovery mode, as `verify --mode` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A torn record at the head is cut off (a warning); corruption and
    /// loss are errors.
    TolerateTornTail,
    /// Any bad record, and any record after the end, is an error.
    AbsoluteConsistency,
    /// Corrupt ranges are skipped (warnings); loss is an error.
    SkipCorrupt,
}

impl From<Mode> for RecoveryMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::TolerateTornTail => RecoveryMode::TolerateTornTail,
            Mode::AbsoluteConsistency => RecoveryMode::AbsoluteConsistency,
            Mode::SkipCorrupt => RecoveryMode::SkipCorrupt,
        }
    }
}

/// `journal stat` options.
#[derive(Debug, Args)]
pub struct StatArgs {
    #[command(flatten)]
    dir: DirArgs,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// A failure of an inspection command: its message and exit code.
pub struct Failure {
    /// One line for stderr.
    message: String,
    /// The exit code.
    code: u8,
}

fn fail(message: impl ToString) -> Failure {
    Failure {
        message: message.to_string(),
        code: 2,
    }
}

/// Prints a failure as one stderr line and turns a result into the exit
/// code.
pub fn finish(cmd: &str, r: Result<u8, Failure>) -> ExitCode {
    match r {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("journal {cmd}: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn parse_lsn(s: &str) -> Result<Lsn, String> {
    let v = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    v.map(Lsn).map_err(|_| format!("bad LSN {s:?}"))
}

fn open(args: &DirArgs) -> Result<Inspector, Failure> {
    Inspector::open(&args.dir).map_err(|e| match e {
        Error::NotFound { dir } => fail(format!("{}: no such directory", dir.display())),
        Error::NotAJournal { path, reason } => {
            fail(format!("{}: not a journal ({reason})", path.display()))
        }
        e => fail(e),
    })
}

fn flags(f: IoFlags) -> &'static str {
    match (f.contains(IoFlags::PREFLUSH), f.contains(IoFlags::FUA)) {
        (true, true) => "PREFLUSH|FUA",
        (true, false) => "PREFLUSH",
        (false, true) => "FUA",
        (false, false) => "-",
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|x| format!("{x:02x}")).collect()
}

/// `journal dump DIR [--from LSN] [--limit N] [--entries] [--json]`.
pub fn dump(args: &DumpArgs) -> Result<u8, Failure> {
    let mut j = open(&args.dir)?;
    let c = *j.control();
    let dir = j.dir().to_path_buf();
    let from = args.from.unwrap_or(c.scan_lsn);
    let limit = args.limit.unwrap_or(u64::MAX);
    if args.json {
        println!(
            "{}",
            json!({"journal": dir, "segment_size": c.segment_size, "alignment": c.alignment,
                   "redo_lsn": c.redo_lsn.0, "scan_lsn": c.scan_lsn.0})
        );
    } else {
        println!(
            "# journal {}: segment size {}, alignment {}, redo {}, scan from {}",
            dir.display(),
            c.segment_size,
            c.alignment,
            c.redo_lsn,
            c.scan_lsn
        );
    }
    let mut records = j.records(from);
    let mut shown = 0;
    while shown < limit {
        let Some(r) = records.next() else { break };
        let r = r.map_err(fail)?;
        if args.json {
            print_record_json(&r);
        } else {
            print_record(&r, args.entries);
        }
        shown += 1;
    }
    if let Some((pos, found)) = records.end() {
        if args.json {
            println!(
                "{}",
                json!({"end": pos.0, "found": found.to_string(), "bad_record": found.is_bad_record()})
            );
        } else {
            let crc = if found.is_bad_record() {
                "crc=bad: "
            } else {
                ""
            };
            println!("end at lsn={pos}: {crc}{found}");
        }
    }
    Ok(0)
}

fn print_record_json(r: &journal_core::inspect::RecordInfo) {
    let entries: Vec<_> = r
        .entries
        .iter()
        .map(|e| match e.role {
            EntryRole::Whole => json!({"lsn": e.lsn.0, "len": e.len}),
            EntryRole::Part { chain, part } => {
                json!({"lsn": e.lsn.0, "len": e.len, "part_of": chain.0, "part": part})
            }
            EntryRole::PartOfEarlier => {
                json!({"lsn": e.lsn.0, "len": e.len, "part_of": 0, "part": 0})
            }
        })
        .collect();
    println!(
        "{}",
        json!({"lsn": r.lsn.0, "len": r.len, "size": r.size,
               "flags": flags(r.flags), "entry_count": r.entry_count,
               "continued": r.continued, "continues": r.continues,
               "tail": r.tail.0, "crc_ok": true, "entries": entries})
    );
    if let Some(c) = r.completed_chain {
        println!(
            "{}",
            json!({"chained_record": {"lsn": c.lsn.0, "len": c.len, "parts": c.parts}})
        );
    }
}

fn print_record(r: &journal_core::inspect::RecordInfo, entries: bool) {
    let cont = match (r.continued, r.continues) {
        (false, false) => "",
        (true, false) => " chain=last",
        (false, true) => " chain=first",
        (true, true) if r.entry_count == 1 => " chain=middle",
        (true, true) => " chain=last,first",
    };
    println!(
        "lsn={} len={} size={} flags={} entries={} tail={} crc=ok{cont}",
        r.lsn,
        r.len,
        r.size,
        flags(r.flags),
        r.entry_count,
        r.tail
    );
    if entries {
        for e in &r.entries {
            let more = if e.len > 16 { "…" } else { "" };
            let what = match e.role {
                EntryRole::Whole => "entry".to_string(),
                EntryRole::PartOfEarlier => "part of a chain begun earlier".to_string(),
                EntryRole::Part { chain, part } => format!("part {part} of {chain}:"),
            };
            println!(
                "  {what} lsn={} len={} {}{more}",
                e.lsn,
                e.len,
                hex(&e.head)
            );
        }
    }
    if let Some(c) = r.completed_chain {
        println!(
            "  chained record lsn={} len={} parts={}",
            c.lsn, c.len, c.parts
        );
    }
}

/// Problems with the segment files themselves (not the log in them). A
/// damaged header or size is a problem inside the live log `live`; outside
/// it, a warning (the journal replaces such a segment when it opens).
fn check_segments(
    scan: &ScanReport,
    c: &Control,
    live: impl Fn(u64) -> bool,
) -> Result<(Vec<String>, Vec<String>), Failure> {
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    for s in &scan.segments {
        let damage = match s.header {
            HeaderCheck::Valid(h) => {
                if h.journal_id != c.journal_id {
                    problems.push(format!("segment {} belongs to another journal", s.number));
                    None
                } else if h.segment_size.get() != c.segment_size {
                    problems.push(format!("segment {} has another segment size", s.number));
                    None
                } else if s.len != c.segment_size {
                    Some(format!("segment {} is {} bytes long", s.number, s.len))
                } else {
                    None
                }
            }
            HeaderCheck::Zeroes => None,
            HeaderCheck::UnsupportedVersion(v) => {
                return Err(fail(format!(
                    "{}: segment format version {v} is newer than this build",
                    s.path.display()
                )))
            }
            other => Some(format!("segment {}: bad header ({other:?})", s.number)),
        };
        match damage {
            Some(d) if live(s.number) => problems.push(d),
            Some(d) => warnings.push(format!("{d}, outside the live log: will be replaced")),
            None => {}
        }
    }
    Ok((problems, warnings))
}

/// `journal verify DIR [--mode M]`: exit 0 when clean or torn at the tail
/// (with a warning), 1 on corruption or loss (the LSN named), 2 when it
/// cannot tell.
pub fn verify(args: &VerifyArgs) -> Result<u8, Failure> {
    let mut j = open(&args.dir)?;
    let c = *j.control();
    let g = j.geometry();
    match j.scan(args.mode.into()) {
        Ok(r) => {
            let live = |n: u64| {
                r.end_lsn > r.redo_lsn
                    && (g.segment_of(r.redo_lsn)..=g.segment_of(Lsn(r.end_lsn.0 - 1))).contains(&n)
            };
            let (problems, warnings) = check_segments(&j.segments().map_err(fail)?, &c, live)?;
            for p in &problems {
                eprintln!("journal verify: {p}");
            }
            for w in &warnings {
                eprintln!("journal verify: warning: {w}");
            }
            if let LogEnd::TornTail { lsn, found } = &r.end {
                eprintln!("journal verify: warning: torn tail at LSN {lsn} ({found}): recovery will cut it off");
            }
            if let Some(first) = r.torn_chain {
                eprintln!("journal verify: warning: the log ends inside the chained record at LSN {first}: recovery will cut it off");
            }
            for s in &r.skipped {
                eprintln!(
                    "journal verify: warning: corrupt range {}..{} ({}) skipped",
                    s.from, s.to, s.found
                );
            }
            println!(
                "{}: {} records, {} entries ({} chained records) from LSN {} to {}",
                j.dir().display(),
                r.records,
                r.entries,
                r.chained,
                r.redo_lsn,
                r.end_lsn
            );
            Ok(if problems.is_empty() { 0 } else { 1 })
        }
        Err(e @ (Error::Corruption { .. } | Error::LogEndsEarly { .. })) => {
            eprintln!("journal verify: {e}");
            Ok(1)
        }
        Err(e) => Err(fail(e)),
    }
}

/// `journal stat DIR [--json]`.
pub fn stat(args: &StatArgs) -> Result<u8, Failure> {
    let mut j = open(&args.dir)?;
    let st = gather(&mut j)?;
    let (c, g, report, scan) = (&st.control, j.geometry(), &st.report, &st.scan);
    let (numbers, gaps, frontier, id) = (&st.numbers, &st.gaps, st.frontier, &st.id);
    let (end_kind, end_found, tail_seg, head_seg) =
        (st.end_kind, &st.end_found, st.tail_seg, st.head_seg);
    let (recyclable, ahead) = (&st.recyclable, &st.ahead);
    let skipped: Vec<_> = report
        .skipped
        .iter()
        .map(|s| json!({"from": s.from.0, "to": s.to.0, "found": s.found.to_string()}))
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "journal": j.dir(),
                "journal_id": id,
                "segment_size": c.segment_size,
                "data_bytes_per_segment": g.data_size(),
                "alignment": c.alignment,
                "redo_lsn": c.redo_lsn.0,
                "scan_lsn": c.scan_lsn.0,
                "control_seq": c.seq,
                "segments": numbers,
                "gaps": gaps,
                "frontier": frontier,
                "end_lsn": report.end_lsn.0,
                "records": report.records,
                "end": end_kind,
                "end_found": end_found.to_string(),
                "corrupt_ranges": skipped,
                "live_segments": [tail_seg, head_seg],
                "recyclable": recyclable,
                "preallocated": ahead,
                "temporaries": scan.temporaries,
                "other_files": scan.other,
            }))
            .map_err(fail)?
        );
        return Ok(0);
    }
    print_stat(&j, &st);
    Ok(0)
}

/// What `journal stat` shows, gathered once for the text and the JSON.
struct Stat {
    control: Control,
    scan: ScanReport,
    report: journal_core::RecoveryReport,
    numbers: Vec<u64>,
    gaps: Vec<u64>,
    frontier: Option<u64>,
    id: String,
    end_kind: &'static str,
    end_found: String,
    tail_seg: u64,
    head_seg: u64,
    recyclable: Vec<u64>,
    ahead: Vec<u64>,
}

fn gather(j: &mut Inspector) -> Result<Stat, Failure> {
    let scan = j.segments().map_err(fail)?;
    let c = *j.control();
    let g = j.geometry();
    let numbers: Vec<u64> = scan.segments.iter().map(|s| s.number).collect();
    let gaps: Vec<u64> = match (numbers.first(), numbers.last()) {
        (Some(&lo), Some(&hi)) => (lo..hi).filter(|n| !numbers.contains(n)).collect(),
        _ => Vec::new(),
    };
    // Offline, every name present counts as durable: the frontier is the
    // end of the run of valid segments from the lowest.
    let mut frontier = None;
    for s in &scan.segments {
        let ok = matches!(s.header, HeaderCheck::Valid(h) if h.segment_no.get() == s.number);
        if !ok || frontier.is_some_and(|f: u64| s.number != f + 1) {
            break;
        }
        frontier = Some(s.number);
    }
    let report = j.scan(RecoveryMode::SkipCorrupt).map_err(fail)?;
    let (end_kind, end_found) = match &report.end {
        LogEnd::Clean { found } => ("clean end", found.to_string()),
        LogEnd::TornTail { found, .. } => ("torn tail", found.to_string()),
    };
    let tail_seg = g.segment_of(c.scan_lsn);
    let head_seg = g.segment_of(report.end_lsn);
    Ok(Stat {
        id: hex(&c.journal_id),
        recyclable: numbers.iter().copied().filter(|&n| n < tail_seg).collect(),
        ahead: numbers.iter().copied().filter(|&n| n > head_seg).collect(),
        control: c,
        scan,
        report,
        numbers,
        gaps,
        frontier,
        end_kind,
        end_found,
        tail_seg,
        head_seg,
    })
}

/// `journal stat` as text.
fn print_stat(j: &Inspector, st: &Stat) {
    let g = j.geometry();
    let (c, report, scan) = (&st.control, &st.report, &st.scan);
    let (numbers, gaps, frontier, id) = (&st.numbers, &st.gaps, st.frontier, &st.id);
    let (end_kind, end_found, tail_seg, head_seg) =
        (st.end_kind, &st.end_found, st.tail_seg, st.head_seg);
    let (recyclable, ahead) = (&st.recyclable, &st.ahead);
    println!("journal:          {}", j.dir().display());
    println!("journal id:       {id}");
    println!(
        "segment size:     {} ({} data bytes)",
        c.segment_size,
        g.data_size()
    );
    println!("alignment:        {}", c.alignment);
    println!(
        "checkpoint:       redo {} (scan from {}), control seq {}",
        c.redo_lsn, c.scan_lsn, c.seq
    );
    match (numbers.first(), numbers.last()) {
        (Some(lo), Some(hi)) => println!(
            "segments:         {} ({lo}..={hi}){}",
            numbers.len(),
            if gaps.is_empty() {
                String::new()
            } else {
                format!(", gaps {gaps:?}")
            }
        ),
        _ => println!("segments:         0"),
    }
    println!(
        "frontier:         {}",
        frontier.map_or("none".into(), |f| f.to_string())
    );
    println!(
        "last valid LSN:   {} ({} records; {end_kind}: {end_found})",
        report.end_lsn, report.records
    );
    for s in &report.skipped {
        println!("corrupt range:    {}..{} ({})", s.from, s.to, s.found);
    }
    println!("live segments:    {tail_seg}..={head_seg}");
    println!("recyclable:       {} {:?}", recyclable.len(), recyclable);
    println!("preallocated:     {} {:?}", ahead.len(), ahead);
    if !scan.temporaries.is_empty() {
        println!("temporaries:      {:?}", scan.temporaries);
    }
    if !scan.other.is_empty() {
        println!("other files:      {:?}", scan.other);
    }
}
