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

/// A time stamp of a known shape: its value, or None when it cannot be a
/// time.
type Stamp<T> = Option<T>;

/// The longest uptime a monotonic stamp may say: a century.
const MAX_UPTIME_S: u64 = 100 * 366 * 86_400;
/// Years a wall-time stamp may say.
const YEARS: std::ops::RangeInclusive<i64> = 1970..=2200;

/// Month names as `dmesg -T`, syslog and the journal write them in the
/// locales people paste from (English, German, French, Spanish, Italian,
/// Portuguese, Dutch, Russian, Polish, Czech, Turkish, Ukrainian,
/// Scandinavian), short and long, lower case and without a final dot; one
/// word never names two months.
const MONTHS: [&[&str]; 12] = [
    &[
        "jan",
        "january",
        "januar",
        "janv",
        "janvier",
        "ene",
        "enero",
        "gen",
        "gennaio",
        "janeiro",
        "januari",
        "янв",
        "января",
        "январь",
        "sty",
        "led",
        "oca",
        "січ",
    ],
    &[
        "feb",
        "february",
        "februar",
        "févr",
        "fevr",
        "février",
        "febrero",
        "febbraio",
        "fev",
        "fevereiro",
        "februari",
        "фев",
        "февраля",
        "февраль",
        "lut",
        "úno",
        "şub",
        "лют",
    ],
    &[
        "mar",
        "march",
        "mär",
        "mrz",
        "märz",
        "mars",
        "marzo",
        "março",
        "mrt",
        "maart",
        "мар",
        "марта",
        "март",
        "bře",
        "бер",
    ],
    &[
        "apr",
        "april",
        "avr",
        "avril",
        "abr",
        "abril",
        "aprile",
        "апр",
        "апреля",
        "апрель",
        "kwi",
        "dub",
        "nis",
        "кві",
    ],
    &[
        "may", "mai", "mayo", "mag", "maggio", "maio", "mei", "мая", "май", "maj", "kvě", "тра",
    ],
    &[
        "jun", "june", "juni", "juin", "junio", "giu", "giugno", "junho", "июн", "июня", "июнь",
        "cze", "čvn", "haz", "чер",
    ],
    &[
        "jul", "july", "juli", "juil", "juillet", "julio", "lug", "luglio", "julho", "июл", "июля",
        "июль", "lip", "čvc", "tem", "лип",
    ],
    &[
        "aug",
        "august",
        "août",
        "aout",
        "ago",
        "agosto",
        "augustus",
        "авг",
        "августа",
        "август",
        "sie",
        "srp",
        "ağu",
        "сер",
    ],
    &[
        "sep",
        "sept",
        "september",
        "septembre",
        "septiembre",
        "set",
        "settembre",
        "setembro",
        "сен",
        "сент",
        "сентября",
        "сентябрь",
        "wrz",
        "zář",
        "eyl",
        "вер",
    ],
    &[
        "oct",
        "october",
        "okt",
        "oktober",
        "octobre",
        "octubre",
        "ott",
        "ottobre",
        "out",
        "outubro",
        "окт",
        "октября",
        "октябрь",
        "paź",
        "říj",
        "eki",
        "жов",
    ],
    &[
        "nov",
        "november",
        "novembre",
        "noviembre",
        "novembro",
        "ноя",
        "нояб",
        "ноября",
        "ноябрь",
        "lis",
        "kas",
        "лис",
    ],
    &[
        "dec",
        "december",
        "dez",
        "dezember",
        "déc",
        "decembre",
        "décembre",
        "dic",
        "diciembre",
        "dicembre",
        "dezembro",
        "дек",
        "декабря",
        "декабрь",
        "gru",
        "pro",
        "des",
        "ara",
        "гру",
    ],
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

/// A month's number from its name in any of [`MONTHS`]' locales, or from
/// `N月` (Chinese, Japanese).
fn month(name: &str) -> Option<i64> {
    if let Some(n) = name.strip_suffix('月') {
        return n.parse().ok().filter(|m| (1..=12).contains(m));
    }
    let name = name.trim_end_matches('.').to_lowercase();
    MONTHS
        .iter()
        .position(|names| names.contains(&name.as_str()))
        .map(|i| i as i64 + 1)
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
            untimed: false,
            program: None,
            year_guess: None,
            zone_guessed: false,
            text: rec.text,
        });
    }
    // dmesg, and journalctl -o short-monotonic (`[ 1.2] host kernel: text`).
    if let Some((us, rest)) = mono_prefix(line) {
        let (host, program, text) = match after_stamp(rest) {
            Some((h, t)) => (h, None, t),
            None => match killer_after_stamp(rest) {
                Some((h, p, pid, t)) => (h, Some((p, pid)), t),
                None => (None, None, rest),
            },
        };
        return Some(LogLine {
            host,
            mono_us: us,
            wall_ns: None,
            kernel: program.is_none(),
            unreadable: us.is_none(),
            untimed: false,
            program,
            year_guess: None,
            zone_guessed: false,
            text: text.to_string(),
        });
    }
    // dmesg -T: `[Mon Mar  3 10:00:00 2025] text`, names in any locale.
    if let Some(inner) = line.strip_prefix('[')
        && let Some((stamp, rest)) = inner.split_once(']')
    {
        let w: Vec<&str> = stamp.split_whitespace().collect();
        if let [_, a, b, time, year] = w[..] {
            let (mon, day) = match (month(a), b.parse::<i64>()) {
                (Some(m), Ok(d)) => (m, d),
                _ => (month(b)?, a.trim_end_matches('.').parse().ok()?),
            };
            let time = hms_shaped(time)?;
            let year = year.parse::<i64>().ok()?;
            let wall_ns = time.and_then(|t| wall((year, mon, day), t, 0, 0));
            return Some(LogLine {
                host: None,
                mono_us: None,
                wall_ns,
                kernel: true,
                unreadable: wall_ns.is_none(),
                untimed: false,
                program: None,
                year_guess: None,
                zone_guessed: true,
                text: rest.strip_prefix(' ').unwrap_or(rest).to_string(),
            });
        }
        return None;
    }
    // journalctl short-iso / short-precise-iso, RFC 3339 syslog
    // (`2025-03-03T10:00:00+0000 host kernel: text`), and `dmesg
    // --time-format iso` (no host: `2025-03-03T10:00:00,123456+00:00 text`).
    if line.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        let (stamp, rest) = line.split_once(' ')?;
        let wall_ns = iso(stamp)?;
        let rest = rest.trim_start();
        let (host, text) = match after_stamp(rest) {
            Some(ht) => ht,
            None if let Some((h, p, pid, t)) = killer_after_stamp(rest) => {
                return Some(killer_line(h, (p, pid), wall_ns, t));
            }
            // A console's or collector's prefix before the kernel's stamp
            // (`In(05) vcpu-5 - Guest: <6>[ 1.5] text`).
            None if let Some(at) = mono_stamp_at(rest, 1) => (None, &rest[at..]),
            None if !program_line(rest) => (None, rest),
            None => return None,
        };
        return Some(with_mono(host, wall_ns, text));
    }
    // syslog, kern.log, journalctl short and short-precise, OpenWrt's
    // logread: `[Www ]Mar  3 10:00:00[.123456][ YYYY] [host ]kernel: text`.
    let (first, mut rest) = word(line)?;
    let mon = match month(first) {
        Some(m) => m,
        // A weekday first (logread).
        None if first.chars().all(char::is_alphabetic) && first.chars().count() <= 9 => {
            let (w, r) = word(rest)?;
            rest = r;
            month(w)?
        }
        None => return None,
    };
    let (day, r) = word(rest)?;
    let day = day.trim_end_matches([',', '.']).parse::<i64>().ok()?;
    let (time, r) = word(r)?;
    let (clock, frac) = time.split_once('.').unwrap_or((time, ""));
    let frac_ns: i64 = match frac {
        "" => 0,
        f if f.len() <= 9 && f.bytes().all(|c| c.is_ascii_digit()) => {
            format!("{f:0<9}").parse().ok()?
        }
        _ => return None,
    };
    let t = hms_shaped(clock)?;
    let (mut year, mut rest, mut year_guess) = (year, r, Some((year, mon, day)));
    if let Some((y, r)) = word(rest)
        && y.len() == 4
        && let Ok(y) = y.parse::<i64>()
    {
        (year, rest, year_guess) = (y, r, None);
    }
    let wall_ns = t.and_then(|t| wall((year, mon, day), t, frac_ns, 0));
    let mut l = match after_stamp(rest) {
        Some((host, text)) => with_mono(host, wall_ns, text),
        None => {
            let (host, program, pid, text) = killer_after_stamp(rest)?;
            killer_line(host, (program, pid), wall_ns, text)
        }
    };
    l.year_guess = year_guess.filter(|_| wall_ns.is_some());
    l.zone_guessed = true;
    Some(l)
}

