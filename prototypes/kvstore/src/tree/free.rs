//! The free list: a chain of trunk pages from the meta page's
//! `free_head`, each free itself and listing up to [`FREE_PER_TRUNK`]
//! more free pages (SQLite's shape). A listed page is neither read nor
//! written while free — freeing a long value's 257-page chain changes one
//! trunk, two if it fills one — so the only care it needs is for open snapshots, which may
//! still read what a freed page held when it is written again.

use super::{corrupt, Txn};
use crate::page::{Kind, PageNo, FIRST_PAGE, FREE_PER_TRUNK};
use crate::Result;

impl Txn<'_> {
    /// A page for new contents: the last one the first free-list trunk
    /// lists, or the trunk itself once it lists none, or a page past the
    /// end. A listed page is not read (its contents mean nothing), except
    /// to keep it for an open snapshot that may still read it.
    pub(super) fn alloc(&mut self) -> Result<PageNo> {
        let head = self.meta.free_head;
        if head != 0 {
            let trunk = self.read(head)?;
            if trunk.kind() != Some(Kind::Free) {
                return Err(corrupt(head, "the free list reaches a page in use"));
            }
            if trunk.count() == 0 {
                self.meta.free_head = trunk.link();
                return Ok(head);
            }
            let mut t = self.pool.copy(&trunk);
            let no = t.pop_free().unwrap_or(0);
            if !(FIRST_PAGE..self.meta.end).contains(&no) || no == head {
                return Err(corrupt(head, "a free page outside the file"));
            }
            if !self.touched.contains_key(&no) {
                self.pool.keep_for_snapshots(no);
            }
            self.write(head, t, None);
            return Ok(no);
        }
        let no = self.meta.end;
        self.meta.end = no
            .checked_add(1)
            .ok_or(corrupt(no, "the data file is full (2^32 pages)"))?;
        Ok(no)
    }

    /// Puts page `no` on the free list: listed in the first trunk, or, if
    /// that is full (or there is none), made the new first trunk. Freeing
    /// a page neither reads nor writes it (SQLite's free-list leaves), so
    /// freeing a long value's chain changes a trunk page (two if it fills
    /// one), not every page of the chain.
    pub(super) fn free(&mut self, no: PageNo) -> Result<()> {
        let head = self.meta.free_head;
        if head != 0 {
            let trunk = self.read(head)?;
            if trunk.kind() != Some(Kind::Free) {
                return Err(corrupt(head, "the free list reaches a page in use"));
            }
            if trunk.count() < FREE_PER_TRUNK {
                let mut t = self.pool.copy(&trunk);
                t.push_free(no);
                self.write(head, t, None);
                return Ok(());
            }
        }
        // The page becomes a trunk without having been read: an open
        // snapshot may still read what it held.
        if !self.touched.contains_key(&no) {
            self.pool.keep_for_snapshots(no);
        }
        let trunk = self.pool.new_page::<&[u8]>(no, Kind::Free, head, &[]);
        self.write(no, trunk, None);
        self.meta.free_head = no;
        Ok(())
    }
}
