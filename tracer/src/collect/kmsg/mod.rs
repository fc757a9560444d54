//! The kernel's own OOM report, from /dev/kmsg: the `invoked oom-killer`
//! header, the memcg usage/limit/failcnt lines, the memcg stats, the
//! `Tasks state` table, the `oom-kill:` summary and the `Killed process`
//! line, assembled into one [`OomReport`] per kill. This is also what lets
//! `explain` work for kills the recorder did not witness.
//!
//! Formats: mm/oom_kill.c (`dump_header`, `dump_tasks`, `dump_oom_summary`,
//! `__oom_kill_process`), mm/memcontrol.c and mm/memcontrol-v1.c
//! (`mem_cgroup_print_oom_meminfo`), across 4.19 to 6.18.

use std::{collections::BTreeMap, io};

mod device;
mod lines;
#[cfg(test)]
mod tests;
mod xid;

pub use device::{measure_clock_skew, open, read_all, read_all_reports, read_record};
use lines::*;
pub(crate) use lines::{dump_task, parse_header, parse_summary};
pub use xid::{Xid, parse_xid, pci_key};

pub mod catalogue;

use serde::{Deserialize, Serialize};

/// Where the kernel log is read from.
pub const KMSG: &str = "/dev/kmsg";

/// Errors reading /dev/kmsg.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    /// /dev/kmsg could not be opened.
    #[error(
        "cannot read the kernel log ({KMSG}); reading it needs root \
         (or CAP_SYSLOG with kernel.dmesg_restrict=1)"
    )]
    Open {
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A read failed.
    #[error("reading {KMSG}")]
    Read {
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A record that is not in the /dev/kmsg format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a kernel log record: {0:?}")]
pub struct RecordParseError(pub String);

/// One /dev/kmsg record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KmsgRecord {
    /// Sequence number.
    pub seq: u64,
    /// Monotonic time of the message, microseconds.
    pub ts_us: u64,
    /// Log level (0 = emerg .. 7 = debug).
    pub level: u8,
    /// Syslog facility: 0 is the kernel. Whatever userspace writes to
    /// /dev/kmsg gets another (the kernel turns a forged 0 into LOG_USER),
    /// so only facility 0 can be a kernel report.
    pub facility: u8,
    /// The message, without continuation (dictionary) lines.
    pub text: String,
}

/// Parses `prio,seq,ts_us,flags[,...];message\n[ KEY=value\n...]`.
pub fn parse_record(raw: &str) -> Result<KmsgRecord, RecordParseError> {
    let bad = || RecordParseError(raw.chars().take(80).collect());
    let (prefix, rest) = raw.split_once(';').ok_or_else(bad)?;
    let mut f = prefix.split(',');
    let prio: u32 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let seq = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let ts_us = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let text = unescape(rest.split('\n').next().unwrap_or(""));
    Ok(KmsgRecord {
        seq,
        ts_us,
        level: (prio & 7) as u8,
        facility: (prio >> 3).min(255) as u8,
        text,
    })
}

/// A record's text as the kernel logged it: /dev/kmsg writes every byte
/// below a space or above `~`, and `\`, as `\xNN` (so a UTF-8 name or
/// cgroup path arrives as `\xc3\xa9`); `dmesg` and the journal undo this,
/// and so does this.
fn unescape(text: &str) -> String {
    if !text.contains("\\x") {
        return text.to_string();
    }
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') {
            let hex = b
                .get(i + 2..i + 4)
                .and_then(|h| std::str::from_utf8(h).ok());
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Memory figures the kernel printed for the victim (kB).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KilledProcess {
    /// Victim pid.
    pub pid: u32,
    /// Victim name.
    pub comm: String,
    /// `total-vm`, kB.
    pub total_vm_kb: Option<u64>,
    /// `anon-rss`, kB.
    pub anon_rss_kb: Option<u64>,
    /// `file-rss`, kB.
    pub file_rss_kb: Option<u64>,
    /// `shmem-rss`, kB.
    pub shmem_rss_kb: Option<u64>,
    /// `UID`.
    pub uid: Option<u32>,
    /// `pgtables`, kB.
    pub pgtables_kb: Option<u64>,
    /// `oom_score_adj`.
    pub oom_score_adj: Option<i32>,
    /// The line said `Memory cgroup out of memory` (vs. `Out of memory`).
    pub memcg: bool,
    /// The line said neither (RHEL 6 and older print `Killed process N`
    /// alone, after a line of the kernel's choice that says which): the
    /// constraint is not on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bare: bool,
}

/// The `oom-kill:` summary line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomSummary {
    /// `CONSTRAINT_MEMCG`, `CONSTRAINT_NONE`, `CONSTRAINT_CPUSET`, `CONSTRAINT_MEMORY_POLICY`.
    pub constraint: String,
    /// The memcg that hit its limit (memcg OOMs).
    pub oom_memcg: Option<String>,
    /// The victim's memcg.
    pub task_memcg: Option<String>,
    /// Victim name.
    pub task: String,
    /// Victim pid.
    pub pid: u32,
    /// Victim uid.
    pub uid: Option<u32>,
}

/// A usage/limit/failcnt line (`memory:`, `memory+swap:`, `swap:`, `kmem:`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemcgCounter {
    /// Usage, kB.
    pub usage_kb: u64,
    /// Limit, kB (a huge number means no limit).
    pub limit_kb: u64,
    /// Times the limit was hit.
    pub failcnt: u64,
}

