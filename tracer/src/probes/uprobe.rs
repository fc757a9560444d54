//! A family of user-space functions probed by uprobes: which functions
//! (ids and symbols), which files may hold them, and the programs that
//! serve them. CUDA and the heap allocator are two; the library watcher
//! and the attach code serve any family as is.
//!
//! Each probed function gets one site: its entry, or the first instruction
//! after it that the kernel emulates, when the placement allows (see
//! [`super::placement`]): a uprobe on an instruction the kernel must
//! single-step out of line costs several times one it emulates.

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
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use tracer_common::programs;

use super::{ProbeError, Probes, placement};

/// One family of probed functions.
#[derive(Debug)]
pub struct UprobeFamily {
    /// Its name in logs.
    pub name: &'static str,
    /// Every probed function: (id, symbol). The id is the attach cookie.
    pub functions: &'static [(u32, &'static str)],
    /// Whether a mapped file, by its name, may hold the functions (the
    /// executable is always looked at: the code can be linked in).
    pub library: fn(&str) -> bool,
    /// The layer a function belongs to (a library exports a whole layer,
    /// so a function of a layer it has but does not export is missing).
    pub layer: fn(u32) -> u32,
    /// Functions a file must export to be one of this family's (none: any
    /// one will do).
    pub required: &'static [u32],
    /// Whether a function has a return probe.
    pub returns: fn(u32) -> bool,
    /// The (entry, return) programs.
    pub programs: [&'static str; 2],
    /// The empty (entry, return) twins, for benchmarks of the floor cost.
    pub floor: [&'static str; 2],
    /// Whether the processes attached for are also entered for the
    /// family's syscall tracepoints ([`Probes::heap_pid`]).
    pub syscalls: bool,
}

impl UprobeFamily {
    /// The programs to attach: the real ones, or the empty floor twins.
    pub fn programs(&self, floor: bool) -> [&'static str; 2] {
        if floor { self.floor } else { self.programs }
    }

    /// The id of a symbol of this family.
    pub fn id_of(&self, symbol: &str) -> Option<u32> {
        self.functions
            .iter()
            .find(|(_, s)| *s == symbol)
            .map(|(id, _)| *id)
    }

    /// The symbol of an id of this family.
    pub fn name_of(&self, id: u32) -> &'static str {
        tracer_common::name_in(self.functions, id)
    }
}

/// The CUDA runtime and driver allocation APIs.
pub const CUDA: UprobeFamily = UprobeFamily {
    name: "CUDA",
    functions: tracer_common::cuda::FUNCTIONS,
    library: super::cuda::is_cuda_library_name,
    layer: |id| u32::from(id >= tracer_common::cuda::DRIVER),
    required: &[],
    returns: |_| true,
    programs: [programs::CUDA_ENTRY, programs::CUDA_RETURN],
    floor: [programs::CUDA_FLOOR_ENTRY, programs::CUDA_FLOOR_RETURN],
    syscalls: false,
};

/// malloc and friends, in whichever library exports them.
pub const HEAP: UprobeFamily = UprobeFamily {
    name: "heap",
    functions: tracer_common::heap::FUNCTIONS,
    library: super::heap::is_allocator_library_name,
    layer: |_| 0,
    required: &[tracer_common::heap::MALLOC, tracer_common::heap::FREE],
    returns: tracer_common::heap::returns,
    programs: [programs::HEAP_ENTRY, programs::HEAP_RETURN],
    floor: [programs::HEAP_FLOOR_ENTRY, programs::HEAP_FLOOR_RETURN],
    syscalls: true,
};

/// Where one function is probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Function id.
    pub func: u32,
    /// File offset of the function's entry.
    pub entry: u64,
    /// Bytes from the entry to the probed instruction (0 = the entry).
    pub shift: u64,
}

/// A file in a process that exports probed functions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// The path as the process sees it (its own mount namespace).
    pub path: String,
    /// The path tracer opens: /proc/PID/root + `path`.
    pub host_path: PathBuf,
    /// (st_dev, st_ino): one attachment per distinct file.
    pub id: (u64, u64),
    /// Probed functions it exports (ids, one per distinct address).
    pub functions: Vec<u32>,
    /// Where each is probed.
    pub sites: Vec<Site>,
    /// Probed functions it does not export (symbol names), e.g. newer APIs.
    pub missing: Vec<&'static str>,
    /// Whether it is the process's executable (linked in).
    pub executable: bool,
}

