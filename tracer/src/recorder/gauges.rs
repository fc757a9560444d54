//! What the engine publishes each tick for the metrics endpoint: the
//! latest samples of containers' memory cgroups, and what the traced CUDA
//! calls hold per container.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    correlate::cuda::CudaLedgers,
    model::{ProcessTable, sampler::Sampler},
    record::published::{ContainerCuda, MemcgGauge},
};

/// The latest sample of each of `paths` that belongs to a container or a
/// pod (only those: a series per cgroup of every process would not be
/// bounded), if taken within the last minute; `armed` says whether a
/// cgroup's growth is sampled (`None`: not armed on risk), `leak` how fast
/// it leaks (`None`: not watched yet).
pub fn container_memcgs(
    model: &ProcessTable,
    sampler: &Sampler,
    paths: &BTreeSet<String>,
    now: i64,
    armed: impl Fn(&str) -> Option<bool>,
    leak: impl Fn(&str) -> Option<f64>,
) -> Vec<MemcgGauge> {
    paths
        .iter()
        .filter_map(|path| {
            let owner = model.owner_of(path);
            if owner.container_id.is_none() && owner.pod_uid.is_none() {
                return None;
            }
            let s = sampler
                .latest(path)
                .filter(|s| s.ts_ns >= now - 60_000_000_000)?;
            Some(MemcgGauge {
                cgroup: path.clone(),
                container: owner.short().unwrap_or_default(),
                kube: owner.kube,
                usage: s.usage_bytes,
                limit: s.limit_bytes,
                failcnt: s.failcnt,
                growth_armed: armed(path),
                leak_bytes_per_second: leak(path),
            })
        })
        .collect()
}

/// What the traced CUDA calls hold per container (or memory cgroup, for a
/// process in none): caching allocators and pinned host memory.
pub fn container_cuda(model: &ProcessTable, ledgers: &CudaLedgers) -> Vec<ContainerCuda> {
    let mut by: BTreeMap<String, ContainerCuda> = BTreeMap::new();
    let get = |pid: u32| {
        let p = model.get(pid);
        // Names read now (a process's may not have been readable at its exec).
        let owner = p.and_then(|p| Some(model.owner_of(p.memcg.as_deref()?)));
        let name = owner
            .as_ref()
            .and_then(|o| o.short())
            .or_else(|| p.and_then(|p| p.memcg.clone()))
            .unwrap_or_default();
        (name, owner.and_then(|o| o.kube))
    };
    // (pid, its allocator's allocated and reserved, its pinned host bytes)
    let held = ledgers
        .allocators()
        .into_iter()
        .map(|(pid, a)| (pid, Some((a.allocated, a.reserved)), 0))
        .chain(
            ledgers
                .pinned_by_pid()
                .into_iter()
                .map(|(pid, n)| (pid, None, n)),
        );
    for (pid, allocator, pinned) in held {
        let (name, kube) = get(pid);
        let c = by.entry(name.clone()).or_insert_with(|| ContainerCuda {
            container: name,
            kube,
            ..Default::default()
        });
        if let Some((allocated, reserved)) = allocator {
            let e = c.allocator.get_or_insert((0, 0));
            e.0 += allocated;
            e.1 += reserved;
        }
        c.pinned_host += pinned;
    }
    by.into_values().collect()
}
