//! Placeholder: filled by issue 4 (jbd-style commit batching). Exposes nothing yet.
