//! The growth benchmark: page faults with and without growth attribution.

use super::*;

/// What one configuration of the growth benchmark measured.
#[derive(Default)]
pub(super) struct GrowthPhase {
    /// ns per page faulted in, per round.
    touch: Vec<f64>,
    /// Seconds per churn round.
    churn: Vec<f64>,
    /// Recorder CPU (% of a core) and RSS (MiB) per round, when one ran.
    cpu_rss: Vec<(f64, f64)>,
    /// Growth samples sent and lost, over the rounds.
    samples: u64,
    lost: u64,
}

/// One round of one configuration: the recorder (none, or with these
/// arguments) while the page-touch and churn workloads run in memory
/// cgroups with limits.
pub(super) fn growth_round(
    bins: &crate::Bins,
    recorder: Option<&[&str]>,
    toucher: &mut CudaLoad,
    churn_cg: &TestCgroup,
    churn_n: u64,
    into: &mut GrowthPhase,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let rec = recorder.map(|extra| {
        Recorder::on(&dir.path().join("growth.db"))
            .bin(&bins.tracer)
            .args(extra)
            .quiet()
            .start()
    });
    if rec.is_some() {
        // Warm-up, not measured: the recorder's first sight of the
        // workload (its files parsed and named once per recorder).
        toucher.cmd("round");
        thread::sleep(Duration::from_millis(300));
    }
    let cpu0 = rec.as_ref().map(|r| usage(r.pid())).transpose()?;
    let t0 = Instant::now();
    let reply = toucher.cmd("round");
    into.touch.push(
        reply
            .strip_prefix("ns/page ")
            .and_then(|n| n.trim().parse().ok())
            .with_context(|| format!("grower said {reply:?}"))?,
    );
    // A shell in a cgroup with a limit starting short processes one after
    // another: every one is a new process to decide about.
    let mut sh = churn_cg.command("/bin/sh");
    sh.args([
        "-c",
        &format!("i=0; while [ $i -lt {churn_n} ]; do /bin/true; i=$((i+1)); done"),
    ]);
    let t = Instant::now();
    let status = sh.status().context("churn shell")?;
    if !status.success() {
        bail!("the churn shell failed: {status}");
    }
    into.churn.push(t.elapsed().as_secs_f64());
    let wall = t0.elapsed().as_secs_f64();
    if let Some(r) = rec {
        let (cpu1, rss, _) = usage(r.pid())?;
        let cpu = (cpu1 - cpu0.map(|c| c.0).unwrap_or(0.0)) / wall * 100.0;
        let summary = stop_summary(&r.stop())?;
        let s = &summary["summary"];
        into.cpu_rss.push((cpu, rss as f64 / 1024.0));
        into.samples += s["growth"]["samples"].as_u64().unwrap_or(0);
        into.lost += s["growth"]["ring_full"].as_u64().unwrap_or(0)
            + s["growth_queue_drops"].as_u64().unwrap_or(0)
            + s["drops"]["data"].as_u64().unwrap_or(0);
    }
    Ok(())
}

