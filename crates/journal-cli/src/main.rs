//! The `journal` command: `bench`, `dump`, `verify`, `stat`.
//!
//! `journal --help` and `journal <command> --help` describe every option.
//! Exit codes: 0 success; 1 a failed benchmark, or corruption found by
//! `verify`; 2 a usage error or a journal that cannot be read.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod bench;
mod inspect;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Filesystem-grade write-ahead journals: benchmark one on the local disk,
/// or inspect one read-only.
#[derive(Debug, Parser)]
#[command(name = "journal", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the group-commit benchmark (default) or one A/B scenario per
    /// seed, on a temporary directory of the local disk.
    Bench(bench::BenchArgs),
    /// Print the records of a journal from its checkpoint on (read-only,
    /// never takes the lock).
    Dump(inspect::DumpArgs),
    /// Check a journal as recovery would. Exit 0: clean, or a torn tail
    /// (warned); 1: corruption or loss (the LSN named); 2: cannot tell.
    Verify(inspect::VerifyArgs),
    /// Summarise a journal: checkpoint, segments, frontier, log end.
    Stat(inspect::StatArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => match bench::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("journal bench: {e}");
                ExitCode::from(1)
            }
        },
        Command::Dump(args) => inspect::finish("dump", inspect::dump(&args)),
        Command::Verify(args) => inspect::finish("verify", inspect::verify(&args)),
        Command::Stat(args) => inspect::finish("stat", inspect::stat(&args)),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
