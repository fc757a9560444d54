//! Saved kernel logs: the common shapes of a kernel log line turned into
//! the records the OOM report assembler reads, so a kill can be explained
//! from a log that came in a ticket, from the previous boot's journal, or
//! from a node where no recorder ran.
//!
//! Shapes: raw /dev/kmsg records (`6,1234,5678,-;text`), `dmesg`
//! (`[  123.456789] text`), `dmesg -T` (`[Mon Mar  3 10:00:00 2025] text`),
//! syslog and kern.log (`Mar  3 10:00:00 host kernel: [  123.456789] text`),
//! and `journalctl -k` in its short, short-iso, short-precise-iso and
//! short-monotonic forms. Logs of several hosts may be interleaved: each
//! host's lines are assembled on their own. What a line does not give (a
//! wall time, a year) is not invented: a report's wall time is known only
//! when its lines carry one; `dmesg -T` and syslog times are local times,
//! taken as UTC unless they say otherwise.

mod shapes;
#[cfg(test)]
mod tests;
mod time;

use shapes::*;
pub use shapes::{parse_line, parse_pasted};
use time::*;

use std::{collections::HashMap, io::BufRead};

use super::kmsg::{Assembler, KmsgEvent, KmsgRecord, OomReport};

/// One kernel log line, whatever its shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// The host that logged it, when the line names one.
    pub host: Option<String>,
    /// Microseconds since boot, when the line gives them.
    pub mono_us: Option<u64>,
    /// Wall time, ns since the epoch, when the line gives it.
    pub wall_ns: Option<i64>,
    /// Whether it is the kernel's (false for a record userspace wrote to
    /// /dev/kmsg, when the shape tells).
    pub kernel: bool,
    /// Whether its time stamp has a known shape but cannot be a time (out
    /// of range: a year 2218, a boot 10^14 s long, a 25th hour): the line
    /// counts, its time is not known.
    pub unreadable: bool,
    /// Whether it has no time stamp at all (bare kernel text, `kernel:
    /// text`): it counts, at the time of the line before it.
    pub untimed: bool,
    /// A userspace OOM killer's line (`systemd-oomd`, `earlyoom`, with its
    /// pid when the line names it), not the kernel's.
    pub program: Option<(&'static str, Option<u32>)>,
    /// The year its wall time was taken in, and its month and day, when the
    /// stamp has no year (syslog): a guess, said so.
    pub year_guess: Option<(i64, i64, i64)>,
    /// Whether its wall time has no zone (syslog, `dmesg -T`: local
    /// time, taken as UTC).
    pub zone_guessed: bool,
    /// The message.
    pub text: String,
}

/// A report found in a saved log.
#[derive(Clone, Debug)]
pub struct LogReport {
    /// The kernel's report.
    pub report: OomReport,
    /// The host, when the log names it.
    pub host: Option<String>,
    /// Wall time minus monotonic time on that host, when the log gives
    /// both (or only wall times: then the report's stamps are wall times).
    pub mono_to_wall_ns: Option<i64>,
    /// Whether the stamp of its kill line could not be read (then its
    /// stamps are the last readable ones before it on that host, or 0).
    pub time_unreadable: bool,
    /// Whether its kill line had no stamp at all (bare kernel text).
    pub untimed: bool,
    /// What its wall time guessed: the year it was taken in (the stamp
    /// has none), and whether its zone was taken as UTC.
    pub guessed: (Option<i64>, bool),
}

/// An NVIDIA Xid or SXid line found in a saved log.
#[derive(Clone, Debug)]
pub struct LogXid {
    /// The line, read (its `ts_us` on the host's clock, as a report's).
    pub xid: super::kmsg::Xid,
    /// The host, when the log names it.
    pub host: Option<String>,
    /// Wall time minus the stamps' time on that host, when the log gives it.
    pub mono_to_wall_ns: Option<i64>,
    /// Whether its line had no stamp.
    pub untimed: bool,
}

