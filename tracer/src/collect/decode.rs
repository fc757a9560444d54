//! Turns ring buffer records into typed events: length and kind checked,
//! every unknown thing a typed error. The only place that reads wire bytes.

use serde_json::{Value, json};
use tracer_common::{
    CGROUP_PATH_LEN, COMM_LEN, CgroupDir, CudaCall, EventHeader, MAX_EVENT_SIZE, MemcgEvent,
    OomVictim, ProcExec, ProcExit, ProcFork, Reap, SignalKill, WireEvent,
    growth::{GrowthReturn, GrowthSample},
    heap::{HeapAlloc, HeapFree},
    kind,
    usdt::UsdtEvent,
    victim_field,
};

/// A record that is not a valid event.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than a header, or longer than any event.
    #[error("record of {len} bytes is not an event")]
    BadSize {
        /// Record length.
        len: usize,
    },
    /// A kind this build does not know (the object and binary disagree).
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
    /// The length does not match the kind's struct.
    #[error("event kind {kind} has {len} bytes, expected {expected}")]
    Length {
        /// Kind.
        kind: u32,
        /// Record length.
        len: usize,
        /// The struct size.
        expected: usize,
    },
}

/// The kinds of events, on the user side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The kernel OOM killer picked a victim.
    OomVictim,
    /// The OOM reaper started on a victim.
    ReapStart,
    /// The OOM reaper finished a victim.
    ReapFinish,
    /// A memcg OOM-kill counter moved.
    MemcgOom,
    /// A program was exec'd.
    Exec,
    /// A process was forked.
    Fork,
    /// A process exited.
    Exit,
    /// A SIGKILL was sent.
    SignalKill,
    /// A CUDA allocation API call returned.
    CudaCall,
    /// A sampled heap allocation.
    HeapAlloc,
    /// A sampled heap block freed.
    HeapFree,
    /// A sampled page fault (growth attribution).
    GrowthFault,
    /// A followed process gave a range back (growth attribution).
    GrowthReturn,
    /// The stack of the allocation that tipped an OOM kill.
    OomTip,
    /// The stack of a CUDA allocation.
    CudaStack,
    /// A USDT probe fired.
    Usdt,
    /// A cgroup was made.
    CgroupMkdir,
    /// A cgroup was removed.
    CgroupRmdir,
}

impl TryFrom<u32> for EventKind {
    type Error = DecodeError;
    fn try_from(v: u32) -> Result<Self, DecodeError> {
        Ok(match v {
            kind::OOM_VICTIM => Self::OomVictim,
            kind::REAP_START => Self::ReapStart,
            kind::REAP_FINISH => Self::ReapFinish,
            kind::MEMCG_OOM => Self::MemcgOom,
            kind::PROC_EXEC => Self::Exec,
            kind::PROC_FORK => Self::Fork,
            kind::PROC_EXIT => Self::Exit,
            kind::SIGNAL_KILL => Self::SignalKill,
            kind::CUDA_CALL => Self::CudaCall,
            kind::HEAP_ALLOC => Self::HeapAlloc,
            kind::HEAP_FREE => Self::HeapFree,
            kind::GROWTH_FAULT => Self::GrowthFault,
            kind::GROWTH_RETURN => Self::GrowthReturn,
            kind::OOM_TIP => Self::OomTip,
            kind::CUDA_STACK => Self::CudaStack,
            kind::USDT => Self::Usdt,
            kind::CGROUP_MKDIR => Self::CgroupMkdir,
            kind::CGROUP_RMDIR => Self::CgroupRmdir,
            other => return Err(DecodeError::UnknownKind(other)),
        })
    }
}

impl EventKind {
    /// Its value on the wire.
    pub fn id(self) -> u32 {
        match self {
            Self::OomVictim => kind::OOM_VICTIM,
            Self::ReapStart => kind::REAP_START,
            Self::ReapFinish => kind::REAP_FINISH,
            Self::MemcgOom => kind::MEMCG_OOM,
            Self::Exec => kind::PROC_EXEC,
            Self::Fork => kind::PROC_FORK,
            Self::Exit => kind::PROC_EXIT,
            Self::SignalKill => kind::SIGNAL_KILL,
            Self::CudaCall => kind::CUDA_CALL,
            Self::HeapAlloc => kind::HEAP_ALLOC,
            Self::HeapFree => kind::HEAP_FREE,
            Self::GrowthFault => kind::GROWTH_FAULT,
            Self::GrowthReturn => kind::GROWTH_RETURN,
            Self::OomTip => kind::OOM_TIP,
            Self::CudaStack => kind::CUDA_STACK,
            Self::Usdt => kind::USDT,
            Self::CgroupMkdir => kind::CGROUP_MKDIR,
            Self::CgroupRmdir => kind::CGROUP_RMDIR,
        }
    }

