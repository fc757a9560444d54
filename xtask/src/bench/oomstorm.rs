//! `bench --only oomstorm`: the OOM storm issue 24 met on a busy node, in
//! the release build. An unprivileged user's children in a 256 MiB cgroup
//! grow until the kernel kills them and are replaced at once (the kernel
//! writes a report with the cgroup's task table for each kill): every kill
//! the program saw stored in its own cgroup, OOM-ring events lost, kill to
//! stored row (to the commit's start, as the other rows), and the time the
//! recorder takes to stop while a storm goes on.

use std::{
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use tracer_e2e::{Proc, Recorder, TestCgroup};

use super::{MIB, percentile};

/// Children growing at once, and MiB each grows to.
const PROCS: &str = "24";
const CHILD_MIB: &str = "16";

pub(super) fn oom_storm(bins: &crate::Bins, secs: u64) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("storm.db");
    let rec = Recorder::on(&store).bin(&bins.tracer).quiet().start();
    let cg = TestCgroup::new("bench-oom-storm", 256 * MIB);
    let storm = |secs: u64| {
        let mut cmd = cg.command(&bins.oomstorm);
        cmd.args([
            "--seconds",
            &secs.to_string(),
            "--procs",
            PROCS,
            "--mib",
            CHILD_MIB,
        ]);
        Proc::spawn(cmd)
    };
    // The storm's kills come after it starts; the kernel log's older kills
    // (the recorder reads its backlog at start) are not the storm's.
    let since = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as i64;
    let t0 = Instant::now();
    let mut s = storm(secs);
    let n = tracer_e2e::storm_count(&mut s);
    let took = t0.elapsed().as_secs_f64();
    let c =
        rusqlite::Connection::open_with_flags(&store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    // (ts, committed, memcg, comm) of each kernel OOM kill since the start.
    type Row = (i64, i64, Option<String>, Option<String>);
    let rows = |c: &rusqlite::Connection| -> anyhow::Result<Vec<Row>> {
        let mut st = c.prepare(
            "SELECT ts_ns, committed_ns, json_extract(record, '$.victim.memcg'), \
             json_extract(record, '$.victim.comm') FROM kills \
             WHERE json_extract(record, '$.killer.kind') = 'kernel_oom' AND ts_ns >= ?1",
        )?;
        let out = st
            .query_map([since], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(out)
    };
    // The kernel's report of the last kills may come a moment later.
    let mut kills = rows(&c)?;
    let wait = Instant::now();
    while (kills.len() as u64) < n && wait.elapsed() < Duration::from_secs(10) {
        thread::sleep(Duration::from_millis(200));
        kills = rows(&c)?;
    }
    let oom_drops: i64 = c.query_row(
        "SELECT coalesce(sum(count), 0) FROM drops WHERE ring = 'oom'",
        [],
        |r| r.get(0),
    )?;
    // Other programs' OOM kills meanwhile (the machine's other work) are
    // not the storm's: the storm's victims are its children, by name.
    let (theirs, others): (Vec<&Row>, Vec<&Row>) = kills
        .iter()
        .partition(|(.., comm)| comm.as_deref() == Some("oomstorm"));
    let elsewhere = theirs
        .iter()
        .filter(|(_, _, m, _)| m.as_deref() != Some(cg.path.as_str()))
        .count();
    let mut ms: Vec<f64> = theirs
        .iter()
        .map(|(ts, committed, ..)| (committed - ts) as f64 / 1e6)
        .collect();
    ms.sort_by(f64::total_cmp);
    drop(s);
    // SIGTERM while a new storm is at full speed.
    let _again = storm(60);
    thread::sleep(Duration::from_secs(2));
    let stop = rec.terminate_timed();
    Ok(format!(
        "### OOM storm ({secs} s: {PROCS} children of {CHILD_MIB} MiB in a 256 MiB cgroup, uid 65534, replaced as the kernel kills them)\n\n\
         | kills the program saw | stored | not in their cgroup | OOM-ring drops | kill to stored row p50 | p99 | max | stop during a storm |\n\
         |---|---|---|---|---|---|---|---|\n\
         | {n} in {took:.1} s | {} | {elsewhere} | {oom_drops} | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} s |\n\n\
         Targets: every kill stored in its cgroup, no OOM-ring drop, p99 within 100 ms, stop within 2 s. \
         Other programs' OOM kills meanwhile (not counted): {}.\n",
        theirs.len(),
        if ms.is_empty() {
            f64::NAN
        } else {
            percentile(&ms, 0.5)
        },
        if ms.is_empty() {
            f64::NAN
        } else {
            percentile(&ms, 0.99)
        },
        ms.last().copied().unwrap_or(f64::NAN),
        stop.as_secs_f64(),
        others.len(),
    ))
}