impl Library {
    /// Sites placed after the entry.
    pub fn placed(&self) -> usize {
        self.sites.iter().filter(|s| s.shift > 0).count()
    }
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
pub fn map_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = &rest[rest.find(char::is_whitespace)?..];
    }
    let path = rest.trim();
    path.starts_with('/').then_some(path)
}

/// A probed function found in a file: id, address, size, entry file
/// offset and the first bytes of its code.
#[derive(Clone, Debug)]
pub struct Exported {
    /// Function id.
    pub func: u32,
    /// Symbol value (virtual address in the file).
    pub addr: u64,
    /// Symbol size (0 when the table does not say).
    pub size: u64,
    /// File offset of the entry.
    pub offset: u64,
    /// The function's code (its first [`placement::WINDOW`] bytes when its
    /// size is unknown or past [`placement::MAX_FUNCTION`]).
    pub code: Vec<u8>,
}

/// The probed functions of `family` a file's bytes define (dynamic or
/// static symbol table), one per distinct address: aliases such as
/// glibc's `aligned_alloc` and `memalign` must not be probed twice.
pub fn exported_in(family: &UprobeFamily, data: &[u8]) -> io::Result<Vec<Exported>> {
    let obj = object::File::parse(data).map_err(io::Error::other)?;
    let mut found: Vec<Exported> = Vec::new();
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        if !sym.is_definition() || sym.address() == 0 {
            continue;
        }
        let Ok(n) = sym.name() else { continue };
        // Versioned names look like `cudaMalloc@@libcudart.so.12` in some tables.
        let n = n.split('@').next().unwrap_or(n);
        let Some(func) = family.id_of(n) else {
            continue;
        };
        if found
            .iter()
            .any(|e| e.func == func || e.addr == sym.address())
        {
            continue;
        }
        let Some((offset, code)) = code_at(&obj, data, sym.address(), sym.size()) else {
            continue;
        };
        found.push(Exported {
            func,
            addr: sym.address(),
            size: sym.size(),
            offset,
            code,
        });
    }
    found.sort_by_key(|e| e.func);
    Ok(found)
}

/// The file offset of virtual address `addr` and the code of the function
/// there (`size` bytes, or [`placement::WINDOW`] when unknown or too long).
fn code_at(obj: &object::File, data: &[u8], addr: u64, size: u64) -> Option<(u64, Vec<u8>)> {
    let want = match size as usize {
        0 => placement::WINDOW,
        n if n > placement::MAX_FUNCTION => placement::WINDOW,
        n => n,
    };
    obj.segments().find_map(|seg| {
        let (file_off, file_len) = seg.file_range();
        let rel = addr.checked_sub(seg.address())?;
        (rel < file_len).then(|| {
            let off = file_off + rel;
            let end = (off + want as u64).min(file_off + file_len) as usize;
            (
                off,
                data.get(off as usize..end).unwrap_or_default().to_vec(),
            )
        })
    })
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

/// The files of `pid` that may hold `family`'s functions: mapped files
/// its matcher accepts, and the executable (the code can be linked in).
/// One `stat` each; distinct files only.
pub fn candidates_of(family: &UprobeFamily, pid: u32) -> io::Result<Vec<Candidate>> {
    candidates(pid, family.library)
}

/// The files of `pid` whose names `library` accepts, and its executable.
pub fn candidates(pid: u32, library: fn(&str) -> bool) -> io::Result<Vec<Candidate>> {
    let files = mapped_files(pid)?;
    let mut out: Vec<Candidate> = files
        .iter()
        .filter(|p| library(p))
        .filter_map(|p| candidate(pid, p, false))
        .collect();
    if let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) {
        let exe = exe.display().to_string();
        let exe = exe.trim_end_matches(" (deleted)");
        if !library(exe)
            && let Some(c) = candidate(pid, exe, true)
        {
            out.push(c);
        }
    }
    let mut seen = HashSet::new();
    out.retain(|c| seen.insert(c.id));
    Ok(out)
}

