//! The engines `kvstore compare` runs, behind one trait: kvstore as a user
//! gets it (loaded by transactions, or by `Store::bulk_load` as
//! `kvstore-bulk`; with either torn-page defence named, as
//! `kvstore-images` and `kvstore-dw`), and with
//! the `peers` feature fjall and redb, each with its durability stated in
//! `compare.rs`.

use super::{key, value};
use kvstore::{Options, Store, TornPages};
use std::path::Path;
use std::sync::Arc;

/// One engine, as the phases use it.
pub(super) trait Engine: Send + Sync {
    /// One key in its own durable transaction.
    fn put(&self, k: &[u8], v: &[u8]) -> Result<(), String>;
    /// Many keys in one durable transaction.
    fn put_batch(&self, kvs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String>;
    /// Deletes many keys in one durable transaction.
    fn delete_batch(&self, keys: &[Vec<u8>]) -> Result<(), String>;
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, String>;
    /// Reads up to `n` entries from `from` on; returns how many.
    fn scan(&self, from: &[u8], n: usize) -> Result<usize, String>;
    /// Closes cleanly (what a user does before a restart).
    fn close(&self) -> Result<(), String>;
    /// Loads keys `0..n` into the empty store, in key order: by default
    /// 1,000 per durable transaction.
    fn load(&self, n: u64, size: usize) -> Result<(), String> {
        load_in_batches(n, size, |b| self.put_batch(b))
    }
}

/// Puts keys `0..n`, [`super::batch_keys`] per `put_batch`.
fn load_in_batches(
    n: u64,
    size: usize,
    put_batch: impl Fn(&[(Vec<u8>, Vec<u8>)]) -> Result<(), String>,
) -> Result<(), String> {
    let mut i = 0;
    while i < n {
        let step = super::batch_keys(size);
        let batch: Vec<_> = (i..(i + step).min(n))
            .map(|j| (key(j), value(j, 0, size)))
            .collect();
        put_batch(&batch)?;
        i += step;
    }
    Ok(())
}

/// kvstore; `bulk`: loaded by [`Store::bulk_load`] (`kvstore-bulk`).
struct Kv(Store, bool);

impl Engine for Kv {
    fn close(&self) -> Result<(), String> {
        self.0.close().map_err(|e| e.to_string())
    }
    fn load(&self, n: u64, size: usize) -> Result<(), String> {
        if !self.1 {
            return load_in_batches(n, size, |b| self.put_batch(b));
        }
        let mut l = self.0.bulk_load().map_err(|e| e.to_string())?;
        for j in 0..n {
            l.push(&key(j), &value(j, 0, size))
                .map_err(|e| e.to_string())?;
        }
        l.finish().map(|_| ()).map_err(|e| e.to_string())
    }
    fn put(&self, k: &[u8], v: &[u8]) -> Result<(), String> {
        self.0.put(k, v).map(|_| ()).map_err(|e| e.to_string())
    }
    fn put_batch(&self, kvs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
        let mut t = self.0.transaction();
        for (k, v) in kvs {
            t.put(k, v);
        }
        t.commit().map(|_| ()).map_err(|e| e.to_string())
    }
    fn delete_batch(&self, keys: &[Vec<u8>]) -> Result<(), String> {
        let mut t = self.0.transaction();
        for k in keys {
            t.delete(k);
        }
        t.commit().map(|_| ()).map_err(|e| e.to_string())
    }
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, String> {
        self.0.get(k).map_err(|e| e.to_string())
    }
    fn scan(&self, from: &[u8], n: usize) -> Result<usize, String> {
        let mut c = 0;
        for r in self
            .0
            .range(from.to_vec()..)
            .map_err(|e| e.to_string())?
            .take(n)
        {
            r.map_err(|e| e.to_string())?;
            c += 1;
        }
        Ok(c)
    }
}

#[cfg(feature = "peers")]
mod peers {
    use super::Engine;
    use redb::ReadableDatabase;
    use std::path::Path;

    pub struct Fjall {
        db: fjall::Database,
        ks: fjall::Keyspace,
    }

    fn e(e: impl std::fmt::Display) -> String {
        e.to_string()
    }

    impl Fjall {
        pub fn open(dir: &Path, cache: usize) -> Result<Self, String> {
            let db = fjall::Database::builder(dir)
                .cache_size(cache as u64)
                .open()
                .map_err(e)?;
            let ks = db
                .keyspace("kv", fjall::KeyspaceCreateOptions::default)
                .map_err(e)?;
            Ok(Fjall { db, ks })
        }
    }

