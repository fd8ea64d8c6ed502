//! The `journal` command. Placeholder until issue 7 (bench, dump, verify, stat).

fn main() {
    eprintln!("journal: no subcommands yet (see issue 7)");
    std::process::exit(2);
}
