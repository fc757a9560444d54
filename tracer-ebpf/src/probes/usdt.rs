//! USDT probes: one uprobe program at every attached probe site; the
//! attach cookie indexes the spec userspace wrote for that site, which
//! says where each argument is (a register of the saved user registers,
//! user memory at a register plus an offset, or a constant) and its width.

use aya_ebpf::bindings::pt_regs;
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{
    cuda,
    heap::{HeapAlloc, how},
    kind,
    usdt::{ArgKind, MAX_ARGS, TORCH_MALLOC, UsdtArg, UsdtEvent},
};

use crate::{
    maps::{COUNTDOWN_CUDA, CUDA_STACKS, USDT_SPECS},
    stack,
    util::{Ring, header},
};

/// `uprobe` at a USDT probe's `nop` (cookie = index in `USDT_SPECS`).
/// Sends one [`UsdtEvent`] on the data ring. Minimum kernel: 5.15
/// (attach cookies).
#[uprobe]
pub fn usdt_probe(ctx: ProbeContext) -> u32 {
    match try_probe(&ctx) {
        Some(()) => 0,
        None => 1,
    }
}

fn try_probe(ctx: &ProbeContext) -> Option<()> {
    // SAFETY: the context pointer is the one the kernel passed to this program.
    let slot = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let spec = USDT_SPECS.get(slot)?;
    if spec.probe == 0 {
        return None;
    }
    let mut out = UsdtEvent {
        header: header(kind::USDT),
        probe: spec.probe,
        nargs: spec.nargs,
        args: [0; MAX_ARGS],
    };
    for i in 0..MAX_ARGS {
        if i as u32 >= spec.nargs {
            break;
        }
        out.args[i] = read_arg(ctx, &spec.args[i]).unwrap_or(0);
    }
    Ring::Data.output(&out);
    if spec.probe == TORCH_MALLOC {
        block_stack(ctx, &out);
    }
    Some(())
}

/// The stack of a block the caching allocator handed out (`malloc(ptr,
/// device, size, stream)`): the tensor's, sampled as CUDA allocations are.
#[inline(always)]
fn block_stack(ctx: &ProbeContext, b: &UsdtEvent) {
    let (ptr, size) = (b.args[0], b.args[2]);
    let Some(c) = CUDA_STACKS.get(0) else {
        return;
    };
    if c.on == 0 || ptr == 0 || size == 0 {
        return;
    }
    let how = if size >= cuda::STACK_MIN_BYTES || c.sample_bytes == 0 {
        how::EXACT
    } else if super::heap::sampled(COUNTDOWN_CUDA, size, c.sample_bytes) {
        how::SAMPLED
    } else {
        return;
    };
    let regs = ctx.as_ptr() as *const pt_regs;
    // SAFETY: `regs` is the context the kernel passed: the user registers.
    let regs = unsafe { ((*regs).rip, (*regs).rsp, (*regs).rbp) };
    let Some(mut slot) = Ring::Data.reserve::<HeapAlloc>() else {
        return;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of size_of::<HeapAlloc>();
    // every field is written through raw pointers (the event is far larger
    // than the BPF stack).
    unsafe {
        let mut h = b.header;
        h.kind = kind::CUDA_STACK;
        (&raw mut (*ev).header).write(h);
        (*ev).addr = ptr;
        (*ev).size = size;
        (*ev).func = cuda::CACHING_BLOCK;
        (*ev).how = how;
        stack::fill(ctx, ev, regs);
    }
    slot.submit();
}

/// A saved user register, by its byte offset in `struct pt_regs`.
fn register(ctx: &ProbeContext, off: u32) -> Option<u64> {
    if off > 160 || off % 8 != 0 {
        return None;
    }
    let at = (ctx.as_ptr() as *const u8).wrapping_add(off as usize) as *const u64;
    // SAFETY: a read inside the pt_regs the kernel passed; the helper
    // faults safely.
    unsafe { bpf_probe_read_kernel(at) }.ok()
}

fn read_arg(ctx: &ProbeContext, a: &UsdtArg) -> Option<u64> {
    let raw = match a.kind {
        k if k == ArgKind::Reg as u8 => register(ctx, a.reg_off)?,
        k if k == ArgKind::Mem as u8 => {
            let addr = register(ctx, a.reg_off)?.wrapping_add(a.value as u64);
            // SAFETY: a user address; the helper faults safely. Eight bytes
            // are read and the width applied below (x86 is little endian).
            match a.size {
                8 => unsafe { bpf_probe_read_user(addr as *const u64) }.ok()?,
                4 => u64::from(unsafe { bpf_probe_read_user(addr as *const u32) }.ok()?),
                2 => u64::from(unsafe { bpf_probe_read_user(addr as *const u16) }.ok()?),
                _ => u64::from(unsafe { bpf_probe_read_user(addr as *const u8) }.ok()?),
            }
        }
        k if k == ArgKind::Const as u8 => a.value as u64,
        _ => return None,
    };
    let bits = u32::from(a.size.clamp(1, 8)) * 8;
    if bits == 64 {
        return Some(raw);
    }
    let shift = 64 - bits;
    Some(if a.signed != 0 {
        (((raw << shift) as i64) >> shift) as u64
    } else {
        (raw << shift) >> shift
    })
}
