//! `tracer report --html`: kills as one self-contained HTML page (inline
//! CSS, SVG and script, nothing from elsewhere: it opens offline, in any
//! browser, attached to a ticket). Per kill: the explanation, the memory
//! cgroup's usage against its limit over the stored lead-up with the kill
//! marked, the tasks of the cgroup as bars, the GPU timeline of the
//! victim's devices when there is one, and the growth sites as a flame
//! graph.
//!
//! The HTML is built with maud (every value escaped by construction: a
//! victim's name is whatever its process chose). The plots are SVG written
//! here: their elements carry ids (prefixed with their kill's section id)
//! and `data-` attributes (the plotted values, the scale) that a reader's
//! script or a test can check, which a plotting crate's output does not.
//! The flame graph is inferno's, with its inline script (zoom, search).

use std::fmt::Write as _;

use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::{
    explain::{Explanation, render_text},
    model::sampler::CgroupSample,
    record::KillRecord,
    util::{time::format_wall, units::bytes},
};

/// One device's NVML timeline around a kill.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuTimeline {
    /// Device index.
    pub device: u32,
    /// Its memory, bytes.
    pub total: u64,
    /// (wall ns, bytes in use on the device).
    pub used: Vec<(i64, u64)>,
    /// (wall ns, bytes NVML charged the victim, bytes its traced calls held).
    pub victim: Vec<crate::store::ProcessPoint>,
}

/// One kill of the report.
#[derive(Clone, Debug)]
pub struct KillPage {
    /// What `explain` says about it.
    pub explanation: Explanation,
    /// The NVML timelines of the victim's devices.
    pub gpu: Vec<GpuTimeline>,
}

const W: f64 = 760.0;
const H: f64 = 260.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 40.0;

/// Linear scales of a time plot: wall ns across, bytes up.
struct Scale {
    t0: i64,
    t1: i64,
    y_max: f64,
}

impl Scale {
    fn x(&self, t: i64) -> f64 {
        let span = (self.t1 - self.t0).max(1) as f64;
        LEFT + (W - LEFT - RIGHT) * (t - self.t0) as f64 / span
    }

    fn y(&self, v: f64) -> f64 {
        TOP + (H - TOP - BOTTOM) * (1.0 - v / self.y_max)
    }

    /// The `<svg>` opening tag, with the scale for readers.
    fn open(&self, id: &str, label: &str) -> String {
        format!(
            r#"<svg id="{id}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{label}" data-y-max="{}" data-plot-top="{TOP}" data-plot-height="{}" data-t0-ns="{}" data-t1-ns="{}">"#,
            self.y_max,
            H - TOP - BOTTOM,
            self.t0,
            self.t1
        )
    }

    /// Axes, a few byte ticks, and time ticks in seconds relative to `at`.
    fn axes(&self, at: i64) -> String {
        let mut s = format!(
            r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}" stroke="#888"/><line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="#888"/>"##,
            H - BOTTOM,
            H - BOTTOM,
            W - RIGHT,
            H - BOTTOM
        );
        for i in 0..=4 {
            let v = self.y_max * f64::from(i) / 4.0;
            let _ = write!(
                s,
                r##"<text x="{}" y="{:.1}" font-size="11" text-anchor="end" fill="#555">{}</text>"##,
                LEFT - 6.0,
                self.y(v) + 4.0,
                bytes(v as u64)
            );
        }
        for i in 0..=4 {
            let t = self.t0 + (self.t1 - self.t0) * i / 4;
            // Whole seconds from the kill (no `-0`).
            let secs = ((t - at) as f64 / 1e9).round() as i64;
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle" fill="#555">{secs:+} s</text>"##,
                self.x(t),
                H - BOTTOM + 16.0,
            );
        }
        s
    }

    fn polyline(&self, id: &str, color: &str, points: &[(i64, f64)]) -> String {
        let pts: Vec<String> = points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", self.x(*t), self.y(*v)))
            .collect();
        format!(
            r#"<polyline id="{id}" class="series" data-samples="{}" fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.len(),
            pts.join(" ")
        )
    }

    fn kill_marker(&self, p: &str, ts: i64) -> String {
        let x = self.x(ts);
        format!(
            r##"<line id="{p}-kill-marker" class="kill-marker" data-ts-ns="{ts}" x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#c00" stroke-width="2" stroke-dasharray="4 3"/><text x="{x:.1}" y="{}" font-size="11" fill="#c00" text-anchor="end">kill</text>"##,
            H - BOTTOM,
            TOP - 6.0
        )
    }
}