    impl Engine for Fjall {
        fn close(&self) -> Result<(), String> {
            self.db.persist(fjall::PersistMode::SyncAll).map_err(e)
        }
        fn put(&self, k: &[u8], v: &[u8]) -> Result<(), String> {
            self.ks.insert(k, v).map_err(e)?;
            self.db.persist(fjall::PersistMode::SyncData).map_err(e)
        }
        fn put_batch(&self, kvs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
            let mut b = self.db.batch();
            for (k, v) in kvs {
                b.insert(&self.ks, k.as_slice(), v.as_slice());
            }
            b.commit().map_err(e)?;
            self.db.persist(fjall::PersistMode::SyncData).map_err(e)
        }
        fn delete_batch(&self, keys: &[Vec<u8>]) -> Result<(), String> {
            let mut b = self.db.batch();
            for k in keys {
                b.remove(&self.ks, k.as_slice());
            }
            b.commit().map_err(e)?;
            self.db.persist(fjall::PersistMode::SyncData).map_err(e)
        }
        fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, String> {
            Ok(self.ks.get(k).map_err(e)?.map(|v| v.to_vec()))
        }
        fn scan(&self, from: &[u8], n: usize) -> Result<usize, String> {
            let mut c = 0;
            for g in self.ks.range(from..).take(n) {
                g.into_inner().map_err(e)?;
                c += 1;
            }
            Ok(c)
        }
    }

    const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("kv");

    pub struct Redb(redb::Database);

    impl Redb {
        pub fn open(dir: &Path, cache: usize) -> Result<Self, String> {
            use journal_core::vfs::{OsVfs, Vfs};
            OsVfs::new().create_dir_all(dir).map_err(e)?;
            let db = redb::Database::builder()
                .set_cache_size(cache)
                .create(dir.join("redb"))
                .map_err(e)?;
            Ok(Redb(db))
        }
    }

    impl Engine for Redb {
        fn close(&self) -> Result<(), String> {
            Ok(())
        }
        fn put(&self, k: &[u8], v: &[u8]) -> Result<(), String> {
            self.put_batch(&[(k.to_vec(), v.to_vec())])
        }
        fn put_batch(&self, kvs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
            let mut tx = self.0.begin_write().map_err(e)?;
            tx.set_durability(redb::Durability::Immediate).map_err(e)?;
            {
                let mut t = tx.open_table(TABLE).map_err(e)?;
                for (k, v) in kvs {
                    t.insert(k.as_slice(), v.as_slice()).map_err(e)?;
                }
            }
            tx.commit().map_err(e)
        }
        fn delete_batch(&self, keys: &[Vec<u8>]) -> Result<(), String> {
            let mut tx = self.0.begin_write().map_err(e)?;
            tx.set_durability(redb::Durability::Immediate).map_err(e)?;
            {
                let mut t = tx.open_table(TABLE).map_err(e)?;
                for k in keys {
                    t.remove(k.as_slice()).map_err(e)?;
                }
            }
            tx.commit().map_err(e)
        }
        fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, String> {
            let tx = self.0.begin_read().map_err(e)?;
            let t = match tx.open_table(TABLE) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(x) => return Err(e(x)),
            };
            Ok(t.get(k).map_err(e)?.map(|g| g.value().to_vec()))
        }
        fn scan(&self, from: &[u8], n: usize) -> Result<usize, String> {
            let tx = self.0.begin_read().map_err(e)?;
            let t = tx.open_table(TABLE).map_err(e)?;
            let mut c = 0;
            for r in t.range(from..).map_err(e)?.take(n) {
                r.map_err(e)?;
                c += 1;
            }
            Ok(c)
        }
    }
}

pub(super) fn open_engine(name: &str, dir: &Path, cache: usize) -> Result<Arc<dyn Engine>, String> {
    match name {
        "kvstore" | "kvstore-bulk" | "kvstore-images" | "kvstore-dw" => Ok(Arc::new(Kv(
            Store::open(
                dir,
                Options {
                    cache_bytes: cache,
                    torn_pages: match name {
                        "kvstore-images" => TornPages::FullPageImages,
                        "kvstore-dw" => TornPages::DoubleWrite,
                        _ => TornPages::default(),
                    },
                    ..Options::default()
                },
            )
            .map_err(|e| e.to_string())?,
            name == "kvstore-bulk",
        ))),
        #[cfg(feature = "peers")]
        "fjall" => Ok(Arc::new(peers::Fjall::open(dir, cache)?)),
        #[cfg(feature = "peers")]
        "redb" => Ok(Arc::new(peers::Redb::open(dir, cache)?)),
        other => Err(format!(
            "unknown engine {other} (fjall and redb need the `peers` feature)"
        )),
    }
}
