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
}

/// The longest line put back together from wrapped pieces: printk cuts a
/// record at about 1 KiB, so more is no kernel line; what goes beyond is
/// dropped (and the time to read a log stays linear in its size).
pub const MAX_REJOINED: usize = 16 * 1024;

/// A time stamp of a known shape: its value, or None when it cannot be a
/// time.
type Stamp<T> = Option<T>;

/// The longest uptime a monotonic stamp may say: a century.
const MAX_UPTIME_S: u64 = 100 * 366 * 86_400;
/// Years a wall-time stamp may say.
const YEARS: std::ops::RangeInclusive<i64> = 1970..=2200;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Wall ns of a civil date and time of day, `offset_s` east of UTC; None
/// when the date cannot be one (a year outside [`YEARS`], a 13th month, a
/// 32nd day).
fn wall(
    (y, mo, d): (i64, i64, i64),
    (h, mi, s): (i64, i64, i64),
    frac_ns: i64,
    offset_s: i64,
) -> Stamp<i64> {
    if !YEARS.contains(&y) || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    Some(
        ((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_s) * 1_000_000_000)
            + frac_ns,
    )
}

fn month(name: &str) -> Option<i64> {
    MONTHS.iter().position(|m| *m == name).map(|i| i as i64 + 1)
}

/// `HH:MM:SS` -> seconds of the day.
fn hms(t: &str) -> Option<(i64, i64, i64)> {
    let mut p = t.split(':').map(|v| v.parse::<i64>().ok());
    let (h, m, s) = (p.next()??, p.next()??, p.next()??);
    (h < 24 && m < 60 && s < 61).then_some((h, m, s))
}

/// `123.456789` -> microseconds; `Some(None)` for digits that cannot be
/// an uptime (more than [`MAX_UPTIME_S`]).
fn seconds_us(s: &str) -> Option<Stamp<u64>> {
    let (a, b) = s.trim().split_once('.')?;
    if a.is_empty()
        || b.is_empty()
        || !a.bytes().all(|c| c.is_ascii_digit())
        || !b.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let frac = format!("{:0<6}", b.get(..6).unwrap_or(b));
    let us: u64 = frac.parse().ok()?;
    Some(
        a.parse::<u64>()
            .ok()
            .filter(|w| *w <= MAX_UPTIME_S)
            .map(|w| w * 1_000_000 + us),
    )
}

/// `[  123.456789] ` at the start of `s`: (microseconds, rest).
fn mono_prefix(s: &str) -> Option<(Stamp<u64>, &str)> {
    let inner = s.strip_prefix('[')?;
    let (stamp, rest) = inner.split_once(']')?;
    Some((seconds_us(stamp)?, rest.strip_prefix(' ').unwrap_or(rest)))
}

/// `host kernel: text` -> (host, text).
fn host_kernel(s: &str) -> Option<(String, &str)> {
    let (host, rest) = s.split_once(' ')?;
    let text = rest.strip_prefix("kernel: ")?;
    Some((host.to_string(), text))
}

/// `2025-03-03T10:00:00[.123456][Z|+0000|+00:00]` -> wall ns;
/// `Some(None)` for one of that shape that cannot be a time.
fn iso(s: &str) -> Option<Stamp<i64>> {
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|v| v.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let (clock, zone) = match time.find(['Z', '+', '-']) {
        Some(i) => time.split_at(i),
        None => (time, ""),
    };
    // dmesg --time-format iso writes a comma before the fraction.
    let (hms_part, frac) = clock.split_once(['.', ',']).unwrap_or((clock, ""));
    let Some((h, mi, se)) = hms(hms_part) else {
        return Some(None);
    };
    let frac_ns: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").get(..9)?.parse().ok()?
    };
    let offset_s = match zone {
        "" | "Z" => 0,
        z => {
            let sign = if z.starts_with('-') { -1 } else { 1 };
            let digits: String = z[1..].chars().filter(char::is_ascii_digit).collect();
            let hh: i64 = digits.get(..2)?.parse().ok()?;
            let mm: i64 = digits.get(2..4).unwrap_or("00").parse().ok()?;
            sign * (hh * 3600 + mm * 60)
        }
    };
    Some(wall((y, mo, da), (h, mi, se), frac_ns, offset_s))
}

/// `HH:MM:SS` of a known shape (digits and colons): its seconds of the
/// day, or None when out of range.
fn hms_shaped(t: &str) -> Option<Stamp<(i64, i64, i64)>> {
    (t.split(':').count() == 3 && t.bytes().all(|c| c.is_ascii_digit() || c == b':'))
        .then(|| hms(t))
}

