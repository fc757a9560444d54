//! The kernel's run-time statistics of eBPF programs (`BPF_ENABLE_STATS`):
//! where the benchmarks' programs spend their time, per run, measured in
//! the kernel rather than inferred from a loop's wall clock.
//!
//! The statistics cost every program on the machine about 45 ns a run
//! while they are on, so the benchmarks take them in a round of their own,
//! never in the rounds whose wall clock they report.

use std::{collections::HashMap, os::fd::OwnedFd};

use anyhow::Context as _;
use aya::{
    programs::loaded_programs,
    sys::{Stats, enable_stats},
};

/// Statistics on while this lives.
pub struct ProgStats {
    _on: OwnedFd,
}

/// Runs and nanoseconds of every loaded program, by program id.
#[derive(Default)]
pub struct Snapshot(HashMap<u32, (String, u64, u64)>);

impl ProgStats {
    /// Switches the statistics on (Linux 5.8).
    pub fn start() -> anyhow::Result<Self> {
        let on = enable_stats(Stats::RunTime).context("BPF_ENABLE_STATS")?;
        Ok(Self { _on: on })
    }

    /// Runs `work` and describes (as [`describe`]) what the programs named
    /// with one of `prefixes` did meanwhile.
    pub fn around(
        &self,
        prefixes: &[&str],
        work: impl FnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<String> {
        Ok(describe(&self.ran_around(work)?, prefixes))
    }

    /// Runs `work`; the runs and nanoseconds of each program name meanwhile.
    pub fn ran_around(
        &self,
        work: impl FnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<HashMap<String, (u64, u64)>> {
        let before = self.snapshot();
        work()?;
        Ok(between(&before, &self.snapshot()))
    }

    /// Every loaded program's counters now.
    fn snapshot(&self) -> Snapshot {
        Snapshot(
            loaded_programs()
                .filter_map(Result::ok)
                .map(|p| {
                    let name = p.name_as_str().unwrap_or_default().to_string();
                    (
                        p.id(),
                        (name, p.run_count(), p.run_time().as_nanos() as u64),
                    )
                })
                .collect(),
        )
    }
}

/// Runs and nanoseconds per program name, summed over the programs that ran
/// between two snapshots (a name the kernel cut to 15 bytes keeps its cut).
fn between(before: &Snapshot, after: &Snapshot) -> HashMap<String, (u64, u64)> {
    let mut out: HashMap<String, (u64, u64)> = HashMap::new();
    for (id, (name, runs, ns)) in &after.0 {
        let (r0, n0) = before.0.get(id).map_or((0, 0), |(_, r, n)| (*r, *n));
        let runs = runs.saturating_sub(r0);
        if runs > 0 {
            let e = out.entry(name.clone()).or_default();
            e.0 += runs;
            e.1 += ns.saturating_sub(n0);
        }
    }
    out
}

/// `name N ns` for the programs whose name starts with one of `prefixes`
/// (shorter than the 15 bytes the kernel keeps of a name), most runs first.
pub fn describe(ran: &HashMap<String, (u64, u64)>, prefixes: &[&str]) -> String {
    let mut rows: Vec<_> = ran
        .iter()
        .filter(|(n, _)| prefixes.iter().any(|p| n.starts_with(p)))
        .collect();
    rows.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
    if rows.is_empty() {
        return "none ran".into();
    }
    rows.iter()
        .map(|(n, (runs, ns))| format!("{n} {:.0} ns x {runs}", *ns as f64 / *runs as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_between_snapshots_are_summed_by_name() {
        let before = Snapshot(HashMap::from([
            (1, ("cuda_entry".into(), 10, 1000)),
            (2, ("cuda_return".into(), 10, 2000)),
        ]));
        let after = Snapshot(HashMap::from([
            (1, ("cuda_entry".into(), 110, 21000)),
            (2, ("cuda_return".into(), 10, 2000)),
            // Loaded in between: all of its runs count.
            (3, ("cuda_entry".into(), 100, 30000)),
            // A program without a name is nobody's.
            (4, (String::new(), 5, 500)),
        ]));
        let ran = between(&before, &after);
        assert_eq!(ran["cuda_entry"], (200, 50000));
        assert!(!ran.contains_key("cuda_return"), "no run, no row");
        assert_eq!(describe(&ran, &["cuda_"]), "cuda_entry 250 ns x 200");
        assert_eq!(describe(&ran, &["growth_"]), "none ran");
        assert_eq!(ran[""], (5, 500));
    }
}
