//! CUDA runtime and driver allocation APIs: one uprobe and one uretprobe
//! program serve every function; the attach cookie says which function
//! fired. Calls a probed function makes into other probed functions on the
//! same thread (cudaMalloc -> cuMemAlloc_v2) only deepen the outer frame,
//! so each user-visible call counts once.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_ktime_get_boot_ns},
    },
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    CudaCall, CudaInflight, CudaThread,
    cuda::{self, Shape},
    heap::{HeapAlloc, how},
    kind,
};

use crate::{
    maps::{
        COUNTDOWN_CUDA, CUDA_CTX_DEVICE, CUDA_INFLIGHT, CUDA_SLOTS, CUDA_STACKS, CUDA_THREAD_DEVICE,
    },
    slots::{Frame, PerThread, frame_fields},
    stack,
    util::{Ring, header_with},
};

/// A frame older than this lost its return (the thread died in the call).
const STALE_NS: u64 = 30_000_000_000;

/// `uprobe` at the entry of every probed CUDA function (cookie = function
/// id, `tracer_common::cuda`). Reads the arguments the return needs.
/// Minimum kernel: 5.15 (attach cookies).
#[uprobe]
pub fn cuda_entry(ctx: ProbeContext) -> u32 {
    match try_entry(&ctx) {
        Some(()) => 0,
        None => 1,
    }
}

/// Each thread's CUDA state: its slot, or its spill entry. (Made in code,
/// not a static: a static's pointers to maps would need data relocations,
/// which BPF loaders do not apply.)
#[inline(always)]
fn threads() -> PerThread<CudaInflight> {
    PerThread {
        slots: &CUDA_SLOTS,
        spill: &CUDA_INFLIGHT,
        stale_ns: STALE_NS,
        count: tracer_common::THREAD_SLOTS,
    }
}

impl Frame for CudaInflight {
    frame_fields!();

    /// The thread's device as last recorded; its name read at its next
    /// return.
    #[inline(always)]
    fn claim(&mut self, tid: u64) {
        self.owner = tid;
        self.depth = 0;
        self.thread = CudaThread {
            // SAFETY: reading a plain i32 map value.
            device: unsafe { CUDA_THREAD_DEVICE.get(&tid) }
                .copied()
                .unwrap_or(-1),
            ..Default::default()
        };
    }
}

fn try_entry(ctx: &ProbeContext) -> Option<()> {
    let tid = bpf_get_current_pid_tgid();
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let open = threads().entry(tid, now)?;
    // SAFETY: a live map value of this thread; only its probes write it
    // (see `slots` for a slot shared with another thread).
    if unsafe { threads().nested(open, now) } {
        return Some(());
    }
    // SAFETY: the context pointer is the one the kernel passed to this program.
    let func = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let shape = cuda::shape(func)?;
    let arg = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    let mut f = CudaInflight {
        owner: tid,
        func,
        depth: 1,
        ts_ns: now,
        device: -1,
        ..Default::default()
    };
    match shape {
        Shape::Alloc => (f.out_addr, f.size) = (arg(0), arg(1)),
        // Pitch: the pitch out-pointer in aux, width in ptr, height in size.
        Shape::Pitch => (f.out_addr, f.aux, f.ptr, f.size) = (arg(0), arg(1), arg(2), arg(3)),
        Shape::Free => f.ptr = arg(0),
        Shape::Create => {
            (f.out_addr, f.size) = (arg(0), arg(1));
            let prop = arg(2);
            if prop != 0 {
                // SAFETY: a user pointer the caller passed; the helper faults safely.
                f.device =
                    unsafe { bpf_probe_read_user((prop + cuda::PROP_LOCATION_ID) as *const i32) }
                        .unwrap_or(-1);
            }
        }
        Shape::Map => (f.ptr, f.size, f.aux) = (arg(0), arg(1), arg(3)),
        Shape::PtrSize => (f.ptr, f.size) = (arg(0), arg(1)),
        Shape::SetDevice => f.device = arg(0) as i32,
        Shape::SetContext => f.aux = arg(0),
        Shape::RetainContext => (f.out_addr, f.device) = (arg(0), arg(1) as i32),
        Shape::Init => f.aux = arg(0),
        Shape::Reset => {
            if func == cuda::DEVICE_PRIMARY_CTX_RESET {
                f.device = arg(0) as i32;
            }
        }
    }
    // The thread's state stays between calls (depth 0 when idle) and is
    // written in place: an LRU insert and delete per call were about 40%
    // of what these programs add to a call (BENCHMARKS.md).
    // SAFETY: as above.
    unsafe {
        f.thread = (*open).thread;
        *open = f;
    }
    Some(())
}

/// `uretprobe` at the return of every probed CUDA function. Sends one
/// [`CudaCall`] for the outermost frame; out-of-memory failures go on the
/// critical ring. Minimum kernel: 5.15.
#[uretprobe]
pub fn cuda_return(ctx: RetProbeContext) -> u32 {
    match try_return(&ctx) {
        Some(()) => 0,
        None => 1,
    }
}

