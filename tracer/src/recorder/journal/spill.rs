//! The recorder's side of the spill store (see `store::spill`): where kills
//! go while the store's file system is full, and the way back.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use crate::{
    record::KillRecord,
    store::{Checkpointer, Store, StoreError, StoreLock, spill},
};

/// The store to go back to, for a recorder that started on a full file
/// system and records into the spill store.
pub struct Home {
    /// The store.
    pub path: PathBuf,
    /// Its lock, held while the recorder is away: no second recorder
    /// takes the store meanwhile.
    pub lock: StoreLock,
}

/// Spill state.
pub struct Spill {
    dir: PathBuf,
    home: Option<Home>,
    /// The spill store holding copies of the kills the store could not
    /// take, and the session there that stands for the recorder's.
    side: Option<(Store, i64)>,
    /// The kills copied there: (time, pid).
    copied: HashSet<(i64, u32)>,
    /// The checkpoint thread of the store, once back home.
    checkpointer: Option<Checkpointer>,
    /// The store's lock, once back home.
    lock: Option<StoreLock>,
    /// Whether a failed way home was said at warning level (once; it is
    /// tried again each tick).
    said: bool,
}

impl Spill {
    /// Spill stores in `dir`; `home`: the store to go back to, when the
    /// recorder records into its spill store.
    pub fn new(dir: PathBuf, home: Option<Home>) -> Self {
        Self {
            dir,
            home,
            side: None,
            copied: HashSet::new(),
            checkpointer: None,
            lock: None,
            said: false,
        }
    }

    /// The store the recorder will go back to, if it is away from it.
    pub fn home(&self) -> Option<&Path> {
        self.home.as_ref().map(|h| h.path.as_path())
    }

    /// The spill store that holds copies of held kills, if any.
    pub fn side_path(&self) -> Option<&Path> {
        self.side.as_ref().map(|(s, _)| s.path())
    }

    /// Copies kills the store could not take into its spill store (made
    /// when first needed), each once. Returns how many were new.
    pub fn copy_held(
        &mut self,
        store: &Store,
        session_id: i64,
        kills: &[KillRecord],
        now_ns: i64,
    ) -> Result<usize, StoreError> {
        let is_new = |k: &&KillRecord| !self.copied.contains(&(k.ts_ns, k.victim.pid));
        if !kills.iter().any(|k| is_new(&k)) {
            return Ok(0);
        }
        if self.side.is_none() {
            let side = Store::open_spill(store.path(), &self.dir)?;
            let session = side.copy_session(store, session_id)?;
            self.side = Some((side, session));
        }
        let (side, session) = self.side.as_mut().expect("made above");
        let new: Vec<KillRecord> = kills
            .iter()
            .filter(is_new)
            .map(|k| KillRecord {
                session_id: Some(*session),
                ..k.clone()
            })
            .collect();
        side.insert_kills(&new, &[], now_ns)?;
        self.copied
            .extend(new.iter().map(|k| (k.ts_ns, k.victim.pid)));
        Ok(new.len())
    }

    /// Every held kill reached the store: their copies go.
    pub fn all_stored(&mut self) {
        if let Some((side, _)) = self.side.take() {
            let path = side.path().to_path_buf();
            drop(side);
            spill::remove(&path);
            tracing::info!(
                "the {} kill(s) held while the file system was full are in the store; their spill copies were removed",
                self.copied.len()
            );
            self.copied.clear();
        }
    }

    /// The recorder stops with `held` kills the store has not taken: their
    /// copies stay for the next start to import, with their session ended.
    pub fn close(&mut self, held: usize, now_ns: i64) {
        if let Some((side, session)) = self.side.take() {
            if let Err(e) = side.end_session(session, now_ns) {
                tracing::debug!("ending the spill store's session: {e}");
            }
            tracing::warn!(
                "{held} kill(s) the store's file system had no room for are kept in {}: the next start imports them",
                side.path().display()
            );
        }
    }

    /// Away from home and its file system has room: opens it and imports
    /// the spill store `current` (which the caller then leaves). `None`:
    /// not yet (said why, at debug level).
    pub fn go_home(&mut self, current: &Store) -> Option<(Store, spill::Imported)> {
        let home = self.home.as_ref()?;
        if !crate::store::has_room_for(&home.path) {
            return None;
        }
        let tried = Store::open_rw_held(&home.path, true)
            .map_err(|e| format!("the store {} cannot be opened: {e}", home.path.display()))
            .and_then(|mut store| match store.import_spill(current.path()) {
                Ok(i) => Ok((store, i)),
                Err(e) => Err(format!(
                    "the spill store {} cannot be imported: {e}",
                    current.path().display()
                )),
            });
        let (store, imported) = match tried {
            Ok(t) => t,
            Err(e) if self.said => {
                tracing::debug!("{e}; tried again each second");
                return None;
            }
            Err(e) => {
                self.said = true;
                tracing::warn!("{e}; recording goes on there, tried again each second");
                return None;
            }
        };
        match Checkpointer::spawn(&home.path, std::time::Duration::from_secs(5)) {
            Ok(c) => self.checkpointer = Some(c),
            Err(e) => tracing::warn!("the store's checkpoints: {e}"),
        }
        Some((store, imported))
    }

    /// Back home: the spill store at `path` was imported and closed.
    pub fn arrived(&mut self, path: &Path) {
        spill::remove(path);
        if let Some(h) = &self.home {
            tracing::info!(
                "the store's file system has room again: recording into {}",
                h.path.display()
            );
        }
        // The lock is kept until the recorder ends.
        self.lock = self.home.take().map(|h| h.lock);
    }
}

/// Opens the store for recording. On a full file system, where even
/// opening it fails, the recorder records into the store's spill store
/// (`store::spill`) and goes back to the store when it has room. A spill
/// store an earlier recorder left is imported first.
pub fn open_store(path: &Path, spill_dir: &Path) -> anyhow::Result<(Store, Spill)> {
    match Store::open_rw(path) {
        Ok(mut store) => {
            match store.import_left_spill(spill_dir) {
                Ok(Some(i)) => tracing::info!(
                    "imported {} kill(s) ({} already stored), {} GPU OOM(s) and {} other rows from the spill store an earlier recorder left",
                    i.kills,
                    i.known,
                    i.gpu_ooms,
                    i.rows
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    "the spill store {} an earlier recorder left was not imported, and is left in place: {e:#}",
                    crate::store::spill::path_for(path, spill_dir).display()
                ),
            }
            Ok((store, Spill::new(spill_dir.into(), None)))
        }
        Err(e @ StoreError::Sql { .. })
            if e.is_disk_full() || !crate::store::has_room_for(path) =>
        {
            let lock = Store::lock_rw(path)?;
            let store = Store::open_spill(path, spill_dir).with_context(|| {
                format!("the store's file system is full ({e}), and the spill store in {} cannot be opened", spill_dir.display())
            })?;
            tracing::warn!(
                "the store's file system is full ({:#}): recording into the spill store {} until it has room",
                anyhow::Error::from(e),
                store.path().display()
            );
            let home = Home {
                path: path.into(),
                lock,
            };
            Ok((store, Spill::new(spill_dir.into(), Some(home))))
        }
        Err(e) => Err(e.into()),
    }
}
