//! Auto-compaction, with etcd's meanings (`--auto-compaction-mode
//! periodic|revision`, `--auto-compaction-retention`): the leader decides
//! by its clock when to compact and proposes a [`Command::Compact`] —
//! a command in the log, applied alike on every replica; apply never
//! reads a clock.
//!
//! - **revision** with retention N: every [`REVISION_INTERVAL`] (etcd's
//!   five minutes), compact at the current revision less N, if that is
//!   above 0 and not the last one compacted.
//! - **periodic** with retention P: every node samples its revision every
//!   P/10 (at most six minutes); the leader compacts at the oldest sample
//!   it holds (about P ago) once P has passed, then every P (at most
//!   hourly) — etcd 3.4's periodic compactor.
//!
//! The leader also keeps a physical compaction going on an idle cluster:
//! the versions a compaction removes go a bounded number an entry
//! (`machine/compact.rs`), so while one is under way and no writes come
//! it proposes [`Command::CompactProgress`], one entry after the other,
//! until it is done.

use crate::machine::StateMachine;
use crate::propose::{Outcome, Proposer};
use crate::types::{Command, NodeId, Raft};
use openraft::async_runtime::WatchReceiver;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// etcd's interval of the revision mode.
pub const REVISION_INTERVAL: Duration = Duration::from_secs(300);
/// How long a proposal may take before the compactor tries again.
const WAIT: Duration = Duration::from_secs(5);

/// How versions are compacted automatically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep the versions of the last `retention` (etcd's `periodic`).
    Periodic(Duration),
    /// Keep the last `retention` revisions, compacting every `interval`
    /// (etcd's `revision`; its interval is [`REVISION_INTERVAL`]).
    Revision {
        /// Revisions kept.
        retention: i64,
        /// How often the leader compacts.
        interval: Duration,
    },
}

impl AutoCompaction {
    /// From etcd's flags: `mode` `periodic` or `revision`, `retention` a
    /// duration for periodic (`1h`, `30m`, `90s`, or a number of hours)
    /// or a number of revisions; `None` for a retention of 0 (off).
    pub fn parse(mode: &str, retention: &str) -> Result<Option<AutoCompaction>, String> {
        let r = retention.trim();
        match mode {
            "periodic" => {
                let d = parse_duration(r)?;
                Ok((!d.is_zero()).then_some(AutoCompaction::Periodic(d)))
            }
            "revision" => {
                let n: i64 = r
                    .parse()
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| format!("a revision retention is a count, not {r:?}"))?;
                Ok((n > 0).then_some(AutoCompaction::Revision {
                    retention: n,
                    interval: REVISION_INTERVAL,
                }))
            }
            m => Err(format!(
                "--auto-compaction-mode is periodic or revision, not {m:?}"
            )),
        }
    }
}