/// A kill by a userspace OOM killer found in a saved log.
#[derive(Clone, Debug)]
pub struct LogUserKill {
    /// What the killer said.
    pub kill: super::killers::UserKill,
    /// Its stamp on the host's clock, µs (as a report's `ts_us`).
    pub ts_us: u64,
    /// The host, when the log names it.
    pub host: Option<String>,
    /// Wall time minus the stamps' time on that host, when the log gives it.
    pub mono_to_wall_ns: Option<i64>,
    /// Whether its line had no stamp (or one that cannot be read).
    pub untimed: bool,
    /// What its wall time guessed (see [`LogReport::guessed`]).
    pub guessed: (Option<i64>, bool),
}

/// What a saved log holds.
#[derive(Debug, Default)]
pub struct SavedLog {
    /// Its OOM reports, in the order they end.
    pub reports: Vec<LogReport>,
    /// Its Xid and SXid lines, in order.
    pub xids: Vec<LogXid>,
    /// Kills by userspace OOM killers (systemd-oomd, earlyoom, kubelet), in
    /// order.
    pub user_kills: Vec<LogUserKill>,
    /// systemd's notices of units that lost a process to the kernel's OOM
    /// killer: (host, its stamp on the host's clock in µs, unit).
    pub unit_notices: Vec<(Option<String>, u64, String)>,
    /// What was read.
    pub shape: LogShape,
}

/// The longest line put back together from wrapped pieces: printk cuts a
/// record at about 1 KiB, so more is no kernel line; what goes beyond is
/// dropped (and the time to read a log stays linear in its size).
pub const MAX_REJOINED: usize = 16 * 1024;

/// Per host: the assembler and the clock the lines give.
#[derive(Default)]
struct HostLog {
    asm: Assembler,
    mono_to_wall: Option<i64>,
    seq: u64,
    /// The last readable stamp, µs.
    last_us: u64,
    /// Whether the last line had no stamp.
    last_untimed: bool,
    /// The userspace OOM killers' lines.
    killers: super::killers::Killers,
    /// What the last line's wall time guessed: its year, its zone.
    guessed: (Option<i64>, bool),
    /// A header pasted below its kill was just given to that kill: its
    /// stack dump's `CPU:` line names the trigger's pid.
    late_header: bool,
}

/// What a saved log held, besides its reports: enough to tell an empty
/// file, a binary one and one that is no kernel log from a kernel log
/// without a kill.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogShape {
    /// Lines read.
    pub lines: usize,
    /// Lines of a kernel log shape.
    pub recognized: usize,
    /// Lines with a NUL byte (a binary file, or a corrupt log).
    pub binary: usize,
}

impl LogShape {
    /// Why nothing in this input can be explained, when it is not a
    /// kernel log at all (None: it is one).
    pub fn not_a_log(&self) -> Option<&'static str> {
        if self.lines == 0 {
            Some("is empty")
        } else if self.recognized == 0 && self.binary > 0 {
            Some("is binary data, not a text log")
        } else if self.recognized == 0 {
            Some(
                "has no kernel log line of a known shape (dmesg, dmesg -T, syslog or kern.log, journalctl -k, /dev/kmsg records)",
            )
        } else {
            None
        }
    }
}

/// Every OOM report of a saved log, in the order they end. `year` is the
/// year of syslog stamps (which have none).
pub fn read_reports(input: impl BufRead, year: i64) -> std::io::Result<Vec<LogReport>> {
    read_log(input, year).map(|l| l.reports)
}

