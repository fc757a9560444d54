//! `explain`: turns a recorded kill into a report a person can act on, in
//! text or JSON, with a short verdict and everything that is not known.

pub mod gpu;
pub mod loops;
mod text;
pub mod xid;

pub(crate) use text::one_line;
use text::*;
pub use text::{DEFAULT_DEPTH, frame_chain, render_text, set_depth, site_figure};

use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    record::{FiguresFrom, KillRecord, KillerKind, TaskAtKill},
    store::{DropRow, Session},
    util::units::bytes,
};

/// Why a process died, in a word (stored and printed as snake_case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The victim grew into the limit itself.
    OwnGrowth,
    /// A single neighbour in its cgroup held more than it.
    Neighbour,
    /// No neighbour alone, but the rest of the cgroup together, held more.
    Neighbours,
    /// The whole node (or a cpuset / memory policy) ran out.
    NodePressure,
    /// Page cache or shared memory, not the tasks' anonymous memory.
    PageCacheShmem,
    /// A process sent SIGKILL.
    UserspaceKill,
    /// Killed with every task of its cgroup (`memory.oom.group`), not the
    /// task the kernel chose.
    OomGroup,
    /// A GPU process ended just after an Xid that hits applications on
    /// its GPU.
    GpuFault,
    /// Not enough is known.
    Unknown,
}

/// The short answer: why it died.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The cause, in a word.
    pub cause: Cause,
    /// One or two sentences.
    pub summary: String,
}

/// A kill with everything `explain` prints about it.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    /// Store id (none for `--kmsg`).
    pub id: Option<i64>,
    /// The record.
    pub kill: KillRecord,
    /// The verdict.
    pub verdict: Verdict,
    /// Events the probes lost around the kill.
    pub drops: Vec<DropRow>,
    /// Whether a recorder was running at the time (None: not known, or
    /// not asked).
    pub recorder_running: Option<bool>,
    /// When that is not known: the last heartbeat of a recorder that
    /// stopped without closing its session came this many seconds before
    /// the kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_s: Option<f64>,
    /// The kills of its `memory.oom.group` incident (itself included),
    /// in the order the kernel killed them; empty outside one.
    /// At most [`INCIDENT_LISTED`] of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub incident: Vec<IncidentKill>,
    /// How many kills the incident had in all (0 outside one).
    #[serde(skip_serializing_if = "is_zero")]
    pub incident_kills: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One kill of a `memory.oom.group` incident.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IncidentKill {
    /// Store id (none outside the store).
    pub id: Option<i64>,
    /// Victim pid.
    pub pid: u32,
    /// Victim name.
    pub comm: String,
}

/// Kills of one `memory.oom.group` incident are this close in time.
const INCIDENT_SPAN_NS: i64 = 5_000_000_000;

/// Kills of an incident listed by name: the first ones the kernel made
/// (and the explained one). An incident of thousands of kills is counted,
/// not listed, so that `--all` over it stays linear.
pub const INCIDENT_LISTED: usize = 16;

impl Explanation {
    /// Fills the incident of a kill made by `memory.oom.group` from
    /// `near` (kills around it, with their store ids), and says so in the
    /// verdict.
    pub fn join_incident<'a>(
        &mut self,
        near: impl IntoIterator<Item = (Option<i64>, &'a KillRecord)>,
    ) {
        let Some(group) = self.kill.oom_group.clone() else {
            return;
        };
        let mut all: Vec<(i64, IncidentKill)> = near
            .into_iter()
            .filter(|(_, k)| {
                k.oom_group.as_deref() == Some(group.as_str())
                    && (k.ts_ns - self.kill.ts_ns).abs() <= INCIDENT_SPAN_NS
            })
            .map(|(id, k)| (k.ts_ns, IncidentKill::of(id, k)))
            .collect();
        all.sort_by_key(|(ts, k)| (*ts, k.pid));
        all.dedup_by_key(|(_, k)| k.pid);
        let total = all.len();
        let first = all
            .into_iter()
            .map(|(_, k)| k)
            .take(INCIDENT_LISTED)
            .collect();
        self.set_incident(&group, first, total);
    }

