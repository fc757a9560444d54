//! The heap tracer: sampled allocations and frees from the ring, unwound
//! and named, summed per site; snapshots of a process's top sites and a
//! flame graph of its live bytes. `tracer attach --host` drives it for one
//! process; it serves any number.

use std::collections::HashMap;

use tracer_common::{
    growth::{GrowthSample, RESERVE},
    heap::{self, HeapAlloc, HeapFree},
};

use super::growth::{KEEP_S, Sites};
use crate::{
    correlate::heap::{HeapProfile, StackId},
    probes::heap::{HeapCounts, weight},
    record::{GrowthReport, HeapSite, HeapSnapshot, SITE_ALLOCATIONS, SiteAllocation, TipStack},
    stacks::{
        perfmap::PerfMaps,
        python::{self, Interpreters},
        symbols::{Frame, Symbols},
        unwind::{Sample, Unwinders},
    },
};

/// How a snapshot is cut.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Sites listed.
    pub top: usize,
    /// Growth is measured over this many seconds.
    pub growth_window_s: u64,
    /// Blocks live this long count as old (leak candidates).
    pub old_after_s: u64,
}

/// Which profile: sampled heap blocks, CUDA device allocations, or the
/// blocks a caching allocator handed out of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Of {
    /// The host heap.
    Heap,
    /// CUDA allocations (a caching allocator's segments).
    Cuda,
    /// A caching allocator's blocks (PyTorch's tensors).
    Blocks,
}

/// Sampled heaps of the traced processes.
pub struct HeapTracer {
    /// Mean bytes between samples (0 = every allocation).
    pub sample_bytes: u64,
    profile: HeapProfile,
    pub(super) unwinders: Unwinders,
    symbols: Symbols,
    /// Samples whose stack could not be unwound past the allocator's
    /// caller, per process.
    shallow: HashMap<u32, u64>,
    /// Stacks named when first seen (the process is alive then; it may
    /// not be when a snapshot is taken, at its OOM kill).
    named: HashMap<StackId, Vec<Frame>>,
    /// Growth samples (page faults).
    growth: Sites,
    /// Mean bytes faulted in between two growth samples.
    growth_sample_bytes: u64,
    /// Whether memory given back is traced (growth is then shown net).
    returns_traced: bool,
    /// Growth samples whose stack ended at its first frame, per process.
    growth_shallow: HashMap<u32, u64>,
    /// Large anonymous mappings (reservations).
    reserve: Sites,
    /// The processes' CPython interpreters, for their Python frames.
    python: Interpreters,
    /// Device memory that traced CUDA allocations hold, per stack (every
    /// allocation the programs sent a stack for; see
    /// `tracer_common::cuda::STACK_MIN_BYTES`), and the stacks' names.
    cuda: HeapProfile,
    cuda_named: HashMap<StackId, Vec<Frame>>,
    /// The same for the blocks caching allocators handed out.
    blocks: HeapProfile,
    blocks_named: HashMap<StackId, Vec<Frame>>,
    /// Mean bytes between the CUDA allocations under 1 MiB that send a
    /// stack (0: every one).
    cuda_sample_bytes: u64,
    /// JIT code's names from the processes' perf maps.
    perf: PerfMaps,
}

impl HeapTracer {
    /// A tracer for samples taken every `sample_bytes` on average.
    pub fn new(sample_bytes: u64) -> Self {
        Self {
            sample_bytes,
            profile: HeapProfile::default(),
            unwinders: Unwinders::default(),
            symbols: Symbols::default(),
            shallow: HashMap::new(),
            named: HashMap::new(),
            growth: Default::default(),
            growth_sample_bytes: crate::probes::growth::DEFAULT_SAMPLE_BYTES,
            returns_traced: false,
            growth_shallow: HashMap::new(),
            reserve: Default::default(),
            python: Interpreters::default(),
            cuda: HeapProfile::default(),
            cuda_named: HashMap::new(),
            blocks: HeapProfile::default(),
            blocks_named: HashMap::new(),
            cuda_sample_bytes: 0,
            perf: PerfMaps::default(),
        }
    }

