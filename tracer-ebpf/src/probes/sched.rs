//! Process lifecycle, to keep the userspace process model current.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use tracer_common::{ARGS_LEN, ProcExec, ProcExit, ProcFork, field, kind};

use crate::util::{
    Ring, config, current_memcg_id, current_mm, current_task, header, read_data_loc_str,
    read_field, task_start_ns,
};

/// `tracepoint/sched/sched_process_exec`, from `exec_binprm()` in
/// fs/exec.c, after the new image is in place. Format: `__data_loc char[]
/// filename, pid_t pid, pid_t old_pid`. Minimum kernel: 3.4.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let Some(mut slot) = Ring::Data.reserve::<ProcExec>() else {
        return 1;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at a reserved ring slot of size_of::<ProcExec>()
    // bytes that only this program writes until submit; every field is
    // written before submit but `args` past `args_len`, which userspace
    // does not read.
    unsafe {
        (*ev).header = header(kind::PROC_EXEC);
        (*ev).pid = read_field::<i32>(&ctx, field::EXEC_PID).unwrap_or(0) as u32;
        (*ev).old_pid = read_field::<i32>(&ctx, field::EXEC_OLD_PID).unwrap_or(0) as u32;
        (*ev).memcg_id = current_memcg_id();
        (*ev).start_ns = task_start_ns(current_task());
        (*ev).filename[0] = 0;
        read_data_loc_str(&ctx, field::EXEC_FILENAME, &mut (*ev).filename);
        let (total, len) = read_args((&raw mut (*ev).args).cast::<u8>());
        (*ev).args_total = total;
        (*ev).args_len = len;
    }
    slot.submit();
    0
}

/// Copies the start of the current program's argument block (the new
/// image's `mm->arg_start .. arg_end`, in place when the exec tracepoint
/// fires) to `dst`, which holds [`ARGS_LEN`] bytes. Returns the block's
/// length and the bytes copied; (0, 0) when the offsets are unknown.
///
/// # Safety
/// `dst` points at [`ARGS_LEN`] writable bytes.
#[inline(always)]
unsafe fn read_args(dst: *mut u8) -> (u32, u32) {
    let [start_off, end_off] = config().mm_arg_off;
    if start_off == 0 || end_off == 0 {
        return (0, 0);
    }
    let Some(mm) = current_mm() else {
        return (0, 0);
    };
    // SAFETY: kernel pointers read through bpf_probe_read_kernel (which
    // faults safely) at offsets from this kernel's BTF.
    let (start, end) = unsafe {
        (
            bpf_probe_read_kernel(mm.add(start_off as usize).cast::<u64>()).unwrap_or(0),
            bpf_probe_read_kernel(mm.add(end_off as usize).cast::<u64>()).unwrap_or(0),
        )
    };
    if end <= start {
        return (0, 0);
    }
    let total = (end - start).min(u32::MAX as u64) as u32;
    let want = (end - start).min(ARGS_LEN as u64) as u32;
    // SAFETY: the caller's contract bounds `dst`; `want` is at most
    // ARGS_LEN; the helper reads user memory and fails safely.
    let ok = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(dst.cast(), want, start as *const _) == 0
    };
    (total, if ok { want } else { 0 })
}

/// `raw_tracepoint/sched_process_fork`, from `kernel_clone()` in
/// kernel/fork.c: `TP_PROTO(struct task_struct *parent, struct task_struct
/// *child)`. The raw form gives us the child's task, whose `tgid` (offset
/// from BTF) tells a new process from a new thread; threads are dropped here.
/// Minimum kernel: 4.17.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> u32 {
    let child: *const u8 = ctx.arg(1);
    let off = config().task_tgid_off as usize;
    if off == 0 {
        return 1;
    }
    // SAFETY: `child` is the task_struct the tracepoint passes; the offset
    // of `tgid` is read from this kernel's BTF; the helper faults safely.
    let Ok(child_tgid) = (unsafe { bpf_probe_read_kernel(child.add(off).cast::<i32>()) }) else {
        return 1;
    };
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if child_tgid as u32 == parent_tgid {
        return 0; // a new thread of the same process
    }
    let Some(slot) = Ring::Data.reserve::<ProcFork>() else {
        return 1;
    };
    slot.submit_value(ProcFork {
        header: header(kind::PROC_FORK),
        child_pid: child_tgid as u32,
        _pad: 0,
        // A new process's first task is its leader.
        child_start_ns: task_start_ns(child),
    });
    0
}

/// `tracepoint/sched/sched_process_exit`, from `do_exit()` in
/// kernel/exit.c, in the exiting task. Format: `char comm[16], pid_t pid,
/// int prio`, and on newer kernels `bool group_dead`. Only the end of a
/// whole process is sent (group_dead, or the leader where the field is
/// missing). Minimum kernel: 3.4.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let last = match read_field::<u8>(&ctx, field::EXIT_GROUP_DEAD) {
        Some(group_dead) => group_dead != 0,
        None => tgid == pid_tgid as u32,
    };
    if !last {
        return 0;
    }
    let Some(slot) = Ring::Critical.reserve::<ProcExit>() else {
        return 1;
    };
    // Initialised whatever happens: an `Option<[u64; 3]>` left LLVM free
    // to read the array's stack slots uninitialised when it was `None`,
    // which verifiers before 5.12 refuse ("invalid read from stack").
    let mut rss = [0u64; 3];
    let rss_known = exit_rss(&mut rss);
    let exit_code = exit_code();
    // Without a wakeup: a reader woken at every process's end costs a
    // process-churning workload more than the event is worth.
    slot.submit_value_lazily(ProcExit {
        header: header(kind::PROC_EXIT),
        pid: tgid,
        rss_known: u32::from(rss_known),
        rss_file_pages: rss[0],
        rss_anon_pages: rss[1],
        rss_shmem_pages: rss[2],
        start_ns: task_start_ns(current_task()),
        exit_code: exit_code.unwrap_or(0),
        exit_known: u32::from(exit_code.is_some()),
    });
    0
}

/// The exiting task's `exit_code`, set by `do_exit()` before this
/// tracepoint on every kernel since 3.4; None when its offset is unknown.
#[inline(always)]
fn exit_code() -> Option<i32> {
    let off = config().task_exit_code_off;
    if off == 0 {
        return None;
    }
    let task = current_task();
    // SAFETY: the current task, at an offset from this kernel's BTF; the
    // helper faults safely.
    unsafe { bpf_probe_read_kernel(task.add(off as usize).cast::<i32>()) }.ok()
}

/// Reads the exiting task's RSS counters (file, anon, shmem pages) into
/// `out`, where the kernel still has its mm at this tracepoint (recent
/// kernels fire it before `exit_mm()`, as 6.18 does; older ones do not):
/// false, with `out` all zero, when they cannot be read. The counters are
/// the kernel's approximate per-CPU-batched totals, as /proc reads them.
#[inline(always)]
fn exit_rss(out: &mut [u64; 3]) -> bool {
    let cfg = config();
    if cfg.mm_rss_off[1] == 0 {
        return false;
    }
    let Some(mm) = current_mm() else {
        return false;
    };
    for (i, off) in cfg.mm_rss_off.iter().enumerate() {
        if *off != 0 {
            // SAFETY: as above; a faulting read returns an error.
            match unsafe { bpf_probe_read_kernel(mm.add(*off as usize).cast::<i64>()) } {
                Ok(v) => out[i] = v.max(0) as u64,
                Err(_) => {
                    *out = [0; 3];
                    return false;
                }
            }
        }
    }
    true
}
