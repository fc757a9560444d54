//! Joins what the probes saw with the process model, the cgroup sampler and
//! the kernel's own OOM report into one [`KillRecord`] per kill.

pub mod arming;
pub mod cuda;
#[cfg(test)]
pub mod fixtures;
pub mod gpuview;
pub mod growth;
pub mod heap;
pub mod join;
pub mod kills;
pub mod leak;
pub use kills::LateNames;
pub mod pressure;
pub mod selfkill;
pub mod storm;
pub mod timeline;
pub mod userkill;
pub mod warning;

use tracer_common::{OomVictim, SignalKill, victim_field};

use crate::record::{
    FiguresFrom, Gap, KillRecord, Killer, KillerKind, MemcgAtKill, MemcgSource, MemoryFrom,
    ProcRef, Seen, TaskAtKill, Trigger, Victim, VictimMemory,
};
use crate::{
    collect::{decode::c_str, kmsg::OomReport},
    model::{Process, ProcessTable, StartTime, proc::ProcFacts, sampler::Sampler},
    util::time::Clock,
};

/// What a probe family adds to a kill before it is committed: the
/// victim's CUDA ledger, NVML's picture of its GPUs (and, as families
/// arrive, its heap's allocation sites). The recorder runs every enricher
/// it has on every kill; a new family is a new implementation.
pub trait KillEnricher {
    /// Adds what this family knows of the victim to `kill`.
    fn enrich(&self, kill: &mut KillRecord);
}

impl KillEnricher for cuda::CudaLedgers {
    fn enrich(&self, kill: &mut KillRecord) {
        kill.victim.gpu = self.ledger(kill.victim.pid);
    }
}

impl KillEnricher for crate::record::GpuView {
    fn enrich(&self, kill: &mut KillRecord) {
        kill.gpu_picture = self.of_process(kill.victim.pid);
    }
}

/// How far back the lead-up goes.
pub const LEADUP_NS: i64 = 60_000_000_000;

/// `si_code` of a signal the kernel itself sent (the OOM killer's SIGKILL).
pub const SI_KERNEL: i32 = 0x80;

/// How long a line printk prints whole, at least (its limit is about
/// 1,000 characters with the prefix): an oom-kill summary cut shorter was
/// cut after the kernel printed it.
const PRINTK_CUT_CHARS: usize = 900;

/// What the correlator reads.
pub struct Context<'a> {
    /// Clock offsets.
    pub clock: &'a Clock,
    /// The process model.
    pub model: &'a ProcessTable,
    /// The cgroup sampler.
    pub sampler: &'a Sampler,
    /// The recording session.
    pub session_id: Option<i64>,
    /// Now, wall ns.
    pub now_ns: i64,
    /// What live processes hold now (/proc in the recorder).
    pub procs: &'a dyn ProcFacts,
}

/// A process as reports name it, from the model when it knows it.
pub fn proc_ref(pid: u32, comm: String, p: Option<&Process>) -> ProcRef {
    ProcRef {
        pid,
        comm,
        cmdline: p
            .map(|p| p.info.cmdline.to_string())
            .filter(|c| !c.is_empty()),
        memcg: p.and_then(|p| p.memcg.clone()),
        owner: p.map(|p| p.owner.clone()).filter(|o| !o.is_empty()),
    }
}

/// Said of a kill whose pid the model knew as another process's.
fn reused_pid_gap(pid: u32) -> Gap {
    Gap::Note(format!(
        "pid {pid}, identity not confirmed: the process model's entry for this pid is another process's (it had ended before the kill, or started after it), so its command line and file are not taken"
    ))
}

fn victim_from(pid: u32, comm: String, p: Option<&Process>) -> Victim {
    Victim {
        pid,
        comm: if comm.is_empty() {
            p.map(|p| p.info.comm.clone()).unwrap_or_default()
        } else {
            comm
        },
        cmdline: p
            .map(|p| p.info.cmdline.to_string())
            .filter(|c| !c.is_empty()),
        exe: p.and_then(|p| p.info.exe.clone()),
        uid: p.map(|p| p.info.uid),
        memcg: p.and_then(|p| p.memcg.clone()),
        memcg_source: p.and_then(|p| p.memcg.as_ref()).map(|_| MemcgSource::Model),
        owner: p.map(|p| p.owner.clone()).filter(|o| !o.is_empty()),
        ..Default::default()
    }
}