    /// A CUDA allocation's stack (`addr`: the device pointer), kept (if
    /// sampled) once per `sample_bytes` allocated on average; its bytes
    /// count for its stack until it is freed.
    /// A caching allocator's block (`func` `cuda::CACHING_BLOCK`) goes
    /// to the blocks' profile.
    pub fn cuda_alloc(&mut self, a: &HeapAlloc, ts_ns: u64, sample_bytes: u64) {
        let pid = a.header.pid;
        let mut frames = self.unwind(a);
        self.python.append(pid, a, &mut frames);
        self.cuda_sample_bytes = sample_bytes;
        let w = weight(a.size, a.how, sample_bytes);
        let (profile, named) = if a.func == tracer_common::cuda::CACHING_BLOCK {
            (&mut self.blocks, &mut self.blocks_named)
        } else {
            (&mut self.cuda, &mut self.cuda_named)
        };
        let id = profile.alloc(pid, a.addr, frames, (a.size, w), ts_ns);
        if let std::collections::hash_map::Entry::Vacant(e) = named.entry(id) {
            let frames = profile.frames(id).to_vec();
            e.insert(name_with(
                &self.unwinders,
                &mut self.symbols,
                &self.python,
                &mut self.perf,
                pid,
                &frames,
                0,
            ));
        }
    }

    /// The processes whose CUDA allocations have stacks.
    pub fn cuda_pids(&self) -> Vec<u32> {
        self.cuda.pids()
    }

    /// Where `pid`'s perf map is, taken while it lived.
    pub fn set_perf_root(&mut self, pid: u32, root: crate::stacks::perfmap::Root) {
        self.perf.set_root(pid, root);
    }

    /// A traced free of `ptr`: a CUDA allocation's, or a caching
    /// allocator's block's.
    pub fn cuda_free(&mut self, of: Of, pid: u32, ptr: u64) {
        match of {
            Of::Blocks => self.blocks.free(pid, ptr),
            _ => self.cuda.free(pid, ptr),
        };
    }

    /// Names Python frames with these interpreters (shared with the
    /// threads that find them and read their code objects).
    pub fn set_interpreters(&mut self, interpreters: Interpreters) {
        self.python = interpreters;
    }

    /// A sampled allocation; `ts_ns` is its wall time.
    pub fn alloc(&mut self, a: &HeapAlloc, ts_ns: u64) {
        let pid = a.header.pid;
        let mut frames = self.unwind(a);
        if heap::name_in_syscalls(a.func) {
            // Taken at the system call: the first frames are the wrapper
            // (libc's mmap, or an allocator's hook of it, as tcmalloc's,
            // calling libc's syscall()).
            self.trim_allocator(pid, &mut frames);
        }
        if frames.len() < 2 {
            *self.shallow.entry(pid).or_default() += 1;
        }
        self.python.append(pid, a, &mut frames);
        let w = weight(a.size, a.how, self.sample_bytes);
        let id = self.profile.alloc(pid, a.addr, frames, (a.size, w), ts_ns);
        if !self.named.contains_key(&id) {
            let frames = self.profile.frames(id).to_vec();
            let names = self.name(pid, &frames);
            self.named.insert(id, names);
        }
    }

    /// The processes with heap samples.
    pub fn pids(&self) -> Vec<u32> {
        self.profile.pids()
    }

    /// A sampled block freed.
    pub fn free(&mut self, f: &HeapFree) {
        self.profile.free(f.header.pid, f.addr);
    }

    /// Records the live bytes per site (call once a second).
    pub fn tick(&mut self, now_ns: u64, view: &View) {
        let keep = view.growth_window_s.max(1) * 1_000_000_000;
        self.profile.tick(now_ns, keep);
    }

    /// Drops the leading frames inside the C library and allocators: the
    /// site is the first frame outside them (the code that asked for the
    /// memory). When nothing outside them was unwound, the last frame stays.
    pub(super) fn trim_allocator(&self, pid: u32, frames: &mut Vec<u64>) {
        if frames.is_empty() {
            return;
        }
        let inside = frames
            .iter()
            .take_while(|f| {
                self.unwinders
                    .file_at(pid, **f)
                    .is_some_and(crate::probes::heap::is_allocator_library_name)
            })
            .count();
        frames.drain(..inside.min(frames.len() - 1));
    }

