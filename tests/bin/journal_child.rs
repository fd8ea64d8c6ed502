//! The child of the kill -9 scenario: commits records in a loop on the
//! journal in `argv[1]`, printing `lsn writer seq len` for each one after
//! it is acknowledged, until it is killed. Checkpoints now and then so the
//! parent's crashes land during recycling too.

use journal_core::{Journal, Lsn};
use journal_tests::{payload, small_options};
use std::io::Write;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("journal directory");
    let writer: u8 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let journal = Journal::open(&dir, small_options()).expect("open");
    let out = std::io::stdout();
    let mut acked: Vec<Lsn> = Vec::new();
    for seq in 0u32.. {
        let len = 20 + (seq as usize * 97) % 1500;
        let lsn = journal
            .append_durable(&payload(writer, seq, len))
            .expect("commit");
        acked.push(lsn);
        let mut o = out.lock();
        writeln!(o, "{} {writer} {seq} {len}", lsn.0).expect("stdout");
        o.flush().expect("stdout");
        if seq % 64 == 63 && acked.len() > 32 {
            journal
                .checkpoint(acked[acked.len() - 32])
                .expect("checkpoint");
        }
    }
}
