//! SIGKILLs, whoever sends them: the OOM killer itself, userspace killers
//! (systemd-oomd, earlyoom, kubelet), or a plain `kill -9`.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{COMM_LEN, SignalKill, field, kind};

use crate::util::{Ring, header, read_field};

const SIGKILL: i32 = 9;

/// `tracepoint/signal/signal_generate`, from `__send_signal_locked()` in
/// kernel/signal.c, in the sender's context. Format: `int sig, int errno,
/// int code, char comm[16], pid_t pid, int group, int result`. Only
/// SIGKILL crosses the ring. Minimum kernel: 3.2.
#[tracepoint(category = "signal", name = "signal_generate")]
pub fn signal_generate(ctx: TracePointContext) -> u32 {
    if read_field::<i32>(&ctx, field::SIG_SIG) != Some(SIGKILL) {
        return 0;
    }
    let Some(slot) = Ring::Critical.reserve::<SignalKill>() else {
        return 1;
    };
    slot.submit_value(SignalKill {
        header: header(kind::SIGNAL_KILL),
        target_pid: read_field::<i32>(&ctx, field::SIG_PID).unwrap_or(0) as u32,
        sig: SIGKILL,
        code: read_field::<i32>(&ctx, field::SIG_CODE).unwrap_or(0),
        group: read_field::<i32>(&ctx, field::SIG_GROUP).unwrap_or(0),
        result: read_field::<i32>(&ctx, field::SIG_RESULT).unwrap_or(0),
        _pad: 0,
        target_comm: read_field::<[u8; COMM_LEN]>(&ctx, field::SIG_COMM).unwrap_or_default(),
    });
    0
}