/// The memory cgroup's usage against its limit over the lead-up (element
/// ids prefixed with `p`, the kill's section).
fn memcg_plot(p: &str, k: &KillRecord) -> Option<String> {
    let limit = k.memcg.as_ref().and_then(|m| m.limit_bytes);
    let mut points: Vec<(i64, f64)> = k
        .leadup
        .iter()
        .map(|s: &CgroupSample| (s.ts_ns, s.usage_bytes as f64))
        .collect();
    if let Some(u) = k.memcg.as_ref().and_then(|m| m.usage_bytes) {
        points.push((k.ts_ns, u as f64));
    }
    if points.is_empty() {
        return None;
    }
    points.sort_by_key(|p| p.0);
    let top = points
        .iter()
        .map(|p| p.1)
        .fold(limit.unwrap_or(0) as f64, f64::max);
    let scale = Scale {
        t0: points[0].0.min(k.ts_ns - 1_000_000_000),
        t1: points[points.len() - 1].0.max(k.ts_ns) + 1_000_000_000,
        y_max: (top * 1.1).max(1.0),
    };
    let mut s = scale.open(
        &format!("{p}-memcg-plot"),
        "memory cgroup usage against its limit",
    );
    s.push_str(&scale.axes(k.ts_ns));
    if let Some(l) = limit {
        let y = scale.y(l as f64);
        let _ = write!(
            s,
            r##"<line id="{p}-memcg-limit" data-bytes="{l}" x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#e67e00" stroke-width="2"/><text x="{}" y="{:.1}" font-size="11" fill="#e67e00">limit {}</text>"##,
            W - RIGHT,
            LEFT + 6.0,
            y - 4.0,
            bytes(l)
        );
    }
    s.push_str(&scale.polyline(&format!("{p}-memcg-usage"), "#1f6feb", &points));
    s.push_str(&scale.kill_marker(p, k.ts_ns));
    s.push_str("</svg>");
    Some(s)
}

/// `s` escaped for HTML (and SVG) text.
fn esc(s: &str) -> String {
    html! { (s) }.into_string()
}

/// The tasks of the cgroup at the kill, by RSS.
fn tasks_chart(p: &str, k: &KillRecord) -> Option<String> {
    if k.tasks.is_empty() {
        return None;
    }
    let rows = k.tasks.iter().take(20).collect::<Vec<_>>();
    let max = rows.iter().map(|t| t.rss_kb).max().unwrap_or(1).max(1) as f64;
    let h = 22.0 * rows.len() as f64 + 10.0;
    let mut s = format!(
        r#"<svg id="{p}-tasks-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" aria-label="tasks of the cgroup at the kill">"#
    );
    for (i, t) in rows.iter().enumerate() {
        let y = 5.0 + 22.0 * i as f64;
        let w = (W - 260.0) * t.rss_kb as f64 / max;
        let color = if t.victim { "#c00" } else { "#6e7781" };
        let _ = write!(
            s,
            r#"<text x="190" y="{:.1}" font-size="12" text-anchor="end">{} ({})</text><rect class="task" data-pid="{}" data-rss-kb="{}" data-victim="{}" x="200" y="{y:.1}" width="{w:.1}" height="16" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            y + 12.0,
            esc(&t.comm),
            t.pid,
            t.pid,
            t.rss_kb,
            t.victim,
            205.0 + w,
            y + 12.0,
            bytes(t.rss_kb * 1024)
        );
    }
    s.push_str("</svg>");
    Some(s)
}

