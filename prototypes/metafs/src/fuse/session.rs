//! Mounting: the options `mount -o` gives (FUSE's and the kernel's), and
//! [`mount`], which serves a filesystem until it is unmounted.

use super::syncer::Syncer;
use super::{MetaFuse, DISPATCH_THREADS};
use crate::volume::{Atime, Fs, MountOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How [`mount`] serves a filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountConfig {
    /// Commit the running transaction this often (the kernel does not
    /// forward `sync(2)`); `-o commit=SECONDS`, as ext4's.
    pub commit_every: Duration,
    /// FUSE's `allow_other`: users other than the mounter reach the mount
    /// (access still checked against each file's mode and owner).
    pub allow_other: bool,
    /// The mount's source as the mount table shows it (FUSE's `fsname`;
    /// `-o fsname=NAME`), so tools that find a filesystem by its device —
    /// `findmnt`, `df`, xfstests — find this one by its image.
    pub fsname: String,
    /// `-o ro`: the kernel refuses every change, and reads move no access
    /// time.
    pub read_only: bool,
    /// `-o nosuid`, `-o nodev`, `-o noexec`: the kernel's mount flags.
    pub nosuid: bool,
    /// See [`MountConfig::nosuid`].
    pub nodev: bool,
    /// See [`MountConfig::nosuid`].
    pub noexec: bool,
}

impl Default for MountConfig {
    fn default() -> Self {
        Self {
            commit_every: Duration::from_secs(1),
            allow_other: false,
            fsname: "metafs".into(),
            read_only: false,
            nosuid: false,
            nodev: false,
            noexec: false,
        }
    }
}

/// Options that only `mount(8)` reads (fstab's), ignored here.
const USERSPACE_ONLY: &[&str] = &[
    "defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser", "owner",
];

impl MountConfig {
    /// Applies `mount -o` options (comma-separated; an empty one is
    /// skipped) to this configuration and to the filesystem's `fs`:
    ///
    /// - FUSE's: `fsname=NAME`, `subtype=metafs`, `allow_other`,
    ///   `default_permissions` (always on);
    /// - the kernel's: `ro`/`rw`, `[no]suid`, `[no]dev`, `[no]exec`,
    ///   `relatime` (the default), `strictatime`, `noatime`, `atime`,
    ///   `norelatime`, `nodiratime`/`diratime`, `[no]lazytime` (timestamps
    ///   are journaled with everything else, so lazy or not changes
    ///   nothing), `async`;
    /// - metafs's: `commit=SECONDS`, `cache=MIB`;
    /// - fstab's (`defaults`, `noauto`, `nofail`, `x-*`, …), ignored.
    ///
    /// Anything else is an error naming it, so an option is never silently
    /// dropped.
    pub fn apply_options(&mut self, opts: &str, fs: &mut MountOptions) -> Result<(), String> {
        for o in opts.split(',').filter(|o| !o.is_empty()) {
            let (key, value) = match o.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (o, None),
            };
            match (key, value) {
                ("fsname", Some(v)) if !v.is_empty() => self.fsname = v.to_owned(),
                ("subtype", Some("metafs")) => {}
                ("allow_other", None) => self.allow_other = true,
                ("default_permissions" | "async" | "lazytime" | "nolazytime", None) => {}
                ("ro", None) => self.read_only = true,
                ("rw", None) => self.read_only = false,
                ("suid" | "nosuid", None) => self.nosuid = key == "nosuid",
                ("dev" | "nodev", None) => self.nodev = key == "nodev",
                ("exec" | "noexec", None) => self.noexec = key == "noexec",
                ("relatime", None) => fs.atime = Atime::Relatime,
                ("strictatime" | "norelatime" | "atime", None) => fs.atime = Atime::Strict,
                ("noatime", None) => fs.atime = Atime::Never,
                ("nodiratime" | "diratime", None) => fs.diratime = key == "diratime",
                ("commit", Some(v)) => {
                    let s: u64 = v.parse().map_err(|_| format!("commit={v}: not seconds"))?;
                    self.commit_every = Duration::from_secs(s.max(1));
                }
                ("cache", Some(v)) => {
                    let mib: usize = v.parse().map_err(|_| format!("cache={v}: not MiB"))?;
                    fs.cache_bytes = mib.saturating_mul(1 << 20);
                }
                _ if USERSPACE_ONLY.contains(&o) || o.starts_with("x-") => {}
                _ => return Err(format!("unknown mount option {o:?}")),
            }
        }
        if self.read_only {
            // Nothing is written through a read-only mount, times included.
            fs.atime = Atime::Never;
        }
        Ok(())
    }

    /// The options fuser mounts with. No subtype: the mount's type is
    /// plain `fuse`, as xfstests's `FSTYP=fuse` expects to find it.
    fn fuser_options(&self) -> Vec<fuser::MountOption> {
        use fuser::MountOption as O;
        let mut o = vec![
            O::FSName(self.fsname.clone()),
            if self.read_only { O::RO } else { O::RW },
            O::DefaultPermissions,
            if self.nosuid { O::NoSuid } else { O::Suid },
            if self.nodev { O::NoDev } else { O::Dev },
            if self.noexec { O::NoExec } else { O::Exec },
        ];
        o.dedup();
        o
    }
}