/// Reads a candidate's symbols: one of `family`'s libraries when it
/// exports probed functions (all of `family.required`). The file is opened
/// again and its (dev, inode) compared, so what is parsed is the file that
/// was stat'ed. Each function's site is placed here.
pub fn inspect(family: &UprobeFamily, c: &Candidate) -> Option<Library> {
    let meta = fs::metadata(&c.host_path).ok()?;
    if (meta.dev(), meta.ino()) != c.id {
        return None;
    }
    let data = fs::read(&c.host_path).ok()?;
    let exported = exported_in(family, &data).ok()?;
    if exported.is_empty()
        || !family
            .required
            .iter()
            .all(|r| exported.iter().any(|e| e.func == *r))
    {
        return None;
    }
    let ids: HashSet<u32> = exported.iter().map(|e| e.func).collect();
    let layers: HashSet<u32> = ids.iter().map(|&f| (family.layer)(f)).collect();
    let sites = exported
        .iter()
        .map(|e| Site {
            func: e.func,
            entry: e.offset,
            shift: placement::place(&e.code, e.addr, e.size, (family.returns)(e.func)).shift,
        })
        .collect();
    let missing = family
        .functions
        .iter()
        .filter(|(id, _)| layers.contains(&(family.layer)(*id)) && !ids.contains(id))
        .map(|(_, n)| *n)
        .collect();
    Some(Library {
        path: c.path.clone(),
        host_path: c.host_path.clone(),
        id: c.id,
        functions: exported.iter().map(|e| e.func).collect(),
        sites,
        missing,
        executable: c.executable,
    })
}

/// `family`'s libraries in `pid` (every candidate, inspected).
pub fn libraries_of(family: &UprobeFamily, pid: u32) -> io::Result<Vec<Library>> {
    Ok(candidates_of(family, pid)?
        .iter()
        .filter_map(|c| inspect(family, c))
        .collect())
}

/// The probed functions a file exports, by id.
pub fn exported_functions(family: &UprobeFamily, path: &Path) -> io::Result<HashSet<u32>> {
    let data = fs::read(path)?;
    Ok(exported_in(family, &data)?
        .into_iter()
        .map(|e| e.func)
        .collect())
}