    /// Names the frames of a heap sample: return addresses all (the first
    /// too: the sample is taken as the allocator returns), each named by
    /// the call before it.
    fn name(&mut self, pid: u32, frames: &[u64]) -> Vec<Frame> {
        self.name_from(pid, frames, 0)
    }

    /// Names frames unwound from instruction pointer `ip` (see [`name_with`]).
    pub(super) fn name_from(&mut self, pid: u32, frames: &[u64], ip: u64) -> Vec<Frame> {
        name_with(
            &self.unwinders,
            &mut self.symbols,
            &self.python,
            &mut self.perf,
            pid,
            frames,
            ip,
        )
    }

    /// Unwinds a sample of `pid`.
    pub(super) fn unwind(&mut self, a: &HeapAlloc) -> Vec<u64> {
        let stack = &a.stack[..(a.stack_len as usize).min(a.stack.len())];
        let fp = &a.fp[..(a.fp_len as usize).min(a.fp.len())];
        self.unwinders.unwind(
            a.header.pid,
            &Sample {
                ip: a.ip,
                sp: a.sp,
                bp: a.bp,
                stack,
                fp,
            },
        )
    }

    fn named_frames(&mut self, pid: u32, id: StackId, of: Of) -> Vec<Frame> {
        let (named, profile) = match of {
            Of::Heap => (&self.named, &self.profile),
            Of::Cuda => (&self.cuda_named, &self.cuda),
            Of::Blocks => (&self.blocks_named, &self.blocks),
        };
        if let Some(f) = named.get(&id) {
            return f.clone();
        }
        let frames = profile.frames(id).to_vec();
        self.name(pid, &frames)
    }

    /// The heap of `pid` now.
    pub fn snapshot(
        &mut self,
        pid: u32,
        comm: &str,
        now_ns: u64,
        view: &View,
        counts: Option<HeapCounts>,
    ) -> HeapSnapshot {
        self.snapshot_of(Of::Heap, pid, comm, now_ns, view, counts)
    }

    /// The device memory `pid`'s traced CUDA allocations hold now, by
    /// stack (exact for allocations of 1 MiB or more, estimated from
    /// samples below).
    /// With `Of::Blocks`, the caching allocator's blocks instead.
    pub fn cuda_snapshot(
        &mut self,
        of: Of,
        pid: u32,
        comm: &str,
        now_ns: u64,
        view: &View,
    ) -> HeapSnapshot {
        let mut snap = self.snapshot_of(of, pid, comm, now_ns, view, None);
        (snap.sample_bytes, snap.rss_bytes, snap.shallow_samples) =
            (self.cuda_sample_bytes, None, 0);
        snap
    }

