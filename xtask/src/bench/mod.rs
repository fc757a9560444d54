//! `cargo xtask bench`: the performance figures of BENCHMARKS.md, each
//! measured side by side in one run (our recorder against untraced or
//! against bpftrace with the same hooks), never as absolute times in tests.

use std::{
    collections::HashSet,
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tracer_e2e::{Attach, CudaLoad, Proc, Recorder, TestCgroup};

use crate::progstats::ProgStats;

mod busy;
mod cuda;
mod growth;
mod heap;
mod oomstorm;
mod python;

use cuda::*;
use growth::*;
use heap::*;
use python::*;

const MIB: u64 = 1 << 20;

/// Benchmark sizes.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Kills to time for the latency benchmark.
    #[arg(long, default_value_t = 20)]
    pub kills: usize,
    /// Seconds of the idle-cost and NVML benchmarks.
    #[arg(long, default_value_t = 60)]
    pub idle_secs: u64,
    /// Seconds of the process-churn benchmark.
    #[arg(long, default_value_t = 10)]
    pub churn_secs: u64,
    /// Processes per second of the churn benchmark.
    #[arg(long, default_value_t = 1000)]
    pub churn_rate: u64,
    /// Run only one benchmark.
    #[arg(long, value_parser = ["latency", "load", "busy", "oomstorm", "cuda-scan", "idle", "churn", "nvml", "cuda", "cuda-real", "usdt", "heap", "growth", "arming", "python", "scrape"])]
    pub only: Option<String>,
    /// cudaMalloc/cudaFree pairs per measured loop of the CUDA benchmark.
    #[arg(long, default_value_t = 100_000)]
    pub cuda_pairs: u64,
    /// Seconds each configuration of the heap benchmark runs.
    #[arg(long, default_value_t = 3.0)]
    pub heap_secs: f64,
    /// Rounds per configuration of the growth benchmark.
    #[arg(long, default_value_t = 5)]
    pub growth_rounds: usize,
    /// MiB the growth benchmark's page-touch workload faults in per round.
    #[arg(long, default_value_t = 2048)]
    pub growth_mib: u64,
    /// Use the release binaries as they are: no setup, no build (a
    /// `vm-test --bench` guest, whose file system is read-only).
    #[arg(long, hide = true)]
    pub prebuilt: bool,
}

/// Runs the benchmarks and prints the figures.
pub fn run(opts: Options) -> anyhow::Result<()> {
    let bins = if opts.prebuilt {
        crate::release_bins()?
    } else {
        crate::setup::run()?;
        crate::setup::bench_peers()?;
        crate::build_release()?
    };
    if !crate::is_root() {
        bail!("the benchmarks load eBPF programs and make cgroups: run them as root");
    }
    let want = |name: &str| opts.only.as_deref().is_none_or(|o| o == name);
    let only = |name: &str| opts.only.as_deref() == Some(name);
    if want("latency") {
        println!("{}", kill_latency(&bins, opts.kills)?);
    }
    if want("load") {
        println!("{}", kill_latency_under_load(&bins, opts.kills)?);
    }
    if want("busy") {
        println!("{}", busy::busy(&bins, opts.kills)?);
    }
    if want("oomstorm") {
        println!("{}", oomstorm::oom_storm(&bins, 15)?);
    }
    if want("cuda-scan") {
        println!("{}", kill_latency_during_cuda_scans(&bins, opts.kills)?);
    }
    if want("idle") {
        println!("{}", idle_cost(&bins, opts.idle_secs)?);
    }
    if want("churn") {
        println!("{}", churn(&bins, opts.churn_secs, opts.churn_rate)?);
    }
    if want("nvml") {
        println!("{}", nvml_cost(&bins, opts.idle_secs)?);
    }
    if want("cuda") {
        println!("{}", cuda_cost(&bins, opts.cuda_pairs)?);
        println!("{}", cuda_sustained(&bins)?);
    }
    if want("cuda-real") {
        println!("{}", cuda_real_cost(&bins, opts.cuda_pairs)?);
    }
    if want("usdt") {
        println!("{}", usdt_cost(&bins, opts.cuda_pairs)?);
    }
    if want("heap") {
        println!("{}", heap_cost(&bins, opts.heap_secs)?);
    }
    if want("scrape") {
        println!("{}", scrape_cost(&bins, opts.idle_secs, opts.kills)?);
    }
    if want("python") {
        println!("{}", python_cost(&bins, 512)?);
    }
    if want("growth") {
        println!(
            "{}",
            growth_cost(&bins, opts.growth_rounds, opts.growth_mib)?
        );
    }
    if only("arming") {
        // Part of `growth`; alone, for a quick look.
        println!("{}", arming_latency(&bins, 5)?);
        println!("{}", calm_cgroups_cpu(&bins, 200, 20)?);
    }
    Ok(())
}

