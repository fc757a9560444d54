//! The shapes of the report's lines, one recognizer each.

use super::*;

pub(super) fn word_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let i = text.find(key)? + key.len();
    text[i..].split_whitespace().next()
}

/// `usage 65536kB, limit 65536kB, failcnt 3543`
pub(super) fn parse_counter(s: &str) -> Option<MemcgCounter> {
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
    // A damaged `uid` field after it (`pid=108,uid0`) is left out.
    let pid = pid.split(',').next().unwrap_or(pid);
    let (rest, task) = rest.rsplit_once(",task=")?;
    let (rest, task_memcg) = match rest.rsplit_once(",task_memcg=") {
        Some((r, m)) => (r, Some(m.to_string())),
        None => (rest, None),
    };
    let oom_memcg = rest.rsplit_once(",oom_memcg=").map(|(_, m)| m.to_string());
    // Case aside: a transcription may write `cOnstraint=`.
    let constraint = rest
        .get(..11)
        .filter(|p| p.eq_ignore_ascii_case("constraint="))
        .map(|_| &rest[11..])?
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
pub(super) fn unpad(text: &str) -> String {
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
pub(super) fn parse_chosen(text: &str) -> Option<KilledProcess> {
    let at = text
        .find("Kill process ")
        .or_else(|| text.find("kill process "))?;
    let rest = &text[at + "Kill process ".len()..];
    let (pid, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix('(')?;
    // 3.0's choice carried the victim's figures (`Kill process 5462
    // (abrtd) points:393 total-vm:262300kB, anon-rss:1024kB, file-rss:0kB`).
    let (close, figures) = match rest.rfind(") score") {
        Some(c) => (c, None),
        None => {
            let c = rest.find(") points:")?;
            (c, Some(&rest[c + 1..]))
        }
    };
    let mut k = KilledProcess {
        pid: pid.parse().ok()?,
        comm: rest[..close].to_string(),
        memcg: text[..at].contains("Memory cgroup"),
        bare: !said_out_of_memory(&text[..at]),
        ..Default::default()
    };
    if let Some(f) = figures {
        read_figures(f, &mut k);
    }
    Some(k)
}

/// `Kill process 1 (init) sharing same memory` (3.x to 4.x): a process
/// that shares the victim's memory, killed with it. A kill of its own,
/// whose line names no OOM.
pub(super) fn parse_sharing(text: &str) -> Option<KilledProcess> {
    let at = text.find("Kill process ")?;
    // What a rewrap joined after it is not its.
    let (rest, _) = text[at + "Kill process ".len()..].split_once(") sharing same memory")?;
    let (pid, comm) = rest.split_once(" (")?;
    Some(KilledProcess {
        pid: pid.parse().ok()?,
        comm: comm.to_string(),
        memcg: text[..at].contains("Memory cgroup"),
        bare: !said_out_of_memory(&text[..at]),
        ..Default::default()
    })
}

/// Whether the text before `Kill(ed) process` names the OOM that killed.
pub(super) fn said_out_of_memory(before: &str) -> bool {
    let b = before.to_ascii_lowercase();
    b.contains("out of memory")
}

/// The `invoked oom-killer` header: the trigger's name, and the
/// allocation's gfp mask and order as far as the line gives them.
pub(crate) struct Header<'a> {
    pub comm: &'a str,
    pub gfp_mask: Option<&'a str>,
    pub order: Option<u32>,
}

/// `python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0,
/// oom_score_adj=0`, or a paste's start of it alone (`mysqld invoked
/// oom-killer`, one word, at most a task name long).
pub(crate) fn parse_header(text: &str) -> Option<Header<'_>> {
    let (comm, rest) = text.split_once(" invoked oom-killer: ").or_else(|| {
        text.strip_suffix(" invoked oom-killer")
            .filter(|c| !c.is_empty() && c.len() <= 16 && !c.contains(' '))
            .map(|c| (c, ""))
    })?;
    let mut h = Header {
        comm,
        gfp_mask: None,
        order: None,
    };
    for (k, v) in rest.split(", ").filter_map(|kv| kv.split_once('=')) {
        match k {
            "gfp_mask" => h.gfp_mask = Some(v),
            "order" => h.order = v.parse().ok(),
            _ => {}
        }
    }
    Some(h)
}

/// The task a stack dump's first line names (`CPU: 3 PID: 8989 Comm:
/// emhttpd Tainted: ...`; before 3.11 on x86, `Pid: 6344, comm: sh Not
/// tainted 3.2.32 #1`): its pid and name.
pub(crate) fn dump_task(text: &str) -> Option<(Option<u32>, Option<&str>)> {
    if let Some(rest) = text.strip_prefix("Pid: ") {
        let (pid, rest) = rest.split_once(", comm: ")?;
        let pid = pid.parse().ok()?;
        return Some((Some(pid), rest.split(' ').next().filter(|c| !c.is_empty())));
    }
    text.starts_with("CPU: ").then(|| {
        (
            word_after(text, "PID: ").and_then(|v| v.parse().ok()),
            word_after(text, "Comm: "),
        )
    })
}

/// `[Memory cgroup out of memory: |Out of memory: ]Killed process 3129
/// (python3) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB,
/// shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0`
pub(super) fn parse_killed(text: &str) -> Option<KilledProcess> {
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
    // A paste that aligned columns may put more than one space before the
    // pid (`Killed process  532 (kodi.bin)`).
    let (pid, rest) = rest.trim_start().split_once(' ')?;
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
            // A name is at most 15 bytes (`TASK_COMM_LEN`) and may hold a
            // `)` itself: its figures' first field marks its end, else its
            // last `)` within those bytes; what a paste glued after the
            // line (another message, an Oops) holds `)`s of its own.
            let close = [") total-vm", ") vsz:"]
                .iter()
                .filter_map(|m| r.find(m))
                .min()
                .or_else(|| r.bytes().take(17).rposition(|b| b == b')'))
                .or_else(|| r.rfind(')'))?;
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
    read_figures(after, &mut k);
    Some(k)
}

/// The figures after a kill line's name: `total-vm:75160kB, anon-rss:...,
/// UID:0 pgtables:188kB oom_score_adj:0` (`, UID 0,` before 2.6.36).
fn read_figures(after: &str, k: &mut KilledProcess) {
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
        // (`anon-rss:153,700,88kB`) is not read as a value. Letters after
        // the `kB` are a separator a renderer replaced or lost
        // (`540752kBundefined anon-rss:`, `34756kBoomscore`): the figure
        // itself is whole.
        let kb = || {
            let (n, rest) = v.split_once("kB")?;
            let rest = rest.trim_end_matches(['*', '"', '\'', '`']);
            rest.chars()
                .all(|c| c.is_ascii_alphabetic())
                .then(|| whole(n))?
        };
        match key {
            // `vsz:` before 2.6.36.
            "total-vm" | "vsz" => k.total_vm_kb = kb(),
            "anon-rss" => k.anon_rss_kb = kb(),
            "file-rss" => k.file_rss_kb = kb(),
            "shmem-rss" => k.shmem_rss_kb = kb(),
            "UID" => k.uid = whole(v).and_then(|u| u32::try_from(u).ok()),
            "pgtables" => k.pgtables_kb = kb(),
            "oom_score_adj" => k.oom_score_adj = v.parse().ok(),
            _ => {}
        }
    }
}

/// A figure as the kernel prints it (`%lu`): a run of digits with no
/// leading zero. Anything else (`00`, a wrapped mail's remains) was
/// damaged on its way and is no value.
fn whole(n: &str) -> Option<u64> {
    (n == "0" || !n.starts_with('0')).then(|| n.parse().ok())?
}

/// `oom_reaper: reaped process 3129 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB`
pub(super) fn parse_reaped(text: &str) -> Option<Reaped> {
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
pub(super) fn parse_task_row(text: &str, columns: &[String]) -> Option<TaskRow> {
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
