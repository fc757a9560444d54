//! CUDA probes on the user side: which functions, where the libraries of
//! a process are (through /proc/PID/root, so containers work), and
//! attaching the two uprobe programs to each function with its id as the
//! cookie.

use std::{
    collections::{BTreeSet, HashSet},
    fs, io,
    num::NonZeroU32,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::programs::{
    UProbe,
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
};
use object::{Object as _, ObjectSymbol as _};

use super::{ProbeError, Probes, uprobe::CUDA};

pub use tracer_common::cuda::{FUNCTIONS, name};

/// Whether a mapped file's name makes it a CUDA runtime or driver library.
pub fn is_cuda_library_name(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with("libcudart") || base.starts_with("libcuda.so") || base.starts_with("libcuda-")
}

/// A file in a process that exports probed functions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaLibrary {
    /// The path as the process sees it (its own mount namespace).
    pub path: String,
    /// The path tracer opens: /proc/PID/root + `path`.
    pub host_path: PathBuf,
    /// (st_dev, st_ino): one attachment per distinct file.
    pub id: (u64, u64),
    /// Probed functions it exports (ids).
    pub functions: Vec<u32>,
    /// Probed functions it does not export (symbol names), e.g. newer APIs.
    pub missing: Vec<&'static str>,
    /// Whether it is the process's executable (statically linked cudart).
    pub executable: bool,
}

/// Files mapped by `pid` (paths as the process sees them), from /proc/PID/maps.
pub fn mapped_files(pid: u32) -> io::Result<BTreeSet<String>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_maps(&maps))
}

fn parse_maps(maps: &str) -> BTreeSet<String> {
    maps.lines()
        .filter_map(map_path)
        .map(|p| p.trim_end_matches(" (deleted)").to_string())
        .collect()
}

/// The path column of a maps line (`address perms offset dev inode path`).
fn map_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = &rest[rest.find(char::is_whitespace)?..];
    }
    let path = rest.trim();
    path.starts_with('/').then_some(path)
}

/// The probed functions a file exports (dynamic or static symbol table).
pub fn exported_functions(path: &Path) -> io::Result<HashSet<u32>> {
    let data = fs::read(path)?;
    let obj = object::File::parse(&*data).map_err(io::Error::other)?;
    let mut found = HashSet::new();
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        if !sym.is_definition() {
            continue;
        }
        let Ok(n) = sym.name() else { continue };
        // Versioned names look like `cudaMalloc@@libcudart.so.12` in some tables.
        let n = n.split('@').next().unwrap_or(n);
        if let Some(id) = CUDA.id_of(n) {
            found.insert(id);
        }
    }
    Ok(found)
}

/// A file a process maps (or executes) that may hold probed functions,
/// known by a `stat` only: nothing of it has been read yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The path as the process sees it.
    pub path: String,
    /// /proc/PID/root + `path`.
    pub host_path: PathBuf,
    /// (st_dev, st_ino).
    pub id: (u64, u64),
    /// Whether it is the process's executable.
    pub executable: bool,
}

fn candidate(pid: u32, path: &str, executable: bool) -> Option<Candidate> {
    let host_path = PathBuf::from(format!("/proc/{pid}/root{path}"));
    let meta = fs::metadata(&host_path).ok()?;
    meta.is_file().then(|| Candidate {
        path: path.to_string(),
        host_path,
        id: (meta.dev(), meta.ino()),
        executable,
    })
}

/// The files of `pid` that may be CUDA libraries: mapped files named like
/// the runtime or the driver, and the executable (cudart can be linked
/// in). One `stat` each; distinct files only.
pub fn candidates_of(pid: u32) -> io::Result<Vec<Candidate>> {
    let files = mapped_files(pid)?;
    let mut out: Vec<Candidate> = files
        .iter()
        .filter(|p| (CUDA.library)(p))
        .filter_map(|p| candidate(pid, p, false))
        .collect();
    if let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) {
        let exe = exe.display().to_string();
        let exe = exe.trim_end_matches(" (deleted)");
        if !(CUDA.library)(exe)
            && let Some(c) = candidate(pid, exe, true)
        {
            out.push(c);
        }
    }
    let mut seen = HashSet::new();
    out.retain(|c| seen.insert(c.id));
    Ok(out)
}

/// Reads a candidate's symbols: a CUDA library when it exports probed
/// functions. The file is opened again and its (dev, inode) compared, so
/// what is parsed is the file that was stat'ed.
pub fn inspect(c: &Candidate) -> Option<CudaLibrary> {
    let meta = fs::metadata(&c.host_path).ok()?;
    if (meta.dev(), meta.ino()) != c.id {
        return None;
    }
    let exported = exported_functions(&c.host_path).ok()?;
    if exported.is_empty() {
        return None;
    }
    let layers: HashSet<u32> = exported.iter().map(|&f| (CUDA.layer)(f)).collect();
    let mut functions: Vec<u32> = exported.iter().copied().collect();
    functions.sort_unstable();
    let missing = CUDA
        .functions
        .iter()
        .filter(|(id, _)| layers.contains(&(CUDA.layer)(*id)) && !exported.contains(id))
        .map(|(_, n)| *n)
        .collect();
    Some(CudaLibrary {
        path: c.path.clone(),
        host_path: c.host_path.clone(),
        id: c.id,
        functions,
        missing,
        executable: c.executable,
    })
}

/// The CUDA libraries of `pid` (every candidate, inspected).
pub fn libraries_of(pid: u32) -> io::Result<Vec<CudaLibrary>> {
    Ok(candidates_of(pid)?.iter().filter_map(inspect).collect())
}

