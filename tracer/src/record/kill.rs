//! What tracer records about one kill: everything `explain` shows, joined
//! from the tracepoint, the kernel's OOM report, the process model and the
//! cgroup sampler. Stored as JSON; fields added later must be optional.

use serde::{Deserialize, Serialize};

use super::process::ProcRef;
use crate::{
    collect::kmsg::OomReport,
    model::{cgroup::Owner, sampler::CgroupSample},
};

/// Who killed a process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KillerKind {
    /// The kernel's OOM killer.
    #[default]
    KernelOom,
    /// A process that sent SIGKILL.
    Userspace,
    /// No killer: a GPU process that ended abnormally just after an Xid
    /// that hits applications on its GPU (`Killer::gpu_fault`).
    GpuFault,
}

impl KillerKind {
    /// The stored name (`kernel_oom`, `userspace`).
    pub fn as_str(self) -> &'static str {
        match self {
            KillerKind::KernelOom => "kernel_oom",
            KillerKind::Userspace => "userspace",
            KillerKind::GpuFault => "gpu_fault",
        }
    }
}

/// Where a victim's memory figures come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryFrom {
    /// `oom:mark_victim`'s fields.
    Tracepoint,
    /// The kernel's OOM report.
    Kmsg,
    /// /proc/PID/status, read when the signal was seen.
    Proc,
    /// The RSS counters the exit probe read.
    Exit,
}

impl MemoryFrom {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryFrom::Tracepoint => "tracepoint",
            MemoryFrom::Kmsg => "kmsg",
            MemoryFrom::Proc => "proc",
            MemoryFrom::Exit => "exit",
        }
    }
}

/// Where a memory cgroup's figures at a kill come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FiguresFrom {
    /// The kernel's OOM report: what was charged at the kill.
    #[default]
    Kmsg,
    /// The sampler's last reading before the kill (see `age_ms`).
    Sample,
}

/// What saw a kill. Stored as the names of the sources joined with `+`
/// (`tracepoint+kmsg`), as records always were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// `oom:mark_victim`.
    pub tracepoint: bool,
    /// `signal:signal_generate`.
    pub signal: bool,
    /// The kernel's OOM report in /dev/kmsg.
    pub kmsg: bool,
    /// A userspace killer's own log line (systemd-oomd, earlyoom, kubelet).
    pub log: bool,
    /// `sched:sched_process_exit`: a process's own end (a GPU fault's).
    pub exit: bool,
}

impl Seen {
    /// Seen by the OOM tracepoint only.
    pub const TRACEPOINT: Seen = Seen {
        tracepoint: true,
        signal: false,
        kmsg: false,
        log: false,
        exit: false,
    };
    /// Seen by the signal tracepoint only.
    pub const SIGNAL: Seen = Seen {
        tracepoint: false,
        signal: true,
        kmsg: false,
        log: false,
        exit: false,
    };
    /// Seen in a userspace killer's own log line only.
    pub const LOG: Seen = Seen {
        tracepoint: false,
        signal: false,
        kmsg: false,
        log: true,
        exit: false,
    };
    /// Seen by the exit probe only.
    pub const EXIT: Seen = Seen {
        tracepoint: false,
        signal: false,
        kmsg: false,
        log: false,
        exit: true,
    };
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (self.tracepoint, "tracepoint"),
            (self.signal, "signal"),
            (self.kmsg, "kmsg"),
            (self.log, "log"),
            (self.exit, "exit"),
        ];
        let mut first = true;
        for (on, name) in names {
            if on {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

impl Serialize for Seen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Seen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let mut seen = Seen::default();
        for part in text.split('+').filter(|p| !p.is_empty()) {
            match part {
                "tracepoint" => seen.tracepoint = true,
                "signal" => seen.signal = true,
                "kmsg" => seen.kmsg = true,
                "log" => seen.log = true,
                "exit" => seen.exit = true,
                other => {
                    return Err(serde::de::Error::custom(format!(
                        "unknown kill source {other:?}"
                    )));
                }
            }
        }
        Ok(seen)
    }
}

/// Something not known about a kill, and why. Stored as its text; the
/// notes a later join removes have variants of their own, so nothing is
/// removed by matching English.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gap {
    /// Built from the tracepoint; the kernel's report has not been joined.
    AwaitingReport,
    /// The victim was gone before /proc could be read (its memory may
    /// still come from the exit probe).
    MemoryUnknown,
    /// Anything else, said as it is.
    Note(String),
}

impl Gap {
    const AWAITING_REPORT: &'static str = "waiting for the kernel's OOM report; constraint and memcg figures are inferred from samples";
    const MEMORY_UNKNOWN: &'static str =
        "the victim's memory is unknown: it was gone before /proc could be read";
}