/// Parses one line of a saved kernel log; `None` when it is no kernel log
/// line of any known shape. `year` is used for syslog stamps, which have
/// none.
pub fn parse_line(line: &str, year: i64) -> Option<LogLine> {
    let line = line.trim_end_matches(['\r', '\n']);
    // Raw /dev/kmsg: `prio,seq,ts_us,flags[,...];text`.
    if let Ok(rec) = super::kmsg::parse_record(line) {
        return Some(LogLine {
            host: None,
            mono_us: Some(rec.ts_us),
            wall_ns: None,
            kernel: rec.facility == 0,
            unreadable: false,
            text: rec.text,
        });
    }
    // dmesg, and journalctl -o short-monotonic (`[ 1.2] host kernel: text`).
    if let Some((us, rest)) = mono_prefix(line) {
        let (host, text) = match host_kernel(rest) {
            Some((h, t)) => (Some(h), t),
            None => (None, rest),
        };
        return Some(LogLine {
            host,
            mono_us: us,
            wall_ns: None,
            kernel: true,
            unreadable: us.is_none(),
            text: text.to_string(),
        });
    }
    // dmesg -T: `[Mon Mar  3 10:00:00 2025] text`.
    if let Some(inner) = line.strip_prefix('[')
        && let Some((stamp, rest)) = inner.split_once(']')
    {
        let w: Vec<&str> = stamp.split_whitespace().collect();
        if let [_, mon, day, time, year] = w[..] {
            let mon = month(mon)?;
            let time = hms_shaped(time)?;
            let (year, day) = (year.parse::<i64>().ok()?, day.parse::<i64>().ok()?);
            let wall_ns = time.and_then(|t| wall((year, mon, day), t, 0, 0));
            return Some(LogLine {
                host: None,
                mono_us: None,
                wall_ns,
                kernel: true,
                unreadable: wall_ns.is_none(),
                text: rest.strip_prefix(' ').unwrap_or(rest).to_string(),
            });
        }
        return None;
    }
    // journalctl short-iso / short-precise-iso, RFC 3339 syslog:
    // `2025-03-03T10:00:00+0000 host kernel: text`.
    if line.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        let (stamp, rest) = line.split_once(' ')?;
        let wall_ns = iso(stamp)?;
        let (host, text) = host_kernel(rest)?;
        return Some(with_mono(Some(host), wall_ns, text));
    }
    // syslog, kern.log, journalctl short: `Mar  3 10:00:00 host kernel: text`.
    let mon = month(line.get(..3)?)?;
    let rest = line[3..].trim_start();
    let (day, rest) = rest.split_once(' ')?;
    let (time, rest) = rest.trim_start().split_once(' ')?;
    let day = day.parse::<i64>().ok()?;
    let wall_ns = hms_shaped(time)?.and_then(|t| wall((year, mon, day), t, 0, 0));
    let (host, text) = host_kernel(rest)?;
    Some(with_mono(Some(host), wall_ns, text))
}

/// A syslog-shaped line (its wall time None when it cannot be read),
/// with the monotonic stamp the kernel may have printed at the start of
/// its text (`kernel: [  123.456789] text`).
fn with_mono(host: Option<String>, wall_ns: Option<i64>, text: &str) -> LogLine {
    let (mono_us, bad_mono, text) = match mono_prefix(text) {
        Some((us, t)) => (us, us.is_none(), t),
        None => (None, false, text),
    };
    LogLine {
        host,
        mono_us,
        wall_ns,
        kernel: true,
        unreadable: bad_mono || (wall_ns.is_none() && mono_us.is_none()),
        text: text.to_string(),
    }
}

/// Per host: the assembler and the clock the lines give.
#[derive(Default)]
struct HostLog {
    asm: Assembler,
    mono_to_wall: Option<i64>,
    seq: u64,
    /// The last readable stamp, µs.
    last_us: u64,
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
    read_log(input, year).map(|(r, _)| r)
}

/// [`read_reports`], with the shape of what was read.
pub fn read_log(input: impl BufRead, year: i64) -> std::io::Result<(Vec<LogReport>, LogShape)> {
    let mut hosts: HashMap<Option<String>, HostLog> = HashMap::new();
    let mut out = Vec::new();
    let mut shape = LogShape::default();
    // A line is held until the next: a line with no prefix of any shape
    // that follows it is its tail, cut off by a mail client or a ticket
    // system's wrapping.
    let mut held: Option<LogLine> = None;
    for line in input.split(b'\n') {
        let line = line?;
        shape.lines += 1;
        if line.contains(&0) {
            shape.binary += 1;
            continue;
        }
        let line = String::from_utf8_lossy(&line);
        match (parse_line(&line, year), held.as_mut()) {
            (Some(l), _) => {
                shape.recognized += 1;
                if let Some(prev) = held.replace(l) {
                    feed(&mut hosts, &mut out, prev);
                }
            }
            (None, Some(prev)) if !line.trim().is_empty() => rejoin(&mut prev.text, line.trim()),
            (None, _) => {}
        }
    }
    if let Some(prev) = held {
        feed(&mut hosts, &mut out, prev);
    }
    Ok((out, shape))
}