/// NVML's device figures over time, with the victim's share.
fn gpu_plot(p: &str, g: &GpuTimeline, kill_ns: i64) -> Option<String> {
    if g.used.is_empty() {
        return None;
    }
    let ts = g.used.iter().map(|p| p.0);
    let scale = Scale {
        t0: ts.clone().min()?.min(kill_ns - 1_000_000_000),
        t1: ts.max()?.max(kill_ns) + 1_000_000_000,
        y_max: (g.total.max(1) as f64) * 1.05,
    };
    let id = format!("{p}-gpu-{}-plot", g.device);
    let mut s = scale.open(&id, "GPU memory over time");
    s.push_str(&scale.axes(kill_ns));
    let total_y = scale.y(g.total as f64);
    let _ = write!(
        s,
        r##"<line id="{p}-gpu-{}-total" data-bytes="{}" x1="{LEFT}" y1="{total_y:.1}" x2="{}" y2="{total_y:.1}" stroke="#e67e00" stroke-width="2"/>"##,
        g.device,
        g.total,
        W - RIGHT
    );
    let used: Vec<(i64, f64)> = g.used.iter().map(|(t, v)| (*t, *v as f64)).collect();
    s.push_str(&scale.polyline(&format!("{p}-gpu-{}-used", g.device), "#1f6feb", &used));
    let nvml: Vec<(i64, f64)> = g
        .victim
        .iter()
        .filter_map(|(t, n, _)| Some((*t, (*n)? as f64)))
        .collect();
    if !nvml.is_empty() {
        s.push_str(&scale.polyline(&format!("{p}-gpu-{}-victim", g.device), "#c00", &nvml));
    }
    let traced: Vec<(i64, f64)> = g
        .victim
        .iter()
        .filter_map(|(t, _, tr)| Some((*t, (*tr)? as f64)))
        .collect();
    if !traced.is_empty() {
        s.push_str(&scale.polyline(
            &format!("{p}-gpu-{}-victim-traced", g.device),
            "#8250df",
            &traced,
        ));
    }
    s.push_str(&scale.kill_marker(p, kill_ns));
    s.push_str("</svg>");
    Some(s)
}

/// The growth sites as a flame graph (inferno), bytes in KiB: the
/// victim's, else the blamed neighbour's (the title names whose).
fn growth_flame(p: &str, k: &KillRecord) -> Option<String> {
    let g = k.growth.as_ref().or(k.neighbour_growth.as_ref())?;
    let folded: Vec<String> = g
        .sites
        .iter()
        .filter(|s| s.bytes >= 1024)
        .map(|s| {
            let stack: Vec<String> = s
                .frames
                .iter()
                .rev()
                .map(|f| {
                    f.function
                        .clone()
                        .or_else(|| f.module.clone())
                        .unwrap_or_else(|| "?".into())
                        .replace(';', ":")
                })
                .collect();
            format!("{} {}", stack.join(";"), s.bytes / 1024)
        })
        .collect();
    if folded.is_empty() {
        return None;
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = format!("Where pid {} grew (KiB faulted in)", g.pid);
    opts.count_name = "KiB".into();
    opts.deterministic = true;
    opts.image_width = Some(W as usize);
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, folded.iter().map(String::as_str), &mut svg).ok()?;
    let svg = String::from_utf8(svg).ok()?;
    // A document of its own: inferno's script finds its elements by fixed
    // ids, so two graphs inline on one page would share them (the second
    // graph's zoom and search would act on the first). Sandboxed: its
    // script runs, in an origin of its own.
    let height = svg
        .split_once("<svg")
        .and_then(|(_, tag)| tag.split_once(" height=\""))
        .and_then(|(_, h)| h.split('"').next()?.parse::<u32>().ok())
        .unwrap_or(400);
    let frame = html! {
        iframe.flame id=(format!("{p}-growth-flame")) title=(opts.title)
            sandbox="allow-scripts" width="100%" height=(height + 4) srcdoc=(svg) {}
    };
    Some(frame.into_string())
}

/// The node's offset from UTC now, as `+01:00`.
// libc marks musl's time_t deprecated ahead of a change that does not
// touch x86_64 or aarch64, where it is already 64 bits.
#[allow(deprecated)]
fn utc_offset() -> String {
    let now = libc::time_t::try_from(crate::util::time::wall_now_ns() / 1_000_000_000).unwrap_or(0);
    // SAFETY: localtime_r writes into the tm given; both live on the stack.
    let off = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            0
        } else {
            tm.tm_gmtoff
        }
    };
    let sign = if off < 0 { '-' } else { '+' };
    format!("{sign}{:02}:{:02}", off.abs() / 3600, off.abs() % 3600 / 60)
}

/// From this many kills on, a page has an index and each kill's section
/// is kept under [`KILL_BUDGET`] bytes.
pub const BUDGET_FROM: usize = 10;
/// Bytes a kill's section may take in a page of many kills.
pub const KILL_BUDGET: usize = 48 * 1024;

/// What a kill's section holds; parts are left out, in this order, to keep
/// it under its budget.
#[derive(Clone, Copy)]
struct Parts {
    flame: bool,
    charts: bool,
    /// The explanation's text, cut at this many bytes.
    text_max: Option<usize>,
}

