//! Loading the eBPF object, configuring it for this kernel, attaching the
//! probes, and reading the maps the collector polls (drop counters, memcg
//! counters). Feature detection lives here too: a missing optional hook
//! becomes one clear line, and the rest keeps working.

pub mod arming;
pub mod btf;
pub mod caps;
pub mod cuda;
pub mod growth;
pub mod heap;
pub mod layout;
pub mod placement;
pub mod python;
pub mod refctr;
pub mod tracefs;
pub mod uprobe;
pub mod usdt;
pub mod verifier;
pub mod watch;

use std::{collections::HashMap, path::PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{
        ProgramError, RawTracePoint, TracePoint, raw_trace_point::RawTracePointLinkId,
        trace_point::TracePointLinkId,
    },
};
use tracer_common::{MemcgCountKey, ProbeConfig, maps, programs, ring};

pub use layout::LayoutNotes;

/// Data ring size when only the low-rate kernel events use it.
pub const DATA_RING_BYTES: u32 = tracer_common::ring::DATA_BYTES;
/// Data ring size when CUDA calls are traced (hundreds of thousands a second).
pub const CUDA_DATA_RING_BYTES: u32 = 8 * 1024 * 1024;
/// Data ring size when growth attribution is on (one 8.5 KiB sample per
/// MiB a followed process faults in: about 960 samples, a second of a
/// process faulting in 1 GiB/s while the reader is asleep).
pub const GROWTH_DATA_RING_BYTES: u32 = 8 * 1024 * 1024;
/// Data ring size when heaps are traced: a sample carries 8 KiB of stack,
/// and a burst of allocations must wait out the first naming of a
/// program's symbols (about 3,800 samples).
pub const HEAP_DATA_RING_BYTES: u32 = 32 * 1024 * 1024;

/// The eBPF object built by build.rs from tracer-ebpf.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// Errors loading or attaching the probes.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Not enough privilege to load BPF programs.
    #[error(transparent)]
    Privilege(#[from] caps::PrivilegeError),
    /// tracefs could not be found or mounted.
    #[error(transparent)]
    Tracefs(#[from] tracefs::TracefsError),
    /// Kernel BTF is missing or unreadable.
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
    /// The object could not be loaded (the kernel refused a map or program).
    #[error("loading the eBPF object")]
    Load {
        /// aya's error.
        #[source]
        source: aya::EbpfError,
    },
    /// A program was refused by the verifier or could not be attached.
    #[error("probe {program} ({hook}): {why}")]
    Program {
        /// Program name.
        program: &'static str,
        /// The hook, as `tracepoint/oom/mark_victim`.
        hook: String,
        /// Why, in one line (the verifier's log goes to the debug log).
        why: String,
    },
    /// A program or map is not in the object (a build mismatch).
    #[error("the eBPF object has no {what} called {name}; rebuild tracer")]
    Missing {
        /// "program" or "map".
        what: &'static str,
        /// Its name.
        name: &'static str,
    },
    /// A map could not be opened with the expected type.
    #[error("map {name}")]
    Map {
        /// Map name.
        name: &'static str,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
    /// A probe recording cannot work without is unavailable on this kernel.
    #[error("{hook} is unavailable ({why}); tracer cannot record {purpose} without it")]
    RequiredHook {
        /// The hook.
        hook: String,
        /// Why.
        why: String,
        /// What it records.
        purpose: &'static str,
    },
    /// Every required probe is present but the layout is unusable.
    #[error("tracepoint oom:mark_victim has no usable pid field on this kernel")]
    NoVictimPid,
}

/// Where a program attaches.
#[derive(Clone, Copy, Debug)]
pub enum Hook {
    /// A tracefs tracepoint.
    TracePoint {
        /// Category (`oom`).
        category: &'static str,
        /// Name (`mark_victim`).
        name: &'static str,
    },
    /// A raw tracepoint (no tracefs needed; raw arguments).
    RawTracePoint {
        /// Name (`sched_process_fork`).
        name: &'static str,
    },
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hook::TracePoint { category, name } => write!(f, "tracepoint/{category}/{name}"),
            Hook::RawTracePoint { name } => write!(f, "raw_tracepoint/{name}"),
        }
    }
}