/// Where a family's programs are attached in one library.
#[derive(Debug)]
pub struct Attachment {
    /// The library.
    pub library: Library,
    programs: [&'static str; 2],
    entries: Vec<UProbeLinkId>,
    returns: Vec<UProbeLinkId>,
    /// Functions that failed to attach, with why.
    pub failed: Vec<(&'static str, String)>,
}

impl Attachment {
    /// Functions attached.
    pub fn attached(&self) -> usize {
        self.entries.len()
    }

    /// Probes attached (entries and returns).
    pub fn probes(&self) -> usize {
        self.entries.len() + self.returns.len()
    }
}

impl Probes {
    /// Loads a family's two programs into the kernel (once); `floor` loads
    /// the empty twins instead.
    pub fn load_family(&mut self, family: &UprobeFamily, floor: bool) -> Result<(), ProbeError> {
        for name in family.programs(floor) {
            self.load_uprobe(name)?;
        }
        Ok(())
    }

    /// Loads the uprobe program `name` into the kernel (once).
    pub(super) fn load_uprobe(&mut self, name: &'static str) -> Result<(), ProbeError> {
        let prog: &mut UProbe = self.program(name).map_err(|e| e.into_probe_error(name))?;
        if prog.fd().is_err() {
            prog.load().map_err(|source| ProbeError::Program {
                program: name,
                hook: "uprobe".into(),
                why: super::verifier::brief(name, &source),
            })?;
        }
        Ok(())
    }

    /// Attaches a family's programs to every probed function `lib`
    /// exports, at its placed site, for process `pid` only or, with
    /// `None`, for every process.
    pub fn attach_family(
        &mut self,
        family: &UprobeFamily,
        lib: &Library,
        pid: Option<u32>,
        floor: bool,
    ) -> Result<Attachment, ProbeError> {
        let [entry_prog, return_prog] = family.programs(floor);
        let scope = match pid.and_then(NonZeroU32::new) {
            Some(p) => UProbeScope::OneProcess(p),
            None => UProbeScope::AllProcesses,
        };
        let mut att = Attachment {
            library: lib.clone(),
            programs: [entry_prog, return_prog],
            entries: Vec::new(),
            returns: Vec::new(),
            failed: Vec::new(),
        };
        let point = |s: &Site| UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(s.entry + s.shift),
            cookie: Some(u64::from(s.func)),
        };
        // Returns first, then entries: a call already running when its
        // entry probe arrives would otherwise open a frame whose return is
        // never seen, and every later call on that thread would pass for a
        // nested one until the frame went stale. A return without an entry
        // is ignored.
        let mut returned = Vec::with_capacity(lib.sites.len());
        for s in &lib.sites {
            if !(family.returns)(s.func) {
                returned.push((s, None));
                continue;
            }
            let ret: &mut UProbe = self
                .program(return_prog)
                .map_err(|e| e.into_probe_error(return_prog))?;
            match ret.attach(point(s), &lib.host_path, scope) {
                Ok(r) => returned.push((s, Some(r))),
                Err(err) => att.failed.push((family.name_of(s.func), err.to_string())),
            }
        }
        for (s, r) in returned {
            let entry: &mut UProbe = self
                .program(entry_prog)
                .map_err(|e| e.into_probe_error(entry_prog))?;
            match entry.attach(point(s), &lib.host_path, scope) {
                Ok(e) => {
                    att.entries.push(e);
                    att.returns.extend(r);
                }
                Err(err) => {
                    att.failed.push((family.name_of(s.func), err.to_string()));
                    if let Some(r) = r {
                        let ret: &mut UProbe = self
                            .program(return_prog)
                            .map_err(|e| e.into_probe_error(return_prog))?;
                        let _ = ret.detach(r);
                    }
                }
            }
        }
        Ok(att)
    }

    /// Removes an attachment's probes.
    pub fn detach_family(&mut self, att: Attachment) {
        self.detach_families(vec![att]);
    }

    /// Removes the probes of several attachments together: dropping a link
    /// removes its uprobe after kernel grace periods, which the kernel
    /// still takes one removal at a time ([`super::drop_together`]).
    /// Entries go before returns, so no frame is opened whose return can
    /// no longer be seen.
    pub fn detach_families(&mut self, atts: Vec<Attachment>) {
        let mut entries = Vec::new();
        let mut returns = Vec::new();
        for att in atts {
            let [entry_prog, return_prog] = att.programs;
            for (name, ids, out) in [
                (entry_prog, att.entries, &mut entries),
                (return_prog, att.returns, &mut returns),
            ] {
                if let Ok(prog) = self.program::<UProbe>(name) {
                    out.extend(ids.into_iter().filter_map(|id| prog.take_link(id).ok()));
                }
            }
        }
        super::drop_together(entries);
        super::drop_together(returns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_paths() {
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

    #[test]
    fn glibc_aliases_are_probed_once_and_sites_are_placed() {
        // The libc of this machine: aligned_alloc and memalign share an
        // address in glibc; free begins with `test %rdi,%rdi; je`.
        let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let Ok(data) = fs::read(path) else {
            eprintln!("skipped: no {}", path.display());
            return;
        };
        let found = exported_in(&HEAP, &data).unwrap();
        let addrs: HashSet<u64> = found.iter().map(|e| e.addr).collect();
        assert_eq!(addrs.len(), found.len(), "one site per address");
        for f in [tracer_common::heap::MALLOC, tracer_common::heap::FREE] {
            assert!(found.iter().any(|e| e.func == f), "{}", HEAP.name_of(f));
        }
        // free's whole code was read, and its probe moves off the `test`.
        let free = found
            .iter()
            .find(|e| e.func == tracer_common::heap::FREE)
            .unwrap();
        assert_eq!(free.code.len() as u64, free.size);
        let p = placement::place(&free.code, free.addr, free.size, false);
        assert!(p.shift > 0 && p.emulated, "{p:?}");
    }

    #[test]
    fn this_machines_libc() {
        // Whatever libc this is, free's site is its entry or an emulated
        // instruction, and malloc's keeps its return-probe rules.
        let Ok(data) = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6") else {
            eprintln!("skipped: no glibc at /lib/x86_64-linux-gnu");
            return;
        };
        let found = exported_in(&HEAP, &data).unwrap();
        for e in found {
            let p = placement::place(
                &e.code,
                e.addr,
                e.size,
                tracer_common::heap::returns(e.func),
            );
            let n = placement::first_len(&e.code[p.shift as usize..], e.addr + p.shift).unwrap();
            assert_eq!(
                p.emulated,
                placement::emulated(&e.code[p.shift as usize..][..n])
            );
        }
    }
}