/// `+m % (q1 .. q3)`: the median and quartiles of `a[i] / base[i] - 1`.
fn paired(a: &[f64], base: &[f64]) -> String {
    let mut r: Vec<f64> = a
        .iter()
        .zip(base)
        .map(|(x, b)| (x / b - 1.0) * 100.0)
        .collect();
    r.sort_by(f64::total_cmp);
    if r.is_empty() {
        return String::new();
    }
    format!(
        "{:+.1} % ({:+.1} .. {:+.1})",
        percentile(&r, 0.5),
        percentile(&r, 0.25),
        percentile(&r, 0.75)
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// From the probe's timestamp of each kill to its committed row.
fn kill_latency(bins: &crate::Bins, kills: usize) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("bench.db");
    let rec = Recorder::on(&store).bin(&bins.tracer).quiet().start();
    oom_kills(bins, "bench-latency", kills)?;
    thread::sleep(Duration::from_secs(2));
    let log = rec.stop();
    let summary = stop_summary(&log)?;
    let mut lat_ms: Vec<f64> = summary["summary"]["kill_commit_us"]
        .as_array()
        .context("kill_commit_us")?
        .iter()
        .filter_map(|v| Some(v.as_f64()? / 1000.0))
        .collect();
    if lat_ms.len() != kills {
        bail!("{} of {kills} kills were recorded", lat_ms.len());
    }
    lat_ms.sort_by(f64::total_cmp);
    Ok(format!(
        "### Kill-to-durable-row latency ({kills} real memcg OOM kills)\n\n\
         | p50 | p99 | max | target |\n|---|---|---|---|\n| {:.2} ms | {:.2} ms | {:.2} ms | p99 < 20 ms |\n",
        percentile(&lat_ms, 0.5),
        percentile(&lat_ms, 0.99),
        lat_ms[lat_ms.len() - 1],
    ))
}

/// `kills` real memcg OOM kills, back to back, in a scratch cgroup.
fn oom_kills(bins: &crate::Bins, tag: &str, kills: usize) -> anyhow::Result<Vec<u32>> {
    let cg = TestCgroup::new(tag, 32 * MIB);
    let mut pids = Vec::with_capacity(kills);
    for _ in 0..kills {
        pids.push(tracer_e2e::oom_killed(&cg, &bins.memhog, 8, 1).pid());
    }
    Ok(pids)
}

/// ms from each kill's kernel timestamp to its committed row, as stored.
fn commit_latencies(store: &Path, pids: &[u32]) -> anyhow::Result<Vec<f64>> {
    let conn =
        rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut out = Vec::new();
    for pid in pids {
        let ms: Option<f64> = conn
            .query_row(
                "SELECT (committed_ns - ts_ns) / 1e6 FROM kills WHERE pid = ?1 AND killer = 'kernel_oom' ORDER BY id DESC LIMIT 1",
                [pid],
                |r| r.get(0),
            )
            .ok();
        out.push(ms.with_context(|| format!("the OOM kill of {pid} was not recorded"))?);
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

/// Kill commit latency while the node is busy: a fork/exec flood of
/// 2,000 processes a second, then an unprivileged SIGKILL storm at full
/// speed, each with `kills` real OOM kills in the middle of it.
fn kill_latency_under_load(bins: &crate::Bins, kills: usize) -> anyhow::Result<String> {
    let mut rows = String::new();
    for load in ["flood", "storm"] {
        let dir = tempfile::tempdir()?;
        let store = dir.path().join("load.db");
        let rec = Recorder::on(&store).bin(&bins.tracer).quiet().start();
        let secs = (kills as u64 / 5).max(6);
        let (achieved, pids) = match load {
            "flood" => {
                let flood = thread::spawn(move || spawn_churn(secs, 2000));
                thread::sleep(Duration::from_secs(1));
                let pids = oom_kills(bins, "bench-flood", kills)?;
                let spawned = flood
                    .join()
                    .map_err(|_| anyhow::anyhow!("flood panicked"))??;
                (
                    format!("{:.0} processes/s", spawned.len() as f64 / secs as f64),
                    pids,
                )
            }
            _ => {
                let cg = TestCgroup::new("bench-storm", 256 * MIB);
                let mut cmd = cg.command(&bins.killstorm);
                cmd.args(["--seconds", &secs.to_string()]);
                let mut storm = Proc::spawn(cmd);
                thread::sleep(Duration::from_secs(1));
                let pids = oom_kills(bins, "bench-storm-oom", kills)?;
                let mut line = String::new();
                BufReader::new(storm.child.stdout.as_mut().context("storm stdout")?)
                    .read_line(&mut line)?;
                let n: f64 = line
                    .trim()
                    .strip_prefix("killed ")
                    .and_then(|n| n.parse().ok())
                    .with_context(|| format!("killstorm said {line:?}"))?;
                (
                    format!("{:.0} SIGKILLs/s (uid 65534)", n / secs as f64),
                    pids,
                )
            }
        };
        thread::sleep(Duration::from_secs(2));
        let summary = stop_summary(&rec.stop())?;
        let lat = commit_latencies(&store, &pids)?;
        rows.push_str(&format!(
            "| {load} | {achieved} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} | {} |\n",
            lat.len(),
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat[lat.len() - 1],
            summary["summary"]["drops"]["oom"]
                .as_u64()
                .unwrap_or(u64::MAX),
            summary["summary"]["folded_kills"].as_u64().unwrap_or(0),
        ));
    }
    Ok(format!(
        "### Kill-to-durable-row latency under load\n\n\
         | load | rate reached | OOM kills | p50 | p99 | max | OOM ring drops | SIGKILLs folded |\n\
         |---|---|---|---|---|---|---|---|\n{rows}\ntarget: p99 < 20 ms\n"
    ))
}

/// Kill commit latency while `record --cuda` looks at 2,000 new processes
/// (each exec is rescanned 1, 3 and 10 s later for CUDA libraries): the
/// library watcher runs on its own thread, so the engine is not slowed.
fn kill_latency_during_cuda_scans(bins: &crate::Bins, kills: usize) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("scan.db");
    let rec = Recorder::on(&store)
        .bin(&bins.tracer)
        .args(&["--cuda"])
        .quiet()
        .start();
    let sleep = ["/bin/sleep", "/usr/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("no sleep(1)")?;
    let t0 = Instant::now();
    let mut sleepers: Vec<Child> = Vec::with_capacity(2000);
    let spawner = thread::spawn(move || -> anyhow::Result<Vec<Child>> {
        let mut out = Vec::with_capacity(2000);
        for _ in 0..2000 {
            out.push(
                Command::new(sleep)
                    .arg("120")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()?,
            );
            thread::sleep(Duration::from_millis(4));
        }
        Ok(out)
    });
    thread::sleep(Duration::from_secs(2));
    let pids = oom_kills(bins, "bench-cuda-scan", kills)?;
    sleepers.extend(
        spawner
            .join()
            .map_err(|_| anyhow::anyhow!("spawner panicked"))??,
    );
    let spawned_in = t0.elapsed();
    // The rescans 10 s after the last exec, with the kills done.
    thread::sleep(Duration::from_secs(11));
    let summary = stop_summary(&rec.stop())?;
    for c in &mut sleepers {
        let _ = c.kill();
        let _ = c.wait();
    }
    let lat = commit_latencies(&store, &pids)?;
    Ok(format!(
        "### Kill-to-durable-row latency while record --cuda rescans new processes\n\n\
         | processes exec'd | in | OOM kills | p50 | p99 | max | events |\n\
         |---|---|---|---|---|---|---|\n\
         | {} | {:.1} s | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} |\n\ntarget: p99 < 20 ms\n",
        sleepers.len(),
        spawned_in.as_secs_f64(),
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat[lat.len() - 1],
        summary["summary"]["events"],
    ))
}

/// The JSON summary the recorder prints when it stops.
fn stop_summary(log: &str) -> anyhow::Result<serde_json::Value> {
    tracer_e2e::summary_of(log).context("no summary in the recorder's log")
}

/// CPU seconds (user + system) and RSS of a process.
fn usage(pid: u32) -> anyhow::Result<(f64, u64, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest: Vec<&str> = stat[stat.rfind(')').context("stat")? + 2..]
        .split_whitespace()
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ticks: u64 = rest[11].parse::<u64>()? + rest[12].parse::<u64>()?;
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Ok((ticks as f64 / hz, kb("VmRSS:"), kb("VmHWM:")))
}

/// A bpftrace on the same hooks as a peer: kills, exits and SIGKILLs.
fn start_bpftrace() -> anyhow::Result<Child> {
    let script = "tracepoint:oom:mark_victim { printf(\"oom %d\\n\", args->pid); } \
                  tracepoint:sched:sched_process_exit { @exits = count(); } \
                  tracepoint:signal:signal_generate /args->sig == 9/ { printf(\"kill %d\\n\", args->pid); }";
    // Its messages go to a file, read only to say why it did not start.
    let mut err_file = tempfile::tempfile()?;
    let mut child = Command::new("bpftrace")
        .args(["-e", script])
        .stdout(Stdio::piped())
        .stderr(err_file.try_clone()?)
        .spawn()
        .context("start bpftrace")?;
    let out = child.stdout.take().context("bpftrace stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if !line.contains("Attaching") {
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        std::io::Seek::rewind(&mut err_file)?;
        std::io::Read::read_to_string(&mut std::io::Read::take(err_file, 4096), &mut err)?;
        let why = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or(line.trim());
        bail!("bpftrace did not start: {why}");
    }
    Ok(child)
}

/// Idle cost of the recorder, beside bpftrace on the same hooks (or alone,
/// saying why, where bpftrace cannot run: an old kernel in a guest).
fn idle_cost(bins: &crate::Bins, secs: u64) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let rec = Recorder::on(&dir.path().join("idle.db"))
        .bin(&bins.tracer)
        .quiet()
        .start();
    let mut peer = start_bpftrace();
    thread::sleep(Duration::from_secs(2));
    let (ours0, _, _) = usage(rec.pid())?;
    let peer0 = match &peer {
        Ok(p) => Some(usage(p.id())?.0),
        Err(_) => None,
    };
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs(secs));
    let wall = t0.elapsed().as_secs_f64();
    let (ours1, ours_rss, ours_hwm) = usage(rec.pid())?;
    let peer_row = match (&mut peer, peer0) {
        (Ok(p), Some(peer0)) => {
            let (peer1, peer_rss, _) = usage(p.id())?;
            tracer_e2e::interrupt(p, Duration::from_secs(10));
            Some(((peer1 - peer0) / wall * 100.0, peer_rss))
        }
        _ => None,
    };
    rec.stop();
    let ours_cpu = (ours1 - ours0) / wall * 100.0;
    let peer_rows = match (peer_row, &peer) {
        (Some((peer_cpu, peer_rss)), _) => format!(
            "| bpftrace | {peer_cpu:.2} % | {:.1} MiB | |\n\
             | ratio tracer / bpftrace | {:.2} | {:.2} | |\n",
            peer_rss as f64 / 1024.0,
            if peer_cpu > 0.0 {
                ours_cpu / peer_cpu
            } else {
                f64::NAN
            },
            ours_rss as f64 / peer_rss.max(1) as f64,
        ),
        (None, Err(e)) => format!("| bpftrace | not run: {e:#} | | |\n"),
        (None, Ok(_)) => String::new(),
    };
    Ok(format!(
        "### Recorder idle cost over {secs} s (side by side with bpftrace on the same hooks)\n\n\
         | | CPU (% of a core) | RSS | peak RSS |\n|---|---|---|---|\n\
         | tracer record | {ours_cpu:.2} % | {:.1} MiB | {:.1} MiB |\n\
         {peer_rows}\n\
         Targets: CPU under 1 % of a core, RSS under 50 MiB.\n",
        ours_rss as f64 / 1024.0,
        ours_hwm as f64 / 1024.0,
    ))
}

/// Short processes at `rate` per second for `secs`: every one must be in
/// the store (fork, exec, exit; forks and exits past their allowance
/// counted in their window's row), with no critical-ring drops.
fn churn(bins: &crate::Bins, secs: u64, rate: u64) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("churn.db");
    let rec = Recorder::on(&store).bin(&bins.tracer).quiet().start();
    let (cpu0, _, _) = usage(rec.pid())?;
    let pids = spawn_churn(secs, rate)?;
    let achieved = pids.len() as f64 / secs as f64;
    thread::sleep(Duration::from_secs(2));
    let (cpu1, rss, _) = usage(rec.pid())?;
    let summary = stop_summary(&rec.stop())?;
    let conn = rusqlite::Connection::open(&store)?;
    let count = |sql: &str| -> anyhow::Result<HashSet<u32>> {
        let mut st = conn.prepare(sql)?;
        let rows = st.query_map([], |r| r.get::<_, u32>(0))?;
        Ok(rows
            .filter_map(Result::ok)
            .filter(|p| pids.contains(p))
            .collect())
    };
    // Forks and exits past a parent's (a name's) allowance are counted in
    // the window's summary row, not stored one by one.
    let folded = |kind: &str, pid: &str| -> anyhow::Result<usize> {
        let mut st = conn.prepare(&format!(
            "SELECT json_extract(data, '$.{pid}'), json_extract(data, '$.repeats') FROM events
             WHERE kind = '{kind}' AND json_extract(data, '$.repeats') IS NOT NULL"
        ))?;
        let rows = st.query_map([], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, i64>(1)?)))?;
        Ok(rows
            .filter_map(Result::ok)
            .filter(|(p, _)| pids.contains(p))
            .map(|(_, n)| n as usize)
            .sum())
    };
    let forks = count("SELECT json_extract(data, '$.child_pid') FROM events WHERE kind = 'fork'")?
        .len()
        + folded("fork", "child_pid")?;
    let execs = count("SELECT json_extract(data, '$.pid') FROM events WHERE kind = 'exec'")?.len();
    let exits = count("SELECT json_extract(data, '$.pid') FROM events WHERE kind = 'exit'")?.len()
        + folded("exit", "pid")?;
    let critical_drops = summary["summary"]["drops"]["critical"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let data_drops = summary["summary"]["drops"]["data"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let n = pids.len();
    let exact = forks == n && execs == n && exits == n && critical_drops == 0;
    Ok(format!(
        "### Process churn: {n} short processes in {secs} s ({achieved:.0}/s asked {rate}/s)\n\n\
         | spawned | fork events | exec events | exit events | critical drops | data drops | recorder CPU | recorder RSS | exact |\n\
         |---|---|---|---|---|---|---|---|---|\n\
         | {n} | {forks} | {execs} | {exits} | {critical_drops} | {data_drops} | {:.1} % | {:.1} MiB | {} |\n",
        (cpu1 - cpu0) / (secs as f64 + 2.0) * 100.0,
        rss as f64 / 1024.0,
        if exact { "yes" } else { "NO" },
    ))
}

/// Spawns /bin/true at `rate` per second; returns their pids.
fn spawn_churn(secs: u64, rate: u64) -> anyhow::Result<HashSet<u32>> {
    let true_bin = ["/bin/true", "/usr/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("no true(1)")?;
    let mut pids = HashSet::new();
    let mut running: Vec<Child> = Vec::new();
    let start = Instant::now();
    let total = secs * rate;
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let child = Command::new(true_bin)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        pids.insert(child.id());
        running.push(child);
        if running.len() > 64 {
            running.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        }
    }
    for mut c in running {
        let _ = c.wait();
    }
    Ok(pids)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU of a process over `secs`, percent of a core.
fn cpu_over(pid: u32, secs: u64) -> anyhow::Result<f64> {
    let (c0, _, _) = usage(pid)?;
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs(secs));
    let (c1, _, _) = usage(pid)?;
    Ok((c1 - c0) / t0.elapsed().as_secs_f64() * 100.0)
}

/// The simulated NVML library and the environment that makes it show 8
/// devices of 80 GiB with 8 processes each.
fn eight_simulated_gpus() -> (String, [(&'static str, String); 3]) {
    let nvml = tracer_e2e::simcuda_dir()
        .join("libnvidia-ml.so.1")
        .display()
        .to_string();
    let env = [
        ("SIMNVML_DEVICES", "8".to_string()),
        ("SIMNVML_FAKE_PROCS", "8".to_string()),
        ("SIMCUDA_DEVICE_MEM", (80u64 << 30).to_string()),
    ];
    (nvml, env)
}

/// NVML sampling on the simulated library with 8 devices and 64 processes:
/// time per sample and recorder CPU at 1 s and 100 ms, beside a recorder
/// without NVML; timeline growth, projected to a day after downsampling.
fn nvml_cost(bins: &crate::Bins, secs: u64) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let (nvml, env) = eight_simulated_gpus();
    let mut rows = Vec::new();
    let mut bytes_per_row = 0.0;
    for interval in ["1s", "100ms"] {
        let store = dir.path().join(format!("nvml-{interval}.db"));
        let base = Recorder::on(&dir.path().join(format!("base-{interval}.db")))
            .bin(&bins.tracer)
            .quiet()
            .start();
        let rec = Recorder::on(&store)
            .bin(&bins.tracer)
            .args(&["--nvml-lib", &nvml, "--gpu-interval", interval])
            .envs(&env)
            .quiet()
            .start();
        thread::sleep(Duration::from_secs(2));
        let (with, without) = std::thread::scope(|s| {
            let a = s.spawn(|| cpu_over(rec.pid(), secs));
            let b = s.spawn(|| cpu_over(base.pid(), secs));
            (a.join().expect("thread"), b.join().expect("thread"))
        });
        let (with, without) = (with?, without?);
        base.stop();
        let summary = stop_summary(&rec.stop())?;
        let s = &summary["summary"];
        let conn = rusqlite::Connection::open(&store)?;
        let timeline: i64 = conn.query_row(
            "SELECT (SELECT count(*) FROM gpu_devices) + (SELECT count(*) FROM gpu_processes)",
            [],
            |r| r.get(0),
        )?;
        if timeline > 0 && interval == "1s" {
            bytes_per_row = timeline_row_bytes(&conn, &dir.path().join("rows.db"))?;
        }
        rows.push(format!(
            "| {interval} | {} | {:.1} ms | {:.1} ms | {with:.2} % | {without:.2} % | {timeline} |",
            s["nvml_samples"],
            s["nvml_sample_us_mean"].as_f64().unwrap_or(0.0) / 1000.0,
            s["nvml_sample_us_max"].as_f64().unwrap_or(0.0) / 1000.0,
        ));
    }
    // 8 device rows + 64 process rows per window; the first hour at 10 s,
    // the rest of the day folded to 1 min.
    let per_day = 72.0 * (360.0 + 23.0 * 60.0);
    let mib_day = per_day * bytes_per_row / (1 << 20) as f64;
    Ok(format!(
        "### NVML sampling (simulated NVML: 8 devices, 64 processes; {secs} s each, beside a recorder without NVML)\n\n\
         | interval | samples | mean per sample | slowest | recorder CPU | without NVML | timeline rows |\n|---|---|---|---|---|---|---|\n{}\n\n\
         Timeline store growth: {bytes_per_row:.0} bytes per row measured; {per_day:.0} rows a day kept after downsampling \
         = {mib_day:.1} MiB/day (target under 50 MiB/day).\n",
        rows.join("\n")
    ))
}

/// Bytes a timeline row takes in SQLite, indexes included: the rows copied
/// 20 times into a database of their own (so page rounding does not count),
/// its size divided by the rows.
fn timeline_row_bytes(conn: &rusqlite::Connection, scratch: &Path) -> anyhow::Result<f64> {
    conn.execute("ATTACH DATABASE ?1 AS m", [scratch.display().to_string()])?;
    conn.execute_batch(
        "CREATE TABLE m.d AS SELECT * FROM gpu_devices WHERE 0; CREATE TABLE m.p AS SELECT * FROM gpu_processes WHERE 0;
         CREATE INDEX m.d_ts ON d(ts_ns); CREATE INDEX m.p_ts ON p(ts_ns);",
    )?;
    let empty: i64 = conn.query_row("PRAGMA m.page_count", [], |r| r.get(0))?;
    for _ in 0..20 {
        conn.execute_batch("INSERT INTO m.d SELECT * FROM gpu_devices; INSERT INTO m.p SELECT * FROM gpu_processes;")?;
    }
    let pages: i64 = conn.query_row("PRAGMA m.page_count", [], |r| r.get(0))?;
    let size: i64 = conn.query_row("PRAGMA m.page_size", [], |r| r.get(0))?;
    let rows: i64 = conn.query_row(
        "SELECT (SELECT count(*) FROM m.d) + (SELECT count(*) FROM m.p)",
        [],
        |r| r.get(0),
    )?;
    Ok(((pages - empty) * size) as f64 / rows.max(1) as f64)
}

/// One `GET /metrics` on loopback: (ms, body bytes, series).
fn scrape_once(port: u16) -> anyhow::Result<(f64, usize, usize)> {
    use std::io::{Read as _, Write as _};
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    if !body.starts_with("HTTP/1.1 200") {
        bail!("scrape: {}", body.lines().next().unwrap_or(""));
    }
    let series = body.lines().filter(|l| l.starts_with("tracer_")).count();
    Ok((ms, body.len(), series))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The metrics endpoint with 100 containers' memory cgroups and 8
/// simulated GPUs: ms per scrape, recorder CPU scraped every 15 s beside
/// the same recorder not scraped, and the kill commit latency while a
/// scrape loop runs at 1/s.
fn scrape_cost(bins: &crate::Bins, secs: u64, kills: usize) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let containers: Vec<TestCgroup> = (0..100)
        .map(|i| TestCgroup::container(&format!("{:064x}", 0xbe0c_0000_u64 + i), 256 * MIB))
        .collect();
    let (nvml, env) = eight_simulated_gpus();
    let start = |name: &str, port: u16| {
        let addr = format!("127.0.0.1:{port}");
        let mut args = vec![
            "--nvml-lib".to_string(),
            nvml.clone(),
            "--metrics".to_string(),
            addr,
        ];
        for c in &containers {
            args.extend(["--cgroup".to_string(), c.path.clone()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Recorder::on(&dir.path().join(format!("{name}.db")))
            .bin(&bins.tracer)
            .args(&args)
            .envs(&env)
            .quiet()
            .start()
    };
    // Scraped every 15 s, beside the same recorder never scraped.
    let (pa, pb) = (free_port()?, free_port()?);
    let scraped = start("scraped", pa);
    let quiet = start("quiet", pb);
    thread::sleep(Duration::from_secs(3));
    let mut per_scrape = Vec::new();
    let (mut bytes, mut series) = (0, 0);
    for _ in 0..20 {
        let (ms, b, n) = scrape_once(pa)?;
        per_scrape.push(ms);
        (bytes, series) = (b, n);
    }
    per_scrape.sort_by(f64::total_cmp);
    let (with, without) = std::thread::scope(|s| {
        let a = s.spawn(|| -> anyhow::Result<f64> {
            let (c0, _, _) = usage(scraped.pid())?;
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(secs) {
                scrape_once(pa)?;
                thread::sleep(Duration::from_secs(15).min(Duration::from_secs(secs)));
            }
            let (c1, _, _) = usage(scraped.pid())?;
            Ok((c1 - c0) / t0.elapsed().as_secs_f64() * 100.0)
        });
        let b = s.spawn(|| cpu_over(quiet.pid(), secs));
        (a.join().expect("thread"), b.join().expect("thread"))
    });
    let (with, without) = (with?, without?);
    let rss_mib = usage(scraped.pid())?.1 as f64 / 1024.0;
    quiet.stop();
    scraped.stop();
    // Kill commit latency while a scrape loop runs at 1/s.
    let port = free_port()?;
    let rec = start("kills", port);
    thread::sleep(Duration::from_secs(2));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (pids, scrapes) = std::thread::scope(|s| {
        let loop_ = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if scrape_once(port).is_ok() {
                    n += 1;
                }
                thread::sleep(Duration::from_secs(1));
            }
            n
        });
        let pids = oom_kills(bins, "bench-scrape", kills);
        thread::sleep(Duration::from_secs(2));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (pids, loop_.join().expect("thread"))
    });
    let pids = pids?;
    rec.stop();
    let lat = commit_latencies(&dir.path().join("kills.db"), &pids)?;
    drop(containers);
    Ok(format!(
        "### Metrics endpoint (100 containers' memory cgroups, 8 simulated GPUs with 8 processes)\n\n\
         | scrape p50 | scrape p99 | body | series | recorder CPU, scraped every 15 s | not scraped | recorder RSS |\n\
         |---|---|---|---|---|---|---|\n\
         | {:.2} ms | {:.2} ms | {:.0} KiB | {series} | {with:.2} % | {without:.2} % | {rss_mib:.0} MiB |\n\n\
         Kill-to-durable-row latency while a scrape loop runs at 1/s ({scrapes} scrapes): \
         {} kills, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (target p99 < 20 ms).\n",
        percentile(&per_scrape, 0.5),
        percentile(&per_scrape, 0.99),
        bytes as f64 / 1024.0,
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat[lat.len() - 1],
    ))
}