/// One row of the `Tasks state` table, values as printed (pages, bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    /// Pid.
    pub pid: u32,
    /// Uid.
    pub uid: u32,
    /// Tgid.
    pub tgid: u32,
    /// total_vm, pages.
    pub total_vm_pages: u64,
    /// rss, pages.
    pub rss_pages: u64,
    /// rss_anon, pages (6.x).
    pub rss_anon_pages: Option<u64>,
    /// rss_file, pages (6.x).
    pub rss_file_pages: Option<u64>,
    /// rss_shmem, pages (6.x).
    pub rss_shmem_pages: Option<u64>,
    /// Page tables, bytes.
    pub pgtables_bytes: Option<u64>,
    /// Swap entries.
    pub swapents: Option<u64>,
    /// oom_score_adj.
    pub oom_score_adj: i32,
    /// Name.
    pub name: String,
}

/// Everything the kernel printed about one OOM kill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomReport {
    /// Monotonic time of the `Killed process` line, µs.
    pub ts_us: u64,
    /// Name of the task whose allocation invoked the OOM killer.
    pub trigger_comm: Option<String>,
    /// Its pid (from the stack dump's `CPU: ... PID:` line).
    pub trigger_pid: Option<u32>,
    /// The allocation's gfp mask, as printed.
    pub gfp_mask: Option<String>,
    /// The allocation order.
    pub order: Option<u32>,
    /// The summary line (absent when the kernel rate-limited the header).
    pub summary: Option<OomSummary>,
    /// `memory:` line of the memcg.
    pub memory: Option<MemcgCounter>,
    /// `memory+swap:` (v1) or `swap:` (v2) line.
    pub swap: Option<MemcgCounter>,
    /// `kmem:` line (v1).
    pub kmem: Option<MemcgCounter>,
    /// The cgroup the stats were printed for.
    pub stats_for: Option<String>,
    /// The memcg stats (bytes or counts, as printed).
    pub memcg_stats: BTreeMap<String, u64>,
    /// The `Tasks state` table.
    pub tasks: Vec<TaskRow>,
    /// The `Killed process` line.
    pub killed: KilledProcess,
    /// Length of an `oom-kill:` summary line that could not be read whole
    /// (printk cuts a record at about 1 KiB: a long cgroup path does it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_cut: Option<usize>,
    /// The constraint a cut summary line still says (`oom-kill:constraint=
    /// CONSTRAINT_CPUSET,...` with its task and pid cut off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_constraint: Option<String>,
    /// The limited cgroup a cut summary line still names whole (its
    /// `oom_memcg=` followed by `,task_memcg=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_oom_memcg: Option<String>,
    /// The victim's cgroup a cut summary line still names whole (its
    /// `task_memcg=` followed by a comma).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_task_memcg: Option<String>,
    /// Rows of the `Tasks state` table left out: a table of more than
    /// [`MAX_TASK_ROWS`] keeps its largest tasks and those the kernel
    /// prefers to kill (a node of 100,000 processes prints them all).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tasks_omitted: u64,
    /// The cgroup with `memory.oom.group` set whose every task the kernel
    /// killed with this one (this kill is one of that incident's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_group: Option<String>,
    /// Kernels before 4.19, which print no summary line: `Task in TASK
    /// killed as a result of limit of LIMIT` (the task's memory cgroup and
    /// the one whose limit was hit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_in: Option<(String, String)>,
    /// The log holds the kernel's choice of this victim (`Kill process N
    /// ... or sacrifice child`) but not its `Killed process` line: the
    /// kernel may have killed one of its children instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chosen_only: bool,
    /// Read from a saved log (a paste may lack any line: a missing header
    /// is not in it, rather than rate-limited as live).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub saved_log: bool,
}

