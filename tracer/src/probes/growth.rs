//! The growth family on the user side: its configuration (which processes,
//! how often a sample), attaching the fault tracepoints, and the maps
//! userspace drives (the decision generation, the selected processes) and
//! reads (counters).

use aya::maps::{Array, MapData, PerCpuArray};
use tracer_common::{
    growth::{GrowthConfig, mode, stat},
    heap::EXP_TABLE_LEN,
    maps, programs,
};

use super::{Hook, ProbeError, ProbeSpec, ProbeStatus, Probes, btf::KernelBtf};

/// Mean bytes faulted in between two samples of a process by default.
pub const DEFAULT_SAMPLE_BYTES: u64 = 1 << 20;
/// Anonymous mappings of at least this many bytes are sent with their
/// stack by default.
pub const DEFAULT_RESERVE_BYTES: u64 = 64 << 20;

/// Which processes growth attribution follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GrowthMode {
    /// Nobody.
    Off,
    /// Processes in a memory cgroup with a limit (here or above).
    Limited,
    /// Processes in a memory cgroup at risk of reaching its limit: the
    /// page-fault programs are attached only while one is (armed).
    Risk,
    /// Every process.
    All,
    /// The processes userspace selects (`tracer growth`).
    #[value(skip)]
    Selected,
    /// Nobody, with the programs attached all the same: each returns at
    /// once, so what is left is what the hooks themselves cost on every
    /// fault (the floor of `cargo xtask bench --only growth`).
    #[value(hide = true)]
    Floor,
}

impl GrowthMode {
    fn wire(self) -> u32 {
        match self {
            GrowthMode::Off | GrowthMode::Floor => mode::OFF,
            GrowthMode::Limited => mode::LIMITED,
            GrowthMode::Risk => mode::ARMED,
            GrowthMode::All => mode::ALL,
            GrowthMode::Selected => mode::SELECTED,
        }
    }
}

/// What the growth programs are asked to do.
#[derive(Clone, Copy, Debug)]
pub struct GrowthOptions {
    /// Which processes.
    pub mode: GrowthMode,
    /// Mean bytes between samples of one process (0 = every fault).
    pub sample_bytes: u64,
    /// Mappings of at least this many bytes are sent (0 = none).
    pub reserve_bytes: u64,
}

impl GrowthOptions {
    /// Growth attribution off.
    pub const OFF: Self = Self {
        mode: GrowthMode::Off,
        sample_bytes: DEFAULT_SAMPLE_BYTES,
        reserve_bytes: DEFAULT_RESERVE_BYTES,
    };
}

/// The programs' configuration for this kernel; the notes say what keeps a
/// process from counting as limited (no limit is then ever seen).
pub fn config(opts: &GrowthOptions, btf: &KernelBtf) -> (GrowthConfig, Option<String>) {
    let mut c = GrowthConfig::empty();
    c.mode = opts.mode.wire();
    c.sample_bytes = opts.sample_bytes.min(super::heap::MAX_SAMPLE_BYTES);
    c.reserve_bytes = opts.reserve_bytes;
    c.exp_table = super::heap::exp_table();
    // PAGE_COUNTER_MAX is LONG_MAX / PAGE_SIZE (include/linux/page_counter.h).
    c.unlimited_pages = i64::MAX as u64 / (crate::util::sys::page_kb() * 1024);
    let note = match super::layout::memcg_limit_offsets(btf) {
        Ok((memory, max, parent)) => {
            c.memcg_memory_off = memory;
            c.counter_max_off = max;
            c.counter_parent_off = parent;
            None
        }
        Err(e) => Some(format!("memory cgroup limits cannot be read ({e})")),
    };
    (c, note)
}

/// The growth programs: (program, tracepoint, required for growth).
pub const GROWTH_PROBES: [ProbeSpec; 6] = [
    ProbeSpec {
        program: programs::GROWTH_FAULT_USER,
        hook: Hook::RawTracePoint {
            name: "page_fault_user",
        },
        required: true,
        purpose: "growth attribution: page faults in user mode",
    },
    ProbeSpec {
        program: programs::GROWTH_FAULT_KERNEL,
        hook: Hook::RawTracePoint {
            name: "page_fault_kernel",
        },
        required: false,
        purpose: "growth attribution: the kernel filling a process's new buffers, as read() does",
    },
    ProbeSpec {
        program: programs::GROWTH_CGROUP_ATTACH,
        hook: Hook::TracePoint {
            category: "cgroup",
            name: "cgroup_attach_task",
        },
        required: false,
        purpose: "growth attribution: a process's decision taken again when it changes cgroup",
    },
    ProbeSpec {
        program: programs::GROWTH_MMAP,
        hook: Hook::RawTracePoint {
            name: "vm_unmapped_area",
        },
        required: false,
        purpose: "growth attribution: large reservations (mmap) with their stacks",
    },
    ProbeSpec {
        program: programs::GROWTH_OOM_TIP,
        hook: Hook::TracePoint {
            category: "oom",
            name: "mark_victim",
        },
        required: false,
        purpose: "growth attribution: the stack of the allocation that tipped an OOM kill",
    },
    ProbeSpec {
        program: programs::GROWTH_MMAP_LOCK,
        hook: Hook::TracePoint {
            category: "mmap_lock",
            name: "mmap_lock_acquire_returned",
        },
        required: false,
        purpose: "growth attribution: memory given back (munmap, madvise), for what each site kept",
    },
];