impl Parts {
    const ALL: Parts = Parts {
        flame: true,
        charts: true,
        text_max: None,
    };
}

/// The id of a kill's section.
fn section_id(e: &Explanation) -> String {
    e.id.map(|i| format!("kill-{i}"))
        .unwrap_or_else(|| format!("kill-pid-{}", e.kill.victim.pid))
}

fn kill_title(k: &KillRecord) -> String {
    let v = &k.victim;
    format!(
        "{} (pid {}) killed {}",
        v.comm,
        v.pid,
        if k.time_unreadable {
            "at a time the log does not say".to_string()
        } else if k.ts_ns > 631_152_000_000_000_000 {
            format!("at {}", format_wall(k.ts_ns))
        } else {
            format!("{:.6} s after boot", k.ts_ns as f64 / 1e9)
        }
    )
}

/// A kill's section, open or folded; with a budget, parts are left out
/// (and said to be) until it fits.
fn kill_section(p: &KillPage, open: bool, budget: Option<usize>) -> Markup {
    let full = kill_section_with(p, open, Parts::ALL, &[]);
    let Some(budget) = budget else {
        return full;
    };
    if full.0.len() <= budget {
        return full;
    }
    let mut parts = Parts::ALL;
    let mut left = Vec::new();
    for step in 0..3 {
        match step {
            0 => {
                parts.flame = false;
                left.push("the flame graph of where its memory grew");
            }
            1 => {
                parts.charts = false;
                left.push("the charts of its cgroup, tasks and GPUs");
            }
            _ => {
                // What the rest takes, and the text gets what is left.
                let bare = kill_section_with(
                    p,
                    open,
                    Parts {
                        text_max: Some(0),
                        ..parts
                    },
                    &left,
                );
                parts.text_max = Some(budget.saturating_sub(bare.0.len() + 256));
                left.push("the end of its explanation");
            }
        }
        let m = kill_section_with(p, open, parts, &left);
        if m.0.len() <= budget {
            return m;
        }
    }
    kill_section_with(p, open, parts, &left)
}

fn kill_section_with(p: &KillPage, open: bool, parts: Parts, left: &[&str]) -> Markup {
    let e = &p.explanation;
    let k = &e.kill;
    let v = &k.victim;
    let id = section_id(e);
    let mut text = render_text(e);
    if let Some(max) = parts.text_max
        && text.len() > max
    {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n...");
    }
    html! {
        section.kill id=(id) data-pid=(v.pid) data-ts-ns=(k.ts_ns) {
            details.kill open[open] {
                summary { h2 { (kill_title(k)) } }
                p.verdict { strong { "Verdict: " } (e.verdict.summary) }
                @if !left.is_empty() {
                    p.none.budget data-budget=(KILL_BUDGET) {
                        "Left out to keep this kill under " (bytes(KILL_BUDGET as u64)) " of the page: "
                        (left.join(", ")) ". "
                        code { "tracer report --pid " (v.pid) } " (or " code { "tracer explain --pid " (v.pid) } ") has it whole."
                    }
                }
                details open {
                    summary { "Explanation" }
                    pre { (text) }
                }
                @if parts.charts {
                    h3 { "Memory cgroup" }
                    @match memcg_plot(&id, k) {
                        Some(svg) => {
                            p.caption {
                                "Usage of " code { (k.cgroup().unwrap_or("?")) }
                                " against its limit over the stored lead-up; the dashed line is the kill."
                            }
                            (PreEscaped(svg))
                        }
                        None => p.none { "No samples of its memory cgroup were stored before this kill." }
                    }
                    @if let Some(svg) = tasks_chart(&id, k) {
                        h3 { "Tasks of the cgroup at the kill (RSS)" }
                        (PreEscaped(svg))
                    }
                    @for g in &p.gpu {
                        @if let Some(svg) = gpu_plot(&id, g, k.ts_ns) {
                            h3 { "GPU " (g.device) }
                            p.caption { "Device memory in use (blue), what NVML charged the victim (red) and what its traced CUDA calls held (purple)." }
                            (PreEscaped(svg))
                        }
                    }
                }
                @if parts.flame && let Some(svg) = growth_flame(&id, k) {
                    h3 { "Where its memory grew" }
                    (PreEscaped(svg))
                }
            }
        }
    }
}

