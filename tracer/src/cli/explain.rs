//! `tracer explain`: why did it die?

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;

use super::{
    Format, StoreArg,
    kills::{KillFilter, KillerArg, Subject},
};
use crate::{
    collect::kmsg,
    correlate::kill_from_report,
    explain::{Coverage, Explanation, coverage, explain, render_text},
    say,
    store::Store,
    util::time::{Clock, wall_now_ns},
    util::{out, term},
};

/// Options of `tracer explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    filter: KillFilter,
    /// Every kill in the window, not only the latest; a crash loop's
    /// kills are shown once, as its latest (text).
    #[arg(long)]
    pub all: bool,
    /// Frames shown of each stack in text (growth sites, the tipping
    /// allocation, device memory by stack); JSON has them all.
    #[arg(long, value_name = "N", default_value_t = crate::explain::DEFAULT_DEPTH, value_parser = depth)]
    pub depth: usize,
    /// With --all: every kill of a crash loop, not only its latest.
    #[arg(long, requires = "all")]
    pub each: bool,
    /// Only kills this recent (e.g. 10m, 6h, 2d).
    #[arg(long, value_parser = super::parse_duration)]
    pub since: Option<Duration>,
    /// Only kills of this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Read the kernel log (/dev/kmsg) instead of the store: no recording needed.
    #[arg(long)]
    pub kmsg: bool,
    /// Explain CUDA out-of-memory errors (recorded with `record --cuda`) instead of kills.
    #[arg(long, conflicts_with = "kmsg")]
    pub gpu_oom: bool,
    /// Read a saved kernel log instead of the store (`-`: standard input):
    /// dmesg, dmesg -T, syslog/kern.log, journalctl -k, raw /dev/kmsg.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["kmsg", "gpu_oom"])]
    pub log: Option<std::path::PathBuf>,
    /// Read the kernel's messages, and systemd-oomd's, earlyoom's,
    /// kubelet's and systemd's, from the systemd journal (every boot it
    /// holds; with --since, from then on) with journalctl, instead of the store.
    #[arg(long, conflicts_with_all = ["kmsg", "gpu_oom", "log"])]
    pub journal: bool,
    /// With --journal: the journal files of this directory (a saved
    /// /var/log/journal, another node's) instead of this machine's.
    #[arg(long, value_name = "DIR", requires = "journal")]
    pub journal_dir: Option<std::path::PathBuf>,
    /// List the GPU faults of the kernel log (NVIDIA Xid and NVSwitch SXid
    /// lines, each with its meaning from NVIDIA's Xid catalogue) instead of
    /// kills; with --log, --journal or --kmsg.
    #[arg(long, conflicts_with = "gpu_oom")]
    pub xid: bool,
    /// With --gpu-oom: write the latest one's device memory as a PyTorch
    /// memory snapshot (the pickle `torch.cuda.memory._snapshot()` writes):
    /// the allocations it recorded, with their stacks.
    #[arg(long, value_name = "PATH", requires = "gpu_oom")]
    pub snapshot: Option<std::path::PathBuf>,
    /// With --gpu-oom: write the latest one's device memory by stack as a
    /// profile in pprof's format (gzipped protobuf).
    #[arg(long, value_name = "PATH", requires = "gpu_oom")]
    pub pprof: Option<std::path::PathBuf>,
}

/// `--depth`: 1 to 256 frames.
fn depth(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=256) => Ok(n),
        _ => Err(format!("{s:?}: give a number of frames from 1 to 256")),
    }
}

/// What a kernel log gave: its kills, latest first, and its Xid lines.
#[derive(Default)]
struct FromLog {
    kills: Vec<crate::record::KillRecord>,
    xids: Vec<crate::explain::xid::Explained>,
    /// Units systemd says lost a process to the kernel's OOM killer.
    units: Vec<String>,
}

