//! Placeholder: filled by issue 6 (the Journal facade). Exposes nothing yet.