    /// The incident of this kill: the first kills of it (in the order the
    /// kernel made them; this one is added when not among them) and how
    /// many it had in all; the verdict says so.
    pub fn set_incident(&mut self, group: &str, first: Vec<IncidentKill>, total: usize) {
        let mut listed = first;
        let mut total = total;
        if !listed.iter().any(|k| k.pid == self.kill.victim.pid) {
            let me = IncidentKill::of(self.id, &self.kill);
            if listed.len() >= INCIDENT_LISTED {
                listed.pop();
            } else if listed.len() == total {
                total += 1;
            }
            listed.push(me);
        }
        total = total.max(listed.len());
        self.incident = listed;
        self.incident_kills = total;
        // The other kills' records are as stored: their names are escaped
        // here (the verdict is printed to terminals).
        let esc = |s: &str| crate::util::term::escape(s).into_owned();
        let mut names = self
            .incident
            .iter()
            .map(|k| format!("{} (pid {})", esc(&k.comm), k.pid))
            .collect::<Vec<_>>()
            .join(", ");
        if total > self.incident.len() {
            let _ = write!(names, " and {} more", total - self.incident.len());
        }
        let plural = if total == 1 { "" } else { "s" };
        let chosen = &self.incident[0];
        if chosen.pid == self.kill.victim.pid {
            let _ = write!(
                self.verdict.summary,
                "; memory.oom.group is set on {}, so the kernel killed every task in it as one incident ({total} kill{plural} known: {names})",
                esc(group)
            );
        } else {
            self.verdict = Verdict {
                cause: Cause::OomGroup,
                summary: format!(
                    "killed with its group, not for its own memory: memory.oom.group is set on {}, so when the kernel chose {} (pid {}) it killed every task in it as one incident ({total} kill{plural} known: {names})",
                    esc(group),
                    esc(&chosen.comm),
                    chosen.pid
                ),
            };
        }
    }
}

impl IncidentKill {
    fn of(id: Option<i64>, k: &KillRecord) -> Self {
        Self {
            id,
            pid: k.victim.pid,
            comm: k.victim.comm.clone(),
        }
    }
}

/// The `memory.oom.group` incidents of a list of kills (a whole log),
/// indexed once: each kill's incident is then found in O(log n), where
/// [`Explanation::join_incident`] would scan every kill for each.
pub struct Incidents<'a> {
    /// Per group: its kills by (time, pid), each pid once.
    by_group: std::collections::HashMap<&'a str, Vec<&'a KillRecord>>,
}

impl<'a> Incidents<'a> {
    /// The index of `kills`.
    pub fn new(kills: &'a [KillRecord]) -> Self {
        let mut by_group: std::collections::HashMap<&str, Vec<&KillRecord>> =
            std::collections::HashMap::new();
        for k in kills {
            if let Some(g) = k.oom_group.as_deref() {
                by_group.entry(g).or_default().push(k);
            }
        }
        for v in by_group.values_mut() {
            v.sort_by_key(|k| (k.ts_ns, k.victim.pid));
            v.dedup_by_key(|k| k.victim.pid);
        }
        Self { by_group }
    }

    /// Fills `e`'s incident, when its kill was made by `memory.oom.group`.
    pub fn join(&self, e: &mut Explanation) {
        let Some(group) = e.kill.oom_group.clone() else {
            return;
        };
        let Some(kills) = self.by_group.get(group.as_str()) else {
            return;
        };
        let ts = e.kill.ts_ns;
        let lo = kills.partition_point(|k| k.ts_ns < ts - INCIDENT_SPAN_NS);
        let hi = kills.partition_point(|k| k.ts_ns <= ts + INCIDENT_SPAN_NS);
        let window = &kills[lo..hi];
        let first = window
            .iter()
            .take(INCIDENT_LISTED)
            .map(|k| IncidentKill::of(None, k))
            .collect();
        e.set_incident(&group, first, window.len());
    }
}

/// `  [docker 8f3c5d9e0b1a, pod ...]` for an owner, or nothing.
pub fn owner_tag(owner: Option<&crate::model::cgroup::Owner>) -> String {
    owner
        .and_then(|o| o.short())
        .map(|s| format!("  [{s}]"))
        .unwrap_or_default()
}