impl From<String> for Gap {
    fn from(s: String) -> Self {
        match s.as_str() {
            Gap::AWAITING_REPORT => Gap::AwaitingReport,
            Gap::MEMORY_UNKNOWN => Gap::MemoryUnknown,
            _ => Gap::Note(s),
        }
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Gap::AwaitingReport => Gap::AWAITING_REPORT,
            Gap::MemoryUnknown => Gap::MEMORY_UNKNOWN,
            Gap::Note(s) => s,
        })
    }
}

impl Serialize for Gap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Gap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Gap::from)
    }
}

/// Who killed the process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Killer {
    /// The kernel's OOM killer, or a process that sent SIGKILL.
    pub kind: KillerKind,
    /// Kernel OOM constraint: `memcg`, `global`, `cpuset`, `mempolicy`.
    pub constraint: Option<String>,
    /// The process that sent the SIGKILL (userspace killers).
    pub sender: Option<ProcRef>,
    /// `si_code` of the signal.
    pub signal_code: Option<i32>,
    /// The signal, when it was not SIGKILL or the killer's log names it
    /// (earlyoom sends SIGTERM first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Why it killed, as the killer wrote it (a userspace OOM killer's log
    /// line: systemd-oomd's pressure, earlyoom's limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The GPU fault a process ended after ([`KillerKind::GpuFault`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_fault: Option<GpuFault>,
    /// The userspace OOM killer whose journal entry asked for this SIGKILL,
    /// when another process sent it: kubelet, through the container runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_by: Option<String>,
}

/// The Xid a GPU process ended after, and how it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFault {
    /// The GPU's PCI address, as NVML or the driver's log gave it.
    pub pci: String,
    /// The Xid.
    pub xid: super::XidNote,
    /// What the Xid means, from tracer's table of NVIDIA's catalogue.
    pub meaning: Option<String>,
    /// How the process ended: `exited with status 1`, `killed by SIGABRT`.
    pub exit: String,
}

impl GpuFault {
    /// How the process ended, after "it": `exited with status 1`, `was
    /// killed by SIGABRT`.
    pub fn ended(&self) -> String {
        match self.exit.strip_prefix("killed by ") {
            Some(sig) => format!("was killed by {sig}"),
            None => self.exit.clone(),
        }
    }
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
    /// Where the figures come from.
    pub source: Option<MemoryFrom>,
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
    /// Its heap's top allocation sites (the last snapshot before the
    /// kill), when its heap was traced (`record --host-cgroup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap: Option<super::heap::HeapSnapshot>,
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
    /// The kernel's report, or the sampler's last reading.
    pub source: FiguresFrom,
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
    /// Its command line, from the process model, when known (cut at
    /// [`TaskAtKill::CMDLINE_KEPT`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// Where it ran, from the process model: its pod's container, its
    /// container or unit, or its memory cgroup (a child of the one at its
    /// limit, in a pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<String>,
}

impl TaskAtKill {
    /// Bytes of a task's command line kept.
    pub const CMDLINE_KEPT: usize = 256;
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
    /// What saw it (stored as `tracepoint`, `kmsg`, `signal`, joined with `+`).
    pub source: Seen,
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
    pub gaps: Vec<Gap>,
    /// Its time stamp in the log it came from could not be read (out of
    /// range): `ts_ns` is only the last readable time before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time_unreadable: bool,
    /// NVML's picture of the GPUs the victim used, at the last sample
    /// before the kill: everyone on them, with their containers.
    #[serde(default)]
    pub gpu_picture: Vec<super::gpu::DevicePicture>,
    /// For a storm of userspace SIGKILLs past the recording rate: how many
    /// kills this one record stands for (the victim is the first of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<KillAggregate>,
    /// Where the victim's memory grew in the window before the kill
    /// (sampled page faults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<super::growth::GrowthReport>,
    /// Where the neighbour the verdict blames (see
    /// [`KillRecord::biggest_neighbour`]) grew in the same window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_growth: Option<super::growth::GrowthReport>,
    /// With `--growth risk`: the armed cgroup the kill happened in, and
    /// since when (growth before that was not sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_armed: Option<super::growth::GrowthArmed>,
    /// The picture of its armed cgroup's processes taken as it armed: a
    /// "before" for the growth up to the kill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picture: Option<super::growth::Picture>,
    /// The allocation that hit the limit: the stack of the task that
    /// triggered a kernel OOM kill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tipping_stack: Option<super::growth::TipStack>,
    /// The cgroup with `memory.oom.group` set whose every task the kernel
    /// killed together, this one among them (one incident, several kills).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_group: Option<String>,
    /// The early warning about its memory cgroup (or one above it) that
    /// was standing when it was killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<super::warning::PressureEvent>,
    /// The slow leak of its memory cgroup (or one above it), where one was
    /// found before the kill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leak: Option<super::leak::Leak>,
}

