//! `tracer kills`: one line per kill, and the filters and crash-loop
//! grouping that `explain` and `report` share with it.

use std::{process::ExitCode, time::Duration};

use clap::ValueEnum;
use serde::Serialize;

use super::{Format, StoreArg};
use crate::{
    explain::loops::{self, loops},
    model::cgroup::Owner,
    record::{GpuOomRecord, KillRecord},
    say,
    store::Store,
    util::{out, term, time::format_wall, units::bytes},
};

/// Who killed, as the filters name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KillerArg {
    /// Any OOM killer: the kernel's, systemd-oomd, earlyoom, kubelet.
    Oom,
    /// The kernel's OOM killer.
    Kernel,
    /// systemd-oomd.
    Oomd,
    /// earlyoom.
    Earlyoom,
    /// kubelet's evictions.
    Kubelet,
    /// A SIGKILL from any other process (`kill -9`), or one the kernel
    /// generated for the process itself (a BPF program, a limit).
    Signal,
    /// CUDA out-of-memory errors (recorded with `record --cuda`): the
    /// allocation failed, the process was not killed.
    Gpu,
    /// Every kill.
    Any,
}

impl KillerArg {
    /// Whether a killer named `name` ([`crate::record::Killer::name`], or
    /// `gpu_oom`) is one of these.
    fn covers(self, name: &str) -> bool {
        match self {
            KillerArg::Oom => !matches!(name, "process" | "gpu_oom"),
            KillerArg::Kernel => name == "kernel_oom",
            KillerArg::Oomd => name == "systemd_oomd",
            KillerArg::Earlyoom => name == "earlyoom",
            KillerArg::Kubelet => name == "kubelet",
            KillerArg::Signal => name == "process",
            KillerArg::Gpu => name == "gpu_oom",
            KillerArg::Any => name != "gpu_oom",
        }
    }
}

/// Which kills to show.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KillFilter {
    /// Only kills by this killer. Without it, `explain` shows OOM kills
    /// (unless --pid or --all is given) and `kills` every kill.
    #[arg(long, value_enum)]
    pub killer: Option<KillerArg>,
    /// Only kills in this memory cgroup or below it (the path as
    /// /proc/PID/cgroup shows it, e.g. /kubepods/burstable).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Only kills in this Kubernetes pod: NAMESPACE/NAME, or NAME in any
    /// namespace.
    #[arg(long, value_name = "NS/NAME")]
    pub pod: Option<String>,
    /// Only kills in this container: its name in its pod, or the start of
    /// its id (at least 4 hex digits).
    #[arg(long, value_name = "NAME|ID")]
    pub container: Option<String>,
    /// Only kills of processes of this name (as `ps -o comm` shows it).
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
}

/// What the filters look at in a kill or a GPU OOM.
pub(super) struct Subject<'a> {
    killer: &'static str,
    comm: &'a str,
    cgroup: Option<&'a str>,
    owner: Option<&'a Owner>,
}

impl<'a> Subject<'a> {
    pub(super) fn of_kill(k: &'a KillRecord) -> Self {
        Self {
            killer: k.killer.name(),
            comm: &k.victim.comm,
            cgroup: k.cgroup(),
            owner: k.victim.owner.as_ref(),
        }
    }

    pub(super) fn of_gpu_oom(r: &'a GpuOomRecord) -> Self {
        Self {
            killer: "gpu_oom",
            comm: &r.process.comm,
            cgroup: r.process.memcg.as_deref(),
            owner: r.process.owner.as_ref(),
        }
    }

    /// Where it ran, for people.
    fn place(&self) -> String {
        loops::place(self.owner, self.cgroup)
    }
}

impl KillFilter {
    /// This filter, with `killer` set when none was asked for.
    pub(super) fn or_killer(&self, killer: KillerArg) -> Self {
        let mut f = self.clone();
        f.killer.get_or_insert(killer);
        f
    }

