//! Names for code addresses: function, source file and line, module.
//! blazesym reads the process's own view of each file (through
//! /proc/PID/map_files, so other mount namespaces work) and caches parsed
//! ELF and DWARF per file; results are cached here per (process, address).

use std::{collections::HashMap, num::NonZeroU32, path::Path};

use super::unwind::Located;

use blazesym::{
    Pid,
    symbolize::{
        Input, Symbolized, Symbolizer,
        source::{Elf, Process, Source},
    },
};

/// One named frame.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    /// The function (demangled), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Source file name (no directory), when the file has line info.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Source line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The file the code is in (base name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// A Python frame: `function` is its qualified name, `file` the
    /// script's path as its code object gives it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub python: bool,
}

impl Frame {
    /// `function (file:line)`, `function (module)`, or `?? (module)`.
    pub fn label(&self) -> String {
        let f = self.function.as_deref().unwrap_or("??");
        match (&self.file, self.line, &self.module) {
            (Some(file), Some(line), _) => format!("{f} ({file}:{line})"),
            (_, _, Some(m)) if self.function.is_none() => format!("?? ({m})"),
            _ => f.to_string(),
        }
    }

    /// `function (file.py:line)` with the file's base name, for a Python
    /// frame in a chain; [`Frame::short`] for others.
    pub fn chain_label(&self) -> String {
        match (&self.file, self.line) {
            (Some(file), Some(line)) if self.python => format!(
                "{} ({}:{line})",
                self.function.as_deref().unwrap_or("??"),
                file.rsplit('/').next().unwrap_or(file)
            ),
            _ => self.short(),
        }
    }

    /// The function or, failing that, `module+?`: a flame-graph frame.
    pub fn short(&self) -> String {
        match (&self.function, &self.module) {
            (Some(f), _) => f.clone(),
            (None, Some(m)) => format!("?? ({m})"),
            (None, None) => "??".into(),
        }
    }
}

fn base(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

fn frame_of(s: Symbolized<'_>) -> Frame {
    match s {
        Symbolized::Sym(sym) => Frame {
            function: Some(sym.name.to_string()),
            file: sym.code_info.as_ref().map(|c| base(Path::new(&c.file))),
            line: sym.code_info.as_ref().and_then(|c| c.line),
            module: sym.module.as_ref().map(|m| base(Path::new(m))),
            python: false,
        },
        Symbolized::Unknown(_) => Frame::default(),
    }
}

/// An address to name from its file: (address, offset in the file, module).
type ByFile = (u64, u64, String);

/// A symbolizer with a cache of what it has named.
pub struct Symbols {
    symbolizer: Symbolizer,
    cache: HashMap<(u32, u64), Frame>,
}

impl Default for Symbols {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_demangling(true)
                .enable_code_info(true)
                // The line of the instruction itself, in the outer function.
                .enable_inlined_fns(false)
                .build(),
            cache: HashMap::new(),
        }
    }
}