/// [`read_reports`], with the Xid lines and the shape of what was read.
pub fn read_log(input: impl BufRead, year: i64) -> std::io::Result<SavedLog> {
    let mut hosts: HashMap<Option<String>, HostLog> = HashMap::new();
    let mut log = SavedLog::default();
    let mut shape = LogShape::default();
    // A line is held until the next: a line with no prefix of any shape
    // that follows a long one is its tail, cut off by a mail client or a
    // ticket system's wrapping.
    let mut held: Option<LogLine> = None;
    let mut last_host: Option<String> = None;
    let mut may_wrap = false;
    let mut verbose: Option<(u64, i64)> = None;
    let mut qp = QuotedPrintable::default();
    // The lines of the input, and the line a quoted-printable mail's
    // soft breaks still held at its end.
    let lines = input.split(b'\n').map(Some).chain(std::iter::once(None));
    for line in lines {
        let raw = match line {
            Some(l) => l?,
            None => match qp.rest() {
                Some(rest) => rest.into_bytes(),
                None => break,
            },
        };
        shape.lines += 1;
        if raw.contains(&0) {
            shape.binary += 1;
            continue;
        }
        let text = String::from_utf8_lossy(&raw);
        let Some(line) = qp.feed(text.trim_end_matches(['\r', '\n'])) else {
            continue;
        };
        let line: &str = &line;
        // journalctl -o verbose: an entry's stamps on its header line, its
        // message on a `MESSAGE=` line below it.
        if let Some(stamps) = verbose_header(line) {
            verbose = Some(stamps);
            continue;
        }
        if let Some(msg) = line.trim_start().strip_prefix("MESSAGE=")
            && let Some((mono_us, wall_ns)) = verbose.take()
        {
            shape.recognized += 1;
            let mut l = with_mono(None, Some(wall_ns), msg);
            l.mono_us = l.mono_us.or(Some(mono_us));
            if let Some(prev) = held.replace(l) {
                feed(&mut hosts, &mut log, &mut last_host, prev);
            }
            may_wrap = false;
            continue;
        }
        // Messages glued on one line are read one by one.
        let mut from = 0;
        let mut pieces = Vec::new();
        for at in glued_starts(line) {
            pieces.push(&line[from..at]);
            from = at;
        }
        pieces.push(&line[from..]);
        for (i, piece) in pieces.into_iter().enumerate() {
            match (parse_pasted(piece, year), held.as_mut()) {
                (Some(l), _) => {
                    shape.recognized += 1;
                    if let Some(prev) = held.replace(l) {
                        feed(&mut hosts, &mut log, &mut last_host, prev);
                    }
                }
                (None, Some(prev)) if i == 0 && may_wrap => {
                    if let Some(tail) = tail(piece) {
                        rejoin(&mut prev.text, tail, piece.starts_with([' ', '\t']));
                    }
                }
                (None, _) => {}
            }
        }
        // A line cut inside a field's name waits for its rest, however
        // short the piece before (`_memcg=/test512mb,task_m` / `emcg=`).
        may_wrap = line.trim().chars().count() >= WRAP_WIDTH
            || held.as_ref().is_some_and(|h| cut_in_a_key(&h.text));
    }
    if let Some(prev) = held {
        feed(&mut hosts, &mut log, &mut last_host, prev);
    }
    for (host, h) in &mut hosts {
        if let Some(r) = h.asm.finish() {
            log.reports.push(LogReport {
                report: *r,
                host: host.clone(),
                mono_to_wall_ns: h.mono_to_wall,
                time_unreadable: false,
                untimed: h.last_untimed,
                guessed: h.guessed,
            });
        }
    }
    one_of_each(&mut log.reports);
    log.shape = shape;
    Ok(log)
}

