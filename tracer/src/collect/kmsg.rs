//! The kernel's own OOM report, from /dev/kmsg: the `invoked oom-killer`
//! header, the memcg usage/limit/failcnt lines, the memcg stats, the
//! `Tasks state` table, the `oom-kill:` summary and the `Killed process`
//! line, assembled into one [`OomReport`] per kill. This is also what lets
//! `explain` work for kills the recorder did not witness.
//!
//! Formats: mm/oom_kill.c (`dump_header`, `dump_tasks`, `dump_oom_summary`,
//! `__oom_kill_process`), mm/memcontrol.c and mm/memcontrol-v1.c
//! (`mem_cgroup_print_oom_meminfo`), across 4.19 to 6.18.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{self, Read},
    os::unix::fs::OpenOptionsExt,
};

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
        (self.summary.is_some() || self.task_in.is_some() || !self.killed.bare)
            .then(|| self.constraint())
    }

    /// The constraint, from the summary or, without one, from the kill line.
    pub fn constraint(&self) -> &str {
        match &self.summary {
            Some(s) => &s.constraint,
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
    }

    /// The memory cgroup whose limit was hit (a memcg OOM).
    pub fn oom_memcg(&self) -> Option<&str> {
        self.summary
            .as_ref()
            .and_then(|s| s.oom_memcg.as_deref())
            .or(self.task_in.as_ref().map(|(_, l)| l.as_str()))
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

/// An NVIDIA driver Xid error from the kernel log:
/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xid {
    /// Monotonic time, µs.
    pub ts_us: u64,
    /// PCI address as printed (`0000:3b:00`).
    pub pci: String,
    /// Xid code (79: fell off the bus, 31: MMU fault, 48: double-bit ECC, ...).
    pub code: u32,
    /// Process the driver named, if any.
    pub pid: Option<u32>,
    /// Its name, if any.
    pub name: Option<String>,
    /// The rest of the message.
    pub message: String,
    /// An NVSwitch SXid (`nvidia-nvswitch0: SXid (PCI:...)`), not a GPU's Xid.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sxid: bool,
}

/// Parses an Xid line.
pub fn parse_xid(text: &str) -> Option<Xid> {
    // `NVRM: Xid (PCI:0000:3b:00): 79, ...`; older drivers print the
    // address without `PCI:`; NVSwitches print `SXid (PCI:...)`; a paste
    // may hide the address (`(PCI:...)`).
    let at = text.find("Xid (")?;
    let sxid = text[..at].ends_with('S');
    if !sxid && !text[..at].ends_with("NVRM: ") {
        return None;
    }
    let rest = &text[at + "Xid (".len()..];
    let (pci, rest) = rest.split_once("):")?;
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci);
    let mut parts = rest.splitn(2, ',');
    let code = parts.next()?.trim().parse().ok()?;
    let mut x = Xid {
        pci: pci.trim().to_string(),
        code,
        sxid,
        ..Default::default()
    };
    let mut message = Vec::new();
    for p in parts.next().unwrap_or("").split(',') {
        let p = p.trim();
        if let Some(v) = p.strip_prefix("pid=") {
            x.pid = v.parse().ok();
        } else if let Some(v) = p.strip_prefix("name=") {
            x.name = Some(v.to_string());
        } else if !p.is_empty() {
            message.push(p);
        }
    }
    x.message = message.join(", ");
    Some(x)
}

/// Bus and device of a PCI address, whatever the domain width and
/// function: `00000000:3B:00.0` and `0000:3b:00` are the same GPU.
pub fn pci_key(addr: &str) -> Option<(u32, u32)> {
    let mut parts = addr.split(':').rev();
    let dev = parts.next()?.split('.').next()?;
    let bus = parts.next()?;
    Some((
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(dev, 16).ok()?,
    ))
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
}

impl Default for Assembler {
    fn default() -> Self {
        Self {
            current: OomReport::default(),
            started_us: None,
            section: Section::None,
            columns: Vec::new(),
            group: None,
            memcg_kill: false,
            saved: false,
            chosen: None,
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
        let mut report = self.close(k, ts_us);
        report.chosen_only = true;
        *self = self.reset(None);
        KmsgEvent::Report(Box::new(report))
    }

    /// The report under way, closed by the kill of `k` at `ts_us`: what
    /// came before it only if it began within [`MAX_REPORT_SPAN_US`] and
    /// its summary, if any, is of `k`.
    fn close(&mut self, k: KilledProcess, ts_us: u64) -> OomReport {
        let mut report = std::mem::take(&mut self.current);
        let fresh = self
            .started_us
            .is_some_and(|s| ts_us.saturating_sub(s) <= MAX_REPORT_SPAN_US);
        let same = report.summary.as_ref().is_none_or(|s| s.pid == k.pid);
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
            group,
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
        if let Some((comm, rest)) = text.split_once(" invoked oom-killer: ") {
            let pending = self.flush_chosen();
            *self = self.reset(None);
            self.started_us = Some(rec.ts_us);
            self.current.trigger_comm = Some(comm.to_string());
            for (k, v) in rest.split(", ").filter_map(|kv| kv.split_once('=')) {
                match k {
                    "gfp_mask" => self.current.gfp_mask = Some(v.to_string()),
                    "order" => self.current.order = v.parse().ok(),
                    _ => {}
                }
            }
            return pending;
        }
        if let Some(mut k) = parse_killed(text) {
            // The line of the kernel's choice before it says the constraint.
            if self.chosen.take().is_some_and(|(c, _)| !c.bare) {
                k.bare = false;
            }
            k.memcg |= self.memcg_kill;
            let mut report = self.close(k, rec.ts_us);
            let group = self
                .group
                .take()
                .filter(|(_, at)| rec.ts_us.saturating_sub(*at) <= GROUP_SPAN_US);
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
            }
            self.section = Section::None;
        } else if text.starts_with("CPU: ") && self.current.trigger_pid.is_none() {
            self.current.trigger_pid = word_after(text, "PID: ").and_then(|v| v.parse().ok());
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

fn word_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let i = text.find(key)? + key.len();
    text[i..].split_whitespace().next()
}

/// `usage 65536kB, limit 65536kB, failcnt 3543`
fn parse_counter(s: &str) -> Option<MemcgCounter> {
    let mut c = MemcgCounter::default();
    for part in s.split(", ") {
        let (k, v) = part.trim().split_once(' ')?;
        let n: u64 = v.trim_end_matches("kB").parse().ok()?;
        match k {
            "usage" => c.usage_kb = n,
            "limit" => c.limit_kb = n,
            "failcnt" => c.failcnt = n,
            _ => {}
        }
    }
    Some(c)
}

/// `constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,
/// oom_memcg=/x,task_memcg=/x,task=python3,pid=3129,uid=0`. Parsed from
/// both ends, since `mems_allowed` and a task name may contain commas.
pub(crate) fn parse_summary(s: &str) -> Option<OomSummary> {
    let (rest, uid) = match s.rsplit_once(",uid=") {
        Some((r, u)) => (r, u.parse().ok()),
        None => (s, None),
    };
    let (rest, pid) = rest.rsplit_once(",pid=")?;
    let (rest, task) = rest.rsplit_once(",task=")?;
    let (rest, task_memcg) = match rest.rsplit_once(",task_memcg=") {
        Some((r, m)) => (r, Some(m.to_string())),
        None => (rest, None),
    };
    let oom_memcg = rest.rsplit_once(",oom_memcg=").map(|(_, m)| m.to_string());
    let constraint = rest
        .strip_prefix("constraint=")?
        .split(',')
        .next()?
        .to_string();
    Some(OomSummary {
        constraint,
        oom_memcg,
        task_memcg,
        task: task.to_string(),
        pid: pid.parse().ok()?,
        uid,
    })
}

/// `text` with every run of 20 or more spaces taken out.
fn unpad(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = 0;
    for c in text.chars() {
        if c == ' ' {
            run += 1;
            continue;
        }
        if (1..20).contains(&run) {
            out.extend(std::iter::repeat_n(' ', run));
        }
        run = 0;
        out.push(c);
    }
    out
}

/// The kernel's choice before 5.0: `[Memory cgroup out of memory: |Out of
/// memory: ]Kill process 3129 (python3) score 933 or sacrifice child` (`kill
/// process N (comm) score S or a child` before 2.6.36).
fn parse_chosen(text: &str) -> Option<KilledProcess> {
    let at = text
        .find("Kill process ")
        .or_else(|| text.find("kill process "))?;
    let rest = &text[at + "Kill process ".len()..];
    let (pid, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix('(')?;
    let close = rest.rfind(") score")?;
    Some(KilledProcess {
        pid: pid.parse().ok()?,
        comm: rest[..close].to_string(),
        memcg: text[..at].contains("Memory cgroup"),
        bare: !said_out_of_memory(&text[..at]),
        ..Default::default()
    })
}

/// Whether the text before `Kill(ed) process` names the OOM that killed.
fn said_out_of_memory(before: &str) -> bool {
    let b = before.to_ascii_lowercase();
    b.contains("out of memory")
}

/// `[Memory cgroup out of memory: |Out of memory: ]Killed process 3129
/// (python3) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB,
/// shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0`
fn parse_killed(text: &str) -> Option<KilledProcess> {
    // A terminal's copy pads a line it wrapped with a run of spaces, in the
    // middle of a figure (`anon-rss:832856k<spaces>B`): no kill line has such
    // a run, so it goes.
    let unpadded;
    let text = if text.contains("                    ") {
        unpadded = unpad(text);
        unpadded.as_str()
    } else {
        text
    };
    // OpenVZ kernels: `Out of memory in UB 1234: OOM killed process 21738
    // (php-cgi) score 0 vm:281988kB, rss:17004kB, swap:0kB` (a container's
    // limit, not a constraint mainline names).
    let at = text
        .find("Killed process ")
        .or_else(|| text.find("OOM killed process ").map(|i| i + 4))?;
    let rest = &text[at + "Killed process ".len()..];
    let (pid, rest) = rest.split_once(' ')?;
    // RHEL 6 and older: `Killed process 29591, UID 500, (python2.7) ...`.
    let mut uid = None;
    let mut rest = rest.trim_start();
    if let Some(r) = rest.strip_prefix("UID ") {
        let (u, r) = r.split_once([',', ' '])?;
        uid = u.parse().ok();
        rest = r.trim_start_matches([',', ' ']);
    }
    let (comm, after) = match rest.strip_prefix('(') {
        Some(r) => {
            let close = r.rfind(") total-vm").or_else(|| r.rfind(')'))?;
            (&r[..close], &r[close + 1..])
        }
        // RHEL 5 prints the name bare: `Killed process 7919, UID 504 oracle`.
        None if uid.is_some() => rest.split_once(' ').unwrap_or((rest, "")),
        None => return None,
    };
    let mut k = KilledProcess {
        pid: pid.trim_end_matches(',').parse().ok()?,
        comm: comm.to_string(),
        memcg: text[..at].contains("Memory cgroup"),
        bare: !said_out_of_memory(&text[..at]) || text[..at].contains(" in UB "),
        uid,
        ..Default::default()
    };
    let mut words = after.split([',', ' ']).filter(|s| !s.is_empty()).peekable();
    while let Some(kv) = words.next() {
        // `(comm), UID 0, total-vm:...`
        if kv == "UID" {
            k.uid = words.next().and_then(|v| v.parse().ok());
            continue;
        }
        let Some((key, v)) = kv.split_once(':') else {
            continue;
        };
        // Only a whole `NkB`: a number damaged in a paste
        // (`anon-rss:153,700,88kB`) is not read as a value.
        let kb = || {
            v.trim_end_matches(['*', '"', '\'', '`'])
                .strip_suffix("kB")?
                .parse::<u64>()
                .ok()
        };
        match key {
            "total-vm" => k.total_vm_kb = kb(),
            "anon-rss" => k.anon_rss_kb = kb(),
            "file-rss" => k.file_rss_kb = kb(),
            "shmem-rss" => k.shmem_rss_kb = kb(),
            "UID" => k.uid = v.parse().ok(),
            "pgtables" => k.pgtables_kb = kb(),
            "oom_score_adj" => k.oom_score_adj = v.parse().ok(),
            _ => {}
        }
    }
    Some(k)
}

/// `oom_reaper: reaped process 3129 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB`
fn parse_reaped(text: &str) -> Option<Reaped> {
    let rest = text.strip_prefix("oom_reaper: reaped process ")?;
    let (pid, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix('(')?;
    let close = rest.rfind("), now").or_else(|| rest.rfind(')'))?;
    let anon = rest[close..]
        .split_once("anon-rss:")
        .and_then(|(_, v)| v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok());
    Some(Reaped {
        ts_us: 0,
        pid: pid.parse().ok()?,
        comm: rest[..close].to_string(),
        anon_rss_kb: anon,
    })
}

/// A `Tasks state` row, columns named by the table header of this kernel.
fn parse_task_row(text: &str, columns: &[String]) -> Option<TaskRow> {
    let (pid, rest) = text.strip_prefix('[')?.split_once(']')?;
    let mut row = TaskRow {
        pid: pid.trim().parse().ok()?,
        ..Default::default()
    };
    let default_columns;
    let columns = if columns.is_empty() {
        default_columns = [
            "uid",
            "tgid",
            "total_vm",
            "rss",
            "pgtables_bytes",
            "swapents",
            "oom_score_adj",
            "name",
        ]
        .map(String::from)
        .to_vec();
        &default_columns
    } else {
        columns
    };
    let mut words = rest.split_whitespace();
    for col in columns {
        if col == "name" {
            row.name = words.by_ref().collect::<Vec<_>>().join(" ");
            break;
        }
        let w = words.next()?;
        let n = || w.parse::<u64>().ok();
        match col.as_str() {
            "uid" => row.uid = w.parse().ok()?,
            "tgid" => row.tgid = w.parse().ok()?,
            "total_vm" => row.total_vm_pages = n()?,
            "rss" => row.rss_pages = n()?,
            "rss_anon" => row.rss_anon_pages = n(),
            "rss_file" => row.rss_file_pages = n(),
            "rss_shmem" => row.rss_shmem_pages = n(),
            "pgtables_bytes" => row.pgtables_bytes = n(),
            "swapents" => row.swapents = n(),
            "oom_score_adj" => row.oom_score_adj = w.parse().ok()?,
            _ => {}
        }
    }
    Some(row)
}

/// Opens /dev/kmsg for non-blocking reads from the oldest record kept.
pub fn open() -> Result<File, KmsgError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(KMSG)
        .map_err(|source| KmsgError::Open { source })
}

/// Reads the next record. `Ok(None)`: nothing more for now. Records the
/// kernel overwrote before we read them (EPIPE) are skipped and counted.
pub fn read_record(
    f: &mut File,
    buf: &mut [u8],
    lost: &mut u64,
) -> Result<Option<KmsgRecord>, KmsgError> {
    loop {
        match f.read(buf) {
            Ok(0) => return Ok(None),
            Ok(n) => {
                let raw = String::from_utf8_lossy(&buf[..n]);
                match parse_record(&raw) {
                    Ok(r) => return Ok(Some(r)),
                    Err(e) => {
                        tracing::debug!("{e}");
                        continue;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                *lost += 1;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(KmsgError::Read { source }),
        }
    }
}

/// How far the kernel log's clock is ahead of CLOCK_MONOTONIC, ns
/// (negative: behind), measured by writing one line to the kernel log
/// (`tracer[PID]: kernel log clock reference`, user facility) and reading
/// back its stamp. `None` when the log cannot be written or read back.
pub fn measure_clock_skew() -> Option<i64> {
    use std::io::{Seek as _, SeekFrom, Write as _};
    let mono = crate::util::time::mono_now_ns;
    let mut r = open().ok()?;
    // SEEK_END on /dev/kmsg: the next record read is the next one logged.
    r.seek(SeekFrom::End(0)).ok()?;
    let marker = format!("tracer[{}]: kernel log clock reference", std::process::id());
    let mut w = std::fs::OpenOptions::new().write(true).open(KMSG).ok()?;
    let t0 = mono();
    w.write_all(format!("{marker}\n").as_bytes()).ok()?;
    let t1 = mono();
    let mut buf = vec![0u8; 8192];
    let mut lost = 0;
    for _ in 0..100 {
        while let Some(rec) = read_record(&mut r, &mut buf, &mut lost).ok()? {
            if rec.facility != 0 && rec.text == marker {
                return Some(rec.ts_us as i64 * 1000 - (t0 + (t1 - t0) / 2));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    None
}

/// Every OOM report still in the kernel log buffer (for `explain --kmsg`).
pub fn read_all_reports() -> Result<Vec<OomReport>, KmsgError> {
    read_all().map(|(r, _)| r)
}

/// Every OOM report and Xid line the kernel log holds now.
pub fn read_all() -> Result<(Vec<OomReport>, Vec<Xid>), KmsgError> {
    let mut f = open()?;
    let mut buf = vec![0u8; 8192];
    let mut lost = 0;
    let mut asm = Assembler::default();
    let (mut out, mut xids) = (Vec::new(), Vec::new());
    while let Some(rec) = read_record(&mut f, &mut buf, &mut lost)? {
        match asm.push(&rec) {
            Some(KmsgEvent::Report(r)) => out.push(*r),
            Some(KmsgEvent::OomGroup(g)) => g.mark_first(&mut out),
            Some(KmsgEvent::Xid(x)) => xids.push(x),
            _ => {}
        }
    }
    Ok((out, xids))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lines: &[&str]) -> Vec<KmsgEvent> {
        let mut asm = Assembler::default();
        lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let rec = KmsgRecord {
                    seq: i as u64,
                    ts_us: 134_488_421 + i as u64 * 10,
                    level: 4,
                    facility: 0,
                    text: l.to_string(),
                };
                asm.push(&rec)
            })
            .collect()
    }

    fn one_report(lines: &[&str]) -> OomReport {
        let evs = feed(lines);
        let reports: Vec<_> = evs
            .into_iter()
            .filter_map(|e| match e {
                KmsgEvent::Report(r) => Some(*r),
                _ => None,
            })
            .collect();
        assert_eq!(reports.len(), 1, "exactly one report");
        reports.into_iter().next().unwrap()
    }

    /// A memcg OOM on cgroup v1, as this project's CI kernel (6.18) prints it.
    const V1_MEMCG_6_18: &[&str] = &[
        "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        "CPU: 0 UID: 0 PID: 3129 Comm: python3 Not tainted 6.18.44-fc-v1098 #1 PREEMPT(none) ",
        "Call Trace:",
        " <TASK>",
        " dump_stack_lvl+0x59/0x90",
        " </TASK>",
        "memory: usage 65536kB, limit 65536kB, failcnt 3543",
        "memory+swap: usage 65536kB, limit 9007199254740988kB, failcnt 0",
        "kmem: usage 260kB, limit 9007199254740988kB, failcnt 0",
        "Memory cgroup stats for /tracer-probe-1127:",
        "cache 106496",
        "rss 66736128",
        "shmem 0",
        "pgfault 23940",
        "total_rss 66736128",
        "Tasks state (memory values in pages):",
        "[  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name",
        "[   3129]     0  3129    18790    16950    16288      662         0   192512        0             0 python3",
        "[   3130]  1000  3130     5000     1200     1100      100         0    65536        0           500 side car",
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/tracer-probe-1127,task_memcg=/tracer-probe-1127,task=python3,pid=3129,uid=0",
        "Memory cgroup out of memory: Killed process 3129 (python3) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0",
        "oom_reaper: reaped process 3129 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
    ];

    #[test]
    fn memcg_v1_report_on_6_18() {
        let r = one_report(V1_MEMCG_6_18);
        assert_eq!(r.trigger_comm.as_deref(), Some("python3"));
        assert_eq!(r.trigger_pid, Some(3129));
        assert_eq!(r.gfp_mask.as_deref(), Some("0xcc0(GFP_KERNEL)"));
        assert_eq!(r.order, Some(0));
        assert_eq!(
            r.memory,
            Some(MemcgCounter {
                usage_kb: 65536,
                limit_kb: 65536,
                failcnt: 3543
            })
        );
        assert_eq!(r.swap.as_ref().unwrap().limit_kb, 9007199254740988);
        assert_eq!(r.kmem.as_ref().unwrap().usage_kb, 260);
        assert_eq!(r.stats_for.as_deref(), Some("/tracer-probe-1127"));
        assert_eq!(r.memcg_stats["rss"], 66736128);
        assert_eq!(r.memcg_stats["cache"], 106496);
        assert_eq!(r.tasks.len(), 2);
        assert_eq!(r.tasks[0].rss_anon_pages, Some(16288));
        assert_eq!(r.tasks[0].pgtables_bytes, Some(192512));
        assert_eq!(r.tasks[1].name, "side car");
        assert_eq!(r.tasks[1].oom_score_adj, 500);
        let s = r.summary.as_ref().unwrap();
        assert_eq!(s.constraint, "CONSTRAINT_MEMCG");
        assert_eq!(s.oom_memcg.as_deref(), Some("/tracer-probe-1127"));
        assert_eq!(s.task_memcg.as_deref(), Some("/tracer-probe-1127"));
        assert_eq!((s.task.as_str(), s.pid, s.uid), ("python3", 3129, Some(0)));
        assert_eq!(r.killed.pid, 3129);
        assert_eq!(r.killed.anon_rss_kb, Some(65152));
        assert_eq!(r.killed.file_rss_kb, Some(2648));
        assert_eq!(r.killed.pgtables_kb, Some(188));
        assert_eq!(r.killed.oom_score_adj, Some(0));
        assert!(r.killed.memcg);
        assert_eq!(r.constraint(), "CONSTRAINT_MEMCG");
    }

    #[test]
    fn memcg_v2_report_on_6_1() {
        let r = one_report(&[
            "stress invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
            "CPU: 3 PID: 4205 Comm: stress Not tainted 6.1.0-18-amd64 #1  Debian 6.1.76-1",
            "memory: usage 102400kB, limit 102400kB, failcnt 27",
            "swap: usage 0kB, limit 0kB, failcnt 0",
            "Memory cgroup stats for /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-ab12.scope:",
            "anon 103825408",
            "file 0",
            "shmem 0",
            "Tasks state (memory values in pages):",
            "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
            "[   4205]     0  4205    26973    25412   253952        0           985 stress",
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-containerd-ab12.scope,mems_allowed=0-1,oom_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-ab12.scope,task_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-ab12.scope,task=stress,pid=4205,uid=0",
            "Memory cgroup out of memory: Killed process 4205 (stress) total-vm:107892kB, anon-rss:101420kB, file-rss:228kB, shmem-rss:0kB, UID:0 pgtables:248kB oom_score_adj:985",
        ]);
        assert_eq!(r.trigger_pid, Some(4205));
        assert_eq!(r.swap.as_ref().unwrap().limit_kb, 0);
        assert_eq!(r.memcg_stats["anon"], 103825408);
        assert_eq!(r.tasks[0].rss_pages, 25412);
        assert_eq!(r.tasks[0].rss_anon_pages, None);
        assert_eq!(r.tasks[0].oom_score_adj, 985);
        assert!(
            r.summary
                .as_ref()
                .unwrap()
                .oom_memcg
                .as_deref()
                .unwrap()
                .ends_with("cri-containerd-ab12.scope")
        );
        assert_eq!(r.killed.oom_score_adj, Some(985));
    }

    #[test]
    fn global_oom_on_5_15() {
        let r = one_report(&[
            "java invoked oom-killer: gfp_mask=0x1100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
            "CPU: 1 PID: 812 Comm: java Not tainted 5.15.0-91-generic #101-Ubuntu",
            "Mem-Info:",
            "active_anon:1200 inactive_anon:900000 isolated_anon:0",
            "Tasks state (memory values in pages):",
            "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
            "[    812]  1000   812  2000000   950000  8000000        0             0 java",
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/session-3.scope,task=java,pid=812,uid=1000",
            "Out of memory: Killed process 812 (java) total-vm:8000000kB, anon-rss:3800000kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:7812kB oom_score_adj:0",
        ]);
        let s = r.summary.as_ref().unwrap();
        assert_eq!(s.constraint, "CONSTRAINT_NONE");
        assert_eq!(s.oom_memcg, None);
        assert_eq!(
            s.task_memcg.as_deref(),
            Some("/user.slice/user-1000.slice/session-3.scope")
        );
        assert_eq!(s.uid, Some(1000));
        assert!(r.memory.is_none());
        assert!(!r.killed.memcg);
        assert_eq!(r.constraint(), "CONSTRAINT_NONE");
    }

    #[test]
    fn old_kernel_kill_line_and_cpuset_with_commas() {
        let r = one_report(&[
            "a.out invoked oom-killer: gfp_mask=0x14200ca(GFP_HIGHUSER_MOVABLE), nodemask=(null), order=0, oom_score_adj=0",
            "CPU: 0 PID: 77 Comm: a.out Not tainted 4.19.0-25-amd64 #1 Debian 4.19.289-2",
            "Tasks state (memory values in pages):",
            "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
            "[     77]     0    77   300000   250000  2000000        0             0 a.out",
            "oom-kill:constraint=CONSTRAINT_CPUSET,nodemask=(null),cpuset=job,mems_allowed=0-1,3,task_memcg=/,task=a.out,pid=77,uid=0",
            "Killed process 77 (a.out) total-vm:1200000kB, anon-rss:999000kB, file-rss:4kB, shmem-rss:0kB",
        ]);
        assert_eq!(r.summary.as_ref().unwrap().constraint, "CONSTRAINT_CPUSET");
        assert_eq!(r.killed.anon_rss_kb, Some(999000));
        assert_eq!(r.killed.uid, None);
        assert_eq!(r.killed.pgtables_kb, None);
        assert_eq!(r.order, Some(0));
    }

    /// In a saved log, the kernel's choices whose kill lines are not in it
    /// (tests/fixtures/real-logs/hq-20: ten in a row) are ten kills; one
    /// whose kill line follows names the process really killed (a child);
    /// live, a choice alone is no kill.
    #[test]
    fn choices_without_their_kill_lines_are_kills_in_a_saved_log_only() {
        let lines = [
            "Memory cgroup out of memory: Kill process 19302 (java) score 1337 or sacrifice child",
            "Memory cgroup out of memory: Kill process 78753 (java) score 1348 or sacrifice child",
            "Memory cgroup out of memory: Kill process 107854 (java) score 1332 or sacrifice child",
            "Out of memory: Kill process 16959 (AsyncBlockInput) score 970 or sacrifice child",
            "Killed process 19079 (clickhouse-serv) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
        ];
        let run = |mut asm: Assembler| {
            let mut out: Vec<OomReport> = lines
                .iter()
                .enumerate()
                .filter_map(|(i, l)| {
                    asm.push(&KmsgRecord {
                        seq: i as u64,
                        ts_us: i as u64 * 1_000_000,
                        level: 4,
                        facility: 0,
                        text: l.to_string(),
                    })
                })
                .filter_map(|e| match e {
                    KmsgEvent::Report(r) => Some(*r),
                    _ => None,
                })
                .collect();
            out.extend(asm.finish().map(|r| *r));
            out
        };
        let saved = run(Assembler::for_saved_log());
        let got: Vec<(u32, bool, bool)> = saved
            .iter()
            .map(|r| (r.killed.pid, r.chosen_only, r.killed.memcg))
            .collect();
        assert_eq!(
            got,
            [
                (19302, true, true),
                (78753, true, true),
                (107854, true, true),
                (19079, false, false)
            ]
        );
        assert_eq!(saved[3].constraint(), "CONSTRAINT_NONE");
        let live = run(Assembler::default());
        assert_eq!(
            live.iter().map(|r| r.killed.pid).collect::<Vec<_>>(),
            [19079]
        );
    }

    #[test]
    fn rate_limited_header_gives_a_kill_line_only_report() {
        // The kernel rate-limits dump_header; the kill line always comes.
        let r = one_report(&[
            "Memory cgroup out of memory: Killed process 9 (x) total-vm:1kB, anon-rss:2kB, file-rss:3kB, shmem-rss:4kB, UID:0 pgtables:5kB oom_score_adj:0",
        ]);
        assert!(r.summary.is_none() && r.tasks.is_empty() && r.memory.is_none());
        assert_eq!(r.killed.shmem_rss_kb, Some(4));
        assert_eq!(r.constraint(), "CONSTRAINT_MEMCG");
    }

    #[test]
    fn a_memory_oom_group_kill_is_one_incident_of_several_reports() {
        // As mm/oom_kill.c prints it: the chosen victim's full report, the
        // group announcement, then every other task of the group (the
        // reaper's line may come between).
        let mut lines = V1_MEMCG_6_18.to_vec();
        lines.extend([
            "Tasks in /job are going to be killed due to memory.oom.group set",
            "oom_reaper: reaped process 3129 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
            "Memory cgroup out of memory: Killed process 3130 (sh) total-vm:4000kB, anon-rss:200kB, file-rss:900kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0",
            "Memory cgroup out of memory: Killed process 3131 (worker) total-vm:8000kB, anon-rss:3200kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0",
        ]);
        let evs = feed(&lines);
        let mut reports = Vec::new();
        let mut groups = Vec::new();
        for e in evs {
            match e {
                KmsgEvent::Report(r) => reports.push(*r),
                KmsgEvent::OomGroup(g) => {
                    g.mark_first(&mut reports);
                    groups.push(g);
                }
                _ => {}
            }
        }
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].cgroup, "/job");
        let pids: Vec<u32> = reports.iter().map(|r| r.killed.pid).collect();
        assert_eq!(pids, [3129, 3130, 3131]);
        for r in &reports {
            assert_eq!(r.oom_group.as_deref(), Some("/job"), "{}", r.killed.pid);
        }
        // The first has the header; the members have their kill lines only.
        assert!(reports[0].summary.is_some());
        assert!(reports[1].summary.is_none() && reports[2].summary.is_none());
        // A later, unrelated OOM is not part of it.
        let mut later = lines.clone();
        later.extend(V1_MEMCG_6_18);
        let last = feed(&later)
            .into_iter()
            .filter_map(|e| match e {
                KmsgEvent::Report(r) => Some(r),
                _ => None,
            })
            .next_back()
            .unwrap();
        assert_eq!(last.oom_group, None);
    }

    #[test]
    fn a_header_for_another_pid_is_not_joined() {
        let mut lines = V1_MEMCG_6_18[..20].to_vec();
        lines.push("Memory cgroup out of memory: Killed process 999 (other) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:0kB oom_score_adj:0");
        let r = one_report(&lines);
        assert_eq!(r.killed.pid, 999);
        assert!(r.summary.is_none() && r.tasks.is_empty());
    }

    #[test]
    fn xid_lines() {
        // (line, code, pci, pid, name, message start)
        type Case<'a> = (&'a str, u32, &'a str, Option<u32>, Option<&'a str>, &'a str);
        let cases: &[Case] = &[
            (
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
                79,
                "0000:3b:00",
                Some(1234),
                Some("python"),
                "GPU has fallen off the bus.",
            ),
            (
                "NVRM: Xid (PCI:0000:18:00): 31, pid=2561, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS",
                31,
                "0000:18:00",
                Some(2561),
                Some("python3"),
                "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS",
            ),
            (
                "NVRM: Xid (PCI:0000:02:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)",
                13,
                "0000:02:00",
                None,
                None,
                "Graphics SM Warp Exception on (GPC 0",
            ),
        ];
        for &(line, code, pci, pid, name, msg) in cases {
            let x = parse_xid(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(
                (x.code, x.pci.as_str(), x.pid, x.name.as_deref()),
                (code, pci, pid, name),
                "{line}"
            );
            assert!(x.message.starts_with(msg), "{line}: {}", x.message);
        }
        // Older drivers, NVSwitches, a hidden address.
        let old = parse_xid("NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120").unwrap();
        assert_eq!(
            (old.code, old.pci.as_str(), old.sxid),
            (31, "0000:01:00", false)
        );
        let sw = parse_xid("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0}")
            .unwrap();
        assert_eq!(
            (sw.code, sw.pci.as_str(), sw.sxid),
            (12028, "0000:84:00.0", true)
        );
        let hidden = parse_xid("NVRM: Xid (PCI:...): 145, RLW_REMAP").unwrap();
        assert_eq!((hidden.code, hidden.pci.as_str()), (145, "..."));
        for bad in [
            "NVRM: Xid (PCI:0000:02:00): abc",
            "some program: Xid (PCI:0000:02:00): 79, not the driver",
            "NVRM: loading driver",
            "Xid 79",
        ] {
            assert!(parse_xid(bad).is_none(), "{bad}");
        }
        assert_eq!(pci_key("00000000:3B:00.0"), pci_key("0000:3b:00"));
        assert_eq!(pci_key("0000:3b:00"), Some((0x3b, 0)));
        assert_ne!(pci_key("0000:3b:00"), pci_key("0000:18:00"));
        let evs = feed(&[
            "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=x, An uncorrectable double bit error",
        ]);
        assert!(matches!(&evs[0], KmsgEvent::Xid(x) if x.code == 48));
    }

    #[test]
    fn reaper_line() {
        let evs = feed(&[
            "oom_reaper: reaped process 3129 (python3), now anon-rss:12kB, file-rss:0kB, shmem-rss:0kB",
        ]);
        assert!(
            matches!(&evs[0], KmsgEvent::Reaped(r) if r.pid == 3129 && r.anon_rss_kb == Some(12) && r.comm == "python3")
        );
    }

    #[test]
    fn a_huge_task_table_keeps_its_largest_and_most_preferred_rows() {
        let mut lines = vec![
            "x invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"
                .to_string(),
            "Tasks state (memory values in pages):".into(),
            "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name"
                .into(),
        ];
        let n = 100_000u32;
        for i in 0..n {
            // Small tasks, one large one and one the kernel prefers.
            let (rss, adj) = match i {
                77_777 => (900_000, 0),
                88_888 => (10, 1000),
                _ => (100 + u64::from(i % 1000), 0),
            };
            lines.push(format!(
                "[{:7}] 0 {:5} 1000 {rss} 45056 0 {adj} w{i}",
                10_000 + i,
                10_000 + i
            ));
        }
        lines.push("Memory cgroup out of memory: Killed process 87777 (w77777) total-vm:4000kB, anon-rss:3600000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:44kB oom_score_adj:0".into());
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let r = one_report(&refs);
        assert_eq!(r.tasks.len(), MAX_TASK_ROWS);
        assert_eq!(r.tasks_omitted, u64::from(n) - MAX_TASK_ROWS as u64);
        for pid in [87_777, 98_888] {
            assert!(r.tasks.iter().any(|t| t.pid == pid), "{pid} kept");
        }
        assert!(
            r.tasks.windows(2).all(|w| w[0].pid < w[1].pid),
            "in printed order"
        );
    }

    #[test]
    fn kmsg_escapes_are_undone() {
        let r = parse_record(
            "6,7,8,-;Killed process 5 (m\\xe2\\x80\\xaehog) in /caf\\xc3\\xa9 a\\x5cx41 \\xzz\\x4",
        )
        .unwrap();
        assert_eq!(
            r.text,
            "Killed process 5 (m\u{202e}hog) in /caf\u{e9} a\\x41 \\xzz\\x4"
        );
    }

    #[test]
    fn garbage_is_ignored_without_panic() {
        let garbage = [
            "",
            "Killed process",
            "Killed process abc (x)",
            "oom-kill:",
            "oom-kill:constraint=",
            "x invoked oom-killer: ",
            "memory: usage lots",
            "[  12] not a row",
            "Memory cgroup out of memory: Killed process 12 (unterminated",
            "\u{0}\u{1}\u{2}",
        ];
        let evs = feed(&garbage);
        assert!(evs.is_empty(), "{evs:?}");
    }

    #[test]
    fn a_summary_line_cut_by_printk_is_said_to_be_cut() {
        let long = format!("/{}", "k".repeat(900));
        let mut lines: Vec<String> = V1_MEMCG_6_18.iter().map(|l| l.to_string()).collect();
        let i = lines
            .iter()
            .position(|l| l.starts_with("oom-kill:"))
            .unwrap();
        let full = format!(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={long},task_memcg={long},task=python3,pid=3129,uid=0"
        );
        lines[i] = full[..1000].to_string();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let r = one_report(&refs);
        assert!(r.summary.is_none());
        assert_eq!(r.summary_cut, Some(1000));
        assert_eq!(r.killed.pid, 3129, "the rest of the report is read");
    }

    #[test]
    fn lines_written_by_userspace_are_never_reports() {
        // `echo '<3>...' > /dev/kmsg` from a process: facility LOG_USER (prio 11).
        let mut asm = Assembler::default();
        let mut out = Vec::new();
        for (i, l) in V1_MEMCG_6_18.iter().enumerate() {
            let rec = parse_record(&format!("11,{i},{},-;{l}", 1_000 + i)).unwrap();
            out.extend(asm.push(&rec));
        }
        assert!(out.is_empty(), "{out:?}");
        // The same lines from the kernel (prio 3) are a report.
        for (i, l) in V1_MEMCG_6_18.iter().enumerate() {
            let rec = parse_record(&format!("3,{i},{},-;{l}", 2_000 + i)).unwrap();
            out.extend(asm.push(&rec));
        }
        assert!(out.iter().any(|e| matches!(e, KmsgEvent::Report(_))));
    }

    #[test]
    fn records() {
        let r =
            parse_record("6,1234,134499307,-;Memory cgroup out of memory: Killed\n SUBSYSTEM=x\n")
                .unwrap();
        assert_eq!((r.level, r.seq, r.ts_us), (6, 1234, 134499307));
        assert_eq!(r.text, "Memory cgroup out of memory: Killed");
        assert_eq!(parse_record("12,7,99,c,extra;hi").unwrap().level, 4);
        assert_eq!(parse_record("12,7,99,c,extra;hi").unwrap().facility, 1);
        assert_eq!(parse_record("3,7,99,-;hi").unwrap().facility, 0);
        for bad in ["", "no semicolon", "x,1,2,-;msg", "6,1;msg"] {
            assert!(parse_record(bad).is_err(), "{bad}");
        }
    }
}