    /// Stable name, used in the store and in JSON (tracer-common's
    /// registry has it).
    pub fn name(self) -> &'static str {
        tracer_common::wire::kind_info(self.id()).map_or("?", |k| k.name)
    }
}

/// A decoded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `oom:mark_victim`.
    OomVictim(OomVictim),
    /// `oom:start_task_reaping` / `finish_task_reaping`.
    Reap(Reap),
    /// `memcg:count_memcg_events` for OOM_KILL (no program sends it now).
    MemcgOom(MemcgEvent),
    /// `sched:sched_process_exec`.
    Exec(Box<ProcExec>),
    /// New process.
    Fork(ProcFork),
    /// Process exit.
    Exit(ProcExit),
    /// SIGKILL sent.
    SignalKill(SignalKill),
    /// CUDA call returned.
    Cuda(CudaCall),
    /// A sampled heap allocation, with its stack.
    HeapAlloc(Box<HeapAlloc>),
    /// A sampled heap block freed.
    HeapFree(HeapFree),
    /// A sampled page fault, with its stack.
    GrowthFault(Box<GrowthSample>),
    /// A range a followed process gave back.
    GrowthReturn(GrowthReturn),
    /// The stack of the task whose allocation tipped an OOM kill.
    OomTip(Box<GrowthSample>),
    /// The stack of a CUDA allocation (`addr`: the device pointer).
    CudaStack(Box<HeapAlloc>),
    /// A USDT probe fired.
    Usdt(UsdtEvent),
    /// `cgroup:cgroup_mkdir` / `cgroup_rmdir` (the kind says which).
    CgroupDir(Box<CgroupDir>),
}

/// Reads a `T` from the start of `bytes`; the caller checked the length.
fn read<T: WireEvent>(bytes: &[u8]) -> T {
    tracer_common::wire::read(bytes).expect("the length was checked")
}

/// Decodes one ring buffer record.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    if bytes.len() < size_of::<EventHeader>() || bytes.len() > MAX_EVENT_SIZE {
        return Err(DecodeError::BadSize { len: bytes.len() });
    }
    let header: EventHeader = read(bytes);
    let kind = EventKind::try_from(header.kind)?;
    let expect = |size: usize| {
        if bytes.len() == size {
            Ok(())
        } else {
            Err(DecodeError::Length {
                kind: header.kind,
                len: bytes.len(),
                expected: size,
            })
        }
    };
    Ok(match kind {
        EventKind::OomVictim => {
            expect(size_of::<OomVictim>())?;
            Event::OomVictim(read(bytes))
        }
        EventKind::ReapStart | EventKind::ReapFinish => {
            expect(size_of::<Reap>())?;
            Event::Reap(read(bytes))
        }
        EventKind::MemcgOom => {
            expect(size_of::<MemcgEvent>())?;
            Event::MemcgOom(read(bytes))
        }
        EventKind::Exec => {
            expect(size_of::<ProcExec>())?;
            Event::Exec(Box::new(read(bytes)))
        }
        EventKind::Fork => {
            expect(size_of::<ProcFork>())?;
            Event::Fork(read(bytes))
        }
        EventKind::Exit => {
            expect(size_of::<ProcExit>())?;
            Event::Exit(read(bytes))
        }
        EventKind::CgroupMkdir | EventKind::CgroupRmdir => {
            expect(size_of::<CgroupDir>())?;
            Event::CgroupDir(Box::new(read(bytes)))
        }
        EventKind::SignalKill => {
            expect(size_of::<SignalKill>())?;
            Event::SignalKill(read(bytes))
        }
        EventKind::CudaCall => {
            expect(size_of::<CudaCall>())?;
            Event::Cuda(read(bytes))
        }
        EventKind::HeapAlloc => {
            expect(size_of::<HeapAlloc>())?;
            Event::HeapAlloc(Box::new(read(bytes)))
        }
        EventKind::HeapFree => {
            expect(size_of::<HeapFree>())?;
            Event::HeapFree(read(bytes))
        }
        EventKind::GrowthFault => {
            expect(size_of::<GrowthSample>())?;
            Event::GrowthFault(Box::new(read(bytes)))
        }
        EventKind::GrowthReturn => {
            expect(size_of::<GrowthReturn>())?;
            Event::GrowthReturn(read(bytes))
        }
        EventKind::OomTip => {
            expect(size_of::<GrowthSample>())?;
            Event::OomTip(Box::new(read(bytes)))
        }
        EventKind::CudaStack => {
            expect(size_of::<HeapAlloc>())?;
            Event::CudaStack(Box::new(read(bytes)))
        }
        EventKind::Usdt => {
            expect(size_of::<UsdtEvent>())?;
            Event::Usdt(read(bytes))
        }
    })
}

