//! `tracer attach --pid N`: CUDA allocation calls of a running process,
//! live, without restarting, stopping or signalling it (uprobes only).
//! With `--host`, its heap instead: attach_host.rs, which cli/mod.rs
//! runs in its place.

use std::{io::Write as _, process::ExitCode, time::Duration};

use serde_json::json;
use tracer_common::{CudaCall, cuda, usdt::UsdtEvent};

use crate::recorder::live::{
    Target, comm_of,
    cuda::{self as cuda_live, View},
    pidfd,
};
use crate::{
    model::ledger::{AllocKind, AllocatorSummary, Ledger},
    probes::cuda::name,
    record::{HeapSite, HeapSnapshot},
    util::time::format_wall,
    util::units::bytes,
};

/// Options of `tracer attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// The running process to trace.
    #[arg(long)]
    pub pid: u32,
    /// JSON lines: one per call, then per-second summaries and the final report.
    #[arg(long)]
    pub json: bool,
    /// Detach after this long (e.g. 30s, 5m).
    #[arg(long, value_parser = super::parse_duration)]
    pub duration: Option<Duration>,
    /// Wait for the process to load a CUDA library instead of failing when it has none.
    #[arg(long)]
    pub wait: bool,
    /// Print the per-second summaries and the final report, not every call.
    #[arg(long)]
    pub summary_only: bool,
    /// Benchmarks only: attach empty programs at the same sites (the cost
    /// of the uprobes themselves); nothing is traced.
    #[arg(long, hide = true)]
    pub floor: bool,
    /// Trace the host heap (malloc and friends) instead of CUDA: the top
    /// allocation sites by live bytes and growth, each second.
    #[arg(long)]
    pub host: bool,
    /// With --host: one sample per this many bytes allocated on average
    /// (0 keeps every allocation: exact, slower). With --by stack (and the
    /// exports): the same for the stacks of CUDA allocations under 1 MiB
    /// (every larger one has its stack).
    #[arg(long, value_parser = super::parse_size, default_value = "512KiB", value_name = "SIZE")]
    pub sample_bytes: u64,
    /// With --host: allocations of at least this size are always kept.
    #[arg(long, value_parser = super::parse_size, default_value = "1MiB", value_name = "SIZE")]
    pub always_bytes: u64,
    /// With --host: sites shown.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// With --host: growth is measured over this window.
    #[arg(long, value_parser = super::parse_duration, default_value = "10s")]
    pub growth_window: Duration,
    /// With --host: blocks live at least this long count as old (leak candidates).
    #[arg(long, value_parser = super::parse_duration, default_value = "30s")]
    pub old_after: Duration,
    /// Benchmarks only: probe every function at its entry (no placement).
    #[arg(long, hide = true)]
    pub entry_sites: bool,
    /// With --host: at the end, write a flame graph (SVG) of the live bytes by stack.
    #[arg(long, value_name = "PATH")]
    pub flamegraph: Option<std::path::PathBuf>,
    /// At the end, write a profile in pprof's format (gzipped protobuf,
    /// for `go tool pprof`, Pyroscope, Parca): with --host the live heap by
    /// stack, otherwise the device memory by stack.
    #[arg(long, value_name = "PATH")]
    pub pprof: Option<std::path::PathBuf>,
    /// At the end, write the device memory as a PyTorch memory snapshot
    /// (the pickle `torch.cuda.memory._snapshot()` writes, which PyTorch's
    /// memory viewer opens): segments with the stacks that allocated them,
    /// and the caching allocator's blocks where its probes are seen.
    #[arg(long, value_name = "PATH", conflicts_with = "host")]
    pub snapshot: Option<std::path::PathBuf>,
    /// `stack`: the device memory the traced allocations hold, grouped by
    /// the stack (native and Python frames) that allocated it, each second
    /// and at the end (--top of them); exact for allocations of 1 MiB or
    /// more, estimated from byte samples (--sample-bytes) below.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub by: Option<By>,
}

/// What `attach --by` groups device memory by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The stack that allocated it.
    Stack,
}

/// `cudaErrorMemoryAllocation` and friends, by value.
pub fn error_name(ret: i32) -> &'static str {
    match ret {
        0 => "success",
        1 => "invalid value",
        2 => "out of memory",
        3 => "not initialized",
        4 => "deinitialized",
        34 => "stub library",
        35 => "insufficient driver",
        100 => "no device",
        101 => "invalid device",
        803 => "system driver mismatch",
        999 => "unknown",
        _ => "error",
    }
}

