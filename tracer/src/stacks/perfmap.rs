//! Names for JIT code from perf maps: the `/tmp/perf-PID.map` a runtime
//! writes (`node --perf-basic-prof`, `python3 -X perf`, JVM agents), one
//! `START SIZE name` line (hex, hex, text) per function it compiled.
//!
//! The file is read as the process sees it: under its root directory,
//! opened through /proc/PID/root while it lives (samples are often named
//! after a process was killed), with the pid of its own namespace. It is
//! only trusted when it is a regular file owned by the process's own user
//! and within a size bound: any local user could plant a file at that
//! path, and tracer runs as root.

use std::{
    collections::HashMap,
    ffi::CString,
    fs::File,
    io::Read as _,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    sync::Arc,
};

/// Bytes of a perf map read at most.
const MAX_BYTES: u64 = 64 << 20;
/// Characters of a name kept at most.
const MAX_NAME: usize = 512;

/// One process's map: (start, end, name), sorted by start.
type Entries = Arc<Vec<(u64, u64, String)>>;

/// The perf maps of the processes whose frames are named, each read again
/// when its file changed (a runtime appends as it compiles).
#[derive(Default)]
pub struct PerfMaps {
    roots: HashMap<u32, Root>,
    by_pid: HashMap<u32, Read>,
}

/// Where a process's perf map is, taken while it lives: its root
/// directory (held open: it stays valid after the process ends), its pid
/// in its own namespace, and its real uid.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
    nspid: u32,
    uid: u32,
}

impl Root {
    /// `pid`'s, or `None` when it is gone or has no perf map now (a
    /// runtime writes it from its start, or from an agent's attach): only
    /// processes with one hold a descriptor.
    pub fn of(pid: u32) -> Option<Self> {
        let (nspid, uid) = ids(pid)?;
        std::fs::symlink_metadata(format!("/proc/{pid}/root/tmp/perf-{nspid}.map")).ok()?;
        let path = CString::new(format!("/proc/{pid}/root")).ok()?;
        // SAFETY: a NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        // SAFETY: a descriptor just opened, owned from here on.
        (fd >= 0).then(|| Self {
            dir: unsafe { OwnedFd::from_raw_fd(fd) },
            nspid,
            uid,
        })
    }

    /// The map's name as the process sees it.
    fn name(&self) -> String {
        format!("/tmp/perf-{}.map", self.nspid)
    }

    /// Opens the map under the root: no symlink at the last step, and no
    /// wait on a FIFO.
    fn open(&self) -> std::io::Result<File> {
        let rel = CString::new(format!("tmp/perf-{}.map", self.nspid))?;
        // SAFETY: a directory descriptor we hold and a NUL-terminated path.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                rel.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned from here on.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

struct Read {
    /// (size, mtime) of the file when read; `None`: there was none, or
    /// it was refused.
    stamp: Option<(u64, i64)>,
    /// When the file was last looked at (at most once a second).
    looked: std::time::Instant,
    entries: Entries,
    /// The file's name, as the process sees it (for the frames' module).
    name: String,
}

/// The process's pid in its own namespace, and its real uid.
fn ids(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
    };
    let nspid = field("NSpid:")?.last()?.parse().ok()?;
    let uid = field("Uid:")?.first()?.parse().ok()?;
    Some((nspid, uid))
}

/// Parses a perf map's lines; malformed ones are skipped.
pub fn parse(text: &str) -> Vec<(u64, u64, String)> {
    let mut out: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let start = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
            let name: String = it.next()?.trim().chars().take(MAX_NAME).collect();
            (size > 0 && !name.is_empty()).then(|| (start, start.saturating_add(size), name))
        })
        .collect();
    out.sort_by_key(|e| e.0);
    out
}

