//! `tracer attach --pid N`: CUDA allocation calls of a running process,
//! live, without restarting, stopping or signalling it (uprobes only).
//! With `--host`, its heap instead (see [`super::attach_host`]).

use std::{io::Write as _, os::fd::OwnedFd, process::ExitCode, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;
use tracer_common::{CudaCall, cuda, usdt::UsdtEvent};

use crate::recorder::live::{
    Ends, RESCAN,
    attached::{AllocatorProbes, Attached},
    comm_of, drain, first_libraries, pidfd, start_readers,
};
use crate::{
    collect::decode::Event,
    model::ledger::{AllocKind, Change, Ledger},
    probes::{CUDA_DATA_RING_BYTES, Probes, cuda::name, uprobe::CUDA},
    util::time::{Clock, format_wall},
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
    /// (0 keeps every allocation: exact, slower).
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

struct Session {
    pid: u32,
    json: bool,
    summary_only: bool,
    ledger: Ledger,
    clock: Clock,
    calls_this_second: u64,
    failed_this_second: u64,
    quiet_seconds: u32,
    out: std::io::StdoutLock<'static>,
}

/// An event of the traced process waiting to be put in order: the CUDA
/// calls and the allocator's probes come through two rings.
enum Pending {
    Call(CudaCall),
    Block(UsdtEvent),
}

impl Pending {
    fn ts(&self) -> u64 {
        match self {
            Pending::Call(c) => c.header.ts_boot_ns,
            Pending::Block(b) => b.header.ts_boot_ns,
        }
    }

    /// The traced process's CUDA calls and allocator probes.
    fn of(ev: Event, pid: u32) -> Option<Self> {
        match ev {
            Event::Cuda(c) if c.header.pid == pid => Some(Pending::Call(c)),
            Event::Usdt(u) if u.header.pid == pid => Some(Pending::Block(u)),
            _ => None,
        }
    }
}

impl Session {
    /// Applies and shows buffered events, oldest first.
    fn calls(&mut self, pending: &mut Vec<Pending>) {
        pending.sort_by_key(Pending::ts);
        for p in pending.drain(..) {
            match p {
                Pending::Call(c) => self.call(&c),
                Pending::Block(b) => self.block(&b),
            }
        }
        let _ = self.out.flush();
    }

    /// A caching allocator's block handed out or given back.
    fn block(&mut self, b: &UsdtEvent) {
        crate::correlate::cuda::apply_block(&mut self.ledger, b);
        self.calls_this_second += 1;
        if self.summary_only {
            return;
        }
        let ts = self.clock.boot_to_wall(b.header.ts_boot_ns);
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

    fn call(&mut self, c: &CudaCall) {
        let ts = self.clock.boot_to_wall(c.header.ts_boot_ns);
        let change = self.ledger.apply(c, ts);
        self.calls_this_second += 1;
        if matches!(change, Change::Failed(..)) {
            self.failed_this_second += 1;
        }
        if let Change::Failed(_, size, cuda::OUT_OF_MEMORY) = change
            && let Some(a) = self.ledger.allocator()
        {
            // What the allocator's figures say of this process's share;
            // other processes on the device are not seen from here.
            let v = crate::explain::gpu::allocator_verdict(&a, size);
            if self.json {
                let j = json!({ "type": "gpu_oom", "time": format_wall(ts), "pid": c.header.pid,
                    "function": name(c.func), "size": size, "allocator": a, "verdict": v });
                let _ = writeln!(self.out, "{j}");
            } else {
                let _ = writeln!(self.out, "-- GPU out of memory in {}: {v}", name(c.func));
            }
        }
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

    /// The per-second summary: printed when there were calls, and every
    /// 10 s of quiet as a heartbeat.
    fn summary(&mut self) {
        if self.calls_this_second == 0 && self.quiet_seconds < 9 {
            self.quiet_seconds += 1;
            return;
        }
        self.quiet_seconds = 0;
        let s = self.ledger.summary();
        if self.json {
            let v = json!({ "type": "summary", "time": format_wall(crate::util::time::wall_now_ns()), "pid": self.pid,
                "calls_per_s": self.calls_this_second, "failed_per_s": self.failed_this_second, "ledger": s });
            let _ = writeln!(self.out, "{v}");
        } else {
            let kinds: Vec<String> = AllocKind::ALL
                .iter()
                .map(|k| format!("{} {}", k.name(), bytes(self.ledger.outstanding(*k))))
                .collect();
            let _ = writeln!(
                self.out,
                "-- pid {}: {}; total {} (peak {}); {} calls/s, {} failed",
                self.pid,
                kinds.join(", "),
                bytes(s.total_bytes),
                bytes(s.peak_total_bytes),
                self.calls_this_second,
                self.failed_this_second
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
        self.calls_this_second = 0;
        self.failed_this_second = 0;
        let _ = self.out.flush();
    }

    fn report(&mut self, exited: bool, lost: u64) {
        let s = self.ledger.summary();
        let live = self.ledger.live();
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
}

/// Runs `attach`.
pub fn run(args: AttachArgs) -> anyhow::Result<ExitCode> {
    if args.host {
        return super::attach_host::run(args);
    }
    let comm = comm_of(args.pid)?;
    crate::probes::caps::require_bpf()?;
    let pidfd = pidfd(args.pid)?;
    let mut probes = Probes::load(CUDA_DATA_RING_BYTES).context("cannot attach")?;
    probes.load_family(&CUDA, args.floor)?;
    let libs = first_libraries(&CUDA, args.pid, &comm, &pidfd)?;
    if libs.is_empty() && !args.wait {
        bail!(
            "pid {} ({comm}) has no CUDA library loaded: none of its mapped files is a libcudart or libcuda, \
             and its executable has no cudart linked in; pass --wait to wait for one",
            args.pid
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(attach(args, comm, probes, pidfd))
}

async fn attach(
    args: AttachArgs,
    comm: String,
    mut probes: Probes,
    pidfd: OwnedFd,
) -> anyhow::Result<ExitCode> {
    let (mut rx, mut tasks, drops) = start_readers(&mut probes, 65536)?;
    let mut attached = Attached::new(&CUDA, args.pid, args.floor, args.entry_sites);
    attached.scan(&mut probes)?;
    // The caching allocator's USDT probes (PyTorch's), where the process has them.
    let mut allocator = if args.floor {
        None
    } else {
        probes.load_usdt()?;
        let mut a = AllocatorProbes::new(args.pid);
        a.scan(&mut probes)?;
        Some(a)
    };
    match attached.counts() {
        (_, 0) => crate::say!(
            "tracer: pid {} ({comm}) has no CUDA library yet; waiting for one to be loaded",
            args.pid
        ),
        (functions, files) => crate::say!(
            "tracer: tracing pid {} ({comm}): {functions} functions in {files} files",
            args.pid
        ),
    }

    let mut session = Session {
        pid: args.pid,
        json: args.json,
        summary_only: args.summary_only,
        ledger: Ledger::default(),
        clock: Clock::now(),
        calls_this_second: 0,
        failed_this_second: 0,
        quiet_seconds: 0,
        out: std::io::stdout().lock(),
    };
    let mut ends = Ends::new(pidfd, args.duration)?;
    let mut summary = tokio::time::interval(Duration::from_secs(1));
    summary.reset();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.reset();
    // The two rings are read separately; a short buffer puts calls back
    // in the order they happened before they are shown.
    let mut pending: Vec<Pending> = Vec::new();
    let mut reorder = tokio::time::interval(Duration::from_millis(20));
    let exited = loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => pending.extend(Pending::of(ev, args.pid)),
                None => return Err(anyhow!("the ring buffer readers stopped")),
            },
            _ = reorder.tick() => session.calls(&mut pending),
            _ = summary.tick() => {
                session.calls(&mut pending);
                session.summary();
            }
            _ = rescan.tick() => {
                attached.scan(&mut probes)?;
                if let Some(a) = &mut allocator {
                    a.scan(&mut probes)?;
                }
            }
            end = ends.wait() => break end?,
            Some(r) = tasks.join_next() => {
                r??;
                return Err(anyhow!("a ring buffer reader stopped"));
            }
        }
    };
    drain(&mut rx, &mut tasks, |ev| {
        pending.extend(Pending::of(ev, args.pid))
    })
    .await;
    session.calls(&mut pending);
    let lost = drops.read().map(|d| d.critical + d.data).unwrap_or(0);
    session.summary();
    session.report(exited, lost);
    // Report first: removing a library's worth of probes takes seconds.
    if let Some(a) = allocator {
        a.detach(&mut probes);
    }
    attached.detach(&mut probes);
    Ok(ExitCode::SUCCESS)
}