    /// Refuses filters that can match nothing.
    pub(super) fn check(&self) -> anyhow::Result<()> {
        if let Some(p) = &self.pod
            && (p.is_empty() || p.split('/').count() > 2 || p.split('/').any(str::is_empty))
        {
            anyhow::bail!("--pod {}: give NAMESPACE/NAME or NAME", term::escape(p));
        }
        for (flag, v) in [
            ("--container", &self.container),
            ("--comm", &self.comm),
            ("--cgroup", &self.cgroup),
        ] {
            if v.as_deref() == Some("") {
                anyhow::bail!("{flag} needs a value");
            }
        }
        Ok(())
    }

    /// Whether `s` passes.
    pub(super) fn matches(&self, s: &Subject) -> bool {
        let killer = self.killer.unwrap_or(KillerArg::Any);
        let kube = s.owner.and_then(|o| o.kube.as_ref());
        killer.covers(s.killer)
            && self.comm.as_deref().is_none_or(|c| c == s.comm)
            && self
                .cgroup
                .as_deref()
                .is_none_or(|want| s.cgroup.is_some_and(|have| under(have, want)))
            && self.pod.as_deref().is_none_or(|want| {
                kube.is_some_and(|k| match want.split_once('/') {
                    Some((ns, pod)) => k.namespace == ns && k.pod == pod,
                    None => k.pod == want,
                })
            })
            && self.container.as_deref().is_none_or(|want| {
                kube.is_some_and(|k| k.container.as_deref() == Some(want))
                    || (want.len() >= 4
                        && want.bytes().all(|b| b.is_ascii_hexdigit())
                        && s.owner
                            .and_then(|o| o.container_id.as_deref())
                            .is_some_and(|id| id.starts_with(&want.to_ascii_lowercase())))
            })
    }

    /// The filters given, as the command line spells them (for messages).
    pub(super) fn said(&self) -> String {
        let mut s = String::new();
        let mut add = |flag: &str, v: &str| s.push_str(&format!(" {flag} {}", term::escape(v)));
        if let Some(k) = self.killer {
            add(
                "--killer",
                k.to_possible_value().expect("no skipped values").get_name(),
            );
        }
        for (flag, v) in [
            ("--cgroup", &self.cgroup),
            ("--pod", &self.pod),
            ("--container", &self.container),
            ("--comm", &self.comm),
        ] {
            if let Some(v) = v {
                add(flag, v);
            }
        }
        s
    }
}

/// Whether cgroup `have` is `want` or below it.
fn under(have: &str, want: &str) -> bool {
    let (have, want) = (have.trim_end_matches('/'), want.trim_end_matches('/'));
    let want = want.strip_prefix('/').unwrap_or(want);
    let have = have.strip_prefix('/').unwrap_or(have);
    want.is_empty() || have == want || have.strip_prefix(want).is_some_and(|r| r.starts_with('/'))
}

/// Options of `tracer kills`.
#[derive(Debug, clap::Args)]
pub struct KillsArgs {
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    filter: KillFilter,
    /// Only kills this recent (e.g. 10m, 6h, 2d).
    #[arg(long, value_parser = super::parse_duration)]
    pub since: Option<Duration>,
    /// Only kills of this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// One line per kill, crash loops not grouped.
    #[arg(long)]
    pub each: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Same as --format json.
    #[arg(long)]
    pub json: bool,
}