/// The kills of a saved kernel log, latest first.
fn kills_from_log(path: &std::path::Path) -> anyhow::Result<FromLog> {
    if path.as_os_str() == "-" {
        return kills_from_reader(std::io::stdin().lock(), "--log standard input");
    }
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    kills_from_reader(
        std::io::BufReader::new(f),
        &format!("--log {}", path.display()),
    )
    .with_context(|| format!("reading {}", path.display()))
}

/// The kills in the kernel's messages and the userspace OOM killers'
/// entries of the systemd journal (this machine's, or the journal files
/// of `dir`), latest first.
fn kills_from_journal(
    dir: Option<&std::path::Path>,
    since: Option<Duration>,
) -> anyhow::Result<FromLog> {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new("journalctl");
    // The kernel's messages, and the userspace OOM killers' entries (the
    // second group: one field's matches are either).
    cmd.args([
        "-o",
        "short-iso-precise",
        "--no-pager",
        "_TRANSPORT=kernel",
        "+",
    ]);
    cmd.args(
        crate::collect::killers::KILLERS
            .iter()
            .map(|k| format!("SYSLOG_IDENTIFIER={k}")),
    );
    if let Some(d) = dir {
        if !d.is_dir() {
            anyhow::bail!("--journal-dir {}: not a directory", d.display());
        }
        cmd.arg("-D").arg(d);
    }
    if let Some(s) = since {
        let from = (wall_now_ns() - s.as_nanos() as i64) / 1_000_000_000;
        cmd.arg(format!("--since=@{from}"));
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "--journal needs systemd's journalctl, which is not installed here (save the log elsewhere and pass it with --log)"
            ),
            _ => anyhow::anyhow!("running journalctl: {e}"),
        })?;
    let stdout = child.stdout.take().expect("piped");
    // Its complaints are read beside its output: a full stderr pipe must
    // not stall it.
    let mut stderr = child.stderr.take().expect("piped");
    let complaints = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let read = kills_in(std::io::BufReader::new(stdout));
    let out = child.wait_with_output()?;
    let said = String::from_utf8_lossy(&complaints.join().unwrap_or_default())
        .trim()
        .to_string();
    if !out.status.success() {
        anyhow::bail!(
            "journalctl failed ({}): {}",
            out.status,
            term::escape(&said)
        );
    }
    let (kills, shape) = read?;
    // No kernel message: none in the window (no kills), or no journal to
    // read at all (journalctl says why).
    if shape.recognized == 0 && !said.is_empty() {
        anyhow::bail!(
            "the journal holds no kernel message (journalctl: {}): nothing to explain",
            term::escape(&said)
        );
    }
    Ok(kills)
}

/// The kills of a kernel log read from `input` (`name` says what it is
/// in errors), latest first.
fn kills_from_reader(input: impl std::io::BufRead, name: &str) -> anyhow::Result<FromLog> {
    let (kills, shape) = kills_in(input)?;
    if let Some(why) = shape.not_a_log() {
        anyhow::bail!("{name} {why}: nothing to explain");
    }
    Ok(kills)
}

/// The Xid lines of `xids` that name the victim of `r` (`pid=`), on its
/// host, in the ten minutes before its kill.
fn xids_named<'a>(
    xids: &'a [crate::explain::xid::Explained],
    r: &crate::collect::logfile::LogReport,
) -> Vec<&'a crate::explain::xid::Explained> {
    const BEFORE_US: u64 = 600_000_000;
    xids.iter()
        .filter(|x| {
            x.host == r.host
                && x.xid.pid == Some(r.report.killed.pid)
                && x.xid.ts_us <= r.report.ts_us
                && r.report.ts_us - x.xid.ts_us <= BEFORE_US
        })
        .collect()
}

