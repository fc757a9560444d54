//! The tick's store side: the heartbeat, the reserve kept for kills, the
//! size bound, retention and the timeline's downsampling, and the rings'
//! drop counters.

use std::time::Duration;

use super::journal::Journal;
use crate::{
    correlate::timeline::{AGED_RES_S, DOWNSAMPLE_AFTER_NS},
    probes::{DropCounters, Drops},
    recorder::{metrics::Metrics, output::Output},
    store::{DropRow, StoreError},
};

/// The store's upkeep.
pub struct Upkeep {
    /// Oldest data kept.
    retention: Duration,
    /// Largest store.
    max_store_bytes: u64,
    /// The rings' drop counters, and what they said last, when.
    drops: Option<DropCounters>,
    last_drops: Drops,
    last_drops_ns: i64,
}

impl Upkeep {
    /// Upkeep keeping `retention` within `max_store_bytes`, counting the
    /// rings' `drops` since `now_ns`.
    pub fn new(
        retention: Duration,
        max_store_bytes: u64,
        drops: Option<DropCounters>,
        now_ns: i64,
    ) -> Self {
        Self {
            retention,
            max_store_bytes,
            drops,
            last_drops: Drops::default(),
            last_drops_ns: now_ns,
        }
    }

    /// The drops counted so far.
    pub fn drops(&self) -> Drops {
        self.last_drops
    }

    /// New drops on each ring since the last reading, as rows to store.
    pub fn read_drops(&mut self, now: i64, metrics: &Metrics) -> Vec<Output> {
        let Some(d) = &self.drops else {
            return Vec::new();
        };
        let cur = match d.read() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("reading drop counters: {e}");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (ring, before, after) in [
            ("critical", self.last_drops.critical, cur.critical),
            ("data", self.last_drops.data, cur.data),
            ("oom", self.last_drops.oom, cur.oom),
            ("sigkill", self.last_drops.sigkill, cur.sigkill),
        ] {
            if after > before {
                let row = DropRow {
                    ring: ring.into(),
                    count: after - before,
                    from_ns: self.last_drops_ns,
                    to_ns: now,
                };
                tracing::warn!("{} (ring buffer full)", row.describe());
                out.push(Output::Drops(row));
            }
        }
        self.last_drops = cur;
        Metrics::set(&metrics.drops_critical, cur.critical);
        Metrics::set(&metrics.drops_data, cur.data);
        Metrics::set(&metrics.drops_oom, cur.oom);
        self.last_drops_ns = now;
        out
    }

    /// The reserve, found gone or used on a full file system, is made again
    /// once there is room.
    pub fn reserve(&self, j: &mut Journal) {
        if (j.disk_full || !j.store.has_reserve()) && j.store.has_room() {
            let reserved = j.store.ensure_reserve();
            if reserved && j.disk_full {
                j.disk_full = false;
                tracing::info!("the store's file system has room again");
            }
        }
    }

    /// The heartbeat, and the size bound at every tick (a flood of events
    /// fills a store faster than once a minute can catch); retention and
    /// downsampling with `minute`.
    pub fn tick(&self, j: &mut Journal, now: i64, minute: bool) -> Result<(), StoreError> {
        // Every tick: a kill after the last heartbeat of a crashed session
        // is said to be unrecorded within seconds of the crash.
        j.store.heartbeat(j.session_id(), now)?;
        // A spill store is memory: it keeps to its own, smaller bound.
        let max_bytes = if j.store.is_spill() {
            self.max_store_bytes.min(crate::store::spill::MAX_BYTES)
        } else {
            self.max_store_bytes
        };
        if !minute && j.store.near_size(max_bytes) {
            // A tenth below the bound: the flood goes on while the next
            // tick comes, and the WAL runs ahead of its checkpoints.
            let n = j.store.enforce_size(max_bytes, max_bytes / 10, true)?;
            if n > 0 {
                tracing::debug!("size bound removed {n} rows");
            }
        }
        if minute {
            let n = j
                .store
                .enforce_retention(now, self.retention.as_nanos() as i64, max_bytes)?;
            if n > 0 {
                tracing::debug!("retention removed {n} rows");
            }
            j.store
                .downsample_timeline(now - DOWNSAMPLE_AFTER_NS, AGED_RES_S)?;
            // Bursts (churn, kill storms) grow the heap; give it back.
            crate::util::sys::give_back_free_heap();
        }
        Ok(())
    }
}
