//! The CUDA benchmarks: cost per traced call on the simulated and real
//! runtimes, USDT probes, and a sustained load.

use super::*;

/// ns per cudaMalloc/cudaFree pair of a `loop` in the workload.
pub(super) fn loop_ns(target: &mut CudaLoad, pairs: u64) -> anyhow::Result<f64> {
    loop_ns_of(target, pairs, 256)
}

/// ns per pair of a `loop` of `size`-byte allocations.
fn loop_ns_of(target: &mut CudaLoad, pairs: u64, size: u64) -> anyhow::Result<f64> {
    let r = target.ok(&format!("loop {pairs} {size}"));
    Ok(r.first().context("loop reply")?.parse()?)
}

/// The cost of a stack on each allocation of 1 MiB or more (`attach --by
/// stack` unwinds and names them): 1 MiB pairs untraced, with empty
/// programs, traced, and traced with stacks; interleaved rounds.
fn stack_cost(bins: &crate::Bins, pairs: u64) -> anyhow::Result<String> {
    let mut target = CudaLoad::sim(&[]);
    let pid = target.pid();
    let size = 1 << 20;
    let mut runs: [Vec<f64>; 4] = Default::default();
    let configs: [Option<&[&str]>; 4] = [
        None,
        Some(&["--summary-only", "--floor"]),
        Some(&["--summary-only"]),
        Some(&["--summary-only", "--by", "stack"]),
    ];
    for _ in 0..3 {
        for (args, into) in configs.iter().zip(runs.iter_mut()) {
            let a = args.map(|args| Attach::start_bin(&bins.tracer, pid, args));
            into.push(loop_ns_of(&mut target, pairs, size)?);
            if let Some(a) = a {
                a.stop();
            }
        }
    }
    let [p, f, o, s] = runs.clone().map(median);
    // Where a stack's cost goes, in the kernel's own statistics: the
    // return program with and without stacks (their own rounds).
    let stats = ProgStats::start()?;
    let mut programs = Vec::new();
    for (label, args) in [
        ("tracer", &["--summary-only"][..]),
        (
            "tracer --by stack",
            &["--summary-only", "--by", "stack"][..],
        ),
    ] {
        let a = Attach::start_bin(&bins.tracer, pid, args);
        let ran = stats.around(&["cuda_"], || {
            loop_ns_of(&mut target, pairs, size).map(drop)
        })?;
        a.stop();
        programs.push(format!("{label}: {ran}"));
    }
    Ok(format!(
        "### CUDA call cost with stacks ({pairs} pairs of 1 MiB per loop: each allocation sends its stack)\n\n\
         | untraced | floor | tracer | tracer, --by stack | stacks / floor | a stack's cost |\n|---|---|---|---|---|---|\n\
         | {p:.0} ns/pair | {f:.0} ns/pair | {o:.0} ns/pair | {s:.0} ns/pair | {:.2} | {:.1} us |\n\n\
         Target: within 1.5x of the floor. Rounds (ns/pair): {runs:.0?}.\n\n\
         In the kernel (ns a run, statistics on): {}.\n",
        s / f,
        (s - o) / 1000.0,
        programs.join("; "),
    ))
}