/// Maps the kernel's constraint names to ours.
pub fn constraint_name(kernel: &str) -> &'static str {
    match kernel {
        "CONSTRAINT_MEMCG" => "memcg",
        "CONSTRAINT_CPUSET" => "cpuset",
        "CONSTRAINT_MEMORY_POLICY" => "mempolicy",
        _ => "global",
    }
}

/// The memcg most likely to have hit its limit: the victim's, or the
/// nearest ancestor whose last sample was at (or within 2 MiB of) its limit.
fn limited_memcg(ctx: &Context<'_>, memcg: &str) -> Option<String> {
    let mut path = memcg;
    loop {
        if let Some(s) = ctx.sampler.window(path, ctx.now_ns - LEADUP_NS).last()
            && let Some(limit) = s.limit_bytes
            && s.usage_bytes + (2 << 20) >= limit
        {
            return Some(path.to_string());
        }
        match path.rfind('/') {
            Some(0) | None => return None,
            Some(i) => path = &path[..i],
        }
    }
}

/// The memcg figures from the sampler's last reading of `path`.
fn sampled_memcg(
    ctx: &Context<'_>,
    path: &str,
    at_ns: i64,
) -> (
    Option<MemcgAtKill>,
    Vec<crate::model::sampler::CgroupSample>,
) {
    // The lead-up ends at the kill: a sample taken after it (a commit
    // that came late, on a slow node) shows the memory the victim freed.
    let all = ctx.sampler.window(path, at_ns - LEADUP_NS);
    let first_after = all.iter().find(|s| s.ts_ns > at_ns).cloned();
    let leadup: Vec<_> = all.into_iter().filter(|s| s.ts_ns <= at_ns).collect();
    let last = leadup.last().or(first_after.as_ref());
    let memcg = MemcgAtKill {
        path: path.to_string(),
        limit_bytes: last.and_then(|s| s.limit_bytes),
        usage_bytes: last.map(|s| s.usage_bytes),
        failcnt: last.and_then(|s| s.failcnt),
        source: FiguresFrom::Sample,
        age_ms: last.map(|s| (at_ns - s.ts_ns) / 1_000_000),
    };
    (Some(memcg), leadup)
}

/// Most tasks of a cgroup whose /proc is read for one kill record.
const MAX_TASKS_READ: usize = 256;

/// Names a task of the kernel's table (not the victim: its record has its
/// own) by its command line and place, where the model has that live
/// process under the same name.
pub(crate) fn name_task(model: &ProcessTable, t: &mut TaskAtKill, kill_ns: i64) {
    if !t.victim {
        // The process that held the pid at the kill, though it ended
        // since (a grower the OOM killer took next): never a later holder.
        (t.cmdline, t.place) = named(
            model
                .holder(t.pid, kill_ns, None)
                .0
                .filter(|p| p.info.comm == t.comm),
        );
    }
}

/// A task's command line (cut) and place, from its model entry.
fn named(p: Option<&crate::model::Process>) -> (Option<String>, Option<String>) {
    let Some(p) = p else {
        return (None, None);
    };
    let cmd: &str = &p.info.cmdline;
    let mut cut = cmd.len().min(TaskAtKill::CMDLINE_KEPT);
    while !cmd.is_char_boundary(cut) {
        cut -= 1;
    }
    let cmdline = (!cmd.is_empty()).then(|| cmd[..cut].to_string());
    let place = (p.memcg.is_some() || !p.owner.is_empty()).then(|| {
        crate::model::cgroup::place(Some(&p.owner).filter(|o| !o.is_empty()), p.memcg.as_deref())
    });
    (cmdline, place)
}

