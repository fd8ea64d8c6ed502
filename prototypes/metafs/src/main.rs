//! `metafs`: make, check, mount and benchmark a metafs image.
//!
//! ```text
//! metafs mkfs IMAGE [--size 256M]      a new image, its journal in IMAGE.journal
//! metafs fsck IMAGE                    exit 0 clean, 1 with one line per problem
//! metafs mount IMAGE DIR [-o OPTS]    serve it through FUSE until unmounted
//! metafs bench [--scenario xfs]        fs_mark-like creates/s
//! ```
//!
//! Linked as `/sbin/mount.fuse.metafs` and `/sbin/umount.fuse.metafs`, it
//! is the helper `mount -t fuse.metafs IMAGE DIR` and `umount DIR` run
//! (`helper.rs`).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod bench;
mod fsmark;
mod helper;
mod serve;

use clap::{Parser, Subcommand};
use metafs::{fsck, Fs, MkfsOptions, MountOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "metafs",
    version,
    about = "A filesystem prototype on the journal"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make a new filesystem image (and its journal, IMAGE.journal).
    Mkfs {
        /// The image file to create (must not exist).
        image: PathBuf,
        /// Image size: bytes, or with a K, M or G suffix.
        #[arg(long, default_value = "256M", value_parser = bench::parse_size)]
        size: u64,
        /// Inodes [default: one per two blocks].
        #[arg(long)]
        inodes: Option<u32>,
    },
    /// Check an image (replaying its journal first): exit 0 when clean, 1
    /// with one line per problem.
    Fsck {
        /// The image file.
        image: PathBuf,
    },
    /// Mount an image on a directory through FUSE; runs until unmounted
    /// (`umount DIR` or `fusermount3 -u DIR`), then checkpoints.
    Mount(serve::MountArgs),
    /// fs_mark-like creates/s: threads creating 0-4 KiB files in their own
    /// directories, with an fsync per file or one sync at the end.
    Bench(bench::BenchArgs),
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.command {
        Command::Mkfs {
            image,
            size,
            inodes,
        } => {
            Fs::mkfs(
                &image,
                MkfsOptions {
                    size,
                    inodes,
                    ..MkfsOptions::default()
                },
            )
            .map_err(|e| format!("{}: {e}", image.display()))?;
            let fs = Fs::mount(&image, MountOptions::default()).map_err(|e| e.to_string())?;
            let sb = fs.superblock();
            println!(
                "{}: {} blocks of 4 KiB, {} inodes, journal in {}",
                image.display(),
                sb.blocks,
                sb.inodes,
                metafs::journal_dir(&image).display()
            );
            fs.unmount().map_err(|e| e.to_string())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Fsck { image } => {
            let fs = Fs::mount(&image, MountOptions::default())
                .map_err(|e| format!("{}: {e}", image.display()))?;
            let r = fs.mount_report().clone();
            let problems = fsck(&fs).map_err(|e| e.to_string())?;
            fs.unmount().map_err(|e| e.to_string())?;
            if r.transactions > 0 {
                eprintln!(
                    "metafs fsck: replayed {} transactions ({} blocks) from the journal",
                    r.transactions, r.blocks_replayed
                );
            }
            for p in &problems {
                println!("{p}");
            }
            if problems.is_empty() {
                println!("{}: clean", image.display());
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::from(1))
            }
        }
        Command::Mount(args) => serve::mount(&args),
        Command::Bench(args) => bench::run(&args).map(|()| ExitCode::SUCCESS),
    }
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let r = match argv.first().and_then(helper::by_name) {
        Some(helper) => helper(&argv[1..]),
        None => run(Cli::parse()),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("metafs: {e}");
            ExitCode::from(2)
        }
    }
}