/// One probe: its program, its hook, whether recording can work without it.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSpec {
    /// Program name in the object.
    pub program: &'static str,
    /// Where it attaches.
    pub hook: Hook,
    /// Recording fails without it.
    pub required: bool,
    /// What is lost without it, for users.
    pub purpose: &'static str,
}

/// Every probe tracer attaches.
pub const PROBES: &[ProbeSpec] = &[
    ProbeSpec {
        program: programs::OOM_MARK_VICTIM,
        hook: Hook::TracePoint {
            category: "oom",
            name: "mark_victim",
        },
        required: true,
        purpose: "kernel OOM kills",
    },
    ProbeSpec {
        program: programs::OOM_START_TASK_REAPING,
        hook: Hook::TracePoint {
            category: "oom",
            name: "start_task_reaping",
        },
        required: false,
        purpose: "OOM reaper timing",
    },
    ProbeSpec {
        program: programs::OOM_FINISH_TASK_REAPING,
        hook: Hook::TracePoint {
            category: "oom",
            name: "finish_task_reaping",
        },
        required: false,
        purpose: "OOM reaper timing",
    },
    ProbeSpec {
        program: programs::MEMCG_RECLAIM,
        hook: Hook::RawTracePoint {
            name: "mm_vmscan_lru_shrink_inactive",
        },
        required: false,
        purpose: "per-cgroup reclaim pressure before a kill",
    },
    ProbeSpec {
        program: programs::SCHED_PROCESS_EXEC,
        hook: Hook::TracePoint {
            category: "sched",
            name: "sched_process_exec",
        },
        required: false,
        purpose: "process names and command lines of new programs",
    },
    ProbeSpec {
        program: programs::SCHED_PROCESS_FORK,
        hook: Hook::RawTracePoint {
            name: "sched_process_fork",
        },
        required: false,
        purpose: "processes forked after start",
    },
    ProbeSpec {
        program: programs::SCHED_PROCESS_EXIT,
        hook: Hook::TracePoint {
            category: "sched",
            name: "sched_process_exit",
        },
        required: false,
        purpose: "process exits",
    },
    ProbeSpec {
        program: programs::SIGNAL_GENERATE,
        hook: Hook::RawTracePoint {
            name: "signal_generate",
        },
        required: false,
        purpose: "SIGKILLs from userspace killers",
    },
    ProbeSpec {
        program: programs::CGROUP_MKDIR,
        hook: Hook::TracePoint {
            category: "cgroup",
            name: "cgroup_mkdir",
        },
        required: false,
        purpose: "cgroups made after start: a new container's first programs placed in it at once",
    },
    ProbeSpec {
        program: programs::CGROUP_RMDIR,
        hook: Hook::TracePoint {
            category: "cgroup",
            name: "cgroup_rmdir",
        },
        required: false,
        purpose: "cgroups removed: the map of cgroup ids stays bounded",
    },
];

/// What happened to one probe.
#[derive(Clone, Debug)]
pub struct ProbeStatus {
    /// The probe.
    pub spec: ProbeSpec,
    /// `None` when attached; why not otherwise.
    pub error: Option<String>,
}

