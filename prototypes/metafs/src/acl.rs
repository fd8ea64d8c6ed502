//! POSIX access control lists, as Linux passes them in the
//! `system.posix_acl_access` and `system.posix_acl_default` extended
//! attributes, and the rules a filesystem keeps for them (the kernel's
//! `fs/posix_acl.c`): which lists are valid, how an access list and the
//! mode's permission bits stay one (`chmod` rewrites the list; setting the
//! list rewrites the mode; a list the mode says whole is not stored), and
//! what a new inode inherits from its directory's default list.
//!
//! The kernel checks permissions against the lists itself (the mount has
//! `default_permissions` and FUSE's `POSIX_ACL`); metafs keeps them.
//!
//! The attribute's bytes: a 4-byte version (2), then 8-byte entries — tag
//! (u16), permissions (u16, `rwx` in the low three bits), id (u32: a uid
//! for a named user, a gid for a named group, unused otherwise) — in tag
//! order, named users and groups by id.

use crate::{Error, Result};

/// The attribute holding a file's access list.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The attribute holding a directory's default list.
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
/// `ACL_USER_OBJ`: the owner.
pub const USER_OBJ: u16 = 0x01;
/// `ACL_USER`: a named user.
pub const USER: u16 = 0x02;
/// `ACL_GROUP_OBJ`: the owning group.
pub const GROUP_OBJ: u16 = 0x04;
/// `ACL_GROUP`: a named group.
pub const GROUP: u16 = 0x08;
/// `ACL_MASK`: the most any group-class entry grants.
pub const MASK: u16 = 0x10;
/// `ACL_OTHER`: everyone else.
pub const OTHER: u16 = 0x20;
/// Entries one list may have (ext4's limit with 4 KiB blocks is about
/// this; Linux's ACL code allows 32,767).
pub const MAX_ENTRIES: usize = 1024;

/// One entry: (tag, permissions, id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// One of the tags above.
    pub tag: u16,
    /// `rwx` as 4, 2, 1.
    pub perm: u16,
    /// The uid or gid of a named entry.
    pub id: u32,
}

/// A valid list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl(pub Vec<Entry>);

impl Acl {
    /// The list in an attribute's bytes, checked as the kernel's
    /// `posix_acl_valid` does: a known version, whole entries, tags known
    /// and in order, one owner, owning-group and other entry, named ones
    /// by increasing id, a mask when there is any named one, permissions
    /// within `rwx`. Anything else is `EINVAL`.
    pub fn decode(b: &[u8]) -> Result<Acl> {
        let bad = Error::InvalidArgument("not a valid POSIX ACL");
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(8) || (b.len() - 4) / 8 > MAX_ENTRIES {
            return Err(bad);
        }
        if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != VERSION {
            return Err(bad);
        }
        let entries: Vec<Entry> = b[4..]
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        let acl = Acl(entries);
        acl.valid().then_some(acl).ok_or(bad)
    }

    fn valid(&self) -> bool {
        let mut last: Option<(u16, u32)> = None;
        let (mut named, mut has) = (false, [false; 4]);
        for e in &self.0 {
            if e.perm & !7 != 0 {
                return false;
            }
            let key = match e.tag {
                USER | GROUP => (e.tag, e.id),
                USER_OBJ | GROUP_OBJ | MASK | OTHER => (e.tag, 0),
                _ => return false,
            };
            if last.is_some_and(|l| l >= key) {
                return false; // out of order, or twice
            }
            last = Some(key);
            named |= matches!(e.tag, USER | GROUP);
            for (k, t) in [USER_OBJ, GROUP_OBJ, MASK, OTHER].iter().enumerate() {
                has[k] |= e.tag == *t;
            }
        }
        has[0] && has[1] && has[3] && (has[2] || !named)
    }

    /// The attribute's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// The list a mode's permission bits make (three entries).
    pub fn from_mode(mode: u16) -> Acl {
        let e = |tag, shift: u16| Entry {
            tag,
            perm: (mode >> shift) & 7,
            id: 0,
        };
        Acl(vec![e(USER_OBJ, 6), e(GROUP_OBJ, 3), e(OTHER, 0)])
    }

    /// The mode's permission bits this list sets (the group's from the
    /// mask when there is one), and whether the mode says the whole list
    /// (`posix_acl_equiv_mode`): no named entries and no mask.
    pub fn mode(&self, mode: u16) -> (u16, bool) {
        let mut bits = 0u16;
        let mut whole = true;
        for e in &self.0 {
            match e.tag {
                USER_OBJ => bits |= e.perm << 6,
                GROUP_OBJ => bits |= e.perm << 3,
                OTHER => bits |= e.perm,
                MASK => {
                    bits = (bits & !0o070) | (e.perm << 3);
                    whole = false;
                }
                _ => whole = false,
            }
        }
        ((mode & !0o777) | bits, whole)
    }

