//! Where a process's CPython interpreter is, and the field offsets of its
//! version: found from the ELF file of `python3.N` or `libpython3.N.so`
//! that the process maps.

use std::collections::HashMap;

use tracer_common::python::{NONE, PyLayout};

use super::memory::read_mem;
use crate::stacks::maps::Mapping;

/// The offsets of one CPython version (x86_64, the default build).
#[derive(Clone, Copy, Debug)]
pub struct Offsets {
    pub minor: u8,
    pub interp_head: u16,
    pub threads_head: u16,
    pub ts_next: u16,
    pub ts_id: u16,
    pub id_is_pthread: bool,
    pub ts_frame: u16,
    pub cframe_frame: u16,
    pub f_back: u16,
    pub f_code: u16,
    pub f_instr: u16,
    pub instr_is_ptr: bool,
    pub f_owner: u16,
    pub co_filename: usize,
    /// `co_qualname` from 3.11, `co_name` before.
    pub co_name: usize,
    pub co_firstlineno: usize,
    /// `co_lnotab` (3.9), `co_linetable`.
    pub co_linetable: usize,
    /// Where the bytecode starts in the code object (3.11+).
    pub co_code: usize,
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`.
    pub ascii_size: usize,
    pub compact_size: usize,
}

/// Read with gdb from the DWARF of CPython 3.9.18, 3.10.13, 3.11.7, 3.12.1
/// and 3.13.0 (`docs/dev/python.md`). Patch releases keep these layouts;
/// a build that differs fails the code-object check, not silently.
const OFFSETS: [Offsets; 5] = [
    Offsets {
        minor: 9,
        interp_head: 32,
        threads_head: 8,
        ts_next: 8,
        ts_id: 176,
        id_is_pthread: true,
        ts_frame: 24,
        cframe_frame: NONE,
        f_back: 24,
        f_code: 32,
        f_instr: 104,
        instr_is_ptr: false,
        f_owner: NONE,
        co_filename: 104,
        co_name: 112,
        co_firstlineno: 40,
        co_linetable: 120,
        co_code: 0,
        ascii_size: 48,
        compact_size: 72,
    },
    Offsets {
        minor: 10,
        interp_head: 32,
        threads_head: 8,
        ts_next: 8,
        ts_id: 176,
        id_is_pthread: true,
        ts_frame: 24,
        cframe_frame: NONE,
        f_back: 24,
        f_code: 32,
        f_instr: 96,
        instr_is_ptr: false,
        f_owner: NONE,
        co_filename: 104,
        co_name: 112,
        co_firstlineno: 40,
        co_linetable: 120,
        co_code: 0,
        ascii_size: 48,
        compact_size: 72,
    },
    Offsets {
        minor: 11,
        interp_head: 40,
        threads_head: 16,
        ts_next: 8,
        ts_id: 160,
        id_is_pthread: false,
        ts_frame: 56,
        cframe_frame: 8,
        f_back: 48,
        f_code: 32,
        f_instr: 56,
        instr_is_ptr: true,
        f_owner: 68,
        co_filename: 112,
        co_name: 128,
        co_firstlineno: 72,
        co_linetable: 136,
        co_code: 184,
        ascii_size: 48,
        compact_size: 72,
    },
    Offsets {
        minor: 12,
        interp_head: 40,
        threads_head: 72,
        ts_next: 8,
        ts_id: 144,
        id_is_pthread: false,
        ts_frame: 56,
        cframe_frame: 0,
        f_back: 8,
        f_code: 0,
        f_instr: 56,
        instr_is_ptr: true,
        f_owner: 70,
        co_filename: 112,
        co_name: 128,
        co_firstlineno: 68,
        co_linetable: 136,
        co_code: 192,
        ascii_size: 40,
        compact_size: 56,
    },
    Offsets {
        minor: 13,
        interp_head: 632,
        threads_head: 7344,
        ts_next: 8,
        ts_id: 160,
        id_is_pthread: false,
        ts_frame: 72,
        cframe_frame: NONE,
        f_back: 8,
        f_code: 0,
        f_instr: 56,
        instr_is_ptr: true,
        f_owner: 70,
        co_filename: 112,
        co_name: 128,
        co_firstlineno: 68,
        co_linetable: 136,
        co_code: 200,
        ascii_size: 40,
        compact_size: 56,
    },
];

/// `FRAME_OWNED_BY_CSTACK` (3.12+): the shim frame an entry into the
/// interpreter's loop pushes.
pub const OWNED_BY_CSTACK: u8 = 3;

/// A process's interpreter: where it is, and the version's offsets.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// CPython 3.`minor`.
    pub minor: u8,
    /// What the stack programs read ([`tracer_common::maps::PY_PROCS`]).
    pub layout: PyLayout,
    /// Address of `PyCode_Type` in the process: a code object's type.
    pub code_type: u64,
    /// The version's offsets.
    pub offsets: Offsets,
}

/// What a mapped file tells of an interpreter in it: the version, the
/// file's addresses of `_PyRuntime` and `PyCode_Type`, and its segments
/// (virtual address, file offset, file size), for the load bias.
#[derive(Clone, Debug, PartialEq, Eq)]
struct InFile {
    minor: u8,
    runtime: u64,
    code_type: u64,
    segments: Vec<(u64, u64, u64)>,
}

impl InFile {
    /// What the process's addresses are of the file's: the load bias, from
    /// an executable mapping of it.
    fn bias(&self, m: &Mapping) -> Option<u64> {
        self.segments.iter().find_map(|&(addr, off, size)| {
            (m.offset >= off && m.offset < off + size)
                .then(|| m.start.wrapping_sub(addr + (m.offset - off)))
        })
    }
}

/// The CPython version a file's name gives: `python3.11`,
/// `libpython3.11.so.1.0`; `Err` for a free-threaded build (`3.13t`),
/// whose layouts differ; `None` for any other name.
fn version_from_name(path: &str) -> Option<Result<u8, String>> {
    let base = path.rsplit('/').next()?;
    let rest = base
        .strip_prefix("libpython3.")
        .or_else(|| base.strip_prefix("python3."))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let minor: u8 = digits.parse().ok()?;
    let after = &rest[digits.len()..];
    if after.starts_with('t') {
        return Some(Err(format!("free-threaded CPython 3.{minor}t")));
    }
    (after.is_empty()
        || after.starts_with(".so")
        || after.starts_with('d')
        || after.starts_with('m'))
    .then_some(Ok(minor))
}

/// Reads what `data` (an ELF file mapped from `path`) says of an
/// interpreter in it. Only the parts read are read: the headers and the
/// dynamic symbols, where CPython exports what is looked for (the full
/// symbol table, tens of MiB in a build with debug info, only when they
/// are not there).
fn in_file<'a, R: object::ReadRef<'a>>(path: &str, data: R) -> Result<Option<InFile>, String> {
    use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
    let named = version_from_name(path);
    let file = object::File::parse(data).map_err(|e| format!("{path}: {e}"))?;
    let mut runtime = None;
    let mut code_type = None;
    let mut py_version = None;
    for pass in 0..2 {
        // The full symbol table only where the dynamic one lacks them.
        if pass == 1 && runtime.is_some() && code_type.is_some() {
            break;
        }
        let symbols = if pass == 0 {
            file.dynamic_symbols()
        } else {
            file.symbols()
        };
        for s in symbols {
            match s.name() {
                Ok("_PyRuntime") => runtime = Some(s.address()),
                Ok("PyCode_Type") => code_type = Some(s.address()),
                Ok("Py_Version") => py_version = Some(s.address()),
                _ => {}
            }
        }
    }
    let (Some(runtime), Some(code_type)) = (runtime, code_type) else {
        return Ok(None);
    };
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| {
            let (off, size) = s.file_range();
            (s.address(), off, size)
        })
        .collect();
    // `Py_Version` (3.11+) is the version as a constant in the file.
    let from_symbol = py_version.and_then(|a| {
        let off = segments.iter().find_map(|&(addr, off, size)| {
            (a >= addr && a < addr + size).then(|| off + (a - addr))
        })? as usize;
        let v = u32::from_le_bytes(data.read_bytes_at(off as u64, 4).ok()?.try_into().ok()?);
        ((v >> 24) == 3).then_some(((v >> 16) & 0xff) as u8)
    });
    let minor = match (named, from_symbol) {
        (Some(Err(e)), _) => return Err(e),
        (_, Some(m)) => m,
        (Some(Ok(m)), None) => m,
        (None, None) => return Err(format!("{path}: an interpreter of no known version")),
    };
    Ok(Some(InFile {
        minor,
        runtime,
        code_type,
        segments,
    }))
}

/// Files that hold an interpreter (or not), by (device, inode), so a
/// file is read once however many processes map it.
#[derive(Clone, Default)]
pub struct Detector {
    files: std::sync::Arc<std::sync::Mutex<HashMap<(u64, u64), FileFacts>>>,
}

/// What a file held: an interpreter, none, or one that cannot be walked.
type FileFacts = Result<Option<InFile>, String>;

/// Files remembered by a [`Detector`] at most.
const FILES_KEPT: usize = 1024;

impl Detector {
    /// Finds the interpreter of `pid` in its executable mappings:
    /// `Ok(None)` when it runs none; `Err` with why when it runs one tracer
    /// cannot walk.
    pub fn detect(&self, pid: u32, maps: &[Mapping]) -> Result<Option<Interpreter>, String> {
        for m in maps {
            let base = m.path.rsplit('/').next().unwrap_or("");
            if !(base.starts_with("python") || base.starts_with("libpython")) {
                continue;
            }
            let known = self.files.lock().ok().and_then(|f| f.get(&m.file).cloned());
            let found = match known {
                Some(f) => f,
                None => {
                    let Ok(file) = std::fs::File::open(m.host_path(pid)) else {
                        continue;
                    };
                    let f = in_file(&m.path, &object::ReadCache::new(file));
                    if let Ok(mut files) = self.files.lock() {
                        if files.len() >= FILES_KEPT {
                            files.clear();
                        }
                        files.insert(m.file, f.clone());
                    }
                    f
                }
            };
            if let Some(found) = found? {
                return interpreter(pid, m, &found).map(Some);
            }
        }
        Ok(None)
    }
}

/// The interpreter of `pid`, from a file of it mapped at `m`.
fn interpreter(pid: u32, m: &Mapping, found: &InFile) -> Result<Interpreter, String> {
    let bias = found
        .bias(m)
        .ok_or_else(|| format!("{}: no segment maps", m.path))?;
    let Some(o) = OFFSETS.iter().find(|o| o.minor == found.minor) else {
        return Err(format!(
            "CPython 3.{}: its layout is not known",
            found.minor
        ));
    };
    let runtime = found.runtime.wrapping_add(bias);
    // 3.13 starts `_PyRuntime` with its debug offsets' cookie: a check
    // that this is the runtime state the table describes.
    if o.minor >= 13 {
        let mut cookie = [0u8; 8];
        if !read_mem(pid, runtime, &mut cookie) || &cookie != b"xdebugpy" {
            return Err(format!(
                "CPython 3.{}: _PyRuntime has no debug cookie",
                o.minor
            ));
        }
    }
    Ok(Interpreter {
        minor: o.minor,
        layout: PyLayout {
            runtime,
            interp_head: o.interp_head,
            threads_head: o.threads_head,
            ts_next: o.ts_next,
            ts_id: o.ts_id,
            ts_frame: o.ts_frame,
            cframe_frame: o.cframe_frame,
            f_back: o.f_back,
            f_code: o.f_code,
            f_instr: o.f_instr,
            f_owner: o.f_owner,
            id_is_pthread: o.id_is_pthread as u8,
            instr_is_ptr: o.instr_is_ptr as u8,
            _pad: [0; 2],
        },
        code_type: found.code_type.wrapping_add(bias),
        offsets: *o,
    })
}

/// An interpreter of CPython 3.`minor` at no address, for tests of what
/// is built on it.
#[cfg(test)]
pub fn for_test(minor: u8) -> Interpreter {
    let o = *OFFSETS
        .iter()
        .find(|o| o.minor == minor)
        .expect("a known version");
    Interpreter {
        minor,
        layout: PyLayout::default(),
        code_type: 0,
        offsets: o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_names_cpython_installs() {
        assert_eq!(version_from_name("/usr/bin/python3.11"), Some(Ok(11)));
        assert_eq!(
            version_from_name("/root/.pyenv/versions/3.9.18/lib/libpython3.9.so.1.0"),
            Some(Ok(9))
        );
        assert_eq!(
            version_from_name("/usr/lib/libpython3.13d.so.1.0"),
            Some(Ok(13))
        );
        assert!(matches!(
            version_from_name("/usr/bin/python3.13t"),
            Some(Err(_))
        ));
        assert_eq!(version_from_name("/usr/bin/python3"), None);
        assert_eq!(version_from_name("/opt/python3.11-tools/x"), None);
    }

    /// The CPython builds of this machine kind: pyenv's shared libpython of
    /// each version in the table (with DWARF), by minor version.
    fn pyenv_libs() -> Vec<(u8, std::path::PathBuf)> {
        let mut out = Vec::new();
        for o in &OFFSETS {
            let v = format!("3.{}", o.minor);
            let lib = super::super::pyenv(o.minor)
                .map(|p| p.join(format!("lib/libpython{v}.so.1.0")))
                .filter(|p| p.exists());
            match lib {
                Some(l) => out.push((o.minor, l)),
                None => assert!(
                    std::env::var_os("CI").is_none(),
                    "CPython {v} is missing from pyenv"
                ),
            }
        }
        out
    }

    /// Each real build's file gives its version, `_PyRuntime` and
    /// `PyCode_Type`; Debian's stripped, non-PIE python3.11 too (from its
    /// dynamic symbols and `Py_Version`).
    #[test]
    fn real_interpreter_files_are_found() {
        let mut files = pyenv_libs();
        files.push((11, "/usr/bin/python3.11".into()));
        for (minor, path) in files {
            let file = object::ReadCache::new(std::fs::File::open(&path).unwrap());
            let found = in_file(path.to_str().unwrap(), &file)
                .unwrap()
                .unwrap_or_else(|| panic!("{}: no interpreter", path.display()));
            assert_eq!(found.minor, minor, "{}", path.display());
            assert!(found.runtime != 0 && found.code_type != 0);
        }
        // A file of another program holds none.
        let bytes = std::fs::read("/bin/true").unwrap();
        assert_eq!(in_file("/bin/true", &bytes[..]), Ok(None));
    }

    /// The table is what gdb reads from each real build's DWARF.
    #[test]
    fn the_offsets_are_the_real_builds() {
        for (minor, lib) in pyenv_libs() {
            let o = OFFSETS.iter().find(|o| o.minor == minor).unwrap();
            let (threads, frame_of_ts, frame) = match minor {
                9 | 10 => ("tstate_head", "frame", "PyFrameObject"),
                13 => (
                    "threads.head",
                    "current_frame",
                    "struct _PyInterpreterFrame",
                ),
                _ => ("threads.head", "cframe", "struct _PyInterpreterFrame"),
            };
            let (back, code, instr) = match minor {
                9 | 10 => ("f_back", "f_code", "f_lasti"),
                11 | 12 => ("previous", "f_code", "prev_instr"),
                _ => ("previous", "f_executable", "instr_ptr"),
            };
            let id = if minor <= 10 {
                "thread_id"
            } else {
                "native_thread_id"
            };
            let mut want: Vec<(String, u64)> = vec![
                ("struct pyruntimestate".into(), o.interp_head as u64),
                ("PyInterpreterState".into(), o.threads_head as u64),
                ("PyThreadState".into(), o.ts_next as u64),
                ("PyThreadState".into(), o.ts_id as u64),
                ("PyThreadState".into(), o.ts_frame as u64),
                (frame.into(), o.f_back as u64),
                (frame.into(), o.f_code as u64),
                (frame.into(), o.f_instr as u64),
                ("PyCodeObject".into(), o.co_filename as u64),
                ("PyCodeObject".into(), o.co_name as u64),
                ("PyCodeObject".into(), o.co_firstlineno as u64),
                ("PyCodeObject".into(), o.co_linetable as u64),
            ];
            let name = if minor >= 11 {
                "co_qualname"
            } else {
                "co_name"
            };
            let table = if minor == 9 {
                "co_lnotab"
            } else {
                "co_linetable"
            };
            let fields = [
                "interpreters.head",
                threads,
                "next",
                id,
                frame_of_ts,
                back,
                code,
                instr,
                "co_filename",
                name,
                "co_firstlineno",
                table,
            ];
            if minor >= 11 {
                want.push(("PyCodeObject".into(), o.co_code as u64));
                want.push((frame.into(), o.f_owner as u64));
            }
            let mut fields: Vec<&str> = fields.to_vec();
            if minor >= 11 {
                fields.push("co_code_adaptive");
                fields.push(if minor == 11 { "is_entry" } else { "owner" });
            }
            if minor == 11 || minor == 12 {
                want.push(("_PyCFrame".into(), o.cframe_frame as u64));
                fields.push("current_frame");
            }
            let mut gdb = std::process::Command::new("gdb");
            gdb.args(["-batch", "-nx"]);
            for ((ty, _), f) in want.iter().zip(&fields) {
                gdb.arg("-ex")
                    .arg(format!("printf \"%d\\n\", (long)&(({ty}*)0)->{f}"));
            }
            gdb.arg("-ex").arg(
                "printf \"%d\\n%d\\n\", sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject)",
            );
            let out = gdb
                .arg(&lib)
                .output()
                .expect("gdb (cargo xtask setup installs it)");
            let text = String::from_utf8_lossy(&out.stdout);
            let got: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            let mut expect: Vec<u64> = want.iter().map(|(_, v)| *v).collect();
            expect.extend([o.ascii_size as u64, o.compact_size as u64]);
            assert_eq!(
                got,
                expect,
                "3.{minor} ({}): gdb says {text} {}",
                lib.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
