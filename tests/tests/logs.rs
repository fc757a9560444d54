//! `explain --log` against hostile logs: memory bounded and time linear
//! whatever the shape, and no kill dropped for a stamp it cannot read.
//! Each shape is the real report of
//! `fixtures/kernel-logs/6.8-memcg-v2-oom-group-dmesg.log` grown to a size
//! (its task table, its group kills, its summary line wrapped), at two
//! sizes four times apart; the peak RSS and the time of the `tracer`
//! process are read from `wait4`. No root needed.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracer_e2e::tracer_bin;

fn fixture() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/kernel-logs/6.8-memcg-v2-oom-group-dmesg.log");
    std::fs::read_to_string(p).unwrap()
}

/// The fixture's lines up to its task table's header (included), the
/// table's rows, and the rest.
fn parts() -> (String, Vec<String>, Vec<String>) {
    let text = fixture();
    let lines: Vec<&str> = text.lines().collect();
    let header = lines.iter().position(|l| l.contains("[  pid  ]")).unwrap();
    let rows_end = header
        + 1
        + lines[header + 1..]
            .iter()
            .take_while(|l| l.contains("] ["))
            .count();
    let head = lines[..=header].join("\n") + "\n";
    (
        head,
        lines[header + 1..rows_end]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        lines[rows_end..].iter().map(|s| s.to_string()).collect(),
    )
}

/// A task row of the fixture's shape for pid `pid`.
fn row(template: &str, pid: u32, rss: u64) -> String {
    // `[ 5120.100202] [   4201]     0  4201     1000      225 ...`
    let (stamp, rest) = template.split_once("] [").unwrap();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // pid] uid tgid total_vm rss ... name
    let mut out = format!(
        "{stamp}] [{pid:7}] {:>5} {pid:5} {:>8} {rss:>8}",
        fields[1], fields[3]
    );
    for f in &fields[5..fields.len() - 1] {
        let _ = write!(out, " {f:>8}");
    }
    let _ = write!(out, " w{pid}");
    out
}

/// The report with a task table of `n` rows (the victim among them).
fn big_table(n: u32) -> String {
    let (head, rows, rest) = parts();
    let mut s = head;
    for i in 0..n {
        let pid = 10_000 + i;
        let _ = writeln!(
            s,
            "{}",
            row(
                &rows[i as usize % rows.len()],
                pid,
                100 + u64::from(i % 997)
            )
        );
    }
    // The fixture's victim, the largest, and its kill.
    let _ = writeln!(s, "{}", row(&rows[1], 4205, 25_355));
    for l in rest.iter().take(2) {
        let _ = writeln!(s, "{l}");
    }
    s
}

/// The memory.oom.group kill of the fixture with `n` tasks killed.
fn big_group(n: u32) -> String {
    let (head, rows, rest) = parts();
    let mut s = head;
    for r in &rows {
        let _ = writeln!(s, "{r}");
    }
    // summary, the chosen kill, the announcement.
    for l in rest.iter().take(3) {
        let _ = writeln!(s, "{l}");
    }
    let member = &rest[3];
    let (before, after) = member.split_once("Killed process 4201 (sh)").unwrap();
    for i in 0..n {
        let _ = writeln!(s, "{before}Killed process {} (w{i}){after}", 10_000 + i);
    }
    s
}

/// The fixture's summary line followed by `n` wrapped pieces with no
/// space (a ticket system's hard wrap of a long token).
fn wrapped(n: u32) -> String {
    let (head, rows, rest) = parts();
    let mut s = head;
    for r in &rows {
        let _ = writeln!(s, "{r}");
    }
    let _ = writeln!(s, "{}", rest[0]);
    for _ in 0..n {
        let _ = writeln!(s, "{}", "x".repeat(72));
    }
    let _ = writeln!(s, "{}", rest[1]);
    s
}

/// Runs `tracer explain --log FILE ARGS`: (peak RSS in KiB, time, stdout).
fn explain(file: &Path, args: &[&str]) -> (u64, Duration, String) {
    let t0 = Instant::now();
    let out = tempfile::NamedTempFile::new().unwrap();
    // Reaped by wait4 below, which also gives its peak RSS.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(tracer_bin())
        .args(["explain", "--log"])
        .arg(file)
        .args(args)
        .stdout(out.reopen().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be written into.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into the two locals.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as i32);
    let elapsed = t0.elapsed();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "explain --log {}: status {status}",
        file.display()
    );
    let text = std::fs::read_to_string(out.path()).unwrap();
    (usage.ru_maxrss as u64, elapsed, text)
}