/// The programs on every page fault: with `--growth risk`, attached only
/// while a memory cgroup is armed.
pub const FAULT_PROGRAMS: [&str; 2] = [programs::GROWTH_FAULT_USER, programs::GROWTH_FAULT_KERNEL];

/// Whether the program that sees memory given back (munmap, madvise)
/// attached: growth is then shown as what each site kept.
pub fn returns_traced(statuses: &[ProbeStatus]) -> bool {
    statuses
        .iter()
        .any(|s| s.spec.program == programs::GROWTH_MMAP_LOCK && s.error.is_none())
}

/// Why the map-lock tracepoint is not attached here, if it is not: it
/// must carry the memory cgroup's id (`memcg_id`, recent kernels); where
/// it carries a path instead, the kernel builds that path at every lock
/// taken while the tracepoint is on, page faults included.
fn map_lock_unfit(tracefs: &std::path::Path) -> Option<String> {
    match super::tracefs::Format::read(tracefs, "mmap_lock", "mmap_lock_acquire_returned") {
        Ok(f) if f.field("memcg_id").is_some() => None,
        Ok(_) => Some(
            "not attached: this kernel's mmap_lock tracepoints build the memory cgroup's path at every lock taken; growth is shown as faulted in, not kept"
                .into(),
        ),
        Err(_) => Some("not on this kernel; growth is shown as faulted in, not kept".into()),
    }
}

/// The growth programs' counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GrowthCounts {
    /// Faults of followed processes (counted a sampling gap at a time).
    pub faults: u64,
    /// Samples sent.
    pub samples: u64,
    /// Samples lost to a full ring.
    pub ring_full: u64,
    /// Samples sent without their stack.
    pub stack_lost: u64,
    /// Decisions taken (whether a process is followed).
    pub decisions: u64,
    /// Tipping stacks sent at OOM kills.
    pub tips: u64,
}

/// What userspace keeps of the growth programs' maps.
pub struct GrowthMaps {
    stats: PerCpuArray<MapData, u64>,
    generation: Array<MapData, u32>,
    /// The armed cgroups' ids (`--growth risk`).
    pub armed: super::arming::ArmedMap,
    /// The page-fault programs, attached while a cgroup is armed
    /// (`--growth risk`; `None` otherwise).
    pub hooks: Option<super::arming::FaultHooks>,
}

impl GrowthMaps {
    /// Reads the counters.
    pub fn read(&self) -> Result<GrowthCounts, aya::maps::MapError> {
        let get = |i: u32| -> Result<u64, aya::maps::MapError> {
            Ok(self.stats.get(&i, 0)?.iter().sum())
        };
        Ok(GrowthCounts {
            faults: get(stat::FAULTS)?,
            samples: get(stat::SAMPLES)?,
            ring_full: get(stat::RING_FULL)?,
            stack_lost: get(stat::STACK_LOST)?,
            decisions: get(stat::DECISIONS)?,
            tips: get(stat::TIPS)?,
        })
    }

    /// Has every process's decision taken again at its next fault (a limit
    /// set or lifted since).
    pub fn new_generation(&mut self) -> Result<(), aya::maps::MapError> {
        // Read first: the kernel bumps it too (a task changing cgroup).
        let now = self.generation.get(&0, 0)?;
        self.generation.set(0, now.wrapping_add(1), 0)
    }
}