/// Reads the perf map under `root`, if tracer trusts it: (its size and
/// mtime, its text).
fn read_trusted(root: &Root) -> Result<((u64, i64), String), String> {
    let name = root.name();
    let mut f = root.open().map_err(|e| format!("{name}: {e}"))?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err(format!("{name} is not a regular file"));
    }
    if meta.uid() != root.uid {
        return Err(format!(
            "{name} belongs to uid {}, not to the process's uid {}",
            meta.uid(),
            root.uid
        ));
    }
    if meta.len() > MAX_BYTES {
        return Err(format!("{name} is over {} MiB", MAX_BYTES >> 20));
    }
    let mut text = String::new();
    f.by_ref()
        .take(MAX_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(((meta.len(), meta.mtime()), text))
}

impl PerfMaps {
    /// Where `pid`'s perf map is (taken while it lived).
    pub fn set_root(&mut self, pid: u32, root: Root) {
        self.by_pid.remove(&pid);
        self.roots.insert(pid, root);
    }

    /// The name of `addr` in `pid`'s perf map, with the map's file name.
    pub fn lookup(&mut self, pid: u32, addr: u64) -> Option<(String, String)> {
        let root = self.roots.get(&pid)?;
        let stale = match self.by_pid.get(&pid) {
            None => true,
            Some(r) if r.looked.elapsed() < std::time::Duration::from_secs(1) => false,
            Some(r) => {
                root.open()
                    .and_then(|f| f.metadata())
                    .ok()
                    .map(|m| (m.len(), m.mtime()))
                    != r.stamp
            }
        };
        if stale {
            let read = match read_trusted(root) {
                Ok((stamp, text)) => Read {
                    stamp: Some(stamp),
                    looked: std::time::Instant::now(),
                    entries: Arc::new(parse(&text)),
                    name: root.name(),
                },
                Err(why) => {
                    tracing::debug!("pid {pid}: perf map not used: {why}");
                    Read {
                        stamp: None,
                        looked: std::time::Instant::now(),
                        entries: Arc::default(),
                        name: String::new(),
                    }
                }
            };
            self.by_pid.insert(pid, read);
        }
        let r = self.by_pid.get(&pid)?;
        let i = r.entries.partition_point(|e| e.0 <= addr).checked_sub(1)?;
        let (_, end, name) = &r.entries[i];
        (addr < *end).then(|| (name.clone(), r.name.clone()))
    }

    /// Forgets a process.
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
        self.roots.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_parsed_and_bad_ones_skipped() {
        let text = "7f0000001000 40 JS:*grow /srv/app.js:3:10\n\
                    zz 10 bad\n\
                    7f0000000000 0x20 py::main:/srv/app.py\n\
                    7f0000002000 0 empty\n";
        assert_eq!(
            parse(text),
            vec![
                (
                    0x7f00_0000_0000,
                    0x7f00_0000_0020,
                    "py::main:/srv/app.py".to_string()
                ),
                (
                    0x7f00_0000_1000,
                    0x7f00_0000_1040,
                    "JS:*grow /srv/app.js:3:10".to_string()
                ),
            ]
        );
    }

    /// This test's own process writes a perf map: found by address, and
    /// refused once it is a symlink to a file of another owner.
    #[test]
    fn a_map_is_trusted_only_as_the_processes_own_regular_file() {
        let pid = std::process::id();
        let (nspid, _) = ids(pid).unwrap();
        let path = format!("/tmp/perf-{nspid}.map");
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, "1000 100 jitted_function\n").unwrap();
        let mut maps = PerfMaps::default();
        maps.set_root(pid, Root::of(pid).unwrap());
        let found = maps.lookup(pid, 0x1080);
        assert_eq!(found, Some(("jitted_function".to_string(), path.clone())));
        assert_eq!(maps.lookup(pid, 0x1100), None);
        // Another user's file at that path: refused.
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let root = Root::of(pid).unwrap();
        let refused = read_trusted(&root).unwrap_err();
        assert!(refused.contains("belongs to uid 65534"), "{refused}");
        // A symlink in its place (to a file of root's): refused, whoever
        // owns the link.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        let mut maps = PerfMaps::default();
        let refused = read_trusted(&root).unwrap_err();
        assert!(refused.contains("perf-"), "{refused}");
        maps.set_root(pid, Root::of(pid).unwrap());
        assert_eq!(maps.lookup(pid, 0x1080), None);
        std::fs::remove_file(&path).unwrap();
    }
}
