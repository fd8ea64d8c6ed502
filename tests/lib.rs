//! Shared helpers of the integration scenarios.