/// The text or JSON view of a live CUDA session, on stdout.
struct Printer {
    pid: u32,
    json: bool,
    summary_only: bool,
    /// The last device memory by stack shown as text (shown again only
    /// when it changed, or at the end).
    last_stacks: String,
    /// Whether the device memory by stack is shown (--by stack), and how
    /// many stacks.
    show_stacks: bool,
    top: usize,
    /// Every stack with its allocations at the end, for the exports, and
    /// the caching allocator's blocks'.
    end_sites: Vec<HeapSite>,
    end_block_sites: Vec<HeapSite>,
    /// `--snapshot` and `--pprof`, written at the report (before the
    /// probes are taken out, which can take seconds), and how that went.
    exports: Exports,
    out: std::io::StdoutLock<'static>,
}

/// Where `--snapshot` and `--pprof` go, and the first error writing them.
struct Exports {
    snapshot: Option<std::path::PathBuf>,
    pprof: Option<std::path::PathBuf>,
    what: String,
    sample_bytes: u64,
    error: Option<anyhow::Error>,
}

impl View for Printer {
    fn block(&mut self, b: &UsdtEvent, ts: i64) {
        if self.summary_only {
            return;
        }
        let probe = crate::probes::usdt::probe_name(b.probe);
        let malloc = b.probe == tracer_common::usdt::TORCH_MALLOC;
        if self.json {
            let mut v = json!({ "type": "block", "time": format_wall(ts), "ts_ns": ts, "pid": b.header.pid,
                "tid": b.header.tid, "probe": probe, "ptr": format!("{:#x}", b.args[0]) });
            if malloc {
                v["size"] = b.args[2].into();
                v["device"] = (b.args[1] as i64).into();
                v["stream"] = (b.args[3] as i64).into();
            }
            let _ = writeln!(self.out, "{v}");
            return;
        }
        let what = if malloc {
            format!(
                "{} -> {:#x} dev {} stream {}",
                bytes(b.args[2]),
                b.args[0],
                b.args[1] as i64,
                b.args[3] as i64
            )
        } else {
            format!("{:#x}", b.args[0])
        };
        let _ = writeln!(
            self.out,
            "{} {}/{} {probe} {what}",
            format_wall(ts),
            b.header.pid,
            b.header.tid
        );
    }

    fn gpu_oom(&mut self, c: &CudaCall, ts: i64, size: u64, a: &AllocatorSummary) {
        // What the allocator's figures say of this process's share; other
        // processes on the device are not seen from here.
        let v = crate::explain::gpu::allocator_verdict(a, size);
        if self.json {
            let j = json!({ "type": "gpu_oom", "time": format_wall(ts), "pid": c.header.pid,
                "function": name(c.func), "size": size, "allocator": a, "verdict": v });
            let _ = writeln!(self.out, "{j}");
        } else {
            let _ = writeln!(self.out, "-- GPU out of memory in {}: {v}", name(c.func));
        }
    }

    fn call(&mut self, c: &CudaCall, ts: i64) {
        if self.summary_only {
            return;
        }
        let func = name(c.func);
        let device = (c.device >= 0).then_some(c.device);
        if self.json {
            let v = json!({
                "type": "call",
                "time": format_wall(ts),
                "ts_ns": ts,
                "pid": c.header.pid,
                "tid": c.header.tid,
                "comm": crate::collect::decode::c_str(&c.header.comm),
                "function": func,
                "size": c.size,
                "ret": c.ret,
                "ptr": format!("{:#x}", c.ptr),
                "latency_ns": c.latency_ns,
                "device": device,
            });
            let _ = writeln!(self.out, "{v}");
            return;
        }
        let size = if c.size > 0 {
            format!(" {}", bytes(c.size))
        } else {
            String::new()
        };
        let result = if c.ret == 0 {
            match cuda::shape(c.func) {
                Some(cuda::Shape::Alloc | cuda::Shape::Pitch | cuda::Shape::Create) => {
                    format!("-> {:#x}", c.ptr)
                }
                Some(cuda::Shape::Free | cuda::Shape::PtrSize | cuda::Shape::Map) => {
                    format!("{:#x} ok", c.ptr)
                }
                _ => "ok".into(),
            }
        } else {
            format!("failed: {} ({})", c.ret, error_name(c.ret))
        };
        let dev = device.map(|d| format!(" dev {d}")).unwrap_or_default();
        let _ = writeln!(
            self.out,
            "{} {}/{} {func}{size} {result} {:.1}us{dev}",
            format_wall(ts),
            c.header.pid,
            c.header.tid,
            c.latency_ns as f64 / 1000.0
        );
    }