/// The index of a page of many kills: by place (pod, container or
/// cgroup), the place with the latest kill first; in each, its crash loops
/// as one row that heads their kills.
fn index(pages: &[KillPage]) -> Markup {
    use crate::explain::loops;
    let groups = loops::loops(
        pages,
        |p| loops::key(&p.explanation.kill, p.explanation.verdict.cause),
        |p| p.explanation.kill.ts_ns,
    );
    let mut places: Vec<(String, Vec<Vec<usize>>)> = Vec::new();
    for g in groups {
        let k = &pages[g[0]].explanation.kill;
        let place = loops::place(k.victim.owner.as_ref(), k.cgroup());
        match places.iter_mut().find(|(p, _)| *p == place) {
            Some((_, gs)) => gs.push(g),
            None => places.push((place, vec![g])),
        }
    }
    let row = |i: usize| {
        let e = &pages[i].explanation;
        let k = &e.kill;
        html! {
            tr.kill {
                td { a href=(format!("#{}", section_id(e))) { (format_wall(k.ts_ns)) } }
                td { (k.victim.comm) " (" (k.victim.pid) ")" }
                td { (k.killer.name()) }
                td { (e.verdict.summary) }
            }
        }
    };
    html! {
        nav #index {
            h2 { "Index" }
            p.caption {
                (pages.len()) " kill(s) in " (places.len()) " place(s), by place; a crash loop's kills "
                "(one killer, one program, one place, one verdict, each within "
                (loops::GAP_NS / 60_000_000_000) " min of the next) under one row."
            }
            table {
                thead { tr { th { "Time (UTC)" } th { "Victim" } th { "Killer" } th { "Verdict" } } }
                @for (place, gs) in &places {
                    tbody.place data-place=(place) data-kills=(gs.iter().map(Vec::len).sum::<usize>()) {
                        tr.place { th colspan="4" { (place) ": " (gs.iter().map(Vec::len).sum::<usize>()) " kill(s)" } }
                        @for g in gs {
                            @if g.len() > 1 {
                                @let first = pages[*g.last().expect("never empty")].explanation.kill.ts_ns;
                                @let last = &pages[g[0]].explanation;
                                tr.loop data-kills=(g.len()) {
                                    td colspan="4" {
                                        strong { "Crash loop: " } (last.kill.victim.comm) " "
                                        (loops::span(g.len(), first, last.kill.ts_ns)) ", the same verdict"
                                    }
                                }
                            }
                            @for &i in g { (row(i)) }
                        }
                    }
                }
            }
        }
    }
}

/// The page for `pages` (latest first), made on `host`.
pub fn html(pages: &[KillPage], host: &str) -> String {
    let now = crate::util::time::wall_now_ns();
    let many = pages.len() >= BUDGET_FROM;
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "tracer report: " (pages.len()) " kill(s) on " (host) }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    h1 { "OOM kills on " (host) }
                    p.meta {
                        (pages.len()) " kill(s). Made " (format_wall(now))
                        ". Times are UTC (this node's clock is UTC" (utc_offset()) ")."
                        @if many {
                            " Each kill is kept under " (bytes(KILL_BUDGET as u64))
                            " of the page: past it, its flame graph, then its charts, then the end of its explanation are left out, and it says so."
                        }
                    }
                }
                @if pages.len() > 1 { (index(pages)) }
                @for (i, p) in pages.iter().enumerate() {
                    (kill_section(p, i == 0 || !many, many.then_some(KILL_BUDGET)))
                }
            }
        }
    };
    // Names, command lines, paths and symbols are chosen by whoever runs
    // the process: invisible format characters (a right-to-left override
    // that makes pid 20660 read 06602) are shown as escapes, wherever
    // they are on the page.
    crate::util::term::escape_invisible(&page.into_string()).into_owned()
}