/// Keeps one report of a kill a paste holds twice (a quoted copy of the
/// kill line beside the console's log, a summary above the whole report):
/// the same victim on the same host with the same figures is one kill, as
/// the kernel kills a process once (and prints a `memory.oom.group`
/// kill's first victim again with its group). The copy with a time stays,
/// else the first, with the group either says; a kill's choice line apart
/// from its kill line goes.
fn one_of_each(reports: &mut Vec<LogReport>) {
    type Key = (Option<String>, u32, String, u64, Option<u64>);
    let key = |r: &LogReport| -> Option<Key> {
        let k = &r.report.killed;
        Some((
            r.host.clone(),
            k.pid,
            k.comm.clone(),
            k.total_vm_kb?,
            k.anon_rss_kb,
        ))
    };
    let mut first: HashMap<Key, usize> = HashMap::new();
    let mut gone = vec![false; reports.len()];
    for i in 0..reports.len() {
        let Some(k) = key(&reports[i]) else {
            continue;
        };
        match first.get(&k) {
            None => {
                first.insert(k, i);
            }
            Some(&j) => {
                let (keep, drop) = if reports[j].untimed && !reports[i].untimed {
                    first.insert(k, i);
                    (i, j)
                } else {
                    (j, i)
                };
                gone[drop] = true;
                // The group kill's second line of its first victim says
                // the group.
                if reports[keep].report.oom_group.is_none() {
                    reports[keep].report.oom_group = reports[drop].report.oom_group.take();
                }
            }
        }
    }
    // The kernel's choice of a victim (`Kill process N ... or sacrifice
    // child`) pasted apart from the same kill's `Killed process` line (a
    // grep of syslog above the dmesg of the same report): the kill line's
    // report is the kill.
    // Hosts of the kill lines' reports, by victim: one pass, not one per
    // choice (a log of a million choices stays linear).
    let mut killed: HashMap<(u32, &str), Vec<&Option<String>>> = HashMap::new();
    for (r, _) in reports
        .iter()
        .zip(&gone)
        .filter(|(r, g)| !**g && !r.report.chosen_only)
    {
        killed
            .entry((r.report.killed.pid, r.report.killed.comm.as_str()))
            .or_default()
            .push(&r.host);
    }
    let chosen_gone: Vec<bool> = reports
        .iter()
        .zip(&gone)
        .map(|(c, g)| {
            *g || c.report.chosen_only
                && killed
                    .get(&(c.report.killed.pid, c.report.killed.comm.as_str()))
                    .is_some_and(|hosts| {
                        hosts
                            .iter()
                            .any(|h| **h == c.host || h.is_none() || c.host.is_none())
                    })
        })
        .collect();
    drop(killed);
    gone = chosen_gone;
    let mut i = 0;
    reports.retain(|_| {
        i += 1;
        !gone[i - 1]
    });
}

/// A raw quoted-printable mail (a list archive's `raw` message): `=3D`
/// for `=`, `=XX` for other bytes, and a line ending in `=` continued on
/// the next. Off until a line holds `=3D` and ends in a soft break, as a
/// mail's long lines do and no kernel message does; a continued line is
/// held up to [`MAX_HELD`] bytes.
#[derive(Default)]
struct QuotedPrintable {
    on: bool,
    held: String,
}

/// The most of a quoted-printable line held across soft breaks.
const MAX_HELD: usize = 64 << 10;

impl QuotedPrintable {
    /// The line to read for `line`, decoded once the input is known to be
    /// quoted-printable; `None` while a soft break holds it.
    fn feed<'a>(&mut self, line: &'a str) -> Option<std::borrow::Cow<'a, str>> {
        // A soft break on the same line: a task named `3DMark` in a summary
        // (`task=3DMark`) is no mail, and its `pid=12..` no escape.
        self.on |= line.contains("=3D") && line.ends_with('=');
        if !self.on {
            return Some(line.into());
        }
        if let Some(part) = line.strip_suffix('=')
            && self.held.len() + part.len() <= MAX_HELD
        {
            self.held.push_str(part);
            return None;
        }
        let mut whole = std::mem::take(&mut self.held);
        whole.push_str(line);
        Some(decode_qp(&whole).into())
    }

    /// What a soft break still held at the end of the input.
    fn rest(&mut self) -> Option<String> {
        (!self.held.is_empty()).then(|| std::mem::take(&mut self.held))
    }
}

