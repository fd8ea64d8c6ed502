//! Append throughput of the ring with 1, 2 and 4 threads, over a device
//! that discards writes (so the ring's own cost is what is measured).
//!
//! `cargo bench -p iclog` runs it for real; under `cargo test` (no
//! `--bench` argument) it runs a few iterations as a smoke test.

use iclog::{Config, DeviceError, IoFlags, LogDevice, Lsn, Ring};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Discard;
impl LogDevice for Discard {
    type Error = DeviceError;
    fn write(&self, _: Lsn, _: &[u8], _: IoFlags) -> Result<(), DeviceError> {
        Ok(())
    }
    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

fn run(threads: usize, per_thread: usize, size: usize) -> Duration {
    let ring = Arc::new(Ring::new(Config::default(), Discard, Lsn::ZERO, Lsn::ZERO).unwrap());
    let payload = vec![0xA5u8; size];
    let start = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let (ring, payload) = (ring.clone(), payload.clone());
            std::thread::spawn(move || {
                for _ in 0..per_thread {
                    ring.append(&payload).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    ring.force_all().unwrap();
    start.elapsed()
}

fn main() {
    let real = std::env::args().any(|a| a == "--bench");
    let total = if real { 2_000_000 } else { 2_000 };
    println!(
        "{:>8} {:>6} {:>14} {:>10}",
        "threads", "bytes", "appends/s", "MiB/s"
    );
    for size in [64usize, 256, 4096] {
        for threads in [1usize, 2, 4] {
            let per = total / threads / if size > 1024 { 8 } else { 1 };
            let t = run(threads, per, size);
            let n = (per * threads) as f64;
            let rate = n / t.as_secs_f64();
            println!(
                "{threads:>8} {size:>6} {rate:>14.0} {:>10.1}",
                rate * size as f64 / (1 << 20) as f64
            );
        }
    }
}
