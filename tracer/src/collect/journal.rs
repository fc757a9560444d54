//! The systemd journal, followed live for the userspace OOM killers' own
//! lines: systemd-oomd, earlyoom and kubelet say there why they killed
//! (the pressure against the limit, the memory left, the eviction), which
//! the SIGKILLs they send do not carry.
//!
//! journalctl does the reading: the journal's file format, its rotation
//! and its access rules are its own, and it is on every node that has a
//! journal. Its JSON output is read an entry a line, each entry's message
//! given to the killers' reader ([`super::killers`]), as a saved log's are.

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use tokio::sync::mpsc;

use super::killers::{Killers, Said};

/// The longest entry read; a longer one is skipped whole.
const ENTRY_MAX: u64 = 64 * 1024;

/// What a userspace killer's entry said, and when the journal got it.
#[derive(Debug)]
pub struct Logged {
    /// The entry's wall time (`__REALTIME_TIMESTAMP`), ns.
    pub ts_ns: i64,
    /// What the killers' reader made of it.
    pub said: Said,
}

/// One journal entry of `journalctl -o json`, as far as the killers'
/// reader needs it.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    /// `SYSLOG_IDENTIFIER`.
    pub program: String,
    /// `_PID`, the process that logged it.
    pub pid: Option<u32>,
    /// `__REALTIME_TIMESTAMP`, µs since the epoch.
    pub ts_us: i64,
    /// `MESSAGE`.
    pub message: String,
}

/// Reads one line of `journalctl -o json`; `None` for anything else (a
/// message journald kept as bytes because it was not UTF-8 included).
pub fn entry(line: &str) -> Option<Entry> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let field = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
    Some(Entry {
        program: field("SYSLOG_IDENTIFIER")?.to_string(),
        pid: field("_PID").and_then(|p| p.parse().ok()),
        ts_us: field("__REALTIME_TIMESTAMP")?.parse().ok()?,
        message: field("MESSAGE")?.to_string(),
    })
}

/// Follows the journal (this machine's, or the journal files of `dir`)
/// on a thread of its own, from `since_ns` (the recorder's start, wall
/// clock) on, sending what the userspace killers say: an entry logged
/// while journalctl was starting is read too. The thread ends, and ends its journalctl, when the
/// receiver is gone; journalctl ends with the recorder too. No journal to
/// follow is a normal state: said once in the log.
pub fn follow(dir: Option<&Path>, since_ns: i64, tx: mpsc::Sender<Logged>) -> std::io::Result<()> {
    let dir = dir.map(Path::to_path_buf);
    std::thread::Builder::new()
        .name("tracer-journal".into())
        .spawn(move || run(dir, since_ns, &tx))?;
    Ok(())
}

/// journalctl's `--since` for a wall time in ns: `@SECONDS.MICROS`.
fn since_arg(since_ns: i64) -> String {
    let us = since_ns.max(0) / 1000;
    format!("--since=@{}.{:06}", us / 1_000_000, us % 1_000_000)
}