/// `[host ]systemd-oomd[840]: text` after a stamp -> (host, killer, text),
/// for the userspace OOM killers tracer reads.
fn killer_after_stamp(rest: &str) -> Option<(Option<String>, &'static str, Option<u32>, &str)> {
    let rest = rest.trim_start();
    if let Some((p, pid, t)) = super::killers::split_program(rest) {
        return Some((None, p, pid, t));
    }
    let (host, after) = word(rest)?;
    let (p, pid, t) = super::killers::split_program(after.trim_start())?;
    Some((Some(host.to_string()), p, pid, t))
}

/// A userspace killer's line at a wall time.
fn killer_line(
    host: Option<String>,
    program: (&'static str, Option<u32>),
    wall_ns: Option<i64>,
    text: &str,
) -> LogLine {
    LogLine {
        host,
        mono_us: None,
        wall_ns,
        kernel: false,
        unreadable: wall_ns.is_none(),
        untimed: false,
        program: Some(program),
        year_guess: None,
        zone_guessed: false,
        text: text.to_string(),
    }
}

/// The first word of `s` (after leading blanks) and what follows it.
fn word(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    let end = s.find(char::is_whitespace).unwrap_or(s.len());
    (end > 0).then(|| s.split_at(end))
}

/// What follows a syslog or journal stamp: `host kernel: text`,
/// `kernel: text` (no host), `kern.warn kernel: text` (logread) ->
/// (host, text); None for a line of another program.
fn after_stamp(rest: &str) -> Option<(Option<String>, &str)> {
    let rest = rest.trim_start();
    if let Some(t) = rest.strip_prefix("kernel:") {
        return Some((None, t.strip_prefix(' ').unwrap_or(t)));
    }
    let (first, after) = word(rest)?;
    if first.starts_with("kern.") {
        return after_stamp(after).map(|(_, t)| (None, t));
    }
    let after = after.trim_start();
    let after = match word(after) {
        Some((w, a)) if w.starts_with("kern.") => a.trim_start(),
        _ => after,
    };
    let t = after.strip_prefix("kernel:")?;
    Some((Some(first.to_string()), t.strip_prefix(' ').unwrap_or(t)))
}

/// Whether text after a stamp is another program's syslog line
/// (`host sshd[99]: ...`, `host systemd: ...`).
fn program_line(rest: &str) -> bool {
    let mut w = rest.split_whitespace();
    let (Some(host), Some(prog)) = (w.next(), w.next()) else {
        return false;
    };
    !host.ends_with(':')
        && prog.ends_with(':')
        && prog[..prog.len() - 1]
            .chars()
            .all(|c| c.is_alphanumeric() || "-_.[]@/".contains(c))
}

/// Parses one piece of a pasted line: [`parse_line`] once what pasting
/// added is taken off (quote marks, list markers, code fences and
/// backticks, table cells, a printk level, `kernel:`; and, when a stamped
/// line follows them, a line number, grep's file name or a console's
/// prefix), else the bare text of a kernel message, without a time.
pub fn parse_pasted(piece: &str, year: i64) -> Option<LogLine> {
    if piece.trim_start().starts_with('{') {
        return journal_json(piece.trim());
    }
    // A code fence or backtick closed at the end of a message is no part
    // of it.
    let mut s = piece.trim().trim_end_matches('`').trim_end();
    for _ in 0..8 {
        if let Some(l) = parse_line(s, year) {
            return Some(l);
        }
        // What pasting added first; a prefix of another kind only once
        // none is left (a fence before a syslog line is not a console's
        // prefix before its `[ 1.2]` stamp).
        if let Some(t) = undress(s) {
            s = t;
            continue;
        }
        let stamped = [after_line_number(s), after_file_name(s), from_mono_stamp(s)]
            .into_iter()
            .flatten()
            .find_map(|rest| parse_line(rest, year))
            .or_else(|| talos(s, year));
        if stamped.is_some() {
            return stamped;
        }
        break;
    }
    // A driver's Xid line quoted inside another tool's output (a
    // monitoring agent's YAML or JSON): read from its own stamp.
    if let Some(x) = s.find("Xid (")
        && let Some(l) = last_iso_stamp(&s[..x]).and_then(|at| parse_line(&s[at..], year))
    {
        return Some(l);
    }
    let program = super::killers::split_program(s)
        .map(|(p, pid, t)| ((p, pid), t))
        .or_else(|| super::killers::recognise(s).map(|p| ((p, None), s)));
    if let Some((program, text)) = program {
        return Some(LogLine {
            host: None,
            mono_us: None,
            wall_ns: None,
            kernel: false,
            unreadable: false,
            untimed: true,
            program: Some(program),
            year_guess: None,
            zone_guessed: false,
            text: text.to_string(),
        });
    }
    bare_kernel(s).then(|| LogLine {
        host: None,
        mono_us: None,
        wall_ns: None,
        kernel: true,
        unreadable: false,
        untimed: true,
        program: None,
        year_guess: None,
        zone_guessed: false,
        text: s.to_string(),
    })
}

/// `journalctl -o json` (one entry a line): the kernel's messages and the
/// userspace OOM killers', at the entry's `__MONOTONIC_TIMESTAMP` and
/// `__REALTIME_TIMESTAMP` (µs); a message journald kept as bytes (not
/// UTF-8) is read as such.
fn journal_json(line: &str) -> Option<LogLine> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let text = match &v["MESSAGE"] {
        serde_json::Value::String(m) => m.clone(),
        serde_json::Value::Array(bytes) => {
            let b: Vec<u8> = bytes
                .iter()
                .filter_map(|x| x.as_u64().map(|x| x as u8))
                .collect();
            String::from_utf8_lossy(&b).into_owned()
        }
        _ => return None,
    };
    let us = |key: &str| v[key].as_str().and_then(|s| s.parse::<u64>().ok());
    let ident = v["SYSLOG_IDENTIFIER"].as_str().unwrap_or("");
    // A program may name itself `kernel`; its transport it cannot.
    let kernel = match v["_TRANSPORT"].as_str() {
        Some(t) => t == "kernel",
        None => ident == "kernel",
    };
    let program = if kernel {
        None
    } else {
        let pid = v["_PID"].as_str().and_then(|p| p.parse().ok());
        let (p, _, _) = super::killers::split_program(&format!("{ident}: {text}"))?;
        Some((p, pid))
    };
    let wall_ns = us("__REALTIME_TIMESTAMP").and_then(|u| i64::try_from(u).ok()?.checked_mul(1000));
    Some(LogLine {
        host: v["_HOSTNAME"].as_str().map(str::to_string),
        // The kernel's stamp, when the journal has the entry's boot clock.
        mono_us: us("__MONOTONIC_TIMESTAMP").filter(|_| kernel),
        wall_ns,
        kernel,
        unreadable: wall_ns.is_none(),
        untimed: false,
        program,
        year_guess: None,
        zone_guessed: false,
        text,
    })
}