/// Growth of the memcg up to the kill: (first, last, bytes per second).
/// It starts after the lead-up's last fall (the previous kill of a crash
/// loop, a restart: what came before it was another life), and ends at the
/// kernel's own figure at the kill where its report gave one (a burst
/// shorter than the sampling period shows there, not in the samples).
pub fn growth(k: &KillRecord) -> Option<(u64, u64, f64)> {
    let samples = &k.leadup;
    // A fall of a quarter or more of what was charged.
    let start = (1..samples.len())
        .rev()
        .find(|&i| samples[i].usage_bytes * 4 < samples[i - 1].usage_bytes * 3)
        .unwrap_or(0);
    let first = samples.get(start)?;
    let at_kill = k
        .memcg
        .as_ref()
        .filter(|m| m.source == FiguresFrom::Kmsg)
        .and_then(|m| m.usage_bytes)
        .filter(|_| k.ts_ns > first.ts_ns);
    let (last_ns, last) = match (at_kill, samples.last()) {
        (Some(u), _) => (k.ts_ns, u),
        (None, Some(s)) => (s.ts_ns, s.usage_bytes),
        (None, None) => return None,
    };
    let dt = (last_ns - first.ts_ns) as f64 / 1e9;
    (dt > 0.0).then(|| {
        (
            first.usage_bytes,
            last,
            (last as f64 - first.usage_bytes as f64) / dt,
        )
    })
}

/// Decides the verdict from what was recorded, with a note when the
/// victim's pinned (page-locked) CUDA host memory is a large part of what its
/// cgroup was charged.
pub fn verdict(k: &KillRecord) -> Verdict {
    let mut v = base_verdict(k);
    let pinned = k
        .victim
        .gpu
        .as_ref()
        .and_then(|g| g.by_kind.get(&crate::model::ledger::AllocKind::PinnedHost))
        .map(|t| t.outstanding);
    let usage = k.memcg.as_ref().and_then(|m| m.usage_bytes);
    if let (Some(p), Some(u)) = (pinned, usage)
        && u > 0
        && p * 10 >= u
    {
        let _ = write!(
            v.summary,
            "; {} of it was pinned CUDA host memory ({:.0}% of the cgroup's usage), which counts against the memory limit",
            bytes(p),
            p as f64 * 100.0 / u as f64
        );
    }
    v
}

/// A userspace killer's reason, shorter where its shape is known:
/// systemd-oomd's `memory pressure for M being 51.07% > 50.00% for > 20s
/// with reclaim activity` reads `memory pressure 51.07% > 50.00% for 20s
/// on M`.
fn killer_reason(why: &str) -> String {
    if let Some(rest) = why.strip_prefix("memory pressure for ")
        && let Some((cgroup, rest)) = rest.split_once(" being ")
        && let Some((figures, rest)) = rest.split_once(" for > ")
    {
        let span = rest.split_whitespace().next().unwrap_or(rest);
        return format!("memory pressure {figures} for {span} on {cgroup}");
    }
    why.to_string()
}

/// A SIGKILL the kernel generated for the victim itself (a BPF program's
/// bpf_send_signal, a kernel limit), not the OOM killer's.
fn self_kill(k: &KillRecord) -> bool {
    k.killer.kind == KillerKind::Userspace
        && k.killer.signal_code == Some(crate::correlate::SI_KERNEL)
        && k.killer
            .sender
            .as_ref()
            .is_some_and(|s| s.pid == k.victim.pid)
}