/// The kills of a kernel log, latest first, and what the log held.
fn kills_in(
    input: impl std::io::BufRead,
) -> anyhow::Result<(FromLog, crate::collect::logfile::LogShape)> {
    use crate::{collect::logfile, record::Gap};
    // Syslog stamps have no year: this one.
    let year = 1970 + wall_now_ns() / 1_000_000_000 / 31_556_952;
    let logfile::SavedLog {
        reports,
        xids,
        user_kills,
        unit_notices,
        shape,
    } = logfile::read_log(input, year)?;
    let xids: Vec<crate::explain::xid::Explained> = xids
        .into_iter()
        .map(|x| crate::explain::xid::Explained {
            wall_ns: x
                .mono_to_wall_ns
                .filter(|_| !x.untimed)
                .map(|off| x.xid.ts_us as i64 * 1000 + off),
            untimed: x.untimed,
            host: x.host,
            meaning: crate::explain::xid::meaning(&x.xid),
            xid: x.xid,
        })
        .collect();
    let mut kills: Vec<_> = reports
        .iter()
        .map(|r| {
            let faults: Vec<&crate::explain::xid::Explained> = xids_named(&xids, r);
            let clock = Clock::fixed(0, r.mono_to_wall_ns.unwrap_or(0));
            let mut k = kill_from_report(&r.report, &clock, None);
            if r.report.chosen_only {
                k.gaps.push(Gap::Note(format!(
                    "the log has the kernel's choice of this victim (Kill process {} ... or sacrifice child) but not its Killed process line: the kernel may have killed one of its children instead",
                    r.report.killed.pid
                )));
            }
            if r.time_unreadable {
                k.time_unreadable = true;
                k.gaps.push(Gap::Note(
                    "the log's time stamp of this kill is out of range and cannot be read: its time is not known".into(),
                ));
            } else if r.untimed {
                k.time_unreadable = true;
                k.gaps.push(Gap::Note(
                    "the log's lines of this kill have no time stamp: its time is not known".into(),
                ));
            } else if r.mono_to_wall_ns.is_none() {
                k.gaps.push(Gap::Note(format!(
                    "the log gives only the time since boot ({:.6} s): the wall time of this kill is not known",
                    r.report.ts_us as f64 / 1e6
                )));
            }
            if let Some(h) = &r.host {
                k.gaps.push(Gap::Note(format!("logged by host {h}")));
            }
            if !r.untimed && !r.time_unreadable {
                k.gaps.extend(guessed_time(r.guessed));
            }
            // systemd's notices of the same moment name the unit.
            let mut units: Vec<&str> = unit_notices
                .iter()
                .filter(|(h, ts, _)| *h == r.host && ts.abs_diff(r.report.ts_us) <= 2_000_000)
                .map(|(_, _, u)| u.as_str())
                .collect();
            units.dedup();
            if !units.is_empty() {
                k.gaps.push(Gap::Note(format!(
                    "systemd says these units lost a process to the OOM killer then: {}",
                    units.join(", ")
                )));
            }
            for f in faults {
                let what = f
                    .meaning
                    .map(|m| m.what)
                    .unwrap_or("not in tracer's table of Xids");
                k.gaps.push(Gap::Note(format!(
                    "the NVIDIA driver logged Xid {} for this process on GPU {} {:.1} s before the kill: {what}",
                    f.xid.code,
                    f.xid.pci,
                    r.report.ts_us.saturating_sub(f.xid.ts_us) as f64 / 1e6
                )));
            }
            k
        })
        .collect();
    kills.extend(user_kills.iter().map(user_kill_record));
    kills.sort_by_key(|k| k.ts_ns);
    kills.reverse();
    let mut units: Vec<String> = unit_notices.into_iter().map(|(_, _, u)| u).collect();
    units.sort();
    units.dedup();
    Ok((FromLog { kills, xids, units }, shape))
}

/// What a saved log's time stamp left to a guess, said as such: a
/// syslog stamp has no year (the last twelve months are taken), syslog and
/// `dmesg -T` stamps have no zone (taken as UTC).
fn guessed_time((year, zone): (Option<i64>, bool)) -> Option<crate::record::Gap> {
    let what = match (year, zone) {
        (Some(y), true) => format!(
            "no year (taken as {y}, the last twelve months) and no time zone (taken as UTC)"
        ),
        (Some(y), false) => format!("no year (taken as {y}, the last twelve months)"),
        (None, true) => "no time zone (taken as UTC)".to_string(),
        (None, false) => return None,
    };
    Some(crate::record::Gap::Note(format!(
        "the log's time stamp has {what}: the time shown is a guess"
    )))
}