/// One layer of what pasting adds around a line, taken off; None when
/// there is none.
fn undress(s: &str) -> Option<&str> {
    let t = if s.starts_with('>') {
        s.trim_start_matches(['>', ' '])
    } else if let Some(rest) = s.strip_prefix("```") {
        let rest = rest.trim_start_matches('`');
        // A fence's language tag is no log.
        if rest.chars().all(|c| c.is_alphanumeric() || c == '-') {
            ""
        } else {
            rest
        }
    } else if s.starts_with('`') || s.ends_with('`') {
        s.trim_matches('`')
    } else if s.starts_with(['*', '"', '_', '\'']) {
        // Markdown emphasis or quotes around a line quoted in prose.
        s.trim_start_matches(['*', '"', '_', '\''])
    } else if let Some(rest) = ["- ", "* ", "+ ", "• "]
        .iter()
        .find_map(|m| s.strip_prefix(m))
    {
        rest
    } else if let Some(rest) = s.strip_prefix("kernel:") {
        rest
    } else if let Some(rest) = facility_level(s) {
        rest
    } else if let Some(rest) = s.strip_prefix('<')
        && let Some((level, rest)) = rest.split_once('>')
        && !level.is_empty()
        && level.len() <= 3
        && level.bytes().all(|c| c.is_ascii_digit())
    {
        rest
    } else if s.matches('|').count() >= 2 || s.starts_with('|') {
        // A table exported from a log UI: the message is its last cell.
        s.split('|')
            .map(str::trim)
            .rfind(|c| !c.is_empty() && !c.chars().all(|c| c == '-' || c == ':'))?
    } else {
        return None;
    };
    let t = t.trim();
    (t.len() < s.len()).then_some(t)
}