/// Tasks of the memcg from the model, with RSS read from /proc now (at
/// most [`MAX_TASKS_READ`] of them).
fn tasks_from_model(
    ctx: &Context<'_>,
    path: &str,
    victim_pid: u32,
    victim_mem: &VictimMemory,
) -> Vec<TaskAtKill> {
    let mut out: Vec<TaskAtKill> = ctx
        .model
        .in_memcg(path, ctx.now_ns - 5_000_000_000)
        .filter(|p| p.exited_ns.is_none() || p.info.pid == victim_pid)
        .take(MAX_TASKS_READ)
        .filter_map(|p| {
            let pid = p.info.pid;
            if pid == victim_pid {
                // Listed only when its memory is known (no made-up zero).
                victim_mem.rss_kb()?;
                return Some(TaskAtKill {
                    pid,
                    comm: p.info.comm.clone(),
                    rss_kb: victim_mem.rss_kb().unwrap_or(0),
                    anon_kb: victim_mem.anon_rss_kb,
                    file_kb: victim_mem.file_rss_kb,
                    shmem_kb: victim_mem.shmem_rss_kb,
                    oom_score_adj: None,
                    victim: true,
                    ..Default::default()
                });
            }
            let m = ctx.procs.status_mem(pid)?;
            let (cmdline, place) = named(Some(p));
            Some(TaskAtKill {
                pid,
                comm: p.info.comm.clone(),
                rss_kb: m.rss_kb,
                anon_kb: Some(m.anon_kb),
                file_kb: Some(m.file_kb),
                shmem_kb: Some(m.shmem_kb),
                oom_score_adj: None,
                victim: false,
                cmdline,
                place,
            })
        })
        .collect();
    out.sort_by_key(|t| std::cmp::Reverse(t.rss_kb));
    out
}

/// Puts the victim in `kernel_memcg`, its memory cgroup as the kernel had
/// it at the kill, when known: it wins over the model's, which may be
/// from before the victim joined it.
fn place_by_kernel(ctx: &Context<'_>, victim: &mut Victim, kernel_memcg: Option<String>) {
    if let Some(m) = kernel_memcg {
        let o = ctx.model.owner_of(&m);
        victim.owner = (!o.is_empty()).then_some(o);
        victim.memcg = Some(m);
        victim.memcg_source = Some(MemcgSource::Kernel);
    }
}

/// A kill from `oom:mark_victim`, before the kernel's report is joined.
/// `kernel_memcg` is the victim's memory cgroup as the kernel had it at the
/// kill, when known; it wins over the model's.
pub fn kill_from_victim(
    ctx: &Context<'_>,
    ev: &OomVictim,
    kernel_memcg: Option<String>,
) -> KillRecord {
    let ts_ns = ctx.clock.boot_to_wall(ev.header.ts_boot_ns);
    let has = |bit: u16| ev.present & bit != 0;
    let victim_start = StartTime::kernel(ev.victim_start_ns);
    let (p, reused) = ctx.model.holder(ev.victim_pid, ts_ns, victim_start);
    let comm = if has(victim_field::COMM) {
        c_str(&ev.victim_comm)
    } else {
        String::new()
    };
    let mut victim = victim_from(ev.victim_pid, comm, p);
    place_by_kernel(ctx, &mut victim, kernel_memcg);
    if has(victim_field::UID) {
        victim.uid = Some(ev.uid);
    }
    if has(victim_field::OOM_SCORE_ADJ) {
        victim.oom_score_adj = Some(i32::from(ev.oom_score_adj));
    }
    victim.memory = VictimMemory {
        anon_rss_kb: has(victim_field::RSS).then_some(ev.anon_rss_kb),
        file_rss_kb: has(victim_field::RSS).then_some(ev.file_rss_kb),
        shmem_rss_kb: has(victim_field::RSS).then_some(ev.shmem_rss_kb),
        total_vm_kb: has(victim_field::TOTAL_VM).then_some(ev.total_vm_kb),
        pgtables_kb: has(victim_field::PGTABLES).then_some(ev.pgtables_kb),
        source: has(victim_field::RSS).then_some(MemoryFrom::Tracepoint),
    };
    let trig_pid = ev.header.pid;
    let trigger = Trigger {
        task: proc_ref(
            trig_pid,
            c_str(&ev.header.comm),
            ctx.model
                .holder(
                    trig_pid,
                    ts_ns,
                    victim_start.filter(|_| trig_pid == ev.victim_pid),
                )
                .0,
        ),
        gfp_mask: None,
        order: None,
    };
    let mut gaps = Vec::new();
    if reused {
        gaps.push(reused_pid_gap(ev.victim_pid));
    }
    let (constraint, memcg, leadup, tasks) = match victim.memcg.clone() {
        Some(vm) => {
            let limited = limited_memcg(ctx, &vm);
            let path = limited.clone().unwrap_or(vm);
            let (m, leadup) = sampled_memcg(ctx, &path, ts_ns);
            let tasks = tasks_from_model(ctx, &path, victim.pid, &victim.memory);
            (
                if limited.is_some() { "memcg" } else { "global" },
                m,
                leadup,
                tasks,
            )
        }
        None => {
            gaps.push(Gap::Note(
                "the victim's cgroup is unknown (it was not in the process model)".into(),
            ));
            ("global", None, Vec::new(), Vec::new())
        }
    };
    gaps.push(Gap::AwaitingReport);
    KillRecord {
        ts_ns,
        source: Seen::TRACEPOINT,
        killer: Killer {
            kind: KillerKind::KernelOom,
            constraint: Some(constraint.into()),
            sender: None,
            ..Default::default()
        },
        victim,
        trigger: Some(trigger),
        memcg,
        tasks,
        leadup,
        session_id: ctx.session_id,
        tracepoint_ns: Some(ts_ns),
        gaps,
        ..Default::default()
    }
}