/// The kill record of a userspace OOM killer's kill found in a saved log.
fn user_kill_record(u: &crate::collect::logfile::LogUserKill) -> crate::record::KillRecord {
    use crate::record::{Gap, KillRecord, Killer, KillerKind, ProcRef, Victim};
    let k = &u.kill;
    let clock = Clock::fixed(0, u.mono_to_wall_ns.unwrap_or(0));
    // systemd-oomd kills a cgroup: without a process named, the cgroup's
    // last part names the victim.
    let comm = k
        .comm
        .clone()
        .or_else(|| {
            let cg = k.cgroup.as_deref()?;
            Some(cg.rsplit('/').next().unwrap_or(cg).to_string())
        })
        .or_else(|| k.container.clone())
        .or_else(|| k.pod.clone())
        .unwrap_or_default();
    let mut gaps = vec![Gap::Note(format!(
        "found in {}'s log lines only: no kernel report, no lead-up samples",
        k.killer
    ))];
    match (&k.pod, &k.container) {
        (Some(p), Some(c)) => gaps.push(Gap::Note(format!(
            "kubelet stopped container {c} of pod {p}"
        ))),
        (Some(p), None) => gaps.push(Gap::Note(format!(
            "kubelet evicted pod {p}, every container of it"
        ))),
        (None, Some(c)) => gaps.push(Gap::Note(format!(
            "kubelet stopped container {c}; its pod is not in the log"
        ))),
        (None, None) if k.pid.is_none() => gaps.push(Gap::Note(format!(
            "{} named the cgroup it killed, not its processes",
            k.killer
        ))),
        (None, None) => {}
    }
    if let Some(kb) = k.rss_kb {
        gaps.push(Gap::Note(format!(
            "{} read the victim's RSS as {} MiB",
            k.killer,
            kb / 1024
        )));
    }
    if u.untimed {
        gaps.push(Gap::Note(
            "the log's line of this kill has no readable time stamp: its time is not known".into(),
        ));
    } else {
        gaps.extend(guessed_time(u.guessed));
    }
    KillRecord {
        ts_ns: clock.kmsg_to_wall(u.ts_us),
        source: crate::record::Seen::LOG,
        time_unreadable: u.untimed,
        killer: Killer {
            kind: KillerKind::Userspace,
            sender: Some(ProcRef {
                pid: k.killer_pid.unwrap_or(0),
                comm: k.killer.to_string(),
                ..Default::default()
            }),
            signal: k.signal.map(str::to_string),
            reason: Some(k.reason.clone()),
            ..Default::default()
        },
        victim: Victim {
            pid: k.pid.unwrap_or(0),
            comm,
            uid: k.uid,
            memcg: k.cgroup.clone(),
            ..Default::default()
        },
        gaps,
        ..Default::default()
    }
}

/// Kills left out by a filter or a limit, counted by killer.
pub(super) type Others = std::collections::BTreeMap<&'static str, usize>;