/// Explains `make(n)` and `make(4 n)`; asserts that memory grows by at
/// most `per_item_kib` KiB an item beyond a fixed 64 MiB and time at most
/// six times (linear, with room for noise), and says the figures.
fn scales(name: &str, make: fn(u32) -> String, n: u32, args: &[&str], per_item_kib: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (small, large) = (dir.path().join("small.log"), dir.path().join("large.log"));
    std::fs::write(&small, make(n)).unwrap();
    std::fs::write(&large, make(4 * n)).unwrap();
    let (rss1, t1, _) = explain(&small, args);
    let (rss4, t4, text) = explain(&large, args);
    eprintln!(
        "{name}: {n} -> {} items: peak RSS {rss1} -> {rss4} KiB, time {t1:?} -> {t4:?}",
        4 * n
    );
    let bound = 64 * 1024 + per_item_kib * u64::from(4 * n);
    assert!(
        rss4 <= bound,
        "{name}: {rss4} KiB for {} items, bound {bound}",
        4 * n
    );
    assert!(
        t4 <= t1 * 6 + Duration::from_millis(500),
        "{name}: {t1:?} for {n} items, {t4:?} for {}: not linear",
        4 * n
    );
    text
}

#[test]
fn a_task_table_of_any_length_is_read_in_bounded_memory() {
    // A node of 100,000 processes prints that many rows; the table kept is
    // bounded, so memory does not grow with it at all.
    let text = scales("task table", big_table, 20_000, &[], 0);
    assert!(text.contains("stress (pid 4205) killed"), "{text}");
    assert!(text.contains("more rows, left out"), "{text}");
}

#[test]
fn a_group_kill_of_thousands_of_tasks_is_explained_in_linear_time() {
    // Every kill of the incident is explained (--all): memory is the
    // explanations themselves, a few KiB each.
    let text = scales("oom.group", big_group, 500, &["--all"], 16);
    assert!(text.contains("and 1985 more"), "{text}");
}

#[test]
fn wrapped_pieces_without_spaces_are_put_back_in_linear_time() {
    let text = scales("wrapped summary", wrapped, 20_000, &[], 0);
    assert!(text.contains("stress (pid 4205) killed"), "{text}");
}

#[test]
fn a_kill_whose_stamp_cannot_be_a_time_is_kept_and_said_so() {
    let text = fixture();
    let kill = text
        .lines()
        .find(|l| l.contains("Killed process 4205"))
        .unwrap();
    let msg = kill.split_once("] ").unwrap().1;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stamps.log");
    // dmesg with a boot 10^14 s long, short-iso in the year 9999, syslog
    // at a 25th hour, next to one that is fine.
    let lines = [
        format!("[99999999999999.100400] {}", msg.replace("4205", "4301")),
        format!(
            "9999-12-31T23:59:59+0000 node kernel: {}",
            msg.replace("4205", "4302")
        ),
        format!(
            "Dec  5 25:61:61 node kernel: {}",
            msg.replace("4205", "4303")
        ),
        format!(
            "2026-12-05T09:00:00+0000 node kernel: {}",
            msg.replace("4205", "4304")
        ),
    ];
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let (_, _, out) = explain(&log, &["--all", "--format", "json"]);
    let kills: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&out)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let kills: Vec<&serde_json::Value> = kills
        .iter()
        .flat_map(|v| v.as_array().map(|a| a.iter().collect()).unwrap_or(vec![v]))
        .collect();
    for pid in [4301, 4302, 4303, 4304] {
        let k = kills
            .iter()
            .find(|k| k["kill"]["victim"]["pid"] == pid)
            .unwrap_or_else(|| panic!("kill of {pid} dropped: {out}"));
        let unreadable = k["kill"]["time_unreadable"] == true;
        assert_eq!(unreadable, pid != 4304, "{pid}: {k}");
    }
}

/// A real log's line of the kernel's choice
/// (`fixtures/real-logs/hv-21-...`), `n` times for `n` processes, none
/// with its kill line: each is a kill the log may hold, and matching them
/// against the kill lines stays linear.
fn choices(n: u32) -> String {
    let real = real_line("hv-21-", "Kill process ");
    let (before, after) = real.split_once("Kill process ").unwrap();
    let after = after.split_once(' ').unwrap().1;
    let mut s = String::new();
    for i in 0..n {
        let _ = writeln!(s, "{before}Kill process {} {after}", 10_000 + i);
    }
    s
}

/// A real syslog kernel line quoted inside prose
/// (`fixtures/real-logs/hv-17-...`), after `n` words of prose on the same
/// line: the stamp is looked for near `kernel: ` only.
fn long_prose(n: u32) -> String {
    let real = real_line("hv-17-", "kernel: Killed process");
    let at = real.find("/var/log/messages:").unwrap();
    format!("{}{}\n", "word ".repeat(n as usize), &real[at..])
}

/// The first line of the real log named `prefix...` holding `needle`.
fn real_line(prefix: &str, needle: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-logs");
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(prefix) && name.ends_with(".log")
        })
        .unwrap();
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .find(|l| l.contains(needle))
        .unwrap()
        .to_string()
}

#[test]
fn choice_lines_by_the_thousand_are_read_in_linear_time() {
    let text = scales("choices", choices, 5_000, &[], 16);
    assert!(text.contains("(pid 29999)"), "{text}");
}

#[test]
fn a_kernel_line_after_megabytes_of_prose_is_read_in_linear_time() {
    let text = scales("prose", long_prose, 200_000, &[], 0);
    assert!(text.contains("mongod (pid 15644) killed"), "{text}");
}
