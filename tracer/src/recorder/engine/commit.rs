//! The engine's commit path: queued kills enriched in a fixed order and
//! made durable through the journal; GPU OOMs joined and stored; the late
//! enrichments of committed kills stored again.

use super::Engine;
use crate::{
    correlate::KillEnricher, recorder::metrics::Metrics, store::StoreError, util::time::wall_now_ns,
};

/// Kills re-enriched but not yet stored again, written at most this many a
/// tick, in one transaction: under an OOM storm the growth worker hands
/// over hundreds of tipping stacks at once, and storing 715 kills again in
/// one tick kept the engine 3.4-4.3 s (debug build) from kills and stop.
const DIRTY_PER_TICK: usize = 16;
impl Engine {
    /// Kills committed in the last few seconds get their victim's GPU
    /// ledger again, now that the calls before the kill are counted.
    pub(super) fn refresh_kill_gpu(&mut self) -> Result<(), StoreError> {
        let Some(cuda) = &self.cuda else {
            return Ok(());
        };
        let since = wall_now_ns() - 5_000_000_000;
        self.kills
            .re_enrich(&cuda.ledgers, since, |r| r.victim.gpu.clone());
        self.write_dirty()
    }

    /// Kills committed in the last seconds get their tasks' names the
    /// model learnt late, where their victim (and the neighbour their
    /// verdict blames) grew and the stack that tipped them, as the heap
    /// worker finds them (after the kill's commit: unwinding never delays
    /// it).
    pub(super) fn refresh_kill_growth(&mut self) -> Result<(), StoreError> {
        let since = wall_now_ns() - 20_000_000_000;
        self.kills
            .re_enrich(&crate::correlate::LateNames(&self.model), since, |r| {
                r.tasks
                    .iter()
                    .filter(|t| t.cmdline.is_some() || t.place.is_some())
                    .count()
            });
        let Some(h) = &self.heap else {
            return self.write_dirty();
        };
        for (victim, neighbour) in self.kills.neighbours_to_ask(since) {
            h.kill_neighbour(victim, neighbour);
        }
        self.kills.re_enrich(h, since, |r| {
            (
                r.growth.clone(),
                r.neighbour_growth.clone(),
                r.tipping_stack.clone(),
                r.victim.heap.is_some(),
            )
        });
        self.write_dirty()
    }

    /// Stores again up to [`DIRTY_PER_TICK`] kills that re-enrichment
    /// changed, oldest first, in one transaction.
    pub(super) fn write_dirty(&mut self) -> Result<(), StoreError> {
        let kills = self.kills.take_dirty(DIRTY_PER_TICK);
        self.journal.kills_rewritten(kills)
    }

    /// GPU out-of-memory failures, joined with the ledgers and the latest
    /// picture, made durable.
    pub(super) fn commit_gpu_ooms(&mut self) -> Result<(), StoreError> {
        let Some(cuda) = &mut self.cuda else {
            return Ok(());
        };
        let env = env!(self);
        for mut rec in cuda.take_ooms(&env) {
            self.gpu.annotate_oom(&mut rec);
            if let Some(snap) = self
                .heap
                .as_ref()
                .and_then(|h| h.latest_cuda(rec.process.pid))
            {
                rec.stacks = snap.sites;
            }
            let id = self.journal.gpu_oom(&rec)?;
            self.gpu.oom_stored(id, rec);
        }
        Ok(())
    }

    /// Commits every queued kill, with the events so far, in one
    /// transaction: a burst of kills shares one fsync instead of queueing
    /// behind one another's. Each kill is enriched first, in this order:
    /// the CUDA ledgers, the GPU picture, the heap worker, the warnings,
    /// growth arming and its pictures, slow leaks.
    pub(super) fn commit_kills(&mut self) -> Result<bool, StoreError> {
        if self.kills.queued() == 0 {
            return Ok(false);
        }
        self.apply()?;
        let mut batch = self.kills.take_queued();
        let enrichers: [Option<&dyn KillEnricher>; 7] = [
            self.cuda.as_ref().map(|c| &c.ledgers as &dyn KillEnricher),
            Some(&self.gpu),
            self.heap.as_ref().map(|h| h as &dyn KillEnricher),
            Some(&self.warnings),
            self.armer.as_ref().map(|a| a as &dyn KillEnricher),
            Some(&self.pictures),
            Some(&self.leaks),
        ];
        for k in &mut batch {
            enrichers.iter().flatten().for_each(|e| e.enrich(k));
        }
        let c = self.journal.commit_kills(batch);
        self.kills.requeue(c.held);
        if let Some(e) = c.error {
            return Err(e);
        }
        if c.stored.is_empty() {
            return Ok(false);
        }
        for (id, rec) in c.stored {
            if let Some(h) = &self.heap {
                h.on_kill(rec.victim.pid, rec.ts_ns.max(0) as u64);
            }
            self.kills.committed(id, rec);
        }
        self.kills
            .retry_groups(&self.clock, wall_now_ns(), &mut self.out);
        self.apply()?;
        Ok(true)
    }

    /// Kernel reports nobody claimed become kernel-log-only kills (unless
    /// the store has them), through the one commit path; a backlog found
    /// at start (many old kills) costs one commit.
    pub(super) fn settle_unmatched(&mut self, now_ns: i64, all: bool) -> Result<(), StoreError> {
        let journal = &self.journal;
        let env = env!(self);
        // A failed lookup ends the settling: the error is the loop's.
        let mut failed = None;
        self.kills
            .settle_unmatched(&env, now_ns, all, |pid, ts, w| {
                failed.is_some()
                    || journal.has_kill(pid, ts, w).unwrap_or_else(|e| {
                        failed = Some(e);
                        true
                    })
            });
        if let Some(e) = failed {
            return Err(e);
        }
        self.summary.kmsg_only_kills = self.kills.kmsg_only;
        self.summary.oom_marks_without_kill = self.kills.marks_without_kill;
        self.commit_kills().map(drop)
    }

    /// Stores the SIGKILL aggregates whose window has closed (all of them
    /// with `all`).
    pub(super) fn commit_storms(&mut self, now_ns: i64, all: bool) -> Result<(), StoreError> {
        if self.kills.storms_due(now_ns, all) == 0 {
            return Ok(());
        }
        Metrics::set(&self.metrics.folded_kills, self.kills.folded());
        self.commit_kills().map(drop)
    }

    /// Kernel SIGKILLs of processes by themselves that no OOM kill claimed
    /// by `due_ns`, recorded.
    pub(super) fn commit_self_kills(&mut self, due_ns: i64) -> Result<(), StoreError> {
        let page_kb = crate::util::sys::page_kb();
        self.kills
            .self_kills_due(&mut env!(self), due_ns, wall_now_ns(), page_kb);
        Ok(())
    }
}