/// The explanations of the kills `store` holds since `since_ns` (of
/// `pid`, that `filter` passes, at most `limit`, latest first), each
/// record passed through `prepare` first, and the other kills of the
/// window; a damaged record is said and left out.
pub(super) fn stored(
    store: &Store,
    since_ns: i64,
    pid: Option<u32>,
    filter: &KillFilter,
    limit: usize,
    prepare: impl Fn(crate::record::KillRecord) -> crate::record::KillRecord,
) -> anyhow::Result<(Vec<Explanation>, Others)> {
    let sessions = store.sessions()?;
    // Read one at a time: only the kills shown are kept.
    let mut others = Others::new();
    let mut shown = Vec::new();
    store
        .each_kill(since_ns, pid, |id, rec| {
            match rec {
                Ok(k) if shown.len() < limit && filter.matches(&Subject::of_kill(&k)) => {
                    shown.push((id, k))
                }
                Ok(k) => *others.entry(k.killer.name()).or_default() += 1,
                Err(why) => super::kills::say_damaged(store, id, &why),
            }
            true
        })
        .context("reading kills")?;
    let kills = shown;
    let mut out = Vec::with_capacity(kills.len());
    for (id, k) in kills {
        // Losses in the minute before the kill (each drop row spans the
        // interval its losses came in): what came after cannot have
        // changed what is known of it.
        let drops = store.drops_between(k.ts_ns - 60_000_000_000, k.ts_ns)?;
        // A kill a session recorded itself had that recorder running;
        // for one found in the kernel log later, the sessions tell.
        let cover = match k.session_id {
            Some(_) => Coverage::Running,
            None => coverage(&sessions, k.ts_ns),
        };
        let near = match k.oom_group {
            Some(_) => store.kills_between(k.ts_ns - 5_000_000_000, k.ts_ns + 5_000_000_000)?,
            None => Vec::new(),
        };
        let running = match cover {
            Coverage::Running => Some(true),
            Coverage::NotRunning => Some(false),
            Coverage::Unknown { .. } => None,
        };
        let mut e = explain(Some(id), prepare(k), drops, running);
        if let Coverage::Unknown { since_heartbeat_ns } = cover {
            e.last_heartbeat_s = Some(since_heartbeat_ns as f64 / 1e9);
        }
        e.join_incident(near.iter().map(|(id, k)| (Some(*id), k)));
        out.push(e);
    }
    Ok((out, others))
}

/// The filter a command that shows one kill applies: without --pid or
/// --all, an OOM killer's kills unless another killer is asked for.
pub(super) fn effective(filter: &KillFilter, pid: Option<u32>, all: bool) -> KillFilter {
    match (pid, all) {
        (None, false) => filter.or_killer(KillerArg::Oom),
        _ => filter.clone(),
    }
}

/// Says how many kills of `source` were not shown, and how to see them.
pub(super) fn say_others(others: &Others, source: &str, window: &str, from_store: bool) {
    let n: usize = others.values().sum();
    if n == 0 {
        return;
    }
    let by: Vec<String> = others
        .iter()
        .map(|(k, n)| {
            format!(
                "{n} {}",
                if *k == "process" {
                    "SIGKILL from a process"
                } else {
                    k
                }
            )
        })
        .collect();
    let how = if from_store {
        "`tracer kills` lists them; `tracer explain --killer any` shows the latest of any kind"
    } else {
        "`--all --killer any` shows them"
    };
    say!(
        "tracer: {n} other kill(s) in {}{window} not shown ({}): {how}",
        term::escape(source),
        by.join(", ")
    );
}

