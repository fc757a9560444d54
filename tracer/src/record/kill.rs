//! What tracer records about one kill: everything `explain` shows, joined
//! from the tracepoint, the kernel's OOM report, the process model and the
//! cgroup sampler. Stored as JSON; fields added later must be optional.

use serde::{Deserialize, Serialize};

use crate::{
    collect::kmsg::OomReport,
    model::{cgroup::Owner, sampler::CgroupSample},
};

/// Who killed the process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Killer {
    /// `kernel_oom` or `userspace`.
    pub kind: String,
    /// Kernel OOM constraint: `memcg`, `global`, `cpuset`, `mempolicy`.
    pub constraint: Option<String>,
    /// The process that sent the SIGKILL (userspace killers).
    pub sender: Option<ProcRef>,
    /// `si_code` of the signal.
    pub signal_code: Option<i32>,
}

/// A process as named in a report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRef {
    /// Pid.
    pub pid: u32,
    /// Name.
    pub comm: String,
    /// Command line, when known.
    pub cmdline: Option<String>,
    /// Memory cgroup, when known.
    pub memcg: Option<String>,
    /// Container, pod or unit, when recognised.
    pub owner: Option<Owner>,
}

/// Memory of the victim at the kill, kB.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VictimMemory {
    /// Anonymous RSS.
    pub anon_rss_kb: Option<u64>,
    /// File-backed RSS.
    pub file_rss_kb: Option<u64>,
    /// Shared memory RSS.
    pub shmem_rss_kb: Option<u64>,
    /// Virtual size.
    pub total_vm_kb: Option<u64>,
    /// Page tables.
    pub pgtables_kb: Option<u64>,
    /// Where the figures come from: `tracepoint`, `kmsg`, `proc`.
    pub source: Option<String>,
}

impl VictimMemory {
    /// anon + file + shmem, when all are known.
    pub fn rss_kb(&self) -> Option<u64> {
        Some(self.anon_rss_kb? + self.file_rss_kb? + self.shmem_rss_kb?)
    }
}

/// The killed process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Victim {
    /// Pid.
    pub pid: u32,
    /// Name.
    pub comm: String,
    /// Command line.
    pub cmdline: Option<String>,
    /// Executable.
    pub exe: Option<String>,
    /// Uid.
    pub uid: Option<u32>,
    /// Memory cgroup path.
    pub memcg: Option<String>,
    /// Where `memcg` comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcg_source: Option<MemcgSource>,
    /// Container, pod, unit.
    pub owner: Option<Owner>,
    /// Memory at the kill.
    pub memory: VictimMemory,
    /// oom_score_adj.
    pub oom_score_adj: Option<i32>,
    /// GPU and pinned host memory it held (traced CUDA calls), when traced.
    #[serde(default)]
    pub gpu: Option<crate::model::ledger::LedgerSummary>,
}

/// Where a victim's memory cgroup was learnt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemcgSource {
    /// From the kernel at the kill (the task's css, read by the probe).
    Kernel,
    /// From the kernel's OOM report (`task_memcg=`).
    Kmsg,
    /// From the process model (/proc, or the cgroup at exec).
    Model,
}

impl MemcgSource {
    /// The name shown in reports.
    pub fn name(self) -> &'static str {
        match self {
            MemcgSource::Kernel => "the kernel at the kill",
            MemcgSource::Kmsg => "the kernel's OOM report",
            MemcgSource::Model => "the process model",
        }
    }
}

/// The task whose allocation triggered a kernel OOM kill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    /// The task.
    pub task: ProcRef,
    /// gfp mask of the failed allocation.
    pub gfp_mask: Option<String>,
    /// Order of the failed allocation.
    pub order: Option<u32>,
}

/// The memory cgroup that ran out, at the kill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemcgAtKill {
    /// Path.
    pub path: String,
    /// Limit, bytes (`None`: no limit).
    pub limit_bytes: Option<u64>,
    /// Usage, bytes.
    pub usage_bytes: Option<u64>,
    /// Times the limit was hit.
    pub failcnt: Option<u64>,
    /// `kmsg` (the kernel's report) or `sample` (the sampler's last reading).
    pub source: String,
    /// For `sample`: how old the reading was at the kill, ms.
    pub age_ms: Option<i64>,
}

/// A task in the same memcg at the kill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskAtKill {
    /// Pid.
    pub pid: u32,
    /// Name.
    pub comm: String,
    /// RSS, kB.
    pub rss_kb: u64,
    /// Anonymous RSS, kB.
    pub anon_kb: Option<u64>,
    /// File RSS, kB.
    pub file_kb: Option<u64>,
    /// Shared memory RSS, kB.
    pub shmem_kb: Option<u64>,
    /// oom_score_adj.
    pub oom_score_adj: Option<i32>,
    /// Whether this is the victim.
    pub victim: bool,
}

/// Reaping by the kernel's oom_reaper.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reaping {
    /// Wall time reaping started, ns.
    pub start_ns: Option<i64>,
    /// Wall time reaping finished, ns.
    pub finish_ns: Option<i64>,
}

/// One recorded kill.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KillRecord {
    /// Wall time of the kill, ns since the epoch.
    pub ts_ns: i64,
    /// What saw it: `tracepoint`, `kmsg`, `signal`, joined with `+`.
    pub source: String,
    /// Who killed it.
    pub killer: Killer,
    /// The victim.
    pub victim: Victim,
    /// The task that triggered a kernel OOM kill.
    pub trigger: Option<Trigger>,
    /// The memcg that ran out (memcg OOMs) or the victim's memcg.
    pub memcg: Option<MemcgAtKill>,
    /// Tasks in that memcg with their RSS.
    pub tasks: Vec<TaskAtKill>,
    /// Samples of the memcg over the minute before the kill.
    pub leadup: Vec<CgroupSample>,
    /// OOM reaper timing.
    pub reaping: Option<Reaping>,
    /// The kernel's report, verbatim fields.
    pub kmsg: Option<OomReport>,
    /// The recording session that saw it (none for kills found only in kmsg).
    pub session_id: Option<i64>,
    /// Wall time of the kernel event that started the kill (boot clock converted).
    pub tracepoint_ns: Option<i64>,
    /// What is not known about this kill, and why.
    pub gaps: Vec<String>,
    /// NVML's picture of the GPUs the victim used, at the last sample
    /// before the kill: everyone on them, with their containers.
    #[serde(default)]
    pub gpu_picture: Vec<super::gpu::DevicePicture>,
    /// For a storm of userspace SIGKILLs past the recording rate: how many
    /// kills this one record stands for (the victim is the first of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<KillAggregate>,
}

/// Userspace kills by one sender in one memory cgroup, folded into one
/// record because they came faster than kills are recorded one by one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillAggregate {
    /// Kills folded in (the record's victim included).
    pub count: u64,
    /// Wall time of the first, ns.
    pub first_ns: i64,
    /// Wall time of the last, ns.
    pub last_ns: i64,
    /// The first victims, as (pid, name): at most [`KillAggregate::NAMED`].
    pub victims: Vec<(u32, String)>,
}

impl KillAggregate {
    /// Victims named in an aggregate.
    pub const NAMED: usize = 16;
}
