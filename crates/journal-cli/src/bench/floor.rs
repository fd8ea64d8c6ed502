//! The wake-up floor: what one park + unpark pair between two threads costs
//! on this machine, with the journal's own lock and condvar
//! (`journal_core::sync`). Every committer a group commit puts to sleep
//! and wakes pays at least this; the group-commit scenario prints its CPU
//! per commit beside it.

use journal_core::sync::{Arc, Condvar, Mutex};
use journal_core::vfs::process_usage;
use serde_json::{json, Value as Json};
use std::time::Instant;

/// One measurement of the floor.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// CPU time (both threads, user + system) per park + unpark pair, µs.
    pub cpu_us: f64,
    /// Wall-clock time per pair, µs.
    pub wall_us: f64,
    /// Voluntary context switches per pair.
    pub switches: f64,
}

impl Floor {
    /// As JSON.
    pub fn json(&self) -> Json {
        json!({"cpu_us_per_pair": self.cpu_us, "wall_us_per_pair": self.wall_us, "switches_per_pair": self.switches})
    }
}

/// Two threads pass a token back and forth for about `seconds`, each
/// parking on the condvar until the token is its own: every pass is one
/// park and one unpark.
pub fn measure(seconds: f64) -> Result<Floor, String> {
    struct Token {
        turn: Mutex<(u8, bool)>,
        cv: Condvar,
    }
    let t = Arc::new(Token {
        turn: Mutex::new((0, false)),
        cv: Condvar::new(),
    });
    let pass = |t: &Token, me: u8| -> bool {
        let mut g = t.turn.lock();
        while g.0 != me && !g.1 {
            g = t.cv.wait(g);
        }
        if g.1 {
            return false;
        }
        g.0 = 1 - me;
        drop(g);
        t.cv.notify_one();
        true
    };
    let u0 = process_usage().map_err(|e| format!("getrusage: {e}"))?;
    let start = Instant::now();
    let other = {
        let t = t.clone();
        std::thread::Builder::new()
            .name("floor".into())
            .spawn(move || while pass(&t, 1) {})
            .map_err(|e| format!("cannot start a thread: {e}"))?
    };
    let mut passes = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..100 {
            pass(&t, 0);
            passes += 2;
        }
    }
    t.turn.lock().1 = true;
    t.cv.notify_all();
    other
        .join()
        .map_err(|_| "the floor thread panicked".to_string())?;
    let wall = start.elapsed().as_secs_f64();
    let u = process_usage()
        .map_err(|e| format!("getrusage: {e}"))?
        .since(&u0);
    let n = passes.max(1) as f64;
    Ok(Floor {
        cpu_us: u.cpu.as_secs_f64() * 1e6 / n,
        wall_us: wall * 1e6 / n,
        switches: u.voluntary_switches as f64 / n,
    })
}
