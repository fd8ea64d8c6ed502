//! The `journal` command.
//!
//! ```text
//! journal bench [--scenario NAME|all] [--seconds S] [--clients 1,4,16,64]
//!               [--record-size B] [--batch-policy P] [--dir DIR] [--json FILE]
//!               [--plot FILE.svg] [--smoke]
//! journal dump DIR [--from LSN] [--limit N] [--entries]
//! journal verify DIR
//! journal stat DIR
//! ```

mod args;
mod bench;
mod inspect;

use args::Args;
use std::process::ExitCode;

const USAGE: &str = "\
usage:
  journal bench [--scenario NAME|all] [--seconds S] [--clients 1,4,16,64]
                [--record-size BYTES] [--batch-policy adaptive|last-sync-writer|fixed-sleep-1ms|none]
                [--dir DIR] [--json FILE] [--plot FILE.svg] [--smoke]
      scenarios: group-commit (default), wt-flush-wait, jbd-lone-writer,
                 pg-recycle, xfs-flush-flags, alignment, all
  journal dump DIR [--from LSN] [--limit N] [--entries]
  journal verify DIR     exit 0: clean or torn tail (warned); 1: corruption
  journal stat DIR
";

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("journal: {e}");
            return ExitCode::from(2);
        }
    };
    let cmd = args.positional.first().map(String::as_str);
    let code = match cmd {
        Some("bench") => match bench::run(&args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("journal bench: {e}");
                1
            }
        },
        Some(c @ ("dump" | "verify" | "stat")) => {
            let r = match c {
                "dump" => inspect::dump(&args),
                "verify" => inspect::verify(&args),
                _ => inspect::stat(&args),
            };
            match r {
                Ok(code) => code,
                Err(f) => {
                    eprintln!("journal {c}: {}", f.message);
                    f.code
                }
            }
        }
        Some("help") | None if args.flag("help") || cmd == Some("help") => {
            print!("{USAGE}");
            0
        }
        _ => {
            eprint!("{USAGE}");
            2
        }
    };
    ExitCode::from(code as u8)
}