/// `kern  :err   : text` (`dmesg -x`), `kern: warning: text` -> text.
fn facility_level(s: &str) -> Option<&str> {
    let rest = s.strip_prefix("kern")?.trim_start().strip_prefix(':')?;
    let (level, rest) = rest.trim_start().split_once(':')?;
    const LEVELS: [&str; 8] = [
        "emerg", "alert", "crit", "err", "warn", "warning", "notice", "info",
    ];
    (LEVELS.contains(&level.trim()) || level.trim() == "debug").then(|| rest.trim_start())
}

/// Talos's `talosctl dmesg`: `192.168.1.2: kern: warning:
/// [2026-04-22T21:26:20.599488292Z]: text` -> (host, wall time, text).
fn talos(s: &str, year: i64) -> Option<LogLine> {
    let (host, rest) = s.split_once(": ")?;
    let rest = facility_level(rest)?;
    let (stamp, text) = rest.strip_prefix('[')?.split_once("]:")?;
    let mut l = parse_line(&format!("{stamp} kernel:{text}"), year)?;
    l.host = Some(host.to_string());
    Some(l)
}

/// `12 text`, `12: text`, `12 | text` (a numbered paste, `grep -n`) ->
/// text.
fn after_line_number(s: &str) -> Option<&str> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 7 {
        return None;
    }
    let rest = &s[digits..];
    let rest = rest
        .strip_prefix(':')
        .or_else(|| rest.strip_prefix(|c: char| c.is_whitespace()))
        .or_else(|| rest.trim_start().strip_prefix('|'))?;
    Some(rest.trim_start())
}

