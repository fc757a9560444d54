//! SIGKILLs, whoever sends them: the OOM killer itself, userspace killers
//! (systemd-oomd, earlyoom, kubelet), or a plain `kill -9`.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel, macros::raw_tracepoint, programs::RawTracePointContext,
};
use tracer_common::{COMM_LEN, SignalKill, kind, ring};

use crate::{
    maps::KERNEL_KILLS,
    util::{Ring, config, count_drop, header, task_memcg_id, task_start_ns},
};

const SIGKILL: i32 = 9;
/// `SEND_SIG_NOINFO` and `SEND_SIG_PRIV`: the two small constants
/// include/linux/sched/signal.h passes for a `kernel_siginfo *`.
const SEND_SIG_NOINFO: usize = 0;
const SEND_SIG_PRIV: usize = 1;
/// `si_code` as the tracepoint stores it for those two.
const SI_USER: i32 = 0;
const SI_KERNEL: i32 = 0x80;
/// Offset of `si_code` in `struct kernel_siginfo`: after `int si_signo,
/// si_errno` (the uapi layout of x86-64 and arm64; only MIPS swaps them).
const SI_CODE_OFF: usize = 8;

/// `raw_tracepoint/signal_generate`, from `__send_signal_locked()` in
/// kernel/signal.c, in the sender's context: `TP_PROTO(int sig, struct
/// kernel_siginfo *info, struct task_struct *task, int group, int
/// result)`, the same from 4.20 to 6.18 (`group` is `type !=
/// PIDTYPE_PID` since 5.19, nonzero for a whole-process signal as
/// before). The raw form hands us the target's task: its process and its
/// start, which the formatted tracepoint (a thread id and a name) does
/// not have. Only SIGKILL crosses the ring.
/// Minimum kernel: 4.17.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> u32 {
    let sig: u64 = ctx.arg(0);
    if sig as i32 != SIGKILL {
        return 0;
    }
    let info: usize = ctx.arg(1);
    let task: *const u8 = ctx.arg(2);
    let group: u64 = ctx.arg(3);
    let result: u64 = ctx.arg(4);
    let cfg = config();
    if task.is_null() || cfg.task_tgid_off == 0 || cfg.task_comm_off == 0 {
        return 1;
    }
    let code = match info {
        SEND_SIG_NOINFO => SI_USER,
        SEND_SIG_PRIV => SI_KERNEL,
        // SAFETY: a kernel_siginfo the kernel passed; the helper faults safely.
        p => unsafe { bpf_probe_read_kernel((p + SI_CODE_OFF) as *const i32) }.unwrap_or(0),
    };
    // SAFETY: the task_struct the tracepoint passes, at offsets from this
    // kernel's BTF; the helper faults safely.
    let (tgid, target_comm) = unsafe {
        (
            bpf_probe_read_kernel(task.add(cfg.task_tgid_off as usize).cast::<i32>()).unwrap_or(0),
            bpf_probe_read_kernel(
                task.add(cfg.task_comm_off as usize)
                    .cast::<[u8; COMM_LEN]>(),
            )
            .unwrap_or_default(),
        )
    };
    let start = task_start_ns(task);
    let memcg = task_memcg_id(task);
    // The kernel's own kill (the OOM killer's, just before its
    // mark_victim): the victim's cgroup and start, for that event.
    if code == SI_KERNEL {
        let _ = KERNEL_KILLS.insert(&(tgid as u32), &[memcg, start], 0);
    }
    let Some(slot) = Ring::Critical.reserve::<SignalKill>() else {
        count_drop(ring::SIGKILLS);
        return 1;
    };
    slot.submit_value(SignalKill {
        header: header(kind::SIGNAL_KILL),
        target_pid: tgid as u32,
        sig: SIGKILL,
        code,
        group: i32::from(group as i32 != 0),
        result: result as i32,
        _pad: 0,
        target_comm,
        target_start_ns: start,
        target_memcg_id: memcg,
    });
    0
}
