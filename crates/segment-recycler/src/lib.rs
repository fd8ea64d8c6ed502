//! Placeholder: filled by issue 5 (segment files, recycling, durability frontier). Exposes nothing yet.
