//! Writes a small journal: `cargo run --example quickstart -p journal-core -- DIR [N]`.
//!
//! Opens (or creates) the journal in DIR with 64 KiB segments, commits N
//! records (default 200), checkpoints half-way, closes, reopens and
//! replays. Handy for trying `journal dump`, `verify` and `stat`.

use journal_core::{Journal, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: quickstart DIR [N]")?;
    let n: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let options = Options {
        segment_size: 64 << 10,
        logbsize: 16 << 10,
        logbufs: 4,
        ..Options::default()
    };
    let journal = Journal::open(&dir, options)?;
    let mut half = None;
    for i in 0..n {
        let lsn =
            journal.append_durable(format!("record {i:05} {}", "x".repeat(600)).as_bytes())?;
        if i == n / 2 {
            half = Some(lsn);
        }
    }
    if let Some(lsn) = half {
        journal.checkpoint(lsn)?;
    }
    journal.close()?;
    drop(journal);
    let journal = Journal::open(&dir, options)?;
    let replayed = journal.read_from(journal.redo_lsn())?.count();
    println!(
        "{dir}: {n} records committed; {replayed} replayed from the checkpoint at {}",
        journal.redo_lsn()
    );
    Ok(())
}