fn base_verdict(k: &KillRecord) -> Verdict {
    if let Some(f) = &k.killer.gpu_fault {
        let after = (k.ts_ns - f.xid.ts_ns) as f64 / 1e9;
        let what = f
            .meaning
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default();
        return Verdict {
            cause: Cause::GpuFault,
            summary: format!(
                "died from a GPU fault: Xid {}{what} on GPU {}, {after:.1} s before it {}; not killed for memory",
                f.xid.code,
                f.pci,
                f.exit
                    .strip_prefix("killed by ")
                    .map_or_else(|| f.exit.clone(), |s| format!("was killed by {s}"))
            ),
        };
    }
    if self_kill(k) {
        return Verdict {
            cause: Cause::UserspaceKill,
            summary: "killed by a BPF program (bpf_send_signal: BPF-LSM or tracing enforcement) or a kernel limit such as RLIMIT_CPU: a SIGKILL the kernel generated for the process itself, neither from kill(2) nor from the OOM killer".into(),
        };
    }
    if k.killer.kind == KillerKind::Userspace {
        let s = k.killer.sender.as_ref();
        let who = s
            .map(|s| match s.pid {
                0 => s.comm.clone(),
                p => format!("{} (pid {p})", s.comm),
            })
            .unwrap_or_else(|| "an unknown process".into());
        let who = match &k.killer.asked_by {
            Some(by) => format!("{by} through {who}"),
            None => who,
        };
        let signal = k.killer.signal.as_deref().unwrap_or("SIGKILL");
        let summary = match (&k.aggregate, &k.killer.reason) {
            (Some(a), _) => format!(
                "{} processes killed by {who} with SIGKILL, not by the kernel OOM killer",
                a.count
            ),
            // A killer's own log line may not name the signal.
            (None, Some(why)) => {
                let with = k
                    .killer
                    .signal
                    .as_deref()
                    .map(|s| format!("with {s}, "))
                    .unwrap_or_default();
                format!(
                    "killed by {who}: {}; {with}not by the kernel OOM killer",
                    killer_reason(why)
                )
            }
            (None, None) => format!("killed by {who} with {signal}, not by the kernel OOM killer"),
        };
        return Verdict {
            cause: Cause::UserspaceKill,
            summary,
        };
    }
    let victim_kb = k
        .victim
        .memory
        .rss_kb()
        .or_else(|| k.tasks.iter().find(|t| t.victim).map(|t| t.rss_kb));
    let Some(constraint) = k.killer.constraint.as_deref() else {
        return Verdict {
            cause: Cause::Unknown,
            summary: "killed by the kernel's OOM killer; whether the node or a memory cgroup ran out is not in the log (its lines before the kill are missing)".into(),
        };
    };
    if constraint == "global" {
        let held = victim_kb
            .map(|v| format!("; the victim held {} of RSS", bytes(v * 1024)))
            .unwrap_or_default();
        return Verdict {
            cause: Cause::NodePressure,
            summary: format!("the whole node ran out of memory{held}"),
        };
    }
    if constraint != "memcg" {
        return Verdict {
            cause: Cause::NodePressure,
            summary: format!(
                "allocation failed under a {constraint} constraint (restricted NUMA nodes)"
            ),
        };
    }
    let usage_kb = k
        .memcg
        .as_ref()
        .and_then(|m| m.usage_bytes)
        .map(|b| b / 1024);
    let mem = &k.victim.memory;
    if let (Some(shmem), Some(anon)) = (mem.shmem_rss_kb, mem.anon_rss_kb)
        && shmem > anon
    {
        return Verdict {
            cause: Cause::PageCacheShmem,
            summary: format!(
                "shared memory: the victim's shmem RSS ({}) exceeds its anonymous memory ({})",
                kb(Some(shmem)),
                kb(Some(anon))
            ),
        };
    }
    let tasks_kb: u64 = k.tasks.iter().map(|t| t.rss_kb).sum();
    if let Some(usage) = usage_kb
        && usage > 0
        && tasks_kb * 2 < usage
    {
        return Verdict {
            cause: Cause::PageCacheShmem,
            summary: format!(
                "page cache or shared memory: the tasks' RSS ({}) is under half of the cgroup's usage ({})",
                kb(Some(tasks_kb)),
                kb(Some(usage))
            ),
        };
    }
    let neighbours: Vec<&TaskAtKill> = k
        .tasks
        .iter()
        .filter(|t| !t.victim && t.pid != k.victim.pid)
        .collect();
    let neighbour_kb: u64 = neighbours.iter().map(|t| t.rss_kb).sum();
    let Some(victim_kb) = victim_kb else {
        return Verdict {
            cause: Cause::Unknown,
            summary: "the victim's memory at the kill is unknown".into(),
        };
    };
    // A sampler's reading is not what the kernel charged at the kill: say
    // how old it was.
    let sampled = k
        .memcg
        .as_ref()
        .filter(|m| m.source == FiguresFrom::Sample)
        .map(|m| {
            m.age_ms
                .map(|a| format!(" {a} ms before the kill"))
                .unwrap_or_default()
        });
    let share = usage_kb
        .filter(|&u| u > 0)
        .map(|u| {
            // RSS counts shared file pages the cgroup may not be charged
            // for: past 100% show the two figures instead of a share.
            let pct = victim_kb as f64 * 100.0 / u as f64;
            match (&sampled, pct <= 100.0) {
                (None, true) => format!(" ({pct:.0}% of the cgroup's usage)"),
                (None, false) => format!(" (the cgroup was charged {})", bytes(u * 1024)),
                (Some(age), true) => {
                    format!(" ({pct:.0}% of the cgroup's usage as last sampled,{age})")
                }
                (Some(age), false) => format!(
                    " (the cgroup's last sample,{age}, showed {})",
                    bytes(u * 1024)
                ),
            }
        })
        .unwrap_or_default();
    let grew = growth(k)
        .filter(|(a, b, _)| b > a)
        .map(|(a, b, rate)| {
            format!(
                "; the cgroup grew from {} to {} at {}/s before the kill",
                bytes(a),
                bytes(b),
                bytes(rate as u64)
            )
        })
        .unwrap_or_default();
    if let Some(big) = k.biggest_neighbour() {
        return Verdict {
            cause: Cause::Neighbour,
            summary: format!(
                "a neighbour in the same cgroup: {}{} held {}, the victim only {}{grew}{}{}",
                big.comm,
                neighbour_said(big),
                bytes(big.rss_kb * 1024),
                bytes(victim_kb * 1024),
                why_not_the_neighbour(k, big),
                k.tipping_stack
                    .as_ref()
                    .filter(|t| t.pid == big.pid && !t.frames.is_empty())
                    .map(|t| format!(
                        "; the allocation that hit the limit was the neighbour's: {}",
                        frame_chain(&t.frames)
                    ))
                    .unwrap_or_default()
            ),
        };
    }
    if victim_kb >= neighbour_kb {
        Verdict {
            cause: Cause::OwnGrowth,
            summary: format!(
                "the victim's own growth: it held {}{share}, more than the rest of its cgroup together{grew}",
                bytes(victim_kb * 1024)
            ),
        }
    } else {
        // No single neighbour held more than the victim, but together they did.
        Verdict {
            cause: Cause::Neighbours,
            summary: format!(
                "the rest of the cgroup together: {} other tasks held {}, the victim {} (the largest of the others held {}){grew}",
                neighbours.len(),
                bytes(neighbour_kb * 1024),
                bytes(victim_kb * 1024),
                bytes(neighbours.iter().map(|t| t.rss_kb).max().unwrap_or(0) * 1024)
            ),
        }
    }
}

