//! The engine's stop: the queues drained within a budget, then the last
//! writes, kills first, and the summary.

use std::time::Duration;

use super::{Engine, EngineSummary, Inputs};
use crate::{
    recorder::output::Output,
    store::{DropRow, StoreError},
    util::time::wall_now_ns,
};

/// How long the engine keeps taking in queued events once asked to stop
/// (OOM kills are all taken in whatever this says): the recorder stops
/// within 2 s of SIGTERM even when a storm has filled its queues.
const STOP_DRAIN: Duration = Duration::from_millis(700);
/// At stop, the rings are read until nothing more comes for this long.
const SWEEP_QUIET: Duration = Duration::from_millis(20);
/// How long the engine's whole stop may take from the request (drain,
/// the growth worker's last reports, the last commits): the rest of the
/// 2 s is the probes' detach (a grace period, 0.3 s on a busy node) and
/// the process's exit.
const STOP_BUDGET: Duration = Duration::from_millis(1000);
/// The least time exporters get at stop to hand on what they hold.
const EXPORT_MIN: Duration = Duration::from_millis(300);
/// The least the growth worker is given to settle at stop.
const SETTLE_MIN: Duration = Duration::from_millis(100);
impl Engine {
    /// Asked to stop: every queued OOM kill, then whatever else is queued
    /// until [`STOP_DRAIN`] has passed; what is left is counted as lost.
    pub(super) fn drain_for_stop(&mut self, inputs: &mut Inputs) -> Result<(), StoreError> {
        while let Ok(ev) = inputs.oom.try_recv() {
            self.on_event(ev)?;
        }
        self.commit_kills()?;
        let deadline = std::time::Instant::now() + STOP_DRAIN;
        // The rings themselves are read too (the data reader polls them
        // only every 100 ms): the readers are asked again whenever the
        // queues run dry, until they stay dry for SWEEP_QUIET.
        let sweep = |inputs: &Inputs| inputs.sweep.iter().for_each(|n| n.notify_one());
        sweep(inputs);
        let mut dry_since: Option<std::time::Instant> = None;
        while std::time::Instant::now() < deadline {
            let ev = match inputs.critical.try_recv() {
                Ok(ev) => ev,
                Err(_) => match inputs.data.try_recv() {
                    Ok(ev) => ev,
                    Err(_) => {
                        let since = *dry_since.get_or_insert_with(std::time::Instant::now);
                        if inputs.sweep.is_empty() || since.elapsed() >= SWEEP_QUIET {
                            break;
                        }
                        sweep(inputs);
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                },
            };
            dry_since = None;
            self.on_event(ev)?;
            if self.kills.queued() >= 64 {
                self.commit_kills()?;
            }
        }
        self.commit_kills()?;
        let left = (inputs.critical.len() + inputs.data.len()) as u64;
        if left > 0 {
            let now = wall_now_ns();
            tracing::warn!("{left} queued events not processed: the recorder was asked to stop");
            self.out.push(Output::Drops(DropRow {
                ring: "stop".into(),
                count: left,
                from_ns: now,
                to_ns: now,
            }));
        }
        self.apply()
    }

    /// The last writes, kills first, within [`STOP_BUDGET`] of `stop_at`
    /// (when the stop was asked) where a busy node slows the growth worker.
    /// A full file system costs what cannot be written (said in the log),
    /// not the summary.
    pub(super) fn finish(
        mut self,
        stop_at: std::time::Instant,
    ) -> Result<EngineSummary, StoreError> {
        let r = self.commit_storms(wall_now_ns(), true);
        self.step(r)?;
        // The rings are read to the end: a self-kill no OOM kill claimed by
        // now is a kill of its own.
        let r = self.commit_self_kills(i64::MAX);
        self.step(r)?;
        let r = self.commit_kills().map(drop);
        self.step(r)?;
        let r = self.commit_gpu_ooms();
        self.step(r)?;
        let r = self.refresh_kill_gpu();
        self.step(r)?;
        if let Some(cuda) = &self.cuda {
            self.summary.gpu_ooms = cuda.ooms();
        }
        if let Some(h) = &self.heap {
            // Every sample queued before the stop is in the kills' reports,
            // within a quarter of the budget: under an OOM storm the worker
            // never catches up, and waiting for it took the stop past 2 s.
            h.settle(
                STOP_BUDGET
                    .saturating_sub(stop_at.elapsed())
                    .min(STOP_BUDGET / 4)
                    .max(SETTLE_MIN),
            );
        }
        let r = self.refresh_kill_growth();
        self.step(r)?;
        if let Some(g) = &self.growth {
            self.summary.growth = g.read().ok();
        }
        self.summary.leaks = crate::recorder::summary::LeakSummary {
            watched: self.leaks.watched(),
            found: self.leaks.found,
        };
        if let Some(a) = &self.armer {
            self.summary.growth_arming = Some(crate::recorder::summary::ArmingSummary {
                arms: a.arms,
                attached_s: a.attached_total(wall_now_ns()) as f64 / 1e9,
                pictures: self.pictures.taken,
                pictures_not_taken: self.pictures.not_taken,
            });
        }
        if let Some(h) = self.heap.take() {
            self.summary.growth_queue_drops = h.dropped();
            self.summary.growth_forgotten = h.forgotten();
            self.summary.maps_reads_skipped = h.maps_skipped();
            h.stop();
        }
        if let Some(w) = self.watcher.take() {
            w.stop();
        }
        let rows = self.gpu.take_timeline();
        let r = self.journal.timeline(rows).map(drop);
        self.step(r)?;
        let now = wall_now_ns();
        self.out.extend(self.upkeep.read_drops(now, &self.metrics));
        self.close_call_windows(i64::MAX);
        let r = self.apply().and_then(|()| self.journal.flush());
        self.step(r)?;
        let r = self.settle_unmatched(now, true);
        self.step(r)?;
        let r = self.commit_kills().map(drop);
        self.step(r)?;
        if self.kills.queued() > 0 && !self.journal.has_spill_store() {
            tracing::error!(
                "{} kill(s) could not be written before the recorder stopped: the store's file system is full, and so is the spill store's",
                self.kills.queued()
            );
        }
        // What re-enrichment changed, last and only within half the stop's
        // budget, in small steps: the kills themselves are stored.
        while self.kills.dirty() > 0 && stop_at.elapsed() < STOP_BUDGET / 2 {
            let r = self.write_dirty();
            self.step(r)?;
        }
        if self.kills.dirty() > 0 {
            tracing::warn!(
                "{} kill(s) keep their late growth or GPU details unstored: the stop's budget ran out",
                self.kills.dirty()
            );
        }
        let r = self.journal.end_session(self.kills.queued());
        self.step(r)?;
        tracing::debug!(
            "the engine stopped {:?} after the request",
            stop_at.elapsed()
        );
        let m = self.metrics.snapshot();
        let s = &mut self.summary;
        (s.events, s.kills, s.folded_kills) = (m.events, m.kills, m.folded_kills);
        s.drops = self.upkeep.drops();
        s.nvml_samples = self.gpu.samples;
        (s.nvml_sample_us_mean, s.nvml_sample_us_max) = self.gpu.sample_us;
        s.kill_commit_us = self.journal.kill_commit_us.clone();
        // Exporters get what is left of the budget, and at least
        // EXPORT_MIN: a slow destination is left behind, never waited for.
        let export_deadline = std::time::Instant::now()
            + STOP_BUDGET
                .saturating_sub(stop_at.elapsed())
                .max(EXPORT_MIN);
        s.export_drops = self.journal.finish(export_deadline);
        s.model = self.model.stats;
        s.model_entries = self.model.len();
        s.model_live = self.model.live().count();
        s.model_bytes = self.model.bytes();
        Ok(self.summary)
    }
}