/// The loaded object, configured for this kernel.
pub struct Probes {
    ebpf: Ebpf,
    /// What the layout step found missing.
    pub notes: LayoutNotes,
    /// The tracefs root in use.
    pub tracefs: PathBuf,
    /// The configuration the programs run with.
    pub config: ProbeConfig,
    /// Why growth attribution cannot see memory cgroup limits, if it cannot.
    pub growth_note: Option<String>,
    /// `USDT_SPECS` slots handed out.
    usdt_slots: u32,
    /// The tracepoint links made by [`Probes::attach`], removed together
    /// when the probes are dropped.
    tracepoint_links: Vec<(&'static str, TracePointLinkId)>,
    raw_links: Vec<(&'static str, RawTracePointLinkId)>,
    /// The page-fault programs loaded for `--growth risk`, until taken.
    fault_hooks: Option<arming::FaultHooks>,
}

impl Drop for Probes {
    /// Removes the tracepoint links together ([`drop_together`]); the rest
    /// goes with the programs.
    fn drop(&mut self) {
        let mut links: Vec<Box<dyn Send>> = Vec::new();
        for (name, id) in std::mem::take(&mut self.tracepoint_links) {
            if let Ok(p) = self.program::<TracePoint>(name)
                && let Ok(l) = p.take_link(id)
            {
                links.push(Box::new(l));
            }
        }
        for (name, id) in std::mem::take(&mut self.raw_links) {
            if let Ok(p) = self.program::<RawTracePoint>(name)
                && let Ok(l) = p.take_link(id)
            {
                links.push(Box::new(l));
            }
        }
        drop_together(links);
    }
}

/// Most threads [`drop_together`] starts.
const DETACH_THREADS: usize = 64;

/// Drops `links` on threads of their own, all at once. Removing a
/// tracepoint or uprobe perf link waits for kernel grace periods under the
/// kernel's global event_mutex, so removals cannot fully overlap; measured
/// here, removing them together takes half the time for tracepoints (13 in
/// 0.26 s instead of 0.56 s) and 18 % less for uprobes (32 in 2.8 s instead
/// of 3.4 s). Only uprobe_multi links (one grace period for all) would do
/// better.
pub(crate) fn drop_together<L: Send>(links: Vec<L>) {
    if links.len() <= 1 {
        return;
    }
    let per = links.len().div_ceil(DETACH_THREADS);
    let mut links = links.into_iter();
    std::thread::scope(|s| {
        loop {
            let chunk: Vec<L> = links.by_ref().take(per).collect();
            if chunk.is_empty() {
                break;
            }
            // A thread that cannot start drops its chunk here instead.
            let _ = std::thread::Builder::new()
                .name("tracer-detach".into())
                .spawn_scoped(s, move || drop(chunk));
        }
    });
}

impl Probes {
    /// Checks privilege, finds tracefs and BTF, builds the configuration and
    /// loads maps and programs into the kernel (nothing attached yet).
    pub fn load(data_ring_bytes: u32) -> Result<Self, ProbeError> {
        let heap = heap::config(heap::DEFAULT_SAMPLE_BYTES, heap::DEFAULT_ALWAYS_BYTES);
        Self::load_with_heap(data_ring_bytes, &heap)
    }

    /// As [`Probes::load`], with the heap programs' sampling configuration.
    pub fn load_with_heap(
        data_ring_bytes: u32,
        heap: &tracer_common::heap::HeapConfig,
    ) -> Result<Self, ProbeError> {
        Self::load_with(data_ring_bytes, heap, &growth::GrowthOptions::OFF)
    }

    /// As [`Probes::load_with_heap`], with the growth programs' options.
    pub fn load_with(
        data_ring_bytes: u32,
        heap: &tracer_common::heap::HeapConfig,
        growth: &growth::GrowthOptions,
    ) -> Result<Self, ProbeError> {
        caps::require_bpf()?;
        let tracefs = tracefs::find_or_mount()?;
        let kbtf = btf::KernelBtf::open(std::path::Path::new(btf::VMLINUX_BTF))?;
        let (config, notes) = layout::build(&tracefs, &kbtf)?;
        let (growth_config, growth_note) = growth::config(growth, &kbtf);
        drop(kbtf);
        if config.fields[tracer_common::field::MV_PID] == tracer_common::FIELD_ABSENT
            && !notes
                .missing_tracepoints
                .iter()
                .any(|(tp, _)| tp == "oom:mark_victim")
        {
            return Err(ProbeError::NoVictimPid);
        }
        let ebpf = EbpfLoader::new()
            // Our programs use no CO-RE relocations: skip parsing kernel BTF again.
            .btf(None)
            .override_global(maps::CONFIG, &config, true)
            .override_global(maps::HEAP_CONFIG, heap, true)
            .override_global(maps::GROWTH_CONFIG, &growth_config, true)
            .map_max_entries(maps::DATA_RING, data_ring_bytes)
            .load(EBPF_OBJECT)
            .map_err(|source| ProbeError::Load { source })?;
        // Parsing kernel BTF and the object left large freed heap blocks.
        crate::util::sys::give_back_free_heap();
        Ok(Self {
            ebpf,
            notes,
            tracefs,
            config,
            growth_note,
            usdt_slots: 0,
            tracepoint_links: Vec::new(),
            raw_links: Vec::new(),
            fault_hooks: None,
        })
    }

    /// Takes a ring buffer out of the object, for a reader task.
    pub fn take_ring(&mut self, name: &'static str) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(ProbeError::Missing { what: "map", name })?;
        RingBuf::try_from(map).map_err(|source| ProbeError::Map { name, source })
    }

    /// Takes the per-ring drop counters out of the object.
    pub fn take_drop_counters(&mut self) -> Result<DropCounters, ProbeError> {
        let name = maps::RING_DROPS;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(ProbeError::Missing { what: "map", name })?;
        let map = PerCpuArray::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        Ok(DropCounters { map })
    }

    /// Takes the per-memcg event counters out of the object.
    pub fn take_memcg_counters(&mut self) -> Result<MemcgCounters, ProbeError> {
        let name = maps::MEMCG_COUNTS;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(ProbeError::Missing { what: "map", name })?;
        let map =
            PerCpuHashMap::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        Ok(MemcgCounters { map })
    }

    /// Starts forwarding eBPF-side log records (aya-log) into `tracing`.
    /// The returned logger must be kept alive and polled.
    pub fn logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        match aya_log::EbpfLogger::init(&mut self.ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!("eBPF log forwarding unavailable: {e}");
                None
            }
        }
    }

