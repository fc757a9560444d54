//! Helpers shared by the probes: the event header, config reads, tracepoint
//! field reads by runtime offset, and ring output with drop accounting.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes,
        generated::{bpf_get_smp_processor_id, bpf_ktime_get_boot_ns},
    },
    maps::{RingBuf, ring_buf::RingBufEntry},
    programs::TracePointContext,
};
use tracer_common::{COMM_LEN, EventHeader, FIELD_ABSENT, ProbeConfig, ring};

use crate::maps::{CONFIG, CRITICAL, DATA, OOM, RING_DROPS, RING_PACE};

/// The configuration written by userspace.
#[inline(always)]
pub fn config() -> &'static ProbeConfig {
    // SAFETY: CONFIG is a plain static; the volatile read of its address
    // keeps the compiler from folding the compile-time default into the code,
    // so the value userspace wrote into .rodata is the one read.
    unsafe { &*core::ptr::read_volatile(&&raw const CONFIG) }
}

/// Offset of tracepoint field `idx` (a `tracer_common::field` index).
#[inline(always)]
pub fn field_offset(idx: usize) -> Option<usize> {
    let off = config().fields[idx];
    (off != FIELD_ABSENT).then_some(off as usize)
}

/// Reads tracepoint field `idx` as a `T`; `None` when this kernel lacks it.
#[inline(always)]
pub fn read_field<T>(ctx: &TracePointContext, idx: usize) -> Option<T> {
    let off = field_offset(idx)?;
    // SAFETY: the offset comes from this kernel's tracefs format file for the
    // tracepoint this program is attached to, and the read goes through
    // bpf_probe_read_kernel, which faults safely.
    unsafe { ctx.read_at::<T>(off) }.ok()
}

/// Copies the `__data_loc char[]` field `idx` into `dst` (NUL-terminated).
/// Returns the string's length in the record, its NUL included (more than
/// `dst` holds: cut), or `None` when the field is absent or unreadable.
#[inline(always)]
pub fn read_data_loc_str(ctx: &TracePointContext, idx: usize, dst: &mut [u8]) -> Option<u32> {
    let loc = read_field::<u32>(ctx, idx)?;
    // A __data_loc word is (length << 16) | offset from the record start.
    let off = (loc & 0xffff) as usize;
    // SAFETY: the offset points into this tracepoint record, which the
    // kernel laid out; the helper stops at the first NUL or at dst's end.
    unsafe { bpf_probe_read_kernel_str_bytes(ctx.as_ptr().cast::<u8>().add(off), dst) }
        .ok()
        .map(|_| loc >> 16)
}

/// The header for an event of `kind`, describing `current`.
#[inline(always)]
pub fn header(kind: u32) -> EventHeader {
    // SAFETY: helper without arguments, valid in every program type we use.
    let ts = unsafe { bpf_ktime_get_boot_ns() };
    header_with(
        kind,
        bpf_get_current_pid_tgid(),
        ts,
        bpf_get_current_comm().unwrap_or_default(),
    )
}

/// [`header`] from what the program read already: the clock (about 55 ns
/// a read on this project's test VM) and the thread's name (about 80 ns)
/// are the dearest parts of a header.
#[inline(always)]
pub fn header_with(kind: u32, pid_tgid: u64, ts_boot_ns: u64, comm: [u8; COMM_LEN]) -> EventHeader {
    EventHeader {
        kind,
        // SAFETY: helper without arguments, valid in every program type we use.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_boot_ns,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        comm,
    }
}

/// The current task's `mm_struct` (`task_struct.mm`, offset from BTF);
/// `None` for a kernel thread, a task past `exit_mm()`, or an unknown
/// offset.
#[inline(always)]
pub fn current_mm() -> Option<*const u8> {
    let off = config().task_mm_off;
    if off == 0 {
        return None;
    }
    // SAFETY: bpf_get_current_task has no preconditions; the pointer is only
    // read through bpf_probe_read_kernel, which faults safely.
    let task = unsafe { aya_ebpf::helpers::bpf_get_current_task() } as *const u8;
    // SAFETY: as above.
    let mm = unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel(task.add(off as usize).cast::<*const u8>())
    }
    .ok()?;
    (!mm.is_null()).then_some(mm)
}

/// The current task.
#[inline(always)]
pub fn current_task() -> *const u8 {
    // SAFETY: bpf_get_current_task has no preconditions; the pointer is
    // only ever read through bpf_probe_read_kernel.
    unsafe { aya_ebpf::helpers::bpf_get_current_task() as *const u8 }
}

/// The start of the process `task` belongs to: its group leader's
/// `start_boottime` (boot-clock ns; offsets from BTF); 0 when unknown.
#[inline(always)]
pub fn task_start_ns(task: *const u8) -> u64 {
    let cfg = config();
    if cfg.task_leader_off == 0 || cfg.task_start_off == 0 {
        return 0;
    }
    // SAFETY: kernel pointers read through bpf_probe_read_kernel, which
    // faults safely, at offsets from this kernel's BTF.
    let leader = unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel(
            task.add(cfg.task_leader_off as usize).cast::<*const u8>(),
        )
    };
    let Ok(leader) = leader else { return 0 };
    if leader.is_null() {
        return 0;
    }
    // SAFETY: as above.
    unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel(
            leader.add(cfg.task_start_off as usize).cast::<u64>(),
        )
    }
    .unwrap_or(0)
}

/// The id of the current task's memory cgroup (see [`task_memcg_id`]).
#[inline(always)]
pub fn current_memcg_id() -> u64 {
    task_memcg_id(current_task())
}

