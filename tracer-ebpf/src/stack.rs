//! The user stack of the current task, copied for unwinding in userspace:
//! shared by every family that sends a [`HeapAlloc`]-shaped sample.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, pt_regs},
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_get_stack, bpf_task_pt_regs},
    },
};
use tracer_common::heap::{self, HeapAlloc};

/// Some of the current task's saved user registers, picked by `pick`:
/// what the task held where it entered the kernel (a system call, a
/// fault). Valid in tracepoints.
#[inline(always)]
fn saved_regs<const N: usize>(
    pick: impl Fn(*const pt_regs) -> [*const u64; N],
) -> Option<[u64; N]> {
    // SAFETY: helpers without preconditions beyond a task pointer from the
    // kernel; the registers are read through bpf_probe_read_kernel, at
    // addresses inside the task's pt_regs.
    unsafe {
        let task = bpf_get_current_task_btf();
        let regs = bpf_task_pt_regs(task) as *const pt_regs;
        if regs.is_null() {
            return None;
        }
        let mut out = [0u64; N];
        for (o, at) in out.iter_mut().zip(pick(regs)) {
            *o = bpf_probe_read_kernel(at).ok()?;
        }
        Some(out)
    }
}

/// The user registers `(ip, sp, bp)` of the current task.
#[inline(always)]
pub fn user_regs() -> Option<(u64, u64, u64)> {
    // SAFETY: only addresses are formed here, never dereferenced.
    let [ip, sp, bp] = saved_regs(|r| unsafe {
        [
            &raw const (*r).rip,
            &raw const (*r).rsp,
            &raw const (*r).rbp,
        ]
    })?;
    Some((ip, sp, bp))
}

/// The current task's system call as its saved user registers hold it:
/// (number, second argument, fourth argument), i.e. `orig_ax`, `si`, `r10`
/// on x86_64 (the kernel's calling convention for system calls).
#[inline(always)]
pub fn syscall_args() -> Option<(u64, u64, u64)> {
    // SAFETY: as above.
    let [nr, b, d] = saved_regs(|r| unsafe {
        [
            &raw const (*r).orig_rax,
            &raw const (*r).rsi,
            &raw const (*r).r10,
        ]
    })?;
    Some((nr, b, d))
}

/// The current task's system call and its first three arguments:
/// `orig_ax`, `di`, `si`, `dx` on x86_64.
#[inline(always)]
pub fn syscall_args4() -> Option<[u64; 4]> {
    // SAFETY: as above.
    saved_regs(|r| unsafe {
        [
            &raw const (*r).orig_rax,
            &raw const (*r).rdi,
            &raw const (*r).rsi,
            &raw const (*r).rdx,
        ]
    })
}

/// How far above the stack pointer a frame pointer may be: the default
/// stack limit (8 MiB).
const FP_PLAUSIBLE: u64 = 8 << 20;

/// Bytes copied above `mm->start_stack`: `argc` and the start of `argv`,
/// always mapped (the kernel puts the arguments, the environment and the
/// auxiliary vector there, far more than this), for an unwinder that
/// reads at the outermost frame's boundary.
const ABOVE_START: u64 = 64;

/// Where the current process's main thread's stack began at exec
/// (`mm->start_stack`, its first stack pointer, with `argc` there); 0 when
/// unknown (a kernel thread, or offsets missing from BTF).
#[inline(always)]
fn main_stack_start() -> u64 {
    let off = crate::util::config().mm_start_stack_off;
    if off == 0 {
        return 0;
    }
    let Some(mm) = crate::util::current_mm() else {
        return 0;
    };
    // SAFETY: a kernel pointer read through bpf_probe_read_kernel (which
    // faults safely) at an offset from BTF.
    unsafe { bpf_probe_read_kernel(mm.add(off as usize).cast::<u64>()) }.unwrap_or(0)
}

/// Fills the registers, the kernel's frame-pointer walk and a copy of the
/// top of the user stack into the sample at `ev`; false when no byte of the
/// stack could be copied.
///
/// # Safety
/// `ev` points at a reserved ring slot of `size_of::<HeapAlloc>()` bytes.
#[inline(always)]
pub unsafe fn fill<C: EbpfContext>(
    ctx: &C,
    ev: *mut HeapAlloc,
    (ip, sp, bp): (u64, u64, u64),
) -> bool {
    // SAFETY: the caller's contract; every field is written through raw
    // pointers (the event is far larger than the BPF stack).
    unsafe {
        (*ev).ip = ip;
        (*ev).sp = sp;
        (*ev).bp = bp;
        // The kernel's walk (several microseconds here) only where the frame
        // pointer register can be one: an address in the stack above `sp`.
        // Code built without frame pointers uses the register for data, and
        // a walk from it stops at once or follows garbage.
        let fp_bytes = if bp >= sp && bp - sp < FP_PLAUSIBLE {
            bpf_get_stack(
                ctx.as_ptr(),
                (&raw mut (*ev).fp).cast(),
                (8 * heap::FP_FRAMES) as u32,
                BPF_F_USER_STACK as u64,
            )
        } else {
            0
        };
        (*ev).fp_len = if fp_bytes > 0 { fp_bytes as u32 / 8 } else { 0 };
        let dst = (&raw mut (*ev).stack).cast::<u8>();
        let read = |want: u32| {
            aya_ebpf::helpers::generated::bpf_probe_read_user(dst.cast(), want, sp as *const _) == 0
        };
        let mut len = 0u32;
        // The main thread near the top of its stack (most programs' stacks
        // are shallower than the copy): everything from `sp` to where the
        // stack began is mapped, so one copy of just that. A copy running
        // past the mapping's end fails only after the kernel has taken
        // and fixed up a fault, which cost about half of each sample.
        let start = main_stack_start();
        if start > sp && start - sp + ABOVE_START <= heap::STACK_BYTES as u64 {
            let want = (start - sp + ABOVE_START) as u32;
            if read(want) {
                len = want;
            }
        }
        // Elsewhere a read fails as a whole when the stack mapping ends
        // inside it (a thread's stack near its top, or a main thread's
        // stack page swapped out): copy up to page boundaries, the most
        // first.
        if len == 0 {
            let to_page_end = 4096 - (sp & 4095);
            for pages in [2u64, 1, 0] {
                let want = (to_page_end + pages * 4096).min(heap::STACK_BYTES as u64) as u32;
                if read(want) {
                    len = want;
                    break;
                }
            }
        }
        (*ev).stack_len = len;
        crate::python::walk(ev);
        len != 0
    }
}
