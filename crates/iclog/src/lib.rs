//! Placeholder: filled by issue 3 (XFS-style in-core log buffer ring). Exposes nothing yet.
