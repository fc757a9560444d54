//! Test fixtures shared by the correlators' and the recorder's tests:
//! probe records through the real decoder, kernel reports through the real
//! kmsg parser, a fixed clock and a node where every process is gone.

use tracer_common::{CudaCall, EventHeader, OomVictim, kind, victim_field};

use crate::{
    collect::{
        decode::{Event, as_bytes, comm, decode},
        kmsg::{Assembler, KmsgEvent, OomReport, parse_record},
    },
    model::{ProcessTable, cgroup::CgroupLayout, sampler::Sampler},
    util::time::Clock,
};

/// Every process is gone by the time a record is built.
pub struct Gone;
impl crate::model::proc::ProcFacts for Gone {
    fn status_mem(&self, _pid: u32) -> Option<crate::model::proc::StatusMem> {
        None
    }
}

/// Wall = monotonic + 0 and boot + 0: kmsg µs and probe ns line up.
pub const CLOCK: Clock = Clock::fixed(0, 0);
/// The probes started attaching at 1 s.
pub const START_NS: i64 = 1_000_000_000;

/// `oom:mark_victim` of `pid` at `ts_ns`, as the probe writes it,
/// through the real decoder.
pub fn victim_event(pid: u32, ts_ns: u64) -> OomVictim {
    let ev = OomVictim {
        header: EventHeader {
            kind: kind::OOM_VICTIM,
            ts_boot_ns: ts_ns,
            pid,
            tid: pid,
            comm: comm("python3"),
            ..Default::default()
        },
        victim_pid: pid,
        anon_rss_kb: 60_000,
        present: victim_field::RSS | victim_field::COMM,
        victim_comm: comm("python3"),
        ..Default::default()
    };
    match decode(&as_bytes(&ev)).expect("decodes") {
        Event::OomVictim(v) => v,
        other => panic!("{other:?}"),
    }
}

/// The kernel's report of a memcg OOM kill of `pid` in `memcg`, as
/// /dev/kmsg records at `ts_us`, through the real parser.
pub fn report(pid: u32, memcg: &str, ts_us: u64) -> OomReport {
    let lines = [
        "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"
            .to_string(),
        "memory: usage 65536kB, limit 65536kB, failcnt 12".to_string(),
        format!("Memory cgroup stats for {memcg}:"),
        "anon 66736128".to_string(),
        format!(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={memcg},task_memcg={memcg},task=python3,pid={pid},uid=0"
        ),
        format!(
            "Memory cgroup out of memory: Killed process {pid} (python3) total-vm:75160kB, anon-rss:65152kB, file-rss:2648kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0"
        ),
    ];
    let mut asm = Assembler::default();
    let mut out = None;
    for (i, l) in lines.iter().enumerate() {
        let rec = parse_record(&format!("3,{i},{ts_us},-;{l}")).unwrap();
        if let Some(KmsgEvent::Report(r)) = asm.push(&rec) {
            out = Some(*r);
        }
    }
    out.expect("a whole report")
}

/// An empty node: no process, no cgroup sample.
pub struct World {
    /// The process model.
    pub model: ProcessTable,
    /// The cgroup sampler.
    pub sampler: Sampler,
}

impl Default for World {
    /// A node with nothing on it.
    fn default() -> Self {
        Self {
            model: ProcessTable::new(CgroupLayout::default(), 0, 16),
            sampler: Sampler::new(CgroupLayout::default(), 0, Vec::new()),
        }
    }
}

/// A returned CUDA call as the uretprobe writes it, through the real decoder.
pub fn cuda_call(pid: u32, func: u32, ret: i32, size: u64, ptr: u64, device: i32) -> CudaCall {
    let ev = CudaCall {
        header: EventHeader {
            kind: kind::CUDA_CALL,
            pid,
            tid: pid,
            comm: comm("python3"),
            ..Default::default()
        },
        func,
        ret,
        size,
        ptr,
        device,
        ..Default::default()
    };
    match decode(&as_bytes(&ev)).expect("decodes") {
        Event::Cuda(c) => c,
        other => panic!("{other:?}"),
    }
}