/// Cost per traced cudaMalloc/cudaFree pair on the simulated runtime (whose
/// calls nest driver calls: 8 probe hits per pair), untraced, with empty
/// programs at the same sites (the kernel's floor), and with tracer's,
/// interleaved over three rounds because this VM's uprobe cost drifts.
pub(super) fn cuda_cost(bins: &crate::Bins, pairs: u64) -> anyhow::Result<String> {
    let mut target = CudaLoad::sim(&[]);
    let pid = target.pid();
    let (mut plain, mut floor, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    let mut entry_floor = Vec::new();
    let mut exact = true;
    for _ in 0..3 {
        plain.push(loop_ns(&mut target, pairs)?);
        let a = Attach::start_bin(
            &bins.tracer,
            pid,
            &["--summary-only", "--floor", "--entry-sites"],
        );
        entry_floor.push(loop_ns(&mut target, pairs)?);
        a.stop();
        let a = Attach::start_bin(&bins.tracer, pid, &["--summary-only", "--floor"]);
        floor.push(loop_ns(&mut target, pairs)?);
        a.stop();
        let a = Attach::start_bin(&bins.tracer, pid, &["--summary-only"]);
        ours.push(loop_ns(&mut target, pairs)?);
        let report = a.stop();
        let device = &report["ledger"]["by_kind"]["device"];
        exact &=
            device["allocs"] == pairs && device["frees"] == pairs && report["events_lost"] == 0;
    }
    let (p, f, o) = (
        median(plain.clone()),
        median(floor.clone()),
        median(ours.clone()),
    );
    let e = median(entry_floor.clone());
    let stacks = stack_cost(bins, pairs / 10)?;
    Ok(stacks
        + "\n"
        + &format!(
            "### CUDA call cost ({pairs} cudaMalloc + cudaFree pairs per loop, median of 3 interleaved rounds)\n\n\
         | untraced | floor, probes at the entries | floor, placed probes | tracer | tracer / floor | added by tracer over untraced | ledger exact |\n\
         |---|---|---|---|---|---|---|\n\
         | {p:.0} ns/pair | {e:.0} ns/pair | {f:.0} ns/pair | {o:.0} ns/pair | {:.2} | {:.1} us/pair | {} |\n\n\
         Targets: within 1.3x of the floor; under 4 us per pair. Rounds (ns/pair): untraced {plain:.0?}, floor at the entries {entry_floor:.0?}, floor {floor:.0?}, tracer {ours:.0?}.\n",
            o / f,
            (o - p) / 1000.0,
            if exact { "yes" } else { "NO" },
        ))
}

/// One loop of `pairs` call pairs, whatever they return: ns per pair.
pub(super) fn loop_any(target: &mut CudaLoad, pairs: u64, drv: bool) -> anyhow::Result<f64> {
    let r = target.ok(&format!(
        "loopany {pairs} 256{}",
        if drv { " drv" } else { "" }
    ));
    Ok(r.first().context("loopany reply")?.parse()?)
}

/// Per pair, median of three interleaved rounds: untraced, empty programs
/// at the functions' entries, empty programs at the placed sites, tracer.
pub(super) fn attach_rounds(
    bins: &crate::Bins,
    target: &mut CudaLoad,
    mut measure: impl FnMut(&mut CudaLoad) -> anyhow::Result<f64>,
) -> anyhow::Result<[Vec<f64>; 4]> {
    let pid = target.pid();
    let mut out: [Vec<f64>; 4] = Default::default();
    for _ in 0..3 {
        out[0].push(measure(target)?);
        for (i, args) in [
            &["--summary-only", "--floor", "--entry-sites"][..],
            &["--summary-only", "--floor"][..],
            &["--summary-only"][..],
        ]
        .into_iter()
        .enumerate()
        {
            let a = Attach::start_bin(&bins.tracer, pid, args);
            out[i + 1].push(measure(target)?);
            a.stop();
        }
    }
    Ok(out)
}

/// Cost per call pair on the real driver library (Debian's libcuda1:
/// `cuMemAlloc_v2` + `cuMemFree_v2`, each answering 3, not initialized,
/// without a device) and on the real runtime (PyPI's libcudart:
/// `cudaMalloc` + `cudaFree`, answering 35 without a driver): untraced,
/// empty programs at the entries and at the placed sites, and tracer.
pub(super) fn cuda_real_cost(bins: &crate::Bins, pairs: u64) -> anyhow::Result<String> {
    let libs =
        tracer_e2e::driver_libs().context("cargo xtask setup fetches the driver libraries")?;
    let cudart = tracer_e2e::real_cudart();
    let mut rows = String::new();
    let mut kernel = String::new();
    for (label, runtime, driver, drv) in [
        (
            "libcuda.so.535.261.03 (Debian libcuda1): cuMemAlloc_v2 + cuMemFree_v2 -> 3",
            std::path::PathBuf::from("-"),
            libs.join("libcuda.so.1"),
            true,
        ),
        (
            "libcudart.so.12 12.9.79 (PyPI), no driver: cudaMalloc + cudaFree -> 35",
            cudart.clone(),
            std::path::PathBuf::from("-"),
            false,
        ),
    ] {
        let mut cmd = Command::new(tracer_e2e::simcuda_dir().join("cudaload"));
        cmd.arg(&runtime).arg(&driver);
        if drv {
            cmd.env("LD_LIBRARY_PATH", &libs);
        }
        tracer_e2e::without_mknod(&mut cmd);
        let mut target = CudaLoad::spawn(cmd);
        let [plain, entry, floor, ours] =
            attach_rounds(bins, &mut target, |t| loop_any(t, pairs, drv))?;
        let in_kernel = attach_program_cost(bins, &mut target, |t| loop_any(t, pairs, drv))?;
        let (p, e, f, o) = (
            median(plain.clone()),
            median(entry.clone()),
            median(floor.clone()),
            median(ours.clone()),
        );
        rows.push_str(&format!(
            "| {label} | {p:.0} | {e:.0} | {f:.0} | {o:.0} | {:.2} | {:.1}x |\n",
            o / f,
            e / f
        ));
        rows.push_str(&format!(
            "|  rounds | {plain:.0?} | {entry:.0?} | {floor:.0?} | {ours:.0?} | | |\n"
        ));
        kernel.push_str(&format!("- {label}: {in_kernel}\n"));
    }
    Ok(format!(
        "### CUDA call cost on the real libraries ({pairs} pairs per loop, ns per pair, median of 3 interleaved rounds)\n\n\
         | library and calls | untraced | floor at the entries | floor at the placed sites | tracer | tracer / floor | placement's gain (entry floor / placed floor) |\n\
         |---|---|---|---|---|---|---|\n{rows}\n\
         Target: tracer within 1.3x of the floor (empty programs at the same sites).\n\n\
         In the kernel, ns a program run (one more loop each, the kernel's run-time \
         statistics on, which add about 45 ns to every run):\n\n{kernel}"
    ))
}

/// ns a program run, in the kernel, of the empty programs at the placed
/// sites and of tracer's: one loop under each with the kernel's run-time
/// statistics on (their own rounds: the statistics slow every program).
pub(super) fn attach_program_cost(
    bins: &crate::Bins,
    target: &mut CudaLoad,
    mut measure: impl FnMut(&mut CudaLoad) -> anyhow::Result<f64>,
) -> anyhow::Result<String> {
    let stats = ProgStats::start()?;
    let mut parts = Vec::new();
    for (label, args) in [
        ("floor", &["--summary-only", "--floor"][..]),
        ("tracer", &["--summary-only"][..]),
    ] {
        let a = Attach::start_bin(&bins.tracer, target.pid(), args);
        let ran = stats.around(&["cuda_"], || measure(target).map(drop))?;
        a.stop();
        parts.push(format!("{label}: {ran}"));
    }
    Ok(parts.join("; "))
}

/// What a traced caching allocator's block costs: tests/c/torchalloc.c
/// handing out and taking back a 4 KiB block (`pytorch:malloc` and
/// `pytorch:free` USDT probes, semaphores raised while traced), untraced
/// against attached, three interleaved rounds.
pub(super) fn usdt_cost(bins: &crate::Bins, pairs: u64) -> anyhow::Result<String> {
    let d = tracer_e2e::simcuda_dir();
    let mut cmd = Command::new(d.join("torchalloc"));
    cmd.arg(d.join("libcudart.so.12"));
    let mut target = CudaLoad::spawn(cmd);
    let bench = |t: &mut CudaLoad| -> anyhow::Result<f64> {
        let r = t.ok(&format!("bench {pairs} 4096"));
        Ok(r.first().context("bench reply")?.parse()?)
    };
    let (mut plain, mut ours) = (Vec::new(), Vec::new());
    let mut exact = true;
    for _ in 0..3 {
        plain.push(bench(&mut target)?);
        let a = Attach::start_bin(&bins.tracer, target.pid(), &["--summary-only"]);
        ours.push(bench(&mut target)?);
        let report = a.stop();
        let alloc = &report["ledger"]["allocator"];
        exact &=
            alloc["blocks"] == 0 && alloc["untracked_frees"] == 0 && report["events_lost"] == 0;
    }
    let (p, o) = (median(plain.clone()), median(ours.clone()));
    Ok(format!(
        "### PyTorch allocator probes (USDT): {pairs} block malloc + free pairs per loop, median of 3 interleaved rounds\n\n\
         | untraced (semaphores at 0) | traced | added per pair | every block seen, none lost |\n|---|---|---|---|\n\
         | {p:.0} ns/pair | {o:.0} ns/pair | {:.2} us | {} |\n\n\
         Rounds (ns/pair): untraced {plain:.0?}, traced {ours:.0?}.\n",
        (o - p) / 1000.0,
        if exact { "yes" } else { "NO" }
    ))
}

/// A paced load of 200,000 calls/s asked for 10 s: the rate reached, drops,
/// and whether the ledger counted every call.
pub(super) fn cuda_sustained(bins: &crate::Bins) -> anyhow::Result<String> {
    let mut target = CudaLoad::sim(&[]);
    let a = Attach::start_bin(&bins.tracer, target.pid(), &["--summary-only"]);
    let r = target.ok("rate 200000 10 256");
    let calls: u64 = r.first().context("rate reply")?.parse()?;
    let rate: f64 = r.get(1).context("rate reply")?.parse()?;
    let report = a.stop();
    let l = &report["ledger"];
    let seen = l["calls"].as_u64().unwrap_or(0);
    let lost = report["events_lost"].as_u64().unwrap_or(u64::MAX);
    let exact = seen == calls
        && l["by_kind"]["device"]["allocs"] == calls / 2
        && l["by_kind"]["device"]["frees"] == calls / 2;
    Ok(format!(
        "### Sustained CUDA calls (200,000 calls/s asked for 10 s, one thread)\n\n\
         | calls made | rate reached | calls in the ledger | events lost | ledger exact |\n|---|---|---|---|---|\n\
         | {calls} | {rate:.0}/s | {seen} | {lost} | {} |\n",
        if exact { "yes" } else { "NO" },
    ))
}
