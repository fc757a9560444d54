//! Builds the programs' [`ProbeConfig`] for the running kernel: tracepoint
//! field offsets from tracefs format files, and kernel constants from BTF.

use std::{collections::HashMap, path::Path};

use tracer_common::{FIELD_ABSENT, MEMCG_COUNTED_ITEMS, ProbeConfig, field};

use super::{
    btf::{BtfError, KernelBtf},
    tracefs::{Format, TracefsError},
};

/// How a field must look to be usable: the type the program reads it as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// An integer of exactly this many bytes.
    Int(u16),
    /// A `__data_loc char[]` string.
    DataLoc,
}

/// Every field the programs read: (index, category, tracepoint, field, shape).
const FIELDS: &[(usize, &str, &str, &str, Want)] = &[
    (field::MV_PID, "oom", "mark_victim", "pid", Want::Int(4)),
    (field::MV_COMM, "oom", "mark_victim", "comm", Want::DataLoc),
    (
        field::MV_TOTAL_VM,
        "oom",
        "mark_victim",
        "total_vm",
        Want::Int(8),
    ),
    (
        field::MV_ANON_RSS,
        "oom",
        "mark_victim",
        "anon_rss",
        Want::Int(8),
    ),
    (
        field::MV_FILE_RSS,
        "oom",
        "mark_victim",
        "file_rss",
        Want::Int(8),
    ),
    (
        field::MV_SHMEM_RSS,
        "oom",
        "mark_victim",
        "shmem_rss",
        Want::Int(8),
    ),
    (field::MV_UID, "oom", "mark_victim", "uid", Want::Int(4)),
    (
        field::MV_PGTABLES,
        "oom",
        "mark_victim",
        "pgtables",
        Want::Int(8),
    ),
    (
        field::MV_OOM_SCORE_ADJ,
        "oom",
        "mark_victim",
        "oom_score_adj",
        Want::Int(2),
    ),
    (
        field::REAP_PID,
        "oom",
        "start_task_reaping",
        "pid",
        Want::Int(4),
    ),
    (
        field::EXEC_FILENAME,
        "sched",
        "sched_process_exec",
        "filename",
        Want::DataLoc,
    ),
    (
        field::EXEC_PID,
        "sched",
        "sched_process_exec",
        "pid",
        Want::Int(4),
    ),
    (
        field::EXEC_OLD_PID,
        "sched",
        "sched_process_exec",
        "old_pid",
        Want::Int(4),
    ),
    (
        field::EXIT_PID,
        "sched",
        "sched_process_exit",
        "pid",
        Want::Int(4),
    ),
    (
        field::EXIT_GROUP_DEAD,
        "sched",
        "sched_process_exit",
        "group_dead",
        Want::Int(1),
    ),
    (
        field::CGROUP_ATTACH_PID,
        "cgroup",
        "cgroup_attach_task",
        "pid",
        Want::Int(4),
    ),
    // cgroup_rmdir is of the same event class: one layout for both.
    (
        field::CGDIR_ROOT,
        "cgroup",
        "cgroup_mkdir",
        "root",
        Want::Int(4),
    ),
    (
        field::CGDIR_LEVEL,
        "cgroup",
        "cgroup_mkdir",
        "level",
        Want::Int(4),
    ),
    (
        field::CGDIR_ID,
        "cgroup",
        "cgroup_mkdir",
        "id",
        Want::Int(8),
    ),
    (
        field::CGDIR_PATH,
        "cgroup",
        "cgroup_mkdir",
        "path",
        Want::DataLoc,
    ),
];

/// What the reclaim counters count, in `CONFIG` order (each keyed by its
/// slot here): direct reclaim and kswapd work (the memcg under pressure
/// before a kill), named as the kernel's vmstat items are.
pub const MEMCG_ITEM_NAMES: [&str; MEMCG_COUNTED_ITEMS] = [
    "PGSCAN_DIRECT",
    "PGSTEAL_DIRECT",
    "PGSCAN_KSWAPD",
    "PGSTEAL_KSWAPD",
];

