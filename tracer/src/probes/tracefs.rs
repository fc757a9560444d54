//! tracefs: where it is (mounting it when nothing has), and the `format`
//! files that give each tracepoint's field layout on the running kernel.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

/// Errors finding tracefs or reading a format file.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// Neither mount point has tracefs, and mounting it failed.
    #[error(
        "tracefs is not mounted and mounting it at /sys/kernel/tracing failed; \
         run `mount -t tracefs nodev /sys/kernel/tracing` as root"
    )]
    Mount {
        /// Why mount(2) failed.
        #[source]
        source: io::Error,
    },
    /// The tracepoint does not exist on this kernel.
    #[error("tracepoint {category}:{name} does not exist on this kernel ({path})")]
    MissingTracepoint {
        /// Tracepoint category (`oom`).
        category: String,
        /// Tracepoint name (`mark_victim`).
        name: String,
        /// The format file looked for.
        path: PathBuf,
    },
    /// A format file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Mount points where tracefs may live, in the order aya looks.
pub const TRACEFS_PATHS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs root if one is mounted (a directory with an `events` folder).
pub fn find() -> Option<PathBuf> {
    TRACEFS_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Where tracefs is mounted, by /proc/self/mounts, whether or not this
/// user may look inside it.
pub fn mount_point() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mount_point_in(&mounts)
}

fn mount_point_in(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "tracefs").then(|| PathBuf::from(dir))
    })
}

/// The tracefs root, mounting tracefs at /sys/kernel/tracing if no mount
/// exists yet (some minimal hosts boot without it). Must run before the
/// first tracepoint attach: aya resolves the path once per process.
pub fn find_or_mount() -> Result<PathBuf, TracefsError> {
    if let Some(p) = find() {
        return Ok(p);
    }
    let target = Path::new(TRACEFS_PATHS[0]);
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL in constant");
    let (src, dir, fstype) = (c("nodev"), c(TRACEFS_PATHS[0]), c("tracefs"));
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the
    // call; data is null, which tracefs accepts.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dir.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError::Mount {
            source: io::Error::last_os_error(),
        });
    }
    tracing::info!("mounted tracefs at {}", target.display());
    Ok(target.to_path_buf())
}

/// One field of a tracepoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// C declaration without the name (`int`, `__data_loc char[]`, `char[16]`).
    pub ty: String,
    /// Field name.
    pub name: String,
    /// Byte offset in the record.
    pub offset: u16,
    /// Size in bytes.
    pub size: u16,
}

/// The parsed `format` file of one tracepoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Format {
    /// Fields in the record, common ones included.
    pub fields: Vec<Field>,
}

impl Format {
    /// Parses the text of a `format` file. Lines that are not field lines are
    /// ignored; malformed field lines are skipped.
    pub fn parse(text: &str) -> Self {
        let fields = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("field:"))
            .filter_map(parse_field)
            .collect();
        Self { fields }
    }

    /// Reads the format of `category:name` under the tracefs root.
    pub fn read(root: &Path, category: &str, name: &str) -> Result<Self, TracefsError> {
        let path = root.join("events").join(category).join(name).join("format");
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Self::parse(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(TracefsError::MissingTracepoint {
                category: category.into(),
                name: name.into(),
                path,
            }),
            Err(source) => Err(TracefsError::Read { path, source }),
        }
    }

    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// `unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;`
fn parse_field(rest: &str) -> Option<Field> {
    let mut parts = rest.split(';').map(str::trim);
    let decl = parts.next()?;
    let mut offset = None;
    let mut size = None;
    for p in parts {
        if let Some(v) = p.strip_prefix("offset:") {
            offset = v.parse().ok();
        } else if let Some(v) = p.strip_prefix("size:") {
            size = v.parse().ok();
        }
    }
    // The name is the last identifier, before any array suffix:
    // `char comm[16]` -> (`char[16]`, `comm`); `__data_loc char[] comm`.
    let (ty, name) = if decl.ends_with(']') {
        let open = decl.rfind('[')?;
        let before = decl[..open].trim_end();
        let split = before.rfind(char::is_whitespace)?;
        let ty = format!("{}{}", before[..split].trim(), &decl[open..]);
        (ty, before[split + 1..].to_string())
    } else {
        let split = decl.rfind(char::is_whitespace)?;
        (
            decl[..split].trim().to_string(),
            decl[split + 1..].to_string(),
        )
    };
    Some(Field {
        ty,
        name,
        offset: offset?,
        size: size?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracefs_mount_point_from_mounts() {
        let m = "proc /proc proc rw 0 0\nnodev /sys/kernel/tracing tracefs rw,relatime 0 0\n";
        assert_eq!(
            mount_point_in(m),
            Some(PathBuf::from("/sys/kernel/tracing"))
        );
        assert_eq!(mount_point_in("proc /proc proc rw 0 0\n"), None);
    }

    const MARK_VICTIM_6_18: &str = "name: mark_victim
ID: 609
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;
\tfield:uid_t uid;\toffset:48;\tsize:4;\tsigned:0;
\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;

print fmt: \"pid=%d comm=%s\", REC->pid, __get_str(comm)
";

    #[test]
    fn parses_each_field_kind() {
        let f = Format::parse(MARK_VICTIM_6_18);
        assert_eq!(f.fields.len(), 9);
        let comm = f.field("comm").unwrap();
        assert_eq!(
            (comm.ty.as_str(), comm.offset, comm.size),
            ("__data_loc char[]", 12, 4)
        );
        let vm = f.field("total_vm").unwrap();
        assert_eq!(
            (vm.ty.as_str(), vm.offset, vm.size),
            ("unsigned long", 16, 8)
        );
        let adj = f.field("oom_score_adj").unwrap();
        assert_eq!((adj.ty.as_str(), adj.offset, adj.size), ("short", 64, 2));
    }

    #[test]
    fn parses_fixed_arrays_and_bools() {
        let text = "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
                    \tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\
                    \tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n";
        let f = Format::parse(text);
        let comm = f.field("comm").unwrap();
        assert_eq!(
            (comm.ty.as_str(), comm.offset, comm.size),
            ("char[16]", 8, 16)
        );
        assert_eq!(f.field("group_dead").unwrap().ty, "bool");
        assert_eq!(f.field("pid").unwrap().offset, 24);
    }

    #[test]
    fn skips_malformed_lines() {
        let f = Format::parse("\tfield:int;\toffset:x;\n\tfield:int pid;\tsize:4;\n");
        assert!(f.fields.is_empty());
    }

    #[test]
    fn missing_tracepoint_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = Format::read(dir.path(), "oom", "mark_victim").unwrap_err();
        assert!(
            matches!(err, TracefsError::MissingTracepoint { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("oom:mark_victim"));
    }
}
