//! Bounds both sides know: etcd's request limits, which the server
//! enforces and the tooling's workloads stay within, and the append rate
//! the fault matrix's catch-up bound is computed from.

/// The most operations in a transaction's branch, and comparisons
/// (etcd's `--max-txn-ops` default).
pub const MAX_TXN_OPS: usize = 128;

/// The largest request, in bytes of keys and values (etcd's
/// `--max-request-bytes` default, 1.5 MiB).
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// The slowest a follower is assumed to take an append's body in, write
/// and flush it (bytes per second): an append's deadline grows by its
/// body's size at this rate (the server's `network::append_deadline`).
pub const MIN_APPEND_RATE: u64 = 4 << 20;
