//! The `kvstore` command: `check` reads a store without writing it home
//! (no checkpoint before or after the walk); `Options::read_only`, which
//! it opens with, refuses writes.

use journal_core::vfs::{OpenOptions, OsVfs, Vfs};
use kvstore::{Error, Options, Store};
use std::path::Path;
use std::process::Command;

fn file_bytes(path: &Path) -> Vec<u8> {
    let f = OsVfs::new().open(path, OpenOptions::read()).unwrap();
    let mut buf = vec![0u8; f.len().unwrap() as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn check_walks_the_store_without_writing_its_pages_home() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let o = Options {
        checkpoint_interval: None,
        ..Options::default()
    };
    let s = Store::open(&dir, o).unwrap();
    for i in 0..3000u32 {
        s.put(format!("key-{i:05}").as_bytes(), &[i as u8; 120])
            .unwrap();
    }
    s.checkpoint().unwrap();
    // Changes in the log only: a checkpoint would write them home.
    for i in 0..300u32 {
        s.put(format!("key-{i:05}").as_bytes(), b"changed").unwrap();
    }
    drop(s);
    let data = dir.join("data.kv");
    let before = file_bytes(&data);
    let out = Command::new(env!("CARGO_BIN_EXE_kvstore"))
        .arg("check")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        file_bytes(&data) == before,
        "check wrote the data file (a checkpoint ran)"
    );
    // Read-only through the API too: writes refused, reads served, and
    // nothing written home at close.
    let ro = Options {
        read_only: true,
        ..Options::default()
    };
    let s = Store::open(&dir, ro).unwrap();
    assert!(matches!(s.put(b"x", b"y"), Err(Error::ReadOnly)));
    assert!(matches!(s.checkpoint(), Err(Error::ReadOnly)));
    assert!(matches!(s.sync(), Err(Error::ReadOnly)));
    assert_eq!(s.get(b"key-00007").unwrap(), Some(b"changed".to_vec()));
    assert_eq!(s.scan(..).unwrap().len(), 3000);
    s.close().unwrap();
    drop(s);
    assert!(file_bytes(&data) == before, "a read-only close wrote");
    // The store is as it was: the changes still come back from the log.
    let s = Store::open(&dir, Options::default()).unwrap();
    assert_eq!(s.get(b"key-00007").unwrap(), Some(b"changed".to_vec()));
    assert_eq!(s.get(b"key-02999").unwrap(), Some(vec![2999u32 as u8; 120]));
    s.close().unwrap();
}
