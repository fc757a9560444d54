//! USDT probes: one uprobe program at every attached probe site; the
//! attach cookie indexes the spec userspace wrote for that site, which
//! says where each argument is (a register of the saved user registers,
//! user memory at a register plus an offset, or a constant) and its width.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{
    kind,
    usdt::{ArgKind, MAX_ARGS, UsdtArg, UsdtEvent},
};

use crate::{
    maps::USDT_SPECS,
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
    Some(())
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