/// Runs `explain`.
pub fn run(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let (since_ns, limit) = super::window(args.since, args.all);
    args.filter.check()?;
    crate::explain::set_depth(args.depth);
    let filter = effective(&args.filter, args.pid, args.all);
    if filter.killer == Some(KillerArg::Gpu) && (args.log.is_some() || args.journal || args.kmsg) {
        anyhow::bail!(
            "--killer gpu: CUDA out-of-memory errors are recorded by `tracer record --cuda`, they are not in a kernel log"
        );
    }
    if args.gpu_oom || filter.killer == Some(KillerArg::Gpu) {
        return gpu_ooms(&args, &filter, since_ns, limit);
    }
    if args.xid {
        return xids(&args, since_ns, limit);
    }
    // A kernel log's kills, each with the rest of its incident.
    let from_log = |all: Vec<crate::record::KillRecord>| -> (Vec<Explanation>, Others) {
        let incidents = crate::explain::Incidents::new(&all);
        let mut others = Others::new();
        let mut found = Vec::new();
        // A kill whose time cannot be read is in every window.
        for k in all.iter().filter(|k| {
            (k.ts_ns >= since_ns || k.time_unreadable) && args.pid.is_none_or(|p| p == k.victim.pid)
        }) {
            if found.len() >= limit || !filter.matches(&Subject::of_kill(k)) {
                *others.entry(k.killer.name()).or_default() += 1;
                continue;
            }
            let mut e = explain(None, printable_if(&args, k.clone()), Vec::new(), None);
            incidents.join(&mut e);
            found.push(e);
        }
        (found, others)
    };
    let (mut faults, mut units) = (0, Vec::new());
    let mut from_log = |log: FromLog| {
        faults = log.xids.len();
        units = log.units;
        from_log(log.kills)
    };
    let (found, others): (Vec<Explanation>, Others) = if let Some(path) = &args.log {
        from_log(kills_from_log(path)?)
    } else if args.journal {
        from_log(kills_from_journal(args.journal_dir.as_deref(), args.since)?)
    } else if args.kmsg {
        let clock = Clock::now();
        let mut reports = kmsg::read_all_reports()?;
        reports.reverse();
        from_log(FromLog {
            kills: reports
                .iter()
                .map(|r| kill_from_report(r, &clock, None))
                .collect(),
            xids: Vec::new(),
            units: Vec::new(),
        })
    } else {
        let store = Store::open_ro(&args.store.path)?;
        say_if_spilled(&args.store.path);
        stored(&store, since_ns, args.pid, &filter, limit, |k| {
            printable_if(&args, k)
        })?
    };
    let source = source_name(&args);
    let kind = match filter.killer {
        Some(KillerArg::Oom) if args.filter.killer.is_none() => "OOM kill",
        _ => "kill",
    };
    let what = match args.pid {
        Some(p) => format!("no {kind} of pid {p}"),
        None => format!("no {kind}s"),
    };
    let what = format!("{what}{}", args.filter.said());
    let window = args
        .since
        .map(|d| format!(" in the last {}", humantime::format_duration(d)))
        .unwrap_or_default();
    let mut faults = match faults {
        0 => String::new(),
        n => format!(
            "; it holds {n} GPU fault line(s) (NVIDIA Xid): tracer explain --xid lists them"
        ),
    };
    if !units.is_empty() {
        faults.push_str(&format!(
            "; systemd says these units lost a process to the kernel's OOM killer, whose own lines are not in it: {}",
            units.join(", ")
        ));
    }
    let found = fold_loops(&args, found);
    let code = output(
        &args,
        &found,
        &format!("{what}{window} in {source}{faults}"),
        |s: &Shown| match &s.repeats {
            Some(r) => format!("{}{r}\n", render_text(&s.e)),
            None => render_text(&s.e),
        },
    )?;
    say_others(
        &others,
        &source,
        &window,
        !(args.log.is_some() || args.journal || args.kmsg),
    );
    Ok(code)
}

/// A kill as `explain` shows it, with the rest of its crash loop.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct Shown {
    e: Explanation,
    /// The line that says how many times it was killed, in text only.
    #[serde(skip)]
    repeats: Option<String>,
}

/// With --all, as text: a crash loop's kills as its latest one, with a
/// line saying how many there were (--each, or JSON: every kill).
fn fold_loops(args: &ExplainArgs, found: Vec<Explanation>) -> Vec<Shown> {
    if !args.all || args.each || args.format == Format::Json {
        return found
            .into_iter()
            .map(|e| Shown { e, repeats: None })
            .collect();
    }
    use crate::explain::loops;
    let groups = loops::loops(
        &found,
        |e| loops::key(&e.kill, e.verdict.cause),
        |e| e.kill.ts_ns,
    );
    let mut slots: Vec<Option<Explanation>> = found.into_iter().map(Some).collect();
    groups
        .into_iter()
        .map(|g| {
            let latest = slots[g[0]].take().expect("each kill in one group");
            let repeats = (g.len() > 1).then(|| {
                let first = slots[*g.last().expect("never empty")]
                    .as_ref()
                    .map_or(latest.kill.ts_ns, |e| e.kill.ts_ns);
                let ids: Vec<String> = g[1..]
                    .iter()
                    .filter_map(|&i| slots[i].as_ref()?.id.map(|id| id.to_string()))
                    .collect();
                format!(
                    "  crash loop: {} up to this one, the same verdict each time{} (--each shows every one)",
                    loops::span(g.len(), first, latest.kill.ts_ns),
                    match ids.len() {
                        0 => String::new(),
                        n if n <= 8 => format!("; the others are kills {}", ids.join(", ")),
                        n => format!("; the others are kills {} and {} more", ids[..8].join(", "), n - 8),
                    }
                )
            });
            Shown { e: latest, repeats }
        })
        .collect()
}