/// What the layout step found that limits what can be recorded.
#[derive(Debug, Default)]
pub struct LayoutNotes {
    /// Fields missing on this kernel, as `category:name.field`.
    pub missing_fields: Vec<String>,
    /// Tracepoints whose format could not be read, with why.
    pub missing_tracepoints: Vec<(String, String)>,
}

/// The configuration for this kernel, and what is missing.
pub fn build(tracefs: &Path, btf: &KernelBtf) -> Result<(ProbeConfig, LayoutNotes), BtfError> {
    let mut cfg = ProbeConfig::empty();
    let mut notes = LayoutNotes::default();
    read_fields(tracefs, &mut cfg, &mut notes);
    cfg.task_tgid_off = btf.member_offset("task_struct", "tgid")?;
    // What names a process across pid reuse (its start), and the target
    // of a SIGKILL: without them kills are told apart by time alone.
    match task_identity(btf) {
        Ok([leader, start, comm]) => {
            cfg.task_leader_off = leader;
            cfg.task_start_off = start;
            cfg.task_comm_off = comm;
        }
        Err(e) => notes
            .missing_fields
            .push(format!("process start times ({e})")),
    }
    // RSS at exit is a nicety: a kernel without these keeps recording.
    match (btf.member_offset("task_struct", "mm"), btf.mm_rss_offsets()) {
        (Ok(mm), Ok(rss)) => {
            cfg.task_mm_off = mm;
            cfg.mm_rss_off = rss;
        }
        (Err(e), _) | (_, Err(e)) => notes.missing_fields.push(format!("RSS at exit ({e})")),
    }
    // Where the main thread's stack starts: stack copies stop there
    // instead of faulting past its top (a copy costs more without it).
    match btf.member_offset("mm_struct", "start_stack") {
        Ok(off) => cfg.mm_start_stack_off = off,
        Err(e) => notes
            .missing_fields
            .push(format!("the main thread's stack top ({e})")),
    }
    // A thread's pthread_self(), by which CPython before 3.11 names its
    // threads: without it their Python frames are not walked.
    match (
        btf.member_offset("task_struct", "thread"),
        btf.member_offset("thread_struct", "fsbase"),
    ) {
        (Ok(thread), Ok(fsbase)) => cfg.task_fsbase_off = thread + fsbase,
        (Err(e), _) | (_, Err(e)) => notes
            .missing_fields
            .push(format!("Python frames of CPython 3.9 and 3.10 ({e})")),
    }
    // How a process ended (its exit status or fatal signal): without it a
    // GPU process's death after an Xid is not told from a clean exit.
    match btf.member_offset("task_struct", "exit_code") {
        Ok(off) => cfg.task_exit_code_off = off,
        Err(e) => notes.missing_fields.push(format!("exit statuses ({e})")),
    }
    // A new program's arguments, read at exec: without them a program
    // killed before /proc is read has only its file name.
    match (
        btf.member_offset("mm_struct", "arg_start"),
        btf.member_offset("mm_struct", "arg_end"),
    ) {
        (Ok(start), Ok(end)) => cfg.mm_arg_off = [start, end],
        (Err(e), _) | (_, Err(e)) => notes
            .missing_fields
            .push(format!("command lines at exec ({e})")),
    }
    // The memory cgroup at exec and at the kill, from the kernel: a nicety
    // as well (the model falls back to /proc).
    match memcg_chain(btf) {
        Ok(chain) => cfg.memcg_chain = chain,
        Err(e) => notes
            .missing_fields
            .push(format!("memory cgroup ids in events ({e})")),
    }
    // The reclaim counters' keys: each item's slot. The program takes the
    // pages scanned and reclaimed from the tracepoint's arguments, so no
    // kernel enum is needed (7.x moved these items out of `enum
    // vm_event_item`, and a lookup there found none).
    cfg.memcg_counted_items = std::array::from_fn(|slot| slot as i32);
    Ok((cfg, notes))
}