/// ` (pid N, `cmd`, in PLACE)`: a neighbour as the model knew it.
fn neighbour_said(t: &TaskAtKill) -> String {
    let mut s = format!(" (pid {}", t.pid);
    if let Some(c) = &t.cmdline {
        let c = one_line(c, 80);
        s.push_str(&format!(", `{c}`"));
    }
    if let Some(p) = &t.place {
        s.push_str(&format!(", in {p}"));
    }
    s.push(')');
    s
}

/// Why the kernel chose the smaller victim over `big`, where
/// oom_score_adj says: the kernel adds adj/1000 of the memory the cgroup
/// may use to each task's score, and never chooses a task at -1000.
fn why_not_the_neighbour(k: &KillRecord, big: &TaskAtKill) -> String {
    let victim_adj = k
        .tasks
        .iter()
        .find(|t| t.victim || t.pid == k.victim.pid)
        .and_then(|t| t.oom_score_adj)
        .or(k.victim.oom_score_adj);
    match (victim_adj, big.oom_score_adj) {
        (_, Some(-1000)) => format!(
            "; the kernel chose the victim because it never chooses {} (oom_score_adj -1000)",
            big.comm
        ),
        (Some(v), Some(n)) if v > n => format!(
            "; the kernel chose the victim because its oom_score_adj ({v}) is higher than {}'s ({n}): \
             each point adds a thousandth of the memory the cgroup may use to a task's score \
             (kubelet sets it by QoS class: BestEffort 1000, Burstable 2 to 999, Guaranteed -997)",
            big.comm
        ),
        _ => String::new(),
    }
}

/// A session that died without a clean end is taken to have run until this
/// long after its last heartbeat (it beats every sampling tick, 1 s).
pub const HEARTBEAT_GRACE_NS: i64 = 3_000_000_000;

/// Whether a recorder was running at a kill, as the store's sessions say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Coverage {
    /// A session covered it: closed after it, or beating after it.
    Running,
    /// The last heartbeat of a session that never closed (a crash, a
    /// SIGKILL, a power cut) came this long before it, within
    /// [`HEARTBEAT_GRACE_NS`]: whether it was still recording is unknown.
    Unknown {
        /// Nanoseconds from the last heartbeat to the kill.
        since_heartbeat_ns: i64,
    },
    /// No session covered it.
    NotRunning,
}