/// What `explain` read, as its messages name it.
fn source_name(args: &ExplainArgs) -> String {
    if let Some(path) = &args.log {
        path.display().to_string()
    } else if args.journal {
        match &args.journal_dir {
            Some(d) => format!("the journal in {}", d.display()),
            None => "the journal".to_string(),
        }
    } else if args.kmsg {
        "the kernel log".to_string()
    } else {
        args.store.path.display().to_string()
    }
}

/// `explain --xid`: the GPU faults of a kernel log, latest first, each with
/// its meaning.
fn xids(args: &ExplainArgs, since_ns: i64, limit: usize) -> anyhow::Result<ExitCode> {
    use crate::explain::xid::{Explained, meaning, render};
    let mut found: Vec<Explained> = if let Some(path) = &args.log {
        kills_from_log(path)?.xids
    } else if args.journal {
        kills_from_journal(args.journal_dir.as_deref(), args.since)?.xids
    } else if args.kmsg {
        let clock = Clock::now();
        let (_, xids) = kmsg::read_all()?;
        xids.into_iter()
            .map(|x| Explained {
                wall_ns: Some(clock.kmsg_to_wall(x.ts_us)),
                untimed: false,
                host: None,
                meaning: meaning(&x),
                xid: x,
            })
            .collect()
    } else {
        anyhow::bail!(
            "--xid reads a kernel log: add --log FILE, --journal or --kmsg (a recorder counts Xids as tracer_gpu_xid_errors_total and stores each as a gpu_xid event: tracer events)"
        );
    };
    found.reverse();
    let found: Vec<Explained> = found
        .into_iter()
        .filter(|x| {
            x.wall_ns.is_none_or(|w| w >= since_ns) && args.pid.is_none_or(|p| x.xid.pid == Some(p))
        })
        .take(limit)
        .collect();
    // Text is escaped by `render`; JSON keeps the exact bytes.
    output(
        args,
        &found,
        &format!("no NVIDIA Xid or SXid lines in {}", source_name(args)),
        render,
    )
}