/// The growth programs' view of memory cgroup limits, from BTF:
/// `(mem_cgroup.memory, page_counter.max, page_counter.parent)`; `None`
/// (no process counts as limited) when `css` is not first in `mem_cgroup`
/// or a member is missing.
pub fn memcg_limit_offsets(btf: &KernelBtf) -> Result<(u32, u32, u32), BtfError> {
    let css = btf.member_offset("mem_cgroup", "css")?;
    if css != 0 {
        return Err(BtfError::Missing {
            what: "struct mem_cgroup with css first".into(),
        });
    }
    Ok((
        btf.member_offset("mem_cgroup", "memory")?,
        btf.member_offset("page_counter", "max")?,
        btf.member_offset("page_counter", "parent")?,
    ))
}

/// `task_struct`'s `group_leader`, start time and `comm` offsets.
fn task_identity(btf: &KernelBtf) -> Result<[u32; 3], BtfError> {
    // Renamed in 5.5; the same boot-clock nanoseconds before and after.
    let start = btf
        .member_offset("task_struct", "start_boottime")
        .or_else(|_| btf.member_offset("task_struct", "real_start_time"))?;
    Ok([
        btf.member_offset("task_struct", "group_leader")?,
        start,
        btf.member_offset("task_struct", "comm")?,
    ])
}

/// Offsets of the task -> memory cgroup id chain (see `ProbeConfig::memcg_chain`).
fn memcg_chain(btf: &KernelBtf) -> Result<[u32; 5], BtfError> {
    let memory = btf.enum_member("memory_cgrp_id")? as u32;
    let subsys = btf.member_offset("css_set", "subsys")?;
    Ok([
        btf.member_offset("task_struct", "cgroups")?,
        subsys + memory * 8,
        btf.member_offset("cgroup_subsys_state", "cgroup")?,
        btf.member_offset("cgroup", "kn")?,
        btf.member_offset("kernfs_node", "id")?,
    ])
}

/// Fills the field offsets from the format files under `tracefs`, noting
/// tracepoints and fields this kernel lacks.
fn read_fields(tracefs: &Path, cfg: &mut ProbeConfig, notes: &mut LayoutNotes) {
    let mut formats: HashMap<(&str, &str), Option<Format>> = HashMap::new();
    for &(idx, category, name, fname, want) in FIELDS {
        let format = formats.entry((category, name)).or_insert_with(|| {
            match Format::read(tracefs, category, name) {
                Ok(f) => Some(f),
                Err(e) => {
                    let reason = match e {
                        TracefsError::MissingTracepoint { .. } => "not on this kernel".to_string(),
                        other => other.to_string(),
                    };
                    notes
                        .missing_tracepoints
                        .push((format!("{category}:{name}"), reason));
                    None
                }
            }
        });
        let Some(format) = format else { continue };
        match offset_of(format, fname, want) {
            Some(off) => cfg.fields[idx] = off,
            None => notes
                .missing_fields
                .push(format!("{category}:{name}.{fname}")),
        }
    }
}

