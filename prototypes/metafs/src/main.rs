//! `metafs`: make, check, mount and benchmark a metafs image.
//!
//! ```text
//! metafs mkfs IMAGE [--size 256M]      a new image, its journal in IMAGE.journal
//! metafs fsck IMAGE                    exit 0 clean, 1 with one line per problem
//! metafs mount IMAGE DIR               serve it through FUSE until unmounted
//! metafs bench [--scenario xfs]        fs_mark-like creates/s
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod bench;
mod fsmark;

use clap::{Parser, Subcommand};
use metafs::{fsck, Fs, MkfsOptions, MountOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

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
    Mount {
        /// The image file.
        image: PathBuf,
        /// The mount point (an existing directory).
        dir: PathBuf,
        /// Commit the running transaction this often, milliseconds (the
        /// kernel does not forward sync(2) to FUSE).
        #[arg(long, default_value_t = 1000)]
        commit_ms: u64,
        /// Let every user reach the mount, not only its owner (FUSE's
        /// `allow_other`; non-root mounters need `user_allow_other` in
        /// /etc/fuse.conf). Access is still checked against each file's
        /// mode and owner.
        #[arg(long)]
        allow_other: bool,
        /// Memory for metadata blocks, MiB (the directory indexes may
        /// hold a name per 64 bytes of it besides; see
        /// `MountOptions::cache_bytes`).
        #[arg(long, default_value_t = 64)]
        cache_mib: usize,
    },
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
        Command::Mount {
            image,
            dir,
            commit_ms,
            allow_other,
            cache_mib,
        } => {
            let options = MountOptions {
                cache_bytes: cache_mib.saturating_mul(1 << 20),
                ..MountOptions::default()
            };
            let fs = Arc::new(
                Fs::mount(&image, options).map_err(|e| format!("{}: {e}", image.display()))?,
            );
            let opts = metafs::fuse::MountConfig {
                commit_every: Duration::from_millis(commit_ms.max(1)),
                allow_other,
            };
            let fs = metafs::fuse::mount(fs, &dir, opts, || {
                // Scripts and tests wait for this line.
                println!("mounted {} on {}", image.display(), dir.display());
            })
            .map_err(|e| format!("mount {}: {e}", dir.display()))?;
            fs.close().map_err(|e| e.to_string())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => bench::run(&args).map(|()| ExitCode::SUCCESS),
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("metafs: {e}");
            ExitCode::from(2)
        }
    }
}