impl Symbols {
    /// Names lookup addresses of `pid` (a return address minus 1, so that
    /// the call instruction is what is named). `locate` says where an
    /// address is in its file: such addresses are named from the file, so
    /// a process that is gone by now (an OOM kill's victim) is still named.
    /// Others are named through the process, while it lives. Addresses
    /// named before are not looked up again.
    ///
    /// File and line come only from DWARF a file carries itself. DWARF
    /// found elsewhere (a system debug package under /usr/lib/debug, by
    /// build id) is not read: parsing libc's held 20 MiB of the recorder,
    /// for the frames of allocator and string functions that reports name
    /// from symbols and trim anyway; and a library's debug package can be
    /// gigabytes.
    pub fn resolve(
        &mut self,
        pid: u32,
        addrs: &[u64],
        locate: impl Fn(u64) -> Option<Located>,
    ) -> Vec<Frame> {
        let mut new: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(&(pid, *a)))
            .collect();
        new.sort_unstable();
        new.dedup();
        // By file: (held path, own DWARF) -> [(address, offset, module)].
        let mut by_file: HashMap<(String, bool), Vec<ByFile>> = HashMap::new();
        let mut by_process = Vec::new();
        for a in new {
            match locate(a) {
                Some(l) => by_file.entry((l.held, l.own_dwarf)).or_default().push((
                    a,
                    l.offset,
                    base(Path::new(&l.path)),
                )),
                None => by_process.push(a),
            }
        }
        for ((held, own_dwarf), list) in by_file {
            let offsets: Vec<u64> = list.iter().map(|l| l.1).collect();
            let mut elf = Elf::new(held.as_str());
            elf.debug_syms = own_dwarf;
            let src = Source::Elf(elf);
            match self.symbolizer.symbolize(&src, Input::FileOffset(&offsets)) {
                Ok(syms) => {
                    for ((addr, _, module), sym) in list.into_iter().zip(syms) {
                        let mut frame = frame_of(sym);
                        frame.module = Some(module);
                        self.cache.insert((pid, addr), frame);
                    }
                }
                Err(e) => {
                    tracing::debug!("naming addresses of pid {pid} in {}: {e}", list[0].2);
                    by_process.extend(list.into_iter().map(|l| l.0));
                }
            }
        }
        if let (false, Some(p)) = (by_process.is_empty(), NonZeroU32::new(pid)) {
            let mut src = Process::new(Pid::Pid(p));
            // perf maps live in the host's /tmp, not the process's.
            src.perf_map = false;
            // Symbols only: files reached through the process are not
            // looked at one by one for DWARF of their own.
            src.debug_syms = false;
            match self
                .symbolizer
                .symbolize(&Source::Process(src), Input::AbsAddr(&by_process))
            {
                Ok(syms) => {
                    for (addr, s) in by_process.iter().zip(syms) {
                        self.cache.insert((pid, *addr), frame_of(s));
                    }
                }
                Err(e) => {
                    tracing::debug!("naming {} addresses of pid {pid}: {e}", by_process.len())
                }
            }
        }
        addrs
            .iter()
            .map(|a| self.cache.get(&(pid, *a)).cloned().unwrap_or_default())
            .collect()
    }

    /// Forgets a process's names.
    pub fn forget(&mut self, pid: u32) {
        self.cache.retain(|(p, _), _| *p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_symbols_test_target() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn names_a_function_of_this_process() {
        let addr = tracer_symbols_test_target as *const () as u64;
        let mut s = Symbols::default();
        let f = s.resolve(std::process::id(), &[addr + 1], |_| None);
        assert_eq!(
            f[0].function.as_deref(),
            Some("tracer_symbols_test_target"),
            "{f:?}"
        );
        // Through the process: symbols only, no file of its own looked at
        // for DWARF.
        assert_eq!(f[0].file, None, "{f:?}");
        // Unmapped: unknown, not an error.
        let f = s.resolve(std::process::id(), &[8], |_| None);
        assert_eq!(f[0], Frame::default());
    }

    #[test]
    fn names_a_function_from_its_file_without_the_process() {
        let addr = tracer_symbols_test_target as *const () as u64 + 1;
        let maps = crate::stacks::maps::exec_mappings(std::process::id()).unwrap();
        let m = maps
            .iter()
            .find(|m| (m.start..m.end).contains(&addr))
            .expect("the test binary's code mapping")
            .clone();
        // A pid that names nothing: only the file can.
        let mut s = Symbols::default();
        let at = |own_dwarf| {
            let m = m.clone();
            move |a| {
                Some(Located {
                    held: m.path.clone(),
                    offset: a - m.start + m.offset,
                    path: m.path.clone(),
                    own_dwarf,
                })
            }
        };
        let f = s.resolve(u32::MAX, &[addr], at(true));
        assert_eq!(
            f[0].function.as_deref(),
            Some("tracer_symbols_test_target"),
            "{f:?}"
        );
        assert_eq!(f[0].module, Some(base(Path::new(&m.path))));
        // The test binary carries its DWARF: file and line.
        assert!(
            f[0].file.as_deref().is_some_and(|f| f.ends_with(".rs")) && f[0].line.is_some(),
            "{f:?}"
        );
        // A file whose DWARF would be found elsewhere: symbols only.
        let f = Symbols::default().resolve(u32::MAX, &[addr], at(false));
        assert_eq!(
            f[0].function.as_deref(),
            Some("tracer_symbols_test_target"),
            "{f:?}"
        );
        assert_eq!((f[0].file.as_deref(), f[0].line), (None, None), "{f:?}");
    }
}
