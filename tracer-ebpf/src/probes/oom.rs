//! The kernel OOM killer: victim selection and reaping.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use aya_log_ebpf::warn;
use tracer_common::{COMM_LEN, OomVictim, Reap, field, kind, victim_field};

use crate::{
    maps::KERNEL_KILLS,
    util::{
        Ring, current_memcg_id, current_task, header, read_data_loc_str, read_field, task_start_ns,
    },
};

/// `tracepoint/oom/mark_victim`, from `mark_oom_victim()` in mm/oom_kill.c,
/// in the context of the task whose allocation triggered the kill.
/// Format (6.8+): `pid, __data_loc comm, total_vm, anon_rss, file_rss,
/// shmem_rss, uid, pgtables, oom_score_adj` (sizes in kB); before 6.8 only
/// `pid`. Minimum kernel: 4.13 (tracepoint), 5.8 (ring buffer).
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
    match try_mark_victim(&ctx) {
        Ok(()) => 0,
        Err(()) => {
            warn!(&ctx, "mark_victim: OOM ring full, OOM kill event lost");
            1
        }
    }
}

fn try_mark_victim(ctx: &TracePointContext) -> Result<(), ()> {
    let slot = Ring::Oom.reserve::<OomVictim>().ok_or(())?;
    let mut present = 0u16;
    let mut flag = |bit: u16, v: Option<u64>| -> u64 {
        if v.is_some() {
            present |= bit;
        }
        v.unwrap_or(0)
    };
    let total_vm_kb = flag(
        victim_field::TOTAL_VM,
        read_field::<u64>(ctx, field::MV_TOTAL_VM),
    );
    let anon_rss_kb = flag(
        victim_field::RSS,
        read_field::<u64>(ctx, field::MV_ANON_RSS),
    );
    let file_rss_kb = flag(
        victim_field::RSS,
        read_field::<u64>(ctx, field::MV_FILE_RSS),
    );
    let shmem_rss_kb = flag(
        victim_field::RSS,
        read_field::<u64>(ctx, field::MV_SHMEM_RSS),
    );
    let pgtables_kb = flag(
        victim_field::PGTABLES,
        read_field::<u64>(ctx, field::MV_PGTABLES),
    );
    let uid = flag(
        victim_field::UID,
        read_field::<u32>(ctx, field::MV_UID).map(u64::from),
    ) as u32;
    let adj = read_field::<i16>(ctx, field::MV_OOM_SCORE_ADJ);
    if adj.is_some() {
        present |= victim_field::OOM_SCORE_ADJ;
    }
    let mut victim_comm = [0u8; COMM_LEN];
    if read_data_loc_str(ctx, field::MV_COMM, &mut victim_comm).is_some() {
        present |= victim_field::COMM;
    }
    let victim_pid = read_field::<i32>(ctx, field::MV_PID).unwrap_or(0) as u32;
    let hdr = header(kind::OOM_VICTIM);
    // The tracepoint names the victim by pid only. When it is the task
    // that triggered the kill, its start and cgroup are current's; else
    // they were noted at the SIGKILL the OOM killer sent it just before.
    let trigger_memcg_id = current_memcg_id();
    // SAFETY: a plain map lookup; the value is copied out at once.
    let noted = unsafe { KERNEL_KILLS.get(&victim_pid) }.copied();
    if noted.is_some() {
        present |= victim_field::KILL_SEEN;
    }
    let (victim_memcg_id, victim_start_ns) = if victim_pid == hdr.pid {
        (trigger_memcg_id, task_start_ns(current_task()))
    } else {
        match noted {
            Some([memcg, start]) => (memcg, start),
            None => (0, 0),
        }
    };
    let _ = KERNEL_KILLS.remove(&victim_pid);
    slot.submit_value(OomVictim {
        header: hdr,
        victim_pid,
        uid,
        total_vm_kb,
        anon_rss_kb,
        file_rss_kb,
        shmem_rss_kb,
        pgtables_kb,
        oom_score_adj: adj.unwrap_or(0),
        present,
        _pad: 0,
        trigger_memcg_id,
        victim_comm,
        victim_start_ns,
        victim_memcg_id,
    });
    // The stack that tipped the kill is `growth_oom_tip`, a program of its
    // own on the same tracepoint: it needs helpers (5.15) this one must not.
    Ok(())
}

/// `tracepoint/oom/start_task_reaping`, from `oom_reap_task_mm()` in
/// mm/oom_kill.c (the oom_reaper kthread). Format: `int pid`.
/// Minimum kernel: 4.19.
#[tracepoint(category = "oom", name = "start_task_reaping")]
pub fn oom_start_task_reaping(ctx: TracePointContext) -> u32 {
    emit_reap(&ctx, kind::REAP_START)
}

/// `tracepoint/oom/finish_task_reaping`, from `oom_reap_task_mm()` in
/// mm/oom_kill.c. Format: `int pid`. Minimum kernel: 4.19.
#[tracepoint(category = "oom", name = "finish_task_reaping")]
pub fn oom_finish_task_reaping(ctx: TracePointContext) -> u32 {
    emit_reap(&ctx, kind::REAP_FINISH)
}

fn emit_reap(ctx: &TracePointContext, kind: u32) -> u32 {
    let Some(slot) = Ring::Oom.reserve::<Reap>() else {
        return 1;
    };
    slot.submit_value(Reap {
        header: header(kind),
        victim_pid: read_field::<i32>(ctx, field::REAP_PID).unwrap_or(0) as u32,
        _pad: 0,
    });
    0
}
