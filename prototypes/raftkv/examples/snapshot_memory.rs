//! The memory a snapshot costs, at a real size: a state machine is filled
//! with N keys (on the local disk), a snapshot is built, copied into a
//! second machine's receiving file as openraft's chunks would be, and
//! installed there. For each step, the peak resident memory above what
//! the process held before it (Linux: `VmHWM` reset through
//! `/proc/self/clear_refs`), the time and the file's size; one JSON line.
//!
//! ```sh
//! cargo run --release -p raftkv --example snapshot_memory -- 1000000 1024 /tmp
//! ```

use journal_core::vfs::{OpenOptions, OsVfs, Vfs};
use openraft::impls::leader_id_adv::LeaderId;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, LogId};
type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;
use raftkv::{Batch, Command, StateMachine};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncSeekExt;

/// A field of `/proc/self/status`, in MiB.
fn status_mib(field: &str) -> f64 {
    let vfs = OsVfs::new();
    let Ok(f) = vfs.open(Path::new("/proc/self/status"), OpenOptions::read()) else {
        return 0.0;
    };
    let mut buf = vec![0u8; 16 << 10];
    let n = f.read_at(&mut buf, 0).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Resets the peak (`VmHWM`) to the present resident set.
fn reset_peak() {
    let vfs = OsVfs::new();
    if let Ok(f) = vfs.open(Path::new("/proc/self/clear_refs"), OpenOptions::write()) {
        let _ = f.write_at(b"5", 0);
    }
}

/// Runs `step`, returning its result, seconds, and the peak resident
/// memory above the resident set before it, MiB.
async fn measured<T>(step: impl std::future::Future<Output = T>) -> (T, f64, f64) {
    reset_peak();
    let before = status_mib("VmRSS");
    let t = Instant::now();
    let r = step.await;
    (r, t.elapsed().as_secs_f64(), status_mib("VmHWM") - before)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let keys: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let size: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1024);
    let base = args.get(3).map_or_else(std::env::temp_dir, Into::into);
    let tmp = tempfile::tempdir_in(base).expect("a temporary directory");
    let vfs: Arc<dyn Vfs> = Arc::new(OsVfs::new());
    let mut src = StateMachine::open(vfs.clone(), tmp.path().join("src"), Default::default())
        .expect("open the source");
    let t = Instant::now();
    let mut index = 0;
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
        index += 1;
        let cmds = chunk
            .iter()
            .map(|i| Command::put(format!("k/{i:010}"), vec![(*i % 251) as u8; size], None))
            .collect();
        let e = Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Normal(Batch(cmds)),
        };
        src.apply_all([e]).await.expect("apply");
    }
    let fill_s = t.elapsed().as_secs_f64();
    let rss_filled = status_mib("VmRSS");
    let (snap, build_s, build_mib) = measured(src.build_snapshot()).await;
    let mut snap = snap.expect("build");
    let bytes = snap.snapshot.seek(std::io::SeekFrom::End(0)).await.unwrap();
    let mut dst = StateMachine::open(vfs, tmp.path().join("dst"), Default::default())
        .expect("open the target");
    let send = async {
        let mut rx = dst.receive().expect("receive");
        snap.snapshot
            .seek(std::io::SeekFrom::Start(0))
            .await
            .unwrap();
        tokio::io::copy(&mut snap.snapshot, &mut rx)
            .await
            .expect("copy");
        rx
    };
    let (rx, send_s, send_mib) = measured(send).await;
    let (r, install_s, install_mib) = measured(dst.install_snapshot(&snap.meta, rx)).await;
    r.expect("install");
    assert_eq!(dst.applied(), src.applied());
    println!(
        "{}",
        serde_json::json!({
            "keys": keys, "value_size": size, "fill_s": fill_s,
            "rss_after_fill_mib": rss_filled, "snapshot_bytes": bytes,
            "build_s": build_s, "build_peak_above_mib": build_mib,
            "send_s": send_s, "send_peak_above_mib": send_mib,
            "install_s": install_s, "install_peak_above_mib": install_mib,
        })
    );
}
