//! `GET /metrics`: a node's metrics in Prometheus's text format, from the
//! `prometheus` crate (its own registry per node, no global state).
//!
//! | metric | type | what |
//! |---|---|---|
//! | `raftkv_proposals_total` | counter | client writes handed to Raft by this node (as leader) |
//! | `raftkv_proposal_entries_total` | counter | log entries they were gathered into |
//! | `raftkv_applied_index` | gauge | the last index applied to the state machine |
//! | `raftkv_last_log_index` | gauge | the last index in this node's log |
//! | `raftkv_apply_lag` | gauge | the two's difference: entries logged, not yet applied |
//! | `raftkv_term` | gauge | the current term |
//! | `raftkv_is_leader` | gauge | 1 on the leader |
//! | `raftkv_leader_changes_total` | counter | changes of the leader this node knows of |
//! | `raftkv_log_flush_duration_seconds` | histogram | an append to the Raft log until durable (etcd's `wal_fsync_duration_seconds`) |
//! | `raftkv_snapshot_duration_seconds{op}` | histogram | building (`build`) or installing (`install`) a snapshot |
//! | `raftkv_snapshot_bytes{op}` | gauge | the size of the last snapshot file built or installed |
//! | `raftkv_snapshots_declined_total` | counter | snapshots the byte policy asked for and the node did not build: no room for one beside the disk-space reserve ([`crate::space::Space::room_for`]) |
//! | `raftkv_request_duration_seconds{method,route,code}` | histogram | client and Raft requests served |
//! | `raftkv_append_body_max_bytes` | gauge | the largest Raft append body this node sent (bounded by [`crate::network::APPEND_BUDGET`] and one entry) |

use crate::types::NodeId;
use journal_core::sync::Mutex;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::time::Duration;

/// Latency buckets, seconds: 100 µs to 10 s.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// A node's metrics (see the module docs).
pub struct Metrics {
    registry: Registry,
    /// Client writes proposed.
    pub proposals: IntCounter,
    /// Entries they went into.
    pub proposal_entries: IntCounter,
    applied_index: IntGauge,
    last_log_index: IntGauge,
    apply_lag: IntGauge,
    term: IntGauge,
    is_leader: IntGauge,
    leader_changes: IntCounter,
    /// Snapshots not built for want of disk space.
    pub snapshots_declined: IntCounter,
    /// Appends to the Raft log until durable.
    pub log_flush: Histogram,
    snapshot_seconds: HistogramVec,
    snapshot_bytes: IntGaugeVec,
    requests: HistogramVec,
    append_body_max: IntGauge,
    leader: Mutex<Option<NodeId>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn histogram(name: &str, help: &str) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(BUCKETS.to_vec())
}

impl Metrics {
    /// A new set, registered in a registry of its own.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let m = Metrics {
            proposals: counter("raftkv_proposals_total", "Client writes handed to Raft")?,
            proposal_entries: counter(
                "raftkv_proposal_entries_total",
                "Log entries client writes were gathered into",
            )?,
            applied_index: gauge("raftkv_applied_index", "The last index applied")?,
            last_log_index: gauge("raftkv_last_log_index", "The last index in the log")?,
            apply_lag: gauge("raftkv_apply_lag", "Entries in the log not yet applied")?,
            term: gauge("raftkv_term", "The current term")?,
            is_leader: gauge("raftkv_is_leader", "1 on the leader")?,
            leader_changes: counter(
                "raftkv_leader_changes_total",
                "Changes of the leader this node knows of",
            )?,
            snapshots_declined: counter(
                "raftkv_snapshots_declined_total",
                "Snapshots not built for want of disk space",
            )?,
            log_flush: Histogram::with_opts(histogram(
                "raftkv_log_flush_duration_seconds",
                "An append to the Raft log until durable",
            ))?,
            snapshot_seconds: HistogramVec::new(
                histogram(
                    "raftkv_snapshot_duration_seconds",
                    "Building or installing a snapshot",
                ),
                &["op"],
            )?,
            snapshot_bytes: IntGaugeVec::new(
                Opts::new(
                    "raftkv_snapshot_bytes",
                    "The last snapshot file built or installed",
                ),
                &["op"],
            )?,
            requests: HistogramVec::new(
                histogram("raftkv_request_duration_seconds", "Requests served"),
                &["method", "route", "code"],
            )?,
            append_body_max: gauge(
                "raftkv_append_body_max_bytes",
                "The largest Raft append body sent",
            )?,
            leader: Mutex::new(None),
            registry,
        };
        for c in [
            Box::new(m.log_flush.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.snapshot_seconds.clone()),
            Box::new(m.snapshot_bytes.clone()),
            Box::new(m.requests.clone()),
        ] {
            m.registry.register(c)?;
        }
        Ok(m)
    }

    /// Notes Raft's view: indexes, term, leadership, leader changes.
    pub fn observe_raft(&self, id: NodeId, m: &openraft::RaftMetrics<crate::TypeConfig>) {
        let applied = m.last_applied.map_or(0, |l| l.index);
        let last = m.last_log_index.unwrap_or(0);
        self.applied_index.set(applied as i64);
        self.last_log_index.set(last as i64);
        self.apply_lag.set(last.saturating_sub(applied) as i64);
        self.term.set(m.current_term as i64);
        self.is_leader.set(i64::from(m.current_leader == Some(id)));
        // Counted as etcd's `leader_changes_seen_total`: the first leader
        // seen is a change too.
        let mut leader = self.leader.lock();
        if m.current_leader.is_some() && *leader != m.current_leader {
            self.leader_changes.inc();
            *leader = m.current_leader;
        }
    }

    /// Notes a snapshot built or installed (`op`): its duration and size.
    pub fn observe_snapshot(&self, op: &str, took: Duration, bytes: u64) {
        self.snapshot_seconds
            .with_label_values(&[op])
            .observe(took.as_secs_f64());
        self.snapshot_bytes
            .with_label_values(&[op])
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Notes a Raft append body of `bytes` sent.
    pub fn observe_append_body(&self, bytes: usize) {
        let b = i64::try_from(bytes).unwrap_or(i64::MAX);
        if b > self.append_body_max.get() {
            self.append_body_max.set(b);
        }
    }

    /// Notes a request served.
    pub fn observe_request(&self, method: &str, route: &str, code: u16, took: Duration) {
        self.requests
            .with_label_values(&[method, route, &code.to_string()])
            .observe(took.as_secs_f64());
    }

    /// Everything, in Prometheus's text format.
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}