/// The command line an exec event carries: `args_len` bytes of an
/// argument block of `args_total` (NUL after each argument); `None` when
/// none was read.
pub fn exec_cmdline(e: &ProcExec) -> Option<String> {
    let raw = e.args.get(..e.args_len as usize)?;
    (!raw.is_empty()).then(|| join_cmdline(raw, e.args_total > e.args_len))
}

/// Arguments separated by NULs (as /proc/PID/cmdline has them) as one
/// line; `cut` marks one that was cut short with an ellipsis.
pub fn join_cmdline(raw: &[u8], cut: bool) -> String {
    let trimmed = raw.strip_suffix(&[0]).unwrap_or(raw);
    let mut s = String::from_utf8_lossy(trimmed).replace('\0', " ");
    if cut {
        s.push('…');
    }
    s
}

/// The path a cgroup event names; `None` where the kernel's was longer
/// than the event holds (cut) or could not be read.
pub fn cgroup_path(e: &CgroupDir) -> Option<String> {
    let len = e.path_len as usize;
    (len > 1 && len <= CGROUP_PATH_LEN && e.path[0] == b'/').then(|| c_str(&e.path))
}

/// A NUL-padded C string as UTF-8 (lossy).
pub fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

impl Event {
    /// The common header.
    pub fn header(&self) -> &EventHeader {
        match self {
            Event::OomVictim(e) => &e.header,
            Event::Reap(e) => &e.header,
            Event::MemcgOom(e) => &e.header,
            Event::Exec(e) => &e.header,
            Event::Fork(e) => &e.header,
            Event::Exit(e) => &e.header,
            Event::SignalKill(e) => &e.header,
            Event::Cuda(e) => &e.header,
            Event::HeapAlloc(e) => &e.header,
            Event::HeapFree(e) => &e.header,
            Event::GrowthReturn(e) => &e.header,
            Event::GrowthFault(e) | Event::OomTip(e) | Event::CudaStack(e) => &e.header,
            Event::Usdt(e) => &e.header,
            Event::CgroupDir(e) => &e.header,
        }
    }

    /// The kind.
    pub fn kind(&self) -> EventKind {
        EventKind::try_from(self.header().kind).expect("decoded events have known kinds")
    }

    /// The process the event is about (victim, target, new process...).
    pub fn subject_pid(&self) -> u32 {
        match self {
            Event::OomVictim(e) => e.victim_pid,
            Event::Reap(e) => e.victim_pid,
            Event::MemcgOom(e) => e.header.pid,
            Event::Exec(e) => e.pid,
            Event::Fork(e) => e.child_pid,
            Event::Exit(e) => e.pid,
            Event::SignalKill(e) => e.target_pid,
            Event::Cuda(e) => e.header.pid,
            Event::HeapAlloc(e) => e.header.pid,
            Event::HeapFree(e) => e.header.pid,
            Event::GrowthFault(e) => e.header.pid,
            Event::GrowthReturn(e) => e.header.pid,
            Event::OomTip(e) => e.addr as u32,
            Event::CudaStack(e) => e.header.pid,
            Event::Usdt(e) => e.header.pid,
            Event::CgroupDir(e) => e.header.pid,
        }
    }

