//! The walk of a sampled thread's CPython frames: from `_PyRuntime` to the
//! first interpreter, its thread states to the sampled thread's, and that
//! thread's frames, innermost first. Each frame's code object and
//! instruction go in the sample; userspace names them.

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user};
use tracer_common::{
    heap::HeapAlloc,
    python::{self as py, NONE, PyLayout, status},
};

use crate::{maps::PY_PROCS, util::config};

/// Reads a `T` at `base + off` of the process's memory.
#[inline(always)]
fn read<T>(base: u64, off: u16) -> Option<T> {
    // SAFETY: a user address read through bpf_probe_read_user, which
    // faults safely (a page not present fails the read).
    unsafe { bpf_probe_read_user((base + off as u64) as *const T) }.ok()
}

/// The current thread's `pthread_self()`: its `fsbase` on x86_64.
#[inline(always)]
fn fsbase() -> Option<u64> {
    let off = config().task_fsbase_off;
    if off == 0 {
        return None;
    }
    let task = crate::util::current_task();
    // SAFETY: a kernel pointer read through bpf_probe_read_kernel, which
    // faults safely, at an offset from this kernel's BTF.
    unsafe { bpf_probe_read_kernel(task.add(off as usize).cast::<u64>()) }.ok()
}

/// The thread state of the current thread in the interpreter `l`
/// describes: 0 when it has none.
#[inline(always)]
fn thread_state(l: &PyLayout, tid: u32) -> Result<u64, u16> {
    let want = if l.id_is_pthread != 0 {
        fsbase().ok_or(status::NO_THREAD)?
    } else {
        tid as u64
    };
    let interp: u64 = read(l.runtime, l.interp_head).ok_or(status::READ_FAILED)?;
    if interp == 0 {
        return Err(status::NO_THREAD);
    }
    let mut ts: u64 = read(interp, l.threads_head).ok_or(status::READ_FAILED)?;
    for _ in 0..py::THREADS {
        if ts == 0 {
            break;
        }
        let id: u64 = read(ts, l.ts_id).ok_or(status::READ_FAILED)?;
        if id == want {
            return Ok(ts);
        }
        ts = read(ts, l.ts_next).ok_or(status::READ_FAILED)?;
    }
    Err(status::NO_THREAD)
}

/// Walks the current thread's Python frames into `ev` (`py_len`,
/// `py_status`, `py`); a process with no known interpreter gets
/// `status::NONE`.
///
/// # Safety
/// `ev` points at a reserved ring slot of `size_of::<HeapAlloc>()` bytes.
#[inline(always)]
pub unsafe fn walk(ev: *mut HeapAlloc) {
    // SAFETY: the caller's contract; fields are written through raw
    // pointers.
    unsafe {
        (*ev).py_len = 0;
        (*ev)._py_pad = 0;
        (*ev).py_status = status::NONE;
        let pid_tgid = bpf_get_current_pid_tgid();
        let Some(l) = PY_PROCS.get(&((pid_tgid >> 32) as u32)) else {
            return;
        };
        (*ev).py_status = match frames(ev, l, pid_tgid as u32) {
            Ok(s) | Err(s) => s,
        };
    }
}

#[inline(always)]
unsafe fn frames(ev: *mut HeapAlloc, l: &PyLayout, tid: u32) -> Result<u16, u16> {
    let ts = thread_state(l, tid)?;
    let mut f: u64 = read(ts, l.ts_frame).ok_or(status::READ_FAILED)?;
    if l.cframe_frame != NONE && f != 0 {
        f = read(f, l.cframe_frame).ok_or(status::READ_FAILED)?;
    }
    for i in 0..py::FRAMES {
        if f == 0 {
            break;
        }
        let code: u64 = read(f, l.f_code).ok_or(status::READ_FAILED)?;
        let instr: u64 = if l.instr_is_ptr != 0 {
            read(f, l.f_instr).ok_or(status::READ_FAILED)?
        } else {
            read::<u32>(f, l.f_instr).ok_or(status::READ_FAILED)? as u64
        };
        let owner: u8 = if l.f_owner != NONE {
            read(f, l.f_owner).ok_or(status::READ_FAILED)?
        } else {
            0
        };
        // SAFETY: the caller's contract; `i` is below py::FRAMES.
        unsafe {
            let slot = (&raw mut (*ev).py).cast::<py::PyFrame>().add(i);
            (*slot).code = code;
            (*slot).instr = (instr & ((1 << 56) - 1)) | ((owner as u64) << 56);
            (*ev).py_len = (i + 1) as u16;
        }
        f = read(f, l.f_back).ok_or(status::READ_FAILED)?;
    }
    Ok(if f != 0 {
        status::TRUNCATED
    } else {
        status::OK
    })
}