/// A userspace kill from what the model already knows, with no /proc read
/// and no task table: the first kill of a storm's aggregate.
pub fn kill_from_signal_lean(
    ctx: &Context<'_>,
    ev: &SignalKill,
    kernel_memcg: Option<String>,
) -> KillRecord {
    let ts_ns = ctx.clock.boot_to_wall(ev.header.ts_boot_ns);
    let sender_pid = ev.header.pid;
    let mut victim = victim_from(
        ev.target_pid,
        c_str(&ev.target_comm),
        ctx.model
            .holder(ev.target_pid, ts_ns, StartTime::kernel(ev.target_start_ns))
            .0,
    );
    place_by_kernel(ctx, &mut victim, kernel_memcg);
    KillRecord {
        ts_ns,
        source: Seen::SIGNAL,
        killer: Killer {
            kind: KillerKind::Userspace,
            constraint: None,
            sender: Some(proc_ref(
                sender_pid,
                c_str(&ev.header.comm),
                ctx.model.holder(sender_pid, ts_ns, None).0,
            )),
            signal_code: Some(ev.code),
            ..Default::default()
        },
        victim,
        session_id: ctx.session_id,
        tracepoint_ns: Some(ts_ns),
        ..Default::default()
    }
}

/// A kill by a SIGKILL from userspace; `None` for the kernel's own
/// SIGKILLs (the OOM killer's are recorded from `mark_victim`) and for
/// signals that were not delivered. `kernel_memcg`: the target's cgroup
/// as the probe read it (`target_memcg_id`), when known.
pub fn kill_from_signal(
    ctx: &Context<'_>,
    ev: &SignalKill,
    kernel_memcg: Option<String>,
) -> Option<KillRecord> {
    if ev.code == SI_KERNEL || ev.result != 0 {
        return None;
    }
    Some(signal_record(ctx, ev, kernel_memcg))
}

/// A kernel SIGKILL a process got from itself (see [`selfkill`]): `None`
/// for any other signal.
pub fn kill_from_self_signal(
    ctx: &Context<'_>,
    ev: &SignalKill,
    kernel_memcg: Option<String>,
) -> Option<KillRecord> {
    if ev.code != SI_KERNEL || ev.result != 0 || ev.header.pid != ev.target_pid {
        return None;
    }
    let mut rec = signal_record(ctx, ev, kernel_memcg);
    rec.killer.reason = Some(selfkill::REASON.into());
    Some(rec)
}