/// `=XX` escapes to their bytes; anything else as it is.
fn decode_qp(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'='
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A journal entry's header in `journalctl -o verbose`: `Thu 2023-02-02
/// 11:49:13.015489 CET [s=...;i=...;b=...;m=1f6726955fe3;t=5f3b550c118c1;x=...]`
/// -> (monotonic µs, wall ns), from its `m=` and `t=` fields (hex µs).
fn verbose_header(line: &str) -> Option<(u64, i64)> {
    let fields = line.trim_end().strip_suffix(']')?.rsplit_once(" [s=")?.1;
    let hex = |key: &str| {
        fields
            .split(';')
            .find_map(|f| f.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v, 16).ok())
    };
    let (m, t) = (hex("m=")?, hex("t=")?);
    Some((m, i64::try_from(t).ok()?.checked_mul(1000)?))
}

/// Lines shorter than this were not wrapped: mail clients and ticket
/// systems wrap at 60 to 80 columns, rarely less.
const WRAP_WIDTH: usize = 40;

/// The text of a wrapped line's tail, or None when the line is none: a
/// code fence, a shell prompt, a blank line, or another tool's structured
/// output (`key: value`, `{...}`, `- item`; the kernel writes `key:value`
/// with no space).
fn tail(piece: &str) -> Option<&str> {
    let t = piece.trim().trim_start_matches(['>', ' ']);
    let prompt = t.starts_with("$ ")
        || t.starts_with("# ")
        || (t.starts_with('[') && (t.contains("]# ") || t.contains("]$ ")));
    let key = t.split_once(':').is_some_and(|(k, v)| {
        k.starts_with(|c: char| c.is_ascii_lowercase())
            && k.chars()
                .all(|c| c.is_ascii_lowercase() || " _-".contains(c))
            && (v.is_empty() || v.starts_with(' '))
    });
    // Another program's syslog or journal line (a stamp of its own).
    let stamped = syslog_like(t)
        || mono_stamp_at(t, 0) == Some(0)
        || dmesg_t_stamp(t)
        || last_iso_stamp(t.get(..20).unwrap_or(t)) == Some(0);
    // The kernel's own words (`out of memory: Killed process ...`, where a
    // wrap cut `Memory cgroup` from it; `oom-killer: gfp_mask=...` cut from
    // its `comm invoked`) are no other tool's `key: value`.
    let kernel = ["Killed process ", "oom-killer: gfp_mask=", "oom-kill:"]
        .iter()
        .any(|p| t.contains(p));
    let structured =
        (key && !kernel) || stamped || t.starts_with(['{', '"']) || t.starts_with("- ");
    // A list item's marker before the next line's stamp (`- [ 4890.4]
    // ...`) is that line's, no tail of the one before.
    let marker = matches!(t, "-" | "*" | "+" | "•");
    // A mark where lines were left out (`[...]`, `<snip>`) is none either.
    let elided = matches!(
        t.trim_matches(['[', ']', '<', '>', '(', ')', ' ']),
        ".." | "..." | "...." | "…" | "snip" | "snipped" | "cut"
    );
    (!t.is_empty() && !t.starts_with("```") && !prompt && !structured && !marker && !elided)
        .then_some(t)
}

/// Puts a wrapped line's tail back. A soft wrap replaced a space; a hard
/// wrap cut a word too long for the line (the kernel's
/// `oom-kill:constraint=...,task=...` has no space in 150 characters):
/// that is a last word of 30 characters or more, or a tail that goes on
/// with a `,` or `)`; a tail indented by the wrapping (a terminal's, a
/// pager's) was wrapped at a space. Only the last 30 bytes are looked at,
/// and nothing past [`MAX_REJOINED`] is kept: time and memory stay linear
/// in the log.
fn rejoin(text: &mut String, tail: &str, indented: bool) {
    const LONG_WORD: usize = 30;
    if text.len() >= MAX_REJOINED {
        return;
    }
    let mut from = text.len().saturating_sub(LONG_WORD);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let long_last_word = text.len() >= LONG_WORD && !text[from..].contains(' ');
    let parted = parted_figure(text, tail);
    let hard =
        text.is_empty() || (long_last_word && !indented) || tail.starts_with([',', ')']) || parted;
    if !hard {
        text.push(' ');
    } else if !parted && summary_fields_parted(text, tail) {
        text.push(',');
    }
    let mut room = MAX_REJOINED.saturating_sub(text.len()).min(tail.len());
    while !tail.is_char_boundary(room) {
        room -= 1;
    }
    text.push_str(&tail[..room]);
}