/// Where the CUDA programs of one library are attached.
#[derive(Debug)]
pub struct CudaAttachment {
    /// The library.
    pub library: CudaLibrary,
    programs: [&'static str; 2],
    entries: Vec<UProbeLinkId>,
    returns: Vec<UProbeLinkId>,
    /// Functions that failed to attach, with why.
    pub failed: Vec<(&'static str, String)>,
}

impl CudaAttachment {
    /// Functions attached.
    pub fn attached(&self) -> usize {
        self.entries.len()
    }
}

impl Probes {
    /// Loads the two CUDA programs into the kernel (once); `floor` loads the
    /// empty twins instead.
    pub fn load_cuda(&mut self, floor: bool) -> Result<(), ProbeError> {
        for name in CUDA.programs(floor) {
            let prog: &mut UProbe = self.program(name).map_err(|e| e.into_probe_error(name))?;
            if prog.fd().is_err() {
                prog.load().map_err(|source| ProbeError::Program {
                    program: name,
                    hook: "uprobe".into(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Attaches the CUDA programs to every probed function `lib` exports,
    /// for process `pid` only or, with `None`, for every process.
    pub fn attach_cuda(
        &mut self,
        lib: &CudaLibrary,
        pid: Option<u32>,
        floor: bool,
    ) -> Result<CudaAttachment, ProbeError> {
        let [entry_prog, return_prog] = CUDA.programs(floor);
        let scope = match pid.and_then(NonZeroU32::new) {
            Some(p) => UProbeScope::OneProcess(p),
            None => UProbeScope::AllProcesses,
        };
        let mut att = CudaAttachment {
            library: lib.clone(),
            programs: [entry_prog, return_prog],
            entries: Vec::new(),
            returns: Vec::new(),
            failed: Vec::new(),
        };
        // Returns first, then entries: a call already running when its
        // entry probe arrives would otherwise open a frame whose return is
        // never seen, and every later call on that thread would pass for a
        // nested one until the frame went stale (30 s of a busy process
        // seen as silence). A return without an entry is ignored.
        let point = |func: u32| UProbeAttachPoint {
            location: UProbeAttachLocation::Symbol(name(func)),
            cookie: Some(u64::from(func)),
        };
        let mut returned = Vec::with_capacity(lib.functions.len());
        for &func in &lib.functions {
            let ret: &mut UProbe = self
                .program(return_prog)
                .map_err(|e| e.into_probe_error(return_prog))?;
            match ret.attach(point(func), &lib.host_path, scope) {
                Ok(r) => returned.push((func, r)),
                Err(err) => att.failed.push((name(func), err.to_string())),
            }
        }
        for (func, r) in returned {
            let entry: &mut UProbe = self
                .program(entry_prog)
                .map_err(|e| e.into_probe_error(entry_prog))?;
            match entry.attach(point(func), &lib.host_path, scope) {
                Ok(e) => {
                    att.entries.push(e);
                    att.returns.push(r);
                }
                Err(err) => {
                    att.failed.push((name(func), err.to_string()));
                    let ret: &mut UProbe = self
                        .program(return_prog)
                        .map_err(|e| e.into_probe_error(return_prog))?;
                    let _ = ret.detach(r);
                }
            }
        }
        Ok(att)
    }

    /// Removes an attachment's probes.
    pub fn detach_cuda(&mut self, att: CudaAttachment) {
        let mut links = Vec::with_capacity(att.entries.len() * 2);
        let [entry_prog, return_prog] = att.programs;
        for (name, ids) in [(entry_prog, att.entries), (return_prog, att.returns)] {
            if let Ok(prog) = self.program::<UProbe>(name) {
                links.extend(ids.into_iter().filter_map(|id| prog.take_link(id).ok()));
            }
        }
        // Dropping a link removes its uprobe (the kernel waits for a grace
        // period each time, one after the other). Entries go before returns,
        // so no frame is opened whose return can no longer be seen.
        drop(links);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::cuda;

    #[test]
    fn every_function_has_a_shape_and_a_unique_id() {
        let mut ids = HashSet::new();
        for (id, sym) in FUNCTIONS {
            assert!(cuda::shape(*id).is_some(), "{sym}");
            assert!(ids.insert(*id), "{sym}");
            assert_eq!(*id < cuda::DRIVER, sym.starts_with("cuda"), "{sym} layer");
        }
        assert_eq!(name(cuda::MEM_ALLOC), "cuMemAlloc_v2");
        assert!(cuda::allocates(cuda::MALLOC) && cuda::allocates(cuda::MEM_CREATE));
        assert!(!cuda::allocates(cuda::FREE) && !cuda::allocates(cuda::MEM_ADDRESS_RESERVE));
    }

    #[test]
    fn library_names_and_maps() {
        for (p, want) in [
            (
                "/usr/local/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
                true,
            ),
            ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", true),
            ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", true),
            ("/opt/conda/lib/libcudart-d0da41ae.so.11.0", true),
            ("/usr/lib/x86_64-linux-gnu/libcudnn.so.9", false),
            ("/usr/lib/x86_64-linux-gnu/libc.so.6", false),
        ] {
            assert_eq!(is_cuda_library_name(p), want, "{p}");
        }
        let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 131 /usr/bin/python3.11
7f00aa000000-7f00aa100000 r-xp 00010000 08:01 777 /opt/venv/lib/libcudart.so.12
7f00ab000000-7f00ab001000 rw-p 00000000 00:00 0 
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]
7f00ac000000-7f00ac100000 r-xp 00000000 08:01 778 /tmp/lib with space.so (deleted)
";
        let files: Vec<String> = parse_maps(maps).into_iter().collect();
        assert_eq!(
            files,
            [
                "/opt/venv/lib/libcudart.so.12",
                "/tmp/lib with space.so",
                "/usr/bin/python3.11"
            ]
        );
    }
}