/// The record of a delivered SIGKILL, from the sender's point of view.
fn signal_record(ctx: &Context<'_>, ev: &SignalKill, kernel_memcg: Option<String>) -> KillRecord {
    let ts_ns = ctx.clock.boot_to_wall(ev.header.ts_boot_ns);
    let sender_pid = ev.header.pid;
    let sender = proc_ref(
        sender_pid,
        c_str(&ev.header.comm),
        ctx.model.holder(sender_pid, ts_ns, None).0,
    );
    let start = StartTime::kernel(ev.target_start_ns);
    let (p, reused) = ctx.model.holder(ev.target_pid, ts_ns, start);
    let mut victim = victim_from(ev.target_pid, c_str(&ev.target_comm), p);
    place_by_kernel(ctx, &mut victim, kernel_memcg);
    let mut gaps = Vec::new();
    if reused {
        gaps.push(reused_pid_gap(ev.target_pid));
    }
    match ctx.procs.status_mem(ev.target_pid) {
        Some(m) => {
            victim.memory = VictimMemory {
                anon_rss_kb: Some(m.anon_kb),
                file_rss_kb: Some(m.file_kb),
                shmem_rss_kb: Some(m.shmem_kb),
                source: Some(MemoryFrom::Proc),
                ..Default::default()
            }
        }
        None => gaps.push(Gap::MemoryUnknown),
    }
    let (memcg, leadup, tasks) = match victim.memcg.clone() {
        Some(path) => {
            let (m, leadup) = sampled_memcg(ctx, &path, ts_ns);
            let tasks = tasks_from_model(ctx, &path, victim.pid, &victim.memory);
            (m, leadup, tasks)
        }
        None => (None, Vec::new(), Vec::new()),
    };
    KillRecord {
        ts_ns,
        source: Seen::SIGNAL,
        killer: Killer {
            kind: KillerKind::Userspace,
            constraint: None,
            sender: Some(sender),
            signal_code: Some(ev.code),
            ..Default::default()
        },
        victim,
        memcg,
        tasks,
        leadup,
        session_id: ctx.session_id,
        tracepoint_ns: Some(ts_ns),
        gaps,
        ..Default::default()
    }
}