    /// The kind-specific fields, for the store and JSON output.
    pub fn details(&self) -> Value {
        match self {
            Event::OomVictim(e) => {
                let has = |bit: u16| e.present & bit != 0;
                json!({
                    "victim_pid": e.victim_pid,
                    "victim_comm": has(victim_field::COMM).then(|| c_str(&e.victim_comm)),
                    "uid": has(victim_field::UID).then_some(e.uid),
                    "total_vm_kb": has(victim_field::TOTAL_VM).then_some(e.total_vm_kb),
                    "anon_rss_kb": has(victim_field::RSS).then_some(e.anon_rss_kb),
                    "file_rss_kb": has(victim_field::RSS).then_some(e.file_rss_kb),
                    "shmem_rss_kb": has(victim_field::RSS).then_some(e.shmem_rss_kb),
                    "pgtables_kb": has(victim_field::PGTABLES).then_some(e.pgtables_kb),
                    "oom_score_adj": has(victim_field::OOM_SCORE_ADJ).then_some(e.oom_score_adj),
                    "trigger_memcg_id": e.trigger_memcg_id,
                    "victim_start_ns": start(e.victim_start_ns),
                    "victim_memcg_id": (e.victim_memcg_id != 0).then_some(e.victim_memcg_id),
                })
            }
            Event::Reap(e) => json!({ "victim_pid": e.victim_pid }),
            Event::MemcgOom(e) => json!({ "memcg_id": e.memcg_id, "item": e.item, "val": e.val }),
            Event::Exec(e) => json!({
                "pid": e.pid,
                "old_pid": e.old_pid,
                "memcg_id": e.memcg_id,
                "filename": c_str(&e.filename),
                "cmdline": exec_cmdline(e),
                "start_ns": start(e.start_ns),
            }),
            Event::Fork(e) => json!({
                "child_pid": e.child_pid,
                "child_start_ns": start(e.child_start_ns),
            }),
            Event::Exit(e) => {
                let kb = crate::util::sys::page_kb();
                let known = e.rss_known != 0;
                json!({
                    "pid": e.pid,
                    "anon_rss_kb": known.then_some(e.rss_anon_pages * kb),
                    "file_rss_kb": known.then_some(e.rss_file_pages * kb),
                    "shmem_rss_kb": known.then_some(e.rss_shmem_pages * kb),
                    "start_ns": start(e.start_ns),
                    "exit": (e.exit_known != 0).then(|| crate::util::sys::exit_text(e.exit_code)),
                })
            }
            Event::Cuda(e) => json!({
                "function": tracer_common::cuda::name(e.func),
                "ret": e.ret,
                "size": e.size,
                "ptr": format!("{:#x}", e.ptr),
                "device": (e.device >= 0).then_some(e.device),
                "latency_ns": e.latency_ns,
            }),
            Event::HeapAlloc(e) => json!({
                "function": tracer_common::heap::name(e.func),
                "addr": format!("{:#x}", e.addr),
                "size": e.size,
                "how": e.how,
            }),
            Event::HeapFree(e) => json!({
                "function": tracer_common::heap::name(e.func),
                "addr": format!("{:#x}", e.addr),
            }),
            Event::GrowthFault(e) => json!({
                "addr": format!("{:#x}", e.addr),
                "kernel_mode": e.func == tracer_common::growth::FAULT_KERNEL,
            }),
            Event::GrowthReturn(e) => json!({
                "start": format!("{:#x}", e.start),
                "len": e.len,
            }),
            Event::OomTip(e) => json!({ "victim_pid": e.addr }),
            Event::CudaStack(e) => json!({
                "function": match e.func {
                    tracer_common::cuda::CACHING_BLOCK => "pytorch:malloc",
                    f => tracer_common::cuda::name(f),
                },
                "ptr": format!("{:#x}", e.addr),
                "size": e.size,
            }),
            Event::CgroupDir(e) => json!({
                "root": e.root,
                "level": e.level,
                "id": e.id,
                "path": cgroup_path(e),
            }),
            Event::Usdt(e) => json!({
                "probe": tracer_common::usdt::PROBES
                    .iter()
                    .find(|(id, ..)| *id == e.probe)
                    .map(|(_, p, n)| format!("{p}:{n}")),
                "args": &e.args[..(e.nargs as usize).min(e.args.len())],
            }),
            Event::SignalKill(e) => json!({
                "target_pid": e.target_pid,
                "target_comm": c_str(&e.target_comm),
                "sig": e.sig,
                "code": e.code,
                "group": e.group,
                "result": e.result,
                "target_start_ns": start(e.target_start_ns),
                "target_memcg_id": (e.target_memcg_id != 0).then_some(e.target_memcg_id),
            }),
        }
    }
}