/// Puts a wrapped line's tail back. A soft wrap replaced a space; a hard
/// wrap cut a word too long for the line (the kernel's
/// `oom-kill:constraint=...,task=...` has no space in 150 characters):
/// that is a last word of 30 characters or more, or a tail that goes on
/// with a `,` or `)`. Only the last 30 bytes are looked at, and nothing
/// past [`MAX_REJOINED`] is kept: time and memory stay linear in the log.
fn rejoin(text: &mut String, tail: &str) {
    const LONG_WORD: usize = 30;
    if text.len() >= MAX_REJOINED {
        return;
    }
    let mut from = text.len().saturating_sub(LONG_WORD);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let long_last_word = text.len() >= LONG_WORD && !text[from..].contains(' ');
    let hard = text.is_empty() || long_last_word || tail.starts_with([',', ')']);
    if !hard {
        text.push(' ');
    }
    let mut room = MAX_REJOINED.saturating_sub(text.len()).min(tail.len());
    while !tail.is_char_boundary(room) {
        room -= 1;
    }
    text.push_str(&tail[..room]);
}

/// Hands one whole line to its host's assembler.
fn feed(hosts: &mut HashMap<Option<String>, HostLog>, out: &mut Vec<LogReport>, l: LogLine) {
    let h = hosts.entry(l.host.clone()).or_default();
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
        (None, None) if l.unreadable => h.last_us,
        (None, None) => return,
    };
    h.last_us = ts_us;
    h.seq += 1;
    let rec = KmsgRecord {
        seq: h.seq,
        ts_us,
        level: 4,
        facility: if l.kernel { 0 } else { 1 },
        text: l.text,
    };
    match h.asm.push(&rec) {
        Some(KmsgEvent::Report(r)) => out.push(LogReport {
            report: *r,
            host: l.host,
            mono_to_wall_ns: h.mono_to_wall,
            time_unreadable: l.unreadable,
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

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_741_017_600_000_000_000; // 2025-03-03T16:00:00Z

    /// (line, host, monotonic us, wall ns, text).
    type Case<'a> = (&'a str, Option<&'a str>, Option<u64>, Option<i64>, &'a str);

    #[test]
    fn every_shape_of_a_line() {
        let cases: &[Case] = &[
            (
                "6,1234,5678901,-;Out of memory",
                None,
                Some(5_678_901),
                None,
                "Out of memory",
            ),
            (
                "[ 5678.901234] Out of memory",
                None,
                Some(5_678_901_234),
                None,
                "Out of memory",
            ),
            ("[    2.5] x", None, Some(2_500_000), None, "x"),
            (
                "[Mon Mar  3 16:00:00 2025] Out of memory",
                None,
                None,
                Some(T),
                "Out of memory",
            ),
            (
                "Mar  3 16:00:00 node-7 kernel: [ 5678.901234] Out of memory",
                Some("node-7"),
                Some(5_678_901_234),
                Some(T),
                "Out of memory",
            ),
            (
                "Mar 03 16:00:00 node-7 kernel: Out of memory",
                Some("node-7"),
                None,
                Some(T),
                "Out of memory",
            ),
            (
                "2025-03-03T17:00:00+0100 node-7 kernel: Out of memory",
                Some("node-7"),
                None,
                Some(T),
                "Out of memory",
            ),
            (
                "2025-03-03T16:00:00.250000+00:00 node-7 kernel: x",
                Some("node-7"),
                None,
                Some(T + 250_000_000),
                "x",
            ),
            (
                "2025-03-03T16:00:00,250000+00:00 node-7 kernel: x",
                Some("node-7"),
                None,
                Some(T + 250_000_000),
                "x",
            ),
            (
                "[ 5678.901234] node-7 kernel: Out of memory",
                Some("node-7"),
                Some(5_678_901_234),
                None,
                "Out of memory",
            ),
        ];
        for (line, host, mono, wall, text) in cases {
            let l = parse_line(line, 2025).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(l.host.as_deref(), *host, "{line}");
            assert_eq!(l.mono_us, *mono, "{line}");
            assert_eq!(l.wall_ns, *wall, "{line}");
            assert_eq!(l.text, *text, "{line}");
            assert!(l.kernel);
        }
        // A syslog line of another program, and prose, are not kernel lines.
        assert_eq!(
            parse_line("Mar  3 16:00:00 node-7 sshd[99]: Accepted", 2025),
            None
        );
        assert_eq!(parse_line("the node died at 4 pm", 2025), None);
        // The tasks table's `[  pid  ]` is no timestamp.
        assert_eq!(parse_line("[   3129]     0  3129", 2025), None);
        // A record userspace wrote to /dev/kmsg is marked as such.
        assert!(
            !parse_line("12,7,100,-;Killed process 1 (x)", 2025)
                .unwrap()
                .kernel
        );
    }

    /// The kernel's lines of one memcg OOM kill (6.18, cgroup v1).
    const REPORT: &[&str] = &[
        "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        "memory: usage 65536kB, limit 65536kB, failcnt 3543",
        "Tasks state (memory values in pages):",
        "[  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name",
        "[   3129]     0  3129    18790    16950    16288      662         0   192512        0             0 python3",
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job,task_memcg=/job,task=python3,pid=3129,uid=0",
        "Memory cgroup out of memory: Killed process 3129 (python3) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0",
    ];

    #[test]
    fn a_report_from_each_shape_of_log() {
        let shapes: [fn(usize, &str) -> String; 4] = [
            |i, l| format!("[ 100.{i:06}] {l}"),
            |i, l| format!("Mar  3 16:00:0{} node-7 kernel: [  100.{i:06}] {l}", i % 10),
            |_, l| format!("2025-03-03T16:00:00+0000 node-7 kernel: {l}"),
            |_, l| format!("[Mon Mar  3 16:00:00 2025] {l}"),
        ];
        for (n, shape) in shapes.iter().enumerate() {
            let log: String = REPORT
                .iter()
                .enumerate()
                .map(|(i, l)| shape(i, l) + "\n")
                .collect();
            let found = read_reports(log.as_bytes(), 2025).unwrap();
            assert_eq!(found.len(), 1, "shape {n}:\n{log}");
            let r = &found[0];
            assert_eq!(r.report.killed.pid, 3129, "shape {n}");
            assert_eq!(r.report.memory.as_ref().unwrap().limit_kb, 65536);
            assert_eq!(r.report.tasks.len(), 1);
            // Wall time only where the lines carry one.
            assert_eq!(r.mono_to_wall_ns.is_some(), n > 0, "shape {n}");
        }
    }

    /// Wraps `line` at `width` columns the way mail clients do: at a space
    /// when there is one, else hard.
    fn wrap(line: &str, width: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = line;
        while rest.len() > width {
            let cut = rest[..width].rfind(' ').filter(|&i| i > 0);
            match cut {
                Some(i) => {
                    out.push(rest[..i].to_string());
                    rest = &rest[i + 1..];
                }
                None => {
                    out.push(rest[..width].to_string());
                    rest = &rest[width..];
                }
            }
        }
        out.push(rest.to_string());
        out
    }

    #[test]
    fn lines_rewrapped_by_a_mail_client_are_put_back() {
        for width in [60, 72, 78] {
            let log: String = REPORT
                .iter()
                .enumerate()
                .flat_map(|(i, l)| wrap(&format!("[ 100.{i:06}] {l}"), width))
                .map(|l| l + "\n")
                .collect();
            let found = read_reports(log.as_bytes(), 2025).unwrap();
            assert_eq!(found.len(), 1, "width {width}:\n{log}");
            let r = &found[0].report;
            assert_eq!(r.killed.pid, 3129);
            assert_eq!(r.killed.anon_rss_kb, Some(65152), "width {width}");
            assert_eq!(r.killed.oom_score_adj, Some(0), "width {width}");
            let s = r.summary.as_ref().expect("the oom-kill line");
            assert_eq!(s.task_memcg.as_deref(), Some("/job"), "width {width}");
            assert_eq!((s.task.as_str(), s.pid, s.uid), ("python3", 3129, Some(0)));
            assert_eq!(r.tasks.len(), 1, "width {width}");
        }
    }

    #[test]
    fn interleaved_hosts_are_assembled_apart() {
        let mut log = String::new();
        for l in REPORT {
            log += &format!("2025-03-03T16:00:00+0000 node-a kernel: {l}\n");
            log += &format!(
                "2025-03-03T16:00:01+0000 node-b kernel: {}\n",
                l.replace("3129", "4242")
            );
        }
        let found = read_reports(log.as_bytes(), 2025).unwrap();
        let mut got: Vec<(String, u32)> = found
            .iter()
            .map(|r| (r.host.clone().unwrap(), r.report.killed.pid))
            .collect();
        got.sort();
        assert_eq!(got, [("node-a".into(), 3129), ("node-b".into(), 4242)]);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(wall((2025, 3, 3), (16, 0, 0), 0, 0), Some(T));
    }
}
