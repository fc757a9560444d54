//! Tests of the correlators' joins.

use super::*;
use crate::collect::kmsg::KilledProcess;

fn tracepoint_kill(age_ms: i64) -> KillRecord {
    KillRecord {
        source: Seen::TRACEPOINT,
        killer: Killer {
            kind: KillerKind::KernelOom,
            ..Default::default()
        },
        victim: Victim {
            pid: 42,
            ..Default::default()
        },
        memcg: Some(MemcgAtKill {
            path: "/job".into(),
            usage_bytes: Some(60 << 20),
            source: FiguresFrom::Sample,
            age_ms: Some(age_ms),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn bare_report(summary_cut: Option<usize>) -> OomReport {
    OomReport {
        killed: KilledProcess {
            pid: 42,
            comm: "job".into(),
            ..Default::default()
        },
        summary_cut,
        ..Default::default()
    }
}

/// /proc as a test wants it: these pids are alive with this much RSS.
struct Procs(Vec<(u32, u64)>);
impl ProcFacts for Procs {
    fn status_mem(&self, pid: u32) -> Option<crate::model::proc::StatusMem> {
        let (_, kb) = self.0.iter().find(|(p, _)| *p == pid)?;
        Some(crate::model::proc::StatusMem {
            rss_kb: *kb,
            anon_kb: *kb,
            file_kb: 0,
            shmem_kb: 0,
        })
    }
}

fn model_with(procs: &[(u32, &str, &str)]) -> ProcessTable {
    use crate::model::{
        cgroup::{CgroupLayout, ProcCgroups},
        proc::ProcInfo,
    };
    let layout = CgroupLayout {
        memory_v1: Some("/sys/fs/cgroup/memory".into()),
        ..Default::default()
    };
    let mut model = ProcessTable::new(layout, 60_000_000_000, 64);
    for (pid, comm, memcg) in procs {
        model.add(ProcInfo {
            pid: *pid,
            comm: comm.to_string(),
            cmdline: format!("/bin/{comm} --serve").into(),
            cgroups: ProcCgroups {
                memory_v1: Some(memcg.to_string()),
                unified: None,
            },
            ..Default::default()
        });
    }
    model
}

fn signal(sender: u32, target: u32, code: i32) -> SignalKill {
    use crate::collect::decode::{Event, as_bytes, comm, decode};
    let ev = SignalKill {
        header: tracer_common::EventHeader {
            kind: tracer_common::kind::SIGNAL_KILL,
            ts_boot_ns: 7_000_000_000,
            pid: sender,
            tid: sender,
            comm: comm("supervisor"),
            ..Default::default()
        },
        target_pid: target,
        sig: 9,
        code,
        target_comm: comm("worker"),
        ..Default::default()
    };
    match decode(&as_bytes(&ev)).expect("decodes") {
        Event::SignalKill(s) => s,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_userspace_kill_names_the_sender_and_reads_only_the_live_cgroup() {
    let model = model_with(&[
        (100, "supervisor", "/"),
        (200, "worker", "/job"),
        (201, "sidecar", "/job"),
        (300, "other", "/elsewhere"),
    ]);
    let sampler = Sampler::new(model.layout().clone(), 0, Vec::new());
    let clock = Clock::fixed(0, 0);
    let procs = Procs(vec![(200, 50_000), (201, 7_000), (300, 1)]);
    let ctx = Context {
        clock: &clock,
        model: &model,
        sampler: &sampler,
        session_id: Some(3),
        now_ns: 7_000_000_000,
        procs: &procs,
    };
    let rec = kill_from_signal(&ctx, &signal(100, 200, 0), None).expect("a kill");
    assert_eq!(rec.killer.kind, KillerKind::Userspace);
    assert_eq!(rec.killer.sender.as_ref().unwrap().comm, "supervisor");
    assert_eq!(rec.source, Seen::SIGNAL);
    assert_eq!(rec.victim.memory.source, Some(MemoryFrom::Proc));
    assert_eq!(rec.victim.memory.anon_rss_kb, Some(50_000));
    assert_eq!(rec.victim.memcg.as_deref(), Some("/job"));
    let tasks: Vec<(u32, u64)> = rec.tasks.iter().map(|t| (t.pid, t.rss_kb)).collect();
    assert_eq!(
        tasks,
        [(200, 50_000), (201, 7_000)],
        "the cgroup's tasks, largest first"
    );

    // Gone before /proc could be read: said, and filled at its exit later.
    let gone = Procs(Vec::new());
    let ctx = Context {
        procs: &gone,
        ..ctx
    };
    let rec = kill_from_signal(&ctx, &signal(100, 200, 0), None).expect("a kill");
    assert!(rec.gaps.contains(&Gap::MemoryUnknown));
    // The kernel's own SIGKILL (the OOM killer's) is not a userspace kill.
    assert!(kill_from_signal(&ctx, &signal(100, 200, SI_KERNEL), None).is_none());
}

#[test]
fn a_rate_limited_or_cut_report_says_what_is_missing_and_stale() {
    let mut rec = tracepoint_kill(830);
    merge_report(&mut rec, &bare_report(None), None, None);
    assert_eq!(rec.source.to_string(), "tracepoint+kmsg");
    let gap = rec
        .gaps
        .iter()
        .map(ToString::to_string)
        .find(|g| g.contains("rate-limited"))
        .expect("a gap");
    assert!(gap.contains("830 ms before the kill"), "{gap}");

    let mut rec = tracepoint_kill(120);
    merge_report(&mut rec, &bare_report(Some(1000)), None, None);
    let gap = rec
        .gaps
        .iter()
        .map(ToString::to_string)
        .find(|g| g.contains("cut short"))
        .expect("a gap");
    assert!(gap.contains("1000 characters"), "{gap}");
    assert!(
        !rec.gaps
            .iter()
            .any(|g| g.to_string().contains("rate-limited"))
    );
    // In a saved log, a line far shorter than printk's limit was cut
    // where it was copied (a pager's edge, a paste), not by printk.
    let mut rec = tracepoint_kill(120);
    let mut cut = bare_report(Some(208));
    cut.saved_log = true;
    merge_report(&mut rec, &cut, None, None);
    let gaps: Vec<String> = rec.gaps.iter().map(ToString::to_string).collect();
    assert!(
        gaps.iter()
            .any(|g| g.contains("cut short in this log (208 characters")
                && !g.contains("printk (")),
        "{gaps:?}"
    );
}

#[test]
fn a_memcg_kill_from_the_log_is_never_placed_in_the_root_by_the_model() {
    use crate::correlate::fixtures::{CLOCK, report};
    // Only the kill line (a rate-limited header): no cgroup from the kernel.
    let mut r = report(4242, "/storm", 5_000_000);
    r.summary = None;
    r.task_in = None;
    assert!(r.killed.memcg && r.task_memcg().is_none());
    // The model read the task while it was torn down: `/`. The root has no
    // limit to be killed within.
    let model = model_with(&[(4242, "oomstorm", "/")]);
    let rec = kill_from_report(&r, &CLOCK, Some(&model));
    assert_eq!(rec.victim.memcg, None, "{rec:?}");
    // A cgroup of its own stands.
    let model = model_with(&[(4242, "oomstorm", "/job")]);
    let rec = kill_from_report(&r, &CLOCK, Some(&model));
    assert_eq!(rec.victim.memcg.as_deref(), Some("/job"));
}