    fn snapshot_of(
        &mut self,
        of: Of,
        pid: u32,
        comm: &str,
        now_ns: u64,
        view: &View,
        counts: Option<HeapCounts>,
    ) -> HeapSnapshot {
        let s = 1_000_000_000;
        let profile = match of {
            Of::Heap => &self.profile,
            Of::Cuda => &self.cuda,
            Of::Blocks => &self.blocks,
        };
        let live_bytes = profile.live_bytes(pid).round() as u64;
        let sites = profile.sites(pid, now_ns, view.growth_window_s * s, view.old_after_s * s);
        let more_sites = sites.len().saturating_sub(view.top);
        let listed: Vec<_> = sites.into_iter().take(view.top).collect();
        let sites = listed
            .iter()
            .map(|v| {
                let frames = self.named_frames(pid, v.stack, of);
                // Device memory: each block is one allocation.
                let allocations = match of {
                    Of::Heap => Vec::new(),
                    Of::Cuda | Of::Blocks => if of == Of::Cuda {
                        &self.cuda
                    } else {
                        &self.blocks
                    }
                    .blocks(pid, v.stack)
                    .into_iter()
                    .take(SITE_ALLOCATIONS)
                    .map(|(ptr, size, ts_ns)| SiteAllocation {
                        ptr: format!("{ptr:#x}"),
                        size,
                        ts_ns,
                    })
                    .collect(),
                };
                HeapSite {
                    frames,
                    live_bytes: v.totals.live_bytes.round() as u64,
                    live_samples: v.totals.live_samples,
                    growth_bytes: v.growth_bytes.round() as i64,
                    old_bytes: v.old_bytes.round() as u64,
                    allocated_bytes: v.totals.allocated_bytes.round() as u64,
                    allocations,
                }
            })
            .collect();
        let lost = counts.map(|c| c.map_full + c.ring_full).unwrap_or(0);
        HeapSnapshot {
            pid,
            comm: comm.to_string(),
            ts_ns: now_ns,
            sample_bytes: self.sample_bytes,
            live_bytes,
            rss_bytes: crate::model::proc::read_status_mem(pid).map(|m| m.rss_kb * 1024),
            growth_window_s: view.growth_window_s,
            old_after_s: view.old_after_s,
            sites,
            more_sites,
            lost_samples: lost,
            shallow_samples: self.shallow.get(&pid).copied().unwrap_or(0),
        }
    }

    /// Every site of `pid` with live bytes, most first.
    pub fn all_sites(&mut self, pid: u32, now_ns: u64, view: &View) -> Vec<HeapSite> {
        let all = View {
            top: usize::MAX,
            ..*view
        };
        let mut sites = self
            .snapshot_of(Of::Heap, pid, "", now_ns, &all, None)
            .sites;
        sites.retain(|s| s.live_bytes > 0);
        sites
    }

    /// A process exec'd: its maps and names are read again (what it grew
    /// before stays, named as it was).
    pub fn exec(&mut self, pid: u32) {
        self.unwinders.forget(pid);
        self.symbols.forget(pid);
        self.python.forget(pid);
        self.perf.forget(pid);
    }

    /// Forgets a process.
    pub fn forget(&mut self, pid: u32) {
        for id in self.profile.stacks_of(pid) {
            self.named.remove(&id);
        }
        self.profile.forget(pid);
        for id in self.cuda.stacks_of(pid) {
            self.cuda_named.remove(&id);
        }
        self.cuda.forget(pid);
        for id in self.blocks.stacks_of(pid) {
            self.blocks_named.remove(&id);
        }
        self.blocks.forget(pid);
        self.growth.forget(pid);
        self.growth_shallow.remove(&pid);
        self.reserve.forget(pid);
        self.unwinders.forget(pid);
        self.symbols.forget(pid);
        self.python.forget(pid);
        self.perf.forget(pid);
        self.shallow.remove(&pid);
    }
}

impl HeapTracer {
    /// Memory given back is traced: growth reports say what was kept.
    pub fn set_returns_traced(&mut self) {
        self.returns_traced = true;
    }

    /// Sets the mean bytes between growth samples the programs run with.
    pub fn set_growth_sample_bytes(&mut self, b: u64) {
        self.growth_sample_bytes = b;
    }

    /// A sampled fault, or a reservation (wall time `ts_ns`).
    pub fn fault(&mut self, s: &GrowthSample, ts_ns: u64) {
        let pid = s.header.pid;
        let mut frames = self.unwind(s);
        // Faults in the C library's string functions and the allocators,
        // and mmap's wrapper, belong to their caller.
        self.trim_allocator(pid, &mut frames);
        let (sites, weight) = if s.func == RESERVE {
            (&mut self.reserve, s.size as f64)
        } else {
            if frames.len() < 2 {
                *self.growth_shallow.entry(pid).or_default() += 1;
            }
            let w = weight(s.size, s.how, self.growth_sample_bytes);
            (&mut self.growth, w)
        };
        self.python.append(pid, s, &mut frames);
        let addr = if s.func == RESERVE { 0 } else { s.addr };
        if let Some((id, frames)) = sites.add(pid, frames, weight, ts_ns, addr) {
            let names = name_with(
                &self.unwinders,
                &mut self.symbols,
                &self.python,
                &mut self.perf,
                pid,
                &frames,
                s.ip,
            );
            sites.name(id, names);
        }
    }

