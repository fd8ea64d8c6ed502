//! Peer authentication: a secret the members of a cluster share, sent on
//! every Raft RPC (`Authorization: Bearer <hex>`) and checked by the
//! receiver before it reads or decodes the body, by a comparison whose
//! time does not depend on where the bytes differ.
//!
//! The cluster id alone is no credential: anyone can read it from
//! `GET /status`. A node started with a secret ([`PeerSecret`],
//! `raftkv serve --peer-secret-file`) answers a Raft RPC without the
//! header `401` and one with another secret `403`, and openraft never
//! sees either. `raftkv-tools cluster` and the fault matrix make one per
//! cluster ([`PeerSecret::generate`], kept as `peer-secret` beside the
//! node directories, mode 0600).
//!
//! The secret travels in the clear over plain HTTP: it keeps out whoever
//! can reach the port but not read the peers' traffic (for that, put the
//! peers on a private network, or behind a TLS proxy).

use journal_core::vfs::{OpenOptions, Vfs};
use std::path::Path;
use std::sync::Arc;

/// The header a Raft RPC carries its secret in.
pub const AUTH_HEADER: &str = "authorization";

/// The fewest bytes of a secret (a file holding fewer is refused).
pub const MIN_SECRET: usize = 16;

/// The most bytes of a secret file read.
const MAX_SECRET_FILE: u64 = 4096;

/// The secret a cluster's members share. Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerSecret(Arc<str>);

impl std::fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerSecret(..)")
    }
}

impl PeerSecret {
    /// A secret from text: its trimmed content, at least [`MIN_SECRET`]
    /// bytes of printable ASCII without spaces (what a header may carry).
    pub fn new(text: &str) -> Result<PeerSecret, String> {
        let s = text.trim();
        if s.len() < MIN_SECRET {
            return Err(format!(
                "a peer secret needs at least {MIN_SECRET} characters, not {}",
                s.len()
            ));
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a peer secret is printable ASCII without spaces".into());
        }
        Ok(PeerSecret(s.into()))
    }

    /// Reads a secret from the file at `path` (at most 4 KiB).
    pub fn from_file(vfs: &dyn Vfs, path: &Path) -> Result<PeerSecret, String> {
        let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        match crate::read_small_file(vfs, path, MAX_SECRET_FILE) {
            Ok(Some(Some(buf))) => {
                let text = std::str::from_utf8(&buf).map_err(|e| what(&e))?;
                PeerSecret::new(text).map_err(|e| what(&e))
            }
            Ok(Some(None)) => Err(what(&"longer than 4 KiB: not a peer secret")),
            Ok(None) => Err(what(&"no such file")),
            Err(e) => Err(what(&e)),
        }
    }

    /// A new random secret: 256 bits from the operating system's
    /// random source (`getrandom`), as 64 hex digits.
    pub fn generate() -> Result<PeerSecret, String> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).map_err(|e| format!("no randomness for a secret: {e}"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(PeerSecret(hex.into()))
    }

    /// Reads the secret at `path`, or, if there is no file there, makes
    /// one and writes it there durably (mode 0600): the secret of a local
    /// cluster, kept across its restarts.
    pub fn load_or_create(vfs: &dyn Vfs, path: &Path) -> Result<PeerSecret, String> {
        if vfs.exists(path).map_err(|e| e.to_string())? {
            return PeerSecret::from_file(vfs, path);
        }
        let secret = PeerSecret::generate()?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let write = || -> Result<(), journal_core::VfsError> {
            vfs.create_dir_all(dir)?;
            let f = vfs.open(path, OpenOptions::create_new().mode(0o600))?;
            f.write_at(format!("{}\n", secret.0).as_bytes(), 0)?;
            f.sync_all()?;
            vfs.sync_dir(dir)
        };
        write().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(secret)
    }

    /// The header value a Raft RPC carries.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether `value` (an `Authorization` header) carries this secret.
    /// The time taken depends on the lengths only, not on where the
    /// bytes differ.
    pub fn admits(&self, value: &[u8]) -> bool {
        let Some(given) = value.strip_prefix(b"Bearer ") else {
            return false;
        };
        constant_time_eq(given, self.0.as_bytes())
    }
}

/// Whether `a == b`, comparing every byte whatever the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_secret_is_admitted() {
        let s = PeerSecret::new("0123456789abcdef0123").unwrap();
        assert!(s.admits(s.header_value().as_bytes()));
        assert!(!s.admits(b"Bearer 0123456789abcdef0124"));
        assert!(!s.admits(b"Bearer 0123456789abcdef012"));
        assert!(!s.admits(b"Bearer 0123456789abcdef01234"));
        assert!(!s.admits(b"0123456789abcdef0123"));
        assert!(!s.admits(b""));
        assert!(PeerSecret::new("short").is_err());
        assert!(PeerSecret::new("has a space in it, long enough").is_err());
    }

    #[test]
    fn generated_secrets_differ_and_are_kept() {
        let (a, b) = (
            PeerSecret::generate().unwrap(),
            PeerSecret::generate().unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(a.0.len(), 64);
        let vfs = journal_core::vfs::SimVfs::new();
        let path = Path::new("/c/peer-secret");
        let made = PeerSecret::load_or_create(&vfs, path).unwrap();
        assert_eq!(PeerSecret::load_or_create(&vfs, path).unwrap(), made);
        assert_eq!(PeerSecret::from_file(&vfs, path).unwrap(), made);
    }
}