/// Joins the kernel's report into a kill record: constraint, the memcg at
/// the kill, the task table, the trigger's allocation, and the victim's
/// figures where the tracepoint lacked them.
pub fn merge_report(
    rec: &mut KillRecord,
    report: &OomReport,
    sampler: Option<&Sampler>,
    model: Option<&ProcessTable>,
) {
    let page_kb = crate::util::sys::page_kb();
    rec.source.kmsg = true;
    rec.gaps.retain(|g| *g != Gap::AwaitingReport);
    if report.summary.is_none() && report.oom_group.is_some() {
        rec.gaps.push(Gap::Note(
            "killed as a member of a memory.oom.group kill: the kernel printed its OOM report (memcg figures, task table) once, for the task it chose".into(),
        ));
    } else if report.summary.is_none()
        && report.summary_cut.is_none()
        && (report.trigger_comm.is_some() || !report.tasks.is_empty())
    {
        // A header and no summary line: a kernel before 4.19, which has none.
        let from = if report.task_in.is_some() {
            "the cgroups are from its `Task in ... killed as a result of limit of ...` line"
        } else {
            "the constraint is inferred from the kill line"
        };
        rec.gaps.push(Gap::Note(format!(
            "no oom-kill summary line (a kernel before 4.19 prints none, or the line was lost): {from}"
        )));
    } else if report.summary.is_none() {
        let stale = match rec
            .memcg
            .as_ref()
            .filter(|m| m.source == FiguresFrom::Sample)
        {
            Some(m) => format!(
                "; the memcg figures are the sampler's, {} before the kill",
                m.age_ms
                    .map(|a| format!("{a} ms"))
                    .unwrap_or_else(|| "some time".into())
            ),
            None => String::new(),
        };
        // What the cut line no longer says.
        let lost = match (
            &report.cut_constraint,
            &report.cut_oom_memcg,
            &report.cut_task_memcg,
        ) {
            (Some(_), _, Some(_)) => "the victim's name and pid are",
            (Some(_), Some(_), None) => "the victim's cgroup path is",
            (Some(_), None, None) => "the kernel's cgroup paths are",
            (None, _, _) => "the kernel's constraint and cgroup paths are",
        };
        rec.gaps.push(Gap::Note(match report.summary_cut {
            // Far shorter than printk's limit: cut where it was copied (a
            // pager's `>` at the screen's edge, a paste's end).
            Some(n) if report.saved_log && n < PRINTK_CUT_CHARS => format!(
                "the kernel's oom-kill summary line is cut short in this log ({n} characters, where printk would have printed it whole): {lost} not known{stale}"
            ),
            Some(n) => format!(
                "the kernel's oom-kill summary line was cut short by printk ({n} characters: a cgroup path too long): {lost} not known{stale}"
            ),
            // Live, the kernel rate-limited it; a saved log may just not
            // hold it.
            None if report.saved_log => format!(
                "this log holds no OOM header for this kill (it starts after it, was filtered, or the kernel rate-limited it): no kernel memcg figures or task table{stale}"
            ),
            None => format!(
                "the kernel printed no OOM header for this kill (rate-limited): no kernel memcg figures or task table{stale}"
            ),
        }));
    }
    rec.killer.kind = KillerKind::KernelOom;
    rec.killer.constraint = report.known_constraint().map(|c| constraint_name(c).into());
    // A warning is about one cgroup's limit: it stays with a kill at that
    // limit only.
    if rec
        .warning
        .as_ref()
        .is_some_and(|w| !warning::applies(w, report))
    {
        rec.warning = None;
    }
    if report.oom_group.is_some() {
        rec.oom_group = report.oom_group.clone();
    }
    let k = &report.killed;
    let v = &mut rec.victim;
    if v.comm.is_empty() {
        v.comm = k.comm.clone();
    }
    v.uid = v
        .uid
        .or(k.uid)
        .or(report.summary.as_ref().and_then(|s| s.uid));
    v.oom_score_adj = v.oom_score_adj.or(k.oom_score_adj);
    let any = [k.anon_rss_kb, k.file_rss_kb, k.shmem_rss_kb, k.total_vm_kb];
    if v.memory.source.is_none() && any.iter().any(Option::is_some) {
        v.memory = VictimMemory {
            anon_rss_kb: k.anon_rss_kb,
            file_rss_kb: k.file_rss_kb,
            shmem_rss_kb: k.shmem_rss_kb,
            total_vm_kb: k.total_vm_kb,
            pgtables_kb: k.pgtables_kb,
            source: Some(MemoryFrom::Kmsg),
        };
    }
    // The kernel's report names the victim's cgroup at the kill: it
    // corrects the model (a process that joined a cgroup and exec'd just
    // before being killed may still be in the model under its parent's).
    if let Some(m) = report.task_memcg().map(String::from).as_ref()
        && v.memcg.as_ref() != Some(m)
    {
        if let Some(old) = v.memcg.clone() {
            let from = v.memcg_source.unwrap_or(MemcgSource::Model).name();
            rec.gaps.push(Gap::Note(format!(
                "{from} had the victim in {old}; the kernel's report says {m}"
            )));
        }
        let v = &mut rec.victim;
        let o = match model {
            Some(model) => model.owner_of(m),
            None => crate::model::cgroup::owner_of(m),
        };
        v.owner = (!o.is_empty()).then_some(o);
        v.memcg = Some(m.clone());
        v.memcg_source = Some(MemcgSource::Kmsg);
    }
    // A kill line alone (a rate-limited header, a group member) names no
    // trigger: none is made up.
    if rec.trigger.is_some() || report.trigger_comm.is_some() || report.trigger_pid.is_some() {
        let trigger = rec.trigger.get_or_insert_with(Trigger::default);
        if let Some(c) = &report.trigger_comm
            && trigger.task.comm.is_empty()
        {
            trigger.task.comm = c.clone();
        }
        if let Some(pid) = report.trigger_pid
            && trigger.task.pid == 0
        {
            trigger.task.pid = pid;
        }
        trigger.gfp_mask = report.gfp_mask.clone();
        trigger.order = report.order;
    }

    let memcg_path = report
        .oom_memcg()
        .map(String::from)
        .or_else(|| report.stats_for.clone());
    if let (Some(path), Some(m)) = (&memcg_path, &report.memory) {
        rec.memcg = Some(MemcgAtKill {
            path: path.clone(),
            limit_bytes: Some(m.limit_kb * 1024).filter(|&l| l < (1 << 62)),
            usage_bytes: Some(m.usage_kb * 1024),
            failcnt: Some(m.failcnt),
            source: FiguresFrom::Kmsg,
            age_ms: None,
        });
        if let Some(sampler) = sampler {
            let lead = sampler.window(path, rec.ts_ns - LEADUP_NS);
            if !lead.is_empty() {
                rec.leadup = lead.into_iter().filter(|s| s.ts_ns <= rec.ts_ns).collect();
            }
        }
    } else if report.summary.is_some() && report.constraint() != "CONSTRAINT_MEMCG" {
        // A global OOM: the memcg figures we inferred do not apply.
        rec.memcg = None;
    } else if let Some(path) = memcg_path
        && rec.memcg.as_ref().is_none_or(|m| m.path != path)
    {
        // The kernel named the memcg whose limit was hit, without its
        // figures (a paste that starts after them): the path alone.
        rec.memcg = Some(MemcgAtKill {
            path,
            limit_bytes: None,
            usage_bytes: None,
            failcnt: None,
            source: FiguresFrom::Kmsg,
            age_ms: None,
        });
    }
    if !report.tasks.is_empty() {
        let mut tasks: Vec<TaskAtKill> = report
            .tasks
            .iter()
            .map(|t| TaskAtKill {
                pid: t.tgid,
                comm: t.name.clone(),
                rss_kb: t.rss_pages * page_kb,
                anon_kb: t.rss_anon_pages.map(|p| p * page_kb),
                file_kb: t.rss_file_pages.map(|p| p * page_kb),
                shmem_kb: t.rss_shmem_pages.map(|p| p * page_kb),
                oom_score_adj: Some(t.oom_score_adj),
                victim: t.tgid == k.pid,
                ..Default::default()
            })
            .map(|mut t| {
                // The kernel's table has names only: the model, where it
                // has the task, says what it was and where it ran.
                if let Some(m) = model {
                    name_task(m, &mut t, rec.ts_ns);
                }
                t
            })
            .collect();
        tasks.sort_by_key(|t| std::cmp::Reverse(t.rss_kb));
        tasks.dedup_by_key(|t| t.pid);
        rec.tasks = tasks;
        if report.tasks_omitted > 0 {
            rec.gaps.push(Gap::Note(format!(
                "the kernel's task table had {} more rows, left out: the {} largest tasks and those with the highest oom_score_adj are kept",
                report.tasks_omitted,
                report.tasks.len()
            )));
        }
    }
    rec.kmsg = Some(report.clone());
}

