//! The shapes of a saved log's lines: each line, however it was pasted,
//! to a [`LogLine`], or nothing.

use super::*;

/// Parses one line of a saved kernel log; `None` when it is no kernel log
/// line of any known shape. `year` is used for syslog stamps, which have
/// none.
pub fn parse_line(line: &str, year: i64) -> Option<LogLine> {
    let line = line.trim_end_matches(['\r', '\n']);
    // Raw /dev/kmsg: `prio,seq,ts_us,flags[,...];text`.
    if let Ok(rec) = crate::collect::kmsg::parse_record(line) {
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
        return human(stamp, rest.strip_prefix(' ').unwrap_or(rest), year);
    }
    // journalctl short-iso / short-precise-iso, RFC 3339 syslog
    // (`2025-03-03T10:00:00+0000 host kernel: text`), and `dmesg
    // --time-format iso` (no host: `2025-03-03T10:00:00,123456+00:00 text`).
    if line.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        // dmesg's stamp that lost its `[` in a paste (`95327.384563] text`).
        if let Some((stamp, _)) = line.split_once("] ")
            && seconds_us(stamp).is_some()
        {
            return parse_line(&format!("[{line}"), year);
        }
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

/// A kernel message with no time of its own.
fn untimed_kernel(text: &str) -> LogLine {
    LogLine {
        host: None,
        mono_us: None,
        wall_ns: None,
        kernel: true,
        unreadable: false,
        untimed: true,
        program: None,
        year_guess: None,
        zone_guessed: false,
        text: text.to_string(),
    }
}

/// `dmesg -H` (`--human`): the first message of a minute at its wall time
/// without a year (`[Oct28 16:58]`), the others at their offset from the
/// message before (`[  +0.000082]`), read as untimed (they stay at the
/// time before them, which is within a second of theirs).
fn human(stamp: &str, text: &str, year: i64) -> Option<LogLine> {
    let mut l = untimed_kernel(text);
    if let Some(delta) = stamp.trim_start().strip_prefix('+') {
        seconds_us(delta)?;
        return Some(l);
    }
    let [month_day, clock] = stamp.split_whitespace().collect::<Vec<_>>()[..] else {
        return None;
    };
    let split = month_day.find(|c: char| c.is_ascii_digit())?;
    let (mon, day) = month_day.split_at(split);
    let (mon, day) = (month(mon)?, day.parse::<i64>().ok()?);
    let t = hms_shaped(&format!("{clock}:00"))?;
    l.wall_ns = t.and_then(|t| wall((year, mon, day), t, 0, 0));
    l.untimed = false;
    l.unreadable = l.wall_ns.is_none();
    l.year_guess = l.wall_ns.map(|_| (year, mon, day));
    l.zone_guessed = true;
    Some(l)
}

/// `[host ]systemd-oomd[840]: text` after a stamp -> (host, killer, text),
/// for the userspace OOM killers tracer reads.
pub(super) fn killer_after_stamp(
    rest: &str,
) -> Option<(Option<String>, &'static str, Option<u32>, &str)> {
    let rest = rest.trim_start();
    if let Some((p, pid, t)) = crate::collect::killers::split_program(rest) {
        return Some((None, p, pid, t));
    }
    let (host, after) = word(rest)?;
    let (p, pid, t) = crate::collect::killers::split_program(after.trim_start())?;
    Some((Some(host.to_string()), p, pid, t))
}

/// A userspace killer's line at a wall time.
pub(super) fn killer_line(
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
pub(super) fn word(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    let end = s.find(char::is_whitespace).unwrap_or(s.len());
    (end > 0).then(|| s.split_at(end))
}

/// What follows a syslog or journal stamp: `host kernel: text`,
/// `kernel: text` (no host), `kern.warn kernel: text` (logread) ->
/// (host, text); None for a line of another program.
pub(super) fn after_stamp(rest: &str) -> Option<(Option<String>, &str)> {
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
pub(super) fn program_line(rest: &str) -> bool {
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
    let program = crate::collect::killers::split_program(s)
        .map(|(p, pid, t)| ((p, pid), t))
        .or_else(|| crate::collect::killers::recognise(s).map(|p| ((p, None), s)));
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
    if bare_kernel(s) {
        return Some(untimed_kernel(s));
    }
    inline_kernel(s, year)
}

/// A kernel line inside prose, or after a stamp that cannot be read (`结果:
/// Mar 3 00:31:02 host kernel: Out of memory: ...`, `Jun 1XX:XX:XX host
/// kernel: Out of memory: ...`): read from the first place in the line
/// where a line of a known shape starts, else as its `kernel: ` message
/// with no time. Only an OOM report's own messages are looked for.
fn inline_kernel(s: &str, year: i64) -> Option<LogLine> {
    let at = s.find(" kernel: ")?;
    let msg = &s[at + " kernel: ".len()..];
    if !KERNEL_STARTS.iter().any(|k| msg.starts_with(k)) {
        return None;
    }
    // A stamp and a host take well under this: prose before them is not
    // searched (a long line stays linear).
    const STAMP_AND_HOST: usize = 128;
    let mut from = at.saturating_sub(STAMP_AND_HOST);
    while !s.is_char_boundary(from) {
        from += 1;
    }
    let from_stamp = s[from..at]
        .match_indices(' ')
        .map(|(i, _)| from + i + 1)
        .find_map(|i| parse_line(&s[i..], year).filter(|l| l.kernel));
    Some(from_stamp.unwrap_or_else(|| LogLine {
        unreadable: true,
        untimed: false,
        ..untimed_kernel(msg)
    }))
}

/// `journalctl -o json` (one entry a line): the kernel's messages and the
/// userspace OOM killers', at the entry's `__MONOTONIC_TIMESTAMP` and
/// `__REALTIME_TIMESTAMP` (µs); a message journald kept as bytes (not
/// UTF-8) is read as such.
pub(super) fn journal_json(line: &str) -> Option<LogLine> {
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
        let (p, _, _) = crate::collect::killers::split_program(&format!("{ident}: {text}"))?;
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

/// What follows a Go program's klog prefix (`I0601 23:23:10.446437
/// 13604 utils.go:240] text`: level, month and day, time, thread, file
/// and line), as minikube and the kubelet print the lines they relay.
fn after_klog(s: &str) -> Option<&str> {
    let (head, rest) = s.split_once("] ")?;
    let mut w = head.split_whitespace();
    let (date, time, thread, at) = (w.next()?, w.next()?, w.next()?, w.next()?);
    let level_date = date.len() == 5
        && date.starts_with(['I', 'W', 'E', 'F'])
        && date[1..].bytes().all(|c| c.is_ascii_digit());
    let clock = time.len() >= 8
        && time
            .bytes()
            .all(|c| c.is_ascii_digit() || c == b':' || c == b'.');
    let file_line = at.rsplit_once(':').is_some_and(|(f, l)| {
        f.ends_with(".go") && !l.is_empty() && l.bytes().all(|c| c.is_ascii_digit())
    });
    (level_date
        && clock
        && thread.bytes().all(|c| c.is_ascii_digit())
        && file_line
        && w.next().is_none())
    .then_some(rest)
}

/// One layer of what pasting adds around a line, taken off; None when
/// there is none.
pub(super) fn undress(s: &str) -> Option<&str> {
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
    } else if let Some(rest) = json_member(s) {
        rest
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
    } else if let Some(rest) = after_klog(s) {
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
    } else if (s.matches('|').count() >= 2 || s.starts_with('|')) && !bare_kernel(s) {
        // A table exported from a log UI: the message is its last cell
        // (a kernel message whose gfp flags a `|` parts is none: hx-26).
        s.split('|')
            .map(str::trim)
            .rfind(|c| !c.is_empty() && !c.chars().all(|c| c == '-' || c == ':'))?
    } else {
        return None;
    };
    let t = t.trim();
    (t.len() < s.len()).then_some(t)
}

/// The text of a message member of a JSON object printed over several
/// lines (`kubectl get events -o json`, a log shipper's record:
/// `"message": "Memory cgroup out of memory: Killed process ...",`).
fn json_member(s: &str) -> Option<&str> {
    let rest = s.strip_prefix('"')?;
    let (key, rest) = rest.split_once("\":")?;
    if !["message", "msg", "log", "MESSAGE"].contains(&key) {
        return None;
    }
    let v = rest.trim_start().strip_prefix('"')?;
    let v = v.strip_suffix(',').unwrap_or(v).trim_end();
    Some(v.strip_suffix('"').unwrap_or(v))
}

/// `kern  :err   : text` (`dmesg -x`), `kern: warning: text` -> text.
pub(super) fn facility_level(s: &str) -> Option<&str> {
    level_of(s, "kern")
}

/// `facility: level: text` -> text, for `facility`.
fn level_of<'a>(s: &'a str, facility: &str) -> Option<&'a str> {
    let rest = s.strip_prefix(facility)?.trim_start().strip_prefix(':')?;
    let (level, rest) = rest.trim_start().split_once(':')?;
    const LEVELS: [&str; 8] = [
        "emerg", "alert", "crit", "err", "warn", "warning", "notice", "info",
    ];
    (LEVELS.contains(&level.trim()) || level.trim() == "debug").then(|| rest.trim_start())
}

/// Talos's `talosctl dmesg`: `192.168.1.2: kern: warning:
/// [2026-04-22T21:26:20.599488292Z]: text` -> (host, wall time, text);
/// the host is left out for one node. machined's own lines are of the
/// `user` facility: its OOM controller's are read as that killer's.
pub(super) fn talos(s: &str, year: i64) -> Option<LogLine> {
    let (host, rest) = match s.split_once(": ") {
        Some((h, r)) if !matches!(h.trim(), "kern" | "user") => (Some(h), r),
        _ => (None, s),
    };
    let (user, rest) = match facility_level(rest) {
        Some(r) => (false, r),
        None => (true, level_of(rest, "user")?),
    };
    let (stamp, text) = rest.strip_prefix('[')?.split_once("]:")?;
    if user && !crate::collect::killers::nohang::is_talos(text.trim()) {
        return None;
    }
    let mut l = parse_line(&format!("{stamp} kernel:{text}"), year)?;
    l.host = host.map(str::to_string);
    if user {
        l.kernel = false;
        l.program = Some(("talos", None));
        l.text = text.trim().to_string();
    }
    Some(l)
}

/// `12 text`, `12: text`, `12 | text` (a numbered paste, `grep -n`) ->
/// text.
pub(super) fn after_line_number(s: &str) -> Option<&str> {
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
pub(super) fn after_file_name(s: &str) -> Option<&str> {
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
pub(super) fn from_mono_stamp(s: &str) -> Option<&str> {
    let at = mono_stamp_at(s, 1)?;
    Some(&s[at..])
}

/// Where the last `2025-01-25T10:34:54` stamp begins in `s`.
pub(super) fn last_iso_stamp(s: &str) -> Option<usize> {
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
pub(super) fn mono_stamp_at(s: &str, from: usize) -> Option<usize> {
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
pub(super) const KERNEL_STARTS: &[&str] = &[
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
pub(super) fn bare_kernel(text: &str) -> bool {
    KERNEL_STARTS.iter().any(|k| text.starts_with(k))
        || crate::collect::kmsg::parse_header(text).is_some()
        || is_task_row(text)
        // The stack dump's first line, which names the trigger's pid.
        || crate::collect::kmsg::dump_task(text).is_some_and(|(pid, comm)| pid.is_some() && comm.is_some())
}

/// `[  1234]     0  1234 ...`: a row of the `Tasks state` table.
pub(super) fn is_task_row(text: &str) -> bool {
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
pub(super) fn glued_starts(line: &str) -> Vec<usize> {
    const STARTS: &[&str] = &[
        "Killed process ",
        // `Kill process 1 (init) sharing same memory` after its victim's
        // kill line (a mail's rewrap joined them).
        "Kill process ",
        "Out of memory: ",
        "Out of Memory: ",
        "Memory cgroup out of memory: ",
        "oom-kill:constraint=",
        "oom_reaper: ",
    ];
    let b = line.as_bytes();
    let mut out = Vec::new();
    for (i, _) in line.match_indices([' ', '\t']) {
        let at = i + 1;
        if at >= b.len() || i == 0 {
            continue;
        }
        let rest = &line[at..];
        // A column of a table whose cells a tab parts (kubectl's events
        // copied from a terminal: `Warning\tOOMKilling\tMemory cgroup out
        // of memory: Kill process ...`): only a kill's message starts.
        if b[i] == b'\t' {
            if STARTS.iter().any(|s| rest.starts_with(s)) {
                out.push(at);
            }
            continue;
        }
        if b[i - 1] == b':' {
            // node-problem-detector's event (`kubectl get events`: `1
            // OOMKilling: Memory cgroup out of memory: Kill process ...`).
            // Kubernetes' event aggregator's prefix too (`Message:(combined
            // from similar events): Memory cgroup out of memory: ...`).
            let event = ["OOMKilling:", "(combined from similar events):"]
                .iter()
                .any(|p| line[..i].ends_with(p));
            if event && STARTS.iter().any(|s| rest.starts_with(s)) {
                out.push(at);
            }
            // Another program's output before a console's kernel line
            // (`Creating journal (262144 blocks): [   34.739137] mkfs.ext4
            // invoked oom-killer`); `kernel: [ 1.2]` is one message.
            let before = &line[..i - 1];
            if b[at] == b'['
                && mono_stamp_at(line, at) == Some(at)
                && !before.ends_with("kernel")
                && before.chars().any(char::is_alphanumeric)
            {
                out.push(at);
            }
            continue;
        }
        // After a run of spaces only a kill's message starts (a column of
        // a table: kubectl's events, `OOMKilling ...  Memory cgroup out of
        // memory: Kill process ...`); a stamp there is the same stamp's
        // padding (`Mar  3`). Quoted there too, in prose (`I see an
        // "Out of memory: Killed process ...`).
        if b[i - 1] == b' ' {
            let before = line[..i].trim_end();
            let quoted = rest.trim_start_matches(['"', '*', '\'', '`']);
            let bare = quoted.len() < rest.len();
            if !before.ends_with(':')
                && (STARTS.iter().any(|s| quoted.starts_with(s)) || bare && header_start(quoted))
            {
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
                STARTS.iter().any(|s| bare.starts_with(s)) || header_start(bare)
            }
            _ => {
                STARTS.iter().any(|s| rest.starts_with(s))
                    || syslog_stamp(rest)
                    || header_start(rest) && ends_a_kill_line(&line[..i])
            }
        };
        if starts {
            out.push(at);
        }
    }
    // A kill's message glued with no space at all, after the end of the one
    // before (`(trashapplet)Out of memory: kill process ...`, `or a
    // childKilled process ...`: a console that lost its line breaks).
    for start in STARTS {
        for (at, _) in line.match_indices(start) {
            let before = &line[..at];
            if before.ends_with(')') || before.ends_with("child") || before.ends_with("kB") {
                out.push(at);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `before` ends the way the kernel's kill lines end (a figure in
/// kB, `oom_score_adj:N`, `UID:N`, `or sacrifice child`): a header glued
/// after it starts another message (a whole report pasted on one line).
fn ends_a_kill_line(before: &str) -> bool {
    let last = before.rsplit(' ').next().unwrap_or("");
    let number = |p: &str| {
        last.strip_prefix(p).is_some_and(|n| {
            !n.is_empty()
                && n.trim_start_matches('-')
                    .bytes()
                    .all(|c| c.is_ascii_digit())
        })
    };
    (before.contains("Killed process ") || before.contains("Kill process "))
        && (last.ends_with("kB")
            || number("oom_score_adj:")
            || number("UID:")
            || before.ends_with("sacrifice child"))
}

/// Whether `s` starts with a report's header, `COMM invoked oom-killer:`
/// (quoted in prose, the only place one is looked for inside a line).
fn header_start(s: &str) -> bool {
    s.split_once(' ')
        .is_some_and(|(comm, rest)| !comm.is_empty() && rest.starts_with("invoked oom-killer:"))
}

/// `[Mon Mar  3 10:00:00 2025]` at the start of `s`.
pub(super) fn dmesg_t_stamp(s: &str) -> bool {
    s.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .is_some_and(|(stamp, _)| {
            let w: Vec<&str> = stamp.split_whitespace().collect();
            w.len() == 5 && w[3].contains(':')
        })
}

/// `Mar  3 10:00:00 ` at the start of `s`, whatever follows.
pub(super) fn syslog_like(s: &str) -> bool {
    let mut w = s.split_whitespace();
    w.next().is_some_and(|m| m.len() == 3 && month(m).is_some())
        && w.next()
            .is_some_and(|d| d.len() <= 2 && d.bytes().all(|c| c.is_ascii_digit()))
        && w.next()
            .is_some_and(|t| matches!(hms_shaped(t.split('.').next().unwrap_or(t)), Some(Some(_))))
}

/// `Mar  3 10:00:00 host kernel: ` at the start of `s` (English month
/// names only: a glued line of another locale is left whole).
pub(super) fn syslog_stamp(s: &str) -> bool {
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
pub(super) fn with_mono(host: Option<String>, wall_ns: Option<i64>, text: &str) -> LogLine {
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
