//! Reading one process from /proc.

use std::{fs, io, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::cgroup::ProcCgroups;

/// What we know about a process from /proc.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Task name.
    pub comm: String,
    /// Command line, arguments joined by spaces (empty for kernel threads),
    /// at most [`CMDLINE_MAX`] bytes; shared, not copied, with the
    /// process's forks until they exec.
    pub cmdline: std::sync::Arc<str>,
    /// Executable path.
    pub exe: Option<String>,
    /// Real uid.
    pub uid: u32,
    /// Start time, clock ticks after boot (stat field 22).
    pub start_ticks: u64,
    /// Cgroup paths.
    pub cgroups: ProcCgroups,
}

/// Memory of a live process, from /proc/PID/status (kB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusMem {
    /// VmRSS.
    pub rss_kb: u64,
    /// RssAnon.
    pub anon_kb: u64,
    /// RssFile.
    pub file_kb: u64,
    /// RssShmem.
    pub shmem_kb: u64,
}

/// What the correlators read of a live process at the moment they build
/// a record. The recorder reads /proc ([`LiveProc`]); tests give fixed
/// answers, so every join is unit-testable.
pub trait ProcFacts {
    /// The memory of `pid` now; `None` when it is gone.
    fn status_mem(&self, pid: u32) -> Option<StatusMem>;
}

/// /proc of this machine.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveProc;

impl ProcFacts for LiveProc {
    fn status_mem(&self, pid: u32) -> Option<StatusMem> {
        read_status_mem(pid)
    }
}

fn proc_path(pid: u32, file: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{file}"))
}

/// Reads a /proc file as bytes, then as text with anything that is not
/// UTF-8 replaced: a process name or cgroup path that is not UTF-8 must
/// not make the whole file unreadable (the model would keep the parent's
/// cgroup for such a process).
fn read_text(pid: u32, file: &str) -> io::Result<String> {
    let bytes = fs::read(proc_path(pid, file))?;
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// Reads /proc/PID. Fails when the process is gone.
pub fn read(pid: u32) -> io::Result<ProcInfo> {
    let stat = read_text(pid, "stat")?;
    let (comm, ppid, start_ticks) =
        parse_stat(&stat).ok_or_else(|| io::Error::other("bad stat"))?;
    let status = read_text(pid, "status").unwrap_or_default();
    let cmdline = read_cmdline(pid).unwrap_or_default();
    let exe = fs::read_link(proc_path(pid, "exe"))
        .ok()
        .map(|p| p.display().to_string());
    let cgroups = read_text(pid, "cgroup")
        .map(|t| ProcCgroups::parse(&t))
        .unwrap_or_default();
    Ok(ProcInfo {
        pid,
        ppid,
        comm,
        cmdline: cmdline.into(),
        exe,
        uid: parse_uid(&status).unwrap_or(0),
        start_ticks,
        cgroups,
    })
}

/// The start time (clock ticks after boot) of the process now holding
/// `pid`, from /proc/PID/stat alone (which never waits on the process's
/// memory map lock); `Err(NotFound)` when no process holds it.
pub fn start_ticks(pid: u32) -> io::Result<u64> {
    let stat = read_text(pid, "stat")?;
    parse_stat(&stat)
        .map(|(_, _, t)| t)
        .ok_or_else(|| io::Error::other("bad stat"))
}

/// Reads the memory lines of /proc/PID/status.
pub fn read_status_mem(pid: u32) -> Option<StatusMem> {
    let status = read_text(pid, "status").ok()?;
    parse_status_mem(&status)
}

/// Re-reads the cgroups of a process.
pub fn read_cgroups(pid: u32) -> Option<ProcCgroups> {
    read_text(pid, "cgroup")
        .ok()
        .map(|t| ProcCgroups::parse(&t))
}

/// `pid (comm) state ppid ... starttime(22) ...`; comm may hold spaces and parens.
fn parse_stat(stat: &str) -> Option<(String, u32, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // rest[0] is field 3 (state): field N is rest[N - 3].
    Some((
        comm,
        rest.get(1)?.parse().ok()?,
        rest.get(19)?.parse().ok()?,
    ))
}

fn parse_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn parse_status_mem(status: &str) -> Option<StatusMem> {
    let kb = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some(StatusMem {
        rss_kb: kb("VmRSS:")?,
        anon_kb: kb("RssAnon:").unwrap_or(0),
        file_kb: kb("RssFile:").unwrap_or(0),
        shmem_kb: kb("RssShmem:").unwrap_or(0),
    })
}

/// The most of a command line kept per process: a local user's program
/// can have megabytes of arguments, and the model keeps one per process.
pub const CMDLINE_MAX: usize = 4096;

/// Reads /proc/PID/cmdline, at most [`CMDLINE_MAX`] bytes of it.
fn read_cmdline(pid: u32) -> io::Result<String> {
    use io::Read as _;
    let mut raw = Vec::new();
    fs::File::open(proc_path(pid, "cmdline"))?
        .take(CMDLINE_MAX as u64 + 1)
        .read_to_end(&mut raw)?;
    let cut = raw.len() > CMDLINE_MAX;
    raw.truncate(CMDLINE_MAX);
    Ok(crate::collect::decode::join_cmdline(&raw, cut))
}

pub use crate::util::sys::all_pids;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let s = "3129 (python3) S 1 3129 3129 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 13449 76963840 16950 18446744073709551615";
        assert_eq!(parse_stat(s), Some(("python3".into(), 1, 13449)));
        let odd = "77 (a (b) c) R 5 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c".into(), 5, 999)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn status_lines() {
        let s = "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nVmRSS:\t   67800 kB\nRssAnon:\t   65152 kB\nRssFile:\t    2648 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(parse_uid(s), Some(1000));
        assert_eq!(
            parse_status_mem(s),
            Some(StatusMem {
                rss_kb: 67800,
                anon_kb: 65152,
                file_kb: 2648,
                shmem_kb: 0
            })
        );
        assert_eq!(parse_status_mem("Name:\tkthreadd\n"), None);
    }

    #[test]
    fn a_long_command_line_is_kept_cut() {
        // This test process's own: read as /proc has it, within the cap.
        let me = read_cmdline(std::process::id()).unwrap();
        assert!(!me.is_empty() && me.len() <= CMDLINE_MAX + '…'.len_utf8());
    }

    #[test]
    fn reads_this_process() {
        let me = read(std::process::id()).unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_ticks > 0);
        assert!(me.exe.is_some());
        assert!(read_status_mem(me.pid).unwrap().rss_kb > 0);
        assert!(all_pids().contains(&me.pid));
    }
}
