//! `tracer top` on a terminal: a full-screen table (ratatui) refreshed each
//! interval, most pressed first, with each row's growth rate and the time
//! left before its limit at that rate ("OOM in ~40 s", highlighted under
//! the warning threshold). Keys: `s` sort, `/` filter by container,
//! Enter a row's detail (its cgroup's usage since top started, as a
//! sparkline), Esc back, `q` quit. `--once` and `--json` stay plain text
//! for scripts.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use ratatui::{
    Frame,
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Paragraph, Row as TableRow, Sparkline, Table, TableState},
};

use crate::{
    record::GpuView,
    recorder::live::top::{NodeRow, NodeTrend, Row, rate_of},
    util::{
        term,
        time::{format_wall, wall_now_ns},
        units::bytes,
    },
};

/// Usage kept per memory cgroup for the rate and the sparkline.
const HISTORY: usize = 300;
/// A row whose limit is nearer than this, at its rate, is highlighted.
const WARN_S: f64 = 60.0;

/// How rows are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sort {
    Pressure,
    TimeLeft,
    HostRss,
    Gpu,
    Name,
}

impl Sort {
    fn next(self) -> Self {
        match self {
            Sort::Pressure => Sort::TimeLeft,
            Sort::TimeLeft => Sort::HostRss,
            Sort::HostRss => Sort::Gpu,
            Sort::Gpu => Sort::Name,
            Sort::Name => Sort::Pressure,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sort::Pressure => "closeness to a limit",
            Sort::TimeLeft => "time left",
            Sort::HostRss => "host RSS",
            Sort::Gpu => "GPU memory",
            Sort::Name => "name",
        }
    }
}

/// A row with what top worked out over time.
struct Shown {
    row: Row,
    /// Growth of its memory cgroup, bytes/s.
    rate: Option<f64>,
    /// Seconds to its limit at that rate.
    left: Option<f64>,
}

struct App {
    rows: Vec<Row>,
    node: Option<NodeRow>,
    trend: NodeTrend,
    view: GpuView,
    note: Option<String>,
    history: HashMap<String, VecDeque<(i64, u64)>>,
    sort: Sort,
    filter: String,
    editing: bool,
    detail: bool,
    table: TableState,
}

impl App {
    fn take(&mut self, rows: Vec<Row>, view: GpuView) {
        let now = wall_now_ns();
        let mut seen = std::collections::HashSet::new();
        for r in &rows {
            if let (Some(m), Some(u)) = (&r.memcg, r.memcg_usage)
                && seen.insert(m.clone())
            {
                let h = self.history.entry(m.clone()).or_default();
                h.push_back((now, u));
                if h.len() > HISTORY {
                    h.pop_front();
                }
            }
        }
        // Cgroups that are gone are forgotten.
        self.history.retain(|m, _| seen.contains(m));
        self.rows = rows;
        self.view = view;
        self.node = self.trend.refresh();
    }

    fn rate(&self, memcg: &str) -> Option<f64> {
        rate_of(self.history.get(memcg)?)
    }

    fn shown(&self) -> Vec<Shown> {
        let f = self.filter.to_lowercase();
        let mut out: Vec<Shown> = self
            .rows
            .iter()
            .filter(|r| {
                f.is_empty()
                    || r.container
                        .as_deref()
                        .unwrap_or(if r.kind == "container" { &r.name } else { "" })
                        .to_lowercase()
                        .contains(&f)
            })
            .map(|r| {
                let rate = r.memcg.as_deref().and_then(|m| self.rate(m));
                let left = match (rate, r.memcg_usage, r.memcg_limit) {
                    (Some(v), Some(u), Some(l)) if v > 0.0 => Some(l.saturating_sub(u) as f64 / v),
                    _ => None,
                };
                Shown {
                    row: r.clone(),
                    rate,
                    left,
                }
            })
            .collect();
        match self.sort {
            Sort::Pressure => {}
            Sort::TimeLeft => out.sort_by(|a, b| {
                a.left
                    .unwrap_or(f64::MAX)
                    .total_cmp(&b.left.unwrap_or(f64::MAX))
            }),
            Sort::HostRss => out.sort_by_key(|s| std::cmp::Reverse(s.row.host_rss)),
            Sort::Gpu => out.sort_by_key(|s| std::cmp::Reverse(s.row.gpu_nvml)),
            Sort::Name => out.sort_by(|a, b| a.row.name.cmp(&b.row.name)),
        }
        out
    }