/// Growth attribution's cost: a process faulting in `mib` MiB page by page
/// in a cgroup of its own, and a shell starting short processes in
/// another, untraced, under the recorder without growth attribution, and
/// under the recorder with it (the default).
pub(super) fn growth_cost(bins: &crate::Bins, rounds: usize, mib: u64) -> anyhow::Result<String> {
    let touch_cg = TestCgroup::new("bench-touch", (mib + 512) * MIB);
    let churn_cg = TestCgroup::new("bench-churn", 512 * MIB);
    let mut toucher = {
        let mut cmd = touch_cg.command(tracer_e2e::grower());
        cmd.args(["touch", &mib.to_string()]);
        CudaLoad::spawn(cmd)
    };
    // The first round faults in the page tables too; not measured.
    toucher.cmd("go");
    let churn_n = 500;
    // The floor: the recorder with the growth programs attached to their
    // hooks but returning at once, what any program there costs.
    let configs: [(&str, Option<&[&str]>); 4] = [
        ("untraced", None),
        ("tracer record --growth off", Some(&["--growth", "off"])),
        (
            "floor: empty programs on the growth hooks",
            Some(&["--growth", "floor"]),
        ),
        ("tracer record (growth attribution, the default)", Some(&[])),
    ];
    // Round by round, every configuration in turn: drift of the machine
    // falls on all of them alike.
    let mut results: Vec<(&str, GrowthPhase)> = configs
        .iter()
        .map(|(n, _)| (*n, GrowthPhase::default()))
        .collect();
    for _ in 0..rounds {
        for ((_, args), (_, into)) in configs.iter().zip(results.iter_mut()) {
            growth_round(bins, *args, &mut toucher, &churn_cg, churn_n, into)?;
        }
    }
    // ns a program run in the kernel, one more page-touch round under the
    // floor and under the default, with the run-time statistics on.
    let stats = ProgStats::start()?;
    let mut in_kernel = Vec::new();
    for (name, args) in &configs[2..] {
        let dir = tempfile::tempdir()?;
        let rec = Recorder::on(&dir.path().join("growth.db"))
            .bin(&bins.tracer)
            .args(args.unwrap_or_default())
            .quiet()
            .start();
        toucher.cmd("round");
        let ran = stats.around(&["growth_"], || {
            toucher.cmd("round");
            Ok(())
        })?;
        rec.stop();
        in_kernel.push(format!("{name}: {ran}"));
    }
    drop(stats);
    toucher.exit();
    let base_touch = median(results[0].1.touch.clone());
    let base_churn = median(results[0].1.churn.clone());
    let mut out = format!(
        "### Growth attribution: page-touch ({mib} MiB in 4 KiB pages per round) and process churn ({churn_n} processes per round), {rounds} rounds each\n\n\
         | configuration | page touch ns/page (median) | vs untraced | same round, median (IQR) | churn s/round (median) | vs untraced | same round, median (IQR) | recorder CPU | recorder RSS | samples | lost |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (name, p) in &results {
        let t = median(p.touch.clone());
        let c = median(p.churn.clone());
        let traced = !p.cpu_rss.is_empty();
        let cpu = if traced {
            median(p.cpu_rss.iter().map(|x| x.0).collect())
        } else {
            0.0
        };
        let rss = p.cpu_rss.iter().map(|x| x.1).fold(0.0, f64::max);
        out.push_str(&format!(
            "| {name} | {t:.0} | {:+.1} % | {} | {c:.3} | {:+.1} % | {} | {} | {} | {} | {} |\n",
            (t / base_touch - 1.0) * 100.0,
            paired(&p.touch, &results[0].1.touch),
            (c / base_churn - 1.0) * 100.0,
            paired(&p.churn, &results[0].1.churn),
            if traced {
                format!("{cpu:.1} %")
            } else {
                String::new()
            },
            if traced {
                format!("{rss:.1} MiB")
            } else {
                String::new()
            },
            if traced {
                p.samples.to_string()
            } else {
                String::new()
            },
            if traced {
                p.lost.to_string()
            } else {
                String::new()
            },
        ));
    }
    let (floor, full) = (&results[2].1, &results[3].1);
    out.push_str(&format!(
        "\nGrowth attribution over the floor, same round: page touch {}, churn {}.\n\n\
         In the kernel, ns a program run over one more page-touch round each, the \
         kernel's run-time statistics on (they add about 45 ns to every run): {}.\n",
        paired(&full.touch, &floor.touch),
        paired(&full.churn, &floor.churn),
        in_kernel.join("; "),
    ));
    out.push_str(
        "\nTargets: at most 5 % slower on the page-touch loop, at most 1 % on the churn \
         workload, no sample lost. Medians over the rounds, and the median (with the \
         interquartile range) of each round's ratio to the untraced run of the same round, \
         which this VM's drift from minute to minute does not move; the configurations take turns \
         round by round, a recorder started afresh each round and warmed up by one unmeasured \
         page-touch round (its first sight of the workload); recorder CPU is over the measured \
         round (both workloads), RSS the largest seen.\n",
    );
    Ok(out)
}