    /// `chmod` to `mode`: the owner, other, and mask (or owning-group)
    /// entries take the mode's bits (`posix_acl_chmod`).
    pub fn chmod(&mut self, mode: u16) {
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => e.perm = (mode >> 6) & 7,
                MASK => e.perm = (mode >> 3) & 7,
                GROUP_OBJ if !has_mask => e.perm = (mode >> 3) & 7,
                OTHER => e.perm = mode & 7,
                _ => {}
            }
        }
    }

    /// A new inode made with `mode` under a directory whose default list
    /// is `self` (`posix_acl_create_masq`): its access list, the default
    /// masked by the mode, and its mode, masked by the list. The list is
    /// `None` when the mode says it whole.
    pub fn create(&self, mode: u16) -> (Option<Acl>, u16) {
        let mut acl = self.clone();
        let has_mask = acl.0.iter().any(|e| e.tag == MASK);
        let mut bits = mode & 0o777;
        for e in &mut acl.0 {
            let shift = match e.tag {
                USER_OBJ => 6,
                MASK => 3,
                GROUP_OBJ if !has_mask => 3,
                OTHER => 0,
                _ => continue,
            };
            e.perm &= (bits >> shift) & 7;
            bits = (bits & !(7 << shift)) | (e.perm << shift);
        }
        let (_, whole) = acl.mode(bits);
        let mode = (mode & !0o777) | bits;
        ((!whole).then_some(acl), mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: u16, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    #[test]
    fn lists_round_trip_and_invalid_ones_are_einval() {
        let a = Acl(vec![
            e(USER_OBJ, 7, 0),
            e(USER, 5, 1000),
            e(USER, 4, 1001),
            e(GROUP_OBJ, 5, 0),
            e(GROUP, 1, 50),
            e(MASK, 7, 0),
            e(OTHER, 0, 0),
        ]);
        assert_eq!(Acl::decode(&a.encode()).unwrap(), a);
        let bad = |entries: Vec<Entry>| {
            let b = Acl(entries).encode();
            assert!(matches!(Acl::decode(&b), Err(Error::InvalidArgument(_))));
        };
        // No mask beside a named entry; out of order; twice; no owner;
        // permissions past rwx; an unknown tag.
        bad(vec![
            e(USER_OBJ, 7, 0),
            e(USER, 5, 9),
            e(GROUP_OBJ, 5, 0),
            e(OTHER, 0, 0),
        ]);
        bad(vec![e(GROUP_OBJ, 5, 0), e(USER_OBJ, 7, 0), e(OTHER, 0, 0)]);
        bad(vec![
            e(USER_OBJ, 7, 0),
            e(USER, 1, 9),
            e(USER, 1, 9),
            e(GROUP_OBJ, 1, 0),
            e(MASK, 1, 0),
            e(OTHER, 0, 0),
        ]);
        bad(vec![e(GROUP_OBJ, 5, 0), e(OTHER, 0, 0)]);
        bad(vec![e(USER_OBJ, 8, 0), e(GROUP_OBJ, 5, 0), e(OTHER, 0, 0)]);
        bad(vec![
            e(USER_OBJ, 7, 0),
            e(0x40, 1, 0),
            e(GROUP_OBJ, 5, 0),
            e(OTHER, 0, 0),
        ]);
        for b in [&[][..], &[2, 0, 0, 0, 1][..], &[1, 0, 0, 0][..]] {
            assert!(Acl::decode(b).is_err());
        }
    }

    #[test]
    fn mode_chmod_and_create_keep_list_and_mode_one() {
        let plain = Acl::from_mode(0o640);
        assert_eq!(plain.mode(0o100000), (0o100640, true));
        let mut a = Acl(vec![
            e(USER_OBJ, 6, 0),
            e(USER, 7, 1000),
            e(GROUP_OBJ, 4, 0),
            e(MASK, 5, 0),
            e(OTHER, 4, 0),
        ]);
        // The mask is the mode's group bits.
        assert_eq!(a.mode(0o4000), (0o4654, false));
        a.chmod(0o710);
        assert_eq!(
            a.0.iter().map(|x| x.perm).collect::<Vec<_>>(),
            vec![7, 7, 4, 1, 0],
            "owner, named user kept, owning group kept, mask, other"
        );
        // Inherited: the default masked by the mode asked for.
        let default = Acl(vec![
            e(USER_OBJ, 7, 0),
            e(GROUP_OBJ, 7, 0),
            e(GROUP, 7, 50),
            e(MASK, 7, 0),
            e(OTHER, 5, 0),
        ]);
        assert!(Acl::decode(&default.encode()).is_ok());
        let (acl, mode) = default.create(0o666);
        assert_eq!(mode, 0o664);
        let acl = acl.unwrap();
        assert_eq!(acl.0[3], e(MASK, 6, 0));
        assert_eq!(acl.0[2], e(GROUP, 7, 50), "named entries keep theirs");
        assert_eq!(
            acl.0[1],
            e(GROUP_OBJ, 7, 0),
            "the mask stands for the group"
        );
        // A default the mode says whole leaves no access list.
        let (acl, mode) = Acl::from_mode(0o750).create(0o777);
        assert_eq!((acl, mode), (None, 0o750));
    }
}