/// Mounts `fs` on `dir` and serves it until the mount is unmounted
/// (`umount DIR` or `fusermount3 -u DIR`); commits every
/// `config.commit_every` meanwhile. `on_mounted` runs once the mount is
/// live. Returns the filesystem for its caller to unmount (checkpoint) it.
pub fn mount(
    fs: Arc<Fs>,
    dir: &Path,
    config: MountConfig,
    on_mounted: impl FnOnce(),
) -> std::io::Result<Arc<Fs>> {
    let mut fc = fuser::Config::default();
    fc.mount_options = config.fuser_options();
    if config.allow_other {
        fc.acl = fuser::SessionACL::All;
    }
    // Threads that take requests from the kernel. None waits for the
    // disk (fsyncs go to the syncer), so two keep both cores busy; 32, with
    // fsyncs answered on them, spent 40% of the server's time switching
    // threads (perf) for fewer files/s.
    fc.n_threads = Some(DISPATCH_THREADS);
    let syncer = Arc::new(Syncer::default());
    // The syncer: one that cannot be started fails the mount.
    let (fs2, s2) = (fs.clone(), syncer.clone());
    let every = config.commit_every;
    let thread = std::thread::Builder::new()
        .name("metafs-commit".into())
        .spawn(move || s2.run(&fs2, every))?;
    let served = MetaFuse {
        fs: fs.clone(),
        syncer: Some(syncer.clone()),
    };
    let r = fuser::spawn_mount(served, dir, &fc).map(|session| {
        on_mounted();
        session.join()
    });
    syncer.stop();
    let _ = thread.join();
    r?.map(|()| fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_are_applied_and_unknown_ones_refused() {
        let (mut c, mut fs) = (MountConfig::default(), MountOptions::default());
        assert_eq!(fs.atime, Atime::Relatime);
        c.apply_options(
            "rw,fsname=/img/test.img,allow_other,noatime,nodiratime,commit=5,nosuid,x-foo,defaults",
            &mut fs,
        )
        .unwrap();
        assert_eq!(c.fsname, "/img/test.img");
        assert!(c.allow_other && c.nosuid && !c.read_only && !c.nodev);
        assert_eq!((fs.atime, fs.diratime), (Atime::Never, false));
        assert_eq!(c.commit_every, Duration::from_secs(5));
        c.apply_options("strictatime,diratime,cache=8", &mut fs)
            .unwrap();
        assert_eq!((fs.atime, fs.diratime), (Atime::Strict, true));
        c.apply_options("ro,strictatime", &mut fs).unwrap();
        assert!(c.read_only);
        assert_eq!(fs.atime, Atime::Never, "a read-only mount moves no atime");
        assert_eq!(fs.cache_bytes, 8 << 20);
        for bad in [
            "sync",
            "data=journal",
            "commit=x",
            "fsname=",
            "subtype=ext4",
        ] {
            let e = c.apply_options(bad, &mut fs).unwrap_err();
            assert!(e.contains(bad.split('=').next().unwrap()), "{bad}: {e}");
        }
        let o = c.fuser_options();
        assert!(o.contains(&fuser::MountOption::FSName("/img/test.img".into())));
        assert!(o.contains(&fuser::MountOption::RO));
    }
}
