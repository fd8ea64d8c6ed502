//! Acknowledged means durable, whatever the operation: a delete that finds
//! nothing still waits for what it saw.

mod common;

use common::{options, sim_open};
use journal_core::vfs::{CrashPolicy, SimVfs};

#[test]
fn a_delete_that_finds_nothing_is_durable_with_the_delete_it_saw() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(64)).unwrap();
    s.put(b"k", b"v").unwrap();
    // Deleted without waiting: applied (the key is gone for readers), its
    // record not yet forced.
    let mut t = s.transaction();
    t.delete(b"k");
    t.commit_no_wait().unwrap();
    assert_eq!(s.get(b"k").unwrap(), None);
    // The second delete finds nothing to delete, and is acknowledged
    // durable: so the first one must be too, or after a crash the key is
    // back though a delete of it returned.
    s.delete(b"k").unwrap();
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    drop(s);
    let s = sim_open(&image, options(64)).unwrap();
    assert_eq!(
        s.get(b"k").unwrap(),
        None,
        "a delete was acknowledged and the key came back after a crash"
    );
}