impl Probes {
    /// Attaches the growth programs (with the mode they were loaded with),
    /// as [`Probes::attach`] does. Without `page_fault_user` (a kernel that
    /// is not x86) the error says so; recording goes on without growth.
    ///
    /// With `on_risk` the page-fault programs are loaded (the verifier
    /// checks them now) but not attached: [`GrowthMaps::arming`] attaches
    /// them while a memory cgroup is armed.
    pub fn attach_growth(&mut self, on_risk: bool) -> Result<Vec<ProbeStatus>, ProbeError> {
        let unfit = map_lock_unfit(&self.tracefs);
        let armed_later = |s: &ProbeSpec| on_risk && FAULT_PROGRAMS.contains(&s.program);
        let specs: Vec<ProbeSpec> = GROWTH_PROBES
            .into_iter()
            .filter(|s| unfit.is_none() || s.program != programs::GROWTH_MMAP_LOCK)
            .filter(|s| !armed_later(s))
            .collect();
        let mut statuses = self.attach_specs(&specs)?;
        if on_risk {
            let mut hooks = Vec::new();
            for spec in GROWTH_PROBES.iter().filter(|s| armed_later(s)) {
                let Hook::RawTracePoint { name } = spec.hook else {
                    continue;
                };
                match self.load_raw(spec.program) {
                    Ok(fd) => {
                        hooks.push((name, fd));
                        statuses.push(ProbeStatus {
                            spec: *spec,
                            error: None,
                        });
                    }
                    Err(e) if spec.required => return Err(e.into_probe_error(spec.program)),
                    Err(e) => statuses.push(ProbeStatus {
                        spec: *spec,
                        error: Some(e.to_string()),
                    }),
                }
            }
            self.fault_hooks = Some(super::arming::FaultHooks::new(hooks));
        }
        if let Some(why) = unfit
            && let Some(spec) = GROWTH_PROBES
                .iter()
                .find(|s| s.program == programs::GROWTH_MMAP_LOCK)
        {
            statuses.push(ProbeStatus {
                spec: *spec,
                error: Some(why),
            });
        }
        Ok(statuses)
    }

    /// Takes the growth counters and the generation out of the object.
    pub fn take_growth_maps(&mut self) -> Result<GrowthMaps, ProbeError> {
        let take = |ebpf: &mut aya::Ebpf, name: &'static str| {
            ebpf.take_map(name)
                .ok_or(ProbeError::Missing { what: "map", name })
        };
        let stats =
            PerCpuArray::try_from(take(&mut self.ebpf, maps::GROWTH_STATS)?).map_err(|source| {
                ProbeError::Map {
                    name: maps::GROWTH_STATS,
                    source,
                }
            })?;
        let generation =
            Array::try_from(take(&mut self.ebpf, maps::GROWTH_GEN)?).map_err(|source| {
                ProbeError::Map {
                    name: maps::GROWTH_GEN,
                    source,
                }
            })?;
        let armed = aya::maps::HashMap::try_from(take(&mut self.ebpf, maps::GROWTH_ARMED)?)
            .map_err(|source| ProbeError::Map {
                name: maps::GROWTH_ARMED,
                source,
            })?;
        Ok(GrowthMaps {
            stats,
            generation,
            armed: super::arming::ArmedMap::new(armed),
            hooks: None,
        })
    }

    /// Selects (or deselects) a process for growth sampling
    /// (`GrowthMode::Selected`); its decision is taken again once the
    /// generation changes ([`GrowthMaps::new_generation`]: the programs
    /// keep a copy of the last decision per CPU).
    pub fn growth_select(&mut self, pid: u32, on: bool) -> Result<(), ProbeError> {
        self.set_pid(maps::GROWTH_SELECT, pid, on)
    }
}

/// The exponential quantile table length the programs expect.
const _: () = assert!(EXP_TABLE_LEN == tracer_common::heap::EXP_TABLE_LEN);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_mode_is_off_in_the_kernel_and_hidden_from_help() {
        use clap::ValueEnum as _;
        // Parsable (the benchmark passes it), not offered.
        assert_eq!(GrowthMode::from_str("floor", false), Ok(GrowthMode::Floor));
        let floor = GrowthMode::Floor.to_possible_value().expect("a value");
        assert!(floor.is_hide_set());
        // Its programs follow nobody, as with growth off.
        assert_eq!(GrowthMode::Floor.wire(), mode::OFF);
        assert_eq!(GrowthMode::Off.wire(), mode::OFF);
        // `selected` is userspace's own, never parsed.
        assert!(GrowthMode::from_str("selected", false).is_err());
    }

    #[test]
    fn limits_are_found_in_this_kernels_memory_cgroups() {
        let Some(btf) = super::super::btf::tests::kernel_btf() else {
            return;
        };
        let opts = GrowthOptions {
            mode: GrowthMode::Limited,
            sample_bytes: 0,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
        };
        let (c, note) = config(&opts, &btf);
        assert_eq!(note, None);
        assert_eq!(c.mode, mode::LIMITED);
        // `memory` follows `css` in mem_cgroup; `max` and `parent` are
        // distinct members of page_counter.
        assert!(c.memcg_memory_off > 0, "{c:?}");
        assert_ne!(c.counter_max_off, c.counter_parent_off);
        assert_eq!(c.unlimited_pages, i64::MAX as u64 / 4096);
        // The sampling table is the heap's.
        assert_eq!(c.exp_table, super::super::heap::exp_table());
    }
}
