//! `bench --only busy`: kill to durable row on a quiet node and on a busy
//! one, in one run, beside the disk's own fdatasync floor measured in the
//! store's directory at the same times.
//!
//! Busy, all at once: a fork + SIGKILL storm from an unprivileged user, a
//! process retrying a failing cudaMalloc (the simulated runtime, traced by
//! `record --cuda`), a metrics scrape every second, and the measured real
//! OOM kills, one every `KILL_EVERY`.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tracer_e2e::{CudaLoad, Proc, Recorder, TestCgroup};

use super::{MIB, commit_latencies, free_port, percentile, scrape_once, stop_summary, usage};

/// Time between two measured OOM kills.
const KILL_EVERY: Duration = Duration::from_millis(1500);

/// Failed cudaMalloc + cudaFree pairs per burst of the retry loop, and the
/// pause between bursts (a retry loop with a short back-off).
const RETRY_BURST: u64 = 1000;
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// ms per 4 KiB write + fdatasync in `dir`, `n` times, sorted.
fn fdatasync_floor(dir: &Path, n: usize) -> anyhow::Result<Vec<f64>> {
    let path = dir.join("floor");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)?;
    let block = [0x5au8; 4096];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        f.write_all(&block)?;
        f.sync_data()?;
        out.push(t0.elapsed().as_secs_f64() * 1000.0);
        thread::sleep(Duration::from_millis(5));
    }
    std::fs::remove_file(&path)?;
    out.sort_by(f64::total_cmp);
    Ok(out)
}

/// `kills` real OOM kills, one every `every`.
fn paced_oom_kills(
    bins: &crate::Bins,
    tag: &str,
    kills: usize,
    every: Duration,
) -> anyhow::Result<Vec<u32>> {
    let cg = TestCgroup::new(tag, 32 * MIB);
    let mut pids = Vec::with_capacity(kills);
    for _ in 0..kills {
        let t0 = Instant::now();
        pids.push(tracer_e2e::oom_killed(&cg, &bins.memhog, 8, 1).pid());
        thread::sleep(every.saturating_sub(t0.elapsed()));
    }
    Ok(pids)
}

/// Processes on the node now.
fn processes() -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .count()
        })
        .unwrap_or(0)
}

struct Phase {
    lat: Vec<f64>,
    floor: Vec<f64>,
}

impl Phase {
    fn row(&self, name: &str) -> String {
        let l = &self.lat;
        format!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:+.2} ms |\n",
            l.len(),
            percentile(l, 0.5),
            percentile(l, 0.99),
            l[l.len() - 1],
            percentile(&self.floor, 0.5),
            percentile(&self.floor, 0.99),
            percentile(l, 0.99) - percentile(&self.floor, 0.99),
        )
    }
}