/// A kill known only from the kernel log.
pub fn kill_from_report(
    report: &OomReport,
    clock: &Clock,
    model: Option<&ProcessTable>,
) -> KillRecord {
    let ts_ns = clock.kmsg_to_wall(report.ts_us);
    // A kill from before the recorder started (the log's backlog) must not
    // take the name of whoever holds its pid now.
    let (p, reused) = model.map_or((None, false), |m| m.holder(report.killed.pid, ts_ns, None));
    let mut rec = KillRecord {
        ts_ns,
        source: Seen::default(),
        victim: victim_from(report.killed.pid, report.killed.comm.clone(), p),
        ..Default::default()
    };
    if reused {
        rec.gaps.push(reused_pid_gap(report.killed.pid));
    }
    rec.trigger = report.trigger_comm.as_ref().map(|c| Trigger {
        task: ProcRef {
            pid: report.trigger_pid.unwrap_or(0),
            comm: c.clone(),
            ..Default::default()
        },
        ..Default::default()
    });
    merge_report(&mut rec, report, None, model);
    // A kill within a cgroup's limit is never of a task in the root memory
    // cgroup, which has none: a model that says so read the task while it
    // was torn down (its cgroup gone, /proc saying `/`).
    if report.killed.memcg
        && rec.victim.memcg.as_deref() == Some("/")
        && rec.victim.memcg_source == Some(MemcgSource::Model)
    {
        rec.victim.memcg = None;
        rec.victim.memcg_source = None;
        rec.victim.owner = None;
    }
    rec.gaps.push(Gap::Note("found in the kernel log only: no lead-up samples, process details from the kernel's report".into()));
    rec
}

#[cfg(test)]
mod tests;