    /// Loads and attaches every probe. A required probe that fails is an
    /// error; an optional one is reported in the returned list.
    pub fn attach(&mut self) -> Result<Vec<ProbeStatus>, ProbeError> {
        self.attach_specs(PROBES)
    }

    /// Loads and attaches `specs`, as [`Probes::attach`] does.
    fn attach_specs(&mut self, specs: &[ProbeSpec]) -> Result<Vec<ProbeStatus>, ProbeError> {
        let missing: HashMap<String, String> =
            self.notes.missing_tracepoints.iter().cloned().collect();
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            let result = match spec.hook {
                Hook::TracePoint { category, name } => {
                    match missing.get(&format!("{category}:{name}")) {
                        Some(why) => Err(Unavailable::Hook(why.clone())),
                        None => self.attach_tracepoint(spec.program, category, name),
                    }
                }
                Hook::RawTracePoint { name } => self.attach_raw(spec.program, name),
            };
            match result {
                Ok(()) => out.push(ProbeStatus {
                    spec: *spec,
                    error: None,
                }),
                Err(Unavailable::Program(source)) if spec.required => {
                    return Err(ProbeError::Program {
                        program: spec.program,
                        hook: spec.hook.to_string(),
                        why: verifier::brief(spec.program, &source),
                    });
                }
                Err(Unavailable::Hook(why)) if spec.required => {
                    return Err(ProbeError::RequiredHook {
                        hook: spec.hook.to_string(),
                        why,
                        purpose: spec.purpose,
                    });
                }
                Err(Unavailable::Missing(name)) => {
                    return Err(ProbeError::Missing {
                        what: "program",
                        name,
                    });
                }
                Err(e) => {
                    let why = match &e {
                        Unavailable::Program(p) => verifier::brief(spec.program, p),
                        e => e.to_string(),
                    };
                    tracing::warn!(
                        "probe {} unavailable ({why}): no {} will be recorded",
                        spec.hook,
                        spec.purpose
                    );
                    out.push(ProbeStatus {
                        spec: *spec,
                        error: Some(why),
                    });
                }
            }
        }
        Ok(out)
    }

    fn attach_tracepoint(
        &mut self,
        program: &'static str,
        category: &str,
        name: &str,
    ) -> Result<(), Unavailable> {
        let prog: &mut TracePoint = self.program(program)?;
        prog.load().map_err(Unavailable::Program)?;
        let id = prog.attach(category, name).map_err(Unavailable::Program)?;
        self.tracepoint_links.push((program, id));
        Ok(())
    }

    fn attach_raw(&mut self, program: &'static str, name: &str) -> Result<(), Unavailable> {
        if program == programs::SCHED_PROCESS_FORK && self.config.task_tgid_off == 0 {
            return Err(Unavailable::Hook(
                "task_struct.tgid not found in BTF".into(),
            ));
        }
        if program == programs::SIGNAL_GENERATE && self.config.task_comm_off == 0 {
            return Err(Unavailable::Hook(
                "task_struct's comm or start time not found in BTF".into(),
            ));
        }
        let prog: &mut RawTracePoint = self.program(program)?;
        prog.load().map_err(Unavailable::Program)?;
        let id = prog.attach(name).map_err(Unavailable::Program)?;
        self.raw_links.push((program, id));
        Ok(())
    }

    /// Loads raw tracepoint program `program` without attaching it; a
    /// handle on it that attaches it anywhere ([`arming::FaultHooks`]).
    fn load_raw(&mut self, program: &'static str) -> Result<aya::programs::ProgramFd, Unavailable> {
        let prog: &mut RawTracePoint = self.program(program)?;
        prog.load().map_err(Unavailable::Program)?;
        prog.fd()
            .map_err(Unavailable::Program)?
            .try_clone()
            .map_err(|e| Unavailable::Hook(format!("cannot keep a handle on {program}: {e}")))
    }

    /// The page-fault programs [`Probes::attach_growth`] loaded without
    /// attaching them (`--growth risk`).
    pub fn take_fault_hooks(&mut self) -> Option<arming::FaultHooks> {
        self.fault_hooks.take()
    }

    /// The hash map called `name`, keyed by tgid, for userspace to update.
    fn pid_map<V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<aya::maps::HashMap<&mut MapData, u32, V>, ProbeError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(ProbeError::Missing { what: "map", name })?;
        aya::maps::HashMap::try_from(map).map_err(|source| ProbeError::Map { name, source })
    }

    /// Enters (`on`) or removes a process in the tgid -> 1 map `name`.
    fn set_pid(&mut self, name: &'static str, pid: u32, on: bool) -> Result<(), ProbeError> {
        let mut map = self.pid_map::<u32>(name)?;
        let r = if on {
            map.insert(pid, 1, 0)
        } else {
            map.remove(&pid)
        };
        absent_is_ok(r).map_err(|source| ProbeError::Map { name, source })
    }

    /// The program called `name`, as its concrete type.
    fn program<'a, T>(&'a mut self, name: &'static str) -> Result<&'a mut T, Unavailable>
    where
        &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
    {
        self.ebpf
            .program_mut(name)
            .ok_or(Unavailable::Missing(name))?
            .try_into()
            .map_err(Unavailable::Program)
    }
}