/// A process start from an event (boot-clock ns): null where the kernel's
/// value was not read, never a made-up zero.
fn start(ns: u64) -> Option<u64> {
    (ns != 0).then_some(ns)
}

/// Bytes of a wire record, for tests and fixtures.
pub fn as_bytes<T: WireEvent>(v: &T) -> Vec<u8> {
    tracer_common::wire::as_bytes(v).to_vec()
}

/// A NUL-padded name from a string, for tests and fixtures.
pub fn comm(s: &str) -> [u8; COMM_LEN] {
    let mut out = [0u8; COMM_LEN];
    let n = s.len().min(COMM_LEN - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_the_registry_decodes_to_its_own_kind() {
        for k in tracer_common::EVENT_KINDS {
            let kind = EventKind::try_from(k.kind).expect("known");
            assert_eq!(kind.id(), k.kind);
            assert_eq!(kind.name(), k.name);
            // A record of the registry's size, all zero but its kind: the
            // decoder takes exactly that size.
            let mut bytes = vec![0u8; k.size];
            bytes[..4].copy_from_slice(&k.kind.to_ne_bytes());
            let ev = decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", k.name));
            assert_eq!(ev.kind(), kind);
            bytes.push(0);
            assert!(decode(&bytes).is_err(), "{}: one byte too many", k.name);
        }
    }

    #[test]
    fn an_exec_events_command_line() {
        let mut e = ProcExec {
            header: EventHeader::default(),
            pid: 5,
            old_pid: 5,
            memcg_id: 0,
            start_ns: 0,
            filename: [0; tracer_common::FILENAME_LEN],
            args_total: 9,
            args_len: 9,
            args: [0xff; tracer_common::ARGS_LEN],
        };
        e.args[..12].copy_from_slice(b"sleep\0+60\0\0\0");
        assert_eq!(exec_cmdline(&e).as_deref(), Some("sleep +60"));
        // Only the bytes read count; a block longer than them was cut.
        e.args_len = 5;
        assert_eq!(exec_cmdline(&e).as_deref(), Some("sleep…"));
        e.args_len = 0;
        assert_eq!(exec_cmdline(&e), None);
        e.args_len = tracer_common::ARGS_LEN as u32 + 1;
        assert_eq!(exec_cmdline(&e), None, "longer than the buffer");
        assert_eq!(
            join_cmdline(b"python3\0-c\0print(1)\0", false),
            "python3 -c print(1)"
        );
        assert_eq!(join_cmdline(b"", false), "");
    }

    fn header(kind: u32) -> EventHeader {
        EventHeader {
            kind,
            cpu: 1,
            ts_boot_ns: 42,
            pid: 10,
            tid: 11,
            comm: comm("python3"),
        }
    }

    #[test]
    fn decodes_a_victim() {
        let v = OomVictim {
            header: header(kind::OOM_VICTIM),
            victim_pid: 3129,
            anon_rss_kb: 65152,
            present: victim_field::RSS | victim_field::COMM,
            victim_comm: comm("python3"),
            ..Default::default()
        };
        let ev = decode(&as_bytes(&v)).unwrap();
        assert_eq!(ev, Event::OomVictim(v));
        assert_eq!(ev.kind(), EventKind::OomVictim);
        assert_eq!(ev.subject_pid(), 3129);
        let d = ev.details();
        assert_eq!(d["anon_rss_kb"], 65152);
        assert_eq!(d["victim_comm"], "python3");
        // Fields the kernel did not provide are null, never a made-up zero.
        assert!(d["pgtables_kb"].is_null());
        assert!(d["uid"].is_null());
    }

    #[test]
    fn decodes_every_kind_at_its_size() {
        let records: Vec<(Vec<u8>, EventKind)> = vec![
            (
                as_bytes(&Reap {
                    header: header(kind::REAP_START),
                    ..Default::default()
                }),
                EventKind::ReapStart,
            ),
            (
                as_bytes(&Reap {
                    header: header(kind::REAP_FINISH),
                    ..Default::default()
                }),
                EventKind::ReapFinish,
            ),
            (
                as_bytes(&MemcgEvent {
                    header: header(kind::MEMCG_OOM),
                    ..Default::default()
                }),
                EventKind::MemcgOom,
            ),
            (
                as_bytes(&ProcExec {
                    header: header(kind::PROC_EXEC),
                    pid: 5,
                    old_pid: 5,
                    memcg_id: 0,
                    start_ns: 0,
                    filename: [0; tracer_common::FILENAME_LEN],
                    args_total: 0,
                    args_len: 0,
                    args: [0; tracer_common::ARGS_LEN],
                }),
                EventKind::Exec,
            ),
            (
                as_bytes(&ProcFork {
                    header: header(kind::PROC_FORK),
                    ..Default::default()
                }),
                EventKind::Fork,
            ),
            (
                as_bytes(&ProcExit {
                    header: header(kind::PROC_EXIT),
                    ..Default::default()
                }),
                EventKind::Exit,
            ),
            (
                as_bytes(&SignalKill {
                    header: header(kind::SIGNAL_KILL),
                    ..Default::default()
                }),
                EventKind::SignalKill,
            ),
        ];
        for (bytes, kind) in records {
            assert_eq!(decode(&bytes).unwrap().kind(), kind);
        }
    }

    #[test]
    fn heap_samples_decode_with_their_stack() {
        use tracer_common::heap::{HeapAlloc, HeapFree};
        let mut bytes = vec![0u8; size_of::<HeapAlloc>()];
        bytes[..size_of::<EventHeader>()].copy_from_slice(&as_bytes(&header(kind::HEAP_ALLOC)));
        // The last byte of the stack copy survives the trip.
        *bytes.last_mut().unwrap() = 0xab;
        match decode(&bytes).unwrap() {
            Event::HeapAlloc(a) => assert_eq!(a.stack[a.stack.len() - 1], 0xab),
            other => panic!("{other:?}"),
        }
        let free = as_bytes(&HeapFree {
            header: header(kind::HEAP_FREE),
            addr: 0x1000,
            ..Default::default()
        });
        assert_eq!(decode(&free).unwrap().kind(), EventKind::HeapFree);
        // Growth samples and tipping stacks share the layout; a tip is
        // about its victim (the pid in `addr`), not the task that sent it.
        bytes[..size_of::<EventHeader>()].copy_from_slice(&as_bytes(&header(kind::GROWTH_FAULT)));
        assert_eq!(decode(&bytes).unwrap().kind(), EventKind::GrowthFault);
        bytes[..size_of::<EventHeader>()].copy_from_slice(&as_bytes(&header(kind::OOM_TIP)));
        let addr = std::mem::offset_of!(HeapAlloc, addr);
        bytes[addr..addr + 8].copy_from_slice(&4242u64.to_le_bytes());
        let tip = decode(&bytes).unwrap();
        assert_eq!(tip.kind(), EventKind::OomTip);
        assert_eq!(tip.subject_pid(), 4242);
        // A sample cut short is refused.
        assert!(matches!(
            decode(&bytes[..bytes.len() - 8]),
            Err(DecodeError::Length { .. })
        ));
    }

    #[test]
    fn rejects_bad_records() {
        assert_eq!(decode(&[0u8; 8]), Err(DecodeError::BadSize { len: 8 }));
        let too_big = vec![0u8; MAX_EVENT_SIZE + 8];
        assert_eq!(
            decode(&too_big),
            Err(DecodeError::BadSize {
                len: MAX_EVENT_SIZE + 8
            })
        );
        let mut unknown = as_bytes(&ProcExit {
            header: header(99),
            ..Default::default()
        });
        assert_eq!(decode(&unknown), Err(DecodeError::UnknownKind(99)));
        unknown = as_bytes(&ProcExit {
            header: header(kind::OOM_VICTIM),
            ..Default::default()
        });
        assert_eq!(
            decode(&unknown),
            Err(DecodeError::Length {
                kind: kind::OOM_VICTIM,
                len: size_of::<ProcExit>(),
                expected: size_of::<OomVictim>()
            })
        );
    }

    #[test]
    fn c_strings() {
        assert_eq!(c_str(b"abc\0\0\0"), "abc");
        assert_eq!(c_str(b"abcd"), "abcd");
        assert_eq!(c_str(&comm("a-very-long-process-name")), "a-very-long-pro");
    }
}
