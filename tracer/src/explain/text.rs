//! An explanation as text: the verdict, the victim, the killer, the
//! memory and what grew it, and what is not known.

use std::fmt::Write as _;

use super::*;
use crate::util::{time::format_wall, units::bytes};

/// How samples were taken (`exact` when every one was kept, else `each`
/// and the period), and what was lost.
pub(super) fn sampling(sample_bytes: u64, exact: &str, each: &str, lost: u64) -> String {
    let how = if sample_bytes == 0 {
        exact.to_string()
    } else {
        format!("{each} {}", bytes(sample_bytes))
    };
    if lost > 0 {
        format!("{how}; {lost} samples lost, figures are low")
    } else {
        how
    }
}

/// The victim's heap sites, as last sampled before the kill.
pub(super) fn render_heap(o: &mut String, h: &crate::record::HeapSnapshot, kill_ns: i64) {
    let before = (kill_ns - h.ts_ns as i64).max(0) as f64 / 1e9;
    let sampling = sampling(
        h.sample_bytes,
        "every allocation",
        "one sample per",
        h.lost_samples,
    );
    let _ = writeln!(
        o,
        "  heap       {} live from {} allocation sites, sampled {before:.1}s before the kill ({sampling}):",
        bytes(h.live_bytes),
        h.sites.len() + h.more_sites
    );
    for site in h.sites.iter().take(5) {
        let chain = frame_chain(&site.frames);
        let growth = if site.growth_bytes > 0 {
            format!(
                " (+{} in {}s)",
                bytes(site.growth_bytes as u64),
                h.growth_window_s
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "               {:>10}  {chain}{growth}",
            bytes(site.live_bytes)
        );
    }
}

/// Frames a text stack shows (`explain --depth`).
static DEPTH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(DEFAULT_DEPTH);

/// Frames a text stack shows unless told otherwise.
pub const DEFAULT_DEPTH: usize = 4;

/// Sets how many frames text stacks show from now on (at least 1): a
/// display setting of this process, as a terminal's width is.
pub fn set_depth(frames: usize) {
    DEPTH.store(frames.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// `f (file:line) <- caller <- ...`: up to four frames (`set_depth`), none past `main`
/// (the C runtime's start-up frames say nothing). Where the stack has
/// Python frames: the frame that allocated, then the first Python frames,
/// each with its file and line (the interpreter's own frames between say
/// nothing to the person who wrote the script).
pub fn frame_chain(frames: &[crate::stacks::symbols::Frame]) -> String {
    let depth = DEPTH.load(std::sync::atomic::Ordering::Relaxed);
    let mut names = Vec::new();
    if let Some(first) = frames.iter().position(|f| f.python) {
        let mut shown: Vec<String> = Vec::new();
        if first > 0 {
            shown.push(frames[0].label());
        }
        let room = depth.saturating_sub(shown.len()).max(1);
        shown.extend(
            frames[first..]
                .iter()
                .filter(|f| f.python)
                .take(room)
                .map(|f| f.chain_label()),
        );
        names.extend(
            shown
                .iter()
                .map(|n| crate::util::term::escape(n).into_owned()),
        );
        return names.join(" <- ");
    }
    for (i, f) in frames.iter().take(depth).enumerate() {
        let name = if i == 0 { f.label() } else { f.short() };
        names.push(crate::util::term::escape(&name).into_owned());
        if f.function.as_deref() == Some("main") {
            break;
        }
    }
    if names.is_empty() {
        return "??".into();
    }
    names.join(" <- ")
}

/// Where the victim's memory grew before the kill (sampled page faults);
/// with `neighbour`, where that neighbour's did.
///
/// `armed`: the kill's cgroup armed growth attribution within the window
/// (`--growth risk`), so the growth shown is what came after.
pub(super) fn render_growth(
    o: &mut String,
    g: &crate::record::GrowthReport,
    neighbour: bool,
    armed: Option<(&crate::record::GrowthArmed, i64)>,
) {
    let sampling = sampling(
        g.sample_bytes,
        "every fault",
        "~1 sample per",
        g.lost_samples,
    );
    let (label, whose) = if neighbour {
        (
            "neighbour",
            format!("{} (pid {}): ", crate::util::term::escape(&g.comm), g.pid),
        )
    } else {
        ("growth", String::new())
    };
    // Kept, where what was given back is traced: faults less the pages
    // unmapped or dropped again (memory freed inside a heap is not seen).
    let (kept, how) = match g.returned_bytes {
        Some(r) => (
            format!(
                "{} kept of {} faulted in",
                bytes(g.bytes.saturating_sub(r)),
                bytes(g.bytes)
            ),
            "; kept: not unmapped again before the kill",
        ),
        None => (format!("{} faulted in", bytes(g.bytes)), ""),
    };
    // Armed within the window: what was sampled is since then.
    let over = match armed {
        Some((a, kill_ns)) if kill_ns - a.since_ns < g.window_s as i64 * 1_000_000_000 => {
            let at = a
                .percent
                .map(|p| format!("at {p:.0}% of its limit, "))
                .unwrap_or_default();
            format!(
                "during the {:.1} s since {} armed ({at}{}; earlier growth not sampled)",
                (kill_ns - a.since_ns).max(0) as f64 / 1e9,
                crate::util::term::escape(&a.memcg),
                a.reason.says()
            )
        }
        _ => format!("over the last {} s", g.window_s),
    };
    let _ = writeln!(
        o,
        "  {label:<9}  {whose}{kept} {over} before the kill (sampled page faults, {sampling}{how}):"
    );
    for site in g.sites.iter().take(5) {
        let _ = writeln!(
            o,
            "               {}  {}",
            site_figure(g, site),
            frame_chain(&site.frames)
        );
    }
    if g.more_sites > 0 {
        let _ = writeln!(o, "               ({} more sites)", g.more_sites);
    }
    if g.reserved_bytes > 0 {
        let _ = writeln!(
            o,
            "  reserved   {} in large anonymous mappings over the same window:",
            bytes(g.reserved_bytes)
        );
        for site in &g.reserved {
            let _ = writeln!(
                o,
                "               {:>10}  {}",
                bytes(site.bytes),
                frame_chain(&site.frames)
            );
        }
    }
}

/// A growth site's bytes: kept, and what it faulted in where some of that
/// was given back (unmapped, dropped); right-aligned to 10.
pub fn site_figure(g: &crate::record::GrowthReport, site: &crate::record::GrowthSite) -> String {
    if g.returned_bytes.is_some() && site.returned_bytes > 0 {
        format!(
            "{:>10}  (of {} faulted in)",
            bytes(site.bytes.saturating_sub(site.returned_bytes)),
            bytes(site.bytes)
        )
    } else {
        format!("{:>10}", bytes(site.bytes))
    }
}

/// The picture taken as the kill's cgroup armed: each process's growth
/// and heap sites then, and whether the site that grew most before the
/// kill was already the first then.
pub(super) fn render_picture(
    o: &mut String,
    p: &crate::record::Picture,
    kill_ns: i64,
    growth: Option<&crate::record::GrowthReport>,
) {
    let _ = writeln!(
        o,
        "  before     a picture of {} {:.1} s after it armed, {:.1} s before the kill ({} process(es){}):",
        crate::util::term::escape(&p.memcg),
        (p.ts_ns - p.armed_ns).max(0) as f64 / 1e9,
        (kill_ns - p.ts_ns).max(0) as f64 / 1e9,
        p.processes.len(),
        if p.more_processes > 0 {
            format!(", {} more not pictured", p.more_processes)
        } else {
            String::new()
        }
    );
    for q in &p.processes {
        let rss = q
            .rss_bytes
            .map(|r| format!(", RSS {}", bytes(r)))
            .unwrap_or_default();
        let grew = q.growth_sites.first().map_or_else(
            || format!("grew {}", bytes(q.growth_bytes)),
            |s| {
                format!(
                    "grew {}, most at {}",
                    bytes(q.growth_bytes),
                    frame_chain(&s.frames)
                )
            },
        );
        let heap = match (q.heap_live_bytes, q.heap_sites.first()) {
            (Some(live), Some(s)) => format!(
                "; heap {} live, most from {}",
                bytes(live),
                frame_chain(&s.frames)
            ),
            (Some(live), None) => format!("; heap {} live", bytes(live)),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "               {} (pid {}{rss}): {grew}{heap}",
            crate::util::term::escape(&q.comm),
            q.pid
        );
    }
    // The victim's top growth site before the kill, against the picture.
    if let Some(g) = growth
        && let Some(top) = g.sites.first()
        && let Some(then) = p.processes.iter().find(|q| q.pid == g.pid)
    {
        let same = then
            .growth_sites
            .first()
            .is_some_and(|s| s.frames == top.frames);
        let _ = writeln!(
            o,
            "               {}",
            if same {
                "the site that grew most before the kill already grew most then"
            } else {
                "the site that grew most before the kill was not the first then"
            }
        );
    }
    for s in &p.skipped {
        let _ = writeln!(
            o,
            "               (not pictured: {})",
            crate::util::term::escape(s)
        );
    }
}

/// The allocation that hit the limit.
pub(super) fn render_tip(o: &mut String, t: &crate::record::TipStack) {
    let who = if t.victim_is_trigger {
        format!("{} (pid {})", crate::util::term::escape(&t.comm), t.pid)
    } else {
        format!(
            "{} (pid {}, not the victim: the kernel killed another process)",
            crate::util::term::escape(&t.comm),
            t.pid
        )
    };
    let _ = writeln!(
        o,
        "  tipped by  the allocation that hit the limit: {who} in {}",
        frame_chain(&t.frames)
    );
}

pub(super) fn kb(v: Option<u64>) -> String {
    v.map(|k| bytes(k * 1024)).unwrap_or_else(|| "?".into())
}

/// `38.2 s before the kill: growing 10.0 MiB/s, ... projected to reach
/// it in 40 s`.
pub(super) fn warned(w: &crate::record::PressureEvent, kill_ns: i64) -> String {
    let lead = (kill_ns - w.ts_ns) as f64 / 1e9;
    let why = match (w.reason, w.projected_s, w.rate_bytes_per_s, w.limit_bytes) {
        (crate::record::WarningReason::Growth, Some(p), Some(r), Some(l)) => format!(
            "growing {}/s at {} of its limit of {}, projected to reach it in {p:.0} s",
            bytes(r.max(0.0) as u64),
            bytes(w.usage_bytes),
            bytes(l)
        ),
        _ => format!(
            "its tasks stalled on memory (PSI some avg10 {:.0}%)",
            w.psi_some_avg10.unwrap_or(0.0)
        ),
    };
    format!("{lead:.1} s before the kill ({}): {why}", w.memcg)
}

/// `for 6 h 40 min before the kill: 7.1 %/h of its limit (12.0 MiB/h),
/// fitted over 6 h 40 min of its working set (/x)`.
pub(super) fn leaked(l: &crate::record::Leak, kill_ns: i64) -> String {
    use crate::util::time::human_secs;
    format!(
        "for {} before the kill: {}, fitted over {} of its working set ({})",
        human_secs((kill_ns - l.since_ns) as f64 / 1e9),
        l.rate_words(),
        human_secs(f64::from(l.fit_span_s)),
        l.memcg
    )
}

/// A command line on one line (newlines shown as `\n`), cut at `max` chars.
pub(crate) fn one_line(s: &str, max: usize) -> String {
    let flat = s.trim().replace('\n', "\\n");
    if flat.chars().count() > max {
        format!("{}...", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

/// `pid N`, or `pid not known` for 0.
pub(super) fn pid_text(pid: u32) -> String {
    match pid {
        0 => "pid not known".into(),
        p => format!("pid {p}"),
    }
}

pub(super) fn killer_line(k: &KillRecord) -> String {
    if self_kill(k) {
        return "the kernel, in the process's own context (not kill(2), not the OOM killer)".into();
    }
    match k.killer.kind {
        KillerKind::Userspace => {
            let s = k.killer.sender.as_ref();
            let name = s
                .map(|s| format!("{} ({})", s.comm, pid_text(s.pid)))
                .unwrap_or_else(|| "?".into());
            let cmd = s
                .and_then(|s| s.cmdline.as_deref())
                .map(|c| format!(": {}", one_line(c, 120)))
                .unwrap_or_default();
            match (k.killer.signal.as_deref(), &k.killer.reason) {
                // A killer's own log line that names no signal.
                (None, Some(_)) => format!("{name}{cmd}"),
                (signal, _) => format!("{name} sent {}{cmd}", signal.unwrap_or("SIGKILL")),
            }
        }
        KillerKind::GpuFault => match &k.killer.gpu_fault {
            Some(f) => format!(
                "none: it {} after Xid {} on GPU {}",
                f.ended(),
                f.xid.code,
                f.pci
            ),
            None => "none: it ended after a GPU fault".into(),
        },
        KillerKind::KernelOom => format!(
            "kernel OOM killer, constraint {}",
            k.killer.constraint.as_deref().unwrap_or("?")
        ),
    }
}

/// Renders one explanation as text.
pub fn render_text(e: &Explanation) -> String {
    let k = &e.kill;
    let v = &k.victim;
    let mut o = String::new();
    let by = if self_kill(k) {
        "killed with SIGKILL by a BPF program or a kernel limit".to_string()
    } else if k.killer.kind == KillerKind::Userspace {
        let signal = k.killer.signal.as_deref().unwrap_or("SIGKILL");
        match k
            .killer
            .sender
            .as_ref()
            .filter(|s| k.killer.reason.is_some() && !s.comm.is_empty())
        {
            Some(s) if k.killer.signal.is_none() => format!("killed by {}", s.comm),
            Some(s) => format!("killed by {} with {signal}", s.comm),
            None => format!("killed with {signal}"),
        }
    } else if let Some(f) = &k.killer.gpu_fault {
        format!("{} after a GPU fault (Xid {})", f.exit, f.xid.code)
    } else {
        "killed by the kernel OOM killer".to_string()
    };
    // A kill from a saved log that gives only the time since boot carries
    // that time (nothing before 1990 is a wall time).
    let when = if k.time_unreadable {
        "[time not known]".to_string()
    } else if k.ts_ns < 631_152_000_000_000_000 {
        format!("[{:.6} s after boot]", k.ts_ns as f64 / 1e9)
    } else {
        format_wall(k.ts_ns)
    };
    let _ = writeln!(o, "{when} {} ({}) {by}", v.comm, pid_text(v.pid));
    let _ = writeln!(o);
    let uid = v.uid.map(|u| format!(", uid {u}")).unwrap_or_default();
    let _ = writeln!(o, "  victim     {} ({}{uid})", v.comm, pid_text(v.pid));
    if let Some(c) = &v.cmdline {
        let _ = writeln!(o, "  command    {}", one_line(c, 200));
    }
    if let Some(m) = &v.memcg {
        let owner = owner_tag(v.owner.as_ref());
        let _ = writeln!(o, "  cgroup     {m}{owner}");
    }
    if let Some(w) = &k.warning {
        let _ = writeln!(o, "  warned     {}", warned(w, k.ts_ns));
    }
    if let Some(l) = &k.leak {
        let _ = writeln!(o, "  leaked     {}", leaked(l, k.ts_ns));
    }
    if let Some(k) = v.owner.as_ref().and_then(|o| o.kube.as_ref()) {
        let ctr = k
            .container
            .as_ref()
            .map(|c| format!(", container {c}"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  pod        {} in namespace {}{ctr}",
            k.pod, k.namespace
        );
    }
    let mem = &v.memory;
    let adj = v
        .oom_score_adj
        .map(|a| format!(", oom_score_adj {a}"))
        .unwrap_or_default();
    let src = mem
        .source
        .map(|s| format!(" (from {})", s.as_str()))
        .unwrap_or_default();
    if mem.rss_kb().is_some() {
        let _ = writeln!(
            o,
            "  memory     RSS {} = anon {} + file {} + shmem {}; page tables {}{adj}{src}",
            kb(mem.rss_kb()),
            kb(mem.anon_rss_kb),
            kb(mem.file_rss_kb),
            kb(mem.shmem_rss_kb),
            kb(mem.pgtables_kb)
        );
    } else if mem.anon_rss_kb.is_some() {
        // Older kernels print no shmem-rss (before 4.5) or page tables.
        let known = |v: Option<u64>| v.map_or_else(|| "not known".into(), |k| bytes(k * 1024));
        let _ = writeln!(
            o,
            "  memory     anon {}, file {}, shmem {}; page tables {}{adj}{src}",
            known(mem.anon_rss_kb),
            known(mem.file_rss_kb),
            known(mem.shmem_rss_kb),
            known(mem.pgtables_kb)
        );
    } else {
        let _ = writeln!(o, "  memory     unknown{adj}");
    }
    if let Some(g) = &v.gpu {
        let _ = writeln!(
            o,
            "  gpu        {} (traced CUDA allocations)",
            gpu::held_by_kind(g)
        );
    }
    if let Some(h) = &v.heap {
        render_heap(&mut o, h, k.ts_ns);
    }
    let armed = k.growth_armed.as_ref().map(|a| (a, k.ts_ns));
    if let Some(g) = &k.growth {
        render_growth(&mut o, g, false, armed);
    }
    if let Some(g) = &k.neighbour_growth {
        render_growth(&mut o, g, true, armed);
    }
    if let Some(t) = &k.tipping_stack {
        render_tip(&mut o, t);
    }
    if let Some(p) = &k.picture {
        render_picture(&mut o, p, k.ts_ns, k.growth.as_ref());
    }
    for n in &k.gpu_picture {
        gpu::render_picture(&mut o, n, k.ts_ns, Some(v.pid));
    }
    let _ = writeln!(o, "  killed by  {}", killer_line(k));
    if let Some(a) = &k.aggregate {
        let named: Vec<String> = a
            .victims
            .iter()
            .map(|(pid, comm)| format!("{comm} ({pid})"))
            .collect();
        let _ = writeln!(
            o,
            "  storm      {} SIGKILLs from this sender into this cgroup between {} and {}; the first: {}",
            a.count,
            format_wall(a.first_ns),
            format_wall(a.last_ns),
            named.join(", ")
        );
    }
    if let Some(t) = &k.trigger {
        let alloc = match (&t.gfp_mask, t.order) {
            (Some(g), Some(ord)) => format!(", allocating gfp_mask={g} order={ord}"),
            _ => String::new(),
        };
        let who = if t.task.pid == v.pid {
            " (the victim itself)"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "  trigger    {} ({}){who}{alloc}",
            t.task.comm,
            pid_text(t.task.pid)
        );
    }
    if let Some(m) = k.memcg.as_ref().filter(|m| {
        m.source != FiguresFrom::Sample || m.usage_bytes.is_some() || m.limit_bytes.is_some()
    }) {
        let limit = m
            .limit_bytes
            .map(|l| format!(" of limit {}", bytes(l)))
            .unwrap_or_else(|| ", no limit".into());
        let usage = m.usage_bytes.map(bytes).unwrap_or_else(|| "?".into());
        let fail = m
            .failcnt
            .map(|f| format!(", failcnt {f}"))
            .unwrap_or_default();
        let src = match (m.source, m.age_ms) {
            (FiguresFrom::Kmsg, _) => "kernel report at the kill".to_string(),
            (_, Some(age)) => format!("last sample, {age} ms before the kill"),
            _ => "last sample".to_string(),
        };
        let _ = writeln!(
            o,
            "  memcg      {}: usage {usage}{limit}{fail} ({src})",
            m.path
        );
    } else if let Some(m) = &k.memcg {
        // Not sampled before the kill (made a moment before), and no
        // kernel report joined: nothing is known of its figures, not even
        // whether it had a limit.
        let _ = writeln!(
            o,
            "  memcg      {}: usage and limit not known (no sample of it before the kill, and no kernel report)",
            m.path
        );
    }
    if !k.tasks.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(o, "  tasks in the cgroup at the kill:");
        let _ = writeln!(
            o,
            "  {:>8}  {:>10}  {:>10}  {:>10}  {:>10}  {:>5}  NAME",
            "PID", "RSS", "ANON", "FILE", "SHMEM", "ADJ"
        );
        for t in &k.tasks {
            let adj = t
                .oom_score_adj
                .map(|a| a.to_string())
                .unwrap_or_else(|| "?".into());
            let mark = if t.victim || t.pid == v.pid {
                "  <- victim"
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "  {:>8}  {:>10}  {:>10}  {:>10}  {:>10}  {:>5}  {}{mark}",
                t.pid,
                kb(Some(t.rss_kb)),
                kb(t.anon_kb),
                kb(t.file_kb),
                kb(t.shmem_kb),
                adj,
                t.comm
            );
        }
    }
    if !k.leadup.is_empty() {
        let _ = writeln!(o);
        let secs = (k.ts_ns - k.leadup[0].ts_ns) as f64 / 1e9;
        let n = k.leadup.len();
        let _ = writeln!(
            o,
            "  lead-up    {n} samples of cgroup usage over the last {secs:.1} s:"
        );
        let step = (k.leadup.len() / 8).max(1);
        let points: Vec<String> = k
            .leadup
            .iter()
            .enumerate()
            .filter(|(i, _)| i % step == 0 || i + 1 == k.leadup.len())
            .map(|(_, s)| {
                format!(
                    "{:+.1}s {}",
                    (s.ts_ns - k.ts_ns) as f64 / 1e9,
                    bytes(s.usage_bytes)
                )
            })
            .collect();
        let _ = writeln!(o, "    {}", points.join(", "));
        if let Some((a, b, rate)) = growth(k) {
            let sign = if b >= a { "+" } else { "-" };
            let _ = writeln!(o, "    growth {sign}{}/s", bytes(rate.abs() as u64));
        }
        let first_scan = k.leadup.first().and_then(|s| s.reclaim_scanned);
        let last_scan = k.leadup.last().and_then(|s| s.reclaim_scanned);
        if let (Some(a), Some(b)) = (first_scan, last_scan)
            && b > a
        {
            let _ = writeln!(
                o,
                "    reclaim scanned {} pages in the cgroup over the lead-up",
                b - a
            );
        }
    }
    if let Some(r) = &k.reaping
        && let (Some(s), Some(f)) = (r.start_ns, r.finish_ns)
    {
        let _ = writeln!(
            o,
            "  reaping    the oom_reaper freed the victim's memory in {:.1} ms",
            (f - s) as f64 / 1e6
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "  verdict    {}", e.verdict.summary);
    let mut unknown: Vec<String> = k.gaps.iter().map(ToString::to_string).collect();
    for d in &e.drops {
        unknown.push(format!(
            "{} between {} and {}",
            d.describe(),
            format_wall(d.from_ns),
            format_wall(d.to_ns)
        ));
    }
    if e.recorder_running == Some(false) {
        unknown.push("tracer was not recording at that time".into());
    }
    if let Some(s) = e.last_heartbeat_s {
        unknown.push(format!(
            "whether tracer was recording: its last heartbeat was {s:.1} s before the kill, and it stopped without closing its session (a crash, a SIGKILL, a power cut)"
        ));
    }
    for g in unknown {
        let _ = writeln!(o, "  not known  {g}");
    }
    let _ = writeln!(o, "  source     {}", k.source);
    o
}
