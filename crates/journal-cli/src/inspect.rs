//! `journal dump`, `journal verify`, `journal stat`: read-only inspection.
//!
//! They open every file read-only and never take the directory lock, so a
//! live writer is never blocked; what they report about a journal being
//! written is a snapshot that may end mid-flight.

use crate::args::Args;
use iclog::format::RecordCheck;
use journal_core::reader::LogReader;
use journal_core::recovery::{self, LogEnd};
use journal_core::{read_control, Control, Lsn, RecoveryMode};
use journal_vfs::{OsVfs, Vfs};
use segment_recycler::{HeaderCheck, DATA_OFFSET};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A failure of an inspection command: its message and exit code.
pub struct Failure {
    /// One line for stderr.
    pub message: String,
    /// The exit code.
    pub code: i32,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        code: 2,
    }
}

fn parse_lsn(s: &str) -> Result<Lsn, Failure> {
    let v = if let Some(hex) = s.strip_prefix("0x") {
        u64::from_str_radix(hex, 16)
    } else {
        s.parse()
    };
    v.map(Lsn).map_err(|_| fail(format!("bad LSN {s:?}")))
}

/// Opens the journal in the directory named by the first positional
/// argument, read-only: its control file and a log reader.
fn open(args: &Args) -> Result<(PathBuf, Arc<dyn Vfs>, Control, LogReader), Failure> {
    let dir = PathBuf::from(
        args.positional
            .get(1)
            .ok_or_else(|| fail("missing journal directory"))?,
    );
    let vfs: Arc<dyn Vfs> = Arc::new(OsVfs::new());
    if !vfs.exists(&dir).unwrap_or(false) {
        return Err(fail(format!("{}: no such directory", dir.display())));
    }
    let control = match read_control(&*vfs, &dir) {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Err(fail(format!(
                "{}: not a journal (no control file)",
                dir.display()
            )))
        }
        Err(e) => return Err(fail(e.to_string())),
    };
    let reader = LogReader::new(vfs.clone(), &dir, control.segment_size, control.alignment);
    Ok((dir, vfs, control, reader))
}

fn flags(f: iclog::IoFlags) -> String {
    let mut v = Vec::new();
    if f.contains(iclog::IoFlags::PREFLUSH) {
        v.push("PREFLUSH");
    }
    if f.contains(iclog::IoFlags::FUA) {
        v.push("FUA");
    }
    if v.is_empty() {
        "-".into()
    } else {
        v.join("|")
    }
}

/// `journal dump DIR [--from LSN] [--limit N] [--entries]`.
pub fn dump(args: &Args) -> Result<i32, Failure> {
    args.only(&["from", "limit", "entries"]).map_err(fail)?;
    let (dir, _, c, mut reader) = open(args)?;
    let from = args
        .value("from")
        .map(parse_lsn)
        .transpose()?
        .unwrap_or(c.scan_lsn);
    let limit: u64 = args.parsed("limit", u64::MAX).map_err(fail)?;
    let entries = args.flag("entries");
    println!(
        "# journal {}: segment size {}, alignment {}, redo {}, scan from {}",
        dir.display(),
        c.segment_size,
        c.alignment,
        c.redo_lsn,
        c.scan_lsn
    );
    let mut pos = c.scan_lsn;
    let mut shown = 0;
    loop {
        if shown >= limit {
            break;
        }
        match reader.check(pos).map_err(|e| fail(e.to_string()))? {
            RecordCheck::Valid(r) => {
                let end = r.end();
                if end > from {
                    println!(
                        "lsn={} len={} size={} flags={} entries={} tail={} crc=ok",
                        r.lsn(),
                        r.header.len.get(),
                        r.size,
                        flags(r.flags()),
                        r.header.entry_count.get(),
                        r.tail_lsn()
                    );
                    if entries {
                        for (l, b) in r.entries() {
                            let preview: String =
                                b.iter().take(16).map(|x| format!("{x:02x}")).collect();
                            println!(
                                "  entry lsn={l} len={} {preview}{}",
                                b.len(),
                                if b.len() > 16 { "…" } else { "" }
                            );
                        }
                    }
                    shown += 1;
                }
                pos = end;
            }
            other => {
                println!("end at lsn={pos}: {}", describe(&other));
                break;
            }
        }
    }
    Ok(0)
}

fn describe(c: &RecordCheck<'_>) -> String {
    match c {
        RecordCheck::Valid(_) => "valid".into(),
        RecordCheck::Zeroes => "zeroes (end of log)".into(),
        RecordCheck::BadMagic { found } => format!("no record (magic {found:#010x})"),
        RecordCheck::LsnMismatch { found } => {
            format!("stale record of LSN {found} (recycled file)")
        }
        RecordCheck::UnsupportedVersion { found } => format!("record format version {found}"),
        RecordCheck::Truncated { needed, available } => {
            format!("crc=bad: truncated ({needed} bytes needed, {available} available)")
        }
        RecordCheck::CrcMismatch { .. } => "crc=bad: checksum mismatch".into(),
    }
}

