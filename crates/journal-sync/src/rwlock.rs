//! A poison-free reader-writer lock.

use std::ops::{Deref, DerefMut};

#[cfg(loom)]
use loom::sync as imp;
#[cfg(shuttle)]
use shuttle::sync as imp;
#[cfg(not(any(loom, shuttle)))]
use std::sync as imp;

/// A reader-writer lock that does not poison (see the crate docs for why):
/// many readers at once, or one writer.
#[derive(Debug, Default)]
pub struct RwLock<T>(imp::RwLock<T>);

/// A shared hold of a [`RwLock`]; released when dropped.
#[derive(Debug)]
pub struct RwLockReadGuard<'a, T>(imp::RwLockReadGuard<'a, T>);

/// The exclusive hold of a [`RwLock`]; released when dropped.
#[derive(Debug)]
pub struct RwLockWriteGuard<'a, T>(imp::RwLockWriteGuard<'a, T>);

impl<T> RwLock<T> {
    /// Creates an unlocked lock holding `value`.
    pub fn new(value: T) -> Self {
        Self(imp::RwLock::new(value))
    }

    /// Acquires the lock shared, blocking while a writer holds it.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        RwLockReadGuard(self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Acquires the lock exclusively, blocking while anyone holds it.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        RwLockWriteGuard(self.0.write().unwrap_or_else(|e| e.into_inner()))
    }
}

impl<T> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(all(test, not(any(loom, shuttle))))]
mod tests {
    use super::*;

    #[test]
    fn a_writer_panicking_does_not_poison_the_lock() {
        let lock = std::sync::Arc::new(RwLock::new(1));
        let l = lock.clone();
        let r = std::thread::spawn(move || {
            let mut g = l.write();
            *g = 2;
            panic!("a writer dies holding the lock");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.read(), 2);
        *lock.write() = 3;
        assert_eq!(*lock.read(), 3);
    }
}
