//! The heap benchmark: allocbench with tracer, its floor, and the peers.

use super::*;

/// A tool attached to the heap workload, and how to stop it.
pub(super) enum HeapTool {
    None,
    Tracer(Attach),
    Child(Child),
}

/// One allocbench run of `secs` on `threads` threads with `tool` attached
/// first (`attach` starts it given the pid): operations per second, and
/// what the tool said at the end.
pub(super) fn heap_run(
    threads: u32,
    secs: f64,
    attach: &dyn Fn(u32) -> anyhow::Result<HeapTool>,
) -> anyhow::Result<(f64, serde_json::Value)> {
    let mut cmd = Command::new(tracer_e2e::allocbench());
    cmd.args([threads.to_string(), secs.to_string()]);
    let mut prog = CudaLoad::spawn(cmd);
    let tool = attach(prog.pid())?;
    let reply = prog.cmd("go");
    let ops: f64 = reply
        .strip_prefix("ops ")
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("allocbench said {reply:?}"))?;
    let report = match tool {
        HeapTool::None => serde_json::Value::Null,
        HeapTool::Tracer(a) => a.stop(),
        HeapTool::Child(mut c) => {
            tracer_e2e::interrupt(&mut c, Duration::from_secs(60));
            serde_json::Value::Null
        }
    };
    prog.exit();
    Ok((ops / secs, report))
}

/// A child whose output says it is attached when a line contains `ready`.
pub(super) fn attached_child(mut cmd: Command, ready: &'static str) -> anyhow::Result<HeapTool> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start the peer tool")?;
    let out = child.stdout.take().context("stdout")?;
    let err = child.stderr.take().context("stderr")?;
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = said.clone();
    thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            // The line that says why, when there is one; else the last.
            if let Ok(mut s) = sink.lock()
                && !s.contains("Unable")
            {
                *s = l;
            }
        }
    });
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if l.contains(ready) {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        thread::sleep(Duration::from_millis(100));
        let last = said.lock().map(|s| s.clone()).unwrap_or_default();
        bail!("it never attached; it said: {last}");
    }
    // Probes are live once the tool has said so; give it a moment more.
    thread::sleep(Duration::from_millis(300));
    Ok(HeapTool::Child(child))
}

/// The heap probes' cost: an allocation-heavy workload untraced, under
/// bpftrace counting malloc and free at their entries, under bcc's
/// memleak and heaptrack attached at run time, and under tracer (empty
/// programs, probes at the entries, default sampling, exact).
pub(super) fn heap_cost(bins: &crate::Bins, secs: f64) -> anyhow::Result<String> {
    let libc = "/lib/x86_64-linux-gnu/libc.so.6";
    let tracer = |extra: &'static [&'static str]| {
        move |pid: u32| -> anyhow::Result<HeapTool> {
            let mut args = vec!["--host"];
            args.extend_from_slice(extra);
            Ok(HeapTool::Tracer(Attach::start_bin(
                &bins.tracer,
                pid,
                &args,
            )))
        }
    };
    let bpftrace = |pid: u32| {
        let mut c = Command::new("bpftrace");
        c.args([
            "-p",
            &pid.to_string(),
            "-e",
            &format!(
                "uprobe:{libc}:malloc {{ @m = count(); }} uprobe:{libc}:free {{ @f = count(); }}"
            ),
        ]);
        attached_child(c, "Attaching")
    };
    let memleak = |pid: u32| {
        let mut c = Command::new("memleak-bpfcc");
        c.args(["-p", &pid.to_string(), "60"]);
        attached_child(c, "Attaching")
    };
    let heaptrack_dir = tempfile::tempdir()?;
    let hdir = heaptrack_dir.path().to_path_buf();
    let heaptrack = move |pid: u32| {
        let mut c = Command::new("heaptrack");
        c.args(["-p", &pid.to_string()]).current_dir(&hdir);
        attached_child(c, "injection finished")
    };
    let have = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut rows = Vec::new();
    for threads in [1u32, 2] {
        let (base, _) = heap_run(threads, secs, &|_| Ok(HeapTool::None))?;
        let mut row = vec![format!(
            "| {threads} | untraced | {:.2} M/s | 1.00 | | |",
            base / 1e6
        )];
        let mut add = |name: &str, r: anyhow::Result<(f64, serde_json::Value)>| match r {
            Ok((ops, report)) => {
                let lost = report["heap"]["lost_samples"]
                    .as_u64()
                    .map(|l| l.to_string())
                    .unwrap_or_default();
                let sampled = report["probes"]["sampled"]
                    .as_u64()
                    .map(|n| format!("{:.0}/s", n as f64 / secs))
                    .unwrap_or_default();
                row.push(format!(
                    "| {threads} | {name} | {:.2} M/s | {:.2} | {sampled} | {lost} |",
                    ops / 1e6,
                    base / ops
                ));
            }
            Err(e) => row.push(format!("| {threads} | {name} | not run: {e:#} | | | |")),
        };
        add(
            "bpftrace, count malloc + free at entries",
            heap_run(threads, secs, &bpftrace),
        );
        if have("memleak-bpfcc") {
            add("bcc memleak -p", heap_run(threads, secs, &memleak));
        } else {
            add(
                "bcc memleak -p",
                Err(anyhow::anyhow!("memleak-bpfcc is not installed")),
            );
        }
        add(
            "tracer, empty programs (floor)",
            heap_run(threads, secs, &tracer(&["--floor", "--sample-bytes", "0"])),
        );
        add(
            "tracer, default sampling, probes at the entries",
            heap_run(threads, secs, &tracer(&["--entry-sites"])),
        );
        add(
            "tracer, default sampling (512 KiB)",
            heap_run(threads, secs, &tracer(&[])),
        );
        add(
            "tracer, exact (--sample-bytes 0)",
            heap_run(threads, secs, &tracer(&["--sample-bytes", "0"])),
        );
        if have("heaptrack") {
            add("heaptrack -p", heap_run(threads, secs, &heaptrack));
        }
        rows.extend(row);
    }
    Ok(format!(
        "### Heap probe cost (allocbench: malloc + free of mixed sizes, {secs} s per run; operations = malloc + free pairs)\n\n\
         | threads | tool | operations | slowdown | samples | samples lost |\n\
         |---|---|---|---|---|---|\n{}\n\n\
         Probe hits per second = 2 x operations (one malloc, one free), plus one return per malloc for tracer.\n",
        rows.join("\n")
    ))
}