fn try_return(ctx: &RetProbeContext) -> Option<()> {
    let tid = bpf_get_current_pid_tgid();
    let open = threads().current(tid)?;
    // SAFETY: a live map value of this thread.
    let Some(f) = (unsafe { threads().leave(open) }) else {
        return Some(());
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let ret: i64 = ctx.ret();
    let ret = ret as i32;
    let ok = ret == 0;
    let read_u64 = |addr: u64| -> Option<u64> {
        // SAFETY: a user pointer the caller passed; the helper faults safely.
        (addr != 0)
            .then(|| unsafe { bpf_probe_read_user(addr as *const u64) }.ok())
            .flatten()
    };
    let shape = cuda::shape(f.func)?;
    // The thread's device, in its state and where it is found when the
    // thread takes a slot back.
    let remember_device = move |dev: i32| {
        // SAFETY: this thread's live map value, as above.
        unsafe { (*open).thread.device = dev };
        let _ = CUDA_THREAD_DEVICE.insert(&tid, &dev, 0);
    };
    let comm = if now.saturating_sub(f.thread.comm_ns) < cuda::COMM_FRESH_NS {
        f.thread.comm
    } else {
        let comm = bpf_get_current_comm().unwrap_or_default();
        // SAFETY: this thread's live map value, as above.
        unsafe {
            (*open).thread.comm = comm;
            (*open).thread.comm_ns = now;
        }
        comm
    };
    let mut out = CudaCall {
        header: header_with(kind::CUDA_CALL, tid, now, comm),
        func: f.func,
        ret,
        size: f.size,
        ptr: f.ptr,
        aux: f.aux,
        latency_ns: now.saturating_sub(f.ts_ns),
        device: f.device,
        _pad: 0,
    };
    if ok && let Some(v) = read_u64(f.out_addr) {
        out.ptr = v;
    }
    match shape {
        Shape::Pitch => {
            let width = f.ptr;
            out.size = match read_u64(f.aux).filter(|_| ok) {
                Some(pitch) => pitch * f.size,
                None => width * f.size,
            };
            out.aux = 0;
            if !ok {
                out.ptr = 0;
            }
        }
        Shape::SetDevice if ok => remember_device(f.device),
        Shape::RetainContext if ok => {
            let _ = CUDA_CTX_DEVICE.insert(&out.ptr, &f.device, 0);
        }
        Shape::SetContext if ok => {
            // SAFETY: reading a plain i32 map value.
            if let Some(dev) = unsafe { CUDA_CTX_DEVICE.get(&f.aux) } {
                remember_device(*dev);
                out.device = *dev;
            }
        }
        _ => {}
    }
    if out.device < 0 {
        out.device = f.thread.device;
    }
    let ring = if ret == cuda::OUT_OF_MEMORY && cuda::allocates(f.func) {
        Ring::Critical
    } else {
        Ring::Data
    };
    ring.output(&out);
    if ok
        && cuda::allocates(f.func)
        && out.ptr != 0
        && out.size > 0
        && let Some(c) = CUDA_STACKS.get(0)
        && c.on != 0
    {
        // Every allocation of 1 MiB or more; smaller ones sampled by bytes.
        let how = if out.size >= cuda::STACK_MIN_BYTES || c.sample_bytes == 0 {
            how::EXACT
        } else if super::heap::sampled(COUNTDOWN_CUDA, out.size, c.sample_bytes) {
            how::SAMPLED
        } else {
            return Some(());
        };
        send_stack(ctx, &out, how);
    }
    Some(())
}

/// The user stack (native and Python) of a successful allocation, after
/// its call: the code that holds the device memory.
#[inline(always)]
fn send_stack(ctx: &RetProbeContext, c: &CudaCall, how: u32) {
    let regs = ctx.regs;
    // SAFETY: the probe's own registers (the user's at the return), which
    // the kernel passes and the verifier lets the program read.
    let (ip, sp, bp) = unsafe { ((*regs).rip, (*regs).rsp, (*regs).rbp) };
    let Some(mut slot) = Ring::Data.reserve::<HeapAlloc>() else {
        return;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of size_of::<HeapAlloc>();
    // every field is written through raw pointers (the event is far larger
    // than the BPF stack).
    unsafe {
        let mut header = c.header;
        header.kind = kind::CUDA_STACK;
        (&raw mut (*ev).header).write(header);
        (*ev).addr = c.ptr;
        (*ev).size = c.size;
        (*ev).func = c.func;
        (*ev).how = how;
        stack::fill(ctx, ev, (ip, sp, bp));
    }
    slot.submit();
}

/// An empty `uprobe`, attached by `tracer attach --floor` at the same sites
/// as [`cuda_entry`]: what a probe costs before any work (benchmarks).
#[uprobe]
pub fn cuda_floor_entry(_ctx: ProbeContext) -> u32 {
    0
}

/// The empty `uretprobe` twin of [`cuda_floor_entry`].
#[uretprobe]
pub fn cuda_floor_return(_ctx: RetProbeContext) -> u32 {
    0
}
