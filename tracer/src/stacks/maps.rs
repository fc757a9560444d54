//! Executable mappings of a process, from /proc/PID/maps.

use std::{fs, io};

/// One executable file mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// (device, inode) of the file, as the maps line gives them.
    pub file: (u64, u64),
    /// The path as the process sees it (` (deleted)` removed).
    pub path: String,
}

impl Mapping {
    /// The file as tracer opens it, from any mount namespace and even
    /// when deleted: /proc/PID/map_files/START-END.
    pub fn host_path(&self, pid: u32) -> String {
        format!("/proc/{pid}/map_files/{:x}-{:x}", self.start, self.end)
    }
}

/// The executable mappings of `pid`.
pub fn exec_mappings(pid: u32) -> io::Result<Vec<Mapping>> {
    Ok(parse(&fs::read_to_string(format!("/proc/{pid}/maps"))?))
}

/// Parses maps lines (`start-end perms offset major:minor inode path`),
/// keeping executable mappings of files.
pub fn parse(maps: &str) -> Vec<Mapping> {
    maps.lines().filter_map(line).collect()
}

fn line(l: &str) -> Option<Mapping> {
    let mut it = l.split_ascii_whitespace();
    let (range, perms, offset, dev, inode) =
        (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let path = crate::probes::uprobe::map_path(l)?;
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let dev = (hex(major)? << 20) | hex(minor)?;
    Some(Mapping {
        start: hex(start)?,
        end: hex(end)?,
        offset: hex(offset)?,
        file: (dev, inode.parse().ok()?),
        path: path.trim_end_matches(" (deleted)").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executable_file_mappings_only() {
        let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 131 /usr/bin/prog
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 131 /usr/bin/prog
7f00aa000000-7f00aa100000 r-xp 00010000 fd:02 777 /opt/lib/libx.so (deleted)
7f00ab000000-7f00ab001000 rwxp 00000000 00:00 0 
7ffd1c000000-7ffd1c021000 r-xp 00000000 00:00 0                          [vdso]
";
        let m = parse(maps);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].start, 0x55d0c0a01000);
        assert_eq!(m[0].offset, 0x1000);
        assert_eq!(m[0].file, ((8 << 20) | 1, 131));
        assert_eq!(m[1].path, "/opt/lib/libx.so");
        assert_eq!(
            m[1].host_path(7),
            "/proc/7/map_files/7f00aa000000-7f00aa100000"
        );
    }
}