fn check_segments(dir: &Path, vfs: &dyn Vfs, c: &Control) -> Result<Vec<String>, Failure> {
    let scan = segment_recycler::scan(vfs, dir).map_err(|e| fail(e.to_string()))?;
    let mut problems = Vec::new();
    for s in &scan.segments {
        match s.header {
            HeaderCheck::Valid(h) => {
                if h.journal_id != c.journal_id {
                    problems.push(format!("segment {} belongs to another journal", s.number));
                } else if h.segment_size.get() != c.segment_size || s.len != c.segment_size {
                    problems.push(format!("segment {} has the wrong size", s.number));
                }
            }
            HeaderCheck::Zeroes => {}
            HeaderCheck::UnsupportedVersion(v) => {
                return Err(fail(format!(
                    "{}: segment format version {v} is newer than this build",
                    s.path.display()
                )))
            }
            other => problems.push(format!("segment {}: bad header ({other:?})", s.number)),
        }
    }
    Ok(problems)
}

/// `journal verify DIR`: exit 0 when clean or torn at the tail (with a
/// warning), 1 on corruption (the LSN named), 2 when it cannot tell.
pub fn verify(args: &Args) -> Result<i32, Failure> {
    args.only(&[]).map_err(fail)?;
    let (dir, vfs, c, mut reader) = open(args)?;
    let problems = check_segments(&dir, &*vfs, &c)?;
    for p in &problems {
        eprintln!("journal verify: {p}");
    }
    match recovery::scan(
        &mut reader,
        c.scan_lsn,
        RecoveryMode::TolerateTornTail,
        c.inflight_window,
    ) {
        Ok(r) => {
            if let LogEnd::TornTail { lsn, detail } = &r.end {
                eprintln!("journal verify: warning: torn tail at LSN {lsn} ({detail}): recovery will cut it off");
            }
            println!(
                "{}: {} records, {} entries from LSN {} to {}",
                dir.display(),
                r.records,
                r.entries,
                r.redo_lsn,
                r.end_lsn
            );
            Ok(if problems.is_empty() { 0 } else { 1 })
        }
        Err(journal_core::Error::Corruption {
            lsn,
            segment,
            detail,
        }) => {
            eprintln!("journal verify: corruption at LSN {lsn} (segment {segment}): {detail}");
            Ok(1)
        }
        Err(e) => Err(fail(e.to_string())),
    }
}

/// `journal stat DIR`.
pub fn stat(args: &Args) -> Result<i32, Failure> {
    args.only(&[]).map_err(fail)?;
    let (dir, vfs, c, mut reader) = open(args)?;
    let scan = segment_recycler::scan(&*vfs, &dir).map_err(|e| fail(e.to_string()))?;
    let data = c.segment_size - DATA_OFFSET;
    let numbers: Vec<u64> = scan.segments.iter().map(|s| s.number).collect();
    let id: String = c.journal_id.iter().map(|b| format!("{b:02x}")).collect();
    println!("journal:          {}", dir.display());
    println!("journal id:       {id}");
    println!("segment size:     {} ({} data bytes)", c.segment_size, data);
    println!("alignment:        {}", c.alignment);
    println!(
        "checkpoint:       redo {} (scan from {}), control seq {}",
        c.redo_lsn, c.scan_lsn, c.seq
    );
    let (lo, hi) = (numbers.first().copied(), numbers.last().copied());
    match (lo, hi) {
        (Some(lo), Some(hi)) => {
            let gaps: Vec<u64> = (lo..hi).filter(|n| !numbers.contains(n)).collect();
            println!(
                "segments:         {} ({lo}..={hi}){}",
                numbers.len(),
                if gaps.is_empty() {
                    String::new()
                } else {
                    format!(", gaps {gaps:?}")
                }
            );
        }
        _ => println!("segments:         0"),
    }
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
    println!(
        "frontier:         {}",
        frontier.map_or("none".into(), |f| f.to_string())
    );
    let report = recovery::scan(
        &mut reader,
        c.scan_lsn,
        RecoveryMode::SkipCorrupt,
        c.inflight_window,
    )
    .map_err(|e| fail(e.to_string()))?;
    let end_note = match &report.end {
        LogEnd::Clean { found } => format!("clean end: {found}"),
        LogEnd::TornTail { detail, .. } => format!("torn tail: {detail}"),
    };
    println!(
        "last valid LSN:   {} ({} records; {end_note})",
        report.end_lsn, report.records
    );
    if !report.skipped.is_empty() {
        println!("corrupt ranges:   {:?}", report.skipped);
    }
    let tail_seg = c.scan_lsn.0 / data;
    let head_seg = report.end_lsn.0 / data;
    let recyclable: Vec<u64> = numbers.iter().copied().filter(|&n| n < tail_seg).collect();
    let ahead: Vec<u64> = numbers.iter().copied().filter(|&n| n > head_seg).collect();
    println!("live segments:    {tail_seg}..={head_seg}");
    println!("recyclable:       {} {:?}", recyclable.len(), recyclable);
    println!("preallocated:     {} {:?}", ahead.len(), ahead);
    if !scan.temporaries.is_empty() {
        println!("temporaries:      {:?}", scan.temporaries);
    }
    if !scan.other.is_empty() {
        println!("other files:      {:?}", scan.other);
    }
    Ok(0)
}