impl Killer {
    /// Who killed, in a word: `kernel_oom`, a userspace OOM killer known
    /// by its name (`systemd_oomd`, `kubelet`, `earlyoom`), or `process`
    /// (a SIGKILL from any other process, or one the kernel generated for
    /// the victim itself).
    pub fn name(&self) -> &'static str {
        match self.kind {
            KillerKind::KernelOom => "kernel_oom",
            KillerKind::Userspace => match self
                .asked_by
                .as_deref()
                .or(self.sender.as_ref().map(|s| s.comm.as_str()))
            {
                Some("systemd-oomd") => "systemd_oomd",
                Some("kubelet") => "kubelet",
                Some("earlyoom") => "earlyoom",
                Some("nohang") => "nohang",
                Some(crate::collect::killers::nohang::TALOS) => "talos_oom",
                _ => "process",
            },
            KillerKind::GpuFault => "gpu_fault",
        }
    }
}

impl KillRecord {
    /// The biggest other task at the kill, when it held more than the
    /// victim: the neighbour a verdict blames for the kill.
    pub fn biggest_neighbour(&self) -> Option<&TaskAtKill> {
        let victim_kb = self
            .victim
            .memory
            .rss_kb()
            .or_else(|| self.tasks.iter().find(|t| t.victim).map(|t| t.rss_kb))?;
        self.tasks
            .iter()
            .filter(|t| !t.victim && t.pid != self.victim.pid)
            .max_by_key(|t| t.rss_kb)
            .filter(|t| t.rss_kb > victim_kb)
    }

    /// Its memory cgroup: the one the kernel named at the kill, else the
    /// victim's own.
    pub fn cgroup(&self) -> Option<&str> {
        self.memcg
            .as_ref()
            .map(|m| m.path.as_str())
            .or(self.victim.memcg.as_deref())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_strings_read_back_as_the_same_states() {
        for text in [
            "tracepoint",
            "kmsg",
            "signal",
            "tracepoint+kmsg",
            "signal+kmsg",
        ] {
            let seen: Seen = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(serde_json::to_value(seen).unwrap(), text);
        }
        assert!(serde_json::from_value::<Seen>(serde_json::json!("radar")).is_err());
        let gaps: Vec<Gap> = serde_json::from_value(serde_json::json!([
            Gap::AWAITING_REPORT,
            Gap::MEMORY_UNKNOWN,
            "something else"
        ]))
        .unwrap();
        assert_eq!(
            gaps,
            [
                Gap::AwaitingReport,
                Gap::MemoryUnknown,
                Gap::Note("something else".into())
            ]
        );
        assert_eq!(
            serde_json::to_value(&gaps).unwrap(),
            serde_json::json!([Gap::AWAITING_REPORT, Gap::MEMORY_UNKNOWN, "something else"])
        );
        let k: Killer = serde_json::from_value(serde_json::json!({
            "kind": "userspace", "constraint": null, "sender": null, "signal_code": 0
        }))
        .unwrap();
        assert_eq!(k.kind, KillerKind::Userspace);
    }

    /// A kill record as the string-typed code wrote it: it reads back and
    /// is written out again byte for byte the same JSON.
    #[test]
    fn a_record_written_before_the_enums_round_trips_unchanged() {
        let old = serde_json::json!({
            "ts_ns": 1796229780985216899i64,
            "source": "tracepoint+kmsg",
            "killer": {"kind": "kernel_oom", "constraint": "memcg", "sender": null, "signal_code": null},
            "victim": {
                "pid": 31737, "comm": "memhog", "cmdline": "memhog --step-mib 2", "exe": "/bin/memhog",
                "uid": 0, "memcg": "/job", "owner": null,
                "memory": {"anon_rss_kb": 81408, "file_rss_kb": 1680, "shmem_rss_kb": 0,
                           "total_vm_kb": 85028, "pgtables_kb": 216, "source": "tracepoint"},
                "oom_score_adj": 0, "gpu": null
            },
            "trigger": null,
            "memcg": {"path": "/job", "limit_bytes": 67108864u64, "usage_bytes": 67108864u64,
                      "failcnt": 26, "source": "sample", "age_ms": 230},
            "tasks": [],
            "leadup": [],
            "reaping": null,
            "kmsg": null,
            "session_id": 1,
            "tracepoint_ns": 1796229780985216899i64,
            "gaps": ["the victim's memory is unknown: it was gone before /proc could be read", "found in the kernel log only"],
            "gpu_picture": []
        });
        let rec: KillRecord = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(
            rec.source,
            Seen {
                tracepoint: true,
                signal: false,
                kmsg: true,
                log: false,
                exit: false,
            }
        );
        assert_eq!(rec.victim.memory.source, Some(MemoryFrom::Tracepoint));
        assert_eq!(rec.memcg.as_ref().unwrap().source, FiguresFrom::Sample);
        assert_eq!(rec.gaps[0], Gap::MemoryUnknown);
        assert_eq!(serde_json::to_value(&rec).unwrap(), old);
    }
}