/// The fields of a kill line.
const KILL_KEYS: &[&str] = &[
    "total-vm:",
    "anon-rss:",
    "file-rss:",
    "shmem-rss:",
    "UID:",
    "pgtables:",
    "oom_score_adj:",
];

/// Whether a mail wrapped a kill line or a summary inside one of its
/// fields or figures (`file-rss:12704k` / `B, ...`, `sh` / `mem-rss:0kB`,
/// `oom` / `_memcg=/test512mb,task_m` / `emcg=`): the two pieces are one
/// word.
fn parted_figure(text: &str, tail: &str) -> bool {
    let summary = text.contains("oom-kill:");
    if !text.contains("Killed process") && !summary {
        return false;
    }
    let last = text.rsplit([' ', ',']).next().unwrap_or("");
    let first = tail.split([' ', ',']).next().unwrap_or("");
    if last.is_empty() || first.is_empty() {
        return false;
    }
    let joined = format!("{last}{first}");
    let key = KILL_KEYS
        .iter()
        .any(|k| !last.contains(':') && joined.starts_with(k))
        || (summary
            && !last.contains('=')
            && SUMMARY_KEYS
                .iter()
                .any(|k| joined.strip_prefix(k).is_some_and(|r| r.starts_with('='))));
    let unit = KILL_KEYS.iter().any(|k| last.starts_with(k))
        && ((last.ends_with('k') && first.starts_with("B"))
            || (last.ends_with(|c: char| c.is_ascii_digit()) && first.starts_with("kB")));
    key || unit
}

/// Whether a summary or kill line ends inside the name of one of its
/// fields (`...,task_m`).
fn cut_in_a_key(text: &str) -> bool {
    let last = text.rsplit([' ', ',']).next().unwrap_or("");
    if last.is_empty() || last.contains(['=', ':']) {
        return false;
    }
    (text.contains("oom-kill:")
        && SUMMARY_KEYS
            .iter()
            .any(|k| k.len() > last.len() && k.starts_with(last)))
        || (text.contains("Killed process")
            && KILL_KEYS
                .iter()
                .any(|k| k.len() > last.len() && k.starts_with(last)))
}

/// Keys of the kernel's `oom-kill:` summary line.
const SUMMARY_KEYS: &[&str] = &[
    "constraint",
    "nodemask",
    "cpuset",
    "mems_allowed",
    "oom_memcg",
    "task_memcg",
    "task",
    "pid",
    "uid",
];

/// Whether a summary line was parted between two of its fields and lost
/// the comma between them (a paste cut short and re-wrapped:
/// `oom-kill:constraint=CONSTRAINT_MEMCG` then `task=java,pid=90057`):
/// the text ends in a whole `key=value` and the tail starts with another.
/// A cut inside a field (`...,ta` then `sk=java`) ends in no `key=`.
fn summary_fields_parted(text: &str, tail: &str) -> bool {
    let keyed = |s: &str| {
        s.split_once('=')
            .is_some_and(|(k, v)| SUMMARY_KEYS.contains(&k) && !v.is_empty())
    };
    let last = text.rsplit([',', ':']).next().unwrap_or("");
    text.contains("oom-kill:") && keyed(last) && keyed(tail)
}