impl Unavailable {
    pub(crate) fn into_probe_error(self, name: &'static str) -> ProbeError {
        match self {
            Unavailable::Program(source) => ProbeError::Program {
                program: name,
                hook: "uprobe".into(),
                why: verifier::brief(name, &source),
            },
            _ => ProbeError::Missing {
                what: "program",
                name,
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Unavailable {
    #[error("{0}")]
    Hook(String),
    #[error("{0}")]
    Program(#[source] ProgramError),
    #[error("no program {0} in the object")]
    Missing(&'static str),
}

/// A map update or delete; deleting a key that is not there is no error.
pub(crate) fn absent_is_ok(r: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match r {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Per-ring counts of events the kernel side could not queue.
pub struct DropCounters {
    map: PerCpuArray<MapData, u64>,
}

/// Drop totals since load, per ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Drops {
    /// Events lost on the critical ring.
    pub critical: u64,
    /// Events lost on the data ring.
    pub data: u64,
    /// Events lost on the OOM ring.
    pub oom: u64,
    /// SIGKILL events among the critical ring's losses.
    pub sigkill: u64,
}

impl DropCounters {
    /// Sums the per-CPU counters.
    pub fn read(&self) -> Result<Drops, aya::maps::MapError> {
        let sum =
            |i: u32| -> Result<u64, aya::maps::MapError> { Ok(self.map.get(&i, 0)?.iter().sum()) };
        Ok(Drops {
            critical: sum(ring::CRITICAL)?,
            data: sum(ring::DATA)?,
            oom: sum(ring::OOM)?,
            sigkill: sum(ring::SIGKILLS)?,
        })
    }
}

/// Per memcg counters of reclaim and fault items.
pub struct MemcgCounters {
    map: PerCpuHashMap<MapData, MemcgCountKey, u64>,
}

impl MemcgCounters {
    /// Totals per (memcg id, item slot).
    pub fn read(&self) -> HashMap<(u64, i32), u64> {
        let mut out = HashMap::new();
        for entry in self.map.iter().flatten() {
            let (key, values) = entry;
            out.insert((key.memcg_id, key.item), values.iter().sum());
        }
        out
    }
}
