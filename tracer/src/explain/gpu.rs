//! `explain --gpu-oom`: a CUDA allocation that failed for lack of GPU memory.

use std::fmt::Write as _;

use serde::Serialize;

use crate::util::units::bytes;
use crate::{
    model::ledger::{AllocKind, LedgerSummary},
    record::GpuOomRecord,
    util::time::format_wall,
};

/// A GPU OOM with what explain says of it.
#[derive(Clone, Debug, Serialize)]
pub struct GpuOomExplanation {
    /// Store id.
    pub id: i64,
    /// The record.
    pub gpu_oom: GpuOomRecord,
    /// The short answer.
    pub verdict: String,
}

/// `device 1.0 GiB, managed 0 B, ...` for a ledger.
pub fn held_by_kind(l: &LedgerSummary) -> String {
    AllocKind::ALL
        .iter()
        .map(|k| {
            format!(
                "{} {}",
                k.name(),
                bytes(l.by_kind.get(k).map(|t| t.outstanding).unwrap_or(0))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decides who filled the device, in the three answers a GPU team asks
/// for: the device is full of other processes; this process holds it in
/// live tensors; or this process reserved it but its caching allocator has
/// it free, in pieces too small for the request (fragmentation). Who holds
/// what comes from NVML's picture when there is one (every process, traced
/// or not), else from the traced ledgers; live tensors against reserved
/// memory from the allocator's probes.
pub fn verdict(r: &GpuOomRecord) -> String {
    let mut v = held_verdict(r);
    // The code that holds the process's device memory, where its
    // allocations carried their stacks.
    let by_stack: Vec<String> = r
        .stacks
        .iter()
        .take(2)
        .map(|s| {
            format!(
                "{} from {}",
                bytes(s.live_bytes),
                super::frame_chain(&s.frames)
            )
        })
        .collect();
    if !by_stack.is_empty() {
        v.push_str(&format!(
            "; its device memory by stack: {}",
            by_stack.join(", ")
        ));
    }
    v
}

/// The verdict of who held the device.
fn held_verdict(r: &GpuOomRecord) -> String {
    if let Some(n) = &r.nvml
        && let Some(top) = n.processes.first()
    {
        if top.pid == r.process.pid
            && let Some(v) = own_verdict(r)
        {
            return v;
        }
        let traced = |v: Option<u64>| v.map(bytes).unwrap_or_else(|| "not traced".into());
        let container = n.containers.first().map(|c| {
            format!(
                "; the container holding the most is {} with {} per NVML ({:.0}% of the GPU), {} traced",
                c.name,
                bytes(c.nvml_used),
                c.share_pct,
                bytes(c.traced_device)
            )
        });
        let who = if top.pid == r.process.pid {
            "the process itself holds the most"
        } else {
            "the device is full of other processes: another process holds the most"
        };
        return format!(
            "{who} on device {}: {} (pid {}) with {} per NVML, {} by its traced calls{}; the request for {} did not fit in {} free",
            n.device,
            top.comm,
            top.pid,
            top.nvml_used.map(bytes).unwrap_or_else(|| "?".into()),
            traced(top.traced_device),
            container.unwrap_or_default(),
            bytes(r.size),
            bytes(n.free)
        );
    }
    traced_verdict(r)
}

/// The answer when the process itself holds the most and its caching
/// allocator's probes were seen: live tensors, or fragmentation.
fn own_verdict(r: &GpuOomRecord) -> Option<String> {
    Some(allocator_verdict(r.held.allocator.as_ref()?, r.size))
}

/// Live tensors or fragmentation, from a caching allocator's figures at a
/// failed request for `size` bytes.
pub fn allocator_verdict(a: &crate::model::ledger::AllocatorSummary, size: u64) -> String {
    if a.free_in_cache >= size {
        let largest = a
            .largest_free_block
            .map(|b| format!(", the largest free block {}", bytes(b)))
            .unwrap_or_default();
        return format!(
            "this process reserved it but has not allocated it: fragmentation ({} reserved and free inside the allocator, {} of {} reserved in live tensors{largest}; with no free block to fit, it asked CUDA for {} more); try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or a smaller max_split_size_mb",
            bytes(a.free_in_cache),
            bytes(a.allocated),
            bytes(a.reserved),
            bytes(size)
        );
    }
    format!(
        "this process holds it in live tensors: {} allocated of {} reserved ({} free in its allocator's cache); the request for {} did not fit",
        bytes(a.allocated),
        bytes(a.reserved),
        bytes(a.free_in_cache),
        bytes(size)
    )
}

fn traced_verdict(r: &GpuOomRecord) -> String {
    let own = r.held.by_device.get(&r.device).copied().unwrap_or(0);
    let dev = if r.device >= 0 {
        format!("device {}", r.device)
    } else {
        "the device".to_string()
    };
    match r.others.first() {
        Some(o) if o.device_bytes > own => format!(
            "the device is full of other processes: another process holds the most on {dev}: {} (pid {}) with {}, this one {}; the request for {} did not fit",
            o.process.comm,
            o.process.pid,
            bytes(o.device_bytes),
            bytes(own),
            bytes(r.size)
        ),
        _ => {
            if let Some(v) = own_verdict(r) {
                return v;
            }
            let rest: u64 = r.others.iter().map(|o| o.device_bytes).sum();
            format!(
                "the process's own allocations filled {dev}: it held {} (traced), other traced processes {}; the request for {} did not fit",
                bytes(own),
                bytes(rest),
                bytes(r.size)
            )
        }
    }
}

/// `allocated 1.0 GiB of 3.0 GiB reserved (peak ...), ...` for a caching
/// allocator's figures.
pub fn allocator_line(a: &crate::model::ledger::AllocatorSummary) -> String {
    let ratio = a
        .fragmentation
        .map(|f| format!(", reserved/allocated {f:.2}"))
        .unwrap_or_default();
    let largest = a
        .largest_free_block
        .map(|b| format!(", largest free block {}", bytes(b)))
        .unwrap_or_default();
    format!(
        "{} allocated in {} blocks of {} reserved (peaks {} and {}); {} free in its cache{ratio}{largest}",
        bytes(a.allocated),
        a.blocks,
        bytes(a.reserved),
        bytes(a.peak_allocated),
        bytes(a.peak_reserved),
        bytes(a.free_in_cache)
    )
}

/// Renders one GPU OOM as text.
pub fn render(e: &GpuOomExplanation) -> String {
    let r = &e.gpu_oom;
    let p = &r.process;
    let mut o = String::new();
    let dev = if r.device >= 0 {
        format!(" on device {}", r.device)
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "{} GPU out of memory: {} (pid {}) asked {} for {}{dev}",
        format_wall(r.ts_ns),
        p.comm,
        p.pid,
        r.function,
        bytes(r.size)
    );
    let _ = writeln!(o);
    let owner = super::owner_tag(p.owner.as_ref());
    let _ = writeln!(
        o,
        "  process    {} (pid {}, thread {}){owner}",
        p.comm, p.pid, r.tid
    );
    if let Some(c) = &p.cmdline {
        let _ = writeln!(o, "  command    {}", super::one_line(c, 200));
    }
    let kind = r.kind.map(|k| k.name()).unwrap_or("memory");
    let _ = writeln!(
        o,
        "  request    {} of {kind}{dev}: error {} (out of memory)",
        bytes(r.size),
        r.ret
    );
    let h = &r.held;
    let _ = writeln!(
        o,
        "  held       {} = {} in {} allocations (peak {})",
        held_by_kind(h),
        bytes(h.total_bytes),
        h.live_allocations,
        bytes(h.peak_total_bytes)
    );
    if let Some(a) = &h.allocator {
        let _ = writeln!(o, "  allocator  {}", allocator_line(a));
    }
    for a in &h.largest {
        let _ = writeln!(
            o,
            "             {:>10}  {:<12}  {} at {}",
            bytes(a.size),
            a.kind.name(),
            a.function,
            format_wall(a.ts_ns)
        );
    }
    if !h.recent.is_empty() {
        let _ = writeln!(o, "  recent calls:");
        for c in &h.recent {
            let res = if c.ret == 0 {
                "ok".to_string()
            } else {
                format!("error {}", c.ret)
            };
            let _ = writeln!(
                o,
                "    {:+.3}s  {:<24} {:>10}  {res}",
                (c.ts_ns - r.ts_ns) as f64 / 1e9,
                c.function,
                bytes(c.size)
            );
        }
    }
    if r.others.is_empty() {
        let _ = writeln!(o, "  others     no other traced process holds memory{dev}");
    } else {
        let _ = writeln!(o, "  others{dev}:");
        let _ = writeln!(o, "    {:>8}  {:>12}  NAME", "PID", "ON DEVICE");
        for x in &r.others {
            let owner = super::owner_tag(x.process.owner.as_ref());
            let _ = writeln!(
                o,
                "    {:>8}  {:>12}  {}{owner}",
                x.process.pid,
                bytes(x.device_bytes),
                x.process.comm
            );
        }
    }
    if let Some(n) = &r.nvml {
        let _ = writeln!(o);
        render_picture(&mut o, n, r.ts_ns, Some(p.pid));
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "  verdict    {}", e.verdict);
    for g in &r.gaps {
        let _ = writeln!(o, "  not known  {g}");
    }
    let _ = writeln!(
        o,
        "  not known  memory the driver uses outside traced calls (contexts, other libraries) is not counted"
    );
    o
}

/// NVML's picture of one device: used memory, every process with NVML's
/// and the traced figures side by side, and the containers.
pub fn render_picture(
    o: &mut String,
    n: &crate::record::DevicePicture,
    at_ns: i64,
    mark: Option<u32>,
) {
    let age = (at_ns - n.ts_ns) as f64 / 1e9;
    let when = if age >= 0.0 {
        format!("{age:.1} s before")
    } else {
        format!("{:.1} s after", -age)
    };
    let _ = writeln!(
        o,
        "  gpu {}      NVML: {} used of {}, {} free (sampled {when})",
        n.device,
        bytes(n.used),
        bytes(n.total),
        bytes(n.free)
    );
    let opt = |v: Option<u64>| v.map(bytes).unwrap_or_else(|| "-".into());
    let _ = writeln!(
        o,
        "    {:>8}  {:>10}  {:>10}  {:>11}  {:<28}  NAME",
        "PID", "NVML", "TRACED", "UNEXPLAINED", "CONTAINER"
    );
    for p in &n.processes {
        let m = if mark == Some(p.pid) { "  <-" } else { "" };
        let _ = writeln!(
            o,
            "    {:>8}  {:>10}  {:>10}  {:>11}  {:<28}  {}{m}",
            p.pid,
            opt(p.nvml_used),
            opt(p.traced_device),
            opt(p.unexplained),
            short(
                p.container.as_deref().or(p.memcg.as_deref()).unwrap_or("-"),
                28
            ),
            p.comm
        );
    }
    for x in &n.xids {
        let pid = x.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
        let _ = writeln!(
            o,
            "    Xid {} at {}{pid}: {}",
            x.code,
            format_wall(x.ts_ns),
            x.message
        );
    }
    for c in &n.containers {
        let _ = writeln!(
            o,
            "    container {}: {} per NVML ({:.1}% of the GPU), {} traced",
            c.name,
            bytes(c.nvml_used),
            c.share_pct,
            bytes(c.traced_device)
        );
    }
}

/// `s` cut to its last `max` characters (cgroup paths end in what matters).
pub fn short(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        format!("...{}", s.chars().skip(n - max + 3).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::ledger::Ledger,
        record::{GpuHolder, ProcRef},
    };
    use tracer_common::{CudaCall, cuda};

    const MIB: u64 = 1 << 20;

    fn malloc(l: &mut Ledger, size: u64, ptr: u64) {
        l.apply(
            &CudaCall {
                func: cuda::MALLOC,
                size,
                ptr,
                device: 0,
                ..Default::default()
            },
            1,
        );
    }

    fn oom(held: &Ledger, size: u64, others: Vec<GpuHolder>) -> GpuOomRecord {
        GpuOomRecord {
            process: ProcRef {
                pid: 7,
                comm: "python3".into(),
                ..Default::default()
            },
            function: "cudaMalloc".into(),
            size,
            device: 0,
            ret: 2,
            held: held.summary(),
            others,
            ..Default::default()
        }
    }

    #[test]
    fn a_gpu_oom_is_other_processes_live_tensors_or_fragmentation() {
        // Two 20 MiB segments, each with a 2 MiB block at every other 2 MiB
        // (2..4, 6..8, ..., 18..20): 20 MiB of 40 MiB in live tensors, 20 MiB
        // free in ten 2 MiB pieces.
        let mut frag = Ledger::default();
        malloc(&mut frag, 20 * MIB, 0x1000_0000);
        malloc(&mut frag, 20 * MIB, 0x2000_0000);
        for seg in [0x1000_0000u64, 0x2000_0000] {
            for i in 0..5 {
                frag.block_malloc(seg + i * 4 * MIB + 2 * MIB, 2 * MIB, 0);
            }
        }
        let v = verdict(&oom(&frag, 8 * MIB, vec![]));
        assert!(
            v.starts_with("this process reserved it but has not allocated it: fragmentation (20.0 MiB reserved and free inside the allocator, 20.0 MiB of 40.0 MiB reserved in live tensors, the largest free block 2.0 MiB"),
            "{v}"
        );
        assert!(
            v.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
            "{v}"
        );

        let mut full = Ledger::default();
        malloc(&mut full, 20 * MIB, 0x1000_0000);
        full.block_malloc(0x1000_0000, 19 * MIB, 0);
        let v = verdict(&oom(&full, 8 * MIB, vec![]));
        assert!(
            v.starts_with("this process holds it in live tensors: 19.0 MiB allocated of 20.0 MiB reserved (1.0 MiB free"),
            "{v}"
        );

        let mut big = Ledger::default();
        malloc(&mut big, 60 * MIB, 0x3000_0000);
        let other = GpuHolder {
            process: ProcRef {
                pid: 9,
                comm: "trainer".into(),
                ..Default::default()
            },
            device_bytes: 60 * MIB,
            ledger: big.summary(),
        };
        let v = verdict(&oom(&frag, 8 * MIB, vec![other]));
        assert!(
            v.starts_with("the device is full of other processes: another process holds the most on device 0: trainer (pid 9) with 60.0 MiB, this one 40.0 MiB"),
            "{v}"
        );
        // Without the allocator's probes: what the ledgers say, as before.
        let mut plain = Ledger::default();
        malloc(&mut plain, 20 * MIB, 0x1000_0000);
        let v = verdict(&oom(&plain, 8 * MIB, vec![]));
        assert!(
            v.starts_with("the process's own allocations filled device 0"),
            "{v}"
        );
        let text = allocator_line(&frag.allocator().unwrap());
        assert_eq!(
            text,
            "20.0 MiB allocated in 10 blocks of 40.0 MiB reserved (peaks 20.0 MiB and 40.0 MiB); 20.0 MiB free in its cache, reserved/allocated 2.00, largest free block 2.0 MiB"
        );
    }
}