    fn summary(&mut self, ledger: &Ledger, calls: u64, failed: u64) {
        let s = ledger.summary();
        if self.json {
            let v = json!({ "type": "summary", "time": format_wall(crate::util::time::wall_now_ns()), "pid": self.pid,
                "calls_per_s": calls, "failed_per_s": failed, "ledger": s });
            let _ = writeln!(self.out, "{v}");
        } else {
            let kinds: Vec<String> = AllocKind::ALL
                .iter()
                .map(|k| format!("{} {}", k.name(), bytes(ledger.outstanding(*k))))
                .collect();
            let _ = writeln!(
                self.out,
                "-- pid {}: {}; total {} (peak {}); {} calls/s, {} failed",
                self.pid,
                kinds.join(", "),
                bytes(s.total_bytes),
                bytes(s.peak_total_bytes),
                calls,
                failed
            );
            if let Some(a) = &s.allocator {
                let _ = writeln!(
                    self.out,
                    "-- pid {}: allocator {}",
                    self.pid,
                    crate::explain::gpu::allocator_line(a)
                );
            }
        }
        let _ = self.out.flush();
    }

    fn report(&mut self, ledger: &Ledger, exited: bool, lost: u64) {
        let sites = std::mem::take(&mut self.end_sites);
        let blocks = std::mem::take(&mut self.end_block_sites);
        if let Err(e) = write_exports(&self.exports, ledger, &sites, &blocks) {
            self.exports.error = Some(e);
        }
        let s = ledger.summary();
        let live = ledger.live();
        if self.json {
            let v = json!({ "type": if exited { "exit" } else { "detach" }, "pid": self.pid, "ledger": s,
                "leaks": if exited { json!(live) } else { json!(null) }, "still_held": if exited { json!(null) } else { json!(live) },
                "events_lost": lost });
            let _ = writeln!(self.out, "{v}");
        } else {
            let what = if exited {
                "exited; never freed"
            } else {
                "detached; still held"
            };
            let _ = writeln!(
                self.out,
                "== pid {} {what}: {} in {} allocations",
                self.pid,
                bytes(s.total_bytes),
                live.len()
            );
            for a in live.iter().take(20) {
                let _ = writeln!(
                    self.out,
                    "   {:>10}  {:<12}  {}  {} at {}",
                    bytes(a.size),
                    a.kind.name(),
                    a.ptr,
                    a.function,
                    format_wall(a.ts_ns)
                );
            }
            if live.len() > 20 {
                let _ = writeln!(self.out, "   ... and {} more", live.len() - 20);
            }
            let _ = writeln!(
                self.out,
                "== {} calls, peak {}, {} failed allocations, {} frees of memory allocated before attach",
                s.calls,
                bytes(s.peak_total_bytes),
                s.by_kind.values().map(|t| t.failed).sum::<u64>(),
                s.untracked_frees
            );
            if lost > 0 {
                let _ = writeln!(
                    self.out,
                    "== {lost} events lost (ring buffer full): the ledger is incomplete"
                );
            }
        }
        let _ = self.out.flush();
    }

    fn flush(&mut self) {
        let _ = self.out.flush();
    }

    fn blocks(&mut self, snap: &HeapSnapshot) {
        self.end_block_sites = snap.sites.clone();
    }

    fn stacks(&mut self, snap: &HeapSnapshot, end: bool) {
        if end {
            self.end_sites = snap.sites.clone();
        }
        if !self.show_stacks {
            return;
        }
        let sites = &snap.sites[..snap.sites.len().min(self.top)];
        let more_sites = snap.more_sites + (snap.sites.len() - sites.len());
        if self.json {
            let v = json!({ "type": "stacks", "pid": self.pid, "end": end,
                "live_bytes": snap.live_bytes, "sites": sites, "more_sites": more_sites });
            let _ = writeln!(self.out, "{v}");
        } else {
            use std::fmt::Write as _;
            let mut t = String::new();
            for site in sites {
                let _ = writeln!(
                    t,
                    "   {:>10}  {}",
                    bytes(site.live_bytes),
                    crate::explain::frame_chain(&site.frames)
                );
            }
            if more_sites > 0 {
                let _ = writeln!(t, "   ({more_sites} more stacks)");
            }
            if end || t != self.last_stacks {
                let _ = write!(
                    self.out,
                    "-- pid {}: {} of device memory by stack{}\n{t}",
                    self.pid,
                    bytes(snap.live_bytes),
                    if end { " (at the end)" } else { "" }
                );
                self.last_stacks = t;
            }
        }
        let _ = self.out.flush();
    }
}

