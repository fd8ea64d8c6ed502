//! Append throughput of the ring with 1, 2 and 4 threads, over a device
//! that discards writes (so the ring's own cost is what is measured).
//!
//! `cargo bench -p iclog` measures with criterion (throughput in bytes and
//! appends); under `cargo test --benches` criterion runs each benchmark
//! once as a smoke test.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
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

/// Appends per measured batch, split over the threads.
const BATCH: u64 = 4096;

/// Time for `iters` batches of `BATCH` appends of `size` bytes from
/// `threads` threads (each batch on a fresh ring, forced at the end).
fn appends(threads: u64, size: usize, iters: u64) -> Duration {
    let payload = vec![0xA5u8; size];
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let ring = Arc::new(Ring::new(Config::default(), Discard, Lsn::ZERO, Lsn::ZERO).unwrap());
        let start = Instant::now();
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (ring, payload) = (ring.clone(), payload.clone());
                std::thread::spawn(move || {
                    for _ in 0..BATCH / threads {
                        ring.append(&payload).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        ring.force_all().unwrap();
        total += start.elapsed();
    }
    total
}

fn bench_append(c: &mut Criterion) {
    for size in [64usize, 256, 4096] {
        let mut g = c.benchmark_group(format!("append/{size}B"));
        g.throughput(Throughput::Elements(BATCH));
        for threads in [1u64, 2, 4] {
            g.bench_with_input(BenchmarkId::new("threads", threads), &threads, |b, &t| {
                b.iter_custom(|iters| appends(t, size, iters))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench_append);
criterion_main!(benches);