/// The offset of `name` when it has the shape the program reads.
fn offset_of(format: &Format, name: &str, want: Want) -> Option<u16> {
    let f = format.field(name)?;
    let ok = match want {
        Want::Int(size) => f.size == size && !f.ty.contains('['),
        Want::DataLoc => f.ty.starts_with("__data_loc") && f.size == 4,
    };
    (ok && f.offset != FIELD_ABSENT).then_some(f.offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK_VICTIM_6_18: &str = "\
\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned long file_rss;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long shmem_rss;\toffset:40;\tsize:8;\tsigned:0;
\tfield:uid_t uid;\toffset:48;\tsize:4;\tsigned:0;
\tfield:unsigned long pgtables;\toffset:56;\tsize:8;\tsigned:0;
\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;
";
    /// Before 6.8 the tracepoint carried the pid only.
    const MARK_VICTIM_5_15: &str = "\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n";

    const EXIT_6_18: &str = "\
\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;
";
    /// `cgroup:cgroup_mkdir` (and `cgroup_rmdir`, the same class) on 6.18.
    const CGROUP_MKDIR_6_18: &str = "\
\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int level;\toffset:12;\tsize:4;\tsigned:1;
\tfield:u64 id;\toffset:16;\tsize:8;\tsigned:0;
\tfield:__data_loc char[] path;\toffset:24;\tsize:4;\tsigned:0;
";
    const EXIT_5_15: &str = "\
\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
";

    /// A tracefs tree of an older kernel: no memcg tracepoint, the old
    /// one-field mark_victim, no group_dead.
    #[test]
    fn missing_tracepoints_and_fields_are_noted_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let put = |cat: &str, name: &str, text: &str| {
            let d = dir.path().join("events").join(cat).join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("format"), text).unwrap();
        };
        put("oom", "mark_victim", MARK_VICTIM_5_15);
        put("sched", "sched_process_exit", EXIT_5_15);
        let mut cfg = ProbeConfig::empty();
        let mut notes = LayoutNotes::default();
        read_fields(dir.path(), &mut cfg, &mut notes);
        assert_eq!(cfg.fields[field::MV_PID], 8);
        assert_eq!(cfg.fields[field::EXIT_PID], 24);
        assert_eq!(cfg.fields[field::MV_ANON_RSS], FIELD_ABSENT);
        assert_eq!(cfg.fields[field::EXIT_GROUP_DEAD], FIELD_ABSENT);
        assert_eq!(cfg.fields[field::CGROUP_ATTACH_PID], FIELD_ABSENT);
        let missing: Vec<&str> = notes
            .missing_tracepoints
            .iter()
            .map(|(t, _)| t.as_str())
            .collect();
        assert!(
            missing.contains(&"cgroup:cgroup_attach_task"),
            "{missing:?}"
        );
        assert!(!missing.contains(&"oom:mark_victim"));
        assert!(
            notes
                .missing_tracepoints
                .iter()
                .all(|(_, why)| why == "not on this kernel")
        );
        assert!(
            notes
                .missing_fields
                .contains(&"sched:sched_process_exit.group_dead".to_string())
        );
        assert!(
            notes
                .missing_fields
                .contains(&"oom:mark_victim.anon_rss".to_string())
        );
    }

    #[test]
    fn field_offsets_follow_the_kernel_format() {
        let cases: &[(&str, &str, Want, Option<u16>)] = &[
            (MARK_VICTIM_6_18, "pid", Want::Int(4), Some(8)),
            (MARK_VICTIM_6_18, "comm", Want::DataLoc, Some(12)),
            (MARK_VICTIM_6_18, "pgtables", Want::Int(8), Some(56)),
            (MARK_VICTIM_6_18, "oom_score_adj", Want::Int(2), Some(64)),
            (MARK_VICTIM_5_15, "pid", Want::Int(4), Some(8)),
            (MARK_VICTIM_5_15, "anon_rss", Want::Int(8), None),
            (MARK_VICTIM_5_15, "comm", Want::DataLoc, None),
            (EXIT_6_18, "group_dead", Want::Int(1), Some(32)),
            (EXIT_5_15, "group_dead", Want::Int(1), None),
            // A field whose shape changed is treated as missing, not misread.
            (EXIT_6_18, "comm", Want::DataLoc, None),
            (EXIT_6_18, "comm", Want::Int(16), None),
            (MARK_VICTIM_6_18, "total_vm", Want::Int(4), None),
            (CGROUP_MKDIR_6_18, "root", Want::Int(4), Some(8)),
            (CGROUP_MKDIR_6_18, "id", Want::Int(8), Some(16)),
            (CGROUP_MKDIR_6_18, "path", Want::DataLoc, Some(24)),
            // Before 5.5 the id was an `int`: not read as a u64.
            (
                &CGROUP_MKDIR_6_18
                    .replace("u64 id;\toffset:16;\tsize:8", "int id;\toffset:16;\tsize:4"),
                "id",
                Want::Int(8),
                None,
            ),
        ];
        for &(text, name, want, expect) in cases {
            let got = offset_of(&Format::parse(text), name, want);
            assert_eq!(got, expect, "{name} as {want:?}");
        }
    }
}