/// Runs `attach` (without `--host`).
pub fn run(args: AttachArgs) -> anyhow::Result<ExitCode> {
    if args.sample_bytes > crate::probes::heap::MAX_SAMPLE_BYTES {
        anyhow::bail!(
            "--sample-bytes must be at most {}",
            bytes(crate::probes::heap::MAX_SAMPLE_BYTES)
        );
    }
    let comm = comm_of(args.pid)?;
    // Refused now, not after the session: a link or another user's file.
    for path in [&args.pprof, &args.snapshot].into_iter().flatten() {
        crate::util::fsafe::check_file(path)?;
    }
    crate::probes::caps::require_bpf()?;
    let pidfd = pidfd(args.pid)?;
    let probes = cuda_live::load(args.pid, &comm, &pidfd, args.floor, args.wait)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let follow = Target {
        pid: args.pid,
        comm: comm.clone(),
        pidfd,
        floor: args.floor,
        entry_sites: args.entry_sites,
        duration: args.duration,
    };
    let printer = Printer {
        pid: args.pid,
        json: args.json,
        summary_only: args.summary_only,
        last_stacks: String::new(),
        show_stacks: args.by == Some(By::Stack),
        top: args.top,
        end_sites: Vec::new(),
        end_block_sites: Vec::new(),
        exports: Exports {
            snapshot: args.snapshot.clone(),
            pprof: args.pprof.clone(),
            what: format!("pid {} ({comm})", args.pid),
            sample_bytes: args.sample_bytes,
            error: None,
        },
        out: std::io::stdout().lock(),
    };
    // The exports take every stack; the view shows --top of them.
    let exporting = args.pprof.is_some() || args.snapshot.is_some();
    let by_stack = (args.by == Some(By::Stack) || exporting).then_some(cuda_live::Stacks {
        top: if exporting { usize::MAX } else { args.top },
        sample_bytes: args.sample_bytes,
    });
    let printer = rt.block_on(cuda_live::follow(follow, probes, printer, by_stack))?;
    match printer.exports.error {
        Some(e) => Err(e),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Writes `--snapshot` and `--pprof` of the ledger and the stacks at the end.
fn write_exports(
    e: &Exports,
    ledger: &Ledger,
    sites: &[HeapSite],
    block_sites: &[HeapSite],
) -> anyhow::Result<()> {
    if let Some(path) = &e.snapshot {
        let input = crate::export::torch_snapshot::Input::live(ledger, sites, block_sites);
        crate::util::fsafe::write_private(path, &crate::export::torch_snapshot::pickle(&input)?)?;
        crate::say!(
            "tracer: PyTorch memory snapshot ({} segments, {}) written to {}",
            input.segments.len(),
            crate::util::units::bytes(input.held_bytes()),
            path.display()
        );
    }
    if let Some(path) = &e.pprof {
        let when = crate::util::time::wall_now_ns();
        write_device_pprof(path, sites, &e.what, e.sample_bytes, when)?;
    }
    Ok(())
}

/// The device memory by stack as a pprof profile: bytes held (exact for
/// allocations of 1 MiB or more, estimated from samples taken once per
/// `sample_bytes` below) and the samples that make them up.
pub fn write_device_pprof(
    path: &std::path::Path,
    sites: &[HeapSite],
    what: &str,
    sample_bytes: u64,
    time_ns: i64,
) -> anyhow::Result<()> {
    use crate::export::pprof::{Meta, Stack, sampling, write};
    let meta = Meta {
        sample_types: &[("inuse_space", "bytes"), ("samples", "count")],
        period: ("space", "bytes", sample_bytes),
        time_ns,
        duration_ns: 0,
        comments: vec![format!(
            "tracer: the device memory of {what} by stack (every allocation of {} or more, {} below)",
            bytes(tracer_common::cuda::STACK_MIN_BYTES),
            sampling(sample_bytes, "allocated", "every one")
        )],
    };
    let stacks = sites.iter().map(|s| Stack {
        frames: &s.frames,
        values: vec![s.live_bytes as i64, s.live_samples as i64],
        process: None,
    });
    write(path, &meta, stacks, "device memory")
}