/// Whether a session covered `ts_ns`.
pub fn coverage(sessions: &[Session], ts_ns: i64) -> Coverage {
    let mut unknown: Option<i64> = None;
    for s in sessions.iter().filter(|s| s.started_ns <= ts_ns) {
        match s.ended_ns {
            Some(end) if ts_ns <= end => return Coverage::Running,
            None if ts_ns <= s.last_seen_ns => return Coverage::Running,
            None if ts_ns <= s.last_seen_ns + HEARTBEAT_GRACE_NS => {
                let since = ts_ns - s.last_seen_ns;
                unknown = Some(unknown.map_or(since, |u| u.min(since)));
            }
            _ => {}
        }
    }
    match unknown {
        Some(since_heartbeat_ns) => Coverage::Unknown { since_heartbeat_ns },
        None => Coverage::NotRunning,
    }
}

/// Whether a session surely covered `ts_ns` (see [`coverage`]).
pub fn recorder_running(sessions: &[Session], ts_ns: i64) -> bool {
    coverage(sessions, ts_ns) == Coverage::Running
}

/// Builds the explanation of a kill.
pub fn explain(
    id: Option<i64>,
    kill: KillRecord,
    drops: Vec<DropRow>,
    recorder_running: Option<bool>,
) -> Explanation {
    let verdict = verdict(&kill);
    Explanation {
        id,
        kill,
        verdict,
        drops,
        recorder_running,
        last_heartbeat_s: None,
        incident: Vec::new(),
        incident_kills: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_leaves_out_the_previous_kill_and_ends_at_the_kernels_figure() {
        const MIB: u64 = 1 << 20;
        let t0 = 1_750_000_000_000_000_000i64;
        let sample = |s: i64, mib: u64| crate::model::sampler::CgroupSample {
            ts_ns: t0 + s * 1_000_000_000,
            usage_bytes: mib * MIB,
            ..Default::default()
        };
        // A crash loop: the previous life grew to 100 MiB and was killed
        // at +4 s; this one grew 10 MiB/s from +5 s.
        let mut k = KillRecord {
            ts_ns: t0 + 9_000_000_000,
            leadup: vec![
                sample(0, 60),
                sample(2, 80),
                sample(4, 100),
                sample(5, 5),
                sample(7, 25),
                sample(8, 35),
            ],
            ..Default::default()
        };
        let (a, b, rate) = growth(&k).unwrap();
        assert_eq!((a, b), (5 * MIB, 35 * MIB));
        assert!((rate - 10.0 * MIB as f64).abs() < 1.0, "{rate}");
        // The kernel's report at the kill: a burst after the last sample.
        k.memcg = Some(crate::record::MemcgAtKill {
            path: "/job".into(),
            usage_bytes: Some(100 * MIB),
            limit_bytes: Some(100 * MIB),
            source: FiguresFrom::Kmsg,
            ..Default::default()
        });
        let (a, b, rate) = growth(&k).unwrap();
        assert_eq!((a, b), (5 * MIB, 100 * MIB));
        assert!((rate - 23.75 * MIB as f64).abs() < 1.0, "{rate}");
        // Only a sample's figure is not the kernel's: the samples decide.
        k.memcg.as_mut().unwrap().source = FiguresFrom::Sample;
        assert_eq!(growth(&k).unwrap().1, 35 * MIB);
    }
    use crate::record::{Killer, MemcgAtKill, Victim, VictimMemory};

    fn task(pid: u32, rss_kb: u64, victim: bool) -> TaskAtKill {
        TaskAtKill {
            pid,
            comm: format!("t{pid}"),
            rss_kb,
            victim,
            ..Default::default()
        }
    }

    fn memcg_kill(victim_kb: u64, tasks: Vec<TaskAtKill>, usage_kb: u64) -> KillRecord {
        KillRecord {
            killer: Killer {
                kind: KillerKind::KernelOom,
                constraint: Some("memcg".into()),
                ..Default::default()
            },
            victim: Victim {
                pid: 1,
                comm: "big".into(),
                memory: VictimMemory {
                    anon_rss_kb: Some(victim_kb),
                    file_rss_kb: Some(0),
                    shmem_rss_kb: Some(0),
                    ..Default::default()
                },
                ..Default::default()
            },
            memcg: Some(MemcgAtKill {
                path: "/x".into(),
                usage_bytes: Some(usage_kb * 1024),
                source: FiguresFrom::Kmsg,
                ..Default::default()
            }),
            tasks,
            ..Default::default()
        }
    }

    #[test]
    fn no_neighbour_is_blamed_for_less_than_the_victim_held() {
        // Three small neighbours together outweigh the victim; none alone does.
        let k = memcg_kill(
            20_000,
            vec![
                task(1, 20_000, true),
                task(2, 9_000, false),
                task(3, 9_000, false),
                task(4, 9_000, false),
            ],
            48_000,
        );
        let v = verdict(&k);
        assert_eq!(v.cause, Cause::Neighbours, "{}", v.summary);
        assert!(v.summary.contains("3 other tasks"), "{}", v.summary);
    }

    #[test]
    fn a_sampled_usage_is_not_said_to_be_what_the_kernel_charged() {
        let mut k = memcg_kill(70_000, vec![task(1, 70_000, true)], 60_000);
        let kernel = verdict(&k).summary;
        assert!(kernel.contains("the cgroup was charged"), "{kernel}");
        let m = k.memcg.as_mut().unwrap();
        m.source = FiguresFrom::Sample;
        m.age_ms = Some(830);
        let sampled = verdict(&k).summary;
        assert!(!sampled.contains("was charged"), "{sampled}");
        assert!(
            sampled.contains("last sample, 830 ms before the kill"),
            "{sampled}"
        );
    }

    #[test]
    fn verdicts() {
        let own = memcg_kill(
            50_000,
            vec![task(1, 50_000, true), task(2, 10_000, false)],
            62_000,
        );
        assert_eq!(verdict(&own).cause, Cause::OwnGrowth);
        let neighbour = memcg_kill(
            5_000,
            vec![task(1, 5_000, true), task(2, 55_000, false)],
            62_000,
        );
        let v = verdict(&neighbour);
        assert_eq!(v.cause, Cause::Neighbour);
        assert!(v.summary.contains("t2 (pid 2)"), "{}", v.summary);
        let cache = memcg_kill(5_000, vec![task(1, 5_000, true)], 60_000);
        assert_eq!(verdict(&cache).cause, Cause::PageCacheShmem);
        let mut global = own.clone();
        global.killer.constraint = Some("global".into());
        assert_eq!(verdict(&global).cause, Cause::NodePressure);
        let mut shm = own.clone();
        shm.victim.memory.shmem_rss_kb = Some(80_000);
        assert_eq!(verdict(&shm).cause, Cause::PageCacheShmem);
        let mut user = own;
        user.killer = Killer {
            kind: KillerKind::Userspace,
            ..Default::default()
        };
        assert_eq!(verdict(&user).cause, Cause::UserspaceKill);
    }

    #[test]
    fn recorder_coverage() {
        let s = [Session {
            id: 1,
            started_ns: 100,
            last_seen_ns: 200,
            ended_ns: None,
        }];
        assert!(recorder_running(&s, 150));
        assert_eq!(
            coverage(&s, 200 + 2_000_000_000),
            Coverage::Unknown {
                since_heartbeat_ns: 2_000_000_000
            },
            "after a crashed recorder's last heartbeat: not known, never running"
        );
        assert!(!recorder_running(&s, 200 + 2_000_000_000));
        assert!(
            !recorder_running(&s, 200 + 5_000_000_000),
            "a crashed recorder's downtime is not covered"
        );
        assert!(!recorder_running(&s, 50));
        let ended = [Session {
            id: 1,
            started_ns: 100,
            last_seen_ns: 200,
            ended_ns: Some(200),
        }];
        assert!(!recorder_running(&ended, 300));
    }

    #[test]
    fn text_never_shows_capacity_as_size_and_lists_tasks() {
        let k = memcg_kill(
            50_000,
            vec![task(1, 50_000, true), task(2, 10_000, false)],
            62_000,
        );
        let text = render_text(&explain(Some(1), k, vec![], Some(true)));
        assert!(text.contains("RSS 48.8 MiB"), "{text}");
        assert!(text.contains("<- victim"));
        assert!(text.contains("t2"));
        assert!(text.contains("verdict    the victim's own growth"));
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(64 << 20), "64.0 MiB");
    }
}
