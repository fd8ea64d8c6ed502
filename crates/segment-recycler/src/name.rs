//! Segment file names: 16 lowercase hex digits of the segment number and
//! `.seg`, so lexical order is numeric order.

/// The suffix of a segment file.
pub const SUFFIX: &str = ".seg";
/// The suffix of a segment being created (never a valid segment).
pub const TMP_SUFFIX: &str = ".seg.tmp";

/// The file name of segment `n`: `0000000000000001.seg`.
pub fn segment_name(n: u64) -> String {
    format!("{n:016x}{SUFFIX}")
}

/// The temporary name segment `n` is created under before it is installed.
pub fn tmp_name(n: u64) -> String {
    format!("{n:016x}{TMP_SUFFIX}")
}

/// What a directory entry is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// A segment file.
    Segment(u64),
    /// A leftover of an interrupted segment creation.
    Temporary(u64),
    /// Anything else.
    Other,
}

fn parse_hex16(s: &str) -> Option<u64> {
    if s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        u64::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

/// Classifies a directory entry name.
pub fn parse_name(name: &str) -> NameKind {
    if let Some(n) = name.strip_suffix(TMP_SUFFIX).and_then(parse_hex16) {
        return NameKind::Temporary(n);
    }
    if let Some(n) = name.strip_suffix(SUFFIX).and_then(parse_hex16) {
        return NameKind::Segment(n);
    }
    NameKind::Other
}