/// `kern.log.1:text`, `/var/log/messages-20150510:text` (grep over
/// several files) -> text.
fn after_file_name(s: &str) -> Option<&str> {
    let (name, rest) = s.split_once(':')?;
    (name.len() >= 2
        && !name.contains(char::is_whitespace)
        && name.chars().any(char::is_alphabetic)
        && name != "kernel")
        .then_some(rest)
}

/// A console's or collector's own prefix before the kernel's `[ 123.4]`
/// stamp (`2023-12-04T10:49:30.127Z In(05) vcpu-5 - Guest: <6>[ 123.4]
/// text`) -> `[ 123.4] text`.
fn from_mono_stamp(s: &str) -> Option<&str> {
    let at = mono_stamp_at(s, 1)?;
    Some(&s[at..])
}

/// Where the last `2025-01-25T10:34:54` stamp begins in `s`.
fn last_iso_stamp(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len().saturating_sub(18)).rev().find(|&i| {
        let d = |j: usize| b[i + j].is_ascii_digit();
        (0..4).all(d)
            && b[i + 4] == b'-'
            && d(5)
            && d(6)
            && b[i + 7] == b'-'
            && d(8)
            && d(9)
            && b[i + 10] == b'T'
            && (i == 0 || !b[i - 1].is_ascii_digit())
    })
}

/// Where a `[  123.456789]` stamp begins in `s`, at or after `from`.
fn mono_stamp_at(s: &str, from: usize) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = from;
    while let Some(off) = s.get(i..)?.find('[') {
        let at = i + off;
        let mut j = at + 1;
        while j < b.len() && b[j] == b' ' {
            j += 1;
        }
        let d0 = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > d0 && j < b.len() && b[j] == b'.' {
            let f0 = j + 1;
            j = f0;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j > f0 && j < b.len() && b[j] == b']' {
                return Some(at);
            }
        }
        i = at + 1;
    }
    None
}

/// The start of the messages of an OOM report (and of the lines around
/// it) that tell a kernel line with no stamp from prose.
const KERNEL_STARTS: &[&str] = &[
    "Out of memory",
    "Out of Memory",
    "Killed process ",
    "Kill process ",
    "Memory cgroup out of memory",
    "Memory cgroup stats for ",
    "oom-kill:",
    "oom_reaper: ",
    "Tasks state",
    "[  pid  ]",
    "[ pid ]",
    "Task in ",
    "Tasks in ",
    "memory: usage ",
    "memory+swap: usage ",
    "swap: usage ",
    "kmem: usage ",
    "Mem-Info:",
    "NVRM: ",
];

/// Whether `text` is a kernel message of an OOM report without its stamp.
fn bare_kernel(text: &str) -> bool {
    KERNEL_STARTS.iter().any(|k| text.starts_with(k))
        || text.contains(" invoked oom-killer: ")
        || is_task_row(text)
}

/// `[  1234]     0  1234 ...`: a row of the `Tasks state` table.
fn is_task_row(text: &str) -> bool {
    text.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .is_some_and(|(pid, rest)| {
            let pid = pid.trim();
            !pid.is_empty()
                && pid.bytes().all(|c| c.is_ascii_digit())
                && rest.trim_start().starts_with(|c: char| c.is_ascii_digit())
        })
}