/// The id of `task`'s memory cgroup (its kernfs node id, the inode of its
/// directory), following the pointer chain whose offsets userspace read
/// from BTF; 0 when any link is unknown or unreadable.
#[inline(always)]
pub fn task_memcg_id(task: *const u8) -> u64 {
    let chain = config().memcg_chain;
    if chain[0] == 0 || chain[3] == 0 {
        return 0;
    }
    // Every pointer is only read through bpf_probe_read_kernel, which
    // faults safely, at offsets from this kernel's BTF.
    let mut p = task;
    for off in [chain[0], chain[1], chain[2], chain[3]] {
        // SAFETY: as above.
        match unsafe {
            aya_ebpf::helpers::bpf_probe_read_kernel(p.add(off as usize).cast::<*const u8>())
        } {
            Ok(next) if !next.is_null() => p = next,
            _ => return 0,
        }
    }
    // SAFETY: as above.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(p.add(chain[4] as usize).cast::<u64>()) }
        .unwrap_or(0)
}

/// Which ring an event goes to.
#[derive(Clone, Copy)]
pub enum Ring {
    /// Kills and exits: never shared with high-rate events; wakes the reader at once.
    Critical,
    /// High-rate events.
    Data,
    /// Kernel OOM kills only; wakes the reader at once.
    Oom,
}

impl Ring {
    fn map(self) -> &'static RingBuf {
        match self {
            Ring::Critical => &CRITICAL,
            Ring::Data => &DATA,
            Ring::Oom => &OOM,
        }
    }

    fn index(self) -> u32 {
        match self {
            Ring::Critical => ring::CRITICAL,
            Ring::Data => ring::DATA,
            Ring::Oom => ring::OOM,
        }
    }

    fn submit_flags(self, bytes: u64) -> u64 {
        match self {
            Ring::Critical | Ring::Oom => BPF_RB_FORCE_WAKEUP as u64,
            Ring::Data => self.lazy_flags(bytes),
        }
    }

    /// No wakeup per event: userspace polls, and is woken only when a
    /// burst has piled up. Whether one has is looked at once this CPU has
    /// submitted [`ring::LOOK_BYTES`] since its last look (`bytes` now).
    #[inline(always)]
    fn lazy_flags(self, bytes: u64) -> u64 {
        if let Some(pace) = RING_PACE.get_ptr_mut(self.index()) {
            // SAFETY: this CPU's slot; a program does not migrate while it
            // runs, and one interleaving on this CPU only shifts a look.
            unsafe {
                *pace += bytes;
                if *pace < ring::LOOK_BYTES {
                    return BPF_RB_NO_WAKEUP as u64;
                }
                *pace = 0;
            }
        }
        if self.map().query(BPF_RB_AVAIL_DATA as u64) >= ring::DATA_WAKEUP_BYTES {
            BPF_RB_FORCE_WAKEUP as u64
        } else {
            BPF_RB_NO_WAKEUP as u64
        }
    }

    /// Copies `value` into the ring: one helper call where a reservation
    /// and a submit are two, for small events built on the stack. Counts
    /// a drop when the ring is full.
    #[inline(always)]
    pub fn output<T>(self, value: &T) {
        let flags = self.submit_flags(size_of::<T>() as u64);
        if self.map().output::<T>(value, flags).is_err() {
            count_drop(self.index());
        }
    }

    /// Reserves room for a `T`; counts a drop when the ring is full.
    #[inline(always)]
    pub fn reserve<T: 'static>(self) -> Option<Reserved<T>> {
        match self.map().reserve::<T>(0) {
            Some(entry) => Some(Reserved { entry, ring: self }),
            None => {
                count_drop(self.index());
                None
            }
        }
    }
}

/// A reserved ring slot; `submit` hands it to userspace.
pub struct Reserved<T: 'static> {
    entry: RingBufEntry<T>,
    ring: Ring,
}

impl<T> Reserved<T> {
    /// Raw pointer to the slot, for filling large events in place.
    #[inline(always)]
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.entry.as_mut_ptr()
    }

    /// Writes `value` into the slot and submits it.
    #[inline(always)]
    pub fn submit_value(mut self, value: T) {
        self.entry.write(value);
        self.submit();
    }

    /// Gives the slot back unsent.
    #[inline(always)]
    pub fn discard(self) {
        self.entry.discard(BPF_RB_NO_WAKEUP as u64);
    }

    /// Submits a slot filled through `as_mut_ptr`.
    #[inline(always)]
    pub fn submit(self) {
        let flags = self.ring.submit_flags(size_of::<T>() as u64);
        self.entry.submit(flags);
    }

    /// Submits a slot filled through `as_mut_ptr` and wakes the reader,
    /// whatever the ring: for a rare event that is wanted at once.
    #[inline(always)]
    pub fn submit_now(self) {
        self.entry.submit(BPF_RB_FORCE_WAKEUP as u64);
    }

    /// Writes `value` and submits it without waking the reader, whatever
    /// the ring: for frequent events that must not be lost but need not be
    /// read at once (a process's end). The reader polls this ring, and is
    /// woken by the next urgent event or once a burst has piled up.
    #[inline(always)]
    pub fn submit_value_lazily(mut self, value: T) {
        self.entry.write(value);
        let flags = self.ring.lazy_flags(size_of::<T>() as u64);
        self.entry.submit(flags);
    }
}

#[inline(always)]
pub fn count_drop(ring_index: u32) {
    if let Some(counter) = RING_DROPS.get_ptr_mut(ring_index) {
        // SAFETY: per-CPU slot, and BPF programs do not migrate CPUs while running.
        unsafe { *counter += 1 };
    }
}
