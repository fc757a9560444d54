//! The store's bounds: the reserve kept for kills on a full file system,
//! making room there, retention by age and the size bound (the tables each
//! one treats are in `tables`).

use std::path::PathBuf;

use rusqlite::OptionalExtension;

use super::{Store, StoreError, beside, has_room, sql, store_dir, tables, wal_len};
use crate::util::fsafe;

/// Bytes set aside beside the store (`STORE.reserve`) and given back when
/// its file system fills up, so the deletes that make room, and the kill
/// that needed it, can still be written.
pub const RESERVE_BYTES: u64 = 2 << 20;

/// The WAL is cut back to this size after a checkpoint.
pub const WAL_KEEP_BYTES: u64 = 4 << 20;

/// Tenths of `--max-store-size` past which the size is enforced at the
/// next tick rather than at the next minute.
pub const SIZE_CHECK_SHARE: u64 = 9;

/// The directory of the store.
impl Store {
    fn reserve_path(&self) -> PathBuf {
        beside(&self.path, ".reserve")
    }

    /// Sets [`RESERVE_BYTES`] aside (really allocated, not a sparse file),
    /// unless they already are or there is no room for them.
    pub fn ensure_reserve(&self) -> bool {
        use std::os::fd::AsRawFd as _;
        if self.spill {
            return true;
        }
        let path = self.reserve_path();
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.len() >= RESERVE_BYTES) {
            return true;
        }
        let Ok(f) = fsafe::open_private(&path) else {
            return false;
        };
        // SAFETY: fallocate on an fd this function owns.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, RESERVE_BYTES as libc::off_t) };
        if rc != 0 {
            drop(f);
            let _ = std::fs::remove_file(&path);
            return false;
        }
        true
    }

    /// Whether this is a spill store.
    pub fn is_spill(&self) -> bool {
        self.spill
    }

    /// Whether the store's file system has room for the reserve again (and
    /// as much besides).
    pub fn has_room(&self) -> bool {
        has_room(store_dir(&self.path))
    }

    /// Whether the reserve is set aside now.
    pub fn has_reserve(&self) -> bool {
        self.spill
            || std::fs::symlink_metadata(self.reserve_path())
                .is_ok_and(|m| m.len() >= RESERVE_BYTES)
    }

    /// The file system is full: gives the reserve back, sheds the oldest
    /// fifth of the raw events and GPU timelines (kills and GPU OOM records
    /// stay), and shrinks the file and the WAL. Best effort: each step that
    /// fails is skipped. Returns the rows deleted.
    pub fn make_room(&mut self) -> u64 {
        let _ = std::fs::remove_file(self.reserve_path());
        let mut deleted = 0u64;
        for t in tables::on_full_disk() {
            let (t, time) = (t.name, t.time);
            let q = format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} ORDER BY {time}
                 LIMIT max(1000, (SELECT count(*) FROM {t}) / 5))"
            );
            match self.conn.execute(&q, []) {
                Ok(n) => deleted += n as u64,
                Err(e) => tracing::debug!("making room in {t}: {e}"),
            }
        }
        for step in [
            "PRAGMA incremental_vacuum",
            "PRAGMA wal_checkpoint(TRUNCATE)",
        ] {
            if let Err(e) = self.conn.query_row(step, [], |_| Ok(())).optional() {
                tracing::debug!("making room ({step}): {e}");
            }
        }
        deleted
    }

    /// Bytes the database file uses.
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let pages: i64 = self
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(sql("size"))?;
        let size: i64 = self
            .conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(sql("size"))?;
        Ok((pages * size) as u64)
    }

    /// Copies the WAL into the database and cuts it to nothing, when it has
    /// grown past `keep` bytes. Returns the WAL's size afterwards.
    pub fn shrink_wal(&self, keep: u64) -> Result<u64, StoreError> {
        if wal_len(&self.path) > keep {
            self.conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(sql("checkpoint"))?;
        }
        Ok(wal_len(&self.path))
    }

    /// Deletes what is older than `max_age_ns`, then the oldest events (and,
    /// if still needed, the oldest kills) until the store, its WAL included,
    /// is under `max_bytes`: the database gets `max_bytes` less the room
    /// kept for the WAL. Returns the rows deleted.
    pub fn enforce_retention(
        &mut self,
        now_ns: i64,
        max_age_ns: i64,
        max_bytes: u64,
    ) -> Result<u64, StoreError> {
        let cutoff = now_ns - max_age_ns;
        let mut deleted = 0u64;
        for t in tables::TABLES {
            deleted += self
                .conn
                .execute(
                    &format!("DELETE FROM {} WHERE {} < ?1", t.name, t.time),
                    [cutoff],
                )
                .map_err(sql("retention"))? as u64;
        }
        Ok(deleted + self.enforce_size(max_bytes, 0, deleted > 0)?)
    }

    /// The database and its WAL on disk, bytes (two stats: cheap enough
    /// for every tick).
    pub fn disk_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len()) + wal_len(&self.path)
    }

    /// Whether the store on disk is past [`SIZE_CHECK_SHARE`] tenths of
    /// `max_bytes`: then [`Store::enforce_size`] is due now, not at the
    /// next minute.
    pub fn near_size(&self, max_bytes: u64) -> bool {
        self.disk_bytes() > max_bytes / 10 * SIZE_CHECK_SHARE
    }

    /// Deletes the oldest events (and, if still needed, the oldest kills)
    /// until the store, its WAL included, is `headroom` bytes under
    /// `max_bytes`; vacuums when anything was deleted (or `vacuum`).
    /// Returns the rows deleted. Deleting writes to the WAL too: it is cut
    /// back after each batch, so that making room never overshoots.
    pub fn enforce_size(
        &mut self,
        max_bytes: u64,
        headroom: u64,
        vacuum: bool,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0u64;
        let keep = WAL_KEEP_BYTES.min(max_bytes / 8);
        let wal = self.shrink_wal(keep)?;
        let budget = max_bytes
            .saturating_sub(wal.max(keep))
            .saturating_sub(headroom);
        for t in tables::by_shedding_order() {
            while self.used_bytes()? > budget {
                let n = self
                    .conn
                    .execute(&format!("DELETE FROM {0} WHERE rowid IN (SELECT rowid FROM {0} ORDER BY {1} LIMIT 2000)", t.name, t.time), [])
                    .map_err(sql("retention"))?;
                if n == 0 {
                    break;
                }
                deleted += n as u64;
                self.shrink_wal(keep)?;
            }
        }
        if deleted > 0 || vacuum {
            self.conn
                .execute_batch("PRAGMA incremental_vacuum;")
                .map_err(sql("vacuum"))?;
            self.shrink_wal(keep)?;
        }
        Ok(deleted)
    }

    /// Bytes in use (pages not on the freelist).
    fn used_bytes(&self) -> Result<u64, StoreError> {
        let free: i64 = self
            .conn
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .map_err(sql("size"))?;
        let size: i64 = self
            .conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(sql("size"))?;
        Ok(self.size_bytes()?.saturating_sub((free * size) as u64))
    }
}