/// Whether `r` repeats the last kill of its host: the same process, at
/// most a second later, with nothing of a report of its own.
fn repeated(out: &[LogReport], host: &Option<String>, r: &OomReport) -> bool {
    out.iter().rev().find(|o| &o.host == host).is_some_and(|o| {
        o.report.killed.pid == r.killed.pid
            && o.report.killed.comm == r.killed.comm
            && r.ts_us.abs_diff(o.report.ts_us) <= 1_000_000
            && r.trigger_comm.is_none()
            && r.tasks.is_empty()
    })
}

/// Hands one whole line to its host's assembler. A line with neither a
/// host nor a time of its own (bare text between syslog lines: a paste
/// that lost a line's prefix) is of the host of the line before it.
fn feed(
    hosts: &mut HashMap<Option<String>, HostLog>,
    log: &mut SavedLog,
    last_host: &mut Option<String>,
    mut l: LogLine,
) {
    if l.host.is_none() && l.mono_us.is_none() && l.wall_ns.is_none() {
        l.host.clone_from(last_host);
    } else {
        last_host.clone_from(&l.host);
    }
    let SavedLog {
        reports: out,
        xids,
        user_kills,
        unit_notices,
        ..
    } = log;
    let h = hosts.entry(l.host.clone()).or_insert_with(|| HostLog {
        asm: Assembler::for_saved_log(),
        ..HostLog::default()
    });
    // A stamp without a year is in the last twelve months: one that would
    // be more than two days ahead is of the year before.
    if let Some((y, m, d)) = l.year_guess
        && let Some(w) = l.wall_ns.as_mut()
        && *w > crate::util::time::wall_now_ns() + 2 * 86_400_000_000_000
    {
        *w -= (days_from_civil(y, m, d) - days_from_civil(y - 1, m, d)) * 86_400_000_000_000;
        l.year_guess = Some((y - 1, m, d));
    }
    // A line without a time (`dmesg -H`'s offsets, bare text) is at the
    // time before it, and so is its guess.
    if l.mono_us.is_some() || l.wall_ns.is_some() {
        h.guessed = (l.year_guess.map(|(y, _, _)| y), l.zone_guessed);
    }
    // The report's stamps: monotonic when the line has one (then the wall
    // time, when also given, fixes the host's offset), else the wall time
    // itself (offset 0).
    let ts_us = match (l.mono_us, l.wall_ns) {
        (Some(us), Some(w)) => {
            h.mono_to_wall = Some(w - us as i64 * 1000);
            us
        }
        (Some(us), None) => us,
        (None, Some(w)) => {
            h.mono_to_wall = Some(0);
            (w / 1000).max(0) as u64
        }
        // A stamp that cannot be read: the line still counts, at the
        // host's last readable time.
        (None, None) if l.unreadable || l.untimed => h.last_us,
        (None, None) => return,
    };
    h.last_us = ts_us;
    h.last_untimed = l.untimed;
    if let Some((program, pid)) = l.program {
        match h.killers.push(program, pid, &l.text) {
            Some(super::killers::Said::Kill(k)) => user_kills.push(LogUserKill {
                kill: *k,
                ts_us,
                host: l.host,
                mono_to_wall_ns: h.mono_to_wall,
                untimed: l.untimed || l.unreadable,
                guessed: h.guessed,
            }),
            Some(super::killers::Said::Escalated { pid, reason }) => {
                if let Some(u) = user_kills
                    .iter_mut()
                    .rev()
                    .find(|u| u.host == l.host && u.kill.pid == Some(pid))
                {
                    u.kill.signal = Some("SIGKILL");
                    u.kill.reason = format!("{}; {reason}", u.kill.reason);
                }
            }
            Some(super::killers::Said::Unit(unit)) => unit_notices.push((l.host, ts_us, unit)),
            None => {}
        }
        return;
    }
    // A summary line after its kill line (a paste sorted or reversed, or
    // a journal's order): the kill of its pid just before takes it.
    if let Some(summary) = l
        .text
        .strip_prefix("oom-kill:")
        .and_then(super::kmsg::parse_summary)
        && let Some(last) = out.iter_mut().rev().find(|r| r.host == l.host)
        && last.report.summary.is_none()
        && last.report.killed.pid == summary.pid
        && ts_us.abs_diff(last.report.ts_us) <= 1_000_000
    {
        last.report.summary = Some(summary);
        return;
    }
    // A header pasted below its kill line (in a block of its own), the
    // kill printed after it: the kill just before in the text, with no
    // header of its own, takes its trigger. A later report's header comes
    // after the kill in time too, and starts its own report.
    if let Some(header) = super::kmsg::parse_header(&l.text)
        && let Some(last) = out.iter_mut().rev().find(|r| r.host == l.host)
        // Only by the kernel's own stamp, and strictly before: a stamp of
        // whole seconds, or none, cannot tell a header before its kill
        // from the next report's.
        && l.mono_us.is_some()
        && !last.untimed
        && last.report.trigger_comm.is_none()
        && ts_us < last.report.ts_us
        && last.report.ts_us - ts_us <= 1_000_000
    {
        let r = &mut last.report;
        r.trigger_comm = Some(header.comm.to_string());
        r.gfp_mask = header.gfp_mask.map(String::from);
        r.order = header.order;
        h.late_header = true;
        return;
    }
    // Until its report's time has passed.
    if h.late_header
        && let Some(last) = out.iter_mut().rev().find(|r| r.host == l.host)
        && ts_us <= last.report.ts_us
    {
        let pid = super::kmsg::dump_task(&l.text).and_then(|(pid, _)| pid);
        if pid.is_none() || last.report.trigger_pid.is_some() {
            return;
        }
        h.late_header = false;
        last.report.trigger_pid = pid;
        return;
    }
    h.late_header = false;
    h.seq += 1;
    // A quoted line a mail client joined to the next, its `> ` inside
    // (`Kill process 7963 > (sge_qmaster) score 948`): no OOM report's
    // message has one.
    let text = if l.kernel && l.text.contains(" > ") {
        l.text.replace(" > ", " ")
    } else {
        l.text
    };
    let rec = KmsgRecord {
        seq: h.seq,
        ts_us,
        level: 4,
        facility: if l.kernel { 0 } else { 1 },
        text,
    };
    match h.asm.push(&rec) {
        // A kill line pasted twice (or printed twice, as 2.6 kernels did)
        // is one kill.
        Some(KmsgEvent::Report(r)) if repeated(out, &l.host, &r) => {}
        Some(KmsgEvent::Report(r)) => out.push(LogReport {
            report: *r,
            host: l.host,
            mono_to_wall_ns: h.mono_to_wall,
            time_unreadable: l.unreadable,
            untimed: l.untimed,
            guessed: h.guessed,
        }),
        // The same line twice (pasted twice, or quoted by a tool beside
        // the original) is one fault.
        Some(KmsgEvent::Xid(x))
            if xids.last().is_some_and(|p| {
                p.host == l.host
                    && p.xid.ts_us == x.ts_us
                    && p.xid.code == x.code
                    && p.xid.pci == x.pci
                    && p.xid.pid == x.pid
                    && (p.xid.message.starts_with(&x.message)
                        || x.message.starts_with(&p.xid.message))
            }) => {}
        Some(KmsgEvent::Xid(x)) => xids.push(LogXid {
            xid: x,
            host: l.host,
            mono_to_wall_ns: h.mono_to_wall,
            untimed: l.untimed,
        }),
        // The first kill of a memory.oom.group incident: this host's latest.
        Some(KmsgEvent::OomGroup(g)) => {
            if let Some(last) = out.iter_mut().rev().find(|r| r.host == l.host) {
                g.mark_first(std::slice::from_mut(&mut last.report));
            }
        }
        _ => {}
    }
}