    /// `pid` gave `[start, start + len)` back (munmap, madvise).
    pub fn gave_back(&mut self, pid: u32, start: u64, len: u64, ts_ns: u64) {
        self.growth.returned(pid, start, len, ts_ns);
    }

    /// The stack of a task that tipped an OOM kill.
    pub fn tip(&mut self, s: &GrowthSample) -> TipStack {
        let pid = s.header.pid;
        let mut frames = self.unwind(s);
        self.trim_allocator(pid, &mut frames);
        self.python.append(pid, s, &mut frames);
        TipStack {
            pid,
            tid: s.header.tid,
            comm: crate::collect::decode::c_str(&s.header.comm),
            frames: self.name_from(pid, &frames, s.ip),
            victim_is_trigger: pid == s.addr as u32,
        }
    }

    /// Where `pid` grew in the `window_s` seconds up to `until_ns`: the
    /// `top` sites by bytes.
    pub fn growth_report(
        &mut self,
        pid: u32,
        comm: &str,
        until_ns: u64,
        window_s: u64,
        top: usize,
    ) -> GrowthReport {
        let window_ns = window_s * 1_000_000_000;
        let (listed, bytes, samples, more_sites, returned) =
            self.growth.window(pid, until_ns, window_ns, top);
        let (reserved, reserved_bytes, _, _, _) =
            self.reserve.window(pid, until_ns, window_ns, top.min(3));
        GrowthReport {
            pid,
            comm: comm.to_string(),
            until_ns,
            window_s,
            sample_bytes: self.growth_sample_bytes,
            bytes,
            returned_bytes: self.returns_traced.then_some(returned),
            samples,
            total_bytes: self.growth.total(pid).0.round() as u64,
            sites: listed,
            more_sites,
            shallow_samples: self.growth_shallow.get(&pid).copied().unwrap_or(0),
            lost_samples: 0,
            reserved_bytes,
            reserved,
        }
    }

    /// Whether `pid` has growth samples or reservations.
    pub fn has_growth(&self, pid: u32) -> bool {
        self.growth.total(pid).1 > 0 || self.reserve.total(pid).1 > 0
    }

    /// Drops growth samples too old for any window.
    pub fn prune_growth(&mut self, now_ns: u64) {
        self.growth.prune(now_ns, KEEP_S * 1_000_000_000);
        self.reserve.prune(now_ns, KEEP_S * 1_000_000_000);
    }
}

/// Names frames of `pid` unwound from instruction pointer `ip`: the first,
/// when it is `ip` itself (the faulting instruction, a system call's return
/// point), as it is; return addresses by the call before them (so also a
/// first frame left after the allocator's frames were trimmed). Addresses
/// are named from the files the unwinders hold open where they can be,
/// JIT code from the process's perf map. A sample's Python frames take the
/// place of the interpreter's loop.
fn name_with(
    unwinders: &Unwinders,
    symbols: &mut Symbols,
    interpreters: &Interpreters,
    perf: &mut PerfMaps,
    pid: u32,
    frames: &[u64],
    ip: u64,
) -> Vec<Frame> {
    let (native, py) = python::split(frames);
    let lookup: Vec<u64> = native
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            if i == 0 && a == ip && ip != 0 {
                a
            } else {
                a.saturating_sub(1)
            }
        })
        .collect();
    let mut named = symbols.resolve(pid, &lookup, |a| unwinders.locate(pid, a));
    // Code in no file (a JIT's): named from the process's perf map, where
    // it writes one.
    for (f, &a) in named.iter_mut().zip(&lookup) {
        if f.function.is_none()
            && f.module.is_none()
            && unwinders.locate(pid, a).is_none()
            && let Some((function, map)) = perf.lookup(pid, a)
        {
            f.function = Some(function);
            f.module = Some(map.rsplit('/').next().unwrap_or(&map).to_string());
        }
    }
    match py {
        Some((status, words)) => interpreters.interleave(pid, named, status, words),
        None => named,
    }
}