/// The benchmark.
pub(super) fn busy(bins: &crate::Bins, kills: usize) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("busy.db");
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let rec = Recorder::on(&store)
        .bin(&bins.tracer)
        .args(&["--cuda", "--metrics", &addr])
        .quiet()
        .start();
    let t_rec = Instant::now();
    thread::sleep(Duration::from_secs(2));

    // Quiet: the floor, then the kills.
    let quiet_floor = fdatasync_floor(dir.path(), 200)?;
    let quiet_pids = paced_oom_kills(bins, "bench-busy-quiet", kills, KILL_EVERY / 3)?;

    // Busy.
    let storm_cg = TestCgroup::new("bench-busy-storm", 256 * MIB);
    let secs = (kills as u64 * KILL_EVERY.as_millis() as u64 / 1000 + 12).max(20);
    let mut cmd = storm_cg.command(&bins.killstorm);
    cmd.args(["--seconds", &secs.to_string()]);
    let t_busy = Instant::now();
    let mut storm = Proc::spawn(cmd);
    let mut cuda = CudaLoad::sim(&[("SIMCUDA_DEVICE_MEM", &(256 * MIB).to_string())]);
    cuda.ok("setdevice 0");
    let stop = AtomicBool::new(false);
    let failed_calls = AtomicU64::new(0);
    let (busy_pids, busy_floor, scrapes, peak) = thread::scope(|s| -> anyhow::Result<_> {
        let retry = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let out = cuda.cmd(&format!("loopany {RETRY_BURST} 1099511627776"));
                if out.starts_with("ok ") {
                    failed_calls.fetch_add(RETRY_BURST, Ordering::Relaxed);
                }
                thread::sleep(RETRY_PAUSE);
            }
        });
        let scraper = s.spawn(|| {
            let mut ms = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok((t, _, _)) = scrape_once(port) {
                    ms.push(t);
                }
                thread::sleep(Duration::from_secs(1));
            }
            ms
        });
        let watcher = s.spawn(|| {
            // The recorder's RSS and the model against the node's processes.
            let mut peak = (0u64, 0usize);
            while !stop.load(Ordering::Relaxed) {
                if let Ok((_, rss, _)) = usage(rec.pid()) {
                    peak.0 = peak.0.max(rss);
                }
                peak.1 = peak.1.max(processes());
                thread::sleep(Duration::from_millis(500));
            }
            peak
        });
        thread::sleep(Duration::from_secs(3));
        let pids = paced_oom_kills(bins, "bench-busy-oom", kills, KILL_EVERY);
        let floor = fdatasync_floor(dir.path(), 200);
        stop.store(true, Ordering::Relaxed);
        retry.join().expect("retry loop");
        let scrapes = scraper.join().expect("scraper");
        let peak = watcher.join().expect("watcher");
        Ok((pids?, floor?, scrapes, peak))
    })?;
    let busy_secs = t_busy.elapsed().as_secs_f64();
    let mut line = String::new();
    BufReader::new(storm.child.stdout.as_mut().context("storm stdout")?).read_line(&mut line)?;
    let sigkills: f64 = line
        .trim()
        .strip_prefix("killed ")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("killstorm said {line:?}"))?;
    let store_bytes = std::fs::metadata(&store).map(|m| m.len()).unwrap_or(0) + wal_len(&store);
    let (cpu, _, hwm) = usage(rec.pid())?;
    let cpu_pct = cpu / t_rec.elapsed().as_secs_f64() * 100.0;
    drop(cuda);
    let summary = stop_summary(&rec.stop())?;
    let quiet = Phase {
        lat: commit_latencies(&store, &quiet_pids)?,
        floor: quiet_floor,
    };
    let busy = Phase {
        lat: commit_latencies(&store, &busy_pids)?,
        floor: busy_floor,
    };
    let mut scrape_ms = scrapes;
    scrape_ms.sort_by(f64::total_cmp);
    let s = &summary["summary"];
    Ok(format!(
        "### Kill to durable row, quiet and busy (one recorder, `record --cuda --metrics`)\n\n\
         | node | OOM kills | p50 | p99 | max | fdatasync p50 | fdatasync p99 | p99 over the floor |\n\
         |---|---|---|---|---|---|---|---|\n{}{}\n\
         Busy for {busy_secs:.0} s: {:.0} SIGKILLs/s (uid 65534), {:.0} failed cudaMalloc/s, \
         {} scrapes (p99 {:.1} ms), an OOM kill every {:.1} s. \
         Recorder: {:.0} % of a core over the run, RSS peak {:.1} MiB (VmHWM {:.1} MiB); \
         model {} entries ({} live) at stop, at most {} processes on the node; \
         store {:.1} MiB ({:.2} MiB/min over the run); \
         ring drops: OOM {}, critical {}, data {}; SIGKILLs folded {}, CUDA calls folded {}.\n\n\
         target: busy p99 < 20 ms; quiet p99 within 2 ms of the fdatasync p99\n",
        quiet.row("quiet"),
        busy.row("busy"),
        sigkills / secs as f64,
        failed_calls.load(Ordering::Relaxed) as f64 / busy_secs,
        scrape_ms.len(),
        if scrape_ms.is_empty() {
            0.0
        } else {
            percentile(&scrape_ms, 0.99)
        },
        KILL_EVERY.as_secs_f64(),
        cpu_pct,
        peak.0 as f64 / 1024.0,
        hwm as f64 / 1024.0,
        s["model_entries"],
        s["model_live"],
        peak.1,
        store_bytes as f64 / MIB as f64,
        store_bytes as f64 / MIB as f64 / (busy_secs / 60.0),
        s["drops"]["oom"],
        s["drops"]["critical"],
        s["drops"]["data"],
        s["folded_kills"],
        s["folded_calls"],
    ))
}

/// Bytes in the store's WAL.
fn wal_len(store: &Path) -> u64 {
    let mut wal = store.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}
