//! The engine's tick: the model's due reads, the cgroup samples and what
//! is published of them, the warnings, the kills that fall due, the late
//! enrichments, and the store's upkeep.

use super::*;

impl Engine {
    pub(super) fn tick(&mut self) -> Result<(), StoreError> {
        let t0 = wall_now_ns();
        self.tick_inner()?;
        tracing::debug!("tick took {} us", (wall_now_ns() - t0) / 1000);
        Ok(())
    }

    /// The tick: the model's due reads, the cgroup samples, what is
    /// published of them, the warnings, the drops, the kills that fall
    /// due, the late enrichments, then the store's upkeep.
    pub(super) fn tick_inner(&mut self) -> Result<(), StoreError> {
        self.ticks += 1;
        let now = wall_now_ns();
        self.model.read_due(now);
        let per_min = (60.0 / self.opts.sample_interval.as_secs_f64())
            .ceil()
            .max(1.0) as u64;
        if self.ticks.is_multiple_of(per_min) {
            self.clock = Clock::now();
        }
        let counters = self.memcg.as_ref().map(|m| m.read()).unwrap_or_default();
        let mut paths: BTreeSet<String> = self.model.memcgs_in_use();
        paths.extend(self.opts.cgroups.iter().cloned());
        self.sampler
            .sample(paths.iter().map(String::as_str), &counters, now);
        {
            let env = env!(self);
            self.leaks.tick(&env, &paths, now, &mut self.out);
        }
        if let Some(p) = &self.published {
            let armer = self.armer.as_ref();
            let leaks = &self.leaks;
            p.memcg.set(crate::recorder::gauges::container_memcgs(
                &self.model,
                &self.sampler,
                &paths,
                now,
                |c| armer.map(|a| a.covers(c)),
                |c| leaks.rate_of(c),
            ));
            if let Some(cuda) = &self.cuda {
                p.cuda.set(crate::recorder::gauges::container_cuda(
                    &self.model,
                    &cuda.ledgers,
                ));
            }
        }
        let named = self.model.kube_named();
        if named > 0 {
            tracing::debug!("{named} pod(s) and container(s) named from the node's files");
        }
        let since = now - 2 * self.opts.sample_interval.as_nanos() as i64;
        let env = env!(self);
        self.warnings.heap_on_pressure(
            &env,
            self.watcher.as_ref(),
            &paths,
            (since, now),
            &mut self.out,
        );
        self.warnings.early(&env, &paths, now, &mut self.out);
        if let (Some(armer), Some(maps)) = (&mut self.armer, &mut self.growth) {
            let warnings = &self.warnings;
            armer.tick(
                &env,
                maps,
                |p| warnings.is_warned(p),
                &paths,
                now,
                &mut self.out,
            );
        }
        self.start_pictures(now);
        self.tick_pictures(now);
        self.out.extend(self.upkeep.read_drops(now, &self.metrics));
        self.apply()?;
        self.commit_storms(now, false)?;
        self.refresh_kill_growth()?;
        if let Some(g) = &mut self.growth
            && self.ticks.is_multiple_of(GROWTH_GENERATION_TICKS)
            && let Err(e) = g.new_generation()
        {
            tracing::warn!("growth: cannot renew the decisions: {e}");
        }
        self.go_home();
        // Kernel SIGKILLs of processes by themselves no OOM kill claimed.
        self.commit_self_kills(now)?;
        // Kills held while the file system was full.
        self.commit_kills()?;
        self.upkeep.reserve(&mut self.journal);
        self.close_call_windows(now);
        self.apply()?;
        self.journal.flush()?;
        self.kills.prune(now);
        self.settle_unmatched(now, false)?;
        self.model.prune(now);
        // Entries whose exit was lost (a full ring) are found within a
        // round of the live entries; the cost per tick is bounded.
        let retired = self.model.audit(now, AUDIT_PER_TICK);
        if retired > 0 {
            tracing::debug!("{retired} processes found ended without their exit");
        }
        if let Some(cuda) = &mut self.cuda {
            cuda.tick(now, &mut self.out);
            self.apply()?;
        }
        self.upkeep
            .tick(&mut self.journal, now, self.ticks % per_min == 1)
    }
}
