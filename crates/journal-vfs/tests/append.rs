//! `OpenOptions::append`: two handles on one file, as two processes
//! sharing a log, each add whole writes at the end — none writes over the
//! other's — on the OS and on the simulator alike.
#![cfg(not(loom))]

use journal_vfs::{OpenOptions, OsVfs, SimVfs, Vfs};
use std::path::Path;

fn two_writers_append(vfs: &dyn Vfs, path: &Path) {
    let a = vfs.open(path, OpenOptions::append()).unwrap();
    let b = vfs.open(path, OpenOptions::append()).unwrap();
    // The offsets are ignored: each write lands at the end.
    a.write_at(b"first a\n", 0).unwrap();
    b.write_at(b"first b\n", 0).unwrap();
    a.write_at(b"second a\n", 3).unwrap();
    let mut got = vec![0; a.len().unwrap() as usize];
    a.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, b"first a\nfirst b\nsecond a\n");
    // Without append, a write goes where it is told.
    let c = vfs.open(path, OpenOptions::write()).unwrap();
    c.write_at(b"F", 0).unwrap();
    c.read_exact_at(&mut got[..1], 0).unwrap();
    assert_eq!(&got[..1], b"F");
}

#[test]
fn appends_from_two_handles_keep_both_on_the_os() {
    let dir = tempfile::tempdir().unwrap();
    two_writers_append(&OsVfs::new(), &dir.path().join("log"));
}

#[test]
fn appends_from_two_handles_keep_both_on_the_simulator() {
    let vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/d")).unwrap();
    two_writers_append(&vfs, Path::new("/d/log"));
}