impl OomReport {
    /// The constraint, when the report says it: from the summary, the
    /// `Task in` line or the kill line (or the line of the kernel's choice
    /// before it); None for a bare `Killed process` line alone.
    pub fn known_constraint(&self) -> Option<&str> {
        (self.summary.is_some()
            || self.task_in.is_some()
            || self.cut_constraint.is_some()
            || !self.killed.bare)
            .then(|| self.constraint())
    }

    /// The constraint, from the summary or, without one, from the kill line.
    pub fn constraint(&self) -> &str {
        match &self.summary {
            // Kernels 4.19 to 5.2 printed the summary before they set the
            // constraint ("mm/oom_kill.c: fix uninitialized
            // oc->constraint", 5.3): every memcg OOM said CONSTRAINT_NONE.
            // Only a memcg OOM names oom_memcg or says `Memory cgroup`.
            // A constraint mainline does not name (a patch's
            // `CONSTRAINT_BPF_PSI_MEM`) is read the same way.
            Some(s)
                if (s.constraint == "CONSTRAINT_NONE"
                    || !KNOWN_CONSTRAINTS.contains(&s.constraint.as_str()))
                    && (s.oom_memcg.is_some() || self.killed.memcg) =>
            {
                "CONSTRAINT_MEMCG"
            }
            Some(s) => &s.constraint,
            None if let Some(c) = &self.cut_constraint => c,
            None if self.killed.memcg || self.task_in.is_some() => "CONSTRAINT_MEMCG",
            None => "CONSTRAINT_NONE",
        }
    }

    /// The victim's memory cgroup, as the kernel named it.
    pub fn task_memcg(&self) -> Option<&str> {
        self.summary
            .as_ref()
            .and_then(|s| s.task_memcg.as_deref())
            .or(self.task_in.as_ref().map(|(t, _)| t.as_str()))
            .or(self.cut_task_memcg.as_deref())
    }

    /// The memory cgroup whose limit was hit (a memcg OOM).
    pub fn oom_memcg(&self) -> Option<&str> {
        self.summary
            .as_ref()
            .and_then(|s| s.oom_memcg.as_deref())
            .or(self.task_in.as_ref().map(|(_, l)| l.as_str()))
            .or(self.cut_oom_memcg.as_deref())
    }
}

/// The constraints mainline's summary line names.
const KNOWN_CONSTRAINTS: [&str; 4] = [
    "CONSTRAINT_NONE",
    "CONSTRAINT_CPUSET",
    "CONSTRAINT_MEMORY_POLICY",
    "CONSTRAINT_MEMCG",
];

/// What a report says of the OOM incident its kill ended: the cgroup at
/// its limit. (Its trigger stays the first kill's own: the members were
/// killed with their group, not by that allocation.)
#[derive(Clone, Debug, Default)]
struct Incident {
    oom_memcg: Option<String>,
}

impl Incident {
    fn of(r: &OomReport) -> Self {
        Self {
            oom_memcg: r.oom_memcg().map(String::from),
        }
    }

    /// Gives a member of the group its incident's cgroup, where its own
    /// report names none.
    fn fill(&self, r: &mut OomReport) {
        if r.oom_memcg().is_none() {
            r.cut_oom_memcg.clone_from(&self.oom_memcg);
        }
    }
}

/// The OOM reaper's `reaped process` line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reaped {
    /// Monotonic time, µs.
    pub ts_us: u64,
    /// Victim pid.
    pub pid: u32,
    /// Victim name.
    pub comm: String,
    /// Anonymous RSS left after reaping, kB.
    pub anon_rss_kb: Option<u64>,
}