    /// Handles a key; false to quit.
    fn key(&mut self, code: KeyCode) -> bool {
        if self.editing {
            match code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if !c.is_control() => self.filter.push(c),
                _ => {}
            }
            self.table.select(Some(0));
            return true;
        }
        match code {
            KeyCode::Char('q') => return false,
            KeyCode::Esc if self.detail => self.detail = false,
            KeyCode::Esc => self.filter.clear(),
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('/') => {
                self.editing = true;
                self.filter.clear();
            }
            KeyCode::Enter => self.detail = !self.detail,
            KeyCode::Down | KeyCode::Char('j') => {
                let n = self.shown().len();
                let i = self.table.selected().unwrap_or(0);
                self.table.select(Some((i + 1).min(n.saturating_sub(1))));
            }
            KeyCode::Up | KeyCode::Char('k') => {
                let i = self.table.selected().unwrap_or(0);
                self.table.select(Some(i.saturating_sub(1)));
            }
            _ => {}
        }
        true
    }

    fn draw(&mut self, f: &mut Frame) {
        let shown = self.shown();
        let gpu_lines = self.view.devices.len() as u16
            + u16::from(self.note.is_some())
            + u16::from(self.node.is_some());
        let detail_h = if self.detail { 9 } else { 0 };
        let [head, gpus, table, detail] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Length(gpu_lines),
            Constraint::Min(3),
            Constraint::Length(detail_h),
        ])
        .areas(f.area());
        let filter = if self.editing {
            format!("  filter: {}_", self.filter)
        } else if self.filter.is_empty() {
            String::new()
        } else {
            format!("  filter: {}", self.filter)
        };
        f.render_widget(
            Paragraph::new(vec![
                Line::from(format!(
                    "tracer top  {}  sort: {}{filter}",
                    format_wall(wall_now_ns()),
                    self.sort.name()
                )),
                Line::from(Span::styled(
                    "s sort  / filter by container  Enter detail  Esc back  q quit",
                    Style::default().fg(Color::DarkGray),
                )),
            ]),
            head,
        );
        let mut g: Vec<Line> = Vec::new();
        if let Some(n) = &self.node {
            let style = if n.oom_in_s.is_some_and(|s| s < WARN_S) {
                Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
            } else {
                Style::default()
            };
            g.push(Line::from(Span::styled(NodeTrend::line(n), style)));
        }
        g.extend(self.view.devices.iter().map(|d| {
            Line::from(format!(
                "gpu {}: {} of {} used, {} processes",
                d.device,
                bytes(d.used),
                bytes(d.total),
                d.processes.len()
            ))
        }));
        if let Some(n) = &self.note {
            g.push(Line::from(term::escape(n).into_owned()));
        }
        f.render_widget(Paragraph::new(g), gpus);
        let opt = |v: Option<u64>| v.map(bytes).unwrap_or_else(|| "-".into());
        let rows: Vec<TableRow> = shown
            .iter()
            .map(|s| {
                let r = &s.row;
                let warn = s.left.is_some_and(|l| l < WARN_S);
                // A slow leak the recorder found, where no OOM is near.
                let left = match (s.left, &r.leak) {
                    (Some(l), _) => format!("OOM in ~{l:.0} s"),
                    (None, Some(l)) => match l.limit_in_s {
                        Some(s) => format!("leak ~{}", crate::util::time::human_secs(s)),
                        None => "leaking".into(),
                    },
                    (None, None) => "-".into(),
                };
                let rate = match s.rate {
                    Some(v) if v.abs() >= 1024.0 => {
                        format!(
                            "{}{}/s",
                            if v < 0.0 { "-" } else { "+" },
                            bytes(v.abs() as u64)
                        )
                    }
                    Some(_) => "0".into(),
                    None => "-".into(),
                };
                let style = if warn {
                    Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
                } else {
                    Style::default()
                };
                TableRow::new(vec![
                    Cell::from(r.kind),
                    Cell::from(r.pid.map(|p| p.to_string()).unwrap_or_default()),
                    Cell::from(term::escape(&r.name).into_owned()),
                    Cell::from(bytes(r.host_rss)),
                    Cell::from(opt(r.memcg_usage)),
                    Cell::from(opt(r.memcg_limit)),
                    Cell::from(rate),
                    Cell::from(left),
                    Cell::from(bytes(r.gpu_nvml)),
                    Cell::from(format!("{:.0}%", r.pressure_pct)),
                    Cell::from(
                        r.psi_some_avg10
                            .map(|p| format!("{p:.1}%"))
                            .unwrap_or_else(|| "-".into()),
                    ),
                    Cell::from(
                        term::escape(r.container.as_deref().unwrap_or(if r.kind == "container" {
                            &r.name
                        } else {
                            ""
                        }))
                        .into_owned(),
                    ),
                ])
                .style(style)
            })
            .collect();
        let header = TableRow::new(vec![
            "TYPE",
            "PID",
            "NAME",
            "HOST RSS",
            "MEMCG",
            "LIMIT",
            "GROWTH",
            "LIMIT IN",
            "GPU",
            "USE",
            "PSI",
            "CONTAINER",
        ])
        .style(Style::default().add_modifier(Modifier::UNDERLINED));
        let widths = [
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(16),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(17),
            Constraint::Length(9),
            Constraint::Length(5),
            Constraint::Length(6),
            Constraint::Min(10),
        ];
        if self.table.selected().is_none() {
            self.table.select(Some(0));
        }
        f.render_stateful_widget(
            Table::new(rows, widths)
                .header(header)
                .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED)),
            table,
            &mut self.table,
        );
        if self.detail {
            let sel = self
                .table
                .selected()
                .and_then(|i| shown.get(i.min(shown.len().saturating_sub(1))));
            let (title, data, text) = match sel.and_then(|s| Some((s, s.row.memcg.as_deref()?))) {
                Some((s, m)) => {
                    let h = self.history.get(m);
                    let data: Vec<u64> = h
                        .map(|h| h.iter().map(|(_, u)| u / 1024).collect())
                        .unwrap_or_default();
                    let span = h
                        .and_then(|h| Some((h.back()?.0 - h.front()?.0) / 1_000_000_000))
                        .unwrap_or(0);
                    (
                        format!(" {} ", term::escape(m)),
                        data,
                        format!(
                            "usage over the last {span} s: {} of limit {}, {}",
                            opt(s.row.memcg_usage),
                            opt(s.row.memcg_limit),
                            match (s.rate, s.left) {
                                (Some(r), Some(l)) =>
                                    format!("growing {}/s: OOM in ~{l:.0} s", bytes(r as u64)),
                                (Some(r), None) if r < 0.0 =>
                                    format!("shrinking {}/s", bytes(-r as u64)),
                                _ => "not growing".into(),
                            }
                        ),
                    )
                }
                None => (
                    " detail ".into(),
                    Vec::new(),
                    "no memory cgroup for this row".into(),
                ),
            };
            let block = Block::default().borders(Borders::ALL).title(title);
            let inner = block.inner(detail);
            f.render_widget(block, detail);
            let [line, spark] =
                Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(inner);
            f.render_widget(Paragraph::new(text), line);
            // Scaled to the limit, so that the top of the chart is the kill.
            let max = sel
                .and_then(|s| s.row.memcg_limit)
                .map(|l| l / 1024)
                .filter(|l| *l > 0 && *l < u64::MAX / 2048)
                .unwrap_or_else(|| data.iter().copied().max().unwrap_or(1));
            f.render_widget(
                Sparkline::default()
                    .data(&data)
                    .max(max)
                    .style(Style::default().fg(Color::Cyan)),
                spark,
            );
        }
    }
}