/// One line of `tracer kills`: a kill, or a crash loop of them.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Store ids, latest first (of `gpu_ooms` for `gpu_oom` rows).
    pub ids: Vec<i64>,
    /// Kills in the row.
    pub count: usize,
    /// The latest one's wall time, ns.
    pub ts_ns: i64,
    /// The first one's wall time, ns.
    pub first_ns: i64,
    /// `kernel_oom`, `systemd_oomd`, `earlyoom`, `kubelet`, `process`,
    /// `gpu_oom`.
    pub killer: &'static str,
    /// The latest victim's pid.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Its pod or container, else its memory cgroup.
    pub place: String,
    /// Its memory cgroup.
    pub cgroup: Option<String>,
    /// The latest victim's RSS at the kill, kB (a GPU OOM: none).
    pub rss_kb: Option<u64>,
    /// A GPU OOM's failed allocation, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked_bytes: Option<u64>,
    /// The verdict's cause (`gpu_oom` for GPU OOMs).
    pub cause: String,
    /// The latest one's verdict.
    pub verdict: String,
}

/// Runs `kills`.
pub fn run(args: KillsArgs) -> anyhow::Result<ExitCode> {
    args.filter.check()?;
    let (since_ns, _) = super::window(args.since, true);
    let store = Store::open_ro(&args.store.path)?;
    let mut rows = if args.filter.killer == Some(KillerArg::Gpu) {
        gpu_rows(&store, since_ns, &args)?
    } else {
        kill_rows(&store, since_ns, &args)?
    };
    rows.sort_by_key(|r| std::cmp::Reverse(r.ts_ns));
    let json = args.json || args.format == Format::Json;
    if json {
        out::stdout(&(serde_json::to_string_pretty(&rows)? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        let window = args
            .since
            .map(|d| format!(" in the last {}", humantime::format_duration(d)))
            .unwrap_or_default();
        say!(
            "tracer: no kills{}{window} in {}",
            args.filter.said(),
            args.store.path.display()
        );
        return Ok(ExitCode::from(1));
    }
    out::stdout(&render(&rows))?;
    Ok(ExitCode::SUCCESS)
}

fn kill_rows(store: &Store, since_ns: i64, args: &KillsArgs) -> anyhow::Result<Vec<Row>> {
    // Each kill becomes its row (and its loop key) as it is read: a store
    // of many kills is never held whole.
    let mut one: Vec<(Row, Option<String>)> = Vec::new();
    store.each_kill(since_ns, args.pid, |id, rec| {
        match rec {
            Ok(k) if args.filter.matches(&Subject::of_kill(&k)) => {
                let v = crate::explain::verdict(&k);
                let key = loops::key(&k, v.cause);
                one.push((row_of(id, &k, v), key));
            }
            Ok(_) => {}
            Err(why) => say_damaged(store, id, &why),
        }
        true
    })?;
    let groups = if args.each {
        (0..one.len()).map(|i| vec![i]).collect()
    } else {
        loops(&one, |(_, key)| key.clone(), |(r, _)| r.ts_ns)
    };
    Ok(groups
        .into_iter()
        .map(|g| {
            let mut row = one[g[0]].0.clone();
            if g.len() > 1 {
                row.ids = g.iter().map(|&i| one[i].0.ids[0]).collect();
                row.count = g.iter().map(|&i| one[i].0.count).sum();
                row.first_ns = one[*g.last().expect("never empty")].0.ts_ns;
            }
            row
        })
        .collect())
}

/// Says that kill record `id` of `store` cannot be read back and is left
/// out.
pub(super) fn say_damaged(store: &Store, id: i64, why: &str) {
    say!(
        "tracer: kill record {id} in {} is damaged and left out: {}",
        store.path().display(),
        term::escape(why)
    );
}

/// The row of one kill.
fn row_of(id: i64, k: &KillRecord, v: crate::explain::Verdict) -> Row {
    let s = Subject::of_kill(k);
    Row {
        ids: vec![id],
        // A folded SIGKILL storm is itself many kills.
        count: k.aggregate.as_ref().map_or(1, |a| a.count.max(1) as usize),
        ts_ns: k.ts_ns,
        first_ns: k.ts_ns,
        killer: s.killer,
        pid: k.victim.pid,
        comm: k.victim.comm.clone(),
        place: s.place(),
        cgroup: s.cgroup.map(str::to_string),
        rss_kb: k.victim.memory.rss_kb().or(k.victim.memory.anon_rss_kb),
        asked_bytes: None,
        cause: serde_json::to_value(v.cause)
            .ok()
            .and_then(|c| c.as_str().map(str::to_string))
            .unwrap_or_default(),
        verdict: v.summary,
    }
}

fn gpu_rows(store: &Store, since_ns: i64, args: &KillsArgs) -> anyhow::Result<Vec<Row>> {
    Ok(store
        .gpu_ooms(since_ns, args.pid, i64::MAX as usize)?
        .into_iter()
        .filter(|(_, r)| args.filter.matches(&Subject::of_gpu_oom(r)))
        .map(|(id, r)| {
            let s = Subject::of_gpu_oom(&r);
            Row {
                ids: vec![id],
                count: 1,
                ts_ns: r.ts_ns,
                first_ns: r.ts_ns,
                killer: s.killer,
                pid: r.process.pid,
                comm: r.process.comm.clone(),
                place: s.place(),
                cgroup: s.cgroup.map(str::to_string),
                rss_kb: None,
                asked_bytes: Some(r.size),
                cause: "gpu_oom".into(),
                verdict: crate::explain::gpu::verdict(&r),
            }
        })
        .collect())
}

/// The rows as a table, escaped for the terminal.
fn render(rows: &[Row]) -> String {
    let cell = |s: &str, w: usize| crate::explain::gpu::short(&term::escape(s), w);
    let mut t = format!(
        "{:<24}  {:<12}  {:<22}  {:<32}  {:>10}  VERDICT\n",
        "TIME", "KILLER", "VICTIM", "WHERE", "MEMORY"
    );
    for r in rows {
        let victim = format!("{} ({})", r.comm, r.pid);
        let memory = match (r.rss_kb, r.asked_bytes) {
            (Some(kb), _) => bytes(kb * 1024),
            (None, Some(b)) => format!("asked {}", bytes(b)),
            (None, None) => "-".into(),
        };
        let mut verdict = format!("{}: {}", r.cause, r.verdict);
        if r.count > 1 {
            verdict = format!(
                "{}, same verdict (ids {}): {verdict}",
                loops::span(r.count, r.first_ns, r.ts_ns),
                ids_said(&r.ids)
            );
        }
        t.push_str(&format!(
            "{:<24}  {:<12}  {:<22}  {:<32}  {:>10}  {}\n",
            format_wall(r.ts_ns),
            r.killer,
            cell(&victim, 22),
            cell(&r.place, 32),
            memory,
            crate::explain::one_line(&term::escape(&verdict), 160)
        ));
    }
    t
}

/// `41, 37, 33 and 11 more`.
fn ids_said(ids: &[i64]) -> String {
    let shown: Vec<String> = ids.iter().take(3).map(i64::to_string).collect();
    match ids.len() {
        n if n > 3 => format!("{} and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cgroup::KubeNames;

    fn kill(killer: Option<&str>, comm: &str, cgroup: &str, ts_s: i64) -> KillRecord {
        let mut k = KillRecord {
            ts_ns: ts_s * 1_000_000_000,
            ..Default::default()
        };
        if let Some(sender) = killer {
            k.killer.kind = crate::record::KillerKind::Userspace;
            k.killer.sender = Some(crate::record::ProcRef {
                pid: 7,
                comm: sender.into(),
                ..Default::default()
            });
        }
        k.victim.comm = comm.into();
        k.victim.memcg = (!cgroup.is_empty()).then(|| cgroup.into());
        k.victim.owner = Some(crate::model::cgroup::owner_of(cgroup));
        k
    }

    #[test]
    fn filters_pick_by_killer_place_and_name() {
        let oom = kill(
            None,
            "python3",
            &format!("/kubepods/burstable/pod1b2c/0123{}", "ab".repeat(30)),
            1,
        );
        let oomd = kill(
            Some("systemd-oomd"),
            "java",
            "/machine.slice/app.service",
            2,
        );
        let signal = kill(Some("bash"), "sleep", "/user.slice/user-0.slice", 3);
        let f = |args: &[&str]| {
            let mut all = vec!["tracer", "kills"];
            all.extend_from_slice(args);
            match super::super::Cli::try_parse_from(all).unwrap().command {
                super::super::Command::Kills(a) => a.filter,
                _ => unreachable!(),
            }
        };
        let which = |f: &KillFilter| -> Vec<&str> {
            [&oom, &oomd, &signal]
                .into_iter()
                .filter(|k| f.matches(&Subject::of_kill(k)))
                .map(|k| k.victim.comm.as_str())
                .collect()
        };
        use clap::Parser as _;
        assert_eq!(which(&f(&[])), ["python3", "java", "sleep"]);
        assert_eq!(which(&f(&["--killer", "oom"])), ["python3", "java"]);
        assert_eq!(which(&f(&["--killer", "kernel"])), ["python3"]);
        assert_eq!(which(&f(&["--killer", "oomd"])), ["java"]);
        assert_eq!(which(&f(&["--killer", "signal"])), ["sleep"]);
        assert!(which(&f(&["--killer", "gpu"])).is_empty());
        assert_eq!(which(&f(&["--cgroup", "/kubepods"])), ["python3"]);
        assert_eq!(which(&f(&["--cgroup", "machine.slice/"])), ["java"]);
        // A path prefix that is not a whole part is another cgroup.
        assert!(which(&f(&["--cgroup", "/machine.sl"])).is_empty());
        assert_eq!(which(&f(&["--container", "0123"])), ["python3"]);
        assert!(which(&f(&["--container", "012"])).is_empty());
        assert_eq!(which(&f(&["--comm", "sleep"])), ["sleep"]);
        assert_eq!(
            which(&f(&["--comm", "java", "--killer", "kernel"])),
            Vec::<&str>::new()
        );
        // Pods by their names, once the node's files gave them.
        let mut named = oom.clone();
        named.victim.owner.as_mut().unwrap().kube = Some(KubeNames {
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            container: Some("worker".into()),
        });
        let one = |f: &KillFilter| f.matches(&Subject::of_kill(&named));
        assert!(one(&f(&["--pod", "ml/trainer-0"])));
        assert!(one(&f(&["--pod", "trainer-0"])));
        assert!(!one(&f(&["--pod", "default/trainer-0"])));
        assert!(one(&f(&["--container", "worker"])));
        assert!(!one(&f(&["--container", "sidecar"])));
        assert!(f(&["--pod", "a/b/c"]).check().is_err());
        assert!(f(&["--pod", "ml/"]).check().is_err());
        assert!(f(&["--comm", ""]).check().is_err());
    }

    #[test]
    fn crash_loops_are_kills_of_one_place_close_in_time() {
        let gap = loops::GAP_NS / 1_000_000_000;
        let ks = [
            kill(None, "trainer", "/a", 100),
            kill(None, "trainer", "/a", 200),
            kill(Some("bash"), "sleep", "/b", 250),
            kill(None, "trainer", "/a", 300),
            // Long after: a new loop.
            kill(None, "trainer", "/a", 300 + gap + 1),
            kill(None, "other", "/a", 301),
            // Places not known: never one loop.
            kill(None, "lost", "", 302),
            kill(None, "lost", "", 303),
        ];
        let groups = loops(
            &ks,
            |k| loops::key(k, crate::explain::verdict(k).cause),
            |k| k.ts_ns,
        );
        assert_eq!(
            groups,
            vec![vec![4], vec![7], vec![6], vec![5], vec![3, 1, 0], vec![2]]
        );
        assert_eq!(
            loops::span(3, 100_000_000_000, 300_000_000_000),
            "killed 3 times in 3m 20s"
        );
    }
}