/// Where in a line another message begins that was glued to the one
/// before it (pasted without its line break): a stamp of any shape, or
/// the start of a kill's message, after a space that does not follow a
/// colon (`kernel: [ 1.2]` and `memory: Killed process` are one message).
fn glued_starts(line: &str) -> Vec<usize> {
    const STARTS: &[&str] = &[
        "Killed process ",
        "Out of memory: ",
        "Out of Memory: ",
        "Memory cgroup out of memory: ",
        "oom-kill:",
        "oom_reaper: ",
    ];
    let b = line.as_bytes();
    let mut out = Vec::new();
    for (i, _) in line.match_indices(' ') {
        let at = i + 1;
        if at >= b.len() || i == 0 || b[i - 1] == b':' {
            continue;
        }
        let rest = &line[at..];
        // After a run of spaces only a kill's message starts (a column of
        // a table: kubectl's events, `OOMKilling ...  Memory cgroup out of
        // memory: Kill process ...`); a stamp there is the same stamp's
        // padding (`Mar  3`).
        if b[i - 1] == b' ' {
            let before = line[..i].trim_end();
            if !before.ends_with(':') && STARTS.iter().any(|s| rest.starts_with(s)) {
                out.push(at);
            }
            continue;
        }
        let starts = match b[at] {
            b'[' => mono_stamp_at(line, at) == Some(at) || dmesg_t_stamp(rest),
            c if c.is_ascii_digit() => {
                rest.len() > 11 && rest.as_bytes()[4] == b'-' && rest.as_bytes()[10] == b'T'
            }
            // A message right after a stamp (`[ 1.2] Out of memory`) is
            // that stamp's.
            _ if b[i - 1] == b']' => syslog_stamp(rest),
            // Quoted or emphasised in prose: `"**Killed process ...`.
            b'"' | b'*' | b'\'' | b'`' => {
                let bare = rest.trim_start_matches(['"', '*', '\'', '`']);
                STARTS.iter().any(|s| bare.starts_with(s))
            }
            _ => STARTS.iter().any(|s| rest.starts_with(s)) || syslog_stamp(rest),
        };
        if starts {
            out.push(at);
        }
    }
    out
}

/// `[Mon Mar  3 10:00:00 2025]` at the start of `s`.
fn dmesg_t_stamp(s: &str) -> bool {
    s.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .is_some_and(|(stamp, _)| {
            let w: Vec<&str> = stamp.split_whitespace().collect();
            w.len() == 5 && w[3].contains(':')
        })
}

/// `Mar  3 10:00:00 ` at the start of `s`, whatever follows.
fn syslog_like(s: &str) -> bool {
    let mut w = s.split_whitespace();
    w.next().is_some_and(|m| m.len() == 3 && month(m).is_some())
        && w.next()
            .is_some_and(|d| d.len() <= 2 && d.bytes().all(|c| c.is_ascii_digit()))
        && w.next()
            .is_some_and(|t| matches!(hms_shaped(t.split('.').next().unwrap_or(t)), Some(Some(_))))
}