/// Runs the full-screen `top` until `q`.
pub fn run(
    interval: Duration,
    mut refresh: impl FnMut() -> (Vec<Row>, GpuView),
    note: Option<String>,
) -> anyhow::Result<()> {
    let mut app = App {
        rows: Vec::new(),
        node: None,
        trend: NodeTrend::default(),
        view: GpuView::default(),
        note,
        history: HashMap::new(),
        sort: Sort::Pressure,
        filter: String::new(),
        editing: false,
        detail: false,
        table: TableState::default(),
    };
    let mut terminal = ratatui::try_init()?;
    let result = (|| -> anyhow::Result<()> {
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                let (rows, view) = refresh();
                app.take(rows, view);
                next = Instant::now() + interval;
            }
            terminal.draw(|f| app.draw(f))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait.min(Duration::from_millis(250)))?
                && let Event::Key(k) = event::read()?
                && k.kind == KeyEventKind::Press
            {
                // Raw mode: Ctrl-C is a key, and it quits.
                let ctrl = k
                    .modifiers
                    .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT);
                if ctrl && k.code == KeyCode::Char('c') {
                    return Ok(());
                }
                if !ctrl && !app.key(k.code) {
                    return Ok(());
                }
            }
        }
    })();
    ratatui::restore();
    result
}