fn run(dir: Option<PathBuf>, since_ns: i64, tx: &mpsc::Sender<Logged>) {
    let mut cmd = Command::new("journalctl");
    cmd.args(["--follow", "--output=json", "--no-pager"]);
    cmd.arg(since_arg(since_ns));
    if let Some(d) = &dir {
        cmd.arg("--directory").arg(d);
    }
    // The killers' own identifiers (systemd's unit notices are of the
    // kernel's kills, which the probes see live).
    cmd.args(
        super::killers::KILLERS
            .iter()
            .filter(|p| **p != "systemd")
            .map(|p| format!("SYSLOG_IDENTIFIER={p}")),
    );
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe; the child asks for SIGTERM when
    // the thread that started it (this one, which lives as long as the
    // child is read) ends, the recorder's end included.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(
                "the systemd journal is not followed (journalctl: {e}): kills by systemd-oomd, earlyoom and kubelet are recorded without the reasons they log"
            );
            return;
        }
    };
    let stdout = child.stdout.take().expect("piped");
    // Its complaints are read beside its entries (the first 4 KiB kept):
    // a full stderr pipe must not stall it.
    let mut stderr = child.stderr.take().expect("piped");
    let complaints = std::thread::Builder::new()
        .name("tracer-journal-err".into())
        .spawn(move || {
            let mut said = Vec::new();
            let _ = (&mut stderr).take(4096).read_to_end(&mut said);
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            said
        });
    let mut killers = Killers::default();
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let mut gone = false;
    loop {
        line.clear();
        match (&mut reader).take(ENTRY_MAX).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            // Longer than any killer's entry: skipped to its end.
            if skip_line(&mut reader) {
                continue;
            }
            break;
        }
        let Some(e) = std::str::from_utf8(&line).ok().and_then(entry) else {
            continue;
        };
        let Some(said) = killers.push(&e.program, e.pid, &e.message) else {
            continue;
        };
        let logged = Logged {
            ts_ns: e.ts_us.saturating_mul(1000),
            said,
        };
        if tx.blocking_send(logged).is_err() {
            gone = true;
            break;
        }
    }
    if gone {
        // The recorder stopped: its journalctl (this thread's child) too.
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    let status = child.wait();
    let said = complaints
        .ok()
        .and_then(|t| t.join().ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    tracing::info!(
        "the systemd journal is not followed (journalctl ended{}{}): kills by systemd-oomd, earlyoom and kubelet are recorded without the reasons they log",
        status.map(|s| format!(", {s}")).unwrap_or_default(),
        if said.trim().is_empty() {
            String::new()
        } else {
            format!(": {}", crate::util::term::escape(said.trim()))
        }
    );
}

/// Reads to the end of an over-long line; false at the end of the input.
fn skip_line(r: &mut impl BufRead) -> bool {
    loop {
        let buf = match r.fill_buf() {
            Ok([]) | Err(_) => return false,
            Ok(b) => b,
        };
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            r.consume(i + 1);
            return true;
        }
        let n = buf.len();
        r.consume(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as journalctl 252 printed it (`-o json`, written into a
    /// journal by systemd-journal-remote from systemd-oomd's line of
    /// ev-10 in tests/fixtures/real-logs).
    const OOMD: &str = r#"{"__CURSOR":"s=d32c4055dd004c80aa357ad65b448477;i=1;b=ba673d2e48fb4c2b88a5ef1585178221;m=1;t=6620cec0bb05f;x=c56ea51d56279791","_BOOT_ID":"ba673d2e48fb4c2b88a5ef1585178221","_PID":"840","__REALTIME_TIMESTAMP":"1796657499582559","__MONOTONIC_TIMESTAMP":"1","SYSLOG_IDENTIFIER":"systemd-oomd","MESSAGE":"Killed /user.slice/user-1001.slice/user@1001.service/app.slice/app-org.gnome.Terminal.slice/vte-spawn-dbb4a75e-031f-480d-924b-5de5af7579d2.scope due to memory pressure for /user.slice/user-1001.slice/user@1001.service being 51.07% > 50.00% for > 20s with reclaim activity"}"#;

    #[test]
    fn an_oomd_entry_is_read_as_its_kill() {
        let e = entry(OOMD).unwrap();
        assert_eq!(e.program, "systemd-oomd");
        assert_eq!(e.pid, Some(840));
        assert_eq!(e.ts_us, 1_796_657_499_582_559);
        let Some(Said::Kill(k)) = Killers::default().push(&e.program, e.pid, &e.message) else {
            panic!("no kill in {e:?}");
        };
        assert_eq!(k.killer_pid, Some(840));
        assert!(
            k.cgroup
                .as_deref()
                .unwrap()
                .ends_with("-5de5af7579d2.scope")
        );
        assert!(k.reason.starts_with("memory pressure for /user.slice/user-1001.slice/user@1001.service being 51.07% > 50.00%"));
    }

    #[test]
    fn the_journal_is_followed_from_the_recorder_s_start() {
        assert_eq!(
            since_arg(1_796_657_499_582_559_123),
            "--since=@1796657499.582559"
        );
        assert_eq!(since_arg(5_000), "--since=@0.000005");
    }

    #[test]
    fn entries_without_a_text_message_or_a_time_are_not_read() {
        // journald keeps a message that is not UTF-8 as an array of bytes.
        let bytes = OOMD.replace(r#""MESSAGE":"Killed"#, r#""MESSAGE":[75,105],"X":"Killed"#);
        assert_eq!(entry(&bytes), None);
        assert_eq!(entry(&OOMD.replace("__REALTIME_TIMESTAMP", "T")), None);
        assert_eq!(entry("not json"), None);
        assert_eq!(entry(&OOMD[..OOMD.len() / 2]), None);
    }

    #[test]
    fn an_over_long_line_is_skipped_to_its_end() {
        let text = format!("{}\nnext\n", "x".repeat(100_000));
        let mut r = BufReader::with_capacity(4096, text.as_bytes());
        let mut line = Vec::new();
        (&mut r)
            .take(ENTRY_MAX)
            .read_until(b'\n', &mut line)
            .unwrap();
        assert_eq!(line.len() as u64, ENTRY_MAX);
        assert!(skip_line(&mut r));
        line.clear();
        r.read_until(b'\n', &mut line).unwrap();
        assert_eq!(line, b"next\n");
        assert!(!skip_line(&mut r));
    }
}
