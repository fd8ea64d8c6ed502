//! A loom model over SimVfs: a crash concurrent with a writer never loses
//! what the writer had acknowledged, in any interleaving.

use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::{model, thread, Arc};
use journal_vfs::{CrashPolicy, OpenOptions, SimVfs, Vfs};
use std::path::Path;

#[test]
fn acknowledged_writes_survive_a_concurrent_crash() {
    model(|| {
        let vfs = SimVfs::new();
        let dir = Path::new("/j");
        vfs.create_dir_all(dir).unwrap();
        let p = dir.join("f");
        vfs.open(&p, OpenOptions::create()).unwrap();
        vfs.sync_dir(dir).unwrap();
        let acked = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);

        let (v1, a1, p1) = (vfs.clone(), acked.clone(), p.clone());
        let synced = thread::spawn(move || {
            let f = v1.open(&p1, OpenOptions::write()).unwrap();
            f.write_at(&[1; 512], 0).unwrap();
            f.sync_data().unwrap();
            a1[0].store(true, Ordering::Release);
        });
        let (v2, a2, p2) = (vfs.clone(), acked.clone(), p.clone());
        let fua = thread::spawn(move || {
            let f = v2.open(&p2, OpenOptions::write()).unwrap();
            f.write_at_fua(&[2; 512], 512).unwrap();
            a2[1].store(true, Ordering::Release);
        });

        let was_acked = [
            acked[0].load(Ordering::Acquire),
            acked[1].load(Ordering::Acquire),
        ];
        let image = vfs
            .crash(CrashPolicy::DropUnsynced)
            .live_contents(&p)
            .unwrap();
        let sector = |i: usize| image.get(i * 512..(i + 1) * 512);
        if was_acked[0] {
            assert_eq!(sector(0), Some(&[1u8; 512][..]));
        }
        if was_acked[1] {
            assert_eq!(sector(1), Some(&[2u8; 512][..]));
        }
        synced.join().unwrap();
        fua.join().unwrap();
    });
}