/// `Mar  3 10:00:00 host kernel: ` at the start of `s` (English month
/// names only: a glued line of another locale is left whole).
fn syslog_stamp(s: &str) -> bool {
    let Some((m, rest)) = word(s) else {
        return false;
    };
    if m.len() != 3 || month(m).is_none() || !m.starts_with(|c: char| c.is_ascii_uppercase()) {
        return false;
    }
    let Some((day, rest)) = word(rest) else {
        return false;
    };
    let Some((time, rest)) = word(rest) else {
        return false;
    };
    day.len() <= 2
        && day.bytes().all(|c| c.is_ascii_digit())
        && matches!(
            hms_shaped(time.split('.').next().unwrap_or(time)),
            Some(Some(_))
        )
        && after_stamp(rest).is_some()
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
        untimed: false,
        program: None,
        year_guess: None,
        zone_guessed: false,
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
    /// Whether the last line had no stamp.
    last_untimed: bool,
    /// The userspace OOM killers' lines.
    killers: super::killers::Killers,
    /// What the last line's wall time guessed: its year, its zone.
    guessed: (Option<i64>, bool),
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
    let mut may_wrap = false;
    let mut verbose: Option<(u64, i64)> = None;
    for line in input.split(b'\n') {
        let line = line?;
        shape.lines += 1;
        if line.contains(&0) {
            shape.binary += 1;
            continue;
        }
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches(['\r', '\n']);
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
                feed(&mut hosts, &mut log, prev);
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
                        feed(&mut hosts, &mut log, prev);
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
        may_wrap = line.trim().chars().count() >= WRAP_WIDTH;
    }
    if let Some(prev) = held {
        feed(&mut hosts, &mut log, prev);
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
    log.shape = shape;
    Ok(log)
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
    let structured = key || stamped || t.starts_with(['{', '"']) || t.starts_with("- ");
    (!t.is_empty() && !t.starts_with("```") && !prompt && !structured).then_some(t)
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
    let hard = text.is_empty() || (long_last_word && !indented) || tail.starts_with([',', ')']);
    if !hard {
        text.push(' ');
    }
    let mut room = MAX_REJOINED.saturating_sub(text.len()).min(tail.len());
    while !tail.is_char_boundary(room) {
        room -= 1;
    }
    text.push_str(&tail[..room]);
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

/// Hands one whole line to its host's assembler.
fn feed(hosts: &mut HashMap<Option<String>, HostLog>, log: &mut SavedLog, mut l: LogLine) {
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
    h.guessed = (l.year_guess.map(|(y, _, _)| y), l.zone_guessed);
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
    h.seq += 1;
    let rec = KmsgRecord {
        seq: h.seq,
        ts_us,
        level: 4,
        facility: if l.kernel { 0 } else { 1 },
        text: l.text,
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

    /// Lines as people paste them (each shape seen in tests/fixtures/real-logs):
    /// (line, host, monotonic us, wall ns, text, no stamp at all).
    #[test]
    fn pasted_shapes_of_a_line() {
        let feb20 = wall((2024, 2, 20), (19, 15, 36), 0, 0);
        type Pasted<'a> = (
            &'a str,
            Option<&'a str>,
            Option<u64>,
            Option<i64>,
            &'a str,
            bool,
        );
        let cases: &[Pasted] = &[
            ("> > [ 1.5] x", None, Some(1_500_000), None, "x", false),
            ("```[ 1.5] x```", None, Some(1_500_000), None, "x", false),
            ("- `[ 1.5] x`", None, Some(1_500_000), None, "x", false),
            ("12: [ 1.5] x", None, Some(1_500_000), None, "x", false),
            ("  7 | [ 1.5] x", None, Some(1_500_000), None, "x", false),
            (
                "messages-20150510:Mar  3 16:00:00 localhost kernel: x",
                Some("localhost"),
                None,
                Some(T),
                "x",
                false,
            ),
            (
                "Mon Mar  3 16:00:00 2025 kern.warn kernel: [ 1.5] x",
                None,
                Some(1_500_000),
                Some(T),
                "x",
                false,
            ),
            ("Mar 03 16:00:00 kernel: x", None, None, Some(T), "x", false),
            (
                "Mar 03 16:00:00.250000 node-7 kernel: x",
                Some("node-7"),
                None,
                Some(T + 250_000_000),
                "x",
                false,
            ),
            (
                "2025-03-03T17:00:00,000000+01:00 pool invoked oom-killer: gfp_mask=0xcc0",
                None,
                None,
                Some(T),
                "pool invoked oom-killer: gfp_mask=0xcc0",
                false,
            ),
            (
                "  | Jun 25, 2021 @ 12:42:12.104 | kernel | [ 1.5] x",
                None,
                Some(1_500_000),
                None,
                "x",
                false,
            ),
            (
                "2023-12-04T10:49:30.127Z In(05) vcpu-5 - Guest: <6>[ 1.5] x",
                None,
                Some(1_500_000),
                wall((2023, 12, 4), (10, 49, 30), 127_000_000, 0),
                "x",
                false,
            ),
            ("[Di Feb 20 19:15:36 2024] x", None, None, feb20, "x", false),
            (
                "[Tue 20 Feb 19:15:36 2024] x",
                None,
                None,
                feb20,
                "x",
                false,
            ),
            ("[вт фев 20 19:15:36 2024] x", None, None, feb20, "x", false),
            (
                "[mar. févr. 20 19:15:36 2024] x",
                None,
                None,
                feb20,
                "x",
                false,
            ),
            (
                "kernel: Killed process 7919, UID 504 oracle",
                None,
                None,
                None,
                "Killed process 7919, UID 504 oracle",
                true,
            ),
            (
                "Out of memory: Kill process 957 (app.out) score 524 or sacrifice child",
                None,
                None,
                None,
                "Out of memory: Kill process 957 (app.out) score 524 or sacrifice child",
                true,
            ),
        ];
        for (line, host, mono, wall, text, untimed) in cases {
            let l = parse_pasted(line, 2025).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(l.host.as_deref(), *host, "{line}");
            assert_eq!(l.mono_us, *mono, "{line}");
            assert_eq!(l.wall_ns, *wall, "{line}");
            assert_eq!(l.text, *text, "{line}");
            assert_eq!(l.untimed, *untimed, "{line}");
        }
        // Prose, prompts, other programs' lines and fences are no kernel lines.
        for line in [
            "the node died at 4 pm",
            "[root@server ~]# dmesg | grep -i oom",
            "Mar  3 16:00:00 node-7 sshd[99]: Accepted",
            "2025-03-03T16:00:00+0000 node-7 systemd[1]: Started x",
            "```",
        ] {
            assert_eq!(parse_pasted(line, 2025), None, "{line}");
        }
    }

    /// A syslog stamp has no year: one that would be days ahead of now is
    /// of the year before, and the guess is kept with the line.
    #[test]
    fn a_syslog_date_ahead_of_now_is_of_last_year() {
        // Civil date of a day count (the inverse of days_from_civil).
        fn civil(z: i64) -> (i64, i64, i64) {
            let z = z + 719_468;
            let era = z.div_euclid(146_097);
            let doe = z - era * 146_097;
            let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
            let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
            let mp = (5 * doy + 2) / 153;
            let d = doy - (153 * mp + 2) / 5 + 1;
            let m = if mp < 10 { mp + 3 } else { mp - 9 };
            (yoe + era * 400 + i64::from(m <= 2), m, d)
        }
        let today = crate::util::time::wall_now_ns() / 86_400_000_000_000;
        for (ahead, back) in [(10, true), (-10, false)] {
            let (y, m, d) = civil(today + ahead);
            let names = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ];
            let log = format!(
                "{} {d:2} 10:00:00 node-7 kernel: Out of memory: Killed process 4 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n",
                names[m as usize - 1]
            );
            let found = read_log(log.as_bytes(), y).unwrap();
            let r = &found.reports[0];
            let want_year = if back { y - 1 } else { y };
            assert_eq!(r.guessed, (Some(want_year), true), "{log}");
            let wall = r.report.ts_us as i64 * 1000 + r.mono_to_wall_ns.unwrap();
            assert_eq!(
                wall,
                super::wall((want_year, m, d), (10, 0, 0), 0, 0).unwrap(),
                "{log}"
            );
        }
    }

    /// `journalctl -o verbose`: the stamps of an entry's header line give
    /// the time of its `MESSAGE=` line (tests/fixtures/real-logs/ho-03).
    #[test]
    fn journalctl_verbose_entries() {
        let log = "Thu 2023-02-02 11:49:13.015489 CET [s=1d8f;i=10823659;b=796d;m=1f6726955fe3;t=5f3b550c118c1;x=e534]\n    MESSAGE=Memory cgroup out of memory: Killed process 2855014 (tail) total-vm:4296kB, anon-rss:60kB, file-rss:516kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:0\n";
        let found = read_log(log.as_bytes(), 2023).unwrap();
        let r = &found.reports[0];
        assert_eq!(r.report.killed.pid, 2_855_014);
        assert_eq!(r.report.ts_us, 0x1f67_2695_5fe3);
        let wall = r.report.ts_us as i64 * 1000 + r.mono_to_wall_ns.unwrap();
        assert_eq!(wall, 0x0005_f3b5_50c1_18c1 * 1000);
    }

    /// Messages glued on one line (a paste that lost its line breaks) are
    /// read one by one; one message with a stamp inside stays whole.
    #[test]
    fn glued_messages_are_parted() {
        let parts = |line: &str| {
            let mut from = 0;
            let mut out = Vec::new();
            for at in glued_starts(line) {
                out.push(line[from..at].trim().to_string());
                from = at;
            }
            out.push(line[from..].to_string());
            out
        };
        assert_eq!(
            parts(
                "Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child Killed process 5372 (mongod), UID 0, total-vm:2539052kB"
            ),
            [
                "Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child",
                "Killed process 5372 (mongod), UID 0, total-vm:2539052kB"
            ]
        );
        assert_eq!(
            parts(
                "[root@server ~]# dmesg | grep -i oom [197352.008908] Out of memory: Kill process 12166 (mysqld) score 870 or sacrifice child [197352.030461] Killed process 12166"
            ),
            [
                "[root@server ~]# dmesg | grep -i oom",
                "[197352.008908] Out of memory: Kill process 12166 (mysqld) score 870 or sacrifice child",
                "[197352.030461] Killed process 12166"
            ]
        );
        assert_eq!(
            parts(
                "Jul 19 05:19:24 asl131 kernel: Out of Memory: Killed process 2368 (jserver). Jul 19 05:19:24 asl131 kernel: OOM kill occurred"
            )
            .len(),
            2
        );
        for whole in [
            "Mar  3 16:00:06 node-7 kernel: [  100.000006] Memory cgroup out of memory: Killed process 3129 (python3)",
            "[Mon Mar  3 16:00:00 2025] Out of memory: Killed process 1 (x)",
            "[ 1.5] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=x,pid=1,uid=0",
        ] {
            assert_eq!(parts(whole), [whole], "{whole}");
        }
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