/// etcd's retention durations: `1h`, `30m`, `90s`, `1h30m`, or a bare
/// number of hours.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("a periodic retention is like 1h, 30m or 90s, not {s:?}");
    if let Ok(h) = s.parse::<u64>() {
        return Ok(Duration::from_secs(h.checked_mul(3600).ok_or_else(bad)?));
    }
    let (mut total, mut num) = (0u64, String::new());
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            num.push(ch);
            continue;
        }
        let unit = match ch {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        let n: u64 = num.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|x| total.checked_add(x))
            .ok_or_else(bad)?;
        num.clear();
    }
    if !num.is_empty() || s.is_empty() {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// The compactor's decisions, every instant given (unit-tested).
#[derive(Debug)]
pub struct Schedule {
    mode: AutoCompaction,
    /// Periodic: the revisions sampled, oldest first.
    revs: VecDeque<i64>,
    /// The last compaction proposed and applied (or found done).
    last: Instant,
    /// Periodic: the wait before the next compaction (the whole period
    /// before the first).
    wait: Duration,
    /// Revision: the last revision compacted at.
    prev: i64,
}

impl Schedule {
    /// A compactor started at `now`.
    pub fn new(mode: AutoCompaction, now: Instant) -> Schedule {
        let wait = match mode {
            AutoCompaction::Periodic(p) => p,
            AutoCompaction::Revision { interval, .. } => interval,
        };
        Schedule {
            mode,
            revs: VecDeque::new(),
            last: now,
            wait,
            prev: 0,
        }
    }

    /// How often it looks: the sampling interval of the periodic mode,
    /// the revision mode's interval.
    pub fn tick(&self) -> Duration {
        match self.mode {
            AutoCompaction::Periodic(p) => {
                (p.min(Duration::from_secs(3600)) / 10).max(Duration::from_millis(10))
            }
            AutoCompaction::Revision { interval, .. } => interval,
        }
    }

    /// A look at `now`, the store at `current`: the revision to compact
    /// at, if one is due.
    pub fn look(&mut self, now: Instant, current: i64) -> Option<i64> {
        match self.mode {
            AutoCompaction::Revision { retention, .. } => {
                let rev = current - retention;
                (rev > 0 && rev != self.prev).then_some(rev)
            }
            AutoCompaction::Periodic(p) => {
                let keep = (p.as_nanos() / self.tick().as_nanos().max(1)) as usize + 1;
                self.revs.push_back(current);
                while self.revs.len() > keep {
                    self.revs.pop_front();
                }
                if now.saturating_duration_since(self.last) < self.wait {
                    return None;
                }
                self.revs.front().copied().filter(|r| *r > 0)
            }
        }
    }

    /// The compaction at `rev` was applied (or a later one was) at `now`.
    pub fn compacted(&mut self, now: Instant, rev: i64) {
        self.last = now;
        self.prev = rev;
        if let AutoCompaction::Periodic(p) = self.mode {
            self.wait = p.min(Duration::from_secs(3600));
        }
    }
}

/// Runs node `me`'s compactor until Raft stops: every node samples, the
/// leader proposes (see the module docs).
pub async fn run(
    raft: Raft,
    proposer: Proposer,
    machine: StateMachine,
    me: NodeId,
    mode: Option<AutoCompaction>,
) {
    let mut schedule = mode.map(|m| Schedule::new(m, Instant::now()));
    let mut revisions = machine.revision_watch();
    let mut server = raft.server_metrics();
    let mut next = schedule.as_ref().map(|s| Instant::now() + s.tick());
    loop {
        let leads = {
            let m = server.borrow_watched();
            m.state.is_leader() && m.current_leader == Some(me)
        };
        let r = *revisions.borrow_and_update();
        if leads && r.physical < r.compact {
            // A compaction under way: an entry for it to go on in.
            let out = tokio::time::timeout(WAIT, proposer.propose(Command::CompactProgress)).await;
            if !matches!(out, Ok(Outcome::Applied { .. })) {
                // (Busy, or leadership lost: look again once something
                // changed, or a while later.)
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    r = server.changed() => if r.is_err() { return },
                }
            }
            continue;
        }
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            _ = tokio::time::sleep_until(next.unwrap_or(far)) => {
                let Some(s) = schedule.as_mut() else { continue };
                let now = Instant::now();
                next = Some(now + s.tick());
                let current = machine.revisions().current;
                let Some(rev) = s.look(now, current) else { continue };
                if !leads {
                    continue;
                }
                let cmd = Command::Compact { revision: rev, physical: false };
                let out = tokio::time::timeout(WAIT, proposer.propose(cmd)).await;
                if let Ok(Outcome::Applied { verdict, .. }) = out {
                    let ok = matches!(
                        verdict,
                        crate::Verdict::Applied { .. }
                            | crate::Verdict::Refused(crate::kv::KvError::Compacted { .. })
                    );
                    if ok {
                        s.compacted(now, rev);
                    }
                }
            }
            r = revisions.changed() => if r.is_err() { return },
            r = server.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcds_flags_parse() {
        assert_eq!(
            AutoCompaction::parse("periodic", "1h"),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(3600))))
        );
        assert_eq!(
            AutoCompaction::parse("periodic", "2"),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(7200))))
        );
        assert_eq!(
            AutoCompaction::parse("periodic", "1h30m"),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(5400))))
        );
        assert_eq!(AutoCompaction::parse("periodic", "0"), Ok(None));
        assert_eq!(
            AutoCompaction::parse("revision", "1000"),
            Ok(Some(AutoCompaction::Revision {
                retention: 1000,
                interval: REVISION_INTERVAL
            }))
        );
        assert_eq!(AutoCompaction::parse("revision", "0"), Ok(None));
        assert!(AutoCompaction::parse("revision", "1h").is_err());
        assert!(AutoCompaction::parse("daily", "1").is_err());
        assert!(AutoCompaction::parse("periodic", "5x").is_err());
        assert!(AutoCompaction::parse("periodic", "m").is_err());
    }

    #[test]
    fn the_revision_mode_keeps_the_last_n_revisions() {
        let t0 = Instant::now();
        let mode = AutoCompaction::Revision {
            retention: 100,
            interval: REVISION_INTERVAL,
        };
        let mut s = Schedule::new(mode, t0);
        assert_eq!(s.tick(), REVISION_INTERVAL);
        assert_eq!(s.look(t0, 50), None, "nothing below the retention");
        assert_eq!(s.look(t0, 350), Some(250));
        s.compacted(t0, 250);
        assert_eq!(s.look(t0, 350), None, "not twice at one revision");
        assert_eq!(s.look(t0, 351), Some(251));
    }

    #[test]
    fn the_periodic_mode_compacts_at_the_revision_of_a_period_ago() {
        let t0 = Instant::now();
        let p = Duration::from_secs(600);
        let mut s = Schedule::new(AutoCompaction::Periodic(p), t0);
        assert_eq!(s.tick(), Duration::from_secs(60));
        // Samples every minute, the revision growing by 10 a minute.
        let mut due = Vec::new();
        for m in 0..=25u64 {
            let now = t0 + Duration::from_secs(60 * m);
            if let Some(rev) = s.look(now, 1 + 10 * m as i64) {
                due.push((m, rev));
                s.compacted(now, rev);
            }
        }
        // First after the whole period, at the sample of a period ago;
        // then every period.
        assert_eq!(due, [(10, 1), (20, 101)]);
        // An hour at most between two, and at the samples of an hour ago.
        let day = Duration::from_secs(24 * 3600);
        let mut s = Schedule::new(AutoCompaction::Periodic(day), t0);
        assert_eq!(s.tick(), Duration::from_secs(360));
        let mut due = Vec::new();
        for k in 0..=300u64 {
            let now = t0 + Duration::from_secs(360 * k);
            if let Some(rev) = s.look(now, 1 + k as i64) {
                due.push((k, rev));
                s.compacted(now, rev);
            }
        }
        assert_eq!(due[0], (240, 1), "after a day");
        assert_eq!(due[1].0, 250, "then hourly");
    }
}