const CSS: &str = "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:820px;color:#1f2328}\
h1{font-size:1.5rem}h2{font-size:1.2rem;border-top:1px solid #d0d7de;padding-top:1rem}\
h3{font-size:1rem;margin-bottom:.3rem}pre{background:#f6f8fa;padding:.8rem;overflow-x:auto;font-size:12px}\
.verdict{background:#fff8c5;padding:.5rem}.caption,.meta,.none{color:#57606a;font-size:.9rem}\
svg{display:block;max-width:100%;height:auto}iframe.flame{border:0;display:block}\
details.kill>summary h2{display:inline}table{border-collapse:collapse;font-size:.85rem;width:100%}\
td,th{text-align:left;padding:.15rem .4rem;vertical-align:top}tr.place th{background:#eaeef2}tr.loop td{background:#fff8c5}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{KillRecord, MemcgAtKill, TaskAtKill, Victim};

    const MIB: u64 = 1 << 20;

    fn kill() -> KillRecord {
        let t0 = 1_750_000_000_000_000_000i64;
        KillRecord {
            ts_ns: t0 + 10_000_000_000,
            victim: Victim {
                pid: 42,
                comm: "<script>alert(1)</script>".into(),
                ..Default::default()
            },
            memcg: Some(MemcgAtKill {
                path: "/job".into(),
                limit_bytes: Some(100 * MIB),
                usage_bytes: Some(100 * MIB),
                ..Default::default()
            }),
            leadup: (0..10)
                .map(|i| CgroupSample {
                    ts_ns: t0 + i * 1_000_000_000,
                    usage_bytes: (10 + 9 * i as u64) * MIB,
                    limit_bytes: Some(100 * MIB),
                    ..Default::default()
                })
                .collect(),
            tasks: vec![TaskAtKill {
                pid: 42,
                comm: "a&b".into(),
                rss_kb: 90 * 1024,
                victim: true,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_page_of_many_kills_has_an_index_a_loop_row_and_kills_within_their_budget() {
        // A crash loop of 12 kills, each with 400 growth sites (a flame
        // graph and an explanation well past the budget), and one other.
        let big = |id: i64, ts_s: i64, comm: &str, path: &str| {
            let mut k = kill();
            k.ts_ns += ts_s * 1_000_000_000;
            k.victim.comm = comm.into();
            k.memcg.as_mut().unwrap().path = path.into();
            k.growth = Some(crate::record::growth::GrowthReport {
                pid: 42,
                sites: (0..400)
                    .map(|i| crate::record::growth::GrowthSite {
                        frames: (0..8)
                            .map(|d| crate::stacks::symbols::Frame {
                                function: Some(format!(
                                    "function_{i}_at_depth_{d}_with_a_long_name"
                                )),
                                ..Default::default()
                            })
                            .collect(),
                        bytes: (400 - i) * MIB,
                        samples: 16,
                        returned_bytes: 0,
                    })
                    .collect(),
                ..Default::default()
            });
            KillPage {
                explanation: crate::explain::explain(Some(id), k, Vec::new(), None),
                gpu: Vec::new(),
            }
        };
        let mut pages: Vec<KillPage> = (0..12)
            .map(|i| big(20 - i, 60 * (12 - i), "trainer", "/job"))
            .collect();
        pages.push(big(1, 0, "other", "/elsewhere"));
        let page = html(&pages, "node-1");
        assert!(page.contains(r#"<nav id="index">"#));
        assert_eq!(page.matches(r#"<tr class="kill">"#).count(), 13);
        assert!(
            page.contains(r#"<tbody class="place" data-place="/job" data-kills="12">"#),
            "{page}"
        );
        assert!(page.contains(r#"<tr class="loop" data-kills="12">"#));
        assert!(page.contains("killed 12 times in 11m"));
        let starts: Vec<usize> = page
            .match_indices(r#"<section class="kill""#)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(starts.len(), 13);
        for (n, &at) in starts.iter().enumerate() {
            let end = starts.get(n + 1).copied().unwrap_or(page.len());
            let section = &page[at..end];
            assert!(
                section.len() <= KILL_BUDGET + 256,
                "section {n}: {} bytes",
                section.len()
            );
            assert!(
                section.contains("Left out to keep this kill under 48.0 KiB"),
                "section {n}"
            );
        }
        // The latest is open, the others folded.
        assert_eq!(page.matches(r#"<details class="kill" open>"#).count(), 1);
        // A page of few kills keeps everything.
        let few = html(&pages[..2], "node-1");
        assert!(!few.contains("Left out"));
        assert!(few.contains("kill-20-growth-flame"));
    }

    #[test]
    fn a_gpu_timeline_plots_the_device_the_victim_and_its_traced_bytes() {
        let t0 = 1_750_000_000_000_000_000i64;
        let g = GpuTimeline {
            device: 3,
            total: 80 << 30,
            used: (0..5)
                .map(|i| (t0 + i * 1_000_000_000, (60 + i as u64) << 30))
                .collect(),
            victim: (0..5)
                .map(|i| {
                    (
                        t0 + i * 1_000_000_000,
                        Some((40 + i as u64) << 30),
                        Some(38 << 30),
                    )
                })
                .collect(),
        };
        let svg = gpu_plot("k", &g, t0 + 5_000_000_000).unwrap();
        assert!(svg.contains(r#"id="k-gpu-3-used" class="series" data-samples="5""#));
        assert!(svg.contains(r#"id="k-gpu-3-victim" class="series" data-samples="5""#));
        assert!(svg.contains(r#"id="k-gpu-3-victim-traced""#));
        assert!(svg.contains(&format!(
            r#"id="k-gpu-3-total" data-bytes="{}""#,
            80u64 << 30
        )));
        assert!(svg.contains(r#"id="k-kill-marker""#));
        assert_eq!(gpu_plot("k", &GpuTimeline::default(), t0), None);
    }

    #[test]
    fn the_page_plots_usage_limit_and_kill_and_escapes_names() {
        let k = kill();
        let e = crate::explain::explain(Some(7), k.clone(), Vec::new(), None);
        let page = html(
            &[KillPage {
                explanation: e,
                gpu: Vec::new(),
            }],
            "node-1",
        );
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(
            !page.contains("<script>alert"),
            "the victim's name is escaped"
        );
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains(r#"data-pid="42" data-rss-kb="92160""#));
        assert!(page.contains("a&amp;b (42)"));
        // 10 lead-up samples and the kernel's figure at the kill.
        assert!(page.contains(r#"id="kill-7-memcg-usage" class="series" data-samples="11""#));
        // The limit line sits where the scale puts 100 MiB.
        let scale = Scale {
            t0: k.leadup[0].ts_ns,
            t1: k.ts_ns + 1_000_000_000,
            y_max: 110.0 * MIB as f64,
        };
        let y = scale.y(100.0 * MIB as f64);
        assert!(
            page.contains(&format!(
                r#"data-bytes="{}" x1="{LEFT}" y1="{y:.1}""#,
                100 * MIB
            )),
            "{page}"
        );
        assert!(page.contains(r#"id="kill-7-kill-marker""#));
        assert!(
            !page.contains("<link") && !page.contains("<script src") && !page.contains("url("),
            "nothing is fetched from elsewhere"
        );
    }

    #[test]
    fn invisible_characters_show_and_two_flame_graphs_keep_their_own_ids() {
        let page_of = |id: i64, pid: u32, comm: &str, function: &str| {
            let mut k = kill();
            k.victim.pid = pid;
            k.victim.comm = comm.into();
            k.growth = Some(crate::record::growth::GrowthReport {
                pid,
                sites: vec![crate::record::growth::GrowthSite {
                    frames: vec![crate::stacks::symbols::Frame {
                        function: Some(function.into()),
                        ..Default::default()
                    }],
                    bytes: 64 * MIB,
                    samples: 16,
                    ..Default::default()
                }],
                ..Default::default()
            });
            KillPage {
                explanation: crate::explain::explain(Some(id), k, Vec::new(), None),
                gpu: Vec::new(),
            }
        };
        let page = html(
            &[
                page_of(1, 20660, "evil\u{202e}txt.exe", "grow_a"),
                page_of(2, 20661, "zero\u{200b}width", "grow\u{2067}_b"),
            ],
            "node-1",
        );
        for c in ['\u{202e}', '\u{200b}', '\u{2067}'] {
            assert!(!page.contains(c), "{c:?} reaches the page");
        }
        assert!(page.contains("evil\\u{202e}txt.exe (pid 20660)"), "{page}");
        assert!(page.contains("zero\\u{200b}width"));
        // Each flame graph is a document of its own, under its own id.
        for id in ["kill-1-growth-flame", "kill-2-growth-flame"] {
            assert_eq!(
                page.matches(&format!("<iframe class=\"flame\" id=\"{id}\""))
                    .count(),
                1
            );
        }
        assert_eq!(page.matches("<iframe").count(), 2);
        assert!(page.contains("grow\\u{2067}_b"));
        // Outside the frames, no id is used twice.
        let outer = page.replace('\n', " ");
        let mut ids: Vec<&str> = outer
            .match_indices(" id=\"")
            .map(|(i, _)| outer[i + 5..].split('"').next().unwrap())
            .collect();
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "an id is used twice");
    }
}