/// What the assembler produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KmsgEvent {
    /// A complete (or as complete as the kernel printed) report.
    Report(Box<OomReport>),
    /// The reaper finished a victim.
    Reaped(Reaped),
    /// The NVIDIA driver reported an Xid error.
    Xid(Xid),
    /// `Tasks in CGROUP are going to be killed due to memory.oom.group
    /// set`: the kill reported just before was the first of an incident
    /// (the reports of the others, which follow, say so themselves).
    OomGroup(OomGroup),
}

/// The kernel's announcement of a `memory.oom.group` kill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomGroup {
    /// Monotonic time, µs.
    pub ts_us: u64,
    /// The cgroup whose tasks are all killed.
    pub cgroup: String,
}

/// The members of a group kill follow its announcement within this.
pub const GROUP_SPAN_US: u64 = 2_000_000;

/// `Tasks in /x are going to be killed due to memory.oom.group set`.
fn parse_oom_group(text: &str) -> Option<&str> {
    text.strip_prefix("Tasks in ")?
        .strip_suffix(" are going to be killed due to memory.oom.group set")
}

impl OomGroup {
    /// Marks the first kill of this incident, when it is the latest of
    /// `reports` (kernel log readers that collect reports in order).
    pub fn mark_first(&self, reports: &mut [OomReport]) {
        if let Some(r) = reports.last_mut()
            && r.oom_group.is_none()
            && self.ts_us.saturating_sub(r.ts_us) <= GROUP_SPAN_US
        {
            r.oom_group = Some(self.cgroup.clone());
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    None,
    Stats,
    Tasks,
}

/// Assembles reports from consecutive records.
#[derive(Debug)]
pub struct Assembler {
    current: OomReport,
    started_us: Option<u64>,
    section: Section,
    columns: Vec<String>,
    /// A `memory.oom.group` kill under way: its cgroup and when it began.
    group: Option<(String, u64)>,
    /// The kill that began it, as its kill line said it: (a memcg kill, no
    /// constraint said). Kernels before 4.19 print the members' kill lines
    /// without the constraint, which is the first's.
    group_first: Option<(bool, bool)>,
    /// The last kill line's (memcg, bare), for the group it may begin.
    last_killed: Option<(bool, bool)>,
    /// The incident a group's first kill belonged to (the cgroup at its
    /// limit): its members' reports have no summary of their own.
    group_incident: Option<Incident>,
    /// The last kill's incident, for the group it may begin.
    last_incident: Option<Incident>,
    /// Kernels before 5.0 name a memcg kill on the line before the kill
    /// line (`Memory cgroup out of memory: Kill process N ... or sacrifice
    /// child`), not on the kill line itself.
    memcg_kill: bool,
    /// Reading a saved log, which may have been cut or grep-filtered: the
    /// kernel's choice (`Kill process N (comm) score S or sacrifice
    /// child`) is a kill when its `Killed process` line never comes (it is
    /// the one sign of the kill left), and a summary or `Task in` line
    /// without its header starts a report. Never live, where the kill line
    /// follows and headers are missing only when the kernel rate-limits.
    saved: bool,
    /// That choice, while its kill line is awaited, with its time.
    chosen: Option<(KilledProcess, u64)>,
    /// A saved log's stack dump of a task (`Pid: N, comm: C`, `CPU: ...
    /// PID: N Comm: C`) before any report began, with its time: the OOM
    /// path's, and the trigger, once its call trace goes through the OOM
    /// killer (a paste that left the header out).
    orphan_dump: Option<(Option<u32>, Option<String>, u64)>,
}

impl Default for Assembler {
    fn default() -> Self {
        Self {
            current: OomReport::default(),
            started_us: None,
            section: Section::None,
            columns: Vec::new(),
            group: None,
            group_first: None,
            last_killed: None,
            group_incident: None,
            last_incident: None,
            memcg_kill: false,
            saved: false,
            chosen: None,
            orphan_dump: None,
        }
    }
}

/// The most rows of a `Tasks state` table kept per report.
pub const MAX_TASK_ROWS: usize = 2048;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Cuts `rows` to at most `keep`: half by size (rss and swap: the
/// candidates of an OOM kill by memory) and half by oom_score_adj (the
/// ones it prefers whatever their size), in the order printed. Returns
/// how many were left out.
fn keep_task_rows(rows: &mut Vec<TaskRow>, keep: usize) -> u64 {
    if rows.len() <= keep {
        return 0;
    }
    let n = rows.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut kept = vec![false; n];
    let half = keep / 2;
    order.sort_unstable_by_key(|&i| {
        std::cmp::Reverse(rows[i].rss_pages + rows[i].swapents.unwrap_or(0))
    });
    order.iter().take(half).for_each(|&i| kept[i] = true);
    order.sort_unstable_by_key(|&i| std::cmp::Reverse((rows[i].oom_score_adj, rows[i].rss_pages)));
    order
        .iter()
        .filter(|&&i| !kept[i])
        .take(keep - half)
        .copied()
        .collect::<Vec<_>>()
        .into_iter()
        .for_each(|i| kept[i] = true);
    let mut i = 0;
    rows.retain(|_| {
        i += 1;
        kept[i - 1]
    });
    (n - rows.len()) as u64
}

/// A header older than this is not part of the kill that follows it.
const MAX_REPORT_SPAN_US: u64 = 10_000_000;

impl Assembler {
    /// An assembler for a saved log, where the kernel's choice of a victim
    /// whose `Killed process` line is not in the log still makes a kill.
    pub fn for_saved_log() -> Self {
        Self {
            saved: true,
            ..Self::default()
        }
    }

    /// The end of a saved log: a choice whose kill line never came.
    pub fn finish(&mut self) -> Option<Box<OomReport>> {
        let (k, ts) = self.chosen.take()?;
        match self.chosen_report(k, ts) {
            KmsgEvent::Report(r) => Some(r),
            _ => None,
        }
    }

    /// The report of a kill known only by the kernel's choice.
    fn chosen_report(&mut self, k: KilledProcess, ts_us: u64) -> KmsgEvent {
        let mut report = self.close(k, ts_us, None);
        report.chosen_only = true;
        *self = self.reset(None);
        KmsgEvent::Report(Box::new(report))
    }

    /// The report under way, closed by the kill of `k` at `ts_us`: what
    /// came before it only if it began within [`MAX_REPORT_SPAN_US`] and
    /// its summary, if any, is of `k` or of the process the kernel chose
    /// before sacrificing `k`, its child (`chosen`).
    fn close(&mut self, k: KilledProcess, ts_us: u64, chosen: Option<u32>) -> OomReport {
        let mut report = std::mem::take(&mut self.current);
        // A saved log's report begun on a line with no stamp before any
        // stamped line (a paste's header lost its stamp) is at time 0: its
        // span is not known, and it is not taken for stale.
        let fresh = self.started_us.is_some_and(|s| {
            ts_us.saturating_sub(s) <= MAX_REPORT_SPAN_US || (s == 0 && self.saved)
        });
        // A summary cut before its uid (a mail's wrap) may have its pid cut
        // or mangled too: its task's name says whose it is.
        let same = report.summary.as_ref().is_none_or(|s| {
            s.pid == k.pid || Some(s.pid) == chosen || (s.uid.is_none() && s.task == k.comm)
        });
        if !(fresh && same) {
            report = OomReport::default();
        }
        report.tasks_omitted += keep_task_rows(&mut report.tasks, MAX_TASK_ROWS);
        report.ts_us = ts_us;
        report.killed = k;
        report.saved_log = self.saved;
        report
    }

    /// A fresh assembler of the same kind, with `group` under way.
    fn reset(&self, group: Option<(String, u64)>) -> Self {
        Self {
            group_first: self.group_first.filter(|_| group.is_some()),
            group_incident: self.group_incident.clone().filter(|_| group.is_some()),
            last_incident: self.last_incident.clone(),
            group,
            last_killed: self.last_killed,
            saved: self.saved,
            ..Self::default()
        }
    }

    /// A choice waiting for its kill line, as a kill (saved logs only).
    fn flush_chosen(&mut self) -> Option<KmsgEvent> {
        let (k, ts) = self.chosen.take().filter(|_| self.saved)?;
        Some(self.chosen_report(k, ts))
    }

    /// Feeds one record; returns a report when its `Killed process` line arrives.
    pub fn push(&mut self, rec: &KmsgRecord) -> Option<KmsgEvent> {
        if rec.facility != 0 {
            // Written by a process, not the kernel: never part of a report.
            return None;
        }
        let text = rec.text.trim_end();
        if let Some(x) = parse_xid(text) {
            return Some(KmsgEvent::Xid(Xid {
                ts_us: rec.ts_us,
                ..x
            }));
        }
        if let Some(r) = parse_reaped(text) {
            return Some(KmsgEvent::Reaped(Reaped {
                ts_us: rec.ts_us,
                ..r
            }));
        }
        if let Some(cgroup) = parse_oom_group(text) {
            self.group = Some((cgroup.to_string(), rec.ts_us));
            self.group_first = self.last_killed;
            self.group_incident.clone_from(&self.last_incident);
            return Some(KmsgEvent::OomGroup(OomGroup {
                ts_us: rec.ts_us,
                cgroup: cgroup.to_string(),
            }));
        }
        // Kernels before 5.0 name a memcg kill on this line, which the
        // kernel prints even when it rate-limits the header.
        if let Some(mut k) = parse_chosen(text) {
            // An earlier choice whose kill line never came is a kill of its
            // own (its report resets the assembler: this one comes after).
            let before = self.flush_chosen();
            self.memcg_kill |= k.memcg;
            k.memcg = self.memcg_kill;
            self.chosen = Some((k, rec.ts_us));
            return before;
        }
        // A group kill's members follow its announcement at once: any
        // other line ends it.
        if self.group.is_some() && parse_killed(text).is_none() {
            self.group = None;
        }
        // A paste may keep the header's start alone (`mysqld invoked
        // oom-killer`, its figures cut by whoever pasted it).
        if let Some(h) = parse_header(text) {
            let pending = self.flush_chosen();
            *self = self.reset(None);
            self.started_us = Some(rec.ts_us);
            self.current.trigger_comm = Some(h.comm.to_string());
            self.current.gfp_mask = h.gfp_mask.map(String::from);
            self.current.order = h.order;
            return pending;
        }
        if let Some(mut k) = parse_killed(text).or_else(|| parse_sharing(text)) {
            // The line of the kernel's choice before it says the constraint.
            let chosen = self.chosen.take();
            if chosen.as_ref().is_some_and(|(c, _)| !c.bare) {
                k.bare = false;
            }
            k.memcg |= self.memcg_kill;
            let group = self
                .group
                .take()
                .filter(|(_, at)| rec.ts_us.saturating_sub(*at) <= GROUP_SPAN_US);
            // A member of a group kill under way says the constraint of
            // the kill that began it. (That kill's task, killed and printed
            // again with its group, is its own report here: live it joins
            // the same kill, and a saved log keeps one of the two.)
            if group.is_some()
                && let Some((memcg, bare)) = self.group_first
            {
                k.memcg |= memcg;
                k.bare &= bare;
            }
            self.last_killed = Some((k.memcg, k.bare));
            let mut report = self.close(k, rec.ts_us, chosen.map(|(c, _)| c.pid));
            if group.is_some()
                && let Some(i) = &self.group_incident
            {
                i.fill(&mut report);
            }
            self.last_incident = Some(Incident::of(&report));
            report.oom_group = group.as_ref().map(|(g, _)| g.clone());
            *self = self.reset(group);
            return Some(KmsgEvent::Report(Box::new(report)));
        }
        // A summary or `Task in` line whose header is not in a saved log (a
        // paste that starts after it, a grep): the kill line that follows
        // takes it (a summary only if of its pid).
        // Only the lines that name their kill's cgroups themselves: a stats
        // or task table line without its header may be another report's
        // (a paste reversed, a child cgroup's stats).
        const BODY: [&str; 2] = ["oom-kill:", "Task in "];
        if self.saved && self.started_us.is_none() && BODY.iter().any(|b| text.starts_with(b)) {
            self.started_us = Some(rec.ts_us);
        }
        if self.saved && self.started_us.is_none() {
            if let Some((pid, comm)) = dump_task(text) {
                self.orphan_dump = Some((pid, comm.map(String::from), rec.ts_us));
                return None;
            }
            let oom_path = ["out_of_memory+", "oom_kill_process+", "dump_header+"]
                .iter()
                .any(|f| text.contains(f));
            if oom_path && let Some((pid, comm, ts)) = self.orphan_dump.take() {
                // A choice before it is another report's kill.
                let pending = self.flush_chosen();
                self.started_us = Some(ts);
                self.current.trigger_pid = pid;
                self.current.trigger_comm = comm;
                if pending.is_some() {
                    return pending;
                }
            }
        }
        // Lines of a report only count after its header.
        self.started_us?;
        if let Some(rest) = text.strip_prefix("Task in ")
            && let Some((task, limit)) = rest.split_once(" killed as a result of limit of ")
        {
            self.current.task_in = Some((task.to_string(), limit.to_string()));
            return None;
        }
        if let Some(s) = text.strip_prefix("oom-kill:") {
            self.current.summary = parse_summary(s);
            if self.current.summary.is_none() {
                self.current.summary_cut = Some(text.len());
                self.current.cut_constraint = s
                    .strip_prefix("constraint=")
                    .and_then(|r| r.split(',').next())
                    .filter(|c| c.starts_with("CONSTRAINT_") && c.len() > "CONSTRAINT_".len())
                    .map(String::from);
                self.current.cut_oom_memcg = s
                    .split_once(",oom_memcg=")
                    .and_then(|(_, r)| r.split_once(",task_memcg="))
                    .map(|(m, _)| m.to_string());
                // Whole where the cut came after its comma (`less`'s `>` at
                // the edge: `task_memcg=/system.slice/x.service,>`).
                self.current.cut_task_memcg = s
                    .split_once(",task_memcg=")
                    .and_then(|(_, r)| r.split_once(','))
                    .map(|(m, _)| m.to_string())
                    .filter(|m| !m.is_empty());
            }
            self.section = Section::None;
        } else if let Some((pid, comm)) = dump_task(text)
            && self.current.trigger_pid.is_none()
        {
            self.current.trigger_pid = pid;
            // Its name too, where the header that names it is not in a
            // saved log.
            if self.current.trigger_comm.is_none() {
                self.current.trigger_comm = comm.map(String::from);
            }
        } else if let Some(c) = text.strip_prefix("memory: ") {
            self.current.memory = parse_counter(c);
        } else if let Some(c) = text
            .strip_prefix("memory+swap: ")
            .or_else(|| text.strip_prefix("swap: "))
        {
            self.current.swap = parse_counter(c);
        } else if let Some(c) = text.strip_prefix("kmem: ") {
            self.current.kmem = parse_counter(c);
        } else if let Some(p) = text.strip_prefix("Memory cgroup stats for ") {
            // Kernels before 4.x print the stats on the same line, in KB
            // (`/x: cache:0KB rss:1024KB ...`), for the cgroup and each one
            // below it: the first is the one that hit its limit.
            match p.split_once(": ") {
                Some((path, inline)) => {
                    if self.current.stats_for.is_none() {
                        self.current.stats_for = Some(path.to_string());
                        for (k, v) in inline
                            .split_whitespace()
                            .filter_map(|kv| kv.split_once(':'))
                        {
                            if let Some(kb) =
                                v.strip_suffix("KB").and_then(|n| n.parse::<u64>().ok())
                            {
                                self.current.memcg_stats.insert(k.to_string(), kb * 1024);
                            }
                        }
                    }
                    self.section = Section::None;
                }
                None => {
                    self.current.stats_for = Some(p.trim_end_matches(':').to_string());
                    self.section = Section::Stats;
                }
            }
        } else if text.starts_with("Tasks state") {
            self.section = Section::Tasks;
            self.columns.clear();
        } else if text.starts_with("[  pid  ]") || text.starts_with("[ pid ]") {
            // Kernels before 4.19 print the table's header without a
            // `Tasks state` line before it.
            self.section = Section::Tasks;
            self.columns = text
                .split(']')
                .nth(1)
                .unwrap_or("")
                .split_whitespace()
                .map(String::from)
                .collect();
        } else if self.section == Section::Tasks && text.starts_with('[') {
            if let Some(row) = parse_task_row(text, &self.columns) {
                self.current.tasks.push(row);
                // Cut at twice the bound: amortised, the table costs
                // O(log n) a row and MAX_TASK_ROWS rows of memory.
                if self.current.tasks.len() >= 2 * MAX_TASK_ROWS {
                    self.current.tasks_omitted +=
                        keep_task_rows(&mut self.current.tasks, MAX_TASK_ROWS);
                }
            }
        } else if self.section == Section::Stats {
            match text.split_once(' ') {
                Some((k, v)) if !k.is_empty() && v.trim().parse::<u64>().is_ok() => {
                    self.current
                        .memcg_stats
                        .insert(k.to_string(), v.trim().parse().unwrap_or(0));
                }
                _ => self.section = Section::None,
            }
        }
        None
    }
}