/// Prints what was found (one or, with `--all`, every match) as text or
/// JSON; with nothing found, says `none` and, unless `--all`, exits 1.
fn output<T: serde::Serialize>(
    args: &ExplainArgs,
    found: &[T],
    none: &str,
    render: impl Fn(&T) -> String,
) -> anyhow::Result<ExitCode> {
    let mut text = String::new();
    if found.is_empty() {
        if args.all {
            match args.format {
                Format::Json => text.push_str("[]\n"),
                Format::Text => text = format!("{}\n", term::escape(none)),
            }
            out::stdout(&text)?;
            return Ok(ExitCode::SUCCESS);
        }
        say!("tracer: {}", term::escape(none));
        return Ok(ExitCode::from(1));
    }
    match (args.format, args.all) {
        (Format::Json, true) => text = serde_json::to_string_pretty(found)? + "\n",
        (Format::Json, false) => text = serde_json::to_string_pretty(&found[0])? + "\n",
        (Format::Text, _) => {
            for (i, e) in found.iter().enumerate() {
                if i > 0 {
                    text.push('\n');
                }
                text.push_str(&render(e));
            }
        }
    }
    out::stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// For text output, every string of a record escaped for the terminal
/// (process names, command lines and cgroup paths are anyone's choice);
/// JSON keeps the exact bytes.
fn printable_if<T: serde::Serialize + serde::de::DeserializeOwned>(
    args: &ExplainArgs,
    rec: T,
) -> T {
    match args.format {
        Format::Text => term::printable(rec),
        Format::Json => rec,
    }
}

/// Says so when a recorder keeps kills of this store in its spill store
/// (the store's file system is full; see `record --spill-dir`).
fn say_if_spilled(store: &std::path::Path) {
    use crate::store::spill;
    let path = spill::path_for(store, std::path::Path::new(spill::DEFAULT_DIR));
    if std::fs::symlink_metadata(&path).is_err() {
        return;
    }
    let held = Store::open_ro(&path)
        .and_then(|s| s.kills(i64::MIN, None, usize::MAX))
        .map(|k| k.len());
    if let Ok(n) = held
        && n > 0
    {
        crate::say!(
            "tracer: {n} kill(s) are held in the spill store {} until this store's file system has room; `tracer explain --store {}` shows them",
            path.display(),
            path.display()
        );
    }
}

fn gpu_ooms(
    args: &ExplainArgs,
    filter: &KillFilter,
    since_ns: i64,
    limit: usize,
) -> anyhow::Result<ExitCode> {
    use crate::explain::gpu::{GpuOomExplanation, render, verdict};
    let store = Store::open_ro(&args.store.path)?;
    let filter = KillFilter {
        killer: Some(KillerArg::Gpu),
        ..filter.clone()
    };
    let found: Vec<GpuOomExplanation> = store
        .gpu_ooms(since_ns, args.pid, i64::MAX as usize)?
        .into_iter()
        .filter(|(_, r)| filter.matches(&Subject::of_gpu_oom(r)))
        .take(limit)
        .map(|(id, r)| {
            let r = printable_if(args, r);
            GpuOomExplanation {
                id,
                verdict: verdict(&r),
                gpu_oom: r,
            }
        })
        .collect();
    let what = match args.pid {
        Some(p) => format!("no GPU out-of-memory error of pid {p}"),
        None => "no GPU out-of-memory errors".to_string(),
    };
    let none = format!(
        "{what} in {} (they are recorded by `tracer record --cuda`)",
        args.store.path.display()
    );
    if args.snapshot.is_some() || args.pprof.is_some() {
        let Some(latest) = found.first() else {
            anyhow::bail!("{none}: nothing to write");
        };
        gpu_oom_exports(args, latest)?;
    }
    output(args, &found, &none, render)
}

/// Writes `--snapshot` and `--pprof` of a recorded GPU OOM.
fn gpu_oom_exports(
    args: &ExplainArgs,
    e: &crate::explain::gpu::GpuOomExplanation,
) -> anyhow::Result<()> {
    use crate::export::torch_snapshot::{Input, pickle};
    let r = &e.gpu_oom;
    let what = format!(
        "pid {} ({}) at its GPU out-of-memory error #{}",
        r.process.pid,
        term::escape(&r.process.comm),
        e.id
    );
    if let Some(path) = &args.snapshot {
        let input = Input::gpu_oom(r);
        crate::util::fsafe::write_private(path, &pickle(&input)?)?;
        let device_held: u64 = r
            .held
            .by_kind
            .iter()
            .filter(|(k, _)| k.in_device_space())
            .map(|(_, t)| t.outstanding)
            .sum();
        say!(
            "tracer: PyTorch memory snapshot of {what} written to {}: {} segments, {} of the {} of device memory it held \
             (the rest were allocations under {} not sampled, or past the record's lists)",
            path.display(),
            input.segments.len(),
            crate::util::units::bytes(input.held_bytes()),
            crate::util::units::bytes(device_held),
            crate::util::units::bytes(tracer_common::cuda::STACK_MIN_BYTES)
        );
    }
    if let Some(path) = &args.pprof {
        // As the recorder samples them.
        let sample_bytes = tracer_common::cuda::STACK_SAMPLE_BYTES;
        super::attach::write_device_pprof(path, &r.stacks, &what, sample_bytes, r.ts_ns)?;
    }
    Ok(())
}
